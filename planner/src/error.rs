//! The one error type of `remat-planner`.

use serde::Serialize;
use thiserror::Error;

/// A node the planner cannot handle, reported with every other such node at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnsupportedNode {
    /// The node's name (or `<op_type>_<index>` when the model leaves it empty).
    pub node: String,
    pub op_type: String,
    /// The operator domain (`""` is the default ONNX domain).
    pub domain: String,
    /// Why it is unsupported (unknown op, contrib domain, data-dependent control flow...).
    pub reason: String,
}

impl std::fmt::Display for UnsupportedNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let domain = if self.domain.is_empty() {
            "ai.onnx"
        } else {
            &self.domain
        };
        write!(
            f,
            "{} ({} in domain {}): {}",
            self.node, self.op_type, domain, self.reason
        )
    }
}

fn list_unsupported(nodes: &[UnsupportedNode]) -> String {
    nodes
        .iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Everything that can go wrong in `remat-planner`. Every variant names what is wrong: the
/// node, its op type, the attribute, the dimension.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum PlannerError {
    /// The bytes are not an ONNX model (truncated, random, not a protobuf, no graph) or a
    /// field of the model is inconsistent.
    #[error("malformed ONNX model: {what}")]
    Malformed { what: String },
    #[error(
        "model uses opset {version} of the default domain; supported opsets are {min} to {max}"
    )]
    UnsupportedOpset { version: i64, min: i64, max: i64 },
    #[error("the graph has a cycle through nodes {}", nodes.join(", "))]
    Cycle { nodes: Vec<String> },
    #[error("node {node:?} reads {input:?}, which no node, graph input or initializer produces")]
    DanglingInput { node: String, input: String },
    #[error("{} unsupported node(s): {}", nodes.len(), list_unsupported(nodes))]
    Unsupported { nodes: Vec<UnsupportedNode> },
    #[error("symbolic dimension(s) not bound: {} (bind each with NAME=VALUE; a dim without a name is INPUT:AXIS, e.g. x:0=8)", names.join(", "))]
    UnboundDims { names: Vec<String> },
    #[error("dimension {name:?} is bound but the model has no such symbolic dimension; its symbolic dimensions are: {}", if known.is_empty() { "none".to_string() } else { known.join(", ") })]
    UnknownDim { name: String, known: Vec<String> },
    #[error("node {node:?} ({op_type}): {message}")]
    Shape {
        node: String,
        op_type: String,
        message: String,
    },
    #[error("node {node:?} ({op_type}), attribute {attribute:?}: {message}")]
    Attribute {
        node: String,
        op_type: String,
        attribute: String,
        message: String,
    },
    /// A dimension that is zero, negative or too large, where `what` names the tensor or
    /// symbolic dimension it belongs to.
    #[error("invalid dimension {value} in {what}: {message}")]
    InvalidDim {
        what: String,
        /// The dimension as given, or the shape whose element count overflows.
        value: String,
        message: String,
    },
    #[error("node {node:?} ({op_type}) has a data-dependent output shape ({detail}); only shapes computable from the model's constants and bound dims are supported")]
    DataDependent {
        node: String,
        op_type: String,
        detail: String,
    },
    #[error("{which} {name:?} named in the options is not a graph input or an initializer; graph inputs are: {}", inputs.join(", "))]
    UnknownInput {
        which: &'static str,
        name: String,
        inputs: Vec<String>,
    },
    /// A pattern of `--input` / `--param` / `--freeze` that matches no graph input or
    /// initializer.
    #[error("{which} {pattern:?} matches no {what}; the model's {count} names begin {}", examples.join(", "))]
    NoMatch {
        which: &'static str,
        /// What the option's patterns match: every graph input and initializer for `--input`,
        /// the floating-point ones for `--param` and `--freeze`.
        what: &'static str,
        pattern: String,
        /// The first names of the model (graph inputs, then initializers).
        examples: Vec<String>,
        count: usize,
    },
    /// One name given to two of `--input`, `--param` and `--freeze`.
    #[error("{name:?} is named by both {first} and {second} (exactly or by a pattern); each says something else of it: data, a trained parameter, a frozen weight")]
    NamedTwice {
        name: String,
        first: &'static str,
        second: &'static str,
    },
    /// A pattern of `--input` / `--param` / `--freeze` that does not parse.
    #[error("{which} {pattern:?}: not a glob pattern: {reason}")]
    BadPattern {
        which: &'static str,
        pattern: String,
        reason: String,
    },
    /// A tensor kept in an external file that cannot be read (`external`).
    #[error("tensor {tensor:?}, external data {location:?}: {reason}")]
    ExternalData {
        tensor: String,
        location: String,
        reason: String,
    },
    /// `--param NAME` (or `--freeze NAME`) on a value that is not floating point.
    #[error("{which} {name:?}: the value is {dtype}; {which} names floating-point weights only")]
    ParamNotFloat {
        which: &'static str,
        name: String,
        dtype: String,
    },
    #[error(
        "the model has no floating-point output computed from a data input to build a loss \
         from (an output computed from parameters and constants alone is folded at import: \
         if a graph input taken for a parameter is data, name it with --input NAME)"
    )]
    NoLoss,
    #[error("lowering the training graph: {0}")]
    Lowering(String),
    /// A roofline rates file that cannot be used (`--rates`, `REMAT_RATES`).
    #[error("roofline rates: {0}")]
    Rates(String),
}

pub type Result<T, E = PlannerError> = std::result::Result<T, E>;
