// The plan page's lines (the tester's items 5, 10, 11): clamped options, the reused budget, the measured overhead's range, a running plan's elapsed time.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { normalizeDoc } from '../../js/model.js';
import { reusedLower, clampedNotes, elapsedSeconds, fmtElapsed } from '../../js/planpage.js';

test('5: clamped options are said, with what was applied and what was asked', () => {
  assert.deepEqual(clampedNotes({}), []);
  assert.deepEqual(clampedNotes({ clamped: { time_limit: { requested: 1000, applied: 300, reason: 'the server caps the solver time at 300 s' } } }), [
    'Time limit clamped: 300 s applied (1000 s asked); the server caps the solver time at 300 s.',
  ]);
  const [d] = clampedNotes({ clamped: { time_limit: { default: 30, applied: 10 } } });
  assert.match(d, /^Time limit clamped: 10 s applied \(none asked, its default 30 s\)/);
  assert.match(clampedNotes({ clamped: { bound_time: { requested: 999, applied: 300 } } })[0], /^Bound time clamped: 300 s applied/);
});

test('10: the reused budget is said only when lower; the measured overhead range is read', () => {
  assert.equal(reusedLower({ budgetBytes: 100, reusedFromBudgetBytes: 100 }), false);
  assert.equal(reusedLower({ budgetBytes: 100, reusedFromBudgetBytes: 90 }), true);
  assert.equal(reusedLower({ budgetBytes: 100, reusedFromBudgetBytes: null }), false);
  const doc = normalizeDoc({ validation: { measured_overhead: 0.05, measured_overhead_range: [-0.01, 0.12] } });
  assert.deepEqual(doc.validation.measuredOverheadRange, [-0.01, 0.12]);
  assert.equal(normalizeDoc({ validation: { measured_overhead: 0.05 } }).validation.measuredOverheadRange, null);
});

test('11: a running plan’s elapsed time counts from its record’s creation', () => {
  const posted = Date.parse('2026-12-07T10:00:00.000Z');
  assert.equal(elapsedSeconds(posted, posted + 12_345), 12.345);
  // A server clock a little ahead reads 0; no time at all: null (the page counts from its load).
  assert.equal(elapsedSeconds(posted, posted - 500), 0);
  assert.equal(elapsedSeconds(NaN, posted), null);
  assert.equal(fmtElapsed(1.62), '1.6 s');
  assert.equal(fmtElapsed(125), '2 min 5 s');
});
