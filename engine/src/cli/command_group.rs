//! The process group an exec's command runs in, and the reaper that ends
//! it when the exec cannot.
//!
//! Why a reaper: `lock exec` promises that nothing the command started runs
//! on once the lock goes back. While the exec lives it kills the group
//! itself; a kill -9 of the exec gives it no chance, and `PR_SET_PDEATHSIG`
//! reaches only the direct child, not what that child left running in the
//! background. So before the command starts, the exec forks a reaper that
//! leads a new process group (the command joins it) and blocks reading a
//! pipe only the exec holds. When the exec dies, however it dies, the
//! kernel closes the pipe, the read returns, and the reaper kills its own
//! group, itself and everything the command left. Its reaction is a context
//! switch, far inside the lease that must run out before anyone else holds
//! the lock. (A child subreaper would not do: it is the exec itself, and it
//! dies with the kill -9.)
//!
//! The reaper is also a dead man's switch: the exec writes a byte to the
//! pipe every tenth of the lease, and a reaper that hears nothing for 2/5
//! of the lease kills the group. An exec that is stopped (SIGSTOP, Ctrl-Z) or
//! hung cannot renew its lease, and its command must not run on into the
//! next holder's turn: the group dies before the lease can run out. A
//! reaper that is killed on its own is replaced at the next heartbeat, and
//! one that is stopped on its own is continued at the next heartbeat.
//!
//! Why the reaper execs itself again, as `lease-reaper`: a forked child
//! shares the exec's command line, so `pkill -STOP -f 'lock exec'` stopped
//! both, and a stopped reaper kills nothing. Run anew from
//! `/proc/self/exe` under a name and command line of its own (neither says
//! `flashsale` nor `lock exec`), it is stopped only when aimed at. If that
//! exec fails it reaps as the forked child, as before.
//!
//! What a process group cannot hold: a command that leaves it on purpose
//! (`setsid`, `setpgid`) is out of reach, as it is of `timeout(1)`; and a
//! kill -9 of both the exec and its reaper at once leaves the group alone.
//!
//! Why the terminal stays with the exec: the command's group is never the
//! terminal's foreground, so job control is the shell's, on the exec (Ctrl-Z
//! stops the exec and the shell gets its prompt; a stopped exec renews
//! nothing, so the reaper ends the command within 2/5 of the lease; Ctrl-C
//! reaches the exec, which stops the command). A command that reads (or,
//! with `tostop`, writes) the terminal is stopped by SIGTTIN/SIGTTOU; the
//! exec sees the stop and ends it with a clear error rather than hold the
//! lock for a command that waits for ever. (Handing the terminal to the
//! command's group was tried first: three holes in a row, in Ctrl-Z from a
//! wrapper script, `bg`/`fg`, and stops the exec never saw, so the design
//! was replaced, not patched again.)
//!
//! A wrapper hides a terminal stop from the exec (`sh -c 'cat; ...'`,
//! `timeout --foreground`, `su`): the process that reads is a grandchild,
//! and the direct child waits, running. So the exec also looks through its
//! group for a process stopped while the terminal serves another group
//! ([`CommandGroup::scan`]) and ends the command once it has stayed
//! stopped for a few seconds.
//!
//! A command's process may make a group of its own (`timeout(1)` does, for
//! its command): the same scan adopts every group a descendant of the
//! command leads, signals and kills it with the command's, and tells the
//! reaper, which kills it too should the exec die. A group left empty is
//! forgotten by both (its id may be reused). What a descendant starts in a
//! group it made after the exec died, or in a new session it leads
//! (`setsid`), stays out of reach.
//!
//! The exec beats only while the grant's lease outlasts the reaper's
//! patience (see `lock_exec::may_beat`): a reaper counting from the last
//! beat then always ends the command before the lease can end, however late
//! the renewals run.
//!
//! Never allocates or takes a lock between fork and exec (or the reaper's
//! end): the forked child of a multi-threaded process may only make
//! async-signal-safe calls.

