//! Between two devices of one process, whose packets are handed over in memory and never
//! meet a wire, a connected QP cuts its messages into 64 KiB packets instead of path-MTU
//! ones: a sixteenth of the packets of a large transfer at a 4096 MTU, each with its
//! headers, checks, hand-over and acknowledgement, and a 64 KiB message in one packet
//! (longer than an IP datagram could carry: nothing between the devices needs that). Both QPs decide it alike as they enter RTR; the path MTU the
//! application set is still what `ibv_query_qp(3)` reports, and the data, completions
//! and PSN accounting (a READ's responses, IBTA vol. 1 §9.4.4) are the same. Devices that
//! capture, inject faults or send through their sockets keep path-MTU packets: those are
//! the wire's.
//!
//! Between two devices of one process a payload moves once, from the sender's registered
//! region straight into the receiver's (the sender leaves its reads for later, the
//! receiver's writes take the bytes from the sender's region), for a WRITE, a READ's
//! responses and a SEND scattered across receive SGEs alike.

mod common;

use common::rc::{connect, side, wait_for, Side};
use softverbs_cq::WcOpcode;
use softverbs_device::{DeviceConfig, UdpConfig};
use softverbs_proto::{Mtu, RecvWr, SendOp, SendWr, Sge};
use std::net::{IpAddr, Ipv4Addr};

/// The message: 60,000 bytes, 59 packets at `connect`'s path MTU of 1024.
const LEN: u32 = 60_000;

fn sge(side: &Side, offset: u64, len: u32) -> Sge {
    Sge {
        addr: side.buf.as_ptr() as u64 + offset,
        length: len,
        lkey: side.lkey,
    }
}

/// Writes `LEN` bytes of a pattern from `a` into `b`, reads them back into `a`, checks
/// both copies; returns the packets the WRITE took (A's) and the READ's responses (B's).
fn write_then_read(a: &mut Side, b: &mut Side) -> (u64, u64) {
    for (i, byte) in a.buf[..LEN as usize].iter_mut().enumerate() {
        *byte = (i % 251) as u8;
    }
    let remote = b.buf.as_ptr() as u64;
    let sent_before = a.device.counters().packets_sent;
    let write = SendOp::RdmaWrite {
        remote_addr: remote,
        rkey: b.rkey,
    };
    a.device
        .post_send(a.qpn, SendWr::new(1, write, vec![sge(a, 0, LEN)]))
        .unwrap();
    assert_eq!(
        wait_for(a, 1)[0].result().unwrap().opcode(),
        WcOpcode::RdmaWrite
    );
    let write_packets = a.device.counters().packets_sent - sent_before;
    assert_eq!(&b.buf[..LEN as usize], &a.buf[..LEN as usize]);

    a.buf[..LEN as usize].fill(0);
    let answered_before = b.device.counters().packets_sent;
    let read = SendOp::RdmaRead {
        remote_addr: remote,
        rkey: b.rkey,
    };
    a.device
        .post_send(a.qpn, SendWr::new(2, read, vec![sge(a, 0, LEN)]))
        .unwrap();
    let completions = wait_for(a, 1);
    let done = completions[0].result().unwrap();
    assert_eq!((done.opcode(), done.byte_len()), (WcOpcode::RdmaRead, LEN));
    let read_responses = b.device.counters().packets_sent - answered_before;
    assert_eq!(&a.buf[..LEN as usize], &b.buf[..LEN as usize]);
    (write_packets, read_responses)
}

/// The SEND: 40,000 bytes, one packet between devices of one process.
const SEND_LEN: u32 = 40_000;

