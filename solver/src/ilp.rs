//! The Checkmate MILP (Jain et al., MLSys 2020, section 4) through `good_lp` and HiGHS.
//!
//! Stage `t` computes node `t` (in the natural order of the needed nodes) after recomputing
//! whatever it needs. Variables:
//! - `R[t,i]` (binary, `i < t`): node `i` is (re)computed in stage `t`; `R[t,t] = 1` is a
//!   constant, not a variable.
//! - `S[t,i]` (binary, `i < t`): `i` is resident at the start of stage `t`.
//! - `FREE[t,i,k]` (continuous in `[0,1]`): `i` (a dependency of `k`, or `k` itself) is freed
//!   right after `k` is computed in stage `t`.
//! - `U[t,k]` (continuous in `[0, budget]`): resident bytes right after `k` is computed.
//!
//! Constraints: `S[t+1,i] <= S[t,i] + R[t,i]`; `R[t,k] <= R[t,d] + S[t,d]` for every
//! dependency `d` of `k`; `FREE[t,i,k] <= R[t,k]` and `FREE[t,i,k] <= 1 - h` for every hazard
//! `h` (`S[t+1,i]`, or `R[t,j]` for a later user `j` of `i` in the stage); the `U` recurrence
//! `U[t,k0] = Σ S[t,i]·M_i + R[t,k0]·M_k0`, `U[t,k] = U[t,k'] − Σ M_i·FREE[t,i,k'] + R[t,k]·M_k`.
//! Freeing is only ever *allowed* by the constraints (never forced), so `U` bounds the memory
//! of the schedule with frees after last use from above; the extracted schedule is always
//! scored by [`simulate`].
//!
//! Stage-boundary rows (valid inequalities, ours): at the start of stage `t` every stored value
//! is resident and the stage's first computation adds its output,
//! `Σ S[t,i]·M_i + min M_k <= budget` (`k` over what stage `t` may compute); when stage `t`
//! computes `t`, its dependencies, `t` itself and every value stored into stage `t+1` are
//! resident (nothing computed after `t` in the stage; a value stored into `t+1` is never freed
//! in `t`), `Σ_{i ∉ deps(t)} S[t+1,i]·M_i + Σ_{d ∈ deps(t)} M_d + M_t <= budget`. Every
//! schedule of the stage model satisfies both, so they cut no schedule off; they cut off
//! fractional solutions that the `U` recurrence allows (it frees fractions of values), and
//! raise the LP relaxation's bound a lot (by how much: `docs/bench/solver-tuning.md`). [`lp_bound`] and
//! [`boundary_bound`] solve the *boundary model* (`R`, `S`, their rows and the boundary rows;
//! no `FREE`, no `U`) as an LP and as a MILP: a relaxation too (it drops rows), a quarter of the
//! size, whose LP is on the benchmark graphs as tight as or tighter than the full model's and
//! whose MILP HiGHS often closes in seconds. Where even that is too large (random n1000), the
//! *loose model* keeps only the dependency rows of each stage's own node (a weaker bound; the
//! sizes and times of both: `docs/bench/solver-tuning.md`).
//!
//! Model reductions: only needed nodes; `R[t,i]` only when `i` leads within stage `t` to node
//! `t` or to a value some later node reads (this excludes recomputing a value only to keep it
//! for recomputing its users at later stages); `S[t,i]` only when a stage `>= t` may compute a
//! user of `i` and `i` can be resident at the end of stage `t-1`; `FREE` only when no constant
//! hazard forbids it. Bytes are scaled so that the largest value is about 1024 units and costs
//! so that the largest is about 1000; the schedule is checked against the exact byte budget
//! and the model re-solved with a tightened budget if scaling tolerance let it exceed.
//!
//! Every solve runs through `highs_run` (crate-private), which holds its time limit: a MILP still
//! running at the deadline (HiGHS waits unchecked for its analytic-centre IPM) answers with the
//! incumbent and dual bound its callbacks saw.

use crate::cancel::Cancel;
use crate::error::{Result, SolverError};
use crate::highs_run::{self, Run};
use crate::problem::Problem;
use crate::schedule::{simulate, with_frees, Schedule, Stats};
use crate::search::Local;
use good_lp::solvers::highs::highs;
use good_lp::{variable, Expression, ProblemVariables, SolverModel, Variable};
use highs::HighsModelStatus;
use serde::Serialize;
use std::time::{Duration, Instant};

/// How to run the MILP.
#[derive(Debug, Clone)]
pub struct IlpOptions {
    /// Peak byte budget, fixed bytes included.
    pub budget: u64,
    pub time_limit: Duration,
    /// HiGHS threads (at least 1).
    pub threads: usize,
    /// Gap, relative to the total compute cost, at which HiGHS stops and reports optimal.
    pub mip_gap: f64,
    /// A feasible schedule to start from; ignored unless it is in stage form and fits.
    pub warm_start: Option<Schedule>,
    /// Stops the solve ([`SolverError::Cancelled`]) when raised.
    pub cancel: Cancel,
    /// A lower bound on the total compute cost proven elsewhere (the boundary model, the time
    /// points): the full MILP stops as soon as it finds a schedule within `mip_gap` of it
    /// (HiGHS's `objective_target`), which its own bound may take much longer to prove.
    pub known_lower_bound: Option<f64>,
}

impl IlpOptions {
    pub fn new(budget: u64, time_limit: Duration) -> Self {
        IlpOptions {
            budget,
            time_limit,
            threads: 1,
            mip_gap: 1e-4,
            warm_start: None,
            cancel: Cancel::default(),
            known_lower_bound: None,
        }
    }
}

/// How a MILP (or LP) solve ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IlpStatus {
    /// Solved to the requested gap.
    Optimal,
    /// A solution, not proven optimal (time limit).
    Feasible,
    /// Proven infeasible.
    Infeasible,
    /// Stopped (time limit) without any solution.
    NoSolution,
}

