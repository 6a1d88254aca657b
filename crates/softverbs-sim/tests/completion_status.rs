//! One scenario per completion status a peer or a bad request can cause, each from the
//! real condition, checking the fields `ibv_poll_cq(3)` makes valid ("If status is other
//! than IBV_WC_SUCCESS, only the following attributes are valid: wr_id, status, qp_num, and
//! vendor_err"). Statuses and their mapping: reference §2.6; flush: §2.7; completion
//! fields: §3.
//!
//! Not reachable in this engine: `REM_ABORT_ERR` (IBTA reserves it for a responder that
//! aborts an operation, e.g. XRC/SRQ aborts; nothing here aborts), `MW_BIND_ERR` (no memory
//! windows), and the RD / EEC statuses (no RD transport).

mod common;

use common::{assert_status, recv, sge, two_nodes, ALL_ACCESS};
use softverbs_cq::{WcFlags, WcOpcode, WcStatus};
use softverbs_proto::{
    AccessFlags, AsyncEvent, AttrMask, CqTarget, QpAttr, QpState, QpType, SendOp, SendWr,
};
use softverbs_sim::{connect, run_seeds, FaultRules, QpParams, Sim, SimError};

const STEPS: u64 = 200_000;

fn rc_pair(seed: u64, p: &QpParams) -> Result<(Sim, u32, u32), SimError> {
    let mut sim = two_nodes(seed, FaultRules::perfect());
    let (qa, qb) = connect(&mut sim, 0, 1, QpType::Rc, p)?;
    Ok((sim, qa, qb))
}

/// Checks a flushed completion: `WR_FLUSH_ERR`, its wr_id, the QP.
fn assert_flushed(c: &softverbs_proto::Completion, wr_id: u64, qpn: u32) {
    assert_eq!(c.wc.status(), WcStatus::WrFlushErr, "{:?}", c.wc);
    assert_eq!(c.wc.wr_id(), wr_id);
    assert_eq!(c.wc.qp_num(), qpn);
}

/// `IBV_WC_SUCCESS` with every field reference §3 defines: opcode per side, byte_len,
/// `WITH_IMM` with the immediate in network order (read back as posted), `WITH_INV` with
/// the invalidated R_Key (which then no longer works), no GRH flag on RC.
#[test]
fn success_fields_for_send_with_imm_and_with_invalidate() {
    run_seeds(
        "success_fields_for_send_with_imm_and_with_invalidate",
        &[1],
        |seed| {
            let (mut sim, qa, qb) = rc_pair(seed, &QpParams::default())?;
            let a = sim.nodes[0].mem.register(8192, ALL_ACCESS);
            let b = sim.nodes[1].mem.register(8192, ALL_ACCESS);
            let victim = sim.nodes[1].mem.register(64, ALL_ACCESS);
            sim.nodes[0].mem.fill(a.addr, b"0123456789");
            sim.post_recv(1, qb, recv(100, &b, 0, 4096))?;
            sim.post_recv(1, qb, recv(101, &b, 4096, 4096))?;
            sim.post_send(
                0,
                qa,
                SendWr::new(
                    1,
                    SendOp::SendWithImm { imm: 0xDEAD_BEEF },
                    vec![sge(&a, 0, 10)],
                ),
            )?;
            sim.post_send(
                0,
                qa,
                SendWr::new(
                    2,
                    SendOp::SendWithInv {
                        invalidate_rkey: victim.rkey,
                    },
                    vec![sge(&a, 0, 3)],
                ),
            )?;
            sim.run_until(STEPS, |s| {
                s.completions(0).len() == 2 && s.completions(1).len() == 2
            })?;
            let r = sim.completions(1);
            let imm = r[0].wc.result().unwrap();
            assert_eq!(
                (imm.wr_id(), imm.opcode(), imm.byte_len()),
                (100, WcOpcode::Recv, 10)
            );
            assert_eq!(imm.imm_data(), Some(0xDEAD_BEEF));
            assert_eq!(
                imm.completion().raw().imm_or_rkey,
                0xDEAD_BEEFu32.to_be(),
                "imm_data is network order"
            );
            assert_eq!(imm.flags(), WcFlags::WITH_IMM);
            assert_eq!(imm.qp_num(), qb);
            let inv = r[1].wc.result().unwrap();
            assert_eq!((inv.wr_id(), inv.byte_len()), (101, 3));
            assert_eq!(inv.invalidated_rkey(), Some(victim.rkey));
            assert_eq!(inv.flags(), WcFlags::WITH_INV);
            assert_eq!(sim.nodes[1].mem.bytes(b.addr, 10), b"0123456789");
            let s = sim.completions(0);
            assert_eq!(s[0].wc.result().unwrap().opcode(), WcOpcode::Send);
            assert_eq!(s[1].cq, CqTarget::Send);
            // The invalidated R_Key is dead: a write to it now fails remotely.
            use softverbs_proto::Memory;
            assert!(sim.nodes[1]
                .mem
                .check_remote(
                    victim.pd,
                    victim.rkey,
                    victim.addr,
                    8,
                    AccessFlags::REMOTE_WRITE
                )
                .is_err());
            Ok(())
        },
    );
}

