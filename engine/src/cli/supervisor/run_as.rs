//! The user an exec's command runs as (`--user`): another user than the
//! exec's, so that nothing of the command's user can stop the exec or its
//! supervisor.
//!
//! Why: any process may signal, trace, `prlimit` or freeze (through a
//! cgroup delegated to its user) the processes of its own user. A command
//! that stops its exec and supervisor by their pids, or asks its user's
//! tmux server or session manager to, runs on past the lease beside the
//! next holder (the twenty-third and twenty-fourth attacks). No amount of
//! watching closes that while both sides are one user: the kernel lets
//! them. Run as root, the exec can run the command as another user, who
//! can reach none of the exec's processes, and whose agents cannot either.
//!
//! The exec resolves the user and checks it may become it before it takes
//! anything; the supervisor (or the PID namespace's init) switches in the
//! child between fork and exec, with async-signal-safe calls only.

use std::ffi::{CStr, CString, OsString};
use std::os::unix::ffi::OsStringExt;

/// The ids a command runs with: what crosses the pipe to the supervisor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Identity {
    pub(super) uid: libc::uid_t,
    pub(super) gid: libc::gid_t,
    /// Supplementary groups, from the group database (as `login` gives).
    pub(super) groups: Vec<libc::gid_t>,
}

impl Identity {
    /// Switches to this identity: supplementary groups, then the group,
    /// then the user (every uid and gid, real, effective and saved).
    /// Async-signal-safe (no allocation); false if a step failed (the
    /// command must not start). Whether it holds is [`Identity::holds`],
    /// asked once the capability sets are emptied: a caller's securebits
    /// (`SECBIT_NO_SETUID_FIXUP`) can keep them through the switch.
    pub(super) fn switch(&self) -> bool {
        // SAFETY: calls on this process's own credentials; setgroups reads
        // `groups.len()` ids from a live slice.
        unsafe {
            libc::setgroups(self.groups.len(), self.groups.as_ptr()) == 0
                && libc::setresgid(self.gid, self.gid, self.gid) == 0
                && libc::setresuid(self.uid, self.uid, self.uid) == 0
        }
    }

    /// Leaves what the exec's user handed the exec that the command's user
    /// could not open itself (the second attack on `--user`): the caller's
    /// session keyring (whose keys a process in it may read, whoever it
    /// is), for a new one of the command's user's; and every descriptor
    /// above the standard three, closed at the command's execve (a caller
    /// may pass one to the exec numbered past any count a closing loop
    /// would make). Async-signal-safe; false if a step failed (a kernel
    /// without keyrings has none to leave).
    pub(super) fn leave_the_caller_s_keys_and_descriptors() -> bool {
        const KEYCTL_JOIN_SESSION_KEYRING: libc::c_long = 1;
        const CLOSE_RANGE_CLOEXEC: libc::c_uint = 4;
        // SAFETY: keyctl and close_range on this process's own keyring
        // and descriptors (marked close-on-exec, not closed: the standard
        // library's own pipe to its parent must live until the exec).
        unsafe {
            let joined = libc::syscall(
                libc::SYS_keyctl,
                KEYCTL_JOIN_SESSION_KEYRING,
                std::ptr::null::<libc::c_char>(),
            ) >= 0
                || *libc::__errno_location() == libc::ENOSYS;
            if !joined {
                return false;
            }
            if libc::syscall(
                libc::SYS_close_range,
                3 as libc::c_uint,
                libc::c_uint::MAX,
                CLOSE_RANGE_CLOEXEC,
            ) == 0
            {
                return true;
            }
            // A kernel before 5.11: every descriptor the limit allows.
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                return false;
            }
            let last = limit.rlim_cur.min(1 << 20) as libc::c_int;
            for fd in 3..last {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            }
            true
        }
    }

    /// Reads the ids back: every uid and gid this identity's, and root's
    /// uid not to be taken back. Async-signal-safe.
    pub(super) fn holds(&self) -> bool {
        let (mut r, mut e, mut s) = (0, 0, 0);
        let (mut rg, mut eg, mut sg) = (0, 0, 0);
        // SAFETY: the get calls write into live locals; setuid(0) on this
        // process must fail (had it worked, the command does not start).
        unsafe {
            libc::getresuid(&mut r, &mut e, &mut s) == 0
                && libc::getresgid(&mut rg, &mut eg, &mut sg) == 0
                && [r, e, s] == [self.uid; 3]
                && [rg, eg, sg] == [self.gid; 3]
                && libc::setuid(0) != 0
        }
    }
}

