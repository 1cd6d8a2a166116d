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
//! while the grant outlasts the patience (`lock_exec::may_beat`), so a
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
//! at. It leads a process group the command joins, and leaves the exec's,
//! so a shell's `kill -9 %1` of the exec's job does not take it too.
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

use std::collections::{HashMap, HashSet};
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use super::own_proc::{cap_set, OwnProc};

/// The supervisor's name (argv[0] and comm) in its new image.
const SUPERVISOR_NAME: &str = "lease-reaper";

/// The environment variable that marks a supervisor's new image: with the
/// name, the pipes and leading its own group, it tells a supervisor from a
/// user's command line.
const SUPERVISOR_ENV: &str = "FLASHSALE_LEASE_REAPER";

/// Highest descriptor closed before the supervisor's new image.
const MAX_FD: libc::c_int = 4096;

/// Largest command line and environment the exec hands over (bytes).
const MAX_SPEC: usize = 16 << 20;

/// How often the supervisor looks at its child when no byte comes.
const TICK_MS: libc::c_int = 20;

/// A beat's tag. A beat is the tag and when the exec sent it (ns of
/// `CLOCK_MONOTONIC`, one clock for every process of the host, little
/// endian): [`BEAT_LEN`] bytes, below `PIPE_BUF`, so written whole. The
/// supervisor counts its patience from the sending, not from its reading:
/// a beat read late (the supervisor stopped or starved meanwhile) gives
/// the command no time the exec's lease did not cover.
const BEAT: u8 = 2;
/// Bytes of a beat.
const BEAT_LEN: usize = 9;

/// The variable that marks every process of the command.
const MARK_VAR: &str = "FLASHSALE_EXEC_MARK";

/// How long a kill of the tree may take before it is given up as lost to
/// a process that forks faster than it is killed.
const KILL_FOR: Duration = Duration::from_secs(10);

/// The signals the supervisor ignores (they are meant for the exec or the
/// command: a terminal's, a pipe's), and that the command gets back.
const IGNORED: [libc::c_int; 8] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGPIPE,
    libc::SIGTSTP,
    libc::SIGTTIN,
    libc::SIGTTOU,
];

/// Every signal the running supervisor ignores: all but SIGCHLD (it
/// reaps), SIGCONT (continuing cannot be ignored anyway) and the two no
/// process can ignore. A signal sent to the command's process group (log
/// rotation's SIGUSR1, a checkpoint's SIGXCPU), which the supervisor leads,
/// is the command's business; a fault of the supervisor's own (SIGSEGV)
/// still ends it, since the kernel does not let a fault be ignored. The
/// command gets them all back at their defaults.
fn supervisor_ignores() -> Vec<libc::c_int> {
    let kept = [libc::SIGKILL, libc::SIGSTOP, libc::SIGCHLD, libc::SIGCONT];
    (1..=libc::SIGRTMAX())
        .filter(|sig| !kept.contains(sig))
        .collect()
}

/// What the supervisor tells the exec, five bytes each on its pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// The command runs, with this pid.
    Started(libc::pid_t),
    /// The command could not be started: the errno.
    NotStarted(i32),
    /// The command's first process was stopped by this signal.
    Stopped(libc::c_int),
    /// The command's first process ended: its wait status.
    Exited(libc::c_int),
    /// No PID namespace could be made for it: the errno.
    NoNamespace(i32),
}

impl Report {
    fn encode(self) -> [u8; 5] {
        let (kind, value) = match self {
            Report::Started(v) => (1, v),
            Report::NotStarted(v) => (2, v),
            Report::Stopped(v) => (3, v),
            Report::Exited(v) => (4, v),
            Report::NoNamespace(v) => (5, v),
        };
        let mut out = [kind; 5];
        out[1..].copy_from_slice(&value.to_le_bytes());
        out
    }

