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
use std::process::Stdio;
use std::time::Duration;

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

#[test]
fn a_receiver_paused_for_a_millisecond_and_a_half_costs_a_shared_memory_sender_no_drop() {
    let dir = TempDir::new("shm-pause");
    let stats = dir.join("client.stats");
    // Both on the default network: shared memory between processes of this host.
    let (mut server, server_out, port) = start_server(&["perf", "write", "bw"]);
    let server_pid = Pid::from_raw(server.id() as i32).expect("the server's process ID");
    let client = softverbs()
        .args([
            "perf", "write", "bw", "-s", "1048576", "-t", "128", "-D", "2",
        ])
        .args(["--client", "127.0.0.1", "-p", &port.to_string(), "--json"])
        .env("SOFTVERBS_STATS", &stats)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the client");
    // The run measures its middle second; the pauses fall in it.
    std::thread::sleep(Duration::from_millis(600));
    for _ in 0..PAUSES {
        kill_process(server_pid, Signal::STOP).expect("stop the receiver");
        std::thread::sleep(PAUSE);
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
    let (dropped, retransmitted) = (
        counter(&line, "dropped_undeliverable"),
        counter(&line, "retransmitted_packets"),
    );
    assert!(
        dropped < PAUSES / 2,
        "{dropped} packets dropped on a full ring over {PAUSES} pauses of {PAUSE:?} \
         ({retransmitted} retransmitted): {line}"
    );
}
