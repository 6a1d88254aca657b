//! The UDP RoCEv2 transport on the loopback interface: 127.0.0.0/8 and ::1 only.

mod common;

use std::io::Read;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use common::{recv_one, sample_packets, send, send_only, PATIENCE};
use socket2::{Domain, Protocol, Socket, Type};
use softverbs_device::transport::udp_src_port_for_qps;
use softverbs_device::udp::{Ipv4IcrcCheck, SourcePorts};
use softverbs_device::{Endpoint, Transport, UdpConfig, UdpTransport};
use softverbs_wire::icrc::{self, IpHeaderInfo, UdpHeaderInfo};
use softverbs_wire::PacketRepr;

/// A transport on `addr` with an ephemeral port (so tests never fight over 4791).
fn bind(addr: &str) -> UdpTransport {
    let config = UdpConfig {
        address: Some(addr.parse().unwrap()),
        port: 0,
        ..UdpConfig::default()
    };
    UdpTransport::bind(config).unwrap_or_else(|error| {
        panic!("cannot bind a UDP transport on {addr}: {error} (the test needs this address)")
    })
}

fn trailer(packet: &[u8]) -> u32 {
    u32::from_le_bytes(packet[packet.len() - 4..].try_into().unwrap())
}

/// Both ways between `a` and `b`: every sample opcode arrives byte for byte, with its
/// ICRC verified, from the right endpoint.
fn exchange_all_opcodes(a: &UdpTransport, b: &UdpTransport) {
    let mut buf = vec![0u8; 4096];
    for (from, to) in [(a, b), (b, a)] {
        for (repr, payload, _) in sample_packets() {
            let sent = send(from, &to.local(), common::emit(&repr, &payload));
            let received = recv_one(to, &mut buf, "exchange");
            assert_eq!(&buf[..received.len], &sent[..]);
            assert!(received.icrc_checked);
            assert_eq!(received.from.addr(), from.local().addr());
            assert_eq!(received.to, to.local());
            assert_eq!(icrc::verify(&received.ip, &received.udp, &sent), Ok(()));
            let (parsed, data) = PacketRepr::parse(&buf[..received.len]).unwrap();
            assert_eq!(parsed.bth.psn, repr.bth.psn);
            assert_eq!(data, &payload[..]);
        }
    }
    let n = sample_packets().len() as u64;
    for t in [a, b] {
        let c = t.counters();
        assert_eq!((c.sent_packets, c.received_packets), (n, n), "{c}");
        assert_eq!(
            c.dropped_bad_icrc + c.dropped_malformed + c.icrc_unchecked,
            0,
            "{c}"
        );
    }
}

// Reference §1.7 (ICRC over the IP/UDP headers), §5.2 (unconnected IP_PMTUDISC_DO socket,
// ID 0) and §5.7 (same-host peers on different 127.0.0.x): packets of every kind cross,
// and the receiver's ICRC check over the header it reconstructs passes.
#[test]
fn two_ipv4_endpoints_on_127_0_0_x_exchange_packets_with_verified_icrc() {
    let a = bind("127.0.0.2");
    let b = bind("127.0.0.3");
    assert_ne!(a.local().addr(), b.local().addr());
    exchange_all_opcodes(&a, &b);
}

// Reference §5.2 / §5.3 on IPv6: no ID field, so the ICRC is fully predictable; the
// receiving socket has UDP_NO_CHECK6_RX. Must not skip: if ::1 is missing, this fails.
#[test]
fn two_ipv6_endpoints_on_localhost_exchange_packets_with_verified_icrc() {
    let a = bind("::1");
    let b = bind("::1");
    assert!(!a.local().is_ipv4());
    assert_eq!(a.local().gid().to_string(), "::1");
    exchange_all_opcodes(&a, &b);
}

