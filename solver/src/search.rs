//! Stage-form schedules and a local search that scales to thousands of nodes.
//!
//! Checkmate's schedules are made of stages: stage `t` recomputes some earlier values and ends
//! with the first computation of node `t`. Here a stage-form schedule is described by a
//! pair of *retention horizons* per value: `h[i]` is the last stage at whose start `i` is still
//! resident after its first computation (`h[i] == i` drops it right after its own stage), and
//! `keep[i]` the same for a copy recomputed at a later stage (recomputed before `keep[i]`, it
//! stays through `keep[i]`; otherwise it lives for its stage only). Given the horizons, each
//! stage recomputes exactly the values it needs that are not resident (Checkmate's "R given
//! S"), in topological order, and frees follow from [`with_frees`]. The search moves horizons
//! between the stages that read the value (greedy descent to feasibility, then simulated
//! annealing on cost plus a penalty on bytes over budget); every candidate is scored by
//! [`simulate`].

use crate::cancel::Cancel;
use crate::error::Result;
use crate::problem::{NodeId, Problem};
use crate::schedule::{simulate, with_frees, Schedule, Stats, Step};
use std::time::{Duration, Instant};

/// The needed nodes of a problem renumbered `0..m` in their natural order (stage `t` computes
/// local node `t`), with dependencies and users restricted to them.
#[derive(Debug, Clone)]
pub(crate) struct Local {
    /// Local index to problem index.
    pub nodes: Vec<NodeId>,
    /// Problem index to local index (`None` for nodes no training step needs).
    pub local: Vec<Option<usize>>,
    pub deps: Vec<Vec<usize>>,
    /// Users in increasing order.
    pub users: Vec<Vec<usize>>,
    pub bytes: Vec<u64>,
    #[cfg_attr(not(feature = "highs"), allow(dead_code))]
    pub cost: Vec<f64>,
}

impl Local {
    pub fn new(p: &Problem) -> Self {
        let needed = p.needed();
        let nodes: Vec<NodeId> = (0..p.len()).filter(|&v| needed[v]).collect();
        let mut local = vec![None; p.len()];
        for (l, &v) in nodes.iter().enumerate() {
            local[v] = Some(l);
        }
        // Dependencies of a needed node are needed, so every lookup succeeds; a missing one
        // is skipped rather than trusted.
        let deps: Vec<Vec<usize>> = nodes
            .iter()
            .map(|&v| p.deps(v).iter().filter_map(|&d| local[d]).collect())
            .collect();
        let mut users = vec![Vec::new(); nodes.len()];
        for (l, ds) in deps.iter().enumerate() {
            for &d in ds {
                users[d].push(l);
            }
        }
        Local {
            bytes: nodes.iter().map(|&v| p.bytes(v)).collect(),
            cost: nodes.iter().map(|&v| p.cost(v)).collect(),
            nodes,
            local,
            deps,
            users,
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The last stage that reads `i` (its own stage when nothing does).
    pub fn max_user(&self, i: usize) -> usize {
        self.users[i].last().copied().unwrap_or(i)
    }

    #[cfg_attr(not(feature = "highs"), allow(dead_code))]
    /// Splits a schedule's compute steps into stages: for each stage `t`, the local nodes
    /// (all `< t`) recomputed before node `t` is computed for the first time. `None` when the
    /// schedule is not in stage form (first computations out of the natural order, a node
    /// computed twice in one stage, or a node no training step needs).
    pub fn stages_of(&self, schedule: &Schedule) -> Option<Vec<Vec<usize>>> {
        let m = self.len();
        let mut stages: Vec<Vec<usize>> = Vec::with_capacity(m);
        let mut current: Vec<usize> = Vec::new();
        let mut seen_in_stage = vec![usize::MAX; m];
        for s in &schedule.steps {
            let Step::Compute(v) = *s else { continue };
            let l = (*self.local.get(v)?)?;
            let t = stages.len();
            if l == t {
                current.sort_unstable();
                stages.push(std::mem::take(&mut current));
            } else if l < t {
                if seen_in_stage[l] == t {
                    return None;
                }
                seen_in_stage[l] = t;
                current.push(l);
            } else {
                return None;
            }
        }
        (stages.len() == m && current.is_empty()).then_some(stages)
    }

    /// The compute order of a stage-form schedule (problem indices).
    #[cfg_attr(not(feature = "highs"), allow(dead_code))]
    pub fn computes_of(&self, stages: &[Vec<usize>]) -> Vec<NodeId> {
        let mut out = Vec::with_capacity(stages.iter().map(|s| s.len() + 1).sum());
        for (t, stage) in stages.iter().enumerate() {
            out.extend(stage.iter().map(|&i| self.nodes[i]));
            out.push(self.nodes[t]);
        }
        out
    }
}

/// Builds stage-form schedules from retention horizons.
struct Builder<'a> {
    g: &'a Local,
    mark: Vec<u32>,
    epoch: u32,
    stack: Vec<usize>,
    stage: Vec<usize>,
    /// `until[i]`: the last stage at whose start `i` is resident.
    until: Vec<usize>,
}

impl<'a> Builder<'a> {
    fn new(g: &'a Local) -> Self {
        Builder {
            g,
            mark: vec![0; g.len()],
            epoch: 0,
            stack: Vec::new(),
            stage: Vec::new(),
            until: vec![0; g.len()],
        }
    }

