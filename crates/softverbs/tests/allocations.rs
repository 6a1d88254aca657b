//! Heap allocations of the safe API's post path: building a [`SendRequest`] or a
//! [`RecvRequest`] of one [`MrSlice`](softverbs::MrSlice), posting it and polling its
//! completion allocates nothing once warm. RDMA applications expect a post that does not
//! call `malloc`; the request's scatter/gather list holds its one entry inline
//! (`SgeList`), and the device below reuses its packets and queues (softverbs-device's
//! `tests/allocations.rs`).
//!
//! Counted by a global allocator that counts the allocations of the test's own thread
//! while it has counting on (`counting_alloc`; the devices' progress threads are not
//! counted: they handle nothing in a busy ping-pong, and what they do is not per
//! message).

mod common;

#[path = "../../softverbs-device/tests/common/counting_alloc.rs"]
mod counting_alloc;

use common::{in_process, rc_pair, Side, PATIENCE};
use softverbs::{RecvRequest, SendRequest, WcStatus, WorkCompletion};
use std::time::Instant;

/// The next completion of `side`, which must be a success, polled into an array (nothing
/// allocated); bounded in time.
fn wait_one(side: &Side) -> WorkCompletion {
    let deadline = Instant::now() + PATIENCE;
    let mut wcs = [WorkCompletion::default(); 1];
    loop {
        if side.cq.poll(&mut wcs).unwrap() == 1 {
            assert_eq!(wcs[0].status(), WcStatus::Success, "{:?}", wcs[0]);
            return wcs[0];
        }
        assert!(Instant::now() < deadline, "no completion");
    }
}

/// One round trip: `a` sends 8 bytes to `b`, `b` answers; each reposts the receive its
/// peer's message took. Counted (when `counted`): building the requests, the posts and
/// the polls.
fn round_trip(a: &Side, b: &Side, n: u64, counted: bool) {
    for (from, to) in [(a, b), (b, a)] {
        counting_alloc::count(counted);
        let send = SendRequest::send(n, &[from.mr.slice(1024..1032).unwrap()]);
        let recv = RecvRequest::new(n, &[to.mr.slice(0..64).unwrap()]);
        from.qp.post_send(send).unwrap();
        wait_one(to);
        to.qp.post_recv(recv).unwrap();
        wait_one(from);
        counting_alloc::count(false);
    }
}

/// Before requests held their scatter/gather lists inline, each built allocated a `Vec`
/// (4 per round trip).
#[test]
fn building_posting_and_completing_requests_allocates_nothing_per_round_trip() {
    let (a, b) = rc_pair(in_process(), in_process());
    for side in [&a, &b] {
        let first = RecvRequest::new(0, &[side.mr.slice(0..64).unwrap()]);
        side.qp.post_recv(first).unwrap();
    }
    counting_alloc::assert_round_trips_allocate_nothing(|n, counted| {
        round_trip(&a, &b, n, counted)
    });
}
