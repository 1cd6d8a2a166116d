//! The controller's side of the child processes: starting an engine or
//! writer process from this same binary, sending it calls, and the two
//! things the nemesis does to processes (kill -9 and restart, SIGSTOP and
//! SIGCONT). A call to a process that dies or freezes ends as `unknown`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::oneshot;

use super::protocol::{Call, Op, Outcome, Reply};

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Outcome>>>>;

/// How to start one child: the arguments after the binary's path.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    /// `engine ...` or `writer ...`.
    pub args: Vec<String>,
    /// Where its stderr goes.
    pub log: PathBuf,
}

struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
    pending: Pending,
}

/// One child process, restarted by the nemesis after a kill.
pub struct ChildProc {
    spec: ChildSpec,
    running: tokio::sync::Mutex<Running>,
    /// The current process's pid, readable without the lock: a call blocked
    /// writing to a frozen child holds the lock, and SIGCONT must not wait
    /// behind it.
    pid: AtomicU32,
    /// Lock operations in flight on it (what lock-pause aims at).
    pub locks_in_flight: AtomicUsize,
}

impl ChildProc {
    /// Starts the child.
    pub async fn start(spec: ChildSpec) -> std::io::Result<ChildProc> {
        let running = launch(&spec)?;
        Ok(ChildProc {
            pid: AtomicU32::new(running.child.id().unwrap_or(0)),
            spec,
            running: tokio::sync::Mutex::new(running),
            locks_in_flight: AtomicUsize::new(0),
        })
    }

    /// Sends `op` and waits for its outcome, at most `timeout`.
    pub async fn call(&self, id: u64, op: &Op, timeout: Duration) -> Outcome {
        let is_lock = matches!(op, Op::Lock { .. });
        if is_lock {
            self.locks_in_flight.fetch_add(1, Ordering::SeqCst);
        }
        let outcome = self.call_inner(id, op, timeout).await;
        if is_lock {
            self.locks_in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        outcome
    }

    async fn call_inner(&self, id: u64, op: &Op, timeout: Duration) -> Outcome {
        let (tx, rx) = oneshot::channel();
        let pending = {
            let call = async {
                let mut r = self.running.lock().await;
                let pending = r.pending.clone();
                if let Ok(mut p) = pending.lock() {
                    p.insert(id, tx);
                }
                let Ok(mut line) = serde_json::to_vec(&Call { id, op: op.clone() }) else {
                    return Err((pending, "could not encode the call".to_owned()));
                };
                line.push(b'\n');
                let Some(stdin) = r.stdin.as_mut() else {
                    return Err((pending, "engine process has no stdin".to_owned()));
                };
                match stdin.write_all(&line).await {
                    Ok(()) => Ok(pending),
                    Err(e) => Err((pending, format!("engine process gone: {e}"))),
                }
            };
            match tokio::time::timeout(timeout, call).await {
                Ok(Ok(p)) => p,
                Ok(Err((p, why))) => {
                    if let Ok(mut m) = p.lock() {
                        m.remove(&id);
                    }
                    return Outcome::unknown(why);
                }
                Err(_) => return Outcome::unknown("timed out sending to a frozen engine"),
            }
        };
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Outcome::unknown("engine process died"),
            Err(_) => {
                if let Ok(mut m) = pending.lock() {
                    m.remove(&id);
                }
                Outcome::unknown("timed out")
            }
        }
    }

    /// kill -9, then start a fresh process in its place. Calls in flight
    /// on the old one end as `unknown`.
    pub async fn kill_and_restart(&self) -> std::io::Result<()> {
        let mut r = self.running.lock().await;
        let _ = r.child.start_kill();
        let _ = r.child.wait().await;
        *r = launch(&self.spec)?;
        self.pid.store(r.child.id().unwrap_or(0), Ordering::SeqCst);
        Ok(())
    }

    /// kill -9 only (the writer is left down for a while).
    pub async fn kill(&self) {
        let mut r = self.running.lock().await;
        let _ = r.child.start_kill();
        let _ = r.child.wait().await;
    }

    /// Starts it again if it is not running.
    pub async fn ensure_running(&self) -> std::io::Result<()> {
        let mut r = self.running.lock().await;
        if matches!(r.child.try_wait(), Ok(Some(_))) {
            *r = launch(&self.spec)?;
            self.pid.store(r.child.id().unwrap_or(0), Ordering::SeqCst);
        }
        Ok(())
    }

    /// Sends SIGSTOP or SIGCONT.
    pub fn signal(&self, sig: libc::c_int) {
        let pid = self.pid.load(Ordering::SeqCst);
        if pid != 0 {
            // SAFETY: kill(2) on a pid this process spawned and has not
            // reaped (a killed child is reaped under the lock before its
            // replacement's pid is stored).
            unsafe {
                libc::kill(pid as libc::pid_t, sig);
            }
        }
    }

    /// Ends the process for good.
    pub async fn stop(&self) {
        let mut r = self.running.lock().await;
        r.stdin = None;
        let _ = r.child.start_kill();
        let _ = r.child.wait().await;
    }
}

fn launch(spec: &ChildSpec) -> std::io::Result<Running> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.log)?;
    let mut child = Command::new(std::env::current_exe()?)
        .args(&spec.args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let pending: Pending = Arc::default();
    if let Some(stdout) = stdout {
        let pending = pending.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(reply) = serde_json::from_str::<Reply>(&line) else {
                    continue;
                };
                let waiter = pending.lock().ok().and_then(|mut p| p.remove(&reply.id));
                if let Some(w) = waiter {
                    let _ = w.send(reply.outcome);
                }
            }
            // The process is gone: whoever still waits learns it now.
            if let Ok(mut p) = pending.lock() {
                for (_, w) in p.drain() {
                    let _ = w.send(Outcome::unknown("engine process died"));
                }
            }
        });
    }
    Ok(Running {
        child,
        stdin,
        pending,
    })
}