    fn decode(bytes: [u8; 5]) -> Option<Report> {
        let value = i32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
        Some(match bytes[0] {
            1 => Report::Started(value),
            2 => Report::NotStarted(value),
            3 => Report::Stopped(value),
            4 => Report::Exited(value),
            5 => Report::NoNamespace(value),
            _ => return None,
        })
    }
}

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
    /// added; in a PID namespace of its own with `pid_namespace`). `lease` is the grant's: the supervisor kills the command
    /// when the exec has not been heard from for 2/5 of it.
    pub fn start(
        lease: Duration,
        argv: &[String],
        env: &[(&str, String)],
        pid_namespace: bool,
    ) -> io::Result<Self> {
        // Two fifths of the lease: the exec beats only while the lease
        // outlasts the patience by a fifth of it (`lock_exec::may_beat`),
        // and a lease just before its renewal (due a third of the way in)
        // still has about two thirds left, which clears that bar with room.
        let patience = (lease * 2 / 5).max(Duration::from_millis(10));
        preflight()?;
        keep_children_to_reap();
        // SAFETY: getpid has no failure and no memory.
        let me = unsafe { libc::getpid() };
        let spared = children_of(&processes(), me);
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
        supervisor.hand_over(argv, env, pid_namespace)?;
        Ok(supervisor)
    }

    /// Writes the command and its environment down the pipe, never
    /// blocking: a supervisor stopped on its own is continued meanwhile,
    /// and the hand-over gives up after the patience (the supervisor gives
    /// up reading as soon, and never starts a command handed over late).
    fn hand_over(
        &mut self,
        argv: &[String],
        env: &[(&str, String)],
        pid_namespace: bool,
    ) -> io::Result<()> {
        let mut vars: Vec<(OsString, OsString)> = std::env::vars_os()
            .filter(|(k, _)| !env.iter().any(|(e, _)| OsStr::new(e) == k) && k != MARK_VAR)
            .collect();
        vars.extend(env.iter().map(|(k, v)| (k.into(), v.into())));
        if let Some((k, v)) = self.mark.split_once('=') {
            vars.push((k.into(), v.into()));
        }
        let spec = encode_spec(argv, &vars, pid_namespace);
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
    /// only while the grant outlasts the patience (`lock_exec::may_beat`).
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
    fn wait_out(&mut self, limit: Duration) -> Option<bool> {
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
                return Some(done);
            }
            if pid < 0 {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    }

    /// Whether the exec was ever silent longer than the supervisor waits:
    /// the command cannot be known to have run under a live lease
    /// throughout.
    pub fn lapsed(&self) -> bool {
        self.lapsed || self.last_beat.elapsed() >= self.patience
    }

    /// Sends `sig` to every process of the command (not the supervisor).
    pub fn signal_command(&self, sig: libc::c_int) {
        let procs = processes();
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
        let procs = processes();
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
            if self.wait_out(KILL_FOR + Duration::from_secs(2)).is_none()
                && !kill_below(self.pid, started)
            {
                return Ended::ForkedFaster;
            }
        }
        // SAFETY: getpid has no failure and no memory.
        let tree = kill_tree(unsafe { libc::getpid() }, &self.spared);
        // No subreaper (the exec had children before): what left the tree
        // went to init, with the mark.
        let marked = self.subreaper() || kill_marked(self.mark.as_bytes(), &self.spared, started);
        if !(tree && marked) {
            Ended::ForkedFaster
        } else if self.left_work && !self.subreaper() {
            Ended::Doubtful
        } else {
            Ended::Clean
        }
    }
}

/// How the end of the command's processes went: whether the grant may go
/// back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.end_now();
    }
}

/// Refuses a command that could become a user this process cannot kill:
/// with no CAP_KILL, a process of another user is beyond its SIGKILL, and
/// would run on past the lock (the thirteenth and fourteenth attacks: a
/// setuid program; ambient CAP_SETUID given by a service manager; root
/// with CAP_KILL dropped). Without CAP_KILL, the command runs with
/// no_new_privs and no ambient capabilities (see `spawn`), which stops the
/// setuid bit and file capabilities; what is left is CAP_SETUID this
/// process holds itself (or, as root, could regain at exec from its
/// bounding set): then the command does not run.
fn within_reach(proc: &OwnProc) -> io::Result<()> {
    const CAP_KILL: u32 = 5;
    const CAP_SETUID: u32 = 7;
    let status = proc.read_self("status")?;
    let caps = |field: &str| cap_set(&status, field);
    let has = |set: u64, cap: u32| set & (1 << cap) != 0;
    if has(caps("CapEff:"), CAP_KILL) {
        return Ok(());
    }
    // SAFETY: geteuid has no failure and no memory.
    let root = unsafe { libc::geteuid() } == 0;
    let may_setuid = has(caps("CapPrm:") | caps("CapAmb:"), CAP_SETUID)
        || (root && has(caps("CapBnd:"), CAP_SETUID));
    if may_setuid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "this exec has no CAP_KILL, so it cannot kill another user's processes, yet its \
             command could become another user (CAP_SETUID): give the exec CAP_KILL or take \
             CAP_SETUID away from it; the command did not run",
        ));
    }
    Ok(())
}

/// What an exec checks before it takes a lock or sets anything: that
/// /proc is its own ([`OwnProc::open`]), that it can end whatever its
/// command may become ([`within_reach`]) and that /proc shows it all of
/// it ([`OwnProc::shows_everything`]). A refusal here leaves the nodes as
/// they were; [`Supervisor::start`] checks again.
pub fn preflight() -> io::Result<()> {
    let proc = OwnProc::open()?;
    within_reach(&proc)?;
    proc.shows_everything()?;
    keep_out_of_reach();
    Ok(())
}

/// Makes this process not dumpable, so its /proc entries belong to root:
/// the command runs as this user, and could otherwise open the pipes to
/// the supervisor through `/proc/<pid>/fd/<n>`, forge a heartbeat stamped
/// far ahead and hold the pipe open, and run on past the lock after a
/// kill -9 of the exec (the seventeenth attack). The supervisor does the
/// same in its own image; the command gets dumpable back at its execve. A
/// command running as root reaches them anyway: no process can keep root
/// out.
fn keep_out_of_reach() {
    // SAFETY: prctl on this process's own attribute.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0) };
}

/// Gives SIGCHLD back its default if the caller left it ignored (`perl -e
/// '$SIG{CHLD}="IGNORE"; exec ...'`): ignored, it is inherited across exec
/// and makes the kernel reap this process's children unasked, so the
/// supervisor's end (and its exit status) would be lost to waitpid, and the
/// lock held for ever (the twelfth attack). A handler someone installed is
/// left alone.
fn keep_children_to_reap() {
    // SAFETY: sigaction reads into, then writes from, a zeroed struct of
    // this process's own.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGCHLD, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
        {
            libc::signal(libc::SIGCHLD, libc::SIG_DFL);
        }
    }
}

