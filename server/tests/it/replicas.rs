//! Replicas of `remat serve` and `remat worker` processes on one PostgreSQL database, with the
//! real engine: the `remat` binary run as a user runs it, a throwaway cluster (`pg.rs`), and
//! SIGKILL and a database restart where the issue says so.

use crate::common::{http as call, HttpReply};
use crate::pg::{self, Cluster};
use axum::http::StatusCode;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A `remat` process (a replica or a worker); killed when dropped.
struct Proc {
    child: Child,
    /// Its stdout and stderr so far.
    output: Arc<Mutex<String>>,
    /// The replica's base URL (`http://127.0.0.1:port`).
    url: String,
}

impl Proc {
    /// Starts `remat <args>` and waits for the line it prints when it is ready.
    fn start(args: &[&str]) -> Proc {
        Proc::start_env(args, &[])
    }

    /// [`Proc::start`] with variables set in its environment.
    fn start_env(args: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_remat"))
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting remat");
        let output = Arc::new(Mutex::new(String::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<String>();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        {
            let output = Arc::clone(&output);
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    // In the output before the start is signalled: a test reads it at once.
                    output.lock().unwrap().push_str(&format!("{line}\n"));
                    if line.starts_with("remat serve: http://") || line.starts_with("remat worker:")
                    {
                        let _ = ready_tx.send(line);
                    }
                }
            });
        }
        {
            let output = Arc::clone(&output);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    output.lock().unwrap().push_str(&(line + "\n"));
                }
            });
        }
        let line = match ready_rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                panic!("remat {args:?} did not start: {}", output.lock().unwrap());
            }
        };
        let url = line
            .strip_prefix("remat serve: ")
            .and_then(|rest| rest.split('/').take(3).collect::<Vec<_>>().join("/").into())
            .unwrap_or_default();
        Proc { child, output, url }
    }

    fn serve(db: &str, workers: usize, extra: &[&str]) -> Proc {
        let workers = workers.to_string();
        let mut args = vec![
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--db",
            db,
            "--workers",
            &workers,
        ];
        args.extend_from_slice(extra);
        Proc::start(&args)
    }

    fn worker(db: &str, extra: &[&str]) -> Proc {
        let mut args = vec!["worker", "--db", db, "--threads", "1"];
        args.extend_from_slice(extra);
        Proc::start(&args)
    }

    fn output(&self) -> String {
        self.output.lock().unwrap().clone()
    }

    /// SIGKILL: no shutdown, no last write.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn must(method: &str, url: &str, body: Option<&[u8]>) -> HttpReply {
    call(method, url, body)
        .await
        .unwrap_or_else(|| panic!("{method} {url}: no answer"))
}

