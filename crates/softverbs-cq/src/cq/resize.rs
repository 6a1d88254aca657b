//! Resizing (`ibv_resize_cq(3)`): the one place the ring is replaced.
//!
//! Guarantees: every unpolled completion survives, in order, into the new ring; a size
//! smaller than what is outstanding is refused and changes nothing. Both sides are
//! excluded while the ring is swapped (the caller is the only consumer, and resize holds the
//! producer lock); the new ring is published with a `Release` swap after it is fully built,
//! and the old one is retired, not freed, because a lock-free empty check
//! (`CqShared::looks_empty`, `poll.rs`) may still be reading it.

use super::builder::ring_size;
use super::{CompletionQueue, CqShared, SingleThreadedCq, STATE_ERROR};
use crate::error::ResizeError;
use crate::ring::Ring;
use crate::sync::{lock, Ordering};
use crate::wc::WcFields;

impl CqShared {
    /// Resizes; the caller is the only consumer.
    pub(super) fn resize_exclusive(&self, cqe: u32) -> Result<u32, ResizeError> {
        let slots = ring_size(u64::from(cqe))?;
        let hold = self.producer.lock.acquire();
        let result = (|| {
            if self.state.load(Ordering::Relaxed) == STATE_ERROR {
                return Err(ResizeError::InError);
            }
            let head = self.consumer.head.load(Ordering::Relaxed);
            let tail = self.producer.tail.load(Ordering::Relaxed);
            let old = self.ring();
            let oldest = tail.saturating_sub(old.capacity()).max(head);
            let outstanding = tail - oldest;
            if outstanding > u64::from(cqe) {
                return Err(ResizeError::TooSmall {
                    requested: cqe,
                    outstanding,
                });
            }
            let fresh = Box::new(Ring::new(
                slots,
                self.ring_has_extra(),
                self.allocator.as_ref(),
            )?);
            old.copy_into(oldest, tail, &fresh);
            if oldest != head {
                self.publish_head(head, oldest, 0);
            }
            self.producer.cached_head.store(oldest, Ordering::Relaxed);
            // The capacity changed: the next push runs the full and high-water checks.
            self.producer.slow_at.store(0, Ordering::Relaxed);
            let previous = self.ring.swap(Box::into_raw(fresh), Ordering::AcqRel);
            // SAFETY: `previous` came from `Box::into_raw` (at creation in `builder.rs`, or
            // by an earlier resize here); it is retired (not freed) because a lock-free empty
            // check (`looks_empty`, `poll.rs`) may still be reading it.
            lock(&self.retired).push(unsafe { Box::from_raw(previous) });
            Ok(slots as u32)
        })();
        self.producer.lock.release(hold);
        result
    }

    fn ring_has_extra(&self) -> bool {
        self.fields
            .intersects(WcFields::CVLAN | WcFields::FLOW_TAG | WcFields::TM_INFO)
    }
}

impl CompletionQueue {
    /// Resizes to at least `cqe` entries (`ibv_resize_cq(3)`), keeping every unpolled
    /// completion in order. Returns the new capacity.
    pub fn resize(&self, cqe: u32) -> Result<u32, ResizeError> {
        let hold = self.shared.consumer.lock.acquire();
        let result = self.shared.resize_exclusive(cqe);
        self.shared.consumer.lock.release(hold);
        result
    }
}

impl SingleThreadedCq {
    /// Resizes; see [`CompletionQueue::resize`].
    pub fn resize(&mut self, cqe: u32) -> Result<u32, ResizeError> {
        let result = self.shared.resize_exclusive(cqe);
        (self.slots, self.mask) = self.shared.ring().raw_parts();
        result
    }
}
