//! The `softverbs` command end to end: every subcommand run as a process, bounded in
//! time, using only 127.0.0.0/8 (devices on automatically chosen 127.0.0.x addresses,
//! the exchange on 127.0.0.1).

mod common;

use common::{finish, finish_server, packets, run, run_ok, softverbs, start_server};
use std::process::Stdio;

/// Checks the closing lines of `ibv_rc_pingpong` and the latency line.
fn assert_pingpong_report(out: &str, bytes: u64, iters: u64) {
    let line = out
        .lines()
        .find(|l| l.contains(" bytes in ") && l.ends_with(" Mbit/sec"))
        .unwrap_or_else(|| panic!("no bandwidth line in\n{out}"));
    assert!(line.starts_with(&format!("{bytes} bytes in ")), "{line}");
    let line = out
        .lines()
        .find(|l| l.contains(" iters in ") && l.ends_with(" usec/iter"))
        .unwrap_or_else(|| panic!("no iteration line in\n{out}"));
    assert!(line.starts_with(&format!("{iters} iters in ")), "{line}");
    let line = out
        .lines()
        .find(|l| l.starts_with("round trip: "))
        .unwrap_or_else(|| panic!("no latency line in\n{out}"));
    assert!(line.contains("median") && line.contains("p99"), "{line}");
    assert!(line.contains(&format!("({iters} samples)")), "{line}");
}

#[test]
fn devinfo_shows_an_active_ethernet_port_and_an_ipv4_mapped_gid() {
    let out = run_ok(&["devinfo", "-v"]);
    for expected in [
        "hca_id:\tsoftverbs0",
        "node_guid:",
        "vendor_id:",
        "max_qp_wr:",
        "max_cqe:",
        "atomic_cap:",
        "state:\t\t\tPORT_ACTIVE (4)",
        "max_mtu:\t\t4096 (5)",
        "link_layer:\t\tEthernet",
        "GID[  1]:\t\t::ffff:127.0.0.",
        ", RoCE v2",
        "address:\t\t127.0.0.",
    ] {
        assert!(out.contains(expected), "{expected:?} missing from\n{out}");
    }
    let short = run_ok(&["devinfo"]);
    assert!(
        short.contains("PORT_ACTIVE") && !short.contains("max_qp_wr"),
        "{short}"
    );
}

#[test]
fn pingpong_with_no_arguments_runs_both_sides_over_udp_loopback() {
    let out = run_ok(&["pingpong"]);
    assert!(out.contains("UDP loopback, 127.0.0."), "{out}");
    let device = out
        .lines()
        .find(|l| l.starts_with("client device: "))
        .unwrap();
    assert!(device.contains(" packets sent (UDP "), "{device}");
    assert!(out.contains("local address:  LID 0x0000, QPN 0x"), "{out}");
    assert!(out.contains("remote address: LID 0x0000, QPN 0x"), "{out}");
    assert_pingpong_report(&out, 4096 * 1000 * 2, 1000);
}

#[test]
fn pingpong_with_completion_events() {
    let out = run_ok(&["pingpong", "-e", "-n", "300", "-s", "100"]);
    assert!(out.contains("completion events"), "{out}");
    assert_pingpong_report(&out, 100 * 300 * 2, 300);
}

#[test]
fn pingpong_in_process() {
    let out = run_ok(&["pingpong", "--in-process", "-n", "200"]);
    assert!(out.contains("in-process"), "{out}");
    assert_pingpong_report(&out, 4096 * 200 * 2, 200);
}

