//! A capture of our own traffic (the verifying workload between two processes, captured by
//! the client's device through `SOFTVERBS_PCAP`) decoded by Wireshark's `tshark` (Debian
//! package `tshark`) as RoCEv2 / InfiniBand: every request opcode of the workload appears
//! with its acknowledgements, each direction's request PSNs run on without gaps, and no
//! frame is malformed.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn tshark_decodes_our_captured_traffic_as_rocev2_with_consecutive_psns() {
    let dir = std::env::temp_dir().join(format!("softverbs-e2e-pcap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("client.pcap");
    let mut server = peer();
    server.arg("--server");
    let mut server = start_server(server);
    let client = peer()
        .args([
            "--client",
            "127.0.0.1",
            "--port",
            &server.port.to_string(),
            "-n",
            "600",
        ])
        .env("SOFTVERBS_PCAP", &pcap)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the client");
    let (code, out) = finish(client, None, Duration::from_secs(120));
    assert_eq!(code, 0, "client: {out}");
    let (code, out) = finish(
        server.child,
        Some(&mut server.stdout),
        Duration::from_secs(30),
    );
    assert_eq!(code, 0, "server: {out}");

    // Our payloads are test bytes, not an upper-layer protocol: switch off Wireshark's
    // heuristic payload dissectors (RPC-over-RDMA, SMB Direct, iSER, ...), which otherwise
    // guess at a 1-byte send and report *their* parse as malformed. The RoCEv2 / IB
    // transport layers are still fully dissected and checked.
    let heuristics = Command::new("tshark")
        .args(["-G", "heuristic-decodes"])
        .output()
        .expect("tshark (Debian package tshark; scripts/test.sh installs it)");
    let mut no_heuristics = Vec::new();
    for line in String::from_utf8_lossy(&heuristics.stdout).lines() {
        let mut cols = line.split('\t');
        if cols.next() == Some("infiniband.payload") {
            // The upper-layer protocols themselves; `ethertype` and the `infiniband.*`
            // entries are parts of the IB dissector that must stay on.
            match cols.next() {
                Some(name) if name != "ethertype" && !name.starts_with("infiniband") => {
                    no_heuristics.push("--disable-protocol".to_owned());
                    no_heuristics.push(name.to_owned());
                }
                _ => {}
            }
        }
    }
    assert!(
        !no_heuristics.is_empty(),
        "tshark lists no InfiniBand payload heuristics"
    );
    let tshark = |args: &[&str]| {
        let out = Command::new("tshark")
            .arg("-r")
            .arg(&pcap)
            .args(&no_heuristics)
            .args(args)
            .output()
            .expect("tshark (Debian package tshark; scripts/test.sh installs it)");
        assert!(
            out.status.success(),
            "tshark: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let summary = tshark(&[]);
    assert!(!summary.contains("Malformed"), "{summary}");
    let expert = tshark(&["-q", "-z", "expert,error"]);
    assert!(!expert.contains("Malformed"), "{expert}");
    let fields = tshark(&[
        "-T",
        "fields",
        "-E",
        "separator=;",
        "-e",
        "ip.src",
        "-e",
        "infiniband.bth.opcode",
        "-e",
        "infiniband.bth.psn",
    ]);
    let mut opcodes = BTreeSet::new();
    let mut last_request_psn: std::collections::HashMap<String, u32> = Default::default();
    let mut frames = 0;
    for line in fields.lines() {
        let cols: Vec<&str> = line.split(';').collect();
        let [src, opcode, psn] = cols[..] else {
            panic!("unexpected tshark line {line:?}");
        };
        let (opcode, psn): (u8, u32) = (
            opcode
                .parse()
                .unwrap_or_else(|_| panic!("not RoCEv2: {line:?}")),
            psn.parse().unwrap(),
        );
        frames += 1;
        opcodes.insert(opcode);
        // Requests (RC opcodes 0x00..=0x0c and 0x12..=0x14, 0x16..=0x17) from one sender
        // carry consecutive PSNs on a lossless run (reads advance by their response count,
        // so only check that the PSN never goes backwards).
        let request = opcode <= 0x0c || matches!(opcode, 0x13 | 0x14 | 0x16 | 0x17);
        if request {
            if let Some(&prev) = last_request_psn.get(src) {
                assert!(
                    psn.wrapping_sub(prev) & 0x00ff_ffff < 0x0080_0000 && psn != prev,
                    "{src}: request PSN {psn} after {prev}"
                );
            }
            last_request_psn.insert(src.to_owned(), psn);
        }
    }
    assert!(frames > 600, "only {frames} frames");
    // SEND ONLY 0x04 / FIRST 0x00, SEND ONLY WITH IMM 0x05, RDMA WRITE FIRST 0x06 or ONLY
    // 0x0a, READ REQUEST 0x0c, COMPARE SWAP 0x13, FETCH ADD 0x14, ACKNOWLEDGE 0x11, READ
    // RESPONSE ONLY 0x10 or FIRST 0x0d, ATOMIC ACKNOWLEDGE 0x12.
    for (name, any_of) in [
        ("send", &[0x00u8, 0x04][..]),
        ("send with immediate", &[0x05]),
        ("RDMA write", &[0x06, 0x0a]),
        ("RDMA read request", &[0x0c]),
        ("RDMA read response", &[0x0d, 0x10]),
        ("compare and swap", &[0x13]),
        ("fetch and add", &[0x14]),
        ("acknowledge", &[0x11]),
        ("atomic acknowledge", &[0x12]),
    ] {
        assert!(
            any_of.iter().any(|o| opcodes.contains(o)),
            "no {name} in the capture: {opcodes:x?}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
