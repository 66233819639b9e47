//! Algorithm choice, the plan report, the budget sweep: the API the CLI and the HTTP service
//! call.
//!
//! Every figure in a [`PlanReport`] comes from [`simulate`]. `auto` runs the baselines, the
//! chain DP when the problem is a training chain (done when the exact program ran; the
//! restricted one for long chains only seeds the rest), the horizon local search
//! ([`crate::search::horizon_search`], with a work budget derived from the time limit so that runs
//! reproduce), the peak descent to the budget ([`crate::budget::descend_to_budget`]), the
//! minimum-peak schedule when nothing else fits, and, with the `highs` feature, the Checkmate
//! MILP when its reduced model is small enough to be useful within the time limit; the best
//! schedule loses the recomputations the budget does not need
//! ([`crate::budget::prune_recomputations`]) before the MILP starts from it and again at the
//! end. It returns the cheapest schedule within the budget among everything it ran.
//!
//! Every plan (any algorithm) with the `highs` feature is bounded by the time-point
//! relaxation ([`crate::bound`]), which holds for every schedule and solves in under a second
//! on graphs of thousands of nodes (`auto` runs it before its search, or beside it with two
//! threads on large graphs; other algorithms after their schedule): the report's `gap` is
//! against the best of it, the store-all cost and whatever bound the MILP proved. The time
//! limit is the whole plan's ([`PlanOptions::time_limit`] says what runs past it).

use crate::baselines::{self, Baseline};
use crate::cancel::Cancel;
use crate::error::{Result, SolverError};
use crate::problem::Problem;
use crate::schedule::{self, simulate, store_all, Schedule, Stats};
use crate::search;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// The algorithms a plan can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Algorithm {
    Auto,
    Ilp,
    Dp,
    SegmentDp,
    ChenSqrt,
    ChenGreedy,
    EveryK,
    Revolve,
    StoreAll,
}

impl Algorithm {
    pub const ALL: [Algorithm; 9] = [
        Algorithm::Auto,
        Algorithm::Ilp,
        Algorithm::Dp,
        Algorithm::SegmentDp,
        Algorithm::ChenSqrt,
        Algorithm::ChenGreedy,
        Algorithm::EveryK,
        Algorithm::Revolve,
        Algorithm::StoreAll,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::Auto => "auto",
            Algorithm::Ilp => "ilp",
            Algorithm::Dp => "dp",
            Algorithm::SegmentDp => "segment-dp",
            Algorithm::ChenSqrt => "chen-sqrt",
            Algorithm::ChenGreedy => "chen-greedy",
            Algorithm::EveryK => "every-k",
            Algorithm::Revolve => "revolve",
            Algorithm::StoreAll => "store-all",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for Algorithm {
    type Err = SolverError;
    fn from_str(s: &str) -> Result<Self> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| {
                SolverError::InvalidArgument(format!(
                    "unknown algorithm {s:?}; expected one of {}",
                    Algorithm::ALL.map(|a| a.as_str()).join(", ")
                ))
            })
    }
}

/// What to plan for.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanOptions {
    /// Peak byte budget, fixed bytes included.
    pub budget: u64,
    pub algorithm: Algorithm,
    /// Wall-clock limit for the whole plan, its time-point bound included (not
    /// [`PlanOptions::bound_time`], which is extra). What can stop early shares it: the
    /// search, the MILP, the peak descent's ladder past its first rung (it stops climbing
    /// down at half the limit) and the time-point bound (`auto` runs it before its search, or beside it:
    /// a fifth of the limit for its snapshots, from 0.5 to 5 s, and up to 5 s of what is left
    /// for its first). What cannot runs to its end, past the limit if it must: the baselines,
    /// the chain DP, the segment program, the first descent, pruning and, near the least
    /// peak, the minimum-peak schedule (their times on graphs of tens of thousands of nodes:
    /// `docs/bench/transformers.md`). The search gets at least a tenth of the limit and the
    /// bound half a second even when those overran it.
    pub time_limit: Duration,
    /// Threads the MILP may use (at least 1). With two or more, `auto` also runs the
    /// time-point bound on a thread of its own on graphs of thousands of nodes, beside the
    /// segment program, the peak descent and the search.
    pub threads: usize,
    /// Extra time, after the schedule is found, to prove a lower bound on its cost where
    /// nothing has proven one yet: the boundary model's LP relaxation
    /// ([`crate::ilp::lp_bound`]), which solves for graphs far too large for the MILP itself
    /// (times in `docs/bench/solver-tuning.md`), then the same model as a MILP
    /// ([`crate::ilp::boundary_bound`]) for the rest of the time. Zero (the default) skips it.
    pub bound_time: Duration,
    /// Raised, the plan ends with [`SolverError::Cancelled`] at its next look (between phases,
    /// in the search, the MILP's wait and the bound: [`crate::cancel`]). Never by default.
    pub cancel: Cancel,
}

impl PlanOptions {
    /// `auto`, 10 s, 1 thread, no extra time for a bound.
    pub fn new(budget: u64) -> Self {
        PlanOptions {
            budget,
            algorithm: Algorithm::Auto,
            time_limit: Duration::from_secs(10),
            threads: 1,
            bound_time: Duration::ZERO,
            cancel: Cancel::default(),
        }
    }
}

/// How good the returned schedule is known to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(as = PlanStatus))]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Proven optimal (the chain DP, or a lower bound within 0.01% of the cost).
    Optimal,
    /// Within the budget, optimality not proven.
    Feasible,
    /// No schedule within the budget was found.
    Infeasible,
}

impl Status {
    /// The status as the JSON documents spell it (`optimal`, `feasible`, `infeasible`).
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Optimal => "optimal",
            Status::Feasible => "feasible",
            Status::Infeasible => "infeasible",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// What the returned schedule does, as [`simulate`] measures it. All zero, with no per-step
/// memory, when the plan is infeasible.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Predicted {
    pub peak_bytes: u64,
    pub compute_cost: f64,
    /// `compute_cost / store_all_cost − 1`.
    pub overhead: f64,
    /// Resident bytes after every step (fixed bytes included).
    pub memory: Vec<u64>,
}

/// A proven lower bound on the compute cost of any schedule within the budget (in Checkmate's
/// stage model for MILP/LP bounds).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LowerBound {
    pub compute_cost: f64,
    /// What proved it.
    pub source: BoundSource,
}

/// Where a lower bound comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum BoundSource {
    /// Every needed node is computed at least once: the store-all cost.
    StoreAll,
    /// The Checkmate MILP's dual bound (HiGHS).
    Milp,
    /// The LP relaxation of the boundary model, or of the loose model on graphs too large
    /// for that ([`crate::ilp::lp_bound`]).
    Lp,
    /// The boundary model solved as a MILP ([`crate::ilp::boundary_bound`]): its dual bound.
    BoundaryMilp,
    /// The time-point relaxation ([`crate::bound`]): valid for every schedule, not only
    /// Checkmate's stage schedules, and solved in seconds on graphs of thousands of nodes.
    TimePoints,
    /// The schedule is proven optimal: the exact chain DP, or the MILP solved to its gap
    /// (the bound is then the schedule's own cost).
    Exact,
}

impl BoundSource {
    /// The name the JSON documents give it (`lower_bound.source`).
    pub fn name(self) -> &'static str {
        match self {
            BoundSource::StoreAll => "store_all",
            BoundSource::Milp => "milp",
            BoundSource::Lp => "lp",
            BoundSource::BoundaryMilp => "boundary_milp",
            BoundSource::TimePoints => "time_points",
            BoundSource::Exact => "exact",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            BoundSource::StoreAll => "store-all",
            BoundSource::Milp => "MILP",
            BoundSource::Lp => "LP",
            BoundSource::BoundaryMilp => "boundary MILP",
            BoundSource::TimePoints => "time points",
            BoundSource::Exact => "exact",
        }
    }
}

/// One baseline beside the plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BaselineReport {
    pub name: String,
    pub peak_bytes: u64,
    pub compute_cost: f64,
    pub overhead: f64,
    /// Whether its peak is within the budget.
    pub feasible: bool,
}

