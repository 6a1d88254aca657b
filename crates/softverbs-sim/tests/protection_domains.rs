//! Protection domains: an L_Key or R_Key is valid for a QP only if its memory region is in
//! the QP's protection domain (IBTA vol. 1 ch. 10, protection domains: a QP may access a
//! memory region only if the PD assigned to the QP matches the region's; the kernel's rxe
//! refuses such a key in its MR lookup, rdmavt in its key checks). A key of a
//! region in another PD is refused exactly like a key that does not exist, with the same
//! NAK and statuses as the bad-key scenarios of `completion_status.rs` (reference §2.6),
//! and nothing is touched. Each scenario also shows that the same request in the QP's own
//! PD works, so the refusal comes from the PD and from nothing else.
//!
//! Every QP here is in PD 1 (`QpParams::pd`); "another PD" is PD 2.

mod common;

use common::{assert_status, recv, sge, two_nodes, ALL_ACCESS};
use softverbs_cq::WcStatus;
use softverbs_proto::{
    AccessFlags, AddressVector, AsyncEvent, CqTarget, Memory, QpState, QpType, SendOp, SendWr,
    SrqInit, UdDest, VerbsError,
};
use softverbs_sim::{
    bring_up, connect, create_qp, run_seeds, FaultRules, Mr, QpParams, Sim, SimError, SimErrorKind,
};

const STEPS: u64 = 200_000;

/// The PD of every QP in these scenarios.
const QP_PD: u32 = 1;
/// Another PD of the same node.
const OTHER_PD: u32 = 2;

/// Marker bytes the target regions start with; a refused request leaves them as they are.
const MARK: [u8; 64] = [0xA5; 64];

fn params() -> QpParams {
    QpParams {
        pd: QP_PD,
        ..QpParams::default()
    }
}

/// Two connected RC QPs, both in [`QP_PD`].
fn rc_pair(seed: u64) -> Result<(Sim, u32, u32), SimError> {
    let mut sim = two_nodes(seed, FaultRules::perfect());
    let (qa, qb) = connect(&mut sim, 0, 1, QpType::Rc, &params())?;
    Ok((sim, qa, qb))
}

/// A region of `len` bytes in `pd` on `node`, filled with [`MARK`] at its start.
fn marked(sim: &mut Sim, node: usize, pd: u32, len: usize) -> Mr {
    let mr = sim.nodes[node].mem.register_in(pd, len, ALL_ACCESS);
    sim.nodes[node].mem.fill(mr.addr, &MARK);
    mr
}

