//! The engine's view of a RoCEv2 transport packet (BTH onward) and its conversion to and
//! from bytes.
//!
//! This is the only module that touches `softverbs-wire`. It gives the engine a flat
//! [`Packet`] (every extension header an `Option`, plain integers) and an [`OpInfo`] per
//! opcode (which headers, which position in a message, request or response). Parsing never
//! panics: any input either yields a packet whose headers match its opcode or an error the
//! caller counts as a drop (`PacketRepr::parse`'s contract). Emission writes BTH, extension
//! headers, payload, zero pad and a zero ICRC placeholder (the device fills the ICRC, which
//! needs the IP header), with the payload gathered in place.

use softverbs_wire::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, FethRepr, OpKind,
    Opcode, PacketRepr, Position, Psn, Qpn, RethRepr, WireError,
};

/// BTH length.
#[cfg(test)]
pub const BTH_LEN: usize = 12;
/// ICRC trailer length.
pub const ICRC_LEN: usize = softverbs_wire::packet::ICRC_LEN;

/// Transport of an opcode (BTH opcode bits 7..5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transport {
    Rc,
    Uc,
    Ud,
}

/// What an opcode does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Send,
    Write,
    ReadRequest,
    ReadResponse,
    Ack,
    AtomicAck,
    CompareSwap,
    FetchAdd,
    Flush,
    AtomicWrite,
}

/// Static facts about one opcode (reference §1.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OpInfo {
    pub transport: Transport,
    pub kind: Kind,
    pub first: bool,
    pub last: bool,
    pub reth: bool,
    pub aeth: bool,
    pub deth: bool,
    pub imm: bool,
    pub ieth: bool,
    pub atomic_eth: bool,
    pub atomic_ack: bool,
    pub feth: bool,
    pub payload: bool,
}

impl OpInfo {
    /// Facts for `opcode`, `None` for opcodes this engine does not implement (the wire
    /// crate's opcode table, reference §1.5).
    pub fn of(opcode: u8) -> Option<OpInfo> {
        OP_INFO[usize::from(opcode)]
    }

    /// [`OpInfo::of`], worked out from the wire crate's table (at compile time, into
    /// [`OP_INFO`]).
    const fn from_wire(opcode: u8) -> Option<OpInfo> {
        let Some(w) = Opcode(opcode).info() else {
            return None;
        };
        Some(OpInfo {
            transport: match w.transport {
                softverbs_wire::Transport::Rc => Transport::Rc,
                softverbs_wire::Transport::Uc => Transport::Uc,
                softverbs_wire::Transport::Ud => Transport::Ud,
            },
            kind: match w.kind {
                OpKind::Send => Kind::Send,
                OpKind::RdmaWrite => Kind::Write,
                OpKind::RdmaReadRequest => Kind::ReadRequest,
                OpKind::RdmaReadResponse => Kind::ReadResponse,
                OpKind::Acknowledge => Kind::Ack,
                OpKind::AtomicAcknowledge => Kind::AtomicAck,
                OpKind::CompareSwap => Kind::CompareSwap,
                OpKind::FetchAdd => Kind::FetchAdd,
                OpKind::Flush => Kind::Flush,
                OpKind::AtomicWrite => Kind::AtomicWrite,
            },
            first: matches!(w.position, Position::First | Position::Only),
            last: matches!(w.position, Position::Last | Position::Only),
            reth: w.has_reth,
            aeth: w.has_aeth,
            deth: w.has_deth,
            imm: w.has_immdt,
            ieth: w.has_ieth,
            atomic_eth: w.has_atomic_eth,
            atomic_ack: w.has_atomic_ack_eth,
            feth: w.has_feth,
            payload: w.has_payload,
        })
    }

    /// Responses go to the completer; everything else to the responder.
    pub fn is_response(&self) -> bool {
        matches!(self.kind, Kind::ReadResponse | Kind::Ack | Kind::AtomicAck)
    }

