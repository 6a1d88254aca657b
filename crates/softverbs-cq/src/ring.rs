//! The completion ring: a power-of-two array of 64-byte slots, each holding one 48-byte
//! work completion, its device timestamp and a sequence word that marks it valid in place
//! (the owner-bit scheme of mlx5 CQEs).
//!
//! Positions are free-running `u64` counters; slot `pos & mask` holds position `pos`, and
//! its sequence word is `pos + 1` once the entry is complete. The consumer therefore never
//! reads the producer's tail to learn whether an entry is there, and the producer reads the
//! consumer's head only when its cached copy says the ring is full.
//!
//! Every field is an atomic, so a reader racing a writer (possible only with
//! `IGNORE_OVERRUN`, where the producer overwrites unconsumed entries) is a seqlock retry,
//! never a data race. On x86-64 the relaxed loads and stores are plain moves.
//!
//! Ownership rules (enforced by the callers in `cq/`, which hold the producer lock or the
//! consumer's exclusive access): only the producer writes slots; only the consumer reads
//! them; [`Ring`] is replaced only while both sides are excluded.

use crate::error::CreateError;
use crate::memory::{RingArray, RingResource, SharedRingAllocator};
use crate::sync::{fence, AtomicU64, Ordering};
use crate::wc::WorkCompletion;

/// The sequence word's "being written" mark (set only under `IGNORE_OVERRUN`).
pub(crate) const WRITING: u64 = 1 << 63;

/// Extra per-entry fields that `struct ibv_wc` has no room for (cvlan, flow tag,
/// tag-matching info), reported only by extended CQs that asked for them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WcExtra {
    /// Customer VLAN (`ibv_wc_read_cvlan`).
    pub cvlan: u16,
    /// Flow tag (`ibv_wc_read_flow_tag`).
    pub flow_tag: u32,
    /// Tag-matching tag (`struct ibv_wc_tm_info.tag`).
    pub tm_tag: u64,
    /// Tag-matching private data (`struct ibv_wc_tm_info.priv`).
    pub tm_priv: u32,
}

#[repr(C, align(64))]
pub(crate) struct Slot {
    seq: AtomicU64,
    words: [AtomicU64; 6],
    timestamp: AtomicU64,
}

impl Slot {
    fn new() -> Self {
        Slot {
            seq: AtomicU64::new(0),
            words: std::array::from_fn(|_| AtomicU64::new(0)),
            timestamp: AtomicU64::new(0),
        }
    }
}

struct ExtraSlot {
    cvlan_flow_tag: AtomicU64,
    tm_tag: AtomicU64,
    tm_priv: AtomicU64,
}

/// What the consumer found at a position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Peek {
    /// The entry for this position is complete.
    Ready,
    /// Not produced yet (or still being written).
    Empty,
    /// Overwritten by a later position (`IGNORE_OVERRUN` only).
    Lapped,
}

/// One entry as read out of the ring.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Entry {
    pub(crate) wc: WorkCompletion,
    pub(crate) timestamp: u64,
    pub(crate) extra: WcExtra,
}

pub(crate) struct Ring {
    slots: RingArray<Slot>,
    extra: Option<RingArray<ExtraSlot>>,
    mask: u64,
}

impl Ring {
    /// A ring of `capacity` slots (a power of two), with room for [`WcExtra`] if asked, in
    /// memory from `allocator` if there is one (`memory.rs`).
    pub(crate) fn new(
        capacity: usize,
        with_extra: bool,
        allocator: Option<&SharedRingAllocator>,
    ) -> Result<Ring, CreateError> {
        debug_assert!(capacity.is_power_of_two());
        let slots = RingArray::new(capacity, RingResource::Slots, allocator, Slot::new)?;
        let extra = if with_extra {
            Some(RingArray::new(
                capacity,
                RingResource::Extras,
                allocator,
                || ExtraSlot {
                    cvlan_flow_tag: AtomicU64::new(0),
                    tm_tag: AtomicU64::new(0),
                    tm_priv: AtomicU64::new(0),
                },
            )?)
        } else {
            None
        };
        Ok(Ring {
            slots,
            extra,
            mask: capacity as u64 - 1,
        })
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.mask + 1
    }

