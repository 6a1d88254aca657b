//! Load without collapse: 2,048 RC QPs between two UDP devices on loopback, every QP
//! writing at once. A loopback path loses nothing but what overflows a socket, so no QP
//! may end in `RETRY_EXC_ERR` (IBTA 9.7.5.1.3: the retry budget runs out only on a path
//! that keeps losing), every byte lands where it was written (`ibv_post_send(3)`,
//! IBV_WR_RDMA_WRITE), and what the sender has in flight stays within what the peer
//! absorbs: retransmissions stay below 1 % of the packets sent.

mod common;

use common::*;
use softverbs::*;
use std::time::{Duration, Instant};

/// Queue pairs between the two devices.
const QPS: usize = 2048;
/// Writes each QP posts at once.
const WRITES_PER_QP: usize = 4;
/// Bytes per write: two packets at the 4096-byte path MTU.
const WRITE_LEN: usize = 8192;
/// Longest the whole exchange may take.
const LIMIT: Duration = Duration::from_secs(120);

/// The byte at `offset` of the data QP `qp` writes in its `n`th write.
fn pattern(qp: usize, n: usize, offset: usize) -> u8 {
    (qp.wrapping_mul(31) ^ n.wrapping_mul(7) ^ offset) as u8
}

#[test]
fn rdma_writes_on_2048_qps_all_land_with_under_1_percent_retransmitted() {
    let (a, b) = (udp(231), udp(232));
    let (pd_a, pd_b) = (a.alloc_pd(), b.alloc_pd());
    let completions = (QPS * WRITES_PER_QP) as u32;
    let (cq_a, cq_b) = (a.create_cq(completions).unwrap(), b.create_cq(16).unwrap());
    let span = WRITES_PER_QP * WRITE_LEN;
    let src = pd_a.reg_mr(QPS * span, ALL_ACCESS).unwrap();
    let dst = pd_b.reg_mr(QPS * span, ALL_ACCESS).unwrap();
    let access = AccessFlags::REMOTE_WRITE;
    let mut pairs = Vec::with_capacity(QPS);
    for _ in 0..QPS {
        let qa = pd_a
            .qp_builder(QpType::Rc, &cq_a, &cq_a)
            .max_send_wr(WRITES_PER_QP as u32)
            .sq_sig_all(true)
            .build()
            .unwrap();
        let qb = pd_b.qp_builder(QpType::Rc, &cq_b, &cq_b).build().unwrap();
        for (me, peer) in [(&qa, &qb), (&qb, &qa)] {
            me.to_init(access).unwrap();
            me.to_rtr(peer.local_info(1)).unwrap();
            me.to_rts(RtsAttr::new(1)).unwrap();
        }
        pairs.push((qa, qb));
    }
    for q in 0..QPS {
        let data: Vec<u8> = (0..span)
            .map(|o| pattern(q, o / WRITE_LEN, o % WRITE_LEN))
            .collect();
        src.write_at(q * span, &data).unwrap();
    }
    let before = a.device().stats().engine;
    for (q, (qa, _)) in pairs.iter().enumerate() {
        for n in 0..WRITES_PER_QP {
            let at = q * span + n * WRITE_LEN;
            qa.post_send(SendRequest::write(
                (q * WRITES_PER_QP + n) as u64,
                &[src.slice(at..at + WRITE_LEN).unwrap()],
                dst.remote().offset(at as u64),
            ))
            .unwrap();
        }
    }
    let deadline = Instant::now() + LIMIT;
    let mut done = vec![false; QPS * WRITES_PER_QP];
    let mut wcs = [WorkCompletion::default(); 64];
    let mut count = 0;
    while count < done.len() {
        assert!(
            Instant::now() < deadline,
            "only {count} of {} writes completed in {LIMIT:?}; {}",
            done.len(),
            a.device().stats_line()
        );
        let k = cq_a.poll(&mut wcs).unwrap();
        for wc in &wcs[..k] {
            assert_eq!(
                wc.status(),
                WcStatus::Success,
                "write {} failed on a lossless path: {wc:?}; {}",
                wc.wr_id(),
                a.device().stats_line()
            );
            let id = wc.wr_id() as usize;
            assert!(!done[id], "write {id} completed twice");
            done[id] = true;
            count += 1;
        }
        if k == 0 {
            std::thread::yield_now();
        }
    }
    for q in 0..QPS {
        let got = dst.read_vec(q * span..(q + 1) * span).unwrap();
        if let Some(o) = (0..span).find(|&o| got[o] != pattern(q, o / WRITE_LEN, o % WRITE_LEN)) {
            panic!("QP {q}: byte {o} of what it wrote did not land");
        }
    }
    let after = a.device().stats().engine;
    let sent = after.packets_sent - before.packets_sent;
    let again = after.retransmitted_packets - before.retransmitted_packets;
    assert!(
        again * 100 < sent,
        "{again} of {sent} packets were retransmitted (limit 1 %); {}",
        a.device().stats_line()
    );
}
