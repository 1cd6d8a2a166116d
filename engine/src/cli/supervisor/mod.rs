//! The supervisor: the process that runs an exec's command and ends it,
//! with everything it started, when the exec cannot.
//!
//! Why a process of its own: `lock exec` promises that nothing the command
//! started runs on once the lock goes back. While the exec lives it ends
//! the command itself; a kill -9 of the exec gives it no chance. So the
//! exec forks a supervisor, the supervisor runs the command as its child,
//! and it watches a pipe only the exec holds. When the exec dies, however
//! it dies, the kernel closes the pipe and the supervisor kills every
//! process below it. It is also a dead man's switch: the exec writes a byte
//! every quarter of the supervisor's patience (2/5 of the lease), and a
//! supervisor that hears nothing for its patience kills them all: an exec
//! that is stopped (SIGSTOP, Ctrl-Z) or hung renews no lease, and its
//! command must not run into the next holder's turn. The exec beats only
//! while the grant outlasts the patience (`supervised::may_beat`), so a
//! supervisor counting from the last beat always ends the command before
//! the lease can end.
//!
//! Why "every process below it" is all of them: the supervisor and the
//! exec are both child subreapers (`PR_SET_CHILD_SUBREAPER`). A process
//! whose parent dies is handed to its nearest subreaper ancestor instead of
//! init, so nothing the command starts can leave the tree: not a worker in
//! a group of its own (`timeout(1)`, `set -m`), not one in a session of its
//! own (`setsid`), not a double fork. Killing is a loop: kill every
//! descendant /proc shows, reap, look again, until `waitpid` says no child
//! is left; orphans of the killed come to the killer, so an empty answer
//! means an empty tree. (This replaced a design that followed the groups a
//! command made from the outside; its fifth attack found three ways out of
//! it, all closed by the subreaper.)
//!
//! If the supervisor is killed on its own, its orphans (the command and
//! all below it) come to the exec, which kills them all, gives the lock
//! back, and says so. If it is stopped on its own, the exec continues it
//! at every beat. What no process can cover: the exec and its supervisor
//! killed together (or the supervisor stopped and then the exec killed),
//! and work handed to a process outside the tree (a daemon, `at`, ssh).
//!
//! Why it runs the binary anew as `lease-reaper`: a forked child shares
//! the exec's command line, so `pkill -STOP -f 'lock exec'` would stop
//! both. Run anew from `/proc/self/exe` under a name and command line of
//! its own (neither says `flashsale` nor `lock exec`, nor names the
//! command, which it reads from the pipe), it is stopped only when aimed
//! at. It leads a process group of its own, leaving the exec's, so a
//! shell's `kill -9 %1` of the exec's job does not take it too; the command
//! leads another, so a command that stops its own group (`kill(0,
//! SIGSTOP)`) does not stop its supervisor (the twenty-second attack: it
//! did, and with the exec stopped or killed nothing ended the command). In
//! a PID namespace the command cannot name the supervisor at all; without
//! one, a command of the same user can still signal it by its pid, which
//! is why the namespace is the default.
//!
//! Why the terminal stays with the exec: the command's group is never the
//! terminal's foreground, so job control is the shell's, on the exec (Ctrl-Z
//! stops the exec, whose silence ends the command; Ctrl-C reaches the exec,
//! which stops the command). A command that reads (or, with `tostop`,
//! writes) the terminal is stopped by SIGTTIN/SIGTTOU; the supervisor
//! reports the stop and the exec ends the command with a clear error rather
//! than hold the lock for a command that waits for ever. A wrapper hides
//! such a stop (`sh -c 'cat'`, `timeout --foreground`): the exec also looks
//! through the tree for a process stopped while the terminal serves
//! another group ([`Supervisor::scan`]) and ends the command once one has
//! stayed stopped for a few seconds.
//!
//! Between the exec's fork and the supervisor's new image only
//! async-signal-safe calls are made (the exec has many threads); the new
//! image is a process of its own and may do as it likes.
//!
//! The files: this one is the exec's side (start, beat, signal, end);
//! `image.rs` is the supervisor's process; `wire.rs` what crosses the
//! pipes between them; `process_tree.rs` the walk and kill both sides use;
//! `namespace.rs` the command's PID namespace, `privileges.rs` what the
//! command may keep, `run_as.rs` the user it may run as, and
//! `preflight.rs` what the exec checks before it takes anything.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::FromRawFd;
use std::time::{Duration, Instant};

