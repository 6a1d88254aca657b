//! The CQ benchmarks of issue 2 ("Benchmarks"), each beside the baseline it is judged
//! against, measured in the same run.
//!
//! 1. **Throughput**: a producer thread pushes 48-byte [`WorkCompletion`]s, a consumer thread
//!    on the other core polls batches of 1, 16 and 64. The CQ (default
//!    [`OverrunPolicy::Error`], so overrun detection and the notification-flag check run on
//!    every push) is fed through [`CqProducer::push`] (one producer-lock acquisition per
//!    completion) and through [`CqProducer::burst`] (16 completions per lock). Baselines:
//!    `rtrb` (SPSC ring; the consumer takes up to a batch with `pop_partial_slice`) and
//!    `crossbeam_queue::ArrayQueue` (the consumer pops up to a batch), carrying the same
//!    record, all with 4096 slots.
//! 2. **Empty poll**: ns per `poll` of an empty [`CompletionQueue`] and [`SingleThreadedCq`],
//!    beside one uncontended `AtomicU64::load(Acquire)` in the same loop shape.
//! 3. **Notification round trip**: two threads on different cores bounce one completion
//!    between two armed CQs, each blocked in [`CompletionChannel::get_event`] (channel spin at
//!    its default and disabled), beside a bare blocking `eventfd` ping-pong.
//!
//! These 2-vCPU machines are noisy, so every benchmark runs as interleaved repetitions (the
//! variants take turns, in a rotating order) and the summary reports medians. The producer
//! and consumer threads are pinned to different CPUs with `sched_setaffinity`.
//!
//! Run: `cargo bench -p softverbs-cq --bench cq` (about a minute). Options after `--`:
//! `--test` (each benchmark once, tiny sizes: the CI smoke run), `--reps N`, and a filter
//! (`throughput`, `empty`, `notify`, `diag`) selecting benchmarks by name.
//!
//! The throughput producer honours the default overrun policy the way a verbs application
//! does: it never has more completions outstanding than the CQ holds. The consumer publishes
//! how many it has polled (one store per non-empty poll, on its own cache line) and the
//! producer re-reads that count only when its cached credit runs out, as `rtrb` does with its
//! head index. A variant with [`OverrunPolicy::Backpressure`] (the CQ itself refuses a push
//! to a full ring) needs no such counter and is reported beside it.

use crossbeam_queue::ArrayQueue;
use crossbeam_utils::CachePadded;
use softverbs_cq::{
    CompletionChannel, CompletionQueue, CqBuilder, OverrunPolicy, PushError, SingleThreadedCq,
    WcOpcode, WorkCompletion,
};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Slots in every ring under test.
const CAPACITY: u32 = 4096;
/// Completions per lock in the burst variant.
const BURST: u64 = 16;
/// The consumer batch sizes of benchmark 1.
const BATCHES: [usize; 3] = [1, 16, 64];

// ------------------------------------------------------------------ options and helpers

struct Options {
    /// `--test`: every benchmark once with tiny sizes, for CI.
    test: bool,
    reps: usize,
    filters: Vec<String>,
}

impl Options {
    fn from_args() -> Options {
        let mut options = Options {
            test: false,
            reps: 5,
            filters: Vec::new(),
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--test" => options.test = true,
                "--reps" => {
                    options.reps = args
                        .next()
                        .and_then(|n| n.parse().ok())
                        .expect("--reps takes a number");
                }
                // `cargo bench` passes `--bench`; ignore it and other harness flags.
                a if a.starts_with('-') => {}
                filter => options.filters.push(filter.to_owned()),
            }
        }
        if options.test {
            options.reps = 1;
        }
        options
    }

    fn wants(&self, name: &str) -> bool {
        self.filters.is_empty() || self.filters.iter().any(|f| name.contains(f.as_str()))
    }
}

/// The two CPUs the threads of a two-thread benchmark run on (the first two this process
/// may use), or `None` on a one-CPU machine.
fn cpu_pair() -> Option<(usize, usize)> {
    let set = rustix::thread::sched_getaffinity(None).ok()?;
    let mut cpus = (0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| set.is_set(c));
    Some((cpus.next()?, cpus.next()?))
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        let mut set = rustix::thread::CpuSet::new();
        set.set(cpu);
        rustix::thread::sched_setaffinity(None, &set).expect("sched_setaffinity");
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let i = ((values.len() as f64 - 1.0) * p).round() as usize;
    values[i]
}

