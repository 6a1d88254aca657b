"""pyverbs over the softverbs drop-in: real traffic through a plain CQ, an extended CQ
and a completion channel, in one process on one device.

Run by `tests/pyverbs.rs` with Debian's /usr/bin/python3 (package python3-pyverbs),
LD_LIBRARY_PATH pointing at the drop-in `libibverbs.so.1` and SOFTVERBS_ADDR giving the
device its address. The device sends to itself: both QPs' address vectors carry the
device's own GID (index 1, ::ffff:127.0.0.N, the IPv4 RoCEv2 GID of a port laid out
as kernel rxe's), as rdma-core's tests/base.py does.

1. RC: QP A (send and receive CQ: the plain CQ, bound to a completion channel) and QP B
   (send and receive CQ: the extended CQ with byte_len, qp_num, imm and completion
   timestamp) connected to each other.
   - A sends SEND and SEND_WITH_IMM to B: A's send completions through ibv_poll_cq
     (CQ.poll), B's receive completions through ibv_start_poll / ibv_next_poll /
     ibv_end_poll with read_opcode, read_byte_len, read_qp_num, read_imm_data,
     read_wc_flags, read_timestamp; data checked in B's buffers.
   - B sends to A with A's CQ armed (ibv_req_notify_cq): one completion event through
     the channel (ibv_get_cq_event, expected CQ), acknowledged (ibv_ack_cq_events), then
     the receive completion polled from the CQ.
   - A does RDMA WRITE and RDMA READ on B's MR: completions with opcodes RDMA_WRITE and
     RDMA_READ, data checked on both sides.
2. UD: two UD QPs on the plain CQ, an address handle with a GRH to the device's own GID;
   the receive carries the 40-byte GRH slot before the payload.

Every wait is bounded (TIMEOUT seconds). The last line printed on success is
`pyverbs-softverbs: ok ...`; any failure raises (non-zero exit status, traceback).
"""

import random
import socket
import sys
import time

import pyverbs.enums as e
from pyverbs.addr import AH, AHAttr, GlobalRoute
from pyverbs.cq import CQ, CQEX, CompChannel, CqInitAttrEx, PollCqAttr
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

DEVICE = "softverbs0"
PORT = 1
GID_INDEX = 1
TIMEOUT = 20.0
ENOENT = 2
SLOT = 4096
SLOTS = 8
GRH = 40
QKEY = 0x11111111


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


def deadline():
    return time.monotonic() + TIMEOUT


def poll_cq(cq, count, what):
    """ibv_poll_cq until `count` completions arrived (bounded in time)."""
    wcs = []
    end = deadline()
    while len(wcs) < count:
        check(time.monotonic() < end, f"{what}: {len(wcs)} of {count} completions after {TIMEOUT} s")
        n, got = cq.poll(count - len(wcs))
        check(n >= 0, f"{what}: ibv_poll_cq returned {n}")
        wcs.extend(got[:n])
    for wc in wcs:
        check(
            wc.status == e.IBV_WC_SUCCESS,
            f"{what}: wr_id {wc.wr_id} status {wc.status} (vendor_err {wc.vendor_err})",
        )
    n, _ = cq.poll(1)
    check(n == 0, f"{what}: an unexpected extra completion")
    return wcs


class Cqe:
    """What one extended-CQ completion read back through the ibv_wc_read_* accessors."""

    def __init__(self, cqex):
        self.wr_id = cqex.wr_id
        self.status = cqex.status
        self.opcode = cqex.read_opcode()
        self.byte_len = cqex.read_byte_len()
        self.qp_num = cqex.read_qp_num()
        self.wc_flags = cqex.read_wc_flags()
        self.imm_data = cqex.read_imm_data() if self.wc_flags & e.IBV_WC_WITH_IMM else None
        self.timestamp = cqex.read_timestamp()


def poll_cq_ex(cqex, count, what):
    """ibv_start_poll (retried on ENOENT), ibv_next_poll, ibv_end_poll: `count` completions."""
    end = deadline()
    attr = PollCqAttr()
    ret = cqex.start_poll(attr)
    while ret == ENOENT:
        check(time.monotonic() < end, f"{what}: ibv_start_poll still ENOENT after {TIMEOUT} s")
        ret = cqex.start_poll(attr)
    check(ret == 0, f"{what}: ibv_start_poll returned {ret}")
    cqes = []
    try:
        cqes.append(Cqe(cqex))
        while len(cqes) < count:
            ret = cqex.poll_next()
            while ret == ENOENT:
                check(time.monotonic() < end, f"{what}: ibv_next_poll still ENOENT after {TIMEOUT} s")
                ret = cqex.poll_next()
            check(ret == 0, f"{what}: ibv_next_poll returned {ret}")
            cqes.append(Cqe(cqex))
        ret = cqex.poll_next()
        check(ret == ENOENT, f"{what}: ibv_next_poll after the last completion returned {ret}, not ENOENT")
    finally:
        cqex.end_poll()
    for c in cqes:
        check(c.status == e.IBV_WC_SUCCESS, f"{what}: wr_id {c.wr_id} status {c.status}")
    return cqes


