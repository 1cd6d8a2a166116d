//! Faults injected into the real cluster in the middle of a sale: the script
//! cache flushed on every master, and a master killed with kill -9.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flashsale::{PurchaseError, PurchaseRequest, SaleSpec};
use flashsale_tests::{engine_on, RedisCluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_mid_sale_is_invisible_to_buyers() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    engine
        .create_sale(SaleSpec {
            buckets: 3,
            ..SaleSpec::new("flushed", 900)
        })
        .await
        .expect("create");
    let masters = cluster.master_ports();
    let mut confirmed = 0;
    for round in 0..3 {
        // Flush while a wave of buyers is in flight, then send another wave
        // that can only succeed if the engine reloads the scripts.
        let wave: Vec<_> = (0..200)
            .map(|i| {
                let engine = engine.clone();
                tokio::spawn(async move {
                    let id = format!("r{round}-{i}");
                    engine
                        .purchase(PurchaseRequest {
                            sku: "flushed",
                            user: &id,
                            qty: 1,
                            request_id: &id,
                        })
                        .await
                })
            })
            .collect();
        for &port in &masters {
            let _: String = cluster.node(port).cmd(&["SCRIPT", "FLUSH"]);
        }
        for t in wave {
            match t.await.expect("task") {
                Ok(_) => confirmed += 1,
                Err(e) => panic!("a buyer saw an error during SCRIPT FLUSH: {e:?}"),
            }
        }
    }
    assert_eq!(confirmed, 600);
    assert!(
        engine.stats().script_reloads.load(Ordering::Relaxed) >= 1,
        "the reload after NOSCRIPT is counted"
    );
    let status = engine.sale_status("flushed").await.expect("status");
    assert_eq!(status.remaining, 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_master_mid_sale_fails_over_without_oversell() {
    let mut cluster = RedisCluster::start(3, 1);
    let engine = engine_on(&cluster).await;
    let status = engine
        .create_sale(SaleSpec {
            buckets: 3,
            ..SaleSpec::new("failover", 3000)
        })
        .await
        .expect("create");
    let victim = cluster.master_of_slot(status.buckets[0].slot);

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let buyers = {
        let engine = engine.clone();
        tokio::spawn(async move {
            let sem = Arc::new(tokio::sync::Semaphore::new(32));
            let deadline = Instant::now() + Duration::from_secs(40);
            let mut i = 0u64;
            while i < 6000 && Instant::now() < deadline {
                let permit = sem.clone().acquire_owned().await.expect("semaphore");
                let engine = engine.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let id = format!("b{i}");
                    let r = engine
                        .purchase(PurchaseRequest {
                            sku: "failover",
                            user: &id,
                            qty: 1,
                            request_id: &id,
                        })
                        .await;
                    let _ = tx.send((Instant::now(), r));
                    drop(permit);
                });
                i += 1;
            }
        })
    };

    // Let the sale run, then kill the master of bucket 0 without warning.
    let mut answers = Vec::new();
    while answers.len() < 300 {
        answers.push(rx.recv().await.expect("answers flow"));
    }
    let killed_at = Instant::now();
    cluster.node_mut(victim).kill();
    buyers.await.expect("buyer loop");
    while let Ok(a) = tokio::time::timeout(Duration::from_secs(20), rx.recv()).await {
        match a {
            Some(a) => answers.push(a),
            None => break,
        }
    }

    let ids: Vec<_> = answers
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok())
        .map(|c| c.order_id.clone())
        .collect();
    let unique: HashSet<_> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "no order id confirmed twice");
    let resumed = answers
        .iter()
        .filter(|(t, r)| {
            *t > killed_at + Duration::from_secs(1) && matches!(r, Ok(c) if c.bucket == 0)
        })
        .count();
    assert!(
        resumed > 0,
        "purchases in the failed bucket resumed after failover"
    );
    let errors: Vec<_> = answers
        .iter()
        .filter_map(|(_, r)| r.as_ref().err())
        .filter(|e| !matches!(e, PurchaseError::SoldOut))
        .collect();
    assert!(
        errors.len() < answers.len() / 10,
        "few buyers saw errors: {:?}",
        errors.first()
    );

    cluster.wait_healthy(Duration::from_secs(30));
    let status = engine
        .sale_status("failover")
        .await
        .expect("status after failover");
    assert_ne!(
        cluster.master_of_slot(status.buckets[0].slot),
        victim,
        "a replica took over"
    );
    for b in &status.buckets {
        assert!(b.remaining >= 0, "bucket {} below zero", b.index);
        // The script's writes replicate as one unit, so on the promoted
        // replica stock and stream still add up to what was put in.
        assert_eq!(
            b.initial as i64,
            b.remaining + b.stream_len as i64,
            "bucket {} conserves units",
            b.index
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_ack_confirms_only_what_a_replica_holds() {
    let mut cluster = RedisCluster::start(3, 1);
    let config = flashsale::Config {
        cluster_nodes: cluster.seeds(),
        lock_nodes: Vec::new(),
        ack: flashsale::Ack::Replicated,
        ..flashsale::Config::default()
    };
    let engine = flashsale::Engine::connect(config).await.expect("engine");
    let status = engine
        .create_sale(SaleSpec::new("durable", 1000))
        .await
        .expect("create");
    // Many purchases at once share WAITs (group commit); each still returns
    // only after a replica holds it.
    let burst: Vec<_> = (0..200)
        .map(|i| {
            let engine = engine.clone();
            tokio::spawn(async move {
                let id = format!("burst-{i}");
                engine
                    .purchase(PurchaseRequest {
                        sku: "durable",
                        user: &id,
                        qty: 1,
                        request_id: &id,
                    })
                    .await
            })
        })
        .collect();
    for t in burst {
        t.await.expect("task").expect("confirmed once replicated");
    }
    let c = engine
        .purchase(PurchaseRequest {
            sku: "durable",
            user: "u1",
            qty: 1,
            request_id: "r1",
        })
        .await
        .expect("confirmed once a replica has it");

    // The replica of the bucket's master holds the order already.
    let master = cluster.master_of_slot(status.buckets[0].slot);
    let nodes: String = cluster.node(master).cmd(&["CLUSTER", "NODES"]);
    let master_id = nodes
        .lines()
        .find(|l| l.contains("myself"))
        .and_then(|l| l.split(' ').next())
        .expect("id")
        .to_owned();
    let replica_port: u16 = nodes
        .lines()
        .find(|l| l.contains(&format!("slave {master_id}")))
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|a| a.split('@').next()?.rsplit(':').next()?.parse().ok())
        .expect("replica of the master");
    let mut replica = cluster.node(replica_port).conn();
    let _: () = redis::cmd("READONLY")
        .query(&mut replica)
        .expect("READONLY");
    let on_replica: redis::Value = redis::cmd("XRANGE")
        .arg(&status.buckets[0].stream)
        .arg("-")
        .arg("+")
        .query(&mut replica)
        .expect("XRANGE on the replica");
    assert!(
        format!("{on_replica:?}").contains(&c.order_id),
        "the confirmed order is on the replica"
    );
    let replica_len: i64 = redis::cmd("XLEN")
        .arg(&status.buckets[0].stream)
        .query(&mut replica)
        .expect("XLEN");
    assert_eq!(
        replica_len, 201,
        "every confirmed order was on the replica when confirmed"
    );

    // Without a replica, nothing is confirmed: the buyer is told to retry.
    cluster.node_mut(replica_port).kill();
    let r = engine
        .purchase(PurchaseRequest {
            sku: "durable",
            user: "u2",
            qty: 1,
            request_id: "r2",
        })
        .await;
    assert!(
        matches!(r, Err(PurchaseError::Unavailable(ref m)) if m.contains("replica")),
        "{r:?}"
    );
}

/// Moves every key of `slot` from the master on `from` to the master on `to`
/// the way `redis-cli --cluster reshard` does: IMPORTING/MIGRATING, MIGRATE
/// in batches, then SETSLOT NODE on every master.
fn migrate_slot(cluster: &RedisCluster, slot: u16, from: u16, to: u16) {
    let id = |port: u16| -> String { cluster.node(port).cmd(&["CLUSTER", "MYID"]) };
    let (from_id, to_id) = (id(from), id(to));
    let s = slot.to_string();
    let _: () = cluster
        .node(to)
        .cmd(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id]);
    let _: () = cluster
        .node(from)
        .cmd(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id]);
    loop {
        let keys: Vec<String> = cluster
            .node(from)
            .cmd(&["CLUSTER", "GETKEYSINSLOT", &s, "100"]);
        if keys.is_empty() {
            break;
        }
        let port = to.to_string();
        let mut args = vec![
            "MIGRATE",
            "127.0.0.1",
            port.as_str(),
            "",
            "0",
            "5000",
            "KEYS",
        ];
        args.extend(keys.iter().map(String::as_str));
        let _: String = cluster.node(from).cmd(&args);
    }
    for port in cluster.master_ports() {
        let _: () = cluster
            .node(port)
            .cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &to_id]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_a_bucket_slot_mid_sale_neither_oversells_nor_doubles() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    let status = engine
        .create_sale(SaleSpec::new("moving", 2000))
        .await
        .expect("create");
    let slot = status.buckets[0].slot;
    let from = cluster.master_of_slot(slot);
    let to = cluster
        .master_ports()
        .into_iter()
        .find(|p| *p != from)
        .expect("another master");

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let buyers = {
        let engine = engine.clone();
        tokio::spawn(async move {
            let sem = Arc::new(tokio::sync::Semaphore::new(32));
            for i in 0..3000u32 {
                let permit = sem.clone().acquire_owned().await.expect("semaphore");
                let (engine, tx) = (engine.clone(), tx.clone());
                tokio::spawn(async move {
                    let id = format!("m{i}");
                    let r = engine
                        .purchase(PurchaseRequest {
                            sku: "moving",
                            user: &id,
                            qty: 1,
                            request_id: &id,
                        })
                        .await;
                    let _ = tx.send((Instant::now(), r));
                    drop(permit);
                });
            }
        })
    };
    let mut answers = Vec::new();
    while answers.len() < 300 {
        answers.push(rx.recv().await.expect("answers flow"));
    }
    // Blocking commands on this runtime thread; the buyers keep running on
    // the other worker.
    let started = Instant::now();
    tokio::task::block_in_place(|| migrate_slot(&cluster, slot, from, to));
    let migration = (started, Instant::now());
    buyers.await.expect("buyers");
    while answers.len() < 3000 {
        match tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
            Ok(Some(a)) => answers.push(a),
            _ => break,
        }
    }
    assert_eq!(answers.len(), 3000, "every buyer got an answer");
    let times: Vec<Instant> = answers.iter().map(|(t, _)| *t).collect();
    let answers: Vec<_> = answers.into_iter().map(|(_, r)| r).collect();
    let confirmed: Vec<String> = answers
        .iter()
        .filter_map(|a| a.as_ref().ok())
        .map(|c| c.order_id.clone())
        .collect();
    let others: Vec<_> = answers
        .iter()
        .filter_map(|a| a.as_ref().err())
        .filter(|e| **e != PurchaseError::SoldOut)
        .collect();
    assert!(
        others.is_empty(),
        "buyers saw errors during the migration: {:?}",
        others.first()
    );
    assert_eq!(confirmed.len(), 2000, "exactly the stock was sold");
    let during = times
        .iter()
        .filter(|t| **t > migration.0 && **t < migration.1)
        .count();
    let after = times.iter().filter(|t| **t > migration.1).count();
    assert!(
        during > 0 && after > 0,
        "the sale ran through the migration ({during} answers during, {after} after)"
    );
    assert_eq!(
        confirmed.iter().collect::<HashSet<_>>().len(),
        2000,
        "no order id twice"
    );

    let status = engine.sale_status("moving").await.expect("status");
    assert_eq!(
        status.buckets[0].master,
        format!("127.0.0.1:{to}"),
        "the bucket now lives on the target"
    );
    assert_eq!(status.remaining, 0);
    assert_eq!(
        status.buckets[0].stream_len, 2000,
        "the stream moved with its slot, one entry per order"
    );
}
