//! The OpenAPI 3.1 description `serve` publishes at `/openapi.json`,
//! generated from the handlers' own types and `#[utoipa::path]`
//! annotations in `api.rs`, not written by hand: a route, a field or an
//! error code the handlers change is changed here too, and a schemathesis
//! run against a live `serve` (`tests/tests/openapi.rs`) checks that the
//! answers keep to it.

use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{answers, api, queue};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "flashsale",
        description = "A flash-sale inventory engine: purchases that never oversell, \
                       orders that are never lost. Every error answers \
                       `{\"error\": \"<code>\", \"message\": \"...\"}`."
    ),
    paths(
        api::create_sale,
        api::sale_status,
        api::restock,
        api::close,
        api::purchase,
        queue::join,
        queue::status,
        api::pay,
        api::cancel,
        api::order,
        api::healthz,
        api::readyz,
        api::metrics,
    ),
    components(schemas(answers::ErrorBody)),
    modifiers(&AdminToken),
    tags(
        (name = "sales", description = "What buyers' clients call: purchases and reads"),
        (name = "queue", description = "The waiting room: join a sale's line, read a ticket"),
        (name = "admin", description = "The shop's backend: `Authorization: Bearer <server.admin_token>`"),
        (name = "probes", description = "Liveness, readiness and the Prometheus scrape"),
    )
)]
pub struct ApiDoc;

/// The bearer token of the admin routes.
struct AdminToken;

impl Modify for AdminToken {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        if let Some(components) = openapi.components.as_mut() {
            components.add_security_scheme(
                "admin_token",
                SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
            );
        }
    }
}

/// `GET /openapi.json`.
pub async fn openapi_json() -> axum::Json<utoipa::openapi::OpenApi> {
    axum::Json(ApiDoc::openapi())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every public route is described, as OpenAPI 3.1, and every error
    /// answer of every operation has the one error shape.
    #[test]
    fn every_route_is_described_with_its_errors() {
        let doc = serde_json::to_value(ApiDoc::openapi()).expect("json");
        assert_eq!(doc["openapi"], "3.1.0");
        let paths = doc["paths"].as_object().expect("paths");
        let mut described: Vec<&str> = paths.keys().map(String::as_str).collect();
        described.sort_unstable();
        assert_eq!(
            described,
            [
                "/healthz",
                "/metrics",
                "/readyz",
                "/v1/orders/{order_id}",
                "/v1/orders/{order_id}/cancel",
                "/v1/orders/{order_id}/pay",
                "/v1/queue/{ticket}",
                "/v1/sales",
                "/v1/sales/{sku}",
                "/v1/sales/{sku}/close",
                "/v1/sales/{sku}/purchase",
                "/v1/sales/{sku}/queue",
                "/v1/sales/{sku}/restock",
            ]
        );
        for (path, ops) in paths {
            for (method, op) in ops.as_object().expect("operations") {
                // The shared answers (`CommonErrors`, `AdminErrors`,
                // `BodyErrors`) reach every route they belong to.
                let mut owed = Vec::new();
                if path.starts_with("/v1") {
                    owed.extend(["400", "408", "500", "503"]);
                }
                if op.get("security").is_some() {
                    owed.push("401");
                }
                if op.get("requestBody").is_some() {
                    owed.extend(["413", "415"]);
                }
                for status in owed {
                    assert!(
                        op["responses"].get(status).is_some(),
                        "{method} {path} does not describe {status}"
                    );
                }
                for (status, answer) in op["responses"].as_object().expect("responses") {
                    if status.starts_with('4') || status == "500" {
                        let schema = &answer["content"]["application/json"]["schema"]["$ref"];
                        assert_eq!(
                            schema, "#/components/schemas/ErrorBody",
                            "{method} {path} {status}"
                        );
                    }
                }
            }
        }
    }
}
