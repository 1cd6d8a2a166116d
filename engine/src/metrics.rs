//! Every metric name and its description, in one place so dashboards, alerts
//! and code agree, and one [`describe`] that covers them all. Names start with
//! `flashsale_`, carry their unit, and have only low-cardinality labels
//! (result, script, reason, route, status, node; `sku` only on per-sale
//! gauges; never a user or order id). Recording goes through the `metrics`
//! facade; installing an exporter is the binary's job. [`Stats`] holds the
//! few counters an embedding service may want without any recorder.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::MAX_BATCH;

/// Purchases answered, by `result` (confirmed, replayed, sold_out, limit, ...).
pub const PURCHASES: &str = "flashsale_purchases_total";
/// Purchase latency from call to answer, seconds.
pub const PURCHASE_SECONDS: &str = "flashsale_purchase_duration_seconds";
/// "Sold out" answers given from the local flag without a Redis call.
pub const SOLD_OUT_LOCAL: &str = "flashsale_sold_out_local_total";
/// Scripts loaded again after NOSCRIPT, by `script`.
pub const SCRIPT_RELOADS: &str = "flashsale_script_reloads_total";
/// Redis calls retried, by `reason` (retry_later = redirect/failover, reconnect).
pub const REDIS_RETRIES: &str = "flashsale_redis_retries_total";
/// Purchases that fell through from the home bucket to another bucket.
pub const FALLTHROUGHS: &str = "flashsale_bucket_fallthrough_total";
/// Purchases answered without being sent, by `reason` (caller_gone,
/// queued_past_deadline): queued behind calls to their bucket that kept
/// failing.
pub const PURCHASES_UNSENT: &str = "flashsale_purchases_unsent_total";
/// Purchases per batch sent to a bucket (one `EVALSHA` of `purchase.lua`).
pub const PURCHASE_BATCH_SIZE: &str = "flashsale_purchase_batch_size";

/// Payments and cancels of held orders, by op and result.
pub const HOLD_TRANSITIONS: &str = "flashsale_hold_transitions_total";
/// Holds the sweeper expired (their units went back on sale).
pub const HOLDS_EXPIRED: &str = "flashsale_holds_expired_total";
/// Deadline of a hold to its units back on sale, seconds.
pub const HOLD_EXPIRY_LAG_SECONDS: &str = "flashsale_hold_expiry_lag_seconds";
/// Payments that came after their hold ended, by result (refused, retaken).
pub const LATE_PAYMENTS: &str = "flashsale_late_payments_total";
/// Units returned to stock by cancels and expiries, by how (cancelled, expired).
pub const UNITS_RETURNED: &str = "flashsale_units_returned_total";
/// Orders held right now (Redis's deadline index, set by each sweep), by SKU.
pub const HOLDS_HELD: &str = "flashsale_holds_held";
/// Units in held orders (PostgreSQL's view, set by reconcile), by SKU.
pub const UNITS_HELD: &str = "flashsale_units_held";
/// Units in paid orders (PostgreSQL's view, set by reconcile), by SKU.
pub const UNITS_PAID: &str = "flashsale_units_paid";
/// Orders inserted (new rows; a re-delivered duplicate is not counted).
pub const ORDERS_WRITTEN: &str = "flashsale_orders_written_total";
/// Entries per order-writer batch.
pub const ORDER_BATCH_SIZE: &str = "flashsale_order_batch_size";
/// Time to insert and commit one batch, seconds.
pub const ORDER_WRITE_SECONDS: &str = "flashsale_order_write_duration_seconds";
/// Failed batch writes (PostgreSQL unreachable or refusing).
pub const ORDER_WRITE_FAILURES: &str = "flashsale_order_write_failures_total";
/// Entries in the streams not yet written (undelivered + pending).
pub const ORDER_BACKLOG: &str = "flashsale_order_backlog_entries";
/// Malformed entries moved to a dead-letter stream.
pub const ORDERS_DEAD_LETTERED: &str = "flashsale_orders_dead_lettered_total";
/// Entries taken over from consumers that went quiet.
pub const ORDERS_CLAIMED: &str = "flashsale_orders_claimed_total";

/// Gauge: 1 when every SKU checked last balanced, else 0.
pub const LEDGER_CONSERVED: &str = "flashsale_ledger_conserved";
/// Gauge: units left in Redis, by `sku` (one series per sale).
pub const STOCK_REMAINING: &str = "flashsale_stock_remaining_units";
/// Gauge: sum over SKUs of |initial - (remaining + pending + written)|.
pub const LEDGER_IMBALANCE: &str = "flashsale_ledger_imbalance_units";

/// Time from `lock`/`try_lock` to the grant, seconds.
pub const LOCK_ACQUIRE_SECONDS: &str = "flashsale_lock_acquire_duration_seconds";
/// Lock attempts that found the lock held and waited.
pub const LOCK_WAITS: &str = "flashsale_lock_waits_total";
/// Grants passed from one task of a process to the next (lock cohorting).
pub const LOCK_HANDOFFS: &str = "flashsale_lock_handoffs_total";
/// Watchdog renewals confirmed by a quorum.
pub const LOCK_RENEWALS: &str = "flashsale_lock_renewals_total";
/// Grants lost (renewal failed on a quorum, or a lease ran out).
pub const LOCK_LOST: &str = "flashsale_lock_lost_total";
/// Per-node lock errors and timeouts, by `node`.
pub const LOCK_NODE_ERRORS: &str = "flashsale_lock_node_errors_total";

