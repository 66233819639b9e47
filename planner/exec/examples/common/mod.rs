//! What the examples share: a model file and its `NAME=VALUE` dims, loaded.

use remat_planner::{load, ImportOptions, Model, TrainingGraph};

/// The model at `path` with `dims` bound (each `NAME=VALUE`): its bytes, the model and its
/// training graph.
pub fn load_model(
    path: &str,
    dims: impl Iterator<Item = String>,
) -> Result<(Vec<u8>, Model, TrainingGraph), Box<dyn std::error::Error>> {
    let mut opts = ImportOptions::default();
    for a in dims {
        let (k, v) = a.split_once('=').ok_or("dims are NAME=VALUE")?;
        opts.dims.insert(k.to_string(), v.parse()?);
    }
    let bytes = std::fs::read(path)?;
    let model = load(&bytes, &opts)?;
    let tg = model.training_graph()?;
    Ok((bytes, model, tg))
}
