//! The handlers of API v1.

use super::error::{code_for_status, ApiError, ErrorBody, ErrorObject};
use super::jobs::{Job, Rejected};
use super::options::{canonical, query_pairs, resolve, PlanOptions, PlanQuery};
use super::store::{Claim, Kind, NewJob, Record, Row, Status};
use super::AppState;
use crate::engine::{Engine, ModelFormat, PlanRequest};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use std::time::Duration;
use utoipa::ToSchema;

/// A JSON envelope: the model (a node-link graph object, or ONNX bytes in base64) and options.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    /// A node-link graph JSON object, or a base64 string of ONNX bytes.
    #[schema(value_type = Object)]
    pub model: serde_json::Value,
    pub options: Option<PlanOptions>,
}

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
    pub status: Status,
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
    #[schema(value_type = Option<Object>)]
    pub plan: Option<Box<RawValue>>,
    /// The sweep document (the Pareto frontier), once done.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub sweep: Option<Box<RawValue>>,
    /// Why the job failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorObject>,
}

/// A job that is not finished yet.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Accepted {
    pub id: String,
    pub status: Status,
}

/// A list of plans, newest first, without their documents.
#[derive(Debug, Serialize, ToSchema)]
pub struct PlanList {
    pub plans: Vec<PlanRecord>,
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
    pub status: Status,
    #[schema(value_type = Object)]
    pub options: Box<RawValue>,
    /// The requested budget.
    pub budget: Option<String>,
    /// The engine's summary figures (peak, overhead, ...), when done.
    #[schema(value_type = Option<Object>)]
    pub summary: Option<Box<RawValue>>,
    pub error: Option<ErrorObject>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub status: String,
    pub version: String,
    pub workers: usize,
    pub queue_depth: i64,
    pub jobs_running: i64,
}

fn raw(text: String) -> Result<Box<RawValue>, ApiError> {
    RawValue::from_string(text)
        .map_err(|e| ApiError::internal(format!("stored JSON is corrupt: {e}")))
}

fn stored_error(row: &Row) -> Result<Option<ErrorObject>, ApiError> {
    row.error
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| ApiError::internal(format!("stored error of {} is corrupt: {e}", row.id)))
}

fn record_out(kind: Kind, row: Row, result: Option<String>) -> Result<PlanRecord, ApiError> {
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

fn json_response(status: StatusCode, value: &impl Serialize) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response(),
        Err(e) => ApiError::internal(format!("cannot serialize a response: {e}")).into_response(),
    }
}

fn location(kind: Kind, id: &str) -> String {
    match kind {
        Kind::Plan => format!("/v1/plans/{id}"),
        Kind::Sweep => format!("/v1/sweeps/{id}"),
    }
}

fn with_location(mut response: Response, kind: Kind, id: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(&location(kind, id)) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
}

fn store_error(e: rusqlite::Error) -> ApiError {
    ApiError::internal(format!("plan store: {e}"))
}

fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// A submission, parsed and identified.
struct Prepared {
    model: Bytes,
    format: ModelFormat,
    model_hash: String,
    resolved: super::options::Resolved,
}

fn format_name(format: ModelFormat) -> &'static str {
    match format {
        ModelFormat::Onnx => "onnx",
        ModelFormat::GraphJson => "graph_json",
    }
}

fn is_json_content(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || essence.ends_with("+json")
}