    /// Compute order (problem indices) for horizons `h` (after the first computation) and
    /// `keep` (after a recomputation: a value recomputed at stage `t < keep[i]` stays resident
    /// through stage `keep[i]`, otherwise only during stage `t`).
    fn computes(&mut self, h: &[usize], keep: &[usize]) -> Vec<NodeId> {
        let g = self.g;
        let mut out = Vec::with_capacity(2 * g.len());
        for (t, &ht) in h.iter().enumerate().take(g.len()) {
            self.epoch = self.epoch.wrapping_add(1);
            if self.epoch == 0 {
                self.mark.iter_mut().for_each(|m| *m = 0);
                self.epoch = 1;
            }
            self.stage.clear();
            self.stack.clear();
            self.stack.push(t);
            self.mark[t] = self.epoch;
            while let Some(x) = self.stack.pop() {
                for &d in &g.deps[x] {
                    // Resident at the start of stage t (every d < t was computed before).
                    if self.until[d] >= t || self.mark[d] == self.epoch {
                        continue;
                    }
                    self.mark[d] = self.epoch;
                    self.stage.push(d);
                    self.stack.push(d);
                }
            }
            self.stage.sort_unstable();
            for &d in &self.stage {
                self.until[d] = if keep[d] > t { keep[d] } else { t };
                out.push(g.nodes[d]);
            }
            self.until[t] = ht;
            out.push(g.nodes[t]);
        }
        out
    }
}

/// Small deterministic generator (xorshift64*), so the search needs no dependency and runs
/// are reproducible.
struct Rng(u64);

impl Rng {
    /// A generator whose state depends on every bit of `seed` (splitmix64), never zero.
    fn seeded(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// What the local search found.
#[derive(Debug, Clone)]
pub struct SearchOutcome {
    /// The best schedule within the budget, if any was found.
    pub best: Option<(Schedule, Stats)>,
    /// The lowest-peak schedule evaluated (ties: the cheaper), within the budget or not: what
    /// the search can offer toward the minimum feasible budget (`budget::min_feasible_budget`)
    /// when nothing fits.
    pub lowest: Option<(Schedule, Stats)>,
    /// Schedules built and simulated.
    pub evaluations: usize,
    /// Schedule steps simulated (the unit of [`SearchLimits::work`]).
    pub work: u64,
    /// Whether the wall-clock cap stopped the search before its work budget was spent (the
    /// result then depends on the machine's speed).
    pub capped: bool,
}

/// How long the local search runs: a work budget, so that a run reproduces, and a wall-clock
/// cap that only a slow machine reaches.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchLimits {
    /// Schedule steps to simulate in all (each evaluation costs the length of its schedule).
    pub work: u64,
    /// Wall-clock cap.
    pub time: Duration,
    /// Looked at with the clock: once raised, the search ends with
    /// [`crate::SolverError::Cancelled`].
    pub cancel: Cancel,
}

impl SearchLimits {
    /// Work this crate's search simulates per second on a loaded 2-core machine (as measured
    /// on the benchmark machine: `docs/bench/solver-tuning.md`), so a budget derived from a
    /// time slice usually ends before the slice does.
    pub const WORK_PER_SECOND: u64 = 4_000_000;