/// The outcome of [`solve`]. `schedule` and `stats` are present with a solution; `stats` is
/// always what [`simulate`] says of `schedule`.
#[derive(Debug, Clone)]
pub struct IlpOutcome {
    pub status: IlpStatus,
    pub schedule: Option<Schedule>,
    pub stats: Option<Stats>,
    /// The solver's objective (compute cost, in the problem's unit).
    pub objective: Option<f64>,
    /// The solver's proven lower bound on the compute cost.
    pub lower_bound: Option<f64>,
    /// `(cost − lower_bound) / cost`.
    pub gap: Option<f64>,
    pub seconds: f64,
    pub size: ModelSize,
    /// Whether HiGHS accepted the warm start.
    pub warm_started: bool,
}

/// Which model a solve builds (the module's documentation describes them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    /// Checkmate's stage model with the boundary rows: its MILP's solutions are schedules.
    Full,
    /// `R`, `S`, their rows and the boundary rows: a relaxation, for bounds.
    Boundary,
    /// The boundary model with the dependency rows of each stage's own node only (a
    /// recomputation inside a stage does not need its inputs): a looser relaxation with far
    /// fewer rows (how many fewer: `docs/bench/solver-tuning.md`).
    Loose,
}

/// Size of the MILP after reductions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ModelSize {
    pub binaries: usize,
    pub continuous: usize,
    pub rows: usize,
}

#[derive(Debug, Clone, Copy)]
enum Free {
    /// Always allowed: no hazard can forbid it.
    Always,
    Var(usize),
}

/// Index structure of the reduced model (no solver objects).
struct Layout {
    g: Local,
    m: usize,
    /// `r_at[t*m+i]`: column of `R[t,i]` (`NONE` when absent; `R[t,t]` is the constant 1).
    r_at: Vec<u32>,
    s_at: Vec<u32>,
    /// Per stage: computed positions in increasing order (`R` variables and `t`).
    comp: Vec<Vec<usize>>,
    /// Per stage, per computed position: the values that may be freed right after it.
    frees: Vec<Vec<Vec<FreeSlot>>>,
    /// Per stage, per computed position: the column of `U`.
    u_at: Vec<Vec<usize>>,
    columns: usize,
    binaries: usize,
    /// Rows of the model.
    rows: usize,
    model: Model,
}

const NONE: u32 = u32::MAX;

/// A value that may be freed after a computation: (value, FREE, columns of its hazards).
type FreeSlot = (usize, Free, Vec<usize>);

impl Layout {
    fn r(&self, t: usize, i: usize) -> Option<usize> {
        let c = self.r_at[t * self.m + i];
        (c != NONE).then_some(c as usize)
    }
    fn s(&self, t: usize, i: usize) -> Option<usize> {
        if t >= self.m {
            return None;
        }
        let c = self.s_at[t * self.m + i];
        (c != NONE).then_some(c as usize)
    }

    /// The layout of `model`: the boundary and loose models have no `FREE` or `U` columns
    /// (`frees` and `u_at` are empty per stage).
    fn new(p: &Problem, model: Model) -> Result<Self> {
        let g = Local::new(p);
        let m = g.len();
        let cells = m
            .checked_mul(m)
            .filter(|&c| c < (NONE as usize) && m <= MAX_NODES)
            .ok_or_else(|| {
                SolverError::Ilp(format!(
                    "graph of {m} needed nodes is too large for the MILP (at most {MAX_NODES}: \
                     its layout alone takes 8·n² bytes, its rows far more); plan with auto"
                ))
            })?;
        let mut r_at = vec![NONE; cells];
        let mut s_at = vec![NONE; cells];
        let mut columns = 0usize;
        let next = |columns: &mut usize| -> u32 {
            let c = *columns as u32;
            *columns += 1;
            c
        };
        let max_user: Vec<usize> = (0..m).map(|i| g.max_user(i)).collect();
        let mut useful = vec![false; m];
        // last_comp[k]: the last stage that may compute k.
        let mut last_comp: Vec<usize> = (0..m).collect();
        for t in 0..m {
            // R[t,i]: i leads (within the stage) to t or to a value a later stage reads.
            for x in (0..=t).rev() {
                useful[x] = x == t || (max_user[x] > t) || useful[x];
                if useful[x] {
                    for &d in &g.deps[x] {
                        useful[d] = true;
                    }
                }
            }
            for (i, u) in useful.iter_mut().enumerate().take(t) {
                if *u {
                    r_at[t * m + i] = next(&mut columns);
                    last_comp[i] = t;
                }
                *u = false;
            }
            useful[t] = false;
        }
        // last_read[i]: the last stage that may read i (computing one of its users).
        let last_read: Vec<usize> = (0..m)
            .map(|i| g.users[i].iter().map(|&k| last_comp[k]).max().unwrap_or(i))
            .collect();
        for t in 1..m {
            // S[t,i]: possibly read at a stage >= t and possibly resident at the end of t-1.
            for i in 0..t {
                if last_read[i] < t {
                    continue;
                }
                let prev = t - 1;
                let can = i == prev
                    || r_at[prev * m + i] != NONE
                    || (prev > 0 && s_at[prev * m + i] != NONE);
                if can {
                    s_at[t * m + i] = next(&mut columns);
                }
            }
        }
        let binaries = columns;
        let mut layout = Layout {
            g,
            m,
            r_at,
            s_at,
            comp: Vec::with_capacity(m),
            frees: Vec::with_capacity(m),
            u_at: Vec::with_capacity(m),
            columns,
            binaries,
            rows: 0,
            model,
        };
        let memory = layout.memory();
        let mut rows = 0usize;
        let mut boundary_rows = 0usize;
        for t in 0..m {
            let comp: Vec<usize> = (0..=t)
                .filter(|&i| i == t || layout.r(t, i).is_some())
                .collect();
            let mut stage_frees = Vec::with_capacity(comp.len());
            for &k in comp.iter().filter(|_| memory) {
                let mut fk = Vec::new();
                let candidates = layout.g.deps[k].iter().copied().chain(std::iter::once(k));
                for i in candidates {
                    let mut hazards = Vec::new();
                    let mut constant_hazard = false;
                    if t + 1 < m {
                        if let Some(c) = layout.s(t + 1, i) {
                            hazards.push(c);
                        }
                    }
                    for &j in &layout.g.users[i] {
                        if j <= k || j > t {
                            continue;
                        }
                        if j == t {
                            constant_hazard = true;
                        } else if let Some(c) = layout.r(t, j) {
                            hazards.push(c);
                        }
                    }
                    if constant_hazard {
                        continue;
                    }
                    let free = if hazards.is_empty() && k == t {
                        Free::Always
                    } else {
                        let c = layout.columns;
                        layout.columns += 1;
                        rows += hazards.len() + usize::from(k != t);
                        Free::Var(c)
                    };
                    fk.push((i, free, hazards));
                }
                stage_frees.push(fk);
            }
            // S[t+1,i] <= S[t,i] + R[t,i]
            if t + 1 < m {
                boundary_rows += (0..t).filter(|&i| layout.s(t + 1, i).is_some()).count();
            }
            // R[t,k] <= R[t,d] + S[t,d]
            boundary_rows += comp
                .iter()
                .filter(|&&k| layout.dep_rows(t, k))
                .map(|&k| layout.g.deps[k].len())
                .sum::<usize>();
            // The two stage-boundary rows.
            boundary_rows += 2;
            let mut u = Vec::with_capacity(comp.len());
            for _ in comp.iter().filter(|_| memory) {
                u.push(layout.columns);
                layout.columns += 1;
                rows += 1;
            }
            layout.comp.push(comp);
            layout.frees.push(stage_frees);
            layout.u_at.push(u);
        }
        layout.rows = rows + boundary_rows;
        Ok(layout)
    }

