//! The vocabulary of [`Cm`](crate::Cm): its configuration, the requests a consumer makes,
//! the events it receives, connection states, counters and errors.

use std::fmt;

use crate::cma::{CMA_CM_RESPONSE_TIMEOUT, CMA_MAX_CM_RETRIES};
use crate::mad::{
    DREP_PRIVATE_DATA_LEN, DREQ_PRIVATE_DATA_LEN, MAD_LEN, MRA_PRIVATE_DATA_LEN,
    REJ_PRIVATE_DATA_LEN, REP_PRIVATE_DATA_LEN, REQ_PRIVATE_DATA_LEN, RTU_PRIVATE_DATA_LEN,
    SIDR_REP_PRIVATE_DATA_LEN, SIDR_REQ_PRIVATE_DATA_LEN,
};

/// Configuration of one [`Cm`](crate::Cm).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmConfig {
    /// The CA GUID written in REQ / REP (`LocalCAGUID`) and in a timeout REJ's ARI (the
    /// device's node GUID).
    pub local_ca_guid: u64,
    /// Seed of the communication IDs and transaction IDs (no global RNG in this crate).
    pub seed: u64,
    /// The high byte of every local communication ID (and SIDR request ID) this `Cm` hands
    /// out: the share of its port's address that its device holds when devices of several
    /// processes share one address and one QP1. A MAD answering one of this `Cm`'s
    /// messages names it in a field the receiving host reads to find the `Cm` it is for
    /// ([`mad::addressee`](crate::mad::addressee), [`mad::comm_id_share`](crate::mad::comm_id_share)).
    /// 0 for a port of its own.
    pub share: u8,
}

/// A connection (or SIDR request) of a [`Cm`](crate::Cm): its local communication ID
/// (IBTA 12.6.2), unique among the live connections of the `Cm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub(crate) u32);

impl ConnId {
    /// The local communication ID (SIDR: the request ID) carried in this connection's MADs.
    pub fn local_comm_id(self) -> u32 {
        self.0
    }
}

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cm#{:08x}", self.0)
    }
}

/// Where a received MAD came from: the source GID (the GRH / IP header) and the source QP
/// (the DETH; 1 for CM MADs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MadSource {
    /// Source GID.
    pub sgid: [u8; 16],
    /// Source QP number.
    pub src_qpn: u32,
}

/// A MAD to send: a UD SEND to `dest_qpn` (always 1, the GSI) of the port with `dgid`.
#[derive(Clone, PartialEq, Eq)]
pub struct OutgoingMad {
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Destination QP (1).
    pub dest_qpn: u32,
    /// The whole MAD.
    pub bytes: [u8; MAD_LEN],
}

impl fmt::Debug for OutgoingMad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = crate::mad::CmMessage::parse(&self.bytes)
            .map(|m| m.to_string())
            .unwrap_or_else(|e| e.to_string());
        f.debug_struct("OutgoingMad")
            .field("dgid", &self.dgid)
            .field("dest_qpn", &self.dest_qpn)
            .field("mad", &what)
            .finish()
    }
}

/// Transport service of a connection (REQ `TransportServiceType`, IBTA 12.6.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QpType {
    /// Reliable connection (0).
    #[default]
    Rc,
    /// Unreliable connection (1).
    Uc,
}

impl QpType {
    /// The 2-bit wire value.
    pub fn value(self) -> u8 {
        match self {
            Self::Rc => 0,
            Self::Uc => 1,
        }
    }
}

