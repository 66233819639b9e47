//! Test engines and helpers shared by the API tests.
//!
//! `TestEngine` does what the posted model asks: a graph JSON `{"behave": "..."}` selects
//! `ok`, `sleep:<ms>`, `gate` (block until the test opens the gate), `until_cancelled` (run
//! until the job's cancel flag is raised, at most a minute), `bad_input`,
//! `unsupported_ops`, `unbound_dims`, `infeasible`, `internal` or `panic`. ONNX bytes (anything
//! not JSON) plan when they start with `ONNX` and are malformed otherwise. A successful plan
//! echoes the options it saw, so tests can check what reached the engine.
#![allow(dead_code)]

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use remat_server::engine::{
    Engine, EngineError, ErrorKind, History, ModelFormat, Phase, PlanRequest,
};
use remat_server::http::{app, AppState, Config, Store};
use remat_solver::Cancel;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tower::ServiceExt;

#[derive(Default)]
pub struct Gate {
    open: Mutex<bool>,
    cond: Condvar,
}

impl Gate {
    pub fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cond.notify_all();
    }

    fn wait(&self) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.cond.wait(open).unwrap();
        }
    }
}

#[derive(Default)]
pub struct TestEngine {
    pub calls: AtomicUsize,
    pub gate: Gate,
}

fn behaviour(model: &[u8], format: ModelFormat) -> Result<String, EngineError> {
    match format {
        ModelFormat::Onnx if model.starts_with(b"ONNX") => Ok("ok".to_string()),
        ModelFormat::Onnx => Err(EngineError::new(
            ErrorKind::BadInput,
            "malformed_model",
            "the ONNX model is malformed: field 1 (ir_version) has wire type 7",
        )
        .with_details(json!({"offset": 0}))),
        ModelFormat::GraphJson | ModelFormat::TorchGraph => {
            let v: Value = serde_json::from_slice(model).map_err(|e| {
                EngineError::new(ErrorKind::BadInput, "malformed_model", e.to_string())
            })?;
            Ok(v.get("behave")
                .and_then(Value::as_str)
                .unwrap_or("ok")
                .to_string())
        }
    }
}

impl TestEngine {
    fn run(
        &self,
        model: &[u8],
        format: ModelFormat,
        request: &PlanRequest,
        progress: &dyn Fn(Phase),
        cancel: &Cancel,
    ) -> Result<Value, EngineError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let behave = behaviour(model, format)?;
        progress(Phase::Solving);
        match behave.as_str() {
            "ok" => {}
            "gate" => self.gate.wait(),
            "validate" => {
                progress(Phase::Validating);
                std::thread::sleep(Duration::from_millis(20));
            }
            // Runs until the job is cancelled (a minute at most: then it says it was not).
            "until_cancelled" => {
                let start = std::time::Instant::now();
                while start.elapsed() < Duration::from_secs(60) {
                    if cancel.is_cancelled() {
                        return Err(EngineError::cancelled());
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                return Err(EngineError::new(
                    ErrorKind::Internal,
                    "not_cancelled",
                    "ran a minute without being cancelled",
                ));
            }
            s if s.starts_with("sleep:") => {
                let ms: u64 = s[6..].parse().unwrap_or(100);
                std::thread::sleep(Duration::from_millis(ms));
            }
            "bad_input" => {
                return Err(EngineError::new(
                    ErrorKind::BadInput,
                    "invalid_option",
                    "budget \"lots\" is not a size",
                ))
            }
            "unsupported_ops" => {
                return Err(EngineError::new(
                    ErrorKind::Unprocessable,
                    "unsupported_ops",
                    "2 nodes use unsupported ops: node /a (op Foo), node /b (op Bar)",
                )
                .with_details(
                    json!({"nodes": [{"node": "/a", "op": "Foo"}, {"node": "/b", "op": "Bar"}]}),
                ))
            }
            "unbound_dims" => return Err(EngineError::new(
                ErrorKind::Unprocessable,
                "unbound_dims",
                "symbolic dimensions without a value: batch, seq (bind them with dim=NAME=VALUE)",
            )
            .with_details(json!({"dims": ["batch", "seq"]}))),
            "infeasible" => {
                return Err(EngineError::new(
                    ErrorKind::Unprocessable,
                    "infeasible_budget",
                    "no schedule fits 100 bytes; the minimum feasible budget is 4096 bytes",
                )
                .with_details(json!({"budget": 100, "min_feasible_budget": 4096})))
            }
            "internal" => {
                return Err(EngineError::new(
                    ErrorKind::Internal,
                    "internal",
                    "secret path /etc/remat/key exploded",
                ))
            }
            "panic" => panic!("the test engine panics on purpose"),
            other => {
                return Err(EngineError::new(
                    ErrorKind::BadInput,
                    "unknown_behaviour",
                    other.to_string(),
                ))
            }
        }
        Ok(json!({
            "summary": {"budget": request.budget, "peak_bytes": 1000 + model.len(), "overhead": 0.25},
            "echo": request,
            "format": format,
        }))
    }
}

impl Engine for TestEngine {
    fn plan(
        &self,
        model: &[u8],
        format: ModelFormat,
        request: &PlanRequest,
        history: &dyn History,
        progress: &dyn Fn(Phase),
        cancel: &Cancel,
    ) -> Result<Value, EngineError> {
        let mut document = self.run(model, format, request, progress, cancel)?;
        // What the store offered: each earlier plan's id, options and whether its document
        // reads back.
        document["earlier"] = history
            .plans()
            .iter()
            .map(|p| {
                json!({
                    "id": p.id,
                    "budget": p.request.budget,
                    "summary": p.summary,
                    "document": history.document(&p.id).is_some(),
                })
            })
            .collect();
        Ok(document)
    }

