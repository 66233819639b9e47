//! `inspect`: what the planner sees in a model, as JSON (`Serialize`) and as text (`Display`).

use crate::error::UnsupportedNode;
use crate::model::{Model, ValueId, ValueKind};
use crate::training::{SavedTensor, TrainingGraph};
use remat_solver::NodeKind;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;

/// A graph input or output.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TensorInfo {
    pub name: String,
    /// `None` when the value is downstream of an unsupported node.
    pub dtype: Option<String>,
    pub shape: Option<Vec<u64>>,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub kind: ValueKind,
}

/// One training node as the report lists it; `deps` are node ids.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TrainingNodeInfo {
    pub id: String,
    pub name: String,
    pub op: String,
    pub kind: NodeKind,
    pub bytes: u64,
    pub cost: f64,
    pub deps: Vec<String>,
    pub required: bool,
    pub replay_rng: bool,
}

/// The inspect report. Training fields are `None` when `unsupported` is not empty.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InspectReport {
    pub producer: String,
    pub opset: i64,
    /// Forward ops in the model's top-level graph.
    pub nodes: usize,
    /// Op type → count.
    pub ops: BTreeMap<String, usize>,
    pub inputs: Vec<TensorInfo>,
    pub outputs: Vec<TensorInfo>,
    /// Symbolic dims with their bound values.
    pub symbolic_dims: BTreeMap<String, u64>,
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub unsupported: Vec<UnsupportedNode>,
    pub training_nodes: Option<usize>,
    pub params_bytes: Option<u64>,
    pub buffers_bytes: Option<u64>,
    /// Parameters, their gradients and buffers.
    pub fixed_bytes: Option<u64>,
    pub saved_activation_bytes: Option<u64>,
    /// Peak of the natural order with free-after-last-use (`remat_solver::store_all_peak`).
    pub store_all_peak_bytes: Option<u64>,
    /// The storages behind `saved_activation_bytes`, largest first.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<Object>>))]
    pub saved: Option<Vec<SavedTensor>>,
    pub training: Option<Vec<TrainingNodeInfo>>,
    /// What the import decided that may not be what was meant, and how to change it: the
    /// one-element float initializers taken for constants (`Model::scalar_constants`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

fn tensor_info(model: &Model, v: ValueId) -> TensorInfo {
    let val = &model.values[v];
    TensorInfo {
        name: val.name.clone(),
        dtype: val
            .fact
            .as_ref()
            .map(|f| format!("{:?}", f.dtype).to_lowercase()),
        shape: val.fact.as_ref().map(|f| f.shape.clone()),
        kind: val.kind,
    }
}

impl InspectReport {
    /// The report of an imported model and, when every node is supported, its training
    /// graph: what [`crate::inspect`] returns, for callers that also need the model (no
    /// second import).
    pub fn new(model: &Model, training: Option<&TrainingGraph>) -> InspectReport {
        let t = training;
        InspectReport {
            producer: model.producer.clone(),
            opset: model.opset,
            nodes: model.onnx_nodes,
            ops: model.op_counts.clone(),
            inputs: model
                .inputs
                .iter()
                .map(|&v| tensor_info(model, v))
                .collect(),
            outputs: model
                .outputs
                .iter()
                .map(|&v| tensor_info(model, v))
                .collect(),
            symbolic_dims: model.dims.clone(),
            unsupported: model.unsupported.clone(),
            training_nodes: t.map(|t| t.nodes.len()),
            params_bytes: t.map(|t| t.params_bytes),
            buffers_bytes: t.map(|t| t.buffers_bytes),
            fixed_bytes: t.map(|t| t.fixed_bytes()),
            saved_activation_bytes: t.map(|t| t.saved_activation_bytes),
            store_all_peak_bytes: t.map(|t| remat_solver::store_all_peak(&t.to_problem())),
            saved: t.map(|t| t.saved.clone()),
            training: t.map(|t| {
                t.nodes
                    .iter()
                    .map(|n| TrainingNodeInfo {
                        id: n.id.clone(),
                        name: n.name.clone(),
                        op: n.op.clone(),
                        kind: n.kind,
                        bytes: n.bytes,
                        cost: n.cost,
                        deps: n.deps.iter().map(|&d| t.nodes[d].id.clone()).collect(),
                        required: n.required,
                        replay_rng: n.replay_rng,
                    })
                    .collect()
            }),
            notes: scalar_notes(model),
        }
    }
}

