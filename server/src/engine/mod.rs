//! The seam between the HTTP service and the planning pipeline.
//!
//! The service (`http`: routes, jobs, store) only knows this module: it hands over model bytes
//! and a [`PlanRequest`] and gets a JSON plan document or an [`EngineError`] that says which
//! HTTP status fits. [`document`] holds the documents' types, whose schemas the OpenAPI
//! document shows. `crate::pipeline::Pipeline` is the real engine (planner + solver); tests of
//! the job machinery may use their own engines (slow, failing, panicking) to exercise queueing,
//! timeouts and failure handling.
//!
//! Architecture invariant: this module knows neither the pipeline nor HTTP; both depend on it.

pub mod document;

use remat_solver::Cancel;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::{IntoParams, ToSchema};

/// Options of one plan or sweep request: the one declaration of them. The API reads it from
/// the query string (the repeatable `dim`, `param`, `input` and `fraction`, see
/// `http::options`) and from an envelope's `options`; the CLI's subcommands and the gate's
/// `[[model]]` tables build it from their own arguments. Its JSON (this field order) is what
/// the service stores with a plan and keys its plan cache on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PlanRequest {
    /// Budget: bytes ("123"; in an envelope also a whole number), a size ("2GiB", "800MB") or
    /// a fraction of the store-all peak ("0.6x").
    #[schema(example = "0.6x")]
    #[param(example = "0.6x")]
    pub budget: Option<String>,
    /// Symbolic dimensions to bind, NAME -> VALUE; in a query `dim=NAME=VALUE`, repeatable
    /// (`dim=batch=2&dim=seq=128`).
    #[serde(default)]
    #[param(rename = "dim", value_type = Vec<String>)]
    pub dims: BTreeMap<String, u64>,
    /// Algorithm: auto (default), ilp, dp, segment-dp, chen-sqrt, chen-greedy, every-k, revolve, store-all.
    pub solver: Option<String>,
    /// Seconds the whole plan may take, its time-point bound included (the service clamps it
    /// to its cap; what runs to its end past it: `remat_solver::plan::PlanOptions::time_limit`).
    pub time_limit: Option<f64>,
    /// Extra seconds, after the schedule is found, to prove a lower bound on its cost where
    /// nothing proved one (graphs too large for the exact MILP: the boundary model's LP, then
    /// its MILP; `remat_solver::plan::PlanOptions::bound_time`); clamped like `time_limit`;
    /// 0 or absent: none.
    pub bound_time: Option<f64>,
    /// Run the executor on the plan (ONNX models only).
    pub validate: Option<bool>,
    /// A display name for the model.
    pub name: Option<String>,
    /// Graph inputs to treat as parameters (override the importer's rule); in a query
    /// `param`, repeatable.
    #[serde(default)]
    #[param(rename = "param")]
    pub params: Vec<String>,
    /// Graph inputs to treat as data (override the importer's rule); in a query `input`,
    /// repeatable.
    #[serde(default)]
    #[param(rename = "input")]
    pub inputs: Vec<String>,
    /// Weights the training keeps frozen (graph inputs or initializers: held, no gradient);
    /// glob patterns too; in a query `freeze`, repeatable. An envelope may name it `freeze`
    /// too, as the query, the CLI (`--freeze`) and the gate's config do.
    #[serde(default, skip_serializing_if = "Vec::is_empty", alias = "freeze")]
    #[param(rename = "freeze")]
    pub frozen: Vec<String>,
    /// Budget fractions of the store-all peak for a sweep (default: 1.0 down to 0.2); in a
    /// query `fraction`, repeatable.
    #[serde(default)]
    #[param(rename = "fraction")]
    pub fractions: Vec<f64>,
    /// Search for the largest value of this dim (a name, or `INPUT:AXIS`) whose plan fits the
    /// budget, read as the device's memory (bytes or a size, not a fraction), within
    /// `max_overhead`: the plan returned is the plan at that value (ONNX models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximize: Option<String>,
    /// With `maximize`: the most overhead a plan may have and still count as fitting, as a
    /// fraction (0.1 is 10%); absent: any overhead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_overhead: Option<f64>,
    /// With `validate`: timing rounds at least (store-all and the plan side by side in each,
    /// rounded up to a pair; 2 to [`MAX_REQUEST_TIMING_ROUNDS`]); absent: 2, and up to 8 while
    /// they last under two seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing_rounds: Option<u32>,
}

