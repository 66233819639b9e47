//! Load test of the planning service on loopback.
//!
//! Starts the service as `remat serve` processes on 127.0.0.1: one on a temporary SQLite store
//! (`--store sqlite`, `--workers` threads: by default one per core, as `remat serve` has), or `--replicas` replicas that only serve plus
//! `--pg-workers` `remat worker` processes on one throwaway PostgreSQL cluster
//! (`--store postgres`; the tests' cluster code, `tests/it/pg.rs`). Clients spread their
//! requests over the replicas as a load balancer would. It seeds it with plans of the training graphs in `../shared/bench/graphs`, then runs `--readers`
//! clients that read stored plans (`GET /v1/plans/{id}`, each one request every `--interval-ms`)
//! and `--writers` clients that post models (`POST /v1/plans` with a random graph and budget,
//! one every `--write-interval-ms`) for `--seconds`. Every response other than 2xx (and a
//! deliberate 503 from the full queue) counts as an error; the run fails if there is one.
//! It stops by itself: after `--seconds`, or after `--max-requests` in all.
//!
//! The engine is the real planning pipeline (`Pipeline::new()`); the budgets posted lie between
//! 0.9x and 1.0x of the store-all peak, where every graph has a plan, so a 4xx is a bug; each
//! solve is limited to 2 s (`time_limit=2`).
//!
//! Solves completed: the jobs the writers created (201/202) that are done when the run ends.
//!
//!     cargo bench -p remat-server --bench load -- --seconds 10
//!     cargo bench -p remat-server --bench load -- --seconds 10 --store postgres --replicas 3 --pg-workers 2

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

struct Options {
    seconds: f64,
    readers: usize,
    writers: usize,
    interval_ms: u64,
    write_interval_ms: u64,
    workers: usize,
    queue: usize,
    max_requests: u64,
    graphs: std::path::PathBuf,
    postgres: bool,
    replicas: usize,
    pg_workers: usize,
    solver_threads: usize,
}

fn parse_options() -> Result<Options, String> {
    let mut o = Options {
        seconds: 60.0,
        readers: 200,
        writers: 10,
        interval_ms: 100,
        write_interval_ms: 200,
        // As `remat serve` starts one replica: a worker per core.
        workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
        queue: 16,
        max_requests: 10_000_000,
        graphs: std::path::PathBuf::from(
            std::env::var_os("CARGO_MANIFEST_DIR")
                .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into()),
        )
        .join("../../shared/bench/graphs"),
        postgres: false,
        replicas: 3,
        pg_workers: 2,
        solver_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let flag = args[i].as_str();
        if flag == "--bench" {
            i += 1;
            continue;
        }
        let value = args
            .get(i + 1)
            .ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag {
            "--seconds" => o.seconds = value.parse().map_err(|e| bad(&e))?,
            "--readers" => o.readers = value.parse().map_err(|e| bad(&e))?,
            "--writers" => o.writers = value.parse().map_err(|e| bad(&e))?,
            "--interval-ms" => o.interval_ms = value.parse().map_err(|e| bad(&e))?,
            "--write-interval-ms" => o.write_interval_ms = value.parse().map_err(|e| bad(&e))?,
            "--workers" => o.workers = value.parse().map_err(|e| bad(&e))?,
            "--queue" => o.queue = value.parse().map_err(|e| bad(&e))?,
            "--max-requests" => o.max_requests = value.parse().map_err(|e| bad(&e))?,
            "--graphs" => o.graphs = value.into(),
            "--store" => {
                o.postgres = match value.as_str() {
                    "sqlite" => false,
                    "postgres" => true,
                    other => return Err(format!("--store {other}: sqlite or postgres")),
                }
            }
            "--replicas" => o.replicas = value.parse().map_err(|e| bad(&e))?,
            "--pg-workers" => o.pg_workers = value.parse().map_err(|e| bad(&e))?,
            "--solver-threads" => o.solver_threads = value.parse().map_err(|e| bad(&e))?,
            other => return Err(format!("unknown flag {other}")),
        }
        i += 2;
    }
    if !(o.seconds > 0.0 && o.seconds <= 3600.0) {
        return Err("--seconds must be in (0, 3600]".to_string());
    }
    Ok(o)
}

#[derive(Default)]
struct Tally {
    latencies_us: Mutex<Vec<u64>>,
    by_status: Mutex<std::collections::BTreeMap<u16, u64>>,
    errors: AtomicU64,
    rejected: AtomicU64,
    /// Posts answered with their finished job (201): microseconds from the job's `updated_at`
    /// (when its worker stored it) to the answer's arrival, the time a waiting post takes to
    /// hear of the result.
    after_finish_us: Mutex<Vec<u64>>,
}

