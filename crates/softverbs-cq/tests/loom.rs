//! loom models of the CQ's concurrency, through the public API only.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p softverbs-cq --test loom --release`.
//! Under `--cfg loom` the crate takes every atomic, lock and `Arc` from loom (`src/sync.rs`),
//! the completion channel has no file descriptor and `CompletionChannel::try_get_event` is
//! the way to take events. Each model checks one rule of the man pages under every
//! interleaving loom explores (bounded by `preemption_bound` where the full space is too
//! large to finish in seconds):
//!
//! - push against poll (`ibv_poll_cq(3)`: "Each polled completion is removed from the CQ
//!   and cannot be returned to it", in FIFO order, whole), under each overrun policy;
//! - resize against push, and against arming (`ibv_resize_cq(3)`: entries survive the
//!   ring's replacement, and the check still sees them);
//! - arming against a concurrent push (`ibv_req_notify_cq(3)`: the event fires for "the
//!   next completion"; no lost wake-up, one event per arm);
//! - destroy against event delivery (`ibv_get_cq_event(3)`: "destroying a CQ will wait for
//!   all completion events to be acknowledged");
//! - two consumers against a producer on a thread-safe CQ;
//! - the biased locks (`src/cq/biased_lock.rs`): an owner that enters with plain stores
//!   against a thread that revokes its bias — a second producer (resize, above, revokes the
//!   pushing thread's bias too), a second consumer against a polling owner, against an
//!   owner holding an extended-poll batch, and against an owner arming the CQ.
//!
//! Destroy against poll needs no model: `destroy` takes the CQ by value, so no poll can run
//! beside it; what can race it is event delivery, modelled here.
//!
//! The asymmetric barrier of `src/sync.rs` is modelled as a pair of `SeqCst` fences under
//! loom. loom 0.7 implements `fence(SeqCst)` as an acquire-release fence that also joins a
//! global "SeqCst causality" (`rt/thread.rs::seq_cst_fence`), so two fences are totally
//! ordered and the later one sees everything before the earlier one: the store-buffer
//! outcome is forbidden with the fences and explored without them. The litmus models at the
//! end of this file pin that, so the models of the biased locks below (and of arming, which
//! a push orders through the producer lock, biased or not) are known to be able to fail.
//!
//! What loom does not check: it models `fence(SeqCst)` more strongly than C++20 (the later
//! fence also *synchronises with* the earlier one, which C++ does not promise), so code that
//! relied on an SC fence to publish plain data would pass here and be wrong; the CQ reads
//! every entry through an Acquire load of its sequence word, so it does not rely on that.
//! loom also never lets a load read from a store that comes later in program order (load
//! buffering), so the `Release` on the consumer's head (the producer must not overwrite a
//! slot before the consumer has copied it out) is argued in `src/cq/`
//! (`ConsumerSide::head` in `mod.rs`, `publish_head` in `poll.rs`), not checked here.

#![cfg(loom)]

use loom::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, Ordering};
use loom::sync::Arc;
use loom::thread;
use softverbs_cq::{
    CompletionChannel, CompletionQueue, CqBuilder, DestroyError, OverrunPolicy, PushError,
    RawFields, WorkCompletion,
};
use std::collections::BTreeSet;

/// A loom model builder with a preemption bound (`None`: explore everything).
fn model(preemption_bound: Option<usize>, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = preemption_bound;
    }
    builder.check(f);
}

/// Completion number `i`, every field derived from `i`, so that an entry assembled from two
/// different completions (a torn read) cannot pass [`assert_whole`].
fn numbered(i: u64) -> WorkCompletion {
    let n = i as u32;
    WorkCompletion::from_raw(RawFields {
        wr_id: 0x5157_0000_0000_0000 | i,
        status: 0,
        opcode: 128,
        vendor_err: 0x1000 + n,
        byte_len: 0x2000 + n,
        imm_or_rkey: 0x0101_0101u32.wrapping_mul(n + 1),
        qp_num: 0x3000 + n,
        src_qp: 0x4000 + n,
        wc_flags: 1 << 1,
        pkey_index: 0x50 + n as u16,
        slid: 0x60 + n as u16,
        sl: n as u8,
        dlid_path_bits: 0x70 + n as u8,
    })
}

