//! Unmodified Debian programs on the drop-in: `LD_LIBRARY_PATH` points at a directory
//! where the built cdylib is `libibverbs.so.1`, and `LD_BIND_NOW=1` makes the loader bind
//! every imported symbol before `main` (the binaries are linked `BIND_NOW` anyway).
//!
//! - `ibv_devices` and `ibv_devinfo -v` (package `ibverbs-utils`) run to exit status 0 and
//!   print the soft device: its name, port state, link layer and GID;
//! - every `ibverbs-utils` and `perftest` program loads: its symbols and version nodes all
//!   resolve against our library (and, for perftest, against the real librdmacm, libmlx5,
//!   libefa, whose constructors call into us), and its `main` runs.
//!
//! A missing program is a failure naming the Debian package, never a skip.

mod common;

use std::path::Path;

/// What the dynamic loader prints when a symbol or version node is missing.
const LOADER_ERRORS: [&str; 4] = [
    "symbol lookup error",
    "undefined symbol",
    "error while loading shared libraries",
    "no version information available",
];

fn assert_loaded(program: &str, stdout: &str, stderr: &str) {
    for error in LOADER_ERRORS {
        assert!(
            !stderr.contains(error) && !stdout.contains(error),
            "{program} did not load against the drop-in ({error}):\n{stderr}"
        );
    }
}

/// Runs a program with `LD_DEBUG=files` and checks the loader took `libibverbs.so.1` from
/// `lib_dir` (so a test cannot pass on the system library by accident).
fn assert_uses_drop_in(lib_dir: &Path, program: &str, args: &[&str]) {
    let out = std::process::Command::new(Path::new("/usr/bin").join(program))
        .args(args)
        .env("LD_LIBRARY_PATH", lib_dir)
        .env("LD_BIND_NOW", "1")
        .env("LD_DEBUG", "files")
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    let trace = String::from_utf8_lossy(&out.stderr);
    let ours = lib_dir.join("libibverbs.so.1");
    assert!(
        trace.contains(&format!("calling init: {}", ours.display())),
        "{program} did not load {}:\n{trace}",
        ours.display()
    );
}

#[test]
fn ibv_devices_lists_softverbs0_with_its_node_guid() {
    let lib = common::library_dir("ibv-devices");
    let out = std::process::Command::new("/usr/bin/ibv_devices")
        .env("LD_LIBRARY_PATH", &lib)
        .env("LD_BIND_NOW", "1")
        .env("SOFTVERBS_ADDR", "127.0.0.78:0")
        .output();
    let out =
        out.expect("/usr/bin/ibv_devices is missing: install the Debian package ibverbs-utils");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_loaded("ibv_devices", &stdout, &stderr);
    assert!(out.status.success(), "ibv_devices failed: {stdout}{stderr}");
    // The node GUID is the device's: 02:53:56:ff + the IPv4 address (127.0.0.78).
    let line = stdout
        .lines()
        .find(|l| l.contains("softverbs0"))
        .unwrap_or_else(|| panic!("softverbs0 not listed:\n{stdout}"));
    assert!(line.contains("025356ff7f00004e"), "GUID: {line}");
}

#[test]
fn ibv_devinfo_verbose_prints_the_device_port_and_gid() {
    let lib = common::library_dir("ibv-devinfo");
    let out = std::process::Command::new("/usr/bin/ibv_devinfo")
        .arg("-v")
        .env("LD_LIBRARY_PATH", &lib)
        .env("LD_BIND_NOW", "1")
        .env("SOFTVERBS_ADDR", "127.0.0.77:0")
        .output()
        .expect("/usr/bin/ibv_devinfo is missing: install the Debian package ibverbs-utils");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_loaded("ibv_devinfo", &stdout, &stderr);
    assert!(
        out.status.success(),
        "ibv_devinfo -v failed: {stdout}{stderr}"
    );
    for expected in [
        "hca_id:\tsoftverbs0",
        "transport:\t\t\tInfiniBand (0)",
        "node_guid:\t\t\t0253:56ff:7f00:004d",
        "vendor_id:\t\t\t0xffffff",
        "vendor_part_id:\t\t\t0",
        "phys_port_cnt:\t\t\t1",
        // query_device_ex through the extended context (reference §3.2).
        "completion timestamp_mask:\t\t\t0xffffffffffffffff",
        "hca_core_clock:\t\t\t1000000kHZ",
        "num_comp_vectors:\t\t1",
        // query_port through the extended context with sz = 648 (reference §9.4).
        "state:\t\t\tPORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "phys_state:\t\tLINK_UP (5)",
        // The GID table as kernel rxe lays it out (issue #17): the link-local GID (made
        // from the address), then the IPv4-mapped address.
        "gid_tbl_len:\t\t2",
        "GID[  0]:\t\tfe80::ffff:7f00:4d, RoCE v2",
        "GID[  1]:\t\t::ffff:127.0.0.77, RoCE v2",
    ] {
        assert!(
            stdout.contains(expected),
            "ibv_devinfo -v does not print {expected:?}:\n{stdout}"
        );
    }
}

