//! API v1 through `app(...).oneshot(...)` with test engines, and on a real loopback port
//! across a restart.

use crate::common::*;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use base64::Engine as _;
use remat_server::http::Config;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// The store this copy of the suite runs on (`main.rs` includes it once per store).
fn store() -> StoreKind {
    store_of(module_path!())
}

async fn test_app() -> TestApp {
    test_app_on(store(), test_config()).await
}

async fn test_app_with(config: Config) -> TestApp {
    test_app_on(store(), config).await
}

fn graph(behave: &str) -> Value {
    json!({"directed": true, "nodes": [{"id": 0}], "links": [], "behave": behave})
}

#[tokio::test]
async fn a_plan_is_handed_the_finished_plans_of_its_model_and_no_others() {
    let t = test_app().await;
    let first = t.post_json("/v1/plans?budget=0.6x", &graph("ok")).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text);
    let first = first.json();
    assert_eq!(first["status"], "done");
    assert_eq!(first["plan"]["earlier"], json!([]));
    let other = t
        .post_json("/v1/plans?budget=0.6x", &graph("sleep:1"))
        .await
        .json();
    assert_eq!(other["status"], "done");
    let second = t
        .post_json("/v1/plans?budget=0.7x", &graph("ok"))
        .await
        .json();
    assert_eq!(second["status"], "done");
    assert_eq!(
        second["plan"]["earlier"],
        json!([{
            "id": first["id"],
            "budget": "0.6x",
            "summary": first["summary"],
            "document": true,
        }]),
        "the store's plans of this model, the job itself left out"
    );
    // A sweep is no plan, and a deleted plan is gone.
    let sweep = t.post_json("/v1/sweeps", &graph("ok")).await;
    assert_eq!(sweep.status, StatusCode::CREATED, "{}", sweep.text);
    let id = first["id"].as_str().unwrap();
    assert_eq!(
        t.delete(&format!("/v1/plans/{id}")).await.status,
        StatusCode::NO_CONTENT
    );
    let third = t
        .post_json("/v1/plans?budget=0.8x", &graph("ok"))
        .await
        .json();
    assert_eq!(
        third["plan"]["earlier"],
        json!([{
            "id": second["id"],
            "budget": "0.7x",
            "summary": second["summary"],
            "document": true,
        }])
    );
}