use std::ffi::{CString, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

/// A process group led by a reaper; dropped, it is killed whole.
pub struct CommandGroup {
    /// The first reaper's pid, which is the group's id.
    pgid: libc::pid_t,
    /// The reaper now (another when one was killed and replaced).
    reaper: libc::pid_t,
    /// The write end of the reaper's pipe: open as long as the exec lives.
    alive: libc::c_int,
    /// How long the reaper waits for a heartbeat (ms).
    patience_ms: libc::c_int,
    /// When the reaper last heard from the exec.
    last_beat: std::time::Instant,
    /// The exec was silent longer than the reaper waits (it was stopped or
    /// starved): the group may have been killed and the lease may have run
    /// out under it.
    lapsed: bool,
    ended: bool,
    /// Groups the command's processes made of their own, killed with it.
    escaped: Vec<libc::pid_t>,
    /// The command's pid, once spawned.
    command: Option<libc::pid_t>,
}

/// Highest descriptor the reaper closes (it keeps only its pipe).
const MAX_FD: libc::c_int = 4096;

/// The reaper's name (argv[0] and comm) once it has exec'd itself anew.
const REAPER_NAME: &str = "lease-reaper";

/// The environment variable that carries the reaper's group to the new
/// image: with the name, it tells a reaper from a user's command line.
const REAPER_ENV: &str = "FLASHSALE_LEASE_REAPER_GROUP";

/// A process of the command's group found stopped while the terminal
/// serves another group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoppedMember {
    pub pid: libc::pid_t,
    pub name: String,
}

/// What a scan of the command's processes found.
pub struct Scan {
    /// A process stopped while the terminal serves another group.
    pub stopped: Option<StoppedMember>,
}

/// Pipe message: the exec lives (one byte).
const MESSAGE_BEAT: u8 = 1;
/// Pipe message: kill this group too (the byte, then the pgid, 4 bytes LE).
const MESSAGE_GROUP: u8 = 2;
/// Pipe message: forget this group (the byte, then the pgid, 4 bytes LE).
const MESSAGE_FORGET: u8 = 3;
/// Most groups of its own a command may make and still be followed.
const MAX_ESCAPED: usize = 64;

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
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (head, rest) = stat.rsplit_once(") ")?;
            let name = head.split_once(" (").map_or("", |(_, n)| n).to_owned();
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

/// The groups that descendants of `command` (itself included) lead, other
/// than `group`: made by the command's own processes, so theirs to kill.
/// A group a descendant merely joined (its leader no descendant) is never
/// taken: it may be the exec's caller's.
fn escaped_groups(procs: &[Proc], command: libc::pid_t, group: libc::pid_t) -> Vec<libc::pid_t> {
    let mut family = vec![command];
    let mut i = 0;
    while i < family.len() {
        let parent = family[i];
        family.extend(procs.iter().filter(|p| p.ppid == parent).map(|p| p.pid));
        i += 1;
    }
    procs
        .iter()
        .filter(|p| family.contains(&p.pid) && p.pgrp != group && family.contains(&p.pgrp))
        .map(|p| p.pgrp)
        .collect()
}

impl CommandGroup {
    /// Forks the reaper and makes its group; the command joins it with
    /// [`CommandGroup::pgid`]. `lease` is the grant's: the group is killed
    /// when the exec has not been heard from for 2/5 of it.
    pub fn start(lease: Duration) -> io::Result<CommandGroup> {
        // Two fifths of the lease: the exec beats only while the lease
        // outlasts the patience by a fifth of it (`lock_exec::may_beat`),
        // and a lease just before its renewal (due a third of the way in)
        // still has about two thirds left, which clears that bar with room.
        let patience_ms = libc::c_int::try_from((lease * 2 / 5).as_millis())
            .unwrap_or(libc::c_int::MAX)
            .max(10);
        let (reaper, alive) = spawn_reaper(None, patience_ms)?;
        let group = CommandGroup {
            pgid: reaper,
            reaper,
            alive,
            patience_ms,
            last_beat: std::time::Instant::now(),
            lapsed: false,
            ended: false,
            escaped: Vec::new(),
            command: None,
        };
        Ok(group)
    }

