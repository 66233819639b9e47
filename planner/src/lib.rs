//! `remat-planner`: everything about models. ONNX import into a graph IR on `petgraph`,
//! shape inference at bound dims with constant folding of shape arithmetic, an op registry
//! (shape rule, FLOPs, gradient rule per op), training-graph derivation and lowering to a
//! [`remat_solver::Problem`].
//!
//! Architecture invariant: this crate knows nothing of HTTP or the plan store, and nothing of
//! tensors at run time (the executor is `remat-exec`, which depends on this crate).
//!
//! # Example
//! Import a model at a bound dim, derive its training step and lower it to a solver problem:
//! ```
//! use remat_planner::{load, ImportOptions};
//!
//! let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/grad/tiny_cnn.onnx");
//! let bytes = std::fs::read(path)?;
//! let mut opts = ImportOptions::default();
//! opts.dims.insert("batch".into(), 2);
//! let model = load(&bytes, &opts)?;
//! let training = model.training_graph()?;
//! let problem = training.to_problem();
//! // Forward, loss and backward nodes; parameters, their gradients and buffers are fixed.
//! assert!(problem.len() > 3 && problem.fixed_bytes > 0);
//! let store_all = remat_solver::store_all_peak(&problem);
//! assert!(store_all > problem.fixed_bytes);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Which graph inputs are parameters
//! Decided per graph input, first rule that applies:
//! 1. named in [`ImportOptions::inputs`] (`--input NAME`) → data;
//! 2. named in [`ImportOptions::params`] (`--param NAME`) → parameter; named in
//!    [`ImportOptions::frozen`] (`--freeze NAME`) → a frozen weight (a buffer: held, no
//!    gradient);
//! 3. has an initializer → parameter;
//! 4. not floating point → data;
//! 5. has a symbolic or unknown dim → data;
//! 6. is read as the activation operand of an op (input 0 of Conv, ConvTranspose, Gemm,
//!    MatMul, a normalization, a pooling or a recurrent op; directly or through Reshape, Flatten,
//!    Squeeze, Unsqueeze, Identity or Cast) → data: CLIP's `pixel_values` and Whisper's
//!    `input_features` beside their integer token ids, an MLP's `x` beside its labels;
//! 7. if rules 1-6 found no data input at all, the first graph input is data;
//! 8. is concatenated (`Concat`, directly or through those views) with a data input → data
//!    (RAFT's second frame beside its first);
//! 9. otherwise (floating point, fully static) → parameter.
//!
//! `--param` or `--freeze` on a value that is not floating point is an error, and so is a
//! name given to two of the three options. `--param` may also name an initializer that is not
//! a graph input, which makes it a trained parameter; `--freeze` (or `--input`) may name one
//! too, which makes it a weight the training keeps frozen. A name the model lacks that holds
//! `*`, `?` or `[` is a glob pattern over the graph inputs and initializers (`--freeze
//! 'backbone.*'` freezes a backbone); one that matches nothing is an error.
//!
//! Parameter candidates (and initializers, `Constant` nodes and constant subgraphs such as
//! `ConstantOfShape` of a constant shape) that the live graph reads become *trainable
//! parameters* when floating point and read in a differentiable slot (Conv's weight, not
//! BatchNormalization's running mean), and, unless they are graph inputs, have at least two
//! elements (a one-element initializer may be a scalar `nn.Parameter` as well as an
//! exporter's epsilon: those read in a differentiable slot are listed in
//! [`InspectReport::notes`], which says to name them with `--param`). In a model produced by `pytorch`, whose exporters keep every parameter in a graph
//! input or an initializer, `Constant` nodes and constants computed in-graph (non-persistent
//! buffers, zero initial RNN states) are never parameters. Every other constant the live
//! graph reads is a *buffer*. Parameters, their
//! gradients and buffers are the problem's fixed bytes.
//!
//! # The loss
//! The sum of the means of all floating-point graph outputs. Backward nodes exist for the
//! ops on a path from a parameter to the loss. (A `Softmax`'s output has a constant mean, so
//! the executor weights its elements for the gradient check: `training::constant_mean_outputs`;
//! the plan is the same for any scalar loss of the same outputs.)
//!
//! # The training graph
//! - Nodes, in order: `i:<input>` for data inputs the forward reads; per forward op its
//!   extra saved values `f:<node>:<tag>` (BatchNormalization/LayerNormalization/
//!   InstanceNormalization/GroupNormalization batch statistics `stats`, MaxPool `indices`,
//!   Dropout `mask` (marked `replay_rng`), RNN `workspace`, Attention/RMSNormalization
//!   `stats`, RMSNormalization `normalized` (when its scale takes a gradient, as PyTorch
//!   keeps it), SoftmaxCrossEntropyLoss `log_prob`) then `f:<node>`; `loss`; then
//!   `b:<node>` in reverse forward order. Ids are unique.
//! - Views (Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Expand, Identity, Slice with
//!   positive steps, Split, inactive Dropout, same-type Cast, Gather of a scalar index)
//!   share their input's storage, as in PyTorch: they get no node of their own; readers of
//!   a view depend on the node holding its base, and each storage is counted once in
//!   `saved_activation_bytes` (parameters and frozen weights, held all step, are not: saving
//!   one costs nothing). One exception, also PyTorch's: a batched MatMul whose operand
//!   is a view that cannot fold its batch dims without a copy (strides replayed through the
//!   view ops, `layout`) keeps a copy of it, the extra value `input0_copy`/`input1_copy`,
//!   instead of the view's base.
//! - What each backward keeps follows PyTorch's autograd formulas (`derivatives.yaml`):
//!   ReLU its output, Conv/MatMul/Gemm the operand needed for the other's gradient,
//!   BatchNormalization (training) its input and statistics, Softmax its output, GELU and
//!   LayerNormalization their input (+ statistics), Add nothing... See each op's `grad` in
//!   `ops/`. Exporters' decompositions of single PyTorch ops are fused back first
//!   ([`fuse`]: the erf GELU, SiLU, hardswish, layer norm, group norm, scaled dot-product
//!   attention).
//! - A backward node's deps are the backward nodes of the consumers of its op's outputs
//!   (gradient sources; `loss` for graph outputs) and the forward nodes holding what it
//!   keeps; its bytes are the gradients w.r.t. its float non-parameter inputs; it is
//!   `required` when it produces a parameter gradient. Costs are FLOPs.
//! - Dropout counts as active (a mask is kept) when its ratio is positive; with ratio 0 it
//!   is a view. BatchNormalization is in training mode when `training_mode = 1` (opset 14+)
//!   or when it has more than one output (opsets 9-13).

