// DAG layout of a training graph with dagre.
//
// A training graph is a forward pass, a loss and a backward pass whose nodes read forward
// values ("saved tensors"). Laid out as is, every saved-tensor edge spans hundreds of ranks and
// a layered layout drowns in dummy nodes. The engineer's picture is a U instead: forward left
// to right on top, backward right to left below it, each gradient under the value it belongs
// to. So the layout graph keeps forward edges, reverses edges inside the backward pass (and from
// the loss into it), and leaves saved-tensor edges out (they are drawn, not laid out). On big
// graphs, maximal chains (one way in, one way out) are laid out as one wide node and spread
// evenly inside it afterwards: dagre's cost grows with the number of ranks, chains are most of
// them.

import dagre from '../vendor/dagre.esm.js';

export const NODE_W = 30;
export const NODE_H = 18;
const GAP = 16; // between nodes of a compressed chain (and dagre's ranksep)

/** Edge classes, for drawing. */
export const EDGE_FORWARD = 0;
export const EDGE_BACKWARD = 1;
export const EDGE_SAVED = 2;

/**
 * Edges of the graph given nodes `{id, kind, deps}`: `{from, to, cls}` with indices, plus the
 * deps that name no node (`missing`: [{node, dep}]).
 */
export function graphEdges(nodes) {
  const index = new Map(nodes.map((n, i) => [n.id, i]));
  const edges = [];
  const missing = [];
  nodes.forEach((n, to) => {
    for (const dep of n.deps) {
      const from = index.get(dep);
      if (from === undefined) {
        missing.push({ node: n.id, dep });
        continue;
      }
      if (from === to) continue;
      const fk = nodes[from].kind;
      let cls = EDGE_FORWARD;
      if (n.kind === 'backward') cls = fk === 'backward' || fk === 'loss' ? EDGE_BACKWARD : EDGE_SAVED;
      edges.push({ from, to, cls });
    }
  });
  return { edges, missing };
}

/** The layout graph's edges as [source, target] index pairs (see the module comment). */
export function layoutEdges(edges) {
  const out = [];
  for (const e of edges) {
    if (e.cls === EDGE_FORWARD) out.push([e.from, e.to]);
    else if (e.cls === EDGE_BACKWARD) out.push([e.to, e.from]);
  }
  return out;
}

/**
 * Maximal chains of the layout graph: groups of node indices, each a path u1 -> u2 -> ... where
 * every inner link is the only way out of its source and the only way into its target, cut
 * into pieces of at most `maxLength`. Every node is in exactly one group.
 */
export function chains(n, pairs, maxLength = Infinity) {
  const outs = Array.from({ length: n }, () => []);
  const ins = Array.from({ length: n }, () => []);
  const seen = new Set();
  for (const [a, b] of pairs) {
    const key = a * n + b;
    if (seen.has(key)) continue;
    seen.add(key);
    outs[a].push(b);
    ins[b].push(a);
  }
  const linkedFromPrev = (v) => ins[v].length === 1 && outs[ins[v][0]].length === 1;
  const groups = [];
  const group = new Int32Array(n).fill(-1);
  for (let v = 0; v < n; v++) {
    if (group[v] !== -1 || linkedFromPrev(v)) continue;
    let g = [v];
    group[v] = groups.length;
    let cur = v;
    while (outs[cur].length === 1) {
      const next = outs[cur][0];
      if (ins[next].length !== 1 || group[next] !== -1) break;
      if (g.length >= maxLength) {
        // A long chain is cut into pieces, so that no box is wider than a screen.
        groups.push(g);
        g = [];
      }
      g.push(next);
      group[next] = groups.length;
      cur = next;
    }
    groups.push(g);
  }
  // Nodes on a cycle of single links (impossible in a DAG, possible in bad input) start groups here.
  for (let v = 0; v < n; v++) {
    if (group[v] === -1) {
      group[v] = groups.length;
      groups.push([v]);
    }
  }
  return { groups, group };
}

/** Longest-path ranks of a DAG given as adjacency lists (nodes on a cycle get rank 0). */
export function ranks(n, outs) {
  const indeg = new Int32Array(n);
  for (const list of outs) for (const b of list) indeg[b] += 1;
  const rank = new Int32Array(n);
  const queue = [];
  for (let v = 0; v < n; v++) if (indeg[v] === 0) queue.push(v);
  for (let head = 0; head < queue.length; head++) {
    const v = queue[head];
    for (const b of outs[v]) {
      if (rank[v] + 1 > rank[b]) rank[b] = rank[v] + 1;
      indeg[b] -= 1;
      if (indeg[b] === 0) queue.push(b);
    }
  }
  return rank;
}

