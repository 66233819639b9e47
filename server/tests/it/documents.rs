//! The typed documents: they serialize to the JSON the plan and sweep documents had when they
//! were assembled from `serde_json::Value` inserts (golden files written by that builder, through
//! `remat plan --json` and `remat sweep --json` before the types replaced it), and the OpenAPI
//! document describes their fields.
//!
//! The golden files are in `tests/it/golden/`; their `solve_seconds` (the one figure a clock
//! decides) is set to 0, here as there.

use remat_server::engine::document::ValidationReport;
use remat_server::engine::{ModelFormat, PlanRequest};
use remat_server::pipeline::{default_threads, load, sweep_document, PlanJob, Stop};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn root() -> PathBuf {
    crate::common::manifest_dir().join("..")
}

fn golden(name: &str) -> Value {
    let path = golden_path(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn golden_path(name: &str) -> std::path::PathBuf {
    crate::common::manifest_dir()
        .join("tests/it/golden")
        .join(name)
}

/// `doc` against the golden file `name`; with `REMAT_UPDATE_GOLDEN=1` the file is written
/// from `doc` instead (review the diff before committing it).
fn check_golden(doc: &Value, name: &str) {
    if std::env::var_os("REMAT_UPDATE_GOLDEN").is_some() {
        let text = serde_json::to_string_pretty(doc).unwrap() + "\n";
        std::fs::write(golden_path(name), text).unwrap();
        return;
    }
    assert_eq!(doc, &golden(name));
}

/// The request `remat plan FILE --dim ... --budget B --solver S` makes.
fn cli_request(
    file: &str,
    dims: &[(&str, u64)],
    budget: Option<&str>,
    solver: &str,
) -> PlanRequest {
    let stem = std::path::Path::new(file).file_stem().unwrap();
    PlanRequest {
        budget: budget.map(str::to_string),
        dims: dims
            .iter()
            .map(|&(k, v)| (k.to_string(), v))
            .collect::<BTreeMap<_, _>>(),
        solver: Some(solver.to_string()),
        time_limit: Some(30.0),
        bound_time: Some(0.0),
        name: Some(stem.to_string_lossy().into_owned()),
        ..PlanRequest::default()
    }
}

/// The plan document of `remat plan` for `request` on `file`, as JSON, its clock figure zeroed.
fn plan_json(file: &str, request: &PlanRequest) -> (Value, Stop) {
    let bytes = std::fs::read(root().join(file)).unwrap();
    let outcome = PlanJob::new(&bytes, request).run().unwrap();
    let mut doc = serde_json::to_value(&outcome.document).unwrap();
    doc["solve_seconds"] = Value::from(0.0);
    (doc, outcome.stop)
}

#[test]
fn an_onnx_plan_document_is_the_json_it_was() {
    let request = cli_request(
        "fixtures/grad/tiny_cnn.onnx",
        &[("batch", 2)],
        Some("0.9x"),
        "chen-sqrt",
    );
    let (doc, stop) = plan_json("fixtures/grad/tiny_cnn.onnx", &request);
    assert_eq!(stop, Stop::Planned);
    check_golden(&doc, "tiny_cnn.plan.json");
}

#[test]
fn an_infeasible_plan_document_is_the_json_it_was() {
    let request = cli_request(
        "fixtures/grad/tiny_cnn.onnx",
        &[("batch", 2)],
        Some("1"),
        "auto",
    );
    let (doc, stop) = plan_json("fixtures/grad/tiny_cnn.onnx", &request);
    assert!(
        matches!(
            stop,
            Stop::Infeasible {
                budget_bytes: 1,
                ..
            }
        ),
        "{stop:?}"
    );
    check_golden(&doc, "tiny_cnn.infeasible.json");
}

#[test]
fn a_node_link_plan_document_is_the_json_it_was() {
    let file = "server/tests/it/golden/chain.json";
    let request = cli_request(file, &[], Some("0.7x"), "dp");
    let (doc, _) = plan_json(file, &request);
    check_golden(&doc, "chain.plan.json");
}

#[test]
fn a_sweep_document_is_the_json_it_was() {
    let file = "server/tests/it/golden/chain.json";
    let bytes = std::fs::read(root().join(file)).unwrap();
    let request = PlanRequest {
        time_limit: Some(10.0),
        fractions: vec![1.0, 0.8, 0.6, 0.4],
        ..cli_request(file, &[], None, "dp")
    };
    let loaded = load(&bytes, ModelFormat::detect(&bytes), &request).unwrap();
    let doc = sweep_document(&loaded, &request, default_threads(), &Default::default()).unwrap();
    check_golden(&serde_json::to_value(&doc).unwrap(), "chain.sweep.json");
}

#[test]
fn a_run_plan_documents_the_executors_report_as_it_is() {
    let request = PlanRequest {
        validate: Some(true),
        ..cli_request(
            "fixtures/grad/tiny_cnn.onnx",
            &[("batch", 2)],
            Some("0.95x"),
            "auto",
        )
    };
    let bytes = std::fs::read(root().join("fixtures/grad/tiny_cnn.onnx")).unwrap();
    let outcome = PlanJob::new(&bytes, &request).run().unwrap();
    assert_eq!(outcome.stop, Stop::Validated { ok: true });
    let ValidationReport::Ran(v) = &outcome.document.validation else {
        panic!("not run: {:?}", outcome.document.validation);
    };
    let doc = serde_json::to_value(&outcome.document).unwrap();
    // What the builder inserted: the executor's report, serialized as it is.
    assert_eq!(doc["validation"], serde_json::to_value(&**v).unwrap());
    assert_eq!(doc["validation"]["ran"], true);
}

/// The properties of a schema: its own, those of its `allOf` parts and of what it refers to.
fn properties(doc: &Value, schema: &Value, out: &mut Vec<String>) {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.trim_start_matches("#/components/schemas/");
        properties(doc, &doc["components"]["schemas"][name], out);
    }
    if let Some(props) = schema["properties"].as_object() {
        out.extend(props.keys().cloned());
    }
    for key in ["allOf", "oneOf", "anyOf"] {
        for part in schema[key].as_array().into_iter().flatten() {
            properties(doc, part, out);
        }
    }
}

fn schema_fields(doc: &Value, schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    properties(doc, schema, &mut out);
    out
}

fn assert_names(fields: &[String], want: &[&str], what: &str) {
    for name in want {
        assert!(
            fields.iter().any(|f| f == name),
            "{what} lacks `{name}`: {fields:?}"
        );
    }
}

#[test]
fn the_openapi_document_describes_the_plan_and_sweep_documents() {
    let doc: Value = serde_json::from_str(remat_server::http::openapi::document()).unwrap();
    let record = &doc["components"]["schemas"]["PlanRecord"]["properties"];
    let plan = schema_fields(&doc, &record["plan"]);
    assert_names(
        &plan,
        &[
            "status",
            "solver",
            "budget_bytes",
            "store_all_peak_bytes",
            "store_all_cost",
            "min_feasible_budget_bytes",
            "predicted",
            "lower_bound",
            "gap",
            "solve_seconds",
            "bound_seconds",
            "baselines",
            "schedule",
            "decisions",
            "graph",
            "validation",
            "model",
            "cost_model",
        ],
        "the plan document",
    );
    let schemas = &doc["components"]["schemas"];
    let field = |schema: &str, name: &str| {
        let s = &schemas[schema];
        let mut parts = vec![s.clone()];
        parts.extend(s["allOf"].as_array().cloned().unwrap_or_default());
        parts
            .iter()
            .find_map(|p| p["properties"].get(name).cloned())
            .unwrap_or_else(|| panic!("{schema}.{name} missing: {s}"))
    };
    assert_names(
        &schema_fields(&doc, &field("PlanReport", "predicted")),
        &["peak_bytes", "compute_cost", "overhead", "memory"],
        "predicted",
    );
    assert_names(
        &schema_fields(&doc, &field("PlanDocument", "decisions")["items"]),
        &["node", "kind", "bytes", "computes", "decision", "reason"],
        "a decision",
    );
    assert_names(
        &schema_fields(&doc, &field("PlanDocument", "validation")),
        &[
            "ran",
            "ok",
            "reason",
            "measured_peak_bytes",
            "heap_peak_bytes",
            "timeline",
        ],
        "validation",
    );
    assert_names(
        &schema_fields(&doc, &field("PlanDocument", "model")),
        &[
            "producer",
            "ops",
            "training_nodes",
            "saved_activation_bytes",
        ],
        "the inspect report",
    );
    let sweep = schema_fields(&doc, &record["sweep"]);
    assert_names(
        &sweep,
        &["graph", "store_all_peak_bytes", "points"],
        "the sweep document",
    );
}
