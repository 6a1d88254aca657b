//! A receiver that stops for a moment costs a sender on the shared-memory path no packet.
//!
//! Between two processes of one host, a sender writes its packets into a 4 MiB ring in the
//! receiver's inbox, and when the ring is full it waits for the receiver to take packets
//! out: a lossless link with flow control, as RoCE fabrics run with PFC. A receiver's CPU
//! can be taken from it for a millisecond or more on a busy machine (another program, a
//! kernel thread, a virtual CPU that has to be woken up); a sender that gave up and dropped
//! the packet then paid for it with a go-back-N of every packet after it (IBTA vol. 1
//! §9.7.5.1.1: the responder answers the packets after a missing one with a NAK) and half
//! its congestion window. So the receiver here is stopped (`SIGSTOP`) for 1.5 ms, twenty
//! times, while the sender streams 1 MiB RDMA WRITEs at it, and the pauses must cost the
//! sender no drop: a sender that gave up after 500 µs dropped a packet at every pause
//! (21 in a run here); fewer than half as many drops as pauses are allowed, for the pauses
//! a loaded machine adds itself (up to 5 in a run with a busy loop beside it).

mod common;

use common::{finish, finish_server, softverbs, start_server, TempDir};
use rustix::process::{kill_process, Pid, Signal};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The receiver's pauses, and how long each lasts.
const PAUSES: u64 = 20;
const PAUSE: Duration = Duration::from_micros(1_500);

/// The value of counter `name` in a `SOFTVERBS_STATS` line.
fn counter(line: &str, name: &str) -> u64 {
    line.split([' ', ';'])
        .find_map(|field| field.strip_prefix(name)?.strip_prefix('='))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {line}"))
}

/// The tests of this file run one at a time: two at once would take each other's CPUs.
fn alone() -> MutexGuard<'static, ()> {
    static ALONE: Mutex<()> = Mutex::new(());
    ALONE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `softverbs perf write bw` streaming 1 MiB RDMA WRITEs (128 outstanding) for `seconds`
/// to the server at `port`, its `SOFTVERBS_STATS` line into `stats`.
fn stream(port: u16, stats: &Path, seconds: u32, extra: &[&str]) -> Child {
    softverbs()
        .args(["perf", "write", "bw", "-s", "1048576", "-t", "128"])
        .args(["-D", &seconds.to_string()])
        .args(["--client", "127.0.0.1", "-p", &port.to_string()])
        .args(extra)
        .env("SOFTVERBS_STATS", stats)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the client")
}

/// Streams 1 MiB RDMA WRITEs for two seconds from a client to a server on the default
/// network (shared memory), stopping the server `pauses.len()` times 600 ms into the run,
/// each pause as long as its entry and 40 ms apart; the client's `SOFTVERBS_STATS` line.
fn stream_with_pauses(pauses: &[Duration]) -> String {
    let _alone = alone();
    let dir = TempDir::new("shm-pause");
    let stats = dir.join("client.stats");
    let (mut server, server_out, port) = start_server(&["perf", "write", "bw"]);
    let server_pid = Pid::from_raw(server.id() as i32).expect("the server's process ID");
    let client = stream(port, &stats, 2, &["--json"]);
    // The run measures its middle second; the pauses fall in it.
    std::thread::sleep(Duration::from_millis(600));
    for pause in pauses {
        kill_process(server_pid, Signal::STOP).expect("stop the receiver");
        std::thread::sleep(*pause);
        kill_process(server_pid, Signal::CONT).expect("resume the receiver");
        std::thread::sleep(Duration::from_millis(40));
    }
    let out = finish(client);
    if !out.status.success() {
        let _ = server.kill();
    }
    let (server_code, server_text) = finish_server(server, server_out);
    let client_text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "client: {client_text}\n{}\nserver: {server_text}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(server_code, 0, "server: {server_text}");
    let line = std::fs::read_to_string(&stats).expect("the client's statistics");
    assert!(
        counter(&line, "shm_sent_packets") > 10_000,
        "the WRITEs went through shared memory: {line}"
    );
    line
}

#[test]
fn a_receiver_paused_for_a_millisecond_and_a_half_costs_a_shared_memory_sender_no_drop() {
    let line = stream_with_pauses(&[PAUSE; PAUSES as usize]);
    // A wait that ran out drops its packet, and the packets for that ring after it until
    // the receiver takes one (all counted in `dropped_undeliverable`): the waits count the
    // times a pause cost the sender.
    let (stalls, retransmitted) = (
        counter(&line, "shm_stalls"),
        counter(&line, "retransmitted_packets"),
    );
    assert!(
        stalls < PAUSES / 2,
        "{stalls} waits for room in a full ring ran out over {PAUSES} pauses of {PAUSE:?} \
         ({retransmitted} retransmitted): {line}"
    );
}

/// The QP's retry budget in `softverbs perf`: timeout 14 (4.096 µs · 2^14 = 67 ms), the
/// first send and 7 retries.
const RETRY_BUDGET: Duration = Duration::from_micros(8 * 67_109);

/// A receiver that stops for good (`SIGSTOP`: hung, or stopped in a debugger) while a
/// sender streams through its full ring is a peer that hangs, and the sender must learn it
/// as over UDP: its QP fails with RETRY_EXC_ERR within its retry budget (IBTA vol. 1
/// §9.7.6.1.3: the requester retries `retry_cnt` times after its timeout, then completes
/// the request in error). The sender waits for room once (5 ms); after that, a ring whose
/// receiver took nothing out drops every packet at once, and the retransmission timer
/// runs. A sender that waited 5 ms for each packet of its window kept its application's
/// thread in those waits, its timer stopped with it, and failed 4.6 s after the stop
/// here, eight times its budget.
#[test]
fn a_receiver_stopped_for_good_fails_a_shared_memory_sender_within_its_retry_budget() {
    let _alone = alone();
    let dir = TempDir::new("shm-stop");
    let stats = dir.join("client.stats");
    let (mut server, _server_out, port) = start_server(&["perf", "write", "bw"]);
    let server_pid = Pid::from_raw(server.id() as i32).expect("the server's process ID");
    let client = stream(port, &stats, 8, &[]);
    // Streaming, its window grown past the ring's 4 MiB.
    std::thread::sleep(Duration::from_millis(600));
    kill_process(server_pid, Signal::STOP).expect("stop the receiver");
    let stopped = Instant::now();
    let out = finish(client);
    let failed_after = stopped.elapsed();
    let _ = server.kill();
    let _ = server.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("transport retry counter exceeded"),
        "the sender's QP fails with RETRY_EXC_ERR: {}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    let line = std::fs::read_to_string(&stats).expect("the client's statistics");
    assert!(
        counter(&line, "shm_stalls") >= 1,
        "the sender found the stopped receiver's ring full: {line}"
    );
    assert!(
        failed_after < 3 * RETRY_BUDGET,
        "the sender failed {failed_after:?} after its peer stopped; its retry budget is \
         {RETRY_BUDGET:?}: {line}"
    );
}
