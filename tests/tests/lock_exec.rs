//! `flashsale lock exec` and `flashsale semaphore exec` on every exit path,
//! against real lock nodes: a kill -9 of the exec, signals to it, a command
//! that reads the terminal, a lock lost while the command drains, a brief
//! loss of the nodes' majority, bad input, and names that must not collide.
//! Each test was seen failing before its fix (the attack on the lock CLIs).

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use flashsale::lock::{LockClient, LockConfig, LockOptions};
use flashsale_tests::{flashsale_bin, flashsale_cmd, kill_9_with_children, wait_for, RedisServer};

/// A wrapper that runs what follows it as uid and gid 65534 (nobody),
/// with no supplementary groups.
const AS_NOBODY: [&str; 5] = [
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
    "--",
];

/// A temporary directory anyone may write in (a command run as nobody
/// writes its findings there).
fn open_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::TempDir::new().expect("dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    dir
}

fn servers(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}

fn urls(s: &[RedisServer]) -> Vec<String> {
    s.iter().map(|s| s.url()).collect()
}

fn client(s: &[RedisServer]) -> LockClient {
    LockClient::new(
        &urls(s),
        LockConfig {
            watchdog_ttl: Duration::from_secs(2),
            ..LockConfig::default()
        },
    )
    .expect("lock client")
}

/// True while `pid` runs (a zombie, killed and waiting for its reaper, has
/// ended: it runs nothing).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X')),
        Err(_) => false,
    }
}

/// The pid a command wrote to `file`, once it has.
fn pid_in(file: &Path) -> u32 {
    let mut pid = None;
    wait_for(
        Duration::from_secs(30),
        || {
            pid = std::fs::read_to_string(file)
                .ok()
                .and_then(|s| s.trim().parse().ok());
            pid.is_some()
        },
        || format!("the command never wrote {}", file.display()),
    );
    pid.unwrap_or_default()
}

/// The exit status of `child` within `within`, or None (it is then killed).
fn exit_within(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let started = Instant::now();
    while started.elapsed() < within {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status();
}

/// A command for the exec that starts a background loop in its own group
/// (as a service's worker would), writes the loop's pid to `pid_file`, and
/// waits.
fn background_loop(pid_file: &Path) -> String {
    format!(
        "(while true; do sleep 0.2; done) & echo $! > {}; wait",
        pid_file.display()
    )
}

/// The exec's command left a background loop; kill -9 of the exec must not
/// leave it running once the lock can be taken again.
async fn killed_exec_leaves_no_command_behind(args: &[&str], name: &str) {
    let nodes = servers(3);
    let dir = tempfile::TempDir::new().expect("dir");
    let pid_file = dir.path().join("loop.pid");
    let script = background_loop(&pid_file);
    let mut exec = flashsale_cmd(None, None, &urls(&nodes))
        .args(args)
        .args(["--", "sh", "-c", &script])
        .spawn()
        .expect("spawn exec");
    let looping = pid_in(&pid_file);
    assert!(alive(looping));
    let _ = exec.kill();
    let _ = exec.wait();
    // The next holder gets it once the lease runs out; by then nothing of
    // the first command may run.
    let locks = client(&nodes);
    let next = locks
        .lock(
            name,
            &LockOptions::new("next").wait(Duration::from_secs(60)),
        )
        .await
        .expect("the lease of the killed exec runs out");
    let still = alive(looping);
    next.unlock().await;
    if still {
        signal(looping, "KILL");
    }
    assert!(
        !still,
        "the command's background loop outlived the lock of its killed exec"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_exec_killed_with_kill_9_leaves_nothing_of_its_command_running() {
    killed_exec_leaves_no_command_behind(
        &[
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            "L1",
            "--ttl",
            "2s",
        ],
        "L1",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_exec_killed_with_kill_9_leaves_nothing_of_its_command_running() {
    // One permit: the semaphore's only slot is what the next holder waits
    // for. Taken through the semaphore, as another exec would.
    let nodes = servers(3);
    let dir = tempfile::TempDir::new().expect("dir");
    let pid_file = dir.path().join("loop.pid");
    let script = background_loop(&pid_file);
    let mut exec = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "semaphore",
            "exec",
            "--no-pid-namespace",
            "--name",
            "S1",
            "--permits",
            "1",
            "--lease",
            "2s",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .spawn()
        .expect("spawn exec");
    let looping = pid_in(&pid_file);
    let _ = exec.kill();
    let _ = exec.wait();
    let locks = client(&nodes);
    let permit = locks
        .semaphore("S1")
        .expect("name")
        .acquire(
            1,
            &flashsale::lock::PermitOptions::new("next").wait(Duration::from_secs(60)),
        )
        .await
        .expect("the killed exec's permit comes back");
    let still = alive(looping);
    for p in permit {
        let _ = p.release().await;
    }
    if still {
        signal(looping, "KILL");
    }
    assert!(
        !still,
        "the command's background loop outlived the permit of its killed exec"
    );
}

/// The pids listed one a line in `file`, once it holds `count` of them.
fn pids_in(file: &Path, count: usize) -> Vec<u32> {
    let mut pids = Vec::new();
    wait_for(
        Duration::from_secs(60),
        || {
            pids = std::fs::read_to_string(file)
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect();
            pids.len() >= count
        },
        || format!("the command did not write {count} pids"),
    );
    pids
}

/// Runs `script` under `lock exec --name <name> --ttl 2s`, waits until it
/// has written `count` pids to `pid_file`, kills the exec with kill -9,
/// and takes the lock as the next holder: none of those pids may run then.
async fn none_left_after_kill_9(name: &str, script: &str, pid_file: &Path, count: usize) {
    let nodes = servers(3);
    let mut exec = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            name,
            "--ttl",
            "2s",
            "--",
            "sh",
            "-c",
        ])
        .arg(script)
        .spawn()
        .expect("spawn exec");
    let pids = pids_in(pid_file, count);
    let _ = exec.kill();
    let _ = exec.wait();
    let next = client(&nodes)
        .lock(
            name,
            &LockOptions::new("next").wait(Duration::from_secs(60)),
        )
        .await
        .expect("the lease of the killed exec runs out");
    let running: Vec<u32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    next.unlock().await;
    for p in &running {
        signal(*p, "KILL");
    }
    assert!(
        running.is_empty(),
        "{} of {count} processes the command started outlived the lock of its killed exec",
        running.len()
    );
}

/// From the fifth attack: a descendant made a group of its own and its
/// leader left before the exec's next look, so the group was never known,
/// and its worker (reparented to init) ran on past a kill -9 of the exec.
/// The supervisor is a child subreaper: orphans come to it, not to init.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_group_leader_left_is_killed_with_its_exec() {
    let dir = tempfile::TempDir::new().expect("dir");
    let pid_file = dir.path().join("worker.pid");
    let script = format!(
        "setsid sh -c '(while true; do sleep 0.2; done) & echo $! > {}'; sleep 600",
        pid_file.display()
    );
    none_left_after_kill_9("left-group", &script, &pid_file, 1).await;
}

/// From the fifth attack: the exec followed at most 64 groups the command
/// made, so the 65th and later ran on past a kill -9 of the exec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_with_seventy_sessions_of_its_own_is_killed_whole_with_its_exec() {
    let dir = tempfile::TempDir::new().expect("dir");
    let pid_file = dir.path().join("sessions.pid");
    let script = format!(
        "for i in $(seq 70); do setsid sleep 600 & echo $! >> {}; done; wait",
        pid_file.display()
    );
    none_left_after_kill_9("seventy", &script, &pid_file, 70).await;
}

/// From the fifth attack: with the command's worker out of its group, a
/// reaper killed on its own could not be replaced where it mattered, and a
/// kill -9 of the exec then left the worker beside the next holder. Now a
/// killed supervisor ends the command at once: its orphans come to the
/// exec (a subreaper too), which kills them all and gives the lock back.
#[test]
fn a_killed_supervisor_ends_everything_the_command_started() {
    let nodes = servers(3);
    let dir = tempfile::TempDir::new().expect("dir");
    let pid_file = dir.path().join("worker.pid");
    let script = format!(
        "setsid sh -c 'while true; do sleep 0.2; done' & echo $! > {}; wait",
        pid_file.display()
    );
    let mut exec = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            "sup",
            "--ttl",
            "2s",
            "--",
            "sh",
            "-c",
        ])
        .arg(&script)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn exec");
    let worker = pid_in(&pid_file);
    let out = Command::new("pgrep")
        .args(["-P", &exec.id().to_string(), "-x", "lease-reaper"])
        .output()
        .expect("pgrep");
    let supervisor: u32 = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the supervisor, named lease-reaper");
    signal(supervisor, "KILL");
    let status = exit_within(&mut exec, Duration::from_secs(60));
    let mut said = String::new();
    if let Some(mut e) = exec.stderr.take() {
        let _ = e.read_to_string(&mut said);
    }
    let still = alive(worker);
    if still {
        signal(worker, "KILL");
    }
    assert!(status.is_some(), "the exec ran on without its supervisor");
    assert!(!still, "the worker outlived the exec and its supervisor");
    assert!(said.contains("supervisor"), "it says why: {said:?}");
    assert_ne!(status.and_then(|s| s.code()), Some(0), "{said:?}");
    assert_eq!(
        nodes
            .iter()
            .map(|n| n.node.cmd::<i64>(&["EXISTS", "flashsale:lock:sup"]))
            .sum::<i64>(),
        0,
        "the lock went back at the exec's end"
    );
}

/// A command that ignores SIGTERM: the exec's SIGTERM (or SIGINT, SIGHUP)
/// gives it `--grace`, then kills its group and gives the lock back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signalled_exec_kills_a_command_that_ignores_sigterm_after_its_grace() {
    let nodes = servers(3);
    let dir = tempfile::TempDir::new().expect("dir");
    for sig in ["TERM", "INT", "HUP"] {
        let pid_file = dir.path().join(format!("{sig}.pid"));
        let script = format!(
            "trap '' TERM INT HUP; echo $$ > {}; while true; do sleep 0.1; done",
            pid_file.display()
        );
        let mut exec = flashsale_cmd(None, None, &urls(&nodes))
            .args([
                "lock",
                "exec",
                "--no-pid-namespace",
                "--name",
                "stubborn",
                "--ttl",
                "2s",
                "--grace",
                "1s",
                "--",
                "sh",
                "-c",
                &script,
            ])
            .spawn()
            .expect("spawn exec");
        let command = pid_in(&pid_file);
        signal(exec.id(), sig);
        let status = exit_within(&mut exec, Duration::from_secs(30));
        let still = alive(command);
        if still {
            signal(command, "KILL");
        }
        let status =
            status.unwrap_or_else(|| panic!("SIG{sig}: the exec waited on past its grace"));
        assert!(!still, "SIG{sig}: the command outlived its exec");
        assert_eq!(
            status.code(),
            Some(128 + 9),
            "SIG{sig}: the command was killed after its grace"
        );
        let locks = client(&nodes);
        let free = locks
            .try_lock("stubborn", &LockOptions::new("after"))
            .await
            .expect("nodes answer");
        assert!(free.is_some(), "SIG{sig}: the lock was given back");
        if let Some(g) = free {
            g.unlock().await;
        }
    }
}

/// After SIGTERM the command drains (for ever: it ignores the signal); the
/// lock is lost meanwhile (2 of 3 nodes stop). The exec must bound the
/// drain by its grace and act on the loss as it does before a signal: kill
/// the group and exit 79, not wait for the drain and exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_lost_while_the_command_drains_after_sigterm_kills_it_and_exits_79() {
    let nodes = servers(3);
    let dir = tempfile::TempDir::new().expect("dir");
    let pid_file = dir.path().join("drain.pid");
    let script = format!(
        "trap 'echo draining' TERM; echo $$ > {}; while true; do sleep 0.1; done",
        pid_file.display()
    );
    let mut exec = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            "drain",
            "--ttl",
            "1s",
            "--grace",
            "5s",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .spawn()
        .expect("spawn exec");
    let command = pid_in(&pid_file);
    signal(exec.id(), "TERM");
    nodes[1].node.signal("STOP");
    nodes[2].node.signal("STOP");
    let status = exit_within(&mut exec, Duration::from_secs(60));
    nodes[1].node.signal("CONT");
    nodes[2].node.signal("CONT");
    let still = alive(command);
    if still {
        signal(command, "KILL");
    }
    let status = status.expect("the exec acted on the lost lock within a minute");
    assert!(!still, "the command ran on without the lock");
    assert_eq!(
        status.code(),
        Some(79),
        "the exit code says the lock was lost"
    );
}

/// Runs `line` under a pseudo-terminal (`script(1)`) against `nodes`, with
/// its input held open and never written; its exit status within 60 s
/// (None: it hung, and was killed) and what the terminal showed. The lines
/// ask a 10 s lease: a 2 s one was lost to a loaded machine's slow renewal
/// (one node, 100 ms timeout), which ends the command for the lost lock
/// before the terminal stop these tests are about.
fn under_a_terminal(nodes: &[RedisServer], line: &str) -> (Option<ExitStatus>, String) {
    let mut term = Command::new("script")
        .args(["-qec", line, "/dev/null"])
        .env_remove("FLASHSALE_CONFIG")
        .env("FLASHSALE_LOCK_NODES", urls(nodes).join(","))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn script(1)");
    let stdin = term.stdin.take().expect("stdin");
    let status = exit_within(&mut term, Duration::from_secs(60));
    drop(stdin);
    let mut out = String::new();
    let _ = term.stdout.take().map(|mut o| o.read_to_string(&mut out));
    (status, out)
}

/// Under a terminal, a command that reads it is stopped by SIGTTIN (its
/// group is not the terminal's), and the exec held the lock for ever. It is
/// now ended at once with a clear error, and the lock goes back. (Handing
/// it the terminal was the first fix; it had three holes in a row, see
/// `command_group.rs`.)
#[test]
fn a_command_that_reads_the_terminal_is_ended_with_a_clear_error_not_left_holding_the_lock() {
    let nodes = servers(1);
    let line = format!(
        "{} lock exec --no-pid-namespace --name tty --ttl 10s -- sh -c 'read ans </dev/tty; echo got:$ans'",
        flashsale_bin().display()
    );
    let (status, out) = under_a_terminal(&nodes, &line);
    let status = status.unwrap_or_else(|| panic!("the command hung on the terminal: {out:?}"));
    assert!(out.contains("terminal"), "says why: {out:?}");
    assert_eq!(status.code(), Some(128 + libc::SIGTTIN), "{out:?}");
    assert_eq!(
        nodes[0].node.cmd::<i64>(&["EXISTS", "flashsale:lock:tty"]),
        0,
        "the lock went back"
    );
}

/// 2 of 3 lock nodes stop for a moment: `semaphore exec --wait` waits it
/// out as `lock exec` does, instead of failing at once.
#[test]
fn semaphore_exec_waits_out_a_brief_loss_of_the_majority() {
    let nodes = servers(3);
    nodes[1].node.signal("STOP");
    nodes[2].node.signal("STOP");
    let clients_before = nodes[0].node.connected_clients();
    let mut exec = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "semaphore",
            "exec",
            "--no-pid-namespace",
            "--name",
            "brief",
            "--permits",
            "2",
            "--wait",
            "60s",
            "--",
            "true",
        ])
        .spawn()
        .expect("spawn exec");
    // The exec has reached the one node that answers (and so is asking the
    // nodes) before the majority comes back.
    wait_for(
        Duration::from_secs(30),
        || nodes[0].node.connected_clients() > clients_before,
        || "the exec never reached the nodes".into(),
    );
    std::thread::sleep(Duration::from_millis(500));
    let early = exec.try_wait().ok().flatten();
    nodes[1].node.signal("CONT");
    nodes[2].node.signal("CONT");
    assert_eq!(early, None, "the exec gave up while it could still wait");
    let status = exit_within(&mut exec, Duration::from_secs(60)).expect("exits");
    assert!(
        status.success(),
        "it got a permit once the nodes came back: {status:?}"
    );
}

/// No majority for the whole `--wait`: exit 75, as `lock exec` does.
#[test]
fn semaphore_exec_without_a_majority_for_its_whole_wait_exits_75() {
    let nodes = servers(3);
    nodes[1].node.signal("STOP");
    nodes[2].node.signal("STOP");
    let mut exec = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "semaphore",
            "exec",
            "--no-pid-namespace",
            "--name",
            "none",
            "--permits",
            "1",
            "--wait",
            "2s",
            "--",
            "true",
        ])
        .spawn()
        .expect("spawn exec");
    let status = exit_within(&mut exec, Duration::from_secs(60));
    nodes[1].node.signal("CONT");
    nodes[2].node.signal("CONT");
    assert_eq!(status.expect("exits").code(), Some(75));
}

/// Bad input changes nothing: an owner too long for a permit is refused
/// before the permit total is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_exec_with_an_invalid_owner_leaves_the_permit_total_alone() {
    let nodes = servers(3);
    let locks = client(&nodes);
    let sem = locks.semaphore("total").expect("name");
    sem.set_permits(3).await.expect("set");
    let owner = "o".repeat(184);
    let out = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "semaphore",
            "exec",
            "--no-pid-namespace",
            "--name",
            "total",
            "--permits",
            "7",
            "--owner",
            &owner,
            "--",
            "true",
        ])
        .output()
        .expect("run");
    assert!(!out.status.success(), "refused");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("owner"),
        "says what is wrong: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        sem.permits().await.expect("read"),
        3,
        "the total is untouched"
    );
}