    /// Whether the model tracks memory within stages (`FREE`, `U`): the full model.
    fn memory(&self) -> bool {
        self.model == Model::Full
    }

    /// Whether stage `t` has dependency rows for computing `k` (the loose model keeps those
    /// of the stage's own node only).
    fn dep_rows(&self, t: usize, k: usize) -> bool {
        self.model != Model::Loose || k == t
    }

    fn size(&self) -> ModelSize {
        ModelSize {
            binaries: self.binaries,
            continuous: self.columns - self.binaries,
            rows: self.rows,
        }
    }

    /// Column values of a stage-form schedule (stages as from [`Local::stages_of`]), with the
    /// largest `U` (in scaled bytes; 0 for the boundary model, which has no `U`). `None` when
    /// the stages use a variable the model dropped.
    fn values_of(&self, stages: &[Vec<usize>], unit: f64) -> Option<(Vec<f64>, f64)> {
        let m = self.m;
        let g = &self.g;
        let mut x = vec![0.0; self.columns];
        let mut rt = vec![false; m * m];
        for (t, stage) in stages.iter().enumerate() {
            rt[t * m + t] = true;
            for &i in stage {
                // A recomputation the model dropped cannot matter; skip it.
                if let Some(c) = self.r(t, i) {
                    x[c] = 1.0;
                    rt[t * m + i] = true;
                }
            }
        }
        // Minimal residency: i is resident at the start of t when a stage >= t reads it
        // before recomputing it.
        let mut live = vec![false; m];
        let mut st = vec![false; m * m];
        let mut read = vec![false; m];
        for t in (1..m).rev() {
            read.iter_mut().for_each(|r| *r = false);
            for k in 0..=t {
                if rt[t * m + k] {
                    for &d in &g.deps[k] {
                        read[d] = true;
                    }
                }
            }
            for i in 0..t {
                live[i] = !rt[t * m + i] && (read[i] || live[i]);
                if live[i] {
                    let c = self.s(t, i)?;
                    x[c] = 1.0;
                    st[t * m + i] = true;
                }
            }
            live[t] = false;
        }
        if !self.memory() {
            // The boundary model has no memory columns; its rows hold for every stage-form
            // schedule that fits (see `boundary_rows_hold_for_every_stage_form_schedule`).
            return Some((x, 0.0));
        }
        let mut peak: f64 = 0.0;
        for t in 0..m {
            let mut mem: f64 = (0..t)
                .filter(|&i| st[t * m + i])
                .map(|i| g.bytes[i] as f64 / unit)
                .sum();
            for (pos, &k) in self.comp[t].iter().enumerate() {
                if rt[t * m + k] {
                    mem += g.bytes[k] as f64 / unit;
                }
                x[self.u_at[t][pos]] = mem;
                peak = peak.max(mem);
                for (i, free, hazards) in &self.frees[t][pos] {
                    let on = rt[t * m + k] && hazards.iter().all(|&h| x[h] < 0.5);
                    if on {
                        mem -= g.bytes[*i] as f64 / unit;
                    }
                    if let Free::Var(c) = free {
                        x[*c] = if on { 1.0 } else { 0.0 };
                    }
                }
            }
        }
        Some((x, peak))
    }
}

/// Size of `model` for `p` after reductions, without building it.
pub fn model_size(p: &Problem, model: Model) -> Result<ModelSize> {
    Ok(Layout::new(p, model)?.size())
}

/// Most needed nodes a MILP is laid out for: the layout's two `n × n` tables take 8·n² bytes
/// (1 GB here) before a row is built, and the rows of a graph this large would not fit anyway.
pub const MAX_NODES: usize = 11_000;

/// Bytes a built model takes per row, at most as measured: `remat plan --solver ilp` at 0.9x
/// of random n250's full model (661,552 rows) peaked at 2.0 GB resident, n100's (70,369
/// rows) at 0.45 GB with the rest of the plan. A model whose rows need more than half the
/// memory available is not built: the 96-layer GPT-2's, asked for with `--solver ilp` and a
/// 200 s limit, grew a server to 21 GB until the kernel killed it, and a cancel does not
/// reach the build.
pub const BUILD_BYTES_PER_ROW: u64 = 3 * 1024;

