//! The completion queue: the state every handle shares, the two consumer handles
//! ([`CompletionQueue`], [`SingleThreadedCq`]) and the methods they have in common. Each
//! job the CQ does lives in its own file of this folder:
//!
//! - `builder.rs`: creation ([`CqBuilder`], `ibv_create_cq_ex(3)`) and sizing ([`MAX_CQE`]);
//! - `produce.rs`: producers ([`CqProducer`], [`ProducerBurst`]) and the push fast path;
//! - `poll.rs`: batch polling (`ibv_poll_cq(3)`) and the consumer's head;
//! - `extended_poll.rs`: the extended poll guard ([`PollBatch`], `ibv_start_poll(3)`);
//! - `notify.rs`: arming (`ibv_req_notify_cq(3)`, solicited-only) and event delivery;
//! - `moderation.rs`: [`Moderation`] (`ibv_modify_cq(3)`);
//! - `overrun.rs`: [`OverrunPolicy`], lapped consumers and `IBV_EVENT_CQ_ERR`;
//! - `resize.rs`: `ibv_resize_cq(3)`, the one place the ring is replaced;
//! - `destroy.rs`: destruction (`ibv_destroy_cq(3)`) and dropping;
//! - `stats.rs`: [`CqStats`];
//! - `unsynchronized.rs`: a thread-safe CQ's consumer paths without the consumer lock, for
//!   a thread domain's promise (`ibv_alloc_td(3)`).
//!
//! Roles:
//! - **Producers** ([`CqProducer`], cloneable, used by the device's threads) push completions.
//!   Pushes are serialised by a producer spin lock biased towards the thread that keeps
//!   pushing (`biased_lock.rs`): that thread enters with plain stores, the others with one
//!   locked instruction; [`CqProducer::burst`] holds it across several pushes.
//! - **Consumers** poll. [`CompletionQueue`] is thread-safe (`&self` polling behind a
//!   consumer lock, biased like the producer lock towards the thread that keeps polling);
//!   [`SingleThreadedCq`] (`IBV_CREATE_CQ_ATTR_SINGLE_THREADED`) polls through `&mut self`
//!   with no lock, and is `!Sync`, so it cannot be shared.
//!
//! The fast paths: a push writes one 64-byte slot, bumps the tail, and reads the
//! notification flag behind a compiler-only barrier (see `sync.rs`); a poll of an empty CQ is
//! two loads; a poll of `n` entries copies `n` slots and publishes the head once.
//!
//! Notification follows `ibv_req_notify_cq(3)`: one shot, fired by the next completion added
//! after arming (solicited-only: the next solicited or unsuccessful one), delivered to the
//! CQ's [`CompletionChannel`](crate::CompletionChannel). Overrun follows `ibv_poll_cq(3)`
//! under [`OverrunPolicy::Error`] (the default).
//!
//! What this file guarantees: the shared state's ring pointer always holds a ring from
//! `Box::into_raw` (made in `builder.rs`, replaced only in `resize.rs`, which retires the old
//! one instead of freeing it), and the ring is freed only when the shared state is dropped,
//! so a `&Ring` taken from it is valid as long as the shared state is.

mod biased_lock;
mod builder;
mod destroy;
mod extended_poll;
mod moderation;
mod notify;
mod overrun;
mod poll;
mod produce;
mod resize;
mod stats;
mod unsynchronized;

pub use builder::{CqBuilder, MAX_CQE};
pub use extended_poll::PollBatch;
pub use moderation::{moderation_in_use, Moderation};
pub use overrun::{CqOverrun, OverrunPolicy, OverrunSink};
pub use produce::{CqProducer, ProducerBurst};
pub use stats::CqStats;

use crate::channel::CqEventSource;
use crate::error::{DestroyError, ModifyError};
use crate::ring::Ring;
use crate::sync::{Arc, AtomicBool, AtomicPtr, AtomicU64, AtomicU8, AtomicUsize, Mutex, Ordering};
use crate::wc::WcFields;
use crossbeam_utils::CachePadded;
use moderation::ModerationState;
use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

const STATE_OK: u8 = 0;
const STATE_ERROR: u8 = 1;
const STATE_DESTROYED: u8 = 2;

