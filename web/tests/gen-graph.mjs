// A generated training graph in Checkmate's node-link format (nodes with id, name, cost_cpu,
// cost_ram, backward; links {source, target}), shaped like a residual network: `n` nodes in all.
// The end-to-end test uploads it to time the viewer's layout on a 2,000-node plan.

export function makeNodeLink(n, name = `generated_residual_${n}`) {
  const f = Math.max(2, Math.floor(n / 2));
  const b = n - f;
  const nodes = [];
  const links = [];
  const link = (source, target) => links.push({ source, target });
  for (let i = 0; i < f; i++) {
    // Activation sizes shrink by stage, as in a CNN; costs vary by layer type.
    const stage = Math.floor((4 * i) / f);
    const bytes = (64 << 20) >> stage;
    nodes.push({ id: i, name: `block${Math.floor(i / 3)}_${['conv', 'bn', 'relu'][i % 3]}`, backward: false, cost_cpu: 100 + ((i * 37) % 300), cost_ram: bytes });
    if (i > 0) link(i - 1, i);
    if (i >= 3 && i % 3 === 0) link(i - 3, i);
  }
  for (let j = 0; j < b; j++) {
    const id = f + j;
    const fi = Math.max(0, f - 1 - Math.floor((j * f) / b));
    nodes.push({ id, name: `${nodes[fi].name}_grad${j}`, backward: true, cost_cpu: 2 * nodes[fi].cost_cpu, cost_ram: nodes[fi].cost_ram });
    link(j === 0 ? f - 1 : id - 1, id);
    link(fi, id);
    if (fi > 0) link(fi - 1, id);
  }
  return { directed: true, multigraph: false, graph: { name }, nodes, links };
}