impl Tally {
    fn record(&self, status: u16, micros: u64) {
        self.latencies_us.lock().unwrap().push(micros);
        *self.by_status.lock().unwrap().entry(status).or_default() += 1;
    }
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)] as f64 / 1000.0
}

fn report(name: &str, tally: &Tally, seconds: f64) -> bool {
    let mut l = tally.latencies_us.lock().unwrap().clone();
    l.sort_unstable();
    let statuses: Vec<String> = tally
        .by_status
        .lock()
        .unwrap()
        .iter()
        .map(|(s, n)| format!("{s}: {n}"))
        .collect();
    let errors = tally.errors.load(Ordering::SeqCst);
    println!(
        "| {name} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {errors} |",
        l.len(),
        l.len() as f64 / seconds,
        percentile(&l, 50.0),
        percentile(&l, 90.0),
        percentile(&l, 99.0),
        l.last().map_or(f64::NAN, |m| *m as f64 / 1000.0),
        statuses.join(", "),
    );
    errors == 0
}

/// The upper bounds (ms) of the histogram buckets holding the 50th and 99th percentiles of one
/// route's server-side request time (`remat_http_request_seconds`, every method together).
fn server_quantiles(metrics: &str, route: &str) -> (String, String) {
    let prefix = format!("remat_http_request_seconds_bucket{{route=\"{route}\",le=\"");
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    for line in metrics.lines() {
        if let Some(rest) = line.strip_prefix(&prefix) {
            if let Some((le, count)) = rest.split_once("\"} ") {
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap_or(f64::NAN)
                };
                buckets.push((le, count.trim().parse().unwrap_or(0.0)));
            }
        }
    }
    let total = buckets.last().map_or(0.0, |b| b.1);
    let bound = |q: f64| {
        buckets
            .iter()
            .find(|(_, c)| *c >= q * total)
            .map_or("n/a".to_string(), |(le, _)| format!("{}", le * 1000.0))
    };
    (bound(0.5), bound(0.99))
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

async fn request(
    client: &HttpClient,
    method: &str,
    uri: &str,
    body: Option<Bytes>,
) -> Result<(u16, Bytes), String> {
    let mut b = hyper::Request::builder().method(method).uri(uri);
    if body.is_some() {
        b = b.header("content-type", "application/json");
    }
    let req = b
        .body(Full::new(body.unwrap_or_default()))
        .map_err(|e| e.to_string())?;
    let resp = client.request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, bytes))
}