mod image;
mod namespace;
mod preflight;
mod privileges;
mod process_tree;
mod run_as;
mod wire;

pub use run_as::RunAs;

use image::{become_supervisor, SupervisorImage};
use preflight::keep_children_to_reap;
pub use preflight::preflight;
use process_tree::{
    children_of, descendants, kill_below, kill_marked, kill_tree, processes, Unended, KILL_FOR,
};
use wire::{encode_beat, encode_spec, monotonic_ns, MARK_VAR};

pub use image::run_if_supervisor;
pub use wire::{PidNamespace, Report};

/// A process of the tree found stopped while the terminal serves another
/// group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoppedMember {
    pub pid: libc::pid_t,
    pub name: String,
}

/// The exec's handle on its supervisor; dropped, the whole tree is killed.
pub struct Supervisor {
    pid: libc::pid_t,
    /// The write end of the supervisor's pipe: open as long as the exec
    /// lives (non-blocking once the command is handed over).
    /// The pipe to the supervisor; closed (None) when the exec ends it:
    /// the supervisor's word to kill everything and exit.
    control: Option<File>,
    reports: tokio::sync::mpsc::UnboundedReceiver<Report>,
    patience: Duration,
    last_beat: Instant,
    /// The exec was silent longer than the supervisor waits: the command
    /// may have been killed and the lease may have run out under it.
    lapsed: bool,
    ended: bool,
    /// The word to start the command was given (the first beat was sent).
    went: bool,
    /// The exec's children from before the supervisor (a caller that
    /// `exec`s into flashsale may have left some): never killed.
    spared: Vec<libc::pid_t>,
    /// The supervisor was reaped (by `was_killed`): its pid may name
    /// another process now, and nothing is below it any more.
    reaped: bool,
    /// The supervisor ended without killing everything below it (it was
    /// killed, or gave up): what was left there went to this process if it
    /// is a subreaper, to init if not.
    left_work: bool,
    /// `FLASHSALE_EXEC_MARK=<value>`, in the command's environment: how
    /// its processes are found once they left the tree (see `kill_marked`).
    mark: String,
}

