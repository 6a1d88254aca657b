//! Producing completions: the [`CqProducer`] handle the device's threads push through, the
//! [`ProducerBurst`] that holds the producer lock across several pushes, and the push fast
//! path itself.
//!
//! Guarantees: pushes are serialised by the producer lock (`biased_lock.rs`: a spin lock,
//! one locked instruction per burst, biased towards the thread that keeps pushing, which
//! enters with none); a push writes one slot and publishes it with a `Release` store of the
//! tail; it then reads the notification flag, still under the lock, which an arm
//! (`notify.rs`) also takes: an arm either sees the entry or is seen. What a full ring does
//! is the overrun policy's (`overrun.rs`); the async CQ error is raised after the lock is
//! released.
//!
//! What a push costs beside a burst (issue 14, measured on the 2-vCPU benchmark machines with
//! a two-thread model of benchmark 1, `benches/cq.rs`): a consumer that polls again at once
//! runs either in lock-step with its producer, waiting on the slot being written (about one
//! cache-line hand-off per completion), or behind it, taking lines in bulk (about two
//! completions per hand-off). The owner-bit reference ring and a burst of 16 run in the second
//! mode, [`CqProducer::push`] in the first (0.52x the reference). The checks are not what
//! decides it: with the producer lock and the `bursts` count taken out, the same push (tail,
//! `slow_at`, flags, slot, notification flag) ran at 0.99x; with the lock alone (even without
//! its `busy` stores) or the count alone it stayed at 0.53x-0.6x, and bursts of 2 and 4 ran at
//! about 0.8x and 0.9x. What tips it is the work done per slot before the slot is written:
//! stores (a counter, spilled registers) and a reload, after the lock's compiler fence, of the
//! completion the caller just built, which the CPU cannot forward from the caller's narrower
//! stores. Which of these the compiler emits depends on the caller's loop, so a push that
//! takes the lock once per completion cannot be relied on to reach the burst's rate; a
//! producer with several completions at hand should use [`CqProducer::burst`].

use super::biased_lock::Hold;
use super::notify::ARM_NONE;
use super::overrun::RingFull;
use super::{CqShared, CqStats, OverrunPolicy, STATE_ERROR, STATE_OK};
use crate::clock::DeviceClock;
use crate::error::PushError;
use crate::ring::{Ring, WcExtra};
use crate::sync::{Arc, Ordering};
use crate::wc::WorkCompletion;
use std::fmt;

/// A handle the device's threads push completions through. Cheap to clone; every clone may
/// push concurrently.
#[derive(Clone)]
pub struct CqProducer {
    pub(super) shared: Arc<CqShared>,
}

impl fmt::Debug for CqProducer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqProducer")
            .field("cq", &self.shared.id())
            .finish()
    }
}

impl CqProducer {
    /// Adds one completion. `solicited` says whether the message that produced it carried
    /// the solicited-event bit (it decides whether a solicited-only arm fires).
    // `inline(always)`: a thin wrapper of the inlined push path; left to the inliner, a
    // crate with many call sites gets a call, a prologue and a copy of the completion per
    // push.
    #[inline(always)]
    pub fn push(&self, wc: WorkCompletion, solicited: bool) -> Result<(), PushError> {
        self.burst().push(wc, solicited)
    }

    /// Adds one completion with the fields `struct ibv_wc` has no room for.
    pub fn push_extra(
        &self,
        wc: WorkCompletion,
        solicited: bool,
        extra: WcExtra,
    ) -> Result<(), PushError> {
        self.burst().push_extra(wc, solicited, extra)
    }

    /// Takes the producer lock for a burst of pushes (at most one locked instruction per
    /// burst, none for the thread the lock is biased towards, `biased_lock.rs`). Keep
    /// bursts short: other producers spin while it is held.
    #[inline]
    pub fn burst(&self) -> ProducerBurst<'_> {
        let p = &self.shared.producer;
        let hold = p.lock.acquire();
        // Only the lock holder writes the count: a plain increment.
        p.bursts
            .store(p.bursts.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        ProducerBurst {
            shared: &self.shared,
            hold,
            ring: self.shared.ring(),
            raise_error: false,
        }
    }

    /// The CQ's identity.
    pub fn cq_id(&self) -> u64 {
        self.shared.id()
    }

    /// Whether the CQ is armed (`ibv_req_notify_cq(3)`): a thread will wait for the event
    /// of its next (qualifying) completion.
    pub fn is_armed(&self) -> bool {
        self.shared.is_armed()
    }

