//! A plan or sweep job as the API returns it ([`PlanRecord`]), read from the store or from the
//! rendered-response cache, and the helpers every resource answers with.

use super::cache::Fill;
use super::error::{ApiError, ErrorObject};
use super::state::{AppState, Queue};
use super::store::{JobStatus, Kind, Record, Row, Store, StoreError};
use crate::engine::document::{PlanDocument, SweepDocument};
use axum::body::Bytes;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;

/// What was posted, identified.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelInfo {
    /// SHA-256 of the model bytes (of the canonical JSON text for graph JSON).
    pub hash: String,
    pub name: Option<String>,
    /// `onnx` or `graph_json`.
    pub format: String,
}

/// A plan or sweep as the API returns it.
#[derive(Debug, Serialize, ToSchema)]
pub struct PlanRecord {
    pub id: String,
    /// `plan` or `sweep`.
    pub kind: String,
    pub status: JobStatus,
    pub model: ModelInfo,
    pub created_at: String,
    pub updated_at: String,
    /// The options as applied (with `clamped` when the server capped a value).
    #[schema(value_type = Object)]
    pub options: Box<RawValue>,
    /// The engine's summary figures (budget, peak, overhead...), once done.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub summary: Option<Box<RawValue>>,
    /// The plan document (decisions, schedule, baselines, validation), once done.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<PlanDocument>)]
    pub plan: Option<Box<RawValue>>,
    /// The sweep document (the Pareto frontier), once done.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<SweepDocument>)]
    pub sweep: Option<Box<RawValue>>,
    /// Why the job failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorObject>,
}

/// A job that is not finished yet.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Accepted {
    pub id: String,
    pub status: JobStatus,
}

/// Stored JSON text as it is.
pub fn raw(text: String) -> Result<Box<RawValue>, ApiError> {
    RawValue::from_string(text)
        .map_err(|e| ApiError::internal(format!("stored JSON is corrupt: {e}")))
}

/// The stored error of a failed job.
pub fn stored_error(row: &Row) -> Result<Option<ErrorObject>, ApiError> {
    row.error
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| ApiError::internal(format!("stored error of {} is corrupt: {e}", row.id)))
}

/// A stored job as the API returns it; `result` is its document, when read.
pub fn record_out(kind: Kind, row: Row, result: Option<String>) -> Result<PlanRecord, ApiError> {
    let error = stored_error(&row)?;
    let document = result.map(raw).transpose()?;
    let (plan, sweep) = match kind {
        Kind::Plan => (document, None),
        Kind::Sweep => (None, document),
    };
    Ok(PlanRecord {
        id: row.id,
        kind: kind.as_str().to_string(),
        status: row.status,
        model: ModelInfo {
            hash: row.model_hash,
            name: row.model_name,
            format: row.model_format,
        },
        created_at: row.created_at,
        updated_at: row.updated_at,
        options: raw(row.options)?,
        summary: row.summary.map(raw).transpose()?,
        plan,
        sweep,
        error,
    })
}

/// A JSON response.
pub fn json_response(status: StatusCode, value: &impl Serialize) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => json_body(status, Bytes::from(body)),
        Err(e) => ApiError::internal(format!("cannot serialize a response: {e}")).into_response(),
    }
}

fn location(kind: Kind, id: &str) -> String {
    match kind {
        Kind::Plan => format!("/v1/plans/{id}"),
        Kind::Sweep => format!("/v1/sweeps/{id}"),
    }
}

/// Adds the `Location` of a job.
pub fn with_location(mut response: Response, kind: Kind, id: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(&location(kind, id)) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
}

/// A store failure: 503 with `Retry-After` while the database cannot be reached (PostgreSQL
/// down or restarting), else a 500 (logged).
pub fn store_error(e: StoreError) -> ApiError {
    if e.is_unavailable() {
        tracing::warn!(error = %e, "the plan store is unreachable");
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "database_unavailable",
            if e.is_busy() {
                "the plan store's database file is locked by another process (a backup, an \
                 sqlite3 shell in a transaction); retry later"
            } else {
                "the plan store's database cannot be reached; retry later"
            },
        )
        .with_header(header::RETRY_AFTER, HeaderValue::from_static("5"));
    }
    ApiError::internal(format!("plan store: {e}"))
}

/// `GET` of one job: from the rendered-response cache when it finished before, else from the
/// store (a finished job's response is cached). On PostgreSQL, where another replica may
/// delete it, the cache answers by itself only while this replica hears of every deletion
/// (`notices.rs`), and after the database says the job is still there otherwise. Concurrent
/// misses of one job make one read of the store (`cache::Fill`).
pub async fn get_record(state: &AppState, kind: Kind, id: &str) -> Result<Response, ApiError> {
    let key = format!("{}/{id}", kind.as_str());
    let reads = &state.inner.metrics.job_reads;
    if let Some(hit) = cached(state, kind, id, &key).await? {
        reads.with_label_values(&["hit"]).inc();
        return Ok(hit);
    }
    let rendered = &state.inner.rendered;
    let _lead = match rendered.fill(&key) {
        Fill::Lead(guard) => Some(guard),
        Fill::Follow(mut done) => {
            Fill::wait(&mut done).await;
            if let Some(hit) = cached(state, kind, id, &key).await? {
                reads.with_label_values(&["joined"]).inc();
                return Ok(hit);
            }
            None
        }
    };
    reads.with_label_values(&["read"]).inc();
    let generation = rendered.generation();
    let Some(Record { row, result }) =
        state.inner.store.get(kind, id).await.map_err(store_error)?
    else {
        return Err(ApiError::not_found(format!(
            "no {} with id {id:?}",
            kind.as_str()
        )));
    };
    let finished = row.status.is_terminal();
    let body = Bytes::from(
        serde_json::to_vec(&record_out(kind, row, result)?).map_err(ApiError::internal)?,
    );
    if finished {
        rendered.put_if(generation, key, body.clone());
    }
    Ok(json_body(StatusCode::OK, body))
}

/// A JSON body already serialized.
fn json_body(status: StatusCode, body: Bytes) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

/// The cached response of job `key`, if there is one that may be answered.
async fn cached(
    state: &AppState,
    kind: Kind,
    id: &str,
    key: &str,
) -> Result<Option<Response>, ApiError> {
    let rendered = &state.inner.rendered;
    let Some(body) = rendered.get(key) else {
        return Ok(None);
    };
    let still_there = match &state.inner.store {
        Store::Sqlite(_) => true,
        Store::Postgres(_) if rendered.trusted() => true,
        Store::Postgres(pg) => pg.status(kind, id).await.map_err(store_error)?.is_some(),
    };
    if still_there {
        return Ok(Some(json_body(StatusCode::OK, body)));
    }
    rendered.invalidate(key);
    Ok(None)
}

/// `DELETE` of one job. A job still queued or running stops: at once when this process runs
/// it (or would), otherwise when its worker's lease renewal finds the record gone.
pub async fn delete_record(state: &AppState, kind: Kind, id: &str) -> Result<StatusCode, ApiError> {
    state
        .inner
        .rendered
        .invalidate(&format!("{}/{id}", kind.as_str()));
    if state
        .inner
        .store
        .delete(kind, id)
        .await
        .map_err(store_error)?
    {
        let stopped = match &state.inner.queue {
            Queue::Local(jobs) => jobs.cancel(id),
            Queue::Shared { workers } => workers.as_ref().is_some_and(|w| w.cancel(id)),
        };
        if stopped {
            tracing::info!(job = id, "deleted while queued or running: stopping it");
        }
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!(
            "no {} with id {id:?}",
            kind.as_str()
        )))
    }
}