/// `CLOCK_MONOTONIC` now, ns.
fn monotonic_ns() -> u64 {
    // SAFETY: clock_gettime fills the zeroed timespec it is given.
    let t = unsafe {
        let mut t: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t);
        t
    };
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}

fn encode_beat(sent_ns: u64) -> [u8; BEAT_LEN] {
    let mut out = [BEAT; BEAT_LEN];
    out[1..].copy_from_slice(&sent_ns.to_le_bytes());
    out
}

/// When the exec sent the beat `frame`, or None if it is not a beat.
fn decode_beat(frame: &[u8]) -> Option<u64> {
    let (tag, sent) = frame.split_first()?;
    (*tag == BEAT).then_some(())?;
    Some(u64::from_le_bytes(sent.try_into().ok()?))
}

/// The moment (ns of `CLOCK_MONOTONIC`) by which the command must have been
/// ended, counting from a beat the exec sent at `sent_ns`.
fn beat_deadline(sent_ns: u64, patience: Duration) -> u64 {
    sent_ns.saturating_add(u64::try_from(patience.as_nanos()).unwrap_or(u64::MAX))
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

/// The command and its environment as the supervisor reads them: each
/// argument `A<bytes>\0`, each variable `E<key>=<value>\0`. (Neither may
/// hold a NUL: the kernel's exec could not pass one.)
fn encode_spec(argv: &[String], env: &[(OsString, OsString)], pid_namespace: bool) -> Vec<u8> {
    let mut out = Vec::new();
    if pid_namespace {
        out.extend(b"N\0");
    }
    for a in argv {
        out.push(b'A');
        out.extend(a.as_bytes().iter().filter(|b| **b != 0));
        out.push(0);
    }
    for (k, v) in env {
        out.push(b'E');
        out.extend(k.as_bytes().iter().filter(|b| **b != 0));
        out.push(b'=');
        out.extend(v.as_bytes().iter().filter(|b| **b != 0));
        out.push(0);
    }
    out
}

/// The command as handed over.
#[derive(Debug, Default, PartialEq)]
struct Spec {
    argv: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    /// Run the command in a PID namespace of its own (`--pid-namespace`).
    pid_namespace: bool,
}

fn decode_spec(bytes: &[u8]) -> Option<Spec> {
    let mut spec = Spec::default();
    for item in bytes.split(|b| *b == 0).filter(|i| !i.is_empty()) {
        let (kind, rest) = item.split_first()?;
        match kind {
            b'A' => spec.argv.push(OsString::from_vec(rest.to_vec())),
            b'N' => spec.pid_namespace = true,
            b'E' => {
                let eq = rest.iter().position(|b| *b == b'=')?;
                spec.env.push((
                    OsString::from_vec(rest[..eq].to_vec()),
                    OsString::from_vec(rest[eq + 1..].to_vec()),
                ));
            }
            _ => return None,
        }
    }
    (!spec.argv.is_empty()).then_some(spec)
}

/// The command line and environment of the supervisor's new image, made
/// before the fork: argv `lease-reaper <control fd> <report fd> <patience
/// ms>`, and [`SUPERVISOR_ENV`].
struct SupervisorImage {
    _strings: [CString; 5],
    argv: [*const libc::c_char; 5],
    envp: [*const libc::c_char; 2],
}

impl SupervisorImage {
    fn new(control: libc::c_int, report: libc::c_int, patience_ms: libc::c_int) -> Option<Self> {
        let strings = [
            CString::new(SUPERVISOR_NAME).ok()?,
            CString::new(control.to_string()).ok()?,
            CString::new(report.to_string()).ok()?,
            CString::new(patience_ms.to_string()).ok()?,
            CString::new(format!("{SUPERVISOR_ENV}=1")).ok()?,
        ];
        let argv = [
            strings[0].as_ptr(),
            strings[1].as_ptr(),
            strings[2].as_ptr(),
            strings[3].as_ptr(),
            std::ptr::null(),
        ];
        let envp = [strings[4].as_ptr(), std::ptr::null()];
        Some(SupervisorImage {
            _strings: strings,
            argv,
            envp,
        })
    }
}

/// In the forked child: a group of its own, the signals meant for others
/// ignored, only its two pipes (and the terminal's 0, 1, 2, which the
/// command inherits) kept, then the new image. Async-signal-safe calls
/// only; if the new image cannot start, the child exits and the exec sees
/// its report pipe close before any report.
fn become_supervisor(
    control: libc::c_int,
    report: libc::c_int,
    image: Option<&SupervisorImage>,
) -> ! {
    // SAFETY: async-signal-safe calls on this process's own state only.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, c"lease-reaper".as_ptr());
        libc::setpgid(0, 0);
        for sig in IGNORED {
            libc::signal(sig, libc::SIG_IGN);
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        // Everything else the exec had open (its connections, the other
        // ends of these pipes) is the exec's.
        for fd in 3..MAX_FD {
            if fd != control && fd != report {
                libc::close(fd);
            }
        }
        if let Some(image) = image {
            libc::fcntl(control, libc::F_SETFD, 0);
            libc::fcntl(report, libc::F_SETFD, 0);
            libc::execve(
                c"/proc/self/exe".as_ptr(),
                image.argv.as_ptr(),
                image.envp.as_ptr(),
            );
        }
        libc::_exit(1)
    }
}

/// Called first thing in `main`. Returns (run the CLI) unless this process
/// was started as a supervisor by [`Supervisor::start`]: named
/// [`SUPERVISOR_NAME`], marked by [`SUPERVISOR_ENV`], leading its own group
/// and holding two pipes; then it supervises and never returns.
pub fn run_if_supervisor() {
    if let Some((control, report, patience)) = supervisor_args() {
        supervise(control, report, patience)
    }
}

/// The pipes and patience of a process started as a supervisor, or None.
fn supervisor_args() -> Option<(libc::c_int, libc::c_int, Duration)> {
    let args: Vec<OsString> = std::env::args_os().collect();
    let [name, control, report, patience] = args.as_slice() else {
        return None;
    };
    if name.as_bytes() != SUPERVISOR_NAME.as_bytes() || std::env::var_os(SUPERVISOR_ENV).is_none() {
        return None;
    }
    let control: libc::c_int = control.to_str()?.parse().ok()?;
    let report: libc::c_int = report.to_str()?.parse().ok()?;
    let patience: u64 = patience.to_str()?.parse().ok()?;
    let is_pipe = |fd| {
        // SAFETY: fstat fills a zeroed struct it is given.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            libc::fstat(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFIFO
        }
    };
    // SAFETY: getpid/getpgrp read this process's own state.
    let leads = unsafe { libc::getpgrp() == libc::getpid() };
    // A user who names a process lease-reaper by hand gets the CLI.
    (leads && control != report && is_pipe(control) && is_pipe(report)).then_some((
        control,
        report,
        Duration::from_millis(patience),
    ))
}

