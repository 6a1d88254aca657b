//! The responder (reference §2.3, §2.8, §3): checks and executes incoming requests —
//! PSN (with one NAK per gap), opcode sequence, QP access flags, resources (RNR NAK when
//! no receive WQE), lengths, R_Keys — places SEND data into receive WQEs (RQ or SRQ),
//! executes RDMA writes, reads and atomics through [`Memory`], replays duplicates (re-ACK,
//! read sub-range replay, atomic replay cache), and produces receive completions. UC drops
//! broken messages and resynchronises on any FIRST or ONLY packet; UD checks the Q_Key and
//! writes the 40-byte GRH area.
//!
//! Replies to duplicate and out-of-sequence RC requests go through a limiter (issue #11):
//! per QP and expected PSN at most one ACK and one NAK sequence error per window
//! ([`EngineConfig::duplicate_reply_window_ns`]), per PSN at most one read-data or
//! AtomicAck replay per window (at most one per responder resource in all), none while
//! the same AtomicAck is still queued, and none while the output queue holds more than
//! its protocol bound — so a flood of copies of a packet neither reflects one packet per
//! copy to the peer, nor amplifies into read data, nor grows `resp_out`.
//!
//! [`EngineConfig::duplicate_reply_window_ns`]: crate::EngineConfig

use softverbs_cq::{WcFlags, WcOpcode, WcStatus, WorkCompletion};

use crate::codec::{self, Kind, Packet, SYNDROME_ACK, SYNDROME_RNR};
use crate::memory::{traced, Accessor, AtomicOp, MemError, MemKey, Memory};
use crate::output::{AsyncEvent, Completion, CqTarget, DropReason};
use crate::psn;
use crate::qp::{ack_timeout_ns, Ctx, CurMsg, Qp, Resource, RespOut};
use crate::requester::{mtu_pieces, scatter};
use crate::types::{AccessFlags, QpState, QpType};
use crate::wr::{FlushPlacement, FlushSelectivity, RecvWr};

/// Largest RDMA message (reference §1.6).
const MAX_MSG: u64 = 1 << 31;

/// A class-C (or A) responder error: NAK syndrome, and what the receive WQE in progress
/// (if any) completes with.
struct Fault {
    syndrome: u8,
    recv_status: WcStatus,
    event: fn(u32) -> AsyncEvent,
}

const INVALID: Fault = Fault {
    syndrome: codec::NAK_INVALID_REQUEST,
    recv_status: WcStatus::RemInvReqErr,
    event: |qpn| AsyncEvent::QpRequestError { qpn },
};

const REMOTE_ACCESS: Fault = Fault {
    syndrome: codec::NAK_REMOTE_ACCESS,
    recv_status: WcStatus::LocAccessErr,
    event: |qpn| AsyncEvent::QpAccessError { qpn },
};

impl Qp {
    /// A request packet for this QP, received at `now`.
    pub(crate) fn on_request(
        &mut self,
        now: u64,
        pkt: &Packet<'_>,
        grh: Option<&[u8; 40]>,
        mem: &mut impl Memory,
        ctx: &mut Ctx<'_>,
    ) {
        if !matches!(
            self.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            ctx.counters
                .drop_packet(DropReason::WrongState, self.qpn, pkt.hdr.bth.psn);
            return;
        }
        let transport_ok = matches!(
            (self.init.qp_type, pkt.info.transport),
            (QpType::Rc, codec::Transport::Rc)
                | (QpType::Uc, codec::Transport::Uc)
                | (QpType::Ud, codec::Transport::Ud)
        );
        if !transport_ok {
            ctx.counters
                .drop_packet(DropReason::WrongTransport, self.qpn, pkt.hdr.bth.psn);
            return;
        }
        if self.state == QpState::Rtr && !self.comm_est_raised {
            self.comm_est_raised = true;
            ctx.events.push_back(AsyncEvent::CommEst { qpn: self.qpn });
        }
        match self.init.qp_type {
            QpType::Rc => self.rc_request(now, pkt, mem, ctx),
            QpType::Uc => self.uc_request(pkt, mem, ctx),
            QpType::Ud => self.ud_request(pkt, grh, mem, ctx),
        }
    }

    /// Whether the reply `last` records (the ACK or NAK last queued in answer to a
    /// duplicate or out-of-sequence request) was for the current expected PSN and less
    /// than a window before `now`. The ACK of a new request does not count: the first
    /// duplicate after it is always answered.
    fn answered_recently(&self, last: Option<(u32, u64)>, now: u64, ctx: &Ctx<'_>) -> bool {
        let window = self.reply_window(ctx);
        last.is_some_and(|(epsn, at)| epsn == self.epsn && now.saturating_sub(at) < window)
    }

