//! What crosses the pipes between a lock exec and its supervisor, and the
//! names both sides agree on: the reports the supervisor sends, the
//! heartbeat the exec sends, and the command handed over.
//!
//! Why a file of its own: the exec (`mod.rs`) writes what the supervisor
//! (`image.rs`) reads and the other way round; each side imports this one
//! file, not the other side.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::time::Duration;

use super::run_as::Identity;

/// The supervisor's name (argv[0] and comm) in its new image.
pub(super) const SUPERVISOR_NAME: &str = "lease-reaper";

/// The environment variable that marks a supervisor's new image: with the
/// name, the pipes and leading its own group, it tells a supervisor from a
/// user's command line.
pub(super) const SUPERVISOR_ENV: &str = "FLASHSALE_LEASE_REAPER";

/// Largest command line and environment the exec hands over (bytes).
pub(super) const MAX_SPEC: usize = 16 << 20;

/// A beat's tag. A beat is the tag and when the exec sent it (ns of
/// `CLOCK_MONOTONIC`, one clock for every process of the host, little
/// endian): [`BEAT_LEN`] bytes, below `PIPE_BUF`, so written whole. The
/// supervisor counts its patience from the sending, not from its reading:
/// a beat read late (the supervisor stopped or starved meanwhile) gives
/// the command no time the exec's lease did not cover.
pub(super) const BEAT: u8 = 2;
/// Bytes of a beat.
pub(super) const BEAT_LEN: usize = 9;

/// The variable that marks every process of the command.
pub(super) const MARK_VAR: &str = "FLASHSALE_EXEC_MARK";

/// What the supervisor tells the exec, five bytes each on its pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// The command runs, with this pid.
    Started(libc::pid_t),
    /// The command could not be started: the errno.
    NotStarted(i32),
    /// The command's first process was stopped by this signal.
    Stopped(libc::c_int),
    /// The command's first process ended: its wait status.
    Exited(libc::c_int),
    /// No PID namespace could be made for it: the errno.
    NoNamespace(i32),
    /// No PID namespace could be made, and none was required: the command
    /// runs without one, ended by the walk (the errno).
    Walked(i32),
}

impl Report {
    pub(super) fn encode(self) -> [u8; 5] {
        let (kind, value) = match self {
            Report::Started(v) => (1, v),
            Report::NotStarted(v) => (2, v),
            Report::Stopped(v) => (3, v),
            Report::Exited(v) => (4, v),
            Report::NoNamespace(v) => (5, v),
            Report::Walked(v) => (6, v),
        };
        let mut out = [kind; 5];
        out[1..].copy_from_slice(&value.to_le_bytes());
        out
    }

    pub(super) fn decode(bytes: [u8; 5]) -> Option<Report> {
        let value = i32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
        Some(match bytes[0] {
            1 => Report::Started(value),
            2 => Report::NotStarted(value),
            3 => Report::Stopped(value),
            4 => Report::Exited(value),
            5 => Report::NoNamespace(value),
            6 => Report::Walked(value),
            _ => return None,
        })
    }
}

/// `CLOCK_MONOTONIC` now, ns.
pub(super) fn monotonic_ns() -> u64 {
    // SAFETY: clock_gettime fills the zeroed timespec it is given.
    let t = unsafe {
        let mut t: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t);
        t
    };
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}

pub(super) fn encode_beat(sent_ns: u64) -> [u8; BEAT_LEN] {
    let mut out = [BEAT; BEAT_LEN];
    out[1..].copy_from_slice(&sent_ns.to_le_bytes());
    out
}

/// When the exec sent the beat `frame`, or None if it is not a beat.
pub(super) fn decode_beat(frame: &[u8]) -> Option<u64> {
    let (tag, sent) = frame.split_first()?;
    (*tag == BEAT).then_some(())?;
    Some(u64::from_le_bytes(sent.try_into().ok()?))
}

/// The moment (ns of `CLOCK_MONOTONIC`) by which the command must have been
/// ended, counting from a beat the exec sent at `sent_ns`.
pub(super) fn beat_deadline(sent_ns: u64, patience: Duration) -> u64 {
    sent_ns.saturating_add(u64::try_from(patience.as_nanos()).unwrap_or(u64::MAX))
}

/// The command and its environment as the supervisor reads them: each
/// argument `A<bytes>\0`, each variable `E<key>=<value>\0`, the user it
/// runs as `U<uid>,<gid>[,<group>...]\0`. (Neither argument nor variable
/// may hold a NUL: the kernel's exec could not pass one.)
pub(super) fn encode_spec(
    argv: &[String],
    env: &[(OsString, OsString)],
    pid_namespace: PidNamespace,
    run_as: Option<&Identity>,
) -> Vec<u8> {
    let mut out = Vec::new();
    match pid_namespace {
        PidNamespace::Require => out.extend(b"N\0"),
        PidNamespace::Prefer => out.extend(b"P\0"),
        PidNamespace::Never => {}
    }
    if let Some(ids) = run_as {
        let mut item = format!("U{},{}", ids.uid, ids.gid);
        for g in &ids.groups {
            item.push_str(&format!(",{g}"));
        }
        out.extend(item.as_bytes());
        out.push(0);
    }
    for a in argv {
        out.push(b'A');
        out.extend(a.as_bytes().iter().filter(|b| **b != 0));
        out.push(0);
    }
    for (k, v) in env {
        out.push(b'E');
        out.extend(k.as_bytes().iter().filter(|b| **b != 0));
        out.push(b'=');
        out.extend(v.as_bytes().iter().filter(|b| **b != 0));
        out.push(0);
    }
    out
}

