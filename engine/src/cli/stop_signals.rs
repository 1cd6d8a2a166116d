//! The signals an exec answers as a request to stop (SIGTERM, SIGINT,
//! SIGHUP and every other one whose default would end it), from its start.
//!
//! Why a file of its own: both execs wait on them while they take their
//! grant and while the command runs, and what a stop means at each point
//! is theirs; which signals are stops is this file's.

use std::process::ExitCode;

use anyhow::Result;

/// The exit code of an exec stopped by signal `sig` before it held the
/// grant: the shell's 128 + the signal, and the command never ran.
pub fn stopped_while_waiting(sig: libc::c_int) -> ExitCode {
    say!("flashsale: stopped by signal {sig} while waiting; the command did not run");
    ExitCode::from(u8::try_from(128 + sig).unwrap_or(1))
}

/// The signals whose default action would end the exec without cleaning
/// up (SIGTERM, SIGINT, SIGHUP, and SIGQUIT from Ctrl-\, SIGUSR1, SIGUSR2,
/// SIGALRM, which the third attack sent), handled from the exec's start:
/// each stops it the same way (while waiting: give up the wait and leave the
/// queue; while the command runs: SIGTERM to the command, then SIGKILL after
/// the grace).
pub struct StopSignals {
    handlers: Vec<(libc::c_int, tokio::signal::unix::Signal)>,
}

/// What a wait that a signal may cut short gave.
pub enum Waited<T> {
    /// It ended on its own.
    Done(T),
    /// Signal number: stopped first (the wait was dropped).
    Stopped(libc::c_int),
}

impl StopSignals {
    /// Installs the handlers.
    pub fn install() -> Result<StopSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut handlers = Vec::new();
        // Every signal whose default ends the process and that a process
        // is sent, not one a fault raises (SEGV, BUS, ILL, FPE, TRAP, SYS
        // end it as a kill -9 does: the supervisor ends the command, the grant
        // lapses with its lease), nor SIGKILL, which cannot be caught.
        let mut stops = vec![
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGUSR1,
            libc::SIGUSR2,
            libc::SIGALRM,
            libc::SIGPWR,
            libc::SIGVTALRM,
            libc::SIGPROF,
            libc::SIGXCPU,
            libc::SIGXFSZ,
            libc::SIGIO,
            libc::SIGSTKFLT,
            // Sent, not raised by a fault: systemd's watchdog timeout and
            // TimeoutStopFailureMode=abort (the seventeenth attack). An
            // abort() of this process still ends it: abort re-raises with
            // the default once a handler returns.
            libc::SIGABRT,
        ];
        stops.extend(libc::SIGRTMIN()..=libc::SIGRTMAX());
        for sig in stops {
            handlers.push((sig, signal(SignalKind::from_raw(sig))?));
        }
        Ok(StopSignals { handlers })
    }

    /// The next stop signal's number.
    pub async fn recv(&mut self) -> libc::c_int {
        let waits = self.handlers.iter_mut().map(|(sig, h)| {
            let sig = *sig;
            Box::pin(async move {
                h.recv().await;
                sig
            })
        });
        futures_util::future::select_all(waits).await.0
    }

    /// Runs `wait` unless a stop signal comes first.
    pub async fn unless_stopped<T>(
        &mut self,
        wait: impl std::future::Future<Output = T>,
    ) -> Waited<T> {
        tokio::select! {
            done = wait => Waited::Done(done),
            sig = self.recv() => Waited::Stopped(sig),
        }
    }
}
