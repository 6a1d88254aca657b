//! softverbs-wire: RoCEv2 bytes on the wire, and nothing else.
//!
//! The InfiniBand transport headers a RoCEv2 UDP datagram carries (IBTA Vol. 1
//! ch. 9 and Annex A17), their opcode table, 24-bit PSN arithmetic and the ICRC, written in the
//! style of smoltcp: each header has a module with a private `field` map of byte ranges, a
//! checked zero-copy view `Header<T: AsRef<[u8]>>` (`new_unchecked`, `check_len`,
//! `new_checked`, getters, setters for `T: AsMut<[u8]>`), and a `*Repr` of the parsed fields
//! (`parse`, `emit`, `buffer_len`, `HEADER_LEN`) that prints like tcpdump.
//!
//! | module | holds |
//! |---|---|
//! | [`psn`] | [`Psn`] (wrap-aware 24-bit PSN), [`Qpn`] |
//! | [`opcode`] | [`Opcode`], the opcode table [`Opcode::info`] → [`OpcodeInfo`] |
//! | [`bth`] [`reth`] [`aeth`] [`deth`] [`immdt`] [`ieth`] [`atomic_eth`] [`atomic_ack_eth`] [`feth`] | one header each |
//! | [`packet`] | [`PacketRepr`]: a whole IB transport packet (BTH … pad, ICRC) |
//! | [`icrc`] | the ICRC, and the IP/UDP header information it covers |
//!
//! # Contract
//!
//! - No I/O, no clock, no global state, no `unsafe`.
//! - **No panics on any input.** Every `parse`, `new_checked` and `check_len` in this crate
//!   returns a [`WireError`] for bytes it cannot accept and never panics, whatever the
//!   bytes; [`PacketRepr::emit`] and everything in [`icrc`] report a short buffer as an
//!   error. The only panicking paths are accessors on views a caller built with
//!   `new_unchecked` over too few bytes, a caller bug that received data cannot trigger.
//!   A seeded random test (`packet` tests) feeds hundreds of thousands of random and
//!   mutated packets through every parser to hold this.
//! - Multi-byte fields are big-endian; the ICRC trailer is little-endian (§1.7).
//!
//! # Sending and receiving
//!
//! ```
//! use softverbs_wire::{icrc, BthRepr, Opcode, PacketRepr, Psn, Qpn};
//! use std::net::Ipv4Addr;
//!
//! let repr = PacketRepr {
//!     bth: BthRepr {
//!         opcode: Opcode::RC_SEND_ONLY,
//!         dest_qp: Qpn::new(0x11),
//!         psn: Psn::new(42),
//!         ack_req: true,
//!         ..BthRepr::default()
//!     },
//!     ..PacketRepr::default()
//! };
//! let payload = b"hello";
//! let mut buf = [0u8; 64];
//! let len = repr.emit(payload, &mut buf)?; // ICRC left as zero
//! let udp = icrc::UdpHeaderInfo::rocev2(0xC000, len)?;
//! let ip = icrc::IpHeaderInfo::linux_ipv4(
//!     Ipv4Addr::new(10, 0, 0, 1),
//!     Ipv4Addr::new(10, 0, 0, 2),
//!     0,
//!     64,
//!     udp.length,
//! )?;
//! icrc::fill(&ip, &udp, &mut buf[..len])?;
//!
//! icrc::verify(&ip, &udp, &buf[..len])?;
//! let (parsed, data) = PacketRepr::parse(&buf[..len])?;
//! assert_eq!(data, payload);
//! assert_eq!(parsed.bth.pad_count, 3);
//! assert_eq!(parsed.to_string(), "BTH opcode=RC SEND ONLY dqpn=0x000011 psn=42 ackreq pad=3");
//! # Ok::<(), softverbs_wire::WireError>(())
//! ```
//!
//! # Decisions and deviations from the original brief
//!
//! - Header views are named `Header<T>` in each header module (`bth::Header`,
//!   `reth::Header`, …), as smoltcp names extension-header views; [`packet::Packet`] is
//!   the view of a whole transport packet.
//! - [`PacketRepr::emit`] writes the pad count the payload needs and ignores
//!   `bth.pad_count` (it is a derived length, like an IP total length); [`BthRepr::emit`]
//!   alone writes it as given.
//! - [`PacketRepr::parse`] rejects a pad count that does not round payload + pad up to a
//!   multiple of 4 (`BadPadCount`); IB packet lengths are whole 4-byte words (§1.6), and
//!   this keeps `emit(parse(bytes))` equal to `bytes` up to reserved bits, pad bytes and
//!   ICRC. It does not require pad bytes to be zero (they are covered by the ICRC).
//! - [`AethSyndrome`] has a fourth variant, `Reserved(u8)`, for the reserved syndrome type
//!   (0x40–0x5F) and bytes with bit 7 set, so decoding is total and lossless (§1.4).
//! - [`WireError`] is `non_exhaustive` and has more variants than the brief listed
//!   (`HeaderMismatch`, `UnexpectedPayload`, `BufferTooSmall`, `BadIpHeader`,
//!   `LengthOverflow`).
//! - `immdt` / `ieth` in [`PacketRepr`] are plain `u32` values as briefed; [`immdt::ImmDtRepr`]
//!   and [`ieth::IethRepr`] exist for symmetry with the other headers.

#![forbid(unsafe_code)]

mod be;
mod error;
#[cfg(test)]
mod test_vectors;

pub mod aeth;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod deth;
pub mod feth;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod opcode;
pub mod packet;
pub mod psn;
pub mod reth;

pub use aeth::{AethRepr, AethSyndrome, NakCode};
pub use atomic_ack_eth::AtomicAckEthRepr;
pub use atomic_eth::AtomicEthRepr;
pub use bth::BthRepr;
pub use deth::DethRepr;
pub use error::WireError;
pub use feth::FethRepr;
pub use ieth::IethRepr;
pub use immdt::ImmDtRepr;
pub use opcode::{OpKind, Opcode, OpcodeInfo, Position, Transport};
pub use packet::PacketRepr;
pub use psn::{Psn, Qpn};
pub use reth::RethRepr;
