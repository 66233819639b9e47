// The mock server's planner must produce schedules whose figures are consistent, or the
// end-to-end test would check the viewer against nonsense.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { problemFromNodeLink, planProblem, createMockServer } from '../mock-server.mjs';
import { makeNodeLink } from '../gen-graph.mjs';

const VGG16 = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../../shared/bench/graphs/VGG16 (MLSys)_256_(224, 224, 3)_train_nx.json');

function check(p, budget) {
  const { base, best } = planProblem(p, budget);
  assert.equal(best.memory.length, best.steps.length);
  assert.equal(Math.max(...best.memory) <= best.peak, true);
  assert.ok(best.cost >= base.cost, 'recomputation never lowers the cost');
  // Every node is computed at least once.
  assert.ok(best.computes.every((c) => c >= 1));
  return { base, best };
}

test('generated graphs plan at store-all and below', () => {
  const p = problemFromNodeLink(makeNodeLink(200));
  assert.equal(p.nodes.length, 200);
  const { base } = check(p, Infinity);
  const { best } = check(p, base.peak * 0.7);
  assert.ok(best.peak <= base.peak);
});

test('VGG16 from the benchmark graphs', { skip: !fs.existsSync(VGG16) }, () => {
  const p = problemFromNodeLink(JSON.parse(fs.readFileSync(VGG16, 'utf8')));
  assert.equal(p.nodes.length, 45);
  check(p, Infinity);
});

test('bad graphs are refused with the field named', () => {
  assert.throws(() => problemFromNodeLink({ nodes: [{ id: 0 }], links: [] }), /cost_ram/);
  assert.throws(() => problemFromNodeLink({ nodes: [{ id: 0, cost_ram: 1 }], links: [{ source: 0, target: 9 }] }), /unknown node/);
  assert.throws(() => problemFromNodeLink({}), /nodes/);
});

/** A mock server on a free port for `fn(base)`, closed after it. */
async function withServer(options, fn) {
  const server = createMockServer(options);
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  try {
    await fn(`http://127.0.0.1:${server.address().port}`);
  } finally {
    server.closeAllConnections?.();
    await new Promise((r) => server.close(r));
  }
}

const graph = JSON.stringify(makeNodeLink(20));
const slow = { 'Content-Type': 'application/json', 'x-mock-job-seconds': '30' };

test('DELETE stops a running job as the service does: 204, then GET and DELETE answer 404', async () => {
  await withServer({ token: null }, async (base) => {
    const post = await fetch(`${base}/v1/plans?budget=1.0x&wait=0`, { method: 'POST', body: graph, headers: slow });
    assert.equal(post.status, 202);
    const { id } = await post.json();
    assert.equal((await fetch(`${base}/v1/plans/${id}`)).status, 200);
    // A plan is not deleted through the sweeps' route.
    assert.equal((await fetch(`${base}/v1/sweeps/${id}`, { method: 'DELETE' })).status, 404);
    const del = await fetch(`${base}/v1/plans/${id}`, { method: 'DELETE' });
    assert.equal(del.status, 204);
    assert.equal(await del.text(), '');
    const get = await fetch(`${base}/v1/plans/${id}`);
    assert.equal(get.status, 404);
    assert.equal((await get.json()).error.code, 'not_found');
    assert.equal((await fetch(`${base}/v1/plans/${id}`, { method: 'DELETE' })).status, 404);
    // Gone from the list too; the same post again is a new job, not the deleted one.
    assert.ok(!(await (await fetch(`${base}/v1/plans`)).json()).plans.some((p) => p.id === id));
    const again = await fetch(`${base}/v1/plans?budget=1.0x&wait=0`, { method: 'POST', body: graph, headers: slow });
    assert.notEqual((await again.json()).id, id);
    // Sweeps too.
    const sweep = await fetch(`${base}/v1/sweeps?wait=0`, { method: 'POST', body: graph, headers: slow });
    const sid = (await sweep.json()).id;
    assert.equal((await fetch(`${base}/v1/sweeps/${sid}`, { method: 'DELETE' })).status, 204);
    assert.equal((await fetch(`${base}/v1/sweeps/${sid}`)).status, 404);
  });
});

test('with a token, writes without it answer 401 (POST and DELETE); reads do not need it', async () => {
  await withServer({ token: 't0k' }, async (base) => {
    const anon = await fetch(`${base}/v1/plans?budget=1.0x&wait=0`, { method: 'POST', body: graph, headers: slow });
    assert.equal(anon.status, 401);
    assert.equal(anon.headers.get('www-authenticate'), 'Bearer');
    assert.equal((await anon.json()).error.code, 'unauthorized');
    const post = await fetch(`${base}/v1/plans?budget=1.0x&wait=0`, { method: 'POST', body: graph, headers: { ...slow, Authorization: 'Bearer t0k' } });
    assert.equal(post.status, 202);
    const { id } = await post.json();
    assert.equal((await fetch(`${base}/v1/plans/${id}`, { method: 'DELETE' })).status, 401);
    assert.equal((await fetch(`${base}/v1/plans/${id}`, { method: 'DELETE', headers: { Authorization: 'Bearer wrong' } })).status, 401);
    assert.equal((await fetch(`${base}/v1/plans/${id}`)).status, 200, 'a refused DELETE leaves the job');
    assert.equal((await fetch(`${base}/v1/plans/${id}`, { method: 'DELETE', headers: { Authorization: 'Bearer t0k' } })).status, 204);
    assert.equal((await fetch(`${base}/v1/plans/${id}`)).status, 404);
  });
});

test('expect_model: another model is refused with 409 model_mismatch before any job, the same one planned', async () => {
  await withServer({ token: null }, async (base) => {
    const { createHash } = await import('node:crypto');
    const hash = createHash('sha256').update(graph).digest('hex');
    const other = JSON.stringify(makeNodeLink(21));
    const count = async () => (await (await fetch(`${base}/v1/plans`)).json()).plans.length;
    const before = await count();
    const refused = await fetch(`${base}/v1/sweeps?wait=0&expect_model=${hash}`, { method: 'POST', body: other, headers: slow });
    assert.equal(refused.status, 409);
    const { error } = await refused.json();
    assert.equal(error.code, 'model_mismatch');
    assert.equal(error.details.expected, hash);
    assert.notEqual(error.details.got, hash);
    assert.equal(await count(), before, 'no job was made');
    const same = await fetch(`${base}/v1/plans?budget=1.0x&wait=0&expect_model=${hash.toUpperCase()}`, { method: 'POST', body: graph, headers: slow });
    assert.equal(same.status, 202);
    assert.equal((await same.json()).options?.expect_model, undefined, 'not an option of the plan');
  });
});
