// Figures for list entries (history, recent plans) whose summary is missing: read from their
// plan records.

import { getPlan } from './api.js';
import { isNum } from './format.js';
import { normalizeRecord, planDims, setupKey } from './model.js';

/**
 * History entries without summary figures get them from their plan records (the 20 newest),
 * the current plan from its document; so do the dims of a plan that maximized one (the value
 * found is in its document only).
 */
export async function fillFigures(entries, currentId, doc, signal) {
  const apply = (e, d) => {
    e.budgetBytes = e.budgetBytes ?? d.budgetBytes;
    e.peakBytes = e.peakBytes ?? d.predicted.peakBytes;
    e.overhead = e.overhead ?? d.predicted.overhead;
    e.solver = d.solver ?? e.solver;
    if (e.setup === null && d.maximize) {
      e.dims = planDims(e.options, d.maximize);
      e.setup = setupKey(e.options, d.maximize);
    }
  };
  const missing = entries.filter((e) => e.status === 'done' && (!isNum(e.overhead) || e.setup === null));
  for (const e of missing) if (e.id === currentId && doc) apply(e, doc);
  const fetchable = missing.filter((e) => e.id !== currentId).slice(-20);
  await Promise.all(
    fetchable.map(async (e) => {
      try {
        const r = normalizeRecord(await getPlan(e.id, signal));
        if (r.doc) apply(e, r.doc);
      } catch {
        // The entry keeps "—" for its figures; the history itself is still shown.
      }
    }),
  );
}

