//! The service's own routes: `/healthz` and `/metrics`.

use super::error::{ApiError, ErrorBody};
use super::records::{json_response, store_error};
use super::state::AppState;
use super::store::Store;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Serialize;
use utoipa::ToSchema;

/// The routes of this resource.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub status: String,
    pub version: String,
    /// `sqlite` (embedded) or `postgres` (shared by replicas and workers).
    pub store: String,
    /// Whether the store answered (false only on PostgreSQL, with status 503).
    pub database: bool,
    /// Worker threads of this process (0: a PostgreSQL replica that only serves).
    pub workers: usize,
    /// Jobs waiting: this process's queue on SQLite, the shared queue's (all kinds) on
    /// PostgreSQL. Left out when the database cannot be read (503): the last figure read
    /// would be stale.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_depth: Option<i64>,
    /// Jobs running: this process's on SQLite, every worker's on PostgreSQL. Left out with
    /// `queue_depth`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jobs_running: Option<i64>,
}

/// Liveness: the store answers and the workers exist. On PostgreSQL a database that cannot be
/// reached answers 503 with `Retry-After` and `database: false`.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "service",
    responses(
        (status = 200, description = "Healthy", body = Health),
        (status = 503, description = "The database cannot be reached (PostgreSQL)", body = Health),
        (status = 500, description = "The store does not answer", body = ErrorBody)
    )
)]
pub async fn healthz(State(state): State<AppState>) -> Result<Response, ApiError> {
    let m = &state.inner.metrics;
    let store = &state.inner.store;
    let mut health = Health {
        status: "ok".to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        store: if store.is_postgres() {
            "postgres"
        } else {
            "sqlite"
        }
        .to_string(),
        database: true,
        workers: state.workers(),
        queue_depth: Some(m.queue_depth.get()),
        jobs_running: Some(m.jobs_running.get()),
    };
    match store {
        Store::Sqlite(s) => s.ping().map_err(|e| store_error(e.into()))?,
        Store::Postgres(pg) => match pg.queue_stats().await {
            Ok(stats) => {
                health.queue_depth = Some(stats.iter().map(|s| s.queued).sum());
                health.jobs_running = Some(stats.iter().map(|s| s.running).sum());
                m.set_shared(Some(&stats));
            }
            Err(e) if e.is_unavailable() => {
                m.set_shared(None);
                tracing::warn!(error = %e, "healthz: the database is unreachable");
                health.status = "database_unavailable".to_string();
                health.database = false;
                // The shared queue's figures are the database's: the last ones read would be
                // stale (this process's workers' jobs may have ended since).
                health.queue_depth = None;
                health.jobs_running = None;
                let mut response = json_response(StatusCode::SERVICE_UNAVAILABLE, &health);
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
                return Ok(response);
            }
            Err(e) => return Err(store_error(e)),
        },
    }
    Ok(json_response(StatusCode::OK, &health))
}

/// Prometheus metrics (text format).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "service",
    responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain"))
)]
pub async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    match &state.inner.store {
        // The shared queue as the database has it now; a database that does not answer is
        // `remat_database_up 0`, not a failed scrape.
        Store::Postgres(pg) => match pg.queue_stats().await {
            Ok(stats) => state.inner.metrics.set_shared(Some(&stats)),
            Err(e) => {
                tracing::warn!(error = %e, "metrics: cannot read the shared queue");
                state.inner.metrics.set_shared(None);
            }
        },
        // The embedded file: up when it answers, as `/healthz` checks it.
        Store::Sqlite(s) => {
            let up = s.ping().is_ok();
            state.inner.metrics.database_up.set(i64::from(up));
        }
    }
    let (content_type, text) = state.inner.metrics.render().map_err(ApiError::internal)?;
    let content_type = HeaderValue::from_str(&content_type).map_err(ApiError::internal)?;
    Ok(([(header::CONTENT_TYPE, content_type)], text).into_response())
}