/// HTTP requests answered by `flashsale serve`, by `route` and `status`.
pub const HTTP_REQUESTS: &str = "flashsale_http_requests_total";
/// HTTP request latency by `route`, seconds.
pub const HTTP_SECONDS: &str = "flashsale_http_request_duration_seconds";

/// Waiting-room joins, by `result` (`joined`, `again`).
pub const ROOM_JOINS: &str = "flashsale_room_joins_total";
/// People in a room's line not yet admitted, by `sku` (from the admitter).
pub const ROOM_WAITING: &str = "flashsale_room_waiting";
/// Admissions given, by `sku`.
pub const ROOM_ADMITTED: &str = "flashsale_room_admitted_total";
/// Admitted and not yet done (bought, refused or past the window), by `sku`.
pub const ROOM_ADMITTED_NOT_DONE: &str = "flashsale_room_admitted_not_done";
/// Admissions per second over the last 10 s of rounds, by `sku`.
pub const ROOM_ADMISSION_RATE: &str = "flashsale_room_admission_rate";
/// The estimated wait of the last in line, seconds, by `sku`.
pub const ROOM_ESTIMATED_WAIT_SECONDS: &str = "flashsale_room_estimated_wait_seconds";
/// Times a room's state flipped (open <-> sold_out: one write each, read by
/// every ticket), by `sku`.
pub const ROOM_SOLD_OUT_BROADCASTS: &str = "flashsale_room_state_flips_total";
/// 1 while a room reads sold_out, else 0, by `sku`.
pub const ROOM_SOLD_OUT: &str = "flashsale_room_sold_out";
/// Purchases refused for want of an admission, by `reason`
/// (`not_admitted`, `invalid_ticket`).
pub const ROOM_REFUSED: &str = "flashsale_room_refused_total";

/// Registers the description of every metric above with whatever recorder
/// is installed. Cheap, and safe to call more than once.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(PURCHASES, "Purchases answered, by result");
    describe_counter!(ROOM_JOINS, "Waiting-room joins, by result");
    describe_gauge!(ROOM_WAITING, "People in a room's line not yet admitted");
    describe_counter!(ROOM_ADMITTED, "Admissions given by a room");
    describe_gauge!(
        ROOM_ADMITTED_NOT_DONE,
        "Admitted to a room and not yet done (bought, refused, window passed)"
    );
    describe_gauge!(ROOM_ADMISSION_RATE, "Admissions per second, last 10 s");
    describe_gauge!(
        ROOM_ESTIMATED_WAIT_SECONDS,
        Unit::Seconds,
        "Estimated wait of the last in a room's line"
    );
    describe_counter!(
        ROOM_SOLD_OUT_BROADCASTS,
        "Room state flips between open and sold_out (one write each)"
    );
    describe_gauge!(ROOM_SOLD_OUT, "1 while a room reads sold_out");
    describe_counter!(ROOM_REFUSED, "Purchases refused by a room, by reason");
    describe_histogram!(
        PURCHASE_SECONDS,
        Unit::Seconds,
        "Purchase latency from call to answer"
    );
    describe_counter!(SOLD_OUT_LOCAL, "Sold-out answers from the local flag");
    describe_counter!(
        HOLD_TRANSITIONS,
        "Payments and cancels of held orders, by op and result"
    );
    describe_counter!(HOLDS_EXPIRED, "Holds expired by the sweeper");
    describe_histogram!(
        HOLD_EXPIRY_LAG_SECONDS,
        Unit::Seconds,
        "From a hold's deadline to its units back on sale"
    );
    describe_counter!(
        LATE_PAYMENTS,
        "Payments after their hold ended, by result (refused, retaken)"
    );
    describe_counter!(
        UNITS_RETURNED,
        "Units back on sale from cancels and expiries, by how"
    );
    describe_gauge!(
        HOLDS_HELD,
        "Orders held now, by SKU (from the hold sweeper)"
    );
    describe_gauge!(UNITS_HELD, "Units in held orders, by SKU (from reconcile)");
    describe_gauge!(UNITS_PAID, "Units in paid orders, by SKU (from reconcile)");
    describe_counter!(SCRIPT_RELOADS, "Scripts reloaded after NOSCRIPT");
    describe_counter!(REDIS_RETRIES, "Redis calls retried, by reason");
    describe_counter!(
        FALLTHROUGHS,
        "Purchases that fell through to another bucket"
    );
    describe_counter!(
        PURCHASES_UNSENT,
        "Purchases dropped from a bucket's queue unsent, by reason"
    );
    describe_histogram!(
        PURCHASE_BATCH_SIZE,
        "Purchases per batch sent to a bucket in one script call"
    );
    describe_counter!(ORDERS_WRITTEN, "Orders inserted into PostgreSQL");
    describe_histogram!(ORDER_BATCH_SIZE, "Stream entries per order-writer batch");
    describe_histogram!(
        ORDER_WRITE_SECONDS,
        Unit::Seconds,
        "Time to insert and commit one order batch"
    );
    describe_counter!(ORDER_WRITE_FAILURES, "Order batches that failed to write");
    describe_gauge!(
        ORDER_BACKLOG,
        "Stream entries not yet written to PostgreSQL"
    );
    describe_counter!(ORDERS_DEAD_LETTERED, "Malformed entries dead-lettered");
    describe_counter!(ORDERS_CLAIMED, "Entries taken over from quiet consumers");
    describe_gauge!(LEDGER_CONSERVED, "1 when every SKU reconciled balanced");
    describe_gauge!(STOCK_REMAINING, "Units left in Redis, by sku");
    describe_gauge!(
        LEDGER_IMBALANCE,
        "Units the ledger is off by, over all SKUs"
    );
    describe_histogram!(
        LOCK_ACQUIRE_SECONDS,
        Unit::Seconds,
        "Time from lock call to grant"
    );
    describe_counter!(LOCK_WAITS, "Lock attempts that waited");
    describe_counter!(
        LOCK_HANDOFFS,
        "Locks handed from one task of this process to the next without a trip to the lock nodes"
    );
    describe_counter!(LOCK_RENEWALS, "Lock leases renewed by the watchdog");
    describe_counter!(LOCK_LOST, "Locks lost before release");
    describe_counter!(LOCK_NODE_ERRORS, "Lock node errors and timeouts, by node");
    describe_counter!(HTTP_REQUESTS, "HTTP requests answered, by route and status");
    describe_histogram!(
        HTTP_SECONDS,
        Unit::Seconds,
        "HTTP request latency, by route"
    );
}

