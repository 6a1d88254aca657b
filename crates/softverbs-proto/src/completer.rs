//! The completer (reference §2.4, §2.5): consumes ACKs, NAKs, read responses and atomic
//! ACKs; retires send WQEs in order (cumulative and implicit ACKs); drives go-back-N on
//! timeout, NAK sequence error and implied NAK; counts `retry_cnt` and `rnr_retry`
//! (7 = infinite for RNR only); maps NAKs and bad responses to completion statuses.

use softverbs_cq::WcStatus;

use crate::codec::{self, Kind, Packet};
use crate::memory::Memory;
use crate::output::DropReason;
use crate::psn;
use crate::qp::{ack_timeout_ns, rnr_delay_ns, Ctx, Qp};
use crate::requester::{packets_for, scatter};
use crate::types::{QpState, QpType};
use crate::wr::{Gather, SendOp};

/// Why the requester goes back to the oldest unacknowledged PSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RetryCause {
    /// The local ACK timeout fired (counts against `retry_cnt`).
    Timeout,
    /// The responder NAKed a PSN sequence error.
    NakSequenceError,
    /// An ACK beyond a read or atomic whose response never came.
    ImpliedNak,
    /// A read response ahead of the one expected.
    OutOfOrderReadResponse,
}

impl RetryCause {
    /// How the logs name it.
    fn as_str(self) -> &'static str {
        match self {
            RetryCause::Timeout => "local ACK timeout",
            RetryCause::NakSequenceError => "NAK sequence error",
            RetryCause::ImpliedNak => "implied NAK",
            RetryCause::OutOfOrderReadResponse => "out-of-order read response",
        }
    }
}

/// Outcome of retiring WQEs up to a PSN.
enum Retire {
    /// Everything before the PSN that could be retired was.
    Done,
    /// A read or atomic before the PSN has not received its response: implied NAK.
    ImpliedNak,
}

impl Qp {
    /// Something has been sent and not yet completed.
    pub(crate) fn outstanding(&self) -> bool {
        self.sq.front().is_some_and(|w| w.started)
    }

    /// Go-back-N: the next request packet is the one at `comp_psn`.
    pub(crate) fn rewind(&mut self) {
        self.req_index = 0;
        self.req_psn = self.comp_psn;
        self.req_pkt = match self.sq.front() {
            Some(w) if w.started => {
                let d = psn::diff(self.comp_psn, w.first_psn);
                if d > 0 && (d as u32) < w.npkts {
                    d as u32
                } else {
                    0
                }
            }
            _ => 0,
        };
    }

    /// Retires the WQEs the responder has acknowledged: every PSN before `limit` is done.
    fn retire_before(&mut self, limit: u32, ctx: &mut Ctx<'_>) -> Retire {
        let mut progressed = false;
        let mut result = Retire::Done;
        while let Some(w) = self.sq.front() {
            if !w.started || w.error.is_some() || psn::diff(w.first_psn, limit) >= 0 {
                break;
            }
            let end = psn::add(w.last_psn(), 1);
            if w.wr.op.is_read_or_atomic() {
                // Everything before `limit` is acknowledged, including this read or
                // atomic, whose response has not arrived: it was lost (implied NAK).
                if psn::diff(limit, end) >= 0 {
                    result = Retire::ImpliedNak;
                }
                break;
            }
            if psn::diff(end, limit) <= 0 {
                if psn::diff(end, self.comp_psn) > 0 {
                    self.comp_psn = end;
                }
                progressed = true;
                self.complete_head(WcStatus::Success, 0, ctx);
            } else {
                if psn::diff(limit, self.comp_psn) > 0 {
                    self.comp_psn = limit;
                    progressed = true;
                }
                break;
            }
        }
        if progressed {
            self.retry_left = self.attr.retry_cnt;
        }
        result
    }

