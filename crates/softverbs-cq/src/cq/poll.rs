//! Batch polling (`ibv_poll_cq(3)`): [`CompletionQueue::poll`] and
//! [`SingleThreadedCq::poll`], and the consumer-side primitives extended polling
//! (`extended_poll.rs`) shares: reading entries at the head and publishing the head.
//!
//! Guarantees: each polled completion is handed out once, whole and in order; an empty CQ
//! costs two loads and no lock; `n` entries are copied out and the head is published once,
//! with `Release`, so the producer reuses a slot only after its entry was copied out. Only
//! one consumer runs the exclusive path at a time (the consumer lock, or `&mut` on the
//! single-threaded CQ).

use super::{CompletionQueue, CqShared, OverrunPolicy, SingleThreadedCq, STATE_ERROR};
use crate::error::PollError;
use crate::ring::{is_lapped, is_ready, Entry, Peek};
use crate::sync::Ordering;
use crate::wc::WorkCompletion;

impl CqShared {
    /// Polls into `out`. The caller is the only consumer at this moment (consumer lock or
    /// `&mut SingleThreadedCq`).
    #[inline(always)]
    pub(super) fn poll_exclusive(&self, out: &mut [WorkCompletion]) -> Result<usize, PollError> {
        if self.state.load(Ordering::Relaxed) == STATE_ERROR {
            return Err(PollError::Overrun);
        }
        let ring = self.ring().view();
        let start = self.consumer.head.load(Ordering::Relaxed);
        let mut head = start;
        let mut n = 0;
        if self.policy != OverrunPolicy::Overwrite {
            // The producer never writes a slot whose entry is still unconsumed (the ring
            // full, it refuses or errors: `overrun.rs`), so a slot not ready for `head` holds
            // an older position and the batch ends there; nothing is lapped or lost. Per
            // entry: one load and one comparison to find it complete, then six word loads
            // and stores to copy it out (`ibv_wc` has no timestamp or extra fields to read).
            while n < out.len() && is_ready(ring.seq(head), head) {
                ring.copy_out(head, &mut out[n]);
                n += 1;
                head += 1;
            }
            if n > 0 {
                // Release: the producer may reuse the slots once it sees the new head.
                self.consumer.head.store(head, Ordering::Release);
            }
            return Ok(n);
        }
        // IGNORE_OVERRUN: the producer may overwrite what is being read (a seqlock) or
        // has been lapped.
        while n < out.len() {
            let seq = ring.seq(head);
            if is_ready(seq, head) {
                let words = ring.read_words(head);
                if !ring.still_at(head) {
                    // Overwritten while being read: a seqlock miss.
                    head = self.skip_lapped(head, ring.capacity());
                    continue;
                }
                out[n].set_from_words(words);
                n += 1;
                head += 1;
            } else if is_lapped(seq, head) {
                head = self.skip_lapped(head, ring.capacity());
            } else {
                break;
            }
        }
        if head != start {
            self.publish_head(start, head, n as u64);
        }
        Ok(n)
    }

    /// Reads the entry at the consumer's head into `entry` without consuming it.
    // `#[inline]`: extended polling (`extended_poll.rs`) calls it per entry from another
    // module, which may now be another codegen unit.
    #[inline]
    pub(super) fn peek_entry(&self, head: &mut u64) -> Option<Entry> {
        let ring = self.ring().view();
        let validate = self.policy == OverrunPolicy::Overwrite;
        loop {
            match ring.peek(*head) {
                Peek::Ready => match ring.read(*head, validate) {
                    Some(entry) => return Some(entry),
                    None => *head = self.skip_lapped(*head, ring.capacity()),
                },
                Peek::Empty => return None,
                Peek::Lapped => *head = self.skip_lapped(*head, ring.capacity()),
            }
        }
    }

    /// Moves the head from `start` to `end` after handing out `delivered` completions;
    /// the rest of the distance was lost to overwriting. `Release`: the producer may reuse
    /// the slots once it sees the new head.
    #[inline(always)]
    pub(super) fn publish_head(&self, start: u64, end: u64, delivered: u64) {
        let lost = end - start - delivered;
        if lost > 0 {
            self.skipped.fetch_add(lost, Ordering::Relaxed);
        }
        self.consumer.head.store(end, Ordering::Release);
    }

    /// Whether the CQ holds no completion, without taking the consumer lock. The ring
    /// pointer is loaded first: a resize publishes it after every head update it saw.
    #[inline(always)]
    pub(super) fn looks_empty(&self) -> bool {
        let ring = self.ring();
        let head = self.consumer.head.load(Ordering::Acquire);
        ring.is_empty_at(head)
    }
}

impl CompletionQueue {
    /// Polls up to `wcs.len()` completions into `wcs` (`ibv_poll_cq(3)`), returning how
    /// many. An empty CQ costs two loads and takes no lock.
    #[inline(always)]
    pub fn poll(&self, wcs: &mut [WorkCompletion]) -> Result<usize, PollError> {
        // An empty `wcs` takes the locked path, which answers as this one would.
        if self.shared.looks_empty() {
            if self.shared.state.load(Ordering::Relaxed) == STATE_ERROR {
                return Err(PollError::Overrun);
            }
            return Ok(0);
        }
        self.poll_locked(wcs)
    }

    #[inline(never)]
    fn poll_locked(&self, wcs: &mut [WorkCompletion]) -> Result<usize, PollError> {
        let hold = self.shared.consumer.lock.acquire();
        let result = self.shared.poll_exclusive(wcs);
        self.shared.consumer.lock.release(hold);
        result
    }
}

impl SingleThreadedCq {
    /// Polls up to `wcs.len()` completions (`ibv_poll_cq(3)`), with no lock.
    #[inline(always)]
    pub fn poll(&mut self, wcs: &mut [WorkCompletion]) -> Result<usize, PollError> {
        let head = self.shared.consumer.head.load(Ordering::Relaxed);
        // SAFETY: `slots`/`mask` are refreshed by every resize (`&mut self`, in `resize.rs`;
        // first set at creation in `builder.rs`), and the ring lives as long as `shared`
        // (rings are freed only when the shared state drops, see `mod.rs`).
        if unsafe { crate::ring::is_empty_raw(self.slots, self.mask, head) } {
            if self.shared.state.load(Ordering::Relaxed) == STATE_ERROR {
                return Err(PollError::Overrun);
            }
            return Ok(0);
        }
        self.poll_nonempty(wcs)
    }

    #[inline(never)]
    fn poll_nonempty(&mut self, wcs: &mut [WorkCompletion]) -> Result<usize, PollError> {
        self.shared.poll_exclusive(wcs)
    }
}
