//! [`Engine`]: the sans-IO engine of one device port — its QPs and SRQs, the packet
//! demultiplexer, and the `poll_*` outputs.

use std::collections::{HashSet, VecDeque};

use rustc_hash::FxHashMap;

use crate::codec::{self, ParseError};
use crate::error::{Capacity, Object, Queue, VerbsError};
use crate::gsi::{Gsi, GsiMad, GSI_QPN};
use crate::mcast::{is_multicast_gid, Groups, MULTICAST_QPN};
use crate::memory::Memory;
use crate::output::{AsyncEvent, Completion, Counters, CqTarget, DropReason, Transmit};
use crate::qp::{ack_timeout_ns, Ctx, Qp};
use crate::sched::Schedule;
use crate::srq::{Srq, SrqInit};
use crate::types::{AddressVector, AttrMask, EngineConfig, QpAttr, QpInit, QpState, QpType, SrqId};
use crate::window::{PeerWindow, Windows};
use crate::wr::{RecvWr, SendWr};

/// The queue-pair engine of one device: every QP and SRQ, no I/O.
///
/// # Calling contract
///
/// - Time is a `now: u64` in nanoseconds from any fixed origin, never decreasing across
///   calls. The engine never reads a clock.
/// - Verbs (`create_qp`, `modify_qp`, `post_send`, `post_recv`, SRQ calls) may be called at
///   any time; they validate their arguments and return a [`VerbsError`] instead of
///   panicking.
/// - Feed every received RoCEv2 transport packet (BTH onward, ICRC included and already
///   verified by the caller) to [`handle_packet`](Self::handle_packet). For UD, pass the
///   40 bytes the receive buffer's GRH area must hold (reference §3.4).
/// - After any input, drain the outputs: [`execute_local_operations`](Self::execute_local_operations)
///   and [`poll_transmit`](Self::poll_transmit) until neither does anything (each call of the latter writes one packet into the caller's buffer, which must hold
///   [`max_packet_len`](Self::max_packet_len) bytes), [`poll_completion`](Self::poll_completion),
///   [`poll_event`](Self::poll_event).
/// - Call [`handle_timeout`](Self::handle_timeout) when the clock reaches
///   [`poll_timeout`](Self::poll_timeout) (calling it early is harmless).
/// - The outputs cost what the QPs with work cost, not the number of QPs: they visit only
///   the QPs their schedule lists (`sched.rs`; [`Counters::qps_visited`] counts the visits,
///   [`check_schedule`](Self::check_schedule) checks the lists).
/// - Memory is reached only through the [`Memory`] passed to each call; the engine keeps no
///   reference to it.
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    /// Every QP by its number. Every packet and every verb finds its QP here in O(1): a
    /// hash table whose hash of a QPN is one multiply and one rotate (FxHash), where a
    /// `BTreeMap` search grew with the number of QPs (issue #15). No random state, so the
    /// same calls build the same table; its order is not the QPNs', and nothing follows
    /// it: the walks over every QP (the `check_*` methods) go in QPN order
    /// (`qps_in_order`) and `handle_timeout` sorts the QPs it fires.
    qps: FxHashMap<u32, Qp>,
    /// Every SRQ by its number (numbered from 1, never reused), looked up by each message
    /// an SRQ's QP receives (`Qp::take_recv`): a hash table as `qps`, never walked.
    srqs: FxHashMap<u32, Srq>,
    next_qpn: u32,
    next_srq: u32,
    completions: VecDeque<Completion>,
    events: VecDeque<AsyncEvent>,
    counters: Counters,
    /// The QPs the outputs visit: ready to send, local operations, timers (`sched.rs`).
    schedule: Schedule,
    /// QPs a peer's window woke, to be listed as ready (scratch of `settle!` and `poll_transmit`).
    woken: Vec<u32>,
    /// QP1: management datagrams in and out (`gsi.rs`).
    gsi: Gsi,
    /// The per-peer congestion windows of the RC requesters (`window.rs`); every entry
    /// point that may change what a QP has in flight re-syncs that QP's charge.
    windows: Windows,
    /// The multicast groups the UD QPs are attached to (`mcast.rs`).
    groups: Groups,
    /// The shortest local ACK timeout an RC QP of this engine was given, in nanoseconds
    /// ([`Engine::shortest_ack_timeout_ns`]).
    shortest_ack_timeout: Option<u64>,
}

macro_rules! ctx {
    ($self:ident) => {
        Ctx {
            config: &$self.config,
            srqs: &mut $self.srqs,
            completions: &mut $self.completions,
            events: &mut $self.events,
            counters: &mut $self.counters,
        }
    };
}

/// After an entry point ran `$qp` (borrowed from `qps`, not looked up again): re-syncs its
/// charge to its peer's window, lists it where it now has work (`settle_qp`), lists the
/// QPs the window woke, and drops stale timers off the top.
macro_rules! settle {
    ($self:ident, $qp:expr) => {{
        settle_qp(
            $qp,
            &mut $self.windows,
            &mut $self.schedule,
            &$self.config,
            &mut $self.counters,
            &mut $self.woken,
        );
        $self.wake_held();
        $self.tidy_timers();
    }};
}

/// The size of one scatter/gather entry in a send WQE (`struct ibv_sge`), the unit of the
/// room a WQE has for inline data.
const SGE_BYTES: u32 = 16;

impl Engine {
    /// A new engine with no QPs.
    pub fn new(config: EngineConfig) -> Self {
        Engine {
            config,
            qps: FxHashMap::default(),
            srqs: FxHashMap::default(),
            next_qpn: config.first_qpn,
            next_srq: 1,
            completions: VecDeque::new(),
            events: VecDeque::new(),
            counters: Counters::default(),
            schedule: Schedule::default(),
            woken: Vec::new(),
            gsi: Gsi::default(),
            windows: Windows::default(),
            groups: Groups::default(),
            shortest_ack_timeout: None,
        }
    }

    /// The limits this engine enforces.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Largest packet `poll_transmit` writes (BTH + extension headers + MTU + pad + ICRC).
    pub fn max_packet_len(&self) -> usize {
        12 + 28 + 16 + self.config.port_mtu.bytes() as usize + 4
    }

    /// `ibv_create_qp`: a new QP in RESET; returns its number, never 0 or 1 (QP0 and QP1
    /// are the management QPs, IBTA 13.5; QP1 is the engine's own, [`Engine::poll_gsi`]).
    ///
    /// The capacities the QP gets may exceed those asked for (`ibv_create_qp(3)`: "the
    /// actual values … may be greater"): as rxe, a send WQE has room for at least
    /// `max_send_sge` scatter/gather entries of 16 bytes, and that room carries inline data
    /// too, so `max_inline_data` is raised to `16 × max_send_sge` (within the device's
    /// limit). The front doors report the capacities the QP got.
    pub fn create_qp(&mut self, mut init: QpInit) -> Result<u32, VerbsError> {
        let c = &init.caps;
        let limits = [
            (
                Capacity::QueueDepth,
                c.max_send_wr.max(c.max_recv_wr),
                self.config.max_qp_wr,
            ),
            (
                Capacity::SgeCount,
                c.max_send_sge.max(c.max_recv_sge),
                self.config.max_sge,
            ),
            (
                Capacity::InlineData,
                c.max_inline_data,
                self.config.max_inline_data,
            ),
        ];
        for (what, requested, max) in limits {
            if requested > max {
                return Err(VerbsError::CapacityAboveLimit {
                    what,
                    requested,
                    max,
                });
            }
        }
        if let Some(id) = init.srq {
            if !self.srqs.contains_key(&id.0) {
                return Err(no_srq(id));
            }
        }
        let wqe_room = init.caps.max_send_sge.saturating_mul(SGE_BYTES);
        init.caps.max_inline_data = init
            .caps
            .max_inline_data
            .max(wqe_room.min(self.config.max_inline_data));
        let usable = self.config.qpn_range.usable();
        let size = usable.end.saturating_sub(usable.start);
        let mut qpn = self.next_qpn;
        // At most one look at each number of the range: all taken is ENOMEM.
        let mut looked = 0;
        while !usable.contains(&qpn) || self.qps.contains_key(&qpn) {
            if looked >= size {
                return Err(VerbsError::TooManyObjects {
                    object: Object::Qp,
                    max: size,
                });
            }
            if usable.contains(&qpn) {
                looked += 1;
            }
            qpn = if usable.contains(&qpn.wrapping_add(1)) {
                qpn + 1
            } else {
                usable.start
            };
        }
        self.next_qpn = qpn + 1;
        if let Some(srq) = init.srq.and_then(|id| self.srqs.get_mut(&id.0)) {
            srq.users += 1;
        }
        self.qps.insert(qpn, Qp::new(qpn, init));
        Ok(qpn)
    }

    /// `ibv_destroy_qp`: forgets the QP (no completions are generated). A QP still attached
    /// to a multicast group is refused ([`VerbsError::InUse`], `EBUSY`, as the kernel's
    /// `uverbs_free_qp`: the application detaches first); [`Engine::detach_all_mcast`]
    /// detaches it when its owner goes away without doing so.
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<(), VerbsError> {
        if !self.qps.contains_key(&qpn) {
            return Err(no_qp(qpn));
        }
        let groups = self.groups.groups_of(qpn);
        if groups > 0 {
            return Err(VerbsError::InUse {
                object: Object::Qp,
                by: Object::McastGroup,
                count: groups,
            });
        }
        let qp = self.qps.remove(&qpn).ok_or(no_qp(qpn))?;
        // Its entries in the schedule's lists go stale: they name a QP that is gone.
        self.schedule.timers_changed();
        self.windows
            .release(qpn, &mut self.counters, &mut self.woken);
        self.wake_held();
        self.tidy_timers();
        tracing::debug!(qpn, state = ?qp.state, "QP destroyed");
        if let Some(id) = qp.init.srq {
            if let Some(srq) = self.srqs.get_mut(&id.0) {
                srq.users -= 1;
            }
        }
        Ok(())
    }

    /// `ibv_attach_mcast(3)`: attaches UD QP `qpn` to the multicast group `gid` (the LID
    /// of the call is ignored on RoCE: `mcast.rs`). Returns true if no QP of this engine
    /// was attached to the group before, so the caller starts receiving it. Refused for a
    /// QP that is not UD ([`VerbsError::MulticastNeedsUd`]), a GID that is not multicast
    /// ([`VerbsError::NotMulticast`]), both `EINVAL` as the kernel's `ib_attach_mcast`,
    /// and past the device's limits ([`VerbsError::TooManyObjects`], `ENOMEM` as rxe).
    /// Attaching twice succeeds and changes nothing.
    pub fn attach_mcast(&mut self, qpn: u32, gid: [u8; 16]) -> Result<bool, VerbsError> {
        self.check_mcast(qpn, &gid)?;
        self.groups.attach(gid, qpn)
    }

