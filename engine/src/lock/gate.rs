//! The gate of one lock name inside one process. Tasks that want the same
//! plain lock wait here in arrival order, so only one of them at a time asks
//! the lock nodes (a local hand-off costs no failed attempts on Redis). A
//! holder that releases while others wait here may hand its grant itself to
//! the next one, with no trip to the nodes at all: lock cohorting, bounded
//! in `acquire.rs` so the other processes get their turn.
//!
//! Everything that leaves the gate is a [`Pass`]; whatever way it is dropped
//! (released, handed over, or lost with a waiter that gave up before it
//! looked), it goes on to the next waiter or frees the gate, and a grant it
//! carries that nobody takes is released on the nodes. So a cancelled
//! `lock()` never strands the gate or a grant.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// The waiting line of one lock name in this process. `G` is the grant a
/// pass may carry (the lock client's baton): the gate only moves it on,
/// and a grant nobody takes is dropped, which releases it.
pub(super) struct Gate<G> {
    state: Mutex<Line<G>>,
}

impl<G> Default for Gate<G> {
    fn default() -> Self {
        Gate {
            state: Mutex::new(Line {
                taken: false,
                waiting: VecDeque::new(),
                no_yield_until_ms: 0,
            }),
        }
    }
}

struct Line<G> {
    /// A task holds the pass (it asks the nodes, or holds the lock).
    taken: bool,
    /// Tasks waiting for the pass, first come first served.
    waiting: VecDeque<oneshot::Sender<Pass<G>>>,
    /// Until when (ms since client start) letting clients elsewhere go first
    /// is not worth it: the last time, nobody came (a waiter count left by
    /// a client that died, say), and the lock sat free for the whole pause.
    no_yield_until_ms: u64,
}

/// The right, for one task of this process at a time, to ask the lock
/// nodes for the name or to hold it; perhaps with a grant already held.
pub(super) struct Pass<G> {
    /// `None` once the pass has been moved on by hand (no second hand-on).
    gate: Option<Arc<Gate<G>>>,
    grant: Option<G>,
    /// The holder before released to the nodes while clients elsewhere
    /// waited: let them go first (see `acquire.rs`).
    pub(super) others_first: bool,
}

impl<G> Gate<G> {
    fn line(&self) -> std::sync::MutexGuard<'_, Line<G>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pass if nobody has it now.
    pub(super) fn try_enter(self: &Arc<Self>) -> Option<Pass<G>> {
        let mut line = self.line();
        if line.taken {
            return None;
        }
        line.taken = true;
        Some(self.pass(None))
    }

    /// Waits for the pass, in arrival order. Cancel-safe: a pass sent to a
    /// waiter that is gone goes on to the next one.
    pub(super) async fn enter(self: &Arc<Self>) -> Pass<G> {
        loop {
            let rx = {
                let mut line = self.line();
                if !line.taken {
                    line.taken = true;
                    return self.pass(None);
                }
                let (tx, rx) = oneshot::channel();
                line.waiting.push_back(tx);
                rx
            };
            if let Ok(pass) = rx.await {
                return pass;
            }
            // The sender went without a pass (cannot happen while this Arc
            // lives; if it did, queue again rather than hang).
        }
    }

    /// True when some task still waits for the pass.
    pub(super) fn has_waiting(&self) -> bool {
        let mut line = self.line();
        while line.waiting.front().is_some_and(|tx| tx.is_closed()) {
            line.waiting.pop_front();
        }
        !line.waiting.is_empty()
    }

    /// Tasks waiting for the pass now.
    pub(super) fn queued(&self) -> usize {
        self.line()
            .waiting
            .iter()
            .filter(|tx| !tx.is_closed())
            .count()
    }

    /// Whether to let clients elsewhere go first at `now_ms`.
    pub(super) fn yielding_pays(&self, now_ms: u64) -> bool {
        now_ms >= self.line().no_yield_until_ms
    }

