//! The whole IB transport packet of a RoCEv2 UDP payload: BTH, extension headers, payload,
//! pad and ICRC.
//!
//! Layout (reference §1.1, §1.5, §1.6):
//!
//! ```text
//! BTH (12) | DETH | RETH | AtomicETH | AETH | AtomicAckETH | ImmDt | IETH | payload | pad (0..3) | ICRC (4)
//! ```
//!
//! with exactly the extension headers the opcode table lists, in that order. The UDP payload
//! is this packet and nothing else: a receiver must cut it out by the UDP length, never by a
//! captured frame length (reference §5.3).
//!
//! Holds the checked view [`Packet`], the parsed form [`PacketRepr`] and [`pad_len`].
//!
//! No-panic contract: [`PacketRepr::parse`], [`Packet::new_checked`] and
//! [`Packet::check_len`] never panic, whatever the bytes; [`PacketRepr::emit`] and
//! [`PacketRepr::buffer_len`] never panic, whatever the repr, payload and buffer. Accessors of
//! a [`Packet`] never panic once [`Packet::check_len`] has passed; on a view made with
//! [`Packet::new_unchecked`] over bytes that fail it they may panic.
//!
//! What [`PacketRepr::parse`] checks: the buffer holds a BTH (`Truncated`); TVer is 0
//! (`BadVersion`); the opcode is in the table (`UnknownOpcode`, which includes CNP); the
//! buffer holds every header the opcode requires plus the 4-byte ICRC (`Truncated`); an
//! opcode without payload has nothing between its headers and the ICRC
//! (`UnexpectedPayload`); the pad count fits in and rounds payload + pad to a multiple of 4
//! (`BadPadCount`). It does not check the ICRC (see [`icrc`](crate::icrc)), pad byte values,
//! reserved bits, P_Key, QPN, or anything that needs QP state (path MTU, PSN, sequence).

use core::fmt;
use core::ops::Range;

use crate::{
    aeth, atomic_ack_eth, atomic_eth, bth, deth, feth, ieth, immdt, reth, AethRepr,
    AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, FethRepr, OpcodeInfo, RethRepr, WireError,
};

/// Length of the ICRC trailer in bytes.
pub const ICRC_LEN: usize = 4;

/// Pad bytes after a payload of `payload_len` bytes: `(-payload_len) & 3` (reference §1.6).
#[inline]
pub const fn pad_len(payload_len: usize) -> usize {
    payload_len.wrapping_neg() & 3
}

/// Where the parts of a packet are, once its opcode and length have been checked.
struct Layout {
    info: OpcodeInfo,
    header_len: usize,
    payload: Range<usize>,
    icrc_start: usize,
}

#[inline]
fn layout(data: &[u8]) -> Result<Layout, WireError> {
    let bth_header = bth::Header::new_checked(data)?;
    if bth_header.version() != 0 {
        return Err(WireError::BadVersion);
    }
    let opcode = bth_header.opcode();
    let info = opcode.info().ok_or(WireError::UnknownOpcode(opcode.0))?;
    let header_len = info.header_len();
    if data.len() < header_len + ICRC_LEN {
        return Err(WireError::Truncated);
    }
    let icrc_start = data.len() - ICRC_LEN;
    let body_len = icrc_start - header_len;
    if !info.has_payload && body_len != 0 {
        return Err(WireError::UnexpectedPayload);
    }
    let pad = usize::from(bth_header.pad_count());
    if pad > body_len || !body_len.is_multiple_of(4) {
        return Err(WireError::BadPadCount);
    }
    Ok(Layout {
        info,
        header_len,
        payload: header_len..icrc_start - pad,
        icrc_start,
    })
}

/// A read/write view of a whole IB transport packet (BTH through ICRC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking it. Accessors may panic if [`Packet::check_len`]
    /// would fail; use [`Packet::new_checked`] for untrusted input.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer after [`Packet::check_len`].
    pub fn new_checked(buffer: T) -> Result<Packet<T>, WireError> {
        let packet = Packet::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks the structure [`PacketRepr::parse`] checks (see the module documentation):
    /// BTH present with TVer 0, known opcode, every required header and the ICRC present,
    /// payload and pad consistent with the opcode and the pad count.
    pub fn check_len(&self) -> Result<(), WireError> {
        layout(self.buffer.as_ref()).map(|_| ())
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn checked_layout(&self) -> Layout {
        match layout(self.buffer.as_ref()) {
            Ok(layout) => layout,
            Err(err) => panic!("packet::Packet accessor on an unchecked, invalid buffer: {err}"),
        }
    }

    /// A view of the BTH.
    pub fn bth(&self) -> bth::Header<&[u8]> {
        bth::Header::new_unchecked(self.buffer.as_ref())
    }

    /// The opcode table entry of the packet's opcode.
    #[inline]
    pub fn info(&self) -> OpcodeInfo {
        self.checked_layout().info
    }

    /// Bytes of all transport headers (BTH and extension headers).
    #[inline]
    pub fn header_len(&self) -> usize {
        self.checked_layout().header_len
    }

    /// The payload, without pad and ICRC.
    pub fn payload(&self) -> &[u8] {
        let layout = self.checked_layout();
        &self.buffer.as_ref()[layout.payload]
    }

    /// The ICRC trailer, read least-significant byte first (reference §1.7 step 4).
    pub fn icrc(&self) -> u32 {
        let start = self.checked_layout().icrc_start;
        let mut bytes = [0u8; ICRC_LEN];
        bytes.copy_from_slice(&self.buffer.as_ref()[start..start + ICRC_LEN]);
        u32::from_le_bytes(bytes)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// A mutable view of the BTH (e.g. to set F/B or A on a packet kept for retransmission;
    /// fields covered by the ICRC need [`icrc::fill`](crate::icrc::fill) afterwards).
    pub fn bth_mut(&mut self) -> bth::Header<&mut [u8]> {
        bth::Header::new_unchecked(self.buffer.as_mut())
    }

    /// The payload, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let layout = self.checked_layout();
        &mut self.buffer.as_mut()[layout.payload]
    }

    /// Writes the ICRC trailer least-significant byte first.
    pub fn set_icrc(&mut self, value: u32) {
        let start = self.checked_layout().icrc_start;
        self.buffer.as_mut()[start..start + ICRC_LEN].copy_from_slice(&value.to_le_bytes());
    }
}

/// Prints the parsed packet (see [`PacketRepr`]'s `Display`), or the parse error.
impl<T: AsRef<[u8]>> fmt::Display for Packet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match PacketRepr::parse(self.buffer.as_ref()) {
            Ok((repr, payload)) => write!(f, "{repr}, payload {} bytes", payload.len()),
            Err(err) => write!(f, "IB packet ({err})"),
        }
    }
}

