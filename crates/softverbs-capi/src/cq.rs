//! Completion channels and completion queues.
//!
//! | function | version | status |
//! |---|---|---|
//! | `ibv_create_comp_channel`, `ibv_destroy_comp_channel` | 1.0 | real: the fd is a [`CompletionChannel`]'s fd (an epoll set holding its events' eventfd; pollable, honours `O_NONBLOCK`; non-blocking, it polls readable on the device's packets too, which a non-blocking `ibv_get_cq_event` then receives) |
//! | `ibv_create_cq`, `ibv_destroy_cq`, `ibv_resize_cq` | 1.1 | real |
//! | `ibv_get_cq_event`, `ibv_ack_cq_events` | 1.1 | real: events name the `struct ibv_cq *`; `ibv_destroy_cq` waits until every delivered event is acknowledged. Deviation: an event whose CQ is empty when it is taken is dropped and the CQ re-armed (see [`ibv_get_cq_event`]) |
//! | `ops.poll_cq`, `ops.req_notify_cq` | (ops) | real; an empty poll runs the device's progress once and polls again |
//! | `verbs_context.create_cq_ex` | (ops) | real: every `wc_flags` field, `SINGLE_THREADED` (accepted; the CQ stays thread-safe) and `IGNORE_OVERRUN` (overwrite) flags, `IBV_CQ_INIT_ATTR_MASK_PD` (a parent domain: the ring from its allocator, no consumer lock with a thread domain; see [`crate::pd`]) |
//! | `verbs_context.modify_cq` | (ops) | real: moderation (`cq_count`, `cq_period`) |
//! | `ibv_cq_ex` `start_poll` / `next_poll` / `end_poll` / `read_*` | (ops) | real; a field not requested at creation reads as 0 |
//!
//! A CQ block begins with a full `struct ibv_cq_ex` for both kinds of CQ (an `ibv_cq` is its
//! first 128 bytes), so every entry point takes either pointer.

use crate::abi::*;
use crate::boundary::{errno_code, errno_of, guarded, infallible, minus_one, pointer, Errno};
use crate::handles::{
    once_acknowledged, with_registry, Block, ChannelBlock, ChannelState, ContextBlock, DeviceEntry,
    Tagged, DESTROY_ACK_WAIT,
};
use crate::pd::{cq_in_domain, CqInDomain, DomainHold};
use crate::verbs_h::{
    IBV_CQ_ATTR_MODERATE, IBV_CQ_INIT_ATTR_MASK_FLAGS, IBV_CQ_INIT_ATTR_MASK_PD,
    IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN, IBV_CREATE_CQ_ATTR_SINGLE_THREADED,
    IBV_CREATE_CQ_SUP_WC_FLAGS,
};
use softverbs::core::cq::{
    CompletionChannel, CompletionQueue, CqBuilder, Moderation, OverrunPolicy, OverrunSink,
    PollBatch,
};
use softverbs::core::device::AsyncEvent;
use std::cell::UnsafeCell;
use std::ffi::{c_int, c_uint, c_void};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;

/// The library's part of a CQ.
pub struct CqState {
    /// The extended poll in progress (`start_poll` … `end_poll`). Declared before `cq`,
    /// which it borrows, so it is dropped first.
    batch: UnsafeCell<Option<PollBatch<'static>>>,
    /// The queue.
    pub cq: CompletionQueue,
    /// The device (progress on an empty poll, async events).
    pub entry: &'static DeviceEntry,
    /// The channel C named at creation (its `refcnt` is ours to keep).
    channel: *mut ibv_comp_channel,
    /// The mode of the last `ibv_req_notify_cq` (re-armed when a stale event is dropped).
    solicited_only: AtomicBool,
    /// Created in a parent domain with a thread domain: the consumer paths take no lock.
    thread_domain: bool,
    /// The hold on the parent domain it was created in (after `cq`: dropped after it).
    _domain: Option<DomainHold>,
}