/// Whether a model of `rows` rows may be built with `available` bytes of memory (unknown:
/// yes, the time guard still holds): at [`BUILD_BYTES_PER_ROW`], at most half of it.
fn fits_in_memory(rows: usize, available: Option<u64>) -> bool {
    let needs = (rows as u64).saturating_mul(BUILD_BYTES_PER_ROW);
    available.is_none_or(|a| needs <= a / 2)
}

/// Rows of the MILP built per second, at least (1.3M measured on the 2-core development
/// machine: 19.9M rows in 15.3 s, the random 1,000-node graph of `../shared/bench/graphs`); a
/// model whose rows need more than the time left at this rate is not built.
pub const BUILD_ROWS_PER_SECOND: f64 = 1_000_000.0;

/// Solves the Checkmate MILP for `p` within `opts.budget`. Infeasible budgets and time-outs
/// are statuses, not errors.
pub fn solve(p: &Problem, opts: &IlpOptions) -> Result<IlpOutcome> {
    run(p, opts, false, Model::Full)
}

/// Solves the boundary model (the module's documentation says what it is) as a MILP within
/// `opts.time_limit`, warm-started from `opts.warm_start`, for its bound: the boundary model is
/// a relaxation of the stage model, so HiGHS's dual bound on it is a lower bound on the compute
/// cost of any schedule that fits (in the stage model), and from the root on at least the LP
/// relaxation's ([`lp_bound`]); often tighter, sooner, than the full MILP's (measured:
/// `docs/bench/solver-tuning.md`).
/// `Optimal` when HiGHS closed its gap (the bound is then the boundary model's optimum),
/// `NoSolution` when the time limit stopped it (with the bound reached, if the root was
/// solved), `Infeasible` when no schedule fits.
pub fn boundary_bound(p: &Problem, opts: &IlpOptions) -> Result<LpBound> {
    let out = run(p, opts, false, Model::Boundary)?;
    Ok(LpBound {
        status: out.status,
        bound: out.lower_bound,
        seconds: out.seconds,
    })
}

/// Solves the LP relaxation of `model` ([`Model::Boundary`] or the looser [`Model::Loose`] for
/// bounds; the module's documentation says what they are): a lower bound on the compute cost of
/// any schedule that fits the budget (in the stage model). `None` when the time limit cut it
/// short.
pub fn lp_bound(
    p: &Problem,
    model: Model,
    budget: u64,
    time_limit: Duration,
    threads: usize,
) -> Result<LpBound> {
    let mut opts = IlpOptions::new(budget, time_limit);
    opts.threads = threads;
    lp_bound_with(p, model, &opts)
}

/// [`lp_bound`] with the budget, time limit, threads and cancel flag of `opts` (its gap and
/// warm start are not used).
pub fn lp_bound_with(p: &Problem, model: Model, opts: &IlpOptions) -> Result<LpBound> {
    let out = run(p, opts, true, model)?;
    Ok(LpBound {
        status: out.status,
        bound: out.lower_bound,
        seconds: out.seconds,
    })
}

/// Result of [`lp_bound`] and [`boundary_bound`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LpBound {
    /// `Optimal` with a bound, `Infeasible` (no schedule fits even fractionally), or
    /// `NoSolution` (time limit).
    pub status: IlpStatus,
    pub bound: Option<f64>,
    pub seconds: f64,
}

/// Solves `model` as a MILP or its LP relaxation (`relax`); only the full MILP's solutions are
/// schedules.
fn run(p: &Problem, opts: &IlpOptions, relax: bool, model: Model) -> Result<IlpOutcome> {
    let start = Instant::now();
    if opts.budget < p.footprint_lower_bound() {
        return Ok(IlpOutcome::unsolved(
            IlpStatus::Infeasible,
            start,
            ModelSize::default(),
        ));
    }
    let layout = Layout::new(p, model)?;
    // Building the model cannot stop on the clock: one whose rows take longer to build than
    // the time left is not built (a 1,000-node random graph's 19.9M rows took 15 s, where the
    // limit was 1 s), and the answer is the time limit's.
    let size = layout.size();
    let left = opts
        .time_limit
        .saturating_sub(start.elapsed())
        .as_secs_f64();
    if size.rows as f64 / BUILD_ROWS_PER_SECOND > left {
        tracing::warn!(
            rows = size.rows,
            binaries = size.binaries,
            build_seconds = size.rows as f64 / BUILD_ROWS_PER_SECOND,
            time_left = left,
            "the MILP is not built: its rows take longer to build than the time limit leaves (raise the time limit to build it)"
        );
        return Ok(IlpOutcome::unsolved(IlpStatus::NoSolution, start, size));
    }
    let available = crate::sysmem::available_memory();
    if !fits_in_memory(size.rows, available) {
        tracing::warn!(
            rows = size.rows,
            binaries = size.binaries,
            needs_bytes = (size.rows as u64).saturating_mul(BUILD_BYTES_PER_ROW),
            available_bytes = available,
            "the MILP is not built: its rows would take more than half the memory available"
        );
        return Ok(IlpOutcome::unsolved(IlpStatus::NoSolution, start, size));
    }
    tracing::debug!(
        rows = size.rows,
        binaries = size.binaries,
        continuous = size.continuous,
        "building the MILP"
    );
    let g = &layout.g;
    let max_bytes = g.bytes.iter().copied().max().unwrap_or(1).max(1) as f64;
    let unit = (max_bytes / 1024.0).max(1.0);
    let max_cost = g.cost.iter().copied().fold(0.0, f64::max);
    let cost_unit = if max_cost > 0.0 {
        max_cost / 1000.0
    } else {
        1.0
    };
    let base: f64 = g.cost.iter().sum();
    let exact_cap = (opts.budget - p.fixed_bytes) as f64 / unit;
    let mut cap = exact_cap;
    let warm = match &opts.warm_start {
        Some(s) if !relax => g.stages_of(s).and_then(|st| layout.values_of(&st, unit)),
        _ => None,
    };
    let mut attempts = 0;
    loop {
        attempts += 1;
        let warm_ok = warm
            .as_ref()
            .filter(|(_, peak)| *peak <= cap)
            .map(|(x, _)| x);
        let params = |presolve: bool| SolveParams {
            cap,
            unit,
            cost_unit,
            base,
            relax,
            time_limit: opts.time_limit.saturating_sub(start.elapsed()),
            threads: opts.threads.max(1),
            mip_gap: opts.mip_gap,
            warm: warm_ok,
            presolve,
            cancel: &opts.cancel,
            known_lower_bound: opts.known_lower_bound,
        };
        let mut out = solve_once(&layout, params(true))?;
        if out.status == IlpStatus::Infeasible {
            // HiGHS 1.16's presolve has called a feasible model infeasible: a training chain
            // whose exact DP fits 40 bytes in a budget of 43 (a proptest case, saved in
            // tests/proptest-regressions/ilp.txt). An infeasible answer stands only once HiGHS
            // gives it without presolve too.
            out = solve_once(&layout, params(false))?;
        }
        out.seconds = start.elapsed().as_secs_f64();
        if relax || model != Model::Full {
            return Ok(out.finish(None));
        }
        let Some(stages) = out.stages.take() else {
            return Ok(out.finish(None));
        };
        let schedule = with_frees(p, &g.computes_of(&stages));
        let stats = simulate(p, &schedule)?;
        if stats.peak_bytes <= opts.budget {
            return Ok(out.finish(Some((schedule, stats))));
        }
        // Tolerances of the scaled model let it exceed the exact budget: tighten and retry.
        let excess = (stats.peak_bytes - opts.budget) as f64 / unit;
        cap -= excess + 1e-6 * exact_cap.max(1.0);
        if attempts >= 3 || cap <= 0.0 || start.elapsed() >= opts.time_limit {
            return Err(SolverError::Ilp(format!(
                "the MILP schedule exceeds the budget of {} bytes by {} bytes after {attempts} attempts",
                opts.budget,
                stats.peak_bytes - opts.budget
            )));
        }
    }
}

