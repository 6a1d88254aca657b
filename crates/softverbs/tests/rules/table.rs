//! The verbs rules issue #12 asks both front doors to keep, written once, as data.
//!
//! Each [`Rule`] is a short name, an input ([`Case`]), the outcome libibverbs documents
//! ([`Expect`]: success, an errno, a completion status, completion or asynchronous events,
//! a wait), what the safe API says about it ([`SafeApi`]: the typed error variant
//! expected, what it does instead by design, a discrepancy found, or why the case cannot
//! be written with its types), whether the drop-in keeps it ([`DropIn`]: it does, or a
//! discrepancy found) and the man-page citation. Two runners interpret the table:
//! * `crates/softverbs/tests/rule_table.rs`, through the safe Rust API;
//! * `crates/softverbs-capi/tests/rule_table.rs`, through the drop-in `libibverbs.so.1`'s
//!   exported functions (it includes this file by path).
//!
//! A front door that forgets a rule fails its runner. Sizes that depend on the device
//! ([`Amount`]) are resolved against what the device reports (`ibv_query_device(3)`), so
//! the table holds no limit of its own. The device has one port (1), a GID table of one
//! entry (index 0) and a P_Key table of one entry (index 0).
//!
//! Every rule of the drop-in's C rule programs (`crates/softverbs-capi/tests/c/`:
//! `cq_rules.c`, `async_events.c`, `protection.c`, `attributes.c`, `registration.c`) is a
//! row here. Waits are bounded: a positive wait (something must happen) gives up after
//! [`WAIT`], a negative one (nothing may happen) looks for [`QUIET`], and every polling
//! loop also after [`MAX_ITERS`] rounds, as the C programs' `WAIT_MS`, `QUIET_MS` and
//! `MAX_ITERS`.
//!
//! Plain data, std only.

// Each runner reads the parts it needs: the safe runner never reads the drop-in-only
// notes and the drop-in runner never reads the safe API's causes.
#![allow(dead_code)]

use std::time::Duration;

/// `EINVAL` (`<errno.h>`).
pub const EINVAL: i32 = 22;
/// `EBUSY` (`<errno.h>`).
pub const EBUSY: i32 = 16;
/// `EIO` (`<errno.h>`).
pub const EIO: i32 = 5;
/// `EAGAIN` (`<errno.h>`).
pub const EAGAIN: i32 = 11;
/// `ENOMEM` (`<errno.h>`).
pub const ENOMEM: i32 = 12;
/// `EFAULT` (`<errno.h>`).
pub const EFAULT: i32 = 14;
/// `EOPNOTSUPP` (`<errno.h>`).
pub const EOPNOTSUPP: i32 = 95;

/// Longest a positive wait lasts (a completion, an event, a destroy returning).
pub const WAIT: Duration = Duration::from_secs(10);
/// How long a negative wait looks (no event may come, a destroy must still be waiting).
pub const QUIET: Duration = Duration::from_millis(200);
/// Every polling loop of the runners also stops after this many rounds (`MAX_ITERS`).
pub const MAX_ITERS: u32 = 2_000_000;

/// The outcome libibverbs documents for a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The call succeeds.
    Ok,
    /// The call fails with this errno (set in `errno` by a call returning a pointer,
    /// returned by one returning `int`, the negated return value of `ibv_poll_cq(3)`).
    Errno(i32),
    /// The work request is posted (0) and its work completion has this status
    /// (`ibv_poll_cq(3)`).
    Completes(Status),
    /// The case's steps put exactly this many completion events on the CQ's channel
    /// (`ibv_get_cq_event(3)`), each naming the CQ and its `cq_context`.
    CompletionEvents(u32),
    /// An asynchronous event of this type names the case's object
    /// (`ibv_get_async_event(3)`: `element`).
    AsyncEvent(EventType),
    /// No asynchronous event names the case's object.
    NoAsyncEvent,
    /// The destroy under test does not return while an event of its object is delivered
    /// and unacknowledged (it is still waiting after [`QUIET`]), and returns 0 within
    /// [`WAIT`] once the event is acknowledged.
    WaitsForAck,
    /// The reader has no value to give (a completion field not requested at creation): the
    /// drop-in's reader returns 0, the safe API's refuses (its cause).
    NoValue,
}

impl Expect {
    /// Whether the safe API reports this outcome as a typed error (a cause).
    pub const fn is_refusal(self) -> bool {
        matches!(self, Expect::Errno(_) | Expect::NoValue)
    }
}

/// A work completion status (`enum ibv_wc_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// `IBV_WC_SUCCESS`.
    Success,
    /// `IBV_WC_LOC_PROT_ERR`.
    LocProtErr,
    /// `IBV_WC_REM_ACCESS_ERR`.
    RemAccessErr,
}

/// An asynchronous event type (`enum ibv_event_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// `IBV_EVENT_CQ_ERR`: `element.cq`.
    CqErr,
    /// `IBV_EVENT_QP_ACCESS_ERR`: `element.qp`.
    QpAccessErr,
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: `element.srq`.
    SrqLimitReached,
}

/// A size given relative to the device's limit for it, resolved by each runner from the
/// device's own answer (`ibv_query_device(3)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Amount {
    /// Exactly this many.
    Value(u32),
    /// The device's maximum.
    DeviceMax,
    /// One above the device's maximum.
    AboveDeviceMax,
}

impl Amount {
    /// The number this stands for on a device whose limit is `max`.
    pub fn resolve(self, max: u32) -> u32 {
        match self {
            Amount::Value(v) => v,
            Amount::DeviceMax => max,
            Amount::AboveDeviceMax => max.saturating_add(1),
        }
    }
}

/// A QP transport service type (`enum ibv_qp_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpKind {
    /// `IBV_QPT_RC`.
    Rc,
    /// `IBV_QPT_UC`.
    Uc,
    /// `IBV_QPT_UD`.
    Ud,
}

/// A QP state (`enum ibv_qp_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpStateName {
    /// `IBV_QPS_RESET`.
    Reset,
    /// `IBV_QPS_INIT`.
    Init,
    /// `IBV_QPS_RTR`.
    Rtr,
    /// `IBV_QPS_RTS`.
    Rts,
}

/// Memory access rights (`enum ibv_access_flags`), as bits with the `verbs.h` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access(pub u32);

impl Access {
    /// No access beyond local read.
    pub const NONE: Access = Access(0);
    /// `IBV_ACCESS_LOCAL_WRITE`.
    pub const LOCAL_WRITE: Access = Access(1 << 0);
    /// `IBV_ACCESS_REMOTE_WRITE`.
    pub const REMOTE_WRITE: Access = Access(1 << 1);
    /// `IBV_ACCESS_REMOTE_READ`.
    pub const REMOTE_READ: Access = Access(1 << 2);
    /// `IBV_ACCESS_REMOTE_ATOMIC`.
    pub const REMOTE_ATOMIC: Access = Access(1 << 3);

    /// Both sets of rights.
    pub const fn with(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }
}

/// A send opcode (`enum ibv_wr_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opcode {
    /// `IBV_WR_SEND`.
    Send,
    /// `IBV_WR_RDMA_WRITE`.
    RdmaWrite,
    /// `IBV_WR_RDMA_READ`.
    RdmaRead,
}

/// The kind of object that keeps a PD in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PdUser {
    /// A memory region (`ibv_reg_mr`).
    Mr,
    /// A queue pair (`ibv_create_qp`).
    Qp,
    /// A shared receive queue (`ibv_create_srq`).
    Srq,
    /// An address handle (`ibv_create_ah`).
    Ah,
    /// A memory window, type 1 (`ibv_alloc_mw`).
    Mw,
}

/// How a CQ is used by the QPs of [`Case::DestroyCqInUse`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CqRole {
    /// The QPs' send CQ (their receive CQ is another).
    Send,
    /// The QPs' receive CQ (their send CQ is another).
    Recv,
    /// Both.
    Both,
}

/// One step of [`Case::CompletionEvents`], on a CQ with a completion channel that is the
/// receive CQ of an RC QP connected to itself (its send CQ is another).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CqStep {
    /// `ibv_req_notify_cq(cq, solicited_only)`.
    Arm {
        /// Only solicited (or unsuccessful) completions fire the event.
        solicited_only: bool,
    },
    /// A SEND is received: a receive completes successfully (the SEND carries
    /// `IBV_SEND_SOLICITED` if `solicited`). The runner waits for the SEND's own
    /// completion, which exists only once the receive completed.
    Receive {
        /// `IBV_SEND_SOLICITED` on the SEND.
        solicited: bool,
    },
    /// A posted receive completes unsuccessfully: the QP is moved to the error state,
    /// which flushes it (`IBV_WC_WR_FLUSH_ERR`). Last step of a case.
    FlushedReceive,
}

/// What raises the asynchronous event of [`Case::AsyncEvent`] and
/// [`Case::DestroyWithUnackedAsyncEvent`] (`async_events.c`), and the object it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncSource {
    /// An RDMA WRITE naming an rkey no region has, from an RC QP to its connected peer:
    /// the peer (the responder) raises `IBV_EVENT_QP_ACCESS_ERR`; the object is the
    /// responder QP.
    BadRkeyWrite,
    /// An SRQ of 8 WRs with 4 receives posted and its limit armed at 3; two SENDs to a QP
    /// receiving from it leave 2: `IBV_EVENT_SRQ_LIMIT_REACHED`; the object is the SRQ.
    SrqLimit,
    /// A CQ of 1 entry as an RC QP's send CQ, with more signalled RDMA WRITEs posted than
    /// it holds (17 more, so that a runner's probing polls, at most 16, cannot prevent the
    /// overrun): `IBV_EVENT_CQ_ERR`; the object is the CQ.
    CqOverrun,
}