/// The parsed headers of an IB transport packet.
///
/// A valid repr has exactly the extension headers its opcode lists in the table (reference
/// §1.5): [`PacketRepr::parse`] only produces valid reprs, and [`PacketRepr::emit`] refuses
/// others. `Default` is an RC SEND FIRST with P_Key 0xFFFF and no extension headers; use it
/// with struct-update syntax.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PacketRepr {
    /// Base transport header.
    pub bth: BthRepr,
    /// FETH: FLUSH (before its RETH).
    pub feth: Option<FethRepr>,
    /// RETH: RDMA WRITE FIRST / ONLY (with or without immediate), RDMA READ REQUEST,
    /// FLUSH, ATOMIC WRITE.
    pub reth: Option<RethRepr>,
    /// AETH: ACKNOWLEDGE, ATOMIC ACKNOWLEDGE, READ RESPONSE FIRST / LAST / ONLY.
    pub aeth: Option<AethRepr>,
    /// DETH: every UD packet.
    pub deth: Option<DethRepr>,
    /// ImmDt: the immediate data of the WITH IMMEDIATE opcodes, wire bytes read big-endian
    /// (see [`immdt`] for the mapping to `imm_data`).
    pub immdt: Option<u32>,
    /// IETH: the R_Key to invalidate (RC SEND LAST / ONLY WITH INVALIDATE).
    pub ieth: Option<u32>,
    /// AtomicETH: COMPARE SWAP, FETCH ADD.
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AtomicAckETH: ATOMIC ACKNOWLEDGE.
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
}

/// The first `N` bytes of `data` as an array, and the rest (`Truncated` if it is shorter).
fn split<const N: usize>(data: &[u8]) -> Result<(&[u8; N], &[u8]), WireError> {
    data.split_first_chunk::<N>().ok_or(WireError::Truncated)
}

impl PacketRepr {
    /// Parses an IB transport packet: `packet` is the whole UDP payload, ICRC included.
    /// Returns the headers and the payload (without pad and ICRC).
    ///
    /// The ICRC is not checked here; call [`icrc::verify`](crate::icrc::verify) with the IP
    /// and UDP header information. See the module documentation for what is checked.
    #[inline]
    pub fn parse(packet: &[u8]) -> Result<(PacketRepr, &[u8]), WireError> {
        let layout = layout(packet)?;
        let info = layout.info;
        // `layout` checked that the packet holds every header the opcode lists: each is
        // cut off the front as an array (no further length checks), in wire order.
        let (bth, mut rest) = split::<{ bth::HEADER_LEN }>(packet)?;
        let mut repr = PacketRepr {
            bth: BthRepr::parse(&bth::Header::new_unchecked(bth))?,
            ..PacketRepr::default()
        };
        if info.has_deth {
            let (header, tail) = split::<{ deth::HEADER_LEN }>(rest)?;
            repr.deth = Some(DethRepr::parse(&deth::Header::new_unchecked(header))?);
            rest = tail;
        }
        if info.has_feth {
            let (header, tail) = split::<{ feth::HEADER_LEN }>(rest)?;
            repr.feth = Some(FethRepr::parse(&feth::Header::new_unchecked(header))?);
            rest = tail;
        }
        if info.has_reth {
            let (header, tail) = split::<{ reth::HEADER_LEN }>(rest)?;
            repr.reth = Some(RethRepr::parse(&reth::Header::new_unchecked(header))?);
            rest = tail;
        }
        if info.has_atomic_eth {
            let (header, tail) = split::<{ atomic_eth::HEADER_LEN }>(rest)?;
            repr.atomic_eth = Some(AtomicEthRepr::parse(&atomic_eth::Header::new_unchecked(
                header,
            ))?);
            rest = tail;
        }
        if info.has_aeth {
            let (header, tail) = split::<{ aeth::HEADER_LEN }>(rest)?;
            repr.aeth = Some(AethRepr::parse(&aeth::Header::new_unchecked(header))?);
            rest = tail;
        }
        if info.has_atomic_ack_eth {
            let (header, tail) = split::<{ atomic_ack_eth::HEADER_LEN }>(rest)?;
            repr.atomic_ack_eth = Some(AtomicAckEthRepr::parse(
                &atomic_ack_eth::Header::new_unchecked(header),
            )?);
            rest = tail;
        }
        if info.has_immdt {
            let (header, tail) = split::<{ immdt::HEADER_LEN }>(rest)?;
            repr.immdt = Some(immdt::Header::new_unchecked(header).imm_data());
            rest = tail;
        }
        if info.has_ieth {
            let (header, _) = split::<{ ieth::HEADER_LEN }>(rest)?;
            repr.ieth = Some(ieth::Header::new_unchecked(header).rkey());
        }
        let payload = packet.get(layout.payload).ok_or(WireError::Truncated)?;
        Ok((repr, payload))
    }

    /// The opcode table entry of `bth.opcode`, if the opcode is supported.
    #[inline]
    pub fn info(&self) -> Option<OpcodeInfo> {
        self.bth.opcode.info()
    }

    /// Checks that the opcode is supported and that exactly its extension headers are
    /// present; returns its table entry. [`PacketRepr::emit`] runs this first.
    #[inline]
    pub fn check_headers(&self) -> Result<OpcodeInfo, WireError> {
        let info = self
            .info()
            .ok_or(WireError::UnknownOpcode(self.bth.opcode.0))?;
        let matches = info.has_reth == self.reth.is_some()
            && info.has_feth == self.feth.is_some()
            && info.has_aeth == self.aeth.is_some()
            && info.has_deth == self.deth.is_some()
            && info.has_immdt == self.immdt.is_some()
            && info.has_ieth == self.ieth.is_some()
            && info.has_atomic_eth == self.atomic_eth.is_some()
            && info.has_atomic_ack_eth == self.atomic_ack_eth.is_some();
        if matches {
            Ok(info)
        } else {
            Err(WireError::HeaderMismatch)
        }
    }

