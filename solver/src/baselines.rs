//! Baselines and the generic schedule generator they share.
//!
//! Every baseline chooses *what to keep* (a keep-set or a set of checkpoints) and lets one
//! generator turn that choice into an explicit `Compute` / `Free` schedule, recomputing what is
//! missing on demand. The generator can only emit valid schedules: a node is computed only
//! after every dependency has been made resident, and frees come from [`with_frees`].
//!
//! Phases. The *forward phase* is every needed node before the first node of kind
//! [`NodeKind::Backward`]; the rest is the *backward phase*. A problem without backward nodes
//! (a plain DAG such as Moccasin's random layered graphs) has an empty forward phase: every node
//! is processed by the on-demand rules of the backward phase.
//!
//! On plain DAGs these checkpoint baselines fit little: recomputing a dropped value on demand
//! pulls in its dropped ancestors too, so their peaks stay near or above store-all (on the
//! random layered graphs: `docs/bench/solver-tuning.md`). The budget module's peak descent,
//! which recomputes single values held across the peak, does much better there.

use crate::error::{Result, SolverError};
use crate::problem::{NodeId, NodeKind, Problem};
use crate::schedule::{simulate, store_all as store_all_schedule, with_frees, Schedule, Stats};

/// Store-all: every needed node once in the natural order, each value freed after its last use.
pub use crate::schedule::store_all;

/// The names [`baselines`] returns, in order.
pub const BASELINE_NAMES: [&str; 5] = [
    "store-all",
    "chen-sqrt",
    "chen-greedy",
    "every-k",
    "revolve",
];

/// One baseline's schedule, scored by [`simulate`].
#[derive(Debug, Clone, PartialEq)]
pub struct Baseline {
    pub name: &'static str,
    pub schedule: Schedule,
    pub stats: Stats,
    /// Whether the simulated peak is within the budget.
    pub feasible: bool,
}

// ---------------------------------------------------------------------------------------------
// The builder: a compute sequence plus the set of values it considers resident.
// ---------------------------------------------------------------------------------------------

/// Builds a compute sequence while tracking which values are resident. Only `Compute` order is
/// recorded; [`with_frees`] derives the frees, so a value the builder drops is freed right after
/// its last reader before it is computed again, and a value the builder keeps is freed after
/// its last reader overall.
pub(crate) struct Builder<'a> {
    p: &'a Problem,
    resident: Vec<bool>,
    pinned: Vec<bool>,
    computed: Vec<bool>,
    seq: Vec<NodeId>,
    mark: Vec<u64>,
    epoch: u64,
    stack: Vec<NodeId>,
    missing: Vec<NodeId>,
}

impl<'a> Builder<'a> {
    pub(crate) fn new(p: &'a Problem) -> Self {
        let n = p.len();
        Builder {
            p,
            resident: vec![false; n],
            pinned: vec![false; n],
            computed: vec![false; n],
            seq: Vec::with_capacity(2 * n),
            mark: vec![0; n],
            epoch: 0,
            stack: Vec::new(),
            missing: Vec::new(),
        }
    }

    pub(crate) fn is_resident(&self, v: NodeId) -> bool {
        self.resident[v]
    }

    /// Makes every node of `targets` resident, computing each missing ancestor once, in
    /// topological order, from what is resident. Returns the range of `seq` it appended.
    pub(crate) fn ensure(&mut self, targets: &[NodeId]) -> std::ops::Range<usize> {
        self.epoch += 1;
        let epoch = self.epoch;
        self.missing.clear();
        for &t in targets {
            if !self.resident[t] && self.mark[t] != epoch {
                self.mark[t] = epoch;
                self.stack.push(t);
            }
        }
        while let Some(v) = self.stack.pop() {
            self.missing.push(v);
            for &d in self.p.deps(v) {
                if !self.resident[d] && self.mark[d] != epoch {
                    self.mark[d] = epoch;
                    self.stack.push(d);
                }
            }
        }
        self.missing.sort_unstable();
        let start = self.seq.len();
        for &v in &self.missing {
            self.seq.push(v);
            self.resident[v] = true;
            self.computed[v] = true;
        }
        start..self.seq.len()
    }

    /// Marks `v` as not resident (it will be freed after its last reader so far and computed
    /// again when needed). Pinned values stay.
    pub(crate) fn drop_value(&mut self, v: NodeId) {
        if !self.pinned[v] {
            self.resident[v] = false;
        }
    }

    pub(crate) fn pin(&mut self, v: NodeId) {
        self.pinned[v] = true;
    }

    pub(crate) fn unpin(&mut self, v: NodeId) {
        self.pinned[v] = false;
    }

    /// Computes so far.
    pub(crate) fn len(&self) -> usize {
        self.seq.len()
    }

    pub(crate) fn seq_slice(&self, r: std::ops::Range<usize>) -> &[NodeId] {
        &self.seq[r]
    }

