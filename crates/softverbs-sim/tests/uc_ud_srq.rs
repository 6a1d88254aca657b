//! UC (no ACKs; a message that loses a packet is dropped, never retried), UD (DETH, Q_Key
//! check, the 40-byte GRH area, `src_qp`, `IBV_WC_GRH`) and SRQ (shared consumption, the
//! limit event, `LAST_WQE_REACHED`). Reference §2.8, §3.4, §2.7; ibv_post_recv(3),
//! ibv_modify_srq(3).

mod common;

use common::{recv, sge, two_nodes, Op, Traffic, ALL_ACCESS};
use softverbs_cq::{WcFlags, WcOpcode, WcStatus};
use softverbs_proto::{
    AddressVector, AsyncEvent, AttrMask, CqTarget, DropReason, QpAttr, QpState, QpType, SendOp,
    SendWr, SrqId, SrqInit, UdDest,
};
use softverbs_sim::{bring_up, connect, create_qp, run_seeds, FaultRules, QpParams, Sim};

const STEPS: u64 = 2_000_000;

/// UC without loss: every send and write (with and without immediate) arrives once, in
/// order, intact; send completions come on transmission.
#[test]
fn uc_no_loss_delivers_every_message() {
    run_seeds("uc_no_loss_delivers_every_message", &[1, 2], |seed| {
        let mut sim = two_nodes(seed, FaultRules::perfect());
        let t = Traffic::start(&mut sim, QpType::Uc, &Op::UC, 200, &QpParams::default())?;
        t.run(&mut sim, STEPS)?;
        t.verify_rc(&sim);
        assert_eq!(
            sim.nodes[1].engine.counters().acks_sent,
            0,
            "UC never acknowledges"
        );
        Ok(())
    });
}

/// UC under 10 % loss (and corruption): the sender completes everything successfully
/// without a single retransmission; the receiver gets a subset of the messages, each
/// intact, in order, never twice; receive WQEs of broken messages are reused, not consumed.
///
/// No duplication or reordering here: IBTA vol. 1 §9.8 gives UC no duplicate detection —
/// a FIRST or ONLY packet starts a new message whatever its PSN, which is how UC recovers
/// from loss — so over a fabric that duplicated or reordered packets a message could
/// arrive twice or late (as on rxe). A path of the fabric does neither.
#[test]
fn uc_loss_drops_messages_without_retry() {
    run_seeds("uc_loss_drops_messages_without_retry", &[3, 4], |seed| {
        let rules = FaultRules {
            duplicate: 0.0,
            reorder: 0.0,
            ..FaultRules::lossy(0.10)
        };
        let mut sim = two_nodes(seed, rules);
        let p = QpParams::default();
        let (qa, qb) = connect(&mut sim, 0, 1, QpType::Uc, &p)?;
        let n = 150usize;
        let slot = 4096u64;
        let a = sim.nodes[0].mem.register(n * slot as usize, ALL_ACCESS);
        let b = sim.nodes[1].mem.register(n * slot as usize, ALL_ACCESS);
        let tgt = sim.nodes[1].mem.register(n * slot as usize, ALL_ACCESS);
        let lens = [0u32, 5, 1024, 1500, 3000];
        for i in 0..n {
            let len = lens[i % lens.len()];
            sim.nodes[0].mem.fill(
                a.addr + i as u64 * slot,
                &common::pattern(seed, i, len as usize),
            );
            sim.post_recv(1, qb, recv(i as u64, &b, i as u64 * slot, slot as u32))?;
        }
        for i in 0..n {
            let len = lens[i % lens.len()];
            let op = if i.is_multiple_of(2) {
                SendOp::SendWithImm { imm: i as u32 }
            } else {
                SendOp::RdmaWriteWithImm {
                    remote_addr: tgt.addr + i as u64 * slot,
                    rkey: tgt.rkey,
                    imm: i as u32,
                }
            };
            sim.post_send(
                0,
                qa,
                SendWr::new(i as u64, op, vec![sge(&a, i as u64 * slot, len)]),
            )?;
        }
        sim.run_idle(STEPS)?;
        let sends = sim.completions(0);
        assert_eq!(sends.len(), n);
        assert!(sends.iter().all(|c| c.wc.result().is_ok()));
        assert_eq!(sim.nodes[0].engine.counters().retransmitted_packets, 0);
        let mut last = None;
        let recvs = sim.completions(1);
        assert!(recvs.len() < n, "some messages were lost");
        assert!(!recvs.is_empty());
        for c in recvs {
            let done = c.wc.result().unwrap();
            let k = done.imm_data().unwrap() as usize;
            assert!(last.is_none_or(|l| k > l), "in order, never twice");
            last = Some(k);
            let len = lens[k % lens.len()] as usize;
            assert_eq!(done.byte_len() as usize, len);
            let want = common::pattern(seed, k, len);
            if k.is_multiple_of(2) {
                assert_eq!(done.opcode(), WcOpcode::Recv);
                let at = b.addr + done.wr_id() * slot;
                assert_eq!(sim.nodes[1].mem.bytes(at, len), &want[..], "send {k} data");
            } else {
                assert_eq!(done.opcode(), WcOpcode::RecvRdmaWithImm);
                assert_eq!(
                    sim.nodes[1].mem.bytes(tgt.addr + k as u64 * slot, len),
                    &want[..]
                );
            }
        }
        Ok(())
    });
}

