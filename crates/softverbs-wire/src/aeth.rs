//! ACK Extended Transport Header (AETH), 4 bytes, and its syndrome.
//!
//! Layout (reference §1.3, IBTA vol. 1 §9.3.5): Syndrome (8) · MSN (24), big-endian.
//! Carried by ACKNOWLEDGE, ATOMIC ACKNOWLEDGE and READ RESPONSE FIRST / LAST / ONLY.
//!
//! The syndrome byte (reference §1.4, IBTA vol. 1 §9.7.5.2): bit 7 reserved, bits 6..5
//! type (00 ACK, 01 RNR NAK, 10 reserved, 11 NAK), bits 4..0 a credit count code, an RNR
//! timer code or a NAK code. [`AethSyndrome::decode`] is total: the reserved type and a set
//! bit 7 decode to [`AethSyndrome::Reserved`], so a peer's odd syndrome reaches the engine
//! (which treats it as `rxe` does: a remote operational error) instead of vanishing as a
//! parse error. [`credit_count`] and [`rnr_timer_micros`] hold the two code tables.
//!
//! Holds the checked view [`Header`], the parsed form [`AethRepr`], [`AethSyndrome`] and
//! [`NakCode`].
//!
//! No-panic contract: [`Header::new_checked`], [`Header::check_len`] and [`AethRepr::parse`]
//! never panic, whatever the bytes (every syndrome byte decodes). Getters and setters never
//! panic on a view that passed [`Header::check_len`]; on a [`Header::new_unchecked`] view
//! over fewer than [`HEADER_LEN`] bytes they panic.

use core::fmt;

use crate::be::{header_view, read_u24, write_u24};
use crate::psn::MASK_24;
use crate::WireError;

mod field {
    use core::ops::Range;

    /// Syndrome byte.
    pub const SYNDROME: usize = 0;
    /// Message sequence number.
    pub const MSN: Range<usize> = 1..4;
}

/// Length of the AETH in bytes.
pub const HEADER_LEN: usize = 4;

const TYPE_MASK: u8 = 0xE0;
const VALUE_MASK: u8 = 0x1F;
const TYPE_ACK: u8 = 0x00;
const TYPE_RNR_NAK: u8 = 0x20;
const TYPE_NAK: u8 = 0x60;

/// The credit count code meaning "invalid": no end-to-end flow control (reference §1.4).
pub const CREDITS_INVALID: u8 = 0x1F;

/// Credit count code → number of credits (reference §1.4, Linux `rdmavt` `credit_table`);
/// `None` for code 31 ("invalid", no end-to-end flow control) and codes above 31.
pub const fn credit_count(code: u8) -> Option<u32> {
    const TABLE: [u32; 31] = [
        0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
        2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
    ];
    if (code as usize) < TABLE.len() {
        Some(TABLE[code as usize])
    } else {
        None
    }
}

/// RNR timer code (low 5 bits) → minimum wait in microseconds (reference §1.4; IBTA vol. 1
/// table 45). Code 0 is the longest wait, 655.36 ms; code 25 is 61 440 µs (`rxe`'s table
/// has 61 410, a typo we do not copy). Bits above the low 5 are ignored.
pub const fn rnr_timer_micros(code: u8) -> u32 {
    const TABLE: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    TABLE[(code & VALUE_MASK) as usize]
}

/// The code of a NAK (syndrome type 11, low 5 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0: PSN sequence error (syndrome 0x60); implicitly ACKs the PSNs before it.
    PsnSequenceError,
    /// 1: invalid request (0x61).
    InvalidRequest,
    /// 2: remote access error (0x62).
    RemoteAccessError,
    /// 3: remote operational error (0x63).
    RemoteOperationalError,
    /// 4: invalid RD request (0x64, RD only).
    InvalidRdRequest,
    /// A reserved code, 5..=31 (only the low 5 bits are encoded).
    Unknown(u8),
}

impl NakCode {
    /// The NAK code for the low 5 bits of `value`.
    pub const fn from_value(value: u8) -> NakCode {
        match value & VALUE_MASK {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            other => NakCode::Unknown(other),
        }
    }

    /// The 5-bit code (`Unknown` values are masked to 5 bits).
    pub const fn value(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Unknown(value) => value & VALUE_MASK,
        }
    }
}

