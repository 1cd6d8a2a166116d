//! `flashsale demo`: a flash sale on the local cluster, end to end. Creates a
//! sale, sends simulated buyers through the engine API at a bounded
//! concurrency, then checks the result against Redis itself and reports.

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
    /// writer drained them.
    pub stream_entries: u64,
    /// Answers "sold out".
    pub sold_out_answers: u64,
    /// Other errors.
    pub errors: u64,
    /// Wall time of the buying phase, seconds.
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
}

/// The `demo` command: runs the sale, prints the report (JSON or a table),
/// and fails unless nothing was oversold and every order reached PostgreSQL.
pub async fn command(settings: Settings, args: DemoArgs) -> Result<ExitCode> {
    let config = settings.engine;
    let pool = flashsale::db::pool(&config.postgres_url, 4)?;
    let engine = Engine::connect(config).await?;
    let json = args.json;
    let report = run(engine, pool, args).await?;
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print(&report);
    }
    let sound =
        report.oversold == 0 && report.unmatched_orders == 0 && report.orders_in_db == report.sold;
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
            ..SaleSpec::new(&sku, args.stock)
        })
        .await?;

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
    let sem = Arc::new(Semaphore::new(args.concurrency.max(1)));
    let sku_arc: Arc<str> = sku.as_str().into();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(args.buyers as usize);
    for i in 0..args.buyers {
        let permit = sem.clone().acquire_owned().await?;
        let engine = engine.clone();
        let sku = sku_arc.clone();
        let bar = bar.clone();
        tasks.push(tokio::spawn(async move {
            let user = format!("buyer-{i}");
            let r = engine
                .purchase(PurchaseRequest {
                    sku: &sku,
                    user: &user,
                    qty: 1,
                    request_id: &user,
                })
                .await;
            bar.inc(1);
            drop(permit);
            r
        }));
    }
    let mut order_ids = HashSet::new();
    let (mut sold, mut sold_out, mut errors) = (0u64, 0u64, 0u64);
    for t in tasks {
        match t.await? {
            Ok(c) => {
                sold += 1;
                order_ids.insert(c.order_id);
            }
            Err(PurchaseError::SoldOut) => sold_out += 1,
            Err(e) => {
                errors += 1;
                tracing::warn!(error = %e, "purchase failed");
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    bar.finish_with_message("done");

    // Count the streams before the writer drains (and trims) them, so the
    // report shows every confirmed order queued, then every order written.
    let status = engine.sale_status(&sku).await?;
    let writer_started = Instant::now();
    let writer = engine
        .spawn_order_writer(pool.clone(), flashsale::WriterConfig::default())
        .await?;
    let orders_in_db = wait_for_orders(&pool, &sku, sold).await?;
    let drain = writer_started.elapsed().as_secs_f64();
    writer.shutdown().await?;
    let in_db: HashSet<String> = flashsale::db::client(&pool)
        .await?
        .query("SELECT order_id FROM orders WHERE sku = $1", &[&sku])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let unmatched = order_ids.symmetric_difference(&in_db).count() as u64
        + sold.saturating_sub(order_ids.len() as u64);

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
        oversold: sold.saturating_sub(args.stock) + below_zero,
        unmatched_orders: unmatched,
        stream_entries: status.buckets.iter().map(|b| b.stream_len).sum(),
        sold_out_answers: sold_out,
        errors,
        elapsed_seconds: elapsed,
        confirmed_per_second: sold as f64 / elapsed.max(1e-9),
        answers_per_second: args.buyers as f64 / elapsed.max(1e-9),
        orders_in_db,
        db_orders_per_second: orders_in_db as f64 / drain.max(1e-9),
    })
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
}