/// The supervisor's life: reads the command, runs it, reports on it, and
/// kills the whole tree below itself when the exec's pipe closes or stays
/// silent for `patience`. Never returns.
fn supervise(control: libc::c_int, report: libc::c_int, patience: Duration) -> ! {
    // SAFETY: prctl, signal and fcntl on this process's own state and
    // descriptors.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, c"lease-reaper".as_ptr());
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1);
        // Out of the command's reach: see `keep_out_of_reach`. Set again
        // here, as a new image is dumpable; the namespace init, a fork,
        // inherits it.
        libc::prctl(libc::PR_SET_DUMPABLE, 0);
        for sig in supervisor_ignores() {
            libc::signal(sig, libc::SIG_IGN);
        }
        // Ignored SIGCHLD is inherited across exec, and makes the kernel
        // reap children unasked: the command's end would never be seen.
        libc::signal(libc::SIGCHLD, libc::SIG_DFL);
        // The command must not hold them: the exec learns of the
        // supervisor's death by its report pipe closing.
        libc::fcntl(control, libc::F_SETFD, libc::FD_CLOEXEC);
        libc::fcntl(report, libc::F_SETFD, libc::FD_CLOEXEC);
    }
    // SAFETY: both descriptors were handed to this image and are its own.
    let (mut from_exec, mut to_exec) =
        unsafe { (File::from_raw_fd(control), File::from_raw_fd(report)) };
    // The command, then the word to start it, each within the patience:
    // an exec stopped or starved meanwhile may have let its lease lapse,
    // and a command handed over late must not start in another's turn.
    let deadline = Instant::now() + patience;
    let Some(spec) = read_spec(&mut from_exec, control, deadline) else {
        // The exec is gone or stopped before the command started: nothing
        // to kill.
        std::process::exit(0)
    };
    let Some(deadline) = wait_for_go(control, Instant::now() + patience, patience) else {
        std::process::exit(0)
    };
    // With `--pid-namespace`, a PID namespace of the command's own: its
    // first process (`ns_init`) is the namespace's init, and when it dies,
    // killed or done, the kernel kills every process left in the namespace
    // at once, however fast they fork (the seventh attack outran the kill
    // that walks /proc with twenty lines of processes that each fork their
    // successor and exit). It needs CAP_SYS_ADMIN, and the command sees
    // pids of its namespace, not the host's: so it is asked for, not
    // assumed. Without it, the walk in `kill_tree` is all there is.
    if spec.pid_namespace {
        if let Err(errno) = new_pid_namespace() {
            let _ = to_exec.write_all(&Report::NoNamespace(errno).encode());
            std::process::exit(0)
        }
    }
    let (first, reports_here) = if spec.pid_namespace {
        // SAFETY: this image is single-threaded; the child runs `ns_init`,
        // which never returns.
        match unsafe { libc::fork() } {
            0 => ns_init(&spec, &mut to_exec),
            pid if pid > 0 => (pid, false),
            _ => {
                let errno = io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EAGAIN);
                let _ = to_exec.write_all(&Report::NotStarted(errno).encode());
                std::process::exit(0)
            }
        }
    } else {
        match spawn(&spec, true) {
            Ok(pid) => {
                let _ = to_exec.write_all(&Report::Started(pid).encode());
                (pid, true)
            }
            Err(e) => {
                let errno = e.raw_os_error().unwrap_or(libc::ENOENT);
                let _ = to_exec.write_all(&Report::NotStarted(errno).encode());
                std::process::exit(0)
            }
        }
    };
    let watched = if reports_here {
        Watched::Command(first)
    } else {
        Watched::NamespaceInit(first)
    };
    watch_exec(control, patience, deadline, watched, &mut to_exec);
    // SAFETY: kill(2) of our own child: as the namespace's init, its death
    // takes every process of the namespace with it.
    unsafe { libc::kill(first, libc::SIGKILL) };
    // 0 only when nothing is left: the exec, waiting for this exit, then
    // knows the command's processes are gone.
    let all_gone = kill_tree(std::process::id() as libc::pid_t, &[]);
    std::process::exit(if all_gone { 0 } else { 3 })
}

