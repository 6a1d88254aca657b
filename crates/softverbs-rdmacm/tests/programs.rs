//! Unmodified Debian rdma_cm programs between two processes on the drop-ins: rdmacm-utils'
//! `rping(1)`, `ucmatose(1)`, `udaddy(1)`, `rdma_server(1)` / `rdma_client(1)`,
//! `cmtime(1)`, and perftest's `ib_send_lat(1)` with `-R` (connection through rdma_cm).
//!
//! Each process loads `librdmacm.so.1` (this crate) and `libibverbs.so.1`
//! (softverbs-capi) from one directory (`LD_LIBRARY_PATH`) and gets its own device address
//! (`SOFTVERBS_ADDR=127.0.0.N:4791`, N in 150–179, distinct per test). The server starts
//! first; the client starts once the server's librdmacm has opened its devices (its CM
//! thread `rdmacm-cm` exists, read from `/proc`) and `common::LISTEN_GRACE` more for its
//! `rdma_listen`;
//! a client rejected because it still came too early (REJ 8, no listener yet) is run
//! again, at most 5 times (not perftest's, see its test).
//! Everything is bounded: after [`PAIR_TIMEOUT`] both are killed and the test fails with
//! both outputs. A missing program is a failure naming its package, never a skip.

mod common;

use common::{library_dir, program, spawn, wait_listening, Finished, ONE_AT_A_TIME};
use std::time::Duration;

const PAIR_TIMEOUT: Duration = Duration::from_secs(90);

/// Runs a server/client pair; `persistent`: the server keeps serving and is stopped after
/// the client (it must still be running then).
fn pair(
    (name, client_name): (&str, &str),
    package: &str,
    server_args: &[&str],
    client_args: &[&str],
    octets: (u8, u8),
    persistent: bool,
    retry_refused: bool,
) -> (Finished, Finished) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let lib = library_dir(name);
    let path = program(name, package);
    let client_path = program(client_name, package);
    let mut server = spawn(&lib, &path, server_args, octets.0);
    if let Err(e) = wait_listening(&mut server) {
        let (_, s) = server.stop();
        panic!("{name}: {e}\n{}", s.report());
    }
    // A request that arrives before the server's rdma_listen is rejected (REJ 8, as the
    // kernel's CM does), and device-up is only a hint of listening: a client refused so
    // while the server still runs is started again, a bounded number of times.
    let mut attempts = 0;
    let client = loop {
        attempts += 1;
        let c = spawn(&lib, &client_path, client_args, octets.1).wait(PAIR_TIMEOUT);
        let out = format!("{}{}", c.stdout, c.stderr).to_lowercase();
        let refused = out.contains("rejected") || out.contains("refused");
        let server_running = matches!(server.child.try_wait(), Ok(None));
        if c.ok() || !retry_refused || !refused || !server_running || attempts == 5 {
            break c;
        }
        std::thread::sleep(Duration::from_secs(1));
    };
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
    } else if !client.ok() {
        // The client failed: the server may wait for it forever; its output is enough.
        server.stop().1
    } else {
        server.wait(PAIR_TIMEOUT)
    };
    (server, client)
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
        ("rping", "rping"),
        "rdmacm-utils",
        &["-s", "-a", "127.0.0.150", "-v", "-C", "200"],
        &["-c", "-a", "127.0.0.150", "-v", "-C", "200"],
        (150, 151),
        false,
        true,
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
        ("ucmatose", "ucmatose"),
        "rdmacm-utils",
        &["-b", "127.0.0.152"],
        &["-s", "127.0.0.152"],
        (152, 153),
        false,
        true,
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
        ("udaddy", "udaddy"),
        "rdmacm-utils",
        &["-b", "127.0.0.154"],
        &["-s", "127.0.0.154"],
        (154, 155),
        false,
        true,
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

