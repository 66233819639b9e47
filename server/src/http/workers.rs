//! Workers of the shared queue (PostgreSQL): threads that claim jobs from the database, run
//! them on the engine and store their outcome, in `remat serve --db postgres://...` (unless
//! `--workers 0`) and in `remat worker`.
//!
//! A worker holds a lease on the job it runs and renews it every third of its length; a worker
//! that dies (SIGKILL, a crash, a lost machine) stops renewing, the lease runs out, and another
//! worker claims the job. Every write names the lease's owner, so a worker that lost its lease
//! writes nothing: a job's result is stored once. While the database is unreachable, a worker
//! keeps what it computed and retries the write until its lease would have run out (as it does
//! while the database refuses connections for a while: too many, a password rotated; see
//! [`super::store::StoreError::is_unavailable`]). A worker
//! whose lease is lost (the job was deleted, or taken by another worker) stops the job at the
//! engine's next look (`remat_solver::Cancel`), at once when the job was deleted through this
//! process ([`Workers::cancel`]).
//!
//! Each worker thread (and the thread that renews its lease) has a small runtime and a database
//! connection of its own, so the workers block on their database calls wherever they are
//! started, inside a service's runtime or not.

use super::error::ErrorObject;
use super::metrics::Metrics;
use super::run::{lower_priority, run_job, stored_document, stored_plans, Recorder, Work};
use super::store::{JobStatus, Kind, Leased, PgStore, StoreError, Takes};
use crate::engine::{Engine, History, ModelFormat, PlanRequest, StoredPlan};
use remat_solver::Cancel;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How the workers run.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Worker threads (jobs run at once). Default: the number of cores.
    pub threads: usize,
    /// Which jobs they take. Default: all.
    pub takes: Takes,
    /// How long a claim holds without renewal. Default: 30 s.
    pub lease: Duration,
    /// Claims after which a job whose worker died each time is failed. Default: 3.
    pub max_attempts: i32,
    /// Pause between two looks at an empty queue. Default: 200 ms.
    pub idle_poll: Duration,
    /// A name for this process's workers in the leases (the host and process id by default).
    pub name: String,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            takes: Takes::ALL,
            lease: Duration::from_secs(30),
            max_attempts: 3,
            idle_poll: Duration::from_millis(200),
            name: default_name(),
        }
    }
}

/// `host:pid`, the default name of a process's workers.
pub fn default_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string());
    format!("{host}:{}", std::process::id())
}

/// The running workers of one process.
pub struct Workers {
    stop: Arc<AtomicBool>,
    count: usize,
    threads: Mutex<Vec<JoinHandle<()>>>,
    shared: Arc<Shared>,
}

struct Shared {
    engine: Arc<dyn Engine>,
    metrics: Arc<Metrics>,
    url: String,
    config: WorkerConfig,
    stop: Arc<AtomicBool>,
    /// When a failure to reach the database was last logged (one line a while, not one a
    /// poll).
    last_complaint: Mutex<Option<Instant>>,
    /// The cancel flag of each job running here.
    running: Mutex<HashMap<String, Cancel>>,
}

/// A thread's own runtime and connection.
struct Db {
    runtime: tokio::runtime::Runtime,
    store: PgStore,
}

impl Db {
    fn open(url: &str) -> Result<Db, StoreError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::Unavailable(format!("starting a worker's runtime: {e}")))?;
        let store = PgStore::new(url, 1)?;
        Ok(Db { runtime, store })
    }

    fn run<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        self.runtime.block_on(f)
    }
}