/// The remote operations (write, read, both atomics), each naming `target` (8 bytes for the atomics).
fn remote_ops(target: &Mr) -> [(&'static str, SendOp, u32); 4] {
    [
        (
            "RDMA WRITE",
            SendOp::RdmaWrite {
                remote_addr: target.addr,
                rkey: target.rkey,
            },
            64,
        ),
        (
            "RDMA READ",
            SendOp::RdmaRead {
                remote_addr: target.addr,
                rkey: target.rkey,
            },
            64,
        ),
        (
            "FETCH_AND_ADD",
            SendOp::FetchAdd {
                remote_addr: target.addr,
                rkey: target.rkey,
                add: 1,
            },
            8,
        ),
        (
            "CMP_AND_SWP",
            SendOp::CompareSwap {
                remote_addr: target.addr,
                rkey: target.rkey,
                compare: u64::from_ne_bytes([0xA5; 8]),
                swap: 7,
            },
            8,
        ),
    ]
}

/// `IBV_WC_REM_ACCESS_ERR` for an RDMA WRITE, an RDMA READ and both atomics whose R_Key is
/// of a region in another PD of the responder: the responder NAKs "remote access error"
/// (vendor_err 0x62) as for a bad R_Key, raises `IBV_EVENT_QP_ACCESS_ERR` and goes to ERR;
/// the target bytes are unchanged and the requester's local buffer received nothing. The
/// same operations on a region of the QPs' own PD succeed.
#[test]
fn rem_access_err_for_write_read_and_atomics_to_rkey_of_another_pd() {
    run_seeds(
        "rem_access_err_for_write_read_and_atomics_to_rkey_of_another_pd",
        &[21],
        |seed| {
            for op in 0..4 {
                // Another PD: refused.
                let (mut sim, qa, qb) = rc_pair(seed)?;
                let local = sim.nodes[0].mem.register_in(QP_PD, 4096, ALL_ACCESS);
                sim.nodes[0].mem.fill(local.addr, &[0x11; 64]);
                let foreign = marked(&mut sim, 1, OTHER_PD, 4096);
                let (name, wr_op, len) = remote_ops(&foreign)[op];
                sim.post_send(0, qa, SendWr::new(1, wr_op, vec![sge(&local, 0, len)]))?;
                sim.run_idle(STEPS)?;
                let s = sim.completions(0);
                assert_eq!(s.len(), 1, "{name}: {s:?}");
                assert_status(&s[0], WcStatus::RemAccessErr);
                assert_eq!((s[0].wc.wr_id(), s[0].wc.qp_num()), (1, qa), "{name}");
                assert_eq!(
                    s[0].wc.vendor_err(),
                    0x62,
                    "{name}: NAK remote access error"
                );
                assert_eq!(
                    sim.nodes[1].mem.bytes(foreign.addr, 64),
                    &MARK,
                    "{name}: the target of another PD is untouched"
                );
                assert_eq!(
                    sim.nodes[0].mem.bytes(local.addr, 64),
                    &[0x11; 64],
                    "{name}: nothing came back into the local buffer"
                );
                assert!(
                    sim.nodes[1]
                        .events
                        .contains(&AsyncEvent::QpAccessError { qpn: qb }),
                    "{name}: responder raises QP_ACCESS_ERR"
                );
                assert_eq!(
                    sim.nodes[1].engine.qp_state(qb),
                    Some(QpState::Err),
                    "{name}"
                );
                assert!(sim.completions(1).is_empty(), "{name}: no receive consumed");

                // The QPs' own PD: the same operation works.
                let (mut sim, qa, _qb) = rc_pair(seed)?;
                let local = sim.nodes[0].mem.register_in(QP_PD, 4096, ALL_ACCESS);
                sim.nodes[0].mem.fill(local.addr, &[0x11; 64]);
                let own = marked(&mut sim, 1, QP_PD, 4096);
                let (name, wr_op, len) = remote_ops(&own)[op];
                sim.post_send(0, qa, SendWr::new(2, wr_op, vec![sge(&local, 0, len)]))?;
                sim.run_idle(STEPS)?;
                let s = sim.completions(0);
                assert!(
                    s[0].wc.result().is_ok(),
                    "{name} in the own PD: {:?}",
                    s[0].wc
                );
                let changed = if name == "RDMA READ" {
                    sim.nodes[0].mem.bytes(local.addr, 64) == MARK
                } else {
                    sim.nodes[1].mem.bytes(own.addr, 64) != MARK
                };
                assert!(changed, "{name} in the own PD moved data");
            }
            Ok(())
        },
    );
}

/// `IBV_WC_LOC_PROT_ERR` on the requester for a SEND whose SGE names the L_Key of a valid
/// region in another PD, as for a bad L_Key (reference §2.6 "local SGE/lkey fault"): the
/// WR fails even when unsignaled, nothing is sent (the peer's receive stays posted and
/// its buffer untouched), the QP goes to ERR. An RDMA READ and an atomic whose local
/// buffer is of another PD fail the same way before anything is sent, so the remote word
/// is not modified. With the L_Key of the own PD the SEND is delivered.
#[test]
fn loc_prot_err_for_local_sge_of_another_pd() {
    run_seeds("loc_prot_err_for_local_sge_of_another_pd", &[22], |seed| {
        let p = QpParams {
            sq_sig_all: false,
            ..params()
        };
        let mut sim = two_nodes(seed, FaultRules::perfect());
        let (qa, qb) = connect(&mut sim, 0, 1, QpType::Rc, &p)?;
        let foreign = sim.nodes[0].mem.register_in(OTHER_PD, 4096, ALL_ACCESS);
        sim.nodes[0].mem.fill(foreign.addr, &[3; 16]);
        let b = marked(&mut sim, 1, QP_PD, 4096);
        sim.post_recv(1, qb, recv(9, &b, 0, 4096))?;
        sim.post_send(
            0,
            qa,
            SendWr::new(1, SendOp::Send, vec![sge(&foreign, 0, 16)]),
        )?;
        sim.run_idle(STEPS)?;
        let s = sim.completions(0);
        assert_eq!(s.len(), 1);
        assert_status(&s[0], WcStatus::LocProtErr);
        assert_eq!((s[0].wc.wr_id(), s[0].wc.qp_num()), (1, qa));
        assert!(sim.completions(1).is_empty(), "nothing reached the peer");
        assert_eq!(sim.nodes[1].mem.bytes(b.addr, 64), &MARK);
        assert_eq!(sim.nodes[0].engine.qp_state(qa), Some(QpState::Err));
        assert_eq!(sim.nodes[0].engine.counters().packets_sent, 0);

        // RDMA READ and FETCH_AND_ADD into a local buffer of another PD.
        for op in [
            SendOp::RdmaRead {
                remote_addr: b.addr,
                rkey: b.rkey,
            },
            SendOp::FetchAdd {
                remote_addr: b.addr,
                rkey: b.rkey,
                add: 1,
            },
        ] {
            let (mut sim, qa, _qb) = rc_pair(seed)?;
            let foreign = sim.nodes[0].mem.register_in(OTHER_PD, 4096, ALL_ACCESS);
            let b = marked(&mut sim, 1, QP_PD, 4096);
            sim.post_send(0, qa, SendWr::new(2, op, vec![sge(&foreign, 0, 8)]))?;
            sim.run_idle(STEPS)?;
            let s = sim.completions(0);
            assert_status(&s[0], WcStatus::LocProtErr);
            assert_eq!(sim.nodes[0].mem.bytes(foreign.addr, 8), &[0; 8]);
            assert_eq!(sim.nodes[1].mem.bytes(b.addr, 64), &MARK, "{op:?}");
            assert_eq!(sim.nodes[0].engine.counters().packets_sent, 0, "{op:?}");
        }

        // The own PD's L_Key: delivered.
        let (mut sim, qa, qb) = rc_pair(seed)?;
        let own = sim.nodes[0].mem.register_in(QP_PD, 4096, ALL_ACCESS);
        sim.nodes[0].mem.fill(own.addr, &[3; 16]);
        let b = sim.nodes[1].mem.register_in(QP_PD, 4096, ALL_ACCESS);
        sim.post_recv(1, qb, recv(9, &b, 0, 4096))?;
        sim.post_send(0, qa, SendWr::new(1, SendOp::Send, vec![sge(&own, 0, 16)]))?;
        sim.run_idle(STEPS)?;
        assert!(sim.completions(0)[0].wc.result().is_ok());
        assert_eq!(sim.completions(1)[0].wc.result().unwrap().byte_len(), 16);
        assert_eq!(sim.nodes[1].mem.bytes(b.addr, 16), &[3; 16]);
        Ok(())
    });
}

/// A receive WQE whose L_Key is of a region in another PD ends as one with a bad L_Key
/// (reference §2.6 "responder local fault"): the responder cannot place the SEND, NAKs
/// "remote operational error" (requester `REM_OP_ERR`, vendor_err 0x63), completes the
/// WQE with `LOC_PROT_ERR`, and the buffer is untouched. The same holds for a WQE taken
/// from an SRQ: its L_Keys are checked against the QP's PD (rxe's behaviour), so a WQE
/// of the QP's PD is placed and one of another PD is refused.
#[test]
fn receive_wqe_with_lkey_of_another_pd_fails_like_a_bad_lkey() {
    run_seeds(
        "receive_wqe_with_lkey_of_another_pd_fails_like_a_bad_lkey",
        &[23],
        |seed| {
            let (mut sim, qa, qb) = rc_pair(seed)?;
            let a = sim.nodes[0].mem.register_in(QP_PD, 4096, ALL_ACCESS);
            sim.nodes[0].mem.fill(a.addr, &[4; 32]);
            let foreign = marked(&mut sim, 1, OTHER_PD, 4096);
            sim.post_recv(1, qb, recv(9, &foreign, 0, 4096))?;
            sim.post_send(0, qa, SendWr::new(1, SendOp::Send, vec![sge(&a, 0, 32)]))?;
            sim.run_idle(STEPS)?;
            let s = sim.completions(0);
            assert_status(&s[0], WcStatus::RemOpErr);
            assert_eq!(s[0].wc.vendor_err(), 0x63);
            let r = sim.completions(1);
            assert_status(&r[0], WcStatus::LocProtErr);
            assert_eq!(
                (r[0].wc.wr_id(), r[0].wc.qp_num(), r[0].cq),
                (9, qb, CqTarget::Recv)
            );
            assert_eq!(sim.nodes[1].mem.bytes(foreign.addr, 64), &MARK);
            assert!(sim.nodes[1]
                .events
                .contains(&AsyncEvent::QpFatal { qpn: qb }));

            // SRQ: WQEs of the QP's PD, then of another PD.
            let mut sim = two_nodes(seed, FaultRules::perfect());
            let p = params();
            let srq = sim.nodes[1]
                .engine
                .create_srq(SrqInit {
                    max_wr: 4,
                    max_sge: 1,
                    srq_limit: 0,
                })
                .unwrap();
            let qa = create_qp(&mut sim, 0, QpType::Rc, &p, None)?;
            let qb = create_qp(&mut sim, 1, QpType::Rc, &p, Some(srq))?;
            bring_up(&mut sim, 0, qa, QpType::Rc, Some((1, qb)), &p, (1, 2))?;
            bring_up(&mut sim, 1, qb, QpType::Rc, Some((0, qa)), &p, (2, 1))?;
            let a = sim.nodes[0].mem.register_in(QP_PD, 4096, ALL_ACCESS);
            sim.nodes[0].mem.fill(a.addr, &[4; 32]);
            let own = marked(&mut sim, 1, QP_PD, 4096);
            let foreign = marked(&mut sim, 1, OTHER_PD, 4096);
            sim.post_srq_recv(1, srq, recv(10, &own, 0, 4096))?;
            sim.post_srq_recv(1, srq, recv(11, &foreign, 0, 4096))?;
            for i in 0..2 {
                sim.post_send(0, qa, SendWr::new(i, SendOp::Send, vec![sge(&a, 0, 32)]))?;
            }
            sim.run_idle(STEPS)?;
            let r = sim.completions(1);
            assert_eq!(r[0].wc.result().unwrap().wr_id(), 10);
            assert_eq!(sim.nodes[1].mem.bytes(own.addr, 32), &[4; 32]);
            assert_status(&r[1], WcStatus::LocProtErr);
            assert_eq!(r[1].wc.wr_id(), 11);
            assert_eq!(sim.nodes[1].mem.bytes(foreign.addr, 64), &MARK);
            let s = sim.completions(0);
            assert!(s[0].wc.result().is_ok());
            assert_status(&s[1], WcStatus::RemOpErr);
            Ok(())
        },
    );
}

/// A SEND WITH INVALIDATE naming the R_Key of a region in another PD of the responder is
/// refused as an unknown key is (NAK invalid request: requester `REM_INV_REQ_ERR`), and
/// that region keeps its R_Key: a peer can invalidate only keys of its QP's PD (rdmavt's
/// `rvt_invalidate_rkey` checks the PD; rxe does not). A key of the own PD is invalidated.
#[test]
fn send_with_invalidate_of_rkey_in_another_pd_is_refused() {
    run_seeds(
        "send_with_invalidate_of_rkey_in_another_pd_is_refused",
        &[24],
        |seed| {
            let (mut sim, qa, qb) = rc_pair(seed)?;
            let a = sim.nodes[0].mem.register_in(QP_PD, 4096, ALL_ACCESS);
            let b = sim.nodes[1].mem.register_in(QP_PD, 4096, ALL_ACCESS);
            let foreign = sim.nodes[1].mem.register_in(OTHER_PD, 64, ALL_ACCESS);
            let own = sim.nodes[1].mem.register_in(QP_PD, 64, ALL_ACCESS);
            sim.post_recv(1, qb, recv(9, &b, 0, 4096))?;
            sim.post_recv(1, qb, recv(10, &b, 0, 4096))?;
            let inv = |wr_id, rkey| {
                SendWr::new(
                    wr_id,
                    SendOp::SendWithInv {
                        invalidate_rkey: rkey,
                    },
                    vec![sge(&a, 0, 4)],
                )
            };
            sim.post_send(0, qa, inv(1, own.rkey))?;
            sim.run_idle(STEPS)?;
            assert!(sim.completions(0)[0].wc.result().is_ok());
            let r = sim.completions(1);
            assert_eq!(r[0].wc.result().unwrap().invalidated_rkey(), Some(own.rkey));
            let dead = sim.nodes[1].mem.check_remote(
                QP_PD,
                own.rkey,
                own.addr,
                8,
                AccessFlags::REMOTE_WRITE,
            );
            assert!(dead.is_err(), "the own PD's key is invalidated");

            sim.post_send(0, qa, inv(2, foreign.rkey))?;
            sim.run_idle(STEPS)?;
            let s = sim.completions(0);
            assert_status(&s[1], WcStatus::RemInvReqErr);
            assert_eq!(s[1].wc.wr_id(), 2);
            assert_status(&sim.completions(1)[1], WcStatus::RemInvReqErr);
            assert_eq!(
                sim.nodes[1].mem.check_remote(
                    OTHER_PD,
                    foreign.rkey,
                    foreign.addr,
                    8,
                    AccessFlags::REMOTE_WRITE
                ),
                Ok(()),
                "the other PD's key still works in its own PD"
            );
            Ok(())
        },
    );
}

/// UC: an RDMA WRITE whose R_Key is of another PD is dropped as a bad R_Key is (reference
/// §2.3 step 6: "UC → drop"); the target is untouched, the sender completes on
/// transmission, and the next write to the own PD lands.
#[test]
fn uc_write_to_rkey_of_another_pd_is_dropped() {
    run_seeds("uc_write_to_rkey_of_another_pd_is_dropped", &[25], |seed| {
        let mut sim = two_nodes(seed, FaultRules::perfect());
        let (qa, _qb) = connect(&mut sim, 0, 1, QpType::Uc, &params())?;
        let a = sim.nodes[0].mem.register_in(QP_PD, 4096, ALL_ACCESS);
        sim.nodes[0].mem.fill(a.addr, &[6; 64]);
        let foreign = marked(&mut sim, 1, OTHER_PD, 4096);
        let own = marked(&mut sim, 1, QP_PD, 4096);
        for (wr_id, target) in [(1, &foreign), (2, &own)] {
            let op = SendOp::RdmaWrite {
                remote_addr: target.addr,
                rkey: target.rkey,
            };
            sim.post_send(0, qa, SendWr::new(wr_id, op, vec![sge(&a, 0, 64)]))?;
        }
        sim.run_idle(STEPS)?;
        assert_eq!(sim.nodes[1].mem.bytes(foreign.addr, 64), &MARK);
        assert_eq!(sim.nodes[1].mem.bytes(own.addr, 64), &[6; 64]);
        assert!(sim.completions(0).iter().all(|c| c.wc.result().is_ok()));
        Ok(())
    });
}

/// A QP's PD comes from its creation parameters and `ibv_query_qp` reports it back with
/// them; regions registered without a PD are in PD 0, the default of `QpInit::new`, so
/// every scenario that never names a PD keeps working.
#[test]
fn qp_pd_is_reported_and_pd_zero_is_the_default() {
    let mut sim = two_nodes(1, FaultRules::perfect());
    let qa = create_qp(&mut sim, 0, QpType::Rc, &params(), None).unwrap();
    let qd = create_qp(&mut sim, 0, QpType::Rc, &QpParams::default(), None).unwrap();
    assert_eq!(sim.nodes[0].engine.query_qp(qa).unwrap().1.pd, QP_PD);
    assert_eq!(sim.nodes[0].engine.query_qp(qd).unwrap().1.pd, 0);
    assert_eq!(sim.nodes[0].mem.register(64, ALL_ACCESS).pd, 0);
}

/// A UD send names its destination by an address handle, and an address handle belongs to
/// a protection domain: a UD QP uses only those of its own PD (IBTA 10.2.3; rdmavt checks
/// it in its post_send, EINVAL). The post is refused at once (the `EINVAL` of
/// `ibv_post_send(3)`), nothing is sent and no completion appears on either side; the
/// same send with an address handle of the QP's PD is delivered.
#[test]
fn ud_send_with_address_handle_of_another_pd_is_refused_at_post() {
    run_seeds(
        "ud_send_with_address_handle_of_another_pd_is_refused_at_post",
        &[1, 2],
        |seed| {
            let mut sim = two_nodes(seed, FaultRules::perfect());
            let p = params();
            let qa = create_qp(&mut sim, 0, QpType::Ud, &p, None)?;
            let qb = create_qp(&mut sim, 1, QpType::Ud, &p, None)?;
            bring_up(&mut sim, 0, qa, QpType::Ud, None, &p, (100, 0))?;
            bring_up(&mut sim, 1, qb, QpType::Ud, None, &p, (200, 0))?;
            let a = sim.nodes[0].mem.register_in(QP_PD, 4096, ALL_ACCESS);
            let b = sim.nodes[1].mem.register_in(QP_PD, 4096, ALL_ACCESS);
            let dest = |pd| UdDest {
                av: AddressVector {
                    dgid: sim.nodes[1].gid,
                    ..Default::default()
                },
                remote_qpn: qb,
                remote_qkey: p.qkey,
                pd,
            };
            let (theirs, ours) = (dest(OTHER_PD), dest(QP_PD));
            sim.post_recv(1, qb, recv(1, &b, 0, 1024))?;
            let refused = sim.post_send(
                0,
                qa,
                SendWr::new(10, SendOp::Send, vec![sge(&a, 0, 9)]).with_ud(theirs),
            );
            assert!(
                matches!(
                    refused,
                    Err(SimError {
                        kind: SimErrorKind::Verb(VerbsError::AddressHandleOfAnotherPd),
                        ..
                    })
                ),
                "{refused:?}"
            );
            sim.run_idle(STEPS)?;
            assert!(
                sim.completions(0).is_empty(),
                "a refused post completes nothing"
            );
            assert!(
                sim.completions(1).is_empty(),
                "a refused post sends nothing"
            );
            sim.post_send(
                0,
                qa,
                SendWr::new(11, SendOp::Send, vec![sge(&a, 0, 9)]).with_ud(ours),
            )?;
            sim.run_idle(STEPS)?;
            let sent = sim.completions(0);
            assert_eq!(sent.len(), 1);
            assert_eq!(sent[0].wc.wr_id(), 11);
            assert_status(&sent[0], WcStatus::Success);
            let got = sim.completions(1);
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].wc.wr_id(), 1);
            assert_status(&got[0], WcStatus::Success);
            Ok(())
        },
    );
}
