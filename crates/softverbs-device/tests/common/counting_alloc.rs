//! The global allocator of the allocation tests (softverbs-device's, the safe API's and the
//! drop-in's `tests/allocations.rs`, each of which includes this file and nothing else
//! does): the system allocator, counting the allocations (and reallocations) a thread makes
//! while it has counting on, each thread its own (tests of one binary run on threads of
//! their own at once: one's count never includes another's).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNTED: Cell<u64> = const { Cell::new(0) };
}

impl Counting {
    fn count(&self) {
        if COUNTING.try_with(Cell::get).unwrap_or(false) {
            let _ = COUNTED.try_with(|counted| counted.set(counted.get() + 1));
        }
    }
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.count();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.count();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Turns counting on or off for this thread.
pub fn count(on: bool) {
    COUNTING.with(|c| c.set(on));
}

/// The allocations this thread counted so far.
pub fn allocations() -> u64 {
    COUNTED.with(Cell::get)
}

/// Round trips before counting (queues and tables reach their size).
pub const WARMUP: u64 = 200;
/// Round trips counted.
pub const ROUNDS: u64 = 1_000;

/// Runs `round_trip(n, counted)` [`WARMUP`] times uncounted, then [`ROUNDS`] times counted
/// (`n` numbering them all), and asserts that the counted ones allocated nothing.
pub fn assert_round_trips_allocate_nothing(mut round_trip: impl FnMut(u64, bool)) {
    for n in 0..WARMUP {
        round_trip(n, false);
    }
    let before = allocations();
    for n in 0..ROUNDS {
        round_trip(WARMUP + n, true);
    }
    let allocations = allocations() - before;
    let per_round_trip = allocations as f64 / ROUNDS as f64;
    println!("allocations per round trip: {per_round_trip:.3} ({allocations} in {ROUNDS})");
    assert_eq!(
        allocations, 0,
        "{per_round_trip:.3} allocations per round trip"
    );
}
