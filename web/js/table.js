// The sortable, filterable table of tensors with their decisions.

import { h, mount } from './dom.js';
import { fmtBytes, fmtCostIn, fmtInt } from './format.js';

export const COLUMNS = [
  { key: 'name', label: 'Tensor', type: 'text' },
  { key: 'kind', label: 'Kind', type: 'text' },
  { key: 'decision', label: 'Decision', type: 'text' },
  { key: 'bytes', label: 'Size', type: 'num' },
  { key: 'cost', label: 'Cost', type: 'num' },
  { key: 'computes', label: 'Computed', type: 'num' },
  { key: 'reason', label: 'Reason', type: 'text' },
];

/** Sorts rows by column `key` (numbers numerically, missing values last), stable. */
export function sortRows(rows, key, dir) {
  const col = COLUMNS.find((c) => c.key === key) ?? COLUMNS[0];
  const sign = dir === 'desc' ? -1 : 1;
  return rows
    .map((r, i) => [r, i])
    .sort(([a, ia], [b, ib]) => {
      const va = a[col.key];
      const vb = b[col.key];
      const ma = va === null || va === undefined;
      const mb = vb === null || vb === undefined;
      if (ma || mb) return ma === mb ? ia - ib : ma ? 1 : -1;
      const c = col.type === 'num' ? va - vb : String(va).localeCompare(String(vb), undefined, { numeric: true });
      return c !== 0 ? sign * c : ia - ib;
    })
    .map(([r]) => r);
}

/** Rows whose decision is `decision` (or any) and whose name or id contains `text`. */
export function filterRows(rows, { decision, text }) {
  const t = (text ?? '').trim().toLowerCase();
  return rows.filter((r) => (!decision || r.decision === decision) && (!t || r.name.toLowerCase().includes(t) || r.id.toLowerCase().includes(t)));
}

export class TensorTable {
  /** `costUnit`: the plan's cost unit (`doc.costUnit`, "seconds" with a cost model), so that
   *  costs read "12.3 µs" rather than a bare figure. */
  constructor(root, decisions, { onSelect, costUnit = null } = {}) {
    this.root = root;
    this.rows = decisions;
    this.costUnit = costUnit;
    this.onSelect = onSelect ?? (() => {});
    this.sortKey = 'bytes';
    this.sortDir = 'desc';
    this.filter = { decision: '', text: '' };
    this.selected = null;
    this.limit = 500;
    this.build();
  }

  build() {
    const decisions = [...new Set(this.rows.map((r) => r.decision))].sort();
    this.count = h('span', { class: 'muted', 'aria-live': 'polite' });
    this.head = h('thead');
    this.body = h('tbody');
    this.more = h('div', { class: 'table-more' });
    mount(
      this.root,
      h(
        'div',
        { class: 'table-tools' },
        h('label', {}, 'Decision ', h('select', { onchange: (e) => this.setFilter({ decision: e.target.value }) }, h('option', { value: '' }, 'all'), decisions.map((d) => h('option', { value: d }, d)))),
        h('label', {}, 'Find ', h('input', { type: 'search', placeholder: 'name or id', oninput: (e) => this.setFilter({ text: e.target.value }) })),
        this.count,
      ),
      h('div', { class: 'table-scroll' }, h('table', { class: 'data tensors', 'data-testid': 'tensor-table' }, h('caption', { class: 'visually-hidden' }, 'Tensors and the plan’s decision for each; column headers sort.'), this.head, this.body)),
      this.more,
    );
    this.render();
  }

  setFilter(f) {
    Object.assign(this.filter, f);
    this.limit = 500;
    this.render();
  }

  sortBy(key) {
    if (this.sortKey === key) this.sortDir = this.sortDir === 'asc' ? 'desc' : 'asc';
    else {
      this.sortKey = key;
      this.sortDir = COLUMNS.find((c) => c.key === key)?.type === 'num' ? 'desc' : 'asc';
    }
    this.render();
  }

  /** Marks row of node `index` as selected (and scrolls it into view). */
  highlight(index) {
    this.selected = index;
    for (const tr of this.body.children) tr.classList.toggle('selected', Number(tr.dataset.index) === index);
    const tr = this.body.querySelector(`tr[data-index="${index}"]`);
    tr?.scrollIntoView({ block: 'nearest' });
  }

  render() {
    mount(
      this.head,
      h(
        'tr',
        {},
        COLUMNS.map((c) => {
          const sorted = this.sortKey === c.key;
          return h(
            'th',
            { scope: 'col', 'aria-sort': sorted ? (this.sortDir === 'asc' ? 'ascending' : 'descending') : 'none', class: c.type === 'num' ? 'num' : '' },
            h('button', { type: 'button', class: 'sort', onclick: () => this.sortBy(c.key) }, c.label, h('span', { class: 'arrow', 'aria-hidden': 'true' }, sorted ? (this.sortDir === 'asc' ? ' ▲' : ' ▼') : '')),
          );
        }),
      ),
    );
    const rows = sortRows(filterRows(this.rows, this.filter), this.sortKey, this.sortDir);
    const shown = rows.slice(0, this.limit);
    mount(
      this.body,
      shown.map((r) =>
        h(
          'tr',
          { dataset: { index: String(r.index) }, class: r.index === this.selected ? 'selected' : '' },
          h('td', {}, h('button', { type: 'button', class: 'link', title: `Show ${r.name} in the graph`, onclick: () => this.onSelect(r.index) }, r.name)),
          h('td', {}, r.kind),
          h('td', {}, h('span', { class: `badge decision-${r.decision}` }, r.decision)),
          h('td', { class: 'num', title: r.bytes === null ? '' : `${fmtInt(r.bytes)} B` }, fmtBytes(r.bytes)),
          h('td', { class: 'num' }, fmtCostIn(r.cost, this.costUnit)),
          h('td', { class: 'num' }, r.computes === null ? '—' : `${r.computes}×`),
          h('td', { class: 'reason' }, r.reason),
        ),
      ),
    );
    this.count.textContent = `${rows.length} of ${this.rows.length} tensors`;
    mount(
      this.more,
      rows.length > shown.length
        ? h('button', { type: 'button', class: 'btn small', onclick: () => { this.limit += 1000; this.render(); } }, `Show ${Math.min(1000, rows.length - shown.length)} more`)
        : null,
    );
  }
}
