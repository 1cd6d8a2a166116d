//! The child processes of a chaos run: an engine process answers the
//! controller's calls (one JSON line each way), and a writer process runs
//! the order writer. They are processes, not tasks, so the nemesis can
//! kill -9 them or freeze them with SIGSTOP, as a real crash or pause would.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use flashsale::lock::LockOptions;
use flashsale::{AdminError, PurchaseError, PurchaseRequest};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use super::protocol::{Call, OkValue, Op, Outcome, Reply};

/// Fixed lease of the locks the workload takes; the lock-pause fault
/// freezes a holder for longer than this.
pub const LOCK_LEASE: Duration = Duration::from_millis(1000);

/// Compare-and-set on the fenced resource: a write is accepted only with a
/// token larger than every token accepted before, or the same token from
/// the same holder (its own second write).
const FENCED_WRITE: &str = r"
local cur = tonumber(redis.call('HGET', KEYS[1], 'token') or '0')
local tok = tonumber(ARGV[1])
if tok < cur then return 0 end
if tok == cur and redis.call('HGET', KEYS[1], 'owner') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'owner', ARGV[2])
return 1";

/// Runs an engine process until stdin closes.
pub async fn run_engine(config: flashsale::Config, resource_url: String) -> anyhow::Result<()> {
    let engine = flashsale::Engine::connect(config)
        .await
        .map_err(|e| anyhow::anyhow!("engine: {e}"))?;
    let resource = redis::Client::open(resource_url)?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| anyhow::anyhow!("fenced resource: {e}"))?;
    // Every engine process sweeps due holds, as every `flashsale serve`
    // does: several sweepers at once, and the nemesis kills them mid-batch.
    let _sweeper = engine.spawn_hold_sweeper();
    let (tx, mut rx) = mpsc::unbounded_channel::<Reply>();
    let out = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(reply) = rx.recv().await {
            let Ok(mut line) = serde_json::to_vec(&reply) else {
                continue;
            };
            line.push(b'\n');
            if stdout.write_all(&line).await.is_err() || stdout.flush().await.is_err() {
                return;
            }
        }
    });
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let script = Arc::new(redis::Script::new(FENCED_WRITE));
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(call) = serde_json::from_str::<Call>(&line) else {
            continue;
        };
        let (engine, tx, resource, script) =
            (engine.clone(), tx.clone(), resource.clone(), script.clone());
        tokio::spawn(async move {
            let outcome = perform(&engine, resource, &script, &call.op).await;
            let _ = tx.send(Reply {
                id: call.id,
                outcome,
            });
        });
    }
    drop(tx);
    let _ = out.await;
    Ok(())
}

async fn perform(
    engine: &flashsale::Engine,
    resource: redis::aio::MultiplexedConnection,
    fenced_write: &redis::Script,
    op: &Op,
) -> Outcome {
    match op {
        Op::Purchase {
            sku,
            user,
            rid,
            qty,
        } => {
            let flagged = || engine.stats().sold_out_local.load(Ordering::SeqCst);
            let before = flagged();
            let r = engine
                .purchase(PurchaseRequest {
                    sku,
                    user,
                    qty: i64::from(*qty),
                    request_id: rid,
                })
                .await;
            // No answer of this process came from the sold-out flag while
            // this one was in flight: this one did not either.
            let from_scripts = flagged() == before;
            match purchase_outcome(r) {
                Outcome::Fail { code, .. } => Outcome::Fail { code, from_scripts },
                other => other,
            }
        }
        Op::Restock { sku, qty, op_id } => admin_outcome(
            engine
                .restock_op(sku, *qty, op_id)
                .await
                .map(|_| OkValue::Done),
        ),
        Op::Close { sku } => admin_outcome(engine.close_sale(sku).await.map(|_| OkValue::Done)),
        Op::Status { sku } => {
            admin_outcome(engine.sale_status(sku).await.map(|s| OkValue::Status {
                remaining: s.buckets.iter().map(|b| b.remaining).sum(),
            }))
        }
        Op::Pay {
            order_id,
            payment_ref,
        } => transition_outcome(engine.pay(order_id, payment_ref).await),
        Op::Cancel { order_id } => transition_outcome(engine.cancel(order_id).await),
        Op::Lock {
            name,
            owner,
            hold_ms,
        } => lock(engine, resource, fenced_write, name, owner, *hold_ms).await,
    }
}

/// A purchase's answer as the history records it.
pub fn purchase_outcome(r: Result<flashsale::Confirmed, PurchaseError>) -> Outcome {
    match r {
        Ok(c) => Outcome::Ok {
            value: OkValue::Order {
                order_id: c.order_id,
                bucket: c.bucket,
            },
        },
        Err(PurchaseError::Unavailable(why)) => Outcome::unknown(why.to_string()),
        Err(e) => Outcome::fail(e.code()),
    }
}

