//! The completion queue: creation, producers, polling (batch and extended), notification,
//! overrun, resize, moderation, destruction and statistics.
//!
//! Roles:
//! - **Producers** ([`CqProducer`], cloneable, used by the device's threads) push completions.
//!   Pushes are serialised by a producer spin lock; [`CqProducer::burst`] holds it across
//!   several pushes so a busy progress thread pays one locked instruction per burst.
//! - **Consumers** poll. [`CompletionQueue`] is thread-safe (`&self` polling behind a
//!   consumer lock); [`SingleThreadedCq`] (`IBV_CREATE_CQ_ATTR_SINGLE_THREADED`) polls
//!   through `&mut self` with no lock, and is `!Sync`, so it cannot be shared.
//!
//! The fast paths: a push writes one 64-byte slot, bumps the tail, and reads the
//! notification flag behind a compiler-only barrier (see `sync.rs`); a poll of an empty CQ is
//! two loads; a poll of `n` entries copies `n` slots and publishes the head once.
//!
//! Notification follows `ibv_req_notify_cq(3)`: one shot, fired by the next completion added
//! after arming (solicited-only: the next solicited or unsuccessful one), delivered to the
//! CQ's [`CompletionChannel`]. Overrun follows `ibv_poll_cq(3)`
//! under [`OverrunPolicy::Error`] (the default).

use crate::channel::{ChannelInner, CompletionChannel};
use crate::clock::DeviceClock;
use crate::error::{
    CreateError, DestroyError, FieldNotRequested, ModifyError, PollError, PushError, ResizeError,
};
use crate::ring::{Entry, Peek, Ring, WcExtra};
use crate::sync::{
    heavy_barrier, init_barriers, light_barrier, lock, Arc, AtomicBool, AtomicPtr, AtomicU64,
    AtomicU8, AtomicUsize, Condvar, Mutex, Ordering, SpinLock,
};
use crate::wc::{WcFields, WcFlags, WcOpcode, WcStatus, WorkCompletion};
use crossbeam_utils::CachePadded;
use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

/// The largest CQ the device supports (`max_cqe`): 4,194,303 entries, as mlx5 reports.
pub const MAX_CQE: u32 = (1 << 22) - 1;

const ARM_NONE: u8 = 0;
const ARM_SOLICITED: u8 = 1;
const ARM_NEXT: u8 = 2;

const STATE_OK: u8 = 0;
const STATE_ERROR: u8 = 1;
const STATE_DESTROYED: u8 = 2;

/// What happens when a completion arrives at a full CQ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OverrunPolicy {
    /// The spec's behaviour (`ibv_poll_cq(3)`): the CQ enters the error state,
    /// `IBV_EVENT_CQ_ERR` is raised on the async event queue, and polling reports the error.
    #[default]
    Error,
    /// `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN`: the CQ never errors; the oldest unpolled
    /// completions are overwritten and counted in [`CqStats::overruns`].
    Overwrite,
    /// No verbs device offers this: nothing is ever lost. A push to a full CQ is refused
    /// with [`PushError::Full`] and the completion handed back, so the producer (the
    /// device) holds it and retries after the consumer polls.
    Backpressure,
}

/// An asynchronous event the CQ raises for the device's async event queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CqAsyncEvent {
    /// `IBV_EVENT_CQ_ERR`: the CQ overran.
    CqError {
        /// The CQ's identity ([`CompletionQueue::id`]).
        cq_id: u64,
        /// The CQ's user context.
        user_context: u64,
    },
}

/// Receives [`CqAsyncEvent`]s; called with no CQ lock held.
pub type AsyncEventSink = Arc<dyn Fn(CqAsyncEvent) + Send + Sync>;

/// CQ moderation (`struct ibv_moderate_cq`): an armed CQ raises its event after `count`
/// completions or `period_us` microseconds after the first one, whichever comes first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moderation {
    /// Completions per event (`cq_count`); 0 or 1 means every completion.
    pub count: u16,
    /// Microseconds from the first pending completion to the event (`cq_period`); 0 means
    /// no time bound.
    pub period_us: u16,
}

impl Moderation {
    fn is_active(&self) -> bool {
        self.count > 1 || self.period_us > 0
    }
}

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
    /// Pushes refused under [`OverrunPolicy::Backpressure`].
    pub refused: u64,
    /// Completion events delivered to the channel.
    pub events_raised: u64,
    /// Completion events acknowledged.
    pub events_acked: u64,
    /// Whether the CQ is in the error state.
    pub in_error: bool,
}

/// How to create a CQ (`ibv_create_cq_ex(3)`'s `struct ibv_cq_init_attr_ex`).
///
/// ```
/// use softverbs_cq::{CqBuilder, WcFields};
/// let cq = CqBuilder::new(100).fields(WcFields::STANDARD | WcFields::COMPLETION_TIMESTAMP).build()?;
/// assert!(cq.capacity() >= 100);
/// # Ok::<(), softverbs_cq::CreateError>(())
/// ```
#[derive(Clone)]
pub struct CqBuilder {
    cqe: u64,
    fields: WcFields,
    policy: OverrunPolicy,
    channel: Option<CompletionChannel>,
    user_context: u64,
    comp_vector: u32,
    async_sink: Option<AsyncEventSink>,
}

impl fmt::Debug for CqBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqBuilder")
            .field("cqe", &self.cqe)
            .field("fields", &self.fields)
            .field("policy", &self.policy)
            .field("channel", &self.channel.is_some())
            .field("user_context", &self.user_context)
            .field("comp_vector", &self.comp_vector)
            .finish()
    }
}