/// Makes the PID namespace the supervisor's next children are born in:
/// with CAP_SYS_ADMIN (root), one of the user namespace this process is
/// in; without, one owned by a user namespace of its own, which an
/// ordinary user may make on most Linux systems, so `--pid-namespace` is
/// not for root alone. That user namespace maps this process's uid and gid
/// to themselves and nothing else: the command runs as the same user, with
/// no capability left after its execve (its uid is not the namespace's
/// root), and a setuid program owned by another user runs as this one
/// (an unmapped owner's setuid bit is ignored). The error is the errno.
fn new_pid_namespace() -> Result<(), i32> {
    let errno = || {
        io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EPERM)
    };
    // SAFETY: unshare affects only the children this process makes next.
    if unsafe { libc::unshare(libc::CLONE_NEWPID) } == 0 {
        return Ok(());
    }
    let as_root = errno();
    if as_root != libc::EPERM {
        return Err(as_root);
    }
    // SAFETY: getters with no failure and no memory.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    // SAFETY: this image is single-threaded (unshare of a user namespace
    // needs it); the namespaces hold for this process and the children it
    // makes next.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWPID) } != 0 {
        return Err(errno());
    }
    // The maps are this process's own /proc files, which are root's while
    // it is not dumpable (`keep_out_of_reach`): dumpable for the writes
    // only, before the command exists.
    // SAFETY: prctl on this process's own attribute.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1) };
    let mapped = std::fs::write("/proc/self/setgroups", "deny")
        .and_then(|()| std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1")))
        .and_then(|()| std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1")));
    // SAFETY: as above.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0) };
    mapped.map_err(|e| e.raw_os_error().unwrap_or(libc::EPERM))
}

/// The init of the command's PID namespace, in a fork of the supervisor:
/// starts the command, reports its start, stops and end to the exec, reaps
/// the orphans that come to it, and exits when the command's first process
/// ends, which kills whatever the command left in the namespace. As init it
/// gets no signal it has no handler for (it sets none), so the exec's
/// SIGTERM to the command's processes reaches the command, not it; SIGKILL
/// from the supervisor (or the supervisor's death) ends it and the
/// namespace.
fn ns_init(spec: &Spec, to_exec: &mut File) -> ! {
    // SAFETY: prctl on this process's own state.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
    let command = match spawn(spec, false) {
        Ok(pid) => pid,
        Err(e) => {
            let errno = e.raw_os_error().unwrap_or(libc::ENOENT);
            let _ = to_exec.write_all(&Report::NotStarted(errno).encode());
            std::process::exit(0)
        }
    };
    let _ = to_exec.write_all(&Report::Started(command).encode());
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status it is given.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WUNTRACED) };
        if pid < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            std::process::exit(0)
        }
        if pid != command {
            continue;
        }
        if libc::WIFSTOPPED(status) {
            let _ = to_exec.write_all(&Report::Stopped(libc::WSTOPSIG(status)).encode());
            continue;
        }
        let _ = to_exec.write_all(&Report::Exited(status).encode());
        std::process::exit(0)
    }
}

/// Reads the command from the exec, giving up at `deadline`.
fn read_spec(from_exec: &mut File, control: libc::c_int, deadline: Instant) -> Option<Spec> {
    let mut len = [0u8; 4];
    read_by(from_exec, control, &mut len, deadline)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_SPEC {
        return None;
    }
    let mut bytes = vec![0u8; len];
    read_by(from_exec, control, &mut bytes, deadline)?;
    decode_spec(&bytes)
}

/// Fills `buf` from the exec's pipe, or None when it ends or `deadline`
/// passes first.
fn read_by(
    from_exec: &mut File,
    control: libc::c_int,
    buf: &mut [u8],
    deadline: Instant,
) -> Option<()> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.checked_duration_since(Instant::now())?;
        let mut poll = libc::pollfd {
            fd: control,
            events: libc::POLLIN,
            revents: 0,
        };
        let wait = left.as_millis().clamp(1, TICK_MS as u128) as libc::c_int;
        // SAFETY: polls one live pollfd.
        if unsafe { libc::poll(&mut poll, 1, wait) } <= 0 {
            continue;
        }
        match from_exec.read(&mut buf[got..]) {
            Ok(0) => return None,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(())
}

/// Waits for the exec's first beat after the command (the word to start
/// it) until `deadline`; the moment the command must end by, counted from
/// the beat's sending, or None if the pipe ends, the deadline passes, or
/// the beat is already older than the patience.
fn wait_for_go(control: libc::c_int, deadline: Instant, patience: Duration) -> Option<u64> {
    let mut frame = [0u8; BEAT_LEN];
    // SAFETY: the descriptor is this image's own; the File is forgotten
    // below so it is not closed twice.
    let mut pipe = unsafe { File::from_raw_fd(control) };
    let read = read_by(&mut pipe, control, &mut frame, deadline);
    std::mem::forget(pipe);
    read?;
    let ends = beat_deadline(decode_beat(&frame)?, patience);
    (monotonic_ns() < ends).then_some(ends)
}