/// Asserts `wc` is exactly one of the completions [`numbered`] made, and returns its number.
fn assert_whole(wc: &WorkCompletion) -> u64 {
    let i = wc.wr_id() & 0xffff;
    assert_eq!(*wc, numbered(i), "torn or foreign completion {wc:?}");
    i
}

/// Polls once into a buffer of `batch`, returning the numbers of what came out.
fn poll_once(cq: &CompletionQueue, batch: usize) -> Vec<u64> {
    let mut buf = [WorkCompletion::default(); 4];
    let n = cq.poll(&mut buf[..batch]).expect("poll");
    buf[..n].iter().map(assert_whole).collect()
}

/// Polls until the CQ is empty.
fn drain(cq: &CompletionQueue) -> Vec<u64> {
    let mut all = Vec::new();
    loop {
        let got = poll_once(cq, 4);
        if got.is_empty() {
            return all;
        }
        all.extend(got);
    }
}

/// Takes (and, by dropping, acknowledges) every event queued on `channel` for `cq_id`.
fn take_events(channel: &CompletionChannel, cq_id: u64, user_context: u64) -> usize {
    let mut n = 0;
    while let Some(event) = channel.try_get_event().expect("try_get_event") {
        // ibv_get_cq_event(3): the event names its CQ and the CQ's context.
        assert!(event.is_for(cq_id));
        assert_eq!(event.user_context(), user_context);
        n += 1;
    }
    n
}

// ------------------------------------------------------------------ push against poll

/// ibv_poll_cq(3): "Each polled completion is removed from the CQ and cannot be returned to
/// it"; completions come out in the order they were added, whole. A consumer polls while a
/// producer pushes into a 2-entry CQ (the default, error-on-overrun policy, never full
/// here); what the consumer got plus what is left is every completion, once, in order.
#[test]
fn push_against_poll_delivers_every_completion_once_in_order_and_whole() {
    model(None, || {
        let cq = CqBuilder::new(2).build().unwrap();
        let producer = cq.producer();
        let pusher = thread::spawn(move || {
            for i in 0..2 {
                producer.push(numbered(i), false).unwrap();
            }
        });
        let mut got = poll_once(&cq, 1);
        got.extend(poll_once(&cq, 2));
        pusher.join().unwrap();
        got.extend(drain(&cq));
        assert_eq!(got, [0, 1]);
        assert!(!cq.is_in_error());
    });
}

/// The no-loss policy on a 2-entry CQ, three completions: the ring wraps while the consumer
/// polls, a push to a full CQ is handed back (`PushError::Full`) and retried, and the
/// consumer still sees 0, 1, 2 exactly once, in order.
#[test]
fn backpressure_push_against_poll_wraps_the_ring_and_loses_nothing() {
    model(None, || {
        let cq = CqBuilder::new(2)
            .overrun(OverrunPolicy::Backpressure)
            .build()
            .unwrap();
        assert_eq!(cq.capacity(), 2);
        let producer = cq.producer();
        let pusher = thread::spawn(move || {
            for i in 0..3 {
                let mut wc = numbered(i);
                loop {
                    match producer.push(wc, false) {
                        Ok(()) => break,
                        Err(PushError::Full(back)) => {
                            // Nothing lost: the completion handed back is the one pushed.
                            assert_eq!(back, wc);
                            wc = back;
                            thread::yield_now();
                        }
                        Err(e) => panic!("unexpected push error {e:?}"),
                    }
                }
            }
        });
        let mut got = Vec::new();
        while got.len() < 3 {
            let polled = poll_once(&cq, 1);
            if polled.is_empty() {
                thread::yield_now();
            }
            got.extend(polled);
        }
        pusher.join().unwrap();
        assert_eq!(got, [0, 1, 2]);
        assert!(drain(&cq).is_empty());
        let stats = cq.stats();
        assert_eq!((stats.produced, stats.polled, stats.overruns), (3, 3, 0));
    });
}