impl CqBuilder {
    /// A CQ of at least `cqe` entries, reporting the standard `ibv_wc` fields.
    pub fn new(cqe: u32) -> Self {
        CqBuilder {
            cqe: u64::from(cqe),
            fields: WcFields::STANDARD,
            policy: OverrunPolicy::Error,
            channel: None,
            user_context: 0,
            comp_vector: 0,
            async_sink: None,
        }
    }

    /// The fields extended polling may read (`wc_flags`).
    pub fn fields(mut self, fields: WcFields) -> Self {
        self.fields = fields;
        self
    }

    /// The fields from raw `wc_flags` bits as the C side passes them; unknown bits make
    /// [`CqBuilder::build`] fail with `EOPNOTSUPP`, as libibverbs does.
    pub fn raw_fields(mut self, wc_flags: u64) -> Self {
        self.fields = WcFields::from_bits_retain(wc_flags);
        self
    }

    /// What to do on overrun.
    pub fn overrun(mut self, policy: OverrunPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The completion channel events go to.
    pub fn channel(mut self, channel: &CompletionChannel) -> Self {
        self.channel = Some(channel.clone());
        self
    }

    /// The user context reported with each event (`cq_context`).
    pub fn user_context(mut self, context: u64) -> Self {
        self.user_context = context;
        self
    }

    /// The completion vector (recorded; the device checks it against its vector count).
    pub fn comp_vector(mut self, vector: u32) -> Self {
        self.comp_vector = vector;
        self
    }

    /// Where `IBV_EVENT_CQ_ERR` goes (the device's async event queue).
    pub fn async_events(mut self, sink: AsyncEventSink) -> Self {
        self.async_sink = Some(sink);
        self
    }

    fn shared(self) -> Result<Arc<CqShared>, CreateError> {
        let unknown = self.fields.bits() & !WcFields::all().bits();
        if unknown != 0 {
            return Err(CreateError::UnsupportedFields(unknown));
        }
        let slots = ring_size(self.cqe)?;
        init_barriers();
        let with_extra = self
            .fields
            .intersects(WcFields::CVLAN | WcFields::FLOW_TAG | WcFields::TM_INFO);
        let ring = Box::into_raw(Box::new(Ring::new(slots, with_extra)));
        let channel = self.channel.map(|c| c.inner().clone());
        if let Some(ch) = &channel {
            ch.attached.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Arc::new(CqShared {
            ring: AtomicPtr::new(ring),
            state: AtomicU8::new(STATE_OK),
            notify: AtomicU8::new(ARM_NONE),
            moderation_active: AtomicBool::new(false),
            timestamps: self.fields.intersects(
                WcFields::COMPLETION_TIMESTAMP | WcFields::COMPLETION_TIMESTAMP_WALLCLOCK,
            ),
            policy: self.policy,
            fields: self.fields,
            id: next_cq_id(),
            user_context: AtomicU64::new(self.user_context),
            comp_vector: self.comp_vector,
            channel,
            async_sink: self.async_sink,
            producer: CachePadded::new(ProducerSide {
                lock: SpinLock::new(),
                tail: AtomicU64::new(0),
                cached_head: AtomicU64::new(0),
            }),
            consumer: CachePadded::new(ConsumerSide {
                lock: SpinLock::new(),
                head: AtomicU64::new(0),
            }),
            high_water: AtomicU64::new(0),
            overruns: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            moderation: Mutex::new(ModerationState::default()),
            events: Mutex::new(EventCounts::default()),
            events_acked_cv: Condvar::new(),
            attached_qps: AtomicUsize::new(0),
            retired: Mutex::new(Vec::new()),
        }))
    }

    /// Creates a thread-safe CQ.
    pub fn build(self) -> Result<CompletionQueue, CreateError> {
        Ok(CompletionQueue {
            shared: self.shared()?,
        })
    }

    /// Creates a single-threaded CQ (`IBV_CREATE_CQ_ATTR_SINGLE_THREADED`): polling takes
    /// `&mut self` and no lock.
    pub fn build_single_threaded(self) -> Result<SingleThreadedCq, CreateError> {
        let shared = self.shared()?;
        let (slots, mask) = shared.ring().raw_parts();
        Ok(SingleThreadedCq {
            shared,
            slots,
            mask,
            _not_sync: PhantomData,
        })
    }
}

fn ring_size(cqe: u64) -> Result<usize, CreateError> {
    if cqe == 0 {
        return Err(CreateError::ZeroSize);
    }
    if cqe > u64::from(MAX_CQE) {
        return Err(CreateError::TooLarge {
            requested: cqe,
            max: MAX_CQE,
        });
    }
    Ok((cqe as usize).next_power_of_two())
}

fn next_cq_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

struct ProducerSide {
    lock: SpinLock,
    /// Next position to write. Written by the lock holder; read by stats and by an
    /// `IGNORE_OVERRUN` consumer that was lapped (`Release`/`Acquire`).
    tail: AtomicU64,
    /// The producer's last look at the consumer's head (only the lock holder uses it).
    cached_head: AtomicU64,
}

struct ConsumerSide {
    lock: SpinLock,
    /// Next position to poll. Written by the consumer (`Release` after copying entries
    /// out, so a producer that reads it with `Acquire` may reuse those slots).
    head: AtomicU64,
}

#[derive(Default)]
struct ModerationState {
    config: Moderation,
    pending: u32,
    first_pending_at: u64,
}

#[derive(Default)]
struct EventCounts {
    /// Events put on the channel (minus those purged unread at destroy).
    raised: u64,
    acked: u64,
    /// Threads waiting in `destroy_wait` for an ack (an ack wakes them only if any).
    waiters: u32,
}

/// The state producers, consumers and events share.
pub(crate) struct CqShared {
    // Read-mostly: written only on resize, error, arming and destroy.
    ring: AtomicPtr<Ring>,
    state: AtomicU8,
    notify: AtomicU8,
    moderation_active: AtomicBool,
    timestamps: bool,
    policy: OverrunPolicy,
    fields: WcFields,
    id: u64,
    user_context: AtomicU64,
    comp_vector: u32,
    channel: Option<Arc<ChannelInner>>,
    async_sink: Option<AsyncEventSink>,
    producer: CachePadded<ProducerSide>,
    consumer: CachePadded<ConsumerSide>,
    high_water: AtomicU64,
    /// Completions dropped by a push that overran (the error policy).
    overruns: AtomicU64,
    /// Completions the consumer skipped because they were overwritten.
    skipped: AtomicU64,
    refused: AtomicU64,
    moderation: Mutex<ModerationState>,
    events: Mutex<EventCounts>,
    events_acked_cv: Condvar,
    attached_qps: AtomicUsize,
    /// Rings replaced by resize. A lock-free empty check may still be looking at one, so
    /// they live as long as the CQ.
    #[allow(clippy::vec_box)] // readers hold `&Ring` into the box: it must not move
    retired: Mutex<Vec<Box<Ring>>>,
}

impl Drop for CqShared {
    fn drop(&mut self) {
        let ring = self.ring.load(Ordering::Relaxed);
        // SAFETY: `ring` came from `Box::into_raw` (creation or resize) and is replaced only
        // by resize, which retires the old box; `drop` has exclusive access, so nothing else
        // can be using it.
        drop(unsafe { Box::from_raw(ring) });
        if let Some(ch) = &self.channel {
            ch.attached.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl CqShared {
    /// The current ring.
    #[inline(always)]
    fn ring(&self) -> &Ring {
        // SAFETY: the pointer always comes from `Box::into_raw` and the box is freed only
        // in `Drop` (replaced rings are retired, not freed), so it is valid for as long as
        // `self` is. `Acquire` pairs with resize's `Release` store of a fully built ring.
        unsafe { &*self.ring.load(Ordering::Acquire) }
    }

    fn capacity(&self) -> u32 {
        self.ring().capacity() as u32
    }

    // ---------------------------------------------------------------- producing

    /// Pushes one completion; the caller holds the producer lock. Returns whether an
    /// async CQ error must be raised (after unlocking).
    #[inline(always)]
    fn push_locked(
        this: &Arc<Self>,
        wc: &WorkCompletion,
        solicited: bool,
        extra: Option<&WcExtra>,
    ) -> Result<(), PushError> {
        match this.state.load(Ordering::Relaxed) {
            STATE_OK => {}
            STATE_ERROR => return Err(PushError::InError),
            _ => return Err(PushError::Destroyed),
        }
        let ring = this.ring();
        let p = &this.producer;
        let pos = p.tail.load(Ordering::Relaxed);
        let capacity = ring.capacity();
        let mut head = p.cached_head.load(Ordering::Relaxed);
        if pos - head >= capacity {
            // Acquire: the consumer released these slots after copying them out.
            head = this.consumer.head.load(Ordering::Acquire);
            p.cached_head.store(head, Ordering::Relaxed);
            if pos - head >= capacity {
                match this.policy {
                    OverrunPolicy::Error => {
                        this.state.store(STATE_ERROR, Ordering::Release);
                        this.overruns.fetch_add(1, Ordering::Relaxed);
                        return Err(PushError::Overrun);
                    }
                    OverrunPolicy::Backpressure => {
                        this.refused.fetch_add(1, Ordering::Relaxed);
                        return Err(PushError::Full(*wc));
                    }
                    OverrunPolicy::Overwrite => {}
                }
            }
        }
        // The depth against the cached head is an upper bound; only when it exceeds the
        // high-water mark is the real head read (and cached), so the mark stays exact while
        // the producer rarely touches the consumer's cache line. Only the lock holder writes
        // the mark, so a plain store suffices.
        let high_water = this.high_water.load(Ordering::Relaxed);
        if (pos + 1 - head).min(capacity) > high_water {
            let fresh = this.consumer.head.load(Ordering::Acquire);
            p.cached_head.store(fresh, Ordering::Relaxed);
            let depth = (pos + 1 - fresh).min(capacity);
            if depth > high_water {
                this.high_water.store(depth, Ordering::Relaxed);
            }
        }
        let timestamp = if this.timestamps {
            DeviceClock::now()
        } else {
            0
        };
        ring.write(
            pos,
            wc,
            timestamp,
            extra,
            this.policy == OverrunPolicy::Overwrite,
        );
        // Release: a lapped IGNORE_OVERRUN consumer that reads the tail sees the entries.
        p.tail.store(pos + 1, Ordering::Release);
        // Order the publication above before the read of the arm flag, against the heavy
        // barrier in `arm` (see sync.rs): either we see the arm, or the armer sees the entry.
        light_barrier();
        if this.notify.load(Ordering::Relaxed) != ARM_NONE {
            Self::completion_added_while_armed(this, wc.status(), solicited, timestamp);
        }
        Ok(())
    }

    fn raise_cq_error(&self) {
        if let Some(sink) = &self.async_sink {
            sink(CqAsyncEvent::CqError {
                cq_id: self.id,
                user_context: self.user_context.load(Ordering::Relaxed),
            });
        }
    }

    /// The slow path of a push to an armed CQ: decide whether this completion fires the
    /// one-shot event (`ibv_req_notify_cq(3)`), honouring moderation.
    #[cold]
    fn completion_added_while_armed(this: &Arc<Self>, status: WcStatus, solicited: bool, at: u64) {
        let qualifies = |arm: u8| {
            arm == ARM_NEXT || (arm == ARM_SOLICITED && (solicited || !status.is_success()))
        };
        let arm = this.notify.load(Ordering::Acquire);
        if !qualifies(arm) {
            return;
        }
        if this.moderation_active.load(Ordering::Relaxed) {
            let mut m = lock(&this.moderation);
            if m.config.is_active() {
                m.pending += 1;
                if m.pending == 1 {
                    m.first_pending_at = if at != 0 { at } else { DeviceClock::now() };
                }
                if m.pending < u32::from(m.config.count.max(1)) {
                    return;
                }
                m.pending = 0;
            }
        }
        Self::fire(this, qualifies);
    }

    /// Disarms (if still armed in a way `qualifies` accepts) and delivers one event.
    fn fire(this: &Arc<Self>, qualifies: impl Fn(u8) -> bool) {
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
        if let Some(channel) = &this.channel {
            channel.deliver(this);
        }
    }

    // ---------------------------------------------------------------- consuming

    /// Polls into `out`. The caller is the only consumer at this moment (consumer lock or
    /// `&mut SingleThreadedCq`).
    #[inline(always)]
    fn poll_exclusive(&self, out: &mut [WorkCompletion]) -> Result<usize, PollError> {
        if self.state.load(Ordering::Relaxed) == STATE_ERROR {
            return Err(PollError::Overrun);
        }
        let ring = self.ring();
        let validate = self.policy == OverrunPolicy::Overwrite;
        let start = self.consumer.head.load(Ordering::Relaxed);
        let mut head = start;
        let mut n = 0;
        while n < out.len() {
            match ring.peek(head) {
                Peek::Ready => match ring.read(head, validate) {
                    Some(entry) => {
                        out[n] = entry.wc;
                        n += 1;
                        head += 1;
                    }
                    None => head = self.skip_lapped(head, ring),
                },
                Peek::Empty => break,
                Peek::Lapped => head = self.skip_lapped(head, ring),
            }
        }
        if head != start {
            self.publish_head(start, head, n as u64);
        }
        Ok(n)
    }

    /// Reads the entry at the consumer's head into `entry` without consuming it.
    fn peek_entry(&self, head: &mut u64) -> Option<Entry> {
        let ring = self.ring();
        let validate = self.policy == OverrunPolicy::Overwrite;
        loop {
            match ring.peek(*head) {
                Peek::Ready => match ring.read(*head, validate) {
                    Some(entry) => return Some(entry),
                    None => *head = self.skip_lapped(*head, ring),
                },
                Peek::Empty => return None,
                Peek::Lapped => *head = self.skip_lapped(*head, ring),
            }
        }
    }

    /// Under `IGNORE_OVERRUN` the producer overwrote the entry at `head`: the oldest entry
    /// that can still be there. (What was skipped is counted when the head is published.)
    #[cold]
    fn skip_lapped(&self, head: u64, ring: &Ring) -> u64 {
        let tail = self.producer.tail.load(Ordering::Acquire);
        tail.saturating_sub(ring.capacity()).max(head + 1)
    }

    /// Moves the head from `start` to `end` after handing out `delivered` completions;
    /// the rest of the distance was lost to overwriting. `Release`: the producer may reuse
    /// the slots once it sees the new head.
    #[inline(always)]
    fn publish_head(&self, start: u64, end: u64, delivered: u64) {
        let lost = end - start - delivered;
        if lost > 0 {
            self.skipped.fetch_add(lost, Ordering::Relaxed);
        }
        self.consumer.head.store(end, Ordering::Release);
    }

    /// Whether the CQ holds no completion, without taking the consumer lock. The ring
    /// pointer is loaded first: a resize publishes it after every head update it saw.
    #[inline(always)]
    fn looks_empty(&self) -> bool {
        let ring = self.ring();
        let head = self.consumer.head.load(Ordering::Acquire);
        ring.peek(head) == Peek::Empty
    }

    // ---------------------------------------------------------------- arming

    fn arm(&self, solicited_only: bool) {
        if solicited_only {
            // Arming "next" after "solicited" upgrades; "solicited" never downgrades "next".
            let _ = self.notify.compare_exchange(
                ARM_NONE,
                ARM_SOLICITED,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
        } else {
            self.notify.store(ARM_NEXT, Ordering::SeqCst);
        }
        heavy_barrier();
    }

    fn moderation_deadline(&self) -> Option<u64> {
        if !self.moderation_active.load(Ordering::Relaxed) {
            return None;
        }
        let m = lock(&self.moderation);
        (m.pending > 0 && m.config.period_us > 0)
            .then(|| m.first_pending_at + u64::from(m.config.period_us) * 1000)
    }

    fn moderation_timer(this: &Arc<Self>, now: u64) -> bool {
        {
            let mut m = lock(&this.moderation);
            if m.pending == 0
                || m.config.period_us == 0
                || now < m.first_pending_at + u64::from(m.config.period_us) * 1000
            {
                return false;
            }
            m.pending = 0;
        }
        let before = this.events_raised();
        Self::fire(this, |arm| arm != ARM_NONE);
        this.events_raised() != before
    }

    fn events_raised(&self) -> u64 {
        lock(&self.events).raised
    }

    pub(crate) fn note_event_raised(&self) {
        lock(&self.events).raised += 1;
    }

    pub(crate) fn note_events_purged(&self, n: u64) {
        lock(&self.events).raised -= n;
    }

    pub(crate) fn ack(&self, n: u64) {
        let mut ev = lock(&self.events);
        ev.acked += n;
        let waiters = ev.waiters;
        drop(ev);
        // A futex wake is a system call: only when a destroy is waiting for this ack.
        if waiters > 0 {
            self.events_acked_cv.notify_all();
        }
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn user_context(&self) -> u64 {
        self.user_context.load(Ordering::Relaxed)
    }

    pub(crate) fn is_destroyed(&self) -> bool {
        self.state.load(Ordering::Acquire) == STATE_DESTROYED
    }

    // ---------------------------------------------------------------- resize / destroy

    /// Resizes; the caller is the only consumer.
    fn resize_exclusive(&self, cqe: u32) -> Result<u32, ResizeError> {
        let slots = ring_size(u64::from(cqe))?;
        self.producer.lock.lock();
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
            let fresh = Box::new(Ring::new(slots, self.ring_has_extra()));
            old.copy_into(oldest, tail, &fresh);
            if oldest != head {
                self.publish_head(head, oldest, 0);
            }
            self.producer.cached_head.store(oldest, Ordering::Relaxed);
            let previous = self.ring.swap(Box::into_raw(fresh), Ordering::AcqRel);
            // SAFETY: `previous` came from `Box::into_raw`; it is retired (not freed) because
            // a lock-free empty check may still be reading it.
            lock(&self.retired).push(unsafe { Box::from_raw(previous) });
            Ok(slots as u32)
        })();
        self.producer.lock.unlock();
        result
    }

    fn ring_has_extra(&self) -> bool {
        self.fields
            .intersects(WcFields::CVLAN | WcFields::FLOW_TAG | WcFields::TM_INFO)
    }

    /// Destroys if nothing holds the CQ; with `wait`, waits up to that long for delivered
    /// events to be acknowledged.
    fn destroy_check(this: &Arc<Self>, wait: Option<Duration>) -> Result<(), DestroyError> {
        let deadline = wait.map(|w| std::time::Instant::now() + w);
        loop {
            match Self::destroy_now(this) {
                Err(DestroyError::UnacknowledgedEvents(n)) => {
                    let now = std::time::Instant::now();
                    match deadline {
                        Some(deadline) if now < deadline => {
                            // Wait for an ack with no other lock held, then look again.
                            let mut ev = lock(&this.events);
                            ev.waiters += 1;
                            let step = (deadline - now).min(Duration::from_millis(10));
                            let mut ev = wait_timeout(&this.events_acked_cv, ev, step);
                            ev.waiters -= 1;
                        }
                        _ => return Err(DestroyError::UnacknowledgedEvents(n)),
                    }
                }
                other => return other,
            }
        }
    }

    fn destroy_now(this: &Arc<Self>) -> Result<(), DestroyError> {
        let qps = this.attached_qps.load(Ordering::Acquire);
        if qps > 0 {
            return Err(DestroyError::QueuePairsAttached(qps));
        }
        // The channel's queue lock orders destroy against delivery: an event is either
        // queued before (and purged here) or sees the destroyed state and is dropped.
        let queue_guard = this.channel.as_ref().map(|ch| ch.lock_queue());
        let queued = queue_guard
            .as_ref()
            .map_or(0, |q| q.iter().filter(|e| e.id() == this.id).count() as u64);
        let mut ev = lock(&this.events);
        let outstanding = ev.raised - queued - ev.acked;
        if outstanding > 0 {
            return Err(DestroyError::UnacknowledgedEvents(outstanding));
        }
        this.state.store(STATE_DESTROYED, Ordering::Release);
        this.notify.store(ARM_NONE, Ordering::Release);
        if let Some(mut q) = queue_guard {
            let before = q.len();
            q.retain(|e| e.id() != this.id);
            let purged = before - q.len();
            ev.raised -= purged as u64;
            if let Some(ch) = &this.channel {
                ch.note_purged(purged);
            }
        }
        Ok(())
    }

    fn stats(&self) -> CqStats {
        let ev = lock(&self.events);
        let tail = self.producer.tail.load(Ordering::Acquire);
        let head = self.consumer.head.load(Ordering::Acquire);
        let capacity = self.ring().capacity();
        let behind = (tail - head).saturating_sub(capacity);
        CqStats {
            capacity: capacity as u32,
            depth: (tail - head).min(capacity),
            high_water: self.high_water.load(Ordering::Relaxed),
            produced: tail,
            polled: head - self.skipped.load(Ordering::Relaxed),
            overruns: self.overruns.load(Ordering::Relaxed)
                + self.skipped.load(Ordering::Relaxed)
                + behind,
            refused: self.refused.load(Ordering::Relaxed),
            events_raised: ev.raised,
            events_acked: ev.acked,
            in_error: self.state.load(Ordering::Relaxed) == STATE_ERROR,
        }
    }
}

#[cfg(not(loom))]
fn wait_timeout<'a, T>(
    cv: &Condvar,
    guard: crate::sync::MutexGuard<'a, T>,
    step: Duration,
) -> crate::sync::MutexGuard<'a, T> {
    match cv.wait_timeout(guard, step) {
        Ok((g, _)) => g,
        Err(e) => e.into_inner().0,
    }
}

#[cfg(loom)]
fn wait_timeout<'a, T>(
    _cv: &Condvar,
    guard: crate::sync::MutexGuard<'a, T>,
    _step: Duration,
) -> crate::sync::MutexGuard<'a, T> {
    drop(guard);
    loom::thread::yield_now();
    unreachable!("loom models never wait for acknowledgements")
}

