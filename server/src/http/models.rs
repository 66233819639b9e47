//! `/v1/models/{hash}/history`: every plan of one model over time.

use super::error::{ApiError, ErrorBody, ErrorObject};
use super::records::{json_response, raw, store_error, stored_error};
use super::state::AppState;
use super::store::JobStatus;
use crate::engine::PlanRequest;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use serde::Serialize;
use serde_json::value::RawValue;
use utoipa::ToSchema;

/// The routes of this resource.
pub fn router() -> Router<AppState> {
    Router::new().route("/v1/models/{hash}/history", get(history))
}

/// Every plan of one model, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct History {
    pub model: String,
    pub plans: Vec<HistoryEntry>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct HistoryEntry {
    pub id: String,
    pub created_at: String,
    pub status: JobStatus,
    #[schema(value_type = Object)]
    pub options: Box<RawValue>,
    /// The requested budget.
    pub budget: Option<String>,
    /// The engine's summary figures (peak, overhead, ...), when done.
    #[schema(value_type = Option<Object>)]
    pub summary: Option<Box<RawValue>>,
    pub error: Option<ErrorObject>,
}

/// Every plan of one model over time, oldest first, with its summary figures.
#[utoipa::path(
    get,
    path = "/v1/models/{hash}/history",
    tag = "models",
    params(("hash" = String, Path, description = "The model's content hash (`model.hash` of a plan)")),
    responses(
        (status = 200, description = "The model's plans, oldest first", body = History),
        (status = 404, description = "No plan of this model", body = ErrorBody),
    )
)]
pub async fn history(
    State(state): State<AppState>,
    Path(hash): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    // Every plan, oldest first: a parameter (`limit`, as /v1/plans takes) would be ignored.
    if let Some((key, _)) = super::options::query_pairs(query.as_deref())?.first() {
        return Err(ApiError::bad_request(
            "invalid_query",
            format!(
                "unknown query parameter `{key}`: the history takes none (every plan of the model, oldest first; GET /v1/plans?model=HASH&limit=N lists the latest)"
            ),
        ));
    }
    let rows = state
        .inner
        .store
        .history(&hash)
        .await
        .map_err(store_error)?;
    if rows.is_empty() {
        return Err(ApiError::not_found(format!(
            "no plan of a model with hash {hash:?}"
        )));
    }
    let plans = rows
        .into_iter()
        .map(|row| {
            let error = stored_error(&row)?;
            let budget = serde_json::from_str::<PlanRequest>(&row.options)
                .ok()
                .and_then(|r| r.budget);
            Ok(HistoryEntry {
                id: row.id,
                created_at: row.created_at,
                status: row.status,
                options: raw(row.options)?,
                budget,
                summary: row.summary.map(raw).transpose()?,
                error,
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    Ok(json_response(
        StatusCode::OK,
        &History { model: hash, plans },
    ))
}