    /// Computes every needed node never computed so far (required outputs no later step
    /// reads), then returns the schedule with frees.
    pub(crate) fn finish(mut self, needed: &[bool]) -> Schedule {
        for (v, &need) in needed.iter().enumerate() {
            if need && !self.computed[v] {
                self.ensure(&[v]);
            }
        }
        with_frees(self.p, &self.seq)
    }
}

// ---------------------------------------------------------------------------------------------
// Phases and the keep-set generator.
// ---------------------------------------------------------------------------------------------

/// The phase split of a problem.
#[derive(Debug, Clone)]
pub(crate) struct Phases {
    pub needed: Vec<bool>,
    /// Needed nodes before the first backward node (empty when there is none).
    pub forward: Vec<NodeId>,
    /// The other needed nodes, in natural order.
    pub backward: Vec<NodeId>,
}

impl Phases {
    pub(crate) fn of(p: &Problem) -> Self {
        let needed = p.needed();
        let split = p
            .nodes
            .iter()
            .position(|n| n.kind == NodeKind::Backward)
            .unwrap_or(0);
        let forward = (0..split).filter(|&v| needed[v]).collect();
        let backward = (split..p.len()).filter(|&v| needed[v]).collect();
        Phases {
            needed,
            forward,
            backward,
        }
    }