/// Reads the body (ONNX bytes, a bare graph JSON or an envelope) and the options.
fn prepare(
    engine: &dyn Engine,
    json_content: bool,
    query: Option<&str>,
    body: Bytes,
    caps: super::options::Caps,
) -> Result<Prepared, ApiError> {
    let query = PlanQuery::parse(&query_pairs(query)?)?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "empty_body",
            "the request has no model: send ONNX bytes (application/octet-stream), a node-link graph \
             (application/json) or an envelope {\"model\": ..., \"options\": ...}",
        ));
    }
    let (model, format, options) = if json_content || engine.detect(&body) == ModelFormat::GraphJson
    {
        let value: serde_json::Value = serde_json::from_slice(&body).map_err(|e| {
            ApiError::bad_request("invalid_json", format!("the body is not valid JSON: {e}"))
        })?;
        match value {
            serde_json::Value::Object(ref map) if map.contains_key("model") => {
                let envelope: Envelope = serde_json::from_value(value)
                    .map_err(|e| ApiError::bad_request("invalid_envelope", format!("the envelope: {e}")))?;
                let (model, format) = match envelope.model {
                    serde_json::Value::String(b64) => {
                        let bytes = base64::engine::general_purpose::STANDARD.decode(b64.trim()).map_err(|e| {
                            ApiError::bad_request("invalid_model", format!("envelope `model` is not valid base64: {e}"))
                        })?;
                        if bytes.is_empty() {
                            return Err(ApiError::bad_request("empty_body", "envelope `model` is empty"));
                        }
                        let format = engine.detect(&bytes);
                        (Bytes::from(bytes), format)
                    }
                    graph @ serde_json::Value::Object(_) => (canonical_json(&graph)?, ModelFormat::GraphJson),
                    other => {
                        return Err(ApiError::bad_request(
                            "invalid_model",
                            format!(
                                "envelope `model` must be a node-link graph object or a base64 ONNX string, got {}",
                                json_type(&other)
                            ),
                        ))
                    }
                };
                (model, format, envelope.options)
            }
            graph @ serde_json::Value::Object(_) => (canonical_json(&graph)?, ModelFormat::GraphJson, None),
            other => {
                return Err(ApiError::bad_request(
                    "invalid_model",
                    format!(
                        "a JSON body must be a node-link graph object or an envelope with `model`, got {}",
                        json_type(&other)
                    ),
                ))
            }
        }
    } else {
        (body, ModelFormat::Onnx, None)
    };
    let resolved = resolve(options, query, caps)?;
    Ok(Prepared {
        model_hash: sha256_hex(&model),
        model,
        format,
        resolved,
    })
}

fn canonical_json(value: &serde_json::Value) -> Result<Bytes, ApiError> {
    serde_json::to_vec(value)
        .map(Bytes::from)
        .map_err(ApiError::internal)
}

fn json_type(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|r| {
        let status = r.status();
        ApiError::new(status, code_for_status(status), r.body_text())
    })
}

/// Waits until the job is done or failed, `wait` passes, or the server shuts down.
async fn wait_for(state: &AppState, mut rx: tokio::sync::watch::Receiver<Status>, wait: Duration) {
    if wait.is_zero() {
        return;
    }
    let mut shutdown = state.inner.shutting_down.subscribe();
    tokio::select! {
        _ = tokio::time::timeout(wait, rx.wait_for(|s| s.is_terminal())) => {}
        _ = shutdown.wait_for(|down| *down) => {}
    }
}

/// The answer to a submission once the wait is over: the plan (`done_status`), the job's
/// error, or 202 with its id.
fn answer(
    state: &AppState,
    kind: Kind,
    id: &str,
    done_status: StatusCode,
) -> Result<Response, ApiError> {
    let Some(Record { row, result }) = state.inner.store.get(kind, id).map_err(store_error)? else {
        return Err(ApiError::not_found(format!(
            "{} {id} was deleted while it ran",
            kind.as_str()
        )));
    };
    let response = match row.status {
        Status::Done => json_response(done_status, &record_out(kind, row, result)?),
        Status::Failed => {
            let error = stored_error(&row)?.unwrap_or_else(|| ErrorObject {
                code: "internal".to_string(),
                message: super::error::INTERNAL_MESSAGE.to_string(),
                details: serde_json::Value::Null,
            });
            ApiError::from_stored(row.error_status.unwrap_or(500), error, id).into_response()
        }
        status => json_response(
            StatusCode::ACCEPTED,
            &Accepted {
                id: id.to_string(),
                status,
            },
        ),
    };
    Ok(with_location(response, kind, id))
}

