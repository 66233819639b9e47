// A stand-in for `remat serve` while the real service is being written: serves web/ (with the
// SPA fallback for /plans/*) and answers the v1 API in the contract's shape with plans computed
// by a small honest planner (a schedule is simulated; figures come from the simulation). Node
// link graphs are planned as posted; any other body is treated as an ONNX model with a symbolic
// `batch` dimension and planned as a generated graph scaled by it.
//
//   node mock-server.mjs [port]      (MOCK_JOB_SECONDS: how long a job "solves", default 2.5;
//                                    a request header `x-mock-job-seconds` sets it for one job;
//                                    MOCK_TOKEN: the bearer token writes need, as --token;
//                                    MOCK_MAX_TIME_LIMIT: the cap on time_limit and bound_time,
//                                    as --max-time-limit, default 300)
//   MOCK_PROXY=http://127.0.0.1:8080 node mock-server.mjs [port]
//                                    (web/ from disk, the API forwarded to a real server)

import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';
import crypto from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { makeNodeLink } from './gen-graph.mjs';

const WEB = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const JOB_SECONDS = Number(process.env.MOCK_JOB_SECONDS ?? 2.5);
const MAX_TIME_LIMIT = Number(process.env.MOCK_MAX_TIME_LIMIT ?? 300);
const TYPES = { '.html': 'text/html; charset=utf-8', '.js': 'text/javascript; charset=utf-8', '.css': 'text/css; charset=utf-8', '.json': 'application/json', '.png': 'image/png', '.svg': 'image/svg+xml' };

/** A problem from node-link JSON: nodes in id order, deps from links. */
export function problemFromNodeLink(doc) {
  if (!Array.isArray(doc?.nodes) || !Array.isArray(doc?.links ?? doc?.edges)) throw apiError(400, 'malformed_graph', 'missing array "nodes" or "links"');
  const nodes = doc.nodes.map((n, i) => {
    if (n.id === undefined) throw apiError(400, 'malformed_graph', `node #${i}: missing field "id"`);
    if (typeof n.cost_ram !== 'number') throw apiError(400, 'malformed_graph', `node ${JSON.stringify(n.id)}: missing field "cost_ram"`);
    return { id: String(n.id), name: String(n.name ?? n.id), cost: Number(n.cost_cpu ?? 1), bytes: n.cost_ram, kind: n.backward ? 'backward' : 'forward', deps: [] };
  });
  const index = new Map(nodes.map((n, i) => [n.id, i]));
  for (const l of doc.links ?? doc.edges) {
    const s = index.get(String(l.source ?? l[0]));
    const t = index.get(String(l.target ?? l[1]));
    if (s === undefined || t === undefined) throw apiError(400, 'malformed_graph', `link ${JSON.stringify(l)} names an unknown node`);
    nodes[t].deps.push(s);
  }
  return { name: doc.graph?.name ?? 'graph', nodes, fixed: 0 };
}

/**
 * Plans by a simple rule and simulates the schedule: forward values read by backward are kept,
 * except that every other one whose deps are all kept is recomputed when the budget is under
 * the store-all peak (the more, the lower the budget).
 */