    /// The nodes checkpoint baselines choose from: the forward phase, or every needed node of
    /// a problem without backward nodes.
    pub(crate) fn linear(&self) -> &[NodeId] {
        if self.forward.is_empty() {
            &self.backward
        } else {
            &self.forward
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Lazy,
    /// Drop values not kept unless one of the next `window` nodes reads them.
    Eager(usize),
}

fn build_with_keep(p: &Problem, keep: &[bool], mode: Mode) -> Schedule {
    let ph = Phases::of(p);
    let kept = |v: NodeId| keep.get(v).copied().unwrap_or(false);
    let mut b = Builder::new(p);
    let n = p.len();

    // Forward phase: natural order; a value not kept is freed after its last forward-phase use.
    let mut in_forward = vec![false; n];
    for &v in &ph.forward {
        in_forward[v] = true;
    }
    let mut last_fwd_use: Vec<Option<NodeId>> = vec![None; n];
    for &v in &ph.forward {
        for &d in p.deps(v) {
            last_fwd_use[d] = Some(v);
        }
    }
    for &v in &ph.forward {
        b.ensure(&[v]);
        for &d in p.deps(v) {
            if last_fwd_use[d] == Some(v) && !kept(d) {
                b.drop_value(d);
            }
        }
        if last_fwd_use[v].is_none() && !kept(v) {
            b.drop_value(v);
        }
    }

    // Backward phase: natural order, missing dependencies recomputed from what is resident.
    let mut tpos = vec![usize::MAX; n];
    for (k, &t) in ph.backward.iter().enumerate() {
        tpos[t] = k;
    }
    let mut touched: Vec<NodeId> = Vec::new();
    for (k, &t) in ph.backward.iter().enumerate() {
        let r = b.ensure(p.deps(t));
        b.ensure(&[t]);
        if let Mode::Eager(window) = mode {
            touched.clear();
            touched.extend_from_slice(b.seq_slice(r));
            touched.extend_from_slice(p.deps(t));
            touched.push(t);
            for &v in &touched {
                if kept(v) {
                    continue;
                }
                let soon = p
                    .users(v)
                    .iter()
                    .any(|&u| tpos[u] != usize::MAX && tpos[u] > k && tpos[u] <= k + window);
                if !soon {
                    b.drop_value(v);
                }
            }
        }
    }
    b.finish(&ph.needed)
}

/// The generic schedule generator from a keep-set (`keep[v]`: hold `v` from its computation to
/// its last use; missing entries count as `false`).
///
/// The forward phase is computed in natural order and a value not kept is freed after its last
/// use in the forward phase. The backward phase is then processed in natural order: before a
/// node is computed, every missing dependency is recomputed (with its own missing ancestors,
/// each once, in topological order) from the resident values. Every value is freed right after
/// its last use in the final compute sequence ([`with_frees`]), so a recomputed segment stays
/// only as long as later nodes read it. The result is always valid under [`simulate`].
///
/// For a problem without backward nodes nothing is ever freed early here, so this is
/// store-all; see [`schedule_with_checkpoints_eager`].
pub fn schedule_with_checkpoints(p: &Problem, keep: &[bool]) -> Schedule {
    build_with_keep(p, keep, Mode::Lazy)
}

/// Like [`schedule_with_checkpoints`] but, in the backward phase, drops every value that is not
/// kept as soon as the next node does not read it (recomputed values included), recomputing it
/// again on demand: less memory, more compute. On a problem without backward nodes this is the
/// general "keep-set" semantics: kept values live to their last use, the others only while the
/// next node reads them.
pub fn schedule_with_checkpoints_eager(p: &Problem, keep: &[bool]) -> Schedule {
    build_with_keep(p, keep, Mode::Eager(1))
}

/// [`schedule_with_checkpoints_eager`] with a lookahead: a value not kept is dropped only when
/// none of the next `window` nodes of the backward phase reads it (`window = 1` is the eager
/// generator; a window as long as the phase is the lazy one).
pub fn schedule_with_lookahead(p: &Problem, keep: &[bool], window: usize) -> Schedule {
    build_with_keep(p, keep, Mode::Eager(window.max(1)))
}

/// The budget-aware generator: the lazy schedule when its simulated peak fits `budget`;
/// otherwise the cheapest fitting schedule among lookahead windows 32, 8, 2 and 1 (shorter
/// windows drop values sooner: less memory, more recomputation), or the lowest-peak one when
/// none fits.
pub fn schedule_with_checkpoints_within(p: &Problem, keep: &[bool], budget: u64) -> Schedule {
    let mut best = Best::new(budget);
    offer_within(p, keep, &mut best);
    match best.best {
        Some((s, _)) => s,
        None => schedule_with_checkpoints(p, keep),
    }
}

/// Offers the lazy schedule of `keep` and, when it does not fit, the lookahead ones (longest
/// window first, stopping at the first that fits or when the search is spent).
fn offer_within(p: &Problem, keep: &[bool], best: &mut Best) {
    if best.offer(p, schedule_with_checkpoints(p, keep)) {
        return;
    }
    for window in WINDOWS {
        if best.offer(p, schedule_with_lookahead(p, keep, window)) || best.spent() {
            return;
        }
    }
}

/// Lookahead windows [`schedule_with_checkpoints_within`] tries, longest (cheapest) first.
const WINDOWS: [usize; 4] = [32, 8, 2, 1];

// ---------------------------------------------------------------------------------------------
// Candidate selection.
// ---------------------------------------------------------------------------------------------

/// Keeps the cheapest feasible candidate, or the lowest-peak one while none is feasible.
/// Also counts the schedule steps generated, so that searches stop after [`WORK_LIMIT`].
pub(crate) struct Best {
    budget: u64,
    pub(crate) best: Option<(Schedule, Stats)>,
    work: usize,
}

/// Schedule steps a baseline's candidate search may generate before it stops trying further
/// candidates: the recompute-on-demand schedules of plain DAGs run to hundreds of thousands of
/// steps on 1,000-node graphs (what this bound keeps the baselines' time at:
/// `docs/bench/solver-tuning.md`).
pub(crate) const WORK_LIMIT: usize = 1_000_000;

impl Best {
    pub(crate) fn new(budget: u64) -> Self {
        Best {
            budget,
            best: None,
            work: 0,
        }
    }

    /// Whether the search has generated more than [`WORK_LIMIT`] steps.
    pub(crate) fn spent(&self) -> bool {
        self.work > WORK_LIMIT
    }

    /// Scores `s`; returns whether it is feasible.
    pub(crate) fn offer(&mut self, p: &Problem, s: Schedule) -> bool {
        self.work += s.steps.len();
        let Ok(stats) = simulate(p, &s) else {
            return false;
        };
        let fits = stats.peak_bytes <= self.budget;
        let better = match &self.best {
            None => true,
            Some((_, b)) => {
                let b_fits = b.peak_bytes <= self.budget;
                match (fits, b_fits) {
                    (true, false) => true,
                    (false, true) => false,
                    (true, true) => {
                        (stats.compute_cost, stats.peak_bytes) < (b.compute_cost, b.peak_bytes)
                    }
                    (false, false) => {
                        (stats.peak_bytes, stats.compute_cost) < (b.peak_bytes, b.compute_cost)
                    }
                }
            }
        };
        if better {
            self.best = Some((s, stats));
        }
        fits
    }

    fn into_baseline(self, p: &Problem, name: &'static str) -> Result<Baseline> {
        let (schedule, stats) = match self.best {
            Some(b) => b,
            None => {
                let s = store_all_schedule(p);
                let stats = simulate(p, &s)?;
                (s, stats)
            }
        };
        Ok(Baseline {
            name,
            feasible: stats.peak_bytes <= self.budget,
            schedule,
            stats,
        })
    }
}

/// Keep-set with the given linear positions checkpointed, plus every backward-phase value (so
/// eager mode never recomputes gradients).
fn keep_from_positions(p: &Problem, ph: &Phases, positions: &[usize]) -> Vec<bool> {
    let mut keep = vec![false; p.len()];
    if !ph.forward.is_empty() {
        for &v in &ph.backward {
            keep[v] = true;
        }
    }
    let lin = ph.linear();
    for &i in positions {
        if let Some(&v) = lin.get(i) {
            keep[v] = true;
        }
    }
    keep
}

/// Positions of every k-th linear node (k-1, 2k-1, ...).
fn every_k_positions(len: usize, k: usize) -> Vec<usize> {
    if k == 0 {
        return Vec::new();
    }
    (1..=len / k).map(|i| i * k - 1).collect()
}

/// Linear positions that are split points of the forward graph: no edge from an earlier
/// position reaches past them (Chen et al.'s "possible split points").
pub(crate) fn split_points(p: &Problem, lin: &[NodeId]) -> Vec<bool> {
    let mut pos = vec![usize::MAX; p.len()];
    for (i, &v) in lin.iter().enumerate() {
        pos[v] = i;
    }
    let mut reach = vec![0usize; lin.len()];
    for (i, &v) in lin.iter().enumerate() {
        reach[i] = p
            .users(v)
            .iter()
            .filter_map(|&u| (pos[u] != usize::MAX).then_some(pos[u]))
            .max()
            .unwrap_or(i);
    }
    let mut out = vec![false; lin.len()];
    let mut max_before = 0usize;
    for i in 0..lin.len() {
        out[i] = i == 0 || max_before <= i;
        max_before = max_before.max(reach[i]);
    }
    out
}

/// Chen et al. 2016 √n: checkpoint every ⌈√n⌉-th node of the linearized forward graph.
pub fn chen_sqrt(p: &Problem, budget: u64) -> Result<Baseline> {
    let ph = Phases::of(p);
    let n = ph.linear().len();
    let k = (n as f64).sqrt().ceil().max(1.0) as usize;
    let keep = keep_from_positions(p, &ph, &every_k_positions(n, k));
    let mut best = Best::new(budget);
    offer_within(p, &keep, &mut best);
    best.into_baseline(p, "chen-sqrt")
}

/// Chen et al. 2016 greedy (their Algorithm 2): walk the forward order accumulating output
/// bytes and checkpoint the first split point where the running size exceeds a threshold `b`;
/// `b` is searched over a geometric grid for the cheapest schedule within the budget.
pub fn chen_greedy(p: &Problem, budget: u64) -> Result<Baseline> {
    let ph = Phases::of(p);
    let lin = ph.linear().to_vec();
    let splits = split_points(p, &lin);
    let sizes: Vec<u64> = lin.iter().map(|&v| p.bytes(v)).collect();
    let total: u64 = sizes.iter().sum();
    let smallest = sizes.iter().copied().filter(|&s| s > 0).min().unwrap_or(1);
    let mut thresholds = vec![0u64];
    let steps = 96;
    let (lo, hi) = (smallest as f64, total.max(smallest) as f64);
    for i in 0..=steps {
        let t = lo * (hi / lo).powf(i as f64 / steps as f64);
        thresholds.push(t as u64);
    }
    thresholds.sort_unstable();
    thresholds.dedup();
    let mut best = Best::new(budget);
    let mut seen: Vec<Vec<usize>> = Vec::new();
    for b in thresholds {
        let mut temp = 0u64;
        let mut chosen = Vec::new();
        for i in 0..lin.len() {
            temp += sizes[i];
            if temp > b && splits[i] {
                chosen.push(i);
                temp = 0;
            }
        }
        if seen.contains(&chosen) {
            continue;
        }
        let keep = keep_from_positions(p, &ph, &chosen);
        offer_within(p, &keep, &mut best);
        seen.push(chosen);
        if best.spent() {
            break;
        }
    }
    best.into_baseline(p, "chen-greedy")
}

/// The k every-k tries: ⌈√n⌉ first, then every k up to 256 forward nodes and every k up to 16
/// plus a geometric progression (×1.25) beyond; `n + 1` means no checkpoint.
fn every_k_candidates(n: usize) -> Vec<usize> {
    let root = (n as f64).sqrt().ceil().max(1.0) as usize;
    let mut ks = vec![root];
    if n <= 256 {
        ks.extend(1..=n + 1);
    } else {
        ks.extend(1..=16);
        let mut k = 16.0f64;
        while (k as usize) <= n {
            ks.push(k as usize);
            k *= 1.25;
        }
        ks.push(n + 1);
    }
    let mut seen = vec![false; n + 2];
    ks.retain(|&k| !std::mem::replace(&mut seen[k], true));
    ks
}

/// Every-k segments: checkpoint every k-th forward node, trying every k (and no checkpoint at
/// all; see `every_k_candidates` for long graphs), keeping the cheapest schedule within the
/// budget. All searches stop after generating [`WORK_LIMIT`] schedule steps.
pub fn every_k(p: &Problem, budget: u64) -> Result<Baseline> {
    let ph = Phases::of(p);
    let n = ph.linear().len();
    let mut best = Best::new(budget);
    for k in every_k_candidates(n) {
        let keep = keep_from_positions(p, &ph, &every_k_positions(n, k));
        offer_within(p, &keep, &mut best);
        if best.spent() {
            break;
        }
    }
    best.into_baseline(p, "every-k")
}

// ---------------------------------------------------------------------------------------------
// Revolve.
// ---------------------------------------------------------------------------------------------

/// Split table of binomial checkpointing for uniform steps: `cost(l, s)` forward steps reverse
/// `l` stages from a checkpoint with `s` free slots; `split(l, s)` is the best first
/// checkpoint offset (the smallest of the best). Columns are added one slot count at a time.
///
/// `cost(l, s) = min over 1 ≤ i ≤ l of i + cost(l − i, s − 1) + cost(i − 1, s)`. Each column
/// is convex in `l` (its differences never decrease; the s = 0 column's are 1, 2, 3, …, and
/// an infimal convolution of convex sequences is convex), so the term is convex in `i` and
/// its first minimum is where its difference turns non-negative: a bisection, `O(m log m)` a
/// column instead of the scan's `m²/2`. Convexity is checked as the column is built, not
/// assumed: where it fails the entry is found by the scan, so the table is the scan's either
/// way (`tests::the_bisected_table_is_the_scanned_one`).
struct RevolveTable {
    cost: Vec<Vec<u64>>,
    split: Vec<Vec<usize>>,
    len: usize,
}

/// Whether `col`'s difference at `upto` is at least the one before it.
fn bends_up(col: &[u64], upto: usize) -> bool {
    upto < 2 || {
        let (a, b, c) = (
            col[upto - 2] as i128,
            col[upto - 1] as i128,
            col[upto] as i128,
        );
        b - a <= c - b
    }
}

impl RevolveTable {
    fn new(len: usize) -> Self {
        // s = 0: every stage j is reached by advancing from the checkpoint: 1 + 2 + ... + l.
        let cost0 = (0..=len as u64).map(|l| l * (l + 1) / 2).collect();
        RevolveTable {
            cost: vec![cost0],
            split: vec![vec![0; len + 1]],
            len,
        }
    }

    fn ensure_slots(&mut self, s: usize) {
        while self.cost.len() <= s {
            let prev = &self.cost[self.cost.len() - 1];
            let mut cost = vec![0u64; self.len + 1];
            let mut split = vec![0usize; self.len + 1];
            // Whether the previous column and this one so far bend up.
            let mut convex = (2..prev.len()).all(|l| bends_up(prev, l));
            for l in 1..=self.len {
                let term = |i: usize, cost: &[u64]| i as u64 + prev[l - i] + cost[i - 1];
                let best = if convex {
                    // The smallest i in 1..=l whose next term is no smaller.
                    let (mut lo, mut hi) = (1, l);
                    while lo < hi {
                        let mid = lo + (hi - lo) / 2;
                        if term(mid + 1, &cost) >= term(mid, &cost) {
                            hi = mid;
                        } else {
                            lo = mid + 1;
                        }
                    }
                    (term(lo, &cost), lo)
                } else {
                    let mut best = (u64::MAX, 1);
                    for i in 1..=l {
                        let c = term(i, &cost);
                        if c < best.0 {
                            best = (c, i);
                        }
                    }
                    best
                };
                (cost[l], split[l]) = best;
                convex &= bends_up(&cost, l);
            }
            self.cost.push(cost);
            self.split.push(split);
        }
    }

    /// The first checkpoint's offset. With a slot for every stage but the last (`s + 1 ≥ l`)
    /// it is 1, each stage once (cost `l`, the least there is), without the table's column.
    fn split(&self, l: usize, s: usize) -> usize {
        if s + 1 >= l {
            return 1;
        }
        self.split
            .get(s)
            .and_then(|col| col.get(l))
            .copied()
            .unwrap_or(1)
            .clamp(1, l.max(1))
    }

    /// The most slot columns within [`REVOLVE_TABLE_WORK`] on a chain of `len` stages (each
    /// column about `len · log₂ len` steps of the bisection).
    fn columns_within_work(len: usize) -> usize {
        let per_column = (len as u64 + 1) * (u64::from(usize::BITS - len.leading_zeros()) + 1);
        usize::try_from(REVOLVE_TABLE_WORK / per_column).unwrap_or(usize::MAX)
    }
}

/// Steps of the table's recurrence revolve may spend on one chain: on a chain of 12,000 stages
/// (a 12,000-node forward phase that is a chain) its first 111 slot counts.
const REVOLVE_TABLE_WORK: u64 = 20_000_000;

/// The chain revolve reverses: `states` are the linear positions whose values are its
/// checkpoint candidates (increasing, the first 0), `stage_of[i]` the last state at or before
/// position `i`. With `tape`, the values recomputed in a stage that a backward node reads stay
/// resident until the backward phase is below that stage (the stage is reversed from its
/// state, as revolve reverses a layer); without, every position is a state and each value is
/// recomputed from a checkpoint whenever it is read again.
struct Chain {
    states: Vec<usize>,
    stage_of: Vec<usize>,
    tape: bool,
}

impl Chain {
    fn new(states: Vec<usize>, len: usize, tape: bool) -> Self {
        let mut stage_of = vec![0usize; len];
        let mut g = 0;
        for (i, stage) in stage_of.iter_mut().enumerate() {
            while g + 1 < states.len() && states[g + 1] <= i {
                g += 1;
            }
            *stage = g;
        }
        Chain {
            states,
            stage_of,
            tape,
        }
    }

    /// Every position a state, no tape: revolve on the forward phase node by node.
    fn of_nodes(len: usize) -> Self {
        Chain::new((0..len).collect(), len, false)
    }

    /// The split points a state, with the tape: revolve on the chain of stages between them.
    fn of_split_points(p: &Problem, lin: &[NodeId]) -> Self {
        let states = split_points(p, lin)
            .iter()
            .enumerate()
            .filter_map(|(i, &s)| s.then_some(i))
            .collect();
        Chain::new(states, lin.len(), true)
    }
}

/// Revolve with `slots` checkpoint slots on `chain` over the linearized forward phase: whenever
/// a backward node needs a forward value that is gone, it advances from the nearest checkpoint
/// below to the state of the value's stage, placing checkpoints at the binomial split points
/// (in stages) while slots are free, and recomputes the value from that state; checkpoints
/// above the current backward position are released. `None` once its compute order is longer
/// than `limit` (few slots on a long chain: quadratic in its length).
fn revolve_with_slots(
    p: &Problem,
    ph: &Phases,
    chain: &Chain,
    table: &RevolveTable,
    slots: usize,
    limit: usize,
) -> Option<Schedule> {
    let lin = &ph.forward;
    let (states, stage_of) = (&chain.states, &chain.stage_of);
    let n = p.len();
    let mut pos = vec![usize::MAX; n];
    for (i, &v) in lin.iter().enumerate() {
        pos[v] = i;
    }
    let mut b = Builder::new(p);
    let mut pinned: Vec<usize> = Vec::new(); // positions of states, increasing
    let mut next_mark = vec![usize::MAX; n];
    let mut touched = Vec::new();
    let mut key = lin.len();
    // With the tape: the values recomputed in a stage that a backward node reads, kept until
    // the backward phase is below that stage.
    let mut taped: Vec<NodeId> = Vec::new();
    let mut on_tape = vec![false; n];
    for (k, &t) in ph.backward.iter().enumerate() {
        let fwd_deps: Vec<usize> = p
            .deps(t)
            .iter()
            .filter_map(|&d| (pos[d] != usize::MAX).then_some(pos[d]))
            .collect();
        if let Some(&m) = fwd_deps.iter().max() {
            key = m;
        }
        while pinned.last().is_some_and(|&c| c > key) {
            if let Some(c) = pinned.pop() {
                b.unpin(lin[c]);
            }
        }
        if chain.tape {
            let key_stage = stage_of.get(key).copied().unwrap_or(usize::MAX);
            taped.retain(|&v| {
                let keep = stage_of[pos[v]] <= key_stage;
                if !keep {
                    on_tape[v] = false;
                    b.drop_value(v);
                }
                keep
            });
        }
        let mut wanted = fwd_deps.clone();
        wanted.sort_unstable_by(|a, b| b.cmp(a));
        for j in wanted {
            if b.is_resident(lin[j]) {
                continue;
            }
            let g = stage_of[j];
            // Advance from the nearest checkpoint below the stage's state.
            while !b.is_resident(lin[states[g]]) {
                let c = pinned.iter().rev().find(|&&c| c < states[g]).copied();
                let from = c.map_or(0, |c| stage_of[c] + 1);
                let l = g + 1 - from; // stages from..=g still to produce
                let free = slots.saturating_sub(pinned.len());
                if free == 0 || l <= 1 {
                    break;
                }
                let at = from + table.split(l, free) - 1;
                if at >= g {
                    break;
                }
                let r = b.ensure(&[lin[states[at]]]);
                let stepping: Vec<NodeId> = b.seq_slice(r).to_vec();
                b.pin(lin[states[at]]);
                pinned.push(states[at]);
                pinned.sort_unstable();
                for v in stepping {
                    if pos[v] != usize::MAX {
                        b.drop_value(v);
                    }
                }
            }
            let r = b.ensure(&[lin[j]]);
            let stepping: Vec<NodeId> = b.seq_slice(r).to_vec();
            for v in stepping {
                if pos[v] == usize::MAX {
                    continue;
                }
                if chain.tape && stage_of[pos[v]] == g {
                    if !std::mem::replace(&mut on_tape[v], true) {
                        taped.push(v);
                    }
                } else if v != lin[j] {
                    b.drop_value(v);
                }
            }
        }
        let r = b.ensure(p.deps(t));
        b.ensure(&[t]);
        // Drop forward values the next backward node does not read (the tape's stay).
        if let Some(&next) = ph.backward.get(k + 1) {
            for &d in p.deps(next) {
                next_mark[d] = k;
            }
        }
        touched.clear();
        touched.extend_from_slice(b.seq_slice(r));
        touched.extend_from_slice(p.deps(t));
        for &v in &touched {
            if pos[v] != usize::MAX && next_mark[v] != k && !on_tape[v] {
                b.drop_value(v);
            }
        }
        if b.len() > limit {
            return None;
        }
    }
    Some(b.finish(&ph.needed))
}

/// Schedule steps revolve may build per chain, abandoned schedules included (a schedule is
/// abandoned past [`WORK_LIMIT`] steps; about 25 ms a million steps on a 2-core machine).
const REVOLVE_WORK: usize = 2 * WORK_LIMIT;

/// Revolve on one chain, in two phases of at most [`REVOLVE_WORK`] steps each, every schedule
/// offered to `best`. First every slot count from 0 up, until one does not fit after one did
/// (more slots shorten the schedule and, as a rule, raise its peak, so the cheapest within the
/// budget is near the most slots that fit). Then a doubling from the last count it tried, and
/// a bisection between the last count that fit and the first that did not after it: on a long
/// chain the best count is too far up for the first phase to reach, and on others the peak
/// does not always rise with the slots.
fn revolve_on(p: &Problem, ph: &Phases, chain: &Chain, best: &mut Best) {
    let stages = chain.states.len();
    let mut table = RevolveTable::new(stages);
    // Slot counts up to `cap` have their table's columns; `stages` needs none.
    let cap = RevolveTable::columns_within_work(stages).min(stages);
    let work = std::cell::Cell::new(0usize);
    // Some(fits), or None when the schedule was abandoned or the phase's work is spent.
    let mut attempt = |slots: usize, best: &mut Best| -> Option<bool> {
        if work.get() > REVOLVE_WORK {
            return None;
        }
        table.ensure_slots(slots.min(cap));
        match revolve_with_slots(p, ph, chain, &table, slots, WORK_LIMIT) {
            Some(schedule) => {
                work.set(work.get() + schedule.steps.len());
                Some(best.offer(p, schedule))
            }
            None => {
                work.set(work.get() + WORK_LIMIT);
                None
            }
        }
    };
    let mut lo = None;
    let mut slots = 0;
    while slots <= cap && work.get() <= REVOLVE_WORK {
        match attempt(slots, best) {
            Some(true) => lo = Some(slots),
            Some(false) if lo.is_some() => break,
            _ => {}
        }
        slots += 1;
    }
    if slots > stages {
        return;
    }
    work.set(0);
    // Doubling within the table's columns, then every stage a checkpoint.
    let mut slots = slots.max(1);
    let mut hi = None;
    while work.get() <= REVOLVE_WORK {
        slots = if 2 * slots <= cap { 2 * slots } else { stages };
        match attempt(slots, best) {
            Some(true) => lo = Some(slots),
            Some(false) if lo.is_some() => {
                hi = Some(slots);
                break;
            }
            _ => {}
        }
        if slots == stages {
            break;
        }
    }
    if let (Some(mut lo), Some(hi)) = (lo, hi) {
        let mut hi = hi.min(cap + 1);
        while hi > lo + 1 {
            let mid = lo + (hi - lo) / 2;
            match attempt(mid, best) {
                Some(true) => lo = mid,
                Some(false) => hi = mid,
                None => break,
            }
        }
    }
}

/// Griewank's revolve (binomial checkpointing) on the linearized forward phase, twice: on the
/// chain of stages between its split points (Chen et al.'s, where one value separates what
/// comes before from what comes after: a network's layers), each stage reversed from its
/// state as revolve reverses a layer, and node by node, every value a checkpoint candidate and
/// recomputed whenever it is read again. Each with the slot counts [`revolve_on`] tries; the
/// cheapest schedule within the budget of both. A problem without backward nodes has nothing
/// to reverse: revolve is store-all there.
pub fn revolve(p: &Problem, budget: u64) -> Result<Baseline> {
    let ph = Phases::of(p);
    let mut best = Best::new(budget);
    if ph.forward.is_empty() {
        best.offer(p, store_all_schedule(p));
        return best.into_baseline(p, "revolve");
    }
    let m = ph.forward.len();
    let stages = Chain::of_split_points(p, &ph.forward);
    if stages.states.len() < m {
        revolve_on(p, &ph, &stages, &mut best);
    }
    revolve_on(p, &ph, &Chain::of_nodes(m), &mut best);
    if best.best.is_none() {
        return Err(SolverError::InvalidArgument(format!(
            "revolve: every schedule it built on the forward phase of {m} nodes ({} stages \
             between split points) was longer than {WORK_LIMIT} steps",
            stages.states.len()
        )));
    }
    best.into_baseline(p, "revolve")
}

/// Store-all as a baseline.
pub fn store_all_baseline(p: &Problem, budget: u64) -> Result<Baseline> {
    let mut best = Best::new(budget);
    best.offer(p, store_all_schedule(p));
    best.into_baseline(p, "store-all")
}

/// One baseline by name: "store-all", "chen-sqrt", "chen-greedy", "every-k" or "revolve".
pub fn baseline(p: &Problem, name: &str, budget: u64) -> Result<Baseline> {
    match name {
        "store-all" => store_all_baseline(p, budget),
        "chen-sqrt" => chen_sqrt(p, budget),
        "chen-greedy" => chen_greedy(p, budget),
        "every-k" => every_k(p, budget),
        "revolve" => revolve(p, budget),
        other => Err(SolverError::InvalidArgument(format!(
            "unknown baseline {other:?}; expected one of {}",
            BASELINE_NAMES.join(", ")
        ))),
    }
}

/// Every baseline for `budget`, in the order of [`BASELINE_NAMES`]. A budget-driven baseline
/// that cannot fit the budget returns its lowest-peak schedule with `feasible: false`.
pub fn baselines(p: &Problem, budget: u64) -> Vec<Baseline> {
    BASELINE_NAMES
        .iter()
        .filter_map(|name| {
            let t = std::time::Instant::now();
            let b = baseline(p, name, budget).ok();
            tracing::debug!(
                baseline = name,
                seconds = t.elapsed().as_secs_f64(),
                "baseline done"
            );
            b
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recurrence scanned over every split, as the table was first built.
    fn scanned(len: usize, slots: usize) -> (Vec<Vec<u64>>, Vec<Vec<usize>>) {
        let mut cost = vec![(0..=len as u64)
            .map(|l| l * (l + 1) / 2)
            .collect::<Vec<_>>()];
        let mut split = vec![vec![0; len + 1]];
        for s in 1..=slots {
            let mut c = vec![0u64; len + 1];
            let mut sp = vec![0usize; len + 1];
            for l in 1..=len {
                let mut best = (u64::MAX, 1);
                for i in 1..=l {
                    let t = i as u64 + cost[s - 1][l - i] + c[i - 1];
                    if t < best.0 {
                        best = (t, i);
                    }
                }
                (c[l], sp[l]) = best;
            }
            cost.push(c);
            split.push(sp);
        }
        (cost, split)
    }

    #[test]
    fn the_bisected_table_is_the_scanned_one() {
        for (len, slots) in [
            (0, 3),
            (1, 3),
            (2, 3),
            (3, 3),
            (7, 9),
            (64, 70),
            (301, 12),
            (1000, 4),
        ] {
            let mut table = RevolveTable::new(len);
            table.ensure_slots(slots);
            let (cost, split) = scanned(len, slots);
            assert_eq!(table.cost, cost, "costs, {len} stages");
            assert_eq!(table.split, split, "splits, {len} stages");
            // Every column bends up: the bisection, not the scan, built them.
            for col in &table.cost {
                assert!((2..col.len()).all(|l| bends_up(col, l)), "{len} stages");
            }
            // With a slot for every stage but the last, `split` needs no column: it is 1
            // (with no slot there is no checkpoint to place: column 0 is never asked).
            for (s, col) in split.iter().enumerate().skip(1) {
                for (l, &at) in col.iter().enumerate().skip(1) {
                    assert_eq!(table.split(l, s), at, "split({l}, {s}) of {len} stages");
                    if s + 1 >= l {
                        assert_eq!(at, 1, "split({l}, {s}) of {len} stages");
                    }
                }
            }
        }
    }

    /// Every schedule revolve builds, on either chain and with any number of slots, is valid
    /// (`Best::offer` would leave an invalid one out without a word).
    #[test]
    fn every_revolve_schedule_simulates() {
        use crate::testutil::{residual_blocks, training_chain};
        for p in [
            residual_blocks(12),
            training_chain(20, |i| 1.0 + i as f64, |i| 10 + i as u64),
        ] {
            let ph = Phases::of(&p);
            let m = ph.forward.len();
            for chain in [Chain::of_split_points(&p, &ph.forward), Chain::of_nodes(m)] {
                let stages = chain.states.len();
                let mut table = RevolveTable::new(stages);
                table.ensure_slots(stages);
                for slots in 0..=stages {
                    let s = revolve_with_slots(&p, &ph, &chain, &table, slots, usize::MAX)
                        .expect("no work limit");
                    let stats = simulate(&p, &s).unwrap_or_else(|e| {
                        panic!("{}: {slots} slots, tape {}: {e}", p.name, chain.tape)
                    });
                    assert!(stats.peak_bytes > 0);
                }
            }
        }
    }

    #[test]
    fn a_column_that_does_not_bend_up_is_scanned() {
        // A previous column that is not convex: the next one is the scan's all the same.
        let len = 40;
        let mut table = RevolveTable::new(len);
        table.cost[0] = (0..=len as u64).map(|l| (l * 37) % 23 + l * l).collect();
        assert!(!(2..=len).all(|l| bends_up(&table.cost[0], l)));
        table.ensure_slots(1);
        let prev = table.cost[0].clone();
        let mut c = vec![0u64; len + 1];
        for l in 1..=len {
            let best = (1..=l)
                .map(|i| (i as u64 + prev[l - i] + c[i - 1], i))
                .min_by_key(|&(t, i)| (t, i))
                .unwrap_or((u64::MAX, 1));
            c[l] = best.0;
            assert_eq!(table.split[1][l], best.1, "split at {l}");
        }
        assert_eq!(table.cost[1], c);
    }
}
