//! RDMA Extended Transport Header (RETH), 16 bytes: the remote buffer of an RDMA operation.
//!
//! Layout (reference §1.3, IBTA vol. 1 §9.3.3), big-endian: VA (64) · R_Key (32) ·
//! DMA Length (32). Carried by RDMA WRITE FIRST / ONLY (with or without immediate) and RDMA
//! READ REQUEST. DMA Length is the length of the **whole** message, not of this packet.
//!
//! Holds the checked view [`Header`] and the parsed form [`RethRepr`].
//!
//! No-panic contract: [`Header::new_checked`], [`Header::check_len`] and [`RethRepr::parse`]
//! never panic, whatever the bytes (every bit pattern is a valid RETH; only a short buffer
//! fails). Getters and setters never panic on a view that passed [`Header::check_len`]; on a
//! [`Header::new_unchecked`] view over fewer than [`HEADER_LEN`] bytes they panic.

use core::fmt;

use crate::be::{header_view, read_u32, read_u64, write_u32, write_u64};
use crate::WireError;

mod field {
    use core::ops::Range;

    /// Virtual address.
    pub const VA: Range<usize> = 0..8;
    /// Remote key.
    pub const RKEY: Range<usize> = 8..12;
    /// DMA length of the whole message.
    pub const DMA_LEN: Range<usize> = 12..16;
}

/// Length of the RETH in bytes.
pub const HEADER_LEN: usize = 16;

header_view!("RETH", RethRepr);

impl<T: AsRef<[u8]>> Header<T> {
    /// Virtual address.
    pub fn va(&self) -> u64 {
        read_u64(self.buffer.as_ref(), field::VA)
    }

    /// R_Key.
    pub fn rkey(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::RKEY)
    }

    /// DMA length of the whole message.
    pub fn dma_len(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::DMA_LEN)
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

    /// Sets the DMA length.
    pub fn set_dma_len(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::DMA_LEN, value);
    }
}

/// The parsed RETH.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RethRepr {
    /// Remote virtual address (of this packet's data for FIRST, of the message for READ).
    pub va: u64,
    /// Remote key of the target memory region.
    pub rkey: u32,
    /// Total length of the message in bytes.
    pub dma_len: u32,
}

impl RethRepr {
    /// Length of the RETH in bytes.
    pub const HEADER_LEN: usize = HEADER_LEN;

    /// Parses a RETH; fails only with `Truncated`.
    pub fn parse<T: AsRef<[u8]>>(header: &Header<T>) -> Result<RethRepr, WireError> {
        header.check_len()?;
        Ok(RethRepr {
            va: header.va(),
            rkey: header.rkey(),
            dma_len: header.dma_len(),
        })
    }

    /// Bytes [`RethRepr::emit`] writes: [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the RETH. Panics if the view is shorter than [`HEADER_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut Header<T>) {
        header.set_va(self.va);
        header.set_rkey(self.rkey);
        header.set_dma_len(self.dma_len);
    }
}

/// Prints like `RETH va=0x000055f4e59cedb0 rkey=0x0001350d len=22`.
impl fmt::Display for RethRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RETH va={:#018x} rkey={:#010x} len={}",
            self.va, self.rkey, self.dma_len
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Reference §1.8 vector A, RC RDMA_WRITE_ONLY (ConnectX capture): the RETH bytes.
    static BYTES: [u8; 16] = [
        0x00, 0x00, 0x55, 0xf4, 0xe5, 0x9c, 0xed, 0xb0, 0x00, 0x01, 0x35, 0x0d, 0x00, 0x00, 0x00,
        0x16,
    ];
    const REPR: RethRepr = RethRepr {
        va: 0x0000_55f4_e59c_edb0,
        rkey: 0x0001_350d,
        dma_len: 22,
    };

    // Reference §1.3: VA (64) · R_Key (32) · DMA Length (32).
    #[test]
    fn deconstruct_reth_of_hardware_write_only() {
        let header = Header::new_checked(&BYTES[..]).unwrap();
        assert_eq!(header.va(), 0x0000_55f4_e59c_edb0);
        assert_eq!(header.rkey(), 0x0001_350d);
        assert_eq!(header.dma_len(), 22);
    }

    #[test]
    fn construct_reth_with_setters() {
        let mut bytes = [0xA5u8; 16];
        let mut header = Header::new_unchecked(&mut bytes[..]);
        header.set_va(0x0000_55f4_e59c_edb0);
        header.set_rkey(0x0001_350d);
        header.set_dma_len(22);
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn parse_and_emit_reth_round_trip() {
        assert_eq!(
            RethRepr::parse(&Header::new_checked(&BYTES[..]).unwrap()),
            Ok(REPR)
        );
        let mut bytes = [0u8; 16];
        REPR.emit(&mut Header::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
        assert_eq!(REPR.buffer_len(), 16);
    }

    #[test]
    fn short_reth_is_truncated() {
        assert_eq!(
            Header::new_checked(&BYTES[..15]).err(),
            Some(WireError::Truncated)
        );
    }

    #[test]
    fn display_reth() {
        assert_eq!(
            REPR.to_string(),
            "RETH va=0x000055f4e59cedb0 rkey=0x0001350d len=22"
        );
        assert_eq!(
            Header::new_unchecked(&BYTES[..2]).to_string(),
            "RETH (packet truncated)"
        );
    }
}
