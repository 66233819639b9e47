import { test } from 'node:test';
import assert from 'node:assert/strict';
import { alignSeries, sampleIndices, paretoSeries } from '../../js/charts.js';
import { sortRows, filterRows } from '../../js/table.js';
import { parseRoute, planUrl, historyUrl } from '../../js/router.js';
import { planQuery, isGraphJson } from '../../js/api.js';
import { sliderBytes } from '../../js/upload.js';
import { normalizeDoc, normalizeSweep } from '../../js/model.js';

test('alignSeries merges x values and fills gaps with null', () => {
  assert.deepEqual(alignSeries([[[3, 1], [1, 2]], [[2, 5], [3, 6], [NaN, 1]]]), [[1, 2, 3], [2, null, 1], [null, 5, 6]]);
  assert.deepEqual(alignSeries([]), [[]]);
});

test('sampleIndices keeps first, last and requested rows', () => {
  assert.deepEqual(sampleIndices(5, 10), [0, 1, 2, 3, 4]);
  const s = sampleIndices(1000, 50, [777]);
  assert.ok(s.length <= 52 && s.includes(0) && s.includes(999) && s.includes(777));
  assert.deepEqual(s, [...s].sort((a, b) => a - b));
});

test('paretoSeries: plan, baselines with a peak, feasible sweep points, other plans', () => {
  const doc = normalizeDoc({ budget_bytes: 100, predicted: { overhead: 0.2 }, baselines: [{ name: 'store-all', peak_bytes: 160, overhead: 0, feasible: false }, { name: 'x', overhead: 0.1 }] });
  const sweep = normalizeSweep({ points: [{ budget_bytes: 50, status: 'infeasible', overhead: null }, { budget_bytes: 120, status: 'optimal', overhead: 0.1, baselines: [['store-all', null], ['chen-sqrt', 0.3]] }] });
  const pts = paretoSeries({ doc, sweep, history: [{ id: 'p1', status: 'done', budgetBytes: 100, overhead: 0.2 }, { id: 'p2', status: 'done', budgetBytes: 90, overhead: 0.3 }], planId: 'p1' });
  assert.deepEqual(pts.plan, [[100, 0.2]]);
  assert.deepEqual(pts.baselines.map((b) => [b.name, b.points, b.feasible]), [['store-all', [[160, 0]], false], ['chen-sqrt', [[120, 0.3]], true]]);
  assert.deepEqual(pts.frontier, [[120, 0.1]]);
  assert.deepEqual(pts.history, [[90, 0.3]]);
});

test('table rows sort by number or text, missing values last, and filter', () => {
  const rows = [
    { index: 0, id: 'a', name: 'conv10', kind: 'forward', decision: 'keep', bytes: 5, reason: '' },
    { index: 1, id: 'b', name: 'conv2', kind: 'forward', decision: 'recompute', bytes: null, reason: '' },
    { index: 2, id: 'c', name: 'Relu', kind: 'backward', decision: 'keep', bytes: 7, reason: '' },
  ];
  assert.deepEqual(sortRows(rows, 'bytes', 'desc').map((r) => r.id), ['c', 'a', 'b']);
  assert.deepEqual(sortRows(rows, 'bytes', 'asc').map((r) => r.id), ['a', 'c', 'b']);
  assert.deepEqual(sortRows(rows, 'name', 'asc').map((r) => r.name), ['conv2', 'conv10', 'Relu']);
  assert.deepEqual(filterRows(rows, { decision: 'keep', text: 'RE' }).map((r) => r.id), ['c']);
  assert.equal(filterRows(rows, { decision: '', text: ' ' }).length, 3);
});

test('routes', () => {
  assert.deepEqual(parseRoute('/plans/p%2F1', ''), { name: 'plan', id: 'p/1' });
  assert.deepEqual(parseRoute('/plans/abc/', ''), { name: 'plan', id: 'abc' });
  assert.deepEqual(parseRoute('/', '?model=h1'), { name: 'history', hash: 'h1' });
  assert.deepEqual(parseRoute('/', '?plan=p9'), { name: 'plan', id: 'p9' });
  assert.deepEqual(parseRoute('/index.html', ''), { name: 'home' });
  assert.equal(planUrl('a b'), '/plans/a%20b');
  assert.equal(historyUrl('h'), '/?model=h');
});

