//! `flashsale-room-bench`: the waiting room's rows (issue #39), apart from
//! the purchase rows because what it measures is not a purchase: joins a
//! second and the masters' CPU per join, ticket reads a second, and a whole
//! room: N joiners for S units, admitted by the room's own admitter (every
//! 100 ms, as `serve` runs it), each buying once admitted, until the stock
//! is gone. It reports how many purchase calls reached Redis (against N
//! without a room), and, for every ticket still waiting when the last unit
//! sold, how long until it read `sold_out`. Then fairness: inversions
//! between the order joins were started in one process and their places
//! (fifo), and a chi-square of join order against place for joiners before
//! a shuffled start. Runs on the cluster of `--config` (default: ops/up).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use clap::Parser;
use flashsale::{
    Engine, PurchaseError, PurchaseRequest, QueueOrder, QueueRate, QueueSpec, QueueState, SaleSpec,
    Settings,
};
use futures_util::stream::{self, StreamExt};
use serde::Serialize;

#[derive(Parser)]
struct Args {
    /// Settings file (the binary's); default: the ops/up topology.
    #[arg(long)]
    config: Option<std::path::PathBuf>,
    /// People who join the room.
    #[arg(long, default_value_t = 100_000)]
    joiners: u64,
    /// Units on sale.
    #[arg(long, default_value_t = 1_000)]
    stock: u64,
    /// Stock buckets (and line shards).
    #[arg(long, default_value_t = 3)]
    buckets: u32,
    /// Calls in flight.
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    /// The room's overbooking factor.
    #[arg(long, default_value_t = 1.0)]
    overbook: f64,
    /// Joiners before the shuffled start, for the chi-square.
    #[arg(long, default_value_t = 10_000)]
    shuffled: u64,
    /// Longest the sale phase may run, seconds.
    #[arg(long, default_value_t = 300)]
    max_seconds: u64,
    /// Write the results here as JSON.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

#[derive(Serialize, Default)]
struct Results {
    joiners: u64,
    stock: u64,
    buckets: u32,
    masters: usize,
    concurrency: usize,
    overbook: f64,
    joins_per_s: f64,
    master_cpu_us_per_join: f64,
    status_reads_per_s: f64,
    sold: u64,
    purchase_calls: u64,
    purchase_calls_bound: f64,
    sale_seconds: f64,
    waiting_at_last_sale: u64,
    sold_out_seen_p50_ms: f64,
    sold_out_seen_p99_ms: f64,
    sold_out_seen_max_ms: f64,
    never_saw_sold_out: u64,
    fifo_inversions_vs_call_start: u64,
    shuffled_joiners: u64,
    shuffle_chi_square_10x10: f64,
    shuffle_chi_square_dof: u32,
}

const SECRET_ENV: &str = "FLASHSALE_ROOM_SECRET";

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let mut settings = Settings::read(args.config.as_deref())?;
    if settings.engine.room.secret.is_none() {
        // A bench of its own: a key of its own unless one is given.
        settings.engine.room.secret = Some(
            std::env::var(SECRET_ENV)
                .unwrap_or_else(|_| "room-bench-secret-of-32-bytes-at-least".into()),
        );
    }
    let engine = Engine::connect(settings.engine.clone()).await?;
    let masters: Vec<String> = engine
        .slot_map()
        .await?
        .masters()
        .into_iter()
        .map(|m| m.to_owned())
        .collect();
    let run = format!(
        "{}",
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    );
    let mut r = Results {
        joiners: args.joiners,
        stock: args.stock,
        buckets: args.buckets,
        masters: masters.len(),
        concurrency: args.concurrency,
        overbook: args.overbook,
        ..Results::default()
    };

    // The room: open now, fifo, no admitter until the joins are in.
    let sku = format!("room-{run}");
    engine
        .create_sale(SaleSpec {
            buckets: args.buckets,
            per_user_limit: 1,
            queue: Some(QueueSpec {
                rate: QueueRate::Auto,
                window_ms: 120_000,
                order: QueueOrder::Fifo,
                overbook: args.overbook,
            }),
            ..SaleSpec::new(sku.clone(), args.stock)
        })
        .await?;

    // Joins.
    let cpu0 = masters_cpu(&masters).await?;
    let started = Instant::now();
    let mut joined: Vec<(u64, String, u64)> = stream::iter(0..args.joiners)
        .map(|i| {
            let (engine, sku) = (engine.clone(), sku.clone());
            async move {
                let s = engine.join_queue(&sku, &format!("j{i}")).await?;
                let place = place_of(&engine, &s.ticket)?;
                Ok::<_, anyhow::Error>((i, s.ticket, place))
            }
        })
        .buffer_unordered(args.concurrency)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    let join_secs = started.elapsed().as_secs_f64();
    let cpu1 = masters_cpu(&masters).await?;
    r.joins_per_s = args.joiners as f64 / join_secs;
    r.master_cpu_us_per_join = (cpu1 - cpu0) * 1e6 / args.joiners as f64;
    let mut by_start: Vec<(u64, u64)> = joined.iter().map(|(i, _, p)| (*i, *p)).collect();
    by_start.sort_unstable();
    r.fifo_inversions_vs_call_start =
        inversions(&by_start.iter().map(|(_, p)| *p).collect::<Vec<_>>());
    eprintln!(
        "joins: {:.0}/s, {:.1} master µs/join, {} inversions",
        r.joins_per_s, r.master_cpu_us_per_join, r.fifo_inversions_vs_call_start
    );

