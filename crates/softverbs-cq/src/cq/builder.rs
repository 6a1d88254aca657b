//! Creating a CQ (`ibv_create_cq_ex(3)`): [`CqBuilder`] checks the requested size and
//! fields, builds the ring and the shared state, and hands out either consumer handle.
//!
//! Guarantees: a CQ has between 1 and [`MAX_CQE`] requested entries, rounded up to a power
//! of two; unknown `wc_flags` bits are refused (`EOPNOTSUPP`); the asymmetric barrier is
//! prepared before any producer can run; and the ring pointer the shared state starts with
//! comes from `Box::into_raw`, as `mod.rs` requires.

use super::biased_lock::BiasedLock;
use super::notify::ARM_NONE;
use super::{
    CompletionQueue, ConsumerSide, CqShared, ModerationState, OverrunPolicy, OverrunSink,
    ProducerSide, SingleThreadedCq, STATE_OK,
};
use crate::channel::{CompletionChannel, CqEventSource};
use crate::error::CreateError;
use crate::memory::SharedRingAllocator;
use crate::ring::Ring;
use crate::sync::{
    init_barriers, Arc, AtomicBool, AtomicPtr, AtomicU64, AtomicU8, AtomicUsize, Mutex,
};
use crate::wc::WcFields;
use crossbeam_utils::CachePadded;
use std::fmt;
use std::marker::PhantomData;

/// The largest CQ the device supports (`max_cqe`): 4,194,303 entries, as mlx5 reports.
pub const MAX_CQE: u32 = (1 << 22) - 1;

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
    overrun_sink: Option<OverrunSink>,
    allocator: Option<SharedRingAllocator>,
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
            .field("allocator", &self.allocator.is_some())
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
            overrun_sink: None,
            allocator: None,
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

    /// Who hears of an overrun ([`CqOverrun`](super::CqOverrun)): the device, which raises
    /// `IBV_EVENT_CQ_ERR` on its async event queue.
    pub fn overrun_sink(mut self, sink: OverrunSink) -> Self {
        self.overrun_sink = Some(sink);
        self
    }

    /// Where the ring's memory comes from: the application's allocator (a CQ in a parent
    /// domain, `ibv_alloc_parent_domain(3)`), under the contract of [`RingAllocator`]. The
    /// rings of later resizes come from it too; each is released when the CQ is dropped.
    ///
    /// [`RingAllocator`]: crate::RingAllocator
    pub fn allocator(mut self, allocator: SharedRingAllocator) -> Self {
        self.allocator = Some(allocator);
        self
    }

    fn shared(self) -> Result<Arc<CqShared>, CreateError> {
        let unknown = self.fields.bits() & !WcFields::all().bits();
        if unknown != 0 {
            return Err(CreateError::UnsupportedFields(unknown));
        }
        let slots = ring_size(self.cqe)?;
        let barriers = init_barriers();
        let with_extra = self
            .fields
            .intersects(WcFields::CVLAN | WcFields::FLOW_TAG | WcFields::TM_INFO);
        let timestamps = self
            .fields
            .intersects(WcFields::COMPLETION_TIMESTAMP | WcFields::COMPLETION_TIMESTAMP_WALLCLOCK);
        let ring = Box::into_raw(Box::new(Ring::new(
            slots,
            with_extra,
            self.allocator.as_ref(),
        )?));
        // Counts the CQ as attached to its channel until the event source is dropped.
        let events = CqEventSource::new(
            next_cq_id(),
            self.user_context,
            self.channel.map(|c| c.inner().clone()),
        );
        Ok(Arc::new(CqShared {
            ring: AtomicPtr::new(ring),
            state: AtomicU8::new(STATE_OK),
            notify: AtomicU8::new(ARM_NONE),
            moderation_active: AtomicBool::new(false),
            timestamps,
            plain_push: !timestamps && self.policy != OverrunPolicy::Overwrite && !with_extra,
            policy: self.policy,
            fields: self.fields,
            comp_vector: self.comp_vector,
            events: Arc::new(events),
            overrun_sink: self.overrun_sink,
            producer: CachePadded::new(ProducerSide {
                lock: BiasedLock::new(barriers),
                tail: AtomicU64::new(0),
                cached_head: AtomicU64::new(0),
                slow_at: AtomicU64::new(0),
                bursts: AtomicU64::new(0),
            }),
            consumer: CachePadded::new(ConsumerSide {
                lock: BiasedLock::new(barriers),
                head: AtomicU64::new(0),
            }),
            high_water: AtomicU64::new(0),
            overruns: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            moderation: Mutex::new(ModerationState::default()),
            attached_qps: AtomicUsize::new(0),
            retired: Mutex::new(Vec::new()),
            allocator: self.allocator,
            arm_hook: std::sync::OnceLock::new(),
            fired_at: AtomicU64::new(0),
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

/// The ring size for `cqe` requested entries (also the check `resize.rs` applies).
pub(super) fn ring_size(cqe: u64) -> Result<usize, CreateError> {
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