test('query strings and format detection', () => {
  assert.equal(planQuery({ budget: '0.6x', dims: { batch: 2, seq: 8 }, solver: 'dp', validate: undefined, wait: 0, fraction: [0.5] }), 'budget=0.6x&solver=dp&wait=0&dim=batch%3D2&dim=seq%3D8&fraction=0.5');
  assert.equal(planQuery({ budget: '1x', time_limit: '30', bound_time: '20' }), 'budget=1x&time_limit=30&bound_time=20');
  assert.equal(planQuery({ budget: '1x', bound_time: undefined }), 'budget=1x');
  assert.equal(planQuery({ budget: '1x', validate: 'true', timing_rounds: '24' }), 'budget=1x&validate=true&timing_rounds=24');
  assert.equal(planQuery({ wait: 1, expect_model: 'ab12', fraction: [0.5] }), 'wait=1&expect_model=ab12&fraction=0.5');
  assert.equal(planQuery({ budget: '24GiB', maximize: 'batch', max_overhead: '0.1', dims: { batch: 4 } }), 'budget=24GiB&maximize=batch&max_overhead=0.1&dim=batch%3D4');
  const enc = (s) => new TextEncoder().encode(s).buffer;
  assert.equal(isGraphJson(enc('  \n{"nodes": []}')), true);
  assert.equal(isGraphJson(enc('\x08\x07onnx')), false);
  assert.equal(isGraphJson(enc('')), false);
});

test('the budget slider maps 0..1000 onto [min, max]', () => {
  assert.equal(sliderBytes(100, 200, 0), 100);
  assert.equal(sliderBytes(100, 200, 1000), 200);
  assert.equal(sliderBytes(100, 200, 500), 150);
  assert.equal(sliderBytes(200, 200, 300), 200);
});

test('sweep fractions run from the minimum feasible budget to store-all', async () => {
  const { sweepFractions } = await import('../../js/planpage.js');
  assert.deepEqual(sweepFractions(831, 1000, 3), [0.831, 0.916, 1]);
  assert.deepEqual(sweepFractions(null, 1000), []);
  assert.deepEqual(sweepFractions(1000, 1000), []);
  const f = sweepFractions(13153337344, 15825108992);
  assert.equal(f.length, 8);
  assert.ok(f[0] * 15825108992 >= 13153337344, 'the lowest fraction is feasible');
  assert.equal(f[7], 1);
});

test('history entries without a summary take figures from the plan document', async () => {
  const { fillFigures } = await import('../../js/figures.js');
  const doc = normalizeDoc({ budget_bytes: 10, solver: 'dp', predicted: { peak_bytes: 9, overhead: 0.05 } });
  const entries = [{ id: 'me', status: 'done', budgetBytes: null, peakBytes: null, overhead: null, solver: null }, { id: 'x', status: 'failed', overhead: null }];
  await fillFigures(entries, 'me', doc);
  assert.deepEqual([entries[0].budgetBytes, entries[0].peakBytes, entries[0].overhead, entries[0].solver], [10, 9, 0.05, 'dp']);
  assert.equal(entries[1].overhead, null);
});

test('API errors are described with their details', async () => {
  const { describeError } = await import('../../js/upload.js');
  const { ApiError } = await import('../../js/api.js');
  const unsupported = describeError(new ApiError(422, 'unsupported_ops', '2 node(s) use unsupported ops', { unsupported: [{ node: 'n1', op_type: 'Loop', domain: '' }, { node: 'n2', op_type: 'Foo', domain: 'com.x' }] }));
  assert.deepEqual(unsupported, ['2 node(s) use unsupported ops (unsupported_ops)', 'unsupported: n1 — Loop', 'unsupported: n2 — Foo (com.x)']);
  const infeasible = describeError(new ApiError(422, 'infeasible_budget', 'too small', { min_feasible_budget_bytes: 2048 }));
  assert.deepEqual(infeasible, ['too small (infeasible_budget)', 'minimum feasible budget: 2.00 KiB (2,048 B)']);
  assert.equal(describeError(new ApiError(401, 'unauthorized', 'token')).at(-1), 'This server requires a token: set it below.');
  assert.deepEqual(describeError(new Error('boom')), ['boom']);
});
