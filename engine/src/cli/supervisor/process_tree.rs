//! The process tree below a process, read from /proc, and its kill.
//!
//! Why a file of its own: both the supervisor (its command's tree) and the
//! exec (orphans that came to it, processes carrying its mark) end
//! processes the same way, and neither side's other concerns belong here.
//! /proc is trusted only after `own_proc` checked it.
//!
//! Why every answer is checked: a process is taken for gone only on the
//! kernel's word that it is (`ESRCH`, or reaped), never on a call that
//! failed. A caller's seccomp filter (no privilege needed) made kill(2) say
//! EPERM and wait4 say ECHILD, and the old loops took "no child" for an
//! empty tree and gave the lock back with the command still writing (the
//! twentieth attack). A refused kill, a /proc that does not list this
//! process, or an ECHILD while /proc shows a child is now [`Unended::Blind`]:
//! the grant is left to lapse, never given back.

use std::collections::{HashMap, HashSet};
use std::io;
use std::time::{Duration, Instant};

/// Why the processes of a tree cannot be said to be gone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unended {
    /// Something forked faster than it was killed for [`KILL_FOR`].
    #[error("its processes forked faster than they could be killed")]
    ForkedFaster,
    /// The kernel's answers could not be had or did not agree (a refused
    /// kill, an unreadable /proc, no child by waitpid while /proc shows
    /// one): what is left cannot be known. The reason, for the user.
    #[error("{0}")]
    Blind(String),
}

/// SIGKILLs `pid`: done when the kernel took the signal or says the
/// process is gone (ESRCH); any other answer is an error, never "gone".
pub(super) fn sigkill(pid: libc::pid_t) -> Result<(), Unended> {
    // SAFETY: kill(2) has no memory effects.
    if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ESRCH) {
        return Ok(());
    }
    Err(Unended::Blind(format!(
        "kill(2) of pid {pid} was refused: {e}"
    )))
}

/// How long a kill of the tree may take before it is given up as lost to
/// a process that forks faster than it is killed.
pub(super) const KILL_FOR: Duration = Duration::from_secs(10);

/// Kills every process below `root` but `spared` and theirs, and reaps
/// them, until `root` has no child left but `spared`: `root` is a
/// subreaper, so the orphans of those killed come to it, and no other
/// child means no other descendant. `ForkedFaster` if that took longer
/// than [`KILL_FOR`]; `Blind` when a kill was refused or the kernel's
/// answers disagree.
pub(super) fn kill_tree(root: libc::pid_t, spared: &[libc::pid_t]) -> Result<(), Unended> {
    let started = Instant::now();
    loop {
        let procs = processes()?;
        let mut keep: Vec<libc::pid_t> = spared.to_vec();
        for s in spared {
            keep.extend(descendants(&procs, *s));
        }
        for pid in descendants(&procs, root) {
            if !keep.contains(&pid) {
                sigkill(pid)?;
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
            no_child_left()?
        } else {
            children_of(&processes()?, root)
                .into_iter()
                .all(|p| spared.contains(&p))
        };
        if done {
            return Ok(());
        }
        if started.elapsed() >= KILL_FOR {
            return Err(Unended::ForkedFaster);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Reaps every child that has ended; true once this process has no child
/// at all (waitpid's ECHILD), alive or not yet reaped. An ECHILD while
/// /proc shows a child of this process is a lie (a seccomp filter can
/// make one), not an empty tree.
pub(super) fn no_child_left() -> Result<bool, Unended> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status it is given.
        match unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) } {
            pid if pid > 0 => continue,
            0 => return Ok(false),
            _ => {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::ECHILD) => {}
                    _ => return Err(Unended::Blind(format!("waitpid failed: {e}"))),
                }
                // SAFETY: getpid has no failure and no memory.
                let me = unsafe { libc::getpid() };
                return match children_of(&processes()?, me).first() {
                    None => Ok(true),
                    Some(child) => Err(Unended::Blind(format!(
                        "waitpid says this process has no child, but /proc shows pid {child}"
                    ))),
                };
            }
        }
    }
}