/// A payment's or a cancel's answer as the history records it.
fn transition_outcome(r: Result<flashsale::Transition, flashsale::HoldError>) -> Outcome {
    match r {
        Ok(t) => Outcome::Ok {
            value: OkValue::Transition {
                state: t.state.as_str().to_owned(),
                retaken: t.retaken,
            },
        },
        Err(flashsale::HoldError::Unavailable(why)) => Outcome::unknown(why.to_string()),
        Err(e) => Outcome::fail(e.code()),
    }
}

fn admin_outcome(r: Result<OkValue, AdminError>) -> Outcome {
    match r {
        Ok(value) => Outcome::Ok { value },
        Err(AdminError::Unavailable(why)) => Outcome::unknown(why.to_string()),
        Err(AdminError::Lock(why)) => Outcome::unknown(why.to_string()),
        Err(e) => Outcome::fail(admin_code(&e)),
    }
}

fn admin_code(e: &AdminError) -> &'static str {
    match e {
        AdminError::Invalid(_) => "invalid",
        AdminError::AlreadyExists(_) => "already_exists",
        AdminError::UnknownSale(_) => "unknown_sale",
        AdminError::Closed(_) => "closed",
        AdminError::OperationMismatch(_) => "operation_mismatch",
        _ => "other",
    }
}

async fn lock(
    engine: &flashsale::Engine,
    mut resource: redis::aio::MultiplexedConnection,
    fenced_write: &redis::Script,
    name: &str,
    owner: &str,
    hold_ms: u64,
) -> Outcome {
    let Some(locks) = engine.locks() else {
        return Outcome::fail("no_lock_nodes");
    };
    let opts = LockOptions::new(owner)
        .lease(LOCK_LEASE)
        .wait(Duration::from_secs(3));
    let asked_unix_ms = unix_ms();
    let guard = match locks.lock(name, &opts).await {
        Ok(g) => g,
        Err(flashsale::lock::LockError::Timeout { .. }) => return Outcome::fail("lock_timeout"),
        Err(e) => return Outcome::unknown(e.to_string()),
    };
    let granted_unix_ms = unix_ms();
    // Read after the grant's time: the end it gives is at or before the
    // lease's real end, so the checker's window is never too wide.
    let valid_until_unix_ms =
        granted_unix_ms + i64::try_from(guard.valid_for().as_millis()).unwrap_or(0);
    let token = guard.fencing_token();
    let key = format!("fenced:{name}");
    let mut refused = 0u32;
    let mut last_write_refused = false;
    for i in 0..2 {
        if i == 1 {
            tokio::time::sleep(Duration::from_millis(hold_ms)).await;
        }
        let accepted: Result<i64, _> = fenced_write
            .key(&key)
            .arg(token)
            .arg(owner)
            .invoke_async(&mut resource)
            .await;
        match accepted {
            Ok(1) => {}
            Ok(_) => {
                refused += 1;
                last_write_refused = i == 1;
            }
            Err(e) => return Outcome::unknown(format!("fenced resource: {e}")),
        }
    }
    let released_unix_ms = unix_ms();
    let _ = guard.unlock().await;
    Outcome::Ok {
        value: OkValue::Lock {
            token,
            refused_writes: refused,
            last_write_refused,
            asked_unix_ms,
            granted_unix_ms,
            released_unix_ms,
            valid_until_unix_ms,
        },
    }
}

/// The wall clock in ms since the Unix epoch.
fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Runs an order writer process until it is killed or stdin closes.
pub async fn run_writer(config: flashsale::Config) -> anyhow::Result<()> {
    let engine = flashsale::Engine::connect(config.clone())
        .await
        .map_err(|e| anyhow::anyhow!("engine: {e}"))?;
    let pool = flashsale::db::pool(&config.postgres_url, 4)?;
    let writer = engine
        .spawn_order_writer(pool, writer_config())
        .await
        .map_err(|e| anyhow::anyhow!("writer: {e}"))?;
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(_)) = lines.next_line().await {}
    writer.abort();
    Ok(())
}

/// The writer's settings in a chaos run: one consumer name for every
/// restart (a restarted writer re-reads its own pending entries), short
/// waits, and a sweeper that settles abandoned fall-throughs within the run.
pub fn writer_config() -> flashsale::WriterConfig {
    flashsale::WriterConfig {
        consumer: "chaos-writer".into(),
        batch: 100,
        idle_wait: Duration::from_millis(20),
        claim_idle: Duration::from_secs(2),
        discover_every: Duration::from_millis(300),
        sweep_every: Duration::from_millis(500),
        ..flashsale::WriterConfig::default()
    }
}
