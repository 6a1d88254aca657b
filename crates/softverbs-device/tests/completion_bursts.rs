//! The completions of one run reach each CQ through one producer burst (one hold of the
//! CQ's producer lock, `CqStats::bursts`), however many the run produced: a QP flushed to
//! the error state completes every receive it had posted in one run, and a batch of
//! packets taken off the socket in one run completes its receives together.

mod common;

use common::rc::{connect, side, wait_for, Side};
use softverbs_cq::WcStatus;
use softverbs_device::{DeviceConfig, UdpConfig};
use softverbs_proto::{AccessFlags, AttrMask, QpAttr, QpState, RecvWr, SendOp, SendWr, Sge};
use std::net::{IpAddr, Ipv4Addr};

/// Receives posted per round: a receive batch's worth (the device's `RECEIVE_SLOTS`).
const BATCH: u64 = 32;

fn post_receives(side: &Side, first: u64, n: u64) {
    for wr_id in first..first + n {
        let wr = RecvWr {
            wr_id,
            sg_list: [Sge {
                addr: side.buf.as_ptr() as u64,
                length: 64,
                lkey: side.lkey,
            }]
            .into(),
        };
        side.device.post_recv(side.qpn, wr).unwrap();
    }
}

#[test]
fn a_qp_flushed_to_error_completes_its_posted_receives_through_one_burst() {
    // ibv_modify_qp(3) to IBV_QPS_ERR: outstanding work requests complete with
    // IBV_WC_WR_FLUSH_ERR, in order. All of them come out of one engine run.
    let a = side(DeviceConfig::in_process());
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE,
        ..QpAttr::default()
    };
    let mask = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
    a.device.modify_qp(a.qpn, &init, mask).unwrap();
    post_receives(&a, 0, BATCH);
    let before = a.cq.stats();
    let error = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    a.device.modify_qp(a.qpn, &error, AttrMask::STATE).unwrap();
    let after = a.cq.stats();
    assert_eq!(after.produced - before.produced, BATCH);
    assert_eq!(
        after.bursts - before.bursts,
        1,
        "{BATCH} completions of one run: one burst"
    );
    let flushed = wait_for(&a, BATCH as usize);
    let ids: Vec<u64> = flushed.iter().map(|wc| wc.wr_id()).collect();
    assert_eq!(ids, (0..BATCH).collect::<Vec<_>>(), "in order");
    assert!(flushed.iter().all(|wc| wc.status() == WcStatus::WrFlushErr));
}

/// A UDP device on 127.0.0.`last`, port 4791.
fn udp(last: u8) -> DeviceConfig {
    DeviceConfig::udp(UdpConfig {
        address: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))),
        ..UdpConfig::default()
    })
}

#[test]
fn a_receive_batch_completes_its_receives_through_one_burst_per_run() {
    let a = side(udp(241));
    let b = side(udp(242));
    // Over the sockets: a batch of packets is taken off them by one `recvmmsg(2)` and
    // handled in one run.
    a.device.set_in_process_shortcut(false);
    b.device.set_in_process_shortcut(false);
    connect(&a, &b);
    const ROUNDS: u64 = 8;
    let before = (b.cq.stats(), b.device.transport_counters().expect("UDP"));
    for round in 0..ROUNDS {
        post_receives(&b, round * BATCH, BATCH);
        // One-packet SENDs posted together, so they leave together (`sendmmsg(2)`).
        for i in 0..BATCH {
            let wr = SendWr::new(
                round * BATCH + i,
                SendOp::Send,
                vec![Sge {
                    addr: a.buf.as_ptr() as u64,
                    length: 8,
                    lkey: a.lkey,
                }],
            );
            a.device.post_send(a.qpn, wr).unwrap();
        }
        let received = wait_for(&b, BATCH as usize);
        assert!(received.iter().all(|wc| wc.status() == WcStatus::Success));
        wait_for(&a, BATCH as usize);
    }
    let (cq, transport) = (b.cq.stats(), b.device.transport_counters().expect("UDP"));
    let (stats, receives) = (before.0, ROUNDS * BATCH);
    let bursts = cq.bursts - stats.bursts;
    let runs = transport.recv_calls - before.1.recv_calls;
    let context = format!("{bursts} bursts for {receives} receives, {runs} receive calls");
    assert_eq!(cq.produced - stats.produced, receives, "{context}");
    // The receiver sends no requests, so only receives complete into its CQ: at most one
    // burst per batch taken off the socket (one push per completion made one each).
    assert!(bursts <= runs, "{context}");
    assert!(
        bursts < receives,
        "no burst carried two receives: {context}"
    );
}
