//! A command run under a grant (a lock, several locks, a semaphore's
//! permit): started through its supervisor, watched while the grant
//! lives, ended whole before the grant goes back, and its exit code.
//!
//! Why a file of its own: `lock exec` and `semaphore exec` take different
//! grants and share everything after, which is most of the exit paths the
//! docs' table lists; neither exec's arguments belong here.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Result};
use flashsale::lock::{LockGuard, MultiGuard};

use super::stop_signals::StopSignals;
use super::supervisor::{Ended, PidNamespace, Report, RunAs, StoppedMember, Supervisor};

/// Exit code when the grant was lost while the command ran.
pub const EXIT_LOCK_LOST: u8 = 79;
/// Exit code of a command that could not be run, as a shell reports it.
pub const EXIT_NOT_FOUND: u8 = 127;
/// Exit code of a command that was found but could not be executed.
pub const EXIT_NOT_EXECUTABLE: u8 = 126;

/// What `supervise` holds while the command runs: a lock, several, or a
/// semaphore's permit.
pub trait Grant {
    /// Resolves when the grant is lost.
    fn lost(&self) -> impl std::future::Future<Output = ()>;
    /// How much longer the grant is valid by its client's clock.
    fn valid_for(&self) -> Duration;
    /// Whether the grant is known lost (or its validity ran out).
    fn is_lost(&self) -> bool;
    /// Gives it back; true when it was still held.
    fn unlock(self) -> impl std::future::Future<Output = bool>;
    /// Leaves it to lapse with its lease: never released (a guard dropped
    /// releases), and no longer renewed once this process exits, which
    /// the exec does at once. For when the command's processes cannot be
    /// known gone.
    fn abandon(self)
    where
        Self: Sized,
    {
        std::mem::forget(self);
    }
}

impl Grant for LockGuard {
    async fn lost(&self) {
        LockGuard::lost(self).await
    }
    fn valid_for(&self) -> Duration {
        LockGuard::valid_for(self)
    }
    fn is_lost(&self) -> bool {
        LockGuard::is_lost(self)
    }
    async fn unlock(self) -> bool {
        LockGuard::unlock(self).await
    }
}

impl Grant for MultiGuard {
    async fn lost(&self) {
        MultiGuard::lost(self).await
    }
    fn valid_for(&self) -> Duration {
        MultiGuard::valid_for(self)
    }
    fn is_lost(&self) -> bool {
        MultiGuard::is_lost(self)
    }
    async fn unlock(self) -> bool {
        MultiGuard::unlock(self).await
    }
}

/// A command to run under a grant: what the grant is called in messages,
/// the command's extra environment, and its grace after SIGTERM.
pub struct Supervised<'a> {
    /// Names the grant in messages (`lock "L1"`).
    pub what: &'a str,
    /// Extra environment of the command (the fencing token, the names).
    pub env: &'a [(&'a str, String)],
    /// The command and its arguments.
    pub command: &'a [String],
    /// How long the command may drain after SIGTERM before SIGKILL.
    pub grace: Duration,
    /// The grant's lease: the supervisor kills the command when the exec has
    /// been silent for 2/5 of it.
    pub lease: Duration,
    /// Run the command in a PID namespace of its own (`--pid-namespace`).
    pub pid_namespace: PidNamespace,
    /// Run the command as this user (`--user`), checked before the grant
    /// was asked for.
    pub run_as: Option<&'a RunAs>,
}

