//! IBA 1.5's ATOMIC WRITE and RDMA FLUSH through the safe API, between two in-process
//! devices (`ibv_wr_post(3)`: `ibv_wr_atomic_write`, `ibv_wr_flush`; IBA 1.5 9.4.7 and
//! 9.4.8 and the responder's checks of 9.7.5.1): an ATOMIC WRITE places its 8 bytes as one
//! unit at an 8-byte-aligned address; a misaligned address is an invalid request
//! (IBV_WC_REM_INV_REQ_ERR), a region without remote write a remote access error
//! (IBV_WC_REM_ACCESS_ERR); a FLUSH needs the region's `IBV_ACCESS_FLUSH_*` right for its
//! placement type and completes with the FLUSH opcode.

mod common;

use common::*;
use softverbs::*;

/// Every right the responder's QP grants: the remote ones `connect` gives, and both FLUSH
/// placements (a FLUSH is checked against `qp_access_flags` as well as the region).
const QP_ACCESS: AccessFlags = AccessFlags::REMOTE_WRITE
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC)
    .union(AccessFlags::FLUSH_GLOBAL)
    .union(AccessFlags::FLUSH_PERSISTENT);

/// Two in-process devices, an RC QP on each granting [`QP_ACCESS`], connected (PSNs 100
/// and 200, as `common::connect`).
fn pair() -> (Side, Side) {
    let (a, b) = (
        side(in_process(), QpType::Rc),
        side(in_process(), QpType::Rc),
    );
    for (me, peer, peer_psn, my_psn) in [(&a, &b, 200, 100), (&b, &a, 100, 200)] {
        me.qp.to_init(QP_ACCESS).unwrap();
        me.qp.to_rtr(peer.qp.local_info(peer_psn)).unwrap();
        me.qp.to_rts(RtsAttr::new(my_psn)).unwrap();
    }
    (a, b)
}

/// Posts `request` on `side` and returns its completion.
fn complete(side: &Side, request: SendRequest) -> WorkCompletion {
    side.qp.post_send(request).unwrap();
    wait_for(&side.cq, 1)[0]
}

/// IBA 1.5 ATOMIC WRITE, `ibv_wr_post(3)` `ibv_wr_atomic_write`: the 8 bytes land at the
/// aligned address and nowhere else; the completion carries IBV_WC_ATOMIC_WRITE.
#[test]
fn atomic_write_places_exactly_eight_bytes() {
    let (a, b) = pair();
    b.mr.fill(0..64, 0xee).unwrap();
    let value = 0x0123_4567_89ab_cdef_u64;
    let wc = complete(
        &a,
        SendRequest::atomic_write(11, b.mr.remote().offset(16), value),
    );
    assert_eq!((wc.wr_id(), wc.status()), (11, WcStatus::Success));
    assert_eq!(wc.result().unwrap().opcode(), WcOpcode::AtomicWrite);
    assert_eq!(b.mr.read_u64(16).unwrap(), value);
    assert_eq!(b.mr.read_vec(16..24).unwrap(), value.to_ne_bytes());
    assert_eq!(b.mr.read_vec(0..16).unwrap(), [0xee; 16]);
    assert_eq!(b.mr.read_vec(24..64).unwrap(), [0xee; 40]);

    // A second write to the same word replaces all 8 bytes.
    let wc = complete(
        &a,
        SendRequest::atomic_write(12, b.mr.remote().offset(16), 0),
    );
    assert_eq!(wc.status(), WcStatus::Success);
    assert_eq!(b.mr.read_u64(16).unwrap(), 0);
}

/// IBA 1.5 (ATOMIC WRITE's address must be 8-byte aligned, like an atomic's; the responder
/// NAKs an invalid request), `ibv_wr_post(3)`: a misaligned address completes with
/// IBV_WC_REM_INV_REQ_ERR and the memory is untouched.
#[test]
fn misaligned_atomic_write_is_an_invalid_request() {
    let (a, b) = pair();
    b.mr.fill(0..32, 0x5a).unwrap();
    let wc = complete(
        &a,
        SendRequest::atomic_write(21, b.mr.remote().offset(4), !0),
    );
    assert_eq!((wc.wr_id(), wc.status()), (21, WcStatus::RemInvReqErr));
    assert_eq!(b.mr.read_vec(0..32).unwrap(), [0x5a; 32]);
}

/// IBA 1.5 (ATOMIC WRITE is a write: the R_Key's region must grant remote write),
/// `ibv_wr_post(3)`: a region registered with remote read only refuses it with
/// IBV_WC_REM_ACCESS_ERR, and its bytes stay.
#[test]
fn atomic_write_to_a_region_without_remote_write_is_refused() {
    let (a, b) = pair();
    let region =
        b.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
            .unwrap();
    region.write_u64(0, 77).unwrap();
    let wc = complete(&a, SendRequest::atomic_write(31, region.remote(), 1));
    assert_eq!((wc.wr_id(), wc.status()), (31, WcStatus::RemAccessErr));
    assert_eq!(region.read_u64(0).unwrap(), 77);
}

/// IBA 1.5 RDMA FLUSH, `ibv_wr_post(3)` `ibv_wr_flush`: on a region registered with
/// IBV_ACCESS_FLUSH_GLOBAL a global-placement FLUSH, of a range and of the whole region,
/// completes with IBV_WC_FLUSH — after the write before it landed.
#[test]
fn flush_of_a_region_with_flush_global_completes() {
    let (a, b) = pair();
    let region =
        b.pd.reg_mr(
            4096,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::FLUSH_GLOBAL,
        )
        .unwrap();
    let write = complete(&a, SendRequest::atomic_write(40, region.remote(), 99));
    assert_eq!(write.status(), WcStatus::Success);
    for (wr_id, selectivity) in [(41, FlushSelectivity::Range), (42, FlushSelectivity::Mr)] {
        let flush = SendRequest::flush(
            wr_id,
            region.remote(),
            64,
            FlushPlacement::GLOBAL,
            selectivity,
        );
        let wc = complete(&a, flush);
        assert_eq!((wc.wr_id(), wc.status()), (wr_id, WcStatus::Success));
        assert_eq!(wc.result().unwrap().opcode(), WcOpcode::Flush);
    }
    assert_eq!(region.read_u64(0).unwrap(), 99);
}

/// IBA 1.5 RDMA FLUSH (the region must grant the placement's FLUSH right),
/// `ibv_wr_post(3)`: a region registered without IBV_ACCESS_FLUSH_GLOBAL — remote read
/// and write are not enough — refuses a global FLUSH with IBV_WC_REM_ACCESS_ERR.
#[test]
fn flush_of_a_region_without_flush_global_is_refused() {
    let (a, b) = pair();
    let region =
        b.pd.reg_mr(
            4096,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    let flush = SendRequest::flush(
        51,
        region.remote(),
        64,
        FlushPlacement::GLOBAL,
        FlushSelectivity::Range,
    );
    let wc = complete(&a, flush);
    assert_eq!((wc.wr_id(), wc.status()), (51, WcStatus::RemAccessErr));
}
