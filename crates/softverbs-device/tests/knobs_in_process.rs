//! Capture and fault injection on the paths that skip the socket: between two in-process
//! devices (`DeviceConfig::in_process()`, `SOFTVERBS_NETWORK=inprocess`), and between two
//! UDP devices of one process with the in-process shortcut on (the default). A device
//! with a capture records every RoCEv2 packet it sends and receives there, in the format
//! of a UDP capture; a device with faults loses, duplicates, corrupts, delays and reorders
//! what it sends there, and RC recovers by go-back-N (IBTA vol. 1 §9.7.5.1), so the loss
//! shows in the retransmit counters while every message arrives once, in order, intact.

mod common;

use common::rc::{connect, side, wait_for, Side};
use softverbs_cq::{WcOpcode, WcStatus};
use softverbs_device::pcap::read_capture;
use softverbs_device::{parse_faults, Capture, DeviceConfig, Direction, UdpConfig};
use softverbs_proto::{RecvWr, SendOp, SendWr, Sge};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A UDP device on 127.0.0.`last`, the in-process shortcut on (the default).
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

/// Bytes of each message of [`messages`].
const MESSAGE: usize = 200;

/// `n` SENDs from `from` to `to`, in batches of 16, each message `i` a pattern of its own
/// landing at offset `i * MESSAGE` of `to`'s buffer; checks that every receive completes
/// successfully, in order, with its bytes intact.
fn messages(from: &mut Side, to: &mut Side, n: usize) {
    for batch in (0..n).collect::<Vec<_>>().chunks(16) {
        for &i in batch {
            let at = i * MESSAGE;
            to.device
                .post_recv(
                    to.qpn,
                    RecvWr {
                        wr_id: i as u64,
                        sg_list: [sge(to, at, MESSAGE as u32)].into(),
                    },
                )
                .unwrap();
            for (k, byte) in from.buf[at..at + MESSAGE].iter_mut().enumerate() {
                *byte = (i * 7 + k) as u8;
            }
        }
        for &i in batch {
            from.device
                .post_send(
                    from.qpn,
                    SendWr::new(
                        i as u64,
                        SendOp::Send,
                        vec![sge(from, i * MESSAGE, MESSAGE as u32)],
                    ),
                )
                .unwrap();
        }
        let sent = wait_for(from, batch.len());
        assert!(sent.iter().all(|wc| wc.status() == WcStatus::Success));
        let received = wait_for(to, batch.len());
        for (wc, &i) in received.iter().zip(batch) {
            let done = wc.result().expect("a successful receive");
            assert_eq!(done.opcode(), WcOpcode::Recv);
            assert_eq!(wc.wr_id(), i as u64, "in order");
            assert_eq!(done.byte_len(), MESSAGE as u32);
        }
    }
    for i in 0..n {
        let at = i * MESSAGE;
        assert!(
            to.buf[at..at + MESSAGE] == from.buf[at..at + MESSAGE],
            "message {i} arrived damaged"
        );
    }
}

/// A fresh capture file named `name` in a folder of this test process.
fn capture_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("softverbs-knobs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    path
}

/// `a` captures into a file, `b` does not; 20 messages each way. The file holds every
/// packet `a`'s engine sent (outbound) and every packet `b`'s engine sent (inbound: all
/// reached `a`), each one a RoCEv2 packet that parses and whose ICRC verifies.
fn captures_every_packet(a: DeviceConfig, b: DeviceConfig, name: &str) -> (Side, Side) {
    let path = capture_path(name);
    let capture = Capture::create(&path).unwrap();
    let mut a = side(DeviceConfig {
        capture: Some(capture.clone()),
        ..a
    });
    let mut b = side(b);
    connect(&a, &b);
    messages(&mut a, &mut b, 20);
    messages(&mut b, &mut a, 20);
    // The last ACKs may still be on their way: wait (bounded) until the engines are quiet.
    let expected = || a.device.counters().packets_sent + b.device.counters().packets_sent;
    let deadline = Instant::now() + Duration::from_secs(5);
    while capture.packets() != expected() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let (a_sent, b_sent) = (
        a.device.counters().packets_sent,
        b.device.counters().packets_sent,
    );
    assert!(a_sent >= 40 && b_sent >= 40, "{a_sent} {b_sent}");
    a.device.flush_capture().unwrap();
    let records = read_capture(&path).unwrap();
    let count = |direction| records.iter().filter(|r| r.direction == direction).count() as u64;
    assert_eq!(count(Direction::Outbound), a_sent, "every packet a sent");
    assert_eq!(count(Direction::Inbound), b_sent, "every packet a received");
    assert_eq!(records.len() as u64, a_sent + b_sent);
    for record in &records {
        assert!(record.packet.is_ok(), "{record}");
        assert!(record.icrc.is_ok(), "ICRC of {record}");
    }
    assert_eq!(
        a.device.stats().capture.map(|c| c.packets),
        Some(a_sent + b_sent)
    );
    std::fs::remove_file(&path).unwrap();
    (a, b)
}

