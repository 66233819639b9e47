// The plan's graph on a canvas: dagre layout (layout.js), decisions as colours, zoom and pan
// (wheel, drag, keyboard), a click shows the tensor's size, cost, decision and reason.

import { h, mount } from './dom.js';
import { fmtBytes, fmtBytesExact, fmtCostIn } from './format.js';
import { layoutGraph, NODE_W, NODE_H, EDGE_FORWARD, EDGE_BACKWARD, EDGE_SAVED } from './layout.js';

/** Fill colours per decision (text on them is white, contrast ≥ 4.5:1 except "transient"). */
export const DECISION_COLORS = {
  keep: '#1d4ed8',
  recompute: '#c2410c',
  transient: '#cbd5e1',
  backward: '#6d28d9',
  skipped: '#ffffff',
  unknown: '#64748b',
};

export const DECISION_LABELS = {
  keep: 'kept (stored for backward)',
  recompute: 'recomputed',
  transient: 'transient (freed in forward)',
  backward: 'backward',
  skipped: 'skipped (not needed)',
};

const EDGE_STYLE = {
  [EDGE_FORWARD]: { color: 'rgba(71, 85, 105, 0.55)', dash: [] },
  [EDGE_BACKWARD]: { color: 'rgba(109, 40, 217, 0.45)', dash: [] },
  [EDGE_SAVED]: { color: 'rgba(29, 78, 216, 0.22)', dash: [4, 4] },
};

export class GraphView {
  /**
   * @param {HTMLElement} root where the view goes
   * @param {Array} decisions normalized decisions (model.js)
   * @param {{onSelect?: (index: number|null) => void, layout?: object}} opts `layout`: the
   *   result of layoutGraph / layoutInWorker for these decisions (computed here when absent)
   */
  constructor(root, decisions, opts = {}) {
    this.root = root;
    this.nodes = decisions;
    this.onSelect = opts.onSelect ?? (() => {});
    // The plan's cost unit (`doc.costUnit`): a node's cost in its unit.
    this.costUnit = opts.costUnit ?? null;
    this.selected = null;
    this.showSaved = true;
    this.k = 1;
    this.tx = 0;
    this.ty = 0;
    this.layout = opts.layout ?? layoutGraph(decisions);
    this.users = decisions.map(() => []);
    this.depsIdx = decisions.map(() => []);
    for (const e of this.layout.edges) {
      this.users[e.from].push(e.to);
      this.depsIdx[e.to].push(e.from);
    }
    this.build();
  }

  build() {
    const btn = (label, title, fn) => h('button', { type: 'button', class: 'btn small', title, 'aria-label': title, onclick: fn }, label);
    this.savedToggle = h('input', {
      type: 'checkbox',
      id: 'saved-edges',
      checked: this.showSaved,
      onchange: () => {
        this.showSaved = this.savedToggle.checked;
        this.draw();
      },
    });
    const legend = h(
      'ul',
      { class: 'legend', 'aria-label': 'Node colours' },
      Object.entries(DECISION_LABELS).map(([k, label]) =>
        h('li', {}, h('span', { class: `swatch swatch-${k}`, style: { background: DECISION_COLORS[k] } }), label),
      ),
      h('li', {}, h('span', { class: 'swatch swatch-loss' }), 'loss'),
    );
    this.canvas = h('canvas', {
      class: 'graph-canvas',
      tabindex: '0',
      role: 'img',
      'aria-label': `Graph of ${this.nodes.length} nodes laid out left to right (forward on top, backward below). Arrow keys pan, + and - zoom, 0 fits; the tensor table below lists the same nodes.`,
      dataset: { nodes: String(this.nodes.length) },
    });
    this.details = h('aside', { class: 'node-details', 'aria-live': 'polite' }, h('p', { class: 'muted' }, 'Click a node to see its tensor.'));
    this.tip = h('div', { class: 'graph-tip', hidden: true, 'aria-hidden': 'true' });
    this.wrap = h('div', { class: 'graph-wrap' }, this.canvas, this.tip);
    mount(
      this.root,
      h(
        'div',
        { class: 'graph-toolbar' },
        btn('+', 'Zoom in', () => this.zoomBy(1.4)),
        btn('−', 'Zoom out', () => this.zoomBy(1 / 1.4)),
        btn('Fit', 'Fit the whole graph', () => this.fit()),
        h('label', { class: 'check' }, this.savedToggle, ' saved-tensor edges'),
        legend,
      ),
      h('div', { class: 'graph-body' }, this.wrap, this.details),
    );
    this.attach();
    // As tall as the graph needs at a width-filling zoom, within bounds.
    const width = this.wrap.clientWidth || 800;
    const k = Math.min(width / Math.max(this.layout.width, 1), 2);
    this.wrap.style.height = `${Math.round(Math.max(260, Math.min(560, this.layout.height * k + 40)))}px`;
    let frame = 0;
    this.resizeObserver = new ResizeObserver(() => {
      cancelAnimationFrame(frame);
      frame = requestAnimationFrame(() => this.resize());
    });
    this.resizeObserver.observe(this.wrap);
    this.resize();
    this.fit();
  }

