// The upload view: pick a model, bind its symbolic dims, choose a budget between the minimum
// feasible one and the store-all peak, choose a solver, plan, and follow the job until it is done.

import { ApiError, postPlan, poll, isGraphJson, isJson, isTorchGraph, listPlans, setToken } from './api.js';
import { h, mount } from './dom.js';
import { fmtBudget, fmtBytes, fmtBytesExact, fmtOverhead, fmtRatio, fmtTime, isNum } from './format.js';
import { normalizeRecord, normalizeHistory, isProbe, probesLabel } from './model.js';
import { fillFigures } from './figures.js';
import { navigate, planUrl, historyUrl } from './router.js';
import { rememberJob, session } from './session.js';
import { JobCancel, cancelButton, unlessCancelled } from './cancel.js';

export const SOLVERS = [
  ['auto', 'auto (best available)'],
  ['ilp', 'ilp (Checkmate MILP)'],
  ['dp', 'dp (exact chain DP)'],
  ['chen-sqrt', 'chen-sqrt (√n segments)'],
  ['chen-greedy', 'chen-greedy'],
  ['every-k', 'every-k'],
  ['revolve', 'revolve'],
  ['store-all', 'store-all (no recomputation)'],
];

/** Budget in bytes at slider position `permille` (0..1000) between min and max. */
export function sliderBytes(min, max, permille) {
  if (!(max > min)) return Math.round(max);
  return Math.round(min + ((max - min) * permille) / 1000);
}

/** Describes an API error for people, with its details (unsupported ops, minimum budget). */
export function describeError(e) {
  if (!(e instanceof ApiError)) return [String(e?.message ?? e)];
  const d = e.details ?? {};
  const unsupported = Array.isArray(d.unsupported) ? d.unsupported : [];
  // The server's message names every unsupported node too: its head is enough above the list.
  const message = unsupported.length ? e.message.split(': ')[0] : e.message;
  const lines = [`${message} (${e.code})`];
  for (const u of unsupported.slice(0, 20)) lines.push(`unsupported: ${u.node ?? '?'} — ${u.op_type ?? '?'}${u.domain ? ` (${u.domain})` : ''}${u.reason ? `: ${u.reason}` : ''}`);
  if (unsupported.length > 20) lines.push(`… and ${unsupported.length - 20} more`);
  if (isNum(d.min_feasible_budget_bytes)) lines.push(`minimum feasible budget: ${fmtBytes(d.min_feasible_budget_bytes)} (${fmtBytesExact(d.min_feasible_budget_bytes)})`);
  if (e.code === 'payload_too_large') lines.push(bodyLimitText(e));
  if (e.status === 401) lines.push('This server requires a token: set it below.');
  return lines;
}

/**
 * What a 413 says of the server's limit: `details.limit_bytes` where the error has it, else the
 * figure its message gives ("over this server's limit of 1048576 bytes"); only an error that
 * says neither gets the default named.
 */
export function bodyLimitText(e) {
  const d = e.details ?? {};
  let limit = [d.limit_bytes, d.limit, d.body_limit].find(isNum);
  const said = /limit of ([0-9][0-9,]*) ?(?:bytes|B)\b/i.exec(e.message ?? '');
  if (!isNum(limit) && said) limit = Number(said[1].replace(/,/g, ''));
  if (isNum(limit)) return `The server takes models up to ${fmtBytes(limit)} (${fmtBytesExact(limit)}).`;
  if (/[0-9]/.test(e.message ?? '')) return 'The file is larger than the server takes (its --body-limit, as the message says).';
  return 'The file is larger than the server takes (its --body-limit, 512 MiB unless set otherwise; the error does not say).';
}

/**
 * The dims typed on the form (`pairs`: [{name, text}]) as the request sends them: each value the
 * digits typed (no round trip through Number, which writes 1e21 as "1e+21" and rounds 2^64),
 * an empty field left out (the server names it again). Answers {dims, errors}: one message per
 * dim that is not a whole number of at least 1, naming it.
 */
