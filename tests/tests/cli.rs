//! The `flashsale` binary against a real cluster: the demo's JSON report and
//! `sale status --json`, which anyone can cross-check with redis-cli.

use flashsale_tests::{flashsale_cmd, PgDb, RedisCluster};

fn json(out: std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "flashsale failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON object")
}

/// With holds, the unpaid units go back on sale and a second wave buys
/// them: sold counts both waves, never more than the stock net of what
/// expired, and PostgreSQL agrees with the engine on every order's state.
#[test]
fn demo_with_holds_resells_the_unpaid_units_and_postgres_agrees() {
    let cluster = RedisCluster::start(3, 0);
    let pg = PgDb::create();
    let report = json(
        flashsale_cmd(Some(&cluster), Some(&pg), &[])
            .args([
                "demo",
                "--stock",
                "200",
                "--buyers",
                "600",
                "--hold-ms",
                "1000",
                "--pay-ratio",
                "0.6",
                "--json",
            ])
            .output()
            .expect("run demo"),
    );
    let n = |k: &str| report[k].as_u64().unwrap_or(u64::MAX);
    assert_eq!(
        (n("oversold"), n("state_mismatches"), n("errors")),
        (0, 0, 0)
    );
    assert!(n("expired") > 0, "some holds went unpaid: {report}");
    assert_eq!(
        n("resold"),
        n("expired"),
        "every unit that came back was sold again"
    );
    assert_eq!(n("sold"), 200 + n("expired"));
    assert_eq!(n("paid"), 200, "in the end every unit is paid");
    assert_eq!(n("remaining"), 0);
    assert_eq!(
        pg.query("SELECT count(*) FROM orders WHERE status = 'paid'"),
        "200"
    );
    let bad = flashsale_cmd(Some(&cluster), Some(&pg), &[])
        .args(["demo", "--hold-ms", "100", "--pay-ratio", "1.5", "--json"])
        .output()
        .expect("run demo");
    assert!(!bad.status.success(), "a ratio above 1 is refused");
}

#[test]
fn demo_json_reports_no_oversell_and_matches_redis() {
    let cluster = RedisCluster::start(3, 0);
    let pg = PgDb::create();
    let report = json(
        flashsale_cmd(Some(&cluster), Some(&pg), &[])
            .args([
                "demo",
                "--stock",
                "300",
                "--buckets",
                "3",
                "--buyers",
                "1500",
                "--concurrency",
                "64",
                "--json",
            ])
            .output()
            .expect("run demo"),
    );
    assert_eq!(report["sold"], 300);
    assert_eq!(report["remaining"], 0);
    assert_eq!(report["oversold"], 0);
    assert_eq!(
        report["unmatched_orders"], 0,
        "the confirmed ids are exactly PostgreSQL's"
    );
    assert_eq!(report["stream_entries"], 300);
    assert_eq!(
        report["orders_in_db"], 300,
        "the demo drains every order into PostgreSQL"
    );
    assert_eq!(
        pg.query("SELECT count(DISTINCT order_id) FROM orders"),
        "300"
    );
    assert!(report["confirmed_per_second"].as_f64().unwrap_or(0.0) > 0.0);
    assert!(report["db_orders_per_second"].as_f64().unwrap_or(0.0) > 0.0);
    assert!(
        report["answers_per_second"].as_f64().unwrap_or(0.0)
            >= report["confirmed_per_second"].as_f64().unwrap_or(0.0)
    );
    let sku = report["sku"].as_str().expect("sku in report").to_owned();

    let status = json(
        flashsale_cmd(Some(&cluster), None, &[])
            .args(["sale", "status", "--sku", &sku, "--json"])
            .output()
            .expect("run sale status"),
    );
    let buckets = status["buckets"].as_array().expect("buckets");
    assert_eq!(buckets.len(), 3);
    for b in buckets {
        let key = b["key"].as_str().expect("key");
        let slot: i64 = cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", key]);
        assert_eq!(b["slot"], slot);
        let port = cluster.master_of_slot(slot as u16);
        assert_eq!(b["master"], format!("127.0.0.1:{port}"));
        let stock: i64 = cluster.node(port).cmd(&["GET", key]);
        assert_eq!(b["remaining"], stock);
    }

    let out = flashsale_cmd(Some(&cluster), Some(&pg), &[])
        .args(["reconcile", "--json"])
        .output()
        .expect("run reconcile");
    let ledger = json(out);
    assert_eq!(ledger[0]["conserved"], true);
    assert_eq!(ledger[0]["written"], 300);

    // Break the ledger behind the engine's back: reconcile must say so.
    let port = cluster.master_of_slot(buckets[0]["slot"].as_i64().unwrap_or(0) as u16);
    let key = buckets[0]["key"].as_str().unwrap_or_default();
    let _: i64 = cluster.node(port).cmd(&["INCRBY", key, "5"]);
    let out = flashsale_cmd(Some(&cluster), Some(&pg), &[])
        .args(["reconcile", "--json"])
        .output()
        .expect("run reconcile");
    assert_eq!(out.status.code(), Some(1), "an unbalanced ledger exits 1");
    let ledger: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("reconcile --json prints JSON");
    assert_eq!(ledger[0]["conserved"], false, "{ledger}");
    // Five phantom units: remaining + pending + written is initial + 5.
    assert_eq!(ledger[0]["initial"], 300, "{ledger}");
    assert_eq!(ledger[0]["remaining"], 5, "{ledger}");
    assert_eq!(ledger[0]["pending"], 0, "{ledger}");
    assert_eq!(ledger[0]["written"], 300, "{ledger}");
}

