//! Two processes on one host, each with its own automatically chosen 127.0.0.x device
//! address (several processes on one host work with nothing configured),
//! running the verifying mixed-opcode RC workload on both paths between processes of one
//! host: shared memory (the default) and RoCEv2 over UDP (`SOFTVERBS_NETWORK=udp`). The
//! semantics do not change with the path; each test checks, from the devices' statistics,
//! that the path it names carried the packets.

mod common;

use common::*;
use std::process::Stdio;
use std::time::Duration;

/// The two paths: `SOFTVERBS_NETWORK` unset (shared memory to devices of this host) and
/// `udp`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    SharedMemory,
    Udp,
}

impl Path {
    /// A peer command on this path, reporting its statistics into `stats`.
    fn peer(self, stats: &std::path::Path) -> std::process::Command {
        let mut command = peer();
        command.env("SOFTVERBS_STATS", stats);
        match self {
            Path::SharedMemory => command.env_remove("SOFTVERBS_NETWORK"),
            Path::Udp => command.env("SOFTVERBS_NETWORK", "udp"),
        };
        command
    }

    /// Checks that every device that reported in `stats` sent its packets on this path.
    fn assert_carried(self, stats: &std::path::Path, devices: usize) {
        let text = std::fs::read_to_string(stats).expect("the statistics lines");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), devices, "{text}");
        for line in lines {
            let count = |name: &str| -> u64 {
                line.split(' ')
                    .find_map(|field| field.strip_prefix(name)?.strip_prefix('='))
                    .and_then(|value| value.trim_end_matches(';').parse().ok())
                    .unwrap_or_else(|| panic!("no {name} in {line}"))
            };
            let (sent, shm) = (count("sent_packets"), count("shm_sent_packets"));
            match self {
                Path::SharedMemory => assert!(sent > 0 && shm == sent, "{line}"),
                Path::Udp => assert!(sent > 0 && shm == 0 && count("send_calls") > 0, "{line}"),
            }
        }
    }
}

/// A fresh statistics file for one test.
fn stats_file(name: &str) -> std::path::PathBuf {
    let path =
        std::env::temp_dir().join(format!("softverbs-e2e-{name}-{}.stats", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

#[test]
fn two_processes_run_a_verified_mixed_opcode_workload_through_shared_memory() {
    mixed_opcode_workload(Path::SharedMemory);
}

#[test]
fn two_processes_run_a_verified_mixed_opcode_workload_over_udp() {
    mixed_opcode_workload(Path::Udp);
}

fn mixed_opcode_workload(path: Path) {
    let stats = stats_file(&format!("mixed-{path:?}"));
    let capture = stats.with_extension("pcapng");
    let _ = std::fs::remove_file(&capture);
    let mut server = path.peer(&stats);
    server.arg("--server").env_remove("SOFTVERBS_ADDR");
    let mut server = start_server(server);
    let client = path
        .peer(&stats)
        .args([
            "--client",
            "127.0.0.1",
            "--port",
            &server.port.to_string(),
            "-n",
            "6000",
        ])
        .env_remove("SOFTVERBS_ADDR")
        .env("SOFTVERBS_PCAP", &capture)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the client");
    let (code, out) = finish(client, None, Duration::from_secs(120));
    assert_eq!(code, 0, "client: {out}");
    assert!(
        out.starts_with("OK client: 6000 messages verified"),
        "{out}"
    );
    let (code, out) = finish(
        server.child,
        Some(&mut server.stdout),
        Duration::from_secs(30),
    );
    assert_eq!(code, 0, "server: {out}");
    assert!(
        out.contains("OK server: 6000 messages, 2000 sends verified"),
        "{out}"
    );
    path.assert_carried(&stats, 2);
    let _ = std::fs::remove_file(&stats);
    // The client's capture: the RoCEv2 packets the exchange stands for, ICRC and all; in a
    // pcapng file each packet that went through shared memory says so.
    let records = softverbs::core::device::pcap::read_capture(&capture).expect("the capture");
    let _ = std::fs::remove_file(&capture);
    assert!(records.len() > 6_000, "{} packets", records.len());
    for record in &records {
        assert!(record.icrc_ok(), "{record}");
        let marked =
            record.comment.as_deref() == Some(softverbs::core::device::pcap::SHARED_MEMORY_COMMENT);
        assert_eq!(marked, path == Path::SharedMemory, "{record}");
    }
}

#[test]
fn a_peer_killed_mid_run_on_shared_memory_gives_the_survivor_retry_exceeded_then_flushes() {
    killed_peer(Path::SharedMemory);
}

#[test]
fn a_peer_killed_mid_run_over_udp_gives_the_survivor_retry_exceeded_then_flushes() {
    killed_peer(Path::Udp);
}

fn killed_peer(path: Path) {
    // ibv_poll_cq(3) / IBTA 9.7.5.1.3: when the responder stops answering, the requester
    // retries retry_cnt times, completes the request with IBV_WC_RETRY_EXC_ERR, moves the
    // QP to the error state and flushes every later request with IBV_WC_WR_FLUSH_ERR.
    let stats = stats_file(&format!("killed-{path:?}"));
    let mut server = path.peer(&stats);
    server.arg("--server");
    let mut server = start_server(server);
    let mut client = path
        .peer(&stats)
        .args([
            "--client",
            "127.0.0.1",
            "--port",
            &server.port.to_string(),
            "-n",
            "100000000",
            "--timeout-code",
            "13",
            "--retry-cnt",
            "3",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the client");
    std::thread::sleep(Duration::from_millis(300));
    if client.try_wait().unwrap().is_some() {
        let (code, out) = finish(client, None, Duration::from_secs(1));
        panic!("the client ended before the kill: {code} {out}");
    }
    server.child.kill().expect("kill the server");
    let _ = server.child.wait();
    let (code, out) = finish(client, None, Duration::from_secs(30));
    assert_eq!(code, 3, "{out}");
    assert!(
        out.contains("FAILED: transport retry counter exceeded"),
        "{out}"
    );
    assert!(out.contains("flushed") && out.contains("other []"), "{out}");
    // Only the survivor reports (the killed server never closes its device).
    path.assert_carried(&stats, 1);
    let _ = std::fs::remove_file(&stats);
}