#[test]
fn an_in_process_device_with_a_capture_records_every_packet_it_sends_and_receives() {
    captures_every_packet(
        DeviceConfig::in_process(),
        DeviceConfig::in_process(),
        "in-process.pcap",
    );
}

#[test]
fn a_udp_device_with_a_capture_records_the_packets_of_the_in_process_shortcut() {
    let (a, b) = captures_every_packet(udp(246), udp(247), "shortcut.pcap");
    // Handed over, not sent: no datagram crossed either socket.
    for side in [&a, &b] {
        assert_eq!(side.device.transport_counters().unwrap().sent_packets, 0);
    }
}

/// Both devices lose 20 % of what they send (`b` from the next seed); 200 messages from
/// `a` to `b` still all arrive, and the loss shows as retransmissions.
fn lossy_run_delivers_everything(a: DeviceConfig, b: DeviceConfig) -> (Side, Side) {
    let faults = parse_faults("drop=0.2,seed=17").unwrap();
    let mut b_faults = faults.clone();
    b_faults.seed += 1;
    let mut a = side(DeviceConfig {
        faults: Some(faults),
        ..a
    });
    let mut b = side(DeviceConfig {
        faults: Some(b_faults),
        ..b
    });
    connect(&a, &b);
    messages(&mut a, &mut b, 200);
    for side in [&a, &b] {
        let f = side.device.fault_counters().expect("faults configured");
        assert!(f.packets > 0 && f.dropped > 0, "{f:?}");
        let stats = side.device.stats();
        assert_eq!(stats.faults, Some(f), "the statistics hold them");
    }
    let engine = a.device.counters();
    assert!(engine.retransmitted_packets > 0, "{engine}");
    (a, b)
}

#[test]
fn faults_on_the_in_process_path_cost_retransmissions_and_every_message_arrives() {
    lossy_run_delivers_everything(DeviceConfig::in_process(), DeviceConfig::in_process());
}

#[test]
fn faults_on_the_in_process_shortcut_between_udp_devices_cost_retransmissions() {
    let (a, b) = lossy_run_delivers_everything(udp(248), udp(249));
    for side in [&a, &b] {
        assert_eq!(side.device.transport_counters().unwrap().sent_packets, 0);
    }
}

/// Every kind of fault on the in-process path: held packets (delay, reorder) are released
/// by the device itself, and a corrupted packet is dropped by the receiver's ICRC check,
/// so every message still arrives once, in order and intact.
#[test]
fn every_kind_of_fault_acts_on_the_in_process_path() {
    let faults = parse_faults(
        "drop=0.05,duplicate=0.05,corrupt=0.05,delay=0.05:2ms,reorder=0.05:1ms,seed=23",
    )
    .unwrap();
    let mut a = side(DeviceConfig {
        faults: Some(faults),
        ..DeviceConfig::in_process()
    });
    let mut b = side(DeviceConfig::in_process());
    connect(&a, &b);
    messages(&mut a, &mut b, 300);
    let f = a.device.fault_counters().unwrap();
    for (kind, count) in [
        ("dropped", f.dropped),
        ("duplicated", f.duplicated),
        ("corrupted", f.corrupted),
        ("delayed", f.delayed),
        ("reordered", f.reordered),
        ("released", f.released),
    ] {
        assert!(count > 0, "nothing {kind}: {f:?}");
    }
    assert!(a.device.counters().retransmitted_packets > 0);
}

/// A packet corrupted on the shortcut between two UDP devices is dropped by the receiving
/// device's ICRC check, as its socket would drop it, and counted there.
#[test]
fn corruption_on_the_shortcut_is_caught_by_the_receivers_icrc_check() {
    let mut a = side(DeviceConfig {
        faults: Some(parse_faults("corrupt=0.1,seed=29").unwrap()),
        ..udp(250)
    });
    let mut b = side(udp(251));
    connect(&a, &b);
    messages(&mut a, &mut b, 100);
    let corrupted = a.device.fault_counters().unwrap().corrupted;
    assert!(corrupted > 0);
    let received = b.device.transport_counters().unwrap();
    assert_eq!(received.dropped_bad_icrc, corrupted, "{received}");
    assert_eq!(received.received_packets, 0, "nothing crossed the socket");
}