/// `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN`: the producer overwrites unpolled entries while the
/// consumer may be reading them (the seqlock path). Every polled entry is one that was
/// pushed, whole (never torn); numbers only increase; and what was polled plus what was
/// counted as overrun is everything pushed.
#[test]
fn overwrite_push_against_poll_never_returns_a_torn_entry() {
    // Two pushes into one slot: the second overwrites the first, possibly while the
    // consumer is copying it out.
    const PUSHES: u64 = 2;
    model(Some(4), || {
        let cq = CqBuilder::new(1)
            .overrun(OverrunPolicy::Overwrite)
            .build()
            .unwrap();
        assert_eq!(cq.capacity(), 1);
        let producer = cq.producer();
        let pusher = thread::spawn(move || {
            for i in 0..PUSHES {
                producer.push(numbered(i), false).unwrap();
            }
        });
        let mut got = poll_once(&cq, 1);
        pusher.join().unwrap();
        got.extend(drain(&cq));
        assert!(got.windows(2).all(|w| w[0] < w[1]), "out of order: {got:?}");
        // The newest completion is never overwritten, so it is always polled.
        assert_eq!(got.last(), Some(&(PUSHES - 1)), "lost the newest: {got:?}");
        let stats = cq.stats();
        assert_eq!(stats.polled, got.len() as u64, "{stats:?}");
        assert_eq!(stats.polled + stats.overruns, PUSHES, "{stats:?}");
        assert!(!cq.is_in_error());
    });
}

/// ibv_resize_cq(3): the CQ is resized "to have at least cqe entries" while a producer
/// pushes into it: every completion, pushed into the old ring or the new one, comes out
/// once, in order, whole.
#[test]
fn resize_against_push_keeps_every_completion_in_order() {
    model(None, || {
        let cq = Arc::new(CqBuilder::new(2).build().unwrap());
        let producer = cq.producer();
        let pusher = thread::spawn(move || {
            for i in 0..2 {
                producer.push(numbered(i), false).unwrap();
            }
        });
        let resizer = {
            let cq = cq.clone();
            thread::spawn(move || cq.resize(4).unwrap())
        };
        assert_eq!(resizer.join().unwrap(), 4);
        pusher.join().unwrap();
        // The new ring has room for two more.
        for i in 2..4 {
            cq.producer().push(numbered(i), false).unwrap();
        }
        assert_eq!(drain(&cq), [0, 1, 2, 3]);
        assert!(!cq.is_in_error());
    });
}

/// Arming with the check while a push and a resize (which replaces the ring the check
/// reads) run on another thread: still no lost wake-up and at most one event. (The push
/// and the resize on one thread: with a thread each, three threads spin on the producer
/// lock, which an arm takes too, and the model passes loom's branch limit.)
#[test]
fn arming_against_a_push_and_a_resize_never_loses_the_wakeup() {
    model(Some(3), || {
        let channel = CompletionChannel::new().unwrap();
        let cq = Arc::new(CqBuilder::new(2).channel(&channel).build().unwrap());
        let producer = cq.producer();
        let other = {
            let cq = cq.clone();
            thread::spawn(move || {
                producer.push(numbered(0), false).unwrap();
                cq.resize(4).unwrap()
            })
        };
        let saw_completion = cq.req_notify_and_check(false);
        other.join().unwrap();
        let events = take_events(&channel, cq.id(), 0);
        assert!(events <= 1, "{events} events for one arm");
        assert!(saw_completion || events == 1, "lost wake-up");
        assert_eq!(drain(&cq), [0]);
    });
}