/// What the active side asks for in its REQ ([`Cm::connect`](crate::Cm::connect)).
///
/// Timeouts are IBTA exponents: 4.096 µs × 2^t. MTU is the IBTA / `ibv_mtu` encoding
/// (1 = 256 … 5 = 4096).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    /// Service ID (an rdma_cm id: [`cma::service_id`](crate::cma::service_id)).
    pub service_id: u64,
    /// This port's GID (the path's source).
    pub local_gid: [u8; 16],
    /// The passive side's GID; the REQ is sent there.
    pub remote_gid: [u8; 16],
    /// The local QP number (24 bits).
    pub local_qpn: u32,
    /// The local QP's starting send PSN (24 bits).
    pub starting_psn: u32,
    /// RC or UC.
    pub qp_type: QpType,
    /// RDMA reads / atomics the local QP accepts at once.
    pub responder_resources: u8,
    /// RDMA reads / atomics the local QP issues at once.
    pub initiator_depth: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// RNR retry count (3 bits; 7 = infinite).
    pub rnr_retry_count: u8,
    /// Path MTU (1..=5).
    pub path_mtu: u8,
    /// How long this CM may take to answer the passive side (exponent, 5 bits).
    pub local_cm_response_timeout: u8,
    /// How long the passive CM may take to answer: the REQ's retransmission interval.
    pub remote_cm_response_timeout: u8,
    /// REQ retransmissions before giving up (4 bits).
    pub max_cm_retries: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// The local QP uses an SRQ.
    pub srq: bool,
    /// Partition key (0xFFFF on RoCE).
    pub pkey: u16,
    /// Path flow label (20 bits).
    pub flow_label: u32,
    /// Path traffic class.
    pub traffic_class: u8,
    /// Path hop limit; > 1 means routed: LIDs are written "permissive" and SubnetLocal 0,
    /// as the kernel does for RoCEv2.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Packet rate (6 bits, IBTA encoding).
    pub packet_rate: u8,
    /// Local ACK timeout (5 bits); also sets the timewait after a disconnect.
    pub local_ack_timeout: u8,
    /// Private data (≤ 92 bytes; an rdma_cm id puts the CMA header first).
    pub private_data: Vec<u8>,
}

impl ConnectRequest {
    /// A REQ with the values Linux's rdma_cm uses on RoCE for everything but the addresses
    /// and the QP: RC, 1 KiB MTU, CM timeouts 20 and 15 retries, P_Key 0xFFFF, hop limit 64,
    /// retry 7, RNR retry 7, local ACK timeout 18.
    pub fn new(
        service_id: u64,
        local_gid: [u8; 16],
        remote_gid: [u8; 16],
        local_qpn: u32,
        starting_psn: u32,
    ) -> Self {
        Self {
            service_id,
            local_gid,
            remote_gid,
            local_qpn,
            starting_psn,
            qp_type: QpType::Rc,
            responder_resources: 0,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
            path_mtu: 3,
            local_cm_response_timeout: CMA_CM_RESPONSE_TIMEOUT,
            remote_cm_response_timeout: CMA_CM_RESPONSE_TIMEOUT,
            max_cm_retries: CMA_MAX_CM_RETRIES,
            flow_control: true,
            srq: false,
            pkey: 0xFFFF,
            flow_label: 0,
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            packet_rate: 0,
            local_ack_timeout: 18,
            private_data: Vec::new(),
        }
    }
}

/// What the passive side answers in its REP ([`Cm::accept`](crate::Cm::accept)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The local QP number.
    pub local_qpn: u32,
    /// The local QP's starting send PSN.
    pub starting_psn: u32,
    /// RDMA reads / atomics the local QP accepts at once.
    pub responder_resources: u8,
    /// RDMA reads / atomics the local QP issues at once.
    pub initiator_depth: u8,
    /// RNR retry count the active side's QP should use (3 bits).
    pub rnr_retry_count: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits: 0 accepted, 1 not supported, 2 rejected).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// The local QP uses an SRQ.
    pub srq: bool,
    /// Private data (≤ 196 bytes).
    pub private_data: Vec<u8>,
}

impl Reply {
    /// A REP for this QP; failover "not supported" (1) as the kernel's rdma_cm sends,
    /// flow control on, RNR retry 7, nothing else.
    pub fn new(local_qpn: u32, starting_psn: u32) -> Self {
        Self {
            local_qpn,
            starting_psn,
            responder_resources: 0,
            initiator_depth: 0,
            rnr_retry_count: 7,
            target_ack_delay: 0,
            failover_accepted: 1,
            flow_control: true,
            srq: false,
            private_data: Vec::new(),
        }
    }
}

