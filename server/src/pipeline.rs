//! The planning pipeline: model bytes → `Problem` → plan → plan document. The real [`Engine`];
//! the CLI calls the same functions, so the command line and the API give the same figures.

use crate::engine::{Engine, EngineError, ErrorKind, ModelFormat, Phase, PlanRequest};
use remat_exec::{ExecDevice, ExecError, ExecFault, ValidateOptions, Validation};
use remat_planner::{ImportOptions, InspectReport, Model, PlannerError, TrainingGraph};
use remat_solver::plan::{self, Algorithm, PlanOptions, PlanReport, Status};
use remat_solver::{NodeKind, Problem, Schedule, SolverError, Step};
use serde_json::{json, Value};
use std::time::Duration;

/// Default seconds a solver may spend when the request does not say.
pub const DEFAULT_TIME_LIMIT: f64 = 30.0;

/// A model ready to plan: the solver problem and, for ONNX models, the importer's report and
/// what the executor needs to run it.
pub struct Loaded<'a> {
    pub problem: Problem,
    pub format: ModelFormat,
    pub inspect: Option<InspectReport>,
    pub exec: Option<ExecModel<'a>>,
}

/// An imported ONNX model, kept for the executor.
pub struct ExecModel<'a> {
    pub model: Model,
    pub training: TrainingGraph,
    /// The file's bytes, borrowed from the caller (not copied: only a validation reads them,
    /// for the stored weights).
    pub bytes: &'a [u8],
}

/// The outcome of planning one model at one budget.
pub struct Planned {
    pub schedule: Schedule,
    pub report: PlanReport,
}

/// The real engine: planner + solver.
#[derive(Debug, Clone)]
pub struct Pipeline {
    /// Threads the exact solver may use.
    pub threads: usize,
}

impl Default for Pipeline {
    fn default() -> Self {
        Self::new()
    }
}

impl Pipeline {
    pub fn new() -> Self {
        Pipeline {
            threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
                .min(2),
        }
    }
}

/// Which format the bytes are in: JSON when the first non-blank byte is `{`, else ONNX.
pub fn detect(model: &[u8]) -> ModelFormat {
    match model.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => ModelFormat::GraphJson,
        _ => ModelFormat::Onnx,
    }
}

pub fn import_options(req: &PlanRequest) -> ImportOptions {
    ImportOptions {
        dims: req.dims.clone(),
        params: req.params.clone(),
        inputs: req.inputs.clone(),
    }
}

/// Loads a model in either format into a solver problem.
pub fn load<'a>(
    model: &'a [u8],
    format: ModelFormat,
    req: &PlanRequest,
) -> Result<Loaded<'a>, EngineError> {
    let model_bytes = model;
    match format {
        ModelFormat::GraphJson => {
            let text = std::str::from_utf8(model).map_err(|e| {
                EngineError::new(
                    ErrorKind::BadInput,
                    "malformed_graph",
                    format!("graph JSON is not UTF-8: {e}"),
                )
            })?;
            let name = req.name.clone().unwrap_or_else(|| "graph".to_string());
            let problem = remat_solver::io::parse_node_link(text, &name).map_err(|e| {
                EngineError::new(ErrorKind::BadInput, "malformed_graph", e.to_string())
            })?;
            Ok(Loaded {
                problem,
                format,
                inspect: None,
                exec: None,
            })
        }
        ModelFormat::Onnx => {
            let opts = import_options(req);
            // `load` reports every unsupported node at once (a 422 listing them).
            let model = remat_planner::load(model, &opts).map_err(planner_error)?;
            let training = model.training_graph().map_err(planner_error)?;
            let report = InspectReport::new(&model, Some(&training));
            let mut problem = training.to_problem();
            if let Some(name) = &req.name {
                problem.name = name.clone();
            }
            Ok(Loaded {
                problem,
                format,
                inspect: Some(report),
                exec: Some(ExecModel {
                    model,
                    training,
                    bytes: model_bytes,
                }),
            })
        }
    }
}

/// Maps an importer error to the error a client can act on.
pub fn planner_error(e: PlannerError) -> EngineError {
    let message = e.to_string();
    match &e {
        PlannerError::Unsupported { nodes } => {
            EngineError::new(ErrorKind::Unprocessable, "unsupported_ops", message)
                .with_details(json!({ "unsupported": nodes }))
        }
        PlannerError::UnboundDims { names } => {
            EngineError::new(ErrorKind::Unprocessable, "unbound_dims", message)
                .with_details(json!({ "names": names }))
        }
        _ => EngineError::new(ErrorKind::BadInput, "malformed_model", message),
    }
}