    /// Length of the extension headers.
    #[cfg(test)]
    pub fn ext_len(&self) -> usize {
        let mut n = 0;
        if self.deth {
            n += 8;
        }
        if self.feth {
            n += 4;
        }
        if self.reth {
            n += 16;
        }
        if self.atomic_eth {
            n += 28;
        }
        if self.aeth {
            n += 4;
        }
        if self.atomic_ack {
            n += 8;
        }
        if self.imm {
            n += 4;
        }
        if self.ieth {
            n += 4;
        }
        n
    }
}

/// [`OpInfo::of`] of every opcode byte: one load per packet parsed.
const OP_INFO: [Option<OpInfo>; 256] = {
    let mut table = [None; 256];
    let mut opcode = 0;
    while opcode < 256 {
        table[opcode] = OpInfo::from_wire(opcode as u8);
        opcode += 1;
    }
    table
};

/// Opcode values used by the engine (reference §1.5).
pub(crate) mod op {
    pub const SEND_FIRST: u8 = 0x00;
    pub const SEND_MIDDLE: u8 = 0x01;
    pub const SEND_LAST: u8 = 0x02;
    pub const SEND_LAST_IMM: u8 = 0x03;
    pub const SEND_ONLY: u8 = 0x04;
    pub const SEND_ONLY_IMM: u8 = 0x05;
    pub const WRITE_FIRST: u8 = 0x06;
    pub const WRITE_MIDDLE: u8 = 0x07;
    pub const WRITE_LAST: u8 = 0x08;
    pub const WRITE_LAST_IMM: u8 = 0x09;
    pub const WRITE_ONLY: u8 = 0x0A;
    pub const WRITE_ONLY_IMM: u8 = 0x0B;
    pub const READ_REQUEST: u8 = 0x0C;
    pub const READ_RESPONSE_FIRST: u8 = 0x0D;
    pub const READ_RESPONSE_MIDDLE: u8 = 0x0E;
    pub const READ_RESPONSE_LAST: u8 = 0x0F;
    pub const READ_RESPONSE_ONLY: u8 = 0x10;
    pub const ACKNOWLEDGE: u8 = 0x11;
    pub const ATOMIC_ACKNOWLEDGE: u8 = 0x12;
    pub const COMPARE_SWAP: u8 = 0x13;
    pub const FETCH_ADD: u8 = 0x14;
    pub const SEND_LAST_INV: u8 = 0x16;
    pub const SEND_ONLY_INV: u8 = 0x17;
    pub const FLUSH: u8 = 0x1C;
    pub const ATOMIC_WRITE: u8 = 0x1D;
    pub const UC_BASE: u8 = 0x20;
    pub const UD_SEND_ONLY: u8 = 0x64;
    pub const UD_SEND_ONLY_IMM: u8 = 0x65;
}

/// Base transport header fields the engine uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Bth {
    pub opcode: u8,
    pub solicited: bool,
    pub pkey: u16,
    pub dest_qp: u32,
    pub ack_req: bool,
    pub psn: u32,
}

/// RDMA extended transport header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Reth {
    pub va: u64,
    pub rkey: u32,
    pub dma_len: u32,
}

/// Atomic extended transport header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct AtomicEth {
    pub va: u64,
    pub rkey: u32,
    pub swap_add: u64,
    pub compare: u64,
}

/// FLUSH extended transport header (IBTA 1.5): placement type and selectivity level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Feth {
    pub placement: u8,
    pub selectivity: u8,
}

/// AETH: syndrome byte and MSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Aeth {
    pub syndrome: u8,
    pub msn: u32,
}

/// Datagram extended transport header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Deth {
    pub qkey: u32,
    pub src_qp: u32,
}

/// Syndrome of a plain ACK without end-to-end credits (reference §1.4).
pub(crate) const SYNDROME_ACK: u8 = 0x1F;
/// RNR NAK type bits; the low five bits carry the timer code.
pub(crate) const SYNDROME_RNR: u8 = 0x20;
/// NAK: PSN sequence error.
pub(crate) const NAK_PSN_SEQ: u8 = 0x60;
/// NAK: invalid request.
pub(crate) const NAK_INVALID_REQUEST: u8 = 0x61;
/// NAK: remote access error.
pub(crate) const NAK_REMOTE_ACCESS: u8 = 0x62;
/// NAK: remote operational error.
pub(crate) const NAK_REMOTE_OPERATIONAL: u8 = 0x63;

