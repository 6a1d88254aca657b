//! Packets move in batches over UDP: a run's packets leave in one `sendmmsg(2)`, a burst
//! is taken off the socket by one `recvmmsg(2)` and handled in one run, so the responder
//! acknowledges the burst with one ACK (IBTA vol. 1 §9.7.5.1.1: an ACK acknowledges every
//! packet up to its PSN) instead of one per packet.

mod common;

use common::rc::{connect, connect_to, recv_wr, send_wr, side, wait_for, Side, FIRST_PSN};
use softverbs_cq::{WcOpcode, WcStatus};
use softverbs_device::{
    DeviceConfig, Endpoint, OutgoingPacket, Transport, UdpConfig, UdpTransport,
};
use softverbs_proto::{Mtu, SendOp, SendWr, Sge};
use softverbs_wire::icrc::IpHeaderInfo;
use softverbs_wire::{AethRepr, BthRepr, Opcode, PacketRepr, Qpn};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

/// A UDP device on 127.0.0.`last`, port 4791.
fn udp(last: u8) -> DeviceConfig {
    udp_at(Ipv4Addr::new(127, 0, 0, last))
}

/// A UDP device on `address`, port 4791.
fn udp_at(address: Ipv4Addr) -> DeviceConfig {
    DeviceConfig::udp(UdpConfig {
        address: Some(IpAddr::V4(address)),
        ..UdpConfig::default()
    })
}

/// `rounds` times, `per_round` RDMA WRITEs of the whole 64 KiB buffer (64 packets each at
/// the 1024-byte path MTU `connect` sets) posted at once, each round waited for.
fn writes(a: &Side, b: &Side, rounds: u64, per_round: u64) {
    writes_of(a, b, rounds, per_round, a.buf.len() as u32);
}

/// An RDMA WRITE of `len` bytes from the start of `a`'s buffer to the start of `b`'s.
fn write_wr(a: &Side, b: &Side, wr_id: u64, len: u32) -> SendWr {
    SendWr::new(
        wr_id,
        SendOp::RdmaWrite {
            remote_addr: b.buf.as_ptr() as u64,
            rkey: b.rkey,
        },
        vec![Sge {
            addr: a.buf.as_ptr() as u64,
            length: len,
            lkey: a.lkey,
        }],
    )
}