export function planProblem(p, budget, { recomputeAll = false } = {}) {
  const n = p.nodes.length;
  const users = p.nodes.map(() => []);
  p.nodes.forEach((node, v) => node.deps.forEach((d) => users[d].push(v)));
  const readByBackward = p.nodes.map((node, v) => node.kind !== 'backward' && users[v].some((u) => p.nodes[u].kind === 'backward'));
  const recompute = new Array(n).fill(false);
  const pick = (share) => {
    let k = 0;
    p.nodes.forEach((node, v) => {
      if (!readByBackward[v] || node.deps.some((d) => recompute[d])) return;
      if ((k++ % share) === 0) recompute[v] = true;
    });
  };
  const simulate = () => {
    const steps = [];
    const resident = new Set();
    const computes = new Array(n).fill(0);
    let mem = p.fixed;
    let peak = p.fixed;
    let cost = 0;
    const memory = [];
    const compute = (v) => {
      peak = Math.max(peak, mem + p.nodes[v].bytes);
      if (!resident.has(v)) {
        resident.add(v);
        mem += p.nodes[v].bytes;
      }
      cost += p.nodes[v].cost;
      computes[v] += 1;
      steps.push({ op: 'compute', node: p.nodes[v].id });
      memory.push(mem);
    };
    const free = (v) => {
      if (!resident.has(v)) return;
      resident.delete(v);
      mem -= p.nodes[v].bytes;
      steps.push({ op: 'free', node: p.nodes[v].id });
      memory.push(mem);
    };
    const lastUse = new Array(n).fill(-1);
    p.nodes.forEach((node, v) => node.deps.forEach((d) => (lastUse[d] = Math.max(lastUse[d], v))));
    const lastForwardUse = new Array(n).fill(-1);
    p.nodes.forEach((node, v) => node.kind !== 'backward' && node.deps.forEach((d) => (lastForwardUse[d] = Math.max(lastForwardUse[d], v))));
    for (let v = 0; v < n; v++) {
      const node = p.nodes[v];
      if (node.kind === 'backward') for (const d of node.deps) if (!resident.has(d)) compute(d);
      compute(v);
      for (const d of node.deps) {
        const forwardDone = recompute[d] && node.kind !== 'backward' && lastForwardUse[d] === v;
        if (lastUse[d] === v || forwardDone) free(d);
      }
    }
    return { steps, memory, peak, cost, computes };
  };
  const base = simulate();
  let best = base;
  if (budget < base.peak) {
    for (const share of recomputeAll ? [1] : [4, 3, 2, 1]) {
      recompute.fill(false);
      pick(share);
      best = simulate();
      if (best.peak <= budget) break;
    }
  }
  return { base, best, recompute };
}

function planDoc(p, budget, solver, { validate = false, model = null, timingRounds = 2 } = {}) {
  const { base, best } = planProblem(p, budget);
  const storeAllCost = p.nodes.reduce((s, x) => s + x.cost, 0);
  const low = planProblem(p, 0, { recomputeAll: true }).best.peak;
  if (best.peak > budget) throw apiError(422, 'infeasible_budget', `budget ${budget} bytes is infeasible: the minimum feasible budget is ${low} bytes`, { budget_bytes: budget, min_feasible_budget_bytes: low });
  const overhead = best.cost / storeAllCost - 1;
  const baselines = [
    { name: 'store-all', peak_bytes: base.peak, compute_cost: storeAllCost, overhead: 0, feasible: base.peak <= budget },
    { name: 'chen-sqrt', peak_bytes: Math.round((base.peak + low) / 2), compute_cost: storeAllCost * 1.33, overhead: 0.33, feasible: (base.peak + low) / 2 <= budget },
    { name: 'chen-greedy', peak_bytes: Math.round(low * 1.2), compute_cost: storeAllCost * 1.25, overhead: 0.25, feasible: low * 1.2 <= budget },
  ];
  const users = p.nodes.map(() => []);
  p.nodes.forEach((node, v) => node.deps.forEach((d) => users[d].push(v)));
  const decisions = p.nodes.map((node, v) => {
    const k = best.computes[v];
    const byBackward = users[v].some((u) => p.nodes[u].kind === 'backward');
    let decision;
    let reason;
    if (k === 0) [decision, reason] = ['skipped', 'not needed for the gradients'];
    else if (node.kind === 'backward') [decision, reason] = ['backward', 'computed once during backward'];
    else if (k > 1) [decision, reason] = ['recompute', `freed after forward and recomputed ${k - 1} time(s) for backward`];
    else if (byBackward) [decision, reason] = ['keep', 'kept from forward to its last backward use'];
    else [decision, reason] = ['transient', 'freed after its last forward use (backward does not read it)'];
    return { node: node.id, name: node.name, kind: node.kind, bytes: node.bytes, cost: node.cost, computes: k, decision, reason, deps: node.deps.map((d) => p.nodes[d].id) };
  });
  const doc = {
    status: 'feasible',
    solver,
    budget_bytes: budget,
    store_all_peak_bytes: base.peak,
    store_all_cost: storeAllCost,
    predicted: { peak_bytes: best.peak, compute_cost: best.cost, overhead, memory: best.memory },
    lower_bound: { compute_cost: storeAllCost },
    gap: best.cost > 0 ? (best.cost - storeAllCost) / best.cost : 0,
    solve_seconds: 0.01,
    baselines,
    schedule: best.steps,
    decisions,
    graph: { name: p.name, format: model ? 'onnx' : 'graph_json', nodes: p.nodes.length, fixed_bytes: p.fixed, store_all_cost: storeAllCost },
    summary: { budget_bytes: budget, peak_bytes: best.peak, overhead, status: 'feasible', solver },
  };
  if (model) {
    doc.model = model;
    // As the service: an ONNX model is costed by the roofline, in seconds.
    doc.cost_model = { unit: 'seconds' };
  }
  if (validate) {
    // A deterministic "measurement": the allocator rounds every step up to 2 MiB pages.
    const page = 2 << 20;
    const measured = best.memory.map((m) => Math.ceil(m / page) * page);
    doc.validation = {
      device: 'cpu (mock)',
      ok: true,
      measured_peak_bytes: Math.max(...measured),
      predicted_peak_bytes: best.peak,
      heap_peak_bytes: Math.max(...measured) + page,
      grad_max_rel_err: 3.2e-7,
      step_seconds: 0.0123 * (1 + overhead),
      store_all_step_seconds: 0.0123,
      measured_overhead: overhead * 0.9,
      measured_overhead_range: [overhead * 0.8, overhead * 1.1],
      measured_step_overhead: overhead * 0.95,
      // As the executor: the rounds asked for (`timing_rounds`, default 2).
      timing_rounds: timingRounds,
      timeline: measured.map((m, step) => ({ step, predicted_bytes: best.memory[step], measured_bytes: m })),
    };
  }
  return doc;
}

