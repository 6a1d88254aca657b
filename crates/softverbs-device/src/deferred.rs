//! Payload read where it goes: one copy from a registered region to the peer instead of
//! two.
//!
//! A device whose packets go to devices of this process, or (through its transport) into
//! the shared-memory inbox of a device of another process (`shm`), lets its memory table
//! leave the engine's reads of payload for later (`MemoryTable::defer_reads`): the engine
//! builds each packet as always — headers, and a payload whose region, bounds, key and
//! access it checked — but the payload bytes are not copied into the packet buffer. Each
//! such read is a [`Deferred`] piece: its place in the packet and the address of the bytes
//! in the region. Where the packet goes decides what happens to it:
//!
//! - into a ring: the record is written from the packet buffer and, for the pieces,
//!   straight from the region ([`write_packet`]) — the payload moves once on the sending
//!   side;
//! - to a device of this process: the packet is handed over with its pieces, and the
//!   receiver's writes of its payload into a region take the pieces' bytes straight from
//!   the sender's region (`MemoryTable::supply_from`) — the payload moves once in all;
//! - anywhere else (the socket, a capture): the pieces are read into the packet buffer
//!   first ([`fill`]), which is the copy the engine would have made.
//!
//! The reads happen after the sending device's state lock is released, as the packet
//! leaves or is handled: a region deregistered (and unmapped) meanwhile is read through
//! the guarded copy ([`crate::guarded`]), so a page that is gone is a fault, never a crash.
//! A piece that faults marks its region as a read at build time would have (later accesses
//! fail; the requester's retransmission then completes with `IBV_WC_LOC_PROT_ERR`) and the
//! packet is lost, never delivered with bytes that are not the region's (a receiver of
//! this process checks the pieces' pages before it handles the packet, [`readable_all`];
//! a page unmapped after that check fails the write as a fault of the packet, without
//! marking the receiver's region). Only on x86-64, where the guarded copy tolerates faults
//! (elsewhere reads are never left for later).

use crate::memory::shared::copy_from_shared;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Bytes of an outgoing packet left to be read from registered memory when the packet is
/// written where it goes (module documentation).
#[derive(Debug, Clone)]
pub(crate) struct Deferred {
    /// Where the bytes go: an offset in the packet (while a run is built, in the run's
    /// bytes).
    pub(crate) at: usize,
    /// How many bytes.
    pub(crate) len: usize,
    /// Their address in this process: inside a region the engine checked.
    pub(crate) src: usize,
    /// The region's fault mark, set when reading them faults.
    pub(crate) faulted: Arc<AtomicBool>,
}

impl Deferred {
    /// The same piece `by` bytes later in its buffer.
    pub(crate) fn shifted(&self, by: usize) -> Deferred {
        Deferred {
            at: self.at + by,
            ..self.clone()
        }
    }

    /// Marks the piece's region: reading it faulted.
    pub(crate) fn mark_faulted(&self, fault: crate::guarded::Faulted) {
        if !self.faulted.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                addr = format_args!("{:#x}", self.src),
                len = self.len,
                moved = fault.moved,
                "registered memory is no longer mapped (unmapped or freed while \
                     registered): the packet carrying its bytes is lost, and every later \
                     access to the region fails"
            );
        }
    }

    /// Reads the piece into `dst` (`len` bytes); false if the region faulted (marked).
    fn read_into(&self, dst: &mut [u8]) -> bool {
        debug_assert_eq!(dst.len(), self.len);
        // SAFETY: `src .. src + len` is inside a registered region the engine checked when
        // it built the packet; if the application has since unmapped it (breaking the
        // registration contract), the guarded copy reports the fault instead of touching
        // anything else. `dst` is memory of this device (a packet buffer, or a ring record
        // not yet published), disjoint from the region.
        match unsafe { copy_from_shared(self.src as *const u8, dst) } {
            Ok(()) => true,
            Err(fault) => {
                self.mark_faulted(fault);
                false
            }
        }
    }
}

/// Whether the byte at `addr` can be read now (a guarded read of it does not fault).
pub(crate) fn readable(addr: usize) -> bool {
    let mut byte = [0u8; 1];
    // SAFETY: one byte, read through the guarded copy: a page that is not mapped is a
    // fault reported, never a crash; `byte` is this function's.
    unsafe { copy_from_shared(addr as *const u8, &mut byte) }.is_ok()
}

/// Whether every page of every piece can be read now; a piece with a page that cannot
/// is marked (its region faulted). A device of this process handed a packet with pieces
/// checks this before handling it: a packet whose sender's memory is gone is lost, as a
/// packet whose gather faulted is never sent (the requester's retransmission reports it),
/// and the receiver's engine never meets the sender's fault.
pub(crate) fn readable_all(pieces: &[Deferred]) -> bool {
    const PAGE: usize = 4096;
    pieces.iter().all(|piece| {
        let end = piece.src.saturating_add(piece.len);
        let mut at = piece.src;
        while at < end {
            if !readable(at) {
                piece.mark_faulted(crate::guarded::Faulted {
                    moved: at - piece.src,
                });
                return false;
            }
            at = (at / PAGE + 1) * PAGE;
        }
        true
    })
}

