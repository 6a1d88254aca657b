//! Small-count CQ scenarios meant for Miri: the ring, batch and extended polling, resize
//! (the one place the crate frees and replaces memory through a raw pointer), the three
//! overrun policies, and a few two- and three-thread runs, all through the public API.
//!
//! Run with `cargo +nightly miri test -p softverbs-cq --lib --test miri_ring -- --skip
//! clock::` (the `--skip` leaves out the wall-clock unit test: Miri's isolation forbids
//! `CLOCK_REALTIME`). Nothing here touches a completion channel (its `eventfd` is created
//! with `EFD_SEMAPHORE`, which Miri does not support) or the wall clock; counts stay small
//! so the interpreter finishes in seconds. The same tests run natively with the rest.

use softverbs_cq::{
    CompletionQueue, CqBuilder, CqProducer, OverrunPolicy, PollError, PushError, RawFields,
    ResizeError, WcExtra, WcFields, WorkCompletion,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

/// How many times a thread of the threaded scenarios retries (pushing into a full queue, or
/// polling for entries still to come) before the test fails as stuck. Far above what any
/// schedule needs, so only a lost or withheld entry reaches it; every loop stays bounded.
const MAX_ROUNDS: u32 = 1_000_000;

/// Pushes `wc` under the backpressure policy, yielding while the queue is full.
fn push_when_room(p: &CqProducer, mut wc: WorkCompletion) {
    for _ in 0..MAX_ROUNDS {
        match p.push(wc, false) {
            Ok(()) => return,
            Err(PushError::Full(back)) => wc = back,
            Err(e) => panic!("push failed: {e}"),
        }
        thread::yield_now();
    }
    panic!("stuck: the queue stayed full for {MAX_ROUNDS} attempts");
}

/// Completion `i` with every field derived from `i`, so a torn or misplaced entry shows.
fn numbered(i: u64) -> WorkCompletion {
    let n = i as u32;
    WorkCompletion::from_raw(RawFields {
        wr_id: i,
        status: 0,
        opcode: 128,
        vendor_err: 0x1000 + n,
        byte_len: 0x2000 + n,
        imm_or_rkey: (n + 1).to_be(),
        qp_num: 0x3000 + n,
        src_qp: 0x4000 + n,
        wc_flags: 1 << 1,
        pkey_index: n as u16,
        slid: 0x60 + n as u16,
        sl: n as u8,
        dlid_path_bits: 0x70 + n as u8,
    })
}

fn drain(cq: &CompletionQueue) -> Vec<u64> {
    let mut out = Vec::new();
    let mut buf = [WorkCompletion::default(); 3];
    loop {
        let n = cq.poll(&mut buf).unwrap();
        if n == 0 {
            return out;
        }
        for wc in &buf[..n] {
            assert_eq!(*wc, numbered(wc.wr_id()), "torn entry");
            out.push(wc.wr_id());
        }
    }
}

#[test]
fn ring_wraps_many_times_keeping_fifo_order_and_whole_entries() {
    // ibv_poll_cq(3): "Each polled completion is removed from the CQ and cannot be returned
    // to it"; completions come out in the order they were added.
    let cq = CqBuilder::new(4).build().unwrap();
    let p = cq.producer();
    let mut next = 0;
    let mut got = Vec::new();
    for round in 0..5 {
        for _ in 0..=(round % 4) {
            p.push(numbered(next), false).unwrap();
            next += 1;
        }
        got.extend(drain(&cq));
    }
    assert_eq!(got, (0..next).collect::<Vec<_>>());
    let stats = cq.stats();
    assert_eq!((stats.produced, stats.polled, stats.depth), (next, next, 0));
}

#[test]
fn single_threaded_cq_polls_through_exclusive_access() {
    // ibv_create_cq_ex(3): IBV_CREATE_CQ_ATTR_SINGLE_THREADED, "no locking is required".
    let mut cq = CqBuilder::new(2).build_single_threaded().unwrap();
    let p = cq.producer();
    let mut buf = [WorkCompletion::default(); 2];
    for i in 0..6 {
        p.push(numbered(i), false).unwrap();
        assert_eq!(cq.poll(&mut buf).unwrap(), 1);
        assert_eq!(buf[0], numbered(i));
    }
}

#[test]
fn extended_poll_returns_the_same_entries_with_extra_fields_and_timestamps() {
    // ibv_create_cq_ex(3): start_poll / next_poll / end_poll, and the readers of the fields
    // requested in wc_flags (cvlan, flow tag, tag-matching info, completion timestamp).
    let fields = WcFields::STANDARD
        | WcFields::CVLAN
        | WcFields::FLOW_TAG
        | WcFields::TM_INFO
        | WcFields::COMPLETION_TIMESTAMP;
    let cq = CqBuilder::new(4).fields(fields).build().unwrap();
    let p = cq.producer();
    for i in 0..3 {
        let extra = WcExtra {
            cvlan: i as u16 + 1,
            flow_tag: 0x100 + i as u32,
            tm_tag: 0x1000 + i,
            tm_priv: 7 + i as u32,
        };
        p.push_extra(numbered(i), false, extra).unwrap();
    }
    let mut seen = Vec::new();
    let mut last_ts = 0;
    {
        let mut batch = cq.start_poll().unwrap().expect("three completions");
        loop {
            let i = batch.wr_id();
            assert_eq!(*batch.completion(), numbered(i));
            assert_eq!(batch.cvlan(), Ok(i as u16 + 1));
            assert_eq!(batch.flow_tag(), Ok(0x100 + i as u32));
            assert_eq!(batch.tm_info(), Ok((0x1000 + i, 7 + i as u32)));
            assert_eq!(batch.imm_data(), Ok(i as u32 + 1));
            let ts = batch.completion_ts().unwrap();
            assert!(ts >= last_ts);
            last_ts = ts;
            seen.push(i);
            if !batch.next() {
                break;
            }
        }
    }
    assert_eq!(seen, [0, 1, 2]);
    assert!(
        cq.start_poll().unwrap().is_none(),
        "end_poll consumed the batch"
    );
}

#[test]
fn resize_replaces_the_ring_keeping_entries_and_frees_every_ring_at_drop() {
    // ibv_resize_cq(3): "resizes the completion queue (CQ) cq to have at least cqe entries";
    // "cqe must be at least the number of unpolled entries in the CQ cq". Under Miri this
    // also checks the raw ring pointer: no use after free, no leak of retired rings.
    let cq = CqBuilder::new(2)
        .fields(WcFields::STANDARD | WcFields::CVLAN)
        .build()
        .unwrap();
    let p = cq.producer();
    p.push(numbered(0), false).unwrap();
    p.push(numbered(1), false).unwrap();
    assert_eq!(cq.resize(8).unwrap(), 8);
    for i in 2..7 {
        p.push(numbered(i), false).unwrap();
    }
    let mut buf = [WorkCompletion::default(); 3];
    assert_eq!(cq.poll(&mut buf).unwrap(), 3);
    assert_eq!(buf.map(|w| w.wr_id()), [0, 1, 2]);
    assert!(
        matches!(cq.resize(3), Err(ResizeError::TooSmall { .. })),
        "4 unpolled > 3"
    );
    assert_eq!(cq.resize(4).unwrap(), 4);
    assert_eq!(drain(&cq), [3, 4, 5, 6]);
    p.push(numbered(7), false).unwrap();
    assert_eq!(drain(&cq), [7]);
    drop(p);
    drop(cq);
}

#[test]
fn error_policy_overrun_puts_the_cq_in_error() {
    // ibv_poll_cq(3): "In case of a CQ overrun, the async event IBV_EVENT_CQ_ERR will be
    // triggered, and the CQ cannot be used."
    let cq = CqBuilder::new(2).build().unwrap();
    let p = cq.producer();
    p.push(numbered(0), false).unwrap();
    p.push(numbered(1), false).unwrap();
    assert_eq!(p.push(numbered(2), false), Err(PushError::Overrun));
    let mut buf = [WorkCompletion::default(); 2];
    assert_eq!(cq.poll(&mut buf), Err(PollError::Overrun));
    assert!(cq.stats().in_error);
}

#[test]
fn overwrite_policy_laps_the_consumer_and_counts_what_was_lost() {
    // ibv_create_cq_ex(3): IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN, "CQE always will be written to
    // next entry"; both polling styles skip what was overwritten.
    let cq = CqBuilder::new(2)
        .overrun(OverrunPolicy::Overwrite)
        .build()
        .unwrap();
    let p = cq.producer();
    for i in 0..5 {
        p.push(numbered(i), false).unwrap();
    }
    {
        let batch = cq.start_poll().unwrap().expect("two newest survive");
        assert_eq!(*batch.completion(), numbered(3));
    }
    assert_eq!(drain(&cq), [4]);
    let stats = cq.stats();
    assert_eq!((stats.polled, stats.overruns), (2, 3));
}

#[test]
fn backpressure_policy_hands_back_the_completion_when_full() {
    let cq = CqBuilder::new(1)
        .overrun(OverrunPolicy::Backpressure)
        .build()
        .unwrap();
    let p = cq.producer();
    p.push(numbered(0), false).unwrap();
    assert_eq!(
        p.push(numbered(1), false),
        Err(PushError::Full(numbered(1)))
    );
    assert_eq!(drain(&cq), [0]);
    p.push(numbered(1), false).unwrap();
    assert_eq!(drain(&cq), [1]);
}

#[test]
fn two_producers_and_a_consumer_lose_nothing_and_keep_per_producer_order() {
    const EACH: u64 = 12;
    let cq = Arc::new(
        CqBuilder::new(4)
            .overrun(OverrunPolicy::Backpressure)
            .build()
            .unwrap(),
    );
    let producers: Vec<_> = (0..2u64)
        .map(|k| {
            let p = cq.producer();
            thread::spawn(move || {
                for i in 0..EACH {
                    push_when_room(&p, numbered(k * 100 + i));
                }
            })
        })
        .collect();
    let mut got = Vec::new();
    for _ in 0..MAX_ROUNDS {
        if got.len() == 2 * EACH as usize {
            break;
        }
        let polled = drain(&cq);
        if polled.is_empty() {
            thread::yield_now();
        }
        got.extend(polled);
    }
    assert_eq!(got.len(), 2 * EACH as usize, "stuck: entries never arrived");
    for t in producers {
        t.join().unwrap();
    }
    for k in 0..2 {
        let mine: Vec<_> = got.iter().filter(|&&w| w / 100 == k).copied().collect();
        assert_eq!(mine, (k * 100..k * 100 + EACH).collect::<Vec<_>>());
    }
}

#[test]
fn two_consumers_and_a_producer_duplicate_nothing() {
    // Both consumers poll until every entry has been taken by one of them. (They used to
    // poll a fixed number of rounds and then wait for the producer: on a loaded machine the
    // rounds could run out while the producer still waited for room, and the test hung.)
    const N: u64 = 16;
    let cq = Arc::new(
        CqBuilder::new(4)
            .overrun(OverrunPolicy::Backpressure)
            .build()
            .unwrap(),
    );
    let taken = Arc::new(AtomicU64::new(0));
    let consume = |cq: Arc<CompletionQueue>, taken: Arc<AtomicU64>| {
        move || {
            let mut got = Vec::new();
            for _ in 0..MAX_ROUNDS {
                if taken.load(Ordering::Acquire) == N {
                    break;
                }
                let polled = drain(&cq);
                taken.fetch_add(polled.len() as u64, Ordering::AcqRel);
                got.extend(polled);
                thread::yield_now();
            }
            got
        }
    };
    let p = cq.producer();
    let producer = thread::spawn(move || {
        for i in 0..N {
            push_when_room(&p, numbered(i));
        }
    });
    let consumer = thread::spawn(consume(cq.clone(), taken.clone()));
    let mut mine = consume(cq.clone(), taken)();
    producer.join().unwrap();
    let theirs = consumer.join().unwrap();
    mine.extend(drain(&cq));
    assert!(mine.windows(2).all(|w| w[0] < w[1]));
    assert!(theirs.windows(2).all(|w| w[0] < w[1]));
    let mut all: Vec<_> = mine.into_iter().chain(theirs).collect();
    all.sort_unstable();
    assert_eq!(all, (0..N).collect::<Vec<_>>());
}

#[test]
fn overwrite_producer_racing_a_consumer_never_yields_a_torn_entry() {
    // The seqlock path: the producer rewrites slots the consumer may be copying.
    const N: u64 = 24;
    let cq = Arc::new(
        CqBuilder::new(2)
            .overrun(OverrunPolicy::Overwrite)
            .build()
            .unwrap(),
    );
    let p = cq.producer();
    let producer = thread::spawn(move || {
        for i in 0..N {
            p.push(numbered(i), false).unwrap();
        }
    });
    let mut got = Vec::new();
    for _ in 0..20 {
        got.extend(drain(&cq));
    }
    producer.join().unwrap();
    got.extend(drain(&cq));
    assert!(got.windows(2).all(|w| w[0] < w[1]), "{got:?}");
    assert_eq!(got.last(), Some(&(N - 1)));
    let stats = cq.stats();
    assert_eq!(stats.polled + stats.overruns, N);
}

// ------------------------------------------------------- ring memory from an allocator

mod counting {
    use softverbs_cq::{RingAllocator, RingLayout, RingMemory, RingResource};
    use std::alloc::Layout;
    use std::ptr::NonNull;
    use std::sync::Mutex;

    /// A ring allocator that counts its calls and remembers what it handed out, so a test
    /// can read the ring in the application's memory.
    #[derive(Default)]
    pub struct Counting {
        pub log: Mutex<Log>,
        /// What to answer instead of memory (`None`: provide memory).
        pub answer: Mutex<Answer>,
    }

    /// What the allocator answers.
    #[derive(Clone, Copy, Default)]
    pub enum Answer {
        #[default]
        Memory,
        UseDefault,
        Refuse,
    }

    #[derive(Default)]
    pub struct Log {
        pub allocations: usize,
        pub releases: usize,
        /// Live blocks: pointer, layout.
        pub live: Vec<(Block, RingLayout)>,
    }

    /// A block handed out (a pointer kept with its provenance, for Miri's strict mode).
    pub struct Block(pub NonNull<u8>);

    // SAFETY: only an address kept for the test to read through; the ring owns the memory.
    unsafe impl Send for Block {}

    impl Counting {
        pub fn live_slots(&self) -> Vec<(*const u8, usize)> {
            let log = self.log.lock().unwrap();
            log.live
                .iter()
                .filter(|(_, l)| l.resource == RingResource::Slots)
                .map(|(a, l)| (a.0.as_ptr().cast_const(), l.size))
                .collect()
        }
    }

    // SAFETY: `Provided` memory is a fresh `std::alloc` block of the layout's size and
    // alignment, owned by the ring until `release` frees it.
    unsafe impl RingAllocator for Counting {
        fn allocate(&self, layout: RingLayout) -> RingMemory {
            let mut log = self.log.lock().unwrap();
            log.allocations += 1;
            match *self.answer.lock().unwrap() {
                Answer::Memory => {}
                Answer::UseDefault => return RingMemory::UseDefault,
                Answer::Refuse => return RingMemory::Refused,
            }
            let heap = Layout::from_size_align(layout.size, layout.align).unwrap();
            // SAFETY: the ring never asks for zero bytes.
            let ptr = NonNull::new(unsafe { std::alloc::alloc(heap) }).unwrap();
            log.live.push((Block(ptr), layout));
            RingMemory::Provided(ptr)
        }

        unsafe fn release(&self, ptr: NonNull<u8>, layout: RingLayout) {
            let mut log = self.log.lock().unwrap();
            log.releases += 1;
            let at = log
                .live
                .iter()
                .position(|(a, l)| a.0 == ptr && *l == layout)
                .expect("released what was handed out, with its layout");
            log.live.swap_remove(at);
            let heap = Layout::from_size_align(layout.size, layout.align).unwrap();
            // SAFETY: allocated above with this layout, released once (the trait's contract).
            unsafe { std::alloc::dealloc(ptr.as_ptr(), heap) };
        }
    }
}

/// Reads slot `i` of a ring in the allocator's memory: its sequence word and its wr_id.
fn slot_words(base: *const u8, i: usize) -> (u64, u64) {
    let slot = base.wrapping_add(64 * i).cast::<AtomicU64>();
    // SAFETY: the block is live (the CQ holds it) and holds at least `i + 1` slots of eight
    // atomic words; reading through atomics is what the ring's contract allows.
    unsafe {
        (
            (*slot).load(Ordering::Acquire),
            (*slot.add(1)).load(Ordering::Relaxed),
        )
    }
}

#[test]
fn a_parent_domain_ring_lives_in_the_allocators_memory_and_is_released_on_drop() {
    // ibv_alloc_parent_domain(3): "the provider will use the application's allocator to
    // allocate and free memory for resources"; the completion is in that memory while it
    // is polled.
    let alloc = Arc::new(counting::Counting::default());
    let cq = CqBuilder::new(4).allocator(alloc.clone()).build().unwrap();
    let slots = alloc.live_slots();
    assert_eq!(slots.len(), 1, "one slot array");
    let (base, size) = slots[0];
    assert_eq!(size, 64 * cq.capacity() as usize);
    assert_eq!(base.align_offset(64), 0);
    let p = cq.producer();
    p.push(numbered(7), false).unwrap();
    p.push(numbered(8), false).unwrap();
    assert_eq!(slot_words(base, 0), (1, 7), "position 0 complete, wr_id 7");
    assert_eq!(slot_words(base, 1), (2, 8));
    let mut buf = [WorkCompletion::default(); 1];
    assert_eq!(cq.poll(&mut buf).unwrap(), 1);
    assert_eq!(buf[0], numbered(7));
    // Still in the application's memory until polled.
    assert_eq!(slot_words(base, 1), (2, 8));
    assert_eq!(drain(&cq), vec![8]);
    drop(p);
    drop(cq);
    let log = alloc.log.lock().unwrap();
    assert_eq!((log.allocations, log.releases), (1, 1));
    assert!(log.live.is_empty());
}

#[test]
fn resize_takes_the_new_ring_from_the_allocator_and_releases_both_on_drop() {
    // ibv_resize_cq(3) keeps every unpolled completion; the new ring comes from the same
    // allocator, and the extras array (cvlan / flow tag) is a second resource.
    let alloc = Arc::new(counting::Counting::default());
    let cq = CqBuilder::new(2)
        .fields(WcFields::STANDARD | WcFields::FLOW_TAG)
        .allocator(alloc.clone())
        .build()
        .unwrap();
    assert_eq!(alloc.log.lock().unwrap().allocations, 2, "slots and extras");
    let p = cq.producer();
    p.push_extra(numbered(1), false, WcExtra::default())
        .unwrap();
    assert_eq!(cq.resize(8).unwrap(), 8);
    assert_eq!(alloc.log.lock().unwrap().allocations, 4);
    let fresh = alloc
        .live_slots()
        .into_iter()
        .find(|(_, size)| *size == 64 * 8)
        .unwrap();
    assert_eq!(slot_words(fresh.0, 0), (1, 1), "copied into the new ring");
    assert_eq!(drain(&cq), vec![1]);
    drop(p);
    drop(cq);
    let log = alloc.log.lock().unwrap();
    assert_eq!((log.allocations, log.releases), (4, 4));
}

#[test]
fn an_allocator_answering_use_default_gets_no_release_and_a_null_fails_creation() {
    // ibv_alloc_parent_domain(3): IBV_ALLOCATOR_USE_DEFAULT "uses the default allocator";
    // a NULL answer is a failure to allocate (ENOMEM).
    let default = Arc::new(counting::Counting {
        answer: std::sync::Mutex::new(counting::Answer::UseDefault),
        ..Default::default()
    });
    let cq = CqBuilder::new(4)
        .allocator(default.clone())
        .build()
        .unwrap();
    cq.producer().push(numbered(3), false).unwrap();
    assert_eq!(drain(&cq), vec![3]);
    drop(cq);
    let log = default.log.lock().unwrap();
    assert_eq!((log.allocations, log.releases), (1, 0));
    drop(log);

    let refusing = Arc::new(counting::Counting {
        answer: std::sync::Mutex::new(counting::Answer::Refuse),
        ..Default::default()
    });
    let err = CqBuilder::new(4)
        .allocator(refusing.clone())
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        softverbs_cq::CreateError::RingMemoryRefused {
            resource: softverbs_cq::RingResource::Slots
        }
    );
    // A resize the allocator refuses changes nothing.
    let alloc = Arc::new(counting::Counting::default());
    let cq = CqBuilder::new(2).allocator(alloc.clone()).build().unwrap();
    cq.producer().push(numbered(4), false).unwrap();
    *alloc.answer.lock().unwrap() = counting::Answer::Refuse;
    assert_eq!(
        cq.resize(8),
        Err(ResizeError::Size(
            softverbs_cq::CreateError::RingMemoryRefused {
                resource: softverbs_cq::RingResource::Slots
            }
        ))
    );
    assert_eq!(cq.capacity(), 2);
    assert_eq!(drain(&cq), vec![4]);
    drop(cq);
    let log = alloc.log.lock().unwrap();
    assert_eq!(
        (log.allocations, log.releases),
        (2, 1),
        "the refusal has nothing to release"
    );
}

