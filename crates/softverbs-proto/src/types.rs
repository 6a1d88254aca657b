//! Queue-pair vocabulary: types, states, MTUs, access flags, the `ibv_qp_attr` mirror and
//! its attribute mask, capabilities, address vectors and the error type of every verb.
//!
//! Numeric values follow `verbs.h` (reference §3.8) so the C boundary converts by value.

use bitflags::bitflags;

/// Queue-pair transport service type (`enum ibv_qp_type`, the types this engine runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected (`IBV_QPT_RC`).
    Rc,
    /// Unreliable connected (`IBV_QPT_UC`).
    Uc,
    /// Unreliable datagram (`IBV_QPT_UD`).
    Ud,
}

/// Queue-pair state (`enum ibv_qp_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum QpState {
    /// `IBV_QPS_RESET`.
    #[default]
    Reset,
    /// `IBV_QPS_INIT`.
    Init,
    /// `IBV_QPS_RTR`: ready to receive.
    Rtr,
    /// `IBV_QPS_RTS`: ready to send.
    Rts,
    /// `IBV_QPS_SQD`: send queue drained.
    Sqd,
    /// `IBV_QPS_SQE`: send queue error (UC / UD only).
    Sqe,
    /// `IBV_QPS_ERR`.
    Err,
}

impl QpState {
    /// The `verbs.h` value.
    pub const fn to_raw(self) -> u32 {
        match self {
            QpState::Reset => 0,
            QpState::Init => 1,
            QpState::Rtr => 2,
            QpState::Rts => 3,
            QpState::Sqd => 4,
            QpState::Sqe => 5,
            QpState::Err => 6,
        }
    }

    /// From the `verbs.h` value; `None` for values `verbs.h` does not define.
    pub const fn from_raw(raw: u32) -> Option<Self> {
        Some(match raw {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            5 => QpState::Sqe,
            6 => QpState::Err,
            _ => return None,
        })
    }
}

/// IB path MTU (`enum ibv_mtu`): bytes of payload per packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Mtu {
    /// 256 bytes (`IBV_MTU_256` = 1).
    Mtu256,
    /// 512 bytes.
    Mtu512,
    /// 1024 bytes (the `ibv_rc_pingpong` default).
    #[default]
    Mtu1024,
    /// 2048 bytes.
    Mtu2048,
    /// 4096 bytes (`IBV_MTU_4096` = 5).
    Mtu4096,
}

impl Mtu {
    /// Payload bytes per packet.
    pub const fn bytes(self) -> u32 {
        match self {
            Mtu::Mtu256 => 256,
            Mtu::Mtu512 => 512,
            Mtu::Mtu1024 => 1024,
            Mtu::Mtu2048 => 2048,
            Mtu::Mtu4096 => 4096,
        }
    }

    /// The `verbs.h` enum value (1..=5).
    pub const fn to_raw(self) -> u32 {
        match self {
            Mtu::Mtu256 => 1,
            Mtu::Mtu512 => 2,
            Mtu::Mtu1024 => 3,
            Mtu::Mtu2048 => 4,
            Mtu::Mtu4096 => 5,
        }
    }