/// `IBV_WC_LOC_LEN_ERR` on the receiver when an incoming SEND is larger than the posted
/// receive buffer; the requester sees `REM_INV_REQ_ERR` (NAK invalid request); both QPs go
/// to ERR and flush the rest (reference §2.6 row "Incoming SEND larger than the posted
/// receive buffer").
#[test]
fn loc_len_err_when_send_exceeds_receive_buffer() {
    run_seeds(
        "loc_len_err_when_send_exceeds_receive_buffer",
        &[2],
        |seed| {
            let (mut sim, qa, qb) = rc_pair(seed, &QpParams::default())?;
            let a = sim.nodes[0].mem.register(8192, ALL_ACCESS);
            let b = sim.nodes[1].mem.register(8192, ALL_ACCESS);
            sim.post_recv(1, qb, recv(10, &b, 0, 100))?;
            sim.post_recv(1, qb, recv(11, &b, 100, 100))?;
            sim.post_send(0, qa, SendWr::new(1, SendOp::Send, vec![sge(&a, 0, 2000)]))?;
            sim.post_send(0, qa, SendWr::new(2, SendOp::Send, vec![sge(&a, 0, 10)]))?;
            sim.run_until(STEPS, |s| {
                s.completions(0).len() == 2 && s.completions(1).len() == 2
            })?;
            sim.run_idle(STEPS)?;
            let r = sim.completions(1);
            assert_status(&r[0], WcStatus::LocLenErr);
            assert_eq!(
                (r[0].wc.wr_id(), r[0].wc.qp_num(), r[0].cq),
                (10, qb, CqTarget::Recv)
            );
            assert_flushed(&r[1], 11, qb);
            let s = sim.completions(0);
            assert_status(&s[0], WcStatus::RemInvReqErr);
            assert_eq!(
                s[0].wc.vendor_err(),
                0x61,
                "vendor_err carries the NAK syndrome"
            );
            assert_flushed(&s[1], 2, qa);
            assert_eq!(sim.nodes[0].engine.qp_state(qa), Some(QpState::Err));
            assert_eq!(sim.nodes[1].engine.qp_state(qb), Some(QpState::Err));
            assert!(sim.nodes[1]
                .events
                .contains(&AsyncEvent::QpRequestError { qpn: qb }));
            Ok(())
        },
    );
}

/// `IBV_WC_LOC_LEN_ERR` on the requester for a UD message larger than the port MTU (a UD
/// message must fit one packet, reference §1.6); the QP goes to SQE, not ERR (UD errors
/// are send-queue errors), a later WR is flushed, and SQE → RTS recovers.
#[test]
fn loc_len_err_for_ud_message_larger_than_mtu() {
    run_seeds("loc_len_err_for_ud_message_larger_than_mtu", &[3], |seed| {
        let mut sim = two_nodes(seed, FaultRules::perfect());
        let p = QpParams::default();
        let qa = softverbs_sim::create_qp(&mut sim, 0, QpType::Ud, &p, None)?;
        softverbs_sim::bring_up(&mut sim, 0, qa, QpType::Ud, None, &p, (1, 0))?;
        let a = sim.nodes[0].mem.register(16384, ALL_ACCESS);
        let ud = softverbs_proto::UdDest {
            av: softverbs_proto::AddressVector {
                dgid: sim.nodes[1].gid,
                ..Default::default()
            },
            remote_qpn: 0x99,
            remote_qkey: p.qkey,
            pd: p.pd,
        };
        sim.post_send(
            0,
            qa,
            SendWr::new(1, SendOp::Send, vec![sge(&a, 0, 5000)]).with_ud(ud),
        )?;
        sim.run_idle(STEPS)?;
        let s = sim.completions(0);
        assert_status(&s[0], WcStatus::LocLenErr);
        assert_eq!(sim.nodes[0].engine.qp_state(qa), Some(QpState::Sqe));
        sim.post_send(
            0,
            qa,
            SendWr::new(2, SendOp::Send, vec![sge(&a, 0, 10)]).with_ud(ud),
        )?;
        assert_flushed(&sim.completions(0)[1], 2, qa);
        // SQE → RTS (ibv_modify_qp(3) table) makes the send queue usable again.
        let rts = QpAttr {
            qp_state: QpState::Rts,
            ..QpAttr::default()
        };
        sim.nodes[0]
            .engine
            .modify_qp(qa, &rts, AttrMask::STATE)
            .unwrap();
        sim.post_send(
            0,
            qa,
            SendWr::new(3, SendOp::Send, vec![sge(&a, 0, 10)]).with_ud(ud),
        )?;
        sim.run_idle(STEPS)?;
        assert!(sim.completions(0)[2].wc.result().is_ok());
        Ok(())
    });
}

