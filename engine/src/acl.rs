//! The least privileges flashsale needs on Redis, written down as ACL rules
//! an operator gives to the users in `cluster_nodes` and `lock_nodes`
//! (`ACL SETUSER <user> on ><password> <rule>`). Why in the code, not only
//! in the docs: `tests/tests/acl.rs` runs the engine, the order writer, the
//! sweepers, reconcile and the locks under exactly these rules, so a
//! command added without its permission fails a test (Redis 7 checks every
//! command a script calls against the caller's ACL too).

/// The inventory cluster's user: keys and channels of the `{tag}` hash tags
/// only (every inventory key starts with `{`), the commands of the engine,
/// of its scripts, of the order writer and of reconcile, and the cluster's
/// own introspection. No `KEYS`, `FLUSH*`, `CONFIG`, `DEBUG`, or any
/// command on keys outside `{...}`.
pub const INVENTORY_RULE: &str = "resetkeys ~{* resetchannels &fs:room:* -@all \
     +evalsha +script|load +script|exists +ping +wait +asking \
     +cluster|slots +cluster|shards +cluster|nodes +cluster|myid +client|setname +hello \
     +get +set +del +exists +incr +incrby +decrby +pttl +pexpire +pexpireat +time \
     +hget +hmget +hset +hsetnx +hdel +hincrby +hgetall +sadd +smembers +sismember \
     +zadd +zrem +zscore +zrange +zrangebyscore +zcard +zcount +publish \
     +xadd +xlen +xrange +xdel +xtrim +xreadgroup +xack +xautoclaim +xpending \
     +xgroup|create +xgroup|delconsumer +xinfo|groups +xinfo|stream +xinfo|consumers";

/// The lock nodes' user: the locks' keys (every one starts `flashsale:`:
/// locks, fences, waiters, queues, semaphores, latches), the release
/// channel its waiters subscribe to, and the lock scripts' commands.
pub const LOCK_RULE: &str = "resetkeys ~flashsale:* resetchannels &flashsale:lock:* -@all \
     +evalsha +script|load +script|exists +ping +hello +client|setname \
     +subscribe +unsubscribe +publish \
     +get +set +del +exists +incr +incrby +pttl +pexpire +pexpireat +pexpiretime +time \
     +hget +hset +hdel +hgetall +sadd +scard +smembers \
     +zadd +zrem +zrange +zrangebyscore +zremrangebyscore +zcard";
