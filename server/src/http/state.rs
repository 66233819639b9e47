//! What every handler shares ([`AppState`]: the engine, the store, the job queue, metrics and
//! the settings) and the settings themselves ([`Config`]).
//!
//! The queue is the store's: on SQLite the embedded one ([`Jobs`]), on PostgreSQL the
//! database, where this process's workers ([`Workers`], none with `--workers 0`) and any
//! `remat worker` claim the jobs.

use super::cache::Rendered;
use super::failure::ServerError;
use super::jobs::Jobs;
use super::metrics::Metrics;
use super::notices::Ended;
use super::options::Caps;
use super::store::Store;
use super::workers::{WorkerConfig, Workers};
use crate::engine::Engine;
use axum::http::HeaderValue;
use std::sync::Arc;
use std::time::Duration;

/// Settings of the service.
#[derive(Debug, Clone)]
pub struct Config {
    /// Worker threads of this process (on PostgreSQL 0 serves only; `remat worker`s work).
    pub workers: usize,
    /// Jobs that may wait for a worker; past it a POST answers 503 with `Retry-After`.
    pub queue: usize,
    pub body_limit: usize,
    pub token: Option<String>,
    pub cors: Vec<String>,
    pub request_timeout: Duration,
    pub max_time_limit: f64,
    /// How long a POST waits for its job when the request does not say.
    pub default_wait: Duration,
    /// On PostgreSQL, while this replica hears job ends (`notices.rs`): the pause between a
    /// waiting POST's looks at its job. The notice wakes it at once; the looks are for an end
    /// the listener missed while it reconnected.
    pub wait_poll: Duration,
    /// How this process's workers of a shared queue run (PostgreSQL only).
    pub shared_workers: WorkerConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            queue: 64,
            body_limit: 512 * 1024 * 1024,
            token: None,
            cors: Vec::new(),
            request_timeout: Duration::from_secs(600),
            max_time_limit: 300.0,
            default_wait: Duration::from_secs(30),
            wait_poll: Duration::from_secs(2),
            shared_workers: WorkerConfig::default(),
        }
    }
}

impl Config {
    /// Checks the settings `remat serve` takes from its flags; the error names the flag.
    /// `shared`: the store is PostgreSQL, where a replica may serve without workers.
    pub fn check(&self, shared: bool) -> Result<(), ServerError> {
        if self.workers == 0 && !shared {
            return Err(ServerError::Config {
                option: "workers",
                message: "needs at least one worker (only a PostgreSQL store may have replicas that only serve)".to_string(),
            });
        }
        if !crate::pipeline::valid_seconds(self.max_time_limit, false) {
            return Err(ServerError::Config {
                option: "max-time-limit",
                message: format!(
                    "{} is not a positive number of seconds up to a year ({})",
                    crate::pipeline::seconds_text(self.max_time_limit),
                    crate::pipeline::MAX_SECONDS
                ),
            });
        }
        if self.wait_poll.is_zero() {
            return Err(ServerError::Config {
                option: "wait-poll",
                message: "must be more than 0 seconds".to_string(),
            });
        }
        if self.request_timeout.is_zero() {
            return Err(ServerError::Config {
                option: "request-timeout",
                message: "must be at least one second".to_string(),
            });
        }
        Ok(())
    }
}

/// Where the jobs of this process wait.
pub(super) enum Queue {
    /// The SQLite store's: in memory, run by this process's threads.
    Local(Jobs),
    /// PostgreSQL's: in the database; `workers` are this process's (none when it only serves).
    Shared { workers: Option<Workers> },
}

pub(super) struct Inner {
    pub(super) engine: Arc<dyn Engine>,
    pub(super) store: Store,
    pub(super) queue: Queue,
    pub(super) metrics: Arc<Metrics>,
    pub(super) config: Config,
    pub(super) caps: Caps,
    pub(super) cors: Vec<HeaderValue>,
    pub(super) rendered: Arc<Rendered>,
    /// Jobs that ended on any process (PostgreSQL; heard by `notices::follow`).
    pub(super) ended: Arc<Ended>,
    pub(super) shutting_down: tokio::sync::watch::Sender<bool>,
}

