//! What the engine hands back: completions, asynchronous events, transmits and counters.

use softverbs_cq::{CqOverrun, WorkCompletion};

use crate::error::Object;
use crate::types::AddressVector;

/// Which completion queue of its QP a completion belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CqTarget {
    /// The QP's send CQ.
    Send,
    /// The QP's receive CQ.
    Recv,
}

/// A work completion and the CQ it goes to (the QP is `wc.qp_num()`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// Send or receive CQ.
    pub cq: CqTarget,
    /// The completion, built per reference §3.
    pub wc: WorkCompletion,
    /// Whether the message carried the Solicited Event bit (receive completions only):
    /// what decides if a solicited-only CQ arm fires (`ibv_req_notify_cq(3)`).
    pub solicited: bool,
}

/// An asynchronous event (`enum ibv_event_type`, the ones softverbs raises), what
/// `ibv_get_async_event(3)` returns.
///
/// The engine raises the QP and SRQ events ([`Engine::poll_event`](crate::Engine::poll_event));
/// the others are the device's: [`AsyncEvent::CqError`] from a CQ's overrun notice
/// ([`CqOverrun`], converted by `From`), [`AsyncEvent::PortActive`] when it opens, and
/// [`AsyncEvent::DeviceFatal`] (which nothing raises yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AsyncEvent {
    /// `IBV_EVENT_CQ_ERR`: a CQ overran.
    CqError {
        /// The CQ's id.
        cq_id: u64,
        /// The CQ's user context.
        user_context: u64,
    },
    /// `IBV_EVENT_QP_FATAL`: a QP entered the error state on a local error, one no
    /// completion reports.
    QpFatal {
        /// The QP number.
        qpn: u32,
    },
    /// `IBV_EVENT_QP_REQ_ERR`: the responder received an invalid request and the QP went
    /// to the error state.
    QpRequestError {
        /// The QP number.
        qpn: u32,
    },
    /// `IBV_EVENT_QP_ACCESS_ERR`: the responder saw an access violation and the QP went to
    /// the error state.
    QpAccessError {
        /// The QP number.
        qpn: u32,
    },
    /// `IBV_EVENT_COMM_EST`: the first packet arrived while the QP was in RTR.
    CommEst {
        /// The QP number.
        qpn: u32,
    },
    /// `IBV_EVENT_SQ_DRAINED`: in SQD, every started send work request has completed.
    SqDrained {
        /// The QP number.
        qpn: u32,
    },
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: an SRQ-attached QP entered the error state and
    /// will consume no more SRQ entries.
    QpLastWqeReached {
        /// The QP number.
        qpn: u32,
    },
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: the SRQ fell below its armed limit (now disarmed).
    SrqLimitReached {
        /// The SRQ handle (its [`SrqId`](crate::SrqId)'s number).
        srq: u32,
    },
    /// `IBV_EVENT_PORT_ACTIVE`: the port became active.
    PortActive {
        /// The port number.
        port: u8,
    },
    /// `IBV_EVENT_DEVICE_FATAL`: the device failed (its transport died).
    DeviceFatal,
}

impl AsyncEvent {
    /// The `enum ibv_event_type` value.
    pub const fn raw_type(&self) -> u32 {
        match self {
            AsyncEvent::CqError { .. } => 0,
            AsyncEvent::QpFatal { .. } => 1,
            AsyncEvent::QpRequestError { .. } => 2,
            AsyncEvent::QpAccessError { .. } => 3,
            AsyncEvent::CommEst { .. } => 4,
            AsyncEvent::SqDrained { .. } => 5,
            AsyncEvent::PortActive { .. } => 9,
            AsyncEvent::SrqLimitReached { .. } => 15,
            AsyncEvent::QpLastWqeReached { .. } => 16,
            AsyncEvent::DeviceFatal => 8,
        }
    }

    /// The object the event is affiliated with (`ibv_get_async_event(3)`: the CQ, QP or
    /// SRQ its `element` names) and its number: a CQ's id, a QP number, an SRQ number.
    /// `None` for port and device events.
    pub const fn affiliated(&self) -> Option<(Object, u64)> {
        match *self {
            AsyncEvent::CqError { cq_id, .. } => Some((Object::Cq, cq_id)),
            AsyncEvent::QpFatal { qpn }
            | AsyncEvent::QpRequestError { qpn }
            | AsyncEvent::QpAccessError { qpn }
            | AsyncEvent::CommEst { qpn }
            | AsyncEvent::SqDrained { qpn }
            | AsyncEvent::QpLastWqeReached { qpn } => Some((Object::Qp, qpn as u64)),
            AsyncEvent::SrqLimitReached { srq } => Some((Object::Srq, srq as u64)),
            AsyncEvent::PortActive { .. } | AsyncEvent::DeviceFatal => None,
        }
    }
}

