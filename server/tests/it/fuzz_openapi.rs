//! Fuzzes the API from its own OpenAPI document: every operation the document lists gets
//! requests with generated path parameters, query parameters (typed from their schemas,
//! plus malformed and unknown ones), bodies (graphs, envelopes, random JSON, random bytes) and
//! content types, and sometimes the wrong method. No request may get a 5xx or crash the
//! server, and every 4xx must carry the one error shape.

use crate::common::{test_app_with, test_config, TestApp};
use axum::body::Body;
use axum::http::Request;
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestCaseError, TestRunner};
use serde_json::{json, Value};

#[derive(Debug, Clone)]
struct Param {
    name: String,
    in_path: bool,
    array: bool,
    kind: String,
}

#[derive(Debug, Clone)]
struct Operation {
    method: String,
    path: String,
    params: Vec<Param>,
    has_body: bool,
}

#[derive(Debug, Clone)]
struct Case {
    method: String,
    uri: String,
    content_type: Option<String>,
    body: Vec<u8>,
}

fn schema_kind(schema: &Value) -> (bool, String) {
    let type_of = |s: &Value| -> String {
        match &s["type"] {
            Value::String(t) => t.clone(),
            Value::Array(ts) => ts
                .iter()
                .filter_map(Value::as_str)
                .find(|t| *t != "null")
                .unwrap_or("string")
                .to_string(),
            _ => "string".to_string(),
        }
    };
    let kind = type_of(schema);
    if kind == "array" {
        (true, type_of(&schema["items"]))
    } else {
        (false, kind)
    }
}

