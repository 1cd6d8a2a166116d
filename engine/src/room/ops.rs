//! What a waiting room does, as `Engine` methods: join, read a ticket, check
//! an admission at purchase, free a place when an admission is used, and
//! run admission rounds. An admission round: read the stock, fence every
//! line shard (no new join can land at or below the fence, `line_fence.lua`),
//! read the next places from the shards, and move the gate's cursor over
//! them with `admit.lua`, which refuses a move past the stock's bound or the
//! rate and one that raced another admitter's. Any number of processes may
//! run rounds: the gate serialises them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::RedisError;
use serde::Serialize;

use super::place::{self, unix_ms};
use super::spec::{QueueOrder, QueueRate};
use super::view::{QueueState, Room, RoomView};
use crate::admission::{Pass, PassError, PassKeys, PassKind};
use crate::engine::Engine;
use crate::error::{InvalidInput, PurchaseError, Unavailable};
use crate::keys;
use crate::metrics as m;
use crate::placement::tag_slot;
use crate::sale::SaleHandle;
use crate::scripts::room::{self as script, AdmitArgs, AdmitReply, JoinReply};
use crate::validate;

/// Most places one round admits.
const MAX_ROUND: u64 = 10_000;

/// Why a room call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// The sku or user id is malformed; nothing was changed.
    #[error("invalid request: {0}")]
    Invalid(InvalidInput),
    /// No sale exists for this SKU.
    #[error("unknown sale {0:?}")]
    UnknownSale(String),
    /// The sale was created without a queue.
    #[error("sale {0:?} has no queue")]
    NoQueue(String),
    /// This process has no signing keys (`room.secret`).
    #[error("the waiting room is off here: set room.secret (or FLASHSALE_ROOM_SECRET)")]
    NoKeys,
    /// The ticket does not verify, or is not a ticket.
    #[error("invalid ticket: {0}")]
    InvalidTicket(PassError),
    /// The inventory cluster could not answer; a retry is safe.
    #[error("inventory unavailable: {0}")]
    Unavailable(Unavailable),
}

impl QueueError {
    /// A short, stable name: the `error` field of the HTTP answer.
    pub fn code(&self) -> &'static str {
        match self {
            QueueError::Invalid(_) => "invalid",
            QueueError::UnknownSale(_) => "unknown_sale",
            QueueError::NoQueue(_) => "no_queue",
            QueueError::NoKeys => "no_keys",
            QueueError::InvalidTicket(_) => "invalid_ticket",
            QueueError::Unavailable(_) => "unavailable",
        }
    }
}

impl From<RedisError> for QueueError {
    fn from(e: RedisError) -> Self {
        QueueError::Unavailable(e.into())
    }
}

impl From<crate::cluster::CallError> for QueueError {
    fn from(e: crate::cluster::CallError) -> Self {
        QueueError::Unavailable(e.into())
    }
}

/// A purchase the room refused, and whether its token was this user's own
/// admission, only past its window: only then may the request be a retry
/// of one already decided, worth a Redis trip to find out. Anything else is
/// refused with no trip at all.
pub(crate) struct Refused {
    pub(crate) why: PurchaseError,
    pub(crate) expired: bool,
}

/// What a ticket reads now (the join's answer too).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueStatus {
    /// The ticket, signed with the current key (keep the newest: a ticket
    /// signed with a retired key stops verifying one window after the
    /// rotation).
    pub ticket: String,
    /// `waiting`, `admitted`, `sold_out` or `expired`.
    pub state: QueueState,
    /// Place in the line, 1 first: estimated from the line's histogram, to
    /// within the joins of one cell (1/1024 of the shuffled early joiners,
    /// or 100 ms of arrivals).
    pub position: u64,
    /// People still waiting ahead.
    pub ahead: u64,
    /// Estimated wait, ms, from the measured admission rate (the
    /// configured one before any admission); `null` when unknown.
    pub eta_ms: Option<u64>,
    /// Once admitted: the token the purchase needs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admission_token: Option<String>,
    /// Once admitted: when the admission ends, ms since the epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admitted_until_ms: Option<u64>,
}

/// A room as the gate holds it now, for operators
/// (`flashsale queue status --sku X`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RoomStatus {
    /// The SKU.
    pub sku: String,
    /// `open` or `sold_out`.
    pub state: String,
    /// `fifo` or `shuffle_at_start`.
    pub order: QueueOrder,
    /// Configured admissions per second; `None` = auto.
    pub rate_per_s: Option<f64>,
    /// Admission window, ms.
    pub window_ms: u64,
    /// Overbooking factor.
    pub overbook: f64,
    /// Everyone who joined.
    pub joined: u64,
    /// Joined and not yet admitted.
    pub waiting: u64,
    /// Admitted so far.
    pub admitted: u64,
    /// Admitted and not yet done.
    pub admitted_not_done: u64,
    /// Admissions per second over the last 10 s of rounds.
    pub admission_rate: Option<f64>,
    /// Times the state flipped between open and sold_out.
    pub state_flips: u64,
}

