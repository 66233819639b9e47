//! A lower bound on the compute cost of every schedule within a budget that scales to graphs of
//! tens of thousands of nodes: the *time-point relaxation*.
//!
//! Checkmate's stage model (the MILP and LP bounds of [`crate::ilp`]) has a variable per pair
//! of nodes and stops scaling at a few thousand; its bounds also hold only for its stage
//! schedules. This relaxation looks at a schedule at moments that every schedule has, whatever
//! its order:
//!
//! - `τ₀`, the first computation of the *pivot*: the loss (or, in a graph without one, the
//!   first backward node). Every forward value the pivot descends from has been computed at
//!   least once by then.
//! - `τ_1 < … < τ_K`, the first computations of the backward nodes `a_1 … a_K` of the *spine*:
//!   a chain of descendants of the pivot, each an ancestor of the next, so that
//!   `τ₀ < τ_1 < … < τ_K` in every schedule. The spine is the heaviest such chain by the bytes
//!   its nodes read and write (on a transformer it runs through every block's backward).
//!
//! One of these moments is the *snapshot* `τ_s` (the pivot, or a spine point). Variables, per
//! non-backward value `v`: `z_v`, "v is computed after `τ_s`" (a recomputation when `v` is an
//! ancestor of the pivot, costing `c_v`; possibly a first computation, free here, otherwise),
//! and `y_v`, "v is resident at `τ_s`"; per backward value `g` held across a spine point:
//! `w_g`, "g is computed a second time" (costing `c_g`). What every schedule satisfies:
//!
//! 1. *Recomputation needs its inputs*: `z_v <= y_u + z_u` for each input `u` of `v` (when `v`
//!    is computed after `τ_s`, `u` is resident then: kept since `τ_s` or computed after it).
//! 2. *A value read after the snapshot is kept or recomputed*: `y_v + z_v >= 1` for every
//!    value a backward node after `τ_s` reads (a descendant of the pivot or of `a_s`).
//! 3. *Memory at `τ_s`*: the snapshot's node and its inputs, every `v` with `y_v`, and every
//!    backward value computed before `τ_s` and read after it (an ancestor of `a_s` read by a
//!    descendant) that is never computed again, fit the budget.
//! 4. *Memory at each later spine point `τ_k`*: `a_k` and its inputs, every non-backward value
//!    that a strict descendant of `a_k` reads and that is not computed after `τ_s` (it has been
//!    resident since before `τ_s` and is read after `τ_k`), and the held backward values as
//!    in 3., fit the budget.
//!
//! The compute cost is at least the store-all cost (every needed node once) plus
//! `Σ c_v z_v + Σ c_g w_g`, so the minimum of that over the rows above, relaxed to `[0, 1]` and
//! solved as an LP by HiGHS, is a lower bound on the cost of every schedule within the budget
//! (not only of Checkmate's stage schedules); when the LP is infeasible no schedule fits.
//! [`time_point_bound`] solves it for the pivot and for the [`SNAPSHOTS`] spine points near the
//! start of the backward that read and write the most bytes (where the kept values, the
//! recomputed ones and the backward's working set meet), and takes the largest.
//! What the relaxation does not see: a value recomputed twice counts once, and the memory of
//! values recomputed after the snapshot counts only through what recomputing them needs.
//!
//! Size: two columns per node and about a row per edge, plus one row per spine node, written
//! with running sums so that each holds a few terms (the values rows 4 count are nested along
//! the spine). A 96-layer GPT-2 (4,523 nodes) is about 9,000 columns, solved in a third of a
//! second (`docs/bench/transformers.md`).

use crate::cancel::Cancel;
use crate::error::{Result, SolverError};
use crate::highs_run::{self, Run};
use crate::problem::{NodeId, NodeKind, Problem};
use highs::{HighsModelStatus, RowProblem, Sense};
use std::time::{Duration, Instant};

