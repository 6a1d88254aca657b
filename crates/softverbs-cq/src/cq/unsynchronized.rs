//! The consumer paths of a thread-safe [`CompletionQueue`] without its consumer lock, for
//! a CQ whose owner has promised that one thread at a time consumes from it: a CQ created
//! in a parent domain with a thread domain (`ibv_alloc_td(3)`: "any objects created under
//! this thread domain will disable internal locking designed to protect against concurrent
//! access to that object from multiple user threads"). The C drop-in cannot express that
//! promise as a type, so it is an `unsafe` contract here; the safe API expresses it as a
//! `!Send` owner over a [`SingleThreadedCq`](super::SingleThreadedCq), the same lock-free
//! paths.
//!
//! What the promise removes: the consumer lock of `poll`, of `start_poll` … the batch's
//! drop, and of `resize`. What stays: the producer lock (producers are the device's
//! threads, which no thread domain of the application covers), and the lock-free empty
//! check, which needs none.

use super::{CompletionQueue, PollBatch, STATE_ERROR};
use crate::error::{PollError, ResizeError};
use crate::sync::Ordering;
use crate::wc::WorkCompletion;

impl CompletionQueue {
    /// [`CompletionQueue::poll`] without the consumer lock.
    ///
    /// # Safety
    ///
    /// No other consumer call on this CQ — `poll`, `start_poll` or a live [`PollBatch`],
    /// `resize`, or another `*_unsynchronized` call — runs at the same time on another
    /// thread (the thread-domain promise).
    #[inline(always)]
    pub unsafe fn poll_unsynchronized(
        &self,
        wcs: &mut [WorkCompletion],
    ) -> Result<usize, PollError> {
        if self.shared.looks_empty() {
            if self.shared.state.load(Ordering::Relaxed) == STATE_ERROR {
                return Err(PollError::Overrun);
            }
            return Ok(0);
        }
        // The caller's promise makes this thread the only consumer, as the lock would.
        self.shared.poll_exclusive(wcs)
    }

    /// [`CompletionQueue::start_poll`] whose batch holds no consumer lock.
    ///
    /// # Safety
    ///
    /// As [`CompletionQueue::poll_unsynchronized`], for as long as the batch lives.
    pub unsafe fn start_poll_unsynchronized(&self) -> Result<Option<PollBatch<'_>>, PollError> {
        if self.shared.state.load(Ordering::Relaxed) == STATE_ERROR {
            return Err(PollError::Overrun);
        }
        if self.shared.looks_empty() {
            return Ok(None);
        }
        Ok(PollBatch::start(&self.shared, None))
    }

    /// [`CompletionQueue::resize`] without the consumer lock (the producer lock is still
    /// taken: the device's threads keep pushing).
    ///
    /// # Safety
    ///
    /// As [`CompletionQueue::poll_unsynchronized`].
    pub unsafe fn resize_unsynchronized(&self, cqe: u32) -> Result<u32, ResizeError> {
        self.shared.resize_exclusive(cqe)
    }
}