/// mckey(1): UD multicast through the connection manager (`rdma_join_multicast(3)`): the
/// receiver joins 239.255.20.1 (its QP attached to `::ffff:239.255.20.1`), the sender
/// joins too and sends 10 datagrams to QPN 0xFFFFFF with the join event's address vector
/// and Q_Key; the receiver gets all of them, and both exit 0.
#[test]
fn mckey_joins_a_multicast_group_and_the_receiver_gets_every_datagram() {
    let (s, c) = pair(
        ("mckey", "mckey"),
        "rdmacm-utils",
        &["-m", "239.255.20.1", "-b", "127.0.0.166"],
        &["-m", "239.255.20.1", "-s", "-b", "127.0.0.168"],
        (166, 168),
        false,
        false,
    );
    assert_both_ok(&s, &c);
    for side in [&s, &c] {
        assert!(
            side.stdout.contains("joined dgid: ::ffff:239.255.20.1")
                && side.stdout.contains("data transfers complete")
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
        ("rdma_server", "rdma_client"),
        "rdmacm-utils",
        &["-s", "127.0.0.156"],
        &["-s", "127.0.0.156"],
        (156, 157),
        false,
        true,
    );
    assert_both_ok(&s, &c);
    assert!(s.stdout.contains("rdma_server: end 0"), "{}", s.report());
    assert!(c.stdout.contains("rdma_client: end 0"), "{}", c.report());
}

/// rdma_xserver(1) / rdma_xclient(1) over RC (`-c r`): endpoints created by
/// `rdma_create_ep`, one 16-byte message sent inline (`IBV_SEND_INLINE`) on a QP that
/// asked for no inline data — `ibv_create_qp(3)`'s capacities "may be greater", and the
/// send WQE's scatter/gather room carries it, as on rxe; both print "end 0". (XRC, `-c x`,
/// is not offered.)
#[test]
fn rdma_xserver_and_rdma_xclient_exchange_an_inline_message_over_rc() {
    let (s, c) = pair(
        ("rdma_xserver", "rdma_xclient"),
        "rdmacm-utils",
        &["-c", "r"],
        &["-c", "r", "-s", "127.0.0.198"],
        (198, 199),
        false,
        true,
    );
    assert_both_ok(&s, &c);
    assert!(s.stdout.contains("rdma_xserver: end 0"), "{}", s.report());
    assert!(c.stdout.contains("rdma_xclient: end 0"), "{}", c.report());
}

/// cmtime(1): 20 connections set up and torn down, timing each step; the server (`-b`)
/// keeps serving and is stopped afterwards.
#[test]
fn cmtime_connects_and_disconnects_20_ids() {
    let (s, c) = pair(
        ("cmtime", "cmtime"),
        "rdmacm-utils",
        &["-b", "127.0.0.158", "-c", "20"],
        &["-s", "127.0.0.158", "-c", "20"],
        (158, 159),
        true,
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
///
/// perftest opens two connections: a control one for its parameter exchange, then, as soon
/// as that exchange ends, the data one, for which the server creates a new listening id.
/// When the client's data REQ beats the server's new `rdma_listen`, the rejection (REJ 8,
/// as the kernel's CM gives; the REJECTED event's `id` is the connecting id, pinned in
/// `cm_rules.rs`) is right, and Debian's perftest 4.5-0.17 then breaks its own retry:
/// `rdma_cm_client_connection` calls `rdma_cm_destroy_cma` (every node's id destroyed,
/// `free(ctx->cma_master.nodes)`) and retries on the freed `nodes`, so the next
/// `rdma_destroy_id` gets whatever the reused memory holds. perftest fixed that upstream
/// (commit 3d9d8d0, "Fix crashes and logical flaws in RDMA CM connection retry", first in
/// 26.04.17: the nodes are allocated again before each retry). Until Debian ships it, such
/// a run is started again, at most 3 times in all; any other failure fails the test. (Our
/// CM holds such a REQ up to 50 ms for the listen, which makes the race rare; the retry
/// stays for a loaded machine.)
#[test]
fn ib_send_lat_connects_through_rdma_cm() {
    let mut runs = Vec::new();
    for attempt in 0..3u16 {
        let port = (18651 + attempt).to_string();
        let (s, c) = pair(
            ("ib_send_lat", "ib_send_lat"),
            "perftest",
            &["-R", "-n", "200", "-p", &port],
            &["-R", "-n", "200", "-p", &port, "127.0.0.160"],
            (160, 161),
            false,
            false,
        );
        let raced = !c.ok() && c.stderr.contains("RDMA_CM_EVENT_REJECTED; error: 8");
        if !raced {
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
            return;
        }
        runs.push(format!("{}\n{}", s.report(), c.report()));
    }
    panic!(
        "the data connection was rejected in every run:\n{}",
        runs.join("\n")
    );
}