export function readDims(pairs) {
  const dims = {};
  const errors = [];
  for (const { name, text } of pairs) {
    const t = String(text ?? '').trim();
    if (t === '') continue;
    if (/^[0-9]+$/.test(t)) {
      if (/^0+$/.test(t)) errors.push({ name, message: `${name} must be at least 1 (got ${t}).` });
      else dims[name] = t;
      continue;
    }
    const n = Number(t);
    if (!Number.isFinite(n)) errors.push({ name, message: `${name} is not a whole number (got “${t}”).` });
    else if (n <= 0) errors.push({ name, message: `${name} must be at least 1 (got ${t}).` });
    else if (!Number.isInteger(n)) errors.push({ name, message: `${name} must be a whole number (got ${t}).` });
    else errors.push({ name, message: `${name}: write the value in digits (got ${t}).` });
  }
  return { dims, errors };
}

/**
 * A number of seconds typed in a number field (`badInput`: the browser could not read it, its
 * value is then ""): {value} to send (undefined: none) or {error}. `positive`: the time limit
 * (more than 0, required); else the bound time (0 or more; 0 or empty send none).
 */
export function readSeconds(text, { label, positive = false, badInput = false } = {}) {
  const t = String(text ?? '').trim();
  if (badInput) return { error: `${label}: not a number of seconds.` };
  if (t === '') return positive ? { error: `${label}: give a number of seconds (30 is the default).` } : { value: undefined };
  const n = Number(t);
  if (!Number.isFinite(n)) return { error: `${label}: “${t}” is not a number of seconds.` };
  if (positive ? n <= 0 : n < 0) return { error: `${label} must be ${positive ? 'more than 0' : '0 or more'} seconds (got ${t}).` };
  return { value: !positive && n === 0 ? undefined : t };
}

/** The key of the dims as typed (names sorted), to tell whether they changed since the check. */
export function dimsKey(pairs) {
  return JSON.stringify([...pairs].map(({ name, text }) => [name, String(text ?? '').trim()]).sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0)));
}

/**
 * The dims the form shows after the server asked for `asked`: every dim already on the form
 * (its typed value kept) and the newly asked ones, in the order first seen. The server names
 * only the dims still unbound, so the form would otherwise lose those just typed.
 */
export function mergeDimNames(shown, asked) {
  return [...new Set([...shown, ...asked])];
}

/** The message of a form field, shown under it when its value is refused (markField). */
function fieldError(id) {
  return h('span', { class: 'field-error', id, hidden: true, 'data-testid': 'field-error' });
}

/** Marks `input` refused with `message` (its fieldError, the next element, says it), or clears it. */
function markField(input, message) {
  const box = input.nextElementSibling?.classList?.contains('field-error') ? input.nextElementSibling : null;
  if (message) input.setAttribute('aria-invalid', 'true');
  else input.removeAttribute('aria-invalid');
  if (box) {
    box.textContent = message ?? '';
    box.hidden = !message;
  }
}

/** What a JSON file's top level is, for a file that is JSON but no graph object. */
function jsonTopLevel(bytes) {
  try {
    const v = JSON.parse(new TextDecoder().decode(bytes));
    return Array.isArray(v) ? 'an array' : v === null ? 'null' : `a ${typeof v}`;
  } catch {
    return 'not an object';
  }
}

/** The token field (kept in this browser for every later write: POST, DELETE). */
export function tokenBox({ id = 'token', open = false } = {}) {
  const input = h('input', { type: 'password', id, autocomplete: 'off', placeholder: 'only if the server asks for one' });
  const save = () => {
    setToken(input.value);
    input.value = '';
  };
  return h('details', { class: 'token', open }, h('summary', {}, 'Server token'), h('label', { class: 'field', for: id }, h('span', {}, 'Bearer token'), input), h('button', { type: 'button', class: 'btn small', onclick: save }, 'Save'));
}

/** The polling of the upload view, stopped when the view is left (a plan done later is not
 *  opened over the page the user went to). */
let current = null;

/** Stops the upload view's probe or plan polling. */
export function leaveUpload() {
  current?.abort();
  current = null;
}

