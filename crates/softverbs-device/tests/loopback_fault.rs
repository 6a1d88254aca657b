//! The in-process transport and the fault-injection middleware.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{recv_one, send_only, PATIENCE};
use softverbs_device::loopback::LoopbackNetwork;
use softverbs_device::{
    Endpoint, FaultConfig, FaultCounters, FaultTransport, Transport, TransportCounters,
};
use softverbs_wire::PacketRepr;

fn psn_of(packet: &[u8]) -> u32 {
    PacketRepr::parse(packet).unwrap().0.bth.psn.value()
}

/// Drains `transport` (waiting `wait` for each packet) and returns the PSNs in order.
fn drain_psns(transport: &impl Transport, wait: Duration, limit: usize) -> Vec<u32> {
    let mut buf = [0u8; 256];
    let mut psns = Vec::new();
    for _ in 0..limit {
        match transport.recv(&mut buf, Some(wait)).unwrap() {
            Some(received) => psns.push(psn_of(&buf[..received.len])),
            None => break,
        }
    }
    psns
}

// The in-process transport keeps order: two senders interleaving 500 packets each to one
// receiver arrive exactly in send order, ICRC verified, with per-sender addresses.
#[test]
fn loopback_delivers_in_order() {
    let network = LoopbackNetwork::new();
    let a = network.attach_next().unwrap();
    let b = network.attach_next().unwrap();
    let c = network.attach_next().unwrap();
    assert_eq!(network.endpoints(), vec![a.local(), b.local(), c.local()]);
    assert_eq!(a.local().to_string(), "127.0.0.1:4791");
    for psn in 0..1000u32 {
        let from = if psn % 2 == 0 { &a } else { &b };
        common::send(from, &c.local(), send_only(psn, b"ordered"));
    }
    assert_eq!(c.pending(), 1000);
    let mut buf = [0u8; 128];
    for psn in 0..1000u32 {
        let received = recv_one(&c, &mut buf, "in order");
        assert_eq!(psn_of(&buf[..received.len]), psn);
        assert!(received.icrc_checked);
        let expected = if psn % 2 == 0 { a.local() } else { b.local() };
        assert_eq!(received.from.addr(), expected.addr());
        assert_eq!(received.from.port(), 0xC000);
    }
    let counters = c.counters();
    assert_eq!(counters.received_packets, 1000);
    assert_eq!(counters.received_bytes, 1000 * 24); // BTH 12 + "ordered" 7 + pad 1 + ICRC 4
}

// A receiver blocked in recv is woken by a send from another thread.
#[test]
fn loopback_wakes_a_blocked_receiver() {
    let network = LoopbackNetwork::new();
    let a = network.attach_next().unwrap();
    let b = Arc::new(network.attach_next().unwrap());
    let to = b.local();
    let receiver = {
        let b = Arc::clone(&b);
        std::thread::spawn(move || {
            let mut buf = [0u8; 128];
            b.recv(&mut buf, Some(PATIENCE))
                .unwrap()
                .map(|r| psn_of(&buf[..r.len]))
        })
    };
    std::thread::sleep(Duration::from_millis(20));
    common::send(&a, &to, send_only(9, b"wake"));
    assert_eq!(receiver.join().unwrap(), Some(9));
}

// Like UDP to a closed port, a packet to an endpoint nobody attached (or one detached by
// dropping its transport) is lost and counted; a full mailbox drops too.
#[test]
fn loopback_counts_undeliverable_packets() {
    let network = LoopbackNetwork::with_capacity(2);
    let a = network.attach_next().unwrap();
    let b = network.attach_next().unwrap();
    let b_endpoint = b.local();
    assert!(network.attach(b_endpoint).is_err(), "attached twice");
    for psn in 0..3 {
        common::send(&a, &b_endpoint, send_only(psn, b"full"));
    }
    assert_eq!(b.pending(), 2);
    drop(b);
    common::send(&a, &b_endpoint, send_only(3, b"gone"));
    let TransportCounters {
        sent_packets,
        dropped_undeliverable,
        ..
    } = a.counters();
    assert_eq!((sent_packets, dropped_undeliverable), (4, 2));
    // The address is free again.
    let again = network.attach(b_endpoint).unwrap();
    assert_eq!(again.pending(), 0);
}

/// 1000 packets A → B through a fault layer seeded with `seed`: the PSNs B receives, the
/// fault counters, and B's transport counters.
fn faulty_run(seed: u64) -> (Vec<u32>, FaultCounters, TransportCounters) {
    let network = LoopbackNetwork::new();
    let config = FaultConfig::new();
    config.set_drop(0.10);
    config.set_duplicate(0.05);
    config.set_corrupt(0.05);
    let a = FaultTransport::new(network.attach_next().unwrap(), Arc::clone(&config), seed);
    let b = network.attach_next().unwrap();
    for psn in 0..1000 {
        common::send(&a, &b.local(), send_only(psn, b"faulty link"));
    }
    let psns = drain_psns(&b, Duration::ZERO, 2000);
    (psns, a.fault_counters(), b.counters())
}

