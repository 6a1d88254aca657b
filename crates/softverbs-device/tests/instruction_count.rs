//! Instructions per device round trip, counted by valgrind's callgrind: what the device adds
//! around the engine (locks, runs, the hand-over to the peer device, completions into the
//! CQ, held ACKs) is pinned by a count, so a regression fails as a number, not as a time on
//! a noisy machine. (The engine's own share is pinned by softverbs-proto's
//! `tests/instruction_count.rs`.)
//!
//! One round trip is what an 8-byte RC SEND ping-pong between two devices of one process
//! does per iteration, through the device API as the safe API calls it: A posts a signaled
//! SEND, B's receive completes and B re-posts it, A's send completes; then the same from
//! B to A; both busy-poll their CQs. Packets between the devices
//! are handed over in memory on the posting thread, so every instruction of the exchange
//! runs inside [`measured_round_trips`] on the test's thread.
//!
//! [`callgrind_counts_stay_within_bounds`] runs this binary again under
//! `valgrind --tool=callgrind --toggle-collect` on [`measured_round_trips`] with
//! [`DRIVER`] set; the instructions counted, divided by the round trips, are the cost of
//! one. Fails loudly without valgrind. `cargo test --release -p softverbs-device --test
//! instruction_count -- --nocapture` prints the count; `SOFTVERBS_DEVICE_COUNT_KEEP=1`
//! keeps the callgrind output for `callgrind_annotate`.
//!
//! The bounds ([`BOUNDS`]) are about 1.1 times the optimised build's count and 1.12 times
//! the dev profile's when they were set, so that a return to the device's per-packet
//! allocations (16 per round trip, about 3,500 instructions) fails. History (instructions
//! per round trip, the engine's share included): 20,710 optimised, 32,304 dev, when this
//! test was written — after the device stopped allocating per packet, hashing its tables
//! with SipHash and copying each packet from a scratch buffer (the engine's share 11,201);
//! 19,741 / 30,526 once the engine parsed and emitted without the wire crate's
//! `PacketRepr` in between (its share 10,407); 20,749 optimised (from 19,827) once a
//! payload of 1 KiB or more is read where it goes (`crate::deferred` in the device: the
//! bookkeeping of reads left for later costs every packet about 230 instructions, an
//! 8-byte ping-pong included); 19,871 once a run that leaves the engine nothing to do (a
//! post of a receive) skips the drain and delivery, and the path check of an IPv4 packet
//! compares bytes instead of working out addresses (31,004 dev); 19,401 / 30,600 once a
//! work request holds its one scatter/gather entry inline (`SgeList`): retiring a request
//! no longer frees a `Vec` (the requests are built before the measured region, so their
//! allocations were never counted here; `tests/allocations.rs` counts them); 19,367 ->
//! 17,019 once the release profile optimised the whole program at once (fat LTO, one
//! codegen unit; the dev profile is unchanged by that); 16,777 once a post of a receive no
//! longer reads the clock and a drain stops after one round when no local operation waits;
//! 16,593 once a drain resolves a packet's destination GID only when it changes; 16,537
//! once a run visits the device's CQs for their moderation deadlines only while some CQ
//! of the process is moderated (with 1,000 idle CQs per device it cost 118,019 before,
//! [`a_thousand_idle_cqs_add_nothing_to_a_round_trip`]).

mod common;

use common::rc::{in_process_pair, recv_wr, send_wr, wait_one, Side};
use softverbs_cq::{CompletionQueue, CqBuilder};
use softverbs_proto::{QpInit, QpType, RecvWr, SendWr};
use std::hint::black_box;
use std::path::Path;
use std::process::Command;

/// Round trips measured.
const ROUNDS: u64 = 2_000;
/// Round trips before the measured ones.
const WARMUP: u64 = 200;

/// The environment variable that makes a run of `count_driver` drive the devices.
const DRIVER: &str = "SOFTVERBS_DEVICE_COUNT_DRIVER";

/// `rounds` round trips; the work requests are built before (they are the caller's).
#[inline(never)]
fn measured_round_trips(
    a: &Side,
    b: &Side,
    rounds: u64,
    requests: &mut Vec<[(SendWr, RecvWr); 2]>,
) {
    for _ in 0..rounds {
        let [(a_send, b_recv), (b_send, a_recv)] = requests.pop().expect("built");
        for (from, to, send, recv) in [(a, b, a_send, b_recv), (b, a, b_send, a_recv)] {
            from.device.post_send(from.qpn, send).unwrap();
            black_box(wait_one(to));
            to.device.post_recv(to.qpn, recv).unwrap();
            black_box(wait_one(from));
        }
    }
}

fn requests(a: &Side, b: &Side, rounds: u64) -> Vec<[(SendWr, RecvWr); 2]> {
    (0..rounds)
        .map(|n| {
            [
                (send_wr(a, n), recv_wr(b, n)),
                (send_wr(b, n), recv_wr(a, n)),
            ]
        })
        .collect()
}

