// The plan's bound in the graph's order (`order_bound`): read from the document and said apart
// from the gap, which is against a bound that holds for every schedule.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { normalizeDoc } from '../../js/model.js';
import { orderLine } from '../../js/planpage.js';

const doc = (extra) =>
  normalizeDoc({
    status: 'feasible',
    solver: 'ilp',
    budget_bytes: 190,
    store_all_peak_bytes: 300,
    store_all_cost: 53,
    predicted: { peak_bytes: 190, compute_cost: 107, overhead: 1.02, memory: [] },
    lower_bound: { compute_cost: 53, source: 'store_all' },
    gap: 0.5,
    baselines: [],
    schedule: [],
    ...extra,
  });

test('no order bound: no line', () => {
  assert.equal(orderLine(doc({})), null);
});

test("the MILP's optimum in the graph's order is said as such, not as optimal", () => {
  const d = doc({ order_bound: { compute_cost: 107, source: 'exact' } });
  assert.equal(d.orderBound, 107);
  assert.equal(orderLine(d), "optimal among schedules in the graph's order (MILP)");
});

test("a stage-model bound gives the gap in the graph's order", () => {
  const d = doc({ predicted: { peak_bytes: 190, compute_cost: 100, overhead: 0.9, memory: [] }, order_bound: { compute_cost: 90, source: 'boundary_milp' } });
  assert.equal(orderLine(d), "in the graph's order: gap 10.00 % (boundary MILP)");
});