/// A CQ's overrun notice is `IBV_EVENT_CQ_ERR` for that CQ.
impl From<CqOverrun> for AsyncEvent {
    fn from(overrun: CqOverrun) -> Self {
        let CqOverrun {
            cq_id,
            user_context,
        } = overrun;
        AsyncEvent::CqError {
            cq_id,
            user_context,
        }
    }
}

/// One packet written by [`Engine::poll_transmit`](crate::Engine::poll_transmit):
/// `len` bytes of BTH, extension headers, payload, pad and a zero ICRC placeholder, to be
/// sent to `av`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Bytes written at the start of the caller's buffer.
    pub len: usize,
    /// The local QP that sent it.
    pub src_qpn: u32,
    /// BTH DestQP.
    pub dest_qpn: u32,
    /// Where to send it (the QP's path for RC / UC, the work request's AH for UD).
    pub av: AddressVector,
}

/// Why an incoming packet was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Too short, bad header version, bad pad, or headers that do not match the opcode.
    Malformed,
    /// Opcode this engine does not implement (CNP, RD, XRC, FLUSH, ...).
    UnknownOpcode,
    /// P_Key outside the default partition.
    BadPkey,
    /// No QP with this number.
    UnknownQp,
    /// The QP's state does not accept this packet.
    WrongState,
    /// Opcode transport does not match the QP type.
    WrongTransport,
    /// RC request after a gap (one NAK is sent per gap).
    OutOfSequence,
    /// Response for a PSN already acknowledged.
    StaleResponse,
    /// Response for a PSN never sent.
    GhostResponse,
    /// Read or atomic response ahead of the one expected.
    OutOfOrderResponse,
    /// Response while nothing is waiting for one.
    UnexpectedResponse,
    /// UD Q_Key differs from the QP's.
    QkeyMismatch,
    /// UC / UD message with no receive WQE posted.
    NoReceive,
    /// UC message broken by loss, bad sequence or a failed check.
    UcMessageDropped,
    /// UD payload larger than the port MTU.
    UdTooLong,
    /// Duplicate read or atomic whose responder resource was recycled.
    DuplicateNotFound,
    /// Reserved AETH syndrome.
    BadSyndrome,
    /// A packet for an RC or UC QP whose source address is not the QP's path (its
    /// destination GID): only the connected peer may talk to a connected QP (IBTA 9.6.1.5
    /// header validation; rxe's `check_addr`).
    OffPath,
    /// A management datagram for QP1 while the GSI inbox already holds
    /// [`GSI_INBOX_LEN`](crate::GSI_INBOX_LEN) MADs nobody has taken.
    GsiInboxFull,
    /// A multicast packet (destination QPN 0xFFFFFF) for a group no QP of this device is
    /// attached to (`ibv_attach_mcast(3)`), or without a GRH naming a group.
    UnknownGroup,
}

impl DropReason {
    /// Every reason, in counter order.
    pub const ALL: [DropReason; 20] = [
        DropReason::Malformed,
        DropReason::UnknownOpcode,
        DropReason::BadPkey,
        DropReason::UnknownQp,
        DropReason::WrongState,
        DropReason::WrongTransport,
        DropReason::OutOfSequence,
        DropReason::StaleResponse,
        DropReason::GhostResponse,
        DropReason::OutOfOrderResponse,
        DropReason::UnexpectedResponse,
        DropReason::QkeyMismatch,
        DropReason::NoReceive,
        DropReason::UcMessageDropped,
        DropReason::UdTooLong,
        DropReason::DuplicateNotFound,
        DropReason::BadSyndrome,
        DropReason::OffPath,
        DropReason::GsiInboxFull,
        DropReason::UnknownGroup,
    ];

    fn index(self) -> usize {
        self as usize
    }

    /// The reason's name in snake case (`out_of_sequence`).
    pub fn snake_name(self) -> String {
        let mut name = String::new();
        for (i, c) in format!("{self:?}").chars().enumerate() {
            if c.is_ascii_uppercase() && i > 0 {
                name.push('_');
            }
            name.push(c.to_ascii_lowercase());
        }
        name
    }
}

/// One line of `name=value` pairs; drop reasons that never happened are left out.
impl std::fmt::Display for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut first = true;
        for (name, value) in self.fields() {
            if value == 0 && name.starts_with("dropped_") {
                continue;
            }
            if !first {
                f.write_str(" ")?;
            }
            first = false;
            write!(f, "{name}={value}")?;
        }
        Ok(())
    }
}