/// `IBV_WC_LOC_QP_OP_ERR`: an RDMA READ on an RC QP whose `max_rd_atomic` is 0 can never
/// be issued — a local QP operation error, then ERR and flush (reference §2.6 row
/// "Unsupported WR opcode for QP type").
#[test]
fn loc_qp_op_err_for_read_without_rd_atomic_budget() {
    run_seeds(
        "loc_qp_op_err_for_read_without_rd_atomic_budget",
        &[4],
        |seed| {
            let (mut sim, qa, _qb) = rc_pair(
                seed,
                &QpParams {
                    max_rd_atomic: 0,
                    ..QpParams::default()
                },
            )?;
            let a = sim.nodes[0].mem.register(4096, ALL_ACCESS);
            let b = sim.nodes[1].mem.register(4096, ALL_ACCESS);
            sim.post_send(
                0,
                qa,
                SendWr::new(
                    1,
                    SendOp::RdmaRead {
                        remote_addr: b.addr,
                        rkey: b.rkey,
                    },
                    vec![sge(&a, 0, 64)],
                ),
            )?;
            sim.post_send(0, qa, SendWr::new(2, SendOp::Send, vec![sge(&a, 0, 1)]))?;
            sim.run_idle(STEPS)?;
            let s = sim.completions(0);
            assert_status(&s[0], WcStatus::LocQpOpErr);
            assert_eq!(s[0].wc.wr_id(), 1);
            assert_flushed(&s[1], 2, qa);
            Ok(())
        },
    );
}

/// `IBV_WC_LOC_PROT_ERR` on the requester: an unsignaled SEND whose SGE names an L_Key
/// that does not exist; errors complete even when unsignaled (reference §3.5), nothing is
/// sent, QP → ERR.
#[test]
fn loc_prot_err_for_bad_lkey_even_when_unsignaled() {
    run_seeds(
        "loc_prot_err_for_bad_lkey_even_when_unsignaled",
        &[5],
        |seed| {
            let p = QpParams {
                sq_sig_all: false,
                ..QpParams::default()
            };
            let (mut sim, qa, qb) = rc_pair(seed, &p)?;
            let a = sim.nodes[0].mem.register(4096, ALL_ACCESS);
            let b = sim.nodes[1].mem.register(4096, ALL_ACCESS);
            sim.post_recv(1, qb, recv(9, &b, 0, 4096))?;
            let bad = softverbs_proto::Sge {
                addr: a.addr,
                length: 16,
                lkey: 0xBAD,
            };
            sim.post_send(0, qa, SendWr::new(1, SendOp::Send, vec![bad]))?;
            sim.run_idle(STEPS)?;
            let s = sim.completions(0);
            assert_eq!(s.len(), 1);
            assert_status(&s[0], WcStatus::LocProtErr);
            assert_eq!((s[0].wc.wr_id(), s[0].wc.qp_num()), (1, qa));
            assert!(sim.completions(1).is_empty(), "nothing reached the peer");
            assert_eq!(sim.nodes[0].engine.qp_state(qa), Some(QpState::Err));
            Ok(())
        },
    );
}

