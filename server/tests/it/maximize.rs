//! `maximize`: the largest value of a dim whose plan fits a device's memory within an
//! overhead (issue 19). The answer's plan fits (simulated, and run on the executor for a
//! small model), and a fresh plan at the next value does not fit at that overhead.

use remat_server::engine::{ModelFormat, PlanRequest};
use remat_server::pipeline::{PlanJob, Stop};
use remat_solver::plan::Status;

fn root() -> std::path::PathBuf {
    crate::common::manifest_dir().join("..")
}

fn request(dims: &[(&str, u64)], budget: &str, dim: &str, over: Option<f64>) -> PlanRequest {
    PlanRequest {
        budget: Some(budget.to_string()),
        dims: dims.iter().map(|&(k, v)| (k.to_string(), v)).collect(),
        time_limit: Some(2.0),
        maximize: Some(dim.to_string()),
        max_overhead: over,
        ..PlanRequest::default()
    }
}

/// Plans `file` at `dims` with `req`'s budget and overhead limit, without `maximize`:
/// whether it fits, and the plan's overhead.
fn fits_at(bytes: &[u8], req: &PlanRequest, dim: &str, value: u64) -> (bool, Option<f64>) {
    let mut r = req.clone();
    r.maximize = None;
    r.max_overhead = None;
    r.dims.insert(dim.to_string(), value);
    let out = PlanJob::new(bytes, &r).validate(false).run().unwrap();
    let rep = &out.document.report;
    if rep.status == Status::Infeasible {
        return (false, None);
    }
    let o = rep.predicted.overhead;
    (
        o <= req.max_overhead.unwrap_or(f64::INFINITY) + 1e-12,
        Some(o),
    )
}

/// Checks a maximize answer against fresh plans at its value and the next.
fn check_answer(file: &str, req: &PlanRequest, dim: &str, validate: bool) -> u64 {
    let bytes = std::fs::read(root().join(file)).unwrap();
    let out = PlanJob::new(&bytes, req).validate(validate).run().unwrap();
    let doc = &out.document;
    let m = doc.maximize.as_ref().expect("a maximize report");
    let budget = remat_solver::plan::parse_budget(req.budget.as_deref().unwrap(), 0).unwrap();
    assert_eq!(m.budget_bytes, budget);
    assert_eq!(m.dim, dim);
    assert!(m.value >= 1);
    assert_eq!(m.next_value, Some(m.value + 1), "{file}");
    let model = doc.model.as_ref().unwrap();
    assert_eq!(
        model.symbolic_dims[dim], m.value,
        "the document is the plan at the answer"
    );
    assert_ne!(doc.report.status, Status::Infeasible);
    assert!(doc.report.predicted.peak_bytes <= budget);
    if let Some(limit) = req.max_overhead {
        assert!(doc.report.predicted.overhead <= limit + 1e-12);
    }
    // Every probe at or below the answer fits and every one above it does not (the
    // search's monotone assumption held on what it tried).
    for p in &m.probes {
        assert_eq!(
            p.fits,
            p.value <= m.value,
            "{file} {dim}={}: {}",
            p.value,
            p.reason
        );
    }
    let next = m.probes.iter().find(|p| p.value == m.value + 1).unwrap();
    assert!(!next.fits);
    // Fresh plans, outside the search: the answer fits, the next value does not.
    assert!(
        fits_at(&bytes, req, dim, m.value).0,
        "{file}: {dim}={}",
        m.value
    );
    let (fits, o) = fits_at(&bytes, req, dim, m.value + 1);
    assert!(!fits, "{file}: {dim}={} fits ({o:?})", m.value + 1);
    if validate {
        match out.stop {
            Stop::Validated { ok } => assert!(ok, "{file}: the run failed its checks"),
            ref other => panic!("{file}: not run: {other:?}"),
        }
        let v = serde_json::to_value(&doc.validation).unwrap();
        let measured = v["measured_peak_bytes"].as_u64().unwrap();
        assert!(
            measured <= budget,
            "measured {measured} > device memory {budget}"
        );
    }
    m.value
}

#[test]
fn the_largest_batch_of_a_small_cnn_fits_and_runs_on_the_executor() {
    // Between the store-all peaks at batch 16 and 32: the plan must recompute to fit.
    let file = "fixtures/grad/tiny_cnn.onnx";
    let bytes = std::fs::read(root().join(file)).unwrap();
    let peak = |b: u64| {
        let r = PlanRequest {
            budget: Some("1.0x".into()),
            dims: [("batch".to_string(), b)].into(),
            solver: Some("store-all".into()),
            ..PlanRequest::default()
        };
        let out = PlanJob::new(&bytes, &r).run().unwrap();
        out.document.report.store_all_peak_bytes
    };
    let budget = (peak(16) + peak(32)) / 2;
    let req = request(&[("batch", 2)], &budget.to_string(), "batch", Some(0.5));
    let any = check_answer(file, &req, "batch", true);
    assert!(
        any > 16,
        "store-all alone reaches 16, the plan goes further: {any}"
    );
    // A tighter overhead never allows a larger batch.
    let strict = check_answer(
        file,
        &request(&[("batch", 2)], &budget.to_string(), "batch", Some(0.0)),
        "batch",
        false,
    );
    assert!(strict <= any, "{strict} > {any}");
    assert!(strict >= 16, "store-all fits at 16: {strict}");
}

