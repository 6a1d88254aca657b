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

    /// The slots, extras and mask, for a loop over entries ([`RingView`]).
    #[inline(always)]
    pub(crate) fn view(&self) -> RingView<'_> {
        RingView {
            slots: &self.slots,
            extra: self.extra.as_ref(),
            mask: self.mask,
        }
    }

    /// The first slot and the index mask, for a consumer that caches them.
    pub(crate) fn raw_parts(&self) -> (*const Slot, u64) {
        (self.slots.as_ptr(), self.mask)
    }

    /// Whether position `pos` is empty: the consumer's fast check ([`is_empty`]).
    #[inline(always)]
    pub(crate) fn is_empty_at(&self, pos: u64) -> bool {
        self.view().is_empty_at(pos)
    }

    /// Copies positions `from..to` into `into` (a fresh ring), publishing each. Only used
    /// by resize, with both sides excluded.
    pub(crate) fn copy_into(&self, from: u64, to: u64, into: &Ring) {
        let (old, new) = (self.view(), into.view());
        for pos in from..to {
            if let Some(entry) = old.read(pos, false) {
                new.write(
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

/// A ring's slots, extra slots and index mask, copied out of the [`Ring`] for as long as it
/// is borrowed: every entry operation lives here. A loop that went through `&Ring` would
/// reload the slots' address and the mask after each atomic access (the compiler cannot
/// tell the slots' words from the ring's own fields); a view keeps them in registers.
#[derive(Clone, Copy)]
pub(crate) struct RingView<'a> {
    slots: &'a [Slot],
    /// The extras' array itself, not its slice: a ring without extras then costs the view
    /// no load and no branch.
    extra: Option<&'a RingArray<ExtraSlot>>,
    mask: u64,
}

impl RingView<'_> {
    pub(crate) fn capacity(&self) -> u64 {
        self.mask + 1
    }

    #[inline(always)]
    fn slot(&self, pos: u64) -> &Slot {
        // SAFETY: `slots` holds `mask + 1` slots (`Ring::new`), and `pos & mask <= mask`.
        unsafe { self.slots.get_unchecked((pos & self.mask) as usize) }
    }

    /// The extra fields' slot for `pos`, if the ring has them.
    #[inline(always)]
    fn extra_slot(&self, pos: u64) -> Option<&ExtraSlot> {
        self.extra.map(|extras| {
            // SAFETY: `extras` holds `mask + 1` slots (`Ring::new`), and `pos & mask <= mask`.
            unsafe { extras.get_unchecked((pos & self.mask) as usize) }
        })
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
        if let Some(x) = self.extra_slot(pos) {
            let e = extra.copied().unwrap_or_default();
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

    /// [`RingView::write`] for a ring without extra fields, of a CQ without timestamps and
    /// without `IGNORE_OVERRUN`: the six words, then the sequence word (the slot's timestamp
    /// word is left as it is; nothing reads it when timestamps were not requested).
    #[inline(always)]
    pub(crate) fn publish(&self, pos: u64, words: [u64; 6]) {
        let slot = self.slot(pos);
        for (word, value) in slot.words.iter().zip(words) {
            word.store(value, Ordering::Relaxed);
        }
        // Release: the consumer's Acquire load of `seq == pos + 1` sees the words.
        slot.seq.store(pos + 1, Ordering::Release);
    }

    /// Whether the entry for `pos` is there. `Acquire` pairs with the `Release` publication
    /// in [`RingView::write`].
    #[inline(always)]
    pub(crate) fn peek(&self, pos: u64) -> Peek {
        classify(self.seq(pos), pos)
    }

    /// The sequence word of the slot for `pos`, for a consumer that compares it with
    /// `pos + 1` itself ([`is_ready`], [`is_lapped`]). `Acquire` pairs with the `Release`
    /// publication in [`RingView::write`].
    #[inline(always)]
    pub(crate) fn seq(&self, pos: u64) -> u64 {
        self.slot(pos).seq.load(Ordering::Acquire)
    }

    /// Whether position `pos` is empty: the consumer's fast check ([`is_empty`]).
    #[inline(always)]
    pub(crate) fn is_empty_at(&self, pos: u64) -> bool {
        is_empty(self.seq(pos), pos)
    }

    /// The completion's six words for `pos`, whose sequence word [`RingView::seq`] found
    /// ready: what `ibv_poll_cq` returns, without the timestamp and the extra fields that
    /// only extended polling reads (an atomic load is not dropped even when its value is
    /// unused). Under `IGNORE_OVERRUN` the caller checks [`RingView::still_at`] before using
    /// them.
    #[inline(always)]
    pub(crate) fn read_words(&self, pos: u64) -> [u64; 6] {
        let words = &self.slot(pos).words;
        std::array::from_fn(|i| words[i].load(Ordering::Relaxed))
    }

    /// Copies the completion for `pos`, whose sequence word [`RingView::seq`] found ready,
    /// into `out`, word by word ([`WorkCompletion::set_from_word_fn`]). Without the seqlock
    /// check: only where the producer never overwrites an unconsumed entry (not under
    /// `IGNORE_OVERRUN`, which reads with [`RingView::read_words`] and checks before
    /// storing).
    #[inline(always)]
    pub(crate) fn copy_out(&self, pos: u64, out: &mut WorkCompletion) {
        let words = &self.slot(pos).words;
        out.set_from_word_fn(|i| words[i].load(Ordering::Relaxed));
    }

    /// The seqlock reader's re-check after [`RingView::read_words`] (`IGNORE_OVERRUN`):
    /// whether the slot still holds `pos`, so the words read are `pos`'s and whole. The
    /// `Acquire` fence orders the data loads before the re-check.
    #[inline(always)]
    pub(crate) fn still_at(&self, pos: u64) -> bool {
        fence(Ordering::Acquire);
        self.slot(pos).seq.load(Ordering::Relaxed) == pos + 1
    }

    /// Reads the entry for `pos`, which [`RingView::peek`] found ready. With `validate` (the
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
        let extra = self.extra_slot(pos).map_or(WcExtra::default(), |x| {
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
}

/// The consumer's fast empty check, one comparison: `true` only if [`classify`] says
/// [`Peek::Empty`], and for every empty slot except one being overwritten for `pos`
/// (`IGNORE_OVERRUN`, [`WRITING`] set), which it calls not empty. That answer sends the
/// caller to its exact path (the poll loop, [`classify`]), which finds the entry not there
/// yet. Without `IGNORE_OVERRUN` a slot's word never exceeds `pos + 1` for the consumer's
/// `pos`, so there it is exact.
#[inline(always)]
pub(crate) fn is_empty(seq: u64, pos: u64) -> bool {
    seq <= pos
}

/// Whether sequence word `seq` marks `pos`'s entry complete ([`Peek::Ready`]).
#[inline(always)]
pub(crate) fn is_ready(seq: u64, pos: u64) -> bool {
    seq == pos + 1
}

/// For a `seq` that is not [`is_ready`] for `pos`: whether the slot was overwritten by a
/// later position ([`Peek::Lapped`]; otherwise the entry is not there yet).
#[inline(always)]
pub(crate) fn is_lapped(seq: u64, pos: u64) -> bool {
    // `seq & !WRITING > pos + 1`, without a 64-bit mask constant held in a register across
    // the poll loop: shifting out the mark bit compares the same (`pos + 1 < 2^63`).
    seq << 1 > (pos + 1) << 1
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
        let owner = Ring::new(4, false, None).unwrap();
        let ring = owner.view();
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
    fn the_fast_checks_agree_with_classify() {
        for pos in [0, 3, 4, 5, 100] {
            for seq in [0, 1, pos, pos + 1, pos + 2, pos + 9] {
                for mark in [0, WRITING] {
                    let seq = seq | mark;
                    let peek = classify(seq, pos);
                    // Never empty when something is there to take or skip; exact for every
                    // word but a slot being overwritten, which goes to the exact path.
                    if is_empty(seq, pos) {
                        assert_eq!(peek, Peek::Empty, "seq {seq:#x} pos {pos}");
                    } else if mark == 0 {
                        assert_ne!(peek, Peek::Empty, "seq {seq:#x} pos {pos}");
                    }
                    assert_eq!(is_ready(seq, pos), peek == Peek::Ready, "seq {seq:#x}");
                    if !is_ready(seq, pos) {
                        assert_eq!(is_lapped(seq, pos), peek == Peek::Lapped, "seq {seq:#x}");
                    }
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