impl CqState {
    /// Polls, without the consumer lock in a thread domain.
    fn poll(&self, wcs: &mut [ibv_wc]) -> Result<usize, softverbs::core::Error> {
        if self.thread_domain {
            // SAFETY: a CQ in a thread domain: the application accesses it from one thread
            // at a time (`ibv_alloc_td(3)`: objects under a thread domain "disable internal
            // locking designed to protect against concurrent access"), so no other consumer
            // call runs now.
            Ok(unsafe { self.cq.poll_unsynchronized(wcs) }?)
        } else {
            Ok(self.cq.poll(wcs)?)
        }
    }

    /// Starts an extended poll, without the consumer lock in a thread domain.
    fn start_poll(&self) -> Result<Option<PollBatch<'_>>, softverbs::core::Error> {
        if self.thread_domain {
            // SAFETY: as in `poll`: the thread-domain promise covers the whole window.
            Ok(unsafe { self.cq.start_poll_unsynchronized() }?)
        } else {
            Ok(self.cq.start_poll()?)
        }
    }

    /// Resizes, without the consumer lock in a thread domain.
    fn resize(&self, cqe: u32) -> Result<u32, softverbs::core::Error> {
        if self.thread_domain {
            // SAFETY: as in `poll`.
            Ok(unsafe { self.cq.resize_unsynchronized(cqe) }?)
        } else {
            Ok(self.cq.resize(cqe)?)
        }
    }
}

impl Tagged for CqState {
    const MAGIC: u64 = u64::from_be_bytes(*b"svcq\0\0\0\x01");
}

/// A CQ as C sees it, followed by its state. [`Block::state`] takes an `ibv_cq *` or an
/// `ibv_cq_ex *` (an `ibv_cq` is the first 128 bytes of an `ibv_cq_ex`).
pub type CqBlock = Block<ibv_cq_ex, CqState>;

/// What creation asked for, from either `ibv_create_cq` or `ibv_create_cq_ex`.
struct CqRequest {
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
    wc_flags: u64,
    ignore_overrun: bool,
    extended: bool,
    /// The parent domain's part (`IBV_CQ_INIT_ATTR_MASK_PD`).
    domain: Option<CqInDomain>,
}

/// Creates a CQ block for `context`.
///
/// # Safety
///
/// The handle contract ([`crate::handles`]): `context` is NULL or an open context;
/// `request.channel` is NULL or a live channel.
unsafe fn create(context: *mut ibv_context, request: CqRequest) -> Result<*mut ibv_cq_ex, Errno> {
    // SAFETY: `context` is NULL or an open context (this function's `# Safety`).
    let ctx = unsafe { ContextBlock::from_ptr(context) }?;
    let entry = ctx.entry;
    // SAFETY: `context` passed `ContextBlock::from_ptr`, so it points at a live
    // `ibv_context`; `num_comp_vectors` is its own field.
    let vectors = unsafe { (*context).num_comp_vectors };
    if request.comp_vector < 0 || request.comp_vector >= vectors {
        return Err(libc::EINVAL);
    }
    // The device entry lives for the process, so the sink can hold it.
    let sink: OverrunSink = Arc::new(move |overrun| {
        entry.device.async_events().push(AsyncEvent::from(overrun));
    });
    // The CQ core refuses a size outside 1..=max_cqe (EINVAL); a negative `cqe` becomes a
    // size above it.
    let mut builder = CqBuilder::new(request.cqe as u32)
        .raw_fields(request.wc_flags)
        .comp_vector(request.comp_vector as u32)
        .overrun_sink(sink);
    if request.ignore_overrun {
        builder = builder.overrun(OverrunPolicy::Overwrite);
    }
    let (thread_domain, domain) = match request.domain {
        Some(domain) => {
            if let Some(allocator) = domain.allocator {
                builder = builder.allocator(allocator);
            }
            (domain.thread_domain, Some(domain.hold))
        }
        None => (false, None),
    };
    if !request.channel.is_null() {
        // SAFETY: `request.channel` is a live completion channel (this function's
        // `# Safety`; not NULL here).
        let channel = unsafe { ChannelBlock::state(request.channel) }?;
        builder = builder.channel(&channel.inner);
    }
    let cq = builder.build().map_err(errno_of)?;
    let capacity = cq.capacity();
    let ops = extended_ops(request.extended);
    let c = ibv_cq_ex {
        context,
        channel: request.channel,
        cq_context: request.cq_context,
        handle: cq.id() as u32,
        cqe: capacity.min(i32::MAX as u32) as c_int,
        mutex: PthreadMutex::default(),
        cond: PthreadCond::default(),
        comp_events_completed: 0,
        async_events_completed: 0,
        comp_mask: 0,
        status: 0,
        wr_id: 0,
        ..ops
    };
    let ptr = CqBlock::allocate(
        c,
        CqState {
            batch: UnsafeCell::new(None),
            cq,
            entry,
            channel: request.channel,
            solicited_only: AtomicBool::new(false),
            thread_domain,
            _domain: domain,
        },
    );
    // SAFETY: `ptr` was just returned by `CqBlock::allocate` and C does not have it yet.
    let state = unsafe { CqBlock::state(ptr) }?;
    // Events and async events name the CQ by the pointer C knows.
    state.cq.set_user_context(ptr as u64);
    with_registry(|r| r.cqs.insert(ptr as usize));
    if !request.channel.is_null() {
        // SAFETY: `refcnt` is a live int of the channel; libibverbs updates it under the
        // context mutex, we update it atomically.
        unsafe { AtomicI32::from_ptr(&raw mut (*request.channel).refcnt) }
            .fetch_add(1, Ordering::Relaxed);
    }
    Ok(ptr)
}

