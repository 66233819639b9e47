// Normalization of API answers into the shapes the views use. The API is young: every reader
// here tolerates missing fields and small shape differences (arrays vs. objects, pairs vs.
// records) and reports what is missing instead of throwing. Pure functions, unit-tested under node.

import { isNum } from './format.js';

const num = (x) => (isNum(x) ? x : null);
const str = (x) => (typeof x === 'string' ? x : x == null ? null : String(x));
const arr = (x) => (Array.isArray(x) ? x : []);
const obj = (x) => (x && typeof x === 'object' && !Array.isArray(x) ? x : {});

/** Node kinds the viewer knows; anything else is shown as "forward". */
export const KINDS = ['forward', 'loss', 'backward'];

/** One per-tensor decision. */
export function normalizeDecision(d, index) {
  const o = obj(d);
  const id = str(o.node ?? o.id) ?? String(index);
  const kind = KINDS.includes(o.kind) ? o.kind : 'forward';
  return {
    index,
    id,
    name: str(o.name) ?? id,
    kind,
    bytes: num(o.bytes),
    cost: num(o.cost),
    computes: num(o.computes),
    decision: str(o.decision) ?? 'unknown',
    reason: str(o.reason) ?? '',
    deps: arr(o.deps).map((x) => String(x)),
  };
}

/** A baseline of a plan: {name, peak_bytes, compute_cost, overhead, feasible}. */
export function normalizeBaseline(b) {
  if (Array.isArray(b)) return { name: str(b[0]) ?? '?', peakBytes: null, computeCost: null, overhead: num(b[1]), feasible: num(b[1]) !== null };
  const o = obj(b);
  return {
    name: str(o.name) ?? '?',
    peakBytes: num(o.peak_bytes ?? o.peak),
    computeCost: num(o.compute_cost ?? o.cost),
    overhead: num(o.overhead),
    feasible: typeof o.feasible === 'boolean' ? o.feasible : num(o.overhead) !== null,
  };
}

/** A `[lo, hi]` pair of numbers, or null. */
function range(x) {
  return Array.isArray(x) && x.length === 2 && num(x[0]) !== null && num(x[1]) !== null ? [x[0], x[1]] : null;
}

/**
 * A plan's `validation`: run by remat's executor, or measured in PyTorch by
 * `remat.torch.measure` and attached to a torch-sac plan. `null` when the plan has none.
 */
export function normalizeValidation(raw) {
  if (!raw || typeof raw !== 'object') return null;
  const validation = obj(raw);
  return {
    // `ran: false` (with a reason) when the executor did not run the plan.
    ran: validation.ran !== false,
    reason: str(validation.reason),
    device: str(validation.device),
    ok: typeof validation.ok === 'boolean' ? validation.ok : null,
    measuredPeakBytes: num(validation.measured_peak_bytes),
    predictedPeakBytes: num(validation.predicted_peak_bytes),
    heapPeakBytes: num(validation.heap_peak_bytes),
    // PyTorch's measure on the CPU: MemTracker's peak of the planned step, a second opinion that
    // is not judged (its hooks change the backward it measures).
    memtrackerPeakBytes: num(validation.memtracker_peak_bytes),
    gradMaxRelErr: num(validation.grad_max_rel_err),
    // PyTorch's measure: what the unplanned step's gradients differ from themselves by, run
    // twice (0 with deterministic kernels); each gradient is judged against it.
    gradReferenceRelErr: num(validation.grad_reference_rel_err),
    // Set when the loss weights Softmax outputs (their plain mean has no gradient).
    gradNote: str(validation.grad_note),
    stepSeconds: num(validation.step_seconds),
    storeAllStepSeconds: num(validation.store_all_step_seconds),
    measuredOverhead: num(validation.measured_overhead),
    // The timing rounds' lowest and highest overhead ([lo, hi]): what the machine's noise does.
    measuredOverheadRange: range(validation.measured_overhead_range),
    // Each step at its least over the timing rounds: steadier on a shared machine.
    measuredStepOverhead: num(validation.measured_step_overhead),
    timeline: arr(validation.timeline).map((t) => ({
      step: num(obj(t).step),
      predicted: num(obj(t).predicted_bytes),
      measured: num(obj(t).measured_bytes),
      // The process's heap at its highest during the step (kernels' workspaces included).
      heapPeak: num(obj(t).heap_peak_bytes),
    })),
    predictedOverhead: num(validation.predicted_overhead),
    problems: arr(validation.problems).map((x) => str(x) ?? '?'),
  };
}