impl Workers {
    /// Starts `config.threads` workers on the database at `url`.
    pub fn start(
        url: &str,
        engine: Arc<dyn Engine>,
        metrics: Arc<Metrics>,
        config: WorkerConfig,
    ) -> Result<Workers, StoreError> {
        PgStore::new(url, 1)?; // the URL parses
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            engine,
            metrics,
            url: url.to_string(),
            stop: Arc::clone(&stop),
            config: config.clone(),
            last_complaint: Mutex::new(None),
            running: Mutex::new(HashMap::new()),
        });
        let mut threads = vec![];
        for index in 0..config.threads.max(1) {
            let shared = Arc::clone(&shared);
            let owner = format!("{}/{index}", config.name);
            let handle = std::thread::Builder::new()
                .name(format!("remat-worker-{index}"))
                .spawn(move || worker(&shared, &owner))
                .map_err(|e| StoreError::Unavailable(format!("starting worker {index}: {e}")))?;
            threads.push(handle);
        }
        Ok(Workers {
            stop,
            count: threads.len(),
            threads: Mutex::new(threads),
            shared,
        })
    }

    /// Stops job `id` if one of these workers runs it (its record was deleted through this
    /// process); true when one did. A job deleted elsewhere stops when its lease's renewal
    /// finds the record gone, within a third of the lease.
    pub fn cancel(&self, id: &str) -> bool {
        self.shared.running().get(id).map(Cancel::cancel).is_some()
    }

    pub fn count(&self) -> usize {
        self.count
    }

    /// Stops claiming (the jobs running go on).
    pub fn stop_claiming(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Stops claiming and waits for the jobs running to finish and store their outcome
    /// (blocks).
    pub fn stop(&self) {
        self.stop_claiming();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for Workers {
    /// Stops claiming; a job still running finishes on its thread (not waited for).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl Shared {
    fn complain(&self, what: &str, e: &StoreError) {
        let mut last = self
            .last_complaint
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
            tracing::warn!(error = %e, "{what}");
            *last = Some(Instant::now());
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<String, Cancel>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn sleep(&self, d: Duration) {
        let end = Instant::now() + d;
        while !self.stop.load(Ordering::SeqCst) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20).min(end - Instant::now()));
        }
    }
}

fn worker(shared: &Arc<Shared>, owner: &str) {
    lower_priority();
    let db = match Db::open(&shared.url) {
        Ok(db) => db,
        Err(e) => {
            tracing::error!(error = %e, "a worker cannot start");
            return;
        }
    };
    let config = &shared.config;
    while !shared.stop.load(Ordering::SeqCst) {
        let claimed =
            db.run(
                db.store
                    .claim_next(owner, config.takes, config.lease, config.max_attempts),
            );
        match claimed {
            Ok(Some(job)) => run_leased(shared, &db, owner, job),
            Ok(None) => shared.sleep(config.idle_poll),
            Err(e) => {
                shared.complain("cannot claim a job from the database; retrying", &e);
                shared.sleep(Duration::from_secs(1));
            }
        }
    }
}

/// Runs a claimed job with its lease renewed beside it.
fn run_leased(shared: &Arc<Shared>, db: &Db, owner: &str, job: Leased) {
    let recorder = Lease {
        shared,
        db,
        owner,
        id: &job.id,
        held: AtomicBool::new(true),
        running: AtomicBool::new(true),
    };
    shared.metrics.jobs_running.inc();
    let stored = serde_json::from_str::<PlanRequest>(&job.request)
        .map_err(|e| format!("the stored request is unreadable: {e}"))
        .and_then(|request| {
            ModelFormat::parse(&job.model_format)
                .map(|format| (request, format))
                .ok_or_else(|| format!("unknown stored model format {:?}", job.model_format))
        });
    let (request, format) = match stored {
        Ok(read) => read,
        Err(e) => {
            tracing::error!(job = %job.id, error = %e, "the job cannot run");
            recorder.failed(500, &super::run::internal_error());
            return;
        }
    };
    tracing::info!(job = %job.id, attempt = job.attempts, "claimed");
    let done = AtomicBool::new(false);
    let cancel = Cancel::armed();
    shared.running().insert(job.id.clone(), cancel.clone());
    std::thread::scope(|scope| {
        scope.spawn(|| match Db::open(&shared.url) {
            Ok(renewer) => renew(
                shared,
                &renewer,
                owner,
                &job.id,
                &done,
                &recorder.running,
                &recorder.held,
                &cancel,
            ),
            Err(e) => tracing::error!(job = %job.id, error = %e, "cannot renew the lease"),
        });
        let work = Work {
            id: &job.id,
            kind: job.kind,
            model: &job.model,
            format,
            request: &request,
            history: &Stored {
                db,
                model_hash: &job.model_hash,
                job: &job.id,
            },
            cancel: &cancel,
        };
        run_job(&*shared.engine, &shared.metrics, &work, &recorder);
        done.store(true, Ordering::SeqCst);
    });
    shared.running().remove(&job.id);
    recorder.ended();
}