// ------------------------------------------------------------------ arming against push

/// ibv_req_notify_cq(3): once armed, "the next completion" added puts an event on the
/// channel. `req_notify_and_check` (arm, then look) against a concurrent push: either the
/// check saw the completion, or the push saw the arm and exactly one event is queued;
/// never neither (a lost wake-up), never two events for the one arm.
#[test]
fn arming_against_a_push_never_loses_the_wakeup_nor_doubles_the_event() {
    model(None, || {
        let channel = CompletionChannel::new().unwrap();
        let cq = CqBuilder::new(4)
            .channel(&channel)
            .user_context(7)
            .build()
            .unwrap();
        let producer = cq.producer();
        let pusher = thread::spawn(move || producer.push(numbered(0), false).unwrap());
        let saw_completion = cq.req_notify_and_check(false);
        pusher.join().unwrap();
        let events = take_events(&channel, cq.id(), 7);
        assert!(events <= 1, "{events} events for one arm");
        assert!(
            saw_completion || events == 1,
            "lost wake-up: the check saw nothing and no event came"
        );
        assert_eq!(drain(&cq), [0]);
    });
}

/// Solicited-only arming against a solicited push: the same rule for
/// `req_notify(solicited_only = true)` (ibv_req_notify_cq(3): "the next solicited
/// completion").
#[test]
fn solicited_arming_against_a_solicited_push_never_loses_the_wakeup() {
    model(None, || {
        let channel = CompletionChannel::new().unwrap();
        let cq = CqBuilder::new(4).channel(&channel).build().unwrap();
        let producer = cq.producer();
        let pusher = thread::spawn(move || producer.push(numbered(0), true).unwrap());
        let saw_completion = cq.req_notify_and_check(true);
        pusher.join().unwrap();
        let events = take_events(&channel, cq.id(), 0);
        assert!(events <= 1, "{events} events for one arm");
        assert!(saw_completion || events == 1, "lost wake-up");
    });
}

/// One arm, two pushes racing each other: the arm is one shot, so exactly one event.
#[test]
fn two_pushes_racing_one_arm_give_exactly_one_event() {
    model(None, || {
        let channel = CompletionChannel::new().unwrap();
        let cq = CqBuilder::new(4).channel(&channel).build().unwrap();
        cq.req_notify(false);
        let pushers: Vec<_> = (0..2)
            .map(|i| {
                let producer = cq.producer();
                thread::spawn(move || producer.push(numbered(i), false).unwrap())
            })
            .collect();
        for pusher in pushers {
            pusher.join().unwrap();
        }
        assert_eq!(take_events(&channel, cq.id(), 0), 1);
        assert_eq!(drain(&cq).len(), 2);
    });
}

/// Arming (with the check) while another thread pushes twice: at most one event, and no
/// lost wake-up. (Two pushing threads and the arming one spin on the producer lock past
/// loom's branch limit; `two_pushes_racing_one_arm_give_exactly_one_event` races two
/// pushers against each other.)
#[test]
fn two_pushes_racing_one_arm_and_check_give_at_most_one_event_and_no_lost_wakeup() {
    model(Some(3), || {
        let channel = CompletionChannel::new().unwrap();
        let cq = CqBuilder::new(4).channel(&channel).build().unwrap();
        let producer = cq.producer();
        let pusher = thread::spawn(move || {
            producer.push(numbered(0), false).unwrap();
            producer.push(numbered(1), false).unwrap();
        });
        let saw_completion = cq.req_notify_and_check(false);
        pusher.join().unwrap();
        let events = take_events(&channel, cq.id(), 0);
        assert!(events <= 1, "{events} events for one arm");
        assert!(saw_completion || events == 1, "lost wake-up");
    });
}

// ------------------------------------------------------------------ destroy against delivery

