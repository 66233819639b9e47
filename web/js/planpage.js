// The plan page, /plans/{id}: summary cards, memory timeline, Pareto curve, graph, tensor table
// and the model's history.

import { ApiError, getPlan, getHistory, poll } from './api.js';
import { h, mount } from './dom.js';
import { fmtBudget, fmtBytes, fmtBytesExact, fmtCostIn, fmtOverhead, fmtPct, fmtRatio, fmtSeconds, fmtTime, isNum } from './format.js';
import { normalizeRecord, normalizeHistory, probesLabel, decisionCounts, measuredSeries, isTorchPlan, planDims, setupKey, dimsText } from './model.js';
import { renderTorchPlan } from './torchpage.js';
import { timelineChart, timelineText, sweepFractions } from './charts.js';
import { frontierOf } from './frontier.js';
import { GraphView } from './graph.js';
import { layoutInWorker } from './layout.js';
import { TensorTable } from './table.js';
import { planUrl, historyUrl } from './router.js';
import { isOurJob, session } from './session.js';
import { describeError, tokenBox } from './upload.js';
import { JobCancel, cancelButton, unlessCancelled } from './cancel.js';
import { fillFigures } from './figures.js';

/** How the report's lower-bound sources read in the solver card. */
/** The plan against the stage model's bound, which holds only for schedules in the graph's
 *  order (where the graph allows others), or null. */
export function orderLine(doc) {
  if (!isNum(doc.orderBound) || !isNum(doc.predicted?.computeCost)) return null;
  if (doc.orderBoundSource === 'exact') return "optimal among schedules in the graph's order (MILP)";
  const c = doc.predicted.computeCost;
  const gap = c > 0 ? Math.max(0, (c - doc.orderBound) / c) : 0;
  return `in the graph's order: gap ${fmtPct(gap, 2)} (${BOUND_SOURCES[doc.orderBoundSource] ?? doc.orderBoundSource ?? 'stage model'})`;
}

const BOUND_SOURCES = { store_all: 'store-all cost', milp: 'MILP', lp: 'LP relaxation', boundary_milp: 'boundary MILP', time_points: 'time-point relaxation', exact: 'exact' };

export { sweepFractions } from './charts.js';

/**
 * Test and debugging hooks: what the page rendered and how long the layout took (`layoutMs`:
 * the layout itself, in the worker; `layoutTotalMs`: from the request to the worker until the
 * result is back on the page, worker start and transfer included).
 */
export const viewState = { planId: null, ready: false, layoutMs: null, layoutTotalMs: null, layoutNodes: null };

function card(testid, title, value, exactValue, ...sub) {
  return h(
    'div',
    { class: 'card', 'data-testid': testid, dataset: exactValue === null || exactValue === undefined ? {} : { value: String(exactValue) } },
    h('div', { class: 'card-title' }, title),
    h('div', { class: 'card-value' }, value),
    sub.filter(Boolean).map((s) => h('div', { class: 'card-sub' }, s)),
  );
}

