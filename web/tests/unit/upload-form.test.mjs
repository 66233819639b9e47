// The upload page (the tester's items 1, 5, 6, 7, 8, 9): dims and seconds read as typed and refused by name, the check's dims, a 413's limit, JSON that is no graph, budgets and probes in the lists.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fmtBudget } from '../../js/format.js';
import { normalizeHistory, probesLabel } from '../../js/model.js';
import { ApiError, isJson, isGraphJson, modelContentType, planQuery } from '../../js/api.js';
import { describeError, readDims, readSeconds, dimsKey, recentShown } from '../../js/upload.js';

const enc = (s) => new TextEncoder().encode(s).buffer;

test('1: a dim edited after the check changes the dims key the check was made at', () => {
  const checked = dimsKey([{ name: 'batch', text: '2' }, { name: 'seq', text: '8' }]);
  assert.equal(dimsKey([{ name: 'seq', text: ' 8' }, { name: 'batch', text: '2' }]), checked);
  assert.notEqual(dimsKey([{ name: 'batch', text: '3' }, { name: 'seq', text: '8' }]), checked);
  assert.notEqual(dimsKey([{ name: 'batch', text: '' }, { name: 'seq', text: '8' }]), checked);
});

test('5: an invalid time limit or bound time is refused, not replaced by the default', () => {
  assert.deepEqual(readSeconds('30', { label: 'Time limit', positive: true }), { value: '30' });
  assert.match(readSeconds('', { label: 'Time limit', positive: true }).error, /^Time limit: give a number of seconds/);
  assert.match(readSeconds('', { label: 'Time limit', positive: true, badInput: true }).error, /Time limit: not a number/);
  assert.match(readSeconds('abc', { label: 'Time limit', positive: true }).error, /“abc” is not a number/);
  assert.match(readSeconds('0', { label: 'Time limit', positive: true }).error, /more than 0/);
  assert.match(readSeconds('-1', { label: 'Bound time' }).error, /^Bound time must be 0 or more seconds \(got -1\)/);
  assert.deepEqual(readSeconds('0', { label: 'Bound time' }), { value: undefined });
  assert.deepEqual(readSeconds('', { label: 'Bound time' }), { value: undefined });
  assert.deepEqual(readSeconds('20', { label: 'Bound time' }), { value: '20' });
});

test('6: dims are sent as the digits typed; others are refused naming the dim', () => {
  const ok = readDims([{ name: 'batch', text: '18446744073709551616' }, { name: 'seq', text: ' 8 ' }, { name: 'x:0', text: '' }]);
  assert.deepEqual(ok, { dims: { batch: '18446744073709551616', seq: '8' }, errors: [] });
  assert.equal(planQuery({ dims: ok.dims }), 'dim=batch%3D18446744073709551616&dim=seq%3D8');
  const bad = readDims([
    { name: 'a', text: '0' },
    { name: 'b', text: '-1' },
    { name: 'c', text: '2.5' },
    { name: 'd', text: 'abc' },
    { name: 'e', text: '1e21' },
  ]);
  assert.deepEqual(bad.dims, {});
  assert.deepEqual(bad.errors.map((e) => e.name), ['a', 'b', 'c', 'd', 'e']);
  assert.match(bad.errors[0].message, /^a must be at least 1/);
  assert.match(bad.errors[1].message, /^b must be at least 1/);
  assert.match(bad.errors[2].message, /^c must be a whole number/);
  assert.match(bad.errors[3].message, /^d is not a whole number/);
  assert.match(bad.errors[4].message, /^e: write the value in digits/);
});

test('7: a 413 reads details.limit_bytes, else the limit its message gives', () => {
  const withDetails = describeError(new ApiError(413, 'payload_too_large', 'too big', { limit_bytes: 1048576 }));
  assert.match(withDetails.at(-1), /up to 1\.00 MiB \(1,048,576 B\)/);
  const msg = "the request body is over this server's limit of 1048576 bytes (1.0 MiB, its --body-limit)";
  const fromMessage = describeError(new ApiError(413, 'payload_too_large', msg, null));
  assert.match(fromMessage.at(-1), /up to 1\.00 MiB \(1,048,576 B\)/);
  assert.ok(!fromMessage.some((l) => /does not say/.test(l)));
  // An error that says nothing of its limit.
  assert.match(describeError(new ApiError(413, 'payload_too_large', 'length limit exceeded', null)).at(-1), /does not say/);
});

test('8: JSON that is not a graph object is sent as JSON, not as ONNX', () => {
  assert.equal(isJson(enc('[1,2,3]')), true);
  assert.equal(isJson(enc('  \n[1,2,3]')), true);
  assert.equal(isJson(enc('"text"')), true);
  assert.equal(isJson(enc('42')), true);
  assert.equal(isJson(enc('\ufeff{"nodes": []}')), true);
  assert.equal(isJson(enc('\x08\x07onnx')), false);
  assert.equal(isJson(enc('')), false);
  assert.equal(isJson(enc('12 not json')), false);
  assert.equal(isGraphJson(enc('[1,2,3]')), false);
  assert.equal(modelContentType(enc('[1,2,3]')), 'application/json');
  assert.equal(modelContentType(enc('{"nodes": []}')), 'application/json');
  assert.equal(modelContentType(enc('\x08\x07onnx')), 'application/octet-stream');
});

test('9: budgets without figures are formatted; the probes switch says what the probes were', () => {
  assert.equal(fmtBudget('114427712'), '109 MiB');
  assert.equal(fmtBudget('1'), '1 B');
  assert.equal(fmtBudget('0.9x'), '0.90× of store-all');
  assert.equal(fmtBudget('2GiB'), '2.00 GiB');
  assert.equal(fmtBudget('1e9'), '954 MiB');
  assert.equal(fmtBudget('min'), 'min');
  assert.equal(fmtBudget(undefined), '—');
  const probe = (id, budget, code) => ({ id, created_at: `2026-12-07T00:00:0${id}Z`, status: 'failed', options: { solver: 'store-all', budget }, error: { code, message: '' } });
  const entries = normalizeHistory([probe('1', '1.0x', 'unbound_dims'), probe('2', '1', 'infeasible_budget'), probe('3', '1', 'infeasible_budget')]);
  assert.equal(probesLabel(entries), "Show the viewer's 3 failed probes (2 one-byte budgets asked for the minimum, 1 asked which dimensions the model has)");
  assert.equal(probesLabel(entries.slice(0, 1)), "Show the viewer's 1 failed probe (1 asked which dimensions the model has)");
  // The upload page's recent plans: failed probes hidden unless asked for; a done probe stays.
  const plans = [
    { id: 'a', status: 'failed', options: { solver: 'store-all', budget: '1' } },
    { id: 'b', status: 'done', options: { solver: 'store-all', budget: '1.0x' } },
    { id: 'c', status: 'failed', options: { solver: 'auto', budget: '0.5x' } },
  ];
  assert.deepEqual(recentShown(plans).map((p) => p.id), ['b', 'c']);
  assert.deepEqual(recentShown(plans, { showProbes: true }).map((p) => p.id), ['a', 'b', 'c']);
});