/// Header fields of one packet (everything but the payload).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Headers {
    pub bth: Bth,
    pub reth: Option<Reth>,
    pub aeth: Option<Aeth>,
    pub deth: Option<Deth>,
    /// Immediate data as a host-order value of its big-endian wire bytes.
    pub imm: Option<u32>,
    pub ieth: Option<u32>,
    pub atomic_eth: Option<AtomicEth>,
    pub atomic_ack: Option<u64>,
    pub feth: Option<Feth>,
}

/// A parsed packet: headers, opcode facts and the payload (pad and ICRC removed).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Packet<'a> {
    pub hdr: Headers,
    pub info: OpInfo,
    pub payload: &'a [u8],
}

/// Why bytes could not be parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ParseError {
    Truncated,
    UnknownOpcode,
    BadVersion,
    BadPad,
}

/// Parses BTH onward. `bytes` ends with the 4-byte ICRC (not checked here).
pub(crate) fn parse(bytes: &[u8]) -> Result<Packet<'_>, ParseError> {
    let (repr, payload) = PacketRepr::parse(bytes).map_err(|e| match e {
        WireError::Truncated => ParseError::Truncated,
        WireError::UnknownOpcode(_) => ParseError::UnknownOpcode,
        WireError::BadVersion => ParseError::BadVersion,
        _ => ParseError::BadPad,
    })?;
    let info = OpInfo::of(repr.bth.opcode.0).ok_or(ParseError::UnknownOpcode)?;
    let hdr = Headers {
        bth: Bth {
            opcode: repr.bth.opcode.0,
            solicited: repr.bth.solicited,
            pkey: repr.bth.pkey,
            dest_qp: repr.bth.dest_qp.value(),
            ack_req: repr.bth.ack_req,
            psn: repr.bth.psn.value(),
        },
        reth: repr.reth.map(|r| Reth {
            va: r.va,
            rkey: r.rkey,
            dma_len: r.dma_len,
        }),
        aeth: repr.aeth.map(|a| Aeth {
            syndrome: a.syndrome.encode(),
            msn: a.msn,
        }),
        deth: repr.deth.map(|d| Deth {
            qkey: d.qkey,
            src_qp: d.src_qp.value(),
        }),
        imm: repr.immdt,
        ieth: repr.ieth,
        atomic_eth: repr.atomic_eth.map(|a| AtomicEth {
            va: a.va,
            rkey: a.rkey,
            swap_add: a.swap_add,
            compare: a.compare,
        }),
        atomic_ack: repr.atomic_ack_eth.map(|a| a.orig),
        feth: repr.feth.map(|f| Feth {
            placement: f.placement_type,
            selectivity: f.selectivity_level,
        }),
    };
    Ok(Packet { hdr, info, payload })
}

#[inline]
fn to_repr(hdr: &Headers) -> PacketRepr {
    PacketRepr {
        bth: BthRepr {
            opcode: Opcode(hdr.bth.opcode),
            solicited: hdr.bth.solicited,
            pkey: hdr.bth.pkey,
            dest_qp: Qpn::new(hdr.bth.dest_qp),
            ack_req: hdr.bth.ack_req,
            psn: Psn::new(hdr.bth.psn),
            ..BthRepr::default()
        },
        reth: hdr.reth.map(|r| RethRepr {
            va: r.va,
            rkey: r.rkey,
            dma_len: r.dma_len,
        }),
        aeth: hdr.aeth.map(|a| AethRepr {
            syndrome: AethSyndrome::decode(a.syndrome),
            msn: a.msn,
        }),
        deth: hdr.deth.map(|d| DethRepr {
            qkey: d.qkey,
            src_qp: Qpn::new(d.src_qp),
        }),
        immdt: hdr.imm,
        ieth: hdr.ieth,
        atomic_eth: hdr.atomic_eth.map(|a| AtomicEthRepr {
            va: a.va,
            rkey: a.rkey,
            swap_add: a.swap_add,
            compare: a.compare,
        }),
        atomic_ack_eth: hdr.atomic_ack.map(|orig| AtomicAckEthRepr { orig }),
        feth: hdr.feth.map(|f| FethRepr {
            placement_type: f.placement,
            selectivity_level: f.selectivity,
        }),
    }
}