/// Hands out memory eight bytes past a 64-byte boundary, and counts what it takes back.
struct Misaligned {
    released: AtomicU64,
}

// SAFETY: `Provided` memory is eight bytes into a fresh block of `size + 64` bytes, so
// `size` bytes are readable and writable there; `release` frees the block once.
unsafe impl softverbs_cq::RingAllocator for Misaligned {
    fn allocate(&self, layout: softverbs_cq::RingLayout) -> softverbs_cq::RingMemory {
        let heap = std::alloc::Layout::from_size_align(layout.size + 64, 64).unwrap();
        // SAFETY: non-zero size.
        let block = unsafe { std::alloc::alloc(heap) };
        // SAFETY: 8 < size + 64, inside the block.
        softverbs_cq::RingMemory::Provided(std::ptr::NonNull::new(unsafe { block.add(8) }).unwrap())
    }

    unsafe fn release(&self, ptr: std::ptr::NonNull<u8>, layout: softverbs_cq::RingLayout) {
        self.released.fetch_add(1, Ordering::Relaxed);
        let heap = std::alloc::Layout::from_size_align(layout.size + 64, 64).unwrap();
        // SAFETY: `ptr` is eight bytes into the block `allocate` made with `heap`.
        unsafe { std::alloc::dealloc(ptr.as_ptr().sub(8), heap) };
    }
}

