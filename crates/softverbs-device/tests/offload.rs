//! UDP segmentation offload (udp(7) `UDP_SEGMENT`, `UDP_GRO`; Linux
//! `Documentation/networking/segmentation-offloads.rst`): runs of equal packets leave as
//! one GSO message, coalesced datagrams are cut back into packets on receive, each one a
//! standard RoCEv2 packet with its own ICRC (IBTA Annex A17), and the transport does
//! without either where the kernel refuses it.

mod common;

use std::fs::File;
use std::io::{self, Read};
use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use common::rc::{connect_mtu, side, wait_for, Side};
use common::{bth, emit, send_only, PATIENCE};
use softverbs_cq::WcStatus;
use softverbs_device::transport::OutgoingPacket;
use softverbs_device::udp::{Ipv4IcrcCheck, SourcePorts};
use softverbs_device::{DeviceConfig, Endpoint, Transport, UdpConfig, UdpTransport};
use softverbs_proto::{Mtu, SendOp, SendWr, Sge};
use softverbs_wire::icrc::{self, IpHeaderInfo, UdpHeaderInfo};
use softverbs_wire::{Opcode, PacketRepr, RethRepr};

/// A UDP device on 127.0.0.`last`, port 4791, with segmentation offload on or off.
fn udp(last: u8, offload: bool, ipv4_icrc: Ipv4IcrcCheck) -> DeviceConfig {
    DeviceConfig::udp(UdpConfig {
        address: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))),
        offload,
        ipv4_icrc,
        ..UdpConfig::default()
    })
}

/// A transport on `addr` with an ephemeral port.
fn bind(addr: &str, ipv4_icrc: Ipv4IcrcCheck) -> UdpTransport {
    UdpTransport::bind(UdpConfig {
        address: Some(addr.parse().unwrap()),
        port: 0,
        ipv4_icrc,
        ..UdpConfig::default()
    })
    .unwrap_or_else(|error| panic!("cannot bind a UDP transport on {addr}: {error}"))
}

/// `rounds` times, four RDMA WRITEs of the whole 64 KiB buffer posted at once, each round
/// waited for; then the responder's buffer must be the requester's, byte for byte.
fn write_64_kib(a: &mut Side, b: &Side, rounds: u64) {
    for round in 0..rounds {
        // A new pattern each round, so every round's data is checked.
        for (i, byte) in a.buf.iter_mut().enumerate() {
            *byte = (i as u64 * 7 + round) as u8;
        }
        for i in 0..4 {
            let wr = SendWr::new(
                round * 4 + i,
                SendOp::RdmaWrite {
                    remote_addr: b.buf.as_ptr() as u64,
                    rkey: b.rkey,
                },
                vec![Sge {
                    addr: a.buf.as_ptr() as u64,
                    length: a.buf.len() as u32,
                    lkey: a.lkey,
                }],
            );
            a.device.post_send(a.qpn, wr).unwrap();
        }
        let done = wait_for(a, 4);
        assert!(done.iter().all(|wc| wc.status() == WcStatus::Success));
        assert!(
            b.buf == a.buf,
            "round {round}: the data did not land intact"
        );
    }
}

/// Counters of a WRITE stream from a device at 127.0.0.`a` to one at 127.0.0.`b` with
/// offload on or off at each end, at path MTU 4096 (64 KiB = FIRST, 14 MIDDLE, LAST).
fn write_stream(
    a: (u8, bool),
    b: (u8, bool, Ipv4IcrcCheck),
) -> (
    softverbs_device::TransportCounters,
    softverbs_device::TransportCounters,
) {
    let mut a = side(udp(a.0, a.1, Ipv4IcrcCheck::AnyId));
    let b = side(udp(b.0, b.1, b.2));
    // Over the sockets, not handed over in process.
    a.device.set_in_process_shortcut(false);
    b.device.set_in_process_shortcut(false);
    connect_mtu(&a, &b, Mtu::Mtu4096);
    write_64_kib(&mut a, &b, 8);
    let sender = a.device.transport_counters().expect("a UDP device");
    let receiver = b.device.transport_counters().expect("a UDP device");
    (sender, receiver)
}