    /// Bytes of the transport headers present in this repr (BTH plus each `Some` header).
    #[inline]
    pub fn header_len(&self) -> usize {
        bth::HEADER_LEN
            + self.deth.map_or(0, |_| deth::HEADER_LEN)
            + self.feth.map_or(0, |_| feth::HEADER_LEN)
            + self.reth.map_or(0, |_| reth::HEADER_LEN)
            + self.atomic_eth.map_or(0, |_| atomic_eth::HEADER_LEN)
            + self.aeth.map_or(0, |_| aeth::HEADER_LEN)
            + self
                .atomic_ack_eth
                .map_or(0, |_| atomic_ack_eth::HEADER_LEN)
            + self.immdt.map_or(0, |_| immdt::HEADER_LEN)
            + self.ieth.map_or(0, |_| ieth::HEADER_LEN)
    }

    /// Bytes [`PacketRepr::emit`] writes for a payload of `payload_len` bytes: headers,
    /// payload, pad and ICRC (saturating at `usize::MAX`, never overflowing).
    #[inline]
    pub fn buffer_len(&self, payload_len: usize) -> usize {
        self.header_len()
            .saturating_add(payload_len)
            .saturating_add(pad_len(payload_len))
            .saturating_add(ICRC_LEN)
    }

    /// Writes the packet into the front of `buf` and returns its length
    /// ([`PacketRepr::buffer_len`]): headers, `payload`, zero pad bytes and a zero ICRC
    /// (fill it with [`icrc::fill`](crate::icrc::fill)).
    ///
    /// The BTH pad count written is the one `payload.len()` needs, whatever
    /// `self.bth.pad_count` says; TVer and reserved bits are written as 0.
    ///
    /// Errors: `UnknownOpcode`, `HeaderMismatch` (see [`PacketRepr::check_headers`]),
    /// `UnexpectedPayload` for a non-empty payload on an opcode without payload,
    /// `BufferTooSmall`. Nothing is written on error.
    pub fn emit(&self, payload: &[u8], buf: &mut [u8]) -> Result<usize, WireError> {
        let header_len = self.emit_headers(payload.len(), buf)?;
        // `emit_headers` checked that `buf` holds the whole packet.
        let body = buf
            .get_mut(header_len..header_len + payload.len())
            .ok_or(WireError::Truncated)?;
        body.copy_from_slice(payload);
        Ok(header_len + payload.len() + pad_len(payload.len()) + ICRC_LEN)
    }

    /// Writes the packet [`PacketRepr::emit`] writes for a payload of `payload_len` bytes
    /// into the front of `buf`, except the payload bytes, which are left as they are (for
    /// the caller to fill in place, e.g. gathered straight from memory): headers (the pad
    /// count `payload_len` needs), zero pad bytes and a zero ICRC. Returns the length of
    /// the headers, where the payload starts; the packet is
    /// [`PacketRepr::buffer_len`]`(payload_len)` bytes. The errors of
    /// [`PacketRepr::emit`], and nothing is written on error.
    #[inline]
    pub fn emit_headers(&self, payload_len: usize, buf: &mut [u8]) -> Result<usize, WireError> {
        let info = self.check_headers()?;
        if !info.has_payload && payload_len != 0 {
            return Err(WireError::UnexpectedPayload);
        }
        // The headers present are the opcode's (`check_headers`): `buffer_len` from the
        // table entry.
        let header_len = info.header_len();
        let pad = pad_len(payload_len);
        let len = header_len
            .saturating_add(payload_len)
            .saturating_add(pad)
            .saturating_add(ICRC_LEN);
        let available = buf.len();
        let buf = buf.get_mut(..len).ok_or(WireError::BufferTooSmall {
            needed: len,
            available,
        })?;
        let (headers, rest) = buf.split_at_mut(header_len);
        let bth = BthRepr {
            pad_count: pad as u8,
            ..self.bth
        };
        let (header, mut rest_headers) = headers.split_at_mut(bth::HEADER_LEN);
        bth.emit(&mut bth::Header::new_unchecked(header));
        if let Some(deth) = &self.deth {
            let (header, tail) = rest_headers.split_at_mut(deth::HEADER_LEN);
            deth.emit(&mut deth::Header::new_unchecked(header));
            rest_headers = tail;
        }
        if let Some(feth) = &self.feth {
            let (header, tail) = rest_headers.split_at_mut(feth::HEADER_LEN);
            feth.emit(&mut feth::Header::new_unchecked(header));
            rest_headers = tail;
        }
        if let Some(reth) = &self.reth {
            let (header, tail) = rest_headers.split_at_mut(reth::HEADER_LEN);
            reth.emit(&mut reth::Header::new_unchecked(header));
            rest_headers = tail;
        }
        if let Some(atomic_eth) = &self.atomic_eth {
            let (header, tail) = rest_headers.split_at_mut(atomic_eth::HEADER_LEN);
            atomic_eth.emit(&mut atomic_eth::Header::new_unchecked(header));
            rest_headers = tail;
        }
        if let Some(aeth) = &self.aeth {
            let (header, tail) = rest_headers.split_at_mut(aeth::HEADER_LEN);
            aeth.emit(&mut aeth::Header::new_unchecked(header));
            rest_headers = tail;
        }
        if let Some(atomic_ack_eth) = &self.atomic_ack_eth {
            let (header, tail) = rest_headers.split_at_mut(atomic_ack_eth::HEADER_LEN);
            atomic_ack_eth.emit(&mut atomic_ack_eth::Header::new_unchecked(header));
            rest_headers = tail;
        }
        if let Some(imm_data) = self.immdt {
            let (header, tail) = rest_headers.split_at_mut(immdt::HEADER_LEN);
            immdt::Header::new_unchecked(header).set_imm_data(imm_data);
            rest_headers = tail;
        }
        if let Some(rkey) = self.ieth {
            ieth::Header::new_unchecked(rest_headers).set_rkey(rkey);
        }
        if let Some(trailer) = rest.get_mut(payload_len..) {
            trailer.fill(0);
        }
        Ok(header_len)
    }
}

