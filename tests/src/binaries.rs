//! The workspace's own binaries (`flashsale`, the bench, the chaos checker
//! and its planted twin) as the tests run them, and the processes they
//! start, killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use crate::{PgDb, RedisCluster};

/// Path of the `flashsale` binary, built once per test process (debug
/// profile, the same target dir as the tests).
pub fn flashsale_bin() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    // FLASHSALE_BIN runs the CLI tests against another build (an older
    // commit's, to watch a new test fail on the code it guards against).
    BUILT
        .get_or_init(|| match std::env::var_os("FLASHSALE_BIN") {
            Some(bin) => PathBuf::from(bin),
            None => workspace_bin("flashsale", "flashsale"),
        })
        .clone()
}

/// Path of the `flashsale-bench` binary, built once per test process.
pub fn bench_bin() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| workspace_bin("flashsale-bench", "flashsale-bench"))
        .clone()
}

/// Path of the `flashsale-chaos` binary (default features), built once per
/// test process.
pub fn chaos_bin() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| workspace_bin("flashsale-tests", "flashsale-chaos"))
        .clone()
}

/// Path of a `flashsale-chaos` built with the `planted-bugs` feature:
/// `$FLASHSALE_CHAOS_PLANTED` (ops/test builds it there before the suite),
/// else built now in a target dir of its own, so it never replaces the
/// default build other tests run.
pub fn planted_chaos_bin() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            if let Some(p) = std::env::var_os("FLASHSALE_CHAOS_PLANTED") {
                return PathBuf::from(p);
            }
            let root = Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .expect("workspace root");
            let target = root.join("target").join("planted-build");
            let status = Command::new(env!("CARGO"))
                .args([
                    "build",
                    "-q",
                    "-p",
                    "flashsale-tests",
                    "--bin",
                    "flashsale-chaos",
                ])
                .args(["--features", "planted-bugs", "--target-dir"])
                .arg(&target)
                .current_dir(root)
                .status()
                .expect("run cargo build");
            assert!(
                status.success(),
                "cargo build of the planted flashsale-chaos failed"
            );
            target.join("debug").join("flashsale-chaos")
        })
        .clone()
}

/// Builds binary `bin` of workspace package `package` and returns its path.
fn workspace_bin(package: &str, bin: &str) -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.parent().expect("workspace root");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let status = Command::new(env!("CARGO"))
        .args(["build", "-q", "-p", package, "--bin", bin])
        .current_dir(root)
        .status()
        .expect("run cargo build");
    assert!(status.success(), "cargo build of {bin} failed");
    target.join("debug").join(bin)
}

/// A `flashsale` command whose config points at `cluster` (and at `pg` and
/// `lock_nodes` when given), through the environment.
pub fn flashsale_cmd(
    cluster: Option<&RedisCluster>,
    pg: Option<&PgDb>,
    lock_nodes: &[String],
) -> Command {
    let mut c = Command::new(flashsale_bin());
    c.env_remove("FLASHSALE_CONFIG");
    if let Some(cl) = cluster {
        c.env("FLASHSALE_CLUSTER_NODES", cl.seeds().join(","));
    }
    if let Some(pg) = pg {
        c.env("FLASHSALE_POSTGRES_URL", pg.url());
    }
    // Always set, so a test never reaches the ops/up lock ports by default.
    c.env("FLASHSALE_LOCK_NODES", lock_nodes.join(","));
    c
}

/// Owns a helper process (e.g. Prometheus) and kills it when dropped.
pub struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// kill -9 of `child` first (so it cannot see its own children end and
/// clean up), then of the children it had: a crash of an exec and what it
/// ran.
pub fn kill_9_with_children(child: &mut Child) {
    let children = Command::new("pgrep")
        .args(["-P", &child.id().to_string()])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let _ = child.kill();
    let _ = child.wait();
    for pid in children.split_whitespace() {
        let _ = Command::new("kill").args(["-9", pid]).status();
    }
}

/// Ties `child`'s life to the returned guard.
pub fn kill_on_drop(child: Child) -> KillOnDrop {
    KillOnDrop(child)
}