// udp(7) UDP_SEGMENT / UDP_GRO: a 64 KiB RDMA WRITE at MTU 4096 is a FIRST (with a RETH,
// IBTA 9.7.1) and 15 packets of one length: the 15 leave as one GSO message, the FIRST as
// a message of its own in the same sendmmsg(2), and on loopback the receiver gets the
// message whole (UDP_GRO) and cuts it back into packets. The data lands byte for byte.
#[test]
fn rdma_writes_of_64_kib_leave_as_gso_messages_and_arrive_coalesced() {
    let (sender, receiver) = write_stream((83, true), (84, true, Ipv4IcrcCheck::AnyId));
    let context = format!("sender: {sender}\nreceiver: {receiver}");
    // 32 WRITEs of 16 packets.
    assert!(sender.sent_packets >= 32 * 16, "{context}");
    // Each WRITE's MIDDLE … LAST is one message (one more each for a retransmission).
    assert!(sender.gso_sends >= 32, "{context}");
    assert!(sender.gso_sends * 15 <= sender.sent_packets, "{context}");
    // A post of four WRITEs (64 packets) leaves in one call, 8 messages (fewer packets a
    // call when the send window splits a post); one packet per call would be a ratio of 1.
    assert!(
        sender.sent_packets >= 4 * sender.send_calls,
        "fewer than 4 packets per send call\n{context}"
    );
    assert!(receiver.gro_segments >= 32 * 15, "{context}");
    assert_eq!(
        receiver.dropped_bad_icrc + receiver.dropped_malformed + receiver.dropped_truncated,
        0,
        "{context}"
    );
    // Every packet of the coalesced datagrams was handled where the datagram lay, not
    // copied into a receive buffer first.
    assert_eq!(
        receiver.gro_in_place_packets, receiver.received_packets,
        "{context}"
    );
    // The receiver took several packets per receive call.
    assert!(
        receiver.received_packets >= 4 * receiver.recv_calls,
        "{context}"
    );
}

// SOFTVERBS_UDP_OFFLOAD=off (UdpConfig::offload = false): one packet per datagram both
// ways, and the same WRITEs still land intact.
#[test]
fn with_offload_off_packets_go_one_per_datagram_and_the_writes_still_land() {
    let (sender, receiver) = write_stream((85, false), (86, false, Ipv4IcrcCheck::AnyId));
    let context = format!("sender: {sender}\nreceiver: {receiver}");
    assert!(sender.sent_packets >= 32 * 16, "{context}");
    assert_eq!(sender.gso_sends + receiver.gro_segments, 0, "{context}");
    assert_eq!(receiver.dropped_bad_icrc, 0, "{context}");
}

// A GSO sender and a receiver without GRO: the receiving kernel cuts the message and
// numbers the pieces' IPv4 IDs 0, 1, 2, … (inet_gso_segment), which is what the sender
// computed each ICRC for; even the strict check (Ipv4IcrcCheck::IdZero: IDs a softverbs
// sender writes) accepts every packet.
#[test]
fn a_gso_sender_and_a_receiver_without_gro_agree_on_every_icrc() {
    let (sender, receiver) = write_stream((87, true), (88, false, Ipv4IcrcCheck::IdZero));
    let context = format!("sender: {sender}\nreceiver: {receiver}");
    assert!(sender.gso_sends >= 32, "{context}");
    assert_eq!(receiver.gro_segments, 0, "{context}");
    assert_eq!(receiver.dropped_bad_icrc, 0, "{context}");
    assert!(receiver.received_packets >= 32 * 16, "{context}");
}

/// `asm-generic/socket.h` SO_NO_CHECK: no UDP checksums on send, which udp(7) GSO refuses
/// (`EINVAL`: the segments' checksums are computed by the offload).
const SO_NO_CHECK: libc::c_int = 11;

/// Sets an `int` socket option on `fd`.
fn set_int_option(fd: impl AsFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) {
    // SAFETY: the fd is open for the call (borrowed), and the value pointer / length
    // describe a live `c_int` on this stack frame.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_fd().as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "setsockopt: {}", io::Error::last_os_error());
}

/// Packets `psns` of 1,000 bytes of payload each, RC SEND ONLY.
fn equal_packets(psns: std::ops::Range<u32>) -> Vec<Vec<u8>> {
    psns.map(|psn| send_only(psn, &[psn as u8; 1000])).collect()
}

/// The PSN of a received packet.
fn psn_of(packet: &[u8]) -> u32 {
    PacketRepr::parse(packet).unwrap().0.bth.psn.value()
}

