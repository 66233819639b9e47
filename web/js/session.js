// What this browser tab remembers between views: the last uploaded model (bytes stay in memory,
// never in storage) and computed sweeps (sessionStorage, by model hash).

export const session = {
  /** {bytes: ArrayBuffer, fileName, name, dims, hash|null} of the last upload, or null. */
  model: null,
};

const SWEEP_KEY = 'remat.sweep.';

export function saveSweep(hash, record) {
  if (!hash) return;
  try {
    sessionStorage.setItem(SWEEP_KEY + hash, JSON.stringify(record));
  } catch {
    // Full or disabled storage: the sweep is shown now and computed again next time.
  }
}

export function loadSweep(hash) {
  if (!hash) return null;
  try {
    const text = sessionStorage.getItem(SWEEP_KEY + hash);
    return text ? JSON.parse(text) : null;
  } catch {
    return null;
  }
}
