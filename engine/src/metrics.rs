//! Metric names and their descriptions, in one place so dashboards, alerts and
//! code agree. Names start with `flashsale_`, carry their unit, and have only
//! low-cardinality labels (result, script, reason; never a user or order id).
//! Recording goes through the `metrics` facade; installing an exporter is the
//! binary's job.

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

/// Registers descriptions with whatever recorder is installed.
pub fn describe() {
    metrics::describe_counter!(PURCHASES, "Purchases answered, by result");
    metrics::describe_histogram!(
        PURCHASE_SECONDS,
        metrics::Unit::Seconds,
        "Purchase latency from call to answer"
    );
    metrics::describe_counter!(SOLD_OUT_LOCAL, "Sold-out answers from the local flag");
    metrics::describe_counter!(SCRIPT_RELOADS, "Scripts reloaded after NOSCRIPT");
    metrics::describe_counter!(REDIS_RETRIES, "Redis calls retried, by reason");
    metrics::describe_counter!(
        FALLTHROUGHS,
        "Purchases that fell through to another bucket"
    );
}