    fn sweep(
        &self,
        model: &[u8],
        format: ModelFormat,
        request: &PlanRequest,
        cancel: &Cancel,
    ) -> Result<Value, EngineError> {
        self.run(model, format, request, &|_| {}, cancel)?;
        Ok(
            json!({"frontier": request.fractions.iter().map(|f| json!({"fraction": f, "overhead": 1.0 / f})).collect::<Vec<_>>()}),
        )
    }
}

pub struct TestApp {
    pub engine: Arc<TestEngine>,
    pub state: AppState,
    pub router: axum::Router,
}

pub fn test_config() -> Config {
    let mut config = Config {
        workers: 2,
        queue: 8,
        ..Config::default()
    };
    // Workers of a shared queue look at an empty queue often, so tests wait little.
    config.shared_workers.idle_poll = Duration::from_millis(20);
    config
}

/// Which store a test app runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// The embedded store, in memory.
    Sqlite,
    /// A fresh database on the shared test cluster ([`crate::pg`]), with this process's
    /// workers on it.
    Postgres,
}

/// The store of a suite included once per store (`main.rs`): the module's path names it.
pub fn store_of(module_path: &str) -> StoreKind {
    if module_path.contains("postgres") {
        StoreKind::Postgres
    } else {
        StoreKind::Sqlite
    }
}

/// A store of `kind`, empty.
pub async fn test_store(kind: StoreKind) -> Store {
    match kind {
        StoreKind::Sqlite => Store::in_memory().unwrap(),
        StoreKind::Postgres => {
            let url = crate::pg::database().await;
            remat_server::http::open_store(&url, 8)
                .await
                .unwrap_or_else(|e| panic!("opening the test database: {e}"))
        }
    }
}

pub async fn test_app_on(kind: StoreKind, config: Config) -> TestApp {
    let engine = Arc::new(TestEngine::default());
    let store = test_store(kind).await;
    let state = AppState::new(engine.clone(), store, config).unwrap();
    TestApp {
        engine,
        router: app(state.clone()),
        state,
    }
}

/// A test app on the embedded store.
pub async fn test_app_with(config: Config) -> TestApp {
    test_app_on(StoreKind::Sqlite, config).await
}

pub async fn test_app() -> TestApp {
    test_app_with(test_config()).await
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub text: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }

    /// Asserts the one error shape and returns the error object.
    pub fn error(&self) -> Value {
        let v = self.json();
        let e = v
            .get("error")
            .unwrap_or_else(|| panic!("no `error` in {}", self.text))
            .clone();
        assert!(e["code"].is_string(), "{}", self.text);
        assert!(e["message"].is_string(), "{}", self.text);
        assert!(e.get("details").is_some(), "{}", self.text);
        e
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }
}

impl TestApp {
    pub async fn send(&self, request: Request<Body>) -> Reply {
        Self::send_to(&self.router, request).await
    }

    /// Sends one request through any router.
    pub async fn send_to(router: &axum::Router, request: Request<Body>) -> Reply {
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        Reply {
            status,
            headers,
            text: String::from_utf8_lossy(&bytes).to_string(),
        }
    }

    pub async fn get(&self, uri: &str) -> Reply {
        self.send(Request::get(uri).body(Body::empty()).unwrap())
            .await
    }

    pub async fn delete(&self, uri: &str) -> Reply {
        self.send(Request::delete(uri).body(Body::empty()).unwrap())
            .await
    }

    pub async fn post_json(&self, uri: &str, body: &Value) -> Reply {
        self.send(
            Request::post(uri)
                .header("content-type", "application/json")
                .body(Body::from(body.to_string()))
                .unwrap(),
        )
        .await
    }

    pub async fn post_bytes(&self, uri: &str, content_type: &str, body: Vec<u8>) -> Reply {
        self.send(
            Request::post(uri)
                .header("content-type", content_type)
                .body(Body::from(body))
                .unwrap(),
        )
        .await
    }

    /// Polls a plan until it is done or failed.
    pub async fn wait_done(&self, uri: &str) -> Value {
        for _ in 0..500 {
            let r = self.get(uri).await;
            let v = r.json();
            if v["status"] == "done" || v["status"] == "failed" {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{uri} did not finish");
    }
}

/// The package's directory: cargo's at run time, else the build's. A test binary built in
/// another clone that shares the cargo target folder (as CI's does) is reused here unchanged,
/// with that clone's path in `env!`.
pub fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), Into::into)
}

/// A reply read over a real connection.
pub struct HttpReply {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    /// JSON, or the text as a JSON string when it is not JSON.
    pub body: Value,
}

/// One HTTP request to a real port; `None` when the connection failed.
pub async fn http(method: &str, url: &str, body: Option<&[u8]>) -> Option<HttpReply> {
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    let client: Client<_, Full<axum::body::Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut builder = hyper::Request::builder().method(method).uri(url);
    let body = match body {
        Some(b) => {
            builder = builder.header("content-type", "application/json");
            Full::from(b.to_vec())
        }
        None => Full::default(),
    };
    let response = client.request(builder.body(body).unwrap()).await.ok()?;
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.ok()?.to_bytes();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).to_string()))
    };
    Some(HttpReply {
        status,
        headers,
        body,
    })
}
