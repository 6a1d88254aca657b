//! Notification (`ibv_req_notify_cq(3)`): arming, solicited-only arming, the one-shot
//! event a completion added while armed fires, and its delivery to the CQ's completion
//! channel.
//!
//! Guarantees: an event fires for the next completion added after arming (solicited-only:
//! the next solicited or unsuccessful one), or at once if the CQ holds completions when it
//! is armed (as a ConnectX CQ does; see [`CqShared::arm`]), at most once per arm, and none
//! is lost to a push racing the arm: the arming side stores the flag under the producer
//! lock, and the producer (`produce.rs`) reads it under that lock after publishing its
//! entry, so either the producer sees the arm or the armer's check sees the entry.
//! Moderation (`moderation.rs`) may hold a qualifying completion's event back. Delivery to
//! a destroyed CQ is dropped, ordered against destruction (`destroy.rs`) by the channel's
//! queue lock.

use super::CqShared;
use crate::channel::{ChannelInner, QueuedEvent};
use crate::sync::{Arc, Ordering};
use crate::wc::WcStatus;

pub(super) const ARM_NONE: u8 = 0;
const ARM_SOLICITED: u8 = 1;
const ARM_NEXT: u8 = 2;

impl CqShared {
    /// The slow path of a push to an armed CQ: decide whether this completion fires the
    /// one-shot event (`ibv_req_notify_cq(3)`), honouring moderation.
    #[cold]
    pub(super) fn completion_added_while_armed(
        this: &Arc<Self>,
        status: WcStatus,
        solicited: bool,
        at: u64,
    ) {
        let qualifies = |arm: u8| {
            arm == ARM_NEXT || (arm == ARM_SOLICITED && (solicited || !status.is_success()))
        };
        let arm = this.notify.load(Ordering::Acquire);
        if !qualifies(arm) {
            return;
        }
        if this.moderation_holds_back(at) {
            return;
        }
        Self::fire(this, qualifies);
    }

    /// Disarms (if still armed in a way `qualifies` accepts) and delivers one event.
    pub(super) fn fire(this: &Arc<Self>, qualifies: impl Fn(u8) -> bool) {
        let mut arm = this.notify.load(Ordering::Acquire);
        loop {
            if arm == ARM_NONE || !qualifies(arm) {
                return;
            }
            match this
                .notify
                .compare_exchange(arm, ARM_NONE, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(now) => arm = now,
            }
        }
        // The completions up to here are announced by this event (a push fires under the
        // producer lock, right after its entry).
        this.fired_at
            .fetch_max(this.producer.tail.load(Ordering::Acquire), Ordering::AcqRel);
        if let Some(channel) = this.events.channel() {
            Self::deliver(this, channel);
        }
    }

    /// Queues one event for this CQ on `channel` and wakes a getter, unless the CQ is
    /// destroyed: checked under the queue lock, which destroy also holds (`destroy.rs`).
    fn deliver(this: &Arc<Self>, channel: &ChannelInner) {
        let mut queue = channel.lock_queue();
        if this.is_destroyed() {
            return;
        }
        queue.push_back(QueuedEvent::new(this.events.clone()));
        let counted = channel.note_queued(&mut queue);
        this.events.note_raised();
        drop(queue);
        if counted {
            channel.wake_one();
        }
        channel.note_delivered();
    }

    /// Arms the CQ, under the producer lock: a push that held it before has published its
    /// entry (which the caller's check after arming sees, the lock ordering the two), and
    /// a push that takes it after sees the arm. No barrier beyond the lock: a heavy barrier
    /// (`membarrier`) per arm cost 15 us on the benchmark VMs whenever another thread of
    /// the process was running, an interrupt to each of its CPUs. The producer lock's bias
    /// (`biased_lock.rs`) is revoked the first time another thread arms, once in the CQ's
    /// life; from then on a push takes the plain spin lock (a CQ that is never armed keeps
    /// the biased path).
    ///
    /// A CQ armed while it holds completions no event announced raises its event at once
    /// (below).
    pub(super) fn arm(this: &Arc<Self>, solicited_only: bool) {
        let hold = this.producer.lock.acquire();
        if solicited_only {
            // Arming "next" after "solicited" upgrades; "solicited" never downgrades "next".
            let _ = this.notify.compare_exchange(
                ARM_NONE,
                ARM_SOLICITED,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        } else {
            this.notify.store(ARM_NEXT, Ordering::Relaxed);
        }
        this.producer.lock.release(hold);
        // Completions added since the last event and not polled yet raise the event now,
        // as on a ConnectX HCA (the arm names the consumer index; the HCA raises the event
        // for an entry past it, at once if there is one). UCX relies on it: it takes its
        // events with `ibv_get_cq_event` until `EAGAIN`, arms, and sleeps without polling
        // in between, so a completion made between its last poll and the arm (by another
        // thread, or a device's progress thread) raised no event, and two `ucx_perftest
        // -E sleep` processes slept for ever, each waiting for the other, in 2 of 40 runs.
        // Only those: the completion whose event the application is handling (the
        // documented loop takes the event, arms, then polls) raises no second one. One
        // shot still: this and a racing push's `fire` both disarm first.
        if this.unannounced() {
            Self::fire(this, |_| true);
        }
        let packets_wake = this
            .events
            .channel()
            .is_some_and(|channel| channel.note_armed());
        if let Some(hook) = this.arm_hook.get() {
            hook(packets_wake);
        }
    }

    /// Whether the device's packets make the fd of the CQ's channel readable, waking a
    /// thread asleep on it (`channel.rs`: a non-blocking channel with a wait progress).
    pub(super) fn packets_wake_waiter(&self) -> bool {
        self.events
            .channel()
            .is_some_and(|channel| channel.packets_wake_sleepers())
    }

    /// Whether the CQ holds completions added since its last event that no poll took yet.
    fn unannounced(&self) -> bool {
        let tail = self.producer.tail.load(Ordering::Acquire);
        let head = self.consumer.head.load(Ordering::Acquire);
        tail > self.fired_at.load(Ordering::Acquire).max(head)
    }

    /// Whether the CQ is armed (an event will fire for a qualifying completion).
    pub(super) fn is_armed(&self) -> bool {
        self.notify.load(Ordering::Acquire) != ARM_NONE
    }
}
