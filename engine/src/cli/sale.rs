//! `flashsale sale ...`: create, inspect, restock, repair, close and list
//! sales, and print what the cluster holds afterwards.

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::Result;
use clap::Subcommand;
use flashsale::{Engine, SaleSpec, SaleStatus, Settings};

#[derive(Subcommand)]
pub enum SaleCommand {
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
        /// Hold each order this many ms for payment (0 = paid when
        /// confirmed); unpaid holds expire and their units go back on sale.
        #[arg(long, default_value_t = 0)]
        hold_ms: u64,
        /// What a payment after its hold ended gets: refuse, or retake a
        /// unit if one is left.
        #[arg(long, value_enum, default_value = "refuse")]
        late_payment: LatePaymentArg,
        /// Operation id: run the same command again with the same id (after
        /// a timeout, say) and it finishes the first create instead of
        /// failing with "already exists". Default: a fresh one.
        #[arg(long)]
        op_id: Option<String>,
        /// Put a waiting room in front of the sale (needs
        /// --per-user-limit >= 1); the --queue-* flags set it.
        #[arg(long)]
        queue: bool,
        /// Admissions per second, or "auto" (as fast as places free up).
        #[arg(long, default_value = "auto", requires = "queue")]
        queue_rate: String,
        /// How long an admitted user may buy, ms.
        #[arg(long, default_value_t = 120_000, requires = "queue")]
        queue_window_ms: u64,
        /// fifo, or shuffle-at-start (everyone who joined before the start
        /// gets a random place).
        #[arg(long, value_enum, default_value = "fifo", requires = "queue")]
        queue_order: QueueOrderArg,
        /// Admitted and not yet done never exceed this x (remaining + held).
        #[arg(long, default_value_t = 1.0, requires = "queue")]
        queue_overbook: f64,
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

/// Runs one sale command.
pub async fn run(settings: Settings, cmd: SaleCommand) -> Result<ExitCode> {
    let engine = Engine::connect(settings.engine).await?;
    let status = match cmd {
        SaleCommand::Create {
            sku,
            stock,
            buckets,
            per_user_limit,
            starts_in,
            ends_in,
            hold_ms,
            late_payment,
            op_id,
            queue,
            queue_rate,
            queue_window_ms,
            queue_order,
            queue_overbook,
            json,
        } => {
            let queue = if queue {
                let rate = if queue_rate == "auto" {
                    flashsale::QueueRate::Auto
                } else {
                    flashsale::QueueRate::PerSecond(queue_rate.parse().map_err(|_| {
                        anyhow::anyhow!("--queue-rate: a number or \"auto\", got {queue_rate:?}")
                    })?)
                };
                Some(flashsale::QueueSpec {
                    rate,
                    window_ms: queue_window_ms,
                    order: match queue_order {
                        QueueOrderArg::Fifo => flashsale::QueueOrder::Fifo,
                        QueueOrderArg::ShuffleAtStart => flashsale::QueueOrder::ShuffleAtStart,
                    },
                    overbook: queue_overbook,
                })
            } else {
                None
            };
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
                hold_ms,
                late_payment: match late_payment {
                    LatePaymentArg::Refuse => flashsale::LatePayment::Refuse,
                    LatePaymentArg::Retake => flashsale::LatePayment::Retake,
                },
                queue,
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
    print(&st, json)?;
    Ok(ExitCode::SUCCESS)
}

/// Prints a sale's status: JSON, or a table of its buckets.
fn print(st: &SaleStatus, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(st)?);
    } else {
        println!(
            "sale {} [{}] initial {} remaining {} limit/user {}",
            st.sku, st.state, st.initial, st.remaining, st.per_user_limit
        );
        println!(
            "{:>3} {:<28} {:>5} {:<16} {:<6} {:>9} {:>7}",
            "#", "key", "slot", "master", "state", "remaining", "stream"
        );
        for b in &st.buckets {
            println!(
                "{:>3} {:<28} {:>5} {:<16} {:<6} {:>9} {:>7}",
                b.index, b.key, b.slot, b.master, b.state, b.remaining, b.stream_len
            );
        }
    }
    Ok(())
}

/// `--late-payment`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LatePaymentArg {
    /// Refuse it: the unit went back on sale.
    Refuse,
    /// Take a unit again if one is left.
    Retake,
}

/// `--queue-order`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum QueueOrderArg {
    /// Arrival order.
    Fifo,
    /// A random place for everyone who joined before the start.
    ShuffleAtStart,
}
