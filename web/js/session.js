// What this browser tab remembers between views: the last uploaded model (bytes stay in memory,
// never in storage) and computed sweeps (sessionStorage, by model hash and dims).

export const session = {
  /** {bytes: ArrayBuffer, fileName, name, dims, hash|null} of the last upload, or null. */
  model: null,
};

const SWEEP_KEY = 'remat.sweep.';

/**
 * The key a sweep is kept under: its model, its dims (names sorted), since one model's
 * frontier at batch 2 is not its frontier at batch 19, and the solver that swept it (a plan's
 * page sweeps with the plan's solver: a chen-sqrt frontier is not auto's). `null` without a
 * hash. Without a solver (a captured graph's torch-sac sweep) the key has none.
 */
export function sweepKey(hash, dims, solver = null) {
  if (!hash) return null;
  const d = dims ?? {};
  const key = `${hash}|${Object.keys(d).sort().map((k) => `${k}=${d[k]}`).join(',')}`;
  return solver ? `${key}|solver=${solver}` : key;
}

export function saveSweep(key, record) {
  if (!key) return;
  try {
    sessionStorage.setItem(SWEEP_KEY + key, JSON.stringify(record));
  } catch {
    // Full or disabled storage: the sweep is shown now and computed again next time.
  }
}

export function loadSweep(key) {
  if (!key) return null;
  try {
    const text = sessionStorage.getItem(SWEEP_KEY + key);
    return text ? JSON.parse(text) : null;
  } catch {
    return null;
  }
}

// The jobs this tab submitted (by kind and id): only those get a Cancel button while they run.
// In sessionStorage, so that a plan's page loaded again in this tab still offers it.
const JOBS_KEY = 'remat.jobs';
const ours = new Set();

function storedJobs() {
  try {
    return JSON.parse(sessionStorage.getItem(JOBS_KEY) ?? '[]');
  } catch {
    return [];
  }
}

/** Notes that this tab submitted the job (a POST answered with its id). */
export function rememberJob(kind, id) {
  if (!id) return;
  ours.add(`${kind}/${id}`);
  try {
    // The newest 200 are enough: a job runs for minutes, not for days.
    sessionStorage.setItem(JOBS_KEY, JSON.stringify([...new Set([...storedJobs(), `${kind}/${id}`])].slice(-200)));
  } catch {
    // Disabled storage: this page still knows its jobs.
  }
}

/** Did this tab submit the job? */
export function isOurJob(kind, id) {
  return ours.has(`${kind}/${id}`) || storedJobs().includes(`${kind}/${id}`);
}