/// The answer to a plan request.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PlanReport {
    pub status: Status,
    /// The algorithm that produced the returned schedule.
    pub solver: String,
    pub budget_bytes: u64,
    pub store_all_peak_bytes: u64,
    pub store_all_cost: f64,
    /// The least peak this crate can reach; set at least when the plan is infeasible.
    pub min_feasible_budget_bytes: Option<u64>,
    pub predicted: Predicted,
    /// A lower bound on the cost of every schedule within the budget, and `gap` against it.
    pub lower_bound: Option<LowerBound>,
    /// `(cost − bound) / cost`.
    pub gap: Option<f64>,
    /// Where the graph allows more than one order of its nodes: the best bound of Checkmate's
    /// stage model (the MILP's, the boundary model's, the LP's), which holds only for the
    /// schedules that first compute the nodes in the graph's order (the convention of
    /// Checkmate's and Moccasin's papers). Another order can cost less (a 250-node random
    /// graph at 0.9x: +0.90% in the graph's order, bound +0.79%; a reordering without any
    /// recomputation fits at +0%), so it is not `lower_bound` and proves nothing `status`
    /// says; with source `exact` when the MILP proved the schedule optimal in that order.
    /// Absent from the JSON otherwise (where the order is forced, those bounds are
    /// `lower_bound`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order_bound: Option<LowerBound>,
    /// Seconds in all, the lower bound's extra time ([`PlanOptions::bound_time`]) included.
    pub solve_seconds: f64,
    /// Seconds spent on the bound after the schedule was found ([`PlanOptions::bound_time`]:
    /// the LP, then the boundary MILP; 0 when it did not run).
    pub bound_seconds: f64,
    pub baselines: Vec<BaselineReport>,
    /// When the returned schedule is one remat found earlier at this budget or a lower one (an
    /// [`Earlier`] plan handed to [`plan_reusing`], a sweep's lower point), or that schedule
    /// less the recomputations this budget does not need, and nothing run at this budget did
    /// better: a larger budget never costs more than a smaller one did.
    /// Absent from the JSON otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reused_from_budget_bytes: Option<u64>,
    pub schedule: Vec<schedule::StepJson>,
}

/// A schedule remat found for the same problem at a lower budget, offered to a plan at a
/// larger one ([`plan_reusing`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Earlier {
    pub budget_bytes: u64,
    /// The algorithm that found it (the report's `solver` when it wins again).
    pub solver: String,
    pub schedule: Schedule,
}

/// One point of a budget sweep.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ParetoPoint {
    pub budget_bytes: u64,
    /// Budget as a fraction of the store-all peak.
    pub fraction: f64,
    pub status: Status,
    /// Overhead of the plan; `None` when infeasible.
    pub overhead: Option<f64>,
    pub solver: String,
    pub gap: Option<f64>,
    /// What `gap` is against: the plan report's `lower_bound.source` (the free model's
    /// [`BoundSource`] as the JSON names it; the torch-sac model's `chain_program` or
    /// `unplanned_step`); absent with `gap`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bound_source: Option<String>,
    /// Set when the point's schedule is the one found at this lower budget of the sweep
    /// ([`PlanReport::reused_from_budget_bytes`]); absent from the JSON otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reused_from_budget_bytes: Option<u64>,
    /// Each baseline's overhead, `None` where it does not fit the budget.
    pub baselines: Vec<(String, Option<f64>)>,
    /// Where nothing fits: the least budget a plan meets (the plan report's
    /// `min_feasible_budget_bytes`); absent from the JSON otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_feasible_budget_bytes: Option<u64>,
}

/// Relative gap under which a bound proves a schedule optimal (HiGHS's default MIP gap).
pub(crate) const OPTIMAL_GAP: f64 = 1e-4;
/// Largest reduced MILP (binaries) `auto` hands to HiGHS as an exact solve; larger graphs get
/// the search for the whole time limit (why this size: `docs/bench/solver-tuning.md`).
const EXACT_BINARIES: usize = 15_000;
/// Largest model (rows) whose LP relaxation [`PlanOptions::bound_time`] tries: the boundary
/// model where it is this small, otherwise the loose one (the LP times by model size:
/// `docs/bench/solver-tuning.md`).
#[cfg(feature = "highs")]
const LP_BOUND_MAX_ROWS: usize = 1_000_000;
/// Share of the time limit the time-point relaxation ([`crate::bound`]) may take, and its
/// least and most time (0.1-0.9 s on the deep fixtures: `docs/bench/transformers.md`).
#[cfg(feature = "highs")]
const TIME_POINTS_SHARE: f64 = 0.2;
#[cfg(feature = "highs")]
const TIME_POINTS_MIN: Duration = Duration::from_millis(500);
#[cfg(feature = "highs")]
const TIME_POINTS_MAX: Duration = Duration::from_secs(5);
/// Needed nodes from which `auto` runs the time-point bound beside the segment program, the
/// peak descent and the search ([`bound_beside`]): on the deep fixtures of 2,267 nodes and
/// more those take 2-4 s and the bound 0.2-0.9 s (`docs/bench/transformers.md`).
#[cfg(feature = "highs")]
const BOUND_BESIDE_NODES: usize = 2_000;
/// Share of the time limit by which the peak descent's ladder stops climbing down (its first
/// rung always runs): on graphs of tens of thousands of nodes a rung takes a fraction of a
/// second and the ladder seconds, and the search and the bound need the rest.
const DESCENT_SHARE: f64 = 0.5;
/// Share of the time limit the search gets before an exact MILP.
const SEARCH_SHARE: f64 = 0.3;
/// Share of the MILP's time that the boundary model's MILP gets for the bound.
const BOUNDARY_SHARE: f64 = 0.35;
/// Share of the time limit kept back from the MILP for building its model and pruning after it.
const ILP_MARGIN: f64 = 0.08;
/// Runs of the search portfolio (each from its own seed and starting temperature) on graphs
/// of at most [`PORTFOLIO_MAX_NODES`] needed nodes; larger graphs get one run with all the
/// work, a quarter of it being too little there (four runs against one on the benchmark
/// graphs: `docs/bench/solver-tuning.md`).
const SEARCH_RUNS: usize = 4;
const PORTFOLIO_MAX_NODES: usize = 400;
/// Schedules of the segment program that `auto` prunes (`Pool::offer_segments`).
const SEGMENTS_PRUNED: usize = 5;
/// Simulated steps [`crate::budget::prune_recomputations`] may spend on one schedule.
const PRUNE_WORK: usize = 5_000_000;
/// Targets of the peak descent, as fractions of the budget (each result is pruned back to
/// the budget).
const DESCENT_LADDER: [f64; 11] = [1.0, 0.98, 0.96, 0.94, 0.92, 0.9, 0.87, 0.84, 0.8, 0.75, 0.7];

/// The best schedule found so far and who found it.
struct Candidate {
    solver: String,
    schedule: Schedule,
    stats: Stats,
    /// The lower budget it was found at, when it is an [`Earlier`] plan (or pruned from one).
    from_budget: Option<u64>,
}

struct Pool {
    budget: u64,
    best: Option<Candidate>,
    lower_bound: Option<(f64, BoundSource)>,
    /// Solvers whose result is optimal by construction (the chain DP, a MILP solved to gap).
    proven: Option<f64>,
    /// Whether the graph's needed nodes have one order only ([`Problem::order_is_forced`]):
    /// only then do the stage model's bounds and optimality hold for every schedule.
    order_forced: bool,
    /// Where it is not: the stage model's best bound, and the cost its MILP proved optimal in
    /// the graph's order. They stop the search for a cheaper schedule as they did (the MILP
    /// finds none in that order), and are reported as [`PlanReport::order_bound`].
    order_bound: Option<(f64, BoundSource)>,
    proven_in_order: Option<f64>,
    /// The least peak [`crate::budget::min_feasible_budget`] found, once computed.
    min_peak: Option<u64>,
    /// The solvers whose schedule fits the budget: whether the search or only a baseline
    /// reached it decides `auto`'s next steps (the [`Earlier`] plans come after them).
    fitted: Vec<String>,
    /// Whether the time-point bound ran (`auto` runs it before its search, so that the search
    /// and not the bound gives way when time runs out, or beside it; every other plan after
    /// its schedule).
    time_points_ran: bool,
}

