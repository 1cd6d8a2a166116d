//! What an exec checks before it takes a lock or sets anything, so that a
//! refusal leaves the nodes as they were: that /proc is its own and shows
//! it everything, that it can end whatever its command may become, and
//! that it can kill and reap a child of its own. Why a file of its own:
//! these are the refusals, each the answer to an attack that made an exec
//! unable to end its command; `Supervisor::start` runs them again.

use std::io;

use super::image::keep_out_of_reach;
use super::process_tree::can_end_a_child;
use crate::cli::own_proc::{cap_set, OwnProc};

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
/// it ([`OwnProc::shows_everything`]), and that it can kill and reap a
/// child of its own ([`can_end_a_child`]). A refusal here leaves the nodes
/// as they were; `Supervisor::start` checks again.
pub fn preflight() -> io::Result<()> {
    let proc = OwnProc::open()?;
    within_reach(&proc)?;
    proc.shows_everything()?;
    keep_children_to_reap();
    can_end_a_child()?;
    keep_out_of_reach()?;
    Ok(())
}

/// Gives SIGCHLD back its default if the caller left it ignored (`perl -e
/// '$SIG{CHLD}="IGNORE"; exec ...'`): ignored, it is inherited across exec
/// and makes the kernel reap this process's children unasked, so the
/// supervisor's end (and its exit status) would be lost to waitpid, and the
/// lock held for ever (the twelfth attack). A handler someone installed is
/// left alone.
pub(super) fn keep_children_to_reap() {
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
