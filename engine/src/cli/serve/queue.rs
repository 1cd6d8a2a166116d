//! The waiting room's routes: join a sale's line, and read a ticket, once
//! (JSON) or as a stream of changes (`Accept: text/event-stream`), so a
//! million waiting clients hold a connection each instead of polling. The
//! room itself is the library's (`flashsale::room`); these handlers only
//! translate.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use flashsale::{QueueState, QueueStatus};
use serde::Deserialize;

use super::answers::{ApiError, ApiJson, BodyErrors, CommonErrors, ErrorBody};
use super::api::SkuPath;
use super::AppState;

/// How often a stream looks at its ticket (the room's snapshot is shared
/// and refreshed at most every 100 ms, so this costs no Redis trip).
const STREAM_EVERY: Duration = Duration::from_millis(250);

/// Longest a stream stays open; the client's EventSource reconnects with
/// the newest ticket it was sent.
const STREAM_FOR: Duration = Duration::from_secs(600);

/// `POST /v1/sales/{sku}/queue` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Join {
    /// The user: 1-128 bytes, no spaces, control or invisible characters,
    /// in Unicode NFC.
    #[schema(pattern = "^\\S+$", min_length = 1, max_length = 128)]
    user: String,
}

/// Joins the sale's waiting line (once: joining again answers the same
/// place) and answers the ticket and what it reads now.
#[utoipa::path(post, path = "/v1/sales/{sku}/queue", tag = "queue",
    params(SkuPath),
    request_body = Join,
    responses(
        (status = 200, description = "in line: the ticket, its state, place, people ahead and an estimate", body = flashsale::QueueStatus),
        (status = 404, description = "`unknown_sale`", body = ErrorBody),
        (status = 409, description = "`no_queue`: the sale has no waiting room", body = ErrorBody),
        (status = 422, description = "`invalid`", body = ErrorBody),
        (status = 429, description = "`rate_limited`", body = ErrorBody),
        CommonErrors,
        BodyErrors,
    ))]
pub async fn join(
    State(state): State<AppState>,
    Path(sku): Path<String>,
    ApiJson(j): ApiJson<Join>,
) -> Result<Json<QueueStatus>, ApiError> {
    if !state.limiter.allow(&j.user) {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "too many requests; slow down",
        ));
    }
    Ok(Json(state.engine.join_queue(&sku, &j.user).await?))
}

/// The `{ticket}` of `GET /v1/queue/{ticket}` (described only).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct TicketPath {
    /// The ticket a join (or an earlier read) answered (no length is
    /// described: any text is read, and one that is not a ticket is 403).
    ticket: String,
}

/// What a ticket reads now: `waiting` (place, people ahead, an estimate),
/// `admitted` (with the admission token a purchase needs, until
/// `admitted_until_ms`), `sold_out` or `expired`. With `Accept:
/// text/event-stream`, a stream of the same JSON, one event per change.
#[utoipa::path(get, path = "/v1/queue/{ticket}", tag = "queue",
    params(TicketPath),
    responses(
        (status = 200, description = "what the ticket reads (or, asked for, an event stream of it)", body = flashsale::QueueStatus),
        (status = 403, description = "`invalid_ticket`: forged, altered, not a ticket, or signed with a retired key", body = ErrorBody),
        (status = 404, description = "`unknown_sale`", body = ErrorBody),
        (status = 409, description = "`no_queue`", body = ErrorBody),
        CommonErrors,
    ))]
/// (503 `too_many_streams` when a quarter of `server.max_connections` are
/// event streams already.)
pub async fn status(
    State(state): State<AppState>,
    Path(ticket): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let first = state.engine.queue_status(&ticket).await?;
    let wants_stream = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    if !wants_stream {
        return Ok(Json(first).into_response());
    }
    let Ok(permit) = state.streams.clone().try_acquire_owned() else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_streams",
            "too many event streams open: read the ticket as JSON, or try again later",
        ));
    };
    Ok(stream(state, first, permit).into_response())
}

/// The ticket's readings, one event each time one differs from the last
/// sent; ends with `expired`, or after [`STREAM_FOR`].
fn stream(
    state: AppState,
    first: QueueStatus,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    use futures_util::StreamExt as _;
    let deadline = tokio::time::Instant::now() + STREAM_FOR;
    let start = (Some(first), None::<QueueStatus>, false);
    let events = futures_util::stream::unfold(start, move |(next, last, done)| {
        let engine = state.engine.clone();
        async move {
            if done {
                return None;
            }
            let mut next = next;
            loop {
                if let Some(now) = next.take() {
                    if last.as_ref().is_none_or(|l| changed(l, &now)) {
                        let finished = now.state == QueueState::Expired;
                        let event = Event::default()
                            .json_data(&now)
                            .unwrap_or_else(|_| Event::default().data("{}"));
                        return Some((Ok(event), (None, Some(now), finished)));
                    }
                }
                if tokio::time::Instant::now() >= deadline {
                    return None;
                }
                tokio::time::sleep(STREAM_EVERY).await;
                let ticket = last.as_ref().map(|l| l.ticket.clone()).unwrap_or_default();
                match engine.queue_status(&ticket).await {
                    Ok(s) => next = Some(s),
                    // A passing error: try again next tick; the client's
                    // reconnect covers a longer one.
                    Err(flashsale::QueueError::Unavailable(_)) => {}
                    Err(_) => return None,
                }
            }
        }
    });
    // The permit lives as long as the stream.
    let events = events.map(move |e| {
        let _held = &permit;
        e
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// A change worth an event: the state, the people ahead, or a new
/// admission (not just a re-signed ticket).
fn changed(last: &QueueStatus, now: &QueueStatus) -> bool {
    last.state != now.state
        || last.ahead != now.ahead
        || last.admitted_until_ms != now.admitted_until_ms
}
