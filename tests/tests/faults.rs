//! Faults injected into the real cluster in the middle of a sale: the script
//! cache flushed on every master, and a master killed with kill -9.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::sync::atomic::AtomicBool;

use flashsale::{Confirmed, Engine, PurchaseError, PurchaseRequest, SaleSpec};
use flashsale_tests::{engine_on, RedisCluster};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;

/// One buyer's answer: its request id, when the answer came, the answer.
type Answer = (String, Instant, Result<Confirmed, PurchaseError>);

/// Buyers `{prefix}{i}` (user and request id alike), one unit each of `sku`,
/// at most `in_flight` at once, until `stop` is set or 20,000 were sent.
/// Every answer arrives on the receiver; the handle ends once the last
/// buyer was sent (answers may still be on their way).
fn spawn_buyers(
    engine: &Engine,
    sku: &str,
    prefix: &'static str,
    in_flight: usize,
    stop: Arc<AtomicBool>,
) -> (JoinHandle<()>, UnboundedReceiver<Answer>) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (engine, sku) = (engine.clone(), sku.to_owned());
    let sender = tokio::spawn(async move {
        let sem = Arc::new(tokio::sync::Semaphore::new(in_flight));
        for i in 0..20_000u64 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let permit = sem.clone().acquire_owned().await.expect("semaphore");
            let (engine, tx, sku) = (engine.clone(), tx.clone(), sku.clone());
            tokio::spawn(async move {
                let id = format!("{prefix}{i}");
                let r = engine
                    .purchase(PurchaseRequest {
                        sku: &sku,
                        user: &id,
                        qty: 1,
                        request_id: &id,
                    })
                    .await;
                let _ = tx.send((id, Instant::now(), r));
                drop(permit);
            });
        }
    });
    (sender, rx)
}

/// Waits (at most 120 s) until `replica` has applied everything `master`
/// had written when this was called.
fn replica_caught_up(cluster: &RedisCluster, master: u16, replica: u16) {
    let offset = |port: u16, field: &str| -> i64 {
        let info: String = cluster.node(port).cmd(&["INFO", "replication"]);
        info.lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(-1)
    };
    let target = offset(master, "master_repl_offset:");
    flashsale_tests::wait_for(
        Duration::from_secs(120),
        || offset(replica, "slave_repl_offset:") >= target,
        || format!("replica {replica} never reached offset {target} of master {master}"),
    );
}

/// The answers by wave, before or after the kill, and outcome (the bucket
/// of a confirmation, the kind of an error): what a failure message needs.
fn tally(answers: &[Answer], killed_at: Instant) -> String {
    let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
    for (id, at, r) in answers {
        let when = if *at < killed_at { "before" } else { "after" };
        let what = match r {
            Ok(c) => format!("confirmed in bucket {}", c.bucket),
            Err(e) => format!("{e:?}").chars().take(50).collect(),
        };
        *kinds
            .entry(format!("{} {when}: {what}", &id[..1]))
            .or_default() += 1;
    }
    format!("{kinds:#?}")
}

/// The fault hit a batched sale: some script call carried more than one
/// purchase.
fn assert_ran_batched(engine: &Engine) {
    assert!(
        engine
            .stats()
            .largest_purchase_batch
            .load(Ordering::Relaxed)
            > 1,
        "purchases shared script calls"
    );
}

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
    assert_ran_batched(&engine);
    let status = engine.sale_status("flushed").await.expect("status");
    assert_eq!(status.remaining, 300);
}

/// Most purchases in flight at once in the failover tests.
const IN_FLIGHT: usize = 32;

/// What a failover run saw.
struct FailoverRun {
    /// Units confirmed to buyers (each request counted once).
    confirmed_units: u64,
    /// Confirmed orders missing from every stream after the failover.
    lost: usize,
    /// Errors (neither a confirmation nor a refusal) on first tries.
    errors: usize,
    /// Units put on sale.
    stock: u64,
}

