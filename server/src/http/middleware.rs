//! The middleware every route goes through: the bearer token on writes, the one error shape,
//! request metrics.

use super::error::{self, ApiError};
use super::state::AppState;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::time::Instant;
use subtle::ConstantTimeEq;

/// Writes need the bearer token when one is set (compared in constant time).
pub async fn require_token(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = &state.inner.config.token else {
        return next.run(request).await;
    };
    let write = matches!(
        *request.method(),
        Method::POST | Method::DELETE | Method::PUT | Method::PATCH
    );
    if !write {
        return next.run(request).await;
    }
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim());
    match given {
        Some(t) if bool::from(t.as_bytes().ct_eq(token.as_bytes())) => next.run(request).await,
        Some(_) => unauthorized("the bearer token is wrong"),
        None => unauthorized("writes need `Authorization: Bearer <token>`"),
    }
}

/// A body sent compressed (`Content-Encoding: gzip`, ...) is refused naming the encoding: the
/// service reads bodies as they are, and a gzipped ONNX file was reported as a malformed model
/// ("bad tag 31 at byte 1").
pub async fn refuse_encoded_bodies(request: Request, next: Next) -> Response {
    let encoding = request
        .headers()
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("(not text)").split(','))
        .map(str::trim)
        .find(|e| !e.is_empty() && !e.eq_ignore_ascii_case("identity"))
        .map(str::to_string);
    match encoding {
        None => next.run(request).await,
        Some(e) => ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "Content-Encoding {e:?}: request bodies are read as sent; send the model \
                 uncompressed (leave the Content-Encoding header out)"
            ),
        )
        .into_response(),
    }
}

fn unauthorized(message: &str) -> Response {
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
        .with_header(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"))
        .into_response()
}

/// Gives every error response the one error shape, including those axum and tower-http make
/// themselves (404 routes, 405, 408, 413, bad path parameters).
pub async fn error_shape(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    // A 413's text is axum's or tower-http's, which says no limit, whoever shaped it.
    if is_json && status != StatusCode::PAYLOAD_TOO_LARGE {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 16 * 1024)
        .await
        .ok()
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let message = match status {
        StatusCode::METHOD_NOT_ALLOWED => format!("method {method} is not allowed on {path}"),
        StatusCode::NOT_FOUND if text.is_empty() => format!("no route for {method} {path}"),
        StatusCode::REQUEST_TIMEOUT => "the request took too long".to_string(),
        // axum's and tower-http's own texts ("length limit exceeded") say no limit.
        StatusCode::PAYLOAD_TOO_LARGE => {
            let limit = state.inner.config.body_limit;
            format!(
                "the request body is over this server's limit of {limit} bytes ({:.1} MiB, \
                 its --body-limit)",
                limit as f64 / (1024.0 * 1024.0)
            )
        }
        s if s.is_server_error() => error::INTERNAL_MESSAGE.to_string(),
        _ if !text.is_empty() => text,
        s => s.canonical_reason().unwrap_or("error").to_string(),
    };
    if status.is_server_error() {
        tracing::error!(%method, %path, status = status.as_u16(), "server error without an error body");
    }
    let mut shaped = ApiError::new(status, error::code_for_status(status), message).into_response();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.remove(header::CONTENT_TYPE);
    for (name, value) in parts.headers.iter() {
        shaped.headers_mut().entry(name).or_insert(value.clone());
    }
    shaped
}

/// Counts requests by route, method and status, and times them.
pub async fn track(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |m| m.as_str().to_string());
    let method = match *request.method() {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        _ => "other",
    };
    let started = Instant::now();
    let response = next.run(request).await;
    let m = &state.inner.metrics;
    m.requests
        .with_label_values(&[route.as_str(), method, response.status().as_str()])
        .inc();
    m.request_seconds
        .with_label_values(&[route.as_str()])
        .observe(started.elapsed().as_secs_f64());
    response
}