impl Pool {
    fn offer(&mut self, solver: &str, schedule: Schedule, stats: Stats) {
        self.offer_from(solver, schedule, stats, None);
    }

    fn offer_from(
        &mut self,
        solver: &str,
        schedule: Schedule,
        stats: Stats,
        from_budget: Option<u64>,
    ) {
        if stats.peak_bytes > self.budget {
            return;
        }
        if !self.fitted.iter().any(|s| s == solver) {
            self.fitted.push(solver.to_string());
        }
        if self.best.as_ref().is_none_or(|b| {
            // On a tie, what was found at this budget wins over an earlier plan.
            stats.compute_cost < b.stats.compute_cost
                || (stats.compute_cost == b.stats.compute_cost
                    && from_budget.is_none()
                    && b.from_budget.is_some())
        }) {
            self.best = Some(Candidate {
                solver: solver.to_string(),
                schedule,
                stats,
                from_budget,
            });
        }
    }

    fn offer_schedule(&mut self, p: &Problem, solver: &str, schedule: Schedule) -> Result<()> {
        let stats = simulate(p, &schedule)?;
        self.offer(solver, schedule, stats);
        Ok(())
    }

    /// Offers the segment program's schedules, some of those that fit less the recomputations
    /// the budget does not need: the program reads its answer at several memory levels, and
    /// the cheapest after pruning is often one read well below the budget, whose slack
    /// pruning spends (on a 96-layer GPT-2 a quarter of the way from the least peak: +9.30%
    /// for the best schedule at the budget, +8.35% for the one read at 0.7 of it, pruned).
    /// Pruning a schedule of thousands of nodes takes a fifth of a second, so only
    /// [`SEGMENTS_PRUNED`] are: the cheapest and those with the lowest peaks.
    fn offer_segments(&mut self, p: &Problem, schedules: Vec<Schedule>) -> Result<()> {
        let mut fitting = Vec::new();
        for s in schedules {
            let stats = simulate(p, &s)?;
            if stats.peak_bytes <= self.budget && stats.recomputations > 0 {
                fitting.push((s, stats));
            } else {
                self.offer("segment-dp", s, stats);
            }
        }
        fitting.sort_by_key(|(_, st)| st.peak_bytes);
        let cheapest = (0..fitting.len()).min_by(|&a, &b| {
            fitting[a]
                .1
                .compute_cost
                .total_cmp(&fitting[b].1.compute_cost)
        });
        for (i, (s, stats)) in fitting.into_iter().enumerate() {
            if i + 1 < SEGMENTS_PRUNED || Some(i) == cheapest {
                self.offer_pruned(p, "segment-dp", &s, None)?;
            } else {
                self.offer("segment-dp", s, stats);
            }
        }
        Ok(())
    }

    /// Whether the best schedule is one a solver proved optimal.
    fn best_proven(&self) -> bool {
        self.best.as_ref().is_some_and(|b| {
            self.proven
                .is_some_and(|c| b.stats.compute_cost <= c * (1.0 + 1e-12))
        })
    }

    fn bound(&mut self, b: f64, source: BoundSource) {
        let stage_model = matches!(
            source,
            BoundSource::Milp | BoundSource::Lp | BoundSource::BoundaryMilp
        );
        let slot = if stage_model && !self.order_forced {
            &mut self.order_bound
        } else {
            &mut self.lower_bound
        };
        if slot.is_none_or(|(x, _)| b > x) {
            *slot = Some((b, source));
        }
    }

    /// The best bound for the stage model's schedules: the order bound or, when higher, the
    /// bound for every schedule (which holds for them too).
    fn stage_bound(&self) -> Option<f64> {
        match (self.lower_bound, self.order_bound) {
            (Some((a, _)), Some((b, _))) => Some(a.max(b)),
            (a, b) => a.or(b).map(|(x, _)| x),
        }
    }

    /// Whether the best schedule is one the MILP proved optimal in the graph's order.
    fn best_proven_in_order(&self) -> bool {
        self.best.as_ref().is_some_and(|b| {
            self.proven_in_order
                .is_some_and(|c| b.stats.compute_cost <= c * (1.0 + 1e-12))
        })
    }

    /// Drops the recomputations the best schedule does not need under the budget
    /// ([`crate::budget::prune_recomputations`]); the solver's name is kept.
    fn prune_best(&mut self, p: &Problem) -> Result<()> {
        if self
            .best
            .as_ref()
            .is_none_or(|b| b.stats.recomputations == 0)
        {
            return Ok(());
        }
        // Taken out and offered again pruned: pruning never makes a schedule costlier or
        // lets it over the budget, so the pruned one takes its place.
        let Some(best) = self.best.take() else {
            return Ok(());
        };
        self.offer_pruned(p, &best.solver, &best.schedule, best.from_budget)
    }

    /// Offers `schedule` less the recomputations the budget does not need
    /// ([`crate::budget::prune_recomputations`]).
    fn offer_pruned(
        &mut self,
        p: &Problem,
        solver: &str,
        schedule: &Schedule,
        from_budget: Option<u64>,
    ) -> Result<()> {
        let pruned = crate::budget::prune_recomputations(p, schedule, self.budget, PRUNE_WORK);
        let stats = simulate(p, &pruned)?;
        self.offer_from(solver, pruned, stats, from_budget);
        Ok(())
    }

    /// Offers the plans found at lower budgets; one that is not a schedule of `p` is an error
    /// naming its budget.
    fn offer_earlier(&mut self, p: &Problem, earlier: &[Earlier]) -> Result<()> {
        for e in earlier {
            let stats = simulate(p, &e.schedule).map_err(|err| {
                SolverError::InvalidArgument(format!(
                    "the plan found earlier at budget {} bytes is not a schedule of {:?}: {err}",
                    e.budget_bytes, p.name
                ))
            })?;
            if stats.peak_bytes <= self.budget {
                self.offer_pruned(p, &e.solver, &e.schedule, Some(e.budget_bytes))?;
            }
        }
        Ok(())
    }

    /// A schedule to warm-start from: the cheapest feasible one.
    #[cfg_attr(not(feature = "highs"), allow(dead_code))]
    fn warm(&self) -> Option<Schedule> {
        self.best.as_ref().map(|c| c.schedule.clone())
    }
}

/// Plans a schedule for `p` within `opts.budget`. An infeasible budget is `Ok` with status
/// [`Status::Infeasible`], an empty schedule and `min_feasible_budget_bytes` set.
pub fn plan(p: &Problem, opts: &PlanOptions) -> Result<(Schedule, PlanReport)> {
    plan_reusing(p, opts, &[])
}

