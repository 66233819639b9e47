//! External data: tensors kept in a file beside the model, read by `inline_external_data`;
//! a model sent as bytes without them is refused where a shape depends on them.

use crate::build::*;
use onnx_protobuf::tensor_proto::DataLocation;
use onnx_protobuf::{StringStringEntryProto, TensorProto};
use remat_planner::external::inline_external_data;
use remat_planner::{inspect, load, ImportOptions};
use std::path::PathBuf;

/// A folder of its own under the system's temporary folder, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("remat-ext-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp folder");
        Dir(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `t` with its bytes moved to `location` at `offset` (the entries `onnx.save` writes).
fn external(mut t: TensorProto, location: &str, offset: usize, file: &mut Vec<u8>) -> TensorProto {
    let raw = if t.raw_data.is_empty() {
        t.int64_data.iter().flat_map(|v| v.to_le_bytes()).collect()
    } else {
        std::mem::take(&mut t.raw_data)
    };
    t.int64_data.clear();
    file.resize(offset, 0);
    file.extend_from_slice(&raw);
    for (k, v) in [
        ("location", location.to_string()),
        ("offset", offset.to_string()),
        ("length", raw.len().to_string()),
    ] {
        let mut e = StringStringEntryProto::new();
        e.key = k.into();
        e.value = v;
        t.external_data.push(e);
    }
    t.data_location = DataLocation::EXTERNAL.into();
    t
}

/// `x[2, 8] → Reshape(shape) → MatMul(w[4, 3])`: the shape and the weight both external.
fn model(location: &str, file: &mut Vec<u8>) -> G {
    let w: Vec<f32> = (0..12).map(|i| i as f32 * 0.25).collect();
    G::new(17)
        .input("x", F32, &[D::P("batch"), D::V(8)])
        .init(external(
            tensor_i64("shape", &[2], &[-1, 4]),
            location,
            0,
            file,
        ))
        .init(external(tensor_f32("w", &[4, 3], &w), location, 64, file))
        .node("Reshape", "reshape", &["x", "shape"], &["r"], vec![])
        .node("MatMul", "mm", &["r", "w"], &["y"], vec![])
        .output("y")
}

fn opts() -> ImportOptions {
    dims(&[("batch", 2)])
}

#[test]
fn external_tensors_are_read_from_the_file_beside_the_model() {
    let dir = Dir::new("read");
    let mut file = vec![];
    let bytes = model("weights.bin", &mut file).bytes();
    std::fs::write(dir.0.join("weights.bin"), &file).expect("write");
    let (inlined, done) = inline_external_data(&bytes, &dir.0).expect("reads the file");
    assert_eq!(
        (done.tensors, done.bytes, done.left_external),
        (2, 16 + 48, 0)
    );
    let r = inspect(&inlined, &opts()).expect("imports with the shape read");
    assert_eq!(r.params_bytes, Some(12 * 4));
    // The weight's values are the file's.
    let proto = remat_planner::onnx::parse_model(&inlined).expect("parses");
    let g = proto.graph.as_ref().expect("graph");
    let w = g.initializer.iter().find(|t| t.name == "w").expect("w");
    let t = remat_planner::onnx::decode_tensor_values(w, "w")
        .expect("decodes")
        .expect("inline now");
    assert_eq!(t.shape, vec![4, 3]);
    // A model with nothing external comes back as it was.
    let plain = mlp().bytes();
    let (same, done) = inline_external_data(&plain, &dir.0).expect("nothing to read");
    assert_eq!((same.as_ref(), done.tensors), (plain.as_slice(), 0));
}

#[test]
fn external_data_that_cannot_be_read_is_an_error_naming_the_tensor_and_the_file() {
    let dir = Dir::new("errors");
    let mut file = vec![];
    let bytes = model("weights.bin", &mut file).bytes();
    // Missing file.
    let e = inline_external_data(&bytes, &dir.0)
        .expect_err("no file")
        .to_string();
    assert!(
        e.contains("tensor \"shape\", external data \"weights.bin\": cannot open"),
        "{e}"
    );
    // A file too short for the range.
    std::fs::write(dir.0.join("weights.bin"), &file[..70]).expect("write");
    let e = inline_external_data(&bytes, &dir.0)
        .expect_err("short")
        .to_string();
    assert!(
        e.contains("tensor \"w\"") && e.contains("past the end of"),
        "{e}"
    );
    // A negative dimension: refused by name, not read as an empty tensor.
    let mut f = vec![];
    let mut g = model("weights.bin", &mut f);
    let w = g.graph.initializer.iter_mut().filter(|t| t.name == "w");
    w.for_each(|t| t.dims = vec![-4, 3]);
    std::fs::write(dir.0.join("weights.bin"), &f).expect("write");
    let e = inline_external_data(&g.bytes(), &dir.0)
        .expect_err("negative dimension")
        .to_string();
    assert!(
        e.contains("tensor \"w\"") && e.contains("negative dimension -4"),
        "{e}"
    );
    // A location outside the model's folder.
    for bad in ["../weights.bin", "/etc/passwd"] {
        let mut f = vec![];
        let b = model(bad, &mut f).bytes();
        let e = inline_external_data(&b, &dir.0).expect_err(bad).to_string();
        assert!(
            e.contains("relative path inside the model's folder"),
            "{bad}: {e}"
        );
    }
    // A link inside the folder to a file outside it: refused where it resolves, not read.
    let outside = Dir::new("outside");
    let mut f = vec![];
    let b = model("link.bin", &mut f).bytes();
    std::fs::write(outside.0.join("weights.bin"), &f).expect("write");
    std::os::unix::fs::symlink(outside.0.join("weights.bin"), dir.0.join("link.bin"))
        .expect("link");
    let e = inline_external_data(&b, &dir.0)
        .expect_err("link out")
        .to_string();
    assert!(
        e.contains("tensor \"shape\", external data \"link.bin\"")
            && e.contains("must be inside the model's folder; it resolves to"),
        "{e}"
    );
    // A link that stays inside the folder is read.
    std::fs::remove_file(dir.0.join("link.bin")).expect("unlink");
    std::fs::write(dir.0.join("weights.bin"), &f).expect("write");
    std::os::unix::fs::symlink("weights.bin", dir.0.join("link.bin")).expect("link");
    inline_external_data(&b, &dir.0).expect("a link inside the folder");
}

#[test]
fn a_model_sent_without_its_external_shapes_is_refused_by_name() {
    let mut file = vec![];
    let bytes = model("weights.bin", &mut file).bytes();
    let e = load(&bytes, &opts())
        .expect_err("shape not read")
        .to_string();
    assert!(
        e.contains("tensor \"shape\", external data \"weights.bin\": its data was not read"),
        "{e}"
    );
    // External float weights alone do not stop planning (their shapes are declared).
    let w: Vec<f32> = vec![0.5; 12];
    let mut f = vec![];
    let weights_only = G::new(17)
        .input("x", F32, &[D::P("batch"), D::V(4)])
        .init(external(tensor_f32("w", &[4, 3], &w), "w.bin", 0, &mut f))
        .node("MatMul", "mm", &["x", "w"], &["y"], vec![])
        .output("y");
    let r = inspect(&weights_only.bytes(), &opts()).expect("plans without the values");
    assert_eq!(r.params_bytes, Some(12 * 4));
}