/// The extended-poll ops of an `ibv_cq_ex` (`None` for a plain `ibv_cq`, whose struct ends
/// before them), with the other fields zeroed.
fn extended_ops(extended: bool) -> ibv_cq_ex {
    let mut c = ibv_cq_ex {
        context: std::ptr::null_mut(),
        channel: std::ptr::null_mut(),
        cq_context: std::ptr::null_mut(),
        handle: 0,
        cqe: 0,
        mutex: PthreadMutex::default(),
        cond: PthreadCond::default(),
        comp_events_completed: 0,
        async_events_completed: 0,
        comp_mask: 0,
        status: 0,
        wr_id: 0,
        start_poll: None,
        next_poll: None,
        end_poll: None,
        read_opcode: None,
        read_vendor_err: None,
        read_byte_len: None,
        read_imm_data: None,
        read_qp_num: None,
        read_src_qp: None,
        read_wc_flags: None,
        read_slid: None,
        read_sl: None,
        read_dlid_path_bits: None,
        read_completion_ts: None,
        read_cvlan: None,
        read_flow_tag: None,
        read_tm_info: None,
        read_completion_wallclock_ns: None,
    };
    if extended {
        c.start_poll = Some(start_poll);
        c.next_poll = Some(next_poll);
        c.end_poll = Some(end_poll);
        c.read_opcode = Some(read_opcode);
        c.read_vendor_err = Some(read_vendor_err);
        c.read_byte_len = Some(read_byte_len);
        c.read_imm_data = Some(read_imm_data);
        c.read_qp_num = Some(read_qp_num);
        c.read_src_qp = Some(read_src_qp);
        c.read_wc_flags = Some(read_wc_flags);
        c.read_slid = Some(read_slid);
        c.read_sl = Some(read_sl);
        c.read_dlid_path_bits = Some(read_dlid_path_bits);
        c.read_completion_ts = Some(read_completion_ts);
        c.read_cvlan = Some(read_cvlan);
        c.read_flow_tag = Some(read_flow_tag);
        c.read_tm_info = Some(read_tm_info);
        c.read_completion_wallclock_ns = Some(read_completion_wallclock_ns);
    }
    c
}

