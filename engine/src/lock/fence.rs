//! Fencing tokens, and why they only grow.
//!
//! On one node the acquire script settles the token in the same step as the
//! SET NX: `max(counter + 1, unix_ms * 1000)`, stored as the new counter.
//!
//! On N nodes the token is fixed in the acquire round too, when nothing is
//! contended. The client proposes `P` (the clock in µs); every node that
//! grants raises its counter to `P` in the same atomic step as its SET NX,
//! when the counter is below `P`, and reports the counter it had. If every
//! node granted and had a counter below `P`, the token is `P`, with no
//! second round. Otherwise a second round raises every node it reaches (at
//! least a majority) to `max(highest counter seen + 1, unix_ms * 1000)`
//! (`lock_fence.lua`, never lowering). Keeping `P` when only a majority
//! granted would leave it on that majority alone: one of them restarting
//! empty, and a later grant on the restarted node and a node that was busy
//! during the first, with a clock behind, would go below it (found by the
//! attack: `a_token_kept_in_one_round_is_not_lost_to_a_node_restarting_empty`).
//!
//! Why the next grant's token is larger. Let G be a grant with token `t`:
//! a majority M of the nodes holds a counter >= `t` before G is handed out
//! (in one round: every node raised it with its SET NX; in two: the second
//! round's majority, every node it reached). Counters never go down. A later grant G' wins
//! its own majority M', and M' shares a node `n` with M. In one round, G'
//! keeps `P'` only if `n`'s counter was below `P'` when G' took the key
//! there, which is after G raised it (G held the key on `n` until it
//! released or its lease ended there): so `t <= counter < P'`. In two
//! rounds, G' reads `n`'s counter (>= `t`) and goes above it. Either way
//! `t' > t` — even when a minority of nodes is down or came back empty.
//! The clock term keeps tokens growing even past the loss of more state than
//! that (every node restarted empty), as long as the granting clocks do not
//! step back; it costs nothing, since tokens are 64-bit.
//!
//! Hand-offs inside one process (lock cohorting). A grant may reserve `R`
//! tokens above its own `t`: every counter the argument above raises to `t`
//! is raised to `t + R` instead (the acquire script's ARGV\[5\], or the second
//! round's value), and tasks of the granted process that take the lock over
//! from each other, without a trip to the nodes, get `t + 1`, `t + 2`, ...
//! up to `t + R`, in the order they hold it. They hold it one after another
//! under the same keys, so they are ordered among themselves, and the
//! argument above, read with `t + R` in place of `t`, puts every later grant
//! G' above all of them. The price: `R` tokens spent per grant, which the
//! µs clock term wipes out anyway.

use std::time::Duration;

/// The token for a new grant, given the highest counter seen and the time
/// since the Unix epoch.
pub fn next_token(highest_seen: u64, since_epoch: Duration) -> u64 {
    let clock = (since_epoch.as_millis() as u64).saturating_mul(1000);
    highest_seen.saturating_add(1).max(clock)
}

/// The token a grant on several nodes proposes in its acquire round: the
/// clock in µs (never 0). Two grants of the same µs cannot both keep it:
/// the second finds the first's counter at it and takes the second round.
pub fn proposal(since_epoch: Duration) -> u64 {
    (since_epoch.as_micros() as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_pass_both_the_counter_and_the_clock() {
        let t = Duration::from_millis(1_700_000_000_000);
        assert_eq!(next_token(0, t), 1_700_000_000_000_000);
        assert_eq!(next_token(1_700_000_000_000_005, t), 1_700_000_000_000_006);
        // A node that lost its counter (0) cannot pull the token back while
        // another node of the majority remembers it.
        assert!(next_token(5_000_000_000_000_000, t) > 5_000_000_000_000_000);
    }

    /// Grants over `n` nodes with the clock frozen at 0, each reading the
    /// counters of a random set of `read` nodes and raising a random set of
    /// `write` nodes to its token, as `LockClient` does; returns the tokens.
    fn grants(n: usize, read: usize, write: usize, seed: u64) -> Vec<u64> {
        use rand::seq::index::sample;
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut counters = vec![0u64; n];
        (0..300)
            .map(|_| {
                let seen = sample(&mut rng, n, read)
                    .iter()
                    .map(|i| counters[i])
                    .max()
                    .unwrap_or(0);
                let token = next_token(seen, Duration::ZERO);
                for i in sample(&mut rng, n, write).iter() {
                    counters[i] = counters[i].max(token);
                }
                token
            })
            .collect()
    }

    #[test]
    fn a_later_grant_outranks_every_earlier_one_across_majorities() {
        for seed in 0..50 {
            for (n, q) in [(1, 1), (3, 2), (5, 3), (7, 4)] {
                let tokens = grants(n, q, q, seed);
                assert!(
                    tokens.windows(2).all(|w| w[0] < w[1]),
                    "n={n} seed={seed}: {tokens:?}"
                );
            }
        }
    }

    #[test]
    fn without_majorities_the_property_fails_so_the_test_above_can() {
        // Reading and writing a minority each (1 of 3): two sets can miss
        // each other, and with the clock frozen a token repeats.
        let broke = (0..50).any(|seed| grants(3, 1, 1, seed).windows(2).any(|w| w[0] >= w[1]));
        assert!(broke);
    }
}
