//! The InfiniBand Communication Manager (IBTA Volume 1, chapter 12), sans I/O.
//!
//! softverbs-cm is what the kernel's `ib_cm` and the wire half of `rdma_cm` are to a
//! Linux host, for one softverbs port: it encodes and decodes CM management datagrams
//! (MADs, sent as RoCEv2 UD packets to QP 1), runs the connection state machines —
//! REQ / REP / RTU establishment, MRA, REJ, DREQ / DREP disconnection, timewait, SIDR — with
//! their retransmissions and timeouts, and knows how the RDMA CM maps IP addresses and
//! ports onto service IDs and the private data of a REQ. The drop-in `librdmacm.so.1`
//! (crate softverbs-rdmacm) feeds it the MADs its device receives on QP 1, sends what it
//! emits, and turns its events into `rdma_cm` events; QPs are not touched here.
//!
//! There is no clock, socket, thread, global RNG or `unsafe`: inputs are the consumer's
//! calls, [`Cm::handle_mad`] and [`Cm::handle_timeout`] with an explicit `now`
//! (nanoseconds); outputs are [`Cm::poll_transmit`], [`Cm::poll_event`] and
//! [`Cm::poll_timeout`]. The calling contract is on [`Cm`].
//!
//! | module | holds |
//! |---|---|
//! | [`mad`] | the common MAD header, the CM attribute IDs, every CM message as a struct with `parse` / `write` (IBTA 12.6, 12.11) |
//! | [`cma`] | RDMA CM addressing: port spaces, service IDs, the 36-byte CMA header of REQ / SIDR_REQ private data |
//! | `cm` | [`Cm`]: listeners, connections, timers, duplicate handling |
//! | `types` | the vocabulary: [`ConnectRequest`], [`Reply`], [`CmEvent`], [`ConnState`], [`CmError`], … |
//!
//! # Contract
//!
//! - **No panics on any input.** Every parser returns an error for bytes it cannot take;
//!   [`Cm::handle_mad`] drops what it cannot use and counts it ([`Cm::counters`]). A seeded
//!   random test feeds random, truncated and mutated MADs to a `Cm` in every state.
//! - Wire values follow what the kernel's `cm.c` / `cma.c` put on the wire over RoCE:
//!   permissive LIDs (0xFFFF) and SubnetLocal 0 for a routed (RoCEv2) path, REJ reason 8
//!   for a REQ nobody listens to, a DREP for a DREQ that matches nothing, REJ 4 (timeout)
//!   with the CA GUID in the ARI when an active connection gives up.
//!
//! # Decisions and deviations
//!
//! - A duplicate REQ is answered by resending the REP (or MRA) — the kernel relies on its
//!   MAD layer's REP retransmission instead; both converge.
//! - `Cm::release` of an established connection sends one DREQ and enters timewait
//!   without waiting for the DREP, as `ib_destroy_cm_id` does.
//! - Alternate paths (LAP / APR) are parsed as headers and ignored.
//! - Timewait lasts 2 × 4.096 µs × 2^(local ACK timeout), at least 1 ms, unless
//!   [`Cm::set_timewait`] says otherwise.

#![forbid(unsafe_code)]

mod cm;
pub mod cma;
pub mod mad;
mod types;

pub use cm::{cm_timeout_ns, Cm, MAX_CONNECTIONS, MAX_QUEUED_TRANSMITS};
pub use types::{
    CmConfig, CmCounters, CmError, CmEvent, ConnId, ConnState, ConnectRequest, MadSource,
    OutgoingMad, QpType, RepInfo, Reply, ReqInfo, SidrReply, SidrRequest,
};