// udp(7): a kernel or path without UDP segmentation offload refuses the GSO message
// (here: EINVAL, for a socket that sends without UDP checksums). The transport turns GSO
// off, sends the packets again one per datagram with ICRCs for ID 0, and does not try GSO
// again; the receiver gets every packet.
#[test]
fn a_refused_gso_message_goes_again_one_packet_per_datagram_and_gso_stays_off() {
    let sender = UdpTransport::bind(UdpConfig {
        address: Some("127.0.0.89".parse().unwrap()),
        port: 0,
        source_ports: SourcePorts::Bound,
        ..UdpConfig::default()
    })
    .unwrap();
    let receiver = bind("127.0.0.90", Ipv4IcrcCheck::IdZero);
    set_int_option(
        sender.readiness_fd().expect("a socket"),
        libc::SOL_SOCKET,
        SO_NO_CHECK,
        1,
    );
    let to = receiver.local();
    let mut psn = 0;
    let mut storage = vec![0u8; 16 * 2048];
    let mut got = Vec::new();
    for round in 0..2 {
        let mut bytes = equal_packets(psn..psn + 6);
        psn += 6;
        let mut batch: Vec<OutgoingPacket<'_>> = bytes
            .iter_mut()
            .map(|bytes| OutgoingPacket::new(to, 0, bytes))
            .collect();
        assert_eq!(sender.send_batch(&mut batch), 6, "round {round}");
        for packet in &batch {
            let sent = packet.sent.expect("sent");
            assert!(matches!(sent.ip, IpHeaderInfo::V4 { id: 0, .. }));
            assert_eq!(icrc::verify(&sent.ip, &sent.udp, packet.bytes), Ok(()));
        }
        while got.len() < psn as usize {
            let mut bufs: Vec<&mut [u8]> = storage.chunks_mut(2048).collect();
            let mut received = Vec::new();
            let n = receiver
                .recv_batch(&mut bufs, &mut received, Some(PATIENCE))
                .unwrap();
            assert!(n > 0, "only {} packets arrived", got.len());
            for (packet, buf) in received.iter().zip(&bufs) {
                got.push(psn_of(&buf[..packet.len]));
            }
        }
    }
    assert_eq!(got, (0..12).collect::<Vec<_>>());
    let c = sender.counters();
    // Round 1: the refused call and the call that sent the six; round 2: one call.
    assert_eq!(
        (c.sent_packets, c.gso_sends, c.send_errors, c.send_calls),
        (12, 0, 0, 3),
        "{c}"
    );
    let r = receiver.counters();
    assert_eq!((r.received_packets, r.dropped_bad_icrc), (12, 0), "{r}");
}

/// `udp_len`-byte-payload packets from `from` to `to` as a plain socket sends them, each
/// with the ICRC for IPv4 ID `k` where `k` is its place in `packets` (what a GSO sender's
/// segments carry).
fn fill_for_ids(from: Endpoint, to: Endpoint, packets: &mut [Vec<u8>]) {
    let (IpAddr::V4(src), IpAddr::V4(dst)) = (from.addr(), to.addr()) else {
        panic!("IPv4 only")
    };
    for (k, packet) in packets.iter_mut().enumerate() {
        let mut udp = UdpHeaderInfo::rocev2(from.port(), packet.len()).unwrap();
        udp.dst_port = to.port();
        let IpHeaderInfo::V4 {
            tos,
            ttl,
            flags_frag,
            total_len,
            ..
        } = IpHeaderInfo::linux_ipv4(src, dst, 0, 64, udp.length).unwrap()
        else {
            unreachable!()
        };
        let ip = IpHeaderInfo::V4 {
            src,
            dst,
            tos,
            ttl,
            id: k as u16,
            flags_frag,
            total_len,
        };
        icrc::fill(&ip, &udp, packet).unwrap();
    }
}