/** The summary cards of a plan document. */
export function summaryCards(doc) {
  const p = doc.predicted;
  // Only a validation that ran has figures; one with `ran: false` says why not.
  const v = doc.validation?.ran ? doc.validation : null;
  const budgetFraction = isNum(doc.budgetBytes) && isNum(doc.storeAllPeakBytes) && doc.storeAllPeakBytes > 0 ? doc.budgetBytes / doc.storeAllPeakBytes : null;
  const ofBudget = isNum(p.peakBytes) && isNum(doc.budgetBytes) && doc.budgetBytes > 0 ? p.peakBytes / doc.budgetBytes : null;
  const statusBadge = h('span', { class: `badge status-${doc.status}` }, doc.status ?? 'unknown');
  let verdict;
  if (!v) verdict = card('card-validation', 'Validation', 'not validated', null, doc.validation?.reason ?? 'Run with “Validate” to measure on the executor.');
  else {
    const okText = v.ok === true ? 'passed' : v.ok === false ? 'failed' : 'unknown';
    verdict = card(
      'card-validation',
      'Validation',
      h('span', { class: `verdict verdict-${okText}` }, okText),
      null,
      v.device ? `on ${v.device}` : null,
      isNum(v.gradMaxRelErr) ? `max gradient error ${v.gradMaxRelErr.toExponential(2)}` : null,
      v.gradNote ? h('span', { 'data-testid': 'grad-note', title: v.gradNote }, 'Softmax outputs weighted in the loss') : null,
      isNum(v.stepSeconds) ? `step ${fmtSeconds(v.stepSeconds)}${isNum(v.storeAllStepSeconds) ? ` (store-all ${fmtSeconds(v.storeAllStepSeconds)})` : ''}` : null,
    );
  }
  return h(
    'div',
    { class: 'cards', 'data-testid': 'summary-cards' },
    card('card-budget', 'Budget', fmtBytes(doc.budgetBytes), doc.budgetBytes, h('span', { class: 'exact' }, fmtBytesExact(doc.budgetBytes)), budgetFraction !== null ? `${fmtRatio(budgetFraction)} of store-all ${fmtBytes(doc.storeAllPeakBytes)}` : null),
    card('card-predicted', 'Predicted peak', fmtBytes(p.peakBytes), p.peakBytes, h('span', { class: 'exact' }, fmtBytesExact(p.peakBytes)), ofBudget !== null ? `${fmtPct(ofBudget)} of the budget` : null),
    card(
      'card-measured',
      'Measured peak',
      v && isNum(v.measuredPeakBytes) ? fmtBytes(v.measuredPeakBytes) : 'not measured',
      v?.measuredPeakBytes ?? null,
      v && isNum(v.measuredPeakBytes) ? h('span', { class: 'exact' }, fmtBytesExact(v.measuredPeakBytes)) : 'needs validation',
      v && isNum(v.measuredPeakBytes) && isNum(p.peakBytes) && p.peakBytes > 0 ? `${fmtPct(v.measuredPeakBytes / p.peakBytes)} of predicted` : null,
    ),
    card(
      'card-overhead',
      'Compute overhead',
      fmtOverhead(p.overhead),
      p.overhead,
      isNum(p.computeCost) ? `cost ${fmtCostIn(p.computeCost, doc.costUnit)} vs ${fmtCostIn(doc.storeAllCost, doc.costUnit)} store-all` : null,
      v && isNum(v.measuredOverhead)
        ? `measured ${fmtOverhead(v.measuredOverhead)}${v.measuredOverheadRange ? ` (rounds ${fmtOverhead(v.measuredOverheadRange[0])} to ${fmtOverhead(v.measuredOverheadRange[1])})` : ''}${isNum(v.measuredStepOverhead) ? ` (steps at their least ${fmtOverhead(v.measuredStepOverhead)})` : ''}`
        : null,
    ),
    card(
      'card-solver',
      'Solver',
      h('span', {}, doc.solver ?? '—', ' ', statusBadge),
      doc.gap,
      `gap ${isNum(doc.gap) ? fmtPct(doc.gap, 2) : '—'}${isNum(doc.lowerBound) ? ` · bound ${fmtCostIn(doc.lowerBound, doc.costUnit)}${doc.boundSource ? ` (${BOUND_SOURCES[doc.boundSource] ?? doc.boundSource})` : ''}` : ''}`,
      orderLine(doc),
      `solved in ${fmtSeconds(doc.solveSeconds)}`,
      reusedLower(doc) ? `from the schedule found at the budget ${fmtBytes(doc.reusedFromBudgetBytes)}` : null,
    ),
    verdict,
    doc.maximize ? maximizeCard(doc.maximize) : null,
  );
}

/**
 * Whether the schedule came from a lower budget than the plan's own (a plan reused at its own
 * budget, the same request planned again, says nothing worth a line).
 */
export function reusedLower(doc) {
  return isNum(doc?.reusedFromBudgetBytes) && (!isNum(doc.budgetBytes) || doc.reusedFromBudgetBytes < doc.budgetBytes);
}

/** The seconds options the server clamped (`options.clamped`, docs/api.md), as the plan page
 *  says them: what was applied, and what was asked (or that the default was over the cap). */
export function clampedNotes(options) {
  const c = options?.clamped;
  if (!c || typeof c !== 'object') return [];
  const names = { time_limit: 'Time limit', bound_time: 'Bound time' };
  return Object.entries(c).map(([key, v]) => {
    const o = v && typeof v === 'object' ? v : {};
    const name = names[key] ?? key;
    const asked = isNum(o.requested) ? `${o.requested} s asked` : isNum(o.default) ? `none asked, its default ${o.default} s` : null;
    const applied = isNum(o.applied) ? `${o.applied} s applied` : 'a lower value applied';
    return `${name} clamped: ${applied}${asked ? ` (${asked})` : ''}${typeof o.reason === 'string' && o.reason ? `; ${o.reason}` : ''}.`;
  });
}

