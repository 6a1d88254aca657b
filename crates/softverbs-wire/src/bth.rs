//! Base Transport Header (BTH), 12 bytes, the first header of every RoCEv2 UDP payload.
//!
//! Layout (reference §1.2, IBTA vol. 1 §9.2), big-endian:
//!
//! ```text
//!  byte 0      1                 2..3    4              5..7     8             9..11
//!  OpCode | SE M PadCnt(2) TVer(4) | P_Key | F B resv6 | DestQP | A resv7 | PSN
//! ```
//!
//! Holds the checked view [`Header`] and the parsed form [`BthRepr`].
//!
//! No-panic contract: [`Header::new_checked`], [`Header::check_len`] and [`BthRepr::parse`]
//! never panic, whatever the bytes. Getters and setters never panic on a view that passed
//! [`Header::check_len`]; on a view made with [`Header::new_unchecked`] over fewer than
//! [`HEADER_LEN`] bytes they panic (a caller bug, never a property of received data).
//! [`BthRepr::parse`] accepts any opcode (so CNPs and unknown opcodes can be counted) and
//! rejects only a transport version other than 0; reserved bits are ignored on receive and
//! written as zero.

use core::fmt;

use crate::be::{header_view, read_u16, read_u24, write_u16, write_u24};
use crate::{Opcode, Psn, Qpn, WireError};

mod field {
    use core::ops::Range;

    /// OpCode.
    pub const OPCODE: usize = 0;
    /// SE (bit 7), M (bit 6), PadCnt (bits 5..4), TVer (bits 3..0).
    pub const FLAGS: usize = 1;
    /// P_Key.
    pub const PKEY: Range<usize> = 2..4;
    /// F (bit 7), B (bit 6), 6 reserved bits.
    pub const CONGESTION: usize = 4;
    /// Destination QP.
    pub const DEST_QP: Range<usize> = 5..8;
    /// A (bit 7), 7 reserved bits.
    pub const ACK_REQ: usize = 8;
    /// PSN.
    pub const PSN: Range<usize> = 9..12;
}

/// Length of the BTH in bytes.
pub const HEADER_LEN: usize = 12;

const SE: u8 = 0x80;
const MIG_REQ: u8 = 0x40;
const PAD_SHIFT: u32 = 4;
const PAD_MASK: u8 = 0x30;
const TVER_MASK: u8 = 0x0F;
const FECN: u8 = 0x80;
const BECN: u8 = 0x40;
const ACK_REQ: u8 = 0x80;

/// The default P_Key (full member of the default partition), which `rxe` always sends.
pub const DEFAULT_PKEY: u16 = 0xFFFF;

header_view!("BTH", BthRepr);

impl<T: AsRef<[u8]>> Header<T> {
    /// OpCode (byte 0).
    pub fn opcode(&self) -> Opcode {
        Opcode(self.buffer.as_ref()[field::OPCODE])
    }

    /// SE, the solicited-event bit.
    pub fn solicited(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & SE != 0
    }

    /// M, the migration-request bit (ignored on receive).
    pub fn mig_req(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & MIG_REQ != 0
    }