/// SIGKILLs everything below `parent` (not `parent` itself) until nothing
/// alive is left there (a zombie is dead once its last thread is: a
/// stopped supervisor cannot reap it, and it forks nothing). False when something still lived there
/// [`KILL_FOR`] after `started` (`ForkedFaster`), or a kill was refused.
pub(super) fn kill_below(parent: libc::pid_t, started: Instant) -> Result<(), Unended> {
    loop {
        let procs = processes()?;
        let below: HashSet<libc::pid_t> = descendants(&procs, parent).into_iter().collect();
        // A zombie whose other threads live (its main thread called
        // pthread_exit) still forks: alive until its last thread is gone.
        let alive: Vec<libc::pid_t> = procs
            .iter()
            .filter(|p| below.contains(&p.pid) && (p.state != 'Z' || threads(p.pid) > 1))
            .map(|p| p.pid)
            .collect();
        if alive.is_empty() {
            return Ok(());
        }
        for pid in alive {
            sigkill(pid)?;
        }
        if started.elapsed() >= KILL_FOR {
            return Err(Unended::ForkedFaster);
        }
        std::thread::yield_now();
    }
}

/// How long the self-test waits for each step of its child's life.
const SELF_TEST_FOR: Duration = Duration::from_secs(5);

/// Proves, before anything is taken, that this process can do what ending
/// a command needs: fork a child that dies with it (PR_SET_PDEATHSIG set
/// and read back), see it in /proc, SIGKILL it and reap it killed. A
/// seccomp filter its caller installed (no privilege needed) can fake
/// each of these (kill -> EPERM, wait4 -> ECHILD, prctl -> 0 doing
/// nothing, getdents64 -> an empty /proc), and it binds the supervisor,
/// which inherits it, as much as the exec: the twentieth attack gave the
/// lock back while the command ran on. An error says which step failed.
pub(super) fn can_end_a_child() -> io::Result<()> {
    let refused = |what: String| {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "this exec cannot end a process of its own ({what}), so it could not end its \
                 command's (a seccomp filter or a limit set by its caller?); the command did not run"
            ),
        )
    };
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let [read_end, write_end] = fds;
    // SAFETY: the child makes async-signal-safe calls only (this process
    // may have many threads) and never returns; alarm ends it within a
    // minute should nothing else (a kill that only seemed to work).
    let child = unsafe { libc::fork() };
    if child == 0 {
        unsafe {
            // Named, so that it is not taken for the supervisor.
            libc::prctl(libc::PR_SET_NAME, c"exec-self-test".as_ptr());
            libc::alarm(60);
            let mut sig: libc::c_int = 0;
            let set = libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0
                && libc::prctl(libc::PR_GET_PDEATHSIG, &mut sig as *mut libc::c_int) == 0
                && sig == libc::SIGKILL;
            let word: u8 = if set { b'y' } else { b'n' };
            libc::write(write_end, (&word as *const u8).cast(), 1);
            loop {
                libc::pause();
            }
        }
    }
    // SAFETY: closes this side's copy of the child's end.
    unsafe { libc::close(write_end) };
    if child < 0 {
        let e = io::Error::last_os_error();
        // SAFETY: closes the descriptor made above.
        unsafe { libc::close(read_end) };
        return Err(e);
    }
    let word = read_word(read_end);
    // SAFETY: closes the descriptor made above.
    unsafe { libc::close(read_end) };
    let mut verdict = match word {
        Some(b'y') => Ok(()),
        Some(_) => Err(refused("PR_SET_PDEATHSIG did not hold in a child".into())),
        None => Err(refused("a child did not answer".into())),
    };
    if verdict.is_ok() {
        // SAFETY: getpid has no failure and no memory.
        let me = unsafe { libc::getpid() };
        verdict = match processes() {
            Ok(procs) if children_of(&procs, me).contains(&child) => Ok(()),
            Ok(_) => Err(refused(format!("/proc does not show its child {child}"))),
            Err(e) => Err(refused(e.to_string())),
        };
    }
    let killed = sigkill(child).map_err(|e| refused(e.to_string()));
    let reaped = reap_killed(child).map_err(refused);
    verdict.and(killed).and(reaped)
}