/// `IBV_WC_WR_FLUSH_ERR`: modify to ERR with WRs outstanding flushes every send and receive
/// WR in order; WRs posted in ERR are accepted and flushed at once; the send queue of a
/// signaled-off QP still flushes every WR (reference §2.7, ibv_modify_qp(3)).
#[test]
fn wr_flush_err_on_modify_to_err_and_post_in_err() {
    run_seeds(
        "wr_flush_err_on_modify_to_err_and_post_in_err",
        &[6],
        |seed| {
            let p = QpParams {
                sq_sig_all: false,
                ..QpParams::default()
            };
            let (mut sim, qa, qb) = rc_pair(seed, &p)?;
            let a = sim.nodes[0].mem.register(4096, ALL_ACCESS);
            sim.nodes[1].down = true; // nothing is acknowledged
            for i in 0..3 {
                sim.post_send(0, qa, SendWr::new(i, SendOp::Send, vec![sge(&a, 0, 8)]))?;
                sim.post_recv(0, qa, recv(100 + i, &a, 1024, 64))?;
            }
            sim.step()?;
            let attr = QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            };
            sim.nodes[0]
                .engine
                .modify_qp(qa, &attr, AttrMask::STATE)
                .unwrap();
            sim.post_send(0, qa, SendWr::new(3, SendOp::Send, vec![sge(&a, 0, 8)]))?;
            sim.post_recv(0, qa, recv(103, &a, 1024, 64))?;
            sim.run_idle(STEPS)?;
            let c = sim.completions(0);
            let sends: Vec<_> = c.iter().filter(|c| c.cq == CqTarget::Send).collect();
            let recvs: Vec<_> = c.iter().filter(|c| c.cq == CqTarget::Recv).collect();
            assert_eq!(sends.len(), 4);
            assert_eq!(recvs.len(), 4);
            for (i, c) in sends.iter().enumerate() {
                assert_flushed(c, i as u64, qa);
            }
            for (i, c) in recvs.iter().enumerate() {
                assert_flushed(c, 100 + i as u64, qa);
            }
            let _ = qb;
            Ok(())
        },
    );
}

/// `IBV_WC_BAD_RESP_ERR`: the responder answers a SEND with an ATOMIC ACKNOWLEDGE (a
/// response that does not match the WQE, reference §2.6); the requester fails the WR and
/// goes to ERR.
#[test]
fn bad_resp_err_when_response_does_not_match_request() {
    run_seeds(
        "bad_resp_err_when_response_does_not_match_request",
        &[7],
        |seed| {
            let (mut sim, qa, qb) = rc_pair(seed, &QpParams::default())?;
            let a = sim.nodes[0].mem.register(4096, ALL_ACCESS);
            let b = sim.nodes[1].mem.register(4096, ALL_ACCESS);
            sim.post_recv(1, qb, recv(9, &b, 0, 4096))?;
            // Rewrite B's ACK (opcode 0x11: BTH·AETH·ICRC) into an ATOMIC ACKNOWLEDGE
            // (0x12: BTH·AETH·AtomicAckETH·ICRC).
            sim.intercept = Some(Box::new(|from, _to, bytes: &mut Vec<u8>| {
                if from == 1 && bytes[0] == 0x11 {
                    bytes[0] = 0x12;
                    bytes.splice(16..16, [0u8; 8]);
                }
                true
            }));
            sim.post_send(0, qa, SendWr::new(1, SendOp::Send, vec![sge(&a, 0, 8)]))?;
            sim.run_idle(STEPS)?;
            let s = sim.completions(0);
            assert_status(&s[0], WcStatus::BadRespErr);
            assert_eq!((s[0].wc.wr_id(), s[0].wc.qp_num()), (1, qa));
            assert_eq!(sim.nodes[0].engine.qp_state(qa), Some(QpState::Err));
            Ok(())
        },
    );
}

