//! Overrun: what a push to a full CQ does under each [`OverrunPolicy`], how a consumer
//! lapped by the producer (`IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN`) recovers, and the
//! overrun notice ([`CqOverrun`]) the device raises as the `IBV_EVENT_CQ_ERR` async event.
//!
//! Guarantees: under [`OverrunPolicy::Error`] the overrunning completion is dropped, counted,
//! and the CQ enters the error state for good (`ibv_poll_cq(3)`); under
//! [`OverrunPolicy::Backpressure`] nothing is lost, the completion is handed back; under
//! [`OverrunPolicy::Overwrite`] the consumer never returns a torn or overwritten entry, it
//! skips to the oldest entry that can still be there. The overrun notice is given with no
//! CQ lock held.

use super::{CqShared, STATE_ERROR};
use crate::error::PushError;
use crate::sync::{Arc, Ordering};
use crate::wc::WorkCompletion;

/// What happens when a completion arrives at a full CQ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OverrunPolicy {
    /// The spec's behaviour (`ibv_poll_cq(3)`): the CQ enters the error state,
    /// `IBV_EVENT_CQ_ERR` is raised on the async event queue, and polling reports the error.
    #[default]
    Error,
    /// `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN`: the CQ never errors; the oldest unpolled
    /// completions are overwritten and counted in [`CqStats::overruns`](super::CqStats::overruns).
    Overwrite,
    /// No verbs device offers this: nothing is ever lost. A push to a full CQ is refused
    /// with [`PushError::Full`] and the completion handed back, so the producer (the
    /// device) holds it and retries after the consumer polls.
    Backpressure,
}

/// A CQ's overrun notice: the CQ overran and entered the error state (under
/// [`OverrunPolicy::Error`]). The device turns it into `IBV_EVENT_CQ_ERR` on its async
/// event queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqOverrun {
    /// The CQ's identity ([`CompletionQueue::id`](super::CompletionQueue::id)).
    pub cq_id: u64,
    /// The CQ's user context.
    pub user_context: u64,
}

/// Why a push to a full ring was refused (see [`CqShared::ring_full`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RingFull {
    /// The CQ entered the error state ([`OverrunPolicy::Error`]).
    Overrun,
    /// The completion goes back to the producer ([`OverrunPolicy::Backpressure`]).
    Refused,
}

impl RingFull {
    /// The push's error; `wc` is the completion that was refused.
    #[cold]
    pub(super) fn into_error(self, wc: &WorkCompletion) -> PushError {
        match self {
            RingFull::Overrun => PushError::Overrun,
            RingFull::Refused => PushError::Full(*wc),
        }
    }
}

/// Receives [`CqOverrun`] notices; called with no CQ lock held.
pub type OverrunSink = Arc<dyn Fn(CqOverrun) + Send + Sync>;

impl CqShared {
    /// A push found the ring full even after re-reading the consumer's head; the caller
    /// holds the producer lock. Applies the policy: `Err` refuses the push (the CQ entered
    /// the error state, or the completion is to be handed back: [`RingFull::into_error`]),
    /// `Ok` goes on to overwrite the oldest entry.
    #[inline(always)]
    pub(super) fn ring_full(&self) -> Result<(), RingFull> {
        match self.policy {
            OverrunPolicy::Error => {
                self.state.store(STATE_ERROR, Ordering::Release);
                // Every later push takes the slow path and finds the error state there.
                self.producer.slow_at.store(0, Ordering::Relaxed);
                self.overruns.fetch_add(1, Ordering::Relaxed);
                Err(RingFull::Overrun)
            }
            OverrunPolicy::Backpressure => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Err(RingFull::Refused)
            }
            OverrunPolicy::Overwrite => Ok(()),
        }
    }

    pub(super) fn report_overrun(&self) {
        if let Some(sink) = &self.overrun_sink {
            sink(CqOverrun {
                cq_id: self.id(),
                user_context: self.user_context(),
            });
        }
    }

    /// Under `IGNORE_OVERRUN` the producer overwrote the entry at `head`: the oldest entry
    /// that can still be there. (What was skipped is counted when the head is published.)
    #[cold]
    pub(super) fn skip_lapped(&self, head: u64, capacity: u64) -> u64 {
        let tail = self.producer.tail.load(Ordering::Acquire);
        tail.saturating_sub(capacity).max(head + 1)
    }
}