/// Which protection domain the region of [`Case::RcTransfer`] is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionPd {
    /// The QPs'.
    Same,
    /// Another PD of the same context.
    Other,
}

/// How [`Case::RcTransfer`] posts its request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostPath {
    /// `ibv_post_send(3)`.
    PostSend,
    /// The extended post of a QP made by `ibv_create_qp_ex(3)` with `send_ops_flags`:
    /// `ibv_wr_start`, `ibv_wr_rdma_write`, `ibv_wr_set_sge`, `ibv_wr_complete`
    /// (`ibv_wr_post(3)`).
    WrApi,
}

/// The memory [`Case::RegMrMemory`] registers (`registration.c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// Two pages mapped, then unmapped (`mmap`, `munmap`).
    Unmapped,
    /// The address NULL, one page.
    Null,
    /// Two pages mapped `PROT_READ` only.
    ReadOnly,
    /// Zero bytes of a mapped buffer.
    ZeroLength,
    /// 1 TiB from the start of a 4 KiB buffer, with `RLIMIT_MEMLOCK` applying to the
    /// caller: the runner lowers the soft limit to 64 KiB and drops `CAP_IPC_LOCK` from its
    /// thread's effective set for the call (both restored after).
    TebibyteOverPageUnderMemlock,
}

/// The registration verb [`Case::RegMrMemory`] calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegCall {
    /// `ibv_reg_mr`.
    RegMr,
    /// `ibv_reg_mr_iova`.
    RegMrIova,
    /// `ibv_reg_mr_iova2`.
    RegMrIova2,
}

/// The input of a case. Every object a case needs besides the one under test (a PD, a
/// CQ, a peer QP, a region) is made in the valid way by the runner, so only the named
/// input can be wrong; everything made is destroyed at the end of the case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    /// `ibv_create_ah` to the device's own GID 0 (global: RoCE needs the GRH), through
    /// `port`, from GID index `sgid_index`.
    CreateAh {
        /// `ah_attr.grh.sgid_index`.
        sgid_index: u8,
        /// `ah_attr.port_num`.
        port: u8,
    },
    /// An RC QP moved RESET → INIT with `port` and `pkey_index` (and `IBV_QP_ACCESS_FLAGS`
    /// 0). On failure the QP must still be in RESET.
    ModifyQpToInit {
        /// `attr.port_num`.
        port: u8,
        /// `attr.pkey_index`.
        pkey_index: u16,
    },
    /// An RC QP in INIT (port 1, P_Key index 0) moved to RTR towards a peer RC QP of the
    /// same PD, with every attribute RTR requires (the peer's QPN and GID, PSN 0, min RNR
    /// timer 12), `path_mtu`, `ah_attr.grh.sgid_index` and `max_dest_rd_atomic` as given
    /// (resolved against `max_qp_rd_atom`). On failure the QP must still be in INIT; on
    /// success it is in RTR.
    ModifyQpToRtr {
        /// `attr.ah_attr.grh.sgid_index`.
        sgid_index: u8,
        /// `attr.max_dest_rd_atomic`, against the device's `max_qp_rd_atom`.
        max_dest_rd_atomic: Amount,
        /// `attr.path_mtu`, an `enum ibv_mtu` value (`IBV_MTU_1024` = 3).
        path_mtu: u32,
    },
    /// An RC QP in `from` asked to go to `to` with the attributes that transition would
    /// take from the state before it (for RTS: `IBV_QP_SQ_PSN` and RC's retry
    /// attributes). On failure the QP must still be in `from`.
    ModifyQpBadTransition {
        /// The QP's state (it is freshly created: RESET).
        from: QpStateName,
        /// The state asked for.
        to: QpStateName,
    },
    /// `ibv_reg_mr` of `len` bytes with `access`.
    RegMr {
        /// Bytes (0 is a zero-length region).
        len: usize,
        /// The rights asked for.
        access: Access,
    },
    /// `ibv_create_qp` of `qp_type`, its CQs valid, with an SRQ of the same PD if
    /// `with_srq`, and `max_send_wr` resolved against `max_qp_wr` (the rest of the
    /// capacities small).
    CreateQp {
        /// The transport.
        qp_type: QpKind,
        /// Whether receives come from an SRQ (`init_attr.srq`).
        with_srq: bool,
        /// `init_attr.cap.max_send_wr`, against the device's `max_qp_wr`.
        max_send_wr: Amount,
    },
    /// `ibv_create_cq` with `cqe` entries, resolved against `max_cqe`.
    CreateCq {
        /// `cqe`, against the device's `max_cqe`.
        cqe: Amount,
    },
    /// `ibv_create_srq` with `max_wr`, resolved against `max_srq_wr` (`max_sge` 1).
    CreateSrq {
        /// `srq_init_attr.attr.max_wr`, against the device's `max_srq_wr`.
        max_wr: Amount,
    },
    /// `ibv_post_send` of one `opcode` request on an RC QP in RTS (connected to itself,
    /// `max_inline_data` 64), 16 bytes of a region with every access right, to that same
    /// region by its rkey; with `IBV_SEND_INLINE` if `inline`.
    PostSend {
        /// The operation.
        opcode: Opcode,
        /// `IBV_SEND_INLINE`.
        inline: bool,
    },
    /// `ibv_post_send` of a SEND on a UD QP in RTS whose address handle is in the QP's PD
    /// (`ah_of_another_pd` false) or in another PD of the same context (true).
    UdSend {
        /// Whether the AH is of another protection domain than the QP's.
        ah_of_another_pd: bool,
    },
    /// `ibv_alloc_mw` of a window of type `mw_type` (`enum ibv_mw_type`) in a fresh PD.
    AllocMw {
        /// The raw `type` argument.
        mw_type: u32,
    },
    /// `ibv_dealloc_pd` of a PD that a `by` is still in (the object is destroyed after,
    /// then the PD).
    DeallocPdInUse {
        /// What is still in the PD.
        by: PdUser,
    },
    /// `ibv_destroy_cq` of a CQ that `qps` RC QPs complete into as `role`; all but the last
    /// of them are destroyed before the call. On refusal the CQ must still work (a poll
    /// gives 0, `ibv_req_notify_cq` 0); the QP is destroyed after, then the CQ.
    DestroyCqInUse {
        /// How the QPs use the CQ.
        role: CqRole,
        /// How many QPs used it (at least 1).
        qps: u8,
    },
    /// `ibv_destroy_srq` of an SRQ an RC QP receives from (the QP is destroyed after,
    /// then the SRQ).
    DestroySrqInUse,
    /// Every queued asynchronous event is taken first. A CQ asked for 2 entries (it holds
    /// `c`, `cq->cqe`) is the receive CQ of an RC QP
    /// connected to itself; `c + 2` SENDs are received into it, none polled, and the
    /// runner waits for the `c + 2` SENDs' own completions (on another CQ). With
    /// `ignore_overrun` the CQ is made by `ibv_create_cq_ex` with
    /// `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN` (the safe API: `OverrunPolicy::Overwrite`). The
    /// call under test: `ibv_poll_cq` of the CQ. On failure a second poll must fail too;
    /// on success it gave 1..=c distinct receive completions of those SENDs, the CQ is
    /// then empty, a further SEND's receive completion is polled, and no
    /// `IBV_EVENT_CQ_ERR` names the CQ.
    CqOverrun {
        /// `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN`.
        ignore_overrun: bool,
    },
    /// The `steps`, in order, on a CQ of 16 with a (non-blocking) completion channel and a
    /// `cq_context`; after each completion step the events that come within [`QUIET`] are
    /// taken and acknowledged. The outcome: how many events came in all. The receive
    /// completions are polled at the end (none before, so no event is ever stale) and must
    /// all be there.
    CompletionEvents {
        /// What happens, in order.
        steps: &'static [CqStep],
    },
    /// `ibv_get_cq_event` on a completion channel whose fd is non-blocking
    /// (`fcntl(O_NONBLOCK)`; the safe API: `CompChannel::set_nonblocking`) with no event
    /// queued: when `after_event`, once one event came (its fd then polls readable) and was
    /// taken and acknowledged (the fd then polls not readable); else on a fresh channel.
    NonBlockingGetCqEvent {
        /// Whether an event came and was taken first.
        after_event: bool,
    },
    /// `ibv_get_async_event` with `context->async_fd` non-blocking, after every queued
    /// event was taken and acknowledged (the fd then polls not readable).
    NonBlockingGetAsyncEvent,
    /// `ibv_destroy_comp_channel` of a channel a CQ uses (the CQ is destroyed after, then
    /// the channel).
    DestroyChannelInUse,
    /// `ibv_resize_cq` to `to` entries of a CQ asked for `cqe` entries holding
    /// `outstanding` unpolled receive completions (an RC QP connected to itself). On
    /// failure the CQ keeps its size (`cq->cqe`); on success `cq->cqe >= to`, and the
    /// runner adds receive completions until `to` are outstanding (none may overrun).
    /// Either way every completion is then polled, in order.
    ResizeCq {
        /// `cqe` at creation.
        cqe: u32,
        /// Unpolled completions at the call.
        outstanding: u32,
        /// `cqe` asked for.
        to: u32,
    },
    /// `ibv_create_cq_ex` of 16 entries with `IBV_WC_EX_WITH_BYTE_LEN |
    /// IBV_WC_EX_WITH_QP_NUM` and, if `timestamp`, `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`
    /// (the safe API: `CqBuilder::fields`). Empty, `ibv_start_poll` gives `ENOENT` (the
    /// safe API: `Ok(None)`); then an RC QP connected to itself and completing into it
    /// sends 2 SENDs it receives, and the 4 completions are read with
    /// `ibv_start_poll` / `ibv_next_poll` (`ENOENT` at the end) / `ibv_end_poll`, their
    /// opcode, `byte_len` and `qp_num` checked. The call under test:
    /// `ibv_wc_read_completion_ts` of each; success means every completion has a
    /// timestamp, non-zero, within the device's `completion_timestamp_mask`, between the
    /// device clock's readings before and after (`ibv_query_rt_values_ex(3)`), in
    /// non-decreasing CQ order.
    CqExTimestamps {
        /// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`.
        timestamp: bool,
    },
    /// `ibv_destroy_cq` of a CQ (with a channel; its QP destroyed first) that delivered
    /// `events` completion events (armed before each of `events` receive completions):
    /// all acknowledged in one `ibv_ack_cq_events(cq, events)` when `acknowledged` (then
    /// `cq->comp_events_completed` is `events`), none otherwise; the runner acknowledges
    /// them after [`QUIET`] if the destroy is still waiting.
    DestroyCqWithCompletionEvents {
        /// Events delivered.
        events: u32,
        /// Whether they were acknowledged before the call.
        acknowledged: bool,
    },
    /// The event `source` raises (every event queued before is taken and acknowledged
    /// first; events of other objects or types are acknowledged and passed over).
    AsyncEvent {
        /// What raises it.
        source: AsyncSource,
    },
    /// The event `source` raises is taken and not acknowledged; then the destroy of its
    /// object (for the SRQ and the CQ, after the QPs using them), on another thread.
    /// The runner acknowledges the event after [`QUIET`].
    DestroyWithUnackedAsyncEvent {
        /// What raises it.
        source: AsyncSource,
    },
    /// The responder QP's `IBV_EVENT_QP_ACCESS_ERR` ([`AsyncSource::BadRkeyWrite`]) is taken
    /// and acknowledged (its `events_completed` must go from 0 to 1); the call under test
    /// is then the QP's `ibv_destroy_qp`.
    AckAsyncEvent,
    /// [`AsyncSource::BadRkeyWrite`], the requester's completion
    /// (`IBV_WC_REM_ACCESS_ERR`) seen and [`QUIET`] waited, then the responder QP destroyed
    /// before any event is read; then every queued event is taken (and acknowledged).
    AsyncEventOfDestroyedQp,
    /// [`AsyncSource::CqOverrun`]; once the CQ is in the error state (the drop-in runner
    /// probes with one-entry polls, at most 16, until one fails; the safe API says
    /// `Cq::is_in_error`), its
    /// QPs and then the CQ are destroyed before any event is read, and a new CQ is made at
    /// the destroyed one's address (the drop-in allocates a CQ's block with `malloc`, which
    /// hands a freed block of the same size back: the runner makes up to 16 CQs to get one
    /// there; the safe API's CQs are numbered and never reuse a number); then every queued
    /// event is taken (and acknowledged). The outcome: an event names the destroyed CQ or the
    /// new one, or none does.
    AsyncEventOfDestroyedCq,
    /// Two connected RC QPs of one PD (`protection.c`): `op` (a SEND, whose gathered
    /// region is the one named, into a posted receive; or an RDMA WRITE whose target is
    /// the region named) with the region in `region` PD, posted by `path`. On success the
    /// bytes must land; on `IBV_WC_REM_ACCESS_ERR` the target must be unchanged and both
    /// QPs in the error state; on `IBV_WC_LOC_PROT_ERR` nothing may be received, the
    /// requester in the error state and the responder still in RTS.
    RcTransfer {
        /// `IBV_WR_SEND` or `IBV_WR_RDMA_WRITE`.
        op: Opcode,
        /// The region's PD.
        region: RegionPd,
        /// How the request is posted.
        path: PostPath,
    },
    /// `ibv_create_qp` with `init_attr.qp_type` this `enum ibv_qp_type` value, its CQs
    /// valid.
    CreateQpOfType {
        /// The raw value.
        qp_type: u32,
    },
    /// `via` of `memory` with `access` (`registration.c`).
    RegMrMemory {
        /// What is registered.
        memory: Memory,
        /// The rights asked for.
        access: Access,
        /// The verb.
        via: RegCall,
    },
    /// With the soft `RLIMIT_MEMLOCK` lowered to 64 KiB and `CAP_IPC_LOCK` dropped from the
    /// thread's effective set (both restored after): 32 KiB register, then the call under
    /// test registers 64 KiB more (`LOCAL_WRITE`); once the 32 KiB are deregistered 64 KiB
    /// register.
    RegMrPastMemlock,
    /// Two connected RC QPs of one PD: a region (`LOCAL_WRITE | REMOTE_WRITE`) over two
    /// mapped pages, then the pages unmapped while registered (breaking `ibv_reg_mr(3)`'s
    /// contract on purpose); the peer's RDMA WRITE of 256 bytes into it. The process must
    /// live and the region still deregister.
    RdmaWriteIntoUnmappedRegion,
}

