//! In-process rate limiting at the door: a token bucket per user and one for
//! the whole service, checked before a request reaches Redis. Chosen over a
//! Redis rate-limit script (`lua/rate_limit.lua`, kept for the benchmark's
//! comparison) because it costs no network trip and never loads the
//! inventory cluster; the trade-off is that limits are per process (N
//! processes allow N times the rate). Never does I/O.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;
use std::time::Instant;

/// One token bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn full(burst: f64, now: Instant) -> Self {
        Bucket {
            tokens: burst,
            last: now,
        }
    }

    /// Refills at `rate` per second up to `burst`, then takes one token.
    fn take(&mut self, rate: f64, burst: f64, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

const SHARDS: usize = 32;
/// Most per-user entries in one shard. With callers that validate user ids
/// first (at most 128 bytes), the limiter holds at most SHARDS x this many
/// entries, a few tens of MB, whatever the input.
const SHARD_CAP: usize = 2048;

/// Per-user and global limits; 0 rps disables a limit.
pub struct RateLimiter {
    user_rate: f64,
    user_burst: f64,
    global_rate: f64,
    global_burst: f64,
    global: Mutex<Bucket>,
    users: Vec<Mutex<HashMap<String, Bucket>>>,
    hasher: RandomState,
}

impl RateLimiter {
    /// Limits of `per_user_rps` (burst `per_user_burst`) and `global_rps`.
    pub fn new(per_user_rps: f64, per_user_burst: u32, global_rps: f64, global_burst: u32) -> Self {
        let now = Instant::now();
        RateLimiter {
            user_rate: per_user_rps,
            user_burst: f64::from(per_user_burst),
            global_rate: global_rps,
            global_burst: f64::from(global_burst),
            global: Mutex::new(Bucket::full(f64::from(global_burst), now)),
            users: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
        }
    }

    /// True when `user` may make one more request now.
    pub fn allow(&self, user: &str) -> bool {
        let now = Instant::now();
        if self.user_rate > 0.0 {
            let shard = &self.users[(self.hasher.hash_one(user) as usize) % SHARDS];
            let mut map = shard.lock().unwrap_or_else(|p| p.into_inner());
            if map.len() >= SHARD_CAP && !map.contains_key(user) {
                // Entries full again are indistinguishable from new ones.
                let (rate, burst) = (self.user_rate, self.user_burst);
                map.retain(|_, b| {
                    now.saturating_duration_since(b.last).as_secs_f64() * rate < burst
                });
                // Still full (a flood of distinct users): forget one, which
                // at worst gives that user a fresh burst. The bound on
                // memory wins over exactness.
                if map.len() >= SHARD_CAP {
                    if let Some(k) = map.keys().next().cloned() {
                        map.remove(&k);
                    }
                }
            }
            let (rate, burst) = (self.user_rate, self.user_burst);
            let bucket = map
                .entry(user.to_owned())
                .or_insert_with(|| Bucket::full(burst, now));
            if !bucket.take(rate, burst, now) {
                return false;
            }
        }
        if self.global_rate > 0.0 {
            let mut g = self.global.lock().unwrap_or_else(|p| p.into_inner());
            if !g.take(self.global_rate, self.global_burst, now) {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_gets_the_burst_then_is_limited_and_others_are_not() {
        let l = RateLimiter::new(1.0, 3, 0.0, 0);
        assert!((0..3).all(|_| l.allow("alice")));
        assert!(!l.allow("alice"));
        assert!(l.allow("bob"));
    }

    #[test]
    fn memory_stays_bounded_under_a_flood_of_distinct_users() {
        let l = RateLimiter::new(0.001, 1, 0.0, 0);
        for i in 0..80_000 {
            l.allow(&format!("user-{i}"));
        }
        let held: usize = l
            .users
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum();
        assert!(held <= SHARDS * SHARD_CAP, "{held} entries");
    }

    #[test]
    fn the_global_bucket_limits_everyone() {
        let l = RateLimiter::new(0.0, 0, 1.0, 2);
        assert!(l.allow("a") && l.allow("b"));
        assert!(!l.allow("c"));
    }
}