/// ibv_get_cq_event(3): "destroying a CQ will wait for all completion events to be
/// acknowledged"; the non-waiting `destroy` refuses instead. A producer pushes to an armed
/// CQ while a getter takes (and later acknowledges) an event and the owner destroys the CQ:
/// the getter never holds an event of a CQ whose destroy already returned `Ok`, and no event
/// for the CQ is left on the channel once destroy succeeded.
#[test]
fn destroy_against_event_delivery_never_strands_an_event() {
    model(Some(4), || {
        let channel = CompletionChannel::new().unwrap();
        let cq = CqBuilder::new(4).channel(&channel).build().unwrap();
        let cq_id = cq.id();
        cq.req_notify(false);
        let destroyed = Arc::new(AtomicBool::new(false));

        let producer = cq.producer();
        let pusher = thread::spawn(move || {
            // After destroy the push is refused; before, it is accepted.
            match producer.push(numbered(0), false) {
                Ok(()) | Err(PushError::Destroyed) => {}
                Err(e) => panic!("unexpected push error {e:?}"),
            }
        });
        let getter = {
            let channel = channel.clone();
            let destroyed = destroyed.clone();
            thread::spawn(move || {
                if let Some(event) = channel.try_get_event().unwrap() {
                    assert!(event.is_for(cq_id));
                    // Still holding the (unacknowledged) event: destroy cannot have
                    // succeeded.
                    assert!(
                        !destroyed.load(Ordering::SeqCst),
                        "destroy returned Ok while a delivered event was unacknowledged"
                    );
                    drop(event);
                }
            })
        };

        let left = match cq.destroy() {
            Ok(()) => {
                destroyed.store(true, Ordering::SeqCst);
                None
            }
            Err((cq, e)) => {
                assert!(
                    matches!(
                        e,
                        DestroyError::UnacknowledgedEvents(_) | DestroyError::QueuePairsAttached(_)
                    ),
                    "{e}"
                );
                Some(cq)
            }
        };
        pusher.join().unwrap();
        getter.join().unwrap();
        if let Some(cq) = left {
            // Every delivered event is acknowledged now; queued ones are withdrawn.
            cq.destroy().map_err(|(_, e)| e).unwrap();
        }
        assert_eq!(channel.pending(), 0);
        assert!(channel.try_get_event().unwrap().is_none());
    });
}

/// The channel's count of queued events (`CompletionChannel::pending`) never exceeds the
/// events that exist, even while a delivery races a destroy that withdraws the event. (An
/// earlier `deliver` counted the event only after releasing the queue lock, so a destroy in
/// between withdrew it first and the count wrapped to `usize::MAX`; this model finds that.)
#[test]
fn channel_pending_never_counts_more_events_than_exist() {
    model(Some(4), || {
        let channel = CompletionChannel::new().unwrap();
        let cq = CqBuilder::new(4).channel(&channel).build().unwrap();
        cq.req_notify(false);
        let producer = cq.producer();
        let pusher = thread::spawn(move || {
            let _ = producer.push(numbered(0), false);
        });
        let watcher = {
            let channel = channel.clone();
            thread::spawn(move || {
                let pending = channel.pending();
                assert!(
                    pending <= 1,
                    "pending() = {pending:#x} with one event at most"
                );
            })
        };
        let _ = cq.destroy();
        pusher.join().unwrap();
        watcher.join().unwrap();
        while channel.try_get_event().unwrap().is_some() {}
    });
}

// ------------------------------------------------------------------ two consumers