/// A 3-bucket sale on 3 masters with a replica each; the master of bucket 0
/// is killed with kill -9 mid-sale. Buyers run until the failover is done
/// and bucket 0 has confirmed purchases again (events, not a clock), every
/// request that errored is retried under its own id until it settles, then
/// every confirmation is looked for in the streams of the promoted cluster.
async fn kill_a_master_mid_sale(ack: flashsale::Ack) -> FailoverRun {
    let mut cluster = RedisCluster::start(3, 1);
    let engine = flashsale_tests::engine_with(&cluster, |c| {
        c.ack = ack;
        // Failover on a busy 2-core machine can take many seconds.
        c.retry.deadline = Duration::from_secs(60);
    })
    .await;
    let stock = 3000u64;
    let sku = format!("failover-{ack:?}").to_lowercase();
    let status = engine
        .create_sale(SaleSpec {
            buckets: 3,
            ..SaleSpec::new(&sku, stock)
        })
        .await
        .expect("create");
    let victim = cluster.master_of_slot(status.buckets[0].slot);
    let stop = Arc::new(AtomicBool::new(false));
    let (buyers, mut rx) = spawn_buyers(&engine, &sku, "b", IN_FLIGHT, stop.clone());

    let mut answers = Vec::new();
    while answers.len() < 300 {
        answers.push(rx.recv().await.expect("answers flow"));
    }
    let promoted = cluster.replica_of(victim);
    // The kill is to lose what is in flight, not the sale: under `leader`
    // nothing waits for the replica, and on a loaded machine it may still
    // be catching up on the sale's creation (fresh-clone CI, twice: every
    // purchase after the failover answered `unknown_sale`). Wait until the
    // replica holds what the master held a moment ago.
    tokio::task::block_in_place(|| replica_caught_up(&cluster, victim, promoted));
    let killed_at = Instant::now();
    cluster.node_mut(victim).kill();
    let _failed_over = {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if cluster.master_ports().contains(&promoted) {
                break Instant::now();
            }
            assert!(Instant::now() < deadline, "no replica took over");
            // Keep collecting answers while the cluster fails over.
            while let Ok(a) = rx.try_recv() {
                answers.push(a);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    // Heal: the old master comes back, as a replica of the promoted one
    // (with ack = replicated, bucket 0 needs a replica to confirm again).
    cluster.node_mut(victim).restart();
    tokio::task::block_in_place(|| cluster.wait_healthy(Duration::from_secs(120)));
    // Bucket 0 sells again after the failover: 20 confirmations there of
    // requests sent after the kill, which only the promoted replica can
    // have served. Not "answered after the failover was seen": on a slow
    // machine the engine finds the new master before this test does, and
    // bucket 0 can sell out in between. Which requests were sent after the
    // kill follows from the semaphore: buyer i starts only once i -
    // IN_FLIGHT + 1 buyers have answered, so if A answered before the kill,
    // every buyer from A + IN_FLIGHT on started after it.
    //
    // On a loaded machine the failover can outlast the first wave's bounded
    // count of buyers; then further waves ("c", "d", ...) start, after the
    // cluster is healthy again, so every one of their requests was sent
    // after the kill. The wait ends on that event or the deadline, never
    // because the buyers ran out (CI saw a second wave run out too, under
    // the suite's load).
    let deadline = Instant::now() + Duration::from_secs(180);
    let resumed = |answers: &Vec<Answer>| {
        let before_kill = answers
            .iter()
            .filter(|(id, t, _)| id.starts_with('b') && *t < killed_at)
            .count();
        let first_after = (before_kill + IN_FLIGHT) as u64;
        answers
            .iter()
            .filter(|(id, _, r)| {
                let after_kill = !id.starts_with('b')
                    || id
                        .strip_prefix('b')
                        .and_then(|i| i.parse::<u64>().ok())
                        .is_some_and(|i| i >= first_after);
                after_kill && matches!(r, Ok(c) if c.bucket == 0)
            })
            .count()
    };
    let mut buyers = vec![buyers];
    let mut next_waves = ["c", "d", "e", "f", "g", "h"].into_iter();
    while resumed(&answers) < 20 {
        assert!(
            Instant::now() < deadline,
            "bucket 0 did not sell again after the failover: {}",
            tally(&answers, killed_at)
        );
        match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
            Ok(Some(a)) => answers.push(a),
            Ok(None) => match next_waves.next() {
                Some(prefix) => {
                    let (wave, wave_rx) =
                        spawn_buyers(&engine, &sku, prefix, IN_FLIGHT, stop.clone());
                    buyers.push(wave);
                    rx = wave_rx;
                }
                None => break,
            },
            Err(_) => {}
        }
    }
    stop.store(true, Ordering::Relaxed);
    for wave in buyers {
        wave.await.expect("buyer loop");
    }
    while let Ok(Some(a)) = tokio::time::timeout(Duration::from_secs(90), rx.recv()).await {
        answers.push(a);
    }
    assert!(
        resumed(&answers) >= 20,
        "purchases in the failed bucket resumed after failover: {}",
        tally(&answers, killed_at)
    );

    // Settle every request: a retry of an errored request gets its outcome.
    let errors = answers
        .iter()
        .filter(|(_, _, r)| matches!(r, Err(e) if *e != PurchaseError::SoldOut))
        .count();
    let mut outcome: HashMap<String, Result<flashsale::Confirmed, PurchaseError>> = HashMap::new();
    for (id, _, r) in answers {
        let settled = match r {
            Err(ref e) if *e != PurchaseError::SoldOut => {
                let mut last = r.clone();
                for _ in 0..20 {
                    last = engine
                        .purchase(PurchaseRequest {
                            sku: &sku,
                            user: &id,
                            qty: 1,
                            request_id: &id,
                        })
                        .await;
                    if !matches!(last, Err(PurchaseError::Unavailable(_))) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                last
            }
            other => other,
        };
        assert!(
            !matches!(settled, Err(PurchaseError::Unavailable(_))),
            "{id} settled: {settled:?}"
        );
        outcome.insert(id, settled);
    }
    let confirmed: HashMap<String, String> = outcome
        .iter()
        .filter_map(|(id, r)| r.as_ref().ok().map(|c| (c.order_id.clone(), id.clone())))
        .collect();
    assert_eq!(
        confirmed.len(),
        outcome.values().filter(|r| r.is_ok()).count(),
        "no order id confirmed to two requests"
    );

    cluster.wait_healthy(Duration::from_secs(60));
    let status = engine
        .sale_status(&sku)
        .await
        .expect("status after failover");
    assert_ne!(
        cluster.master_of_slot(status.buckets[0].slot),
        victim,
        "a replica took over"
    );
    let streamed = flashsale_tests::stream_orders(&cluster, &status);
    let in_streams: HashSet<&String> = streamed.iter().map(|(id, _)| id).collect();
    assert_eq!(
        in_streams.len(),
        streamed.len(),
        "no order twice in the streams"
    );
    for (id, user) in &streamed {
        assert_eq!(
            confirmed.get(id),
            Some(user),
            "every order in a stream was confirmed to its buyer, or is an errored request's"
        );
    }
    for b in &status.buckets {
        assert!(b.remaining >= 0, "bucket {} below zero", b.index);
        assert_eq!(
            b.initial as i64,
            b.remaining + b.stream_len as i64,
            "bucket {} conserves units",
            b.index
        );
    }
    let lost = confirmed
        .keys()
        .filter(|id| !in_streams.contains(id))
        .count();
    assert_ran_batched(&engine);
    FailoverRun {
        confirmed_units: confirmed.len() as u64,
        lost,
        errors,
        stock,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_master_mid_sale_fails_over_without_oversell() {
    let run = kill_a_master_mid_sale(flashsale::Ack::Replicated).await;
    assert_eq!(run.lost, 0, "ack = replicated loses no confirmed order");
    assert!(run.confirmed_units <= run.stock, "never oversold");
    assert!(
        run.errors <= IN_FLIGHT,
        "at most the purchases in flight saw an error: {}",
        run.errors
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_master_under_leader_ack_counts_what_it_lost() {
    let run = kill_a_master_mid_sale(flashsale::Ack::Leader).await;
    eprintln!(
        "ack = leader: {} confirmed, {} lost in the failover",
        run.confirmed_units, run.lost
    );
    // A lost order's unit went back to stock and may be sold again, so only
    // the confirmations still in a stream are bounded by the stock.
    assert!(
        run.confirmed_units - run.lost as u64 <= run.stock,
        "never oversold"
    );
    assert!(run.errors <= IN_FLIGHT, "errors: {}", run.errors);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_ack_confirms_only_what_a_replica_holds() {
    let mut cluster = RedisCluster::start(3, 1);
    let mut config = flashsale::Config {
        cluster_nodes: cluster.seeds(),
        lock_nodes: Vec::new(),
        ack: flashsale::Ack::Replicated,
        ..flashsale::Config::default()
    };
    // A purchase waits for a replica up to the retry deadline; keep the
    // "no replica at all" case short.
    config.retry.deadline = Duration::from_secs(3);
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
    let replica_port = cluster.replica_of(master);
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

    // Plain asynchronous replication on localhost would pass the checks
    // above too. So stop the replica: the order is made on the master, and
    // yet the purchase stays unanswered until the replica has it.
    let patient = flashsale_tests::engine_with(&cluster, |c| {
        c.ack = flashsale::Ack::Replicated;
        c.retry.deadline = Duration::from_secs(60);
    })
    .await;
    let master_len = |cluster: &RedisCluster| -> i64 {
        cluster
            .node(master)
            .cmd(&["XLEN", &status.buckets[0].stream])
    };
    let before = master_len(&cluster);
    cluster.node(replica_port).signal("STOP");
    let held = tokio::spawn(async move {
        patient
            .purchase(PurchaseRequest {
                sku: "durable",
                user: "u3",
                qty: 1,
                request_id: "r3",
            })
            .await
    });
    flashsale_tests::wait_for(
        Duration::from_secs(30),
        || master_len(&cluster) > before,
        || "the order was made on the master".into(),
    );
    // Two WAIT rounds (1 s each) pass with the answer still held back.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        !held.is_finished(),
        "unanswered while the replica is stopped"
    );
    cluster.node(replica_port).signal("CONT");
    held.await
        .expect("task")
        .expect("confirmed once the replica has it");

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
        matches!(r, Err(PurchaseError::Unavailable(flashsale::Unavailable::Unconfirmed(ref m))) if m.contains("replica")),
        "{r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_a_bucket_slot_mid_sale_neither_oversells_nor_doubles() {
    let cluster = RedisCluster::start(3, 0);
    let engine = engine_on(&cluster).await;
    // More stock than buyers: the sale must still be selling (not answering
    // from the sold-out flag) after the migration, so the test can require
    // confirmations made on the target master.
    let stock = 30_000u64;
    let status = engine
        .create_sale(SaleSpec::new("moving", stock))
        .await
        .expect("create");
    let slot = status.buckets[0].slot;
    let from = cluster.master_of_slot(slot);
    let to = cluster
        .master_ports()
        .into_iter()
        .find(|p| *p != from)
        .expect("another master");

    let stop = Arc::new(AtomicBool::new(false));
    let (buyers, mut rx) = spawn_buyers(&engine, "moving", "m", 32, stop.clone());
    let mut answers = Vec::new();
    while answers.len() < 300 {
        answers.push(rx.recv().await.expect("answers flow"));
    }
    // Blocking commands on this runtime thread; the buyers keep running on
    // the other worker.
    let started = Instant::now();
    let on_both = tokio::task::block_in_place(|| cluster.migrate_slot(slot, from, to));
    assert!(
        on_both.is_empty(),
        "keys of the slot were on both nodes mid-move: {on_both:?}"
    );
    let migration = (started, Instant::now());
    let after = |answers: &Vec<Answer>| {
        answers
            .iter()
            .filter(|(_, t, r)| *t > migration.1 && r.is_ok())
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while after(&answers) < 100 && Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
            Ok(Some(a)) => answers.push(a),
            Ok(None) => break,
            Err(_) => {}
        }
    }
    stop.store(true, Ordering::Relaxed);
    buyers.await.expect("buyers");
    while let Ok(Some(a)) = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
        answers.push(a);
    }
    let during = answers
        .iter()
        .filter(|(_, t, _)| *t > migration.0 && *t < migration.1)
        .count();
    let confirmed_after = after(&answers);
    assert!(
        during > 0 && confirmed_after >= 100,
        "the sale ran through the migration ({during} answers during, {confirmed_after} confirmed after)"
    );
    let others: Vec<_> = answers
        .iter()
        .filter_map(|(_, _, a)| a.as_ref().err())
        .collect();
    assert!(
        others.is_empty(),
        "buyers saw errors or refusals during the migration: {:?}",
        others.first()
    );
    let confirmed: HashSet<String> = answers
        .iter()
        .filter_map(|(_, _, a)| a.as_ref().ok())
        .map(|c| c.order_id.clone())
        .collect();

    let status = engine.sale_status("moving").await.expect("status");
    assert_eq!(
        status.buckets[0].master,
        format!("127.0.0.1:{to}"),
        "the bucket now lives on the target"
    );
    assert_eq!(
        status.remaining + confirmed.len() as u64,
        stock,
        "every unit taken is a confirmed order"
    );
    let streamed: Vec<String> = flashsale_tests::stream_orders(&cluster, &status)
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(
        streamed.len(),
        confirmed.len(),
        "one stream entry per order"
    );
    assert_eq!(
        streamed.into_iter().collect::<HashSet<_>>(),
        confirmed,
        "the stream moved with its slot and holds exactly the confirmed orders"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_ack_waits_for_the_home_bucket_writes_of_a_fall_through() {
    let cluster = RedisCluster::start(3, 1);
    let engine = flashsale_tests::engine_with(&cluster, |c| {
        c.ack = flashsale::Ack::Replicated;
        c.retry.deadline = Duration::from_secs(60);
    })
    .await;
    // Stock 1 over 2 buckets: the unit is in bucket 0; olga's home is
    // bucket 1, so her purchase reserves quota and records the request at
    // home, takes in bucket 0, and settles at home.
    let status = engine
        .create_sale(SaleSpec {
            buckets: 2,
            per_user_limit: 1,
            ..SaleSpec::new("fall-durable", 1)
        })
        .await
        .expect("create");
    let olga = flashsale_tests::user_with_home("olga", 2, 1);
    let home_master = cluster.master_of_slot(status.buckets[1].slot);
    let home_replica = cluster.replica_of(home_master);
    cluster.node(home_replica).signal("STOP");
    let pending = {
        let (engine, olga) = (engine.clone(), olga.clone());
        tokio::spawn(async move {
            engine
                .purchase(PurchaseRequest {
                    sku: "fall-durable",
                    user: &olga,
                    qty: 1,
                    request_id: "olga-1",
                })
                .await
        })
    };
    // The home bucket reserves the quota and records the request, and then
    // nothing more happens and nothing is answered while its replica lacks
    // those writes: no bucket takes before the reservation is replicated.
    let home_node = cluster.node(home_master);
    let record = format!("{{{}}}:r:*", status.buckets[1].tag);
    flashsale_tests::wait_until(
        Duration::from_secs(30),
        "the request is pending at home",
        || {
            let pending = home_node
                .keys(&record)
                .iter()
                .any(|k| home_node.cmd::<String>(&["GET", k]).starts_with("P:"));
            async move { pending }
        },
    )
    .await;
    // Two WAIT rounds (1 s each) pass with the answer still held back.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        !pending.is_finished(),
        "not confirmed while the home bucket's replica lacks its writes"
    );
    let taker = cluster.node(cluster.master_of_slot(status.buckets[0].slot));
    let taken: i64 = taker.cmd(&["XLEN", &status.buckets[0].stream]);
    assert_eq!(
        taken, 0,
        "no bucket took before the home reservation was replicated"
    );
    cluster.node(home_replica).signal("CONT");
    let c = pending
        .await
        .expect("task")
        .expect("confirmed once the replica has every write");
    let retry = engine
        .purchase(PurchaseRequest {
            sku: "fall-durable",
            user: &olga,
            qty: 1,
            request_id: "olga-1",
        })
        .await
        .expect("the retry gets the same order");
    assert_eq!(retry.order_id, c.order_id);
    let status = engine.sale_status("fall-durable").await.expect("status");
    let orders = flashsale_tests::stream_orders(&cluster, &status);
    assert_eq!(orders.len(), 1);
    assert_eq!(orders[0].0, c.order_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_never_commits_an_order_a_failover_can_take_back() {
    let mut cluster = RedisCluster::start(3, 1);
    let pg = flashsale_tests::PgDb::create();
    let pool = flashsale::db::pool(&pg.url(), 4).expect("pool");
    let engine = engine_on(&cluster).await;
    let status = engine
        .create_sale(SaleSpec::new("takeback", 10))
        .await
        .expect("create");
    let slot = status.buckets[0].slot;
    let master = cluster.master_of_slot(slot);
    let replica = cluster.replica_of(master);
    let buy = |id: &'static str| {
        let engine = engine.clone();
        async move {
            engine
                .purchase(PurchaseRequest {
                    sku: "takeback",
                    user: id,
                    qty: 1,
                    request_id: id,
                })
                .await
                .expect("confirmed by the leader")
        }
    };
    let first = buy("first").await;
    let writer = engine
        .spawn_order_writer(
            pool.clone(),
            flashsale_tests::fast_writer(Duration::from_secs(5)),
        )
        .await
        .expect("writer");
    flashsale_tests::wait_for_db_orders(&pool, "takeback", 1, Duration::from_secs(30)).await;

    // The replica dies; the leader confirms a second order that only it has.
    cluster.node_mut(replica).kill();
    let second = buy("second").await;
    let held_before = writer.progress().held_unreplicated;
    flashsale_tests::wait_until(
        Duration::from_secs(30),
        "the writer holds the batch",
        || {
            let n = writer.progress().held_unreplicated;
            async move { n > held_before + 2 }
        },
    )
    .await;
    let ids = flashsale_tests::db_order_ids(&pool, "takeback").await;
    assert_eq!(
        ids,
        vec![first.order_id.clone()],
        "nothing unreplicated is written"
    );

    // The master dies too; the replica comes back from its own (stale) files
    // and takes over, without the second order.
    cluster.node_mut(master).kill();
    cluster.node_mut(replica).restart();
    flashsale_tests::wait_for(
        Duration::from_secs(60),
        || cluster.master_ports().contains(&replica),
        || "the replica was promoted".into(),
    );
    cluster.wait_healthy(Duration::from_secs(60));
    // A third order after the failover reaches PostgreSQL: the writer runs.
    let third = buy("third").await;
    flashsale_tests::wait_for_db_orders(&pool, "takeback", 2, Duration::from_secs(60)).await;
    let report = writer.drain(Duration::from_secs(30)).await.expect("drain");
    let ids: HashSet<String> = flashsale_tests::db_order_ids(&pool, "takeback")
        .await
        .into_iter()
        .collect();
    assert!(ids.contains(&first.order_id) && ids.contains(&third.order_id));
    assert!(
        !ids.contains(&second.order_id),
        "the order the failover took back is not in PostgreSQL ({report:?})"
    );
    // The unit of the lost order is back in stock, and the ledger balances.
    let ledger = flashsale::ledger::reconcile(&engine, &pool, &["takeback".to_owned()])
        .await
        .expect("reconcile");
    assert!(ledger[0].conserved, "{ledger:?}");
    assert_eq!(ledger[0].remaining, 8, "{ledger:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_replay_never_confirms_an_order_its_bucket_has_not_replicated() {
    let mut cluster = RedisCluster::start(3, 1);
    let engine = flashsale_tests::engine_with(&cluster, |c| {
        c.ack = flashsale::Ack::Replicated;
        c.retry.deadline = Duration::from_secs(2);
    })
    .await;
    // The only unit is in bucket 0; pia's home is bucket 1, so bucket 0
    // serves her order and its master's replica is dead.
    let status = engine
        .create_sale(SaleSpec {
            buckets: 2,
            ..SaleSpec::new("replay-durable", 1)
        })
        .await
        .expect("create");
    let pia = flashsale_tests::user_with_home("pia", 2, 1);
    let taker_master = cluster.master_of_slot(status.buckets[0].slot);
    let taker_replica = cluster.replica_of(taker_master);
    cluster.node_mut(taker_replica).kill();
    let buy = || {
        engine.purchase(PurchaseRequest {
            sku: "replay-durable",
            user: &pia,
            qty: 1,
            request_id: "pia-1",
        })
    };
    let first = buy().await;
    assert!(
        matches!(first, Err(PurchaseError::Unavailable(_))),
        "not confirmed: {first:?}"
    );
    let retry = buy().await;
    assert!(
        matches!(retry, Err(PurchaseError::Unavailable(_))),
        "a replay is not confirmed either while its bucket's write is on no replica: {retry:?}"
    );
    cluster.node_mut(taker_replica).restart();
    cluster.wait_healthy(Duration::from_secs(60));
    let mut last = buy().await;
    for _ in 0..20 {
        if last.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        last = buy().await;
    }
    let c = last.expect("confirmed once the replica has it");
    let status = engine.sale_status("replay-durable").await.expect("status");
    let orders = flashsale_tests::stream_orders(&cluster, &status);
    assert_eq!(orders.len(), 1);
    assert_eq!(orders[0].0, c.order_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_fall_through_takes_nothing_until_the_home_reservation_is_replicated() {
    let mut cluster = RedisCluster::start(3, 1);
    let engine = flashsale_tests::engine_with(&cluster, |c| {
        c.ack = flashsale::Ack::Replicated;
        c.retry.deadline = Duration::from_secs(2);
    })
    .await;
    let status = engine
        .create_sale(SaleSpec {
            buckets: 2,
            per_user_limit: 1,
            ..SaleSpec::new("home-first", 1)
        })
        .await
        .expect("create");
    let quin = flashsale_tests::user_with_home("quin", 2, 1);
    let home_master = cluster.master_of_slot(status.buckets[1].slot);
    let home_replica = cluster.replica_of(home_master);
    cluster.node_mut(home_replica).kill();
    let r = engine
        .purchase(PurchaseRequest {
            sku: "home-first",
            user: &quin,
            qty: 1,
            request_id: "quin-1",
        })
        .await;
    assert!(matches!(r, Err(PurchaseError::Unavailable(_))), "{r:?}");
    let taker = cluster.node(cluster.master_of_slot(status.buckets[0].slot));
    let taken: i64 = taker.cmd(&["XLEN", &status.buckets[0].stream]);
    assert_eq!(
        taken, 0,
        "no bucket takes while the home bucket's reservation could still be lost"
    );
}

/// Freezes the replica of `master` and cuts its replication link while it
/// cannot reconnect: what the master writes from now on is only on the
/// master (the chaos tool's `kill` fault, made deterministic).
fn cut_off_replica(cluster: &RedisCluster, master: u16, replica: u16) {
    // Everything written so far (the sale itself: a create is confirmed by
    // the master alone) reaches the replica first.
    flashsale_tests::wait_for(
        Duration::from_secs(30),
        || {
            let info: String = cluster.node(master).cmd(&["INFO", "replication"]);
            let field = |name: &str| -> Option<i64> {
                info.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .and_then(|v| v.trim().parse().ok())
            };
            let acked = info
                .lines()
                .filter(|l| l.starts_with("slave0:"))
                .find_map(|l| l.split(',').find_map(|kv| kv.strip_prefix("offset=")))
                .and_then(|v| v.parse::<i64>().ok());
            matches!((field("master_repl_offset:"), acked), (Some(m), Some(r)) if r >= m)
        },
        || "the replica did not catch up before it was cut off".into(),
    );
    cluster.node(replica).signal("STOP");
    let _: redis::Value = cluster
        .node(master)
        .cmd(&["CLIENT", "KILL", "TYPE", "replica"]);
}

/// kill -9 of `master`, the frozen `replica` resumed, and a wait until the
/// cluster has promoted it (without the master's last writes).
fn kill_master_and_promote(cluster: &mut RedisCluster, master: u16, replica: u16) {
    cluster.node_mut(master).kill();
    cluster.node(replica).signal("CONT");
    tokio::task::block_in_place(|| {
        flashsale_tests::wait_for(
            Duration::from_secs(60),
            || cluster.master_ports().contains(&replica),
            || "the replica was not promoted".into(),
        )
    });
}

/// Found by `flashsale-chaos --seed 20261122 --duration 10m` (kill fault):
/// the purchase's master dies while its replica is cut off, so its write is
/// on no replica. The WAIT that follows must not be answered by another node
/// (the client library falls back to any connected node when the slot's
/// master is down, and another master answers `WAIT 1` with 1), nor by the
/// promoted replica, which never had the write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_ack_never_confirms_a_write_the_promoted_replica_lacks() {
    let mut cluster = RedisCluster::start(3, 1);
    let engine = flashsale_tests::engine_with(&cluster, |c| {
        c.ack = flashsale::Ack::Replicated;
        // Long enough to outlast the failover: the answer comes after it.
        c.retry.deadline = Duration::from_secs(30);
    })
    .await;
    let status = engine
        .create_sale(SaleSpec::new("promoted-lacks", 10))
        .await
        .expect("create");
    let stream = status.buckets[0].stream.clone();
    let master = cluster.master_of_slot(status.buckets[0].slot);
    let replica = cluster.replica_of(master);
    // The replica can neither receive nor reconnect: what the master writes
    // from now on is only on the master.
    cut_off_replica(&cluster, master, replica);
    let buyer = {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .purchase(PurchaseRequest {
                    sku: "promoted-lacks",
                    user: "lea",
                    qty: 1,
                    request_id: "lea-1",
                })
                .await
        })
    };
    flashsale_tests::wait_for(
        Duration::from_secs(30),
        || cluster.node(master).cmd::<i64>(&["XLEN", &stream]) == 1,
        || "the order was made on the master".into(),
    );
    let first_order = stream_order_ids(&cluster, master, &stream);
    kill_master_and_promote(&mut cluster, master, replica);
    let answer = buyer.await.expect("task");
    let on_promoted: i64 = cluster.node(replica).cmd(&["XLEN", &stream]);
    if let Ok(c) = &answer {
        panic!(
            "confirmed order {} although the promoted replica holds {on_promoted} orders",
            c.order_id
        );
    }
    assert!(
        matches!(answer, Err(PurchaseError::Unavailable(_))),
        "{answer:?}"
    );
    // The first attempt's write never reached the promoted replica. Its
    // outcome was unknown to the engine (the master died before the
    // batch's reply came back with its WAIT's), so the engine retried the
    // same batch there (same order id), which may have made the order
    // anew: at most that one order, and it was not confirmed either (no
    // replica was left to hold it).
    let promoted_orders = stream_order_ids(&cluster, replica, &stream);
    assert!(
        on_promoted <= 1 && promoted_orders.iter().all(|o| first_order.contains(o)),
        "the promoted replica holds only the retried batch's order: {promoted_orders:?}, first {first_order:?}"
    );
}

/// The order ids in `stream` on the node at `port`.
fn stream_order_ids(cluster: &RedisCluster, port: u16, stream: &str) -> Vec<String> {
    let reply: redis::Value = cluster.node(port).cmd(&["XRANGE", stream, "-", "+"]);
    let tag = flashsale::keys::stream_tag(stream).expect("an order stream's key");
    flashsale::orders::entry::parse_entries(&reply)
        .into_iter()
        .filter_map(|e| match e.to_record(tag) {
            Ok(flashsale::orders::entry::Record::Order(o)) => Some(o.order_id),
            Ok(flashsale::orders::entry::Record::Event(_)) => None,
            Err(why) => panic!("entry {e:?} of {stream} does not parse: {why}"),
        })
        .collect()
}

/// The review of the fix above: every attempt of a request writes the same
/// record key, so a WAIT round that only asked "does the record exist?"
/// let a retry's record on the promoted replica confirm the first attempt's
/// order, which the failover took back. The first attempt must never be
/// confirmed with an order that does not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_on_the_promoted_replica_never_confirms_the_first_attempts_lost_order() {
    let mut cluster = RedisCluster::start(3, 1);
    let patient = flashsale_tests::engine_with(&cluster, |c| {
        c.ack = flashsale::Ack::Replicated;
        c.retry.deadline = Duration::from_secs(90);
    })
    .await;
    let status = patient
        .create_sale(SaleSpec::new("retry-on-promoted", 10))
        .await
        .expect("create");
    let stream = status.buckets[0].stream.clone();
    let master = cluster.master_of_slot(status.buckets[0].slot);
    let replica = cluster.replica_of(master);
    cut_off_replica(&cluster, master, replica);
    let req = || PurchaseRequest {
        sku: "retry-on-promoted",
        user: "max",
        qty: 1,
        request_id: "max-1",
    };
    let first = {
        let engine = patient.clone();
        tokio::spawn(async move { engine.purchase(req()).await })
    };
    flashsale_tests::wait_for(
        Duration::from_secs(30),
        || cluster.node(master).cmd::<i64>(&["XLEN", &stream]) == 1,
        || "the first attempt's order was made on the master".into(),
    );
    kill_master_and_promote(&mut cluster, master, replica);
    // The old master comes back as the promoted one's replica, so a WAIT
    // there can succeed again while the first attempt still waits.
    tokio::task::block_in_place(|| {
        cluster.node_mut(master).restart();
        cluster.wait_healthy(Duration::from_secs(60));
    });
    let retry_engine = flashsale_tests::engine_with(&cluster, |c| {
        c.ack = flashsale::Ack::Replicated;
        c.retry.deadline = Duration::from_secs(30);
    })
    .await;
    // A client retries until it gets an answer; right after the heal the
    // first tries may still be told to come back.
    let mut retry = retry_engine.purchase(req()).await;
    for _ in 0..40 {
        if retry.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        retry = retry_engine.purchase(req()).await;
    }
    let retry = retry.expect("the retry buys");
    let first = first.await.expect("task");
    if let Ok(c) = &first {
        assert_eq!(
            c.order_id, retry.order_id,
            "the first attempt was confirmed with order {}, which the failover took back",
            c.order_id
        );
    }
    let on_master: Vec<(String, String)> = flashsale_tests::stream_orders(
        &cluster,
        &retry_engine
            .sale_status("retry-on-promoted")
            .await
            .expect("status"),
    );
    assert_eq!(on_master.len(), 1, "{on_master:?}");
    assert_eq!(on_master[0].0, retry.order_id);
}

/// Found by `flashsale-chaos --ack leader --seed 20261128`: under `ack =
/// leader` a fall-through's take in another bucket was lost when that
/// bucket's master died before its replica had it, while the home record
/// (on another master) kept naming the order. Every retry then answered
/// "unavailable" for the request's whole TTL (a sale that holds orders),
/// or replayed the order as confirmed although no bucket held it (one that
/// does not). A retry is told the order is lost, once and for good.
async fn fall_through_order_lost_in_a_failover(sku: &str, hold_ms: u64) {
    let mut cluster = RedisCluster::start(3, 1);
    let engine = flashsale_tests::engine_with(&cluster, |c| {
        c.ack = flashsale::Ack::Leader;
        c.retry.deadline = Duration::from_secs(30);
    })
    .await;
    // Stock 1 over 2 buckets: the unit is in bucket 0; the buyer's home is
    // bucket 1, so the purchase records the request at home, takes in
    // bucket 0, and settles at home.
    let status = engine
        .create_sale(SaleSpec {
            buckets: 2,
            hold_ms,
            ..SaleSpec::new(sku, 1)
        })
        .await
        .expect("create");
    let buyer = flashsale_tests::user_with_home("lost", 2, 1);
    let taker = cluster.master_of_slot(status.buckets[0].slot);
    let home = cluster.master_of_slot(status.buckets[1].slot);
    assert_ne!(taker, home, "the buckets are on different masters");
    let replica = cluster.replica_of(taker);
    cut_off_replica(&cluster, taker, replica);
    let req = || PurchaseRequest {
        sku,
        user: &buyer,
        qty: 1,
        request_id: "lost-1",
    };
    let first = engine
        .purchase(req())
        .await
        .expect("confirmed by the leader");
    assert_eq!(first.bucket, 0, "taken in the other bucket");
    kill_master_and_promote(&mut cluster, taker, replica);
    // A client retries while it is told to come back.
    let mut retry = engine.purchase(req()).await;
    for _ in 0..60 {
        if !matches!(retry, Err(PurchaseError::Unavailable(_))) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        retry = engine.purchase(req()).await;
    }
    match retry {
        Err(PurchaseError::OrderLost { order_id }) => assert_eq!(order_id, first.order_id),
        other => panic!(
            "a retry of order {} (lost with bucket 0's master) got {other:?}",
            first.order_id
        ),
    }
    let on_promoted = stream_order_ids(&cluster, replica, &status.buckets[0].stream);
    assert!(
        on_promoted.is_empty(),
        "no bucket holds it: {on_promoted:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_order_lost_in_a_failover_is_told_lost_not_unavailable_for_a_day() {
    fall_through_order_lost_in_a_failover("lost-held", 60_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paid_order_lost_in_a_failover_is_never_replayed_as_confirmed() {
    fall_through_order_lost_in_a_failover("lost-paid", 0).await;
}

/// The group commit's own script (`lua/ack.lua`) is reloaded after a
/// SCRIPT FLUSH like every other: replicated purchases keep confirming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_ack_survives_a_script_flush() {
    let cluster = RedisCluster::start(3, 1);
    let engine = flashsale_tests::engine_with(&cluster, |c| {
        c.ack = flashsale::Ack::Replicated;
        c.retry.deadline = Duration::from_secs(20);
    })
    .await;
    engine
        .create_sale(SaleSpec::new("flush-replicated", 100))
        .await
        .expect("create");
    for round in 0..3 {
        for &port in &cluster.master_ports() {
            let _: String = cluster.node(port).cmd(&["SCRIPT", "FLUSH"]);
        }
        let id = format!("after-flush-{round}");
        engine
            .purchase(PurchaseRequest {
                sku: "flush-replicated",
                user: &id,
                qty: 1,
                request_id: &id,
            })
            .await
            .expect("confirmed after the flush");
    }
}

/// Found by `flashsale-chaos --seed 20261122 --duration 10m` (after the ack
/// fixes above): under `ack = replicated`, restocks confirmed to the
/// operator were missing after `kill` faults. A restock is confirmed only
/// once a replica of each bucket's master holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_restock_is_never_confirmed_before_a_replica_holds_it() {
    let mut cluster = RedisCluster::start(3, 1);
    let engine = flashsale_tests::engine_with(&cluster, |c| {
        c.ack = flashsale::Ack::Replicated;
        c.retry.deadline = Duration::from_secs(30);
    })
    .await;
    let status = engine
        .create_sale(SaleSpec::new("restock-durable", 10))
        .await
        .expect("create");
    let sale_key = format!("{{{}}}:sale", status.buckets[0].tag);
    let master = cluster.master_of_slot(status.buckets[0].slot);
    let replica = cluster.replica_of(master);
    cut_off_replica(&cluster, master, replica);
    let restock = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.restock_op("restock-durable", 5, "op-1").await })
    };
    flashsale_tests::wait_for(
        Duration::from_secs(30),
        || {
            cluster
                .node(master)
                .cmd::<i64>(&["HGET", &sale_key, "initial"])
                == 15
        },
        || "the restock was applied on the master".into(),
    );
    kill_master_and_promote(&mut cluster, master, replica);
    let answer = restock.await.expect("task");
    let on_promoted: i64 = cluster.node(replica).cmd(&["HGET", &sale_key, "initial"]);
    assert!(
        answer.is_err() || on_promoted == 15,
        "restock confirmed ({answer:?}) but the promoted replica counts {on_promoted} units"
    );
    assert!(
        matches!(answer, Err(flashsale::AdminError::Unavailable(_))),
        "{answer:?}"
    );
}

/// Found by the session 7 attack: under `ack = replicated`, `close_sale`
/// answered "closed" as soon as the masters had the close, so a failover
/// could bring back a sale the operator was told is closed (open, selling).
/// A close is confirmed only once a replica of each bucket's master holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_close_is_never_confirmed_before_a_replica_holds_it() {
    let mut cluster = RedisCluster::start(3, 1);
    let engine = flashsale_tests::engine_with(&cluster, |c| {
        c.ack = flashsale::Ack::Replicated;
        c.retry.deadline = Duration::from_secs(10);
    })
    .await;
    let status = engine
        .create_sale(SaleSpec::new("close-durable", 10))
        .await
        .expect("create");
    let sale_key = format!("{{{}}}:sale", status.buckets[0].tag);
    let master = cluster.master_of_slot(status.buckets[0].slot);
    let replica = cluster.replica_of(master);
    cut_off_replica(&cluster, master, replica);
    let close = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.close_sale("close-durable").await })
    };
    flashsale_tests::wait_for(
        Duration::from_secs(30),
        || {
            cluster
                .node(master)
                .cmd::<String>(&["HGET", &sale_key, "state"])
                == "closed"
        },
        || "the close was applied on the master".into(),
    );
    kill_master_and_promote(&mut cluster, master, replica);
    let answer = close.await.expect("task");
    let on_promoted: String = cluster.node(replica).cmd(&["HGET", &sale_key, "state"]);
    assert!(
        answer.is_err() || on_promoted == "closed",
        "close confirmed ({answer:?}) but the promoted replica says {on_promoted:?}"
    );
    assert!(
        matches!(answer, Err(flashsale::AdminError::Unavailable(_))),
        "{answer:?}"
    );
}

