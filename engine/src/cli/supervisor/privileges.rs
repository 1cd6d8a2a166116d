//! What the command may keep of the supervisor's privileges, and the
//! async-signal-safe calls that take them away between fork and exec: a
//! command this user's SIGKILL cannot reach (another user, by a setuid
//! program or a capability) would run on past the lock. A file of its own
//! because the supervisor's image and the namespace's init both use it,
//! and its calls are the ones a hostile filter tried to fake.

/// What the command may keep of the supervisor's privileges.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Privileges {
    /// Everything: the supervisor may kill any process (CAP_KILL), so
    /// whoever the command becomes stays within its reach.
    Keep,
    /// No new ones (no_new_privs, no ambient capabilities): the setuid
    /// bit and file capabilities are not honoured.
    NoNew,
    /// None at all: in a user namespace of the supervisor's own, where it
    /// holds every capability of that namespace, no_new_privs alone let
    /// a file-capability program keep them (it caps new privileges at the
    /// old, which were all); the command's permitted, inheritable and
    /// bounding sets are emptied first (the twentieth attack).
    None,
}

impl Privileges {
    /// Gives up what the command may not keep, in the child between fork
    /// and exec: with `None`, every capability set emptied; unless `Keep`,
    /// no_new_privs set (and read back) and the ambient set cleared.
    /// Async-signal-safe; false if a step failed (the command must not
    /// start).
    pub(super) fn shed(self) -> bool {
        if self == Privileges::None && !drop_every_capability() {
            return false;
        }
        if self == Privileges::Keep {
            return true;
        }
        // SAFETY: prctl on this process's own attributes; errno read
        // right after the call that set it.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1
            {
                return false;
            }
            // EINVAL: a kernel without ambient capabilities, none to clear.
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            ) == 0
                || *libc::__errno_location() == libc::EINVAL
        }
    }
}

/// Sets PR_SET_PDEATHSIG to SIGKILL and reads it back: true only when it
/// holds. Async-signal-safe.
pub(super) fn dies_with_parent() -> bool {
    let mut sig: libc::c_int = 0;
    // SAFETY: prctl on this process's own attribute; the get writes one
    // int into a live local.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0
            && libc::prctl(libc::PR_GET_PDEATHSIG, &mut sig as *mut libc::c_int) == 0
            && sig == libc::SIGKILL
    }
}

/// Empties this process's capability sets: the bounding set (which a
/// file-capability program's permitted set is cut to), then the
/// permitted, effective and inheritable sets. Async-signal-safe; false if
/// a step failed.
fn drop_every_capability() -> bool {
    const CAPS: libc::c_ulong = 64;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    // _LINUX_CAPABILITY_VERSION_3: two 32-bit words of each set.
    let header = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: prctl and capset on this process's own sets; capset reads
    // the two live locals it is given.
    unsafe {
        for cap in 0..CAPS {
            // EINVAL past the kernel's last capability.
            if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0
                && *libc::__errno_location() != libc::EINVAL
            {
                return false;
            }
        }
        libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) == 0
    }
}

/// Whether this process may kill any process (CAP_KILL in its effective
/// set): then its command keeps every privilege it would have.
pub(super) fn may_kill_anyone() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .is_some_and(|eff| eff & (1 << 5) != 0)
    })
}