    /// PadCnt, 0..=3.
    pub fn pad_count(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] & PAD_MASK) >> PAD_SHIFT
    }

    /// TVer, the transport header version (must be 0).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & TVER_MASK
    }

    /// P_Key.
    pub fn pkey(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::PKEY)
    }

    /// F, forward explicit congestion notification (not covered by the ICRC).
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::CONGESTION] & FECN != 0
    }

    /// B, backward explicit congestion notification (not covered by the ICRC).
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::CONGESTION] & BECN != 0
    }

    /// The 6 reserved bits of byte 4.
    pub fn reserved_a(&self) -> u8 {
        self.buffer.as_ref()[field::CONGESTION] & 0x3F
    }

    /// Destination QP.
    pub fn dest_qp(&self) -> Qpn {
        Qpn::new(read_u24(self.buffer.as_ref(), field::DEST_QP))
    }

    /// A, the acknowledge-request bit.
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::ACK_REQ] & ACK_REQ != 0
    }

    /// The 7 reserved bits of byte 8 (covered by the ICRC).
    pub fn reserved_b(&self) -> u8 {
        self.buffer.as_ref()[field::ACK_REQ] & 0x7F
    }

    /// PSN.
    pub fn psn(&self) -> Psn {
        Psn::new(read_u24(self.buffer.as_ref(), field::PSN))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    fn set_bit(&mut self, index: usize, mask: u8, value: bool) {
        let byte = &mut self.buffer.as_mut()[index];
        if value {
            *byte |= mask;
        } else {
            *byte &= !mask;
        }
    }

    /// Sets OpCode.
    pub fn set_opcode(&mut self, opcode: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = opcode.0;
    }

    /// Sets SE.
    pub fn set_solicited(&mut self, value: bool) {
        self.set_bit(field::FLAGS, SE, value);
    }

    /// Sets M.
    pub fn set_mig_req(&mut self, value: bool) {
        self.set_bit(field::FLAGS, MIG_REQ, value);
    }

    /// Sets PadCnt to the low 2 bits of `value`.
    pub fn set_pad_count(&mut self, value: u8) {
        let byte = &mut self.buffer.as_mut()[field::FLAGS];
        *byte = (*byte & !PAD_MASK) | ((value << PAD_SHIFT) & PAD_MASK);
    }

    /// Sets TVer to the low 4 bits of `value`.
    pub fn set_version(&mut self, value: u8) {
        let byte = &mut self.buffer.as_mut()[field::FLAGS];
        *byte = (*byte & !TVER_MASK) | (value & TVER_MASK);
    }

    /// Sets P_Key.
    pub fn set_pkey(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::PKEY, value);
    }

    /// Sets F.
    pub fn set_fecn(&mut self, value: bool) {
        self.set_bit(field::CONGESTION, FECN, value);
    }

    /// Sets B.
    pub fn set_becn(&mut self, value: bool) {
        self.set_bit(field::CONGESTION, BECN, value);
    }

    /// Sets the destination QP.
    pub fn set_dest_qp(&mut self, value: Qpn) {
        write_u24(self.buffer.as_mut(), field::DEST_QP, value.value());
    }

    /// Sets A.
    pub fn set_ack_req(&mut self, value: bool) {
        self.set_bit(field::ACK_REQ, ACK_REQ, value);
    }

    /// Sets the PSN.
    pub fn set_psn(&mut self, value: Psn) {
        write_u24(self.buffer.as_mut(), field::PSN, value.value());
    }

    /// Clears both reserved fields (bytes 4 and 8 below their flag bits).
    pub fn clear_reserved(&mut self) {
        let data = self.buffer.as_mut();
        data[field::CONGESTION] &= FECN | BECN;
        data[field::ACK_REQ] &= ACK_REQ;
    }
}

/// The parsed BTH. The transport version is always 0 and is not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// OpCode; any value (see [`Opcode::info`]).
    pub opcode: Opcode,
    /// SE: solicited event, set on the last packet of a SEND or RDMA WRITE with immediate
    /// whose WR asked for it.
    pub solicited: bool,
    /// M: migration request (APM). `rxe` sends 0, ConnectX 1; ignore on receive.
    pub mig_req: bool,
    /// PadCnt, 0..=3. [`PacketRepr::emit`](crate::PacketRepr::emit) derives it from the
    /// payload length and ignores this value; [`BthRepr::emit`] writes it as given.
    pub pad_count: u8,
    /// P_Key ([`DEFAULT_PKEY`] = 0xFFFF on RoCE).
    pub pkey: u16,
    /// F: forward ECN mark.
    pub fecn: bool,
    /// B: backward ECN mark.
    pub becn: bool,
    /// Destination QP.
    pub dest_qp: Qpn,
    /// A: acknowledge request.
    pub ack_req: bool,
    /// PSN.
    pub psn: Psn,
}

/// All bits clear, except `pkey` = [`DEFAULT_PKEY`].
impl Default for BthRepr {
    fn default() -> BthRepr {
        BthRepr {
            opcode: Opcode(0),
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: Qpn::new(0),
            ack_req: false,
            psn: Psn::new(0),
        }
    }
}

impl BthRepr {
    /// Length of the BTH in bytes.
    pub const HEADER_LEN: usize = HEADER_LEN;