/// `IBV_WC_LOC_ACCESS_ERR` on the responder's receive WQE when an RDMA WRITE WITH
/// IMMEDIATE names a bad R_Key (IBTA: a protection error while processing a write with
/// immediate from the remote node); the requester sees `REM_ACCESS_ERR`; target memory is
/// untouched.
#[test]
fn loc_access_err_for_write_with_imm_to_bad_rkey() {
    run_seeds(
        "loc_access_err_for_write_with_imm_to_bad_rkey",
        &[8],
        |seed| {
            let (mut sim, qa, qb) = rc_pair(seed, &QpParams::default())?;
            let a = sim.nodes[0].mem.register(4096, ALL_ACCESS);
            let b = sim.nodes[1].mem.register(4096, ALL_ACCESS);
            sim.nodes[0].mem.fill(a.addr, &[7u8; 64]);
            sim.post_recv(1, qb, recv(9, &b, 0, 64))?;
            let op = SendOp::RdmaWriteWithImm {
                remote_addr: b.addr + 512,
                rkey: b.rkey ^ 0x4000,
                imm: 1,
            };
            sim.post_send(0, qa, SendWr::new(1, op, vec![sge(&a, 0, 64)]))?;
            sim.run_idle(STEPS)?;
            let r = sim.completions(1);
            assert_status(&r[0], WcStatus::LocAccessErr);
            assert_eq!((r[0].wc.wr_id(), r[0].wc.qp_num()), (9, qb));
            assert_status(&sim.completions(0)[0], WcStatus::RemAccessErr);
            assert_eq!(sim.nodes[1].mem.bytes(b.addr + 512, 64), &[0u8; 64]);
            assert!(sim.nodes[1]
                .events
                .contains(&AsyncEvent::QpAccessError { qpn: qb }));
            Ok(())
        },
    );
}

/// `IBV_WC_REM_INV_REQ_ERR`: an RDMA WRITE to a QP whose `qp_access_flags` lack
/// `REMOTE_WRITE` (reference §2.3 step 3), and a misaligned atomic (§1.3); NAK invalid
/// request.
#[test]
fn rem_inv_req_err_for_disallowed_write_and_misaligned_atomic() {
    run_seeds(
        "rem_inv_req_err_for_disallowed_write_and_misaligned_atomic",
        &[9],
        |seed| {
            let p = QpParams {
                access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
                ..QpParams::default()
            };
            let (mut sim, qa, _qb) = rc_pair(seed, &p)?;
            let a = sim.nodes[0].mem.register(4096, ALL_ACCESS);
            let b = sim.nodes[1].mem.register(4096, ALL_ACCESS);
            sim.post_send(
                0,
                qa,
                SendWr::new(
                    1,
                    SendOp::RdmaWrite {
                        remote_addr: b.addr,
                        rkey: b.rkey,
                    },
                    vec![sge(&a, 0, 16)],
                ),
            )?;
            sim.run_idle(STEPS)?;
            assert_status(&sim.completions(0)[0], WcStatus::RemInvReqErr);
            assert_eq!(sim.nodes[1].mem.bytes(b.addr, 16), &[0u8; 16]);

            let (mut sim, qa, _qb) = rc_pair(seed, &QpParams::default())?;
            let a = sim.nodes[0].mem.register(4096, ALL_ACCESS);
            let b = sim.nodes[1].mem.register(4096, ALL_ACCESS);
            let op = SendOp::FetchAdd {
                remote_addr: b.addr + 4,
                rkey: b.rkey,
                add: 1,
            };
            sim.post_send(0, qa, SendWr::new(1, op, vec![sge(&a, 0, 8)]))?;
            sim.run_idle(STEPS)?;
            assert_status(&sim.completions(0)[0], WcStatus::RemInvReqErr);
            Ok(())
        },
    );
}

/// `IBV_WC_REM_ACCESS_ERR`: RDMA READ outside the remote region's bounds, and RDMA WRITE to
/// a region registered without `REMOTE_WRITE` (reference §2.3 step 6); remote memory is
/// never touched.
#[test]
fn rem_access_err_for_out_of_bounds_read_and_write_without_access() {
    run_seeds(
        "rem_access_err_for_out_of_bounds_read_and_write_without_access",
        &[10],
        |seed| {
            let (mut sim, qa, _qb) = rc_pair(seed, &QpParams::default())?;
            let a = sim.nodes[0].mem.register(8192, ALL_ACCESS);
            let b = sim.nodes[1].mem.register(4096, ALL_ACCESS);
            let op = SendOp::RdmaRead {
                remote_addr: b.addr + 4000,
                rkey: b.rkey,
            };
            sim.post_send(0, qa, SendWr::new(1, op, vec![sge(&a, 0, 200)]))?;
            sim.run_idle(STEPS)?;
            assert_status(&sim.completions(0)[0], WcStatus::RemAccessErr);
            assert_eq!(sim.completions(0)[0].wc.vendor_err(), 0x62);

            let (mut sim, qa, _qb) = rc_pair(seed, &QpParams::default())?;
            let a = sim.nodes[0].mem.register(4096, ALL_ACCESS);
            let ro = sim.nodes[1]
                .mem
                .register(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ);
            sim.nodes[0].mem.fill(a.addr, &[1u8; 32]);
            let op = SendOp::RdmaWrite {
                remote_addr: ro.addr,
                rkey: ro.rkey,
            };
            sim.post_send(0, qa, SendWr::new(1, op, vec![sge(&a, 0, 32)]))?;
            sim.run_idle(STEPS)?;
            assert_status(&sim.completions(0)[0], WcStatus::RemAccessErr);
            assert_eq!(sim.nodes[1].mem.bytes(ro.addr, 32), &[0u8; 32]);
            Ok(())
        },
    );
}