    /// `ibv_detach_mcast(3)`: detaches `qpn` from group `gid`. Returns true if no QP of this
    /// engine is attached to the group any more, so the caller stops receiving it. The
    /// same refusals as [`Engine::attach_mcast`], and [`VerbsError::NotAttached`] for a QP
    /// that is not attached (`EINVAL`).
    pub fn detach_mcast(&mut self, qpn: u32, gid: [u8; 16]) -> Result<bool, VerbsError> {
        self.check_mcast(qpn, &gid)?;
        self.groups.detach(gid, qpn)
    }

    /// Detaches `qpn` from every group it is attached to, as the kernel does for a process
    /// that exits with attachments; returns the groups nobody of this engine is attached to
    /// any more.
    pub fn detach_all_mcast(&mut self, qpn: u32) -> Vec<[u8; 16]> {
        self.groups.detach_all(qpn)
    }

    /// The checks `ib_attach_mcast` and `ib_detach_mcast` make before a driver sees the call.
    fn check_mcast(&self, qpn: u32, gid: &[u8; 16]) -> Result<(), VerbsError> {
        let qp = self.qps.get(&qpn).ok_or(no_qp(qpn))?;
        if !is_multicast_gid(gid) {
            return Err(VerbsError::NotMulticast { gid: *gid });
        }
        if qp.init.qp_type != QpType::Ud {
            return Err(VerbsError::MulticastNeedsUd {
                qp_type: qp.init.qp_type,
            });
        }
        Ok(())
    }

    /// Checks an address vector as `ibv_create_ah(3)` and `ibv_modify_qp(3)` do: port 1
    /// and a source GID index inside the GID table
    /// ([`VerbsError::BadSgidIndex`]). The QP's path goes through the same check.
    pub fn check_address_vector(&self, av: &AddressVector) -> Result<(), VerbsError> {
        crate::qp::check_address_vector(av, &self.config)
    }

    /// `ibv_modify_qp`: checks the transition and attribute mask against
    /// `ibv_modify_qp(3)` and applies all of it or nothing.
    pub fn modify_qp(&mut self, qpn: u32, attr: &QpAttr, mask: AttrMask) -> Result<(), VerbsError> {
        let qp = self.qps.get_mut(&qpn).ok_or(no_qp(qpn))?;
        let from = qp.state;
        let result = qp.modify(attr, mask, &mut ctx!(self));
        if result.is_ok() && qp.init.qp_type == QpType::Rc {
            if let Some(timeout) = ack_timeout_ns(qp.attr.timeout) {
                self.shortest_ack_timeout = Some(
                    self.shortest_ack_timeout
                        .map_or(timeout, |t| t.min(timeout)),
                );
            }
        }
        settle!(self, qp);
        if let Err(error) = &result {
            let to = mask.contains(AttrMask::STATE).then_some(attr.qp_state);
            tracing::debug!(qpn, ?from, ?to, %error, "modify_qp refused");
        }
        result
    }

    /// The shortest local ACK timeout (4.096 µs · 2^timeout, IBTA 9.7.6.1.3) any RC QP of
    /// this engine was given, destroyed ones included; `None` before the first. A device
    /// that takes its packets off the transport only now and then must look at least this
    /// often, or a peer with the same timeout retransmits what it had no answer to.
    pub fn shortest_ack_timeout_ns(&self) -> Option<u64> {
        self.shortest_ack_timeout
    }

    /// `ibv_query_qp`: current attributes (with `qp_state`) and creation parameters.
    pub fn query_qp(&self, qpn: u32) -> Result<(QpAttr, QpInit), VerbsError> {
        let qp = self.qps.get(&qpn).ok_or(no_qp(qpn))?;
        Ok((qp.query(), qp.init))
    }

    /// Makes a connected QP (RC, UC) cut its messages into packets of `bytes` of payload
    /// (and accept only packets cut so) instead of its path MTU; `None` goes back to the
    /// path MTU. For a peer whose packets never cross a wire — a QP of a device of this
    /// process, handed each packet in memory — a packet's size is bounded only by memory,
    /// and one packet per 32 or 64 KiB instead of per 4 KiB costs an eighth or a sixteenth
    /// of the headers, checks and hand-overs. Both QPs of a connection must use the same size: the PSNs a
    /// message takes depend on it (a READ's responses, IBTA vol. 1 §9.4.4). Set it before
    /// the QP sends or receives (the device does so as the QP enters RTR); `ibv_query_qp`
    /// still reports the path MTU. Refused for an unknown QP and for UD (whose messages are
    /// one packet each).
    pub fn set_segment_size(
        &mut self,
        qpn: u32,
        bytes: Option<std::num::NonZeroU32>,
    ) -> Result<(), VerbsError> {
        let qp = self.qps.get_mut(&qpn).ok_or(no_qp(qpn))?;
        if qp.init.qp_type == QpType::Ud {
            return Err(VerbsError::AttributesNotAllowed {
                extra: AttrMask::PATH_MTU,
            });
        }
        qp.segment = bytes.map(std::num::NonZeroU32::get);
        Ok(())
    }

    /// Current state of a QP.
    pub fn qp_state(&self, qpn: u32) -> Option<QpState> {
        self.qps.get(&qpn).map(|q| q.state)
    }

    /// `ibv_post_send` (one work request; a list is a loop that stops at the first error).
    pub fn post_send(&mut self, qpn: u32, wr: SendWr) -> Result<(), VerbsError> {
        let qp = self.qps.get_mut(&qpn).ok_or(no_qp(qpn))?;
        let result = qp.post_send(wr, &mut ctx!(self));
        settle!(self, qp);
        result
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, qpn: u32, wr: RecvWr) -> Result<(), VerbsError> {
        let qp = self.qps.get_mut(&qpn).ok_or(no_qp(qpn))?;
        let result = qp.post_recv(wr, &mut ctx!(self));
        settle!(self, qp);
        result
    }

    /// `ibv_create_srq`.
    pub fn create_srq(&mut self, init: SrqInit) -> Result<SrqId, VerbsError> {
        if init.max_wr == 0 || init.max_wr > self.config.max_qp_wr {
            return Err(VerbsError::CapacityAboveLimit {
                what: Capacity::SrqDepth,
                requested: init.max_wr,
                max: self.config.max_qp_wr,
            });
        }
        if init.max_sge > self.config.max_sge {
            return Err(VerbsError::CapacityAboveLimit {
                what: Capacity::SrqSgeCount,
                requested: init.max_sge,
                max: self.config.max_sge,
            });
        }
        if init.srq_limit > init.max_wr {
            return Err(VerbsError::SrqLimitAboveMaxWr {
                srq_limit: init.srq_limit,
                max_wr: init.max_wr,
            });
        }
        let id = self.next_srq;
        self.next_srq += 1;
        self.srqs.insert(id, Srq::new(init));
        Ok(SrqId(id))
    }

    /// `ibv_modify_srq` with `IBV_SRQ_LIMIT`: arms the limit event (0 disarms).
    pub fn arm_srq_limit(&mut self, srq: SrqId, limit: u32) -> Result<(), VerbsError> {
        let s = self.srqs.get_mut(&srq.0).ok_or(no_srq(srq))?;
        if limit > s.max_wr {
            return Err(VerbsError::SrqLimitAboveMaxWr {
                srq_limit: limit,
                max_wr: s.max_wr,
            });
        }
        s.limit = limit;
        Ok(())
    }

    /// `ibv_query_srq`: `(max_wr, max_sge, armed limit)`.
    pub fn query_srq(&self, srq: SrqId) -> Result<(u32, u32, u32), VerbsError> {
        let s = self.srqs.get(&srq.0).ok_or(no_srq(srq))?;
        Ok((s.max_wr, s.max_sge, s.limit))
    }

    /// `ibv_post_srq_recv`.
    pub fn post_srq_recv(&mut self, srq: SrqId, wr: RecvWr) -> Result<(), VerbsError> {
        let s = self.srqs.get_mut(&srq.0).ok_or(no_srq(srq))?;
        if wr.sg_list.len() > s.max_sge as usize {
            return Err(VerbsError::TooManySges {
                num_sge: wr.sg_list.len(),
                max: s.max_sge,
            });
        }
        if s.wqes.len() >= s.max_wr as usize {
            return Err(VerbsError::QueueFull { queue: Queue::Srq });
        }
        s.wqes.push_back(wr);
        Ok(())
    }

    /// `ibv_destroy_srq`: refused while QPs use it.
    pub fn destroy_srq(&mut self, srq: SrqId) -> Result<(), VerbsError> {
        let s = self.srqs.get(&srq.0).ok_or(no_srq(srq))?;
        if s.users > 0 {
            return Err(VerbsError::InUse {
                object: Object::Srq,
                by: Object::Qp,
                count: s.users,
            });
        }
        self.srqs.remove(&srq.0);
        Ok(())
    }

    /// One received transport packet (BTH through ICRC). Malformed or unexpected packets
    /// are dropped and counted ([`Counters::drops`]); nothing here panics.
    pub fn handle_packet(
        &mut self,
        now: u64,
        bytes: &[u8],
        grh: Option<&[u8; 40]>,
        mem: &mut impl Memory,
    ) {
        self.counters.packets_received += 1;
        let pkt = match codec::parse(bytes) {
            Ok(p) => p,
            Err(ParseError::UnknownOpcode) => {
                self.counters.drop_unparsed(DropReason::UnknownOpcode);
                return;
            }
            Err(_) => {
                self.counters.drop_unparsed(DropReason::Malformed);
                return;
            }
        };
        // Default partition only (reference §1.2).
        if pkt.hdr.bth.pkey & 0x7FFF != 0x7FFF {
            self.counters
                .drop_packet(DropReason::BadPkey, pkt.hdr.bth.dest_qp, pkt.hdr.bth.psn);
            return;
        }
        if pkt.hdr.bth.dest_qp == GSI_QPN {
            self.gsi.handle_packet(&pkt, grh, &mut self.counters);
            return;
        }
        if pkt.hdr.bth.dest_qp == MULTICAST_QPN {
            self.handle_multicast(now, &pkt, grh, mem);
            return;
        }
        let Some(qp) = self.qps.get_mut(&pkt.hdr.bth.dest_qp) else {
            self.counters
                .drop_packet(DropReason::UnknownQp, pkt.hdr.bth.dest_qp, pkt.hdr.bth.psn);
            return;
        };
        if let Some(grh) = grh {
            if qp.init.qp_type != QpType::Ud && !from_path(grh, &qp.attr.ah_attr.dgid) {
                // Only the connected peer may reach an RC or UC QP (IBTA 9.6.1.5: the
                // source address must be the QP's remote address; rxe's `check_addr`).
                // Checked before the QP sees the packet, so a forged request, response,
                // ACK or NAK moves no PSN, no timer and no byte.
                self.counters.drop_packet(
                    DropReason::OffPath,
                    pkt.hdr.bth.dest_qp,
                    pkt.hdr.bth.psn,
                );
                return;
            }
        }
        let mut ctx = ctx!(self);
        if pkt.info.is_response() {
            qp.on_response(now, &pkt, mem, &mut ctx);
        } else {
            qp.on_request(now, &pkt, grh, mem, &mut ctx);
        }
        settle!(self, qp);
    }

