//! The per-peer congestion window: how many request packets the RC QPs of this engine may
//! have unacknowledged towards one destination, all QPs together.
//!
//! Each RC QP already bounds its own unacknowledged PSNs (`EngineConfig::max_unacked_psns`,
//! reference §2.2); nothing bounded their sum, so hundreds of QPs to one peer could put
//! tens of thousands of packets in flight and overflow the peer's receive buffer, every
//! overflow costing a go-back-N retransmission. Here the RC QPs in RTS or SQD whose path
//! leads to one destination GID (`ah_attr.dgid`) are the *members* of that peer's
//! [`Peer`] entry, and:
//!
//! - **What counts.** A member's charge is its unacknowledged request PSNs,
//!   `req_psn − comp_psn` (a READ counts one per response packet, as it consumes PSNs).
//!   Responses (ACKs, NAKs, read responses, atomic ACKs) are never held: the responder
//!   sends them before any request of its QP and they are not charged.
//! - **The rule.** A request packet consuming `n` PSNs may leave a QP only if the peer's
//!   charges plus `n` stay within `cwnd` — or if no answer is coming that would open it
//!   for the QP: when the QP has packets in flight none of which will be answered (only
//!   packets without AckReq), or when nothing is in flight to the peer at all (a READ
//!   needing more PSNs than `cwnd`). Then it may send one more, with AckReq set (the
//!   requester's `Qp::answer_end`). So a QP never waits for a local ACK timeout to hear of
//!   packets the window stranded (a WRITE FIRST without AckReq, behind a window other QPs
//!   filled), and the engine always progresses, whatever the window. A QP with nothing in
//!   flight while other QPs have packets out waits for their answers to wake it (below):
//!   so thousands of QPs posting at once put `cwnd` packets on the wire, not one each.
//!   Only a QP already charged for packets sends beyond the window, at most one such
//!   packet (one READ) unanswered each, so the peer's sum stays within about twice
//!   `cwnd`, whatever the number of members.
//! - **Growth** (RFC 5681 §3.1, counted in packets instead of bytes): every PSN newly
//!   acknowledged (`comp_psn` moving forward) adds one to `cwnd` while `cwnd < ssthresh`
//!   (slow start), and one per `cwnd` acknowledged PSNs above it (congestion avoidance),
//!   up to `max_cwnd_packets`.
//! - **Reduction**: a loss signal from a member — a local ACK timeout, a NAK PSN sequence
//!   error, an implied NAK or an out-of-order read response, every cause of a go-back-N
//!   (RFC 5681 §3.1 and §3.2: loss means congestion) — sets
//!   `ssthresh = cwnd = max(cwnd / 2, min_cwnd_packets)`. An RNR NAK is not a loss (the
//!   peer had no receive posted) and changes nothing. **At most one reduction per
//!   recovery episode**: after a reduction no other loss signal reduces the window until
//!   as many PSNs have been acknowledged as were in flight at the reduction (the counted
//!   form of RFC 6582's recovery point), so the burst of timeouts and NAKs one overflow
//!   causes on many QPs halves the window once.
//! - **Exactness.** Every QP's charge, with the `comp_psn` it was taken at, is kept here;
//!   after every engine entry point that may touch a QP (posting, packets, transmits,
//!   timers, local operations, modify, destroy) the engine calls [`Windows::sync`], which
//!   compares the charge with what the QP has in flight now and moves the difference.
//!   [`Windows::check`] recomputes every sum from the QPs (the simulator's invariant).
//!   An entry lives while it has members: the table holds at most one entry per QP.
//! - **Waking the held QPs.** A QP the window held ([`Windows::hold`]) is listed, in order,
//!   in its peer's `held` list, tagged with the peer's *opening count* (`epoch`), which
//!   grows by one each time the window's free room (`cwnd − in_flight`) grows. When the
//!   room grows by `n` packets, the first `n` QPs listed before that opening are handed
//!   back to the engine's schedule (`sched.rs`) to try again; one that is held again, while
//!   room is left, hands over the next (a READ needing more PSNs than are free must not
//!   keep a one-packet SEND waiting). A QP listed since the last opening was held with at
//!   least as much room as there is now, so it is not woken until the room grows. A QP
//!   with packets of its own in flight does not depend on being woken (the rule above
//!   lets it send once they are answered, and that answer runs it); one with nothing in
//!   flight does, and is: it was held only while other QPs had packets out, and every
//!   answer to them, or a timeout rewinding them, grows the room.