/// [`plan`], offered the schedules remat found for `p` at lower budgets: `auto` and `ilp`
/// return one of them, less the recomputations this budget does not need (its solver named,
/// `reused_from_budget_bytes` set), when nothing they run at this budget is cheaper, so the
/// cost never goes up with the budget. They are offered after the algorithm ran, which does
/// not see them: a plan's own path depends on its inputs alone. A baseline or the DP asked
/// for by name ignores them (the answer is that algorithm's). An earlier plan over this
/// budget is not offered; one that is not a schedule of `p` is an
/// [`SolverError::InvalidArgument`].
pub fn plan_reusing(
    p: &Problem,
    opts: &PlanOptions,
    earlier: &[Earlier],
) -> Result<(Schedule, PlanReport)> {
    opts.cancel.check()?;
    let start = Instant::now();
    let full = simulate(p, &store_all(p))?;
    let budget = opts.budget;
    let base = baselines::baselines(p, budget);
    phase_done(opts, "baselines", start)?;
    let mut pool = Pool {
        budget,
        best: None,
        lower_bound: None,
        proven: None,
        order_forced: p.order_is_forced(),
        order_bound: None,
        proven_in_order: None,
        min_peak: None,
        fitted: Vec::new(),
        time_points_ran: false,
    };
    match opts.algorithm {
        Algorithm::StoreAll
        | Algorithm::ChenSqrt
        | Algorithm::ChenGreedy
        | Algorithm::EveryK
        | Algorithm::Revolve => {
            let b = baselines::baseline(p, opts.algorithm.as_str(), budget)?;
            pool.offer(b.name, b.schedule, b.stats);
        }
        Algorithm::Dp => {
            let sol = crate::dp::solve_chain_with(p, budget, crate::dp::DpMode::Auto)?;
            if let Some(s) = sol.schedule {
                pool.offer_schedule(p, "dp", s)?;
                if let (Some(b), true) = (&pool.best, sol.optimal) {
                    pool.proven = Some(b.stats.compute_cost);
                }
            }
        }
        Algorithm::SegmentDp => {
            pool.offer_segments(p, crate::segments::solve(p, budget))?;
        }
        Algorithm::Ilp => {
            offer_baselines(&mut pool, &base);
            // Where no baseline fits (random graphs), the peak descent to the budget gives
            // HiGHS a start and the plan a fallback (what `--solver ilp` returned without it:
            // docs/bench/solver-tuning.md).
            if pool.best.is_none() && opts.budget >= p.footprint_lower_bound() {
                let descended = crate::budget::descend_to_budget(p, opts.budget);
                pool.offer_schedule(p, "descent", descended)?;
            }
            run_ilp(p, opts, &mut pool, opts.time_limit, true)?;
        }
        Algorithm::Auto => auto(p, opts, &base, &mut pool, start)?,
    }
    // The earlier plans come last, pruned to this budget like the schedule found here (which
    // `auto` pruned): compared before pruning, an earlier plan could displace a schedule found
    // here that pruning makes cheaper.
    if matches!(opts.algorithm, Algorithm::Auto | Algorithm::Ilp) {
        let t = Instant::now();
        pool.offer_earlier(p, earlier)?;
        phase_done(opts, "earlier plans", t)?;
    }
    // Every needed node is computed at least once: store-all's cost bounds every schedule.
    pool.bound(full.compute_cost, BoundSource::StoreAll);
    if !pool.time_points_ran {
        let t = Instant::now();
        time_point_bound(p, opts, &mut pool, start)?;
        phase_done(opts, "time-point bound", t)?;
    }
    let bound_seconds = if opts.bound_time.is_zero() {
        0.0
    } else {
        lp_bound(p, opts, &mut pool)?
    };
    let solve_seconds = start.elapsed().as_secs_f64();
    tracing::debug!(
        seconds = solve_seconds,
        budget,
        nodes = p.len(),
        "plan done"
    );
    let baselines: Vec<BaselineReport> = base
        .iter()
        .map(|b| BaselineReport {
            name: b.name.to_string(),
            peak_bytes: b.stats.peak_bytes,
            compute_cost: b.stats.compute_cost,
            overhead: b.stats.overhead(p),
            feasible: b.feasible,
        })
        .collect();
    let mut report = PlanReport {
        status: Status::Infeasible,
        solver: opts.algorithm.to_string(),
        budget_bytes: budget,
        store_all_peak_bytes: full.peak_bytes,
        store_all_cost: full.compute_cost,
        min_feasible_budget_bytes: None,
        predicted: Predicted {
            peak_bytes: 0,
            compute_cost: 0.0,
            overhead: 0.0,
            memory: Vec::new(),
        },
        lower_bound: pool.lower_bound.map(|(c, source)| LowerBound {
            compute_cost: c,
            source,
        }),
        gap: None,
        order_bound: pool.order_bound.map(|(c, source)| LowerBound {
            compute_cost: c,
            source,
        }),
        solve_seconds,
        bound_seconds,
        baselines,
        reused_from_budget_bytes: None,
        schedule: Vec::new(),
    };
    let proven = pool.best_proven();
    let proven_in_order = pool.best_proven_in_order();
    let Some(best) = pool.best else {
        let least = match pool.min_peak {
            Some(b) => b,
            None => crate::budget::min_feasible_budget(p).bytes,
        };
        report.min_feasible_budget_bytes = Some(least);
        return Ok((Schedule::default(), report));
    };
    let cost = best.stats.compute_cost;
    let mut gap = pool.lower_bound.map(|(lb, _)| gap(cost, lb));
    if proven {
        gap = Some(0.0);
        report.lower_bound = Some(LowerBound {
            compute_cost: pool.lower_bound.map_or(cost, |(lb, _)| lb.max(cost)),
            source: BoundSource::Exact,
        });
        report.order_bound = None;
    } else if proven_in_order {
        report.order_bound = Some(LowerBound {
            compute_cost: cost,
            source: BoundSource::Exact,
        });
    }
    report.status = if gap.is_some_and(|g| g <= OPTIMAL_GAP) {
        Status::Optimal
    } else {
        Status::Feasible
    };
    report.gap = gap;
    report.solver = best.solver;
    report.reused_from_budget_bytes = best.from_budget;
    report.predicted = Predicted {
        peak_bytes: best.stats.peak_bytes,
        compute_cost: cost,
        overhead: best.stats.overhead(p),
        memory: best.stats.memory,
    };
    report.schedule = best.schedule.to_json_steps(p);
    Ok((best.schedule, report))
}

/// A debug event with the time a phase of the plan took (`RUST_LOG=remat_solver=debug`); the
/// plan's look at its cancel flag between phases.
fn phase_done(opts: &PlanOptions, phase: &str, since: Instant) -> Result<()> {
    tracing::debug!(
        phase,
        seconds = since.elapsed().as_secs_f64(),
        "plan phase done"
    );
    opts.cancel.check()
}

fn offer_baselines(pool: &mut Pool, base: &[Baseline]) {
    for b in base {
        pool.offer(b.name, b.schedule.clone(), b.stats.clone());
    }
}

fn auto(
    p: &Problem,
    opts: &PlanOptions,
    base: &[Baseline],
    pool: &mut Pool,
    start: Instant,
) -> Result<()> {
    offer_baselines(pool, base);
    // A chain's DP schedule: proven optimal when the exact program ran (then nothing can do
    // better), otherwise a strong start that the search and the MILP try to improve (by how
    // much on MobileNet: docs/bench/solver-tuning.md).
    if crate::dp::as_training_chain(p).is_some() {
        let t = Instant::now();
        let sol = crate::dp::solve_chain_with(p, opts.budget, crate::dp::DpMode::Auto)?;
        phase_done(opts, "chain DP", t)?;
        if let Some(s) = sol.schedule {
            let stats = simulate(p, &s)?;
            if sol.optimal {
                pool.proven = Some(stats.compute_cost);
                pool.offer("dp", s, stats);
                return Ok(());
            }
            pool.offer("dp", s, stats);
        }
    }
    #[cfg(feature = "highs")]
    if bound_beside(p, opts) {
        // The time-point bound on a second thread, beside the segment program, the peak
        // descent and the search, instead of between the descent and the search: on graphs of
        // thousands of nodes each takes seconds.
        return std::thread::scope(|s| {
            let beside = s.spawn(|| time_points_within(p, opts, start));
            let finish = move |pool: &mut Pool| -> Result<()> {
                let out = beside.join().map_err(|_| {
                    SolverError::Ilp("the time-point bound's thread panicked".to_string())
                })??;
                if wants_time_points(pool) {
                    pool.time_points_ran = true;
                    apply_time_points(pool, &out);
                }
                Ok(())
            };
            auto_after_dp(p, opts, pool, start, Some(Box::new(finish)))
        });
    }
    auto_after_dp(p, opts, pool, start, None)
}

/// The time-point bound's result, when it ran on a thread of its own: applies it to the pool.
type BoundBeside<'a> = Box<dyn FnOnce(&mut Pool) -> Result<()> + 'a>;

