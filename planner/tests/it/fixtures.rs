//! Data-driven tests over `fixtures/manifest.json`: every model imports at its dims with no
//! unsupported node, its parameter bytes match PyTorch's exactly, and its saved-activation
//! bytes agree with PyTorch's autograd within the model's tolerance.

use remat_planner::{inspect, ImportOptions, InspectReport};
use serde_json::Value;
use std::path::PathBuf;

fn fixtures_dir() -> PathBuf {
    crate::manifest_dir().join("../fixtures")
}

/// The manifest's models; an absent manifest is an empty one.
fn manifest() -> Vec<Value> {
    let path = fixtures_dir().join("manifest.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return vec![];
    };
    let m: Value = serde_json::from_str(&text).expect("fixtures/manifest.json is valid JSON");
    m["models"].as_array().cloned().unwrap_or_default()
}

fn options(entry: &Value) -> ImportOptions {
    let mut opts = ImportOptions::default();
    if let Some(dims) = entry["dims"].as_object() {
        for (k, v) in dims {
            opts.dims
                .insert(k.clone(), v.as_u64().expect("dims are integers"));
        }
    }
    opts
}

fn report(entry: &Value) -> Result<InspectReport, String> {
    let file = fixtures_dir().join(entry["file"].as_str().ok_or("file is not a string")?);
    let bytes = std::fs::read(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    inspect(&bytes, &options(entry)).map_err(|e| e.to_string())
}

#[test]
fn every_manifest_model_matches_pytorch() {
    let mut failures = vec![];
    for entry in manifest() {
        let name = entry["name"].as_str().unwrap_or("?").to_string();
        let r = match report(&entry) {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let exp = &entry["expected"];
        if !r.unsupported.is_empty() {
            failures.push(format!("{name}: unsupported {:?}", r.unsupported));
            continue;
        }
        if let Some(n) = exp["onnx_nodes"].as_u64() {
            if r.nodes as u64 != n {
                failures.push(format!("{name}: {} nodes, manifest says {n}", r.nodes));
            }
        }
        if let Some(p) = exp["params_bytes"].as_u64() {
            if r.params_bytes != Some(p) {
                failures.push(format!(
                    "{name}: params_bytes {:?}, PyTorch {p}",
                    r.params_bytes
                ));
            }
        }
        let saved = r.saved_activation_bytes.unwrap_or(0) as f64;
        if let Some(pt) = exp["pytorch_saved_activation_bytes"].as_f64() {
            let tol = exp["saved_activation_tolerance"].as_f64().unwrap_or(0.15);
            let signed = (saved - pt) / pt;
            let rel = signed.abs();
            eprintln!("{name:24} saved {saved:>12} pytorch {pt:>12} rel {signed:+.4} (tol {tol})");
            if rel > tol {
                failures.push(format!(
                    "{name}: saved activations {saved} vs PyTorch {pt} ({rel:.3} > {tol})"
                ));
            }
        }
        if let Some(training) = &r.training {
            let ids: std::collections::HashSet<&str> =
                training.iter().map(|n| n.id.as_str()).collect();
            if ids.len() != training.len() {
                failures.push(format!("{name}: duplicate training node ids"));
            }
            for n in training.iter().filter(|n| n.id.starts_with("b:")) {
                if !ids.contains(format!("f:{}", &n.id[2..]).as_str()) {
                    failures.push(format!("{name}: {} has no forward node", n.id));
                }
            }
            if r.params_bytes.unwrap_or(0) > 0 && !training.iter().any(|n| n.required) {
                failures.push(format!(
                    "{name}: no backward node produces a parameter gradient"
                ));
            }
        }
        let peak = r.store_all_peak_bytes.unwrap_or(0);
        if peak < r.fixed_bytes.unwrap_or(0) {
            failures.push(format!(
                "{name}: store-all peak {peak} below the fixed bytes"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
