//! Atomic Acknowledge Extended Transport Header (AtomicAckETH), 8 bytes.
//!
//! Layout (reference §1.3, IBTA vol. 1 §9.5.3): the original remote value (64, big-endian)
//! before the atomic operation; follows the AETH in an RC ATOMIC ACKNOWLEDGE.
//!
//! Holds the checked view [`Header`] and the parsed form [`AtomicAckEthRepr`].
//!
//! No-panic contract: [`Header::new_checked`], [`Header::check_len`] and
//! [`AtomicAckEthRepr::parse`] never panic, whatever the bytes. Getters and setters never
//! panic on a view that passed [`Header::check_len`]; on a [`Header::new_unchecked`] view
//! over fewer than [`HEADER_LEN`] bytes they panic.

use core::fmt;

use crate::be::{header_view, read_u64, write_u64};
use crate::WireError;

mod field {
    use core::ops::Range;

    /// Original remote value.
    pub const ORIG: Range<usize> = 0..8;
}

/// Length of the AtomicAckETH in bytes.
pub const HEADER_LEN: usize = 8;

header_view!("AtomicAckETH", AtomicAckEthRepr);

impl<T: AsRef<[u8]>> Header<T> {
    /// The original remote value.
    pub fn orig(&self) -> u64 {
        read_u64(self.buffer.as_ref(), field::ORIG)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Sets the original remote value.
    pub fn set_orig(&mut self, value: u64) {
        write_u64(self.buffer.as_mut(), field::ORIG, value);
    }
}

/// The parsed AtomicAckETH.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicAckEthRepr {
    /// The remote 64-bit value before the atomic operation.
    pub orig: u64,
}

impl AtomicAckEthRepr {
    /// Length of the AtomicAckETH in bytes.
    pub const HEADER_LEN: usize = HEADER_LEN;

    /// Parses an AtomicAckETH; fails only with `Truncated`.
    pub fn parse<T: AsRef<[u8]>>(header: &Header<T>) -> Result<AtomicAckEthRepr, WireError> {
        header.check_len()?;
        Ok(AtomicAckEthRepr {
            orig: header.orig(),
        })
    }

    /// Bytes [`AtomicAckEthRepr::emit`] writes: [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the AtomicAckETH. Panics if the view is shorter than [`HEADER_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut Header<T>) {
        header.set_orig(self.orig);
    }
}

/// Prints like `AtomicAckETH orig=0x2a`.
impl fmt::Display for AtomicAckEthRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AtomicAckETH orig={:#x}", self.orig)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static BYTES: [u8; 8] = [0xde, 0xad, 0xbe, 0xef, 0x00, 0x00, 0x00, 0x2a];
    const REPR: AtomicAckEthRepr = AtomicAckEthRepr {
        orig: 0xdead_beef_0000_002a,
    };

    // Reference §1.3: original remote value (64), big-endian.
    #[test]
    fn deconstruct_and_construct_atomic_ack_eth() {
        assert_eq!(Header::new_checked(&BYTES[..]).unwrap().orig(), REPR.orig);
        let mut bytes = [0u8; 8];
        Header::new_unchecked(&mut bytes[..]).set_orig(REPR.orig);
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn parse_and_emit_atomic_ack_eth_round_trip() {
        let parsed = AtomicAckEthRepr::parse(&Header::new_checked(&BYTES[..]).unwrap());
        assert_eq!(parsed, Ok(REPR));
        let mut bytes = [0u8; 8];
        REPR.emit(&mut Header::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
        assert_eq!(REPR.buffer_len(), 8);
    }

    #[test]
    fn short_atomic_ack_eth_is_truncated_and_displays() {
        assert_eq!(
            Header::new_checked(&BYTES[..4]).err(),
            Some(WireError::Truncated)
        );
        assert_eq!(REPR.to_string(), "AtomicAckETH orig=0xdeadbeef0000002a");
    }
}
