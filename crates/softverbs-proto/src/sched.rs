//! The schedule: which QPs the engine's outputs visit, so that their cost follows the QPs
//! with work to do and not the number of QPs (issue #15: 2,048 mostly idle QPs must cost
//! what 8 cost).
//!
//! - **Ready to transmit** ([`Schedule::ready`]): a FIFO of the QPs that may have a packet to
//!   send ([`Qp::may_transmit`]). Every entry point that runs a QP (posting, a packet for
//!   it, a timer firing for it, modify, local operations) lists it if it may now send; so
//!   does the peer's congestion window when it opens for a QP it held (`window.rs`).
//!   [`Engine::poll_transmit`](crate::Engine::poll_transmit) takes QPs from the front: one
//!   that sends a packet goes to the back if it may send more (round robin, one packet per
//!   turn), one that sends nothing leaves the list.
//! - **Local operations** ([`Schedule::local`]): the QPs whose send queue is headed by a
//!   memory window bind or local invalidation ready to run ([`Qp::has_local_head`]).
//! - **Timers** ([`Schedule::timers`]): a min-heap of `(deadline, QPN)`, the deadline each QP
//!   had when it was last run ([`Marks::timer`]). An entry whose QP has since changed its
//!   deadline (or is gone) is stale and dropped when it reaches the top; after every entry
//!   point the top is a live entry, so [`Schedule::earliest`] is the earliest deadline of
//!   all QPs without looking at them.
//!
//! What a QP is listed in is marked on the QP ([`Marks`]), so a QP is listed at most once
//! in `ready` and `local`. Every list is a superset: a QP listed may turn out to have
//! nothing to do (one visit, then it leaves); a QP with something to do is always listed
//! ([`Engine::check_schedule`](crate::Engine::check_schedule) verifies it).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::qp::Qp;

/// Which schedule lists hold a QP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Marks {
    /// Listed in [`Schedule::ready`].
    pub ready: bool,
    /// Listed in [`Schedule::local`].
    pub local: bool,
    /// The deadline [`Schedule::timers`] holds a live entry for.
    pub timer: Option<u64>,
}

/// The engine's lists of QPs with work (module doc).
#[derive(Debug, Default)]
pub(crate) struct Schedule {
    /// QPs that may have a packet to send, in turn order.
    pub ready: VecDeque<u32>,
    /// QPs with a local operation heading the send queue.
    pub local: VecDeque<u32>,
    /// `(deadline, QPN)`, earliest first; stale entries are dropped lazily.
    pub timers: BinaryHeap<Reverse<(u64, u32)>>,
    /// QPs with a live timer entry.
    armed: usize,
    /// The top of `timers` may be stale: an entry lost its QP's mark (`note`,
    /// `timer_taken`, [`Schedule::timers_changed`]) since the last `tidy_timers`. When it
    /// is not set, the top is the live entry the last tidy left there, and a tidy has
    /// nothing to look at: most entry points change no timer, or only arm one.
    maybe_stale: bool,
}

impl Schedule {
    /// Lists `qp` where it now has work, after an entry point ran it. `transmit`: whether
    /// it may be listed as ready to send (false after a `poll_transmit` visit that sent
    /// nothing: the QP waits for an input that lists it again).
    pub fn note(&mut self, qp: &mut Qp, transmit: bool) {
        if transmit && !qp.marks.ready && qp.may_transmit() {
            qp.marks.ready = true;
            self.ready.push_back(qp.qpn);
        }
        if !qp.marks.local && qp.has_local_head() {
            qp.marks.local = true;
            self.local.push_back(qp.qpn);
        }
        let deadline = qp.poll_timeout();
        if deadline != qp.marks.timer {
            if qp.marks.timer.is_some() {
                self.armed -= 1;
                self.maybe_stale = true;
            }
            if let Some(at) = deadline {
                self.armed += 1;
                self.timers.push(Reverse((at, qp.qpn)));
            }
            qp.marks.timer = deadline;
        }
    }

    /// The timer entry `(deadline, qpn)` was taken off the heap: if it was the QP's live
    /// one, the QP has no entry left.
    pub fn timer_taken(&mut self, qp: &mut Qp, deadline: u64) -> bool {
        if qp.marks.timer != Some(deadline) {
            return false;
        }
        qp.marks.timer = None;
        self.armed -= 1;
        self.maybe_stale = true;
        true
    }

    /// Entries were taken off the heap, or QPs that had entries are gone, out of `note`'s
    /// sight: the next `tidy_timers` looks at the top.
    pub fn timers_changed(&mut self) {
        self.maybe_stale = true;
    }

    /// Drops stale entries from the top of the timer heap (`live` says whether an entry is
    /// its QP's live one), and rebuilds the heap when stale entries outnumber live ones,
    /// so it stays within twice the QPs with a timer (amortised, a few entries per entry
    /// pushed). Returns the entries looked at besides the live top.
    #[inline]
    pub fn tidy_timers(&mut self, live: impl Fn(u64, u32) -> bool) -> u64 {
        // Every entry point ends here: the common case, nothing to do, costs no call.
        if self.maybe_stale || self.timers.len() > 2 * self.armed + 64 {
            self.tidy_timers_now(live)
        } else {
            0
        }
    }

    /// [`Schedule::tidy_timers`] when there is something to look at.
    #[inline(never)]
    fn tidy_timers_now(&mut self, live: impl Fn(u64, u32) -> bool) -> u64 {
        let mut looked = 0;
        if self.timers.len() > 2 * self.armed + 64 {
            looked += self.timers.len() as u64;
            self.timers.retain(|&Reverse((at, qpn))| live(at, qpn));
        }
        if !std::mem::take(&mut self.maybe_stale) {
            return looked;
        }
        while let Some(&Reverse((at, qpn))) = self.timers.peek() {
            if live(at, qpn) {
                break;
            }
            looked += 1;
            self.timers.pop();
        }
        looked
    }

    /// The earliest deadline of all QPs (the top of the heap is live after every entry
    /// point).
    pub fn earliest(&self) -> Option<u64> {
        self.timers.peek().map(|&Reverse((at, _))| at)
    }
}
