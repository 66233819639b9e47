//! The one error type of `remat-solver`.

use thiserror::Error;

/// Everything that can go wrong in `remat-solver`. Every variant names what is wrong:
/// the node (by its external id), the schedule step, the field.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum SolverError {
    #[error("problem has no nodes")]
    EmptyProblem,
    #[error("node {node:?} (index {index}) depends on {dep_index}, which is not an earlier node: nodes must be in a topological order")]
    NotTopological {
        node: String,
        index: usize,
        dep_index: usize,
    },
    #[error("node {node:?} has an invalid {field}: {value}")]
    InvalidNodeField {
        node: String,
        field: &'static str,
        value: String,
    },
    #[error("graph too large: {what}")]
    TooLarge { what: String },
    #[error("node id {0:?} appears more than once")]
    DuplicateNodeId(String),
    #[error(
        "schedule step {step}: {op} of node index {index}, but the problem has only {len} nodes"
    )]
    UnknownNode {
        step: usize,
        op: &'static str,
        index: usize,
        len: usize,
    },
    #[error("schedule step {step}: computing node {node:?} needs {dep:?}, which is not resident")]
    DependencyNotResident {
        step: usize,
        node: String,
        dep: String,
    },
    #[error("schedule step {step}: computing node {node:?}, which is already resident")]
    AlreadyResident { step: usize, node: String },
    #[error("schedule step {step}: freeing node {node:?}, which is not resident (double free or never computed)")]
    FreeNotResident { step: usize, node: String },
    #[error("schedule never computes required node {node:?}")]
    RequiredNotComputed { node: String },
    #[error(
        "budget {budget} bytes is infeasible: no plan remat found fits it; the least peak it reaches, its minimum feasible budget, is {min_feasible} bytes"
    )]
    Infeasible { budget: u64, min_feasible: u64 },
    #[error("graph JSON: {0}")]
    Json(String),
    #[error("graph JSON: {what}")]
    GraphFormat { what: String },
    #[error("ILP solver: {0}")]
    Ilp(String),
    #[error("{solver} is not available: {why}")]
    Unavailable { solver: String, why: String },
    #[error("{0}")]
    InvalidArgument(String),
    /// The plan's [`crate::Cancel`] was raised before it ended.
    #[error("the plan was cancelled before it ended")]
    Cancelled,
}

pub type Result<T, E = SolverError> = std::result::Result<T, E>;
