//! The ICRC tests: the vectors of reference §1.8 (hardware captures and rxe packets,
//! `test_vectors.rs`), recomputed, verified, corrupted and re-identified.

use super::*;
use crate::test_vectors::{self, hex};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn trailer(packet: &[u8]) -> u32 {
    let mut bytes = [0u8; 4];
    bytes.copy_from_slice(&packet[packet.len() - 4..]);
    u32::from_le_bytes(bytes)
}

fn icrc_of(packet: &[u8]) -> u32 {
    let (ip, udp, ib) = split_ip_packet(packet).unwrap();
    compute(&ip, &udp, &ib[..ib.len() - 4])
}

// Reference §1.8: every vector (A ConnectX, B ConnectX-4 Lx CNP, C scapy, D IPv6)
// reproduces exactly, and the trailer is the CRC least-significant byte first.
#[test]
fn every_reference_vector_verifies() {
    for (name, packet) in test_vectors::all_ip_packets() {
        assert_eq!(verify_ip_packet(&packet), Ok(()), "{name}");
        assert_eq!(icrc_of(&packet), trailer(&packet), "{name}");
    }
}

// Reference §1.8 A: the ICRC values of the five ConnectX packets.
#[test]
fn vector_a_connectx_icrc_values() {
    assert_eq!(icrc_of(&hex(test_vectors::A_SEND_ONLY)), 0x08a8_11b1);
    assert_eq!(icrc_of(&hex(test_vectors::A_ACKNOWLEDGE)), 0x56cd_7bc8);
    assert_eq!(icrc_of(&hex(test_vectors::A_WRITE_ONLY)), 0x0cf4_5f82);
    assert_eq!(icrc_of(&hex(test_vectors::A_READ_REQUEST)), 0xe634_5efc);
    assert_eq!(
        icrc_of(&hex(test_vectors::A_READ_RESPONSE_ONLY)),
        0x8a9c_1a80
    );
}

// Reference §1.7 step 4 and §1.8 B: CRC 0x2A00FD82 is on the wire as 82 FD 00 2A
// (TOS 0xC2, UDP source port 0, BTH B=1 — all irrelevant or masked).
#[test]
fn vector_b_cnp_icrc_is_little_endian_on_the_wire() {
    let frame = hex(test_vectors::B_CNP_FRAME);
    let packet = &frame[14..];
    assert_eq!(icrc_of(packet), 0x2A00_FD82);
    assert_eq!(&packet[packet.len() - 4..], &[0x82, 0xfd, 0x00, 0x2a]);
    let (ip, udp, _) = split_ip_packet(packet).unwrap();
    assert_eq!(udp.src_port, 0);
    assert!(matches!(ip, IpHeaderInfo::V4 { tos: 0xC2, .. }));
}

// Reference §1.8 C: ICRC 78 f3 53 f3, and our IPv4 header writer reproduces the IP
// checksum 0xb4d5 of the reconstructed packet.
#[test]
fn vector_c_scapy_uc_send_only_and_ip_checksum() {
    let packet = hex(test_vectors::C_SCAPY_UC_SEND_ONLY);
    assert_eq!(icrc_of(&packet), 0xf353_f378);
    let ip = IpHeaderInfo::parse(&packet).unwrap();
    let mut header = [0u8; 20];
    assert_eq!(ip.emit(&mut header), Ok(20));
    assert_eq!(&header[10..12], &[0xb4, 0xd5]);
    assert_eq!(&header[..], &packet[..20]);
}

