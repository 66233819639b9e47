// The tester's reports (A1–C4): the pure parts of each fix.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { paretoSeries, frontierSentence, baselinesWithin } from '../../js/charts.js';
import { normalizeDoc, normalizeSweep, normalizeHistory, planDims, setupKey, dimsText, isProbe } from '../../js/model.js';
import { sweepKey } from '../../js/session.js';
import { ApiError, poll, isTorchGraph, isTransient, retryDelay } from '../../js/api.js';
import { describeError, mergeDimNames } from '../../js/upload.js';

const enc = (s) => new TextEncoder().encode(s).buffer;

test('A1: the best baseline within the budget is from the plan’s own baselines that fit, not the sweep’s', () => {
  const doc = normalizeDoc({
    budget_bytes: 92,
    predicted: { overhead: 0.02 },
    baselines: [
      { name: 'store-all', peak_bytes: 100, overhead: 0, feasible: false },
      { name: 'chen-greedy', peak_bytes: 95, overhead: 0.256, feasible: false },
      { name: 'every-k', peak_bytes: 90, overhead: 0.2326, feasible: true },
      { name: 'chen-sqrt', peak_bytes: 80, overhead: 0.4, feasible: true },
    ],
  });
  // The sweep's store-all budget point has chen-greedy at +0 %: above this plan's budget.
  const sweep = normalizeSweep({ points: [{ budget_bytes: 100, status: 'optimal', overhead: 0, baselines: [['chen-greedy', 0], ['store-all', 0]] }] });
  const pts = paretoSeries({ doc, sweep, history: [], planId: 'p' });
  assert.deepEqual(pts.withinBudget, [{ name: 'every-k', overhead: 0.2326 }, { name: 'chen-sqrt', overhead: 0.4 }]);
  // A baseline marked feasible whose peak is over the budget does not count either.
  assert.deepEqual(baselinesWithin({ budgetBytes: 50, baselines: [{ name: 'x', peakBytes: 60, overhead: 0.1, feasible: true }] }), []);
});

test('A2: a maximized plan’s dims are the value found; sweeps are kept by model and dims', () => {
  const opts = { dims: { batch: 2 }, maximize: 'batch', budget: '1GiB' };
  assert.deepEqual(planDims(opts, { dim: 'batch', value: 19 }), { batch: 19 });
  assert.equal(planDims(opts, null), null, 'the value found is unknown without the document');
  assert.deepEqual(planDims({ dims: { batch: 2 } }, null), { batch: 2 });
  assert.equal(sweepKey('h', { seq: 8, batch: 19 }), 'h|batch=19,seq=8');
  assert.notEqual(sweepKey('h', { batch: 19 }), sweepKey('h', { batch: 2 }));
  assert.equal(sweepKey('h', {}), 'h|');
  assert.equal(sweepKey(null, {}), null);
});

test('A3: the frontier says how many of its budgets are infeasible', () => {
  const sweep = normalizeSweep({ points: [1, 2, 3, 4].map((i) => ({ budget_bytes: i, status: i < 3 ? 'infeasible' : 'optimal', overhead: i < 3 ? null : 0.1 })) });
  const pts = paretoSeries({ doc: null, sweep, history: [], planId: null });
  assert.equal(pts.frontier.length, 2);
  assert.equal(pts.infeasible, 2);
  assert.equal(pts.least, null, 'a sweep that does not say the least budget');
  const said = normalizeSweep({
    points: [1, 2, 3].map((i) => ({ budget_bytes: i, status: i < 3 ? 'infeasible' : 'optimal', overhead: i < 3 ? null : 0.1, min_feasible_budget_bytes: i < 3 ? 3 : undefined })),
  });
  assert.equal(paretoSeries({ doc: null, sweep: said, history: [], planId: null }).least, 3);
  assert.equal(frontierSentence(2, 2), 'Frontier of 4 budgets: 2 with a plan, 2 infeasible (no schedule fits).');
  assert.equal(frontierSentence(8, 0), 'Frontier of 8 budgets.');
  assert.equal(
    frontierSentence(2, 2, 1536),
    'Frontier of 4 budgets: 2 with a plan, 2 infeasible (no schedule fits; plans start at 1.50 KiB).',
  );
});

test('A4: history entries carry their dims; only plans at the same dims and inputs compare', () => {
  const h = normalizeHistory([
    { id: 'a', status: 'done', options: { dims: { batch: 2 } } },
    { id: 'b', status: 'done', options: { dims: { batch: 3 } } },
    { id: 'c', status: 'done', options: { dims: { batch: 2 }, params: ['W'] } },
    { id: 'd', status: 'done', options: { dims: { batch: 2 }, maximize: 'batch' } },
  ]);
  assert.equal(dimsText(h[0].dims), 'batch=2');
  assert.equal(dimsText({ seq: 8, batch: 1 }), 'batch=1, seq=8');
  const mine = setupKey({ dims: { batch: 2 } }, null);
  assert.deepEqual(h.filter((e) => e.setup === mine).map((e) => e.id), ['a']);
  assert.equal(h[3].setup, null, 'a maximized plan is at dims not known yet');
  assert.equal(setupKey({ dims: { batch: 2 }, maximize: 'batch' }, { dim: 'batch', value: 3 }), h[1].setup);
  assert.equal(setupKey({ params: ['B', 'A'] }, null), setupKey({ params: ['A', 'B'] }, null));
  // Frozen weights change the problem (no gradients for them); none frozen is the option absent.
  assert.notEqual(setupKey({ frozen: ['backbone.*'] }, null), setupKey({}, null));
  assert.equal(setupKey({ frozen: [] }, null), setupKey({}, null));
});