fn solver_error(e: SolverError) -> EngineError {
    match e {
        SolverError::Infeasible {
            budget,
            min_feasible,
        } => EngineError::new(
            ErrorKind::Unprocessable,
            "infeasible_budget",
            format!(
                "budget {budget} bytes is infeasible: the minimum feasible budget is {min_feasible} bytes"
            ),
        )
        .with_details(json!({ "budget_bytes": budget, "min_feasible_budget_bytes": min_feasible })),
        SolverError::InvalidArgument(m) => EngineError::new(ErrorKind::BadInput, "invalid_option", m),
        SolverError::Unavailable { .. } => {
            EngineError::new(ErrorKind::BadInput, "invalid_option", e.to_string())
        }
        other => EngineError::new(ErrorKind::Internal, "internal", other.to_string()),
    }
}

/// The solver options of a request, resolved against the problem (fractions of store-all peak).
pub fn plan_options(
    problem: &Problem,
    req: &PlanRequest,
    threads: usize,
) -> Result<PlanOptions, EngineError> {
    let budget_text = req.budget.as_deref().ok_or_else(|| {
        EngineError::new(
            ErrorKind::BadInput,
            "invalid_option",
            "budget is required: bytes (\"2147483648\"), a size (\"2GiB\", \"800MB\") or a fraction of the store-all peak (\"0.6x\")",
        )
    })?;
    let peak = remat_solver::store_all_peak(problem);
    let budget = plan::parse_budget(budget_text, peak).map_err(|e| {
        EngineError::new(
            ErrorKind::BadInput,
            "invalid_option",
            format!("budget: {e}"),
        )
    })?;
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
    // A duration option in seconds: finite, and positive unless zero is allowed.
    let secs = |name: &str, v: f64, zero_ok: bool| {
        if v.is_finite() && (v > 0.0 || (zero_ok && v == 0.0)) {
            return Ok(v);
        }
        let kind = if zero_ok { "non-negative" } else { "positive" };
        Err(EngineError::new(
            ErrorKind::BadInput,
            "invalid_option",
            format!("{name} must be a {kind} number of seconds, got {v}"),
        ))
    };
    let seconds = secs(
        "time_limit",
        req.time_limit.unwrap_or(DEFAULT_TIME_LIMIT),
        false,
    )?;
    let bound = secs("bound_time", req.bound_time.unwrap_or(0.0), true)?;
    Ok(PlanOptions {
        budget,
        algorithm,
        time_limit: Duration::from_secs_f64(seconds),
        threads,
        bound_time: Duration::from_secs_f64(bound),
    })
}

/// Plans a loaded model. An infeasible budget is an `Ok` with `Status::Infeasible`.
pub fn plan_loaded(loaded: &Loaded, opts: &PlanOptions) -> Result<Planned, EngineError> {
    let (schedule, report) = plan::plan(&loaded.problem, opts).map_err(solver_error)?;
    Ok(Planned { schedule, report })
}

/// The decision for each value, with the reason, derived from the schedule.
pub fn decisions(problem: &Problem, schedule: &Schedule) -> Vec<Value> {
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
                (_, 0) => ("skipped", "not needed for the gradients".to_string()),
                (NodeKind::Backward, _) if n > 1 => (
                    "recompute",
                    format!("backward value recomputed {} time(s)", n - 1),
                ),
                (NodeKind::Backward, _) => ("backward", "computed once during backward".to_string()),
                (_, 1) if read_by_backward => (
                    "keep",
                    format!(
                        "kept from forward to its last backward use: recomputing it would add {:.3}% compute to save {} bytes",
                        pct(node.cost),
                        node.bytes
                    ),
                ),
                (_, 1) => (
                    "transient",
                    "freed after its last forward use (backward does not read it)".to_string(),
                ),
                (_, _) => (
                    "recompute",
                    format!(
                        "freed after forward and recomputed {} time(s) for backward: +{:.3}% compute, {} bytes not held across the peak",
                        n - 1,
                        pct(node.cost * (n - 1) as f64),
                        node.bytes
                    ),
                ),
            };
            json!({
                "node": node.id,
                "name": node.name,
                "kind": node.kind,
                "bytes": node.bytes,
                "cost": node.cost,
                "computes": n,
                "deps": node.deps.iter().map(|&d| problem.nodes[d].id.as_str()).collect::<Vec<_>>(),
                "decision": decision,
                "reason": reason,
            })
        })
        .collect()
}

/// Runs `schedule` on the executor (CPU unless `opts` says otherwise) and compares it with the
/// store-all run. Only ONNX models can run: a node-link graph has no tensors.
pub fn validate_schedule(
    loaded: &Loaded,
    schedule: &Schedule,
    opts: &ValidateOptions,
    progress: &mut (dyn FnMut(&str, usize, usize) + Send),
) -> Result<Validation, EngineError> {
    let Some(em) = &loaded.exec else {
        return Err(EngineError::new(
            ErrorKind::BadInput,
            "not_runnable",
            "only ONNX models can be validated: a node-link graph has no tensors to run",
        ));
    };
    remat_exec::validate(&em.model, &em.training, em.bytes, schedule, opts, progress)
        .map_err(exec_error)
}

