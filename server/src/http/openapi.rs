//! The OpenAPI document, generated from the handlers' annotations.

use super::error::{ErrorBody, ErrorObject};
use super::options::PlanOptions;
use super::routes::{
    self, Accepted, Envelope, Health, History, HistoryEntry, ModelInfo, PlanList, PlanRecord,
};
use super::store::Status;
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
        routes::post_plan,
        routes::list_plans,
        routes::get_plan,
        routes::delete_plan,
        routes::post_sweep,
        routes::get_sweep,
        routes::delete_sweep,
        routes::history,
        routes::healthz,
        routes::metrics,
        routes::openapi,
    ),
    components(schemas(
        Accepted, Envelope, ErrorBody, ErrorObject, Health, History, HistoryEntry, ModelInfo, PlanList,
        PlanOptions, PlanRecord, Status
    )),
    modifiers(&BearerScheme),
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

/// The document as JSON text.
pub fn document() -> String {
    ApiDoc::openapi().to_pretty_json().unwrap_or_else(|e| {
        tracing::error!(error = %e, "cannot render the OpenAPI document");
        "{}".to_string()
    })
}
