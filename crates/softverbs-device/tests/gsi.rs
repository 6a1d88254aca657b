//! QP1 (the General Services Interface) between two devices: management datagrams sent
//! with `Device::gsi_send` arrive at the peer's `Device::gsi_recv` with the sender's GID
//! and SrcQP 1 (IBTA vol. 1 13.5: QP1, Q_Key 0x80010000), over UDP on 127.0.0.x, over the
//! in-process path, and through the capture and fault middleware; the receiving device's
//! progress thread takes them off the wire while nobody polls, and `gsi_fd` is readable
//! exactly while MADs wait. What is not a MAD is dropped and counted, and a flood is
//! bounded by the inbox.
//!
//! Every wait is bounded (a few seconds); only 127.0.0.0/8 is used.

use softverbs_device::pcap::read_capture;
use softverbs_device::{
    parse_faults, Capture, Device, DeviceConfig, Endpoint, Transport, UdpConfig, UdpTransport,
};
use softverbs_proto::{DropReason, GSI_INBOX_LEN, GSI_QKEY, MAD_LEN};
use softverbs_wire::{BthRepr, DethRepr, Opcode, PacketRepr, Psn, Qpn};
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

/// A UDP device on the first free 127.0.0.x, port 4791, with its progress thread.
fn udp_device() -> Device {
    Device::open(DeviceConfig::udp(UdpConfig::default())).expect("open a UDP device")
}

/// The GID of a device's address (GID index 1: `::ffff:127.0.0.x`).
fn gid(device: &Device) -> [u8; 16] {
    device.query_gid(1, 1).expect("GID index 1")
}

/// A CM-class MAD (base version 1, class 0x07, version 2, method SEND) whose
/// TransactionID is `tag` repeated.
fn mad(tag: u8) -> Vec<u8> {
    let mut mad = vec![0u8; MAD_LEN];
    mad[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
    mad[8..16].copy_from_slice(&[tag; 8]);
    mad
}

/// Whether `fd` polls readable now.
fn readable(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&zero)).expect("poll") == 1
}