/// What the safe API says about a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SafeApi {
    /// The case can be written; when it fails, its error renders as `cause`: the error
    /// type, its variant and, where the variant wraps another error enum, that one's
    /// variant — `"Error::Verbs(BadSgidIndex)"`, `"Error::Register(ZeroLength)"` (an error
    /// struct renders as its name and its field's type). `None` for a case whose outcome
    /// is no refusal ([`Expect::is_refusal`]).
    Expressible {
        /// The typed error variant expected.
        cause: Option<&'static str>,
    },
    /// The case can be written, and the safe API does something else than libibverbs by
    /// design: `expect` (with `cause`, as in [`SafeApi::Expressible`]); why.
    Differs {
        /// What the safe API does instead.
        expect: Expect,
        /// Its typed error, for a refusal.
        cause: Option<&'static str>,
        /// Why.
        why: &'static str,
    },
    /// The case can be written, and the safe API breaks the rule: it does `observed` (with
    /// `cause`). Found by this table and reported, not fixed with it; the safe runner holds
    /// the safe API to `observed`, so the fix fails it until this row says `Expressible`.
    Discrepancy {
        /// What the safe API does.
        observed: Expect,
        /// Its typed error, for a refusal.
        cause: Option<&'static str>,
        /// What is wrong.
        note: &'static str,
    },
    /// The safe API's types make the case impossible to write; why.
    NotExpressible(&'static str),
}

/// What the drop-in does about a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropIn {
    /// The drop-in keeps the rule: its runner expects the row's `expect`.
    Holds,
    /// The drop-in breaks the rule: it does `observed` instead. Found by this table and
    /// reported, not fixed with it; the drop-in runner holds it to `observed`, so the fix
    /// fails it until this row says `Holds`.
    Discrepancy {
        /// What the drop-in does.
        observed: Expect,
        /// What is wrong.
        note: &'static str,
    },
}

/// One rule: a case, its documented outcome and where it is documented.
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    /// A short unique name.
    pub name: &'static str,
    /// The input.
    pub case: Case,
    /// The documented outcome.
    pub expect: Expect,
    /// The safe API's side of it.
    pub safe_api: SafeApi,
    /// The drop-in's side of it.
    pub drop_in: DropIn,
    /// The man page (and, where the page only says "fails", whose behaviour fixes the
    /// errno).
    pub man: &'static str,
}

const fn cause(c: &'static str) -> SafeApi {
    SafeApi::Expressible { cause: Some(c) }
}

const SUCCEEDS: SafeApi = SafeApi::Expressible { cause: None };

const HOLDS: DropIn = DropIn::Holds;

const QP_TYPES_ARE_AN_ENUM: SafeApi = SafeApi::NotExpressible(
    "QpType is an enum of the transports the device offers (Rc, Uc, Ud): an undefined \
     qp_type or IBV_QPT_RAW_PACKET cannot be written",
);

const ASYNC_EVENTS_ARE_VALUES: SafeApi = SafeApi::NotExpressible(
    "an asynchronous event is a value (Context::async_event, softverbs::AsyncEvent): it names \
     its object by number, is never acknowledged and holds nothing, so no destroy waits for \
     it and no acknowledgement is counted",
);

const MR_OWNS_ITS_MEMORY: SafeApi = SafeApi::NotExpressible(
    "Pd::reg_mr allocates the region's memory itself and the Mr owns it: no address, \
     length or mapping of the application's can be registered (unmapped, NULL, read-only \
     or a range past a buffer), and the memory cannot be unmapped while registered",
);

const WINDOW_TYPES_ARE_AN_ENUM: SafeApi = SafeApi::NotExpressible(
    "WindowType is an enum of the two window types (One, Two): a type other than \
     IBV_MW_TYPE_1 / IBV_MW_TYPE_2 cannot be written",
);

const PD_OUTLIVES_OBJECTS: SafeApi = SafeApi::NotExpressible(
    "a Pd has no dealloc: every object in it holds a clone, so the PD is deallocated only \
     when the last object is gone (`ibv_dealloc_pd` of a PD in use cannot be written)",
);

/// `IBV_MTU_1024` (`enum ibv_mtu`).
pub const IBV_MTU_1024: u32 = 3;

