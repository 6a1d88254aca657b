//! Protection domains through the safe API: a QP reaches only memory regions of the PD it
//! was built from (IBTA vol. 1 ch. 10, protection domains: a QP may access a memory region
//! only if the PD assigned to the QP matches the region's; the kernel's rxe refuses such a
//! key in its MR lookup). Two PDs in one context, so the only thing wrong with the keys
//! below is their PD: an R_Key of another PD's region completes with
//! IBV_WC_REM_ACCESS_ERR, an L_Key of another PD's region with IBV_WC_LOC_PROT_ERR, as for
//! an invalid key (`ibv_poll_cq(3)`), and the memory is unchanged.

mod common;

use common::*;
use softverbs::*;

/// Two RC QPs of one in-process context, each in a PD of its own, connected to each other.
fn pair_in_one_context() -> (Side, Side) {
    let ctx = in_process();
    let (a, b) = rc_pair(ctx.clone(), ctx);
    assert_ne!(a.pd.handle(), b.pd.handle(), "two PDs");
    (a, b)
}

/// An RDMA WRITE whose R_Key is of a region in another PD than the responder QP's (here
/// the requester's own PD, in the same context) completes with IBV_WC_REM_ACCESS_ERR and
/// leaves that region unchanged; the same write to a region of the responder QP's PD
/// lands.
#[test]
fn rdma_write_to_an_mr_of_another_pd_is_rem_access_err_and_leaves_it_unchanged() {
    let (a, b) = pair_in_one_context();
    a.mr.fill(0..64, 0x11).unwrap();
    let foreign = a.pd.reg_mr(4096, ALL_ACCESS).unwrap();
    foreign.fill(.., 0x5A).unwrap();
    a.qp.post_send(SendRequest::write(
        1,
        &[a.mr.slice(0..64).unwrap()],
        foreign.remote(),
    ))
    .unwrap();
    let done = wait_for(&a.cq, 1);
    assert_eq!(done[0].wr_id(), 1);
    assert_eq!(done[0].status(), WcStatus::RemAccessErr);
    assert_eq!(foreign.read_vec(..).unwrap(), vec![0x5A; 4096]);
    assert_eq!(b.qp.state().unwrap(), QpState::Err, "responder error");

    // The responder's own PD: the write lands.
    let (a, b) = pair_in_one_context();
    a.mr.fill(0..64, 0x11).unwrap();
    a.qp.post_send(SendRequest::write(
        2,
        &[a.mr.slice(0..64).unwrap()],
        b.mr.remote(),
    ))
    .unwrap();
    assert_eq!(wait_for(&a.cq, 1)[0].status(), WcStatus::Success);
    assert_eq!(b.mr.read_vec(0..64).unwrap(), vec![0x11; 64]);
}

/// A SEND gathering from an MR of another PD than the QP's completes with
/// IBV_WC_LOC_PROT_ERR and sends nothing: the peer's receive buffer is unchanged.
#[test]
fn send_from_an_mr_of_another_pd_is_loc_prot_err() {
    let (a, b) = pair_in_one_context();
    let foreign = b.pd.reg_mr(4096, ALL_ACCESS).unwrap();
    foreign.fill(.., 0x22).unwrap();
    b.qp.post_recv(RecvRequest::new(9, &[b.mr.slice(0..64).unwrap()]))
        .unwrap();
    a.qp.post_send(SendRequest::send(3, &[foreign.slice(0..64).unwrap()]))
        .unwrap();
    let done = wait_for(&a.cq, 1);
    assert_eq!(done[0].wr_id(), 3);
    assert_eq!(done[0].status(), WcStatus::LocProtErr);
    assert_eq!(b.mr.read_vec(0..64).unwrap(), vec![0; 64]);
}

/// A QP built from a `Pd` carries that PD: `ibv_query_qp` reports its init attributes
/// with the PD's handle.
#[test]
fn a_qp_carries_the_pd_it_was_built_from() {
    let (a, b) = pair_in_one_context();
    assert_eq!(a.qp.query().unwrap().1.pd, a.pd.handle());
    assert_eq!(b.qp.query().unwrap().1.pd, b.pd.handle());
}