/// `ibv_create_comp_channel(3)`: `NULL` with errno on failure.
///
/// # Safety
///
/// `context` is NULL or an open context.
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    pointer(|| {
        // SAFETY: `context` is NULL or an open context (this function's `# Safety`).
        let ctx = unsafe { ContextBlock::from_ptr(context) }?;
        let inner = CompletionChannel::new().map_err(errno_of)?;
        // A thread blocked in ibv_get_cq_event receives the device's packets itself.
        ctx.entry.device.serve_channel_waits(&inner);
        let channel = ibv_comp_channel {
            context,
            fd: inner.as_raw_fd(),
            refcnt: 0,
        };
        Ok(ChannelBlock::allocate(channel, ChannelState { inner }))
    })
}
symver!(ibv_create_comp_channel, "IBVERBS_1.0");

/// `ibv_destroy_comp_channel(3)`: `EBUSY` while a CQ uses the channel, else 0 (the fd is
/// closed).
///
/// # Safety
///
/// `channel` is NULL or a channel from `ibv_create_comp_channel`, not used again after a
/// successful call.
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    errno_code(|| {
        // SAFETY: `channel` is NULL or a live completion channel (this function's `# Safety`).
        let block = unsafe { ChannelBlock::state(channel) }?;
        // The CQ core's rule: no CQ may still use the channel (`EBUSY`).
        block.inner.check_unused().map_err(errno_of)?;
        // SAFETY: `channel` passed `state` above, `block` is not used again, and the
        // caller gives the channel up with this call.
        unsafe { ChannelBlock::free(channel) };
        Ok(())
    })
}
symver!(ibv_destroy_comp_channel, "IBVERBS_1.0");

/// `ibv_create_cq(3)`: a CQ of at least `cqe` entries (`cq->cqe` says how many), `NULL`
/// with `EINVAL` for a size outside `1..=max_cqe` or a bad completion vector.
///
/// # Safety
///
/// `context` is NULL or an open context; `channel` is NULL or a live channel.
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    pointer(|| {
        let request = CqRequest {
            cqe,
            cq_context,
            channel,
            comp_vector,
            wc_flags: softverbs::core::cq::WcFields::STANDARD.bits(),
            ignore_overrun: false,
            extended: false,
            domain: None,
        };
        // SAFETY: `context` and `channel` are NULL or live (this function's `# Safety`),
        // which is all `create` asks.
        Ok(unsafe { create(context, request) }?.cast())
    })
}
symver!(ibv_create_cq, "IBVERBS_1.1");

/// `verbs_context.create_cq_ex` (`ibv_create_cq_ex(3)`).
///
/// # Safety
///
/// `context` is NULL or an open context; `attr` is NULL or readable, its `channel` NULL or
/// a live channel, its `parent_domain` (with `IBV_CQ_INIT_ATTR_MASK_PD`) NULL or a live PD.
pub unsafe extern "C" fn create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    pointer(|| {
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: `attr` is readable (this function's `# Safety`; not NULL here).
        let attr = unsafe { attr.read() };
        if attr.comp_mask & !(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD) != 0 {
            return Err(libc::EINVAL);
        }
        if attr.wc_flags & !IBV_CREATE_CQ_SUP_WC_FLAGS != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let flags = if attr.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 {
            attr.flags
        } else {
            0
        };
        if flags & !(IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN) != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let domain = if attr.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 {
            // ibv_create_cq_ex(3): "parent_domain: the CQ will be created in this parent
            // domain"; anything but a parent domain of this context is EINVAL.
            // SAFETY: `attr.parent_domain` is NULL or a live PD (this function's
            // `# Safety`).
            Some(unsafe { cq_in_domain(attr.parent_domain, context) }?)
        } else {
            None
        };
        let request = CqRequest {
            cqe: attr.cqe.min(i32::MAX as u32) as c_int,
            cq_context: attr.cq_context,
            channel: attr.channel,
            comp_vector: attr.comp_vector.min(i32::MAX as u32) as c_int,
            wc_flags: attr.wc_flags,
            ignore_overrun: flags & IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN != 0,
            extended: true,
            domain,
        };
        // SAFETY: `context` and `attr.channel` are NULL or live (this function's
        // `# Safety`), which is all `create` asks.
        unsafe { create(context, request) }
    })
}