#[tokio::test]
async fn post_graph_json_plans_and_get_returns_it() {
    let t = test_app().await;
    let r = t
        .post_json("/v1/plans?budget=0.6x&dim=batch=2&name=tiny", &graph("ok"))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let v = r.json();
    let id = v["id"].as_str().unwrap().to_string();
    assert_eq!(
        r.header("location").as_deref(),
        Some(format!("/v1/plans/{id}").as_str())
    );
    assert_eq!(v["status"], "done");
    assert_eq!(v["kind"], "plan");
    assert_eq!(v["model"]["format"], "graph_json");
    assert_eq!(v["model"]["name"], "tiny");
    assert_eq!(v["model"]["hash"].as_str().unwrap().len(), 64);
    assert!(v["created_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(v["options"]["budget"], "0.6x");
    assert_eq!(v["options"]["dims"]["batch"], 2);
    assert_eq!(v["plan"]["echo"]["dims"]["batch"], 2);
    assert_eq!(v["summary"]["overhead"], 0.25);

    let g = t.get(&format!("/v1/plans/{id}")).await;
    assert_eq!(g.status, StatusCode::OK);
    assert_eq!(g.json(), v);
}

#[tokio::test]
async fn same_model_and_options_answer_the_stored_plan() {
    let t = test_app().await;
    let first = t
        .post_json("/v1/plans?budget=1GiB&name=a", &graph("ok"))
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    // Same graph, keys in another order, another display name: the same plan.
    let reordered = json!({"behave": "ok", "links": [], "nodes": [{"id": 0}], "directed": true});
    let second = t
        .post_json("/v1/plans?budget=1GiB&name=b", &reordered)
        .await;
    assert_eq!(second.status, StatusCode::OK, "{}", second.text);
    assert_eq!(second.json()["id"], first.json()["id"]);
    assert_eq!(t.engine.calls.load(Ordering::SeqCst), 1);

    let other_budget = t.post_json("/v1/plans?budget=2GiB", &graph("ok")).await;
    assert_eq!(other_budget.status, StatusCode::CREATED);
    let refreshed = t
        .post_json("/v1/plans?budget=1GiB&refresh=true", &graph("ok"))
        .await;
    assert_eq!(refreshed.status, StatusCode::CREATED);
    assert_ne!(refreshed.json()["id"], first.json()["id"]);
    assert_eq!(t.engine.calls.load(Ordering::SeqCst), 3);
}

/// `expect_model` refuses any other model before a job is made: a JSON graph's hash is of its
/// canonical text, which a client cannot compute, so the check is the service's.
#[tokio::test]
async fn expect_model_refuses_another_model_before_any_job() {
    let t = test_app().await;
    let first = t.post_json("/v1/plans?budget=1GiB", &graph("ok")).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text);
    let hash = first.json()["model"]["hash"]
        .as_str()
        .expect("hash")
        .to_string();
    let calls = t.engine.calls.load(Ordering::SeqCst);
    // Another graph, in the query and in the envelope, for a plan and a sweep.
    let other = graph("sleep:1");
    for r in [
        t.post_json(
            &format!("/v1/plans?budget=1GiB&expect_model={hash}"),
            &other,
        )
        .await,
        t.post_json(&format!("/v1/sweeps?expect_model={hash}"), &other)
            .await,
        t.post_json(
            "/v1/sweeps",
            &json!({"model": other, "options": {"expect_model": hash}}),
        )
        .await,
    ] {
        assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
        let e = r.error();
        assert_eq!(e["code"], "model_mismatch");
        assert_eq!(e["details"]["expected"], hash.as_str());
        assert_ne!(e["details"]["got"], hash.as_str());
    }
    assert_eq!(t.engine.calls.load(Ordering::SeqCst), calls, "no job ran");
    // The same graph with its keys in another order, the hash in capitals: accepted.
    let reordered = json!({"behave": "ok", "links": [], "nodes": [{"id": 0}], "directed": true});
    let upper = hash.to_ascii_uppercase();
    let r = t
        .post_json(&format!("/v1/sweeps?expect_model={upper}"), &reordered)
        .await;
    assert!(r.status.is_success(), "{}", r.text);
    // Not a hash: 400 naming the option.
    let r = t
        .post_json("/v1/plans?budget=1GiB&expect_model=abc", &graph("ok"))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(r.error()["message"]
        .as_str()
        .is_some_and(|m| m.contains("expect_model \"abc\"")));
}

#[tokio::test]
async fn envelopes_carry_graphs_or_base64_onnx_and_the_query_wins() {
    let t = test_app().await;
    let envelope = json!({
        "model": graph("ok"),
        "options": {"budget": 4096, "dims": {"batch": 8, "seq": 16}, "solver": "dp", "params": ["w"]}
    });
    let r = t.post_json("/v1/plans?dim=batch=4", &envelope).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let echo = &r.json()["plan"]["echo"];
    assert_eq!(echo["budget"], "4096");
    assert_eq!(echo["dims"], json!({"batch": 4, "seq": 16}));
    assert_eq!(echo["solver"], "dp");
    assert_eq!(echo["params"], json!(["w"]));

    let onnx = base64::engine::general_purpose::STANDARD.encode(b"ONNX fake bytes");
    let r = t
        .post_json(
            "/v1/plans",
            &json!({"model": onnx, "options": {"budget": "0.5x"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.json()["model"]["format"], "onnx");

    // The same ONNX bytes posted raw are the same model.
    let raw = t
        .post_bytes(
            "/v1/plans?budget=0.5x",
            "application/octet-stream",
            b"ONNX fake bytes".to_vec(),
        )
        .await;
    assert_eq!(raw.status, StatusCode::OK, "{}", raw.text);
    assert_eq!(raw.json()["id"], r.json()["id"]);

    // `freeze`, as the query, the CLI and the gate name it, is the envelope's `frozen` (it was
    // "unknown field `freeze`").
    for key in ["freeze", "frozen"] {
        let r = t
            .post_json(
                "/v1/plans",
                &json!({"model": graph("ok"), "options": {"budget": "0.5x", key: ["w*"]}}),
            )
            .await;
        assert!(r.status.is_success(), "{key}: {}", r.text);
        assert_eq!(r.json()["plan"]["echo"]["frozen"], json!(["w*"]), "{key}");
    }
}

#[tokio::test]
async fn wait_zero_answers_202_and_the_job_finishes() {
    let t = test_app().await;
    let r = t.post_json("/v1/plans?wait=0", &graph("sleep:100")).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    let v = r.json();
    let id = v["id"].as_str().unwrap();
    assert!(["queued", "solving"].contains(&v["status"].as_str().unwrap()));
    let location = r.header("location").unwrap();
    assert_eq!(location, format!("/v1/plans/{id}"));
    let done = t.wait_done(&location).await;
    assert_eq!(done["status"], "done");
    // Posting it again while done: the stored plan.
    let again = t.post_json("/v1/plans?wait=0", &graph("sleep:100")).await;
    assert_eq!(again.status, StatusCode::OK);
}

#[tokio::test]
async fn a_validating_job_reports_the_phase_and_records_histograms() {
    let t = test_app().await;
    let r = t.post_json("/v1/plans", &graph("validate")).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let m = t.get("/metrics").await.text;
    assert!(m.contains("remat_validation_seconds_count 1"), "{m}");
    // The embedded store answers: up, as /healthz says.
    assert!(m.contains("remat_database_up 1"), "{m}");
    assert!(
        m.contains("remat_solve_seconds_count{kind=\"plan\"} 1"),
        "{m}"
    );
}

#[tokio::test]
async fn a_full_queue_answers_503_with_retry_after() {
    let t = test_app_with(Config {
        workers: 1,
        queue: 1,
        ..Config::default()
    })
    .await;
    let running = t
        .post_json("/v1/plans?wait=0&budget=1", &graph("gate"))
        .await;
    assert_eq!(running.status, StatusCode::ACCEPTED);
    // Let the worker take the first job so that the queue holds exactly the second.
    let first = running.header("location").unwrap();
    for _ in 0..200 {
        if t.get(&first).await.json()["status"] == "solving" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let queued = t
        .post_json("/v1/plans?wait=0&budget=2", &graph("gate"))
        .await;
    assert_eq!(queued.status, StatusCode::ACCEPTED);
    assert_eq!(queued.json()["status"], "queued");
    let rejected = t
        .post_json("/v1/plans?wait=0&budget=3", &graph("gate"))
        .await;
    assert_eq!(
        rejected.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        rejected.text
    );
    assert_eq!(rejected.error()["code"], "queue_full");
    assert_eq!(rejected.header("retry-after").as_deref(), Some("5"));
    let m = t.get("/metrics").await.text;
    assert!(m.contains("remat_job_queue_depth 1"), "{m}");

    t.engine.gate.open();
    assert_eq!(t.wait_done(&first).await["status"], "done");
    assert_eq!(
        t.wait_done(&queued.header("location").unwrap()).await["status"],
        "done"
    );
    // The rejected job left nothing behind.
    assert_eq!(
        t.get("/v1/plans").await.json()["plans"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

/// Polls `/metrics` until it holds `line` (ten seconds at most).
async fn metrics_reach(t: &TestApp, line: &str) -> String {
    for _ in 0..1000 {
        let m = t.get("/metrics").await.text;
        if m.lines().any(|l| l == line) {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "/metrics never showed {line:?}:\n{}",
        t.get("/metrics").await.text
    );
}

#[tokio::test]
async fn deleting_a_running_job_stops_it() {
    let t = test_app().await;
    let r = t
        .post_json("/v1/plans?wait=0&budget=1", &graph("until_cancelled"))
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    let job = r.header("location").unwrap();
    let mut status = Value::Null;
    for _ in 0..1000 {
        status = t.get(&job).await.json()["status"].clone();
        if status == "solving" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(status, "solving");
    assert_eq!(t.delete(&job).await.status, StatusCode::NO_CONTENT);
    // The engine sees its cancel flag and the worker is free again, long before the minute
    // the engine would otherwise run (it would end `not_cancelled`, counted as failed).
    let m = metrics_reach(
        &t,
        "remat_jobs_total{kind=\"plan\",outcome=\"cancelled\"} 1",
    )
    .await;
    assert!(m.contains("remat_jobs_running 0"), "{m}");
    assert_eq!(t.get(&job).await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_job_deleted_while_queued_never_runs() {
    let t = test_app_with(Config {
        workers: 1,
        ..test_config()
    })
    .await;
    let first = t
        .post_json("/v1/plans?wait=0&budget=1", &graph("gate"))
        .await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.text);
    let first = first.header("location").unwrap();
    for _ in 0..1000 {
        if t.get(&first).await.json()["status"] == "solving" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let queued = t.post_json("/v1/plans?wait=0&budget=2", &graph("ok")).await;
    assert_eq!(queued.json()["status"], "queued", "{}", queued.text);
    let queued = queued.header("location").unwrap();
    assert_eq!(t.delete(&queued).await.status, StatusCode::NO_CONTENT);
    t.engine.gate.open();
    assert_eq!(t.wait_done(&first).await["status"], "done");
    // The embedded queue's worker takes the deleted job and skips it; the shared queue's
    // record is gone, and no worker claims it.
    if store() == StoreKind::Sqlite {
        metrics_reach(
            &t,
            "remat_jobs_total{kind=\"plan\",outcome=\"cancelled\"} 1",
        )
        .await;
    }
    metrics_reach(&t, "remat_job_queue_depth 0").await;
    metrics_reach(&t, "remat_jobs_running 0").await;
    assert_eq!(
        t.engine.calls.load(Ordering::SeqCst),
        1,
        "the deleted job ran"
    );
}

#[tokio::test]
async fn engine_errors_map_to_statuses_and_are_stored() {
    let t = test_app().await;
    // (behaviour, status, code, a JSON pointer into the error, what it must hold)
    let cases = [
        (
            "bad_input",
            StatusCode::BAD_REQUEST,
            "invalid_option",
            "/details",
            Value::Null,
        ),
        (
            "unsupported_ops",
            StatusCode::UNPROCESSABLE_ENTITY,
            "unsupported_ops",
            "/details/nodes/1/op",
            json!("Bar"),
        ),
        (
            "unbound_dims",
            StatusCode::UNPROCESSABLE_ENTITY,
            "unbound_dims",
            "/details/dims/1",
            json!("seq"),
        ),
        (
            "infeasible",
            StatusCode::UNPROCESSABLE_ENTITY,
            "infeasible_budget",
            "/details/min_feasible_budget",
            json!(4096),
        ),
    ];
    for (behave, status, code, pointer, want) in cases {
        let r = t.post_json("/v1/plans", &graph(behave)).await;
        assert_eq!(r.status, status, "{behave}: {}", r.text);
        let e = r.error();
        assert_eq!(e["code"], code, "{behave}");
        assert_eq!(e.pointer(pointer), Some(&want), "{behave}: {}", r.text);
        let id = r.json()["id"].as_str().unwrap().to_string();
        let stored = t.get(&format!("/v1/plans/{id}")).await;
        assert_eq!(stored.status, StatusCode::OK);
        assert_eq!(stored.json()["status"], "failed");
        assert_eq!(stored.json()["error"], e);
    }
    let unsupported = t
        .post_json("/v1/plans", &graph("unsupported_ops"))
        .await
        .error();
    assert!(unsupported["message"]
        .as_str()
        .unwrap()
        .contains("node /a (op Foo)"));

    let malformed = t
        .post_bytes(
            "/v1/plans",
            "application/octet-stream",
            b"\x07garbage".to_vec(),
        )
        .await;
    assert_eq!(malformed.status, StatusCode::BAD_REQUEST);
    assert_eq!(malformed.error()["code"], "malformed_model");
    assert!(malformed.error()["message"]
        .as_str()
        .unwrap()
        .contains("ir_version"));
}

#[tokio::test]
async fn internal_errors_and_panics_are_500_without_internals_and_the_server_stays_up() {
    let t = test_app().await;
    for behave in ["internal", "panic"] {
        let r = t.post_json("/v1/plans", &graph(behave)).await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{behave}");
        let e = r.error();
        assert_eq!(e["code"], "internal");
        assert!(!r.text.contains("secret"), "{}", r.text);
        assert!(!r.text.contains("panics on purpose"), "{}", r.text);
        let id = r.json()["id"].as_str().unwrap().to_string();
        assert_eq!(
            t.get(&format!("/v1/plans/{id}")).await.json()["status"],
            "failed"
        );
    }
    // Failed plans are not served from the cache: posting again plans again.
    let again = t.post_json("/v1/plans", &graph("panic")).await;
    assert_eq!(again.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(t.engine.calls.load(Ordering::SeqCst), 3);
    // Both workers survived.
    for budget in ["1", "2", "3"] {
        let ok = t
            .post_json(&format!("/v1/plans?budget={budget}"), &graph("ok"))
            .await;
        assert_eq!(ok.status, StatusCode::CREATED);
    }
    assert_eq!(t.get("/healthz").await.status, StatusCode::OK);
}

#[tokio::test]
async fn unknown_ids_are_404_and_delete_removes() {
    let t = test_app().await;
    for uri in ["/v1/plans/nope", "/v1/sweeps/nope"] {
        let r = t.get(uri).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND);
        assert_eq!(r.error()["code"], "not_found");
        assert!(r.error()["message"].as_str().unwrap().contains("nope"));
        assert_eq!(t.delete(uri).await.status, StatusCode::NOT_FOUND);
    }
    let r = t.post_json("/v1/plans", &graph("ok")).await;
    let uri = r.header("location").unwrap();
    // Read it twice (the second read comes from the rendered-response cache), then delete it:
    // the cache must not keep serving it.
    let first = t.get(&uri).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(t.get(&uri).await.text, first.text);
    let d = t.delete(&uri).await;
    assert_eq!(d.status, StatusCode::NO_CONTENT);
    assert!(d.text.is_empty());
    assert_eq!(t.get(&uri).await.status, StatusCode::NOT_FOUND);
    assert_eq!(t.delete(&uri).await.status, StatusCode::NOT_FOUND);
}

/// A budget that is no budget, a solver remat does not have or a zero dim is refused before
/// any job is made: no id in the answer, nothing in the model's history.
#[tokio::test]
async fn invalid_options_are_refused_before_any_job() {
    let t = test_app().await;
    for (query, named) in [
        ("budget=lots", "budget \"lots\""),
        ("budget=0.5x&solver=magic", "solver"),
        ("budget=0.5x&dim=batch=0", "dim batch=0"),
    ] {
        let r = t
            .post_json(&format!("/v1/plans?{query}"), &graph("ok"))
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{query}: {}", r.text);
        let e = r.error();
        assert_eq!(e["code"], "invalid_option", "{query}: {e}");
        assert!(
            e["message"].as_str().unwrap().contains(named),
            "{query}: {e}"
        );
        assert!(r.json().get("id").is_none(), "{query}: {}", r.text);
    }
    let ok = t.post_json("/v1/plans?budget=0.5x", &graph("ok")).await;
    assert_eq!(ok.status, StatusCode::CREATED, "{}", ok.text);
    let hash = ok.json()["model"]["hash"].as_str().unwrap().to_string();
    let h = t.get(&format!("/v1/models/{hash}/history")).await.json();
    let entries = h["plans"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{h}");
    assert_eq!(entries[0]["status"], "done", "{h}");
}

/// A display name with a NUL byte or another control character is refused, naming the field,
/// on both stores (PostgreSQL's TEXT cannot hold a NUL: it answered 500, SQLite 201).
#[tokio::test]
async fn a_name_with_a_control_character_is_refused() {
    let t = test_app().await;
    for query in ["name=a%00b", "name=a%1Bb", "name=a%0Ab"] {
        let r = t
            .post_json(&format!("/v1/plans?budget=0.5x&{query}"), &graph("ok"))
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{query}: {}", r.text);
        let e = r.error();
        assert_eq!(e["code"], "invalid_option", "{query}: {e}");
        assert!(e["message"].as_str().unwrap().starts_with("name"), "{e}");
    }
    let r = t
        .post_json(
            "/v1/plans",
            &json!({"model": graph("ok"), "options": {"budget": "0.5x", "name": "x\u{0}y"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert_eq!(r.error()["code"], "invalid_option", "{}", r.text);
    let ok = t
        .post_json("/v1/plans?budget=0.5x&name=caf%C3%A9%20v2", &graph("ok"))
        .await;
    assert_eq!(ok.status, StatusCode::CREATED, "{}", ok.text);
    assert_eq!(ok.json()["model"]["name"], "café v2");
}

/// Budgets of one value written two ways are one job; `timing_rounds` without `validate` is
/// refused, as it would be ignored.
#[tokio::test]
async fn one_budget_written_two_ways_is_one_job() {
    let t = test_app().await;
    let a = t.post_json("/v1/plans?budget=0.9x", &graph("ok")).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text);
    let b = t.post_json("/v1/plans?budget=0.90x", &graph("ok")).await;
    assert_eq!(b.status, StatusCode::OK, "{}", b.text);
    assert_eq!(a.json()["id"], b.json()["id"]);
    let c = t.post_json("/v1/plans?budget=1KiB", &graph("ok")).await;
    let d = t.post_json("/v1/plans?budget=1024", &graph("ok")).await;
    assert_eq!(d.status, StatusCode::OK, "{}", d.text);
    assert_eq!(c.json()["id"], d.json()["id"]);
    let r = t
        .post_json("/v1/plans?budget=0.9x&timing_rounds=3", &graph("ok"))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(
        r.error()["message"]
            .as_str()
            .unwrap()
            .starts_with("timing_rounds does not apply without validate=true"),
        "{}",
        r.text
    );
}

#[tokio::test]
async fn list_and_history_of_a_model() {
    let t = test_app().await;
    let a1 = t
        .post_json("/v1/plans?budget=1000", &graph("ok"))
        .await
        .json();
    let a2 = t
        .post_json("/v1/plans?budget=2000", &graph("ok"))
        .await
        .json();
    let b = t
        .post_json("/v1/plans", &json!({"nodes": [], "other": 1}))
        .await
        .json();
    let hash = a1["model"]["hash"].as_str().unwrap();
    assert_eq!(a2["model"]["hash"], hash);
    assert_ne!(b["model"]["hash"], hash);

    let all = t.get("/v1/plans").await.json();
    let ids: Vec<&str> = all["plans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            b["id"].as_str().unwrap(),
            a2["id"].as_str().unwrap(),
            a1["id"].as_str().unwrap()
        ]
    );
    assert!(
        all["plans"][0].get("plan").is_none(),
        "lists carry summaries only"
    );

    let mine = t.get(&format!("/v1/plans?model={hash}")).await.json();
    assert_eq!(mine["plans"].as_array().unwrap().len(), 2);
    assert_eq!(mine["plans"][0]["id"], a2["id"]);
    assert_eq!(
        t.get("/v1/plans?limit=1").await.json()["plans"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let bad = t.get("/v1/plans?colour=red").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.error()["message"].as_str().unwrap().contains("colour"));
    assert_eq!(
        t.get("/v1/plans?limit=many").await.status,
        StatusCode::BAD_REQUEST
    );

    let h = t.get(&format!("/v1/models/{hash}/history")).await;
    assert_eq!(h.status, StatusCode::OK);
    let h = h.json();
    assert_eq!(h["model"], hash);
    let entries = h["plans"].as_array().unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0]["id"], a1["id"]);
    assert_eq!(entries[0]["budget"], "1000");
    assert_eq!(entries[1]["budget"], "2000");
    assert_eq!(entries[1]["status"], "done");
    assert_eq!(entries[1]["summary"]["overhead"], 0.25);
    assert!(entries[1]["created_at"].is_string());
    let none = t.get("/v1/models/0000/history").await;
    assert_eq!(none.status, StatusCode::NOT_FOUND);
    none.error();
    // It takes no parameter: a `limit` would be ignored, so it is refused, naming it.
    let limited = t.get(&format!("/v1/models/{hash}/history?limit=1")).await;
    assert_eq!(limited.status, StatusCode::BAD_REQUEST, "{}", limited.text);
    assert!(limited.text.contains("`limit`"), "{}", limited.text);
}

#[tokio::test]
async fn sweeps_are_jobs_of_their_own() {
    let t = test_app().await;
    let r = t
        .post_json("/v1/sweeps?fraction=0.5&fraction=1", &graph("ok"))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let v = r.json();
    assert_eq!(v["kind"], "sweep");
    assert_eq!(v["sweep"]["frontier"][0]["fraction"], 0.5);
    assert!(v.get("plan").is_none());
    let uri = r.header("location").unwrap();
    assert!(uri.starts_with("/v1/sweeps/"));
    assert_eq!(t.get(&uri).await.json(), v);
    let id = v["id"].as_str().unwrap();
    assert_eq!(
        t.get(&format!("/v1/plans/{id}")).await.status,
        StatusCode::NOT_FOUND
    );
    // Fractions count for sweeps: other fractions, another sweep; the same, the stored one.
    assert_eq!(
        t.post_json("/v1/sweeps?fraction=0.5", &graph("ok"))
            .await
            .status,
        StatusCode::CREATED
    );
    assert_eq!(
        t.post_json("/v1/sweeps?fraction=0.5&fraction=1", &graph("ok"))
            .await
            .status,
        StatusCode::OK
    );
    let failed = t.post_json("/v1/sweeps", &graph("unbound_dims")).await;
    assert_eq!(failed.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(t.delete(&uri).await.status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn every_error_has_the_one_shape() {
    let t = test_app_with(Config {
        body_limit: 1024,
        ..test_config()
    })
    .await;
    let cases: Vec<(Request<Body>, StatusCode, &str, &str)> = vec![
        (
            Request::post("/v1/plans")
                .header("content-type", "application/json")
                .body(Body::from("{\"nodes\": ["))
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "line 1",
        ),
        (
            Request::post("/v1/plans")
                .header("content-type", "multipart/form-data; boundary=x")
                .body(Body::from("--x\r\n"))
                .unwrap(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "--data-binary",
        ),
        (
            Request::post("/v1/plans").body(Body::empty()).unwrap(),
            StatusCode::BAD_REQUEST,
            "empty_body",
            "no model",
        ),
        (
            Request::post("/v1/plans")
                .header("content-type", "application/json")
                .body(Body::from("[1, 2]"))
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_model",
            "an array",
        ),
        (
            Request::post("/v1/plans")
                .header("content-type", "application/json")
                .body(Body::from(r#"{"model": {}, "options": {"budgte": "1x"}}"#))
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_envelope",
            "budgte",
        ),
        (
            Request::post("/v1/plans")
                .header("content-type", "application/json")
                .body(Body::from(r#"{"model": "not base64!!"}"#))
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_model",
            "base64",
        ),
        (
            Request::post("/v1/plans")
                .header("content-type", "application/json")
                .body(Body::from(r#"{"model": {}, "options": {"budget": [1]}}"#))
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_option",
            "options.budget",
        ),
        (
            Request::post("/v1/plans?dim=batch")
                .header("content-type", "application/json")
                .body(Body::from("{}"))
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_option",
            "NAME=VALUE",
        ),
        (
            Request::post("/v1/plans?validate=true&timing_rounds=1")
                .header("content-type", "application/json")
                .body(Body::from("{}"))
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_option",
            "timing_rounds 1: expected 2 to 64",
        ),
        (
            Request::post("/v1/plans")
                .header("content-type", "application/json")
                .body(Body::from(
                    r#"{"model": {}, "options": {"timing_rounds": 65}}"#,
                ))
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_option",
            "timing_rounds 65",
        ),
        (
            Request::post("/v1/plans?budgte=1")
                .header("content-type", "application/json")
                .body(Body::from("{}"))
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_option",
            "budgte",
        ),
        (
            Request::post("/v1/plans")
                .body(Body::from(vec![b'x'; 4096]))
                .unwrap(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            "over this server's limit of 1024 bytes",
        ),
        (
            Request::get("/v1/nothing").body(Body::empty()).unwrap(),
            StatusCode::NOT_FOUND,
            "not_found",
            "/v1/nothing",
        ),
        (
            Request::post("/nothing").body(Body::empty()).unwrap(),
            StatusCode::NOT_FOUND,
            "not_found",
            "POST /nothing",
        ),
        (
            Request::delete("/healthz").body(Body::empty()).unwrap(),
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "DELETE",
        ),
        (
            Request::put("/v1/plans").body(Body::empty()).unwrap(),
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "PUT",
        ),
    ];
    for (request, status, code, needle) in cases {
        let what = format!("{} {}", request.method(), request.uri());
        let r = t.send(request).await;
        assert_eq!(r.status, status, "{what}: {}", r.text);
        let e = r.error();
        assert_eq!(e["code"], code, "{what}: {}", r.text);
        assert!(
            e["message"].as_str().unwrap().contains(needle),
            "{what}: {}",
            r.text
        );
        assert!(
            r.header("content-type")
                .unwrap()
                .starts_with("application/json"),
            "{what}"
        );
    }
    // A 413 also when the client announces the length.
    let big = Request::post("/v1/plans")
        .header("content-length", "4096")
        .body(Body::from(vec![b'x'; 4096]))
        .unwrap();
    let r = t.send(big).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(r.text.contains("limit of 1024 bytes"), "{}", r.text);
    // At once, from the announced length alone: a body that never comes is not waited for.
    let never = Request::post("/v1/plans")
        .header("content-length", "1000000000000")
        .body(Body::from_stream(futures_util::stream::pending::<
            Result<Vec<u8>, std::io::Error>,
        >()))
        .unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), t.send(never))
        .await
        .expect("answered before the body");
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn a_request_over_the_timeout_is_408() {
    let t = test_app_with(Config {
        request_timeout: Duration::from_millis(200),
        ..test_config()
    })
    .await;
    let r = t
        .send(Request::post("/v1/plans").body(Body::new(Stalled)).unwrap())
        .await;
    assert_eq!(r.status, StatusCode::REQUEST_TIMEOUT, "{}", r.text);
    assert_eq!(r.error()["code"], "request_timeout");
}

/// A request body that never finishes arriving.
struct Stalled;

impl axum::body::HttpBody for Stalled {
    type Data = axum::body::Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::task::Poll::Pending
    }
}

#[tokio::test]
async fn writes_need_the_token_when_one_is_set() {
    let t = test_app_with(Config {
        token: Some("s3cret".to_string()),
        ..test_config()
    })
    .await;
    let post = |auth: Option<&str>| {
        let mut b = Request::post("/v1/plans").header("content-type", "application/json");
        if let Some(a) = auth {
            b = b.header("authorization", a);
        }
        b.body(Body::from(graph("ok").to_string())).unwrap()
    };
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Basic s3cret"),
        Some("Bearer s3cre"),
        Some("Bearer s3cret2"),
    ] {
        let r = t.send(post(auth)).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{auth:?}");
        assert_eq!(r.error()["code"], "unauthorized");
        assert_eq!(r.header("www-authenticate").as_deref(), Some("Bearer"));
    }
    let ok = t.send(post(Some("Bearer s3cret"))).await;
    assert_eq!(ok.status, StatusCode::CREATED);
    let uri = ok.header("location").unwrap();
    // Reads are open; deletes are writes.
    assert_eq!(t.get(&uri).await.status, StatusCode::OK);
    assert_eq!(t.delete(&uri).await.status, StatusCode::UNAUTHORIZED);
    let d = t
        .send(
            Request::delete(&uri)
                .header("authorization", "bearer s3cret")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(d.status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn cors_is_off_by_default_and_on_for_the_given_origin() {
    let preflight = || {
        Request::options("/v1/plans")
            .header("origin", "https://viewer.example")
            .header("access-control-request-method", "POST")
            .body(Body::empty())
            .unwrap()
    };
    let off = test_app().await;
    let r = off.send(preflight()).await;
    assert!(r.header("access-control-allow-origin").is_none());
    let r = off
        .send(
            Request::get("/healthz")
                .header("origin", "https://viewer.example")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert!(r.header("access-control-allow-origin").is_none());

    let on = test_app_with(Config {
        cors: vec!["https://viewer.example".to_string()],
        ..test_config()
    })
    .await;
    let r = on.send(preflight()).await;
    assert_eq!(
        r.header("access-control-allow-origin").as_deref(),
        Some("https://viewer.example")
    );
    // The measured validation of a torch plan is a PUT: a browser's preflight for it passes.
    let methods = r.header("access-control-allow-methods").unwrap_or_default();
    for m in ["GET", "POST", "PUT", "DELETE"] {
        assert!(methods.contains(m), "{methods}");
    }
    let r = on
        .send(
            Request::get("/healthz")
                .header("origin", "https://evil.example")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert!(r.header("access-control-allow-origin").is_none());
}

#[tokio::test]
async fn a_large_time_limit_is_clamped_and_says_so() {
    let t = test_app_with(Config {
        max_time_limit: 300.0,
        ..test_config()
    })
    .await;
    let r = t.post_json("/v1/plans?time_limit=1000", &graph("ok")).await;
    assert_eq!(r.status, StatusCode::CREATED);
    let v = r.json();
    assert_eq!(v["plan"]["echo"]["time_limit"], 300.0);
    assert_eq!(v["options"]["time_limit"], 300.0);
    assert_eq!(v["options"]["clamped"]["time_limit"]["requested"], 1000.0);
    let small = t
        .post_json("/v1/plans?time_limit=5", &graph("ok"))
        .await
        .json();
    assert_eq!(small["plan"]["echo"]["time_limit"], 5.0);
    assert!(small["options"].get("clamped").is_none());
}

#[tokio::test]
async fn bound_time_reaches_the_engine_clamped_and_checked() {
    let t = test_app_with(Config {
        max_time_limit: 300.0,
        ..test_config()
    })
    .await;
    let v = t
        .post_json("/v1/plans?bound_time=20", &graph("ok"))
        .await
        .json();
    assert_eq!(v["plan"]["echo"]["bound_time"], 20.0);
    let body = json!({"model": graph("ok"), "options": {"bound_time": 1000}});
    let r = t.post_json("/v1/plans", &body).await;
    assert_eq!(r.status, StatusCode::CREATED);
    let v = r.json();
    assert_eq!(v["plan"]["echo"]["bound_time"], 300.0);
    assert_eq!(v["options"]["clamped"]["bound_time"]["requested"], 1000.0);
    assert!(v["options"]["clamped"].get("time_limit").is_none());
    let bad = t.post_json("/v1/plans?bound_time=-1", &graph("ok")).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let e = bad.error();
    assert!(
        e["message"].as_str().unwrap().contains("bound_time -1"),
        "{e}"
    );
}

#[tokio::test]
async fn static_files_do_not_escape_the_embedded_set() {
    let t = test_app().await;
    let index = t.get("/").await;
    assert_eq!(index.status, StatusCode::OK);
    assert!(index
        .header("content-type")
        .unwrap()
        .starts_with("text/html"));
    assert!(
        index.text.to_ascii_lowercase().contains("<html"),
        "{}",
        index.text
    );
    for uri in [
        "/../Cargo.toml",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/..%2fCargo.toml",
        "/src/main.rs",
        "/.git/config",
    ] {
        let r = t.get(uri).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{uri}");
        assert!(
            !r.text.contains("[package]") && !r.text.contains("root:"),
            "{uri}"
        );
        r.error();
    }
    // The viewer's pages take GET and HEAD: another method is 405 with `Allow`, not 404.
    for method in ["PUT", "OPTIONS", "DELETE"] {
        let r = t
            .send(
                Request::builder()
                    .method(method)
                    .uri("/")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await;
        assert_eq!(
            r.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method}: {}",
            r.text
        );
        assert_eq!(r.header("allow").as_deref(), Some("GET,HEAD"), "{method}");
        r.error();
    }
}

#[tokio::test]
async fn health_metrics_and_openapi() {
    let t = test_app().await;
    let h = t.get("/healthz").await;
    assert_eq!(h.status, StatusCode::OK);
    assert_eq!(h.json()["status"], "ok");
    assert_eq!(h.json()["workers"], 2);

    t.post_json("/v1/plans", &graph("ok")).await;
    t.get("/v1/plans/unknown").await;
    let m = t.get("/metrics").await;
    assert_eq!(m.status, StatusCode::OK);
    assert!(m.header("content-type").unwrap().starts_with("text/plain"));
    for needle in [
        "remat_http_requests_total{method=\"POST\",route=\"/v1/plans\",status=\"201\"} 1",
        "remat_http_requests_total{method=\"GET\",route=\"/v1/plans/{id}\",status=\"404\"} 1",
        "remat_job_queue_depth 0",
        "remat_jobs_running 0",
        "remat_solve_seconds_bucket{kind=\"plan\",le=\"+Inf\"} 1",
        "remat_jobs_total{kind=\"plan\",outcome=\"done\"} 1",
        "remat_http_request_seconds_bucket",
    ] {
        assert!(m.text.contains(needle), "missing {needle} in\n{}", m.text);
    }

    let doc = t.get("/v1/openapi.json").await;
    assert_eq!(doc.status, StatusCode::OK);
    let doc = doc.json();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/v1/plans",
        "/v1/plans/{id}",
        "/v1/sweeps",
        "/v1/sweeps/{id}",
        "/v1/models/{hash}/history",
        "/healthz",
        "/metrics",
        "/v1/openapi.json",
    ] {
        assert!(paths.contains_key(p), "{p}");
    }
    let post_params = |path: &str| -> Vec<String> {
        doc["paths"][path]["post"]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap().to_string())
            .collect()
    };
    let params = post_params("/v1/plans");
    let params: Vec<&str> = params.iter().map(String::as_str).collect();
    for name in [
        "budget",
        "dim",
        "solver",
        "time_limit",
        "bound_time",
        "validate",
        "name",
        "wait",
        "refresh",
        "param",
        "input",
    ] {
        assert!(params.contains(&name), "{name} in {params:?}");
    }
    assert!(!params.contains(&"fraction"), "{params:?}");
    // A sweep lists what it takes, not the plan's options it refuses with 400.
    let sweep = post_params("/v1/sweeps");
    let sweep: Vec<&str> = sweep.iter().map(String::as_str).collect();
    assert!(
        sweep.contains(&"fraction") && sweep.contains(&"dim"),
        "{sweep:?}"
    );
    for name in [
        "budget",
        "validate",
        "maximize",
        "max_overhead",
        "timing_rounds",
    ] {
        assert!(!sweep.contains(&name), "{name} in {sweep:?}");
    }
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_posts_arriving_together_make_one_job() {
    let t = Arc::new(test_app().await);
    let posts: Vec<_> = (0..8)
        .map(|_| {
            let t = Arc::clone(&t);
            tokio::spawn(
                async move { t.post_json("/v1/plans?budget=7", &graph("sleep:200")).await },
            )
        })
        .collect();
    let mut ids = Vec::new();
    for p in posts {
        let r = p.await.unwrap();
        assert!(
            r.status == StatusCode::CREATED || r.status == StatusCode::OK,
            "{}",
            r.text
        );
        ids.push(r.json()["id"].as_str().unwrap().to_string());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(t.engine.calls.load(Ordering::SeqCst), 1);
}

/// A dim given twice with two values is refused, naming both (which one was meant is not the
/// service's to guess); twice with one value is that value.
#[tokio::test]
async fn a_dim_given_twice_with_two_values_is_refused() {
    let t = test_app().await;
    let r = t
        .post_json("/v1/plans?dim=batch=2&dim=batch=3", &graph("ok"))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(
        r.text.contains("dim batch is given twice, as 2 and 3"),
        "{}",
        r.text
    );
    let r = t
        .post_json("/v1/plans?dim=batch=2&dim=batch=2", &graph("ok"))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    // A value past u64 is said to be too large, not "not an integer" (the viewer sends the
    // digits typed).
    let r = t
        .post_json("/v1/plans?dim=batch=18446744073709551616", &graph("ok"))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(
        r.text.contains("is over the largest a dim may be"),
        "{}",
        r.text
    );
    let r = t.post_json("/v1/plans?dim=batch=-1", &graph("ok")).await;
    assert!(
        r.text.contains("is not a non-negative integer"),
        "{}",
        r.text
    );
}