fn main() {
    let o = match parse_options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("load: {e}");
            std::process::exit(2);
        }
    };
    let mut graphs: Vec<(String, Bytes)> = Vec::new();
    let entries = std::fs::read_dir(&o.graphs)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", o.graphs.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        if name.ends_with("_train_nx.json") {
            graphs.push((name, Bytes::from(std::fs::read(&path).expect("graph"))));
        }
    }
    graphs.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(
        !graphs.is_empty(),
        "no *_train_nx.json in {}",
        o.graphs.display()
    );

    // The service: `remat serve` processes (and `remat worker`s on PostgreSQL).
    let dir = tempfile::tempdir().unwrap();
    let _cluster;
    let mut procs: Vec<Proc> = Vec::new();
    let queue = o.queue.to_string();
    if o.postgres {
        let cluster = pg::Cluster::start().unwrap_or_else(|e| panic!("PostgreSQL: {e}"));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let db = rt.block_on(cluster.database());
        for _ in 0..o.replicas.max(1) {
            procs.push(Proc::serve(&db, "0", &queue));
        }
        let solver_threads = o.solver_threads.to_string();
        for _ in 0..o.pg_workers {
            procs.push(Proc::start(&[
                "worker",
                "--db",
                &db,
                "--threads",
                "1",
                "--solver-threads",
                &solver_threads,
            ]));
        }
        _cluster = Some(cluster);
    } else {
        let db = dir.path().join("load.db").display().to_string();
        let workers = o.workers.to_string();
        procs.push(Proc::serve(&db, &workers, &queue));
        _cluster = None;
    }
    let bases: Vec<String> = procs.iter().filter_map(|p| p.url.clone()).collect();
    let base = bases[0].clone();
    let bases = Arc::new(bases);

    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let ok = client_rt.block_on(async {
        let client: HttpClient = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(1024).build_http();
        // Seed: every train graph at two budgets.
        let mut ids = Vec::new();
        let mut plan_bytes = Vec::new();
        for (name, body) in &graphs {
            for budget in ["0.9x", "1.0x"] {
                let uri = format!("{base}/v1/plans?budget={budget}&time_limit=2&wait=300&name={}", name.replace(' ', "%20").replace(['(', ')', ','], ""));
                let (status, bytes) = request(&client, "POST", &uri, Some(body.clone())).await.expect("seed");
                assert!(status == 201 || status == 200, "seeding {name}: {status} {}", String::from_utf8_lossy(&bytes));
                let v: serde_json::Value = serde_json::from_slice(&bytes).expect("seed JSON");
                ids.push(v["id"].as_str().expect("id").to_string());
                plan_bytes.push(bytes.len());
            }
        }
        println!(
            "seeded {} plans of {} graphs (plan documents {}..{} bytes); {} readers every {} ms, {} writers every {} ms, {} s, {}, queue {}",
            ids.len(),
            graphs.len(),
            plan_bytes.iter().min().unwrap_or(&0),
            plan_bytes.iter().max().unwrap_or(&0),
            o.readers,
            o.interval_ms,
            o.writers,
            o.write_interval_ms,
            o.seconds,
            if o.postgres {
                format!("PostgreSQL: {} replica(s) without workers, {} `remat worker --threads 1`", o.replicas.max(1), o.pg_workers)
            } else {
                format!("SQLite: one replica with {} worker(s)", o.workers)
            },
            o.queue
        );
        let ids = Arc::new(ids);
        let graphs = Arc::new(graphs);
        let reads = Arc::new(Tally::default());
        let writes = Arc::new(Tally::default());
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let created = Arc::new(Mutex::new(Vec::<String>::new()));
        let started = Instant::now();
        let deadline = started + Duration::from_secs_f64(o.seconds);
        let mut tasks = Vec::new();
        for r in 0..o.readers {
            let (client, ids, tally, stop, sent, base) = (client.clone(), ids.clone(), reads.clone(), stop.clone(), sent.clone(), bases[r % bases.len()].clone());
            let interval = Duration::from_millis(o.interval_ms);
            let max = o.max_requests;
            tasks.push(tokio::spawn(async move {
                // Spread the readers over the interval.
                tokio::time::sleep(interval.mul_f64(r as f64 / 200.0 % 1.0)).await;
                let mut tick = tokio::time::interval(interval.max(Duration::from_micros(1)));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut n = r;
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline && sent.fetch_add(1, Ordering::Relaxed) < max {
                    if !interval.is_zero() {
                        tick.tick().await;
                    }
                    n = n.wrapping_mul(31).wrapping_add(7);
                    let uri = format!("{base}/v1/plans/{}", ids[n % ids.len()]);
                    let t0 = Instant::now();
                    match request(&client, "GET", &uri, None).await {
                        Ok((status, _)) => {
                            tally.record(status, t0.elapsed().as_micros() as u64);
                            if status != 200 {
                                tally.errors.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(e) => {
                            eprintln!("read error: {e}");
                            tally.errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }));
        }
        for w in 0..o.writers {
            let (client, graphs, tally, stop, sent, base, created) = (client.clone(), graphs.clone(), writes.clone(), stop.clone(), sent.clone(), bases[w % bases.len()].clone(), created.clone());
            let interval = Duration::from_millis(o.write_interval_ms);
            let max = o.max_requests;
            tasks.push(tokio::spawn(async move {
                let mut n: usize = w * 7919 + 1;
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline && sent.fetch_add(1, Ordering::Relaxed) < max {
                    tokio::time::sleep(interval).await;
                    n = n.wrapping_mul(1_103_515_245).wrapping_add(12_345) % (1 << 31);
                    let (name, body) = &graphs[n % graphs.len()];
                    // Budgets from a grid of 50 fractions: some repeat (200 from the store), some are new (a job).
                    let fraction = 0.9 + (n / graphs.len() % 50) as f64 * 0.002;
                    let uri = format!("{base}/v1/plans?budget={fraction:.3}x&time_limit=2&wait=5&name={}", name.len());
                    let t0 = Instant::now();
                    match request(&client, "POST", &uri, Some(body.clone())).await {
                        Ok((status, bytes)) => {
                            tally.record(status, t0.elapsed().as_micros() as u64);
                            match status {
                                201 | 202 => {
                                    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) {
                                        if let Some(id) = v["id"].as_str() {
                                            created.lock().unwrap().push(id.to_string());
                                        }
                                        let finished = v["updated_at"].as_str().and_then(|t| humantime::parse_rfc3339(t).ok());
                                        if let (201, Some(finished)) = (status, finished) {
                                            let after = std::time::SystemTime::now().duration_since(finished).unwrap_or_default();
                                            tally.after_finish_us.lock().unwrap().push(after.as_micros() as u64);
                                        }
                                    }
                                }
                                200 => {}
                                503 => {
                                    tally.rejected.fetch_add(1, Ordering::Relaxed);
                                }
                                _ => {
                                    eprintln!("post {status}: {}", String::from_utf8_lossy(&bytes));
                                    tally.errors.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                        Err(e) => {
                            eprintln!("post error: {e}");
                            tally.errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }));
        }
        for t in tasks {
            t.await.expect("client task");
        }
        stop.store(true, Ordering::SeqCst);
        let seconds = started.elapsed().as_secs_f64();
        println!();
        println!("| requests | count | req/s | p50 ms | p90 ms | p99 ms | max ms | statuses | errors |");
        println!("|---|---:|---:|---:|---:|---:|---:|---|---:|");
        let r_ok = report("GET /v1/plans/{id} (stored plan)", &reads, seconds);
        let w_ok = report("POST /v1/plans (graph JSON)", &writes, seconds);
        println!();
        println!("deliberate 503s (queue full): {}", writes.rejected.load(Ordering::SeqCst));
        let mut after = writes.after_finish_us.lock().unwrap().clone();
        after.sort_unstable();
        println!(
            "posts answered with their finished job (201): {}, from the job's end to the answer p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms",
            after.len(),
            percentile(&after, 50.0),
            percentile(&after, 90.0),
            after.last().map_or(f64::NAN, |m| *m as f64 / 1000.0),
        );
        if o.postgres {
            // What ended each waiting post's wait, over every replica (the seeding posts too).
            let mut ended_by = [("already", 0u64), ("notice", 0), ("look", 0), ("timeout", 0), ("shutdown", 0)];
            for b in bases.iter() {
                let (_, m) = request(&client, "GET", &format!("{b}/metrics"), None).await.expect("metrics");
                let text = String::from_utf8_lossy(&m);
                for (by, n) in ended_by.iter_mut() {
                    let name = format!("remat_shared_waits_total{{ended_by=\"{by}\"}} ");
                    *n += text.lines().find_map(|l| l.strip_prefix(&name)).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
                }
            }
            let parts: Vec<String> = ended_by.iter().map(|(by, n)| format!("{by} {n}")).collect();
            println!("waiting posts ended by (every replica, the seeding posts included): {}", parts.join(", "));
        }
        // Solves completed: the jobs the writers created that are done now.
        let created = created.lock().unwrap().clone();
        let mut done = 0;
        for id in &created {
            if let Ok((200, bytes)) = request(&client, "GET", &format!("{base}/v1/plans/{id}"), None).await {
                let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
                if v["status"] == "done" {
                    done += 1;
                }
            }
        }
        println!(
            "solves: {} jobs created by the writers, {done} done at the end of the run: {:.1} per minute",
            created.len(),
            done as f64 * 60.0 / seconds
        );
        let (_, metrics) = request(&client, "GET", &format!("{base}/metrics"), None).await.expect("metrics");
        let text = String::from_utf8_lossy(&metrics);
        for route in ["/v1/plans/{id}", "/v1/plans"] {
            let (p50, p99) = server_quantiles(&text, route);
            println!("server-side latency of {route} (histogram bucket bounds): p50 <= {p50} ms, p99 <= {p99} ms");
        }
        r_ok && w_ok
    });
    drop(procs);
    if !ok {
        eprintln!("load: errors other than deliberate 503s");
        std::process::exit(1);
    }
}

#[path = "../tests/it/pg.rs"]
mod pg;

/// A `remat` process; killed when dropped.
struct Proc {
    child: Child,
    /// A replica's base URL.
    url: Option<String>,
}

impl Proc {
    /// `remat serve` on a free loopback port.
    fn serve(db: &str, workers: &str, queue: &str) -> Proc {
        Proc::start(&[
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--db",
            db,
            "--workers",
            workers,
            "--queue",
            queue,
        ])
    }

    fn start(args: &[&str]) -> Proc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_remat"))
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting remat");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = lines
            .next()
            .and_then(Result::ok)
            .unwrap_or_else(|| panic!("remat {args:?} did not start"));
        // The rest of its stdout, drained so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        let url = line
            .strip_prefix("remat serve: ")
            .map(|rest| rest.split('/').take(3).collect::<Vec<_>>().join("/"));
        Proc { child, url }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