// udp(7) UDP_GRO: a coalesced datagram is several packets; each is checked on its own
// (IBTA Annex A17 ICRC; reference §1.6 lengths), so a corrupted segment in the middle and
// a runt at the end are dropped and counted, the good ones around them delivered in order,
// with the IPv4 ID each was sent with (its index). Segments the caller has no buffer for
// wait for the next call, and the transport does not wait on its socket meanwhile.
#[test]
fn a_coalesced_datagram_with_a_bad_segment_in_the_middle_delivers_the_others() {
    for (address, check) in [
        ("127.0.0.91", Ipv4IcrcCheck::AnyId),
        ("127.0.0.92", Ipv4IcrcCheck::IdZero),
    ] {
        let target = bind(address, check);
        let plain = UdpSocket::bind("127.0.0.93:0").unwrap();
        let from = Endpoint::from(plain.local_addr().unwrap());
        let to = target.local();
        let mut packets = equal_packets(0..5);
        fill_for_ids(from, to, &mut packets);
        packets[2][20] ^= 0x01; // a payload bit of the middle segment
        let size = packets[0].len();
        let mut message: Vec<u8> = packets.concat();
        message.extend_from_slice(&[1, 2, 3]); // a runt as the last, shorter segment
                                               // Every datagram of this socket is cut into segments of `size` bytes.
        set_int_option(
            &plain,
            libc::SOL_UDP,
            libc::UDP_SEGMENT,
            size as libc::c_int,
        );
        plain.send_to(&message, to.socket_addr()).unwrap();

        let mut storage = vec![0u8; 8 * 2048];
        let mut got = Vec::new();
        {
            // Room for two packets: the rest of the datagram waits.
            let mut bufs: Vec<&mut [u8]> = storage.chunks_mut(2048).take(2).collect();
            let mut received = Vec::new();
            let n = target
                .recv_batch(&mut bufs, &mut received, Some(PATIENCE))
                .unwrap();
            assert_eq!(n, 2);
            for (packet, buf) in received.iter().zip(&bufs) {
                got.push((psn_of(&buf[..packet.len]), packet.ip));
            }
        }
        let started = Instant::now();
        target.wait_readable(Duration::from_secs(2)).unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "waited on the socket while packets of a datagram waited"
        );
        let mut bufs: Vec<&mut [u8]> = storage.chunks_mut(2048).collect();
        let mut received = Vec::new();
        target
            .recv_batch(&mut bufs, &mut received, Some(PATIENCE))
            .unwrap();
        for (packet, buf) in received.iter().zip(&bufs) {
            assert!(packet.icrc_checked);
            assert_eq!(packet.from, from);
            assert_eq!(
                icrc::verify(&packet.ip, &packet.udp, &buf[..packet.len]),
                Ok(())
            );
            got.push((psn_of(&buf[..packet.len]), packet.ip));
        }
        let ids: Vec<(u32, u16)> = got
            .iter()
            .map(|(psn, ip)| match ip {
                IpHeaderInfo::V4 { id, .. } => (*psn, *id),
                IpHeaderInfo::V6 { .. } => unreachable!(),
            })
            .collect();
        assert_eq!(ids, [(0, 0), (1, 1), (3, 3), (4, 4)], "{check:?}");
        let c = target.counters();
        assert_eq!(
            (
                c.received_packets,
                c.dropped_bad_icrc,
                c.dropped_malformed,
                c.gro_segments
            ),
            (4, 1, 1, 6),
            "{check:?}: {c}"
        );
        assert_eq!(
            target
                .recv(&mut [0u8; 2048], Some(Duration::from_millis(50)))
                .unwrap(),
            None
        );
    }
}

/// A test that lacks the privileges it needs: fails as root or in CI (`CI=true`: there it
/// must run), and on a developer's machine without root says loudly that it is skipped.
fn skip_or_fail_without_privileges(what: &str, error: &io::Error) {
    let in_ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let root = rustix::process::geteuid().is_root();
    if root || in_ci {
        panic!("{what}: {error} (this test needs root: CAP_SYS_ADMIN and CAP_NET_ADMIN)");
    }
    eprintln!(
        "\n*** SKIPPED: {what}: {error}. This test needs root (a network namespace and a tun \
         device); run it as root, as CI does. ***\n"
    );
}

