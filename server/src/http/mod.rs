//! The planning service: HTTP API v1, the job queue and its workers, the SQLite plan store,
//! metrics, the OpenAPI document and `remat serve`.
//!
//! The service talks to the planning pipeline only through [`crate::engine::Engine`].
//! One module per resource (`plans`, `sweeps`, `models`, `service`, `openapi`, `web`), each
//! with its `router()`, merged in [`app`]; `submit` and `records` are what the job resources
//! share.

pub mod cache;
pub mod error;
pub mod jobs;
pub mod metrics;
mod middleware;
pub mod models;
pub mod openapi;
pub mod options;
pub mod plans;
pub mod records;
pub mod service;
pub mod state;
pub mod store;
pub mod submit;
pub mod sweeps;
pub mod web;

pub use error::{ApiError, ErrorBody, ErrorObject, ServerError};
pub use state::{AppState, Config};
pub use store::{JobStatus, Store};

use crate::engine::Engine;
use axum::extract::DefaultBodyLimit;
use axum::http::{header, Method, StatusCode};
use axum::Router;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

/// The HTTP application (all routes and middleware) over `state`.
pub fn app(state: AppState) -> Router {
    let mut router = Router::new()
        .merge(plans::router())
        .merge(sweeps::router())
        .merge(models::router())
        .merge(service::router())
        .merge(openapi::router())
        .merge(web::router())
        .layer(DefaultBodyLimit::max(state.inner.config.body_limit))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::require_token,
        ))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            state.inner.config.request_timeout,
        ));
    if !state.inner.cors.is_empty() {
        router = router.layer(
            CorsLayer::new()
                .allow_origin(AllowOrigin::list(state.inner.cors.clone()))
                .allow_methods([Method::GET, Method::POST, Method::DELETE])
                .allow_headers([header::CONTENT_TYPE, header::AUTHORIZATION])
                .expose_headers([header::LOCATION, header::RETRY_AFTER]),
        );
    }
    router
        .layer(axum::middleware::from_fn(middleware::error_shape))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::track,
        ))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// Serves `state` on `listener` until `shutdown` resolves, then stops gracefully: waiting
/// requests answer at once, open requests finish, and the store is closed to writes.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let stopping = state.clone();
    let router = app(state.clone());
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            shutdown.await;
            tracing::info!("shutting down");
            stopping.inner.shutting_down.send_replace(true);
        })
        .await?;
    state.shutdown();
    Ok(())
}

/// Where `remat serve` listens and keeps its plans, and how it runs.
#[derive(Debug, Clone)]
pub struct Serve {
    /// Address to listen on.
    pub addr: String,
    /// The plan store (SQLite file, created if missing).
    pub db: PathBuf,
    pub config: Config,
}

/// `remat serve`: checks the settings, opens the store, starts the workers, binds, prints the
/// URL and serves until Ctrl-C or SIGTERM.
pub async fn serve(settings: Serve, engine: Arc<dyn Engine>) -> Result<(), ServerError> {
    let Serve { addr, db, config } = settings;
    // Logs to stderr (`RUST_LOG` filters; default: requests and the service at info/debug),
    // unless the binary installed its own subscriber already.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,tower_http=debug"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    config.check()?;
    let store = Store::open(&db).map_err(|source| ServerError::OpenStore {
        path: db.display().to_string(),
        source,
    })?;
    let interrupted = store.interrupted_on_open();
    let state = AppState::new(engine, Arc::new(store), config)?;
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|source| ServerError::Bind {
            addr: addr.clone(),
            source,
        })?;
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() && state.inner.config.token.is_none() {
        tracing::warn!(%addr, "listening beyond loopback without a token: anyone who can reach it can post and delete");
    }
    println!(
        "remat serve: http://{addr}/ (store {}, {} workers, queue {})",
        db.display(),
        state.inner.jobs.workers(),
        state.inner.config.queue
    );
    if interrupted > 0 {
        println!("remat serve: {interrupted} job(s) left in flight by the last run are marked failed (interrupted)");
    }
    serve_on(listener, state, shutdown_signal()).await
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = terminate => {}
    }
}
