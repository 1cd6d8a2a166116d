//! The process tree below a process, read from /proc, and its kill.
//!
//! Why a file of its own: both the supervisor (its command's tree) and the
//! exec (orphans that came to it, processes carrying its mark) end
//! processes the same way, and neither side's other concerns belong here.
//! /proc is trusted only after `own_proc` checked it.

use std::collections::{HashMap, HashSet};
use std::io;
use std::time::{Duration, Instant};

/// How long a kill of the tree may take before it is given up as lost to
/// a process that forks faster than it is killed.
pub(super) const KILL_FOR: Duration = Duration::from_secs(10);

/// Kills every process below `root` but `spared` and theirs, and reaps
/// them, until `root` has no child left but `spared`: `root` is a
/// subreaper, so the orphans of those killed come to it, and no other
/// child means no other descendant. False if that took longer than
/// [`KILL_FOR`].
pub(super) fn kill_tree(root: libc::pid_t, spared: &[libc::pid_t]) -> bool {
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
pub(super) fn no_child_left() -> bool {
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
pub(super) fn kill_below(parent: libc::pid_t, started: Instant) -> bool {
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
pub(super) fn threads(pid: libc::pid_t) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

/// SIGKILLs every process whose environment holds `mark` (which the
/// exec gives the command), but this one and `spared` and theirs, until
/// none is left or [`KILL_FOR`] after `started`. For an exec that is no
/// subreaper: the command's orphans go to init, out of the tree's reach,
/// but keep the mark (unless they dropped their environment).
pub(super) fn kill_marked(mark: &[u8], spared: &[libc::pid_t], started: Instant) -> bool {
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

/// Every process /proc shows now (those that vanish meanwhile are skipped).
pub(super) fn processes() -> Vec<Proc> {
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