/// Sends raw datagrams from a plain socket at `peer` to `target`, then checks what the
/// transport kept: a well-formed packet (ICRC over the plain socket's address and port)
/// is accepted, a corrupted one, a runt, a misaligned one and an oversized one are dropped
/// and counted, and `recv` goes on to the next good packet.
fn plain_socket_datagrams(peer: &str, target: &UdpTransport) {
    let plain = UdpSocket::bind(SocketAddr::new(peer.parse().unwrap(), 0)).unwrap();
    let from = Endpoint::from(plain.local_addr().unwrap());
    let to = target.local();
    let good = |psn: u32| {
        let mut packet = send_only(psn, b"from a plain socket");
        let mut udp = UdpHeaderInfo::rocev2(from.port(), packet.len()).unwrap();
        udp.dst_port = to.port();
        let ip = match (from.addr(), to.addr()) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => {
                IpHeaderInfo::linux_ipv4(src, dst, 0, 64, udp.length).unwrap()
            }
            (IpAddr::V6(src), IpAddr::V6(dst)) => {
                IpHeaderInfo::ipv6(src, dst, 0, 0, 64, udp.length)
            }
            _ => unreachable!(),
        };
        icrc::fill(&ip, &udp, &mut packet).unwrap();
        packet
    };
    let mut corrupted = good(2);
    corrupted[20] ^= 0x01; // a payload bit
    let mut misaligned = good(3);
    misaligned.push(0);
    let oversized = vec![0u8; 2048];
    for datagram in [
        good(1),
        corrupted,
        vec![1, 2, 3],
        misaligned,
        oversized,
        good(4),
    ] {
        plain.send_to(&datagram, to.socket_addr()).unwrap();
    }
    let mut buf = vec![0u8; 1024];
    let first = recv_one(target, &mut buf, "first good packet");
    assert_eq!(first.from, from);
    assert_eq!(
        PacketRepr::parse(&buf[..first.len])
            .unwrap()
            .0
            .bth
            .psn
            .value(),
        1
    );
    let second = recv_one(target, &mut buf, "second good packet");
    assert_eq!(
        PacketRepr::parse(&buf[..second.len])
            .unwrap()
            .0
            .bth
            .psn
            .value(),
        4
    );
    assert_eq!(
        target
            .recv(&mut buf, Some(Duration::from_millis(50)))
            .unwrap(),
        None
    );
    let c = target.counters();
    assert_eq!(c.received_packets, 2, "{c}");
    assert_eq!(c.dropped_bad_icrc, 1, "{c}");
    assert_eq!(c.dropped_malformed, 2, "{c}");
    assert_eq!(c.dropped_truncated, 1, "{c}");
}

// Reference §1.7 step 5: a wrong ICRC is dropped (looks like loss), and so is anything
// that cannot be an IB transport packet; nothing panics and recv keeps going.
#[test]
fn corrupted_and_malformed_ipv4_datagrams_are_dropped_and_counted() {
    let target = bind("127.0.0.4");
    plain_socket_datagrams("127.0.0.5", &target);
}

#[test]
fn corrupted_and_malformed_ipv6_datagrams_are_dropped_and_counted() {
    let target = bind("::1");
    plain_socket_datagrams("::1", &target);
}

// Reference §5.3: with the IPv4 check skipped, packets whose ICRC a socket cannot verify
// (e.g. rxe's hashed IP ID) are accepted and counted as unchecked.
#[test]
fn skipped_ipv4_icrc_check_accepts_and_counts_unchecked_packets() {
    let config = UdpConfig {
        address: Some("127.0.0.6".parse().unwrap()),
        port: 0,
        ipv4_icrc: Ipv4IcrcCheck::Skip,
        ..UdpConfig::default()
    };
    let target = UdpTransport::bind(config).unwrap();
    let plain = UdpSocket::bind("127.0.0.7:0").unwrap();
    let mut packet = send_only(9, b"icrc computed with some other IP ID");
    packet.last_mut().unwrap().clone_from(&0x5A);
    plain
        .send_to(&packet, target.local().socket_addr())
        .unwrap();
    let mut buf = vec![0u8; 256];
    let received = recv_one(&target, &mut buf, "unchecked packet");
    assert!(!received.icrc_checked);
    let c = target.counters();
    assert_eq!((c.received_packets, c.icrc_unchecked), (1, 1), "{c}");
}