/// What every handler shares: the engine, the store, the job queue, metrics and settings.
#[derive(Clone)]
pub struct AppState {
    pub(super) inner: Arc<Inner>,
}

impl AppState {
    /// Starts the workers (the embedded queue's, or this process's on the shared queue) and
    /// makes the state for [`super::app`].
    pub fn new(
        engine: Arc<dyn Engine>,
        store: Store,
        config: Config,
    ) -> Result<AppState, ServerError> {
        let cors = config
            .cors
            .iter()
            .map(|origin| {
                HeaderValue::from_str(origin).map_err(|e| ServerError::Config {
                    option: "cors",
                    message: format!("{origin:?} is not a valid origin: {e}"),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let metrics = Arc::new(Metrics::new()?);
        let queue = match &store {
            Store::Sqlite(sqlite) => Queue::Local(
                Jobs::start(
                    Arc::clone(&engine),
                    Arc::clone(sqlite),
                    Arc::clone(&metrics),
                    config.workers,
                    config.queue,
                )
                .map_err(|(index, source)| ServerError::Worker { index, source })?,
            ),
            Store::Postgres(pg) => Queue::Shared {
                workers: if config.workers == 0 {
                    None
                } else {
                    let worker_config = WorkerConfig {
                        threads: config.workers,
                        ..config.shared_workers.clone()
                    };
                    Some(
                        Workers::start(
                            pg.url(),
                            Arc::clone(&engine),
                            Arc::clone(&metrics),
                            worker_config,
                        )
                        .map_err(ServerError::Store)?,
                    )
                },
            },
        };
        let rendered = Arc::new(Rendered::new(64 * 1024 * 1024));
        let ended = Arc::new(Ended::new());
        if let (Store::Postgres(pg), Ok(runtime)) = (&store, tokio::runtime::Handle::try_current())
        {
            runtime.spawn(super::notices::follow(
                pg.clone(),
                Arc::clone(&rendered),
                Arc::clone(&ended),
            ));
        }
        let caps = Caps {
            max_time_limit: config.max_time_limit,
            default_wait: config.default_wait,
            max_wait: config
                .request_timeout
                .saturating_sub(Duration::from_secs(1)),
        };
        Ok(AppState {
            inner: Arc::new(Inner {
                engine,
                store,
                queue,
                metrics,
                config,
                caps,
                cors,
                rendered,
                ended,
                shutting_down: tokio::sync::watch::channel(false).0,
            }),
        })
    }

    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Worker threads of this process.
    pub fn workers(&self) -> usize {
        match &self.inner.queue {
            Queue::Local(jobs) => jobs.workers(),
            Queue::Shared { workers } => workers.as_ref().map_or(0, Workers::count),
        }
    }

    /// Stops waiting requests (they answer 202) and closes the store to writes. On SQLite,
    /// jobs still running are left in flight in the file and the next start marks them
    /// interrupted; on PostgreSQL this process stops claiming, and the lease of a job it was
    /// running runs out so another worker takes it.
    pub fn shutdown(&self) {
        self.inner.shutting_down.send_replace(true);
        self.inner.store.close();
        if let Queue::Shared {
            workers: Some(workers),
        } = &self.inner.queue
        {
            workers.stop_claiming();
        }
    }

    /// Waits for this process's workers of a shared queue to finish the jobs they run and
    /// store their outcome (blocks; nothing to wait for on SQLite, whose store is closed).
    pub fn finish_shared_jobs(&self) {
        if let Queue::Shared {
            workers: Some(workers),
        } = &self.inner.queue
        {
            workers.stop();
        }
    }
}
