//! Shared receive queues through the safe API (`ibv_create_srq(3)`,
//! `ibv_post_srq_recv(3)`, `ibv_modify_srq(3)`, `ibv_destroy_srq(3)`).

mod common;

use common::*;
use softverbs::*;

/// `ibv_create_srq(3)`: receives posted to the SRQ are consumed by messages arriving on
/// any QP attached to it, in posting order; the armed limit raises
/// IBV_EVENT_SRQ_LIMIT_REACHED once (`ibv_modify_srq(3)`).
#[test]
fn two_qps_consume_receives_from_one_srq_and_the_limit_event_fires() {
    let server = in_process();
    let pd = server.alloc_pd();
    let cq = server.create_cq(64).unwrap();
    let srq = pd
        .create_srq(SrqInit {
            max_wr: 16,
            ..SrqInit::default()
        })
        .unwrap();
    let mr = pd.reg_mr(4096, ALL_ACCESS).unwrap();
    for i in 0..4 {
        srq.post_recv(RecvRequest::new(
            100 + i,
            &[mr.slice(i as usize * 1024..(i as usize + 1) * 1024)
                .unwrap()],
        ))
        .unwrap();
    }
    srq.arm_limit(3).unwrap();
    // The PortActive event of the open comes first.
    while let Some(event) = server.try_async_event() {
        assert!(matches!(event, AsyncEvent::PortActive { .. }), "{event:?}");
    }

    let clients: Vec<Side> = (0..2).map(|_| side(in_process(), QpType::Rc)).collect();
    let mut qps = Vec::new();
    for client in &clients {
        let qp = pd
            .qp_builder(QpType::Rc, &cq, &cq)
            .srq(&srq)
            .build()
            .unwrap();
        for (me, peer) in [(&qp, &client.qp), (&client.qp, &qp)] {
            me.to_init(AccessFlags::empty()).unwrap();
            me.to_rtr(peer.local_info(9)).unwrap();
            me.to_rts(RtsAttr::new(9)).unwrap();
        }
        // ibv_post_recv(3) on a QP with an SRQ is an error value, not a panic.
        assert!(matches!(
            qp.post_recv(RecvRequest::new(0, &[mr.slice(0..8).unwrap()])),
            Err(Error::Verbs(VerbsError::ReceivesFromSrq))
        ));
        qps.push(qp);
    }
    for (i, client) in clients.iter().enumerate() {
        client
            .qp
            .post_send(SendRequest::send_inline(i as u64, &[i as u8 + 1; 10]))
            .unwrap();
        wait_for(&client.cq, 1);
    }
    let recvs = wait_for(&cq, 2);
    let ids: Vec<u64> = recvs.iter().map(|wc| wc.wr_id()).collect();
    assert_eq!(ids, vec![100, 101]);
    assert_eq!(recvs[0].qp_num(), qps[0].qpn());
    assert_eq!(recvs[1].qp_num(), qps[1].qpn());
    assert_eq!(mr.read_vec(0..10).unwrap(), vec![1; 10]);
    assert_eq!(mr.read_vec(1024..1034).unwrap(), vec![2; 10]);
    let event = server
        .async_event_timeout(PATIENCE)
        .unwrap()
        .expect("SRQ limit event");
    assert_eq!(event, AsyncEvent::SrqLimitReached { srq: srq.id().0 });

    // ibv_destroy_srq(3): refused while QPs use it; handed back.
    let srq = match srq.destroy() {
        Err((srq, e)) => {
            assert_eq!(e.errno(), 16);
            srq
        }
        Ok(()) => panic!("destroyed an SRQ in use"),
    };
    drop(qps);
    srq.destroy().map_err(|(_, e)| e).unwrap();
}
