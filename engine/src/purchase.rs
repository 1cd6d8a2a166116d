//! The hot path, top to bottom: validate, local sold-out flag, EVALSHA of
//! `purchase.lua` in the buyer's home bucket, map the reply. Only when the
//! home bucket is short does a purchase fall through to the other buckets
//! (`take.lua`) and settle the home bucket's pending record (`settle.lua`).
//! No lock is held across an await; nothing from the network is unwrapped.

use std::time::Instant;

use redis::Value;
use serde::Serialize;

use crate::config::Ack;
use crate::engine::Engine;
use crate::error::{InvalidInput, PurchaseError};
use crate::metrics as m;
use crate::sale::SaleHandle;
use crate::validate;

/// One buyer's request. Borrowed, so a service can pass fields straight from
/// its parsed HTTP body without copying.
#[derive(Debug, Clone, Copy)]
pub struct PurchaseRequest<'a> {
    /// The item.
    pub sku: &'a str,
    /// The buyer; quota is counted per user.
    pub user: &'a str,
    /// Units wanted (checked: 1..=limit).
    pub qty: i64,
    /// Idempotency key: a retry with the same id gets the first answer.
    pub request_id: &'a str,
}

/// A confirmed purchase: its order is queued on the bucket's stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Confirmed {
    /// Order id (primary key in PostgreSQL).
    pub order_id: String,
    /// Bucket that served the order.
    pub bucket: u32,
    /// True when this request_id was confirmed before and this is its replay.
    pub replayed: bool,
}

/// A decoded script reply: `{code, order_id, n}`.
struct Reply {
    code: i64,
    order_id: String,
    n: i64,
}

fn decode(v: Value) -> Result<Reply, PurchaseError> {
    let bad = || PurchaseError::Unavailable("unexpected script reply".into());
    let Value::Array(mut items) = v else {
        return Err(bad());
    };
    if items.len() != 3 {
        return Err(bad());
    }
    let n = match items.pop() {
        Some(Value::Int(n)) => n,
        _ => return Err(bad()),
    };
    let order_id = match items.pop() {
        Some(Value::BulkString(b)) => String::from_utf8(b).map_err(|_| bad())?,
        Some(Value::SimpleString(s)) => s,
        _ => return Err(bad()),
    };
    let code = match items.pop() {
        Some(Value::Int(c)) => c,
        _ => return Err(bad()),
    };
    Ok(Reply { code, order_id, n })
}

fn unavailable(e: redis::RedisError) -> PurchaseError {
    PurchaseError::Unavailable(e.to_string())
}

impl Engine {
    /// Buys `qty` units for `user`. Never oversells; a retry with the same
    /// `request_id` returns the first confirmation, never a second order.
    pub async fn purchase(&self, req: PurchaseRequest<'_>) -> Result<Confirmed, PurchaseError> {
        let started = Instant::now();
        let result = self.purchase_inner(req).await;
        let label = match &result {
            Ok(c) if c.replayed => "replayed",
            Ok(_) => "confirmed",
            Err(PurchaseError::SoldOut) => "sold_out",
            Err(PurchaseError::LimitExceeded { .. }) => "limit",
            Err(PurchaseError::NotStarted) => "not_started",
            Err(PurchaseError::Ended) => "ended",
            Err(PurchaseError::Closed) => "closed",
            Err(PurchaseError::UnknownSale(_)) => "unknown_sale",
            Err(PurchaseError::Invalid(_)) => "invalid",
            Err(PurchaseError::Unavailable(_)) => "unavailable",
        };
        metrics::counter!(m::PURCHASES, "result" => label).increment(1);
        metrics::histogram!(m::PURCHASE_SECONDS).record(started.elapsed().as_secs_f64());
        result
    }

