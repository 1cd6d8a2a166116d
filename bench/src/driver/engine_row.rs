//! The engine's rows: the library driven by the load generator at a fixed
//! concurrency or paced, with the master's CPU per confirmed purchase and
//! the stream entries checked against the units sold.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::Result;
use flashsale::Engine;

use crate::report::RunResult;
use crate::{strategies, targets};

use super::stock_clock::{with_clock, StockClock};
use super::*;

impl Bench {
    /// `ops` purchases through `engine` over `skus` (whose stock adds up to
    /// about ops / 2: half the buyers go home empty, and any oversell
    /// shows).
    pub(super) async fn engine_run(
        &mut self,
        scenario: &str,
        label: &str,
        engine: Engine,
        skus: Vec<String>,
        rate: Option<f64>,
        ops: u64,
    ) -> Result<RunResult> {
        let (engine, skus_arc, run): (Engine, Arc<Vec<String>>, Arc<str>) = (
            engine,
            Arc::new(skus.clone()),
            // User ids allow no spaces: "engine ack=replicated" -> "engine_ack=replicated".
            format!("{}-{scenario}-{}", self.run, label.replace(' ', "_")).into(),
        );
        self.settle().await?;
        // Every bucket's stock key and what it holds now, for the clock.
        let mut keys = Vec::new();
        for sku in &skus {
            let st = self.engine.sale_status(sku).await?;
            keys.extend(st.buckets.iter().map(|b| (b.key.clone(), b.remaining)));
        }
        let before = master_time(&self.engine, &mut self.conn).await?;
        let clock = StockClock::start(&self.engine, keys).await?;
        let cpu_before = process_cpu_us();
        let batches_before = engine.stats().purchase_batch_sizes.snapshot();
        let fallthroughs_before = engine.stats().fallthroughs.load(Ordering::Relaxed);
        let batch_sizes = engine.clone();
        let stats = self
            .load(format!("{scenario} {label}"), ops, rate, move |i| {
                strategies::engine_op(engine.clone(), skus_arc.clone(), run.clone(), i)
            })
            .await;
        let client_us = process_cpu_us().saturating_sub(cpu_before);
        let seen = clock.stop().await;
        let after = master_time(&self.engine, &mut self.conn).await?;
        let fallthroughs = batch_sizes
            .stats()
            .fallthroughs
            .load(Ordering::Relaxed)
            .saturating_sub(fallthroughs_before);
        let batches: Vec<u64> = batch_sizes
            .stats()
            .purchase_batch_sizes
            .snapshot()
            .iter()
            .zip(&batches_before)
            .map(|(a, b)| a.saturating_sub(*b))
            .collect();
        let mut sold = 0u64;
        let mut below_zero = 0u64;
        let mut stock = 0u64;
        // Orders ever queued (entries-added, which an order writer's trims
        // cannot lower): each purchase here is one unit and one entry, so a
        // unit taken without its order, or an order without its unit,
        // shows as the anchor's row shows it.
        let mut queued = 0u64;
        for sku in &skus {
            let st = self.engine.sale_status(sku).await?;
            stock += st.initial;
            sold += st.initial - st.remaining;
            for b in &st.buckets {
                below_zero += b.remaining.min(0).unsigned_abs();
                queued += flashsale::orders::stream_info(&mut self.conn, &b.stream)
                    .await
                    .entries_added;
            }
        }
        let oversold = stats.confirmed.saturating_sub(stock)
            + below_zero
            + stats.confirmed.abs_diff(sold)
            + queued.abs_diff(sold);
        let mut r = with_clock(
            with_master_time(
                row(
                scenario,
                label,
                self.args.concurrency,
                &stats,
                stock,
                oversold,
                match rate {
                    Some(r) => format!(
                        "paced at {r:.0}/s, latency from when each was due; {fallthroughs} fall-throughs"
                    ),
                    None => format!("stock = ops / 2; {fallthroughs} fall-throughs"),
                },
            ),
                &before,
                &after,
            ),
            &before,
            &seen,
        );
        r.batch_p50 = targets::size_at(&batches, 0.5);
        r.batch_p99 = targets::size_at(&batches, 0.99);
        // To the stock's zero, as the masters' CPU: the sold-out answers
        // after it (the local flag) are no purchase's cost; the whole row
        // when the stock never ran out.
        let client_us = seen
            .process_cpu_at_sold_out
            .map_or(client_us, |at| at.saturating_sub(cpu_before));
        r.client_us_per_confirmed =
            (r.confirmed > 0).then(|| client_us as f64 / r.confirmed as f64);
        Ok(r)
    }
}
