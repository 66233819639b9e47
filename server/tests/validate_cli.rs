//! `remat validate` and `remat plan --validate` as a user runs them: exit codes and what they say.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn remat(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_remat"))
        .current_dir(root())
        .args(args)
        .output()
        .expect("remat runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

const MODEL: &str = "fixtures/grad/tiny_cnn.onnx";

#[test]
fn validate_passes_and_prints_the_measured_figures() {
    let o = remat(&["validate", MODEL, "--dim", "batch=2", "--budget", "0.95x"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("validation passed on cpu"), "{t}");
    assert!(t.contains("max relative error 0.00e0"), "{t}");
    // The counting allocator is installed in the binary: the heap is measured.
    assert!(!t.contains("heap not measured"), "{t}");
}

#[test]
fn a_plan_json_round_trips_through_validate_and_a_foreign_plan_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.json");
    let o = remat(&[
        "plan",
        MODEL,
        "--dim",
        "batch=2",
        "--budget",
        "0.95x",
        "--json",
        "--out",
        plan.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = remat(&[
        "validate",
        MODEL,
        "--dim",
        "batch=2",
        "--plan",
        plan.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["validation"]["ok"], true);
    // The same plan against another model: exit 2, naming the node id.
    let o = remat(&[
        "validate",
        "fixtures/grad/mlp_ln_gelu.onnx",
        "--dim",
        "batch=2",
        "--plan",
        plan.to_str().unwrap(),
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("is not in this model's training graph"), "{t}");
}

#[test]
fn a_graph_json_cannot_be_validated_and_cuda_is_not_compiled_in() {
    let graph = root().join("../shared/bench/graphs/VGG16 (MLSys)_256_(224, 224, 3)_train_nx.json");
    let o = remat(&["validate", graph.to_str().unwrap(), "--budget", "0.9x"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("only ONNX models can be validated"));
    if !cfg!(feature = "cuda") {
        let o = remat(&[
            "validate", MODEL, "--dim", "batch=2", "--budget", "0.95x", "--device", "cuda",
        ]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains("not compiled with CUDA"), "{}", text(&o));
    }
}
