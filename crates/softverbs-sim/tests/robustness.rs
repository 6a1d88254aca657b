//! Every malformed or unexpected packet is dropped and counted, never a panic; random verb
//! sequences never panic and leave the state machine in a legal state
//! (seeded random sequences where no fuzzer is at hand; ibv_modify_qp(3): an invalid
//! modify changes nothing).

mod common;

use common::{recv, sge, ALL_ACCESS};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use softverbs_proto::{
    AccessFlags, AttrMask, Engine, EngineConfig, Mtu, QpAttr, QpInit, QpState, QpType, SendOp,
    SendWr, VerbsError,
};
use softverbs_sim::{connect, run_seeds, FaultRules, QpParams, Sim, SimMemory};

/// Random bytes, truncated packets and bit-flipped real packets fed straight to
/// `handle_packet` (no ICRC check in front): no panic, every packet accounted for.
#[test]
fn garbage_and_mutated_packets_are_dropped_or_handled_without_panic() {
    run_seeds(
        "garbage_and_mutated_packets_are_dropped_or_handled_without_panic",
        &[1, 2],
        |seed| {
            // Capture real traffic of every opcode first.
            let mut sim = common::two_nodes(seed, FaultRules::perfect());
            let captured = std::rc::Rc::new(std::cell::RefCell::new(Vec::<Vec<u8>>::new()));
            let sink = captured.clone();
            sim.intercept = Some(Box::new(move |_, _, b: &mut Vec<u8>| {
                sink.borrow_mut().push(b.clone());
                true
            }));
            let t = common::Traffic::start(
                &mut sim,
                QpType::Rc,
                &common::Op::ALL,
                60,
                &QpParams::default(),
            )?;
            t.run(&mut sim, 1_000_000)?;
            let real = captured.borrow().clone();
            assert!(!real.is_empty());

            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut sim = Sim::new(seed, FaultRules::perfect());
            sim.add_node(EngineConfig::default());
            sim.add_node(EngineConfig::default());
            let (qa, qb) = connect(&mut sim, 0, 1, QpType::Rc, &QpParams::default())?;
            let b = sim.nodes[1].mem.register(1 << 20, ALL_ACCESS);
            for i in 0..64 {
                sim.post_recv(1, qb, recv(i, &b, i * 4096, 4096))?;
            }
            let _ = qa;
            let mut mem = SimMemory::new();
            let mut ep = Engine::new(EngineConfig::default());
            let mut count = 0u64;
            for round in 0..20_000u32 {
                let mut bytes = match round % 3 {
                    0 => (0..rng.gen_range(0..80))
                        .map(|_| rng.gen())
                        .collect::<Vec<u8>>(),
                    1 => {
                        let mut p = real[rng.gen_range(0..real.len())].clone();
                        for _ in 0..rng.gen_range(1..4) {
                            let i = rng.gen_range(0..p.len());
                            p[i] ^= 1 << rng.gen_range(0..8);
                        }
                        p
                    }
                    _ => {
                        let p = &real[rng.gen_range(0..real.len())];
                        p[..rng.gen_range(0..p.len())].to_vec()
                    }
                };
                // Aim half of them at the live QPs.
                if round % 2 == 0 && bytes.len() >= 8 {
                    bytes[5..8].copy_from_slice(&qb.to_be_bytes()[1..]);
                }
                let now = sim.now;
                let node = &mut sim.nodes[(round % 2) as usize];
                node.engine.handle_packet(now, &bytes, None, &mut node.mem);
                ep.handle_packet(now, &bytes, None, &mut mem);
                count += 2;
                let mut buf = vec![0u8; 8192];
                for n in sim.nodes.iter_mut() {
                    while n.engine.poll_transmit(now, &mut buf, &n.mem).is_some() {}
                    while n.engine.poll_completion().is_some() {}
                }
            }
            let received: u64 = sim
                .nodes
                .iter()
                .map(|n| n.engine.counters().packets_received)
                .sum::<u64>()
                + ep.counters().packets_received;
            assert_eq!(received, count);
            assert_eq!(
                ep.counters().total_drops(),
                ep.counters().packets_received,
                "no QP: all dropped"
            );
            Ok(())
        },
    );
}