// STYLE habit 6 (seeded faults, replayable): a fixed seed gives exactly the same drops,
// duplicates and corruptions every run (pinned counts), every corruption is caught by
// the receiver's ICRC check (reference §1.7), and the arithmetic adds up.
#[test]
fn fault_middleware_with_a_fixed_seed_is_deterministic() {
    let (psns, faults, received) = faulty_run(42);
    assert_eq!(faulty_run(42), (psns.clone(), faults, received));
    assert_eq!(faults.packets, 1000);
    // Pinned: the decisions of ChaCha8 seed 42 for these rules.
    assert_eq!(
        (faults.dropped, faults.duplicated, faults.corrupted),
        PINNED_SEED_42,
        "{faults:?}"
    );
    assert_eq!((faults.delayed, faults.reordered), (0, 0));
    // Every packet that was not dropped arrived once, plus once more if duplicated; a
    // corrupted packet (and its duplicate) failed the ICRC.
    let arrived = faults.packets - faults.dropped + faults.duplicated;
    assert_eq!(
        received.received_packets + received.dropped_bad_icrc,
        arrived
    );
    assert!(received.dropped_bad_icrc >= faults.corrupted);
    assert_eq!(psns.len() as u64, received.received_packets);
    assert!(psns.windows(2).all(|w| w[0] <= w[1]), "order is kept");
    // A different seed makes different decisions.
    assert_ne!(faulty_run(43).1, faults);
}

/// (dropped, duplicated, corrupted) of 1000 packets at 10 % / 5 % / 5 % with seed 42.
const PINNED_SEED_42: (u64, u64, u64) = (86, 51, 38);

// Rules switch at run time: probability 1 drops everything, 0 nothing, and disabling
// keeps the probabilities for later.
#[test]
fn fault_rules_switch_at_run_time() {
    let network = LoopbackNetwork::new();
    let config = FaultConfig::new();
    let a = FaultTransport::new(network.attach_next().unwrap(), Arc::clone(&config), 7);
    let b = network.attach_next().unwrap();
    let burst = |first: u32| {
        for psn in first..first + 10 {
            common::send(&a, &b.local(), send_only(psn, b"switch"));
        }
        drain_psns(&b, Duration::ZERO, 100).len()
    };
    assert_eq!(burst(0), 10);
    config.set_drop(1.0);
    assert_eq!(burst(10), 0);
    config.set_enabled(false);
    assert_eq!(burst(20), 10);
    config.set_enabled(true);
    assert_eq!(burst(30), 0);
    config.clear();
    config.set_duplicate(1.0);
    assert_eq!(burst(40), 20);
    config.clear();
    config.set_corrupt(1.0);
    assert_eq!(burst(50), 0);
    assert_eq!(b.counters().dropped_bad_icrc, 10);
    let counters = a.fault_counters();
    assert_eq!(
        (counters.dropped, counters.duplicated, counters.corrupted),
        (20, 10, 10)
    );
}

// Delay holds a packet for the configured time and recv (on the sending side's fault
// layer or anywhere else) releases it when due; reorder swaps a packet with its successor.
#[test]
fn fault_middleware_delays_and_reorders() {
    let network = LoopbackNetwork::new();
    let config = FaultConfig::new();
    let a = FaultTransport::new(network.attach_next().unwrap(), Arc::clone(&config), 1);
    let b = network.attach_next().unwrap();

    config.set_delay(1.0, Duration::from_millis(30));
    let started = Instant::now();
    common::send(&a, &b.local(), send_only(1, b"late"));
    assert_eq!(a.held(), 1);
    assert_eq!(drain_psns(&b, Duration::ZERO, 10), Vec::<u32>::new());
    // The sender's progress loop sits in recv; that releases the packet when due.
    let mut buf = [0u8; 64];
    assert_eq!(
        a.recv(&mut buf, Some(Duration::from_millis(100))).unwrap(),
        None
    );
    assert!(started.elapsed() >= Duration::from_millis(30));
    assert_eq!(a.held(), 0);
    assert_eq!(drain_psns(&b, Duration::ZERO, 10), vec![1]);

    config.clear();
    config.set_reorder(0.5, Duration::from_secs(10));
    for psn in 10..30 {
        common::send(&a, &b.local(), send_only(psn, b"swap"));
    }
    a.release_all().unwrap();
    let psns = drain_psns(&b, Duration::ZERO, 100);
    let mut sorted = psns.clone();
    sorted.sort();
    assert_eq!(sorted, (10..30).collect::<Vec<_>>(), "nothing lost");
    assert_ne!(psns, sorted, "some packets were reordered");
    let counters = a.fault_counters();
    assert!(counters.reordered > 0);
    assert_eq!(counters.released, counters.reordered + counters.delayed);
}

// Faults also wrap the UDP transport (any Transport): a corrupted datagram on a real
// socket is dropped by the receiving socket transport's ICRC check.
#[test]
fn fault_middleware_wraps_udp() {
    use softverbs_device::{UdpConfig, UdpTransport};
    let bind = |addr: &str| {
        UdpTransport::bind(UdpConfig {
            address: Some(addr.parse().unwrap()),
            port: 0,
            ..UdpConfig::default()
        })
        .unwrap()
    };
    let config = FaultConfig::new();
    config.set_corrupt(1.0);
    let a = FaultTransport::new(bind("127.0.0.30"), Arc::clone(&config), 5);
    let b = bind("127.0.0.31");
    let to: Endpoint = b.local();
    common::send(&a, &to, send_only(1, b"bit flip"));
    config.clear();
    common::send(&a, &to, send_only(2, b"clean"));
    assert_eq!(drain_psns(&b, Duration::from_millis(500), 10), vec![2]);
    assert_eq!(b.counters().dropped_bad_icrc, 1);
}