impl Engine {
    fn passes(&self) -> Result<&PassKeys, QueueError> {
        self.pass_keys().ok_or(QueueError::NoKeys)
    }

    /// The sale and its room.
    async fn room_sale(&self, sku: &str) -> Result<Arc<SaleHandle>, QueueError> {
        validate::sku(sku).map_err(QueueError::Invalid)?;
        let sale = match self.sale(sku).await {
            Ok(s) => s,
            Err(PurchaseError::UnknownSale(s)) => return Err(QueueError::UnknownSale(s)),
            Err(PurchaseError::Unavailable(u)) => return Err(QueueError::Unavailable(u)),
            Err(e) => {
                return Err(QueueError::Unavailable(Unavailable::unconfirmed(
                    e.to_string(),
                )))
            }
        };
        if sale.room.is_none() {
            return Err(QueueError::NoQueue(sku.to_owned()));
        }
        Ok(sale)
    }

    /// Puts `user` in the line of `sku` (once: joining again answers the
    /// first place) and answers the ticket and what it reads now.
    pub async fn join_queue(&self, sku: &str, user: &str) -> Result<QueueStatus, QueueError> {
        validate::id("user", user).map_err(QueueError::Invalid)?;
        let passes = self.passes()?;
        let sale = self.room_sale(sku).await?;
        let Some(room) = &sale.room else {
            return Err(QueueError::NoQueue(sku.to_owned()));
        };
        let now = unix_ms();
        let proposed = if room.spec.order == QueueOrder::ShuffleAtStart && now < room.starts_ms {
            passes.shuffled_place(sku, user)
        } else {
            place::arrival()
        };
        let shard = &sale.buckets[sale.home_bucket(user)];
        let (line, hist) = (keys::line(&shard.tag), keys::line_hist(&shard.tag));
        let call = script::join(
            &self.scripts().join,
            shard.slot,
            &line,
            &hist,
            user,
            proposed,
            shard.index,
        );
        let (place, result) = match self.cluster().call(&call, script::decode_join).await? {
            JoinReply::Joined(p) => (p, "joined"),
            JoinReply::Rejoined(p) => (p, "again"),
        };
        place::observe(place);
        metrics::counter!(m::ROOM_JOINS, "result" => result).increment(1);
        self.reading(&sale, passes, user, place).await
    }

    /// What `ticket` reads now: waiting (with place, people ahead and an
    /// estimate), admitted (with the admission token), sold out or expired.
    /// Checked without a Redis trip; the room's snapshot is shared by every
    /// read of this process for up to 100 ms.
    pub async fn queue_status(&self, ticket: &str) -> Result<QueueStatus, QueueError> {
        let passes = self.passes()?;
        let now = unix_ms();
        // The sale's window is known only once the pass is read: read it
        // with the longest, then check again with the sale's own.
        let pass = passes
            .verify(ticket, now, super::spec::MAX_WINDOW_MS)
            .map_err(QueueError::InvalidTicket)?;
        if pass.kind != PassKind::Ticket {
            return Err(QueueError::InvalidTicket(PassError::WrongKind));
        }
        let sale = self.room_sale(&pass.sale).await?;
        if let Some(room) = &sale.room {
            passes
                .verify(ticket, now, room.spec.window_ms)
                .map_err(QueueError::InvalidTicket)?;
        }
        self.reading(&sale, passes, &pass.user, pass.place).await
    }

    async fn reading(
        &self,
        sale: &SaleHandle,
        passes: &PassKeys,
        user: &str,
        place: u64,
    ) -> Result<QueueStatus, QueueError> {
        let Some(room) = &sale.room else {
            return Err(QueueError::NoQueue(sale.sku.clone()));
        };
        let view = self.room_view(sale, room).await?;
        let now = unix_ms();
        let r = view.read(place, now, room.spec.window_ms, room.configured_rate());
        let pass = |kind, until_ms| Pass {
            kind,
            sale: sale.sku.clone(),
            user: user.to_owned(),
            place,
            issued_ms: now,
            until_ms,
        };
        let admission_token = match (r.state, r.until_ms) {
            (QueueState::Admitted, Some(until)) => {
                Some(passes.sign(&pass(PassKind::Admission, until)))
            }
            _ => None,
        };
        Ok(QueueStatus {
            ticket: passes.sign(&pass(PassKind::Ticket, 0)),
            state: r.state,
            position: r.position,
            ahead: r.ahead,
            eta_ms: r.eta_ms,
            admission_token,
            admitted_until_ms: r.until_ms.filter(|_| r.state == QueueState::Admitted),
        })
    }