/// Waits (at most 5 s) for `device`'s GSI fd to poll readable, without calling any verb
/// or `progress` on it: the progress thread (or the sender, in process) delivers.
fn wait_readable(device: &Device) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !readable(device.gsi_fd()) {
        assert!(
            Instant::now() < deadline,
            "no MAD arrived within 5 s: {}",
            device.counters()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Sends a MAD each way between `a` and `b` and checks what arrives: the bytes, the
/// sender's GID, SrcQP 1, P_Key 0xFFFF.
fn exchange(a: &Device, b: &Device) {
    assert!(!readable(b.gsi_fd()), "nothing waits yet");
    a.gsi_send(gid(b), &mad(0xA1)).expect("A sends");
    wait_readable(b);
    let got = b.gsi_recv().expect("a MAD waits at B");
    assert_eq!(got.bytes, mad(0xA1));
    assert_eq!((got.sgid, got.src_qpn, got.pkey), (gid(a), 1, 0xFFFF));
    assert!(b.gsi_recv().is_none());

    b.gsi_send(got.sgid, &mad(0xB2)).expect("B answers");
    wait_readable(a);
    let reply = a.gsi_recv().expect("the answer waits at A");
    assert_eq!(
        (reply.bytes, reply.sgid, reply.src_qpn),
        (mad(0xB2), gid(b), 1)
    );
    for device in [a, b] {
        let c = device.counters();
        assert_eq!(
            (c.gsi_sent, c.gsi_received, c.total_drops()),
            (1, 1, 0),
            "{c}"
        );
    }
}

/// IBTA 13.5: two UDP devices on 127.0.0.x exchange MADs QP1 to QP1 over real sockets
/// (the in-process shortcut off), received by the progress threads while the test polls
/// nothing but the GSI fd.
#[test]
fn two_udp_devices_exchange_mads_through_qp1() {
    let (a, b) = (udp_device(), udp_device());
    a.set_in_process_shortcut(false);
    b.set_in_process_shortcut(false);
    exchange(&a, &b);
    let sent = a.transport_counters().expect("a UDP device").sent_packets;
    assert!(sent >= 1, "the MAD went through the socket");
}

/// IBTA 13.5: two in-process devices exchange MADs through the direct hand-over.
#[test]
fn two_in_process_devices_exchange_mads_through_qp1() {
    let a = Device::open(DeviceConfig::in_process()).unwrap();
    let b = Device::open(DeviceConfig::in_process()).unwrap();
    exchange(&a, &b);
}

/// MADs go through the capture and fault middleware like any packet: in process, a
/// capture on each side (and faults that change nothing on A) record the MAD out of A and
/// into B as a UD SEND ONLY to DestQP 1 with DETH Q_Key 0x80010000 and SrcQP 1, its ICRC
/// good.
#[test]
fn mads_pass_the_capture_and_fault_middleware_and_are_captured() {
    let dir = std::env::temp_dir().join(format!("softverbs-gsi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (path_a, path_b) = (dir.join("a.pcap"), dir.join("b.pcap"));
    let a = Device::open(DeviceConfig {
        capture: Some(Capture::create(&path_a).unwrap()),
        faults: Some(parse_faults("drop=0,seed=3").unwrap()),
        ..DeviceConfig::in_process()
    })
    .unwrap();
    let b = Device::open(DeviceConfig {
        capture: Some(Capture::create(&path_b).unwrap()),
        ..DeviceConfig::in_process()
    })
    .unwrap();
    exchange(&a, &b);
    for (device, path) in [(&a, &path_a), (&b, &path_b)] {
        device.flush_capture().unwrap();
        let records = read_capture(path).unwrap();
        assert_eq!(records.len(), 2, "one MAD each way: {records:?}");
        for record in &records {
            assert!(record.icrc_ok(), "{record}");
            let (repr, payload_len) = record.packet.as_ref().expect("an IB packet");
            assert_eq!(repr.bth.opcode, Opcode(0x64), "{record}");
            assert_eq!(repr.bth.dest_qp.value(), 1);
            assert_eq!(repr.bth.pkey, 0xFFFF);
            let deth = repr.deth.expect("a DETH");
            assert_eq!((deth.qkey, deth.src_qp.value()), (GSI_QKEY, 1));
            assert_eq!(*payload_len, MAD_LEN);
            assert_eq!(record.udp.dst_port, 4791);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `gsi_fd` polls readable exactly while MADs wait: not before any arrives, still after
/// the first of three is taken, no longer once the last is, and again when another
/// arrives.
#[test]
fn the_gsi_fd_is_readable_exactly_while_mads_wait() {
    let a = Device::open(DeviceConfig::in_process()).unwrap();
    let b = Device::open(DeviceConfig::in_process()).unwrap();
    assert!(!readable(b.gsi_fd()));
    for tag in 0..3 {
        a.gsi_send(gid(&b), &mad(tag)).unwrap();
    }
    wait_readable(&b);
    let deadline = Instant::now() + Duration::from_secs(5);
    while b.gsi_pending() < 3 {
        assert!(Instant::now() < deadline, "{}", b.counters());
        std::thread::sleep(Duration::from_millis(1));
    }
    for tag in 0..3 {
        assert!(readable(b.gsi_fd()), "MAD {tag} still waits");
        assert_eq!(b.gsi_recv().map(|m| m.bytes), Some(mad(tag)), "in order");
    }
    assert!(!readable(b.gsi_fd()), "none waits");
    assert!(b.gsi_recv().is_none());
    assert!(!readable(b.gsi_fd()));
    a.gsi_send(gid(&b), &mad(9)).unwrap();
    wait_readable(&b);
    assert_eq!(b.gsi_recv().map(|m| m.bytes), Some(mad(9)));
    assert!(!readable(b.gsi_fd()));
}

/// A flood of MADs nobody takes fills the inbox to its bound and no further: the rest
/// are dropped as `GsiInboxFull`; taking them makes room again.
#[test]
fn a_flood_of_mads_is_bounded_by_the_inbox_and_counted() {
    let a = Device::open(DeviceConfig::in_process()).unwrap();
    let b = Device::open(DeviceConfig::in_process()).unwrap();
    let flood = GSI_INBOX_LEN + 500;
    for i in 0..flood {
        a.gsi_send(gid(&b), &mad(i as u8)).unwrap();
    }
    assert_eq!(b.gsi_pending(), GSI_INBOX_LEN);
    let c = b.counters();
    assert_eq!(c.drops(DropReason::GsiInboxFull), 500, "{c}");
    assert_eq!(c.gsi_received, GSI_INBOX_LEN as u64);
    let mut taken = 0;
    while b.gsi_recv().is_some() {
        taken += 1;
        assert!(taken <= GSI_INBOX_LEN, "more than the bound waited");
    }
    assert_eq!(taken, GSI_INBOX_LEN);
    assert!(!readable(b.gsi_fd()));
    a.gsi_send(gid(&b), &mad(1)).unwrap();
    assert_eq!(b.gsi_pending(), 1);
}

/// IBTA 13.5 over the wire: an injector on another 127.0.0.x sends, with correct ICRCs,
/// to DestQP 1 a UD SEND with the wrong Q_Key, an RC SEND, and a UD SEND longer than a
/// MAD; the device drops and counts each (`QkeyMismatch`, `WrongTransport`,
/// `Malformed`), and the well-formed MAD sent after them from the injector's QP 0x42 is
/// the only one that waits.
#[test]
fn packets_to_qp1_that_are_not_mads_are_dropped_and_counted_over_udp() {
    let b = udp_device();
    let injector = UdpTransport::bind(UdpConfig {
        port: 0,
        ..UdpConfig::default()
    })
    .expect("bind the injector");
    let to = Endpoint::rocev2(b.address());
    let send = |opcode: Opcode, qkey: Option<u32>, payload: &[u8]| {
        let repr = PacketRepr {
            bth: BthRepr {
                opcode,
                pkey: 0xFFFF,
                dest_qp: Qpn::new(1),
                psn: Psn::new(5),
                ..BthRepr::default()
            },
            deth: qkey.map(|qkey| DethRepr {
                qkey,
                src_qp: Qpn::new(0x42),
            }),
            ..PacketRepr::default()
        };
        let mut bytes = vec![0u8; repr.buffer_len(payload.len())];
        let len = repr.emit(payload, &mut bytes).expect("emit");
        bytes.truncate(len);
        injector.send(&to, 0xC001, &mut bytes).expect("send");
    };
    send(Opcode(0x64), Some(0x1234), &mad(1));
    send(Opcode::RC_SEND_ONLY, None, &mad(2));
    send(Opcode(0x64), Some(GSI_QKEY), &[0u8; MAD_LEN + 8]);
    send(Opcode(0x64), Some(GSI_QKEY), &mad(4));
    wait_readable(&b);
    let deadline = Instant::now() + Duration::from_secs(5);
    while b.counters().packets_received < 4 {
        assert!(Instant::now() < deadline, "{}", b.counters());
        std::thread::sleep(Duration::from_millis(1));
    }
    let c = b.counters();
    assert_eq!(c.drops(DropReason::QkeyMismatch), 1, "{c}");
    assert_eq!(c.drops(DropReason::WrongTransport), 1, "{c}");
    assert_eq!(c.drops(DropReason::Malformed), 1, "{c}");
    let got = b.gsi_recv().expect("the MAD");
    assert_eq!((got.bytes, got.src_qpn), (mad(4), 0x42));
    assert_eq!(got.sgid, {
        let std::net::IpAddr::V4(v4) = injector.local().addr() else {
            panic!("an IPv4 injector")
        };
        v4.to_ipv6_mapped().octets()
    });
    assert!(b.gsi_recv().is_none());
}

/// Devices of several processes may share an address, each owning the QPNs of its slot
/// (`slot << 16 ..`); the device holding the address's socket hands packets for a slot that
/// nobody holds to its own engine, which drops and counts them as for an unknown QP, as it
/// does a packet for a QPN of its own slot that no QP has.
#[test]
fn packets_for_a_slot_nobody_holds_are_dropped_as_for_an_unknown_qp() {
    let b = Device::open(DeviceConfig::udp(UdpConfig {
        address: Some("127.0.0.176".parse().unwrap()),
        ..UdpConfig::default()
    }))
    .expect("open a device on 127.0.0.176");
    let injector = UdpTransport::bind(UdpConfig {
        port: 0,
        ..UdpConfig::default()
    })
    .expect("bind the injector");
    let to = Endpoint::rocev2(b.address());
    for dest_qp in [0x05_0011, 0xFE_0002, 0x00_0033] {
        let repr = PacketRepr {
            bth: BthRepr {
                opcode: Opcode::RC_SEND_ONLY,
                pkey: 0xFFFF,
                dest_qp: Qpn::new(dest_qp),
                psn: Psn::new(5),
                ..BthRepr::default()
            },
            ..PacketRepr::default()
        };
        let mut bytes = vec![0u8; repr.buffer_len(8)];
        let len = repr.emit(&[7u8; 8], &mut bytes).expect("emit");
        bytes.truncate(len);
        injector.send(&to, 0xC001, &mut bytes).expect("send");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while b.counters().drops(DropReason::UnknownQp) < 3 {
        assert!(Instant::now() < deadline, "{}", b.counters());
        std::thread::sleep(Duration::from_millis(1));
    }
}
