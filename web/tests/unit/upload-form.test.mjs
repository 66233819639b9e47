// The upload page (the tester's items 7, 8): a 413's limit, JSON that is no graph.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ApiError, isJson, isGraphJson, modelContentType } from '../../js/api.js';
import { describeError } from '../../js/upload.js';

const enc = (s) => new TextEncoder().encode(s).buffer;

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