test('C2: the viewer’s probes are recognised in the history', () => {
  assert.equal(isProbe({ options: { solver: 'store-all', budget: '1' } }), true);
  assert.equal(isProbe({ options: { solver: 'store-all', budget: '1.0x' } }), true);
  assert.equal(isProbe({ options: { solver: 'store-all', budget: '0.9x' } }), false);
  assert.equal(isProbe({ options: { solver: 'auto', budget: '1' } }), false);
  assert.equal(normalizeHistory([{ id: 'p', options: { solver: 'store-all', budget: '1' } }])[0].probe, true);
});

test('B1: a captured PyTorch graph is told from a node-link graph and from ONNX', () => {
  assert.equal(isTorchGraph(enc('{"format": "remat.torch-graph", "version": 1}')), true);
  assert.equal(isTorchGraph(enc('{"nodes": [], "links": []}')), false);
  assert.equal(isTorchGraph(enc('{"format": ')), false);
  assert.equal(isTorchGraph(enc('\x08\x07onnx')), false);
});

test('B2: the dims form keeps every dim shown and adds the ones the server asks for', () => {
  assert.deepEqual(mergeDimNames(['batch', 'seq'], ['seq']), ['batch', 'seq']);
  assert.deepEqual(mergeDimNames([], ['batch', 'seq']), ['batch', 'seq']);
  assert.deepEqual(mergeDimNames(['batch'], ['seq']), ['batch', 'seq']);
});

/** A fetch that answers each call from `answers`: an Error (no connection) or [status, body]. */
function fakeFetch(answers) {
  const calls = [];
  globalThis.fetch = async (url) => {
    calls.push(url);
    const a = answers.shift();
    if (a instanceof Error) throw a;
    const [status, body] = a;
    return { ok: status < 400, status, statusText: '', text: async () => JSON.stringify(body) };
  };
  return calls;
}

test('B4: a poll outlives a server out of reach for a while, with backoff', async () => {
  const real = globalThis.fetch;
  try {
    const calls = fakeFetch([new TypeError('connection refused'), [503, { error: { code: 'queue_full', message: 'x' } }], [200, { id: 'p', status: 'solving' }], [200, { id: 'p', status: 'done' }]]);
    const seen = [];
    const rec = await poll('plan', 'p', { intervalMs: 1, backoff: () => 1, onStatus: (s) => seen.push(s) });
    assert.equal(rec.status, 'done');
    assert.equal(calls.length, 4);
    assert.ok(seen[0].startsWith('server unreachable, retrying'), seen[0]);
    // Past `retryMs` the poll gives up with the network error.
    fakeFetch(Array.from({ length: 50 }, () => new TypeError('down')));
    await assert.rejects(poll('plan', 'p', { backoff: () => 5, retryMs: 30 }), (e) => e instanceof ApiError && e.code === 'network');
    // A failed job is not retried: its error is the answer.
    fakeFetch([[200, { id: 'p', status: 'failed', error: { code: 'interrupted', message: 'restart' } }]]);
    await assert.rejects(poll('plan', 'p', { backoff: () => 1 }), (e) => e.code === 'interrupted');
  } finally {
    globalThis.fetch = real;
  }
  assert.equal(isTransient(new ApiError(0, 'network', 'x')), true);
  assert.equal(isTransient(new ApiError(404, 'not_found', 'x')), false);
  assert.deepEqual([0, 1, 2, 3, 4, 9].map(retryDelay), [1000, 2000, 4000, 8000, 10000, 10000]);
});

test('C4: unsupported ops are listed once; a too-large body says what the server allows', () => {
  const e = new ApiError(422, 'unsupported_ops', '2 unsupported node(s): n1 (Relx in domain ai.onnx): unknown op; n2 (Relx in domain ai.onnx): unknown op', {
    unsupported: [{ node: 'n1', op_type: 'Relx', domain: '', reason: 'unknown op' }, { node: 'n2', op_type: 'Relx', domain: '', reason: 'unknown op' }],
  });
  assert.deepEqual(describeError(e), ['2 unsupported node(s) (unsupported_ops)', 'unsupported: n1 — Relx: unknown op', 'unsupported: n2 — Relx: unknown op']);
  const many = describeError(new ApiError(422, 'unsupported_ops', 'x', { unsupported: Array.from({ length: 25 }, (_, i) => ({ node: `n${i}`, op_type: 'X' })) }));
  assert.equal(many.at(-1), '… and 5 more');
  const big = describeError(new ApiError(413, 'payload_too_large', 'length limit exceeded', null));
  assert.match(big[1], /larger than the server takes/);
  assert.match(describeError(new ApiError(413, 'payload_too_large', 'too big', { limit_bytes: 1048576 }))[1], /up to 1\.00 MiB/);
});
