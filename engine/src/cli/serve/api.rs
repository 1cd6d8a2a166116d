//! The HTTP API under `/v1`: JSON in and out. Errors map to answers in
//! one place ([`ApiError`], in `answers.rs`, with the one body extractor
//! [`ApiJson`]); bodies go out as typed structs; admin routes sit behind
//! one layer ([`require_admin`]). Handlers only translate between HTTP and
//! the library.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use flashsale::{PurchaseRequest, SaleSpec};
use serde::{Deserialize, Serialize};

use super::answers::{AdminErrors, ApiError, ApiJson, BodyErrors, CommonErrors, ErrorBody};
use super::AppState;

/// The layer in front of every admin route: `Authorization: Bearer
/// <server.admin_token>`, checked before the handler reads anything.
pub async fn require_admin(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    authorize(&state, req.headers())?;
    Ok(next.run(req).await)
}

fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = state.admin_token.as_deref() else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "admin routes are off: set server.admin_token or FLASHSALE_ADMIN_TOKEN",
        ));
    };
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given.is_some_and(|g| constant_time_eq(g.as_bytes(), expected.as_bytes())) {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong bearer token",
        ))
    }
}

/// Compares in constant time with `subtle`, made for it (it replaces a
/// hand-made fold over SHA-1 digests): where a guess first differs does not
/// show in the time taken. A guess of another length is refused at once;
/// the length alone does not bring a guess closer.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    bool::from(a.ct_eq(b))
}

/// The `{sku}` of a sale's routes (described only: the handlers take it as
/// a string and refuse a bad one with 422 `invalid`).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct SkuPath {
    /// The sale: 1-64 of `A-Z a-z 0-9 . _ - :`.
    #[param(pattern = "^[A-Za-z0-9._:-]{1,64}$", min_length = 1, max_length = 64)]
    sku: String,
}

/// `POST /v1/sales` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSale {
    /// 1-64 of `A-Z a-z 0-9 . _ - :`.
    #[schema(pattern = "^[A-Za-z0-9._:-]{1,64}$", min_length = 1, max_length = 64)]
    sku: String,
    /// Units on sale, 1..=2^53-1.
    #[schema(minimum = 1, maximum = 9007199254740991_u64)]
    stock: u64,
    /// Stock buckets on distinct masters (absent = 1).
    #[serde(default = "one")]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 64)]
    buckets: u32,
    #[serde(default)]
    #[schema(value_type = Option<u32>)]
    per_user_limit: u32,
    /// Unix ms; absent = now.
    starts_at_ms: Option<u64>,
    /// Unix ms; absent = open-ended.
    ends_at_ms: Option<u64>,
    /// Payment window of an order, ms; 0 (absent) = paid when confirmed;
    /// at most 7 days.
    #[serde(default)]
    #[schema(value_type = Option<u64>, maximum = 604800000_u64)]
    hold_ms: u64,
    /// "refuse" (absent) or "retake".
    #[serde(default)]
    #[schema(value_type = Option<flashsale::LatePayment>)]
    late_payment: flashsale::LatePayment,
    /// A waiting room in front of the sale (absent: none). Needs
    /// `per_user_limit` >= 1: one admission buys at most the limit.
    queue: Option<QueueSettings>,
}

fn one() -> u32 {
    1
}

/// A sale's waiting room, on create.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QueueSettings {
    /// Admissions per second (a number in [1/3600, 1000000]), or "auto" (absent:
    /// as fast as places free up, bounded by the stock).
    #[serde(default)]
    #[schema(value_type = Option<RateSetting>)]
    rate_per_s: RateSetting,
    /// How long an admitted user may buy, ms, 1000..=86400000 (absent:
    /// 120000).
    #[serde(default = "default_window")]
    #[schema(value_type = Option<u64>, minimum = 1000, maximum = 86400000_u64)]
    window_ms: u64,
    /// "fifo" (absent) or "shuffle_at_start".
    #[serde(default)]
    #[schema(value_type = Option<flashsale::QueueOrder>)]
    order: flashsale::QueueOrder,
    /// Admitted and not yet done never exceed overbook x (remaining +
    /// held); 1..=100 (absent: 1).
    #[serde(default = "default_overbook")]
    #[schema(value_type = Option<f64>, minimum = 1, maximum = 100)]
    overbook: f64,
}

/// `rate_per_s`: a number, or the word "auto".
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum RateSetting {
    /// Admissions per second.
    PerSecond(f64),
    /// "auto".
    Auto(AutoWord),
}

impl Default for RateSetting {
    fn default() -> Self {
        RateSetting::Auto(AutoWord::Auto)
    }
}

