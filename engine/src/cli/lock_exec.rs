//! `flashsale lock exec`: a distributed flock(1). Runs a command while
//! holding a lock on the lock nodes, watchdog on, with the grant's fencing
//! token in `FLASHSALE_FENCING_TOKEN`.
//!
//! Every way out keeps exclusion: the command runs under a supervisor
//! ([`super::supervisor`]) that, with the exec, kills it and everything it
//! started before the lock goes back, by the exec or, when the exec itself
//! is killed with kill -9, stopped or hung, by the supervisor. SIGTERM, SIGINT
//! and SIGHUP send the group SIGTERM and give it `--grace` before SIGKILL;
//! a lost lock kills the group at once (by the time the loss is known the
//! lease is over, and the next holder may be running) and exits 79.
//! Signals are handled from the start, so an exec stopped while it waits
//! leaves the fair queue before it exits.
//!
//! This file is the command line and the taking of the lock;
//! `supervised.rs` runs the command under whatever was taken (a lock,
//! several, a semaphore's permit), and `stop_signals.rs` is the signals
//! both execs answer.

use flashsale::Certificates;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Result};
use flashsale::lock::{LockClient, LockConfig, LockError, LockOptions};

use super::stop_signals::{stopped_while_waiting, StopSignals, Waited};
use super::supervised::Supervised;
use super::supervisor::{PidNamespace, RunAs};

/// Exit code when the lock could not be taken within `--wait` (EX_TEMPFAIL).
pub const EXIT_NOT_ACQUIRED: u8 = 75;

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
    /// readers; not while a writer holds it or waits). A read-write lock is
    /// a lock of its own: it does not exclude a plain or `--fair` lock of
    /// the same name.
    #[arg(long, conflicts_with = "write")]
    pub read: bool,
    /// The write side of a read-write lock named `--name` (alone among its
    /// readers and writers; not apart from a plain or `--fair` lock of the
    /// same name, which is another lock).
    #[arg(long)]
    pub write: bool,
    /// After SIGTERM to the command (on a signal to the exec, or the lock
    /// lost), how long it may drain before its whole group is killed.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub grace: Duration,
    /// Require a PID namespace of the command's own (without this flag it
    /// gets one wherever one can be made, and runs without, saying so,
    /// where not). In one, when the command ends or the lock is lost, the
    /// kernel ends every process it started at once, however fast they
    /// fork, with no trust in what /proc says. Root needs CAP_SYS_ADMIN;
    /// any other user gets one inside a user namespace of its own that maps
    /// only its uid and gid (most Linux systems allow it). The command sees
    /// the namespace's pids (a pid file it writes names them, not the
    /// host's).
    #[arg(long, conflicts_with = "no_pid_namespace")]
    pub pid_namespace: bool,
    /// Run the command without a PID namespace: it sees the host's pids,
    /// and what it leaves is ended by a walk in /proc, which a command that
    /// attacks its own supervisor can blind (see docs/locks.md).
    #[arg(long)]
    pub no_pid_namespace: bool,
    /// Run the command as this user (a name or a uid), not root; the exec
    /// must be root (real, effective and saved uid 0) with CAP_SETUID,
    /// CAP_SETGID, CAP_SETPCAP and CAP_KILL. No process of the command's
    /// user, the command's own or an agent of that user (its tmux server,
    /// its session manager), can then stop, trace or limit the exec and
    /// its supervisor, which a process of the same user always can (see
    /// docs/locks.md). The command gets no capability, no `FLASHSALE_`
    /// variable of the exec's, and that user's `USER`, `LOGNAME`, `HOME`.
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
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

/// Shortest `--ttl` (and semaphore `--lease`) of an exec.
const MIN_EXEC_LEASE: Duration = Duration::from_millis(500);

/// Longest `--ttl` or `--wait`: a day. Longer leases are a mistake, and
/// Redis takes them in milliseconds that must not overflow.
const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// Subcommands of `flashsale lock`.
#[derive(clap::Subcommand)]
pub enum LockCommand {
    /// Run a command while holding a lock (exit 75: not acquired, 79: lost).
    Exec(LockExecArgs),
}

/// Runs one lock command.
pub async fn command(
    lock_nodes: &[String],
    certificates: &Certificates,
    cmd: LockCommand,
) -> Result<ExitCode> {
    match cmd {
        LockCommand::Exec(args) => run(lock_nodes, certificates, args).await,
    }
}

