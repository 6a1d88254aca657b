//! rdma_cm servers of several processes on one address. Devices of processes of one user
//! share an address (each a share of its QPNs; the first holds the address's UDP socket
//! and hands each packet to the process it is for), and so share its QP1: every CM MAD
//! reaches the holder first. The holder hands a REQ or SIDR_REQ to the process listening
//! on its service and an answer to the process whose communication ID it names, so a
//! server need not be the first process on its address. The port space is the address's,
//! as on a kernel: a second `rdma_listen` on a port another process listens on is
//! `EADDRINUSE`.
//!
//! Unmodified rdmacm-utils programs (`rping(1)`, `udaddy(1)`) on the drop-ins, bounded in
//! time; a missing program is a failure naming its package.

mod common;

use common::{library_dir, program, spawn, wait_listening, Finished, Running, ONE_AT_A_TIME};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// Starts `args` at 127.0.0.`octet` and waits until it listens; panics with its output if
/// it does not get there.
fn server(lib: &std::path::Path, name: &str, args: &[&str], octet: u8) -> Running {
    let mut s = spawn(lib, &program(name, "rdmacm-utils"), args, octet);
    if let Err(e) = wait_listening(&mut s) {
        let (_, out) = s.stop();
        panic!("{name} {args:?}: {e}\n{}", out.report());
    }
    s
}

fn pings(side: &Finished, prefix: &str) -> usize {
    side.stdout
        .lines()
        .filter(|l| l.starts_with(prefix))
        .count()
}

/// Two rping servers, one in each of two processes on 127.0.0.191 (ports 7191 and 7192):
/// the second is a member of the address, not its holder, and its client connects and
/// pings all the same (before: its REQ went to the first process's CM, which does not
/// listen on 7192, and was rejected). A third process listening on 7192 too is refused
/// with EADDRINUSE (rdma_cm(7): one listener per address and port).
#[test]
fn rping_servers_of_two_processes_on_one_address_each_serve_their_client() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let lib = library_dir("shared-address-rping");
    let serve =
        |port: &'static str| ["-s", "-a", "127.0.0.191", "-p", port, "-v", "-C", "20"].to_vec();
    let first = server(&lib, "rping", &serve("7191"), 191);
    let second = server(&lib, "rping", &serve("7192"), 191);

    let third = spawn(&lib, &program("rping", "rdmacm-utils"), &serve("7192"), 191).wait(LIMIT);
    assert!(
        !third.ok(),
        "a second listener on 7192:\n{}",
        third.report()
    );
    assert!(
        third.stderr.contains("rdma_listen") && third.stderr.contains("Address already in use"),
        "{}",
        third.report()
    );

    let rping = program("rping", "rdmacm-utils");
    let connect =
        |port: &'static str| ["-c", "-a", "127.0.0.191", "-p", port, "-v", "-C", "20"].to_vec();
    // The member's client first: the holder is there throughout.
    let to_second = spawn(&lib, &rping, &connect("7192"), 192).wait(LIMIT);
    let to_first = spawn(&lib, &rping, &connect("7191"), 193).wait(LIMIT);
    let second = if to_second.ok() {
        second.wait(LIMIT)
    } else {
        second.stop().1
    };
    let first = if to_first.ok() {
        first.wait(LIMIT)
    } else {
        first.stop().1
    };
    for (client, server) in [(&to_second, &second), (&to_first, &first)] {
        let both = format!("{}\n{}", client.report(), server.report());
        assert!(client.ok() && server.ok(), "{both}");
        assert_eq!(pings(client, "ping data: rdma-ping-"), 20, "{both}");
        assert_eq!(pings(server, "server ping data: rdma-ping-"), 20, "{both}");
    }
}

/// udaddy(1) resolves a server that is a member of a shared address through SIDR: the
/// SIDR_REQ names the service (RDMA_PS_UDP, port 7174), the holder (an rping server of
/// another process on 127.0.0.195) hands it to the member, and the SIDR_REP comes back to
/// the client; the datagrams then go to the member's QPN. Before: the holder's CM answered
/// the SIDR_REQ itself (no listener: status 1) and the client failed.
#[test]
fn udaddy_reaches_a_server_that_is_not_the_first_process_on_its_address() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let lib = library_dir("shared-address-udaddy");
    let holder = server(
        &lib,
        "rping",
        &["-s", "-a", "127.0.0.195", "-p", "7195"],
        195,
    );
    let udaddy = server(&lib, "udaddy", &["-b", "127.0.0.195"], 195);
    let client = spawn(
        &lib,
        &program("udaddy", "rdmacm-utils"),
        &["-s", "127.0.0.195"],
        196,
    )
    .wait(LIMIT);
    let udaddy = if client.ok() {
        udaddy.wait(LIMIT)
    } else {
        udaddy.stop().1
    };
    let (still, holder) = holder.stop();
    let all = format!(
        "{}\n{}\n{}",
        client.report(),
        udaddy.report(),
        holder.report()
    );
    assert!(client.ok() && udaddy.ok(), "{all}");
    for side in [&client, &udaddy] {
        assert!(
            side.stdout.contains("data transfers complete")
                && side.stdout.contains("return status 0"),
            "{all}"
        );
    }
    assert!(
        still.is_none(),
        "the holder kept waiting for its client:\n{all}"
    );
}