    // Ticket reads, all waiting (no admitter yet). tickets[i] is user j{i}'s.
    joined.sort_unstable_by_key(|(i, _, _)| *i);
    let tickets: Vec<String> = joined.iter().map(|(_, t, _)| t.clone()).collect();
    let started = Instant::now();
    let reads = stream::iter(tickets.iter().cloned())
        .map(|t| {
            let engine = engine.clone();
            async move { engine.queue_status(&t).await.map(|_| ()) }
        })
        .buffer_unordered(args.concurrency)
        .filter(|r| std::future::ready(r.is_ok()))
        .count()
        .await;
    r.status_reads_per_s = reads as f64 / started.elapsed().as_secs_f64();
    eprintln!("ticket reads: {:.0}/s", r.status_reads_per_s);

    // The sale: the admitter lets people in; sweeps over the tickets buy
    // for the admitted and note when a waiting one first reads sold_out.
    let admitter = engine.spawn_room_admitter(Duration::from_millis(100));
    let calls = Arc::new(AtomicU64::new(0));
    let sold = Arc::new(AtomicU64::new(0));
    let last_sale = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let epoch = Instant::now();
    let mut seen_sold_out: HashMap<usize, Instant> = HashMap::new();
    let mut bought: Vec<bool> = vec![false; tickets.len()];
    let deadline = epoch + Duration::from_secs(args.max_seconds);
    loop {
        let pending: Vec<usize> = (0..tickets.len())
            .filter(|i| !seen_sold_out.contains_key(i) && !bought[*i])
            .collect();
        if pending.is_empty() || Instant::now() > deadline {
            break;
        }
        let answers: Vec<(usize, Option<QueueState>, bool)> = stream::iter(pending)
            .map(|i| {
                let (engine, sku, t) = (engine.clone(), sku.clone(), tickets[i].clone());
                let (calls, sold, last_sale) = (calls.clone(), sold.clone(), last_sale.clone());
                async move {
                    let Ok(s) = engine.queue_status(&t).await else {
                        return (i, None, false);
                    };
                    if s.state != QueueState::Admitted {
                        return (i, Some(s.state), false);
                    }
                    let token = s.admission_token.unwrap_or_default();
                    let user = format!("j{i}");
                    calls.fetch_add(1, Ordering::Relaxed);
                    let req = PurchaseRequest {
                        sku: &sku,
                        user: &user,
                        qty: 1,
                        request_id: "r",
                    };
                    match engine.purchase_admitted(req, &token).await {
                        Ok(_) => {
                            sold.fetch_add(1, Ordering::Relaxed);
                            *last_sale.lock().unwrap_or_else(|p| p.into_inner()) =
                                Some(Instant::now());
                            (i, Some(QueueState::Admitted), true)
                        }
                        Err(PurchaseError::SoldOut) | Err(PurchaseError::LimitExceeded { .. }) => {
                            (i, Some(QueueState::SoldOut), true)
                        }
                        Err(e) => {
                            static SHOWN: std::sync::Once = std::sync::Once::new();
                            SHOWN.call_once(|| eprintln!("a purchase failed: {e}"));
                            (i, Some(QueueState::Admitted), false)
                        }
                    }
                }
            })
            .buffer_unordered(args.concurrency)
            .collect()
            .await;
        let now = Instant::now();
        for (i, state, done) in answers {
            if done {
                bought[i] = true;
            } else if state == Some(QueueState::SoldOut) {
                seen_sold_out.entry(i).or_insert(now);
            }
        }
    }
    admitter.abort();
    r.sale_seconds = epoch.elapsed().as_secs_f64();
    r.sold = sold.load(Ordering::Relaxed);
    r.purchase_calls = calls.load(Ordering::Relaxed);
    r.purchase_calls_bound = args.overbook * args.stock as f64;
    let last = (*last_sale.lock().unwrap_or_else(|p| p.into_inner())).context("nothing sold")?;
    let mut waits: Vec<f64> = seen_sold_out
        .values()
        .map(|t| t.saturating_duration_since(last).as_secs_f64() * 1000.0)
        .collect();
    waits.sort_by(f64::total_cmp);
    r.waiting_at_last_sale = waits.len() as u64;
    r.never_saw_sold_out = (0..tickets.len())
        .filter(|i| !seen_sold_out.contains_key(i) && !bought[*i])
        .count() as u64;
    let q = |p: f64| {
        waits
            .get(((waits.len() as f64 * p) as usize).min(waits.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0)
    };
    r.sold_out_seen_p50_ms = q(0.50);
    r.sold_out_seen_p99_ms = q(0.99);
    r.sold_out_seen_max_ms = waits.last().copied().unwrap_or(0.0);
    eprintln!(
        "sale: {} sold, {} purchase calls (bound {}), sold_out seen p50 {:.0} ms p99 {:.0} ms max {:.0} ms after the last sale, {} never",
        r.sold, r.purchase_calls, r.purchase_calls_bound, r.sold_out_seen_p50_ms, r.sold_out_seen_p99_ms, r.sold_out_seen_max_ms, r.never_saw_sold_out
    );

    // Shuffled start: joiners before it, in a known order.
    let shuffled_sku = format!("room-shuffle-{run}");
    engine
        .create_sale(SaleSpec {
            per_user_limit: 1,
            buckets: args.buckets,
            starts_at: Some(SystemTime::now() + Duration::from_secs(3600)),
            queue: Some(QueueSpec {
                rate: QueueRate::Auto,
                window_ms: 120_000,
                order: QueueOrder::ShuffleAtStart,
                overbook: 1.0,
            }),
            ..SaleSpec::new(shuffled_sku.clone(), 10)
        })
        .await?;
    let mut places = Vec::with_capacity(args.shuffled as usize);
    for i in 0..args.shuffled {
        let s = engine.join_queue(&shuffled_sku, &format!("s{i}")).await?;
        places.push(place_of(&engine, &s.ticket)?);
    }
    r.shuffled_joiners = args.shuffled;
    r.shuffle_chi_square_10x10 = chi_square(&places);
    r.shuffle_chi_square_dof = 81;
    eprintln!(
        "shuffle: chi-square {:.1} over 81 degrees of freedom (join decile x place decile)",
        r.shuffle_chi_square_10x10
    );
    for s in [&sku, &shuffled_sku] {
        engine.close_sale(s).await?;
    }
    let text = serde_json::to_string_pretty(&r)?;
    println!("{text}");
    if let Some(path) = args.json {
        std::fs::write(path, text)?;
    }
    Ok(())
}

/// The place a ticket carries.
fn place_of(engine: &Engine, ticket: &str) -> Result<u64> {
    let keys = engine.pass_keys().context("room keys")?;
    let pass = keys
        .verify(ticket, 0, 0)
        .map_err(|e| anyhow::anyhow!("ticket: {e}"))?;
    Ok(pass.place)
}

/// The masters' CPU seconds (user + system), summed.
async fn masters_cpu(masters: &[String]) -> Result<f64> {
    let mut total = 0.0;
    for m in masters {
        let client = redis::Client::open(format!("redis://{m}"))?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let text: String = redis::cmd("INFO").arg("cpu").query_async(&mut conn).await?;
        for l in text.lines() {
            if let Some(v) = l
                .strip_prefix("used_cpu_sys:")
                .or_else(|| l.strip_prefix("used_cpu_user:"))
            {
                total += v.trim().parse::<f64>().unwrap_or(0.0);
            }
        }
    }
    Ok(total)
}

/// Pairs out of order, by merge sort.
fn inversions(v: &[u64]) -> u64 {
    fn sort(v: &mut [u64], buf: &mut Vec<u64>) -> u64 {
        let n = v.len();
        if n < 2 {
            return 0;
        }
        let mid = n / 2;
        let mut count = sort(&mut v[..mid], buf) + sort(&mut v[mid..], buf);
        buf.clear();
        let (mut i, mut j) = (0, mid);
        while i < mid && j < n {
            if v[i] <= v[j] {
                buf.push(v[i]);
                i += 1;
            } else {
                buf.push(v[j]);
                count += (mid - i) as u64;
                j += 1;
            }
        }
        buf.extend_from_slice(&v[i..mid]);
        buf.extend_from_slice(&v[j..n]);
        v.copy_from_slice(buf);
        count
    }
    let mut v = v.to_vec();
    let mut buf = Vec::with_capacity(v.len());
    sort(&mut v, &mut buf)
}

/// Chi-square of the 10 x 10 table of join decile against place decile
/// (independence: expected n / 100 per cell).
fn chi_square(places_in_join_order: &[u64]) -> f64 {
    let n = places_in_join_order.len();
    if n < 100 {
        return 0.0;
    }
    let mut ranked: Vec<(u64, usize)> = places_in_join_order
        .iter()
        .enumerate()
        .map(|(i, p)| (*p, i))
        .collect();
    ranked.sort_unstable();
    let mut table = [[0u64; 10]; 10];
    for (rank, (_, joined)) in ranked.iter().enumerate() {
        table[joined * 10 / n][rank * 10 / n] += 1;
    }
    let expected = n as f64 / 100.0;
    table
        .iter()
        .flatten()
        .map(|&o| (o as f64 - expected).powi(2) / expected)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inversions_and_chi_square_count_what_they_say() {
        assert_eq!(inversions(&[1, 2, 3]), 0);
        assert_eq!(inversions(&[3, 2, 1]), 3);
        assert_eq!(inversions(&[2, 1, 3, 0]), 4);
        let sorted: Vec<u64> = (0..1000).collect();
        // Places in join order: every join decile in its own place decile.
        assert!(chi_square(&sorted) > 8000.0);
    }
}