// -------------------------------------------------------------------- producers

/// A handle the device's threads push completions through. Cheap to clone; every clone may
/// push concurrently.
#[derive(Clone)]
pub struct CqProducer {
    shared: Arc<CqShared>,
}

impl fmt::Debug for CqProducer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqProducer")
            .field("cq", &self.shared.id)
            .finish()
    }
}

impl CqProducer {
    /// Adds one completion. `solicited` says whether the message that produced it carried
    /// the solicited-event bit (it decides whether a solicited-only arm fires).
    #[inline]
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

    /// Takes the producer lock for a burst of pushes (one locked instruction per burst).
    /// Keep bursts short: other producers spin while it is held.
    #[inline]
    pub fn burst(&self) -> ProducerBurst<'_> {
        self.shared.producer.lock.lock();
        ProducerBurst {
            shared: &self.shared,
            raise_error: false,
        }
    }

    /// The CQ's identity.
    pub fn cq_id(&self) -> u64 {
        self.shared.id
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
}

/// The producer lock, held for a burst of pushes. Unlocks on drop.
pub struct ProducerBurst<'a> {
    shared: &'a Arc<CqShared>,
    raise_error: bool,
}

impl ProducerBurst<'_> {
    /// Adds one completion (see [`CqProducer::push`]).
    #[inline]
    pub fn push(&mut self, wc: WorkCompletion, solicited: bool) -> Result<(), PushError> {
        let result = CqShared::push_locked(self.shared, &wc, solicited, None);
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
        let result = CqShared::push_locked(self.shared, &wc, solicited, Some(&extra));
        if result == Err(PushError::Overrun) {
            self.raise_error = true;
        }
        result
    }
}