/// A thread-safe CQ polled by two threads while a producer pushes: together they receive
/// every completion exactly once (ibv_poll_cq(3): "cannot be returned to it"), and each
/// consumer's own share comes out in order.
#[test]
fn two_consumers_against_a_producer_lose_and_duplicate_nothing() {
    model(Some(4), || {
        let cq = Arc::new(CqBuilder::new(4).build().unwrap());
        let producer = cq.producer();
        let pusher = thread::spawn(move || {
            for i in 0..3 {
                producer.push(numbered(i), false).unwrap();
            }
        });
        let consumer = {
            let cq = cq.clone();
            thread::spawn(move || {
                let mut got = poll_once(&cq, 1);
                got.extend(poll_once(&cq, 2));
                got
            })
        };
        let mut mine = poll_once(&cq, 2);
        mine.extend(poll_once(&cq, 1));
        pusher.join().unwrap();
        let theirs = consumer.join().unwrap();
        assert!(mine.windows(2).all(|w| w[0] < w[1]), "{mine:?}");
        assert!(theirs.windows(2).all(|w| w[0] < w[1]), "{theirs:?}");
        let rest = drain(&cq);
        let mut all: Vec<u64> = mine.iter().chain(&theirs).chain(&rest).copied().collect();
        all.sort_unstable();
        assert_eq!(
            all,
            [0, 1, 2],
            "mine {mine:?} theirs {theirs:?} rest {rest:?}"
        );
        assert_eq!(cq.stats().polled, 3);
    });
}

// ------------------------------------------------------------------ the biased locks

/// The producer lock's bias (`src/cq/biased_lock.rs`): under loom one push through the spin
/// lock completes a thread's streak and grants it the bias, so this thread pushes 1 and 2 on
/// the biased path (plain stores, light barrier) while a second producer revokes the bias
/// (heavy barrier, waiting for the owner to leave) and pushes 10 and 11. Never are both
/// inside: every completion is in the CQ once, whole, each producer's in its order.
#[test]
fn a_biased_producer_and_a_revoking_producer_lose_and_duplicate_nothing() {
    model(Some(3), || {
        let cq = CqBuilder::new(8).build().unwrap();
        let producer = cq.producer();
        producer.push(numbered(0), false).unwrap();
        let other = cq.producer();
        let revoker = thread::spawn(move || {
            for i in 10..12 {
                other.push(numbered(i), false).unwrap();
            }
        });
        for i in 1..3 {
            producer.push(numbered(i), false).unwrap();
        }
        revoker.join().unwrap();
        let all = drain(&cq);
        let mine: Vec<u64> = all.iter().copied().filter(|&i| i < 10).collect();
        let theirs: Vec<u64> = all.iter().copied().filter(|&i| i >= 10).collect();
        assert_eq!(mine, [0, 1, 2], "all {all:?}");
        assert_eq!(theirs, [10, 11], "all {all:?}");
        assert_eq!(cq.stats().produced, 5);
    });
}

/// Makes the calling thread the owner of `cq`'s biased consumer lock: under loom one poll
/// through the spin lock completes the streak. Pushes and polls completion `first` to get
/// there.
fn become_consumer_owner(cq: &CompletionQueue, first: u64) {
    cq.producer().push(numbered(first), false).unwrap();
    assert_eq!(poll_once(cq, 1), [first]);
}

/// ibv_poll_cq(3) may be called from several threads at once; each completion is returned
/// once. The consumer lock's owner polls on the biased path while a second consumer revokes
/// the bias (heavy barrier, waiting for the owner to leave) and a producer pushes: between
/// them they receive every completion exactly once, each in order, whole.
#[test]
fn a_biased_consumer_and_a_revoking_consumer_against_a_producer_take_each_completion_once() {
    model(Some(3), || {
        let cq = Arc::new(CqBuilder::new(4).build().unwrap());
        become_consumer_owner(&cq, 0);
        let producer = cq.producer();
        let pusher = thread::spawn(move || {
            for i in 1..3 {
                producer.push(numbered(i), false).unwrap();
            }
        });
        let revoker = {
            let cq = cq.clone();
            thread::spawn(move || {
                let mut got = poll_once(&cq, 1);
                got.extend(poll_once(&cq, 1));
                got
            })
        };
        let mut mine = poll_once(&cq, 1);
        mine.extend(poll_once(&cq, 2));
        pusher.join().unwrap();
        let theirs = revoker.join().unwrap();
        assert!(mine.windows(2).all(|w| w[0] < w[1]), "{mine:?}");
        assert!(theirs.windows(2).all(|w| w[0] < w[1]), "{theirs:?}");
        let rest = drain(&cq);
        let mut all: Vec<u64> = mine.iter().chain(&theirs).chain(&rest).copied().collect();
        all.sort_unstable();
        assert_eq!(all, [1, 2], "mine {mine:?} theirs {theirs:?} rest {rest:?}");
        assert_eq!(cq.stats().polled, 3);
    });
}