/// A user an exec may run its command as, from `--user`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub(super) ids: Identity,
    /// The user's name, for `USER` and `LOGNAME`.
    pub(super) name: OsString,
    /// The user's home, for `HOME`.
    pub(super) home: OsString,
}

/// Why `--user` cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadUser {
    /// No such user in the user database.
    #[error("--user {0:?}: no such user")]
    Unknown(String),
    /// The command would run as root.
    #[error(
        "--user {0:?}: the command must run as a user other than root (root can stop any \
         process)"
    )]
    NoSeparation(String),
    /// The exec is not wholly root: the command's user could signal it.
    #[error(
        "--user {user:?}: the exec must run as root, its real, effective and saved uids all 0 \
         (they are {real}, {effective}, {saved}): a process may signal any process whose real \
         or saved uid is its own, so the command's user could stop the exec"
    )]
    NotRoot {
        /// The user asked for.
        user: String,
        /// The exec's real uid.
        real: libc::uid_t,
        /// Its effective uid.
        effective: libc::uid_t,
        /// Its saved uid.
        saved: libc::uid_t,
    },
    /// The exec lacks what switching users and ending the other user's
    /// processes take.
    #[error(
        "--user {user:?}: this exec cannot run a command as another user and end it: it lacks \
         {missing} (run it as root)"
    )]
    NotAllowed {
        /// The user asked for.
        user: String,
        /// The capabilities it lacks, by name.
        missing: String,
    },
    /// The user database could not be read.
    #[error("--user {user:?}: cannot read the user database: {error}")]
    Database {
        /// The user asked for.
        user: String,
        /// What the lookup said.
        error: String,
    },
}

impl RunAs {
    /// Looks `user` (a name, or a numeric uid that names no user) up and
    /// checks this exec may run a command as it and end it: a user other
    /// than root; an exec whose real, effective and saved uids are all
    /// root's (the attack on `--user`: a setuid-root exec, or one whose
    /// caller kept its real uid, was the command's user's to stop, and the
    /// command wrote beside the next holder, 14 runs of 14); and
    /// CAP_SETUID, CAP_SETGID, CAP_SETPCAP (to empty the command's
    /// bounding set before the switch) and CAP_KILL in its effective set.
    /// Nothing is changed.
    pub fn resolve(user: &str) -> Result<RunAs, BadUser> {
        let run_as = lookup(user)?;
        if run_as.ids.uid == 0 {
            return Err(BadUser::NoSeparation(user.to_owned()));
        }
        let (mut real, mut effective, mut saved) = (0, 0, 0);
        // SAFETY: getresuid writes three ids into live locals.
        if unsafe { libc::getresuid(&mut real, &mut effective, &mut saved) } != 0
            || [real, effective, saved] != [0; 3]
        {
            return Err(BadUser::NotRoot {
                user: user.to_owned(),
                real,
                effective,
                saved,
            });
        }
        let missing = missing_capabilities();
        if !missing.is_empty() {
            return Err(BadUser::NotAllowed {
                user: user.to_owned(),
                missing: missing.join(", "),
            });
        }
        Ok(run_as)
    }

    /// The variables a login as this user sets, which the command gets in
    /// place of the exec's.
    pub(super) fn login_env(&self) -> [(OsString, OsString); 3] {
        [
            ("USER".into(), self.name.clone()),
            ("LOGNAME".into(), self.name.clone()),
            ("HOME".into(), self.home.clone()),
        ]
    }
}

/// Capabilities `--user` needs that this process's effective set lacks.
fn missing_capabilities() -> Vec<&'static str> {
    const NEEDED: [(u32, &str); 4] = [
        (5, "CAP_KILL"),
        (6, "CAP_SETGID"),
        (7, "CAP_SETUID"),
        (8, "CAP_SETPCAP"),
    ];
    let effective = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0);
    NEEDED
        .iter()
        .filter(|(cap, _)| effective & (1 << cap) == 0)
        .map(|(_, name)| *name)
        .collect()
}

