//! `flashsale demo`: a flash sale on the local cluster, end to end. Creates a
//! sale, sends simulated buyers through the engine API at a bounded
//! concurrency, then checks the result against Redis itself and reports.
//! With `--hold-ms`, orders are held for payment: a share of the buyers pay
//! (`--pay-ratio`), the other holds expire, and a second wave of buyers buys
//! the units that came back.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use flashsale::{Engine, PurchaseError, PurchaseRequest, SaleSpec, Settings};
use serde::Serialize;
use std::process::ExitCode;
use tokio::sync::Semaphore;

/// Demo knobs, from the command line.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Units on sale.
    #[arg(long, default_value_t = 1000)]
    pub stock: u64,
    /// Buckets the SKU is split into (spread over masters).
    #[arg(long, default_value_t = 3)]
    pub buckets: u32,
    /// Simulated buyers, one purchase each.
    #[arg(long, default_value_t = 10_000)]
    pub buyers: u64,
    /// Purchases in flight at once.
    #[arg(long, default_value_t = 200)]
    pub concurrency: usize,
    /// Most units one user may buy (0 = no limit).
    #[arg(long, default_value_t = 1)]
    pub per_user_limit: u32,
    /// Hold each order this many ms for payment (0 = paid when confirmed).
    #[arg(long, default_value_t = 0)]
    pub hold_ms: u64,
    /// With holds: the share of buyers who pay (0.0..=1.0); the others' holds
    /// expire and their units are sold again to a second wave of buyers.
    #[arg(long, default_value_t = 1.0)]
    pub pay_ratio: f64,
    /// Print one JSON object instead of a progress bar and a summary.
    #[arg(long)]
    pub json: bool,
}

/// What the demo measured.
#[derive(Debug, Serialize)]
pub struct DemoReport {
    /// The SKU created for this run.
    pub sku: String,
    /// Units on sale.
    pub stock: u64,
    /// Buckets.
    pub buckets: u32,
    /// Buyers sent.
    pub buyers: u64,
    /// Confirmed purchases (units).
    pub sold: u64,
    /// Units left in Redis after the run.
    pub remaining: u64,
    /// Units sold beyond the stock, plus any stock key below zero (must be 0).
    pub oversold: u64,
    /// Orders that do not match between the answers and PostgreSQL: confirmed
    /// ids missing from the table, plus rows nobody was confirmed (must be 0).
    pub unmatched_orders: u64,
    /// Entries in the sale's order streams after the buying phase, before the
    /// writer drained them: one per order, plus one per transition of a held
    /// order (paid, expired).
    pub stream_entries: u64,
    /// Answers "sold out".
    pub sold_out_answers: u64,
    /// Other errors.
    pub errors: u64,
    /// Wall time of the buying phase (the first wave of buyers), seconds.
    pub elapsed_seconds: f64,
    /// Confirmed purchases per second during the buying phase.
    pub confirmed_per_second: f64,
    /// Answers of any kind (most of them "sold out" once the stock is gone)
    /// per second during the buying phase.
    pub answers_per_second: f64,
    /// Orders of this sale in PostgreSQL once the writer drained (= sold).
    pub orders_in_db: u64,
    /// Orders per second the writer moved from the streams into PostgreSQL
    /// (it starts after the buying phase, so this is its own rate: from its
    /// start until PostgreSQL held them all, checked every 50 ms).
    pub db_orders_per_second: f64,
    /// With holds: orders paid (first wave within their window, and every
    /// order of the second wave).
    pub paid: u64,
    /// With holds: orders whose hold expired unpaid (their units went back).
    pub expired: u64,
    /// With holds: orders cancelled (the demo cancels none).
    pub cancelled: u64,
    /// With holds: units sold again, to the second wave, after they came back.
    pub resold: u64,
    /// With holds: orders in PostgreSQL whose state differs from the engine's
    /// (must be 0).
    pub state_mismatches: u64,
    /// Units that are neither left in Redis nor in an order that kept them
    /// (sold - expired): must be 0, holds or not.
    pub units_unaccounted: u64,
    /// `flashsale reconcile` of the sale once the writer drained: initial =
    /// remaining + pending + written.
    pub ledger_conserved: bool,
}