    /// How often the exec calls [`CommandGroup::beat`]: a quarter of the
    /// reaper's patience, so beats skipped while a renewal is late
    /// ([`super::lock_exec`]) do not leave the reaper silent for its whole
    /// patience when the renewal then lands.
    pub fn heartbeat_every(&self) -> Duration {
        Duration::from_millis(u64::try_from(self.patience_ms / 4).unwrap_or(5).max(5))
    }

    /// How long the reaper waits for a heartbeat.
    pub fn patience(&self) -> Duration {
        Duration::from_millis(u64::try_from(self.patience_ms).unwrap_or(0))
    }

    /// Tells the reaper the exec lives; replaces a reaper that is gone.
    pub fn beat(&mut self) {
        if self.ended {
            return;
        }
        let silent = self.last_beat.elapsed();
        self.last_beat = std::time::Instant::now();
        if silent.as_millis() >= u128::from(self.patience_ms.unsigned_abs()) {
            self.lapsed = true;
        }
        // A reaper stopped on its own (kill -STOP of its pid) kills nothing:
        // go on. SIGCONT to a running process changes nothing.
        // SAFETY: kill(2) of our own child, not yet waited for.
        unsafe { libc::kill(self.reaper, libc::SIGCONT) };
        let byte = MESSAGE_BEAT;
        // SAFETY: writes one byte from a live local to a descriptor we own.
        let n = unsafe { libc::write(self.alive, (&byte as *const u8).cast(), 1) };
        if n == 1 {
            return;
        }
        // The reaper is gone (killed on its own): reap it, and start another
        // in the same group while the command still runs in it.
        let mut status = 0;
        // SAFETY: waits without blocking for our own child.
        unsafe { libc::waitpid(self.reaper, &mut status, libc::WNOHANG) };
        if let Ok((reaper, alive)) = spawn_reaper(Some(self.pgid), self.patience_ms) {
            close(self.alive);
            self.reaper = reaper;
            self.alive = alive;
            for group in self.escaped.clone() {
                self.tell_reaper(MESSAGE_GROUP, group);
            }
        }
    }