    /// The reply limiter's window of this QP: half its local ACK timeout, at most
    /// [`EngineConfig::duplicate_reply_window_ns`](crate::EngineConfig) (which an
    /// infinite timeout gets).
    pub(crate) fn reply_window(&self, ctx: &Ctx<'_>) -> u64 {
        let cap = ctx.config.duplicate_reply_window_ns;
        ack_timeout_ns(self.attr.timeout).map_or(cap, |t| (t / 2).min(cap))
    }

    /// `resp_out` holds as much as the protocol ever needs at once: each responder
    /// resource's original response and one replay, plus a few ACKs / NAKs. Replies to
    /// duplicates are held back beyond that, so a flood cannot grow the queue.
    fn resp_out_full(&self) -> bool {
        let resources = usize::from(self.attr.max_dest_rd_atomic.max(1));
        self.resp_out.len() >= 2 * resources + 8
    }

    /// Records a read-data or AtomicAck replay of `psn` at `now` if none was made in the
    /// window and the replays in the window are fewer than the responder resources;
    /// returns whether the replay may go out.
    fn replay_allowed(&mut self, psn: u32, now: u64, ctx: &Ctx<'_>) -> bool {
        let window = self.reply_window(ctx);
        self.replays
            .retain(|&(_, at)| now.saturating_sub(at) < window);
        let resources = usize::from(self.attr.max_dest_rd_atomic.max(1));
        if self.replays.iter().any(|&(p, _)| p == psn) || self.replays.len() >= resources {
            return false;
        }
        if window > 0 {
            self.replays.push_back((psn, now));
        }
        true
    }

    fn queue_ack(&mut self, psn: u32, syndrome: u8) {
        let item = RespOut::Ack {
            psn,
            syndrome,
            msn: self.msn,
        };
        // Coalesce: a newer plain ACK replaces an unsent one.
        if syndrome == SYNDROME_ACK {
            if let Some(RespOut::Ack {
                syndrome: SYNDROME_ACK,
                ..
            }) = self.resp_out.back()
            {
                self.resp_out.pop_back();
            }
        }
        self.resp_out.push_back(item);
    }

    /// NAK the request, complete the receive WQE in progress with the fault's status,
    /// move to ERR (classes A and C).
    fn rc_fault(&mut self, psn: u32, fault: Fault, wqe: Option<RecvWr>, ctx: &mut Ctx<'_>) {
        self.queue_ack(psn, fault.syndrome);
        let wqe = wqe.or_else(|| match std::mem::take(&mut self.cur) {
            CurMsg::Send { wqe, .. } => Some(wqe),
            _ => None,
        });
        if let Some(wqe) = wqe {
            self.fail_recv(&wqe, fault.recv_status, WcOpcode::Recv, ctx);
        }
        self.responder_error((fault.event)(self.qpn), ctx);
    }