// Reference §1.8 D: IPv6; traffic class 0xB8, flow label 0, hop limit 1 give the same
// ICRC 66 77 9c 57.
#[test]
fn vector_d_ipv6_masks_traffic_class_flow_label_hop_limit() {
    let packet = hex(test_vectors::D_IPV6_SEND_ONLY);
    let (ip, udp, ib) = split_ip_packet(&packet).unwrap();
    assert_eq!(
        ip,
        IpHeaderInfo::ipv6(
            "2001:db8::1".parse().unwrap(),
            "2001:db8::2".parse().unwrap(),
            0,
            0x12345,
            64,
            0x1c
        )
    );
    assert_eq!(
        udp,
        UdpHeaderInfo {
            src_port: 0xC001,
            dst_port: ROCEV2_PORT,
            length: 0x1c
        }
    );
    let IpHeaderInfo::V6 {
        src,
        dst,
        payload_len,
        ..
    } = ip
    else {
        unreachable!()
    };
    let changed = IpHeaderInfo::V6 {
        src,
        dst,
        traffic_class: 0xB8,
        flow_label: 0,
        payload_len,
        hop_limit: 1,
    };
    assert_eq!(verify(&changed, &udp, ib), Ok(()));
    assert_eq!(compute(&changed, &udp, &ib[..ib.len() - 4]), 0x579c_7766);
    // The rebuilt header with the changed fields still verifies as a whole packet.
    let mut rebuilt = packet.clone();
    changed.emit(&mut rebuilt).unwrap();
    assert_eq!(&rebuilt[..4], &[0x6B, 0x80, 0x00, 0x00]);
    assert_eq!(verify_ip_packet(&rebuilt), Ok(()));
}

/// Byte offsets (in the IP packet) whose bits are masked out of the ICRC, and offsets
/// the API fixes (IPv4 version/IHL and protocol, IPv6 version and next header) so that
/// a flip there is not an ICRC question but a different packet kind.
/// (byte offset, bit mask) pairs.
type BitSet = Vec<(usize, u8)>;

fn masked_and_fixed(packet: &[u8]) -> (BitSet, BitSet) {
    if packet[0] >> 4 == 4 {
        let masked = vec![
            (1, 0xFF),
            (8, 0xFF),
            (10, 0xFF),
            (11, 0xFF),
            (26, 0xFF),
            (27, 0xFF),
            (32, 0xFF),
        ];
        (masked, vec![(0, 0xFF), (9, 0xFF)])
    } else {
        let masked = vec![
            (0, 0x0F),
            (1, 0xFF),
            (2, 0xFF),
            (3, 0xFF),
            (7, 0xFF),
            (46, 0xFF),
            (47, 0xFF),
            (52, 0xFF),
        ];
        (masked, vec![(0, 0xF0), (6, 0xFF)])
    }
}

// Reference §1.8 property tests: the ICRC is invariant under changes of IPv4 TOS / TTL /
// checksum, IPv6 traffic class / flow label / hop limit, UDP checksum and BTH F / B /
// reserved-6 bits, and changes for any other single-bit flip (IP ID, lengths, UDP source
// port, BTH A bit, pad bytes, payload …).
#[test]
fn icrc_invariant_exactly_under_masked_bit_flips() {
    for packet in [
        hex(test_vectors::A_WRITE_ONLY),
        hex(test_vectors::D_IPV6_SEND_ONLY),
    ] {
        let reference = trailer(&packet);
        let ip_len = if packet[0] >> 4 == 4 { 20 } else { 40 };
        let (masked, fixed) = masked_and_fixed(&packet);
        for byte in 0..packet.len() - 4 {
            for bit in 0..8 {
                let mask = 1u8 << bit;
                if fixed.iter().any(|&(at, m)| at == byte && m & mask != 0) {
                    continue;
                }
                let mut flipped = packet.clone();
                flipped[byte] ^= mask;
                // Split at the original positions: a flipped length must change the
                // ICRC, not move the ICRC.
                let ip = IpHeaderInfo::parse(&flipped).unwrap();
                let udp = UdpHeaderInfo {
                    src_port: u16::from_be_bytes([flipped[ip_len], flipped[ip_len + 1]]),
                    dst_port: u16::from_be_bytes([flipped[ip_len + 2], flipped[ip_len + 3]]),
                    length: u16::from_be_bytes([flipped[ip_len + 4], flipped[ip_len + 5]]),
                };
                let icrc = compute(&ip, &udp, &flipped[ip_len + 8..packet.len() - 4]);
                let is_masked = masked.iter().any(|&(at, m)| at == byte && m & mask != 0);
                assert_eq!(icrc == reference, is_masked, "byte {byte} bit {bit}");
            }
        }
    }
}

