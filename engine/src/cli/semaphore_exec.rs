//! `flashsale semaphore exec`: runs a command while holding one permit of a
//! semaphore on the lock nodes (at most `--permits` such commands run at
//! once, across processes and hosts), with the permit's slot token in
//! `FLASHSALE_FENCING_TOKEN`. The permit's lease is renewed while the exec
//! lives; if it dies (kill -9), the permit comes back within `--lease`, and
//! the command's group is killed by its reaper at once. Every exit path is
//! `lock exec`'s (see there): the same signals, grace, and exit codes.

use flashsale::Certificates;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use flashsale::lock::{LockClient, LockError, PermitOptions, Semaphore};

use super::lock_exec::{exec_client, exec_owner, parse_duration, EXIT_NOT_ACQUIRED};
use super::stop_signals::{stopped_while_waiting, StopSignals, Waited};
use super::supervised::Supervised;
use super::supervisor::{PidNamespace, RunAs};

/// Arguments of `semaphore exec`.
#[derive(Debug, Clone, clap::Args)]
pub struct SemaphoreExecArgs {
    /// Semaphore name.
    #[arg(long)]
    pub name: String,
    /// Total permits of the semaphore (1-1000), set before taking one: the
    /// latest setting wins, so every exec of one name should agree.
    #[arg(long)]
    pub permits: u32,
    /// Lease of the permit, renewed while the command runs (e.g. 2s): a
    /// crashed exec's permit comes back within it.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub lease: Duration,
    /// How long to wait for a permit.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub wait: Duration,
    /// Owner name (default: exec and pid).
    #[arg(long)]
    pub owner: Option<String>,
    /// After SIGTERM to the command (on a signal to the exec, or the permit
    /// lost), how long it may drain before its whole group is killed.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub grace: Duration,
    /// Require a PID namespace of the command's own (see `lock exec
    /// --pid-namespace`; without either flag, one where one can be made).
    #[arg(long, conflicts_with = "no_pid_namespace")]
    pub pid_namespace: bool,
    /// Run the command without a PID namespace (see `lock exec
    /// --no-pid-namespace`).
    #[arg(long)]
    pub no_pid_namespace: bool,
    /// Run the command as this user, not root, from a root exec (see
    /// `lock exec --user`).
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// Subcommands of `flashsale semaphore`.
#[derive(clap::Subcommand)]
pub enum SemaphoreCommand {
    /// Run a command while holding a permit (exit 75: none free within
    /// --wait, 79: the permit was lost).
    Exec(SemaphoreExecArgs),
}

/// Runs one semaphore command.
pub async fn command(
    lock_nodes: &[String],
    certificates: &Certificates,
    cmd: SemaphoreCommand,
) -> Result<ExitCode> {
    match cmd {
        SemaphoreCommand::Exec(args) => run(lock_nodes, certificates, args).await,
    }
}

async fn run(
    lock_nodes: &[String],
    certificates: &Certificates,
    args: SemaphoreExecArgs,
) -> Result<ExitCode> {
    // Before anything is taken or set: an exec that could not end its
    // command refuses with the nodes as they were.
    super::supervisor::preflight().map_err(|e| anyhow!("{e}"))?;
    let run_as = args.user.as_deref().map(RunAs::resolve).transpose()?;
    let mut stops = StopSignals::install()?;
    let client = exec_client(lock_nodes, certificates, "--lease", args.lease)?;
    let code = run_with(&client, &mut stops, args, run_as.as_ref()).await;
    client.settle().await;
    code
}

async fn run_with(
    client: &LockClient,
    stops: &mut StopSignals,
    args: SemaphoreExecArgs,
    run_as: Option<&RunAs>,
) -> Result<ExitCode> {
    let semaphore = client.semaphore(&args.name)?;
    let owner = exec_owner(args.owner.as_deref());
    let opts = PermitOptions::new(owner).wait(args.wait);
    // Every check before the first write: the total is everyone's.
    semaphore.check(1, &opts)?;
    let started = Instant::now();
    let taking = async {
        set_permits_within(&semaphore, args.permits, started, args.wait).await?;
        let left = args.wait.saturating_sub(started.elapsed());
        semaphore.acquire(1, &opts.clone().wait(left)).await
    };
    let permit = match stops.unless_stopped(taking).await {
        Waited::Done(Ok(mut p)) if p.len() == 1 => p.remove(0),
        Waited::Done(Ok(_)) => return Err(anyhow!("asked for one permit, got another number")),
        Waited::Done(Err(e @ (LockError::Timeout { .. } | LockError::NoQuorum { .. }))) => {
            say!("flashsale semaphore exec: {e}");
            return Ok(ExitCode::from(EXIT_NOT_ACQUIRED));
        }
        Waited::Done(Err(e)) => return Err(e.into()),
        Waited::Stopped(sig) => return Ok(stopped_while_waiting(sig)),
    };
    let env = [
        (
            "FLASHSALE_FENCING_TOKEN",
            permit.fencing_token().to_string(),
        ),
        ("FLASHSALE_PERMIT_ID", permit.id().to_owned()),
        ("FLASHSALE_PERMIT_SLOT", permit.slot().to_string()),
        ("FLASHSALE_SEMAPHORE_NAME", args.name.clone()),
    ];
    let what = format!("permit {} of semaphore {:?}", permit.slot(), args.name);
    let run = Supervised {
        what: &what,
        env: &env,
        command: &args.command,
        grace: args.grace,
        lease: args.lease,
        pid_namespace: PidNamespace::from_flags(args.pid_namespace, args.no_pid_namespace),
        run_as,
    };
    run.under(permit.into_guard(), stops).await
}

/// Sets the total, asking again while no majority answers and the wait
/// (from `started`) lasts, as a lock's wait does.
async fn set_permits_within(
    semaphore: &Semaphore,
    permits: u32,
    started: Instant,
    wait: Duration,
) -> Result<(), LockError> {
    loop {
        match semaphore.set_permits(permits).await {
            Err(LockError::NoQuorum { .. }) if started.elapsed() < wait => {
                let pause = Duration::from_millis(200).min(wait.saturating_sub(started.elapsed()));
                tokio::time::sleep(pause).await;
            }
            done => return done,
        }
    }
}