/** The card of a `maximize` search: the largest value that fits, the next one, every value tried. */
export function maximizeCard(m) {
  const limit = isNum(m.maxOverhead) ? `overhead at most ${fmtOverhead(m.maxOverhead)}` : 'any overhead';
  return card(
    'card-maximize',
    `Largest ${m.dim}`,
    isNum(m.value) ? String(m.value) : '—',
    m.value,
    `fits in ${fmtBytes(m.budgetBytes)} at ${limit}`,
    isNum(m.nextValue) ? `${m.dim} = ${m.nextValue} does not` : 'the search stopped at its cap',
    h('details', {}, h('summary', {}, `${m.probes.length} values tried`), h('ul', {}, m.probes.map((p) => h('li', { class: p.fits ? 'fits' : 'over' }, `${m.dim} = ${p.value}: ${p.reason}`)))),
  );
}

/**
 * The Cancel button of a plan this tab submitted, below the page's status while it runs; says
 * on the page what came of it (a token asked for: the token field with the error). Answers the
 * JobCancel, whose signal stops the poll.
 */
function offerCancel(panel, status, id, signal) {
  const job = new JobCancel('plan', id, { signal });
  const errorBox = h('div', { class: 'error-box', role: 'alert', hidden: true });
  // The token field, under the error that asks for it ("set it below").
  const tokenHolder = h('div');
  panel.append(h('div', { class: 'job-actions' }, cancelButton(job, { name: `plan ${id}`, focusAfter: status })), errorBox, tokenHolder);
  job.on(() => {
    errorBox.hidden = job.state !== 'failed';
    if (job.state === 'failed') {
      mount(errorBox, h('div', {}, 'The plan could not be cancelled; it goes on.'), describeError(job.error).map((l) => h('div', {}, l)));
      if (job.error.status === 401 && !tokenHolder.firstChild) mount(tokenHolder, tokenBox({ id: 'cancel-token', open: true }));
    } else if (job.stopped) {
      mount(status, job.message, ' ', h('a', { href: '/', 'data-nav': true }, 'Plan another model'));
      viewState.ready = true;
    }
    if (job.over) {
      errorBox.hidden = true;
      tokenHolder.replaceChildren();
    }
  });
  return job;
}

function section(title, id, ...children) {
  return h('section', { class: 'panel', 'aria-labelledby': id }, h('h2', { id }, title), ...children);
}

let current = null;

/** Stops the requests and polling of the page being left. */
export function leavePage() {
  current?.abort();
  current = null;
}