    /// The room's snapshot, read again when older than 100 ms by one caller
    /// while the others wait for it.
    async fn room_view(&self, sale: &SaleHandle, room: &Room) -> Result<Arc<RoomView>, QueueError> {
        if let Some(v) = room.fresh(unix_ms()) {
            return Ok(v);
        }
        let _refreshing = room.refresh.lock().await;
        if let Some(v) = room.fresh(unix_ms()) {
            return Ok(v);
        }
        let view = Arc::new(self.read_view(sale).await?);
        room.store(view.clone());
        Ok(view)
    }

    /// The gate's hash and every shard's histogram, now.
    async fn read_view(&self, sale: &SaleHandle) -> Result<RoomView, RedisError> {
        let gate: HashMap<String, String> = self
            .cluster()
            .run_cmd(redis::cmd("HGETALL").arg(keys::room_gate(&sale.sku)))
            .await?;
        let mut shards = Vec::with_capacity(sale.buckets.len());
        for b in &sale.buckets {
            let hist: HashMap<String, String> = self
                .cluster()
                .run_cmd(redis::cmd("HGETALL").arg(keys::line_hist(&b.tag)))
                .await?;
            shards.push(hist);
        }
        Ok(RoomView::from_hashes(unix_ms(), &gate, &shards))
    }

    /// The room's gate and line now, for operators.
    pub async fn room_status(&self, sku: &str) -> Result<RoomStatus, QueueError> {
        let sale = self.room_sale(sku).await?;
        let Some(room) = &sale.room else {
            return Err(QueueError::NoQueue(sku.to_owned()));
        };
        let view = self.read_view(&sale).await?;
        Ok(RoomStatus {
            sku: sku.to_owned(),
            state: if view.sold_out { "sold_out" } else { "open" }.into(),
            order: room.spec.order,
            rate_per_s: room.configured_rate(),
            window_ms: room.spec.window_ms,
            overbook: room.spec.overbook,
            joined: view.joined,
            waiting: view.waiting(),
            admitted: view.admitted,
            admitted_not_done: view.open,
            admission_rate: view.measured_rate(),
            state_flips: view.flips,
        })
    }

    /// The purchase's check on a sale with a room: `token` is an admission
    /// for this sale and user, valid now. Answers the admitted place (to
    /// free it once the purchase is decided), or `None` for a sale without
    /// a room. No Redis trip.
    pub(crate) fn check_admission(
        &self,
        sale: &SaleHandle,
        user: &str,
        token: Option<&str>,
    ) -> Result<Option<u64>, Refused> {
        let Some(room) = &sale.room else {
            return Ok(None);
        };
        let refused = |why: PurchaseError, expired: bool| {
            metrics::counter!(m::ROOM_REFUSED, "reason" => why.code()).increment(1);
            Err(Refused { why, expired })
        };
        let Some(token) = token else {
            return refused(PurchaseError::NotAdmitted, false);
        };
        let Some(passes) = self.pass_keys() else {
            return refused(PurchaseError::InvalidTicket(PassError::UnknownKey), false);
        };
        match passes.admission(token, &sale.sku, user, unix_ms(), room.spec.window_ms) {
            Ok(pass) => Ok(Some(pass.place)),
            Err(PassError::Expired) => refused(PurchaseError::NotAdmitted, true),
            Err(PassError::WrongKind) => refused(PurchaseError::NotAdmitted, false),
            Err(e) => refused(PurchaseError::InvalidTicket(e), false),
        }
    }

    /// An admitted user's purchase was decided: their place among the
    /// admitted-not-done is free (once per user). A failure here only
    /// keeps the place taken until the window passes.
    pub(crate) async fn admission_used(&self, sku: &str, user: &str, place: u64) {
        let (gate, rounds, done) = (
            keys::room_gate(sku),
            keys::room_rounds(sku),
            keys::room_done(sku),
        );
        let call = script::done(
            &self.scripts().room_done,
            tag_slot(&format!("fs:{sku}")),
            [&gate, &rounds, &done],
            user,
            place,
        );
        if let Err(e) = self.cluster().call(&call, script::decode_done).await {
            let e = Unavailable::from(e);
            tracing::warn!(sku, error = %e, "room: a used admission was not recorded; its place frees when the window passes");
        }
    }