    /// Has `hook` called after every arm of the CQ (`ibv_req_notify_cq(3)`), on the
    /// arming thread, outside the CQ's locks: the producing device learns that a thread
    /// will wait for the CQ's event, and so for the packet that makes its completion. The
    /// hook is told whether that packet wakes the waiting thread by itself
    /// ([`CqProducer::packets_wake_waiter`]). Set once: `false` (and nothing changed) if
    /// the CQ already has one.
    pub fn set_arm_hook(&self, hook: impl Fn(bool) + Send + Sync + 'static) -> bool {
        self.shared.arm_hook.set(Box::new(hook)).is_ok()
    }

    /// Whether the CQ reports to a completion channel.
    pub fn has_channel(&self) -> bool {
        self.shared.events.channel().is_some()
    }

    /// Which completion channel the CQ reports to, as a key equal for the CQs of one
    /// channel (`None` without one).
    pub fn channel_key(&self) -> Option<usize> {
        self.shared
            .events
            .channel()
            .map(|channel| Arc::as_ptr(channel) as usize)
    }

    /// Whether a thread asleep on the fd of the CQ's channel is woken by the device's
    /// packets themselves: the channel is non-blocking and its device gave it a wait
    /// progress (`CompletionChannel::set_wait_progress`), so the thread receives the packet
    /// that makes its completion when it wakes. False for a CQ without a channel.
    pub fn packets_wake_waiter(&self) -> bool {
        self.shared.packets_wake_waiter()
    }

    /// Records that a queue pair now uses this CQ (destroy refuses while any does).
    pub fn attach_qp(&self) {
        self.shared.attached_qps.fetch_add(1, Ordering::AcqRel);
    }

    /// Records that a queue pair stopped using this CQ.
    pub fn detach_qp(&self) {
        self.shared.attached_qps.fetch_sub(1, Ordering::AcqRel);
    }

    /// The moderation deadline (device clock) at which [`CqProducer::moderation_timer`]
    /// must be called, if an armed, moderated CQ has pending completions.
    pub fn moderation_deadline(&self) -> Option<u64> {
        self.shared.moderation_deadline()
    }

    /// Fires a moderated event whose period has elapsed at `now` (device clock). Returns
    /// whether an event was delivered.
    pub fn moderation_timer(&self, now: u64) -> bool {
        CqShared::moderation_timer(&self.shared, now)
    }

    /// Whether the CQ is in the error state (overrun).
    pub fn is_in_error(&self) -> bool {
        self.shared.state.load(Ordering::Relaxed) == STATE_ERROR
    }

    /// The CQ's counters and levels, as its consumer's `stats` gives them: what the
    /// device's statistics report (high-water mark, overruns) for the CQs it completes
    /// into. Reads a few atomics; not for the push path.
    pub fn stats(&self) -> CqStats {
        self.shared.stats()
    }
}

/// The producer lock, held for a burst of pushes. Unlocks on drop.
pub struct ProducerBurst<'a> {
    shared: &'a Arc<CqShared>,
    /// How the producer lock was entered, for its release.
    hold: Hold,
    /// The current ring, read once per burst: only resize replaces it, and resize takes the
    /// producer lock this burst holds.
    ring: &'a Ring,
    raise_error: bool,
}

impl ProducerBurst<'_> {
    /// Adds one completion (see [`CqProducer::push`]).
    #[inline(always)]
    pub fn push(&mut self, wc: WorkCompletion, solicited: bool) -> Result<(), PushError> {
        let result = CqShared::push_locked(self.shared, self.ring, &wc, solicited, None);
        if result == Err(PushError::Overrun) {
            self.raise_error = true;
        }
        result
    }

    /// Adds one completion with extra fields (see [`CqProducer::push_extra`]).
    pub fn push_extra(
        &mut self,
        wc: WorkCompletion,
        solicited: bool,
        extra: WcExtra,
    ) -> Result<(), PushError> {
        let result = CqShared::push_locked(self.shared, self.ring, &wc, solicited, Some(&extra));
        if result == Err(PushError::Overrun) {
            self.raise_error = true;
        }
        result
    }
}

impl Drop for ProducerBurst<'_> {
    #[inline]
    fn drop(&mut self) {
        self.shared.producer.lock.release(self.hold);
        if self.raise_error {
            // Outside the lock: the sink is the device's code.
            self.shared.report_overrun();
        }
    }
}