/// Counters kept by the engine, over all its QPs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Packets written by `poll_transmit`.
    pub packets_sent: u64,
    /// Payload bytes sent.
    pub bytes_sent: u64,
    /// Packets given to `handle_packet`.
    pub packets_received: u64,
    /// Request packets sent again after go-back-N.
    pub retransmitted_packets: u64,
    /// Go-back-N restarts (timeout, NAK sequence error, implied NAK).
    pub retries: u64,
    /// Local ACK timeouts that fired with work outstanding.
    pub timeouts: u64,
    /// ACKs (and atomic ACKs) sent.
    pub acks_sent: u64,
    /// NAKs sent (sequence, invalid request, access, operational).
    pub naks_sent: u64,
    /// RNR NAKs sent.
    pub rnr_naks_sent: u64,
    /// NAKs received.
    pub naks_received: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// Duplicate requests received (re-ACKed or replayed).
    pub duplicates_received: u64,
    /// Replies the responder's limiter held back: ACKs and NAKs to duplicate or
    /// out-of-sequence requests, read-data and AtomicAck replays to duplicate reads and
    /// atomics, already answered within the window
    /// ([`EngineConfig::duplicate_reply_window_ns`](crate::EngineConfig)) or already
    /// queued.
    pub duplicate_replies_suppressed: u64,
    /// Management datagrams QP1 received and queued for the GSI user (IBTA 13.5).
    pub gsi_received: u64,
    /// Management datagrams QP1 sent (part of `packets_sent`).
    pub gsi_sent: u64,
    /// Times a peer's congestion window was halved on a loss signal (at most once per
    /// recovery episode; the `window` module of this crate).
    pub cwnd_reductions: u64,
    /// Times an RC QP had a request ready but its peer's congestion window was full (counted
    /// once per stall: again only after the QP has sent).
    pub window_limited: u64,
    /// QPs the engine's outputs visited: one per QP that
    /// [`Engine::poll_transmit`](crate::Engine::poll_transmit),
    /// [`Engine::execute_local_operations`](crate::Engine::execute_local_operations) or
    /// [`Engine::handle_timeout`](crate::Engine::handle_timeout) looked at. The cost of
    /// scheduling in a count, not a time: what a test pins to prove the outputs visit the
    /// QPs that have work, not every QP.
    pub qps_visited: u64,
    drops: [u64; DropReason::ALL.len()],
}

impl Counters {
    /// Packets dropped for `reason`.
    pub fn drops(&self, reason: DropReason) -> u64 {
        self.drops[reason.index()]
    }

    /// All dropped packets.
    pub fn total_drops(&self) -> u64 {
        self.drops.iter().sum()
    }

    /// `(name, value)` of every counter, drops by reason last (names in snake case, as
    /// [`Counters`]' `Display` prints them).
    pub fn fields(&self) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = [
            ("packets_sent", self.packets_sent),
            ("bytes_sent", self.bytes_sent),
            ("packets_received", self.packets_received),
            ("retransmitted_packets", self.retransmitted_packets),
            ("retries", self.retries),
            ("timeouts", self.timeouts),
            ("acks_sent", self.acks_sent),
            ("naks_sent", self.naks_sent),
            ("rnr_naks_sent", self.rnr_naks_sent),
            ("naks_received", self.naks_received),
            ("rnr_naks_received", self.rnr_naks_received),
            ("duplicates_received", self.duplicates_received),
            (
                "duplicate_replies_suppressed",
                self.duplicate_replies_suppressed,
            ),
            ("gsi_received", self.gsi_received),
            ("gsi_sent", self.gsi_sent),
            ("cwnd_reductions", self.cwnd_reductions),
            ("window_limited", self.window_limited),
            ("qps_visited", self.qps_visited),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_string(), value))
        .collect();
        for reason in DropReason::ALL {
            out.push((
                format!("dropped_{}", reason.snake_name()),
                self.drops(reason),
            ));
        }
        out
    }

    /// Counts a packet for QP `qpn` (its BTH DestQP) with PSN `psn` dropped for `reason`.
    /// Traced per packet (level TRACE), named as the counter is (`out_of_sequence`).
    pub(crate) fn drop_packet(&mut self, reason: DropReason, qpn: u32, psn: u32) {
        tracing::trace!(qpn, psn, reason = %reason.snake_name(), "packet dropped");
        self.drops[reason.index()] += 1;
    }

    /// Counts a packet dropped before its headers could be read (malformed, unknown
    /// opcode).
    pub(crate) fn drop_unparsed(&mut self, reason: DropReason) {
        tracing::trace!(reason = %reason.snake_name(), "packet dropped");
        self.drops[reason.index()] += 1;
    }
}