/// Whether this process may kill any process (CAP_KILL in its effective
/// set): then its command keeps every privilege it would have.
fn may_kill_anyone() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .is_some_and(|eff| eff & (1 << 5) != 0)
    })
}

/// Starts the command in the supervisor's group (the group it is in
/// already, inherited; `join` names it from outside a namespace, where its
/// id is visible), the signals the supervisor ignores given back their
/// defaults, dying with its parent should it be killed.
fn spawn(spec: &Spec, join: bool) -> io::Result<libc::pid_t> {
    let mut cmd = std::process::Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..])
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)));
    if join {
        cmd.process_group(std::process::id() as i32);
    }
    // SAFETY: the closure runs between fork and exec in a child of this
    // single-threaded process and only makes async-signal-safe calls.
    let defaults = supervisor_ignores();
    unsafe {
        let me = libc::getpid();
        // Unless this may kill any process (CAP_KILL), the command may not
        // gain privileges: a setuid program (`sudo -u`, `su`) would
        // run on as another user, which this user's SIGKILL cannot reach,
        // past the lock (the thirteenth attack). With no_new_privs the
        // setuid bit is not honoured, and every process of the command
        // stays this user's, and killable.
        let keep_privileges = may_kill_anyone();
        cmd.pre_exec(move || {
            if !keep_privileges {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                libc::prctl(
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_CLEAR_ALL,
                    0,
                    0,
                    0,
                );
            }
            for sig in &defaults {
                libc::signal(*sig, libc::SIG_DFL);
            }
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() != me {
                libc::raise(libc::SIGKILL);
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    // Waited for with waitpid below, with every orphan that comes here.
    Ok(child.id() as libc::pid_t)
}

/// Until the exec's pipe closes or no beat sent in the last `patience`
/// has come (the first deadline is `deadline`, from the go): reaps what
/// ends below, and reports the command's stops and its end.
fn watch_exec(
    control: libc::c_int,
    patience: Duration,
    mut deadline: u64,
    watched: Watched,
    to_exec: &mut File,
) {
    let mut pending: Vec<u8> = Vec::with_capacity(BEAT_LEN * 8);
    let mut bytes = [0u8; 64];
    loop {
        let mut poll = libc::pollfd {
            fd: control,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polls one live pollfd.
        let ready = unsafe { libc::poll(&mut poll, 1, TICK_MS) };
        if ready > 0 {
            // SAFETY: reads into a live local buffer.
            let n = unsafe { libc::read(control, bytes.as_mut_ptr().cast(), bytes.len()) };
            if n == 0 {
                return; // the exec is gone
            }
            if n > 0 {
                pending.extend_from_slice(&bytes[..n as usize]);
                deadline = deadline.max(latest_deadline(&mut pending, patience));
            } else if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return;
            }
        }
        if monotonic_ns() >= deadline {
            return; // silence: the exec is stopped or hung
        }
        reap(watched, to_exec);
    }
}

/// Takes every whole beat off the front of `pending`; the latest deadline
/// they give (0 for none).
fn latest_deadline(pending: &mut Vec<u8>, patience: Duration) -> u64 {
    let whole = pending.len() / BEAT_LEN * BEAT_LEN;
    let latest = pending[..whole]
        .chunks(BEAT_LEN)
        .filter_map(decode_beat)
        .map(|sent| beat_deadline(sent, patience))
        .max()
        .unwrap_or(0);
    pending.drain(..whole);
    latest
}

/// The supervisor's child: the command itself, or the init of the
/// command's PID namespace, which tells the exec of the command itself.
#[derive(Clone, Copy)]
enum Watched {
    Command(libc::pid_t),
    NamespaceInit(libc::pid_t),
}

/// Reaps every child that changed state and tells the exec of the
/// command's. A namespace init that stopped is continued (a `pkill -STOP
/// lease-reaper` stops it too, and a stopped init tells nothing); one that
/// was killed took the command with it, and the exec is told so (one that
/// ended on its own has told the command's end itself).
fn reap(watched: Watched, to_exec: &mut File) {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status it is given.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG | libc::WUNTRACED) };
        if pid <= 0 {
            return;
        }
        let report = match watched {
            Watched::Command(c) if c == pid => Some(if libc::WIFSTOPPED(status) {
                Report::Stopped(libc::WSTOPSIG(status))
            } else {
                Report::Exited(status)
            }),
            Watched::NamespaceInit(i) if i == pid => {
                if libc::WIFSTOPPED(status) {
                    // SAFETY: kill(2) of our own child, stopped, not reaped.
                    unsafe { libc::kill(i, libc::SIGCONT) };
                    None
                } else if libc::WIFSIGNALED(status) {
                    Some(Report::Exited(status))
                } else {
                    None
                }
            }
            _ => None,
        };
        if let Some(report) = report {
            let _ = to_exec.write_all(&report.encode());
        }
    }
}

