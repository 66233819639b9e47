// Formatting of figures for display. Pure functions, no DOM: unit-tested under node.

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

/** Is `x` a finite number? */
export function isNum(x) {
  return typeof x === 'number' && Number.isFinite(x);
}

/** Bytes in binary units with three significant digits: 3288334336 -> "3.06 GiB". */
export function fmtBytes(bytes) {
  if (!isNum(bytes)) return '—';
  const sign = bytes < 0 ? '-' : '';
  let v = Math.abs(bytes);
  let u = 0;
  while (v >= 1024 && u < UNITS.length - 1) {
    v /= 1024;
    u += 1;
  }
  if (u === 0 && Math.round(v) < 1024) return `${sign}${Math.round(v)} B`;
  // Three significant digits of the value as rounded: 1023.8 MiB rounds to 1024 and reads
  // "1.00 GiB" (next to a budget of 1 GiB), 99.97 KiB reads "100 KiB", not "100.0".
  let text = v.toFixed(digitsFor(v));
  if (Number(text) >= 1024 && u < UNITS.length - 1) {
    v /= 1024;
    u += 1;
    text = v.toFixed(digitsFor(v));
  }
  text = v.toFixed(digitsFor(Number(text)));
  return `${sign}${text} ${UNITS[u]}`;
}

/** Decimals for three significant digits of a value in [1, 1024). */
function digitsFor(v) {
  return v >= 100 ? 0 : v >= 10 ? 1 : 2;
}

/** An exact integer with thousands separators: 3288334336 -> "3,288,334,336". */
export function fmtInt(n) {
  if (!isNum(n)) return '—';
  const s = Math.round(Math.abs(n)).toString().replace(/\B(?=(\d{3})+(?!\d))/g, ',');
  return n < 0 ? `-${s}` : s;
}

/** Exact bytes: "3,288,334,336 B". */
export function fmtBytesExact(bytes) {
  return isNum(bytes) ? `${fmtInt(bytes)} B` : '—';
}

/** An overhead fraction (0.1234 = +12.34 % compute) as "+12.34 %". */
export function fmtOverhead(x) {
  if (!isNum(x)) return '—';
  const pct = x * 100;
  const sign = pct < 0 ? '−' : '+';
  return `${sign}${Math.abs(pct).toFixed(2)} %`;
}

/** A fraction as a percentage: 0.5 -> "50.0 %". */
export function fmtPct(x, digits = 1) {
  return isNum(x) ? `${(x * 100).toFixed(digits)} %` : '—';
}

/** A ratio such as a budget fraction of the store-all peak: 0.6 -> "0.60×". */
export function fmtRatio(x) {
  return isNum(x) ? `${x.toFixed(2)}×` : '—';
}

/** Seconds: 0.0123 -> "12.3 ms", 4.2 -> "4.20 s", 125 -> "2 min 5 s". */
export function fmtSeconds(s) {
  if (!isNum(s)) return '—';
  if (s < 1) return `${(s * 1000).toFixed(1)} ms`;
  if (s < 60) return `${s.toFixed(2)} s`;
  const m = Math.floor(s / 60);
  return `${m} min ${Math.round(s - m * 60)} s`;
}

/** A compute cost, compact: 1234567 -> "1.23 M", 0.0000123 -> "1.23e-5". */
export function fmtCost(c) {
  if (!isNum(c)) return '—';
  const a = Math.abs(c);
  if (a > 0 && a < 0.01) return c.toExponential(2);
  if (a >= 1e12) return `${(c / 1e12).toFixed(2)} T`;
  if (a >= 1e9) return `${(c / 1e9).toFixed(2)} G`;
  if (a >= 1e6) return `${(c / 1e6).toFixed(2)} M`;
  if (a >= 1e4) return `${(c / 1e3).toFixed(1)} k`;
  if (Number.isInteger(c)) return String(c);
  return c.toPrecision(4);
}

/** A cost in its unit: seconds (the roofline's or measured) as "12.3 µs", "1.23 ms", "2.35 s";
 *  any other unit (FLOPs, a graph's own) as {@link fmtCost}. */
export function fmtCostIn(c, unit) {
  if (unit !== 'seconds' || !isNum(c)) return fmtCost(c);
  const a = Math.abs(c);
  if (a < 1e-3) return `${(c * 1e6).toPrecision(3)} µs`;
  if (a < 1) return `${(c * 1e3).toPrecision(3)} ms`;
  return fmtSeconds(c);
}

/** An ISO timestamp as "2026-11-29 11:02:03 UTC"; anything else is returned as is. */
export function fmtTime(iso) {
  if (typeof iso !== 'string' || iso === '') return '—';
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  return `${d.toISOString().slice(0, 19).replace('T', ' ')} UTC`;
}

/**
 * Parses a size the way the API accepts budgets: "123" bytes, "2GiB", "800MB", "1.5 GB".
 * Returns bytes or null. Fractions ("0.6x") are not sizes and give null.
 */
export function parseSize(text) {
  if (typeof text !== 'string') return null;
  const m = /^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgtp]?i?b?)\s*$/i.exec(text);
  if (!m) return null;
  const v = Number(m[1]);
  const unit = m[2].toLowerCase();
  const pow = { '': 0, b: 0, k: 1, m: 2, g: 3, t: 4, p: 5 }[unit.replace(/i?b$/, '').replace(/i$/, '') || ''];
  if (pow === undefined) return null;
  const base = unit.includes('i') ? 1024 : 1000;
  return Math.round(v * base ** pow);
}

/**
 * A budget as a request gave it (a plan's `options.budget`, shown where the plan has no figures:
 * failed or still running): bytes and sizes in binary units ("114427712" -> "109 MiB"), a
 * fraction of the store-all peak as "0.90× of store-all"; anything else as it is.
 */
export function fmtBudget(text) {
  if (isNum(text)) return fmtBytes(text);
  if (typeof text !== 'string' || text.trim() === '') return '—';
  const bytes = /^\s*[0-9]+(?:\.[0-9]+)?e[0-9]+\s*$/i.test(text) ? Number(text) : parseSize(text);
  if (bytes !== null) return fmtBytes(bytes);
  const m = /^\s*([0-9]+(?:\.[0-9]+)?)\s*x\s*$/i.exec(text);
  if (m) return `${fmtRatio(Number(m[1]))} of store-all`;
  return text;
}
