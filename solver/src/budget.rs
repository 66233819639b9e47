//! Budget tools: the least peak a schedule can reach.

use crate::baselines::{self, schedule_with_checkpoints_eager, Phases};
use crate::problem::Problem;
use crate::schedule::{simulate, store_all, Schedule, Stats};

/// Schedule steps the greedy descent of [`min_feasible_budget`] may generate.
const DESCENT_WORK: usize = 5_000_000;

/// The least peak found for a problem.
#[derive(Debug, Clone, PartialEq)]
pub struct MinBudget {
    /// The least simulated peak (fixed bytes included) of any schedule tried; `schedule`
    /// reaches it.
    pub bytes: u64,
    /// [`Problem::footprint_lower_bound`]: no schedule can peak below it.
    pub lower_bound: u64,
    /// Whether `bytes` is proven minimal: it equals the lower bound, or the exact chain DP
    /// found it.
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
/// DP gives the true minimum. Otherwise (longer chains also start from the restricted DP): store-all, "recompute everything" (the eager generator with nothing but gradients
/// kept), the lowest-peak schedules of every baseline (each searched with a zero budget, so it
/// minimizes peak), then a greedy descent over single-node changes of the keep-set (at most
/// `4n + 64` evaluations and 5 million generated schedule steps).
pub fn min_feasible_budget(p: &Problem) -> MinBudget {
    let lower_bound = p.footprint_lower_bound();
    let chain = crate::dp::min_peak_chain(p);
    if let Some((bytes, schedule, true)) = &chain {
        return MinBudget {
            bytes: *bytes,
            lower_bound,
            exact: true,
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
        if low.peak() <= lower_bound {
            break;
        }
        if let Ok(b) = baselines::baseline(p, name, 0) {
            low.offer(p, b.schedule);
        }
    }
    // Greedy descent: toggle single checkpoints of the linear order while the peak drops.
    if low.peak() > lower_bound {
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