    /// From the `verbs.h` enum value.
    pub const fn from_raw(raw: u32) -> Option<Self> {
        Some(match raw {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }
}

bitflags! {
    /// Memory and QP access rights (`enum ibv_access_flags`). On a QP
    /// (`qp_access_flags`) only the three `REMOTE_*` bits and the two `FLUSH_*` bits matter; on a memory region all
    /// of them do. The empty set means "local read", which every region allows.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        /// `IBV_ACCESS_LOCAL_WRITE`.
        const LOCAL_WRITE = 1 << 0;
        /// `IBV_ACCESS_REMOTE_WRITE`.
        const REMOTE_WRITE = 1 << 1;
        /// `IBV_ACCESS_REMOTE_READ`.
        const REMOTE_READ = 1 << 2;
        /// `IBV_ACCESS_REMOTE_ATOMIC`.
        const REMOTE_ATOMIC = 1 << 3;
        /// `IBV_ACCESS_MW_BIND`.
        const MW_BIND = 1 << 4;
        /// `IBV_ACCESS_ON_DEMAND` (`ibv_reg_mr(3)`): an on-demand paging region, whose
        /// pages are neither pinned nor required to be mapped at registration; an access
        /// finds whatever is mapped at the time. Meaningless on a QP.
        const ON_DEMAND = 1 << 6;
        /// `IBV_ACCESS_FLUSH_GLOBAL` (rdma-core ≥ 45): a FLUSH with the global placement
        /// type may target the region (or, in `qp_access_flags`, the QP).
        const FLUSH_GLOBAL = 1 << 8;
        /// `IBV_ACCESS_FLUSH_PERSISTENT` (rdma-core ≥ 45): a FLUSH with the persistent
        /// placement type may target the region (or the QP).
        const FLUSH_PERSISTENT = 1 << 9;
    }
}

bitflags! {
    /// Which attributes a modify names (`enum ibv_qp_attr_mask`, same bit values).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct AttrMask: u32 {
        /// `IBV_QP_STATE`.
        const STATE = 1 << 0;
        /// `IBV_QP_CUR_STATE`.
        const CUR_STATE = 1 << 1;
        /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`.
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `IBV_QP_ACCESS_FLAGS`.
        const ACCESS_FLAGS = 1 << 3;
        /// `IBV_QP_PKEY_INDEX`.
        const PKEY_INDEX = 1 << 4;
        /// `IBV_QP_PORT`.
        const PORT = 1 << 5;
        /// `IBV_QP_QKEY`.
        const QKEY = 1 << 6;
        /// `IBV_QP_AV`.
        const AV = 1 << 7;
        /// `IBV_QP_PATH_MTU`.
        const PATH_MTU = 1 << 8;
        /// `IBV_QP_TIMEOUT`.
        const TIMEOUT = 1 << 9;
        /// `IBV_QP_RETRY_CNT`.
        const RETRY_CNT = 1 << 10;
        /// `IBV_QP_RNR_RETRY`.
        const RNR_RETRY = 1 << 11;
        /// `IBV_QP_RQ_PSN`.
        const RQ_PSN = 1 << 12;
        /// `IBV_QP_MAX_QP_RD_ATOMIC`.
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `IBV_QP_ALT_PATH` (accepted where the table allows it, then ignored: no APM).
        const ALT_PATH = 1 << 14;
        /// `IBV_QP_MIN_RNR_TIMER`.
        const MIN_RNR_TIMER = 1 << 15;
        /// `IBV_QP_SQ_PSN`.
        const SQ_PSN = 1 << 16;
        /// `IBV_QP_MAX_DEST_RD_ATOMIC`.
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `IBV_QP_PATH_MIG_STATE` (accepted where allowed, ignored: no APM).
        const PATH_MIG_STATE = 1 << 18;
        /// `IBV_QP_CAP` (QP resizing is not supported: always rejected).
        const CAP = 1 << 19;
        /// `IBV_QP_DEST_QPN`.
        const DEST_QPN = 1 << 20;
        /// `IBV_QP_RATE_LIMIT` (not supported: always rejected).
        const RATE_LIMIT = 1 << 25;
    }
}

/// Address vector (`struct ibv_ah_attr` with its GRH). On RoCEv2 the destination GID is an
/// IP address; the engine treats it as opaque bytes and hands it back with every
/// [`Transmit`](crate::Transmit) so the device can resolve it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AddressVector {
    /// Destination GID (IPv6, or IPv4-mapped `::ffff:a.b.c.d`).
    pub dgid: [u8; 16],
    /// Index of the local GID to send from.
    pub sgid_index: u8,
    /// IP TTL / hop limit.
    pub hop_limit: u8,
    /// IP traffic class (TOS).
    pub traffic_class: u8,
    /// IPv6 flow label (20 bits).
    pub flow_label: u32,
    /// Service level.
    pub sl: u8,
    /// Local port number.
    pub port_num: u8,
    /// `is_global`: a GRH is present (required on RoCE).
    pub is_global: bool,
}

/// The attributes of a QP (`struct ibv_qp_attr`, the fields this engine uses). Which of
/// them a [`modify`](crate::Engine::modify_qp) applies is said by an [`AttrMask`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct QpAttr {
    /// Next state (`IBV_QP_STATE`).
    pub qp_state: QpState,
    /// Assumed current state (`IBV_QP_CUR_STATE`); must equal the real one.
    pub cur_qp_state: QpState,
    /// Path MTU (RC / UC).
    pub path_mtu: Mtu,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Initial expected receive PSN (RC / UC).
    pub rq_psn: u32,
    /// Initial send PSN.
    pub sq_psn: u32,
    /// Remote QP number (RC / UC).
    pub dest_qp_num: u32,
    /// Remote operations this QP's responder allows (RC / UC).
    pub qp_access_flags: AccessFlags,
    /// Primary path address vector (RC / UC).
    pub ah_attr: AddressVector,
    /// P_Key index (only index 0, the default partition, exists).
    pub pkey_index: u16,
    /// Raise [`AsyncEvent::SqDrained`](crate::AsyncEvent::SqDrained) when entering SQD drains.
    pub en_sqd_async_notify: bool,
    /// Outstanding RDMA reads and atomics this requester may have (RC).
    pub max_rd_atomic: u8,
    /// Responder resources for incoming reads and atomics (RC).
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code this responder sends (RC, 0..=31, reference §1.4).
    pub min_rnr_timer: u8,
    /// Port number (only port 1 exists).
    pub port_num: u8,
    /// Local ACK timeout code: 4.096 µs · 2^timeout, 0 = infinite (RC, 0..=31).
    pub timeout: u8,
    /// Transport retries before `RETRY_EXC_ERR` (RC, 0..=7; 7 means seven, not infinite).
    pub retry_cnt: u8,
    /// RNR retries before `RNR_RETRY_EXC_ERR` (RC, 0..=7; 7 means infinite).
    pub rnr_retry: u8,
}

/// Queue sizes and limits of a QP (`struct ibv_qp_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth (ignored with an SRQ).
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send WR.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive WR.
    pub max_recv_sge: u32,
    /// Largest inline payload.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 256,
        }
    }
}

