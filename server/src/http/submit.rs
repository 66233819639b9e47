//! A submission (`POST /v1/plans`, `POST /v1/sweeps`): the body read (ONNX bytes, a
//! node-link graph or an envelope), the options resolved, the model hashed, the job claimed
//! in the store (or the stored one found) and queued, and the answer once the wait is over.

use super::error::{code_for_status, ApiError, ErrorObject};
use super::jobs::{Job, Rejected};
use super::notices::Ended;
use super::options::{canonical, query_pairs, resolve, Caps, EnvelopeOptions, Query, Resolved};
use super::records::{
    json_response, record_out, store_error, stored_error, with_location, Accepted,
};
use super::state::{AppState, Queue};
use super::store::{Claim, JobStatus, Kind, NewJob, Record, Reuse, Row, Store};
use crate::engine::{Engine, Fitted, ModelFormat, PlanRequest};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Deserialize;
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
    /// Read by [`EnvelopeOptions::read`].
    #[schema(value_type = Option<EnvelopeOptions>)]
    pub options: Option<serde_json::Value>,
}

pub fn sha256_hex(bytes: &[u8]) -> String {
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
    resolved: Resolved,
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
    caps: Caps,
) -> Result<Prepared, ApiError> {
    let query = Query::parse(&query_pairs(query)?)?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "empty_body",
            "the request has no model: send ONNX bytes (application/octet-stream), a node-link graph \
             (application/json) or an envelope {\"model\": ..., \"options\": ...}",
        ));
    }
    // A JSON body is parsed once, below; its format comes from the parsed object.
    let (model, format, options) = if json_content || ModelFormat::is_json_object(&body) {
        let value: serde_json::Value = serde_json::from_slice(ModelFormat::without_bom(&body))
            .map_err(|e| {
                ApiError::bad_request("invalid_json", format!("the body is not valid JSON: {e}"))
            })?;
        match value {
            serde_json::Value::Object(ref map) if map.contains_key("model") => {
                let invalid_envelope =
                    |e: serde_json::Error| ApiError::bad_request("invalid_envelope", format!("the envelope: {e}"));
                let envelope: Envelope = serde_json::from_value(value).map_err(invalid_envelope)?;
                let options = EnvelopeOptions::read(envelope.options)
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
                    graph @ serde_json::Value::Object(_) => (canonical_json(&graph)?, ModelFormat::of_json(&graph)),
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
                (model, format, Some(options))
            }
            graph @ serde_json::Value::Object(_) => {
                let format = ModelFormat::of_json(&graph);
                (canonical_json(&graph)?, format, None)
            }
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
    let model_hash = sha256_hex(&model);
    if let Some(want) = resolved.expect_model.as_deref() {
        if want != model_hash {
            let mut e = ApiError::new(
                StatusCode::CONFLICT,
                "model_mismatch",
                format!(
                    "the model sent hashes to {model_hash}, not to {want} (expect_model): \
                     it is not the model asked for"
                ),
            );
            e.error.details = serde_json::json!({ "expected": want, "got": model_hash });
            return Err(e);
        }
    }
    engine.check(&model, format).map_err(ApiError::from)?;
    Ok(Prepared {
        model_hash,
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

pub(super) fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|r| {
        let status = r.status();
        ApiError::new(status, code_for_status(status), r.body_text())
    })
}

/// Waits until the job is done or failed, `wait` passes, or the server shuts down.
async fn wait_for(
    state: &AppState,
    mut rx: tokio::sync::watch::Receiver<JobStatus>,
    wait: Duration,
) {
    if wait.is_zero() {
        return;
    }
    let mut shutdown = state.inner.shutting_down.subscribe();
    tokio::select! {
        _ = tokio::time::timeout(wait, rx.wait_for(|s| s.is_terminal())) => {}
        _ = shutdown.wait_for(|down| *down) => {}
    }
}

/// Waits, on the shared queue, until job `id` is done or failed (or gone), `wait` passes, or
/// the server shuts down. The worker's last write is heard at once while this replica follows
/// the database's notices (`notices.rs`); the database is looked at too: every `wait_poll`
/// (2 s by default) while the notices are followed, every 20 ms at first and then up to every
/// 250 ms while they are not (the listener reconnecting). Counted by what ended the wait
/// (`remat_shared_waits_total`).
async fn poll_for(
    state: &AppState,
    kind: Kind,
    id: &str,
    wait: Duration,
) -> Result<Option<JobStatus>, ApiError> {
    let Store::Postgres(pg) = &state.inner.store else {
        return Ok(None);
    };
    if wait.is_zero() {
        return Ok(None);
    }
    let mut last = None;
    let mut unreachable = false;
    let key = format!("{}/{id}", kind.as_str());
    let mut ended = state.inner.ended.subscribe();
    let end = tokio::time::Instant::now() + wait;
    let mut unheard_pause = Duration::from_millis(20);
    let mut shutdown = state.inner.shutting_down.subscribe();
    // What woke the wait before this look: none yet, a notice, or the timer.
    let mut woken_by = "already";
    let ended_by = loop {
        match pg.status(kind, id).await {
            Ok(Some(status)) if !status.is_terminal() => last = Some(status),
            Ok(_) => break woken_by,
            // The database out of reach for a while (a restart, a failover): the job is in it
            // and runs on; the wait goes on until it ends or the database answers again.
            Err(e) if e.is_unavailable() => {
                if !unreachable {
                    tracing::warn!(error = %e, id, "the database is unreachable while a post waits for its job; looking again");
                    unreachable = true;
                }
            }
            Err(e) => return Err(store_error(e)),
        }
        let now = tokio::time::Instant::now();
        if *shutdown.borrow() {
            break "shutdown";
        }
        if now >= end {
            break "timeout";
        }
        // The cache is trusted exactly while the listener is connected (`notices::listen`).
        let pause = if state.inner.rendered.trusted() {
            state.inner.config.wait_poll
        } else {
            let pause = unheard_pause;
            unheard_pause = (unheard_pause * 2).min(Duration::from_millis(250));
            pause
        };
        woken_by = tokio::select! {
            _ = tokio::time::sleep(pause.min(end - now)) => "look",
            _ = Ended::of(&mut ended, &key) => "notice",
            _ = shutdown.wait_for(|down| *down) => break "shutdown",
        };
    };
    state
        .inner
        .metrics
        .waits
        .with_label_values(&[ended_by])
        .inc();
    Ok(last)
}

/// The answer to a submission once the wait is over: the plan (`done_status`), the job's
/// error, or 202 with its id.
async fn answer(
    state: &AppState,
    kind: Kind,
    id: &str,
    done_status: StatusCode,
) -> Result<Response, ApiError> {
    let Some(Record { row, result }) =
        state.inner.store.get(kind, id).await.map_err(store_error)?
    else {
        return Err(ApiError::not_found(format!(
            "{} {id} was deleted while it ran",
            kind.as_str()
        )));
    };
    let response = match row.status {
        JobStatus::Done => json_response(done_status, &record_out(kind, row, result)?),
        JobStatus::Failed => {
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

/// Whether the plan the last identical request got (done) costs more than a plan of the same
/// problem made after it whose peak fits that plan's budget: a plan at a lower budget, made
/// later, that the identical request would now be offered (`pipeline::reuse`). Answering the
/// stored plan would then give a dearer plan at a larger budget than the service has found
/// (issue 19); the request is planned again instead. A later plan only, so that a plan made
/// again is not superseded by the one it was offered. Best effort: a store that cannot
/// answer keeps the stored plan.
async fn superseded(store: &Store, model_hash: &str, request: &PlanRequest) -> bool {
    if request.maximize.is_some() {
        return false;
    }
    let rows = match store.history(model_hash).await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the model's plans; answering the stored one");
            return false;
        }
    };
    let key = canonical(Kind::Plan, request);
    let requests: Vec<(&Row, PlanRequest)> = rows
        .iter()
        .filter_map(|r| Some((r, serde_json::from_str(&r.options).ok()?)))
        .collect();
    let Some(at) = requests
        .iter()
        .rposition(|(_, q)| canonical(Kind::Plan, q) == key)
    else {
        return false;
    };
    // The figures of a finished plan that has a schedule, from its stored summary.
    let figures = |r: &Row| -> Option<Fitted> {
        if r.status != JobStatus::Done {
            return None;
        }
        Fitted::read(&serde_json::from_str(r.summary.as_deref()?).ok()?)
    };
    let Some(stored) = figures(requests[at].0) else {
        return false;
    };
    requests[at + 1..].iter().any(|(r, q)| {
        q.same_problem(request)
            && figures(r).is_some_and(|f| {
                f.peak_bytes <= stored.budget_bytes && f.overhead < stored.overhead - 1e-9
            })
    })
}

/// Runs one submission of `kind`: reads and identifies it, answers the stored job when the same
/// model and options were submitted before (unless `refresh`), else queues a new job, then
/// answers once the wait is over.
pub async fn submit(
    state: AppState,
    kind: Kind,
    headers: HeaderMap,
    query: Option<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    if headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().to_ascii_lowercase().starts_with("multipart/"))
    {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "a form upload (multipart/form-data) is not read: send the model as the body itself \
             (ONNX: application/octet-stream, curl --data-binary @model.onnx; a JSON graph or an \
             envelope: application/json)",
        ));
    }
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
    super::options::check_applies(kind, &resolved.request)?;
    // Options this model's format would ignore: refused before a job is made, which would
    // fail with the same error and stay in the model's history.
    state
        .inner
        .engine
        .check_options(format, &resolved.request)
        .map_err(ApiError::from)?;
    if kind == Kind::Plan {
        state
            .inner
            .engine
            .check_plan(&resolved.request)
            .map_err(ApiError::from)?;
    }
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
    // The job an identical request made is the answer, unless asked to plan again or a
    // cheaper plan of the same problem that fits its budget was made after it.
    let reuse = if resolved.refresh {
        Reuse::Never
    } else if kind == Kind::Plan && superseded(store, &model_hash, &resolved.request).await {
        // Planned again; an identical request that found the same is one job with it.
        Reuse::InFlight
    } else {
        Reuse::Any
    };
    let id = uuid::Uuid::new_v4().simple().to_string();
    let options = serde_json::to_string(&resolved.applied).map_err(ApiError::internal)?;
    let created_at = super::store::now();
    let job = NewJob {
        id: &id,
        kind,
        model_hash: &model_hash,
        model_name: resolved.request.name.as_deref(),
        model_format: format.as_str(),
        options: &options,
        cache_key: &cache_key,
        created_at: &created_at,
    };
    match &state.inner.queue {
        Queue::Local(jobs) => {
            let Store::Sqlite(sqlite) = store else {
                return Err(ApiError::internal(
                    "the embedded queue runs on a SQLite store",
                ));
            };
            // Followable before it is claimed: an identical request that finds the claimed
            // record can wait for it even before it reaches the queue.
            jobs.announce(&id);
            let claim = sqlite.claim(&job, reuse).map_err(|e| store_error(e.into()));
            if !matches!(claim, Ok(Some(Claim::Created))) {
                jobs.forget(&id);
            }
            match claim? {
                None => return Err(shutting_down()),
                Some(Claim::Existing(existing)) => {
                    if let Some(rx) = jobs.follow(&existing) {
                        wait_for(&state, rx, resolved.wait).await;
                    }
                    return answer(&state, kind, &existing, StatusCode::OK).await;
                }
                Some(Claim::QueueFull) => return Err(queue_full(&state)),
                Some(Claim::Created) => {}
            }
            let rx = match jobs.submit(Job {
                id: id.clone(),
                kind,
                model,
                format,
                request: resolved.request,
                model_hash: model_hash.clone(),
            }) {
                Ok(rx) => rx,
                Err(rejected) => {
                    if let Err(e) = sqlite.delete(kind, &id) {
                        tracing::error!(error = %e, id, "cannot remove a rejected job");
                    }
                    return Err(match rejected {
                        Rejected::QueueFull => queue_full(&state),
                        Rejected::Stopped => shutting_down(),
                    });
                }
            };
            wait_for(&state, rx, resolved.wait).await;
            answer(&state, kind, &id, StatusCode::CREATED).await
        }
        Queue::Shared { .. } => {
            let Store::Postgres(pg) = store else {
                return Err(ApiError::internal(
                    "the shared queue runs on a PostgreSQL store",
                ));
            };
            let request = serde_json::to_string(&resolved.request).map_err(ApiError::internal)?;
            let validate = kind == Kind::Plan && resolved.request.validate == Some(true);
            let claim = pg
                .claim(
                    &job,
                    reuse,
                    &model,
                    &request,
                    validate,
                    state.inner.config.queue,
                )
                .await
                .map_err(store_error)?;
            let (id, status) = match claim {
                None => return Err(shutting_down()),
                Some(Claim::QueueFull) => return Err(queue_full(&state)),
                Some(Claim::Existing(existing)) => (existing, StatusCode::OK),
                Some(Claim::Created) => (id, StatusCode::CREATED),
            };
            let last = poll_for(&state, kind, &id, resolved.wait).await?;
            match answer(&state, kind, &id, status).await {
                // The job exists (its claim was answered) but the database cannot be read
                // now: its id, to look it up later, rather than a 503 the client could only
                // retry (a `refresh` post would make a second job).
                Err(e) if e.error.code == "database_unavailable" => {
                    let status = last.unwrap_or(JobStatus::Queued);
                    let mut response = json_response(
                        StatusCode::ACCEPTED,
                        &Accepted {
                            id: id.clone(),
                            status,
                        },
                    );
                    response
                        .headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
                    Ok(with_location(response, kind, &id))
                }
                other => other,
            }
        }
    }
}

/// 503 for a full queue, with `Retry-After`.
fn queue_full(state: &AppState) -> ApiError {
    let config = &state.inner.config;
    let message = match &state.inner.queue {
        Queue::Local(_) => format!(
            "the job queue is full ({} waiting, {} workers busy); retry later",
            config.queue, config.workers
        ),
        Queue::Shared { .. } => format!(
            "the job queue is full ({} jobs waiting for a worker); retry later",
            config.queue
        ),
    };
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "queue_full", message)
        .with_header(header::RETRY_AFTER, HeaderValue::from_static("5"))
}
