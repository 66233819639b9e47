//! Budget tools: the least peak a schedule can reach.

use crate::baselines::{self, schedule_with_checkpoints_eager, Phases};
use crate::problem::{NodeId, Problem};
use crate::schedule::{simulate, store_all, with_frees, Schedule, Stats, Step};

/// Schedule steps the greedy descent of [`min_feasible_budget`] may generate.
const DESCENT_WORK: usize = 5_000_000;
/// Wall-clock cap of [`min_feasible_budget`]'s horizon search (its work budget,
/// [`DESCENT_WORK`], normally ends it first).
const MIN_PEAK_SECONDS: u64 = 20;

/// The least peak found for a problem.
#[derive(Debug, Clone, PartialEq)]
pub struct MinBudget {
    /// The least simulated peak (fixed bytes included) of any schedule tried; `schedule`
    /// reaches it.
    pub bytes: u64,
    /// [`Problem::footprint_lower_bound`]: no schedule can peak below it.
    pub lower_bound: u64,
    /// Whether `bytes` is known to be minimal: it equals the lower bound, or the exact chain DP
    /// found it on a chain of at most 4 stages (where it is checked against exhaustive search).
    pub exact: bool,
    pub schedule: Schedule,
}

struct Lowest {
    best: Option<(Schedule, Stats)>,
}

impl Lowest {
    fn offer(&mut self, p: &Problem, s: Schedule) {
        let Ok(stats) = simulate(p, &s) else {
            return;
        };
        let better = match &self.best {
            None => true,
            Some((_, b)) => (stats.peak_bytes, stats.compute_cost) < (b.peak_bytes, b.compute_cost),
        };
        if better {
            self.best = Some((s, stats));
        }
    }

    fn peak(&self) -> u64 {
        self.best.as_ref().map_or(u64::MAX, |(_, s)| s.peak_bytes)
    }
}