impl PlanRequest {
    /// Whether `self` and `other` plan the same problem: the same dims, parameters and inputs
    /// (the budget, the solver, the time limits, the run and the name leave the graph as it
    /// is). A request that searches for the largest value of a dim plans other problems.
    pub fn same_problem(&self, other: &PlanRequest) -> bool {
        let sorted = |v: &[String]| {
            let mut v = v.to_vec();
            v.sort();
            v.dedup();
            v
        };
        self.maximize.is_none()
            && other.maximize.is_none()
            && self.dims == other.dims
            && sorted(&self.params) == sorted(&other.params)
            && sorted(&self.inputs) == sorted(&other.inputs)
            && sorted(&self.frozen) == sorted(&other.frozen)
    }
}

/// Why a node-link graph is never run on the executor.
pub const NOT_RUNNABLE: &str =
    "only ONNX models can be validated: a node-link graph has no tensors to run";

/// The first option of `req` that a model in `format` would ignore, as the message of its
/// refusal (`invalid_option`); `None` when every option applies. A node-link graph and a
/// captured PyTorch graph have the sizes and parameters they were written or captured with
/// (no `dims`, `params`, `inputs`, `maximize`) and are not run on the executor (`validate`);
/// a captured graph is planned in the torch-sac model (no `solver` but `auto`). One rule for
/// the service, which refuses them before a job is made, and the pipeline (the CLI).
pub fn refused_option(format: ModelFormat, req: &PlanRequest) -> Option<String> {
    let (what, fixed) = match format {
        ModelFormat::Onnx => return None,
        ModelFormat::GraphJson => ("a node-link graph", "written"),
        ModelFormat::TorchGraph => ("a captured PyTorch graph", "captured"),
    };
    if format == ModelFormat::TorchGraph {
        if let Some(solver) = req.solver.as_deref().filter(|s| *s != "auto") {
            return Some(format!(
                "solver {solver:?} plans free schedules; a captured PyTorch graph is planned in \
                 the torch-sac model (leave solver unset or auto)"
            ));
        }
        if req.maximize.is_some() {
            return Some(
                "maximize binds a dim of an ONNX model; a captured PyTorch graph has the shapes \
                 it was captured at (capture it again at another batch)"
                    .to_string(),
            );
        }
        if req.validate == Some(true) {
            return Some(
                "validate runs remat's executor on ONNX models; prove a torch-sac plan in \
                 PyTorch with remat.torch.measure (docs/torch.md)"
                    .to_string(),
            );
        }
    }
    let named = |items: Vec<&str>| items.join(", ");
    let given = if !req.dims.is_empty() {
        Some(("dims", named(req.dims.keys().map(String::as_str).collect())))
    } else if !req.params.is_empty() {
        Some((
            "params",
            named(req.params.iter().map(String::as_str).collect()),
        ))
    } else if !req.inputs.is_empty() {
        Some((
            "inputs",
            named(req.inputs.iter().map(String::as_str).collect()),
        ))
    } else if !req.frozen.is_empty() {
        Some((
            "frozen",
            named(req.frozen.iter().map(String::as_str).collect()),
        ))
    } else {
        None
    };
    if let Some((field, names)) = given {
        return Some(format!(
            "{field} ({names}) apply to ONNX models; {what} has the sizes and parameters it was \
             {fixed} with: leave {field} out"
        ));
    }
    if req.validate == Some(true) {
        // Asked for, it would be ignored: the plan would come back with `ran: false`.
        return Some(format!("validate: {NOT_RUNNABLE}: leave validate out"));
    }
    if let Some(dim) = &req.maximize {
        return Some(format!(
            "maximize `{dim}`: a node-link graph (or a captured PyTorch graph) has no dims to \
             bind; maximize needs an ONNX model"
        ));
    }
    None
}

