//! `/v1/sweeps`: post a model for its budget/overhead frontier, read and delete one.

use super::error::{ApiError, ErrorBody};
use super::options::SubmitOptions;
use super::records::{delete_record, get_record, Accepted, PlanRecord};
use super::state::AppState;
use super::store::Kind;
use super::submit::{submit, Envelope};
use crate::engine::PlanRequest;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;

/// The routes of this resource.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/sweeps", post(post_sweep))
        .route("/v1/sweeps/{id}", get(get_sweep).delete(delete_sweep))
}

/// The Pareto frontier (budget -> overhead) of a model.
///
/// Same body and options as `POST /v1/plans` (`fraction` sets the budgets). A captured PyTorch
/// graph is swept in the torch-sac model, with `none` (PyTorch's own step) and `full` (every
/// region checkpointed) as its baselines. A sweep is a job like a plan: 201 with the frontier
/// within the wait, else 202 and `GET /v1/sweeps/{id}`.
#[utoipa::path(
    post,
    path = "/v1/sweeps",
    tag = "sweeps",
    params(PlanRequest, SubmitOptions),
    request_body(content(
        (Envelope = "application/json"),
        (Vec<u8> = "application/octet-stream"),
    )),
    responses(
        (status = 200, description = "The stored sweep for the same model and options", body = PlanRecord),
        (status = 201, description = "Swept within the wait", body = PlanRecord),
        (status = 202, description = "Still running", body = Accepted),
        (status = 400, description = "Malformed model or options", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 409, description = "Not the model `expect_model` names (`model_mismatch`)", body = ErrorBody),
        (status = 413, description = "Body over the limit", body = ErrorBody),
        (status = 422, description = "Not plannable", body = ErrorBody),
        (status = 503, description = "Queue full", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn post_sweep(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    submit(state, Kind::Sweep, headers, query, body).await
}

/// One sweep.
#[utoipa::path(
    get,
    path = "/v1/sweeps/{id}",
    tag = "sweeps",
    params(("id" = String, Path, description = "Sweep id")),
    responses(
        (status = 200, description = "The sweep", body = PlanRecord),
        (status = 404, description = "Unknown id", body = ErrorBody),
    )
)]
pub async fn get_sweep(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    get_record(&state, Kind::Sweep, &id).await
}

/// Deletes a sweep.
#[utoipa::path(
    delete,
    path = "/v1/sweeps/{id}",
    tag = "sweeps",
    params(("id" = String, Path, description = "Sweep id")),
    responses(
        (status = 204, description = "Deleted; a job still queued or running stops"),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 404, description = "Unknown id", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn delete_sweep(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    delete_record(&state, Kind::Sweep, &id).await
}