    /// The work that fits `time` at [`Self::WORK_PER_SECOND`], capped at `time`.
    pub fn for_time(time: Duration) -> Self {
        SearchLimits {
            work: (time.as_secs_f64() * Self::WORK_PER_SECOND as f64) as u64,
            time,
            cancel: Cancel::default(),
        }
    }
}

/// Local search over retention horizons for a schedule within `budget` bytes (fixed bytes
/// included) of least compute cost, until `limits.work` schedule steps have been simulated or
/// `limits.time` has passed. Deterministic for a given seed and work budget unless the time
/// cap cuts it (`capped`).
pub fn horizon_search(
    p: &Problem,
    budget: u64,
    limits: SearchLimits,
    seed: u64,
) -> Result<SearchOutcome> {
    search(p, budget, limits, seed, None)
}

/// Rounds without a lower peak after which [`min_peak_search`] stops.
const MIN_PEAK_STALL: usize = 8;

/// The greedy peak descent of [`horizon_search`] alone, toward the lowest peak it can reach:
/// it stops at the footprint lower bound, after [`MIN_PEAK_STALL`] rounds without a lower
/// peak, or at the limits. The result's `lowest` is the least-peak schedule seen.
pub fn min_peak_search(p: &Problem, limits: SearchLimits, seed: u64) -> Result<SearchOutcome> {
    search(
        p,
        p.footprint_lower_bound(),
        limits,
        seed,
        Some(MIN_PEAK_STALL),
    )
}

fn search(
    p: &Problem,
    budget: u64,
    limits: SearchLimits,
    seed: u64,
    stall_limit: Option<usize>,
) -> Result<SearchOutcome> {
    let start = Instant::now();
    let time_limit = limits.time;
    let mut work = 0u64;
    let g = Local::new(p);
    let m = g.len();
    let mut builder = Builder::new(&g);
    let mut evaluations = 0usize;
    // Options of each value's two horizons: its own stage, then each stage that reads it.
    let options: Vec<Vec<usize>> = (0..m)
        .map(|i| {
            let mut o = vec![i];
            for &u in &g.users[i] {
                if o.last() != Some(&u) {
                    o.push(u);
                }
            }
            o
        })
        .collect();
    // x[i]: horizon after the first computation; x[m + i]: after a recomputation. Start from
    // store-all, recomputed values kept to their last reader (Chen et al.'s segments).
    let mut x: Vec<usize> = (0..2 * m)
        .map(|j| if j < m { g.max_user(j) } else { j - m })
        .collect();
    let movable: Vec<usize> = (0..2 * m).filter(|&j| options[j % m].len() > 1).collect();

    let mut eval =
        |x: &[usize], evaluations: &mut usize, work: &mut u64| -> Result<(Schedule, Stats)> {
            *evaluations += 1;
            let (h, keep) = x.split_at(m);
            let schedule = with_frees(p, &builder.computes(h, keep));
            *work += schedule.steps.len() as u64;
            let stats = simulate(p, &schedule)?;
            Ok((schedule, stats))
        };
    // The wall clock is read every few evaluations only; the work budget is exact.
    let mut clock = 0u32;
    let mut out_of_time = |work: u64| -> bool {
        if work >= limits.work {
            return true;
        }
        clock = clock.wrapping_add(1);
        clock.is_multiple_of(64) && (start.elapsed() >= time_limit || limits.cancel.is_cancelled())
    };

    let (mut cur_sched, mut cur_stats) = eval(&x, &mut evaluations, &mut work)?;
    let mut best: Option<(Schedule, Stats)> = None;
    let mut lowest: Option<(Schedule, Stats)> = None;
    let lower = |lowest: &mut Option<(Schedule, Stats)>, sched: &Schedule, stats: &Stats| {
        let key = |s: &Stats| (s.peak_bytes, s.compute_cost);
        if lowest.as_ref().is_none_or(|(_, l)| key(stats) < key(l)) {
            *lowest = Some((sched.clone(), stats.clone()));
        }
    };
    lower(&mut lowest, &cur_sched, &cur_stats);
    let consider = |best: &mut Option<(Schedule, Stats)>, sched: &Schedule, stats: &Stats| {
        let better = stats.peak_bytes <= budget
            && best
                .as_ref()
                .is_none_or(|(_, b)| stats.compute_cost < b.compute_cost);
        if better {
            *best = Some((sched.clone(), stats.clone()));
        }
        better
    };
    let _ = consider(&mut best, &cur_sched, &cur_stats);
    // Store-all fits (nothing to improve: it computes everything once), nothing moves, or
    // (min-peak search) the descent is over: the outcome so far, not cut by the clock.
    let done = |best, lowest, evaluations, work| {
        Ok(SearchOutcome {
            best,
            lowest,
            evaluations,
            work,
            capped: false,
        })
    };
    if best.is_some() || movable.is_empty() {
        return done(best, lowest, evaluations, work);
    }

    // Phase 1: greedy descent on the peak. At each round, try lowering the horizons of the
    // largest values resident at the peak and keep the move with the best peak reduction per
    // unit of extra cost.
    const CANDIDATES: usize = 24;
    let mut rng = Rng::seeded(seed);
    let mut stall = 0;
    let low_peak =
        |l: &Option<(Schedule, Stats)>| l.as_ref().map_or(u64::MAX, |(_, l)| l.peak_bytes);
    while cur_stats.peak_bytes > budget && !out_of_time(work) {
        if stall_limit.is_some_and(|l| stall > l) {
            break;
        }
        let before = low_peak(&lowest);
        let resident = resident_at(p, &cur_sched, cur_stats.peak_step);
        let mut cands: Vec<usize> = resident.iter().filter_map(|&v| g.local[v]).collect();
        cands.sort_by_key(|&i| std::cmp::Reverse(g.bytes[i]));
        cands.truncate(CANDIDATES);
        let mut choice: Option<(f64, Move, Schedule, Stats)> = None;
        for &i in &cands {
            for mv in greedy_moves(&g, &options, &x, i) {
                let olds: Vec<usize> = mv.iter().map(|&(j, _)| x[j]).collect();
                for &(j, v) in &mv {
                    x[j] = v;
                }
                let (s, st) = eval(&x, &mut evaluations, &mut work)?;
                for (&(j, _), &o) in mv.iter().zip(&olds).rev() {
                    x[j] = o;
                }
                if st.peak_bytes >= cur_stats.peak_bytes {
                    continue;
                }
                let gain = (cur_stats.peak_bytes - st.peak_bytes) as f64;
                let extra = (st.compute_cost - cur_stats.compute_cost).max(0.0);
                let ratio = gain / (extra + 1e-9 * (1.0 + cur_stats.compute_cost));
                if choice.as_ref().is_none_or(|c| ratio > c.0) {
                    choice = Some((ratio, mv, s, st));
                }
            }
        }
        match choice {
            Some((_, mv, s, st)) => {
                for (j, v) in mv {
                    x[j] = v;
                }
                cur_sched = s;
                cur_stats = st;
            }
            None => {
                // No single move lowers the peak: drop a random resident value entirely.
                let Some(&i) = cands.get(rng.below(cands.len())) else {
                    break;
                };
                x[i] = i;
                x[m + i] = i;
                let (s, st) = eval(&x, &mut evaluations, &mut work)?;
                cur_sched = s;
                cur_stats = st;
            }
        }
        let _ = consider(&mut best, &cur_sched, &cur_stats);
        lower(&mut lowest, &cur_sched, &cur_stats);
        stall = if low_peak(&lowest) < before {
            0
        } else {
            stall + 1
        };
    }

    limits.cancel.check()?;
    if stall_limit.is_some() {
        return done(best, lowest, evaluations, work);
    }
    // Phase 2: simulated annealing on cost + penalty * excess bytes.
    let base = p.base_cost().max(f64::MIN_POSITIVE);
    let span = budget.saturating_sub(p.fixed_bytes).max(1) as f64;
    let penalty = 4.0 * base / span;
    let energy = |s: &Stats| s.compute_cost + penalty * s.peak_bytes.saturating_sub(budget) as f64;
    let mut cur_e = energy(&cur_stats);
    // The starting temperature comes from a ladder indexed by the seed, so that a portfolio of
    // seeds (see [`portfolio_search`]) covers hot and cold runs: which one wins varies by
    // graph and budget.
    let t0 = T0_LADDER[(seed % T0_LADDER.len() as u64) as usize] * base;
    let anneal_from = work;
    let anneal_work = limits.work.saturating_sub(work).max(1) as f64;
    while !out_of_time(work) {
        let frac = (work - anneal_from) as f64 / anneal_work;
        let temp = t0 * (1.0 - frac).max(0.0).powi(2) + 1e-12 * base;
        let j = movable[rng.below(movable.len())];
        let opts = &options[j % m];
        let new = opts[rng.below(opts.len())];
        if new == x[j] {
            continue;
        }
        let mut mv = vec![(j, new)];
        if j < m && new < x[j] && rng.below(2) == 0 {
            // Drop with support: keep the inputs of the dropped value for its recomputations.
            mv.extend(support(&g, &x, j));
        }
        let olds: Vec<usize> = mv.iter().map(|&(k, _)| x[k]).collect();
        for &(k, v) in &mv {
            x[k] = v;
        }
        let (s, st) = eval(&x, &mut evaluations, &mut work)?;
        let e = energy(&st);
        if e <= cur_e || rng.unit() < ((cur_e - e) / temp).exp() {
            cur_e = e;
            let _ = consider(&mut best, &s, &st);
            if best.is_none() {
                lower(&mut lowest, &s, &st);
            }
        } else {
            for (&(k, _), &o) in mv.iter().zip(&olds).rev() {
                x[k] = o;
            }
        }
    }
    limits.cancel.check()?;
    Ok(SearchOutcome {
        best,
        lowest,
        evaluations,
        work,
        capped: work < limits.work,
    })
}

/// Starting temperatures of the annealing, as fractions of the store-all cost.
const T0_LADDER: [f64; 4] = [0.02, 0.005, 0.01, 0.002];

/// Runs [`horizon_search`] once per seed `0..runs`, each with an equal share of the work
/// (and of the time cap), and keeps the cheapest schedule within the budget. Deterministic
/// like its runs.
pub fn portfolio_search(
    p: &Problem,
    budget: u64,
    limits: SearchLimits,
    runs: usize,
) -> Result<SearchOutcome> {
    let runs = runs.max(1);
    let start = Instant::now();
    let mut total = SearchOutcome::empty();
    for seed in 0..runs {
        let left = runs - seed;
        let share = SearchLimits {
            work: limits.work.saturating_sub(total.work) / left as u64,
            time: limits.time.saturating_sub(start.elapsed()) / left as u32,
            cancel: limits.cancel.clone(),
        };
        total.merge(horizon_search(p, budget, share, seed as u64)?);
    }
    Ok(total)
}

/// Rounds without a lower peak after which a run of [`min_peak_portfolio`] stops: 8 (as
/// [`min_peak_search`]) missed the least peak of two of the Checkmate/Moccasin random graphs
/// by 0.2-1.7%, 32 matches the full runs on every graph and fixture model tried
/// (docs/bench/solver-tuning.md).
const PORTFOLIO_STALL: usize = 32;

/// The least peak [`portfolio_search`] with these limits and runs passes through when nothing
/// fits (`lowest`; `best` stays empty): each seed's greedy peak descent on the share of the
/// work that seed gets there, stopped after [`PORTFOLIO_STALL`] rounds without a lower peak
/// instead of when the work is spent. Each is the path that seed's [`horizon_search`] follows at any
/// budget it has not met, within that share: the least peak found is a budget the portfolio
/// then meets (unless the clock cuts it).
pub fn min_peak_portfolio(p: &Problem, limits: SearchLimits, runs: usize) -> Result<SearchOutcome> {
    let runs = runs.max(1);
    let share = SearchLimits {
        work: limits.work / runs as u64,
        time: limits.time / runs as u32,
        cancel: limits.cancel.clone(),
    };
    let mut total = SearchOutcome::empty();
    for seed in 0..runs as u64 {
        let mut out = search(
            p,
            p.footprint_lower_bound(),
            share.clone(),
            seed,
            Some(PORTFOLIO_STALL),
        )?;
        out.best = None;
        total.merge(out);
    }
    Ok(total)
}

impl SearchOutcome {
    fn empty() -> Self {
        SearchOutcome {
            best: None,
            lowest: None,
            evaluations: 0,
            work: 0,
            capped: false,
        }
    }

