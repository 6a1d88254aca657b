//! The softverbs queue-pair engine, sans I/O.
//!
//! [`Engine`] holds the RC, UC and UD queue pairs and shared receive queues of one device
//! port and runs the RoCEv2 transport for them (IBTA Vol. 1 ch. 9 and Annex A17): the
//! `ibv_modify_qp(3)` state machine, the requester (segmentation, PSNs, read/atomic budget,
//! fences), the responder (receive queues, RDMA write / read / atomics with key,
//! protection-domain and access checks, RNR NAK, duplicate replay, invalidate), the
//! completer (cumulative ACKs, go-back-N, `retry_cnt` / `rnr_retry`, error statuses) and
//! the error/flush path, QP1's management datagrams (IBTA 13.5), and it produces `ibv_wc`-layout completions
//! ([`softverbs_cq::WorkCompletion`]).
//!
//! There is no clock, socket, thread or global RNG: inputs are
//! [`Engine::handle_packet`] / [`Engine::handle_timeout`] with an explicit `now`, and
//! the verbs; outputs are [`Engine::poll_transmit`], [`Engine::poll_completion`],
//! [`Engine::poll_event`], [`Engine::poll_gsi`] and [`Engine::poll_timeout`]. Memory is reached only through
//! the [`Memory`] trait the device implements. The calling contract is on [`Engine`].
//!
//! | module | holds |
//! |---|---|
//! | `engine` | [`Engine`]: QP / SRQ tables, demultiplexing, the `poll_*` outputs |
//! | `qp` | the state machine (`ibv_modify_qp(3)` masks), posting, error and flush |
//! | `requester` | segmentation, PSNs, read/atomic budget, fences, AckReq; responder packets out |
//! | `completer` | ACK / NAK / response handling, go-back-N, timers, error statuses |
//! | `responder` | request checks and execution, duplicates, RNR, UC and UD receive |
//! | `codec` | the only user of `softverbs-wire`: packets to and from bytes |
//! | `gsi` | QP1, the General Services Interface: management datagrams in and out, bounded ([`GsiMad`]) |
//! | `window` | the per-peer congestion window over the RC requesters ([`PeerWindow`]) |
//! | `sched` | the schedule: which QPs the outputs visit (ready to send, local operations, timers) |
//! | `mcast` | UD multicast: the groups QPs are attached to, attach and detach rules |
//! | `gid` | GIDs as addresses: the address a GID names, the link-local GID of a port |
//! | `memory`, `wr`, `types`, `output`, `srq`, `psn` | the vocabulary |
//!
//! # Decisions and deviations
//!
//! - `poll_transmit` takes the [`Memory`] too (`poll_transmit(now, buf, mem)`): payload is
//!   gathered from registered memory straight into the packet when it is sent, as a NIC
//!   does, instead of being copied at post time. Inline sends carry their bytes in the WR
//!   ([`Gather::Inline`]).
//! - `retry_cnt` counts local ACK timeouts only; a retry triggered by a response (NAK
//!   sequence error, implied NAK, out-of-order read response) happens at most once per
//!   oldest unacknowledged PSN until the next timeout or progress, and does not use up
//!   the counter (the counter exists to detect a dead path; a NAK proves the peer alive).
//!   `retry_cnt = 7` means seven retries (IBTA), not infinite as in rxe; `rnr_retry = 7`
//!   is infinite.
//! - Out-of-order read responses trigger an immediate re-read from the first missing
//!   response (rxe waits for the timeout, reference §5.8 item 8).
//! - Retransmitted request packets carry AckReq, so recovery hears of progress per packet.
//! - The RC requesters towards one peer (destination GID) share a congestion window
//!   (`window.rs`, TCP's AIMD of RFC 5681 counted in packets): IBTA leaves the rate of
//!   requests to the requester, and without a bound over all QPs hundreds of QPs overflow
//!   the peer's socket buffer. A request sent beyond the window (one per QP with no
//!   answer coming) carries AckReq. The wire is unchanged otherwise: same packets, sent
//!   later.
//! - A UC responder drops packets whose PSN is before the expected one (duplicates and
//!   late reordered packets) instead of resynchronising on them, so UC never delivers
//!   twice or out of order.
//! - Requester completions of SEND/WRITE with immediate do not set `IBV_WC_WITH_IMM`
//!   (rxe does; the man page makes `imm_data` meaningful only on the receive side).
//!   `byte_len` on the requester is the WR's total length (8 for atomics), as rxe.
//! - Status choices where the reference offers two: a responder whose receive buffer is
//!   too small reports `LOC_LEN_ERR` (requester `REM_INV_REQ_ERR`); a bad receive SGE
//!   reports `LOC_PROT_ERR` (requester `REM_OP_ERR`); an RDMA WRITE WITH IMMEDIATE with a
//!   bad R_Key fails the consumed receive WQE with `LOC_ACCESS_ERR` (IBTA); a read or
//!   atomic WR on an RC QP with `max_rd_atomic = 0` fails with `LOC_QP_OP_ERR`; a UD send
//!   longer than the port MTU fails with `LOC_LEN_ERR` (rxe "succeeds" without sending);
//!   a UD receive too small for GRH + payload completes that WQE with `LOC_LEN_ERR` and
//!   the QP stays usable. Error completions carry the WR's opcode as a courtesy;
//!   `vendor_err` carries the NAK syndrome for remote errors.
//! - UC and UD send-side errors move the QP to SQE (RC: ERR).
//! - `ALT_PATH` / `PATH_MIG_STATE` are accepted where the table allows them and ignored
//!   (no APM); `CAP` and `RATE_LIMIT` are refused. Only P_Key index 0 and port 1 exist.
//! - Responder resources are a ring of `max_dest_rd_atomic` entries recycled oldest
//!   first, as rxe (without rounding up to a power of two).
//! - Every L_Key and R_Key is checked against the protection domain of the QP using it
//!   ([`QpInit::pd`]); a region of another PD is refused exactly as an invalid key (same NAK
//!   and statuses). Receive WQEs from an SRQ are checked against the QP's PD, as rxe does.
//!   A SEND WITH INVALIDATE naming a key of another PD is refused like an unknown key
//!   (rdmavt checks the PD there; rxe does not).
//! - Memory windows (`local.rs`, the rules in `memory.rs`): a bind or local invalidate
//!   runs once every earlier work request of the send queue completed (rxe fences only
//!   `LOCAL_INV` that way). A type 2 window answers only the QP that bound it, as rxe; a
//!   SEND WITH INVALIDATE or `LOCAL_INV` naming a window of another PD is refused (rxe
//!   does not check). Zero-based windows are not offered (rxe's provider refuses them).
#![forbid(unsafe_code)]

