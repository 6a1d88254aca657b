//! Statistics: [`CqStats`], the counters and levels of one CQ.
//!
//! Guarantees: the figures are read without stopping producers or consumers, so they are
//! a consistent snapshot only of the event counts (read under their lock); depth and
//! produced/polled come from one `Acquire` read each of tail and head, and everything a
//! lapped `IGNORE_OVERRUN` consumer has not skipped yet is already counted as overrun.

use super::{CqShared, STATE_ERROR};
use crate::sync::Ordering;

/// Counters and levels of one CQ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CqStats {
    /// Entries the CQ holds (`cqe`).
    pub capacity: u32,
    /// Completions waiting to be polled now.
    pub depth: u64,
    /// The most completions ever waiting at once.
    pub high_water: u64,
    /// Completions pushed in the CQ's life.
    pub produced: u64,
    /// Completions handed to consumers.
    pub polled: u64,
    /// Completions lost to overrun (`IGNORE_OVERRUN` overwrites, or the one that put the CQ
    /// in error).
    pub overruns: u64,
    /// Pushes refused under [`OverrunPolicy::Backpressure`](super::OverrunPolicy::Backpressure).
    pub refused: u64,
    /// Times a producer took the producer lock to push: each
    /// [`CqProducer::push`](super::CqProducer::push) is one, each
    /// [`CqProducer::burst`](super::CqProducer::burst) one however many it pushes.
    /// `produced / bursts` is the mean burst.
    pub bursts: u64,
    /// Completion events delivered to the channel.
    pub events_raised: u64,
    /// Completion events acknowledged.
    pub events_acked: u64,
    /// Whether the CQ is in the error state.
    pub in_error: bool,
}

impl CqShared {
    pub(super) fn stats(&self) -> CqStats {
        let ev = self.events.counts();
        let tail = self.producer.tail.load(Ordering::Acquire);
        let head = self.consumer.head.load(Ordering::Acquire);
        let capacity = self.ring().capacity();
        // The consumer takes an entry by its slot's sequence word, which the producer
        // publishes before it stores the tail: a snapshot may see the head one push past the
        // tail. The figures are counts of the moment, never an underflow.
        let depth = tail.saturating_sub(head);
        let behind = depth.saturating_sub(capacity);
        CqStats {
            capacity: capacity as u32,
            depth: depth.min(capacity),
            high_water: self.high_water.load(Ordering::Relaxed),
            produced: tail.max(head),
            polled: head.saturating_sub(self.skipped.load(Ordering::Relaxed)),
            overruns: self.overruns.load(Ordering::Relaxed)
                + self.skipped.load(Ordering::Relaxed)
                + behind,
            refused: self.refused.load(Ordering::Relaxed),
            bursts: self.producer.bursts.load(Ordering::Relaxed),
            events_raised: ev.raised,
            events_acked: ev.acked,
            in_error: self.state.load(Ordering::Relaxed) == STATE_ERROR,
        }
    }
}