impl Supervisor {
    /// Makes this process a subreaper, forks the supervisor and hands it
    /// the command (`argv`, and this process's environment with `env`
    /// added; in a PID namespace of its own as `pid_namespace` says; as
    /// the user `run_as` names, if any). `lease` is the grant's: the
    /// supervisor kills the command when the exec has not been heard from
    /// for 2/5 of it.
    pub fn start(
        lease: Duration,
        argv: &[String],
        env: &[(&str, String)],
        pid_namespace: PidNamespace,
        run_as: Option<&RunAs>,
    ) -> io::Result<Self> {
        // Two fifths of the lease: the exec beats only while the lease
        // outlasts the patience by a fifth of it (`supervised::may_beat`),
        // and a lease just before its renewal (due a third of the way in)
        // still has about two thirds left, which clears that bar with room.
        let patience = (lease * 2 / 5).max(Duration::from_millis(10));
        preflight()?;
        keep_children_to_reap();
        // SAFETY: getpid has no failure and no memory.
        let me = unsafe { libc::getpid() };
        let spared = match processes() {
            Ok(procs) => children_of(&procs, me),
            Err(e) => return Err(io::Error::other(e.to_string())),
        };
        // A subreaper only when this process started nothing before: the
        // orphans a caller's children leave (a caller that `exec`s into
        // flashsale) would come here too, and could not be told from the
        // command's. Without it, a supervisor killed on its own leaves the
        // command's background work to init (its first process dies with
        // the supervisor, by PR_SET_PDEATHSIG).
        // SAFETY: prctl on this process's own attributes.
        if spared.is_empty() && unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let (control_read, control_write) = pipe()?;
        let (report_read, report_write) = match pipe() {
            Ok(p) => p,
            Err(e) => {
                close(control_read);
                close(control_write);
                return Err(e);
            }
        };
        // SAFETY: each descriptor was just made and is owned here alone.
        let (control, reports) = unsafe {
            (
                File::from_raw_fd(control_write),
                File::from_raw_fd(report_read),
            )
        };
        let patience_ms = patience.as_millis().min(i32::MAX as u128) as libc::c_int;
        // Everything the child's exec needs is made before the fork: it may
        // not allocate.
        let image = SupervisorImage::new(control_read, report_write, patience_ms);
        // SAFETY: the child runs only `become_supervisor`, which makes
        // async-signal-safe calls and never returns.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            become_supervisor(control_read, report_write, image.as_ref());
        }
        close(control_read);
        close(report_write);
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        // Both sides set the group (as a shell does), so it exists before
        // the command joins it whichever runs first.
        // SAFETY: setpgid on our own child.
        unsafe { libc::setpgid(pid, pid) };
        let mut supervisor = Supervisor {
            pid,
            control: Some(control),
            reports: read_reports(reports),
            patience,
            last_beat: Instant::now(),
            lapsed: false,
            ended: false,
            went: false,
            spared,
            reaped: false,
            left_work: false,
            mark: format!("{MARK_VAR}={me}.{}", monotonic_ns()),
        };
        // Dropped on an error, the supervisor is killed.
        supervisor.hand_over(argv, env, pid_namespace, run_as)?;
        Ok(supervisor)
    }

    /// Writes the command and its environment down the pipe, never
    /// blocking: a supervisor stopped on its own is continued meanwhile,
    /// and the hand-over gives up after the patience (the supervisor gives
    /// up reading as soon, and never starts a command handed over late).
    ///
    /// A command run as another user gets none of the exec's `FLASHSALE_`
    /// variables (the lock nodes' URLs, with their passwords, are among
    /// them: it could delete its own lock), only those `env` adds, and its
    /// own user's `USER`, `LOGNAME` and `HOME`.
    fn hand_over(
        &mut self,
        argv: &[String],
        env: &[(&str, String)],
        pid_namespace: PidNamespace,
        run_as: Option<&RunAs>,
    ) -> io::Result<()> {
        let login = run_as.map(RunAs::login_env);
        let replaced = |k: &OsStr| {
            env.iter().any(|(e, _)| OsStr::new(e) == k)
                || k == MARK_VAR
                || login.as_ref().is_some_and(|l| {
                    l.iter().any(|(name, _)| name == k)
                        || k.as_encoded_bytes().starts_with(b"FLASHSALE_")
                })
        };
        let mut vars: Vec<(OsString, OsString)> =
            std::env::vars_os().filter(|(k, _)| !replaced(k)).collect();
        vars.extend(login.into_iter().flatten());
        vars.extend(env.iter().map(|(k, v)| (k.into(), v.into())));
        if let Some((k, v)) = self.mark.split_once('=') {
            vars.push((k.into(), v.into()));
        }
        let spec = encode_spec(argv, &vars, pid_namespace, run_as.map(|r| &r.ids));
        let mut bytes = (spec.len() as u32).to_le_bytes().to_vec();
        bytes.extend(spec);
        let Some(control) = self.control.as_mut() else {
            return Ok(());
        };
        let fd = std::os::fd::AsRawFd::as_raw_fd(&*control);
        // SAFETY: fcntl on a descriptor this handle owns.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
        let deadline = Instant::now() + self.patience;
        let mut sent = 0;
        while sent < bytes.len() {
            match control.write(&bytes[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "the supervisor did not read the command in time",
                        ));
                    }
                    // SAFETY: kill(2) of our own child; poll of one live
                    // pollfd.
                    unsafe {
                        libc::kill(self.pid, libc::SIGCONT);
                        let mut poll = libc::pollfd {
                            fd,
                            events: libc::POLLOUT,
                            revents: 0,
                        };
                        libc::poll(&mut poll, 1, 10);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Only the supervisor reads this pipe: a broken one means
                // it is gone (killed, most likely, as it started). Its
                // report channel ends too, and `was_killed` tells the
                // caller how it went; no command ran, as none was handed
                // over whole.
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The supervisor's next report; None once it is gone.
    pub async fn report(&mut self) -> Option<Report> {
        self.reports.recv().await
    }

    /// How often the exec calls [`Supervisor::beat`]: a quarter of the
    /// patience, so beats skipped while a renewal is late do not leave the
    /// supervisor silent for its whole patience when the renewal lands.
    pub fn heartbeat_every(&self) -> Duration {
        (self.patience / 4).max(Duration::from_millis(5))
    }

    /// How long the supervisor waits for a beat.
    pub fn patience(&self) -> Duration {
        self.patience
    }

    /// Tells the supervisor the exec lives, continuing it first (one
    /// stopped on its own would kill nothing). The first beat after the
    /// hand-over is also the word to start the command: the exec gives it
    /// only while the grant outlasts the patience (`supervised::may_beat`).
    pub fn beat(&mut self) {
        if self.ended {
            return;
        }
        if self.last_beat.elapsed() >= self.patience {
            self.lapsed = true;
        }
        self.last_beat = Instant::now();
        // SAFETY: kill(2) of our own child, not yet reaped (it is reaped
        // only in `end`). SIGCONT to a running process changes nothing.
        unsafe { libc::kill(self.pid, libc::SIGCONT) };
        // A full pipe (a supervisor stopped for long) or a gone one: the
        // report channel says which soon enough.
        let beat = encode_beat(monotonic_ns());
        if self
            .control
            .as_mut()
            .is_some_and(|c| c.write(&beat).is_ok())
        {
            self.went = true;
        }
    }

    /// Whether the word to start the command was given: until then the
    /// command cannot have run.
    pub fn went(&self) -> bool {
        self.went
    }

    /// Whether the supervisor, gone, was killed by a signal (not ended on
    /// its own: it ends on its own only when the word to start the command
    /// did not come in time). Waits up to a second for its end.
    pub fn was_killed(&mut self) -> bool {
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until {
            let mut status = 0;
            // SAFETY: waits without blocking for our own child.
            let pid = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
            if pid == self.pid {
                self.reaped = true;
                self.left_work = libc::WIFSIGNALED(status);
                return self.left_work;
            }
            if pid < 0 {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// Whether this process is a subreaper (it had no children when the
    /// exec started): then every orphan of the command comes to it.
    pub fn subreaper(&self) -> bool {
        self.spared.is_empty()
    }

    /// Waits up to `limit` for the supervisor to exit (continuing it, in
    /// case it was stopped), and reaps it: Some(true) when it killed
    /// everything below it, Some(false) when it gave up or was killed,
    /// None when it is still there.
    /// An ECHILD for it (never reaped) is a lie, not an end: `Blind`.
    fn wait_out(&mut self, limit: Duration) -> Result<Option<bool>, Unended> {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            let mut status = 0;
            // SAFETY: kill(2) and waitpid of our own child, not yet reaped.
            let pid = unsafe {
                libc::kill(self.pid, libc::SIGCONT);
                libc::waitpid(self.pid, &mut status, libc::WNOHANG)
            };
            if pid == self.pid {
                self.reaped = true;
                let done = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
                self.left_work |= !done;
                return Ok(Some(done));
            }
            if pid < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EINTR) {
                    return Err(Unended::Blind(format!(
                        "waitpid of the supervisor (pid {}) failed: {e}",
                        self.pid
                    )));
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(None)
    }

    /// Whether the exec was ever silent longer than the supervisor waits:
    /// the command cannot be known to have run under a live lease
    /// throughout.
    pub fn lapsed(&self) -> bool {
        self.lapsed || self.last_beat.elapsed() >= self.patience
    }

    /// Sends `sig` to every process of the command (not the supervisor).
    /// A /proc that cannot be read sends nothing: the kill at the end
    /// checks every answer.
    pub fn signal_command(&self, sig: libc::c_int) {
        let procs = processes().unwrap_or_default();
        for pid in descendants(&procs, self.pid) {
            // SAFETY: kill(2) of a process below our own child.
            unsafe { libc::kill(pid, sig) };
        }
    }

    /// A process of the command stopped while its controlling terminal
    /// serves another group: stopped by a terminal read or write (the
    /// command's group is never the terminal's), or by a SIGSTOP nobody
    /// may undo. One /proc scan: about once a second, not at every beat.
    pub fn scan(&self) -> Option<StoppedMember> {
        let procs = processes().ok()?;
        let below: HashSet<libc::pid_t> = descendants(&procs, self.pid).into_iter().collect();
        procs
            .iter()
            .filter(|p| below.contains(&p.pid))
            .find(|p| p.state == 'T' && p.tty != 0 && p.tpgid != p.pgrp)
            .map(|p| StoppedMember {
                pid: p.pid,
                name: p.name.clone(),
            })
    }

    /// Kills the supervisor and everything below this process but the
    /// children it had before (and theirs), and reaps them all; what of
    /// the command went to init is found by its mark. Done before the
    /// grant goes back, on every path: the answer says whether it may go
    /// back.
    pub fn end(mut self) -> Ended {
        self.end_now()
    }

    fn end_now(&mut self) -> Ended {
        if self.ended {
            return Ended::Clean;
        }
        self.ended = true;
        match self.kill_everything() {
            Ok(()) if self.left_work && !self.subreaper() => Ended::Doubtful,
            Ok(()) => Ended::Clean,
            Err(Unended::ForkedFaster) => Ended::ForkedFaster,
            Err(Unended::Blind(why)) => Ended::Blind(why),
        }
    }

    fn kill_everything(&mut self) -> Result<(), Unended> {
        let started = Instant::now();
        // The supervisor does the kill: it is a subreaper, so every orphan
        // of the command comes to it, and it is done only when waitpid
        // leaves it no child. From outside, /proc is read a process at a
        // time, and a line of processes that each fork a successor and exit
        // within a few ms slipped between two reads (the eleventh attack),
        // to init when this process is no subreaper. The pipe closing is
        // its word to end everything and exit; it exits 0 only when it
        // killed everything.
        if !self.reaped {
            self.control = None;
            // Killed or given up half-way (the twelfth attack killed it
            // while it killed), it leaves the rest to this process, which
            // ends it below: never a reason to skip the kill.
            if self.wait_out(KILL_FOR + Duration::from_secs(2))?.is_none() {
                kill_below(self.pid, started)?;
            }
        }
        // SAFETY: getpid has no failure and no memory.
        kill_tree(unsafe { libc::getpid() }, &self.spared)?;
        // No subreaper (the exec had children before): what left the tree
        // went to init, with the mark.
        if !self.subreaper() {
            kill_marked(self.mark.as_bytes(), &self.spared, started)?;
        }
        Ok(())
    }
}

/// How the end of the command's processes went: whether the grant may go
/// back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// Nothing of the command is left: the grant may go back.
    Clean,
    /// The supervisor died before it had killed everything, and this exec
    /// is no subreaper: the rest went to init. Those that carried the mark
    /// were killed, but one that hid it cannot be known gone: the grant
    /// is left to lapse.
    Doubtful,
    /// A process forked faster than it was killed for [`KILL_FOR`]: the
    /// grant is left to lapse.
    ForkedFaster,
    /// The kernel's answers could not be had or disagreed (a kill refused,
    /// /proc unreadable, waitpid's "no child" while /proc shows one): what
    /// is left cannot be known gone, and the grant is left to lapse. The
    /// reason, for the user.
    Blind(String),
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.end_now();
    }
}

/// A pipe, both ends close-on-exec.
fn pipe() -> io::Result<(libc::c_int, libc::c_int)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((fds[0], fds[1]))
}

fn close(fd: libc::c_int) {
    // SAFETY: closes a descriptor this module opened.
    unsafe { libc::close(fd) };
}

/// Reads the supervisor's reports on a thread of their own (a blocking
/// pipe) into a channel that closes when the supervisor is gone.
fn read_reports(mut pipe: File) -> tokio::sync::mpsc::UnboundedReceiver<Report> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        let mut bytes = [0u8; 5];
        while pipe.read_exact(&mut bytes).is_ok() {
            match Report::decode(bytes) {
                Some(r) if tx.send(r).is_ok() => {}
                _ => break,
            }
        }
    });
    rx
}