mod codec;
mod completer;
mod engine;
mod error;
mod gid;
mod gsi;
mod local;
mod mcast;
mod memory;
mod output;
mod psn;
mod qp;
mod requester;
mod responder;
mod sched;
mod srq;
mod types;
mod window;
mod wr;

pub use engine::Engine;
pub use error::{Capacity, Object, PostVerb, Queue, VerbsError};
pub use gid::{gid_address, link_local_gid};
pub use gsi::{GsiMad, GSI_INBOX_LEN, GSI_OUTBOX_LEN, GSI_QKEY, GSI_QPN, MAD_LEN};
pub use mcast::{
    is_multicast_gid, MAX_MCAST_GROUPS, MAX_MCAST_QP_ATTACH, MAX_TOTAL_MCAST_QP_ATTACH,
    MULTICAST_QPN,
};
pub use memory::{
    access_needed, atomic_result, check_access, check_bind, Accessor, AtomicOp, BindError,
    MemError, MemKey, Memory, RegionInfo, WindowBind, WindowBinding, WindowInfo, WindowType,
    WINDOW_ACCESS,
};
pub use output::{AsyncEvent, Completion, Counters, CqTarget, DropReason, Transmit};
pub use srq::SrqInit;
pub use types::{
    AccessFlags, AddressVector, AttrMask, EngineConfig, Mtu, QpAttr, QpCaps, QpInit, QpState,
    QpType, QpnRange, SrqId,
};
pub use window::PeerWindow;
pub use wr::{
    FlushPlacement, FlushSelectivity, Gather, InlineData, RecvWr, SendFlags, SendOp, SendWr, Sge,
    SgeList, UdDest,
};
