//! The requester (reference §2.2): turns send WQEs into request packets — segmentation by
//! path MTU, PSN assignment, the `max_rd_atomic` budget, fences, the unacknowledged-PSN
//! window, the AckReq policy — and, for UC and UD, completes WQEs on transmission. Also
//! the responder's outgoing packets (ACK / NAK / read responses / atomic ACKs), which
//! share `poll_transmit`.

use softverbs_cq::WcStatus;

use crate::codec::{self, op, Aeth, AtomicEth, Bth, Deth, Feth, Headers, Reth, SYNDROME_ACK};
use crate::memory::{traced, Accessor, MemError, MemKey, Memory};
use crate::output::{AsyncEvent, Transmit};
use crate::psn;
use crate::qp::{ack_timeout_ns, Ctx, Qp, RespOut};
use crate::types::{AccessFlags, QpState, QpType};
use crate::window::Room;
use crate::wr::{Gather, SendFlags, SendOp, Sge};

/// Default P_Key (full member of the default partition).
pub(crate) const DEFAULT_PKEY: u16 = 0xFFFF;

/// Request packets between two AckReq bits inside a long message (reference §1.9).
const ACK_REQ_EVERY: u32 = 64;

/// Copies `dst.len()` bytes of the message at byte `offset` out of its gather list, whose
/// L_Keys must be of protection domain `pd`.
pub(crate) fn gather(
    mem: &impl Memory,
    pd: u32,
    g: &Gather,
    offset: u64,
    dst: &mut [u8],
) -> Result<(), MemError> {
    match g {
        Gather::Inline(data) => {
            let start = usize::try_from(offset).map_err(|_| MemError::OutOfBounds)?;
            let src = data
                .get(start..start + dst.len())
                .ok_or(MemError::OutOfBounds)?;
            dst.copy_from_slice(src);
            Ok(())
        }
        Gather::Sges(sges) => {
            let mut pos = 0usize;
            let gathered = for_each_piece(sges, offset, dst.len(), |sge, at, n| {
                let r = mem.read(
                    pd,
                    MemKey::Local(sge.lkey),
                    sge.addr + at,
                    &mut dst[pos..pos + n],
                );
                pos += n;
                r
            });
            if gathered.is_err() {
                // The pieces read before the failing one go nowhere.
                mem.abandon_reads();
            }
            gathered
        }
    }
}

/// Copies `data` into the scatter list `sges` at message byte `offset`; its L_Keys must be
/// of protection domain `pd`.
pub(crate) fn scatter(
    mem: &mut impl Memory,
    pd: u32,
    sges: &[Sge],
    offset: u64,
    data: &[u8],
) -> Result<(), MemError> {
    let mut pos = 0usize;
    for_each_piece(sges, offset, data.len(), |sge, at, n| {
        let r = mem.write(
            pd,
            MemKey::Local(sge.lkey),
            sge.addr + at,
            &data[pos..pos + n],
        );
        pos += n;
        r
    })
}

/// Walks the pieces of `[offset, offset + len)` over `sges`: `(sge, offset in sge, n)`.
fn for_each_piece(
    sges: &[Sge],
    mut offset: u64,
    len: usize,
    mut f: impl FnMut(&Sge, u64, usize) -> Result<(), MemError>,
) -> Result<(), MemError> {
    let mut left = len;
    for sge in sges {
        if left == 0 {
            break;
        }
        let sge_len = u64::from(sge.length);
        if offset >= sge_len {
            offset -= sge_len;
            continue;
        }
        let n = (sge_len - offset).min(left as u64) as usize;
        f(sge, offset, n)?;
        left -= n;
        offset = 0;
    }
    if left == 0 {
        Ok(())
    } else {
        Err(MemError::OutOfBounds)
    }
}

/// PSNs a message of `len` bytes consumes at `mtu` (reference §1.6).
pub(crate) fn packets_for(op: &SendOp, len: u64, mtu: u32) -> u32 {
    if op.is_atomic() || op.is_placement() {
        1
    } else {
        mtu_pieces(len, mtu).max(1) as u32
    }
}

