//! Pcap capture middleware: tshark decodes our captures (classic pcap and pcapng) as
//! RoCEv2 / InfiniBand, and our reader reads them back, and reads what Wireshark's tools
//! write.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::{recv_one, sample_packets};
use softverbs_device::pcap::{
    read_capture, read_capture_from, Capture, CaptureFormat, Direction, PcapTransport,
};
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

/// The first four bytes of a pcap file (little-endian, microseconds) and of a pcapng file
/// (a Section Header Block).
const PCAP_MAGIC: [u8; 4] = [0xd4, 0xc3, 0xb2, 0xa1];
const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];

/// tshark's view of each frame's capture time (`frame.time_epoch`, seconds with nine
/// decimals) and, in a pcapng file, direction (`frame.packet_flags_direction`: 1 in,
/// 2 out; empty in a pcap file).
fn tshark_times_and_directions(file: &Path) -> Vec<(String, String)> {
    tshark(
        &[
            "-T",
            "fields",
            "-E",
            "separator=;",
            "-e",
            "frame.time_epoch",
            "-e",
            "frame.packet_flags_direction",
        ],
        file,
    )
    .lines()
    .map(|line| {
        let (time, direction) = line.split_once(';').unwrap();
        (time.to_owned(), direction.to_owned())
    })
    .collect()
}