    fn rc_request(&mut self, now: u64, pkt: &Packet<'_>, mem: &mut impl Memory, ctx: &mut Ctx<'_>) {
        // Every key is checked against the QP's own PD (SRQ receives included).
        let pd = self.init.pd;
        let by = Accessor::qp(pd, self.qpn);
        let psn = pkt.hdr.bth.psn;
        let d = psn::diff(psn, self.epsn);
        if d > 0 {
            ctx.counters
                .drop_packet(DropReason::OutOfSequence, self.qpn, pkt.hdr.bth.psn);
            if !self.nak_sent {
                // One NAK per gap; and one per window for the same expected PSN even when
                // a request at it (an RNR NAK) re-armed the gap.
                if self.answered_recently(self.last_nak, now, ctx) || self.resp_out_full() {
                    ctx.counters.duplicate_replies_suppressed += 1;
                    return;
                }
                self.nak_sent = true;
                self.last_nak = Some((self.epsn, now));
                tracing::debug!(
                    qpn = self.qpn,
                    psn,
                    expected_psn = self.epsn,
                    "PSN sequence error (packets lost): NAK sent"
                );
                self.queue_ack(self.epsn, codec::NAK_PSN_SEQ);
            }
            return;
        }
        if d < 0 {
            self.rc_duplicate(now, pkt, ctx);
            return;
        }
        self.nak_sent = false;
        let info = pkt.info;
        let mtu = u64::from(self.mtu(ctx.config));

        // Opcode sequence.
        let seq_ok = match (&self.cur, info.kind) {
            (CurMsg::Send { .. }, Kind::Send) => !info.first,
            (CurMsg::Write { .. }, Kind::Write) => !info.first,
            (CurMsg::Idle, _) => info.first,
            _ => false,
        };
        if !seq_ok {
            self.rc_fault(psn, INVALID, None, ctx);
            return;
        }
        // Operation allowed by qp_access_flags, resources.
        let access = self.attr.qp_access_flags;
        let flush = pkt.hdr.feth.map(|f| {
            (
                FlushPlacement::from_bits(f.placement).filter(|p| !p.is_empty()),
                FlushSelectivity::from_raw(f.selectivity),
            )
        });
        let allowed = match info.kind {
            // IBTA 1.5 / rxe's check_qp_attr_access: ATOMIC WRITE is a write.
            Kind::Write | Kind::AtomicWrite => access.contains(AccessFlags::REMOTE_WRITE),
            Kind::ReadRequest => access.contains(AccessFlags::REMOTE_READ),
            Kind::CompareSwap | Kind::FetchAdd => access.contains(AccessFlags::REMOTE_ATOMIC),
            // A FLUSH needs the QP's FLUSH_* right of each placement bit; a placement type
            // that is empty or reserved, or a reserved selectivity level, is an invalid
            // request.
            Kind::Flush => match flush {
                Some((Some(placement), Some(_))) => {
                    (!placement.contains(FlushPlacement::GLOBAL)
                        || access.contains(AccessFlags::FLUSH_GLOBAL))
                        && (!placement.contains(FlushPlacement::PERSISTENT)
                            || access.contains(AccessFlags::FLUSH_PERSISTENT))
                }
                _ => false,
            },
            _ => true,
        };
        let needs_resource = matches!(
            info.kind,
            Kind::ReadRequest
                | Kind::CompareSwap
                | Kind::FetchAdd
                | Kind::AtomicWrite
                | Kind::Flush
        );
        if !allowed || (needs_resource && self.attr.max_dest_rd_atomic == 0) {
            self.rc_fault(psn, INVALID, None, ctx);
            return;
        }
        let needs_wqe =
            (info.kind == Kind::Send && info.first) || (info.kind == Kind::Write && info.imm);
        if needs_wqe && !self.has_recv(ctx) {
            tracing::debug!(
                qpn = self.qpn,
                psn,
                min_rnr_timer = self.attr.min_rnr_timer,
                "no receive posted: RNR NAK sent"
            );
            self.queue_ack(psn, SYNDROME_RNR | (self.attr.min_rnr_timer & 0x1F));
            return;
        }
        // Packet length (reference §1.6).
        let len = pkt.payload.len() as u64;
        let len_ok = match (info.first, info.last) {
            _ if !info.payload => true,
            (true, true) => len <= mtu,
            (false, true) => len >= 1 && len <= mtu,
            _ => len == mtu,
        };
        if !len_ok {
            self.rc_fault(psn, INVALID, None, ctx);
            return;
        }

        match info.kind {
            Kind::Send => {
                if info.first {
                    match self.take_recv(ctx) {
                        Some(wqe) => self.cur = CurMsg::Send { wqe, offset: 0 },
                        None => return,
                    }
                }
                let CurMsg::Send { wqe, offset } = &mut self.cur else {
                    return;
                };
                if *offset + len > wqe.capacity() {
                    let fault = Fault {
                        syndrome: codec::NAK_INVALID_REQUEST,
                        recv_status: WcStatus::LocLenErr,
                        event: |qpn| AsyncEvent::QpRequestError { qpn },
                    };
                    self.rc_fault(psn, fault, None, ctx);
                    return;
                }
                let placed = scatter(mem, pd, &wqe.sg_list, *offset, pkt.payload);
                if traced(self.qpn, "receive WQE", placed).is_err() {
                    let fault = Fault {
                        syndrome: codec::NAK_REMOTE_OPERATIONAL,
                        recv_status: WcStatus::LocProtErr,
                        event: |qpn| AsyncEvent::QpFatal { qpn },
                    };
                    self.rc_fault(psn, fault, None, ctx);
                    return;
                }
                *offset += len;
                if info.last {
                    let CurMsg::Send { wqe, offset } = std::mem::take(&mut self.cur) else {
                        return;
                    };
                    let mut wc = WorkCompletion::success(wqe.wr_id, WcOpcode::Recv, self.qpn)
                        .with_byte_len(offset as u32);
                    if let Some(imm) = pkt.hdr.imm {
                        wc = wc.with_imm(imm);
                    }
                    if let Some(rkey) = pkt.hdr.ieth {
                        let invalidated = mem.invalidate(pd, rkey);
                        if traced(self.qpn, "R_Key to invalidate", invalidated).is_err() {
                            self.rc_fault(psn, INVALID, Some(wqe), ctx);
                            return;
                        }
                        wc = wc.with_invalidated_rkey(rkey);
                    }
                    self.msn = psn::add(self.msn, 1);
                    ctx.completions.push_back(Completion {
                        cq: CqTarget::Recv,
                        wc,
                        solicited: pkt.hdr.bth.solicited,
                    });
                }
            }
            Kind::Write => {
                if info.first {
                    let Some(reth) = pkt.hdr.reth else { return };
                    let total = u64::from(reth.dma_len);
                    if total > MAX_MSG {
                        self.rc_fault(psn, INVALID, None, ctx);
                        return;
                    }
                    let need = AccessFlags::REMOTE_WRITE;
                    if total > 0
                        && traced(
                            self.qpn,
                            "RDMA WRITE target",
                            mem.check_remote(by, reth.rkey, reth.va, total, need),
                        )
                        .is_err()
                    {
                        // A write with immediate consumes (and fails) its receive WQE:
                        // IBTA's "local access error" on the responder.
                        let wqe = if info.imm { self.take_recv(ctx) } else { None };
                        let fault = Fault {
                            syndrome: codec::NAK_REMOTE_ACCESS,
                            recv_status: WcStatus::LocAccessErr,
                            event: |qpn| AsyncEvent::QpAccessError { qpn },
                        };
                        self.rc_fault(psn, fault, wqe, ctx);
                        return;
                    }
                    self.cur = CurMsg::Write {
                        va: reth.va,
                        rkey: reth.rkey,
                        remaining: total,
                        total: reth.dma_len,
                    };
                }
                let CurMsg::Write {
                    va,
                    rkey,
                    remaining,
                    total,
                } = &mut self.cur
                else {
                    return;
                };
                if len > *remaining || (info.last && len != *remaining) {
                    self.rc_fault(psn, INVALID, None, ctx);
                    return;
                }
                if len > 0
                    && mem
                        .write(by, MemKey::Remote(*rkey), *va, pkt.payload)
                        .is_err()
                {
                    let fault = Fault {
                        syndrome: codec::NAK_REMOTE_ACCESS,
                        recv_status: WcStatus::LocAccessErr,
                        event: |qpn| AsyncEvent::QpAccessError { qpn },
                    };
                    self.rc_fault(psn, fault, None, ctx);
                    return;
                }
                *va += len;
                *remaining -= len;
                let total = *total;
                if info.last {
                    self.cur = CurMsg::Idle;
                    self.msn = psn::add(self.msn, 1);
                    if let Some(imm) = pkt.hdr.imm {
                        let Some(wqe) = self.take_recv(ctx) else {
                            return;
                        };
                        let wc =
                            WorkCompletion::success(wqe.wr_id, WcOpcode::RecvRdmaWithImm, self.qpn)
                                .with_byte_len(total)
                                .with_imm(imm);
                        ctx.completions.push_back(Completion {
                            cq: CqTarget::Recv,
                            wc,
                            solicited: pkt.hdr.bth.solicited,
                        });
                    }
                }
            }
            Kind::ReadRequest => {
                let Some(reth) = pkt.hdr.reth else { return };
                let total = u64::from(reth.dma_len);
                if total > MAX_MSG {
                    self.rc_fault(psn, INVALID, None, ctx);
                    return;
                }
                let need = AccessFlags::REMOTE_READ;
                if total > 0
                    && traced(
                        self.qpn,
                        "RDMA READ source",
                        mem.check_remote(by, reth.rkey, reth.va, total, need),
                    )
                    .is_err()
                {
                    let fault = Fault {
                        syndrome: codec::NAK_REMOTE_ACCESS,
                        recv_status: WcStatus::LocAccessErr,
                        event: |qpn| AsyncEvent::QpAccessError { qpn },
                    };
                    self.rc_fault(psn, fault, None, ctx);
                    return;
                }
                let npkts = mtu_pieces(total, mtu as u32).max(1) as u32;
                self.msn = psn::add(self.msn, 1);
                self.push_resource(Resource::Read {
                    first_psn: psn,
                    last_psn: psn::add(psn, npkts - 1),
                    va: reth.va,
                    rkey: reth.rkey,
                    len: reth.dma_len,
                });
                self.resp_out.push_back(RespOut::Read {
                    psn,
                    va: reth.va,
                    rkey: reth.rkey,
                    remaining: total,
                    first: true,
                    msn: self.msn,
                });
                self.epsn = psn::add(psn, npkts);
                return;
            }
            Kind::CompareSwap | Kind::FetchAdd => {
                let Some(a) = pkt.hdr.atomic_eth else { return };
                if a.va % 8 != 0 {
                    self.rc_fault(psn, INVALID, None, ctx);
                    return;
                }
                let need = AccessFlags::REMOTE_ATOMIC;
                if traced(
                    self.qpn,
                    "atomic target",
                    mem.check_remote(by, a.rkey, a.va, 8, need),
                )
                .is_err()
                {
                    let fault = Fault {
                        syndrome: codec::NAK_REMOTE_ACCESS,
                        recv_status: WcStatus::LocAccessErr,
                        event: |qpn| AsyncEvent::QpAccessError { qpn },
                    };
                    self.rc_fault(psn, fault, None, ctx);
                    return;
                }
                let op = if info.kind == Kind::CompareSwap {
                    AtomicOp::CompareSwap {
                        compare: a.compare,
                        swap: a.swap_add,
                    }
                } else {
                    AtomicOp::FetchAdd { add: a.swap_add }
                };
                let orig = match mem.atomic(by, a.rkey, a.va, op) {
                    Ok(v) => v,
                    Err(_) => {
                        let fault = Fault {
                            syndrome: codec::NAK_REMOTE_ACCESS,
                            recv_status: WcStatus::LocAccessErr,
                            event: |qpn| AsyncEvent::QpAccessError { qpn },
                        };
                        self.rc_fault(psn, fault, None, ctx);
                        return;
                    }
                };
                self.msn = psn::add(self.msn, 1);
                self.push_resource(Resource::Atomic { psn, orig });
                self.resp_out.push_back(RespOut::AtomicAck {
                    psn,
                    orig,
                    msn: self.msn,
                });
                self.epsn = psn::add(psn, 1);
                return;
            }
            Kind::AtomicWrite => {
                let Some(reth) = pkt.hdr.reth else { return };
                // IBA oA19-28 (rxe's check_rkey): exactly 8 bytes, in the RETH and the
                // payload.
                let Ok(value) = <[u8; 8]>::try_from(pkt.payload) else {
                    self.rc_fault(psn, INVALID, None, ctx);
                    return;
                };
                if reth.dma_len != 8 {
                    self.rc_fault(psn, INVALID, None, ctx);
                    return;
                }
                match traced(
                    self.qpn,
                    "ATOMIC WRITE target",
                    mem.atomic_write(by, reth.rkey, reth.va, value),
                ) {
                    Ok(()) => {}
                    // A misaligned address is an invalid request, as for the atomics.
                    Err(MemError::Misaligned) => {
                        self.rc_fault(psn, INVALID, None, ctx);
                        return;
                    }
                    Err(_) => {
                        self.rc_fault(psn, REMOTE_ACCESS, None, ctx);
                        return;
                    }
                }
                self.placed(psn);
                return;
            }
            Kind::Flush => {
                let (Some(reth), Some((Some(placement), Some(selectivity)))) =
                    (pkt.hdr.reth, flush)
                else {
                    return;
                };
                let len = u64::from(reth.dma_len);
                if selectivity == FlushSelectivity::Range && len > MAX_MSG {
                    self.rc_fault(psn, INVALID, None, ctx);
                    return;
                }
                // Every earlier request of this QP was placed when it arrived (in PSN
                // order), so the flush covers them (IBTA 1.5: a FLUSH completes after the
                // writes before it are placed).
                let flushed = mem.flush(by, reth.rkey, reth.va, len, selectivity, placement);
                if traced(self.qpn, "FLUSH target", flushed).is_err() {
                    self.rc_fault(psn, REMOTE_ACCESS, None, ctx);
                    return;
                }
                self.placed(psn);
                return;
            }
            _ => return,
        }
        self.epsn = psn::add(psn, 1);
        if pkt.hdr.bth.ack_req {
            self.queue_ack(psn, SYNDROME_ACK);
        }
    }