/// Kills every process below `root` but `spared` and theirs, and reaps
/// them, until `root` has no child left but `spared`: `root` is a
/// subreaper, so the orphans of those killed come to it, and no other
/// child means no other descendant. False if that took longer than
/// [`KILL_FOR`].
fn kill_tree(root: libc::pid_t, spared: &[libc::pid_t]) -> bool {
    let started = Instant::now();
    loop {
        let procs = processes();
        let mut keep: Vec<libc::pid_t> = spared.to_vec();
        for s in spared {
            keep.extend(descendants(&procs, *s));
        }
        for pid in descendants(&procs, root) {
            if !keep.contains(&pid) {
                // SAFETY: kill(2) of a process below this one.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        for pid in children_of(&procs, root) {
            if !spared.contains(&pid) {
                let mut status = 0;
                // SAFETY: waitpid writes the status it is given.
                unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            }
        }
        // With nothing spared, waitpid says whether a child is left, not
        // /proc: a process /proc did not show (however) is still a child
        // here, and is never taken for gone.
        let done = if spared.is_empty() {
            no_child_left()
        } else {
            children_of(&processes(), root)
                .into_iter()
                .all(|p| spared.contains(&p))
        };
        if done {
            return true;
        }
        if started.elapsed() >= KILL_FOR {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Reaps every child that has ended; true once this process has no child
/// at all (waitpid's ECHILD), alive or not yet reaped.
fn no_child_left() -> bool {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status it is given.
        match unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) } {
            pid if pid > 0 => continue,
            0 => return false,
            _ => return io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD),
        }
    }
}

/// SIGKILLs everything below `parent` (not `parent` itself) until nothing
/// alive is left there (a zombie is dead once its last thread is: a
/// stopped supervisor cannot reap it, and it forks nothing). False when something still lived there
/// [`KILL_FOR`] after `started`.
fn kill_below(parent: libc::pid_t, started: Instant) -> bool {
    loop {
        let procs = processes();
        let below: HashSet<libc::pid_t> = descendants(&procs, parent).into_iter().collect();
        // A zombie whose other threads live (its main thread called
        // pthread_exit) still forks: alive until its last thread is gone.
        let alive: Vec<libc::pid_t> = procs
            .iter()
            .filter(|p| below.contains(&p.pid) && (p.state != 'Z' || threads(p.pid) > 1))
            .map(|p| p.pid)
            .collect();
        if alive.is_empty() {
            return true;
        }
        for pid in alive {
            // SAFETY: kill(2) of a process below our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        if started.elapsed() >= KILL_FOR {
            return false;
        }
        std::thread::yield_now();
    }
}

/// How many threads `pid` has now (0 once it is gone).
fn threads(pid: libc::pid_t) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

/// SIGKILLs every process whose environment holds `mark` (which the
/// exec gives the command), but this one and `spared` and theirs, until
/// none is left or [`KILL_FOR`] after `started`. For an exec that is no
/// subreaper: the command's orphans go to init, out of the tree's reach,
/// but keep the mark (unless they dropped their environment).
fn kill_marked(mark: &[u8], spared: &[libc::pid_t], started: Instant) -> bool {
    // SAFETY: getpid has no failure and no memory.
    let me = unsafe { libc::getpid() };
    loop {
        let procs = processes();
        let mut keep: Vec<libc::pid_t> = spared.to_vec();
        for s in spared {
            keep.extend(descendants(&procs, *s));
        }
        let marked: Vec<libc::pid_t> = procs
            .iter()
            .filter(|p| p.pid != me && !keep.contains(&p.pid))
            .filter(|p| p.state != 'Z' || threads(p.pid) > 1)
            .filter(|p| {
                std::fs::read(format!("/proc/{}/environ", p.pid))
                    .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == mark))
            })
            .map(|p| p.pid)
            .collect();
        if marked.is_empty() {
            return true;
        }
        for pid in marked {
            // SAFETY: kill(2) of a process that carries this exec's mark.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        if started.elapsed() >= KILL_FOR {
            return false;
        }
        std::thread::yield_now();
    }
}

/// The pids whose parent is `parent`.
fn children_of(procs: &[Proc], parent: libc::pid_t) -> Vec<libc::pid_t> {
    procs
        .iter()
        .filter(|p| p.ppid == parent)
        .map(|p| p.pid)
        .collect()
}

/// One line of /proc/<pid>/stat, the fields used here.
struct Proc {
    pid: libc::pid_t,
    name: String,
    state: char,
    ppid: libc::pid_t,
    pgrp: libc::pid_t,
    tty: i64,
    tpgid: libc::pid_t,
}

/// Every process /proc shows now (those that vanish meanwhile are skipped).
fn processes() -> Vec<Proc> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter_map(|pid| {
            // Bytes, not text: the name is whatever the process set, cut at
            // 15 bytes, possibly inside a character (`backup-日本語`), and a
            // read as UTF-8 failed and hid the process and everything below
            // it from every kill (the fourteenth attack). Only what follows
            // the name is parsed, and it is ASCII.
            let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
            let close = stat.windows(2).rposition(|w| w == b") ")?;
            let (head, rest) = (&stat[..close], &stat[close + 2..]);
            let open = head
                .iter()
                .position(|&b| b == b'(')
                .map_or(head.len(), |i| i + 1);
            let name = String::from_utf8_lossy(&head[open..]).into_owned();
            let rest = std::str::from_utf8(rest).ok()?;
            // After the name: state ppid pgrp session tty_nr tpgid ...
            let f: Vec<&str> = rest.split_whitespace().take(6).collect();
            let [state, ppid, pgrp, _, tty, tpgid] = f.as_slice() else {
                return None;
            };
            Some(Proc {
                pid,
                name,
                state: state.chars().next()?,
                ppid: ppid.parse().ok()?,
                pgrp: pgrp.parse().ok()?,
                tty: tty.parse().ok()?,
                tpgid: tpgid.parse().ok()?,
            })
        })
        .collect()
}