/// A SIDR request ([`Cm::sidr_request`](crate::Cm::sidr_request)): which UD QP serves
/// `service_id` at `remote_gid`?
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrRequest {
    /// Service ID.
    pub service_id: u64,
    /// The GID asked.
    pub remote_gid: [u8; 16],
    /// Partition key (0xFFFF on RoCE).
    pub pkey: u16,
    /// Retransmission interval exponent (4.096 µs × 2^t).
    pub cm_response_timeout: u8,
    /// Retransmissions before [`CmEvent::SidrTimeout`].
    pub max_cm_retries: u8,
    /// Private data (≤ 216; an rdma_cm id puts the CMA header first).
    pub private_data: Vec<u8>,
}

impl SidrRequest {
    /// A SIDR_REQ with rdma_cm's timeout (20) and retries (15), P_Key 0xFFFF.
    pub fn new(service_id: u64, remote_gid: [u8; 16]) -> Self {
        Self {
            service_id,
            remote_gid,
            pkey: 0xFFFF,
            cm_response_timeout: CMA_CM_RESPONSE_TIMEOUT,
            max_cm_retries: CMA_MAX_CM_RETRIES,
            private_data: Vec::new(),
        }
    }
}

/// The answer to a SIDR request ([`Cm::sidr_reply`](crate::Cm::sidr_reply)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrReply {
    /// [`sidr_status`](crate::mad::sidr_status).
    pub status: u8,
    /// The UD QP serving the service.
    pub qpn: u32,
    /// Its Q_Key.
    pub qkey: u32,
    /// Private data (≤ 136).
    pub private_data: Vec<u8>,
}

/// A REQ as the passive side sees it ([`CmEvent::ReqReceived`]); "remote" is the active
/// side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReqInfo {
    /// Where the MAD came from.
    pub source: MadSource,
    /// The active side's communication ID.
    pub remote_comm_id: u32,
    /// The active side's CA GUID.
    pub remote_ca_guid: u64,
    /// The active side's QP.
    pub remote_qpn: u32,
    /// The active side's starting PSN (the passive QP's `rq_psn`).
    pub starting_psn: u32,
    /// RC or UC.
    pub qp_type: QpType,
    /// Reads / atomics the active QP accepts (the passive QP's `max_rd_atomic` bound).
    pub responder_resources: u8,
    /// Reads / atomics the active QP issues (the passive QP's `max_dest_rd_atomic` bound).
    pub initiator_depth: u8,
    /// Transport retry count.
    pub retry_count: u8,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// Path MTU.
    pub path_mtu: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// The active QP uses an SRQ.
    pub srq: bool,
    /// Partition key.
    pub pkey: u16,
    /// The active side's GID (the REQ's primary local GID).
    pub remote_gid: [u8; 16],
    /// This side's GID as the active side addressed it (primary remote GID).
    pub local_gid: [u8; 16],
    /// Path flow label.
    pub flow_label: u32,
    /// Path traffic class.
    pub traffic_class: u8,
    /// Path hop limit.
    pub hop_limit: u8,
    /// Path service level.
    pub sl: u8,
    /// Path packet rate.
    pub packet_rate: u8,
    /// Path local ACK timeout.
    pub local_ack_timeout: u8,
    /// How long the active CM may take to answer.
    pub remote_cm_response_timeout: u8,
    /// How long this CM may take to answer.
    pub local_cm_response_timeout: u8,
    /// Max CM retries.
    pub max_cm_retries: u8,
    /// The whole private data area (92 bytes; an rdma_cm peer's starts with the CMA header).
    pub private_data: Vec<u8>,
}

/// A REP as the active side sees it ([`CmEvent::RepReceived`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepInfo {
    /// The passive side's communication ID.
    pub remote_comm_id: u32,
    /// The passive side's CA GUID.
    pub remote_ca_guid: u64,
    /// The passive side's QP.
    pub remote_qpn: u32,
    /// The passive side's starting PSN (the active QP's `rq_psn`).
    pub starting_psn: u32,
    /// Reads / atomics the passive QP accepts.
    pub responder_resources: u8,
    /// Reads / atomics the passive QP issues.
    pub initiator_depth: u8,
    /// Target ACK delay.
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// RNR retry count for the active QP.
    pub rnr_retry_count: u8,
    /// The passive QP uses an SRQ.
    pub srq: bool,
    /// The whole private data area (196 bytes).
    pub private_data: Vec<u8>,
}