/** Runs dagre on boxes `sizes` ([w, h]) with edges between them; returns centres and extent. */
function dagreBoxes(sizes, links) {
  const g = new dagre.graphlib.Graph({ multigraph: false });
  g.setGraph({ rankdir: 'LR', nodesep: 14, ranksep: GAP * 2, edgesep: 6, marginx: 0, marginy: 0 });
  g.setDefaultEdgeLabel(() => ({}));
  sizes.forEach(([w, h], i) => g.setNode(String(i), { width: w, height: h }));
  for (const [a, b] of links) if (a !== b) g.setEdge(String(a), String(b));
  dagre.layout(g);
  const cx = new Float64Array(sizes.length);
  const cy = new Float64Array(sizes.length);
  sizes.forEach((_, i) => {
    const box = g.node(String(i));
    cx[i] = box.x;
    cy[i] = box.y;
  });
  const graph = g.graph();
  return { cx, cy, width: graph.width ?? 0, height: graph.height ?? 0 };
}

/** Longest chain laid out as one box. */
const MAX_CHAIN = 10;
/** Default: graphs bigger than this are compressed (chains) and laid out in bands. */
export const BIG_GRAPH = 400;
/** Boxes (chains) per band of a big graph. */
/** Limits of one band of a big graph: boxes (chains) and width in layout pixels. */
export const BAND = { boxes: 120, width: 2400 };

/**
 * Lays out nodes `{id, kind, deps}`. Returns {x, y (Float64Array centres), width, height,
 * edges, missing, compressed, groups, bands, ms}.
 *
 * Graphs over `BIG_GRAPH` nodes: chains become boxes (of at most 10 nodes), the boxes are cut
 * by rank into bands (at most 120 boxes and 2,400 px each), dagre lays out each band, and the
 * bands are placed left to right in rows (edges between bands are drawn, not laid out). dagre's
 * ordering and positioning grow with ranks times nodes; bands keep that product small
 * (docs/viewer.md has the measurements).
 */
export function layoutGraph(nodes, { big } = {}) {
  const t0 = performance.now();
  const n = nodes.length;
  const { edges, missing } = graphEdges(nodes);
  const pairs = layoutEdges(edges);
  const isBig = big ?? n > BIG_GRAPH;
  const { groups, group } = isBig
    ? chains(n, pairs, MAX_CHAIN)
    : { groups: nodes.map((_, i) => [i]), group: Int32Array.from(nodes.keys()) };
  const m = groups.length;
  const sizes = groups.map((members) => [members.length * NODE_W + (members.length - 1) * GAP, NODE_H]);
  const glinks = [];
  const seen = new Set();
  for (const [a, b] of pairs) {
    const ga = group[a];
    const gb = group[b];
    if (ga === gb || seen.has(ga * m + gb)) continue;
    seen.add(ga * m + gb);
    glinks.push([ga, gb]);
  }

  // Bands: consecutive ranks holding at most BAND.boxes boxes and BAND.width pixels (one band
  // for small graphs).
  const band = new Int32Array(m);
  let bands = 1;
  if (isBig && m > BAND.boxes) {
    // Ranks of nodes (not boxes): a forward value and its gradient share a rank in the U, so
    // they land in the same band however their chains were cut.
    const outs = Array.from({ length: n }, () => []);
    for (const [a, b] of pairs) outs[a].push(b);
    const rank = ranks(n, outs);
    const maxRank = rank.reduce((a, b) => Math.max(a, b), 0);
    const startsAt = new Int32Array(maxRank + 1);
    for (const list of groups) startsAt[rank[list[0]]] += 1;
    const bandOfRank = new Int32Array(maxRank + 1);
    const perRank = NODE_W + GAP;
    let count = 0;
    let width = 0;
    let current = 0;
    for (let r = 0; r <= maxRank; r++) {
      if (count > 0 && (count + startsAt[r] > BAND.boxes || width + perRank > BAND.width)) {
        current += 1;
        count = 0;
        width = 0;
      }
      bandOfRank[r] = current;
      count += startsAt[r];
      width += perRank;
    }
    bands = current + 1;
    groups.forEach((list, gi) => {
      band[gi] = bandOfRank[rank[list[0]]];
    });
  }

  const members = Array.from({ length: bands }, () => []);
  const local = new Int32Array(m);
  for (let i = 0; i < m; i++) {
    local[i] = members[band[i]].length;
    members[band[i]].push(i);
  }
  const bandLinks = Array.from({ length: bands }, () => []);
  for (const [a, b] of glinks) if (band[a] === band[b]) bandLinks[band[a]].push([local[a], local[b]]);
  const laid = members.map((list, bi) => dagreBoxes(list.map((i) => sizes[i]), bandLinks[bi]));

  // Rows of bands: wide enough for a landscape overview.
  const MARGIN = 20;
  const BAND_GAP = 60;
  const totalW = laid.reduce((s, l) => s + l.width + BAND_GAP, 0);
  const maxH = laid.reduce((s, l) => Math.max(s, l.height), 0);
  const rowWidth = Math.max(...laid.map((l) => l.width), Math.sqrt(totalW * (maxH + BAND_GAP) * 2.5));
  const offX = new Float64Array(bands);
  const offY = new Float64Array(bands);
  let cursorX = 0;
  let rowTop = 0;
  let rowH = 0;
  laid.forEach((l, bi) => {
    if (cursorX > 0 && cursorX + l.width > rowWidth) {
      cursorX = 0;
      rowTop += rowH + BAND_GAP;
      rowH = 0;
    }
    offX[bi] = cursorX;
    offY[bi] = rowTop;
    cursorX += l.width + BAND_GAP;
    rowH = Math.max(rowH, l.height);
  });
  // Bands of one row share its vertical centre.
  const rowHeight = new Map();
  laid.forEach((l, bi) => rowHeight.set(offY[bi], Math.max(rowHeight.get(offY[bi]) ?? 0, l.height)));
  laid.forEach((l, bi) => {
    offY[bi] += ((rowHeight.get(offY[bi]) ?? l.height) - l.height) / 2;
  });

  const x = new Float64Array(n);
  const y = new Float64Array(n);
  let width = 0;
  let height = 0;
  groups.forEach((list, gi) => {
    const bi = band[gi];
    const l = laid[bi];
    const w = sizes[gi][0];
    const left = offX[bi] + l.cx[local[gi]] - w / 2 + MARGIN;
    const cy = offY[bi] + l.cy[local[gi]] + MARGIN;
    list.forEach((v, k) => {
      x[v] = left + NODE_W / 2 + k * (NODE_W + GAP);
      y[v] = cy;
    });
    width = Math.max(width, left + w + MARGIN);
    height = Math.max(height, cy + NODE_H / 2 + MARGIN);
  });
  return { x, y, width, height, edges, missing, compressed: isBig, groups: m, bands, ms: performance.now() - t0 };
}

