//! The planning service: HTTP API v1, the job queue and its workers, the plan store (SQLite
//! embedded, or PostgreSQL for replicas and workers), metrics, the OpenAPI document and
//! `remat serve`.
//!
//! The service talks to the planning pipeline only through [`crate::engine::Engine`].
//! One module per resource (`plans`, `sweeps`, `models`, `service`, `openapi`, `web`), each
//! with its `router()`, merged in [`app`]; `submit` and `records` are what the job resources
//! share.

pub mod cache;
pub mod error;
pub mod failure;
pub mod jobs;
pub mod metrics;
mod middleware;
pub mod models;
mod notices;
pub mod openapi;
pub mod options;
pub mod plans;
pub mod records;
pub mod run;
pub mod service;
pub mod state;
pub mod store;
pub mod submit;
pub mod sweeps;
pub mod web;
pub mod workers;

pub use error::{ApiError, ErrorBody, ErrorObject};
pub use failure::ServerError;
pub use state::{AppState, Config};
pub use store::{JobStatus, Store};
pub use workers::{WorkerConfig, Workers};

use crate::engine::Engine;
use axum::extract::DefaultBodyLimit;
use axum::http::{header, Method, StatusCode};
use axum::Router;
use std::future::Future;
use std::sync::Arc;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::limit::RequestBodyLimitLayer;
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
        // A declared Content-Length over the limit is answered 413 at once, before the body
        // is read (and before `Expect: 100-continue` invites it).
        .layer(RequestBodyLimitLayer::new(state.inner.config.body_limit))
        .layer(axum::middleware::from_fn(middleware::refuse_encoded_bodies))
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
                .allow_methods([Method::GET, Method::POST, Method::PUT, Method::DELETE])
                .allow_headers([header::CONTENT_TYPE, header::AUTHORIZATION])
                .expose_headers([header::LOCATION, header::RETRY_AFTER]),
        );
    }
    router
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::error_shape,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::track,
        ))
        .layer(TraceLayer::new_for_http().on_failure(log_failure))
        .with_state(state)
}

/// A response that failed (5xx): an error, but a 503 (a full queue's back-pressure, a
/// database out of reach, shutting down: each answered with `Retry-After` and logged where it
/// arises) only a warning.
fn log_failure(
    failure: tower_http::classify::ServerErrorsFailureClass,
    latency: std::time::Duration,
    _span: &tracing::Span,
) {
    use tower_http::classify::ServerErrorsFailureClass as F;
    match failure {
        F::StatusCode(s) if s == axum::http::StatusCode::SERVICE_UNAVAILABLE => {
            tracing::warn!(status = %s, ?latency, "response failed")
        }
        other => tracing::error!(classification = %other, ?latency, "response failed"),
    }
}

/// How long a connection may take to send a request's headers, at most (less where the
/// request timeout is less): one that sends part of them and stops is closed then, not held
/// open for ever (a client's slowness with the body is the request timeout's, a 408).
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Serves `state` on `listener` until `shutdown` resolves, then stops gracefully: waiting
/// requests answer at once, open requests finish, and the store is closed to writes.
///
/// HTTP/1.1 connections served by hyper with a timer, so that a connection whose headers do
/// not arrive within [`HEADER_READ_TIMEOUT`] (or the request timeout, if less) is closed (`axum::serve` has no timer, and such
/// a connection stayed open for ever).
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower::ServiceExt;
    let router = app(state.clone());
    let header_timeout = HEADER_READ_TIMEOUT.min(state.inner.config.request_timeout);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors and the like: wait, as axum::serve does.
                        tracing::warn!(error = %e, "cannot accept a connection");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let service = router
                    .clone()
                    .map_request(|r: axum::http::Request<hyper::body::Incoming>| r.map(axum::body::Body::new));
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(header_timeout)
                    .serve_connection(
                        TokioIo::new(stream),
                        hyper_util::service::TowerToHyperService::new(service),
                    );
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::trace!(error = %e, "connection ended with an error");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    tracing::info!("shutting down");
    state.inner.shutting_down.send_replace(true);
    graceful.shutdown().await;
    state.shutdown();
    Ok(())
}

/// Where `remat serve` listens and keeps its plans, and how it runs.
#[derive(Debug, Clone)]
pub struct Serve {
    /// Address to listen on.
    pub addr: String,
    /// The plan store: a SQLite file (created if missing) or a PostgreSQL URL
    /// (`postgres://user:password@host/db`).
    pub db: String,
    pub config: Config,
}

/// Opens the store `db` names: a PostgreSQL database (its schema migrated) or a SQLite file.
pub async fn open_store(db: &str, connections: usize) -> Result<Store, ServerError> {
    let opening = |error| ServerError::OpenStore {
        path: store::redact(db),
        error,
    };
    if store::is_postgres_url(db) {
        let pg = store::PgStore::new(db, connections).map_err(opening)?;
        let applied = pg.migrate().await.map_err(opening)?;
        if !applied.is_empty() {
            tracing::info!(versions = ?applied, "applied schema migrations");
        }
        Ok(Store::Postgres(pg))
    } else {
        store::check_sqlite_path(db).map_err(|message| ServerError::Config {
            option: "db",
            message,
        })?;
        let sqlite = store::SqliteStore::open(std::path::Path::new(db)).map_err(opening)?;
        Ok(Store::Sqlite(Arc::new(sqlite)))
    }
}

