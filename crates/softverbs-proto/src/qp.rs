//! One queue pair: its state machine (`ibv_modify_qp(3)` transitions and attribute
//! masks), its queues, posting, and the error / flush path (reference §2.7).
//!
//! The requester, completer and responder are further `impl Qp` blocks in their own
//! modules. Everything here is reached through [`Engine`](crate::Engine).

use std::collections::VecDeque;

use rustc_hash::FxHashMap;
use softverbs_cq::{WcOpcode, WcStatus, WorkCompletion};

use crate::error::{PostVerb, Queue, VerbsError};
use crate::output::{AsyncEvent, Completion, Counters, CqTarget};
use crate::psn::{self, PSN_MASK};
use crate::sched::Marks;
use crate::srq::Srq;
use crate::types::{
    AccessFlags, AddressVector, AttrMask, EngineConfig, QpAttr, QpInit, QpState, QpType,
};
use crate::wr::{FlushSelectivity, Gather, RecvWr, SendOp, SendWr, SgeList};

/// The parts of the engine a QP writes to while it runs.
pub(crate) struct Ctx<'a> {
    pub config: &'a EngineConfig,
    pub srqs: &'a mut FxHashMap<u32, Srq>,
    pub completions: &'a mut VecDeque<Completion>,
    pub events: &'a mut VecDeque<AsyncEvent>,
    pub counters: &'a mut Counters,
}

/// A send work request inside the send queue.
#[derive(Clone, Debug)]
pub(crate) struct SendWqe {
    pub wr: SendWr,
    /// Total payload length (8 for atomics).
    pub len: u64,
    /// Produces a completion on success.
    pub signaled: bool,
    /// PSN of the first packet (valid once `started`).
    pub first_psn: u32,
    /// PSNs this message consumes.
    pub npkts: u32,
    /// The first packet has been sent at least once.
    pub started: bool,
    /// Counted in the `max_rd_atomic` budget.
    pub holds_rd_atomic: bool,
    /// A local error found when building it; completes with this status when it reaches
    /// the head of the send queue.
    pub error: Option<WcStatus>,
}

impl SendWqe {
    pub fn last_psn(&self) -> u32 {
        psn::add(self.first_psn, self.npkts - 1)
    }

    pub fn wc_opcode(&self) -> WcOpcode {
        send_wc_opcode(&self.wr.op)
    }
}

pub(crate) fn send_wc_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => WcOpcode::Send,
        SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
        SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
        SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
        SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
        SendOp::AtomicWrite { .. } => WcOpcode::AtomicWrite,
        SendOp::Flush { .. } => WcOpcode::Flush,
        SendOp::BindMw(_) => WcOpcode::BindMw,
        SendOp::LocalInv { .. } => WcOpcode::LocalInv,
    }
}

/// The message the responder is in the middle of.
#[derive(Clone, Debug, Default)]
pub(crate) enum CurMsg {
    /// Between messages: the next packet must be FIRST or ONLY.
    #[default]
    Idle,
    /// A SEND whose receive WQE is consumed; `offset` bytes placed so far.
    Send { wqe: RecvWr, offset: u64 },
    /// An RDMA WRITE: next address, bytes still expected, total length.
    Write {
        va: u64,
        rkey: u32,
        remaining: u64,
        total: u32,
    },
    /// UC: the rest of a broken message is being dropped.
    Dropping,
}

/// A responder resource (reference §2.3): what a duplicate read or atomic replays.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Resource {
    Read {
        first_psn: u32,
        last_psn: u32,
        va: u64,
        rkey: u32,
        len: u32,
    },
    Atomic {
        psn: u32,
        orig: u64,
    },
    /// An ATOMIC WRITE or FLUSH executed at `psn`: a duplicate is answered again, never
    /// executed again (IBTA 1.5 oA19-14, oA19-15; rxe's `res->replay`).
    Placed {
        psn: u32,
    },
}

/// Packets the responder still has to send.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RespOut {
    /// ACK, NAK or RNR NAK.
    Ack { psn: u32, syndrome: u8, msn: u32 },
    /// Atomic acknowledge with the original value.
    AtomicAck { psn: u32, orig: u64, msn: u32 },
    /// The answer to an ATOMIC WRITE or FLUSH: a zero-length RDMA READ RESPONSE ONLY, as
    /// rxe sends it (`send_read_response_ack`).
    Placed { psn: u32, msn: u32 },
    /// Read response packets still to send.
    Read {
        psn: u32,
        va: u64,
        rkey: u32,
        remaining: u64,
        first: bool,
        msn: u32,
    },
}

/// A queue pair.
#[derive(Clone, Debug)]
pub(crate) struct Qp {
    pub qpn: u32,
    pub init: QpInit,
    pub state: QpState,
    pub attr: QpAttr,
    /// Payload bytes per packet instead of the path MTU, for a peer no packet of which
    /// crosses a wire ([`crate::Engine::set_segment_size`]).
    pub segment: Option<u32>,