def pattern(tag, length):
    return bytes((tag * 31 + i * 7) % 251 for i in range(length))


def rc_attr(ctx, port_attr, gid, remote_qpn, rq_psn, sq_psn):
    attr = QPAttr(port_num=PORT)
    attr.path_mtu = e.IBV_MTU_1024
    attr.dest_qp_num = remote_qpn
    attr.rq_psn = rq_psn
    attr.sq_psn = sq_psn
    attr.max_dest_rd_atomic = 1
    attr.max_rd_atomic = 1
    attr.min_rnr_timer = 12
    attr.timeout = 14
    attr.retry_cnt = 7
    attr.rnr_retry = 7
    gr = GlobalRoute(dgid=gid, sgid_index=GID_INDEX)
    attr.ah_attr = AHAttr(port_num=PORT, is_global=1, gr=gr, dlid=port_attr.lid)
    return attr


def rc_traffic(ctx, pd, port_attr, gid):
    access = (
        e.IBV_ACCESS_LOCAL_WRITE
        | e.IBV_ACCESS_REMOTE_WRITE
        | e.IBV_ACCESS_REMOTE_READ
    )
    channel = CompChannel(ctx)
    cq = CQ(ctx, 64, None, channel, 0)
    wc_flags = (
        e.IBV_WC_EX_WITH_BYTE_LEN
        | e.IBV_WC_EX_WITH_QP_NUM
        | e.IBV_WC_EX_WITH_IMM
        | e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
    )
    cqex = CQEX(ctx, CqInitAttrEx(cqe=64, wc_flags=wc_flags))

    mr_a = MR(pd, SLOT * SLOTS, access)
    mr_b = MR(pd, SLOT * SLOTS, access)

    init = QPAttr(port_num=PORT)
    init.qp_access_flags = access
    cap = QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)
    qp_a = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap), init)
    cap = QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)
    qp_b = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cqex, rcq=cqex, cap=cap), init)
    check(qp_a.qp_num != qp_b.qp_num, "two QPs with one QPN")
    psn_a = random.getrandbits(24)
    psn_b = random.getrandbits(24)
    qp_a.to_rts(rc_attr(ctx, port_attr, gid, qp_b.qp_num, psn_b, psn_a))
    qp_b.to_rts(rc_attr(ctx, port_attr, gid, qp_a.qp_num, psn_a, psn_b))
    check(qp_a.qp_state == e.IBV_QPS_RTS, f"QP A state {qp_a.qp_state}")
    check(qp_b.qp_state == e.IBV_QPS_RTS, f"QP B state {qp_b.qp_state}")

    # A -> B: SEND (slots 0..3) and SEND_WITH_IMM (slot 4); sizes 1 B .. 4 KiB.
    sizes = [1, 64, 1000, SLOT, 257]
    imm = 0x12345678
    for slot in range(len(sizes)):
        sge = SGE(mr_b.buf + slot * SLOT, SLOT, mr_b.lkey)
        qp_b.post_recv(RecvWR(wr_id=0xB000 + slot, num_sge=1, sg=[sge]))
    for slot, size in enumerate(sizes):
        mr_a.write(pattern(slot, size), size, slot * SLOT)
        sge = SGE(mr_a.buf + slot * SLOT, size, mr_a.lkey)
        last = slot == len(sizes) - 1
        wr = SendWR(
            wr_id=0xA000 + slot,
            opcode=e.IBV_WR_SEND_WITH_IMM if last else e.IBV_WR_SEND,
            num_sge=1,
            sg=[sge],
            send_flags=e.IBV_SEND_SIGNALED,
        )
        if last:
            # imm_data is the raw big-endian field (rdma-core tests/utils.py: htonl).
            wr.imm_data = socket.htonl(imm)
        qp_a.post_send(wr)
    sent = poll_cq(cq, len(sizes), "A's sends (ibv_poll_cq)")
    check(
        [wc.wr_id for wc in sent] == [0xA000 + s for s in range(len(sizes))],
        f"send wr_ids {[hex(wc.wr_id) for wc in sent]}",
    )
    for wc in sent:
        check(wc.opcode == e.IBV_WC_SEND, f"send completion opcode {wc.opcode}")
        check(wc.qp_num == qp_a.qp_num, f"send completion qp_num {wc.qp_num} != {qp_a.qp_num}")
    received = poll_cq_ex(cqex, len(sizes), "B's receives (ibv_start_poll)")
    check(
        [c.wr_id for c in received] == [0xB000 + s for s in range(len(sizes))],
        f"receive wr_ids {[hex(c.wr_id) for c in received]}",
    )
    for slot, (c, size) in enumerate(zip(received, sizes)):
        check(c.opcode == e.IBV_WC_RECV, f"receive {slot}: opcode {c.opcode}")
        check(c.byte_len == size, f"receive {slot}: byte_len {c.byte_len} != {size}")
        check(c.qp_num == qp_b.qp_num, f"receive {slot}: qp_num {c.qp_num} != {qp_b.qp_num}")
        data = mr_b.read(size, slot * SLOT)
        check(data == pattern(slot, size), f"receive {slot}: data differs")
    last = received[-1]
    check(last.wc_flags & e.IBV_WC_WITH_IMM, f"SEND_WITH_IMM receive without IBV_WC_WITH_IMM ({last.wc_flags:#x})")
    check(socket.ntohl(last.imm_data) == imm, f"imm_data {last.imm_data:#x}, sent {imm:#x}")
    for c in received[:-1]:
        check(not c.wc_flags & e.IBV_WC_WITH_IMM, f"plain SEND receive with IBV_WC_WITH_IMM ({c.wc_flags:#x})")
    stamps = [c.timestamp for c in received]
    check(all(s != 0 for s in stamps), f"completion timestamps {stamps}")
    check(stamps == sorted(stamps), f"completion timestamps not in order: {stamps}")

    # B -> A with A's CQ armed: one completion event, acknowledged, then the completions.
    cq.req_notify()
    qp_a.post_recv(RecvWR(wr_id=0xA100, num_sge=1, sg=[SGE(mr_a.buf + 7 * SLOT, SLOT, mr_a.lkey)]))
    reply = b"reply through a completion event"
    mr_b.write(reply, len(reply), 6 * SLOT)
    qp_b.post_send(
        SendWR(
            wr_id=0xB100,
            opcode=e.IBV_WR_SEND,
            num_sge=1,
            sg=[SGE(mr_b.buf + 6 * SLOT, len(reply), mr_b.lkey)],
            send_flags=e.IBV_SEND_SIGNALED,
        )
    )
    # get_cq_event blocks in ibv_get_cq_event (a read on the channel fd); the Rust test
    # kills the process after its own timeout if no event ever comes.
    channel.get_cq_event(cq)
    cq.ack_events(1)
    got = poll_cq(cq, 1, "A's receive after the event (ibv_poll_cq)")[0]
    check(got.wr_id == 0xA100, f"event receive wr_id {got.wr_id:#x}")
    check(got.opcode == e.IBV_WC_RECV, f"event receive opcode {got.opcode}")
    check(got.byte_len == len(reply), f"event receive byte_len {got.byte_len}")
    check(got.qp_num == qp_a.qp_num, f"event receive qp_num {got.qp_num}")
    check(mr_a.read(len(reply), 7 * SLOT) == reply, "event receive: data differs")
    sent = poll_cq_ex(cqex, 1, "B's send (ibv_start_poll)")[0]
    check(sent.wr_id == 0xB100 and sent.opcode == e.IBV_WC_SEND, f"B's send wr_id {sent.wr_id:#x} opcode {sent.opcode}")

    # RDMA WRITE A -> B (slot 5), then RDMA READ of B's slot 6 into A's slot 6.
    payload = pattern(99, 3000)
    mr_a.write(payload, len(payload), 5 * SLOT)
    wr = SendWR(
        wr_id=0xA200,
        opcode=e.IBV_WR_RDMA_WRITE,
        num_sge=1,
        sg=[SGE(mr_a.buf + 5 * SLOT, len(payload), mr_a.lkey)],
        send_flags=e.IBV_SEND_SIGNALED,
    )
    wr.set_wr_rdma(mr_b.rkey, mr_b.buf + 5 * SLOT)
    qp_a.post_send(wr)
    done = poll_cq(cq, 1, "A's RDMA WRITE")[0]
    check(done.wr_id == 0xA200 and done.opcode == e.IBV_WC_RDMA_WRITE, f"RDMA WRITE wr_id {done.wr_id:#x} opcode {done.opcode}")
    check(mr_b.read(len(payload), 5 * SLOT) == payload, "RDMA WRITE: data differs at the target")

    remote = pattern(42, 2500)
    mr_b.write(remote, len(remote), 6 * SLOT)
    wr = SendWR(
        wr_id=0xA300,
        opcode=e.IBV_WR_RDMA_READ,
        num_sge=1,
        sg=[SGE(mr_a.buf + 6 * SLOT, len(remote), mr_a.lkey)],
        send_flags=e.IBV_SEND_SIGNALED,
    )
    wr.set_wr_rdma(mr_b.rkey, mr_b.buf + 6 * SLOT)
    qp_a.post_send(wr)
    done = poll_cq(cq, 1, "A's RDMA READ")[0]
    check(done.wr_id == 0xA300 and done.opcode == e.IBV_WC_RDMA_READ, f"RDMA READ wr_id {done.wr_id:#x} opcode {done.opcode}")
    check(done.byte_len == len(remote), f"RDMA READ byte_len {done.byte_len}")
    check(mr_a.read(len(remote), 6 * SLOT) == remote, "RDMA READ: data differs")

    for obj in (qp_a, qp_b, mr_a, mr_b, cq, cqex, channel):
        obj.close()
    return len(sizes) + 4


