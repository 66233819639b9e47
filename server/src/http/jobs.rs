//! The embedded job queue (the SQLite store's): a bounded queue in memory feeding a fixed pool
//! of worker threads that run the (blocking, CPU-bound) engine off the async runtime.
//!
//! A job that returns an error or panics is stored as failed with its error; the worker and the
//! server carry on. Waiters (a POST with `wait`) follow a job through a `watch` channel. A job
//! deleted while it waits or runs is cancelled ([`Jobs::cancel`]): a worker skips it, or the
//! engine stops at its next look.

use super::error::ErrorObject;
use super::metrics::Metrics;
use super::run::{lower_priority, run_job, stored_document, stored_plans, Recorder, Work};
use super::store::{JobStatus, Kind, SqliteStore};
use crate::engine::{Engine, History, ModelFormat, PlanRequest, StoredPlan};
use remat_solver::Cancel;
use std::collections::HashMap;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// One unit of work.
pub struct Job {
    pub id: String,
    pub kind: Kind,
    pub model: axum::body::Bytes,
    pub format: ModelFormat,
    pub request: PlanRequest,
    /// The model's hash, which its earlier plans are stored under.
    pub model_hash: String,
}

/// Why a job was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// The queue holds `--queue` jobs already.
    QueueFull,
    /// The workers are gone (the server is shutting down).
    Stopped,
}

/// What workers share.
struct Shared {
    engine: Arc<dyn Engine>,
    store: Arc<SqliteStore>,
    metrics: Arc<Metrics>,
    watchers: Mutex<HashMap<String, watch::Sender<JobStatus>>>,
    /// The cancel flag of each job queued or running.
    cancels: Mutex<HashMap<String, Cancel>>,
}

/// The queue and its workers.
pub struct Jobs {
    sender: SyncSender<Job>,
    shared: Arc<Shared>,
    workers: usize,
}