impl Supervised<'_> {
    /// Runs the command while `guard` is held and releases the grant
    /// however it ends; everything the command started is gone before the
    /// release. Exit code: the command's, [`EXIT_LOCK_LOST`] once the grant
    /// was lost (or the exec was silent past its supervisor's patience),
    /// 126/127 when it could not run, 128 + the signal that ended it
    /// otherwise.
    pub async fn under(&self, guard: impl Grant, stops: &mut StopSignals) -> Result<ExitCode> {
        if self.command.is_empty() {
            guard.unlock().await;
            return Err(anyhow!("no command given"));
        }
        let mut supervisor = match Supervisor::start(
            self.lease,
            self.command,
            self.env,
            self.pid_namespace,
            self.run_as,
        ) {
            Ok(s) => s,
            Err(e) => {
                // Stopped or starved while handing the command over: the
                // lease may have lapsed, and the command never ran.
                if guard.is_lost() || !may_beat(guard.valid_for(), self.lease * 2 / 5) {
                    say!(
                        "flashsale: {} ran low before the command could start ({e}); it did not run",
                        self.what
                    );
                    return Ok(ExitCode::from(EXIT_LOCK_LOST));
                }
                guard.unlock().await;
                return Err(anyhow!("cannot start the command's supervisor: {e}"));
            }
        };
        let ending = self.watch(&mut supervisor, &guard, stops).await;
        // An exec that was stopped or starved past 2/5 of its lease renewed
        // nothing meanwhile, and its supervisor may have killed the
        // command: the command cannot be known to have run under the lock.
        let lapsed = supervisor.lapsed();
        // Whatever the command left running goes with it, before the grant
        // is given back.
        match supervisor.end() {
            Ended::Clean => {}
            Ended::ForkedFaster => {
                say!(
                    "flashsale: the command's processes forked faster than they could be killed; \
                     {} is left to lapse with its lease",
                    self.what
                );
                guard.abandon();
                return Ok(ExitCode::from(EXIT_LOCK_LOST));
            }
            Ended::Blind(why) => {
                say!(
                    "flashsale: the command's processes cannot be known ended ({why}); {} is left \
                     to lapse with its lease, not given back",
                    self.what
                );
                guard.abandon();
                return Ok(ExitCode::from(EXIT_LOCK_LOST));
            }
            Ended::Doubtful => {
                // Killed (or given up) before it had killed everything, with
                // no subreaper above it: the command's other processes went
                // to init. Those that carry the exec's mark are gone; one
                // that hid it (rewrote its environment's memory, or cannot
                // be read) cannot be known gone.
                say!(
                    "flashsale: the command's supervisor was killed before it had ended everything, and \
                     this exec is no subreaper (its process had children when it started), so the rest \
                     went to init; those that carried the exec's mark were killed, but {} is left to \
                     lapse with its lease (--pid-namespace leaves no such doubt)",
                    self.what
                );
                guard.abandon();
                return Ok(ExitCode::from(signal_code(libc::SIGKILL)));
            }
        }
        if ending == Ending::Silenced {
            say!(
                "flashsale: this exec was stopped or starved past 2/5 of its lease (its supervisor's patience); the supervisor ended the command, and {} may have lapsed",
                self.what
            );
            return Ok(ExitCode::from(EXIT_LOCK_LOST));
        }
        if ending == Ending::NeverStarted {
            say!(
                "flashsale: {} ran low before the command could start (this exec was stopped or starved); it did not run",
                self.what
            );
            return Ok(ExitCode::from(EXIT_LOCK_LOST));
        }
        if ending == Ending::Lost || lapsed {
            if lapsed && ending != Ending::Lost {
                say!(
                    "flashsale: this exec was stopped or starved past 2/5 of its lease (its supervisor's patience); {} may have lapsed",
                    self.what
                );
            }
            return Ok(ExitCode::from(EXIT_LOCK_LOST));
        }
        if !guard.unlock().await {
            // Not confirmed released: gone already, or a majority did not
            // answer (then it lapses with its lease). The watchdog saw no
            // loss while the command ran, so its exit code stands.
            say!(
                "flashsale: the release of {} was not confirmed (it lapses with its lease)",
                self.what
            );
        }
        Ok(ExitCode::from(match ending {
            Ending::Exited(status) => exit_code(status),
            Ending::TerminalStop(sig) | Ending::StoppedBeforeStart(sig) => signal_code(sig),
            Ending::GraceOver | Ending::SupervisorGone => signal_code(libc::SIGKILL),
            Ending::Lost | Ending::NeverStarted | Ending::Silenced => EXIT_LOCK_LOST,
            Ending::NoNamespace(errno) => {
                let e = std::io::Error::from_raw_os_error(errno);
                say!(
                    "flashsale: cannot make the command's PID namespace ({e}); it needs CAP_SYS_ADMIN, or (for a user other than root) user namespaces this user may make (see `sysctl user.max_user_namespaces`), and a kernel that makes the namespace it says it made. The command did not run (--no-pid-namespace runs it without one)"
                );
                EXIT_NOT_EXECUTABLE
            }
            Ending::NotStarted(errno) => {
                // The shell's codes: 127 not found, 126 not executable.
                let e = std::io::Error::from_raw_os_error(errno);
                say!("flashsale: cannot run {:?}: {e}", self.command[0]);
                match e.kind() {
                    std::io::ErrorKind::NotFound => EXIT_NOT_FOUND,
                    _ => EXIT_NOT_EXECUTABLE,
                }
            }
        }))
    }

    /// Waits for the command's start and end, telling the supervisor the
    /// exec lives (the first beat is the word to start the command, given
    /// only while the grant outlasts the supervisor's patience). A stop
    /// signal sends the command SIGTERM and starts the grace, after
    /// which it is killed; the grant's loss ends it at once; a command
    /// stopped for the terminal (SIGTTIN, SIGTTOU) is ended with a clear
    /// error; a supervisor killed on its own ends it too.
    async fn watch(
        &self,
        supervisor: &mut Supervisor,
        guard: &impl Grant,
        stops: &mut StopSignals,
    ) -> Ending {
        let mut kill_at: Option<tokio::time::Instant> = None;
        let mut heartbeat = tokio::time::interval(supervisor.heartbeat_every());
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // How often the command's processes are looked through (a /proc
        // scan) for one stopped, ended once seen stopped for STOPPED_FOR
        // (a command that pauses its own worker for a moment is let be).
        // Soon after the start, then once a second.
        let mut members = tokio::time::interval_at(
            tokio::time::Instant::now() + Duration::from_millis(50),
            Duration::from_secs(1),
        );
        members.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut suspect: Option<(StoppedMember, tokio::time::Instant)> = None;
        let mut started = false;
        // A stop signal came after the word to start, before the start was
        // told: SIGTERM goes to the command once it is.
        let mut term_when_started = false;
        loop {
            let grace_over = async {
                match kill_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                report = supervisor.report() => match report {
                    Some(Report::Started(_)) => {
                        started = true;
                        if term_when_started {
                            supervisor.signal_command(libc::SIGTERM);
                        }
                    }
                    Some(Report::NotStarted(errno)) => return Ending::NotStarted(errno),
                    Some(Report::NoNamespace(errno)) => return Ending::NoNamespace(errno),
                    Some(Report::Walked(errno)) => {
                        say!(
                            "flashsale: no PID namespace can be made here ({}); the command runs \
                             without one, and what it leaves is ended by a walk in /proc, which \
                             a command that attacks its own supervisor can blind (docs/locks.md; \
                             --pid-namespace refuses to run instead, --no-pid-namespace asks for \
                             the walk and says nothing)",
                            std::io::Error::from_raw_os_error(errno)
                        );
                    }
                    Some(Report::Exited(status)) => return Ending::Exited(status),
                    Some(Report::Stopped(sig @ (libc::SIGTTIN | libc::SIGTTOU))) => {
                        say!(
                            "flashsale: the command stopped to use the terminal; it runs in a \
                             process group of its own, which the terminal does not serve: give it \
                             its input from a file or a pipe. Ending it."
                        );
                        return Ending::TerminalStop(sig);
                    }
                    Some(Report::Stopped(_)) => {}
                    // Gone: killed on its own, or ended by itself (the word
                    // to start never came in time, or the exec went silent
                    // past its patience and it ended the command).
                    None => {
                        let killed = supervisor.was_killed();
                        return match (killed, started, supervisor.went()) {
                            (true, false, false) => {
                                say!(
                                    "flashsale: the command's supervisor was killed before the command started; it did not run"
                                );
                                Ending::SupervisorGone
                            }
                            (true, _, _) => {
                                say!(
                                    "flashsale: the command's supervisor was killed; ending the command \
                                     and everything it started"
                                );
                                Ending::SupervisorGone
                            }
                            (false, false, _) => Ending::NeverStarted,
                            (false, true, _) => Ending::Silenced,
                        };
                    }
                },
                _ = heartbeat.tick() => {
                    // Only while the lease outlasts the supervisor's
                    // patience: a beat now lets the command run until now +
                    // patience, which must end before the lease can
                    // (renewals that fall behind, on a slow node, stop the
                    // beats and the supervisor ends the command in time).
                    if may_beat(guard.valid_for(), supervisor.patience()) {
                        supervisor.beat();
                    }
                }
                _ = members.tick() => {
                    let found = supervisor.scan();
                    let long_stopped = found.as_ref().filter(|m| {
                        suspect.as_ref().is_some_and(|(s, since)| {
                            s == *m && since.elapsed() >= STOPPED_FOR
                        })
                    });
                    if let Some(member) = long_stopped {
                        say!(
                            "flashsale: {} (pid {}) in the command's group is stopped, most likely \
                             to use the terminal, which does not serve the group: give the command \
                             its input from a file or a pipe. Ending it.",
                            member.name, member.pid
                        );
                        return Ending::TerminalStop(libc::SIGTTIN);
                    }
                    suspect = match (suspect.take(), found) {
                        (Some((s, since)), Some(f)) if s == f => Some((s, since)),
                        (_, Some(f)) => Some((f, tokio::time::Instant::now())),
                        (_, None) => None,
                    };
                }
                _ = guard.lost() => {
                    say!("flashsale: {} lost; killing the command", self.what);
                    return Ending::Lost;
                }
                sig = stops.recv() => {
                    if !supervisor.went() {
                        // As while waiting: the word to start was never
                        // given, so the command never ran.
                        say!(
                            "flashsale: stopped by signal {sig} before the command started; it did not run"
                        );
                        return Ending::StoppedBeforeStart(sig);
                    }
                    // Given: the command runs or is starting; it gets
                    // SIGTERM now, or as soon as its start is told.
                    if started {
                        supervisor.signal_command(libc::SIGTERM);
                    } else {
                        term_when_started = true;
                    }
                    kill_at.get_or_insert(tokio::time::Instant::now() + self.grace);
                }
                _ = grace_over => {
                    say!("flashsale: the command outlived its grace; killing it");
                    return Ending::GraceOver;
                }
            }
        }
    }
}