/// A fair-lock waiter signalled before it holds the lock leaves the queue,
/// so the next waiter does not wait out its entry's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_signalled_before_it_holds_the_lock_leaves_the_queue() {
    let nodes = servers(3);
    let locks = client(&nodes);
    let mut opts = LockOptions::new("holder");
    opts.fair = true;
    let held = locks.lock("line", &opts).await.expect("holder");
    let queued = || {
        nodes
            .iter()
            .map(|n| n.node.cmd::<i64>(&["ZCARD", "flashsale:fairq:line"]))
            .max()
            .unwrap_or(0)
    };
    // QUIT (Ctrl-\\) and USR1 from the third attack: unhandled, they ended
    // the exec as kill -9 does, its queue entry and count left behind.
    for sig in ["TERM", "INT", "HUP", "QUIT", "USR1"] {
        let mut exec = flashsale_cmd(None, None, &urls(&nodes))
            .args([
                "lock",
                "exec",
                "--no-pid-namespace",
                "--fair",
                "--name",
                "line",
                "--wait",
                "120s",
                "--",
                "true",
            ])
            .spawn()
            .expect("spawn exec");
        wait_for(
            Duration::from_secs(30),
            || queued() >= 1,
            || "the exec never queued".into(),
        );
        signal(exec.id(), sig);
        let status = exit_within(&mut exec, Duration::from_secs(30)).expect("exits");
        assert!(!status.success(), "SIG{sig}: it never ran the command");
        assert_eq!(queued(), 0, "SIG{sig}: its queue entry was left behind");
        // Nor its place in the waiter count (found by the attack: 8
        // signalled waiters left the count at 8 for their whole wait).
        let counted: i64 = nodes
            .iter()
            .map(|n| {
                n.node
                    .cmd::<Option<i64>>(&["GET", "flashsale:waiters:line"])
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        assert!(
            counted <= 0,
            "SIG{sig}: counted as a waiter after it left: {counted}"
        );
    }
    held.unlock().await;
}

/// A permit's slot is not a lock anyone can name: `lock exec` of
/// `sem:SX:0` must not take semaphore SX's only permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_named_like_a_permit_slot_does_not_take_the_permit() {
    let nodes = servers(3);
    let locks = client(&nodes);
    let squatter = locks
        .lock("sem:SX:0", &LockOptions::new("squatter"))
        .await
        .expect("lock");
    let status = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "semaphore",
            "exec",
            "--no-pid-namespace",
            "--name",
            "SX",
            "--permits",
            "1",
            "--wait",
            "2s",
            "--",
            "true",
        ])
        .status()
        .expect("run");
    squatter.unlock().await;
    assert!(status.success(), "the permit was free: {status:?}");
}

/// The same lock node listed twice (or by two names) would make every
/// majority impossible or meaningless: refused when the config is read.
#[test]
fn duplicate_lock_nodes_are_refused_by_config_check() {
    let nodes = servers(3);
    let port = nodes[0]
        .url()
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_owned();
    let same = nodes[0].url();
    for list in [
        vec![same.clone(), same.clone(), same.clone()],
        vec![
            format!("redis://127.0.0.1:{port}"),
            format!("redis://localhost:{port}"),
            nodes[1].url(),
        ],
    ] {
        let out = flashsale_cmd(None, None, &list)
            .args(["config", "check"])
            .output()
            .expect("run");
        assert!(!out.status.success(), "{list:?} accepted");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("the same lock node"),
            "{list:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = flashsale_cmd(None, None, &urls(&nodes))
        .args(["config", "check"])
        .output()
        .expect("run");
    assert!(out.status.success(), "three distinct nodes pass");
}

/// Two URLs that reach one server (a second address of the host, a proxy)
/// pass a look at the URLs; the client asks each node who it is at connect
/// and refuses to count one server twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_behind_two_addresses_is_never_counted_twice() {
    let nodes = [
        RedisServer::start_with(&["--bind", "127.0.0.1", "127.0.0.2"]),
        RedisServer::start(),
    ];
    let port = nodes[0]
        .url()
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_owned();
    // 127.0.0.2 reaches the same listener on Linux's loopback.
    let list = vec![
        format!("redis://127.0.0.1:{port}"),
        format!("redis://127.0.0.2:{port}"),
        nodes[1].url(),
    ];
    let locks = LockClient::new(&list, LockConfig::default()).expect("client");
    let taken = locks.try_lock("twice", &LockOptions::new("me")).await;
    let said = match &taken {
        Ok(Some(_)) => "granted".to_owned(),
        Ok(None) => "refused as held".to_owned(),
        Err(e) => e.to_string(),
    };
    assert!(
        matches!(taken, Err(flashsale::lock::LockError::Config(_)))
            && said.contains("the same lock node"),
        "{said}"
    );
}

/// The lines a holder's command logged (`A` lines from the first holder,
/// `B-start`/`B-end` from the next): true when the first holder wrote
/// while the next one was inside.
fn interleaved(log: &Path) -> bool {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut inside = false;
    for line in text.lines() {
        match line {
            "B-start" => inside = true,
            "B-end" => inside = false,
            "A" if inside => return true,
            _ => {}
        }
    }
    false
}

/// A command logging `A` every 50 ms, ignoring SIGTERM.
fn stubborn_logger(log: &Path, pid_file: &Path) -> String {
    format!(
        "trap '' TERM; echo $$ > {pid}; while true; do echo A >> {log}; sleep 0.05; done",
        pid = pid_file.display(),
        log = log.display()
    )
}

/// The next holder: logs its start and end around a second inside.
fn next_holder(nodes: &[RedisServer], name: &str, log: &Path) -> ExitStatus {
    let script = format!(
        "echo B-start >> {log}; sleep 1; echo B-end >> {log}",
        log = log.display()
    );
    flashsale_cmd(None, None, &urls(nodes))
        .args([
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            name,
            "--wait",
            "60s",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .status()
        .expect("run the next holder")
}

/// Found by the attack on the fixed CLIs: a lost lock only sent SIGTERM
/// and waited `--grace`, so a command that drains (or ignores SIGTERM) ran
/// on beside the next holder. A lost lock now kills the group at once.
#[test]
fn a_lost_lock_kills_the_command_before_the_next_holder_is_inside() {
    let nodes = servers(3);
    let dir = tempfile::TempDir::new().expect("dir");
    let (log, pid_file) = (dir.path().join("log"), dir.path().join("a.pid"));
    let mut first = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            "lost",
            "--ttl",
            "1s",
            "--",
            "sh",
            "-c",
        ])
        .arg(stubborn_logger(&log, &pid_file))
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let command = pid_in(&pid_file);
    let stderr = first.stderr.take().expect("stderr");
    nodes[1].node.signal("STOP");
    nodes[2].node.signal("STOP");
    // Until the exec has seen the loss (it says so).
    let mut said = String::new();
    let mut reader = std::io::BufReader::new(stderr);
    let seen = Instant::now();
    while !said.contains("lost") && seen.elapsed() < Duration::from_secs(60) {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut reader, &mut line).unwrap_or(0) == 0 {
            break;
        }
        said.push_str(&line);
    }
    nodes[1].node.signal("CONT");
    nodes[2].node.signal("CONT");
    assert!(said.contains("lost"), "the exec never saw the loss: {said}");
    let next = next_holder(&nodes, "lost", &log);
    let still = alive(command);
    let _ = first.kill();
    let _ = first.wait();
    if still {
        signal(command, "KILL");
    }
    assert!(next.success());
    assert!(
        !interleaved(&log),
        "the first holder's command wrote while the next holder was inside"
    );
}

/// Found by the attack: a stopped exec (SIGSTOP) renews nothing, yet its
/// command ran on beside the next holder. The reaper hears no heartbeat
/// and kills the group within half the lease.
#[test]
fn a_stopped_exec_does_not_leave_its_command_running_into_the_next_turn() {
    let nodes = servers(3);
    let dir = tempfile::TempDir::new().expect("dir");
    let (log, pid_file) = (dir.path().join("log"), dir.path().join("a.pid"));
    let mut first = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            "stopped",
            "--ttl",
            "1s",
            "--",
            "sh",
            "-c",
        ])
        .arg(stubborn_logger(&log, &pid_file))
        .spawn()
        .expect("spawn");
    let command = pid_in(&pid_file);
    signal(first.id(), "STOP");
    let next = next_holder(&nodes, "stopped", &log);
    let still = alive(command);
    signal(first.id(), "CONT");
    let status = exit_within(&mut first, Duration::from_secs(60));
    if still {
        signal(command, "KILL");
    }
    assert!(next.success());
    assert!(
        !interleaved(&log),
        "the stopped exec's command wrote while the next holder was inside"
    );
    assert_eq!(status.and_then(|s| s.code()), Some(79), "it lost the lock");
}

/// Found by the attack: Ctrl-Z stopped the command's group (the terminal's
/// foreground) while the exec ran on renewing the lock, so the shell never
/// got its prompt back and the lock was held by a stopped job. Now the exec
/// stops with it (job control), and the stopped job's command is ended by
/// its supervisor within 2/5 of the lease, so no lock is held by a stopped
/// job.
/// Run from an interactive bash under a pty, as a user would.
#[test]
fn ctrl_z_stops_the_exec_and_a_stopped_job_holds_no_lock() {
    let nodes = servers(1);
    let dir = tempfile::TempDir::new().expect("dir");
    let pid_file = dir.path().join("cmd.pid");
    let mut term = Command::new("script")
        .args(["-qec", "bash --norc --noprofile -i", "/dev/null"])
        .env_remove("FLASHSALE_CONFIG")
        .env("FLASHSALE_LOCK_NODES", urls(&nodes).join(","))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn script(1)");
    let mut stdin = term.stdin.take().expect("stdin");
    // From a wrapper script, as the second attack did (the job the shell
    // stops is the wrapper's, not the exec's alone).
    let line = format!(
        "bash -c \"{} lock exec --no-pid-namespace --name ctrlz --ttl 1s -- sh -c 'echo \\$\\$ > {}; sleep 60'; echo after\"\n",
        flashsale_bin().display(),
        pid_file.display()
    );
    stdin.write_all(line.as_bytes()).expect("type");
    stdin.flush().expect("flush");
    let command = pid_in(&pid_file);
    let parent_of = |pid: u32| -> Option<u32> {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.to_owned()))
            .and_then(|r| r.split_whitespace().nth(1).and_then(|p| p.parse().ok()))
    };
    // The command's parent is its supervisor; the supervisor's, the exec.
    let exec_pid = parent_of(command)
        .and_then(parent_of)
        .expect("the command's supervisor's parent");
    stdin.write_all(b"\x1a").expect("Ctrl-Z");
    stdin.flush().expect("flush");
    let state = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.chars().next()))
            .flatten()
    };
    let within = |what: &dyn Fn() -> bool| {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            if what() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    };
    let wrapper = parent_of(exec_pid).expect("the wrapper");
    // The whole job stops, the wrapper with it: that is what gives the
    // shell its prompt back.
    let stopped = within(&|| state(exec_pid) == Some('T') && state(wrapper) == Some('T'));
    let gone = stopped && within(&|| !alive(command));
    signal(exec_pid, "CONT");
    signal(exec_pid, "KILL");
    signal(command, "KILL");
    signal(wrapper, "KILL");
    let _ = stdin.write_all(b"exit\n");
    drop(stdin);
    let _ = term.kill();
    let _ = term.wait();
    assert!(
        stopped,
        "Ctrl-Z did not stop the exec (its shell never gets the prompt back)"
    );
    assert!(
        gone,
        "the stopped job's command ran on with no one renewing its lock"
    );
}

/// Found by the attack: a server whose ACL refuses INFO, listed under two
/// addresses, passed the run_id check and counted as 2 of 3. The check
/// now asks each node for a marker key of another's.
#[test]
fn one_server_behind_two_addresses_is_refused_even_when_info_is_not_allowed() {
    let twice = RedisServer::start_with(&["--bind", "127.0.0.1", "127.0.0.2"]);
    let _: () = twice.node.cmd(&[
        "ACL", "SETUSER", "lk", "on", ">pw", "~*", "&*", "+@all", "-info",
    ]);
    let port = twice
        .url()
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_owned();
    let list = vec![
        format!("redis://lk:pw@127.0.0.1:{port}"),
        format!("redis://lk:pw@127.0.0.2:{port}"),
        format!("redis://127.0.0.1:{}", flashsale_tests::free_port()),
    ];
    let out = flashsale_cmd(None, None, &list)
        .args([
            "lock",
            "exec",
            "--no-pid-namespace",
            "--read",
            "--name",
            "d5",
            "--wait",
            "2s",
            "--",
            "echo",
            "RAN",
        ])
        .output()
        .expect("run");
    let said = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !said.contains("RAN"),
        "one server counted twice granted it: {err}"
    );
    assert!(err.contains("the same lock node"), "{err}");
    assert!(!err.contains("pw@"), "no password in the error: {err}");
}

/// Found by the attack: a release no majority confirmed (2 of 3 nodes
/// paused as the command ended) turned the command's own exit code into
/// 79, though the lock was never lost. The command's code stands.
#[test]
fn an_unconfirmed_release_keeps_the_commands_exit_code() {
    let nodes = servers(3);
    let dir = tempfile::TempDir::new().expect("dir");
    let go = dir.path().join("go");
    let started = dir.path().join("started");
    let script = format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.05; done; exit 5",
        started.display(),
        go.display()
    );
    let mut exec = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            "rel",
            "--ttl",
            "10s",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .spawn()
        .expect("spawn");
    wait_for(
        Duration::from_secs(30),
        || started.exists(),
        || "the command never started".into(),
    );
    nodes[1].node.signal("STOP");
    nodes[2].node.signal("STOP");
    std::fs::write(&go, "").expect("go");
    let status = exit_within(&mut exec, Duration::from_secs(60));
    nodes[1].node.signal("CONT");
    nodes[2].node.signal("CONT");
    assert_eq!(status.and_then(|s| s.code()), Some(5));
}

/// From the second attack: a lease under the node timeout's reach could run
/// out before its loss was known, and the next holder get in while the
/// command ran. Such leases are refused.
#[test]
fn a_lease_too_short_to_learn_its_loss_in_time_is_refused() {
    let nodes = servers(1);
    for args in [
        vec![
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            "short",
            "--ttl",
            "90ms",
        ],
        vec![
            "semaphore",
            "exec",
            "--no-pid-namespace",
            "--name",
            "short",
            "--permits",
            "1",
            "--lease",
            "200ms",
        ],
    ] {
        let out = flashsale_cmd(None, None, &urls(&nodes))
            .args(&args)
            .args(["--", "true"])
            .output()
            .expect("run");
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("at least 500ms"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(nodes[0].node.cmd::<i64>(&["DBSIZE"]), 0, "nothing written");
}

/// From the second attack: a command that left its group (setsid), then
/// a reaper killed on its own: the replacement could not join the empty
/// group, stayed in the exec's own group, and its kill took the exec's
/// caller with it. The supervisor's death now ends the command, and the
/// exec kills only what is below itself. (`setsid -w`: the command leads
/// its own group, as a shell's job does, so setsid(1) forks and waits.)
#[test]
fn a_killed_supervisor_never_kills_the_execs_caller() {
    let nodes = servers(1);
    let dir = tempfile::TempDir::new().expect("dir");
    let survived = dir.path().join("survived");
    let started = dir.path().join("started");
    let script = format!(
        "{bin} lock exec --no-pid-namespace --name rp --ttl 1s -- sh -c 'echo $$ > {started}; exec setsid -w sleep 3'; \
         sleep 1; echo yes > {survived}",
        bin = flashsale_bin().display(),
        started = started.display(),
        survived = survived.display()
    );
    let mut caller = Command::new("setsid")
        .args(["sh", "-c", &script])
        .env_remove("FLASHSALE_CONFIG")
        .env("FLASHSALE_LOCK_NODES", urls(&nodes).join(","))
        .spawn()
        .expect("spawn");
    let command = pid_in(&started);
    // The command's parent is its supervisor, named lease-reaper.
    let stat = std::fs::read_to_string(format!("/proc/{command}/stat")).unwrap_or_default();
    let supervisor = stat
        .rsplit_once(") ")
        .and_then(|(_, r)| r.split_whitespace().nth(1).map(str::to_owned))
        .expect("the supervisor");
    let name = std::fs::read_to_string(format!("/proc/{supervisor}/comm")).unwrap_or_default();
    assert_eq!(name.trim(), "lease-reaper", "the command's parent");
    signal(supervisor.parse().expect("pid"), "KILL");
    let status = exit_within(&mut caller, Duration::from_secs(60));
    assert!(status.is_some(), "the caller never ended");
    assert_eq!(
        std::fs::read_to_string(&survived)
            .unwrap_or_default()
            .trim(),
        "yes",
        "the exec's caller was killed"
    );
}

/// From the second attack: under a least-privilege ACL (the lock scripts'
/// commands only, no MGET, keys under flashsale:lock:, fence:, waiters:),
/// the duplicate-node check could not run and let one server count twice.
#[test]
fn one_server_behind_two_addresses_is_refused_under_a_least_privilege_acl() {
    let twice = RedisServer::start_with(&["--bind", "127.0.0.1", "127.0.0.2"]);
    let _: () = twice.node.cmd(&[
        "ACL",
        "SETUSER",
        "lk",
        "on",
        ">pw",
        "resetkeys",
        "~flashsale:lock:*",
        "~flashsale:fence:*",
        "~flashsale:waiters:*",
        "resetchannels",
        "&*",
        "-@all",
        "+evalsha",
        "+script|load",
        "+get",
        "+set",
        "+del",
        "+exists",
        "+incr",
        "+incrby",
        "+pexpire",
        "+pttl",
        "+publish",
        "+time",
        "+zadd",
        "+zrange",
        "+zrangebyscore",
        "+zrem",
        "+subscribe",
        "+ping",
        "+hello",
    ]);
    let port = twice
        .url()
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_owned();
    let other = RedisServer::start();
    let list = vec![
        format!("redis://lk:pw@127.0.0.1:{port}"),
        format!("redis://lk:pw@127.0.0.2:{port}"),
        other.url(),
    ];
    let out = flashsale_cmd(None, None, &list)
        .args([
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            "acl",
            "--wait",
            "2s",
            "--",
            "echo",
            "RAN",
        ])
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("RAN"),
        "{err}"
    );
    assert!(err.contains("the same lock node"), "{err}");
}

/// From the third attack: a `semaphore exec` signalled while it waited for
/// a permit left its place in the slots' waiter counts (for a day, with a
/// long --wait), so releases kept publishing to nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_waiter_signalled_while_waiting_leaves_no_waiter_count() {
    let nodes = servers(3);
    let locks = client(&nodes);
    let sem = locks.semaphore("S3").expect("name");
    sem.set_permits(1).await.expect("set");
    let held = sem
        .acquire(1, &flashsale::lock::PermitOptions::new("holder"))
        .await
        .expect("the only permit");
    let key = "flashsale:waiters:sem\0S3\x000";
    let counted = || {
        nodes
            .iter()
            .map(|n| n.node.cmd::<Option<i64>>(&["GET", key]).unwrap_or(0))
            .max()
            .unwrap_or(0)
    };
    let mut exec = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "semaphore",
            "exec",
            "--no-pid-namespace",
            "--name",
            "S3",
            "--permits",
            "1",
            "--wait",
            "1440m",
            "--",
            "true",
        ])
        .spawn()
        .expect("spawn");
    wait_for(
        Duration::from_secs(30),
        || counted() >= 1,
        || "the exec never counted itself in".into(),
    );
    signal(exec.id(), "TERM");
    let status = exit_within(&mut exec, Duration::from_secs(30)).expect("exits");
    for p in held {
        let _ = p.release().await;
    }
    assert_eq!(status.code(), Some(128 + 15));
    assert!(counted() <= 0, "left counted as a waiter: {}", counted());
}

