//! The /proc a lock exec reads, checked to be this process's own before
//! anything it says counts.
//!
//! Why a module of its own: the exec ends its command's processes by
//! walking /proc (see `supervisor`), so a /proc that lies, or that speaks
//! of another PID namespace, lets a process of the command run on beside
//! the next holder. Four attacks in a row found a /proc the exec trusted
//! and should not have (fifteenth to eighteenth); each check they taught
//! is here, in one place, and every file the checks read comes through
//! [`OwnProc::read_self`], which refuses a file that is not on the /proc
//! mount itself:
//!
//! - /proc must be a procfs (`fstatfs` says PROC_SUPER_MAGIC): a directory
//!   bind-mounted over it in a user and mount namespace answered `self`,
//!   `status`, `mountinfo` and `fdinfo` as a real one would (eighteenth).
//! - `/proc/self` must not be covered by another mount (its files' mount
//!   id, from `statx`, is the /proc root's): else a real entry of another
//!   process, bound over this one's, would answer for it.
//! - /proc must be of this process's PID namespace: the `NSpid:` line of
//!   its status names exactly one pid, this one. Comparing `/proc/self`
//!   with getpid() was beaten by a write to `ns_last_pid` that gave the
//!   exec the same pid in two namespaces (eighteenth).
//! - /proc must not hide processes (`hidepid`), whoever runs the exec
//!   (fifteenth, sixteenth, nineteenth; see [`OwnProc::shows_everything`]).
//!
//! What no check here covers: a process of the caller's that changes the
//! exec's mounts while it runs. The stronger design needs no /proc at
//! all: a PID namespace of the command's own (the default where one can be
//! made) dies whole with its init, by the kernel.

use std::fs::File;
use std::io::{self, Read as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _};

/// An open /proc that passed [`OwnProc::open`]'s checks.
pub struct OwnProc {
    root: File,
    mount: u64,
}

impl OwnProc {
    /// Opens /proc and checks that it is a procfs of this process's PID
    /// namespace, its entry for this process not covered by a mount.
    pub fn open() -> io::Result<OwnProc> {
        let root = File::open("/proc").map_err(|e| refused(format!("cannot open /proc: {e}")))?;
        if !is_procfs(&root) {
            return Err(refused(
                "/proc here is not a procfs (something else is mounted over it): what it says \
                 of processes cannot be trusted, so this exec could not end its command's \
                 processes; the command did not run"
                    .into(),
            ));
        }
        let mount =
            mount_id(&root).ok_or_else(|| refused("cannot tell which mount /proc is".into()))?;
        let proc = OwnProc { root, mount };
        let status = proc.read_self("status")?;
        // SAFETY: getpid has no failure and no memory.
        let me = unsafe { libc::getpid() };
        if !names_only(&status, me) {
            return Err(refused(
                "/proc here is not this process's PID namespace's: its pids are not the ones \
                 this exec would signal, so it could not end its command's processes; give it \
                 a /proc of its own namespace (`unshare --pid --fork --mount-proc`); the \
                 command did not run"
                    .into(),
            ));
        }
        Ok(proc)
    }

    /// The whole of `/proc/self/<name>`, refused if the file is not on
    /// the /proc mount itself (something is mounted over this process's
    /// entry).
    pub fn read_self(&self, name: &str) -> io::Result<String> {
        let path = std::ffi::CString::new(format!("self/{name}"))
            .map_err(|_| refused(format!("bad /proc file name {name:?}")))?;
        // SAFETY: openat on a descriptor this value owns, with a path
        // made here; the new descriptor is owned by the File below.
        let fd = unsafe {
            libc::openat(
                self.root.as_raw_fd(),
                path.as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just opened and is owned by nothing else.
        let mut file = unsafe { File::from_raw_fd(fd) };
        if mount_id(&file) != Some(self.mount) {
            return Err(refused(
                "this process's /proc entry is covered by another mount: what it says of this \
                 process cannot be trusted; the command did not run"
                    .into(),
            ));
        }
        let mut text = String::new();
        file.read_to_string(&mut text)?;
        Ok(text)
    }

    /// Refuses a /proc that hides processes (`hidepid` 1, 2 or 4): a
    /// process the exec cannot see runs on past the lock. Under hidepid a
    /// process this one may not ptrace is hidden, and that includes its own
    /// processes that are not dumpable (a program only executable, not
    /// readable; PR_SET_DUMPABLE 0). Every hidepid is refused, root's too:
    /// the exception this had for CAP_SYS_PTRACE in the first user
    /// namespace was beaten three times (the fifteenth, sixteenth and
    /// nineteenth attacks: a user namespace of root's whose uid map was
    /// written whole, `0 0 4294967295`, passed for the first, and a process
    /// whose group it did not map was hidden from it), so it is gone, not
    /// patched a fourth time.
    ///
    /// A process cannot list its own children without /proc (this kernel
    /// has no `/proc/<pid>/task/<tid>/children`), hence a refusal, not a
    /// way round.
    pub fn shows_everything(&self) -> io::Result<()> {
        let mounts = self.read_self("mountinfo")?;
        let Some(options) = proc_mount_options(&mounts, self.mount) else {
            return Err(refused(
                "cannot tell which /proc is mounted here (hidepid or not); the command did not run"
                    .into(),
            ));
        };
        let Some(hidepid) = options
            .split(',')
            .find_map(|o| o.strip_prefix("hidepid="))
            .filter(|v| !matches!(*v, "0" | "off"))
        else {
            return Ok(());
        };
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "/proc is mounted with hidepid={hidepid}: it hides processes of this exec's \
                 command (those that are not dumpable), which it could then never end; run the \
                 exec on a /proc without hidepid (e.g. in a mount namespace of its own, \
                 `unshare --mount --pid --fork --mount-proc`); the command did not run"
            ),
        ))
    }
}