impl CqShared {
    /// Pushes one completion; the caller holds the producer lock and `ring` is the current
    /// ring (resize replaces it only under that lock).
    #[inline(always)]
    fn push_locked(
        this: &Arc<Self>,
        ring: &Ring,
        wc: &WorkCompletion,
        solicited: bool,
        extra: Option<&WcExtra>,
    ) -> Result<(), PushError> {
        let p = &this.producer;
        let pos = p.tail.load(Ordering::Relaxed);
        // One comparison stands for the state check, the full check and the high-water
        // check: below `slow_at` the CQ is in the OK state (whatever leaves it sets `slow_at`
        // to 0 under this lock: `stop_producers`, `ring_full`), the ring has room and the
        // depth cannot pass the high-water mark (both measured against the cached head, see
        // `room_or_mark`).
        if pos >= p.slow_at.load(Ordering::Relaxed) {
            match this.state.load(Ordering::Relaxed) {
                STATE_OK => {}
                STATE_ERROR => return Err(PushError::InError),
                _ => return Err(PushError::Destroyed),
            }
            if let Err(full) = this.room_or_mark(ring.capacity(), pos) {
                return Err(full.into_error(wc));
            }
        }
        let timestamp = if this.plain_push {
            ring.view().publish(pos, wc.to_words());
            // Release: a lapped IGNORE_OVERRUN consumer that reads the tail sees the
            // entries (the same store as below).
            p.tail.store(pos + 1, Ordering::Release);
            0
        } else {
            let timestamp = if this.timestamps {
                DeviceClock::now()
            } else {
                0
            };
            ring.view().write(
                pos,
                wc.to_words(),
                timestamp,
                extra,
                this.policy == OverrunPolicy::Overwrite,
            );
            p.tail.store(pos + 1, Ordering::Release);
            timestamp
        };
        // Under the producer lock, as an arm stores it (`notify.rs`).
        if this.notify.load(Ordering::Relaxed) != ARM_NONE {
            Self::completion_added_while_armed(this, wc.status(), solicited, timestamp);
        }
        Ok(())
    }

    /// Makes every later push take the slow path, where it finds the state the caller just
    /// left (destroyed): `slow_at = 0` under the producer lock, so a push that takes the lock
    /// after this returns sees it. Called with no other CQ lock held (a push may take the
    /// channel's queue lock inside the producer lock, `notify.rs`).
    pub(super) fn stop_producers(&self) {
        let hold = self.producer.lock.acquire();
        self.producer.slow_at.store(0, Ordering::Relaxed);
        self.producer.lock.release(hold);
    }

    /// The push of position `pos` reached `slow_at`: the ring may be full (seen against the
    /// cached head), or the depth may pass the high-water mark. Re-reads the consumer's head
    /// where needed, applies the overrun policy if the ring is full (`Err` refuses the push),
    /// raises the mark, and sets the next `slow_at`. The caller holds the producer lock.
    #[inline(never)]
    fn room_or_mark(&self, capacity: u64, pos: u64) -> Result<(), RingFull> {
        let p = &self.producer;
        let mut head = p.cached_head.load(Ordering::Relaxed);
        if pos - head >= capacity {
            // Acquire: the consumer released these slots after copying them out.
            head = self.consumer.head.load(Ordering::Acquire);
            p.cached_head.store(head, Ordering::Relaxed);
            if pos - head >= capacity {
                // Refused or overrun per the policy; `Ok` means overwrite (`overrun.rs`).
                self.ring_full()?;
            }
        }
        // The depth against the cached head is an upper bound; only when it exceeds the
        // high-water mark is the real head read (and cached), so the mark stays exact while
        // the producer rarely touches the consumer's cache line. Only the lock holder writes
        // the mark, so a plain store suffices.
        let mut high_water = self.high_water.load(Ordering::Relaxed);
        if (pos + 1 - head).min(capacity) > high_water {
            let fresh = self.consumer.head.load(Ordering::Acquire);
            p.cached_head.store(fresh, Ordering::Relaxed);
            let depth = (pos + 1 - fresh).min(capacity);
            if depth > high_water {
                self.high_water.store(depth, Ordering::Relaxed);
                high_water = depth;
            }
        }
        // Below this position, against the cached head, the ring is not full
        // (`pos - head < capacity`) and the depth does not pass the mark
        // (`pos + 1 - head <= high_water`): the next push that can need this function is the
        // one at `slow_at`. While the ring stays full (overwriting) that is the next push.
        let cached = p.cached_head.load(Ordering::Relaxed);
        p.slow_at
            .store(cached + high_water.min(capacity), Ordering::Relaxed);
        Ok(())
    }
}
