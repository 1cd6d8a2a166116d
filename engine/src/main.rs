//! The `flashsale` binary: sale admin and repair, the demo, the order
//! writer, reconcile, `lock exec` and the HTTP service. Parses the command line,
//! loads the config and calls the library; holds no business logic.

mod cli;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::Result;
use clap::{Parser, Subcommand};
use flashsale::{Engine, SaleSpec};

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
    Sale(SaleCommand),
    /// Inspect the configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// The order writer: drain the order streams into PostgreSQL.
    #[command(subcommand)]
    Orders(OrdersCommand),
    /// Distributed locks on the lock nodes.
    #[command(subcommand)]
    Lock(LockCommand),
    /// Check initial = remaining + pending + written per SKU; exit 1 if not.
    Reconcile {
        /// Only these SKUs (repeatable; default: every sale).
        #[arg(long)]
        sku: Vec<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum LockCommand {
    /// Run a command while holding a lock (exit 75: not acquired, 79: lost).
    Exec(cli::lock_exec::LockExecArgs),
}

#[derive(Subcommand)]
enum OrdersCommand {
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

#[derive(Subcommand)]
enum SaleCommand {
    /// Create a sale.
    Create {
        /// The SKU.
        #[arg(long)]
        sku: String,
        /// Units on sale.
        #[arg(long)]
        stock: u64,
        /// Buckets (spread over masters).
        #[arg(long, default_value_t = 1)]
        buckets: u32,
        /// Most units per user (0 = no limit).
        #[arg(long, default_value_t = 0)]
        per_user_limit: u32,
        /// Open the sale this many seconds from now (default: now).
        #[arg(long)]
        starts_in: Option<u64>,
        /// End the sale this many seconds from now (default: never).
        #[arg(long)]
        ends_in: Option<u64>,
        /// Operation id: run the same command again with the same id (after
        /// a timeout, say) and it finishes the first create instead of
        /// failing with "already exists". Default: a fresh one.
        #[arg(long)]
        op_id: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a sale's buckets: key, tag, slot, master, remaining.
    Status {
        /// The SKU.
        #[arg(long)]
        sku: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Add units to an open sale.
    Restock {
        /// The SKU.
        #[arg(long)]
        sku: String,
        /// Units to add.
        #[arg(long)]
        qty: u64,
        /// Operation id: a retry with the same id adds the units once.
        /// Default: a fresh one.
        #[arg(long)]
        op_id: Option<String>,
    },
    /// Finish whatever a crash left half-done on a sale (a create, a
    /// restock, a close). Safe to run at any time.
    Repair {
        /// The SKU.
        #[arg(long)]
        sku: String,
    },
    /// Close a sale: no purchase confirms after this.
    Close {
        /// The SKU.
        #[arg(long)]
        sku: String,
    },
    /// List every SKU with a sale.
    List,
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate the config and print the effective values as TOML.
    Check,
}

fn main() -> ExitCode {
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
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode> {
    let config = cli::settings::load(cli.config.as_deref())?;
    match cli.command {
        Command::Config(ConfigCommand::Check) => {
            println!("{}", toml::to_string(&config.redacted())?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo(args) => {
            let pool = flashsale::db::pool(&config.postgres_url, 4)?;
            let engine = Engine::connect(config).await?;
            let json = args.json;
            let report = cli::demo::run(engine, pool, args).await?;
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                cli::demo::print(&report);
            }
            Ok(
                if report.oversold == 0
                    && report.unmatched_orders == 0
                    && report.orders_in_db == report.sold
                {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                },
            )
        }
        Command::Sale(cmd) => sale(Engine::connect(config).await?, cmd).await,
        Command::Orders(OrdersCommand::Run {
            batch,
            claim_idle_ms,
        }) => {
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
            let report = writer.run(shutdown_signal()).await?;
            eprintln!(
                "order writer stopped: written {} acked {} dead-lettered {} claimed {}",
                report.written, report.acked, report.dead_lettered, report.claimed
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve(args) => {
            cli::serve::command(config, args, shutdown_signal()).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Lock(LockCommand::Exec(args)) => {
            cli::lock_exec::run(&config.lock_nodes, args).await
        }
        Command::Reconcile { sku, json } => {
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
            let reports = flashsale::ledger::reconcile(&engine, &pool, &sku).await?;
            if let Some(g) = guard {
                flashsale::ledger::record(&pool, &reports, g.fencing_token()).await?;
                g.unlock().await;
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&reports)?);
            } else {
                println!(
                    "{:<24} {:>9} {:>9} {:>9} {:>9} {:>6} {:>6} ok",
                    "sku", "initial", "remaining", "pending", "written", "dead", "lost"
                );
                for r in &reports {
                    println!(
                        "{:<24} {:>9} {:>9} {:>9} {:>9} {:>6} {:>6} {}",
                        r.sku,
                        r.initial,
                        r.remaining,
                        r.pending,
                        r.written,
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
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

async fn sale(engine: Engine, cmd: SaleCommand) -> Result<ExitCode> {
    let status = match cmd {
        SaleCommand::Create {
            sku,
            stock,
            buckets,
            per_user_limit,
            starts_in,
            ends_in,
            op_id,
            json,
        } => {
            let at = |field: &str, s: Option<u64>| -> Result<Option<SystemTime>> {
                s.map(|s| {
                    SystemTime::now()
                        .checked_add(Duration::from_secs(s))
                        .ok_or_else(|| anyhow::anyhow!("{field}: {s} seconds is too far away"))
                })
                .transpose()
            };
            let spec = SaleSpec {
                buckets,
                per_user_limit,
                starts_at: at("--starts-in", starts_in)?,
                ends_at: at("--ends-in", ends_in)?,
                ..SaleSpec::new(sku, stock)
            };
            let op = op_id.unwrap_or_else(flashsale::admin::new_operation_id);
            (engine.create_sale_op(spec, &op).await?, json)
        }
        SaleCommand::Status { sku, json } => (engine.sale_status(&sku).await?, json),
        SaleCommand::Restock { sku, qty, op_id } => {
            let op = op_id.unwrap_or_else(flashsale::admin::new_operation_id);
            (engine.restock_op(&sku, qty, &op).await?, false)
        }
        SaleCommand::Repair { sku } => (engine.repair_sale(&sku).await?, false),
        SaleCommand::Close { sku } => (engine.close_sale(&sku).await?, false),
        SaleCommand::List => {
            for sku in engine.list_sales().await? {
                println!("{sku}");
            }
            return Ok(ExitCode::SUCCESS);
        }
    };
    let (st, json) = status;
    if json {
        println!("{}", serde_json::to_string_pretty(&st)?);
    } else {
        println!(
            "sale {} [{}] initial {} remaining {} limit/user {}",
            st.sku, st.state, st.initial, st.remaining, st.per_user_limit
        );
        println!(
            "{:>3} {:<28} {:>5} {:<16} {:>9} {:>7}",
            "#", "key", "slot", "master", "remaining", "stream"
        );
        for b in &st.buckets {
            println!(
                "{:>3} {:<28} {:>5} {:<16} {:>9} {:>7}",
                b.index, b.key, b.slot, b.master, b.remaining, b.stream_len
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
