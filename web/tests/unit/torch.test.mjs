import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isTorchPlan, normalizeTorchPlan } from '../../js/model.js';

const record = {
  id: 'p9', status: 'done', created_at: 't', model: { hash: 'h', name: 'gpt2', format: 'torch_graph' },
  plan: {
    format: 'remat.torch-plan', execution_model: 'torch-sac', status: 'fits', device: 'cpu', cost_unit: 'flop',
    budget_bytes: 100, min_peak_bytes: 60, unplanned_peak_bytes: 120,
    predicted: { peak_bytes: 95, overhead: 0.1, compute_cost: 11, base_cost: 10, peak_in_rerun_of: 'h.1' },
    regions: [
      { fqn: 'h.0', class: 'Block', wrapped: true, keep: [['aten.mm.default', 0], ['aten.mm.default', 2]], ops: ['a', 'b'], rerun_cost: 1 },
      { fqn: 'h.1', class: 'Block', wrapped: false, keep: [], ops: ['a'], rerun_cost: 0 },
    ],
  },
};

test('a torch-sac plan record is told apart and normalizes', () => {
  assert.equal(isTorchPlan(record), true);
  assert.equal(isTorchPlan({ plan: { schedule: [] } }), false);
  assert.equal(isTorchPlan(null), false);
  const t = normalizeTorchPlan(record);
  assert.equal(t.model.name, 'gpt2');
  assert.equal(t.predicted.peakBytes, 95);
  assert.equal(t.predicted.peakInRerunOf, 'h.1');
  assert.equal(t.wrapped, 1);
  assert.equal(t.kept, 2);
  assert.deepEqual(t.regions[0].keep, ['aten.mm.default#0', 'aten.mm.default#2']);
  assert.equal(t.regions[1].wrapped, false);
  assert.equal(t.lowerBound, null);
  assert.equal(t.gap, null);
  assert.equal(t.predicted.wrapCost, 0);
});

test('a plan of a measured capture carries the price of checkpointing\'s own work', () => {
  const priced = structuredClone(record);
  priced.plan.cost_unit = 'second';
  priced.plan.predicted.wrap_cost = 0.4;
  assert.equal(normalizeTorchPlan(priced).predicted.wrapCost, 0.4);
});

test('a plan with the chain program\'s lower bound carries it and its gap', () => {
  const bounded = structuredClone(record);
  bounded.plan.lower_bound = { compute_cost: 10.9, overhead: 0.09, source: 'chain_program' };
  bounded.plan.gap = 0.0091;
  const t = normalizeTorchPlan(bounded);
  assert.deepEqual(t.lowerBound, { overhead: 0.09, computeCost: 10.9, source: 'chain_program' });
  assert.equal(t.gap, 0.0091);
});

test('a module run more than once per step is a region per call, labelled by call', () => {
  const albert = structuredClone(record);
  albert.plan.regions = [
    { fqn: 'layer', class: 'AlbertLayerGroup', call: 0, wrapped: true, keep: [], ops: [] },
    { fqn: 'layer', class: 'AlbertLayerGroup', call: 1, wrapped: false, keep: [], ops: [] },
    { fqn: 'head', class: 'Head', wrapped: true, keep: [], ops: [] },
  ];
  const t = normalizeTorchPlan(albert);
  assert.deepEqual(t.regions.map((r) => r.label), ['layer (call 1 of 2)', 'layer (call 2 of 2)', 'head']);
  assert.deepEqual(t.regions.map((r) => r.call), [0, 1, 0]);
});

test('missing fields read as nulls, not errors', () => {
  const t = normalizeTorchPlan({ plan: { execution_model: 'torch-sac', regions: [{}] } });
  assert.equal(t.budgetBytes, null);
  assert.equal(t.regions[0].fqn, 'region 0');
  assert.equal(t.regions[0].label, 'region 0');
  assert.deepEqual(t.regions[0].keep, []);
  assert.equal(t.status, 'unknown');
});

test('a validation measured in PyTorch normalizes with the plan', () => {
  assert.equal(normalizeTorchPlan(record).validation, null);
  const measured = {
    ...record,
    plan: {
      ...record.plan,
      validation: {
        ran: true, device: 'torch-cpu', ok: false, problems: ['measured peak differs'],
        measured_peak_bytes: 97, predicted_peak_bytes: 95, grad_max_rel_err: 0, measured_overhead: 0.12, predicted_overhead: 0.1,
        grad_reference_rel_err: 0.25, memtracker_peak_bytes: 99,
      },
    },
  };
  const v = normalizeTorchPlan(measured).validation;
  assert.equal(v.device, 'torch-cpu');
  assert.equal(v.ok, false);
  assert.equal(v.measuredPeakBytes, 97);
  assert.equal(v.predictedPeakBytes, 95);
  assert.equal(v.memtrackerPeakBytes, 99);
  assert.equal(v.measuredOverhead, 0.12);
  assert.equal(v.gradReferenceRelErr, 0.25);
  assert.deepEqual(v.problems, ['measured peak differs']);
  assert.deepEqual(v.timeline, []);
});
