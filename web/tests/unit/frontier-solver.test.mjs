// A frontier is kept and named by the solver that swept it (the tester's item 2).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { sweepKey } from '../../js/session.js';
import { paretoSeries, frontierLabel } from '../../js/charts.js';
import { normalizeSweep } from '../../js/model.js';
import { planSolver } from '../../js/planpage.js';

test('2: the frontier is kept by solver and its line named after the solver that swept it', () => {
  assert.notEqual(sweepKey('h', { batch: 2 }, 'chen-sqrt'), sweepKey('h', { batch: 2 }, 'auto'));
  assert.equal(sweepKey('h', { batch: 2 }, 'auto'), 'h|batch=2|solver=auto');
  // A captured graph's sweep names no solver: its key is as before.
  assert.equal(sweepKey('h', {}), 'h|');
  assert.equal(planSolver({ solver: null }), 'auto');
  assert.equal(planSolver({}), 'auto');
  assert.equal(planSolver({ solver: 'chen-sqrt' }), 'chen-sqrt');
  assert.equal(frontierLabel('chen-sqrt'), 'frontier (chen-sqrt)');
  assert.equal(frontierLabel(null), 'frontier (remat)');
  const sweep = normalizeSweep({ points: [{ budget_bytes: 10, status: 'feasible', overhead: 0.1, baselines: [] }] });
  const pts = paretoSeries({ doc: null, sweep, history: [], planId: 'p', solver: 'every-k' });
  assert.equal(pts.frontierLabel, 'frontier (every-k)');
  assert.doesNotMatch(pts.frontierLabel, /remat/);
});