    /// A multicast packet: a copy to every QP attached to the group its GRH names
    /// (`mcast.rs`), each checking its state, transport and Q_Key as for a unicast
    /// datagram; nobody attached, it is dropped ([`DropReason::UnknownGroup`]).
    fn handle_multicast(
        &mut self,
        now: u64,
        pkt: &codec::Packet<'_>,
        grh: Option<&[u8; 40]>,
        mem: &mut impl Memory,
    ) {
        let group = grh.map(crate::gsi::grh_destination_gid);
        let Some(group) = group.filter(|g| self.groups.has(g)) else {
            self.counters
                .drop_packet(DropReason::UnknownGroup, MULTICAST_QPN, pkt.hdr.bth.psn);
            return;
        };
        // The list cannot change while the QPs handle the packet (only verbs change it).
        let mut index = 0;
        while let Some(qpn) = self.groups.member(&group, index) {
            index += 1;
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            let mut ctx = ctx!(self);
            qp.on_request(now, pkt, grh, mem, &mut ctx);
            settle!(self, qp);
        }
    }

    /// Lists the QPs a peer's window woke as ready to send.
    #[inline]
    fn wake_held(&mut self) {
        if self.woken.is_empty() {
            return;
        }
        for qpn in self.woken.drain(..) {
            if let Some(qp) = self.qps.get_mut(&qpn) {
                self.schedule.note(qp, true);
            }
        }
    }

    /// Drops stale entries off the top of the timer heap (`Schedule::tidy_timers`).
    #[inline]
    fn tidy_timers(&mut self) {
        let qps = &self.qps;
        self.counters.qps_visited += self
            .schedule
            .tidy_timers(|at, qpn| qps.get(&qpn).is_some_and(|qp| qp.marks.timer == Some(at)));
    }

    /// Writes the next packet to send into `buf`: queued management datagrams first
    /// ([`Engine::gsi_send`]), then round robin over QPs (responses before requests within
    /// a QP). `mem` is read for payloads (gather, read responses).
    ///
    /// An RC QP's requests wait while its peer's congestion window is full
    /// ([`Engine::peer_window`]; a QP with nothing in flight may always send one); the
    /// QP's turn comes again in a later call, once acknowledgments have opened the window.
    /// Responses never wait.
    pub fn poll_transmit(
        &mut self,
        now: u64,
        buf: &mut [u8],
        mem: &impl Memory,
    ) -> Option<Transmit> {
        if let Some(t) = self.gsi.poll_transmit(buf, &mut self.counters) {
            return Some(t);
        }
        while let Some(qpn) = self.schedule.ready.pop_front() {
            self.counters.qps_visited += 1;
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            qp.marks.ready = false;
            let room = self.windows.room(qp, &self.config);
            let sent = qp.poll_transmit(now, buf, mem, room, &mut ctx!(self));
            let held = qp.held_by_window;
            // Sending moves `req_psn`; a failed work request found on the way may have
            // moved the QP to ERR.
            self.windows
                .sync(qp, &self.config, &mut self.counters, &mut self.woken);
            if held {
                self.windows.hold(qp, &mut self.counters, &mut self.woken);
            } else {
                self.windows.unhold(qp);
            }
            // One that sent goes to the back if it may send more; one that sent nothing
            // waits for an input to list it again.
            self.schedule.note(qp, sent.is_some());
            self.wake_held();
            self.tidy_timers();
            if sent.is_some() {
                return sent;
            }
        }
        None
    }

    /// Executes the local operations (memory window binds, local invalidations) heading the
    /// send queues, against `mem` (module `local.rs`); returns how many ran. The requester
    /// sends nothing past a local operation, so after any input call this and
    /// [`poll_transmit`](Self::poll_transmit) in turn until neither has anything to do.
    /// Only the QPs whose send queue a local operation heads are visited.
    pub fn execute_local_operations(&mut self, mem: &mut impl Memory) -> usize {
        let mut ran = 0;
        for _ in 0..self.schedule.local.len() {
            let Some(qpn) = self.schedule.local.pop_front() else {
                break;
            };
            self.counters.qps_visited += 1;
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            qp.marks.local = false;
            ran += qp.execute_local_operations(mem, &mut ctx!(self));
            settle!(self, qp);
        }
        ran
    }

    /// Whether a local operation heads a send queue: [`Engine::execute_local_operations`]
    /// has one to run (sending may have brought one to the head).
    pub fn has_local_operations(&self) -> bool {
        !self.schedule.local.is_empty()
    }

    /// Queues a management datagram (a MAD, 1..=[`MAD_LEN`](crate::MAD_LEN) bytes) to
    /// send from QP1 to QP1 of the port whose GID is `dgid`, from the local GID at
    /// `sgid_index`. [`poll_transmit`](Self::poll_transmit) writes it as a UD SEND ONLY
    /// with BTH DestQP 1, P_Key 0xFFFF, DETH Q_Key 0x80010000 and SrcQP 1 (IBTA 13.5),
    /// its [`Transmit`] saying `src_qpn` 1, `dest_qpn` 1 and an address vector towards
    /// `dgid`. Refused with [`VerbsError::MadLength`], [`VerbsError::BadSgidIndex`], or
    /// [`VerbsError::QueueFull`] when [`GSI_OUTBOX_LEN`](crate::GSI_OUTBOX_LEN) MADs
    /// already wait.
    pub fn gsi_send(
        &mut self,
        dgid: [u8; 16],
        sgid_index: u8,
        bytes: &[u8],
    ) -> Result<(), VerbsError> {
        if u32::from(sgid_index) >= self.config.gid_table_len {
            return Err(VerbsError::BadSgidIndex {
                index: sgid_index.into(),
                table_len: self.config.gid_table_len,
            });
        }
        self.gsi.send(dgid, sgid_index, bytes)
    }

    /// The next management datagram QP1 received, in arrival order. Packets to DestQP 1
    /// are accepted only as UD SEND ONLY with the GSI Q_Key, a GRH and at most a MAD's
    /// length of payload (dropped and counted otherwise: `WrongTransport`,
    /// `QkeyMismatch`, `Malformed`), and at most
    /// [`GSI_INBOX_LEN`](crate::GSI_INBOX_LEN) wait (then `GsiInboxFull`).
    pub fn poll_gsi(&mut self) -> Option<GsiMad> {
        self.gsi.poll()
    }

    /// How many received management datagrams wait for [`poll_gsi`](Self::poll_gsi).
    pub fn gsi_pending(&self) -> usize {
        self.gsi.pending()
    }

    /// Whether the engine has anything for its driver: a completion or an event to take,
    /// a QP with packets or local operations to run ([`Engine::poll_transmit`],
    /// [`Engine::execute_local_operations`]), or a MAD to send. A driver that finds
    /// nothing after a verb (a post of a receive, most often) need not look further;
    /// timers are [`Engine::poll_timeout`]'s.
    pub fn has_output(&self) -> bool {
        !self.completions.is_empty()
            || !self.events.is_empty()
            || !self.schedule.ready.is_empty()
            || !self.schedule.local.is_empty()
            || self.gsi.has_transmit()
    }

    /// The next completion, in the order the engine produced them.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }

    /// Puts the completions not yet polled for send queues before those for receive
    /// queues, each kind in the order produced. IBTA orders completions within a work
    /// queue, not between the send and the receive queue; but on a wire the ACK of a
    /// request leaves its responder before any reply the responder's program posts
    /// after, and programs count on its send completion coming first (`ib_send_lat -e`
    /// of perftest 4.5, Debian 12's, waits on one channel for both CQs' events and
    /// expects the send CQ's first). A device that takes
    /// the reply and the ACK behind it in one datagram completes them as the wire would
    /// have.
    pub fn order_send_completions_first(&mut self) {
        let is_recv = |c: &Completion| c.cq == CqTarget::Recv;
        if self.completions.len() > 1 && !self.completions.iter().is_sorted_by_key(is_recv) {
            self.completions.make_contiguous().sort_by_key(is_recv);
        }
    }

