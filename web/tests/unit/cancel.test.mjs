// Cancelling a job the viewer waits on: the DELETE call (api.js) and the cancel's states
// (cancel.js), against a fetch that answers as the server would.
import { test, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { ApiError, deleteJob, poll, postPlan, setToken } from '../../js/api.js';
import { CANCEL_MESSAGES, JobCancel, unlessCancelled } from '../../js/cancel.js';
import { isOurJob, rememberJob } from '../../js/session.js';
import { describeError } from '../../js/upload.js';

const realFetch = globalThis.fetch;
afterEach(() => {
  globalThis.fetch = realFetch;
  delete globalThis.localStorage;
});

/** A localStorage for the token (api.js keeps it there). */
function storage() {
  const m = new Map();
  globalThis.localStorage = { getItem: (k) => m.get(k) ?? null, setItem: (k, v) => m.set(k, String(v)), removeItem: (k) => m.delete(k) };
}

const answer = (status, body) => ({ ok: status < 400, status, statusText: '', text: async () => (body === undefined ? '' : JSON.stringify(body)) });
const notFound = (id) => answer(404, { error: { code: 'not_found', message: `no plan with id "${id}"`, details: null } });
const unauthorized = () => answer(401, { error: { code: 'unauthorized', message: 'writes need `Authorization: Bearer <token>`', details: null } });

/**
 * A server: `route(method, url, init)` answers each request (a response, or throws for no
 * connection); every request is kept in `calls` as {method, url, auth}.
 */
function server(route) {
  const calls = [];
  globalThis.fetch = async (url, init = {}) => {
    const method = init.method ?? 'GET';
    calls.push({ method, url, auth: init.headers?.Authorization ?? null });
    return route(method, url, init);
  };
  return calls;
}

/** A promise and the functions that settle it. */
function deferred() {
  let resolve;
  let reject;
  const promise = new Promise((res, rej) => ((resolve = res), (reject = rej)));
  return { promise, resolve, reject };
}

test('deleteJob: DELETE /v1/plans/{id} or /v1/sweeps/{id} with the token, 204; 404 and 401 are ApiErrors', async () => {
  storage();
  setToken('s3cret');
  const calls = server((method, url) => (url.endsWith('/p1') || url.endsWith('/s%2F1') ? answer(204) : url.endsWith('/nope') ? notFound('nope') : unauthorized()));
  assert.equal(await deleteJob('plan', 'p1'), 204);
  assert.equal(await deleteJob('sweep', 's/1'), 204);
  assert.deepEqual(calls.slice(0, 2), [
    { method: 'DELETE', url: '/v1/plans/p1', auth: 'Bearer s3cret' },
    { method: 'DELETE', url: '/v1/sweeps/s%2F1', auth: 'Bearer s3cret' },
  ]);
  await assert.rejects(deleteJob('plan', 'nope'), (e) => e instanceof ApiError && e.status === 404 && e.code === 'not_found');
  await assert.rejects(deleteJob('plan', 'p2'), (e) => e instanceof ApiError && e.status === 401 && e.code === 'unauthorized');
  // Without a token, no Authorization header (as for POST).
  setToken(null);
  await deleteJob('plan', 'p1');
  assert.equal(calls.at(-1).auth, null);
  // No connection: the network ApiError every call gives.
  server(() => {
    throw new TypeError('Failed to fetch');
  });
  await assert.rejects(deleteJob('plan', 'p1'), (e) => e instanceof ApiError && e.status === 0 && e.code === 'network');
});

test('a Cancel before a late poll answer: the wait ends cancelled, the answer (done) is never used', async () => {
  const late = deferred();
  const calls = server((method) => (method === 'DELETE' ? answer(204) : late.promise));
  const job = new JobCancel('plan', 'p1');
  const seen = [];
  job.on((j) => seen.push(j.state));
  let navigated = null;
  // As the upload page: the poll's result opens the plan, unless cancelled.
  const waiting = unlessCancelled(job, poll('plan', 'p1', { signal: job.signal, intervalMs: 1 })).then(
    (rec) => (navigated = rec.id),
    (e) => e,
  );
  await new Promise((r) => setTimeout(r, 5)); // the GET is in flight
  await job.cancel();
  assert.equal(job.state, 'cancelled');
  assert.equal(job.message, 'Cancelled.');
  assert.equal(job.signal.aborted, true, 'the poll is told to stop');
  // The GET sent before the Cancel answers "done" afterwards (a fetch that ignored the abort).
  late.resolve(answer(200, { id: 'p1', status: 'done', plan: {} }));
  const e = await waiting;
  assert.equal(navigated, null, 'no navigation to a cancelled plan');
  assert.equal(e.name, 'AbortError');
  assert.deepEqual(seen, ['cancelling', 'cancelled']);
  assert.equal(calls.filter((c) => c.method === 'DELETE').length, 1);
});

test('a poll that answers done while the DELETE is in flight waits for it, and is dropped on 204', async () => {
  const del = deferred();
  const job = new JobCancel('plan', 'p1', { del: () => del.promise });
  const cancelling = job.cancel();
  assert.equal(job.busy, true);
  let used = false;
  const waiting = unlessCancelled(job, Promise.resolve({ id: 'p1', status: 'done' })).then(() => (used = true), (e) => e);
  await new Promise((r) => setTimeout(r, 5));
  assert.equal(used, false, 'the answer waits for the DELETE');
  del.resolve(204);
  await cancelling;
  assert.equal((await waiting).name, 'AbortError');
  assert.equal(used, false);
  // A poll that failed because the job was deleted under it (GET 404) is dropped too.
  const job2 = new JobCancel('plan', 'p2', { del: async () => 204 });
  const gone = Promise.reject(new ApiError(404, 'not_found', 'no plan'));
  await job2.cancel();
  await assert.rejects(unlessCancelled(job2, gone), (e) => e.name === 'AbortError');
});

test('404: the job was already gone; the wait stops and says so', async () => {
  server(() => notFound('p1'));
  const job = new JobCancel('plan', 'p1');
  await job.cancel();
  assert.equal(job.state, 'gone');
  assert.equal(job.stopped, true);
  assert.equal(job.over, true, 'the button goes');
  assert.equal(job.message, 'The job was already gone.');
  assert.equal(job.signal.aborted, true);
  assert.equal(await job.keep(), false);
  assert.deepEqual(CANCEL_MESSAGES, { cancelled: 'Cancelled.', gone: 'The job was already gone.' });
});

test('401: the token error a failed POST shows; Cancel can be clicked again, with the token', async () => {
  storage();
  const calls = server((method, url, init) => (init.headers?.Authorization === 'Bearer t0k' ? answer(method === 'DELETE' ? 204 : 202, { id: 'p1', status: 'queued' }) : unauthorized()));
  // The POST's error, for comparison.
  const postError = await postPlan(new Uint8Array([0x7b, 0x7d]).buffer, { budget: '1' }).catch((e) => e);
  const job = new JobCancel('plan', 'p1');
  await job.cancel();
  assert.equal(job.state, 'failed');
  assert.equal(job.stopped, false, 'the wait goes on');
  assert.equal(job.signal.aborted, false, 'the poll goes on');
  assert.equal(job.error.status, 401);
  assert.deepEqual(describeError(job.error), describeError(postError));
  assert.ok(describeError(job.error).includes('This server requires a token: set it below.'));
  assert.equal(await job.keep(), true, 'a result of the job is still shown');
  setToken('t0k');
  await job.cancel();
  assert.equal(job.state, 'cancelled');
  assert.deepEqual(calls.filter((c) => c.method === 'DELETE').map((c) => c.auth), [null, 'Bearer t0k']);
});

test('500 or no connection: the error is kept and Cancel can be retried; one DELETE at a time', async () => {
  const answers = [answer(500, { error: { code: 'internal', message: 'internal error' } }), new TypeError('Failed to fetch'), answer(204)];
  const calls = server(() => {
    const a = answers.shift();
    if (a instanceof Error) throw a;
    return a;
  });
  const job = new JobCancel('sweep', 's1');
  const seen = [];
  job.on((j) => seen.push([j.state, j.busy]));
  await job.cancel();
  assert.equal(job.state, 'failed');
  assert.equal(job.error.status, 500);
  assert.equal(job.over, false, 'the button stays');
  // A second click while the DELETE is in flight sends nothing more.
  const first = job.cancel();
  const second = job.cancel();
  assert.equal(job.busy, true);
  await Promise.all([first, second]);
  assert.equal(job.state, 'failed');
  assert.equal(job.error.code, 'network');
  await job.cancel();
  assert.equal(job.state, 'cancelled');
  assert.equal(calls.length, 3);
  assert.deepEqual(calls.map((c) => `${c.method} ${c.url}`), Array(3).fill('DELETE /v1/sweeps/s1'));
  assert.deepEqual(seen, [['cancelling', true], ['failed', false], ['cancelling', true], ['failed', false], ['cancelling', true], ['cancelled', false]]);
});

test('a job that ends on its own: its button goes, its result is used; a failed cancel does not hold it', async () => {
  const job = new JobCancel('plan', 'p1', { del: async () => 204 });
  assert.equal(await unlessCancelled(job, Promise.resolve('rec')), 'rec');
  assert.equal(job.state, 'ended');
  assert.equal(job.over, true);
  await job.cancel();
  assert.equal(job.state, 'ended', 'nothing left to cancel');
  // The DELETE failed (500) and the job then ended: its result is shown.
  const job2 = new JobCancel('plan', 'p2', {
    del: async () => {
      throw new ApiError(500, 'internal', 'internal error');
    },
  });
  await job2.cancel();
  await assert.rejects(unlessCancelled(job2, Promise.reject(new ApiError(422, 'infeasible_budget', 'x'))), (e) => e.code === 'infeasible_budget');
  assert.equal(job2.state, 'ended');
  // A cancelled job stays cancelled whatever ends after it.
  const job3 = new JobCancel('plan', 'p3', { del: async () => 204 });
  await job3.cancel();
  job3.end();
  assert.equal(job3.state, 'cancelled');
});

test('leaving the page stops the poll without cancelling the job', () => {
  const page = new AbortController();
  const job = new JobCancel('plan', 'p1', { signal: page.signal, del: () => assert.fail('no DELETE') });
  page.abort();
  assert.equal(job.signal.aborted, true);
  assert.equal(job.state, 'waiting');
  const left = new AbortController();
  left.abort();
  assert.equal(new JobCancel('plan', 'p2', { signal: left.signal }).signal.aborted, true);
});

test('only the jobs this tab submitted are offered a Cancel', () => {
  assert.equal(isOurJob('plan', 'zz9'), false);
  rememberJob('plan', 'zz9');
  assert.equal(isOurJob('plan', 'zz9'), true);
  assert.equal(isOurJob('sweep', 'zz9'), false);
});