// Reference §5.2: the receiver can only verify IPv4 ICRCs because Linux sends ID 0 with
// DF from an unconnected IP_PMTUDISC_DO socket. This reads what the kernel really put on
// the wire through a raw socket and checks the ID, DF and the ICRC over the real header.
#[test]
fn kernel_really_sends_ipv4_id_zero_with_df() {
    let raw = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::UDP)).unwrap_or_else(|error| {
        panic!("this test needs a raw socket (CAP_NET_RAW, root in CI): {error}")
    });
    raw.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let a = bind("127.0.0.8");
    let b = bind("127.0.0.9");
    let mut sent = send_only(77, b"what did the kernel send?");
    let headers = a.send(&b.local(), 0xC000, &mut sent).unwrap();
    let deadline = Instant::now() + PATIENCE;
    let mut buf = [0u8; 2048];
    let mut checked = 0;
    for _ in 0..10_000 {
        if Instant::now() > deadline {
            break;
        }
        let Ok(n) = (&raw).read(&mut buf) else {
            continue;
        };
        let packet = &buf[..n];
        let Ok((ip, udp, ib)) = icrc::split_ip_packet(packet) else {
            continue;
        };
        if udp.src_port != headers.udp.src_port || udp.dst_port != b.local().port() {
            continue;
        }
        let IpHeaderInfo::V4 { id, flags_frag, .. } = ip else {
            unreachable!()
        };
        assert_eq!(ip, headers.ip, "the header the sender predicted");
        assert_eq!(id, 0, "IPv4 ID");
        assert_eq!(flags_frag, 0x4000, "DF set, not fragmented");
        assert_eq!(ib, &sent[..]);
        assert_eq!(icrc::verify_ip_packet(packet), Ok(()));
        assert_eq!(trailer(ib), trailer(&sent));
        checked += 1;
        break;
    }
    assert_eq!(checked, 1, "the datagram never showed up on the raw socket");
    recv_one(&b, &mut [0u8; 256], "the datagram itself");
}

// DESIGN "Several processes on one host": with nothing configured, each transport gets
// its own (127.0.0.x, 4791) pair.
#[test]
fn automatic_addresses_are_distinct_127_0_0_x_on_port_4791() {
    let a = UdpTransport::bind(UdpConfig::default()).expect("automatic address");
    let b = UdpTransport::bind(UdpConfig::default()).expect("second automatic address");
    for t in [&a, &b] {
        let IpAddr::V4(v4) = t.local().addr() else {
            panic!("automatic address must be IPv4")
        };
        assert_eq!(v4.octets()[..3], [127, 0, 0]);
        assert_eq!(t.local().port(), 4791);
    }
    assert_ne!(a.local(), b.local());
    // And they talk, on the real RoCEv2 port.
    let sent = send(&a, &b.local(), send_only(5, b"auto"));
    let mut buf = [0u8; 128];
    let received = recv_one(&b, &mut buf, "auto");
    assert_eq!(&buf[..received.len], &sent[..]);
    assert_eq!(received.udp.dst_port, 4791);
}

