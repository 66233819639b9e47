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

/// Every manifest model's sweep (`auto`, a short time limit per point) never costs more at a
/// larger budget, whichever solver answers each point (issue 19: the plan at a budget is
/// offered the one found below it).
#[test]
fn every_manifest_model_sweeps_monotone() {
    use remat_solver::plan::{sweep, PlanOptions};
    let mut failures = vec![];
    let mut ran = 0;
    for entry in manifest() {
        let name = entry["name"].as_str().unwrap_or("?").to_string();
        let file = fixtures_dir().join(entry["file"].as_str().unwrap_or("?"));
        let problem = std::fs::read(&file)
            .map_err(|e| e.to_string())
            .and_then(|b| remat_planner::load(&b, &options(&entry)).map_err(|e| e.to_string()))
            .and_then(|m| m.training_graph().map_err(|e| e.to_string()))
            .map(|t| t.to_problem());
        let problem = match problem {
            Ok(p) => p,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let mut opts = PlanOptions::new(0);
        opts.time_limit = std::time::Duration::from_millis(300);
        // Budgets 30%, 60% and 85% of the way from the footprint bound (no schedule peaks
        // below it) to the store-all peak, given unsorted: most fixtures' weights put a plain
        // fraction of the store-all peak below what any schedule can reach.
        let peak = remat_solver::store_all_peak(&problem) as f64;
        let floor = problem.footprint_lower_bound() as f64;
        let fractions: Vec<f64> = [0.3, 0.85, 0.6]
            .iter()
            .map(|t| (floor + t * (peak - floor)) / peak)
            .collect();
        let points = match sweep(&problem, &fractions, &opts) {
            Ok(p) => p,
            Err(e) => {
                failures.push(format!("{name}: sweep: {e}"));
                continue;
            }
        };
        ran += 1;
        let mut sorted: Vec<_> = points.iter().collect();
        sorted.sort_by_key(|q| q.budget_bytes);
        let shown: Vec<String> = sorted
            .iter()
            .map(|q| format!("{:.3}x: {:?} ({})", q.fraction, q.overhead, q.solver))
            .collect();
        eprintln!("{name:24} {}", shown.join(", "));
        for w in sorted.windows(2) {
            let worse = match (w[0].overhead, w[1].overhead) {
                (Some(a), Some(b)) => b > a + 1e-12,
                (Some(_), None) => true,
                _ => false,
            };
            if worse {
                failures.push(format!("{name}: not monotone: {}", shown.join(", ")));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(ran > 0, "no fixture model was swept");
}