pub mod cost;
pub mod error;
pub mod external;
pub mod fuse;
pub mod inspect;
mod layout;
pub mod model;
pub mod onnx;
pub mod ops;
pub mod tensor;
pub mod training;

pub use cost::{op_key, OpClass, Rates, Roofline, Sample, MIN_OP_SAMPLES};
pub use error::{PlannerError, Result, UnsupportedNode};
pub use inspect::{InspectReport, TensorInfo, TrainingNodeInfo};
pub use model::{ImportOptions, Model, ValueKind};
pub use training::{ExecInfo, SavedTensor, Source, TrainingGraph, TrainingNode};

/// Imports a model: [`model::read`], then the fusions of exporter decompositions
/// ([`fuse::fuse`]), then the parameter rule ([`model::classify_constants`]).
fn import(bytes: &[u8], opts: &ImportOptions) -> Result<Model> {
    let (mut model, is_const, opts) = model::read(bytes, opts)?;
    fuse::fuse(&mut model, &opts);
    model::classify_constants(&mut model, &is_const, &opts);
    Ok(model)
}

/// Imports a model and checks that every node is supported.
pub fn load(bytes: &[u8], opts: &ImportOptions) -> Result<Model> {
    let model = import(bytes, opts)?;
    if !model.unsupported.is_empty() {
        return Err(PlannerError::Unsupported {
            nodes: model.unsupported.clone(),
        });
    }
    Ok(model)
}

/// Imports a model and reports what the planner sees. Unsupported nodes are listed (all of
/// them) rather than returned as an error; the training fields are then `None`.
pub fn inspect(bytes: &[u8], opts: &ImportOptions) -> Result<InspectReport> {
    let model = import(bytes, opts)?;
    if !model.unsupported.is_empty() {
        return Ok(InspectReport::new(&model, None));
    }
    let training = model.training_graph()?;
    Ok(InspectReport::new(&model, Some(&training)))
}