// Reference §4.4: the source port is the caller's per-flow hint (0xC000 | hash), through
// a per-flow socket, and the receiver sees and verifies exactly that port; with
// SourcePorts::Bound everything goes from the device port.
#[test]
fn udp_source_port_is_the_per_flow_hint() {
    let a = bind("127.0.0.10");
    let b = bind("127.0.0.11");
    let hint = udp_src_port_for_qps(361, 313);
    let mut packet = send_only(1, b"flow");
    let sent = a.send(&b.local(), hint, &mut packet).unwrap();
    assert_eq!(
        sent.udp.src_port, hint,
        "port {hint:#x} on 127.0.0.10 should be free"
    );
    let mut buf = [0u8; 128];
    let received = recv_one(&b, &mut buf, "flow");
    assert_eq!(received.from.port(), hint);
    assert!(received.icrc_checked);

    let config = UdpConfig {
        address: Some("127.0.0.12".parse().unwrap()),
        port: 0,
        source_ports: SourcePorts::Bound,
        ..UdpConfig::default()
    };
    let bound = UdpTransport::bind(config).unwrap();
    let sent = bound.send(&b.local(), hint, &mut packet).unwrap();
    assert_eq!(sent.udp.src_port, bound.local().port());
    let received = recv_one(&b, &mut buf, "bound");
    assert_eq!(received.from, bound.local());
}

// The Transport contract: recv returns None when the time is up, promptly.
#[test]
fn recv_times_out_with_none() {
    let a = bind("127.0.0.13");
    let started = Instant::now();
    let mut buf = [0u8; 64];
    assert_eq!(
        a.recv(&mut buf, Some(Duration::from_millis(30))).unwrap(),
        None
    );
    assert_eq!(a.recv(&mut buf, Some(Duration::ZERO)).unwrap(), None);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(30) && waited < Duration::from_secs(2));
}

// Reference §4.3: both GIDs of a path must be the same IP version.
#[test]
fn sending_across_ip_versions_is_refused() {
    let a = bind("127.0.0.14");
    let v6 = Endpoint::rocev2("::1".parse().unwrap());
    let error = a.send(&v6, 0xC000, &mut send_only(1, b"x")).unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
    let error = a.send(&a.local(), 0xC000, &mut [0u8; 8]).unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
    assert_eq!(a.counters().sent_packets, 0);
}

// Reference §5.3: TOS / ECN and TTL reach the receiver through IP_RECVTOS / IP_RECVTTL
// (IPv6: IPV6_RECVTCLASS / IPV6_RECVHOPLIMIT); they are masked out of the ICRC (§1.7), so
// a non-default value still verifies.
#[test]
fn receiver_sees_the_senders_traffic_class_and_hop_limit() {
    for (src, dst) in [("127.0.0.15", "127.0.0.16"), ("::1", "::1")] {
        let config = UdpConfig {
            address: Some(src.parse().unwrap()),
            port: 0,
            traffic_class: 0x6A, // DSCP 26 + ECT(0), as ConnectX sends (§1.9)
            hop_limit: 33,
            ..UdpConfig::default()
        };
        let a = UdpTransport::bind(config).unwrap();
        let b = bind(dst);
        let sent = send(&a, &b.local(), send_only(3, b"tos"));
        let mut buf = [0u8; 128];
        let received = recv_one(&b, &mut buf, "tos");
        assert_eq!(&buf[..received.len], &sent[..]);
        match received.ip {
            IpHeaderInfo::V4 { tos, ttl, .. } => assert_eq!((tos, ttl), (0x6A, 33)),
            IpHeaderInfo::V6 {
                traffic_class,
                hop_limit,
                ..
            } => assert_eq!((traffic_class, hop_limit), (0x6A, 33)),
        }
    }
}