/// Runs the command under the lock.
pub async fn run(
    lock_nodes: &[String],
    certificates: &Certificates,
    args: LockExecArgs,
) -> Result<ExitCode> {
    // Before anything is taken or set: an exec that could not end its
    // command refuses with the nodes as they were.
    super::supervisor::preflight().map_err(|e| anyhow!("{e}"))?;
    let run_as = args.user.as_deref().map(RunAs::resolve).transpose()?;
    // Before the wait: a signal while waiting must leave the queue, not
    // kill the process with its entry still in it.
    let mut stops = StopSignals::install()?;
    let client = exec_client(lock_nodes, certificates, "--ttl", args.ttl)?;
    let code = run_with(&client, &mut stops, args, run_as.as_ref()).await;
    // Whatever dropped calls left to do on the nodes (leave a fair queue,
    // count out as a waiter) is done before the process exits.
    client.settle().await;
    code
}

async fn run_with(
    client: &LockClient,
    stops: &mut StopSignals,
    args: LockExecArgs,
    run_as: Option<&RunAs>,
) -> Result<ExitCode> {
    let owner = exec_owner(args.owner.as_deref());
    let mut opts = LockOptions::new(owner).wait(args.wait);
    opts.fair = args.fair;
    if (args.read || args.write) && args.name.len() > 1 {
        return Err(anyhow!(
            "--read and --write take one --name (a read-write lock is not a multi-lock)"
        ));
    }
    if let [name] = &args.name[..] {
        let taking = async {
            if args.read {
                client.read_lock(name, &opts).await
            } else if args.write {
                client.write_lock(name, &opts).await
            } else {
                client.lock(name, &opts).await
            }
        };
        let guard = match stops.unless_stopped(taking).await {
            Waited::Done(Ok(g)) => g,
            Waited::Done(Err(e)) => return not_acquired(e),
            Waited::Stopped(sig) => return Ok(stopped_while_waiting(sig)),
        };
        let env = [
            ("FLASHSALE_FENCING_TOKEN", guard.fencing_token().to_string()),
            ("FLASHSALE_LOCK_NAME", name.clone()),
        ];
        let run = Supervised {
            what: &format!("lock {name:?}"),
            env: &env,
            command: &args.command,
            grace: args.grace,
            lease: args.ttl,
            pid_namespace: PidNamespace::from_flags(args.pid_namespace, args.no_pid_namespace),
            run_as,
        };
        return run.under(guard, stops).await;
    }
    let names: Vec<&str> = args.name.iter().map(String::as_str).collect();
    let guard = match stops.unless_stopped(client.lock_all(&names, &opts)).await {
        Waited::Done(Ok(g)) => g,
        Waited::Done(Err(e)) => return not_acquired(e),
        Waited::Stopped(sig) => return Ok(stopped_while_waiting(sig)),
    };
    // One token per name, numbered in the order the names were given.
    let mut env = Vec::new();
    for (n, name) in args.name.iter().enumerate() {
        let token = guard.fencing_token(name).unwrap_or_default();
        env.push((format!("FLASHSALE_FENCING_TOKEN_{n}"), token.to_string()));
        env.push((format!("FLASHSALE_LOCK_NAME_{n}"), name.clone()));
    }
    let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let run = Supervised {
        what: &format!("locks {:?}", args.name),
        env: &env,
        command: &args.command,
        grace: args.grace,
        lease: args.ttl,
        pid_namespace: PidNamespace::from_flags(args.pid_namespace, args.no_pid_namespace),
        run_as,
    };
    run.under(guard, stops).await
}

/// The lock client of an exec whose grant the watchdog renews every
/// `lease` (named `flag` on the command line).
pub fn exec_client(
    lock_nodes: &[String],
    certificates: &Certificates,
    flag: &str,
    lease: Duration,
) -> Result<LockClient> {
    // The watchdog learns of a lost lease only when a renewal round comes
    // back, within the node timeout (100 ms): a shorter lease could end,
    // and the next holder get in, before the loss is known.
    if lease < MIN_EXEC_LEASE {
        return Err(anyhow!(
            "{flag} must be at least 500ms: a shorter lease can run out before its loss is known"
        ));
    }
    Ok(LockClient::with_certificates(
        lock_nodes,
        LockConfig {
            watchdog_ttl: lease,
            ..LockConfig::default()
        },
        certificates,
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
            say!("flashsale lock exec: {e}");
            Ok(ExitCode::from(EXIT_NOT_ACQUIRED))
        }
        e => Err(e.into()),
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