/// `auto` after the chain DP: the segment program, the peak descent, the time-point bound
/// (or, when it runs on its own thread, `beside` after the search), the search, pruning and
/// the MILP.
fn auto_after_dp(
    p: &Problem,
    opts: &PlanOptions,
    pool: &mut Pool,
    start: Instant,
    beside: Option<BoundBeside<'_>>,
) -> Result<()> {
    // Rotor's program over the chain of stages between split points (the residual stream of
    // a transformer or a ResNet), at memory levels around the budget: exact for its class of
    // schedules, fast at any depth, and the start the search and the MILP improve on
    // (figures: docs/bench/transformers.md).
    let t = Instant::now();
    pool.offer_segments(p, crate::segments::solve(p, opts.budget))?;
    phase_done(opts, "segment program", t)?;
    let total = opts.time_limit;
    let left = |start: Instant| total.saturating_sub(start.elapsed());
    let binaries = ilp_binaries(p)?;
    let exact = binaries.is_some_and(|b| b <= EXACT_BINARIES);
    // The search's work budget follows from the time limit alone (not from the time left),
    // so a plan reproduces; the time left only caps it, with at least a tenth of the limit.
    // It gets a slice before an exact MILP (to warm-start it: HiGHS's own heuristics then
    // find the rest), the whole limit otherwise.
    let floor = total.mul_f64(0.1);
    let slice = if exact {
        total.mul_f64(SEARCH_SHARE).min(Duration::from_secs(5))
    } else {
        total
    };
    let limits = |start: Instant| search::SearchLimits {
        work: search::SearchLimits::for_time(slice).work,
        time: left(start).min(slice).max(floor),
        cancel: opts.cancel.clone(),
    };
    let floor_bytes = p.footprint_lower_bound();
    let needed = p.needed().iter().filter(|&&n| n).count();
    let runs = if needed <= PORTFOLIO_MAX_NODES {
        SEARCH_RUNS
    } else {
        1
    };
    if opts.budget < floor_bytes {
        // Nothing fits. The search's greedy peak descent still runs, for the least peak to
        // report: it is the path the search follows at every budget it has not met, so every
        // infeasible budget gets the same answer, and a plan at that peak meets it. Stopped
        // when the peak stops falling (not when the work is spent, as the search at a budget
        // above it would be): 0.02-1.5 s instead of 0.9-15 s on the fixture models and benchmark
        // graphs, the same least
        // peak (docs/bench/solver-tuning.md).
        let found = search::min_peak_portfolio(p, limits(start), runs)?;
        let low = crate::budget::min_feasible_budget(p);
        pool.min_peak = Some(
            found
                .lowest
                .map_or(low.bytes, |(_, st)| st.peak_bytes.min(low.bytes)),
        );
        return Ok(());
    }
    // Peak descent to a ladder of targets at and below the budget, each result pruned back to
    // the budget: descending further and then dropping the recomputations the budget does not
    // need finds cheaper schedules than stopping at the budget, and it fits budgets close to
    // the least peak that the search misses (figures and its time: docs/bench/solver-tuning.md).
    let t = Instant::now();
    let ladder_until = total.mul_f64(DESCENT_SHARE);
    for (rung, f) in DESCENT_LADDER.into_iter().enumerate() {
        let target = (opts.budget as f64 * f) as u64;
        if target < floor_bytes || (rung > 0 && start.elapsed() >= ladder_until) {
            break;
        }
        let descended = crate::budget::descend_to_budget(p, target);
        let pruned = crate::budget::prune_recomputations(p, &descended, opts.budget, PRUNE_WORK);
        pool.offer_schedule(p, "descent", pruned)?;
        opts.cancel.check()?;
    }
    phase_done(opts, "descent ladder", t)?;
    // The bound before the search: the search uses the time that is left, and on graphs of
    // tens of thousands of nodes, where its time is cut, the bound needs its seconds more
    // (the segment program's schedule is the plan there: docs/bench/transformers.md).
    // The bound on its own thread is joined after the search instead: nothing between reads
    // the bound, and the search runs on the other core meanwhile.
    if beside.is_none() {
        let t = Instant::now();
        time_point_bound(p, opts, pool, start)?;
        phase_done(opts, "time-point bound", t)?;
    }
    let t = Instant::now();
    let found = search::portfolio_search(p, opts.budget, limits(start), runs)?;
    phase_done(opts, "search", t)?;
    // The search's greedy phase does not depend on the budget until it fits it, so the least
    // peak it passed through here is one a plan with the same limits reaches (unless the
    // clock cuts it): it may report a lower minimum than `min_feasible_budget`.
    let search_low = found.lowest.as_ref().map(|(_, st)| st.peak_bytes);
    if let Some((s, st)) = found.best {
        pool.offer("search", s, st);
    }
    if let Some(finish) = beside {
        let t = Instant::now();
        finish(pool)?;
        phase_done(opts, "time-point bound (joined)", t)?;
    }
    if exact && pool.best.is_none() {
        let more = search::horizon_search(p, opts.budget, limits(start), 0xBEEF)?;
        if let Some((s, st)) = more.best {
            pool.offer("search", s, st);
        }
    }
    // When nothing but a baseline fits (budgets near the least peak), the minimum-peak
    // schedule, pruned back to the budget, is often far cheaper than the baseline that
    // reaches the budget (revolve on a deep GPT-2); when nothing fits, it is the answer if it
    // fits, and its peak is the least budget to report.
    if pool
        .fitted
        .iter()
        .all(|s| baselines::BASELINE_NAMES.contains(&s.as_str()))
    {
        let t = Instant::now();
        let low = crate::budget::min_feasible_budget(p);
        pool.min_peak = Some(search_low.map_or(low.bytes, |s| s.min(low.bytes)));
        if low.bytes <= opts.budget {
            // Both pruned before they are compared: pruning is what makes a baseline's
            // schedule cheap near its budget, and it may remain the better one.
            pool.prune_best(p)?;
            pool.offer_pruned(p, "min-peak", &low.schedule, None)?;
        }
        phase_done(opts, "min-peak schedule", t)?;
    }
    let t = Instant::now();
    pool.prune_best(p)?;
    phase_done(opts, "pruning", t)?;
    if exact {
        // HiGHS counts only its own solve: the model build before it and the pruning after it
        // get a share of the limit, so that `auto` ends within it.
        let margin = total.mul_f64(ILP_MARGIN);
        // The boundary model's MILP first, for the bound: it is a quarter of the full model
        // and HiGHS often closes it where the full MILP's bound is still at its root; when
        // that closes the gap to the MILP's own tolerance the full MILP is skipped, otherwise
        // it gets the rest of the time to improve the schedule (and bound it too): a bound
        // within OPTIMAL_GAP is not enough, the full MILP still finds schedules that much
        // cheaper (both measured: docs/bench/solver-tuning.md).
        let t = Instant::now();
        let share = left(start).saturating_sub(margin).mul_f64(BOUNDARY_SHARE);
        boundary_milp(p, opts, pool, share)?;
        phase_done(opts, "boundary MILP", t)?;
        if !settled_pool(pool, OPTIMAL_GAP / 10.0) {
            let t = Instant::now();
            run_ilp(p, opts, pool, left(start).saturating_sub(margin), false)?;
            pool.prune_best(p)?;
            phase_done(opts, "MILP", t)?;
        }
    }
    Ok(())
}

/// Whether the best schedule is proven optimal or within `gap` of a bound, for the stage
/// model's schedules at least (which ends the search for a cheaper one in the graph's order).
fn settled_pool(pool: &Pool, gap: f64) -> bool {
    within(pool, pool.stage_bound(), gap) || pool.best_proven_in_order() || settled(pool, gap)
}

/// Whether the best schedule is proven optimal or within `gap` of a bound for every schedule:
/// what the report's status says.
fn settled(pool: &Pool, gap: f64) -> bool {
    pool.best_proven() || within(pool, pool.lower_bound.map(|(lb, _)| lb), gap)
}

/// Whether the best schedule's cost is within `gap` of `bound`.
fn within(pool: &Pool, bound: Option<f64>, gap: f64) -> bool {
    let Some(best) = &pool.best else {
        return false;
    };
    let cost = best.stats.compute_cost;
    bound.is_some_and(|lb| cost <= 0.0 || (cost - lb) / cost <= gap)
}