use std::collections::{BTreeMap, VecDeque};

use rustc_hash::FxHashMap;

use crate::output::Counters;
use crate::psn;
use crate::qp::Qp;
use crate::types::{EngineConfig, QpState, QpType};

/// One peer's window as [`Engine::peer_window`](crate::Engine::peer_window) reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerWindow {
    /// The congestion window, in request packets (PSNs).
    pub cwnd: u32,
    /// The slow-start threshold: below it the window grows by one per acknowledged packet.
    pub ssthresh: u32,
    /// Unacknowledged request PSNs of the peer's QPs, all together.
    pub in_flight: u32,
    /// The RC QPs in RTS or SQD whose path leads to this peer.
    pub qps: u32,
}

/// The window state of one destination GID.
#[derive(Clone, Debug)]
struct Peer {
    cwnd: u32,
    ssthresh: u32,
    in_flight: u32,
    members: u32,
    /// PSNs acknowledged since the entry was made.
    acked_total: u64,
    /// Acknowledged PSNs counted towards the next one-packet growth above `ssthresh`.
    avoidance_acked: u32,
    /// While `acked_total` is below this, a loss signal does not reduce the window again.
    recover_at: u64,
    /// Times the free room `cwnd − in_flight` grew (module doc: waking the held QPs).
    epoch: u64,
    /// The QPs held, in order, with the `epoch` they were held at; an entry whose QP's
    /// charge no longer names that epoch (woken, sent since, left) is stale and skipped.
    held: VecDeque<(u32, u64)>,
}

/// What [`Windows::room`] tells a QP about its peer's window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Room {
    /// How many PSNs the QP may have unacknowledged, its own included.
    pub psns: u32,
    /// Whether other QPs have packets unacknowledged towards the peer: their answers open
    /// the window and wake the QPs it held.
    pub others_in_flight: bool,
}

/// What a QP is charged to its peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Charge {
    dgid: [u8; 16],
    /// The slot of the peer of `dgid` in [`Windows::peers`] (while the charge exists, the
    /// peer has it as a member, so the slot stays its).
    peer: u32,
    psns: u32,
    /// The QP's `comp_psn` when the charge was taken: how acknowledgments are counted.
    comp_psn: u32,
    /// The peer's `epoch` when the window held this QP, while it is listed as held.
    held: Option<u64>,
}

/// The window limits of a config, made consistent: `1 <= min <= initial <= max`.
fn limits(config: &EngineConfig) -> (u32, u32, u32) {
    let min = config.min_cwnd_packets.max(1);
    let max = config.max_cwnd_packets.max(min);
    (min, config.initial_cwnd_packets.clamp(min, max), max)
}

/// Every peer's window and every QP's charge (module doc).
///
/// Every packet an RC QP sends or is acknowledged for, and every verb that runs one, looks
/// at its charge and its peer (`sync`, `room`, `hold`, `unhold`): both are found by index,
/// without hashing. A QP the window governed once keeps a slot in `charges`
/// ([`Qp::window_slot`], kept across a reset) until it is destroyed; a charge keeps the
/// slot of its peer in `peers`. The GID and QPN tables are looked up only when a QP joins
/// or leaves a peer and when a held QP is woken.
#[derive(Debug, Default)]
pub(crate) struct Windows {
    /// Every peer's window, by slot (`None`: a free slot, listed in `free_peers`). Walked
    /// only by `check`, in GID order.
    peers: Vec<Option<Peer>>,
    free_peers: Vec<u32>,
    /// The slot of every peer in `peers`, by GID.
    peer_slots: FxHashMap<[u8; 16], u32>,
    /// Every governed QP's charge, by the QP's slot (`None`: not governed now, or a free
    /// slot, listed in `free_slots`).
    charges: Vec<Option<Charge>>,
    free_slots: Vec<u32>,
    /// The slot of every QP that has one, by QPN: how a held list's entries (QPNs) find
    /// their charge, and how a destroyed QP's slot is freed.
    slots: FxHashMap<u32, u32>,
}

