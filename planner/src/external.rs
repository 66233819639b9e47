//! External data: tensors whose bytes an ONNX file keeps in another file beside it
//! (`onnx.save(..., save_as_external_data=True)`, the dynamo exporter's `model.onnx.data`).
//! [`inline_external_data`] reads them into the tensors' `raw_data` before the import, so that
//! the importer and the executor read them like inline data; [`check_no_external_shapes`]
//! refuses a model whose shape-carrying constants were left in files nobody read (a model sent
//! as bytes over HTTP carries no files beside it).

use crate::error::{PlannerError, Result};
use crate::onnx::parse_model;
use crate::tensor::{bytes_of, keep_value, numel, DType};
use onnx_protobuf::tensor_proto::DataLocation;
use onnx_protobuf::{GraphProto, Message, ModelProto, TensorProto};
use std::borrow::Cow;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path};

/// Bytes of floating-point tensors inlined at most: the protobuf the importer parses must stay
/// well under protobuf's 2 GiB. Float tensors past it stay external (the executor seeds them
/// and says so); integer tensors (shapes, indices) are always read.
pub const INLINE_FLOAT_LIMIT: u64 = 1 << 30;

/// Whether a tensor keeps its data in an external file.
pub fn is_external(t: &TensorProto) -> bool {
    t.data_location.value() == DataLocation::EXTERNAL as i32 || !t.external_data.is_empty()
}

fn err(t: &TensorProto, location: &str, reason: impl Into<String>) -> PlannerError {
    PlannerError::ExternalData {
        tensor: t.name.clone(),
        location: location.to_string(),
        reason: reason.into(),
    }
}

/// What [`inline_external_data`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inlined {
    /// Tensors read from their files.
    pub tensors: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Floating-point tensors left in their files past [`INLINE_FLOAT_LIMIT`].
    pub left_external: usize,
}

/// Reads every external tensor of the model in `bytes` (initializers and `Constant` values,
/// subgraphs included) from its file under `dir` (the model file's folder) into its
/// `raw_data`. The bytes come back unchanged when nothing is external. Errors name the tensor
/// and the file: a location that is absolute or leaves `dir`, a missing file, a range past
/// the file's end, a length that is not the tensor's. Bytes that are no model come back as
/// they are: what reads them next says what is wrong with them.
pub fn inline_external_data<'a>(bytes: &'a [u8], dir: &Path) -> Result<(Cow<'a, [u8]>, Inlined)> {
    let Ok(mut model) = parse_model(bytes) else {
        return Ok((Cow::Borrowed(bytes), Inlined::default()));
    };
    let mut done = Inlined::default();
    let mut any = false;
    if let Some(g) = model.graph.as_mut() {
        visit(g, &mut |t| {
            if is_external(t) {
                any = true;
                read_into(t, dir, &mut done)?;
            }
            Ok(())
        })?;
    }
    if !any {
        return Ok((Cow::Borrowed(bytes), done));
    }
    let out = model
        .write_to_bytes()
        .map_err(|e| PlannerError::Malformed {
            what: format!("re-encoding the model with its external data inline: {e}"),
        })?;
    Ok((Cow::Owned(out), done))
}

/// Refuses a model whose integer constants small enough to carry shapes or indices are still
/// in external files (not read: [`inline_external_data`] was not given the model's folder),
/// naming the first such tensor and its file.
pub fn check_no_external_shapes(model: &mut ModelProto) -> Result<()> {
    let Some(g) = model.graph.as_mut() else {
        return Ok(());
    };
    visit(g, &mut |t| {
        let Some(dtype) = DType::from_onnx(i64::from(t.data_type)) else {
            return Ok(());
        };
        let n = t
            .dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d.max(0) as u64));
        if is_external(t) && !dtype.is_float() && n.is_some_and(|n| keep_value(dtype, n)) {
            return Err(err(
                t,
                &location_of(t),
                "its data was not read: a model sent as bytes (an upload, a request body) carries \
                 no files beside it; save the model with its data inline \
                 (onnx.save(model, path, save_as_external_data=False)) or plan it from its file \
                 with the CLI, which reads the file beside the model",
            ));
        }
        Ok(())
    })
}

fn location_of(t: &TensorProto) -> String {
    t.external_data
        .iter()
        .find(|e| e.key == "location")
        .map(|e| e.value.clone())
        .unwrap_or_default()
}

