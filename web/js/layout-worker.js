// Runs the graph layout off the main thread: the page stays responsive while dagre works.
import { layoutGraph } from './layout.js';

self.onmessage = (ev) => {
  try {
    const r = { ...layoutGraph(ev.data.nodes), where: 'worker' };
    self.postMessage({ ok: true, layout: r }, [r.x.buffer, r.y.buffer]);
  } catch (e) {
    self.postMessage({ ok: false, error: String(e?.message ?? e) });
  }
};