/// Spine points near the start of the backward that serve as snapshots besides the pivot, and
/// how many of the first spine points they are chosen from (by the bytes their node reads and
/// writes).
pub const SNAPSHOTS: usize = 2;
const SNAPSHOT_SCAN: usize = 64;

/// How [`time_point_bound`] ended.
#[derive(Debug, Clone, PartialEq)]
pub struct TimePointBound {
    /// A lower bound on the compute cost of every schedule within the budget (the store-all
    /// cost included); `None` when every LP was cut short by the time limit or when the budget
    /// is proven infeasible.
    pub bound: Option<f64>,
    /// The relaxation has no solution: no schedule fits the budget.
    pub infeasible: bool,
    /// Spine length (time points after the pivot).
    pub spine: usize,
    /// Columns and rows of the largest LP solved.
    pub columns: usize,
    pub rows: usize,
    pub seconds: f64,
}

impl TimePointBound {
    fn empty(spine: usize) -> Self {
        TimePointBound {
            bound: None,
            infeasible: false,
            spine,
            columns: 0,
            rows: 0,
            seconds: 0.0,
        }
    }
}

/// The relaxation's structure, independent of the budget and of the snapshot.
#[derive(Debug, Clone)]
pub struct TimePoints {
    /// Non-backward needed values (the columns `y`, `z`), in natural order.
    values: Vec<NodeId>,
    /// Index of each node in `values` (`usize::MAX` for none).
    col: Vec<usize>,
    /// Whether `z_v` costs `c_v` (an ancestor of the pivot: computed before it at least once).
    before_pivot: Vec<bool>,
    /// The pivot.
    pivot: NodeId,
    /// The spine, in ancestor order.
    spine: Vec<NodeId>,
    /// Per value, the last spine index whose row counts it: the deepest spine point strictly
    /// before one of its backward readers (`None`: no reader after a spine point).
    last_row: Vec<Option<usize>>,
    /// Per value, whether a backward descendant of the pivot reads it.
    read_by_backward: Vec<bool>,
    /// Backward values held across spine points: `(g, first row, last row)`.
    held: Vec<(NodeId, usize, usize)>,
    /// Values that depend on a backward node (none in a training graph): no closure rows for
    /// them (dropping rows keeps the relaxation valid).
    free: Vec<bool>,
}

