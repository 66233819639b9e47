// What this browser tab remembers between views: the last uploaded model (bytes stay in memory,
// never in storage) and computed sweeps (sessionStorage, by model hash and dims).

export const session = {
  /** {bytes: ArrayBuffer, fileName, name, dims, hash|null} of the last upload, or null. */
  model: null,
};

const SWEEP_KEY = 'remat.sweep.';

/**
 * The key a sweep is kept under: its model and its dims (names sorted), since one model's
 * frontier at batch 2 is not its frontier at batch 19. `null` without a hash.
 */
export function sweepKey(hash, dims) {
  if (!hash) return null;
  const d = dims ?? {};
  return `${hash}|${Object.keys(d).sort().map((k) => `${k}=${d[k]}`).join(',')}`;
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
