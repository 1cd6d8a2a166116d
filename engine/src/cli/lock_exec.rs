//! `flashsale lock exec`: a distributed flock(1). Runs a command while
//! holding a lock on the lock nodes, watchdog on, with the grant's fencing
//! token in `FLASHSALE_FENCING_TOKEN`. If the lock is lost, the command gets
//! SIGTERM and the exit code says so.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Result};
use flashsale::lock::{LockClient, LockConfig, LockError, LockGuard, LockOptions, MultiGuard};

/// Exit code when the lock could not be taken within `--wait` (EX_TEMPFAIL).
pub const EXIT_NOT_ACQUIRED: u8 = 75;
/// Exit code when the lock was lost while the command ran.
pub const EXIT_LOCK_LOST: u8 = 79;

/// Arguments of `lock exec`.
#[derive(Debug, Clone, clap::Args)]
pub struct LockExecArgs {
    /// Lock name; several `--name`s make a multi-lock (all or none, taken
    /// in sorted order, one token per name).
    #[arg(long, required = true)]
    pub name: Vec<String>,
    /// Lease the watchdog keeps renewing (e.g. 500ms, 10s, 1m).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub ttl: Duration,
    /// How long to wait for the lock.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub wait: Duration,
    /// Owner name (default: host and pid).
    #[arg(long)]
    pub owner: Option<String>,
    /// A fair lock: waiters get it in arrival order, across processes.
    #[arg(long, conflicts_with_all = ["read", "write"])]
    pub fair: bool,
    /// The read side of a read-write lock named `--name` (shared with other
    /// readers; not while a writer holds it or waits).
    #[arg(long, conflicts_with = "write")]
    pub read: bool,
    /// The write side of a read-write lock named `--name` (alone).
    #[arg(long)]
    pub write: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// A `--ttl` or `--wait` that cannot be used; says what is accepted.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{given:?}: {expected}")]
pub struct BadDuration {
    given: String,
    expected: &'static str,
}

/// Parses `250ms`, `10s`, `2m` or a plain number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, BadDuration> {
    let bad = |expected| BadDuration {
        given: s.trim().to_owned(),
        expected,
    };
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| bad("expected e.g. 500ms, 10s, 2m"))?;
    let d = match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs),
        _ => return Err(bad("unit must be ms, s or m")),
    };
    match d {
        Some(d) if d <= MAX_DURATION => Ok(d),
        _ => Err(bad("at most 24h (1440m)")),
    }
}

/// Longest `--ttl` or `--wait`: a day. Longer leases are a mistake, and
/// Redis takes them in milliseconds that must not overflow.
const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// Exit code of a command that could not be run, as a shell reports it.
pub const EXIT_NOT_FOUND: u8 = 127;
/// Exit code of a command that was found but could not be executed.
pub const EXIT_NOT_EXECUTABLE: u8 = 126;

/// Subcommands of `flashsale lock`.
#[derive(clap::Subcommand)]
pub enum LockCommand {
    /// Run a command while holding a lock (exit 75: not acquired, 79: lost).
    Exec(LockExecArgs),
}

/// Runs one lock command.
pub async fn command(lock_nodes: &[String], cmd: LockCommand) -> Result<ExitCode> {
    match cmd {
        LockCommand::Exec(args) => run(lock_nodes, args).await,
    }
}

