//! libfabric 1.17 (Debian's `libfabric1`, `libfabric-bin`) on the drop-in: `fi_info -p
//! verbs` lists softverbs0's datagram domain and the `verbs;ofi_rxd` reliable endpoint
//! over it, and `fi_pingpong` runs over `verbs;ofi_rxd` between two processes with its
//! data checks, the devices' counters carrying the traffic.
//!
//! With softverbs' `librdmacm.so.1` (crate softverbs-rdmacm) beside it, the verbs
//! provider's connection management works too: `fi_info` lists softverbs0's MSG domain
//! (RC connected through the RDMA CM) and `verbs;ofi_rxm` over it, and `fi_pingpong` runs
//! `-e msg`, `-e rdm` over `verbs;ofi_rxm` and `-e dgram` (whose event queue opens an RDMA
//! CM event channel). Debian's `libfabric-bin` has no `fi_rdm_pingpong` (fabtests is not
//! packaged); `fi_pingpong -e rdm` runs the same exchange over an RDM endpoint.
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

/// A directory with both drop-ins: `libibverbs.so.1` (this crate's cdylib) and
/// `librdmacm.so.1` (softverbs-rdmacm's, built into the same target directory first).
fn with_rdmacm(name: &str) -> PathBuf {
    let lib = common::library_dir(name);
    let ibverbs = common::cdylib();
    let rdmacm = ibverbs.with_file_name("libsoftverbs_rdmacm.so");
    assert!(
        rdmacm.exists(),
        "{} is missing: build softverbs' librdmacm.so.1 first (cargo build -p softverbs-rdmacm)",
        rdmacm.display()
    );
    let link = lib.join("librdmacm.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&rdmacm, &link).expect("symlink librdmacm.so.1");
    lib
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

/// `fi_info -p verbs` with the drop-in librdmacm: the MSG domain softverbs0 (reliable
/// connected QPs through the RDMA CM), and `verbs;ofi_rxm`'s RDM endpoint over it.
#[test]
fn fi_info_lists_softverbs0_msg_endpoints_and_rxm_over_them() {
    let lib = with_rdmacm("fi-info-msg");
    for (provider, expected) in [
        (
            "verbs",
            "provider: verbs\n    fabric: IB-0xfe80000000000000\n    domain: softverbs0\n    version: 117.0\n    type: FI_EP_MSG\n    protocol: FI_PROTO_RDMA_CM_IB_RC",
        ),
        (
            "verbs;ofi_rxm",
            "provider: verbs;ofi_rxm\n    fabric: IB-0xfe80000000000000\n    domain: softverbs0\n    version: 117.0\n    type: FI_EP_RDM\n    protocol: FI_PROTO_RXM",
        ),
    ] {
        let mut command = Command::new(program("fi_info"));
        command.args(["-p", provider]);
        on_drop_in(&mut command, &lib, "127.0.0.181");
        let (status, stdout, stderr) = common::run_bounded(&mut command, LIMIT);
        assert_eq!(status.and_then(|s| s.code()), Some(0), "{stdout}\n{stderr}");
        assert!(
            stdout.contains(expected),
            "fi_info -p {provider} does not print {expected:?}:\n{stdout}\n{stderr}"
        );
    }
}

/// Runs an `fi_pingpong` pair (`args` on both sides, the server on `server`, the client on
/// `client`, control port `port`); asserts both exit 0 with a row of `iterations`
/// acknowledged transfers for each size in `sizes`, and that each device carried at least
/// `min_packets` each way.
fn fi_pingpong_pair(
    name: &str,
    args: &[&str],
    (server, client, port): (&str, &str, &str),
    sizes: &[&str],
    iterations: &str,
    min_packets: u64,
) {
    let lib = with_rdmacm(name);
    let pingpong = program("fi_pingpong");
    let mut server_command = Command::new(&pingpong);
    server_command
        .args(args)
        .args(["-I", iterations, "-B", port]);
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
        .args(args)
        .args(["-I", iterations, "-P", port, "127.0.0.1"]);
    on_drop_in(&mut client_command, &lib, client);
    let (client_status, client_out, client_err) = common::run_bounded(&mut client_command, LIMIT);
    let (server_status, server_out, server_err) = common::wait_bounded(server_child, LIMIT);
    let all = format!(
        "client ({client_status:?}):\n{client_out}\n{client_err}\nserver ({server_status:?}):\n{server_out}\n{server_err}"
    );
    assert_eq!(client_status.and_then(|s| s.code()), Some(0), "{all}");
    assert_eq!(server_status.and_then(|s| s.code()), Some(0), "{all}");
    let acked = format!("={iterations}");
    for size in sizes {
        assert!(
            client_out
                .lines()
                .any(|l| l.starts_with(&format!("{size} ")) && l.contains(&acked)),
            "no {size} row with {iterations} acknowledged transfers: {all}"
        );
    }
    stats::assert_carried(&server_err, server, min_packets);
    stats::assert_carried(&client_err, client, min_packets);
}

/// `fi_pingpong -p verbs -e msg`: an RC endpoint connected through the RDMA CM
/// (`fi_connect` → `rdma_connect`, `fi_accept` → `rdma_accept`), sizes 64 B to 1 MiB with
/// data checks (-c).
#[test]
fn fi_pingpong_msg_connects_through_rdma_cm_and_checks_data() {
    fi_pingpong_pair(
        "fi-pingpong-msg",
        &["-p", "verbs", "-e", "msg", "-c"],
        ("127.0.0.183", "127.0.0.184", "47631"),
        &["64", "1k", "4k", "64k", "1m"],
        "200",
        1200,
    );
}

/// `fi_pingpong -p "verbs;ofi_rxm" -e rdm`: ofi_rxm's reliable datagram endpoint over
/// verbs MSG connections it opens on demand through the RDMA CM, with data checks.
#[test]
fn fi_pingpong_rdm_runs_over_verbs_ofi_rxm_with_data_checks() {
    fi_pingpong_pair(
        "fi-pingpong-rxm",
        &["-p", "verbs;ofi_rxm", "-e", "rdm", "-c"],
        ("127.0.0.185", "127.0.0.186", "47632"),
        &["64", "1k", "4k", "64k"],
        "200",
        1200,
    );
}

/// `fi_pingpong -p verbs -e dgram`: UD endpoints; the verbs provider's event queue opens
/// an RDMA CM event channel, which the drop-in librdmacm provides.
#[test]
fn fi_pingpong_dgram_runs_on_verbs_with_an_rdma_cm_event_channel() {
    fi_pingpong_pair(
        "fi-pingpong-dgram",
        &["-p", "verbs", "-e", "dgram", "-c"],
        ("127.0.0.187", "127.0.0.188", "47633"),
        &["64", "1k"],
        "200",
        400,
    );
}
