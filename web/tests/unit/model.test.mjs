import { test } from 'node:test';
import assert from 'node:assert/strict';
import { normalizeRecord, normalizeDoc, normalizeSweep, normalizeHistory, decisionCounts, peakStep, measuredSeries } from '../../js/model.js';

const doc = {
  status: 'optimal', solver: 'dp', budget_bytes: 100, store_all_peak_bytes: 160, store_all_cost: 10,
  predicted: { peak_bytes: 96, compute_cost: 12, overhead: 0.2, memory: [10, 50, 96, 40] },
  gap: 0, solve_seconds: 0.5, lower_bound: { compute_cost: 12, source: 'exact' },
  baselines: [{ name: 'store-all', peak_bytes: 160, compute_cost: 10, overhead: 0, feasible: false }],
  schedule: [{ op: 'compute', node: '0' }],
  decisions: [
    { node: 0, name: 'a', kind: 'forward', bytes: 10, cost: 1, computes: 2, decision: 'recompute', reason: 'r', deps: [] },
    { node: '1', kind: 'weird', bytes: 'x', decision: 'keep', deps: [0] },
  ],
  graph: { name: 'g', format: 'graph_json', nodes: 2, fixed_bytes: 0 },
};

test('a full plan record normalizes', () => {
  const r = normalizeRecord({ id: 'p1', status: 'done', model: { hash: 'h', name: 'm', format: 'onnx' }, created_at: 't', options: { budget: '0.6x' }, plan: doc });
  assert.equal(r.id, 'p1');
  assert.equal(r.model.hash, 'h');
  assert.equal(r.doc.budgetBytes, 100);
  assert.equal(r.doc.predicted.overhead, 0.2);
  assert.equal(r.doc.validation, null);
  assert.equal(r.doc.lowerBound, 12);
  assert.equal(r.doc.boundSource, 'exact');
  assert.deepEqual(r.doc.decisions.map((d) => d.id), ['0', '1']);
  // Missing or odd fields: the name falls back to the id, an unknown kind to forward, a bad number to null.
  assert.equal(r.doc.decisions[1].name, '1');
  assert.equal(r.doc.decisions[1].kind, 'forward');
  assert.equal(r.doc.decisions[1].bytes, null);
  assert.deepEqual(r.doc.decisions[1].deps, ['0']);
});

test('empty and malformed answers give empty shapes, never throw', () => {
  for (const input of [null, undefined, 42, 'x', [], {}]) {
    const r = normalizeRecord(input);
    assert.equal(r.doc, null);
    const d = normalizeDoc(input);
    assert.deepEqual(d.decisions, []);
    assert.deepEqual(d.predicted.memory, []);
    assert.deepEqual(normalizeHistory(input), []);
    assert.deepEqual(normalizeSweep(input).points, []);
  }
});

test('validation fields and the measured timeline', () => {
  const d = normalizeDoc({ ...doc, validation: { device: 'cpu', ok: true, measured_peak_bytes: 99, measured_step_overhead: 0.07, timeline: [{ step: 1, predicted_bytes: 50, measured_bytes: 52 }, { step: 9, measured_bytes: 1 }] } });
  assert.equal(d.validation.ok, true);
  assert.equal(d.validation.gradNote, null);
  assert.equal(normalizeDoc({ ...doc, validation: { grad_note: 'the loss is constant' } }).validation.gradNote, 'the loss is constant');
  assert.equal(d.validation.measuredStepOverhead, 0.07);
  assert.equal(d.validation.measuredPeakBytes, 99);
  assert.deepEqual(measuredSeries(d.validation, 4), [null, 52, null, null]);
  assert.deepEqual(measuredSeries(null, 2), [null, null]);
  // No heap figures: the heap series is empty.
  assert.deepEqual(measuredSeries(d.validation, 4, 'heapPeak'), [null, null, null, null]);
});