/// Runs the command under the lock.
pub async fn run(lock_nodes: &[String], args: LockExecArgs) -> Result<ExitCode> {
    let client = exec_client(lock_nodes, "--ttl", args.ttl)?;
    let owner = exec_owner(args.owner.as_deref());
    let mut opts = LockOptions::new(owner).wait(args.wait);
    opts.fair = args.fair;
    if (args.read || args.write) && args.name.len() > 1 {
        return Err(anyhow!(
            "--read and --write take one --name (a read-write lock is not a multi-lock)"
        ));
    }
    if let [name] = &args.name[..] {
        let taken = if args.read {
            client.read_lock(name, &opts).await
        } else if args.write {
            client.write_lock(name, &opts).await
        } else {
            client.lock(name, &opts).await
        };
        let guard = match taken {
            Ok(g) => g,
            Err(e) => return not_acquired(e),
        };
        let env = [
            ("FLASHSALE_FENCING_TOKEN", guard.fencing_token().to_string()),
            ("FLASHSALE_LOCK_NAME", name.clone()),
        ];
        return supervise(guard, &format!("lock {name:?}"), &env, &args.command).await;
    }
    let names: Vec<&str> = args.name.iter().map(String::as_str).collect();
    let guard = match client.lock_all(&names, &opts).await {
        Ok(g) => g,
        Err(e) => return not_acquired(e),
    };
    // One token per name, numbered in the order the names were given.
    let mut env = Vec::new();
    for (n, name) in args.name.iter().enumerate() {
        let token = guard.fencing_token(name).unwrap_or_default();
        env.push((format!("FLASHSALE_FENCING_TOKEN_{n}"), token.to_string()));
        env.push((format!("FLASHSALE_LOCK_NAME_{n}"), name.clone()));
    }
    let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    supervise(
        guard,
        &format!("locks {:?}", args.name),
        &env,
        &args.command,
    )
    .await
}

/// The lock client of an exec whose grant the watchdog renews every
/// `lease` (named `flag` on the command line).
pub fn exec_client(lock_nodes: &[String], flag: &str, lease: Duration) -> Result<LockClient> {
    if lease < Duration::from_millis(30) {
        return Err(anyhow!("{flag} must be at least 30ms"));
    }
    Ok(LockClient::new(
        lock_nodes,
        LockConfig {
            watchdog_ttl: lease,
            ..LockConfig::default()
        },
    )?)
}

/// `--owner`, or one naming this process.
pub fn exec_owner(given: Option<&str>) -> String {
    given.map_or_else(|| format!("exec-{}", std::process::id()), str::to_owned)
}

/// Exit 75 when the lock was not free within `--wait` or no majority
/// answered; any other error is the caller's.
fn not_acquired(e: LockError) -> Result<ExitCode> {
    match e {
        LockError::Timeout { .. } | LockError::NoQuorum { .. } => {
            eprintln!("flashsale lock exec: {e}");
            Ok(ExitCode::from(EXIT_NOT_ACQUIRED))
        }
        e => Err(e.into()),
    }
}

/// What `supervise` holds while the command runs: a lock, several, or a
/// semaphore's permit.
pub trait Grant {
    /// Resolves when the grant is lost.
    fn lost(&self) -> impl std::future::Future<Output = ()>;
    /// Gives it back; true when it was still held.
    fn unlock(self) -> impl std::future::Future<Output = bool>;
}

impl Grant for LockGuard {
    async fn lost(&self) {
        LockGuard::lost(self).await
    }
    async fn unlock(self) -> bool {
        LockGuard::unlock(self).await
    }
}

impl Grant for MultiGuard {
    async fn lost(&self) {
        MultiGuard::lost(self).await
    }
    async fn unlock(self) -> bool {
        MultiGuard::unlock(self).await
    }
}

