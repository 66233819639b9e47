import { test } from 'node:test';
import assert from 'node:assert/strict';
import { graphEdges, layoutEdges, chains, ranks, layoutGraph, syntheticTrainingGraph, EDGE_FORWARD, EDGE_BACKWARD, EDGE_SAVED, NODE_W, NODE_H } from '../../js/layout.js';

const tiny = [
  { id: 'x', kind: 'forward', deps: [] },
  { id: 'y', kind: 'forward', deps: ['x'] },
  { id: 'L', kind: 'loss', deps: ['y'] },
  { id: 'gy', kind: 'backward', deps: ['L', 'y', 'x'] },
  { id: 'gx', kind: 'backward', deps: ['gy', 'x', 'nope'] },
];

test('edges are classified forward, backward and saved; unknown deps are reported', () => {
  const { edges, missing } = graphEdges(tiny);
  const cls = Object.fromEntries(edges.map((e) => [`${tiny[e.from].id}>${tiny[e.to].id}`, e.cls]));
  assert.deepEqual(cls, { 'x>y': EDGE_FORWARD, 'y>L': EDGE_FORWARD, 'L>gy': EDGE_BACKWARD, 'y>gy': EDGE_SAVED, 'x>gy': EDGE_SAVED, 'gy>gx': EDGE_BACKWARD, 'x>gx': EDGE_SAVED });
  assert.deepEqual(missing, [{ node: 'gx', dep: 'nope' }]);
  // The layout graph reverses backward edges and leaves saved ones out: everything flows to the loss.
  const pairs = layoutEdges(edges).map(([a, b]) => `${tiny[a].id}>${tiny[b].id}`).sort();
  assert.deepEqual(pairs, ['gx>gy', 'gy>L', 'x>y', 'y>L']);
});

test('chains group single-link paths, every node exactly once', () => {
  // 0 -> 1 -> 2 -> 3, 2 -> 4, 4 -> 5: chains [0,1,2], [3], [4,5]
  const { groups, group } = chains(6, [[0, 1], [1, 2], [2, 3], [2, 4], [4, 5], [4, 5]]);
  assert.deepEqual(groups, [[0, 1, 2], [3], [4, 5]]);
  assert.deepEqual([...group], [0, 0, 0, 1, 2, 2]);
  // A cycle (bad input) still puts every node in one group.
  const cyc = chains(3, [[0, 1], [1, 2], [2, 0]]);
  assert.equal(cyc.groups.flat().sort().join(), '0,1,2');
});

test('longest-path ranks', () => {
  const outs = [[1, 2], [3], [3], []];
  assert.deepEqual([...ranks(4, outs)], [0, 1, 1, 2]);
});

function overlaps(r) {
  const n = r.x.length;
  const cells = new Map();
  let count = 0;
  for (let i = 0; i < n; i++) {
    const key = `${Math.round(r.x[i] / NODE_W)},${Math.round(r.y[i] / NODE_H)}`;
    for (const j of cells.get(key) ?? []) if (Math.abs(r.x[i] - r.x[j]) < NODE_W && Math.abs(r.y[i] - r.y[j]) < NODE_H) count += 1;
    cells.set(key, [...(cells.get(key) ?? []), i]);
  }
  return count;
}

test('small graphs: U shape, forward above its gradient, no overlaps, inside the extent', () => {
  const nodes = syntheticTrainingGraph(41);
  const r = layoutGraph(nodes);
  assert.equal(r.bands, 1);
  assert.equal(overlaps(r), 0);
  for (let i = 0; i < nodes.length; i++) {
    assert.ok(r.x[i] >= 0 && r.x[i] <= r.width && r.y[i] >= 0 && r.y[i] <= r.height, `node ${i} outside`);
  }
  const at = (id) => nodes.findIndex((n) => n.id === id);
  // Forward runs left to right; the first layer's gradient sits under the first layer.
  assert.ok(r.x[at('f0')] < r.x[at('f19')]);
  assert.ok(Math.abs(r.x[at('f0')] - r.x[at('b19')]) < 2 * NODE_W, 'gradient of f0 under f0');
  assert.notEqual(r.y[at('f0')], r.y[at('b19')]);
});

test('big graphs are banded, positions are finite and do not overlap', () => {
  const nodes = syntheticTrainingGraph(2001);
  const r = layoutGraph(nodes);
  assert.equal(r.x.length, 2001);
  assert.ok(r.bands > 1, `${r.bands} bands`);
  assert.ok(r.groups < nodes.length, 'chains were compressed');
  assert.ok([...r.x, ...r.y].every(Number.isFinite));
  assert.equal(overlaps(r), 0);
  assert.ok(r.width > 0 && r.height > 0);
});

test('graphs without backward or with only isolated nodes lay out', () => {
  const r = layoutGraph([{ id: 'a', kind: 'forward', deps: [] }, { id: 'b', kind: 'forward', deps: [] }]);
  assert.equal(overlaps(r), 0);
  assert.equal(layoutGraph([]).x.length, 0);
});

test('long chains are cut into pieces of at most maxLength', () => {
  const pairs = [...Array(24).keys()].map((i) => [i, i + 1]);
  const { groups, group } = chains(25, pairs, 10);
  assert.deepEqual(groups.map((g) => g.length), [10, 10, 5]);
  assert.deepEqual(groups.flat(), [...Array(25).keys()]);
  assert.equal(group[24], 2);
});

test('a 2,000-node graph with a pure backward chain lays out wider than tall, but not a line', () => {
  const nodes = [];
  for (let i = 0; i < 1000; i++) nodes.push({ id: `f${i}`, kind: 'forward', deps: i ? [`f${i - 1}`] : [] });
  for (let j = 0; j < 1000; j++) nodes.push({ id: `b${j}`, kind: 'backward', deps: [j ? `b${j - 1}` : 'f999', `f${999 - j}`] });
  const r = layoutGraph(nodes);
  assert.ok(r.width / r.height < 12, `aspect ${r.width.toFixed(0)} x ${r.height.toFixed(0)}`);
  assert.equal(overlaps(r), 0);
});

test('layoutInWorker lays out on this thread where there are no workers', async () => {
  const { layoutInWorker } = await import('../../js/layout.js');
  const r = await layoutInWorker([{ id: 'a', kind: 'forward', deps: [] }, { id: 'b', kind: 'forward', deps: ['a'] }]);
  assert.equal(r.where, 'page');
  assert.ok(r.x[1] > r.x[0]);
});