    async fn purchase_inner(&self, req: PurchaseRequest<'_>) -> Result<Confirmed, PurchaseError> {
        let cfg = &self.inner.config;
        validate::sku(req.sku).map_err(PurchaseError::Invalid)?;
        validate::id("user", req.user).map_err(PurchaseError::Invalid)?;
        validate::id("request_id", req.request_id).map_err(PurchaseError::Invalid)?;
        let qty = validate::qty(req.qty, cfg.max_qty).map_err(PurchaseError::Invalid)?;

        let sale = self.sale(req.sku).await?;
        if sale.per_user_limit > 0 && qty > sale.per_user_limit {
            return Err(PurchaseError::Invalid(InvalidInput::QtyTooLarge {
                qty: req.qty,
                max: sale.per_user_limit,
            }));
        }
        if sale.sold_out_fresh(self.now_ms(), cfg.sold_out_recheck) {
            self.inner
                .stats
                .sold_out_local
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            metrics::counter!(m::SOLD_OUT_LOCAL).increment(1);
            return Err(PurchaseError::SoldOut);
        }

        let home = &sale.buckets[sale.home_bucket(req.user)];
        let order_id = self.inner.order_ids.next();
        let ttl = cfg.request_ttl.as_secs();
        let request_key = home.keys.request(req.request_id);
        let quota_key = home.keys.quota(req.user);
        let script = &self.inner.scripts.purchase;
        let mut cmd = Engine::evalsha(
            script,
            &[
                &home.keys.sale,
                &home.keys.stock,
                &home.keys.orders,
                &quota_key,
                &request_key,
            ],
        );
        cmd.arg(qty).arg(&order_id).arg(req.user).arg(ttl);
        let reply = decode(
            self.run_script(script, home.slot, &cmd)
                .await
                .map_err(unavailable)?,
        )?;

        match reply.code {
            1 | 2 => {
                self.ack(home.slot).await?;
                Ok(Confirmed {
                    order_id: reply.order_id,
                    bucket: reply.n as u32,
                    replayed: reply.code == 2,
                })
            }
            3 | 4 => {
                metrics::counter!(m::FALLTHROUGHS).increment(1);
                self.fall_through(
                    &sale,
                    home.index as usize,
                    req,
                    qty,
                    &order_id,
                    reply.n == 0,
                )
                .await
            }
            -1 => {
                if reply.n == 0 {
                    sale.mark_sold_out(self.now_ms());
                }
                Err(PurchaseError::SoldOut)
            }
            -2 => Err(PurchaseError::LimitExceeded {
                limit: sale.per_user_limit,
                already: reply.n.max(0) as u32,
            }),
            -3 => Err(PurchaseError::NotStarted),
            -4 => Err(PurchaseError::Ended),
            -5 => Err(PurchaseError::Closed),
            -6 => Err(PurchaseError::UnknownSale(req.sku.to_owned())),
            _ => Err(PurchaseError::Unavailable(format!(
                "script code {}",
                reply.code
            ))),
        }
    }

    /// The home bucket was short and holds the request as pending: try the
    /// other buckets in order, then settle the home record with the outcome.
    /// Every bucket is tried even by a replayed (pending) request, since an
    /// earlier attempt may have taken stock in any of them.
    async fn fall_through(
        &self,
        sale: &SaleHandle,
        home: usize,
        req: PurchaseRequest<'_>,
        qty: u32,
        order_id: &str,
        home_empty: bool,
    ) -> Result<Confirmed, PurchaseError> {
        let ttl = self.inner.config.request_ttl.as_secs();
        let n = sale.buckets.len();
        let mut all_empty = home_empty;
        let mut closed = false;
        let mut confirmed = None;
        for step in 1..n {
            let b = &sale.buckets[(home + step) % n];
            let request_key = b.keys.request(req.request_id);
            let script = &self.inner.scripts.take;
            let mut cmd = Engine::evalsha(
                script,
                &[&b.keys.sale, &b.keys.stock, &b.keys.orders, &request_key],
            );
            cmd.arg(qty).arg(order_id).arg(req.user).arg(ttl);
            let reply = decode(
                self.run_script(script, b.slot, &cmd)
                    .await
                    .map_err(unavailable)?,
            )?;
            match reply.code {
                1 | 2 => {
                    self.ack(b.slot).await?;
                    confirmed = Some(Confirmed {
                        order_id: reply.order_id,
                        bucket: reply.n as u32,
                        replayed: reply.code == 2,
                    });
                    break;
                }
                -1 => all_empty &= reply.n == 0,
                -5 => {
                    closed = true;
                    break;
                }
                _ => {
                    return Err(PurchaseError::Unavailable(format!(
                        "take.lua code {}",
                        reply.code
                    )))
                }
            }
        }

        let home_b = &sale.buckets[home];
        let script = &self.inner.scripts.settle;
        let mut cmd = Engine::evalsha(
            script,
            &[
                &home_b.keys.quota(req.user),
                &home_b.keys.request(req.request_id),
            ],
        );
        match &confirmed {
            Some(c) => cmd
                .arg("C")
                .arg(qty)
                .arg(c.bucket)
                .arg(&c.order_id)
                .arg(ttl),
            None => cmd.arg("S").arg(qty).arg(0).arg("").arg(ttl),
        };
        self.run_script(script, home_b.slot, &cmd)
            .await
            .map_err(unavailable)?;

        match confirmed {
            Some(c) => Ok(c),
            None if closed => Err(PurchaseError::Closed),
            None => {
                if all_empty {
                    sale.mark_sold_out(self.now_ms());
                }
                Err(PurchaseError::SoldOut)
            }
        }
    }

    /// With `ack = replicated`, waits for one replica before confirming. A
    /// timeout is reported as unavailable: the buyer retries with the same
    /// request_id and gets the same order once it is replicated.
    async fn ack(&self, slot: u16) -> Result<(), PurchaseError> {
        if self.inner.config.ack == Ack::Leader {
            return Ok(());
        }
        match self.replicated(slot).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(PurchaseError::Unavailable(
                "no replica acknowledged the order".into(),
            )),
            Err(e) => Err(PurchaseError::Unavailable(e)),
        }
    }
}
