//! The API over the real engine (`Pipeline`): a Checkmate training graph from
//! `../shared/bench/graphs` and an ONNX fixture from `fixtures/models`, and the errors a client
//! can act on as the pipeline reports them.

use crate::common::{Reply, TestApp};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use remat_server::http::{app, AppState, Config, Store};
use remat_server::pipeline::Pipeline;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;

struct Real {
    router: axum::Router,
}

fn real_app() -> Real {
    let store = Store::in_memory().unwrap();
    let config = Config {
        workers: 2,
        ..Config::default()
    };
    let state = AppState::new(Arc::new(Pipeline::new()), store, config).unwrap();
    Real { router: app(state) }
}

impl Real {
    async fn send(&self, request: Request<Body>) -> Reply {
        // The helpers of `TestApp` work on any router.
        TestApp::send_to(&self.router, request).await
    }

    async fn get(&self, uri: &str) -> Reply {
        self.send(Request::get(uri).body(Body::empty()).unwrap())
            .await
    }

    async fn delete(&self, uri: &str) -> Reply {
        self.send(Request::delete(uri).body(Body::empty()).unwrap())
            .await
    }

    async fn put(&self, uri: &str, body: Vec<u8>) -> Reply {
        self.send(
            Request::put(uri)
                .header("content-type", "application/json")
                .body(Body::from(body))
                .unwrap(),
        )
        .await
    }

    async fn post(&self, uri: &str, content_type: &str, body: Vec<u8>) -> Reply {
        self.send(
            Request::post(uri)
                .header("content-type", content_type)
                .body(Body::from(body))
                .unwrap(),
        )
        .await
    }
}

fn root() -> PathBuf {
    crate::common::manifest_dir().join("..")
}