/// HiGHS options for a MILP (the full one or the boundary one) within `time`, warm-started
/// from the pool's best schedule.
#[cfg(feature = "highs")]
fn milp_options(opts: &PlanOptions, pool: &Pool, time: Duration) -> crate::ilp::IlpOptions {
    let mut o = crate::ilp::IlpOptions::new(opts.budget, time);
    o.threads = opts.threads.max(1);
    // HiGHS keeps improving the schedule below the gap that counts as optimal while it has
    // time (schedules that far apart are both "optimal" at OPTIMAL_GAP: segnet in
    // docs/bench/solver-tuning.md).
    o.mip_gap = OPTIMAL_GAP / 10.0;
    o.warm_start = pool.warm();
    o.cancel = opts.cancel.clone();
    // The boundary MILP often proves the optimum's cost early; the full MILP's own bound may
    // take the rest of the limit to reach it (a 91-node ViT: 26 s of a 30 s limit).
    o.known_lower_bound = pool.stage_bound();
    o
}

/// Raises the pool's lower bound with the boundary model's MILP ([`crate::ilp::boundary_bound`])
/// within `time`, warm-started from the best schedule.
#[cfg(feature = "highs")]
fn boundary_milp(p: &Problem, opts: &PlanOptions, pool: &mut Pool, time: Duration) -> Result<()> {
    if pool.best.is_none() || time.is_zero() {
        return Ok(());
    }
    let out = crate::ilp::boundary_bound(p, &milp_options(opts, pool, time))?;
    if let Some(b) = out.bound {
        pool.bound(b, BoundSource::BoundaryMilp);
    }
    Ok(())
}

#[cfg(not(feature = "highs"))]
fn boundary_milp(
    _p: &Problem,
    _opts: &PlanOptions,
    _pool: &mut Pool,
    _time: Duration,
) -> Result<()> {
    Ok(())
}

#[cfg(feature = "highs")]
fn ilp_binaries(p: &Problem) -> Result<Option<usize>> {
    // Beyond this many nodes the model is far over EXACT_BINARIES; skip building its layout.
    if p.len() > 160 {
        return Ok(None);
    }
    Ok(Some(
        crate::ilp::model_size(p, crate::ilp::Model::Full)?.binaries,
    ))
}

#[cfg(not(feature = "highs"))]
fn ilp_binaries(_p: &Problem) -> Result<Option<usize>> {
    Ok(None)
}

#[cfg(feature = "highs")]
fn run_ilp(
    p: &Problem,
    opts: &PlanOptions,
    pool: &mut Pool,
    time: Duration,
    _explicit: bool,
) -> Result<()> {
    use crate::ilp::{self, IlpStatus};
    let out = ilp::solve(p, &milp_options(opts, pool, time))?;
    if let Some(lb) = out.lower_bound {
        pool.bound(lb, BoundSource::Milp);
    }
    if let (Some(s), Some(st)) = (out.schedule, out.stats) {
        // HiGHS's "optimal" proves this schedule only when the schedule costs what HiGHS's
        // objective says (HiGHS 1.16's presolve has ended a warm-started MILP "optimal" on a
        // point that is not a solution; see `ilp`).
        let agrees = out
            .objective
            .is_some_and(|o| (o - st.compute_cost).abs() <= 1e-6 * st.compute_cost.abs().max(1.0));
        if out.status == IlpStatus::Optimal && agrees {
            if pool.order_forced {
                pool.proven = Some(st.compute_cost);
            } else {
                pool.proven_in_order = Some(st.compute_cost);
            }
        }
        pool.offer("ilp", s, st);
    }
    Ok(())
}

/// The time the time-point bound's snapshots share when the limit leaves it: a fifth of the
/// limit, from [`TIME_POINTS_MIN`] to [`TIME_POINTS_MAX`].
#[cfg(feature = "highs")]
fn bound_share(time_limit: Duration) -> Duration {
    time_limit
        .mul_f64(TIME_POINTS_SHARE)
        .clamp(TIME_POINTS_MIN, TIME_POINTS_MAX)
}

/// Raises the pool's lower bound with the time-point relaxation ([`crate::bound`]) when a
/// schedule exists and nothing has proven it optimal. Its snapshots share [`bound_share`] of
/// the limit, or what is left of the limit since `start` when that is less (at least
/// [`TIME_POINTS_MIN`]); the pivot's relaxation, the first, may take all that is left, up to
/// [`TIME_POINTS_MAX`], so that graphs of tens of thousands of nodes get a bound when the
/// plan left the time. The relaxation bounds every schedule, so a schedule that fits where it
/// says none does is a bug; its bound is then left out.
#[cfg(feature = "highs")]
fn time_point_bound(
    p: &Problem,
    opts: &PlanOptions,
    pool: &mut Pool,
    start: Instant,
) -> Result<()> {
    if !wants_time_points(pool) {
        return Ok(());
    }
    pool.time_points_ran = true;
    let out = time_points_within(p, opts, start)?;
    apply_time_points(pool, &out);
    Ok(())
}

/// Whether the time-point bound would tell the pool anything: a schedule exists and nothing
/// has proven it optimal for every schedule (a MILP's optimum in the graph's order settles the
/// search, not the report: there the time-point bound may still beat store-all's, which was
/// all a `--solver ilp` plan of fcn_8_vgg reported).
#[cfg(feature = "highs")]
fn wants_time_points(pool: &Pool) -> bool {
    pool.best.is_some() && !settled(pool, OPTIMAL_GAP)
}

/// The time-point relaxation within the time [`time_point_bound`] gives it, from `start`.
#[cfg(feature = "highs")]
fn time_points_within(
    p: &Problem,
    opts: &PlanOptions,
    start: Instant,
) -> Result<crate::bound::TimePointBound> {
    let left = opts.time_limit.saturating_sub(start.elapsed());
    let limit = bound_share(opts.time_limit).min(left).max(TIME_POINTS_MIN);
    let pivot = left.clamp(limit, TIME_POINTS_MAX.max(limit));
    crate::bound::time_point_bound_within(p, opts.budget, limit, pivot, &opts.cancel)
}

/// Raises the pool's lower bound to the relaxation's.
#[cfg(feature = "highs")]
fn apply_time_points(pool: &mut Pool, out: &crate::bound::TimePointBound) {
    debug_assert!(
        !out.infeasible,
        "a schedule fits where the relaxation says none does"
    );
    if let (Some(b), false) = (out.bound, out.infeasible) {
        pool.bound(b, BoundSource::TimePoints);
    }
}

/// Whether `auto` runs the time-point bound on a thread of its own, beside the segment
/// program, the peak descent and the search: with a second thread allowed (`opts.threads`),
/// a budget that can fit, and at least [`BOUND_BESIDE_NODES`] needed nodes (on smaller graphs
/// both take a fraction of a second, and the bound may not be needed at all).
#[cfg(feature = "highs")]
fn bound_beside(p: &Problem, opts: &PlanOptions) -> bool {
    opts.threads >= 2
        && opts.budget >= p.footprint_lower_bound()
        && p.needed().iter().filter(|&&n| n).count() >= BOUND_BESIDE_NODES
}

#[cfg(not(feature = "highs"))]
fn time_point_bound(
    _p: &Problem,
    _opts: &PlanOptions,
    _pool: &mut Pool,
    _start: Instant,
) -> Result<()> {
    Ok(())
}

/// Raises the pool's lower bound with the boundary model's LP relaxation and then its MILP,
/// within `opts.bound_time`, when a schedule exists, no MILP has bounded it already (a MILP's
/// dual bound is at least the relaxation's) and the model is not over [`LP_BOUND_MAX_ROWS`].
/// Returns the seconds it spent (0 when it did not run).
#[cfg(feature = "highs")]
fn lp_bound(p: &Problem, opts: &PlanOptions, pool: &mut Pool) -> Result<f64> {
    let start = Instant::now();
    let by_milp = [pool.lower_bound, pool.order_bound]
        .into_iter()
        .flatten()
        .any(|(_, source)| matches!(source, BoundSource::Milp | BoundSource::BoundaryMilp));
    if pool.best.is_none() || by_milp || settled_pool(pool, OPTIMAL_GAP) {
        return Ok(0.0);
    }
    // The boundary model where it is small enough, otherwise the loose one (random n1000).
    use crate::ilp::{model_size, Model};
    // A graph too large to lay out (ilp::MAX_NODES) gets no LP bound.
    let rows = |model| model_size(p, model).map_or(usize::MAX, |s| s.rows);
    let model = if rows(Model::Boundary) <= LP_BOUND_MAX_ROWS {
        Model::Boundary
    } else if rows(Model::Loose) <= LP_BOUND_MAX_ROWS {
        Model::Loose
    } else {
        return Ok(0.0);
    };
    let mut lp_opts = crate::ilp::IlpOptions::new(opts.budget, opts.bound_time);
    lp_opts.threads = opts.threads.max(1);
    lp_opts.cancel = opts.cancel.clone();
    let lp = crate::ilp::lp_bound_with(p, model, &lp_opts)?;
    if let Some(b) = lp.bound {
        pool.bound(b, BoundSource::Lp);
    }
    // The rest of the time: the same model as a MILP, whose dual bound starts at the LP's.
    if model == Model::Boundary && lp.bound.is_some() && !settled_pool(pool, OPTIMAL_GAP) {
        boundary_milp(
            p,
            opts,
            pool,
            opts.bound_time.saturating_sub(start.elapsed()),
        )?;
    }
    Ok(start.elapsed().as_secs_f64())
}

