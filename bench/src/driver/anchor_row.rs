//! The anchor rows: `redis-benchmark` running the same purchase script (or
//! the floor script) on the same cluster, timed and counted as the engine's
//! rows are, its errors read from `INFO commandstats`.

use anyhow::Result;

use crate::anchor;
use crate::report::RunResult;

use super::stock_clock::{with_clock, StockClock};
use super::*;

impl Bench {
    /// redis-benchmark EVALSHA of `script` on `skus` sales of `buckets`
    /// buckets, stock ops / 2 in all: one process per bucket, requests and
    /// clients split evenly (as the engine's placement spreads buyers), then
    /// judged by the stock and streams it left behind.
    pub(super) async fn anchor_run(
        &mut self,
        scenario: &str,
        strategy: &str,
        script: anchor::Script,
        pipeline: usize,
        buckets: u32,
        skus: usize,
    ) -> Result<RunResult> {
        let ops = self.args.ops;
        let skus = skus.max(1);
        let mut sales = Vec::with_capacity(skus);
        for (k, stock) in anchor::shares(ops / 2, skus).into_iter().enumerate() {
            let name = format!("{scenario}-{strategy}-{k}").replace(' ', "_");
            sales.push(self.sale(&name, stock.max(1), buckets).await?);
        }
        let buckets: Vec<&flashsale::BucketStatus> =
            sales.iter().flat_map(|s| s.buckets.iter()).collect();
        // Weighted as the engine's run of this scenario spreads its buyers:
        // over SKUs evenly (buyer i takes SKU i % n), over the buckets of one
        // SKU by each buyer's home bucket (CRC16 of the user id).
        let weights: Vec<u64> = if skus == 1 && buckets.len() > 1 {
            let mut w = vec![0u64; buckets.len()];
            for i in 0..ops {
                let user = format!("{}-{scenario}-engine-u{i}", self.run);
                w[usize::from(flashsale::placement::tag_slot(&user)) % buckets.len()] += 1;
            }
            w
        } else {
            vec![1; buckets.len()]
        };
        // One connection per bucket when pipelined; else the clients split.
        let clients = if pipeline > 1 {
            vec![1; buckets.len()]
        } else {
            anchor::weighted(self.args.concurrency as u64, &weights)
        };
        let requests = anchor::weighted(ops, &weights);
        let targets: Vec<anchor::Target> = buckets
            .iter()
            .zip(clients.iter().zip(&requests))
            .map(|(b, (&c, &r))| anchor::Target {
                master: b.master.clone(),
                tag: b.tag.clone(),
                clients: c as usize,
                requests: r,
            })
            .collect();
        let bar = self.bar(1, format!("{scenario} {strategy} (redis-benchmark)"));
        let sha = match script {
            anchor::Script::Purchase => flashsale::scripts::Scripts::new().purchase.sha,
            anchor::Script::Floor => self.load_on_masters(anchor::FLOOR_LUA).await?,
        };
        self.settle().await?;
        let before = master_time(&self.engine, &mut self.conn).await?;
        let clock = StockClock::start(
            &self.engine,
            buckets
                .iter()
                .map(|b| (b.key.clone(), b.remaining))
                .collect(),
        )
        .await?;
        let a = anchor::run(&targets, script, &sha, pipeline).await;
        let seen = clock.stop().await;
        let after = master_time(&self.engine, &mut self.conn).await?;
        let a = a?;
        bar.inc(1);
        bar.finish();
        // What it left behind: units sold, orders ever added to the streams
        // (entries-added, which trimming by an order writer cannot lower).
        let (mut stock, mut left, mut below_zero, mut queued) = (0u64, 0u64, 0u64, 0u64);
        for sale in &sales {
            let st = self.engine.sale_status(&sale.sku).await?;
            stock += st.initial;
            left += st.remaining;
            for b in &st.buckets {
                below_zero += b.remaining.min(0).unsigned_abs();
                queued += flashsale::orders::stream_info(&mut self.conn, &b.stream)
                    .await
                    .entries_added;
            }
        }
        let sold = stock - left;
        if script == anchor::Script::Floor {
            // The floor queues no orders: what it took is what it sold.
            queued = sold;
        }
        let oversold = queued.saturating_sub(stock) + below_zero + queued.abs_diff(sold);
        // Measured, never assumed: the script calls the masters failed or
        // rejected; and with stock left over, every request that did not
        // queue an order (a sold-out answer was impossible), which also
        // counts the requests that never reached a master.
        let failed = after.script_errors.saturating_sub(before.script_errors);
        let errors = if left > 0 {
            a.requests.saturating_sub(queued).max(failed)
        } else {
            failed
        };
        let secs = a.elapsed.as_secs_f64().max(1e-9);
        // redis-benchmark's own wall time, replaced by the stock clock's
        // span when the stock ran out (`with_clock`).
        let throughput = queued as f64 / secs;
        let pct = |q: f64| a.latency_us.value_at_quantile(q) as f64 / 1000.0;
        let connections: u64 = targets.iter().map(|t| t.clients as u64).sum();
        let result = RunResult {
            scenario: scenario.into(),
            strategy: strategy.into(),
            ops: a.requests,
            concurrency: connections as usize * pipeline.max(1),
            answers_per_s: a.requests as f64 / secs,
            stock,
            p50_ms: pct(0.5),
            p99_ms: pct(0.99),
            p999_ms: Some(pct(0.999)),
            confirmed: queued,
            oversold,
            errors,
            note: format!(
                "redis-benchmark EVALSHA {}, {} bucket(s), {connections} connection(s) x {} in flight; checked against stock{}",
                match script {
                    anchor::Script::Purchase => "purchase.lua",
                    anchor::Script::Floor => "of GET/compare/DECRBY (the floor)",
                },
                targets.len(),
                pipeline.max(1),
                match script {
                    anchor::Script::Purchase => " and streams",
                    anchor::Script::Floor => "",
                },
            ),
            ..RunResult::default()
        }
        .with_rate(throughput);
        Ok(with_clock(
            with_master_time(result, &before, &after),
            &before,
            &seen,
        ))
    }
}