impl fmt::Display for NakCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NakCode::PsnSequenceError => f.write_str("PSN SEQUENCE ERROR"),
            NakCode::InvalidRequest => f.write_str("INVALID REQUEST"),
            NakCode::RemoteAccessError => f.write_str("REMOTE ACCESS ERROR"),
            NakCode::RemoteOperationalError => f.write_str("REMOTE OPERATIONAL ERROR"),
            NakCode::InvalidRdRequest => f.write_str("INVALID RD REQUEST"),
            NakCode::Unknown(value) => write!(f, "RESERVED CODE {value}"),
        }
    }
}

/// The decoded AETH syndrome byte (reference §1.4).
///
/// [`AethSyndrome::decode`] followed by [`AethSyndrome::encode`] gives back every byte.
/// The other way round holds for values that `decode` can produce: out-of-range codes in a
/// hand-made value are masked to 5 bits by `encode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AethSyndrome {
    /// Positive acknowledgement (0x00–0x1F) with a 5-bit credit count code; see
    /// [`credit_count`]. [`CREDITS_INVALID`] (31) means no end-to-end flow control.
    Ack {
        /// Credit count code, 0..=31.
        credits: u8,
    },
    /// Receiver not ready (0x20–0x3F) with a 5-bit RNR timer code; see
    /// [`rnr_timer_micros`].
    RnrNak {
        /// RNR timer code, 0..=31 (the responder's `min_rnr_timer`).
        timer: u8,
    },
    /// Negative acknowledgement (0x60–0x7F).
    Nak(NakCode),
    /// A reserved syndrome: type 10 (0x40–0x5F) or bit 7 set (0x80–0xFF). Holds the whole
    /// byte.
    Reserved(u8),
}

impl AethSyndrome {
    /// ACK without end-to-end credits (0x1F), what `rxe` and this device always send.
    pub const ACK: AethSyndrome = AethSyndrome::Ack {
        credits: CREDITS_INVALID,
    };

    /// Decodes a syndrome byte; every byte decodes.
    #[inline]
    pub const fn decode(byte: u8) -> AethSyndrome {
        let value = byte & VALUE_MASK;
        match byte & TYPE_MASK {
            TYPE_ACK => AethSyndrome::Ack { credits: value },
            TYPE_RNR_NAK => AethSyndrome::RnrNak { timer: value },
            TYPE_NAK => AethSyndrome::Nak(NakCode::from_value(value)),
            _ => AethSyndrome::Reserved(byte),
        }
    }

    /// Encodes the syndrome byte (codes masked to 5 bits; `Reserved` written as held).
    #[inline]
    pub const fn encode(self) -> u8 {
        match self {
            AethSyndrome::Ack { credits } => TYPE_ACK | (credits & VALUE_MASK),
            AethSyndrome::RnrNak { timer } => TYPE_RNR_NAK | (timer & VALUE_MASK),
            AethSyndrome::Nak(code) => TYPE_NAK | code.value(),
            AethSyndrome::Reserved(byte) => byte,
        }
    }

    /// True for a positive acknowledgement.
    #[inline]
    pub const fn is_ack(self) -> bool {
        matches!(self, AethSyndrome::Ack { .. })
    }

    /// True for an RNR NAK or a NAK.
    #[inline]
    pub const fn is_nak(self) -> bool {
        matches!(self, AethSyndrome::RnrNak { .. } | AethSyndrome::Nak(_))
    }
}

impl From<u8> for AethSyndrome {
    fn from(byte: u8) -> AethSyndrome {
        AethSyndrome::decode(byte)
    }
}

impl From<AethSyndrome> for u8 {
    fn from(syndrome: AethSyndrome) -> u8 {
        syndrome.encode()
    }
}

/// Prints `ACK credits=12`, `ACK credits=invalid`, `RNR NAK timer=12 (640us)`,
/// `NAK PSN SEQUENCE ERROR` or `RESERVED(0x45)`.
impl fmt::Display for AethSyndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            AethSyndrome::Ack { credits } => match credit_count(credits & VALUE_MASK) {
                Some(count) => write!(f, "ACK credits={count}"),
                None => f.write_str("ACK credits=invalid"),
            },
            AethSyndrome::RnrNak { timer } => {
                write!(
                    f,
                    "RNR NAK timer={} ({}us)",
                    timer & VALUE_MASK,
                    rnr_timer_micros(timer)
                )
            }
            AethSyndrome::Nak(code) => write!(f, "NAK {code}"),
            AethSyndrome::Reserved(byte) => write!(f, "RESERVED({byte:#04x})"),
        }
    }
}

header_view!("AETH", AethRepr);

impl<T: AsRef<[u8]>> Header<T> {
    /// The raw syndrome byte.
    #[inline]
    pub fn syndrome_byte(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }

