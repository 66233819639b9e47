import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fmtBytes, fmtInt, fmtBytesExact, fmtOverhead, fmtPct, fmtRatio, fmtSeconds, fmtCost, fmtCostIn, fmtTime, parseSize } from '../../js/format.js';

const cases = [
  [fmtBytes, 0, '0 B'],
  [fmtBytes, 1023, '1023 B'],
  [fmtBytes, 1024, '1.00 KiB'],
  [fmtBytes, 3288334336, '3.06 GiB'],
  [fmtBytes, 15825108992, '14.7 GiB'],
  [fmtBytes, 1024 ** 3 * 512, '512 GiB'],
  [fmtBytes, null, '—'],
  [fmtBytes, NaN, '—'],
  [fmtInt, 3288334336, '3,288,334,336'],
  [fmtInt, -1234, '-1,234'],
  [fmtBytesExact, 999, '999 B'],
  [fmtOverhead, 0.1234, '+12.34 %'],
  [fmtOverhead, 0, '+0.00 %'],
  [fmtOverhead, -0.005, '−0.50 %'],
  [fmtOverhead, undefined, '—'],
  [fmtPct, 0.5, '50.0 %'],
  [fmtRatio, 0.6, '0.60×'],
  [fmtSeconds, 0.0123, '12.3 ms'],
  [fmtSeconds, 4.2, '4.20 s'],
  [fmtSeconds, 125, '2 min 5 s'],
  [fmtCost, 1234567, '1.23 M'],
  [fmtCost, 230, '230'],
  [fmtCost, 17234, '17.2 k'],
  [fmtCost, 0.0000123, '1.23e-5'],
  [fmtTime, '2026-11-29T11:02:03Z', '2026-11-29 11:02:03 UTC'],
  [fmtTime, 'yesterday', 'yesterday'],
];

test('formatters', () => {
  for (const [f, input, want] of cases) assert.equal(f(input), want, `${f.name}(${input})`);
});

test('costs in seconds read as times, other units as numbers', () => {
  assert.equal(fmtCostIn(0.0000123, 'seconds'), '12.3 µs');
  assert.equal(fmtCostIn(0.00123, 'seconds'), '1.23 ms');
  assert.equal(fmtCostIn(4.2, 'seconds'), '4.20 s');
  assert.equal(fmtCostIn(1234567, undefined), '1.23 M');
});

test('parseSize reads the sizes the API accepts and refuses fractions', () => {
  const table = [['123', 123], ['2GiB', 2 * 1024 ** 3], ['800MB', 800e6], ['1.5 GB', 1.5e9], ['4 KiB', 4096], ['0.6x', null], ['', null], ['GiB', null], ['12 parsecs', null]];
  for (const [text, want] of table) assert.equal(parseSize(text), want, text);
});