/// Found by the attack on the close fix: the close was confirmed bucket by
/// bucket, so a bucket whose master had no replica stopped the close at
/// that bucket, and the buckets after it stayed open and kept selling. Now
/// every bucket is closed on its master first, then the close waits for
/// the replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_close_closes_every_bucket_even_when_one_cannot_be_confirmed() {
    let cluster = RedisCluster::start(3, 1);
    let engine = flashsale_tests::engine_with(&cluster, |c| {
        c.ack = flashsale::Ack::Replicated;
        c.retry.deadline = Duration::from_secs(3);
    })
    .await;
    let mut spec = SaleSpec::new("close-all", 30);
    spec.buckets = 3;
    let status = engine.create_sale(spec).await.expect("create");
    let first = &status.buckets[0];
    let master = cluster.master_of_slot(first.slot);
    let replica = cluster.replica_of(master);
    cut_off_replica(&cluster, master, replica);
    let answer = engine.close_sale("close-all").await;
    assert!(
        matches!(answer, Err(flashsale::AdminError::Unavailable(_))),
        "bucket 0's close cannot be confirmed: {answer:?}"
    );
    for b in &status.buckets {
        let key = format!("{{{}}}:sale", b.tag);
        let state: String = cluster
            .node(cluster.master_of_slot(b.slot))
            .cmd(&["HGET", &key, "state"]);
        assert_eq!(state, "closed", "bucket {} still sells", b.index);
    }
    cluster.node(replica).signal("CONT");
}