/// Runs `command` with `env` while `guard` is held, and releases it however
/// the command ends. SIGTERM, SIGINT and SIGHUP are passed on as SIGTERM;
/// if the grant is lost, the command gets SIGTERM and the exit code is
/// [`EXIT_LOCK_LOST`]. `what` names the grant in messages.
pub async fn supervise(
    guard: impl Grant,
    what: &str,
    env: &[(&str, String)],
    command: &[String],
) -> Result<ExitCode> {
    let Some((program, rest)) = command.split_first() else {
        guard.unlock().await;
        return Err(anyhow!("no command given"));
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(rest)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        // Its own process group, so what it starts is signalled with it and
        // nothing of it outlives the grant.
        .process_group(0);
    // SAFETY: the closure runs in the child between fork and exec and only
    // calls prctl(2), getppid(2) and raise(3), which are async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            // If this exec dies (kill -9), the command dies with it instead
            // of running on without the grant once its lease ends.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() == 1 {
                libc::raise(libc::SIGKILL);
            }
            Ok(())
        });
    }
    let spawned = cmd.spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            // The lock is released now, not left to its TTL, and the exit
            // code is the shell's: 127 not found, 126 not executable.
            guard.unlock().await;
            eprintln!("flashsale: cannot run {program:?}: {e}");
            return Ok(ExitCode::from(match e.kind() {
                std::io::ErrorKind::NotFound => EXIT_NOT_FOUND,
                _ => EXIT_NOT_EXECUTABLE,
            }));
        }
    };
    let pid = child.id();

    // SIGTERM, SIGINT and SIGHUP all end the command the same way: it gets
    // SIGTERM, we wait for it, and the lock is released. A lock exec that
    // died on Ctrl-C or a closed terminal would leave the command running
    // without the lock, and the lock held until its TTL.
    let mut signals = Vec::new();
    for kind in [
        tokio::signal::unix::SignalKind::terminate(),
        tokio::signal::unix::SignalKind::interrupt(),
        tokio::signal::unix::SignalKind::hangup(),
    ] {
        match tokio::signal::unix::signal(kind) {
            Ok(s) => signals.push(s),
            Err(e) => {
                signal(pid, libc::SIGTERM);
                let _ = child.wait().await;
                guard.unlock().await;
                return Err(e.into());
            }
        }
    }
    let [term, int, hup] = &mut signals[..] else {
        guard.unlock().await;
        return Err(anyhow!("signal handlers"));
    };
    let outcome = tokio::select! {
        status = child.wait() => Some(status),
        _ = guard.lost() => None,
        _ = term.recv() => {
            signal(pid, libc::SIGTERM);
            Some(child.wait().await)
        }
        _ = int.recv() => {
            signal(pid, libc::SIGTERM);
            Some(child.wait().await)
        }
        _ = hup.recv() => {
            signal(pid, libc::SIGTERM);
            Some(child.wait().await)
        }
    };
    match outcome {
        Some(status) => {
            // Whatever the command left running in its group goes with it,
            // before the grant is given back. Released on every path, a
            // failed wait included.
            signal(pid, libc::SIGKILL);
            guard.unlock().await;
            Ok(ExitCode::from(exit_code(status?)))
        }
        None => {
            eprintln!("flashsale: {what} lost; sending SIGTERM to the command");
            signal(pid, libc::SIGTERM);
            if tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .is_err()
            {
                child.start_kill()?;
                child.wait().await?;
            }
            signal(pid, libc::SIGKILL);
            Ok(ExitCode::from(EXIT_LOCK_LOST))
        }
    }
}

/// Sends `sig` to the command's whole process group (its pid is the
/// group's id: it was spawned as a group leader).
fn signal(pid: Option<u32>, sig: libc::c_int) {
    if let Some(pid) = pid.and_then(|p| libc::pid_t::try_from(p).ok()) {
        // SAFETY: kill(2) with the negated id of a group we created and a
        // valid signal number has no memory-safety preconditions.
        unsafe {
            libc::kill(-pid, sig);
        }
    }
}

fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => c.clamp(0, 255) as u8,
        (None, Some(s)) => (128 + s).clamp(0, 255) as u8,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("2h").is_err());
        assert!(
            parse_duration("307445734561825861m").is_err(),
            "no wrap-around"
        );
        assert!(parse_duration("18446744073709551615ms").is_err());
        assert_eq!(parse_duration("1440m"), Ok(Duration::from_secs(86_400)));
        assert!(parse_duration("fast").is_err());
    }
}