/// The note naming the one-element float initializers taken for constants, if any.
pub fn scalar_notes(model: &Model) -> Vec<String> {
    let names: Vec<&str> = model
        .scalar_constants
        .iter()
        .map(|&v| model.values[v].name.as_str())
        .collect();
    if names.is_empty() {
        return vec![];
    }
    vec![format!(
        "one-element float initializer(s) taken for constants, not trained: {}; a scalar \
         parameter (nn.Parameter of one element, PReLU's one slope, CLIP's logit_scale) \
         reads like an exporter's constant: train it with --param NAME (the API's param)",
        names.join(", ")
    )]
}

/// Bytes in binary units, e.g. `44.6 MiB`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = b as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{x:.1} {}", UNITS[u])
    }
}

fn shape_str(t: &TensorInfo) -> String {
    match (&t.dtype, &t.shape) {
        (Some(d), Some(s)) => format!("{d}{s:?}"),
        _ => "unknown".into(),
    }
}

impl fmt::Display for InspectReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let producer = if self.producer.is_empty() {
            "unknown producer"
        } else {
            &self.producer
        };
        writeln!(
            f,
            "model: {producer}, opset {}, {} nodes",
            self.opset, self.nodes
        )?;
        let ops: Vec<String> = self.ops.iter().map(|(k, v)| format!("{k}×{v}")).collect();
        writeln!(f, "ops: {}", ops.join(", "))?;
        if !self.symbolic_dims.is_empty() {
            let d: Vec<String> = self
                .symbolic_dims
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            writeln!(f, "dims: {}", d.join(", "))?;
        }
        let data: Vec<&TensorInfo> = self
            .inputs
            .iter()
            .filter(|t| t.kind == ValueKind::Data)
            .collect();
        let params = self
            .inputs
            .iter()
            .filter(|t| t.kind == ValueKind::Param)
            .count();
        writeln!(
            f,
            "inputs ({} data, {params} parameter inputs):",
            data.len()
        )?;
        for t in data {
            writeln!(f, "  {} {}", t.name, shape_str(t))?;
        }
        writeln!(f, "outputs:")?;
        for t in &self.outputs {
            writeln!(f, "  {} {}", t.name, shape_str(t))?;
        }
        for n in &self.notes {
            writeln!(f, "note: {n}")?;
        }
        if !self.unsupported.is_empty() {
            writeln!(f, "unsupported ({}):", self.unsupported.len())?;
            for u in &self.unsupported {
                writeln!(f, "  {u}")?;
            }
            return Ok(());
        }
        let opt = |b: Option<u64>| b.map(human_bytes).unwrap_or_else(|| "-".into());
        writeln!(f, "training nodes: {}", self.training_nodes.unwrap_or(0))?;
        writeln!(f, "parameters: {}", opt(self.params_bytes))?;
        writeln!(f, "buffers: {}", opt(self.buffers_bytes))?;
        writeln!(
            f,
            "fixed (params + grads + buffers): {}",
            opt(self.fixed_bytes)
        )?;
        writeln!(f, "saved activations: {}", opt(self.saved_activation_bytes))?;
        if let Some(saved) = &self.saved {
            for s in saved.iter().take(5) {
                writeln!(
                    f,
                    "  {} {} (kept by {})",
                    human_bytes(s.bytes),
                    s.name,
                    s.by.join(", ")
                )?;
            }
            if saved.len() > 5 {
                writeln!(f, "  ... {} more", saved.len() - 5)?;
            }
        }
        write!(f, "store-all peak: {}", opt(self.store_all_peak_bytes))
    }
}