/// A tun device (`IFF_TUN | IFF_NO_PI`: each read is one IP packet the kernel sent
/// through it) named `name`, with `addr`/24, up. Linux `Documentation/networking/tuntap.rst`.
/// A tun device offers no segmentation offload until asked (`TUNSETOFFLOAD`), so the
/// kernel hands it GSO messages cut into packets, as it does for any such NIC.
fn tun(name: &str, addr: Ipv4Addr) -> io::Result<File> {
    let file = File::options()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    // SAFETY: `ifreq` is plain old data, for which all zeroes is valid.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (to, from) in request.ifr_name.iter_mut().zip(name.bytes()) {
        *to = from as libc::c_char;
    }
    request.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    let ioctl = |fd: libc::c_int, op: libc::c_ulong, request: &mut libc::ifreq| {
        // SAFETY: the fd is open for the call, and `request` is a live `ifreq` the ioctl
        // reads and writes within.
        let rc = unsafe { libc::ioctl(fd, op as _, request as *mut libc::ifreq) };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    ioctl(file.as_raw_fd(), libc::TUNSETIFF as _, &mut request)?;
    let control = UdpSocket::bind("0.0.0.0:0")?;
    let sockaddr = |addr: Ipv4Addr| {
        // SAFETY: `sockaddr` is plain old data, for which all zeroes is valid.
        let mut storage: libc::sockaddr = unsafe { std::mem::zeroed() };
        let inet = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(addr.octets()),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: a `sockaddr_in` (16 bytes) fits the 16 bytes of a `sockaddr`; both are
        // plain old data.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&inet as *const libc::sockaddr_in).cast::<u8>(),
                (&mut storage as *mut libc::sockaddr).cast::<u8>(),
                std::mem::size_of::<libc::sockaddr_in>(),
            )
        };
        storage
    };
    request.ifr_ifru.ifru_addr = sockaddr(addr);
    ioctl(control.as_raw_fd(), libc::SIOCSIFADDR, &mut request)?;
    request.ifr_ifru.ifru_netmask = sockaddr(Ipv4Addr::new(255, 255, 255, 0));
    ioctl(control.as_raw_fd(), libc::SIOCSIFNETMASK, &mut request)?;
    ioctl(control.as_raw_fd(), libc::SIOCGIFFLAGS, &mut request)?;
    // SAFETY: SIOCGIFFLAGS wrote the flags member.
    let flags = unsafe { request.ifr_ifru.ifru_flags };
    request.ifr_ifru.ifru_flags = flags | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    ioctl(control.as_raw_fd(), libc::SIOCSIFFLAGS, &mut request)?;
    Ok(file)
}

/// Reads the IPv4 UDP packets to `port` that the kernel sends through `tun` until
/// `count` arrived or [`PATIENCE`] passed.
fn read_ipv4_udp(tun: &mut File, port: u16, count: usize) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + PATIENCE;
    let mut packets = Vec::new();
    let mut buf = vec![0u8; 70_000];
    while packets.len() < count && Instant::now() < deadline {
        let mut poll = libc::pollfd {
            fd: tun.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live `pollfd` for the call.
        if unsafe { libc::poll(&mut poll, 1, 100) } <= 0 {
            continue;
        }
        let n = tun.read(&mut buf).unwrap();
        let packet = &buf[..n];
        // Only IPv4 UDP to `port` (a fresh interface may send IPv6 neighbour discovery).
        let Ok((IpHeaderInfo::V4 { .. }, udp, _)) = icrc::split_ip_packet(packet) else {
            continue;
        };
        if udp.dst_port == port {
            packets.push(packet.to_vec());
        }
    }
    packets
}