/// Collects interleaved repetitions: `rounds` rounds, each running every variant once, in a
/// rotating order so that no variant always runs first (after an idle period) or last.
fn interleave<const N: usize>(rounds: usize, mut run: impl FnMut(usize) -> f64) -> [Vec<f64>; N] {
    let mut results: [Vec<f64>; N] = std::array::from_fn(|_| Vec::new());
    for round in 0..rounds {
        for k in 0..N {
            let variant = (k + round) % N;
            results[variant].push(run(variant));
        }
    }
    results
}

/// One line of the closing summary.
struct Row {
    benchmark: String,
    ours: String,
    baseline: String,
    ratio: f64,
    target: String,
    /// `None`: informational, no target.
    met: Option<bool>,
}

fn wc(wr_id: u64) -> WorkCompletion {
    WorkCompletion::success(wr_id, WcOpcode::Recv, 0x11).with_byte_len(64)
}

// ------------------------------------------------------------------ 1. throughput

/// Runs `producer` and `consumer` on two pinned threads released together; returns what
/// the consumer measured (from release to its last completion).
fn two_threads(
    cpus: Option<(usize, usize)>,
    producer: impl FnOnce() + Send,
    consumer: impl FnOnce() -> Duration + Send,
) -> Duration {
    let barrier = Barrier::new(2);
    thread::scope(|s| {
        let barrier = &barrier;
        let p = s.spawn(move || {
            pin(cpus.map(|c| c.0));
            barrier.wait();
            producer();
        });
        let c = s.spawn(move || {
            pin(cpus.map(|c| c.1));
            barrier.wait();
            consumer()
        });
        p.join().expect("producer panicked");
        c.join().expect("consumer panicked")
    })
}

/// The consumer loop shared by every queue: `poll` fills a prefix of its slice and returns
/// its length; every completion's `wr_id` is summed so that each is read and checked.
/// `progress` is told the running total after each non-empty poll.
#[inline(always)]
fn consume(
    n: u64,
    batch: usize,
    mut poll: impl FnMut(&mut [WorkCompletion]) -> usize,
    mut progress: impl FnMut(u64),
) -> Duration {
    let start = Instant::now();
    let mut buf = [WorkCompletion::default(); 64];
    let mut got = 0u64;
    let mut sum = 0u64;
    while got < n {
        let k = poll(&mut buf[..batch]);
        if k == 0 {
            std::hint::spin_loop();
            continue;
        }
        for w in &buf[..k] {
            sum = sum.wrapping_add(w.wr_id());
        }
        got += k as u64;
        progress(got);
    }
    let elapsed = start.elapsed();
    assert_eq!(got, n, "received more than was sent");
    assert_eq!(sum, n * (n - 1) / 2, "lost, duplicated or corrupted completions");
    elapsed
}