#[cfg(not(feature = "highs"))]
fn lp_bound(_p: &Problem, _opts: &PlanOptions, _pool: &mut Pool) -> Result<f64> {
    Err(SolverError::Unavailable {
        solver: "LP bound".to_string(),
        why: "remat-solver was built without the `highs` feature".to_string(),
    })
}

#[cfg(not(feature = "highs"))]
fn run_ilp(
    _p: &Problem,
    _opts: &PlanOptions,
    _pool: &mut Pool,
    _time: Duration,
    explicit: bool,
) -> Result<()> {
    if explicit {
        return Err(SolverError::Unavailable {
            solver: "ilp".to_string(),
            why: "remat-solver was built without the `highs` feature".to_string(),
        });
    }
    Ok(())
}

/// Budget fractions a sweep plans at when its caller gives none: the service, the CLI and
/// `remat.torch.sweep` (through the extension) all take them from here.
pub const DEFAULT_FRACTIONS: [f64; 9] = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2];

/// Plans at each budget `fraction × store-all peak` (rounded up to whole bytes): the frontier
/// budget → overhead, with every baseline's overhead beside it. The points are planned from
/// the smallest budget up, each offered the schedule of the point below it
/// ([`plan_reusing`]), so that with `auto` or `ilp` the overhead never goes up with the
/// budget; they are returned in the order of `fractions`.
pub fn sweep(p: &Problem, fractions: &[f64], opts: &PlanOptions) -> Result<Vec<ParetoPoint>> {
    let budgets = sweep_budgets(fractions, schedule::store_all_peak(p))?;
    let mut order: Vec<usize> = (0..fractions.len()).collect();
    order.sort_by_key(|&i| budgets[i]);
    let mut points: Vec<Option<ParetoPoint>> = vec![None; fractions.len()];
    let mut below: Option<Earlier> = None;
    for i in order {
        let budget = budgets[i];
        let earlier: Vec<Earlier> = below.iter().cloned().collect();
        let (schedule, r) = plan_reusing(
            p,
            &PlanOptions {
                budget,
                ..opts.clone()
            },
            &earlier,
        )?;
        let feasible = r.status != Status::Infeasible;
        if feasible {
            below = Some(Earlier {
                budget_bytes: r.reused_from_budget_bytes.unwrap_or(budget),
                solver: r.solver.clone(),
                schedule,
            });
        }
        points[i] = Some(ParetoPoint {
            budget_bytes: budget,
            fraction: fractions[i],
            status: r.status,
            overhead: feasible.then_some(r.predicted.overhead),
            solver: r.solver,
            gap: r.gap,
            bound_source: r
                .gap
                .and(r.lower_bound.as_ref())
                .map(|b| b.source.name().to_string()),
            reused_from_budget_bytes: r.reused_from_budget_bytes,
            baselines: r
                .baselines
                .into_iter()
                .map(|b| (b.name, b.feasible.then_some(b.overhead)))
                .collect(),
            min_feasible_budget_bytes: r.min_feasible_budget_bytes.filter(|_| !feasible),
        });
    }
    Ok(points.into_iter().flatten().collect())
}

/// A sweep's budgets: each of `fractions` of `peak`, rounded up; an error names a fraction that
/// is not a positive number.
pub(crate) fn sweep_budgets(fractions: &[f64], peak: u64) -> Result<Vec<u64>> {
    if let Some(f) = fractions.iter().find(|f| !f.is_finite() || **f <= 0.0) {
        return Err(SolverError::InvalidArgument(format!(
            "sweep fraction {f} must be a positive number"
        )));
    }
    fractions
        .iter()
        .map(|&f| {
            fraction_of(f, peak).ok_or_else(|| {
                let f = if f < 1e6 { f.to_string() } else { format!("{f:e}") };
                SolverError::InvalidArgument(format!(
                    "sweep fraction {f}: {f} × the store-all peak ({peak} bytes) is more bytes than a budget can be"
                ))
            })
        })
        .collect()
}

/// `f` × `peak` bytes, rounded up (`peak` itself at 1: an `f64` is not exact past 2^53);
/// `None` past `u64::MAX`.
fn fraction_of(f: f64, peak: u64) -> Option<u64> {
    if f == 1.0 {
        return Some(peak);
    }
    let b = (f * peak as f64).ceil();
    (b.is_finite() && b < TWO_TO_64).then_some(b as u64)
}

/// 2^64: the least `f64` a `u64` cannot hold (`u64::MAX as f64` rounds up to it).
const TWO_TO_64: f64 = 18_446_744_073_709_551_616.0;

/// The relative gap of a plan costing `cost` to a lower bound `bound`: `(cost - bound) / cost`,
/// at least 0 (and 0 for a plan that costs nothing).
pub fn gap(cost: f64, bound: f64) -> f64 {
    if cost > 0.0 {
        ((cost - bound) / cost).max(0.0)
    } else {
        0.0
    }
}

/// Whether a budget text asks for the least budget (`"min"`, any case): [`least_budget`].
pub fn is_min_budget(s: &str) -> bool {
    s.trim().eq_ignore_ascii_case("min")
}

/// The least budget `auto` meets with the limits of `opts`: the minimum feasible budget its
/// plan reports for a budget nothing fits (what an infeasible budget's error names), for a
/// budget of `"min"`. A plan with these limits at that budget fits it.
pub fn least_budget(p: &Problem, opts: &PlanOptions) -> Result<u64> {
    let mut at_zero = opts.clone();
    at_zero.budget = 0;
    at_zero.algorithm = Algorithm::Auto;
    at_zero.bound_time = Duration::ZERO;
    let (_, report) = plan(p, &at_zero)?;
    Ok(report
        .min_feasible_budget_bytes
        .unwrap_or_else(|| crate::budget::min_feasible_budget(p).bytes))
}

/// Parses a budget: a size ([`parse_bytes`]: `"123"`, `"12GiB"`, `"800MB"`, `"1.5 GB"`,
/// `"1e9"`) or `"0.8x"` (a fraction of `store_all_peak`, rounded up).
pub fn parse_budget(s: &str, store_all_peak: u64) -> Result<u64> {
    let bad = |why: &str| SolverError::InvalidArgument(format!("budget {s:?}: {why}"));
    let (value, unit) = split_number(s).map_err(|why| bad(&why))?;
    if unit == "x" {
        return fraction_of(value, store_all_peak).ok_or_else(|| bad("too large"));
    }
    bytes_of(s, value, &unit, " or x").map_err(|why| bad(&why))
}

/// Parses a size in bytes: `"123"`, `"1e9"`, `"12GiB"`, `"800MB"`, `"1.5 GB"` (B, KB, MB, GB,
/// TB are powers of 1000; KiB, MiB, GiB, TiB powers of 1024; case-insensitive). A count of
/// bytes must be whole; a size with a unit is rounded down. The error names the text and what
/// is wrong with it.
pub fn parse_bytes(s: &str) -> Result<u64> {
    let bad = |why: &str| SolverError::InvalidArgument(format!("size {s:?}: {why}"));
    let (value, unit) = split_number(s).map_err(|why| bad(&why))?;
    bytes_of(s, value, &unit, "").map_err(|why| bad(&why))
}