/// `IBV_WC_REM_OP_ERR`: the responder cannot place a SEND because its receive WQE names a
/// bad L_Key (a responder-local fault, NAK remote operational error); the responder's WQE
/// completes with `LOC_PROT_ERR` (reference §2.6).
#[test]
fn rem_op_err_when_responder_receive_buffer_is_invalid() {
    run_seeds(
        "rem_op_err_when_responder_receive_buffer_is_invalid",
        &[11],
        |seed| {
            let (mut sim, qa, qb) = rc_pair(seed, &QpParams::default())?;
            let a = sim.nodes[0].mem.register(4096, ALL_ACCESS);
            let bad = softverbs_proto::Sge {
                addr: 0x1234_0000,
                length: 4096,
                lkey: 0xDEAD,
            };
            sim.post_recv(
                1,
                qb,
                softverbs_proto::RecvWr {
                    wr_id: 9,
                    sg_list: [bad].into(),
                },
            )?;
            sim.post_send(0, qa, SendWr::new(1, SendOp::Send, vec![sge(&a, 0, 32)]))?;
            sim.run_idle(STEPS)?;
            assert_status(&sim.completions(0)[0], WcStatus::RemOpErr);
            assert_eq!(sim.completions(0)[0].wc.vendor_err(), 0x63);
            assert_status(&sim.completions(1)[0], WcStatus::LocProtErr);
            assert_eq!(sim.completions(1)[0].wc.wr_id(), 9);
            Ok(())
        },
    );
}

/// `IBV_WC_RETRY_EXC_ERR`: every packet lost; after `retry_cnt` = 2 timeouts the WR fails
/// (the spec meaning: 2 retries, then error), then the later WR flushes; no hang.
#[test]
fn retry_exc_err_after_retry_cnt_timeouts() {
    run_seeds("retry_exc_err_after_retry_cnt_timeouts", &[12], |seed| {
        let mut sim = two_nodes(
            seed,
            FaultRules {
                drop: 1.0,
                ..FaultRules::perfect()
            },
        );
        let p = QpParams {
            retry_cnt: 2,
            timeout: 5,
            ..QpParams::default()
        };
        let (qa, _qb) = connect(&mut sim, 0, 1, QpType::Rc, &p)?;
        let a = sim.nodes[0].mem.register(4096, ALL_ACCESS);
        sim.post_send(0, qa, SendWr::new(1, SendOp::Send, vec![sge(&a, 0, 8)]))?;
        sim.post_send(0, qa, SendWr::new(2, SendOp::Send, vec![sge(&a, 0, 8)]))?;
        sim.run_idle(STEPS)?;
        let s = sim.completions(0);
        assert_status(&s[0], WcStatus::RetryExcErr);
        assert_flushed(&s[1], 2, qa);
        assert_eq!(sim.nodes[0].engine.counters().timeouts, 3);
        Ok(())
    });
}

