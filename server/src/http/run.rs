//! One job run on the engine, wherever it is queued: its phases reported, its document or
//! error recorded, a panic caught (the worker carries on), its timings observed. The embedded
//! queue ([`super::jobs`]) and the shared one ([`super::workers`]) record through a
//! [`Recorder`] of their own.

use super::error::{public_error, ErrorObject, INTERNAL_MESSAGE};
use super::metrics::Metrics;
use super::store::{JobStatus, Kind, Record, Row};
use crate::engine::{Engine, ErrorKind, History, ModelFormat, Phase, PlanRequest, StoredPlan};
use remat_solver::Cancel;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;
use std::time::Instant;

/// Where a job's progress and outcome go.
pub trait Recorder {
    /// The job entered a phase (`solving`, `validating`).
    fn phase(&self, status: JobStatus);
    /// The engine's document (JSON) and its summary.
    fn done(&self, document: &str, summary: Option<&str>);
    /// The job failed with `error` (HTTP `status`).
    fn failed(&self, status: u16, error: &ErrorObject);
}

/// What a job runs.
pub struct Work<'a> {
    pub id: &'a str,
    pub kind: Kind,
    pub model: &'a [u8],
    pub format: ModelFormat,
    pub request: &'a PlanRequest,
    /// The plans the store holds of the model (a plan reuses or beats those that fit).
    pub history: &'a dyn History,
    /// Raised when the job is deleted: the engine stops at its next look.
    pub cancel: &'a Cancel,
}

/// The rows of a model's history a new plan may reuse: finished plans other than the job
/// itself, with readable options and summaries. A store that could not answer gives none (the
/// log says why): the plan is made without them.
pub fn stored_plans(read: Result<Vec<Row>, impl std::fmt::Display>, job: &str) -> Vec<StoredPlan> {
    let rows = match read {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(job, error = %e, "cannot read the model's earlier plans; planning without them");
            return Vec::new();
        }
    };
    rows.into_iter()
        .filter(|r| r.status == JobStatus::Done && r.id != job)
        .filter_map(|r| {
            let request = serde_json::from_str::<PlanRequest>(&r.options).ok()?;
            let summary = serde_json::from_str(r.summary.as_deref()?).ok()?;
            Some(StoredPlan {
                id: r.id,
                request,
                summary,
            })
        })
        .collect()
}

