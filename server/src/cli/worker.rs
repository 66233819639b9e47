//! `remat worker`: a process without HTTP that takes jobs from the shared (PostgreSQL) queue
//! of `remat serve --db postgres://...` replicas, so solves spread over machines and
//! validations run where the GPUs are.

use super::common::{DeviceArg, Failure};
use super::serve::LeaseArgs;
use anyhow::Context;
use clap::Args;
use remat_exec::ExecDevice;
use remat_server::http::store::{is_postgres_url, redact, Takes};
use remat_server::http::{self, metrics::Metrics, Workers};
use remat_server::pipeline::Pipeline;
use std::sync::Arc;

/// `remat worker`: solves and validates jobs of the shared queue.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// The shared plan store (postgres://user:password@host:port/db), as the replicas have it.
    #[arg(long, env = "REMAT_DB", hide_env_values = true)]
    pub db: String,
    /// Take the jobs that only plan (no validation). With neither --solve nor --validate, the
    /// worker takes both kinds.
    #[arg(long)]
    pub solve: bool,
    /// Take the jobs that also run the plan on the executor (`validate: true`).
    #[arg(long)]
    pub validate: bool,
    /// The executor's device for validations and measured costs; a worker given cuda checks
    /// at start that it can open the GPU.
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    pub device: DeviceArg,
    /// Jobs this worker runs at once, at least 1 (default: the number of cores).
    #[arg(long, value_parser = at_least_one)]
    pub threads: Option<usize>,
    /// Threads each exact solve may use, at least 1 (default: the number of cores).
    #[arg(long, value_parser = at_least_one)]
    pub solver_threads: Option<usize>,
    /// Serve this worker's Prometheus metrics (`GET /metrics`: its jobs by kind and outcome,
    /// solve and validation times, jobs running) on this address, e.g. 0.0.0.0:9464 (port 0:
    /// any free port, printed). Off by default: a worker serves no HTTP.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<String>,
    #[command(flatten)]
    pub lease: LeaseArgs,
}

/// A count of threads: a whole number of at least 1 (0 would run nothing).
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1 (0 threads would run nothing)".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a whole number")),
    }
}

impl WorkerArgs {
    fn takes(&self) -> Takes {
        if !self.solve && !self.validate {
            Takes::ALL
        } else {
            Takes {
                solve: self.solve,
                validate: self.validate,
            }
        }
    }
}

/// Works until Ctrl-C or SIGTERM, then finishes the jobs it runs and stores their outcome.
pub fn exec(args: WorkerArgs) -> Result<(), Failure> {
    http::init_logging("info");
    if !is_postgres_url(&args.db) {
        return Err(Failure::new(
            2,
            format!(
                "--db {}: remat worker needs a PostgreSQL URL (postgres://...); a SQLite store's \
                 jobs run inside its one `remat serve`",
                redact(&args.db)
            ),
        ));
    }
    let device: ExecDevice = args.device.into();
    if device == ExecDevice::Cuda {
        device
            .open()
            .map_err(|e| Failure::new(2, format!("--device cuda: {e}")))?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let failed = |e: http::ServerError| Failure {
        // A URL whose TLS settings cannot work is the caller's (exit 2), as for `serve`.
        code: if matches!(
            e,
            http::ServerError::OpenStore {
                error: remat_server::http::store::StoreError::Config(_),
                ..
            }
        ) {
            2
        } else {
            1
        },
        error: anyhow::Error::new(e),
    };
    // Migrates the schema, as a replica does, so workers may start first.
    runtime
        .block_on(http::open_store(&args.db, 1))
        .map_err(failed)?;
    let mut pipeline = Pipeline::new();
    if let Some(threads) = args.solver_threads {
        pipeline.threads = threads.max(1);
    }
    pipeline.device = device;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
        .max(1);
    let config = args.lease.worker_config(threads, args.takes());
    let config_name = config.name.clone();
    let metrics = Arc::new(Metrics::new().context("metrics registry")?);
    // Bound before the workers start, so a port in use fails the start (exit 2), not later.
    let metrics_listener = match &args.metrics_addr {
        None => None,
        Some(addr) => Some(
            runtime
                .block_on(tokio::net::TcpListener::bind(addr.as_str()))
                .and_then(|l| Ok((l.local_addr()?, l)))
                .map_err(|e| {
                    Failure::new(2, format!("--metrics-addr {addr}: cannot listen: {e}"))
                })?,
        ),
    };
    let workers = Workers::start(&args.db, Arc::new(pipeline), Arc::clone(&metrics), config)
        .map_err(|e| failed(http::ServerError::Store(e)))?;
    let serving = metrics_listener.map(|(addr, listener)| {
        runtime.spawn(serve_metrics(listener, Arc::clone(&metrics)));
        format!("; metrics on http://{addr}/metrics")
    });
    let takes = args.takes();
    println!(
        "remat worker: {} thread(s) on {} taking {} jobs, device {}{}",
        workers.count(),
        redact(&args.db),
        match (takes.solve, takes.validate) {
            (true, true) => "plan and validation",
            (true, false) => "plan-only",
            _ => "validation",
        },
        device.name(),
        serving.unwrap_or_default()
    );
    runtime.block_on(http::shutdown_signal());
    println!(
        "remat worker: stopping; the jobs running finish first (a second Ctrl-C or SIGTERM puts \
         them back in the queue and stops at once)"
    );
    let workers = Arc::new(workers);
    let draining = Arc::clone(&workers);
    let stopped = runtime.block_on(http::drain_or_give_back(
        &args.db,
        &config_name,
        move || draining.stop(),
    ));
    super::common::exit_if_gave_back(stopped);
    Ok(())
}

/// `GET /metrics` of a worker (the Prometheus text of its registry); every other path is 404.
async fn serve_metrics(listener: tokio::net::TcpListener, metrics: Arc<Metrics>) {
    use axum::http::{header, StatusCode};
    use axum::response::IntoResponse;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = Arc::clone(&metrics);
            async move {
                match metrics.render() {
                    Ok((content_type, text)) => {
                        ([(header::CONTENT_TYPE, content_type)], text).into_response()
                    }
                    Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
                }
            }
        }),
    );
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "the metrics endpoint stopped");
    }
}