export function renderUpload(root) {
  leaveUpload();
  const view = new AbortController();
  current = view;
  // `probedDims`: the dims (as typed, dimsKey) the slider's range was found at.
  const state = { bytes: null, fileName: null, baseName: null, torch: false, dimNames: [], storeAll: null, min: null, hash: null, busy: false, abort: null, probedDims: null };
  // Focusable (not in the tab order): a Cancel that stopped the job moves focus to what it says.
  const statusBox = h('div', { class: 'status', role: 'status', 'aria-live': 'polite', tabindex: '-1', 'data-testid': 'upload-status' });
  const cancelBox = h('div', { class: 'job-actions' });
  const errorBox = h('div', { class: 'error-box', role: 'alert', hidden: true });
  const fileInput = h('input', { type: 'file', id: 'model-file', accept: '.onnx,.json,application/json,application/octet-stream', 'data-testid': 'model-file', onchange: () => onFile() });
  const nameInput = h('input', { type: 'text', id: 'model-name', placeholder: 'from the file name', autocomplete: 'off' });
  const dimsBox = h('fieldset', { class: 'dims', hidden: true }, h('legend', {}, 'Symbolic dimensions'));
  const checkBtn = h('button', { type: 'button', class: 'btn check-model', hidden: true, 'data-testid': 'check-model', onclick: () => probe() }, 'Check the model');
  const slider = h('input', { type: 'range', id: 'budget', min: '0', max: '1000', step: '1', value: '800', disabled: true, 'aria-describedby': 'budget-out', oninput: () => showBudget() });
  const budgetOut = h('output', { id: 'budget-out', for: 'budget', class: 'budget-out' }, 'Pick a model first.');
  const budgetRange = h('div', { class: 'budget-range muted' });
  const solverSel = h('select', { id: 'solver' }, SOLVERS.map(([v, l]) => h('option', { value: v }, l)));
  // No max: the server clamps to its cap, and the plan's page says so.
  const timeInput = h('input', { type: 'number', id: 'time-limit', min: '1', step: '1', value: '30', 'aria-describedby': 'time-limit-error' });
  const boundInput = h('input', { type: 'number', id: 'bound-time', min: '0', step: '1', value: '0', 'aria-describedby': 'bound-time-error', title: 'Extra seconds after the schedule to prove how far it can be from optimal, on graphs too large for the exact MILP (0: none)' });
  const validateBox = h('input', { type: 'checkbox', id: 'validate' });
  const roundsInput = h('input', { type: 'number', id: 'timing-rounds', min: '2', max: '64', step: '2', value: '2', title: 'With Validate: timing rounds at least (store-all and the plan side by side in each); more steady the measured overhead on a busy machine' });
  // The largest value of a dim that fits a device's memory (`maximize`): the plan is made at it.
  const maximizeSel = h('select', { id: 'maximize', 'data-testid': 'maximize', onchange: () => showMaximize() }, h('option', { value: '' }, 'no: plan at the dims above'));
  const deviceInput = h('input', { type: 'text', id: 'device-memory', placeholder: 'e.g. 24GiB', autocomplete: 'off', title: "The device's memory: bytes or a size (24GiB, 800MB)" });
  const maxOverheadInput = h('input', { type: 'number', id: 'max-overhead', min: '0', step: 'any', placeholder: 'any', title: 'The most compute overhead a plan may add, in percent (empty: any)' });
  const maximizeBox = h(
    'div',
    { class: 'row', hidden: true },
    h('label', { class: 'field', for: 'device-memory' }, h('span', {}, 'Device memory'), deviceInput),
    h('label', { class: 'field', for: 'max-overhead' }, h('span', {}, 'Max overhead (%)'), maxOverheadInput),
  );
  const maximizeRow = h('div', { class: 'row', hidden: true }, h('label', { class: 'field', for: 'maximize' }, h('span', {}, 'Largest value that fits'), maximizeSel));
  const planBtn = h('button', { type: 'submit', class: 'btn primary', disabled: true, 'data-testid': 'plan-button' }, 'Plan');

  const setStatus = (...parts) => mount(statusBox, ...parts);
  const showError = (e, lead = null) => {
    errorBox.hidden = !e;
    if (e) mount(errorBox, lead ? h('div', {}, lead) : null, describeError(e).map((l) => h('div', {}, l)), e.planId ? h('div', {}, 'The job is stored and goes on: ', planLink(e.planId)) : null);
  };
  const planLink = (id) => h('a', { href: planUrl(id), 'data-nav': true, 'data-testid': 'job-link' }, `plan ${id}`);
  // Each job's controller also stops when the view is left.
  const jobSignal = () => {
    const ctrl = new AbortController();
    view.signal.addEventListener('abort', () => ctrl.abort());
    return ctrl;
  };
  const dimInputs = () => [...dimsBox.querySelectorAll('input[data-dim]')];
  const dimPairs = () => dimInputs().map((input) => ({ name: input.dataset.dim, text: input.value }));
  /** The dims to send; a dim that is not a whole number of at least 1 is marked on its field and
   *  throws, naming it. */
  const dims = () => {
    const { dims: out, errors } = readDims(dimPairs());
    for (const input of dimInputs()) markField(input, errors.find((e) => e.name === input.dataset.dim)?.message ?? null);
    if (errors.length) {
      dimInputs().find((i) => i.getAttribute('aria-invalid') === 'true')?.focus();
      throw new ApiError(400, 'invalid_option', errors.map((e) => e.message).join(' '));
    }
    return out;
  };
  /** The seconds of a time field (see readSeconds), marked on the field when refused. */
  const seconds = (input, label, positive) => {
    const r = readSeconds(input.value, { label, positive, badInput: input.validity?.badInput === true });
    markField(input, r.error ?? null);
    if (r.error) {
      input.focus();
      throw new ApiError(400, 'invalid_option', r.error);
    }
    return r.value;
  };
  const budgetBytes = () => sliderBytes(state.min, state.storeAll, Number(slider.value));

  // A captured PyTorch graph's top budget is its unplanned peak; a free schedule's, store-all.
  const topName = () => (state.torch ? 'unplanned' : 'store-all');

  function showBudget() {
    if (!isNum(state.storeAll)) return;
    const b = budgetBytes();
    budgetOut.textContent = `${fmtBytes(b)} — ${fmtRatio(b / state.storeAll)} of the ${topName()} peak (${fmtBytesExact(b)})`;
    slider.setAttribute('aria-valuetext', `${fmtBytes(b)}, ${fmtRatio(b / state.storeAll)} of ${topName()}`);
  }

  /** Forgets the check's figures (its dims changed, or a dim is refused): no budget from other
   *  dims stays on the page, and Plan waits for the model to be checked again. */
  function invalidateProbe(why) {
    if (!isNum(state.storeAll) && state.probedDims === null) return;
    state.storeAll = null;
    state.min = null;
    state.probedDims = null;
    slider.disabled = true;
    planBtn.disabled = true;
    slider.removeAttribute('aria-valuetext');
    budgetOut.textContent = why;
    budgetRange.textContent = '';
    checkBtn.hidden = state.dimNames.length === 0;
    setStatus(why);
  }

  // A dim edited after the check: the budget range was found at the old dims.
  function onDimInput() {
    if (state.probedDims !== null && dimsKey(dimPairs()) !== state.probedDims) invalidateProbe('The dimensions changed: check the model again to find its budget range at them.');
  }

  function showDims(names) {
    state.dimNames = names;
    const prev = Object.fromEntries(dimPairs().map((p) => [p.name, p.text]));
    mount(
      dimsBox,
      h('legend', {}, 'Symbolic dimensions'),
      h('p', { class: 'muted' }, 'The model has dimensions without a size. Bind each to a value, then check the model again.'),
      names.map((n, i) =>
        h(
          'label',
          { class: 'field inline' },
          h('span', {}, n),
          // Enter checks the model (the form's own submit would plan, which needs the check first).
          // Text, not a number input: the value is sent as typed (a number input reads "abc" as
          // empty, and Number() rewrites big values), and checked by readDims.
          h('input', { type: 'text', inputmode: 'numeric', pattern: '[0-9]+', autocomplete: 'off', required: true, 'data-dim': n, value: prev[n] ?? '', 'aria-label': `value of dimension ${n}`, 'aria-describedby': `dim-error-${i}`, oninput: onDimInput, onkeydown: (ev) => ev.key === 'Enter' && (ev.preventDefault(), probe()) }),
          fieldError(`dim-error-${i}`),
        ),
      ),
    );
    dimsBox.hidden = names.length === 0;
    checkBtn.hidden = names.length === 0;
    const chosen = maximizeSel.value;
    mount(maximizeSel, h('option', { value: '' }, 'no: plan at the dims above'), names.map((n) => h('option', { value: n }, n)));
    maximizeSel.value = names.includes(chosen) ? chosen : '';
    maximizeRow.hidden = names.length === 0;
    showMaximize();
  }

  // With a dim to maximize, the budget is the device's memory typed in, not the slider's.
  function showMaximize() {
    maximizeBox.hidden = maximizeSel.value === '';
    for (const el of [slider, budgetOut, budgetRange]) el.hidden = maximizeSel.value !== '';
  }

  /** The options that `maximize` adds (and the budget it replaces), or {} without it. */
  function maximizeOptions() {
    if (maximizeSel.value === '') return {};
    const memory = deviceInput.value.trim();
    if (memory === '') throw new ApiError(400, 'invalid_option', "Give the device's memory (e.g. 24GiB) to find the largest " + maximizeSel.value + ' that fits.');
    const pct = maxOverheadInput.value.trim();
    return { maximize: maximizeSel.value, budget: memory, max_overhead: pct === '' ? undefined : String(Number(pct) / 100) };
  }

  /** The Cancel button of a job this view waits on, and what the view says of its outcome. */
  function offerCancel(job) {
    mount(cancelBox, cancelButton(job, { name: `plan ${job.id}`, focusAfter: statusBox }));
    job.on(() => {
      if (job.busy) showError(null);
      else if (job.stopped) setStatus(job.message);
      else if (job.state === 'failed') showError(job.error, 'The job could not be cancelled; it goes on.');
    });
  }

  /** Posts a plan and, when the server answers 202, polls it (with a Cancel button meanwhile).
   *  A cancelled job ends the wait with an AbortError, whatever a poll answers after it. */
  async function runJob(opts, label, signal) {
    const t0 = performance.now();
    const tick = (status, id) => setStatus(h('span', { class: 'spinner', 'aria-hidden': 'true' }), `${label}: ${status} (${((performance.now() - t0) / 1000).toFixed(1)} s)`, id ? [' — ', planLink(id)] : null);
    tick('uploading');
    const res = await postPlan(state.bytes, opts, signal);
    if (res.status === 202) {
      const id = res.json?.id;
      if (!id) throw new ApiError(502, 'bad_response', 'the server accepted the job without an id');
      rememberJob('plan', id);
      const job = new JobCancel('plan', id, { signal });
      offerCancel(job);
      try {
        return await unlessCancelled(job, poll('plan', id, { onStatus: (s) => job.stopped || tick(s, id), signal: job.signal }));
      } catch (e) {
        // The job may well go on (a server restarting): its page is where to find it.
        if (e instanceof ApiError && e.status !== 422) e.planId = id;
        throw e;
      }
    }
    return res.json;
  }

  /** The probe of a captured PyTorch graph: one plan at its unplanned peak ("1.0x") answers
   *  both ends of the slider (`unplanned_peak_bytes`, and `min_peak_bytes`, the least peak). */
  async function probeTorch(base, signal) {
    const raw = await runJob({ name: base.name, wait: 30, budget: '1.0x' }, 'Reading the captured graph', signal);
    const plan = raw?.plan ?? {};
    state.hash = raw?.model?.hash ?? null;
    state.storeAll = isNum(plan.unplanned_peak_bytes) ? plan.unplanned_peak_bytes : null;
    if (!isNum(state.storeAll)) throw new ApiError(502, 'bad_response', 'the torch-sac plan has no unplanned_peak_bytes');
    state.min = isNum(plan.min_peak_bytes) ? plan.min_peak_bytes : state.storeAll;
  }

  // First contact: a store-all plan gives the store-all peak (and tells which dims to bind);
  // a one-byte budget is refused with the minimum feasible budget.
  async function probe() {
    if (!state.bytes) return;
    // A new file or new dims: the probe in flight (if any) is abandoned.
    state.abort?.abort();
    const ctrl = jobSignal();
    state.abort = ctrl;
    showError(null);
    let base;
    try {
      base = { dims: dims(), name: nameInput.value || state.baseName, wait: 30 };
    } catch (e) {
      // A dim refused: nothing is posted, and no budget found at other dims stays.
      state.busy = false;
      invalidateProbe('Fix the dimensions, then check the model again.');
      showError(e);
      return;
    }
    const typed = dimsKey(dimPairs());
    state.busy = true;
    slider.disabled = true;
    planBtn.disabled = true;
    try {
      let nodes = null;
      if (state.torch) await probeTorch(base, ctrl.signal);
      else nodes = await probeFree(base, ctrl.signal);
      if (ctrl.signal.aborted) return;
      state.min = Math.min(state.min, state.storeAll);
      state.probedDims = typed;
      session.model = { bytes: state.bytes, fileName: state.fileName, name: base.name, dims: base.dims, hash: state.hash, min: state.min, storeAll: state.storeAll };
      const least = state.torch ? 'least reachable peak' : 'minimum feasible budget';
      setStatus(
        `${state.fileName}: ${isNum(nodes) ? `${nodes} nodes, ` : ''}${topName()} peak ${fmtBytes(state.storeAll)}, ${least} ${fmtBytes(state.min)}. `,
        state.hash ? h('a', { href: historyUrl(state.hash), 'data-nav': true }, 'Earlier plans of this model') : null,
      );
      budgetRange.textContent = `from ${fmtBytes(state.min)} (${state.torch ? 'least reachable' : 'minimum feasible'}) to ${fmtBytes(state.storeAll)} (${topName()})`;
      slider.value = String(state.storeAll > state.min ? Math.max(0, Math.min(1000, Math.round((1000 * (0.8 * state.storeAll - state.min)) / (state.storeAll - state.min)))) : 1000);
      slider.disabled = false;
      planBtn.disabled = false;
      checkBtn.hidden = state.dimNames.length === 0;
      showBudget();
      // Dims edited while the check ran: its figures are of the dims it was posted with.
      onDimInput();
    } catch (e) {
      if (ctrl.signal.aborted) return;
      // Cancelled (the status says so): checked again with a button, since picking the same
      // file again changes nothing the input would tell.
      if (e?.name === 'AbortError') {
        checkBtn.hidden = false;
        return;
      }
      if (e instanceof ApiError && e.code === 'unbound_dims' && Array.isArray(e.details?.names)) {
        showDims(mergeDimNames(state.dimNames, e.details.names.map(String)));
        setStatus('Bind the symbolic dimensions to continue.');
        dimsBox.querySelector('input')?.focus();
      } else {
        setStatus('');
        showError(e);
      }
    } finally {
      if (state.abort === ctrl) state.busy = false;
    }
  }

  /** The probe of an ONNX model or node-link graph: its store-all plan, then a one-byte budget
   *  whose refusal names the minimum feasible budget. Answers the graph's node count. */
  async function probeFree(base, signal) {
    const rec = normalizeRecord(await runJob({ ...base, budget: '1.0x', solver: 'store-all' }, 'Reading the model', signal));
    state.hash = rec.model.hash;
    state.storeAll = rec.doc?.storeAllPeakBytes ?? rec.doc?.predicted.peakBytes ?? null;
    if (!isNum(state.storeAll)) throw new ApiError(502, 'bad_response', 'the store-all plan has no store_all_peak_bytes');
    try {
      const low = normalizeRecord(await runJob({ ...base, budget: '1', solver: 'store-all' }, 'Finding the minimum budget', signal));
      state.min = low.doc?.predicted.peakBytes ?? state.storeAll;
    } catch (e) {
      if (e instanceof ApiError && e.code === 'infeasible_budget' && isNum(e.details?.min_feasible_budget_bytes)) state.min = e.details.min_feasible_budget_bytes;
      else throw e;
    }
    return rec.doc?.graph.nodes ?? null;
  }

  // A captured PyTorch graph is planned in the torch-sac model: no free-schedule solver, no
  // validation on the executor, no dims.
  function showKind() {
    mount(solverSel, state.torch ? h('option', { value: '' }, 'torch-sac (captured PyTorch graph)') : SOLVERS.map(([v, l]) => h('option', { value: v }, l)));
    solverSel.disabled = state.torch;
    validateBox.disabled = state.torch || isGraphJson(state.bytes);
    validateBox.title = validateBox.disabled ? 'Validation runs ONNX models only (a captured graph: remat.torch.measure in PyTorch)' : '';
    if (validateBox.disabled) validateBox.checked = false;
  }

  async function onFile() {
    const file = fileInput.files?.[0];
    if (!file) return;
    state.abort?.abort();
    showError(null);
    setStatus(h('span', { class: 'spinner', 'aria-hidden': 'true' }), `reading the file (${fmtBytes(file.size)})…`);
    slider.disabled = true;
    planBtn.disabled = true;
    try {
      state.bytes = await file.arrayBuffer();
    } catch (e) {
      setStatus('');
      showError(new Error(`The file could not be read: ${e?.message ?? e}`));
      return;
    }
    state.storeAll = null;
    state.min = null;
    state.probedDims = null;
    if (isJson(state.bytes) && !isGraphJson(state.bytes)) {
      // JSON, but not an object: no graph, and no ONNX model either (which it would be taken for).
      const bytes = state.bytes;
      state.bytes = null;
      setStatus('');
      budgetOut.textContent = 'Pick a model first.';
      budgetRange.textContent = '';
      showError(new Error(`${file.name} is JSON but not a graph object (its top level is ${jsonTopLevel(bytes)}): pick an ONNX model, a node-link graph JSON (an object with nodes and links) or a captured PyTorch graph.`));
      return;
    }
    state.torch = isTorchGraph(state.bytes);
    state.fileName = file.name;
    state.baseName = file.name.replace(/\.(onnx|json)$/i, '');
    state.storeAll = null;
    state.min = null;
    nameInput.placeholder = state.baseName;
    showKind();
    showDims([]);
    await probe();
  }

  async function onSubmit(ev) {
    ev.preventDefault();
    if (!state.bytes || !isNum(state.storeAll) || state.busy) return;
    showError(null);
    let fields;
    try {
      // The range was found at the dims checked: other dims need another check.
      if (dimsKey(dimPairs()) !== state.probedDims) {
        invalidateProbe('The dimensions changed: check the model again to find its budget range at them.');
        return;
      }
      fields = { dims: dims(), time_limit: seconds(timeInput, 'Time limit', true), bound_time: seconds(boundInput, 'Bound time', false) };
    } catch (e) {
      showError(e);
      return;
    }
    const ctrl = jobSignal();
    state.abort = ctrl;
    state.busy = true;
    planBtn.disabled = true;
    try {
      const opts = {
        budget: String(budgetBytes()),
        solver: state.torch ? undefined : solverSel.value,
        time_limit: fields.time_limit,
        bound_time: fields.bound_time,
        validate: validateBox.checked ? 'true' : undefined,
        timing_rounds: validateBox.checked && Number(roundsInput.value) > 2 ? roundsInput.value : undefined,
        dims: fields.dims,
        name: nameInput.value || state.baseName,
        wait: 2,
        ...maximizeOptions(),
      };
      const rec = normalizeRecord(await runJob(opts, 'Planning', ctrl.signal));
      if (ctrl.signal.aborted) return;
      if (!rec.id) throw new ApiError(502, 'bad_response', 'the plan has no id');
      navigate(planUrl(rec.id));
    } catch (e) {
      if (e?.name === 'AbortError' || ctrl.signal.aborted) return;
      setStatus('');
      showError(e);
    } finally {
      state.busy = false;
      planBtn.disabled = !isNum(state.storeAll);
    }
  }

  const recent = h('div', { 'data-testid': 'recent' }, h('p', { class: 'muted' }, 'Loading recent plans…'));
  mount(
    root,
    h(
      'section',
      { class: 'panel upload' },
      h('h1', {}, 'Plan activation checkpointing'),
      h('p', { class: 'lead' }, 'Upload an ONNX model or a training graph (node-link JSON). remat finds which activations to keep and which to recompute under your memory budget, at the least extra compute.'),
      h(
        'form',
        { onsubmit: onSubmit, novalidate: true },
        h('div', { class: 'row' }, h('label', { class: 'field grow', for: 'model-file' }, h('span', {}, '1. Model file'), fileInput), h('label', { class: 'field', for: 'model-name' }, h('span', {}, 'Name'), nameInput)),
        dimsBox,
        checkBtn,
        h('div', { class: 'field' }, h('label', { for: 'budget' }, '2. Memory budget'), slider, budgetOut, budgetRange),
        maximizeRow,
        maximizeBox,
        h(
          'div',
          { class: 'row' },
          h('label', { class: 'field', for: 'solver' }, h('span', {}, '3. Solver'), solverSel),
          h('label', { class: 'field', for: 'time-limit' }, h('span', {}, 'Time limit (s)'), timeInput, fieldError('time-limit-error')),
          h('label', { class: 'field', for: 'bound-time' }, h('span', {}, 'Bound time (s)'), boundInput, fieldError('bound-time-error')),
          h('label', { class: 'field check', for: 'validate' }, validateBox, h('span', {}, 'Validate (run the plan on the executor)')),
          h('label', { class: 'field', for: 'timing-rounds' }, h('span', {}, 'Timing rounds'), roundsInput),
        ),
        h('div', { class: 'actions' }, planBtn),
      ),
      statusBox,
      cancelBox,
      errorBox,
      tokenBox(),
    ),
    h('section', { class: 'panel' }, h('h2', {}, 'Recent plans'), recent),
  );
  loadRecent(recent);
}

