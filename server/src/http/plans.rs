//! `/v1/plans`: post a model to plan, list the plans, read and delete one.

use super::error::{ApiError, ErrorBody};
use super::options::{query_pairs, SubmitOptions};
use super::records::{
    delete_record, get_record, json_response, record_out, store_error, Accepted, PlanRecord,
};
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
use serde::Serialize;
use utoipa::ToSchema;

/// The routes of this resource.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/plans", post(post_plan).get(list_plans))
        .route("/v1/plans/{id}", get(get_plan).delete(delete_plan))
}

/// A list of plans, newest first, without their documents.
#[derive(Debug, Serialize, ToSchema)]
pub struct PlanList {
    pub plans: Vec<PlanRecord>,
}

/// Plan a model.
///
/// The body is ONNX bytes (`application/octet-stream`), a node-link graph (`application/json`)
/// or an envelope `{"model": <graph object | base64 ONNX>, "options": {...}}`. Options come as
/// query parameters or in the envelope (the query wins). The same model with the same options
/// answers the stored plan (200) unless `refresh=true`.
#[utoipa::path(
    post,
    path = "/v1/plans",
    tag = "plans",
    params(PlanRequest, SubmitOptions),
    request_body(content(
        (Envelope = "application/json"),
        (Vec<u8> = "application/octet-stream"),
    )),
    responses(
        (status = 200, description = "The stored plan for the same model and options", body = PlanRecord),
        (status = 201, description = "Planned within the wait", body = PlanRecord),
        (status = 202, description = "Still running; follow the Location", body = Accepted),
        (status = 400, description = "Malformed model or options", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 413, description = "Body over the limit", body = ErrorBody),
        (status = 422, description = "Unsupported ops, unbound dims, infeasible budget", body = ErrorBody),
        (status = 503, description = "Queue full; retry after Retry-After", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn post_plan(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    submit(state, Kind::Plan, headers, query, body).await
}

/// One plan: its status, and the plan once done or the error once failed.
#[utoipa::path(
    get,
    path = "/v1/plans/{id}",
    tag = "plans",
    params(("id" = String, Path, description = "Plan id")),
    responses(
        (status = 200, description = "The plan", body = PlanRecord),
        (status = 404, description = "Unknown id", body = ErrorBody),
    )
)]
pub async fn get_plan(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    get_record(&state, Kind::Plan, &id).await
}

/// Deletes a plan.
#[utoipa::path(
    delete,
    path = "/v1/plans/{id}",
    tag = "plans",
    params(("id" = String, Path, description = "Plan id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 404, description = "Unknown id", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn delete_plan(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    delete_record(&state, Kind::Plan, &id).await
}

/// Query of `GET /v1/plans`.
#[derive(Debug, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only the plans of the model with this content hash.
    pub model: Option<String>,
    /// At most this many (default 100, at most 1000).
    pub limit: Option<usize>,
}

/// Plans, newest first (summaries, without the plan documents).
#[utoipa::path(
    get,
    path = "/v1/plans",
    tag = "plans",
    params(ListQuery),
    responses(
        (status = 200, description = "Plans, newest first", body = PlanList),
        (status = 400, description = "Bad query", body = ErrorBody),
    )
)]
pub async fn list_plans(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let mut q = ListQuery::default();
    for (key, value) in query_pairs(query.as_deref())? {
        match key.as_str() {
            "model" => q.model = Some(value),
            "limit" => {
                q.limit = Some(value.parse().map_err(|_| {
                    ApiError::bad_request(
                        "invalid_query",
                        format!("limit: expected a whole number, got {value:?}"),
                    )
                })?)
            }
            other => {
                return Err(ApiError::bad_request(
                    "invalid_query",
                    format!("unknown query parameter `{other}`; known: model, limit"),
                ))
            }
        }
    }
    let limit = q.limit.unwrap_or(100).min(1000);
    let rows = state
        .inner
        .store
        .list(Kind::Plan, q.model.as_deref(), limit)
        .await
        .map_err(store_error)?;
    let plans = rows
        .into_iter()
        .map(|row| record_out(Kind::Plan, row, None))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(json_response(StatusCode::OK, &PlanList { plans }))
}
