//! Responder duplicate and sequence handling, one packet at a time (reference §2.3 step 1
//! and 10, C9-105 family; test plan §6 item 5): a duplicate SEND is re-ACKed without a
//! second completion, a duplicate READ for a sub-range is replayed from memory, a
//! duplicate atomic returns the saved original value without executing again, and a gap
//! gets exactly one NAK.

mod common;

use common::{
    atomic_ack_values, capture, first_packet, psn_of, rc_fetch_add_once, rc_read_once, recv, sge,
    two_nodes, word_at, OneRequest, ALL_ACCESS,
};
use softverbs_proto::{QpType, SendOp, SendWr};
use softverbs_sim::{connect, run_seeds, FaultRules, QpParams};
use softverbs_wire::{BthRepr, Opcode, PacketRepr, Psn, Qpn, RethRepr};

const STEPS: u64 = 200_000;

#[test]
fn duplicate_send_is_reacked_without_a_second_completion() {
    run_seeds(
        "duplicate_send_is_reacked_without_a_second_completion",
        &[1],
        |seed| {
            let mut sim = two_nodes(seed, FaultRules::perfect());
            let (qa, qb) = connect(&mut sim, 0, 1, QpType::Rc, &QpParams::default())?;
            let a = sim.nodes[0].mem.register(4096, ALL_ACCESS);
            let b = sim.nodes[1].mem.register(4096, ALL_ACCESS);
            sim.post_recv(1, qb, recv(1, &b, 0, 64))?;
            sim.post_recv(1, qb, recv(2, &b, 64, 64))?;
            let log = capture(&mut sim);
            sim.post_send(0, qa, SendWr::new(1, SendOp::Send, vec![sge(&a, 0, 8)]))?;
            sim.run_idle(STEPS)?;
            let send = first_packet(&log, 0, Opcode::RC_SEND_ONLY);
            let acks_before = sim.nodes[1].engine.counters().acks_sent;
            sim.inject(1, &send)?;
            sim.run_idle(STEPS)?;
            assert_eq!(sim.completions(1).len(), 1, "no second receive completion");
            assert_eq!(sim.nodes[1].engine.counters().duplicates_received, 1);
            assert_eq!(
                sim.nodes[1].engine.counters().acks_sent,
                acks_before + 1,
                "re-ACKed"
            );
            let reack = log.borrow().last().unwrap().1.clone();
            assert_eq!((reack[0], psn_of(&reack)), (0x11, psn_of(&send)));
            Ok(())
        },
    );
}

#[test]
fn duplicate_read_for_a_sub_range_is_replayed_from_memory() {
    run_seeds(
        "duplicate_read_for_a_sub_range_is_replayed_from_memory",
        &[2],
        |seed| {
            let mut sim = two_nodes(seed, FaultRules::perfect());
            let data: Vec<u8> = (0..3072u32).map(|i| i as u8).collect();
            let OneRequest {
                qb,
                b,
                log,
                request: req,
                ..
            } = rc_read_once(&mut sim, &data, STEPS)?;
            // The same READ re-asked from its second response on: VA + 1 MTU, 2 MTUs long.
            let dup = PacketRepr {
                bth: BthRepr {
                    opcode: Opcode::RC_RDMA_READ_REQUEST,
                    dest_qp: Qpn::new(qb),
                    psn: Psn::new(psn_of(&req)).add(1),
                    ack_req: true,
                    ..BthRepr::default()
                },
                reth: Some(RethRepr {
                    va: b.addr + 1024,
                    rkey: b.rkey,
                    dma_len: 2048,
                }),
                ..PacketRepr::default()
            };
            let mut bytes = vec![0u8; 64];
            let n = dup.emit(&[], &mut bytes).unwrap();
            let before = log.borrow().len();
            sim.inject(1, &bytes[..n])?;
            sim.run_idle(STEPS)?;
            let log = log.borrow();
            let replay: Vec<(u8, u32, usize)> = log[before..]
                .iter()
                .map(|(_, b)| (b[0], psn_of(b), b.len()))
                .collect();
            let p = psn_of(&req);
            assert_eq!(
                replay,
                vec![
                    (0x0D, (p + 1) & 0xFF_FFFF, 12 + 4 + 1024 + 4),
                    (0x0F, (p + 2) & 0xFF_FFFF, 12 + 4 + 1024 + 4)
                ]
            );
            let (_, first) = &log[before];
            assert_eq!(
                &first[16..16 + 1024],
                &data[1024..2048],
                "replayed from memory"
            );
            assert_eq!(
                sim.completions(0).len(),
                1,
                "the requester drops the stale replay"
            );
            Ok(())
        },
    );
}

#[test]
fn duplicate_atomic_returns_saved_value_and_executes_once() {
    run_seeds(
        "duplicate_atomic_returns_saved_value_and_executes_once",
        &[3],
        |seed| {
            let mut sim = two_nodes(seed, FaultRules::perfect());
            let OneRequest {
                a,
                b,
                log,
                request: req,
                ..
            } = rc_fetch_add_once(&mut sim, STEPS)?;
            // Two retransmissions a reply window apart, as a requester's ACK timeouts space
            // them: each is answered (two copies inside one window get one answer, see
            // forged_packets.rs).
            let window = sim.nodes[1].engine.config().duplicate_reply_window_ns;
            sim.inject(1, &req)?;
            sim.run_idle(STEPS)?;
            sim.now += window;
            sim.inject(1, &req)?;
            sim.run_idle(STEPS)?;
            assert_eq!(word_at(&sim, 1, b.addr), 42, "executed once");
            let acks = atomic_ack_values(&log, 1);
            assert_eq!(
                acks,
                vec![40, 40, 40],
                "the replay cache returns the original value"
            );
            assert_eq!(word_at(&sim, 0, a.addr), 40);
            Ok(())
        },
    );
}

#[test]
fn a_gap_gets_exactly_one_nak_sequence_error() {
    run_seeds("a_gap_gets_exactly_one_nak_sequence_error", &[4], |seed| {
        let mut sim = two_nodes(seed, FaultRules::perfect());
        let p = QpParams::default();
        let (_qa, qb) = connect(&mut sim, 0, 1, QpType::Rc, &p)?;
        let expected = p.psn; // B's rq_psn is A's sq_psn
        let log = capture(&mut sim);
        for k in 3..6u32 {
            let pkt = PacketRepr {
                bth: BthRepr {
                    opcode: Opcode::RC_SEND_ONLY,
                    dest_qp: Qpn::new(qb),
                    psn: Psn::new(expected).add(k),
                    ack_req: true,
                    ..BthRepr::default()
                },
                ..PacketRepr::default()
            };
            let mut bytes = vec![0u8; 32];
            let n = pkt.emit(b"x", &mut bytes).unwrap();
            sim.inject(1, &bytes[..n])?;
        }
        sim.run_idle(STEPS)?;
        let log = log.borrow();
        assert_eq!(log.len(), 1, "one NAK for the whole gap");
        let nak = &log[0].1;
        assert_eq!((nak[0], nak[12], psn_of(nak)), (0x11, 0x60, expected));
        assert_eq!(sim.nodes[1].engine.counters().naks_sent, 1);
        assert_eq!(
            sim.nodes[1]
                .engine
                .counters()
                .drops(softverbs_proto::DropReason::OutOfSequence),
            3
        );
        Ok(())
    });
}
