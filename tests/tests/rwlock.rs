//! Read-write locks (`LockClient::read_lock` / `write_lock`) on real,
//! independent redis-server lock nodes: readers overlap, a writer overlaps
//! nobody, a waiting writer gets in under a stream of readers, reentrancy
//! per owner, no upgrade (a typed error) but a downgrade, holds that end
//! with their lease, and `lock exec --read / --write`.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flashsale::lock::{LockClient, LockConfig, LockError, LockOptions};
use flashsale_tests::{flashsale_cmd, RedisServer};

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
            watchdog_ttl: Duration::from_secs(3),
            ..LockConfig::default()
        },
    )
    .expect("lock client")
}

/// Who is inside, as the holders themselves count it.
#[derive(Default)]
struct Inside {
    readers: AtomicI64,
    writers: AtomicI64,
    most_readers: AtomicI64,
    violations: AtomicI64,
}

impl Inside {
    fn enter_read(&self) {
        let r = self.readers.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_readers.fetch_max(r, Ordering::SeqCst);
        if self.writers.load(Ordering::SeqCst) != 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn leave_read(&self) {
        self.readers.fetch_sub(1, Ordering::SeqCst);
    }
    fn enter_write(&self) {
        let w = self.writers.fetch_add(1, Ordering::SeqCst) + 1;
        if w != 1 || self.readers.load(Ordering::SeqCst) != 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn leave_write(&self) {
        self.writers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Six clients (as six processes would be) on 3 nodes take the lock 25
/// times each, one in four a write: readers are seen together, a writer
/// never with anyone, and write tokens only grow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_overlap_and_a_writer_never_overlaps_anyone() {
    let nodes = servers(3);
    let inside = Arc::new(Inside::default());
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for t in 0..6 {
        let (c, inside, tokens) = (client(&nodes), inside.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..25 {
                let opts = LockOptions::new(format!("o{t}")).wait(Duration::from_secs(60));
                if (i + t) % 4 == 0 {
                    let g = c.write_lock("doc", &opts).await.expect("write");
                    inside.enter_write();
                    tokens.lock().expect("tokens").push(g.fencing_token());
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    inside.leave_write();
                    assert!(g.unlock().await, "the writer still held it");
                } else {
                    let g = c.read_lock("doc", &opts).await.expect("read");
                    inside.enter_read();
                    tokio::time::sleep(Duration::from_millis(15)).await;
                    inside.leave_read();
                    assert!(g.unlock().await, "the reader still held it");
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(inside.violations.load(Ordering::SeqCst), 0);
    assert!(
        inside.most_readers.load(Ordering::SeqCst) >= 2,
        "readers never overlapped"
    );
    let tokens = tokens.lock().expect("tokens");
    let mut sorted = tokens.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), tokens.len(), "write tokens are never reused");
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "write tokens grow in grant order: {tokens:?}"
    );
}

/// Four readers keep the lock read-held without a gap (each re-takes it
/// while the others still read). A writer then asks: it queues, which keeps
/// new readers out, the old ones finish, and it gets in with nobody else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_gets_in_under_a_stream_of_readers() {
    let nodes = servers(3);
    let inside = Arc::new(Inside::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for r in 0..4 {
        let (c, inside, stop) = (client(&nodes), inside.clone(), stop.clone());
        readers.push(tokio::spawn(async move {
            let mut reads = 0;
            // Bounded: a writer that never gets in fails the test, it does
            // not hang it.
            while !stop.load(Ordering::SeqCst) && reads < 2000 {
                let opts = LockOptions::new(format!("r{r}")).wait(Duration::from_secs(60));
                let g = c.read_lock("feed", &opts).await.expect("read");
                inside.enter_read();
                tokio::time::sleep(Duration::from_millis(20 + 10 * r)).await;
                inside.leave_read();
                g.unlock().await;
                reads += 1;
            }
            reads
        }));
    }
    let c = client(&nodes);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        inside.readers.load(Ordering::SeqCst) > 0,
        "the readers are reading"
    );
    let writer = c
        .write_lock(
            "feed",
            &LockOptions::new("writer").wait(Duration::from_secs(30)),
        )
        .await
        .expect("the writer gets in under the readers");
    inside.enter_write();
    tokio::time::sleep(Duration::from_millis(100)).await;
    inside.leave_write();
    assert!(writer.unlock().await);
    stop.store(true, Ordering::SeqCst);
    let mut total = 0;
    for r in readers {
        total += r.await.expect("reader");
    }
    assert_eq!(inside.violations.load(Ordering::SeqCst), 0);
    assert!(total > 8, "the readers kept reading ({total} reads)");
}

/// Reentrancy per owner on both sides; a reader asking for the write side
/// gets `Upgrade` (it would wait for itself); a writer may take the read
/// side and then let go of writing (a downgrade).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_upgrade_from_read_but_a_writer_may_downgrade_and_both_sides_reenter() {
    let nodes = servers(1);
    let (a, b) = (client(&nodes), client(&nodes));
    let (oa, ob) = (LockOptions::new("a"), LockOptions::new("b"));

    let r1 = a.read_lock("x", &oa).await.expect("read");
    let r2 = a.read_lock("x", &oa).await.expect("read again (reentrant)");
    match a.write_lock("x", &oa).await {
        Err(LockError::Upgrade { name, owner }) => {
            assert_eq!((name.as_str(), owner.as_str()), ("x", "a"))
        }
        Err(e) => panic!("an upgrade is refused as such, not {e}"),
        Ok(_) => panic!("a reader upgraded to writer"),
    }
    let shared = b.try_read_lock("x", &ob).await.expect("try");
    assert!(
        shared.expect("another reader shares it").unlock().await,
        "the other reader still held it"
    );
    assert!(r1.unlock().await);
    assert!(
        b.try_write_lock("x", &ob).await.expect("try").is_none(),
        "one of a's two reads still holds it"
    );
    assert!(r2.unlock().await);
    let w = b
        .write_lock("x", &ob.clone().wait(Duration::from_secs(10)))
        .await
        .expect("free for a writer once a stops reading");
    let w2 = b
        .write_lock("x", &ob)
        .await
        .expect("write again (reentrant)");
    assert!(
        a.try_read_lock("x", &oa).await.expect("try").is_none(),
        "no reader past a writer"
    );
    assert!(w2.unlock().await);
    assert!(
        a.try_read_lock("x", &oa).await.expect("try").is_none(),
        "still written"
    );

    // Downgrade: b reads while writing, then stops writing and still reads.
    let down = b
        .read_lock("x", &ob)
        .await
        .expect("a writer takes the read side");
    assert!(w.unlock().await);
    let other = a.try_read_lock("x", &oa).await.expect("try");
    assert!(other.is_some(), "after the downgrade, others read too");
    assert!(
        a.try_write_lock("x", &LockOptions::new("c"))
            .await
            .expect("try")
            .is_none(),
        "b still reads"
    );
    assert!(down.unlock().await);
    if let Some(o) = other {
        assert!(o.unlock().await);
    }
    assert!(a
        .try_write_lock("x", &LockOptions::new("c"))
        .await
        .expect("try")
        .is_some());
}

/// A reader whose fixed lease runs out stops holding: a writer then gets
/// in, and the late reader's release says it no longer held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readers_hold_ends_with_its_lease_and_its_late_release_says_so() {
    let nodes = servers(3);
    let (a, b) = (client(&nodes), client(&nodes));
    let reader = a
        .read_lock(
            "lease",
            &LockOptions::new("a").lease(Duration::from_millis(400)),
        )
        .await
        .expect("read");
    assert!(b
        .try_write_lock("lease", &LockOptions::new("b"))
        .await
        .expect("try")
        .is_none());
    reader.lost().await;
    let w = b
        .write_lock(
            "lease",
            &LockOptions::new("b").wait(Duration::from_secs(20)),
        )
        .await
        .expect("the writer gets in once the reader's lease ended");
    assert!(
        !reader.unlock().await,
        "an ended hold is not reported released"
    );
    assert!(w.unlock().await);
}

/// `lock exec --read` runs beside another reader, `--write` waits for it
/// (and gives up with exit 75), `--fair` runs on a free lock, and `--read`
/// with `--write` is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_exec_takes_either_side_of_a_read_write_lock() {
    let nodes = servers(1);
    let c = client(&nodes);
    let reader = c
        .read_lock("cli", &LockOptions::new("in-test"))
        .await
        .expect("read");
    let run = |args: &[&str]| {
        flashsale_cmd(None, None, &urls(&nodes))
            .args(["lock", "exec", "--name", "cli", "--wait", "1s"])
            .args(args)
            .args(["--", "true"])
            .output()
            .expect("run lock exec")
    };
    let read = run(&["--read"]);
    assert!(read.status.success(), "{read:?}");
    let write = run(&["--write"]);
    assert_eq!(write.status.code(), Some(75), "{write:?}");
    let fair = run(&["--fair"]);
    assert!(fair.status.success(), "{fair:?}");
    let both = run(&["--read", "--write"]);
    assert_eq!(both.status.code(), Some(2), "{both:?}");
    assert!(reader.unlock().await);
    let write = run(&["--write"]);
    assert!(write.status.success(), "{write:?}");
}

