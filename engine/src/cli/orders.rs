//! `flashsale orders run`: an order writer draining the streams into
//! PostgreSQL until SIGINT or SIGTERM.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Subcommand;
use flashsale::{Engine, Settings};

#[derive(Subcommand)]
pub enum OrdersCommand {
    /// Run the writers until SIGINT/SIGTERM; they finish the batch in hand.
    Run {
        /// Entries per batch.
        #[arg(long, default_value_t = 2000)]
        batch: usize,
        /// Writers in this process (consumers of the one group), 1 to 64.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
        writers: u16,
        /// Take over entries pending this long on a silent consumer (ms).
        #[arg(long, default_value_t = 30_000)]
        claim_idle_ms: u64,
    },
}

/// Runs the writer until a signal; finishes the batch in hand.
pub async fn run(settings: Settings, cmd: OrdersCommand) -> Result<ExitCode> {
    let OrdersCommand::Run {
        batch,
        writers,
        claim_idle_ms,
    } = cmd;
    let config = settings.engine;
    let writers = usize::from(writers);
    let pool = flashsale::db::pool(&config.postgres_url, 4 * writers)?;
    let engine = Engine::connect(config).await?;
    let handle = engine
        .spawn_order_writer(
            pool,
            flashsale::WriterConfig {
                batch: batch.max(1),
                writers,
                claim_idle: Duration::from_millis(claim_idle_ms),
                ..Default::default()
            },
        )
        .await?;
    say!("order writers running; SIGINT or SIGTERM stops them");
    super::shutdown_signal().await;
    let report = handle.shutdown().await?;
    say!(
        "order writer stopped: written {} acked {} dead-lettered {} claimed {}",
        report.written,
        report.acked,
        report.dead_lettered,
        report.claimed
    );
    Ok(ExitCode::SUCCESS)
}