/// What a [`Cm`](crate::Cm) tells its consumer ([`Cm::poll_event`](crate::Cm::poll_event)).
///
/// Private data areas are given whole (the IBTA size of the message, zero-padded), as the
/// kernel gives them to rdma_cm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// Passive: a REQ for a listened service ID. Answer with `accept`, `reject` or
    /// `send_mra`.
    ReqReceived {
        /// The new connection.
        conn: ConnId,
        /// The REQ's service ID.
        service_id: u64,
        /// The REQ.
        req: Box<ReqInfo>,
    },
    /// Active: the REP arrived. Bring the QP to RTR/RTS, then `ready_to_use` (or `reject`).
    RepReceived {
        /// The connection.
        conn: ConnId,
        /// The REP.
        rep: Box<RepInfo>,
    },
    /// Passive: the connection is established (an RTU arrived, or `notify_established`
    /// was called; then `private_data` is empty).
    RtuReceived {
        /// The connection.
        conn: ConnId,
        /// The RTU's private data (224 bytes).
        private_data: Vec<u8>,
    },
    /// The peer rejected the connection (a REJ arrived). Before a REP the connection is
    /// idle afterwards; after a REP (or once established, or disconnecting) it is in
    /// timewait, as the kernel's CM does.
    Rejected {
        /// The connection.
        conn: ConnId,
        /// REJ reason ([`reject_reason`](crate::mad::reject_reason)).
        reason: u16,
        /// The used part of the ARI.
        ari: Vec<u8>,
        /// The REJ's private data (148 bytes).
        private_data: Vec<u8>,
    },
    /// REQ (active) or REP (passive) retransmissions ran out: the peer is unreachable. A
    /// REJ with reason 4 (timeout) was sent; the connection is idle.
    Timeout {
        /// The connection.
        conn: ConnId,
    },
    /// The peer sent an MRA: it needs more time; the retransmission timer was extended.
    MraReceived {
        /// The connection.
        conn: ConnId,
        /// The MRA's service timeout exponent.
        service_timeout: u8,
    },
    /// The peer asks to disconnect. Move the QP to error, then `disconnect` (sends DREP).
    DreqReceived {
        /// The connection.
        conn: ConnId,
        /// The DREQ's private data (220 bytes).
        private_data: Vec<u8>,
    },
    /// The peer answered our DREQ; the connection is in timewait.
    DrepReceived {
        /// The connection.
        conn: ConnId,
        /// The DREP's private data (224 bytes).
        private_data: Vec<u8>,
    },
    /// DREQ retransmissions ran out without a DREP; the connection is in timewait.
    DreqTimeout {
        /// The connection.
        conn: ConnId,
    },
    /// Timewait is over: the connection is idle and its QP may be reused.
    TimewaitExit {
        /// The connection.
        conn: ConnId,
    },
    /// Passive SIDR: a SIDR_REQ for a listened service ID. Answer with `sidr_reply`.
    SidrReqReceived {
        /// The request.
        conn: ConnId,
        /// Its service ID.
        service_id: u64,
        /// Where it came from (reply address).
        source: MadSource,
        /// Its partition key.
        pkey: u16,
        /// Its private data (216 bytes).
        private_data: Vec<u8>,
    },
    /// Active SIDR: the answer arrived; the request is idle.
    SidrRepReceived {
        /// The request.
        conn: ConnId,
        /// [`sidr_status`](crate::mad::sidr_status).
        status: u8,
        /// The UD QP.
        qpn: u32,
        /// Its Q_Key.
        qkey: u32,
        /// The private data (136 bytes).
        private_data: Vec<u8>,
    },
    /// Active SIDR: retransmissions ran out; the request is idle.
    SidrTimeout {
        /// The request.
        conn: ConnId,
    },
}