/// UD: DETH carries the Q_Key and source QP; the receive buffer starts with the 40-byte GRH
/// area (20 zero bytes, then the IPv4 header), `byte_len` counts it, `IBV_WC_GRH` and
/// `src_qp` are set; a wrong Q_Key and a missing receive WQE are drops, not errors; a WR
/// Q_Key with the top bit set means "use my QP's Q_Key" (IBTA C10-15).
#[test]
fn ud_grh_area_qkey_check_and_src_qp() {
    run_seeds("ud_grh_area_qkey_check_and_src_qp", &[5], |seed| {
        let mut sim = two_nodes(seed, FaultRules::perfect());
        let p = QpParams::default();
        let qa = create_qp(&mut sim, 0, QpType::Ud, &p, None)?;
        let qb = create_qp(&mut sim, 1, QpType::Ud, &p, None)?;
        bring_up(&mut sim, 0, qa, QpType::Ud, None, &p, (100, 0))?;
        bring_up(&mut sim, 1, qb, QpType::Ud, None, &p, (200, 0))?;
        let a = sim.nodes[0].mem.register(8192, ALL_ACCESS);
        let b = sim.nodes[1].mem.register(8192, ALL_ACCESS);
        sim.nodes[0].mem.fill(a.addr, b"hello, ud");
        let dest = |qkey| UdDest {
            av: AddressVector {
                dgid: sim.nodes[1].gid,
                ..Default::default()
            },
            remote_qpn: qb,
            remote_qkey: qkey,
            pd: p.pd,
        };
        let d_ok = dest(p.qkey);
        let d_own = dest(0x8000_0000);
        let d_bad = dest(0x2222);
        sim.post_recv(1, qb, recv(1, &b, 0, 1024))?;
        sim.post_recv(1, qb, recv(2, &b, 1024, 1024))?;
        sim.post_send(
            0,
            qa,
            SendWr::new(10, SendOp::Send, vec![sge(&a, 0, 9)]).with_ud(d_ok),
        )?;
        sim.post_send(
            0,
            qa,
            SendWr::new(11, SendOp::Send, vec![sge(&a, 0, 9)]).with_ud(d_bad),
        )?;
        sim.post_send(
            0,
            qa,
            SendWr::new(12, SendOp::SendWithImm { imm: 77 }, vec![sge(&a, 0, 5)]).with_ud(d_own),
        )?;
        sim.post_send(
            0,
            qa,
            SendWr::new(13, SendOp::Send, vec![sge(&a, 0, 1)]).with_ud(d_ok),
        )?;
        sim.run_idle(STEPS)?;
        assert_eq!(
            sim.completions(0).len(),
            4,
            "UD sends complete on transmission"
        );
        let r = sim.completions(1);
        assert_eq!(r.len(), 2);
        let first = r[0].wc.result().unwrap();
        assert_eq!(
            (first.wr_id(), first.byte_len(), first.src_qp()),
            (1, 40 + 9, qa)
        );
        assert!(first.flags().contains(WcFlags::GRH));
        let grh = sim.nodes[1].mem.bytes(b.addr, 40);
        assert_eq!(&grh[..20], &[0u8; 20]);
        assert_eq!(grh[20] >> 4, 4, "IPv4 header at offset 20");
        assert_eq!(&grh[32..36], &[10, 0, 0, 1], "source address");
        assert_eq!(sim.nodes[1].mem.bytes(b.addr + 40, 9), b"hello, ud");
        let second = r[1].wc.result().unwrap();
        assert_eq!(
            (second.wr_id(), second.byte_len(), second.imm_data()),
            (2, 45, Some(77))
        );
        let c = sim.nodes[1].engine.counters();
        assert_eq!(c.drops(DropReason::QkeyMismatch), 1);
        assert_eq!(c.drops(DropReason::NoReceive), 1);
        Ok(())
    });
}