#[test]
fn every_ibverbs_utils_program_loads_on_the_drop_in() {
    let lib = common::library_dir("utils-load");
    for program in [
        "ibv_rc_pingpong",
        "ibv_uc_pingpong",
        "ibv_ud_pingpong",
        "ibv_srq_pingpong",
        "ibv_xsrq_pingpong",
    ] {
        // An unknown option: the program prints its usage from main and exits.
        let (_, stdout, stderr) = common::run_on_drop_in(&lib, program, &["-h"], "ibverbs-utils");
        assert_loaded(program, &stdout, &stderr);
        assert!(
            stdout.contains("Usage:") || stderr.contains("Usage:"),
            "{program} did not reach main:\n{stdout}{stderr}"
        );
    }
    assert_uses_drop_in(&lib, "ibv_rc_pingpong", &["-h"]);
}

#[test]
fn every_perftest_program_loads_and_binds_all_symbols_on_the_drop_in() {
    let lib = common::library_dir("perftest-load");
    for program in [
        "ib_send_lat",
        "ib_send_bw",
        "ib_write_lat",
        "ib_write_bw",
        "ib_read_lat",
        "ib_read_bw",
        "ib_atomic_lat",
        "ib_atomic_bw",
        "raw_ethernet_bw",
        "raw_ethernet_lat",
        "raw_ethernet_burst_lat",
        "raw_ethernet_fs_rate",
    ] {
        // perftest prints its version from main (and exits 1, its convention for -V).
        let (_, stdout, stderr) = common::run_on_drop_in(&lib, program, &["--version"], "perftest");
        assert_loaded(program, &stdout, &stderr);
        assert!(
            stdout.contains("Version:"),
            "{program} did not reach main:\n{stdout}{stderr}"
        );
    }
    assert_uses_drop_in(&lib, "ib_send_lat", &["--version"]);
}

#[test]
fn softverbs_stats_reports_the_device_counters_once_at_close_or_else_at_exit() {
    let lib = common::library_dir("stats");
    let out = std::process::Command::new("/usr/bin/ibv_devinfo")
        .env("LD_LIBRARY_PATH", &lib)
        .env("LD_BIND_NOW", "1")
        .env("SOFTVERBS_ADDR", "127.0.0.76:0")
        .env("SOFTVERBS_STATS", "stderr")
        .output()
        .expect("/usr/bin/ibv_devinfo is missing: install the Debian package ibverbs-utils");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ibv_devinfo failed: {stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("softverbs stats: device softverbs0 address 127.0.0.76"))
        .unwrap_or_else(|| panic!("no stats line:\n{stderr}"));
    // One report: at ibv_close_device, not again at exit.
    assert_eq!(stderr.matches("softverbs stats:").count(), 1, "{stderr}");
    // ibv_devices opens no context, so nothing closes one: the report comes at exit.
    let out = std::process::Command::new("/usr/bin/ibv_devices")
        .env("LD_LIBRARY_PATH", &lib)
        .env("SOFTVERBS_ADDR", "127.0.0.76:0")
        .env("SOFTVERBS_STATS", "stderr")
        .output()
        .expect("/usr/bin/ibv_devices is missing: install the Debian package ibverbs-utils");
    let devices_err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        devices_err
            .matches("softverbs stats: device softverbs0")
            .count(),
        1,
        "{devices_err}"
    );
    for field in [
        "packets_sent=0",
        "retransmitted_packets=0",
        "timeouts=0",
        "transport: sent_packets=0",
    ] {
        assert!(line.contains(field), "{field} missing: {line}");
    }
}

