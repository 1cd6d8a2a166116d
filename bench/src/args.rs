//! The command line of `flashsale-bench`: its own file so that the run
//! driver reads its settings without importing the binary's entry point.

use std::path::PathBuf;

use clap::Parser;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "flashsale-bench",
    about = "flashsale against redis-benchmark, the lock-based way, and rslock"
)]
pub struct Args {
    /// The same TOML config file as `flashsale` (its cluster and lock nodes
    /// are the ones measured); `FLASHSALE_*` variables override it.
    #[arg(long, env = "FLASHSALE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Operations per strategy run (engine, anchor, naive).
    #[arg(long, default_value_t = 50_000)]
    pub ops: u64,
    /// Requests in flight at once (redis-benchmark clients for the anchor).
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Buckets of the hot SKU in the `hotB` scenario.
    #[arg(long, default_value_t = 3)]
    pub buckets: u32,
    /// SKUs in the `many` scenario.
    #[arg(long, default_value_t = 12)]
    pub skus: usize,
    /// Operations of the `lock` strategy (it is slow by design).
    #[arg(long, default_value_t = 10_000)]
    pub lock_ops: u64,
    /// Acquire+release pairs per lock benchmark run.
    #[arg(long, default_value_t = 2_000)]
    pub lock_pairs: u64,
    /// Tasks competing in the contended lock runs.
    #[arg(long, default_value_t = 8)]
    pub lock_tasks: usize,
    /// Time cap of any one run, seconds.
    #[arg(long, default_value_t = 60)]
    pub cap_seconds: u64,
    /// How long each paced row (engine@80%, @10%) sends, seconds: its
    /// operations are its rate times this, not capped by `--ops` (at 80 %
    /// of peak that cap made a window of about 0.75 s).
    #[arg(long, default_value_t = 10.0)]
    pub paced_seconds: f64,
    /// How long the `http` row's wrk sends, seconds.
    #[arg(long, default_value_t = 15.0)]
    pub http_seconds: f64,
    /// Scenarios to run (comma-separated: hot1,hotB,many,door,http,refused,engine; `engine` is hot1's engine row and its 10 % paced row alone; `none` for the lock benchmark only).
    #[arg(
        long,
        default_value = "hot1,hotB,many,door,http",
        value_delimiter = ','
    )]
    pub scenarios: Vec<String>,
    /// Window of each cross-process lock run, seconds.
    #[arg(long, default_value_t = 10)]
    pub lock_window_seconds: u64,
    /// Internal: run as one process of the cross-process lock scenario.
    #[arg(long, hide = true)]
    pub lock_child: Option<String>,
    /// Run one scenario of 16 workers on one client alone and print its
    /// pairs and longest wait (`implementation|U or C|window_ms|url,url...`;
    /// for A/B runs and profiling).
    #[arg(long, hide = true)]
    pub lock_shared: Option<String>,
    /// Internal (bench/cost): make N purchases on a fresh sale, each by a
    /// new buyer, `--concurrency` in flight, and exit.
    #[arg(long, hide = true)]
    pub cost_purchases: Option<u64>,
    /// Skip the lock benchmark.
    #[arg(long)]
    pub no_lock_bench: bool,
    /// Write every figure as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the plot as SVG here.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Write results.json, summary.md and plot.svg into this folder.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
    /// Run everything this many times and report, per row, the run with the
    /// median throughput (a shared machine is noisy).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
}