/// An SRQ of `max_wr` single-SGE entries on node 1, limit disarmed.
fn srq_on_node_1(sim: &mut Sim, max_wr: u32) -> SrqId {
    sim.nodes[1]
        .engine
        .create_srq(SrqInit {
            max_wr,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap()
}

/// A UD QP may take its receives from an SRQ (`ibv_create_qp(3)`: `srq` for any QP type
/// but XRC initiators; IBTA 10.2.9.2; rxe and rdmavt attach SRQs to UD QPs): each datagram
/// consumes the SRQ's next entry, with its GRH area, and a datagram finding the SRQ empty
/// is dropped, not an error.
#[test]
fn a_ud_qp_attached_to_an_srq_takes_its_receives_from_it() {
    run_seeds(
        "a_ud_qp_attached_to_an_srq_takes_its_receives_from_it",
        &[7],
        |seed| {
            let mut sim = two_nodes(seed, FaultRules::perfect());
            let p = QpParams::default();
            let srq = srq_on_node_1(&mut sim, 4);
            let qa = create_qp(&mut sim, 0, QpType::Ud, &p, None)?;
            let qb = create_qp(&mut sim, 1, QpType::Ud, &p, Some(srq))?;
            bring_up(&mut sim, 0, qa, QpType::Ud, None, &p, (100, 0))?;
            bring_up(&mut sim, 1, qb, QpType::Ud, None, &p, (200, 0))?;
            let a = sim.nodes[0].mem.register(4096, ALL_ACCESS);
            let b = sim.nodes[1].mem.register(8192, ALL_ACCESS);
            sim.nodes[0].mem.fill(a.addr, b"datagrams");
            let dest = UdDest {
                av: AddressVector {
                    dgid: sim.nodes[1].gid,
                    ..Default::default()
                },
                remote_qpn: qb,
                remote_qkey: p.qkey,
                pd: p.pd,
            };
            sim.post_srq_recv(1, srq, recv(1, &b, 0, 1024))?;
            sim.post_srq_recv(1, srq, recv(2, &b, 1024, 1024))?;
            for (wr_id, len) in [(10, 4), (11, 9), (12, 1)] {
                sim.post_send(
                    0,
                    qa,
                    SendWr::new(wr_id, SendOp::Send, vec![sge(&a, 0, len)]).with_ud(dest),
                )?;
            }
            sim.run_idle(STEPS)?;
            let r = sim.completions(1);
            let got: Vec<(u64, u32, u32)> = r
                .iter()
                .map(|c| {
                    let wc = c.wc.result().unwrap();
                    (wc.wr_id(), wc.byte_len(), wc.qp_num())
                })
                .collect();
            assert_eq!(
                got,
                [(1, 40 + 4, qb), (2, 40 + 9, qb)],
                "SRQ entries in order"
            );
            assert_eq!(sim.nodes[1].mem.bytes(b.addr + 1024 + 40, 9), b"datagrams");
            assert_eq!(
                sim.nodes[1].engine.counters().drops(DropReason::NoReceive),
                1
            );
            Ok(())
        },
    );
}

/// SRQ: two RC QPs consume one shared receive queue in arrival order; the limit event
/// fires once when the queue falls below the armed limit; a QP moved to ERR raises
/// `LAST_WQE_REACHED` and does not flush the SRQ's entries, which the other QP still uses.
#[test]
fn srq_shared_by_two_qps_with_limit_and_last_wqe_events() {
    run_seeds(
        "srq_shared_by_two_qps_with_limit_and_last_wqe_events",
        &[6],
        |seed| {
            let mut sim = two_nodes(seed, FaultRules::perfect());
            let p = QpParams::default();
            let srq = srq_on_node_1(&mut sim, 16);
            let mut pairs = Vec::new();
            for _ in 0..2 {
                let qa = create_qp(&mut sim, 0, QpType::Rc, &p, None)?;
                let qb = create_qp(&mut sim, 1, QpType::Rc, &p, Some(srq))?;
                bring_up(&mut sim, 0, qa, QpType::Rc, Some((1, qb)), &p, (1, 2))?;
                bring_up(&mut sim, 1, qb, QpType::Rc, Some((0, qa)), &p, (2, 1))?;
                pairs.push((qa, qb));
            }
            let a = sim.nodes[0].mem.register(4096, ALL_ACCESS);
            let b = sim.nodes[1].mem.register(65536, ALL_ACCESS);
            for i in 0..8u64 {
                sim.post_srq_recv(1, srq, recv(100 + i, &b, i * 1024, 1024))?;
            }
            sim.nodes[1].engine.arm_srq_limit(srq, 5).unwrap();
            assert!(
                sim.nodes[1]
                    .engine
                    .post_recv(pairs[0].1, recv(1, &b, 0, 8))
                    .is_err(),
                "QP with SRQ refuses post_recv"
            );
            for i in 0..4u64 {
                let (qa, _) = pairs[(i % 2) as usize];
                sim.post_send(0, qa, SendWr::new(i, SendOp::Send, vec![sge(&a, 0, 16)]))?;
                sim.run_idle(STEPS)?;
            }
            let r: Vec<_> = sim.completions(1).to_vec();
            assert_eq!(r.len(), 4);
            let ids: Vec<u64> = r.iter().map(|c| c.wc.wr_id()).collect();
            assert_eq!(
                ids,
                vec![100, 101, 102, 103],
                "consumed in SRQ order across QPs"
            );
            assert_eq!(r[0].wc.qp_num(), pairs[0].1);
            assert_eq!(r[1].wc.qp_num(), pairs[1].1);
            let limit_events = sim.nodes[1]
                .events
                .iter()
                .filter(|e| matches!(e, AsyncEvent::SrqLimitReached { .. }))
                .count();
            assert_eq!(limit_events, 1, "limit event once, then disarmed");
            assert_eq!(sim.nodes[1].engine.query_srq(srq).unwrap().2, 0);
            // QP 0 of B to ERR: LAST_WQE_REACHED, SRQ entries stay for QP 1.
            let err = QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            };
            sim.nodes[1]
                .engine
                .modify_qp(pairs[0].1, &err, AttrMask::STATE)
                .unwrap();
            sim.run_idle(STEPS)?;
            assert!(sim.nodes[1]
                .events
                .contains(&AsyncEvent::QpLastWqeReached { qpn: pairs[0].1 }));
            assert!(sim.nodes[1]
                .completions
                .iter()
                .all(|c| c.wc.status() == WcStatus::Success));
            sim.post_send(
                0,
                pairs[1].0,
                SendWr::new(9, SendOp::Send, vec![sge(&a, 0, 16)]),
            )?;
            sim.run_idle(STEPS)?;
            let last = sim.nodes[1].completions.last().unwrap();
            assert_eq!((last.wc.wr_id(), last.cq), (104, CqTarget::Recv));
            assert!(sim.nodes[1].engine.destroy_srq(srq).is_err(), "SRQ in use");
            Ok(())
        },
    );
}