/// The peer a QP's requests count against and how many PSNs it has in flight; `None` for
/// a QP the window does not govern (UC, UD, or an RC QP outside RTS and SQD).
fn member_of(qp: &Qp) -> Option<([u8; 16], u32)> {
    governed(qp).then(|| (qp.attr.ah_attr.dgid, in_flight(qp)))
}

/// Whether the window governs `qp`: an RC QP in RTS or SQD.
fn governed(qp: &Qp) -> bool {
    qp.init.qp_type == QpType::Rc && matches!(qp.state, QpState::Rts | QpState::Sqd)
}

/// The PSNs `qp` has unacknowledged.
fn in_flight(qp: &Qp) -> u32 {
    psn::diff(qp.req_psn, qp.comp_psn).max(0) as u32
}

/// Wakes up to `n` QPs of `peer`'s held list (the peer of `dgid`) that were held before
/// its last opening.
fn wake(
    peer: &mut Peer,
    charges: &mut [Option<Charge>],
    slots: &FxHashMap<u32, u32>,
    dgid: &[u8; 16],
    mut n: usize,
    counters: &mut Counters,
    woken: &mut Vec<u32>,
) {
    while n > 0 {
        // Entries are in the order of their epochs: one held since the last opening ends
        // the search.
        let Some(&(qpn, epoch)) = peer.held.front().filter(|(_, e)| *e < peer.epoch) else {
            break;
        };
        peer.held.pop_front();
        counters.qps_visited += 1;
        let charge = slots
            .get(&qpn)
            .and_then(|&slot| charges.get_mut(slot as usize))
            .and_then(Option::as_mut);
        let Some(charge) = charge else {
            continue;
        };
        if charge.dgid == *dgid && charge.held == Some(epoch) {
            charge.held = None;
            woken.push(qpn);
            n -= 1;
        }
    }
}

impl Windows {
    /// `qp`'s charge, if it has one.
    fn charge(&self, qp: &Qp) -> Option<&Charge> {
        let slot = qp.window_slot?;
        self.charges.get(slot as usize)?.as_ref()
    }

    /// `qp`'s charge, mutable.
    fn charge_mut(&mut self, qp: &Qp) -> Option<&mut Charge> {
        let slot = qp.window_slot?;
        self.charges.get_mut(slot as usize)?.as_mut()
    }

    /// The peer at `slot`.
    fn peer(&self, slot: u32) -> Option<&Peer> {
        self.peers.get(slot as usize)?.as_ref()
    }

    /// The peer of `dgid`: its slot and window.
    fn peer_of(&mut self, dgid: &[u8; 16]) -> Option<(u32, &mut Peer)> {
        let slot = *self.peer_slots.get(dgid)?;
        Some((slot, self.peers.get_mut(slot as usize)?.as_mut()?))
    }

    /// How many PSNs `qp` may have unacknowledged, its own included, before its peer's
    /// window is full, and whether other QPs have packets in flight to that peer; `None`
    /// when the window does not govern it.
    pub(crate) fn room(&self, qp: &Qp, config: &EngineConfig) -> Option<Room> {
        if !governed(qp) {
            return None;
        }
        let dgid = &qp.attr.ah_attr.dgid;
        // A synced QP's charge names its peer (every entry point syncs the QPs it ran);
        // the GID's table serves any other.
        let (own, peer) = match self.charge(qp) {
            Some(c) if c.dgid == *dgid => (c.psns, self.peer(c.peer)),
            _ => (0, None),
        };
        let peer = peer.or_else(|| self.peer_slots.get(dgid).and_then(|&slot| self.peer(slot)));
        Some(match peer {
            Some(peer) => {
                let others = peer.in_flight.saturating_sub(own);
                Room {
                    psns: peer.cwnd.saturating_sub(others),
                    others_in_flight: others > 0,
                }
            }
            None => Room {
                psns: limits(config).1,
                others_in_flight: false,
            },
        })
    }