/// Prints each header like tcpdump, separated by `, `: `BTH opcode=RC RDMA WRITE ONLY
/// dqpn=0x000169 psn=7010277 migreq ackreq pad=2, RETH va=0x000055f4e59cedb0 rkey=0x0001350d
/// len=22`.
impl fmt::Display for PacketRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bth)?;
        if let Some(deth) = &self.deth {
            write!(f, ", {deth}")?;
        }
        if let Some(feth) = &self.feth {
            write!(f, ", {feth}")?;
        }
        if let Some(reth) = &self.reth {
            write!(f, ", {reth}")?;
        }
        if let Some(atomic_eth) = &self.atomic_eth {
            write!(f, ", {atomic_eth}")?;
        }
        if let Some(aeth) = &self.aeth {
            write!(f, ", {aeth}")?;
        }
        if let Some(atomic_ack_eth) = &self.atomic_ack_eth {
            write!(f, ", {atomic_ack_eth}")?;
        }
        if let Some(imm_data) = self.immdt {
            write!(f, ", {}", immdt::ImmDtRepr { imm_data })?;
        }
        if let Some(rkey) = self.ieth {
            write!(f, ", {}", ieth::IethRepr { rkey })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_vectors::{self, hex};
    use crate::{icrc, AethSyndrome, ImmDtRepr, Opcode, Psn, Qpn};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The IB transport packet (UDP payload, ICRC included) of an IP packet.
    fn ib_part(packet: &[u8]) -> Vec<u8> {
        icrc::split_ip_packet(packet).unwrap().2.to_vec()
    }

    fn hardware_bth(
        opcode: Opcode,
        pad_count: u8,
        dest_qp: u32,
        ack_req: bool,
        psn: u32,
    ) -> BthRepr {
        // ConnectX sends M=1 (reference §1.9).
        BthRepr {
            opcode,
            mig_req: true,
            pad_count,
            dest_qp: Qpn::new(dest_qp),
            ack_req,
            psn: Psn::new(psn),
            ..BthRepr::default()
        }
    }

    const TEXT: &[u8] = b"textstringdoghhhhhghgg";

    /// Reference §1.8 vector A, parsed: (IP packet hex, repr, payload).
    fn vector_a() -> Vec<(&'static str, PacketRepr, Vec<u8>)> {
        let reth = RethRepr {
            va: 0x0000_55f4_e59c_edb0,
            rkey: 0x0001_350d,
            dma_len: 22,
        };
        vec![
            (
                test_vectors::A_SEND_ONLY,
                PacketRepr {
                    bth: hardware_bth(Opcode::RC_SEND_ONLY, 0, 0x169, true, 0x6a_f7e4),
                    ..PacketRepr::default()
                },
                hex("60a361bca855000016000000200e0100"),
            ),
            (
                test_vectors::A_ACKNOWLEDGE,
                PacketRepr {
                    bth: hardware_bth(Opcode::RC_ACKNOWLEDGE, 0, 0x139, false, 0x6a_f7e4),
                    aeth: Some(AethRepr {
                        syndrome: AethSyndrome::Ack { credits: 0 },
                        msn: 1,
                    }),
                    ..PacketRepr::default()
                },
                vec![],
            ),
            (
                test_vectors::A_WRITE_ONLY,
                PacketRepr {
                    bth: hardware_bth(Opcode::RC_RDMA_WRITE_ONLY, 2, 0x169, true, 0x6a_f7e5),
                    reth: Some(reth),
                    ..PacketRepr::default()
                },
                TEXT.to_vec(),
            ),
            (
                test_vectors::A_READ_REQUEST,
                PacketRepr {
                    bth: hardware_bth(Opcode::RC_RDMA_READ_REQUEST, 0, 0x169, true, 0x6a_f7e6),
                    reth: Some(reth),
                    ..PacketRepr::default()
                },
                vec![],
            ),
            (
                test_vectors::A_READ_RESPONSE_ONLY,
                PacketRepr {
                    bth: hardware_bth(
                        Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                        2,
                        0x139,
                        false,
                        0x6a_f7e6,
                    ),
                    aeth: Some(AethRepr {
                        syndrome: AethSyndrome::Ack { credits: 0 },
                        msn: 3,
                    }),
                    ..PacketRepr::default()
                },
                TEXT.to_vec(),
            ),
        ]
    }

    // Reference §1.8 A: hardware packets parse to the documented fields.
    #[test]
    fn parse_connectx_packets() {
        for (packet, repr, payload) in vector_a() {
            let ib = ib_part(&hex(packet));
            let (parsed, data) = PacketRepr::parse(&ib).unwrap();
            assert_eq!(parsed, repr, "{repr}");
            assert_eq!(data, &payload[..], "{repr}");
        }
    }

    // Reference §1.8 A: emitting the parsed fields and filling the ICRC reproduces the
    // hardware bytes exactly (zero pad, LSB-first ICRC).
    #[test]
    fn emit_reproduces_connectx_packets_byte_for_byte() {
        for (packet, repr, payload) in vector_a() {
            let packet = hex(packet);
            let (ip, udp, ib) = icrc::split_ip_packet(&packet).unwrap();
            assert_eq!(repr.buffer_len(payload.len()), ib.len());
            let mut out = vec![0xAAu8; ib.len() + 5];
            let len = repr.emit(&payload, &mut out).unwrap();
            assert_eq!(len, ib.len());
            assert_eq!(&out[..len - 4], &ib[..len - 4], "{repr}");
            assert_eq!(&out[len - 4..len], &[0, 0, 0, 0], "ICRC left zero");
            assert_eq!(&out[len..], &[0xAA; 5], "nothing written past the packet");
            icrc::fill(&ip, &udp, &mut out[..len]).unwrap();
            assert_eq!(&out[..len], ib, "{repr}");
        }
    }

    // Reference §1.8 B, C, D: CNP is not a supported opcode; scapy's PadCnt=2 packet parses
    // with an 18-byte payload; the IPv6 packet carries "ABCD".
    #[test]
    fn parse_other_reference_vectors() {
        let cnp = ib_part(&hex(test_vectors::B_CNP_FRAME)[14..]);
        assert_eq!(PacketRepr::parse(&cnp), Err(WireError::UnknownOpcode(0x81)));
        let bth = BthRepr::parse(&bth::Header::new_checked(&cnp[..]).unwrap()).unwrap();
        assert!(bth.becn && bth.opcode == Opcode::CNP && bth.dest_qp == Qpn::new(0x118));

        let uc = ib_part(&hex(test_vectors::C_SCAPY_UC_SEND_ONLY));
        let (repr, payload) = PacketRepr::parse(&uc).unwrap();
        assert_eq!(repr.bth.opcode, Opcode::UC_SEND_ONLY);
        assert_eq!((repr.bth.pad_count, payload.len()), (2, 18));
        assert_eq!(repr.bth.dest_qp, Qpn::new(0xd3));

        let v6 = ib_part(&hex(test_vectors::D_IPV6_SEND_ONLY));
        let (repr, payload) = PacketRepr::parse(&v6).unwrap();
        assert_eq!(payload, b"ABCD");
        assert_eq!(
            (repr.bth.psn, repr.bth.dest_qp, repr.bth.ack_req),
            (Psn::new(0x100), Qpn::new(0x11), true)
        );
    }

    fn random_repr(rng: &mut ChaCha8Rng, opcode: Opcode) -> PacketRepr {
        let info = opcode.info().unwrap();
        let bth = BthRepr {
            opcode,
            solicited: rng.gen(),
            mig_req: rng.gen(),
            pad_count: 0,
            pkey: rng.gen(),
            fecn: rng.gen(),
            becn: rng.gen(),
            dest_qp: Qpn::new(rng.gen()),
            ack_req: rng.gen(),
            psn: Psn::new(rng.gen()),
        };
        PacketRepr {
            bth,
            feth: info.has_feth.then(|| FethRepr {
                placement_type: rng.gen::<u8>() & 0x0F,
                selectivity_level: rng.gen::<u8>() & 0x03,
            }),
            reth: info.has_reth.then(|| RethRepr {
                va: rng.gen(),
                rkey: rng.gen(),
                dma_len: rng.gen(),
            }),
            aeth: info.has_aeth.then(|| AethRepr {
                syndrome: AethSyndrome::decode(rng.gen()),
                msn: rng.gen::<u32>() & 0xFF_FFFF,
            }),
            deth: info.has_deth.then(|| DethRepr {
                qkey: rng.gen(),
                src_qp: Qpn::new(rng.gen()),
            }),
            immdt: info.has_immdt.then(|| rng.gen()),
            ieth: info.has_ieth.then(|| rng.gen()),
            atomic_eth: info.has_atomic_eth.then(|| AtomicEthRepr {
                va: rng.gen(),
                rkey: rng.gen(),
                swap_add: rng.gen(),
                compare: rng.gen(),
            }),
            atomic_ack_eth: info
                .has_atomic_ack_eth
                .then(|| AtomicAckEthRepr { orig: rng.gen() }),
        }
    }

    fn supported_opcodes() -> Vec<Opcode> {
        (0..=u8::MAX)
            .map(Opcode)
            .filter(|op| op.is_supported())
            .collect()
    }

    fn random_valid_packet(rng: &mut ChaCha8Rng) -> (PacketRepr, Vec<u8>, Vec<u8>) {
        let opcodes = supported_opcodes();
        let opcode = opcodes[rng.gen_range(0..opcodes.len())];
        let repr = random_repr(rng, opcode);
        let payload_len = if opcode.info().unwrap().has_payload {
            rng.gen_range(0..100)
        } else {
            0
        };
        let payload: Vec<u8> = (0..payload_len).map(|_| rng.gen()).collect();
        let mut bytes = vec![0u8; repr.buffer_len(payload.len())];
        let len = repr.emit(&payload, &mut bytes).unwrap();
        assert_eq!(len, bytes.len());
        (repr, payload, bytes)
    }

    // Reference §6 item 1: every opcode of §1.5 round-trips through emit and parse.
    #[test]
    fn every_opcode_round_trips_through_emit_and_parse() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for opcode in supported_opcodes() {
            for _ in 0..50 {
                let repr = random_repr(&mut rng, opcode);
                let info = opcode.info().unwrap();
                let payload_len = if info.has_payload {
                    rng.gen_range(0..64)
                } else {
                    0
                };
                let payload: Vec<u8> = (0..payload_len).map(|_| rng.gen()).collect();
                let mut bytes = vec![0u8; repr.buffer_len(payload_len)];
                assert_eq!(repr.emit(&payload, &mut bytes), Ok(bytes.len()));
                assert_eq!(
                    bytes.len(),
                    info.header_len() + payload_len + pad_len(payload_len) + 4
                );
                let (parsed, data) = PacketRepr::parse(&bytes).unwrap();
                let expected_bth = BthRepr {
                    pad_count: pad_len(payload_len) as u8,
                    ..repr.bth
                };
                assert_eq!(
                    parsed,
                    PacketRepr {
                        bth: expected_bth,
                        ..repr
                    }
                );
                assert_eq!(data, &payload[..]);
                let view = Packet::new_checked(&bytes[..]).unwrap();
                assert_eq!(view.payload(), &payload[..]);
                assert_eq!(view.header_len(), info.header_len());
                assert_eq!(view.info(), info);
            }
        }
    }

    // Reference §1.6: padcnt = (-payload_len) & 3, pad bytes zero.
    #[test]
    fn emit_derives_pad_count_from_payload() {
        assert_eq!([0, 1, 2, 3, 4, 5].map(pad_len), [0, 3, 2, 1, 0, 3]);
        let repr = PacketRepr {
            bth: BthRepr {
                opcode: Opcode::RC_SEND_ONLY,
                pad_count: 0,
                ..BthRepr::default()
            },
            ..PacketRepr::default()
        };
        let mut bytes = [0xFFu8; 12 + 5 + 3 + 4];
        assert_eq!(repr.buffer_len(5), bytes.len());
        assert_eq!(repr.emit(b"hello", &mut bytes), Ok(24));
        assert_eq!(bth::Header::new_unchecked(&bytes[..]).pad_count(), 3);
        assert_eq!(&bytes[17..], &[0; 7]);
        assert_eq!(repr.header_len(), 12);
        assert_eq!(repr.buffer_len(usize::MAX), usize::MAX);
    }

    fn ack_bytes() -> Vec<u8> {
        ib_part(&hex(test_vectors::A_ACKNOWLEDGE))
    }

    // Reference §6 item 1: truncated packets (UDP length < headers + ICRC) are rejected.
    #[test]
    fn parse_rejects_truncated_packets() {
        let write = ib_part(&hex(test_vectors::A_WRITE_ONLY));
        // BTH 12 + RETH 16 + ICRC 4 = 32 bytes minimum for RDMA WRITE ONLY.
        for len in 0..32 {
            let err = PacketRepr::parse(&write[..len]).unwrap_err();
            assert!(
                matches!(err, WireError::Truncated | WireError::BadPadCount),
                "{len}: {err}"
            );
        }
        for len in 0..32 {
            let mut short = write[..len].to_vec();
            short.truncate(len - len % 4);
            if short.len() >= 12 {
                short[1] &= !0x30; // pad count 0
            }
            assert_eq!(
                PacketRepr::parse(&short).err(),
                Some(WireError::Truncated),
                "{len}"
            );
        }
        let ack = ack_bytes();
        assert_eq!(PacketRepr::parse(&ack[..19]), Err(WireError::Truncated));
        assert!(PacketRepr::parse(&ack).is_ok());
    }

    // Reference §1.2: TVer must be 0.
    #[test]
    fn parse_rejects_bad_version() {
        let mut ack = ack_bytes();
        ack[1] |= 0x01;
        assert_eq!(PacketRepr::parse(&ack), Err(WireError::BadVersion));
    }

    // Reference §1.5: rxe drops opcodes not in its table (reserved, RD, CNP, XRC, and
    // FLUSH / ATOMIC WRITE outside RC); so do we, with the opcode in the error for counting.
    #[test]
    fn parse_rejects_unsupported_opcodes() {
        let mut ack = ack_bytes();
        for op in [0x15u8, 0x3C, 0x3D, 0x40, 0x81, 0xA0] {
            ack[0] = op;
            assert_eq!(PacketRepr::parse(&ack), Err(WireError::UnknownOpcode(op)));
        }
    }

    // Reference §1.5 column P: ACK, READ REQUEST and atomics carry no payload.
    #[test]
    fn parse_rejects_payload_on_opcodes_without_one() {
        let mut ack = ack_bytes();
        ack.splice(16..16, [1, 2, 3, 4]);
        assert_eq!(PacketRepr::parse(&ack), Err(WireError::UnexpectedPayload));
        let mut ack = ack_bytes();
        ack[1] |= 0x10; // pad count 1 with nothing to pad
        assert_eq!(PacketRepr::parse(&ack), Err(WireError::BadPadCount));
    }

    // Reference §1.6: the pad count must fit and round payload + pad to 4 bytes.
    #[test]
    fn parse_rejects_inconsistent_pad_count() {
        let write = ib_part(&hex(test_vectors::A_WRITE_ONLY));
        // Pad 1 over the same 24 bytes is a legal packet with a 23-byte payload.
        let mut other = write.clone();
        other[1] = (other[1] & !0x30) | 0x10;
        assert_eq!(PacketRepr::parse(&other).map(|(_, p)| p.len()), Ok(23));
        let mut bad = write.clone();
        bad.remove(40); // body of 23 bytes
        assert_eq!(PacketRepr::parse(&bad), Err(WireError::BadPadCount));
        // A zero-length SEND ONLY with pad 3 has no room for the pad.
        let mut empty = vec![
            0x04, 0x30, 0xff, 0xff, 0, 0, 0, 1, 0x80, 0, 0, 1, 0, 0, 0, 0,
        ];
        assert_eq!(PacketRepr::parse(&empty), Err(WireError::BadPadCount));
        empty[1] = 0;
        assert_eq!(PacketRepr::parse(&empty).map(|(_, p)| p.len()), Ok(0));
    }

    #[test]
    fn emit_rejects_invalid_reprs_without_writing() {
        let mut buf = [0x5Au8; 64];
        let send = PacketRepr {
            bth: BthRepr {
                opcode: Opcode::RC_SEND_ONLY,
                ..BthRepr::default()
            },
            ..PacketRepr::default()
        };
        let with_reth = PacketRepr {
            reth: Some(RethRepr::default()),
            ..send
        };
        assert_eq!(
            with_reth.emit(b"", &mut buf),
            Err(WireError::HeaderMismatch)
        );
        let write = PacketRepr {
            bth: BthRepr {
                opcode: Opcode::RC_RDMA_WRITE_FIRST,
                ..BthRepr::default()
            },
            ..PacketRepr::default()
        };
        assert_eq!(write.emit(b"", &mut buf), Err(WireError::HeaderMismatch));
        let cnp = PacketRepr {
            bth: BthRepr {
                opcode: Opcode::CNP,
                ..BthRepr::default()
            },
            ..send
        };
        assert_eq!(cnp.emit(b"", &mut buf), Err(WireError::UnknownOpcode(0x81)));
        let ack = PacketRepr {
            bth: BthRepr {
                opcode: Opcode::RC_ACKNOWLEDGE,
                ..BthRepr::default()
            },
            aeth: Some(AethRepr::default()),
            ..PacketRepr::default()
        };
        assert_eq!(ack.emit(b"x", &mut buf), Err(WireError::UnexpectedPayload));
        assert_eq!(
            send.emit(&[0; 49], &mut buf),
            Err(WireError::BufferTooSmall {
                needed: 68,
                available: 64
            })
        );
        assert_eq!(buf, [0x5A; 64]);
        assert_eq!(ack.emit(b"", &mut buf), Ok(20));
        assert_eq!(&buf[12..20], &[0x1F, 0, 0, 0, 0, 0, 0, 0]);
    }

    // Reference §1.5 notes: header order is BTH · RETH · ImmDt, BTH · AETH · AtomicAckETH,
    // BTH · DETH · ImmDt.
    #[test]
    fn extension_headers_are_written_in_ibta_order() {
        let write_imm = PacketRepr {
            bth: BthRepr {
                opcode: Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
                ..BthRepr::default()
            },
            reth: Some(RethRepr {
                va: 0x0102_0304_0506_0708,
                rkey: 0x1112_1314,
                dma_len: 4,
            }),
            immdt: Some(0xA1A2_A3A4),
            ..PacketRepr::default()
        };
        let mut buf = [0u8; 40];
        assert_eq!(write_imm.emit(b"data", &mut buf), Ok(40));
        assert_eq!(&buf[12..28], &hex("0102030405060708 11121314 00000004")[..]);
        assert_eq!(&buf[28..32], &[0xA1, 0xA2, 0xA3, 0xA4]);
        assert_eq!(&buf[32..36], b"data");

        let atomic_ack = PacketRepr {
            bth: BthRepr {
                opcode: Opcode::RC_ATOMIC_ACKNOWLEDGE,
                ..BthRepr::default()
            },
            aeth: Some(AethRepr {
                syndrome: AethSyndrome::ACK,
                msn: 5,
            }),
            atomic_ack_eth: Some(AtomicAckEthRepr { orig: 0x42 }),
            ..PacketRepr::default()
        };
        let mut buf = [0u8; 28];
        assert_eq!(atomic_ack.emit(b"", &mut buf), Ok(28));
        assert_eq!(&buf[12..24], &hex("1f000005 0000000000000042")[..]);

        let ud_imm = PacketRepr {
            bth: BthRepr {
                opcode: Opcode::UD_SEND_ONLY_WITH_IMMEDIATE,
                ..BthRepr::default()
            },
            deth: Some(DethRepr {
                qkey: 0x8001_0000,
                src_qp: Qpn::new(0x77),
            }),
            immdt: Some(0xB1B2_B3B4),
            ..PacketRepr::default()
        };
        let mut buf = [0u8; 28];
        assert_eq!(ud_imm.emit(b"", &mut buf), Ok(28));
        assert_eq!(&buf[12..24], &hex("80010000 00000077 b1b2b3b4")[..]);
    }

    // IBTA 1.5 FLUSH, as rxe builds it (rxe_opcode.c: BTH at 0, FETH at 12, RETH at 16,
    // no payload; rxe_hdr.h feth_init: selectivity in bits 5..4, placement in 3..0;
    // rxe_req.c: AckReq on the last packet, P_Key 0xFFFF, RETH va / rkey / length).
    #[test]
    fn flush_packet_is_bth_feth_reth_as_rxe_sends_it() {
        let flush = PacketRepr {
            bth: BthRepr {
                opcode: Opcode::RC_FLUSH,
                dest_qp: Qpn::new(0x11),
                ack_req: true,
                psn: Psn::new(0x0A0B0C),
                ..BthRepr::default()
            },
            feth: Some(FethRepr {
                placement_type: feth::PLACEMENT_GLOBAL | feth::PLACEMENT_PERSISTENT,
                selectivity_level: feth::SELECTIVITY_RANGE,
            }),
            reth: Some(RethRepr {
                va: 0x0000_7F00_1234_5000,
                rkey: 0x0000_1A2B,
                dma_len: 0x1000,
            }),
            ..PacketRepr::default()
        };
        let expected = hex("1c00ffff 00000011 800a0b0c \
             00000003 \
             00007f0012345000 00001a2b 00001000 \
             00000000");
        let mut buf = [0u8; 64];
        assert_eq!(flush.emit(b"", &mut buf), Ok(36));
        assert_eq!(&buf[..36], &expected[..]);
        let (parsed, payload) = PacketRepr::parse(&expected).unwrap();
        assert_eq!(parsed, flush);
        assert!(payload.is_empty());
        assert_eq!(
            parsed.to_string(),
            "BTH opcode=RC FLUSH dqpn=0x000011 psn=658188 ackreq pad=0, FETH plt=0x3 sel=0, \
             RETH va=0x00007f0012345000 rkey=0x00001a2b len=4096"
        );
        // oA19-2: FLUSH carries no payload.
        assert_eq!(
            flush.emit(b"x", &mut buf),
            Err(WireError::UnexpectedPayload)
        );
    }

    // IBTA 1.5 ATOMIC WRITE, as rxe builds it (rxe_opcode.c: BTH, RETH, payload; the RETH
    // length is 8 and the 8 payload bytes are the operand as the requester holds it in
    // memory, copied verbatim — rxe_req.c finish_packet memcpy of wqe->dma.atomic_wr).
    #[test]
    fn atomic_write_packet_is_bth_reth_and_eight_bytes_as_rxe_sends_it() {
        let atomic_write = PacketRepr {
            bth: BthRepr {
                opcode: Opcode::RC_ATOMIC_WRITE,
                dest_qp: Qpn::new(0x12),
                ack_req: true,
                psn: Psn::new(7),
                ..BthRepr::default()
            },
            reth: Some(RethRepr {
                va: 0x1000,
                rkey: 0x0000_0102,
                dma_len: 8,
            }),
            ..PacketRepr::default()
        };
        let operand = [0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88];
        let expected = hex("1d00ffff 00000012 80000007 \
             0000000000001000 00000102 00000008 \
             1122334455667788 \
             00000000");
        let mut buf = [0u8; 64];
        assert_eq!(atomic_write.emit(&operand, &mut buf), Ok(40));
        assert_eq!(&buf[..40], &expected[..]);
        let (parsed, payload) = PacketRepr::parse(&expected).unwrap();
        assert_eq!(parsed, atomic_write);
        assert_eq!(payload, operand);
    }

    #[test]
    fn packet_view_reads_and_writes_parts() {
        let mut bytes = ib_part(&hex(test_vectors::A_WRITE_ONLY));
        let mut packet = Packet::new_checked(&mut bytes[..]).unwrap();
        assert_eq!(packet.payload(), TEXT);
        assert_eq!(packet.icrc(), 0x0cf4_5f82);
        assert_eq!(packet.header_len(), 28);
        assert_eq!(packet.bth().psn(), Psn::new(0x6a_f7e5));
        packet.bth_mut().set_fecn(true);
        packet.payload_mut()[0] = b'T';
        packet.set_icrc(0x0102_0304);
        assert_eq!(&bytes[bytes.len() - 4..], &[4, 3, 2, 1]);
        assert_eq!(bytes[28], b'T');
        assert!(Packet::new_checked(&bytes[..10]).is_err());
    }

    #[test]
    fn display_packets_like_tcpdump() {
        let (_, repr, _) = &vector_a()[2];
        assert_eq!(
            repr.to_string(),
            "BTH opcode=RC RDMA WRITE ONLY dqpn=0x000169 psn=7010277 migreq ackreq pad=2, \
             RETH va=0x000055f4e59cedb0 rkey=0x0001350d len=22"
        );
        let ib = ib_part(&hex(test_vectors::A_ACKNOWLEDGE));
        assert_eq!(
            Packet::new_unchecked(&ib[..]).to_string(),
            "BTH opcode=RC ACKNOWLEDGE dqpn=0x000139 psn=7010276 migreq pad=0, \
             AETH syndrome=0x00 ACK credits=0 msn=1, payload 0 bytes"
        );
        assert_eq!(
            Packet::new_unchecked(&ib[..5]).to_string(),
            "IB packet (packet truncated)"
        );
        let ud = PacketRepr {
            bth: BthRepr {
                opcode: Opcode::UD_SEND_ONLY_WITH_IMMEDIATE,
                ..BthRepr::default()
            },
            deth: Some(DethRepr {
                qkey: 1,
                src_qp: Qpn::new(2),
            }),
            immdt: Some(3),
            ..PacketRepr::default()
        };
        assert_eq!(
            ud.to_string(),
            "BTH opcode=UD SEND ONLY WITH IMMEDIATE dqpn=0x000000 psn=0 pad=0, \
             DETH qkey=0x00000001 sqpn=0x000002, ImmDt imm=0x00000003"
        );
        assert_eq!(
            ImmDtRepr { imm_data: 3 }.to_string(),
            "ImmDt imm=0x00000003"
        );
    }

    /// Runs every parser of the crate over `bytes`; on a successful packet parse, checks
    /// the invariants and that re-emitting gives the same bytes up to reserved bits, pad
    /// bytes and ICRC. Returns whether the packet parsed.
    fn exercise_every_parser(bytes: &[u8]) -> bool {
        // Header parsers at offset 0, and their Display.
        let _ = bth::Header::new_checked(bytes).map(|h| (BthRepr::parse(&h), h.to_string()));
        let _ = reth::Header::new_checked(bytes).map(|h| (RethRepr::parse(&h), h.to_string()));
        let _ = aeth::Header::new_checked(bytes).map(|h| (AethRepr::parse(&h), h.to_string()));
        let _ = deth::Header::new_checked(bytes).map(|h| (DethRepr::parse(&h), h.to_string()));
        let _ = immdt::Header::new_checked(bytes).map(|h| h.to_string());
        let _ = ieth::Header::new_checked(bytes).map(|h| h.to_string());
        let _ = atomic_eth::Header::new_checked(bytes).map(|h| h.to_string());
        let _ = atomic_ack_eth::Header::new_checked(bytes).map(|h| h.to_string());
        // ICRC helpers over the same bytes taken as an IP packet and as an IB packet.
        let _ = icrc::verify_ip_packet(bytes);
        if let Ok((ip, udp, ib)) = icrc::split_ip_packet(bytes) {
            let _ = (icrc::verify(&ip, &udp, ib), ip.to_string(), udp.to_string());
        }
        let ip =
            icrc::IpHeaderInfo::linux_ipv4([10, 0, 0, 1].into(), [10, 0, 0, 2].into(), 0, 64, 100)
                .unwrap();
        let udp = icrc::UdpHeaderInfo {
            src_port: 1,
            dst_port: 4791,
            length: 80,
        };
        let _ = (
            icrc::compute(&ip, &udp, bytes),
            icrc::verify(&ip, &udp, bytes),
        );

        let view = Packet::new_checked(bytes);
        let Ok((repr, payload)) = PacketRepr::parse(bytes) else {
            assert!(view.is_err());
            let _ = view.map_err(|e| e.to_string());
            return false;
        };
        let view = view.unwrap();
        let info = repr.check_headers().unwrap();
        let pad = usize::from(repr.bth.pad_count);
        assert_eq!(
            info.header_len() + payload.len() + pad + ICRC_LEN,
            bytes.len()
        );
        assert_eq!(pad, pad_len(payload.len()));
        assert_eq!(view.payload(), payload);
        let _ = (view.to_string(), repr.to_string(), view.icrc());

        let mut expected = bytes.to_vec();
        expected[4] &= 0xC0;
        expected[8] &= 0x80;
        if repr.deth.is_some() {
            expected[bth::HEADER_LEN + 4] = 0;
        }
        if repr.feth.is_some() {
            // FETH bits 31..6 are reserved: written as zero.
            expected[bth::HEADER_LEN..bth::HEADER_LEN + 3].fill(0);
            expected[bth::HEADER_LEN + 3] &= 0x3F;
        }
        let payload_end = bytes.len() - ICRC_LEN - pad;
        expected[payload_end..].fill(0);
        let mut out = vec![0u8; repr.buffer_len(payload.len())];
        assert_eq!(repr.emit(payload, &mut out), Ok(bytes.len()));
        assert_eq!(out, expected, "{repr}");
        true
    }

    // STYLE habit 7 / reference §6 item 1: parsing never panics, on 200k random buffers of
    // random lengths 0..200 and 100k mutations of valid packets (seeded, replayable).
    #[test]
    fn parse_never_panics_on_random_or_mutated_bytes() {
        const SEED: u64 = 0x5eed_f00d_b17e;
        let mut rng = ChaCha8Rng::seed_from_u64(SEED);
        let opcodes = supported_opcodes();
        let mut parsed = 0usize;
        for _ in 0..200_000 {
            let len = rng.gen_range(0..200);
            let mut bytes: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            // Steer half the buffers past the first checks so the deeper paths run too.
            if len >= 2 && rng.gen_bool(0.5) {
                bytes[0] = opcodes[rng.gen_range(0..opcodes.len())].0;
                bytes[1] &= 0xF0;
                if rng.gen_bool(0.5) {
                    let body = if Opcode(bytes[0]).info().unwrap().has_payload {
                        4 * rng.gen_range(0..8)
                    } else {
                        0
                    };
                    let want = Opcode(bytes[0]).info().unwrap().header_len() + body + ICRC_LEN;
                    bytes.resize(want, 0x3C);
                    bytes[1] &= if body == 0 { 0xC0 } else { 0xF0 };
                }
            }
            parsed += usize::from(exercise_every_parser(&bytes));
        }
        assert!(
            parsed > 20_000,
            "only {parsed} random buffers parsed (seed {SEED:#x})"
        );

        let mut parsed = 0usize;
        for _ in 0..100_000 {
            let (_, _, mut bytes) = random_valid_packet(&mut rng);
            match rng.gen_range(0..4) {
                0 => {
                    for _ in 0..rng.gen_range(1..4) {
                        let at = rng.gen_range(0..bytes.len());
                        bytes[at] ^= 1 << rng.gen_range(0..8);
                    }
                }
                1 => {
                    let at = rng.gen_range(0..bytes.len());
                    bytes[at] = rng.gen();
                }
                2 => bytes.truncate(rng.gen_range(0..bytes.len())),
                _ => bytes.extend((0..rng.gen_range(1..9)).map(|_| rng.gen::<u8>())),
            }
            parsed += usize::from(exercise_every_parser(&bytes));
        }
        assert!(
            parsed > 10_000,
            "only {parsed} mutated packets parsed (seed {SEED:#x})"
        );
    }
}