    /// The next asynchronous event.
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop_front()
    }

    /// Earliest timer deadline over all QPs (the top of the schedule's timer heap: no QP
    /// is looked at).
    pub fn poll_timeout(&self) -> Option<u64> {
        self.schedule.earliest()
    }

    /// Fires every timer due at `now`, QPs in QPN order; only the QPs with a timer due are
    /// visited.
    pub fn handle_timeout(&mut self, now: u64) {
        let mut due = Vec::new();
        while let Some(&std::cmp::Reverse((at, qpn))) = self.schedule.timers.peek() {
            if at > now {
                break;
            }
            self.schedule.timers.pop();
            self.schedule.timers_changed();
            self.counters.qps_visited += 1;
            if let Some(qp) = self.qps.get_mut(&qpn) {
                if self.schedule.timer_taken(qp, at) {
                    due.push(qpn);
                }
            }
        }
        due.sort_unstable();
        for qpn in due {
            match self.qps.get_mut(&qpn) {
                Some(qp) => {
                    if qp.poll_timeout().is_some_and(|t| t <= now) {
                        qp.handle_timeout(now, &mut ctx!(self));
                    }
                    settle!(self, qp);
                }
                None => {
                    self.wake_held();
                    self.tidy_timers();
                }
            }
        }
        self.tidy_timers();
    }

    /// Counters over all QPs.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The congestion window of the RC requests towards the peer whose GID is `dgid` (the
    /// `ah_attr.dgid` of the QPs' path), while an RC QP in RTS or SQD has that path
    /// (`None` otherwise). See [`EngineConfig::initial_cwnd_packets`].
    pub fn peer_window(&self, dgid: &[u8; 16]) -> Option<PeerWindow> {
        self.windows.window(dgid)
    }

    /// Recomputes every peer's in-flight count from its QPs and compares it with the
    /// count the window keeps; `Err` names the first difference. For tests and
    /// simulations, which check it after every step: the engine never needs it.
    pub fn check_peer_windows(&self) -> Result<(), String> {
        self.windows.check(self.qps_in_order().into_iter())
    }

    /// Every QP, in QPN order: the order the checks look at them in, so that the first
    /// difference they name does not depend on the order of the table.
    fn qps_in_order(&self) -> Vec<&Qp> {
        let mut qps: Vec<&Qp> = self.qps.values().collect();
        qps.sort_unstable_by_key(|qp| qp.qpn);
        qps
    }

    /// Checks the schedule the outputs follow (`sched.rs`) against the QPs; `Err` names
    /// the first QP left out. For tests and simulations, which check it after every step:
    ///
    /// - every QP that [`poll_transmit`](Self::poll_transmit) would write a packet for now
    ///   (tried on a copy of the QP, reading `mem`) is listed as ready to send, and one its
    ///   peer's window holds is listed as ready or as held by that window;
    /// - every QP whose send queue a local operation heads is listed for
    ///   [`execute_local_operations`](Self::execute_local_operations);
    /// - every QP's timer deadline is the one the timer heap holds for it, and
    ///   [`poll_timeout`](Self::poll_timeout) is the earliest of them.
    pub fn check_schedule(&self, mem: &impl Memory) -> Result<(), String> {
        let ready: HashSet<u32> = self.schedule.ready.iter().copied().collect();
        let local: HashSet<u32> = self.schedule.local.iter().copied().collect();
        // After a drain (`poll_transmit` returned `None`: no QP listed as ready) no QP may
        // have a packet it could send. Before, a QP the window held may have room already:
        // the window woke as many as it opened by, and they have their turn first.
        let drained = !self.qps.values().any(|qp| qp.marks.ready);
        let mut buf = Vec::new();
        for qp in self.qps_in_order() {
            let qpn = qp.qpn;
            if qp.marks.ready != ready.contains(&qpn) || qp.marks.local != local.contains(&qpn) {
                return Err(format!(
                    "QP {qpn:#x}: marked {:?}, listed ready {}, local {}",
                    qp.marks,
                    ready.contains(&qpn),
                    local.contains(&qpn)
                ));
            }
            let held = self.windows.held(qp);
            // A QP listed as held has not changed since it was held (every input that runs
            // it takes it off the list); with no more room than it had then, or none, it
            // would be held again (`Windows::held`): not worth a copy.
            if !qp.marks.ready && qp.may_transmit() && held != Some(true) {
                // Try it on a copy: what the next `poll_transmit` visit would do.
                buf.resize(self.max_packet_len(), 0);
                let mut copy = qp.clone();
                let (mut srqs, mut completions, mut events, mut counters) = (
                    FxHashMap::default(),
                    VecDeque::new(),
                    VecDeque::new(),
                    Counters::default(),
                );
                let mut ctx = Ctx {
                    config: &self.config,
                    srqs: &mut srqs,
                    completions: &mut completions,
                    events: &mut events,
                    counters: &mut counters,
                };
                let room = self.windows.room(qp, &self.config);
                let sends = copy
                    .poll_transmit(0, &mut buf, mem, room, &mut ctx)
                    .is_some();
                if sends && (drained || held.is_none()) {
                    return Err(format!(
                        "QP {qpn:#x} has a packet to send and is not listed as ready (room {room:?}, held {held:?})"
                    ));
                }
                if copy.held_by_window && held.is_none() {
                    return Err(format!(
                        "QP {qpn:#x} is held by its peer's window and not listed as held"
                    ));
                }
            }
            if qp.has_local_head() && !qp.marks.local {
                return Err(format!(
                    "QP {qpn:#x}: a local operation heads its send queue and it is not listed"
                ));
            }
            if qp.marks.timer != qp.poll_timeout() {
                return Err(format!(
                    "QP {qpn:#x}: timer {:?}, the schedule holds {:?}",
                    qp.poll_timeout(),
                    qp.marks.timer
                ));
            }
        }
        let earliest = self.qps.values().filter_map(Qp::poll_timeout).min();
        if self.poll_timeout() != earliest {
            return Err(format!(
                "poll_timeout {:?}, the earliest QP deadline {earliest:?}",
                self.poll_timeout()
            ));
        }
        Ok(())
    }
}

/// After an entry point ran `qp` (then the engine lists the QPs the window woke and drops
/// stale timers off the top: `settle!`): re-syncs its charge to its peer's window and
/// lists it where it now has work, as ready to send too (see `Schedule::note`).
fn settle_qp(
    qp: &mut Qp,
    windows: &mut Windows,
    schedule: &mut Schedule,
    config: &EngineConfig,
    counters: &mut Counters,
    woken: &mut Vec<u32>,
) {
    // It gets a turn to send anyway: a window opening wakes others.
    windows.unhold(qp);
    windows.sync(qp, config, counters, woken);
    schedule.note(qp, true);
}

/// Whether the GRH area of a received packet (the form a UD receive gets: an IPv6 header,
/// or 20 zero bytes then the IPv4 header) names `dgid` as its source: the source as a GID
/// (an IPv4 source as `::ffff:a.b.c.d`) is `dgid`, or `dgid` names the source address for
/// the device the packet was sent to ([`gid_address`](crate::gid_address): a port's
/// link-local GID names the address it was made from).
fn from_path(grh: &[u8; 40], dgid: &[u8; 16]) -> bool {
    if grh[0] >> 4 != 6 {
        // IPv4: the source's four bytes, as a mapped or a link-local GID names them.
        let source = [grh[32], grh[33], grh[34], grh[35]];
        return crate::gid::names_ipv4(dgid, source);
    }
    // The first test answers every packet of a path to an IP address; the addresses of
    // the second are worked out only for a link-local path.
    &crate::gsi::grh_source_gid(grh) == dgid || {
        let (source, local) = crate::gsi::grh_addresses(grh);
        crate::gid_address(dgid, local) == source
    }
}

/// The error for a QP number the engine does not know.
fn no_qp(qpn: u32) -> VerbsError {
    VerbsError::NoSuchObject {
        object: Object::Qp,
        id: qpn,
    }
}

/// The error for an SRQ the engine does not know.
fn no_srq(srq: SrqId) -> VerbsError {
    VerbsError::NoSuchObject {
        object: Object::Srq,
        id: srq.0,
    }
}

#[cfg(test)]
mod tests {
    //! Scenario tests of one or two engines wired by hand: the exact packets out for a
    //! given input (segmentation, PSNs, AckReq, the unacknowledged window) and the
    //! modify contract.

    use super::*;
    use crate::codec;
    use crate::memory::{AtomicOp, MemError, MemKey, RegionInfo};
    use crate::types::{AccessFlags, AddressVector, Mtu, QpType};
    use crate::wr::{SendFlags, SendOp, Sge};
    use softverbs_cq::{RawFields, WorkCompletion};
    use std::net::{IpAddr, Ipv6Addr};

    /// Flat memory: one region, key 1, in protection domain 0, every access allowed.
    struct Flat(Vec<u8>);

    impl Memory for Flat {
        type Handle = ();

        fn lookup(&self, key: MemKey) -> Result<((), RegionInfo), MemError> {
            let (MemKey::Local(1) | MemKey::Remote(1)) = key else {
                return Err(MemError::InvalidKey);
            };
            let len = self.0.len() as u64;
            Ok(((), RegionInfo::new(0, 0, len, AccessFlags::all())))
        }
        fn read_region(&self, _: (), at: usize, buf: &mut [u8]) -> Result<(), MemError> {
            buf.copy_from_slice(&self.0[at..at + buf.len()]);
            Ok(())
        }
        fn write_region(&mut self, _: (), at: usize, data: &[u8]) -> Result<(), MemError> {
            self.0[at..at + data.len()].copy_from_slice(data);
            Ok(())
        }
        fn atomic_region(&mut self, _: (), _: usize, _: AtomicOp) -> Result<u64, MemError> {
            Ok(0)
        }
        fn invalidate_region(&mut self, _: ()) -> Result<(), MemError> {
            Ok(())
        }
    }

    fn rts(ep: &mut Engine, qp_type: QpType, mtu: Mtu, psn: u32) -> u32 {
        rts_with(ep, QpInit::new(qp_type), mtu, psn)
    }

    fn rts_with(ep: &mut Engine, init: QpInit, mtu: Mtu, psn: u32) -> u32 {
        rts_from(ep, init, mtu, psn, QpAttr::default())
    }

    /// An RC QP in RTS that retries (`retry_cnt` 7, `rnr_retry` 7) and answers remote
    /// reads and writes (`max_dest_rd_atomic` 4).
    fn rts_rc_retrying(ep: &mut Engine) -> u32 {
        let base = QpAttr {
            retry_cnt: 7,
            rnr_retry: 7,
            max_dest_rd_atomic: 4,
            qp_access_flags: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
            ..QpAttr::default()
        };
        rts_from(ep, QpInit::new(QpType::Rc), Mtu::Mtu1024, 0, base)
    }