/// The minimum feasible budget: the least peak of the schedules this crate can construct.
///
/// For a training chain ([`crate::dp::as_training_chain`]) of up to 30 forward nodes the exact
/// DP's minimum peak is returned. Otherwise (longer chains also start from the restricted DP): store-all, "recompute everything" (the eager generator with nothing but gradients
/// kept), for training graphs the lowest-peak schedules of every baseline (each searched with a
/// zero budget, so it minimizes peak), for training graphs a greedy descent over single-node changes of the
/// keep-set (at most `4n + 64` evaluations and 5 million generated schedule steps), and finally
/// a peak descent on store-all's compute order and on the best one found (recompute a value
/// held across the peak right before its next reader while that lowers the peak; same limit),
/// and the local search's greedy peak descent over retention horizons
/// ([`crate::search::min_peak_search`]; same work limit).
pub fn min_feasible_budget(p: &Problem) -> MinBudget {
    let lower_bound = p.footprint_lower_bound();
    let chain = crate::dp::min_peak_chain(p);
    if let Some((bytes, schedule, true)) = &chain {
        // Proven when it meets the lower bound, or for chains the brute-force tests cover.
        let small = crate::dp::as_training_chain(p).is_some_and(|c| c.backward.len() <= 4);
        return MinBudget {
            bytes: *bytes,
            lower_bound,
            exact: *bytes == lower_bound || small,
            schedule: schedule.clone(),
        };
    }
    let mut low = Lowest { best: None };
    low.offer(p, store_all(p));
    if let Some((_, schedule, _)) = chain {
        low.offer(p, schedule);
    }
    let ph = Phases::of(p);
    let mut keep = vec![false; p.len()];
    if !ph.forward.is_empty() {
        for &v in &ph.backward {
            keep[v] = true;
        }
    }
    low.offer(p, schedule_with_checkpoints_eager(p, &keep));
    for name in baselines::BASELINE_NAMES {
        if low.peak() <= lower_bound || ph.forward.is_empty() {
            break;
        }
        if let Ok(b) = baselines::baseline(p, name, 0) {
            low.offer(p, b.schedule);
        }
    }
    // Greedy descent: toggle single checkpoints of the forward phase while the peak drops
    // (training graphs only: on plain DAGs eager schedules recompute too much to be useful).
    if low.peak() > lower_bound && !ph.forward.is_empty() {
        let lin = ph.linear().to_vec();
        let mut cur_keep = keep.clone();
        let mut cur_peak = simulate(p, &schedule_with_checkpoints_eager(p, &cur_keep))
            .map_or(u64::MAX, |s| s.peak_bytes);
        let max_evals = 4 * lin.len() + 64;
        let mut evals = 0;
        let mut work = 0usize;
        let mut improved = true;
        while improved && evals < max_evals && work <= DESCENT_WORK && cur_peak > lower_bound {
            improved = false;
            for &v in &lin {
                if evals >= max_evals || work > DESCENT_WORK {
                    break;
                }
                evals += 1;
                cur_keep[v] = !cur_keep[v];
                let s = schedule_with_checkpoints_eager(p, &cur_keep);
                work += s.steps.len();
                match simulate(p, &s) {
                    Ok(st) if st.peak_bytes < cur_peak => {
                        cur_peak = st.peak_bytes;
                        improved = true;
                        low.offer(p, s);
                    }
                    _ => cur_keep[v] = !cur_keep[v],
                }
            }
        }
    }
    // Peak descent from store-all's compute order (short, so moves are cheap to score), and
    // from the best order so far when it is not much longer.
    if low.peak() > lower_bound {
        let seq = computes(&store_all(p));
        if let Some(better) = peak_descent(p, seq, DESCENT_WORK, lower_bound) {
            low.offer(p, better);
        }
    }
    if low.peak() > lower_bound {
        if let Some((sched, _)) = &low.best {
            let seq = computes(sched);
            if seq.len() <= 4 * p.len() {
                if let Some(better) = peak_descent(p, seq, DESCENT_WORK, lower_bound) {
                    low.offer(p, better);
                }
            }
        }
    }
    // The local search's greedy peak descent over retention horizons (what `auto` searches
    // with): on random layered graphs it reaches peaks the checkpoint-set moves above miss
    // (n1000 in docs/bench/solver-tuning.md).
    if low.peak() > lower_bound {
        let limits = crate::search::SearchLimits {
            work: DESCENT_WORK as u64,
            time: std::time::Duration::from_secs(MIN_PEAK_SECONDS),
            cancel: crate::Cancel::default(),
        };
        if let Ok(out) = crate::search::min_peak_search(p, limits, 0) {
            if let Some((s, _)) = out.lowest {
                low.offer(p, s);
            }
        }
    }
    let (schedule, stats) = match low.best {
        Some(b) => b,
        None => {
            let s = store_all(p);
            let stats = match simulate(p, &s) {
                Ok(st) => st,
                Err(_) => {
                    return MinBudget {
                        bytes: u64::MAX,
                        lower_bound,
                        exact: false,
                        schedule: s,
                    }
                }
            };
            (s, stats)
        }
    };
    MinBudget {
        bytes: stats.peak_bytes,
        lower_bound,
        exact: stats.peak_bytes == lower_bound,
        schedule,
    }
}

/// The compute order of a schedule.
fn computes(s: &Schedule) -> Vec<NodeId> {
    s.steps
        .iter()
        .filter_map(|st| match *st {
            Step::Compute(v) => Some(v),
            Step::Free(_) => None,
        })
        .collect()
}

/// Peak descent for a budget: starting from store-all, repeatedly recompute a value held across
/// the peak right before its next reader (while that lowers the peak), until the simulated peak
/// fits `budget`, no move helps, or 5 million schedule steps have been generated. Returns the
/// lowest-peak schedule reached (store-all when nothing helped); check its peak against the
/// budget. Useful on plain DAGs, where the checkpoint baselines recompute too much.
pub fn descend_to_budget(p: &Problem, budget: u64) -> Schedule {
    let sa = store_all(p);
    peak_descent(p, computes(&sa), DESCENT_WORK, budget).unwrap_or(sa)
}

