//! The `orders` rows: order writers draining what the engine sold into
//! PostgreSQL, live beside the selling or from a backlog, every confirmed
//! order checked in the table exactly once.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use crate::report::RunResult;

use super::*;

/// Rows of `sku` in PostgreSQL's orders (the cheap count, asked while the
/// clock runs).
pub(super) async fn order_rows(pool: &flashsale::db::Pool, sku: &str) -> Result<u64> {
    let n: i64 = flashsale::db::client(pool)
        .await?
        .query_one("SELECT COUNT(*) FROM orders WHERE sku = $1", &[&sku])
        .await?
        .get(0);
    Ok(n.max(0) as u64)
}

/// (rows, distinct buyers) of `sku` in PostgreSQL's orders; each bench
/// buyer buys once, so the two differ only by duplicates.
pub(super) async fn order_counts(pool: &flashsale::db::Pool, sku: &str) -> Result<(u64, u64)> {
    let row = flashsale::db::client(pool)
        .await?
        .query_one(
            "SELECT COUNT(*), COUNT(DISTINCT user_id) FROM orders WHERE sku = $1",
            &[&sku],
        )
        .await?;
    let (n, d): (i64, i64) = (row.get(0), row.get(1));
    Ok((n.max(0) as u64, d.max(0) as u64))
}

/// Errors of an `orders` row: the selling phase's, every confirmed buyer
/// with no order in PostgreSQL, every order written more than once (rows
/// beyond the distinct buyers) and every buyer with an order beyond those
/// confirmed. Each wrong row counts once.
pub(super) fn orders_errors(selling: u64, confirmed: u64, written: u64, distinct: u64) -> u64 {
    selling
        + confirmed.saturating_sub(distinct)
        + written.saturating_sub(distinct)
        + distinct.saturating_sub(confirmed)
}

impl Bench {
    /// The `orders` rows, both on a hot1 sale of their own with the order
    /// writers (two, the default):
    /// - `orders`: the writers drain from the start while the engine sells
    ///   (both share the machine). Throughput is orders written per second,
    ///   from the first purchase until PostgreSQL holds every order the run
    ///   confirmed; the note gives the backlog's peak (the stream's length,
    ///   sampled every 10 ms; entries leave it once written and
    ///   acknowledged) and the engine's own selling rate in that run.
    /// - `orders drain`: the engine sells the whole stock first with no
    ///   writer running, then the writers start and drain the backlog alone.
    ///   Throughput is orders written per second of that drain, from the
    ///   writers' start (their connections and first look at the sales
    ///   included): the writers' own peak rate, on the same machine, as
    ///   `engine` is the engine's own. Its backlog is four times the other
    ///   rows' (`--ops` x 2 orders), so the start is a small part of it.
    ///
    /// Runs after the repetition's other sales were cleared, so the writers
    /// see no other bench sale. Empty when PostgreSQL cannot be reached (the
    /// rows need it).
    pub(super) async fn orders_runs(&mut self) -> Result<Vec<RunResult>> {
        let mut rows = Vec::new();
        for (label, live) in [("orders", true), ("orders drain", false)] {
            rows.extend(self.orders_run(label, live).await?);
        }
        Ok(rows)
    }

