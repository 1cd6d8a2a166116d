//! The PID namespace the command runs in by default: made by the
//! supervisor just before it forks the namespace's init, as root in the
//! caller's user namespace or, for an ordinary user, in a user namespace of
//! its own. Why a namespace: see `image.rs` (`supervise`) and docs/locks.md.
//! A file of its own because it is one decision with its own failure
//! modes (refused, half made), read by the supervisor's image alone.

use std::io;

/// Makes the PID namespace the supervisor's next children are born in:
/// with CAP_SYS_ADMIN (root), one of the user namespace this process is
/// in; without, for a user other than root, one owned by a user namespace
/// of its own, which an ordinary user may make on most Linux systems, so
/// `--pid-namespace` is not for root alone. That user namespace maps this
/// process's uid and gid to themselves and nothing else: the command runs
/// as the same user, with no capability left after its execve (its uid is
/// not the namespace's root, and `spawn` sets no_new_privs as outside), and
/// a setuid program owned by another user runs as this one (an unmapped
/// owner's setuid bit is ignored). The error carries the errno.
pub(super) fn new_pid_namespace() -> Result<UserNamespace, NoNamespace> {
    let errno = || {
        io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EPERM)
    };
    // SAFETY: unshare affects only the children this process makes next.
    if unsafe { libc::unshare(libc::CLONE_NEWPID) } == 0 {
        return Ok(UserNamespace::Caller);
    }
    let as_root = errno();
    // SAFETY: getters with no failure and no memory.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    // Root without CAP_SYS_ADMIN gets no user namespace: it would map root
    // to root and hand the command back, inside it, every capability the
    // caller had dropped, over every file root owns (the nineteenth
    // attack read a mode-000 file with DAC_OVERRIDE dropped).
    if as_root != libc::EPERM || uid == 0 {
        return Err(NoNamespace::Refused(as_root));
    }
    // SAFETY: this image is single-threaded (unshare of a user namespace
    // needs it); the namespaces hold for this process and the children it
    // makes next.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWPID) } != 0 {
        return Err(NoNamespace::Refused(errno()));
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
    mapped
        .map(|()| UserNamespace::Own)
        .map_err(|e| NoNamespace::HalfMade(e.raw_os_error().unwrap_or(libc::EPERM)))
}

/// Why no PID namespace was made (the errno).
pub(super) enum NoNamespace {
    /// Refused before anything changed: the command may run without one.
    Refused(i32),
    /// The namespaces exist but the user namespace's maps could not be
    /// written: this process's next child would be their init, as nobody.
    HalfMade(i32),
}

/// Whose user namespace the command's PID namespace belongs to.
pub(super) enum UserNamespace {
    /// The caller's: this process had CAP_SYS_ADMIN there.
    Caller,
    /// One this process made, in which it holds every capability.
    Own,
}