    pub sq: VecDeque<SendWqe>,
    pub rq: VecDeque<RecvWr>,

    // Requester.
    /// Index in `sq` of the work request being transmitted.
    pub req_index: usize,
    /// Packet (PSN offset) within it.
    pub req_pkt: u32,
    /// Next PSN to transmit.
    pub req_psn: u32,
    /// One past the highest PSN ever transmitted.
    pub sent_high: u32,
    /// Reads and atomics issued and not yet completed.
    pub rd_atomic_outstanding: u32,

    // Completer.
    /// Oldest unacknowledged PSN.
    pub comp_psn: u32,
    pub retry_left: u8,
    pub rnr_left: u8,
    pub retrans_deadline: Option<u64>,
    pub rnr_deadline: Option<u64>,
    /// A NAK-triggered retry already restarted from this PSN.
    pub nak_retry_from: Option<u32>,
    /// A loss signal (a go-back-N) the peer's congestion window has not yet seen
    /// (`window.rs`).
    pub window_loss: bool,
    /// The peer's congestion window held this QP's next request (counted once per stall).
    pub window_held: bool,
    /// The last `poll_transmit` returned nothing because the peer's window held this QP's
    /// next request (set afresh by every call; `window_held` counts stalls instead).
    pub held_by_window: bool,
    /// Which of the engine's schedule lists hold this QP (`sched.rs`); kept across a reset.
    pub marks: Marks,
    /// Where the peers' windows keep this QP's charge (`window.rs`), once they governed
    /// it; kept across a reset, as the charge is until the next sync.
    pub window_slot: Option<u32>,
    /// One past the last PSN sent that the responder answers for certain: a packet with
    /// AckReq, or a read or atomic (and ATOMIC WRITE, FLUSH), which get responses.
    pub answer_end: u32,

    // Responder.
    pub epsn: u32,
    pub msn: u32,
    pub nak_sent: bool,
    pub cur: CurMsg,
    pub resources: VecDeque<Resource>,
    pub resp_out: VecDeque<RespOut>,
    /// Reply limiter (see `EngineConfig::duplicate_reply_window_ns`): the expected PSN
    /// and time of the last ACK queued in answer to a duplicate request.
    pub last_ack: Option<(u32, u64)>,
    /// The expected PSN and time of the last NAK sequence error queued.
    pub last_nak: Option<(u32, u64)>,
    /// PSN and time of the recent read-data and AtomicAck replays (within the window; at
    /// most one per responder resource).
    pub replays: VecDeque<(u32, u64)>,
    pub comm_est_raised: bool,
    pub sq_drained_raised: bool,
}

