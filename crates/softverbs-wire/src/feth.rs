//! FLUSH Extended Transport Header (FETH), 4 bytes (IBTA 1.5 vol. 1 §9.3.x, the
//! persistent-memory extension annex A19).
//!
//! Layout: one big-endian 32-bit word; bits 3..0 are the placement type (bit 0: global
//! visibility, bit 1: persistence; bits 2..3 reserved), bits 5..4 the selectivity level
//! (0: a memory-region range, 1: the whole memory region; 2, 3 reserved), bits 31..6
//! reserved. Carried by RC FLUSH (opcode 0x1C), between the BTH and the RETH — the order
//! Linux's rxe sends (`rxe_opcode.c`: FETH at offset 12, RETH at 16).
//!
//! Holds the checked view [`Header`] and the parsed form [`FethRepr`]. Parsing keeps the
//! six defined bits as they are (reserved values included, so the responder can refuse
//! them with a NAK) and ignores the reserved upper bits, which a sender writes as zero.
//!
//! No-panic contract: [`Header::new_checked`], [`Header::check_len`] and [`FethRepr::parse`]
//! never panic, whatever the bytes. Getters and setters never panic on a view that passed
//! [`Header::check_len`]; on a [`Header::new_unchecked`] view over fewer than
//! [`HEADER_LEN`] bytes they panic.

use core::fmt;

use crate::be::{header_view, read_u32, write_u32};
use crate::WireError;

mod field {
    use core::ops::Range;

    /// The FETH word: reserved (31..6), selectivity level (5..4), placement type (3..0).
    pub const WORD: Range<usize> = 0..4;
}

/// Length of the FETH in bytes.
pub const HEADER_LEN: usize = 4;

/// Placement type bit: make the data globally visible (`IBV_FLUSH_GLOBAL`).
pub const PLACEMENT_GLOBAL: u8 = 1 << 0;
/// Placement type bit: make the data persistent (`IBV_FLUSH_PERSISTENT`).
pub const PLACEMENT_PERSISTENT: u8 = 1 << 1;
/// Selectivity level: the range the RETH names (`IBV_FLUSH_RANGE`).
pub const SELECTIVITY_RANGE: u8 = 0;
/// Selectivity level: the whole memory region of the RETH's R_Key (`IBV_FLUSH_MR`).
pub const SELECTIVITY_MR: u8 = 1;

const PLACEMENT_MASK: u32 = 0x0F;
const SELECTIVITY_SHIFT: u32 = 4;
const SELECTIVITY_MASK: u32 = 0x30;

header_view!("FETH", FethRepr);

impl<T: AsRef<[u8]>> Header<T> {
    /// The placement type (bits 3..0).
    pub fn placement_type(&self) -> u8 {
        (read_u32(self.buffer.as_ref(), field::WORD) & PLACEMENT_MASK) as u8
    }

    /// The selectivity level (bits 5..4).
    pub fn selectivity_level(&self) -> u8 {
        ((read_u32(self.buffer.as_ref(), field::WORD) & SELECTIVITY_MASK) >> SELECTIVITY_SHIFT)
            as u8
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Writes the whole word: `placement` in bits 3..0, `selectivity` in bits 5..4, the
    /// reserved bits zero. Bits of either value beyond its field are dropped.
    pub fn set_fields(&mut self, placement: u8, selectivity: u8) {
        let word = (u32::from(placement) & PLACEMENT_MASK)
            | ((u32::from(selectivity) << SELECTIVITY_SHIFT) & SELECTIVITY_MASK);
        write_u32(self.buffer.as_mut(), field::WORD, word);
    }
}

/// The parsed FETH.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FethRepr {
    /// Placement type, 4 bits: [`PLACEMENT_GLOBAL`], [`PLACEMENT_PERSISTENT`] (reserved
    /// bits kept as received).
    pub placement_type: u8,
    /// Selectivity level, 2 bits: [`SELECTIVITY_RANGE`] or [`SELECTIVITY_MR`] (reserved
    /// values kept as received).
    pub selectivity_level: u8,
}

impl FethRepr {
    /// Length of the FETH in bytes.
    pub const HEADER_LEN: usize = HEADER_LEN;

    /// Parses a FETH; fails only with `Truncated`.
    pub fn parse<T: AsRef<[u8]>>(header: &Header<T>) -> Result<FethRepr, WireError> {
        header.check_len()?;
        Ok(FethRepr {
            placement_type: header.placement_type(),
            selectivity_level: header.selectivity_level(),
        })
    }

    /// Bytes [`FethRepr::emit`] writes: [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the FETH (reserved bits zero). Panics if the view is shorter than
    /// [`HEADER_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut Header<T>) {
        header.set_fields(self.placement_type, self.selectivity_level);
    }
}

/// Prints like `FETH plt=0x1 sel=0`.
impl fmt::Display for FethRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "FETH plt={:#x} sel={}",
            self.placement_type, self.selectivity_level
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // rxe's feth_init: ((level << 4) & 0x30) | (type & 0x0F), stored big-endian; a
    // persistent (2) flush of the whole region (1) is the word 0x00000012.
    static BYTES: [u8; 4] = [0x00, 0x00, 0x00, 0x12];
    const REPR: FethRepr = FethRepr {
        placement_type: PLACEMENT_PERSISTENT,
        selectivity_level: SELECTIVITY_MR,
    };

    #[test]
    fn deconstruct_and_construct_feth() {
        let header = Header::new_checked(&BYTES[..]).unwrap();
        assert_eq!(header.placement_type(), 2);
        assert_eq!(header.selectivity_level(), 1);
        let mut bytes = [0xFFu8; 4];
        Header::new_unchecked(&mut bytes[..]).set_fields(2, 1);
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn parse_and_emit_feth_round_trip() {
        assert_eq!(
            FethRepr::parse(&Header::new_checked(&BYTES[..]).unwrap()),
            Ok(REPR)
        );
        let mut bytes = [0u8; 4];
        REPR.emit(&mut Header::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
        assert_eq!(REPR.buffer_len(), 4);
    }

    // Reserved bits 31..6 are ignored on receipt; reserved placement bits and selectivity
    // values are kept, so the responder can refuse them.
    #[test]
    fn feth_ignores_reserved_word_bits_and_keeps_reserved_field_values() {
        let bytes = [0xFF, 0xFF, 0xFF, 0xFF];
        let repr = FethRepr::parse(&Header::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(repr.placement_type, 0x0F);
        assert_eq!(repr.selectivity_level, 3);
        let mut out = [0u8; 4];
        repr.emit(&mut Header::new_unchecked(&mut out[..]));
        assert_eq!(out, [0x00, 0x00, 0x00, 0x3F]);
    }

    #[test]
    fn short_feth_is_truncated_and_displays() {
        assert_eq!(
            Header::new_checked(&BYTES[..3]).err(),
            Some(WireError::Truncated)
        );
        assert_eq!(REPR.to_string(), "FETH plt=0x2 sel=1");
    }
}