impl Jobs {
    /// Starts `workers` threads behind a queue of `queue` waiting jobs.
    pub fn start(
        engine: Arc<dyn Engine>,
        store: Arc<SqliteStore>,
        metrics: Arc<Metrics>,
        workers: usize,
        queue: usize,
    ) -> Result<Jobs, (usize, std::io::Error)> {
        let (sender, receiver) = sync_channel::<Job>(queue);
        let receiver = Arc::new(Mutex::new(receiver));
        let shared = Arc::new(Shared {
            engine,
            store,
            metrics,
            watchers: Mutex::new(HashMap::new()),
            cancels: Mutex::new(HashMap::new()),
        });
        let workers = workers.max(1);
        for index in 0..workers {
            let receiver = Arc::clone(&receiver);
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("remat-worker-{index}"))
                .spawn(move || worker(&receiver, &shared))
                .map_err(|e| (index, e))?;
        }
        Ok(Jobs {
            sender,
            shared,
            workers,
        })
    }

    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Makes job `id` followable before its record is claimed in the store, so that an
    /// identical request that finds the record can always follow it. The claimer then calls
    /// [`Jobs::submit`], or [`Jobs::forget`] when it did not create the job.
    pub fn announce(&self, id: &str) {
        self.watchers()
            .insert(id.to_string(), watch::channel(JobStatus::Queued).0);
        self.shared
            .cancels()
            .insert(id.to_string(), Cancel::armed());
    }

    /// Drops the watcher of a job that was announced but not submitted.
    pub fn forget(&self, id: &str) {
        self.watchers().remove(id);
        self.shared.cancels().remove(id);
    }

    /// Queues a job whose record is already in the store. The returned receiver follows its
    /// status until it is done or failed.
    pub fn submit(&self, job: Job) -> Result<watch::Receiver<JobStatus>, Rejected> {
        let id = job.id.clone();
        let rx = self
            .watchers()
            .entry(id.clone())
            .or_insert_with(|| watch::channel(JobStatus::Queued).0)
            .subscribe();
        self.shared.metrics.queue_depth.inc();
        self.shared
            .cancels()
            .entry(id.clone())
            .or_insert_with(Cancel::armed);
        match self.sender.try_send(job) {
            Ok(()) => Ok(rx),
            Err(e) => {
                self.shared.metrics.queue_depth.dec();
                self.watchers().remove(&id);
                self.shared.cancels().remove(&id);
                Err(match e {
                    TrySendError::Full(_) => Rejected::QueueFull,
                    TrySendError::Disconnected(_) => Rejected::Stopped,
                })
            }
        }
    }

    /// Stops job `id` (its record was deleted): a worker that takes it from the queue skips
    /// it, a worker running it sees the flag at the engine's next look. False when the job is
    /// not queued or running here.
    pub fn cancel(&self, id: &str) -> bool {
        self.shared.cancels().get(id).map(Cancel::cancel).is_some()
    }

    /// Follows a job in flight; `None` when it is not (any more) in flight.
    pub fn follow(&self, id: &str) -> Option<watch::Receiver<JobStatus>> {
        self.watchers().get(id).map(watch::Sender::subscribe)
    }

    fn watchers(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Sender<JobStatus>>> {
        self.shared
            .watchers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

impl Shared {
    fn cancels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Cancel>> {
        self.cancels.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn worker(receiver: &Mutex<Receiver<Job>>, shared: &Shared) {
    lower_priority();
    loop {
        let next = receiver.lock().unwrap_or_else(|p| p.into_inner()).recv();
        let Ok(job) = next else {
            return;
        };
        shared.metrics.queue_depth.dec();
        shared.metrics.jobs_running.inc();
        let cancel = shared.cancels().get(&job.id).cloned().unwrap_or_default();
        let status = if shared.store.is_closed() {
            // The server has shut down: the next run marks this job interrupted.
            JobStatus::Failed
        } else {
            let work = Work {
                id: &job.id,
                kind: job.kind,
                model: &job.model,
                format: job.format,
                request: &job.request,
                history: &Stored {
                    store: &shared.store,
                    model_hash: &job.model_hash,
                    job: &job.id,
                },
                cancel: &cancel,
            };
            let recorder = Local {
                shared,
                id: &job.id,
            };
            run_job(&*shared.engine, &shared.metrics, &work, &recorder)
        };
        shared.cancels().remove(&job.id);
        shared.metrics.jobs_running.dec();
        notify(shared, &job.id, status);
    }
}

fn notify(shared: &Shared, id: &str, status: JobStatus) {
    let mut watchers = shared.watchers.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(tx) = watchers.get(id) {
        tx.send_replace(status);
    }
    if status.is_terminal() {
        watchers.remove(id);
    }
}

fn log_store_error(id: &str, result: Result<(), rusqlite::Error>) {
    if let Err(e) = result {
        tracing::error!(job = id, error = %e, "cannot record the job in the plan store");
    }
}

/// The plans of a job's model in the SQLite file.
struct Stored<'a> {
    store: &'a SqliteStore,
    model_hash: &'a str,
    job: &'a str,
}

impl History for Stored<'_> {
    fn plans(&self) -> Vec<StoredPlan> {
        stored_plans(self.store.history(self.model_hash), self.job)
    }

    fn document(&self, id: &str) -> Option<serde_json::Value> {
        stored_document(self.store.get(Kind::Plan, id), self.job, id)
    }
}

/// Records a job of the embedded queue in the SQLite file and tells its waiters.
struct Local<'a> {
    shared: &'a Shared,
    id: &'a str,
}

impl Recorder for Local<'_> {
    fn phase(&self, status: JobStatus) {
        log_store_error(self.id, self.shared.store.set_status(self.id, status));
        notify(self.shared, self.id, status);
    }

    fn done(&self, document: &str, summary: Option<&str>) {
        log_store_error(
            self.id,
            self.shared.store.finish(self.id, document, summary),
        );
    }

    fn failed(&self, status: u16, error: &ErrorObject) {
        log_store_error(self.id, self.shared.store.fail(self.id, status, error));
    }
}