def ud_traffic(ctx, pd, port_attr, gid):
    cq = CQ(ctx, 16, None, None, 0)
    mr_s = MR(pd, SLOT, e.IBV_ACCESS_LOCAL_WRITE)
    mr_r = MR(pd, SLOT + GRH, e.IBV_ACCESS_LOCAL_WRITE)
    init = QPAttr(port_num=PORT)
    init.qkey = QKEY
    init.pkey_index = 0
    cap = QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
    qp_s = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq, cap=cap), init)
    cap = QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
    qp_r = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq, cap=cap), init)
    check(qp_s.qp_state == e.IBV_QPS_RTS, f"UD QP state {qp_s.qp_state}")
    check(qp_r.qp_state == e.IBV_QPS_RTS, f"UD QP state {qp_r.qp_state}")

    gr = GlobalRoute(dgid=gid, sgid_index=GID_INDEX)
    ah = AH(pd, attr=AHAttr(port_num=PORT, is_global=1, gr=gr, dlid=port_attr.lid))
    size = 1024
    payload = pattern(7, size)
    mr_s.write(payload, size, 0)
    qp_r.post_recv(RecvWR(wr_id=0xD001, num_sge=1, sg=[SGE(mr_r.buf, size + GRH, mr_r.lkey)]))
    wr = SendWR(
        wr_id=0xD002,
        opcode=e.IBV_WR_SEND,
        num_sge=1,
        sg=[SGE(mr_s.buf, size, mr_s.lkey)],
        send_flags=e.IBV_SEND_SIGNALED,
    )
    wr.set_wr_ud(ah, qp_r.qp_num, QKEY)
    qp_s.post_send(wr)
    wcs = poll_cq(cq, 2, "UD send and receive")
    by_id = {wc.wr_id: wc for wc in wcs}
    check(set(by_id) == {0xD001, 0xD002}, f"UD wr_ids {[hex(w) for w in by_id]}")
    recv = by_id[0xD001]
    check(recv.opcode == e.IBV_WC_RECV, f"UD receive opcode {recv.opcode}")
    check(recv.byte_len == size + GRH, f"UD receive byte_len {recv.byte_len} != {size + GRH}")
    check(recv.qp_num == qp_r.qp_num, f"UD receive qp_num {recv.qp_num}")
    check(recv.src_qp == qp_s.qp_num, f"UD receive src_qp {recv.src_qp} != {qp_s.qp_num}")
    check(recv.wc_flags & e.IBV_WC_GRH, f"UD receive without IBV_WC_GRH ({recv.wc_flags:#x})")
    check(mr_r.read(size, GRH) == payload, "UD receive: data differs")
    check(by_id[0xD002].opcode == e.IBV_WC_SEND, f"UD send opcode {by_id[0xD002].opcode}")

    for obj in (qp_s, qp_r, ah, mr_s, mr_r, cq):
        obj.close()
    return 2


def main():
    ctx = Context(name=DEVICE)
    port_attr = ctx.query_port(PORT)
    check(port_attr.state == e.IBV_PORT_ACTIVE, f"port state {port_attr.state}")
    gid = ctx.query_gid(PORT, GID_INDEX)
    pd = PD(ctx)
    rc = rc_traffic(ctx, pd, port_attr, gid)
    ud = ud_traffic(ctx, pd, port_attr, gid)
    pd.close()
    ctx.close()
    print(f"pyverbs-softverbs: ok device {DEVICE} gid {gid} rc_completions {rc} ud_completions {ud}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