/// The number a size or budget starts with (digits, a point, an exponent such as `e9`) and
/// the unit after it, lower-cased and trimmed.
fn split_number(s: &str) -> std::result::Result<(f64, String), String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty".into());
    }
    let bytes = t.as_bytes();
    let mut end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    // An exponent: e or E, a sign, and at least one digit.
    if end > 0 && matches!(bytes.get(end), Some(b'e' | b'E')) {
        let mut k = end + 1;
        if matches!(bytes.get(k), Some(b'+' | b'-')) {
            k += 1;
        }
        let digits = bytes[k..].iter().take_while(|b| b.is_ascii_digit()).count();
        if digits > 0 {
            end = k + digits;
        }
    }
    let (num, unit) = t.split_at(end);
    if num.is_empty() && t.starts_with('-') {
        return Err("cannot be negative".into());
    }
    if num.is_empty() {
        return Err("expected a number first, such as 12GiB, 800MB or 0.8x".into());
    }
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{num:?} is not a number"))?;
    Ok((value, unit.trim().to_ascii_lowercase()))
}

/// `value` in `unit` as whole bytes (`text` for the exact digits of a plain byte count);
/// `more_units` ends the list of units an unknown one is answered with.
fn bytes_of(
    text: &str,
    value: f64,
    unit: &str,
    more_units: &str,
) -> std::result::Result<u64, String> {
    let scale: f64 = match unit {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0f64.powi(2),
        "gib" => 1024.0f64.powi(3),
        "tib" => 1024.0f64.powi(4),
        other => {
            return Err(format!(
                "unknown unit {other:?}; use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB{more_units}"
            ))
        }
    };
    if !value.is_finite() {
        return Err("too large".into());
    }
    if scale == 1.0 {
        // Digits alone are read exactly (an f64 is not, past 2^53).
        let digits = text.trim().trim_end_matches(['b', 'B']).trim();
        if let Ok(n) = digits.parse::<u64>() {
            return Ok(n);
        }
        if value.fract() != 0.0 {
            return Err("a byte count must be a whole number".into());
        }
    }
    let b = (value * scale).floor();
    if b.is_finite() && b < TWO_TO_64 {
        Ok(b as u64)
    } else {
        Err("too large".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_source_names_are_the_json_ones() {
        use BoundSource::*;
        for b in [StoreAll, Milp, Lp, BoundaryMilp, TimePoints, Exact] {
            assert_eq!(serde_json::to_value(b).unwrap(), b.name(), "{b:?}");
        }
    }

    #[test]
    fn status_names_are_the_json_ones() {
        for st in [Status::Optimal, Status::Feasible, Status::Infeasible] {
            assert_eq!(serde_json::to_value(st).unwrap(), st.to_string(), "{st:?}");
        }
    }

    #[test]
    fn parses_budgets() {
        let cases: [(&str, u64); 13] = [
            ("123", 123),
            ("1e9", 1_000_000_000),
            ("2.5E3 B", 2500),
            ("1.5e3 MB", 1_500_000_000),
            ("18446744073709551615", u64::MAX),
            ("12GiB", 12 * 1024 * 1024 * 1024),
            ("800MB", 800_000_000),
            ("1.5 GB", 1_500_000_000),
            ("0.8x", 800),
            ("0.25X", 250),
            ("2 kib", 2048),
            (" 7b ", 7),
            ("1.0001x", 1001),
        ];
        for (s, want) in cases {
            assert_eq!(parse_budget(s, 1000).unwrap(), want, "{s}");
        }
    }

    /// Past 2^53 an `f64` is not exact: 1x is the store-all peak itself, and 2^64 bytes (or
    /// an infinite number) is too large, not u64::MAX or "not a whole number".
    #[test]
    fn budgets_at_the_edges_of_the_number_range() {
        let peak = (1u64 << 60) + 1;
        assert_eq!(parse_budget("1x", peak).unwrap(), peak);
        assert_eq!(parse_budget("1.0x", peak).unwrap(), peak);
        for s in ["16777216TiB", "18446744073709551616", "1e400", "1e400x"] {
            let e = parse_budget(s, 1000).unwrap_err().to_string();
            assert!(e.contains("too large"), "{s}: {e}");
        }
        let e = parse_budget("-5", 1000).unwrap_err().to_string();
        assert!(e.contains("cannot be negative"), "{e}");
        let e = sweep_budgets(&[0.5, 1e30], 1000).unwrap_err().to_string();
        assert!(e.contains("sweep fraction 1e30"), "{e}");
        assert_eq!(sweep_budgets(&[1.0], peak).unwrap(), vec![peak]);
    }

    #[test]
    fn an_unknown_unit_is_answered_with_the_units_there_are() {
        let e = parse_budget("3 parsecs", 1000).unwrap_err().to_string();
        assert!(e.contains("TiB or x"), "{e}");
        let e = parse_bytes("3x").unwrap_err().to_string();
        assert!(e.contains("\"x\"") && e.ends_with("GiB, TiB"), "{e}");
    }

    #[test]
    fn budget_errors_name_the_input() {
        for s in [
            "",
            "GiB",
            "12 parsecs",
            "1.5",
            "-3",
            "1.2.3MB",
            "99999999999999999999",
            "1e30",
            "1e30x",
            "1.5e0",
            "1e",
            "e9",
        ] {
            let e = parse_budget(s, 1000).unwrap_err().to_string();
            assert!(e.contains(&format!("{s:?}")), "{e}");
        }
    }

    /// A small training DAG with a skip connection (not a chain): auto must use the search.
    fn skip_dag() -> Problem {
        use crate::problem::{Node, NodeKind};
        let node = |id: &str, bytes: u64, deps: Vec<usize>, kind| Node {
            id: id.to_string(),
            name: id.to_string(),
            cost: 1.0 + bytes as f64 / 10.0,
            bytes,
            deps,
            kind,
            required: kind == NodeKind::Backward,
        };
        let nodes = vec![
            node("x0", 10, vec![], NodeKind::Forward),
            node("x1", 30, vec![0], NodeKind::Forward),
            node("x2", 20, vec![1, 0], NodeKind::Forward),
            node("x3", 10, vec![2], NodeKind::Forward),
            node("g3", 10, vec![3, 2], NodeKind::Backward),
            node("g2", 10, vec![4, 2, 1, 0], NodeKind::Backward),
            node("g1", 10, vec![5, 1, 0], NodeKind::Backward),
            node("g0", 10, vec![6, 0], NodeKind::Backward),
        ];
        Problem::new("skip", nodes, 0).unwrap()
    }

    #[test]
    fn auto_fits_a_tight_budget_and_never_loses_to_a_baseline() {
        let p = skip_dag();
        let full = schedule::store_all_peak(&p);
        for budget in [full, full - 20, p.footprint_lower_bound()] {
            let mut opts = PlanOptions::new(budget);
            opts.time_limit = Duration::from_millis(500);
            let (s, r) = plan(&p, &opts).unwrap();
            if r.status == Status::Infeasible {
                assert!(r.min_feasible_budget_bytes.is_some_and(|m| m > budget));
                continue;
            }
            let st = simulate(&p, &s).unwrap();
            assert!(st.peak_bytes <= budget);
            for b in r.baselines.iter().filter(|b| b.feasible) {
                assert!(st.compute_cost <= b.compute_cost + 1e-9, "{}", b.name);
            }
        }
    }

    #[cfg(not(feature = "highs"))]
    #[test]
    fn ilp_is_unavailable_without_highs() {
        let p = skip_dag();
        let opts = PlanOptions {
            algorithm: Algorithm::Ilp,
            ..PlanOptions::new(schedule::store_all_peak(&p))
        };
        assert!(matches!(
            plan(&p, &opts),
            Err(SolverError::Unavailable { .. })
        ));
    }

    #[test]
    fn algorithm_names_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(a.to_string().parse::<Algorithm>().unwrap(), a);
            assert_eq!(serde_json::to_string(&a).unwrap(), format!("\"{a}\""));
        }
        assert!("simplex".parse::<Algorithm>().is_err());
    }
}