/// The document of a stored plan [`stored_plans`] listed; `None` when it is gone, unreadable or
/// the store could not answer (logged).
pub fn stored_document(
    read: Result<Option<Record>, impl std::fmt::Display>,
    job: &str,
    plan: &str,
) -> Option<serde_json::Value> {
    match read {
        Ok(record) => serde_json::from_str(&record?.result?).ok(),
        Err(e) => {
            tracing::warn!(job, plan, error = %e, "cannot read an earlier plan");
            None
        }
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

/// The error a job gets when the engine panics or its document cannot be serialized.
pub fn internal_error() -> ErrorObject {
    ErrorObject {
        code: "internal".to_string(),
        message: INTERNAL_MESSAGE.to_string(),
        details: serde_json::Value::Null,
    }
}

/// Runs `work` on `engine`, reporting to `recorder`; returns the final status.
pub fn run_job(
    engine: &dyn Engine,
    metrics: &Metrics,
    work: &Work<'_>,
    recorder: &dyn Recorder,
) -> JobStatus {
    let span = tracing::info_span!("job", id = work.id, kind = work.kind.as_str());
    let _enter = span.enter();
    recorder.phase(JobStatus::Solving);

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
        recorder.phase(status);
    };
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // Deleted while it waited in the queue: nothing to run.
        if work.cancel.is_cancelled() {
            return Err(crate::engine::EngineError::cancelled());
        }
        match work.kind {
            Kind::Plan => engine.plan(
                work.model,
                work.format,
                work.request,
                work.history,
                &progress,
                work.cancel,
            ),
            Kind::Sweep => engine.sweep(work.model, work.format, work.request, work.cancel),
        }
    }));
    let ended = Instant::now();
    let validating = *validating_since.lock().unwrap_or_else(|p| p.into_inner());
    let solve_end = validating.unwrap_or(ended);
    metrics
        .solve_seconds
        .with_label_values(&[work.kind.as_str()])
        .observe(solve_end.duration_since(started).as_secs_f64());
    if let Some(since) = validating {
        metrics
            .validation_seconds
            .observe(ended.duration_since(since).as_secs_f64());
    }

    // The outcome is counted before it is recorded: recording it wakes whoever waits on the
    // job, who may read `/metrics` next and must find the job there.
    let cancelled = matches!(&outcome, Ok(Err(e)) if e.kind == ErrorKind::Cancelled);
    let recorded: Result<(String, Option<String>), (u16, ErrorObject)> = match outcome {
        Ok(Ok(document)) => {
            let summary = crate::engine::summarize(&document).map(|s| s.to_string());
            match serde_json::to_string(&document) {
                Ok(text) => {
                    tracing::info!(
                        seconds = ended.duration_since(started).as_secs_f64(),
                        "job done"
                    );
                    Ok((text, summary))
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot serialize the engine's document");
                    Err((500, internal_error()))
                }
            }
        }
        Ok(Err(err)) => {
            let (status, error) = public_error(&err);
            if cancelled {
                tracing::info!(
                    seconds = ended.duration_since(started).as_secs_f64(),
                    "job cancelled (deleted while it ran or waited)"
                );
            } else {
                tracing::info!(code = %err.code, status = status.as_u16(), "job failed");
            }
            Err((status.as_u16(), error))
        }
        Err(payload) => {
            tracing::error!(panic = %panic_message(payload.as_ref()), "the engine panicked");
            Err((500, internal_error()))
        }
    };
    let (final_status, outcome_label) = match &recorded {
        Ok(_) => (JobStatus::Done, "done"),
        Err(_) if cancelled => (JobStatus::Failed, "cancelled"),
        Err(_) => (JobStatus::Failed, "failed"),
    };
    metrics
        .jobs
        .with_label_values(&[work.kind.as_str(), outcome_label])
        .inc();
    match recorded {
        Ok((text, summary)) => recorder.done(&text, summary.as_deref()),
        Err((status, error)) => recorder.failed(status, &error),
    }
    final_status
}

/// Nice value of the worker threads: solves are CPU bound and may take minutes, requests must
/// stay fast on a machine with few cores, so the scheduler favours the async runtime's threads.
/// Not `SCHED_IDLE`: that class starves a solve for as long as anything else keeps the cores
/// busy (docs/bench/load.md), where nice 10 still leaves it about a tenth of a core.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
const WORKER_NICE: i32 = 10;

/// Lowers the calling thread's scheduling priority (Linux: `setpriority` with `who = 0` applies
/// to the calling thread only; threads it spawns, such as the MILP solver's, inherit it).
pub fn lower_priority() {
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

#[cfg(test)]
mod tests {
    #[cfg(target_os = "linux")]
    #[test]
    fn a_worker_thread_and_the_threads_it_spawns_run_at_nice_10() {
        // SAFETY: getpriority(PRIO_PROCESS, 0) only reads the calling thread's nice value.
        let nice = || unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        let before = nice();
        let (own, child) = std::thread::spawn(move || {
            super::lower_priority();
            (nice(), std::thread::spawn(nice).join().unwrap())
        })
        .join()
        .unwrap();
        // Raising a nice value is always allowed; lowering one (a caller above 10) may not be.
        assert!(
            own == super::WORKER_NICE || (before > super::WORKER_NICE && own == before),
            "the worker thread's nice value: {own} (the caller's {before})"
        );
        assert_eq!(child, own, "a thread the worker spawned");
        assert_eq!(nice(), before, "the caller's thread is left as it was");
    }
}
