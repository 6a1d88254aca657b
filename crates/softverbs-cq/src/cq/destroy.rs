//! Destruction (`ibv_destroy_cq(3)`) and dropping a CQ without destroying it.
//!
//! Guarantees: destroy refuses (changing nothing) while a queue pair uses the CQ or an event
//! it delivered is unacknowledged, optionally waiting for the acknowledgements as
//! libibverbs does; on success, and when a CQ handle is dropped undestroyed, producers are
//! stopped and the CQ's events still queued unread on its channel are withdrawn. The
//! channel's queue lock orders this against event delivery (`notify.rs`): an event is
//! either queued before, and withdrawn here, or sees the destroyed state and is dropped.

use super::notify::ARM_NONE;
use super::{CqShared, STATE_DESTROYED};
use crate::error::DestroyError;
use crate::sync::{Arc, Condvar, MutexGuard, Ordering};
use std::time::Duration;

impl CqShared {
    /// Destroys if nothing holds the CQ; with `wait`, waits up to that long for delivered
    /// events to be acknowledged.
    pub(super) fn destroy_check(
        this: &Arc<Self>,
        wait: Option<Duration>,
    ) -> Result<(), DestroyError> {
        let deadline = wait.map(|w| std::time::Instant::now() + w);
        loop {
            match Self::destroy_now(this) {
                Err(DestroyError::UnacknowledgedEvents(n)) => {
                    let now = std::time::Instant::now();
                    match deadline {
                        Some(deadline) if now < deadline => {
                            // Wait for an ack with no other lock held, then look again.
                            let mut ev = this.events.counts();
                            ev.waiters += 1;
                            let step = (deadline - now).min(Duration::from_millis(10));
                            let mut ev = wait_timeout(this.events.acked_cv(), ev, step);
                            ev.waiters -= 1;
                        }
                        _ => return Err(DestroyError::UnacknowledgedEvents(n)),
                    }
                }
                other => return other,
            }
        }
    }

    /// Refuses while a QP uses the CQ.
    pub(super) fn check_unused(this: &Arc<Self>) -> Result<(), DestroyError> {
        match this.attached_qps.load(Ordering::Acquire) {
            0 => Ok(()),
            qps => Err(DestroyError::QueuePairsAttached(qps)),
        }
    }

    fn destroy_now(this: &Arc<Self>) -> Result<(), DestroyError> {
        Self::check_unused(this)?;
        // The channel's queue lock orders destroy against delivery: an event is either
        // queued before (and purged here) or sees the destroyed state and is dropped.
        let queue_guard = this.events.channel().map(|ch| ch.lock_queue());
        let queued = queue_guard.as_ref().map_or(0, |q| {
            q.iter().filter(|e| e.id() == this.id()).count() as u64
        });
        let mut ev = this.events.counts();
        let outstanding = ev.raised - queued - ev.acked;
        if outstanding > 0 {
            return Err(DestroyError::UnacknowledgedEvents(outstanding));
        }
        this.state.store(STATE_DESTROYED, Ordering::Release);
        this.notify.store(ARM_NONE, Ordering::Release);
        if let Some(mut q) = queue_guard {
            let before = q.len();
            q.retain(|e| e.id() != this.id());
            let purged = before - q.len();
            ev.raised -= purged as u64;
            if let Some(ch) = this.events.channel() {
                ch.note_purged(&mut q, purged);
            }
        }
        // With the queue lock released (a push takes it inside the producer lock).
        this.stop_producers();
        Ok(())
    }
}

/// What dropping a consumer handle does: unless the CQ was destroyed, withdraws its queued
/// events and stops producers.
pub(super) fn mark_dropped(shared: &Arc<CqShared>) {
    if !shared.is_destroyed() {
        // Dropped without destroy: withdraw queued events and stop producers. Events the
        // application holds keep the shared state alive, so nothing dangles.
        let queue = shared.events.channel().map(|ch| ch.lock_queue());
        shared.state.store(STATE_DESTROYED, Ordering::Release);
        if let Some(mut q) = queue {
            let before = q.len();
            q.retain(|e| e.id() != shared.id());
            let purged = before - q.len();
            if let Some(ch) = shared.events.channel() {
                ch.note_purged(&mut q, purged);
            }
            drop(q);
            if purged > 0 {
                shared.events.note_purged(purged as u64);
            }
        }
        // With the queue lock released (a push takes it inside the producer lock).
        shared.stop_producers();
    }
}

#[cfg(not(loom))]
fn wait_timeout<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    step: Duration,
) -> MutexGuard<'a, T> {
    match cv.wait_timeout(guard, step) {
        Ok((g, _)) => g,
        Err(e) => e.into_inner().0,
    }
}

#[cfg(loom)]
fn wait_timeout<'a, T>(
    _cv: &Condvar,
    guard: MutexGuard<'a, T>,
    _step: Duration,
) -> MutexGuard<'a, T> {
    drop(guard);
    loom::thread::yield_now();
    unreachable!("loom models never wait for acknowledgements")
}