/// Seconds a plan's solver may take when the request does not say (`time_limit`); the service
/// applies its `--max-time-limit` instead where that is lower.
pub const DEFAULT_TIME_LIMIT: f64 = 30.0;

/// The most timing rounds a request may ask for: a validation holds the executor, which one
/// job at a time uses.
pub const MAX_REQUEST_TIMING_ROUNDS: u32 = 64;

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
    /// The job was stopped because nobody wants it any more (its `DELETE`): 410.
    Cancelled,
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

    /// A job stopped by its cancel flag (`remat_solver::Cancel`): its record was deleted.
    pub fn cancelled() -> Self {
        EngineError::new(
            ErrorKind::Cancelled,
            "cancelled",
            "the job was deleted while it ran, and stopped",
        )
    }
}

/// What a posted model is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ModelFormat {
    Onnx,
    GraphJson,
    /// A training step captured from PyTorch (`remat.torch.capture`, docs/torch.md): planned in
    /// the torch-sac execution model.
    TorchGraph,
}

impl ModelFormat {
    /// Which format the bytes are in: a JSON object whose `format` is `remat.torch-graph` is a
    /// captured PyTorch graph, another JSON object (the first non-blank byte is `{`) a
    /// node-link graph, anything else ONNX.
    /// The bytes without a leading UTF-8 byte-order mark (editors on Windows write one before
    /// JSON; a JSON parser does not take it).
    pub fn without_bom(model: &[u8]) -> &[u8] {
        model.strip_prefix(b"\xef\xbb\xbf").unwrap_or(model)
    }

    pub fn detect(model: &[u8]) -> ModelFormat {
        if !Self::is_json_object(model) {
            ModelFormat::Onnx
        } else if Self::is_torch_graph(model) {
            ModelFormat::TorchGraph
        } else {
            ModelFormat::GraphJson
        }
    }

    /// Whether the bytes look like a JSON object (the first non-blank byte is `{`): the cheap
    /// test, without parsing, of a body that is one of the JSON formats.
    pub fn is_json_object(model: &[u8]) -> bool {
        Self::without_bom(model)
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            == Some(&b'{')
    }

    /// Whether a JSON document says it is a captured PyTorch graph (its `format` field).
    pub fn is_torch_graph(json: &[u8]) -> bool {
        #[derive(Deserialize)]
        struct Probe {
            format: Option<serde_json::Value>,
        }
        serde_json::from_slice::<Probe>(Self::without_bom(json)).is_ok_and(|p| {
            p.format.as_ref().and_then(|f| f.as_str()) == Some(remat_solver::sac::FORMAT)
        })
    }

    /// The format of a JSON object: a captured PyTorch graph or a node-link graph.
    pub fn of_json(value: &serde_json::Value) -> ModelFormat {
        if value.get("format").and_then(|f| f.as_str()) == Some(remat_solver::sac::FORMAT) {
            ModelFormat::TorchGraph
        } else {
            ModelFormat::GraphJson
        }
    }

    /// A model file's bytes, an ONNX model's external data (tensors kept in files beside it:
    /// `onnx.save(..., save_as_external_data=True)`, the dynamo exporter's `.onnx.data`) read
    /// into it from the file's folder. The error names the file, or the tensor and its data
    /// file.
    pub fn read_file(path: &std::path::Path) -> Result<Vec<u8>, String> {
        let bytes =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if Self::detect(&bytes) != ModelFormat::Onnx {
            return Ok(bytes);
        }
        let dir = path.parent().unwrap_or(std::path::Path::new("."));
        let (inlined, done) = remat_planner::external::inline_external_data(&bytes, dir)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if done.tensors > 0 {
            tracing::info!(
                tensors = done.tensors,
                bytes = done.bytes,
                "read the model's external data"
            );
        }
        if done.left_external > 0 {
            tracing::warn!(
                tensors = done.left_external,
                "floating-point tensors past 1 GiB left in their external files: the executor \
                 seeds them (planning needs only their shapes)"
            );
        }
        Ok(match inlined {
            std::borrow::Cow::Borrowed(_) => bytes,
            std::borrow::Cow::Owned(v) => v,
        })
    }