/// Maps an executor error: a missing kernel or a schedule that does not fit the model is the
/// caller's input; anything else is internal.
pub fn exec_error(e: ExecError) -> EngineError {
    let (kind, code) = match e.fault() {
        Some(ExecFault::Unsupported | ExecFault::InvalidSchedule) => {
            (ErrorKind::BadInput, "not_runnable")
        }
        _ => (ErrorKind::Internal, "executor_failed"),
    };
    EngineError::new(kind, code, e.to_string())
}

/// The `validation` object of a plan document: the executor's report, or why it did not run.
pub fn validation_value(
    loaded: &Loaded,
    outcome: Option<Result<Validation, EngineError>>,
) -> Value {
    match outcome {
        Some(Ok(v)) => serde_json::to_value(&v).unwrap_or(Value::Null),
        Some(Err(e)) => json!({ "ran": false, "ok": null, "reason": e.message }),
        None if loaded.exec.is_none() => json!({
            "ran": false,
            "ok": null,
            "reason": "node-link graphs have no tensors to run: the figures are the simulator's predictions",
        }),
        None => json!({
            "ran": false,
            "ok": null,
            "reason": "not requested: the figures are the simulator's predictions (validate=true, or `remat plan --validate`, runs the plan and measures it)",
        }),
    }
}

/// The default validation options for a plan: CPU, the plan's budget.
pub fn validate_options(opts: &PlanOptions) -> ValidateOptions {
    ValidateOptions {
        device: ExecDevice::Cpu,
        budget_bytes: Some(opts.budget),
        ..ValidateOptions::default()
    }
}

/// The plan as the CLI prints it (`--json`) and the API returns it: the solver's report
/// (status, figures, baselines, schedule) plus per-value decisions and what was loaded.
/// `validation` is the executor's report when the plan was run.
pub fn plan_document(
    loaded: &Loaded,
    planned: &Planned,
    validation: Option<Result<Validation, EngineError>>,
) -> Value {
    let mut doc = serde_json::to_value(&planned.report).unwrap_or_else(|_| json!({}));
    if let Value::Object(map) = &mut doc {
        // No schedule, no decisions: an infeasible plan says so in `status`.
        let decided = if planned.report.status == Status::Infeasible {
            Vec::new()
        } else {
            decisions(&loaded.problem, &planned.schedule)
        };
        map.insert("decisions".into(), Value::Array(decided));
        map.insert(
            "graph".into(),
            json!({
                "name": loaded.problem.name,
                "format": loaded.format,
                "nodes": loaded.problem.len(),
                "fixed_bytes": loaded.problem.fixed_bytes,
                "store_all_cost": loaded.problem.base_cost(),
            }),
        );
        // Always present: either measured figures or why the figures are predictions.
        map.insert("validation".into(), validation_value(loaded, validation));
        if let Some(report) = &loaded.inspect {
            map.insert(
                "model".into(),
                serde_json::to_value(report).unwrap_or(Value::Null),
            );
        }
    }
    doc
}

/// The Pareto frontier (budget → overhead) of a loaded model, with the baselines.
pub fn sweep_document(
    loaded: &Loaded,
    req: &PlanRequest,
    threads: usize,
) -> Result<Value, EngineError> {
    let mut probe = req.clone();
    probe.budget = Some(probe.budget.unwrap_or_else(|| "1.0x".to_string()));
    let opts = plan_options(&loaded.problem, &probe, threads)?;
    let fractions: Vec<f64> = if req.fractions.is_empty() {
        vec![1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]
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
    Ok(json!({
        "graph": { "name": loaded.problem.name, "nodes": loaded.problem.len(), "format": loaded.format },
        "store_all_peak_bytes": remat_solver::store_all_peak(&loaded.problem),
        "points": points,
    }))
}

impl Engine for Pipeline {
    fn plan(
        &self,
        model: &[u8],
        format: ModelFormat,
        request: &PlanRequest,
        progress: &dyn Fn(Phase),
    ) -> Result<Value, EngineError> {
        let loaded = load(model, format, request)?;
        let opts = plan_options(&loaded.problem, request, self.threads)?;
        progress(Phase::Solving);
        let planned = plan_loaded(&loaded, &opts)?;
        if planned.report.status == Status::Infeasible {
            let min = planned.report.min_feasible_budget_bytes.unwrap_or(0);
            return Err(solver_error(SolverError::Infeasible {
                budget: opts.budget,
                min_feasible: min,
            }));
        }
        let validation = if request.validate == Some(true) {
            progress(Phase::Validating);
            Some(validate_schedule(
                &loaded,
                &planned.schedule,
                &validate_options(&opts),
                &mut |_, _, _| {},
            ))
        } else {
            None
        };
        Ok(plan_document(&loaded, &planned, validation))
    }

    fn sweep(
        &self,
        model: &[u8],
        format: ModelFormat,
        request: &PlanRequest,
    ) -> Result<Value, EngineError> {
        let loaded = load(model, format, request)?;
        sweep_document(&loaded, request, self.threads)
    }
}
