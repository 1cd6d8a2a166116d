//! `flashsale-bench`: how close flashsale comes to the raw speed of Redis
//! running the same script, and how far ahead it is of the lock-based way,
//! on the user's own machine and cluster, in one invocation. Scenarios: one
//! hot SKU in one bucket (`hot1`), one hot SKU in B buckets (`hotB`), many
//! SKUs (`many`). Strategies: `anchor` (redis-benchmark, same script, same
//! keys), `engine`, `lock`, `naive`. Then the lock benchmark against rslock.
//! Every sale it creates is deleted at the end, so the ledger of the cluster
//! it ran on is left as it was.
//!
//! This file parses the arguments and the settings and writes the report;
//! `driver.rs` runs the strategies and `targets.rs` judges the figures.

mod anchor;
mod args;
mod cost;
mod driver;
mod load;
mod lockbench;
mod report;
mod strategies;
mod targets;

/// The allocator `flashsale serve` runs with (glibc malloc took about a fifth
/// of this process's CPU in the hot1 run: arena locks, consolidating freed
/// buffers). rslock runs in this process too, on the same allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use clap::Parser;
use flashsale::{Config, Engine, Settings};
use indicatif::MultiProgress;

use args::Args;
use driver::{machine, measure, Bench};
use report::Report;
use targets::{find, medians, targets};

/// The cluster and lock nodes, read as the `flashsale` binary reads them
/// (defaults = the ops/up topology, then the file, then `FLASHSALE_*`).
/// The `[server]` table is not used, so not judged. The engine rows are
/// `ack = leader` whatever the file says (the replicated rows get their own
/// engine), and request ids live 10 minutes; then the result is validated.
fn config(args: &Args) -> Result<Config> {
    let mut c = Settings::read(args.config.as_deref())?.engine;
    c.ack = flashsale::Ack::Leader;
    c.request_ttl = Duration::from_secs(600);
    c.pending_timeout = c.pending_timeout.min(Duration::from_secs(60));
    c.validate()?;
    Ok(c)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(spec) = &args.lock_child {
        println!("{}", lockbench::child(spec).await?);
        return Ok(());
    }
    if let Some(spec) = &args.lock_shared {
        println!("{}", lockbench::shared_alone(spec).await?);
        return Ok(());
    }
    let config = config(&args)?;
    if let Some(n) = args.cost_purchases {
        println!("{}", cost::purchases(config, n, args.concurrency).await?);
        return Ok(());
    }
    let lock_nodes = config.lock_nodes.clone();
    let engine = Engine::connect(Config {
        lock_nodes: Vec::new(),
        ..config.clone()
    })
    .await
    .context("connecting to the cluster (is ops/up running?)")?;
    let replicated = Engine::connect(Config {
        lock_nodes: Vec::new(),
        ack: flashsale::Ack::Replicated,
        ..config.clone()
    })
    .await?;
    // One purchase per call, every call in flight at once: the engine as
    // it was before batching.
    let postgres_url = config.postgres_url.clone();
    let unbatched = Engine::connect(Config {
        lock_nodes: Vec::new(),
        batch_max: 1,
        batch_in_flight: flashsale::config::MAX_IN_FLIGHT,
        ..config
    })
    .await?;
    let mut conn = engine.dedicated_connection().await?;
    let machine = machine(&mut conn, &engine).await;
    let run = format!(
        "{}",
        SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis()
    );
    let mut b = Bench {
        args: args.clone(),
        engine,
        replicated,
        unbatched,
        postgres_url,
        has_replicas: machine.replicas > 0,
        conn,
        lock_nodes,
        run,
        created: Vec::new(),
        plain_keys: Vec::new(),
        rep: 0,
        settled_for_next_row: false,
        bars: MultiProgress::new(),
    };
    let mut runs = Vec::with_capacity(args.repeat.max(1));
    let base_run = b.run.clone();
    for rep in 0..args.repeat.max(1) {
        // Fresh SKUs, users and request ids per repetition: a reused request
        // id would be answered as a replay, not a sale.
        b.run = format!("{base_run}r{rep}");
        b.rep = rep;
        let result = measure(&mut b).await;
        // Clean up after every repetition, and even when one failed.
        let cleaned = b.cleanup().await;
        runs.push(result?);
        cleaned?;
    }
    let judged = targets(&runs);
    let (mut results, lock_results) = medians(runs);

    for sc in ["hot1", "hotB", "many"] {
        if let Some(anchor) = find(&results, sc, "anchor").map(|r| r.throughput) {
            for r in results.iter_mut().filter(|r| r.scenario == sc) {
                r.ratio_to_anchor = Some(r.throughput / anchor.max(1e-9));
            }
        }
    }
    let report = Report {
        generated_at: SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine,
        targets: judged,
        results,
        lock_results,
    };
    let md = report::markdown(&report);
    println!("{md}");
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(p) = &args.json {
        std::fs::write(p, &json).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &args.svg {
        std::fs::write(p, report::svg(&report))
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("results.json"), &json)?;
        std::fs::write(
            dir.join("summary.md"),
            format!("Command: `{}`\n\n{md}", report.command),
        )?;
        std::fs::write(dir.join("plot.svg"), report::svg(&report))?;
    }
    Ok(())
}