/// Waits until the consumer's polled count lets position `sent` be pushed without overrun;
/// returns the new limit (exclusive).
#[inline(never)]
fn wait_for_credit(polled: &AtomicU64, sent: u64, capacity: u64) -> u64 {
    loop {
        // Acquire: the consumer stored its count after its poll published the CQ head, so
        // the CQ's own overrun check sees those slots free too.
        let limit = polled.load(Ordering::Acquire) + capacity;
        if limit > sent {
            return limit;
        }
        std::hint::spin_loop();
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Queue {
    /// `CqProducer::push`, thread-safe `CompletionQueue::poll`.
    CqPush,
    /// `CqProducer::burst` of 16, thread-safe `CompletionQueue::poll`.
    CqBurst,
    /// `CqProducer::burst` of 16, `SingleThreadedCq::poll` (no consumer lock).
    CqBurstSingleThreaded,
    /// `CqProducer::burst` of 16 under `OverrunPolicy::Backpressure` (no credit counter).
    CqBurstBackpressure,
    Rtrb,
    ArrayQueue,
}

impl Queue {
    fn name(self) -> &'static str {
        match self {
            Queue::CqPush => "cq push",
            Queue::CqBurst => "cq burst16",
            Queue::CqBurstSingleThreaded => "cq burst16 single-thr.",
            Queue::CqBurstBackpressure => "cq burst16 backpressure",
            Queue::Rtrb => "rtrb",
            Queue::ArrayQueue => "ArrayQueue",
        }
    }
}

/// Moves `n` completions through `queue` with the consumer polling up to `batch` at a time;
/// returns completions per second.
fn throughput(queue: Queue, n: u64, batch: usize, cpus: Option<(usize, usize)>) -> f64 {
    let elapsed = match queue {
        Queue::CqPush | Queue::CqBurst => {
            let cq = CqBuilder::new(CAPACITY).build().expect("create CQ");
            let polled = CachePadded::new(AtomicU64::new(0));
            let elapsed = two_threads(
                cpus,
                || cq_producer(&cq.producer(), &polled, n, queue == Queue::CqBurst),
                || {
                    consume(
                        n,
                        batch,
                        |out| cq.poll(out).expect("poll"),
                        |got| polled.store(got, Ordering::Release),
                    )
                },
            );
            assert_eq!(cq.stats().overruns, 0);
            elapsed
        }
        Queue::CqBurstSingleThreaded => {
            let cq: SingleThreadedCq = CqBuilder::new(CAPACITY)
                .build_single_threaded()
                .expect("create CQ");
            let producer = cq.producer();
            let polled = CachePadded::new(AtomicU64::new(0));
            let mut cq = cq;
            let polled = &polled;
            two_threads(
                cpus,
                || cq_producer(&producer, polled, n, true),
                move || {
                    consume(
                        n,
                        batch,
                        |out| cq.poll(out).expect("poll"),
                        |got| polled.store(got, Ordering::Release),
                    )
                },
            )
        }
        Queue::CqBurstBackpressure => {
            let cq = CqBuilder::new(CAPACITY)
                .overrun(OverrunPolicy::Backpressure)
                .build()
                .expect("create CQ");
            let producer = cq.producer();
            two_threads(
                cpus,
                || {
                    let mut i = 0;
                    while i < n {
                        let mut burst = producer.burst();
                        let stop = n.min(i + BURST);
                        while i < stop {
                            match burst.push(wc(i), false) {
                                Ok(()) => i += 1,
                                Err(PushError::Full(_)) => break,
                                Err(e) => panic!("push: {e}"),
                            }
                        }
                        drop(burst);
                        if i < stop {
                            std::hint::spin_loop();
                        }
                    }
                },
                || consume(n, batch, |out| cq.poll(out).expect("poll"), |_| {}),
            )
        }
        Queue::Rtrb => {
            let (mut tx, mut rx) = rtrb::RingBuffer::<WorkCompletion>::new(CAPACITY as usize);
            two_threads(
                cpus,
                move || {
                    for i in 0..n {
                        let mut item = wc(i);
                        while let Err(rtrb::PushError::Full(back)) = tx.push(item) {
                            item = back;
                            std::hint::spin_loop();
                        }
                    }
                },
                move || {
                    consume(
                        n,
                        batch,
                        |out| rx.pop_partial_slice(out).0.len(),
                        |_| {},
                    )
                },
            )
        }
        Queue::ArrayQueue => {
            let q = ArrayQueue::<WorkCompletion>::new(CAPACITY as usize);
            two_threads(
                cpus,
                || {
                    for i in 0..n {
                        let mut item = wc(i);
                        while let Err(back) = q.push(item) {
                            item = back;
                            std::hint::spin_loop();
                        }
                    }
                },
                || {
                    consume(
                        n,
                        batch,
                        |out| {
                            let mut k = 0;
                            while k < out.len() {
                                match q.pop() {
                                    Some(w) => {
                                        out[k] = w;
                                        k += 1;
                                    }
                                    None => break,
                                }
                            }
                            k
                        },
                        |_| {},
                    )
                },
            )
        }
    };
    n as f64 / elapsed.as_secs_f64()
}

/// The CQ producer under the default overrun policy: never more than `CAPACITY`
/// completions outstanding (see the module doc).
#[inline(always)]
fn cq_producer(producer: &softverbs_cq::CqProducer, polled: &AtomicU64, n: u64, burst: bool) {
    let capacity = u64::from(CAPACITY);
    let mut limit = capacity;
    let mut i = 0;
    while i < n {
        if i >= limit {
            limit = wait_for_credit(polled, i, capacity);
        }
        let end = n.min(limit);
        if burst {
            while i < end {
                let mut b = producer.burst();
                let stop = end.min(i + BURST);
                while i < stop {
                    b.push(wc(i), false).expect("push");
                    i += 1;
                }
            }
        } else {
            while i < end {
                producer.push(wc(i), false).expect("push");
                i += 1;
            }
        }
    }
}

fn bench_throughput(options: &Options, rows: &mut Vec<Row>) {
    let cpus = cpu_pair();
    if cpus.is_none() {
        println!("(one CPU only: producer and consumer share it; throughput figures are not cross-core)");
    }
    let n: u64 = if options.test { 20_000 } else { 4_000_000 };
    println!("\n== 1. throughput: producer thread -> consumer thread, 48-byte completions, {CAPACITY} slots, {n} per run, median of {} ==", options.reps);
    println!("{:>5}  {:<24} {:>10} {:>10} {:>10}", "batch", "queue", "median M/s", "min", "max");
    for batch in BATCHES {
        let mut variants = vec![Queue::CqPush, Queue::CqBurst, Queue::Rtrb, Queue::ArrayQueue];
        if batch == 16 {
            variants.push(Queue::CqBurstSingleThreaded);
            variants.push(Queue::CqBurstBackpressure);
        }
        let mut results: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
        for round in 0..options.reps {
            for k in 0..variants.len() {
                let v = (k + round) % variants.len();
                results[v].push(throughput(variants[v], n, batch, cpus) / 1e6);
            }
        }
        let mut medians = Vec::new();
        for (queue, mut r) in variants.iter().zip(results) {
            let m = median(&mut r);
            println!("{batch:>5}  {:<24} {m:>10.1} {:>10.1} {:>10.1}", queue.name(), r[0], r[r.len() - 1]);
            medians.push(m);
        }
        let best_baseline = medians[2].max(medians[3]);
        let baseline_name = if medians[2] >= medians[3] { "rtrb" } else { "ArrayQueue" };
        for (i, queue) in variants.iter().enumerate() {
            if matches!(queue, Queue::Rtrb | Queue::ArrayQueue) {
                continue;
            }
            let ratio = medians[i] / best_baseline;
            let gated = batch == 16 && matches!(queue, Queue::CqPush | Queue::CqBurst);
            rows.push(Row {
                benchmark: format!("throughput b{batch} {}", queue.name()),
                ours: format!("{:.1} M/s", medians[i]),
                baseline: format!("{best_baseline:.1} M/s {baseline_name}"),
                ratio,
                target: if gated { ">= 2.0x".into() } else { "-".into() },
                met: gated.then_some(ratio >= 2.0),
            });
        }
    }
}

// ------------------------------------------------------------------ 2. empty poll

/// Nanoseconds per call of `f`, over `calls` calls.
#[inline(always)]
fn ns_per_call(calls: u64, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..calls {
        f();
    }
    start.elapsed().as_nanos() as f64 / calls as f64
}

fn bench_empty_poll(options: &Options, rows: &mut Vec<Row>) {
    let calls: u64 = if options.test { 10_000 } else { 20_000_000 };
    let cq: CompletionQueue = CqBuilder::new(CAPACITY).build().expect("create CQ");
    let mut st: SingleThreadedCq = CqBuilder::new(CAPACITY)
        .build_single_threaded()
        .expect("create CQ");
    // Not empty-from-birth: push and poll a few so the head is not at position 0.
    for i in 0..5 {
        cq.producer().push(wc(i), false).expect("push");
        st.producer().push(wc(i), false).expect("push");
    }
    let mut buf = [WorkCompletion::default(); 16];
    assert_eq!(cq.poll(&mut buf).expect("poll"), 5);
    assert_eq!(st.poll(&mut buf).expect("poll"), 5);
    let atomic = AtomicU64::new(7);
    let names = ["AtomicU64::load(Acquire)", "CompletionQueue::poll", "SingleThreadedCq::poll", "empty loop"];
    let rounds = options.reps.max(1) * 2 - usize::from(options.test);
    let mut results = interleave::<4>(rounds, |variant| match variant {
        // black_box on the receiver: the loop cannot hoist the load; black_box on the result:
        // it cannot drop it. The same shape for all four.
        0 => ns_per_call(calls, || {
            black_box(black_box(&atomic).load(Ordering::Acquire));
        }),
        1 => ns_per_call(calls, || {
            let n = black_box(&cq).poll(black_box(&mut buf[..])).expect("poll");
            black_box(n);
        }),
        2 => ns_per_call(calls, || {
            let n = black_box(&mut st).poll(black_box(&mut buf[..])).expect("poll");
            black_box(n);
        }),
        _ => ns_per_call(calls, || {
            black_box(black_box(&atomic));
        }),
    });
    println!("\n== 2. polling an empty CQ: ns per call, {calls} calls per run, median of {rounds} ==");
    let mut medians = [0.0; 4];
    for (i, r) in results.iter_mut().enumerate() {
        medians[i] = median(r);
        println!("  {:<26} {:>7.3} ns  (min {:.3}, max {:.3})", names[i], medians[i], r[0], r[r.len() - 1]);
    }
    for (i, name) in [(1, "empty poll CompletionQueue"), (2, "empty poll SingleThreadedCq")] {
        let ratio = medians[i] / medians[0];
        rows.push(Row {
            benchmark: name.into(),
            ours: format!("{:.2} ns", medians[i]),
            baseline: format!("{:.2} ns atomic load", medians[0]),
            ratio,
            target: "<= 2 ns, <= 1.0x".into(),
            met: Some(medians[i] <= 2.0 && ratio <= 1.0),
        });
    }
}

// ------------------------------------------------------------------ 3. notification

/// Round trips of one completion between two armed CQs, each side blocked in
/// `get_event` on its channel; returns every round trip in microseconds.
fn cq_ping_pong(round_trips: usize, spin: Option<Duration>, cpus: Option<(usize, usize)>) -> Vec<f64> {
    let channel_a = CompletionChannel::new().expect("channel");
    let channel_b = CompletionChannel::new().expect("channel");
    if let Some(spin) = spin {
        channel_a.set_spin(spin);
        channel_b.set_spin(spin);
    }
    let cq_a = CqBuilder::new(CAPACITY).channel(&channel_a).build().expect("create CQ");
    let cq_b = CqBuilder::new(CAPACITY).channel(&channel_b).build().expect("create CQ");
    let (to_a, to_b) = (cq_a.producer(), cq_b.producer());
    let barrier = Barrier::new(2);
    let times = Mutex::new(Vec::with_capacity(round_trips));
    thread::scope(|s| {
        // The responder: wait for A's event, re-arm, poll A, reply on B.
        s.spawn(|| {
            pin(cpus.map(|c| c.1));
            let mut buf = [WorkCompletion::default(); 4];
            cq_a.req_notify(false);
            barrier.wait();
            for i in 0..round_trips as u64 {
                let event = channel_a.get_event().expect("get_event");
                assert!(event.is_for(cq_a.id()));
                drop(event);
                cq_a.req_notify(false);
                assert_eq!(cq_a.poll(&mut buf).expect("poll"), 1);
                to_b.push(wc(i), false).expect("push");
            }
        });
        // The initiator: push to A, wait for B's event, re-arm, poll B.
        s.spawn(|| {
            pin(cpus.map(|c| c.0));
            let mut buf = [WorkCompletion::default(); 4];
            let mut local = Vec::with_capacity(round_trips);
            cq_b.req_notify(false);
            barrier.wait();
            for i in 0..round_trips as u64 {
                let start = Instant::now();
                to_a.push(wc(i), false).expect("push");
                let event = channel_b.get_event().expect("get_event");
                drop(event);
                local.push(start.elapsed().as_nanos() as f64 / 1e3);
                cq_b.req_notify(false);
                assert_eq!(cq_b.poll(&mut buf).expect("poll"), 1);
            }
            *times.lock().expect("times") = local;
        });
    });
    times.into_inner().expect("times")
}

/// The same round trip over two bare blocking eventfds.
fn eventfd_ping_pong(round_trips: usize, cpus: Option<(usize, usize)>) -> Vec<f64> {
    use rustix::event::{eventfd, EventfdFlags};
    let a = eventfd(0, EventfdFlags::CLOEXEC).expect("eventfd");
    let b = eventfd(0, EventfdFlags::CLOEXEC).expect("eventfd");
    let barrier = Barrier::new(2);
    let times = Mutex::new(Vec::with_capacity(round_trips));
    let one = 1u64.to_ne_bytes();
    thread::scope(|s| {
        s.spawn(|| {
            pin(cpus.map(|c| c.1));
            let mut buf = [0u8; 8];
            barrier.wait();
            for _ in 0..round_trips {
                rustix::io::read(&a, &mut buf).expect("read");
                rustix::io::write(&b, &one).expect("write");
            }
        });
        s.spawn(|| {
            pin(cpus.map(|c| c.0));
            let mut buf = [0u8; 8];
            let mut local = Vec::with_capacity(round_trips);
            barrier.wait();
            for _ in 0..round_trips {
                let start = Instant::now();
                rustix::io::write(&a, &one).expect("write");
                rustix::io::read(&b, &mut buf).expect("read");
                local.push(start.elapsed().as_nanos() as f64 / 1e3);
            }
            *times.lock().expect("times") = local;
        });
    });
    times.into_inner().expect("times")
}

fn bench_notify(options: &Options, rows: &mut Vec<Row>) {
    let cpus = cpu_pair();
    let round_trips = if options.test { 20 } else { 2_000 };
    let names = ["eventfd ping-pong", "cq, default spin (20 us)", "cq, spin 0"];
    let mut all: [Vec<f64>; 3] = std::array::from_fn(|_| Vec::new());
    let mut means = interleave::<3>(options.reps, |variant| {
        let times = match variant {
            0 => eventfd_ping_pong(round_trips, cpus),
            1 => cq_ping_pong(round_trips, None, cpus),
            _ => cq_ping_pong(round_trips, Some(Duration::ZERO), cpus),
        };
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        all[variant].extend(times);
        mean
    });
    println!("\n== 3. notification round trip between two threads on different CPUs, {round_trips} per run, {} runs (us) ==", options.reps);
    println!("  {:<26} {:>12} {:>8} {:>8} {:>8}", "", "median mean", "p50", "p90", "p99");
    let mut stats = [(0.0, 0.0); 3];
    for i in 0..3 {
        let mean = median(&mut means[i]);
        let p50 = percentile(&mut all[i], 0.5);
        let p90 = percentile(&mut all[i], 0.9);
        let p99 = percentile(&mut all[i], 0.99);
        println!("  {:<26} {mean:>12.2} {p50:>8.2} {p90:>8.2} {p99:>8.2}", names[i]);
        stats[i] = (mean, p50);
    }
    for i in 1..3 {
        let ratio = stats[i].1 / stats[0].1;
        rows.push(Row {
            benchmark: format!("notify RTT p50, {}", names[i]),
            ours: format!("{:.2} us", stats[i].1),
            baseline: format!("{:.2} us eventfd", stats[0].1),
            ratio,
            target: "<= 1.2x".into(),
            met: Some(ratio <= 1.2),
        });
        let ratio = stats[i].0 / stats[0].0;
        rows.push(Row {
            benchmark: format!("notify RTT mean, {}", names[i]),
            ours: format!("{:.2} us", stats[i].0),
            baseline: format!("{:.2} us eventfd", stats[0].0),
            ratio,
            target: "<= 1.2x".into(),
            met: Some(ratio <= 1.2),
        });
    }
}

// ------------------------------------------------------------------ main

fn main() {
    let options = Options::from_args();
    let started = Instant::now();
    let mut rows = Vec::new();
    if options.wants("throughput") {
        bench_throughput(&options, &mut rows);
    }
    if options.wants("empty") {
        bench_empty_poll(&options, &mut rows);
    }
    if options.wants("notify") {
        bench_notify(&options, &mut rows);
    }
    println!("\n== summary (ratio = ours / baseline; medians of interleaved runs{}) ==", if options.test { "; --test: one tiny run each, figures meaningless" } else { "" });
    println!("{:<40} {:>14} {:>26} {:>8} {:>18}  result", "benchmark", "ours", "baseline", "ratio", "target");
    for row in &rows {
        let result = match row.met {
            None => "info",
            Some(true) => "met",
            Some(false) => "MISSED",
        };
        println!("{:<40} {:>14} {:>26} {:>7.2}x {:>18}  {result}", row.benchmark, row.ours, row.baseline, row.ratio, row.target);
    }
    println!("(total {:.1} s)", started.elapsed().as_secs_f64());
}