export async function renderPlan(root, id) {
  viewState.planId = id;
  viewState.ready = false;
  viewState.layoutMs = null;
  leavePage();
  const ctrl = new AbortController();
  current = ctrl;
  const status = h('div', { class: 'status', role: 'status', 'aria-live': 'polite', tabindex: '-1', 'data-testid': 'plan-status' }, h('span', { class: 'spinner', 'aria-hidden': 'true' }), 'Loading the plan…');
  const panel = h('section', { class: 'panel' }, h('h1', {}, 'Plan ', h('code', {}, id)), status);
  mount(root, panel);
  let raw;
  let job = null;
  try {
    raw = await getPlan(id, ctrl.signal);
    if (raw?.status !== 'done' && raw?.status !== 'failed') {
      // Since the job was posted (its record's time), so that coming back to it (Back/Forward,
      // a reload) does not start the count again; since this page asked, without one.
      const posted = Date.parse(raw?.created_at ?? '');
      const t0 = performance.now();
      const elapsed = () => elapsedSeconds(posted, Date.now()) ?? (performance.now() - t0) / 1000;
      // A plan this tab submitted can be cancelled while it runs.
      if (isOurJob('plan', id)) job = offerCancel(panel, status, id, ctrl.signal);
      const wait = poll('plan', id, {
        signal: job?.signal ?? ctrl.signal,
        onStatus: (s) => job?.stopped || mount(status, h('span', { class: 'spinner', 'aria-hidden': 'true' }), `The plan is ${s} (${fmtElapsed(elapsed())} since it was posted)`),
      });
      // An answer that comes back after a Cancel is not shown: the page says "Cancelled.".
      raw = await (job ? unlessCancelled(job, wait) : wait);
    }
  } catch (e) {
    if (ctrl.signal.aborted || job?.stopped) return;
    mount(root, h('section', { class: 'panel' }, h('h1', {}, 'Plan ', h('code', {}, id)), h('div', { class: 'error-box', role: 'alert' }, describeError(e).map((l) => h('div', {}, l))), h('p', {}, h('a', { href: '/', 'data-nav': true }, 'Plan another model'))));
    viewState.ready = true;
    return;
  }
  if (ctrl.signal.aborted) return;
  if (raw?.status === 'done' && isTorchPlan(raw)) {
    renderTorchPlan(root, raw);
    viewState.ready = true;
    return;
  }
  const rec = normalizeRecord(raw);
  if (rec.status === 'failed' || !rec.doc) {
    const err = rec.error ?? { code: 'missing', message: 'the plan record has no plan document' };
    mount(root, h('section', { class: 'panel' }, h('h1', {}, 'Plan ', h('code', {}, id)), h('div', { class: 'error-box', role: 'alert' }, describeError(new ApiError(422, err.code, err.message, err.details)).map((l) => h('div', {}, l)))));
    viewState.ready = true;
    return;
  }
  const doc = rec.doc;
  const title = rec.model.name ?? doc.graph.name ?? 'model';
  document.title = `${title} — remat plan`;
  const counts = decisionCounts(doc.decisions);
  const countText = Object.entries(counts).map(([k, n]) => `${n} ${k}`).join(' · ');

  const timelineEl = h('div', { class: 'chart', 'data-testid': 'timeline' });
  // Pareto: this plan, its baselines, the model's other plans made at the same dims (the
  // overhead of a plan at batch 19 says nothing of batch 2) and, when computed, the frontier.
  let history = [];
  const dims = planDims(rec.options, doc.maximize) ?? rec.options.dims ?? {};
  const setup = setupKey(rec.options, doc.maximize);
  // The sweep is made with this plan's solver (auto when the plan named none).
  const solver = planSolver(rec.options);
  const frontier = frontierOf({
    hash: rec.model.hash,
    dims,
    solver,
    planId: rec.id,
    doc,
    history: () => history.filter((e) => e.setup === setup),
    file: {
      accept: '.onnx,.json',
      label: 'Model file for the frontier',
      testid: 'sweep-file',
      model: (bytes, f) => ({ bytes, fileName: f.name, name: rec.model.name, dims: rec.options.dims ?? {}, hash: null }),
    },
    sweepOptions: () => ({ dims, name: session.model.name, solver: rec.options.solver, time_limit: Math.min(Number(rec.options.time_limit) || 10, 10), wait: 1, fraction: sweepFractions(minFeasible(doc, dims, rec.model.hash), doc.storeAllPeakBytes) }),
    intro: 'Compute overhead by budget: this plan, each baseline at its peak, this model’s other plans, and the frontier when computed.',
    pick: 'To compute the frontier, pick the model file: ',
  });
  const graphEl = h('div', { class: 'graph', 'data-testid': 'graph' });
  const tableEl = h('div');
  const historyEl = h('div', { 'data-testid': 'history' }, h('p', { class: 'muted' }, 'Loading…'));
  const memory = doc.predicted.memory.map((x) => x ?? 0);
  const measured = measuredSeries(doc.validation, memory.length);
  const heap = measuredSeries(doc.validation, memory.length, 'heapPeak');

  mount(
    root,
    h(
      'section',
      { class: 'panel plan-head' },
      h('div', { class: 'plan-title' }, h('h1', {}, title), h('span', { class: 'muted' }, `plan ${rec.id} · ${fmtTime(rec.createdAt)} · ${doc.graph.nodes} nodes${rec.model.format ? ` · ${rec.model.format}` : ''}`)),
      h(
        'nav',
        { class: 'plan-links', 'aria-label': 'This plan' },
        rec.model.hash ? h('a', { href: historyUrl(rec.model.hash), 'data-nav': true }, 'History of this model') : null,
        h('a', { href: `/v1/plans/${encodeURIComponent(rec.id)}`, target: '_blank', rel: 'noopener' }, 'JSON'),
        h('a', { href: '/', 'data-nav': true }, 'New plan'),
      ),
      summaryCards(doc),
      clampedNotes(rec.options).map((t) => h('p', { class: 'warn', 'data-testid': 'clamped' }, t)),
      h('p', { class: 'counts muted' }, countText),
    ),
    h(
      'div',
      { class: 'two' },
      section('Memory timeline', 'h-timeline', h('p', { class: 'muted' }, 'Resident bytes after each schedule step (heap: the process\u2019s heap at its highest during the step, gradients allocated as they are computed); drag to zoom, double-click to reset.'), timelineEl, timelineText({ memory, measured, heap, budget: doc.budgetBytes })),
      section('Budget vs. overhead', 'h-pareto', frontier.tools, frontier.chartEl, frontier.textEl),
    ),
    section('Graph', 'h-graph', graphEl),
    section('Tensors', 'h-tensors', tableEl),
    section('History of this model', 'h-history', historyEl),
  );

  if (memory.length) timelineChart(timelineEl, { memory, measured, heap, budget: doc.budgetBytes, storeAll: doc.storeAllPeakBytes });
  else mount(timelineEl, h('p', { class: 'muted' }, 'The plan has no per-step memory.'));

  let table = null;
  let graph = null;
  let graphDone = Promise.resolve();
  if (doc.decisions.length) {
    // The table now; the graph when its layout (computed in a worker) is ready.
    mount(graphEl, h('p', { class: 'muted' }, h('span', { class: 'spinner', 'aria-hidden': 'true' }), `Laying out ${doc.decisions.length} nodes…`));
    table = new TensorTable(tableEl, doc.decisions, {
      costUnit: doc.costUnit,
      onSelect: (i) => {
        if (!graph) return;
        graph.select(i, { center: true, notify: false });
        table.highlight(i);
        graphEl.scrollIntoView({ block: 'nearest', behavior: 'smooth' });
      },
    });
    const t0 = performance.now();
    graphDone = layoutInWorker(doc.decisions).then((layout) => {
      if (ctrl.signal.aborted) return;
      viewState.layoutTotalMs = performance.now() - t0;
      graph = new GraphView(graphEl, doc.decisions, { onSelect: (i) => table?.highlight(i), layout, costUnit: doc.costUnit });
      viewState.layoutMs = layout.ms;
      viewState.layoutWhere = layout.where;
      viewState.layoutNodes = doc.decisions.length;
      graphEl.dataset.layoutMs = layout.ms.toFixed(1);
      if (layout.missing.length) graphEl.prepend(h('p', { class: 'warn' }, `${layout.missing.length} dependencies name unknown nodes (first: ${layout.missing[0].node} reads ${layout.missing[0].dep}); they are not drawn.`));
    });
  } else {
    mount(graphEl, h('p', { class: 'muted' }, 'The plan has no per-tensor decisions.'));
    mount(tableEl, h('p', { class: 'muted' }, 'No tensors.'));
  }

  frontier.draw();

  if (rec.model.hash) {
    try {
      history = normalizeHistory(await getHistory(rec.model.hash, ctrl.signal));
      await fillFigures(history, rec.id, doc, ctrl.signal);
      if (ctrl.signal.aborted) return;
      mount(historyEl, historyView(history, rec.id));
      frontier.draw();
    } catch (e) {
      if (ctrl.signal.aborted) return;
      mount(historyEl, h('p', { class: 'muted' }, `History is not available: ${e.message}`));
    }
  } else mount(historyEl, h('p', { class: 'muted' }, 'The plan record has no model hash.'));
  await graphDone;
  if (ctrl.signal.aborted) return;
  viewState.ready = true;
}

