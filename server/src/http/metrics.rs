//! Prometheus metrics: requests by route and status, request latency, job queue depth, jobs
//! running, and histograms of solve and validation seconds.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
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
        Ok(Metrics {
            registry,
            requests,
            request_seconds,
            queue_depth,
            jobs_running,
            jobs,
            solve_seconds,
            validation_seconds,
        })
    }

    /// The text exposition format.
    pub fn render(&self) -> Result<(String, String), prometheus::Error> {
        let encoder = TextEncoder::new();
        let text = encoder.encode_to_string(&self.registry.gather())?;
        Ok((encoder.format_type().to_string(), text))
    }
}
