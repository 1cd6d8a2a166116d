//! Fencing tokens, and why they only grow.
//!
//! A grant's token is `max(highest counter seen on the nodes that answered +
//! 1, unix_ms * 1000)`, and before the grant is handed out the counters of a
//! majority are raised to it (`lock_fence.lua`, never lowering). Any two
//! majorities of the same N nodes share a node, so the next grant reads the
//! previous grant's token from that shared node and goes above it — even when
//! a minority of nodes is down or came back empty. The clock term keeps
//! tokens growing even past the loss of more state than that (every node
//! restarted empty), as long as the granting clocks do not step back; it
//! costs nothing, since tokens are 64-bit.

use std::time::Duration;

/// The token for a new grant, given the highest counter seen and the time
/// since the Unix epoch.
pub fn next_token(highest_seen: u64, since_epoch: Duration) -> u64 {
    let clock = (since_epoch.as_millis() as u64).saturating_mul(1000);
    highest_seen.saturating_add(1).max(clock)
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
}