    /// Go-back-N retry from `comp_psn`.
    ///
    /// Only local ACK timeouts count against `retry_cnt` (`RETRY_EXC_ERR` when exhausted):
    /// the counter detects a dead path or peer. A retry started by a response — NAK
    /// sequence error, implied NAK, out-of-order read response — proves the peer alive and
    /// happens at most once per `comp_psn` until the next timeout or progress (rxe's
    /// "started_retry"), so the responses still in flight from before a rewind cannot
    /// restart the window again and again.
    fn retry(&mut self, ctx: &mut Ctx<'_>, cause: RetryCause) {
        if !self.outstanding() {
            return;
        }
        let (qpn, psn) = (self.qpn, self.comp_psn);
        if cause == RetryCause::Timeout {
            if self.retry_left == 0 {
                tracing::warn!(
                    qpn,
                    psn,
                    retry_cnt = self.attr.retry_cnt,
                    "retry count exhausted: the request at this PSN fails (RETRY_EXC_ERR)"
                );
                ctx.counters.retries += 1;
                self.window_loss = true;
                self.complete_head(WcStatus::RetryExcErr, 0, ctx);
                return;
            }
            self.retry_left -= 1;
        } else {
            if self.nak_retry_from == Some(self.comp_psn) {
                tracing::trace!(
                    qpn,
                    psn,
                    cause = cause.as_str(),
                    "retransmission from this PSN already under way"
                );
                return;
            }
            self.nak_retry_from = Some(self.comp_psn);
        }
        tracing::debug!(
            qpn,
            psn,
            cause = cause.as_str(),
            next_psn = self.req_psn,
            retry_left = self.retry_left,
            "go-back-N: retransmitting from PSN"
        );
        ctx.counters.retries += 1;
        // Every go-back-N means a packet was lost: a congestion signal for the peer's
        // window (RFC 5681 §3.1); an RNR NAK rewinds without coming here.
        self.window_loss = true;
        self.rewind();
    }

    /// After a valid response: complete a failed head, resynchronise the requester,
    /// restart or stop the retransmit timer.
    fn after_response(&mut self, now: u64, ctx: &mut Ctx<'_>) {
        if let Some(status) = self.sq.front().and_then(|w| w.error) {
            self.complete_head(status, 0, ctx);
        }
        if self.state == QpState::Err {
            return;
        }
        if psn::diff(self.req_psn, self.comp_psn) < 0 {
            self.rewind();
        }
        if self.outstanding() && self.rnr_deadline.is_none() {
            self.retrans_deadline = ack_timeout_ns(self.attr.timeout).map(|t| now + t);
        } else if !self.outstanding() {
            self.retrans_deadline = None;
        }
    }