impl Drop for ProducerBurst<'_> {
    fn drop(&mut self) {
        self.shared.producer.lock.unlock();
        if self.raise_error {
            // Outside the lock: the sink is the device's code.
            self.shared.raise_cq_error();
        }
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
            self.shared.id
        }

        /// The user context reported with events (`cq_context`).
        pub fn user_context(&self) -> u64 {
            self.shared.user_context()
        }

        /// Replaces the user context.
        pub fn set_user_context(&self, context: u64) {
            self.shared.user_context.store(context, Ordering::Relaxed);
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
        /// channel. One shot. Completions already in the CQ do not fire it; use
        /// [`Self::req_notify_and_check`] to learn about them.
        pub fn req_notify(&self, solicited_only: bool) {
            self.shared.arm(solicited_only);
        }

        /// Arms, then reports whether completions are already waiting: the race-free form
        /// of "arm, then poll before sleeping". If it returns `true`, poll now (the event
        /// may or may not also come); if `false`, the event will come for the next one.
        pub fn req_notify_and_check(&self, solicited_only: bool) -> bool {
            self.shared.arm(solicited_only);
            !self.shared.looks_empty()
        }

        /// Whether the CQ looks empty right now (no lock taken).
        pub fn is_empty(&self) -> bool {
            self.shared.looks_empty()
        }

        /// Sets moderation (`ibv_modify_cq(3)` with `IBV_CQ_MODERATE`).
        pub fn modify(&self, moderation: Moderation) -> Result<(), ModifyError> {
            if self.shared.state.load(Ordering::Relaxed) == STATE_ERROR {
                return Err(ModifyError::InError);
            }
            let mut m = lock(&self.shared.moderation);
            m.config = moderation;
            m.pending = 0;
            self.shared
                .moderation_active
                .store(moderation.is_active(), Ordering::Release);
            Ok(())
        }

        /// Acknowledges `n` events taken out of their [`CqEvent`](crate::CqEvent) with
        /// [`CqEvent::into_unacknowledged`](crate::CqEvent::into_unacknowledged)
        /// (`ibv_ack_cq_events(3)`).
        pub fn ack_events(&self, n: u32) {
            self.shared.ack(u64::from(n));
        }

        /// How many queue pairs complete into this CQ (each counted once, whether it uses
        /// the CQ for its send queue, its receive queue or both).
        pub fn attached_qps(&self) -> usize {
            self.shared.attached_qps.load(Ordering::Acquire)
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
            .field("id", &self.shared.id)
            .field("stats", &self.shared.stats())
            .finish()
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        mark_dropped(&self.shared);
    }
}