// Reference §5.2: rxe sends IPv6 datagrams with UDP checksum 0, which Linux drops unless
// the receiving socket sets UDP_NO_CHECK6_RX. A zero-checksum datagram sent through a raw
// IPv6 socket (the kernel leaves the UDP header alone) must be received and verified.
#[test]
fn ipv6_datagram_with_zero_udp_checksum_is_accepted() {
    let raw = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::UDP)).unwrap_or_else(|error| {
        panic!("this test needs a raw socket (CAP_NET_RAW, root in CI): {error}")
    });
    let target = bind("::1");
    let source_port = 0xC001;
    let mut packet = send_only(11, b"rxe-style zero checksum");
    let mut udp = UdpHeaderInfo::rocev2(source_port, packet.len()).unwrap();
    udp.dst_port = target.local().port();
    let loopback = "::1".parse().unwrap();
    let ip = IpHeaderInfo::ipv6(loopback, loopback, 0, 0, 64, udp.length);
    icrc::fill(&ip, &udp, &mut packet).unwrap();
    let mut datagram = vec![0u8; 8];
    udp.emit(&mut datagram).unwrap(); // checksum 0
    assert_eq!(&datagram[6..8], &[0, 0]);
    datagram.extend_from_slice(&packet);
    let to: SocketAddr = "[::1]:0".parse().unwrap();
    raw.send_to(&datagram, &to.into()).unwrap();
    let mut buf = [0u8; 128];
    let received = recv_one(&target, &mut buf, "zero-checksum IPv6 datagram");
    assert_eq!(&buf[..received.len], &packet[..]);
    assert_eq!(received.from.port(), source_port);
    assert!(received.icrc_checked);
}

/// The IPv4 header a peer at `from` sends to `to` for `ib_len` bytes of IB transport packet:
/// DF, TOS 0, TTL 64, with IP identification `id` (and its UDP header).
fn ipv4_headers(
    from: Endpoint,
    to: Endpoint,
    id: u16,
    ib_len: usize,
) -> (IpHeaderInfo, UdpHeaderInfo) {
    let (IpAddr::V4(src), IpAddr::V4(dst)) = (from.addr(), to.addr()) else {
        panic!("IPv4 endpoints only")
    };
    let mut udp = UdpHeaderInfo::rocev2(from.port(), ib_len).unwrap();
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
        id,
        flags_frag,
        total_len,
    };
    (ip, udp)
}

fn received_id(received: &softverbs_device::Received) -> u16 {
    match received.ip {
        IpHeaderInfo::V4 { id, .. } => id,
        IpHeaderInfo::V6 { .. } => panic!("expected IPv4"),
    }
}

// rxe hashes the IPv4 ID, NICs count it: by default the
// receiver accepts an IPv4 packet whose ICRC is valid for some ID, reports that ID in
// Received::ip, and still drops corruption (a payload bit, a cleared DF flag). With
// Ipv4IcrcCheck::IdZero only what a softverbs sender writes (ID 0) passes.
#[test]
fn ipv4_icrc_valid_for_any_ip_id_is_accepted_by_default_and_the_id_reported() {
    let any_id = bind("127.0.0.17");
    assert_eq!(any_id.config().ipv4_icrc, Ipv4IcrcCheck::AnyId);
    let id_zero = UdpTransport::bind(UdpConfig {
        address: Some("127.0.0.18".parse().unwrap()),
        port: 0,
        ipv4_icrc: Ipv4IcrcCheck::IdZero,
        ..UdpConfig::default()
    })
    .unwrap();
    let plain = UdpSocket::bind("127.0.0.19:0").unwrap();
    let from = Endpoint::from(plain.local_addr().unwrap());
    let packet_for = |to: Endpoint, psn: u32, id: u16| {
        let mut packet = send_only(psn, b"ICRC over the sender's real IP header");
        let (ip, udp) = ipv4_headers(from, to, id, packet.len());
        icrc::fill(&ip, &udp, &mut packet).unwrap();
        packet
    };
    let mut buf = vec![0u8; 256];
    for target in [&any_id, &id_zero] {
        let to = target.local();
        let mut corrupted = packet_for(to, 3, 0xFFFF);
        corrupted[20] ^= 0x10; // a payload bit
        let mut no_df = send_only(4, b"ICRC over the sender's real IP header");
        let (ip, udp) = ipv4_headers(from, to, 0x1234, no_df.len());
        let IpHeaderInfo::V4 {
            src,
            dst,
            tos,
            ttl,
            id,
            total_len,
            ..
        } = ip
        else {
            unreachable!()
        };
        let without_df = IpHeaderInfo::V4 {
            src,
            dst,
            tos,
            ttl,
            id,
            flags_frag: 0,
            total_len,
        };
        icrc::fill(&without_df, &udp, &mut no_df).unwrap();
        for datagram in [
            packet_for(to, 1, 0x1F4B), // rxe's ID in rocev2 interop captures
            corrupted,
            no_df,
            packet_for(to, 2, 0),
        ] {
            plain.send_to(&datagram, to.socket_addr()).unwrap();
        }
        let mut ids = Vec::new();
        while let Some(received) = target
            .recv(&mut buf, Some(Duration::from_millis(200)))
            .unwrap()
        {
            assert!(received.icrc_checked);
            let psn = PacketRepr::parse(&buf[..received.len]).unwrap().0.bth.psn;
            ids.push((psn.value(), received_id(&received)));
            assert_eq!(
                icrc::verify(&received.ip, &received.udp, &buf[..received.len]),
                Ok(()),
                "Received::ip is the header the ICRC was computed over"
            );
        }
        let c = target.counters();
        if std::ptr::eq(target, &any_id) {
            assert_eq!(ids, [(1, 0x1F4B), (2, 0)]);
            assert_eq!((c.received_packets, c.dropped_bad_icrc), (2, 2), "{c}");
        } else {
            assert_eq!(ids, [(2, 0)]);
            assert_eq!((c.received_packets, c.dropped_bad_icrc), (1, 3), "{c}");
        }
        assert_eq!(c.icrc_unchecked, 0, "{c}");
    }
}