fn operations(doc: &Value) -> Vec<Operation> {
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            let params = op["parameters"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .map(|p| {
                            let (array, kind) = schema_kind(&p["schema"]);
                            Param {
                                name: p["name"].as_str().unwrap_or_default().to_string(),
                                in_path: p["in"] == "path",
                                array,
                                kind,
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
            ops.push(Operation {
                method: method.to_uppercase(),
                path: path.clone(),
                params,
                has_body: op.get("requestBody").is_some(),
            });
        }
    }
    ops
}

fn value_strategy(kind: &str) -> BoxedStrategy<String> {
    let junk = prop_oneof![Just(String::new()), "[ -~]{0,12}", "\\PC{0,6}"];
    match kind {
        "number" | "integer" => prop_oneof![
            4 => "-?[0-9]{1,7}(\\.[0-9]{1,3})?",
            1 => prop::sample::select(vec!["nan", "inf", "-inf", "1e309", "-0", "1e-320"]).prop_map(str::to_string),
            1 => junk,
        ]
        .boxed(),
        "boolean" => prop_oneof![
            4 => prop::sample::select(vec!["true", "false", "1", "0"]).prop_map(str::to_string),
            1 => junk,
        ]
        .boxed(),
        _ => prop_oneof![
            3 => prop::sample::select(vec!["0.6x", "2GiB", "1000", "batch=2", "seq=0", "auto", "dp", "=", "a=b=c"])
                .prop_map(str::to_string),
            2 => junk,
        ]
        .boxed(),
    }
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "[ -~]{0,10}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map(
                prop::sample::select(vec![
                    "model", "options", "nodes", "links", "budget", "dims", "x"
                ])
                .prop_map(str::to_string),
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn body_strategy() -> BoxedStrategy<(Option<String>, Vec<u8>)> {
    let graph = || json!({"directed": true, "nodes": [{"id": 0}], "links": []});
    let content_type = prop::sample::select(vec![
        Some("application/json"),
        Some("application/octet-stream"),
        None,
        Some("text/plain"),
        Some("application/problem+json"),
        Some("application/json; charset=utf-8"),
    ])
    .prop_map(|c| c.map(str::to_string));
    let bodies = prop_oneof![
        Just(graph().to_string().into_bytes()),
        arb_json().prop_map(move |options| json!({"model": graph(), "options": options})
            .to_string()
            .into_bytes()),
        (value_strategy("string"), value_strategy("number")).prop_map(move |(b, t)| {
            json!({"model": graph(), "options": {"budget": b, "time_limit": t.parse::<f64>().ok()}})
                .to_string()
                .into_bytes()
        }),
        arb_json().prop_map(|v| v.to_string().into_bytes()),
        prop::collection::vec(any::<u8>(), 0..64),
        Just(b"ONNX pretend".to_vec()),
        Just(Vec::new()),
    ];
    (content_type, bodies).boxed()
}

fn operation_strategy(op: Operation, known_id: String) -> BoxedStrategy<Case> {
    let path_values: Vec<BoxedStrategy<(String, String)>> = op
        .params
        .iter()
        .filter(|p| p.in_path)
        .map(|p| {
            let name = p.name.clone();
            prop_oneof![
                Just(known_id.clone()),
                "[A-Za-z0-9._~-]{0,40}",
                "(%[0-9A-Fa-f]{2}){1,4}",
                Just("..".to_string()),
            ]
            .prop_map(move |v| (name.clone(), v))
            .boxed()
        })
        .collect();
    let query_values: Vec<BoxedStrategy<Vec<(String, String)>>> = op
        .params
        .iter()
        .filter(|p| !p.in_path)
        .map(|p| {
            let name = p.name.clone();
            let max = if p.array { 3 } else { 1 };
            prop::collection::vec(value_strategy(&p.kind), 0..=max)
                .prop_map(move |vs| vs.into_iter().map(|v| (name.clone(), v)).collect())
                .boxed()
        })
        .collect();
    let extra = prop_oneof![
        6 => Just(None),
        1 => ("[a-z_]{1,8}", "[ -~]{0,6}").prop_map(Some),
    ];
    let method = prop_oneof![
        9 => Just(op.method.clone()),
        1 => prop::sample::select(vec!["GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS", "HEAD"]).prop_map(str::to_string),
    ];
    let body = if op.has_body {
        body_strategy()
    } else {
        prop_oneof![9 => Just((None, Vec::new())), 1 => body_strategy()].boxed()
    };
    let path = op.path.clone();
    (path_values, query_values, extra, method, body)
        .prop_map(move |(pv, qv, extra, method, (content_type, body))| {
            let mut uri = path.clone();
            for (name, value) in pv {
                uri = uri.replace(&format!("{{{name}}}"), &value);
            }
            let mut pairs: Vec<(String, String)> = qv.into_iter().flatten().collect();
            pairs.extend(extra);
            if !pairs.is_empty() {
                uri.push('?');
                uri.push_str(&serde_urlencoded::to_string(&pairs).unwrap_or_default());
            }
            Case {
                method,
                uri,
                content_type,
                body,
            }
        })
        .boxed()
}

/// Responses by status class (2xx, 3xx, 4xx), to show the fuzzer reaches past the errors.
#[derive(Default)]
struct Seen {
    classes: [std::sync::atomic::AtomicUsize; 6],
}

async fn check(t: &TestApp, case: &Case, seen: &Seen) -> Result<(), TestCaseError> {
    let mut builder = Request::builder()
        .method(case.method.as_str())
        .uri(case.uri.as_str());
    if let Some(ct) = &case.content_type {
        builder = builder.header("content-type", ct);
    }
    let Ok(request) = builder.body(Body::from(case.body.clone())) else {
        return Ok(()); // not a request a client could send
    };
    let r = t.send(request).await;
    if let Some(class) = seen.classes.get(usize::from(r.status.as_u16() / 100)) {
        class.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    prop_assert!(
        r.status.as_u16() < 500,
        "{case:?} -> {} {}",
        r.status,
        r.text
    );
    if r.status.as_u16() >= 400 && case.method != "HEAD" {
        let v: Value = serde_json::from_str(&r.text)
            .map_err(|e| TestCaseError::fail(format!("{case:?}: {e}: {}", r.text)))?;
        prop_assert!(v["error"]["code"].is_string(), "{case:?} -> {}", r.text);
        prop_assert!(v["error"]["message"].is_string(), "{case:?} -> {}", r.text);
    }
    Ok(())
}

#[test]
fn no_request_built_from_the_openapi_document_gets_a_5xx() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // A queue deep enough that the fuzzer's own posts never fill it (503 is for load).
    let t = rt.block_on(test_app_with(remat_server::http::Config {
        queue: 4096,
        ..test_config()
    }));
    let (doc, known_id) = rt.block_on(async {
        let doc = t.get("/v1/openapi.json").await.json();
        let plan = t
            .post_json("/v1/plans", &json!({"nodes": [], "links": []}))
            .await
            .json();
        (doc, plan["id"].as_str().unwrap().to_string())
    });
    let ops = operations(&doc);
    assert!(ops.len() >= 10, "{ops:?}");
    let strategy = proptest::strategy::Union::new(
        ops.into_iter()
            .map(|op| operation_strategy(op, known_id.clone())),
    );
    let cases = std::env::var("REMAT_FUZZ_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(400);
    let mut runner = TestRunner::new(RunnerConfig {
        cases,
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let seen = Seen::default();
    runner
        .run(&strategy, |case| rt.block_on(check(&t, &case, &seen)))
        .unwrap_or_else(|e| panic!("{e}"));
    let count = |c: usize| seen.classes[c].load(std::sync::atomic::Ordering::Relaxed);
    println!("responses: 2xx {}, 4xx {}", count(2), count(4));
    assert!(
        count(2) > cases as usize / 10,
        "too few successful requests: {}",
        count(2)
    );
    assert!(
        count(4) > cases as usize / 10,
        "too few rejected requests: {}",
        count(4)
    );
    // The server is still up.
    rt.block_on(async { assert_eq!(t.get("/healthz").await.status, axum::http::StatusCode::OK) });
}
