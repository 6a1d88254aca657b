//! Unmodified Debian rdma_cm programs between two processes on the drop-ins: rdmacm-utils'
//! `rping(1)`, `ucmatose(1)`, `udaddy(1)`, `rdma_server(1)` / `rdma_client(1)`,
//! `cmtime(1)`, and perftest's `ib_send_lat(1)` with `-R` (connection through rdma_cm).
//!
//! Each process loads `librdmacm.so.1` (this crate) and `libibverbs.so.1`
//! (softverbs-capi) from one directory (`LD_LIBRARY_PATH`) and gets its own device address
//! (`SOFTVERBS_ADDR=127.0.0.N:4791`, N in 150–179, distinct per test). The server starts
//! first; the client starts once the server's device is up (its UDP port 4791 bound on
//! 127.0.0.N, read from `/proc/net/udp`) and half a second more for its `rdma_listen`.
//! Everything is bounded: after [`PAIR_TIMEOUT`] both are killed and the test fails with
//! both outputs. A missing program is a failure naming its package, never a skip.

mod common;

use common::{library_dir, program, spawn, Finished, Running, ONE_AT_A_TIME};
use std::time::{Duration, Instant};

const PAIR_TIMEOUT: Duration = Duration::from_secs(90);

/// Whether a UDP socket is bound to 127.0.0.`octet`:4791 (the server's device is open).
fn device_up(octet: u8) -> bool {
    let want = format!("{:08X}:12B7", u32::from_le_bytes([127, 0, 0, octet]));
    std::fs::read_to_string("/proc/net/udp").is_ok_and(|t| t.lines().any(|l| l.contains(&want)))
}

fn wait_device(server: &mut Running, octet: u8) -> Result<(), String> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if let Ok(Some(s)) = server.child.try_wait() {
            return Err(format!("server exited early ({s})"));
        }
        if device_up(octet) {
            std::thread::sleep(Duration::from_millis(500));
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err("server's device never came up".into())
}

/// Runs a server/client pair; `persistent`: the server keeps serving and is stopped after
/// the client (it must still be running then).
fn pair(
    name: &str,
    package: &str,
    server_args: &[&str],
    client_args: &[&str],
    octets: (u8, u8),
    persistent: bool,
) -> (Finished, Finished) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let lib = library_dir(name);
    let path = program(name_of(name), package);
    let client_path = program(client_of(name), package);
    let mut server = spawn(&lib, &path, server_args, octets.0);
    if let Err(e) = wait_device(&mut server, octets.0) {
        let (_, s) = server.stop();
        panic!("{name}: {e}\n{}", s.report());
    }
    let client = spawn(&lib, &client_path, client_args, octets.1).wait(PAIR_TIMEOUT);
    let server = if persistent {
        let (before, mut s) = server.stop();
        assert!(
            before.is_none(),
            "{name}: the persistent server ended ({before:?}) instead of serving on\n{}\n{}",
            s.report(),
            client.report()
        );
        s.status = None;
        s
    } else {
        server.wait(PAIR_TIMEOUT)
    };
    (server, client)
}

fn name_of(name: &str) -> &str {
    match name {
        "rdma_server" => "rdma_server",
        other => other,
    }
}

fn client_of(name: &str) -> &str {
    match name {
        "rdma_server" => "rdma_client",
        other => other,
    }
}

fn assert_both_ok(s: &Finished, c: &Finished) {
    assert!(
        s.ok() && c.ok(),
        "a side failed:\n{}\n{}",
        s.report(),
        c.report()
    );
}

/// rping(1): "-C message_count"; with -v both sides print each ping's data. 200 RDMA
/// READ/WRITE/SEND rounds, then the client disconnects and both exit 0.
#[test]
fn rping_exchanges_200_pings_then_both_sides_exit_zero() {
    let (s, c) = pair(
        "rping",
        "rdmacm-utils",
        &["-s", "-a", "127.0.0.150", "-v", "-C", "200"],
        &["-c", "-a", "127.0.0.150", "-v", "-C", "200"],
        (150, 151),
        false,
    );
    assert_both_ok(&s, &c);
    let pings = c
        .stdout
        .lines()
        .filter(|l| l.starts_with("ping data: rdma-ping-"))
        .count();
    assert_eq!(pings, 200, "client pings:\n{}", c.report());
    let served = s
        .stdout
        .lines()
        .filter(|l| l.starts_with("server ping data: rdma-ping-"))
        .count();
    assert_eq!(served, 200, "server pings:\n{}", s.report());
    assert!(c.stdout.contains("rdma-ping-199: "), "{}", c.report());
}