/**
 * A synthetic training graph of about `n` nodes shaped like a residual network: blocks of three
 * layers with a skip connection, a loss, and a backward pass where each gradient reads its
 * forward value and the next gradient. For the layout benchmark and the tests.
 */
export function syntheticTrainingGraph(n) {
  const f = Math.max(1, Math.floor((n - 1) / 2));
  const nodes = [];
  for (let i = 0; i < f; i++) {
    const deps = i === 0 ? [] : [`f${i - 1}`];
    if (i >= 3 && i % 3 === 0) deps.push(`f${i - 3}`);
    nodes.push({ id: `f${i}`, name: `layer${i}`, kind: 'forward', deps });
  }
  nodes.push({ id: 'loss', name: 'loss', kind: 'loss', deps: [`f${f - 1}`] });
  for (let j = 0; j < f; j++) {
    const fi = f - 1 - j;
    const deps = [j === 0 ? 'loss' : `b${j - 1}`, `f${fi}`];
    if (fi > 0) deps.push(`f${fi - 1}`);
    if (j >= 3 && j % 3 === 0) deps.push(`b${j - 3}`);
    nodes.push({ id: `b${j}`, name: `layer${fi}_grad`, kind: 'backward', deps });
  }
  return nodes;
}

/**
 * The layout computed in a module worker (falls back to this thread where workers are not
 * available). Resolves with what `layoutGraph` returns plus `where` ('worker' or 'page').
 */
export function layoutInWorker(nodes) {
  const plain = nodes.map((n) => ({ id: n.id, kind: n.kind, deps: n.deps }));
  const here = () => ({ ...layoutGraph(plain), where: 'page' });
  if (typeof Worker === 'undefined') return Promise.resolve(here());
  return new Promise((resolve) => {
    let worker;
    const fallback = () => {
      worker?.terminate();
      resolve(here());
    };
    try {
      worker = new Worker(new URL('./layout-worker.js', import.meta.url), { type: 'module' });
    } catch {
      fallback();
      return;
    }
    worker.onmessage = (ev) => {
      worker.terminate();
      if (ev.data?.ok) resolve(ev.data.layout);
      else fallback();
    };
    worker.onerror = (ev) => {
      ev.preventDefault();
      fallback();
    };
    worker.postMessage({ nodes: plain });
  });
}