/// Every tensor of the graph and its subgraphs: initializers and tensor attributes.
fn visit(g: &mut GraphProto, f: &mut dyn FnMut(&mut TensorProto) -> Result<()>) -> Result<()> {
    for t in &mut g.initializer {
        f(t)?;
    }
    for n in &mut g.node {
        for a in &mut n.attribute {
            if let Some(t) = a.t.as_mut() {
                f(t)?;
            }
            for t in &mut a.tensors {
                f(t)?;
            }
            if let Some(sub) = a.g.as_mut() {
                visit(sub, f)?;
            }
            for sub in &mut a.graphs {
                visit(sub, f)?;
            }
        }
    }
    Ok(())
}

fn read_into(t: &mut TensorProto, dir: &Path, done: &mut Inlined) -> Result<()> {
    let mut location = None;
    let mut offset = 0u64;
    let mut length = None;
    for e in &t.external_data {
        let number = |what: &str| {
            e.value.trim().parse::<u64>().map_err(|_| {
                err(
                    t,
                    &location_of(t),
                    format!("{what} {:?} is not a whole number of bytes", e.value),
                )
            })
        };
        match e.key.as_str() {
            "location" => location = Some(e.value.clone()),
            "offset" => offset = number("offset")?,
            "length" => length = Some(number("length")?),
            _ => {}
        }
    }
    let Some(location) = location else {
        return Err(err(
            t,
            "",
            "the tensor is marked external but names no location",
        ));
    };
    let rel = Path::new(&location);
    if location.is_empty()
        || !rel
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(err(
            t,
            &location,
            "the location must be a relative path inside the model's folder",
        ));
    }
    let dtype = DType::from_onnx(i64::from(t.data_type)).ok_or_else(|| {
        err(
            t,
            &location,
            format!("unknown or undefined data type {}", t.data_type),
        )
    })?;
    let shape = t
        .dims
        .iter()
        .map(|&d| {
            u64::try_from(d).map_err(|_| {
                err(
                    t,
                    &location,
                    format!("its shape {:?} has a negative dimension {d}", t.dims),
                )
            })
        })
        .collect::<Result<Vec<u64>>>()?;
    let want = numel(&shape)
        .map(|n| bytes_of(dtype, n))
        .ok_or_else(|| err(t, &location, "the element count of its shape overflows"))?;
    if let Some(len) = length {
        if len != want {
            return Err(err(
                t,
                &location,
                format!("length {len} is not the {want} bytes of its shape {shape:?} ({dtype:?})"),
            ));
        }
    }
    if dtype.is_float() && done.bytes.saturating_add(want) > INLINE_FLOAT_LIMIT {
        done.left_external += 1;
        return Ok(());
    }
    let path = dir.join(rel);
    // A link inside the folder may lead out of it: where the path resolves is what must be
    // inside (a file that cannot be resolved is left to `open` to report).
    if let (Ok(real), Ok(real_dir)) = (path.canonicalize(), dir.canonicalize()) {
        if !real.starts_with(&real_dir) {
            return Err(err(
                t,
                &location,
                format!(
                    "the location must be inside the model's folder; it resolves to {}, outside {}",
                    real.display(),
                    real_dir.display()
                ),
            ));
        }
    }
    let mut file = std::fs::File::open(&path)
        .map_err(|e| err(t, &location, format!("cannot open {}: {e}", path.display())))?;
    let size = file
        .metadata()
        .map_err(|e| err(t, &location, format!("cannot read {}: {e}", path.display())))?
        .len();
    if offset.checked_add(want).is_none_or(|end| end > size) {
        return Err(err(
            t,
            &location,
            format!(
                "bytes {offset}..{} are past the end of {} ({size} bytes)",
                offset.saturating_add(want),
                path.display()
            ),
        ));
    }
    let mut data = vec![0u8; want as usize];
    file.seek(SeekFrom::Start(offset))
        .and_then(|_| file.read_exact(&mut data))
        .map_err(|e| err(t, &location, format!("cannot read {}: {e}", path.display())))?;
    t.raw_data = data;
    t.external_data.clear();
    t.data_location = DataLocation::DEFAULT.into();
    done.tensors += 1;
    done.bytes += want;
    Ok(())
}