// Reference §1.7 step 3: rxe's seed 0xDEBB20E3 is the raw CRC register after eight 0xFF
// bytes (crc32fast keeps the complemented register).
#[test]
fn eight_ff_bytes_equal_rxe_seed() {
    assert_eq!(!crc32fast::hash(&[0xFF; 8]), 0xDEBB_20E3);
}

// Reference §5.2: Linux writes ID 0 and DF for an unconnected IP_PMTUDISC_DO socket;
// the header checksum must be valid (libibverbs checks it in the UD GRH area, §3.4).
#[test]
fn linux_ipv4_header_has_id_zero_df_and_valid_checksum() {
    let header = linux_ipv4_header(
        Ipv4Addr::new(172, 17, 242, 47),
        Ipv4Addr::new(172, 17, 242, 56),
        0x02,
        64,
        0x28,
    )
    .unwrap();
    assert_eq!(
        &header[..10],
        &[0x45, 0x02, 0x00, 0x3c, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11]
    );
    assert_eq!(&header[12..], &[172, 17, 242, 47, 172, 17, 242, 56]);
    let sum: u32 = header
        .chunks(2)
        .map(|p| u32::from(u16::from_be_bytes([p[0], p[1]])))
        .sum();
    assert_eq!((sum & 0xFFFF) + (sum >> 16), 0xFFFF);
    assert_eq!(ipv4_checksum(&[0u8; 20]), 0xFFFF);
    assert_eq!(
        linux_ipv4_header(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST, 0, 64, 65516),
        Err(WireError::LengthOverflow)
    );
}

// Reference §1.8 A: the ConnectX send-only packet with its IP ID replaced by 0 is what
// a Linux softverbs peer sends; fill() then verify() agree, the hardware ICRC does not.
#[test]
fn fill_then_verify_with_linux_header() {
    let packet = hex(test_vectors::A_SEND_ONLY);
    let (_, udp, ib) = split_ip_packet(&packet).unwrap();
    let ip = IpHeaderInfo::linux_ipv4(
        Ipv4Addr::new(172, 17, 242, 47),
        Ipv4Addr::new(172, 17, 242, 56),
        0,
        64,
        udp.length,
    )
    .unwrap();
    assert!(matches!(
        verify(&ip, &udp, ib),
        Err(WireError::BadIcrc { .. })
    ));
    let mut ib = ib.to_vec();
    let icrc = fill(&ip, &udp, &mut ib).unwrap();
    assert_eq!(trailer(&ib), icrc);
    assert_eq!(verify(&ip, &udp, &ib), Ok(()));
}

#[test]
fn ip_and_udp_headers_round_trip_through_parse_and_emit() {
    for (name, packet) in test_vectors::all_ip_packets() {
        let (ip, udp, _) = split_ip_packet(&packet).unwrap();
        let ip_len = ip.header_len();
        let mut bytes = vec![0u8; ip_len + 8];
        assert_eq!(ip.emit(&mut bytes), Ok(ip_len));
        assert_eq!(udp.emit(&mut bytes[ip_len..]), Ok(8));
        // Every vector carries UDP checksum 0, as rxe and ConnectX send (§1.1).
        assert_eq!(&bytes[..], &packet[..ip_len + 8], "{name}");
        assert_eq!(ip.udp_len(), Some(udp.length), "{name}");
    }
}