    /// Brings `qp`'s charge up to date with what it has in flight now, counting the PSNs
    /// acknowledged since the last sync (growth) and its pending loss signal (reduction)
    /// against the peer it was charged to. QPs held by a window that opened are pushed to
    /// `woken`.
    #[inline]
    pub(crate) fn sync(
        &mut self,
        qp: &mut Qp,
        config: &EngineConfig,
        counters: &mut Counters,
        woken: &mut Vec<u32>,
    ) {
        // Most calls change nothing (a verb, a packet that moved no PSN): a QP the window
        // does not govern and never did, or one whose charge is what it has in flight, with
        // no loss to report. Checked inline; `sync_changed` does the rest.
        if !qp.window_loss {
            let charge = qp
                .window_slot
                .and_then(|slot| self.charges.get(slot as usize))
                .and_then(Option::as_ref);
            let unchanged = match charge {
                None => !governed(qp),
                Some(c) => {
                    governed(qp)
                        && c.dgid == qp.attr.ah_attr.dgid
                        && c.psns == in_flight(qp)
                        && c.comp_psn == qp.comp_psn
                }
            };
            if unchanged {
                return;
            }
        }
        self.sync_changed(qp, config, counters, woken);
    }

    /// [`Windows::sync`] once something may have changed.
    #[inline(never)]
    fn sync_changed(
        &mut self,
        qp: &mut Qp,
        config: &EngineConfig,
        counters: &mut Counters,
        woken: &mut Vec<u32>,
    ) {
        let loss = std::mem::take(&mut qp.window_loss);
        // The common cases first, without a lookup: a QP the window does not govern and
        // never did, and a member that stays with the same peer (every packet an RC QP in
        // RTS sends or is acknowledged for). They do what the general path below does for
        // them, in the same order.
        let governed = governed(qp);
        let charge = match qp.window_slot {
            Some(slot) => self.charges.get_mut(slot as usize).and_then(Option::as_mut),
            None => None,
        };
        match charge {
            None if !governed => return,
            Some(c) if governed && c.dgid == qp.attr.ah_attr.dgid => {
                let psns = in_flight(qp);
                if c.psns == psns && c.comp_psn == qp.comp_psn && !loss {
                    return;
                }
                let peer = self.peers.get_mut(c.peer as usize).and_then(Option::as_mut);
                if let Some(peer) = peer {
                    let old = *c;
                    c.psns = psns;
                    c.comp_psn = qp.comp_psn;
                    let before = peer.room();
                    let acked = psn::diff(qp.comp_psn, old.comp_psn);
                    if acked > 0 {
                        peer.on_acked(acked as u32, config);
                    }
                    if loss {
                        peer.on_loss(config, counters, qp.qpn);
                    }
                    peer.in_flight = peer.in_flight.saturating_sub(old.psns).saturating_add(psns);
                    peer.members = peer.members.saturating_sub(1) + 1;
                    let grown = peer.room() - before;
                    if grown > 0 {
                        peer.epoch += 1;
                        wake(
                            peer,
                            &mut self.charges,
                            &self.slots,
                            &old.dgid,
                            grown as usize,
                            counters,
                            woken,
                        );
                    }
                    return;
                }
            }
            _ => {}
        }
        self.sync_general(qp, loss, config, counters, woken);
    }