    /// A response packet (ACK, NAK, read response, atomic ACK) for this QP.
    pub(crate) fn on_response(
        &mut self,
        now: u64,
        pkt: &Packet<'_>,
        mem: &mut impl Memory,
        ctx: &mut Ctx<'_>,
    ) {
        if self.init.qp_type != QpType::Rc {
            ctx.counters
                .drop_packet(DropReason::WrongTransport, self.qpn, pkt.hdr.bth.psn);
            return;
        }
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            ctx.counters
                .drop_packet(DropReason::WrongState, self.qpn, pkt.hdr.bth.psn);
            return;
        }
        let psn = pkt.hdr.bth.psn;
        if psn::diff(psn, self.sent_high) >= 0 {
            ctx.counters
                .drop_packet(DropReason::GhostResponse, self.qpn, pkt.hdr.bth.psn);
            return;
        }
        if psn::diff(psn, self.comp_psn) < 0 {
            ctx.counters
                .drop_packet(DropReason::StaleResponse, self.qpn, pkt.hdr.bth.psn);
            return;
        }
        if self.sq.is_empty() {
            ctx.counters
                .drop_packet(DropReason::UnexpectedResponse, self.qpn, pkt.hdr.bth.psn);
            return;
        }
        match pkt.info.kind {
            Kind::Ack => {
                let Some(aeth) = pkt.hdr.aeth else {
                    ctx.counters
                        .drop_packet(DropReason::Malformed, self.qpn, pkt.hdr.bth.psn);
                    return;
                };
                match aeth.syndrome >> 5 {
                    0 => {
                        if let Retire::ImpliedNak = self.retire_before(psn::add(psn, 1), ctx) {
                            self.retry(ctx, RetryCause::ImpliedNak);
                        }
                        self.rnr_left = self.attr.rnr_retry;
                    }
                    1 => {
                        ctx.counters.rnr_naks_received += 1;
                        if self.rnr_deadline.is_some() {
                            tracing::trace!(
                                qpn = self.qpn,
                                psn,
                                "RNR NAK received while already waiting"
                            );
                            return;
                        }
                        if let Retire::ImpliedNak = self.retire_before(psn, ctx) {
                            self.retry(ctx, RetryCause::ImpliedNak);
                        } else if self.outstanding() {
                            if self.rnr_left == 0 {
                                tracing::warn!(
                                    qpn = self.qpn,
                                    psn,
                                    rnr_retry = self.attr.rnr_retry,
                                    "RNR retry count exhausted: the request at this PSN \
                                     fails (RNR_RETRY_EXC_ERR)"
                                );
                                self.complete_head(
                                    WcStatus::RnrRetryExcErr,
                                    u32::from(aeth.syndrome),
                                    ctx,
                                );
                            } else {
                                if self.attr.rnr_retry != 7 {
                                    self.rnr_left -= 1;
                                }
                                let wait = rnr_delay_ns(aeth.syndrome);
                                tracing::debug!(
                                    qpn = self.qpn,
                                    psn,
                                    wait_us = wait / 1000,
                                    rnr_left = self.rnr_left,
                                    "RNR NAK received (the peer had no receive posted): \
                                     retrying after the RNR timer"
                                );
                                self.rnr_deadline = Some(now + wait);
                                self.retrans_deadline = None;
                                self.rewind();
                            }
                        }
                    }
                    3 => {
                        ctx.counters.naks_received += 1;
                        let retired = self.retire_before(psn, ctx);
                        match aeth.syndrome {
                            codec::NAK_PSN_SEQ => {
                                let _ = retired;
                                if self.rnr_deadline.is_none() {
                                    self.retry(ctx, RetryCause::NakSequenceError);
                                }
                            }
                            s => {
                                let status = match s {
                                    codec::NAK_INVALID_REQUEST => WcStatus::RemInvReqErr,
                                    codec::NAK_REMOTE_ACCESS => WcStatus::RemAccessErr,
                                    _ => WcStatus::RemOpErr,
                                };
                                if self.outstanding() {
                                    self.complete_head(status, u32::from(s), ctx);
                                }
                            }
                        }
                    }
                    _ => {
                        ctx.counters.drop_packet(
                            DropReason::BadSyndrome,
                            self.qpn,
                            pkt.hdr.bth.psn,
                        );
                        return;
                    }
                }
            }
            Kind::ReadResponse => {
                if !self.on_read_response(pkt, mem, ctx) {
                    return;
                }
            }
            Kind::AtomicAck => {
                if !self.on_atomic_ack(pkt, mem, ctx) {
                    return;
                }
            }
            _ => {
                ctx.counters
                    .drop_packet(DropReason::UnexpectedResponse, self.qpn, pkt.hdr.bth.psn);
                return;
            }
        }
        self.after_response(now, ctx);
    }

    /// Returns false when the packet was dropped (no timer effect).
    fn on_read_response(
        &mut self,
        pkt: &Packet<'_>,
        mem: &mut impl Memory,
        ctx: &mut Ctx<'_>,
    ) -> bool {
        let psn = pkt.hdr.bth.psn;
        if let Retire::ImpliedNak = self.retire_before(psn, ctx) {
            self.retry(ctx, RetryCause::ImpliedNak);
            return true;
        }
        let mtu = self.mtu(ctx.config);
        let Some(w) = self.sq.front() else {
            ctx.counters
                .drop_packet(DropReason::UnexpectedResponse, self.qpn, pkt.hdr.bth.psn);
            return false;
        };
        if !w.started {
            ctx.counters
                .drop_packet(DropReason::UnexpectedResponse, self.qpn, pkt.hdr.bth.psn);
            return false;
        }
        let in_range = psn::diff(psn, w.first_psn) >= 0 && psn::diff(psn, w.last_psn()) <= 0;
        // An ATOMIC WRITE or FLUSH is answered by a zero-length READ RESPONSE ONLY (IBTA
        // 1.5; rxe's `send_read_response_ack`).
        let read_like = matches!(w.wr.op, SendOp::RdmaRead { .. }) || w.wr.op.is_placement();
        if !read_like || !in_range {
            self.complete_head(WcStatus::BadRespErr, 0, ctx);
            return true;
        }
        if psn != self.comp_psn {
            // A response of this read was lost: re-read from the first missing one now
            // (implied NAK) instead of waiting for the timeout as rxe does (§5.8 item 8).
            ctx.counters
                .drop_packet(DropReason::OutOfOrderResponse, self.qpn, psn);
            self.retry(ctx, RetryCause::OutOfOrderReadResponse);
            return false;
        }
        let k = psn::diff(psn, w.first_psn) as u32;
        let npkts = packets_for(&w.wr.op, w.len, mtu);
        let offset = u64::from(k) * u64::from(mtu);
        let expected = (w.len - offset.min(w.len)).min(u64::from(mtu)) as usize;
        let is_last = k + 1 == npkts;
        let ack_ok = pkt.hdr.aeth.is_none_or(|a| a.syndrome >> 5 == 0);
        if pkt.info.last != is_last || !ack_ok {
            self.complete_head(WcStatus::BadRespErr, 0, ctx);
            return true;
        }
        if pkt.payload.len() > expected {
            self.complete_head(WcStatus::LocLenErr, 0, ctx);
            return true;
        }
        if pkt.payload.len() < expected {
            self.complete_head(WcStatus::BadRespErr, 0, ctx);
            return true;
        }
        let placed = match &w.wr.gather {
            Gather::Sges(sges) => scatter(mem, self.init.pd, sges, offset, pkt.payload).is_ok(),
            Gather::Inline(_) => false,
        };
        if !placed {
            self.complete_head(WcStatus::LocProtErr, 0, ctx);
            return true;
        }
        self.comp_psn = psn::add(psn, 1);
        self.retry_left = self.attr.retry_cnt;
        self.rnr_left = self.attr.rnr_retry;
        if is_last {
            self.complete_head(WcStatus::Success, 0, ctx);
        }
        true
    }

    fn on_atomic_ack(
        &mut self,
        pkt: &Packet<'_>,
        mem: &mut impl Memory,
        ctx: &mut Ctx<'_>,
    ) -> bool {
        let psn = pkt.hdr.bth.psn;
        if let Retire::ImpliedNak = self.retire_before(psn, ctx) {
            self.retry(ctx, RetryCause::ImpliedNak);
            return true;
        }
        let Some(w) = self.sq.front() else {
            ctx.counters
                .drop_packet(DropReason::UnexpectedResponse, self.qpn, pkt.hdr.bth.psn);
            return false;
        };
        if !w.started {
            ctx.counters
                .drop_packet(DropReason::UnexpectedResponse, self.qpn, pkt.hdr.bth.psn);
            return false;
        }
        let ack_ok = pkt.hdr.aeth.is_some_and(|a| a.syndrome >> 5 == 0);
        if !w.wr.op.is_atomic() || w.first_psn != psn || !ack_ok {
            self.complete_head(WcStatus::BadRespErr, 0, ctx);
            return true;
        }
        let orig = pkt.hdr.atomic_ack.unwrap_or(0);
        let placed = match &w.wr.gather {
            Gather::Sges(sges) => scatter(mem, self.init.pd, sges, 0, &orig.to_ne_bytes()).is_ok(),
            Gather::Inline(_) => false,
        };
        if !placed {
            self.complete_head(WcStatus::LocProtErr, 0, ctx);
            return true;
        }
        self.comp_psn = psn::add(psn, 1);
        self.retry_left = self.attr.retry_cnt;
        self.rnr_left = self.attr.rnr_retry;
        self.complete_head(WcStatus::Success, 0, ctx);
        true
    }

    /// Timer expiry: RNR wait over (retry from `comp_psn`) or local ACK timeout (retry,
    /// or `RETRY_EXC_ERR`).
    pub(crate) fn handle_timeout(&mut self, now: u64, ctx: &mut Ctx<'_>) {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            self.retrans_deadline = None;
            self.rnr_deadline = None;
            return;
        }
        if self.rnr_deadline.is_some_and(|t| t <= now) {
            tracing::debug!(
                qpn = self.qpn,
                psn = self.comp_psn,
                rnr_left = self.rnr_left,
                "RNR timer expired: retransmitting from PSN"
            );
            self.rnr_deadline = None;
            self.rewind();
        }
        if self.retrans_deadline.is_some_and(|t| t <= now) {
            self.retrans_deadline = None;
            if self.rnr_deadline.is_some() || !self.outstanding() {
                return;
            }
            ctx.counters.timeouts += 1;
            self.nak_retry_from = None;
            self.retry(ctx, RetryCause::Timeout);
        }
    }
}