/**
 * The recent plans without the viewer's failed probes (its own posts that asked the model's
 * dims or its minimum budget, refused by design) unless `showProbes`. A probe that worked (the
 * store-all plan) stays: it is a useful reference.
 */
export function recentShown(plans, { showProbes = false } = {}) {
  return plans.filter((p) => showProbes || !(p.status === 'failed' && isProbe(p)));
}

async function loadRecent(el) {
  try {
    const json = await listPlans();
    const records = Array.isArray(json) ? json : json?.plans ?? [];
    const plans = records.map(normalizeRecord);
    if (plans.length === 0) {
      mount(el, h('p', { class: 'muted' }, 'No plans yet.'));
      return;
    }
    // Figures: from the summaries, else (for the 10 newest) from the plan records.
    const figures = new Map(normalizeHistory(records).map((e) => [e.id, e]));
    await fillFigures([...figures.values()].filter((e) => plans.slice(0, 10).some((p) => p.id === e.id)), null, null);
    const box = h('div');
    const show = (showProbes) => {
      const shown = recentShown(plans, { showProbes });
      mount(box, shown.length ? recentTable(shown, figures) : h('p', { class: 'muted' }, 'No plans but the viewer\u2019s failed probes.'));
    };
    show(false);
    const noise = plans.filter((p) => !recentShown([p]).length).map((p) => figures.get(p.id) ?? p);
    if (noise.length === 0) {
      mount(el, box);
      return;
    }
    const toggle = h('input', { type: 'checkbox', 'data-testid': 'recent-show-probes', onchange: () => show(toggle.checked) });
    mount(el, h('label', { class: 'check muted' }, toggle, probesLabel(noise)), box);
  } catch (e) {
    mount(el, h('p', { class: 'muted' }, `Recent plans are not available: ${e.message}`));
  }
}