    /// Parses a BTH. Fails with `Truncated` on a short buffer and `BadVersion` if TVer is
    /// not 0; accepts every opcode and ignores the reserved bits.
    pub fn parse<T: AsRef<[u8]>>(header: &Header<T>) -> Result<BthRepr, WireError> {
        header.check_len()?;
        if header.version() != 0 {
            return Err(WireError::BadVersion);
        }
        Ok(BthRepr {
            opcode: header.opcode(),
            solicited: header.solicited(),
            mig_req: header.mig_req(),
            pad_count: header.pad_count(),
            pkey: header.pkey(),
            fecn: header.fecn(),
            becn: header.becn(),
            dest_qp: header.dest_qp(),
            ack_req: header.ack_req(),
            psn: header.psn(),
        })
    }

    /// Bytes [`BthRepr::emit`] writes: [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes every BTH byte: the fields, TVer 0, reserved bits 0; `pad_count` is masked to
    /// 2 bits. Panics if the view is shorter than [`HEADER_LEN`] (see the module contract).
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut Header<T>) {
        // The twelve bytes at once, as the setters would leave them from zero.
        let bit = |value: bool, mask: u8| if value { mask } else { 0 };
        let mut bytes = [0u8; HEADER_LEN];
        bytes[field::OPCODE] = self.opcode.0;
        bytes[field::FLAGS] = bit(self.solicited, SE)
            | bit(self.mig_req, MIG_REQ)
            | ((self.pad_count << PAD_SHIFT) & PAD_MASK);
        write_u16(&mut bytes, field::PKEY, self.pkey);
        bytes[field::CONGESTION] = bit(self.fecn, FECN) | bit(self.becn, BECN);
        write_u24(&mut bytes, field::DEST_QP, self.dest_qp.value());
        bytes[field::ACK_REQ] = bit(self.ack_req, ACK_REQ);
        write_u24(&mut bytes, field::PSN, self.psn.value());
        header.buffer.as_mut()[..HEADER_LEN].copy_from_slice(&bytes);
    }
}