fn random_attr(rng: &mut ChaCha8Rng, qp_type: QpType, cur: QpState) -> (QpAttr, AttrMask) {
    let states = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];
    let sane = rng.gen_bool(0.7);
    let mut attr = QpAttr {
        qp_state: states[rng.gen_range(0..states.len())],
        cur_qp_state: if sane {
            cur
        } else {
            states[rng.gen_range(0..states.len())]
        },
        path_mtu: [Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096][rng.gen_range(0..3)],
        qkey: rng.gen(),
        rq_psn: rng.gen_range(0..0x0200_0000),
        sq_psn: rng.gen_range(0..0x0200_0000),
        dest_qp_num: rng.gen_range(0..0x0200_0000),
        qp_access_flags: AccessFlags::from_bits_retain(rng.gen_range(0..32)),
        pkey_index: rng.gen_range(0..2),
        max_rd_atomic: rng.gen_range(0..20),
        max_dest_rd_atomic: rng.gen_range(0..20),
        min_rnr_timer: rng.gen_range(0..40),
        port_num: rng.gen_range(0..3),
        timeout: rng.gen_range(0..40),
        retry_cnt: rng.gen_range(0..9),
        rnr_retry: rng.gen_range(0..9),
        ..QpAttr::default()
    };
    if !sane {
        return (
            attr,
            AttrMask::from_bits_retain(rng.gen::<u32>() & 0x023F_FFFF),
        );
    }
    // A plausible modify: the next state along the usual path (or ERR / RESET / SQD),
    // the man page's required mask, values in range.
    use AttrMask as M;
    let next = match (cur, rng.gen_range(0..10)) {
        (_, 0) => QpState::Err,
        (_, 1) => QpState::Reset,
        (QpState::Rts, 2) => QpState::Sqd,
        (QpState::Sqd | QpState::Sqe, _) => QpState::Rts,
        (QpState::Reset, _) => QpState::Init,
        (QpState::Init, _) => QpState::Rtr,
        (QpState::Rtr, _) => QpState::Rts,
        (s, _) => s,
    };
    attr.qp_state = next;
    attr.pkey_index = 0;
    attr.port_num = 1;
    attr.dest_qp_num &= 0xFF_FFFF;
    attr.rq_psn &= 0xFF_FFFF;
    attr.sq_psn &= 0xFF_FFFF;
    attr.qp_access_flags &= AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    attr.max_rd_atomic %= 16;
    attr.max_dest_rd_atomic %= 16;
    attr.min_rnr_timer %= 32;
    attr.timeout %= 32;
    attr.retry_cnt %= 8;
    attr.rnr_retry %= 8;
    let mask = M::STATE
        | match (cur, next, qp_type) {
            (QpState::Reset, QpState::Init, QpType::Ud) => M::PKEY_INDEX | M::PORT | M::QKEY,
            (QpState::Reset, QpState::Init, _) => M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
            (QpState::Init, QpState::Rtr, QpType::Ud) => M::empty(),
            (QpState::Init, QpState::Rtr, QpType::Uc) => {
                M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN
            }
            (QpState::Init, QpState::Rtr, QpType::Rc) => {
                M::AV
                    | M::PATH_MTU
                    | M::DEST_QPN
                    | M::RQ_PSN
                    | M::MAX_DEST_RD_ATOMIC
                    | M::MIN_RNR_TIMER
            }
            (QpState::Rtr, QpState::Rts, QpType::Rc) => {
                M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC
            }
            (QpState::Rtr, QpState::Rts, _) => M::SQ_PSN,
            _ => M::empty(),
        }
        | if rng.gen_bool(0.1) {
            M::from_bits_retain(1 << rng.gen_range(0..21))
        } else {
            M::empty()
        };
    (attr, mask)
}