/// The capability set a status's `set` line names (none if absent).
pub fn cap_set(status: &str, set: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(set))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0)
}

fn refused(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, message)
}

fn is_procfs(file: &File) -> bool {
    // SAFETY: fstatfs fills a zeroed struct of ours from a descriptor we
    // own.
    unsafe {
        let mut fs: libc::statfs = std::mem::zeroed();
        libc::fstatfs(file.as_raw_fd(), &mut fs) == 0 && fs.f_type == libc::PROC_SUPER_MAGIC
    }
}

/// The id of the mount `file` is on (the one mountinfo lists first on its
/// line), from `statx`, which no mount can answer for.
fn mount_id(file: &File) -> Option<u64> {
    // SAFETY: statx fills a zeroed struct of ours from a descriptor we own
    // and an empty path (AT_EMPTY_PATH: the descriptor itself).
    unsafe {
        let mut stx: libc::statx = std::mem::zeroed();
        let done = libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_MNT_ID,
            &mut stx,
        ) == 0;
        (done && stx.stx_mask & libc::STATX_MNT_ID != 0).then_some(stx.stx_mnt_id)
    }
}

/// Whether a status's `NSpid:` line names `pid` and no other: it names the
/// process's pid in every namespace from /proc's down to its own, so one
/// pid means /proc is of the process's own namespace.
fn names_only(status: &str, pid: libc::pid_t) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .is_some_and(|v| {
            let pids: Vec<&str> = v.split_whitespace().collect();
            pids.as_slice() == [pid.to_string().as_str()]
        })
}

/// The super options of mount `id` (`/proc/self/mountinfo`), if it is a
/// procfs mount.
fn proc_mount_options(mountinfo: &str, id: u64) -> Option<&str> {
    mountinfo.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        let this: u64 = mount.split(' ').next()?.parse().ok()?;
        let mut fs = fs.split(' ');
        (this == id && fs.next()? == "proc").then_some(())?;
        fs.nth(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The options of the mount the id names, whatever order mountinfo
    /// lists them in; none for a mount that is not procfs.
    #[test]
    fn the_proc_mount_options_are_those_of_the_mount_in_use() {
        let mountinfo = "22 27 0:21 / /proc rw,relatime - proc proc rw\n\
             41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n\
             63 64 0:50 / /proc rw - proc proc rw,hidepid=invisible,gid=4\n\
             64 45 0:51 / /proc rw - proc proc rw\n";
        assert_eq!(
            proc_mount_options(mountinfo, 63),
            Some("rw,hidepid=invisible,gid=4")
        );
        assert_eq!(proc_mount_options(mountinfo, 64), Some("rw"));
        assert_eq!(proc_mount_options(mountinfo, 41), None);
        assert_eq!(proc_mount_options(mountinfo, 7), None);
    }

    /// From the eighteenth attack: two pids that happen to be equal are
    /// two namespaces, not one.
    #[test]
    fn only_a_single_nspid_equal_to_the_pid_is_this_namespace_s_proc() {
        assert!(names_only("Pid:\t7\nNSpid:\t7\n", 7));
        assert!(!names_only("Pid:\t7\nNSpid:\t7\t7\n", 7));
        assert!(!names_only("Pid:\t7\nNSpid:\t8\n", 7));
        assert!(!names_only("Pid:\t7\n", 7));
    }

    /// The /proc this suite runs on is its own.
    #[test]
    fn the_test_s_own_proc_passes() {
        let proc = OwnProc::open().expect("own /proc");
        assert!(proc.read_self("status").is_ok_and(|s| s.contains("NSpid:")));
    }
}
