//! Planning a loaded model: the solver's options from a request, the plan, the per-value
//! decisions, and the plan and sweep documents.

use super::load::Loaded;
use crate::engine::document::{
    CostModel, Decision, DecisionKind, GraphInfo, PlanDocument, PlanGraph, SweepDocument,
    ValidationReport,
};
use crate::engine::{EngineError, ErrorKind, PlanRequest};
use remat_solver::plan::{self, Algorithm, PlanOptions, PlanReport, Status};
use remat_solver::{Cancel, NodeKind, Problem, Schedule, SolverError, Step};
use serde_json::json;
use std::time::Duration;

/// Default seconds a solver may spend when the request does not say (the engine's, which the
/// service's cap applies to).
pub use crate::engine::DEFAULT_TIME_LIMIT;

/// Budget fractions a sweep plans at when the request gives none (the solver's, shared with the
/// Python extension).
pub use remat_solver::plan::DEFAULT_FRACTIONS;

/// The outcome of planning one model at one budget.
pub struct Planned {
    pub schedule: Schedule,
    pub report: PlanReport,
}

/// Maps a solver error to the error a client can act on.
pub fn solver_error(e: SolverError) -> EngineError {
    match e {
        SolverError::Infeasible {
            budget,
            min_feasible,
        } => EngineError::new(
            ErrorKind::Unprocessable,
            "infeasible_budget",
            infeasible_message(budget, min_feasible, None, &|b| format!("{b} bytes")),
        )
        .with_details(json!({ "budget_bytes": budget, "min_feasible_budget_bytes": min_feasible })),
        SolverError::InvalidArgument(m) => {
            EngineError::new(ErrorKind::BadInput, "invalid_option", m)
        }
        SolverError::Unavailable { .. } => {
            EngineError::new(ErrorKind::BadInput, "invalid_option", e.to_string())
        }
        SolverError::Cancelled => EngineError::cancelled(),
        other => EngineError::new(ErrorKind::Internal, "internal", other.to_string()),
    }
}

/// Why a plan has no schedule, as the CLI and the API say it: the budget and the least peak
/// remat knows (each shown by `bytes`; found by searches, so not a proof that nothing fits
/// below it: a plan at a lower budget, or at a longer time limit, may find a lower one); when one `solver` was asked for and the budget is at
/// or above that least peak, that the solver alone found none, and that `auto` tries them all.
pub fn infeasible_message(
    budget: u64,
    min_feasible: u64,
    solver: Option<&str>,
    bytes: &dyn Fn(u64) -> String,
) -> String {
    match solver {
        Some(s) if budget >= min_feasible => format!(
            "budget {budget} bytes: solver {s} found no schedule within it, but remat reaches peaks down to {}: plan with the default solver (auto), which tries every method",
            bytes(min_feasible)
        ),
        Some(s) => format!(
            "budget {budget} bytes is infeasible: no plan remat found fits it; the least peak it reaches, its minimum feasible budget, is {} (solver {s} alone may need more)",
            bytes(min_feasible)
        ),
        None => format!(
            "budget {budget} bytes is infeasible: no plan remat found fits it; the least peak it reaches, its minimum feasible budget, is {}",
            bytes(min_feasible)
        ),
    }
}

/// The most seconds a time limit or a bound time may be (a year): a larger one is refused with
/// its name, not turned into a deadline that does not fit the clock.
pub const MAX_SECONDS: f64 = 365.0 * 86_400.0;

/// Whether `v` is a duration option's number of seconds: finite, at most [`MAX_SECONDS`], and
/// positive (or zero where `zero_ok`).
pub fn valid_seconds(v: f64, zero_ok: bool) -> bool {
    v.is_finite() && v <= MAX_SECONDS && (v > 0.0 || (zero_ok && v == 0.0))
}

