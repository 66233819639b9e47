//! What every handler shares ([`AppState`]: the engine, the store, the job queue, metrics and
//! the settings) and the settings themselves ([`Config`]).

use super::cache::Rendered;
use super::error::ServerError;
use super::jobs::Jobs;
use super::metrics::Metrics;
use super::options::Caps;
use super::store::Store;
use crate::engine::Engine;
use axum::http::HeaderValue;
use std::sync::Arc;
use std::time::Duration;

/// Settings of the service.
#[derive(Debug, Clone)]
pub struct Config {
    pub workers: usize,
    pub queue: usize,
    pub body_limit: usize,
    pub token: Option<String>,
    pub cors: Vec<String>,
    pub request_timeout: Duration,
    pub max_time_limit: f64,
    /// How long a POST waits for its job when the request does not say.
    pub default_wait: Duration,
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
        }
    }
}

impl Config {
    /// Checks the settings `remat serve` takes from its flags; the error names the flag.
    pub fn check(&self) -> Result<(), ServerError> {
        if self.workers == 0 {
            return Err(ServerError::Config {
                option: "workers",
                message: "needs at least one worker".to_string(),
            });
        }
        if !(self.max_time_limit.is_finite() && self.max_time_limit > 0.0) {
            return Err(ServerError::Config {
                option: "max-time-limit",
                message: format!(
                    "{} is not a positive number of seconds",
                    self.max_time_limit
                ),
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

pub(super) struct Inner {
    pub(super) engine: Arc<dyn Engine>,
    pub(super) store: Arc<Store>,
    pub(super) jobs: Jobs,
    pub(super) metrics: Arc<Metrics>,
    pub(super) config: Config,
    pub(super) caps: Caps,
    pub(super) cors: Vec<HeaderValue>,
    pub(super) rendered: Rendered,
    pub(super) shutting_down: tokio::sync::watch::Sender<bool>,
}

/// What every handler shares: the engine, the store, the job queue, metrics and settings.
#[derive(Clone)]
pub struct AppState {
    pub(super) inner: Arc<Inner>,
}

impl AppState {
    /// Starts the worker pool and makes the state for [`super::app`].
    pub fn new(
        engine: Arc<dyn Engine>,
        store: Arc<Store>,
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
        let jobs = Jobs::start(
            Arc::clone(&engine),
            Arc::clone(&store),
            Arc::clone(&metrics),
            config.workers,
            config.queue,
        )
        .map_err(|(index, source)| ServerError::Worker { index, source })?;
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
                jobs,
                metrics,
                config,
                caps,
                cors,
                rendered: Rendered::new(64 * 1024 * 1024),
                shutting_down: tokio::sync::watch::channel(false).0,
            }),
        })
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.inner.store
    }

    /// Stops waiting requests (they answer 202) and closes the store to writes: jobs still
    /// running are left in flight in the file, and the next start marks them interrupted.
    pub fn shutdown(&self) {
        self.inner.shutting_down.send_replace(true);
        self.inner.store.close();
    }
}