fn vgg16_train() -> Vec<u8> {
    let path = root().join("../shared/bench/graphs/VGG16 (MLSys)_256_(224, 224, 3)_train_nx.json");
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn resnet18() -> Vec<u8> {
    let path = root().join("fixtures/models/resnet18.legacy.onnx");
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vgg16_training_graph_plans_within_its_budget() {
    let t = real_app();
    let r = t
        .post(
            "/v1/plans?budget=0.9x&time_limit=5&wait=120&name=vgg16",
            "application/json",
            vgg16_train(),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let v = r.json();
    assert_eq!(v["status"], "done");
    assert_eq!(v["model"]["format"], "graph_json");
    let plan = &v["plan"];
    let budget = plan["budget_bytes"].as_u64().unwrap();
    let store_all = plan["store_all_peak_bytes"].as_u64().unwrap();
    let peak = plan["predicted"]["peak_bytes"].as_u64().unwrap();
    assert!(peak <= budget, "peak {peak} over budget {budget}");
    assert!(
        (budget as f64 - 0.9 * store_all as f64).abs() <= 1.0 + 1e-9 * store_all as f64,
        "{budget} vs {store_all}"
    );
    assert!(!plan["schedule"].as_array().unwrap().is_empty());
    assert!(!plan["decisions"].as_array().unwrap().is_empty());
    assert_eq!(v["summary"]["peak_bytes"], plan["predicted"]["peak_bytes"]);
    assert_eq!(v["summary"]["budget_bytes"], plan["budget_bytes"]);

    let hash = v["model"]["hash"].as_str().unwrap();
    let h = t
        .send(
            Request::get(format!("/v1/models/{hash}/history"))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(h.status, StatusCode::OK);
    assert_eq!(
        h.json()["plans"][0]["summary"]["overhead"],
        plan["predicted"]["overhead"]
    );
}

fn random_layered_250() -> Vec<u8> {
    let path =
        root().join("../shared/bench/graphs/random_layered_n250_w0.43_nlv0.75_ed0.2_scd0.14.json");
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Posts `random_layered_250` with `query` (waiting for it) and answers the status, the job's id
/// and its plan, which must be done.
async fn plan_random_layered(router: &axum::Router, query: &str) -> (StatusCode, String, Value) {
    let r = TestApp::send_to(
        router,
        Request::post(format!("/v1/plans?{query}&wait=120"))
            .header("content-type", "application/json")
            .body(Body::from(random_layered_250()))
            .unwrap(),
    )
    .await;
    let v = r.json();
    assert_eq!(v["status"], "done", "{v}");
    (
        r.status,
        v["id"].as_str().unwrap().to_string(),
        v["plan"].clone(),
    )
}

/// Issue 19: a plan never costs more than one the service found at a lower budget. On this
/// graph the MILP finds nothing in its time and the peak descent answers: +8.09% at 0.8x,
/// +5.32% at 0.82x on its own, while the 0.8x schedule less what 0.82x does not need to
/// recompute costs +3.97% (measured 2026-12-06); the plan at 0.82x returns that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_reuses_a_cheaper_stored_plan_of_a_lower_budget() {
    let t = real_app();
    let plan = |budget: &'static str, solver: &'static str| {
        let router = &t.router;
        async move {
            let query = format!("budget={budget}&solver={solver}&time_limit=0.2");
            let (status, _, plan) = plan_random_layered(router, &query).await;
            assert_eq!(status, StatusCode::CREATED);
            plan
        }
    };
    let low = plan("0.8x", "ilp").await;
    assert!(low.get("reused_from_budget_bytes").is_none(), "{low}");
    let high = plan("0.82x", "ilp").await;
    let overhead = |p: &Value| p["predicted"]["overhead"].as_f64().unwrap();
    assert_eq!(
        high["reused_from_budget_bytes"],
        low["budget_bytes"],
        "the 0.82x plan ({:+.2}%) reuses the 0.8x one ({:+.2}%)",
        100.0 * overhead(&high),
        100.0 * overhead(&low)
    );
    assert!(overhead(&high) <= overhead(&low));
    let peak = high["predicted"]["peak_bytes"].as_u64().unwrap();
    assert!(peak <= high["budget_bytes"].as_u64().unwrap());
    // A lower budget is not handed a plan whose peak is over it (0.8x's is 117,370 bytes).
    let lower = plan("0.79x", "auto").await;
    assert!(lower.get("reused_from_budget_bytes").is_none(), "{lower}");
}

/// Issue 19, for a plan the service answers from its store: a request identical to an earlier
/// one got that plan even after a cheaper plan that fits its budget was made at a lower
/// budget. On this graph (time limit 2 s, measured 2026-12-07) `auto` costs +21.50% at 0.75x
/// and +15.18% at the least budget (106.8 KiB, under 0.75x's 110,130 bytes); asked 0.75x
/// again, the service now plans it again, offered the cheaper one, and answers that plan
/// from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identical_request_is_planned_again_when_a_later_plan_beats_the_stored_one() {
    let t = real_app();
    let post = |budget: &'static str| {
        let router = &t.router;
        async move { plan_random_layered(router, &format!("budget={budget}&time_limit=2")).await }
    };
    let overhead = |p: &Value| p["predicted"]["overhead"].as_f64().unwrap();
    let (status, first_id, first) = post("0.75x").await;
    assert_eq!(status, StatusCode::CREATED);
    let (_, _, least) = post("min").await;
    let least_peak = least["predicted"]["peak_bytes"].as_u64().unwrap();
    assert!(
        least_peak <= first["budget_bytes"].as_u64().unwrap()
            && overhead(&least) < overhead(&first),
        "the premise: the least-budget plan ({:+.2}%) is cheaper than the 0.75x one ({:+.2}%) \
         and fits its budget",
        100.0 * overhead(&least),
        100.0 * overhead(&first)
    );
    // Identical requests arriving together all find the stored plan superseded: one is
    // planned again, and the others follow that job rather than make one each.
    let together: Vec<_> = (0..6)
        .map(|_| {
            let router = t.router.clone();
            tokio::spawn(
                async move { plan_random_layered(&router, "budget=0.75x&time_limit=2").await },
            )
        })
        .collect();
    let mut answers = Vec::new();
    for task in together {
        answers.push(task.await.unwrap());
    }
    let created: Vec<&String> = answers
        .iter()
        .filter(|(status, _, _)| *status == StatusCode::CREATED)
        .map(|(_, id, _)| id)
        .collect();
    assert_eq!(
        created.len(),
        1,
        "planned again once, not the stored plan, nor once per request: {created:?}"
    );
    let (_, again_id, again) = answers
        .iter()
        .find(|(status, _, _)| *status == StatusCode::CREATED)
        .cloned()
        .unwrap();
    assert!(answers.iter().all(|(_, id, _)| *id == again_id));
    assert_ne!(again_id, first_id);
    assert!(overhead(&again) <= overhead(&least), "{again}");
    assert_eq!(again["reused_from_budget_bytes"], least["budget_bytes"]);
    // The plan made again is the answer from now on: the plan it was offered is older.
    let (status, third_id, _) = post("0.75x").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(third_id, again_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resnet18_onnx_plans_with_a_bound_batch() {
    let t = real_app();
    let r = t
        .post(
            "/v1/plans?dim=batch=2&budget=0.9x&time_limit=5&wait=300",
            "application/octet-stream",
            resnet18(),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let v: Value = r.json();
    assert_eq!(v["model"]["format"], "onnx");
    assert_eq!(v["options"]["dims"]["batch"], 2);
    let peak = v["plan"]["predicted"]["peak_bytes"].as_u64().unwrap();
    assert!(peak <= v["plan"]["budget_bytes"].as_u64().unwrap());
}

/// `freeze` names frozen weights by glob pattern (a frozen backbone; the fixture's weights are
/// graph inputs): fewer fixed bytes by their gradients' (the weights are still held); a
/// pattern that matches nothing is the client's error, named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_weights_by_pattern_keep_their_bytes_and_a_pattern_matching_nothing_is_refused() {
    let t = real_app();
    let mut fixed = Vec::new();
    for inputs in ["", "&freeze=conv1.*&freeze=layer1.*"] {
        let r = t
            .post(
                &format!("/v1/plans?dim=batch=1&budget=1x&solver=store-all&wait=300{inputs}"),
                "application/octet-stream",
                resnet18(),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
        let v: Value = r.json();
        fixed.push(
            v["plan"]["graph"]["fixed_bytes"]
                .as_u64()
                .expect("fixed_bytes"),
        );
    }
    // conv1 (64·3·7·7) and layer1's four convolutions (64·64·3·3 each) and its BN weights and
    // biases (4 · 2 · 64) lose their gradients: 4 bytes each.
    let frozen = (64 * 3 * 7 * 7 + 4 * 64 * 64 * 3 * 3 + 4 * 2 * 64) * 4;
    assert_eq!(fixed[0] - fixed[1], frozen, "{fixed:?}");
    let r = t
        .post(
            "/v1/plans?dim=batch=1&budget=0.9x&freeze=backbone.*&wait=300",
            "application/octet-stream",
            resnet18(),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    let e = r.error();
    assert_eq!(e["code"], "invalid_option", "{e}");
    let message = e["message"].as_str().unwrap();
    assert!(
        message.contains(
            "--freeze \"backbone.*\" matches no floating-point graph input or initializer"
        ),
        "{e}"
    );
}

/// An error about the model calls it by its name, or "model", never by the exporter that
/// wrote it (the training graph's own name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_name_the_model_not_its_exporter() {
    let t = real_app();
    for (name, called) in [("", "\"model\""), ("&name=resnet18", "\"resnet18\"")] {
        let r = t
            .post(
                &format!("/v1/plans?dim=batch=1&budget=0.9x&solver=dp&wait=120{name}"),
                "application/octet-stream",
                resnet18(),
            )
            .await;
        assert!(r.status.is_client_error(), "{}", r.text);
        let message = r.error()["message"].as_str().unwrap().to_string();
        assert!(
            message.contains(&format!("problem {called} is not a training chain")),
            "{message}"
        );
        assert!(!message.contains("pytorch"), "{message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipelines_errors_reach_the_client() {
    let t = real_app();
    let malformed = t
        .post(
            "/v1/plans",
            "application/octet-stream",
            b"\x08\x07not an onnx model".to_vec(),
        )
        .await;
    assert_eq!(
        malformed.status,
        StatusCode::BAD_REQUEST,
        "{}",
        malformed.text
    );
    assert_eq!(malformed.error()["code"], "malformed_model");

    let unbound = t
        .post(
            "/v1/plans?budget=0.6x&wait=120",
            "application/octet-stream",
            resnet18(),
        )
        .await;
    assert_eq!(
        unbound.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        unbound.text
    );
    let e = unbound.error();
    assert_eq!(e["code"], "unbound_dims");
    assert!(e["details"].to_string().contains("batch"), "{e}");

    let infeasible = t
        .post(
            "/v1/plans?budget=1&time_limit=5&wait=120",
            "application/json",
            vgg16_train(),
        )
        .await;
    assert_eq!(
        infeasible.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        infeasible.text
    );
    let e = infeasible.error();
    assert_eq!(e["code"], "infeasible_budget");
    let least = e["details"]["min_feasible_budget_bytes"].as_u64().unwrap();
    assert!(least > 1, "{e}");
    // One solver asked for, at a budget remat reaches otherwise: that solver found nothing,
    // and the answer says so instead of calling the budget infeasible below a lower minimum.
    let store_all = t
        .post(
            &format!("/v1/plans?budget={least}&solver=store-all&wait=120"),
            "application/json",
            vgg16_train(),
        )
        .await;
    assert_eq!(store_all.status, StatusCode::UNPROCESSABLE_ENTITY);
    let e = store_all.error();
    assert_eq!(e["details"]["solver"], "store-all", "{e}");
    let message = e["message"].as_str().unwrap();
    assert!(
        message.contains("solver store-all found no schedule") && message.contains("auto"),
        "{e}"
    );

    // validate=true on a node-link graph would be ignored (nothing to run): refused, named.
    let validate = t
        .post(
            "/v1/plans?budget=0.9x&validate=true&wait=120",
            "application/json",
            vgg16_train(),
        )
        .await;
    assert_eq!(
        validate.status,
        StatusCode::BAD_REQUEST,
        "{}",
        validate.text
    );
    let e = validate.error();
    assert_eq!(e["code"], "invalid_option", "{e}");
    let message = e["message"].as_str().unwrap();
    assert!(
        message.starts_with("validate: only ONNX models can be validated"),
        "{e}"
    );
    // Refused before a job is made (as dims on a graph): no id, nothing in the history.
    assert!(validate.json().get("id").is_none(), "{}", validate.text);
    let dims = t
        .post(
            "/v1/plans?budget=0.9x&dim=batch=2&wait=120",
            "application/json",
            vgg16_train(),
        )
        .await;
    assert_eq!(dims.status, StatusCode::BAD_REQUEST, "{}", dims.text);
    assert!(dims.json().get("id").is_none(), "{}", dims.text);
    assert!(
        dims.error()["message"]
            .as_str()
            .unwrap()
            .starts_with("dims (batch) apply to ONNX models; a node-link graph"),
        "{}",
        dims.text
    );
    let planned = t
        .post(
            "/v1/plans?budget=0.9x&wait=120",
            "application/json",
            vgg16_train(),
        )
        .await;
    let hash = planned.json()["model"]["hash"]
        .as_str()
        .unwrap()
        .to_string();
    let history = t.get(&format!("/v1/models/{hash}/history")).await.json();
    assert!(
        history["plans"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["error"]["code"] != "invalid_option"),
        "{history}"
    );

    let bad_graph = t
        .post(
            "/v1/plans?budget=0.5x",
            "application/json",
            br#"{"nodes": 3}"#.to_vec(),
        )
        .await;
    assert_eq!(
        bad_graph.status,
        StatusCode::BAD_REQUEST,
        "{}",
        bad_graph.text
    );
    assert!(bad_graph.error()["message"]
        .as_str()
        .unwrap()
        .contains("nodes"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_of_vgg16() {
    let t = real_app();
    let r = t
        .post(
            "/v1/sweeps?fraction=1&fraction=0.7&fraction=0.5&time_limit=5&wait=120",
            "application/json",
            vgg16_train(),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let points = r.json()["sweep"]["points"].as_array().unwrap().clone();
    assert_eq!(points.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_true_runs_the_plan_and_reports_measured_figures() {
    let t = real_app();
    let path = root().join("fixtures/grad/tiny_cnn.onnx");
    let model = std::fs::read(&path).unwrap();
    let r = t
        .post(
            "/v1/plans?dim=batch=2&budget=0.95x&validate=true&timing_rounds=10&wait=120",
            "application/octet-stream",
            model.clone(),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let v = &r.json()["plan"]["validation"];
    assert_eq!(v["ran"], true, "{v}");
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["device"], "cpu");
    assert_eq!(v["measured_peak_bytes"], v["predicted_peak_bytes"], "{v}");
    assert!(v["grad_max_rel_err"].as_f64().unwrap() <= 1e-6);
    assert!(!v["timeline"].as_array().unwrap().is_empty());
    // As many timing rounds as asked for, beyond the eight the time budget allows.
    assert_eq!(v["timing_rounds"], 10, "{v}");
    assert!(v["measured_step_overhead"].as_f64().is_some(), "{v}");
    // Not asked: the document says the figures are predictions, and why.
    let r = t
        .post(
            "/v1/plans?dim=batch=2&budget=0.9x&wait=120",
            "application/octet-stream",
            model,
        )
        .await;
    let v = &r.json()["plan"]["validation"];
    assert_eq!(v["ran"], false, "{v}");
    assert!(
        v["reason"].as_str().unwrap().contains("not requested"),
        "{v}"
    );
    // Asked, on dims the machine has not the memory for: the plan, with the validation not
    // run and why (the allocation would have aborted the service).
    let vgg = std::fs::read(root().join("fixtures/models/vgg11.legacy.onnx")).unwrap();
    let r = t
        .post(
            "/v1/plans?dim=batch=1000000&budget=1.5x&solver=chen-sqrt&validate=true&wait=120",
            "application/octet-stream",
            vgg,
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let v = &r.json()["plan"]["validation"];
    assert_eq!(v["ran"], false, "{v}");
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .contains("the store-all step needs about"),
        "{v}"
    );
}

/// A validation of resnet18 with 64 timing rounds (two minutes and more on two cores),
/// deleted once it runs on the executor: the run stops after the step it was in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_validating_plan_stops_the_executor() {
    let t = real_app();
    let r = t
        .post(
            "/v1/plans?dim=batch=8&budget=0.9x&validate=true&timing_rounds=64&wait=0",
            "application/octet-stream",
            resnet18(),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    let job = r.header("location").unwrap();
    let mut status = Value::Null;
    for _ in 0..12_000 {
        status = t.get(&job).await.json()["status"].clone();
        if status == "validating" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(status, "validating");
    let deleted = std::time::Instant::now();
    assert_eq!(t.delete(&job).await.status, StatusCode::NO_CONTENT);
    let line = "remat_jobs_total{kind=\"plan\",outcome=\"cancelled\"} 1";
    // The outcome is counted as the job ends, the running gauge lowered just after: both are
    // waited for (a scrape between the two saw the job cancelled and still running).
    let stopped = |m: &str| m.lines().any(|l| l == line) && m.contains("remat_jobs_running 0");
    let mut metrics = String::new();
    while deleted.elapsed() < std::time::Duration::from_secs(30) {
        metrics = t.get("/metrics").await.text;
        if stopped(&metrics) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        stopped(&metrics),
        "not stopped 30 s after the DELETE:\n{metrics}"
    );
}

fn torch_graph(name: &str) -> Vec<u8> {
    let path = root().join("fixtures/torch").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_captured_pytorch_graph_plans_in_the_torch_sac_model() {
    let t = real_app();
    let r = t
        .post(
            "/v1/plans?budget=0.8x&name=gpt2-tiny",
            "application/json",
            torch_graph("gpt2.torch.json"),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let v = r.json();
    assert_eq!(v["model"]["format"], "torch_graph");
    let plan = &v["plan"];
    assert_eq!(plan["format"], "remat.torch-plan");
    assert_eq!(plan["execution_model"], "torch-sac");
    assert_eq!(plan["model"], "gpt2-tiny");
    let budget = plan["budget_bytes"].as_u64().unwrap();
    let unplanned = plan["unplanned_peak_bytes"].as_u64().unwrap();
    assert!(
        (budget as f64 - 0.8 * unplanned as f64).abs() <= 1.0,
        "{budget} vs {unplanned}"
    );
    assert!(plan["predicted"]["peak_bytes"].as_u64().unwrap() <= budget);
    assert!(plan["regions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["wrapped"] == true));
    assert_eq!(v["summary"]["budget_bytes"], plan["budget_bytes"]);

    // What does not apply to this model is refused, naming it.
    let r = t
        .post(
            "/v1/plans?budget=0.8x&solver=ilp",
            "application/json",
            torch_graph("gpt2.torch.json"),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(r.text.contains("torch-sac"), "{}", r.text);
    let r = t
        .post(
            "/v1/plans?budget=1000",
            "application/json",
            torch_graph("gpt2.torch.json"),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    let e = r.json();
    assert_eq!(e["error"]["code"], "infeasible_budget");
    assert!(
        e["error"]["details"]["min_feasible_budget_bytes"]
            .as_u64()
            .unwrap()
            > 1000
    );
    // Its sweep: the torch-sac plans, PyTorch's step and full checkpointing beside them.
    let r = t
        .post(
            "/v1/sweeps?fraction=1&fraction=0.8&fraction=0.01&wait=120",
            "application/json",
            torch_graph("gpt2.torch.json"),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let v = r.json();
    assert_eq!(v["model"]["format"], "torch_graph", "{v}");
    let points = v["sweep"]["points"].as_array().unwrap();
    let status: Vec<&str> = points
        .iter()
        .map(|p| p["status"].as_str().unwrap())
        .collect();
    assert_ne!(status[1], "infeasible", "{v}");
    assert_eq!(status[2], "infeasible", "{v}");
    let names: Vec<&str> = points[1]["baselines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b[0].as_str().unwrap())
        .collect();
    assert_eq!(names, ["none", "full"], "{v}");
    let r = t
        .post(
            "/v1/sweeps?solver=ilp",
            "application/json",
            torch_graph("gpt2.torch.json"),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(r.text.contains("torch-sac"), "{}", r.text);
    // A malformed captured graph names the field.
    let mut g: Value = serde_json::from_slice(&torch_graph("stack.torch.json")).unwrap();
    g["ops"][2]["outputs"] = serde_json::json!([999999]);
    let r = t
        .post(
            "/v1/plans?budget=0.8x",
            "application/json",
            serde_json::to_vec(&g).unwrap(),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(
        r.text.contains("output storage 999999 does not exist"),
        "{}",
        r.text
    );
}

/// What `remat.torch.measure` returns for `plan` (the fields `check_validation` reads, and a few
/// it passes through), as if PyTorch had measured the predicted peak.
fn measured(plan: &Value) -> Value {
    let predicted = plan["predicted"]["peak_bytes"].clone();
    serde_json::json!({
        "ran": true, "device": "torch-cpu", "ok": true, "problems": [],
        "predicted_peak_bytes": predicted, "measured_peak_bytes": predicted,
        "peak_rel_diff": 0.0, "budget_bytes": plan["budget_bytes"], "fingerprint": plan["fingerprint"],
        "grad_max_rel_err": 0.0, "measured_overhead": 0.071, "measured_step_overhead": 0.052, "predicted_overhead": plan["predicted"]["overhead"],
        "step_seconds": 0.42, "store_all_step_seconds": 0.39, "torch": "2.15.0"
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_measured_validation_attaches_to_its_torch_sac_plan_and_nothing_else() {
    let t = real_app();
    let r = t
        .post(
            "/v1/plans?budget=0.7x",
            "application/json",
            torch_graph("stack.torch.json"),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let id = r.json()["id"].as_str().unwrap().to_string();
    let plan = r.json()["plan"].clone();
    assert!(plan.get("validation").is_none(), "{plan}");
    let uri = format!("/v1/plans/{id}/validation");
    // Read once so the response is cached: the PUT must replace what the cache answers.
    assert_eq!(
        t.get(&format!("/v1/plans/{id}")).await.status,
        StatusCode::OK
    );

    let v = measured(&plan);
    let r = t.put(&uri, serde_json::to_vec(&v).unwrap()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["plan"]["validation"], v);
    let read = t.get(&format!("/v1/plans/{id}")).await;
    assert_eq!(read.json()["plan"]["validation"], v, "{}", read.text);
    // The rest of the plan is unchanged, and the document still reads as a torch-sac plan.
    let mut without = read.json()["plan"].clone();
    without.as_object_mut().unwrap().remove("validation");
    assert_eq!(without, plan);
    let doc: remat_solver::sac::PlanDocument =
        serde_json::from_value(read.json()["plan"].clone()).unwrap();
    assert_eq!(doc.validation.as_ref(), Some(&v));

    // Not a measurement of this plan, or not one at all: refused naming the field.
    for (field, bad) in [
        ("predicted_peak_bytes", serde_json::json!(12345)),
        ("fingerprint", serde_json::json!("another model")),
        ("budget_bytes", serde_json::json!(1)),
        ("device", serde_json::json!("cuda")),
        ("grad_max_rel_err", serde_json::json!(-1.0)),
        ("ok", serde_json::json!("yes")),
        ("measured_step_overhead", serde_json::json!("fast")),
        ("measured_step_overhead", serde_json::json!(-1.5)),
        ("measured_overhead", serde_json::json!(-5.0)),
        ("peak_rel_diff", serde_json::json!(0.5)),
    ] {
        let mut w = v.clone();
        w[field] = bad;
        let r = t.put(&uri, serde_json::to_vec(&w).unwrap()).await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{field}: {}",
            r.text
        );
        assert_eq!(
            r.json()["error"]["code"],
            "invalid_validation",
            "{}",
            r.text
        );
        assert!(r.text.contains(field), "{field}: {}", r.text);
    }
    // `ok: true` with figures that fail measure's own checks: refused, naming why.
    let predicted = v["predicted_peak_bytes"].as_u64().unwrap();
    let budget = v["budget_bytes"].as_u64().unwrap();
    for (edit, why) in [
        (
            serde_json::json!({"measured_peak_bytes": 2 * budget, "peak_rel_diff": (2 * budget) as f64 / predicted as f64 - 1.0}),
            "above the budget",
        ),
        (
            serde_json::json!({"grad_max_rel_err": 0.9, "grad_tolerance": 1e-6, "grad_reference_rel_err": 0.0}),
            "largest gradient error",
        ),
    ] {
        let mut w = v.clone();
        for (k, x) in edit.as_object().unwrap() {
            w[k] = x.clone();
        }
        let r = t.put(&uri, serde_json::to_vec(&w).unwrap()).await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{why}: {}",
            r.text
        );
        assert!(
            r.text.contains(why) && r.text.contains("`ok`"),
            "{why}: {}",
            r.text
        );
        // The same figures with `ok: false` are a failed measurement, stored as such.
        w["ok"] = false.into();
        let r = t.put(&uri, serde_json::to_vec(&w).unwrap()).await;
        assert_eq!(r.status, StatusCode::OK, "{why}: {}", r.text);
    }
    let r = t.put(&uri, serde_json::to_vec(&v).unwrap()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let mut w = v.clone();
    w.as_object_mut().unwrap().remove("measured_peak_bytes");
    let r = t.put(&uri, serde_json::to_vec(&w).unwrap()).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(r.text.contains("measured_peak_bytes"), "{}", r.text);
    let r = t.put(&uri, b"{not json".to_vec()).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    let r = t
        .put("/v1/plans/nope/validation", serde_json::to_vec(&v).unwrap())
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    // The refused ones left the stored validation as it was.
    let read = t.get(&format!("/v1/plans/{id}")).await;
    assert_eq!(read.json()["plan"]["validation"], v);

    // A free-schedule plan is validated by remat's executor, not by a PUT.
    let r = t
        .post(
            "/v1/plans?budget=0.9x&time_limit=2&wait=120",
            "application/json",
            vgg16_train(),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let other = r.json()["id"].as_str().unwrap().to_string();
    let r = t
        .put(
            &format!("/v1/plans/{other}/validation"),
            serde_json::to_vec(&v).unwrap(),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert_eq!(r.json()["error"]["code"], "not_a_torch_plan", "{}", r.text);
}

/// A maximize request whose budget cannot work, and a plan without a budget, are refused
/// before a job is made: they made a failed job each (an `id`, an entry in the model's
/// history) though docs/api.md says bad options do not. A compressed body is refused naming
/// its encoding (a gzipped ONNX file was "bad tag 31 at byte 1", a malformed model).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maximize_and_budget_mistakes_make_no_job_and_compressed_bodies_are_refused() {
    let t = real_app();
    for (query, named) in [
        (
            "maximize=batch&budget=0.6x",
            "fraction of the store-all peak",
        ),
        ("maximize=batch&budget=min", "least peak of one model"),
        ("maximize=batch", "needs the device's memory"),
        ("dim=batch=2", "budget is required"),
    ] {
        let r = t
            .post(
                &format!("/v1/plans?{query}&time_limit=1"),
                "application/octet-stream",
                resnet18(),
            )
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{query}: {}", r.text);
        let v: Value = r.json();
        assert_eq!(v["error"]["code"], "invalid_option", "{query}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(named),
            "{query}: {v}"
        );
        assert!(v.get("id").is_none(), "{query}: {v}");
    }
    let envelope = serde_json::json!({
        "model": {"directed": true, "nodes": [{"id": 0}], "links": []},
        "budget": null,
    });
    let r = t
        .post(
            "/v1/plans",
            "application/json",
            serde_json::to_vec(&envelope).unwrap(),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    let listed: Value = t.get("/v1/plans").await.json();
    assert_eq!(
        listed["plans"].as_array().map(Vec::len),
        Some(0),
        "{listed}"
    );
    let r = t
        .send(
            Request::post("/v1/plans?dim=batch=2&budget=0.9x")
                .header("content-type", "application/octet-stream")
                .header("content-encoding", "gzip")
                .body(Body::from(resnet18()))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{}", r.text);
    assert!(
        r.text.contains("Content-Encoding \\\"gzip\\\""),
        "{}",
        r.text
    );
}