    /// [`Windows::sync`] for every case: the QP joins, leaves or changes peer, or its
    /// charge names a peer without an entry.
    fn sync_general(
        &mut self,
        qp: &mut Qp,
        loss: bool,
        config: &EngineConfig,
        counters: &mut Counters,
        woken: &mut Vec<u32>,
    ) {
        let now = member_of(qp);
        let old = self.charge(qp).copied();
        let unchanged = match (old, now) {
            (Some(c), Some((dgid, psns))) => {
                c.dgid == dgid && c.psns == psns && c.comp_psn == qp.comp_psn
            }
            (None, None) => true,
            _ => false,
        };
        if unchanged && !loss {
            return;
        }
        let old_room = old.and_then(|c| Some((c.dgid, self.peer_of(&c.dgid)?.1.room())));
        if let Some(c) = old {
            if let Some((slot, peer)) = self.peer_of(&c.dgid) {
                let acked = psn::diff(qp.comp_psn, c.comp_psn);
                if acked > 0 {
                    peer.on_acked(acked as u32, config);
                }
                if loss {
                    peer.on_loss(config, counters, qp.qpn);
                }
                peer.in_flight = peer.in_flight.saturating_sub(c.psns);
                peer.members = peer.members.saturating_sub(1);
                if peer.members == 0 && now.is_none_or(|(dgid, _)| dgid != c.dgid) {
                    self.peers[slot as usize] = None;
                    self.free_peers.push(slot);
                    self.peer_slots.remove(&c.dgid);
                }
            }
        }
        match now {
            Some((dgid, psns)) => {
                let slot = match self.peer_slots.get(&dgid) {
                    Some(&slot) => slot,
                    None => {
                        let (_, initial, max) = limits(config);
                        let peer = Peer {
                            cwnd: initial,
                            ssthresh: max,
                            in_flight: 0,
                            members: 0,
                            acked_total: 0,
                            avoidance_acked: 0,
                            recover_at: 0,
                            epoch: 0,
                            held: VecDeque::new(),
                        };
                        let slot = put(&mut self.peers, &mut self.free_peers, peer);
                        self.peer_slots.insert(dgid, slot);
                        slot
                    }
                };
                if let Some(peer) = self.peers[slot as usize].as_mut() {
                    peer.in_flight = peer.in_flight.saturating_add(psns);
                    peer.members += 1;
                }
                let held = old.filter(|c| c.dgid == dgid).and_then(|c| c.held);
                let charge = Charge {
                    dgid,
                    peer: slot,
                    psns,
                    comp_psn: qp.comp_psn,
                    held,
                };
                match qp.window_slot {
                    Some(own) => self.charges[own as usize] = Some(charge),
                    None => {
                        let own = put(&mut self.charges, &mut self.free_slots, charge);
                        self.slots.insert(qp.qpn, own);
                        qp.window_slot = Some(own);
                    }
                }
            }
            None => {
                if let Some(own) = qp.window_slot {
                    self.charges[own as usize] = None;
                }
            }
        }
        if let Some((dgid, before)) = old_room {
            self.opened(dgid, before, counters, woken);
        }
    }

    /// After `dgid`'s window changed from `before` packets of free room: if it grew, a new
    /// opening, and as many held QPs as packets it grew by are woken.
    fn opened(
        &mut self,
        dgid: [u8; 16],
        before: i64,
        counters: &mut Counters,
        woken: &mut Vec<u32>,
    ) {
        let Some((slot, peer)) = self.peer_of(&dgid) else {
            return;
        };
        let grown = peer.room() - before;
        if grown > 0 {
            peer.epoch += 1;
            self.wake(slot, &dgid, grown as usize, counters, woken);
        }
    }

    /// Wakes up to `n` QPs of the held list of the peer of `dgid` (at `slot`) that were
    /// held before its last opening.
    fn wake(
        &mut self,
        slot: u32,
        dgid: &[u8; 16],
        n: usize,
        counters: &mut Counters,
        woken: &mut Vec<u32>,
    ) {
        let Some(peer) = self.peers.get_mut(slot as usize).and_then(Option::as_mut) else {
            return;
        };
        wake(
            peer,
            &mut self.charges,
            &self.slots,
            dgid,
            n,
            counters,
            woken,
        );
    }