    /// The name the store keeps (`onnx`, `graph_json`: the serde names).
    pub fn as_str(self) -> &'static str {
        match self {
            ModelFormat::Onnx => "onnx",
            ModelFormat::GraphJson => "graph_json",
            ModelFormat::TorchGraph => "torch_graph",
        }
    }

    /// The format of a stored name ([`ModelFormat::as_str`]).
    pub fn parse(name: &str) -> Option<ModelFormat> {
        [
            ModelFormat::Onnx,
            ModelFormat::GraphJson,
            ModelFormat::TorchGraph,
        ]
        .into_iter()
        .find(|f| f.as_str() == name)
    }
}

/// A plan of the same model that the service finished before (a row of its store): what a
/// new plan of the model may reuse ([`History`]).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredPlan {
    /// The job's id.
    pub id: String,
    /// The options it was planned with.
    pub request: PlanRequest,
    /// Its headline figures as stored (`status`, `budget_bytes`, `peak_bytes`, `overhead`, ...:
    /// `http::run::summarize`).
    pub summary: serde_json::Value,
}

/// The plans the service holds of the model being planned. A plan at budget B is offered the
/// schedules of those that fit B, so it never costs more than one the service found before
/// (`remat_solver::plan::plan_reusing`). Reading them is best effort: a store that cannot
/// answer gives none (and logs why), and the plan is made without them.
pub trait History {
    /// Finished plans of the model, without their documents.
    fn plans(&self) -> Vec<StoredPlan>;
    /// The document of one of them; `None` when it is gone or unreadable.
    fn document(&self, id: &str) -> Option<serde_json::Value>;
}

/// No plans before this one (the CLI, and the engine's tests).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHistory;

impl History for NoHistory {
    fn plans(&self) -> Vec<StoredPlan> {
        Vec::new()
    }

    fn document(&self, _id: &str) -> Option<serde_json::Value> {
        None
    }
}

/// The planning pipeline as the service sees it. Implementations are blocking (CPU bound) and
/// are called from worker threads, never from the async runtime.
pub trait Engine: Send + Sync + 'static {
    /// Plans one model. `history` holds the plans made of it before, which the plan may
    /// reuse; `progress` is called when the job enters a new phase; once `cancel` is raised
    /// (the job was deleted) the plan may end early with [`EngineError::cancelled`]. The
    /// returned document is the plan as the API returns it under `plan` (the real engine's is
    /// a [`document::PlanDocument`]).
    fn plan(
        &self,
        model: &[u8],
        format: ModelFormat,
        request: &PlanRequest,
        history: &dyn History,
        progress: &dyn Fn(Phase),
        cancel: &Cancel,
    ) -> Result<serde_json::Value, EngineError>;

    /// The Pareto frontier (budget -> overhead) of one model, with the baselines (the real
    /// engine's is a [`document::SweepDocument`]); `cancel` as for [`Engine::plan`].
    fn sweep(
        &self,
        model: &[u8],
        format: ModelFormat,
        request: &PlanRequest,
        cancel: &Cancel,
    ) -> Result<serde_json::Value, EngineError>;

    /// Which format the bytes are in ([`ModelFormat::detect`]).
    fn detect(&self, model: &[u8]) -> ModelFormat {
        ModelFormat::detect(model)
    }

    /// Refuses, before a job is made of it (and the bytes stored for the workers of a shared
    /// queue), a model that cannot be read at all: ONNX bytes that are no protobuf of a model.
    /// Cheap next to the job (`remat_planner::onnx::check_model_bytes`: the protobuf walked, its
    /// nodes parsed, its tensors' bytes stepped over, not copied); what only the import finds is
    /// the job's.
    fn check(&self, _model: &[u8], _format: ModelFormat) -> Result<(), EngineError> {
        Ok(())
    }

    /// Refuses, before a job is made of it, an option a model in `format` would ignore (the
    /// real engine: [`refused_option`], as `invalid_option`): the job would fail with that
    /// error and stay in the model's history.
    fn check_options(
        &self,
        _format: ModelFormat,
        _request: &PlanRequest,
    ) -> Result<(), EngineError> {
        Ok(())
    }

    /// Refuses, before a job is made of it, a plan request that no model could satisfy: the
    /// real engine's plans need a budget, and `maximize` the device's memory as bytes or a
    /// size. (A sweep has no budget of its own.)
    fn check_plan(&self, _request: &PlanRequest) -> Result<(), EngineError> {
        Ok(())
    }
}