    /// The signal that stopped the command (`pid`, the group's first
    /// process), if it is stopped. Leaves the stop to be seen again, and
    /// the child's end to tokio.
    pub fn stopped_by(&self, pid: u32) -> Option<libc::c_int> {
        // SAFETY: waitid fills the zeroed siginfo it is given; WNOWAIT
        // leaves the child's state for whoever waits for it.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let r = libc::waitid(
                libc::P_PID,
                pid,
                &mut info,
                libc::WSTOPPED | libc::WNOHANG | libc::WNOWAIT,
            );
            (r == 0 && info.si_pid() != 0).then(|| info.si_status())
        }
    }

    /// Looks through the command's processes (one /proc scan, so the exec
    /// does it about once a second, not at every heartbeat):
    ///
    /// - adopts each group a descendant of `command` made of its own
    ///   (`timeout(1)` calls `setpgid` for its command): from now on it is
    ///   signalled and killed with the command's, by the exec and, should
    ///   the exec die, by the reaper, which is told of it;
    /// - returns a process of the command's groups (other than the reaper)
    ///   that is stopped while its controlling terminal serves another
    ///   group: stopped by a terminal read or write (the group is never the
    ///   terminal's), or by a SIGSTOP nobody may undo.
    pub fn scan(&mut self) -> Scan {
        let procs = processes();
        let command = self.command;
        // A group left empty is forgotten: its id may come back as another's.
        let gone: Vec<libc::pid_t> = self
            .escaped
            .iter()
            .copied()
            .filter(|g| !procs.iter().any(|p| p.pgrp == *g))
            .collect();
        for group in gone {
            self.escaped.retain(|g| *g != group);
            self.tell_reaper(MESSAGE_FORGET, group);
        }
        if let Some(command) = command {
            for group in escaped_groups(&procs, command, self.pgid) {
                if !self.escaped.contains(&group) && self.escaped.len() < MAX_ESCAPED {
                    self.escaped.push(group);
                    self.tell_reaper(MESSAGE_GROUP, group);
                }
            }
        }
        let stopped = procs
            .iter()
            .filter(|p| p.pid != self.reaper)
            .filter(|p| p.pgrp == self.pgid || self.escaped.contains(&p.pgrp))
            .find(|p| p.state == 'T' && p.tty != 0 && p.tpgid != p.pgrp)
            .map(|p| StoppedMember {
                pid: p.pid,
                name: p.name.clone(),
            });
        Scan { stopped }
    }

    /// Tells the reaper of a group to kill with its own, or to forget.
    fn tell_reaper(&self, kind: u8, group: libc::pid_t) {
        let mut message = [0u8; 5];
        message[0] = kind;
        message[1..].copy_from_slice(&group.to_le_bytes());
        // SAFETY: writes a live local buffer to a descriptor we own; five
        // bytes are below PIPE_BUF, so the write is whole or nothing.
        unsafe { libc::write(self.alive, message.as_ptr().cast(), message.len()) };
    }

    /// Whether the exec was ever silent longer than the reaper waits: the
    /// command cannot be known to have run under a live lease throughout.
    pub fn lapsed(&self) -> bool {
        let patience = u128::from(self.patience_ms.unsigned_abs());
        self.lapsed || self.last_beat.elapsed().as_millis() >= patience
    }

    /// The group the command must join.
    pub fn pgid(&self) -> libc::pid_t {
        self.pgid
    }

    /// Names the command (the group's first process) whose descendants'
    /// own groups [`CommandGroup::scan`] adopts.
    pub fn set_command(&mut self, pid: Option<u32>) {
        self.command = pid.and_then(|p| libc::pid_t::try_from(p).ok());
    }

    /// Sends `sig` to the whole group (the reaper ignores all but SIGKILL)
    /// and to the groups the command made of its own, looked for once more
    /// first: one made since the last scan is not missed.
    pub fn signal(&mut self, sig: libc::c_int) {
        if !self.ended {
            self.scan();
        }
        self.signal_known(sig);
    }

    fn signal_known(&self, sig: libc::c_int) {
        // SAFETY: kill(2) of groups we made or the command's processes
        // made; no memory is involved.
        unsafe {
            for group in &self.escaped {
                libc::kill(-*group, sig);
            }
            libc::kill(-self.pgid, sig);
        }
    }

    /// Kills whatever is left of the group, the reaper with it, and waits
    /// for the reaper. Done before the grant goes back, on every path.
    pub fn end(mut self) {
        self.end_now();
    }

    fn end_now(&mut self) {
        if self.ended {
            return;
        }
        self.scan();
        self.ended = true;
        self.signal_known(libc::SIGKILL);
        let mut status = 0;
        // SAFETY: waits for our own child, the reaper, which SIGKILL ends.
        while unsafe { libc::waitpid(self.reaper, &mut status, 0) } < 0
            && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
        {}
        close(self.alive);
    }
}

impl Drop for CommandGroup {
    fn drop(&mut self) {
        self.end_now();
    }
}

/// Forks a reaper that leads a new group (`join` None) or joins the group
/// `join`, and waits `patience_ms` for each heartbeat; returns its pid and
/// the write end of its pipe.
fn spawn_reaper(
    join: Option<libc::pid_t>,
    patience_ms: libc::c_int,
) -> io::Result<(libc::pid_t, libc::c_int)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let [watch, alive] = fds;
    // Everything the child's exec needs is made here: it may not allocate.
    let image = ReaperImage::new(watch, join, patience_ms);
    // SAFETY: the child runs only `reap`, which makes async-signal-safe
    // calls and never returns; the parent goes on as before.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let e = io::Error::last_os_error();
        close(watch);
        close(alive);
        return Err(e);
    }
    if pid == 0 {
        reap(watch, join.unwrap_or(0), patience_ms, image.as_ref());
    }
    close(watch);
    // Both sides set the group (as a shell does), so it exists before the
    // command is spawned into it whichever runs first.
    // SAFETY: setpgid on our own child.
    unsafe { libc::setpgid(pid, join.unwrap_or(pid)) };
    Ok((pid, alive))
}