#[test]
fn unknown_sale_and_bad_config_fail_with_a_clear_message() {
    let cluster = RedisCluster::start(3, 0);
    let out = flashsale_cmd(Some(&cluster), None, &[])
        .args(["sale", "status", "--sku", "nosuch"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown sale \"nosuch\""));

    let out = flashsale_cmd(Some(&cluster), None, &[])
        .env("FLASHSALE_ACK", "everyone")
        .args(["config", "check"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("FLASHSALE_ACK"));
}

/// Starts `flashsale sale create` for `sku` with every master but the one
/// holding the sale's metadata paused, waits until the plan is recorded,
/// then kills the process with kill -9: a create cut off by a crash.
fn crash_a_create(cluster: &RedisCluster, sku: &str) {
    // Built before anything is paused: on a fresh checkout the first build
    // of the binary takes longer than the pause lasts.
    let _ = flashsale_tests::flashsale_bin();
    let meta = format!("{{fs:{sku}}}:meta");
    let meta_port = cluster.master_of_slot(flashsale::placement::tag_slot(&format!("fs:{sku}")));
    let others: Vec<u16> = cluster
        .master_ports()
        .into_iter()
        .filter(|p| *p != meta_port)
        .collect();
    for p in &others {
        let _: () = cluster.node(*p).cmd(&["CLIENT", "PAUSE", "30000", "WRITE"]);
    }
    let mut child = flashsale_cmd(Some(cluster), None, &[])
        .args([
            "sale",
            "create",
            "--sku",
            sku,
            "--stock",
            "30",
            "--buckets",
            "3",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start sale create");
    let node = cluster.node(meta_port);
    flashsale_tests::wait_for(
        std::time::Duration::from_secs(60),
        || {
            node.cmd::<Option<String>>(&["HGET", &meta, "created"])
                .as_deref()
                == Some("0")
        },
        || "the create recorded its plan".into(),
    );
    let _ = child.kill();
    let _ = child.wait();
    for p in &others {
        let _: () = cluster.node(*p).cmd(&["CLIENT", "UNPAUSE"]);
    }
    assert_eq!(
        node.cmd::<Option<String>>(&["HGET", &meta, "created"])
            .as_deref(),
        Some("0"),
        "setup: the crash left the create half-done"
    );
}

fn sale_is_whole(cluster: &RedisCluster, sku: &str) {
    let status = json(
        flashsale_cmd(Some(cluster), None, &[])
            .args(["sale", "status", "--sku", sku, "--json"])
            .output()
            .expect("run sale status"),
    );
    assert_eq!(status["initial"], 30, "{status}");
    assert_eq!(status["buckets"].as_array().map(Vec::len), Some(3));
    let list = flashsale_cmd(Some(cluster), None, &[])
        .args(["sale", "list"])
        .output()
        .expect("run sale list");
    assert!(
        String::from_utf8_lossy(&list.stdout)
            .lines()
            .any(|l| l == sku),
        "{sku} is indexed, so the order writer drains it"
    );
}

#[test]
fn create_killed_half_way_is_finished_by_repair_or_the_next_create() {
    let cluster = RedisCluster::start(3, 0);
    crash_a_create(&cluster, "crashed-a");
    let repair = flashsale_cmd(Some(&cluster), None, &[])
        .args(["sale", "repair", "--sku", "crashed-a"])
        .output()
        .expect("run sale repair");
    assert!(
        repair.status.success(),
        "{}",
        String::from_utf8_lossy(&repair.stderr)
    );
    sale_is_whole(&cluster, "crashed-a");

    crash_a_create(&cluster, "crashed-b");
    let again = flashsale_cmd(Some(&cluster), None, &[])
        .args([
            "sale",
            "create",
            "--sku",
            "crashed-b",
            "--stock",
            "30",
            "--buckets",
            "3",
        ])
        .output()
        .expect("run sale create again");
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already exists"),
        "a second create of the SKU finishes the first and says so"
    );
    sale_is_whole(&cluster, "crashed-b");
}

#[test]
fn repair_finishes_a_restock_cut_off_before_a_close() {
    let cluster = RedisCluster::start(3, 0);
    let run = |args: &[&str]| {
        flashsale_cmd(Some(&cluster), None, &[])
            .args(args)
            .output()
            .expect("run flashsale")
    };
    // A SKU whose metadata is not on bucket 1's master (that master is
    // paused below, and the restock records its intent on the metadata).
    let (sku, status) = (0..10)
        .find_map(|i| {
            let sku = format!("half-{i}");
            assert!(run(&[
                "sale",
                "create",
                "--sku",
                &sku,
                "--stock",
                "10",
                "--buckets",
                "2"
            ])
            .status
            .success());
            let status = json(run(&["sale", "status", "--sku", &sku, "--json"]));
            let b1 = status["buckets"][1]["slot"].as_u64().unwrap_or(0) as u16;
            let meta = flashsale::placement::tag_slot(&format!("fs:{sku}"));
            (cluster.master_of_slot(meta) != cluster.master_of_slot(b1)).then_some((sku, status))
        })
        .expect("a SKU whose metadata sits apart from bucket 1");
    let sku = sku.as_str();
    let bucket = |i: usize, f: &str| status["buckets"][i][f].clone();
    let slot = |i: usize| bucket(i, "slot").as_u64().unwrap_or(0) as u16;
    let tag = |i: usize| bucket(i, "tag").as_str().unwrap_or_default().to_owned();
    let first = cluster.node(cluster.master_of_slot(slot(0)));
    let second = cluster.node(cluster.master_of_slot(slot(1)));
    // The restock reaches bucket 0; bucket 1's master holds writes; the
    // process dies there.
    let _: () = second.cmd(&["CLIENT", "PAUSE", "30000", "WRITE"]);
    let mut child = flashsale_cmd(Some(&cluster), None, &[])
        .args([
            "sale", "restock", "--sku", sku, "--qty", "4", "--op-id", "rs1",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start restock");
    let sale0 = format!("{{{}}}:sale", tag(0));
    flashsale_tests::wait_for(
        std::time::Duration::from_secs(60),
        || {
            first
                .cmd::<Option<String>>(&["HGET", &sale0, "op:rs1"])
                .is_some()
        },
        || "bucket 0 got the restock".into(),
    );
    let _ = child.kill();
    let _ = child.wait();
    let _: () = second.cmd(&["CLIENT", "UNPAUSE"]);
    let sale1 = format!("{{{}}}:sale", tag(1));
    assert_eq!(
        second.cmd::<Option<String>>(&["HGET", &sale1, "op:rs1"]),
        None,
        "setup: the restock is half-applied"
    );
    assert!(run(&["sale", "close", "--sku", sku]).status.success());
    let repair = run(&["sale", "repair", "--sku", sku]);
    assert!(
        repair.status.success(),
        "{}",
        String::from_utf8_lossy(&repair.stderr)
    );
    let status = json(run(&["sale", "status", "--sku", sku, "--json"]));
    assert_eq!(status["state"], "closed");
    assert_eq!(status["initial"], 14, "the whole restock, once: {status}");
    for b in status["buckets"].as_array().expect("buckets") {
        assert_eq!(b["initial"], b["remaining"], "{b}");
    }
    // Repair again: nothing changes.
    assert!(run(&["sale", "repair", "--sku", sku]).status.success());
    let again = json(run(&["sale", "status", "--sku", sku, "--json"]));
    assert_eq!(again["initial"], 14);
}
