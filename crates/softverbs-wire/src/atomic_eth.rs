//! Atomic Extended Transport Header (AtomicETH), 28 bytes.
//!
//! Layout (reference §1.3, IBTA vol. 1 §9.3.4), big-endian: VA (64) · R_Key (32) ·
//! Swap-or-Add data (64) · Compare data (64). Carried by COMPARE SWAP (swap value in the
//! swap/add field, compare value in the compare field) and FETCH ADD (add value in the
//! swap/add field, compare sent as 0 and ignored). The VA must be 8-byte aligned; that is
//! the responder's check, not the parser's.
//!
//! Holds the checked view [`Header`] and the parsed form [`AtomicEthRepr`].
//!
//! No-panic contract: [`Header::new_checked`], [`Header::check_len`] and
//! [`AtomicEthRepr::parse`] never panic, whatever the bytes. Getters and setters never panic
//! on a view that passed [`Header::check_len`]; on a [`Header::new_unchecked`] view over
//! fewer than [`HEADER_LEN`] bytes they panic.

use core::fmt;

use crate::be::{header_view, read_u32, read_u64, write_u32, write_u64};
use crate::WireError;

mod field {
    use core::ops::Range;

    /// Virtual address.
    pub const VA: Range<usize> = 0..8;
    /// Remote key.
    pub const RKEY: Range<usize> = 8..12;
    /// Swap (compare-swap) or add (fetch-add) operand.
    pub const SWAP_ADD: Range<usize> = 12..20;
    /// Compare operand.
    pub const COMPARE: Range<usize> = 20..28;
}

/// Length of the AtomicETH in bytes.
pub const HEADER_LEN: usize = 28;

header_view!("AtomicETH", AtomicEthRepr);

impl<T: AsRef<[u8]>> Header<T> {
    /// Virtual address.
    pub fn va(&self) -> u64 {
        read_u64(self.buffer.as_ref(), field::VA)
    }

    /// R_Key.
    pub fn rkey(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::RKEY)
    }

    /// Swap or add operand.
    pub fn swap_add(&self) -> u64 {
        read_u64(self.buffer.as_ref(), field::SWAP_ADD)
    }

    /// Compare operand.
    pub fn compare(&self) -> u64 {
        read_u64(self.buffer.as_ref(), field::COMPARE)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Sets the virtual address.
    pub fn set_va(&mut self, value: u64) {
        write_u64(self.buffer.as_mut(), field::VA, value);
    }

    /// Sets the R_Key.
    pub fn set_rkey(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::RKEY, value);
    }

    /// Sets the swap or add operand.
    pub fn set_swap_add(&mut self, value: u64) {
        write_u64(self.buffer.as_mut(), field::SWAP_ADD, value);
    }

    /// Sets the compare operand.
    pub fn set_compare(&mut self, value: u64) {
        write_u64(self.buffer.as_mut(), field::COMPARE, value);
    }
}

/// The parsed AtomicETH.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicEthRepr {
    /// Remote virtual address of the 64-bit operand (8-byte aligned when valid).
    pub va: u64,
    /// Remote key of the target memory region.
    pub rkey: u32,
    /// Swap value (compare-swap) or add value (fetch-add).
    pub swap_add: u64,
    /// Compare value (compare-swap; 0 for fetch-add).
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Length of the AtomicETH in bytes.
    pub const HEADER_LEN: usize = HEADER_LEN;

    /// Parses an AtomicETH; fails only with `Truncated`.
    pub fn parse<T: AsRef<[u8]>>(header: &Header<T>) -> Result<AtomicEthRepr, WireError> {
        header.check_len()?;
        Ok(AtomicEthRepr {
            va: header.va(),
            rkey: header.rkey(),
            swap_add: header.swap_add(),
            compare: header.compare(),
        })
    }

    /// Bytes [`AtomicEthRepr::emit`] writes: [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the AtomicETH. Panics if the view is shorter than [`HEADER_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut Header<T>) {
        header.set_va(self.va);
        header.set_rkey(self.rkey);
        header.set_swap_add(self.swap_add);
        header.set_compare(self.compare);
    }
}

/// Prints like `AtomicETH va=0x0000000000001000 rkey=0x00000042 swap_add=0x1 compare=0x0`.
impl fmt::Display for AtomicEthRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "AtomicETH va={:#018x} rkey={:#010x} swap_add={:#x} compare={:#x}",
            self.va, self.rkey, self.swap_add, self.compare
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static BYTES: [u8; 28] = [
        0x00, 0x00, 0x7f, 0x00, 0x12, 0x34, 0x56, 0x78, // VA
        0xca, 0xfe, 0x00, 0x01, // R_Key
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // swap/add
        0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, // compare
    ];
    const REPR: AtomicEthRepr = AtomicEthRepr {
        va: 0x0000_7f00_1234_5678,
        rkey: 0xcafe_0001,
        swap_add: 0x0102_0304_0506_0708,
        compare: 0x1112_1314_1516_1718,
    };

    // Reference §1.3: VA (64) · R_Key (32) · Swap-or-Add (64) · Compare (64), big-endian.
    #[test]
    fn deconstruct_atomic_eth() {
        let header = Header::new_checked(&BYTES[..]).unwrap();
        assert_eq!(header.va(), REPR.va);
        assert_eq!(header.rkey(), REPR.rkey);
        assert_eq!(header.swap_add(), REPR.swap_add);
        assert_eq!(header.compare(), REPR.compare);
    }

    #[test]
    fn construct_atomic_eth_with_setters() {
        let mut bytes = [0xA5u8; 28];
        let mut header = Header::new_unchecked(&mut bytes[..]);
        header.set_va(REPR.va);
        header.set_rkey(REPR.rkey);
        header.set_swap_add(REPR.swap_add);
        header.set_compare(REPR.compare);
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn parse_and_emit_atomic_eth_round_trip() {
        assert_eq!(
            AtomicEthRepr::parse(&Header::new_checked(&BYTES[..]).unwrap()),
            Ok(REPR)
        );
        let mut bytes = [0u8; 28];
        REPR.emit(&mut Header::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
        assert_eq!(REPR.buffer_len(), 28);
    }

    #[test]
    fn short_atomic_eth_is_truncated_and_displays() {
        assert_eq!(
            Header::new_checked(&BYTES[..27]).err(),
            Some(WireError::Truncated)
        );
        assert_eq!(
            REPR.to_string(),
            "AtomicETH va=0x00007f0012345678 rkey=0xcafe0001 swap_add=0x102030405060708 \
             compare=0x1112131415161718"
        );
    }
}