/// `ibv_destroy_cq(3)`: `EBUSY` while a QP uses the CQ; otherwise waits until every event
/// `ibv_get_cq_event` delivered is acknowledged (as libibverbs does), then frees it.
///
/// # Safety
///
/// `cq` is NULL or a live CQ, not used again after a successful call.
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    errno_code(|| {
        // SAFETY: `cq` is NULL or a live CQ (this function's `# Safety`).
        let state = unsafe { CqBlock::state(cq) }?;
        state.cq.check_unused().map_err(errno_of)?;
        // Its delivered async events acknowledged (IBV_EVENT_CQ_ERR), it leaves the
        // registry: no later event names it.
        let object = cq as usize;
        once_acknowledged(object, DESTROY_ACK_WAIT, |r| r.cqs.remove(&object))?;
        // Wait for the delivered events to be acknowledged while the block is still alive:
        // the acknowledgements come through it (`ibv_ack_cq_events` from other threads).
        if let Err(e) = state.cq.destroy_wait_in_place(DESTROY_ACK_WAIT) {
            with_registry(|r| r.cqs.insert(object));
            return Err(errno_of(e));
        }
        let (channel, entry, cq_id) = (state.channel, state.entry, state.cq.id());
        // SAFETY: destroyed; the caller gives the CQ up (a poll in progress on another
        // thread would be the caller's use-after-destroy).
        unsafe { CqBlock::free(cq) };
        // Its unread IBV_EVENT_CQ_ERR goes with it: a CQ later allocated at the same
        // address must not receive it.
        entry.device.cq_destroyed(cq_id);
        if !channel.is_null() {
            // SAFETY: the channel outlives its CQs (its destroy refuses while refcnt > 0).
            unsafe { AtomicI32::from_ptr(&raw mut (*channel).refcnt) }
                .fetch_sub(1, Ordering::Relaxed);
        }
        Ok(())
    })
}
symver!(ibv_destroy_cq, "IBVERBS_1.1");

/// `ibv_resize_cq(3)`: at least `cqe` entries, every unpolled completion kept in order;
/// `cq->cqe` is updated.
///
/// # Safety
///
/// `cq` is NULL or a live CQ.
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    errno_code(|| {
        // SAFETY: `cq` is NULL or a live CQ (this function's `# Safety`).
        let state = unsafe { CqBlock::state(cq) }?;
        // The CQ core refuses a size outside 1..=max_cqe (EINVAL; a negative `cqe` becomes
        // a size above it) or below the unpolled completions.
        let capacity = state.resize(cqe as u32).map_err(errno_of)?;
        // SAFETY: `cqe` is a field of the live CQ; C reads it, only the library writes it.
        unsafe { (&raw mut (*cq).cqe).write(capacity.min(i32::MAX as u32) as c_int) };
        Ok(())
    })
}
symver!(ibv_resize_cq, "IBVERBS_1.1");

/// `ibv_get_cq_event(3)`: waits for the next event on `channel` (or `EAGAIN` on a
/// non-blocking fd), returning its CQ and that CQ's `cq_context`. 0, or -1 with errno.
///
/// # Safety
///
/// `channel` is NULL or a live channel; `cq` and `cq_context` are writable.
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    minus_one(|| {
        // SAFETY: `channel` is NULL or a live completion channel (this function's `# Safety`).
        let block = unsafe { ChannelBlock::state(channel) }?;
        if cq.is_null() || cq_context.is_null() {
            return Err(libc::EINVAL);
        }
        let ptr = loop {
            let event = block.inner.get_event().map_err(errno_of)?;
            // The CQ's user context is its C pointer (set at creation).
            let ptr = event.user_context() as *mut ibv_cq;
            // SAFETY: the CQ is alive: its destroy waits for this event to be acknowledged.
            let state = unsafe { CqBlock::state(ptr) }?;
            if !state.cq.is_empty() {
                event.into_unacknowledged();
                break ptr;
            }
            // A stale event: the completion that raised it was polled already (the
            // application re-armed, then polled a completion that arrived after the
            // re-arm). Programs such as `ibv_rc_pingpong -e -t` treat an empty CQ right
            // after an event as fatal, so the event is dropped
            // (acknowledged here) and the arm it consumed restored; if a completion came
            // in meanwhile the event is delivered after all.
            if state
                .cq
                .req_notify_and_check(state.solicited_only.load(Ordering::Relaxed))
            {
                event.into_unacknowledged();
                break ptr;
            }
            drop(event);
        };
        // SAFETY: the CQ is alive: its destroy waits for this event to be acknowledged;
        // `cq` and `cq_context` are writable (this function's `# Safety`).
        unsafe {
            let context = (&raw const (*ptr).cq_context).read();
            cq.write(ptr);
            cq_context.write(context);
        }
        Ok(0)
    })
}
symver!(ibv_get_cq_event, "IBVERBS_1.1");

