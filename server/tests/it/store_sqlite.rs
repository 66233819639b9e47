//! The embedded store on a real loopback port, across restarts: what a restart does to the
//! plans stored and to a job in flight (failed as interrupted: one process owns the file).
//! On PostgreSQL a job in flight outlives its replica (`replicas.rs`).

use crate::common::*;
use axum::http::StatusCode;
use remat_server::http::store::SqliteStore;
use remat_server::http::{serve_on, AppState, Store};
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

fn graph(behave: &str) -> Value {
    serde_json::json!({"directed": true, "nodes": [{"id": 0}], "links": [], "behave": behave})
}

fn interrupted(state: &AppState) -> usize {
    match state.store() {
        Store::Sqlite(s) => s.interrupted_on_open(),
        Store::Postgres(_) => unreachable!("a SQLite test"),
    }
}

struct Running {
    url: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    state: AppState,
}

async fn start(db: &std::path::Path, engine: Arc<TestEngine>) -> Running {
    let store = Store::Sqlite(Arc::new(SqliteStore::open(db).unwrap()));
    let state = AppState::new(engine, store, test_config()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = state.clone();
    let task = tokio::spawn(async move {
        serve_on(listener, serving, async move {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    Running {
        url,
        stop,
        task,
        state,
    }
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap();
        assert!(self.state.store().is_closed());
    }
}

async fn call(method: &str, url: &str, body: Option<Value>) -> (StatusCode, Value) {
    let body = body.map(|v| v.to_string().into_bytes());
    let r = http(method, url, body.as_deref())
        .await
        .unwrap_or_else(|| panic!("{method} {url}: no answer"));
    (r.status, r.body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_survive_a_restart_on_a_real_port() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("remat.db");
    let engine = Arc::new(TestEngine::default());

    let server = start(&db, engine.clone()).await;
    let (status, plan) = call(
        "POST",
        &format!("{}/v1/plans?budget=0.5x", server.url),
        Some(graph("ok")),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{plan}");
    let id = plan["id"].as_str().unwrap().to_string();
    server.stop().await;

    let server = start(&db, engine.clone()).await;
    assert_eq!(interrupted(&server.state), 0);
    let (status, again) = call("GET", &format!("{}/v1/plans/{id}", server.url), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(again, plan);
    // And the cache key survived too.
    let (status, cached) = call(
        "POST",
        &format!("{}/v1/plans?budget=0.5x", server.url),
        Some(graph("ok")),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(cached["id"], plan["id"]);
    assert_eq!(engine.calls.load(Ordering::SeqCst), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_in_flight_at_shutdown_is_failed_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("remat.db");
    let engine = Arc::new(TestEngine::default());

    let server = start(&db, engine.clone()).await;
    // A waiting request is answered (202) when the server stops, not held until the job ends.
    let url = format!("{}/v1/plans?wait=60", server.url);
    let waiting = tokio::spawn(async move { call("POST", &url, Some(graph("gate"))).await });
    for _ in 0..500 {
        if engine.calls.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        engine.calls.load(Ordering::SeqCst),
        1,
        "the job did not start"
    );
    server.stop().await;
    let (status, accepted) = waiting.await.unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let id = accepted["id"].as_str().unwrap().to_string();

    let server = start(&db, engine.clone()).await;
    assert_eq!(interrupted(&server.state), 1);
    let (status, plan) = call("GET", &format!("{}/v1/plans/{id}", server.url), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(plan["status"], "failed");
    assert_eq!(plan["error"]["code"], "interrupted");
    assert!(plan["error"]["message"]
        .as_str()
        .unwrap()
        .contains("interrupted by a restart"));

    // The old worker finishing late must not overwrite what the new run decided.
    engine.gate.open();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_, plan) = call("GET", &format!("{}/v1/plans/{id}", server.url), None).await;
    assert_eq!(plan["status"], "failed");
    server.stop().await;
}

/// One process owns a store file: a second open while the first serves (a double start, an
/// overlapping restart) is refused before it reads or writes anything, so the first one's job
/// in flight is not failed under it; once the first one closed the store, the next open takes
/// the file and marks that job interrupted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_open_of_a_store_in_use_is_refused_and_fails_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("remat.db");
    let engine = Arc::new(TestEngine::default());
    let server = start(&db, engine.clone()).await;
    let url = format!("{}/v1/plans?wait=0", server.url);
    let (status, accepted) = call("POST", &url, Some(graph("gate"))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let id = accepted["id"].as_str().unwrap().to_string();
    let e = match SqliteStore::open(&db) {
        Ok(_) => panic!("a second open of a store in use succeeded"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("another process has it open"), "{e}");
    assert!(e.contains("remat.db.lock"), "{e}");
    // Through a symbolic link to the file too: one lock for one store.
    #[cfg(unix)]
    {
        let link = dir.path().join("link.db");
        std::os::unix::fs::symlink(&db, &link).unwrap();
        let e = match SqliteStore::open(&link) {
            Ok(_) => panic!("a second open through a symbolic link succeeded"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("another process has it open"), "{e}");
    }
    let (_, plan) = call("GET", &format!("{}/v1/plans/{id}", server.url), None).await;
    assert_ne!(plan["status"], "failed", "{plan}");
    server.stop().await;
    let server = start(&db, engine.clone()).await;
    assert_eq!(interrupted(&server.state), 1);
    engine.gate.open();
    server.stop().await;
}

/// A connection that sends part of a request's headers and stops is closed once the request
/// timeout (at most 30 s) has passed, not held open for ever; the server keeps answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_whose_headers_never_end_is_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::Sqlite(Arc::new(
        SqliteStore::open(&dir.path().join("r.db")).unwrap(),
    ));
    let config = remat_server::http::Config {
        request_timeout: Duration::from_millis(500),
        ..test_config()
    };
    let state = AppState::new(Arc::new(TestEngine::default()), store, config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        serve_on(listener, state, async move {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), slow.read_to_end(&mut buf)).await;
    assert!(closed.is_ok(), "the connection is still open after 10 s");
    let (status, _) = call("GET", &format!("http://{addr}/healthz"), None).await;
    assert_eq!(status, StatusCode::OK);
    let _ = stop.send(());
    task.await.unwrap();
}

/// A claim takes the job its `Reuse` names: an identical request any job done or in flight, a
/// request planned again (its stored plan superseded) only one in flight, so that requests
/// arriving together make one job; `refresh` none.
#[test]
fn a_claim_takes_the_job_its_reuse_names() {
    use remat_server::http::store::{Claim, JobStatus, Kind, NewJob, Reuse};
    let store = SqliteStore::open_in_memory().unwrap();
    let claim = |id: &str, reuse: Reuse| {
        let job = NewJob {
            id,
            kind: Kind::Plan,
            model_hash: "h",
            model_name: None,
            model_format: "graph",
            options: "{}",
            cache_key: "k",
            created_at: "2026-12-07T00:00:00.000Z",
        };
        store.claim(&job, reuse).unwrap().unwrap()
    };
    assert_eq!(claim("a", Reuse::Any), Claim::Created);
    store.finish("a", "{}", None).unwrap();
    assert_eq!(claim("b", Reuse::Any), Claim::Existing("a".into()));
    // A plan done is no answer to a request planned again; one in flight is.
    assert_eq!(claim("c", Reuse::InFlight), Claim::Created);
    assert_eq!(claim("d", Reuse::InFlight), Claim::Existing("c".into()));
    assert_eq!(claim("e", Reuse::Any), Claim::Existing("c".into()));
    assert_eq!(claim("f", Reuse::Never), Claim::Created);
    store.set_status("f", JobStatus::Solving).unwrap();
    assert_eq!(claim("g", Reuse::InFlight), Claim::Existing("f".into()));
}

/// The store's file locked by another process past the busy timeout (an `sqlite3` shell in
/// an exclusive transaction, a backup): `503 database_unavailable` with `Retry-After`, as a
/// database out of reach is, not `500 internal` (which a CI script takes for a bug and does
/// not retry); the post succeeds once the lock is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_locked_by_another_process_answers_503_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("remat.db");
    let server = start(&db, Arc::new(TestEngine::default())).await;
    let locker = rusqlite::Connection::open(&db).unwrap();
    locker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let url = format!("{}/v1/plans?budget=0.5x", server.url);
    let body = graph("ok").to_string().into_bytes();
    let r = http("POST", &url, Some(&body))
        .await
        .expect("an answer while locked");
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
    assert_eq!(
        r.body["error"]["code"], "database_unavailable",
        "{}",
        r.body
    );
    assert!(
        r.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("locked by another process"),
        "{}",
        r.body
    );
    assert_eq!(
        r.headers.get("retry-after").map(|v| v.as_bytes()),
        Some(&b"5"[..])
    );
    locker.execute_batch("ROLLBACK").unwrap();
    let (status, plan) = call("POST", &url, Some(graph("ok"))).await;
    assert_eq!(status, StatusCode::CREATED, "{plan}");
    server.stop().await;
}