fn mark_dropped(shared: &Arc<CqShared>) {
    if !shared.is_destroyed() {
        // Dropped without destroy: withdraw queued events and stop producers. Events the
        // application holds keep the shared state alive, so nothing dangles.
        let queue = shared.channel.as_ref().map(|ch| ch.lock_queue());
        shared.state.store(STATE_DESTROYED, Ordering::Release);
        if let Some(mut q) = queue {
            let before = q.len();
            q.retain(|e| e.id() != shared.id);
            let purged = before - q.len();
            if let Some(ch) = &shared.channel {
                ch.note_purged(purged);
            }
            drop(q);
            if purged > 0 {
                shared.note_events_purged(purged as u64);
            }
        }
    }
}

impl CompletionQueue {
    common_cq_methods!();

    /// Polls up to `wcs.len()` completions into `wcs` (`ibv_poll_cq(3)`), returning how
    /// many. An empty CQ costs two loads and takes no lock.
    #[inline(always)]
    pub fn poll(&self, wcs: &mut [WorkCompletion]) -> Result<usize, PollError> {
        if self.shared.looks_empty() || wcs.is_empty() {
            if self.shared.state.load(Ordering::Relaxed) == STATE_ERROR {
                return Err(PollError::Overrun);
            }
            return Ok(0);
        }
        self.poll_locked(wcs)
    }

