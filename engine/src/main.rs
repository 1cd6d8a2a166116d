//! The `flashsale` binary: parses the command line, loads the settings and
//! hands the command to its module under `cli/`, which does the work and
//! prints its own output. Holds no business logic.

mod cli;
use cli::say;

/// glibc malloc took about a fifth of a selling process's CPU in a profile
/// of the bench (arena locks between the runtime's threads, consolidating
/// freed buffers); see docs/benchmarks.md for what mimalloc changed.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};
use flashsale::Settings;

#[derive(Parser)]
#[command(
    name = "flashsale",
    version,
    about = "Flash-sale inventory engine on Redis Cluster"
)]
struct Cli {
    /// TOML config file (defaults point at the ops/up topology).
    #[arg(long, global = true, env = "FLASHSALE_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API, /metrics and the order writer.
    Serve(cli::serve::ServeArgs),
    /// Run a flash sale on the cluster with simulated buyers and report.
    Demo(cli::demo::DemoArgs),
    /// Create, inspect, restock and close sales.
    #[command(subcommand)]
    Sale(cli::sale::SaleCommand),
    /// A sale's waiting room.
    #[command(subcommand)]
    Queue(cli::queue::QueueCommand),
    /// Inspect the configuration.
    #[command(subcommand)]
    Config(cli::config_check::ConfigCommand),
    /// The order writer: drain the order streams into PostgreSQL.
    #[command(subcommand)]
    Orders(cli::orders::OrdersCommand),
    /// Distributed locks on the lock nodes.
    #[command(subcommand)]
    Lock(cli::lock_exec::LockCommand),
    /// Semaphores with leased permits on the lock nodes.
    #[command(subcommand)]
    Semaphore(cli::semaphore_exec::SemaphoreCommand),
    /// Check initial = remaining + pending + written per SKU; exit 1 if not.
    Reconcile(cli::reconcile::ReconcileArgs),
}

fn main() -> ExitCode {
    // A signal mask is inherited across exec: a caller that blocked SIGTERM
    // (the seventeenth attack) made `lock exec` deaf to it, and `serve`
    // too. Before any thread starts, so every thread begins with none.
    cli::signal_mask::unblock_all_signals();
    // A lock exec's supervisor runs this binary anew under its own name.
    cli::supervisor::run_if_supervisor();
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            say!("error: cannot start the runtime: {e}");
            cli::messages::flush(std::time::Duration::from_millis(500));
            return ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            say!("error: {e:#}");
            ExitCode::FAILURE
        }
    };
    // The last messages out, but never held up by a stderr nobody reads.
    cli::messages::flush(std::time::Duration::from_millis(500));
    code
}

async fn dispatch(cli: Cli) -> Result<ExitCode> {
    let settings = Settings::load(cli.config.as_deref())?;
    match cli.command {
        Command::Config(cmd) => cli::config_check::run(&settings, cmd),
        Command::Demo(args) => cli::demo::command(settings, args).await,
        Command::Sale(cmd) => cli::sale::run(settings, cmd).await,
        Command::Orders(cmd) => cli::orders::run(settings, cmd).await,
        Command::Queue(cmd) => cli::queue::run(settings, cmd).await,
        Command::Serve(args) => cli::serve::command(settings, args, cli::shutdown_signal()).await,
        Command::Lock(cmd) => {
            let certificates = tls_files(&settings)?;
            cli::lock_exec::command(&settings.engine.lock_nodes, &certificates, cmd).await
        }
        Command::Semaphore(cmd) => {
            let certificates = tls_files(&settings)?;
            cli::semaphore_exec::command(&settings.engine.lock_nodes, &certificates, cmd).await
        }
        Command::Reconcile(args) => cli::reconcile::run(settings, args).await,
    }
}

/// The `[tls]` files, read only when some node is `rediss://` (as the
/// engine and `config check` do).
fn tls_files(settings: &Settings) -> Result<flashsale::Certificates, flashsale::TlsFileError> {
    if settings.engine.uses_tls() {
        flashsale::Certificates::load(&settings.engine.tls)
    } else {
        Ok(flashsale::Certificates::default())
    }
}