    #[inline(always)]
    fn slot(&self, pos: u64) -> &Slot {
        &self.slots[(pos & self.mask) as usize]
    }

    /// Writes the entry for `pos` (a completion packed by [`WorkCompletion::to_words`]) and
    /// publishes it. The caller is the only producer and has checked that the slot's
    /// previous entry was consumed (or, with `overwrite`, accepts losing it).
    #[inline(always)]
    pub(crate) fn write(
        &self,
        pos: u64,
        words: [u64; 6],
        timestamp: u64,
        extra: Option<&WcExtra>,
        overwrite: bool,
    ) {
        let slot = self.slot(pos);
        if overwrite {
            // Seqlock writer: mark the slot, then order the mark before the data stores so
            // a reader that sees any new data also sees the mark on its re-check.
            slot.seq.store((pos + 1) | WRITING, Ordering::Relaxed);
            fence(Ordering::Release);
        }
        for (word, value) in slot.words.iter().zip(words) {
            word.store(value, Ordering::Relaxed);
        }
        slot.timestamp.store(timestamp, Ordering::Relaxed);
        if let Some(extras) = &self.extra {
            let e = extra.copied().unwrap_or_default();
            let x = &extras[(pos & self.mask) as usize];
            x.cvlan_flow_tag.store(
                u64::from(e.cvlan) | (u64::from(e.flow_tag) << 32),
                Ordering::Relaxed,
            );
            x.tm_tag.store(e.tm_tag, Ordering::Relaxed);
            x.tm_priv.store(u64::from(e.tm_priv), Ordering::Relaxed);
        }
        // Release: the consumer's Acquire load of `seq == pos + 1` sees every store above.
        slot.seq.store(pos + 1, Ordering::Release);
    }

    /// The first slot and the index mask, for a consumer that caches them.
    pub(crate) fn raw_parts(&self) -> (*const Slot, u64) {
        (self.slots.as_ptr(), self.mask)
    }

    /// Whether the entry for `pos` is there. `Acquire` pairs with the `Release` publication
    /// in [`Ring::write`].
    #[inline(always)]
    pub(crate) fn peek(&self, pos: u64) -> Peek {
        classify(self.slot(pos).seq.load(Ordering::Acquire), pos)
    }

    /// Reads the entry for `pos`, which [`Ring::peek`] found ready. With `validate` (the
    /// `IGNORE_OVERRUN` case, where the producer may be overwriting it right now) the read is
    /// checked like a seqlock and `None` means the entry was lapped while being read.
    #[inline(always)]
    pub(crate) fn read(&self, pos: u64, validate: bool) -> Option<Entry> {
        let slot = self.slot(pos);
        let mut words = [0u64; 6];
        for (out, word) in words.iter_mut().zip(&slot.words) {
            *out = word.load(Ordering::Relaxed);
        }
        let timestamp = slot.timestamp.load(Ordering::Relaxed);
        let extra = self.extra.as_ref().map_or(WcExtra::default(), |extras| {
            let x = &extras[(pos & self.mask) as usize];
            let cf = x.cvlan_flow_tag.load(Ordering::Relaxed);
            WcExtra {
                cvlan: cf as u16,
                flow_tag: (cf >> 32) as u32,
                tm_tag: x.tm_tag.load(Ordering::Relaxed),
                tm_priv: x.tm_priv.load(Ordering::Relaxed) as u32,
            }
        });
        if validate {
            // Seqlock reader: the Acquire fence orders the data loads before the re-check.
            fence(Ordering::Acquire);
            if slot.seq.load(Ordering::Relaxed) != pos + 1 {
                return None;
            }
        }
        Some(Entry {
            wc: WorkCompletion::from_words(words),
            timestamp,
            extra,
        })
    }

