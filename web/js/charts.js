// Charts with uPlot: the memory timeline (predicted and measured bytes per schedule step, the
// budget as a line) and the Pareto curve (budget -> overhead, every baseline as a point). Each
// chart comes with a text alternative: a summary sentence and a data table.

import uPlot from '../vendor/uPlot.esm.js';
import { h } from './dom.js';
import { fmtBytes, fmtOverhead, isNum } from './format.js';
import { peakStep } from './model.js';

export const PALETTE = ['#0f766e', '#b45309', '#be185d', '#4d7c0f', '#0369a1', '#7e22ce', '#a16207', '#475569'];

/**
 * Aligns point series for uPlot's shared x axis: series of [x, y] pairs -> [xs, ys1, ys2, ...]
 * with null where a series has no point at that x. Non-numeric points are dropped.
 */
export function alignSeries(seriesList) {
  const xs = [...new Set(seriesList.flatMap((s) => s.filter(([x, y]) => isNum(x) && isNum(y)).map(([x]) => x)))].sort((a, b) => a - b);
  const at = new Map(xs.map((x, i) => [x, i]));
  const ys = seriesList.map((s) => {
    const out = new Array(xs.length).fill(null);
    for (const [x, y] of s) if (isNum(x) && isNum(y)) out[at.get(x)] = y;
    return out;
  });
  return [xs, ...ys];
}

/** Every `n`-th index so that at most `max` rows remain, always with the first, last and peak. */
export function sampleIndices(n, max, keep = []) {
  if (n <= max) return [...Array(n).keys()];
  const stride = Math.ceil(n / max);
  const set = new Set([0, n - 1, ...keep.filter((i) => i >= 0 && i < n)]);
  for (let i = 0; i < n; i += stride) set.add(i);
  return [...set].sort((a, b) => a - b);
}

const bytesAxis = (label, space = 40) => ({
  label,
  size: 70,
  space,
  values: (u, vals) => vals.map((v) => fmtBytes(v)),
  grid: { stroke: '#e2e8f0' },
});

function responsive(u, el, height) {
  // Resizing in the next frame, not inside the observer's callback, avoids a resize loop.
  let frame = 0;
  const ro = new ResizeObserver(() => {
    cancelAnimationFrame(frame);
    frame = requestAnimationFrame(() => {
      const w = Math.max(280, el.clientWidth);
      if (Math.abs(w - u.width) > 2) u.setSize({ width: w, height });
    });
  });
  ro.observe(el);
  u.stopResizing = () => ro.disconnect();
}

/** Destroys a chart made here (and stops following its container's size). */
export function destroyChart(u) {
  u?.stopResizing?.();
  u?.destroy();
}

/**
 * The memory timeline. `memory`: predicted bytes after each step; `measured`: same length, null
 * where not measured; `heap` (optional): the heap's peak during each step, likewise; `budget`,
 * `storeAll`: bytes or null.
 */