    #[inline(never)]
    fn poll_locked(&self, wcs: &mut [WorkCompletion]) -> Result<usize, PollError> {
        self.shared.consumer.lock.lock();
        let result = self.shared.poll_exclusive(wcs);
        self.shared.consumer.lock.unlock();
        result
    }

    /// Starts an extended poll (`ibv_start_poll`): `Ok(None)` when the CQ is empty (the man
    /// page's `ENOENT`, a normal outcome), otherwise a [`PollBatch`] positioned on the
    /// first completion, holding the consumer lock until it is dropped (`ibv_end_poll`).
    pub fn start_poll(&self) -> Result<Option<PollBatch<'_>>, PollError> {
        if self.shared.state.load(Ordering::Relaxed) == STATE_ERROR {
            return Err(PollError::Overrun);
        }
        if self.shared.looks_empty() {
            return Ok(None);
        }
        self.shared.consumer.lock.lock();
        let batch = PollBatch::start(&self.shared, true);
        if batch.is_none() {
            self.shared.consumer.lock.unlock();
        }
        Ok(batch)
    }

    /// Resizes to at least `cqe` entries (`ibv_resize_cq(3)`), keeping every unpolled
    /// completion in order. Returns the new capacity.
    pub fn resize(&self, cqe: u32) -> Result<u32, ResizeError> {
        self.shared.consumer.lock.lock();
        let result = self.shared.resize_exclusive(cqe);
        self.shared.consumer.lock.unlock();
        result
    }
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
            .field("id", &self.shared.id)
            .field("stats", &self.shared.stats())
            .finish()
    }
}