struct SolveParams<'a> {
    cap: f64,
    unit: f64,
    cost_unit: f64,
    base: f64,
    relax: bool,
    time_limit: Duration,
    threads: usize,
    mip_gap: f64,
    warm: Option<&'a Vec<f64>>,
    /// Whether HiGHS presolves the model (see `run`).
    presolve: bool,
    cancel: &'a Cancel,
    /// [`IlpOptions::known_lower_bound`].
    known_lower_bound: Option<f64>,
}

struct Raw {
    status: IlpStatus,
    stages: Option<Vec<Vec<usize>>>,
    objective: Option<f64>,
    lower_bound: Option<f64>,
    seconds: f64,
    size: ModelSize,
    warm_started: bool,
}

impl IlpOutcome {
    /// An answer without a solve: no schedule, objective or bound.
    fn unsolved(status: IlpStatus, start: Instant, size: ModelSize) -> IlpOutcome {
        IlpOutcome {
            status,
            schedule: None,
            stats: None,
            objective: None,
            lower_bound: None,
            gap: None,
            seconds: start.elapsed().as_secs_f64(),
            size,
            warm_started: false,
        }
    }
}

impl Raw {
    fn finish(self, solution: Option<(Schedule, Stats)>) -> IlpOutcome {
        let (schedule, stats) = match solution {
            Some((s, st)) => (Some(s), Some(st)),
            None => (None, None),
        };
        let gap = match (&stats, self.lower_bound) {
            (Some(st), Some(lb)) if st.compute_cost > 0.0 => {
                Some(((st.compute_cost - lb) / st.compute_cost).max(0.0))
            }
            (Some(_), Some(_)) => Some(0.0),
            _ => None,
        };
        IlpOutcome {
            status: self.status,
            schedule,
            stats,
            objective: self.objective,
            lower_bound: self.lower_bound,
            gap,
            seconds: self.seconds,
            size: self.size,
            warm_started: self.warm_started,
        }
    }
}

/// A row `Σ coef·x[col] <= cap − held` (bytes in the model's scaled unit).
struct BoundaryRow {
    terms: Vec<(usize, f64)>,
    held: f64,
}

/// The two stage-boundary rows of stage `t` (see the module's documentation), bytes divided
/// by `unit`.
fn boundary_rows(layout: &Layout, t: usize, unit: f64) -> [BoundaryRow; 2] {
    let g = &layout.g;
    let w = |i: usize| g.bytes[i] as f64 / unit;
    // Stage start: every stored value, and the first computation's output.
    let first = layout.comp[t]
        .iter()
        .map(|&k| w(k))
        .fold(f64::INFINITY, f64::min);
    let start = BoundaryRow {
        terms: (0..t)
            .filter_map(|i| layout.s(t, i).map(|c| (c, w(i))))
            .collect(),
        held: first,
    };
    // Computing `t`: its dependencies, itself, and every value stored into stage t+1.
    let deps = &g.deps[t];
    let compute = BoundaryRow {
        terms: (0..t)
            .filter(|i| !deps.contains(i))
            .filter_map(|i| layout.s(t + 1, i).map(|c| (c, w(i))))
            .collect(),
        held: w(t) + deps.iter().map(|&d| w(d)).sum::<f64>(),
    };
    [start, compute]
}

