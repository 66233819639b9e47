// fmtBytes just under a unit boundary (the tester's item 3): it rolls over to the next unit.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fmtBytes } from '../../js/format.js';

test('3: fmtBytes rolls over to the next unit when rounding reaches 1024', () => {
  assert.equal(fmtBytes(1073534272), '1.00 GiB');
  assert.equal(fmtBytes(1024 ** 3 - 1), '1.00 GiB');
  assert.equal(fmtBytes(1024 ** 2 - 1), '1.00 MiB');
  assert.equal(fmtBytes(1047976), '1023 KiB');
  // Three significant digits of the value as rounded.
  assert.equal(fmtBytes(99.97 * 1024), '100 KiB');
  assert.equal(fmtBytes(9.999 * 1024), '10.0 KiB');
  assert.equal(fmtBytes(-1073534272), '-1.00 GiB');
  assert.equal(fmtBytes(1023), '1023 B');
  assert.equal(fmtBytes(3288334336), '3.06 GiB');
});
