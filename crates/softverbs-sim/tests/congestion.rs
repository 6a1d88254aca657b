//! Load without collapse (issue #15): many RC QPs to one peer share that peer's congestion
//! window, so the sum of their unacknowledged request PSNs stays within it (plus one
//! packet per QP that had nothing in flight), and a peer whose receive queue is bounded
//! like a UDP socket buffer sees few overflows: every work request completes successfully
//! (on a path with no real loss RC must never fail, IBTA 9.7.6.1.3: `retry_cnt` counts
//! timeouts of a path that lost packets) and retransmissions stay a small fraction.

mod common;

use common::{sge, ALL_ACCESS};
use softverbs_cq::WcStatus;
use softverbs_proto::{CqTarget, EngineConfig, SendOp, SendWr};
use softverbs_sim::{connect, run_seeds, FaultRules, QpParams, Sim, SimError};

/// QPs per node, as `ib_write_bw -q 512`.
const QPS: usize = 512;

/// What a run observed.
#[derive(Debug, Default)]
struct Observed {
    /// Largest sum of unacknowledged request PSNs to the peer, over both nodes.
    peak_in_flight: u32,
    /// Largest `in_flight - cwnd` seen.
    peak_over_cwnd: i64,
    /// Largest window seen.
    peak_cwnd: u32,
}

/// `QPS` RC QP pairs between two nodes of `config`; every QP of each node in `senders`
/// posts `writes` RDMA WRITEs of `len` bytes; runs until every one has completed, looking
/// at both peer windows after every step.
fn load(
    seed: u64,
    rules: FaultRules,
    config: EngineConfig,
    senders: &[usize],
    writes: u64,
    len: u32,
) -> Result<(Sim, Observed), SimError> {
    let mut sim = Sim::new(seed, rules);
    sim.add_node(config);
    sim.add_node(config);
    let p = QpParams::default();
    let mut pairs = Vec::new();
    for _ in 0..QPS {
        pairs.push(connect(&mut sim, 0, 1, softverbs_proto::QpType::Rc, &p)?);
    }
    let src = [
        sim.nodes[0].mem.register(len as usize, ALL_ACCESS),
        sim.nodes[1].mem.register(len as usize, ALL_ACCESS),
    ];
    let dst = [
        sim.nodes[0].mem.register(len as usize, ALL_ACCESS),
        sim.nodes[1].mem.register(len as usize, ALL_ACCESS),
    ];
    for i in 0..writes {
        for &(qa, qb) in &pairs {
            for &node in senders {
                let (qpn, peer) = if node == 0 { (qa, 1) } else { (qb, 0) };
                let write = SendOp::RdmaWrite {
                    remote_addr: dst[peer].addr,
                    rkey: dst[peer].rkey,
                };
                sim.post_send(
                    node,
                    qpn,
                    SendWr::new(i, write, vec![sge(&src[node], 0, len)]),
                )?;
            }
        }
    }
    let gids = [sim.nodes[0].gid, sim.nodes[1].gid];
    let expected = QPS * writes as usize;
    let mut seen = Observed::default();
    sim.run_until(5_000_000, |s| {
        for (node, peer) in [(0, 1), (1, 0)] {
            if let Some(w) = s.nodes[node].engine.peer_window(&gids[peer]) {
                seen.peak_in_flight = seen.peak_in_flight.max(w.in_flight);
                seen.peak_over_cwnd = seen
                    .peak_over_cwnd
                    .max(i64::from(w.in_flight) - i64::from(w.cwnd));
                seen.peak_cwnd = seen.peak_cwnd.max(w.cwnd);
            }
        }
        senders
            .iter()
            .all(|&node| s.completions(node).len() >= expected)
    })?;
    for &node in senders {
        let c = sim.completions(node);
        assert_eq!(c.len(), expected, "node {node}: one completion per write");
        for c in c {
            assert_eq!(c.cq, CqTarget::Send);
            assert_eq!(c.wc.status(), WcStatus::Success, "node {node}: {:?}", c.wc);
        }
    }
    Ok((sim, seen))
}

/// The report line of a run.
fn report(sim: &Sim, seen: &Observed) {
    for (i, n) in sim.nodes.iter().enumerate() {
        let c = n.engine.counters();
        println!(
            "  node {i}: sent {} packets, {} retransmitted ({:.3} %), {} timeouts, {} NAKs received, {} window reductions, {} window stalls",
            c.packets_sent,
            c.retransmitted_packets,
            100.0 * c.retransmitted_packets as f64 / c.packets_sent.max(1) as f64,
            c.timeouts,
            c.naks_received,
            c.cwnd_reductions,
            c.window_limited
        );
    }
    println!("  fabric {:?}; observed {seen:?}", sim.stats);
}

/// 512 RC QPs between two engines, every QP of both writing 8 messages of 4 packets
/// (16 K request packets, 4 K messages each way): after every step each node's
/// unacknowledged request PSNs to its peer are at most the peer window plus one packet
/// per QP (the allowance of a QP none of whose packets will be answered), instead of up
/// to 512 × 128; every write completes successfully, without a retransmission or a
/// local ACK timeout (a window must not strand packets that ask for no ACK).
#[test]
fn many_qps_to_one_peer_stay_within_the_peer_window_and_all_complete() {
    run_seeds(
        "many_qps_to_one_peer_stay_within_the_peer_window_and_all_complete",
        &[1],
        |seed| {
            let config = EngineConfig::default();
            let (sim, seen) = load(seed, FaultRules::perfect(), config, &[0, 1], 8, 4096)?;
            report(&sim, &seen);
            assert!(
                seen.peak_over_cwnd <= QPS as i64,
                "in flight beyond the window plus one packet per QP: {seen:?}"
            );
            assert!(seen.peak_cwnd <= config.max_cwnd_packets);
            assert!(
                seen.peak_in_flight <= config.max_cwnd_packets + QPS as u32,
                "{seen:?}"
            );
            for n in &sim.nodes {
                assert!(
                    n.engine.counters().window_limited > 0,
                    "the window held QPs"
                );
                assert_eq!(n.engine.counters().retransmitted_packets, 0, "no loss");
                assert_eq!(n.engine.counters().timeouts, 0, "no stranded packet");
            }
            Ok(())
        },
    );
}

/// The peer's receive queue holds 512 packets (2 MiB of 4 KiB packets, as a socket
/// buffer): 512 QPs each writing 48 messages of 4 packets as fast as their windows let
/// them (98 K request packets) complete every write with no error completion, and less
/// than 1 % of the packets sent are retransmissions (most come from the slow-start
/// overshoot at the start). The fabric is perfect but for the queue, so one seed is
/// every seed.
#[test]
fn bounded_receive_queue_512_qps_all_complete_with_few_retransmissions() {
    run_seeds(
        "bounded_receive_queue_512_qps_all_complete_with_few_retransmissions",
        &[2],
        |seed| {
            let rules = FaultRules {
                receive_queue: 512,
                ..FaultRules::perfect()
            };
            let (sim, seen) = load(seed, rules, EngineConfig::default(), &[0], 48, 4096)?;
            report(&sim, &seen);
            let c = sim.nodes[0].engine.counters();
            assert!(
                c.retransmitted_packets * 100 < c.packets_sent,
                "{} of {} packets retransmitted",
                c.retransmitted_packets,
                c.packets_sent
            );
            Ok(())
        },
    );
}