/// `ibv_ack_cq_events(3)`: acknowledges `nevents` events of `cq`.
///
/// # Safety
///
/// `cq` is NULL or a live CQ.
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    infallible((), || {
        // SAFETY: `cq` is NULL or a live CQ (this function's `# Safety`).
        if let Ok(state) = unsafe { CqBlock::state(cq) } {
            // SAFETY: the live CQ's counter, which only the library writes.
            unsafe {
                let counter = &raw mut (*cq).comp_events_completed;
                counter.write(counter.read().wrapping_add(nevents));
            }
            state.cq.ack_events(nevents);
        }
    })
}
symver!(ibv_ack_cq_events, "IBVERBS_1.1");

/// `ops.poll_cq` (`ibv_poll_cq(3)`): up to `num_entries` completions into `wc`, the count,
/// or a negative value when the CQ overran (it is then in error, and `IBV_EVENT_CQ_ERR` was
/// raised). An empty CQ runs the device's progress once and is polled again.
///
/// # Safety
///
/// `cq` is NULL or a live CQ; `wc` is writable for `num_entries` entries.
pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    let result = guarded(|| {
        // SAFETY: `cq` is NULL or a live CQ (this function's `# Safety`).
        let state = unsafe { CqBlock::state(cq) }?;
        if num_entries <= 0 || wc.is_null() {
            return if num_entries == 0 {
                Ok(0)
            } else {
                Err(libc::EINVAL)
            };
        }
        // SAFETY: `wc` is writable for `num_entries` entries (this function's `# Safety`;
        // not NULL and `num_entries > 0` here); `ibv_wc` is `WorkCompletion`, which has no
        // invalid bit patterns the poll could read.
        let wcs = unsafe { std::slice::from_raw_parts_mut(wc, num_entries as usize) };
        let mut n = state.poll(wcs).map_err(errno_of)?;
        if n == 0 {
            state.entry.device.progress();
            n = state.poll(wcs).map_err(errno_of)?;
        }
        Ok(n as c_int)
    });
    result.unwrap_or_else(|e| -e)
}

/// `ops.req_notify_cq` (`ibv_req_notify_cq(3)`): arms the CQ for its next completion
/// (`solicited_only` = 0) or next solicited or error completion. 0 or an errno value.
///
/// # Safety
///
/// `cq` is NULL or a live CQ.
pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    errno_code(|| {
        // SAFETY: `cq` is NULL or a live CQ (this function's `# Safety`).
        let state = unsafe { CqBlock::state(cq) }?;
        state
            .solicited_only
            .store(solicited_only != 0, Ordering::Relaxed);
        state.cq.req_notify(solicited_only != 0);
        Ok(())
    })
}