/// From the third attack: the reaper was a fork with the exec's name, so
/// stopping "the flashsale processes" by name (`killall -STOP flashsale`)
/// stopped both, and the command ran on beside the next holder. The reaper
/// has a name of its own, and goes on to kill the command.
#[test]
fn stopping_the_exec_by_its_name_does_not_stop_its_reaper() {
    let nodes = servers(3);
    let dir = tempfile::TempDir::new().expect("dir");
    let (log, pid_file) = (dir.path().join("log"), dir.path().join("a.pid"));
    let mut first = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            "named",
            "--ttl",
            "1s",
            "--",
            "sh",
            "-c",
        ])
        .arg(stubborn_logger(&log, &pid_file))
        .spawn()
        .expect("spawn");
    let command = pid_in(&pid_file);
    // What `killall -STOP flashsale` does to this exec and its children
    // (only them: other tests' execs run beside this one).
    let exec = first.id().to_string();
    let _ = Command::new("pkill")
        .args(["-STOP", "-x", "flashsale", "-P", &exec])
        .status();
    signal(first.id(), "STOP");
    let next = next_holder(&nodes, "named", &log);
    let still = alive(command);
    let _ = Command::new("pkill").args(["-CONT", "-P", &exec]).status();
    signal(first.id(), "CONT");
    let _ = exit_within(&mut first, Duration::from_secs(60));
    if still {
        signal(command, "KILL");
    }
    assert!(next.success());
    assert!(
        !interleaved(&log),
        "the command wrote while the next holder was inside"
    );
}

/// From the third attack: the reaper was a fork of the exec and shared its
/// command line, so `pkill -STOP -f 'lock exec'` stopped both, and the
/// command ran on beside the next holder. The reaper now runs anew under a
/// command line of its own.
#[test]
fn stopping_the_exec_by_its_command_line_does_not_stop_its_reaper() {
    let nodes = servers(3);
    let dir = tempfile::TempDir::new().expect("dir");
    let (log, pid_file) = (dir.path().join("log"), dir.path().join("a.pid"));
    let mut first = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            "by-cmdline",
            "--ttl",
            "1s",
            "--",
            "sh",
            "-c",
        ])
        .arg(stubborn_logger(&log, &pid_file))
        .spawn()
        .expect("spawn");
    let command = pid_in(&pid_file);
    // What `pkill -STOP -f 'lock exec'` does to this exec and its children
    // (only them: other tests' execs run beside this one).
    let exec = first.id().to_string();
    let _ = Command::new("pkill")
        .args(["-STOP", "-f", "lock exec", "-P", &exec])
        .status();
    signal(first.id(), "STOP");
    let next = next_holder(&nodes, "by-cmdline", &log);
    let still = alive(command);
    let _ = Command::new("pkill").args(["-CONT", "-P", &exec]).status();
    signal(first.id(), "CONT");
    let _ = exit_within(&mut first, Duration::from_secs(60));
    if still {
        signal(command, "KILL");
    }
    assert!(next.success());
    assert!(
        !interleaved(&log),
        "the command wrote while the next holder was inside"
    );
}

/// The state letter of `pid` (R, S, T, Z...), if it exists.
fn state_of(pid: u32) -> Option<char> {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()?
        .rsplit_once(") ")?
        .1
        .chars()
        .next()
}

/// From the third attack: a reaper stopped on its own (kill -STOP of its
/// pid) stayed stopped, so a kill -9 of the exec afterwards left the
/// command's background work running past the lease. The exec continues
/// its reaper at every heartbeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_reaper_is_continued_before_the_exec_can_die() {
    let nodes = servers(3);
    let dir = tempfile::TempDir::new().expect("dir");
    let pid_file = dir.path().join("loop.pid");
    let mut exec = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            "stopreaper",
            "--ttl",
            "2s",
            "--",
            "sh",
            "-c",
        ])
        .arg(background_loop(&pid_file))
        .spawn()
        .expect("spawn");
    let looping = pid_in(&pid_file);
    let out = Command::new("pgrep")
        .args(["-P", &exec.id().to_string(), "-x", "lease-reaper"])
        .output()
        .expect("pgrep");
    let reaper: u32 = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the reaper, named lease-reaper");
    signal(reaper, "STOP");
    wait_for(
        Duration::from_secs(10),
        || state_of(reaper) == Some('T'),
        || "the reaper never stopped".into(),
    );
    // Until the exec's heartbeat has continued it.
    wait_for(
        Duration::from_secs(60),
        || state_of(reaper).is_some_and(|s| s != 'T'),
        || "the stopped reaper was never continued".into(),
    );
    let _ = exec.kill();
    let _ = exec.wait();
    let locks = client(&nodes);
    let next = locks
        .lock(
            "stopreaper",
            &LockOptions::new("next").wait(Duration::from_secs(60)),
        )
        .await
        .expect("the lease runs out");
    let still = alive(looping);
    next.unlock().await;
    if still {
        signal(looping, "KILL");
    }
    assert!(!still, "the background loop outlived exec and reaper");
}

/// From the third attack: a wrapper hid a terminal read from the exec (the
/// reader is a grandchild, the direct child waits, running), so the lock
/// was held for as long as the wrapper waited. The exec looks through the
/// group for a stopped process and ends the command as for a direct stop.
#[test]
fn a_wrapper_that_hides_a_terminal_read_does_not_hold_the_lock_for_ever() {
    let nodes = servers(1);
    for (name, wrapped) in [
        ("wrapped-sh", "sh -c 'cat; echo after'"),
        ("wrapped-timeout", "timeout --foreground 600 cat"),
    ] {
        let line = format!(
            "{} lock exec --no-pid-namespace --name {name} --ttl 10s -- {wrapped}",
            flashsale_bin().display()
        );
        let (status, out) = under_a_terminal(&nodes, &line);
        let status =
            status.unwrap_or_else(|| panic!("{name}: the lock was held for ever: {out:?}"));
        assert!(out.contains("terminal"), "{name} says why: {out:?}");
        assert_eq!(status.code(), Some(128 + libc::SIGTTIN), "{name}: {out:?}");
        assert_eq!(
            nodes[0]
                .node
                .cmd::<i64>(&["EXISTS", &format!("flashsale:lock:{name}")]),
            0,
            "{name}: the lock went back"
        );
    }
}

/// From the fourth attack: `timeout(1)` moves its command into a group of
/// its own, so a lost lock's kill of the exec's group missed it and the
/// command ran on beside the next holder. The exec adopts every group a
/// descendant of the command leads and kills it with the command's.
#[test]
fn a_command_under_timeout_is_killed_when_the_lock_is_lost() {
    let nodes = servers(3);
    let dir = tempfile::TempDir::new().expect("dir");
    let (log, pid_file) = (dir.path().join("log"), dir.path().join("a.pid"));
    let mut first = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            "timed",
            "--ttl",
            "1s",
            "--",
            "timeout",
            "120",
            "sh",
            "-c",
        ])
        .arg(stubborn_logger(&log, &pid_file))
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let command = pid_in(&pid_file);
    let stderr = first.stderr.take().expect("stderr");
    nodes[1].node.signal("STOP");
    nodes[2].node.signal("STOP");
    let mut said = String::new();
    let mut reader = std::io::BufReader::new(stderr);
    let seen = Instant::now();
    while !said.contains("lost") && seen.elapsed() < Duration::from_secs(60) {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut reader, &mut line).unwrap_or(0) == 0 {
            break;
        }
        said.push_str(&line);
    }
    nodes[1].node.signal("CONT");
    nodes[2].node.signal("CONT");
    assert!(said.contains("lost"), "the exec never saw the loss: {said}");
    let next = next_holder(&nodes, "timed", &log);
    let still = alive(command);
    let status = exit_within(&mut first, Duration::from_secs(60));
    if still {
        signal(command, "KILL");
    }
    assert!(next.success());
    assert!(
        !interleaved(&log),
        "the command under timeout wrote while the next holder was inside"
    );
    assert!(!still, "the command under timeout outlived the lost lock");
    assert_eq!(status.and_then(|s| s.code()), Some(79), "it lost the lock");
}

/// From the fourth attack: with stderr a closed pipe (`... 2>&1 | head`),
/// every message panicked, and each exit code that comes with one became
/// 101. The codes stay what they say.
#[test]
fn a_closed_stderr_keeps_the_exit_codes() {
    let nodes = servers(1);
    let run = |args: &[&str]| {
        let mut child = flashsale_cmd(None, None, &urls(&nodes))
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        drop(child.stderr.take());
        exit_within(&mut child, Duration::from_secs(60)).and_then(|s| s.code())
    };
    assert_eq!(
        run(&[
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            "closed",
            "--",
            "/nonexistent/x"
        ]),
        Some(127),
        "not found"
    );
    let mut holder = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            "closed",
            "--",
            "sleep",
            "60",
        ])
        .spawn()
        .expect("spawn holder");
    wait_for(
        Duration::from_secs(30),
        || {
            nodes[0]
                .node
                .cmd::<i64>(&["EXISTS", "flashsale:lock:closed"])
                == 1
        },
        || "the holder never took the lock".into(),
    );
    let busy = run(&[
        "lock",
        "exec",
        "--no-pid-namespace",
        "--name",
        "closed",
        "--wait",
        "200ms",
        "--",
        "true",
    ]);
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(busy, Some(75), "not acquired");
}

/// From the fourth attack: SIGPWR, SIGXCPU, the real-time signals and the
/// like ended the exec without a release, so the next holder waited out the
/// lease. Each is handled as SIGTERM is: the command ends, the lock goes
/// back at once. From the seventeenth: SIGABRT too, which systemd sends on
/// a watchdog timeout (it is sent, not raised by a fault).
#[test]
fn every_catchable_terminating_signal_releases_the_lock() {
    let nodes = servers(1);
    for sig in ["PWR", "XCPU", "RTMIN+3", "ABRT"] {
        let name = format!("sig-{}", sig.replace('+', "-"));
        let mut exec = flashsale_cmd(None, None, &urls(&nodes))
            .args([
                "lock",
                "exec",
                "--no-pid-namespace",
                "--name",
                &name,
                "--ttl",
                "60s",
                "--",
                "sleep",
                "120",
            ])
            .spawn()
            .expect("spawn");
        let key = format!("flashsale:lock:{name}");
        wait_for(
            Duration::from_secs(30),
            || nodes[0].node.cmd::<i64>(&["EXISTS", &key]) == 1,
            || format!("{sig}: the lock was never taken"),
        );
        // The handlers are installed before the lock is asked for.
        signal(exec.id(), sig);
        let status = exit_within(&mut exec, Duration::from_secs(60));
        assert!(status.is_some(), "{sig}: the exec did not end");
        assert_eq!(
            nodes[0].node.cmd::<i64>(&["EXISTS", &key]),
            0,
            "{sig}: the lock went back at once, not with its 60 s lease"
        );
    }
}

/// From the fourth attack: under a terminal, a command that stops its own
/// worker for a moment was ended as if it waited on the terminal. Only a
/// stop that lasts is.
#[test]
fn a_command_that_pauses_its_own_worker_for_a_moment_is_let_be() {
    let nodes = servers(1);
    let line = format!(
        "{} lock exec --no-pid-namespace --name pauses --ttl 10s -- sh -c 'sleep 4 & p=$!; kill -STOP $p; sleep 2; kill -CONT $p; wait $p; echo finished'",
        flashsale_bin().display()
    );
    let (status, out) = under_a_terminal(&nodes, &line);
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{out:?}");
    assert!(out.contains("finished"), "{out:?}");
}

/// From the fifth attack: with stderr a pipe nobody reads, a message
/// blocked the exec in its write before the kill and the release, while
/// the watchdog renewed the lock: the lock stayed held with its command
/// dead, and the exec then gave the wrong reason. Messages never block.
#[test]
fn a_stderr_nobody_reads_never_holds_the_lock() {
    let nodes = servers(1);
    let mut exec = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            "blocked",
            "--ttl",
            "2s",
            "--grace",
            "1s",
            "--",
            "sh",
            "-c",
            "trap '' TERM; head -c 200000 /dev/zero >&2 & while true; do sleep 0.1; done",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Kept open and never read: the pipe fills and stays full.
    let _stderr = exec.stderr.take();
    let key = "flashsale:lock:blocked";
    wait_for(
        Duration::from_secs(30),
        || nodes[0].node.cmd::<i64>(&["EXISTS", key]) == 1,
        || "the lock was never taken".into(),
    );
    signal(exec.id(), "TERM");
    let status = exit_within(&mut exec, Duration::from_secs(60));
    let held = nodes[0].node.cmd::<i64>(&["EXISTS", key]);
    assert!(status.is_some(), "the exec hung on its stderr");
    assert_ne!(
        status.and_then(|s| s.code()),
        Some(79),
        "neither stopped nor starved, and the lock never lapsed"
    );
    assert_eq!(held, 0, "the lock went back at the exec's end");
}

/// The pids whose parent is `parent`, from /proc.
fn children(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    let (_, rest) = s.rsplit_once(") ")?;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

/// The supervisor of the exec `parent`: a child of it among the next
/// 4,096 pids above it named `lease-reaper` (the name it takes first
/// thing after its fork). The exec's self-test child (`exec-self-test`),
/// and a fork not yet named, are passed over.
fn newer_child(parent: u32) -> Option<u32> {
    (parent + 1..parent + 4_096).find(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                let (head, rest) = s.rsplit_once(") ")?;
                let named = head.ends_with("(lease-reaper");
                let ppid = rest.split_whitespace().nth(1)?.parse::<u32>().ok()?;
                Some(named && ppid == parent)
            })
            .unwrap_or(false)
    })
}

/// A command line longer than a pipe holds (64 KiB), so that handing it to
/// the supervisor takes more than one write.
fn long_arguments() -> Vec<String> {
    (0..100_000).map(|i| format!("a{i}")).collect()
}

/// Starts `lock exec --name <name> --ttl 1s -- sh -c <script> _ <long
/// arguments>` and stops its supervisor (SIGSTOP) before it has started the
/// command, retrying a few times when the supervisor was quicker. Returns
/// the exec and the stopped supervisor.
fn exec_with_its_supervisor_stopped_early(
    nodes: &[RedisServer],
    name: &str,
    script: &str,
) -> (Child, u32) {
    for _ in 0..10 {
        let mut exec = flashsale_cmd(None, None, &urls(nodes))
            .args([
                "lock",
                "exec",
                "--no-pid-namespace",
                "--name",
                name,
                "--ttl",
                "1s",
                "--",
                "sh",
                "-c",
            ])
            .arg(script)
            .arg("_")
            .args(long_arguments())
            .spawn()
            .expect("spawn");
        let started = Instant::now();
        let mut supervisor = None;
        // A busy look at the pids just above the exec's (the supervisor
        // is forked right after the grant): it must win the race with the
        // supervisor's start and its reading of the command.
        while started.elapsed() < Duration::from_secs(30) {
            if let Some(s) = newer_child(exec.id()) {
                // SAFETY: kill(2) of a process this test's exec started.
                unsafe { libc::kill(s as libc::pid_t, libc::SIGSTOP) };
                supervisor = Some(s);
                break;
            }
        }
        let supervisor = supervisor.expect("the exec started a supervisor");
        // (The exec may continue it at once: it continues a supervisor
        // stopped on its own.)
        if children(supervisor).is_empty() {
            return (exec, supervisor);
        }
        // Too late: it had started the command already. Again.
        signal(supervisor, "CONT");
        kill_9_with_children(&mut exec);
        let _ = exec.wait();
        std::thread::sleep(Duration::from_millis(1500));
    }
    panic!("the supervisor started the command every time before it could be stopped");
}

/// From the sixth attack: an exec stopped (Ctrl-Z) while it handed a long
/// command to its supervisor let its lease lapse; continued inside the next
/// holder's turn, it finished the hand-over and the command ran beside the
/// next holder. The supervisor now gives the hand-over and the word to
/// start the patience only, and the exec gives that word only while its
/// grant outlasts the patience.
#[test]
fn a_command_handed_over_after_the_lease_lapsed_never_runs_beside_the_next_holder() {
    let nodes = servers(3);
    let dir = tempfile::TempDir::new().expect("dir");
    let (log, pid_file) = (dir.path().join("log"), dir.path().join("a.pid"));
    let (mut first, supervisor) = exec_with_its_supervisor_stopped_early(
        &nodes,
        "handover",
        &stubborn_logger(&log, &pid_file),
    );
    signal(first.id(), "STOP");
    signal(supervisor, "CONT");
    let (next, status) = std::thread::scope(|scope| {
        let next = scope.spawn(|| next_holder(&nodes, "handover", &log));
        wait_for(
            Duration::from_secs(60),
            || {
                std::fs::read_to_string(&log)
                    .unwrap_or_default()
                    .contains("B-start")
            },
            || "the next holder never got in".into(),
        );
        signal(first.id(), "CONT");
        let next = next.join().expect("next holder");
        (next, exit_within(&mut first, Duration::from_secs(60)))
    });
    if let Some(pid) = std::fs::read_to_string(&pid_file)
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok())
    {
        signal(pid, "KILL");
    }
    assert!(next.success());
    assert!(
        !interleaved(&log),
        "the command handed over late wrote while the next holder was inside"
    );
    assert_eq!(status.and_then(|s| s.code()), Some(79), "its lease lapsed");
}