/// The command as handed over.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Spec {
    pub(super) argv: Vec<OsString>,
    pub(super) env: Vec<(OsString, OsString)>,
    /// Whether the command runs in a PID namespace of its own.
    pub(super) pid_namespace: PidNamespace,
    /// The user it runs as (`--user`); None: the exec's.
    pub(super) run_as: Option<Identity>,
}

/// Whether the command runs in a PID namespace of its own, whose end the
/// kernel makes whole, or is ended by the walk in /proc.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PidNamespace {
    /// One of its own where one can be made (the default), else the walk,
    /// said on stderr.
    Prefer,
    /// One of its own, or the command does not run (`--pid-namespace`).
    Require,
    /// None: the walk (`--no-pid-namespace`; absent from the wire).
    #[default]
    Never,
}

impl PidNamespace {
    /// From the two flags (clap keeps them apart).
    pub fn from_flags(require: bool, never: bool) -> PidNamespace {
        match (require, never) {
            (true, _) => PidNamespace::Require,
            (false, true) => PidNamespace::Never,
            (false, false) => PidNamespace::Prefer,
        }
    }
}

pub(super) fn decode_spec(bytes: &[u8]) -> Option<Spec> {
    let mut spec = Spec::default();
    for item in bytes.split(|b| *b == 0).filter(|i| !i.is_empty()) {
        let (kind, rest) = item.split_first()?;
        match kind {
            b'A' => spec.argv.push(OsString::from_vec(rest.to_vec())),
            b'N' => spec.pid_namespace = PidNamespace::Require,
            b'P' => spec.pid_namespace = PidNamespace::Prefer,
            b'U' => spec.run_as = Some(decode_identity(rest)?),
            b'E' => {
                let eq = rest.iter().position(|b| *b == b'=')?;
                spec.env.push((
                    OsString::from_vec(rest[..eq].to_vec()),
                    OsString::from_vec(rest[eq + 1..].to_vec()),
                ));
            }
            _ => return None,
        }
    }
    (!spec.argv.is_empty()).then_some(spec)
}

/// `<uid>,<gid>[,<group>...]`, every number decimal.
fn decode_identity(item: &[u8]) -> Option<Identity> {
    let mut ids = std::str::from_utf8(item)
        .ok()?
        .split(',')
        .map(|n| n.parse::<u32>().ok());
    let uid = ids.next()??;
    let gid = ids.next()??;
    let groups = ids.collect::<Option<Vec<u32>>>()?;
    Some(Identity { uid, gid, groups })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_decode_to_what_was_encoded() {
        for r in [
            Report::Started(4242),
            Report::NotStarted(libc::ENOENT),
            Report::Stopped(libc::SIGTTIN),
            Report::Exited(-1),
            Report::NoNamespace(libc::EPERM),
            Report::Walked(libc::ENOSPC),
        ] {
            assert_eq!(Report::decode(r.encode()), Some(r));
        }
        assert_eq!(Report::decode([9, 0, 0, 0, 0]), None);
    }

    #[test]
    fn a_command_and_its_environment_cross_the_pipe_whole() {
        let argv = vec![
            "sh".to_owned(),
            "-c".to_owned(),
            "echo 'a=b' \"\"".to_owned(),
            String::new(),
        ];
        let env = vec![
            (OsString::from("A"), OsString::from("x=y")),
            (OsString::from("EMPTY"), OsString::new()),
        ];
        for ns in [
            PidNamespace::Require,
            PidNamespace::Prefer,
            PidNamespace::Never,
        ] {
            let spec = decode_spec(&encode_spec(&argv, &env, ns, None)).expect("decodes");
            assert_eq!(spec.pid_namespace, ns);
            assert_eq!(spec.run_as, None);
        }
        for groups in [vec![], vec![65534, 4, 27]] {
            let ids = Identity {
                uid: 65534,
                gid: 65533,
                groups,
            };
            let bytes = encode_spec(&argv, &env, PidNamespace::Never, Some(&ids));
            let spec = decode_spec(&bytes).expect("decodes");
            assert_eq!(spec.run_as, Some(ids));
        }
        assert_eq!(decode_spec(b"Ash\0U12\0"), None, "a user with no group");
        assert_eq!(decode_spec(b"Ash\0U1,x\0"), None, "not a number");
        let spec =
            decode_spec(&encode_spec(&argv, &env, PidNamespace::Prefer, None)).expect("decodes");
        let given: Vec<OsString> = argv.iter().map(OsString::from).collect();
        assert_eq!(spec.argv, given, "empty arguments kept");
        assert_eq!(spec.env, env);
        assert_eq!(decode_spec(b""), None, "no command");
        assert_eq!(decode_spec(b"Xjunk\0"), None);
    }
}