/// `verbs_context.modify_cq` (`ibv_modify_cq(3)`): CQ moderation.
///
/// # Safety
///
/// `cq` is NULL or a live CQ; `attr` is NULL or readable.
pub unsafe extern "C" fn modify_cq(cq: *mut ibv_cq, attr: *mut ibv_modify_cq_attr) -> c_int {
    errno_code(|| {
        // SAFETY: `cq` is NULL or a live CQ (this function's `# Safety`).
        let state = unsafe { CqBlock::state(cq) }?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: `attr` is readable (this function's `# Safety`; not NULL here).
        let attr = unsafe { attr.read() };
        if attr.attr_mask & !IBV_CQ_ATTR_MODERATE != 0 {
            return Err(libc::EINVAL);
        }
        if attr.attr_mask & IBV_CQ_ATTR_MODERATE != 0 {
            let moderation = Moderation {
                count: attr.moderate.cq_count,
                period_us: attr.moderate.cq_period,
            };
            state.cq.modify(moderation).map_err(errno_of)?;
        }
        Ok(())
    })
}

// ------------------------------------------------------------------- extended polling

/// The batch slot of a CQ, for the extended-poll ops.
///
/// # Safety
///
/// `cq` is a live extended CQ, and only the thread inside its `start_poll` … `end_poll`
/// window uses the slot (libibverbs' rule for the extended poll).
#[allow(clippy::mut_from_ref)]
unsafe fn batch_slot(state: &CqState) -> &mut Option<PollBatch<'static>> {
    // SAFETY: only the thread inside the `start_poll` … `end_poll` window uses the slot
    // (this function's `# Safety`), so this is the one reference to it.
    unsafe { &mut *state.batch.get() }
}

/// Stores the current completion's `wr_id` and `status` in the C struct, where the
/// inline readers find them.
///
/// # Safety
///
/// `cq` is a live CQ.
unsafe fn publish(cq: *mut ibv_cq_ex, batch: &PollBatch<'_>) {
    // SAFETY: `cq` points at a live `ibv_cq_ex` (this function's `# Safety`); `wr_id` and
    // `status` are written only by the library, inside the poll window.
    unsafe {
        (&raw mut (*cq).wr_id).write(batch.wr_id());
        (&raw mut (*cq).status).write(batch.status().to_raw());
    }
}

/// `ibv_start_poll(3)`: 0 and the first completion, `ENOENT` when the CQ is empty (no
/// `end_poll` then), `EINVAL` for a non-zero `attr->comp_mask`, `EIO` when the CQ overran.
unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    let result = guarded(|| {
        // SAFETY: `cq` is a live extended CQ: C reaches the extended-poll ops only through
        // the function pointers of a live CQ's `ibv_cq_ex` (the handle contract).
        let state = unsafe { CqBlock::state(cq) }?;
        // SAFETY: `attr` is NULL or readable (libibverbs requires it to be valid).
        if !attr.is_null() && unsafe { attr.read() }.comp_mask != 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: this thread is the one opening the window (`ibv_start_poll(3)`: one
        // poller per CQ between `start_poll` and `end_poll`).
        let slot = unsafe { batch_slot(state) };
        if slot.is_some() {
            return Err(libc::EINVAL);
        }
        let mut batch = state.start_poll().map_err(errno_of)?;
        if batch.is_none() {
            state.entry.device.progress();
            batch = state.start_poll().map_err(errno_of)?;
        }
        let Some(batch) = batch else {
            return Err(libc::ENOENT);
        };
        // SAFETY: `cq` passed `CqBlock::state` above.
        unsafe { publish(cq, &batch) };
        // SAFETY: the batch borrows `state.cq`, which lives in the heap block until
        // `ibv_destroy_cq`; the batch slot is emptied (end_poll) or dropped before it.
        let batch: PollBatch<'static> = unsafe { std::mem::transmute(batch) };
        *slot = Some(batch);
        Ok(())
    });
    result.err().unwrap_or(0)
}

/// `ibv_next_poll(3)`: 0 and the next completion, or `ENOENT`.
unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    let result = guarded(|| {
        // SAFETY: `cq` is a live extended CQ, as in `start_poll`.
        let state = unsafe { CqBlock::state(cq) }?;
        // SAFETY: `next_poll` is called by the thread inside the window (`ibv_next_poll(3)`).
        let slot = unsafe { batch_slot(state) };
        let batch = slot.as_mut().ok_or(libc::EINVAL)?;
        if !batch.next() {
            return Err(libc::ENOENT);
        }
        // SAFETY: `cq` passed `CqBlock::state` above.
        unsafe { publish(cq, batch) };
        Ok(())
    });
    result.err().unwrap_or(0)
}