/// Logs to stderr (`RUST_LOG` filters; [`default_filter`] of `default` otherwise), unless the
/// binary installed its own subscriber already.
pub fn init_logging(default: &str) {
    // `RUST_LOG` that does not name `highs` leaves HiGHS's warnings out too.
    let filter = match std::env::var("RUST_LOG") {
        Ok(given) if !given.trim().is_empty() && !given.contains("highs") => {
            tracing_subscriber::EnvFilter::try_new(default_filter(&given)).ok()
        }
        _ => None,
    }
    .or_else(|| tracing_subscriber::EnvFilter::try_from_default_env().ok())
    .unwrap_or_else(|| tracing_subscriber::EnvFilter::new(default_filter(default)));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// The log filter without `RUST_LOG`: `default`, less HiGHS's own warnings. HiGHS warns when a
/// solve stops at its time limit ("HiGHS emitted a warning: Highs_run"), which remat's bounds
/// and MILP do by design and report themselves (a plan's bound and its source); `RUST_LOG`
/// that names `highs` shows them (one that does not gets this filter added).
pub fn default_filter(default: &str) -> String {
    format!("{default},highs=error")
}

/// `remat serve`: checks the settings, binds, opens the store, starts the workers, prints the
/// URL and serves until Ctrl-C or SIGTERM; says how it stopped ([`drain_or_give_back`]).
pub async fn serve(settings: Serve, engine: Arc<dyn Engine>) -> Result<Stopped, ServerError> {
    let Serve { addr, db, config } = settings;
    init_logging("info,tower_http=debug");
    config.check(store::is_postgres_url(&db))?;
    // The address first: a second start on a busy port (or a bad address) stops before it
    // opens the store, which marks the jobs a previous run left in flight.
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|error| ServerError::Bind {
            addr: addr.clone(),
            error,
        })?;
    let store = open_store(&db, 16).await?;
    let interrupted = match &store {
        Store::Sqlite(s) => s.interrupted_on_open(),
        Store::Postgres(_) => 0,
    };
    let state = AppState::new(engine, store, config)?;
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() && state.inner.config.token.is_none() {
        tracing::warn!(%addr, "listening beyond loopback without a token: anyone who can reach it can post and delete");
    }
    println!(
        "remat serve: http://{addr}/ (store {}, {} workers, queue {})",
        store::redact(&db),
        state.workers(),
        state.inner.config.queue
    );
    if interrupted > 0 {
        println!("remat serve: {interrupted} job(s) left in flight by the last run are marked failed (interrupted)");
    }
    serve_on(listener, state.clone(), shutdown_signal()).await?;
    // On PostgreSQL the jobs this replica runs finish and are stored (their leases stay
    // renewed meanwhile); a second signal puts them back in the queue and exits at once.
    if state.workers() > 0 && state.store().is_postgres() {
        println!("remat serve: stopping; the jobs this replica runs finish first (a second Ctrl-C or SIGTERM puts them back in the queue and stops at once)");
        let name = state.inner.config.shared_workers.name.clone();
        let draining = state.clone();
        return Ok(drain_or_give_back(&db, &name, move || draining.finish_shared_jobs()).await);
    }
    Ok(Stopped::Drained)
}

/// How `remat serve` or `remat worker` stopped after the first Ctrl-C or SIGTERM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// The jobs running finished and were stored (or there were none to wait for).
    Drained,
    /// A second signal came first: the jobs running were put back in the queue (or left to
    /// their leases when the database could not be reached); the binary exits with 130 at
    /// once, without waiting for them.
    GaveBack,
}

/// Waits, after a first signal, for `drain` (the workers finishing and storing the jobs they
/// run, on a thread of its own); a second Ctrl-C or SIGTERM stops waiting instead: the jobs
/// the workers named `name` hold go back to the queue of `db` for another worker (not left to
/// their leases), and the answer is [`Stopped::GaveBack`] (the threads still run; the caller
/// exits).
pub async fn drain_or_give_back(
    db: &str,
    name: &str,
    drain: impl FnOnce() + Send + 'static,
) -> Stopped {
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        drain();
        let _ = done_tx.send(());
    });
    tokio::select! {
        _ = done_rx => Stopped::Drained,
        _ = shutdown_signal() => {
            let given = match store::PgStore::new(db, 1) {
                Ok(pg) => pg.give_back(name).await,
                Err(e) => Err(e),
            };
            match given {
                Ok(n) => eprintln!("remat: stopped at once; {n} job(s) put back in the queue for another worker"),
                Err(e) => eprintln!("remat: stopped at once; the jobs running could not be put back ({e}): they go back when their leases run out"),
            }
            Stopped::GaveBack
        }
    }
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
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
