//! Datagram Extended Transport Header (DETH), 8 bytes, carried by every UD packet.
//!
//! Layout (reference §1.3, IBTA vol. 1 §9.3.2), big-endian: Q_Key (32) · reserved (8) ·
//! Source QP (24).
//!
//! Holds the checked view [`Header`] and the parsed form [`DethRepr`].
//!
//! No-panic contract: [`Header::new_checked`], [`Header::check_len`] and [`DethRepr::parse`]
//! never panic, whatever the bytes; the reserved byte is ignored on receive and written as
//! zero. Getters and setters never panic on a view that passed [`Header::check_len`]; on a
//! [`Header::new_unchecked`] view over fewer than [`HEADER_LEN`] bytes they panic.

use core::fmt;

use crate::be::{header_view, read_u24, read_u32, write_u24, write_u32};
use crate::{Qpn, WireError};

mod field {
    use core::ops::Range;

    /// Queue key.
    pub const QKEY: Range<usize> = 0..4;
    /// Reserved byte.
    pub const RESERVED: usize = 4;
    /// Source QP.
    pub const SRC_QP: Range<usize> = 5..8;
}

/// Length of the DETH in bytes.
pub const HEADER_LEN: usize = 8;

/// The Q_Key every packet to or from QP1 (GSI) carries (reference §2.2 step 5).
pub const GSI_QKEY: u32 = 0x8001_0000;

header_view!("DETH", DethRepr);

impl<T: AsRef<[u8]>> Header<T> {
    /// Q_Key.
    pub fn qkey(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::QKEY)
    }

    /// The reserved byte.
    pub fn reserved(&self) -> u8 {
        self.buffer.as_ref()[field::RESERVED]
    }

    /// Source QP.
    pub fn src_qp(&self) -> Qpn {
        Qpn::new(read_u24(self.buffer.as_ref(), field::SRC_QP))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Sets the Q_Key.
    pub fn set_qkey(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::QKEY, value);
    }

    /// Sets the reserved byte.
    pub fn set_reserved(&mut self, value: u8) {
        self.buffer.as_mut()[field::RESERVED] = value;
    }

    /// Sets the source QP.
    pub fn set_src_qp(&mut self, value: Qpn) {
        write_u24(self.buffer.as_mut(), field::SRC_QP, value.value());
    }
}

/// The parsed DETH.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DethRepr {
    /// Q_Key the receiving UD QP checks.
    pub qkey: u32,
    /// The sender's QP number.
    pub src_qp: Qpn,
}

impl DethRepr {
    /// Length of the DETH in bytes.
    pub const HEADER_LEN: usize = HEADER_LEN;

    /// Parses a DETH; fails only with `Truncated`. The reserved byte is ignored.
    pub fn parse<T: AsRef<[u8]>>(header: &Header<T>) -> Result<DethRepr, WireError> {
        header.check_len()?;
        Ok(DethRepr {
            qkey: header.qkey(),
            src_qp: header.src_qp(),
        })
    }

    /// Bytes [`DethRepr::emit`] writes: [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the DETH with a zero reserved byte. Panics if the view is shorter than
    /// [`HEADER_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut Header<T>) {
        header.set_qkey(self.qkey);
        header.set_reserved(0);
        header.set_src_qp(self.src_qp);
    }
}

/// Prints like `DETH qkey=0x80010000 sqpn=0x000001`.
impl fmt::Display for DethRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DETH qkey={:#010x} sqpn={}", self.qkey, self.src_qp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A CM MAD to QP1 from QP 0x000123: Q_Key 0x80010000.
    static BYTES: [u8; 8] = [0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x01, 0x23];
    const REPR: DethRepr = DethRepr {
        qkey: GSI_QKEY,
        src_qp: Qpn::new(0x123),
    };

    // Reference §1.3: Q_Key (32) · reserved (8) · Source QP (24).
    #[test]
    fn deconstruct_deth() {
        let header = Header::new_checked(&BYTES[..]).unwrap();
        assert_eq!(header.qkey(), 0x8001_0000);
        assert_eq!(header.reserved(), 0);
        assert_eq!(header.src_qp(), Qpn::new(0x123));
    }

    #[test]
    fn construct_deth_with_setters() {
        let mut bytes = [0xA5u8; 8];
        let mut header = Header::new_unchecked(&mut bytes[..]);
        header.set_qkey(GSI_QKEY);
        header.set_reserved(0);
        header.set_src_qp(Qpn::new(0x123));
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn parse_and_emit_deth_round_trip_and_clear_reserved() {
        let mut received = BYTES;
        received[4] = 0xEE;
        assert_eq!(
            DethRepr::parse(&Header::new_checked(&received[..]).unwrap()),
            Ok(REPR)
        );
        let mut bytes = [0xFFu8; 8];
        REPR.emit(&mut Header::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
        assert_eq!(REPR.buffer_len(), 8);
    }

    #[test]
    fn short_deth_is_truncated_and_displays() {
        assert_eq!(
            Header::new_checked(&BYTES[..7]).err(),
            Some(WireError::Truncated)
        );
        assert_eq!(REPR.to_string(), "DETH qkey=0x80010000 sqpn=0x000123");
    }
}