/// Prints like `BTH opcode=RC SEND ONLY dqpn=0x000011 psn=42 se ackreq pad=0`; flags
/// appear only when set, and the P_Key only when it is not the default 0xFFFF.
impl fmt::Display for BthRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "BTH opcode={} dqpn={} psn={}",
            self.opcode, self.dest_qp, self.psn
        )?;
        for (set, name) in [
            (self.solicited, " se"),
            (self.mig_req, " migreq"),
            (self.fecn, " fecn"),
            (self.becn, " becn"),
            (self.ack_req, " ackreq"),
        ] {
            if set {
                f.write_str(name)?;
            }
        }
        write!(f, " pad={}", self.pad_count)?;
        if self.pkey != DEFAULT_PKEY {
            write!(f, " pkey={:#06x}", self.pkey)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Reference §1.8 vector A, RC SEND ONLY: BTH bytes of a ConnectX capture.
    // opcode 0x04, M=1, PadCnt 0, P_Key 0xFFFF, DestQP 0x169, A=1, PSN 0x6af7e4.
    static SEND_ONLY_BYTES: [u8; 12] = [
        0x04, 0x40, 0xff, 0xff, 0x00, 0x00, 0x01, 0x69, 0x80, 0x6a, 0xf7, 0xe4,
    ];

    fn send_only_repr() -> BthRepr {
        BthRepr {
            opcode: Opcode::RC_SEND_ONLY,
            solicited: false,
            mig_req: true,
            pad_count: 0,
            pkey: 0xFFFF,
            fecn: false,
            becn: false,
            dest_qp: Qpn::new(0x169),
            ack_req: true,
            psn: Psn::new(0x6a_f7e4),
        }
    }

    // Reference §1.2: field positions of the BTH.
    #[test]
    fn deconstruct_bth_of_hardware_send_only() {
        let header = Header::new_checked(&SEND_ONLY_BYTES[..]).unwrap();
        assert_eq!(header.opcode(), Opcode::RC_SEND_ONLY);
        assert!(!header.solicited());
        assert!(header.mig_req());
        assert_eq!(header.pad_count(), 0);
        assert_eq!(header.version(), 0);
        assert_eq!(header.pkey(), 0xFFFF);
        assert!(!header.fecn() && !header.becn());
        assert_eq!(header.reserved_a(), 0);
        assert_eq!(header.dest_qp(), Qpn::new(0x169));
        assert!(header.ack_req());
        assert_eq!(header.reserved_b(), 0);
        assert_eq!(header.psn(), Psn::new(0x6a_f7e4));
    }

    #[test]
    fn construct_bth_with_setters() {
        let mut bytes = [0xA5u8; 12];
        let mut header = Header::new_unchecked(&mut bytes[..]);
        header.set_opcode(Opcode::RC_SEND_ONLY);
        header.set_solicited(false);
        header.set_mig_req(true);
        header.set_pad_count(0);
        header.set_version(0);
        header.set_pkey(0xFFFF);
        header.set_fecn(false);
        header.set_becn(false);
        header.clear_reserved();
        header.set_dest_qp(Qpn::new(0x169));
        header.set_ack_req(true);
        header.set_psn(Psn::new(0x6a_f7e4));
        assert_eq!(bytes, SEND_ONLY_BYTES);
    }

    #[test]
    fn parse_bth_of_hardware_send_only() {
        let header = Header::new_checked(&SEND_ONLY_BYTES[..]).unwrap();
        assert_eq!(BthRepr::parse(&header), Ok(send_only_repr()));
    }

    #[test]
    fn emit_bth_overwrites_every_byte() {
        let mut bytes = [0xFFu8; 12];
        let repr = send_only_repr();
        repr.emit(&mut Header::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, SEND_ONLY_BYTES);
        assert_eq!(repr.buffer_len(), 12);
    }

    // Reference §1.2: TVer must be 0; rxe drops other versions.
    #[test]
    fn parse_rejects_nonzero_transport_version() {
        let mut bytes = SEND_ONLY_BYTES;
        bytes[1] |= 0x01;
        let header = Header::new_checked(&bytes[..]).unwrap();
        assert_eq!(BthRepr::parse(&header), Err(WireError::BadVersion));
    }

    // Reference §1.2: reserved bits are transmitted as 0 and ignored on receive; F and B
    // are congestion marks (vector B: CNP with B=1).
    #[test]
    fn parse_ignores_reserved_bits_and_reads_congestion_marks() {
        let mut bytes = SEND_ONLY_BYTES;
        bytes[4] = 0xFF;
        bytes[8] = 0x7F;
        let repr = BthRepr::parse(&Header::new_checked(&bytes[..]).unwrap()).unwrap();
        assert!(repr.fecn && repr.becn && !repr.ack_req);
        let mut out = [0u8; 12];
        repr.emit(&mut Header::new_unchecked(&mut out[..]));
        assert_eq!(out[4], 0xC0);
        assert_eq!(out[8], 0x00);
    }

    #[test]
    fn short_buffer_is_truncated_not_a_panic() {
        for len in 0..HEADER_LEN {
            assert_eq!(
                Header::new_checked(&SEND_ONLY_BYTES[..len]).err(),
                Some(WireError::Truncated)
            );
        }
    }

    #[test]
    fn display_prints_like_tshark() {
        let repr = BthRepr {
            opcode: Opcode::RC_SEND_ONLY,
            dest_qp: Qpn::new(0x11),
            psn: Psn::new(42),
            solicited: true,
            ack_req: true,
            ..BthRepr::default()
        };
        assert_eq!(
            repr.to_string(),
            "BTH opcode=RC SEND ONLY dqpn=0x000011 psn=42 se ackreq pad=0"
        );
        let header = Header::new_unchecked(&SEND_ONLY_BYTES[..]);
        assert_eq!(
            header.to_string(),
            "BTH opcode=RC SEND ONLY dqpn=0x000169 psn=7010276 migreq ackreq pad=0"
        );
        let cnp = BthRepr {
            opcode: Opcode::CNP,
            becn: true,
            pkey: 0x8001,
            ..BthRepr::default()
        };
        assert_eq!(
            cnp.to_string(),
            "BTH opcode=CNP dqpn=0x000000 psn=0 becn pad=0 pkey=0x8001"
        );
        assert_eq!(
            Header::new_unchecked(&[0u8; 3][..]).to_string(),
            "BTH (packet truncated)"
        );
    }
}
