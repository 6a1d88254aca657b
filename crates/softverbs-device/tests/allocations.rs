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