/** The plan document (`plan` of a plan record). */
export function normalizeDoc(doc) {
  const o = obj(doc);
  const predicted = obj(o.predicted);
  const graph = obj(o.graph);
  const decisions = arr(o.decisions).map(normalizeDecision);
  return {
    status: str(o.status),
    solver: str(o.solver),
    budgetBytes: num(o.budget_bytes),
    storeAllPeakBytes: num(o.store_all_peak_bytes),
    storeAllCost: num(o.store_all_cost ?? graph.store_all_cost),
    // The unit of every cost: "seconds" with a cost model (roofline or measured), else the
    // importer's FLOPs or a graph's own unit (absent).
    costUnit: str(obj(o.cost_model).unit),
    minFeasibleBudgetBytes: num(o.min_feasible_budget_bytes),
    predicted: {
      peakBytes: num(predicted.peak_bytes),
      computeCost: num(predicted.compute_cost),
      overhead: num(predicted.overhead),
      memory: arr(predicted.memory).map((x) => num(x)),
    },
    lowerBound: num(obj(o.lower_bound).compute_cost),
    // What proved the bound: store_all, milp, lp, boundary_milp, time_points or exact (absent from older reports).
    boundSource: str(obj(o.lower_bound).source),
    gap: num(o.gap),
    // The stage model's bound where the graph allows other orders: it holds for the schedules in
    // the graph's order only (source exact: the MILP's optimum in that order). Absent otherwise.
    orderBound: num(obj(o.order_bound).compute_cost),
    orderBoundSource: str(obj(o.order_bound).source),
    solveSeconds: num(o.solve_seconds),
    baselines: arr(o.baselines).map(normalizeBaseline),
    schedule: arr(o.schedule).map((s) => ({ op: str(obj(s).op) ?? '?', node: str(obj(s).node) ?? '?' })),
    decisions,
    graph: {
      name: str(graph.name),
      format: str(graph.format),
      nodes: num(graph.nodes) ?? decisions.length,
      fixedBytes: num(graph.fixed_bytes),
    },
    model: o.model && typeof o.model === 'object' ? o.model : null,
    validation: normalizeValidation(o.validation),
    // Set when the schedule is the one found at a lower budget (nothing found here was cheaper).
    reusedFromBudgetBytes: num(o.reused_from_budget_bytes),
    maximize: normalizeMaximize(o.maximize),
  };
}

/** A plan's `maximize` search (the largest value of a dim that fits), or null. */
export function normalizeMaximize(raw) {
  if (!raw || typeof raw !== 'object') return null;
  const o = obj(raw);
  return {
    dim: str(o.dim) ?? '?',
    value: num(o.value),
    budgetBytes: num(o.budget_bytes),
    maxOverhead: num(o.max_overhead),
    nextValue: num(o.next_value),
    probes: arr(o.probes).map((p) => {
      const q = obj(p);
      return { value: num(q.value), fits: q.fits === true, overhead: num(q.overhead), storeAllPeakBytes: num(q.store_all_peak_bytes), reason: str(q.reason) ?? '' };
    }),
  };
}

/** A plan (or sweep) record: {id, status, model, created_at, options, plan?, sweep?, error?}. */
export function normalizeRecord(rec) {
  const o = obj(rec);
  const model = obj(o.model);
  const err = o.error && typeof o.error === 'object' ? obj(o.error) : null;
  return {
    id: str(o.id),
    kind: str(o.kind) ?? 'plan',
    status: str(o.status) ?? 'unknown',
    model: { hash: str(model.hash), name: str(model.name), format: str(model.format) },
    createdAt: str(o.created_at),
    options: obj(o.options),
    summary: o.summary && typeof o.summary === 'object' ? o.summary : null,
    doc: o.plan && typeof o.plan === 'object' ? normalizeDoc(o.plan) : null,
    sweep: o.sweep && typeof o.sweep === 'object' ? normalizeSweep(o.sweep) : null,
    error: err && { code: str(err.code) ?? 'error', message: str(err.message) ?? '', details: err.details ?? null },
  };
}