    /// Adds a run: its counts, and its schedules where they are better (the cheapest within
    /// the budget; the least peak, then the cheapest).
    fn merge(&mut self, out: SearchOutcome) {
        self.evaluations += out.evaluations;
        self.work += out.work;
        self.capped |= out.capped;
        if let Some((s, st)) = out.best {
            if self
                .best
                .as_ref()
                .is_none_or(|(_, b)| st.compute_cost < b.compute_cost)
            {
                self.best = Some((s, st));
            }
        }
        if let Some((s, st)) = out.lowest {
            let key = |s: &Stats| (s.peak_bytes, s.compute_cost);
            if self.lowest.as_ref().is_none_or(|(_, l)| key(&st) < key(l)) {
                self.lowest = Some((s, st));
            }
        }
    }
}

/// Horizon changes: (index into the horizons, new value).
type Move = Vec<(usize, usize)>;

/// Moves the greedy phase tries for value `i`: each horizon one option lower, or down to its
/// own stage, and the same for the first horizon with its inputs kept for the recomputations.
fn greedy_moves(
    g: &Local,
    options: &[Vec<usize>],
    x: &[usize],
    i: usize,
) -> Vec<Vec<(usize, usize)>> {
    let m = g.len();
    let opts = &options[i];
    let mut moves = Vec::new();
    for j in [i, m + i] {
        let Some(pos) = opts.iter().position(|&o| o == x[j]).filter(|&q| q > 0) else {
            continue;
        };
        let mut targets = vec![opts[pos - 1]];
        if pos > 1 {
            targets.push(opts[0]);
        }
        for t in targets {
            moves.push(vec![(j, t)]);
            if j == i {
                let mut mv = vec![(j, t)];
                mv.extend(support(g, x, i));
                if mv.len() > 1 {
                    moves.push(mv);
                }
            }
        }
    }
    moves
}

/// Raises the first horizon of `i`'s inputs to `i`'s last reader, so recomputing `i` needs
/// nothing else recomputed.
fn support(g: &Local, x: &[usize], i: usize) -> Move {
    let last = g.max_user(i);
    g.deps[i]
        .iter()
        .filter(|&&d| x[d] < last)
        .map(|&d| (d, last))
        .collect()
}

/// Problem indices resident right after `step` of a valid schedule.
fn resident_at(p: &Problem, schedule: &Schedule, step: usize) -> Vec<NodeId> {
    let mut resident = vec![false; p.len()];
    for s in schedule.steps.iter().take(step + 1) {
        match *s {
            Step::Compute(v) => resident[v] = true,
            Step::Free(v) => resident[v] = false,
        }
    }
    (0..p.len()).filter(|&v| resident[v]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{Node, NodeKind};
    use crate::schedule::store_all;

    fn chain(n: usize) -> Problem {
        let nodes = (0..n)
            .map(|i| Node {
                id: i.to_string(),
                name: format!("n{i}"),
                cost: 1.0 + (i % 3) as f64,
                bytes: 10 + (i as u64 * 7) % 13,
                deps: if i == 0 { vec![] } else { vec![i - 1] },
                kind: NodeKind::Forward,
                required: true,
            })
            .collect();
        Problem::new("chain", nodes, 0).unwrap()
    }

    /// A forward chain and its mirrored backward chain, as in training.
    fn training_chain(k: usize) -> Problem {
        crate::testutil::training_chain(k, |_| 1.0, |_| 100)
    }

    #[test]
    fn store_all_is_stage_form_and_round_trips() {
        let p = training_chain(6);
        let g = Local::new(&p);
        let stages = g.stages_of(&store_all(&p)).unwrap();
        assert!(stages.iter().all(|s| s.is_empty()));
        let computes = g.computes_of(&stages);
        assert_eq!(with_frees(&p, &computes), store_all(&p));
    }

    #[test]
    fn horizons_schedule_is_stage_form() {
        let p = training_chain(8);
        let g = Local::new(&p);
        let mut b = Builder::new(&g);
        let h: Vec<usize> = (0..g.len()).collect();
        let sched = with_frees(&p, &b.computes(&h, &h));
        let stats = simulate(&p, &sched).unwrap();
        assert!(stats.recomputations > 0);
        let stages = g.stages_of(&sched).unwrap();
        assert_eq!(with_frees(&p, &g.computes_of(&stages)), sched);
    }

    #[test]
    fn search_meets_a_tight_budget_on_a_training_chain() {
        let p = training_chain(12);
        let full = simulate(&p, &store_all(&p)).unwrap();
        let budget = full.peak_bytes / 2;
        let out = horizon_search(
            &p,
            budget,
            SearchLimits::for_time(Duration::from_millis(300)),
            7,
        )
        .unwrap();
        let (sched, stats) = out.best.expect("a schedule within half the store-all peak");
        assert!(stats.peak_bytes <= budget);
        assert_eq!(simulate(&p, &sched).unwrap(), stats);
        assert!(stats.compute_cost > full.compute_cost);
    }

    #[test]
    fn search_with_a_work_budget_reproduces() {
        let p = training_chain(16);
        let budget = simulate(&p, &store_all(&p)).unwrap().peak_bytes * 3 / 5;
        let limits = SearchLimits {
            work: 200_000,
            time: Duration::from_secs(600),
            cancel: Cancel::default(),
        };
        let a = horizon_search(&p, budget, limits.clone(), 11).unwrap();
        let b = horizon_search(&p, budget, limits.clone(), 11).unwrap();
        assert!(!a.capped && a.work >= limits.work);
        assert_eq!(a.evaluations, b.evaluations);
        let (sa, _) = a.best.expect("a schedule within the budget");
        assert_eq!(Some(sa), b.best.map(|x| x.0));
    }

    #[test]
    fn portfolio_is_at_least_as_good_as_its_first_run() {
        let p = training_chain(16);
        let budget = simulate(&p, &store_all(&p)).unwrap().peak_bytes / 2;
        let limits = SearchLimits {
            work: 400_000,
            time: Duration::from_secs(600),
            cancel: Cancel::default(),
        };
        let all = portfolio_search(&p, budget, limits.clone(), 4).unwrap();
        let first = horizon_search(
            &p,
            budget,
            SearchLimits {
                work: limits.work / 4,
                time: limits.time / 4,
                cancel: Cancel::default(),
            },
            0,
        )
        .unwrap();
        let cost = |o: &SearchOutcome| o.best.as_ref().map(|(_, s)| s.compute_cost);
        let (a, b) = (cost(&all).unwrap(), cost(&first).unwrap());
        assert!(a <= b, "{a} > {b}");
        assert!(all.work >= limits.work - 4 && !all.capped);
    }

    #[test]
    fn search_reports_the_time_cap() {
        let p = training_chain(16);
        let budget = simulate(&p, &store_all(&p)).unwrap().peak_bytes * 3 / 5;
        let limits = SearchLimits {
            work: u64::MAX,
            time: Duration::from_millis(50),
            cancel: Cancel::default(),
        };
        let out = horizon_search(&p, budget, limits.clone(), 3).unwrap();
        assert!(out.capped && out.work < limits.work);
    }

    #[test]
    fn a_cancelled_search_ends_with_cancelled() {
        let p = training_chain(16);
        let budget = simulate(&p, &store_all(&p)).unwrap().peak_bytes * 3 / 5;
        let limits = SearchLimits {
            work: u64::MAX,
            time: Duration::from_secs(3600),
            cancel: Cancel::armed(),
        };
        limits.cancel.cancel();
        let out = portfolio_search(&p, budget, limits.clone(), 4);
        assert_eq!(out.err(), Some(crate::SolverError::Cancelled));
        let out = min_peak_portfolio(&p, limits, 4);
        assert_eq!(out.err(), Some(crate::SolverError::Cancelled));
    }

    #[test]
    fn search_returns_store_all_when_it_fits() {
        let p = chain(10);
        let full = simulate(&p, &store_all(&p)).unwrap();
        let out = horizon_search(
            &p,
            full.peak_bytes,
            SearchLimits::for_time(Duration::from_millis(100)),
            1,
        )
        .unwrap();
        assert_eq!(out.best.unwrap().1.compute_cost, full.compute_cost);
    }
}