/// `len.div_ceil(mtu)`: the packets of `len` bytes at `mtu` (0 for none). A shift and a
/// mask for a power of two, which every path MTU (256 to 4096) and every segment size the
/// devices set is; a division by a divisor known only at run time costs some 25 cycles,
/// and this is computed for every packet built. `mtu` is not 0.
pub(crate) fn mtu_pieces(len: u64, mtu: u32) -> u64 {
    if mtu.is_power_of_two() {
        let mask = u64::from(mtu) - 1;
        (len >> mtu.trailing_zeros()) + u64::from(len & mask != 0)
    } else {
        len.div_ceil(u64::from(mtu))
    }
}

impl Qp {
    /// Next outgoing packet of this QP: responder packets first, then requests.
    ///
    /// `room` is how many PSNs this QP may have unacknowledged before its peer's congestion
    /// window is full (`window.rs`; `None`: not governed). It holds requests only, never
    /// the responder's packets, and never a QP no answer would wake: one whose packets in
    /// flight all lack AckReq, or one with nothing in flight when no other QP has packets
    /// out to the peer (that one sends a packet more, with AckReq).
    pub(crate) fn poll_transmit(
        &mut self,
        now: u64,
        buf: &mut [u8],
        mem: &impl Memory,
        room: Option<Room>,
        ctx: &mut Ctx<'_>,
    ) -> Option<Transmit> {
        self.held_by_window = false;
        if let Some(t) = self.responder_transmit(buf, mem, ctx) {
            return Some(t);
        }
        self.requester_transmit(now, buf, mem, room, ctx)
    }

    fn responder_transmit(
        &mut self,
        buf: &mut [u8],
        mem: &impl Memory,
        ctx: &mut Ctx<'_>,
    ) -> Option<Transmit> {
        let mtu = u64::from(self.mtu(ctx.config));
        loop {
            let item = *self.resp_out.front()?;
            let mut hdr = Headers {
                bth: Bth {
                    opcode: op::ACKNOWLEDGE,
                    solicited: false,
                    pkey: DEFAULT_PKEY,
                    dest_qp: self.attr.dest_qp_num,
                    ack_req: false,
                    psn: 0,
                },
                ..Headers::default()
            };
            let len = match item {
                RespOut::Ack { psn, syndrome, msn } => {
                    self.resp_out.pop_front();
                    hdr.bth.psn = psn;
                    hdr.aeth = Some(Aeth { syndrome, msn });
                    match syndrome >> 5 {
                        0 => ctx.counters.acks_sent += 1,
                        1 => ctx.counters.rnr_naks_sent += 1,
                        _ => ctx.counters.naks_sent += 1,
                    }
                    codec::emit_headers(&hdr, 0, buf)?.1
                }
                RespOut::AtomicAck { psn, orig, msn } => {
                    self.resp_out.pop_front();
                    hdr.bth.opcode = op::ATOMIC_ACKNOWLEDGE;
                    hdr.bth.psn = psn;
                    hdr.aeth = Some(Aeth {
                        syndrome: SYNDROME_ACK,
                        msn,
                    });
                    hdr.atomic_ack = Some(orig);
                    ctx.counters.acks_sent += 1;
                    codec::emit_headers(&hdr, 0, buf)?.1
                }
                RespOut::Placed { psn, msn } => {
                    self.resp_out.pop_front();
                    hdr.bth.opcode = op::READ_RESPONSE_ONLY;
                    hdr.bth.psn = psn;
                    hdr.aeth = Some(Aeth {
                        syndrome: SYNDROME_ACK,
                        msn,
                    });
                    ctx.counters.acks_sent += 1;
                    codec::emit_headers(&hdr, 0, buf)?.1
                }
                RespOut::Read {
                    psn,
                    va,
                    rkey,
                    remaining,
                    first,
                    msn,
                } => {
                    let n = remaining.min(mtu);
                    let last = remaining <= mtu;
                    hdr.bth.opcode = match (first, last) {
                        (true, true) => op::READ_RESPONSE_ONLY,
                        (true, false) => op::READ_RESPONSE_FIRST,
                        (false, true) => op::READ_RESPONSE_LAST,
                        (false, false) => op::READ_RESPONSE_MIDDLE,
                    };
                    hdr.bth.psn = psn;
                    if first || last {
                        hdr.aeth = Some(Aeth {
                            syndrome: SYNDROME_ACK,
                            msn,
                        });
                    }
                    let (start, len) = codec::emit_headers(&hdr, n as usize, buf)?;
                    if mem
                        .read(
                            Accessor::qp(self.init.pd, self.qpn),
                            MemKey::Remote(rkey),
                            va,
                            &mut buf[start..start + n as usize],
                        )
                        .is_err()
                    {
                        // The region went away after the request was accepted.
                        self.resp_out.pop_front();
                        self.resp_out.push_front(RespOut::Ack {
                            psn,
                            syndrome: codec::NAK_REMOTE_ACCESS,
                            msn,
                        });
                        self.responder_error(AsyncEvent::QpAccessError { qpn: self.qpn }, ctx);
                        continue;
                    }
                    ctx.counters.bytes_sent += n;
                    if last {
                        self.resp_out.pop_front();
                    } else if let Some(RespOut::Read {
                        psn,
                        va,
                        remaining,
                        first,
                        ..
                    }) = self.resp_out.front_mut()
                    {
                        *psn = psn::add(*psn, 1);
                        *va += n;
                        *remaining -= n;
                        *first = false;
                    }
                    len
                }
            };
            ctx.counters.packets_sent += 1;
            return Some(Transmit {
                len,
                src_qpn: self.qpn,
                dest_qpn: self.attr.dest_qp_num,
                av: self.attr.ah_attr,
            });
        }
    }