/// Counters an embedding service (or a test) can read without a metrics
/// recorder; the same events also go to the `metrics` facade.
#[derive(Debug, Default)]
pub struct Stats {
    /// Scripts loaded again after NOSCRIPT.
    pub script_reloads: AtomicU64,
    /// Redis calls retried after a redirect, failover or broken connection.
    pub redis_retries: AtomicU64,
    /// Purchases answered "sold out" from the local flag.
    pub sold_out_local: AtomicU64,
    /// Purchases whose home bucket was short, so they walked the others
    /// one call at a time (`take.lua`, `settle.lua`).
    pub fallthroughs: AtomicU64,
    /// Purchases queued for a batch of their home bucket.
    pub purchases_queued: AtomicU64,
    /// Purchases taken off a bucket's queue unsent: their caller was gone,
    /// or they waited past the retry deadline behind failing calls.
    pub purchases_unsent: AtomicU64,
    /// Batches of purchases sent to home buckets (script calls); with
    /// `purchases_queued`, how well purchases share calls.
    pub purchase_batches: AtomicU64,
    /// The most purchases any one batch held.
    pub largest_purchase_batch: AtomicU64,
    /// How many batches held each number of purchases.
    pub purchase_batch_sizes: BatchSizes,
}

/// Batches counted by size, exactly (1 to [`MAX_BATCH`] purchases): one
/// atomic add per batch, read by the bench for its batch-size percentiles.
pub struct BatchSizes {
    counts: Box<[AtomicU64]>,
}

impl Default for BatchSizes {
    fn default() -> Self {
        BatchSizes {
            counts: (0..=MAX_BATCH).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl std::fmt::Debug for BatchSizes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let batches: u64 = self.snapshot().iter().sum();
        write!(f, "BatchSizes {{ batches: {batches} }}")
    }
}

impl BatchSizes {
    /// Counts one batch of `n` purchases.
    pub(crate) fn record(&self, n: usize) {
        if let Some(c) = self.counts.get(n) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Batches so far, by size: element `n` counts batches of `n`.
    pub fn snapshot(&self) -> Vec<u64> {
        self.counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    /// Every name is a Prometheus name of this crate, and none is used twice.
    #[test]
    fn every_metric_name_is_ours_and_distinct() {
        let src = include_str!("metrics.rs");
        let names: Vec<&str> = src
            .lines()
            .filter_map(|l| l.trim().strip_prefix("pub const "))
            .filter_map(|l| l.split('"').nth(1))
            .collect();
        assert!(names.len() >= 20, "{names:?}");
        let mut seen = std::collections::HashSet::new();
        for n in &names {
            assert!(n.starts_with("flashsale_"), "{n}");
            assert!(seen.insert(*n), "{n} twice");
        }
        // describe() names each constant.
        let describe = src.split("pub fn describe").nth(1).unwrap_or_default();
        for line in src.lines() {
            if let Some(rest) = line.trim().strip_prefix("pub const ") {
                let ident = rest.split(':').next().unwrap_or_default();
                assert!(
                    describe.contains(&format!("({ident},"))
                        || describe.contains(&format!("{ident},")),
                    "{ident} not described"
                );
            }
        }
    }
}