    /// One admission round of `sku`'s room; answers how many were admitted.
    /// Before the sale's start nobody is admitted.
    pub async fn admit_round(&self, sku: &str) -> Result<u64, QueueError> {
        let sale = self.room_sale(sku).await?;
        let Some(room) = &sale.room else {
            return Err(QueueError::NoQueue(sku.to_owned()));
        };
        if unix_ms() < room.starts_ms {
            return Ok(0);
        }
        let (gate, rounds) = (keys::room_gate(sku), keys::room_rounds(sku));
        let gate_slot = tag_slot(&format!("fs:{sku}"));
        // The gate first, then the stock: purchases done in between are
        // counted by done_total, which admit.lua takes off the stock read.
        let fields: Vec<Option<u64>> = self
            .cluster()
            .run_cmd(
                redis::cmd("HMGET")
                    .arg(&gate)
                    .arg("cursor")
                    .arg("open")
                    .arg("last_ms")
                    .arg("done_total"),
            )
            .await?;
        let field = |i: usize| fields.get(i).copied().flatten().unwrap_or(0);
        let (from, open, last_ms, done_read) = (field(0), field(1), field(2), field(3));
        // A closed sale sells nothing: its line reads sold_out.
        let (remaining, held) = if self.sale_closed(sku).await? {
            (0, 0)
        } else {
            self.stock_and_held(&sale).await?
        };
        let limit = sale.per_user_limit.max(1);
        // How many to read: what the stock and the rate seem to allow (the
        // gate decides; this only bounds the read).
        let capacity =
            ((room.spec.overbook * (remaining + held) as f64).floor() as u64).saturating_sub(open);
        let allow = match room.spec.rate {
            QueueRate::Auto => capacity,
            QueueRate::PerSecond(r) => {
                let since = unix_ms().saturating_sub(last_ms).min(1000);
                (r * since as f64 / 1000.0).floor() as u64 + 1
            }
        };
        let want = capacity.min(allow).min(MAX_ROUND);

        let fence = place::arrival();
        for b in &sale.buckets {
            let hist = keys::line_hist(&b.tag);
            let call = script::fence(&self.scripts().line_fence, b.slot, &hist, fence);
            self.cluster().call(&call, script::decode_fence).await?;
        }
        let mut places = Vec::new();
        if want > 0 {
            for b in &sale.buckets {
                let next: Vec<(String, f64)> = self
                    .cluster()
                    .run_cmd(
                        redis::cmd("ZRANGEBYSCORE")
                            .arg(keys::line(&b.tag))
                            .arg(format!("({from}"))
                            .arg(fence)
                            .arg("WITHSCORES")
                            .arg("LIMIT")
                            .arg(0)
                            .arg(want),
                    )
                    .await?;
                places.extend(next.into_iter().map(|(_, s)| s as u64));
            }
        }
        places.sort_unstable();
        let mut take = places.len().min(want as usize);
        // Three tries: the gate may allow fewer than read (expired rounds
        // counted there, not here; places tied across shards).
        for _ in 0..3 {
            let (to, count) = match take.checked_sub(1).map(|i| places[i]) {
                None => (from, 0),
                Some(to) => (to, self.places_between(&sale, from, to).await?),
            };
            let args = AdmitArgs {
                room: &gate,
                rounds: &rounds,
                from,
                to,
                count,
                remaining,
                held,
                overbook: room.spec.overbook,
                rate_per_s: room.spec.rate_arg(),
                window_ms: room.spec.window_ms,
                channel: &keys::room_channel(sku),
                limit,
                done_read,
            };
            let call = args.call(&self.scripts().admit, gate_slot);
            match self.cluster().call(&call, script::decode_admit).await? {
                AdmitReply::Admitted { admitted, .. } => {
                    metrics::counter!(m::ROOM_ADMITTED, "sku" => sku.to_owned())
                        .increment(admitted);
                    return Ok(admitted);
                }
                AdmitReply::Raced { .. } => return Ok(0),
                AdmitReply::TooMany { capacity, allow } => {
                    let most = capacity.min(allow) as usize;
                    take = if most < take {
                        most
                    } else {
                        take.saturating_sub(1)
                    };
                }
            }
        }
        Ok(0)
    }

