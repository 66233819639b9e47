// The upload page's error lines (the tester's item 7): a 413's limit from details.limit_bytes, else from its message.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ApiError } from '../../js/api.js';
import { describeError } from '../../js/upload.js';

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