    /// Marks the WQE at `index` failed; it completes with `status` when it reaches the head
    /// of the send queue (so send completions stay in order).
    fn local_error(&mut self, index: usize, status: WcStatus, ctx: &mut Ctx<'_>) {
        if let Some(w) = self.sq.get_mut(index) {
            w.error = Some(status);
        }
        if index == 0 {
            self.complete_head(status, 0, ctx);
        }
    }

    /// Local checks when a WQE starts: L_Keys (of the QP's PD) and bounds of its buffers,
    /// UD size.
    fn check_local(&self, index: usize, mtu: u32, mem: &impl Memory) -> Result<(), WcStatus> {
        let w = &self.sq[index];
        if self.init.qp_type == QpType::Ud && w.len > u64::from(mtu) {
            return Err(WcStatus::LocLenErr);
        }
        if let Gather::Sges(sges) = &w.wr.gather {
            let need = if w.wr.op.is_read_or_atomic() {
                AccessFlags::LOCAL_WRITE
            } else {
                AccessFlags::empty()
            };
            for s in sges.iter().filter(|s| s.length > 0) {
                let checked =
                    mem.check_local(self.init.pd, s.lkey, s.addr, u64::from(s.length), need);
                traced(self.qpn, "local SGE", checked).map_err(|_| WcStatus::LocProtErr)?;
            }
        }
        Ok(())
    }