/// [`writes`] of `len` bytes each.
fn writes_of(a: &Side, b: &Side, rounds: u64, per_round: u64, len: u32) {
    for round in 0..rounds {
        for i in 0..per_round {
            let wr = write_wr(a, b, round * per_round + i, len);
            a.device.post_send(a.qpn, wr).unwrap();
        }
        let done = wait_for(a, per_round as usize);
        assert!(
            done.iter().all(|wc| wc.status() == WcStatus::Success),
            "{done:?}"
        );
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
}

/// One-packet WRITEs, 64 posted at once: each asks for an ACK, and the ACKs of the packets
/// handled in one run coalesce into one. The responder has no progress thread and receives
/// when polled, a moment after the requester sent what its window allowed, so each of its
/// runs takes a burst whatever the machine's load (a progress thread woken by a burst's
/// first packet, on a loaded machine, may take it one packet at a time: 194 to 256 ACKs
/// for 256 WRITEs in 2 of 15 runs with both cores busy).
#[test]
fn the_acks_of_one_packet_writes_received_in_one_run_coalesce() {
    let a = side(udp_at(Ipv4Addr::new(127, 0, 3, 7)));
    let b = side(DeviceConfig {
        progress_thread: false,
        ..udp_at(Ipv4Addr::new(127, 0, 3, 8))
    });
    a.device.set_in_process_shortcut(false);
    b.device.set_in_process_shortcut(false);
    connect(&a, &b);
    const WRITES: u64 = 64;
    for round in 0..4 {
        for i in 0..WRITES {
            let wr = write_wr(&a, &b, round * WRITES + i, 512);
            a.device.post_send(a.qpn, wr).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut done = 0;
        let mut wcs = [softverbs_cq::WorkCompletion::default(); 64];
        while done < WRITES as usize {
            assert!(
                Instant::now() < deadline,
                "{done} of {WRITES} WRITEs completed"
            );
            // What the window let out (and, after an ACK, the requester's progress thread)
            // is on its way: taken in one run.
            std::thread::sleep(Duration::from_millis(2));
            b.device.progress();
            let n = a.cq.poll(&mut wcs).unwrap();
            assert!(wcs[..n].iter().all(|wc| wc.status() == WcStatus::Success));
            done += n;
        }
    }
    let counters = b.device.counters();
    let (packets, acks) = (counters.packets_received, counters.acks_sent);
    assert!(packets >= 4 * WRITES, "{packets} packets received");
    // One run per packet (the code before batching) sends exactly one ACK each.
    assert!(
        acks * 4 <= packets,
        "{acks} ACKs for {packets} one-packet WRITEs: ACKs of a batch did not coalesce"
    );
}

/// Polls `side` (driving progress on an empty CQ, as a busy-polling application does) until
/// a receive completion arrives; returns how many send completions came with it.
fn wait_for_receive(side: &Side) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut wcs = [softverbs_cq::WorkCompletion::default(); 4];
    let mut sends = 0;
    loop {
        let k = side.cq.poll(&mut wcs).unwrap();
        for wc in &wcs[..k] {
            assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
            if wc
                .result()
                .is_ok_and(|done| done.opcode() == softverbs_cq::WcOpcode::Recv)
            {
                return sends;
            }
            sends += 1;
        }
        if k == 0 {
            side.device.progress();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no receive completion"
        );
    }
}

/// A busy-polling ping-pong of 8-byte SENDs: the ACK of the peer's SEND, received in the
/// application's poll, waits for the application's reply and leaves with it in one system
/// call (IBTA vol. 1 §9.7.5.1.1: a responder may delay and coalesce its ACKs), so a round
/// trip costs each side one send call, not two — and every SEND is still acknowledged.
#[test]
fn a_ping_pong_sends_the_reply_and_the_ack_it_overtakes_in_one_system_call() {
    const ROUNDS: u64 = 1000;
    let a = side(udp(227));
    let b = side(udp(228));
    a.device.set_in_process_shortcut(false);
    b.device.set_in_process_shortcut(false);
    connect(&a, &b);
    let recv = |s: &Side, id: u64| {
        s.device
            .post_recv(
                s.qpn,
                softverbs_proto::RecvWr {
                    wr_id: id,
                    sg_list: [Sge {
                        addr: s.buf.as_ptr() as u64 + 4096,
                        length: 64,
                        lkey: s.lkey,
                    }]
                    .into(),
                },
            )
            .unwrap();
    };
    let send = |s: &Side, id: u64| {
        let wr = SendWr::new(
            id,
            SendOp::Send,
            vec![Sge {
                addr: s.buf.as_ptr() as u64,
                length: 8,
                lkey: s.lkey,
            }],
        );
        s.device.post_send(s.qpn, wr).unwrap();
    };
    recv(&a, 0);
    recv(&b, 0);
    let (a0, b0) = (
        a.device.transport_counters().unwrap(),
        b.device.transport_counters().unwrap(),
    );
    let (mut a_sends, mut b_sends) = (0, 0);
    for id in 0..ROUNDS {
        send(&a, id);
        b_sends += wait_for_receive(&b);
        recv(&b, id + 1);
        send(&b, id);
        a_sends += wait_for_receive(&a);
        recv(&a, id + 1);
    }
    // The last ACKs leave with the progress threads; every SEND completes.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut wcs = [softverbs_cq::WorkCompletion::default(); 16];
    while (a_sends < ROUNDS as usize || b_sends < ROUNDS as usize)
        && std::time::Instant::now() < deadline
    {
        a_sends += a.cq.poll(&mut wcs).unwrap();
        b_sends += b.cq.poll(&mut wcs).unwrap();
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    assert_eq!((a_sends, b_sends), (ROUNDS as usize, ROUNDS as usize));
    let (a1, b1) = (
        a.device.transport_counters().unwrap(),
        b.device.transport_counters().unwrap(),
    );
    let alone_sends = [&a, &b].map(|s| s.device.stats().progress_ack_sends);
    for ((name, before, after), alone) in
        [("a", a0, a1), ("b", b0, b1)].into_iter().zip(alone_sends)
    {
        let calls = after.send_calls - before.send_calls;
        let packets = after.sent_packets - before.sent_packets;
        let context = format!(
            "{name}: {calls} send calls for {packets} packets, {ROUNDS} rounds, \
             {alone} sends of ACKs alone by the progress thread"
        );
        // A SEND and an ACK per round each way.
        assert!(packets >= 2 * ROUNDS, "{context}");
        // One call per round. On a loaded machine an application thread kept off the CPU
        // leaves packets to the progress thread, which sends their ACKs alone (and those it
        // held past 100 µs): those calls are counted and allowed, but a device that sends
        // the ACK before the reply (about one call more per round) still fails.
        assert!(alone * 2 < ROUNDS, "{context}");
        assert!(calls <= ROUNDS + alone + ROUNDS / 100, "{context}");
    }
}

/// The peer of [`a_held_ack_leaves_ahead_of_the_reply_it_waited_for`]: a RoCEv2
/// endpoint the test plays itself (a UDP transport of its own on 127.0.0.230, which fills
/// the ICRC of what it sends), so that it sees the device's datagrams in the order they
/// leave.
const PEER_QPN: u32 = 0x51;

fn peer_sends(peer: &UdpTransport, to: &Side, opcode: Opcode, psn: u32, payload: &[u8]) {
    let repr = PacketRepr {
        bth: BthRepr {
            dest_qp: Qpn::new(to.qpn),
            ..common::bth(opcode, psn)
        },
        // An ACK: syndrome ACK, MSN 0 (the completer does not read the MSN).
        aeth: (opcode == Opcode::RC_ACKNOWLEDGE).then(AethRepr::default),
        ..PacketRepr::default()
    };
    let to = Endpoint::rocev2(to.device.address());
    common::send(peer, &to, common::emit(&repr, payload));
}

/// The opcodes and PSNs of the packets that reach `peer` within `wait` (at most `max`),
/// each with its IPv4 ID: `k` for segment `k` of a GSO message (the module documentation
/// of `softverbs_device::udp`), 0 for a datagram of its own.
fn peer_receives(peer: &UdpTransport, max: usize, wait: Duration) -> Vec<(u8, u32, u16)> {
    let deadline = Instant::now() + wait;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 9000];
    while got.len() < max {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        if let Some(packet) = peer.recv(&mut buf, Some(left)).expect("the peer receives") {
            let bth = &buf[..packet.len];
            let psn = u32::from_be_bytes([0, bth[9], bth[10], bth[11]]);
            let id = match packet.ip {
                IpHeaderInfo::V4 { id, .. } => id,
                IpHeaderInfo::V6 { .. } => 0,
            };
            got.push((bth[0], psn, id));
        }
    }
    got
}

/// How the held ACK left in [`held_ack_rounds`]'s rounds.
#[derive(Default)]
struct HeldAcks {
    /// Rounds whose ACK waited for the reply and left in the reply's system call.
    held: u32,
    /// Of those, rounds whose ACK rode in the reply's datagram, behind it.
    behind: u32,
}

/// `ROUNDS` rounds of a ping-pong between a device on 127.0.0.`last` (offload `offload`)
/// and a RoCEv2 peer the test plays (on 127.0.0.`peer_last`): the peer's SEND, received in
/// the application's poll, whose ACK the device holds (IBTA vol. 1 §9.7.5.1.1 lets a
/// responder delay its ACKs) for the reply the application posts. Asserts that each round
/// brings the peer both, and that a held ACK's send call is the reply's: either the ACK
/// ahead of the reply, or (`behind` allowed) right behind it in one GSO message, segment 1
/// of the reply's 0.
fn held_ack_rounds(last: u8, peer_last: u8, offload: bool, behind: bool) -> HeldAcks {
    const ROUNDS: u32 = 50;
    // Over UDP only: with shared memory on, the device leads with the ACK whatever the
    // route (its records go through a ring where the route is one).
    let a = side(DeviceConfig {
        shared_memory: false,
        ..DeviceConfig::udp(UdpConfig {
            address: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))),
            offload,
            ..UdpConfig::default()
        })
    });
    a.device.set_in_process_shortcut(false);
    let peer = UdpTransport::bind(UdpConfig {
        address: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, peer_last))),
        ..UdpConfig::default()
    })
    .expect("the peer binds its address, port 4791");
    let peer_gid = softverbs_device::Gid::from_ip(peer.local().addr()).octets();
    connect_to(&a, peer_gid, PEER_QPN, 0, Mtu::Mtu1024);
    let mut seen = HeldAcks::default();
    let (send, ack) = (Opcode::RC_SEND_ONLY.value(), Opcode::RC_ACKNOWLEDGE.value());
    for round in 0..ROUNDS {
        let psn = FIRST_PSN + round;
        a.device
            .post_recv(a.qpn, recv_wr(&a, u64::from(round)))
            .unwrap();
        let alone_before = a.device.stats().progress_ack_sends;
        peer_sends(&peer, &a, Opcode::RC_SEND_ONLY, psn, b"ping!!!!");
        // The application's poll receives the SEND and holds its ACK.
        assert_eq!(wait_for_receive(&a), 0);
        a.device
            .post_send(a.qpn, send_wr(&a, u64::from(round)))
            .unwrap();
        let got = peer_receives(&peer, 2, Duration::from_secs(5));
        let alone = a.device.stats().progress_ack_sends - alone_before;
        // The ACK leads, in a datagram of its own: held for the reply or (on a loaded
        // machine that kept this thread off the CPU past the hold's limit) sent alone by
        // the progress thread, counted; or it rides behind the reply, in its datagram.
        match got.as_slice() {
            [(a0, p0, 0), (s1, p1, 0)] if (*a0, *s1) == (ack, send) && *p0 == psn && *p1 == psn => {
            }
            [(s0, p0, 0), (a1, p1, 1)]
                if behind && (*s0, *a1) == (send, ack) && *p0 == psn && *p1 == psn =>
            {
                seen.behind += 1;
            }
            _ => panic!("round {round}: {got:?} (ACK {ack:#x}, SEND {send:#x}, PSN {psn})"),
        }
        if alone == 0 {
            seen.held += 1;
        }
        // Acknowledge the reply; its send completion arrives.
        peer_sends(&peer, &a, Opcode::RC_ACKNOWLEDGE, psn, &[]);
        let done = wait_for(&a, 1);
        assert_eq!(done[0].status(), WcStatus::Success, "{done:?}");
    }
    assert!(
        seen.held * 2 >= ROUNDS,
        "only {} of {ROUNDS} rounds held the ACK for the reply",
        seen.held
    );
    seen
}