/// What a new QP is created with (`struct ibv_qp_init_attr`, minus the CQs, which the
/// device owns: the engine only says whether a completion belongs to the send or the
/// receive CQ), plus the protection domain `ibv_create_qp(3)` takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpInit {
    /// Transport service type.
    pub qp_type: QpType,
    /// Queue sizes.
    pub caps: QpCaps,
    /// `sq_sig_all`: every send WR produces a completion.
    pub sq_sig_all: bool,
    /// Shared receive queue to consume from instead of an own receive queue.
    pub srq: Option<SrqId>,
    /// The protection domain the QP belongs to (the device's PD number). Every L_Key and
    /// R_Key the QP uses is checked against it through [`Memory`](crate::Memory): a
    /// region of another PD is refused like an invalid key. Receive WQEs taken from an
    /// SRQ are checked against this PD too (rxe's behaviour).
    pub pd: u32,
}

impl QpInit {
    /// A QP of `qp_type` with default caps, no `sq_sig_all`, no SRQ, in protection
    /// domain 0.
    pub fn new(qp_type: QpType) -> Self {
        QpInit {
            qp_type,
            caps: QpCaps::default(),
            sq_sig_all: false,
            srq: None,
            pd: 0,
        }
    }

    /// The same, in protection domain `pd`.
    pub fn with_pd(mut self, pd: u32) -> Self {
        self.pd = pd;
        self
    }
}

/// A shared receive queue's handle inside one [`Engine`](crate::Engine).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SrqId(pub u32);

/// A range of QP numbers, `start..end` (a `Copy` [`std::ops::Range`], so that
/// [`EngineConfig`] stays `Copy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpnRange {
    /// The first number of the range.
    pub start: u32,
    /// The first number after it.
    pub end: u32,
}

impl QpnRange {
    /// The whole 24-bit QPN space.
    pub const ALL: QpnRange = QpnRange {
        start: 0,
        end: 1 << 24,
    };

    /// The numbers of the range an engine may hand out: without 0, 1 (the management QPs,
    /// IBTA 13.5) and 0xFFFFFF (the multicast QPN, IBTA 9.2). May be empty.
    pub fn usable(self) -> std::ops::Range<u32> {
        self.start.max(2)..self.end.min(0xFF_FFFF)
    }
}

impl From<std::ops::Range<u32>> for QpnRange {
    fn from(range: std::ops::Range<u32>) -> QpnRange {
        QpnRange {
            start: range.start,
            end: range.end,
        }
    }
}