function recentTable(plans, figures) {
  return h(
    'table',
    { class: 'data table-x', 'data-testid': 'recent-table' },
    h('thead', {}, h('tr', {}, ['Model', 'Created', 'Status', 'Budget', 'Peak', 'Overhead', ''].map((t) => h('th', { scope: 'col' }, t)))),
    h(
      'tbody',
      {},
      plans.map((p) => {
        const f = figures.get(p.id) ?? {};
        return h(
          'tr',
          {},
          h('td', {}, h('a', { href: planUrl(p.id), 'data-nav': true }, p.model.name ?? p.model.hash?.slice(0, 12) ?? p.id)),
          h('td', {}, fmtTime(p.createdAt)),
          h('td', {}, h('span', { class: `badge status-${p.status}` }, p.status), p.error ? h('span', { class: 'muted' }, ` ${p.error.code}`) : ''),
          h('td', { class: 'num' }, isNum(f.budgetBytes) ? fmtBytes(f.budgetBytes) : fmtBudget(p.options.budget)),
          h('td', { class: 'num' }, fmtBytes(f.peakBytes)),
          h('td', { class: 'num' }, fmtOverhead(f.overhead)),
          h('td', {}, p.model.hash ? h('a', { href: historyUrl(p.model.hash), 'data-nav': true }, 'history') : ''),
        );
      }),
    ),
  );
}
