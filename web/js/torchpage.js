// The plan page of a captured PyTorch graph (torch-sac plans, docs/torch.md): the figures, the
// regions with what each keeps, the frontier by budget beside PyTorch's own step and full
// checkpointing, and how to apply the plan in PyTorch.

import { sweepFractions } from './charts.js';
import { h, mount } from './dom.js';
import { fmtBytes, fmtBytesExact, fmtCost, fmtOverhead, fmtPct, fmtTime, isNum } from './format.js';
import { normalizeTorchPlan } from './model.js';
import { frontierOf } from './frontier.js';
import { historyUrl } from './router.js';
import { session } from './session.js';

function card(testid, title, value, ...sub) {
  return h('div', { class: 'card', 'data-testid': testid }, h('div', { class: 'card-title' }, title), h('div', { class: 'card-value' }, value), sub.filter(Boolean).map((s) => h('div', { class: 'card-sub' }, s)));
}

/** What PyTorch measured of the plan (`remat.torch.measure`, attached with a PUT), or how to. */
function measuredCard(t) {
  const v = t.validation;
  if (!v?.ran) {
    return card('card-validation', 'Measured in PyTorch', 'not measured', h('span', {}, 'Run ', h('code', {}, 'remat.torch.measure'), ' and PUT it to ', h('code', {}, `/v1/plans/${t.id ?? '{id}'}/validation`), '.'));
  }
  const okText = v.ok === true ? 'passed' : v.ok === false ? 'failed' : 'unknown';
  const diff = isNum(v.measuredPeakBytes) && isNum(v.predictedPeakBytes) && v.predictedPeakBytes > 0 ? v.measuredPeakBytes / v.predictedPeakBytes - 1 : null;
  return card(
    'card-validation',
    `Measured in PyTorch${v.device ? ` (${v.device})` : ''}`,
    fmtBytes(v.measuredPeakBytes),
    h('span', { class: `verdict verdict-${okText}` }, okText),
    diff !== null ? `${diff >= 0 ? '+' : '−'}${Math.abs(diff * 100).toFixed(2)}% against the predicted ${fmtBytes(v.predictedPeakBytes)}` : null,
    isNum(v.memtrackerPeakBytes) ? `PyTorch's MemTracker read ${fmtBytes(v.memtrackerPeakBytes)} (not judged: its hooks change the backward)` : null,
    isNum(v.gradMaxRelErr) ? `max gradient error ${v.gradMaxRelErr.toExponential(2)}${v.gradReferenceRelErr > 0 ? ` (the unplanned step against itself ${v.gradReferenceRelErr.toExponential(2)})` : ''}` : null,
    isNum(v.measuredOverhead) ? `overhead ${fmtOverhead(v.measuredOverhead)} measured${isNum(v.measuredStepOverhead) ? ` (ops at their least ${fmtOverhead(v.measuredStepOverhead)})` : ''}${isNum(t.predicted.overhead) ? `, ${fmtOverhead(t.predicted.overhead)} predicted` : ''}` : null,
    ...v.problems.slice(0, 3),
  );
}

/**
 * The frontier section: this plan, PyTorch's own step (`none`, at the unplanned peak) and, once
 * computed (POST /v1/sweeps with the captured graph: the file of this session's upload, or one
 * picked here), remat's torch-sac plans at eight budgets from the least reachable peak to the
 * unplanned one, with full checkpointing's overhead where it fits. Returns the section and the
 * function that draws it (after the section is in the page, so the chart has its width).
 */
function frontierSection(t) {
  const unplanned = t.unplannedPeakBytes;
  const doc = {
    budgetBytes: t.budgetBytes,
    predicted: { overhead: t.predicted.overhead },
    baselines: isNum(unplanned) ? [{ name: 'none', peakBytes: unplanned, overhead: 0, feasible: isNum(t.budgetBytes) && unplanned <= t.budgetBytes }] : [],
  };
  const f = frontierOf({
    hash: t.model.hash,
    planId: t.id,
    doc,
    file: {
      accept: '.json',
      label: 'Captured graph file for the frontier',
      testid: 'sweep-file',
      model: (bytes, file) => ({ bytes, fileName: file.name, name: t.model.name, dims: {}, hash: null }),
    },
    sweepOptions: () => ({ name: session.model.name, wait: 1, fraction: sweepFractions(t.minPeakBytes, unplanned) }),
    intro: 'Compute overhead by budget: this plan, PyTorch’s own step (none), and, when computed, remat’s plans and full checkpointing of every region (full) where it fits.',
    pick: 'To compute the frontier, pick the captured graph file: ',
  });
  const section = h('section', { class: 'panel', 'aria-labelledby': 'h-pareto' }, h('h2', { id: 'h-pareto' }, 'Budget vs. overhead'), f.tools, f.chartEl, f.textEl);
  return { section, draw: f.draw };
}

