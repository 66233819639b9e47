//! Running a schedule on the executor (`remat_exec`) and reporting it in a plan document.

use super::load::Loaded;
use crate::engine::document::ValidationReport;
use crate::engine::{EngineError, ErrorKind};
use remat_exec::{ExecError, ExecFault, ValidateOptions, Validation};
use remat_solver::Schedule;

/// Why a node-link graph's plan is not run.
const GRAPH_NOT_RUN: &str =
    "node-link graphs have no tensors to run: the figures are the simulator's predictions";
/// Why a plan that nobody asked to run is not run.
const NOT_REQUESTED: &str = "not requested: the figures are the simulator's predictions (validate=true, or `remat plan --validate`, runs the plan and measures it)";

/// Runs `schedule` on the executor and compares it with the store-all run. Only ONNX models
/// can run: a node-link graph has no tensors.
pub fn validate_schedule(
    loaded: &Loaded,
    schedule: &Schedule,
    opts: &ValidateOptions,
    progress: &mut (dyn FnMut(&str, usize, usize) + Send),
) -> Result<Validation, EngineError> {
    let Some(em) = &loaded.exec else {
        return Err(not_runnable());
    };
    // The prediction beside the measurement is in the plan's own costs.
    let opts = ValidateOptions {
        costs: Some(loaded.problem.nodes.iter().map(|n| n.cost).collect()),
        ..opts.clone()
    };
    remat_exec::validate(&em.model, &em.training, em.bytes, schedule, &opts, progress)
        .map_err(exec_error)
}

/// The error for running a model that has no tensors.
pub fn not_runnable() -> EngineError {
    EngineError::new(
        ErrorKind::BadInput,
        "not_runnable",
        crate::engine::NOT_RUNNABLE,
    )
}

/// Maps an executor error: a missing kernel or a schedule that does not fit the model is the
/// caller's input; anything else is internal.
pub fn exec_error(e: ExecError) -> EngineError {
    let (kind, code) = match e.fault() {
        Some(ExecFault::Unsupported | ExecFault::InvalidSchedule) => {
            (ErrorKind::BadInput, "not_runnable")
        }
        Some(ExecFault::Memory) => (ErrorKind::Unprocessable, "insufficient_memory"),
        Some(ExecFault::Cancelled) => return EngineError::cancelled(),
        _ => (ErrorKind::Internal, "executor_failed"),
    };
    EngineError::new(kind, code, e.to_string())
}

/// The `validation` of a plan document: the executor's report, or why it did not run
/// (`outcome` is `None` when no run was asked for).
pub fn validation_report(
    loaded: &Loaded,
    outcome: Option<&Result<Validation, EngineError>>,
) -> ValidationReport {
    match outcome {
        Some(Ok(v)) => ValidationReport::Ran(Box::new(v.clone())),
        Some(Err(e)) => ValidationReport::not_run(e.message.clone()),
        None if loaded.exec.is_none() => ValidationReport::not_run(GRAPH_NOT_RUN),
        None => ValidationReport::not_run(NOT_REQUESTED),
    }
}