/// The rules, in the order the runners run them.
pub const RULES: &[Rule] = &[
    // ------------------------------------------------------------ address handles
    Rule {
        name: "ah_sgid_index_0_is_ok",
        case: Case::CreateAh {
            sgid_index: 0,
            port: 1,
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_create_ah(3): returns a pointer to the created AH (control: GID index 0, \
              port 1 exist)",
    },
    Rule {
        name: "ah_sgid_index_1_is_ok",
        case: Case::CreateAh {
            sgid_index: 1,
            port: 1,
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_create_ah(3): returns a pointer to the created AH; GID index 1 exists, the \
              IPv4 RoCEv2 GID of a port laid out as kernel rxe's (ibv_query_port(3) \
              gid_tbl_len = 2)",
    },
    Rule {
        name: "ah_sgid_index_outside_gid_table",
        case: Case::CreateAh {
            sgid_index: 2,
            port: 1,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Verbs(BadSgidIndex)"),
        drop_in: HOLDS,
        man: "ibv_create_ah(3): \"returns ... NULL if the request fails\"; grh.sgid_index 2 \
              is outside the port's GID table (ibv_query_port(3) gid_tbl_len = 2): EINVAL, \
              as the kernel's rdma_get_gid_attr refuses it",
    },
    Rule {
        name: "ah_port_2",
        case: Case::CreateAh {
            sgid_index: 0,
            port: 2,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Verbs(NoSuchPort)"),
        drop_in: HOLDS,
        man: "ibv_create_ah(3): \"returns ... NULL if the request fails\"; port_num 2 does \
              not exist (ibv_query_device(3) phys_port_cnt = 1): EINVAL",
    },
    // ------------------------------------------------------------ ibv_modify_qp
    Rule {
        name: "init_port_1_pkey_0_is_ok",
        case: Case::ModifyQpToInit {
            port: 1,
            pkey_index: 0,
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_modify_qp(3): RESET -> INIT with IBV_QP_STATE, IBV_QP_PKEY_INDEX, \
              IBV_QP_PORT, IBV_QP_ACCESS_FLAGS (control)",
    },
    Rule {
        name: "init_port_2",
        case: Case::ModifyQpToInit {
            port: 2,
            pkey_index: 0,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Verbs(NoSuchPort)"),
        drop_in: HOLDS,
        man: "ibv_modify_qp(3): \"returns ... the value of errno on failure\"; \"If any of the \
              modify attributes or the modify mask are invalid, none of the attributes will \
              be modified (including the QP state)\": port_num 2 does not exist, EINVAL, the \
              QP stays in RESET",
    },
    Rule {
        name: "init_pkey_index_1",
        case: Case::ModifyQpToInit {
            port: 1,
            pkey_index: 1,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Verbs(AttributeOutOfRange)"),
        drop_in: HOLDS,
        man: "ibv_modify_qp(3): invalid attributes modify nothing; pkey_index 1 is outside \
              the P_Key table (ibv_query_device(3) max_pkeys = 1): EINVAL, the QP stays in \
              RESET",
    },
    Rule {
        name: "rtr_sgid_index_0_is_ok",
        case: Case::ModifyQpToRtr {
            sgid_index: 0,
            max_dest_rd_atomic: Amount::Value(1),
            path_mtu: IBV_MTU_1024,
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_modify_qp(3): INIT -> RTR of an RC QP with IBV_QP_STATE, IBV_QP_AV, \
              IBV_QP_PATH_MTU, IBV_QP_DEST_QPN, IBV_QP_RQ_PSN, IBV_QP_MAX_DEST_RD_ATOMIC, \
              IBV_QP_MIN_RNR_TIMER (control)",
    },
    Rule {
        name: "rtr_sgid_index_1_is_ok",
        case: Case::ModifyQpToRtr {
            sgid_index: 1,
            max_dest_rd_atomic: Amount::Value(1),
            path_mtu: IBV_MTU_1024,
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_modify_qp(3): INIT -> RTR from GID index 1, the IPv4 RoCEv2 GID of a port \
              laid out as kernel rxe's (ibv_query_port(3) gid_tbl_len = 2; `-g 1` of the \
              pingpongs)",
    },
    Rule {
        name: "rtr_sgid_index_99",
        case: Case::ModifyQpToRtr {
            sgid_index: 99,
            max_dest_rd_atomic: Amount::Value(1),
            path_mtu: IBV_MTU_1024,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Verbs(BadSgidIndex)"),
        drop_in: HOLDS,
        man: "ibv_modify_qp(3): invalid attributes modify nothing (including the QP state); \
              ah_attr.grh.sgid_index 99 is outside the GID table (ibv_query_port(3) \
              gid_tbl_len = 2): EINVAL as the kernel's rdma_get_gid_attr, the QP stays in \
              INIT",
    },
    Rule {
        name: "rtr_max_dest_rd_atomic_at_device_max_is_ok",
        case: Case::ModifyQpToRtr {
            sgid_index: 0,
            max_dest_rd_atomic: Amount::DeviceMax,
            path_mtu: IBV_MTU_1024,
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_query_device(3): max_qp_rd_atom, the most RDMA reads and atomics a QP can \
              have outstanding as the target (control: exactly that many)",
    },
    Rule {
        name: "rtr_max_dest_rd_atomic_above_device",
        case: Case::ModifyQpToRtr {
            sgid_index: 0,
            max_dest_rd_atomic: Amount::AboveDeviceMax,
            path_mtu: IBV_MTU_1024,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Verbs(AttributeOutOfRange)"),
        drop_in: HOLDS,
        man: "ibv_modify_qp(3): invalid attributes modify nothing; max_dest_rd_atomic above \
              ibv_query_device(3)'s max_qp_rd_atom: EINVAL (the kernel's ib_modify_qp_is_ok \
              / rxe_qp_chk_attr), the QP stays in INIT",
    },
    Rule {
        name: "reset_to_rts",
        case: Case::ModifyQpBadTransition {
            from: QpStateName::Reset,
            to: QpStateName::Rts,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Verbs(IllegalTransition)"),
        drop_in: HOLDS,
        man: "ibv_modify_qp(3): the state diagram allows RESET -> INIT only (RESET -> RTS is \
              no transition); invalid attributes or mask modify nothing: EINVAL, the QP stays \
              in RESET",
    },
    // ------------------------------------------------------------ ibv_reg_mr
    Rule {
        name: "reg_mr_is_ok",
        case: Case::RegMr {
            len: 4096,
            access: Access::LOCAL_WRITE.with(Access::REMOTE_WRITE),
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_reg_mr(3): REMOTE_WRITE with LOCAL_WRITE (control)",
    },
    Rule {
        name: "reg_mr_length_0",
        case: Case::RegMr {
            len: 0,
            access: Access::LOCAL_WRITE,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Register(ZeroLength)"),
        drop_in: HOLDS,
        man: "ibv_reg_mr(3): \"returns ... NULL if the request fails\"; a region of length 0: \
              EINVAL, as the kernel's ib_umem_get",
    },
    Rule {
        name: "reg_mr_remote_write_without_local_write",
        case: Case::RegMr {
            len: 4096,
            access: Access::REMOTE_WRITE,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Register(MissingLocalWrite)"),
        drop_in: HOLDS,
        man: "ibv_reg_mr(3): \"If IBV_ACCESS_REMOTE_WRITE or IBV_ACCESS_REMOTE_ATOMIC is set, \
              then IBV_ACCESS_LOCAL_WRITE must be set too\": EINVAL",
    },
    // ------------------------------------------------------------ creation limits
    Rule {
        name: "qp_max_send_wr_at_device_max_is_ok",
        case: Case::CreateQp {
            qp_type: QpKind::Rc,
            with_srq: false,
            max_send_wr: Amount::DeviceMax,
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_query_device(3): max_qp_wr, \"Maximum number of outstanding WR on any work \
              queue\" (control: exactly that many)",
    },
    Rule {
        name: "qp_max_send_wr_above_device",
        case: Case::CreateQp {
            qp_type: QpKind::Rc,
            with_srq: false,
            max_send_wr: Amount::AboveDeviceMax,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Verbs(CapacityAboveLimit)"),
        drop_in: HOLDS,
        man: "ibv_create_qp(3): \"returns ... NULL if the request fails\"; cap.max_send_wr \
              above ibv_query_device(3)'s max_qp_wr: EINVAL, as the kernel's create_qp",
    },
    Rule {
        // Control with 16 entries, not max_cqe: the device's max_cqe (4,194,303) is a ring
        // allocated up front, hundreds of MiB for a control.
        name: "cq_cqe_16_is_ok",
        case: Case::CreateCq {
            cqe: Amount::Value(16),
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_create_cq(3): \"creates a completion queue (CQ) with at least cqe entries\" \
              (control)",
    },
    Rule {
        name: "cq_cqe_above_device",
        case: Case::CreateCq {
            cqe: Amount::AboveDeviceMax,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::CqCreate(TooLarge)"),
        drop_in: HOLDS,
        man: "ibv_create_cq(3): \"returns ... NULL if the request fails\"; cqe above \
              ibv_query_device(3)'s max_cqe: EINVAL, as the kernel's ib_uverbs_create_cq",
    },
    Rule {
        name: "srq_max_wr_at_device_max_is_ok",
        case: Case::CreateSrq {
            max_wr: Amount::DeviceMax,
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_create_srq(3): max_wr, \"Requested max number of outstanding work requests \
              (WRs) in the SRQ\" (control: max_srq_wr)",
    },
    Rule {
        name: "srq_max_wr_above_device",
        case: Case::CreateSrq {
            max_wr: Amount::AboveDeviceMax,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Verbs(CapacityAboveLimit)"),
        drop_in: HOLDS,
        man: "ibv_create_srq(3): \"returns ... NULL if the request fails\"; max_wr above \
              ibv_query_device(3)'s max_srq_wr: EINVAL",
    },
    Rule {
        name: "rc_qp_with_srq_is_ok",
        case: Case::CreateQp {
            qp_type: QpKind::Rc,
            with_srq: true,
            max_send_wr: Amount::Value(4),
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_create_qp(3) NOTES: an SRQ may be associated with IBV_QPT_RC (control)",
    },
    Rule {
        name: "ud_qp_with_srq_is_ok",
        case: Case::CreateQp {
            qp_type: QpKind::Ud,
            with_srq: true,
            max_send_wr: Amount::Value(4),
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_create_qp(3) NOTES: \"ibv_create_qp() will fail if a it is asked to create \
              QP of a type other than IBV_QPT_RC or IBV_QPT_UD associated with an SRQ\": UD \
              with an SRQ is allowed (rxe allows it)",
    },
    // ------------------------------------------------------------ ibv_post_send
    Rule {
        name: "inline_rdma_write_is_ok",
        case: Case::PostSend {
            opcode: Opcode::RdmaWrite,
            inline: true,
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_post_send(3): IBV_SEND_INLINE is \"Valid only for Send and RDMA Write\" \
              (control: an RDMA Write)",
    },
    Rule {
        name: "rdma_read_is_ok",
        case: Case::PostSend {
            opcode: Opcode::RdmaRead,
            inline: false,
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_post_send(3): IBV_WR_RDMA_READ on an RC QP in RTS (control: the same \
              request without IBV_SEND_INLINE)",
    },
    Rule {
        name: "inline_rdma_read",
        case: Case::PostSend {
            opcode: Opcode::RdmaRead,
            inline: true,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Verbs(InlineOnReadOrAtomic)"),
        drop_in: HOLDS,
        man: "ibv_post_send(3): IBV_SEND_INLINE is \"Valid only for Send and RDMA Write\"; \
              \"returns 0 on success, or the value of errno on failure\": EINVAL",
    },
    Rule {
        name: "ud_send_ah_of_own_pd_is_ok",
        case: Case::UdSend {
            ah_of_another_pd: false,
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_post_send(3): wr.ud.ah, an AH of the QP's PD (control)",
    },
    Rule {
        name: "ud_send_ah_of_another_pd",
        case: Case::UdSend {
            ah_of_another_pd: true,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Verbs(AddressHandleOfAnotherPd)"),
        drop_in: HOLDS,
        man: "ibv_post_send(3): \"returns ... the value of errno on failure\"; \
              ibv_create_ah(3): an AH is \"associated with the protection domain pd\", and a \
              QP uses only address handles of its own PD (IBTA 10.2.3): EINVAL",
    },
    // ------------------------------------------------------------ destroy while in use
    Rule {
        name: "dealloc_pd_with_mr",
        case: Case::DeallocPdInUse { by: PdUser::Mr },
        expect: Expect::Errno(EBUSY),
        safe_api: PD_OUTLIVES_OBJECTS,
        drop_in: HOLDS,
        man: "ibv_alloc_pd(3) NOTES: \"ibv_dealloc_pd() may fail if any other resource is \
              still associated with the PD being freed\": EBUSY, as the kernel",
    },
    Rule {
        name: "dealloc_pd_with_qp",
        case: Case::DeallocPdInUse { by: PdUser::Qp },
        expect: Expect::Errno(EBUSY),
        safe_api: PD_OUTLIVES_OBJECTS,
        drop_in: HOLDS,
        man: "ibv_alloc_pd(3) NOTES: ibv_dealloc_pd() fails while a resource is associated \
              with the PD: EBUSY",
    },
    Rule {
        name: "dealloc_pd_with_srq",
        case: Case::DeallocPdInUse { by: PdUser::Srq },
        expect: Expect::Errno(EBUSY),
        safe_api: PD_OUTLIVES_OBJECTS,
        drop_in: HOLDS,
        man: "ibv_alloc_pd(3) NOTES: ibv_dealloc_pd() fails while a resource is associated \
              with the PD: EBUSY",
    },
    Rule {
        name: "dealloc_pd_with_ah",
        case: Case::DeallocPdInUse { by: PdUser::Ah },
        expect: Expect::Errno(EBUSY),
        safe_api: PD_OUTLIVES_OBJECTS,
        drop_in: HOLDS,
        man: "ibv_alloc_pd(3) NOTES: ibv_dealloc_pd() fails while a resource is associated \
              with the PD: EBUSY",
    },
    Rule {
        name: "dealloc_pd_with_mw",
        case: Case::DeallocPdInUse { by: PdUser::Mw },
        expect: Expect::Errno(EBUSY),
        safe_api: PD_OUTLIVES_OBJECTS,
        drop_in: HOLDS,
        man: "ibv_alloc_pd(3) NOTES: ibv_dealloc_pd() fails while a resource is associated \
              with the PD — a memory window (ibv_alloc_mw(3)) too: EBUSY",
    },
    Rule {
        name: "destroy_cq_in_use",
        case: Case::DestroyCqInUse {
            role: CqRole::Both,
            qps: 1,
        },
        expect: Expect::Errno(EBUSY),
        safe_api: cause("Error::Verbs(InUse)"),
        drop_in: HOLDS,
        man: "ibv_create_cq(3): \"ibv_destroy_cq() fails if any queue pair is still \
              associated with this CQ\": EBUSY",
    },
    Rule {
        name: "destroy_srq_in_use",
        case: Case::DestroySrqInUse,
        expect: Expect::Errno(EBUSY),
        safe_api: cause("Error::Verbs(InUse)"),
        drop_in: HOLDS,
        man: "ibv_create_srq(3) NOTES: \"ibv_destroy_srq() fails if any queue pair is still \
              associated with this SRQ\": EBUSY",
    },
    // ------------------------------------------------------------ attributes.c
    Rule {
        name: "rtr_sgid_index_at_gid_tbl_len",
        case: Case::ModifyQpToRtr {
            sgid_index: 2,
            max_dest_rd_atomic: Amount::Value(1),
            path_mtu: IBV_MTU_1024,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Verbs(BadSgidIndex)"),
        drop_in: HOLDS,
        man: "ibv_modify_qp(3): \"If any of the modify attributes or the modify mask are \
              invalid, none of the attributes will be modified (including the QP state)\"; \
              ah_attr.grh.sgid_index 2 = ibv_query_port(3)'s gid_tbl_len, one past the table: \
              EINVAL, the QP stays in INIT (attributes.c rule 2)",
    },
    Rule {
        name: "rtr_path_mtu_undefined",
        case: Case::ModifyQpToRtr {
            sgid_index: 0,
            max_dest_rd_atomic: Amount::Value(1),
            path_mtu: 9,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: SafeApi::NotExpressible(
            "QpAttr::path_mtu is a softverbs::Mtu, an enum of the five sizes verbs.h names \
             (Mtu256 ..= Mtu4096): no other value can be written",
        ),
        drop_in: HOLDS,
        man: "ibv_modify_qp(3): invalid attributes modify nothing (including the QP state); \
              path_mtu 9 is no enum ibv_mtu value (IBV_MTU_256 = 1 .. IBV_MTU_4096 = 5): \
              EINVAL, the QP stays in INIT (attributes.c rule 4)",
    },
    Rule {
        name: "create_qp_type_undefined",
        case: Case::CreateQpOfType { qp_type: 0x77 },
        expect: Expect::Errno(EINVAL),
        safe_api: QP_TYPES_ARE_AN_ENUM,
        drop_in: HOLDS,
        man: "ibv_create_qp(3): \"returns ... NULL if the request fails\"; qp_type 0x77 is no \
              enum ibv_qp_type value: EINVAL, as the kernel's create_qp (attributes.c rule 1)",
    },
    Rule {
        name: "create_qp_type_raw_packet",
        case: Case::CreateQpOfType { qp_type: 8 },
        expect: Expect::Errno(EOPNOTSUPP),
        safe_api: QP_TYPES_ARE_AN_ENUM,
        drop_in: HOLDS,
        man: "ibv_create_qp(3): qp_type \"IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, \
              IBV_QPT_RAW_PACKET or IBV_QPT_DRIVER\", \"NULL if the request fails\"; \
              IBV_QPT_RAW_PACKET (8), a type the soft device does not offer: EOPNOTSUPP \
              (attributes.c rule 1)",
    },
    // ------------------------------------------------------------ CQ overrun (cq_rules.c 1, 2)
    Rule {
        name: "cq_overrun_poll_fails",
        case: Case::CqOverrun {
            ignore_overrun: false,
        },
        expect: Expect::Errno(EIO),
        safe_api: cause("Error::CqInError"),
        drop_in: HOLDS,
        man: "ibv_poll_cq(3) NOTES: \"In case of a CQ overrun, the async event \
              IBV_EVENT_CQ_ERR will be triggered, and the CQ cannot be used.\" RETURN VALUE: \
              \"On failure, a negative value is returned\": -EIO (the CQ core's \
              PollError::Overrun), again on the second poll (cq_rules.c rule 1)",
    },
    Rule {
        name: "cq_ignore_overrun_poll_works",
        case: Case::CqOverrun {
            ignore_overrun: true,
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_create_cq_ex(3): IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN \"This CQ will not pass \
              to error state if overrun, CQE always will be written to next entry. An \
              application must be designed to avoid ever overflowing the CQ, otherwise CQEs \
              might be lost.\" (cq_rules.c rule 2)",
    },
    // ------------------------------------------------------------ arming (cq_rules.c 3, 4)
    Rule {
        name: "arm_any_receive_raises_an_event",
        case: Case::CompletionEvents {
            steps: &[
                CqStep::Arm {
                    solicited_only: false,
                },
                CqStep::Receive { solicited: false },
            ],
        },
        expect: Expect::CompletionEvents(1),
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_req_notify_cq(3): \"If the argument solicited_only is zero, a completion \
              event is generated for any new CQE.\" (control)",
    },
    Rule {
        name: "solicited_only_unsolicited_receive_raises_no_event",
        case: Case::CompletionEvents {
            steps: &[
                CqStep::Arm {
                    solicited_only: true,
                },
                CqStep::Receive { solicited: false },
            ],
        },
        expect: Expect::CompletionEvents(0),
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_req_notify_cq(3): \"If solicited_only is non-zero, an event is only \
              generated for a new CQE with that is considered \"solicited.\" ... All other \
              successful receive completions, or any successful send completion is \
              unsolicited.\" (cq_rules.c rule 3)",
    },
    Rule {
        name: "solicited_only_solicited_receive_raises_an_event",
        case: Case::CompletionEvents {
            steps: &[
                CqStep::Arm {
                    solicited_only: true,
                },
                CqStep::Receive { solicited: false },
                CqStep::Receive { solicited: true },
            ],
        },
        expect: Expect::CompletionEvents(1),
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_req_notify_cq(3): \"A CQE is solicited if it is a receive completion for a \
              message with the Solicited Event header bit set\" (IBV_SEND_SOLICITED, \
              ibv_post_send(3)); the unsolicited receive before it consumed no arming \
              (cq_rules.c rule 3)",
    },
    Rule {
        name: "solicited_only_flushed_receive_raises_an_event",
        case: Case::CompletionEvents {
            steps: &[
                CqStep::Arm {
                    solicited_only: true,
                },
                CqStep::FlushedReceive,
            ],
        },
        expect: Expect::CompletionEvents(1),
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_req_notify_cq(3): \"A CQE is solicited if it is a receive completion for a \
              message with the Solicited Event header bit set, or if the status is not \
              successful\": a receive flushed by the error state (cq_rules.c rule 3)",
    },
    Rule {
        name: "arming_is_one_shot",
        case: Case::CompletionEvents {
            steps: &[
                CqStep::Arm {
                    solicited_only: false,
                },
                CqStep::Receive { solicited: false },
                CqStep::Receive { solicited: false },
                CqStep::Receive { solicited: true },
            ],
        },
        expect: Expect::CompletionEvents(1),
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_req_notify_cq(3) NOTES: \"The request for notification is \"one shot.\" \
              Only one completion event will be generated for each call to \
              ibv_req_notify_cq().\" (cq_rules.c rule 4)",
    },
    Rule {
        name: "rearming_raises_one_more_event",
        case: Case::CompletionEvents {
            steps: &[
                CqStep::Arm {
                    solicited_only: false,
                },
                CqStep::Receive { solicited: false },
                CqStep::Arm {
                    solicited_only: false,
                },
                CqStep::Receive { solicited: false },
                CqStep::Receive { solicited: false },
            ],
        },
        expect: Expect::CompletionEvents(2),
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_req_notify_cq(3) NOTES: \"Only one completion event will be generated for \
              each call to ibv_req_notify_cq()\": two arms, two events, however many \
              completions (cq_rules.c rule 4)",
    },
    // ------------------------------------------------------------ non-blocking fds (cq_rules.c 5)
    Rule {
        name: "nonblocking_channel_fresh_eagain",
        case: Case::NonBlockingGetCqEvent { after_event: false },
        expect: Expect::Errno(EAGAIN),
        safe_api: cause("Error::Io(Os)"),
        drop_in: HOLDS,
        man: "ibv_get_cq_event(3) EXAMPLES, non-blocking mode: \"Set the completion event \
              channel to be non-blocked\" (fcntl O_NONBLOCK), then poll(2) the fd; with no \
              event the read fails, -1 with errno EAGAIN as read(2) on a non-blocking fd \
              (cq_rules.c rule 5)",
    },
    Rule {
        name: "nonblocking_channel_emptied_eagain",
        case: Case::NonBlockingGetCqEvent { after_event: true },
        expect: Expect::Errno(EAGAIN),
        safe_api: cause("Error::Io(Os)"),
        drop_in: HOLDS,
        man: "ibv_get_cq_event(3) EXAMPLES: \"Poll the channel until there it has a completion \
              event\", then ibv_get_cq_event; once the one event is taken the fd is not \
              readable and the read fails with EAGAIN (cq_rules.c rule 5)",
    },
    Rule {
        name: "nonblocking_async_fd_empty_eagain",
        case: Case::NonBlockingGetAsyncEvent,
        expect: Expect::Errno(EAGAIN),
        safe_api: SafeApi::NotExpressible(
            "the safe API reads asynchronous events as values without a file descriptor of \
             its own: Context::try_async_event gives None when none is queued, there is no \
             O_NONBLOCK and no EAGAIN",
        ),
        drop_in: HOLDS,
        man: "ibv_get_async_event(3) EXAMPLES: \"Set the async events queue work mode to be \
              non-blocked\" (fcntl on ctx->async_fd), \"Poll the queue until it has an async \
              event\"; ibv_get_async_event \"returns 0 on success, and -1 on error\": with \
              nothing queued, -1 with EAGAIN (cq_rules.c rule 5)",
    },
    // ------------------------------------------------------------ in use (cq_rules.c 6)
    Rule {
        name: "destroy_cq_used_as_send_cq",
        case: Case::DestroyCqInUse {
            role: CqRole::Send,
            qps: 1,
        },
        expect: Expect::Errno(EBUSY),
        safe_api: cause("Error::Verbs(InUse)"),
        drop_in: HOLDS,
        man: "ibv_create_cq(3) NOTES: \"ibv_destroy_cq() fails if any queue pair is still \
              associated with this CQ.\": a QP's send CQ, EBUSY, the CQ still works \
              (cq_rules.c rule 6)",
    },
    Rule {
        name: "destroy_cq_used_as_recv_cq",
        case: Case::DestroyCqInUse {
            role: CqRole::Recv,
            qps: 1,
        },
        expect: Expect::Errno(EBUSY),
        safe_api: cause("Error::Verbs(InUse)"),
        drop_in: HOLDS,
        man: "ibv_create_cq(3) NOTES: \"ibv_destroy_cq() fails if any queue pair is still \
              associated with this CQ.\": a QP's receive CQ, EBUSY (cq_rules.c rule 6)",
    },
    Rule {
        name: "destroy_cq_still_used_by_one_of_two_qps",
        case: Case::DestroyCqInUse {
            role: CqRole::Recv,
            qps: 2,
        },
        expect: Expect::Errno(EBUSY),
        safe_api: cause("Error::Verbs(InUse)"),
        drop_in: HOLDS,
        man: "ibv_create_cq(3) NOTES: ibv_destroy_cq() fails \"if any queue pair is still \
              associated with this CQ\": one of its two QPs destroyed, the other still there, \
              EBUSY (cq_rules.c rule 6)",
    },
    Rule {
        name: "destroy_comp_channel_in_use",
        case: Case::DestroyChannelInUse,
        expect: Expect::Errno(EBUSY),
        safe_api: cause("Error::Verbs(InUse)"),
        drop_in: HOLDS,
        man: "ibv_create_comp_channel(3) NOTES: \"ibv_destroy_comp_channel() fails if any CQs \
              are still associated with the completion event channel being destroyed.\": \
              EBUSY, as libibverbs (cq_rules.c rule 6)",
    },
    // ------------------------------------------------------------ resize (cq_rules.c 7)
    Rule {
        name: "resize_cq_below_outstanding",
        case: Case::ResizeCq {
            cqe: 4,
            outstanding: 4,
            to: 1,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::CqResize(TooSmall)"),
        drop_in: HOLDS,
        man: "ibv_resize_cq(3): \"cqe must be at least the number of unpolled entries in the \
              CQ cq\"; \"returns 0 on success, or the value of errno on failure\": EINVAL, \
              size and completions kept (cq_rules.c rule 7)",
    },
    Rule {
        name: "resize_cq_grow_keeps_completions",
        case: Case::ResizeCq {
            cqe: 4,
            outstanding: 4,
            to: 16,
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_resize_cq(3): \"resizes the completion queue (CQ) cq to have at least cqe \
              entries\"; NOTES: \"The cqe member of cq will be updated to the actual size.\" \
              A full CQ grown keeps its completions in order and holds 16 (cq_rules.c rule 7)",
    },
    Rule {
        name: "resize_cq_to_exactly_outstanding",
        case: Case::ResizeCq {
            cqe: 64,
            outstanding: 9,
            to: 9,
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_resize_cq(3): \"cqe must be at least the number of unpolled entries in the \
              CQ cq\": exactly that many is allowed, and the completions are kept in order \
              (cq_rules.c rule 7)",
    },
    // ------------------------------------------------------------ extended CQ (cq_rules.c 8)
    Rule {
        name: "cq_ex_completion_timestamp_requested",
        case: Case::CqExTimestamps { timestamp: true },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_create_cq_ex(3): IBV_WC_EX_WITH_COMPLETION_TIMESTAMP \"Require completion \
              device timestamp in WC\"; ibv_wc_read_completion_ts \"Get the completion \
              timestamp from the current completion in HCA clock units\"; ibv_start_poll \
              \"When no completions are available on the CQ, ENOENT is returned\" \
              (cq_rules.c rule 8)",
    },
    Rule {
        name: "cq_ex_completion_timestamp_not_requested",
        case: Case::CqExTimestamps { timestamp: false },
        expect: Expect::NoValue,
        safe_api: cause("FieldNotRequested(WcFields)"),
        drop_in: HOLDS,
        man: "ibv_create_cq_ex(3): \"Only fields that the user requested via wc_flags in \
              ibv_create_cq_ex could be queried\": no timestamp without \
              IBV_WC_EX_WITH_COMPLETION_TIMESTAMP (the drop-in's reader gives 0)",
    },
    // ------------------------------------------------------------ acknowledgements (cq_rules.c 9)
    Rule {
        name: "destroy_cq_after_its_events_are_acked",
        case: Case::DestroyCqWithCompletionEvents {
            events: 3,
            acknowledged: true,
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_get_cq_event(3) NOTES: \"All completion events that ibv_get_cq_event() \
              returns must be acknowledged using ibv_ack_cq_events()\", \"it may be better to \
              amortize this cost ... acking several completion events in one call\": three \
              acknowledged in one call, then ibv_destroy_cq returns 0 (cq_rules.c rule 9a)",
    },
    Rule {
        name: "destroy_cq_waits_for_event_acks",
        case: Case::DestroyCqWithCompletionEvents {
            events: 2,
            acknowledged: false,
        },
        expect: Expect::WaitsForAck,
        safe_api: SafeApi::Differs {
            expect: Expect::Errno(EBUSY),
            cause: Some("Error::UnacknowledgedEvents"),
            why: "Cq::destroy never blocks: it takes the CQ by value, and with an event \
                  unacknowledged it refuses and hands the CQ back (a CqEvent acknowledges \
                  itself when dropped; only CqEvent::into_unacknowledged leaves one)",
        },
        drop_in: HOLDS,
        man: "ibv_get_cq_event(3) NOTES: \"To avoid races, destroying a CQ will wait for all \
              completion events to be acknowledged; this guarantees a one-to-one \
              correspondence between acks and successful gets.\" (cq_rules.c rule 9b)",
    },
    // ------------------------------------------------------------ async events (async_events.c)
    Rule {
        name: "qp_access_err_names_the_responder_qp",
        case: Case::AsyncEvent {
            source: AsyncSource::BadRkeyWrite,
        },
        expect: Expect::AsyncEvent(EventType::QpAccessErr),
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_get_async_event(3): IBV_EVENT_QP_ACCESS_ERR \"Local access violation \
              error\", element.qp \"QP that got the event\": the responder QP of an RDMA \
              WRITE with an unknown rkey (async_events.c rule 1)",
    },
    Rule {
        name: "srq_limit_reached_names_the_srq",
        case: Case::AsyncEvent {
            source: AsyncSource::SrqLimit,
        },
        expect: Expect::AsyncEvent(EventType::SrqLimitReached),
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_modify_srq(3) NOTES: \"Modifying the srq_limit arms the SRQ to produce an \
              IBV_EVENT_SRQ_LIMIT_REACHED \"low watermark\" asynchronous event once the number \
              of WRs in the SRQ drops below srq_limit.\"; ibv_get_async_event(3): element.srq \
              \"SRQ that got the event\" (async_events.c rule 3)",
    },
    Rule {
        name: "cq_err_names_the_cq",
        case: Case::AsyncEvent {
            source: AsyncSource::CqOverrun,
        },
        expect: Expect::AsyncEvent(EventType::CqErr),
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_poll_cq(3) NOTES: \"In case of a CQ overrun, the async event \
              IBV_EVENT_CQ_ERR will be triggered\"; ibv_get_async_event(3): IBV_EVENT_CQ_ERR \
              \"CQ is in error (CQ overrun)\", element.cq \"CQ that got the event\" \
              (async_events.c rule 4, cq_rules.c rule 1)",
    },
    Rule {
        name: "destroy_qp_waits_for_async_event_ack",
        case: Case::DestroyWithUnackedAsyncEvent {
            source: AsyncSource::BadRkeyWrite,
        },
        expect: Expect::WaitsForAck,
        safe_api: ASYNC_EVENTS_ARE_VALUES,
        drop_in: HOLDS,
        man: "ibv_get_async_event(3) NOTES: \"All async events that ibv_get_async_event() \
              returns must be acknowledged using ibv_ack_async_event(). To avoid races, \
              destroying an object (CQ, SRQ or QP) will wait for all affiliated events for the \
              object to be acknowledged\" (async_events.c rule 1)",
    },
    Rule {
        name: "destroy_srq_waits_for_async_event_ack",
        case: Case::DestroyWithUnackedAsyncEvent {
            source: AsyncSource::SrqLimit,
        },
        expect: Expect::WaitsForAck,
        safe_api: ASYNC_EVENTS_ARE_VALUES,
        drop_in: HOLDS,
        man: "ibv_get_async_event(3) NOTES: \"destroying an object (CQ, SRQ or QP) will wait \
              for all affiliated events for the object to be acknowledged\": the SRQ's \
              IBV_EVENT_SRQ_LIMIT_REACHED (async_events.c rule 3)",
    },
    Rule {
        name: "destroy_cq_waits_for_async_event_ack",
        case: Case::DestroyWithUnackedAsyncEvent {
            source: AsyncSource::CqOverrun,
        },
        expect: Expect::WaitsForAck,
        safe_api: ASYNC_EVENTS_ARE_VALUES,
        drop_in: HOLDS,
        man: "ibv_get_async_event(3) NOTES: \"destroying an object (CQ, SRQ or QP) will wait \
              for all affiliated events for the object to be acknowledged\": the CQ's \
              IBV_EVENT_CQ_ERR (async_events.c rule 4)",
    },
    Rule {
        name: "async_event_ack_is_counted",
        case: Case::AckAsyncEvent,
        expect: Expect::Ok,
        safe_api: ASYNC_EVENTS_ARE_VALUES,
        drop_in: HOLDS,
        man: "ibv_get_async_event(3): ibv_ack_async_event() \"acknowledge the async event\"; \
              libibverbs counts it in the object's events_completed (the count the destroy \
              waits on), and with every event acknowledged ibv_destroy_qp returns 0 at once \
              (async_events.c rule 1b)",
    },
    Rule {
        name: "async_event_of_a_destroyed_qp_is_not_delivered",
        case: Case::AsyncEventOfDestroyedQp,
        expect: Expect::NoAsyncEvent,
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_get_async_event(3) NOTES: destroying waits for the acknowledgements, \"this \
              avoids an application retrieving an affiliated event after the corresponding \
              object has already been destroyed\"; an event not yet read when its QP is \
              destroyed is dropped, as the kernel drops a destroyed object's unread events \
              (async_events.c rule 2)",
    },
    Rule {
        name: "cq_err_of_a_destroyed_cq_is_not_delivered",
        case: Case::AsyncEventOfDestroyedCq,
        expect: Expect::NoAsyncEvent,
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_get_async_event(3) NOTES: destroying waits for the acknowledgements, \"this \
              avoids an application retrieving an affiliated event after the corresponding \
              object has already been destroyed\"; an event not yet read when its CQ is \
              destroyed is dropped, as the kernel drops a destroyed object's unread events, \
              and never names another CQ (async_events.c rule 2, for a CQ)",
    },
    // ------------------------------------------------------------ protection.c
    Rule {
        name: "rdma_write_to_a_region_of_the_qps_pd_lands",
        case: Case::RcTransfer {
            op: Opcode::RdmaWrite,
            region: RegionPd::Same,
            path: PostPath::PostSend,
        },
        expect: Expect::Completes(Status::Success),
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_post_send(3): IBV_WR_RDMA_WRITE to a region of the QP's PD registered with \
              IBV_ACCESS_REMOTE_WRITE (control, protection.c rule 1)",
    },
    Rule {
        name: "rdma_write_rkey_of_another_pd",
        case: Case::RcTransfer {
            op: Opcode::RdmaWrite,
            region: RegionPd::Other,
            path: PostPath::PostSend,
        },
        expect: Expect::Completes(Status::RemAccessErr),
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_poll_cq(3): IBV_WC_REM_ACCESS_ERR \"Remote Access Error\"; a QP reaches only \
              regions of its own PD (IBTA 10.2.3, protection domains; rxe's MR lookup): the \
              target is untouched and both QPs go to the error state (protection.c rule 2)",
    },
    Rule {
        name: "send_from_a_region_of_the_qps_pd_is_received",
        case: Case::RcTransfer {
            op: Opcode::Send,
            region: RegionPd::Same,
            path: PostPath::PostSend,
        },
        expect: Expect::Completes(Status::Success),
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_post_send(3): IBV_WR_SEND gathering from a region of the QP's PD (control, \
              protection.c rule 3)",
    },
    Rule {
        name: "send_lkey_of_another_pd",
        case: Case::RcTransfer {
            op: Opcode::Send,
            region: RegionPd::Other,
            path: PostPath::PostSend,
        },
        expect: Expect::Completes(Status::LocProtErr),
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_poll_cq(3): IBV_WC_LOC_PROT_ERR \"Local Protection Error\": an lkey of a \
              region of another PD (IBTA 10.2.3); nothing is received, the requester goes to \
              the error state (protection.c rule 4)",
    },
    Rule {
        name: "wr_rdma_write_rkey_of_another_pd",
        case: Case::RcTransfer {
            op: Opcode::RdmaWrite,
            region: RegionPd::Other,
            path: PostPath::WrApi,
        },
        expect: Expect::Completes(Status::RemAccessErr),
        safe_api: SafeApi::NotExpressible(
            "the safe API posts through Qp::post_send only (rdma_write_rkey_of_another_pd); \
             the ibv_wr_* builders of an ibv_qp_ex are the C ABI's second post path",
        ),
        drop_in: HOLDS,
        man: "ibv_wr_post(3): ibv_wr_rdma_write on a QP made by ibv_create_qp_ex(3) with \
              send_ops_flags; the same protection as ibv_post_send: an rkey of another PD \
              completes with IBV_WC_REM_ACCESS_ERR (protection.c rule 5)",
    },
    // ------------------------------------------------------------ registration.c
    Rule {
        name: "reg_mr_unmapped_range",
        case: Case::RegMrMemory {
            memory: Memory::Unmapped,
            access: Access::LOCAL_WRITE,
            via: RegCall::RegMr,
        },
        expect: Expect::Errno(EFAULT),
        safe_api: MR_OWNS_ITS_MEMORY,
        drop_in: HOLDS,
        man: "ibv_reg_mr(3): \"returns ... NULL if the request fails\"; pages not mapped \
              cannot be pinned: EFAULT, as the kernel's ib_umem_get (registration.c rule 1)",
    },
    Rule {
        name: "reg_mr_iova_unmapped_range",
        case: Case::RegMrMemory {
            memory: Memory::Unmapped,
            access: Access::REMOTE_READ,
            via: RegCall::RegMrIova,
        },
        expect: Expect::Errno(EFAULT),
        safe_api: MR_OWNS_ITS_MEMORY,
        drop_in: HOLDS,
        man: "ibv_reg_mr(3): ibv_reg_mr_iova, \"the same as the normal reg_mr\" with an IOVA: \
              unmapped pages, EFAULT (registration.c rule 1)",
    },
    Rule {
        name: "reg_mr_iova2_unmapped_range",
        case: Case::RegMrMemory {
            memory: Memory::Unmapped,
            access: Access::LOCAL_WRITE,
            via: RegCall::RegMrIova2,
        },
        expect: Expect::Errno(EFAULT),
        safe_api: MR_OWNS_ITS_MEMORY,
        drop_in: HOLDS,
        man: "ibv_reg_mr(3): ibv_reg_mr_iova2, as ibv_reg_mr_iova with unsigned access: \
              unmapped pages, EFAULT (registration.c rule 1)",
    },
    Rule {
        name: "reg_mr_null_address",
        case: Case::RegMrMemory {
            memory: Memory::Null,
            access: Access::LOCAL_WRITE,
            via: RegCall::RegMr,
        },
        expect: Expect::Errno(EFAULT),
        safe_api: MR_OWNS_ITS_MEMORY,
        drop_in: HOLDS,
        man: "ibv_reg_mr(3): \"NULL if the request fails\"; address NULL is not mapped: \
              EFAULT (registration.c rule 1)",
    },
    Rule {
        name: "reg_mr_read_only_with_local_write",
        case: Case::RegMrMemory {
            memory: Memory::ReadOnly,
            access: Access::LOCAL_WRITE,
            via: RegCall::RegMr,
        },
        expect: Expect::Errno(EFAULT),
        safe_api: MR_OWNS_ITS_MEMORY,
        drop_in: HOLDS,
        man: "ibv_reg_mr(3): IBV_ACCESS_LOCAL_WRITE \"Enable Local Write Access\" over a \
              read-only mapping: the kernel pins with FOLL_WRITE and fails, EFAULT \
              (registration.c rule 2)",
    },
    Rule {
        name: "reg_mr_iova2_read_only_with_remote_atomic",
        case: Case::RegMrMemory {
            memory: Memory::ReadOnly,
            access: Access::LOCAL_WRITE.with(Access::REMOTE_ATOMIC),
            via: RegCall::RegMrIova2,
        },
        expect: Expect::Errno(EFAULT),
        safe_api: MR_OWNS_ITS_MEMORY,
        drop_in: HOLDS,
        man: "ibv_reg_mr(3): REMOTE_ATOMIC (with the LOCAL_WRITE it needs) over a read-only \
              mapping, through ibv_reg_mr_iova2: EFAULT (registration.c rule 2)",
    },
    Rule {
        name: "reg_mr_read_only_with_remote_read_is_ok",
        case: Case::RegMrMemory {
            memory: Memory::ReadOnly,
            access: Access::REMOTE_READ,
            via: RegCall::RegMr,
        },
        expect: Expect::Ok,
        safe_api: MR_OWNS_ITS_MEMORY,
        drop_in: HOLDS,
        man: "ibv_reg_mr(3): \"Local read access is always enabled for the MR\"; \
              IBV_ACCESS_REMOTE_READ needs no write: a read-only mapping registers \
              (registration.c rule 3)",
    },
    Rule {
        name: "reg_mr_read_only_without_access_is_ok",
        case: Case::RegMrMemory {
            memory: Memory::ReadOnly,
            access: Access::NONE,
            via: RegCall::RegMr,
        },
        expect: Expect::Ok,
        safe_api: MR_OWNS_ITS_MEMORY,
        drop_in: HOLDS,
        man: "ibv_reg_mr(3): \"Local read access is always enabled for the MR\": no access \
              flags over a read-only mapping registers (registration.c rule 3)",
    },
    Rule {
        name: "reg_mr_iova2_length_0",
        case: Case::RegMrMemory {
            memory: Memory::ZeroLength,
            access: Access::NONE,
            via: RegCall::RegMrIova2,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: SafeApi::NotExpressible(
            "the safe API registers through Pd::reg_mr only (its length 0 is \
             reg_mr_length_0); ibv_reg_mr_iova2 is the C ABI's",
        ),
        drop_in: HOLDS,
        man: "ibv_reg_mr(3): \"NULL if the request fails\"; length 0 through ibv_reg_mr_iova2: \
              EINVAL, as ib_umem_get (registration.c rule 4; ibv_reg_mr's is reg_mr_length_0)",
    },
    Rule {
        name: "reg_mr_tebibyte_over_a_page_under_memlock",
        case: Case::RegMrMemory {
            memory: Memory::TebibyteOverPageUnderMemlock,
            access: Access::LOCAL_WRITE,
            via: RegCall::RegMr,
        },
        expect: Expect::Errno(ENOMEM),
        safe_api: MR_OWNS_ITS_MEMORY,
        drop_in: HOLDS,
        man: "ibv_reg_mr(3): \"NULL if the request fails\"; ib_umem_get charges the pages to \
              RLIMIT_MEMLOCK before it pins them: 1 TiB under a 64 KiB limit without \
              CAP_IPC_LOCK is ENOMEM (registration.c rule 5; without the limit it is the \
              unmapped range, EFAULT)",
    },
    Rule {
        name: "reg_mr_past_memlock",
        case: Case::RegMrPastMemlock,
        expect: Expect::Errno(ENOMEM),
        safe_api: cause("Error::Register(OverMemlock)"),
        drop_in: HOLDS,
        man: "ibv_reg_mr(3): \"NULL if the request fails\"; getrlimit(2): RLIMIT_MEMLOCK, \
              \"The maximum number of bytes of memory that may be locked into RAM\", which \
              ib_umem_get applies to pinned pages unless the caller has CAP_IPC_LOCK: ENOMEM, \
              and deregistering gives the pages back (registration.c rule 7)",
    },
    Rule {
        name: "rdma_write_into_a_region_unmapped_while_registered",
        case: Case::RdmaWriteIntoUnmappedRegion,
        expect: Expect::Completes(Status::RemAccessErr),
        safe_api: MR_OWNS_ITS_MEMORY,
        drop_in: HOLDS,
        man: "ibv_reg_mr(3): the range must stay mapped while registered; when the application \
              breaks that, the device's access fails as a bad access (ibv_poll_cq(3): \
              IBV_WC_REM_ACCESS_ERR \"Remote Access Error\") and never crashes the process \
              (registration.c rule 6)",
    },
    // ------------------------------------------------------------ memory windows
    Rule {
        name: "alloc_mw_bad_type",
        case: Case::AllocMw { mw_type: 7 },
        expect: Expect::Errno(EINVAL),
        safe_api: WINDOW_TYPES_ARE_AN_ENUM,
        drop_in: HOLDS,
        man: "ibv_alloc_mw(3): type is IBV_MW_TYPE_1 or IBV_MW_TYPE_2; \"returns NULL on \
              error\" with errno set: EINVAL for any other type",
    },
    Rule {
        name: "alloc_mw_type_2",
        case: Case::AllocMw { mw_type: 2 },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        drop_in: HOLDS,
        man: "ibv_alloc_mw(3): \"allocates a memory window ... of type type\" \
              (IBV_MW_TYPE_2), associated with the protection domain pd",
    },
];

/// Every rule has a unique name and a citation, every refusal an errno or a cause, and a
/// door that differs or breaks the rule says how and why.
pub fn check_table() -> Result<(), String> {
    for (i, a) in RULES.iter().enumerate() {
        if a.man.is_empty() || a.name.is_empty() {
            return Err(format!("rule {i} lacks a name or a citation"));
        }
        if RULES[..i].iter().any(|b| b.name == a.name) {
            return Err(format!("rule name {} twice", a.name));
        }
        if let DropIn::Discrepancy { observed, note } = a.drop_in {
            if note.is_empty() || observed == a.expect {
                return Err(format!(
                    "{}: a drop-in discrepancy without a note, or none",
                    a.name
                ));
            }
        }
        let (safe_expect, cause) = match a.safe_api {
            SafeApi::Expressible { cause } => (a.expect, cause),
            SafeApi::Differs { expect, cause, why } => {
                if why.is_empty() || expect == a.expect {
                    return Err(format!(
                        "{}: differs without saying why, or not at all",
                        a.name
                    ));
                }
                (expect, cause)
            }
            SafeApi::Discrepancy {
                observed,
                cause,
                note,
            } => {
                if note.is_empty() || observed == a.expect {
                    return Err(format!("{}: a discrepancy without a note, or none", a.name));
                }
                (observed, cause)
            }
            SafeApi::NotExpressible(why) => {
                if why.is_empty() {
                    return Err(format!("{}: not expressible without saying why", a.name));
                }
                continue;
            }
        };
        match (safe_expect.is_refusal(), cause) {
            (false, Some(c)) => {
                return Err(format!(
                    "{}: the safe API is not expected to refuse, yet a cause {c} is named",
                    a.name
                ))
            }
            (true, None) => {
                return Err(format!(
                    "{}: the safe API is expected to refuse, yet no cause is named",
                    a.name
                ))
            }
            _ => {}
        }
    }
    Ok(())
}
