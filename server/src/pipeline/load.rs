//! Loading a model: ONNX bytes through the planner (import, training graph, inspect report),
//! node-link JSON through the solver's reader; either way a solver [`Problem`].

use crate::engine::{EngineError, ErrorKind, ModelFormat, PlanRequest};
use remat_planner::{ImportOptions, InspectReport, Model, PlannerError, TrainingGraph};
use remat_solver::Problem;
use serde_json::json;

/// A model ready to plan: the solver problem and, for ONNX models, the importer's report and
/// what the executor needs to run it.
pub struct Loaded<'a> {
    pub problem: Problem,
    pub format: ModelFormat,
    pub inspect: Option<InspectReport>,
    pub exec: Option<ExecModel<'a>>,
}

impl Loaded<'_> {
    /// The bytes the backward reads of the forward when nothing is recomputed: for an ONNX
    /// model the storages autograd saves, each counted once (views share their base's), the
    /// extra values the gradient rules keep (batch statistics, max-pool indices, dropout
    /// masks) and the constants they read, parameters left out: the training graph's
    /// `saved_activation_bytes`, which `remat inspect` reports too. A node-link graph has no
    /// tensors: the bytes of its forward nodes a backward node reads.
    pub fn saved_activation_bytes(&self) -> u64 {
        match &self.exec {
            Some(em) => em.training.saved_activation_bytes,
            None => self.problem.saved_for_backward_bytes(),
        }
    }
}

/// An imported ONNX model, kept for the executor.
pub struct ExecModel<'a> {
    pub model: Model,
    pub training: TrainingGraph,
    /// The file's bytes, borrowed from the caller (not copied: only a validation reads them,
    /// for the stored weights).
    pub bytes: &'a [u8],
}

/// The importer's options of a request: dims, parameters, inputs, frozen weights.
pub fn import_options(req: &PlanRequest) -> ImportOptions {
    ImportOptions {
        dims: req.dims.clone(),
        params: req.params.clone(),
        inputs: req.inputs.clone(),
        frozen: req.frozen.clone(),
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
            let text = std::str::from_utf8(ModelFormat::without_bom(model)).map_err(|e| {
                EngineError::new(
                    ErrorKind::BadInput,
                    "malformed_graph",
                    format!("graph JSON is not UTF-8: {e}"),
                )
            })?;
            refuse_options(format, req)?;
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
        ModelFormat::TorchGraph => Err(EngineError::new(
            ErrorKind::Unprocessable,
            "torch_graph",
            "a captured PyTorch graph (remat.torch-graph) is planned in the torch-sac model: \
             `remat plan`, `remat sweep`, `remat gate`, POST /v1/plans or /v1/sweeps; it has no \
             free-schedule problem to run on the executor or to inspect here (prove its plan \
             with remat.torch.measure, docs/torch.md)",
        )),
        ModelFormat::Onnx => {
            not_json(model)?;
            let opts = import_options(req);
            // `load` reports every unsupported node at once (a 422 listing them).
            let model = remat_planner::load(model, &opts).map_err(planner_error)?;
            let training = model.training_graph().map_err(planner_error)?;
            let report = InspectReport::new(&model, Some(&training));
            // Costs in seconds by the roofline (FLOPs and bytes moved at the process's rates);
            // `Costs::Flops` and `Costs::Measured` replace them later.
            let mut problem = super::rates::roofline()
                .problem(&training)
                .map_err(planner_error)?;
            // Named by the request (the CLI's file stem), else "model" as a node-link graph is
            // "graph": the training graph's own name is the exporter's ("pytorch 2.15.0"), which
            // messages would call the model by.
            problem.name = req.name.clone().unwrap_or_else(|| "model".to_string());
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

/// Refuses JSON that is not an object (`null`, an array, a number): it is neither ONNX nor one
/// of the JSON formats, and the ONNX reader's error would not say so; and an empty model (no
/// bytes, or blanks only), which the ONNX reader called a protobuf without a graph.
pub fn not_json(model: &[u8]) -> Result<(), EngineError> {
    if model.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(EngineError::new(
            ErrorKind::BadInput,
            "malformed_model",
            format!(
                "the model is empty ({} bytes{}): send an ONNX model, a node-link graph or a captured PyTorch graph",
                model.len(),
                if model.is_empty() { "" } else { ", blanks only" }
            ),
        ));
    }
    let kind = match serde_json::from_slice::<serde_json::Value>(ModelFormat::without_bom(model)) {
        Ok(serde_json::Value::Object(_)) | Err(_) => return Ok(()),
        Ok(serde_json::Value::Array(_)) => "an array",
        Ok(serde_json::Value::Null) => "null",
        Ok(serde_json::Value::Bool(_)) => "a boolean",
        Ok(serde_json::Value::Number(_)) => "a number",
        Ok(serde_json::Value::String(_)) => "a string",
    };
    Err(EngineError::new(
        ErrorKind::BadInput,
        "malformed_graph",
        format!(
            "the model is JSON but {kind}, not an object: a node-link graph or a captured PyTorch graph is a JSON object (and an ONNX model is protobuf bytes)"
        ),
    ))
}

/// Refuses, as `invalid_option`, an option a model in `format` would ignore
/// ([`crate::engine::refused_option`]).
pub fn refuse_options(format: ModelFormat, req: &PlanRequest) -> Result<(), EngineError> {
    match crate::engine::refused_option(format, req) {
        Some(message) => Err(EngineError::new(
            ErrorKind::BadInput,
            "invalid_option",
            message,
        )),
        None => Ok(()),
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
        // The request names a dim the model does not have: the option is wrong, not the model.
        PlannerError::UnknownDim { known, .. } => {
            EngineError::new(ErrorKind::BadInput, "invalid_option", message)
                .with_details(json!({ "known_dims": known }))
        }
        // `params` / `inputs` name an input the model lacks, or a parameter it cannot train.
        PlannerError::UnknownInput { .. }
        | PlannerError::ParamNotFloat { .. }
        | PlannerError::NoMatch { .. }
        | PlannerError::BadPattern { .. }
        | PlannerError::NamedTwice { .. } => {
            EngineError::new(ErrorKind::BadInput, "invalid_option", message)
        }
        // A model whose shapes depend on data kept in a file beside it: the body carries no
        // files (the CLI reads them from the model's folder).
        PlannerError::ExternalData {
            tensor, location, ..
        } => EngineError::new(ErrorKind::Unprocessable, "external_data", message)
            .with_details(json!({ "tensor": tensor, "location": location })),
        _ => EngineError::new(ErrorKind::BadInput, "malformed_model", message),
    }
}