/// The user database's entry for `user`, and its groups.
fn lookup(user: &str) -> Result<RunAs, BadUser> {
    let unknown = || BadUser::Unknown(user.to_owned());
    let name = CString::new(user).map_err(|_| unknown())?;
    let mut entry = find(|pwd, buf, len, out| {
        // SAFETY: every pointer is live for the call; the buffer is `len`
        // bytes.
        unsafe { libc::getpwnam_r(name.as_ptr(), pwd, buf, len, out) }
    });
    if matches!(entry, Ok(None)) {
        if let Ok(uid) = user.parse::<libc::uid_t>() {
            entry = find(|pwd, buf, len, out| {
                // SAFETY: as above.
                unsafe { libc::getpwuid_r(uid, pwd, buf, len, out) }
            });
        }
    }
    let database = |error: std::io::Error| BadUser::Database {
        user: user.to_owned(),
        error: error.to_string(),
    };
    let (uid, gid, login, home) = entry.map_err(database)?.ok_or_else(unknown)?;
    let groups = groups_of(&login, gid).map_err(database)?;
    Ok(RunAs {
        ids: Identity { uid, gid, groups },
        name: OsString::from_vec(login.into_bytes()),
        home: OsString::from_vec(home),
    })
}

type Entry = (libc::uid_t, libc::gid_t, CString, Vec<u8>);

/// Calls a `getpw*_r` lookup with a buffer that grows until it fits.
fn find(
    call: impl Fn(
        *mut libc::passwd,
        *mut libc::c_char,
        libc::size_t,
        *mut *mut libc::passwd,
    ) -> libc::c_int,
) -> std::io::Result<Option<Entry>> {
    let mut len = 1024;
    loop {
        let mut buf = vec![0 as libc::c_char; len];
        // SAFETY: an all-zero passwd is a valid value (null pointers, zero
        // ids); it is only read after the call filled it.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        let rc = call(&mut pwd, buf.as_mut_ptr(), len, &mut out);
        if rc == libc::ERANGE && len < 1 << 20 {
            len *= 4;
            continue;
        }
        // ENOENT, ESRCH and the like: no such entry, as glibc documents.
        if out.is_null() {
            return match rc {
                0 | libc::ENOENT | libc::ESRCH | libc::EBADF | libc::EPERM => Ok(None),
                e => Err(std::io::Error::from_raw_os_error(e)),
            };
        }
        // SAFETY: on success pw_name and pw_dir point into `buf`, NUL
        // terminated, and live as long as it.
        let (name, home) = unsafe {
            (
                CStr::from_ptr(pwd.pw_name).to_owned(),
                CStr::from_ptr(pwd.pw_dir).to_bytes().to_vec(),
            )
        };
        return Ok(Some((pwd.pw_uid, pwd.pw_gid, name, home)));
    }
}

/// Every group `login` is in, `gid` first (getgrouplist).
fn groups_of(login: &CStr, gid: libc::gid_t) -> std::io::Result<Vec<libc::gid_t>> {
    let mut count: libc::c_int = 32;
    loop {
        let mut groups = vec![0 as libc::gid_t; usize::try_from(count).unwrap_or(32)];
        let asked = count;
        // SAFETY: `groups` holds `count` ids; getgrouplist writes at most
        // that many and sets `count` to how many there are.
        let rc =
            unsafe { libc::getgrouplist(login.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
        if rc >= 0 {
            groups.truncate(usize::try_from(count).unwrap_or(0));
            return Ok(groups);
        }
        if count <= asked {
            count = asked * 2;
        }
        if count > 65_536 {
            return Err(std::io::Error::other("more than 65,536 groups"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_user_is_refused_by_name() {
        assert_eq!(
            lookup("no-such-user-of-flashsale"),
            Err(BadUser::Unknown("no-such-user-of-flashsale".into()))
        );
        assert_eq!(lookup("no\0user"), Err(BadUser::Unknown("no\0user".into())));
    }

    #[test]
    fn root_is_found_by_name_and_by_number_and_never_run_as() {
        let by_name = lookup("root").expect("root is in every user database");
        assert_eq!(by_name.ids.uid, 0);
        assert_eq!(by_name.name, OsString::from("root"));
        assert_eq!(lookup("0").map(|r| r.ids.uid), Ok(0));
        assert_eq!(
            RunAs::resolve("root"),
            Err(BadUser::NoSeparation("root".into()))
        );
    }
}