impl TimePoints {
    /// The structure of `p`, or `None` when it has no backward node (nothing to bound beyond
    /// the store-all cost).
    pub fn of(p: &Problem) -> Option<Self> {
        let n = p.len();
        let needed = p.needed();
        let kind = |v: NodeId| p.nodes[v].kind;
        let pivot = (0..n)
            .find(|&v| needed[v] && kind(v) == NodeKind::Loss)
            .or_else(|| (0..n).find(|&v| needed[v] && kind(v) == NodeKind::Backward))?;
        // Ancestors and descendants of the pivot.
        let mut anc = vec![false; n];
        anc[pivot] = true;
        for v in (0..=pivot).rev() {
            if anc[v] {
                for &d in p.deps(v) {
                    anc[d] = true;
                }
            }
        }
        anc[pivot] = false;
        let mut desc = vec![false; n];
        desc[pivot] = true;
        for v in pivot + 1..n {
            if needed[v] && p.deps(v).iter().any(|&d| desc[d]) {
                desc[v] = true;
            }
        }
        let backward = |v: NodeId| needed[v] && kind(v) == NodeKind::Backward;
        let values: Vec<NodeId> = (0..n).filter(|&v| needed[v] && !backward(v)).collect();
        let mut col = vec![usize::MAX; n];
        for (i, &v) in values.iter().enumerate() {
            col[v] = i;
        }
        let mut free = vec![false; values.len()];
        for (i, &v) in values.iter().enumerate() {
            let on_backward = p
                .deps(v)
                .iter()
                .any(|&d| backward(d) || (col[d] != usize::MAX && free[col[d]]));
            free[i] = on_backward;
        }
        let before_pivot: Vec<bool> = values
            .iter()
            .enumerate()
            .map(|(i, &v)| anc[v] && !free[i])
            .collect();

        // The spine: the heaviest chain of backward descendants of the pivot by the bytes
        // each reads and writes.
        let on_spine = |v: NodeId| backward(v) && desc[v] && v != pivot;
        let mut best = vec![0.0f64; n];
        let mut from = vec![usize::MAX; n];
        for v in (0..n).filter(|&v| on_spine(v)) {
            let (prev, pb) = p
                .deps(v)
                .iter()
                .filter(|&&d| on_spine(d))
                .map(|&d| (d, best[d]))
                .fold((usize::MAX, 0.0), |a, b| if b.1 > a.1 { b } else { a });
            best[v] = footprint(p, v) as f64 + pb;
            from[v] = prev;
        }
        let mut end = (0..n)
            .filter(|&v| on_spine(v))
            .max_by(|&a, &b| best[a].total_cmp(&best[b]).then(b.cmp(&a)));
        let mut spine = Vec::new();
        while let Some(v) = end {
            spine.push(v);
            end = (from[v] != usize::MAX).then_some(from[v]);
        }
        spine.reverse();
        let mut spine_at = vec![usize::MAX; n];
        for (k, &a) in spine.iter().enumerate() {
            spine_at[a] = k;
        }
        // deepest[u]: the largest k with a_k a strict ancestor of u (the spine is a chain, so
        // a_j is one too for every j <= k).
        let mut deepest: Vec<Option<usize>> = vec![None; n];
        for u in 0..n {
            let mut d: Option<usize> = None;
            for &x in p.deps(u) {
                let here = (spine_at[x] != usize::MAX).then_some(spine_at[x]);
                d = d.max(here).max(deepest[x]);
            }
            deepest[u] = d;
        }
        // earliest[g]: the least k with a_k a strict descendant of g.
        let mut earliest: Vec<Option<usize>> = vec![None; n];
        for g in (0..n).rev() {
            let mut e: Option<usize> = None;
            for &u in p.users(g) {
                let here = (spine_at[u] != usize::MAX).then_some(spine_at[u]);
                for c in [here, earliest[u]].into_iter().flatten() {
                    e = Some(e.map_or(c, |x: usize| x.min(c)));
                }
            }
            earliest[g] = e;
        }
        let last_read = |v: NodeId| -> Option<usize> {
            p.users(v)
                .iter()
                .filter(|&&u| backward(u) && desc[u])
                .filter_map(|&u| deepest[u])
                .max()
        };
        let last_row: Vec<Option<usize>> = values.iter().map(|&v| last_read(v)).collect();
        let read_by_backward: Vec<bool> = values
            .iter()
            .map(|&v| p.users(v).iter().any(|&u| backward(u) && desc[u]))
            .collect();
        let mut held = Vec::new();
        for g in (0..n).filter(|&g| on_spine(g)) {
            if let (Some(first), Some(last)) = (earliest[g], last_read(g)) {
                if first <= last {
                    held.push((g, first, last));
                }
            }
        }
        Some(TimePoints {
            values,
            col,
            before_pivot,
            pivot,
            spine,
            last_row,
            read_by_backward,
            held,
            free,
        })
    }

    /// Spine length.
    pub fn spine_len(&self) -> usize {
        self.spine.len()
    }

    /// The spine points used as snapshots besides the pivot: among the first
    /// [`SNAPSHOT_SCAN`], the [`SNAPSHOTS`] whose node reads and writes the most bytes.
    fn snapshots(&self, p: &Problem) -> Vec<usize> {
        let mut at: Vec<usize> = (0..self.spine.len().min(SNAPSHOT_SCAN)).collect();
        at.sort_by_key(|&k| (std::cmp::Reverse(footprint(p, self.spine[k])), k));
        at.truncate(SNAPSHOTS);
        at
    }
}

