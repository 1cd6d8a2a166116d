//! Smoke test of the benchmark harness: every strategy and the lock
//! benchmark run for a few hundred operations against real processes, and the
//! JSON has every field with sane values. No speed thresholds here: targets
//! are judged in the harness's own output.

use flashsale_tests::{bench_bin, RedisCluster, RedisServer};
use serde_json::Value;

#[test]
fn every_strategy_runs_and_the_json_is_complete() {
    let cluster = RedisCluster::start(3, 1);
    let locks: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let lock_urls: Vec<String> = locks.iter().map(|l| l.url()).collect();
    let dir = tempfile::TempDir::new().expect("dir");
    let out = std::process::Command::new(bench_bin())
        .env("FLASHSALE_CLUSTER_NODES", cluster.seeds().join(","))
        .env("FLASHSALE_LOCK_NODES", lock_urls.join(","))
        .args([
            "--ops",
            "400",
            "--concurrency",
            "8",
            "--buckets",
            "3",
            "--skus",
            "4",
        ])
        .args([
            "--lock-ops",
            "60",
            "--lock-pairs",
            "60",
            "--lock-tasks",
            "3",
            "--cap-seconds",
            "30",
            "--repeat",
            "2",
            "--quiet",
        ])
        .arg("--out")
        .arg(dir.path())
        .output()
        .expect("run flashsale-bench");
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("| hot1 | engine |"),
        "the table is printed: {stdout}"
    );

    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("results.json")).expect("results.json"),
    )
    .expect("JSON");
    assert!(report["machine"]["cores"].as_u64().unwrap_or(0) >= 1);
    assert_eq!(report["machine"]["masters"], 3);
    assert!(report["machine"]["redis_version"]
        .as_str()
        .is_some_and(|v| v.starts_with('7') || v.starts_with('6')));
    let results = report["results"].as_array().expect("results");
    let find = |sc: &str, st: &str| {
        results
            .iter()
            .find(|r| r["scenario"] == sc && r["strategy"] == st)
            .unwrap_or_else(|| panic!("{sc}/{st} missing"))
    };
    for (sc, st) in [
        ("hot1", "anchor"),
        ("hot1", "engine"),
        ("hot1", "engine@80%"),
        ("hot1", "lock"),
        ("hot1", "naive"),
        ("hotB", "anchor"),
        ("hotB", "engine"),
        ("many", "anchor"),
        ("many", "engine"),
    ] {
        let r = find(sc, st);
        assert!(
            r["throughput"].as_f64().unwrap_or(0.0) > 0.0,
            "{sc}/{st} throughput"
        );
        assert!(
            r["p99_ms"].as_f64().unwrap_or(-1.0) >= r["p50_ms"].as_f64().unwrap_or(0.0),
            "{sc}/{st} percentiles ordered"
        );
        // The anchor's and the lock row's oversold are not measured yet
        // (the anchor does not read its replies; see the batching issue's
        // fair bench), so nothing is claimed about them here.
        if st.starts_with("engine") {
            assert_eq!(r["oversold"], 0, "{sc}/{st} never oversells");
            assert_eq!(r["errors"], 0, "{sc}/{st} had no errors: {r}");
        }
    }
    assert_eq!(
        find("hot1", "engine")["confirmed"],
        400,
        "engine sold one unit per call"
    );
    for st in ["in-process limiter", "redis rate_limit.lua"] {
        let r = find("door", st);
        assert!(
            r["throughput"].as_f64().unwrap_or(0.0) > 0.0 && r["errors"] == 0,
            "door/{st}: {r}"
        );
    }
    // Naive GET-check-DECR on a stock of ops/2 sells the whole stock, and
    // every unit past it is reported as oversold (the row is the median
    // repetition; its oversold is the worst one, so at least this run's).
    let naive = find("hot1", "naive");
    let confirmed = naive["confirmed"].as_u64().expect("naive confirmed");
    assert!(confirmed >= 200, "naive sold its whole stock: {naive}");
    assert!(
        naive["oversold"].as_u64().unwrap_or(0) >= confirmed - 200,
        "naive reports every unit past its stock: {naive}"
    );
    let locks = report["lock_results"].as_array().expect("lock_results");
    assert_eq!(
        locks.len(),
        8,
        "flashsale and rslock, 1 and 3 nodes, 1 and 3 tasks"
    );
    assert!(locks
        .iter()
        .all(|l| l["pairs"].as_u64().unwrap_or(0) > 0 && l["errors"] == 0));
    assert_eq!(report["targets"].as_array().map(Vec::len), Some(7));
    assert!(dir.path().join("plot.svg").exists() && dir.path().join("summary.md").exists());

    // The harness cleans up after itself: no bench sale is left in the index.
    let left: Vec<String> = cluster
        .node(cluster.master_of_slot(flashsale::placement::key_slot(b"{fs}:skus")))
        .cmd(&["SMEMBERS", "{fs}:skus"]);
    assert!(left.is_empty(), "bench sales left behind: {left:?}");
}
