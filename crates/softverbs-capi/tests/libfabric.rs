//! libfabric 1.17 (Debian's `libfabric1`, `libfabric-bin`) on the drop-in: `fi_info -p
//! verbs` lists softverbs0's datagram domain and the `verbs;ofi_rxd` reliable endpoint
//! over it, and `fi_pingpong` runs over `verbs;ofi_rxd` between two processes with its
//! data checks, the devices' counters carrying the traffic.
//!
//! (The verbs provider's event queue opens an RDMA CM event channel, so `fi_pingpong -p
//! verbs -e dgram` and the MSG endpoints need the connection manager.)
//!
//! A missing program is a failure naming the Debian package, never a skip.

mod common;
#[path = "common/stats.rs"]
mod stats;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Bound on one program run.
const LIMIT: Duration = Duration::from_secs(120);

fn program(name: &str) -> PathBuf {
    let path = Path::new("/usr/bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: install the Debian package libfabric-bin",
        path.display()
    );
    path
}

fn on_drop_in<'a>(command: &'a mut Command, lib: &Path, address: &str) -> &'a mut Command {
    command
        .env("LD_LIBRARY_PATH", lib)
        .env("SOFTVERBS_ADDR", address)
        .env("SOFTVERBS_STATS", "stderr")
}

#[test]
fn fi_info_lists_the_softverbs0_datagram_domain_and_rxd_over_it() {
    let lib = common::library_dir("fi-info");
    let mut command = Command::new(program("fi_info"));
    command.args(["-p", "verbs"]);
    on_drop_in(&mut command, &lib, "127.0.0.157");
    let (status, stdout, stderr) = common::run_bounded(&mut command, LIMIT);
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{stdout}\n{stderr}");
    for expected in [
        "provider: verbs\n    fabric: IB-0xfe80000000000000\n    domain: softverbs0-dgram\n    version: 117.0\n    type: FI_EP_DGRAM\n    protocol: FI_PROTO_IB_UD",
        "provider: verbs;ofi_rxd\n    fabric: IB-0xfe80000000000000\n    domain: softverbs0-dgram\n    version: 117.0\n    type: FI_EP_RDM\n    protocol: FI_PROTO_RXD",
    ] {
        assert!(
            stdout.contains(expected),
            "fi_info -p verbs does not print {expected:?}:\n{stdout}"
        );
    }
}

#[test]
fn fi_pingpong_runs_over_verbs_ofi_rxd_with_data_checks() {
    let lib = common::library_dir("fi-pingpong");
    let pingpong = program("fi_pingpong");
    let (server, client, port) = ("127.0.0.158", "127.0.0.159", "47611");
    // Sizes up to 64 KiB (many UD packets each), 500 round trips each, data checked (-c).
    let common_args = ["-p", "verbs;ofi_rxd", "-e", "rdm", "-I", "500", "-c"];
    let mut server_command = Command::new(&pingpong);
    server_command.args(common_args).args(["-B", port]);
    on_drop_in(&mut server_command, &lib, server);
    let mut server_child = server_command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the fi_pingpong server");
    if let Err(why) =
        common::wait_until_listening(&mut server_child, port.parse().expect("a port"), LIMIT)
    {
        let (_, out, err) = common::wait_bounded(server_child, Duration::from_secs(1));
        panic!("fi_pingpong server: {why}\n{out}\n{err}");
    }
    let mut client_command = Command::new(&pingpong);
    client_command
        .args(common_args)
        .args(["-P", port, "127.0.0.1"]);
    on_drop_in(&mut client_command, &lib, client);
    let (client_status, client_out, client_err) = common::run_bounded(&mut client_command, LIMIT);
    let (server_status, server_out, server_err) = common::wait_bounded(server_child, LIMIT);
    let all = format!(
        "client ({client_status:?}):\n{client_out}\n{client_err}\nserver ({server_status:?}):\n{server_out}\n{server_err}"
    );
    assert_eq!(client_status.and_then(|s| s.code()), Some(0), "{all}");
    assert_eq!(server_status.and_then(|s| s.code()), Some(0), "{all}");
    for size in ["64 ", "1k ", "4k ", "64k "] {
        assert!(
            client_out
                .lines()
                .any(|l| l.starts_with(size) && l.contains("=500")),
            "no {size}row with 500 acknowledged transfers: {all}"
        );
    }
    // Every transfer is a UD datagram at least, each way.
    stats::assert_carried(&server_err, server, 2000);
    stats::assert_carried(&client_err, client, 2000);
}