test('the heap peak per step, where the validation measured it', () => {
  const d = normalizeDoc({
    ...doc,
    validation: { timeline: [{ step: 0, measured_bytes: 10, heap_peak_bytes: 14 }, { step: 2, measured_bytes: 12, heap_peak_bytes: 'x' }] },
  });
  assert.deepEqual(measuredSeries(d.validation, 3, 'heapPeak'), [14, null, null]);
  assert.deepEqual(measuredSeries(d.validation, 3), [10, null, 12]);
});

test('sweeps: baselines as records or as [name, overhead] pairs; budget from the fraction', () => {
  const s = normalizeSweep({
    store_all_peak_bytes: 1000,
    points: [
      { fraction: 0.5, status: 'feasible', overhead: 0.3, solver: 'ilp', baselines: [['chen-sqrt', 0.4], ['revolve', null]] },
      { budget_bytes: 900, fraction: 0.9, status: 'optimal', overhead: 0.01, baselines: [{ name: 'store-all', overhead: 0, feasible: false }] },
    ],
  });
  assert.deepEqual(s.points.map((p) => p.budgetBytes), [500, 900]);
  assert.deepEqual(s.points[0].baselines.map((b) => [b.name, b.overhead, b.feasible]), [['chen-sqrt', 0.4, true], ['revolve', null, false]]);
  assert.equal(s.points[1].baselines[0].feasible, false);
});

test('history: an object with plans or a bare array, sorted oldest first', () => {
  const entries = [
    { id: 'b', created_at: '2026-01-02', status: 'done', options: { budget: '0.5x', solver: 'dp' }, summary: { budget_bytes: 5, peak_bytes: 4, overhead: 0.1 } },
    { id: 'a', created_at: '2026-01-01', status: 'failed', options: {}, error: { code: 'infeasible_budget', message: 'm' } },
  ];
  for (const h of [{ model: 'x', plans: entries }, entries]) {
    const out = normalizeHistory(h);
    assert.deepEqual(out.map((e) => e.id), ['a', 'b']);
    assert.equal(out[1].budget, '0.5x');
    assert.equal(out[1].solver, 'dp');
    assert.equal(out[1].overhead, 0.1);
    assert.equal(out[0].error.code, 'infeasible_budget');
  }
});

test('decision counts and the peak step', () => {
  const d = normalizeDoc(doc);
  assert.deepEqual(decisionCounts(d.decisions), { recompute: 1, keep: 1 });
  assert.deepEqual(peakStep(d.predicted.memory), { step: 2, bytes: 96 });
  assert.equal(peakStep([]), null);
});

test('a validation block that did not run counts as not validated', () => {
  const d = normalizeDoc({ ...doc, validation: { ok: null, ran: false, reason: 'no executor in this build' } });
  assert.equal(d.validation.ran, false);
  assert.equal(d.validation.reason, 'no executor in this build');
  assert.deepEqual(measuredSeries(d.validation, 2), [null, null]);
});

test('a maximize search and a reused schedule normalize; absent, they are null', () => {
  const d = normalizeDoc({
    ...doc,
    reused_from_budget_bytes: 80,
    maximize: { dim: 'batch', value: 12, budget_bytes: 1000, max_overhead: 0.1, next_value: 13, probes: [{ value: 13, fits: false, overhead: 0.2, store_all_peak_bytes: 2000, reason: 'over' }, { value: 12, fits: true }] },
  });
  assert.equal(d.reusedFromBudgetBytes, 80);
  assert.equal(d.maximize.value, 12);
  assert.equal(d.maximize.nextValue, 13);
  assert.deepEqual(d.maximize.probes.map((p) => [p.value, p.fits]), [[13, false], [12, true]]);
  assert.equal(d.maximize.probes[1].reason, '');
  assert.equal(normalizeDoc(doc).maximize, null);
  assert.equal(normalizeDoc(doc).reusedFromBudgetBytes, null);
  assert.equal(normalizeDoc({ ...doc, maximize: 'x' }).maximize, null);
});