impl Drop for SingleThreadedCq {
    fn drop(&mut self) {
        mark_dropped(&self.shared);
    }
}

impl SingleThreadedCq {
    common_cq_methods!();

    /// Polls up to `wcs.len()` completions (`ibv_poll_cq(3)`), with no lock.
    #[inline(always)]
    pub fn poll(&mut self, wcs: &mut [WorkCompletion]) -> Result<usize, PollError> {
        let head = self.shared.consumer.head.load(Ordering::Relaxed);
        // SAFETY: `slots`/`mask` are refreshed by every resize (`&mut self`), and the ring
        // lives as long as `shared`.
        if unsafe { crate::ring::peek_raw(self.slots, self.mask, head) } == Peek::Empty {
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

    /// Starts an extended poll; see [`CompletionQueue::start_poll`].
    pub fn start_poll(&mut self) -> Result<Option<PollBatch<'_>>, PollError> {
        if self.shared.state.load(Ordering::Relaxed) == STATE_ERROR {
            return Err(PollError::Overrun);
        }
        Ok(PollBatch::start(&self.shared, false))
    }

    /// Resizes; see [`CompletionQueue::resize`].
    pub fn resize(&mut self, cqe: u32) -> Result<u32, ResizeError> {
        let result = self.shared.resize_exclusive(cqe);
        (self.slots, self.mask) = self.shared.ring().raw_parts();
        result
    }
}

// -------------------------------------------------------------------- extended polling

/// One extended-poll window (`ibv_start_poll` … `ibv_end_poll`): positioned on a
/// completion; [`PollBatch::next`] moves on (`ibv_next_poll`); dropping it ends the batch
/// (`ibv_end_poll`), consuming every completion it was positioned on.
///
/// Field readers exist for every field, but only those requested at creation return a
/// value; the others return [`FieldNotRequested`], never stale data.
pub struct PollBatch<'a> {
    shared: &'a Arc<CqShared>,
    locked: bool,
    /// The head when the batch started.
    start: u64,
    /// Completions the batch was positioned on.
    delivered: u64,
    /// The position of the current entry.
    pos: u64,
    current: Entry,
    wallclock_offset: Option<i128>,
    exhausted: bool,
}

impl<'a> PollBatch<'a> {
    fn start(shared: &'a Arc<CqShared>, locked: bool) -> Option<Self> {
        let start = shared.consumer.head.load(Ordering::Relaxed);
        let mut head = start;
        let Some(entry) = shared.peek_entry(&mut head) else {
            if head != start {
                shared.publish_head(start, head, 0);
            }
            return None;
        };
        Some(PollBatch {
            shared,
            locked,
            start,
            delivered: 1,
            pos: head,
            current: entry,
            wallclock_offset: None,
            exhausted: false,
        })
    }