/// The workload valgrind runs (with [`DRIVER`] set); a no-op otherwise. With [`DRIVER`]
/// set to [`IDLE_CQS`], each device has [`IDLE_CQ_COUNT`] more RC QPs first, each with a
/// CQ of its own, which the round trips never use.
#[test]
fn count_driver() {
    let Some(mode) = std::env::var_os(DRIVER) else {
        return;
    };
    let (a, b) = in_process_pair();
    let _idle: Vec<CompletionQueue> = if mode == IDLE_CQS {
        [&a, &b]
            .into_iter()
            .flat_map(|side| (0..IDLE_CQ_COUNT).map(move |_| idle_qp(side)))
            .collect()
    } else {
        Vec::new()
    };
    let mut warmup = requests(&a, &b, WARMUP);
    warm_up(&a, &b, &mut warmup);
    let mut measured = requests(&a, &b, ROUNDS);
    measured_round_trips(&a, &b, ROUNDS, &mut measured);
}

/// The warm-up, outside the measured function.
fn warm_up(a: &Side, b: &Side, requests: &mut Vec<[(SendWr, RecvWr); 2]>) {
    for _ in 0..requests.len() {
        let [(a_send, b_recv), (b_send, a_recv)] = requests.pop().expect("built");
        for (from, to, send, recv) in [(a, b, a_send, b_recv), (b, a, b_send, a_recv)] {
            from.device.post_send(from.qpn, send).unwrap();
            wait_one(to);
            to.device.post_recv(to.qpn, recv).unwrap();
            wait_one(from);
        }
    }
}

/// The [`DRIVER`] value that gives each device [`IDLE_CQ_COUNT`] idle QPs and CQs.
const IDLE_CQS: &str = "idle-cqs";

/// Idle QPs, each with a CQ of its own, per device in the [`IDLE_CQS`] workload.
const IDLE_CQ_COUNT: usize = 1_000;

/// An RC QP of `side`'s device (in RESET: never used) completing into a CQ of its own,
/// which is returned (the QP keeps only producers).
fn idle_qp(side: &Side) -> CompletionQueue {
    let cq = CqBuilder::new(16).build().unwrap();
    side.device
        .create_qp(
            QpInit::new(QpType::Rc).with_pd(side.pd),
            cq.producer(),
            cq.producer(),
        )
        .unwrap();
    cq
}

/// Instructions per round trip callgrind counted inside [`measured_round_trips`], in the
/// workload [`DRIVER`] `mode` selects, its output in `dir`.
fn per_round_trip(dir: &Path, mode: &str) -> f64 {
    count(dir, mode) as f64 / ROUNDS as f64
}

/// Instructions callgrind counted inside [`measured_round_trips`].
fn count(dir: &Path, mode: &str) -> u64 {
    let out_file = dir.join("callgrind.out");
    let exe = std::env::current_exe().expect("test binary");
    let status = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out_file.display()))
        .arg("--toggle-collect=*measured_round_trips*")
        .arg("--quiet")
        .arg(exe)
        .args(["--exact", "count_driver", "--test-threads=1", "--quiet"])
        .env(DRIVER, mode)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap_or_else(|e| {
            panic!("valgrind is needed to count the device's instructions (apt-get install valgrind): {e}")
        });
    assert!(status.success(), "valgrind run failed: {status}");
    let text = std::fs::read_to_string(&out_file).expect("callgrind output");
    let line = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .expect("callgrind totals");
    line.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("callgrind instruction count")
}

/// The bound on instructions per round trip: optimised build, dev profile (module doc).
const BOUNDS: (u64, u64) = (18_700, 34_200);

#[test]
fn callgrind_counts_stay_within_bounds() {
    if std::env::var_os(DRIVER).is_some() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("softverbs-device-icount-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let per_round = per_round_trip(&dir, "plain");
    let bound = if cfg!(debug_assertions) {
        BOUNDS.1
    } else {
        BOUNDS.0
    };
    println!("{per_round:>10.1} instructions per round trip (bound {bound})");
    if std::env::var_os("SOFTVERBS_DEVICE_COUNT_KEEP").is_some() {
        println!("callgrind output kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert!(
        per_round <= bound as f64,
        "instructions per round trip over the bound: {per_round:.1} > {bound}"
    );
}

/// A device visits its CQs after a run of its engine only where some CQ is moderated
/// (`ibv_modify_cq(3)`: a moderated CQ's event may wait for a period, whose deadline the
/// device keeps): a program with a CQ per connection pays nothing per CQ for each message,
/// as nothing per QP. The round trip with [`IDLE_CQ_COUNT`] idle CQs on each device costs
/// at most 2 % more instructions than without (it cost 1,000 visits of a CQ per run
/// before: several times the round trip).
#[test]
fn a_thousand_idle_cqs_add_nothing_to_a_round_trip() {
    if std::env::var_os(DRIVER).is_some() {
        return;
    }
    let dir = std::env::temp_dir().join(format!(
        "softverbs-device-icount-idle-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let plain = per_round_trip(&dir, "plain");
    let idle = per_round_trip(&dir, IDLE_CQS);
    let _ = std::fs::remove_dir_all(&dir);
    println!("{plain:>10.1} instructions per round trip, {idle:.1} with {IDLE_CQ_COUNT} idle CQs per device");
    assert!(
        idle <= plain * 1.02,
        "idle CQs cost the round trip: {idle:.1} against {plain:.1} instructions"
    );
}