/// The word "auto".
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum AutoWord {
    /// As fast as places free up.
    Auto,
}

fn default_window() -> u64 {
    120_000
}

fn default_overbook() -> f64 {
    1.0
}

impl QueueSettings {
    fn spec(&self) -> flashsale::QueueSpec {
        flashsale::QueueSpec {
            rate: match self.rate_per_s {
                RateSetting::PerSecond(r) => flashsale::QueueRate::PerSecond(r),
                RateSetting::Auto(_) => flashsale::QueueRate::Auto,
            },
            window_ms: self.window_ms,
            order: self.order,
            overbook: self.overbook,
        }
    }
}

fn at(field: &str, ms: Option<u64>) -> Result<Option<SystemTime>, ApiError> {
    ms.map(|m| {
        UNIX_EPOCH
            .checked_add(Duration::from_millis(m))
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid",
                    format!("{field}: {m} is not a time"),
                )
            })
    })
    .transpose()
}

/// The admin operation's id: the `Idempotency-Key` header when the caller
/// sends one (a retry with the same key is applied once), else a fresh id.
fn operation_id(headers: &HeaderMap) -> Result<String, ApiError> {
    match headers.get("idempotency-key") {
        None => Ok(flashsale::admin::new_operation_id()),
        Some(v) => v.to_str().map(str::to_owned).map_err(|_| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid",
                "Idempotency-Key must be visible ASCII",
            )
        }),
    }
}

/// Creates a sale (admin). With an `Idempotency-Key`, a retry is applied once.
#[utoipa::path(post, path = "/v1/sales", tag = "admin",
    security(("admin_token" = [])),
    params(("Idempotency-Key" = Option<String>, Header, description = "retries with the same key are applied once")),
    request_body = CreateSale,
    responses(
        (status = 201, description = "created (or created before with this key)", body = flashsale::SaleStatus),
        (status = 409, description = "`already_exists` or `closed`", body = ErrorBody),
        (status = 422, description = "`invalid` or `operation_mismatch`", body = ErrorBody),
        CommonErrors,
        AdminErrors,
        BodyErrors,
    ))]
pub async fn create_sale(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(c): ApiJson<CreateSale>,
) -> Result<Response, ApiError> {
    let op = operation_id(&headers)?;
    let spec = SaleSpec {
        sku: c.sku,
        stock: c.stock,
        buckets: c.buckets,
        per_user_limit: c.per_user_limit,
        starts_at: at("starts_at_ms", c.starts_at_ms)?,
        ends_at: at("ends_at_ms", c.ends_at_ms)?,
        hold_ms: c.hold_ms,
        late_payment: c.late_payment,
        queue: c.queue.as_ref().map(QueueSettings::spec),
    };
    let status = state.engine.create_sale_op(spec, &op).await?;
    Ok((StatusCode::CREATED, Json(status)).into_response())
}

/// A sale's state and stock, bucket by bucket.
#[utoipa::path(get, path = "/v1/sales/{sku}", tag = "sales",
    params(SkuPath),
    responses(
        (status = 200, description = "the sale", body = flashsale::SaleStatus),
        (status = 404, description = "`unknown_sale`", body = ErrorBody),
        (status = 422, description = "`invalid`: not a valid sku", body = ErrorBody),
        CommonErrors,
    ))]
pub async fn sale_status(
    State(state): State<AppState>,
    Path(sku): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(state.engine.sale_status(&sku).await?).into_response())
}

/// `POST /v1/sales/{sku}/restock` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Restock {
    /// Units to add, 1..=2^53-1.
    #[schema(minimum = 1, maximum = 9007199254740991_u64)]
    qty: u64,
}

/// Adds units (admin). With an `Idempotency-Key`, a retry is applied once.
#[utoipa::path(post, path = "/v1/sales/{sku}/restock", tag = "admin",
    security(("admin_token" = [])),
    params(SkuPath,
        ("Idempotency-Key" = Option<String>, Header, description = "retries with the same key are applied once")),
    request_body = Restock,
    responses(
        (status = 200, description = "restocked", body = flashsale::SaleStatus),
        (status = 404, description = "`unknown_sale`", body = ErrorBody),
        (status = 409, description = "`closed`", body = ErrorBody),
        (status = 422, description = "`invalid` or `operation_mismatch`", body = ErrorBody),
        CommonErrors,
        AdminErrors,
        BodyErrors,
    ))]
pub async fn restock(
    State(state): State<AppState>,
    Path(sku): Path<String>,
    headers: HeaderMap,
    ApiJson(r): ApiJson<Restock>,
) -> Result<Response, ApiError> {
    let op = operation_id(&headers)?;
    Ok(Json(state.engine.restock_op(&sku, r.qty, &op).await?).into_response())
}