/** A sweep document: {graph, store_all_peak_bytes, points: [...]}. Baselines as records or pairs. */
export function normalizeSweep(doc) {
  const o = obj(doc);
  const storeAll = num(o.store_all_peak_bytes);
  const points = arr(o.points).map((p) => {
    const q = obj(p);
    const fraction = num(q.fraction);
    let budget = num(q.budget_bytes ?? q.budget);
    if (budget === null && fraction !== null && storeAll !== null) budget = fraction * storeAll;
    return {
      budgetBytes: budget,
      fraction: fraction ?? (budget !== null && storeAll ? budget / storeAll : null),
      status: str(q.status),
      overhead: num(q.overhead),
      solver: str(q.solver),
      gap: num(q.gap),
      reusedFromBudgetBytes: num(q.reused_from_budget_bytes),
      minFeasibleBudgetBytes: num(q.min_feasible_budget_bytes),
      baselines: arr(q.baselines).map(normalizeBaseline),
    };
  });
  points.sort((a, b) => (a.budgetBytes ?? 0) - (b.budgetBytes ?? 0));
  return { storeAllPeakBytes: storeAll, points, graph: obj(o.graph) };
}

/**
 * The dims a plan was made at: its options' `dims`, the dim it maximized at the value found.
 * `null` when the options maximize a dim whose value is not known here (a history entry whose
 * plan document was not read): such a plan is at dims we cannot name.
 */
export function planDims(options, maximize) {
  const o = obj(options);
  const dims = { ...obj(o.dims) };
  if (o.maximize === undefined || o.maximize === null) return dims;
  const m = obj(maximize);
  if (str(m.dim) !== str(o.maximize) || !isNum(m.value)) return null;
  dims[m.dim] = m.value;
  return dims;
}

/** Dims as text, names sorted: "batch=2, seq=8"; "" without dims. */
export function dimsText(dims) {
  return Object.keys(obj(dims))
    .sort()
    .map((k) => `${k}=${dims[k]}`)
    .join(', ');
}

/**
 * What makes two plans of one model comparable on one chart: the same dims (maximized ones at
 * their value) and the same graph inputs treated as parameters or data, and the same weights
 * frozen. `null` when the dims
 * are not known.
 */
export function setupKey(options, maximize) {
  const dims = planDims(options, maximize);
  if (dims === null) return null;
  const o = obj(options);
  const sorted = (x) => arr(x).map(String).sort();
  return JSON.stringify([dimsText(dims), sorted(o.params), sorted(o.inputs), sorted(o.frozen)]);
}

/**
 * Whether a history entry is one of the viewer's own probes (upload.js): a store-all plan at
 * the store-all peak ("1.0x") or at one byte ("1", refused with the minimum feasible budget).
 */
export function isProbe(entry) {
  const o = obj(entry?.options);
  return o.solver === 'store-all' && (o.budget === '1.0x' || o.budget === '1') && !o.maximize;
}

/**
 * The switch's label for the viewer's failed probes, saying what they were: one-byte budgets
 * (refused with the minimum feasible budget, which is what they asked) and probes refused for
 * unbound dimensions (asked which dims the model has), and any other failure.
 */
export function probesLabel(failed) {
  const n = failed.length;
  const code = (e) => e.error?.code ?? null;
  const oneByte = failed.filter((e) => (e.budget ?? e.options?.budget) === '1' && code(e) !== 'unbound_dims').length;
  const unbound = failed.filter((e) => code(e) === 'unbound_dims').length;
  const other = n - oneByte - unbound;
  const parts = [
    oneByte ? `${oneByte} one-byte budget${oneByte === 1 ? '' : 's'} asked for the minimum` : null,
    unbound ? `${unbound} asked which dimensions the model has` : null,
    other ? `${other} other` : null,
  ].filter(Boolean);
  return `Show the viewer's ${n} failed probe${n === 1 ? '' : 's'} (${parts.join(', ')})`;
}

/** History of a model: `{model, plans: [...]}` or a bare array; oldest first. */
export function normalizeHistory(h) {
  const list = Array.isArray(h) ? h : arr(obj(h).plans);
  const entries = list.map((e) => {
    const o = obj(e);
    const s = obj(o.summary);
    const err = o.error && typeof o.error === 'object' ? obj(o.error) : null;
    return {
      id: str(o.id),
      createdAt: str(o.created_at),
      status: str(o.status) ?? 'unknown',
      options: obj(o.options),
      budget: str(o.budget) ?? str(obj(o.options).budget),
      budgetBytes: num(s.budget_bytes),
      peakBytes: num(s.peak_bytes ?? s.predicted_peak_bytes),
      overhead: num(s.overhead),
      planStatus: str(s.status),
      solver: str(s.solver) ?? str(obj(o.options).solver),
      error: err && { code: str(err.code) ?? 'error', message: str(err.message) ?? '' },
      // Known once the plan document is read (figures.js) when the options maximize a dim.
      dims: planDims(o.options, null),
      setup: setupKey(o.options, null),
      probe: isProbe(o),
    };
  });
  entries.sort((a, b) => String(a.createdAt ?? '').localeCompare(String(b.createdAt ?? '')));
  return entries;
}

