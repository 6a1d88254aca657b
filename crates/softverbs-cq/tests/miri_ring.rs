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
