//! The one error shape of the API, `{"error": {"code", "message", "details"}}`. The service's
//! own failures (`ServerError`) are in `failure.rs`.

use crate::engine::{EngineError, ErrorKind};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The error object inside the error shape; also what a failed plan stores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ErrorObject {
    /// Stable machine-readable code, e.g. `not_found`, `unsupported_ops`, `infeasible_budget`.
    pub code: String,
    /// A sentence for humans that names what is wrong.
    pub message: String,
    /// Structured details (the unsupported nodes, the unbound dims, the minimum budget...).
    #[schema(value_type = Object)]
    pub details: serde_json::Value,
}

/// The body of every error response.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorObject,
    /// The plan or sweep the error belongs to, when a job failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// An error response: a status and the error object.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub error: Box<ErrorObject>,
    pub id: Option<String>,
    pub headers: Vec<(header::HeaderName, HeaderValue)>,
}

/// The message a 500 carries; the real cause goes to the log only.
pub const INTERNAL_MESSAGE: &str = "internal error; the server log has the details";

impl ApiError {
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            error: Box::new(ErrorObject {
                code: code.to_string(),
                message: message.into(),
                details: serde_json::Value::Null,
            }),
            id: None,
            headers: Vec::new(),
        }
    }

    pub fn bad_request(code: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// A 500 with the generic message; `cause` is logged, never sent.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        tracing::error!(%cause, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            INTERNAL_MESSAGE,
        )
    }

    pub fn with_header(mut self, name: header::HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    /// The stored error of a failed job, answered with the status its kind calls for.
    pub fn from_stored(status: u16, error: ErrorObject, id: &str) -> Self {
        ApiError {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            error: Box::new(error),
            id: Some(id.to_string()),
            headers: Vec::new(),
        }
    }
}

/// The status an engine error kind maps to.
pub fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::BadInput => StatusCode::BAD_REQUEST,
        ErrorKind::Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorKind::Cancelled => StatusCode::GONE,
    }
}

/// What a client may see of an engine error: 4xx pass through, internal ones become generic
/// (and are logged here).
pub fn public_error(err: &EngineError) -> (StatusCode, ErrorObject) {
    let status = status_of(err.kind);
    if err.kind == ErrorKind::Internal {
        tracing::error!(code = %err.code, message = %err.message, details = %err.details, "engine internal error");
        return (
            status,
            ErrorObject {
                code: "internal".to_string(),
                message: INTERNAL_MESSAGE.to_string(),
                details: serde_json::Value::Null,
            },
        );
    }
    (
        status,
        ErrorObject {
            code: err.code.clone(),
            message: err.message.clone(),
            details: err.details.clone(),
        },
    )
}

impl From<EngineError> for ApiError {
    /// An engine error met before any job was made (no id).
    fn from(err: EngineError) -> Self {
        let (status, error) = public_error(&err);
        ApiError {
            status,
            error: Box::new(error),
            id: None,
            headers: Vec::new(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: *self.error,
            id: self.id,
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        for (name, value) in self.headers {
            response.headers_mut().append(name, value);
        }
        response
    }
}

/// The code used for a bare HTTP status (404 route, 405, 408, 413...) without an error body.
pub fn code_for_status(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST => "bad_request",
        StatusCode::UNAUTHORIZED => "unauthorized",
        StatusCode::FORBIDDEN => "forbidden",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::NOT_ACCEPTABLE => "not_acceptable",
        StatusCode::REQUEST_TIMEOUT => "request_timeout",
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::UNPROCESSABLE_ENTITY => "unprocessable",
        StatusCode::TOO_MANY_REQUESTS => "too_many_requests",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        s if s.is_server_error() => "internal",
        _ => "error",
    }
}