/** Counts of decisions, e.g. {keep: 10, recompute: 3, ...}. */
export function decisionCounts(decisions) {
  const counts = {};
  for (const d of decisions) counts[d.decision] = (counts[d.decision] ?? 0) + 1;
  return counts;
}

/**
 * The step at which the predicted memory peaks, and its value: {step, bytes}, or null.
 */
export function peakStep(memory) {
  let best = null;
  memory.forEach((b, i) => {
    if (isNum(b) && (best === null || b > best.bytes)) best = { step: i, bytes: b };
  });
  return best;
}

/**
 * Per step, the measured bytes from a validation timeline (null where not measured), aligned
 * with the predicted memory array.
 */
export function measuredSeries(validation, steps, field = 'measured') {
  const out = new Array(steps).fill(null);
  if (!validation?.ran) return out;
  validation.timeline.forEach((t, i) => {
    const s = t.step ?? i;
    if (Number.isInteger(s) && s >= 0 && s < steps) out[s] = t[field] ?? null;
  });
  return out;
}

/** Whether a plan record holds a torch-sac plan (a captured PyTorch graph's). */
export function isTorchPlan(raw) {
  return obj(obj(raw).plan).execution_model === 'torch-sac';
}

/**
 * A torch-sac plan record (`remat.torch-plan`, docs/torch.md): the figures and one row per
 * region (checkpointed or not, the ops its policy keeps, the cost of its re-run).
 */
export function normalizeTorchPlan(raw) {
  const r = obj(raw);
  const p = obj(r.plan);
  const pred = obj(p.predicted);
  const model = obj(r.model);
  // A module run more than once per step (ALBERT's shared layer) is a region per call.
  const callsOf = new Map();
  for (const x of arr(p.regions)) {
    const fqn = str(obj(x).fqn);
    if (fqn !== null) callsOf.set(fqn, (callsOf.get(fqn) ?? 0) + 1);
  }
  const regions = arr(p.regions).map((x, index) => {
    const o = obj(x);
    const fqn = str(o.fqn);
    const calls = fqn === null ? 1 : callsOf.get(fqn);
    const call = num(o.call) ?? 0;
    return {
      index,
      fqn: fqn ?? `region ${index}`,
      call,
      label: fqn === null ? `region ${index}` : calls > 1 ? `${fqn} (call ${call + 1} of ${calls})` : fqn,
      className: str(o.class) ?? '',
      wrapped: o.wrapped === true,
      keep: arr(o.keep).map((k) => (Array.isArray(k) ? `${str(k[0]) ?? '?'}#${num(k[1]) ?? '?'}` : str(k) ?? '?')),
      ops: arr(o.ops).length,
      rerunCost: num(o.rerun_cost),
    };
  });
  return {
    id: str(r.id),
    createdAt: str(r.created_at),
    model: { hash: str(model.hash), name: str(model.name) ?? str(p.model), format: str(model.format) },
    status: str(p.status) ?? 'unknown',
    device: str(p.device),
    costUnit: str(p.cost_unit),
    fingerprint: str(p.fingerprint),
    budgetBytes: num(p.budget_bytes),
    minPeakBytes: num(p.min_peak_bytes),
    unplannedPeakBytes: num(p.unplanned_peak_bytes),
    predicted: {
      peakBytes: num(pred.peak_bytes),
      overhead: num(pred.overhead),
      computeCost: num(pred.compute_cost),
      baseCost: num(pred.base_cost),
      // The part of the cost that is checkpointing's own work, where the capture priced it.
      wrapCost: num(pred.wrap_cost) ?? 0,
      peakInRerunOf: str(pred.peak_in_rerun_of),
    },
    lowerBound: p.lower_bound && typeof p.lower_bound === 'object'
      ? { overhead: num(p.lower_bound.overhead), computeCost: num(p.lower_bound.compute_cost), source: str(p.lower_bound.source) }
      : null,
    gap: num(p.gap),
    regions,
    validation: normalizeValidation(p.validation),
    wrapped: regions.filter((x) => x.wrapped).length,
    kept: regions.reduce((n, x) => n + x.keep.length, 0),
  };
}