/// A number of seconds as a message shows it: `1e30`, not thirty-one digits.
pub fn seconds_text(v: f64) -> String {
    if v.is_finite() && v.abs() >= 1e9 {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

/// The error of a plan request without a budget.
pub fn no_budget() -> EngineError {
    EngineError::new(
        ErrorKind::BadInput,
        "invalid_option",
        "budget is required: bytes (\"2147483648\"), a size (\"2GiB\", \"800MB\"), a fraction \
         of the store-all peak (\"0.6x\") or \"min\" (the least peak remat reaches)",
    )
}

/// The solver options of a request, resolved against the problem (fractions of store-all peak);
/// the plan stops when `cancel` is raised (as does the search for the least peak a `"min"`
/// budget runs here).
pub fn plan_options(
    problem: &Problem,
    req: &PlanRequest,
    threads: usize,
    cancel: &Cancel,
) -> Result<PlanOptions, EngineError> {
    let budget_text = req.budget.as_deref().ok_or_else(no_budget)?;
    let peak = remat_solver::store_all_peak(problem);
    let min = plan::is_min_budget(budget_text);
    // The error names the budget text itself (`budget "12 parsecs": unknown unit ...`).
    let budget = if min {
        0
    } else {
        plan::parse_budget(budget_text, peak)
            .map_err(|e| EngineError::new(ErrorKind::BadInput, "invalid_option", e.to_string()))?
    };
    let algorithm: Algorithm =
        req.solver
            .as_deref()
            .unwrap_or("auto")
            .parse()
            .map_err(|e: SolverError| {
                EngineError::new(
                    ErrorKind::BadInput,
                    "invalid_option",
                    format!("solver: {e}"),
                )
            })?;
    let secs = |name: &str, v: f64, zero_ok: bool| {
        if valid_seconds(v, zero_ok) {
            return Ok(v);
        }
        let kind = if zero_ok { "non-negative" } else { "positive" };
        Err(EngineError::new(
            ErrorKind::BadInput,
            "invalid_option",
            format!(
                "{name} must be a {kind} number of seconds up to a year ({MAX_SECONDS}), got {}",
                seconds_text(v)
            ),
        ))
    };
    let seconds = secs(
        "time_limit",
        req.time_limit.unwrap_or(DEFAULT_TIME_LIMIT),
        false,
    )?;
    let bound = secs("bound_time", req.bound_time.unwrap_or(0.0), true)?;
    let mut opts = PlanOptions {
        budget,
        algorithm,
        time_limit: Duration::from_secs_f64(seconds),
        threads,
        bound_time: Duration::from_secs_f64(bound),
        cancel: cancel.clone(),
    };
    if min {
        // `"min"`: the least peak `auto` reaches with these limits (what an infeasible
        // budget's error names), found first.
        opts.budget = plan::least_budget(problem, &opts).map_err(solver_error)?;
    }
    Ok(opts)
}

/// Plans a loaded model. An infeasible budget is an `Ok` with `Status::Infeasible`.
pub fn plan_loaded(loaded: &Loaded, opts: &PlanOptions) -> Result<Planned, EngineError> {
    plan_loaded_reusing(loaded, opts, &[])
}

/// [`plan_loaded`], offered plans found before (`remat_solver::plan::plan_reusing`).
pub fn plan_loaded_reusing(
    loaded: &Loaded,
    opts: &PlanOptions,
    earlier: &[plan::Earlier],
) -> Result<Planned, EngineError> {
    let (schedule, report) =
        plan::plan_reusing(&loaded.problem, opts, earlier).map_err(solver_error)?;
    Ok(Planned { schedule, report })
}

/// The decision for each value, with the reason, derived from the schedule.
pub fn decisions(problem: &Problem, schedule: &Schedule) -> Vec<Decision> {
    let mut computes = vec![0usize; problem.len()];
    for s in &schedule.steps {
        if let Step::Compute(v) = *s {
            computes[v] += 1;
        }
    }
    let base = problem.base_cost();
    let pct = |c: f64| if base > 0.0 { 100.0 * c / base } else { 0.0 };
    problem
        .nodes
        .iter()
        .enumerate()
        .map(|(v, node)| {
            let read_by_backward = problem
                .users(v)
                .iter()
                .any(|&u| problem.nodes[u].kind == NodeKind::Backward);
            let n = computes[v];
            let (decision, reason) = match (node.kind, n) {
                (_, 0) => (DecisionKind::Skipped, "not needed for the gradients".to_string()),
                (NodeKind::Backward, _) if n > 1 => (
                    DecisionKind::Recompute,
                    format!("backward value recomputed {} time(s)", n - 1),
                ),
                (NodeKind::Backward, _) => (
                    DecisionKind::Backward,
                    "computed once during backward".to_string(),
                ),
                (_, 1) if read_by_backward => (
                    DecisionKind::Keep,
                    format!(
                        "kept from forward to its last backward use: recomputing it would add {:.3}% compute to save {} bytes",
                        pct(node.cost),
                        node.bytes
                    ),
                ),
                (_, 1) => (
                    DecisionKind::Transient,
                    "freed after its last forward use (backward does not read it)".to_string(),
                ),
                (_, _) => (
                    DecisionKind::Recompute,
                    format!(
                        "freed after forward and recomputed {} time(s) for backward: +{:.3}% compute, {} bytes not held across the peak",
                        n - 1,
                        pct(node.cost * (n - 1) as f64),
                        node.bytes
                    ),
                ),
            };
            Decision {
                node: node.id.clone(),
                name: node.name.clone(),
                kind: node.kind,
                bytes: node.bytes,
                cost: node.cost,
                computes: n,
                deps: node
                    .deps
                    .iter()
                    .map(|&d| problem.nodes[d].id.clone())
                    .collect(),
                decision,
                reason,
            }
        })
        .collect()
}

/// What was loaded, as a document names it.
pub fn graph_info(loaded: &Loaded) -> GraphInfo {
    GraphInfo {
        name: loaded.problem.name.clone(),
        format: loaded.format,
        nodes: loaded.problem.len(),
    }
}

/// The plan as the CLI prints it (`--json`) and the API returns it: the solver's report
/// (status, figures, baselines, schedule) plus per-value decisions and what was loaded.
pub fn plan_document(
    loaded: &Loaded,
    planned: &Planned,
    validation: ValidationReport,
    cost_model: Option<CostModel>,
) -> PlanDocument {
    // No schedule, no decisions: an infeasible plan says so in `status`.
    let decisions = if planned.report.status == Status::Infeasible {
        Vec::new()
    } else {
        decisions(&loaded.problem, &planned.schedule)
    };
    PlanDocument {
        report: planned.report.clone(),
        decisions,
        graph: PlanGraph {
            info: graph_info(loaded),
            fixed_bytes: loaded.problem.fixed_bytes,
            store_all_cost: loaded.problem.base_cost(),
        },
        validation,
        model: loaded.inspect.clone(),
        cost_model,
        maximize: None,
    }
}

/// The Pareto frontier (budget → overhead) of a loaded model, with the baselines.
pub fn sweep_document(
    loaded: &Loaded,
    req: &PlanRequest,
    threads: usize,
    cancel: &Cancel,
) -> Result<SweepDocument, EngineError> {
    if req.maximize.is_some() {
        return Err(EngineError::new(
            ErrorKind::BadInput,
            "invalid_option",
            "maximize plans one budget at the largest value of a dim; a sweep plans many budgets at one value",
        ));
    }
    let mut probe = req.clone();
    probe.budget = Some(probe.budget.unwrap_or_else(|| "1.0x".to_string()));
    let opts = plan_options(&loaded.problem, &probe, threads, cancel)?;
    let fractions: Vec<f64> = if req.fractions.is_empty() {
        DEFAULT_FRACTIONS.to_vec()
    } else {
        req.fractions.clone()
    };
    if let Some(bad) = fractions.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
        return Err(EngineError::new(
            ErrorKind::BadInput,
            "invalid_option",
            format!("fractions must be positive numbers, got {bad}"),
        ));
    }
    let points = plan::sweep(&loaded.problem, &fractions, &opts).map_err(solver_error)?;
    Ok(SweepDocument {
        graph: graph_info(loaded),
        store_all_peak_bytes: remat_solver::store_all_peak(&loaded.problem),
        points,
    })
}
