//! The job machinery: a bounded queue feeding a fixed pool of worker threads that run the
//! (blocking, CPU-bound) engine off the async runtime.
//!
//! A job that returns an error or panics is stored as failed with its error; the worker and the
//! server carry on. Waiters (a POST with `wait`) follow a job through a `watch` channel.

use super::error::{public_error, ErrorObject, INTERNAL_MESSAGE};
use super::metrics::Metrics;
use super::store::{JobStatus, Kind, Store};
use crate::engine::{Engine, ModelFormat, Phase, PlanRequest};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::watch;

/// One unit of work.
pub struct Job {
    pub id: String,
    pub kind: Kind,
    pub model: axum::body::Bytes,
    pub format: ModelFormat,
    pub request: PlanRequest,
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
    store: Arc<Store>,
    metrics: Arc<Metrics>,
    watchers: Mutex<HashMap<String, watch::Sender<JobStatus>>>,
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
        store: Arc<Store>,
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
    }

    /// Drops the watcher of a job that was announced but not submitted.
    pub fn forget(&self, id: &str) {
        self.watchers().remove(id);
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
        match self.sender.try_send(job) {
            Ok(()) => Ok(rx),
            Err(e) => {
                self.shared.metrics.queue_depth.dec();
                self.watchers().remove(&id);
                Err(match e {
                    TrySendError::Full(_) => Rejected::QueueFull,
                    TrySendError::Disconnected(_) => Rejected::Stopped,
                })
            }
        }
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

/// Nice value of the worker threads: solves are CPU bound and may take minutes, requests must
/// stay fast on a machine with few cores, so the scheduler favours the async runtime's threads.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
const WORKER_NICE: i32 = 10;

/// Lowers the calling thread's scheduling priority (Linux: `setpriority` with `who = 0` applies
/// to the calling thread only; threads it spawns, such as the MILP solver's, inherit it).
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: setpriority only reads its integer arguments; failure is reported through the
        // return value, which we may ignore (the worker then runs at the default priority).
        let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, WORKER_NICE) };
        if rc != 0 {
            tracing::warn!("could not lower the worker thread's priority");
        }
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
        let status = run(&job, shared);
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

/// A panic's message, for the log.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Runs one job and records its outcome; returns the final status (the caller notifies).
fn run(job: &Job, shared: &Shared) -> JobStatus {
    let id = job.id.as_str();
    if shared.store.is_closed() {
        // The server has shut down: the next run marks this job interrupted.
        return JobStatus::Failed;
    }
    let span = tracing::info_span!("job", id, kind = job.kind.as_str());
    let _enter = span.enter();
    log_store_error(id, shared.store.set_status(id, JobStatus::Solving));
    notify(shared, id, JobStatus::Solving);

    let started = Instant::now();
    let validating_since: Mutex<Option<Instant>> = Mutex::new(None);
    let progress = |phase: Phase| {
        let status = match phase {
            Phase::Solving => JobStatus::Solving,
            Phase::Validating => {
                let mut since = validating_since.lock().unwrap_or_else(|p| p.into_inner());
                if since.is_none() {
                    *since = Some(Instant::now());
                }
                JobStatus::Validating
            }
        };
        log_store_error(id, shared.store.set_status(id, status));
        notify(shared, id, status);
    };
    let outcome = catch_unwind(AssertUnwindSafe(|| match job.kind {
        Kind::Plan => shared
            .engine
            .plan(&job.model, job.format, &job.request, &progress),
        Kind::Sweep => shared.engine.sweep(&job.model, job.format, &job.request),
    }));
    let ended = Instant::now();
    let validating = *validating_since.lock().unwrap_or_else(|p| p.into_inner());
    let solve_end = validating.unwrap_or(ended);
    shared
        .metrics
        .solve_seconds
        .with_label_values(&[job.kind.as_str()])
        .observe(solve_end.duration_since(started).as_secs_f64());
    if let Some(since) = validating {
        shared
            .metrics
            .validation_seconds
            .observe(ended.duration_since(since).as_secs_f64());
    }

    let final_status = match outcome {
        Ok(Ok(document)) => {
            let summary = summarize(&document).map(|s| s.to_string());
            match serde_json::to_string(&document) {
                Ok(text) => {
                    log_store_error(id, shared.store.finish(id, &text, summary.as_deref()));
                    tracing::info!(
                        seconds = ended.duration_since(started).as_secs_f64(),
                        "job done"
                    );
                    JobStatus::Done
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot serialize the engine's document");
                    log_store_error(id, shared.store.fail(id, 500, &internal_error()));
                    JobStatus::Failed
                }
            }
        }
        Ok(Err(err)) => {
            let (status, error) = public_error(&err);
            tracing::info!(code = %err.code, status = status.as_u16(), "job failed");
            log_store_error(id, shared.store.fail(id, status.as_u16(), &error));
            JobStatus::Failed
        }
        Err(payload) => {
            tracing::error!(panic = %panic_message(payload.as_ref()), "the engine panicked");
            log_store_error(id, shared.store.fail(id, 500, &internal_error()));
            JobStatus::Failed
        }
    };
    let outcome_label = if final_status == JobStatus::Done {
        "done"
    } else {
        "failed"
    };
    shared
        .metrics
        .jobs
        .with_label_values(&[job.kind.as_str(), outcome_label])
        .inc();
    final_status
}

fn internal_error() -> ErrorObject {
    ErrorObject {
        code: "internal".to_string(),
        message: INTERNAL_MESSAGE.to_string(),
        details: serde_json::Value::Null,
    }
}

/// The summary figures of an engine document: its own `summary` object when it has one, else
/// the headline fields of a plan report (budget, store-all peak, predicted peak and overhead,
/// solver and its status, gap, minimum feasible budget).
pub fn summarize(document: &serde_json::Value) -> Option<serde_json::Value> {
    if let Some(summary) = document.get("summary") {
        return Some(summary.clone());
    }
    let doc = document.as_object()?;
    let mut out = serde_json::Map::new();
    let top = [
        "budget_bytes",
        "store_all_peak_bytes",
        "solver",
        "status",
        "gap",
        "min_feasible_budget_bytes",
    ];
    for key in top {
        if let Some(v) = doc.get(key) {
            out.insert(key.to_string(), v.clone());
        }
    }
    if let Some(predicted) = doc.get("predicted") {
        for key in ["peak_bytes", "overhead", "compute_cost"] {
            if let Some(v) = predicted.get(key) {
                out.insert(key.to_string(), v.clone());
            }
        }
    }
    (!out.is_empty()).then_some(serde_json::Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::summarize;
    use serde_json::json;

    #[test]
    fn summaries_prefer_the_engines_own_and_else_pick_the_report_headlines() {
        let own = json!({"summary": {"peak": 1}, "budget_bytes": 5});
        assert_eq!(summarize(&own), Some(json!({"peak": 1})));
        let report = json!({
            "status": "optimal", "solver": "dp", "budget_bytes": 100, "store_all_peak_bytes": 160,
            "gap": null, "predicted": {"peak_bytes": 96, "overhead": 0.2, "compute_cost": 12.0, "memory": [1, 2]},
            "schedule": [], "decisions": []
        });
        assert_eq!(
            summarize(&report),
            Some(json!({
                "status": "optimal", "solver": "dp", "budget_bytes": 100, "store_all_peak_bytes": 160,
                "gap": null, "peak_bytes": 96, "overhead": 0.2, "compute_cost": 12.0
            }))
        );
        assert_eq!(summarize(&json!([1, 2])), None);
        assert_eq!(summarize(&json!({"points": []})), None);
    }
}
