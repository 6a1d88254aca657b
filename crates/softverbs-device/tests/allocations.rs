//! Heap allocations per message on the in-process path, the work requests' own included: a
//! busy ping-pong between two devices of one process allocates nothing per round trip once
//! warm — building each SEND and receive request (their scatter/gather lists are held
//! inline: `SgeList`), the packets a run produces, the copy handed to the peer device and
//! the queue that carries it are reused from run to run. RDMA applications expect a post
//! that does not call `malloc`; an allocation per packet costs about as much as the
//! engine's parse of it, and freeing a retired request's list cost about 500 instructions
//! per round trip (`tests/instruction_count.rs`). A regression shows here as a count, not
//! as a time.
//!
//! Counted by a global allocator that counts the allocations of the test's own thread
//! while it has counting on (`common/counting_alloc.rs`; the devices' progress threads
//! are not counted: they handle nothing in a busy ping-pong, and what they do is not
//! per message).

mod common;

#[path = "common/counting_alloc.rs"]
mod counting_alloc;

use common::rc::{in_process_pair, recv_wr, send_wr, wait_one, Side};

/// One round trip: `a` sends 8 bytes to `b`, `b` answers; each reposts the receive its
/// peer's message took. Counted (when `counted`): building the two SENDs and two receives
/// as an application does, the verbs and the polls.
fn round_trip(a: &Side, b: &Side, n: u64, counted: bool) {
    for (from, to) in [(a, b), (b, a)] {
        counting_alloc::count(counted);
        let (send, recv) = (send_wr(from, n), recv_wr(to, n));
        from.device.post_send(from.qpn, send).unwrap();
        // Each a success (`wait_one` checks).
        wait_one(to);
        to.device.post_recv(to.qpn, recv).unwrap();
        wait_one(from);
        counting_alloc::count(false);
    }
}

/// Before work requests held their scatter/gather lists inline, each SEND and receive
/// built allocated its `Vec` (4 per round trip).
#[test]
fn a_ping_pong_allocates_nothing_per_round_trip_its_work_requests_included() {
    let (a, b) = in_process_pair();
    counting_alloc::assert_round_trips_allocate_nothing(|n, counted| {
        round_trip(&a, &b, n, counted)
    });
}

/// Two devices of this process that talk through their UDP sockets (RoCEv2 over
/// 127.0.0.`addresses`, the in-process shortcut off), each with a receive posted; with
/// `shared_memory`, each device's transport is the host transport (a UDP socket and an
/// inbox, which devices of this process do not use for each other), else the UDP
/// transport alone.
fn udp_pair(shared_memory: bool, addresses: [u8; 2]) -> (Side, Side) {
    use softverbs_device::{DeviceConfig, UdpConfig};
    use std::net::{IpAddr, Ipv4Addr};
    let udp = |last| DeviceConfig {
        shared_memory,
        ..DeviceConfig::udp(UdpConfig {
            address: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))),
            ..UdpConfig::default()
        })
    };
    let (a, b) = (
        common::rc::side(udp(addresses[0])),
        common::rc::side(udp(addresses[1])),
    );
    for side in [&a, &b] {
        side.device.set_in_process_shortcut(false);
    }
    common::rc::connect(&a, &b);
    for side in [&a, &b] {
        side.device.post_recv(side.qpn, recv_wr(side, 0)).unwrap();
    }
    (a, b)
}

/// Over UDP too: preparing each packet's headers and ICRC, grouping the run into
/// `sendmmsg(2)` messages (their addresses, iovecs, GSO controls and headers), the
/// `recvmmsg(2)` that takes the reply and the checks of what it took reuse their buffers.
/// Before, a round trip made 16 allocations on the polling thread (callgrind: 1,200
/// instructions of `malloc` and `free` per message on a ping-pong client).
#[test]
fn a_ping_pong_over_udp_allocates_nothing_per_round_trip() {
    let (a, b) = udp_pair(false, [207, 208]);
    counting_alloc::assert_round_trips_allocate_nothing(|n, counted| {
        round_trip(&a, &b, n, counted)
    });
}

/// Through the host transport (a UDP socket and a shared-memory inbox, the default), whose
/// send sorts the packets for its rings from those for the socket, likewise (before, 32
/// allocations per round trip). Not none at all: a destination with no inbox is looked
/// for again once a second (about a dozen allocations, building the path of the file it
/// would have), which is not per message: a round trip must allocate less than once in
/// two (a run as slow as 40 ms per round trip, a loaded debug build, would fail it).
#[test]
fn a_ping_pong_through_the_host_transport_allocates_nothing_per_message() {
    let (a, b) = udp_pair(true, [209, 210]);
    for n in 0..counting_alloc::WARMUP {
        round_trip(&a, &b, n, false);
    }
    let before = counting_alloc::allocations();
    for n in 0..counting_alloc::ROUNDS {
        round_trip(&a, &b, counting_alloc::WARMUP + n, true);
    }
    let allocations = counting_alloc::allocations() - before;
    println!(
        "{allocations} allocations in {} round trips",
        counting_alloc::ROUNDS
    );
    assert!(
        allocations < counting_alloc::ROUNDS / 2,
        "{allocations} allocations in {} round trips",
        counting_alloc::ROUNDS
    );
    let sent = a.device.transport_counters().map(|c| c.sent_packets);
    assert!(
        sent.is_some_and(|n| n > 0),
        "not through the socket: {sent:?}"
    );
}