  resize() {
    const r = this.wrap.getBoundingClientRect();
    const dpr = window.devicePixelRatio || 1;
    this.cw = Math.max(1, r.width);
    this.ch = Math.max(1, r.height);
    this.canvas.width = Math.round(this.cw * dpr);
    this.canvas.height = Math.round(this.ch * dpr);
    this.canvas.style.width = `${this.cw}px`;
    this.canvas.style.height = `${this.ch}px`;
    this.dpr = dpr;
    this.draw();
  }

  fit() {
    const { width, height } = this.layout;
    const k = Math.min(this.cw / Math.max(width, 1), this.ch / Math.max(height, 1));
    this.minK = Math.min(k, 1) / 4;
    this.k = Math.min(k, 2);
    this.tx = (this.cw - width * this.k) / 2;
    this.ty = (this.ch - height * this.k) / 2;
    this.draw();
  }

  zoomBy(f, cx = this.cw / 2, cy = this.ch / 2) {
    const k = Math.max(this.minK ?? 0.01, Math.min(8, this.k * f));
    const wx = (cx - this.tx) / this.k;
    const wy = (cy - this.ty) / this.k;
    this.k = k;
    this.tx = cx - wx * k;
    this.ty = cy - wy * k;
    this.draw();
  }

  panBy(dx, dy) {
    this.tx += dx;
    this.ty += dy;
    this.draw();
  }

  /** Centres the view on node `i`. */
  centerOn(i) {
    if (this.k < 1) this.k = 1;
    this.tx = this.cw / 2 - this.layout.x[i] * this.k;
    this.ty = this.ch / 2 - this.layout.y[i] * this.k;
    this.draw();
  }

  hit(sx, sy) {
    const wx = (sx - this.tx) / this.k;
    const wy = (sy - this.ty) / this.k;
    const { x, y } = this.layout;
    const pad = Math.max(0, 4 / this.k);
    for (let i = 0; i < this.nodes.length; i++) {
      if (Math.abs(wx - x[i]) <= NODE_W / 2 + pad && Math.abs(wy - y[i]) <= NODE_H / 2 + pad) return i;
    }
    return null;
  }

  attach() {
    const c = this.canvas;
    let drag = null;
    c.addEventListener('wheel', (ev) => {
      ev.preventDefault();
      const r = c.getBoundingClientRect();
      this.zoomBy(Math.exp(-ev.deltaY * 0.0015), ev.clientX - r.left, ev.clientY - r.top);
    }, { passive: false });
    c.addEventListener('pointerdown', (ev) => {
      c.setPointerCapture(ev.pointerId);
      drag = { x: ev.clientX, y: ev.clientY, moved: 0 };
    });
    c.addEventListener('pointermove', (ev) => {
      if (!drag) {
        this.hover(ev);
        return;
      }
      this.tip.hidden = true;
      const dx = ev.clientX - drag.x;
      const dy = ev.clientY - drag.y;
      drag.moved += Math.abs(dx) + Math.abs(dy);
      drag.x = ev.clientX;
      drag.y = ev.clientY;
      this.panBy(dx, dy);
    });
    c.addEventListener('pointerleave', () => {
      this.tip.hidden = true;
    });
    c.addEventListener('pointerup', (ev) => {
      const d = drag;
      drag = null;
      if (d && d.moved < 5) {
        const r = c.getBoundingClientRect();
        this.select(this.hit(ev.clientX - r.left, ev.clientY - r.top));
      }
    });
    c.addEventListener('keydown', (ev) => {
      const step = 60;
      const keys = {
        ArrowLeft: () => this.panBy(step, 0),
        ArrowRight: () => this.panBy(-step, 0),
        ArrowUp: () => this.panBy(0, step),
        ArrowDown: () => this.panBy(0, -step),
        '+': () => this.zoomBy(1.4),
        '=': () => this.zoomBy(1.4),
        '-': () => this.zoomBy(1 / 1.4),
        0: () => this.fit(),
        Escape: () => this.select(null),
      };
      const f = keys[ev.key];
      if (f) {
        ev.preventDefault();
        f();
      }
    });
  }