// Reference §1.1 (Ethernet | IP | UDP 4791 | BTH …) and §1.7; STYLE habit 9 ("pcap capture
// that Wireshark decodes as RoCEv2"): an in-process capture of nine opcodes over IPv4 and
// IPv6, written as classic pcap and (for a `.pcapng` name) as pcapng, decodes in tshark
// with the right opcodes, PSNs and ICRC trailers, no warnings, and reads back through our
// reader; tshark reads the same capture times as our reader (pcapng: to the nanosecond,
// which pins the interface's `if_tsresol`) and, in pcapng, each packet's direction.
#[test]
fn tshark_decodes_our_capture_as_rocev2_and_the_reader_round_trips_it() {
    for (name, a_addr, b_addr) in [
        ("loopback-v4.pcap", "127.0.0.1", "127.0.0.2"),
        ("loopback-v6.pcap", "::1", "::2"),
        ("loopback-v4.pcapng", "127.0.0.1", "127.0.0.2"),
        ("loopback-v6.pcapng", "::1", "::2"),
    ] {
        let network = LoopbackNetwork::new();
        let path = capture_path(name);
        let capture = Capture::create(&path).unwrap();
        let pcapng = name.ends_with(".pcapng");
        let format = if pcapng {
            CaptureFormat::PcapNg
        } else {
            CaptureFormat::Pcap
        };
        assert_eq!(capture.format(), format, "{name}");
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
        assert_eq!(capture.bytes(), std::fs::metadata(&path).unwrap().len());
        let magic = std::fs::read(&path).unwrap()[..4].to_vec();
        assert_eq!(
            magic,
            if pcapng { PCAPNG_MAGIC } else { PCAP_MAGIC },
            "{name}"
        );
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

        let records = read_capture(&path).unwrap();
        let seen = tshark_times_and_directions(&path);
        assert_eq!(seen.len(), records.len(), "{name}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        for (record, (time, direction)) in records.iter().zip(&seen) {
            let ours = format!(
                "{}.{:09}",
                record.timestamp.as_secs(),
                record.timestamp.subsec_nanos()
            );
            assert_eq!(*time, ours, "{name} frame {}", record.frame);
            assert!(now - record.timestamp < std::time::Duration::from_secs(600));
            let expected = match (pcapng, record.direction) {
                (false, _) => "",
                (true, Direction::Inbound) => "0x00000001",
                (true, _) => "0x00000002",
            };
            assert_eq!(direction, expected, "{name} frame {}", record.frame);
        }
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
// the file never passes the cap, it stays a readable capture holding the first packets,
// and the packets left out are counted; the count of bytes is exact in both formats (the
// packet left out first would have passed the cap).
#[test]
fn a_capped_capture_never_passes_its_cap_and_counts_what_it_left_out() {
    for name in ["capped.pcap", "capped.pcapng"] {
        let network = LoopbackNetwork::new();
        let path = capture_path(name);
        let capture = Capture::create(&path).unwrap();
        let header = Capture::to_writer_as(std::io::sink(), capture.format())
            .unwrap()
            .bytes();
        let cap = 1000;
        capture.set_limit(cap);
        let a = network.attach_next().unwrap();
        let b = network.attach_next().unwrap();
        let mut packet = common::send_only(7, &[0x5a; 101]);
        let sent = a.prepare(&b.local(), 0xC000, &mut packet).unwrap();
        for _ in 0..1000 {
            capture.record(Direction::Outbound, &sent.ip, &sent.udp, &packet);
        }
        capture.close().unwrap();
        let size = std::fs::metadata(&path).unwrap().len();
        assert!(size <= cap, "{name}: {size} bytes over the {cap}-byte cap");
        assert_eq!(size, capture.bytes(), "{name}");
        let records = read_capture(&path).unwrap();
        assert!(!records.is_empty(), "{name}");
        assert_eq!(records.len() as u64, capture.packets(), "{name}");
        assert_eq!(capture.packets() + capture.over_limit(), 1000, "{name}");
        let record = (size - header) / capture.packets();
        assert_eq!((size - header) % capture.packets(), 0, "{name}");
        assert!(size + record > cap, "{name}: room left for another packet");
        assert!(capture
            .to_string()
            .contains(&format!("over_limit={}", capture.over_limit())));
        std::fs::remove_file(&path).unwrap();
    }
}

/// Runs `editcap ARGS` (Debian package wireshark-common, which tshark depends on).
fn editcap(args: &[&std::ffi::OsStr]) {
    let output = Command::new("editcap")
        .args(args)
        .output()
        .unwrap_or_else(|error| {
            panic!("editcap is required (Debian package `wireshark-common`): {error}")
        });
    assert!(
        output.status.success(),
        "editcap failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

// A pcapng file written by Wireshark's tools (`editcap -F pcapng`, microsecond
// timestamps: no `if_tsresol`) reads back as the very same records as the pcap it was
// made from: times, directions (from the Ethernet addresses), headers and ICRCs.
#[test]
fn the_reader_reads_a_pcapng_written_by_editcap_as_the_pcap_it_came_from() {
    let network = LoopbackNetwork::new();
    let pcap = capture_path("editcap-in.pcap");
    let pcapng = capture_path("editcap-out.pcapng");
    let capture = Capture::create(&pcap).unwrap();
    let attach = |addr: &str| {
        let endpoint = Endpoint::rocev2(addr.parse().unwrap());
        PcapTransport::new(network.attach(endpoint).unwrap(), Arc::clone(&capture))
    };
    let a = attach("127.0.0.1");
    let b = attach("127.0.0.2");
    let sent = exchange(&a, &b, &b.local());
    capture.close().unwrap();
    editcap(&[
        "-F".as_ref(),
        "pcapng".as_ref(),
        pcap.as_os_str(),
        pcapng.as_os_str(),
    ]);
    assert_eq!(std::fs::read(&pcapng).unwrap()[..4], PCAPNG_MAGIC);
    let from_pcap = read_capture(&pcap).unwrap();
    let from_pcapng = read_capture(&pcapng).unwrap();
    assert_eq!(from_pcap.len(), 2 * sent.len());
    assert_eq!(from_pcapng, from_pcap);
    assert_reader_round_trips(&pcapng, &sent);
    std::fs::remove_file(&pcap).unwrap();
    std::fs::remove_file(&pcapng).unwrap();
}

// pcapng as the specification allows it, beyond what we write: several interfaces, one
// of a link type we do not decode (its packets are skipped but keep their frame number),
// timestamps in each interface's own resolution and offset, the direction in a packet's
// flags winning over the Ethernet addresses, and a Simple Packet Block (no timestamp: the
// time of the packet before it; its data padded to 4 bytes).
#[test]
fn the_reader_follows_each_pcapng_interface_and_reads_simple_packet_blocks() {
    use pcap_file::pcapng::blocks::enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption};
    use pcap_file::pcapng::blocks::interface_description::{
        InterfaceDescriptionBlock, InterfaceDescriptionOption,
    };
    use pcap_file::pcapng::blocks::simple_packet::SimplePacketBlock;
    use pcap_file::pcapng::PcapNgWriter;
    use pcap_file::DataLink;
    use std::time::Duration;

    let network = LoopbackNetwork::new();
    let a = network.attach_next().unwrap();
    let b = network.attach_next().unwrap();
    let mut packet = common::send_only(7, b"odd length");
    let sent = a.prepare(&b.local(), 0xC000, &mut packet).unwrap();
    let frame =
        softverbs_device::pcap::ethernet_frame(Direction::Outbound, &sent.ip, &sent.udp, &packet)
            .unwrap();
    assert_ne!(
        frame.len() % 4,
        0,
        "the Simple Packet Block must need padding"
    );

    let mut writer = PcapNgWriter::new(Vec::new()).unwrap();
    // Interface 0: Ethernet, microseconds (no if_tsresol), 100 s behind (if_tsoffset).
    writer
        .write_pcapng_block(InterfaceDescriptionBlock {
            linktype: DataLink::ETHERNET,
            snaplen: 0,
            options: vec![InterfaceDescriptionOption::IfTsOffset(100)],
        })
        .unwrap();
    // Interface 1: a link type we do not decode, 2^-10 s units.
    writer
        .write_pcapng_block(InterfaceDescriptionBlock {
            linktype: DataLink::LINUX_SLL,
            snaplen: 0,
            options: vec![InterfaceDescriptionOption::IfTsResol(0x80 | 10)],
        })
        .unwrap();
    // pcap-file writes a timestamp as that many nanoseconds: in the interface's units here.
    let units = |n: u64| Duration::from_nanos(n);
    writer
        .write_pcapng_block(EnhancedPacketBlock {
            interface_id: 0,
            timestamp: units(1_700_000_000_250_000),
            original_len: frame.len() as u32,
            data: frame.clone().into(),
            options: vec![EnhancedPacketOption::Flags(0b01)],
        })
        .unwrap();
    writer
        .write_pcapng_block(EnhancedPacketBlock {
            interface_id: 1,
            timestamp: units(3 << 10),
            original_len: 4,
            data: vec![1, 2, 3, 4].into(),
            options: vec![],
        })
        .unwrap();
    writer
        .write_pcapng_block(SimplePacketBlock {
            original_len: frame.len() as u32,
            data: frame.clone().into(),
        })
        .unwrap();
    let bytes = writer.into_inner();

    let records = read_capture_from(&bytes[..]).unwrap();
    assert_eq!(records.len(), 2, "{records:#?}");
    let time = Duration::new(1_700_000_000 + 100, 250_000_000);
    assert_eq!(records[0].frame, 0);
    assert_eq!(records[0].timestamp, time);
    assert_eq!(records[0].direction, Direction::Inbound, "the flags win");
    assert!(records[0].icrc_ok(), "{}", records[0]);
    assert_eq!(records[1].frame, 2);
    // 3 << 10 units of 2^-10 s on the skipped interface-1 packet before it.
    assert_eq!(
        records[1].timestamp,
        Duration::from_secs(3),
        "the time of the packet before"
    );
    assert_eq!(records[1].direction, Direction::Outbound, "from the MACs");
    assert_eq!(records[1].packet, records[0].packet);
    assert!(records[1].icrc_ok(), "{}", records[1]);
}

// What is wrong with a file is said, and a file cut short is told from a damaged one:
// neither pcap nor pcapng (its first bytes shown), empty, a pcapng whose block lengths
// disagree (damaged), a pcapng cut mid-block (truncated: the whole records before it are
// kept), a packet on an interface no block describes (damaged).
#[test]
fn the_reader_names_what_is_wrong_and_tells_a_truncated_file_from_a_damaged_one() {
    let error = read_capture_from(&b"<?xml version"[..]).unwrap_err();
    assert!(!error.is_truncated());
    assert!(error.to_string().contains("3c 3f 78 6d"), "{error}");
    let error = read_capture_from(&b""[..]).unwrap_err();
    assert!(error.to_string().contains("empty"), "{error}");

    let network = LoopbackNetwork::new();
    let a = network.attach_next().unwrap();
    let b = network.attach_next().unwrap();
    let mut packet = common::send_only(7, b"twelve bytes");
    let sent = a.prepare(&b.local(), 0xC000, &mut packet).unwrap();
    let file = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let capture =
        Capture::to_writer_as(SharedVec(Arc::clone(&file)), CaptureFormat::PcapNg).unwrap();
    let header = capture.bytes() as usize;
    for _ in 0..3 {
        capture.record(Direction::Outbound, &sent.ip, &sent.udp, &packet);
    }
    capture.close().unwrap();
    let whole = file.lock().unwrap().clone();
    assert_eq!(read_capture_from(&whole[..]).unwrap().len(), 3);
    let block = (whole.len() - header) / 3;

    // The second packet's trailing length differs from its leading one.
    let mut damaged = whole.clone();
    damaged[header + 2 * block - 1] ^= 0x04;
    let (records, error) = softverbs_device::pcap::read_capture_tolerant(&damaged[..]).unwrap();
    let error = error.expect("an error after the first packet");
    assert_eq!(records.len(), 1);
    assert!(!error.is_truncated(), "{error}");
    assert!(error.to_string().starts_with("damaged capture"), "{error}");

    let (records, error) =
        softverbs_device::pcap::read_capture_tolerant(&whole[..whole.len() - 5]).unwrap();
    let error = error.expect("an error at the cut");
    assert_eq!(records.len(), 2);
    assert!(error.is_truncated(), "{error}");

    // The first packet's interface id (the first word of its body) set to 7.
    let mut foreign = whole.clone();
    foreign[header + 8..header + 12].copy_from_slice(&7u32.to_le_bytes());
    let error = read_capture_from(&foreign[..]).unwrap_err();
    assert!(!error.is_truncated());
    assert!(error.to_string().contains("interface 7"), "{error}");
}

/// A writer into a shared vector, to look at a capture's bytes.
struct SharedVec(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for SharedVec {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

// The no-panic contract on untrusted files: a seeded run of damaged captures (bytes
// flipped, overwritten with extreme values, cut) of both formats never panics; each read
// ends in records, an error, or both.
#[test]
fn damaged_captures_of_either_format_never_panic_the_reader() {
    let network = LoopbackNetwork::new();
    let a = network.attach_next().unwrap();
    let b = network.attach_next().unwrap();
    let mut seed: u64 = 0x5eed_cafe_f00d_0017;
    let mut next = move || {
        // xorshift64*: deterministic, no dependency.
        seed ^= seed >> 12;
        seed ^= seed << 25;
        seed ^= seed >> 27;
        seed.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    for format in [CaptureFormat::Pcap, CaptureFormat::PcapNg] {
        let file = Arc::new(std::sync::Mutex::new(Vec::new()));
        let capture = Capture::to_writer_as(SharedVec(Arc::clone(&file)), format).unwrap();
        for (repr, payload, _) in sample_packets() {
            let mut packet = common::emit(&repr, &payload);
            let sent = a.prepare(&b.local(), 0xC000, &mut packet).unwrap();
            capture.record(Direction::Outbound, &sent.ip, &sent.udp, &packet);
        }
        capture.close().unwrap();
        let whole = file.lock().unwrap().clone();
        let (mut read, mut failed) = (0, 0);
        for round in 0..150 {
            let mut bytes = whole.clone();
            for _ in 0..1 + next() % 4 {
                let at = (next() % bytes.len() as u64) as usize;
                bytes[at] = match next() % 4 {
                    0 => 0xff,
                    1 => 0x00,
                    _ => bytes[at] ^ (1 << (next() % 8)),
                };
            }
            if round % 5 == 0 {
                bytes.truncate((next() % bytes.len() as u64) as usize);
            }
            match softverbs_device::pcap::read_capture_tolerant(&bytes[..]) {
                Ok((_, None)) => read += 1,
                Ok((_, Some(_))) | Err(_) => failed += 1,
            }
        }
        assert_eq!(read + failed, 150, "{format}");
        assert!(failed > 0, "{format}: no damage was ever noticed");
    }
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