/// ibv_start_poll(3) holds the CQ until ibv_end_poll: the owner of the consumer lock's bias
/// holds an extended-poll batch (on the biased path, across its own code) while a second
/// consumer polls, revoking the bias and waiting for the batch to end. The batch consumes
/// what it was positioned on, the other consumer the rest; nothing twice.
#[test]
fn a_poll_batch_held_by_the_biased_consumer_excludes_a_revoking_consumer() {
    model(Some(2), || {
        let cq = Arc::new(CqBuilder::new(4).build().unwrap());
        become_consumer_owner(&cq, 0);
        let producer = cq.producer();
        for i in 1..3 {
            producer.push(numbered(i), false).unwrap();
        }
        let revoker = {
            let cq = cq.clone();
            thread::spawn(move || poll_once(&cq, 2))
        };
        let mine = match cq.start_poll().unwrap() {
            Some(batch) => {
                let first = assert_whole(batch.completion());
                drop(batch);
                vec![first]
            }
            None => Vec::new(),
        };
        let theirs = revoker.join().unwrap();
        let rest = drain(&cq);
        let mut all: Vec<u64> = mine.iter().chain(&theirs).chain(&rest).copied().collect();
        all.sort_unstable();
        assert_eq!(all, [1, 2], "mine {mine:?} theirs {theirs:?} rest {rest:?}");
    });
}

/// ibv_req_notify_cq(3) with the consumer bias in play: the owner arms (with the check)
/// while a second consumer revokes its bias by polling and a producer pushes. No lost
/// wake-up: the check saw a completion, or the one event came, or the other consumer had
/// already taken the completion. Never two events for one arm; the completion is taken
/// exactly once.
#[test]
fn arming_by_a_biased_consumer_against_a_revoking_consumer_and_a_push_never_loses_the_wakeup() {
    model(Some(3), || {
        let channel = CompletionChannel::new().unwrap();
        let cq = Arc::new(CqBuilder::new(4).channel(&channel).build().unwrap());
        become_consumer_owner(&cq, 0);
        let producer = cq.producer();
        let pusher = thread::spawn(move || producer.push(numbered(1), false).unwrap());
        let revoker = {
            let cq = cq.clone();
            thread::spawn(move || poll_once(&cq, 1))
        };
        let saw_completion = cq.req_notify_and_check(false);
        let mine = poll_once(&cq, 1);
        pusher.join().unwrap();
        let theirs = revoker.join().unwrap();
        let events = take_events(&channel, cq.id(), 0);
        assert!(events <= 1, "{events} events for one arm");
        assert!(
            saw_completion || events == 1 || theirs == [1],
            "lost wake-up: mine {mine:?} theirs {theirs:?}"
        );
        let rest = drain(&cq);
        let mut all: Vec<u64> = mine.iter().chain(&theirs).chain(&rest).copied().collect();
        all.sort_unstable();
        assert_eq!(all, [1], "mine {mine:?} theirs {theirs:?} rest {rest:?}");
    });
}

// ------------------------------------------------------------------ litmus: loom's fences

/// Records the outcomes of every execution of a model (one static per model, since the
/// test harness runs models in parallel).
fn record(seen: &std::sync::Mutex<BTreeSet<(u64, u64)>>, outcome: (u64, u64)) {
    seen.lock().unwrap().insert(outcome);
}