/// A NIC acknowledges a request before its application can even see it, so the
/// requester's send completion never comes after the receive completion of the reply, and
/// programs count on it: `ib_send_lat -e` (perftest 4.5) waits on one channel for both
/// CQs' events and hangs if the reply's comes first (seen in
/// `softverbs-capi/tests/verbs_programs.rs`). Where the peer may take the ACK and the reply
/// in separate receives (here: no GSO; elsewhere, a peer not on loopback), the held ACK
/// leads, in the reply's system call.
#[test]
fn a_held_ack_leaves_ahead_of_the_reply_where_the_peer_may_take_them_apart() {
    let seen = held_ack_rounds(229, 230, false, false);
    assert_eq!(seen.behind, 0);
}

/// To a peer on loopback with GSO, the held ACK rides in the reply's datagram, behind it
/// (segment 1 of a GSO message): one datagram through the kernel each way of a ping-pong
/// instead of two. The peer, a softverbs device, takes the datagram whole (GRO) in one run
/// and completes the ACK's send first
/// ([`a_reply_and_the_ack_behind_it_in_one_datagram_complete_the_send_first`]).
#[test]
fn a_held_ack_rides_behind_the_reply_in_its_datagram_to_a_loopback_peer() {
    let seen = held_ack_rounds(231, 232, true, true);
    assert_eq!(
        seen.behind, seen.held,
        "every held ACK rides behind its reply"
    );
}

