//! `flashsale orders run`: an order writer draining the streams into
//! PostgreSQL until SIGINT or SIGTERM.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Subcommand;
use flashsale::{Engine, Settings};

#[derive(Subcommand)]
pub enum OrdersCommand {
    /// Run a writer until SIGINT/SIGTERM; finishes the batch in hand.
    Run {
        /// Entries per batch.
        #[arg(long, default_value_t = 500)]
        batch: usize,
        /// Take over entries pending this long on a silent consumer (ms).
        #[arg(long, default_value_t = 30_000)]
        claim_idle_ms: u64,
    },
}

/// Runs the writer until a signal; finishes the batch in hand.
pub async fn run(settings: Settings, cmd: OrdersCommand) -> Result<ExitCode> {
    let OrdersCommand::Run {
        batch,
        claim_idle_ms,
    } = cmd;
    let config = settings.engine;
    let pool = flashsale::db::pool(&config.postgres_url, 4)?;
    let engine = Engine::connect(config).await?;
    let writer = flashsale::OrderWriter::new(
        engine,
        pool,
        flashsale::WriterConfig {
            batch: batch.max(1),
            claim_idle: Duration::from_millis(claim_idle_ms),
            ..Default::default()
        },
    )
    .await?;
    eprintln!("order writer running; SIGINT or SIGTERM stops it");
    let report = writer.run(super::shutdown_signal()).await?;
    eprintln!(
        "order writer stopped: written {} acked {} dead-lettered {} claimed {}",
        report.written, report.acked, report.dead_lettered, report.claimed
    );
    Ok(ExitCode::SUCCESS)
}
