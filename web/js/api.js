// The remat HTTP API (v1). Every failure becomes an ApiError carrying the server's
// {error: {code, message, details}} when there is one.

export class ApiError extends Error {
  constructor(status, code, message, details) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details ?? null;
  }
}

const TOKEN_KEY = 'remat.token';

function token() {
  try {
    return localStorage.getItem(TOKEN_KEY);
  } catch {
    return null;
  }
}

/** Stores (or with null, forgets) the bearer token for servers that require one. */
export function setToken(t) {
  try {
    if (t) localStorage.setItem(TOKEN_KEY, t);
    else localStorage.removeItem(TOKEN_KEY);
  } catch {
    // Storage may be disabled; the token then lasts for this request only.
  }
}

async function request(method, path, { body, contentType, signal } = {}) {
  const headers = { Accept: 'application/json' };
  if (contentType) headers['Content-Type'] = contentType;
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  let res;
  try {
    res = await fetch(path, { method, body, headers, signal });
  } catch (e) {
    if (e?.name === 'AbortError') throw e;
    throw new ApiError(0, 'network', `cannot reach the server: ${e?.message ?? e}`);
  }
  const text = await res.text();
  let json = null;
  if (text) {
    try {
      json = JSON.parse(text);
    } catch {
      if (res.ok) throw new ApiError(res.status, 'bad_response', `${method} ${path}: the answer is not JSON`);
    }
  }
  if (!res.ok) {
    const err = json?.error ?? {};
    throw new ApiError(res.status, err.code ?? `http_${res.status}`, err.message ?? `${method} ${path} answered ${res.status} ${res.statusText}`, err.details);
  }
  return { status: res.status, json };
}

/** Query string of plan options: {budget, dims: {NAME: VALUE}, solver, time_limit, bound_time, validate, name, wait, maximize, max_overhead, timing_rounds, fraction: []}. */
export function planQuery(opts) {
  const q = new URLSearchParams();
  for (const key of ['budget', 'solver', 'time_limit', 'bound_time', 'validate', 'name', 'wait', 'maximize', 'max_overhead', 'timing_rounds', 'expect_model']) {
    const v = opts[key];
    if (v !== undefined && v !== null && v !== '') q.append(key, String(v));
  }
  for (const [name, value] of Object.entries(opts.dims ?? {})) q.append('dim', `${name}=${value}`);
  for (const f of opts.fraction ?? []) q.append('fraction', String(f));
  return q.toString();
}

/**
 * Is the model a training step captured from PyTorch (a JSON object whose `format` is
 * `remat.torch-graph`, docs/torch.md)? Those are planned in the torch-sac model: no solver, no
 * dims, budgets as fractions of the unplanned peak or `min`.
 */
export function isTorchGraph(bytes) {
  if (!isGraphJson(bytes)) return false;
  try {
    return JSON.parse(new TextDecoder().decode(bytes))?.format === 'remat.torch-graph';
  } catch {
    return false;
  }
}

/** Is the model a graph JSON (first non-blank byte `{`)? Mirrors the server's detection. */
export function isGraphJson(bytes) {
  const view = new Uint8Array(bytes);
  for (const b of view) {
    if (b === 0x20 || b === 0x0a || b === 0x0d || b === 0x09) continue;
    return b === 0x7b;
  }
  return false;
}

/**
 * Is the file JSON of any kind (an array, a string or a number too, not only a graph object)?
 * First non-blank byte (after a UTF-8 BOM) `{` or `[`, or a small text that parses as JSON. Such a
 * body goes as JSON, so that the server says what is wrong with it instead of reading it as ONNX.
 */
