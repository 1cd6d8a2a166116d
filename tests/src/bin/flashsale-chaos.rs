//! `flashsale-chaos`: runs flashsale under random operations and faults,
//! then checks the recorded history (see `flashsale_tests::chaos`). Exit 0
//! when the run is valid, 1 when the checker found a violation, 2 when the
//! run itself could not be carried out or tested nothing it was asked to
//! (see `report::vacuous`). The hidden `engine` and `writer`
//! subcommands are the child processes a run starts from this binary.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use flashsale_tests::chaos::{self, nemesis::Fault, report, worker};

#[derive(Parser)]
#[command(
    name = "flashsale-chaos",
    about = "Random histories under faults, and a checker that proves the promise"
)]
struct Cli {
    #[command(subcommand)]
    child: Option<Child>,
    /// Seed of the workload and the fault schedule (random when absent; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// How long to run: `60s`, `10m`, or seconds.
    #[arg(long, default_value = "60s")]
    duration: String,
    /// When a purchase is confirmed: `leader` or `replicated`.
    #[arg(long, default_value = "replicated")]
    ack: String,
    /// Faults to inject, comma-separated, or `all` (or `none`):
    /// kill,pause,stall,flush,migrate,partition,engine-kill,writer-kill,pg-down,lock-pause.
    #[arg(long, default_value = "all")]
    faults: String,
    /// Engine processes.
    #[arg(long, default_value_t = 2)]
    engines: usize,
    /// Write the summary as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the history (JSONL) here.
    #[arg(long)]
    history: Option<PathBuf>,
    /// Run a deliberately broken engine (builds with the `planted-bugs`
    /// feature only): skip-request-check, skip-wait,
    /// writer-ack-before-commit, no-stock-check, cancel-returns-twice,
    /// skip-quota-check, lock-without-nx, restock-twice, expire-early,
    /// sell-after-close, release-keeps-lock, take-one-short (the list is
    /// `flashsale::planted::Plant::ALL`).
    #[arg(long)]
    plant: Option<String>,
}

