// Times the viewer's graph layout (web/js/layout.js) under node on the generated residual
// training graph the end-to-end test uses: wall and CPU milliseconds per run.
//
//   node layout-bench.mjs [nodes=2000] [runs=5]

import os from 'node:os';
import { layoutGraph } from '../js/layout.js';
import { makeNodeLink } from './gen-graph.mjs';

const n = Number(process.argv[2] ?? 2000);
const runs = Number(process.argv[3] ?? 5);
const g = makeNodeLink(n);
const deps = new Map(g.nodes.map((x) => [String(x.id), []]));
for (const l of g.links) deps.get(String(l.target)).push(String(l.source));
const nodes = g.nodes.map((x) => ({ id: String(x.id), kind: x.backward ? 'backward' : 'forward', deps: deps.get(String(x.id)) }));

const rows = [];
for (let i = 0; i < runs; i++) {
  const c0 = process.cpuUsage();
  const r = layoutGraph(nodes);
  const c = process.cpuUsage(c0);
  rows.push({ wall: r.ms, cpu: (c.user + c.system) / 1000, bands: r.bands, boxes: r.groups });
}
const med = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
for (const [i, r] of rows.entries()) console.log(`run ${i + 1}: wall ${r.wall.toFixed(0)} ms, cpu ${r.cpu.toFixed(0)} ms (${r.boxes} boxes in ${r.bands} bands)`);
console.log(`${n} nodes, ${g.links.length} links: median wall ${med(rows.map((r) => r.wall)).toFixed(0)} ms, median cpu ${med(rows.map((r) => r.cpu)).toFixed(0)} ms; load average ${os.loadavg().map((l) => l.toFixed(1)).join(' ')} on ${os.cpus().length} CPUs`);