struct ProducerSide {
    /// Excludes producers from each other (and from resize), biased towards the thread
    /// that keeps pushing (`biased_lock.rs`).
    lock: biased_lock::BiasedLock,
    /// Next position to write. Written by the lock holder; read by stats and by an
    /// `IGNORE_OVERRUN` consumer that was lapped (`Release`/`Acquire`).
    tail: AtomicU64,
    /// The producer's last look at the consumer's head (only the lock holder uses it).
    cached_head: AtomicU64,
    /// The first position whose push must run the full and high-water checks
    /// (`produce.rs`): `cached_head + min(high_water, capacity)`, or 0 to force them on the
    /// next push. Only the lock holder uses it.
    slow_at: AtomicU64,
    /// Times a producer took the lock to push (a statistic, [`CqStats::bursts`]). Written
    /// by the lock holder only (a plain load and store, no read-modify-write); read by
    /// stats.
    bursts: AtomicU64,
}

struct ConsumerSide {
    /// Excludes consumers from each other (and from resize), biased towards the thread that
    /// keeps polling (`biased_lock.rs`).
    lock: biased_lock::BiasedLock,
    /// Next position to poll. Written by the consumer (`Release` after copying entries
    /// out, so a producer that reads it with `Acquire` may reuse those slots).
    head: AtomicU64,
}

/// The state producers, consumers and events share.
struct CqShared {
    // Read-mostly: written only on resize, error, arming and destroy.
    ring: AtomicPtr<Ring>,
    state: AtomicU8,
    notify: AtomicU8,
    moderation_active: AtomicBool,
    timestamps: bool,
    /// Whether a push is the plain one (`produce.rs`): no timestamp, no seqlock mark
    /// (not `IGNORE_OVERRUN`), no extra fields. Fixed at creation, so one test replaces
    /// three on every push.
    plain_push: bool,
    policy: OverrunPolicy,
    fields: WcFields,
    comp_vector: u32,
    /// The CQ's identity, user context, channel and event counts: what its events point
    /// back to (see `channel.rs`).
    events: Arc<CqEventSource>,
    overrun_sink: Option<OverrunSink>,
    producer: CachePadded<ProducerSide>,
    consumer: CachePadded<ConsumerSide>,
    high_water: AtomicU64,
    /// Completions dropped by a push that overran (the error policy).
    overruns: AtomicU64,
    /// Completions the consumer skipped because they were overwritten.
    skipped: AtomicU64,
    refused: AtomicU64,
    moderation: Mutex<ModerationState>,
    attached_qps: AtomicUsize,
    /// Rings replaced by resize. A lock-free empty check may still be looking at one, so
    /// they live as long as the CQ.
    #[allow(clippy::vec_box)] // readers hold `&Ring` into the box: it must not move
    retired: Mutex<Vec<Box<Ring>>>,
    /// Where rings come from (`memory.rs`): the application's allocator, or the heap.
    allocator: Option<crate::memory::SharedRingAllocator>,
    /// Called after every arm ([`CqProducer::set_arm_hook`]): the producing device learns
    /// that a thread will wait for this CQ's event.
    arm_hook: std::sync::OnceLock<ArmHook>,
    /// The producer's position when the CQ last fired its event: an arm fires at once for
    /// completions past it that no poll took yet (`notify.rs`).
    fired_at: AtomicU64,
}

/// See [`CqShared::arm_hook`]; called with whether the device's packets wake the waiter
/// ([`CqProducer::packets_wake_waiter`]).
type ArmHook = Box<dyn Fn(bool) + Send + Sync>;

impl Drop for CqShared {
    fn drop(&mut self) {
        self.forget_moderation();
        let ring = self.ring.load(Ordering::Relaxed);
        // SAFETY: `ring` came from `Box::into_raw` (creation in `builder.rs` or resize in
        // `resize.rs`) and is replaced only by resize, which retires the old box; `drop` has
        // exclusive access, so nothing else can be using it.
        drop(unsafe { Box::from_raw(ring) });
    }
}

impl CqShared {
    /// The current ring.
    #[inline(always)]
    fn ring(&self) -> &Ring {
        // SAFETY: the pointer always comes from `Box::into_raw` (`builder.rs`, `resize.rs`)
        // and the box is freed only in `Drop` (replaced rings are retired, not freed), so it
        // is valid for as long as `self` is. `Acquire` pairs with resize's `Release` store of
        // a fully built ring.
        unsafe { &*self.ring.load(Ordering::Acquire) }
    }