/// A sale of 1 unit over 2 buckets (the unit in bucket 0) under `ack =
/// leader`, a buyer whose home is bucket 1, and each bucket's record key
/// for the buyer's request `request_id` with the master that holds it.
async fn leader_sale_with_a_fall_through_buyer(
    cluster: &RedisCluster,
    sku: &str,
    request_id: &str,
) -> (Engine, String, [(u16, String); 2]) {
    let engine = flashsale_tests::engine_with(cluster, |c| {
        c.ack = flashsale::Ack::Leader;
        c.retry.deadline = Duration::from_secs(30);
    })
    .await;
    let status = engine
        .create_sale(SaleSpec {
            buckets: 2,
            ..SaleSpec::new(sku, 1)
        })
        .await
        .expect("create");
    let buyer = flashsale_tests::user_with_home("moved", 2, 1);
    let record = |b: usize| {
        let keys = flashsale::keys::BucketKeys::new(&status.buckets[b].tag);
        (
            cluster.master_of_slot(status.buckets[b].slot),
            keys.request(&buyer, request_id),
        )
    };
    (engine.clone(), buyer.clone(), [record(0), record(1)])
}

/// From the attack on the chaos checker's round: under `ack = leader` a
/// home record can name an order (O1) its taking bucket no longer holds
/// while that bucket holds another order (O2) for the same request: O1's
/// take was lost with its master, and a concurrent attempt's take reached
/// the promoted replica. Every replay answered "unavailable" until the
/// record expired, naming an order that does not exist. A replay answers
/// the order that exists, from the bucket that holds it. The state after
/// the race is written as the race leaves it (the failover itself is
/// tested above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_answers_the_order_its_taking_bucket_holds_not_one_a_failover_took_back() {
    let cluster = RedisCluster::start(3, 0);
    let sku = "moved-replay";
    let (engine, buyer, [(taker, taker_rec), (home, home_rec)]) =
        leader_sale_with_a_fall_through_buyer(&cluster, sku, "r1").await;
    let lost = format!("{sku}~0~{:032x}", 1);
    let held = format!("{sku}~0~{:032x}", 2);
    let home_says = format!("C:1:0:{lost}");
    let taker_says = format!("C:1:0:{held}");
    let _: String = cluster
        .node(home)
        .cmd(&["SET", &home_rec, &home_says, "EX", "600"]);
    let _: String = cluster
        .node(taker)
        .cmd(&["SET", &taker_rec, &taker_says, "EX", "600"]);
    let replay = engine
        .purchase(PurchaseRequest {
            sku,
            user: &buyer,
            qty: 1,
            request_id: "r1",
        })
        .await;
    match replay {
        Ok(c) => {
            assert_eq!(c.order_id, held, "the order bucket 0 holds");
            assert_eq!(c.bucket, 0);
            assert!(c.replayed);
        }
        other => panic!("home names {lost}, bucket 0 holds {held}: got {other:?}"),
    }
}