/// ucmatose(1): connects, transfers, disconnects; each side ends "test complete" /
/// "return status 0".
#[test]
fn ucmatose_connects_transfers_and_disconnects() {
    let (s, c) = pair(
        "ucmatose",
        "rdmacm-utils",
        &["-b", "127.0.0.152"],
        &["-s", "127.0.0.152"],
        (152, 153),
        false,
    );
    assert_both_ok(&s, &c);
    for side in [&s, &c] {
        assert!(
            side.stdout.contains("test complete") && side.stdout.contains("return status 0"),
            "{}",
            side.report()
        );
    }
    assert!(s.stdout.contains("disconnected"), "{}", s.report());
}

/// udaddy(1): datagram ids (RDMA_PS_UDP): SIDR resolves the server's QPN and Q_Key, then
/// UD sends both ways.
#[test]
fn udaddy_resolves_through_sidr_and_exchanges_datagrams() {
    let (s, c) = pair(
        "udaddy",
        "rdmacm-utils",
        &["-b", "127.0.0.154"],
        &["-s", "127.0.0.154"],
        (154, 155),
        false,
    );
    assert_both_ok(&s, &c);
    for side in [&s, &c] {
        assert!(
            side.stdout.contains("data transfers complete")
                && side.stdout.contains("return status 0"),
            "{}",
            side.report()
        );
    }
}

/// rdma_server(1) / rdma_client(1): synchronous endpoints (`rdma_create_ep`,
/// `rdma_get_request`) exchanging one message; both print "end 0".
#[test]
fn rdma_server_and_rdma_client_use_synchronous_endpoints() {
    let (s, c) = pair(
        "rdma_server",
        "rdmacm-utils",
        &["-s", "127.0.0.156"],
        &["-s", "127.0.0.156"],
        (156, 157),
        false,
    );
    assert_both_ok(&s, &c);
    assert!(s.stdout.contains("rdma_server: end 0"), "{}", s.report());
    assert!(c.stdout.contains("rdma_client: end 0"), "{}", c.report());
}

/// cmtime(1): 20 connections set up and torn down, timing each step; the server (`-b`)
/// keeps serving and is stopped afterwards.
#[test]
fn cmtime_connects_and_disconnects_20_ids() {
    let (s, c) = pair(
        "cmtime",
        "rdmacm-utils",
        &["-b", "127.0.0.158", "-c", "20"],
        &["-s", "127.0.0.158", "-c", "20"],
        (158, 159),
        true,
    );
    assert!(c.ok(), "client failed:\n{}\n{}", c.report(), s.report());
    for step in [
        "resolve route",
        "create qp",
        "connect",
        "disconnect",
        "destroy",
    ] {
        assert!(c.stdout.contains(step), "no {step} row:\n{}", c.report());
    }
}

/// ib_send_lat(1) with -R (rdma_cm connection): 200 iterations of 2-byte SENDs; both
/// print the results row.
#[test]
fn ib_send_lat_connects_through_rdma_cm() {
    let (s, c) = pair(
        "ib_send_lat",
        "perftest",
        &["-R", "-n", "200", "-p", "18651"],
        &["-R", "-n", "200", "-p", "18651", "127.0.0.160"],
        (160, 161),
        false,
    );
    assert_both_ok(&s, &c);
    for side in [&s, &c] {
        let row = side
            .stdout
            .lines()
            .find(|l| l.split_whitespace().take(2).collect::<Vec<_>>() == ["2", "200"]);
        assert!(
            row.is_some(),
            "no results row for 2 bytes x 200:\n{}",
            side.report()
        );
    }
}
