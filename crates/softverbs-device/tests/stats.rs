//! The device's statistics (`Device::stats`, and the `SOFTVERBS_STATS` line both front
//! doors print): one structure holding every counter a user needs to explain a run. The
//! faults injected are there by kind, equal to the fault layer's own counts, and they add
//! up against the engine and the transport (IBTA vol. 1 §9.7.5.1: a lost request is
//! recovered by go-back-N, so the loss shows as retransmissions); the CQs' high-water
//! marks (the deepest a CQ got, against its size, `ibv_create_cq(3)`'s `cqe`) survive the
//! QP and the CQ; the asynchronous events are counted by kind.

mod common;

use common::rc::{connect, side, wait_for, Side};
use softverbs_cq::WcStatus;
use softverbs_device::{DeviceConfig, UdpConfig};
use softverbs_proto::{RecvWr, SendOp, SendWr, Sge};
use std::net::{IpAddr, Ipv4Addr};

/// A UDP device on 127.0.0.`last`.
fn udp(last: u8) -> DeviceConfig {
    DeviceConfig::udp(UdpConfig {
        address: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))),
        ..UdpConfig::default()
    })
}

fn sge(side: &Side, offset: usize, len: u32) -> Sge {
    Sge {
        addr: side.buf.as_ptr() as u64 + offset as u64,
        length: len,
        lkey: side.lkey,
    }
}

/// `n` SENDs of 100 bytes from `a` into receives posted at `b`; waits for `a`'s send
/// completions only (so `b`'s receive completions stay in its CQ).
fn sends(a: &Side, b: &Side, n: u64) {
    for i in 0..n {
        b.device
            .post_recv(
                b.qpn,
                RecvWr {
                    wr_id: i,
                    sg_list: [sge(b, 0, 100)].into(),
                },
            )
            .unwrap();
    }
    for i in 0..n {
        a.device
            .post_send(a.qpn, SendWr::new(i, SendOp::Send, vec![sge(a, 0, 100)]))
            .unwrap();
    }
    let done = wait_for(a, n as usize);
    assert!(done.iter().all(|wc| wc.status() == WcStatus::Success));
}

#[test]
fn stats_hold_the_faults_injected_by_kind_as_the_fault_layer_counted_them() {
    let faults = softverbs_device::parse_faults("drop=0.2,seed=5").unwrap();
    let a = side(DeviceConfig {
        faults: Some(faults),
        ..udp(213)
    });
    let b = side(udp(214));
    a.device.set_in_process_shortcut(false);
    b.device.set_in_process_shortcut(false);
    connect(&a, &b);
    sends(&a, &b, 40);

    let stats = a.device.stats();
    let f = stats.faults.expect("A injects faults");
    assert_eq!(Some(f), a.device.fault_counters(), "the device's own count");
    assert!(f.dropped > 0, "{f:?}");
    assert_eq!(
        (f.duplicated, f.corrupted, f.delayed, f.reordered),
        (0, 0, 0, 0)
    );
    // Every packet the engine sent went through the fault layer, and the socket got the
    // ones it did not drop.
    let transport = stats.transport.expect("a UDP device");
    assert_eq!(f.packets, stats.engine.packets_sent);
    assert_eq!(transport.sent_packets, f.packets - f.dropped);
    assert!(stats.engine.retransmitted_packets > 0, "{}", stats.engine);
    assert_eq!(b.device.stats().faults, None, "B injects nothing");
    // The line says the same.
    let line = a.device.stats_line();
    assert!(
        line.starts_with("softverbs stats: device softverbs0 address 127.0.0.213 pid "),
        "{line}"
    );
    assert!(
        line.contains(&format!(
            "; faults: packets={} dropped={} duplicated=0 corrupted=0 delayed=0 reordered=0 \
             released=0;",
            f.packets, f.dropped
        )),
        "{line}"
    );
    assert!(
        line.contains(&format!(
            "retransmitted_packets={}",
            stats.engine.retransmitted_packets
        )),
        "{line}"
    );
}

#[test]
fn stats_keep_the_cq_high_water_mark_past_the_qp_and_the_cq_and_count_events() {
    let a = side(DeviceConfig::in_process());
    let b = side(DeviceConfig::in_process());
    connect(&a, &b);
    // B's 12 receive completions wait in its CQ (256 entries) unpolled.
    sends(&a, &b, 12);
    let cq = b.device.stats().cq;
    assert_eq!(
        (cq.cqs, cq.high_water, cq.high_water_capacity),
        (1, 12, 256)
    );
    assert_eq!((cq.overruns, cq.in_error), (0, 0));
    // The QP and then the CQ go (ibv_destroy_qp, ibv_destroy_cq): the mark stays.
    b.device.destroy_qp(b.qpn).unwrap();
    b.device.cq_destroyed(b.cq.id());
    let stats = b.device.stats();
    assert_eq!((stats.cq.cqs, stats.cq.high_water), (1, 12));
    assert!(
        stats_line_has(&b, "; cq: cqs=1 high_water=12/256 overruns=0"),
        "{}",
        b.device.stats_line()
    );
    // Events by kind: the port came up once on each device.
    assert_eq!(stats.events.port_active, 1);
    assert_eq!(stats.events.total(), 1);
    assert!(stats_line_has(&b, "; events: total=1 port_active=1;"));
}

fn stats_line_has(side: &Side, text: &str) -> bool {
    side.device.stats_line().contains(text)
}
