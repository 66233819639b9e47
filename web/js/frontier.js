// The "Budget vs. overhead" chart of a plan page and the controls that compute its frontier
// (POST /v1/sweeps with the model file of this session's upload, or one picked on the page),
// shared by the plan page of an ONNX model or node-link graph and that of a captured PyTorch
// graph: what differs between them is what the chart compares the frontier with and how the
// sweep is asked for.

import { ApiError, isGraphJson, sha256Hex, sweepOf } from './api.js';
import { destroyChart, frontierSentence, paretoChart, paretoSeries, paretoText } from './charts.js';
import { h, mount } from './dom.js';
import { normalizeSweep } from './model.js';
import { loadSweep, saveSweep, session, sweepKey } from './session.js';
import { describeError, tokenBox } from './upload.js';
import { JobCancel, cancelButton } from './cancel.js';

/**
 * The frontier of the plan `planId` of the model `hash` at `dims` (the plan's own, a maximized
 * dim at the value found: the sweep is posted and kept at them).
 *
 * - `solver`: the solver the sweep is asked with (the plan's; null for a captured graph's): the
 *   sweep is kept under it and its line named after it;
 * - `doc`: the plan's figures the chart shows beside the frontier (`budgetBytes`,
 *   `predicted.overhead`, `baselines`);
 * - `history()`: the model's other plans to show, read when the chart is drawn;
 * - `file`: the file input to pick the model with when this session's upload is not this model
 *   (`accept`, `label`, `testid`, and `model(bytes, file)`, the session model it becomes);
 * - `sweepOptions()`: the sweep request's options (`wait` and the fractions included);
 * - `intro`: the line above the controls; `pick`: the label before the file input.
 *
 * Returns `chartEl` and `textEl` (the chart and its table), `tools` (the controls, to put
 * above them) and `draw()`, to call once they are in the page (the chart takes its width) and
 * whenever `history()` changes.
 */
export function frontierOf({ hash, dims = {}, solver = null, planId, doc, history = () => [], file, sweepOptions, intro, pick }) {
  const chartEl = h('div', { class: 'chart', 'data-testid': 'pareto' });
  const textEl = h('div');
  const status = h('span', { class: 'muted', role: 'status', 'aria-live': 'polite', tabindex: '-1', 'data-testid': 'sweep-status' });
  // The running sweep's Cancel button and, when the cancel fails, why (and the token field when
  // the server asks for one).
  const cancelBox = h('div', { class: 'job-actions' });
  // Kept by solver too: the frontier of this plan's solver, labelled with it.
  const key = sweepKey(hash, dims, solver);
  let sweep = sweepDoc(loadSweep(key));
  let chart = null;
  const draw = () => {
    const pts = paretoSeries({ doc, sweep: sweep ? normalizeSweep(sweep) : null, history: history(), planId, solver });
    destroyChart(chart);
    chartEl.replaceChildren();
    chart = paretoChart(chartEl, pts);
    mount(textEl, paretoText(pts));
    chartEl.dataset.frontier = String(pts.frontier.length);
  };
  // This session's upload is this model (or a file picked here, whose hash is not known yet).
  const ours = () => session.model && (!session.model.hash || session.model.hash === hash);
  const button = h('button', { type: 'button', class: 'btn small', 'data-testid': 'sweep-button', onclick: () => run() }, sweep ? 'Recompute the frontier' : 'Compute the frontier');
  // The session's model before a file was picked here: back to it when the file is refused.
  let before = null;
  const refuse = (theirs) => {
    session.model = before;
    input.value = '';
    mount(status, h('span', { class: 'warn', role: 'alert' }, `That file is not this plan's model (its hash ${theirs.slice(0, 12)}…, this plan's ${hash.slice(0, 12)}…): pick the file this plan was made from.`));
  };
  const input = h('input', {
    type: 'file',
    accept: file.accept,
    'data-testid': file.testid,
    'aria-label': file.label,
    onchange: async () => {
      const f = input.files?.[0];
      if (!f) return;
      mount(status, 'reading the file…');
      const bytes = await f.arrayBuffer();
      before = session.model;
      // ONNX bytes are hashed as they are: a wrong file is refused before any sweep. A JSON
      // graph's hash is of the server's canonical text: the sweep is posted with
      // `expect_model`, so the server refuses a wrong one (409) before it sweeps.
      const theirs = hash && !isGraphJson(bytes) ? await sha256Hex(bytes) : null;
      if (theirs && theirs !== hash) return refuse(theirs);
      session.model = { ...file.model(bytes, f), hash: theirs };
      run();
    },
  });
  /** A sweep the server answered 202 for: its Cancel button, whose cancel stops the poll. */
  function offerCancel(id, stop) {
    const job = new JobCancel('sweep', id);
    job.signal.addEventListener('abort', () => stop.abort());
    const why = h('span', { class: 'warn', role: 'alert' });
    const tokenHolder = h('div', { class: 'grow' });
    mount(cancelBox, cancelButton(job, { name: `frontier sweep ${id}`, focusAfter: status }), why, tokenHolder);
    job.on(() => {
      if (job.stopped) mount(status, `frontier: ${job.message}`);
      mount(why, job.state === 'failed' ? `The sweep could not be cancelled: ${describeError(job.error).join('; ')}` : null);
      if (job.state === 'failed' && job.error.status === 401 && !tokenHolder.firstChild) mount(tokenHolder, tokenBox({ id: 'sweep-token', open: true }));
      if (job.over) cancelBox.replaceChildren();
    });
    return job;
  }
  async function run() {
    if (!ours()) return;
    button.disabled = true;
    const t0 = performance.now();
    let job = null;
    const stop = new AbortController();
    const tick = (s) => job?.stopped || mount(status, h('span', { class: 'spinner', 'aria-hidden': 'true' }), `frontier: ${s} (${((performance.now() - t0) / 1000).toFixed(1)} s)`);
    try {
      tick('uploading');
      const opts = hash ? { ...sweepOptions(), expect_model: hash } : sweepOptions();
      const record = await sweepOf(session.model.bytes, opts, tick, { signal: stop.signal, onAccepted: (id) => (job = offerCancel(id, stop)) });
      // A sweep cancelled meanwhile is neither drawn nor kept, whatever its poll answered.
      if (job && !(await job.keep())) return;
      const theirs = record?.model?.hash;
      if (hash && theirs && theirs !== hash) return refuse(theirs);
      if (!session.model.hash) session.model.hash = theirs ?? null;
      sweep = sweepDoc(record);
      saveSweep(key, sweep);
      const pts = paretoSeries({ doc, sweep: normalizeSweep(sweep), history: [], planId, solver });
      mount(status, frontierSentence(pts.frontier.length, pts.infeasible, pts.least));
      draw();
    } catch (e) {
      if (job && !(await job.keep())) return;
      if (e instanceof ApiError && e.code === 'model_mismatch' && typeof e.details?.got === 'string') return refuse(e.details.got);
      mount(status, `frontier failed: ${describeError(e).join('; ')}`);
    } finally {
      job?.end();
      button.disabled = false;
    }
  }
  const tools = h('div', { class: 'chart-tools' }, h('p', { class: 'muted' }, intro), ours() ? button : h('label', { class: 'muted' }, pick, input), status, cancelBox);
  return { chartEl, textEl, tools, draw };
}

/** The sweep document of a sweep record (or a document kept as it is, by older pages). */
function sweepDoc(record) {
  return record?.sweep ?? record ?? null;
}