/// Found by the attack: a reader kept out only by a waiting writer slept
/// until the holding reader's lease ended (the script answered with that
/// lease), so when the writer gave up or died the new reader waited up to a
/// whole watchdog lease for nothing. Now it looks again within a third of
/// the queue lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_kept_out_by_a_writer_that_gave_up_does_not_wait_out_the_other_readers() {
    let nodes = servers(1);
    let long = LockClient::new(
        &urls(&nodes),
        LockConfig {
            watchdog_ttl: Duration::from_secs(30),
            ..LockConfig::default()
        },
    )
    .expect("lock client");
    let reading = long
        .read_lock("gone", &LockOptions::new("r1"))
        .await
        .expect("the first reader");
    let w = client(&nodes);
    let writer = tokio::spawn(async move {
        w.write_lock(
            "gone",
            &LockOptions::new("w").wait(Duration::from_millis(1500)),
        )
        .await
        .map(|_| ())
    });
    flashsale_tests::wait_for(
        Duration::from_secs(20),
        || nodes[0].node.cmd::<i64>(&["ZCARD", "flashsale:rwq:gone"]) == 1,
        || "the writer never queued".into(),
    );
    // Before the fix it slept for its whole wait (the first reader's lease,
    // renewed, was longer), looking again only at the end.
    let asked = std::time::Instant::now();
    let second = client(&nodes)
        .read_lock(
            "gone",
            &LockOptions::new("r2").wait(Duration::from_secs(30)),
        )
        .await;
    let waited = asked.elapsed();
    assert!(
        matches!(writer.await.expect("task"), Err(LockError::Timeout { .. })),
        "the writer gave up"
    );
    let second = second.expect("the second reader gets in once the writer is gone");
    assert!(
        waited < Duration::from_secs(12),
        "the second reader got in {waited:?} after asking: it waited for the first reader's lease"
    );
    assert!(second.unlock().await);
    assert!(reading.unlock().await);
}