    /// Moves to the next completion (`ibv_next_poll`). `false` when there is none (the man
    /// page's `ENOENT`); the batch must still be ended, which dropping it does.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> bool {
        if self.exhausted {
            return false;
        }
        let mut next = self.pos + 1;
        match self.shared.peek_entry(&mut next) {
            Some(entry) => {
                self.pos = next;
                self.current = entry;
                self.delivered += 1;
                true
            }
            None => {
                self.exhausted = true;
                false
            }
        }
    }

    fn require(&self, field: WcFields) -> Result<(), FieldNotRequested> {
        if self.shared.fields.contains(field) {
            Ok(())
        } else {
            Err(FieldNotRequested(field))
        }
    }

    fn raw(&self) -> crate::wc::RawFields {
        self.current.wc.raw()
    }

    /// The current completion as a whole `ibv_wc` (what `ibv_poll_cq` would return).
    pub fn completion(&self) -> &WorkCompletion {
        &self.current.wc
    }

    /// `cq_ex->wr_id`.
    pub fn wr_id(&self) -> u64 {
        self.current.wc.wr_id()
    }

    /// `cq_ex->status`.
    pub fn status(&self) -> WcStatus {
        self.current.wc.status()
    }

    /// `ibv_wc_read_opcode` (always available).
    pub fn opcode(&self) -> WcOpcode {
        WcOpcode::from_raw(self.raw().opcode)
    }

    /// `ibv_wc_read_vendor_err` (always available).
    pub fn vendor_err(&self) -> u32 {
        self.raw().vendor_err
    }

    /// `ibv_wc_read_wc_flags` (always available).
    pub fn wc_flags(&self) -> WcFlags {
        WcFlags::from_bits_retain(self.raw().wc_flags)
    }

    /// `ibv_wc_read_byte_len` (`IBV_WC_EX_WITH_BYTE_LEN`).
    pub fn byte_len(&self) -> Result<u32, FieldNotRequested> {
        self.require(WcFields::BYTE_LEN)?;
        Ok(self.raw().byte_len)
    }

    /// `ibv_wc_read_imm_data` in host order (`IBV_WC_EX_WITH_IMM`).
    pub fn imm_data(&self) -> Result<u32, FieldNotRequested> {
        self.require(WcFields::IMM)?;
        Ok(u32::from_be(self.raw().imm_or_rkey))
    }

    /// `ibv_wc_read_imm_data` exactly as C gets it (network order) (`IBV_WC_EX_WITH_IMM`).
    pub fn imm_data_raw(&self) -> Result<u32, FieldNotRequested> {
        self.require(WcFields::IMM)?;
        Ok(self.raw().imm_or_rkey)
    }

    /// `ibv_wc_read_invalidated_rkey` (`IBV_WC_EX_WITH_IMM`, which covers it).
    pub fn invalidated_rkey(&self) -> Result<u32, FieldNotRequested> {
        self.require(WcFields::IMM)?;
        Ok(self.raw().imm_or_rkey)
    }

    /// `ibv_wc_read_qp_num` (`IBV_WC_EX_WITH_QP_NUM`).
    pub fn qp_num(&self) -> Result<u32, FieldNotRequested> {
        self.require(WcFields::QP_NUM)?;
        Ok(self.raw().qp_num)
    }

    /// `ibv_wc_read_src_qp` (`IBV_WC_EX_WITH_SRC_QP`).
    pub fn src_qp(&self) -> Result<u32, FieldNotRequested> {
        self.require(WcFields::SRC_QP)?;
        Ok(self.raw().src_qp)
    }

    /// `ibv_wc_read_pkey_index` (covered by the standard fields; always available).
    pub fn pkey_index(&self) -> u16 {
        self.raw().pkey_index
    }

    /// `ibv_wc_read_slid` (`IBV_WC_EX_WITH_SLID`).
    pub fn slid(&self) -> Result<u32, FieldNotRequested> {
        self.require(WcFields::SLID)?;
        Ok(u32::from(self.raw().slid))
    }

    /// `ibv_wc_read_sl` (`IBV_WC_EX_WITH_SL`).
    pub fn sl(&self) -> Result<u8, FieldNotRequested> {
        self.require(WcFields::SL)?;
        Ok(self.raw().sl)
    }

    /// `ibv_wc_read_dlid_path_bits` (`IBV_WC_EX_WITH_DLID_PATH_BITS`).
    pub fn dlid_path_bits(&self) -> Result<u8, FieldNotRequested> {
        self.require(WcFields::DLID_PATH_BITS)?;
        Ok(self.raw().dlid_path_bits)
    }

    /// `ibv_wc_read_completion_ts`: the device clock (ns) when the completion was produced
    /// (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`).
    pub fn completion_ts(&self) -> Result<u64, FieldNotRequested> {
        self.require(WcFields::COMPLETION_TIMESTAMP)?;
        Ok(self.current.timestamp)
    }

    /// `ibv_wc_read_completion_wallclock_ns`
    /// (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`).
    pub fn completion_wallclock_ns(&mut self) -> Result<u64, FieldNotRequested> {
        self.require(WcFields::COMPLETION_TIMESTAMP_WALLCLOCK)?;
        let offset = *self
            .wallclock_offset
            .get_or_insert_with(DeviceClock::wallclock_offset);
        Ok(DeviceClock::to_wallclock(self.current.timestamp, offset))
    }

    /// `ibv_wc_read_cvlan` (`IBV_WC_EX_WITH_CVLAN`).
    pub fn cvlan(&self) -> Result<u16, FieldNotRequested> {
        self.require(WcFields::CVLAN)?;
        Ok(self.current.extra.cvlan)
    }

    /// `ibv_wc_read_flow_tag` (`IBV_WC_EX_WITH_FLOW_TAG`).
    pub fn flow_tag(&self) -> Result<u32, FieldNotRequested> {
        self.require(WcFields::FLOW_TAG)?;
        Ok(self.current.extra.flow_tag)
    }

    /// `ibv_wc_read_tm_info`: (tag, priv) (`IBV_WC_EX_WITH_TM_INFO`).
    pub fn tm_info(&self) -> Result<(u64, u32), FieldNotRequested> {
        self.require(WcFields::TM_INFO)?;
        Ok((self.current.extra.tm_tag, self.current.extra.tm_priv))
    }
}

impl Drop for PollBatch<'_> {
    fn drop(&mut self) {
        // ibv_end_poll: every completion the batch was positioned on is consumed.
        self.shared
            .publish_head(self.start, self.pos + 1, self.delivered);
        if self.locked {
            self.shared.consumer.lock.unlock();
        }
    }
}

impl fmt::Debug for PollBatch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PollBatch")
            .field("pos", &self.pos)
            .field("current", &self.current.wc)
            .finish()
    }
}

pub(crate) use CqShared as Shared;

/// Gives the channel access to the CQ's shared state.
impl ChannelInner {
    pub(crate) fn deliver(&self, cq: &Arc<Shared>) {
        let mut queue = self.lock_queue();
        if cq.is_destroyed() {
            return;
        }
        queue.push_back(crate::channel::QueuedEvent::new(cq.clone()));
        self.note_queued();
        cq.note_event_raised();
        drop(queue);
        self.wake_one();
    }
}