async fn submit(
    state: AppState,
    kind: Kind,
    headers: HeaderMap,
    query: Option<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(body)?;
    let engine = std::sync::Arc::clone(&state.inner.engine);
    let json_content = is_json_content(&headers);
    let caps = state.inner.caps;
    // Parsing and hashing a large model is CPU work: keep it off the async workers.
    let prepared = tokio::task::spawn_blocking(move || {
        prepare(&*engine, json_content, query.as_deref(), body, caps)
    })
    .await
    .map_err(ApiError::internal)??;
    let Prepared {
        model,
        format,
        model_hash,
        resolved,
    } = prepared;
    let store = &state.inner.store;
    let cache_key = sha256_hex(
        format!(
            "{}\n{model_hash}\n{}",
            kind.as_str(),
            canonical(kind, &resolved.request)
        )
        .as_bytes(),
    );

    let shutting_down = || {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the server is shutting down",
        )
        .with_header(header::RETRY_AFTER, HeaderValue::from_static("5"))
    };
    if *state.inner.shutting_down.borrow() {
        return Err(shutting_down());
    }
    let id = uuid::Uuid::new_v4().simple().to_string();
    let options = serde_json::to_string(&resolved.applied).map_err(ApiError::internal)?;
    let created_at = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
    let job = NewJob {
        id: &id,
        kind,
        model_hash: &model_hash,
        model_name: resolved.request.name.as_deref(),
        model_format: format_name(format),
        options: &options,
        cache_key: &cache_key,
        created_at: &created_at,
    };
    // Followable before it is claimed: an identical request that finds the claimed record
    // can wait for it even before it reaches the queue.
    state.inner.jobs.announce(&id);
    let claim = store.claim(&job, !resolved.refresh).map_err(store_error);
    if !matches!(claim, Ok(Some(Claim::Created))) {
        state.inner.jobs.forget(&id);
    }
    match claim? {
        None => return Err(shutting_down()),
        Some(Claim::Existing(existing)) => {
            if let Some(rx) = state.inner.jobs.follow(&existing) {
                wait_for(&state, rx, resolved.wait).await;
            }
            return answer(&state, kind, &existing, StatusCode::OK);
        }
        Some(Claim::Created) => {}
    }
    let rx = match state.inner.jobs.submit(Job {
        id: id.clone(),
        kind,
        model,
        format,
        request: resolved.request,
    }) {
        Ok(rx) => rx,
        Err(rejected) => {
            if let Err(e) = store.delete(kind, &id) {
                tracing::error!(error = %e, id, "cannot remove a rejected job");
            }
            let message = match rejected {
                Rejected::QueueFull => format!(
                    "the job queue is full ({} waiting, {} workers busy); retry later",
                    state.inner.config.queue, state.inner.config.workers
                ),
                Rejected::Stopped => "the server is shutting down".to_string(),
            };
            return Err(
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "queue_full", message)
                    .with_header(header::RETRY_AFTER, HeaderValue::from_static("5")),
            );
        }
    };
    wait_for(&state, rx, resolved.wait).await;
    answer(&state, kind, &id, StatusCode::CREATED)
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
    params(PlanQuery),
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

/// The Pareto frontier (budget -> overhead) of a model.
///
/// Same body and options as `POST /v1/plans` (`fraction` sets the budgets). A sweep is a job
/// like a plan: 201 with the frontier within the wait, else 202 and `GET /v1/sweeps/{id}`.
#[utoipa::path(
    post,
    path = "/v1/sweeps",
    tag = "sweeps",
    params(PlanQuery),
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

fn get_record(state: &AppState, kind: Kind, id: &str) -> Result<Response, ApiError> {
    let key = format!("{}/{id}", kind.as_str());
    let json = [(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    )];
    if let Some(body) = state.inner.rendered.get(&key) {
        return Ok((json, body).into_response());
    }
    let Some(Record { row, result }) = state.inner.store.get(kind, id).map_err(store_error)? else {
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
        state.inner.rendered.put(key, body.clone());
    }
    Ok((json, body).into_response())
}

fn delete_record(state: &AppState, kind: Kind, id: &str) -> Result<StatusCode, ApiError> {
    state
        .inner
        .rendered
        .remove(&format!("{}/{id}", kind.as_str()));
    if state.inner.store.delete(kind, id).map_err(store_error)? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!(
            "no {} with id {id:?}",
            kind.as_str()
        )))
    }
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
    get_record(&state, Kind::Plan, &id)
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
    delete_record(&state, Kind::Plan, &id)
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
    get_record(&state, Kind::Sweep, &id)
}

/// Deletes a sweep.
#[utoipa::path(
    delete,
    path = "/v1/sweeps/{id}",
    tag = "sweeps",
    params(("id" = String, Path, description = "Sweep id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 404, description = "Unknown id", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn delete_sweep(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    delete_record(&state, Kind::Sweep, &id)
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
        .map_err(store_error)?;
    let plans = rows
        .into_iter()
        .map(|row| record_out(Kind::Plan, row, None))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(json_response(StatusCode::OK, &PlanList { plans }))
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
) -> Result<Response, ApiError> {
    let rows = state.inner.store.history(&hash).map_err(store_error)?;
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

/// This document.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "service",
    responses((status = 200, description = "The OpenAPI document", body = Object))
)]
pub async fn openapi(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        state.inner.openapi.clone(),
    )
        .into_response()
}