#[test]
fn pingpong_server_and_client_as_two_processes() {
    // Neither side is told an address: each device takes the first free 127.0.0.x, so the
    // client's device steps past the server's (which may well hold 127.0.0.1:4791).
    let (server, stdout, port) = start_server(&["pingpong", "-n", "300", "-s", "512"]);
    let port = port.to_string();
    let (code, out, err) = run(&[
        "pingpong",
        "--client",
        "127.0.0.1",
        "-p",
        &port,
        "-n",
        "300",
        "-s",
        "512",
    ]);
    let (server_code, server_out) = finish_server(server, stdout);
    assert_eq!(code, 0, "client:\n{out}\n{err}\nserver:\n{server_out}");
    assert_eq!(server_code, 0, "server:\n{server_out}");
    assert_pingpong_report(&out, 512 * 300 * 2, 300);
    assert!(
        server_out.contains(&format!("{} bytes in ", 512 * 300 * 2)),
        "{server_out}"
    );
    // Two processes of one host: every packet through shared memory, none over UDP.
    let device = out.lines().find(|l| l.starts_with("device: ")).unwrap();
    assert!(device.contains(" packets sent (shared memory "), "{device}");
    assert!(!device.contains("UDP"), "{device}");
    // The two devices have distinct GIDs.
    let gid = |text: &str, label: &str| -> String {
        text.lines()
            .find(|l| l.trim_start().starts_with(label))
            .and_then(|l| l.rsplit("GID ").next())
            .unwrap_or_else(|| panic!("no {label} in {text}"))
            .to_owned()
    };
    assert_ne!(gid(&out, "local address"), gid(&out, "remote address"));
    assert_eq!(
        gid(&out, "local address"),
        gid(&server_out, "remote address")
    );
}

fn perf_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["perf"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = run_ok(&all);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}):\n{out}"))
}

fn assert_latency_result(doc: &serde_json::Value, bytes: u64, iters: u64) {
    let results = doc["results"].as_array().expect("results");
    assert_eq!(results.len(), 1, "{doc}");
    let r = &results[0];
    assert_eq!(r["bytes"], bytes);
    assert_eq!(r["iterations"], iters);
    let field = |name: &str| r[name].as_f64().unwrap_or_else(|| panic!("{name} in {r}"));
    let (min, median, p99, p999, max) = (
        field("t_min_usec"),
        field("t_median_usec"),
        field("t_p99_usec"),
        field("t_p99_9_usec"),
        field("t_max_usec"),
    );
    assert!(
        0.0 < min && min <= median && median <= p99 && p99 <= p999 && p999 <= max,
        "{r}"
    );
}

#[test]
fn perf_send_lat_json() {
    let doc = perf_json(&["send", "lat", "-n", "200", "-s", "64"]);
    assert_eq!(doc["op"], "send");
    assert_eq!(doc["kind"], "lat");
    assert_latency_result(&doc, 64, 200);
    // Each ping, and an ACK of each pong.
    assert_eq!(doc["client_counters"]["packets_sent"], 400, "{doc}");
}

#[test]
fn perf_read_lat_and_atomic_lat_json() {
    let doc = perf_json(&["read", "lat", "-n", "200", "-s", "2048"]);
    assert_latency_result(&doc, 2048, 200);
    let doc = perf_json(&["atomic", "lat", "-n", "200"]);
    assert_latency_result(&doc, 8, 200);
}

#[test]
fn perf_write_lat_in_process() {
    let doc = perf_json(&["write", "lat", "-n", "200", "-s", "5000", "--in-process"]);
    assert_latency_result(&doc, 5000, 200);
}

#[test]
fn perf_write_bw_json_reports_bandwidth_and_message_rate() {
    let doc = perf_json(&["write", "bw", "-n", "300", "-s", "4096", "-t", "16"]);
    let r = &doc["results"][0];
    assert_eq!(r["bytes"], 4096);
    assert!(r["bw_gbit_per_sec"].as_f64().unwrap() > 0.0, "{doc}");
    assert!(r["msg_rate_mpps"].as_f64().unwrap() > 0.0, "{doc}");
}

#[test]
fn perf_text_output_has_a_header_and_a_row_per_size_of_minus_a() {
    // perftest's -a: "Run sizes from 2 till 2^23" (perftest_parameters.c, usage).
    let out = run_ok(&[
        "perf",
        "send",
        "bw",
        "-a",
        "--in-process",
        "-n",
        "20",
        "-t",
        "8",
    ]);
    assert!(out.contains("Send BW Test"), "{out}");
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some("20"))
        .collect();
    assert_eq!(rows.len(), 23, "{out}");
    assert!(rows[0].trim_start().starts_with("2 "), "{out}");
    assert!(rows[22].trim_start().starts_with("8388608 "), "{out}");
}

