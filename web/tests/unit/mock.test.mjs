// The mock server's planner must produce schedules whose figures are consistent, or the
// end-to-end test would check the viewer against nonsense.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { problemFromNodeLink, planProblem } from '../mock-server.mjs';
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
