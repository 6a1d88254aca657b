//! Invalidate Extended Transport Header (IETH), 4 bytes.
//!
//! Layout (reference §1.3, IBTA vol. 1 §9.3.6): the R_Key (32, big-endian) the responder
//! must invalidate; carried by RC SEND LAST / ONLY WITH INVALIDATE.
//!
//! Holds the checked view [`Header`] and the parsed form [`IethRepr`].
//! [`PacketRepr`](crate::PacketRepr) carries the key directly as `ieth: Option<u32>`.
//!
//! No-panic contract: [`Header::new_checked`], [`Header::check_len`] and [`IethRepr::parse`]
//! never panic, whatever the bytes. Getters and setters never panic on a view that passed
//! [`Header::check_len`]; on a [`Header::new_unchecked`] view over fewer than
//! [`HEADER_LEN`] bytes they panic.

use core::fmt;

use crate::be::{header_view, read_u32, write_u32};
use crate::WireError;

mod field {
    use core::ops::Range;

    /// R_Key to invalidate.
    pub const RKEY: Range<usize> = 0..4;
}

/// Length of the IETH in bytes.
pub const HEADER_LEN: usize = 4;

header_view!("IETH", IethRepr);

impl<T: AsRef<[u8]>> Header<T> {
    /// The R_Key to invalidate.
    pub fn rkey(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::RKEY)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Sets the R_Key to invalidate.
    pub fn set_rkey(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::RKEY, value);
    }
}

/// The parsed IETH.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IethRepr {
    /// The R_Key to invalidate at the responder.
    pub rkey: u32,
}

impl IethRepr {
    /// Length of the IETH in bytes.
    pub const HEADER_LEN: usize = HEADER_LEN;

    /// Parses an IETH; fails only with `Truncated`.
    pub fn parse<T: AsRef<[u8]>>(header: &Header<T>) -> Result<IethRepr, WireError> {
        header.check_len()?;
        Ok(IethRepr {
            rkey: header.rkey(),
        })
    }

    /// Bytes [`IethRepr::emit`] writes: [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the IETH. Panics if the view is shorter than [`HEADER_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut Header<T>) {
        header.set_rkey(self.rkey);
    }
}

/// Prints like `IETH rkey=0x00abcdef`.
impl fmt::Display for IethRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IETH rkey={:#010x}", self.rkey)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static BYTES: [u8; 4] = [0x00, 0xab, 0xcd, 0xef];
    const REPR: IethRepr = IethRepr { rkey: 0x00ab_cdef };

    // Reference §1.3: R_Key to invalidate (32), big-endian.
    #[test]
    fn deconstruct_and_construct_ieth() {
        assert_eq!(Header::new_checked(&BYTES[..]).unwrap().rkey(), 0x00ab_cdef);
        let mut bytes = [0u8; 4];
        Header::new_unchecked(&mut bytes[..]).set_rkey(0x00ab_cdef);
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn parse_and_emit_ieth_round_trip() {
        assert_eq!(
            IethRepr::parse(&Header::new_checked(&BYTES[..]).unwrap()),
            Ok(REPR)
        );
        let mut bytes = [0u8; 4];
        REPR.emit(&mut Header::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
        assert_eq!(REPR.buffer_len(), 4);
    }

    #[test]
    fn short_ieth_is_truncated_and_displays() {
        assert_eq!(
            Header::new_checked(&BYTES[..0]).err(),
            Some(WireError::Truncated)
        );
        assert_eq!(REPR.to_string(), "IETH rkey=0x00abcdef");
    }
}