#[test]
fn perf_server_and_client_as_two_processes() {
    let (server, stdout, port) = start_server(&["perf", "atomic", "bw"]);
    let port = port.to_string();
    let (code, out, err) = run(&[
        "perf",
        "atomic",
        "bw",
        "-n",
        "300",
        "--client",
        "127.0.0.1",
        "-p",
        &port,
        "--json",
    ]);
    let (server_code, server_out) = finish_server(server, stdout);
    assert_eq!(code, 0, "client:\n{out}\n{err}\nserver:\n{server_out}");
    assert_eq!(server_code, 0, "server:\n{server_out}");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(doc["results"][0]["iterations"], 300);
    // Two processes of one host: the devices talk through shared memory, and the report
    // says so (the label is made before the path is chosen, so it names none).
    let client = &doc["client_counters"];
    let sent = client["packets_sent"].as_u64().unwrap();
    assert!(sent > 0, "{doc}");
    assert_eq!(client["shm_packets_sent"].as_u64(), Some(sent), "{doc}");
    assert_eq!(client["udp_packets_sent"], 0, "{doc}");
    assert!(!doc["network"].as_str().unwrap().contains("UDP"), "{doc}");
    assert!(
        server_out.contains("served Atomic FETCH_AND_ADD BW Test"),
        "{server_out}"
    );
}

#[test]
fn pcap_decodes_the_capture_of_a_run() {
    let dir = std::env::temp_dir().join(format!("softverbs-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("pingpong.pcap");
    let file_arg = file.to_str().unwrap();
    run_ok(&["pingpong", "-n", "5", "-s", "100", "--pcap", file_arg]);
    let out = run_ok(&["pcap", file_arg]);
    let _ = std::fs::remove_dir_all(&dir);
    // Each ping and pong once as seen by the client's device, each ACKed: 20 packets (more
    // only if one was retransmitted), one line each, then the summary.
    let summary = out
        .lines()
        .find(|l| l.ends_with(" packets, 0 ICRC failures, 0 not IB transport packets"))
        .unwrap_or_else(|| panic!("no clean summary in\n{out}"));
    let packets: usize = summary.split(' ').next().unwrap().parse().unwrap();
    assert!(packets >= 20, "{out}");
    let lines = out.lines().filter(|l| l.ends_with("icrc ok")).count();
    assert_eq!(lines, packets, "{out}");
    assert!(
        out.contains("RC SEND ONLY") && out.contains("RC ACKNOWLEDGE"),
        "{out}"
    );
    assert!(
        out.contains(" out 127.0.0.") && out.contains(" in 127.0.0."),
        "{out}"
    );
}

#[test]
fn pcap_decodes_a_capture_cut_mid_record_up_to_the_cut_and_stops_quietly_on_a_closed_pipe() {
    let dir = std::env::temp_dir().join(format!("softverbs-cli-cut-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("whole.pcap");
    let cut = dir.join("cut.pcap");
    run_ok(&[
        "pingpong",
        "-n",
        "5",
        "-s",
        "100",
        "--pcap",
        file.to_str().unwrap(),
    ]);
    // A writer that died mid-record leaves a partial last record (tcpdump's "truncated
    // dump file"): every complete record is still decoded, with a warning.
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() - 10]).unwrap();
    let (code, out, err) = run(&["pcap", "-q", cut.to_str().unwrap()]);
    let whole = run_ok(&["pcap", "-q", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(packets(&out) + 1, packets(&whole), "{out}\n{whole}");
    assert!(err.contains("ends in a broken record"), "{err}");
    // `softverbs pcap FILE | head -1`: the reader goes away; no panic, no error.
    let mut child = softverbs()
        .args(["pcap", file.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start softverbs");
    drop(child.stdout.take());
    let out = finish(child);
    let _ = std::fs::remove_dir_all(&dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !err.contains("panicked"), "{err}");
}

#[test]
fn bad_arguments_fail_with_usage_and_help_describes_the_commands() {
    let (code, _, err) = run(&["pingpong", "--server", "--in-process"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = run(&["perf", "atomic", "lat", "-s", "64"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("8 bytes"), "{err}");
    let help = run_ok(&["--help"]);
    for command in ["devinfo", "pingpong", "perf", "pcap"] {
        assert!(help.contains(command), "{help}");
    }
    let help = run_ok(&["perf", "--help"]);
    assert!(
        help.contains("--tx-depth") && help.contains("--json"),
        "{help}"
    );
}