fn close(fd: libc::c_int) {
    // SAFETY: closes a descriptor this module opened.
    unsafe { libc::close(fd) };
}

/// The command line and environment of the reaper's new image, made
/// before the fork: argv `lease-reaper <pipe fd> <patience ms>` and the
/// group in [`REAPER_ENV`].
struct ReaperImage {
    _strings: [CString; 4],
    argv: [*const libc::c_char; 4],
    envp: [*const libc::c_char; 2],
}

impl ReaperImage {
    fn new(
        watch: libc::c_int,
        join: Option<libc::pid_t>,
        patience_ms: libc::c_int,
    ) -> Option<Self> {
        // The group is the reaper's own pid when it leads one: not known
        // before the fork, so 0 stands for "my own pid".
        let strings = [
            CString::new(REAPER_NAME).ok()?,
            CString::new(watch.to_string()).ok()?,
            CString::new(patience_ms.to_string()).ok()?,
            CString::new(format!("{REAPER_ENV}={}", join.unwrap_or(0))).ok()?,
        ];
        let argv = [
            strings[0].as_ptr(),
            strings[1].as_ptr(),
            strings[2].as_ptr(),
            std::ptr::null(),
        ];
        let envp = [strings[3].as_ptr(), std::ptr::null()];
        Some(ReaperImage {
            _strings: strings,
            argv,
            envp,
        })
    }
}

/// The reaper's new image: called first thing in `main`. Returns (run the
/// CLI) unless this process was started as a reaper by [`spawn_reaper`]:
/// named [`REAPER_NAME`], given its group in [`REAPER_ENV`], in that group,
/// and watching a pipe; then it reaps and never returns.
pub fn run_if_reaper() {
    if let Some((watch, patience)) = reaper_args() {
        // SAFETY: prctl names this process (comm); the pointer outlives it.
        unsafe { libc::prctl(libc::PR_SET_NAME, c"lease-reaper".as_ptr()) };
        watch_then_kill(watch, patience)
    }
}

/// The pipe and patience of a process started as a reaper, or None.
fn reaper_args() -> Option<(libc::c_int, libc::c_int)> {
    let args: Vec<OsString> = std::env::args_os().collect();
    let [name, watch, patience] = args.as_slice() else {
        return None;
    };
    if name.as_bytes() != REAPER_NAME.as_bytes() {
        return None;
    }
    let group: libc::pid_t = std::env::var(REAPER_ENV).ok()?.parse().ok()?;
    let watch: libc::c_int = watch.to_str()?.parse().ok()?;
    let patience: libc::c_int = patience.to_str()?.parse().ok()?;
    // SAFETY: getpid/getpgrp/fstat read this process's own state into a
    // zeroed struct.
    let (me, pgrp, is_pipe) = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        let fifo = libc::fstat(watch, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFIFO;
        (libc::getpid(), libc::getpgrp(), fifo)
    };
    // A user who names a process lease-reaper by hand gets the CLI, not a
    // kill of their own group.
    let expected = if group == 0 { me } else { group };
    (pgrp == expected && pgrp != 0 && is_pipe).then_some((watch, patience))
}

