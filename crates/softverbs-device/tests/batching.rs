//! Packets move in batches over UDP: a run's packets leave in one `sendmmsg(2)`, a burst
//! is taken off the socket by one `recvmmsg(2)` and handled in one run, so the responder
//! acknowledges the burst with one ACK (IBTA vol. 1 §9.7.5.1.1: an ACK acknowledges every
//! packet up to its PSN) instead of one per packet.

mod common;

use common::rc::{connect, side, wait_for, Side};
use softverbs_cq::WcStatus;
use softverbs_device::{DeviceConfig, UdpConfig};
use softverbs_proto::{SendOp, SendWr, Sge};
use std::net::{IpAddr, Ipv4Addr};

/// A UDP device on 127.0.0.`last`, port 4791.
fn udp(last: u8) -> DeviceConfig {
    DeviceConfig::udp(UdpConfig {
        address: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))),
        ..UdpConfig::default()
    })
}

/// `rounds` times, `per_round` RDMA WRITEs of the whole 64 KiB buffer (64 packets each at
/// the 1024-byte path MTU `connect` sets) posted at once, each round waited for.
fn writes(a: &Side, b: &Side, rounds: u64, per_round: u64) {
    writes_of(a, b, rounds, per_round, a.buf.len() as u32);
}

/// [`writes`] of `len` bytes each.
fn writes_of(a: &Side, b: &Side, rounds: u64, per_round: u64, len: u32) {
    for round in 0..rounds {
        for i in 0..per_round {
            let wr = SendWr::new(
                round * per_round + i,
                SendOp::RdmaWrite {
                    remote_addr: b.buf.as_ptr() as u64,
                    rkey: b.rkey,
                },
                vec![Sge {
                    addr: a.buf.as_ptr() as u64,
                    length: len,
                    lkey: a.lkey,
                }],
            );
            a.device.post_send(a.qpn, wr).unwrap();
        }
        let done = wait_for(a, per_round as usize);
        assert!(done.iter().all(|wc| wc.status() == WcStatus::Success));
    }
}

#[test]
fn a_burst_of_rdma_writes_takes_several_packets_per_system_call_and_one_ack_per_batch() {
    let a = side(udp(225));
    let b = side(udp(226));
    // Over the sockets, not handed over in process.
    a.device.set_in_process_shortcut(false);
    b.device.set_in_process_shortcut(false);
    connect(&a, &b);
    writes(&a, &b, 8, 4);

    let sender = a.device.transport_counters().expect("a UDP device");
    let receiver = b.device.transport_counters().expect("a UDP device");
    let responder = b.device.counters();
    let context = format!("sender: {sender}\nreceiver: {receiver}\nresponder: {responder}");
    assert!(sender.sent_packets >= 8 * 4 * 64, "{context}");
    // A post of four 64-packet WRITEs leaves in one sendmmsg (up to the send window); one
    // packet per call would be a ratio of 1.
    assert!(
        sender.sent_packets >= 4 * sender.send_calls,
        "fewer than 4 packets per send call\n{context}"
    );
    // Calls that found nothing (EAGAIN) count too, and the receiver still takes more
    // than one packet per call.
    assert!(
        receiver.received_packets > receiver.recv_calls,
        "at most one packet per receive call\n{context}"
    );
    // One ACK per message (the last packet asks for it, IBTA vol. 1 §9.7.5.1.1).
    assert!(
        responder.acks_sent * 4 <= responder.packets_received,
        "more than one ACK per 4 packets received\n{context}"
    );

    // One-packet WRITEs, 64 posted at once: each asks for an ACK, and the ACKs of the
    // packets handled in one run coalesce into one.
    let before = b.device.counters();
    writes_of(&a, &b, 4, 64, 512);
    let after = b.device.counters();
    let packets = after.packets_received - before.packets_received;
    let acks = after.acks_sent - before.acks_sent;
    // One run per packet (the code before batching) sends exactly one ACK each.
    assert!(
        acks * 4 <= packets * 3,
        "{acks} ACKs for {packets} one-packet WRITEs: ACKs of a batch did not coalesce"
    );
}