/** Seconds from `postedMs` (a job's `created_at`, parsed) to `nowMs`; null without a time. A
 *  server clock a little ahead of the browser's reads 0, not a negative time. */
export function elapsedSeconds(postedMs, nowMs) {
  if (!isNum(postedMs) || !isNum(nowMs)) return null;
  return Math.max(0, (nowMs - postedMs) / 1000);
}

/** An elapsed time: "1.6 s" under a minute, "2 min 5 s" after. */
export function fmtElapsed(s) {
  return s < 60 ? `${s.toFixed(1)} s` : fmtSeconds(s);
}

/** The solver a plan was asked with: its options' `solver`, `auto` (the server's default) when none. */
export function planSolver(options) {
  const s = options?.solver;
  return typeof s === 'string' && s !== '' ? s : 'auto';
}

/**
 * The least budget to sweep from: the upload's (found by its probe) when the upload was this
 * model at these dims, else the plan's own minimum feasible budget (null: the server's grid).
 */
function minFeasible(doc, dims, hash) {
  const m = session.model;
  if (m && m.hash === hash && isNum(m.min) && dimsText(m.dims) === dimsText(dims)) return m.min;
  return doc.minFeasibleBudgetBytes;
}

/**
 * The history table with a switch for the viewer's failed probes (the one-byte budget asked
 * only for its error's minimum feasible budget): hidden by default, they would fill the table.
 */