/// `ibv_end_poll(3)`: consumes the completions of the window.
unsafe extern "C" fn end_poll(cq: *mut ibv_cq_ex) {
    infallible((), || {
        // SAFETY: `cq` is a live extended CQ, as in `start_poll`.
        if let Ok(state) = unsafe { CqBlock::state(cq) } {
            // SAFETY: `end_poll` is called by the thread inside the window, and closes it.
            drop(unsafe { batch_slot(state) }.take());
        }
    })
}

/// Reads a field of the current completion; 0 outside a window or for a field not
/// requested at creation (the man page leaves those undefined; 0 is never stale data).
fn read<T: Default>(cq: *mut ibv_cq_ex, f: impl FnOnce(&mut PollBatch<'static>) -> T) -> T {
    infallible(T::default(), || {
        // SAFETY: `cq` is a live extended CQ, as in `start_poll`: the readers too are
        // reached only through a live CQ's `ibv_cq_ex`.
        let Ok(state) = (unsafe { CqBlock::state(cq) }) else {
            return T::default();
        };
        // SAFETY: the readers are called by the thread inside the window
        // (`ibv_wc_read_opcode(3)` …).
        match unsafe { batch_slot(state) } {
            Some(batch) => f(batch),
            None => T::default(),
        }
    })
}

unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> u32 {
    read(cq, |b| b.opcode().to_raw())
}
unsafe extern "C" fn read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    read(cq, |b| b.vendor_err())
}
unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    read(cq, |b| b.byte_len().unwrap_or(0))
}
unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    // `ibv_wc_read_imm_data` returns network order; `ibv_wc_read_invalidated_rkey` reads
    // the same slot (host order, which is what the raw word holds for an rkey).
    read(cq, |b| {
        if b.wc_flags()
            .contains(softverbs::core::cq::WcFlags::WITH_INV)
        {
            b.invalidated_rkey().unwrap_or(0)
        } else {
            b.imm_data_raw().unwrap_or(0)
        }
    })
}
unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    read(cq, |b| b.qp_num().unwrap_or(0))
}
unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    read(cq, |b| b.src_qp().unwrap_or(0))
}
unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> c_uint {
    read(cq, |b| b.wc_flags().bits())
}
unsafe extern "C" fn read_slid(cq: *mut ibv_cq_ex) -> u32 {
    read(cq, |b| b.slid().unwrap_or(0))
}
unsafe extern "C" fn read_sl(cq: *mut ibv_cq_ex) -> u8 {
    read(cq, |b| b.sl().unwrap_or(0))
}
unsafe extern "C" fn read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8 {
    read(cq, |b| b.dlid_path_bits().unwrap_or(0))
}
unsafe extern "C" fn read_completion_ts(cq: *mut ibv_cq_ex) -> u64 {
    read(cq, |b| b.completion_ts().unwrap_or(0))
}
unsafe extern "C" fn read_completion_wallclock_ns(cq: *mut ibv_cq_ex) -> u64 {
    read(cq, |b| b.completion_wallclock_ns().unwrap_or(0))
}
unsafe extern "C" fn read_cvlan(cq: *mut ibv_cq_ex) -> u16 {
    read(cq, |b| b.cvlan().unwrap_or(0))
}
unsafe extern "C" fn read_flow_tag(cq: *mut ibv_cq_ex) -> u32 {
    read(cq, |b| b.flow_tag().unwrap_or(0))
}
unsafe extern "C" fn read_tm_info(cq: *mut ibv_cq_ex, info: *mut ibv_wc_tm_info) {
    let (tag, priv_) = read(cq, |b| b.tm_info().unwrap_or((0, 0)));
    if !info.is_null() {
        // SAFETY: non-NULL; the caller passes a writable struct.
        unsafe { info.write(ibv_wc_tm_info { tag, priv_ }) };
    }
}