/// From the sixth attack: a supervisor stopped before it started the
/// command left the exec blocked in its hand-over (or waiting for the first
/// report) for ever, renewing the lock with nothing running, deaf to
/// SIGTERM. The exec continues it and handles signals throughout.
#[test]
fn a_supervisor_stopped_before_the_command_starts_does_not_hang_the_exec() {
    let nodes = servers(1);
    let (mut exec, _supervisor) =
        exec_with_its_supervisor_stopped_early(&nodes, "stalled", "sleep 60");
    // Until the command runs (the exec continued its supervisor), or a
    // few seconds: SIGTERM must end the exec in either case.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5)
        && !children(exec.id()).iter().any(|s| !children(*s).is_empty())
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(exec.id(), "TERM");
    let status = exit_within(&mut exec, Duration::from_secs(60));
    assert!(
        status.is_some(),
        "the exec hung with its supervisor stopped"
    );
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let locks = client(&nodes);
        let opts = LockOptions::new("next").wait(Duration::from_secs(30));
        let next = locks
            .lock("stalled", &opts)
            .await
            .expect("the lock comes back");
        next.unlock().await;
    });
}

/// From the sixth attack: the exec killed every child its process already
/// had (a caller that `exec`s into flashsale, as a container's entry point
/// does, after starting background work). It kills only what it started.
#[test]
fn the_exec_never_kills_what_its_caller_started_before_it() {
    let nodes = servers(1);
    let dir = tempfile::TempDir::new().expect("dir");
    let pid_file = dir.path().join("before.pid");
    let script = format!(
        "sleep 300 & echo $! > {pid}; exec {bin} lock exec --no-pid-namespace --name before --ttl 2s -- true",
        pid = pid_file.display(),
        bin = flashsale_bin().display()
    );
    let status = Command::new("sh")
        .args(["-c", &script])
        .env_remove("FLASHSALE_CONFIG")
        .env("FLASHSALE_LOCK_NODES", urls(&nodes).join(","))
        .status()
        .expect("run");
    let before = pid_in(&pid_file);
    let still = alive(before);
    signal(before, "KILL");
    assert!(status.success(), "{status:?}");
    assert!(still, "the exec killed a process its caller had started");
}

/// Starts `lock exec --name <name> --ttl 2s --grace 20s -- <command>` and
/// sends the exec's supervisor-to-be `sig` (to the exec, or with
/// `to_supervisor` to the supervisor) the moment the supervisor appears,
/// before it can start the command. Returns the exec's exit status and
/// what it said.
fn signalled_at_start(
    nodes: &[RedisServer],
    name: &str,
    command: &[&str],
    sig: libc::c_int,
    to_supervisor: bool,
) -> (Option<ExitStatus>, String) {
    signalled_at_start_with(nodes, name, command, sig, to_supervisor, &[])
}

/// [`signalled_at_start`] with `env` added to the exec's environment (a
/// large one keeps the exec handing the command over when the signal
/// lands).
fn signalled_at_start_with(
    nodes: &[RedisServer],
    name: &str,
    command: &[&str],
    sig: libc::c_int,
    to_supervisor: bool,
    env: &[(String, String)],
) -> (Option<ExitStatus>, String) {
    let mut exec = flashsale_cmd(None, None, &urls(nodes))
        .args([
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            name,
            "--ttl",
            "2s",
            "--grace",
            "20s",
            "--",
        ])
        .args(command)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        if let Some(s) = newer_child(exec.id()) {
            let target = if to_supervisor { s } else { exec.id() };
            // SAFETY: kill(2) of a process this test started (or its child).
            unsafe { libc::kill(target as libc::pid_t, sig) };
            break;
        }
    }
    let status = exit_within(&mut exec, Duration::from_secs(60));
    let mut said = String::new();
    if let Some(mut e) = exec.stderr.take() {
        let _ = e.read_to_string(&mut said);
    }
    (status, said)
}

/// From the seventh attack: SIGTERM as the supervisor started was sent to
/// no command (none ran yet), the command started afterwards, never saw
/// it, and was killed when the grace ran out (exit 137 after 20 s). A stop
/// signal before the command runs now ends the exec as one while waiting
/// does: the command never starts, exit 128 + the signal.
///
/// From the eighth attack: "it did not run" was said of a command that
/// had started (its start not yet told): said only when the word to start
/// was never given.
#[test]
fn a_stop_signal_as_the_command_starts_is_not_lost() {
    let nodes = servers(1);
    let dir = tempfile::TempDir::new().expect("dir");
    let ran = dir.path().join("ran");
    let script = format!(
        "touch {}; trap 'exit 3' TERM; sleep 30 & wait",
        ran.display()
    );
    let (status, said) = signalled_at_start(
        &nodes,
        "stop-at-start",
        &["sh", "-c", &script],
        libc::SIGTERM,
        false,
    );
    assert!(
        !(said.contains("did not run") && ran.exists()),
        "said the command did not run, and it ran: {said:?}"
    );
    let code = status.and_then(|s| s.code());
    assert!(
        matches!(code, Some(143) | Some(3)),
        "stopped at once, as the command's own answer to SIGTERM or 128 + 15: {code:?} {said:?}"
    );
    assert_eq!(
        nodes[0]
            .node
            .cmd::<i64>(&["EXISTS", "flashsale:lock:stop-at-start"]),
        0,
        "the lock went back"
    );
}

/// From the seventh attack: a supervisor killed before it started the
/// command made the exec exit 79 saying it had been stopped or starved; it
/// says the supervisor was killed and exits 137, as the docs' table has it.
#[test]
fn a_supervisor_killed_before_the_command_starts_is_told_as_killed() {
    let nodes = servers(1);
    let (status, said) = signalled_at_start(
        &nodes,
        "killed-at-start",
        &["sh", "-c", "echo started"],
        libc::SIGKILL,
        true,
    );
    assert_eq!(status.and_then(|s| s.code()), Some(137), "{said:?}");
    assert!(said.contains("supervisor was killed"), "{said:?}");
}

/// From CI at 51697ae: the supervisor killed while the exec was still
/// writing the command down to it broke the pipe, and the exec exited 1
/// with "cannot start the command's supervisor: Broken pipe" instead of
/// telling the kill. An environment larger than a pipe holds keeps the
/// hand-over going when the kill lands, so the race is not left to luck;
/// tried several times, as each try may still land after it.
#[test]
fn a_supervisor_killed_while_the_command_is_handed_over_is_told_as_killed() {
    let nodes = servers(1);
    // Twelve variables of 100 KiB: 1.2 MiB, about twenty pipe buffers,
    // each variable under the kernel's 128 KiB limit for one string.
    let env: Vec<(String, String)> = (0..12)
        .map(|i| (format!("FLASHSALE_TEST_BULK_{i}"), "x".repeat(100 * 1024)))
        .collect();
    for round in 0..5 {
        let (status, said) = signalled_at_start_with(
            &nodes,
            "killed-in-hand-over",
            &["sh", "-c", "echo started"],
            libc::SIGKILL,
            true,
            &env,
        );
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(137),
            "round {round}: {said:?}"
        );
        assert!(
            said.contains("supervisor was killed"),
            "round {round}: {said:?}"
        );
    }
}

/// From the seventh attack: the exec, a subreaper, took in the orphans of
/// children its caller had started before `exec`ing into flashsale, and
/// killed them with the command's. With children of its own from before,
/// it is no subreaper: their orphans go where they would have gone.
#[test]
fn the_exec_never_kills_what_its_callers_children_leave_behind() {
    let nodes = servers(1);
    let dir = tempfile::TempDir::new().expect("dir");
    let pid_file = dir.path().join("orphan.pid");
    let script = format!(
        "sh -c 'sleep 0.5; sleep 300 & echo $! > {pid}; exit 0' & \
         exec {bin} lock exec --no-pid-namespace --name orphans --ttl 2s -- sleep 2",
        pid = pid_file.display(),
        bin = flashsale_bin().display()
    );
    let status = Command::new("sh")
        .args(["-c", &script])
        .env_remove("FLASHSALE_CONFIG")
        .env("FLASHSALE_LOCK_NODES", urls(&nodes).join(","))
        .status()
        .expect("run");
    let orphan = pid_in(&pid_file);
    let still = alive(orphan);
    signal(orphan, "KILL");
    assert!(status.success(), "{status:?}");
    assert!(still, "the exec killed what its caller's child left behind");
}

/// From the seventh attack: twenty lines of processes that each fork their
/// successor and exit outran the kill that walks /proc, and ran on beside
/// the next holder. With `--pid-namespace` the command's first process is
/// the init of a PID namespace of its own, and its death makes the kernel
/// end every process of the namespace at once. (Needs CAP_SYS_ADMIN, which
/// the suite has: it runs as root.) A 10 s lease: a 2 s one was lost to a
/// loaded machine's slow renewal in a fresh-clone CI run, which ended the
/// command before the test looked at it; the next holder waits 60 s.
#[test]
fn a_command_in_its_own_pid_namespace_is_ended_whole_however_fast_it_forks() {
    let nodes = servers(3);
    let dir = tempfile::TempDir::new().expect("dir");
    let log = dir.path().join("log");
    // Each line: a process that logs, forks its successor and exits, for
    // at most 3,000 generations.
    let script = format!(
        "c() {{ [ \"$1\" -gt 0 ] || exit 0; echo A >> {log}; (c $(($1 - 1)) &); }}; \
         for i in $(seq 20); do c 3000 & done; sleep 600",
        log = log.display()
    );
    let mut exec = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "lock",
            "exec",
            "--name",
            "forks",
            "--ttl",
            "10s",
            "--pid-namespace",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .spawn()
        .expect("spawn");
    wait_for(
        Duration::from_secs(30),
        || std::fs::read_to_string(&log).unwrap_or_default().len() > 200,
        || "the command never forked".into(),
    );
    // The namespace's init (the supervisor's child) sees two pids of its
    // own: the host's and its namespace's.
    let supervisor = children(exec.id()).first().copied().expect("supervisor");
    let init = children(supervisor)
        .first()
        .copied()
        .expect("namespace init");
    let nspid = std::fs::read_to_string(format!("/proc/{init}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("NSpid:"))
        .map(|l| l.split_whitespace().count() - 1);
    assert_eq!(
        nspid,
        Some(2),
        "the command runs in a PID namespace of its own"
    );
    let _ = exec.kill();
    let _ = exec.wait();
    let status = next_holder(&nodes, "forks", &log);
    assert!(status.success());
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let after_b = text
        .split_once("B-start")
        .map(|(_, rest)| rest.lines().filter(|l| *l == "A").count())
        .unwrap_or(0);
    assert_eq!(
        after_b, 0,
        "a process of the command wrote after the next holder got in"
    );
}

/// The exec's supervisor and the init of the command's PID namespace (the
/// supervisor's child), once both run.
fn supervisor_and_namespace_init(exec: u32) -> (u32, u32) {
    let mut found = None;
    wait_for(
        Duration::from_secs(30),
        || {
            found = children(exec)
                .first()
                .and_then(|s| children(*s).first().map(|i| (*s, *i)));
            found.is_some()
        },
        || "no supervisor with a namespace init".into(),
    );
    found.unwrap_or_default()
}

/// From the eighth attack: the init of the command's PID namespace killed
/// on its own took the command with it, and nothing told the exec, which
/// held the lock for ever with nothing running. The supervisor tells the
/// command's end.
#[test]
fn a_namespace_init_killed_on_its_own_ends_the_exec_and_frees_the_lock() {
    let nodes = servers(1);
    let mut exec = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "lock",
            "exec",
            "--name",
            "ns-killed",
            "--ttl",
            "2s",
            "--pid-namespace",
            "--",
            "sleep",
            "60",
        ])
        .spawn()
        .expect("spawn");
    let (_, init) = supervisor_and_namespace_init(exec.id());
    signal(init, "KILL");
    let status = exit_within(&mut exec, Duration::from_secs(60));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(137),
        "killed, as the command was"
    );
    assert_eq!(
        nodes[0]
            .node
            .cmd::<i64>(&["EXISTS", "flashsale:lock:ns-killed"]),
        0,
        "the lock went back"
    );
}

/// From the eighth attack: `pkill -STOP lease-reaper` stopped the
/// namespace's init as well as the supervisor; the exec continues the
/// supervisor, but nothing continued the init, so the command's end was
/// never told and the lock stayed held. The supervisor continues it.
#[test]
fn a_stopped_namespace_init_is_continued_and_tells_the_command_s_end() {
    let nodes = servers(1);
    let mut exec = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "lock",
            "exec",
            "--name",
            "ns-stopped",
            "--ttl",
            "2s",
            "--pid-namespace",
            "--",
            "sh",
            "-c",
            "sleep 1; exit 5",
        ])
        .spawn()
        .expect("spawn");
    let (_, init) = supervisor_and_namespace_init(exec.id());
    signal(init, "STOP");
    let status = exit_within(&mut exec, Duration::from_secs(60));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(5),
        "the command's own code"
    );
}

/// Live processes whose environment holds `mark` (zombies have none).
fn marked_alive(mark: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == mark.as_bytes()))
        })
        .collect()
}

/// Runs `cmd` with its stderr read, waits up to `within` for its exit, and
/// kills every process still carrying `mark` (the command exports it):
/// the exit status, what it said, and how many were left.
fn run_and_sweep(
    cmd: &mut Command,
    mark: Option<&str>,
    within: Duration,
) -> (Option<ExitStatus>, String, usize) {
    let mut child = cmd.stderr(Stdio::piped()).spawn().expect("spawn");
    let status = exit_within(&mut child, within);
    let mut said = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut said);
    }
    let left = mark.map(marked_alive).unwrap_or_default();
    for pid in &left {
        signal(*pid, "KILL");
    }
    (status, said, left.len())
}

/// From the ninth attack: an exec that started with a child of its own
/// (a caller that starts background work and then `exec`s into flashsale)
/// is no subreaper, and its end killed the supervisor, the one subreaper
/// of the command's processes, first: what the command's background work
/// forked while the rest was being killed went to init and ran on into
/// the next holder's turn (35 to 163 processes, one try in two or three).
/// The supervisor now goes last, once nothing lives below it. The same for
/// `semaphore exec`, which ends its command the same way.
#[test]
fn the_commands_forks_never_outlive_an_exec_that_had_children_before() {
    let nodes = servers(1);
    let mark = format!("FLASHSALE_TEST_FORKER={}", std::process::id());
    let work = format!(
        "export {mark}; \
         ( i=0; while [ $i -lt 150 ]; do sh -c 'sleep 30' & i=$((i+1)); done ) & \
         sleep 0.05; exit 0"
    );
    let execs = [
        "lock exec --no-pid-namespace --name forker --ttl 2s",
        "semaphore exec --no-pid-namespace --name forkers --permits 1 --lease 2s",
    ];
    for round in 0..8 {
        let dir = tempfile::TempDir::new().expect("dir");
        let spared_pid = dir.path().join("spared.pid");
        let script = format!(
            "sleep 30 & echo $! > {pid}; exec {bin} {exec} -- sh -c \"$WORK\"",
            pid = spared_pid.display(),
            bin = flashsale_bin().display(),
            exec = execs[round % 2]
        );
        let status = Command::new("sh")
            .args(["-c", &script])
            .env_remove("FLASHSALE_CONFIG")
            .env("FLASHSALE_LOCK_NODES", urls(&nodes).join(","))
            .env("WORK", &work)
            .status()
            .expect("run");
        let left = marked_alive(&mark);
        for pid in &left {
            signal(*pid, "KILL");
        }
        signal(pid_in(&spared_pid), "KILL");
        assert!(status.success(), "round {round}: {status:?}");
        assert!(
            left.is_empty(),
            "round {round}: {} of the command's processes outlived the exec",
            left.len()
        );
    }
}

/// From the ninth attack: a signal sent to the command's process group
/// (SIGUSR1 for a log rotation, say) also reached the supervisor, which
/// leads the group and died of it; the command, which had a handler for
/// it, was killed with it and the exec said "supervisor was killed" (137).
/// The supervisor ignores every signal whose default would end it, and
/// the command handles its own. From the tenth attack: SIGXCPU, SIGXFSZ,
/// SIGABRT, SIGSYS and SIGTRAP still killed it.
#[test]
fn a_signal_to_the_commands_group_is_the_commands_not_the_supervisors() {
    for (sig, name) in [
        (libc::SIGUSR1, "USR1"),
        (libc::SIGXCPU, "XCPU"),
        (libc::SIGXFSZ, "XFSZ"),
        (libc::SIGABRT, "ABRT"),
        (libc::SIGSYS, "SYS"),
        (libc::SIGTRAP, "TRAP"),
    ] {
        group_signal_reaches_the_command_alone(sig, name);
    }
}

fn group_signal_reaches_the_command_alone(sig: libc::c_int, name: &str) {
    let nodes = servers(1);
    let dir = tempfile::TempDir::new().expect("dir");
    let (pid_file, got) = (dir.path().join("pid"), dir.path().join("got"));
    let script = format!(
        "trap 'touch {got}' {name}; echo $$ > {pid}; \
         while [ ! -e {got} ]; do sleep 0.05; done; exit 0",
        got = got.display(),
        pid = pid_file.display()
    );
    let mut exec = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            "group-signal",
            "--ttl",
            "2s",
            "--",
        ])
        .args(["sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let command = pid_in(&pid_file);
    let stat = std::fs::read_to_string(format!("/proc/{command}/stat")).expect("stat");
    let group: i32 = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.split_whitespace().nth(2)?.parse().ok())
        .expect("pgrp");
    assert_eq!(
        group, command as i32,
        "the command leads a group of its own, not its supervisor's"
    );
    // SAFETY: kill(2) of a process group this test's exec made.
    unsafe { libc::kill(-group, sig) };
    let status = exit_within(&mut exec, Duration::from_secs(30));
    let mut said = String::new();
    if let Some(mut e) = exec.stderr.take() {
        let _ = e.read_to_string(&mut said);
    }
    assert!(
        got.exists(),
        "SIG{name}: the command's handler ran: {status:?} {said:?}"
    );
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "SIG{name}: {said:?}"
    );
}