    fn requester_transmit(
        &mut self,
        now: u64,
        buf: &mut [u8],
        mem: &impl Memory,
        room: Option<Room>,
        ctx: &mut Ctx<'_>,
    ) -> Option<Transmit> {
        loop {
            if !matches!(self.state, QpState::Rts | QpState::Sqd) || self.rnr_deadline.is_some() {
                return None;
            }
            let qp_type = self.init.qp_type;
            let mtu = self.mtu(ctx.config);
            let index = self.req_index;
            let k = self.req_pkt;
            let w = self.sq.get(index)?;
            if w.error.is_some() || (self.state == QpState::Sqd && !w.started) {
                return None;
            }
            if w.wr.op.is_local() {
                // Executed against memory by `Engine::execute_local_operations` once it
                // heads the send queue; nothing after it is sent before.
                return None;
            }
            let rd_atomic = w.wr.op.is_read_or_atomic();
            if k == 0 {
                if qp_type == QpType::Rc
                    && w.wr.flags.contains(SendFlags::FENCE)
                    && self
                        .sq
                        .iter()
                        .take(index)
                        .any(|p| p.wr.op.is_read_or_atomic())
                {
                    return None;
                }
                if rd_atomic && !w.holds_rd_atomic {
                    if self.attr.max_rd_atomic == 0 {
                        // The QP may never issue this operation (reference §2.6).
                        self.local_error(index, WcStatus::LocQpOpErr, ctx);
                        continue;
                    }
                    if self.rd_atomic_outstanding >= u32::from(self.attr.max_rd_atomic) {
                        return None;
                    }
                }
                if !w.started {
                    if let Err(status) = self.check_local(index, mtu, mem) {
                        self.local_error(index, status, ctx);
                        continue;
                    }
                }
            }
            let w = &self.sq[index];
            let npkts = packets_for(&w.wr.op, w.len, mtu);
            let is_read = matches!(w.wr.op, SendOp::RdmaRead { .. });
            let consume = if is_read { npkts - k } else { 1 };
            let mut beyond_window = false;
            if qp_type == QpType::Rc {
                let inflight = psn::diff(self.req_psn, self.comp_psn);
                if inflight > 0 && inflight as u32 + consume > ctx.config.max_unacked_psns {
                    return None;
                }
                let window = room.filter(|r| inflight.max(0) as u32 + consume > r.psns);
                if let Some(room) = window {
                    // Beyond the peer's window. A QP none of whose packets in flight will be
                    // answered (only packets without AckReq) may send one more, with
                    // AckReq: so no QP waits for a timeout to hear of the packets it has
                    // out. One with nothing in flight waits for the other QPs' answers to
                    // wake it, unless there are none to wait for.
                    let answer_coming = if inflight > 0 {
                        psn::diff(self.answer_end, self.comp_psn) > 0
                            && psn::diff(self.answer_end, self.req_psn) <= 0
                    } else {
                        room.others_in_flight
                    };
                    if answer_coming {
                        self.held_by_window = true;
                        if !self.window_held {
                            self.window_held = true;
                            ctx.counters.window_limited += 1;
                        }
                        return None;
                    }
                    beyond_window = true;
                }
            }

            let first = k == 0;
            let last = rd_atomic || k + 1 >= npkts;
            let offset = u64::from(k) * u64::from(mtu);
            let payload_len = if let SendOp::AtomicWrite { .. } = w.wr.op {
                8
            } else if rd_atomic {
                0
            } else {
                (w.len - offset.min(w.len)).min(u64::from(mtu))
            } as usize;
            let solicited_ok = matches!(
                w.wr.op,
                SendOp::Send
                    | SendOp::SendWithImm { .. }
                    | SendOp::SendWithInv { .. }
                    | SendOp::RdmaWriteWithImm { .. }
            );
            let mut hdr = Headers {
                bth: Bth {
                    opcode: 0,
                    solicited: last && solicited_ok && w.wr.flags.contains(SendFlags::SOLICITED),
                    pkey: DEFAULT_PKEY,
                    dest_qp: self.attr.dest_qp_num,
                    // AckReq on the last packet, every 64th packet, every retransmitted
                    // packet (so recovery needs no whole message to get through before
                    // the requester hears of progress), and a packet sent beyond the
                    // peer's congestion window (`window.rs`).
                    ack_req: qp_type == QpType::Rc
                        && (last
                            || beyond_window
                            || (k + 1).is_multiple_of(ACK_REQ_EVERY)
                            || psn::diff(self.req_psn, self.sent_high) < 0),
                    psn: self.req_psn,
                },
                ..Headers::default()
            };
            let seg = |f: u8, m: u8, l: u8, o: u8| match (first, last) {
                (true, true) => o,
                (true, false) => f,
                (false, true) => l,
                (false, false) => m,
            };
            let mut av = self.attr.ah_attr;
            hdr.bth.opcode = match w.wr.op {
                SendOp::Send => seg(
                    op::SEND_FIRST,
                    op::SEND_MIDDLE,
                    op::SEND_LAST,
                    op::SEND_ONLY,
                ),
                SendOp::SendWithImm { imm } => {
                    if last {
                        hdr.imm = Some(imm);
                    }
                    seg(
                        op::SEND_FIRST,
                        op::SEND_MIDDLE,
                        op::SEND_LAST_IMM,
                        op::SEND_ONLY_IMM,
                    )
                }
                SendOp::SendWithInv { invalidate_rkey } => {
                    if last {
                        hdr.ieth = Some(invalidate_rkey);
                    }
                    seg(
                        op::SEND_FIRST,
                        op::SEND_MIDDLE,
                        op::SEND_LAST_INV,
                        op::SEND_ONLY_INV,
                    )
                }
                SendOp::RdmaWrite { remote_addr, rkey } => {
                    if first {
                        hdr.reth = Some(Reth {
                            va: remote_addr,
                            rkey,
                            dma_len: w.len as u32,
                        });
                    }
                    seg(
                        op::WRITE_FIRST,
                        op::WRITE_MIDDLE,
                        op::WRITE_LAST,
                        op::WRITE_ONLY,
                    )
                }
                SendOp::RdmaWriteWithImm {
                    remote_addr,
                    rkey,
                    imm,
                } => {
                    if first {
                        hdr.reth = Some(Reth {
                            va: remote_addr,
                            rkey,
                            dma_len: w.len as u32,
                        });
                    }
                    if last {
                        hdr.imm = Some(imm);
                    }
                    seg(
                        op::WRITE_FIRST,
                        op::WRITE_MIDDLE,
                        op::WRITE_LAST_IMM,
                        op::WRITE_ONLY_IMM,
                    )
                }
                SendOp::RdmaRead { remote_addr, rkey } => {
                    hdr.reth = Some(Reth {
                        va: remote_addr + offset,
                        rkey,
                        dma_len: (w.len - offset.min(w.len)) as u32,
                    });
                    op::READ_REQUEST
                }
                SendOp::CompareSwap {
                    remote_addr,
                    rkey,
                    compare,
                    swap,
                } => {
                    hdr.atomic_eth = Some(AtomicEth {
                        va: remote_addr,
                        rkey,
                        swap_add: swap,
                        compare,
                    });
                    op::COMPARE_SWAP
                }
                SendOp::FetchAdd {
                    remote_addr,
                    rkey,
                    add,
                } => {
                    hdr.atomic_eth = Some(AtomicEth {
                        va: remote_addr,
                        rkey,
                        swap_add: add,
                        compare: 0,
                    });
                    op::FETCH_ADD
                }
                SendOp::AtomicWrite {
                    remote_addr, rkey, ..
                } => {
                    // IBTA 1.5 / rxe_req.c: RETH with length 8, the operand as payload.
                    hdr.reth = Some(Reth {
                        va: remote_addr,
                        rkey,
                        dma_len: 8,
                    });
                    op::ATOMIC_WRITE
                }
                SendOp::Flush {
                    remote_addr,
                    rkey,
                    len,
                    placement,
                    selectivity,
                } => {
                    // IBTA 1.5 / rxe_req.c: FETH, then the RETH of the range.
                    hdr.feth = Some(Feth {
                        placement: placement.bits(),
                        selectivity: selectivity.to_raw(),
                    });
                    hdr.reth = Some(Reth {
                        va: remote_addr,
                        rkey,
                        dma_len: u32::try_from(len).unwrap_or(u32::MAX),
                    });
                    op::FLUSH
                }
                SendOp::BindMw(_) | SendOp::LocalInv { .. } => return None,
            };
            match qp_type {
                QpType::Rc => {}
                QpType::Uc => hdr.bth.opcode |= op::UC_BASE,
                QpType::Ud => {
                    let Some(ud) = w.wr.ud else {
                        self.local_error(index, WcStatus::LocQpOpErr, ctx);
                        continue;
                    };
                    hdr.bth.opcode = if hdr.imm.is_some() {
                        op::UD_SEND_ONLY_IMM
                    } else {
                        op::UD_SEND_ONLY
                    };
                    hdr.bth.dest_qp = ud.remote_qpn;
                    let qkey = if ud.remote_qkey & 0x8000_0000 != 0 {
                        self.attr.qkey
                    } else {
                        ud.remote_qkey
                    };
                    hdr.deth = Some(Deth {
                        qkey,
                        src_qp: self.qpn,
                    });
                    av = ud.av;
                }
            }
            let (start, len) = codec::emit_headers(&hdr, payload_len, buf)?;
            if let SendOp::AtomicWrite { value, .. } = w.wr.op {
                buf[start..start + 8].copy_from_slice(&value);
            } else if payload_len > 0
                && gather(
                    mem,
                    self.init.pd,
                    &w.wr.gather,
                    offset,
                    &mut buf[start..start + payload_len],
                )
                .is_err()
            {
                self.local_error(index, WcStatus::LocProtErr, ctx);
                continue;
            }

            // Commit.
            self.window_held = false;
            let sent_psn = self.req_psn;
            let w = &mut self.sq[index];
            if first {
                w.first_psn = sent_psn;
                w.npkts = npkts;
                w.started = true;
                if rd_atomic && !w.holds_rd_atomic {
                    w.holds_rd_atomic = true;
                    self.rd_atomic_outstanding += 1;
                }
            }
            ctx.counters.packets_sent += 1;
            ctx.counters.bytes_sent += payload_len as u64;
            if psn::diff(sent_psn, self.sent_high) < 0 {
                // Off the fast path: only packets sent again get here.
                tracing::trace!(qpn = self.qpn, psn = sent_psn, "retransmitted packet");
                ctx.counters.retransmitted_packets += 1;
            }
            self.req_psn = psn::add(self.req_psn, consume);
            if hdr.bth.ack_req || rd_atomic || w.wr.op.is_placement() {
                self.answer_end = self.req_psn;
            }
            if psn::diff(self.req_psn, self.sent_high) > 0 {
                self.sent_high = self.req_psn;
            }
            if last {
                self.req_pkt = 0;
                self.req_index += 1;
            } else {
                self.req_pkt = k + 1;
            }
            let dest_qpn = hdr.bth.dest_qp;
            match qp_type {
                QpType::Rc => {
                    if self.retrans_deadline.is_none() {
                        self.retrans_deadline = ack_timeout_ns(self.attr.timeout).map(|t| now + t);
                    }
                }
                QpType::Uc | QpType::Ud => {
                    if last {
                        self.complete_head(WcStatus::Success, 0, ctx);
                    }
                }
            }
            return Some(Transmit {
                len,
                src_qpn: self.qpn,
                dest_qpn,
                av,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::mtu_pieces;

    /// A message of `len` bytes takes ceil(len / MTU) packets (reference §1.6): counted with
    /// a shift for the power-of-two path MTUs and segment sizes, with a division for any
    /// other size a caller sets, the same count for every length, the largest included.
    #[test]
    fn a_message_takes_ceil_len_over_mtu_packets_at_every_mtu_and_segment_size() {
        let mtus = [
            1u32, 3, 256, 512, 1000, 1024, 1500, 2048, 4096, 32_768, 65_000, 65_536,
        ];
        for mtu in mtus {
            let m = u64::from(mtu);
            let lens = [
                0,
                1,
                m - 1,
                m,
                m + 1,
                2 * m,
                2 * m + 1,
                1 << 31,
                u64::from(u32::MAX),
                u64::MAX,
            ];
            for len in lens {
                assert_eq!(
                    mtu_pieces(len, mtu),
                    len.div_ceil(m),
                    "{len} bytes at {mtu}"
                );
            }
        }
    }
}