/// Closes a sale for good (admin): no purchase is confirmed after it.
#[utoipa::path(post, path = "/v1/sales/{sku}/close", tag = "admin",
    security(("admin_token" = [])),
    params(SkuPath),
    responses(
        (status = 200, description = "closed (or closed before)", body = flashsale::SaleStatus),
        (status = 404, description = "`unknown_sale`", body = ErrorBody),
        (status = 422, description = "`invalid`", body = ErrorBody),
        CommonErrors,
        AdminErrors,
    ))]
pub async fn close(
    State(state): State<AppState>,
    Path(sku): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(state.engine.close_sale(&sku).await?).into_response())
}

/// `POST /v1/sales/{sku}/purchase` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Purchase {
    /// The buyer: 1-128 bytes, no spaces, control or invisible characters,
    /// in Unicode NFC.
    #[schema(pattern = "^\\S+$", min_length = 1, max_length = 128)]
    user: String,
    /// Units, 1..=`max_qty` (100 unless configured).
    #[schema(minimum = 1)]
    qty: i64,
    /// The client's id for this purchase: a retry with the same id gets the
    /// same answer. Rules as for `user`.
    #[schema(pattern = "^\\S+$", min_length = 1, max_length = 128)]
    request_id: String,
    /// On a sale with a waiting room: the admission token the user's
    /// ticket read once admitted (`GET /v1/queue/{ticket}`). Not looked
    /// at on a sale without a room.
    admission_token: Option<String>,
}

/// A confirmed purchase, as the buyer's client sees it.
#[derive(Serialize, utoipa::ToSchema)]
pub struct PurchaseAnswer {
    order_id: String,
    sku: String,
    bucket: u32,
    /// True when this request was answered before (a retry): the same order.
    replayed: bool,
    /// `paid`, or `held` until `expires_at_ms` (a sale with holds): the
    /// same field, and the same names, as `GET /v1/orders/{order_id}`.
    state: flashsale::OrderState,
    expires_at_ms: Option<u64>,
}

/// Buys `qty` units for `user`; a retry with the same `request_id` gets the
/// same answer.
#[utoipa::path(post, path = "/v1/sales/{sku}/purchase", tag = "sales",
    params(SkuPath),
    request_body = Purchase,
    responses(
        (status = 200, description = "confirmed: the order (`replayed` on a retry)", body = PurchaseAnswer),
        (status = 404, description = "`unknown_sale`", body = ErrorBody),
        (status = 409, description = "`sold_out`, `not_started`, `ended` or `closed`", body = ErrorBody),
        (status = 410, description = "`order_lost`: a failover under ack = leader took this request's order back", body = ErrorBody),
        (status = 422, description = "`invalid`, or `request_mismatch` (this request_id was used with another qty)", body = ErrorBody),
        (status = 403, description = "a sale with a waiting room: `not_admitted` (no admission token valid now) or `invalid_ticket` (the token does not verify)", body = ErrorBody),
        (status = 429, description = "`limit_exceeded` (the per-user limit) or `rate_limited`", body = ErrorBody),
        CommonErrors,
        BodyErrors,
    ))]
pub async fn purchase(
    State(state): State<AppState>,
    Path(sku): Path<String>,
    ApiJson(p): ApiJson<Purchase>,
) -> Result<Json<PurchaseAnswer>, ApiError> {
    // Validated before the rate limiter: a request that changes nothing
    // spends nobody's allowance, and the limiter only ever holds user ids
    // of a bounded, valid shape.
    let checked = state.engine.check(PurchaseRequest {
        sku: &sku,
        user: &p.user,
        qty: p.qty,
        request_id: &p.request_id,
    })?;
    if !state.limiter.allow(&p.user) {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "too many requests; slow down",
        ));
    }
    let checked = match p.admission_token.as_deref() {
        Some(token) => checked.with_admission(token),
        None => checked,
    };
    let c = state.engine.purchase_checked(checked).await?;
    Ok(Json(PurchaseAnswer {
        order_id: c.order_id,
        sku,
        bucket: c.bucket,
        replayed: c.replayed,
        state: c.status,
        expires_at_ms: c.expires_at_ms,
    }))
}

/// `POST /v1/orders/{order_id}/pay` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Pay {
    /// The payment's reference: 1-128 bytes; a retry with the same one
    /// answers the same.
    #[schema(min_length = 1, max_length = 128)]
    payment_ref: String,
}