    /// The window held `qp`'s next request (its `poll_transmit` returned nothing for
    /// that reason, and its charge is synced): it is listed as held. If room is left (it
    /// needed more PSNs than are free), the next QP held before the last opening is woken.
    pub(crate) fn hold(&mut self, qp: &Qp, counters: &mut Counters, woken: &mut Vec<u32>) {
        let Some(Some(charge)) = qp
            .window_slot
            .and_then(|slot| self.charges.get_mut(slot as usize))
        else {
            return;
        };
        let dgid = charge.dgid;
        let Some(peer) = self
            .peers
            .get_mut(charge.peer as usize)
            .and_then(Option::as_mut)
        else {
            return;
        };
        charge.held = Some(peer.epoch);
        peer.held.push_back((qp.qpn, peer.epoch));
        if peer.room() > 0 {
            wake(
                peer,
                &mut self.charges,
                &self.slots,
                &dgid,
                1,
                counters,
                woken,
            );
        }
    }

    /// `qp` is no longer held (it sent, or had nothing to send): its entry in the held
    /// list goes stale.
    pub(crate) fn unhold(&mut self, qp: &Qp) {
        if let Some(charge) = self.charge_mut(qp) {
            charge.held = None;
        }
    }

    /// Whether `qp` is listed as held by its peer's window; `Some(true)` if it would be
    /// held again: it was held since the window's last opening (with at least the room
    /// there is now), or the window has no room (and the QP, unchanged since it was held,
    /// still has an answer coming).
    pub(crate) fn held(&self, qp: &Qp) -> Option<bool> {
        let charge = self.charge(qp)?;
        let epoch = charge.held?;
        Some(
            self.peer(charge.peer)
                .is_some_and(|p| p.epoch == epoch || p.room() <= 0),
        )
    }

    /// Forgets a destroyed QP's charge and frees its slot; QPs held by the room it frees
    /// are pushed to `woken`.
    pub(crate) fn release(&mut self, qpn: u32, counters: &mut Counters, woken: &mut Vec<u32>) {
        let Some(own) = self.slots.remove(&qpn) else {
            return;
        };
        let charge = self.charges[own as usize].take();
        self.free_slots.push(own);
        let Some(c) = charge else {
            return;
        };
        if let Some((slot, peer)) = self.peer_of(&c.dgid) {
            let before = peer.room();
            peer.in_flight = peer.in_flight.saturating_sub(c.psns);
            peer.members = peer.members.saturating_sub(1);
            if peer.members == 0 {
                self.peers[slot as usize] = None;
                self.free_peers.push(slot);
                self.peer_slots.remove(&c.dgid);
            } else {
                self.opened(c.dgid, before, counters, woken);
            }
        }
    }

    /// The window towards `dgid`, if a QP of this engine is connected there.
    pub(crate) fn window(&self, dgid: &[u8; 16]) -> Option<PeerWindow> {
        let p = self.peer(*self.peer_slots.get(dgid)?)?;
        Some(PeerWindow {
            cwnd: p.cwnd,
            ssthresh: p.ssthresh,
            in_flight: p.in_flight,
            qps: p.members,
        })
    }