#[test]
fn memory_not_aligned_as_asked_is_handed_back_and_creation_fails() {
    // The ring's slots are 64-byte aligned; the allocator is told (`alignment`), and memory
    // that ignores it is refused (EINVAL), never used.
    let alloc = Arc::new(Misaligned {
        released: AtomicU64::new(0),
    });
    let err = CqBuilder::new(4)
        .allocator(alloc.clone())
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        softverbs_cq::CreateError::RingMemoryMisaligned {
            resource: softverbs_cq::RingResource::Slots,
            align: 64
        }
    );
    assert_eq!(alloc.released.load(Ordering::Relaxed), 1);
}

#[test]
fn the_unsynchronized_consumer_paths_poll_batch_and_resize_as_the_locked_ones() {
    // ibv_alloc_td(3): objects under a thread domain "disable internal locking"; the
    // thread-safe CQ's consumer paths without the consumer lock give the same entries.
    let cq = CqBuilder::new(2).build().unwrap();
    let p = cq.producer();
    for i in 0..2 {
        p.push(numbered(i), false).unwrap();
    }
    let mut buf = [WorkCompletion::default(); 1];
    // SAFETY: this thread is the CQ's only consumer.
    assert_eq!(unsafe { cq.poll_unsynchronized(&mut buf) }.unwrap(), 1);
    assert_eq!(buf[0], numbered(0));
    // SAFETY: as above.
    assert_eq!(unsafe { cq.resize_unsynchronized(4) }.unwrap(), 4);
    p.push(numbered(2), false).unwrap();
    {
        // SAFETY: as above, while the batch lives.
        let mut batch = unsafe { cq.start_poll_unsynchronized() }.unwrap().unwrap();
        assert_eq!(batch.wr_id(), 1);
        assert!(batch.next());
        assert_eq!(batch.wr_id(), 2);
        assert!(!batch.next());
    }
    // The batch consumed both, and left no lock held: the locked path still works.
    assert_eq!(cq.poll(&mut buf).unwrap(), 0);
    // SAFETY: as above.
    assert_eq!(unsafe { cq.poll_unsynchronized(&mut buf) }.unwrap(), 0);
}