/// `POST /v1/orders/{order_id}/pay` (admin: the shop's backend, once the
/// payment went through). A retry with the same `payment_ref` answers the
/// same.
#[utoipa::path(post, path = "/v1/orders/{order_id}/pay", tag = "admin",
    security(("admin_token" = [])),
    params(("order_id" = String, Path, description = "the held order")),
    request_body = Pay,
    responses(
        (status = 200, description = "paid (`replayed` on a retry with the same payment_ref)", body = flashsale::Transition),
        (status = 404, description = "`unknown_order`", body = ErrorBody),
        (status = 409, description = "`no_holds`, `hold_expired`, `already_final` or `payment_conflict`", body = ErrorBody),
        (status = 422, description = "`invalid`", body = ErrorBody),
        CommonErrors,
        AdminErrors,
        BodyErrors,
    ))]
pub async fn pay(
    State(state): State<AppState>,
    Path(order_id): Path<String>,
    ApiJson(p): ApiJson<Pay>,
) -> Result<Json<flashsale::Transition>, ApiError> {
    Ok(Json(state.engine.pay(&order_id, &p.payment_ref).await?))
}

/// `POST /v1/orders/{order_id}/cancel` (admin): the units go back on sale.
#[utoipa::path(post, path = "/v1/orders/{order_id}/cancel", tag = "admin",
    security(("admin_token" = [])),
    params(("order_id" = String, Path, description = "the held order")),
    responses(
        (status = 200, description = "cancelled (`replayed` on a retry)", body = flashsale::Transition),
        (status = 404, description = "`unknown_order`", body = ErrorBody),
        (status = 409, description = "`no_holds`, `hold_expired` or `already_final`", body = ErrorBody),
        (status = 422, description = "`invalid`", body = ErrorBody),
        CommonErrors,
        AdminErrors,
    ))]
pub async fn cancel(
    State(state): State<AppState>,
    Path(order_id): Path<String>,
) -> Result<Json<flashsale::Transition>, ApiError> {
    Ok(Json(state.engine.cancel(&order_id).await?))
}

/// `GET /v1/orders/{order_id}`: a held order's state, sku, user, qty and
/// deadline. The id is 128 random bits its buyer was given, so it is its
/// own capability, as the purchase answer is.
#[utoipa::path(get, path = "/v1/orders/{order_id}", tag = "sales",
    params(("order_id" = String, Path, description = "the order, as the purchase answered it")),
    responses(
        (status = 200, description = "the order", body = flashsale::OrderView),
        (status = 404, description = "`unknown_order`", body = ErrorBody),
        (status = 409, description = "`no_holds`: its sale holds no orders", body = ErrorBody),
        (status = 422, description = "`invalid`", body = ErrorBody),
        CommonErrors,
    ))]
pub async fn order(
    State(state): State<AppState>,
    Path(order_id): Path<String>,
) -> Result<Json<flashsale::OrderView>, ApiError> {
    Ok(Json(state.engine.order(&order_id).await?))
}

/// The process is up (it says nothing of Redis or PostgreSQL).
#[utoipa::path(get, path = "/healthz", tag = "probes",
    responses((status = 200, description = "`ok`", body = String, content_type = "text/plain")))]
pub async fn healthz() -> &'static str {
    "ok"
}

/// `/readyz`: each dependency's state, "ok" or what is wrong.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Readiness {
    ready: bool,
    redis: String,
    postgres: String,
}

/// Whether Redis and PostgreSQL answer (absent here when
/// `server.metrics_listen` moves the probes to a listener of their own).
#[utoipa::path(get, path = "/readyz", tag = "probes",
    responses(
        (status = 200, description = "ready", body = Readiness),
        (status = 503, description = "a dependency is not ready", body = Readiness),
    ))]
pub async fn readyz(State(state): State<AppState>) -> Response {
    let redis = state.engine.readiness().await.map_err(|e| e.to_string());
    let pg = match flashsale::db::client(&state.pool).await {
        Ok(c) => c
            .simple_query("SELECT 1")
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let ok = redis.is_ok() && pg.is_ok();
    let body = Readiness {
        ready: ok,
        redis: redis.err().unwrap_or_else(|| "ok".into()),
        postgres: pg.err().unwrap_or_else(|| "ok".into()),
    };
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// The Prometheus scrape (absent here when `server.metrics_listen` moves
/// it to a listener of its own).
#[utoipa::path(get, path = "/metrics", tag = "probes",
    responses((status = 200, description = "Prometheus text format 0.0.4", body = String, content_type = "text/plain")))]
pub async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        state.prometheus.render(),
    )
        .into_response()
}

pub async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}