  /** A tooltip with the name, decision and size of the node under the pointer. */
  hover(ev) {
    const r = this.canvas.getBoundingClientRect();
    const sx = ev.clientX - r.left;
    const sy = ev.clientY - r.top;
    const i = this.hit(sx, sy);
    this.canvas.style.cursor = i === null ? '' : 'pointer';
    if (i === null) {
      this.tip.hidden = true;
      return;
    }
    const d = this.nodes[i];
    mount(this.tip, h('strong', {}, d.name), h('br'), `${d.decision} · ${fmtBytes(d.bytes)}`);
    this.tip.hidden = false;
    const left = Math.min(sx + 14, this.cw - this.tip.offsetWidth - 4);
    this.tip.style.left = `${Math.max(4, left)}px`;
    this.tip.style.top = `${Math.max(4, sy - this.tip.offsetHeight - 10)}px`;
  }

  /** Selects node `i` (or nothing), shows its details and tells the owner. */
  select(i, { center = false, notify = true } = {}) {
    this.selected = i;
    if (i !== null && center) this.centerOn(i);
    else this.draw();
    this.showDetails(i);
    if (notify) this.onSelect(i);
  }

  showDetails(i) {
    if (i === null || i === undefined) {
      mount(this.details, h('p', { class: 'muted' }, 'Click a node to see its tensor.'));
      return;
    }
    const d = this.nodes[i];
    const jump = (j) => h('button', { type: 'button', class: 'link', onclick: () => this.select(j, { center: true }) }, this.nodes[j].name);
    const list = (idx) => (idx.length === 0 ? h('span', { class: 'muted' }, 'none') : h('span', { class: 'chips' }, idx.slice(0, 40).map(jump), idx.length > 40 ? ` … ${idx.length - 40} more` : ''));
    mount(
      this.details,
      h('h3', { class: 'node-name', title: d.name }, d.name),
      h(
        'dl',
        {},
        h('dt', {}, 'Decision'),
        h('dd', {}, h('span', { class: `badge decision-${d.decision}` }, d.decision)),
        h('dt', {}, 'Size'),
        h('dd', { 'data-testid': 'node-bytes' }, `${fmtBytes(d.bytes)} (${fmtBytesExact(d.bytes)})`),
        h('dt', {}, 'Cost'),
        h('dd', { 'data-testid': 'node-cost' }, fmtCostIn(d.cost, this.costUnit)),
        h('dt', {}, 'Computed'),
        h('dd', {}, d.computes === null ? '—' : `${d.computes}×`),
        h('dt', {}, 'Kind'),
        h('dd', {}, d.kind),
        h('dt', {}, 'Id'),
        h('dd', {}, h('code', {}, d.id)),
      ),
      h('p', { class: 'reason' }, d.reason || 'No reason given.'),
      h('div', { class: 'rel' }, h('strong', {}, 'Reads: '), list(this.depsIdx[i])),
      h('div', { class: 'rel' }, h('strong', {}, 'Read by: '), list(this.users[i])),
    );
  }

