//! Completion queues and completion channels (`ibv_create_cq(3)`, `ibv_create_cq_ex(3)`,
//! `ibv_poll_cq(3)`, `ibv_req_notify_cq(3)`, `ibv_create_comp_channel(3)`,
//! `ibv_get_cq_event(3)`), on top of `softverbs-cq`.
//!
//! Two kinds of CQ:
//! - [`Cq`], thread-safe: `poll(&self)` from any number of threads. QPs hold a reference
//!   to it, so it lives while any QP completes into it, and [`Cq::destroy`] refuses
//!   (handing the CQ back) while one does.
//! - [`LocalCq`] (`IBV_CREATE_CQ_ATTR_SINGLE_THREADED`): `poll(&mut self)` with no lock,
//!   `!Sync`. The cq crate refuses to destroy it while a QP uses it; dropping it anyway
//!   stops it (later completions for it are discarded, nothing dangles).
//!
//! A poll that finds its CQ empty runs the device's progress once and polls again, so a
//! busy-polling application makes progress without relying on the progress thread.
//!
//! Extended polling (`ibv_start_poll` / `ibv_next_poll` / `ibv_end_poll`) is
//! [`Cq::start_poll`], giving the cq crate's [`PollBatch`]: only the fields requested at
//! creation ([`CqBuilder::fields`]) can be read.

use crate::context::{Context, ContextInner};
use crate::error::Error;
use softverbs_cq::{
    CompletionChannel, CompletionQueue, CqEvent, CqProducer, CqStats, DestroyError, Moderation,
    OverrunPolicy, OverrunSink, PollBatch, PollError, SingleThreadedCq, WcFields, WorkCompletion,
};
use softverbs_device::AsyncEvent;
use softverbs_proto::Object;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How to create a CQ (`struct ibv_cq_init_attr_ex`); from [`Context::cq_builder`].
///
/// ```
/// use softverbs::{Context, DeviceConfig, WcFields};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let channel = ctx.create_comp_channel()?;
/// let cq = ctx
///     .cq_builder(256)
///     .channel(&channel)
///     .fields(WcFields::STANDARD | WcFields::COMPLETION_TIMESTAMP)
///     .user_context(7)
///     .build()?;
/// assert!(cq.capacity() >= 256);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct CqBuilder {
    ctx: Context,
    inner: softverbs_cq::CqBuilder,
    channel: Option<CompChannel>,
}

impl std::fmt::Debug for CqBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqBuilder")
            .field("inner", &self.inner)
            .finish()
    }
}

impl CqBuilder {
    pub(crate) fn new(ctx: &Context, cqe: u32) -> Self {
        let weak: Weak<ContextInner> = Arc::downgrade(&ctx.inner);
        let sink: OverrunSink = Arc::new(move |overrun| {
            if let Some(ctx) = weak.upgrade() {
                ctx.device.async_events().push(AsyncEvent::from(overrun));
            }
        });
        CqBuilder {
            ctx: ctx.clone(),
            inner: softverbs_cq::CqBuilder::new(cqe).overrun_sink(sink),
            channel: None,
        }
    }

    /// The fields extended polling may read (`wc_flags`); the default is
    /// [`WcFields::STANDARD`].
    pub fn fields(mut self, fields: WcFields) -> Self {
        self.inner = self.inner.fields(fields);
        self
    }

    /// What a full CQ does (default: the spec's error state, `IBV_EVENT_CQ_ERR`).
    pub fn overrun(mut self, policy: OverrunPolicy) -> Self {
        self.inner = self.inner.overrun(policy);
        self
    }

    /// The completion channel that receives this CQ's events.
    pub fn channel(mut self, channel: &CompChannel) -> Self {
        self.inner = self.inner.channel(&channel.channel);
        self.channel = Some(channel.clone());
        self
    }

    /// The user context reported with events (`cq_context`).
    pub fn user_context(mut self, context: u64) -> Self {
        self.inner = self.inner.user_context(context);
        self
    }

    /// The completion vector (`comp_vector`).
    pub fn comp_vector(mut self, vector: u32) -> Self {
        self.inner = self.inner.comp_vector(vector);
        self
    }

    /// The ring's memory from `allocator` (a parent domain's, [`crate::ParentDomain`]).
    pub(crate) fn ring_allocator(mut self, allocator: softverbs_cq::SharedRingAllocator) -> Self {
        self.inner = self.inner.allocator(allocator);
        self
    }

    fn check(&self) -> Result<(), Error> {
        match &self.channel {
            Some(ch) if !ch.ctx.same(&self.ctx) => Err(Error::ForeignObject {
                object: Object::Channel,
            }),
            _ => Ok(()),
        }
    }

