//! Heap allocations per message on the in-process path: a busy ping-pong between two
//! devices of one process allocates nothing per round trip once warm — the packets a run
//! produces, the copy handed to the peer device and the queue that carries it are reused
//! from run to run. An allocation per packet costs about as much as the engine's parse of
//! it; a regression shows here as a count, not as a time.
//!
//! Counted by a global allocator that counts the allocations of the test's own thread
//! while `COUNTING` is set (the devices' progress threads are not counted: they handle
//! nothing in a busy ping-pong, and what they do is not per message). The work requests
//! are built before counting starts: their scatter/gather lists are the caller's.

mod common;

use common::rc::{in_process_pair, recv_wr, send_wr, wait_one, Side};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.try_with(Cell::get).unwrap_or(false) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.try_with(Cell::get).unwrap_or(false) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Round trips before counting (queues and tables reach their size).
const WARMUP: u64 = 200;
/// Round trips counted.
const ROUNDS: u64 = 1_000;

/// One round trip: `a` sends 8 bytes to `b`, `b` answers; each reposts the receive its
/// peer's message took. Only the verbs and the polls are counted.
fn round_trip(a: &Side, b: &Side, n: u64, counted: bool) {
    for (from, to) in [(a, b), (b, a)] {
        let (send, recv) = (send_wr(from, n), recv_wr(to, n));
        COUNTING.with(|c| c.set(counted));
        from.device.post_send(from.qpn, send).unwrap();
        // Each a success (`wait_one` checks).
        wait_one(to);
        to.device.post_recv(to.qpn, recv).unwrap();
        wait_one(from);
        COUNTING.with(|c| c.set(false));
    }
}

#[test]
fn an_in_process_ping_pong_allocates_nothing_per_round_trip() {
    let (a, b) = in_process_pair();
    for n in 0..WARMUP {
        round_trip(&a, &b, n, false);
    }
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for n in 0..ROUNDS {
        round_trip(&a, &b, WARMUP + n, true);
    }
    let per_round_trip = (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / ROUNDS as f64;
    println!("allocations per round trip: {per_round_trip:.2}");
    assert!(
        per_round_trip < 0.05,
        "{per_round_trip:.2} allocations per round trip"
    );
}
