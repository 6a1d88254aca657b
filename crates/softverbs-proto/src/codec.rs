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
    aeth, atomic_ack_eth, atomic_eth, bth, deth, feth, ieth, immdt, reth, AethRepr, AethSyndrome,
    AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, FethRepr, OpKind, Opcode, Position, Psn,
    Qpn, RethRepr,
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
    /// Bytes of BTH and extension headers.
    pub header_len: u8,
}

impl OpInfo {
    /// Facts for `opcode`, `None` for opcodes this engine does not implement (the wire
    /// crate's opcode table, reference §1.5). A reference into the table: parsing and
    /// emitting a packet look the opcode up once each, and the entry is not copied.
    #[inline]
    pub fn of(opcode: u8) -> Option<&'static OpInfo> {
        OP_INFO[usize::from(opcode)].as_ref()
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
            header_len: w.header_len() as u8,
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
static OP_INFO: [Option<OpInfo>; 256] = {
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
    pub info: &'static OpInfo,
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
///
/// Accepts and rejects exactly what `PacketRepr::parse` does, with the same error for each
/// input (its module documents the checks, in this order), and reads every field with the
/// wire crate's header views; it reads straight into [`Headers`] instead of going through
/// a `PacketRepr`, which cost a copy and a conversion of every header per packet. The test
/// `parse_agrees_with_the_wire_crate` holds the two together.
#[inline]
pub(crate) fn parse(bytes: &[u8]) -> Result<Packet<'_>, ParseError> {
    let (bth_bytes, rest) = bytes
        .split_first_chunk::<{ bth::HEADER_LEN }>()
        .ok_or(ParseError::Truncated)?;
    let bth = bth::Header::new_unchecked(bth_bytes);
    if bth.version() != 0 {
        return Err(ParseError::BadVersion);
    }
    let opcode = bth.opcode().0;
    let info = OpInfo::of(opcode).ok_or(ParseError::UnknownOpcode)?;
    let header_len = usize::from(info.header_len);
    if bytes.len() < header_len + ICRC_LEN {
        return Err(ParseError::Truncated);
    }
    let icrc_start = bytes.len() - ICRC_LEN;
    let body_len = icrc_start - header_len;
    let pad = usize::from(bth.pad_count());
    // `UnexpectedPayload` and `BadPadCount` of the wire crate.
    if (!info.payload && body_len != 0) || pad > body_len || !body_len.is_multiple_of(4) {
        return Err(ParseError::BadPad);
    }
    let payload = bytes
        .get(header_len..icrc_start - pad)
        .ok_or(ParseError::Truncated)?;
    let mut hdr = Headers {
        bth: Bth {
            opcode,
            solicited: bth.solicited(),
            pkey: bth.pkey(),
            dest_qp: bth.dest_qp().value(),
            ack_req: bth.ack_req(),
            psn: bth.psn().value(),
        },
        ..Headers::default()
    };
    // The length check above covers every header the opcode lists: each is cut off the
    // front of `rest` in wire order (the `Truncated` arms are never taken).
    let mut rest = rest;
    if info.deth {
        let (header, tail) = split::<{ deth::HEADER_LEN }>(rest)?;
        let header = deth::Header::new_unchecked(header);
        hdr.deth = Some(Deth {
            qkey: header.qkey(),
            src_qp: header.src_qp().value(),
        });
        rest = tail;
    }
    if info.feth {
        let (header, tail) = split::<{ feth::HEADER_LEN }>(rest)?;
        let header = feth::Header::new_unchecked(header);
        hdr.feth = Some(Feth {
            placement: header.placement_type(),
            selectivity: header.selectivity_level(),
        });
        rest = tail;
    }
    if info.reth {
        let (header, tail) = split::<{ reth::HEADER_LEN }>(rest)?;
        let header = reth::Header::new_unchecked(header);
        hdr.reth = Some(Reth {
            va: header.va(),
            rkey: header.rkey(),
            dma_len: header.dma_len(),
        });
        rest = tail;
    }
    if info.atomic_eth {
        let (header, tail) = split::<{ atomic_eth::HEADER_LEN }>(rest)?;
        let header = atomic_eth::Header::new_unchecked(header);
        hdr.atomic_eth = Some(AtomicEth {
            va: header.va(),
            rkey: header.rkey(),
            swap_add: header.swap_add(),
            compare: header.compare(),
        });
        rest = tail;
    }
    if info.aeth {
        let (header, tail) = split::<{ aeth::HEADER_LEN }>(rest)?;
        let header = aeth::Header::new_unchecked(header);
        hdr.aeth = Some(Aeth {
            syndrome: header.syndrome_byte(),
            msn: header.msn(),
        });
        rest = tail;
    }
    if info.atomic_ack {
        let (header, tail) = split::<{ atomic_ack_eth::HEADER_LEN }>(rest)?;
        hdr.atomic_ack = Some(atomic_ack_eth::Header::new_unchecked(header).orig());
        rest = tail;
    }
    if info.imm {
        let (header, tail) = split::<{ immdt::HEADER_LEN }>(rest)?;
        hdr.imm = Some(immdt::Header::new_unchecked(header).imm_data());
        rest = tail;
    }
    if info.ieth {
        let (header, _) = split::<{ ieth::HEADER_LEN }>(rest)?;
        hdr.ieth = Some(ieth::Header::new_unchecked(header).rkey());
    }
    Ok(Packet { hdr, info, payload })
}

/// The first `N` bytes of `data` as an array, and the rest (`Truncated` if it is shorter).
#[inline]
fn split<const N: usize>(data: &[u8]) -> Result<(&[u8; N], &[u8]), ParseError> {
    data.split_first_chunk::<N>().ok_or(ParseError::Truncated)
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
    let (start, len) = emit_headers(hdr, payload.len(), buf)?;
    buf.get_mut(start..start + payload.len())?
        .copy_from_slice(payload);
    Some(len)
}

/// Writes headers, zero pad and a zero ICRC for a packet with `payload_len` bytes of
/// payload; returns `(payload offset, total length)`. The caller fills the payload bytes
/// in place (so payload is gathered straight from memory into the packet).
///
/// Writes the bytes `PacketRepr::emit_headers` writes and refuses what it refuses (an
/// unknown opcode, headers that are not exactly the opcode's, payload on an opcode without
/// one, a short `buf`; nothing written then), each header with the wire crate's own
/// `emit`; it writes straight from [`Headers`] instead of converting them into a
/// `PacketRepr` first. The test `emit_headers_agrees_with_the_wire_crate` holds the two
/// together.
#[inline]
pub(crate) fn emit_headers(
    hdr: &Headers,
    payload_len: usize,
    buf: &mut [u8],
) -> Option<(usize, usize)> {
    let info = OpInfo::of(hdr.bth.opcode)?;
    let matches = info.reth == hdr.reth.is_some()
        && info.feth == hdr.feth.is_some()
        && info.aeth == hdr.aeth.is_some()
        && info.deth == hdr.deth.is_some()
        && info.imm == hdr.imm.is_some()
        && info.ieth == hdr.ieth.is_some()
        && info.atomic_eth == hdr.atomic_eth.is_some()
        && info.atomic_ack == hdr.atomic_ack.is_some();
    if !matches || (!info.payload && payload_len != 0) {
        return None;
    }
    let header_len = usize::from(info.header_len);
    let pad = softverbs_wire::packet::pad_len(payload_len);
    let len = header_len
        .saturating_add(payload_len)
        .saturating_add(pad)
        .saturating_add(ICRC_LEN);
    let (headers, rest) = buf.get_mut(..len)?.split_at_mut(header_len);
    let (bth_bytes, mut ext) = headers.split_first_chunk_mut::<{ bth::HEADER_LEN }>()?;
    BthRepr {
        opcode: Opcode(hdr.bth.opcode),
        solicited: hdr.bth.solicited,
        pad_count: pad as u8,
        pkey: hdr.bth.pkey,
        dest_qp: Qpn::new(hdr.bth.dest_qp),
        ack_req: hdr.bth.ack_req,
        psn: Psn::new(hdr.bth.psn),
        ..BthRepr::default()
    }
    .emit(&mut bth::Header::new_unchecked(bth_bytes));
    // `header_len` is the sum of exactly these headers (checked above): each is cut off
    // the front of `ext` in wire order (the `?`s are never taken).
    if let Some(d) = hdr.deth {
        let (header, tail) = ext.split_first_chunk_mut::<{ deth::HEADER_LEN }>()?;
        DethRepr {
            qkey: d.qkey,
            src_qp: Qpn::new(d.src_qp),
        }
        .emit(&mut deth::Header::new_unchecked(header));
        ext = tail;
    }
    if let Some(f) = hdr.feth {
        let (header, tail) = ext.split_first_chunk_mut::<{ feth::HEADER_LEN }>()?;
        FethRepr {
            placement_type: f.placement,
            selectivity_level: f.selectivity,
        }
        .emit(&mut feth::Header::new_unchecked(header));
        ext = tail;
    }
    if let Some(r) = hdr.reth {
        let (header, tail) = ext.split_first_chunk_mut::<{ reth::HEADER_LEN }>()?;
        RethRepr {
            va: r.va,
            rkey: r.rkey,
            dma_len: r.dma_len,
        }
        .emit(&mut reth::Header::new_unchecked(header));
        ext = tail;
    }
    if let Some(a) = hdr.atomic_eth {
        let (header, tail) = ext.split_first_chunk_mut::<{ atomic_eth::HEADER_LEN }>()?;
        AtomicEthRepr {
            va: a.va,
            rkey: a.rkey,
            swap_add: a.swap_add,
            compare: a.compare,
        }
        .emit(&mut atomic_eth::Header::new_unchecked(header));
        ext = tail;
    }
    if let Some(a) = hdr.aeth {
        let (header, tail) = ext.split_first_chunk_mut::<{ aeth::HEADER_LEN }>()?;
        AethRepr {
            syndrome: AethSyndrome::decode(a.syndrome),
            msn: a.msn,
        }
        .emit(&mut aeth::Header::new_unchecked(header));
        ext = tail;
    }
    if let Some(orig) = hdr.atomic_ack {
        let (header, tail) = ext.split_first_chunk_mut::<{ atomic_ack_eth::HEADER_LEN }>()?;
        AtomicAckEthRepr { orig }.emit(&mut atomic_ack_eth::Header::new_unchecked(header));
        ext = tail;
    }
    if let Some(imm_data) = hdr.imm {
        let (header, tail) = ext.split_first_chunk_mut::<{ immdt::HEADER_LEN }>()?;
        immdt::Header::new_unchecked(header).set_imm_data(imm_data);
        ext = tail;
    }
    if let Some(rkey) = hdr.ieth {
        let (header, _) = ext.split_first_chunk_mut::<{ ieth::HEADER_LEN }>()?;
        ieth::Header::new_unchecked(header).set_rkey(rkey);
    }
    if let Some(trailer) = rest.get_mut(payload_len..) {
        trailer.fill(0);
    }
    Some((header_len, len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use softverbs_wire::{PacketRepr, WireError};

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
            assert_eq!(n, packet_len(info, payload.len()));
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

    /// The engine's headers of a wire-crate repr, field by field (what `parse` did before it
    /// read the bytes itself).
    fn from_repr(repr: &PacketRepr) -> Headers {
        Headers {
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
        }
    }

    /// The wire-crate repr of the engine's headers (what `emit_headers` built before it
    /// wrote the bytes itself).
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

    /// A small deterministic generator (splitmix64), so the tests need no `rand`.
    struct Bits(u64);

    impl Bits {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
    }

    /// `parse` accepts what `PacketRepr::parse` accepts, with the same headers and payload,
    /// and fails where it fails, with the error the engine used to map it to: every opcode
    /// byte, every length up to 80 bytes, random contents with TVer mostly 0.
    #[test]
    fn parse_agrees_with_the_wire_crate() {
        let mut bits = Bits(14);
        let mut accepted = 0;
        for opcode in 0..=255u8 {
            for len in 0..=80usize {
                for _ in 0..8 {
                    let mut bytes: Vec<u8> = (0..len).map(|_| bits.next() as u8).collect();
                    if let Some(b) = bytes.first_mut() {
                        *b = opcode;
                    }
                    if let Some(b) = bytes.get_mut(1) {
                        if !bits.next().is_multiple_of(8) {
                            *b &= 0xF0;
                        }
                    }
                    let wire = PacketRepr::parse(&bytes).map_err(|e| match e {
                        WireError::Truncated => ParseError::Truncated,
                        WireError::UnknownOpcode(_) => ParseError::UnknownOpcode,
                        WireError::BadVersion => ParseError::BadVersion,
                        _ => ParseError::BadPad,
                    });
                    match (parse(&bytes), wire) {
                        (Ok(p), Ok((repr, payload))) => {
                            assert_eq!(p.hdr, from_repr(&repr), "{bytes:02x?}");
                            assert_eq!(p.payload, payload, "{bytes:02x?}");
                            assert_eq!(Some(p.info), OpInfo::of(opcode));
                            accepted += 1;
                        }
                        (Err(a), Err(b)) => assert_eq!(a, b, "{bytes:02x?}"),
                        (a, b) => panic!("{bytes:02x?}: {a:?} but the wire crate {b:?}"),
                    }
                }
            }
        }
        assert!(accepted > 1000, "only {accepted} packets parsed");
    }

    /// `emit_headers` writes the bytes `PacketRepr::emit_headers` writes, into the same
    /// buffer, and refuses what it refuses: every opcode byte, headers mostly the opcode's
    /// and sometimes not, random field values, payloads where there should be none, short
    /// buffers.
    #[test]
    fn emit_headers_agrees_with_the_wire_crate() {
        let mut bits = Bits(15);
        let mut written = 0;
        for opcode in 0..=255u8 {
            let info = OpInfo::of(opcode);
            for _ in 0..128 {
                let mut present = |wanted: Option<bool>| {
                    let wanted = wanted.unwrap_or(false);
                    if bits.next().is_multiple_of(16) {
                        !wanted
                    } else {
                        wanted
                    }
                };
                let has = |f: fn(&OpInfo) -> bool| info.map(f);
                let (reth, aeth, deth, imm, ieth, atomic_eth, atomic_ack, feth) = (
                    present(has(|i| i.reth)),
                    present(has(|i| i.aeth)),
                    present(has(|i| i.deth)),
                    present(has(|i| i.imm)),
                    present(has(|i| i.ieth)),
                    present(has(|i| i.atomic_eth)),
                    present(has(|i| i.atomic_ack)),
                    present(has(|i| i.feth)),
                );
                let mut r = || bits.next();
                let hdr = Headers {
                    bth: Bth {
                        opcode,
                        solicited: r() & 1 == 1,
                        pkey: r() as u16,
                        dest_qp: r() as u32,
                        ack_req: r() & 1 == 1,
                        psn: r() as u32,
                    },
                    reth: reth.then(|| Reth {
                        va: r(),
                        rkey: r() as u32,
                        dma_len: r() as u32,
                    }),
                    aeth: aeth.then(|| Aeth {
                        syndrome: r() as u8,
                        msn: r() as u32,
                    }),
                    deth: deth.then(|| Deth {
                        qkey: r() as u32,
                        src_qp: r() as u32,
                    }),
                    imm: imm.then(|| r() as u32),
                    ieth: ieth.then(|| r() as u32),
                    atomic_eth: atomic_eth.then(|| AtomicEth {
                        va: r(),
                        rkey: r() as u32,
                        swap_add: r(),
                        compare: r(),
                    }),
                    atomic_ack: atomic_ack.then(&mut r),
                    feth: feth.then(|| Feth {
                        placement: r() as u8,
                        selectivity: r() as u8,
                    }),
                };
                let payload_len = (r() % 12) as usize;
                let buf_len = (r() % 80) as usize;
                let fill = r() as u8;
                let mut ours = vec![fill; buf_len];
                let mut theirs = vec![fill; buf_len];
                let wire = to_repr(&hdr)
                    .emit_headers(payload_len, &mut theirs)
                    .ok()
                    .map(|start| (start, to_repr(&hdr).buffer_len(payload_len)));
                assert_eq!(
                    emit_headers(&hdr, payload_len, &mut ours),
                    wire,
                    "{hdr:?}, payload {payload_len}, buffer {buf_len}"
                );
                assert_eq!(ours, theirs, "{hdr:?}, payload {payload_len}");
                written += usize::from(wire.is_some());
            }
        }
        assert!(written > 1000, "only {written} packets written");
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
