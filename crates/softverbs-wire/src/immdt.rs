//! Immediate Data extended transport header (ImmDt), 4 bytes.
//!
//! Layout (reference §1.3, IBTA vol. 1 §9.3.5): 32 opaque bits, carried by SEND and RDMA
//! WRITE LAST / ONLY WITH IMMEDIATE and UD SEND ONLY WITH IMMEDIATE.
//!
//! Byte order: the value is the four wire bytes read big-endian, so `imm.to_be_bytes()` are
//! the wire bytes. libibverbs' `imm_data` (in `ibv_send_wr` and `ibv_wc`) is a `__be32`,
//! i.e. those same bytes in memory order: `wc.imm_data = imm.to_be()` and
//! `imm = u32::from_be(wr.imm_data)`.
//!
//! Holds the checked view [`Header`] and the parsed form [`ImmDtRepr`].
//! [`PacketRepr`](crate::PacketRepr) carries the value directly as `immdt: Option<u32>`.
//!
//! No-panic contract: [`Header::new_checked`], [`Header::check_len`] and [`ImmDtRepr::parse`]
//! never panic, whatever the bytes. Getters and setters never panic on a view that passed
//! [`Header::check_len`]; on a [`Header::new_unchecked`] view over fewer than
//! [`HEADER_LEN`] bytes they panic.

use core::fmt;

use crate::be::{header_view, read_u32, write_u32};
use crate::WireError;

mod field {
    use core::ops::Range;

    /// Immediate data.
    pub const IMM_DATA: Range<usize> = 0..4;
}

/// Length of the ImmDt header in bytes.
pub const HEADER_LEN: usize = 4;

header_view!("ImmDt", ImmDtRepr);

impl<T: AsRef<[u8]>> Header<T> {
    /// The immediate data (wire bytes read big-endian).
    pub fn imm_data(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::IMM_DATA)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Sets the immediate data (written big-endian).
    pub fn set_imm_data(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::IMM_DATA, value);
    }
}

/// The parsed ImmDt header.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImmDtRepr {
    /// The immediate data (wire bytes read big-endian).
    pub imm_data: u32,
}

impl ImmDtRepr {
    /// Length of the ImmDt header in bytes.
    pub const HEADER_LEN: usize = HEADER_LEN;

    /// Parses an ImmDt header; fails only with `Truncated`.
    pub fn parse<T: AsRef<[u8]>>(header: &Header<T>) -> Result<ImmDtRepr, WireError> {
        header.check_len()?;
        Ok(ImmDtRepr {
            imm_data: header.imm_data(),
        })
    }

    /// Bytes [`ImmDtRepr::emit`] writes: [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the ImmDt header. Panics if the view is shorter than [`HEADER_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut Header<T>) {
        header.set_imm_data(self.imm_data);
    }
}

/// Prints like `ImmDt imm=0x12345678`.
impl fmt::Display for ImmDtRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ImmDt imm={:#010x}", self.imm_data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static BYTES: [u8; 4] = [0x12, 0x34, 0x56, 0x78];
    const REPR: ImmDtRepr = ImmDtRepr {
        imm_data: 0x1234_5678,
    };

    // Reference §1.3: 32 opaque bits, big-endian on the wire.
    #[test]
    fn deconstruct_and_construct_immdt() {
        assert_eq!(
            Header::new_checked(&BYTES[..]).unwrap().imm_data(),
            0x1234_5678
        );
        let mut bytes = [0u8; 4];
        Header::new_unchecked(&mut bytes[..]).set_imm_data(0x1234_5678);
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn parse_and_emit_immdt_round_trip() {
        assert_eq!(
            ImmDtRepr::parse(&Header::new_checked(&BYTES[..]).unwrap()),
            Ok(REPR)
        );
        let mut bytes = [0u8; 4];
        REPR.emit(&mut Header::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
        assert_eq!(REPR.buffer_len(), 4);
    }

    // verbs.h: imm_data is __be32, i.e. the wire bytes in memory order.
    #[test]
    fn immdt_value_maps_to_be32_imm_data() {
        let wc_imm_data = REPR.imm_data.to_be();
        assert_eq!(wc_imm_data.to_ne_bytes(), BYTES);
        assert_eq!(u32::from_be(wc_imm_data), REPR.imm_data);
    }

    #[test]
    fn short_immdt_is_truncated_and_displays() {
        assert_eq!(
            Header::new_checked(&BYTES[..3]).err(),
            Some(WireError::Truncated)
        );
        assert_eq!(REPR.to_string(), "ImmDt imm=0x12345678");
    }
}