/// Connection states (IBTA 12.9.6 figure 138, named as the kernel's `ib_cm_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    /// Nothing in progress (after a reject, a timeout, or timewait).
    Idle,
    /// Active: REQ sent, waiting for REP.
    ReqSent,
    /// Active: REQ sent, MRA received.
    MraReqReceived,
    /// Passive: REQ received, the consumer decides.
    ReqReceived,
    /// Passive: REQ received, MRA sent.
    MraReqSent,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Passive: REP sent, MRA received.
    MraRepReceived,
    /// Active: REP received, the consumer sends RTU.
    RepReceived,
    /// Active: REP received, MRA sent.
    MraRepSent,
    /// Connected.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// DREQ received, the consumer sends DREP.
    DreqReceived,
    /// Disconnected, waiting for stray packets to die.
    Timewait,
    /// Active SIDR: SIDR_REQ sent.
    SidrReqSent,
    /// Passive SIDR: SIDR_REQ received, the consumer replies.
    SidrReqReceived,
    /// Passive SIDR: SIDR_REP sent (resent on a duplicate SIDR_REQ).
    SidrReplied,
}

/// What a [`Cm`](crate::Cm) counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmCounters {
    /// MADs given to `handle_mad`.
    pub mads_received: u64,
    /// MADs queued for `poll_transmit` (retransmissions included).
    pub mads_sent: u64,
    /// MADs dropped as malformed (length, header, field values).
    pub malformed: u64,
    /// MADs of an attribute the CM ignores (ClassPortInfo, LAP, APR) or does not know.
    pub ignored_attribute: u64,
    /// Messages that matched no connection, or a connection in a state that does not take
    /// them (dropped, or answered as IBTA 12.9 says).
    pub unmatched: u64,
    /// Duplicate messages (answered by resending, or dropped).
    pub duplicates: u64,
    /// Retransmissions after a timeout.
    pub retransmissions: u64,
    /// REQs rejected because nobody listens on their service ID (REJ reason 8).
    pub no_listener: u64,
    /// MADs not queued because the transmit queue was full.
    pub transmit_queue_full: u64,
}

/// Why a [`Cm`](crate::Cm) call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    /// `listen` on a service ID that already has a listener.
    #[error("service ID {0:#018x} already has a listener")]
    AddressInUse(u64),
    /// The connection does not exist (never did, or was released).
    #[error("unknown connection {0}")]
    UnknownConnection(ConnId),
    /// The connection is not in a state that allows the call.
    #[error("connection {conn} is {state:?}; the call needs another state")]
    InvalidState {
        /// The connection.
        conn: ConnId,
        /// Its state.
        state: ConnState,
    },
    /// Private data longer than the message carries.
    #[error("private data of {len} bytes, the message carries at most {max}")]
    PrivateDataTooLong {
        /// Bytes given.
        len: usize,
        /// The message's private data size.
        max: usize,
    },
    /// A parameter out of its field's range.
    #[error("invalid parameter: {0}")]
    InvalidParameter(&'static str),
    /// Too many live connections.
    #[error("too many connections")]
    TooManyConnections,
}

impl CmError {
    /// The errno a C API reports for this error (Linux values): `EADDRINUSE`, `EINVAL` or
    /// `ENOMEM`.
    pub fn errno(&self) -> i32 {
        match self {
            Self::AddressInUse(_) => 98,
            Self::TooManyConnections => 12,
            _ => 22,
        }
    }
}

/// The private data sizes of the messages, by name, for error messages and checks.
pub(crate) mod max_private_data {
    use super::*;
    pub const REQ: usize = REQ_PRIVATE_DATA_LEN;
    pub const MRA: usize = MRA_PRIVATE_DATA_LEN;
    pub const REJ: usize = REJ_PRIVATE_DATA_LEN;
    pub const REP: usize = REP_PRIVATE_DATA_LEN;
    pub const RTU: usize = RTU_PRIVATE_DATA_LEN;
    pub const DREQ: usize = DREQ_PRIVATE_DATA_LEN;
    pub const DREP: usize = DREP_PRIVATE_DATA_LEN;
    pub const SIDR_REQ: usize = SIDR_REQ_PRIVATE_DATA_LEN;
    pub const SIDR_REP: usize = SIDR_REP_PRIVATE_DATA_LEN;
}