    fn capacity(&self) -> u32 {
        self.ring().capacity() as u32
    }

    fn id(&self) -> u64 {
        self.events.id()
    }

    fn user_context(&self) -> u64 {
        self.events.user_context()
    }

    fn is_destroyed(&self) -> bool {
        self.state.load(Ordering::Acquire) == STATE_DESTROYED
    }
}

// -------------------------------------------------------------------- consumers

macro_rules! common_cq_methods {
    () => {
        /// The number of entries the CQ holds (`cq->cqe`: at least what was asked for).
        pub fn capacity(&self) -> u32 {
            self.shared.capacity()
        }

        /// A producer handle for the device.
        pub fn producer(&self) -> CqProducer {
            CqProducer {
                shared: self.shared.clone(),
            }
        }

        /// The CQ's identity, named by its events.
        pub fn id(&self) -> u64 {
            self.shared.id()
        }

        /// The user context reported with events (`cq_context`).
        pub fn user_context(&self) -> u64 {
            self.shared.user_context()
        }

        /// Replaces the user context.
        pub fn set_user_context(&self, context: u64) {
            self.shared.events.set_user_context(context);
        }

        /// The completion vector given at creation.
        pub fn comp_vector(&self) -> u32 {
            self.shared.comp_vector
        }

        /// The fields extended polling may read.
        pub fn fields(&self) -> WcFields {
            self.shared.fields
        }

        /// The overrun policy.
        pub fn overrun_policy(&self) -> OverrunPolicy {
            self.shared.policy
        }

        /// Arms the CQ (`ibv_req_notify_cq(3)`): the next completion added (with
        /// `solicited_only`, the next solicited or unsuccessful one) puts one event on the
        /// channel. One shot. A CQ that holds completions added since its last event and
        /// not polled yet raises the event at once when armed, as a ConnectX CQ does (event
        /// loops such as UCX's arm and sleep without polling in between);
        /// [`Self::req_notify_and_check`] says whether completions are waiting.
        pub fn req_notify(&self, solicited_only: bool) {
            CqShared::arm(&self.shared, solicited_only);
        }

        /// Arms, then reports whether completions are already waiting: the race-free form
        /// of "arm, then poll before sleeping". If it returns `true`, poll now (the event
        /// may or may not also come); if `false`, the event will come for the next one.
        pub fn req_notify_and_check(&self, solicited_only: bool) -> bool {
            CqShared::arm(&self.shared, solicited_only);
            !self.shared.looks_empty()
        }

        /// Whether the CQ looks empty right now (no lock taken).
        pub fn is_empty(&self) -> bool {
            self.shared.looks_empty()
        }

        /// Sets moderation (`ibv_modify_cq(3)` with `IBV_CQ_MODERATE`).
        pub fn modify(&self, moderation: Moderation) -> Result<(), ModifyError> {
            self.shared.modify(moderation)
        }

        /// Acknowledges `n` events taken out of their [`CqEvent`](crate::CqEvent) with
        /// [`CqEvent::into_unacknowledged`](crate::CqEvent::into_unacknowledged)
        /// (`ibv_ack_cq_events(3)`).
        pub fn ack_events(&self, n: u32) {
            self.shared.events.ack(u64::from(n));
        }

        /// How many queue pairs complete into this CQ (each counted once, whether it uses
        /// the CQ for its send queue, its receive queue or both).
        pub fn attached_qps(&self) -> usize {
            self.shared.attached_qps.load(Ordering::Acquire)
        }

        /// `ibv_destroy_cq(3)`'s first rule, for a front door that must refuse before it
        /// starts tearing down: the CQ "fails if any queue pair is still associated with
        /// this CQ" ([`DestroyError::QueuePairsAttached`], `EBUSY`). Destroying checks it
        /// again.
        pub fn check_unused(&self) -> Result<(), DestroyError> {
            CqShared::check_unused(&self.shared)
        }

        /// Counters and levels.
        pub fn stats(&self) -> CqStats {
            self.shared.stats()
        }

        /// Whether the CQ is in the error state.
        pub fn is_in_error(&self) -> bool {
            self.shared.state.load(Ordering::Relaxed) == STATE_ERROR
        }

        /// The moderation deadline (device clock), if a moderated event is pending.
        pub fn moderation_deadline(&self) -> Option<u64> {
            self.shared.moderation_deadline()
        }

        /// Fires a moderated event whose period has elapsed at `now` (device clock).
        pub fn moderation_timer(&self, now: u64) -> bool {
            CqShared::moderation_timer(&self.shared, now)
        }

        /// Destroys the CQ (`ibv_destroy_cq(3)`), refusing with the CQ handed back while a
        /// QP uses it or an event it delivered is unacknowledged. Events still queued
        /// unread on the channel are withdrawn.
        pub fn destroy(self) -> Result<(), (Self, DestroyError)> {
            match CqShared::destroy_check(&self.shared, None) {
                Ok(()) => Ok(()),
                Err(e) => Err((self, e)),
            }
        }

        /// Destroys the CQ, waiting up to `timeout` for delivered events to be
        /// acknowledged, as libibverbs' `ibv_destroy_cq` waits.
        pub fn destroy_wait(self, timeout: Duration) -> Result<(), (Self, DestroyError)> {
            match CqShared::destroy_check(&self.shared, Some(timeout)) {
                Ok(()) => Ok(()),
                Err(e) => Err((self, e)),
            }
        }

        /// [`destroy_wait`](Self::destroy_wait) for an owner that must keep the handle
        /// reachable while it waits: the acknowledgements that end the wait come through
        /// the same handle from other threads (the C drop-in's `ibv_ack_cq_events` during
        /// `ibv_destroy_cq`). After `Ok` the CQ is destroyed and the handle is only good
        /// for dropping; after `Err` nothing changed.
        pub fn destroy_wait_in_place(&self, timeout: Duration) -> Result<(), DestroyError> {
            CqShared::destroy_check(&self.shared, Some(timeout))
        }
    };
}

