//! Requester rules seen on the wire: fences and the `max_rd_atomic` budget (reference
//! §2.2), inline data and the solicited bit (ibv_post_send(3)), signaled / unsignaled
//! completions and `sq_sig_all` (reference §3.5), and the COMM_EST / SQ_DRAINED events
//! (reference §2.7, ibv_modify_qp(3) `en_sqd_async_notify`).

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use common::{recv, sge, two_nodes, ALL_ACCESS};
use softverbs_cq::WcOpcode;
use softverbs_proto::{AsyncEvent, AttrMask, QpAttr, QpState, QpType, SendFlags, SendOp, SendWr};
use softverbs_sim::{bring_up, connect, create_qp, run_seeds, FaultRules, QpParams, Sim};

const STEPS: u64 = 200_000;

/// `(from node, opcode, BTH byte 1, psn)` of every packet, in send order.
type Log = Rc<RefCell<Vec<(usize, u8, u8, u32)>>>;

/// Records every packet into a [`Log`].
fn tap(sim: &mut Sim) -> Log {
    let log = Rc::new(RefCell::new(Vec::new()));
    let sink = log.clone();
    sim.intercept = Some(Box::new(move |from, _, b: &mut Vec<u8>| {
        sink.borrow_mut().push((
            from,
            b[0],
            b[1],
            u32::from_be_bytes([0, b[9], b[10], b[11]]),
        ));
        true
    }));
    log
}

/// `IBV_SEND_FENCE`: a fenced SEND is not transmitted before the earlier RDMA READ has
/// completed (its response arrived).
#[test]
fn fenced_send_waits_for_earlier_read() {
    run_seeds("fenced_send_waits_for_earlier_read", &[1], |seed| {
        let mut sim = two_nodes(seed, FaultRules::perfect());
        let (qa, qb) = connect(&mut sim, 0, 1, QpType::Rc, &QpParams::default())?;
        let a = sim.nodes[0].mem.register(8192, ALL_ACCESS);
        let b = sim.nodes[1].mem.register(8192, ALL_ACCESS);
        sim.post_recv(1, qb, recv(1, &b, 4096, 64))?;
        let log = tap(&mut sim);
        let read = SendOp::RdmaRead {
            remote_addr: b.addr,
            rkey: b.rkey,
        };
        sim.post_send(0, qa, SendWr::new(1, read, vec![sge(&a, 0, 3000)]))?;
        sim.post_send(
            0,
            qa,
            SendWr::new(2, SendOp::Send, vec![sge(&a, 4096, 8)]).with_flags(SendFlags::FENCE),
        )?;
        sim.run_idle(STEPS)?;
        let log = log.borrow();
        let last_response = log
            .iter()
            .position(|&(f, op, ..)| f == 1 && op == 0x0F)
            .unwrap();
        let send = log
            .iter()
            .position(|&(f, op, ..)| f == 0 && op == 0x04)
            .unwrap();
        assert!(
            send > last_response,
            "fenced send went out after the read's last response: {log:?}"
        );
        assert_eq!(sim.completions(0).len(), 2);
        Ok(())
    });
}

/// `max_rd_atomic` = 1: a second READ or atomic is not issued while one is outstanding.
#[test]
fn max_rd_atomic_limits_outstanding_reads_and_atomics() {
    run_seeds(
        "max_rd_atomic_limits_outstanding_reads_and_atomics",
        &[2],
        |seed| {
            let mut sim = two_nodes(seed, FaultRules::perfect());
            let p = QpParams {
                max_rd_atomic: 1,
                max_dest_rd_atomic: 1,
                ..QpParams::default()
            };
            let (qa, _qb) = connect(&mut sim, 0, 1, QpType::Rc, &p)?;
            let a = sim.nodes[0].mem.register(8192, ALL_ACCESS);
            let b = sim.nodes[1].mem.register(8192, ALL_ACCESS);
            let log = tap(&mut sim);
            for i in 0..3u64 {
                let read = SendOp::RdmaRead {
                    remote_addr: b.addr,
                    rkey: b.rkey,
                };
                sim.post_send(0, qa, SendWr::new(i, read, vec![sge(&a, i * 64, 64)]))?;
            }
            let faa = SendOp::FetchAdd {
                remote_addr: b.addr + 4096,
                rkey: b.rkey,
                add: 1,
            };
            sim.post_send(0, qa, SendWr::new(3, faa, vec![sge(&a, 4096, 8)]))?;
            sim.run_idle(STEPS)?;
            // Requests and responses strictly alternate.
            let seq: Vec<usize> = log.borrow().iter().map(|&(f, ..)| f).collect();
            assert_eq!(seq, vec![0, 1, 0, 1, 0, 1, 0, 1]);
            assert_eq!(sim.completions(0).len(), 4);
            Ok(())
        },
    );
}