/// The same race when the concurrent attempt found the promoted replica
/// sold out and recorded a refusal there: no bucket holds an order for the
/// request, and the replay says the named one is lost, not "unavailable"
/// until the record expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_whose_taking_bucket_refused_after_a_failover_is_told_lost() {
    let cluster = RedisCluster::start(3, 0);
    let sku = "moved-refused";
    let (engine, buyer, [(taker, taker_rec), (home, home_rec)]) =
        leader_sale_with_a_fall_through_buyer(&cluster, sku, "r1").await;
    let lost = format!("{sku}~0~{:032x}", 1);
    let home_says = format!("C:1:0:{lost}");
    let _: String = cluster
        .node(home)
        .cmd(&["SET", &home_rec, &home_says, "EX", "600"]);
    let _: String = cluster
        .node(taker)
        .cmd(&["SET", &taker_rec, "X:1:-1", "EX", "600"]);
    let replay = engine
        .purchase(PurchaseRequest {
            sku,
            user: &buyer,
            qty: 1,
            request_id: "r1",
        })
        .await;
    match replay {
        Err(PurchaseError::OrderLost { order_id }) => assert_eq!(order_id, lost),
        other => panic!("bucket 0 refused the request after losing {lost}: got {other:?}"),
    }
}

/// The first attempt that loses that race: its walk took O2 in bucket 0
/// (the take of O1 lost), and its settle found the home record already
/// naming O1. It answered "confirmed O1, replayed" for an order no bucket
/// holds, while O2 went to PostgreSQL under an id nobody was told. It
/// answers O2. Bucket 0's master is paused for writes while the attempt's
/// take waits there, and the home record is settled meanwhile, as the
/// other attempt's settle would have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_walk_that_took_after_a_lost_take_answers_its_own_order_not_the_lost_one() {
    let cluster = RedisCluster::start(3, 0);
    let sku = "moved-walk";
    let (engine, buyer, [(taker, _), (home, home_rec)]) =
        leader_sale_with_a_fall_through_buyer(&cluster, sku, "r1").await;
    let lost = format!("{sku}~0~{:032x}", 1);
    let _: String = cluster
        .node(taker)
        .cmd(&["CLIENT", "PAUSE", "30000", "WRITE"]);
    let attempt = {
        let (engine, buyer) = (engine.clone(), buyer.clone());
        tokio::spawn(async move {
            engine
                .purchase(PurchaseRequest {
                    sku: "moved-walk",
                    user: &buyer,
                    qty: 1,
                    request_id: "r1",
                })
                .await
        })
    };
    flashsale_tests::wait_for(
        Duration::from_secs(20),
        || {
            cluster
                .node(home)
                .cmd::<Option<String>>(&["GET", &home_rec])
                .is_some_and(|r| r.starts_with('P'))
        },
        || "the attempt recorded the request as pending at home".into(),
    );
    let home_says = format!("C:1:0:{lost}");
    let _: String = cluster
        .node(home)
        .cmd(&["SET", &home_rec, &home_says, "EX", "600"]);
    let _: String = cluster.node(taker).cmd(&["CLIENT", "UNPAUSE"]);
    let answer = attempt.await.expect("task");
    let status = engine.sale_status(sku).await.expect("status");
    let in_stream = stream_order_ids(&cluster, taker, &status.buckets[0].stream);
    match answer {
        Ok(c) => {
            assert_ne!(c.order_id, lost, "answered an order no bucket holds");
            assert_eq!(in_stream, vec![c.order_id.clone()], "the order it took");
        }
        other => panic!("the walk took {in_stream:?} in bucket 0: got {other:?}"),
    }
}