  draw() {
    if (!this.canvas || !this.cw) return;
    const ctx = this.canvas.getContext('2d');
    const { x, y, edges } = this.layout;
    const { k, tx, ty, dpr } = this;
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.fillStyle = '#f8fafc';
    ctx.fillRect(0, 0, this.canvas.width, this.canvas.height);
    ctx.setTransform(dpr * k, 0, 0, dpr * k, dpr * tx, dpr * ty);
    // Visible world rectangle, for culling.
    const x0 = -tx / k - NODE_W;
    const y0 = -ty / k - NODE_H;
    const x1 = (this.cw - tx) / k + NODE_W;
    const y1 = (this.ch - ty) / k + NODE_H;
    const visible = (i) => x[i] >= x0 && x[i] <= x1 && y[i] >= y0 && y[i] <= y1;
    const edgeVisible = (a, b) =>
      !(Math.max(x[a], x[b]) < x0 || Math.min(x[a], x[b]) > x1 || Math.max(y[a], y[b]) < y0 || Math.min(y[a], y[b]) > y1);
    const sel = this.selected;
    ctx.lineWidth = Math.max(0.6, 1 / k);
    for (const cls of [EDGE_SAVED, EDGE_FORWARD, EDGE_BACKWARD]) {
      if (cls === EDGE_SAVED && !this.showSaved) continue;
      const style = EDGE_STYLE[cls];
      ctx.strokeStyle = style.color;
      ctx.setLineDash(style.dash.map((v) => v / Math.max(k, 0.25)));
      ctx.beginPath();
      for (const e of edges) {
        if (e.cls !== cls || !edgeVisible(e.from, e.to)) continue;
        this.edgePath(ctx, e.from, e.to);
      }
      ctx.stroke();
    }
    ctx.setLineDash([]);
    if (sel !== null) {
      ctx.strokeStyle = '#0f172a';
      ctx.lineWidth = Math.max(1.5, 2 / k);
      ctx.beginPath();
      for (const e of edges) if (e.from === sel || e.to === sel) this.edgePath(ctx, e.from, e.to);
      ctx.stroke();
    }
    // Nodes.
    let drawn = 0;
    ctx.lineWidth = Math.max(0.8, 1 / k);
    for (let i = 0; i < this.nodes.length; i++) {
      if (!visible(i)) continue;
      drawn += 1;
      const d = this.nodes[i];
      const color = DECISION_COLORS[d.decision] ?? DECISION_COLORS.unknown;
      ctx.fillStyle = color;
      ctx.beginPath();
      ctx.roundRect(x[i] - NODE_W / 2, y[i] - NODE_H / 2, NODE_W, NODE_H, 4);
      ctx.fill();
      if (d.decision === 'skipped') ctx.setLineDash([3, 2]);
      ctx.strokeStyle = d.kind === 'loss' ? '#b91c1c' : d.decision === 'transient' || d.decision === 'skipped' ? '#64748b' : 'rgba(15,23,42,0.35)';
      if (d.kind === 'loss') ctx.lineWidth = Math.max(2.5, 2.5 / k);
      ctx.stroke();
      ctx.lineWidth = Math.max(0.8, 1 / k);
      ctx.setLineDash([]);
    }
    if (sel !== null) {
      ctx.strokeStyle = '#f59e0b';
      ctx.lineWidth = Math.max(3, 3 / k);
      ctx.beginPath();
      ctx.roundRect(x[sel] - NODE_W / 2 - 3, y[sel] - NODE_H / 2 - 3, NODE_W + 6, NODE_H + 6, 6);
      ctx.stroke();
    }
    // Labels once nodes are big enough on screen.
    if (k >= 1.1) {
      ctx.fillStyle = '#0f172a';
      ctx.font = `${11 / Math.min(k, 2)}px system-ui, sans-serif`;
      ctx.textAlign = 'center';
      ctx.textBaseline = 'top';
      const maxChars = Math.max(6, Math.floor((NODE_W + 14) * Math.min(k, 2) / 6));
      for (let i = 0; i < this.nodes.length; i++) {
        if (!visible(i)) continue;
        const name = this.nodes[i].name;
        ctx.fillText(name.length > maxChars ? `${name.slice(0, maxChars - 1)}…` : name, x[i], y[i] + NODE_H / 2 + 2);
      }
    }
    this.canvas.dataset.drawn = String(drawn);
    this.canvas.dataset.zoom = k.toFixed(4);
  }

  edgePath(ctx, a, b) {
    const { x, y } = this.layout;
    const dx = x[b] - x[a];
    if (Math.abs(dx) < NODE_W) {
      // Roughly vertical: from the bottom/top edge of one box to the other.
      const down = y[b] > y[a];
      const sy = y[a] + (down ? NODE_H / 2 : -NODE_H / 2);
      const ey = y[b] + (down ? -NODE_H / 2 : NODE_H / 2);
      const my = (sy + ey) / 2;
      ctx.moveTo(x[a], sy);
      ctx.bezierCurveTo(x[a], my, x[b], my, x[b], ey);
      return;
    }
    const right = dx > 0;
    const sx = x[a] + (right ? NODE_W / 2 : -NODE_W / 2);
    const ex = x[b] + (right ? -NODE_W / 2 : NODE_W / 2);
    const mx = (sx + ex) / 2;
    ctx.moveTo(sx, y[a]);
    ctx.bezierCurveTo(mx, y[a], mx, y[b], ex, y[b]);
  }

  destroy() {
    this.resizeObserver?.disconnect();
  }
}
