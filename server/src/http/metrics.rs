//! Prometheus metrics: requests by route and status, request latency, job queue depth, jobs
//! running, histograms of solve and validation seconds, job reads by where the answer came from
//! (the response cache or the store); on PostgreSQL also the shared
//! queue, per kind, as the database has it at the scrape (waiting, running, the oldest lease's
//! age) and whether the database answers.

use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    pub requests: IntCounterVec,
    pub request_seconds: HistogramVec,
    pub queue_depth: IntGauge,
    pub jobs_running: IntGauge,
    pub jobs: IntCounterVec,
    pub solve_seconds: HistogramVec,
    pub validation_seconds: Histogram,
    /// `GET` of a job by how it was answered: `hit` (the rendered-response cache), `joined`
    /// (waited for another request's read of the same job, then the cache), `read` (the store).
    pub job_reads: IntCounterVec,
    /// PostgreSQL: POSTs that waited for their job, by what ended the wait: `already` (it had
    /// ended before the post looked), `notice` (its end, heard), `look` (a later look at the
    /// database found it ended: a notice missed), `timeout` (the wait ran out: 202), `shutdown`.
    pub waits: IntCounterVec,
    /// Shared queue (PostgreSQL): jobs waiting, by kind.
    pub shared_queued: IntGaugeVec,
    /// Shared queue: jobs a worker (of any process) holds, by kind.
    pub shared_running: IntGaugeVec,
    /// Shared queue: seconds since the oldest running job of a kind was claimed.
    pub shared_oldest_lease: GaugeVec,
    pub shared_oldest_queued: GaugeVec,
    /// Shared queue: 1 when the database answered the scrape's query, else 0.
    pub database_up: IntGauge,
}

const SOLVE_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];
const REQUEST_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0,
];

impl Metrics {
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new_custom(Some("remat".to_string()), None)?;
        let requests = IntCounterVec::new(
            Opts::new(
                "http_requests_total",
                "HTTP requests by route, method and status",
            ),
            &["route", "method", "status"],
        )?;
        let request_seconds = HistogramVec::new(
            HistogramOpts::new("http_request_seconds", "HTTP request latency by route")
                .buckets(REQUEST_BUCKETS.to_vec()),
            &["route"],
        )?;
        let queue_depth = IntGauge::new("job_queue_depth", "Jobs waiting for a worker")?;
        let jobs_running = IntGauge::new("jobs_running", "Jobs a worker is running")?;
        let jobs = IntCounterVec::new(
            Opts::new("jobs_total", "Finished jobs by kind and outcome"),
            &["kind", "outcome"],
        )?;
        let solve_seconds = HistogramVec::new(
            HistogramOpts::new(
                "solve_seconds",
                "Seconds spent planning (import, cost model, solver)",
            )
            .buckets(SOLVE_BUCKETS.to_vec()),
            &["kind"],
        )?;
        let validation_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "validation_seconds",
                "Seconds spent running the executor on a plan",
            )
            .buckets(SOLVE_BUCKETS.to_vec()),
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(request_seconds.clone()))?;
        registry.register(Box::new(queue_depth.clone()))?;
        registry.register(Box::new(jobs_running.clone()))?;
        registry.register(Box::new(jobs.clone()))?;
        registry.register(Box::new(solve_seconds.clone()))?;
        registry.register(Box::new(validation_seconds.clone()))?;
        let job_reads = IntCounterVec::new(
            Opts::new(
                "job_reads_total",
                "GET of a plan or sweep job by where its answer came from (hit, joined, read)",
            ),
            &["outcome"],
        )?;
        registry.register(Box::new(job_reads.clone()))?;
        // Every outcome shows from the start (at 0), so a ratio of them is defined at once.
        for outcome in ["hit", "joined", "read"] {
            job_reads.with_label_values(&[outcome]);
        }
        let waits = IntCounterVec::new(
            Opts::new(
                "shared_waits_total",
                "POSTs that waited for their job on the shared queue, by what ended the wait (already, notice, look, timeout, shutdown)",
            ),
            &["ended_by"],
        )?;
        registry.register(Box::new(waits.clone()))?;
        for ended_by in ["already", "notice", "look", "timeout", "shutdown"] {
            waits.with_label_values(&[ended_by]);
        }
        let shared_queued = IntGaugeVec::new(
            Opts::new(
                "shared_queue_depth",
                "Jobs waiting in the shared (PostgreSQL) queue",
            ),
            &["kind"],
        )?;
        let shared_running = IntGaugeVec::new(
            Opts::new(
                "shared_jobs_running",
                "Jobs held by a worker of the shared queue",
            ),
            &["kind"],
        )?;
        let shared_oldest_lease = GaugeVec::new(
            Opts::new(
                "shared_oldest_lease_seconds",
                "Seconds since the oldest running job of the shared queue was claimed",
            ),
            &["kind"],
        )?;
        let shared_oldest_queued = GaugeVec::new(
            Opts::new(
                "shared_oldest_queued_seconds",
                "Seconds since the oldest job waiting in the shared queue was posted, by kind and by work (solve: plan only; validate: plan and run it); one that grows says no worker takes that work",
            ),
            &["kind", "work"],
        )?;
        let database_up = IntGauge::new(
            "database_up",
            "Whether the plan store's database (the embedded SQLite file, or the shared queue's PostgreSQL) answered the last scrape",
        )?;
        registry.register(Box::new(shared_queued.clone()))?;
        registry.register(Box::new(shared_running.clone()))?;
        registry.register(Box::new(shared_oldest_lease.clone()))?;
        registry.register(Box::new(shared_oldest_queued.clone()))?;
        registry.register(Box::new(database_up.clone()))?;
        Ok(Metrics {
            registry,
            requests,
            request_seconds,
            queue_depth,
            jobs_running,
            jobs,
            solve_seconds,
            validation_seconds,
            job_reads,
            waits,
            shared_queued,
            shared_running,
            shared_oldest_lease,
            shared_oldest_queued,
            database_up,
        })
    }

    /// Sets the shared-queue gauges from the database's figures (every kind that has none is
    /// 0), or marks the database down.
    pub fn set_shared(&self, stats: Option<&[crate::http::store::QueueStats]>) {
        let Some(stats) = stats else {
            self.database_up.set(0);
            return;
        };
        self.database_up.set(1);
        // This process has no queue of its own: its depth is the shared one's.
        self.queue_depth.set(stats.iter().map(|s| s.queued).sum());
        for kind in ["plan", "sweep"] {
            let s = stats.iter().find(|s| s.kind == kind);
            self.shared_queued
                .with_label_values(&[kind])
                .set(s.map_or(0, |s| s.queued));
            self.shared_running
                .with_label_values(&[kind])
                .set(s.map_or(0, |s| s.running));
            self.shared_oldest_lease
                .with_label_values(&[kind])
                .set(s.map_or(0.0, |s| s.oldest_lease_seconds));
            for (i, work) in ["solve", "validate"].into_iter().enumerate() {
                self.shared_oldest_queued
                    .with_label_values(&[kind, work])
                    .set(s.map_or(0.0, |s| s.oldest_queued_seconds[i]));
            }
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> Result<(String, String), prometheus::Error> {
        let encoder = TextEncoder::new();
        let text = encoder.encode_to_string(&self.registry.gather())?;
        Ok((encoder.format_type().to_string(), text))
    }
}