#[test]
fn short_or_malformed_input_is_an_error() {
    let good = hex(test_vectors::A_SEND_ONLY);
    let ip = IpHeaderInfo::parse(&good).unwrap();
    let udp = UdpHeaderInfo::parse(&good[20..]).unwrap();
    assert_eq!(verify(&ip, &udp, &[1, 2, 3]), Err(WireError::Truncated));
    assert_eq!(fill(&ip, &udp, &mut [0u8; 3]), Err(WireError::Truncated));
    assert_eq!(
        verify(&ip, &udp, &[0, 0, 0, 0]),
        Err(WireError::BadIcrc {
            expected: compute(&ip, &udp, &[]),
            found: 0
        })
    );
    for len in 0..good.len() {
        assert!(split_ip_packet(&good[..len]).is_err(), "len {len}");
    }
    let mut bad = good.clone();
    bad[9] = 6; // TCP
    assert_eq!(split_ip_packet(&bad).err(), Some(WireError::BadIpHeader));
    let mut bad = good.clone();
    bad[0] = 0x46; // IP options
    assert_eq!(split_ip_packet(&bad).err(), Some(WireError::BadIpHeader));
    let mut bad = good.clone();
    bad[0] = 0x55;
    assert_eq!(split_ip_packet(&bad).err(), Some(WireError::BadIpHeader));
    let mut bad = good.clone();
    bad[25] += 1; // UDP length beyond the IP length
    assert_eq!(split_ip_packet(&bad).err(), Some(WireError::BadIpHeader));
    let mut bad = good.clone();
    bad[25] = 7; // UDP length below 8
    assert_eq!(split_ip_packet(&bad).err(), Some(WireError::BadIpHeader));
    let mut padded = good.clone();
    padded.extend_from_slice(&[0xEE; 6]); // Ethernet padding / capture trailer (§5.3)
    assert_eq!(verify_ip_packet(&padded), Ok(()));
    assert_eq!(
        UdpHeaderInfo::rocev2(4791, 65528),
        Err(WireError::LengthOverflow)
    );
    assert_eq!(UdpHeaderInfo::rocev2(4791, 40).unwrap().length, 48);
    assert_eq!(
        ip.emit(&mut [0u8; 19]),
        Err(WireError::BufferTooSmall {
            needed: 20,
            available: 19
        })
    );
    // compute accepts anything, including packets shorter than a BTH.
    for len in 0..16 {
        let _ = compute(&ip, &udp, &good[28..28 + len]);
    }
}

#[test]
fn display_ip_and_udp_headers() {
    let packet = hex(test_vectors::A_SEND_ONLY);
    let (ip, udp, _) = split_ip_packet(&packet).unwrap();
    assert_eq!(
        ip.to_string(),
        "IPv4 172.17.242.47 > 172.17.242.56 tos=0x02 ttl=64 id=0x4694 df len=60"
    );
    assert_eq!(udp.to_string(), "UDP 63431 > 4791 len=40");
    let (ip6, _, _) = split_ip_packet(&hex(test_vectors::D_IPV6_SEND_ONLY)).unwrap();
    assert_eq!(
        ip6.to_string(),
        "IPv6 2001:db8::1 > 2001:db8::2 tclass=0x00 flowlabel=0x12345 hlim=64 plen=28"
    );
}
// ---- verify_any_ipv4_id: the ICRC of an IPv4 packet whose ID the receiver cannot see.

/// Two IPv4 packets kernel `rdma_rxe` sent (guest 10.99.0.2 to softverbs on 10.99.0.1,
/// captured on the tap of `scripts/interop.sh`): an RC ACKNOWLEDGE and an RC SEND_ONLY
/// with 4 bytes of payload. rxe gives every packet its own ID (0x1F4B, 0x1F4C) with DF.
const RXE_ACKNOWLEDGE: &str = "450000301f4b4000401106aa0a6300020a630001c1a912b7001c00001100ffff00000011006bb4d71f00000162824b46";
const RXE_SEND_ONLY: &str = "450000301f4c4000401106a90a6300020a630001c1a912b7001c00000430ffff0000001180c9a32a0000000028625976";