export function timelineChart(el, { memory, measured, heap = [], budget, storeAll }) {
  // Steps are numbered from 0, as the API numbers them (`timeline[].step`, `measured_peak_step`).
  const steps = memory.map((_, i) => i);
  const hasMeasured = measured.some((v) => isNum(v));
  const series = [
    { label: 'step', value: (u, v) => (v == null ? '—' : `step ${v}`) },
    { label: 'predicted', stroke: '#1d4ed8', width: 2, fill: 'rgba(29, 78, 216, 0.08)', paths: uPlot.paths.stepped({ align: 1 }), value: (u, v) => fmtBytes(v) },
  ];
  const data = [steps, memory];
  if (hasMeasured) {
    series.push({ label: 'measured', stroke: '#c2410c', width: 2, paths: uPlot.paths.stepped({ align: 1 }), value: (u, v) => fmtBytes(v), spanGaps: true });
    data.push(measured);
  }
  if (heap.some((v) => isNum(v))) {
    series.push({ label: 'heap (peak in step)', stroke: '#7c3aed', width: 1, dash: [3, 3], paths: uPlot.paths.stepped({ align: 1 }), value: (u, v) => fmtBytes(v), spanGaps: true });
    data.push(heap);
  }
  if (isNum(budget)) {
    series.push({ label: 'budget', stroke: '#b91c1c', width: 1.5, dash: [6, 4], value: (u, v) => fmtBytes(v), points: { show: false } });
    data.push(steps.map(() => budget));
  }
  if (isNum(storeAll)) {
    series.push({ label: 'store-all peak', stroke: '#64748b', width: 1, dash: [2, 4], value: (u, v) => fmtBytes(v), points: { show: false } });
    data.push(steps.map(() => storeAll));
  }
  const height = 300;
  const u = new uPlot(
    {
      width: Math.max(280, el.clientWidth),
      height,
      scales: { x: { time: false }, y: { range: (u, min, max) => [0, max * 1.05] } },
      axes: [{ label: 'schedule step', grid: { stroke: '#e2e8f0' } }, bytesAxis('resident memory')],
      series,
      cursor: { drag: { x: true, y: false } },
    },
    data,
    el,
  );
  responsive(u, el, height);
  return u;
}

/** The text alternative of the timeline: a sentence and a (sampled) table. */
export function timelineText({ memory, measured, heap = [], budget }) {
  const peak = peakStep(memory);
  const mPeak = peakStep(measured.map((v) => (isNum(v) ? v : null)));
  const hPeak = peakStep(heap.map((v) => (isNum(v) ? v : null)));
  const hasHeap = heap.some((v) => isNum(v));
  const parts = [`${memory.length} schedule steps.`];
  if (peak) parts.push(`Predicted peak ${fmtBytes(peak.bytes)} at step ${peak.step}.`);
  if (isNum(budget)) parts.push(`Budget ${fmtBytes(budget)}.`);
  parts.push(mPeak ? `Measured peak ${fmtBytes(mPeak.bytes)} at step ${mPeak.step}.` : 'Not measured (not validated).');
  if (hPeak) parts.push(`Heap peak ${fmtBytes(hPeak.bytes)} during step ${hPeak.step}.`);
  const rows = sampleIndices(memory.length, 60, peak ? [peak.step] : []);
  return h(
    'div',
    { class: 'chart-text' },
    h('p', { class: 'visually-hidden', 'data-testid': 'timeline-summary' }, parts.join(' ')),
    h(
      'details',
      {},
      h('summary', {}, 'Timeline as a table'),
      h('p', {}, parts.join(' ')),
      h(
        'table',
        { class: 'data table-x' },
        h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Step'), h('th', { scope: 'col' }, 'Predicted'), h('th', { scope: 'col' }, 'Measured'), hasHeap ? h('th', { scope: 'col' }, 'Heap peak') : null)),
        h(
          'tbody',
          {},
          rows.map((i) =>
            h(
              'tr',
              {},
              h('td', {}, i),
              h('td', {}, fmtBytes(memory[i])),
              h('td', {}, isNum(measured[i]) ? fmtBytes(measured[i]) : '—'),
              hasHeap ? h('td', {}, isNum(heap[i]) ? fmtBytes(heap[i]) : '—') : null,
            ),
          ),
        ),
      ),
    ),
  );
}

/**
 * Budget fractions for a sweep: 8 from the minimum feasible budget to the store-all peak, or
 * none (the server's default grid) when the minimum is unknown.
 */
export function sweepFractions(min, storeAll, count = 8) {
  if (!isNum(min) || !isNum(storeAll) || storeAll <= 0 || min >= storeAll) return [];
  const lo = Math.max(0.01, Math.ceil((min / storeAll) * 1000) / 1000);
  return [...Array(count).keys()].map((i) => Math.round((lo + ((1 - lo) * i) / (count - 1)) * 1000) / 1000);
}

