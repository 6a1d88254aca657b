//! The device knobs the README documents work in every mode of the two-sided commands:
//! `SOFTVERBS_PCAP` (the capture exists and `tshark` decodes it as RoCEv2) and
//! `SOFTVERBS_FAULTS` (injected loss shows in the retransmit counters) in the default
//! two-device run, in `--server` / `--client`, and in `--in-process`, where the devices
//! hand packets to each other with no socket. Devices on automatically chosen 127.0.0.x
//! addresses, the exchange on 127.0.0.1.

mod common;

use common::{finish_server, run, run_with_env, start_server_with, TempDir};
use std::path::Path;
use std::process::Command;

/// `tshark -r FILE`'s one-line summaries; fails the test if tshark cannot run
/// (scripts/test.sh installs it: Debian package `tshark`).
fn tshark_lines(file: &Path) -> Vec<String> {
    let output = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("tshark is required (Debian package `tshark`): {e}"));
    assert!(
        output.status.success(),
        "tshark failed on {}: {}",
        file.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The capture exists, and tshark decodes at least `at_least` frames, every one as
/// RoCEv2 (Wireshark's "RRoCE"), none malformed, among them `opcodes`.
fn assert_tshark_decodes(file: &Path, at_least: usize, opcodes: &[&str]) {
    assert!(file.exists(), "no capture at {}", file.display());
    let lines = tshark_lines(file);
    assert!(
        lines.len() >= at_least,
        "{} frames: {lines:#?}",
        lines.len()
    );
    for line in &lines {
        assert!(
            line.contains("RRoCE") && !line.contains("Malformed"),
            "not decoded as RoCEv2: {line}"
        );
    }
    for opcode in opcodes {
        assert!(
            lines.iter().any(|l| l.contains(opcode)),
            "no {opcode} in {lines:#?}"
        );
    }
}

/// `SOFTVERBS_PCAP` captures a one-process run of pingpong and of perf with `mode` (no
/// argument: the default two UDP devices), and tshark decodes the files.
fn assert_softverbs_pcap_captures_one_process_runs(name: &str, mode: &[&str]) {
    let dir = TempDir::new(name);
    let file = dir.join("pingpong.pcap");
    let file_arg = file.to_str().unwrap();
    let args = [&["pingpong", "-n", "20", "-s", "100"], mode].concat();
    let (code, out, err) = run_with_env(&args, &[("SOFTVERBS_PCAP", file_arg)]);
    assert_eq!(code, 0, "{out}\n{err}");
    // The client's device records every packet once: 20 pings, 20 pongs, their ACKs.
    assert_tshark_decodes(&file, 80, &["RC Send Only", "RC Acknowledge"]);

    let file = dir.join("perf.pcap");
    let file_arg = file.to_str().unwrap();
    let args = [
        &["perf", "write", "bw", "-n", "50", "-s", "1024", "--json"],
        mode,
    ]
    .concat();
    let (code, out, err) = run_with_env(&args, &[("SOFTVERBS_PCAP", file_arg)]);
    assert_eq!(code, 0, "{out}\n{err}");
    // 50 WRITEs and their ACKs: one ACK may acknowledge every WRITE handled with it
    // (IBTA vol. 1 §9.7.5.1.1), so at least one.
    assert_tshark_decodes(&file, 51, &["RC RDMA Write Only", "RC Acknowledge"]);
}

#[test]
fn softverbs_pcap_captures_the_default_two_device_run_of_pingpong_and_perf() {
    assert_softverbs_pcap_captures_one_process_runs("pcap-loopback", &[]);
}

#[test]
fn softverbs_pcap_and_the_pcap_option_capture_an_in_process_run() {
    assert_softverbs_pcap_captures_one_process_runs("pcap-in-process", &["--in-process"]);
    let dir = TempDir::new("pcap-option-in-process");
    let file = dir.join("option.pcap");
    let (code, out, err) = run(&[
        "perf",
        "send",
        "lat",
        "--in-process",
        "-n",
        "20",
        "-s",
        "100",
        "--pcap",
        file.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_tshark_decodes(&file, 40, &["RC Send Only"]);
}

#[test]
fn softverbs_pcap_captures_each_side_of_a_server_and_client_run() {
    let dir = TempDir::new("pcap-two-processes");
    let server_file = dir.join("server.pcap");
    let client_file = dir.join("client.pcap");
    let (server, stdout, port) = start_server_with(
        &["pingpong", "-n", "20", "-s", "100"],
        &["--listen", "127.0.0.1"],
        &[("SOFTVERBS_PCAP", server_file.to_str().unwrap())],
    );
    let port = port.to_string();
    let (code, out, err) = run_with_env(
        &[
            "pingpong",
            "--client",
            "127.0.0.1",
            "-p",
            &port,
            "-n",
            "20",
            "-s",
            "100",
        ],
        &[("SOFTVERBS_PCAP", client_file.to_str().unwrap())],
    );
    let (server_code, server_out) = finish_server(server, stdout);
    assert_eq!(code, 0, "client:\n{out}\n{err}\nserver:\n{server_out}");
    assert_eq!(server_code, 0, "server:\n{server_out}");
    for file in [&server_file, &client_file] {
        assert_tshark_decodes(file, 80, &["RC Send Only", "RC Acknowledge"]);
    }
}

#[test]
fn pcap_option_and_softverbs_pcap_together_are_refused_before_either_file_is_made() {
    let dir = TempDir::new("pcap-both");
    let option = dir.join("option.pcap");
    let env = dir.join("env.pcap");
    let (code, _, err) = run_with_env(
        &["pingpong", "-n", "5", "--pcap", option.to_str().unwrap()],
        &[("SOFTVERBS_PCAP", env.to_str().unwrap())],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("--pcap") && err.contains("SOFTVERBS_PCAP") && err.contains("give one"),
        "{err}"
    );
    assert!(!option.exists() && !env.exists());
}

/// The number before `word` in `text` (`... 12 retransmitted ...`).
fn count_before(text: &str, word: &str) -> u64 {
    let words: Vec<&str> = text.split_whitespace().collect();
    let at = words
        .iter()
        .position(|w| w.trim_end_matches([',', ';', ')']) == word)
        .unwrap_or_else(|| panic!("no {word:?} in {text}"));
    words[at - 1]
        .trim_start_matches('(')
        .parse()
        .unwrap_or_else(|_| panic!("no count before {word:?} in {text}"))
}

/// SOFTVERBS_FAULTS=drop=0.05: each device loses 5 % of what it sends (README), both
/// devices of a one-process run with `mode` (no argument: two UDP devices); the losses
/// are sent again by go-back-N (IBTA 9.7.5.1), and perf and pingpong say so.
fn assert_injected_loss_shows_in_one_process_runs(mode: &[&str]) {
    let faults = [("SOFTVERBS_FAULTS", "drop=0.05,seed=7")];
    let args = [
        &["perf", "write", "bw", "-n", "500", "-s", "4096", "--json"],
        mode,
    ]
    .concat();
    let (code, out, err) = run_with_env(&args, &faults);
    assert_eq!(code, 0, "{out}\n{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    for side in ["client_counters", "server_counters"] {
        let dropped = doc[side]["faults"]["dropped"].as_u64();
        assert!(dropped.is_some_and(|d| d > 0), "{side}: {doc}");
    }
    assert!(
        doc["client_counters"]["retransmitted_packets"].as_u64() > Some(0),
        "{doc}"
    );
    assert_eq!(doc["results"][0]["iterations"], 500, "{doc}");

    let args = [&["pingpong", "-n", "200", "-s", "1024"], mode].concat();
    let (code, out, err) = run_with_env(&args, &faults);
    assert_eq!(code, 0, "{out}\n{err}");
    let client = out
        .lines()
        .find(|l| l.starts_with("client device: "))
        .unwrap_or_else(|| panic!("no client device line in\n{out}"));
    let server = out
        .lines()
        .find(|l| l.starts_with("server device: "))
        .unwrap_or_else(|| panic!("no server device line in\n{out}"));
    let injected = |line: &str| -> u64 {
        let faults = line
            .split("faults injected")
            .nth(1)
            .unwrap_or_else(|| panic!("no injected faults in {line}"));
        count_before(faults, "dropped")
    };
    assert!(injected(client) > 0, "{client}");
    assert!(injected(server) > 0, "{server}");
    assert!(
        count_before(client, "retransmitted") + count_before(server, "retransmitted") > 0,
        "{out}"
    );
}

#[test]
fn injected_loss_shows_in_the_retransmit_counters_of_the_default_two_device_run() {
    assert_injected_loss_shows_in_one_process_runs(&[]);
}

#[test]
fn injected_loss_shows_in_the_retransmit_counters_of_an_in_process_run() {
    assert_injected_loss_shows_in_one_process_runs(&["--in-process"]);
}

#[test]
fn injected_loss_shows_in_the_retransmit_counters_of_a_server_and_client_run() {
    let (server, stdout, port) =
        start_server_with(&["perf", "write", "bw"], &["--listen", "127.0.0.1"], &[]);
    let port = port.to_string();
    let (code, out, err) = run_with_env(
        &[
            "perf",
            "write",
            "bw",
            "-n",
            "500",
            "-s",
            "4096",
            "--client",
            "127.0.0.1",
            "-p",
            &port,
            "--json",
        ],
        &[("SOFTVERBS_FAULTS", "drop=0.05,seed=3")],
    );
    let (server_code, server_out) = finish_server(server, stdout);
    assert_eq!(code, 0, "client:\n{out}\n{err}\nserver:\n{server_out}");
    assert_eq!(server_code, 0, "server:\n{server_out}");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let counters = &doc["client_counters"];
    assert!(counters["faults"]["dropped"].as_u64() > Some(0), "{doc}");
    assert!(
        counters["retransmitted_packets"].as_u64() > Some(0),
        "{doc}"
    );
}

#[test]
fn help_says_which_device_captures_a_one_process_run() {
    for command in ["pingpong", "perf"] {
        let out = common::run_ok(&[command, "--help"]);
        assert!(
            out.contains("SOFTVERBS_PCAP") && out.contains("SOFTVERBS_FAULTS"),
            "{command} --help:\n{out}"
        );
        assert!(
            out.contains("the client's device writes the file"),
            "{command} --help:\n{out}"
        );
    }
}