/// Runs `sleep 30 & exec flashsale lock exec ... -- sh -c <script>` (an
/// exec whose process has a child of its own, so no subreaper), with
/// `mark` exported into the command; `during` is called with the
/// command's first pid (the script's shell). Returns the exec's status,
/// what it said, and how many of the command's processes were still alive
/// after it ended (killed once counted).
fn exec_with_a_child_of_its_own(
    nodes: &[RedisServer],
    script: &str,
    mark: &str,
    dir: &Path,
    during: impl FnOnce(u32),
) -> (Option<ExitStatus>, String, usize) {
    let spared_pid = dir.join("spared.pid");
    let pid_file = dir.join("command.pid");
    let shell = format!(
        "sleep 30 >/dev/null 2>&1 & echo $! > {spared}; exec {bin} lock exec --no-pid-namespace --name orphaned --ttl 2s -- sh -c \"$WORK\"",
        spared = spared_pid.display(),
        bin = flashsale_bin().display()
    );
    // The command's output goes nowhere: a process of it that outlived the
    // exec would hold the exec's stderr pipe open, and the read below wait.
    let work = format!(
        "exec >/dev/null 2>&1; export {mark}; echo $$ > {}; {script}",
        pid_file.display()
    );
    let mut exec = Command::new("sh")
        .args(["-c", &shell])
        .env_remove("FLASHSALE_CONFIG")
        .env("FLASHSALE_LOCK_NODES", urls(nodes).join(","))
        .env("WORK", &work)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    during(pid_in(&pid_file));
    let status = exit_within(&mut exec, Duration::from_secs(60));
    let mut said = String::new();
    if let Some(mut e) = exec.stderr.take() {
        let _ = e.read_to_string(&mut said);
    }
    let left = marked_alive(mark);
    for pid in &left {
        signal(*pid, "KILL");
    }
    signal(pid_in(&spared_pid), "KILL");
    (status, said, left.len())
}

/// From the tenth attack: with no subreaper above it (the exec had a
/// child of its own), a process of the command whose main thread had left
/// (/proc shows it a zombie; its other threads fork on) was taken for
/// dead, and what it forked after the supervisor went ran on under init
/// into the next holder's turn (5 rounds in 8). A zombie with live threads
/// is alive; and whatever of the command went to init is found by the
/// mark the exec puts in its environment.
#[test]
fn a_zombie_whose_threads_still_fork_never_outlives_the_exec() {
    let nodes = servers(1);
    let forker = env!("CARGO_BIN_EXE_leaderless-forker");
    for round in 0..8 {
        let dir = tempfile::TempDir::new().expect("dir");
        let mark = format!("FLASHSALE_TEST_LEADERLESS={}-{round}", std::process::id());
        let script = format!("{forker} 400 2 & sleep 0.4; exit 0");
        let (status, said, left) =
            exec_with_a_child_of_its_own(&nodes, &script, &mark, dir.path(), |_| {});
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(0),
            "round {round}: {said:?}"
        );
        assert_eq!(
            left, 0,
            "round {round}: the command's processes outlived the exec"
        );
    }
}

/// From the tenth attack: with no subreaper above it, the supervisor
/// killed on its own left the command's background work to init; the exec
/// said it had ended everything, released, and the work ran beside the
/// next holder. It is found by the exec's mark and killed before the
/// release.
#[test]
fn a_supervisor_killed_with_no_subreaper_above_it_leaves_nothing_running() {
    let nodes = servers(1);
    let dir = tempfile::TempDir::new().expect("dir");
    let mark = format!("FLASHSALE_TEST_ORPHANED={}", std::process::id());
    let script = "(while true; do sleep 0.1; done) & (setsid sh -c 'sleep 30') & wait";
    let (status, said, left) =
        exec_with_a_child_of_its_own(&nodes, script, &mark, dir.path(), |command| {
            let stat = std::fs::read_to_string(format!("/proc/{command}/stat")).expect("stat");
            let supervisor: u32 = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok())
                .expect("ppid");
            signal(supervisor, "KILL");
        });
    assert_eq!(status.and_then(|s| s.code()), Some(137), "{said:?}");
    assert_eq!(
        left, 0,
        "the command's processes outlived the exec: {said:?}"
    );
    // From the eleventh attack: a process can hide the mark (rewrite its
    // environment's memory, as `$0 = ...` in perl does), so the lock is
    // not given back: it lapses with its lease.
    assert_eq!(
        nodes[0]
            .node
            .cmd::<i64>(&["EXISTS", "flashsale:lock:orphaned"]),
        1,
        "left to lapse, not released: {said:?}"
    );
    assert!(said.contains("left to lapse"), "{said:?}");
}

/// From the eleventh attack: with no subreaper above it (the exec had a
/// child of its own), a line of processes that each fork a successor and
/// exit within a few ms slipped between the exec's reads of /proc, went to
/// init once the supervisor was killed, and ran beside the next holder
/// while the exec exited 0 (6 runs in 6). The supervisor, a subreaper that
/// every orphan of the command comes to, now does the final kill and
/// exits 0 only when nothing is left below it; the exec waits for it.
#[test]
fn a_line_of_short_lived_processes_never_outlives_the_exec() {
    let nodes = servers(1);
    let chain = env!("CARGO_BIN_EXE_chain-forker");
    for round in 0..4 {
        let dir = tempfile::TempDir::new().expect("dir");
        let mark = format!("FLASHSALE_TEST_CHAIN={}-{round}", std::process::id());
        let script = format!(
            "{chain} 20000 {} & sleep 0.3; exit 0",
            1_000 + 1_000 * round
        );
        let (status, said, left) =
            exec_with_a_child_of_its_own(&nodes, &script, &mark, dir.path(), |_| {});
        assert_eq!(
            left, 0,
            "round {round}: the line outlived the exec: {status:?} {said:?}"
        );
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(0),
            "round {round}: {said:?}"
        );
    }
}

/// From the twelfth attack: with no subreaper above it, the supervisor
/// killed while it did its final kill (after the command's end) left the
/// rest of the command's processes to init; the exec took the supervisor's
/// death for "forked faster", killed nothing itself, and the survivors ran
/// on past the lease. The exec now ends what the supervisor left, by its
/// mark, and leaves the lock to lapse.
#[test]
fn a_supervisor_killed_during_its_final_kill_leaves_nothing_running() {
    let nodes = servers(1);
    let mut landed = 0;
    for round in 0..6 {
        let dir = tempfile::TempDir::new().expect("dir");
        let mark = format!("FLASHSALE_TEST_MIDKILL={}-{round}", std::process::id());
        let script = "i=0; while [ $i -lt 600 ]; do sleep 30 & i=$((i+1)); done; exit 0";
        let mut alive_at_kill = 0;
        let (status, said, left) =
            exec_with_a_child_of_its_own(&nodes, script, &mark, dir.path(), |command| {
                let stat = std::fs::read_to_string(format!("/proc/{command}/stat")).expect("stat");
                let supervisor: u32 = stat
                    .rsplit_once(") ")
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok())
                    .expect("ppid");
                // The command ends once its 600 sleeps run; they are then
                // the supervisor's, and its final kill begins.
                wait_for(
                    Duration::from_secs(60),
                    || !alive(command),
                    || "the command never ended".into(),
                );
                let sleeps = children(supervisor);
                let Some(first) = sleeps.iter().min().copied() else {
                    return;
                };
                let until = Instant::now() + Duration::from_secs(20);
                while alive(first) && Instant::now() < until {
                    std::hint::spin_loop();
                }
                signal_now(supervisor, libc::SIGKILL);
                alive_at_kill = sleeps.iter().filter(|p| alive(**p)).count();
            });
        assert_eq!(
            left, 0,
            "round {round}: the command's processes outlived the exec: {status:?} {said:?}"
        );
        if alive_at_kill == 0 {
            // The supervisor had finished before it was killed.
            continue;
        }
        landed += 1;
        eprintln!("round {round}: killed with {alive_at_kill} of the command's processes alive");
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(137),
            "round {round}: {said:?}"
        );
        assert!(said.contains("left to"), "round {round}: {said:?}");
    }
    assert!(landed > 0, "no kill landed while the supervisor killed");
}

/// kill(2) at once, without starting a `kill` process.
fn signal_now(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) of a process this test started (below its exec).
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

/// From the twelfth attack: a caller that ignores SIGCHLD (`perl -e
/// '$SIG{CHLD}="IGNORE"; exec flashsale lock exec ...'`) passes that on
/// across exec, and the kernel then reaps children unasked: the command's
/// end was never reported and the exec held the lock for ever.
#[test]
fn an_exec_started_with_sigchld_ignored_still_sees_its_command_end() {
    use std::os::unix::process::CommandExt;
    let nodes = servers(1);
    for exec in [
        "lock exec --no-pid-namespace --name ignoring --ttl 2s",
        "lock exec --name ignoring --ttl 2s --pid-namespace",
        "semaphore exec --no-pid-namespace --name ignorers --permits 1 --lease 2s",
    ] {
        let mut cmd = Command::new(flashsale_bin());
        cmd.args(exec.split_whitespace())
            .args(["--", "sh", "-c", "sleep 0.2; exit 3"])
            .env_remove("FLASHSALE_CONFIG")
            .env("FLASHSALE_LOCK_NODES", urls(&nodes).join(","));
        // SAFETY: signal(2) alone, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::signal(libc::SIGCHLD, libc::SIG_IGN);
                Ok(())
            });
        }
        let (status, said, _) = run_and_sweep(&mut cmd, None, Duration::from_secs(30));
        assert_eq!(status.and_then(|s| s.code()), Some(3), "{exec}: {said:?}");
    }
    assert_eq!(
        nodes[0]
            .node
            .cmd::<i64>(&["EXISTS", "flashsale:lock:ignoring"]),
        0,
        "the lock was not given back"
    );
}

/// From the thirteenth attack: an exec run by an ordinary user whose
/// command ran a setuid program that became another user (`sudo -u`, `su`,
/// here a setuid copy of setpriv) could not kill that process (EPERM); it
/// wrote on past the lock while the exec said "forked faster" and left the
/// lock. An unprivileged exec now runs its command with no_new_privs: the
/// setuid bit is not honoured, and every process stays killable.
#[test]
fn a_command_cannot_become_another_user_beyond_the_exec_s_reach() {
    use std::os::unix::fs::PermissionsExt;
    let nodes = servers(1);
    let dir = tempfile::TempDir::new().expect("dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let setuid = dir.path().join("setpriv");
    std::fs::copy("/usr/bin/setpriv", &setuid).expect("copy setpriv");
    std::fs::set_permissions(&setuid, std::fs::Permissions::from_mode(0o4755)).expect("setuid");
    let mark = format!("FLASHSALE_TEST_SUID={}", std::process::id());
    let work = format!(
        "exec >/dev/null 2>&1; export {mark}; \
         {} --reuid=1 --regid=1 --clear-groups -- sleep 30 & sleep 0.5; exit 0",
        setuid.display()
    );
    let (status, said, left) = run_and_sweep(
        Command::new("runuser")
            .args(["-u", "nobody", "--"])
            .arg(flashsale_bin())
            .args([
                "lock",
                "exec",
                "--no-pid-namespace",
                "--name",
                "suid",
                "--ttl",
                "2s",
                "--",
                "sh",
                "-c",
                &work,
            ])
            .env_remove("FLASHSALE_CONFIG")
            .env("FLASHSALE_LOCK_NODES", urls(&nodes).join(",")),
        Some(&mark),
        Duration::from_secs(60),
    );
    assert_eq!(
        left, 0,
        "a process of the command outlived the exec: {status:?} {said:?}"
    );
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{said:?}");
}

/// From the fourteenth attack: a process whose name, cut by the kernel at
/// 15 bytes, ends inside a character (`backup-日本語`) made /proc's stat
/// unreadable as text, and the kill skipped it and everything below it: it
/// ran on under init while the exec exited 0 and released (10 runs in 10).
#[test]
fn a_process_whose_name_is_cut_inside_a_character_is_killed_too() {
    let nodes = servers(1);
    let dir = tempfile::TempDir::new().expect("dir");
    let odd = dir.path().join("backup-日本語");
    std::fs::copy("/bin/sleep", &odd).expect("copy sleep");
    let mark = format!("FLASHSALE_TEST_CUT_NAME={}", std::process::id());
    let work = format!(
        "exec >/dev/null 2>&1; export {mark}; \"{}\" 30 & sleep 0.3; exit 0",
        odd.display()
    );
    for exec in [
        "lock exec --no-pid-namespace --name cut --ttl 2s",
        "semaphore exec --no-pid-namespace --name cuts --permits 1 --lease 2s",
    ] {
        let (status, said, left) = wrapped_exec(&nodes, &[], exec, &work, Some(&mark));
        assert_eq!(left, 0, "{exec}: it outlived the exec: {status:?} {said:?}");
        assert_eq!(status.and_then(|s| s.code()), Some(0), "{exec}: {said:?}");
    }
}

/// From the fourteenth attack: an exec without CAP_KILL (root with it
/// dropped; a user given ambient CAP_SETUID by a service manager) ran a
/// command that became another user, beyond its SIGKILL, and the next
/// holder ran beside it. Such a command does not run; the lock goes back.
#[test]
fn an_exec_that_cannot_kill_what_its_command_may_become_runs_nothing() {
    let nodes = servers(1);
    let dir = tempfile::TempDir::new().expect("dir");
    let ran = dir.path().join("ran");
    let work = format!("touch {}; exec sleep 30", ran.display());
    let out = Command::new("setpriv")
        .args(["--inh-caps=-kill", "--bounding-set=-kill", "--"])
        .arg(flashsale_bin())
        .args([
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            "nokill",
            "--ttl",
            "2s",
            "--",
            "sh",
            "-c",
            &work,
        ])
        .env_remove("FLASHSALE_CONFIG")
        .env("FLASHSALE_LOCK_NODES", urls(&nodes).join(","))
        .output()
        .expect("run");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("CAP_KILL"), "{said}");
    assert!(!ran.exists(), "the command ran: {said}");
    assert_eq!(
        nodes[0]
            .node
            .cmd::<i64>(&["EXISTS", "flashsale:lock:nokill"]),
        0,
        "the lock was given back"
    );
}

/// Runs `exec` (a `lock exec` or `semaphore exec` with its arguments),
/// through `wrapper` if one is given (a command line that ends where
/// flashsale's path goes), on `nodes`, its command `sh -c work`; kills
/// what of it still carries `mark` (see [`run_and_sweep`]).
fn wrapped_exec(
    nodes: &[RedisServer],
    wrapper: &[&str],
    exec: &str,
    work: &str,
    mark: Option<&str>,
) -> (Option<ExitStatus>, String, usize) {
    let mut cmd = match wrapper.split_first() {
        Some((first, rest)) => {
            let mut cmd = Command::new(first);
            cmd.args(rest).arg(flashsale_bin());
            cmd
        }
        None => Command::new(flashsale_bin()),
    };
    cmd.args(exec.split_whitespace())
        .args(["--", "sh", "-c", work])
        .env_remove("FLASHSALE_CONFIG")
        .env("FLASHSALE_LOCK_NODES", urls(nodes).join(","));
    run_and_sweep(&mut cmd, mark, Duration::from_secs(60))
}

/// From the fifteenth attack: under a /proc mounted with `hidepid=2`, an
/// ordinary user cannot see their own processes that are not dumpable (a
/// program only executable, not readable; one that set PR_SET_DUMPABLE 0).
/// The exec's kill never found such a process of its command: it tried for
/// 20 s, said "forked faster" and let the lock lapse with the process still
/// writing. An exec that cannot see everything its command may start now
/// refuses to run it, before it takes or sets anything, whoever runs it.
#[test]
fn a_command_whose_processes_proc_would_hide_never_runs() {
    use std::os::unix::fs::PermissionsExt;
    let nodes = servers(1);
    let dir = open_dir();
    // Executable, not readable, by others: its process is not dumpable.
    let hidden = dir.path().join("hidden-sleep");
    std::fs::copy("/bin/sleep", &hidden).expect("copy sleep");
    std::fs::set_permissions(&hidden, std::fs::Permissions::from_mode(0o711)).expect("chmod");
    let ran = dir.path().join("ran");
    let mark = format!("FLASHSALE_TEST_HIDEPID={}", std::process::id());
    let work = format!(
        "touch {}; exec >/dev/null 2>&1; export {mark}; {} 30 & sleep 0.3; exit 0",
        ran.display(),
        hidden.display()
    );
    // A mount namespace of its own, whose /proc hides what its user may
    // not ptrace (but from group 12345); `$0 "$@"` is the exec's command
    // line, run through `as_whom`.
    let under_hidepid = |as_whom: &str| -> Vec<String> {
        vec![
            "unshare".into(),
            "-m".into(),
            "--propagation".into(),
            "private".into(),
            "--".into(),
            "sh".into(),
            "-c".into(),
            format!(
                "mount -t proc -o hidepid=2,gid=12345 proc /proc && exec {as_whom} \"$0\" \"$@\""
            ),
        ]
    };
    // Each refused, from the fifteenth, sixteenth and nineteenth attacks:
    // an ordinary user; root in a user namespace of its own, whose
    // CAP_SYS_PTRACE counts only there (its command's unreadable program
    // was hidden from it, and wrote on into the next holder's turn); a
    // member of the mount's gid= group, a number the exec cannot compare
    // with its own groups once in a user namespace; root without
    // CAP_SYS_PTRACE even with --pid-namespace, whose exec still read
    // /proc for the caller's children and for SIGTERM; and root itself,
    // whose exception (CAP_SYS_PTRACE in the first user namespace) a user
    // namespace with a whole uid map passed for the first, so it is gone.
    let refused = [
        ("runuser -u nobody --", ""),
        ("unshare -U -r --", ""),
        ("setpriv --reuid=65534 --regid=65534 --groups=12345 --", ""),
        ("setpriv --bounding-set=-sys_ptrace --", " --pid-namespace"),
        ("", ""),
    ];
    for exec in [
        "lock exec --name hid --ttl 2s",
        "semaphore exec --name hids --permits 7 --lease 2s",
    ] {
        for (as_whom, flags) in refused {
            let wrapper = under_hidepid(as_whom);
            let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
            let exec = format!("{exec}{flags}");
            let (status, said, left) = wrapped_exec(&nodes, &wrapper, &exec, &work, Some(&mark));
            assert_eq!(
                left, 0,
                "{exec} ({as_whom}): outlived the exec: {status:?} {said:?}"
            );
            assert!(
                !ran.exists(),
                "{exec} ({as_whom}): the command ran: {status:?} {said:?}"
            );
            assert!(
                status.is_some_and(|s| !s.success()) && said.contains("hidepid"),
                "{exec} ({as_whom}): {status:?} {said:?}"
            );
            // Refused before it takes or sets anything.
            assert_eq!(
                nodes[0]
                    .node
                    .cmd::<i64>(&["EXISTS", "flashsale:sem:hids:permits"]),
                0,
                "{exec} ({as_whom}): the permit total was set"
            );
        }
    }
    assert_eq!(
        nodes[0].node.cmd::<i64>(&["EXISTS", "flashsale:lock:hid"]),
        0,
        "the lock was given back"
    );
}

