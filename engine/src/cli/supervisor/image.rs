//! The supervisor's own image: the process `lock exec` forks and runs
//! anew from `/proc/self/exe` (see the module above for why), which starts
//! the command, watches the exec's heartbeat and ends the command's whole
//! tree when the exec dies or goes silent.
//!
//! Why a file of its own: it is another process, single-threaded, with
//! its own rules (async-signal-safe calls only between fork and exec);
//! nothing here runs in the exec.

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use super::namespace::{new_pid_namespace, NoNamespace, UserNamespace};
use super::privileges::{
    dies_with_parent, drop_bounding_set, empty_capability_sets, forbid_typing_into_terminals,
    may_kill_anyone, Privileges,
};
use super::process_tree::kill_tree;
use super::run_as::Identity;
use super::wire::{
    beat_deadline, decode_beat, decode_spec, monotonic_ns, PidNamespace, Report, Spec, BEAT_LEN,
    MAX_SPEC, SUPERVISOR_ENV, SUPERVISOR_NAME,
};

/// Highest descriptor closed before the supervisor's new image.
pub(super) const MAX_FD: libc::c_int = 4096;

/// How often the supervisor looks at its child when no byte comes.
pub(super) const TICK_MS: libc::c_int = 20;

/// The signals the supervisor ignores (they are meant for the exec or the
/// command: a terminal's, a pipe's), and that the command gets back.
pub(super) const IGNORED: [libc::c_int; 8] = [
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
/// process can ignore. A signal meant for the command (log rotation's
/// SIGUSR1, a checkpoint's SIGXCPU) is the command's business, should one
/// reach the supervisor; a fault of the supervisor's own (SIGSEGV)
/// still ends it, since the kernel does not let a fault be ignored. The
/// command gets them all back at their defaults.
pub(super) fn supervisor_ignores() -> Vec<libc::c_int> {
    let kept = [libc::SIGKILL, libc::SIGSTOP, libc::SIGCHLD, libc::SIGCONT];
    (1..=libc::SIGRTMAX())
        .filter(|sig| !kept.contains(sig))
        .collect()
}

/// Makes this process not dumpable, so its /proc entries belong to root:
/// the command runs as this user, and could otherwise open the pipes to
/// the supervisor through `/proc/<pid>/fd/<n>`, forge a heartbeat stamped
/// far ahead and hold the pipe open, and run on past the lock after a
/// kill -9 of the exec (the seventeenth attack). The supervisor does the
/// same in its own image; the command gets dumpable back at its execve. A
/// command running as root reaches them anyway: no process can keep root
/// out.
pub(super) fn keep_out_of_reach() -> io::Result<()> {
    // SAFETY: prctl on this process's own attribute.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The command line and environment of the supervisor's new image, made
/// before the fork: argv `lease-reaper <control fd> <report fd> <patience
/// ms>`, and [`SUPERVISOR_ENV`].
pub(super) struct SupervisorImage {
    _strings: [CString; 5],
    argv: [*const libc::c_char; 5],
    envp: [*const libc::c_char; 2],
}

impl SupervisorImage {
    pub(super) fn new(
        control: libc::c_int,
        report: libc::c_int,
        patience_ms: libc::c_int,
    ) -> Option<Self> {
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
pub(super) fn become_supervisor(
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
pub(super) fn supervisor_args() -> Option<(libc::c_int, libc::c_int, Duration)> {
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
pub(super) fn supervise(control: libc::c_int, report: libc::c_int, patience: Duration) -> ! {
    // SAFETY: prctl, signal and fcntl on this process's own state and
    // descriptors.
    let held = unsafe {
        libc::prctl(libc::PR_SET_NAME, c"lease-reaper".as_ptr());
        // Both checked: without either, the command may not run (an
        // orphan would go to init, out of the kill's reach; the pipes
        // would be the command's to forge).
        let held = libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) == 0
        // Out of the command's reach: see `keep_out_of_reach`. Set again
        // here, as a new image is dumpable; the namespace init, a fork,
        // inherits it.
            && libc::prctl(libc::PR_SET_DUMPABLE, 0) == 0;
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
        held
    };
    // SAFETY: both descriptors were handed to this image and are its own.
    let (mut from_exec, mut to_exec) =
        unsafe { (File::from_raw_fd(control), File::from_raw_fd(report)) };
    if !held {
        let errno = io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EPERM);
        let _ = to_exec.write_all(&Report::NotStarted(errno).encode());
        std::process::exit(0)
    }
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
    // A PID namespace of the command's own, unless `--no-pid-namespace`:
    // its first process (`ns_init`) is the namespace's init, and when it
    // dies, killed or done, the kernel kills every process left in the
    // namespace at once, however fast they fork (the seventh attack outran
    // the kill that walks /proc with twenty lines of processes that each
    // fork their successor and exit), and reads nothing a command could
    // blind (the twentieth limited the walkers to one descriptor). The
    // default since then, where one can be made; without one, the walk in
    // `kill_tree` is all there is, and the exec says so.
    // Decided here, by this process's own privileges: inside a user
    // namespace of its own (`new_pid_namespace`) it holds every capability,
    // which would wrongly let the command keep them all (the nineteenth
    // attack).
    let mut privileges = if may_kill_anyone() {
        Privileges::Keep
    } else {
        Privileges::NoNew
    };
    let mut in_namespace = false;
    if spec.pid_namespace != PidNamespace::Never {
        match new_pid_namespace() {
            // None was made, and none was required: the walk, said so.
            Err(NoNamespace::Refused(errno)) if spec.pid_namespace == PidNamespace::Prefer => {
                let _ = to_exec.write_all(&Report::Walked(errno).encode());
            }
            // Required, or half made (a user namespace without its maps,
            // whose next child would be a new namespace's init): no command.
            Err(NoNamespace::Refused(errno) | NoNamespace::HalfMade(errno)) => {
                let _ = to_exec.write_all(&Report::NoNamespace(errno).encode());
                std::process::exit(0)
            }
            Ok(UserNamespace::Own) => {
                privileges = Privileges::None;
                in_namespace = true;
            }
            Ok(UserNamespace::Caller) => in_namespace = true,
        }
    }
    let (first, reports_here) = if in_namespace {
        // SAFETY: this image is single-threaded; the child runs `ns_init`,
        // which never returns.
        match unsafe { libc::fork() } {
            0 => ns_init(&spec, privileges, &mut to_exec),
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
        match spawn(&spec, privileges) {
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
    let all_gone = kill_tree(std::process::id() as libc::pid_t, &[]).is_ok();
    std::process::exit(if all_gone { 0 } else { 3 })
}

/// The init of the command's PID namespace, in a fork of the supervisor:
/// starts the command, reports its start, stops and end to the exec, reaps
/// the orphans that come to it, and exits when the command's first process
/// ends, which kills whatever the command left in the namespace. As init it
/// gets no signal it has no handler for (it sets none), so the exec's
/// SIGTERM to the command's processes reaches the command, not it; SIGKILL
/// from the supervisor (or the supervisor's death) ends it and the
/// namespace.
pub(super) fn ns_init(spec: &Spec, privileges: Privileges, to_exec: &mut File) -> ! {
    // Checked, not assumed: a filter that makes prctl succeed doing
    // nothing (the twentieth attack) would leave the namespace alive after
    // the supervisor's death.
    if !dies_with_parent() {
        let _ = to_exec.write_all(&Report::NotStarted(libc::EPERM).encode());
        std::process::exit(0)
    }
    // The first process of a new PID namespace is its pid 1. Anything else
    // means `unshare` said yes and made nothing (a filter that fakes it,
    // the twenty-second attack): the command would run in no namespace at
    // all, ended by no kernel, while the exec believed otherwise.
    // SAFETY: getpid has no failure and no memory.
    if unsafe { libc::getpid() } != 1 {
        let _ = to_exec.write_all(&Report::NoNamespace(libc::ENOSYS).encode());
        std::process::exit(0)
    }
    let command = match spawn(spec, privileges) {
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
pub(super) fn read_spec(
    from_exec: &mut File,
    control: libc::c_int,
    deadline: Instant,
) -> Option<Spec> {
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
pub(super) fn read_by(
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
pub(super) fn wait_for_go(
    control: libc::c_int,
    deadline: Instant,
    patience: Duration,
) -> Option<u64> {
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

/// Starts the command as the leader of a process group of its own, the
/// signals the supervisor ignores given back their defaults, dying with
/// its parent should it be killed. Not in the supervisor's group: a command
/// that stops its own group (`kill(0, SIGSTOP)`) stopped its supervisor
/// with it, and, with the exec stopped or killed, nothing was left to end
/// it (the twenty-second attack). Unless `privileges`
/// says keep (the supervisor may kill any process, CAP_KILL, judged before
/// any namespace of its own), the command may not gain privileges: a
/// setuid program (`sudo -u`, `su`) would run on as another user, which
/// this user's SIGKILL cannot reach, past the lock (the thirteenth attack).
/// With no_new_privs the setuid bit is not honoured, and every process of
/// the command stays this user's, and killable. Run as another user
/// (`--user`), the command drops every capability, bounding set first,
/// switches user, and gets no_new_privs whatever `privileges` says: a
/// setuid-root program must not take it back to root. A step that fails
/// (one a seccomp filter refused) fails the start: the command does not
/// run.
pub(super) fn spawn(spec: &Spec, privileges: Privileges) -> io::Result<libc::pid_t> {
    let run_as = spec.run_as.clone();
    let privileges = match run_as {
        Some(_) => Privileges::NoNew,
        None => privileges,
    };
    let mut cmd = std::process::Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..])
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .process_group(0);
    // SAFETY: the closure runs between fork and exec in a child of this
    // single-threaded process and only makes async-signal-safe calls.
    let defaults = supervisor_ignores();
    unsafe {
        let me = libc::getpid();
        cmd.pre_exec(move || {
            let refused = || io::Error::from_raw_os_error(libc::EPERM);
            if let Some(ids) = &run_as {
                if !(drop_bounding_set()
                    && ids.switch()
                    && empty_capability_sets()
                    && ids.holds()
                    && Identity::leave_the_caller_s_keys_and_descriptors())
                {
                    return Err(refused());
                }
            }
            if !privileges.shed() || !forbid_typing_into_terminals() {
                return Err(refused());
            }
            for sig in &defaults {
                libc::signal(*sig, libc::SIG_DFL);
            }
            if !dies_with_parent() {
                return Err(refused());
            }
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
pub(super) fn watch_exec(
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
pub(super) fn latest_deadline(pending: &mut Vec<u8>, patience: Duration) -> u64 {
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
pub(super) enum Watched {
    Command(libc::pid_t),
    NamespaceInit(libc::pid_t),
}

/// Reaps every child that changed state and tells the exec of the
/// command's. A namespace init that stopped is continued (a `pkill -STOP
/// lease-reaper` stops it too, and a stopped init tells nothing); one that
/// was killed took the command with it, and the exec is told so (one that
/// ended on its own has told the command's end itself).
pub(super) fn reap(watched: Watched, to_exec: &mut File) {
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

#[cfg(test)]
mod tests {
    use super::super::wire::encode_beat;
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
}