/// One byte from `fd` within [`SELF_TEST_FOR`], or None.
fn read_word(fd: libc::c_int) -> Option<u8> {
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = SELF_TEST_FOR.as_millis() as libc::c_int;
    // SAFETY: polls one live pollfd, reads into a live local byte.
    unsafe {
        if libc::poll(&mut poll, 1, ms) <= 0 {
            return None;
        }
        let mut word = 0u8;
        (libc::read(fd, (&mut word as *mut u8).cast(), 1) == 1).then_some(word)
    }
}

/// Waits up to [`SELF_TEST_FOR`] for `child` to be reaped, killed by
/// SIGKILL; the reason if it was not.
fn reap_killed(child: libc::pid_t) -> Result<(), String> {
    let started = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status it is given.
        let pid = unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) };
        if pid == child {
            return if libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL {
                Ok(())
            } else {
                Err(format!("its child {child} ended otherwise than killed"))
            };
        }
        if pid < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(format!("waitpid of its child {child} failed: {e}"));
            }
        }
        if started.elapsed() >= SELF_TEST_FOR {
            return Err(format!("its child {child} was not gone after a SIGKILL"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// How many threads `pid` has now (0 once it is gone).
pub(super) fn threads(pid: libc::pid_t) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

/// SIGKILLs every process whose environment holds `mark` (which the
/// exec gives the command), but this one and `spared` and theirs, until
/// none is left or [`KILL_FOR`] after `started`. For an exec that is no
/// subreaper: the command's orphans go to init, out of the tree's reach,
/// but keep the mark (unless they dropped their environment).
pub(super) fn kill_marked(
    mark: &[u8],
    spared: &[libc::pid_t],
    started: Instant,
) -> Result<(), Unended> {
    // SAFETY: getpid has no failure and no memory.
    let me = unsafe { libc::getpid() };
    loop {
        let procs = processes()?;
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
            return Ok(());
        }
        for pid in marked {
            sigkill(pid)?;
        }
        if started.elapsed() >= KILL_FOR {
            return Err(Unended::ForkedFaster);
        }
        std::thread::yield_now();
    }
}

/// The pids whose parent is `parent`.
pub(super) fn children_of(procs: &[Proc], parent: libc::pid_t) -> Vec<libc::pid_t> {
    procs
        .iter()
        .filter(|p| p.ppid == parent)
        .map(|p| p.pid)
        .collect()
}

/// One line of /proc/<pid>/stat, the fields used here.
pub(super) struct Proc {
    pub(super) pid: libc::pid_t,
    pub(super) name: String,
    pub(super) state: char,
    pub(super) ppid: libc::pid_t,
    pub(super) pgrp: libc::pid_t,
    pub(super) tty: i64,
    pub(super) tpgid: libc::pid_t,
}

/// Every process /proc shows now (those that vanish meanwhile are
/// skipped). An error when /proc cannot be listed, or its list lacks this
/// very process: a listing that comes back empty (a seccomp filter that
/// makes getdents64 return 0; descriptors denied by a limit of one, which
/// a same-user command can set on this process with prlimit) would
/// otherwise read as "nothing below".
pub(super) fn processes() -> Result<Vec<Proc>, Unended> {
    let blind = |e: io::Error| Unended::Blind(format!("cannot read /proc: {e}"));
    let entries = std::fs::read_dir("/proc").map_err(blind)?;
    let mut procs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(blind)?;
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        if let Some(p) = read_stat(pid) {
            procs.push(p);
        }
    }
    // SAFETY: getpid has no failure and no memory.
    let me = unsafe { libc::getpid() };
    if !procs.iter().any(|p| p.pid == me) {
        return Err(Unended::Blind(format!(
            "/proc does not show this process (pid {me}): {}",
            std::fs::read(format!("/proc/{me}/stat"))
                .err()
                .map_or_else(|| "its listing left it out".to_string(), |e| e.to_string())
        )));
    }
    Ok(procs)
}

/// One process's stat line, or None if it is gone (or unreadable).
fn read_stat(pid: libc::pid_t) -> Option<Proc> {
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
}

/// The pids below `root` (not `root` itself).
pub(super) fn descendants(procs: &[Proc], root: libc::pid_t) -> Vec<libc::pid_t> {
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
}