/// A thread-safe completion queue: any number of threads may poll it at once.
///
/// ```
/// use softverbs_cq::{CqBuilder, WorkCompletion, WcOpcode};
/// let cq = CqBuilder::new(16).build()?;
/// cq.producer().push(WorkCompletion::success(1, WcOpcode::Send, 7), false).unwrap();
/// let mut wcs = [WorkCompletion::default(); 4];
/// assert_eq!(cq.poll(&mut wcs).unwrap(), 1);
/// assert_eq!(wcs[0].wr_id(), 1);
/// # Ok::<(), softverbs_cq::CreateError>(())
/// ```
pub struct CompletionQueue {
    shared: Arc<CqShared>,
}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("id", &self.shared.id())
            .field("stats", &self.shared.stats())
            .finish()
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        destroy::mark_dropped(&self.shared);
    }
}

impl CompletionQueue {
    common_cq_methods!();
}

/// A single-threaded completion queue (`IBV_CREATE_CQ_ATTR_SINGLE_THREADED`): polling
/// takes `&mut self` and no lock, and the type is `!Sync`, so it cannot be polled from two
/// threads at once.
///
/// ```
/// use softverbs_cq::{CqBuilder, WorkCompletion, WcOpcode};
/// let mut cq = CqBuilder::new(16).build_single_threaded()?;
/// cq.producer().push(WorkCompletion::success(5, WcOpcode::Recv, 7), false).unwrap();
/// let mut wcs = [WorkCompletion::default(); 4];
/// assert_eq!(cq.poll(&mut wcs).unwrap(), 1);
/// # Ok::<(), softverbs_cq::CreateError>(())
/// ```
pub struct SingleThreadedCq {
    shared: Arc<CqShared>,
    /// The current ring's slots and mask, cached: only `&mut self` resizes it.
    slots: *const crate::ring::Slot,
    mask: u64,
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: `slots` points into the ring owned by `shared` (kept alive by the Arc), which any
// thread may read; the raw pointer is only a cache of `shared.ring()`.
unsafe impl Send for SingleThreadedCq {}

impl fmt::Debug for SingleThreadedCq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SingleThreadedCq")
            .field("id", &self.shared.id())
            .field("stats", &self.shared.stats())
            .finish()
    }
}

impl Drop for SingleThreadedCq {
    fn drop(&mut self) {
        destroy::mark_dropped(&self.shared);
    }
}

impl SingleThreadedCq {
    common_cq_methods!();
}