    /// Copies positions `from..to` into `into` (a fresh ring), publishing each. Only used
    /// by resize, with both sides excluded.
    pub(crate) fn copy_into(&self, from: u64, to: u64, into: &Ring) {
        for pos in from..to {
            if let Some(entry) = self.read(pos, false) {
                into.write(
                    pos,
                    entry.wc.to_words(),
                    entry.timestamp,
                    Some(&entry.extra),
                    false,
                );
            }
        }
    }
}

impl Ring {
    /// Whether position `pos` is empty ([`Peek::Empty`]): the consumer's fast check, with the
    /// common answers (ready, or not yet written) decided by one comparison each.
    #[inline(always)]
    pub(crate) fn is_empty_at(&self, pos: u64) -> bool {
        is_empty(self.slot(pos).seq.load(Ordering::Acquire), pos)
    }
}

/// [`classify`]`(seq, pos) == Peek::Empty`, branching on the likely case first.
#[inline(always)]
pub(crate) fn is_empty(seq: u64, pos: u64) -> bool {
    let expected = pos + 1;
    seq != expected && seq & !WRITING <= expected
}

/// [`Ring::is_empty_at`] through cached [`Ring::raw_parts`].
///
/// # Safety
/// `slots` and `mask` come from `raw_parts` of a ring that is still allocated.
#[inline(always)]
pub(crate) unsafe fn is_empty_raw(slots: *const Slot, mask: u64, pos: u64) -> bool {
    // SAFETY: `pos & mask` is below the ring's capacity and the ring is alive (caller).
    let slot = unsafe { &*slots.add((pos & mask) as usize) };
    is_empty(slot.seq.load(Ordering::Acquire), pos)
}

/// What sequence word `seq` means for position `pos`.
#[inline(always)]
pub(crate) fn classify(seq: u64, pos: u64) -> Peek {
    let expected = pos + 1;
    if seq == expected {
        return Peek::Ready;
    }
    let target = seq & !WRITING;
    if target > expected {
        Peek::Lapped
    } else {
        Peek::Empty
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::wc::WcOpcode;

    #[test]
    fn slot_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Slot>(), 64);
    }

    #[test]
    fn entries_are_valid_in_place_only_for_their_own_position() {
        let ring = Ring::new(4, false, None).unwrap();
        assert_eq!(ring.peek(0), Peek::Empty);
        let wc = WorkCompletion::success(1, WcOpcode::Send, 3);
        ring.write(0, wc.to_words(), 0, None, false);
        assert_eq!(ring.peek(0), Peek::Ready);
        assert_eq!(ring.read(0, true).unwrap().wc, wc);
        // Position 4 shares slot 0 but has not been written: empty, not a stale hit.
        assert_eq!(ring.peek(4), Peek::Empty);
        ring.write(4, wc.to_words(), 0, None, true);
        assert_eq!(ring.peek(0), Peek::Lapped);
        assert_eq!(ring.peek(4), Peek::Ready);
    }

    #[test]
    fn the_fast_empty_check_agrees_with_classify() {
        for pos in [0, 3, 4, 5, 100] {
            for seq in [0, 1, pos, pos + 1, pos + 2, pos + 9] {
                for mark in [0, WRITING] {
                    let seq = seq | mark;
                    assert_eq!(
                        is_empty(seq, pos),
                        classify(seq, pos) == Peek::Empty,
                        "seq {seq:#x} pos {pos}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_slot_being_written_reads_as_empty_for_its_position_and_lapped_for_older() {
        assert_eq!(classify(5 | WRITING, 4), Peek::Empty);
        assert_eq!(classify(9 | WRITING, 4), Peek::Lapped);
        assert_eq!(classify(1, 4), Peek::Empty);
    }
}
