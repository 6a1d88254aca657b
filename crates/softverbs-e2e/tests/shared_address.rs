//! Several processes on one device address (`SOFTVERBS_ADDR` the same for all), as two MPI
//! ranks of one host talking to a third: the first device binds the address's RoCEv2
//! port, the others join it, each with a share of the QP numbers, and the destination QPN
//! of every packet names the process it is for. Each test runs the verifying mixed-opcode
//! RC workload (every message checked byte by byte) between pairs of peers at once.
//!
//! - Four processes on one loopback address, two pairs: devices of this host send
//!   straight into the inbox of the process that owns the destination QPN.
//! - Three servers on one address, their clients over UDP from addresses of their own:
//!   the holder of the socket forwards each packet to the server it is for. Killing a
//!   member, then the holder, leaves the remaining pair running: another member takes
//!   the socket over; so it does when the holder closes its device.

mod common;

use common::*;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Kills the processes a test started when it ends (a failed test leaves none behind
/// waiting for its deadline); those that finished are gone already.
struct Reaper(Vec<u32>);

impl Reaper {
    fn watch(&mut self, child: &Child) {
        self.0.push(child.id());
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

/// A server at `addr` (shared by several), with its statistics into `stats`.
fn server_at(addr: &str, stats: &std::path::Path) -> Server {
    let mut command = peer();
    command
        .args(["--server", "--timeout-code", "14"])
        .env("SOFTVERBS_ADDR", addr)
        .env("SOFTVERBS_STATS", stats)
        .env_remove("SOFTVERBS_NETWORK");
    start_server(command)
}

/// A client of `server` from `addr` (`None`: UDP only, the first free 127.0.0.x), running
/// `messages` messages.
fn client_of(server: &Server, addr: Option<&str>, messages: u64) -> Child {
    let mut command = peer();
    command
        .args([
            "--client",
            "127.0.0.1",
            "--port",
            &server.port.to_string(),
            "-n",
            &messages.to_string(),
            "--timeout-code",
            "14",
        ])
        .stdout(Stdio::piped());
    match addr {
        Some(addr) => command
            .env("SOFTVERBS_ADDR", addr)
            .env_remove("SOFTVERBS_NETWORK"),
        None => command
            .env_remove("SOFTVERBS_ADDR")
            .env("SOFTVERBS_NETWORK", "udp"),
    };
    command.spawn().expect("start a client")
}

/// Waits for a client and its server; both must have verified `messages` messages.
fn assert_pair_verified(client: Child, server: Server, messages: u64) {
    let (code, out) = finish(client, None, Duration::from_secs(300));
    assert_eq!(code, 0, "client: {out}");
    assert!(
        out.contains(&format!("OK client: {messages} messages verified")),
        "{out}"
    );
    let mut server = server;
    let (code, out) = finish(
        server.child,
        Some(&mut server.stdout),
        Duration::from_secs(60),
    );
    assert_eq!(code, 0, "server: {out}");
    assert!(
        out.contains(&format!("OK server: {messages} messages")),
        "{out}"
    );
}

/// A fresh statistics file for one test.
fn stats_file(name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "softverbs-e2e-shared-{name}-{}.stats",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    path
}

/// The counter `name` of every statistics line in `stats`.
fn counts(stats: &std::path::Path, name: &str) -> Vec<u64> {
    let text = std::fs::read_to_string(stats).expect("the statistics lines");
    text.lines()
        .map(|line| {
            line.split(' ')
                .find_map(|field| field.strip_prefix(name)?.strip_prefix('='))
                .and_then(|value| value.trim_end_matches(';').parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {line}"))
        })
        .collect()
}

#[test]
fn four_processes_on_one_address_run_two_verified_workloads_at_once() {
    const MESSAGES: u64 = 20_000;
    let stats = stats_file("four");
    let address = "127.0.0.171";
    let mut reaper = Reaper(Vec::new());
    let servers = [server_at(address, &stats), server_at(address, &stats)];
    let clients: Vec<Child> = servers
        .iter()
        .map(|server| client_of(server, Some(address), MESSAGES))
        .collect();
    for child in servers.iter().map(|s| &s.child).chain(&clients) {
        reaper.watch(child);
    }
    for (client, server) in clients.into_iter().zip(servers) {
        assert_pair_verified(client, server, MESSAGES);
    }
    // Only the servers report to `stats`: each sent its packets through shared memory,
    // into the inbox of the process its client is.
    let (sent, shm) = (
        counts(&stats, "sent_packets"),
        counts(&stats, "shm_sent_packets"),
    );
    assert_eq!(sent.len(), 2);
    assert!(
        sent.iter().zip(&shm).all(|(s, m)| *s > 0 && s == m),
        "{sent:?} {shm:?}"
    );
    // The second server joined the address the first had bound: its line says it is a
    // member, in the slot after the holder's.
    let lines = std::fs::read_to_string(&stats).expect("the statistics lines");
    assert!(
        lines
            .lines()
            .any(|line| line.contains(&format!("address {address} (shared: slot 1, "))),
        "{lines}"
    );
    let _ = std::fs::remove_file(&stats);
}

/// Polls `child` until it exits or `limit` passes; whether it exited.
fn exited_within(child: &mut Child, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if child.try_wait().expect("wait").is_some() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn a_killed_member_and_a_killed_holder_leave_the_other_pair_running() {
    // About four seconds on a 2-core machine: the surviving pair runs well past the kills.
    const MESSAGES: u64 = 400_000;
    let stats = stats_file("kill");
    let address = "127.0.0.172";
    // The first server holds the socket; the clients reach all three over UDP through it.
    let mut holder = server_at(address, &stats);
    let mut member = server_at(address, &stats);
    let survivor = server_at(address, &stats);
    let mut holder_client = client_of(&holder, None, MESSAGES);
    let mut member_client = client_of(&member, None, MESSAGES);
    let survivor_client = client_of(&survivor, None, MESSAGES);
    let mut reaper = Reaper(Vec::new());
    for child in [&holder.child, &member.child, &survivor.child] {
        reaper.watch(child);
    }
    for child in [&holder_client, &member_client, &survivor_client] {
        reaper.watch(child);
    }
    std::thread::sleep(Duration::from_millis(400));
    for child in [&mut member.child, &mut member_client] {
        child.kill().expect("kill");
        child.wait().expect("reap");
    }
    std::thread::sleep(Duration::from_millis(200));
    for child in [&mut holder.child, &mut holder_client] {
        child.kill().expect("kill");
        child.wait().expect("reap");
    }
    let mut survivor_client = survivor_client;
    assert!(
        !exited_within(&mut survivor_client, Duration::from_millis(100)),
        "the surviving pair ended before the holder was gone: the test proves nothing"
    );
    assert_pair_verified(survivor_client, survivor, MESSAGES);
    // The surviving server took the socket over: it received over UDP after the kill.
    let received = counts(&stats, "received_packets");
    assert_eq!(received.len(), 1, "only the survivor closed its device");
}

#[test]
fn when_the_holder_closes_its_device_another_member_takes_the_socket_over() {
    const SHORT: u64 = 5_000;
    const LONG: u64 = 300_000;
    let stats = stats_file("close");
    let address = "127.0.0.173";
    let holder = server_at(address, &stats);
    let member = server_at(address, &stats);
    let holder_client = client_of(&holder, None, SHORT);
    let member_client = client_of(&member, None, LONG);
    let mut reaper = Reaper(Vec::new());
    for child in [&holder.child, &member.child, &holder_client, &member_client] {
        reaper.watch(child);
    }
    // The holder's pair ends first: its device closes, and frees the socket and its slot.
    assert_pair_verified(holder_client, holder, SHORT);
    let mut member_client = member_client;
    assert!(
        !exited_within(&mut member_client, Duration::from_millis(100)),
        "the member's pair ended before the holder closed: the test proves nothing"
    );
    assert_pair_verified(member_client, member, LONG);
}