    /// An ATOMIC WRITE or FLUSH at `psn` executed: one message more, a responder resource
    /// for its duplicates, and the zero-length READ RESPONSE ONLY that acknowledges it.
    fn placed(&mut self, psn: u32) {
        self.msn = psn::add(self.msn, 1);
        self.push_resource(Resource::Placed { psn });
        self.resp_out
            .push_back(RespOut::Placed { psn, msn: self.msn });
        self.epsn = psn::add(psn, 1);
    }

    fn push_resource(&mut self, r: Resource) {
        let cap = usize::from(self.attr.max_dest_rd_atomic.max(1));
        while self.resources.len() >= cap {
            self.resources.pop_front();
        }
        self.resources.push_back(r);
    }

    /// Duplicate request (C9-105 family), through the reply limiter (module doc).
    fn rc_duplicate(&mut self, now: u64, pkt: &Packet<'_>, ctx: &mut Ctx<'_>) {
        ctx.counters.duplicates_received += 1;
        let psn = pkt.hdr.bth.psn;
        tracing::trace!(
            qpn = self.qpn,
            psn,
            expected_psn = self.epsn,
            "duplicate request"
        );
        let mtu = u64::from(self.mtu(ctx.config));
        match pkt.info.kind {
            Kind::Send | Kind::Write => {
                // The ACK of everything before the expected PSN answers every duplicate
                // SEND / WRITE at once: one per window is enough.
                if self.answered_recently(self.last_ack, now, ctx) || self.resp_out_full() {
                    ctx.counters.duplicate_replies_suppressed += 1;
                    return;
                }
                self.queue_ack(psn::add(self.epsn, psn::PSN_MASK), SYNDROME_ACK);
                self.last_ack = Some((self.epsn, now));
            }
            Kind::ReadRequest => {
                let Some(reth) = pkt.hdr.reth else { return };
                let found = self.resources.iter().find_map(|r| match *r {
                    Resource::Read {
                        first_psn,
                        last_psn,
                        va,
                        rkey,
                        len,
                    } if psn::diff(psn, first_psn) >= 0 && psn::diff(psn, last_psn) <= 0 => {
                        Some((first_psn, va, rkey, len))
                    }
                    _ => None,
                });
                let Some((first_psn, va, rkey, len)) = found else {
                    ctx.counters.drop_packet(
                        DropReason::DuplicateNotFound,
                        self.qpn,
                        pkt.hdr.bth.psn,
                    );
                    return;
                };
                let skip = psn::diff(psn, first_psn) as u64 * mtu;
                let end = va + u64::from(len);
                let sub_range = reth.rkey == rkey
                    && reth.va == va + skip
                    && reth.va + u64::from(reth.dma_len) <= end;
                if !sub_range {
                    ctx.counters.drop_packet(
                        DropReason::DuplicateNotFound,
                        self.qpn,
                        pkt.hdr.bth.psn,
                    );
                    return;
                }
                if self.resp_out_full() || !self.replay_allowed(psn, now, ctx) {
                    ctx.counters.duplicate_replies_suppressed += 1;
                    return;
                }
                // Replace a response of the same read still waiting to go out; one being
                // sent (the head, past its first packet) goes on to its end, so copies of
                // the request cannot keep restarting it.
                let end_psn = psn::add(
                    first_psn,
                    (mtu_pieces(u64::from(len), mtu as u32) as u32).max(1),
                );
                let head_started = matches!(
                    self.resp_out.front(),
                    Some(RespOut::Read { first: false, .. })
                );
                let mut index = 0usize;
                self.resp_out.retain(|r| {
                    let same_read = matches!(r, RespOut::Read { psn: p, .. }
                        if psn::diff(*p, first_psn) >= 0 && psn::diff(*p, end_psn) < 0);
                    let keep = !same_read || (index == 0 && head_started);
                    index += 1;
                    keep
                });
                self.resp_out.push_back(RespOut::Read {
                    psn,
                    va: reth.va,
                    rkey,
                    remaining: u64::from(reth.dma_len),
                    first: true,
                    msn: self.msn,
                });
            }
            Kind::CompareSwap | Kind::FetchAdd => {
                let found = self.resources.iter().find_map(|r| match *r {
                    Resource::Atomic { psn: p, orig } if p == psn => Some(orig),
                    _ => None,
                });
                let Some(orig) = found else {
                    ctx.counters.drop_packet(
                        DropReason::DuplicateNotFound,
                        self.qpn,
                        pkt.hdr.bth.psn,
                    );
                    return;
                };
                let queued = self
                    .resp_out
                    .iter()
                    .any(|r| matches!(r, RespOut::AtomicAck { psn: p, .. } if *p == psn));
                if queued || self.resp_out_full() || !self.replay_allowed(psn, now, ctx) {
                    ctx.counters.duplicate_replies_suppressed += 1;
                    return;
                }
                self.resp_out.push_back(RespOut::AtomicAck {
                    psn,
                    orig,
                    msn: self.msn,
                });
            }
            Kind::AtomicWrite | Kind::Flush => {
                // IBTA 1.5 oA19-14, oA19-15 (rxe: `res->replay`): answered again, not
                // executed again — a later write to the same word stays.
                let found = self
                    .resources
                    .iter()
                    .any(|r| matches!(*r, Resource::Placed { psn: p } if p == psn));
                if !found {
                    ctx.counters.drop_packet(
                        DropReason::DuplicateNotFound,
                        self.qpn,
                        pkt.hdr.bth.psn,
                    );
                    return;
                }
                let queued = self
                    .resp_out
                    .iter()
                    .any(|r| matches!(r, RespOut::Placed { psn: p, .. } if *p == psn));
                if queued || self.resp_out_full() || !self.replay_allowed(psn, now, ctx) {
                    ctx.counters.duplicate_replies_suppressed += 1;
                    return;
                }
                self.resp_out
                    .push_back(RespOut::Placed { psn, msn: self.msn });
            }
            _ => {}
        }
    }