/// From the fifteenth attack: an exec run in a PID namespace of its own
/// with its parent's /proc (`unshare -Urpf` without `--mount-proc`) read
/// pids of one namespace from /proc and signalled them in another: its
/// command's processes were not the ones it looked for, nor killed. Such an
/// exec now refuses to run its command, and says how to give it a /proc of
/// its own.
#[test]
fn an_exec_whose_proc_belongs_to_another_pid_namespace_runs_nothing() {
    let nodes = servers(1);
    let dir = tempfile::TempDir::new().expect("dir");
    let ran = dir.path().join("ran");
    let work = format!("touch {}; sleep 30 & exit 0", ran.display());
    for exec in [
        "lock exec --no-pid-namespace --name pidns --ttl 2s",
        "lock exec --name pidns --ttl 2s --pid-namespace",
        "semaphore exec --no-pid-namespace --name pidnss --permits 1 --lease 2s",
    ] {
        let (status, said, _) =
            wrapped_exec(&nodes, &["unshare", "-Urpf", "--"], exec, &work, None);
        assert!(
            !ran.exists(),
            "{exec}: the command ran: {status:?} {said:?}"
        );
        assert!(
            status.is_some_and(|s| !s.success()) && said.contains("--mount-proc"),
            "{exec}: {status:?} {said:?}"
        );
        // With a /proc of its namespace, it runs.
        let (status, said, _) = wrapped_exec(
            &nodes,
            &["unshare", "-Urpf", "--mount-proc", "--"],
            exec,
            &work,
            None,
        );
        assert!(
            ran.exists(),
            "{exec} with its own /proc: {status:?} {said:?}"
        );
        assert_eq!(status.and_then(|s| s.code()), Some(0), "{exec}: {said:?}");
        std::fs::remove_file(&ran).expect("rm");
    }
    assert_eq!(
        nodes[0]
            .node
            .cmd::<i64>(&["EXISTS", "flashsale:lock:pidns"]),
        0,
        "the lock was given back"
    );
}

/// From the eighteenth attack: in a PID namespace nested in one with its
/// own /proc (`unshare -Urpf --mount-proc`, then `unshare -pf`), a write to
/// `ns_last_pid` made the exec's pid in the inner namespace equal its pid
/// in the outer one, so `/proc/self` matched getpid() while every later
/// pid differed: the kill never found the command's orphan, which wrote on
/// beside the next holder. /proc is now this process's namespace's only
/// when `NSpid:` names one pid.
#[test]
fn an_exec_whose_pid_only_happens_to_match_its_proc_runs_nothing() {
    // The inner shell sets its namespace's last pid to the outer pid of a
    // process it just forked: its next child, the exec, gets the same pid
    // in both namespaces.
    let inner = "m=$(readlink /proc/self); echo $m > /proc/sys/kernel/ns_last_pid; \"$0\" \"$@\"";
    let outer = format!("unshare -pf -- sh -c '{inner}' \"$0\" \"$@\"");
    refused_before_running(
        &["unshare", "-Urpf", "--mount-proc", "--", "sh", "-c", &outer],
        "nspid",
        "--mount-proc",
    );
}

/// Runs `lock exec` and `semaphore exec` under `wrapper`, each with a
/// command that leaves a process behind, and checks that each refused
/// before its command ran, saying `says`, and left nothing running.
fn refused_before_running(wrapper: &[&str], name: &str, says: &str) {
    let nodes = servers(1);
    let dir = tempfile::TempDir::new().expect("dir");
    let ran = dir.path().join("ran");
    let mark = format!("FLASHSALE_TEST_REFUSED_{name}={}", std::process::id());
    let work = format!(
        "touch {}; exec >/dev/null 2>&1; export {mark}; sleep 30 & exit 0",
        ran.display()
    );
    for exec in [
        format!("lock exec --no-pid-namespace --name {name} --ttl 2s"),
        format!("semaphore exec --no-pid-namespace --name {name}s --permits 1 --lease 2s"),
    ] {
        let (status, said, left) = wrapped_exec(&nodes, wrapper, &exec, &work, Some(&mark));
        assert_eq!(left, 0, "{exec}: outlived the exec: {status:?} {said:?}");
        assert!(
            !ran.exists(),
            "{exec}: the command ran: {status:?} {said:?}"
        );
        assert!(
            status.is_some_and(|s| !s.success()) && said.contains(says),
            "{exec}: {status:?} {said:?}"
        );
    }
}

/// After the eighteenth attack, the fourth in a row to find a /proc the
/// exec trusted and should not have: `--pid-namespace`, whose kill the
/// kernel makes whole with no word from /proc, was root's alone (it needed
/// CAP_SYS_ADMIN) and refused an ordinary user. It now runs their command
/// in a PID namespace inside a user namespace of its own, as the same
/// user, and what the command left running dies with it.
#[test]
fn an_ordinary_user_s_command_gets_a_pid_namespace_of_its_own() {
    let nodes = servers(1);
    let dir = open_dir();
    let seen = dir.path().join("seen");
    let mark = format!("FLASHSALE_TEST_USERNS={}", std::process::id());
    let work = format!(
        "{{ id -u; grep NSpid /proc/self/status; grep NoNewPrivs /proc/self/status; }} > {}; \
         exec >/dev/null 2>&1; \
         export {mark}; sleep 30 & exit 0",
        seen.display()
    );
    for exec in [
        "lock exec --name userns --ttl 2s --pid-namespace",
        "semaphore exec --name usernss --permits 1 --lease 2s --pid-namespace",
    ] {
        let (status, said, left) = wrapped_exec(&nodes, &AS_NOBODY, exec, &work, Some(&mark));
        assert_eq!(left, 0, "{exec}: outlived the exec: {status:?} {said:?}");
        assert_eq!(status.and_then(|s| s.code()), Some(0), "{exec}: {said:?}");
        let seen_text = std::fs::read_to_string(&seen).unwrap_or_default();
        let mut lines = seen_text.lines();
        assert_eq!(lines.next(), Some("65534"), "{exec}: runs as the same user");
        let nspid = lines.next().map(|l| l.split_whitespace().count() - 1);
        assert_eq!(nspid, Some(2), "{exec}: in a PID namespace: {seen_text:?}");
        // From the nineteenth attack: the supervisor judged the command's
        // privileges inside its own user namespace, where it holds every
        // capability, and let it keep them (no no_new_privs).
        let nnp = lines.next().and_then(|l| l.split_whitespace().nth(1));
        assert_eq!(nnp, Some("1"), "{exec}: no new privileges: {seen_text:?}");
        std::fs::remove_file(&seen).expect("rm");
    }
    assert_eq!(
        nodes[0]
            .node
            .cmd::<i64>(&["EXISTS", "flashsale:lock:userns"]),
        0,
        "the lock was given back"
    );
}

/// From the nineteenth attack: root without CAP_SYS_ADMIN asking for
/// `--pid-namespace` got it inside a user namespace mapping root to root,
/// where the command held every capability the caller had dropped: with
/// DAC_OVERRIDE dropped, it read a file of mode 000. Root gets no user
/// namespace now: it needs CAP_SYS_ADMIN, and says so.
#[test]
fn root_without_cap_sys_admin_gets_no_capability_back_in_a_pid_namespace() {
    let nodes = servers(1);
    let dir = tempfile::TempDir::new().expect("dir");
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "secret").expect("write");
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o000))
        .expect("chmod");
    let ran = dir.path().join("ran");
    let work = format!(
        "touch {}; cat {} > {}.read",
        ran.display(),
        secret.display(),
        ran.display()
    );
    let dropped = [
        "setpriv",
        "--bounding-set=-sys_admin,-dac_override,-dac_read_search",
        "--inh-caps=-all",
        "--",
    ];
    let (status, said, _) = wrapped_exec(
        &nodes,
        &dropped,
        "lock exec --name rootns --ttl 2s --pid-namespace",
        &work,
        None,
    );
    assert!(!ran.exists(), "the command ran: {status:?} {said:?}");
    assert_eq!(status.and_then(|s| s.code()), Some(126), "{said:?}");
    assert!(said.contains("CAP_SYS_ADMIN"), "{said:?}");
}

/// From the eighteenth attack: a directory bind-mounted over /proc in a
/// user and mount namespace of the caller's, answering `self`, `status`,
/// `uid_map`, `mountinfo` and `fdinfo` as a real one would, passed every
/// check; the kill read its processes from it, found none, and the
/// command's orphan wrote on beside the next holder. /proc must now be a
/// procfs (`fstatfs` says PROC_SUPER_MAGIC) before anything it says counts.
#[test]
fn an_exec_on_a_proc_that_is_not_procfs_runs_nothing() {
    let dir = tempfile::TempDir::new().expect("dir");
    let fake = dir.path().join("fake-proc");
    // A copy of what the shell's /proc says of it (the shell then becomes
    // the exec, pid and all), with every descriptor's mount id the real
    // /proc's.
    let build = format!(
        "set -e; p=$$; f={fake}; rm -rf $f; mkdir -p $f/$p/fdinfo; \
         for n in status uid_map gid_map mountinfo; do cat /proc/$p/$n > $f/$p/$n; done; \
         id=$(awk '$5 == \"/proc\" && / - proc / {{ print $1 }}' /proc/$p/mountinfo | tail -n1); \
         for i in $(seq 0 255); do printf 'pos:\t0\nflags:\t0\nmnt_id:\t%s\n' $id > $f/$p/fdinfo/$i; done; \
         ln -s \"$0\" $f/$p/exe; ln -s $p $f/self; \
         mount --bind $f /proc; exec \"$0\" \"$@\"",
        fake = fake.display()
    );
    refused_before_running(
        &["unshare", "-Urm", "--", "sh", "-c", &build],
        "fakeproc",
        "not a procfs",
    );
}

/// Found while fixing the eighteenth attack: a real /proc entry of another
/// process (`mount --bind /proc/1 /proc/$$`) bound over the exec's own
/// answers for it, `NSpid:` and all, so the new `NSpid:` check alone would
/// pass it. (The old checks refused it only by chance: pid 1 had no
/// descriptor of the number the exec looked up in `fdinfo`.) A file of
/// `/proc/self` must be on the /proc mount itself.
#[test]
fn an_exec_whose_proc_entry_is_covered_by_another_runs_nothing() {
    refused_before_running(
        &[
            "unshare",
            "-Urm",
            "--",
            "sh",
            "-c",
            "mount --bind /proc/1 /proc/$$ && exec \"$0\" \"$@\"",
        ],
        "covered",
        "covered by another mount",
    );
}

/// From the seventeenth attack: the command's processes run as the exec's
/// user, and could open the supervisor's control pipe through
/// `/proc/<lease-reaper>/fd/<n>` (the number is its argv[1]): one forged
/// heartbeat stamped far ahead, the pipe held open, and a kill -9 of the
/// exec left the command writing beside the next holder (4 runs in 4). The
/// exec and its supervisor are not dumpable now: their /proc entries belong
/// to root, out of an ordinary user's reach.
#[test]
fn a_command_cannot_forge_its_exec_s_heartbeat() {
    let nodes = servers(1);
    let dir = open_dir();
    let mark = format!("FLASHSALE_TEST_FORGE={}", std::process::id());
    let forged = dir.path().join("forged");
    // The supervisor is the command's parent; its argv[1] is the control
    // pipe's descriptor. A beat is tag 2 and 8 bytes of send time.
    let forge = format!(
        "exec >/dev/null 2>&1; export {mark}; \
         ctl=$(tr '\\0' '\\n' < /proc/$PPID/cmdline | sed -n 2p); \
         exec 9>/proc/$PPID/fd/$ctl && printf '\\002\\377\\377\\377\\377\\377\\377\\377\\177' >&9 \
           && touch {}; \
         sleep 60",
        forged.display()
    );
    let mut exec = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(flashsale_bin())
        .args([
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            "forge",
            "--ttl",
            "1s",
            "--",
            "bash",
            "-c",
            &forge,
        ])
        .env_remove("FLASHSALE_CONFIG")
        .env("FLASHSALE_LOCK_NODES", urls(&nodes).join(","))
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    wait_for(
        Duration::from_secs(30),
        || !marked_alive(&mark).is_empty(),
        || "the command never started".into(),
    );
    // Time for the forgery to be tried (it fails fast or succeeds fast).
    std::thread::sleep(Duration::from_millis(500));
    signal(exec.id(), "KILL");
    let _ = exec.wait();
    // The next holder gets the lock once the lease lapses; by then the
    // supervisor must have ended the command.
    let next = Command::new(flashsale_bin())
        .args([
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            "forge",
            "--ttl",
            "1s",
            "--wait",
            "20s",
            "--",
            "true",
        ])
        .env_remove("FLASHSALE_CONFIG")
        .env("FLASHSALE_LOCK_NODES", urls(&nodes).join(","))
        .status()
        .expect("next holder");
    let left = marked_alive(&mark);
    for pid in &left {
        signal(*pid, "KILL");
    }
    assert_eq!(next.code(), Some(0), "the next holder got the lock");
    assert!(
        left.is_empty(),
        "the command outlived its killed exec into the next holder's turn (forged: {})",
        forged.exists()
    );
    assert!(!forged.exists(), "the control pipe could be opened");
}

/// From the seventeenth attack: the hidepid check read the options of the
/// last /proc line in mountinfo, which after `mount --move` is not the
/// mount on top: a plain /proc listed last hid a hidepid one in use, and
/// the exec ran a command whose non-dumpable writer it could not see. The
/// /proc in use is the one an open descriptor on it names (its mnt_id).
#[test]
fn a_hidepid_proc_moved_over_another_is_still_seen() {
    let nodes = servers(1);
    let dir = tempfile::TempDir::new().expect("dir");
    let ran = dir.path().join("ran");
    std::fs::create_dir(dir.path().join("mp")).expect("mp");
    std::fs::create_dir(dir.path().join("mq")).expect("mq");
    let script = format!(
        "mount -t proc -o hidepid=2 proc {d}/mp && mount -t proc proc {d}/mq && \
         mount --move {d}/mq /proc && mount --move {d}/mp /proc && \
         exec setpriv --reuid=65534 --regid=65534 --clear-groups -- \"$0\" \"$@\"",
        d = dir.path().display()
    );
    let work = format!("touch {}", ran.display());
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .expect("chmod");
    let (status, said, _) = wrapped_exec(
        &nodes,
        &[
            "unshare",
            "-m",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            &script,
        ],
        "lock exec --no-pid-namespace --name moved --ttl 2s",
        &work,
        None,
    );
    assert!(!ran.exists(), "the command ran: {status:?} {said:?}");
    assert!(
        status.is_some_and(|s| !s.success()) && said.contains("hidepid"),
        "{status:?} {said:?}"
    );
}

/// From the seventeenth attack: a caller that blocked SIGTERM (a signal
/// mask is inherited across exec) made the exec deaf to it: SIGTERM while
/// waiting was lost, and the command ran once the lock came free. The exec
/// starts with no signal blocked.
#[test]
fn a_stop_signal_blocked_by_the_caller_still_stops_the_exec() {
    let nodes = servers(1);
    let dir = tempfile::TempDir::new().expect("dir");
    let ran = dir.path().join("ran");
    let mut holder = flashsale_cmd(None, None, &urls(&nodes))
        .args([
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            "masked",
            "--ttl",
            "5s",
            "--",
            "sleep",
            "4",
        ])
        .spawn()
        .expect("holder");
    wait_for(
        Duration::from_secs(30),
        || {
            nodes[0]
                .node
                .cmd::<i64>(&["EXISTS", "flashsale:lock:masked"])
                == 1
        },
        || "the holder never took the lock".into(),
    );
    let blocked = "import os, signal, sys; \
         signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT}); \
         os.execv(sys.argv[1], sys.argv[1:])";
    let mut waiter = Command::new("python3")
        .args(["-c", blocked])
        .arg(flashsale_bin())
        .args([
            "lock",
            "exec",
            "--no-pid-namespace",
            "--name",
            "masked",
            "--ttl",
            "5s",
            "--wait",
            "30s",
            "--",
            "touch",
        ])
        .arg(&ran)
        .env_remove("FLASHSALE_CONFIG")
        .env("FLASHSALE_LOCK_NODES", urls(&nodes).join(","))
        .spawn()
        .expect("waiter");
    // Waiting: counted among the lock's waiters on the node.
    wait_for(
        Duration::from_secs(30),
        || {
            nodes[0]
                .node
                .cmd::<i64>(&["EXISTS", "flashsale:waiters:masked"])
                == 1
        },
        || "the waiter never waited".into(),
    );
    signal(waiter.id(), "TERM");
    // A generous bound for a loaded machine: a waiter deaf to SIGTERM gets
    // the lock when the holder ends (4 s) and runs the command, which the
    // assertions below catch whatever the bound.
    let status = exit_within(&mut waiter, Duration::from_secs(30));
    let _ = holder.wait();
    assert_eq!(status.and_then(|s| s.code()), Some(143), "{status:?}");
    assert!(!ran.exists(), "the command ran after SIGTERM");
}