// The same through the kernel, as rxe sends: a raw IPv4 socket (IP_HDRINCL) writes a real
// header with ID 0x1F4B and DF from a 127.0.0.x address nobody has bound; the device's
// plain socket never sees that ID, accepts the packet and reports the ID.
#[test]
fn kernel_delivered_ipv4_packet_with_nonzero_ip_id_is_accepted() {
    let raw = Socket::new(
        Domain::IPV4,
        Type::RAW,
        Some(Protocol::from(libc::IPPROTO_RAW)),
    )
    .unwrap_or_else(|error| {
        panic!("this test needs a raw socket (CAP_NET_RAW, root in CI): {error}")
    });
    let target = bind("127.0.0.20");
    let from = Endpoint::new("127.0.0.21".parse().unwrap(), 0xC1A9);
    let mut packet = send_only(21, b"from a raw socket with IP ID 0x1F4B");
    let (ip, udp) = ipv4_headers(from, target.local(), 0x1F4B, packet.len());
    icrc::fill(&ip, &udp, &mut packet).unwrap();
    let mut datagram = vec![0u8; 28];
    ip.emit(&mut datagram).unwrap();
    udp.emit(&mut datagram[20..]).unwrap(); // UDP checksum 0, as rxe sends (§1.1)
    datagram.extend_from_slice(&packet);
    let to = SocketAddr::new(target.local().addr(), 0);
    raw.send_to(&datagram, &to.into()).unwrap();
    let mut buf = [0u8; 256];
    let received = recv_one(&target, &mut buf, "raw IPv4 datagram with ID 0x1F4B");
    assert_eq!(&buf[..received.len], &packet[..]);
    assert_eq!(received.from, from);
    assert!(received.icrc_checked);
    assert_eq!(received_id(&received), 0x1F4B);
    assert_eq!(received.ip, ip);
}

/// A packet of `psn` with the ICRC a plain socket at `from` sending to `to` makes valid.
fn plain_socket_packet(from: &Endpoint, to: &Endpoint, psn: u32) -> Vec<u8> {
    let mut packet = send_only(psn, b"from a plain socket");
    let mut udp = UdpHeaderInfo::rocev2(from.port(), packet.len()).unwrap();
    udp.dst_port = to.port();
    let ip = match (from.addr(), to.addr()) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            IpHeaderInfo::linux_ipv4(src, dst, 0, 64, udp.length).unwrap()
        }
        (IpAddr::V6(src), IpAddr::V6(dst)) => IpHeaderInfo::ipv6(src, dst, 0, 0, 64, udp.length),
        _ => unreachable!(),
    };
    icrc::fill(&ip, &udp, &mut packet).unwrap();
    packet
}