    /// UC: drop the rest of the current message (its receive WQE is reused); `psn` is the
    /// packet that broke it.
    fn uc_abort(&mut self, psn: u32, ctx: &mut Ctx<'_>) {
        match std::mem::take(&mut self.cur) {
            CurMsg::Send { wqe, .. } => self.untake_recv(wqe, ctx),
            // Nothing in progress, or a message whose drop was counted already.
            CurMsg::Idle | CurMsg::Dropping => return,
            _ => {}
        }
        ctx.counters
            .drop_packet(DropReason::UcMessageDropped, self.qpn, psn);
    }

    fn uc_request(&mut self, pkt: &Packet<'_>, mem: &mut impl Memory, ctx: &mut Ctx<'_>) {
        // Every key is checked against the QP's own PD (SRQ receives included).
        let pd = self.init.pd;
        let by = Accessor::qp(pd, self.qpn);
        let psn = pkt.hdr.bth.psn;
        let info = pkt.info;
        if psn != self.epsn {
            // IBTA vol. 1 §9.8 (UC has no acknowledgements, retransmission or duplicate
            // detection; rxe's `check_psn`): a PSN other than the expected one, ahead or
            // behind, means packets were lost. The message in progress is lost with them;
            // a MIDDLE or LAST is dropped with the rest of its message; a FIRST or ONLY
            // starts a new message whatever its PSN — so no packet, real or forged, can
            // leave the expected PSN where the peer's packets never match it again.
            self.uc_abort(psn, ctx);
            if !info.first {
                self.epsn = psn::add(psn, 1);
                self.cur = CurMsg::Dropping;
                ctx.counters
                    .drop_packet(DropReason::UcMessageDropped, self.qpn, pkt.hdr.bth.psn);
                return;
            }
        }
        self.epsn = psn::add(psn, 1);
        if matches!(self.cur, CurMsg::Dropping) {
            if info.first {
                self.cur = CurMsg::Idle;
            } else {
                ctx.counters
                    .drop_packet(DropReason::UcMessageDropped, self.qpn, pkt.hdr.bth.psn);
                return;
            }
        }
        let seq_ok = match (&self.cur, info.kind) {
            (CurMsg::Send { .. }, Kind::Send) | (CurMsg::Write { .. }, Kind::Write) => !info.first,
            (CurMsg::Idle, _) => info.first,
            _ => false,
        };
        if !seq_ok {
            self.uc_abort(psn, ctx);
            if !info.first {
                self.cur = CurMsg::Dropping;
                ctx.counters
                    .drop_packet(DropReason::UcMessageDropped, self.qpn, pkt.hdr.bth.psn);
                return;
            }
        }
        let mtu = u64::from(self.mtu(ctx.config));
        let len = pkt.payload.len() as u64;
        let len_ok = match (info.first, info.last) {
            (true, true) => len <= mtu,
            (false, true) => len >= 1 && len <= mtu,
            _ => len == mtu,
        };
        let drop_msg = |qp: &mut Qp, ctx: &mut Ctx<'_>| {
            qp.uc_abort(psn, ctx);
            qp.cur = if info.last {
                CurMsg::Idle
            } else {
                CurMsg::Dropping
            };
            ctx.counters
                .drop_packet(DropReason::UcMessageDropped, qp.qpn, psn);
        };
        if !len_ok {
            drop_msg(self, ctx);
            return;
        }
        match info.kind {
            Kind::Send => {
                if info.first {
                    match self.take_recv(ctx) {
                        Some(wqe) => self.cur = CurMsg::Send { wqe, offset: 0 },
                        None => {
                            ctx.counters.drop_packet(
                                DropReason::NoReceive,
                                self.qpn,
                                pkt.hdr.bth.psn,
                            );
                            self.cur = if info.last {
                                CurMsg::Idle
                            } else {
                                CurMsg::Dropping
                            };
                            return;
                        }
                    }
                }
                let CurMsg::Send { wqe, offset } = &mut self.cur else {
                    return;
                };
                if *offset + len > wqe.capacity()
                    || scatter(mem, pd, &wqe.sg_list, *offset, pkt.payload).is_err()
                {
                    drop_msg(self, ctx);
                    return;
                }
                *offset += len;
                if info.last {
                    let CurMsg::Send { wqe, offset } = std::mem::take(&mut self.cur) else {
                        return;
                    };
                    let mut wc = WorkCompletion::success(wqe.wr_id, WcOpcode::Recv, self.qpn)
                        .with_byte_len(offset as u32);
                    if let Some(imm) = pkt.hdr.imm {
                        wc = wc.with_imm(imm);
                    }
                    if let Some(rkey) = pkt.hdr.ieth {
                        if mem.invalidate(pd, rkey).is_err() {
                            self.untake_recv(wqe, ctx);
                            ctx.counters.drop_packet(
                                DropReason::UcMessageDropped,
                                self.qpn,
                                pkt.hdr.bth.psn,
                            );
                            return;
                        }
                        wc = wc.with_invalidated_rkey(rkey);
                    }
                    ctx.completions.push_back(Completion {
                        cq: CqTarget::Recv,
                        wc,
                        solicited: pkt.hdr.bth.solicited,
                    });
                }
            }
            Kind::Write => {
                if info.first {
                    let Some(reth) = pkt.hdr.reth else { return };
                    let total = u64::from(reth.dma_len);
                    let ok = self
                        .attr
                        .qp_access_flags
                        .contains(AccessFlags::REMOTE_WRITE)
                        && (total == 0
                            || mem
                                .check_remote(
                                    by,
                                    reth.rkey,
                                    reth.va,
                                    total,
                                    AccessFlags::REMOTE_WRITE,
                                )
                                .is_ok());
                    if !ok {
                        drop_msg(self, ctx);
                        return;
                    }
                    self.cur = CurMsg::Write {
                        va: reth.va,
                        rkey: reth.rkey,
                        remaining: total,
                        total: reth.dma_len,
                    };
                }
                let CurMsg::Write {
                    va,
                    rkey,
                    remaining,
                    total,
                } = &mut self.cur
                else {
                    return;
                };
                if len > *remaining
                    || (info.last && len != *remaining)
                    || (len > 0
                        && mem
                            .write(by, MemKey::Remote(*rkey), *va, pkt.payload)
                            .is_err())
                {
                    drop_msg(self, ctx);
                    return;
                }
                *va += len;
                *remaining -= len;
                let total = *total;
                if info.last {
                    self.cur = CurMsg::Idle;
                    if let Some(imm) = pkt.hdr.imm {
                        let Some(wqe) = self.take_recv(ctx) else {
                            ctx.counters.drop_packet(
                                DropReason::NoReceive,
                                self.qpn,
                                pkt.hdr.bth.psn,
                            );
                            return;
                        };
                        let wc =
                            WorkCompletion::success(wqe.wr_id, WcOpcode::RecvRdmaWithImm, self.qpn)
                                .with_byte_len(total)
                                .with_imm(imm);
                        ctx.completions.push_back(Completion {
                            cq: CqTarget::Recv,
                            wc,
                            solicited: pkt.hdr.bth.solicited,
                        });
                    }
                }
            }
            _ => drop_msg(self, ctx),
        }
    }

    fn ud_request(
        &mut self,
        pkt: &Packet<'_>,
        grh: Option<&[u8; 40]>,
        mem: &mut impl Memory,
        ctx: &mut Ctx<'_>,
    ) {
        let pd = self.init.pd;
        let Some(deth) = pkt.hdr.deth else {
            ctx.counters
                .drop_packet(DropReason::Malformed, self.qpn, pkt.hdr.bth.psn);
            return;
        };
        if deth.qkey != self.attr.qkey {
            ctx.counters
                .drop_packet(DropReason::QkeyMismatch, self.qpn, pkt.hdr.bth.psn);
            return;
        }
        if pkt.payload.len() as u64 > u64::from(ctx.config.port_mtu.bytes()) {
            ctx.counters
                .drop_packet(DropReason::UdTooLong, self.qpn, pkt.hdr.bth.psn);
            return;
        }
        let Some(wqe) = self.take_recv(ctx) else {
            ctx.counters
                .drop_packet(DropReason::NoReceive, self.qpn, pkt.hdr.bth.psn);
            return;
        };
        let len = pkt.payload.len() as u64;
        if 40 + len > wqe.capacity() {
            self.fail_recv(&wqe, WcStatus::LocLenErr, WcOpcode::Recv, ctx);
            return;
        }
        let zero = [0u8; 40];
        let grh = grh.unwrap_or(&zero);
        if scatter(mem, pd, &wqe.sg_list, 0, grh).is_err()
            || scatter(mem, pd, &wqe.sg_list, 40, pkt.payload).is_err()
        {
            self.fail_recv(&wqe, WcStatus::LocProtErr, WcOpcode::Recv, ctx);
            return;
        }
        let mut wc = WorkCompletion::success(wqe.wr_id, WcOpcode::Recv, self.qpn)
            .with_byte_len(40 + len as u32)
            .with_src_qp(deth.src_qp)
            .with_sl(roce_l3_type(grh))
            .with_flags(WcFlags::GRH);
        if let Some(imm) = pkt.hdr.imm {
            wc = wc.with_imm(imm);
        }
        ctx.completions.push_back(Completion {
            cq: CqTarget::Recv,
            wc,
            solicited: pkt.hdr.bth.solicited,
        });
    }
}

/// What a UD receive completion's `sl` reports on RoCEv2: the L3 header type of the frame
/// (IBTA Annex A17.4.5.1: the completion tells an IPv4 frame from an IPv6 one), as mlx5
/// reports it where InfiniBand's service level would be — RoCE carries no SL — and as
/// UCX's UD transport reads it to find the destination address in the GRH area: 2 for
/// IPv4 (the header in the area's second half), 1 for IPv6, 0 when the area holds neither.
fn roce_l3_type(grh: &[u8; 40]) -> u8 {
    if grh[0] >> 4 == 6 {
        1
    } else if grh[20] >> 4 == 4 {
        2
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::roce_l3_type;

    #[test]
    fn ud_receive_sl_names_the_roce_l3_header_type() {
        let mut ipv4 = [0u8; 40];
        ipv4[20] = 0x45;
        assert_eq!(roce_l3_type(&ipv4), 2);
        let mut ipv6 = [0u8; 40];
        ipv6[0] = 0x60;
        assert_eq!(roce_l3_type(&ipv6), 1);
        assert_eq!(roce_l3_type(&[0u8; 40]), 0);
    }
}