/// Total bytes of a packet with these headers and `payload_len` bytes of payload.
#[cfg(test)]
pub(crate) fn packet_len(info: &OpInfo, payload_len: usize) -> usize {
    BTH_LEN + info.ext_len() + payload_len + ((4 - payload_len % 4) % 4) + ICRC_LEN
}

/// Writes headers, `payload`, pad and a zero ICRC into `buf`; returns the length written,
/// or `None` if `buf` is too small or the headers do not match the opcode.
#[cfg(test)]
pub(crate) fn emit(hdr: &Headers, payload: &[u8], buf: &mut [u8]) -> Option<usize> {
    to_repr(hdr).emit(payload, buf).ok()
}

/// Writes headers, zero pad and a zero ICRC for a packet with `payload_len` bytes of
/// payload; returns `(payload offset, total length)`. The caller fills the payload bytes
/// in place (so payload is gathered straight from memory into the packet).
pub(crate) fn emit_headers(
    hdr: &Headers,
    payload_len: usize,
    buf: &mut [u8],
) -> Option<(usize, usize)> {
    let repr = to_repr(hdr);
    let header_len = repr.emit_headers(payload_len, buf).ok()?;
    // What `repr.buffer_len(payload_len)` says, and `emit_headers` checked it fits `buf`.
    Some((
        header_len,
        header_len + payload_len + softverbs_wire::packet::pad_len(payload_len) + ICRC_LEN,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_opcode() {
        for opcode in 0..=255u8 {
            let Some(info) = OpInfo::of(opcode) else {
                continue;
            };
            let hdr = Headers {
                bth: Bth {
                    opcode,
                    solicited: true,
                    pkey: 0xFFFF,
                    dest_qp: 0x123456,
                    ack_req: true,
                    psn: 0xABCDEF,
                },
                reth: info.reth.then_some(Reth {
                    va: 0x1122_3344_5566_7788,
                    rkey: 9,
                    dma_len: 3,
                }),
                aeth: info.aeth.then_some(Aeth {
                    syndrome: 0x1F,
                    msn: 77,
                }),
                deth: info.deth.then_some(Deth {
                    qkey: 0x1111_2222,
                    src_qp: 0x33,
                }),
                imm: info.imm.then_some(0xDEAD_BEEF),
                ieth: info.ieth.then_some(0x42),
                atomic_eth: info.atomic_eth.then_some(AtomicEth {
                    va: 8,
                    rkey: 1,
                    swap_add: 2,
                    compare: 3,
                }),
                atomic_ack: info.atomic_ack.then_some(0x0102_0304_0506_0708),
                feth: info.feth.then_some(Feth {
                    placement: 2,
                    selectivity: 1,
                }),
            };
            let payload: &[u8] = if info.payload { b"abc" } else { b"" };
            let mut buf = [0u8; 128];
            let n = emit(&hdr, payload, &mut buf).unwrap();
            assert_eq!(n, packet_len(&info, payload.len()));
            let p = parse(&buf[..n]).unwrap();
            assert_eq!(p.hdr, hdr, "opcode {opcode:#x}");
            assert_eq!(p.payload, payload);
            // In-place emission writes the same bytes.
            let mut buf2 = [0xAAu8; 128];
            let (start, n2) = emit_headers(&hdr, payload.len(), &mut buf2).unwrap();
            buf2[start..start + payload.len()].copy_from_slice(payload);
            assert_eq!(&buf2[..n2], &buf[..n]);
        }
    }

    #[test]
    fn rejects_truncated_and_unknown() {
        assert_eq!(parse(&[0u8; 15]).unwrap_err(), ParseError::Truncated);
        let mut b = [0u8; 16];
        b[0] = 0x81; // CNP: not implemented, dropped.
        assert_eq!(parse(&b).unwrap_err(), ParseError::UnknownOpcode);
        b[0] = 0x0A; // RDMA WRITE ONLY needs a RETH.
        assert_eq!(parse(&b).unwrap_err(), ParseError::Truncated);
    }
}