// Linux Documentation/networking/segmentation-offloads.rst: a GSO message reaches a
// network device without UDP segmentation offload (here a tun device, in a network
// namespace of the test's own) cut into ordinary datagrams, with IPv4 IDs numbered from
// the message's (0): segment k carries ID k. Each is a standard RoCEv2 packet (reference
// §1.1: DF set) whose ICRC verifies over the IP header it really has, as any RoCEv2
// receiver (rxe, a NIC) checks it, and whose header is the one the sender reported.
#[test]
fn gso_segments_on_the_wire_are_rocev2_packets_with_ids_0_1_2() {
    let result = std::thread::scope(|scope| {
        scope
            .spawn(|| -> io::Result<()> {
                // unshare(2) CLONE_NEWNET: this thread's sockets and devices live in a
                // namespace of their own, which vanishes with them.
                // SAFETY: unshare changes only the calling thread's namespaces.
                if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                let mut wire = tun("svgso0", Ipv4Addr::new(10, 77, 0, 1))?;
                segments_on_the_wire(&mut wire);
                Ok(())
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    });
    if let Err(error) = result {
        skip_or_fail_without_privileges("a network namespace with a tun device", &error);
    }
}

fn segments_on_the_wire(wire: &mut File) {
    let sender = UdpTransport::bind(UdpConfig {
        address: Some("10.77.0.1".parse().unwrap()),
        port: 0,
        ..UdpConfig::default()
    })
    .unwrap();
    let to = Endpoint::new("10.77.0.2".parse().unwrap(), 4791);
    // An RDMA WRITE of 6,444 bytes at MTU 1024: FIRST (RETH), 5 MIDDLE, a shorter LAST.
    let reth = RethRepr {
        va: 0x1000,
        rkey: 0x1234,
        dma_len: 6 * 1024 + 300,
    };
    let mut bytes = vec![emit(
        &PacketRepr {
            bth: bth(Opcode::RC_RDMA_WRITE_FIRST, 0),
            reth: Some(reth),
            ..PacketRepr::default()
        },
        &[0xF1; 1024],
    )];
    for psn in 1..=5 {
        bytes.push(emit(
            &PacketRepr {
                bth: bth(Opcode::RC_RDMA_WRITE_MIDDLE, psn),
                ..PacketRepr::default()
            },
            &[psn as u8; 1024],
        ));
    }
    bytes.push(emit(
        &PacketRepr {
            bth: bth(Opcode::RC_RDMA_WRITE_LAST, 6),
            ..PacketRepr::default()
        },
        &[0x1A; 300],
    ));
    let mut batch: Vec<OutgoingPacket<'_>> = bytes
        .iter_mut()
        .map(|bytes| OutgoingPacket::new(to, 0xC123, bytes))
        .collect();
    assert_eq!(sender.send_batch(&mut batch), 7);
    let c = sender.counters();
    assert_eq!(
        (c.gso_sends, c.sent_packets, c.send_calls),
        (1, 7, 1),
        "{c}"
    );

    let on_the_wire = read_ipv4_udp(wire, to.port(), 7);
    assert_eq!(on_the_wire.len(), 7, "packets seen on the tun device");
    // The FIRST alone (ID 0), then the MIDDLE … LAST message cut into 6 (IDs 0 … 5).
    let expected_ids = [0u16, 0, 1, 2, 3, 4, 5];
    for ((packet, sent), id) in on_the_wire.iter().zip(&batch).zip(expected_ids) {
        let (ip, udp, ib) = icrc::split_ip_packet(packet).unwrap();
        let IpHeaderInfo::V4 {
            id: wire_id,
            flags_frag,
            ..
        } = ip
        else {
            unreachable!()
        };
        let psn = psn_of(ib);
        assert_eq!(wire_id, id, "IPv4 ID of PSN {psn}");
        assert_eq!(flags_frag, 0x4000, "DF set, not fragmented (PSN {psn})");
        assert_eq!(ib, &sent.bytes[..], "the packet's bytes (PSN {psn})");
        assert_eq!(
            icrc::verify_ip_packet(packet),
            Ok(()),
            "ICRC over the real header (PSN {psn})"
        );
        let headers = sent.sent.expect("sent");
        assert_eq!(ip, headers.ip, "the header the sender reported (PSN {psn})");
        assert_eq!(udp.src_port, headers.udp.src_port);
    }
    let psns: Vec<u32> = on_the_wire
        .iter()
        .map(|packet| psn_of(icrc::split_ip_packet(packet).unwrap().2))
        .collect();
    assert_eq!(psns, (0..7).collect::<Vec<_>>(), "in order");
}

// IPv6 has no Identification (reference §1.7): a GSO message's segments carry the headers
// their ICRCs were computed over whatever their number, and a receiver with GRO gets the
// message whole on loopback and checks each packet exactly.
#[test]
fn gso_and_gro_over_ipv6_deliver_every_packet_with_its_icrc_verified() {
    let sender = bind("::1", Ipv4IcrcCheck::AnyId);
    let receiver = bind("::1", Ipv4IcrcCheck::AnyId);
    let to = receiver.local();
    let mut bytes = equal_packets(0..10);
    bytes.push(send_only(10, &[10; 200])); // a shorter last segment
    let mut batch: Vec<OutgoingPacket<'_>> = bytes
        .iter_mut()
        .map(|bytes| OutgoingPacket::new(to, 0, bytes))
        .collect();
    assert_eq!(sender.send_batch(&mut batch), 11);
    let c = sender.counters();
    assert_eq!((c.gso_sends, c.sent_packets), (1, 11), "{c}");
    let mut storage = vec![0u8; 16 * 2048];
    let mut bufs: Vec<&mut [u8]> = storage.chunks_mut(2048).collect();
    let mut received = Vec::new();
    let n = receiver
        .recv_batch(&mut bufs, &mut received, Some(PATIENCE))
        .unwrap();
    assert_eq!(n, 11);
    for ((packet, buf), sent) in received.iter().zip(&bufs).zip(&batch) {
        assert!(packet.icrc_checked);
        assert_eq!(&buf[..packet.len], &sent.bytes[..]);
        assert_eq!(packet.ip, sent.sent.expect("sent").ip);
    }
    let r = receiver.counters();
    assert_eq!((r.received_packets, r.gro_segments), (11, 11), "{r}");
}
