//! `flashsale reconcile`: checks initial = remaining + pending + written per
//! SKU, records the result (fenced, when lock nodes are configured), prints
//! it, and exits 1 when any SKU does not balance.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use flashsale::{Engine, Settings};

/// What to reconcile and how to print it.
#[derive(Args)]
pub struct ReconcileArgs {
    /// Only these SKUs (repeatable; default: every sale).
    #[arg(long)]
    sku: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Reconciles and reports.
pub async fn run(settings: Settings, args: ReconcileArgs) -> Result<ExitCode> {
    let ReconcileArgs { sku, json } = args;
    let config = settings.engine;
    let pool = flashsale::db::pool(&config.postgres_url, 2)?;
    let engine = Engine::connect(config).await?;
    // One reconcile at a time writes results, fenced by its token.
    let guard = match engine.locks() {
        Some(l) => {
            let owner = format!("reconcile-{}", std::process::id());
            Some(
                l.lock("reconcile", &flashsale::lock::LockOptions::new(owner))
                    .await?,
            )
        }
        None => None,
    };
    let result = async {
        let reports = flashsale::ledger::reconcile(&engine, &pool, &sku).await?;
        if let Some(g) = &guard {
            flashsale::ledger::record(&pool, &reports, g.fencing_token()).await?;
        }
        anyhow::Ok(reports)
    }
    .await;
    // Released whatever reconcile answered: an error must not leave the
    // next reconcile waiting out the lease.
    if let Some(g) = guard {
        g.unlock().await;
    }
    let reports = result?;
    if json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    } else {
        println!(
            "{:<24} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>6} ok",
            "sku", "initial", "remaining", "pending", "written", "held", "paid", "dead", "lost"
        );
        for r in &reports {
            println!(
                "{:<24} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>6} {}",
                r.sku,
                r.initial,
                r.remaining,
                r.pending,
                r.written,
                r.held_in_db,
                r.paid_in_db,
                r.dead_lettered,
                r.lost_from_stream,
                if r.conserved { "yes" } else { "NO" }
            );
        }
    }
    Ok(if reports.iter().all(|r| r.conserved) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