/// A Checkmate training graph (`../shared/bench/graphs`).
fn graph(name: &str) -> Vec<u8> {
    let path = crate::common::manifest_dir()
        .join("../../shared/bench/graphs")
        .join(format!("{name}_train_nx.json"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Solved in about a second (its minimum feasible budget is 0.83x).
fn vgg16() -> Vec<u8> {
    graph("VGG16 (MLSys)_256_(224, 224, 3)")
}

/// Polls a job until `done` says so (or panics after `limit`, with the last answer).
async fn until(url: &str, limit: Duration, done: impl Fn(&Value) -> bool) -> Value {
    poll(url, limit, done)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Polls a job until `done` says so; after `limit`, what the last GET answered.
async fn poll(url: &str, limit: Duration, done: impl Fn(&Value) -> bool) -> Result<Value, String> {
    let end = Instant::now() + limit;
    let mut last = "no answer".to_string();
    loop {
        if let Some(r) = call("GET", url, None).await {
            if r.status == StatusCode::OK && done(&r.body) {
                return Ok(r.body);
            }
            last = format!("{} {}", r.status, r.body);
        }
        if Instant::now() >= end {
            return Err(format!(
                "{url}: not there within {limit:?}; the last answer: {last}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `(attempts, status)` of job `id`, read from the database itself.
async fn job_row(db: &str, id: &str) -> (i32, String) {
    let (client, connection) = tokio_postgres::connect(db, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let row = client
        .query_one("SELECT attempts, status FROM jobs WHERE id = $1", &[&id])
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

async fn count_jobs(db: &str) -> i64 {
    let (client, connection) = tokio_postgres::connect(db, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .query_one("SELECT count(*) FROM jobs", &[])
        .await
        .unwrap()
        .get(0)
}

/// The payloads notified on `channel` from now on (`LISTEN` on a connection of its own, open
/// while the client returned lives).
async fn listen(
    db: &str,
    channel: &str,
) -> (
    tokio_postgres::Client,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let (client, mut connection) = tokio_postgres::connect(db, tokio_postgres::NoTls)
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                if tx.send(n.payload().to_string()).is_err() {
                    return;
                }
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {channel}"))
        .await
        .unwrap();
    (client, rx)
}

/// The replica's `/metrics` text.
/// Waits until the replica's listener of deletions and job ends has connected.
async fn until_following(replica: &Proc) {
    let start = Instant::now();
    while !replica.output().contains("following deletions") {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the replica's listener did not connect: {}",
            replica.output()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn metrics(base: &str) -> String {
    let reply = must("GET", &format!("{base}/metrics"), None).await;
    reply.body.as_str().unwrap().to_string()
}

/// The value of counter `name` (with its labels) in a `/metrics` text.
fn counter(text: &str, name: &str) -> u64 {
    value(text, name)
}

/// The value of metric `name` (with its labels) in a `/metrics` text.
fn value<T: std::str::FromStr>(text: &str, name: &str) -> T {
    let name = format!("{name} ");
    let v = text
        .lines()
        .find_map(|l| l.strip_prefix(&name))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"));
    v.parse()
        .unwrap_or_else(|_| panic!("{name}: {v:?} is no number"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_post_is_answered_when_its_jobs_end_is_heard() {
    let db = pg::database().await;
    // Looks at the job an hour apart while the replica hears job ends: within the post's wait
    // only the notice of the job's end can answer it.
    let a = Proc::serve(&db, 0, &["--wait-poll", "3600"]);
    until_following(&a).await;
    let waits = |text: &str, by: &str| {
        counter(
            text,
            &format!("remat_shared_waits_total{{ended_by=\"{by}\"}}"),
        )
    };
    let before = metrics(&a.url).await;
    let url = format!("{}/v1/plans?budget=0.9x&time_limit=5&wait=120", a.url);
    let post = tokio::spawn(async move { must("POST", &url, Some(&vgg16())).await });
    // Nobody takes the job until it waits in the queue; then a worker solves it.
    let start = Instant::now();
    while count_jobs(&db).await == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the post made no job"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _worker = Proc::worker(&db, &[]);
    let posted = post.await.unwrap();
    assert_eq!(posted.status, StatusCode::CREATED, "{}", posted.body);
    assert_eq!(posted.body["status"], "done", "{}", posted.body);
    let after = metrics(&a.url).await;
    let delta = |by| waits(&after, by) - waits(&before, by);
    assert_eq!(
        (
            delta("already"),
            delta("notice"),
            delta("look"),
            delta("timeout")
        ),
        (0, 1, 0, 0),
        "{after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_and_a_worker_serve_one_store() {
    let db = pg::database().await;
    let a = Proc::serve(&db, 0, &[]);
    let b = Proc::serve(&db, 0, &[]);
    let worker = Proc::worker(&db, &[]);
    let model = vgg16();

    // Posted to one, solved by the worker, read from the other.
    let posted = must(
        "POST",
        &format!("{}/v1/plans?budget=0.9x&time_limit=5&wait=120", a.url),
        Some(&model),
    )
    .await;
    assert_eq!(posted.status, StatusCode::CREATED, "{}", posted.body);
    let id = posted.body["id"].as_str().unwrap().to_string();
    let read = must("GET", &format!("{}/v1/plans/{id}", b.url), None).await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.body, posted.body);
    // And the same model and options posted to the other replica answer the stored plan.
    let again = must(
        "POST",
        &format!("{}/v1/plans?budget=0.9x&time_limit=5", b.url),
        Some(&model),
    )
    .await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(again.body["id"], posted.body["id"]);

    // Identical posts to both replicas at the same moment make one job.
    let (_listening, mut finished) = listen(&db, "remat_finished").await;
    let jobs_before = count_jobs(&db).await;
    let mut posts = vec![];
    for round in 0..6 {
        let base = if round % 2 == 0 { &a.url } else { &b.url };
        let url = format!("{base}/v1/plans?budget=0.88x&time_limit=5&wait=0");
        let model = model.clone();
        posts.push(tokio::spawn(async move {
            must("POST", &url, Some(&model)).await
        }));
    }
    let mut ids = vec![];
    for p in posts {
        let r = p.await.unwrap();
        assert!(
            r.status == StatusCode::ACCEPTED
                || r.status == StatusCode::OK
                || r.status == StatusCode::CREATED,
            "{} {}",
            r.status,
            r.body
        );
        ids.push(r.body["id"].as_str().unwrap().to_string());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(count_jobs(&db).await, jobs_before + 1);
    let done = until(
        &format!("{}/v1/plans/{}", a.url, ids[0]),
        Duration::from_secs(120),
        |v| v["status"] == "done",
    )
    .await;
    let plan = &done["plan"];
    assert!(
        plan["predicted"]["peak_bytes"].as_u64().unwrap() <= plan["budget_bytes"].as_u64().unwrap(),
        "{done}"
    );
    // The worker's last write told every listener (the replicas' waiting requests hear it at
    // once, `http/notices.rs`).
    let heard = tokio::time::timeout(Duration::from_secs(10), finished.recv())
        .await
        .expect("the job's end is notified on remat_finished");
    assert_eq!(heard.as_deref(), Some(format!("plan/{}", ids[0]).as_str()));

    // Many reads of that plan at once on the replica that has not read it yet make one read of
    // the database; the others wait for it and answer from the cache (a cold replica under load
    // would otherwise queue one query per request on its pool).
    let job_reads = |text: &str, outcome: &str| -> u64 {
        counter(
            text,
            &format!("remat_job_reads_total{{outcome=\"{outcome}\"}}"),
        )
    };
    let before = metrics(&b.url).await;
    let on_b = format!("{}/v1/plans/{}", b.url, ids[0]);
    let reads: Vec<_> = (0..32)
        .map(|_| {
            let url = on_b.clone();
            tokio::spawn(async move { must("GET", &url, None).await })
        })
        .collect();
    for r in reads {
        let r = r.await.unwrap();
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        assert_eq!(r.body, done);
    }
    let after = metrics(&b.url).await;
    let delta = |outcome| job_reads(&after, outcome) - job_reads(&before, outcome);
    assert_eq!(delta("read"), 1, "{after}");
    assert_eq!(delta("hit") + delta("joined"), 31, "{after}");

    // Health and metrics speak of the shared queue; no log line shows the password.
    let health = must("GET", &format!("{}/healthz", b.url), None).await;
    assert_eq!(health.status, StatusCode::OK);
    assert_eq!(health.body["store"], "postgres");
    assert_eq!(health.body["workers"], 0);
    let metrics = must("GET", &format!("{}/metrics", a.url), None).await;
    let text = metrics.body.as_str().unwrap().to_string();
    assert!(text.contains("remat_database_up 1"), "{text}");
    assert!(
        text.contains("remat_shared_queue_depth{kind=\"plan\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("remat_shared_oldest_lease_seconds{kind=\"plan\"}"),
        "{text}"
    );
    // A validation attached on one replica is answered by the other, whose cache held the plan
    // without it.
    assert!(b.output().contains("following deletions"), "{}", b.output());
    let torch =
        std::fs::read(crate::common::manifest_dir().join("../fixtures/torch/stack.torch.json"))
            .unwrap();
    let posted = must(
        "POST",
        &format!("{}/v1/plans?budget=0.7x&wait=60", a.url),
        Some(&torch),
    )
    .await;
    assert_eq!(posted.status, StatusCode::CREATED, "{}", posted.body);
    let plan = &posted.body["plan"];
    let on_b = format!("{}/v1/plans/{}", b.url, posted.body["id"].as_str().unwrap());
    assert_eq!(
        must("GET", &on_b, None).await.body["plan"]["validation"],
        Value::Null
    );
    let validation = serde_json::json!({
        "ran": true, "device": "torch-cpu", "ok": true,
        "predicted_peak_bytes": plan["predicted"]["peak_bytes"],
        "measured_peak_bytes": plan["predicted"]["peak_bytes"],
        "grad_max_rel_err": 0.0, "measured_overhead": 0.05,
    });
    let put = must(
        "PUT",
        &format!(
            "{}/v1/plans/{}/validation",
            a.url,
            posted.body["id"].as_str().unwrap()
        ),
        Some(validation.to_string().as_bytes()),
    )
    .await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    let end = Instant::now() + Duration::from_secs(5);
    while must("GET", &on_b, None).await.body["plan"]["validation"] != validation {
        assert!(
            Instant::now() < end,
            "the other replica still answers the plan without its validation"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // A plan deleted on one replica is gone from the other's cache too (which answers from its
    // cache alone while it follows deletions).
    let cached = format!("{}/v1/plans/{}", b.url, ids[0]);
    assert_eq!(must("GET", &cached, None).await.status, StatusCode::OK);
    assert_eq!(must("GET", &cached, None).await.status, StatusCode::OK);
    let deleted = must("DELETE", &format!("{}/v1/plans/{}", a.url, ids[0]), None).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    let end = Instant::now() + Duration::from_secs(5);
    while must("GET", &cached, None).await.status != StatusCode::NOT_FOUND {
        assert!(
            Instant::now() < end,
            "the other replica still answers the deleted plan"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    for p in [&a, &b, &worker] {
        let out = p.output();
        assert!(
            !out.contains(pg::PASSWORD),
            "the password shows in a log:\n{out}"
        );
        assert!(
            out.contains(":***@"),
            "the redacted URL is not printed:\n{out}"
        );
    }
}

/// A solve that takes a while: the exact MILP on ResNet50 at 0.7x runs to its time limit
/// (`remat plan` of it takes 9.7 s on the 2-core CI machine).
const SLOW: &str = "budget=0.7x&solver=ilp&time_limit=8";

fn resnet50() -> Vec<u8> {
    graph("ResNet50 (MLSys)_256_(224, 224, 3)")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_solve_loses_its_job_to_another() {
    let db = pg::database().await;
    let replica = Proc::serve(&db, 0, &[]);
    let mut first = Proc::worker(&db, &["--lease", "3"]);
    let model = resnet50();
    let posted = must(
        "POST",
        &format!("{}/v1/plans?{SLOW}&wait=0", replica.url),
        Some(&model),
    )
    .await;
    assert_eq!(posted.status, StatusCode::ACCEPTED, "{}", posted.body);
    let id = posted.body["id"].as_str().unwrap().to_string();
    let url = format!("{}/v1/plans/{id}", replica.url);
    until(&url, Duration::from_secs(30), |v| v["status"] == "solving").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    first.kill();
    assert_eq!(job_row(&db, &id).await, (1, "solving".to_string()));

    // Another worker takes it once the lease runs out, and stores it once.
    let second = Proc::worker(&db, &["--lease", "3"]);
    let done = until(&url, Duration::from_secs(120), |v| {
        v["status"] == "done" || v["status"] == "failed"
    })
    .await;
    assert_eq!(done["status"], "done", "{done}");
    assert_eq!(job_row(&db, &id).await, (2, "done".to_string()));
    assert_eq!(count_jobs(&db).await, 1);
    let again = must("GET", &url, None).await;
    assert_eq!(again.body, done);
    assert!(second.output().contains("claimed"), "{}", second.output());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_keeps_killing_its_workers_fails_with_the_reason() {
    let db = pg::database().await;
    let replica = Proc::serve(&db, 0, &[]);
    let model = resnet50();
    let posted = must(
        "POST",
        &format!("{}/v1/plans?{SLOW}&wait=0", replica.url),
        Some(&model),
    )
    .await;
    let id = posted.body["id"].as_str().unwrap().to_string();
    let url = format!("{}/v1/plans/{id}", replica.url);
    let mut killed = String::new();
    for attempt in 1..=2 {
        let mut w = Proc::worker(&db, &["--lease", "3", "--max-attempts", "2"]);
        let end = Instant::now() + Duration::from_secs(30);
        while job_row(&db, &id).await.0 < attempt {
            assert!(Instant::now() < end, "attempt {attempt} was not claimed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        w.kill();
        killed += &format!("worker {attempt}:\n{}", w.output());
    }
    // The third worker does not run it: the job is failed, with the reason.
    let third = Proc::worker(&db, &["--lease", "3", "--max-attempts", "2"]);
    let failed = match poll(&url, Duration::from_secs(30), |v| v["status"] == "failed").await {
        Ok(v) => v,
        Err(e) => panic!(
            "{e}\nthe job's row (attempts, status): {:?}\nthe workers killed said:\n{killed}the third worker said:\n{}\nthe replica said:\n{}",
            job_row(&db, &id).await,
            third.output(),
            replica.output()
        ),
    };
    assert_eq!(failed["error"]["code"], "worker_lost", "{failed}");
    assert_eq!(failed["error"]["details"]["attempts"], 2);
    assert_eq!(job_row(&db, &id).await.0, 2);
    // A failed job is not reused: posting again makes a new job.
    let again = must(
        "POST",
        &format!("{}/v1/plans?{SLOW}&wait=0", replica.url),
        Some(&model),
    )
    .await;
    assert_ne!(again.body["id"], posted.body["id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_postgres_under_load_answers_503_and_loses_no_job() {
    // A cluster of its own: stopping it must not disturb the other tests.
    let cluster = Cluster::start().unwrap_or_else(|e| panic!("this test needs PostgreSQL: {e}"));
    let db = cluster.database().await;
    let replica = Proc::serve(&db, 1, &["--lease", "5"]);
    let worker = Proc::worker(&db, &["--lease", "5"]);
    let model = Arc::new(vgg16());
    let base = replica.url.clone();

    // Load: posts of new jobs (a budget each) and reads of the first plan, until told to stop.
    let first = must(
        "POST",
        &format!("{base}/v1/plans?budget=0.9x&time_limit=2&wait=120"),
        Some(&model),
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    let first_id = first.body["id"].as_str().unwrap().to_string();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::<(StatusCode, Option<String>, Value)>::new()));
    let accepted = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut load = vec![];
    for client in 0..3 {
        let (stop, seen, accepted, model, base, first_id) = (
            Arc::clone(&stop),
            Arc::clone(&seen),
            Arc::clone(&accepted),
            Arc::clone(&model),
            base.clone(),
            first_id.clone(),
        );
        load.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                n += 1;
                let reply = if client == 0 {
                    let budget = 0.95 - 0.002 * f64::from(n);
                    call(
                        "POST",
                        &format!("{base}/v1/plans?budget={budget:.3}x&time_limit=1&wait=0"),
                        Some(&model),
                    )
                    .await
                } else {
                    call("GET", &format!("{base}/v1/plans/{first_id}"), None).await
                };
                if let Some(r) = reply {
                    if client == 0 && r.status == StatusCode::ACCEPTED {
                        accepted
                            .lock()
                            .unwrap()
                            .push(r.body["id"].as_str().unwrap().to_string());
                    }
                    let retry = r
                        .headers
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    seen.lock().unwrap().push((r.status, retry, r.body));
                }
                let pause = if client == 0 { 400 } else { 50 };
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    // A post whose job is queued before the database goes and which waits across the outage:
    // answered with its job (done, or 202 with its id), never a 503 without one.
    let waiting = {
        let (base, model) = (base.clone(), resnet50());
        tokio::spawn(async move {
            must(
                "POST",
                &format!("{base}/v1/plans?{SLOW}&wait=60"),
                Some(&model),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.pause().unwrap();
    let down_from = seen.lock().unwrap().len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let health = must("GET", &format!("{base}/healthz"), None).await;
    assert_eq!(
        health.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        health.body
    );
    assert_eq!(health.body["database"], false);
    assert!(health.headers.contains_key("retry-after"));
    cluster.resume().unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for l in load {
        l.await.unwrap();
    }

    let waited = waiting.await.unwrap();
    assert!(
        waited.status == StatusCode::CREATED || waited.status == StatusCode::ACCEPTED,
        "{} {}",
        waited.status,
        waited.body
    );
    assert!(waited.body["id"].is_string(), "{}", waited.body);
    let seen = seen.lock().unwrap().clone();
    let unavailable: Vec<_> = seen[down_from..]
        .iter()
        .filter(|(s, _, _)| *s == StatusCode::SERVICE_UNAVAILABLE)
        .collect();
    assert!(
        !unavailable.is_empty(),
        "no 503 while the database was down"
    );
    for (status, retry, body) in seen.iter() {
        assert!(
            status.is_success() || *status == StatusCode::SERVICE_UNAVAILABLE,
            "{status}: {body}"
        );
        if *status == StatusCode::SERVICE_UNAVAILABLE {
            assert!(retry.is_some(), "503 without Retry-After: {body}");
            let code = body["error"]["code"].as_str().unwrap_or("");
            assert!(
                code == "database_unavailable" || code == "queue_full",
                "{body}"
            );
            assert!(!body.to_string().contains(pg::PASSWORD), "{body}");
        }
    }
    // Every job accepted before (or during) the restart completes after it.
    let accepted = accepted.lock().unwrap().clone();
    assert!(!accepted.is_empty());
    for id in &accepted {
        let v = until(
            &format!("{base}/v1/plans/{id}"),
            Duration::from_secs(180),
            |v| v["status"] == "done" || v["status"] == "failed",
        )
        .await;
        assert_eq!(v["status"], "done", "{v}");
    }
    for p in [&replica, &worker] {
        assert!(!p.output().contains(pg::PASSWORD), "{}", p.output());
    }
}

#[test]
fn bad_databases_and_devices_are_refused_with_the_reason_and_no_password() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_remat"))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("running remat");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    // A wrong password, on the shared cluster: the replica does not start, and says why.
    let cluster = pg::shared();
    let wrong = format!(
        "postgres://{}:not-the-{}@127.0.0.1:{}/postgres",
        pg::USER,
        pg::PASSWORD,
        cluster.port
    );
    for args in [
        vec!["serve", "--addr", "127.0.0.1:0", "--db", &wrong],
        vec!["worker", "--db", &wrong],
    ] {
        let command = args[0];
        let (code, text) = run(&args);
        assert_eq!(code, Some(1), "{command}: {text}");
        assert!(
            text.contains("password authentication failed"),
            "{command}: {text}"
        );
        assert!(text.contains(":***@127.0.0.1"), "{command}: {text}");
        assert!(
            !text.contains("not-the-"),
            "{command}: the password shows: {text}"
        );
    }
    // The scheme in any case is PostgreSQL's; a password in the query is redacted too.
    let upper = format!(
        "PostgreSQL://{}:not-the-{}@127.0.0.1:{}/postgres",
        pg::USER,
        pg::PASSWORD,
        cluster.port
    );
    let query = format!(
        "postgres://{}@127.0.0.1:{}/postgres?password=not-the-{}",
        pg::USER,
        cluster.port,
        pg::PASSWORD
    );
    for url in [&upper, &query] {
        let (code, text) = run(&["worker", "--db", url]);
        assert_eq!(code, Some(1), "{url}: {text}");
        assert!(text.contains("password authentication failed"), "{text}");
        assert!(!text.contains("not-the-"), "the password shows: {text}");
    }
    // What is neither a PostgreSQL URL nor a file path is refused before any file is made
    // (a libpq string would be a SQLite file named after the password).
    let dir = tempfile::tempdir().expect("temp folder");
    for db in [
        "postgress://remat:not-the-pw@127.0.0.1/postgres".to_string(),
        format!(
            "host=127.0.0.1 user=remat password=not-the-pw port={}",
            cluster.port
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_remat"))
            .args(["serve", "--addr", "127.0.0.1:0", "--db", &db])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .output()
            .expect("running remat");
        let text = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{db}: {text}");
        assert!(text.contains("--db"), "{text}");
        assert!(!text.contains("not-the-"), "the password shows: {text}");
        let made: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(made.is_empty(), "{db}: files made: {made:?}");
    }
    // A worker of no threads would run nothing.
    for flag in ["--threads=0", "--solver-threads=0"] {
        let (code, text) = run(&["worker", "--db", &cluster.url("postgres"), flag]);
        assert_eq!(code, Some(2), "{flag}: {text}");
        assert!(text.contains("must be at least 1"), "{flag}: {text}");
    }
    // A worker needs PostgreSQL, and a GPU only when built for it.
    let (code, text) = run(&["worker", "--db", "remat.db"]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("needs a PostgreSQL URL"), "{text}");
    let (code, text) = run(&[
        "worker",
        "--db",
        &cluster.url("postgres"),
        "--device",
        "cuda",
    ]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("--device cuda"), "{text}");
    // On SQLite a replica needs workers of its own.
    let (code, text) = run(&[
        "serve",
        "--db",
        "/nonexistent-dir/remat.db",
        "--workers",
        "0",
    ]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("--workers"), "{text}");
    // A pause between looks that is no pause, or not a number, is refused naming the flag.
    for bad in ["0", "-1", "soon", "inf"] {
        let flag = format!("--wait-poll={bad}");
        let (code, text) = run(&["serve", "--addr", "127.0.0.1:0", &flag]);
        assert_eq!(code, Some(2), "{bad}: {text}");
        assert!(
            text.contains("--wait-poll") && text.contains("not a number of seconds above 0"),
            "{bad}: {text}"
        );
    }
    // A cap on the solver's time that no clock holds is refused, not met with a panic later.
    let (code, text) = run(&["serve", "--addr", "127.0.0.1:0", "--max-time-limit=1e30"]);
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("--max-time-limit") && text.contains("1e30 is not a positive number"),
        "{text}"
    );
}

/// A schema edited or damaged since remat made it is refused at start, naming what is
/// missing, not met with queries failing one by one (a job queued forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_schema_is_refused_at_start_naming_what_is_missing() {
    let db = pg::database().await;
    remat_server::http::open_store(&db, 2)
        .await
        .expect("migrates an empty database");
    let (client, connection) = tokio_postgres::connect(&db, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute("ALTER TABLE jobs DROP COLUMN attempts")
        .await
        .unwrap();
    let err = remat_server::http::open_store(&db, 2)
        .await
        .err()
        .expect("a damaged schema is refused")
        .to_string();
    assert!(
        err.contains("lacks column jobs.attempts") && err.contains("restore it"),
        "{err}"
    );
    // The error chain says it once.
    assert_eq!(err.matches("lacks").count(), 1, "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_remat"))
        .args(["worker", "--db", &db])
        .stdin(Stdio::null())
        .output()
        .expect("running remat");
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert_eq!(
        text.matches("lacks column jobs.attempts").count(),
        1,
        "{text}"
    );
}

/// ONNX bytes that are no model are refused by the replica before anything is stored (the
/// models table holds the bytes the workers read; garbage stayed there until a DELETE).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_is_no_model_is_refused_before_it_is_stored() {
    use std::io::{Read, Write};
    let db = pg::database().await;
    let replica = Proc::serve(&db, 0, &[]);
    let body = b"\x08\x07not an onnx model, only bytes".repeat(1000);
    let addr = replica.url.trim_start_matches("http://").to_string();
    let mut conn = std::net::TcpStream::connect(&addr).expect("connects");
    write!(
        conn,
        "POST /v1/plans?budget=0.5x HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    conn.write_all(&body).unwrap();
    let mut reply = String::new();
    conn.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    assert!(reply.contains("\"malformed_model\""), "{reply}");
    let (client, connection) = tokio_postgres::connect(&db, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let models: i64 = client
        .query_one("SELECT count(*) FROM models", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(models, 0, "the bytes were stored");
    assert_eq!(count_jobs(&db).await, 0);
}

/// Posts arriving together on two replicas never queue more jobs than `--queue`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posts_arriving_together_never_pass_the_queue_bound() {
    let db = pg::database().await;
    let a = Proc::serve(&db, 0, &["--queue", "8"]);
    let b = Proc::serve(&db, 0, &["--queue", "8"]);
    let model = Arc::new(vgg16());
    let mut posts = vec![];
    for i in 0..32 {
        let base = if i % 2 == 0 {
            a.url.clone()
        } else {
            b.url.clone()
        };
        let model = Arc::clone(&model);
        posts.push(tokio::spawn(async move {
            let budget = 0.99 - 0.001 * f64::from(i);
            must(
                "POST",
                &format!("{base}/v1/plans?budget={budget:.3}x&wait=0"),
                Some(&model),
            )
            .await
        }));
    }
    let mut accepted = 0;
    for p in posts {
        let r = p.await.unwrap();
        match r.status {
            StatusCode::ACCEPTED => accepted += 1,
            StatusCode::SERVICE_UNAVAILABLE => assert_eq!(r.body["error"]["code"], "queue_full"),
            other => panic!("{other}: {}", r.body),
        }
    }
    assert_eq!(accepted, 8);
    assert_eq!(count_jobs(&db).await, 8);
    // No worker takes them: the age of the oldest queued job grows (what to alert on), by work.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let text = metrics(&a.url).await;
    let age = |work: &str| -> f64 {
        value(
            &text,
            &format!("remat_shared_oldest_queued_seconds{{kind=\"plan\",work=\"{work}\"}}"),
        )
    };
    assert!(age("solve") >= 1.0, "{text}");
    assert_eq!(age("validate"), 0.0, "{text}");
}

/// A worker told twice to stop stops at once and puts the job it ran back in the queue, not
/// counted against its attempts: another worker takes it at once, not when the lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_puts_the_running_job_back_and_stops_at_once() {
    let db = pg::database().await;
    let replica = Proc::serve(&db, 0, &[]);
    // A lease far longer than the test: only a give-back lets the second worker take the job.
    let mut first = Proc::worker(&db, &["--lease", "600"]);
    let posted = must(
        "POST",
        &format!("{}/v1/plans?{SLOW}&wait=0", replica.url),
        Some(&resnet50()),
    )
    .await;
    assert_eq!(posted.status, StatusCode::ACCEPTED, "{}", posted.body);
    let id = posted.body["id"].as_str().unwrap().to_string();
    let url = format!("{}/v1/plans/{id}", replica.url);
    until(&url, Duration::from_secs(30), |v| v["status"] == "solving").await;
    let pid = first.child.id() as libc::pid_t;
    // SAFETY: kill(2) on the child this test started and still holds.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let started = Instant::now();
    let status = loop {
        if let Some(s) = first.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the worker did not stop at once: {}",
            first.output()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(130), "{}", first.output());
    assert!(
        first.output().contains("1 job(s) put back in the queue"),
        "{}",
        first.output()
    );
    assert_eq!(job_row(&db, &id).await, (0, "queued".to_string()));
    let second = Proc::worker(&db, &["--lease", "600"]);
    let done = until(&url, Duration::from_secs(120), |v| {
        v["status"] == "done" || v["status"] == "failed"
    })
    .await;
    assert_eq!(done["status"], "done", "{done}");
    assert_eq!(job_row(&db, &id).await, (1, "done".to_string()));
    drop(second);
}

/// GET `path` on `base`, within `limit` (a request that hangs fails the test).
async fn get_within(
    base: &str,
    path: &str,
    limit: Duration,
    output: &Proc,
) -> (HttpReply, Duration) {
    let started = Instant::now();
    let reply = tokio::time::timeout(limit, call("GET", &format!("{base}{path}"), None))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "GET {path} did not answer within {limit:?}\n{}",
                output.output()
            )
        })
        .unwrap_or_else(|| panic!("GET {path}: no answer\n{}", output.output()));
    (reply, started.elapsed())
}

/// A 503 `database_unavailable` (or `/healthz`'s body saying `database: false`) with
/// `Retry-After`.
fn assert_unavailable(path: &str, reply: &HttpReply) {
    assert_eq!(
        reply.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{path}: {}",
        reply.body
    );
    assert!(
        reply.headers.get("retry-after").is_some(),
        "{path}: 503 without Retry-After: {}",
        reply.body
    );
    if path == "/healthz" {
        assert_eq!(reply.body["database"], false, "{}", reply.body);
        assert_eq!(
            reply.body["status"], "database_unavailable",
            "{}",
            reply.body
        );
        // The shared queue's last figures would be stale.
        assert!(reply.body.get("queue_depth").is_none(), "{}", reply.body);
        assert!(reply.body.get("jobs_running").is_none(), "{}", reply.body);
    } else {
        assert_eq!(
            reply.body["error"]["code"], "database_unavailable",
            "{path}: {}",
            reply.body
        );
    }
    assert!(
        !reply.body.to_string().contains(pg::PASSWORD),
        "{}",
        reply.body
    );
}

/// A database that stops answering without closing its connections (every process of the
/// cluster stopped: a frozen machine, a network cut without a reset) answers 503
/// `database_unavailable` within `REMAT_DB_TIMEOUT`, `/healthz` too: requests that got an
/// idle pooled connection hung (a list 100 s, `/healthz` over 20 s). Once it answers again, so
/// does the replica.
#[tokio::test]
async fn a_database_that_stops_answering_answers_503_within_the_bound() {
    // A cluster of its own: freezing it must not disturb the other tests.
    let cluster = Cluster::start().unwrap_or_else(|e| panic!("this test needs PostgreSQL: {e}"));
    let db = cluster.database().await;
    let replica = Proc::start_env(
        &[
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--db",
            &db,
            "--workers",
            "0",
        ],
        &[("REMAT_DB_TIMEOUT", "2")],
    );
    let base = replica.url.clone();
    // Connections in the pool, idle.
    for path in ["/v1/plans", "/healthz"] {
        let (ok, _) = get_within(&base, path, Duration::from_secs(20), &replica).await;
        assert_eq!(ok.status, StatusCode::OK, "{path}: {}", ok.body);
    }
    {
        let _frozen = cluster.freeze();
        for path in ["/v1/plans", "/healthz", "/v1/plans"] {
            let (reply, took) = get_within(&base, path, Duration::from_secs(20), &replica).await;
            assert_unavailable(path, &reply);
            assert!(took < Duration::from_secs(8), "{path} took {took:?}");
        }
    }
    let back = Instant::now();
    loop {
        let (reply, _) = get_within(&base, "/v1/plans", Duration::from_secs(20), &replica).await;
        if reply.status == StatusCode::OK {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(30),
            "not answering after the database did: {}",
            reply.body
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs `sql` as the shared cluster's superuser.
async fn admin(sql: &str) {
    let (client, connection) =
        tokio_postgres::connect(&pg::shared().url("postgres"), tokio_postgres::NoTls)
            .await
            .expect("connecting to the test cluster");
    let task = tokio::spawn(connection);
    client
        .batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    drop(client);
    let _ = task.await;
}

/// Polls `path` until it answers 503; never 500 meanwhile.
async fn until_unavailable(base: &str, path: &str, replica: &Proc) {
    let started = Instant::now();
    loop {
        let (reply, _) = get_within(base, path, Duration::from_secs(20), replica).await;
        assert_ne!(
            reply.status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "{path}: {}\n{}",
            reply.body,
            replica.output()
        );
        if reply.status == StatusCode::SERVICE_UNAVAILABLE {
            assert_unavailable(path, &reply);
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{path} still answers {}: {}",
            reply.status,
            reply.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A database that refuses new connections for a while, for too many connections (SQLSTATE
/// 53300) or a password rotated under the replica (28P01), is unavailable (503
/// `database_unavailable` with `Retry-After`, `/healthz` `database: false`), not a failed query
/// (500 `internal`).
#[tokio::test]
async fn too_many_connections_and_a_rotated_password_are_unavailable() {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let role = format!(
        "r{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    );
    admin(&format!("CREATE ROLE {role} LOGIN PASSWORD 'first'")).await;
    // Not in one batch: CREATE DATABASE refuses to run in a transaction.
    admin(&format!("CREATE DATABASE {role} OWNER {role}")).await;
    let db = format!(
        "postgres://{role}:first@127.0.0.1:{}/{role}",
        pg::shared().port
    );
    let replica = Proc::serve(&db, 0, &[]);
    let base = replica.url.clone();
    let (ok, _) = get_within(&base, "/v1/plans", Duration::from_secs(20), &replica).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
    let cut =
        format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'");

    // The password rotated: every new connection is refused (28P01).
    admin(&format!("ALTER ROLE {role} PASSWORD 'second'; {cut}")).await;
    until_unavailable(&base, "/v1/plans", &replica).await;
    until_unavailable(&base, "/healthz", &replica).await;

    // Too many connections for the role (53300).
    admin(&format!(
        "ALTER ROLE {role} PASSWORD 'first' CONNECTION LIMIT 0; {cut}"
    ))
    .await;
    until_unavailable(&base, "/v1/plans", &replica).await;
    until_unavailable(&base, "/healthz", &replica).await;

    admin(&format!("ALTER ROLE {role} CONNECTION LIMIT -1")).await;
    let back = Instant::now();
    loop {
        let (reply, _) = get_within(&base, "/v1/plans", Duration::from_secs(20), &replica).await;
        if reply.status == StatusCode::OK {
            break;
        }
        assert!(back.elapsed() < Duration::from_secs(30), "{}", reply.body);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `--db` with its scheme in upper case (accepted in any case) follows deletions and job ends
/// like a lower-case one: the listener connected with the URL as given, which tokio-postgres
/// refuses, and the replica only polled.
#[tokio::test]
async fn an_upper_case_scheme_is_followed_by_the_listener_too() {
    let store = remat_server::http::store::PgStore::new("POSTGRES://u:p@127.0.0.1:1/db", 1)
        .expect("an upper-case scheme parses");
    assert!(store.url().starts_with("postgres://"), "{}", store.url());
    let db = pg::database().await;
    let upper = db.replacen("postgres://", "POSTGRES://", 1);
    let replica = Proc::serve(&upper, 0, &[]);
    let (ok, _) = get_within(&replica.url, "/v1/plans", Duration::from_secs(20), &replica).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let out = replica.output();
    assert!(!out.contains("cannot follow deletions"), "{out}");
}

/// Whether a connection opened as the store opens its own (`PgStore::connect`: the URL's
/// settings, TLS as its `sslmode` says) is encrypted; the error's text when it fails.
async fn encrypted(url: &str) -> Result<bool, String> {
    let store = remat_server::http::store::PgStore::new(url, 1).map_err(|e| e.to_string())?;
    let (client, connection) = store.connect().await.map_err(|e| {
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            text.push_str(&format!(": {s}"));
            source = s.source();
        }
        text
    })?;
    let task = tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .map_err(|e| e.to_string())?;
    drop(client);
    let _ = task.await;
    Ok(row.get(0))
}

/// A database reached over TLS, its certificate checked as libpq's `sslmode` says: before,
/// every connection was plain text (`sslmode=require` failed with "TLS required but not
/// supported", `verify-full` and `sslrootcert` were not read at all). The cluster takes TCP
/// connections over TLS only, with a certificate for `localhost` signed by the test's CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_used_and_the_certificate_checked_as_sslmode_says() {
    let (cluster, tls) = Cluster::start_tls()
        .unwrap_or_else(|e| panic!("this test needs PostgreSQL, which could not be started: {e}"));
    let url = |host: &str, query: &str| {
        format!(
            "postgres://{}:{}@{host}:{}/postgres?{query}",
            pg::USER,
            pg::PASSWORD,
            cluster.port
        )
    };
    let ca = tls.ca.display().to_string();
    let other = tls.other_ca.display().to_string();
    for (host, query) in [
        ("localhost", format!("sslmode=verify-full&sslrootcert={ca}")),
        ("127.0.0.1", format!("sslmode=verify-ca&sslrootcert={ca}")),
        ("127.0.0.1", "sslmode=require".to_string()),
        // libpq's default, prefer: TLS where the server offers it.
        ("127.0.0.1", String::new()),
    ] {
        let url = url(host, &query);
        assert_eq!(encrypted(&url).await, Ok(true), "{url}");
    }
    // The store itself (its pool: the migrations) over verify-full.
    remat_server::http::open_store(
        &url(
            "localhost",
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        ),
        2,
    )
    .await
    .unwrap_or_else(|e| panic!("open_store over TLS: {e}"));
    let refused = [
        // The certificate is for localhost, not for the address connected to.
        (
            url(
                "127.0.0.1",
                &format!("sslmode=verify-full&sslrootcert={ca}"),
            ),
            "not valid for name",
        ),
        // Signed by an authority the URL does not trust.
        (
            url(
                "localhost",
                &format!("sslmode=verify-full&sslrootcert={other}"),
            ),
            "UnknownIssuer",
        ),
        (
            url(
                "127.0.0.1",
                &format!("sslmode=verify-ca&sslrootcert={other}"),
            ),
            "UnknownIssuer",
        ),
        // Plain text to a server that takes TLS only.
        (url("127.0.0.1", "sslmode=disable"), "no encryption"),
        // TLS asked of a server that has none (the shared cluster).
        (
            format!("{}?sslmode=require", pg::shared().url("postgres")),
            "TLS",
        ),
    ];
    for (url, expected) in refused {
        let e = encrypted(&url).await.expect_err(&url);
        assert!(e.contains(expected), "{url}: {e}");
        assert!(!e.contains(pg::PASSWORD), "{e}");
    }
    // A client certificate (`cert` authentication, database certdb): refused without one,
    // taken with sslcert and sslkey, which the server checks against its CA.
    let store =
        remat_server::http::store::PgStore::new(&url("127.0.0.1", "sslmode=require"), 1).unwrap();
    let (client, connection) = store.connect().await.unwrap();
    let task = tokio::spawn(connection);
    client
        .batch_execute("CREATE DATABASE certdb")
        .await
        .unwrap();
    drop(client);
    let _ = task.await;
    let certdb = |query: String| {
        format!(
            "postgres://{}@localhost:{}/certdb?sslmode=verify-full&sslrootcert={ca}{query}",
            pg::USER,
            cluster.port
        )
    };
    let without = encrypted(&certdb(String::new()))
        .await
        .expect_err("no client certificate");
    assert!(without.contains("certificate"), "{without}");
    let with = certdb(format!(
        "&sslcert={}&sslkey={}",
        tls.client_cert.display(),
        tls.client_key.display()
    ));
    assert_eq!(encrypted(&with).await, Ok(true), "{with}");
}

/// A replica and a worker on a database reached over TLS (verify-full): the pool, the
/// listener that hears job ends (which connected in plain text on its own before) and the
/// worker all connect; a waiting post is answered by the notice of its job's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_and_workers_work_over_tls() {
    let (cluster, tls) = Cluster::start_tls()
        .unwrap_or_else(|e| panic!("this test needs PostgreSQL, which could not be started: {e}"));
    let db = format!(
        "postgres://{}:{}@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}",
        pg::USER,
        pg::PASSWORD,
        cluster.port,
        tls.ca.display()
    );
    let a = Proc::serve(&db, 0, &["--wait-poll", "3600"]);
    until_following(&a).await;
    let _worker = Proc::worker(&db, &[]);
    let url = format!("{}/v1/plans?budget=0.9x&time_limit=5&wait=120", a.url);
    let posted = must("POST", &url, Some(&vgg16())).await;
    assert_eq!(posted.status, StatusCode::CREATED, "{}", posted.body);
    assert_eq!(posted.body["status"], "done", "{}", posted.body);
    // A URL whose TLS settings cannot work is the caller's mistake: exit 2, naming it.
    for (command, bad) in [
        ("serve", format!("{db}&sslmode=allow")),
        (
            "worker",
            format!(
                "postgres://{}:{}@localhost:{}/postgres?sslmode=require&sslrootcert=system",
                pg::USER,
                pg::PASSWORD,
                cluster.port
            ),
        ),
    ] {
        let mut args = vec![command, "--db", &bad];
        if command == "serve" {
            args.extend(["--addr", "127.0.0.1:0"]);
        }
        let out = Command::new(env!("CARGO_BIN_EXE_remat"))
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("running remat");
        let text = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command} {bad}: {text}");
        assert!(text.contains("sslmode="), "{text}");
        assert!(!text.contains(pg::PASSWORD), "{text}");
    }
}

/// `remat worker --metrics-addr`: a worker's own jobs on Prometheus (`remat_jobs_total` never
/// appeared anywhere when the replicas run no workers); an address it cannot listen on stops
/// the start, naming the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_serves_its_metrics_when_asked() {
    let db = pg::database().await;
    let replica = Proc::serve(&db, 0, &[]);
    let worker = Proc::worker(&db, &["--metrics-addr", "127.0.0.1:0"]);
    let out = worker.output();
    let metrics_url = out
        .split("metrics on ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no metrics address in: {out}"))
        .to_string();
    let url = format!("{}/v1/plans?budget=0.9x&time_limit=5&wait=120", replica.url);
    let posted = must("POST", &url, Some(&vgg16())).await;
    assert_eq!(posted.body["status"], "done", "{}", posted.body);
    // The worker counts the job once its result is written, which may be after the waiting
    // post heard of it.
    let start = Instant::now();
    loop {
        let r = must("GET", &metrics_url, None).await;
        let text = r.body.as_str().unwrap_or_default().to_string();
        if text
            .lines()
            .any(|l| l == "remat_jobs_total{kind=\"plan\",outcome=\"done\"} 1")
        {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let taken = metrics_url
        .trim_start_matches("http://")
        .trim_end_matches("/metrics")
        .to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_remat"))
        .args(["worker", "--db", &db, "--metrics-addr", &taken])
        .stdin(Stdio::null())
        .output()
        .expect("running remat");
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("--metrics-addr"), "{text}");
}