/// `ip` with another ID.
fn with_id(ip: &IpHeaderInfo, new_id: u16) -> IpHeaderInfo {
    match *ip {
        IpHeaderInfo::V4 {
            src,
            dst,
            tos,
            ttl,
            flags_frag,
            total_len,
            ..
        } => IpHeaderInfo::V4 {
            src,
            dst,
            tos,
            ttl,
            id: new_id,
            flags_frag,
            total_len,
        },
        v6 => v6,
    }
}

fn id_of(ip: &IpHeaderInfo) -> u16 {
    match *ip {
        IpHeaderInfo::V4 { id, .. } => id,
        IpHeaderInfo::V6 { .. } => panic!("no ID in IPv6"),
    }
}

/// A random RoCEv2 IPv4 packet (IP header first, ICRC filled for `id`), with `ib_len`
/// bytes of IB transport packet, ICRC included.
fn random_ipv4_packet(rng: &mut ChaCha8Rng, ib_len: usize, id: u16) -> Vec<u8> {
    let udp = UdpHeaderInfo::rocev2(rng.gen(), ib_len).unwrap();
    let ip = with_id(
        &IpHeaderInfo::linux_ipv4(
            Ipv4Addr::from(rng.gen::<u32>()),
            Ipv4Addr::from(rng.gen::<u32>()),
            rng.gen(),
            rng.gen(),
            udp.length,
        )
        .unwrap(),
        id,
    );
    let mut packet = vec![0u8; 28 + ib_len];
    ip.emit(&mut packet).unwrap();
    udp.emit(&mut packet[20..]).unwrap();
    rng.fill(&mut packet[28..28 + ib_len - 4]);
    fill(&ip, &udp, &mut packet[28..]).unwrap();
    packet
}

// The kernel's rxe packets verify over their real header, not over the header a socket
// receiver assumes (ID 0); verify_any_ipv4_id recovers rxe's ID from that assumption.
#[test]
fn rxe_packets_verify_for_their_hashed_ip_id() {
    for (text, rxe_id) in [(RXE_ACKNOWLEDGE, 0x1F4B), (RXE_SEND_ONLY, 0x1F4C)] {
        let packet = hex(text);
        assert_eq!(verify_ip_packet(&packet), Ok(()));
        let (real, udp, ib) = split_ip_packet(&packet).unwrap();
        assert_eq!(id_of(&real), rxe_id);
        let assumed = IpHeaderInfo::linux_ipv4(
            Ipv4Addr::new(10, 99, 0, 2),
            Ipv4Addr::new(10, 99, 0, 1),
            0,
            64,
            udp.length,
        )
        .unwrap();
        assert!(matches!(
            verify(&assumed, &udp, ib),
            Err(WireError::BadIcrc { .. })
        ));
        assert_eq!(
            verify_any_ipv4_id(&assumed, &udp, ib),
            Ok(with_id(&real, rxe_id))
        );
        // Starting from any other assumed ID finds the same one.
        assert_eq!(
            verify_any_ipv4_id(&with_id(&assumed, 0xFFFF), &udp, ib),
            Ok(with_id(&real, rxe_id))
        );
    }
}

