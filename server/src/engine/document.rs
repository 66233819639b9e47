//! The documents planning produces: a plan ([`PlanDocument`]) and a sweep ([`SweepDocument`]),
//! as types that serialize to the API's JSON (what `remat plan --json` prints and the service
//! returns under `plan` and `sweep`) and derive its OpenAPI schema.
//!
//! Architecture invariant: the documents are values, built once by the pipeline; the CLI and
//! the service print or store them as they are, so both show the same figures.

use super::ModelFormat;
use remat_exec::Validation;
use remat_planner::InspectReport;
use remat_solver::plan::{ParetoPoint, PlanReport};
use remat_solver::NodeKind;
use serde::Serialize;
use utoipa::ToSchema;

/// A plan: the solver's report (status, budget, predicted figures, lower bound, baselines,
/// schedule) and, beside it, the decision for every value, what was loaded, whether the plan
/// was run, and for ONNX models the importer's report.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct PlanDocument {
    #[serde(flatten)]
    pub report: PlanReport,
    /// One decision per value, derived from the schedule; empty when the plan is infeasible
    /// (its `status` says so).
    pub decisions: Vec<Decision>,
    pub graph: PlanGraph,
    /// Always present: the executor's measured figures, or why the figures are the
    /// simulator's predictions.
    pub validation: ValidationReport,
    /// The importer's report (ONNX models only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<InspectReport>,
    /// The solver's costs measured on the device (`remat plan --cost measured`); absent
    /// with FLOPs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_model: Option<CostModel>,
    /// The search for the largest value of a dim that fits (`maximize`); the plan is the
    /// plan at that value. Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maximize: Option<MaximizeReport>,
}

/// The answer to `maximize`: the largest value of one dim whose plan fits the budget (the
/// device's memory) at no more than `max_overhead`, and every value tried on the way.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct MaximizeReport {
    /// The dim searched (a name, or `INPUT:AXIS`).
    pub dim: String,
    /// The largest value that fits: this document's plan is the plan at it.
    pub value: u64,
    /// The budget every value was planned at.
    pub budget_bytes: u64,
    /// The overhead a plan may have and still fit (`None`: any).
    pub max_overhead: Option<f64>,
    /// `value + 1`, tried and found not to fit (`None` when the search stopped at its cap).
    pub next_value: Option<u64>,
    /// Every value tried, in the order tried.
    pub probes: Vec<MaximizeProbe>,
}

/// One value a `maximize` search tried.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct MaximizeProbe {
    pub value: u64,
    pub fits: bool,
    /// The plan's overhead at this value (`None` when no schedule fits the budget).
    pub overhead: Option<f64>,
    /// The peak of keeping everything at this value.
    pub store_all_peak_bytes: u64,
    /// Why it fits or not, with the figures.
    pub reason: String,
}

/// What the plan does with one value, and why.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Decision {
    /// The node's id in the input (node-link `id`, or the training-node id).
    pub node: String,
    pub name: String,
    pub kind: NodeKind,
    pub bytes: u64,
    pub cost: f64,
    /// How many times the schedule computes it.
    pub computes: usize,
    /// Ids of the nodes it reads.
    pub deps: Vec<String>,
    pub decision: DecisionKind,
    /// A sentence with the figures behind the decision.
    pub reason: String,
}

/// The decision for one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    /// Not computed: the gradients do not need it.
    Skipped,
    /// Computed more than once: freed after forward (or a backward value) and recomputed.
    Recompute,
    /// A backward value computed once.
    Backward,
    /// Kept from forward to its last backward use.
    Keep,
    /// Freed after its last forward use: backward does not read it.
    Transient,
}

/// What was loaded: the graph's name, format and size.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct GraphInfo {
    pub name: String,
    pub format: ModelFormat,
    /// Nodes of the solver problem (the training graph for ONNX models).
    pub nodes: usize,
}

/// What was loaded, with the totals a plan is measured against.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct PlanGraph {
    #[serde(flatten)]
    pub info: GraphInfo,
    /// Bytes every step holds (parameters, their gradients, buffers).
    pub fixed_bytes: u64,
    /// Compute cost of every needed node computed once.
    pub store_all_cost: f64,
}

/// A plan's `validation`: the executor's report when the plan was run, else why not.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum ValidationReport {
    /// `ran: true`: the measured figures.
    Ran(Box<Validation>),
    /// `ran: false`: the figures are the simulator's predictions.
    NotRun(NotRun),
}

/// Why a plan was not run.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct NotRun {
    /// Always false.
    pub ran: bool,
    /// Always null: nothing was checked.
    pub ok: Option<bool>,
    pub reason: String,
}

impl ValidationReport {
    /// The report of a plan that was not run, with the reason.
    pub fn not_run(reason: impl Into<String>) -> ValidationReport {
        ValidationReport::NotRun(NotRun {
            ran: false,
            ok: None,
            reason: reason.into(),
        })
    }
}

/// The solver's costs when they are not FLOPs: the roofline's seconds (the default for ONNX
/// models) or seconds measured on the device, and, when measured, what that changes.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct CostModel {
    /// `roofline` or `measured`.
    pub kind: String,
    /// `seconds`.
    pub unit: String,
    pub device: String,
    /// Runs of the store-all step the costs are the fastest of (0 for the roofline).
    pub profiling_runs: usize,
    /// The store-all step's seconds (the sum of the costs).
    pub store_all_seconds: f64,
    /// Where the roofline's rates come from (`remat calibrate` writes them); absent for
    /// measured costs.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub rates: Option<String>,
    /// With a budget where both plans are feasible: the plans by FLOPs and by measured time,
    /// compared in measured time (its three fields, or none of them).
    #[serde(flatten)]
    #[schema(value_type = CostComparison)]
    pub comparison: Option<CostComparison>,
}

/// The same budget planned with FLOPs and with measured costs. In a [`CostModel`] its fields
/// are present together or not at all.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct CostComparison {
    /// The overhead, in measured seconds, of the plan made with FLOPs (null when its
    /// schedule does not fit the measured problem).
    #[schema(required = false)]
    pub flops_plan_measured_overhead: Option<f64>,
    /// The overhead, in measured seconds, of the plan made with measured costs.
    #[schema(required = false)]
    pub measured_plan_measured_overhead: Option<f64>,
    /// Nodes the two plans compute a different number of times.
    #[schema(required = false)]
    pub nodes_computed_differently: usize,
}

/// A run of a given schedule (`remat validate --plan FILE --json`): the executor's report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunDocument {
    pub validation: Validation,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_model: Option<CostModel>,
}

/// A sweep: the plan's overhead at each budget (the Pareto frontier), with the baselines.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct SweepDocument {
    pub graph: GraphInfo,
    pub store_all_peak_bytes: u64,
    pub points: Vec<ParetoPoint>,
}