fn solve_once(layout: &Layout, sp: SolveParams<'_>) -> Result<Raw> {
    let g = &layout.g;
    let m = layout.m;
    if layout.columns == 0 && !layout.memory() {
        // A boundary model without variables (nothing to store or recompute): its rows are
        // constants that hold, since the budget is at least every node's footprint (`run`
        // checks it first), and its optimum is the store-all cost. HiGHS would only answer
        // "model empty".
        return Ok(Raw {
            status: IlpStatus::Optimal,
            stages: None,
            objective: None,
            lower_bound: Some(sp.base),
            seconds: 0.0,
            size: layout.size(),
            warm_started: false,
        });
    }
    let mut vars = ProblemVariables::new();
    let mut cols: Vec<Variable> = Vec::with_capacity(layout.columns);
    // Columns are created in layout order: R and S (interleaved as laid out), then FREE and U.
    let mut kinds = vec![0u8; layout.columns]; // 0 binary, 1 free in [0,1], 2 U
    for t in 0..m {
        for fk in &layout.frees[t] {
            for (_, free, _) in fk {
                if let Free::Var(c) = free {
                    kinds[*c] = 1;
                }
            }
        }
        for &u in &layout.u_at[t] {
            kinds[u] = 2;
        }
    }
    for &kind in &kinds {
        let def = match kind {
            0 if sp.relax => variable().clamp(0, 1),
            0 => variable().binary(),
            1 => variable().clamp(0, 1),
            _ => variable().clamp(0.0, sp.cap.max(0.0)),
        };
        cols.push(vars.add(def));
    }
    let mut objective = Expression::with_capacity(layout.binaries);
    for t in 0..m {
        for i in 0..t {
            if let Some(c) = layout.r(t, i) {
                objective.add_mul(g.cost[i] / sp.cost_unit, cols[c]);
            }
        }
    }
    let mut model = vars.minimise(objective).using(highs);
    for t in 0..m {
        // S[t+1,i] <= S[t,i] + R[t,i]
        if t + 1 < m {
            for i in 0..t {
                if let Some(c) = layout.s(t + 1, i) {
                    let mut e = Expression::from(cols[c]);
                    if let Some(s) = layout.s(t, i) {
                        e.add_mul(-1.0, cols[s]);
                    }
                    if let Some(r) = layout.r(t, i) {
                        e.add_mul(-1.0, cols[r]);
                    }
                    model.add_constraint(e.leq(0.0));
                }
            }
        }
        // R[t,k] <= R[t,d] + S[t,d]
        for &k in layout.comp[t].iter().filter(|&&k| layout.dep_rows(t, k)) {
            for &d in &g.deps[k] {
                let mut e = Expression::with_capacity(3);
                if let Some(r) = layout.r(t, d) {
                    e.add_mul(1.0, cols[r]);
                }
                if let Some(s) = layout.s(t, d) {
                    e.add_mul(1.0, cols[s]);
                }
                let c = if k == t {
                    e.geq(1.0)
                } else {
                    e.add_mul(-1.0, cols[layout.r(t, k).unwrap_or(0)]);
                    e.geq(0.0)
                };
                model.add_constraint(c);
            }
        }
        for row in boundary_rows(layout, t, sp.unit) {
            let mut e = Expression::with_capacity(row.terms.len());
            for (c, w) in row.terms {
                e.add_mul(w, cols[c]);
            }
            model.add_constraint(e.leq(sp.cap - row.held));
        }
        if !layout.memory() {
            continue;
        }
        // FREE[t,i,k] <= R[t,k], FREE[t,i,k] <= 1 - hazard
        for (pos, &k) in layout.comp[t].iter().enumerate() {
            for (_, free, hazards) in &layout.frees[t][pos] {
                let Free::Var(f) = *free else { continue };
                if let Some(r) = layout.r(t, k) {
                    model.add_constraint((cols[f] - cols[r]).leq(0.0));
                }
                for &h in hazards {
                    model.add_constraint((cols[f] + cols[h]).leq(1.0));
                }
            }
        }
        // Memory recurrence.
        for (pos, &k) in layout.comp[t].iter().enumerate() {
            let u = cols[layout.u_at[t][pos]];
            let mut e = Expression::from(u);
            if pos == 0 {
                for i in 0..t {
                    if let Some(s) = layout.s(t, i) {
                        e.add_mul(-(g.bytes[i] as f64) / sp.unit, cols[s]);
                    }
                }
            } else {
                e.add_mul(-1.0, cols[layout.u_at[t][pos - 1]]);
                for (i, free, _) in &layout.frees[t][pos - 1] {
                    let w = g.bytes[*i] as f64 / sp.unit;
                    match free {
                        Free::Var(f) => e.add_mul(w, cols[*f]),
                        Free::Always => e -= w,
                    }
                }
            }
            let w = g.bytes[k] as f64 / sp.unit;
            match layout.r(t, k) {
                Some(r) => e.add_mul(-w, cols[r]),
                None => e -= w,
            }
            model.add_constraint(e.eq(0.0));
        }
    }
    let size = layout.size();
    let mut hm = model
        .try_into_inner()
        .map_err(|e| SolverError::Ilp(e.to_string()))?;
    let opt = |name: &str| SolverError::Ilp(format!("HiGHS rejected option {name}"));
    let time_limit = sp.time_limit.max(Duration::from_millis(10));
    hm.try_set_option("time_limit", time_limit.as_secs_f64())
        .map_err(|_| opt("time_limit"))?;
    hm.try_set_option("threads", sp.threads as i32)
        .map_err(|_| opt("threads"))?;
    if !sp.relax {
        // The objective holds the recomputation cost only; the gap that matters is relative to
        // the total cost (base included), so stop on the absolute gap that amounts to it.
        hm.try_set_option("mip_rel_gap", sp.mip_gap.max(0.0))
            .map_err(|_| opt("mip_rel_gap"))?;
        hm.try_set_option("mip_abs_gap", sp.mip_gap.max(0.0) * sp.base / sp.cost_unit)
            .map_err(|_| opt("mip_abs_gap"))?;
        if let Some(lb) = sp.known_lower_bound.filter(|_| layout.memory()) {
            // Total cost `c` is within the gap of the bound when (c − lb) / c ≤ gap; HiGHS
            // stops once its incumbent's objective is below the target (strictly).
            let gap = sp.mip_gap.clamp(0.0, 0.5);
            let target = (lb / (1.0 - gap) - sp.base) / sp.cost_unit;
            if target.is_finite() && target > 0.0 {
                hm.try_set_option("objective_target", target * (1.0 + 1e-12))
                    .map_err(|_| opt("objective_target"))?;
            }
        }
        if !layout.memory() {
            // Solved for its bound alone: no time on primal heuristics (the warm start, when
            // there is one, is the incumbent that prunes).
            hm.try_set_option("mip_heuristic_effort", 0.0)
                .map_err(|_| opt("mip_heuristic_effort"))?;
            hm.try_set_option("mip_heuristic_run_feasibility_jump", false)
                .map_err(|_| opt("mip_heuristic_run_feasibility_jump"))?;
        }
    }
    let mut warm_started = false;
    if !sp.presolve || (sp.warm.is_some() && !layout.memory() && !sp.relax) {
        // Off when asked (`run`: confirming an infeasible answer), and for a boundary MILP with
        // a start: HiGHS 1.16's presolve mishandles a start for this model now and then: it
        // ended one "optimal" at 0 where its own LP relaxation is 375 (a proptest case, saved).
        // The bound stayed valid but weak; without presolve it is right.
        hm.try_set_option("presolve", "off")
            .map_err(|_| opt("presolve"))?;
    }
    if let Some(x) = sp.warm {
        warm_started = hm.try_set_solution(Some(x), None, None, None).is_ok();
    }
    let to_cost = |obj: f64| obj * sp.cost_unit + sp.base;
    let mut raw = Raw {
        status: IlpStatus::NoSolution,
        stages: None,
        objective: None,
        lower_bound: None,
        seconds: 0.0,
        size,
        warm_started,
    };
    let solved = match highs_run::solve(hm, time_limit, sp.cancel)? {
        Run::Done(solved, _) => solved,
        Run::Overran(progress) => {
            // HiGHS passed its time limit (see `highs_run`): answer with what it had found.
            // An LP's bound counts only once solved; a MIP's dual bound holds at any time.
            if sp.relax {
                return Ok(raw);
            }
            raw.lower_bound = progress.dual_bound.map(to_cost);
            if let (true, Some((obj, x))) = (layout.memory(), progress.incumbent) {
                raw.status = IlpStatus::Feasible;
                raw.objective = Some(to_cost(obj));
                raw.stages = Some(stages_of(layout, &x));
            }
            return Ok(raw);
        }
    };
    let status = solved.status();
    let has_solution = solved
        .int_info_value(c"primal_solution_status")
        .unwrap_or(0)
        == 2;
    match status {
        HighsModelStatus::Infeasible => {
            raw.status = IlpStatus::Infeasible;
            return Ok(raw);
        }
        HighsModelStatus::Optimal => raw.status = IlpStatus::Optimal,
        HighsModelStatus::ReachedTimeLimit
        | HighsModelStatus::ReachedIterationLimit
        | HighsModelStatus::ReachedSolutionLimit
        | HighsModelStatus::ReachedInterrupt
        | HighsModelStatus::ReachedMemoryLimit
        | HighsModelStatus::ObjectiveBound
        | HighsModelStatus::ObjectiveTarget => {
            raw.status = if has_solution && !sp.relax {
                IlpStatus::Feasible
            } else {
                IlpStatus::NoSolution
            };
        }
        other => {
            return Err(SolverError::Ilp(format!(
                "HiGHS ended with status {other:?}"
            )))
        }
    }
    if sp.relax {
        if raw.status == IlpStatus::Optimal {
            raw.lower_bound = Some(to_cost(solved.objective_value()));
        }
        return Ok(raw);
    }
    if let Ok(b) = solved.double_info_value(c"mip_dual_bound") {
        if b.is_finite() {
            raw.lower_bound = Some(to_cost(b));
        }
    }
    if !layout.memory() {
        // The boundary model's solutions are not schedules: only its bound counts.
        if raw.status == IlpStatus::Feasible {
            raw.status = IlpStatus::NoSolution;
        }
        return Ok(raw);
    }
    if !has_solution {
        if raw.status == IlpStatus::Optimal {
            raw.status = IlpStatus::NoSolution;
        }
        return Ok(raw);
    }
    raw.objective = Some(to_cost(solved.objective_value()));
    raw.stages = Some(stages_of(layout, solved.get_solution().columns()));
    Ok(raw)
}