/// Random modify / post / packet sequences on every QP type: a refused modify changes
/// nothing (query before == query after), an accepted one lands in the requested state,
/// and nothing panics.
#[test]
fn random_verb_sequences_keep_the_state_machine_legal() {
    run_seeds(
        "random_verb_sequences_keep_the_state_machine_legal",
        &[3, 4, 5],
        |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut ep = Engine::new(EngineConfig::default());
            let mut mem = SimMemory::new();
            let mr = mem.register(65536, ALL_ACCESS);
            let qps: Vec<u32> = [QpType::Rc, QpType::Uc, QpType::Ud]
                .into_iter()
                .map(|t| ep.create_qp(QpInit::new(t)).unwrap())
                .collect();
            let mut accepted = 0;
            let mut buf = vec![0u8; ep.max_packet_len()];
            for step in 0..20_000u64 {
                let which = rng.gen_range(0..qps.len());
                let qpn = qps[which];
                let qp_type = [QpType::Rc, QpType::Uc, QpType::Ud][which];
                match rng.gen_range(0..4) {
                    0 | 1 => {
                        let before = ep.query_qp(qpn).unwrap();
                        let (attr, mask) = random_attr(&mut rng, qp_type, before.0.qp_state);
                        match ep.modify_qp(qpn, &attr, mask) {
                            Ok(()) => {
                                accepted += 1;
                                let after = ep.query_qp(qpn).unwrap().0.qp_state;
                                if mask.contains(AttrMask::STATE) {
                                    assert_eq!(after, attr.qp_state);
                                } else {
                                    assert_eq!(after, before.0.qp_state);
                                }
                            }
                            Err(e) => {
                                // An attribute or transition refusal (EINVAL), never a
                                // resource one.
                                assert!(
                                    !matches!(
                                        e,
                                        VerbsError::QueueFull { .. }
                                            | VerbsError::InUse { .. }
                                            | VerbsError::NoSuchObject { .. }
                                    ),
                                    "{e}"
                                );
                                assert_eq!(
                                    ep.query_qp(qpn).unwrap(),
                                    before,
                                    "refused modify changed nothing"
                                );
                            }
                        }
                    }
                    2 => {
                        let op = [
                            SendOp::Send,
                            SendOp::RdmaWrite {
                                remote_addr: mr.addr,
                                rkey: mr.rkey,
                            },
                            SendOp::RdmaRead {
                                remote_addr: mr.addr,
                                rkey: mr.rkey,
                            },
                            SendOp::FetchAdd {
                                remote_addr: mr.addr,
                                rkey: mr.rkey,
                                add: 1,
                            },
                        ][rng.gen_range(0..4)];
                        let len = if op.is_atomic() {
                            8
                        } else {
                            rng.gen_range(0..3000)
                        };
                        let mut wr = SendWr::new(step, op, vec![sge(&mr, 0, len)]);
                        if rng.gen_bool(0.5) {
                            wr = wr.with_ud(softverbs_proto::UdDest {
                                av: Default::default(),
                                remote_qpn: qps[2],
                                remote_qkey: rng.gen(),
                                pd: rng.gen_range(0..2),
                            });
                        }
                        let _ = ep.post_send(qpn, wr);
                        let _ = ep.post_recv(qpn, recv(step, &mr, 0, rng.gen_range(0..4096)));
                    }
                    _ => {
                        let now = step * 1000;
                        // Loop our own packets back. Each may answer with another, so the
                        // exchange is bounded (as `Sim::step` bounds a burst): a livelock
                        // fails the test instead of hanging it.
                        let mut looped = 0;
                        while let Some(t) = ep.poll_transmit(now, &mut buf, &mem) {
                            looped += 1;
                            assert!(
                                looped <= 1_000_000,
                                "stuck: seed {seed} step {step}: packets looped back endlessly"
                            );
                            let pkt = buf[..t.len].to_vec();
                            ep.handle_packet(now, &pkt, None, &mut mem);
                        }
                        ep.handle_timeout(now + 1_000_000_000);
                        while ep.poll_completion().is_some() {}
                        while ep.poll_event().is_some() {}
                    }
                }
            }
            assert!(
                accepted > 100,
                "the random walk reached many states ({accepted} modifies)"
            );
            Ok(())
        },
    );
}