/// From the attack on #33's changes: under `ack = replicated` the taking
/// bucket's record of a request (written at the take) expires before the
/// home record (settled after the take's WAIT, with the same TTL); a
/// replay in between was told `order_lost` for an order paid in
/// PostgreSQL. Under `replicated` a confirmed home record means the take
/// was on a replica, so the order stands. The expiry is a DEL of the
/// taking bucket's record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_order_whose_taking_record_expired_first_is_replayed_not_lost() {
    let cluster = RedisCluster::start(3, 1);
    let sku = "expired-taker";
    let engine = flashsale_tests::engine_with(&cluster, |c| {
        c.ack = flashsale::Ack::Replicated;
        c.retry.deadline = Duration::from_secs(30);
    })
    .await;
    let status = engine
        .create_sale(SaleSpec {
            buckets: 2,
            ..SaleSpec::new(sku, 1)
        })
        .await
        .expect("create");
    let buyer = flashsale_tests::user_with_home("expired", 2, 1);
    let req = || PurchaseRequest {
        sku,
        user: &buyer,
        qty: 1,
        request_id: "r1",
    };
    let first = engine.purchase(req()).await.expect("confirmed");
    assert_eq!(first.bucket, 0, "taken in the other bucket");
    let taker_rec = flashsale::keys::BucketKeys::new(&status.buckets[0].tag).request(&buyer, "r1");
    let taker = cluster.master_of_slot(status.buckets[0].slot);
    let _: i64 = cluster.node(taker).cmd(&["DEL", &taker_rec]);
    match engine.purchase(req()).await {
        Ok(c) => {
            assert_eq!(c.order_id, first.order_id);
            assert!(c.replayed);
        }
        other => panic!("order {} stands; its replay got {other:?}", first.order_id),
    }
}