/// `IBV_SEND_INLINE`: the payload was copied at post time (the L_Key is not checked);
/// `IBV_SEND_SOLICITED` sets SE on the last packet only, and the receive completion says
/// the message was solicited (what a solicited-only CQ arm fires on, `ibv_req_notify_cq(3)`).
#[test]
fn inline_payload_and_solicited_bit_on_last_packet() {
    run_seeds(
        "inline_payload_and_solicited_bit_on_last_packet",
        &[3],
        |seed| {
            let mut sim = two_nodes(seed, FaultRules::perfect());
            let (qa, qb) = connect(&mut sim, 0, 1, QpType::Rc, &QpParams::default())?;
            let a = sim.nodes[0].mem.register(8192, ALL_ACCESS);
            let b = sim.nodes[1].mem.register(8192, ALL_ACCESS);
            sim.post_recv(1, qb, recv(1, &b, 0, 64))?;
            sim.post_recv(1, qb, recv(2, &b, 1024, 4096))?;
            let log = tap(&mut sim);
            let inline = SendWr::new(1, SendOp::Send, vec![]).with_inline(b"inline!".to_vec());
            sim.post_send(0, qa, inline)?;
            sim.post_send(
                0,
                qa,
                SendWr::new(2, SendOp::Send, vec![sge(&a, 0, 2500)])
                    .with_flags(SendFlags::SOLICITED),
            )?;
            sim.run_idle(STEPS)?;
            assert_eq!(sim.nodes[1].mem.bytes(b.addr, 7), b"inline!");
            let log = log.borrow();
            let requests: Vec<(u8, bool)> = log
                .iter()
                .filter(|&&(f, ..)| f == 0)
                .map(|&(_, op, flags, _)| (op, flags & 0x80 != 0))
                .collect();
            assert_eq!(
                requests,
                vec![(0x04, false), (0x00, false), (0x01, false), (0x02, true)]
            );
            let solicited: Vec<(u64, bool)> = sim
                .completions(1)
                .iter()
                .map(|c| (c.wc.wr_id(), c.solicited))
                .collect();
            assert_eq!(solicited, vec![(1, false), (2, true)]);
            Ok(())
        },
    );
}

/// With `sq_sig_all` off only `IBV_SEND_SIGNALED` WRs complete; a signaled completion
/// implies the earlier unsignaled ones finished (the sim's ordering invariant checks it).
#[test]
fn only_signaled_work_requests_complete_without_sq_sig_all() {
    run_seeds(
        "only_signaled_work_requests_complete_without_sq_sig_all",
        &[4],
        |seed| {
            let mut sim = two_nodes(seed, FaultRules::lossy(0.05));
            let p = QpParams {
                sq_sig_all: false,
                ..QpParams::default()
            };
            let (qa, _qb) = connect(&mut sim, 0, 1, QpType::Rc, &p)?;
            let a = sim.nodes[0].mem.register(8192, ALL_ACCESS);
            let b = sim.nodes[1].mem.register(8192, ALL_ACCESS);
            for i in 0..40u64 {
                let op = SendOp::RdmaWrite {
                    remote_addr: b.addr,
                    rkey: b.rkey,
                };
                let mut wr = SendWr::new(i, op, vec![sge(&a, 0, 100)]);
                if i % 10 == 9 {
                    wr = wr.with_flags(SendFlags::SIGNALED);
                }
                sim.post_send(0, qa, wr)?;
            }
            sim.run_until(STEPS, |s| s.completions(0).len() == 4)?;
            sim.run_idle(STEPS)?;
            let ids: Vec<u64> = sim.completions(0).iter().map(|c| c.wc.wr_id()).collect();
            assert_eq!(ids, vec![9, 19, 29, 39]);
            assert!(sim
                .completions(0)
                .iter()
                .all(|c| c.wc.result().unwrap().opcode() == WcOpcode::RdmaWrite));
            Ok(())
        },
    );
}