/// A seccomp filter the caller installs on itself (no privilege needed
/// under no_new_privs), inherited by the exec it starts: each rule makes
/// one system call (with a first argument of `arg0`, if given) fail with
/// `errno`, or succeed doing nothing when `errno` is 0.
#[derive(Clone, Copy)]
struct Fake {
    call: libc::c_long,
    arg0: Option<u32>,
    errno: u32,
}

/// A classic BPF program for [`Fake`] rules: load the call's number, and
/// for each rule, on a match (and a matching first argument) return its
/// errno; allow everything else.
fn seccomp_program(rules: &[Fake]) -> Vec<libc::sock_filter> {
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    const RET_ALLOW: u32 = 0x7fff_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let mut prog = Vec::new();
    for rule in rules {
        // seccomp_data: nr at 0, the first argument's low word at 16.
        prog.push(op(LD_W_ABS, 0, 0, 0));
        match rule.arg0 {
            None => {
                prog.push(op(JEQ_K, 0, 1, rule.call as u32));
            }
            Some(arg) => {
                prog.push(op(JEQ_K, 0, 3, rule.call as u32));
                prog.push(op(LD_W_ABS, 0, 0, 16));
                prog.push(op(JEQ_K, 0, 1, arg));
            }
        }
        prog.push(op(RET_K, 0, 0, RET_ERRNO | rule.errno));
    }
    prog.push(op(RET_K, 0, 0, RET_ALLOW));
    prog
}