/**
 * As the service's options: time_limit and bound_time are numbers of seconds (positive; 0 or
 * more), refused otherwise; above the cap they are clamped and `clamped` says so.
 */
export function clampTimes(q, cap = MAX_TIME_LIMIT) {
  const out = {};
  const clamped = {};
  for (const [key, zeroOk] of [['time_limit', false], ['bound_time', true]]) {
    if (!q.has(key)) continue;
    const t = Number(q.get(key));
    if (q.get(key).trim() === '' || !Number.isFinite(t) || !(t > 0 || (zeroOk && t === 0))) throw apiError(400, 'invalid_option', `${key} ${q.get(key)}: expected a ${zeroOk ? 'non-negative' : 'positive'} number of seconds`);
    out[key] = Math.min(t, cap);
    if (t > cap) clamped[key] = { requested: t, applied: cap, reason: `the server caps the solver time at ${cap} s` };
  }
  if (Object.keys(clamped).length) out.clamped = clamped;
  return out;
}

function apiError(status, code, message, details = null) {
  const e = new Error(message);
  Object.assign(e, { status, code, details });
  return e;
}

function parseBudget(text, storeAll) {
  if (text === undefined) throw apiError(400, 'invalid_option', 'budget is required');
  const m = /^([0-9.]+)\s*(x|b|kib|mib|gib|kb|mb|gb)?$/i.exec(text.trim());
  if (!m) throw apiError(400, 'invalid_option', `budget: cannot parse ${JSON.stringify(text)}`);
  const v = Number(m[1]);
  const unit = (m[2] ?? 'b').toLowerCase();
  if (unit === 'x') return Math.round(v * storeAll);
  const mult = { b: 1, kib: 1024, mib: 1024 ** 2, gib: 1024 ** 3, kb: 1e3, mb: 1e6, gb: 1e9 }[unit];
  return Math.round(v * mult);
}

const jobs = new Map();
const byKey = new Map();
let nextId = 1;