/// Renews the lease every third of its length until the job is done; a lost lease (the job
/// was deleted, or another worker took it) raises the job's `cancel`: nothing it computes
/// could be stored. The lease is renewed while the outcome is written too (a write retried
/// through an outage, a large result); a renewal that finds no lease once the outcome is known
/// (`running` false: it is being stored, or was, which releases the lease) stops quietly: the
/// write itself says when the lease was lost before it.
#[allow(clippy::too_many_arguments)]
fn renew(
    shared: &Shared,
    db: &Db,
    owner: &str,
    id: &str,
    done: &AtomicBool,
    running: &AtomicBool,
    held: &AtomicBool,
    cancel: &Cancel,
) {
    let every = shared.config.lease / 3;
    let mut next = Instant::now() + every;
    while !done.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
        if Instant::now() < next {
            continue;
        }
        next = Instant::now() + every;
        match db.run(db.store.renew(id, owner, shared.config.lease)) {
            Ok(true) => {}
            Ok(false) if done.load(Ordering::SeqCst) || !running.load(Ordering::SeqCst) => return,
            Ok(false) => {
                if held.swap(false, Ordering::SeqCst) {
                    tracing::warn!(job = id, "the lease was lost (the job was deleted or taken by another worker): the job stops, its outcome would not be stored here");
                }
                cancel.cancel();
            }
            Err(e) => shared.complain("cannot renew a lease; retrying", &e),
        }
    }
}

/// Records a job of the shared queue in the database under the worker's lease.
struct Lease<'a> {
    shared: &'a Shared,
    db: &'a Db,
    owner: &'a str,
    id: &'a str,
    held: AtomicBool,
    /// Counted in `jobs_running` until its outcome is known (before it is stored, so a client
    /// that sees the outcome sees the gauge without it).
    running: AtomicBool,
}

impl Lease<'_> {
    fn ended(&self) {
        if self.running.swap(false, Ordering::SeqCst) {
            self.shared.metrics.jobs_running.dec();
        }
    }

    /// Runs a write that names the lease's owner, retrying while the database is unreachable
    /// and the lease could still be ours.
    fn write<F, Fut>(&self, what: &str, f: F)
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<bool, StoreError>>,
    {
        let give_up = Instant::now() + self.shared.config.lease;
        let mut pause = Duration::from_millis(100);
        loop {
            match self.db.run(f()) {
                Ok(true) => return,
                Ok(false) => {
                    if self.held.swap(false, Ordering::SeqCst) {
                        tracing::warn!(
                            job = self.id,
                            "{what}: the job is no longer this worker's; nothing stored"
                        );
                    }
                    return;
                }
                Err(e) if e.is_unavailable() && Instant::now() < give_up => {
                    self.shared.complain(
                        &format!("{what}: the database is unreachable; retrying"),
                        &e,
                    );
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    tracing::error!(job = self.id, error = %e, "{what}: not stored; the lease will run out and another worker retry it");
                    return;
                }
            }
        }
    }
}

/// The plans of a job's model in the shared database, read on the worker's connection.
struct Stored<'a> {
    db: &'a Db,
    model_hash: &'a str,
    job: &'a str,
}

impl History for Stored<'_> {
    fn plans(&self) -> Vec<StoredPlan> {
        stored_plans(
            self.db.run(self.db.store.history(self.model_hash)),
            self.job,
        )
    }

    fn document(&self, id: &str) -> Option<serde_json::Value> {
        stored_document(self.db.run(self.db.store.get(Kind::Plan, id)), self.job, id)
    }
}

impl Recorder for Lease<'_> {
    fn phase(&self, status: JobStatus) {
        if status == JobStatus::Solving {
            return; // claiming set it
        }
        let store = &self.db.store;
        self.write("recording the phase", || {
            store.set_phase(self.id, self.owner, status)
        });
    }

    fn done(&self, document: &str, summary: Option<&str>) {
        self.ended();
        let store = &self.db.store;
        self.write("storing the result", || {
            store.finish(self.id, self.owner, document, summary)
        });
    }

    fn failed(&self, status: u16, error: &ErrorObject) {
        self.ended();
        let store = &self.db.store;
        self.write("storing the error", || {
            store.fail(self.id, self.owner, status, error)
        });
    }
}