    /// `rts_with`, the attributes it does not set taken from `base`.
    fn rts_from(ep: &mut Engine, init: QpInit, mtu: Mtu, psn: u32, base: QpAttr) -> u32 {
        let qp_type = init.qp_type;
        let qpn = ep.create_qp(init).unwrap();
        let mut attr = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            ..base
        };
        let m = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT;
        ep.modify_qp(qpn, &attr, m | AttrMask::ACCESS_FLAGS)
            .unwrap();
        attr.qp_state = QpState::Rtr;
        attr.path_mtu = mtu;
        attr.dest_qp_num = 0x99;
        attr.rq_psn = 0;
        attr.ah_attr = AddressVector {
            port_num: 1,
            ..AddressVector::default()
        };
        let mut rtr = AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN;
        if qp_type == QpType::Rc {
            rtr |= AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
        }
        ep.modify_qp(qpn, &attr, rtr).unwrap();
        attr.qp_state = QpState::Rts;
        attr.sq_psn = psn;
        attr.timeout = 14;
        attr.max_rd_atomic = 4;
        let mut mask = AttrMask::STATE | AttrMask::SQ_PSN;
        if qp_type == QpType::Rc {
            mask |= AttrMask::TIMEOUT
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::MAX_QP_RD_ATOMIC;
        }
        ep.modify_qp(qpn, &attr, mask).unwrap();
        qpn
    }

    fn drain(ep: &mut Engine, mem: &Flat) -> Vec<Vec<u8>> {
        let mut buf = vec![0u8; ep.max_packet_len()];
        let mut out = Vec::new();
        while let Some(t) = ep.poll_transmit(0, &mut buf, mem) {
            out.push(buf[..t.len].to_vec());
        }
        out
    }

    /// Reference §1.6: FIRST and MIDDLE carry exactly PMTU, LAST the rest; one PSN per
    /// packet across the 2^24 wrap; AckReq on the last packet only (§1.9); the RETH on
    /// FIRST carries the whole length.
    #[test]
    fn segmentation_by_path_mtu_with_psns_across_the_wrap() {
        let mut ep = Engine::new(EngineConfig::default());
        let mem = Flat(vec![5; 8192]);
        let qpn = rts(&mut ep, QpType::Rc, Mtu::Mtu1024, 0xFF_FFFF);
        let op = SendOp::RdmaWrite {
            remote_addr: 0x1000,
            rkey: 1,
        };
        ep.post_send(
            qpn,
            SendWr::new(
                1,
                op,
                vec![Sge {
                    addr: 0,
                    length: 2500,
                    lkey: 1,
                }],
            ),
        )
        .unwrap();
        let pkts = drain(&mut ep, &mem);
        let parsed: Vec<_> = pkts.iter().map(|p| codec::parse(p).unwrap()).collect();
        let ops: Vec<u8> = parsed.iter().map(|p| p.hdr.bth.opcode).collect();
        assert_eq!(
            ops,
            [
                codec::op::WRITE_FIRST,
                codec::op::WRITE_MIDDLE,
                codec::op::WRITE_LAST
            ]
        );
        let psns: Vec<u32> = parsed.iter().map(|p| p.hdr.bth.psn).collect();
        assert_eq!(psns, [0xFF_FFFF, 0, 1]);
        let lens: Vec<usize> = parsed.iter().map(|p| p.payload.len()).collect();
        assert_eq!(lens, [1024, 1024, 452]);
        let acks: Vec<bool> = parsed.iter().map(|p| p.hdr.bth.ack_req).collect();
        assert_eq!(acks, [false, false, true]);
        assert_eq!(parsed[0].hdr.reth.unwrap().dma_len, 2500);
        assert_eq!(parsed[0].hdr.bth.dest_qp, 0x99);
    }

    /// A zero-length SEND is one ONLY packet with no payload; a READ consumes one PSN per
    /// expected response packet (§1.6).
    #[test]
    fn zero_length_send_and_read_psn_consumption() {
        let mut ep = Engine::new(EngineConfig::default());
        let mem = Flat(vec![0; 8192]);
        let qpn = rts(&mut ep, QpType::Rc, Mtu::Mtu256, 10);
        ep.post_send(qpn, SendWr::new(1, SendOp::Send, vec![]))
            .unwrap();
        let read = SendOp::RdmaRead {
            remote_addr: 0,
            rkey: 1,
        };
        ep.post_send(
            qpn,
            SendWr::new(
                2,
                read,
                vec![Sge {
                    addr: 0,
                    length: 1000,
                    lkey: 1,
                }],
            ),
        )
        .unwrap();
        ep.post_send(qpn, SendWr::new(3, SendOp::Send, vec![]))
            .unwrap();
        let pkts = drain(&mut ep, &mem);
        let parsed: Vec<_> = pkts.iter().map(|p| codec::parse(p).unwrap()).collect();
        assert_eq!(parsed[0].hdr.bth.opcode, codec::op::SEND_ONLY);
        assert!(parsed[0].payload.is_empty());
        assert_eq!(parsed[1].hdr.bth.opcode, codec::op::READ_REQUEST);
        assert_eq!(parsed[1].hdr.bth.psn, 11);
        assert_eq!(
            parsed[2].hdr.bth.psn, 15,
            "1000 B at MTU 256 = 4 response PSNs"
        );
    }

    /// The requester stops at `max_unacked_psns` unacknowledged PSNs (reference §2.2).
    #[test]
    fn requester_window_stops_at_max_unacked_psns() {
        let config = EngineConfig {
            max_unacked_psns: 16,
            ..EngineConfig::default()
        };
        let mut ep = Engine::new(config);
        let mem = Flat(vec![0; 8192]);
        let qpn = rts(&mut ep, QpType::Rc, Mtu::Mtu1024, 0);
        for i in 0..40 {
            ep.post_send(qpn, SendWr::new(i, SendOp::Send, vec![]))
                .unwrap();
        }
        assert_eq!(drain(&mut ep, &mem).len(), 16);
        // An ACK for PSN 7 opens 8 more.
        let ack = codec::Headers {
            bth: codec::Bth {
                opcode: codec::op::ACKNOWLEDGE,
                pkey: 0xFFFF,
                dest_qp: qpn,
                psn: 7,
                ..Default::default()
            },
            aeth: Some(codec::Aeth {
                syndrome: codec::SYNDROME_ACK,
                msn: 8,
            }),
            ..Default::default()
        };
        let mut buf = [0u8; 64];
        let n = codec::emit(&ack, &[], &mut buf).unwrap();
        let mut mem = mem;
        ep.handle_packet(1, &buf[..n], None, &mut mem);
        assert_eq!(drain(&mut ep, &mem).len(), 8);
        let done: Vec<u64> = std::iter::from_fn(|| ep.poll_completion())
            .map(|c| c.wc.wr_id())
            .collect();
        assert!(
            done.is_empty(),
            "sq_sig_all off and unsignaled: no completions"
        );
    }

    /// The shortest local ACK timeout (IBTA 9.7.6.1.3: 4.096 µs · 2^timeout) any RC QP was
    /// given, which a device that receives only now and then must look within: RC QPs
    /// only (UD has no ACKs), timeout 0 (infinite) and refused modifies count for nothing,
    /// a longer timeout never raises it.
    #[test]
    fn the_shortest_ack_timeout_of_the_rc_qps_is_kept() {
        let mut ep = Engine::new(EngineConfig::default());
        assert_eq!(ep.shortest_ack_timeout_ns(), None);
        ud_rts(&mut ep, 0x1111);
        assert_eq!(ep.shortest_ack_timeout_ns(), None);
        let qpn = rts_rc_retrying(&mut ep); // timeout 14
        assert_eq!(ep.shortest_ack_timeout_ns(), Some(67_108_864));
        // RTS to RTS may not change the timeout (ibv_modify_qp(3)): refused, not counted.
        let shorter = QpAttr {
            qp_state: QpState::Rts,
            timeout: 10,
            ..QpAttr::default()
        };
        assert!(ep
            .modify_qp(qpn, &shorter, AttrMask::STATE | AttrMask::TIMEOUT)
            .is_err());
        assert_eq!(ep.shortest_ack_timeout_ns(), Some(67_108_864));
        // SQD to SQD may.
        let sqd = QpAttr {
            qp_state: QpState::Sqd,
            ..QpAttr::default()
        };
        ep.modify_qp(qpn, &sqd, AttrMask::STATE).unwrap();
        let mut set = |timeout: u8| {
            let attr = QpAttr {
                qp_state: QpState::Sqd,
                timeout,
                ..QpAttr::default()
            };
            ep.modify_qp(qpn, &attr, AttrMask::STATE | AttrMask::TIMEOUT)
                .unwrap();
            ep.shortest_ack_timeout_ns()
        };
        assert_eq!(set(0), Some(67_108_864));
        assert_eq!(set(10), Some(4_194_304));
        assert_eq!(set(18), Some(4_194_304));
    }

    /// ibv_modify_qp(3): "If any of the modify attributes or the modify mask are invalid,
    /// none of the attributes will be modified (including the QP state)"; missing and
    /// extra attributes are EINVAL, never a panic.
    #[test]
    fn modify_is_all_or_nothing_and_checks_masks() {
        let mut ep = Engine::new(EngineConfig::default());
        let qpn = ep.create_qp(QpInit::new(QpType::Rc)).unwrap();
        let attr = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qkey: 5,
            ..QpAttr::default()
        };
        // Missing ACCESS_FLAGS.
        let e = ep.modify_qp(
            qpn,
            &attr,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT,
        );
        assert_eq!(
            e.unwrap_err(),
            VerbsError::MissingAttributes {
                missing: AttrMask::ACCESS_FLAGS
            }
        );
        // Extra QKEY (UD only).
        let all = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
        assert!(ep.modify_qp(qpn, &attr, all | AttrMask::QKEY).is_err());
        // Bad value: port 2.
        assert!(ep
            .modify_qp(
                qpn,
                &QpAttr {
                    port_num: 2,
                    ..attr
                },
                all
            )
            .is_err());
        assert_eq!(ep.qp_state(qpn), Some(QpState::Reset));
        ep.modify_qp(qpn, &attr, all).unwrap();
        assert_eq!(ep.qp_state(qpn), Some(QpState::Init));
        // Skipping RTR is illegal.
        let to_rts = QpAttr {
            qp_state: QpState::Rts,
            ..attr
        };
        assert!(ep
            .modify_qp(qpn, &to_rts, AttrMask::STATE | AttrMask::SQ_PSN)
            .is_err());
        // post_send before RTS is EINVAL.
        assert!(ep
            .post_send(qpn, SendWr::new(1, SendOp::Send, vec![]))
            .is_err());
        // UC refuses RDMA READ at post time (ibv_post_send(3) opcode table).
        let mut ep2 = Engine::new(EngineConfig::default());
        let uc = rts(&mut ep2, QpType::Uc, Mtu::Mtu1024, 0);
        let read = SendOp::RdmaRead {
            remote_addr: 0,
            rkey: 1,
        };
        assert!(ep2.post_send(uc, SendWr::new(1, read, vec![])).is_err());
    }

    /// A QP's protection domain is kept and reported (`ibv_query_qp(3)` returns the init
    /// attributes, the PD with them); `QpInit::new` is in PD 0.
    #[test]
    fn query_qp_reports_the_protection_domain() {
        let mut ep = Engine::new(EngineConfig::default());
        let qpn = ep.create_qp(QpInit::new(QpType::Rc).with_pd(7)).unwrap();
        assert_eq!(ep.query_qp(qpn).unwrap().1.pd, 7);
        assert_eq!(QpInit::new(QpType::Ud).pd, 0);
    }

    /// A gather that fails part way — the second SGE's memory faults after the first was
    /// read into the packet (the application unmapped it while registered) — completes
    /// with `IBV_WC_LOC_PROT_ERR` and sends nothing. The engine says so to the memory
    /// (`Memory::abandon_reads`), so that an implementation that leaves those reads for
    /// when the packet is written (the device's shared-memory path) drops them instead of
    /// writing them into the next packet built in the same room.
    #[test]
    fn a_gather_failing_part_way_abandons_the_reads_made_for_its_packet() {
        use std::cell::Cell;
        struct Counting {
            flat: Flat,
            reads: Cell<usize>,
            abandoned: Cell<usize>,
            /// The read (counting from 1) that faults.
            faulting: usize,
        }
        impl Memory for Counting {
            type Handle = ();
            fn lookup(&self, key: MemKey) -> Result<((), RegionInfo), MemError> {
                self.flat.lookup(key)
            }
            fn read_region(&self, h: (), at: usize, buf: &mut [u8]) -> Result<(), MemError> {
                self.reads.set(self.reads.get() + 1);
                if self.reads.get() == self.faulting {
                    return Err(MemError::Fault);
                }
                self.flat.read_region(h, at, buf)
            }
            fn write_region(&mut self, h: (), at: usize, data: &[u8]) -> Result<(), MemError> {
                self.flat.write_region(h, at, data)
            }
            fn atomic_region(&mut self, h: (), at: usize, op: AtomicOp) -> Result<u64, MemError> {
                self.flat.atomic_region(h, at, op)
            }
            fn invalidate_region(&mut self, h: ()) -> Result<(), MemError> {
                self.flat.invalidate_region(h)
            }
            fn abandon_reads(&self) {
                self.abandoned.set(self.abandoned.get() + 1);
            }
        }
        let mut ep = Engine::new(EngineConfig::default());
        let mem = Counting {
            flat: Flat(vec![9; 4096]),
            reads: Cell::new(0),
            abandoned: Cell::new(0),
            faulting: 2,
        };
        let qpn = rts(&mut ep, QpType::Rc, Mtu::Mtu1024, 0);
        let good = Sge {
            addr: 0,
            length: 64,
            lkey: 1,
        };
        ep.post_send(qpn, SendWr::new(1, SendOp::Send, vec![good, good]))
            .unwrap();
        let mut buf = vec![0u8; ep.max_packet_len()];
        assert!(
            ep.poll_transmit(0, &mut buf, &mem).is_none(),
            "nothing sent"
        );
        let c = ep.poll_completion().expect("an error completion");
        assert_eq!(c.wc.status(), softverbs_cq::WcStatus::LocProtErr);
        assert_eq!((mem.reads.get(), mem.abandoned.get()), (2, 1));
        // A gather that succeeds abandons nothing (on a QP of its own: the error
        // completion put the first one in the error state).
        let qpn = rts(&mut ep, QpType::Rc, Mtu::Mtu1024, 0);
        ep.post_send(qpn, SendWr::new(2, SendOp::Send, vec![good, good]))
            .unwrap();
        assert!(ep.poll_transmit(0, &mut buf, &mem).is_some());
        assert_eq!((mem.reads.get(), mem.abandoned.get()), (4, 1));
    }

    /// IBTA vol. 1 ch. 10 (protection domains): an L_Key is valid for a QP only if its
    /// region is in the QP's PD. A SEND from a QP of PD 3 naming an L_Key of PD 0 fails
    /// with `LOC_PROT_ERR` (as a bad L_Key does) and sends nothing; the same WR from a QP
    /// of PD 0 goes out.
    #[test]
    fn send_with_lkey_of_another_pd_fails_loc_prot_err_and_sends_nothing() {
        let mut ep = Engine::new(EngineConfig::default());
        let mem = Flat(vec![9; 4096]);
        let other = rts_with(&mut ep, QpInit::new(QpType::Rc).with_pd(3), Mtu::Mtu1024, 0);
        let sge = Sge {
            addr: 0,
            length: 64,
            lkey: 1,
        };
        ep.post_send(other, SendWr::new(1, SendOp::Send, vec![sge]))
            .unwrap();
        assert!(drain(&mut ep, &mem).is_empty(), "nothing sent");
        let c = ep.poll_completion().expect("an error completion");
        assert_eq!(c.wc.status(), softverbs_cq::WcStatus::LocProtErr);
        assert_eq!((c.wc.wr_id(), c.wc.qp_num()), (1, other));

        let same = rts(&mut ep, QpType::Rc, Mtu::Mtu1024, 0);
        ep.post_send(same, SendWr::new(2, SendOp::Send, vec![sge]))
            .unwrap();
        let pkts = drain(&mut ep, &mem);
        assert_eq!(pkts.len(), 1);
        assert_eq!(codec::parse(&pkts[0]).unwrap().payload, &[9u8; 64][..]);
    }

    /// `ibv_modify_qp(3)` / `ibv_create_ah(3)`: an address vector whose source GID index
    /// is outside the port's GID table is `EINVAL` (the kernel's `rdma_get_gid_attr`
    /// refuses it), and the refused modify leaves the QP in INIT.
    #[test]
    fn a_path_outside_the_gid_table_is_refused_and_changes_nothing() {
        let mut ep = Engine::new(EngineConfig::default());
        let qpn = ep.create_qp(QpInit::new(QpType::Rc)).unwrap();
        let mut attr = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            ..QpAttr::default()
        };
        ep.modify_qp(
            qpn,
            &attr,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
        )
        .unwrap();
        attr.qp_state = QpState::Rtr;
        attr.path_mtu = Mtu::Mtu1024;
        attr.ah_attr = AddressVector {
            port_num: 1,
            sgid_index: 99,
            is_global: true,
            ..AddressVector::default()
        };
        let rtr = AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER;
        let refused = ep.modify_qp(qpn, &attr, rtr).unwrap_err();
        assert_eq!(
            refused,
            VerbsError::BadSgidIndex {
                index: 99,
                table_len: 2
            }
        );
        assert_eq!(ep.qp_state(qpn), Some(QpState::Init));
        assert_eq!(ep.check_address_vector(&attr.ah_attr), Err(refused.clone()));
        attr.ah_attr.sgid_index = 0;
        assert_eq!(ep.check_address_vector(&attr.ah_attr), Ok(()));
        ep.modify_qp(qpn, &attr, rtr).unwrap();
        assert_eq!(ep.qp_state(qpn), Some(QpState::Rtr));
    }

    /// IBTA 9.6.1.5 (rxe's `check_addr`): a packet for an RC or UC QP whose source is not
    /// the QP's remote address is dropped as `OffPath` before the QP sees it (no ACK, no
    /// receive, no PSN moved); the same packet from the path is accepted.
    #[test]
    fn connected_qps_take_packets_only_from_their_path() {
        for qp_type in [QpType::Rc, QpType::Uc] {
            let mut ep = Engine::new(EngineConfig::default());
            let mut mem = Flat(vec![0; 4096]);
            let qpn = rts(&mut ep, qp_type, Mtu::Mtu1024, 0);
            ep.post_recv(
                qpn,
                RecvWr {
                    wr_id: 1,
                    sg_list: [Sge {
                        addr: 0,
                        length: 64,
                        lkey: 1,
                    }]
                    .into(),
                },
            )
            .unwrap();
            let opcode = match qp_type {
                QpType::Rc => codec::op::SEND_ONLY,
                _ => codec::op::SEND_ONLY | 0x20,
            };
            let send = codec::Headers {
                bth: codec::Bth {
                    opcode,
                    pkey: 0xFFFF,
                    dest_qp: qpn,
                    psn: 0,
                    ack_req: true,
                    ..Default::default()
                },
                ..Default::default()
            };
            let mut buf = [0u8; 64];
            let n = codec::emit(&send, b"hi", &mut buf).unwrap();
            // The QP's path is the all-zero GID (`rts`); an IPv6 GRH area from ::1.
            let mut grh = [0u8; 40];
            grh[0] = 0x60;
            grh[23] = 1;
            ep.handle_packet(1, &buf[..n], Some(&grh), &mut mem);
            assert_eq!(ep.counters().drops(DropReason::OffPath), 1, "{qp_type:?}");
            assert!(ep.poll_completion().is_none());
            assert!(drain(&mut ep, &mem).is_empty(), "no reply off the path");
            grh[23] = 0;
            ep.handle_packet(2, &buf[..n], Some(&grh), &mut mem);
            assert_eq!(ep.counters().drops(DropReason::OffPath), 1);
            let wc = ep
                .poll_completion()
                .expect("the peer's SEND is received")
                .wc;
            assert_eq!(wc.result().map(|w| w.byte_len()), Ok(2), "{qp_type:?}");
        }
    }

    /// The GRH area's source is read in both forms a receive gets it (reference §3.4): an
    /// IPv4 header at bytes 20..40 (compared as `::ffff:a.b.c.d`) and an IPv6 header.
    #[test]
    fn the_path_check_reads_ipv4_and_ipv6_sources() {
        let mut v4 = [0u8; 40];
        v4[20] = 0x45;
        v4[32..36].copy_from_slice(&[127, 0, 0, 3]);
        let mapped = |d: u8| {
            let mut gid = [0u8; 16];
            gid[10..12].copy_from_slice(&[0xff, 0xff]);
            gid[12..].copy_from_slice(&[127, 0, 0, d]);
            gid
        };
        assert!(from_path(&v4, &mapped(3)));
        assert!(!from_path(&v4, &mapped(9)));
        let mut v6 = [0u8; 40];
        v6[0] = 0x60;
        v6[8..24].copy_from_slice(&mapped(3));
        assert!(from_path(&v6, &mapped(3)));
        v6[8..24].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert!(!from_path(&v6, &mapped(3)));
    }

    /// A path through the peer's link-local GID (index 0 of a softverbs port, made from its
    /// address: `crate::gid`) admits packets from that address, and only from it: for an
    /// IPv4 peer `fe80::ffff:a.b.c.d`, for an IPv6 peer `fe80::` and its interface
    /// identifier, on the receiver's /64.
    #[test]
    fn the_path_check_reads_a_link_local_gid_as_the_address_it_was_made_from() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let mut v4 = [0u8; 40];
        v4[20] = 0x45;
        v4[32..36].copy_from_slice(&[127, 0, 0, 3]);
        v4[36..40].copy_from_slice(&[127, 0, 0, 2]);
        assert!(from_path(&v4, &crate::link_local_gid(ip("127.0.0.3"))));
        assert!(!from_path(&v4, &crate::link_local_gid(ip("127.0.0.9"))));
        let mut v6 = [0u8; 40];
        v6[0] = 0x60;
        v6[8..24].copy_from_slice(&ip_octets("fd99::3"));
        v6[24..40].copy_from_slice(&ip_octets("fd99::2"));
        assert!(from_path(&v6, &crate::link_local_gid(ip("fd99::3"))));
        assert!(!from_path(&v6, &crate::link_local_gid(ip("fd99::4"))));
    }

    /// One response packet (ACK, NAK or RNR NAK by `syndrome`) for `qpn` at `psn`.
    fn aeth_packet(qpn: u32, psn: u32, syndrome: u8) -> Vec<u8> {
        let hdr = codec::Headers {
            bth: codec::Bth {
                opcode: codec::op::ACKNOWLEDGE,
                pkey: 0xFFFF,
                dest_qp: qpn,
                psn,
                ..Default::default()
            },
            aeth: Some(codec::Aeth { syndrome, msn: 0 }),
            ..Default::default()
        };
        let mut buf = [0u8; 64];
        let n = codec::emit(&hdr, &[], &mut buf).unwrap();
        buf[..n].to_vec()
    }

    /// The window of the QPs made by `rts` (their path's GID is all zeros).
    fn window(ep: &Engine) -> PeerWindow {
        ep.peer_window(&[0; 16])
            .expect("an RC QP in RTS has a peer window")
    }

    /// RFC 5681 §3.1 (in packets): the window starts at `initial_cwnd_packets`, grows by
    /// one per acknowledged packet in slow start, halves on a NAK PSN sequence error (a
    /// loss), once per recovery episode, then grows by one per window of acknowledged
    /// packets. An RNR NAK (IBTA 9.7.5.2.8: the responder had no receive WQE) is no loss.
    #[test]
    fn peer_window_halves_on_nak_sequence_error_not_on_rnr_nak_and_grows_on_acks() {
        let mut ep = Engine::new(EngineConfig::default());
        let mut mem = Flat(vec![0; 64]);
        let qpn = rts_rc_retrying(&mut ep);
        for i in 0..200 {
            ep.post_send(qpn, SendWr::new(i, SendOp::Send, vec![]))
                .unwrap();
        }
        assert_eq!(drain(&mut ep, &mem).len(), 64, "the initial window");
        let w = window(&ep);
        assert_eq!((w.cwnd, w.ssthresh, w.in_flight, w.qps), (64, 1024, 64, 1));
        assert_eq!(ep.counters().window_limited, 1);

        // Slow start: 10 PSNs acknowledged, 10 more packets of window.
        ep.handle_packet(1, &aeth_packet(qpn, 9, codec::SYNDROME_ACK), None, &mut mem);
        assert_eq!((window(&ep).cwnd, window(&ep).in_flight), (74, 54));
        assert_eq!(drain(&mut ep, &mem).len(), 20);
        assert_eq!(window(&ep).in_flight, 74);

        // RNR NAK at PSN 10 (timer code 1: 10 µs): the QP rewinds and waits, the window
        // stays.
        let rnr = codec::SYNDROME_RNR | 1;
        ep.handle_packet(2, &aeth_packet(qpn, 10, rnr), None, &mut mem);
        assert_eq!(ep.counters().rnr_naks_received, 1);
        let w = window(&ep);
        assert_eq!((w.cwnd, w.in_flight), (74, 0));
        assert_eq!(ep.counters().cwnd_reductions, 0);
        assert!(drain(&mut ep, &mem).is_empty(), "waiting for the RNR timer");
        ep.handle_timeout(20_002);
        assert_eq!(drain(&mut ep, &mem).len(), 74);

        // NAK sequence error at PSN 20: PSNs 10..20 acknowledged (cwnd 84), then halved.
        ep.handle_packet(3, &aeth_packet(qpn, 20, codec::NAK_PSN_SEQ), None, &mut mem);
        let w = window(&ep);
        assert_eq!((w.cwnd, w.ssthresh), (42, 42));
        assert_eq!(ep.counters().cwnd_reductions, 1);
        // A second loss signal in the same episode (74 PSNs were in flight at the cut,
        // 5 acknowledged since) does not halve again.
        ep.handle_packet(4, &aeth_packet(qpn, 25, codec::NAK_PSN_SEQ), None, &mut mem);
        assert_eq!(ep.counters().retries, 2, "both NAKs went back N");
        assert_eq!((window(&ep).cwnd, ep.counters().cwnd_reductions), (42, 1));

        // Congestion avoidance: 5 + 59 acknowledged PSNs, one more packet per 42.
        ep.handle_packet(
            5,
            &aeth_packet(qpn, 83, codec::SYNDROME_ACK),
            None,
            &mut mem,
        );
        let w = window(&ep);
        assert_eq!((w.cwnd, w.ssthresh, w.in_flight), (43, 42, 0));
        ep.check_peer_windows().unwrap();
    }

    /// A local ACK timeout (IBTA 9.7.6.1.3: the requester heard nothing) is a loss: the
    /// window halves; UC QPs have no window.
    #[test]
    fn peer_window_halves_on_local_ack_timeout() {
        let mut ep = Engine::new(EngineConfig::default());
        let mem = Flat(vec![0; 64]);
        let qpn = rts_rc_retrying(&mut ep);
        for i in 0..10 {
            ep.post_send(qpn, SendWr::new(i, SendOp::Send, vec![]))
                .unwrap();
        }
        assert_eq!(drain(&mut ep, &mem).len(), 10);
        let deadline = ep.poll_timeout().expect("the retransmit timer runs");
        ep.handle_timeout(deadline);
        assert_eq!(ep.counters().timeouts, 1);
        let w = window(&ep);
        assert_eq!((w.cwnd, w.ssthresh, w.in_flight), (32, 32, 0));
        assert_eq!(ep.counters().cwnd_reductions, 1);
        assert_eq!(
            drain(&mut ep, &mem).len(),
            10,
            "go-back-N within the window"
        );

        let mut uc = Engine::new(EngineConfig::default());
        rts(&mut uc, QpType::Uc, Mtu::Mtu1024, 0);
        assert_eq!(uc.peer_window(&[0; 16]), None);
    }

    /// An engine whose peer windows stay at `packets` (initial, least and most).
    fn with_fixed_window(packets: u32) -> Engine {
        Engine::new(EngineConfig {
            initial_cwnd_packets: packets,
            min_cwnd_packets: packets,
            max_cwnd_packets: packets,
            ..EngineConfig::default()
        })
    }

    /// Many QPs to one peer posting at once put the window's packets on the wire, not one
    /// each: a QP with nothing in flight waits while other QPs' packets to that peer are
    /// unacknowledged, and each answer that opens the window wakes as many of the waiting
    /// QPs, in the order they were held (RFC 5681 §3.1: the window bounds what is in
    /// flight to the peer, whatever the number of QPs).
    #[test]
    fn idle_qps_wait_for_the_peer_window_while_other_qps_have_packets_in_flight() {
        let mut ep = with_fixed_window(4);
        let mut mem = Flat(vec![0; 64]);
        let qpns: Vec<u32> = (0..12).map(|_| rts_rc_retrying(&mut ep)).collect();
        for (i, &qpn) in qpns.iter().enumerate() {
            ep.post_send(qpn, SendWr::new(i as u64, SendOp::Send, vec![]))
                .unwrap();
        }
        let first = drain(&mut ep, &mem);
        assert_eq!(first.len(), 4, "the window's packets, not one per QP");
        assert_eq!(window(&ep).in_flight, 4);
        ep.check_schedule(&mem).unwrap();

        // Each QP's packet acknowledged opens the window by one: one waiting QP sends.
        let mut sent = first.len();
        for (t, qpn) in qpns.iter().enumerate().take(8) {
            ep.handle_packet(
                t as u64 + 1,
                &aeth_packet(*qpn, 0, codec::SYNDROME_ACK),
                None,
                &mut mem,
            );
            let out = drain(&mut ep, &mem);
            assert_eq!(out.len(), 1, "one QP woken per packet acknowledged");
            sent += out.len();
            assert_eq!(window(&ep).in_flight, 4);
            ep.check_schedule(&mem).unwrap();
            ep.check_peer_windows().unwrap();
        }
        assert_eq!(sent, qpns.len(), "every QP sent its request");
        assert_eq!(ep.counters().retransmitted_packets, 0);
    }

    /// Responses are never held by the requester's window (IBTA 9.7.5: the responder
    /// answers every request it accepts): with the window full of this engine's own
    /// requests, an incoming READ is answered with all its response packets and a WRITE
    /// with its ACK, and no request slips out with them.
    #[test]
    fn acks_and_read_responses_leave_while_the_peer_window_is_full() {
        let mut ep = with_fixed_window(4);
        let mut mem = Flat(vec![7; 8192]);
        let qpn = rts_rc_retrying(&mut ep);
        for i in 0..10 {
            ep.post_send(qpn, SendWr::new(i, SendOp::Send, vec![]))
                .unwrap();
        }
        assert_eq!(drain(&mut ep, &mem).len(), 4);
        assert_eq!(window(&ep).in_flight, 4);

        let request = |opcode, psn, len| {
            let hdr = codec::Headers {
                bth: codec::Bth {
                    opcode,
                    pkey: 0xFFFF,
                    dest_qp: qpn,
                    psn,
                    ack_req: true,
                    ..Default::default()
                },
                reth: Some(codec::Reth {
                    va: 0,
                    rkey: 1,
                    dma_len: len,
                }),
                ..Default::default()
            };
            let mut buf = vec![0u8; 4200];
            let payload = vec![
                1u8;
                if opcode == codec::op::WRITE_ONLY {
                    len as usize
                } else {
                    0
                }
            ];
            let n = codec::emit(&hdr, &payload, &mut buf).unwrap();
            buf.truncate(n);
            buf
        };
        ep.handle_packet(
            1,
            &request(codec::op::READ_REQUEST, 0, 3000),
            None,
            &mut mem,
        );
        let out: Vec<u8> = drain(&mut ep, &mem).iter().map(|p| p[0]).collect();
        assert_eq!(
            out,
            [
                codec::op::READ_RESPONSE_FIRST,
                codec::op::READ_RESPONSE_MIDDLE,
                codec::op::READ_RESPONSE_LAST
            ]
        );
        ep.handle_packet(2, &request(codec::op::WRITE_ONLY, 3, 16), None, &mut mem);
        let out: Vec<u8> = drain(&mut ep, &mem).iter().map(|p| p[0]).collect();
        assert_eq!(out, [codec::op::ACKNOWLEDGE]);
        assert_eq!(window(&ep).in_flight, 4, "the window is still full");
    }

    /// What the device does after every input (`softverbs-device`'s run): local operations
    /// and transmits until neither does anything, then the timers due. Returns the packets.
    fn device_run(ep: &mut Engine, now: u64, mem: &mut Flat) -> Vec<Vec<u8>> {
        let mut buf = vec![0u8; ep.max_packet_len()];
        let mut out = Vec::new();
        loop {
            let ran = ep.execute_local_operations(mem);
            let before = out.len();
            while let Some(t) = ep.poll_transmit(now, &mut buf, mem) {
                out.push(buf[..t.len].to_vec());
            }
            if ran == 0 && out.len() == before {
                break;
            }
        }
        if ep.poll_timeout().is_some_and(|t| t <= now) {
            ep.handle_timeout(now);
        }
        out
    }

    /// Issue #15: the outputs visit the QPs that have work, not every QP. With 2,048 idle
    /// RC QPs in RTS beside one busy QP, 1,000 messages posted, sent and acknowledged one
    /// by one (each input followed by the device's run) visit fewer than 10 QPs per
    /// packet, where a scan of every QP per call visits thousands.
    #[test]
    fn idle_qps_cost_nothing_to_the_outputs() {
        let mut ep = Engine::new(EngineConfig::default());
        let mut mem = Flat(vec![0; 64]);
        for _ in 0..2048 {
            rts_rc_retrying(&mut ep);
        }
        let busy = rts_rc_retrying(&mut ep);
        device_run(&mut ep, 0, &mut mem);
        let before = ep.counters().qps_visited;
        let messages = 1000u32;
        for i in 0..messages {
            let now = u64::from(i) * 1000;
            ep.post_send(busy, SendWr::new(u64::from(i), SendOp::Send, vec![]))
                .unwrap();
            let sent = device_run(&mut ep, now, &mut mem);
            assert_eq!(sent.len(), 1, "message {i}");
            let ack = aeth_packet(busy, i, codec::SYNDROME_ACK);
            ep.handle_packet(now + 500, &ack, None, &mut mem);
            assert!(device_run(&mut ep, now + 500, &mut mem).is_empty());
            assert_eq!(ep.poll_timeout(), None, "nothing in flight after the ACK");
        }
        let visited = ep.counters().qps_visited - before;
        assert!(
            visited < 10 * u64::from(messages),
            "{visited} QPs visited for {messages} packets"
        );
        assert_eq!(ep.counters().packets_sent, u64::from(messages));
    }

    /// Issue #15: a QP is found by its number whatever its rank among the engine's QPs, and
    /// so is its SRQ. With 10,000 RC QPs in RTS, each receiving through an SRQ of its own,
    /// the first and the last created behave alike: the SEND each posts leaves as the same
    /// bytes, the peer's ACK completes it, the peer's SEND lands through the QP's SRQ and
    /// is acknowledged with the same bytes, and the counters move alike. Once destroyed,
    /// the last QP's number is dropped as unknown. (What a lookup costs is not counted
    /// here: the `qps` map of `Engine` says.)
    #[test]
    fn the_first_and_the_ten_thousandth_qp_behave_alike() {
        const QPS: usize = 10_000;
        let mut ep = Engine::new(EngineConfig::default());
        let mut mem = Flat(vec![0; 4096]);
        let base = QpAttr {
            retry_cnt: 7,
            rnr_retry: 7,
            ..QpAttr::default()
        };
        let qps: Vec<(u32, SrqId)> = (0..QPS)
            .map(|_| {
                let srq = ep
                    .create_srq(SrqInit {
                        max_wr: 1,
                        max_sge: 1,
                        srq_limit: 0,
                    })
                    .unwrap();
                let init = QpInit {
                    srq: Some(srq),
                    ..QpInit::new(QpType::Rc)
                };
                (rts_from(&mut ep, init, Mtu::Mtu1024, 0, base), srq)
            })
            .collect();
        let without_qpn = |wc: WorkCompletion| RawFields {
            qp_num: 0,
            ..wc.raw()
        };
        let mut exchange = |ep: &mut Engine, (qpn, srq): (u32, SrqId)| {
            let before = ep.counters().clone();
            let wr = SendWr::new(1, SendOp::Send, vec![]).with_flags(SendFlags::SIGNALED);
            ep.post_send(qpn, wr).unwrap();
            let sent = drain(ep, &mem);
            ep.handle_packet(1, &aeth_packet(qpn, 0, codec::SYNDROME_ACK), None, &mut mem);
            let send_wc = ep.poll_completion().expect("the ACK completes the SEND").wc;
            assert_eq!(send_wc.qp_num(), qpn);

            let recv = RecvWr {
                wr_id: 2,
                sg_list: [Sge {
                    addr: 0,
                    length: 64,
                    lkey: 1,
                }]
                .into(),
            };
            ep.post_srq_recv(srq, recv).unwrap();
            let send = codec::Headers {
                bth: codec::Bth {
                    opcode: codec::op::SEND_ONLY,
                    pkey: 0xFFFF,
                    dest_qp: qpn,
                    psn: 0,
                    ack_req: true,
                    ..Default::default()
                },
                ..Default::default()
            };
            let mut buf = [0u8; 64];
            let n = codec::emit(&send, b"hi", &mut buf).unwrap();
            ep.handle_packet(2, &buf[..n], None, &mut mem);
            let recv_wc = ep.poll_completion().expect("the SEND is received").wc;
            assert_eq!(recv_wc.qp_num(), qpn);
            let acks = drain(ep, &mem);
            assert!(ep.poll_completion().is_none());
            assert_eq!(ep.poll_timeout(), None, "nothing left in flight");

            let after = ep.counters();
            let moved: Vec<(String, u64)> = after
                .fields()
                .into_iter()
                .zip(before.fields())
                .map(|((name, now), (_, then))| (name, now - then))
                .collect();
            (
                sent,
                without_qpn(send_wc),
                without_qpn(recv_wc),
                acks,
                moved,
            )
        };
        let first = exchange(&mut ep, qps[0]);
        assert_eq!(first.0.len(), 1, "one SEND ONLY");
        assert_eq!(first.3.len(), 1, "one ACK");
        assert_eq!(exchange(&mut ep, qps[QPS - 1]), first);

        let (last, _) = qps[QPS - 1];
        ep.destroy_qp(last).unwrap();
        ep.handle_packet(
            3,
            &aeth_packet(last, 1, codec::SYNDROME_ACK),
            None,
            &mut mem,
        );
        assert_eq!(ep.counters().drops(DropReason::UnknownQp), 1);
        ep.check_peer_windows().unwrap();
        ep.check_schedule(&mem).unwrap();
    }

    fn ip_octets(s: &str) -> [u8; 16] {
        s.parse::<Ipv6Addr>().unwrap().octets()
    }

    /// A UD QP in RTS with Q_Key `qkey`.
    fn ud_rts(ep: &mut Engine, qkey: u32) -> u32 {
        let qpn = ep.create_qp(QpInit::new(QpType::Ud)).unwrap();
        let mut attr = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qkey,
            ..QpAttr::default()
        };
        let init = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY;
        ep.modify_qp(qpn, &attr, init).unwrap();
        attr.qp_state = QpState::Rtr;
        ep.modify_qp(qpn, &attr, AttrMask::STATE).unwrap();
        attr.qp_state = QpState::Rts;
        ep.modify_qp(qpn, &attr, AttrMask::STATE | AttrMask::SQ_PSN)
            .unwrap();
        qpn
    }

    /// A UD SEND ONLY to the multicast QPN (IBTA 9.2: 0xFFFFFF) with Q_Key `qkey` from
    /// source QP 0x77, and the GRH area of its datagram from 127.0.0.9 to IPv4 `group`.
    fn multicast_send(qkey: u32, group: [u8; 4], payload: &[u8]) -> (Vec<u8>, [u8; 40]) {
        let send = codec::Headers {
            bth: codec::Bth {
                opcode: codec::op::SEND_ONLY | 0x60,
                pkey: 0xFFFF,
                dest_qp: MULTICAST_QPN,
                psn: 3,
                ..Default::default()
            },
            deth: Some(codec::Deth { qkey, src_qp: 0x77 }),
            ..Default::default()
        };
        let mut buf = [0u8; 128];
        let n = codec::emit(&send, payload, &mut buf).unwrap();
        let mut grh = [0u8; 40];
        grh[20] = 0x45;
        grh[32..36].copy_from_slice(&[127, 0, 0, 9]);
        grh[36..40].copy_from_slice(&group);
        (buf[..n].to_vec(), grh)
    }

    fn group_gid(group: [u8; 4]) -> [u8; 16] {
        std::net::Ipv4Addr::from(group).to_ipv6_mapped().octets()
    }

    /// ibv_attach_mcast(3), IBTA 10.5.2.2: a multicast datagram reaches every UD QP attached
    /// to its group — each through its own receive queue and Q_Key check, the GRH area
    /// naming the group — and no QP that is not attached; a group nobody joined drops it.
    #[test]
    fn a_multicast_datagram_reaches_every_attached_qp_with_a_matching_qkey_and_no_other() {
        let mut ep = Engine::new(EngineConfig::default());
        let mut mem = Flat(vec![0; 4096]);
        let group = [239, 1, 2, 3];
        let attached = [ud_rts(&mut ep, 0x11), ud_rts(&mut ep, 0x11)];
        let bystander = ud_rts(&mut ep, 0x11);
        let other_qkey = ud_rts(&mut ep, 0x22);
        for (i, qpn) in [attached[0], attached[1], bystander, other_qkey]
            .into_iter()
            .enumerate()
        {
            let recv = RecvWr {
                wr_id: i as u64,
                sg_list: [Sge {
                    addr: 256 * i as u64,
                    length: 256,
                    lkey: 1,
                }]
                .into(),
            };
            ep.post_recv(qpn, recv).unwrap();
        }
        for qpn in [attached[0], attached[1], other_qkey] {
            assert_eq!(
                ep.attach_mcast(qpn, group_gid(group)),
                Ok(qpn == attached[0]),
                "true for the group's first QP only"
            );
        }
        let (packet, grh) = multicast_send(0x11, group, b"to all");
        ep.handle_packet(1, &packet, Some(&grh), &mut mem);
        let mut got: Vec<u32> = std::iter::from_fn(|| ep.poll_completion())
            .map(|c| {
                assert_eq!(c.wc.result().map(|w| w.byte_len()), Ok(40 + 6));
                c.wc.qp_num()
            })
            .collect();
        got.sort_unstable();
        assert_eq!(got, attached);
        // The GRH area each received names the group as its destination.
        assert_eq!(&mem.0[36..40], &group);
        assert_eq!(&mem.0[256 + 40..256 + 46], b"to all");
        assert_eq!(ep.counters().drops(DropReason::QkeyMismatch), 1);
        assert!(mem.0[512..768].iter().all(|&b| b == 0), "not attached");

        let (packet, grh) = multicast_send(0x11, [239, 9, 9, 9], b"nobody");
        ep.handle_packet(2, &packet, Some(&grh), &mut mem);
        assert_eq!(ep.counters().drops(DropReason::UnknownGroup), 1);
        assert!(ep.poll_completion().is_none());
    }

    /// ibv_attach_mcast(3) / ibv_detach_mcast(3) as the kernel checks them: only UD QPs,
    /// only multicast GIDs (EINVAL); attaching twice is a success; detaching a QP that is not
    /// attached is EINVAL; ibv_destroy_qp(3) of an attached QP is EBUSY (`uverbs_free_qp`).
    #[test]
    fn attach_and_detach_follow_the_kernels_rules_and_an_attached_qp_is_not_destroyed() {
        let mut ep = Engine::new(EngineConfig::default());
        let g = group_gid([239, 0, 0, 1]);
        let ud = ud_rts(&mut ep, 1);
        let rc = rts(&mut ep, QpType::Rc, Mtu::Mtu1024, 0);
        assert_eq!(
            ep.attach_mcast(rc, g),
            Err(VerbsError::MulticastNeedsUd {
                qp_type: QpType::Rc
            })
        );
        let unicast = group_gid([127, 0, 0, 1]);
        assert_eq!(
            ep.attach_mcast(ud, unicast),
            Err(VerbsError::NotMulticast { gid: unicast })
        );
        assert_eq!(
            ep.detach_mcast(ud, g),
            Err(VerbsError::NotAttached { gid: g, qpn: ud })
        );
        assert_eq!(ep.attach_mcast(ud, g), Ok(true));
        assert_eq!(ep.attach_mcast(ud, g), Ok(false));
        assert_eq!(
            ep.destroy_qp(ud),
            Err(VerbsError::InUse {
                object: Object::Qp,
                by: Object::McastGroup,
                count: 1
            })
        );
        assert_eq!(ep.detach_mcast(ud, g), Ok(true));
        assert_eq!(ep.destroy_qp(ud), Ok(()));
    }
}