#[test]
fn softverbs_pcap_capture_of_a_program_is_complete_when_the_program_exits() {
    // The drop-in's device lives as long as the process, so the capture must be written
    // out when the program closes its context or exits, not when the device is dropped.
    let lib = common::library_dir("pcap");
    let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("softverbs-capi-pp.pcap");
    let _ = std::fs::remove_file(&file);
    let pingpong = |addr: &str, server: Option<&str>| {
        let mut c = std::process::Command::new("/usr/bin/ibv_rc_pingpong");
        c.args(["-g", "0", "-p", "18571", "-n", "5", "-s", "64"])
            .args(server)
            .env("LD_LIBRARY_PATH", &lib)
            .env("SOFTVERBS_ADDR", addr)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        c
    };
    let mut server = pingpong("127.0.0.73", None)
        .spawn()
        .expect("/usr/bin/ibv_rc_pingpong is missing: install the Debian package ibverbs-utils");
    // Both sides bounded: a server whose client never connected (it failed) waits for one
    // forever, and is killed instead.
    let limit = std::time::Duration::from_secs(60);
    if let Err(why) = common::wait_until_listening(&mut server, 18571, limit) {
        let (_, out, err) = common::wait_bounded(server, std::time::Duration::from_secs(1));
        panic!("{why}\n{out}{err}");
    }
    let client = common::run_bounded(
        pingpong("127.0.0.74", Some("127.0.0.1")).env("SOFTVERBS_PCAP", &file),
        limit,
    );
    let server = common::wait_bounded(server, limit);
    let ok = |(status, _, _): &(Option<std::process::ExitStatus>, String, String)| {
        status.is_some_and(|s| s.success())
    };
    let text = |(status, stdout, stderr): &(Option<std::process::ExitStatus>, String, String)| {
        let status = status.map_or_else(
            || format!("stuck: killed after {limit:?}"),
            |s| s.to_string(),
        );
        format!("{status}\n{stdout}{stderr}")
    };
    assert!(ok(&client), "client: {}", text(&client));
    assert!(ok(&server), "server: {}", text(&server));
    let records = softverbs::core::device::pcap::read_capture(&file).expect("a readable pcap file");
    // Five round trips of one SEND each way, each ACKed: 20 packets, all of them there.
    assert_eq!(records.len(), 20, "{records:?}");
}

/// The variables that decide whether the drop-in's device opens, removed so that the
/// test's own setting is the only one.
const DEVICE_VARIABLES: [&str; 4] = [
    "SOFTVERBS_NETWORK",
    "SOFTVERBS_PCAP",
    "SOFTVERBS_FAULTS",
    "SOFTVERBS_PCAP_LIMIT",
];

/// The lines of `stderr` the drop-in wrote (`softverbs: …`).
fn drop_in_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("softverbs: "))
        .collect()
}

#[test]
fn a_device_that_cannot_open_says_why_on_one_line_naming_the_variable() {
    // A capture file in a folder that does not exist: the device cannot open, so
    // ibv_get_device_list fails (errno EINVAL, as before), and the drop-in says why,
    // naming the variable and the folder.
    let lib = common::library_dir("open-error");
    let mut command = std::process::Command::new("/usr/bin/ibv_devinfo");
    for name in DEVICE_VARIABLES {
        command.env_remove(name);
    }
    let (status, stdout, stderr) = common::run_bounded(
        command
            .env("LD_LIBRARY_PATH", &lib)
            .env("LD_BIND_NOW", "1")
            .env("SOFTVERBS_ADDR", "127.0.0.75:0")
            .env("SOFTVERBS_PCAP", "/nonexistent-dir/x.pcap"),
        std::time::Duration::from_secs(60),
    );
    let status = status.expect("ibv_devinfo finished");
    assert!(!status.success(), "{stdout}{stderr}");
    let ours = drop_in_lines(&stderr);
    assert_eq!(ours.len(), 1, "one line from the drop-in:\n{stderr}");
    assert!(
        ours[0].starts_with("softverbs: SOFTVERBS_PCAP: ")
            && ours[0].contains("the folder /nonexistent-dir does not exist"),
        "{stderr}"
    );
    assert!(
        stderr.contains("Failed to get IB devices list: Invalid argument"),
        "the errno is kept:\n{stderr}"
    );
}