/// The `demo` command: runs the sale, prints the report (JSON or a table),
/// and fails unless nothing was oversold and every order reached PostgreSQL.
pub async fn command(settings: Settings, args: DemoArgs) -> Result<ExitCode> {
    let config = settings.engine;
    let pool = flashsale::db::pool(&config.postgres_url, 4)?;
    let engine = Engine::connect(config).await?;
    let json = args.json;
    if !(0.0..=1.0).contains(&args.pay_ratio) {
        anyhow::bail!("--pay-ratio must be 0.0..=1.0, got {}", args.pay_ratio);
    }
    let report = run(engine, pool, args).await?;
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print(&report);
    }
    let sound = report.oversold == 0
        && report.unmatched_orders == 0
        && report.orders_in_db == report.sold
        && report.state_mismatches == 0
        && report.units_unaccounted == 0
        && report.errors == 0
        && report.ledger_conserved;
    Ok(if sound {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Runs the demo on `engine`.
pub async fn run(
    engine: Engine,
    pool: deadpool_postgres::Pool,
    args: DemoArgs,
) -> Result<DemoReport> {
    let sku = format!(
        "demo-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis()
    );
    engine
        .create_sale(SaleSpec {
            buckets: args.buckets,
            per_user_limit: args.per_user_limit,
            hold_ms: args.hold_ms,
            ..SaleSpec::new(&sku, args.stock)
        })
        .await?;
    // With holds, the sweeper runs for the whole sale, as in `serve`.
    let sweeper = (args.hold_ms > 0).then(|| engine.spawn_hold_sweeper());
    // Buyer i pays when i's share falls under the ratio (spread evenly).
    let pays = move |i: u64| (i % 100) < (args.pay_ratio * 100.0).round() as u64;

    let bar = if args.json {
        indicatif::ProgressBar::hidden()
    } else {
        let b = indicatif::ProgressBar::new(args.buyers);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} buyers {pos}/{len} {bar:40} {per_sec} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    };
    let started = Instant::now();
    let wave = Wave {
        engine: &engine,
        sku: &sku,
        concurrency: args.concurrency,
        bar: &bar,
    };
    let first = wave.run("buyer", args.buyers, pays).await?;
    let first_sold = first.sold;
    let (mut sold, mut sold_out, mut errors) = (first.sold, first.sold_out, first.errors);
    let mut order_ids = first.order_ids;
    let mut resold = 0;
    let elapsed = started.elapsed().as_secs_f64();
    let (mut paid, mut expired) = (first.paid, 0u64);
    if args.hold_ms > 0 {
        // Wait for the first wave's unpaid holds to expire (the sweeper
        // puts their units back), then a second wave buys and pays them.
        tokio::time::sleep(std::time::Duration::from_millis(args.hold_ms)).await;
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let mut still_held = 0u64;
            expired = 0;
            for id in &first.held {
                match engine.order(id).await?.state {
                    flashsale::OrderState::Held => still_held += 1,
                    flashsale::OrderState::Expired => expired += 1,
                    _ => {}
                }
            }
            if still_held == 0 || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let second = wave.run("late-buyer", args.buyers, |_| true).await?;
        resold = second.sold;
        sold += second.sold;
        sold_out += second.sold_out;
        errors += second.errors;
        paid += second.paid;
        order_ids.extend(second.order_ids);
    }
    bar.finish_with_message("done");
    if let Some(s) = sweeper {
        s.abort();
    }

    // Count the streams before the writer drains (and trims) them, so the
    // report shows every confirmed order queued, then every order written.
    let status = engine.sale_status(&sku).await?;
    let writer_started = Instant::now();
    let writer = engine
        .spawn_order_writer(pool.clone(), flashsale::WriterConfig::default())
        .await?;
    let orders_in_db = wait_for_orders(&pool, &sku, sold).await?;
    let drain = writer_started.elapsed().as_secs_f64();
    // Every order's state in PostgreSQL, once its transitions are written.
    let mut states: Vec<(String, String)> = Vec::new();
    let wanted = paid + expired;
    for _ in 0..600 {
        states = flashsale::db::client(&pool)
            .await?
            .query(
                "SELECT order_id, status FROM orders WHERE sku = $1",
                &[&sku],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let settled = states
            .iter()
            .filter(|(_, s)| s == "paid" || s == "expired")
            .count() as u64;
        if args.hold_ms == 0 || settled >= wanted {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let mut state_mismatches = 0;
    if args.hold_ms > 0 {
        for (id, state) in &states {
            if engine.order(id).await?.state.as_str() != state {
                state_mismatches += 1;
            }
        }
    }
    let in_db: HashSet<String> = states.into_iter().map(|(id, _)| id).collect();
    let unmatched = order_ids.symmetric_difference(&in_db).count() as u64
        + sold.saturating_sub(order_ids.len() as u64);

    writer.shutdown().await?;
    let ledger_conserved = flashsale::ledger::reconcile(&engine, &pool, std::slice::from_ref(&sku))
        .await?
        .iter()
        .all(|r| r.conserved);
    let below_zero: u64 = status
        .buckets
        .iter()
        .map(|b| b.remaining.min(0).unsigned_abs())
        .sum();
    Ok(DemoReport {
        sku,
        stock: args.stock,
        buckets: args.buckets,
        buyers: args.buyers,
        sold,
        remaining: status.remaining,
        // Units out (sold minus the expired, which went back) beyond the stock.
        oversold: sold.saturating_sub(expired).saturating_sub(args.stock) + below_zero,
        unmatched_orders: unmatched,
        stream_entries: status.buckets.iter().map(|b| b.stream_len).sum(),
        sold_out_answers: sold_out,
        errors,
        elapsed_seconds: elapsed,
        // The first wave: the flash sale itself.
        confirmed_per_second: first_sold as f64 / elapsed.max(1e-9),
        answers_per_second: args.buyers as f64 / elapsed.max(1e-9),
        orders_in_db,
        db_orders_per_second: orders_in_db as f64 / drain.max(1e-9),
        paid,
        expired,
        cancelled: 0,
        resold,
        state_mismatches,
        units_unaccounted: (args.stock).abs_diff(status.remaining + sold.saturating_sub(expired)),
        ledger_conserved,
    })
}

/// One wave of buyers against one sale.
struct Wave<'a> {
    engine: &'a Engine,
    sku: &'a str,
    concurrency: usize,
    bar: &'a indicatif::ProgressBar,
}

/// What a wave did.
struct WaveResult {
    sold: u64,
    sold_out: u64,
    errors: u64,
    /// Orders paid (held orders whose buyer paid in time).
    paid: u64,
    order_ids: HashSet<String>,
    /// Held orders left unpaid.
    held: Vec<String>,
}

impl Wave<'_> {
    /// `buyers` buyers named `<prefix>-<i>`, one purchase each, at most
    /// `concurrency` at once; a held order is paid when `pays(i)`.
    async fn run(
        &self,
        prefix: &str,
        buyers: u64,
        pays: impl Fn(u64) -> bool + Copy + Send + 'static,
    ) -> Result<WaveResult> {
        let sem = Arc::new(Semaphore::new(self.concurrency.max(1)));
        let sku: Arc<str> = self.sku.into();
        let mut tasks = Vec::with_capacity(buyers as usize);
        for i in 0..buyers {
            let permit = sem.clone().acquire_owned().await?;
            let engine = self.engine.clone();
            let (sku, bar) = (sku.clone(), self.bar.clone());
            let user = format!("{prefix}-{i}");
            tasks.push(tokio::spawn(async move {
                let r = engine
                    .purchase(PurchaseRequest {
                        sku: &sku,
                        user: &user,
                        qty: 1,
                        request_id: &user,
                    })
                    .await;
                let paid = match &r {
                    Ok(c) if c.status == flashsale::OrderState::Held && pays(i) => engine
                        .pay(&c.order_id, &format!("pay-{user}"))
                        .await
                        .is_ok(),
                    _ => false,
                };
                bar.inc(1);
                drop(permit);
                (r, paid)
            }));
        }
        let mut out = WaveResult {
            sold: 0,
            sold_out: 0,
            errors: 0,
            paid: 0,
            order_ids: HashSet::new(),
            held: Vec::new(),
        };
        for t in tasks {
            match t.await? {
                (Ok(c), paid) => {
                    out.sold += 1;
                    if paid {
                        out.paid += 1;
                    } else if c.status == flashsale::OrderState::Held {
                        out.held.push(c.order_id.clone());
                    }
                    out.order_ids.insert(c.order_id);
                }
                (Err(PurchaseError::SoldOut), _) => out.sold_out += 1,
                (Err(e), _) => {
                    out.errors += 1;
                    tracing::warn!(error = %e, "purchase failed");
                }
            }
        }
        Ok(out)
    }
}

/// Waits (at most 60 s) until PostgreSQL holds `sold` orders of `sku`;
/// returns how many it holds.
async fn wait_for_orders(pool: &deadpool_postgres::Pool, sku: &str, sold: u64) -> Result<u64> {
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let client = flashsale::db::client(pool).await?;
        let n: i64 = client
            .query_one("SELECT COUNT(*) FROM orders WHERE sku = $1", &[&sku])
            .await?
            .get(0);
        if n as u64 >= sold || Instant::now() >= deadline {
            return Ok(n.max(0) as u64);
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Prints the report for a person.
pub fn print(r: &DemoReport) {
    println!(
        "sale {} ({} units in {} buckets), {} buyers",
        r.sku, r.stock, r.buckets, r.buyers
    );
    println!("  sold            {}", r.sold);
    println!("  remaining       {}", r.remaining);
    println!("  oversold        {}", r.oversold);
    println!("  unmatched       {}", r.unmatched_orders);
    println!("  stream entries  {}", r.stream_entries);
    println!("  sold-out answers {}", r.sold_out_answers);
    println!("  errors          {}", r.errors);
    println!("  elapsed         {:.3} s", r.elapsed_seconds);
    println!("  confirmed/s     {:.0}", r.confirmed_per_second);
    println!("  answers/s       {:.0}", r.answers_per_second);
    println!("  orders in db    {}", r.orders_in_db);
    println!("  written         {:.0} orders/s", r.db_orders_per_second);
    if r.paid + r.expired > 0 {
        println!("  paid            {}", r.paid);
        println!("  expired         {}", r.expired);
        println!("  resold          {}", r.resold);
        println!("  state mismatch  {}", r.state_mismatches);
    }
}