    /// Creates a thread-safe CQ.
    pub fn build(self) -> Result<Cq, Error> {
        self.check()?;
        let cq = self.inner.build()?;
        Ok(Cq {
            inner: Arc::new(CqInner {
                events: CqEvents::new(&self.ctx, cq.id()),
                ctx: self.ctx,
                cq,
            }),
        })
    }

    /// Creates a single-threaded CQ (`IBV_CREATE_CQ_ATTR_SINGLE_THREADED`).
    pub fn build_single_threaded(self) -> Result<LocalCq, Error> {
        self.check()?;
        let cq = self.inner.build_single_threaded()?;
        Ok(LocalCq {
            events: CqEvents::new(&self.ctx, cq.id()),
            ctx: self.ctx,
            cq,
        })
    }
}

pub(crate) struct CqInner {
    pub(crate) ctx: Context,
    pub(crate) cq: CompletionQueue,
    events: CqEvents,
}

/// Tells the device when a CQ is gone ([`Device::cq_destroyed`]), so that its unread
/// `IBV_EVENT_CQ_ERR` is never delivered: dropped after the CQ (fields drop in order), by
/// a successful destroy or by the last handle going away.
///
/// [`Device::cq_destroyed`]: softverbs_device::Device::cq_destroyed
struct CqEvents {
    ctx: Context,
    cq_id: u64,
}

impl CqEvents {
    fn new(ctx: &Context, cq_id: u64) -> CqEvents {
        CqEvents {
            ctx: ctx.clone(),
            cq_id,
        }
    }
}

impl Drop for CqEvents {
    fn drop(&mut self) {
        self.ctx.device().cq_destroyed(self.cq_id);
    }
}

/// A thread-safe completion queue (`struct ibv_cq` / `ibv_cq_ex`).
///
/// ```
/// use softverbs::{Context, DeviceConfig, WorkCompletion};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let cq = ctx.create_cq(16)?;
/// let mut wcs = [WorkCompletion::default(); 8];
/// assert_eq!(cq.poll(&mut wcs)?, 0); // empty: ran progress once, still nothing
/// cq.destroy().map_err(|(_, e)| e)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Cq {
    pub(crate) inner: Arc<CqInner>,
}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Cq").field(&self.inner.cq).finish()
    }
}

macro_rules! cq_common {
    ($($cq:tt)+) => {
        /// The number of entries the CQ holds (at least what was asked for).
        pub fn capacity(&self) -> u32 {
            self.$($cq)+.capacity()
        }

        /// The CQ's identity, named by its events ([`CqEvent::is_for`]).
        pub fn id(&self) -> u64 {
            self.$($cq)+.id()
        }

        /// The user context reported with events.
        pub fn user_context(&self) -> u64 {
            self.$($cq)+.user_context()
        }

        /// The fields extended polling may read.
        pub fn fields(&self) -> WcFields {
            self.$($cq)+.fields()
        }

        /// Arms the CQ (`ibv_req_notify_cq(3)`): the next completion added (with
        /// `solicited_only`, the next solicited or unsuccessful one) puts one event on the
        /// channel. One shot.
        pub fn req_notify(&self, solicited_only: bool) {
            self.$($cq)+.req_notify(solicited_only)
        }

        /// Arms, then says whether completions are already waiting (the race-free "arm,
        /// then poll before sleeping"): `true` means poll now.
        pub fn req_notify_and_check(&self, solicited_only: bool) -> bool {
            self.$($cq)+.req_notify_and_check(solicited_only)
        }

        /// Sets moderation (`ibv_modify_cq(3)`).
        pub fn modify(&self, moderation: Moderation) -> Result<(), Error> {
            Ok(self.$($cq)+.modify(moderation)?)
        }

        /// Acknowledges `n` events taken with [`CqEvent::into_unacknowledged`]
        /// (`ibv_ack_cq_events(3)`); events dropped normally acknowledge themselves.
        pub fn ack_events(&self, n: u32) {
            self.$($cq)+.ack_events(n)
        }

        /// Counters and levels.
        pub fn stats(&self) -> CqStats {
            self.$($cq)+.stats()
        }

        /// Whether the CQ overran and is in the error state.
        pub fn is_in_error(&self) -> bool {
            self.$($cq)+.is_in_error()
        }
    };
}

impl Cq {
    cq_common!(inner.cq);

    /// The context the CQ belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// Polls up to `wcs.len()` completions (`ibv_poll_cq(3)`); when the CQ is empty, runs
    /// the device's progress once and polls again.
    pub fn poll(&self, wcs: &mut [WorkCompletion]) -> Result<usize, PollError> {
        let n = self.inner.cq.poll(wcs)?;
        if n > 0 || wcs.is_empty() {
            return Ok(n);
        }
        self.inner.ctx.progress();
        self.inner.cq.poll(wcs)
    }