#[test]
fn a_device_that_cannot_open_says_why_once_per_process_and_fails_every_call() {
    // Our C program asks for the device list three times with a malformed SOFTVERBS_FAULTS:
    // every call fails with EINVAL, the reason is said once.
    let lib = common::library_dir("open-error-again");
    let exe = common::compile_c("device_list_again.c", "device_list_again", &[]);
    let mut command = std::process::Command::new(&exe);
    for name in DEVICE_VARIABLES {
        command.env_remove(name);
    }
    let (status, stdout, stderr) = common::run_bounded(
        command
            .env("LD_LIBRARY_PATH", &lib)
            .env("SOFTVERBS_ADDR", "127.0.0.75:0")
            .env("SOFTVERBS_FAULTS", "drop=2"),
        std::time::Duration::from_secs(60),
    );
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{stdout}{stderr}");
    let einval = libc::EINVAL;
    for n in 1..=3 {
        assert!(
            stdout.contains(&format!("list {n}: NULL errno {einval}\n")),
            "{stdout}"
        );
    }
    let ours = drop_in_lines(&stderr);
    assert_eq!(ours.len(), 1, "once per process:\n{stderr}");
    assert!(
        ours[0].starts_with("softverbs: SOFTVERBS_FAULTS=\"drop=2\": ")
            && ours[0].contains("outside 0..=1"),
        "{stderr}"
    );
}

#[test]
fn ibv_rc_pingpong_runs_with_both_ends_on_one_address() {
    // Two processes with one SOFTVERBS_ADDR: the server's device binds the address, the
    // client's joins it with a share of the QP numbers, and each packet reaches the process
    // owning its destination QPN.
    let lib = common::library_dir("shared-address");
    let pingpong = |server: Option<&str>| {
        let mut c = std::process::Command::new("/usr/bin/ibv_rc_pingpong");
        c.args(["-g", "0", "-p", "18572", "-n", "1000", "-s", "4096"])
            .args(server)
            .env("LD_LIBRARY_PATH", &lib)
            .env("SOFTVERBS_ADDR", "127.0.0.75")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        for variable in DEVICE_VARIABLES {
            c.env_remove(variable);
        }
        c
    };
    let mut server = pingpong(None)
        .spawn()
        .expect("/usr/bin/ibv_rc_pingpong is missing: install the Debian package ibverbs-utils");
    let limit = std::time::Duration::from_secs(60);
    if let Err(why) = common::wait_until_listening(&mut server, 18572, limit) {
        let (_, out, err) = common::wait_bounded(server, std::time::Duration::from_secs(1));
        panic!("{why}\n{out}{err}");
    }
    let client = common::run_bounded(&mut pingpong(Some("127.0.0.1")), limit);
    let server = common::wait_bounded(server, limit);
    for (side, (status, stdout, stderr)) in [("client", &client), ("server", &server)] {
        assert!(
            status.is_some_and(|s| s.success()),
            "{side}: {status:?}\n{stdout}{stderr}"
        );
        assert!(stdout.contains("1000 iters"), "{side}: {stdout}{stderr}");
    }
}

/// perftest through the drop-in with both ends on one address (`ib_write_bw`, 4 KiB, 2,000
/// iterations): the client's device joins the server's address with its own share of the
/// QP numbers, and both print the bandwidth table.
#[test]
fn ib_write_bw_runs_with_both_ends_on_one_address() {
    let lib = common::library_dir("shared-address-perftest");
    let perftest = |server: Option<&str>| {
        let mut c = std::process::Command::new("/usr/bin/ib_write_bw");
        c.args([
            "-d",
            "softverbs0",
            "-F",
            "-s",
            "4096",
            "-n",
            "2000",
            "-p",
            "18573",
        ])
        .args(server)
        .env("LD_LIBRARY_PATH", &lib)
        .env("SOFTVERBS_ADDR", "127.0.0.80")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
        for variable in DEVICE_VARIABLES {
            c.env_remove(variable);
        }
        c
    };
    let mut server = perftest(None)
        .spawn()
        .expect("/usr/bin/ib_write_bw is missing: install the Debian package perftest");
    let limit = std::time::Duration::from_secs(60);
    if let Err(why) = common::wait_until_listening(&mut server, 18573, limit) {
        let (_, out, err) = common::wait_bounded(server, std::time::Duration::from_secs(1));
        panic!("{why}\n{out}{err}");
    }
    let client = common::run_bounded(&mut perftest(Some("127.0.0.1")), limit);
    let server = common::wait_bounded(server, limit);
    for (side, (status, stdout, stderr)) in [("client", &client), ("server", &server)] {
        assert!(
            status.is_some_and(|s| s.success()),
            "{side}: {status:?}\n{stdout}{stderr}"
        );
        // The results row: size, iterations, peak and average bandwidth, message rate.
        let row = stdout
            .lines()
            .find(|l| l.split_whitespace().take(2).collect::<Vec<_>>() == ["4096", "2000"]);
        assert!(row.is_some(), "{side}: no results row\n{stdout}{stderr}");
    }
}