/// Bytes a node reads and writes.
fn footprint(p: &Problem, v: NodeId) -> u64 {
    p.bytes(v) + p.deps(v).iter().map(|&d| p.bytes(d)).sum::<u64>()
}

/// Solves the time-point relaxation of `p` at `budget` (fixed bytes included) for the pivot
/// and the chosen spine snapshots, within `time_limit` in all; the module's documentation says
/// what it is and why it bounds every schedule.
pub fn time_point_bound(p: &Problem, budget: u64, time_limit: Duration) -> Result<TimePointBound> {
    time_point_bound_within(p, budget, time_limit, time_limit, &Cancel::default())
}

/// [`time_point_bound`], with the pivot's relaxation (the first, and the one that bounds most
/// often) allowed `pivot_limit` even where that is more than `time_limit`; the snapshots after
/// it get what is left of `time_limit`. On graphs of tens of thousands of nodes the pivot's LP
/// alone takes seconds (1-2 s on a 384-layer GPT-2's 18,059 nodes). A raised `cancel` stops
/// it with [`SolverError::Cancelled`].
pub fn time_point_bound_within(
    p: &Problem,
    budget: u64,
    time_limit: Duration,
    pivot_limit: Duration,
    cancel: &Cancel,
) -> Result<TimePointBound> {
    let start = Instant::now();
    let Some(tp) = TimePoints::of(p) else {
        return Ok(TimePointBound {
            bound: Some(p.base_cost()),
            seconds: start.elapsed().as_secs_f64(),
            ..TimePointBound::empty(0)
        });
    };
    let mut out = TimePointBound::empty(tp.spine.len());
    let snapshots = std::iter::once(None).chain(tp.snapshots(p).into_iter().map(Some));
    for snapshot in snapshots {
        let limit = if snapshot.is_none() {
            time_limit.max(pivot_limit)
        } else {
            time_limit
        };
        let left = limit.saturating_sub(start.elapsed());
        if left.is_zero() {
            break;
        }
        cancel.check()?;
        let one = solve(p, &tp, budget, snapshot, left, cancel)?;
        out.columns = out.columns.max(one.columns);
        out.rows = out.rows.max(one.rows);
        if one.infeasible {
            out.infeasible = true;
            out.bound = None;
            break;
        }
        if let Some(b) = one.bound {
            out.bound = Some(out.bound.map_or(b, |x: f64| x.max(b)));
        }
    }
    out.seconds = start.elapsed().as_secs_f64();
    Ok(out)
}