    /// Starts an extended poll (`ibv_start_poll`, `ibv_create_cq_ex(3)`): `Ok(None)` when
    /// the CQ is empty (after one round of progress), else a batch positioned on the first
    /// completion; dropping it ends the poll (`ibv_end_poll`).
    pub fn start_poll(&self) -> Result<Option<PollBatch<'_>>, PollError> {
        if self.inner.cq.is_empty() {
            self.inner.ctx.progress();
        }
        self.inner.cq.start_poll()
    }

    /// Resizes to at least `cqe` entries (`ibv_resize_cq(3)`); returns the new capacity.
    pub fn resize(&self, cqe: u32) -> Result<u32, Error> {
        Ok(self.inner.cq.resize(cqe)?)
    }

    /// How many QP queues complete into this CQ (a QP using it for both its send and its
    /// receive completions counts twice here; `QueuePairsAttached` counts QPs).
    pub fn attachments(&self) -> usize {
        Arc::strong_count(&self.inner) - 1
    }

    /// Destroys the CQ (`ibv_destroy_cq(3)`). Refused, with the CQ handed back, while a QP
    /// completes into it or an event it delivered is unacknowledged.
    pub fn destroy(self) -> Result<(), (Cq, Error)> {
        match Arc::try_unwrap(self.inner) {
            Err(inner) => {
                let users = match inner.cq.attached_qps() {
                    0 => Arc::strong_count(&inner) - 1,
                    qps => qps,
                };
                Err((Cq { inner }, DestroyError::QueuePairsAttached(users).into()))
            }
            Ok(CqInner { ctx, cq, events }) => cq.destroy().map_err(|(cq, e)| {
                (
                    Cq {
                        inner: Arc::new(CqInner { ctx, cq, events }),
                    },
                    e.into(),
                )
            }),
        }
    }
}

/// A single-threaded completion queue (`IBV_CREATE_CQ_ATTR_SINGLE_THREADED`): polled
/// through `&mut self`, with no lock.
///
/// ```
/// use softverbs::{Context, DeviceConfig, WorkCompletion};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let mut cq = ctx.cq_builder(16).build_single_threaded()?;
/// let mut wcs = [WorkCompletion::default(); 8];
/// assert_eq!(cq.poll(&mut wcs)?, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// It cannot be shared between threads:
///
/// ```compile_fail
/// fn shared<T: Sync>(_: &T) {}
/// let ctx = softverbs::Context::open_with(softverbs::DeviceConfig::in_process()).unwrap();
/// shared(&ctx.cq_builder(16).build_single_threaded().unwrap());
/// ```
pub struct LocalCq {
    ctx: Context,
    cq: SingleThreadedCq,
    events: CqEvents,
}

impl std::fmt::Debug for LocalCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("LocalCq").field(&self.cq).finish()
    }
}

impl LocalCq {
    cq_common!(cq);

    /// The context the CQ belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Polls as [`Cq::poll`], with no lock.
    pub fn poll(&mut self, wcs: &mut [WorkCompletion]) -> Result<usize, PollError> {
        let n = self.cq.poll(wcs)?;
        if n > 0 || wcs.is_empty() {
            return Ok(n);
        }
        self.ctx.progress();
        self.cq.poll(wcs)
    }

    /// Starts an extended poll, as [`Cq::start_poll`].
    pub fn start_poll(&mut self) -> Result<Option<PollBatch<'_>>, PollError> {
        if self.cq.is_empty() {
            self.ctx.progress();
        }
        self.cq.start_poll()
    }

    /// Resizes, as [`Cq::resize`].
    pub fn resize(&mut self, cqe: u32) -> Result<u32, Error> {
        Ok(self.cq.resize(cqe)?)
    }

    /// Destroys the CQ, refused (CQ handed back) while a QP uses it or an event is
    /// unacknowledged.
    pub fn destroy(self) -> Result<(), (LocalCq, Error)> {
        let LocalCq { ctx, cq, events } = self;
        cq.destroy()
            .map_err(|(cq, e)| (LocalCq { ctx, cq, events }, e.into()))
    }
}

/// What a QP holds of the CQ it completes into: the producer, and for a [`Cq`] the CQ
/// itself, so it cannot go away first.
#[derive(Clone)]
pub(crate) struct CqLink {
    pub(crate) ctx: Context,
    pub(crate) producer: CqProducer,
    pub(crate) _keep: Option<Arc<CqInner>>,
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Cq {}
    impl Sealed for super::LocalCq {}
}

/// A CQ a QP can complete into: [`Cq`] or [`LocalCq`] (sealed).
///
/// ```
/// use softverbs::{Context, DeviceConfig, QpType};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let shared = ctx.create_cq(8)?;
/// let local = ctx.cq_builder(8).build_single_threaded()?;
/// // Sends complete into the thread-safe CQ, receives into the single-threaded one.
/// let qp = ctx.alloc_pd().qp_builder(QpType::Rc, &shared, &local).build()?;
/// # drop(qp);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait AnyCq: sealed::Sealed {
    #[doc(hidden)]
    fn link(&self) -> CqLinkHandle;
}