/**
 * Points of the Pareto chart: {frontier: [[budget, overhead]], infeasible (sweep points with no
 * plan), baselines: [{name, points, feasible (this plan's baseline fits its budget)}], plan:
 * [[budget, overhead]], history: [[budget, overhead]], withinBudget: [{name, overhead}] (this
 * plan's own baselines that fit its budget)}.
 */
export function paretoSeries({ doc, sweep, history, planId, solver = null }) {
  const feasible = (p) => isNum(p.overhead) && p.status !== 'infeasible';
  const frontier = sweep ? sweep.points.filter(feasible).map((p) => [p.budgetBytes, p.overhead]) : [];
  const infeasible = sweep ? sweep.points.length - frontier.length : 0;
  // The least budget a plan meets, as the sweep's infeasible points say it.
  const least = Math.min(...(sweep?.points ?? []).map((p) => p.minFeasibleBudgetBytes).filter(isNum));
  // Each baseline: its point in this plan (at its peak; over the budget or not), and its
  // overhead at every budget of the sweep where it fits.
  const baselines = new Map();
  const entry = (name, feasible) => {
    if (!baselines.has(name)) baselines.set(name, { name, points: [], feasible });
    return baselines.get(name);
  };
  for (const b of doc?.baselines ?? []) {
    if (!isNum(b.peakBytes) || !isNum(b.overhead)) continue;
    entry(b.name, b.feasible).points.push([b.peakBytes, b.overhead]);
  }
  for (const p of sweep?.points ?? []) {
    for (const b of p.baselines) {
      if (!isNum(p.budgetBytes) || !isNum(b.overhead) || !b.feasible) continue;
      entry(b.name, true).points.push([p.budgetBytes, b.overhead]);
    }
  }
  const plan = doc && isNum(doc.budgetBytes) && isNum(doc.predicted.overhead) ? [[doc.budgetBytes, doc.predicted.overhead]] : [];
  const others = (history ?? [])
    .filter((e) => e.id !== planId && e.status === 'done' && isNum(e.budgetBytes) && isNum(e.overhead))
    .map((e) => [e.budgetBytes, e.overhead]);
  return {
    frontier,
    frontierLabel: frontierLabel(solver),
    infeasible,
    least: Number.isFinite(least) ? least : null,
    baselines: [...baselines.values()],
    plan,
    history: others,
    withinBudget: baselinesWithin(doc),
  };
}

/**
 * The name of the frontier's line: the solver that swept it ("frontier (chen-sqrt)"), so that a
 * baseline's frontier is never read as remat's; "frontier (remat)" only where no solver is named
 * (a captured graph's torch-sac sweep, remat's own planner).
 */
export function frontierLabel(solver) {
  return typeof solver === 'string' && solver !== '' ? `frontier (${solver})` : 'frontier (remat)';
}

/**
 * This plan's baselines that fit its budget, with their overhead. Only the plan's own: a sweep
 * has baselines at budgets up to store-all, above this plan's, which say nothing of this budget.
 */
export function baselinesWithin(doc) {
  const budget = doc?.budgetBytes;
  return (doc?.baselines ?? [])
    .filter((b) => b.feasible && isNum(b.overhead) && !(isNum(b.peakBytes) && isNum(budget) && b.peakBytes > budget))
    .map((b) => ({ name: b.name, overhead: b.overhead }));
}