    /// The decoded syndrome.
    #[inline]
    pub fn syndrome(&self) -> AethSyndrome {
        AethSyndrome::decode(self.syndrome_byte())
    }

    /// MSN, the responder's 24-bit message sequence number.
    #[inline]
    pub fn msn(&self) -> u32 {
        read_u24(self.buffer.as_ref(), field::MSN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Sets the syndrome.
    #[inline]
    pub fn set_syndrome(&mut self, value: AethSyndrome) {
        self.buffer.as_mut()[field::SYNDROME] = value.encode();
    }

    /// Sets the MSN to the low 24 bits of `value`.
    #[inline]
    pub fn set_msn(&mut self, value: u32) {
        write_u24(self.buffer.as_mut(), field::MSN, value & MASK_24);
    }
}

/// The parsed AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AethRepr {
    /// The syndrome: ACK, RNR NAK, NAK or reserved.
    pub syndrome: AethSyndrome,
    /// Message sequence number, 24 bits (higher bits are dropped by `emit`).
    pub msn: u32,
}

/// `AethSyndrome::ACK` (0x1F) with MSN 0.
impl Default for AethRepr {
    fn default() -> AethRepr {
        AethRepr {
            syndrome: AethSyndrome::ACK,
            msn: 0,
        }
    }
}

impl AethRepr {
    /// Length of the AETH in bytes.
    pub const HEADER_LEN: usize = HEADER_LEN;

    /// Parses an AETH; fails only with `Truncated`.
    pub fn parse<T: AsRef<[u8]>>(header: &Header<T>) -> Result<AethRepr, WireError> {
        header.check_len()?;
        Ok(AethRepr {
            syndrome: header.syndrome(),
            msn: header.msn(),
        })
    }

    /// Bytes [`AethRepr::emit`] writes: [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the AETH. Panics if the view is shorter than [`HEADER_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut Header<T>) {
        header.set_syndrome(self.syndrome);
        header.set_msn(self.msn);
    }
}

