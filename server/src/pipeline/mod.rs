//! The planning pipeline: model bytes → `Problem` → plan → plan document. [`Pipeline`] is the
//! real [`Engine`]; the CLI runs the same [`PlanJob`], so the command line and the API give the
//! same figures.
//!
//! The stages, each a module using only those before it: `rates` (the roofline rates of the
//! process), `load` (ONNX or node-link bytes to a solver problem, ONNX costs by the roofline),
//! `solve` (options, plan, decisions, documents), `execute` (the executor's run), `costs`
//! (FLOPs or measured costs instead, and the document's cost model), `maximize` (the search
//! for the largest value of a dim that fits), `reuse` (plans found before, offered to a new
//! one), `job` (the builder that runs them in order).

mod costs;
mod execute;
mod job;
mod load;
mod maximize;
pub mod rates;
pub mod reuse;
mod solve;
pub mod torch;

pub use execute::{exec_error, not_runnable, validate_schedule, validation_report};
pub use job::{default_threads, Costs, PlanJob, PlanOutcome, Progress, Quiet, Stop};
pub use load::{import_options, load, not_json, planner_error, ExecModel, Loaded};
pub use solve::{
    decisions, infeasible_message, plan_document, plan_loaded, plan_options, seconds_text,
    solver_error, sweep_document, valid_seconds, Planned, DEFAULT_FRACTIONS, DEFAULT_TIME_LIMIT,
    MAX_SECONDS,
};

use crate::engine::{Engine, EngineError, History, ModelFormat, Phase, PlanRequest};
use remat_exec::ExecDevice;
use remat_solver::Cancel;
use serde_json::Value;

/// The real engine: planner + solver.
#[derive(Debug, Clone)]
pub struct Pipeline {
    /// Threads the exact solver may use.
    pub threads: usize,
    /// Where validations (and measured costs) run. Default: the CPU.
    pub device: ExecDevice,
}

impl Default for Pipeline {
    fn default() -> Self {
        Self::new()
    }
}

impl Pipeline {
    /// The engine with [`default_threads`].
    pub fn new() -> Self {
        Pipeline {
            threads: default_threads(),
            device: ExecDevice::Cpu,
        }
    }
}

/// A document as the service stores it.
fn to_value(document: &impl serde::Serialize) -> Result<Value, EngineError> {
    serde_json::to_value(document).map_err(|e| {
        EngineError::new(
            crate::engine::ErrorKind::Internal,
            "internal",
            format!("cannot serialize the document: {e}"),
        )
    })
}

impl Engine for Pipeline {
    fn plan(
        &self,
        model: &[u8],
        format: ModelFormat,
        request: &PlanRequest,
        history: &dyn History,
        progress: &dyn Fn(Phase),
        cancel: &Cancel,
    ) -> Result<Value, EngineError> {
        if format == ModelFormat::TorchGraph {
            let planned = torch::plan(model, request, cancel)?;
            if planned.infeasible {
                return Err(torch::infeasible_error(&planned.document));
            }
            return to_value(&planned.document);
        }
        let job = PlanJob::new(model, request)
            .threads(self.threads)
            .device(self.device)
            .history(history)
            .on_phase(progress)
            .cancel(cancel);
        let outcome = if request.maximize.is_some() {
            job.run()?
        } else {
            job.run_loaded(load(model, format, request)?)?
        };
        if let Some(e) = outcome.stop.infeasible_error() {
            return Err(e);
        }
        to_value(&outcome.document)
    }

    fn check(&self, model: &[u8], format: ModelFormat) -> Result<(), EngineError> {
        if format == ModelFormat::Onnx {
            load::not_json(model)?;
            remat_planner::onnx::check_model_bytes(model).map_err(load::planner_error)?;
        }
        Ok(())
    }

    fn check_options(&self, format: ModelFormat, request: &PlanRequest) -> Result<(), EngineError> {
        load::refuse_options(format, request)
    }

    fn check_plan(&self, request: &PlanRequest) -> Result<(), EngineError> {
        if request.maximize.is_some() {
            maximize::check(request)?;
        } else if request.budget.is_none() {
            return Err(solve::no_budget());
        }
        Ok(())
    }

    fn sweep(
        &self,
        model: &[u8],
        format: ModelFormat,
        request: &PlanRequest,
        cancel: &Cancel,
    ) -> Result<Value, EngineError> {
        if format == ModelFormat::TorchGraph {
            return to_value(&torch::sweep(model, request, cancel)?);
        }
        let loaded = load(model, format, request)?;
        to_value(&sweep_document(&loaded, request, self.threads, cancel)?)
    }
}
