//! The service's own routes: `/healthz` and `/metrics`.

use super::error::{ApiError, ErrorBody};
use super::records::{json_response, store_error};
use super::state::AppState;
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
    pub workers: usize,
    pub queue_depth: i64,
    pub jobs_running: i64,
}

/// Liveness: the store answers and the workers exist.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "service",
    responses((status = 200, description = "Healthy", body = Health), (status = 500, description = "The store does not answer", body = ErrorBody))
)]
pub async fn healthz(State(state): State<AppState>) -> Result<Response, ApiError> {
    state.inner.store.ping().map_err(store_error)?;
    let m = &state.inner.metrics;
    Ok(json_response(
        StatusCode::OK,
        &Health {
            status: "ok".to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            workers: state.inner.jobs.workers(),
            queue_depth: m.queue_depth.get(),
            jobs_running: m.jobs_running.get(),
        },
    ))
}

/// Prometheus metrics (text format).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "service",
    responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain"))
)]
pub async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let (content_type, text) = state.inner.metrics.render().map_err(ApiError::internal)?;
    let content_type = HeaderValue::from_str(&content_type).map_err(ApiError::internal)?;
    Ok(([(header::CONTENT_TYPE, content_type)], text).into_response())
}
