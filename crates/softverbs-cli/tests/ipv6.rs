//! IPv6 end to end in the command's exchange: `--server` listens on IPv6 and IPv4 at once
//! (`::`, dual-stack), so `--client ::1` and `--client 127.0.0.1` both reach it. Only ::1
//! and 127.0.0.1 are used; the RoCEv2 devices stay on 127.0.0.x (two devices cannot share
//! ::1:4791, and ::1 is the only IPv6 loopback address).

mod common;

use common::{finish_server, run, start_server_with};

/// Whether this host has ::1 (a host with IPv6 switched off has not: the test then says
/// so and checks nothing).
fn has_ipv6_loopback() -> bool {
    match std::net::TcpListener::bind("[::1]:0") {
        Ok(_) => true,
        Err(e) => {
            eprintln!("skipped: this host has no IPv6 loopback address ::1 ({e})");
            false
        }
    }
}

/// A server with the default listening address and a client to `host`.
fn server_and_client(command: &[&str], host: &str) {
    let (server, stdout, port) = start_server_with(command, &[], &[]);
    let port = port.to_string();
    let mut args = command.to_vec();
    args.extend(["--client", host, "-p", &port, "--timeout", "20"]);
    let (code, out, err) = run(&args);
    let (server_code, server_out) = finish_server(server, stdout);
    assert_eq!(
        code, 0,
        "client {args:?}:\n{out}\n{err}\nserver:\n{server_out}"
    );
    assert_eq!(server_code, 0, "server:\n{server_out}");
}

#[test]
fn a_server_with_the_default_address_takes_clients_over_ipv6_and_ipv4() {
    if !has_ipv6_loopback() {
        return;
    }
    for host in ["::1", "[::1]", "127.0.0.1"] {
        server_and_client(&["pingpong", "-n", "50", "-s", "256"], host);
    }
    server_and_client(&["perf", "send", "lat", "-n", "50"], "::1");
}