/// `IBV_WC_RNR_RETRY_EXC_ERR`: the responder never posts a receive; with `rnr_retry` = 2
/// the requester gets three RNR NAKs (first try + 2 retries), each waited for with the
/// responder's `min_rnr_timer` (code 14 = 1.28 ms, reference §1.4), then fails.
#[test]
fn rnr_retry_exc_err_after_rnr_retry_naks() {
    run_seeds("rnr_retry_exc_err_after_rnr_retry_naks", &[13], |seed| {
        let p = QpParams {
            rnr_retry: 2,
            min_rnr_timer: 14,
            ..QpParams::default()
        };
        let (mut sim, qa, _qb) = rc_pair(seed, &p)?;
        let a = sim.nodes[0].mem.register(4096, ALL_ACCESS);
        sim.post_send(0, qa, SendWr::new(1, SendOp::Send, vec![sge(&a, 0, 8)]))?;
        sim.run_idle(STEPS)?;
        let s = sim.completions(0);
        assert_status(&s[0], WcStatus::RnrRetryExcErr);
        assert_eq!(sim.nodes[0].engine.counters().rnr_naks_received, 3);
        assert_eq!(sim.nodes[1].engine.counters().rnr_naks_sent, 3);
        assert!(sim.now >= 2 * 1_280_000, "two RNR waits of 1.28 ms");
        Ok(())
    });
}

/// RNR is not an error when the receiver posts in time: with `rnr_retry` = 7 (infinite,
/// IBTA) the SEND waits out RNR NAKs and then succeeds once a receive is posted.
#[test]
fn rnr_nak_then_success_when_receive_posted_late() {
    run_seeds(
        "rnr_nak_then_success_when_receive_posted_late",
        &[14],
        |seed| {
            let p = QpParams {
                rnr_retry: 7,
                min_rnr_timer: 1,
                ..QpParams::default()
            };
            let (mut sim, qa, qb) = rc_pair(seed, &p)?;
            let a = sim.nodes[0].mem.register(4096, ALL_ACCESS);
            let b = sim.nodes[1].mem.register(4096, ALL_ACCESS);
            sim.post_send(0, qa, SendWr::new(1, SendOp::Send, vec![sge(&a, 0, 8)]))?;
            sim.run_until(STEPS, |s| {
                s.nodes[0].engine.counters().rnr_naks_received >= 20
            })?;
            sim.post_recv(1, qb, recv(5, &b, 0, 64))?;
            sim.run_until(STEPS, |s| s.completions(0).len() == 1)?;
            assert!(sim.completions(0)[0].wc.result().is_ok());
            assert_eq!(sim.completions(1)[0].wc.result().unwrap().byte_len(), 8);
            Ok(())
        },
    );
}

/// After an error only `modify_qp(RESET)` makes a QP usable again (reference §2.7): both
/// sides go RESET → INIT → RTR → RTS with new PSNs and traffic flows.
#[test]
fn qp_usable_again_after_reset_and_reconnect() {
    run_seeds("qp_usable_again_after_reset_and_reconnect", &[15], |seed| {
        let p = QpParams::default();
        let (mut sim, qa, qb) = rc_pair(seed, &p)?;
        let a = sim.nodes[0].mem.register(4096, ALL_ACCESS);
        let b = sim.nodes[1].mem.register(4096, ALL_ACCESS);
        // Fail both QPs: a send larger than the receive buffer.
        sim.post_recv(1, qb, recv(1, &b, 0, 4))?;
        sim.post_send(0, qa, SendWr::new(1, SendOp::Send, vec![sge(&a, 0, 64)]))?;
        sim.run_idle(STEPS)?;
        assert_eq!(sim.nodes[0].engine.qp_state(qa), Some(QpState::Err));
        assert_eq!(sim.nodes[1].engine.qp_state(qb), Some(QpState::Err));
        let reset = QpAttr {
            qp_state: QpState::Reset,
            ..QpAttr::default()
        };
        sim.nodes[0]
            .engine
            .modify_qp(qa, &reset, AttrMask::STATE)
            .unwrap();
        sim.nodes[1]
            .engine
            .modify_qp(qb, &reset, AttrMask::STATE)
            .unwrap();
        softverbs_sim::bring_up(&mut sim, 0, qa, QpType::Rc, Some((1, qb)), &p, (500, 900))?;
        softverbs_sim::bring_up(&mut sim, 1, qb, QpType::Rc, Some((0, qa)), &p, (900, 500))?;
        sim.post_recv(1, qb, recv(2, &b, 0, 128))?;
        sim.post_send(0, qa, SendWr::new(2, SendOp::Send, vec![sge(&a, 0, 64)]))?;
        sim.run_idle(STEPS)?;
        assert!(sim.completions(0).last().unwrap().wc.result().is_ok());
        assert_eq!(
            sim.completions(1)
                .last()
                .unwrap()
                .wc
                .result()
                .unwrap()
                .byte_len(),
            64
        );
        Ok(())
    });
}