#[test]
fn the_largest_batch_of_gpt2_fits_at_ten_percent() {
    let req = request(&[("batch", 1), ("seq", 32)], "60MB", "batch", Some(0.1));
    check_answer("fixtures/models/gpt2.legacy.onnx", &req, "batch", false);
}

/// GPT-2's positions end at its `n_positions` (128 in the fixture): past it the model does not
/// import (its position Gather is out of range). That value does not fit, and the answer is the
/// largest that imports and fits, not an error (it was `malformed_model` at seq=256).
#[test]
fn a_value_the_model_does_not_import_at_does_not_fit() {
    let bytes = std::fs::read(root().join("fixtures/models/gpt2.legacy.onnx")).unwrap();
    let req = request(&[("batch", 1), ("seq", 100)], "4GiB", "seq", None);
    let out = PlanJob::new(&bytes, &req).validate(false).run().unwrap();
    let m = out.document.maximize.as_ref().expect("a maximize report");
    assert_eq!((m.value, m.next_value), (128, Some(129)), "{:?}", m.probes);
    let past = m
        .probes
        .iter()
        .find(|p| p.value == 129)
        .expect("seq=129 probed");
    assert!(
        !past.fits && past.reason.contains("does not import"),
        "{past:?}"
    );
}

#[test]
fn maximize_errors_name_what_is_wrong() {
    let bytes = std::fs::read(root().join("fixtures/grad/tiny_cnn.onnx")).unwrap();
    let err = |req: PlanRequest| PlanJob::new(&bytes, &req).run().err().unwrap();
    let e = err(request(&[], "0.5x", "batch", None));
    assert!(
        e.message.contains("fraction of the store-all peak"),
        "{}",
        e.message
    );
    let e = err(request(&[], "1GiB", "heads", None));
    assert!(
        e.message.contains("maximize at heads=")
            && e.message.contains("\"heads\"")
            && e.message.contains("batch"),
        "{}",
        e.message
    );
    // A dim the model lacks is the request's fault, not the model's.
    assert_eq!(e.code, "invalid_option", "{}", e.message);
    let e = err(request(&[], "1GiB", "batch", Some(-1.0)));
    assert!(e.message.contains("max_overhead"), "{}", e.message);
    // Nothing fits: the least peak at batch 1 is over a 1 KB device.
    let e = err(request(&[], "1000", "batch", None));
    assert_eq!(e.code, "nothing_fits", "{}", e.message);
    assert!(e.message.contains("batch=1"), "{}", e.message);
    // At batch 1's least peak only recomputing fits: at 0% overhead nothing fits, and the
    // error says why.
    let r = PlanRequest {
        budget: Some("1".into()),
        dims: [("batch".to_string(), 1)].into(),
        time_limit: Some(2.0),
        ..PlanRequest::default()
    };
    let least = PlanJob::new(&bytes, &r).run().unwrap().document.report;
    let least = least.min_feasible_budget_bytes.unwrap();
    let e = err(request(&[], &least.to_string(), "batch", Some(0.0)));
    assert_eq!(e.code, "nothing_fits", "{}", e.message);
    assert!(
        e.message.contains("over the limit of 0.00%"),
        "{}",
        e.message
    );
    // A node-link graph has no dims.
    let graph =
        br#"{"directed": true, "nodes": [{"id": "a", "cost": 1, "bytes": 4}], "links": []}"#;
    let req = request(&[], "1GiB", "batch", None);
    assert_eq!(ModelFormat::detect(graph), ModelFormat::GraphJson);
    let e = PlanJob::new(graph, &req).run().err().unwrap();
    assert!(e.message.contains("node-link graph"), "{}", e.message);
    // A captured PyTorch graph has the shapes it was captured at: refused by torch::plan,
    // which the CLI and the service both call.
    let torch = std::fs::read(root().join("fixtures/torch/stack.torch.json")).unwrap();
    let e = remat_server::pipeline::torch::plan(
        &torch,
        &request(&[], "1GiB", "batch", None),
        &Default::default(),
    )
    .err()
    .unwrap();
    assert!(
        e.message.contains("captured PyTorch graph"),
        "{}",
        e.message
    );
}