#[derive(Subcommand)]
enum Child {
    /// An engine process of a run (started by the run itself).
    #[command(hide = true)]
    Engine {
        #[arg(long)]
        config: String,
        #[arg(long)]
        resource: String,
        #[arg(long)]
        plant: Option<String>,
    },
    /// The order writer process of a run (started by the run itself).
    #[command(hide = true)]
    Writer {
        #[arg(long)]
        config: String,
        #[arg(long)]
        plant: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("flashsale-chaos: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match cli.child {
        Some(Child::Engine {
            config,
            resource,
            plant,
        }) => runtime.block_on(async {
            apply_plant(plant.as_deref())?;
            worker::run_engine(parse_config(&config)?, resource).await
        }),
        Some(Child::Writer { config, plant }) => runtime.block_on(async {
            apply_plant(plant.as_deref())?;
            worker::run_writer(parse_config(&config)?).await
        }),
        None => return runtime.block_on(run(cli)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flashsale-chaos child: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> ExitCode {
    let options = match options(&cli) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("flashsale-chaos: {e}");
            return ExitCode::from(2);
        }
    };
    println!(
        "flashsale-chaos: seed {} (rerun with --seed {}), {:?}, ack {}, faults {}",
        options.seed, options.seed, options.duration, cli.ack, cli.faults
    );
    // On SIGINT or SIGTERM the run is dropped: every process, proxy and the
    // database it made go with it.
    let interrupted = async {
        let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            return std::future::pending().await;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    let outcome = tokio::select! {
        r = chaos::run(options.clone()) => r,
        () = interrupted => Err(anyhow::anyhow!("interrupted; everything it started was stopped")),
    };
    let result = match outcome {
        Ok(r) => r,
        Err(e) => {
            eprintln!(
                "flashsale-chaos: seed {}: the run failed: {e}",
                options.seed
            );
            return ExitCode::from(2);
        }
    };
    print!("{}", report::text(&result));
    if let Some(path) = &cli.json {
        let text = serde_json::to_string_pretty(&report::json(&result)).unwrap_or_default();
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("flashsale-chaos: write {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    let vacuous = report::vacuous(&result);
    if !vacuous.is_empty() {
        eprintln!(
            "flashsale-chaos: seed {}: the run tested nothing it was asked to: {}",
            result.options.seed,
            vacuous.join("; ")
        );
        return ExitCode::from(2);
    }
    if result.verdict.valid(result.options.ack) {
        ExitCode::SUCCESS
    } else {
        println!(
            "flashsale-chaos: seed {} found violations",
            result.options.seed
        );
        ExitCode::from(1)
    }
}

fn options(cli: &Cli) -> anyhow::Result<chaos::Options> {
    let ack = match cli.ack.as_str() {
        "leader" => flashsale::Ack::Leader,
        "replicated" => flashsale::Ack::Replicated,
        other => {
            return Err(anyhow::anyhow!(
                "--ack must be leader or replicated, not {other:?}"
            ))
        }
    };
    let faults = match cli.faults.as_str() {
        "all" => Fault::ALL.iter().map(|&(_, f)| f).collect(),
        "none" | "" => Vec::new(),
        list => list
            .split(',')
            .map(|n| {
                Fault::from_name(n.trim())
                    .ok_or_else(|| anyhow::anyhow!("unknown fault {n:?} in --faults"))
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    if cli.engines == 0 || cli.engines > 16 {
        return Err(anyhow::anyhow!("--engines must be 1 to 16"));
    }
    if let Some(p) = &cli.plant {
        check_plant(p)?;
    }
    let duration = parse_duration(&cli.duration)?;
    let shortest = chaos::nemesis::shortest_run(&faults);
    if !faults.is_empty() && duration < shortest {
        return Err(anyhow::anyhow!(
            "--duration {duration:?} is too short to inject each of the {} faults asked for once: give it at least {}s",
            faults.len(),
            shortest.as_secs() + 1
        ));
    }
    Ok(chaos::Options {
        seed: cli.seed.unwrap_or_else(random_seed),
        duration,
        ack,
        faults,
        engines: cli.engines,
        plant: cli.plant.clone(),
        history: cli.history.clone(),
    })
}

fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let bad = || anyhow::anyhow!("--duration: {s:?} is not like 60s, 10m or 90");
    let (num, unit) = match s.strip_suffix('s') {
        Some(n) => (n, 1),
        None => match s.strip_suffix('m') {
            Some(n) => (n, 60),
            None => (s, 1),
        },
    };
    let n: u64 = num.trim().parse().map_err(|_| bad())?;
    let secs = n.checked_mul(unit).ok_or_else(bad)?;
    if secs == 0 || secs > 24 * 3600 {
        return Err(anyhow::anyhow!("--duration must be between 1 s and 24 h"));
    }
    Ok(Duration::from_secs(secs))
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish() % 1_000_000_000
}

/// The engine config a run wrote for its children (a file path).
fn parse_config(path: &str) -> anyhow::Result<flashsale::Config> {
    let json = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("config {path}: {e}"))?;
    serde_json::from_str(&json).map_err(|e| anyhow::anyhow!("config {path}: {e}"))
}

#[cfg(feature = "planted-bugs")]
fn check_plant(name: &str) -> anyhow::Result<()> {
    flashsale::planted::Plant::from_name(name)
        .map(|_| ())
        .ok_or_else(|| {
            let names: Vec<&str> = flashsale::planted::Plant::ALL
                .iter()
                .map(|(n, _)| *n)
                .collect();
            anyhow::anyhow!("unknown planted bug {name:?}; one of {}", names.join(", "))
        })
}

#[cfg(not(feature = "planted-bugs"))]
fn check_plant(_: &str) -> anyhow::Result<()> {
    Err(anyhow::anyhow!(
        "this build has no planted bugs: build with `--features planted-bugs`"
    ))
}

fn apply_plant(name: Option<&str>) -> anyhow::Result<()> {
    let Some(name) = name else { return Ok(()) };
    check_plant(name)?;
    #[cfg(feature = "planted-bugs")]
    if let Some(p) = flashsale::planted::Plant::from_name(name) {
        flashsale::planted::plant(p);
    }
    Ok(())
}