/// `IBV_EVENT_COMM_EST` when the first packet reaches a QP still in RTR;
/// `IBV_EVENT_SQ_DRAINED` after RTS → SQD with `en_sqd_async_notify` once nothing is in
/// flight; WRs posted in SQD wait until the QP returns to RTS.
#[test]
fn comm_est_in_rtr_and_sq_drained_in_sqd() {
    run_seeds("comm_est_in_rtr_and_sq_drained_in_sqd", &[5], |seed| {
        let mut sim = two_nodes(seed, FaultRules::perfect());
        let p = QpParams::default();
        let qa = create_qp(&mut sim, 0, QpType::Rc, &p, None)?;
        let qb = create_qp(&mut sim, 1, QpType::Rc, &p, None)?;
        bring_up(&mut sim, 0, qa, QpType::Rc, Some((1, qb)), &p, (10, 20))?;
        // B only to RTR.
        let gid = sim.nodes[0].gid;
        let ep = &mut sim.nodes[1].engine;
        let mut attr = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: p.access,
            ..QpAttr::default()
        };
        ep.modify_qp(
            qb,
            &attr,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
        )
        .unwrap();
        attr.qp_state = QpState::Rtr;
        attr.ah_attr.dgid = gid;
        attr.path_mtu = p.mtu;
        attr.dest_qp_num = qa;
        attr.rq_psn = 10;
        attr.max_dest_rd_atomic = 1;
        let rtr = AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER;
        ep.modify_qp(qb, &attr, rtr).unwrap();
        let a = sim.nodes[0].mem.register(8192, ALL_ACCESS);
        let b = sim.nodes[1].mem.register(8192, ALL_ACCESS);
        sim.post_recv(1, qb, recv(1, &b, 0, 64))?;
        sim.post_send(0, qa, SendWr::new(1, SendOp::Send, vec![sge(&a, 0, 8)]))?;
        sim.run_idle(STEPS)?;
        assert_eq!(sim.nodes[1].events, vec![AsyncEvent::CommEst { qpn: qb }]);
        assert_eq!(sim.completions(0).len(), 1, "an RTR responder ACKs");

        let sqd = QpAttr {
            qp_state: QpState::Sqd,
            en_sqd_async_notify: true,
            ..QpAttr::default()
        };
        sim.nodes[0]
            .engine
            .modify_qp(qa, &sqd, AttrMask::STATE | AttrMask::EN_SQD_ASYNC_NOTIFY)
            .unwrap();
        sim.post_recv(1, qb, recv(2, &b, 64, 64))?;
        sim.post_send(0, qa, SendWr::new(2, SendOp::Send, vec![sge(&a, 0, 8)]))?;
        sim.run_idle(STEPS)?;
        assert!(sim.nodes[0]
            .events
            .contains(&AsyncEvent::SqDrained { qpn: qa }));
        assert_eq!(sim.completions(0).len(), 1, "nothing new starts in SQD");
        let rts = QpAttr {
            qp_state: QpState::Rts,
            ..QpAttr::default()
        };
        sim.nodes[0]
            .engine
            .modify_qp(qa, &rts, AttrMask::STATE)
            .unwrap();
        sim.run_idle(STEPS)?;
        assert_eq!(sim.completions(0).len(), 2);
        Ok(())
    });
}