    /// The last pause for clients elsewhere was for nobody: do not pause
    /// again until `until_ms`.
    pub(super) fn yielded_for_nobody(&self, until_ms: u64) {
        self.line().no_yield_until_ms = until_ms;
    }

    /// Gives the pass and `grant` to the first waiter still there; the
    /// grant back when there is none (the pass stays with the caller).
    fn try_hand(self: &Arc<Self>, mut grant: G) -> Result<(), G> {
        loop {
            let Some(next) = self.line().waiting.pop_front() else {
                return Err(grant);
            };
            match next.send(self.pass(Some(grant))) {
                Ok(()) => return Ok(()),
                Err(mut returned) => {
                    returned.gate = None;
                    match returned.grant.take() {
                        Some(g) => grant = g,
                        None => return Ok(()),
                    }
                }
            }
        }
    }

    fn pass(self: &Arc<Self>, grant: Option<G>) -> Pass<G> {
        Pass {
            gate: Some(self.clone()),
            grant,
            others_first: false,
        }
    }

    /// Gives the pass (and `grant`) to the first waiter still there, or
    /// frees the gate; a grant nobody takes is released on the nodes.
    fn hand_on(self: &Arc<Self>, mut grant: Option<G>, others_first: bool) {
        loop {
            let next = {
                let mut line = self.line();
                match line.waiting.pop_front() {
                    Some(tx) => tx,
                    None => {
                        line.taken = false;
                        break;
                    }
                }
            };
            let mut pass = self.pass(grant);
            pass.others_first = others_first;
            match next.send(pass) {
                Ok(()) => return,
                Err(mut returned) => {
                    grant = returned.grant.take();
                    returned.gate = None;
                }
            }
        }
        drop(grant);
    }
}

impl<G> Pass<G> {
    /// The grant handed over with this pass, if any.
    pub(super) fn take_grant(&mut self) -> Option<G> {
        self.grant.take()
    }

    /// Hands `grant` to the next waiting task with the pass; gives it back
    /// (and keeps the pass) when no waiter is left to take it, so the caller
    /// can release it on the nodes itself.
    pub(super) fn hand_over(&mut self, grant: G) -> Result<(), G> {
        let Some(gate) = self.gate.clone() else {
            return Err(grant);
        };
        gate.try_hand(grant)?;
        self.gate = None;
        Ok(())
    }

    /// Gives the pass on after a release to the nodes; `others_waited`
    /// when the nodes said clients elsewhere wait for the lock.
    pub(super) fn release(mut self, others_waited: bool) {
        if let Some(gate) = self.gate.take() {
            gate.hand_on(self.grant.take(), others_waited);
        }
    }

    /// True when some task of this process waits behind this pass.
    pub(super) fn has_waiting(&self) -> bool {
        self.gate.as_ref().is_some_and(|g| g.has_waiting())
    }
}

impl<G> Drop for Pass<G> {
    fn drop(&mut self) {
        if let Some(gate) = self.gate.take() {
            gate.hand_on(self.grant.take(), self.others_first);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_pass_goes_in_arrival_order_and_skips_waiters_that_left() {
        let gate = Arc::new(Gate::<()>::default());
        let first = gate.try_enter().expect("free gate");
        assert!(gate.try_enter().is_none(), "one pass at a time");
        let (g1, g2, g3) = (gate.clone(), gate.clone(), gate.clone());
        let a = tokio::spawn(async move { g1.enter().await });
        tokio::task::yield_now().await;
        while !gate.has_waiting() {
            tokio::task::yield_now().await;
        }
        let b = tokio::spawn(async move { g2.enter().await });
        let c = tokio::spawn(async move { g3.enter().await });
        while gate.line().waiting.len() < 3 {
            tokio::task::yield_now().await;
        }
        b.abort();
        let _ = b.await;
        drop(first);
        let pass_a = a.await.expect("a");
        assert!(!c.is_finished(), "c waits behind a");
        drop(pass_a);
        let pass_c = c.await.expect("c gets the pass b left behind");
        drop(pass_c);
        assert!(gate.try_enter().is_some(), "the gate is free again");
    }
}