    /// One `orders` row (see [`Bench::orders_runs`]): `live`, the writers
    /// run while the engine sells; else they start once it has sold out.
    pub(super) async fn orders_run(
        &mut self,
        label: &str,
        live: bool,
    ) -> Result<Option<RunResult>> {
        let pool = match flashsale::db::pool(&self.postgres_url, 8) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("{label} row skipped: {e}");
                return Ok(None);
            }
        };
        if let Err(e) = flashsale::db::migrate(&pool).await {
            eprintln!("{label} row skipped: PostgreSQL: {e}");
            return Ok(None);
        }
        let pool = &pool;
        // Any fork the row could meet happens now, before the clock runs;
        // the selling phase inside the clock does not settle again.
        self.settle().await?;
        self.settled_for_next_row = true;
        let forks_before = master_time(&self.engine, &mut self.conn).await?;
        let ops = if live {
            self.args.ops
        } else {
            self.args.ops * 4
        };
        let st = self
            .sale(&format!("hot1-{}", label.replace(' ', "-")), ops / 2, 1)
            .await?;
        let mut writers = None;
        if live {
            writers = Some(
                self.engine
                    .spawn_order_writer(pool.clone(), flashsale::WriterConfig::default())
                    .await?,
            );
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = {
            let mut conn = self.engine.dedicated_connection().await?;
            let (stream, stop) = (st.buckets[0].stream.clone(), stop.clone());
            tokio::spawn(async move {
                let mut peak = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let len: u64 = redis::cmd("XLEN")
                        .arg(&stream)
                        .query_async(&mut conn)
                        .await
                        .unwrap_or(0);
                    peak = peak.max(len);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                peak
            })
        };
        let mut started = std::time::Instant::now();
        let e = self.engine.clone();
        let sold = self
            .engine_run("hot1", label, e, vec![st.sku.clone()], None, ops)
            .await?;
        let confirmed = sold.confirmed;
        // The drain's own CPU (orders drain: the writers alone in this
        // process, and PostgreSQL's processes), from the writers' start.
        let mut drain_cpu = None;
        if writers.is_none() {
            // The whole backlog is in the stream: the drain starts now.
            drain_cpu = Some((process_cpu_us(), postgres_cpu_us()));
            started = std::time::Instant::now();
            writers = Some(
                self.engine
                    .spawn_order_writer(pool.clone(), flashsale::WriterConfig::default())
                    .await?,
            );
        }
        // The writers' own count of rows inserted says when they are done,
        // checked against PostgreSQL: their count takes in every sale they
        // drain (a sale left by another run would end the wait early), and
        // a COMMIT whose answer was lost is counted by nobody (the wait
        // would run to the cap). So PostgreSQL is asked when the count says
        // done, and every half second as a backstop; asking it every few
        // ms would cost it more than the writers' inserts do.
        let deadline = started + self.cap();
        let inserted =
            |w: &Option<flashsale::WriterHandle>| w.as_ref().map_or(0, |w| w.progress().written);
        let mut trust_count = true;
        let mut next_ask = std::time::Instant::now() + Duration::from_millis(500);
        let mut timed_out = false;
        let drained;
        loop {
            let now = std::time::Instant::now();
            if now >= deadline {
                timed_out = true;
                drained = started.elapsed();
                break;
            }
            let says_done = trust_count && inserted(&writers) >= confirmed;
            if says_done || now >= next_ask {
                // Done when the count says so or, found by the backstop,
                // when it was asked: the query itself is not timed.
                let seen = started.elapsed();
                if order_rows(pool, &st.sku).await? >= confirmed {
                    drained = seen;
                    break;
                }
                trust_count &= !says_done;
                next_ask = now + Duration::from_millis(500);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let drain_cpu = drain_cpu.map(|(me, db)| {
            (
                process_cpu_us().saturating_sub(me),
                postgres_cpu_us().saturating_sub(db),
            )
        });
        stop.store(true, Ordering::Relaxed);
        let peak = sampler.await.unwrap_or(0);
        let report = match writers {
            Some(w) => w.shutdown().await?,
            None => flashsale::WriterReport::default(),
        };
        let after = master_time(&self.engine, &mut self.conn).await?;
        let forks = row_forks(&forks_before, &after);
        // What an order costs the masters end to end: its sale, and the
        // writers' reads, acknowledgements, trims and claims of its entry.
        let masters_us = masters_cpu_between(&forks_before, &after);
        let (written, distinct) = order_counts(pool, &st.sku).await?;
        let _ = flashsale::db::client(pool)
            .await?
            .execute("DELETE FROM orders WHERE sku = $1", &[&st.sku])
            .await;
        let rate = written as f64 / drained.as_secs_f64().max(1e-9);
        let errors = orders_errors(sold.errors, confirmed, written, distinct);
        let mut note = if live {
            format!(
                "orders into PostgreSQL per second, 2 writers draining while the engine sells, \
                 from the first purchase until all {written} were written; backlog peak {peak}; \
                 the engine sold at {:.0}/s in the same run",
                sold.throughput
            )
        } else {
            format!(
                "orders into PostgreSQL per second, 2 writers draining a backlog of {peak} \
                 the engine had sold alone (at {:.0}/s), from the writers' start until all \
                 {written} were written",
                sold.throughput
            )
        };
        note.push_str(&format!(
            "; batches held for a replica {}; latency and batch columns are the selling phase's; \
             master µs/confirmed is per order end to end (its sale and the writers' reads, acks, trims and claims){}",
            report.held_unreplicated,
            if live {
                ""
            } else {
                "; client µs/confirmed is the writers' CPU per order over the drain, with PostgreSQL's processes' in db_us_per_order"
            }
        ));
        note.push_str(&disturbed(forks));
        if timed_out {
            note.push_str(&format!(
                "; timed out after {} s with {written} of {confirmed} written",
                self.cap().as_secs()
            ));
        }
        Ok(Some(RunResult {
            strategy: label.into(),
            throughput: rate,
            repetitions: vec![rate],
            throughput_min: rate,
            throughput_max: rate,
            answers_per_s: rate,
            confirmed: written,
            errors,
            // Per purchase, not per order written: left out.
            redis_us_per_op: None,
            // End to end: selling plus draining, per order written.
            master_us_per_confirmed: (written > 0).then(|| masters_us as f64 / written as f64),
            // The writers' CPU per order, where they drained alone.
            client_us_per_confirmed: drain_cpu
                .filter(|_| written > 0)
                .map(|(me, _)| me as f64 / written as f64),
            db_us_per_order: drain_cpu
                .filter(|_| written > 0)
                .map(|(_, db)| db as f64 / written as f64),
            projected_ceiling: None,
            engine_per_s: Some(sold.throughput),
            // Timed from the first purchase (or the writers' start) to
            // the last row written, not by the stock clock.
            stock_clock: false,
            persistence_forks: forks,
            note,
            ..sold
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::orders_errors;

    #[test]
    fn an_order_written_twice_is_an_error_of_the_orders_row() {
        // 100 confirmed, 101 rows for 100 buyers: one duplicate.
        assert_eq!(orders_errors(0, 100, 101, 100), 1);
        // 100 confirmed, 100 rows for 99 buyers: one missing, one twice.
        assert_eq!(orders_errors(0, 100, 100, 99), 2);
        // An order for a buyer never confirmed.
        assert_eq!(orders_errors(0, 100, 101, 101), 1);
        // One missing, none duplicated.
        assert_eq!(orders_errors(0, 100, 99, 99), 1);
        // The selling phase's own errors are the row's too.
        assert_eq!(orders_errors(3, 100, 100, 100), 3);
        assert_eq!(orders_errors(0, 100, 100, 100), 0);
    }
}