/// Reads `pieces` into the packet `bytes`, whose first byte is at offset `base` of the
/// buffer the pieces' offsets count in (in order, inside the packet); false if one faulted
/// (the packet must not be sent).
pub(crate) fn fill(bytes: &mut [u8], base: usize, pieces: &[Deferred]) -> bool {
    pieces.iter().all(|piece| {
        let at = piece.at.wrapping_sub(base);
        match bytes.get_mut(at..at.saturating_add(piece.len)) {
            Some(dst) => piece.read_into(dst),
            None => false,
        }
    })
}

/// Writes the packet `bytes` into `dst` (as long), each of `pieces` (offsets counted as for
/// [`fill`], in order, not overlapping, inside the packet) read from its region instead of
/// from `bytes`; false if one faulted (`dst` is then incomplete: the packet must not be
/// sent).
pub(crate) fn write_packet(bytes: &[u8], base: usize, pieces: &[Deferred], dst: &mut [u8]) -> bool {
    if dst.len() != bytes.len() {
        return false;
    }
    let mut at = 0;
    for piece in pieces {
        let start = piece.at.wrapping_sub(base);
        let end = start.saturating_add(piece.len);
        if start < at || end > bytes.len() {
            return false;
        }
        dst[at..start].copy_from_slice(&bytes[at..start]);
        if !piece.read_into(&mut dst[start..end]) {
            return false;
        }
        at = end;
    }
    dst[at..].copy_from_slice(&bytes[at..]);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(at: usize, source: &[u8], faulted: &Arc<AtomicBool>) -> Deferred {
        Deferred {
            at,
            len: source.len(),
            src: source.as_ptr() as usize,
            faulted: faulted.clone(),
        }
    }

    #[test]
    fn a_packet_is_written_from_its_buffer_with_the_pieces_read_from_their_regions() {
        let mark = Arc::new(AtomicBool::new(false));
        let region_a = [0xAAu8; 5];
        let region_b = [0xBBu8; 3];
        let bytes = [1u8, 2, 3, 0, 0, 0, 0, 0, 9, 0, 0, 0, 13, 14];
        let pieces = [piece(3, &region_a, &mark), piece(9, &region_b, &mark)];
        let mut dst = [0u8; 14];
        assert!(write_packet(&bytes, 0, &pieces, &mut dst));
        assert_eq!(
            dst,
            [1, 2, 3, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 9, 0xBB, 0xBB, 0xBB, 13, 14]
        );
        let mut filled = bytes;
        assert!(fill(&mut filled, 0, &pieces));
        assert_eq!(filled, dst);
        assert!(!mark.load(Ordering::Relaxed));
    }

    #[test]
    fn pieces_outside_the_packet_or_out_of_order_are_refused() {
        let mark = Arc::new(AtomicBool::new(false));
        let region = [7u8; 4];
        let bytes = [0u8; 8];
        let mut dst = [0u8; 8];
        assert!(!write_packet(
            &bytes,
            0,
            &[piece(6, &region, &mark)],
            &mut dst
        ));
        assert!(!write_packet(
            &bytes,
            0,
            &[piece(4, &region, &mark), piece(0, &region, &mark)],
            &mut dst
        ));
        assert!(!fill(&mut [0u8; 8], 0, &[piece(5, &region, &mark)]));
        assert!(!write_packet(&bytes, 0, &[], &mut [0u8; 7]));
    }

    // A region unmapped after the packet was built: the read faults, the region is
    // marked, the packet is refused (x86-64, where the guarded copy tolerates faults).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_piece_of_unmapped_memory_marks_its_region_and_refuses_the_packet() {
        // A page unmapped right away: only its address is kept, to read from through the
        // guarded copy. Mapped far from where the other tests' mappings land, so that
        // none is at that address meanwhile (a test of the same process, in parallel).
        let gone = crate::mappings::map_far(1, libc::PROT_READ | libc::PROT_WRITE);
        // SAFETY: the mapping just made, used by nothing.
        assert_eq!(unsafe { libc::munmap(gone as *mut libc::c_void, 4096) }, 0);
        let mark = Arc::new(AtomicBool::new(false));
        let pieces = [Deferred {
            at: 4,
            len: 64,
            src: gone,
            faulted: mark.clone(),
        }];
        let bytes = [0u8; 72];
        let mut dst = [0u8; 72];
        assert!(!write_packet(&bytes, 0, &pieces, &mut dst));
        assert!(mark.load(Ordering::Relaxed), "the region is marked");
        assert!(!fill(&mut [0u8; 72], 0, &pieces));
        // A receiver of this process checks the pages first.
        let other = Arc::new(AtomicBool::new(false));
        let here = [0u8; 16];
        assert!(readable_all(&[piece(0, &here, &other)]));
        let gone_piece = Deferred {
            faulted: other.clone(),
            ..pieces[0].clone()
        };
        assert!(!readable_all(&[piece(0, &here, &other), gone_piece]));
        assert!(
            other.load(Ordering::Relaxed),
            "the gone piece's region is marked"
        );
    }
}
