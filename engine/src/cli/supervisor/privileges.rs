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

/// The ioctl system call's number and the audit arch of each ABI a
/// process of this build's architecture may call it through (the 32-bit
/// compat ABI has its own numbers, as x32 has on x86_64).
#[cfg(target_arch = "x86_64")]
mod abi {
    pub(super) const NATIVE_ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
    pub(super) const NATIVE_IOCTL: u32 = 16;
    pub(super) const ALT_IOCTL: u32 = 0x4000_0000 | 514; // x32
    pub(super) const COMPAT_ARCH: u32 = 0x4000_0003; // AUDIT_ARCH_I386
    pub(super) const COMPAT_IOCTL: u32 = 54;
}
#[cfg(target_arch = "aarch64")]
mod abi {
    pub(super) const NATIVE_ARCH: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64
    pub(super) const NATIVE_IOCTL: u32 = 29;
    pub(super) const ALT_IOCTL: u32 = 29;
    pub(super) const COMPAT_ARCH: u32 = 0x4000_0028; // AUDIT_ARCH_ARM
    pub(super) const COMPAT_IOCTL: u32 = 54;
}

/// A seccomp filter refusing (EPERM) `ioctl(fd, TIOCSTI)`,
/// `ioctl(fd, TIOCLINUX)` and `ioctl(fd, TIOCSPGRP)` (`tcsetpgrp`) through
/// every ABI, and allowing everything else.
/// Only the request's low 32 bits are compared, as the tty layer reads
/// only those (a filter on all 64 was bypassed by setting the high bits,
/// CVE-2019-10063).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const NO_TYPING: [libc::sock_filter; 14] = {
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    const ALLOW: u32 = 0x7fff_0000;
    const DENY: u32 = 0x0005_0000 | libc::EPERM as u32;
    const TIOCSTI: u32 = 0x5412;
    const TIOCLINUX: u32 = 0x541C;
    const TIOCSPGRP: u32 = 0x5410;
    // seccomp_data: nr at 0, arch at 4, the second argument's low word
    // (the request) at 24.
    const fn op(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
        libc::sock_filter { code, jt, jf, k }
    }
    [
        op(LD_W_ABS, 0, 0, 4),
        op(JEQ_K, 0, 3, abi::NATIVE_ARCH),
        op(LD_W_ABS, 0, 0, 0),
        op(JEQ_K, 4, 0, abi::NATIVE_IOCTL),
        op(JEQ_K, 3, 7, abi::ALT_IOCTL),
        op(JEQ_K, 0, 6, abi::COMPAT_ARCH),
        op(LD_W_ABS, 0, 0, 0),
        op(JEQ_K, 0, 4, abi::COMPAT_IOCTL),
        op(LD_W_ABS, 0, 0, 24),
        op(JEQ_K, 3, 0, TIOCSTI),
        op(JEQ_K, 2, 0, TIOCLINUX),
        op(JEQ_K, 1, 0, TIOCSPGRP),
        op(RET_K, 0, 0, ALLOW),
        op(RET_K, 0, 0, DENY),
    ]
};

/// Forbids the command to type into a terminal (TIOCSTI, TIOCLINUX's
/// paste): the command shares its caller's terminal, and typed Ctrl-Z and
/// a `kill -STOP` of the supervisor into the shell that started the exec,
/// which ran them, so nothing ended the command (the twenty-third attack).
/// A seccomp filter, inherited by everything the command starts, which
/// none of it can remove. Installing one needs no_new_privs or
/// CAP_SYS_ADMIN: without either (an exec that keeps its privileges,
/// holding CAP_KILL but not CAP_SYS_ADMIN), no_new_privs is set, and a
/// setuid program in the command gains nothing. Async-signal-safe; false if
/// it could not be installed (the command must not start).
pub(super) fn forbid_typing_into_terminals() -> bool {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        let prog = libc::sock_fprog {
            len: NO_TYPING.len() as u16,
            filter: NO_TYPING.as_ptr() as *mut libc::sock_filter,
        };
        let install = || {
            // SAFETY: prctl reads the program it is given, which lives in
            // a const for the whole process.
            unsafe {
                libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &prog as *const libc::sock_fprog,
                ) == 0
            }
        };
        if install() {
            return true;
        }
        // SAFETY: errno read right after the call that set it; prctl on
        // this process's own attribute.
        unsafe {
            *libc::__errno_location() == libc::EACCES
                && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
                && install()
        }
    }
    // No filter written for this architecture: no command runs.
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    false
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
    drop_bounding_set() && empty_capability_sets()
}

/// Empties the bounding set (it takes CAP_SETPCAP: before any switch of
/// user). Async-signal-safe; false if a drop was refused.
pub(super) fn drop_bounding_set() -> bool {
    const CAPS: libc::c_ulong = 64;
    // SAFETY: prctl on this process's own sets.
    unsafe {
        for cap in 0..CAPS {
            // EINVAL past the kernel's last capability.
            if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0
                && *libc::__errno_location() != libc::EINVAL
            {
                return false;
            }
        }
    }
    true
}

/// Empties the permitted, effective and inheritable sets (lowering needs
/// no capability: this also holds after a switch of user that a caller's
/// securebits kept capabilities through). Async-signal-safe; false if
/// refused.
pub(super) fn empty_capability_sets() -> bool {
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
    // SAFETY: capset on this process's own sets reads the two live locals
    // it is given.
    unsafe { libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) == 0 }
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