/** Renders a torch-sac plan record into `root`. */
export function renderTorchPlan(root, raw) {
  const t = normalizeTorchPlan(raw);
  const p = t.predicted;
  const title = t.model.name ?? 'model';
  document.title = `${title} — remat plan`;
  const frontier = frontierSection(t);
  const ofUnplanned = isNum(p.peakBytes) && isNum(t.unplannedPeakBytes) && t.unplannedPeakBytes > 0 ? p.peakBytes / t.unplannedPeakBytes : null;
  const rows = t.regions.map((r) =>
    h(
      'tr',
      { 'data-testid': 'torch-region' },
      h('td', {}, h('code', {}, r.label)),
      h('td', {}, r.className),
      h('td', {}, r.wrapped ? 'checkpointed' : 'not wrapped'),
      h('td', {}, r.wrapped ? (r.keep.length ? r.keep.join(', ') : 'nothing (full checkpointing)') : '—'),
      h('td', { class: 'num' }, r.wrapped && isNum(r.rerunCost) ? fmtCost(r.rerunCost) : '—'),
    ),
  );
  mount(
    root,
    h(
      'section',
      { class: 'panel plan-head' },
      h('div', { class: 'plan-title' }, h('h1', {}, title), h('span', { class: 'muted' }, `plan ${t.id} · ${fmtTime(t.createdAt)} · captured from PyTorch (${t.device ?? 'device unknown'}) · torch-sac`)),
      h(
        'nav',
        { class: 'plan-links', 'aria-label': 'This plan' },
        t.model.hash ? h('a', { href: historyUrl(t.model.hash), 'data-nav': true }, 'History of this model') : null,
        h('a', { href: `/v1/plans/${encodeURIComponent(t.id ?? '')}`, target: '_blank', rel: 'noopener' }, 'JSON'),
        h('a', { href: '/', 'data-nav': true }, 'New plan'),
      ),
      h(
        'div',
        { class: 'cards', 'data-testid': 'summary-cards' },
        card('card-budget', 'Budget', fmtBytes(t.budgetBytes), h('span', { class: 'exact' }, fmtBytesExact(t.budgetBytes)), h('span', { class: `badge status-${t.status}` }, t.status)),
        card('card-predicted', 'Predicted peak', fmtBytes(p.peakBytes), h('span', { class: 'exact' }, fmtBytesExact(p.peakBytes)), ofUnplanned !== null ? `${fmtPct(ofUnplanned)} of the unplanned ${fmtBytes(t.unplannedPeakBytes)}` : null, p.peakInRerunOf ? `while ${p.peakInRerunOf} re-runs` : null),
        card(
          'card-overhead',
          'Compute overhead',
          fmtOverhead(p.overhead),
          isNum(p.computeCost) ? `cost ${fmtCost(p.computeCost)} vs ${fmtCost(p.baseCost)} (${t.costUnit ?? 'cost'})` : null,
          p.wrapCost > 0 && isNum(p.baseCost) && p.baseCost > 0 ? `of which ${fmtOverhead(p.wrapCost / p.baseCost)} is checkpointing's own work (priced at capture)` : null,
          t.lowerBound && isNum(t.lowerBound.overhead) ? `lower bound ${fmtOverhead(t.lowerBound.overhead)} (${t.lowerBound.source ?? 'bound'}), gap ${isNum(t.gap) ? fmtPct(t.gap) : '?'}` : null,
        ),
        card('card-least', 'Least reachable peak', fmtBytes(t.minPeakBytes), `${t.wrapped} of ${t.regions.length} regions checkpointed, ${t.kept} ops kept`),
        measuredCard(t),
      ),
      h('p', { class: 'muted' }, 'Apply it where you train: ', h('code', {}, 'remat.torch.apply(model, json.load(open("plan.json")))'), '; prove it there with ', h('code', {}, 'remat.torch.measure'), ' (measured peak, gradients, overhead).'),
    ),
    h(
      'section',
      { class: 'panel', 'aria-labelledby': 'h-regions' },
      h('h2', { id: 'h-regions' }, 'Regions'),
      h('p', { class: 'muted' }, 'Each region is checkpointed with torch.utils.checkpoint (non-reentrant) and a selective policy: the listed ops (aten op #occurrence) are kept, the others recomputed when backward first needs the region.'),
      h('div', { class: 'table-x' }, h('table', { class: 'tensors', 'data-testid': 'torch-regions' }, h('thead', {}, h('tr', {}, h('th', {}, 'Region'), h('th', {}, 'Class'), h('th', {}, 'Plan'), h('th', {}, 'Kept ops'), h('th', {}, 'Re-run cost'))), h('tbody', {}, rows))),
    ),
    frontier.section,
  );
  frontier.draw();
}
