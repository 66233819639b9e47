//! `remat serve`: the planning service on the real engine.

use super::common::Failure;
use anyhow::Context;
use clap::Args;
use remat_server::http::store::Takes;
use remat_server::http::{self, Config, Serve, WorkerConfig};
use remat_server::pipeline::Pipeline;
use std::sync::Arc;
use std::time::Duration;

/// `remat serve`: the planning service.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on (loopback by default; give a token before exposing it).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: String,
    /// The plan store: a SQLite file (created if missing), or a PostgreSQL URL
    /// (postgres://user:password@host:port/db) shared by replicas and `remat worker`s.
    #[arg(
        long,
        env = "REMAT_DB",
        hide_env_values = true,
        default_value = "remat.db"
    )]
    pub db: String,
    /// Worker threads that run solves (default: the number of cores). On PostgreSQL, 0 makes a
    /// replica that only serves and leaves the jobs to other replicas and `remat worker`s.
    #[arg(long)]
    pub workers: Option<usize>,
    #[command(flatten)]
    pub lease: LeaseArgs,
    /// Jobs that may wait for a worker; past it a POST answers 503 with Retry-After.
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// Largest request body: bytes or a size such as 512MiB, 2GiB, 100MB.
    #[arg(long, default_value = "512MiB", value_parser = parse_size)]
    pub body_limit: u64,
    /// Bearer token required on writes (POST, DELETE).
    #[arg(long, env = "REMAT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Allow cross-origin requests from this origin (repeatable); CORS is off without it.
    #[arg(long = "cors", value_name = "ORIGIN")]
    pub cors: Vec<String>,
    /// Largest solver time limit (and LP bound time) a request may ask for, in seconds each;
    /// larger ones are clamped.
    #[arg(long, default_value_t = 300.0)]
    pub max_time_limit: f64,
    /// Seconds a request may take before it is answered 408.
    #[arg(long, default_value_t = 600)]
    pub request_timeout: u64,
    /// On PostgreSQL, seconds between a waiting POST's looks at its job while this replica
    /// hears job ends (a worker's last write wakes it at once; the looks catch an end missed
    /// while the listener reconnects, when they are every 0.25 s).
    #[arg(long, default_value_t = 2.0, value_parser = parse_seconds)]
    pub wait_poll: f64,
}

/// Parses a positive, finite number of seconds.
fn parse_seconds(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Ok(s),
        _ => Err(format!(
            "{text:?} is not a number of seconds above 0 (at most a day)"
        )),
    }
}

/// How workers of a shared (PostgreSQL) queue hold their jobs; `remat serve` and `remat worker`.
#[derive(Debug, Clone, Args)]
pub struct LeaseArgs {
    /// Seconds a worker's claim on a job holds without renewal (renewed every third of it);
    /// when a worker dies, another takes its job this long after (PostgreSQL only).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(3..=3600))]
    pub lease: u64,
    /// Claims after which a job whose worker died each time is failed, not retried
    /// (PostgreSQL only).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i32).range(1..=100))]
    pub max_attempts: i32,
}

impl LeaseArgs {
    /// The workers' settings with these leases and `threads` threads taking `takes`.
    pub fn worker_config(&self, threads: usize, takes: Takes) -> WorkerConfig {
        WorkerConfig {
            threads,
            takes,
            lease: Duration::from_secs(self.lease),
            max_attempts: self.max_attempts,
            ..WorkerConfig::default()
        }
    }
}

/// Parses a size of at least one byte: bytes ("1048576", "1e6") or a number with a unit (B,
/// KB, MB, GB, TB, KiB, MiB, GiB, TiB), as a budget is read (`remat_solver::plan::parse_bytes`).
pub fn parse_size(text: &str) -> Result<u64, String> {
    match remat_solver::plan::parse_bytes(text) {
        Ok(0) => Err(format!("size {text:?}: must be at least one byte")),
        Ok(bytes) => Ok(bytes),
        Err(e) => Err(e.to_string()),
    }
}

impl ServeArgs {
    /// The service's settings from the flags (checked when it starts).
    fn settings(&self) -> Serve {
        let defaults = Config::default();
        let workers = self.workers.unwrap_or(defaults.workers);
        Serve {
            addr: self.addr.clone(),
            db: self.db.clone(),
            config: Config {
                workers,
                queue: self.queue,
                body_limit: usize::try_from(self.body_limit).unwrap_or(usize::MAX),
                token: self.token.clone().filter(|t| !t.is_empty()),
                cors: self.cors.clone(),
                request_timeout: Duration::from_secs(self.request_timeout),
                max_time_limit: self.max_time_limit,
                default_wait: defaults.default_wait,
                wait_poll: Duration::from_secs_f64(self.wait_poll),
                shared_workers: self.lease.worker_config(workers, Takes::ALL),
            },
        }
    }
}

/// Serves until Ctrl-C or SIGTERM on an async runtime of its own.
pub fn exec(args: ServeArgs) -> Result<(), Failure> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let stopped = runtime
        .block_on(http::serve(args.settings(), Arc::new(Pipeline::new())))
        .map_err(|e| Failure {
            // A flag out of range, an address that cannot be bound, a store another process
            // owns: the caller's (exit 2, as every subcommand's bad input).
            code: if matches!(
                e,
                http::ServerError::Config { .. }
                    | http::ServerError::Bind { .. }
                    | http::ServerError::OpenStore {
                        error: remat_server::http::store::StoreError::InUse(_)
                            | remat_server::http::store::StoreError::Config(_),
                        ..
                    }
            ) {
                2
            } else {
                1
            },
            error: anyhow::Error::new(e),
        })?;
    super::common::exit_if_gave_back(stopped);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        let cases = [
            ("512MiB", Some(512 * 1024 * 1024)),
            ("1000", Some(1000)),
            ("2GiB", Some(2 * 1024 * 1024 * 1024)),
            ("100MB", Some(100_000_000)),
            ("1.5KiB", Some(1536)),
            ("1e6", Some(1_000_000)),
            ("1TiB", Some(1 << 40)),
            ("12 parsecs", None),
            ("1.5", None),
            ("1e30", None),
            ("", None),
            ("0", None),
            ("MiB", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_size(text).ok(), want, "{text}");
        }
    }
}