export function isJson(bytes) {
  const view = new Uint8Array(bytes);
  let i = view[0] === 0xef && view[1] === 0xbb && view[2] === 0xbf ? 3 : 0;
  while (i < view.length && (view[i] === 0x20 || view[i] === 0x0a || view[i] === 0x0d || view[i] === 0x09)) i += 1;
  if (i === view.length) return false;
  if (view[i] === 0x7b || view[i] === 0x5b) return true;
  // A scalar (`"text"`, `12`, `true`, `null`): only a small file is worth decoding.
  if (view.length > 1 << 20 || !/["\-0-9tfn]/.test(String.fromCharCode(view[i]))) return false;
  try {
    JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(view.subarray(i)));
    return true;
  } catch {
    return false;
  }
}

/** The content type a model is posted with: JSON (a graph, or JSON the server will refuse as
 *  one, by name) or ONNX bytes. */
export function modelContentType(bytes) {
  return isGraphJson(bytes) || isJson(bytes) ? 'application/json' : 'application/octet-stream';
}

/** POST /v1/plans: answers {status: 200|201|202, json}. */
export function postPlan(bytes, opts, signal) {
  return request('POST', `/v1/plans?${planQuery(opts)}`, {
    body: bytes,
    contentType: modelContentType(bytes),
    signal,
  });
}

/** POST /v1/sweeps. */
export function postSweep(bytes, opts, signal) {
  return request('POST', `/v1/sweeps?${planQuery(opts)}`, {
    body: bytes,
    contentType: modelContentType(bytes),
    signal,
  });
}

/**
 * Posts a sweep and waits for it (polling when the server answers 202); resolves with the sweep
 * record ({id, model: {hash}, sweep}). `onStatus(status)` on every poll; `onAccepted(id)` once
 * the server answers 202 (the job can then be cancelled); `signal` stops the post and the poll.
 */
export async function sweepOf(bytes, opts, onStatus, { signal, onAccepted } = {}) {
  const res = await postSweep(bytes, opts, signal);
  if (res.status === 202) {
    onAccepted?.(res.json.id);
    return poll('sweep', res.json.id, { onStatus, signal });
  }
  return res.json;
}

/** SHA-256 of bytes in hex, as the API's model hash of ONNX bytes; null where the browser has no
 *  `crypto.subtle` (a page not served from localhost or https). */
export async function sha256Hex(bytes) {
  if (!globalThis.crypto?.subtle) return null;
  const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', bytes));
  return [...digest].map((b) => b.toString(16).padStart(2, '0')).join('');
}

export async function getPlan(id, signal) {
  return (await request('GET', `/v1/plans/${encodeURIComponent(id)}`, { signal })).json;
}

export async function getSweep(id, signal) {
  return (await request('GET', `/v1/sweeps/${encodeURIComponent(id)}`, { signal })).json;
}

export async function getHistory(hash, signal) {
  return (await request('GET', `/v1/models/${encodeURIComponent(hash)}/history`, { signal })).json;
}

/**
 * DELETE /v1/plans/{id} (`kind` 'plan') or /v1/sweeps/{id} (`kind` 'sweep'), with the token as
 * every write: the server forgets the job and stops it where it is queued or running. Resolves
 * with 204; rejects with the ApiError (404: the server has no such job; 401: a token is needed).
 */
export async function deleteJob(kind, id, signal) {
  return (await request('DELETE', `/v1/${kind === 'sweep' ? 'sweeps' : 'plans'}/${encodeURIComponent(id)}`, { signal })).status;
}

export async function listPlans(signal) {
  return (await request('GET', '/v1/plans?limit=50', { signal })).json;
}

const sleep = (ms, signal) =>
  new Promise((resolve, reject) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => {
      clearTimeout(t);
      reject(new DOMException('aborted', 'AbortError'));
    });
  });

/** Answers worth asking again: no answer at all, or a gateway or server that is (re)starting. */
export function isTransient(e) {
  return e instanceof ApiError && (e.status === 0 || e.status === 502 || e.status === 503 || e.status === 504);
}

/** Milliseconds to wait before retry `n` (0, 1, ...): doubling from 1 s, at most 10 s. */
export function retryDelay(n) {
  return Math.min(10_000, 1000 * 2 ** n);
}

/**
 * Polls a job until it is done or failed; `onStatus(status)` on every answer. Resolves with
 * the final record; a failed job rejects with its error. A server out of reach (restarting, a
 * network blip) is asked again with backoff for `retryMs` before the poll gives up: the job is
 * stored and goes on without us (`onStatus('unreachable, retrying in N s')` meanwhile).
 */
export async function poll(kind, id, { onStatus, signal, intervalMs = 500, retryMs = 90_000, backoff = retryDelay } = {}) {
  const get = kind === 'sweep' ? getSweep : getPlan;
  let failures = 0;
  let since = null;
  for (;;) {
    let rec;
    try {
      rec = await get(id, signal);
    } catch (e) {
      if (!isTransient(e)) throw e;
      since ??= Date.now();
      const wait = backoff(failures);
      if (Date.now() - since + wait > retryMs) throw e;
      failures += 1;
      onStatus?.(`server unreachable, retrying in ${Math.round(wait / 1000)} s`, null);
      await sleep(wait, signal);
      continue;
    }
    failures = 0;
    since = null;
    onStatus?.(rec?.status ?? 'unknown', rec);
    if (rec?.status === 'done') return rec;
    if (rec?.status === 'failed') {
      const e = rec.error ?? {};
      throw new ApiError(422, e.code ?? 'failed', e.message ?? 'the job failed', e.details);
    }
    await sleep(intervalMs, signal);
  }
}