/// The summary figures of an engine document: its own `summary` object when it has one, else
/// the headline fields of a plan report (budget, store-all peak, predicted peak and overhead,
/// solver and its status, gap, minimum feasible budget).
pub fn summarize(document: &serde_json::Value) -> Option<serde_json::Value> {
    if let Some(summary) = document.get("summary") {
        return Some(summary.clone());
    }
    let doc = document.as_object()?;
    let mut out = serde_json::Map::new();
    let top = [
        "budget_bytes",
        "store_all_peak_bytes",
        "solver",
        "status",
        "gap",
        "min_feasible_budget_bytes",
    ];
    for key in top {
        if let Some(v) = doc.get(key) {
            out.insert(key.to_string(), v.clone());
        }
    }
    if let Some(predicted) = doc.get("predicted") {
        for key in ["peak_bytes", "overhead", "compute_cost"] {
            if let Some(v) = predicted.get(key) {
                out.insert(key.to_string(), v.clone());
            }
        }
    }
    (!out.is_empty()).then_some(serde_json::Value::Object(out))
}

/// What a stored plan's summary ([`summarize`]) says of a plan that has a schedule: the
/// budget it was made at, its predicted peak and its overhead. `None` for an infeasible plan,
/// or a summary without those figures. Read by the plan reuse (`pipeline::reuse`) and by the
/// service's cache (`http::submit`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fitted {
    pub budget_bytes: u64,
    pub peak_bytes: u64,
    pub overhead: f64,
}

impl Fitted {
    pub fn read(summary: &serde_json::Value) -> Option<Self> {
        (summary.get("status")?.as_str()? != "infeasible").then_some(())?;
        Some(Fitted {
            budget_bytes: summary.get("budget_bytes")?.as_u64()?,
            peak_bytes: summary.get("peak_bytes")?.as_u64()?,
            overhead: summary.get("overhead")?.as_f64()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::summarize;
    use serde_json::json;

    #[test]
    fn summaries_prefer_the_engines_own_and_else_pick_the_report_headlines() {
        let own = json!({"summary": {"peak": 1}, "budget_bytes": 5});
        assert_eq!(summarize(&own), Some(json!({"peak": 1})));
        let report = json!({
            "status": "optimal", "solver": "dp", "budget_bytes": 100, "store_all_peak_bytes": 160,
            "gap": null, "predicted": {"peak_bytes": 96, "overhead": 0.2, "compute_cost": 12.0, "memory": [1, 2]},
            "schedule": [], "decisions": []
        });
        assert_eq!(
            summarize(&report),
            Some(json!({
                "status": "optimal", "solver": "dp", "budget_bytes": 100, "store_all_peak_bytes": 160,
                "gap": null, "peak_bytes": 96, "overhead": 0.2, "compute_cost": 12.0
            }))
        );
        assert_eq!(summarize(&json!([1, 2])), None);
        assert_eq!(summarize(&json!({"points": []})), None);
    }
}