/// The relaxation with its snapshot at the pivot (`None`) or at spine point `k`.
fn solve(
    p: &Problem,
    tp: &TimePoints,
    budget: u64,
    snapshot: Option<usize>,
    time_limit: Duration,
    cancel: &Cancel,
) -> Result<TimePointBound> {
    let start = Instant::now();
    let mut out = TimePointBound::empty(tp.spine.len());
    let Some(cap) = budget.checked_sub(p.fixed_bytes) else {
        out.infeasible = true;
        return Ok(out);
    };
    let base = p.base_cost();
    let max_bytes = p.nodes.iter().map(|n| n.bytes).max().unwrap_or(1).max(1) as f64;
    let unit = (max_bytes / 1024.0).max(1.0);
    let max_cost = p.nodes.iter().map(|n| n.cost).fold(0.0, f64::max);
    let cost_unit = if max_cost > 0.0 {
        max_cost / 1000.0
    } else {
        1.0
    };
    let b = |v: NodeId| p.bytes(v) as f64 / unit;
    let cap = cap as f64 / unit;
    // The snapshot's node, and the first spine row after it.
    let (at, first_row) = match snapshot {
        None => (tp.pivot, 0),
        Some(k) => (tp.spine[k], k + 1),
    };
    // Read after the snapshot: by a descendant of the pivot, or of a_k.
    let read_after = |i: usize| match snapshot {
        None => tp.read_by_backward[i],
        Some(k) => tp.last_row[i].is_some_and(|l| l >= k),
    };

    let mut lp = RowProblem::default();
    let nv = tp.values.len();
    let mut at_snapshot = vec![false; p.len()];
    at_snapshot[at] = true;
    for &u in p.deps(at) {
        at_snapshot[u] = true;
    }
    let mut y = Vec::with_capacity(nv);
    let mut z = Vec::with_capacity(nv);
    for (i, &v) in tp.values.iter().enumerate() {
        let lo = if at_snapshot[v] { 1.0 } else { 0.0 };
        y.push(lp.add_column(0.0, lo..=1.0));
        let c = if tp.before_pivot[i] {
            p.cost(v) / cost_unit
        } else {
            0.0
        };
        z.push(lp.add_column(c, 0.0..=1.0));
    }
    let mut rows = 0usize;
    // 1. Recomputation needs its inputs.
    for (i, &v) in tp.values.iter().enumerate() {
        if tp.free[i] {
            continue;
        }
        for &u in p.deps(v) {
            let j = tp.col[u];
            if j != usize::MAX {
                lp.add_row(..=0.0, [(z[i], 1.0), (y[j], -1.0), (z[j], -1.0)]);
                rows += 1;
            }
        }
    }
    // 2. Read after the snapshot: kept or recomputed.
    for i in (0..nv).filter(|&i| read_after(i)) {
        lp.add_row(1.0.., [(y[i], 1.0), (z[i], 1.0)]);
        rows += 1;
    }
    // Backward values held across spine points: w_g, "computed a second time".
    let mut w_of = vec![usize::MAX; p.len()];
    let mut w = Vec::with_capacity(tp.held.len());
    for (h, &(g, _, _)) in tp.held.iter().enumerate() {
        w_of[g] = h;
        w.push(lp.add_column(p.cost(g) / cost_unit, 0.0..=1.0));
    }
    // Held at spine point k (or at the snapshot, a spine point itself): computed before it,
    // read after it.
    let held_at = |h: usize, k: usize| {
        let (_, first, last) = tp.held[h];
        first <= k && k <= last
    };
    // 3. Memory at the snapshot: its node (a backward node, or the loss with no backward
    //    value yet) and the resident values.
    {
        let mut terms: Vec<_> = (0..nv).map(|i| (y[i], b(tp.values[i]))).collect();
        let mut rhs = cap;
        if tp.col[at] == usize::MAX {
            rhs -= b(at);
        }
        for &u in p.deps(at) {
            if tp.col[u] == usize::MAX {
                rhs -= b(u);
            }
        }
        if let Some(k) = snapshot {
            for h in (0..tp.held.len()).filter(|&h| held_at(h, k)) {
                let g = tp.held[h].0;
                if !at_snapshot[g] {
                    // b_g (1 − w_g)
                    terms.push((w[h], -b(g)));
                    rhs -= b(g);
                }
            }
        }
        lp.add_row(..=rhs, terms);
        rows += 1;
    }
    // 4. Memory at each later spine point, through two running sums: F_k, the values counted
    //    from their first row to their last one (nested), and G_k, the held backward values.
    let k_len = tp.spine.len();
    let later = first_row..k_len;
    let mut by_last: Vec<Vec<usize>> = vec![Vec::new(); k_len];
    for i in 0..nv {
        if let Some(k) = tp.last_row[i].filter(|&k| k >= first_row) {
            by_last[k].push(i);
        }
    }
    let mut starts: Vec<Vec<usize>> = vec![Vec::new(); k_len];
    let mut ends: Vec<Vec<usize>> = vec![Vec::new(); k_len];
    for (h, &(_, first, last)) in tp.held.iter().enumerate() {
        if last >= first_row {
            starts[first.max(first_row)].push(h);
            ends[last].push(h);
        }
    }
    let f: Vec<_> = later
        .clone()
        .map(|_| lp.add_column(0.0, 0.0..f64::INFINITY))
        .collect();
    let g: Vec<_> = later
        .clone()
        .map(|_| lp.add_column(0.0, 0.0..f64::INFINITY))
        .collect();
    let ix = |k: usize| k - first_row;
    for k in later.clone() {
        // F_k = F_{k+1} + Σ_{last = k} b_v (1 − z_v)
        let mut terms = vec![(f[ix(k)], 1.0)];
        if k + 1 < k_len {
            terms.push((f[ix(k + 1)], -1.0));
        }
        let mut rhs = 0.0;
        for &i in &by_last[k] {
            let bv = b(tp.values[i]);
            terms.push((z[i], bv));
            rhs += bv;
        }
        lp.add_row(rhs..=rhs, terms);
        // G_k = G_{k−1} + Σ_{first = k} b_g (1 − w_g) − Σ_{last = k−1} b_g (1 − w_g)
        let mut terms = vec![(g[ix(k)], 1.0)];
        if k > first_row {
            terms.push((g[ix(k - 1)], -1.0));
        }
        let mut rhs = 0.0;
        for &h in &starts[k] {
            let bg = b(tp.held[h].0);
            terms.push((w[h], bg));
            rhs += bg;
        }
        if k > first_row {
            for &h in &ends[k - 1] {
                let bg = b(tp.held[h].0);
                terms.push((w[h], -bg));
                rhs -= bg;
            }
        }
        lp.add_row(rhs..=rhs, terms);
        rows += 2;
    }
    for k in later {
        // F_k + G_k + (a_k and its inputs) − what of them F_k and G_k count already <= cap.
        let a = tp.spine[k];
        let mut terms = vec![(f[ix(k)], 1.0), (g[ix(k)], 1.0)];
        let mut held_const = b(a);
        let mut rhs_adj = 0.0;
        for &u in p.deps(a) {
            held_const += b(u);
            let i = tp.col[u];
            if i != usize::MAX {
                if tp.last_row[i].is_some_and(|l| l >= k) {
                    // Counted in F_k as b_u (1 − z_u): take it out again.
                    terms.push((z[i], b(u)));
                    rhs_adj += b(u);
                }
            } else if w_of[u] != usize::MAX && held_at(w_of[u], k) {
                terms.push((w[w_of[u]], b(u)));
                rhs_adj += b(u);
            }
        }
        lp.add_row(..=cap - held_const + rhs_adj, terms);
        rows += 1;
    }
    out.columns = 2 * nv + w.len() + 2 * (k_len - first_row);
    out.rows = rows;
    let opt = |name: &str| SolverError::Ilp(format!("HiGHS rejected option {name}"));
    // HiGHS 1.16's presolve has called a feasible model infeasible (`ilp::run`): "infeasible"
    // stands only once HiGHS gives it without presolve too.
    let solving = Instant::now();
    for presolve in [true, false] {
        let limit = time_limit
            .saturating_sub(solving.elapsed())
            .max(Duration::from_millis(10));
        let mut model = lp.clone().optimise(Sense::Minimise);
        model.make_quiet();
        model
            .try_set_option("time_limit", limit.as_secs_f64())
            .map_err(|_| opt("time_limit"))?;
        model
            .try_set_option("threads", 1)
            .map_err(|_| opt("threads"))?;
        if !presolve {
            model
                .try_set_option("presolve", "off")
                .map_err(|_| opt("presolve"))?;
        }
        out.infeasible = false;
        if let Run::Done(solved, _) = highs_run::solve(model, limit, cancel)? {
            match solved.status() {
                HighsModelStatus::Optimal => {
                    out.bound = Some(base + solved.objective_value() * cost_unit);
                }
                HighsModelStatus::Infeasible => out.infeasible = true,
                _ => {}
            }
        }
        if !out.infeasible {
            break;
        }
    }
    out.seconds = start.elapsed().as_secs_f64();
    Ok(out)
}