// Random packets of many lengths (whole words or not, up to a 4096-byte payload and
// beyond) with random IDs: the ID is recovered from the ID-0 header, and ID 0 is
// accepted as it is.
#[test]
fn random_ids_are_recovered_and_id_zero_passes_unchanged() {
    let mut rng = ChaCha8Rng::seed_from_u64(0x1C4C);
    let lengths = (4..80)
        .chain([1024 + 16, 2048 + 16, 4096 + 16, 4096 + 44, 9000, 65_507])
        .chain((0..40).map(|_| rng.gen_range(4..4200)));
    for ib_len in lengths.collect::<Vec<_>>() {
        for id in [0, 1, 0x8000, 0xFFFF, rng.gen(), rng.gen()] {
            let packet = random_ipv4_packet(&mut rng, ib_len, id);
            let (real, udp, ib) = split_ip_packet(&packet).unwrap();
            assert_eq!(verify(&real, &udp, ib), Ok(()));
            let assumed = with_id(&real, 0);
            let found = verify_any_ipv4_id(&assumed, &udp, ib);
            assert_eq!(found, Ok(real), "ib_len {ib_len} id {id:#06x}");
            assert_eq!(verify(&assumed, &udp, ib).is_ok(), id == 0);
        }
    }
}

// Every single-bit flip outside the masked bits and the ID itself — IPv4 header
// (DF flag included), UDP header, BTH, payload, pad and the ICRC trailer — is rejected
// whatever ID is allowed: for a small packet with several IDs and a 4 KiB one.
#[test]
fn any_single_bit_flip_is_rejected_even_with_the_id_unknown() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let cases = [
        (64, 0x1F4B),
        (64, 0),
        (64, 0xFFFF),
        (300, rng.gen()),
        (4096 + 16, 0x4694),
    ];
    let masked = [1, 8, 10, 11, 26, 27, 32];
    let id_bytes = [4, 5];
    for (ib_len, id) in cases {
        let packet = random_ipv4_packet(&mut rng, ib_len, id);
        for byte in 0..packet.len() {
            if masked.contains(&byte) || id_bytes.contains(&byte) {
                continue;
            }
            for bit in 0..8 {
                let mut flipped = packet.clone();
                flipped[byte] ^= 1 << bit;
                // The receiver's view of the sender's header (with the flipped bit, if
                // it is in a header) but not its ID; the packet split at the original
                // positions, so a flipped length changes the ICRC, not the split.
                let Ok(ip) = IpHeaderInfo::parse(&flipped) else {
                    continue; // version, IHL or protocol: not a RoCEv2 packet at all
                };
                let udp = UdpHeaderInfo {
                    src_port: u16::from_be_bytes([flipped[20], flipped[21]]),
                    dst_port: u16::from_be_bytes([flipped[22], flipped[23]]),
                    length: u16::from_be_bytes([flipped[24], flipped[25]]),
                };
                let result = verify_any_ipv4_id(&with_id(&ip, 0), &udp, &flipped[28..]);
                assert!(
                    matches!(result, Err(WireError::BadIcrc { .. })),
                    "ib_len {ib_len} id {id:#06x} byte {byte} bit {bit}: {result:?}"
                );
            }
        }
        // Flips in the masked bytes are accepted with the right ID.
        let mut flipped = packet.clone();
        for byte in masked {
            flipped[byte] ^= 0xA5;
        }
        let (ip, udp, ib) = split_ip_packet(&flipped).unwrap();
        assert_eq!(verify_any_ipv4_id(&with_id(&ip, 0), &udp, ib), Ok(ip));
    }
}

// The module documentation's guarantee, checked by stepping the CRC register one bit
// at a time (independent of the tables): a single flipped bit `b` bytes after the
// first ID byte can pass as an ID change only if undoing b bytes of the register from
// that bit leaves it within the ID's 16 bits. The first such position is 26,768 bytes
// after the ID; nothing in the 12 pseudo-header bytes before it.
#[test]
fn single_bit_errors_are_detected_up_to_26768_bytes_after_the_id() {
    let mut first_alias = u64::MAX;
    for bit in 0..8 {
        let mut r = 1u32 << bit;
        for bytes in 1..=26_768u64 {
            for _ in 0..8 {
                r = times_x_inverse(r);
            }
            // Byte 1 is the second ID byte itself.
            if bytes >= 2 && r >> 16 == 0 {
                first_alias = first_alias.min(bytes);
            }
        }
        let mut r = 1u32 << bit;
        for _ in 1..=12 {
            for _ in 0..8 {
                r = times_x(r);
            }
            assert_ne!(r >> 16, 0, "bit {bit} before the ID");
        }
    }
    assert_eq!(first_alias, 26_768);
    assert_eq!(times_x_to_minus_8n(1 << 6, 26_768) >> 16, 0);
}