    /// Recomputes every charge and sum from `qps` and compares; checks the slots too.
    pub(crate) fn check<'a>(&self, qps: impl Iterator<Item = &'a Qp>) -> Result<(), String> {
        let mut sums: BTreeMap<[u8; 16], (u32, u32)> = BTreeMap::new();
        for qp in qps {
            if qp.window_slot != self.slots.get(&qp.qpn).copied() {
                return Err(format!(
                    "QP {:#x}: window slot {:?}, the table says {:?}",
                    qp.qpn,
                    qp.window_slot,
                    self.slots.get(&qp.qpn)
                ));
            }
            let now = member_of(qp);
            let charge = self.charge(qp);
            let charged = charge.map(|c| (c.dgid, c.psns));
            if now != charged {
                return Err(format!(
                    "QP {:#x}: charged {charged:?} to its peer window, has {now:?} in flight",
                    qp.qpn
                ));
            }
            if let Some(c) = charge {
                if self.peer_slots.get(&c.dgid) != Some(&c.peer) {
                    return Err(format!(
                        "QP {:#x}: charged to peer slot {}, its GID's is {:?}",
                        qp.qpn,
                        c.peer,
                        self.peer_slots.get(&c.dgid)
                    ));
                }
            }
            if let Some((dgid, psns)) = now {
                let sum = sums.entry(dgid).or_default();
                sum.0 += psns;
                sum.1 += 1;
            }
        }
        let charged = self.charges.iter().flatten().count();
        if charged != sums.values().map(|s| s.1 as usize).sum::<usize>() {
            return Err("a destroyed QP is still charged to a peer window".into());
        }
        let mut peers: Vec<(&[u8; 16], &Peer)> = self
            .peer_slots
            .iter()
            .filter_map(|(dgid, &slot)| Some((dgid, self.peer(slot)?)))
            .collect();
        if peers.len() != self.peers.iter().flatten().count() {
            return Err("a peer window is not in the GID table".into());
        }
        peers.sort_unstable_by_key(|&(dgid, _)| dgid);
        for (dgid, peer) in peers {
            let (in_flight, members) = sums.get(dgid).copied().unwrap_or_default();
            if (peer.in_flight, peer.members) != (in_flight, members) {
                return Err(format!(
                    "peer {dgid:02x?}: window counts {} PSNs of {} QPs, the QPs have {in_flight} of {members}",
                    peer.in_flight, peer.members
                ));
            }
        }
        if sums.keys().any(|dgid| !self.peer_slots.contains_key(dgid)) {
            return Err("a QP is charged to a peer without a window".into());
        }
        Ok(())
    }
}

/// Puts `item` in a free slot of `table` (listed in `free`), or a new one; returns the slot.
fn put<T>(table: &mut Vec<Option<T>>, free: &mut Vec<u32>, item: T) -> u32 {
    match free.pop() {
        Some(slot) => {
            table[slot as usize] = Some(item);
            slot
        }
        None => {
            table.push(Some(item));
            (table.len() - 1) as u32
        }
    }
}

impl Peer {
    /// Free room: packets the window admits beyond those in flight (negative when QPs sent
    /// beyond it, or after a reduction).
    fn room(&self) -> i64 {
        i64::from(self.cwnd) - i64::from(self.in_flight)
    }

    /// `acked` PSNs newly acknowledged: slow start below `ssthresh`, congestion avoidance
    /// above (RFC 5681 §3.1).
    fn on_acked(&mut self, acked: u32, config: &EngineConfig) {
        let (_, _, max) = limits(config);
        self.acked_total += u64::from(acked);
        if self.cwnd < self.ssthresh {
            self.cwnd = self.cwnd.saturating_add(acked).min(max);
            return;
        }
        self.avoidance_acked = self.avoidance_acked.saturating_add(acked);
        while self.avoidance_acked >= self.cwnd && self.cwnd < max {
            self.avoidance_acked -= self.cwnd;
            self.cwnd += 1;
        }
        if self.cwnd >= max {
            self.avoidance_acked = 0;
        }
    }

    /// A loss signal: halve the window, once per recovery episode (module doc).
    fn on_loss(&mut self, config: &EngineConfig, counters: &mut Counters, qpn: u32) {
        if self.acked_total < self.recover_at {
            return;
        }
        let (min, _, _) = limits(config);
        let cwnd = (self.cwnd / 2).max(min);
        tracing::debug!(
            qpn,
            from = self.cwnd,
            to = cwnd,
            in_flight = self.in_flight,
            "loss: the peer's congestion window is halved"
        );
        self.ssthresh = cwnd;
        self.cwnd = cwnd;
        self.avoidance_acked = 0;
        self.recover_at = self.acked_total + u64::from(self.in_flight.max(1));
        counters.cwnd_reductions += 1;
    }
}