/** The Pareto chart. */
export function paretoChart(el, pts) {
  const series = [{ label: 'memory', value: (u, v) => (v == null ? '—' : fmtBytes(v)) }];
  const lists = [];
  const pointsOnly = (size, fill, stroke) => ({ paths: () => null, points: { show: true, size, fill, stroke, width: 2 } });
  if (pts.frontier.length) {
    series.push({ label: pts.frontierLabel ?? frontierLabel(null), stroke: '#1d4ed8', width: 2, spanGaps: true, points: { show: true, size: 6, fill: '#1d4ed8' }, value: (u, v) => fmtOverhead(v) });
    lists.push(pts.frontier);
  }
  if (pts.history.length) {
    series.push({ label: 'other plans', stroke: '#64748b', ...pointsOnly(7, '#ffffff', '#64748b'), value: (u, v) => fmtOverhead(v) });
    lists.push(pts.history);
  }
  pts.baselines.forEach((b, i) => {
    const c = PALETTE[i % PALETTE.length];
    series.push({ label: b.feasible ? b.name : `${b.name} (over budget)`, stroke: c, ...pointsOnly(9, b.feasible ? c : '#ffffff', c), value: (u, v) => fmtOverhead(v) });
    lists.push(b.points);
  });
  if (pts.plan.length) {
    series.push({ label: 'this plan', stroke: '#b91c1c', ...pointsOnly(13, '#b91c1c', '#7f1d1d'), value: (u, v) => fmtOverhead(v) });
    lists.push(pts.plan);
  }
  const data = alignSeries(lists);
  const height = 300;
  const u = new uPlot(
    {
      width: Math.max(280, el.clientWidth),
      height,
      scales: { x: { time: false }, y: { range: (u, min, max) => [Math.min(0, min ?? 0), Math.max(0.01, (max ?? 0) * 1.1)] } },
      axes: [bytesAxis('memory (budget; baselines at their peak)', 80), { label: 'compute overhead', size: 64, values: (u, vals) => vals.map((v) => `${(v * 100).toFixed(0)} %`), grid: { stroke: '#e2e8f0' } }],
      series,
      legend: { live: true },
    },
    data,
    el,
  );
  responsive(u, el, height);
  return u;
}

/**
 * "Frontier of 9 budgets: 3 with a plan, 6 infeasible (no schedule fits; plans start at 1.2 GiB)."
 * (`least`, when the sweep says it: the least budget a plan meets); the chart draws the 3.
 */
export function frontierSentence(feasible, infeasible, least = null) {
  const total = feasible + infeasible;
  if (!infeasible) return `Frontier of ${total} budgets.`;
  const from = isNum(least) ? `; plans start at ${fmtBytes(least)}` : '';
  return `Frontier of ${total} budgets: ${feasible} with a plan, ${infeasible} infeasible (no schedule fits${from}).`;
}

/** The Pareto chart's text alternative: every point as a row. */
export function paretoText(pts) {
  const rows = [
    ...pts.plan.map(([x, y]) => ['this plan', x, y]),
    ...pts.frontier.map(([x, y]) => [pts.frontierLabel ?? frontierLabel(null), x, y]),
    ...pts.baselines.flatMap((b) => b.points.map(([x, y]) => [b.feasible ? b.name : `${b.name} (over budget)`, x, y])),
    ...pts.history.map(([x, y]) => ['other plan', x, y]),
  ];
  const best = [...(pts.withinBudget ?? [])].sort((a, b) => a.overhead - b.overhead);
  const plan = pts.plan[0];
  const sentence = [
    plan ? `This plan: ${fmtOverhead(plan[1])} compute at a budget of ${fmtBytes(plan[0])}.` : 'This plan has no overhead figure.',
    best.length ? `Best baseline within the budget: ${best[0].name} at ${fmtOverhead(best[0].overhead)}.` : 'No baseline fits the budget.',
    pts.frontier.length || pts.infeasible ? frontierSentence(pts.frontier.length, pts.infeasible, pts.least) : 'No frontier computed.',
  ].join(' ');
  return h(
    'div',
    { class: 'chart-text' },
    h('p', { class: 'visually-hidden', 'data-testid': 'pareto-summary' }, sentence),
    h(
      'details',
      {},
      h('summary', {}, 'Points as a table'),
      h('p', {}, sentence),
      h(
        'table',
        { class: 'data table-x' },
        h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Series'), h('th', { scope: 'col' }, 'Memory'), h('th', { scope: 'col' }, 'Overhead'))),
        h('tbody', {}, rows.map(([s, x, y]) => h('tr', {}, h('td', {}, s), h('td', {}, fmtBytes(x)), h('td', {}, fmtOverhead(y))))),
      ),
    ),
  );
}