/// Required and optional attributes of a transition, from the table of `ibv_modify_qp(3)`
/// (required) and the IBTA / kernel `qp_state_table` (optional). `None`: illegal.
pub(crate) fn transition_masks(
    qp_type: QpType,
    cur: QpState,
    next: QpState,
) -> Option<(AttrMask, AttrMask)> {
    use QpState::*;
    use QpType::*;
    type M = AttrMask;
    let none = M::empty();
    let pair = |req: M, opt: M| Some((req, opt));
    match (cur, next) {
        (_, Reset) | (_, Err) => pair(none, none),
        (Reset, Init) => match qp_type {
            Ud => pair(M::PKEY_INDEX | M::PORT | M::QKEY, none),
            Uc | Rc => pair(M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, none),
        },
        (Init, Init) => match qp_type {
            Ud => pair(none, M::PKEY_INDEX | M::PORT | M::QKEY),
            Uc | Rc => pair(none, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
        },
        (Init, Rtr) => match qp_type {
            Ud => pair(none, M::PKEY_INDEX | M::QKEY),
            Uc => pair(
                M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
            Rc => pair(
                M::AV
                    | M::PATH_MTU
                    | M::DEST_QPN
                    | M::RQ_PSN
                    | M::MAX_DEST_RD_ATOMIC
                    | M::MIN_RNR_TIMER,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
        },
        (Rtr, Rts) => match qp_type {
            Ud => pair(M::SQ_PSN, M::CUR_STATE | M::QKEY),
            Uc => pair(
                M::SQ_PSN,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE,
            ),
            Rc => pair(
                M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
            ),
        },
        (Rts, Rts) | (Sqd, Rts) => match qp_type {
            Ud => pair(none, M::CUR_STATE | M::QKEY),
            Uc => pair(
                none,
                M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE,
            ),
            Rc => pair(
                none,
                M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::MIN_RNR_TIMER,
            ),
        },
        (Rts, Sqd) => pair(none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => match qp_type {
            Ud => pair(none, M::PKEY_INDEX | M::QKEY),
            Uc => pair(
                none,
                M::AV | M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PATH_MIG_STATE,
            ),
            Rc => pair(
                none,
                M::PORT
                    | M::AV
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC
                    | M::MAX_DEST_RD_ATOMIC
                    | M::ALT_PATH
                    | M::ACCESS_FLAGS
                    | M::PKEY_INDEX
                    | M::MIN_RNR_TIMER
                    | M::PATH_MIG_STATE,
            ),
        },
        (Sqe, Rts) => match qp_type {
            Ud => pair(none, M::CUR_STATE | M::QKEY),
            Uc => pair(none, M::CUR_STATE | M::ACCESS_FLAGS),
            Rc => None,
        },
        _ => None,
    }
}

/// Local ACK timeout in nanoseconds: 4.096 µs · 2^timeout; `None` for 0 (infinite).
pub(crate) fn ack_timeout_ns(timeout: u8) -> Option<u64> {
    (timeout != 0).then(|| 4096u64 << timeout.min(31))
}

/// RNR NAK timer code → minimum wait in nanoseconds (reference §1.4).
pub(crate) fn rnr_delay_ns(code: u8) -> u64 {
    const US: [u64; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    US[usize::from(code & 0x1F)] * 1000
}

impl Qp {
    pub fn new(qpn: u32, init: QpInit) -> Self {
        Qp {
            qpn,
            init,
            state: QpState::Reset,
            attr: QpAttr {
                port_num: 1,
                ..QpAttr::default()
            },
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            req_index: 0,
            req_pkt: 0,
            req_psn: 0,
            sent_high: 0,
            rd_atomic_outstanding: 0,
            comp_psn: 0,
            retry_left: 0,
            rnr_left: 0,
            retrans_deadline: None,
            rnr_deadline: None,
            nak_retry_from: None,
            window_loss: false,
            window_held: false,
            held_by_window: false,
            marks: Marks::default(),
            window_slot: None,
            answer_end: 0,
            epsn: 0,
            msn: 0,
            nak_sent: false,
            cur: CurMsg::Idle,
            resources: VecDeque::new(),
            resp_out: VecDeque::new(),
            last_ack: None,
            last_nak: None,
            replays: VecDeque::new(),
            comm_est_raised: false,
            sq_drained_raised: false,
            segment: None,
        }
    }

    /// Payload bytes per packet for this QP: the port MTU for UD, else the path MTU or the
    /// segment size set in its place.
    pub fn mtu(&self, config: &EngineConfig) -> u32 {
        match self.init.qp_type {
            QpType::Ud => config.port_mtu.bytes(),
            _ => self.segment.unwrap_or_else(|| self.attr.path_mtu.bytes()),
        }
    }

    /// `ibv_modify_qp`: validate everything first, then apply (atomic modify).
    pub fn modify(
        &mut self,
        attr: &QpAttr,
        mask: AttrMask,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), VerbsError> {
        let cur = self.state;
        let next = if mask.contains(AttrMask::STATE) {
            attr.qp_state
        } else {
            cur
        };
        let qp_type = self.init.qp_type;
        let (required, optional) =
            transition_masks(qp_type, cur, next).ok_or(VerbsError::IllegalTransition {
                qp_type,
                from: cur,
                to: next,
            })?;
        let given = mask - AttrMask::STATE;
        if !given.contains(required) {
            return Err(VerbsError::MissingAttributes {
                missing: required - given,
            });
        }
        let extra = given - required - optional;
        if !extra.is_empty() {
            return Err(VerbsError::AttributesNotAllowed { extra });
        }
        self.validate_values(attr, mask, ctx.config)?;

        // Apply.
        let m = |f: AttrMask| mask.contains(f);
        if m(AttrMask::ACCESS_FLAGS) {
            self.attr.qp_access_flags = attr.qp_access_flags;
        }
        if m(AttrMask::PKEY_INDEX) {
            self.attr.pkey_index = attr.pkey_index;
        }
        if m(AttrMask::PORT) {
            self.attr.port_num = attr.port_num;
        }
        if m(AttrMask::QKEY) {
            self.attr.qkey = attr.qkey;
        }
        if m(AttrMask::AV) {
            self.attr.ah_attr = attr.ah_attr;
        }
        if m(AttrMask::PATH_MTU) {
            self.attr.path_mtu = attr.path_mtu;
        }
        if m(AttrMask::TIMEOUT) {
            self.attr.timeout = attr.timeout;
        }
        if m(AttrMask::RETRY_CNT) {
            self.attr.retry_cnt = attr.retry_cnt;
            self.retry_left = attr.retry_cnt;
        }
        if m(AttrMask::RNR_RETRY) {
            self.attr.rnr_retry = attr.rnr_retry;
            self.rnr_left = attr.rnr_retry;
        }
        if m(AttrMask::RQ_PSN) {
            self.attr.rq_psn = attr.rq_psn;
            self.epsn = attr.rq_psn;
        }
        if m(AttrMask::MAX_QP_RD_ATOMIC) {
            self.attr.max_rd_atomic = attr.max_rd_atomic;
        }
        if m(AttrMask::MIN_RNR_TIMER) {
            self.attr.min_rnr_timer = attr.min_rnr_timer;
        }
        if m(AttrMask::SQ_PSN) {
            self.attr.sq_psn = attr.sq_psn;
            self.req_psn = attr.sq_psn;
            self.comp_psn = attr.sq_psn;
            self.sent_high = attr.sq_psn;
            self.answer_end = attr.sq_psn;
        }
        if m(AttrMask::MAX_DEST_RD_ATOMIC) {
            self.attr.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if m(AttrMask::DEST_QPN) {
            self.attr.dest_qp_num = attr.dest_qp_num;
        }
        if m(AttrMask::EN_SQD_ASYNC_NOTIFY) {
            self.attr.en_sqd_async_notify = attr.en_sqd_async_notify;
        }

        match next {
            QpState::Reset => self.reset(),
            QpState::Err if cur != QpState::Err => {
                self.state = QpState::Err;
                self.flush(ctx);
            }
            QpState::Sqd if cur != QpState::Sqd => {
                self.state = QpState::Sqd;
                self.sq_drained_raised = !self.attr.en_sqd_async_notify;
                self.check_sq_drained(ctx);
            }
            QpState::Rts if cur == QpState::Sqe => {
                self.state = QpState::Rts;
            }
            other => self.state = other,
        }
        self.trace_modify(cur, next);
        Ok(())
    }

    /// The log line of a transition `ibv_modify_qp` made (DEBUG), with the attributes a
    /// connection hangs on when it enters RTR or RTS.
    fn trace_modify(&self, from: QpState, to: QpState) {
        let (qpn, qp_type, a) = (self.qpn, self.init.qp_type, &self.attr);
        match to {
            _ if to == from => {}
            QpState::Rtr => tracing::debug!(
                qpn,
                ?qp_type,
                ?from,
                ?to,
                cause = "modify_qp",
                dest_qpn = a.dest_qp_num,
                rq_psn = a.rq_psn,
                path_mtu = a.path_mtu.bytes(),
                "QP state change"
            ),
            QpState::Rts => tracing::debug!(
                qpn,
                ?qp_type,
                ?from,
                ?to,
                cause = "modify_qp",
                sq_psn = a.sq_psn,
                timeout = a.timeout,
                retry_cnt = a.retry_cnt,
                rnr_retry = a.rnr_retry,
                "QP state change"
            ),
            _ => tracing::debug!(
                qpn,
                ?qp_type,
                ?from,
                ?to,
                cause = "modify_qp",
                "QP state change"
            ),
        }
    }

    fn validate_values(
        &self,
        attr: &QpAttr,
        mask: AttrMask,
        config: &EngineConfig,
    ) -> Result<(), VerbsError> {
        let m = |f: AttrMask| mask.contains(f);
        if m(AttrMask::CUR_STATE) && attr.cur_qp_state != self.state {
            return Err(VerbsError::CurrentStateMismatch {
                given: attr.cur_qp_state,
                actual: self.state,
            });
        }
        if m(AttrMask::PORT) && attr.port_num != 1 {
            return Err(VerbsError::NoSuchPort {
                port: u32::from(attr.port_num),
            });
        }
        let known = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC
            // IBTA 1.5 (rxe's check_qp_attr_access): which FLUSH placements the QP takes.
            | AccessFlags::FLUSH_GLOBAL
            | AccessFlags::FLUSH_PERSISTENT;
        if m(AttrMask::ACCESS_FLAGS) && !(attr.qp_access_flags - known).is_empty() {
            return Err(VerbsError::UnknownAccessFlags {
                bits: attr.qp_access_flags.bits(),
            });
        }
        if m(AttrMask::AV) {
            check_address_vector(&attr.ah_attr, config)?;
        }
        // Each ranged attribute with its value and its largest allowed value: P_Key index
        // 0 only (one default partition), the 5-bit timers, the 3-bit retry counts, 24-bit
        // PSNs and QPN, the device's read/atomic limits, the port's active MTU.
        let ranged = [
            (AttrMask::PKEY_INDEX, u64::from(attr.pkey_index), 0),
            (
                AttrMask::PATH_MTU,
                u64::from(attr.path_mtu as u32),
                u64::from(config.port_mtu as u32),
            ),
            (AttrMask::TIMEOUT, u64::from(attr.timeout), 31),
            (AttrMask::RETRY_CNT, u64::from(attr.retry_cnt), 7),
            (AttrMask::RNR_RETRY, u64::from(attr.rnr_retry), 7),
            (AttrMask::MIN_RNR_TIMER, u64::from(attr.min_rnr_timer), 31),
            (
                AttrMask::RQ_PSN,
                u64::from(attr.rq_psn),
                u64::from(PSN_MASK),
            ),
            (
                AttrMask::SQ_PSN,
                u64::from(attr.sq_psn),
                u64::from(PSN_MASK),
            ),
            (
                AttrMask::DEST_QPN,
                u64::from(attr.dest_qp_num),
                u64::from(PSN_MASK),
            ),
            (
                AttrMask::MAX_QP_RD_ATOMIC,
                u64::from(attr.max_rd_atomic),
                u64::from(config.max_qp_init_rd_atom),
            ),
            (
                AttrMask::MAX_DEST_RD_ATOMIC,
                u64::from(attr.max_dest_rd_atomic),
                u64::from(config.max_qp_rd_atom),
            ),
        ];
        for (attr, value, max) in ranged {
            if m(attr) && value > max {
                return Err(VerbsError::AttributeOutOfRange { attr, value, max });
            }
        }
        Ok(())
    }

    /// Modify to RESET: forget everything, no completions.
    fn reset(&mut self) {
        let (qpn, init, marks, window_slot) = (self.qpn, self.init, self.marks, self.window_slot);
        *self = Qp::new(qpn, init);
        self.marks = marks;
        self.window_slot = window_slot;
    }

    /// `ibv_post_send`.
    pub fn post_send(&mut self, mut wr: SendWr, ctx: &mut Ctx<'_>) -> Result<(), VerbsError> {
        if matches!(self.state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(VerbsError::WrongState {
                verb: PostVerb::Send,
                state: self.state,
            });
        }
        let qp_type = self.init.qp_type;
        let allowed = match wr.op {
            SendOp::Send | SendOp::SendWithImm { .. } => true,
            SendOp::SendWithInv { .. }
            | SendOp::RdmaWrite { .. }
            | SendOp::RdmaWriteWithImm { .. } => qp_type != QpType::Ud,
            SendOp::RdmaRead { .. }
            | SendOp::CompareSwap { .. }
            | SendOp::FetchAdd { .. }
            | SendOp::AtomicWrite { .. }
            | SendOp::Flush { .. } => qp_type == QpType::Rc,
            // rxe takes binds and local invalidations on connected QPs.
            SendOp::BindMw(_) | SendOp::LocalInv { .. } => qp_type != QpType::Ud,
        };
        if !allowed {
            return Err(VerbsError::OpcodeNotForQpType {
                opcode: wr.op.name(),
                qp_type,
            });
        }
        if let SendOp::Flush {
            len,
            placement,
            selectivity,
            ..
        } = wr.op
        {
            // ibv_wr_post(3): the type is IBV_FLUSH_GLOBAL and / or IBV_FLUSH_PERSISTENT.
            if placement.is_empty() {
                return Err(VerbsError::BadFlush {
                    placement: placement.bits(),
                    selectivity: selectivity.to_raw(),
                });
            }
            if selectivity == FlushSelectivity::Range && len > 1 << 31 {
                return Err(VerbsError::MessageTooLong { len });
            }
        }
        if wr.op.is_placement() {
            // The operands travel in the request: no local buffer is read or written.
            wr.gather = Gather::Sges(SgeList::new());
            wr.flags.remove(crate::wr::SendFlags::INLINE);
        }
        let caps = &self.init.caps;
        match &wr.gather {
            Gather::Sges(sges) if sges.len() > caps.max_send_sge as usize => {
                return Err(VerbsError::TooManySges {
                    num_sge: sges.len(),
                    max: caps.max_send_sge,
                });
            }
            Gather::Inline(data) if data.len() > caps.max_inline_data as usize => {
                return Err(VerbsError::InlineTooLong {
                    len: data.len(),
                    max: caps.max_inline_data,
                });
            }
            Gather::Inline(_) if wr.op.is_read_or_atomic() => {
                return Err(VerbsError::InlineOnReadOrAtomic);
            }
            _ => {}
        }
        // A local operation has no payload: its scatter/gather list is ignored.
        let len = if wr.op.is_local() { 0 } else { wr.gather.len() };
        if len > 1 << 31 {
            return Err(VerbsError::MessageTooLong { len });
        }
        if wr.op.is_atomic() && len != 8 {
            return Err(VerbsError::AtomicLength { len });
        }
        match &wr.ud {
            None if qp_type == QpType::Ud => return Err(VerbsError::MissingAddressHandle),
            Some(ud) if qp_type == QpType::Ud && ud.pd != self.init.pd => {
                return Err(VerbsError::AddressHandleOfAnotherPd);
            }
            Some(_) if qp_type != QpType::Ud => return Err(VerbsError::AddressHandleOnConnectedQp),
            _ => {}
        }
        if self.sq.len() >= caps.max_send_wr as usize {
            return Err(VerbsError::QueueFull { queue: Queue::Send });
        }
        let signaled = self.init.sq_sig_all || wr.flags.contains(crate::wr::SendFlags::SIGNALED);
        let wqe = SendWqe {
            len,
            signaled,
            first_psn: 0,
            npkts: 1,
            started: false,
            holds_rd_atomic: false,
            error: None,
            wr,
        };
        if matches!(self.state, QpState::Err | QpState::Sqe) {
            // Accepted and flushed at once (reference §2.7).
            tracing::debug!(
                qpn = self.qpn,
                wr_id = wqe.wr.wr_id,
                state = ?self.state,
                "send work request posted in an error state: flushed"
            );
            ctx.completions.push_back(Completion {
                cq: CqTarget::Send,
                wc: WorkCompletion::failure(wqe.wr.wr_id, WcStatus::WrFlushErr, self.qpn, 0)
                    .with_opcode(wqe.wc_opcode()),
                solicited: false,
            });
            return Ok(());
        }
        self.sq.push_back(wqe);
        Ok(())
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, wr: RecvWr, ctx: &mut Ctx<'_>) -> Result<(), VerbsError> {
        if self.init.srq.is_some() {
            return Err(VerbsError::ReceivesFromSrq);
        }
        if self.state == QpState::Reset {
            return Err(VerbsError::WrongState {
                verb: PostVerb::Recv,
                state: self.state,
            });
        }
        if wr.sg_list.len() > self.init.caps.max_recv_sge as usize {
            return Err(VerbsError::TooManySges {
                num_sge: wr.sg_list.len(),
                max: self.init.caps.max_recv_sge,
            });
        }
        if self.rq.len() >= self.init.caps.max_recv_wr as usize {
            return Err(VerbsError::QueueFull {
                queue: Queue::Receive,
            });
        }
        if self.state == QpState::Err {
            tracing::debug!(
                qpn = self.qpn,
                wr_id = wr.wr_id,
                "receive work request posted in the error state: flushed"
            );
            ctx.completions.push_back(recv_flush(self.qpn, wr.wr_id));
            return Ok(());
        }
        self.rq.push_back(wr);
        Ok(())
    }

    /// Takes the next receive WQE (own RQ or SRQ), raising the SRQ limit event.
    pub fn take_recv(&mut self, ctx: &mut Ctx<'_>) -> Option<RecvWr> {
        match self.init.srq {
            None => self.rq.pop_front(),
            Some(id) => {
                let srq = ctx.srqs.get_mut(&id.0)?;
                let wqe = srq.wqes.pop_front()?;
                if srq.limit != 0 && (srq.wqes.len() as u32) < srq.limit {
                    srq.limit = 0;
                    ctx.events
                        .push_back(AsyncEvent::SrqLimitReached { srq: id.0 });
                }
                Some(wqe)
            }
        }
    }

    /// Puts an unused receive WQE back at the head (UC message broken by loss).
    pub fn untake_recv(&mut self, wqe: RecvWr, ctx: &mut Ctx<'_>) {
        match self.init.srq {
            None => self.rq.push_front(wqe),
            Some(id) => {
                if let Some(srq) = ctx.srqs.get_mut(&id.0) {
                    srq.wqes.push_front(wqe);
                }
            }
        }
    }

    /// A receive WQE is available.
    pub fn has_recv(&self, ctx: &Ctx<'_>) -> bool {
        match self.init.srq {
            None => !self.rq.is_empty(),
            Some(id) => ctx.srqs.get(&id.0).is_some_and(|s| !s.wqes.is_empty()),
        }
    }

    /// Completes the head send WQE: success (if signaled) or its error (always). An error
    /// moves the QP to ERR (RC) or SQE (UC / UD) and flushes.
    pub fn complete_head(&mut self, status: WcStatus, vendor_err: u32, ctx: &mut Ctx<'_>) {
        let Some(wqe) = self.sq.pop_front() else {
            return;
        };
        if self.req_index == 0 {
            // The request being (re)transmitted is gone: start the next one afresh; the
            // completer resynchronises the PSN.
            self.req_pkt = 0;
        }
        self.req_index = self.req_index.saturating_sub(1);
        if wqe.holds_rd_atomic {
            self.rd_atomic_outstanding = self.rd_atomic_outstanding.saturating_sub(1);
        }
        if status == WcStatus::Success {
            if wqe.signaled {
                let byte_len = match wqe.wr.op {
                    SendOp::CompareSwap { .. }
                    | SendOp::FetchAdd { .. }
                    | SendOp::AtomicWrite { .. } => 8,
                    _ => wqe.len as u32,
                };
                ctx.completions.push_back(Completion {
                    cq: CqTarget::Send,
                    wc: WorkCompletion::success(wqe.wr.wr_id, wqe.wc_opcode(), self.qpn)
                        .with_byte_len(byte_len),
                    solicited: false,
                });
            }
            self.check_sq_drained(ctx);
        } else {
            let to = match self.init.qp_type {
                QpType::Rc => QpState::Err,
                QpType::Uc | QpType::Ud => QpState::Sqe,
            };
            tracing::warn!(
                qpn = self.qpn,
                wr_id = wqe.wr.wr_id,
                %status,
                vendor_err,
                from = ?self.state,
                ?to,
                "send work request failed: QP state change"
            );
            ctx.completions.push_back(Completion {
                cq: CqTarget::Send,
                wc: WorkCompletion::failure(wqe.wr.wr_id, status, self.qpn, vendor_err)
                    .with_opcode(wqe.wc_opcode()),
                solicited: false,
            });
            match self.init.qp_type {
                QpType::Rc => {
                    self.state = QpState::Err;
                    self.flush(ctx);
                }
                QpType::Uc | QpType::Ud => {
                    self.state = QpState::Sqe;
                    self.flush_send_queue(ctx);
                }
            }
        }
    }

    /// Completes a receive WQE with `status` (an error on the receive side).
    pub fn fail_recv(&self, wqe: &RecvWr, status: WcStatus, opcode: WcOpcode, ctx: &mut Ctx<'_>) {
        ctx.completions.push_back(Completion {
            cq: CqTarget::Recv,
            wc: WorkCompletion::failure(wqe.wr_id, status, self.qpn, 0).with_opcode(opcode),
            solicited: false,
        });
    }

    /// Responder error (class A / C): the QP goes to ERR and flushes; the NAK already
    /// queued still goes out.
    pub fn responder_error(&mut self, event: AsyncEvent, ctx: &mut Ctx<'_>) {
        if self.state == QpState::Err {
            return;
        }
        tracing::warn!(
            qpn = self.qpn,
            ?event,
            from = ?self.state,
            to = ?QpState::Err,
            "responder error: QP state change"
        );
        ctx.events.push_back(event);
        self.state = QpState::Err;
        self.flush(ctx);
    }

    fn flush_send_queue(&mut self, ctx: &mut Ctx<'_>) {
        for wqe in self.sq.drain(..) {
            ctx.completions.push_back(Completion {
                cq: CqTarget::Send,
                wc: WorkCompletion::failure(wqe.wr.wr_id, WcStatus::WrFlushErr, self.qpn, 0)
                    .with_opcode(wqe.wc_opcode()),
                solicited: false,
            });
        }
        self.req_index = 0;
        self.req_pkt = 0;
        self.rd_atomic_outstanding = 0;
        self.retrans_deadline = None;
        self.rnr_deadline = None;
    }

    /// Enter-ERR flush (reference §2.7): every outstanding send WQE, then the receive WQE
    /// in progress and every posted one, complete with `WR_FLUSH_ERR` in order.
    pub fn flush(&mut self, ctx: &mut Ctx<'_>) {
        tracing::debug!(
            qpn = self.qpn,
            send = self.sq.len(),
            recv = self.rq.len() + usize::from(matches!(self.cur, CurMsg::Send { .. })),
            "flushing the work requests with WR_FLUSH_ERR"
        );
        self.flush_send_queue(ctx);
        if let CurMsg::Send { wqe, .. } = std::mem::take(&mut self.cur) {
            ctx.completions.push_back(recv_flush(self.qpn, wqe.wr_id));
        }
        for wqe in self.rq.drain(..) {
            ctx.completions.push_back(recv_flush(self.qpn, wqe.wr_id));
        }
        self.resources.clear();
        self.resp_out.retain(|r| matches!(r, RespOut::Ack { .. }));
        if self.init.srq.is_some() {
            ctx.events
                .push_back(AsyncEvent::QpLastWqeReached { qpn: self.qpn });
        }
    }

    /// In SQD with notification asked for: raise `SqDrained` once nothing is in flight.
    pub fn check_sq_drained(&mut self, ctx: &mut Ctx<'_>) {
        if self.state == QpState::Sqd
            && !self.sq_drained_raised
            && !self.sq.front().is_some_and(|w| w.started)
        {
            self.sq_drained_raised = true;
            ctx.events
                .push_back(AsyncEvent::SqDrained { qpn: self.qpn });
        }
    }

    /// Whether [`poll_transmit`](Self::poll_transmit) may write a packet: a response is
    /// queued, or the requester is in RTS or SQD, not waiting for an RNR timer, and has a
    /// work request at its position. A superset of the QPs that send: the requester may
    /// still wait (fence, read/atomic budget, unacknowledged PSNs, the peer's window, a
    /// local operation at its position).
    pub fn may_transmit(&self) -> bool {
        !self.resp_out.is_empty()
            || (matches!(self.state, QpState::Rts | QpState::Sqd)
                && self.rnr_deadline.is_none()
                && self.req_index < self.sq.len())
    }

    /// Whether a local operation heads the send queue, ready to run: exactly the condition
    /// under which [`execute_local_operations`](Self::execute_local_operations) runs one.
    pub fn has_local_head(&self) -> bool {
        matches!(self.state, QpState::Rts | QpState::Sqd)
            && self.req_index == 0
            && self
                .sq
                .front()
                .is_some_and(|head| head.error.is_none() && head.wr.op.is_local())
    }

    /// Earliest deadline of this QP.
    pub fn poll_timeout(&self) -> Option<u64> {
        match (self.retrans_deadline, self.rnr_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The attributes as `ibv_query_qp` reports them.
    pub fn query(&self) -> QpAttr {
        QpAttr {
            qp_state: self.state,
            cur_qp_state: self.state,
            ..self.attr
        }
    }
}

pub(crate) fn recv_flush(qpn: u32, wr_id: u64) -> Completion {
    Completion {
        cq: CqTarget::Recv,
        wc: WorkCompletion::failure(wr_id, WcStatus::WrFlushErr, qpn, 0)
            .with_opcode(WcOpcode::Recv),
        solicited: false,
    }
}

/// The checks an address vector gets wherever one enters (a QP's path in `ibv_modify_qp`,
/// an address handle in `ibv_create_ah`): port 1 (or 0, "the QP's port"), and a source GID
/// index inside the port's GID table.
pub(crate) fn check_address_vector(
    av: &AddressVector,
    config: &EngineConfig,
) -> Result<(), VerbsError> {
    if av.port_num > 1 {
        return Err(VerbsError::NoSuchPort {
            port: u32::from(av.port_num),
        });
    }
    if u32::from(av.sgid_index) >= config.gid_table_len {
        return Err(VerbsError::BadSgidIndex {
            index: u32::from(av.sgid_index),
            table_len: config.gid_table_len,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use QpState::*;

    #[test]
    fn modify_table_matches_the_man_page_required_attributes() {
        // ibv_modify_qp(3), "required attributes" tables.
        let rc_rtr = transition_masks(QpType::Rc, Init, Rtr).unwrap().0;
        assert_eq!(
            rc_rtr,
            AttrMask::AV
                | AttrMask::PATH_MTU
                | AttrMask::DEST_QPN
                | AttrMask::RQ_PSN
                | AttrMask::MAX_DEST_RD_ATOMIC
                | AttrMask::MIN_RNR_TIMER
        );
        let rc_rts = transition_masks(QpType::Rc, Rtr, Rts).unwrap().0;
        assert_eq!(
            rc_rts,
            AttrMask::SQ_PSN
                | AttrMask::MAX_QP_RD_ATOMIC
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::TIMEOUT
        );
        assert_eq!(
            transition_masks(QpType::Ud, Init, Rtr).unwrap().0,
            AttrMask::empty()
        );
        assert_eq!(
            transition_masks(QpType::Ud, Rtr, Rts).unwrap().0,
            AttrMask::SQ_PSN
        );
        assert_eq!(
            transition_masks(QpType::Ud, Reset, Init).unwrap().0,
            AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY
        );
        assert_eq!(
            transition_masks(QpType::Uc, Init, Rtr).unwrap().0,
            AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN
        );
    }

    #[test]
    fn illegal_transitions_are_refused() {
        for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
            assert!(transition_masks(t, Reset, Rtr).is_none());
            assert!(transition_masks(t, Reset, Rts).is_none());
            assert!(transition_masks(t, Init, Rts).is_none());
            assert!(transition_masks(t, Rtr, Rtr).is_none());
            assert!(transition_masks(t, Err, Rts).is_none());
            assert!(transition_masks(t, Err, Init).is_none());
            assert!(transition_masks(t, Rts, Err).is_some());
            assert!(transition_masks(t, Err, Reset).is_some());
        }
        assert!(transition_masks(QpType::Rc, Sqe, Rts).is_none());
    }

    #[test]
    fn timers_follow_the_reference_tables() {
        assert_eq!(ack_timeout_ns(0), None);
        assert_eq!(ack_timeout_ns(14), Some(67_108_864)); // 67.1 ms, reference §2.5
        assert_eq!(rnr_delay_ns(12), 640_000);
        assert_eq!(rnr_delay_ns(0), 655_360_000);
        assert_eq!(rnr_delay_ns(25), 61_440_000); // not rxe's 61410 µs typo
    }
}
