//! Dropping a memory region while work names it: the device refuses every later access
//! through the registration table, so the work completes with an error status instead of
//! touching freed memory (`ibv_dereg_mr(3)`, `ibv_poll_cq(3)` IBV_WC_LOC_PROT_ERR).

mod common;

use common::*;
use softverbs::*;

/// A send request built while its MR was registered, posted after the MR was dropped,
/// completes with IBV_WC_LOC_PROT_ERR (its L_Key is no longer valid).
#[test]
fn a_send_posted_after_its_mr_was_dropped_completes_with_loc_prot_err() {
    let (a, b) = rc_pair(in_process(), in_process());
    b.qp.post_recv(RecvRequest::new(1, &[b.mr.slice(0..64).unwrap()]))
        .unwrap();
    let mr = a.pd.reg_mr(4096, ALL_ACCESS).unwrap();
    let wr = SendRequest::send(7, &[mr.slice(0..64).unwrap()]);
    drop(mr);
    a.qp.post_send(wr).unwrap();
    let done = wait_for(&a.cq, 1);
    assert_eq!(done[0].wr_id(), 7);
    assert_eq!(done[0].status(), WcStatus::LocProtErr);
}

/// A receive posted into an MR that is then dropped: the incoming message completes that
/// receive with IBV_WC_LOC_PROT_ERR (the responder cannot scatter into it), and the
/// sender learns of it with an error status; nothing is written anywhere.
#[test]
fn a_receive_whose_mr_was_dropped_completes_with_an_error() {
    let (a, b) = rc_pair(in_process(), in_process());
    let mr = b.pd.reg_mr(4096, ALL_ACCESS).unwrap();
    b.qp.post_recv(RecvRequest::new(9, &[mr.slice(0..4096).unwrap()]))
        .unwrap();
    drop(mr);
    a.qp.post_send(SendRequest::send_inline(3, b"into freed memory?"))
        .unwrap();
    let recv = wait_for(&b.cq, 1);
    assert_eq!(recv[0].wr_id(), 9);
    assert_eq!(recv[0].status(), WcStatus::LocProtErr);
    let sent = wait_for(&a.cq, 1);
    assert_ne!(sent[0].status(), WcStatus::Success);
}

/// A send in flight (waiting on RNR retries, to be gathered again on retransmission) when
/// its MR is dropped: the retransmission finds the L_Key gone and the request completes
/// with an error status, never a crash.
#[test]
fn a_send_in_flight_when_its_mr_is_dropped_completes_with_an_error() {
    let (a, b) = rc_pair(in_process(), in_process());
    let mr = a.pd.reg_mr(8192, ALL_ACCESS).unwrap();
    mr.fill(.., 0x77).unwrap();
    // No receive at B yet: RNR NAK, then retries (rnr_retry 7 = forever).
    a.qp.post_send(SendRequest::send(5, &[mr.slice(..).unwrap()]))
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    drop(mr);
    b.qp.post_recv(RecvRequest::new(1, &[b.mr.slice(0..8192).unwrap()]))
        .unwrap();
    let done = wait_for(&a.cq, 1);
    assert_eq!(done[0].wr_id(), 5);
    // Either the first transmission had already delivered it (then success), or a
    // retransmission found the region gone (then an error): never anything else.
    match done[0].status() {
        WcStatus::Success => assert_eq!(b.mr.read_vec(0..8192).unwrap(), vec![0x77; 8192]),
        status => assert!(
            matches!(status, WcStatus::LocProtErr | WcStatus::LocAccessErr),
            "{status:?}"
        ),
    }
}

/// `ibv_dereg_mr(3)` as an explicit call succeeds, and remote access to the region
/// afterwards is refused with IBV_WC_REM_ACCESS_ERR.
#[test]
fn remote_access_to_a_deregistered_region_is_rem_access_err() {
    let (a, b) = rc_pair(in_process(), in_process());
    let target = b.pd.reg_mr(4096, ALL_ACCESS).unwrap();
    let remote = target.remote();
    target.dereg().unwrap();
    a.qp.post_send(SendRequest::write(1, &[a.mr.slice(0..8).unwrap()], remote))
        .unwrap();
    assert_eq!(wait_for(&a.cq, 1)[0].status(), WcStatus::RemAccessErr);
}
