//! A flood of duplicates at a live QP during a verified ping-pong. The injector sits on
//! the path (the peer's own address, another UDP port: any process on the peer's host can
//! do this), so the path check lets its packets in and the responder's duplicate rules
//! meet them: IBTA 9.7.5.1.1 answers a duplicate SEND with an ACK, but a NIC coalesces
//! those ACKs, so a flood costs throughput, not the connection. Here 200,000 forged
//! duplicates may not starve the real traffic, may not be reflected one ACK each, and may
//! not grow the process's memory.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::rc::{connect, side, wait_for, Side, FIRST_PSN};
use softverbs_cq::WcOpcode;
use softverbs_device::{DeviceConfig, Endpoint, Transport, UdpConfig, UdpTransport};
use softverbs_proto::{RecvWr, SendOp, SendWr, Sge};
use softverbs_wire::{BthRepr, Opcode, PacketRepr, Psn, Qpn};

const FORGED: usize = 200_000;
const ROUNDS: usize = 300;
const LEN: usize = 64;

fn udp_side(last: u8) -> Side {
    side(DeviceConfig::udp(UdpConfig {
        address: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))),
        ..UdpConfig::default()
    }))
}

fn sge(side: &Side, offset: usize, len: usize) -> Sge {
    Sge {
        addr: side.buf.as_ptr() as u64 + offset as u64,
        length: len as u32,
        lkey: side.lkey,
    }
}

/// Resident set size of this process in bytes (`/proc/self/statm`, field 2).
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// One verified round: `from` sends `LEN` bytes of `pattern`, `to` receives them.
fn send_verified(from: &mut Side, to: &Side, wr_id: u64, pattern: u8) {
    to.device
        .post_recv(
            to.qpn,
            RecvWr {
                wr_id,
                sg_list: [sge(to, 8192, LEN)].into(),
            },
        )
        .unwrap();
    // The sender's previous send has completed: the device reads this range only after
    // the post below.
    for (i, byte) in from.buf[..LEN].iter_mut().enumerate() {
        *byte = pattern.wrapping_add(i as u8);
    }
    from.device
        .post_send(
            from.qpn,
            SendWr::new(wr_id, SendOp::Send, vec![sge(from, 0, LEN)]),
        )
        .unwrap();
    let sent = wait_for(from, 1);
    assert!(sent[0].result().is_ok(), "round {wr_id}: {sent:?}");
    let received = wait_for(to, 1);
    let done = received[0].result().expect("the real message is received");
    assert_eq!(done.opcode(), WcOpcode::Recv);
    assert_eq!(done.byte_len() as usize, LEN);
    for i in 0..LEN {
        assert_eq!(
            to.buf[8192 + i],
            pattern.wrapping_add(i as u8),
            "round {wr_id}, byte {i}"
        );
    }
}

#[test]
fn a_flood_of_on_path_duplicates_costs_throughput_not_the_connection() {
    let mut a = udp_side(215);
    let mut b = udp_side(216);
    connect(&a, &b);
    // The first round consumes PSN FIRST_PSN both ways: from then on a SEND with that PSN
    // is a duplicate for b.
    send_verified(&mut a, &b, 0, 1);
    send_verified(&mut b, &a, 0, 2);
    let resident_before = resident_bytes();
    let acks_before = b.device.counters().acks_sent;

    let injector = UdpTransport::bind(UdpConfig {
        address: Some(a.device.address()),
        port: 0,
        ..UdpConfig::default()
    })
    .expect("an injector on the peer's address, another port");
    let repr = PacketRepr {
        bth: BthRepr {
            opcode: Opcode::RC_SEND_ONLY,
            dest_qp: Qpn::new(b.qpn),
            psn: Psn::new(FIRST_PSN),
            ack_req: true,
            ..BthRepr::default()
        },
        ..PacketRepr::default()
    };
    let mut template = vec![0u8; repr.buffer_len(LEN)];
    let len = repr.emit(&[0xee; LEN], &mut template).unwrap();
    template.truncate(len);
    let to = Endpoint::rocev2(b.device.address());
    let flooding = Arc::new(AtomicBool::new(true));
    let flood = {
        let flooding = flooding.clone();
        std::thread::spawn(move || {
            let mut sent = 0;
            let deadline = Instant::now() + Duration::from_secs(60);
            while sent < FORGED && Instant::now() < deadline {
                let mut packet = template.clone();
                if injector.send(&to, 0xC0DE, &mut packet).is_ok() {
                    sent += 1;
                }
            }
            flooding.store(false, Ordering::Relaxed);
            sent
        })
    };

    let started = Instant::now();
    let mut rounds = 0;
    while rounds < ROUNDS || (flooding.load(Ordering::Relaxed) && rounds < 100 * ROUNDS) {
        let round = rounds as u64 + 1;
        send_verified(&mut a, &b, round, round as u8);
        send_verified(&mut b, &a, round, !round as u8);
        rounds += 1;
    }
    let sent = flood.join().unwrap();
    let elapsed = started.elapsed();
    assert_eq!(
        sent, FORGED,
        "the injector sent everything within its minute"
    );
    // Let b take whatever the socket still holds, then one more verified round.
    std::thread::sleep(Duration::from_millis(200));
    send_verified(&mut a, &b, 1 << 20, 0x33);

    let counters = b.device.counters();
    let acks = counters.acks_sent - acks_before;
    eprintln!(
        "{rounds} verified rounds in {elapsed:?} beside {sent} forged duplicates; b: {counters}"
    );
    assert!(
        counters.duplicates_received >= 1000,
        "the duplicates reached the responder: {counters}"
    );
    // Each real SEND from a gets its ACK; the duplicates may add one per expected PSN (a
    // round moves it) and one per reply window (`EngineConfig::duplicate_reply_window_ns`,
    // at most 65.5 µs), never one each.
    let real = rounds as u64 + 1;
    let windows = elapsed.as_nanos() as u64 / 65_536 + 1;
    assert!(
        acks <= real + (real + windows) + 100,
        "{acks} ACKs for {} duplicates, {rounds} rounds and {windows} windows: the flood is \
         reflected",
        counters.duplicates_received
    );
    assert!(counters.duplicate_replies_suppressed > 0, "{counters}");
    let grown = resident_bytes().saturating_sub(resident_before);
    assert!(
        grown < 64 << 20,
        "the process grew by {grown} bytes under the flood"
    );
}