/// The pids below `root` (not `root` itself).
fn descendants(procs: &[Proc], root: libc::pid_t) -> Vec<libc::pid_t> {
    // One pass to index children by parent, one walk down from `root`:
    // linear in the processes. A scan per member (as before) was quadratic,
    // and with 8,000 processes below it the exec's once-a-second look for
    // stopped members outlasted its heartbeats (the thirteenth attack).
    let mut children: HashMap<libc::pid_t, Vec<libc::pid_t>> = HashMap::with_capacity(procs.len());
    for p in procs {
        children.entry(p.ppid).or_default().push(p.pid);
    }
    let mut below = Vec::new();
    let mut seen = HashSet::new();
    let mut stack = vec![root];
    while let Some(parent) = stack.pop() {
        for &child in children.get(&parent).map(Vec::as_slice).unwrap_or_default() {
            // /proc is not read at one instant: a reused pid could close a
            // loop.
            if child != root && seen.insert(child) {
                below.push(child);
                stack.push(child);
            }
        }
    }
    below
}

#[cfg(test)]
mod tests {
    use super::*;

    /// From the seventh attack: the supervisor counted its patience from
    /// reading a beat, so a beat read late (the supervisor stopped or
    /// starved while the exec was stopped) gave the command a full patience
    /// more, past the lease, beside the next holder. It counts from the
    /// sending.
    #[test]
    fn a_beat_read_late_gives_the_command_no_more_time() {
        let patience = Duration::from_millis(400);
        let now = monotonic_ns();
        let stale = now - 6_000_000_000;
        let mut pending = encode_beat(stale).to_vec();
        assert!(latest_deadline(&mut pending, patience) < now);
        assert!(pending.is_empty());
        // Several beats, a half one left for the next read.
        let mut pending = encode_beat(stale).to_vec();
        pending.extend(encode_beat(now));
        pending.extend(&encode_beat(now)[..4]);
        assert_eq!(
            latest_deadline(&mut pending, patience),
            beat_deadline(now, patience)
        );
        assert_eq!(pending.len(), 4);
        assert_eq!(decode_beat(&[1, 0, 0, 0, 0, 0, 0, 0, 0]), None);
    }

    #[test]
    fn reports_decode_to_what_was_encoded() {
        for r in [
            Report::Started(4242),
            Report::NotStarted(libc::ENOENT),
            Report::Stopped(libc::SIGTTIN),
            Report::Exited(-1),
            Report::NoNamespace(libc::EPERM),
        ] {
            assert_eq!(Report::decode(r.encode()), Some(r));
        }
        assert_eq!(Report::decode([9, 0, 0, 0, 0]), None);
    }

    fn proc(pid: libc::pid_t, ppid: libc::pid_t) -> Proc {
        Proc {
            pid,
            name: String::new(),
            state: 'S',
            ppid,
            pgrp: 0,
            tty: 0,
            tpgid: 0,
        }
    }

    /// Everything below the root, however deep or wide, and nothing else;
    /// a loop that a reused pid could make between two reads of /proc ends.
    #[test]
    fn descendants_are_the_whole_subtree_and_only_it() {
        // 1 -> a chain 2..=5000 -> a fan of 5001..=9000 under 5000; 9001
        // and 9002 elsewhere, 9003 and 9004 each the other's parent.
        let mut procs = vec![proc(1, 0), proc(9001, 0), proc(9002, 9001)];
        procs.extend((2..=5000).map(|p| proc(p, p - 1)));
        procs.extend((5001..=9000).map(|p| proc(p, 5000)));
        procs.extend([proc(9003, 9004), proc(9004, 9003)]);
        let mut below = descendants(&procs, 1);
        below.sort_unstable();
        assert_eq!(below, (2..=9000).collect::<Vec<_>>());
        let mut looped = descendants(&procs, 9003);
        looped.sort_unstable();
        assert_eq!(looped, vec![9004]);
    }

    #[test]
    fn a_command_and_its_environment_cross_the_pipe_whole() {
        let argv = vec![
            "sh".to_owned(),
            "-c".to_owned(),
            "echo 'a=b' \"\"".to_owned(),
            String::new(),
        ];
        let env = vec![
            (OsString::from("A"), OsString::from("x=y")),
            (OsString::from("EMPTY"), OsString::new()),
        ];
        let spec = decode_spec(&encode_spec(&argv, &env, true)).expect("decodes");
        assert!(spec.pid_namespace);
        let given: Vec<OsString> = argv.iter().map(OsString::from).collect();
        assert_eq!(spec.argv, given, "empty arguments kept");
        assert_eq!(spec.env, env);
        assert_eq!(decode_spec(b""), None, "no command");
        assert_eq!(decode_spec(b"Xjunk\0"), None);
    }
}