function loadModel(body, q) {
  const text = body.toString('utf8');
  if (/^\s*\{/.test(text)) {
    let doc;
    try {
      doc = JSON.parse(text);
    } catch (e) {
      throw apiError(400, 'malformed_graph', `graph JSON: ${e.message}`);
    }
    return { problem: problemFromNodeLink(doc), format: 'graph_json', model: null };
  }
  if (body.length < 16) throw apiError(400, 'malformed_model', 'ONNX: the file is too short to be a model');
  const dims = Object.fromEntries(q.getAll('dim').map((d) => d.split('=')));
  if (!dims.batch) throw apiError(422, 'unbound_dims', 'the model has symbolic dimensions without a value: batch (bind them with dim=NAME=VALUE)', { names: ['batch'] });
  const batch = Number(dims.batch);
  const nl = makeNodeLink(60, 'onnx_model');
  for (const n of nl.nodes) n.cost_ram = Math.round((n.cost_ram / 64) * batch);
  const problem = problemFromNodeLink(nl);
  problem.fixed = 45_000_000;
  // Roofline seconds: a microsecond per unit of the generated graph's cost.
  for (const n of problem.nodes) n.cost *= 1e-6;
  return { problem, format: 'onnx', model: { nodes: 30, training_nodes: 60, ops: { Conv: 10, Relu: 10, BatchNormalization: 10 }, params_bytes: 11_000_000, saved_activation_bytes: 1, symbolic_dims: ['batch'] } };
}

function record(job, withDoc = true) {
  const out = { id: job.id, kind: job.kind, status: job.status, model: job.model, created_at: job.created, updated_at: job.created, options: job.options };
  if (job.status === 'done') {
    out.summary = job.doc.summary ?? null;
    if (withDoc) out[job.kind] = job.doc;
  }
  if (job.error) out.error = job.error;
  return out;
}

function send(res, status, value) {
  const body = JSON.stringify(value);
  res.writeHead(status, { 'Content-Type': 'application/json' });
  res.end(body);
}

function sendError(res, e) {
  const status = e.status ?? 500;
  if (status === 401) res.setHeader('WWW-Authenticate', 'Bearer');
  send(res, status, { error: { code: e.code ?? 'internal', message: status >= 500 ? 'internal error' : e.message, details: e.details ?? null } });
  if (status >= 500) console.error(e);
}

async function submit(kind, req, res, q, body) {
  const hash = crypto.createHash('sha256').update(body).digest('hex');
  // As the service: another model than `expect_model` names is refused before any job (the
  // mock hashes the bytes as sent; the service hashes a JSON graph's canonical text).
  const expected = q.get('expect_model')?.toLowerCase();
  if (expected && expected !== hash) throw apiError(409, 'model_mismatch', `the model sent hashes to ${hash}, not to ${expected} (expect_model): it is not the model asked for`, { expected, got: hash });
  const key = `${kind} ${hash} ${[...q.entries()].filter(([k]) => k !== 'wait' && k !== 'expect_model').map((kv) => kv.join('=')).sort().join('&')}`;
  const existing = byKey.get(key);
  if (existing && existing.status === 'done') return send(res, 200, record(existing));
  const { problem, format, model } = loadModel(body, q);
  const options = Object.fromEntries([...q.entries()].filter(([k]) => !['dim', 'fraction', 'wait', 'expect_model'].includes(k)));
  options.dims = Object.fromEntries(q.getAll('dim').map((d) => d.split('=')).map(([k, v]) => [k, Number(v)]));
  Object.assign(options, clampTimes(q));
  const job = { id: `p${String(nextId++).padStart(4, '0')}`, kind, status: 'queued', model: { hash, name: q.get('name') ?? problem.name, format }, created: new Date().toISOString(), options, deleted: false };
  let result;
  let failure = null;
  try {
    if (kind === 'plan') {
      const storeAll = planProblem(problem, Infinity).base.peak;
      const budget = parseBudget(q.get('budget'), storeAll);
      result = planDoc(problem, budget, q.get('solver') ?? 'auto', { validate: q.get('validate') === 'true', model, timingRounds: Number(q.get('timing_rounds') ?? 2) });
    } else {
      const storeAll = planProblem(problem, Infinity).base.peak;
      const fractions = q.getAll('fraction').length ? q.getAll('fraction').map(Number) : [1, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2];
      result = {
        graph: { name: problem.name, nodes: problem.nodes.length, format },
        store_all_peak_bytes: storeAll,
        points: fractions.map((f) => {
          const budget = Math.round(f * storeAll);
          try {
            const d = planDoc(problem, budget, 'auto');
            return { budget_bytes: budget, fraction: f, status: 'feasible', overhead: d.predicted.overhead, solver: 'auto', gap: null, baselines: d.baselines.map((b) => [b.name, b.feasible ? b.overhead : null]) };
          } catch {
            return { budget_bytes: budget, fraction: f, status: 'infeasible', overhead: null, solver: 'auto', gap: null, baselines: [] };
          }
        }),
      };
    }
  } catch (e) {
    if (!e.status || e.status >= 500) throw e;
    failure = e;
  }
  jobs.set(job.id, job);
  byKey.set(key, job);
  const t0 = Date.now();
  const seconds = Number(req.headers['x-mock-job-seconds']);
  const duration = (Number.isFinite(seconds) && seconds >= 0 ? seconds : JOB_SECONDS) * 1000;
  const advance = () => {
    const t = Date.now() - t0;
    // A deleted job is stopped where it was: it never ends, and no GET finds it.
    if (job.deleted || job.status === 'done' || job.status === 'failed') return;
    if (t >= duration) {
      if (failure) {
        job.status = 'failed';
        job.error = { code: failure.code, message: failure.message, details: failure.details };
      } else {
        job.status = 'done';
        job.doc = result;
      }
    } else job.status = t > duration / 2 && q.get('validate') === 'true' ? 'validating' : t > duration / 5 ? 'solving' : 'queued';
  };
  job.advance = advance;
  const wait = Math.min(Number(q.get('wait') ?? 0) * 1000, 30000);
  await new Promise((r) => setTimeout(r, Math.min(wait, duration)));
  advance();
  // Deleted while this post waited: its id, which GET then answers 404 for.
  if (job.deleted) return send(res, 202, { id: job.id, status: job.status });
  if (job.status === 'failed') return sendError(res, failure);
  if (job.status === 'done') return send(res, 201, record(job));
  return send(res, 202, { id: job.id, status: job.status });
}

/**
 * DELETE /v1/plans/{id} or /v1/sweeps/{id}, as the service: 204, or 404 for an id it does not
 * hold (of that kind). A queued or running job is stopped too: it never ends, and is gone from
 * GET, the plan list and the model's history.
 */
function deleteJob(res, kind, id) {
  const job = jobs.get(id);
  if (!job || job.kind !== kind) throw apiError(404, 'not_found', `no ${kind} with id ${JSON.stringify(id)}`);
  job.deleted = true;
  jobs.delete(id);
  for (const [key, j] of byKey) if (j === job) byKey.delete(key);
  res.writeHead(204);
  res.end();
}

/** Writes need `Authorization: Bearer <token>` when the mock has one, as `remat serve --token`. */
function authorize(req, token) {
  if (!token || !['POST', 'PUT', 'PATCH', 'DELETE'].includes(req.method)) return;
  const [scheme, given] = (req.headers.authorization ?? '').split(/ (.*)/s);
  if (!given || scheme.toLowerCase() !== 'bearer') throw apiError(401, 'unauthorized', 'writes need `Authorization: Bearer <token>`');
  if (given.trim() !== token) throw apiError(401, 'unauthorized', 'the bearer token is wrong');
}

function serveStatic(res, urlPath) {
  let rel = decodeURIComponent(urlPath).replace(/^\/+/, '');
  if (rel === '' || rel.startsWith('plans/') || rel === 'plans') rel = 'index.html';
  if (rel.split('/').some((s) => s === '..' || s === '') || rel.startsWith('tests/')) return send(res, 404, { error: { code: 'not_found', message: 'no such file', details: null } });
  const file = path.join(WEB, rel);
  fs.readFile(file, (err, data) => {
    if (err) return send(res, 404, { error: { code: 'not_found', message: `no file ${urlPath}`, details: null } });
    res.writeHead(200, { 'Content-Type': TYPES[path.extname(file)] ?? 'application/octet-stream' });
    res.end(data);
  });
}

/** Forwards a request to `target` (a real `remat serve`) and streams the answer back. */
function proxy(target, req, res) {
  const up = new URL(req.url, target);
  const fwd = http.request(up, { method: req.method, headers: { ...req.headers, host: up.host } }, (answer) => {
    res.writeHead(answer.statusCode ?? 502, answer.headers);
    answer.pipe(res);
  });
  fwd.on('error', (e) => sendError(res, apiError(502, 'bad_gateway', `proxy to ${target}: ${e.message}`)));
  req.pipe(fwd);
}

/**
 * The server. With `proxyTo` (a real server's URL), the API is forwarded there and only the
 * viewer's files are served from disk: the current web/ against the real planner, without
 * rebuilding the binary that embeds web/.
 */
export function createMockServer({ proxyTo = null, token = process.env.MOCK_TOKEN || null } = {}) {
  return http.createServer(async (req, res) => {
    const url = new URL(req.url, 'http://localhost');
    if (proxyTo && (url.pathname.startsWith('/v1/') || url.pathname === '/healthz')) return proxy(proxyTo, req, res);
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = Buffer.concat(chunks);
    try {
      let m;
      authorize(req, token);
      if (req.method === 'POST' && url.pathname === '/v1/plans') return await submit('plan', req, res, url.searchParams, body);
      if (req.method === 'POST' && url.pathname === '/v1/sweeps') return await submit('sweep', req, res, url.searchParams, body);
      if (req.method === 'GET' && (m = /^\/v1\/(plans|sweeps)\/([^/]+)$/.exec(url.pathname))) {
        const job = jobs.get(m[2]);
        if (!job) throw apiError(404, 'not_found', `no ${m[1].slice(0, -1)} with id ${JSON.stringify(m[2])}`);
        job.advance();
        return send(res, 200, record(job));
      }
      if (req.method === 'DELETE' && (m = /^\/v1\/(plans|sweeps)\/([^/]+)$/.exec(url.pathname))) return deleteJob(res, m[1].slice(0, -1), decodeURIComponent(m[2]));
      if (req.method === 'GET' && url.pathname === '/v1/plans') {
        const model = url.searchParams.get('model');
        const plans = [...jobs.values()].filter((j) => j.kind === 'plan' && (!model || j.model.hash === model)).reverse().map((j) => record(j, false));
        return send(res, 200, { plans });
      }
      if (req.method === 'GET' && (m = /^\/v1\/models\/([^/]+)\/history$/.exec(url.pathname))) {
        const plans = [...jobs.values()].filter((j) => j.kind === 'plan' && j.model.hash === m[1]);
        if (plans.length === 0) throw apiError(404, 'not_found', `no plan of a model with hash ${JSON.stringify(m[1])}`);
        return send(res, 200, { model: m[1], plans: plans.map((j) => ({ id: j.id, created_at: j.created, status: j.status, options: j.options, budget: j.options.budget ?? null, summary: j.status === 'done' ? j.doc.summary : null, error: j.error ?? null })) });
      }
      if (url.pathname.startsWith('/v1/')) throw apiError(404, 'not_found', `no route for ${req.method} ${url.pathname}`);
      if (req.method === 'GET') return serveStatic(res, url.pathname);
      throw apiError(405, 'method_not_allowed', `${req.method} ${url.pathname}`);
    } catch (e) {
      sendError(res, e);
    }
  });
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const port = Number(process.argv[2] ?? 8099);
  const proxyTo = process.env.MOCK_PROXY || null;
  createMockServer({ proxyTo }).listen(port, '127.0.0.1', () => console.log(`${proxyTo ? `web/ from disk, API of ${proxyTo},` : 'mock remat'} on http://127.0.0.1:${port}`));
}