/// Removes recomputations a schedule does not need under `budget`: for each recomputation, most
/// expensive first, drop it (its readers then read the earlier copy, which [`with_frees`] keeps
/// resident until them) when the simulated peak still fits. Frees are re-derived from the
/// compute order. Returns the input unchanged when it is invalid, over the budget, or nothing
/// can go; the result is never costlier. Stops after `work` simulated steps.
pub fn prune_recomputations(
    p: &Problem,
    schedule: &Schedule,
    budget: u64,
    work: usize,
) -> Schedule {
    let seq = computes(schedule);
    let mut best = with_frees(p, &seq);
    match simulate(p, &best) {
        Ok(st) if st.peak_bytes <= budget => {}
        _ => return schedule.clone(),
    }
    // Positions of recomputations (a node computed before), most expensive first; removing
    // one shifts the later positions, so they are visited from the back on ties.
    let mut seen = vec![false; p.len()];
    let mut recomputes: Vec<usize> = Vec::new();
    for (i, &v) in seq.iter().enumerate() {
        if v >= p.len() {
            return schedule.clone();
        }
        if seen[v] {
            recomputes.push(i);
        }
        seen[v] = true;
    }
    recomputes.sort_by(|&a, &b| p.cost(seq[b]).total_cmp(&p.cost(seq[a])).then(b.cmp(&a)));
    let mut removed = vec![false; seq.len()];
    let mut spent = 0usize;
    for i in recomputes {
        if spent > work {
            break;
        }
        removed[i] = true;
        let trial: Vec<NodeId> = seq
            .iter()
            .zip(&removed)
            .filter(|(_, &r)| !r)
            .map(|(&v, _)| v)
            .collect();
        let s = with_frees(p, &trial);
        spent += s.steps.len();
        match simulate(p, &s) {
            Ok(st) if st.peak_bytes <= budget => best = s,
            _ => removed[i] = false,
        }
    }
    best
}

/// (peak, number of steps at the peak, index in the compute order of the first peak compute).
fn peak_profile(p: &Problem, seq: &[NodeId]) -> Option<(u64, usize, usize, Schedule)> {
    let s = with_frees(p, seq);
    let st = simulate(p, &s).ok()?;
    let at_peak = st.memory.iter().filter(|&&m| m == st.peak_bytes).count();
    let compute_index = s
        .steps
        .get(..=st.peak_step)?
        .iter()
        .filter(|x| matches!(x, Step::Compute(_)))
        .count()
        .saturating_sub(1);
    Some((st.peak_bytes, at_peak, compute_index, s))
}

/// Greedy peak reduction on a compute order: at the first peak compute, take a value resident
/// there but not read by it, and recompute it right before its next reader instead of holding
/// it (its dependencies then live until that reader: [`with_frees`] keeps the order valid).
/// A move is kept when (peak, steps at the peak) decreases; stops when no resident value
/// helps, the peak is at most `stop_at`, or after `work` generated steps. Returns the improved
/// schedule, if any move helped.
fn peak_descent(p: &Problem, mut seq: Vec<NodeId>, work: usize, stop_at: u64) -> Option<Schedule> {
    let (mut peak, mut count, mut at, mut sched) = peak_profile(p, &seq)?;
    let mut improved_any = false;
    let mut spent = 0usize;
    let n = p.len();
    'outer: while spent <= work && peak > stop_at {
        // Values resident at compute `at`: the latest instance before `at` read at or after it.
        let mut latest: Vec<Option<usize>> = vec![None; n];
        for (i, &v) in seq.iter().enumerate().take(at) {
            latest[v] = Some(i);
        }
        let Some(&target) = seq.get(at) else {
            break;
        };
        let mut cands: Vec<(u64, NodeId, usize)> = Vec::new();
        for (v, lat) in latest.iter().enumerate() {
            if lat.is_none() || v == target || p.deps(target).contains(&v) {
                continue;
            }
            spent += seq.len() - at;
            // Next reader of this instance after `at` (before v is computed again).
            let mut next = None;
            for (j, &u) in seq.iter().enumerate().skip(at + 1) {
                if u == v {
                    break;
                }
                if p.deps(u).contains(&v) {
                    next = Some(j);
                    break;
                }
            }
            if let Some(j) = next {
                cands.push((p.bytes(v), v, j));
            }
        }
        cands.sort_unstable_by(|a, b| b.cmp(a));
        for (_, v, j) in cands {
            let mut trial = seq.clone();
            trial.insert(j, v);
            spent += trial.len() * 2;
            if let Some((pk, ct, a, s)) = peak_profile(p, &trial) {
                if (pk, ct) < (peak, count) {
                    (peak, count, at, sched) = (pk, ct, a, s);
                    seq = trial;
                    improved_any = true;
                    continue 'outer;
                }
            }
            if spent > work {
                break 'outer;
            }
        }
        break;
    }
    improved_any.then_some(sched)
}
