//! UC through the safe API: RDMA write and send on an unreliable connection
//! (`ibv_create_qp(3)` IBV_QPT_UC: no ACKs, no reads or atomics).

mod common;

use common::*;
use softverbs::*;

/// `ibv_post_send(3)` on UC: writes and sends arrive and the requester completes without
/// waiting for an acknowledgement; reads are refused at post time.
#[test]
fn uc_write_and_send_arrive_and_reads_are_refused() {
    let (a, b) = (
        side(in_process(), QpType::Uc),
        side(in_process(), QpType::Uc),
    );
    connect(&a, &b);
    a.mr.write_at(0, &[9u8; 3000]).unwrap();
    a.qp.post_send(SendRequest::write(
        1,
        &[a.mr.slice(0..3000).unwrap()],
        b.mr.remote().offset(100),
    ))
    .unwrap();
    assert_eq!(wait_for(&a.cq, 1)[0].status(), WcStatus::Success);
    let deadline = std::time::Instant::now() + PATIENCE;
    while b.mr.read_vec(100..3100).unwrap() != vec![9u8; 3000] {
        assert!(std::time::Instant::now() < deadline, "write never landed");
        b.ctx.progress();
    }
    b.qp.post_recv(RecvRequest::new(2, &[b.mr.slice(8192..9216).unwrap()]))
        .unwrap();
    a.qp.post_send(SendRequest::send_with_imm(
        3,
        &[a.mr.slice(0..10).unwrap()],
        77,
    ))
    .unwrap();
    let recv = wait_for(&b.cq, 1);
    assert_eq!(recv[0].result().unwrap().imm_data(), Some(77));
    wait_for(&a.cq, 1);
    let e =
        a.qp.post_send(SendRequest::read(
            4,
            &[a.mr.slice(0..8).unwrap()],
            b.mr.remote(),
        ))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Verbs(VerbsError::OpcodeNotForQpType {
                qp_type: QpType::Uc,
                ..
            })
        ),
        "{e}"
    );
    assert_eq!(e.errno(), 22);
}