/// Device-wide limits the engine enforces (the parts of `ibv_device_attr` /
/// `ibv_port_attr` that the protocol needs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Active MTU of the port: largest `path_mtu` accepted, and the UD message limit.
    pub port_mtu: Mtu,
    /// `max_qp_rd_atom` (bound for `max_dest_rd_atomic`).
    pub max_qp_rd_atom: u8,
    /// `max_qp_init_rd_atom` (bound for `max_rd_atomic`).
    pub max_qp_init_rd_atom: u8,
    /// `max_qp_wr`.
    pub max_qp_wr: u32,
    /// `max_sge`.
    pub max_sge: u32,
    /// Largest inline payload a QP may ask for.
    pub max_inline_data: u32,
    /// First QP number handed out (QPNs 0, 1 and 0xFFFFFF are never used); a number
    /// outside `qpn_range` starts at the range's start.
    pub first_qpn: u32,
    /// The QP numbers this engine may hand out (0, 1 and 0xFFFFFF never are). The whole
    /// 24-bit space by default; devices of several processes sharing one address each
    /// take a part of it, so that the destination QPN of a packet names the process it is
    /// for. `ibv_create_qp` fails with `ENOMEM` ([`VerbsError::TooManyObjects`]) once every
    /// number of the range is in use.
    ///
    /// [`VerbsError::TooManyObjects`]: crate::VerbsError::TooManyObjects
    pub qpn_range: QpnRange,
    /// Largest number of unacknowledged PSNs a requester keeps in flight (reference §2.2).
    pub max_unacked_psns: u32,
    /// Entries of the port's GID table (`ibv_port_attr.gid_tbl_len`): an address vector's
    /// `sgid_index` must be below it. The default, 2, is the table of a device on an IPv4
    /// or a global IPv6 address: its link-local GID, then its address
    /// ([`link_local_gid`](crate::link_local_gid)).
    pub gid_table_len: u32,
    /// Longest window, in nanoseconds, of the responder's reply limiter (RC): a duplicate
    /// or out-of-sequence request gets at most one ACK and at most one NAK per QP and
    /// expected PSN within a window; a duplicate READ replays its data, a duplicate atomic
    /// its AtomicAck, at most once per PSN within it. 0 turns the limiter off.
    ///
    /// A QP's window is half its own local ACK timeout (`QpAttr::timeout`, 4.096 µs ·
    /// 2^timeout; the peer's is not known, and connected programs set both alike), at most
    /// this value. An honest requester sends a PSN again no sooner than one local ACK
    /// timeout after it last sent it, so each of its retransmissions is answered; at the
    /// shortest timeout (1: 8.192 µs) the window is 4.096 µs. The first duplicate after a
    /// request is always answered (the ACK of a new request does not count), and a
    /// requester's re-reads after a lost read response ask each time for a PSN not asked
    /// for before. A flood of copies of one packet is answered once per window instead of
    /// once per copy.
    ///
    /// The default, 65 536 ns, is about a round trip of the UDP path between two processes
    /// of one host (20–60 µs measured): a flood reflects at most about 15,000 replies a
    /// second per QP, where it reflected one per packet.
    pub duplicate_reply_window_ns: u64,
    /// Congestion window, in request packets (PSNs), a peer starts with: the RC QPs whose
    /// path leads to one destination GID share one window, and the unacknowledged request
    /// PSNs of all of them together stay within it (a QP with nothing in flight may always
    /// send one request). The window grows on acknowledgments and halves on loss, as
    /// TCP's (RFC 5681: slow start below the threshold, about one packet per window of
    /// acknowledged packets above it); see the `window` module of this crate. The
    /// default, 64, is a quarter of a 1 MiB socket buffer of 4 KiB packets. Clamped into
    /// `min_cwnd_packets..=max_cwnd_packets`.
    pub initial_cwnd_packets: u32,
    /// The smallest window a loss may leave (at least 1). Default 8.
    pub min_cwnd_packets: u32,
    /// The largest window acknowledgments may grow to (at least `min_cwnd_packets`).
    /// Default 1024: 4 MiB of 4 KiB packets, half the 8 MiB UDP receive buffer a
    /// privileged softverbs device asks for.
    pub max_cwnd_packets: u32,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            port_mtu: Mtu::Mtu4096,
            // rxe's limits: perftest without `-o` asks for the peer's max_qp_rd_atom.
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            max_qp_wr: 16384,
            max_sge: 32,
            max_inline_data: 1024,
            first_qpn: 0x11,
            qpn_range: QpnRange::ALL,
            max_unacked_psns: 128,
            gid_table_len: 2,
            duplicate_reply_window_ns: 65_536,
            initial_cwnd_packets: 64,
            min_cwnd_packets: 8,
            max_cwnd_packets: 1024,
        }
    }
}