/// The receiving end of [`a_held_ack_rides_behind_the_reply_in_its_datagram_to_a_loopback_peer`]:
/// the peer's reply and, behind it in one GSO datagram, the ACK of the device's SEND. The
/// device completes the SEND before the receive of the reply, in the order the wire gives
/// when the ACK leads (IBTA orders completions within a work queue only; programs count
/// on this one, see [`a_held_ack_leaves_ahead_of_the_reply_where_the_peer_may_take_them_apart`]).
#[test]
fn a_reply_and_the_ack_behind_it_in_one_datagram_complete_the_send_first() {
    const ROUNDS: u32 = 20;
    let a = side(udp(233));
    a.device.set_in_process_shortcut(false);
    let peer = UdpTransport::bind(UdpConfig {
        address: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 234))),
        ..UdpConfig::default()
    })
    .expect("the peer binds 127.0.0.234:4791");
    let peer_gid = softverbs_device::Gid::from_ip(peer.local().addr()).octets();
    connect_to(&a, peer_gid, PEER_QPN, 0, Mtu::Mtu1024);
    let to = Endpoint::rocev2(a.device.address());
    for round in 0..ROUNDS {
        let psn = FIRST_PSN + round;
        a.device
            .post_recv(a.qpn, recv_wr(&a, u64::from(round)))
            .unwrap();
        a.device
            .post_send(a.qpn, send_wr(&a, u64::from(round)))
            .unwrap();
        // The device's SEND (after the ACK of the last reply, if that left on its own).
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let got = peer_receives(&peer, 1, Duration::from_secs(5));
            assert!(
                got.len() == 1 && Instant::now() < deadline,
                "round {round}: no SEND from the device ({got:?})"
            );
            if got[0].0 == Opcode::RC_SEND_ONLY.value() {
                break;
            }
        }
        // The reply, then the ACK of the device's SEND: one GSO message of two segments
        // (24 and 20 bytes).
        let gso_before = peer.counters().gso_sends;
        let packet = |opcode: Opcode, payload: &[u8]| {
            common::emit(
                &PacketRepr {
                    bth: BthRepr {
                        dest_qp: Qpn::new(a.qpn),
                        ..common::bth(opcode, psn)
                    },
                    aeth: (opcode == Opcode::RC_ACKNOWLEDGE).then(AethRepr::default),
                    ..PacketRepr::default()
                },
                payload,
            )
        };
        let (mut reply, mut ack) = (
            packet(Opcode::RC_SEND_ONLY, b"pong!!!!"),
            packet(Opcode::RC_ACKNOWLEDGE, &[]),
        );
        let mut batch = [
            OutgoingPacket::new(to, 0xC000, &mut reply),
            OutgoingPacket::new(to, 0xC000, &mut ack),
        ];
        assert_eq!(peer.send_batch(&mut batch), 2);
        assert_eq!(
            peer.counters().gso_sends - gso_before,
            1,
            "round {round}: one GSO message"
        );
        let done = wait_for(&a, 2);
        let kinds: Vec<_> = done
            .iter()
            .map(|wc| wc.result().map(|wc| wc.opcode()).ok())
            .collect();
        assert_eq!(
            kinds,
            [Some(WcOpcode::Send), Some(WcOpcode::Recv)],
            "round {round}: {done:?}"
        );
    }
}