/// The reaper, in the forked child: leads its own group (or joins `join`),
/// ignores the signals meant for the command or the exec, keeps only its
/// pipe, and execs itself anew as `lease-reaper` (see the module's comment);
/// if that fails, reaps here. Async-signal-safe calls only.
fn reap(
    watch: libc::c_int,
    join: libc::pid_t,
    patience_ms: libc::c_int,
    image: Option<&ReaperImage>,
) -> ! {
    // SAFETY: async-signal-safe calls on this process's own state only.
    unsafe {
        // A name of its own (comm) at once, in case the exec below fails:
        // `killall -STOP flashsale` aimed at the exec must not stop it.
        libc::prctl(libc::PR_SET_NAME, c"lease-reaper".as_ptr());
        // A group to join that is gone (its command left it and the first
        // reaper was killed) leaves nothing to kill: never fall back to the
        // exec's own group, whose kill would take the exec's caller.
        if libc::setpgid(0, join) != 0 {
            libc::_exit(0);
        }
        for sig in [
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGPIPE,
            libc::SIGTSTP,
            libc::SIGTTIN,
            libc::SIGTTOU,
        ] {
            libc::signal(sig, libc::SIG_IGN);
        }
        // Everything else the exec had open (its connections, the write end
        // of this very pipe, its terminal) is the exec's, not the reaper's.
        for fd in 0..MAX_FD {
            if fd != watch {
                libc::close(fd);
            }
        }
        if let Some(image) = image {
            // The pipe must outlive the exec; ignored signals stay ignored.
            libc::fcntl(watch, libc::F_SETFD, 0);
            libc::execve(
                c"/proc/self/exe".as_ptr(),
                image.argv.as_ptr(),
                image.envp.as_ptr(),
            );
        }
    }
    watch_then_kill(watch, patience_ms)
}

/// Blocks on the pipe; kills the caller's group when it closes (the exec
/// is gone) or stays silent for `patience_ms` (the exec is stopped or
/// hung). Async-signal-safe calls only.
fn watch_then_kill(watch: libc::c_int, patience_ms: libc::c_int) -> ! {
    // Groups the command made of its own, told by the exec: a fixed array,
    // since the forked reaper may not allocate.
    let mut escaped = [0 as libc::pid_t; MAX_ESCAPED];
    let mut known = 0;
    // SAFETY: async-signal-safe calls on this process's own state only.
    unsafe {
        let mut byte = 0u8;
        let mut poll = libc::pollfd {
            fd: watch,
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            let ready = libc::poll(&mut poll, 1, patience_ms);
            if ready == 0 {
                break; // silence: the exec is stopped or hung
            }
            if ready < 0 {
                if *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                break;
            }
            let n = libc::read(watch, (&mut byte as *mut u8).cast(), 1);
            if n > 0 {
                if byte == MESSAGE_GROUP || byte == MESSAGE_FORGET {
                    let Some(group) = read_group(watch) else {
                        break;
                    };
                    if byte == MESSAGE_FORGET {
                        for g in escaped[..known].iter_mut().filter(|g| **g == group) {
                            *g = 0;
                        }
                    } else if let Some(free) = escaped[..known].iter_mut().find(|g| **g == 0) {
                        *free = group;
                    } else if known < MAX_ESCAPED {
                        escaped[known] = group;
                        known += 1;
                    }
                }
                continue;
            }
            if n < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            }
            break; // end of file: the exec is gone
        }
        for group in &escaped[..known] {
            if *group > 1 {
                libc::kill(-*group, libc::SIGKILL);
            }
        }
        libc::kill(0, libc::SIGKILL);
        libc::_exit(0);
    }
}

/// The pgid after a [`MESSAGE_GROUP`] byte (written whole with it), or None
/// when the pipe ends. Async-signal-safe.
fn read_group(watch: libc::c_int) -> Option<libc::pid_t> {
    let mut bytes = [0u8; 4];
    let mut got = 0;
    while got < bytes.len() {
        // SAFETY: reads into the rest of a live local buffer.
        let n = unsafe { libc::read(watch, bytes[got..].as_mut_ptr().cast(), bytes.len() - got) };
        if n > 0 {
            got += n as usize;
        } else if n < 0 && unsafe { *libc::__errno_location() } == libc::EINTR {
            continue;
        } else {
            return None;
        }
    }
    Some(libc::pid_t::from_le_bytes(bytes))
}
