//! `/v1/plans`: post a model to plan, list the plans, read and delete one.

use super::error::{ApiError, ErrorBody};
use super::options::{query_pairs, SubmitOptions};
use super::records::{
    delete_record, get_record, json_response, record_out, store_error, Accepted, PlanRecord,
};
use super::state::AppState;
use super::store::{JobStatus, Kind, Record};
use super::submit::{body_bytes, submit, Envelope};
use crate::engine::PlanRequest;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post, put};
use axum::Router;
use serde::Serialize;
use utoipa::ToSchema;

/// The routes of this resource.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/plans", post(post_plan).get(list_plans))
        .route("/v1/plans/{id}", get(get_plan).delete(delete_plan))
        .route("/v1/plans/{id}/validation", put(put_validation))
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
        (status = 409, description = "Not the model `expect_model` names (`model_mismatch`)", body = ErrorBody),
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
        (status = 204, description = "Deleted; a job still queued or running stops"),
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

/// Attach what PyTorch measured to a torch-sac plan.
///
/// The body is what `remat.torch.measure(model, inputs, plan)` returns for this plan (device
/// `torch-cpu` or `torch-cuda`, measured and predicted peak, gradient check, overheads). It
/// becomes the plan's `validation`, answered by every later `GET` on every replica; a later
/// `PUT` replaces it. Refused when it is not a measurement of this plan: its
/// `predicted_peak_bytes`, and where it has them its `fingerprint` and `budget_bytes`, must be
/// the plan's.
#[utoipa::path(
    put,
    path = "/v1/plans/{id}/validation",
    tag = "plans",
    params(("id" = String, Path, description = "Plan id")),
    request_body(content = Object, content_type = "application/json",
        description = "What remat.torch.measure returned for this plan"),
    responses(
        (status = 200, description = "The plan with its validation", body = PlanRecord),
        (status = 400, description = "The body is not JSON", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 404, description = "Unknown id", body = ErrorBody),
        (status = 409, description = "The plan is not done yet", body = ErrorBody),
        (status = 422, description = "Not a torch-sac plan, or not a measurement of this plan (the field is named)", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn put_validation(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(body)?;
    let validation: serde_json::Value = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request("invalid_json", format!("the validation is not JSON: {e}"))
    })?;
    let unprocessable = |code: &str, message: String| {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    };
    let store = &state.inner.store;
    let Some(Record { row, result }) = store.get(Kind::Plan, &id).await.map_err(store_error)?
    else {
        return Err(ApiError::not_found(format!("no plan with id {id:?}")));
    };
    let result = match (row.status, result) {
        (JobStatus::Done, Some(result)) => result,
        (status, _) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "plan_not_done",
                format!(
                    "plan {id} is {}: a validation is attached to a finished plan",
                    status.as_str()
                ),
            ))
        }
    };
    let mut document: serde_json::Value =
        serde_json::from_str(&result).map_err(ApiError::internal)?;
    if document["format"] != remat_solver::sac::PLAN_FORMAT {
        return Err(unprocessable(
            "not_a_torch_plan",
            format!(
                "plan {id} is a free-schedule plan: remat's executor validates it (POST /v1/plans \
                 with validate=true); a validation measured in PyTorch belongs to a plan of a \
                 captured PyTorch graph"
            ),
        ));
    }
    let plan: remat_solver::sac::PlanDocument =
        serde_json::from_value(document.clone()).map_err(ApiError::internal)?;
    remat_solver::sac::check_validation(&plan, &validation)
        .map_err(|e| unprocessable("invalid_validation", e.to_string()))?;
    document["validation"] = validation;
    let text = serde_json::to_string(&document).map_err(ApiError::internal)?;
    let replaced = store
        .replace_result(Kind::Plan, &id, &text)
        .await
        .map_err(store_error)?;
    state
        .inner
        .rendered
        .invalidate(&format!("{}/{id}", Kind::Plan.as_str()));
    if !replaced {
        return Err(ApiError::not_found(format!(
            "no finished plan with id {id:?} (deleted meanwhile?)"
        )));
    }
    get_record(&state, Kind::Plan, &id).await
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