export function historyView(entries, currentId) {
  const noise = entries.filter((e) => e.probe && e.status === 'failed' && e.id !== currentId);
  const box = h('div', {}, historyTable(entries, currentId, { showProbes: false }));
  if (noise.length === 0) return box;
  const toggle = h('input', { type: 'checkbox', 'data-testid': 'show-probes', onchange: () => mount(box, historyTable(entries, currentId, { showProbes: toggle.checked })) });
  return h('div', {}, h('label', { class: 'check muted' }, toggle, probesLabel(noise)), box);
}


/**
 * The table of a model's plans, newest first, the current one marked; the viewer's probes
 * marked as such, its failed ones left out unless `showProbes`.
 */
export function historyTable(entries, currentId, { showProbes = true } = {}) {
  const shown = entries.filter((e) => showProbes || !(e.probe && e.status === 'failed' && e.id !== currentId));
  if (shown.length === 0) return h('p', { class: 'muted' }, 'No plans.');
  return h(
    'div',
    { class: 'table-x' },
    h(
      'table',
      { class: 'data', 'data-testid': 'history-table' },
      h('thead', {}, h('tr', {}, ['Created', 'Plan', 'Status', 'Dims', 'Solver', 'Budget', 'Peak', 'Overhead'].map((t) => h('th', { scope: 'col' }, t)))),
      h(
        'tbody',
        {},
        [...shown].reverse().map((e) =>
          h(
            'tr',
            { class: e.id === currentId ? 'selected' : '', dataset: e.probe ? { probe: 'true' } : {} },
            h('td', {}, fmtTime(e.createdAt)),
            h('td', {}, e.id === currentId ? h('strong', {}, 'this plan') : h('a', { href: planUrl(e.id), 'data-nav': true }, e.id)),
            h('td', {}, h('span', { class: `badge status-${e.status}` }, e.status), e.error ? h('span', { class: 'muted' }, ` ${e.error.code}`) : '', e.probe ? h('span', { class: 'badge probe', title: "The viewer's probe of the model (store-all at 1.0× or at one byte)" }, 'probe') : ''),
            h('td', { 'data-testid': 'history-dims' }, entryDims(e)),
            h('td', {}, e.solver ?? '—'),
            h('td', { class: 'num' }, isNum(e.budgetBytes) ? fmtBytes(e.budgetBytes) : fmtBudget(e.budget)),
            h('td', { class: 'num' }, fmtBytes(e.peakBytes)),
            h('td', { class: 'num' }, fmtOverhead(e.overhead)),
          ),
        ),
      ),
    ),
  );
}

/** An entry's dims as text; a maximized dim whose value is not known reads "batch=largest". */
export function entryDims(e) {
  const o = e.options ?? {};
  const dims = e.dims ?? { ...(o.dims ?? {}), ...(o.maximize ? { [o.maximize]: 'largest' } : {}) };
  return dimsText(dims) || '—';
}

/** The history view, /?model=HASH. */
export async function renderHistory(root, hash) {
  leavePage();
  const ctrl = new AbortController();
  current = ctrl;
  mount(root, h('section', { class: 'panel' }, h('h1', {}, 'History'), h('p', { class: 'muted' }, 'Loading…')));
  try {
    const entries = normalizeHistory(await getHistory(hash, ctrl.signal));
    await fillFigures(entries, null, null, ctrl.signal);
    if (ctrl.signal.aborted) return;
    const done = entries.filter((e) => e.status === 'done' && isNum(e.overhead));
    mount(
      root,
      h(
        'section',
        { class: 'panel' },
        h('h1', {}, 'History of a model'),
        h('p', { class: 'muted' }, 'Model ', h('code', {}, hash), ` · ${entries.length} plans, ${done.length} done`),
        historyView(entries, null),
      ),
    );
  } catch (e) {
    if (ctrl.signal.aborted) return;
    mount(root, h('section', { class: 'panel' }, h('h1', {}, 'History'), h('div', { class: 'error-box', role: 'alert' }, describeError(e).map((l) => h('div', {}, l)))));
  }
  viewState.ready = true;
}
