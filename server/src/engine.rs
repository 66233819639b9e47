//! The seam between the HTTP service and the planning pipeline.
//!
//! The service (`api`, `jobs`, `store`) only knows this trait: it hands over model bytes and
//! options and gets a JSON plan document or an [`EngineError`] that says which HTTP status fits.
//! [`crate::pipeline::Pipeline`] is the real engine (planner + solver); tests of the job
//! machinery may use their own engines (slow, failing, panicking) to exercise queueing, timeouts
//! and failure handling.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Options of one plan or sweep request, as the API and the CLI accept them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PlanRequest {
    /// Budget: bytes ("123"), a size ("2GiB", "800MB") or a fraction of store-all peak ("0.6x").
    pub budget: Option<String>,
    /// Symbolic dimensions to bind, NAME -> VALUE.
    #[serde(default)]
    pub dims: BTreeMap<String, u64>,
    /// Algorithm name: auto (default), ilp, dp, chen-sqrt, chen-greedy, every-k, revolve, store-all.
    pub solver: Option<String>,
    /// Seconds the solver may spend.
    pub time_limit: Option<f64>,
    /// Extra seconds, after the schedule is found, for a lower bound from the boundary model
    /// (`remat_solver::plan::PlanOptions::bound_time`; none by default).
    pub bound_time: Option<f64>,
    /// Run the executor on the plan (ONNX models only).
    pub validate: Option<bool>,
    /// A display name for the model.
    pub name: Option<String>,
    /// Graph inputs to treat as parameters / as data (override the importer's rule).
    #[serde(default)]
    pub params: Vec<String>,
    #[serde(default)]
    pub inputs: Vec<String>,
    /// Budget fractions for a sweep (default: a grid from the minimum feasible budget to 1.0x).
    #[serde(default)]
    pub fractions: Vec<f64>,
}

/// Phases a job goes through, reported while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Solving,
    Validating,
}

/// What kind of failure, so that the service can pick the status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// Malformed input (bad ONNX bytes, bad JSON graph, bad option value): 400.
    BadInput,
    /// Well-formed but not plannable (unsupported ops, unbound dims, infeasible budget): 422.
    Unprocessable,
    /// A bug or an environment failure: 500 with a generic message.
    Internal,
}

/// A failure with a machine-readable code, a message for humans and structured details
/// (e.g. the unsupported nodes, the names of unbound dims, the minimum feasible budget).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct EngineError {
    pub kind: ErrorKind,
    /// Stable code, e.g. "malformed_model", "unsupported_ops", "unbound_dims", "infeasible_budget",
    /// "invalid_option", "internal".
    pub code: String,
    pub message: String,
    pub details: serde_json::Value,
}

impl EngineError {
    pub fn new(kind: ErrorKind, code: &str, message: impl Into<String>) -> Self {
        EngineError {
            kind,
            code: code.to_string(),
            message: message.into(),
            details: serde_json::Value::Null,
        }
    }

    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        self.details = details;
        self
    }
}

/// A model as posted: the raw bytes and what they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelFormat {
    Onnx,
    GraphJson,
}

/// The planning pipeline as the service sees it. Implementations are blocking (CPU bound) and
/// are called from worker threads, never from the async runtime.
pub trait Engine: Send + Sync + 'static {
    /// Plans one model. `progress` is called when the job enters a new phase. The returned
    /// document is the plan as the API returns it under `plan` (summary, decisions, baselines,
    /// schedule, validation).
    fn plan(
        &self,
        model: &[u8],
        format: ModelFormat,
        request: &PlanRequest,
        progress: &dyn Fn(Phase),
    ) -> Result<serde_json::Value, EngineError>;

    /// The Pareto frontier (budget -> overhead) of one model, with the baselines.
    fn sweep(
        &self,
        model: &[u8],
        format: ModelFormat,
        request: &PlanRequest,
    ) -> Result<serde_json::Value, EngineError>;

    /// Which format the bytes are in: graph JSON when the first non-blank byte is `{`, else ONNX.
    fn detect(&self, model: &[u8]) -> ModelFormat {
        crate::pipeline::detect(model)
    }
}