    /// Units left over all buckets, and held orders (each holds at least a
    /// unit, so this undercounts held units: the bound errs toward
    /// admitting fewer); each at most 2^53 - 1 (what admit.lua takes), so a
    /// sale past that over all its buckets still admits.
    async fn stock_and_held(&self, sale: &SaleHandle) -> Result<(u64, u64), RedisError> {
        let (mut remaining, mut held) = (0u64, 0u64);
        for b in &sale.buckets {
            let mut pipe = redis::pipe();
            pipe.cmd("GET").arg(&b.keys.stock);
            pipe.cmd("ZCARD").arg(&b.keys.holds);
            let (stock, holds): (Option<i64>, u64) =
                pipe.query_async(&mut self.cluster().conn()).await?;
            remaining = remaining.saturating_add(stock.unwrap_or(0).max(0) as u64);
            held = held.saturating_add(holds);
        }
        const MAX: u64 = crate::sale::MAX_UNITS;
        Ok((remaining.min(MAX), held.min(MAX - remaining.min(MAX))))
    }

    /// Places in `(from, to]` over every shard: exact, the shards are fenced
    /// above `to`.
    async fn places_between(
        &self,
        sale: &SaleHandle,
        from: u64,
        to: u64,
    ) -> Result<u64, RedisError> {
        let mut n = 0;
        for b in &sale.buckets {
            let c: u64 = self
                .cluster()
                .run_cmd(
                    redis::cmd("ZCOUNT")
                        .arg(keys::line(&b.tag))
                        .arg(format!("({from}"))
                        .arg(to),
                )
                .await?;
            n += c;
        }
        Ok(n)
    }

    /// Runs admission rounds for every sale with a room, every `every`,
    /// until the task is aborted, and keeps the room metrics. Any number of
    /// processes may run it (`flashsale serve` does).
    pub fn spawn_room_admitter(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let engine = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_metrics = std::time::Instant::now();
            // Closed sales whose line this admitter has seen flipped to
            // sold_out: nothing more to do for them.
            let mut finished = std::collections::HashSet::new();
            loop {
                tick.tick().await;
                let Ok(skus) = engine.list_sales().await else {
                    continue;
                };
                // The gauges once a second, not every round: each reads
                // every shard's histogram.
                let metrics_now = last_metrics.elapsed() >= Duration::from_secs(1);
                if metrics_now {
                    last_metrics = std::time::Instant::now();
                }
                for sku in skus {
                    if finished.contains(&sku) {
                        continue;
                    }
                    match engine.sale(&sku).await {
                        Ok(sale) if sale.room.is_some() => {}
                        _ => continue,
                    }
                    // A closed sale admits nobody (admit_round reads its
                    // stock as 0); once its line reads sold_out, it is done.
                    if engine.sale_closed(&sku).await.unwrap_or(false)
                        && engine
                            .room_status(&sku)
                            .await
                            .is_ok_and(|s| s.state == "sold_out")
                    {
                        finished.insert(sku);
                        continue;
                    }
                    if let Err(e) = engine.admit_round(&sku).await {
                        tracing::warn!(sku, error = %e, "room: admission round failed");
                        continue;
                    }
                    if metrics_now {
                        engine.room_metrics(&sku).await;
                    }
                }
            }
        })
    }

    async fn sale_closed(&self, sku: &str) -> Result<bool, RedisError> {
        let state: Option<String> = self
            .cluster()
            .run_cmd(redis::cmd("HGET").arg(keys::sale_meta(sku)).arg("state"))
            .await?;
        Ok(state.as_deref() == Some("closed"))
    }

    async fn room_metrics(&self, sku: &str) {
        let Ok(status) = self.room_status(sku).await else {
            return;
        };
        let label = || sku.to_owned();
        metrics::gauge!(m::ROOM_WAITING, "sku" => label()).set(status.waiting as f64);
        metrics::gauge!(m::ROOM_ADMITTED_NOT_DONE, "sku" => label())
            .set(status.admitted_not_done as f64);
        let rate = status.admission_rate.or(status.rate_per_s).unwrap_or(0.0);
        metrics::gauge!(m::ROOM_ADMISSION_RATE, "sku" => label()).set(rate);
        let wait = if rate > 0.0 && status.state == "open" {
            status.waiting as f64 / rate
        } else {
            0.0
        };
        metrics::gauge!(m::ROOM_ESTIMATED_WAIT_SECONDS, "sku" => label()).set(wait);
        let sold_out = if status.state == "sold_out" { 1.0 } else { 0.0 };
        metrics::gauge!(m::ROOM_SOLD_OUT, "sku" => label()).set(sold_out);
        metrics::counter!(m::ROOM_SOLD_OUT_BROADCASTS, "sku" => label())
            .absolute(status.state_flips);
    }
}