/// A SEND of [`SEND_LEN`] bytes of a pattern from `a` at offset 0, scattered by `b` across
/// two receive SGEs (at 0 and 20,000 of its buffer); checks the bytes that arrived.
fn send_across_two_sges(a: &mut Side, b: &mut Side) {
    for (i, byte) in a.buf[..SEND_LEN as usize].iter_mut().enumerate() {
        *byte = (i % 241) as u8;
    }
    let first = 10_000;
    let recv = RecvWr {
        wr_id: 7,
        sg_list: [sge(b, 0, first), sge(b, 20_000, SEND_LEN - first)].into(),
    };
    b.device.post_recv(b.qpn, recv).unwrap();
    a.device
        .post_send(
            a.qpn,
            SendWr::new(3, SendOp::Send, vec![sge(a, 0, SEND_LEN)]),
        )
        .unwrap();
    wait_for(a, 1)[0].result().expect("the send completes");
    let received = wait_for(b, 1);
    let got = received[0].result().expect("the receive completes");
    assert_eq!(got.byte_len(), SEND_LEN);
    let (head, tail) = a.buf[..SEND_LEN as usize].split_at(first as usize);
    assert_eq!(&b.buf[..first as usize], head);
    assert_eq!(&b.buf[20_000..20_000 + tail.len()], tail);
}

/// The payload bytes each of `a` and `b` wrote straight from the other's region.
fn direct(a: &Side, b: &Side) -> (u64, u64) {
    (
        a.device.stats().direct_payload_bytes,
        b.device.stats().direct_payload_bytes,
    )
}

/// An RDMA WRITE of `a`'s whole buffer (64 KiB) into `b`'s; returns the packets it took.
fn write_whole_buffer(a: &mut Side, b: &mut Side) -> u64 {
    for (i, byte) in a.buf.iter_mut().enumerate() {
        *byte = (i % 239) as u8;
    }
    let len = a.buf.len() as u32;
    let sent_before = a.device.counters().packets_sent;
    let write = SendOp::RdmaWrite {
        remote_addr: b.buf.as_ptr() as u64,
        rkey: b.rkey,
    };
    a.device
        .post_send(a.qpn, SendWr::new(4, write, vec![sge(a, 0, len)]))
        .unwrap();
    let done = wait_for(a, 1);
    assert_eq!(done[0].result().unwrap().opcode(), WcOpcode::RdmaWrite);
    assert_eq!(b.buf, a.buf);
    a.device.counters().packets_sent - sent_before
}

#[test]
fn qps_of_two_devices_of_one_process_send_64_kib_packets() {
    let (mut a, mut b) = (
        side(DeviceConfig::in_process()),
        side(DeviceConfig::in_process()),
    );
    connect(&a, &b);
    let (write, read) = write_then_read(&mut a, &mut b);
    assert_eq!((write, read), (1, 1), "60,000 bytes in one 64 KiB packet");
    // One copy, from region to region: B wrote the WRITE's bytes straight from A's
    // region, A the READ's responses straight from B's (no packet buffer between).
    assert_eq!(direct(&a, &b), (u64::from(LEN), u64::from(LEN)));
    send_across_two_sges(&mut a, &mut b);
    assert_eq!(
        direct(&a, &b),
        (u64::from(LEN), u64::from(LEN + SEND_LEN)),
        "the SEND's bytes too, into both receive SGEs"
    );
    for side in [&a, &b] {
        let (attr, _) = side.device.query_qp(side.qpn).unwrap();
        assert_eq!(
            attr.path_mtu,
            Mtu::Mtu1024,
            "the path MTU set stays reported"
        );
    }
    // 64 KiB in one packet of 65,568 bytes, more than an IP datagram holds: its receiver
    // still finds it on the QP's path (IBTA 9.6.1.5; the GRH it is given names the
    // sender), and takes it.
    assert_eq!(write_whole_buffer(&mut a, &mut b), 1);
    assert_eq!(b.device.counters().total_drops(), 0);
}

#[test]
fn qps_whose_packets_take_the_sockets_keep_path_mtu_packets() {
    let udp = |last| {
        DeviceConfig::udp(UdpConfig {
            address: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))),
            ..UdpConfig::default()
        })
    };
    let (mut a, mut b) = (side(udp(203)), side(udp(204)));
    a.device.set_in_process_shortcut(false);
    b.device.set_in_process_shortcut(false);
    connect(&a, &b);
    let (write, read) = write_then_read(&mut a, &mut b);
    assert_eq!((write, read), (59, 59), "60,000 bytes at a 1024 MTU");
    send_across_two_sges(&mut a, &mut b);
    assert_eq!(
        direct(&a, &b),
        (0, 0),
        "through the sockets: packets carry the bytes"
    );
}