/// How the command's run under the grant ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Its first process ended with this wait status.
    Exited(libc::c_int),
    /// The grant was lost.
    Lost,
    /// It stopped to use the terminal (the signal that stopped it).
    TerminalStop(libc::c_int),
    /// It outlived its grace after a stop signal.
    GraceOver,
    /// Its supervisor was killed on its own.
    SupervisorGone,
    /// It could not be started (the errno).
    NotStarted(i32),
    /// Its supervisor ended before it started it: the word to start never
    /// came within the supervisor's patience.
    NeverStarted,
    /// A stop signal came before it started (the signal).
    StoppedBeforeStart(libc::c_int),
    /// `--pid-namespace` was asked for and none could be made (the errno).
    NoNamespace(i32),
    /// Its supervisor ended it on its own: this exec was silent past the
    /// supervisor's patience (stopped or starved).
    Silenced,
}

/// How long a process of the command's group may stay stopped while the
/// terminal serves another group before the command is ended: a read of
/// the terminal waits for ever, a command pausing its own worker does not.
const STOPPED_FOR: Duration = Duration::from_secs(5);

/// Whether the exec may tell its supervisor it lives: only while the grant's
/// lease outlasts the supervisor's patience by a margin (a fifth of it, for the
/// supervisor's own wake-up and kill), so the supervisor, counting from this beat,
/// ends the command before the lease can end.
fn may_beat(valid_for: Duration, patience: Duration) -> bool {
    valid_for > patience + patience / 5
}

/// The shell's exit code for a wait status: the code, or 128 + the signal.
fn exit_code(status: libc::c_int) -> u8 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status).clamp(0, 255) as u8
    } else if libc::WIFSIGNALED(status) {
        signal_code(libc::WTERMSIG(status))
    } else {
        1
    }
}

/// The shell's exit code for a process ended by `sig`.
fn signal_code(sig: libc::c_int) -> u8 {
    u8::try_from(128 + sig).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// From the fourth attack: beats were not tied to the lease, so with
    /// renewals slowed by a node that does not answer, a stopped exec's
    /// reaper fired after the lease had ended and the next holder was in.
    #[test]
    fn a_beat_never_lets_the_reaper_outlast_the_lease() {
        let patience = Duration::from_millis(250);
        assert!(may_beat(Duration::from_millis(490), patience));
        assert!(!may_beat(Duration::from_millis(300), patience));
        assert!(!may_beat(Duration::from_millis(250), patience));
        assert!(!may_beat(Duration::ZERO, patience));
        for ms in 0..2_000u64 {
            let valid = Duration::from_millis(ms);
            if may_beat(valid, patience) {
                assert!(patience < valid, "a beat at {ms} ms of lease left");
            }
        }
    }
}
