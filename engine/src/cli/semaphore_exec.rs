//! `flashsale semaphore exec`: runs a command while holding one permit of a
//! semaphore on the lock nodes (at most `--permits` such commands run at
//! once, across processes and hosts), with the permit's slot token in
//! `FLASHSALE_FENCING_TOKEN`. The permit's lease is renewed while the exec
//! lives; if it dies (kill -9), the permit comes back within `--lease`.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Result};
use flashsale::lock::{LockError, PermitOptions};

use super::lock_exec::{exec_client, exec_owner, parse_duration, supervise, EXIT_NOT_ACQUIRED};

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
pub async fn command(lock_nodes: &[String], cmd: SemaphoreCommand) -> Result<ExitCode> {
    match cmd {
        SemaphoreCommand::Exec(args) => run(lock_nodes, args).await,
    }
}

async fn run(lock_nodes: &[String], args: SemaphoreExecArgs) -> Result<ExitCode> {
    let client = exec_client(lock_nodes, "--lease", args.lease)?;
    let semaphore = client.semaphore(&args.name)?;
    semaphore.set_permits(args.permits).await?;
    let owner = exec_owner(args.owner.as_deref());
    let opts = PermitOptions::new(owner).wait(args.wait);
    let permit = match semaphore.acquire(1, &opts).await {
        Ok(mut p) if p.len() == 1 => p.remove(0),
        Ok(_) => return Err(anyhow!("asked for one permit, got another number")),
        Err(e @ (LockError::Timeout { .. } | LockError::NoQuorum { .. })) => {
            eprintln!("flashsale semaphore exec: {e}");
            return Ok(ExitCode::from(EXIT_NOT_ACQUIRED));
        }
        Err(e) => return Err(e.into()),
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
    supervise(permit.into_guard(), &what, &env, &args.command).await
}