/// `cmd`, whose process installs `rules` before its exec.
fn under_seccomp(cmd: &mut Command, rules: &[Fake]) {
    use std::os::unix::process::CommandExt;
    let prog = seccomp_program(rules);
    // SAFETY: the closure makes two prctl calls on the child's own state;
    // the program it points at is moved into the closure and lives as
    // long as it does.
    unsafe {
        cmd.pre_exec(move || {
            let fprog = libc::sock_fprog {
                len: prog.len() as u16,
                filter: prog.as_ptr() as *mut libc::sock_filter,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &fprog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// From the twentieth attack: a seccomp filter the caller installed on
/// the exec, which the supervisor inherits, made kill(2) fail with EPERM
/// and wait4 say ECHILD; the kill took the refusals for "gone" and the
/// empty answer for an empty tree, and the exec gave the lock back while
/// the command's writer ran on beside the next holder (8 runs of 8, with
/// and without `--pid-namespace`, where prctl(PR_SET_PDEATHSIG) was made
/// to do nothing). The exec now proves it can kill and reap a child of
/// its own before it takes anything, and refuses to run otherwise; each
/// faked call is tried on both execs.
#[test]
fn an_exec_whose_kill_or_reap_a_seccomp_filter_fakes_runs_nothing() {
    let nodes = servers(1);
    let dir = tempfile::TempDir::new().expect("dir");
    let ran = dir.path().join("ran");
    let mark = format!("FLASHSALE_TEST_SECCOMP={}", std::process::id());
    let work = format!(
        "touch {}; exec >/dev/null 2>&1; export {mark}; sleep 30 & exit 0",
        ran.display()
    );
    let fake = |call, arg0, errno| Fake { call, arg0, errno };
    let cases = [
        (
            "kill refused",
            fake(libc::SYS_kill, None, libc::EPERM as u32),
        ),
        ("kill does nothing", fake(libc::SYS_kill, None, 0)),
        ("no child", fake(libc::SYS_wait4, None, libc::ECHILD as u32)),
        ("empty /proc", fake(libc::SYS_getdents64, None, 0)),
        (
            "death signal does nothing",
            fake(libc::SYS_prctl, Some(libc::PR_SET_PDEATHSIG as u32), 0),
        ),
    ];
    for (case, rule) in cases {
        for exec in [
            "lock exec --no-pid-namespace --name seccomp --ttl 10s",
            "semaphore exec --name seccomps --permits 1 --lease 10s --pid-namespace",
        ] {
            let mut cmd = Command::new(flashsale_bin());
            cmd.args(exec.split_whitespace())
                .args(["--", "sh", "-c", &work])
                .env_remove("FLASHSALE_CONFIG")
                .env("FLASHSALE_LOCK_NODES", urls(&nodes).join(","));
            under_seccomp(&mut cmd, &[rule]);
            let (status, said, left) =
                run_and_sweep(&mut cmd, Some(&mark), Duration::from_secs(60));
            assert_eq!(left, 0, "{case}, {exec}: outlived the exec: {said:?}");
            assert!(!ran.exists(), "{case}, {exec}: the command ran: {said:?}");
            assert!(
                status.is_some_and(|s| !s.success())
                    && said.contains("cannot end a process of its own"),
                "{case}, {exec}: {status:?} {said:?}"
            );
            assert_eq!(
                nodes[0].node.cmd::<i64>(&["DBSIZE"]),
                0,
                "{case}, {exec}: nothing taken or set"
            );
        }
    }
}

/// From the twentieth attack: in `--pid-namespace`'s user namespace (an
/// ordinary user's), the supervisor holds every capability of that
/// namespace, and no_new_privs caps a new program's privileges at the old
/// ones, which were all: a program with file capabilities kept them
/// (CapEff 0x202000), against the docs' "no capability left". The
/// command's capability sets are emptied before it starts.
#[test]
fn a_file_capability_program_gets_nothing_in_an_ordinary_user_s_pid_namespace() {
    use std::os::unix::fs::PermissionsExt;
    let nodes = servers(1);
    let dir = open_dir();
    let grep = dir.path().join("capgrep");
    std::fs::copy("/bin/grep", &grep).expect("copy grep");
    std::fs::set_permissions(&grep, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let set = Command::new("setcap")
        // Permitted only, not effective: a program whose file asks
        // effective capabilities it cannot have is not run at all (the
        // kernel's EPERM), which proves nothing here.
        .args(["cap_net_raw,cap_sys_admin+p"])
        .arg(&grep)
        .status()
        .expect("setcap (libcap2-bin; ops/test installs it)");
    assert!(set.success(), "setcap: {set:?}");
    for exec in [
        "lock exec --name filecaps --ttl 10s --pid-namespace",
        "semaphore exec --name filecapss --permits 1 --lease 10s --pid-namespace",
    ] {
        // The program is the command itself: a shell in between would
        // have no capability to keep, and neither would what it starts.
        let out = Command::new(AS_NOBODY[0])
            .args(&AS_NOBODY[1..])
            .arg(flashsale_bin())
            .args(exec.split_whitespace())
            .arg("--")
            .arg(&grep)
            .args(["Cap", "/proc/self/status"])
            .env_remove("FLASHSALE_CONFIG")
            .env("FLASHSALE_LOCK_NODES", urls(&nodes).join(","))
            .output()
            .expect("run");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{exec}: {out:?}");
        for set in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
            let value = text
                .lines()
                .find_map(|l| l.strip_prefix(set))
                .map(str::trim);
            assert_eq!(
                value,
                Some("0000000000000000"),
                "{exec}: {set} of a file-capability program: {text:?}"
            );
        }
    }
}

/// From the twentieth attack: without a PID namespace, a command running
/// as the exec's user limited its supervisor and its exec to one
/// descriptor (`prlimit --nofile=1:1`, no privilege needed), which blinds
/// the walk in /proc that ends what the command left; the exec gave up,
/// the lock lapsed, and the command's writer ran on beside the next holder
/// (6 runs of 6). `--pid-namespace` held: the kernel ends the namespace
/// with its init, reading nothing. A PID namespace is now the default
/// wherever one can be made; the same command, run with no flag, leaves
/// nothing behind, as root and as an ordinary user.
#[test]
fn a_command_that_blinds_its_supervisor_leaves_nothing_by_default() {
    let nodes = servers(1);
    let dir = open_dir();
    let seen = dir.path().join("seen");
    let mark = format!("FLASHSALE_TEST_BLIND={}", std::process::id());
    // Its parent (the supervisor, or the namespace's init) and that one's
    // parent (the exec, or nothing a namespace shows): one descriptor each.
    let work = format!(
        "grep NSpid /proc/self/status > {seen}; \
         exec >/dev/null 2>&1; export {mark}; \
         up=$(awk '{{print $4}}' /proc/$PPID/stat); \
         prlimit --pid $PPID --nofile=1:1; [ \"$up\" -gt 0 ] && prlimit --pid $up --nofile=1:1; \
         (while true; do sleep 0.1; done) & sleep 0.3; exit 0",
        seen = seen.display()
    );
    for (who, wrapper) in [("root", &[][..]), ("nobody", &AS_NOBODY[..])] {
        for exec in [
            "lock exec --name blind --ttl 10s",
            "semaphore exec --name blinds --permits 1 --lease 10s",
        ] {
            let (status, said, left) = wrapped_exec(&nodes, wrapper, exec, &work, Some(&mark));
            assert_eq!(
                left, 0,
                "{who}, {exec}: outlived the exec: {status:?} {said:?}"
            );
            assert_eq!(
                status.and_then(|s| s.code()),
                Some(0),
                "{who}, {exec}: {said:?}"
            );
            let nspid = std::fs::read_to_string(&seen).unwrap_or_default();
            assert_eq!(
                nspid.split_whitespace().count(),
                3,
                "{who}, {exec}: in a PID namespace by default: {nspid:?}"
            );
            assert!(
                !said.contains("no PID namespace"),
                "{who}, {exec}: {said:?}"
            );
        }
    }
}

/// Where no PID namespace can be made (root without CAP_SYS_ADMIN gets
/// none: a user namespace would give its command back every capability
/// dropped), the command runs without one when none was required, and the
/// exec says so; `--pid-namespace` still refuses, and `--no-pid-namespace`
/// runs without a word.
#[test]
fn without_a_pid_namespace_to_be_had_the_command_runs_and_the_exec_says_so() {
    let nodes = servers(1);
    let dir = tempfile::TempDir::new().expect("dir");
    let ran = dir.path().join("ran");
    let work = format!("echo ran >> {}", ran.display());
    let without_sys_admin = [
        "setpriv",
        "--bounding-set=-sys_admin",
        "--inh-caps=-sys_admin",
        "--",
    ];
    let cases = [
        ("lock exec --name nons --ttl 10s", Some(0), true),
        (
            "lock exec --name nons --ttl 10s --no-pid-namespace",
            Some(0),
            false,
        ),
        (
            "lock exec --name nons --ttl 10s --pid-namespace",
            Some(126),
            false,
        ),
        (
            "semaphore exec --name nonss --permits 1 --lease 10s",
            Some(0),
            true,
        ),
    ];
    for (exec, code, warned) in cases {
        let _ = std::fs::remove_file(&ran);
        let (status, said, _) = wrapped_exec(&nodes, &without_sys_admin, exec, &work, None);
        assert_eq!(status.and_then(|s| s.code()), code, "{exec}: {said:?}");
        assert_eq!(ran.exists(), code == Some(0), "{exec}: {said:?}");
        assert_eq!(
            said.contains("no PID namespace can be made here"),
            warned,
            "{exec}: {said:?}"
        );
    }
}

/// Every process below `parent` (its children, theirs, and so on).
fn below(parent: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut next = vec![parent];
    while let Some(p) = next.pop() {
        for c in children(p) {
            found.push(c);
            next.push(c);
        }
    }
    found
}

/// A command whose first process moves to a group of its own and writes
/// `A` to `log` every 50 ms, while a child it left in the group it was
/// born in stops that whole group (`kill(0, SIGSTOP)`) and itself, keeping
/// the group from being orphaned (an orphaned stopped group is continued
/// by the kernel).
fn group_stopper(log: &Path) -> String {
    format!(
        r#"use IO::Handle;
pipe(my $r, my $w) or die;
my $k = fork() // die;
if ($k == 0) {{ close $w; my $b; sysread($r, $b, 1); kill 'STOP', 0; exit 0; }}
close $r;
setpgrp(0, 0);
open(my $f, '>>', '{log}') or die;
$f->autoflush(1);
print $f "A\n";
close $w;
while (1) {{ print $f "A\n"; select(undef, undef, undef, 0.05); }}"#,
        log = log.display()
    )
}

/// From the twenty-second attack: the supervisor led the command's process
/// group, so a command's `kill(0, SIGSTOP)` stopped the supervisor too;
/// with the exec stopped, or killed with kill -9, nothing was left to end
/// the command, which wrote on through the next holder's turn (every run,
/// as root and as nobody, with and without a PID namespace). The command's
/// first process leads a group of its own, which the supervisor is not in.
#[test]
fn a_command_that_stops_its_own_process_group_cannot_stop_its_supervisor() {
    let nodes = servers(3);
    let mut failed = Vec::new();
    for mode in ["(default)", "--no-pid-namespace"] {
        for (fate, sig) in [("stopped", libc::SIGSTOP), ("killed", libc::SIGKILL)] {
            let dir = tempfile::TempDir::new().expect("dir");
            let log = dir.path().join("log");
            let mark = format!("{}-{mode}-{fate}", std::process::id());
            let name = format!("group-stop{mode}-{fate}");
            let mut args = vec!["lock", "exec", "--name", &name, "--ttl", "1s"];
            if mode == "--no-pid-namespace" {
                args.push(mode);
            }
            let script = group_stopper(&log);
            args.extend(["--", "perl", "-e", &script]);
            let mut exec = flashsale_cmd(None, None, &urls(&nodes))
                .args(&args)
                .env("STOPS_ITS_GROUP", &mark)
                .spawn()
                .expect("spawn");
            let exec_pid = exec.id();
            wait_for(
                Duration::from_secs(60),
                || {
                    std::fs::metadata(&log).is_ok_and(|m| m.len() > 0)
                        && below(exec_pid).iter().any(|p| state_of(*p) == Some('T'))
                },
                || format!("{mode}, exec {fate}: the command never stopped its group"),
            );
            let tree = below(exec_pid);
            signal_now(exec_pid, sig);
            let next = next_holder(&nodes, &name, &log);
            if interleaved(&log) {
                failed.push(format!("{mode}, exec {fate}"));
            }
            signal_now(exec_pid, libc::SIGKILL);
            let _ = exec.wait();
            for pid in tree
                .into_iter()
                .chain(marked_alive(&format!("STOPS_ITS_GROUP={mark}")))
            {
                signal_now(pid, libc::SIGCONT);
                signal_now(pid, libc::SIGKILL);
            }
            assert!(next.success(), "{mode}, exec {fate}");
        }
    }
    assert!(
        failed.is_empty(),
        "the command wrote while the next holder was inside: {failed:?}"
    );
}

/// From the twenty-second attack: a caller's filter that made `unshare`
/// succeed doing nothing left the command in no PID namespace at all, even
/// with `--pid-namespace`, while the exec took it for one and ended it by
/// its init alone. The namespace's first process checks it is pid 1, and
/// the command does not run when it is not.
#[test]
fn a_pid_namespace_the_kernel_only_says_it_made_runs_nothing() {
    let nodes = servers(1);
    let dir = tempfile::TempDir::new().expect("dir");
    let ran = dir.path().join("ran");
    let work = format!("touch {}", ran.display());
    let fake = Fake {
        call: libc::SYS_unshare,
        arg0: None,
        errno: 0,
    };
    for exec in [
        "lock exec --name fake-ns --ttl 10s",
        "lock exec --name fake-ns --ttl 10s --pid-namespace",
        "semaphore exec --name fake-nss --permits 1 --lease 10s",
    ] {
        let mut cmd = Command::new(flashsale_bin());
        cmd.args(exec.split_whitespace())
            .args(["--", "sh", "-c", &work])
            .env_remove("FLASHSALE_CONFIG")
            .env("FLASHSALE_LOCK_NODES", urls(&nodes).join(","));
        under_seccomp(&mut cmd, std::slice::from_ref(&fake));
        let (status, said, _) = run_and_sweep(&mut cmd, None, Duration::from_secs(60));
        assert!(!ran.exists(), "{exec}: the command ran: {said:?}");
        assert_eq!(status.and_then(|s| s.code()), Some(126), "{exec}: {said:?}");
        assert!(
            said.contains("cannot make the command's PID namespace"),
            "{exec}: {said:?}"
        );
    }
}

/// A command (python) that types into its terminal with TIOCSTI: Ctrl-Z,
/// which stops the exec and gives the shell its prompt back, then a line
/// the shell runs, `kill -STOP` of the supervisor (its host pid, read up
/// the parent chain in the host's /proc); then it writes `A` to `log` every 100 ms
/// for 8 s. It says in `said` whether the terminal took its typing.
const TYPES_INTO_ITS_SHELL: &str = r##"
import os, fcntl, termios, time, sys
log, said = sys.argv[1], sys.argv[2]
def parent(p):
    s = open(f"/proc/{p}/stat", "rb").read()
    return int(s[s.rindex(b")") + 2:].split()[1])
def name(p):
    return open(f"/proc/{p}/comm").read().strip()
# The topmost lease-reaper above: the supervisor (in a PID namespace, the
# namespace's init, a fork of it, is one too).
supervisor = parent(int(os.readlink("/proc/self")))
while name(parent(supervisor)) == "lease-reaper":
    supervisor = parent(supervisor)
time.sleep(0.5)
def type_in(text):
    for c in text.encode():
        fcntl.ioctl(0, termios.TIOCSTI, bytes([c]))
try:
    # The tty layer reads the request's low 32 bits only.
    fcntl.ioctl(0, (1 << 32) | termios.TIOCSTI, b"#")
    high = "typed"
except OSError as e:
    high = f"refused ({e})"
try:
    type_in("\x1a")
    time.sleep(0.2)
    type_in(f"kill -STOP {supervisor}\n")
    open(said, "w").write(f"typed, with high bits {high}")
except OSError as e:
    open(said, "w").write(f"refused ({e}), with high bits {high}")
# Then the terminal's foreground for its own group, SIGTTOU ignored: the
# terminal's Ctrl-C and Ctrl-Z would reach the command, not the exec.
import signal
signal.signal(signal.SIGTTOU, signal.SIG_IGN)
try:
    os.tcsetpgrp(0, os.getpgrp())
    fg = "took the foreground"
except OSError as e:
    fg = f"foreground refused ({e})"
with open(said, "a") as f:
    f.write(f"; {fg}")
start = time.time()
while time.time() - start < 8:
    with open(log, "a") as f:
        f.write("A\n")
    time.sleep(0.1)
"##;

/// From the twenty-third attack: the command shares its caller's
/// terminal, and TIOCSTI let it type into the shell that started the exec:
/// Ctrl-Z stopped the exec, and the next line the shell read stopped the
/// supervisor, so nothing ended the command, which wrote through the next
/// holder's turn (13 runs of 13: lock and semaphore, root and nobody, in
/// the default PID namespace). The command cannot type into the terminal,
/// with the ioctl's high bits set or not. From the twenty-fourth: nor take
/// the terminal's foreground for its group (`tcsetpgrp` with SIGTTOU
/// ignored), which gave it the terminal's Ctrl-C and Ctrl-Z and its input.
#[test]
fn a_command_cannot_type_into_its_caller_s_shell_to_stop_its_supervisor() {
    let nodes = servers(3);
    let mut failed = Vec::new();
    for (exec, name) in [
        ("lock exec --name sti --ttl 2s", "sti"),
        (
            "lock exec --no-pid-namespace --name sti-walk --ttl 2s",
            "sti-walk",
        ),
        ("semaphore exec --name stis --permits 1 --lease 2s", "stis"),
    ] {
        let dir = tempfile::TempDir::new().expect("dir");
        let (log, said, script) = (
            dir.path().join("log"),
            dir.path().join("said"),
            dir.path().join("type.py"),
        );
        std::fs::write(&script, TYPES_INTO_ITS_SHELL).expect("script");
        let mut term = Command::new("script")
            .args(["-qec", "bash --norc --noprofile -i", "/dev/null"])
            .env_remove("FLASHSALE_CONFIG")
            .env("FLASHSALE_LOCK_NODES", urls(&nodes).join(","))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn script(1)");
        let mut stdin = term.stdin.take().expect("stdin");
        let line = format!(
            "{} {exec} -- python3 {} {} {}\n",
            flashsale_bin().display(),
            script.display(),
            log.display(),
            said.display()
        );
        stdin.write_all(line.as_bytes()).expect("type");
        stdin.flush().expect("flush");
        let mut what = String::new();
        wait_for(
            Duration::from_secs(60),
            || {
                what = std::fs::read_to_string(&said).unwrap_or_default();
                !what.is_empty()
            },
            || format!("{exec}: the command never tried to type"),
        );
        // Whether or not it typed, its writer runs for 8 s: the next
        // holder must find it ended, or wait for its end.
        let next = if name == "stis" {
            let script = format!(
                "echo B-start >> {log}; sleep 1; echo B-end >> {log}",
                log = log.display()
            );
            flashsale_cmd(None, None, &urls(&nodes))
                .args(["semaphore", "exec", "--name", name, "--permits", "1"])
                .args(["--lease", "2s", "--wait", "60s", "--", "sh", "-c", &script])
                .status()
                .expect("run the next holder")
        } else {
            next_holder(&nodes, name, &log)
        };
        // The foreground is tried after the typing: wait for its word.
        wait_for(
            Duration::from_secs(30),
            || {
                what = std::fs::read_to_string(&said).unwrap_or_default();
                what.contains("foreground")
            },
            || format!("{exec}: the command never tried the foreground"),
        );
        if interleaved(&log) || what.contains("typed") || what.contains("took the foreground") {
            failed.push(format!("{exec}: {what}"));
        }
        let tree = below(term.id());
        for pid in &tree {
            signal_now(*pid, libc::SIGCONT);
            signal_now(*pid, libc::SIGKILL);
        }
        drop(stdin);
        let _ = term.kill();
        let _ = term.wait();
        assert!(next.success(), "{exec}: the next holder");
    }
    assert!(
        failed.is_empty(),
        "the command typed into its shell, or wrote while the next holder was inside: {failed:?}"
    );
}

/// The exec's run as root, its command's as `user` (none: the exec's).
fn exec_as_other_user(
    nodes: &[RedisServer],
    name: &str,
    user: Option<&str>,
    mark: &str,
    script: &str,
) -> Child {
    let mut args = vec![
        "lock",
        "exec",
        "--no-pid-namespace",
        "--name",
        name,
        "--ttl",
        "1s",
        "--grace",
        "1s",
    ];
    if let Some(u) = user {
        args.extend(["--user", u]);
    }
    args.extend(["--", "sh", "-c", script]);
    flashsale_cmd(None, None, &urls(nodes))
        .args(&args)
        .env("RUNS_AS_ANOTHER_USER", mark)
        .spawn()
        .expect("spawn the exec")
}

/// From the twenty-third and twenty-fourth attacks: any process of the
/// command's user may stop the exec and its supervisor, the command itself
/// by their pids or an agent of that user outside the tree (its tmux
/// server, its session manager), and the command then wrote on past the
/// lease beside the next holder. Run as another user (`--user`), neither
/// can. The control run, the command as the exec's own user, shows the
/// hole is there without the flag (and that this test can see it).
#[test]
fn a_command_run_as_another_user_cannot_stop_its_exec_or_supervisor() {
    let nodes = servers(3);
    for user in [None, Some("nobody")] {
        let dir = open_dir();
        let log = dir.path().join("log");
        std::fs::write(&log, "").expect("log");
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        }
        let who = user.unwrap_or("the exec's user");
        let name = format!("other-user-{}", user.unwrap_or("same"));
        let mark = format!("{}-{name}", std::process::id());
        // Its supervisor is its parent, the exec its supervisor's parent.
        let script = format!(
            "sup=$PPID; exec=$(cut -d' ' -f4 /proc/$sup/stat); \
             if kill -STOP $sup $exec 2>/dev/null; then echo stopped; else echo refused; fi >> {log}; \
             id -u >> {log}; trap '' TERM; \
             while true; do echo A >> {log}; sleep 0.05; done",
            log = log.display()
        );
        let mut exec = exec_as_other_user(&nodes, &name, user, &mark, &script);
        let exec_pid = exec.id();
        wait_for(
            Duration::from_secs(60),
            || std::fs::read_to_string(&log).is_ok_and(|l| l.lines().any(|l| l == "A")),
            || format!("{who}: the command never wrote"),
        );
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        let tree = below(exec_pid);
        // An agent of the command's user, outside the exec's tree, asked
        // to stop the exec and everything below it.
        let agent = user.map(|_| {
            Command::new(AS_NOBODY[0])
                .args(&AS_NOBODY[1..])
                .arg("kill")
                .arg("-STOP")
                .arg(exec_pid.to_string())
                .args(tree.iter().map(|p| p.to_string()))
                .stderr(Stdio::null())
                .status()
                .expect("run the agent")
        });
        signal_now(exec_pid, libc::SIGTERM);
        let next = next_holder(&nodes, &name, &log);
        let overlapped = interleaved(&log);
        signal_now(exec_pid, libc::SIGCONT);
        signal_now(exec_pid, libc::SIGKILL);
        let _ = exec.wait();
        for pid in tree
            .into_iter()
            .chain(marked_alive(&format!("RUNS_AS_ANOTHER_USER={mark}")))
        {
            signal_now(pid, libc::SIGCONT);
            signal_now(pid, libc::SIGKILL);
        }
        assert!(next.success(), "{who}: the next holder");
        match user {
            None => {
                assert!(said.starts_with("stopped\n0\n"), "control: {said}");
                assert!(
                    overlapped,
                    "control: a command of the exec's own user stopped it, yet never wrote \
                     beside the next holder: this test no longer sees the hole"
                );
            }
            Some(_) => {
                assert!(said.starts_with("refused\n65534\n"), "{who}: {said}");
                assert!(
                    agent.is_some_and(|s| !s.success()),
                    "{who}: an agent of the command's user stopped the exec"
                );
                assert!(
                    !overlapped,
                    "{who}: the command wrote while the next holder was inside"
                );
            }
        }
    }
}

/// `--user`: the command runs with the user's ids, no capability in any
/// set, no_new_privs (a setuid-root program cannot take it back), that
/// user's login variables, the grant's variables, and none of the exec's
/// `FLASHSALE_` ones (the lock nodes' URLs among them): in a PID namespace
/// and without one, under a lock and under a semaphore.
#[test]
fn a_command_run_as_another_user_keeps_no_privilege_and_none_of_the_execs_settings() {
    let nodes = servers(1);
    let lock = ["lock", "exec", "--name", "as-nobody"];
    let semaphore = ["semaphore", "exec", "--name", "as-nobody", "--permits", "1"];
    for exec in [&lock[..], &semaphore[..]] {
        for ns in ["--pid-namespace", "--no-pid-namespace"] {
            let dir = open_dir();
            let out = dir.path().join("out");
            let script = format!(
                "grep -E '^(Uid|Gid|Groups|NoNewPrivs|CapInh|CapPrm|CapEff|CapBnd|CapAmb):' \
                 /proc/self/status > {out}; env >> {out}",
                out = out.display()
            );
            let status = flashsale_cmd(None, None, &urls(&nodes))
                .args(exec)
                .args([ns, "--user", "nobody", "--", "sh", "-c", &script])
                .env("FLASHSALE_ADMIN_TOKEN", "not-for-the-command")
                .status()
                .expect("run the exec");
            let what = format!("{} {ns}", exec[0]);
            assert!(status.success(), "{what}: {status:?}");
            let seen = std::fs::read_to_string(&out).unwrap_or_default();
            let line = |field: &str| {
                seen.lines()
                    .find_map(|l| l.strip_prefix(field))
                    .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
                    .unwrap_or_default()
            };
            assert_eq!(line("Uid:"), "65534 65534 65534 65534", "{what}: {seen}");
            assert_eq!(line("Gid:"), "65534 65534 65534 65534", "{what}: {seen}");
            assert_eq!(line("NoNewPrivs:"), "1", "{what}: {seen}");
            for set in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
                assert_eq!(line(set), "0000000000000000", "{what} {set}: {seen}");
            }
            let vars: Vec<&str> = seen.lines().collect();
            assert!(vars.contains(&"USER=nobody"), "{what}: {seen}");
            assert!(vars.contains(&"HOME=/nonexistent"), "{what}: {seen}");
            assert!(
                vars.iter()
                    .any(|v| v.starts_with("FLASHSALE_FENCING_TOKEN=")),
                "{what}: the grant's token: {seen}"
            );
            for secret in ["FLASHSALE_LOCK_NODES=", "FLASHSALE_ADMIN_TOKEN="] {
                assert!(
                    !vars.iter().any(|v| v.starts_with(secret)),
                    "{what}: {secret} handed to the command: {seen}"
                );
            }
        }
    }
}

/// `--user` the exec cannot honour (no such user, its own user or root,
/// no CAP_SETUID) is refused with the reason before anything is taken:
/// the command never runs and the lock nodes stay empty.
#[test]
fn a_user_the_exec_cannot_run_its_command_as_is_refused_before_the_lock_is_taken() {
    let nodes = servers(1);
    let dir = open_dir();
    let ran = dir.path().join("ran");
    let work = format!("touch {}", ran.display());
    let no_setuid = ["setpriv", "--bounding-set=-setuid", "--"];
    // Effective root, real uid nobody's (a setuid-root exec, or a caller
    // that kept its real uid): nobody's processes may signal it.
    let real_nobody = [
        "python3",
        "-c",
        "import os, sys; os.setresuid(65534, 0, 0); os.execv(sys.argv[1], sys.argv[1:])",
    ];
    // Not root, with every capability --user asks for.
    let caps = "+kill,+setuid,+setgid,+setpcap";
    let (inh, amb) = (
        format!("--inh-caps={caps}"),
        format!("--ambient-caps={caps}"),
    );
    let capable_user = [
        "setpriv",
        "--reuid=65533",
        "--regid=65533",
        "--clear-groups",
        &inh,
        &amb,
        "--",
    ];
    for (wrapper, user, reason) in [
        (&[][..], "no-such-user-of-flashsale", "no such user"),
        (&[][..], "root", "other than root"),
        (&[][..], "0", "other than root"),
        (&no_setuid[..], "nobody", "CAP_SETUID"),
        (&real_nobody[..], "nobody", "(they are 65534, 0, 0)"),
        (
            &capable_user[..],
            "nobody",
            "(they are 65533, 65533, 65533)",
        ),
    ] {
        for exec in [
            &["lock", "exec", "--name", "refused-user"][..],
            &[
                "semaphore",
                "exec",
                "--name",
                "refused-user",
                "--permits",
                "1",
            ][..],
        ] {
            let mut cmd = match wrapper.split_first() {
                Some((first, rest)) => {
                    let mut c = Command::new(first);
                    c.args(rest).arg(flashsale_bin());
                    c
                }
                None => Command::new(flashsale_bin()),
            };
            let out = cmd
                .env_remove("FLASHSALE_CONFIG")
                .env("FLASHSALE_LOCK_NODES", urls(&nodes).join(","))
                .args(exec)
                .args(["--user", user, "--", "sh", "-c", &work])
                .output()
                .expect("run the exec");
            let said = String::from_utf8_lossy(&out.stderr);
            let what = format!("{} --user {user} {wrapper:?}", exec[0]);
            assert_eq!(out.status.code(), Some(1), "{what}: {said}");
            assert!(said.contains(reason), "{what}: {said}");
            assert!(!ran.exists(), "{what}: the command ran");
        }
    }
    let mut conn = redis::Client::open(nodes[0].url())
        .and_then(|c| c.get_connection())
        .expect("node");
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).expect("KEYS");
    assert!(keys.is_empty(), "the refused execs left {keys:?}");
}

/// From the attack on `--user`: a caller's `SECBIT_NO_SETUID_FIXUP` kept
/// the exec's capabilities through the switch of user, and the check that
/// root's uid cannot be taken back, made before they were emptied, failed
/// the start after the lock was taken (exit 126). The sets are emptied
/// first, then the switch is checked: the command runs as the user, with
/// no capability.
#[test]
fn a_caller_s_securebits_keep_no_capability_through_the_switch_of_user() {
    let nodes = servers(1);
    let dir = open_dir();
    let out = dir.path().join("out");
    let script = format!(
        "grep -E '^(Uid|CapPrm|CapEff):' /proc/self/status > {}",
        out.display()
    );
    let status = Command::new("setpriv")
        .args(["--securebits", "+no_setuid_fixup", "--"])
        .arg(flashsale_bin())
        .env_remove("FLASHSALE_CONFIG")
        .env("FLASHSALE_LOCK_NODES", urls(&nodes).join(","))
        .args(["lock", "exec", "--name", "securebits", "--user", "nobody"])
        .args(["--", "sh", "-c", &script])
        .status()
        .expect("run the exec");
    let seen = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(status.success(), "{status:?}: {seen}");
    for (field, want) in [
        ("Uid:", "65534 65534 65534 65534"),
        ("CapPrm:", "0000000000000000"),
        ("CapEff:", "0000000000000000"),
    ] {
        let got = seen
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_default();
        assert_eq!(got, want, "{field} {seen}");
    }
}

/// Python that joins a session keyring of its own with a key in it, puts a
/// root-only file on descriptor 5000, and runs the rest of its arguments.
const WITH_A_KEY_AND_A_HIGH_DESCRIPTOR: &str = r#"
import ctypes, os, platform, resource, sys
libc = ctypes.CDLL(None, use_errno=True)
add_key, keyctl = {"x86_64": (248, 250), "aarch64": (217, 219)}[platform.machine()]
if libc.syscall(keyctl, 1, b"flashsale-test") < 0: sys.exit("join keyring")
if libc.syscall(add_key, b"user", b"flashsale-secret", b"key-of-root", 11, -3) < 0: sys.exit("add_key")
resource.setrlimit(resource.RLIMIT_NOFILE, (8192, 8192))
os.dup2(os.open(sys.argv[1], os.O_RDONLY), 5000)
os.execv(sys.argv[2], sys.argv[2:])
"#;

/// What the command finds: the key and descriptor 5000.
const LOOKS_FOR_THEM: &str = r#"
import ctypes, os, platform
libc = ctypes.CDLL(None, use_errno=True)
keyctl = {"x86_64": 250, "aarch64": 219}[platform.machine()]
found = libc.syscall(keyctl, 10, -3, b"user", b"flashsale-secret", 0)
print("key:", "found" if found > 0 else "absent")
try:
    print("fd:", os.read(5000, 64).decode())
except OSError:
    print("fd: closed")
"#;

/// From the second attack on `--user`: the command, run as another user,
/// read a key from the caller's session keyring (any process in a session
/// keyring may) and a root-only file the caller had open on descriptor
/// 5000 (past the descriptors the supervisor closes). The command gets a
/// session keyring of its own user's, and no descriptor but 0, 1 and 2.
#[test]
fn a_command_run_as_another_user_gets_neither_the_caller_s_keys_nor_its_descriptors() {
    let nodes = servers(1);
    let dir = tempfile::TempDir::new().expect("dir");
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "file-of-root").expect("secret");
    let out = Command::new("python3")
        .args(["-c", WITH_A_KEY_AND_A_HIGH_DESCRIPTOR])
        .arg(&secret)
        .arg(flashsale_bin())
        .args(["lock", "exec", "--name", "keys", "--user", "nobody"])
        .args(["--", "python3", "-c", LOOKS_FOR_THEM])
        .env_remove("FLASHSALE_CONFIG")
        .env("FLASHSALE_LOCK_NODES", urls(&nodes).join(","))
        .output()
        .expect("run the exec");
    let said = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {said} {err}", out.status);
    assert!(said.contains("key: absent"), "{said} {err}");
    assert!(said.contains("fd: closed"), "{said} {err}");
}