/// Prints like `AETH syndrome=0x1f ACK credits=invalid msn=1`.
impl fmt::Display for AethRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "AETH syndrome={:#04x} {} msn={}",
            self.syndrome.encode(),
            self.syndrome,
            self.msn & MASK_24
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Reference §1.8 vector A, RC ACKNOWLEDGE from ConnectX: AETH 00 000001 = ACK, credit
    // code 0, MSN 1.
    static HARDWARE_ACK: [u8; 4] = [0x00, 0x00, 0x00, 0x01];

    // Reference §1.3: Syndrome (8) · MSN (24).
    #[test]
    fn deconstruct_aeth_of_hardware_ack() {
        let header = Header::new_checked(&HARDWARE_ACK[..]).unwrap();
        assert_eq!(header.syndrome_byte(), 0);
        assert_eq!(header.syndrome(), AethSyndrome::Ack { credits: 0 });
        assert_eq!(header.msn(), 1);
    }

    #[test]
    fn construct_aeth_with_setters() {
        let mut bytes = [0xA5u8; 4];
        let mut header = Header::new_unchecked(&mut bytes[..]);
        header.set_syndrome(AethSyndrome::RnrNak { timer: 12 });
        header.set_msn(0x0123_4567);
        assert_eq!(bytes, [0x2C, 0x23, 0x45, 0x67]);
    }

    #[test]
    fn parse_and_emit_aeth_round_trip() {
        let repr = AethRepr::parse(&Header::new_checked(&HARDWARE_ACK[..]).unwrap()).unwrap();
        assert_eq!(
            repr,
            AethRepr {
                syndrome: AethSyndrome::Ack { credits: 0 },
                msn: 1
            }
        );
        let mut bytes = [0xFFu8; 4];
        repr.emit(&mut Header::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, HARDWARE_ACK);
        assert_eq!(repr.buffer_len(), 4);
        let rxe_ack = AethRepr {
            syndrome: AethSyndrome::ACK,
            msn: 7,
        };
        rxe_ack.emit(&mut Header::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, [0x1F, 0, 0, 7]);
    }

    // Reference §1.4: the syndrome classes and NAK codes 0x60..=0x64.
    #[test]
    fn syndrome_decodes_every_class() {
        assert_eq!(AethSyndrome::decode(0x1F), AethSyndrome::ACK);
        assert_eq!(AethSyndrome::decode(0x07), AethSyndrome::Ack { credits: 7 });
        assert_eq!(
            AethSyndrome::decode(0x20),
            AethSyndrome::RnrNak { timer: 0 }
        );
        assert_eq!(
            AethSyndrome::decode(0x2C),
            AethSyndrome::RnrNak { timer: 12 }
        );
        assert_eq!(
            AethSyndrome::decode(0x60),
            AethSyndrome::Nak(NakCode::PsnSequenceError)
        );
        assert_eq!(
            AethSyndrome::decode(0x61),
            AethSyndrome::Nak(NakCode::InvalidRequest)
        );
        assert_eq!(
            AethSyndrome::decode(0x62),
            AethSyndrome::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(
            AethSyndrome::decode(0x63),
            AethSyndrome::Nak(NakCode::RemoteOperationalError)
        );
        assert_eq!(
            AethSyndrome::decode(0x64),
            AethSyndrome::Nak(NakCode::InvalidRdRequest)
        );
        assert_eq!(
            AethSyndrome::decode(0x65),
            AethSyndrome::Nak(NakCode::Unknown(5))
        );
        assert_eq!(AethSyndrome::decode(0x40), AethSyndrome::Reserved(0x40));
        assert_eq!(AethSyndrome::decode(0x9F), AethSyndrome::Reserved(0x9F));
        assert!(AethSyndrome::ACK.is_ack() && !AethSyndrome::ACK.is_nak());
        assert!(AethSyndrome::decode(0x2C).is_nak() && AethSyndrome::decode(0x61).is_nak());
        assert!(!AethSyndrome::Reserved(0x40).is_ack() && !AethSyndrome::Reserved(0x40).is_nak());
    }

    #[test]
    fn syndrome_encode_inverts_decode_for_every_byte() {
        for byte in 0..=u8::MAX {
            assert_eq!(
                AethSyndrome::decode(byte).encode(),
                byte,
                "byte {byte:#04x}"
            );
            assert_eq!(u8::from(AethSyndrome::from(byte)), byte);
        }
        assert_eq!(AethSyndrome::Ack { credits: 0xFF }.encode(), 0x1F);
        assert_eq!(AethSyndrome::Nak(NakCode::Unknown(0x25)).encode(), 0x65);
    }

    // Reference §1.4: RNR timer code → minimum wait, including code 0 = 655.36 ms and code
    // 25 = 61.44 ms (not rxe's 61410 µs).
    #[test]
    fn rnr_timer_table_matches_reference() {
        let reference_ms = [
            655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48, 0.64, 0.96,
            1.28, 1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72, 40.96, 61.44, 81.92,
            122.88, 163.84, 245.76, 327.68, 491.52,
        ];
        for (code, ms) in reference_ms.iter().enumerate() {
            let micros = (ms * 1000.0_f64).round() as u32;
            assert_eq!(rnr_timer_micros(code as u8), micros, "code {code}");
        }
        assert_eq!(rnr_timer_micros(25), 61_440);
        assert_eq!(rnr_timer_micros(0x20 | 12), 640);
    }

    // Reference §1.4: credit count code table (rdmavt credit_table); 31 = invalid.
    #[test]
    fn credit_table_matches_reference() {
        let reference = [
            0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
            1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
        ];
        for (code, credits) in reference.iter().enumerate() {
            assert_eq!(credit_count(code as u8), Some(*credits));
        }
        assert_eq!(credit_count(CREDITS_INVALID), None);
        assert_eq!(credit_count(200), None);
    }

    #[test]
    fn short_aeth_is_truncated() {
        assert_eq!(
            Header::new_checked(&HARDWARE_ACK[..3]).err(),
            Some(WireError::Truncated)
        );
    }

    #[test]
    fn display_aeth() {
        let ack = AethRepr {
            syndrome: AethSyndrome::ACK,
            msn: 1,
        };
        assert_eq!(
            ack.to_string(),
            "AETH syndrome=0x1f ACK credits=invalid msn=1"
        );
        let rnr = AethRepr {
            syndrome: AethSyndrome::RnrNak { timer: 12 },
            msn: 2,
        };
        assert_eq!(
            rnr.to_string(),
            "AETH syndrome=0x2c RNR NAK timer=12 (640us) msn=2"
        );
        let nak = AethRepr {
            syndrome: AethSyndrome::Nak(NakCode::PsnSequenceError),
            msn: 3,
        };
        assert_eq!(
            nak.to_string(),
            "AETH syndrome=0x60 NAK PSN SEQUENCE ERROR msn=3"
        );
        assert_eq!(
            AethSyndrome::Ack { credits: 7 }.to_string(),
            "ACK credits=12"
        );
        assert_eq!(AethSyndrome::Reserved(0x45).to_string(), "RESERVED(0x45)");
        assert_eq!(NakCode::Unknown(9).to_string(), "RESERVED CODE 9");
    }
}
