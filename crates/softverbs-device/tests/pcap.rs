//! Pcap capture middleware: tshark decodes our captures as RoCEv2 / InfiniBand, and our
//! reader reads them back.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::{recv_one, sample_packets};
use softverbs_device::pcap::{read_capture, Capture, Direction, PcapTransport};
use softverbs_device::{Endpoint, LoopbackNetwork, Sent, Transport, UdpConfig, UdpTransport};
use softverbs_wire::{PacketRepr, WireError};

/// A fresh capture file path in the temp directory.
fn capture_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("softverbs-device-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    path
}

/// Sends every sample packet from `a` to `to` and receives it at `b`, both ends recording.
/// Returns what was sent, in order.
fn exchange(a: &impl Transport, b: &impl Transport, to: &Endpoint) -> Vec<(Sent, Vec<u8>)> {
    let mut buf = vec![0u8; 4096];
    let mut sent = Vec::new();
    for (repr, payload, _) in sample_packets() {
        let mut packet = common::emit(&repr, &payload);
        let headers = a.send(to, 0xC000, &mut packet).unwrap();
        let received = recv_one(b, &mut buf, "capture exchange");
        assert_eq!(&buf[..received.len], &packet[..]);
        sent.push((headers, packet));
    }
    sent
}

/// Runs tshark on `file`; panics (fails the test) if tshark is not installed.
fn tshark(args: &[&str], file: &Path) -> String {
    let output = Command::new("tshark")
        .args(args)
        .arg("-r")
        .arg(file)
        .output()
        .unwrap_or_else(|error| {
            panic!("tshark is required (Debian package `tshark`) and could not run: {error}")
        });
    assert!(
        output.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// `tshark -V` shows every frame as InfiniBand with no malformed packet and no error;
/// the fields show each frame's opcode, PSN and the ICRC trailer we computed.
fn assert_tshark_decodes(file: &Path, options: &[&str], sent: &[(Sent, Vec<u8>)]) {
    let samples = sample_packets();
    let frames = 2 * sent.len(); // each packet recorded at the sender and the receiver
    let mut args = options.to_vec();
    args.push("-V");
    let verbose = tshark(&args, file);
    assert_eq!(
        verbose.lines().filter(|l| *l == "InfiniBand").count(),
        frames,
        "every frame must decode as InfiniBand:\n{verbose}"
    );
    for (_, _, opcode_line) in &samples {
        assert!(
            verbose.contains(&format!("Opcode: {opcode_line}")),
            "missing {opcode_line}"
        );
    }
    // (tshark 4.0 shows the ICRC but does not check it: the field check below and our
    // reader do. With ip/udp.check_checksum it does check our IP and UDP checksums.)
    for bad in [
        "Malformed",
        "Expert Info (Error",
        "Expert Info (Warning",
        "incorrect",
        "status: Bad",
    ] {
        assert!(!verbose.contains(bad), "tshark reports {bad:?}:\n{verbose}");
    }

    args.pop();
    args.extend([
        "-T",
        "fields",
        "-e",
        "infiniband.bth.opcode",
        "-e",
        "infiniband.bth.psn",
        "-e",
        "infiniband.invariant.crc",
    ]);
    let fields = tshark(&args, file);
    let lines: Vec<&str> = fields.lines().collect();
    assert_eq!(lines.len(), frames, "{fields}");
    for (i, line) in lines.iter().enumerate() {
        let (repr, _, _) = &samples[i / 2];
        let (headers, _) = &sent[i / 2];
        // tshark prints the trailer bytes as a big-endian number; the ICRC goes on the
        // wire least-significant byte first (§1.7 step 4).
        let expected = format!(
            "{}\t{}\t{:#010x}",
            repr.bth.opcode.value(),
            repr.bth.psn.value(),
            headers.icrc.swap_bytes()
        );
        assert_eq!(*line, expected, "frame {}", i + 1);
    }
}

/// Our reader gives back, for each frame: direction (out at the sender, in at the
/// receiver), the parsed headers, the payload length and a verified ICRC.
fn assert_reader_round_trips(file: &Path, sent: &[(Sent, Vec<u8>)]) {
    let records = read_capture(file).unwrap();
    assert_eq!(records.len(), 2 * sent.len());
    for (i, record) in records.iter().enumerate() {
        let (headers, packet) = &sent[i / 2];
        let (repr, payload) = PacketRepr::parse(packet).unwrap();
        let expected_direction = if i % 2 == 0 {
            Direction::Outbound
        } else {
            Direction::Inbound
        };
        assert_eq!(record.frame, i);
        assert_eq!(record.direction, expected_direction, "frame {i}");
        assert_eq!(record.packet, Ok((repr, payload.len())), "frame {i}");
        assert!(record.icrc_ok(), "frame {i}: {record}");
        assert_eq!(record.udp.dst_port, headers.udp.dst_port);
        assert_eq!(record.udp.src_port, headers.udp.src_port);
        let line = record.to_string();
        assert!(line.contains(&format!(" {expected_direction} ")), "{line}");
        assert!(line.contains(&repr.to_string()), "{line}");
        assert!(line.ends_with(" icrc ok"), "{line}");
    }
}

// Reference §1.1 (Ethernet | IP | UDP 4791 | BTH …) and §1.7; STYLE habit 9 ("pcap capture
// that Wireshark decodes as RoCEv2"): an in-process capture of nine opcodes over IPv4 and
// IPv6 decodes in tshark with the right opcodes, PSNs and ICRC trailers, no warnings, and
// reads back through our reader.
#[test]
fn tshark_decodes_our_capture_as_rocev2_and_the_reader_round_trips_it() {
    for (name, a_addr, b_addr) in [
        ("loopback-v4.pcap", "127.0.0.1", "127.0.0.2"),
        ("loopback-v6.pcap", "::1", "::2"),
    ] {
        let network = LoopbackNetwork::new();
        let path = capture_path(name);
        let capture = Capture::create(&path).unwrap();
        let attach = |addr: &str| {
            let endpoint = Endpoint::rocev2(addr.parse().unwrap());
            PcapTransport::new(network.attach(endpoint).unwrap(), Arc::clone(&capture))
        };
        let a = attach(a_addr);
        let b = attach(b_addr);
        let sent = exchange(&a, &b, &b.local());
        capture.close().unwrap();
        assert_eq!(capture.packets(), 2 * sent.len() as u64);
        assert_eq!(capture.write_errors(), 0);
        assert_tshark_decodes(
            &path,
            &[
                "-o",
                "ip.check_checksum:TRUE",
                "-o",
                "udp.check_checksum:TRUE",
            ],
            &sent,
        );
        assert_reader_round_trips(&path, &sent);
        std::fs::remove_file(&path).unwrap();
    }
}

// Reference §5.2 / §5.3: a capture of real UDP traffic (both directions recorded, the
// receiver's headers rebuilt from what the socket reports) still verifies, over IPv4 and
// IPv6. The ports are ephemeral, so tshark is told which port is RoCEv2.
#[test]
fn capture_of_udp_traffic_decodes_and_verifies() {
    for (name, a_addr, b_addr) in [
        ("udp-v4.pcap", "127.0.0.20", "127.0.0.21"),
        ("udp-v6.pcap", "::1", "::1"),
    ] {
        let path = capture_path(name);
        let capture = Capture::create(&path).unwrap();
        let bind = |addr: &str| {
            let config = UdpConfig {
                address: Some(addr.parse().unwrap()),
                port: 0,
                ..UdpConfig::default()
            };
            PcapTransport::new(UdpTransport::bind(config).unwrap(), Arc::clone(&capture))
        };
        let a = bind(a_addr);
        let b = bind(b_addr);
        let sent = exchange(&a, &b, &b.local());
        capture.close().unwrap();
        let port = format!("infiniband.rroce.port:{}", b.local().port());
        assert_tshark_decodes(
            &path,
            &[
                "-o",
                &port,
                "-o",
                "ip.check_checksum:TRUE",
                "-o",
                "udp.check_checksum:TRUE",
            ],
            &sent,
        );
        assert_reader_round_trips(&path, &sent);
        std::fs::remove_file(&path).unwrap();
    }
}

// Reference §1.7 step 5: a capture shows a corrupted packet's ICRC as bad; recording can
// be switched off at run time and after close nothing more is written.
#[test]
fn capture_shows_bad_icrc_and_can_be_switched_off() {
    let network = LoopbackNetwork::new();
    let path = capture_path("switch.pcap");
    let capture = Capture::create(&path).unwrap();
    let a = network.attach_next().unwrap();
    let b = network.attach_next().unwrap();
    let mut packet = common::send_only(7, b"corrupt me");
    let sent = a.prepare(&b.local(), 0xC000, &mut packet).unwrap();
    capture.record(Direction::Outbound, &sent.ip, &sent.udp, &packet);
    packet[13] ^= 0x40;
    capture.record(Direction::Outbound, &sent.ip, &sent.udp, &packet);
    capture.set_enabled(false);
    capture.record(Direction::Outbound, &sent.ip, &sent.udp, &packet);
    capture.set_enabled(true);
    capture.close().unwrap();
    capture.record(Direction::Outbound, &sent.ip, &sent.udp, &packet);
    assert_eq!(capture.packets(), 2);

    let records = read_capture(&path).unwrap();
    assert_eq!(records.len(), 2);
    assert!(records[0].icrc_ok());
    assert!(matches!(records[1].icrc, Err(WireError::BadIcrc { .. })));
    assert!(
        records[1].to_string().contains("icrc BAD (computed"),
        "{}",
        records[1]
    );
    std::fs::remove_file(&path).unwrap();
}

// A file that is not a capture is an error, not a panic.
#[test]
fn reading_garbage_is_an_error() {
    let path = capture_path("garbage.pcap");
    std::fs::write(&path, b"this is not a pcap file at all").unwrap();
    assert!(read_capture(&path).is_err());
    assert!(read_capture(capture_path("missing.pcap")).is_err());
    std::fs::remove_file(&path).unwrap();
}

// A capture can be capped (`SOFTVERBS_PCAP_LIMIT`), so that a flood cannot fill a disk:
// the file never passes the cap, it stays a readable pcap file holding the first packets,
// and the packets left out are counted.
#[test]
fn a_capped_capture_never_passes_its_cap_and_counts_what_it_left_out() {
    let network = LoopbackNetwork::new();
    let path = capture_path("capped.pcap");
    let capture = Capture::create(&path).unwrap();
    let cap = 1000;
    capture.set_limit(cap);
    let a = network.attach_next().unwrap();
    let b = network.attach_next().unwrap();
    let mut packet = common::send_only(7, &[0x5a; 100]);
    let sent = a.prepare(&b.local(), 0xC000, &mut packet).unwrap();
    for _ in 0..1000 {
        capture.record(Direction::Outbound, &sent.ip, &sent.udp, &packet);
    }
    capture.close().unwrap();
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size <= cap, "{size} bytes over the {cap}-byte cap");
    assert_eq!(size, capture.bytes());
    let records = read_capture(&path).unwrap();
    assert!(!records.is_empty());
    assert_eq!(records.len() as u64, capture.packets());
    assert_eq!(capture.packets() + capture.over_limit(), 1000);
    assert!(capture
        .to_string()
        .contains(&format!("over_limit={}", capture.over_limit())));
    std::fs::remove_file(&path).unwrap();
}

// `SOFTVERBS_PCAP_LIMIT` spellings: bytes, or K/M/G/T (powers of 1024); anything else is
// an error that names the value.
#[test]
fn capture_limit_spellings() {
    use softverbs_device::pcap::parse_size;
    assert_eq!(parse_size("4096"), Ok(4096));
    assert_eq!(parse_size("64K"), Ok(64 << 10));
    assert_eq!(parse_size("100M"), Ok(100 << 20));
    assert_eq!(parse_size("2g"), Ok(2 << 30));
    assert_eq!(parse_size("1GiB"), Ok(1 << 30));
    assert!(parse_size("lots").unwrap_err().contains("lots"));
    assert!(parse_size("12Q").is_err());
    assert!(parse_size("99999999999T").is_err());
}