/// The nodes each stage (re)computes, read off a solution's `R` columns.
fn stages_of(layout: &Layout, x: &[f64]) -> Vec<Vec<usize>> {
    (0..layout.m)
        .map(|t| {
            (0..t)
                .filter(|&i| {
                    layout
                        .r(t, i)
                        .is_some_and(|c| x.get(c).is_some_and(|v| *v > 0.5))
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{store_all, store_all_peak};

    fn training_chain(k: usize) -> Problem {
        crate::testutil::training_chain(k, |i| 1.0 + i as f64, |i| 100 + 10 * i as u64)
    }

    /// The 96-layer GPT-2's full model (94,261,275 rows) asked 290 GB at the measured rate,
    /// with 20 GB available: it is not built (it grew a server to 21 GB until the kernel killed
    /// it). Random n250's 661,552 rows (2 GB measured) are.
    #[test]
    fn a_model_whose_rows_would_not_fit_in_memory_is_not_built() {
        let available = Some(20_014_706_688);
        assert!(!fits_in_memory(94_261_275, available));
        assert!(fits_in_memory(661_552, available));
        assert!(!fits_in_memory(661_552, Some(1 << 30)));
        assert!(
            fits_in_memory(usize::MAX, None),
            "unknown: the time guard decides"
        );
        // A graph too large to lay out is an error naming its size.
        let big = crate::testutil::training_chain(MAX_NODES / 2 + 1, |_| 1.0, |_| 8);
        let e = Layout::new(&big, Model::Full)
            .err()
            .expect("too large")
            .to_string();
        assert!(e.contains("too large for the MILP"), "{e}");
    }

    #[test]
    fn warm_start_values_reproduce_simulated_memory() {
        let p = training_chain(6);
        let layout = Layout::new(&p, Model::Full).unwrap();
        let stages = layout.g.stages_of(&store_all(&p)).unwrap();
        let (_, peak) = layout.values_of(&stages, 1.0).unwrap();
        assert_eq!(peak as u64, store_all_peak(&p));
    }

    /// A training graph with skip connections (a small U-Net): forward `f0..f5`, where `f4`
    /// also reads `f1` and `f5` reads `f0`; backward nodes read several forward values.
    fn skip_graph() -> Problem {
        use crate::problem::{Node, NodeKind};
        let node = |id: &str, cost: f64, bytes: u64, deps: Vec<usize>, kind| Node {
            id: id.to_string(),
            name: String::new(),
            cost,
            bytes,
            deps,
            kind,
            required: kind == NodeKind::Backward,
        };
        let f = NodeKind::Forward;
        let b = NodeKind::Backward;
        let nodes = vec![
            node("f0", 1.0, 40, vec![], f),
            node("f1", 3.0, 30, vec![0], f),
            node("f2", 2.0, 50, vec![1], f),
            node("f3", 4.0, 20, vec![2], f),
            node("f4", 2.0, 35, vec![3, 1], f),
            node("f5", 1.0, 25, vec![4, 0], f),
            node("b5", 2.0, 25, vec![5, 4, 0], b),
            node("b4", 3.0, 35, vec![6, 3, 1], b),
            node("b3", 2.0, 20, vec![7, 2], b),
            node("b2", 2.0, 50, vec![8, 1], b),
            node("b1", 1.0, 30, vec![9, 0], b),
        ];
        Problem::new("skip", nodes, 7).unwrap()
    }

    /// The boundary rows cut off no schedule: every stage-form schedule satisfies them at its
    /// own peak — store-all, the baselines (which know nothing of the rows) and the MILP's,
    /// at many budgets.
    #[test]
    fn boundary_rows_hold_for_every_stage_form_schedule() {
        let cases = [training_chain(6), skip_graph()];
        for p in &cases {
            let layout = Layout::new(p, Model::Full).unwrap();
            let lo = p.footprint_lower_bound();
            let hi = store_all_peak(p);
            let mut schedules = vec![store_all(p)];
            for k in 0..=8 {
                let budget = lo + (hi - lo) * k / 8;
                let out = solve(p, &IlpOptions::new(budget, Duration::from_secs(20))).unwrap();
                schedules.extend(out.schedule);
                schedules.extend(
                    crate::baselines::baselines(p, budget)
                        .into_iter()
                        .map(|b| b.schedule),
                );
            }
            let mut checked = 0;
            for s in &schedules {
                let Some(stages) = layout.g.stages_of(s) else {
                    continue;
                };
                let (x, peak) = layout.values_of(&stages, 1.0).unwrap();
                let cap = peak;
                for t in 0..layout.m {
                    for row in boundary_rows(&layout, t, 1.0) {
                        let lhs: f64 = row.terms.iter().map(|&(c, w)| w * x[c]).sum();
                        assert!(
                            lhs <= cap - row.held + 1e-9,
                            "{}: stage {t}: {lhs} + {} > {cap}",
                            p.name,
                            row.held
                        );
                    }
                }
                checked += 1;
            }
            assert!(checked >= 3, "{}: {checked} stage-form schedules", p.name);
        }
    }

    #[test]
    fn store_all_budget_is_solved_without_recomputation() {
        let p = training_chain(5);
        let out = solve(
            &p,
            &IlpOptions::new(store_all_peak(&p), Duration::from_secs(20)),
        )
        .unwrap();
        assert_eq!(out.status, IlpStatus::Optimal);
        assert_eq!(out.stats.unwrap().compute_cost, p.base_cost());
    }

    /// A lower bound known from elsewhere stops the MILP at the first schedule within its gap
    /// of it (HiGHS's objective target): with the optimum's cost as that bound the answer is
    /// the optimum, at once; with a bound above every schedule's cost (a wrong one, to see the
    /// target act) the first incumbent, the warm start, ends the solve unproven.
    #[test]
    fn a_known_lower_bound_stops_the_milp_at_a_schedule_within_its_gap() {
        let p = training_chain(12);
        let budget = store_all_peak(&p) * 3 / 4;
        let plain = solve(&p, &IlpOptions::new(budget, Duration::from_secs(20))).unwrap();
        assert_eq!(plain.status, IlpStatus::Optimal, "{plain:?}");
        let optimum = plain.objective.expect("objective");
        let warm = plain.schedule.clone();
        let with_bound = |lb: f64| {
            let mut o = IlpOptions::new(budget, Duration::from_secs(20));
            o.known_lower_bound = Some(lb);
            o.warm_start = warm.clone();
            solve(&p, &o).unwrap()
        };
        let at_optimum = with_bound(optimum);
        let cost = at_optimum.objective.expect("objective");
        assert!(
            (cost - optimum).abs() <= 1e-9 * optimum,
            "{cost} vs {optimum}"
        );
        // A "bound" above store-all's cost: any schedule is below the target.
        let wrong = with_bound(10.0 * p.base_cost());
        assert_eq!(wrong.status, IlpStatus::Feasible, "{wrong:?}");
        assert!(wrong.schedule.is_some());
    }

    /// A model whose rows take longer to build than the time left is not built (building
    /// cannot stop on the clock): the answer is the time limit's, at once; with the time, the
    /// same model is built and solved.
    #[test]
    fn a_model_the_time_left_cannot_build_is_not_built() {
        let p = training_chain(12);
        let rows = model_size(&p, Model::Full).unwrap().rows;
        let short = Duration::from_secs_f64(0.5 * rows as f64 / BUILD_ROWS_PER_SECOND);
        let budget = store_all_peak(&p) * 3 / 4;
        let out = solve(&p, &IlpOptions::new(budget, short)).unwrap();
        assert_eq!(out.status, IlpStatus::NoSolution);
        assert!(out.schedule.is_none() && out.lower_bound.is_none());
        assert_eq!(out.size.rows, rows);
        let out = solve(&p, &IlpOptions::new(budget, Duration::from_secs(20))).unwrap();
        assert_eq!(out.status, IlpStatus::Optimal, "{out:?}");
    }
}