/// Opaque: what [`AnyCq::link`] hands the QP builder.
#[doc(hidden)]
pub struct CqLinkHandle(pub(crate) CqLink);

impl AnyCq for Cq {
    fn link(&self) -> CqLinkHandle {
        CqLinkHandle(CqLink {
            ctx: self.inner.ctx.clone(),
            producer: self.inner.cq.producer(),
            _keep: Some(self.inner.clone()),
        })
    }
}

impl AnyCq for LocalCq {
    fn link(&self) -> CqLinkHandle {
        CqLinkHandle(CqLink {
            ctx: self.ctx.clone(),
            producer: self.cq.producer(),
            _keep: None,
        })
    }
}

/// A completion channel (`struct ibv_comp_channel`): CQs created with it put one event on
/// it per arming ([`Cq::req_notify`]); an event acknowledges itself when dropped. It is a
/// pollable file descriptor ([`AsFd`]).
///
/// ```
/// use softverbs::{Context, DeviceConfig};
/// use std::time::Duration;
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let channel = ctx.create_comp_channel()?;
/// let cq = ctx.cq_builder(16).channel(&channel).build()?;
/// cq.req_notify(false);
/// assert!(channel.get_event_timeout(Duration::ZERO)?.is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct CompChannel {
    pub(crate) ctx: Context,
    pub(crate) channel: CompletionChannel,
}

impl std::fmt::Debug for CompChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CompChannel").field(&self.channel).finish()
    }
}

impl CompChannel {
    pub(crate) fn new(ctx: &Context) -> Result<CompChannel, Error> {
        let channel = CompletionChannel::new()?;
        // A thread blocked in get_event receives the device's packets itself (one wake-up
        // per event, not two); the channel does not keep the device open.
        ctx.device().serve_channel_waits(&channel);
        Ok(CompChannel {
            ctx: ctx.clone(),
            channel,
        })
    }

    /// Waits for the next event (`ibv_get_cq_event(3)`); with the fd non-blocking, an
    /// empty channel gives `WouldBlock`.
    pub fn get_event(&self) -> Result<CqEvent, Error> {
        Ok(self.channel.get_event()?)
    }

    /// Takes an event without waiting: `None` if none is queued.
    pub fn try_get_event(&self) -> Result<Option<CqEvent>, Error> {
        Ok(self.channel.try_get_event()?)
    }

    /// Waits up to `timeout` for an event.
    pub fn get_event_timeout(&self, timeout: Duration) -> Result<Option<CqEvent>, Error> {
        Ok(self.channel.get_event_timeout(timeout)?)
    }

    /// Sets or clears `O_NONBLOCK` on the channel's fd.
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<(), Error> {
        Ok(self.channel.set_nonblocking(nonblocking)?)
    }

    /// How long a blocking [`CompChannel::get_event`] spins before sleeping.
    pub fn set_spin(&self, spin: Duration) {
        self.channel.set_spin(spin)
    }

    /// Events waiting to be taken.
    pub fn pending(&self) -> usize {
        self.channel.pending()
    }

    /// The CQs that use this channel.
    pub fn attached_cqs(&self) -> usize {
        self.channel.attached_cqs()
    }

    /// The context the channel belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The channel of the cq crate underneath.
    pub fn raw(&self) -> &CompletionChannel {
        &self.channel
    }

    /// Destroys this handle of the channel (`ibv_destroy_comp_channel(3)`), refused (the
    /// handle handed back) while a CQ uses the channel. The fd closes with the last handle.
    pub fn destroy(self) -> Result<(), (CompChannel, Error)> {
        match self.channel.check_unused() {
            Ok(()) => Ok(()),
            Err(e) => Err((self, e.into())),
        }
    }
}

impl AsFd for CompChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.channel.as_fd()
    }
}

impl AsRawFd for CompChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.channel.as_raw_fd()
    }
}

impl Context {
    /// A builder for a CQ of at least `cqe` entries (`ibv_create_cq_ex(3)`).
    pub fn cq_builder(&self, cqe: u32) -> CqBuilder {
        CqBuilder::new(self, cqe)
    }

    /// Creates a thread-safe CQ of at least `cqe` entries with no channel
    /// (`ibv_create_cq(3)`).
    pub fn create_cq(&self, cqe: u32) -> Result<Cq, Error> {
        self.cq_builder(cqe).build()
    }

    /// Creates a completion channel (`ibv_create_comp_channel(3)`).
    pub fn create_comp_channel(&self) -> Result<CompChannel, Error> {
        CompChannel::new(self)
    }
}