// recvmmsg(2) takes several datagrams at once; each is checked as recvmsg's is (reference
// §1.6, §1.7 step 5): a runt and a bad ICRC inside the batch are dropped and counted, the
// good packets around them are handed out in order, packet k at the front of bufs[k].
#[test]
fn a_malformed_datagram_inside_a_received_batch_is_dropped_and_the_good_ones_around_it_delivered() {
    let target = bind("127.0.0.6");
    let plain = UdpSocket::bind("127.0.0.7:0").unwrap();
    let from = Endpoint::from(plain.local_addr().unwrap());
    let to = target.local();
    let mut corrupted = plain_socket_packet(&from, &to, 3);
    corrupted[20] ^= 0x01;
    for datagram in [
        plain_socket_packet(&from, &to, 1),
        vec![1, 2, 3],
        plain_socket_packet(&from, &to, 2),
        corrupted,
        plain_socket_packet(&from, &to, 4),
    ] {
        plain.send_to(&datagram, to.socket_addr()).unwrap();
    }
    let mut storage = vec![0u8; 8 * 1024];
    let mut bufs: Vec<&mut [u8]> = storage.chunks_mut(1024).collect();
    let mut received = Vec::new();
    let count = target
        .recv_batch(&mut bufs, &mut received, Some(PATIENCE))
        .unwrap();
    let psns: Vec<u32> = received
        .iter()
        .zip(&bufs)
        .map(|(packet, buf)| {
            assert_eq!(packet.from, from);
            assert!(packet.icrc_checked);
            let (repr, _) = PacketRepr::parse(&buf[..packet.len]).unwrap();
            repr.bth.psn.value()
        })
        .collect();
    assert_eq!((count, psns), (3, vec![1, 2, 4]));
    let c = target.counters();
    assert_eq!(
        (c.received_packets, c.dropped_malformed, c.dropped_bad_icrc),
        (3, 1, 1),
        "{c}"
    );
    // All five were queued: one recvmmsg took them.
    assert_eq!(c.recv_calls, 1, "{c}");
}

// socket(7) SO_RXQ_OVFL: datagrams the kernel drops because the socket's receive buffer
// is full never reach the transport; the count the kernel attaches to the next datagram
// received is kept as `socket_drops`.
#[test]
fn datagrams_the_kernel_drops_on_a_full_receive_buffer_are_counted_as_socket_drops() {
    let target = bind("127.0.0.8");
    let plain = UdpSocket::bind("127.0.0.9:0").unwrap();
    let from = Endpoint::from(plain.local_addr().unwrap());
    let to = target.local();
    // Far more than the receive buffer holds (at most 8 MiB, see `UdpConfig`): 2000
    // datagrams of 60000 bytes (too large for an IB packet; dropped as truncated when read).
    let big = vec![0u8; 60_000];
    let sent = 2000u64;
    for _ in 0..sent {
        plain.send_to(&big, to.socket_addr()).unwrap();
    }
    let drain = |target: &UdpTransport| {
        let mut storage = vec![0u8; 16 * 1024];
        let mut bufs: Vec<&mut [u8]> = storage.chunks_mut(1024).collect();
        let mut received = Vec::new();
        while target
            .recv_batch(&mut bufs, &mut received, Some(Duration::from_millis(50)))
            .unwrap()
            > 0
        {}
    };
    drain(&target);
    // The datagrams queued before the first drop carry no count: one sent after it does.
    plain
        .send_to(&plain_socket_packet(&from, &to, 1), to.socket_addr())
        .unwrap();
    let mut buf = vec![0u8; 1024];
    recv_one(&target, &mut buf, "the packet after the drops");
    let c = target.counters();
    assert!(c.socket_drops > 0, "{c}");
    assert!(c.socket_drops + c.dropped_truncated == sent, "{c}");
}