// The GF(2) arithmetic against crc32fast: a CRC difference carried over n bytes of zeros
// is undone by times_x_to_minus_8n, through every table (n ≥ 65536 uses the powers of
// two), and the ID change lands in the low 16 bits as the module documentation says.
#[test]
fn zero_run_is_undone_by_x_to_minus_8n() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    assert_eq!(times_x_inverse(times_x(0x1234_5678)), 0x1234_5678);
    assert_eq!(multiply_mod_p(X_TO_0, 0xDEAD_BEEF), 0xDEAD_BEEF);
    for n in [
        0usize, 1, 2, 7, 255, 256, 257, 4117, 65_535, 65_536, 70_000, 200_003,
    ] {
        let head: [u8; 6] = rng.gen();
        let zeros = vec![0u8; head.len() + n];
        let mut message = zeros.clone();
        message[..head.len()].copy_from_slice(&head);
        let before = crc32fast::hash(&head) ^ crc32fast::hash(&zeros[..head.len()]);
        let after = crc32fast::hash(&message) ^ crc32fast::hash(&zeros);
        assert_eq!(times_x_to_minus_8n(after, n as u64), before, "n {n}");
        // Two bytes from a zero register sit in bits 0..16, first byte lowest.
        let id: u16 = rng.gen();
        let mut message = zeros.clone();
        message[..2].copy_from_slice(&id.to_be_bytes());
        let change = crc32fast::hash(&message) ^ crc32fast::hash(&zeros);
        let from_field = (head.len() + n) as u64;
        assert_eq!(id_change_for_icrc_change(change, from_field), Some(id));
    }
    assert_eq!(times_x_to_minus_8n(0, u64::MAX), 0);
    let _ = times_x_to_minus_8n(0xFFFF_FFFF, u64::MAX);
}

// IPv6 has no ID: checked exactly. Short input is Truncated; the error on a mismatch
// reports the ICRC over the header as given; random bytes never panic.
#[test]
fn any_id_check_on_ipv6_short_and_garbage_input() {
    let packet = hex(test_vectors::D_IPV6_SEND_ONLY);
    let (ip6, udp6, ib6) = split_ip_packet(&packet).unwrap();
    assert_eq!(verify_any_ipv4_id(&ip6, &udp6, ib6), Ok(ip6));
    let mut bad = ib6.to_vec();
    bad[13] ^= 1;
    assert_eq!(
        verify_any_ipv4_id(&ip6, &udp6, &bad),
        verify(&ip6, &udp6, &bad).map(|()| ip6)
    );
    assert!(verify(&ip6, &udp6, &bad).is_err());

    let packet = hex(RXE_SEND_ONLY);
    let (ip, udp, ib) = split_ip_packet(&packet).unwrap();
    let assumed = with_id(&ip, 0);
    for len in 0..4 {
        assert_eq!(
            verify_any_ipv4_id(&assumed, &udp, &ib[..len]),
            Err(WireError::Truncated)
        );
    }
    let mut bad = ib.to_vec();
    bad[13] ^= 0x40;
    assert_eq!(
        verify_any_ipv4_id(&assumed, &udp, &bad).err(),
        verify(&assumed, &udp, &bad).err()
    );
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut accepted = 0;
    for _ in 0..20_000 {
        let len = rng.gen_range(0..64);
        let garbage: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        if verify_any_ipv4_id(&assumed, &udp, &garbage).is_ok() {
            accepted += 1;
        }
    }
    // One in 65536 random ICRCs fits some ID: about 0.3 expected here.
    assert!(accepted <= 3, "{accepted}");
}
