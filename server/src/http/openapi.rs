//! The OpenAPI document, generated from the handlers' annotations and the documents' types,
//! and its route `/v1/openapi.json`.

use super::error::{ErrorBody, ErrorObject};
use super::models::{self, History, HistoryEntry};
use super::options::{not_applicable, EnvelopeOptions, SubmitOptions};
use super::plans::{self, PlanList};
use super::records::{Accepted, ModelInfo, PlanRecord};
use super::service::{self, Health};
use super::state::AppState;
use super::store::{JobStatus, Kind};
use super::submit::Envelope;
use super::sweeps;
use crate::engine::document::{PlanDocument, SweepDocument};
use crate::engine::PlanRequest;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use std::sync::OnceLock;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "remat",
        description = "Plans activation checkpointing (rematerialization) for neural-network training: \
                       post a model, get back which activations to keep and which to recompute."
    ),
    paths(
        plans::post_plan,
        plans::list_plans,
        plans::get_plan,
        plans::delete_plan,
        plans::put_validation,
        sweeps::post_sweep,
        sweeps::get_sweep,
        sweeps::delete_sweep,
        models::history,
        service::healthz,
        service::metrics,
        openapi,
    ),
    components(schemas(
        Accepted, Envelope, EnvelopeOptions, ErrorBody, ErrorObject, Health, History, HistoryEntry,
        JobStatus, ModelInfo, PlanDocument, PlanList, PlanRecord, PlanRequest, SubmitOptions,
        SweepDocument
    )),
    modifiers(&BearerScheme, &ApplicableParams),
    tags(
        (name = "plans", description = "Checkpointing plans of one model and budget"),
        (name = "sweeps", description = "Budget vs overhead frontiers"),
        (name = "models", description = "Plans grouped by model"),
        (name = "service", description = "Health, metrics, this document"),
    )
)]
pub struct ApiDoc;

/// Writes (POST, DELETE) need `Authorization: Bearer <token>` when the server has a token.
struct BearerScheme;

impl Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Each `POST` of a job lists only the query parameters that apply to its kind: the handlers
/// share `PlanRequest`'s parameters, and `options::check_applies` refuses the others with 400.
struct ApplicableParams;

impl Modify for ApplicableParams {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for (path, kind) in [("/v1/plans", Kind::Plan), ("/v1/sweeps", Kind::Sweep)] {
            let params = openapi
                .paths
                .paths
                .get_mut(path)
                .and_then(|item| item.post.as_mut())
                .and_then(|op| op.parameters.as_mut());
            if let Some(params) = params {
                params.retain(|p| !not_applicable(kind).contains(&p.name.as_str()));
            }
        }
    }
}

/// The document as JSON text, rendered once per process.
pub fn document() -> &'static str {
    static DOCUMENT: OnceLock<String> = OnceLock::new();
    DOCUMENT.get_or_init(|| {
        ApiDoc::openapi().to_pretty_json().unwrap_or_else(|e| {
            tracing::error!(error = %e, "cannot render the OpenAPI document");
            "{}".to_string()
        })
    })
}

/// The route of this document.
pub fn router() -> Router<AppState> {
    Router::new().route("/v1/openapi.json", get(openapi))
}

/// This document.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "service",
    responses((status = 200, description = "The OpenAPI document", body = Object))
)]
pub async fn openapi() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        document(),
    )
        .into_response()
}