/// The store-buffer litmus test with `SeqCst` fences on both sides (what `light_barrier` and
/// `heavy_barrier` are under loom): the outcome where both threads miss the other's store is
/// forbidden, and loom never produces it.
#[test]
fn loom_forbids_the_store_buffer_outcome_with_seqcst_fences() {
    static SEEN: std::sync::Mutex<BTreeSet<(u64, u64)>> = std::sync::Mutex::new(BTreeSet::new());
    model(None, || {
        let x = Arc::new(AtomicU64::new(0));
        let y = Arc::new(AtomicU64::new(0));
        let t = {
            let (x, y) = (x.clone(), y.clone());
            thread::spawn(move || {
                x.store(1, Ordering::Relaxed);
                fence(Ordering::SeqCst);
                y.load(Ordering::Relaxed)
            })
        };
        y.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let r2 = x.load(Ordering::Relaxed);
        let r1 = t.join().unwrap();
        assert!(
            r1 == 1 || r2 == 1,
            "store-buffer outcome with SeqCst fences"
        );
        record(&SEEN, (r1, r2));
    });
    let seen = SEEN.lock().unwrap();
    // The three allowed outcomes are all explored.
    assert!(seen.contains(&(0, 1)) && seen.contains(&(1, 0)) && seen.contains(&(1, 1)));
}

/// The same litmus test without fences: loom does explore the store-buffer outcome, so the
/// notification models above would fail if a fence were missing.
#[test]
fn loom_explores_the_store_buffer_outcome_without_fences() {
    static SEEN: std::sync::Mutex<BTreeSet<(u64, u64)>> = std::sync::Mutex::new(BTreeSet::new());
    model(None, || {
        let x = Arc::new(AtomicU64::new(0));
        let y = Arc::new(AtomicU64::new(0));
        let t = {
            let (x, y) = (x.clone(), y.clone());
            thread::spawn(move || {
                x.store(1, Ordering::Release);
                y.load(Ordering::Acquire)
            })
        };
        y.store(1, Ordering::Release);
        let r2 = x.load(Ordering::Acquire);
        let r1 = t.join().unwrap();
        record(&SEEN, (r1, r2));
    });
    assert!(SEEN.lock().unwrap().contains(&(0, 0)));
}

/// The CQ's own arm/push protocol in miniature (`Ring::write` publishing `seq` with Release,
/// `light_barrier`, the Relaxed read of the arm flag; `arm`'s SeqCst store, `heavy_barrier`,
/// the Acquire read of `seq`), with the producer's fence present or not. Returns whether
/// loom found a lost wake-up.
fn arm_push_protocol_loses_a_wakeup(producer_fence: bool) -> bool {
    static LOST: [std::sync::atomic::AtomicBool; 2] = [
        std::sync::atomic::AtomicBool::new(false),
        std::sync::atomic::AtomicBool::new(false),
    ];
    let lost = &LOST[usize::from(producer_fence)];
    model(None, move || {
        let seq = Arc::new(AtomicU64::new(0));
        let notify = Arc::new(AtomicU8::new(0));
        let producer = {
            let (seq, notify) = (seq.clone(), notify.clone());
            thread::spawn(move || {
                seq.store(1, Ordering::Release);
                if producer_fence {
                    fence(Ordering::SeqCst);
                }
                notify.load(Ordering::Relaxed) != 0
            })
        };
        notify.store(2, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let check_saw_entry = seq.load(Ordering::Acquire) == 1;
        let producer_saw_arm = producer.join().unwrap();
        if !check_saw_entry && !producer_saw_arm {
            lost.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    lost.load(std::sync::atomic::Ordering::Relaxed)
}

/// With the producer's half of the barrier the protocol never loses a wake-up; without it,
/// loom finds the interleaving that does.
#[test]
fn loom_catches_a_missing_producer_fence_in_the_arm_push_protocol() {
    assert!(!arm_push_protocol_loses_a_wakeup(true));
    assert!(arm_push_protocol_loses_a_wakeup(false));
}
