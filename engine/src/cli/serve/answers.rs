//! What the HTTP API answers when it cannot do what was asked, and how a
//! body comes in: every error as `{"error": "<code>", "message": "..."}`
//! with a fitting status, mapped from the library's errors in one place
//! ([`ApiError`]), and one extractor for JSON bodies ([`ApiJson`]). Why a
//! file of its own: the handlers (`api.rs`) only translate between HTTP and
//! the library; what every handler shares, and what the OpenAPI
//! description names once for all routes, lives here.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use flashsale::{AdminError, HoldError, PurchaseError};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// An error answer.
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    pub(super) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }
}

impl ApiError {
    /// The JSON error for a status produced outside the handlers (the
    /// router's 404/405, a path that does not decode, a body too large or
    /// too slow, a request past its deadline).
    pub fn for_status(status: StatusCode) -> Self {
        let code = match status {
            StatusCode::BAD_REQUEST => "bad_request",
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
            StatusCode::REQUEST_TIMEOUT => "request_timeout",
            StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
            StatusCode::UNPROCESSABLE_ENTITY => "invalid",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable",
            s if s.is_client_error() => "bad_request",
            _ => "internal",
        };
        let message = status.canonical_reason().unwrap_or("error");
        ApiError::new(status, code, message)
    }
}

/// The error answers every route but the probes can give, named once for
/// the OpenAPI description instead of on each route (with [`AdminErrors`]
/// and [`BodyErrors`]). Never built: they document [`ApiError`]'s answers.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum CommonErrors {
    /// A path segment that does not decode.
    #[response(
        status = 400,
        description = "`bad_request`: a path segment that does not decode"
    )]
    BadRequest(ErrorBody),
    /// The body came too slowly, or the request took too long.
    #[response(
        status = 408,
        description = "`request_timeout`: the body came too slowly, or the request outlived `server.request_timeout_ms`"
    )]
    RequestTimeout(ErrorBody),
    /// A bug.
    #[response(status = 500, description = "`internal`")]
    Internal(ErrorBody),
    /// Redis, a lock node or the server's capacity.
    #[response(
        status = 503,
        description = "`unavailable`: Redis or a lock node did not answer in time, or the server is at `max_in_flight`; retry"
    )]
    Unavailable(ErrorBody),
}

/// The error answer of the admin routes (bearer token).
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum AdminErrors {
    /// No or wrong token, or admin routes off.
    #[response(
        status = 401,
        description = "`unauthorized`: no or wrong bearer token, or admin routes off"
    )]
    Unauthorized(ErrorBody),
}

/// The error answers of the routes that take a JSON body.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum BodyErrors {
    /// Over the body limit.
    #[response(status = 413, description = "`payload_too_large`")]
    PayloadTooLarge(ErrorBody),
    /// Not JSON.
    #[response(status = 415, description = "`unsupported_media_type`: not JSON")]
    UnsupportedMediaType(ErrorBody),
}

/// The body of every error answer.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// What went wrong, as a stable code: `sold_out`, `limit_exceeded`,
    /// `invalid`, `unauthorized`... (each route lists its own).
    #[schema(value_type = String)]
    error: &'static str,
    /// The same for a person; its wording may change.
    message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.code,
            message: self.message,
        };
        (self.status, Json(body)).into_response()
    }
}

impl From<PurchaseError> for ApiError {
    /// The code is [`PurchaseError::code`], the same name the purchase
    /// metrics use; only the status is chosen here.
    fn from(e: PurchaseError) -> Self {
        let status = match &e {
            PurchaseError::SoldOut
            | PurchaseError::NotStarted
            | PurchaseError::Ended
            | PurchaseError::Closed => StatusCode::CONFLICT,
            PurchaseError::LimitExceeded { .. } => StatusCode::TOO_MANY_REQUESTS,
            PurchaseError::UnknownSale(_) => StatusCode::NOT_FOUND,
            PurchaseError::Invalid(_) | PurchaseError::RequestMismatch => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            PurchaseError::OrderLost { .. } => StatusCode::GONE,
            PurchaseError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            PurchaseError::NotAdmitted | PurchaseError::InvalidTicket(_) => StatusCode::FORBIDDEN,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.code(), e.to_string())
    }
}

impl From<flashsale::QueueError> for ApiError {
    /// The code is [`flashsale::QueueError::code`]; only the status is
    /// chosen here.
    fn from(e: flashsale::QueueError) -> Self {
        use flashsale::QueueError as Q;
        let status = match &e {
            Q::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Q::UnknownSale(_) => StatusCode::NOT_FOUND,
            Q::NoQueue(_) => StatusCode::CONFLICT,
            Q::InvalidTicket(_) => StatusCode::FORBIDDEN,
            Q::NoKeys | Q::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.code(), e.to_string())
    }
}

impl From<HoldError> for ApiError {
    /// The code is [`HoldError::code`]; only the status is chosen here.
    fn from(e: HoldError) -> Self {
        let status = match &e {
            HoldError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            HoldError::UnknownOrder(_) => StatusCode::NOT_FOUND,
            HoldError::NoHolds(_)
            | HoldError::HoldExpired { .. }
            | HoldError::AlreadyFinal { .. }
            | HoldError::PaymentConflict => StatusCode::CONFLICT,
            HoldError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.code(), e.to_string())
    }
}

impl From<AdminError> for ApiError {
    fn from(e: AdminError) -> Self {
        let (status, code) = match &e {
            AdminError::Invalid(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid"),
            AdminError::AlreadyExists(_) => (StatusCode::CONFLICT, "already_exists"),
            AdminError::UnknownSale(_) => (StatusCode::NOT_FOUND, "unknown_sale"),
            AdminError::Closed(_) => (StatusCode::CONFLICT, "closed"),
            AdminError::OperationMismatch(_) => {
                (StatusCode::UNPROCESSABLE_ENTITY, "operation_mismatch")
            }
            AdminError::Unavailable(_) | AdminError::Lock(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
            }
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        ApiError::new(status, code, e.to_string())
    }
}

/// A body past the size limit is 413, a wrong content type 415, anything
/// else about the JSON 422.
impl From<JsonRejection> for ApiError {
    fn from(e: JsonRejection) -> Self {
        let (status, code) = match e.status() {
            StatusCode::PAYLOAD_TOO_LARGE => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            _ => (StatusCode::UNPROCESSABLE_ENTITY, "invalid"),
        };
        ApiError::new(status, code, e.body_text())
    }
}

/// The one JSON body extractor: a JSON content type, a body within the
/// limit, a JSON object (serde would take a struct from an array too,
/// `["sku", "user", ...]`, by position: refused, so one request has one
/// spelling), parsed by axum's `Json`; every rejection an [`ApiError`].
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let json = req
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(is_json);
        if !json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "Expected request with `Content-Type: application/json`",
            ));
        }
        let body = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| match e.status() {
                StatusCode::PAYLOAD_TOO_LARGE => {
                    ApiError::new(e.status(), "payload_too_large", e.body_text())
                }
                _ => ApiError::new(StatusCode::BAD_REQUEST, "invalid", e.body_text()),
            })?;
        if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid",
                "the body must be a JSON object",
            ));
        }
        let Json(v) = Json::<T>::from_bytes(&body)?;
        Ok(ApiJson(v))
    }
}

/// `application/json`, or a JSON-based `application/*+json`, parameters
/// (`; charset=utf-8`) aside: the types axum's `Json` takes.
fn is_json(content_type: &str) -> bool {
    let mime = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
}
