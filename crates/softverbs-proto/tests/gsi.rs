//! QP1, the General Services Interface, in the engine (IBTA vol. 1 13.4 MADs, 13.5 QP1
//! and its Q_Key 0x80010000, 14 on QP1): what is accepted as a management datagram, what
//! is dropped and under which counter, the bytes of a MAD sent, the bounds of the inbox
//! and the outbox, and that no user QP is ever numbered 0 or 1.
//!
//! Packets in are built byte by byte here (BTH, DETH, payload, pad, ICRC placeholder), and
//! packets out are read at their byte offsets, so the test pins the wire layout rather
//! than the engine's own codec.

use softverbs_proto::{
    AtomicOp, DropReason, Engine, EngineConfig, MemError, MemKey, Memory, QpInit, QpType,
    RegionInfo, VerbsError, GSI_INBOX_LEN, GSI_OUTBOX_LEN, GSI_QKEY, GSI_QPN, MAD_LEN,
};

/// No registered memory: QP1 never reads or writes any.
struct NoMemory;

impl Memory for NoMemory {
    type Handle = ();
    fn lookup(&self, _: MemKey) -> Result<((), RegionInfo), MemError> {
        Err(MemError::InvalidKey)
    }
    fn read_region(&self, _: (), _: usize, _: &mut [u8]) -> Result<(), MemError> {
        Err(MemError::InvalidKey)
    }
    fn write_region(&mut self, _: (), _: usize, _: &[u8]) -> Result<(), MemError> {
        Err(MemError::InvalidKey)
    }
    fn atomic_region(&mut self, _: (), _: usize, _: AtomicOp) -> Result<u64, MemError> {
        Err(MemError::InvalidKey)
    }
    fn invalidate_region(&mut self, _: ()) -> Result<(), MemError> {
        Err(MemError::InvalidKey)
    }
}

const UD_SEND_ONLY: u8 = 0x64;
const UD_SEND_ONLY_IMM: u8 = 0x65;
const RC_SEND_ONLY: u8 = 0x04;

/// A packet to DestQP `dest_qp`: BTH, then a DETH for UD opcodes (an ImmDt after it for
/// 0x65), the payload, its pad and a zero ICRC.
fn packet(opcode: u8, pkey: u16, dest_qp: u32, qkey: u32, src_qp: u32, payload: &[u8]) -> Vec<u8> {
    let pad = (4 - payload.len() % 4) % 4;
    let mut p = vec![opcode, (pad as u8) << 4];
    p.extend_from_slice(&pkey.to_be_bytes());
    p.push(0);
    p.extend_from_slice(&dest_qp.to_be_bytes()[1..]);
    p.extend_from_slice(&[0, 0, 0, 7]); // AckReq off, PSN 7
    if opcode & 0xE0 == 0x60 {
        p.extend_from_slice(&qkey.to_be_bytes());
        p.push(0);
        p.extend_from_slice(&src_qp.to_be_bytes()[1..]);
    }
    if opcode == UD_SEND_ONLY_IMM {
        p.extend_from_slice(&[0xAA; 4]);
    }
    p.extend_from_slice(payload);
    p.extend(std::iter::repeat_n(0, pad + 4));
    p
}

/// A MAD to QP1 as a GSI sends it (kernel rxe included): P_Key 0xFFFF, Q_Key
/// 0x80010000, SrcQP 1.
fn mad_packet(payload: &[u8]) -> Vec<u8> {
    packet(UD_SEND_ONLY, 0xFFFF, 1, GSI_QKEY, 1, payload)
}

/// The GRH area of a packet from IPv4 `127.0.0.<from>` to `127.0.0.<to>`: 20 zero bytes
/// then the IPv4 header.
fn grh_v4(from: u8, to: u8) -> [u8; 40] {
    let mut grh = [0u8; 40];
    grh[20] = 0x45;
    grh[32..36].copy_from_slice(&[127, 0, 0, from]);
    grh[36..40].copy_from_slice(&[127, 0, 0, to]);
    grh
}

fn mapped(last: u8) -> [u8; 16] {
    let mut gid = [0u8; 16];
    gid[10..12].copy_from_slice(&[0xff, 0xff]);
    gid[12..].copy_from_slice(&[127, 0, 0, last]);
    gid
}

fn a_mad(tag: u8) -> Vec<u8> {
    let mut mad = vec![0u8; MAD_LEN];
    mad[0] = 1; // base version
    mad[1] = 0x07; // CM class
    mad[2] = 2;
    mad[3] = 0x03; // SEND
    mad[8..16].copy_from_slice(&[tag; 8]); // TransactionID
    mad
}

/// IBTA 13.5: a UD SEND ONLY to QP1 with Q_Key 0x80010000 is a management datagram; it
/// waits in the GSI inbox with the sender's GID (from the GRH: IPv4 as `::ffff:a.b.c.d`,
/// IPv6 as the address) and the DETH SrcQP, and the counters say it was received.
#[test]
fn a_mad_to_qp1_is_queued_with_the_source_gid_and_src_qp() {
    let mut ep = Engine::new(EngineConfig::default());
    let mad = a_mad(1);
    ep.handle_packet(0, &mad_packet(&mad), Some(&grh_v4(3, 2)), &mut NoMemory);
    let mut v6 = [0u8; 40];
    v6[0] = 0x60;
    let source: [u8; 16] = "fd99::3".parse::<std::net::Ipv6Addr>().unwrap().octets();
    v6[8..24].copy_from_slice(&source);
    let from_client = packet(UD_SEND_ONLY, 0xFFFF, 1, GSI_QKEY, 0x42, &mad[..100]);
    ep.handle_packet(1, &from_client, Some(&v6), &mut NoMemory);
    assert_eq!(ep.gsi_pending(), 2);

    let first = ep.poll_gsi().expect("the first MAD");
    assert_eq!(
        (first.sgid, first.src_qpn, first.pkey),
        (mapped(3), 1, 0xFFFF)
    );
    assert_eq!(first.bytes, mad);
    let second = ep.poll_gsi().expect("the second MAD");
    assert_eq!((second.sgid, second.src_qpn), (source, 0x42));
    assert_eq!(second.bytes, &mad[..100]);
    assert_eq!(ep.poll_gsi(), None);
    assert_eq!(ep.gsi_pending(), 0);
    let c = ep.counters();
    assert_eq!((c.gsi_received, c.total_drops()), (2, 0), "{c}");
    assert!(ep.poll_completion().is_none(), "QP1 completes into no CQ");
}

/// IBTA 13.5: QP1 takes only UD SEND ONLY with the GSI Q_Key 0x80010000 and a MAD's
/// length of payload. A wrong Q_Key is `QkeyMismatch`, an RC SEND or a UD SEND with
/// immediate `WrongTransport`, a payload longer than 256 bytes, an empty one, or no GRH
/// (RoCE always has one) `Malformed`; none reaches the inbox.
#[test]
fn wrong_qkey_non_ud_opcode_and_oversized_packets_to_qp1_are_dropped_and_counted() {
    let mut ep = Engine::new(EngineConfig::default());
    let grh = grh_v4(3, 2);
    let mad = a_mad(2);
    type Case<'a> = (Vec<u8>, Option<&'a [u8; 40]>, DropReason);
    let cases: [Case<'_>; 7] = [
        (
            packet(UD_SEND_ONLY, 0xFFFF, 1, 0x8001_0001, 1, &mad),
            Some(&grh),
            DropReason::QkeyMismatch,
        ),
        (
            packet(UD_SEND_ONLY, 0xFFFF, 1, 0, 1, &mad),
            Some(&grh),
            DropReason::QkeyMismatch,
        ),
        (
            packet(RC_SEND_ONLY, 0xFFFF, 1, 0, 0, &mad),
            Some(&grh),
            DropReason::WrongTransport,
        ),
        (
            packet(UD_SEND_ONLY_IMM, 0xFFFF, 1, GSI_QKEY, 1, &mad),
            Some(&grh),
            DropReason::WrongTransport,
        ),
        (
            packet(UD_SEND_ONLY, 0xFFFF, 1, GSI_QKEY, 1, &[0u8; MAD_LEN + 4]),
            Some(&grh),
            DropReason::Malformed,
        ),
        (
            packet(UD_SEND_ONLY, 0xFFFF, 1, GSI_QKEY, 1, &[]),
            Some(&grh),
            DropReason::Malformed,
        ),
        (mad_packet(&mad), None, DropReason::Malformed),
    ];
    for (i, (bytes, grh, reason)) in cases.iter().enumerate() {
        let before = ep.counters().drops(*reason);
        ep.handle_packet(i as u64, bytes, *grh, &mut NoMemory);
        assert_eq!(
            ep.counters().drops(*reason),
            before + 1,
            "case {i}: {reason:?}"
        );
        assert_eq!(ep.gsi_pending(), 0, "case {i}");
    }
    let c = ep.counters();
    assert_eq!((c.total_drops(), c.gsi_received), (cases.len() as u64, 0));
    // The same MAD, well formed, is taken.
    ep.handle_packet(9, &mad_packet(&mad), Some(&grh), &mut NoMemory);
    assert_eq!(ep.poll_gsi().map(|m| m.bytes), Some(mad));
}

/// The default-partition rule applies to QP1 as to any QP (reference §1.2): P_Key 0xFFFF
/// and 0x7FFF (limited member) are taken, another partition is `BadPkey`.
#[test]
fn qp1_takes_any_pkey_of_the_default_partition_only() {
    let mut ep = Engine::new(EngineConfig::default());
    let grh = grh_v4(3, 2);
    for pkey in [0xFFFF, 0x7FFF] {
        let p = packet(UD_SEND_ONLY, pkey, 1, GSI_QKEY, 1, &a_mad(3));
        ep.handle_packet(0, &p, Some(&grh), &mut NoMemory);
        assert_eq!(ep.poll_gsi().map(|m| m.pkey), Some(pkey));
    }
    let p = packet(UD_SEND_ONLY, 0x8001, 1, GSI_QKEY, 1, &a_mad(3));
    ep.handle_packet(0, &p, Some(&grh), &mut NoMemory);
    assert_eq!(ep.counters().drops(DropReason::BadPkey), 1);
    assert_eq!(ep.gsi_pending(), 0);
}

/// A flood of MADs nobody takes: the inbox holds `GSI_INBOX_LEN` of them, the rest are
/// dropped as `GsiInboxFull` (memory stays bounded); once drained, QP1 takes MADs again.
#[test]
fn a_flood_beyond_the_inbox_bound_is_dropped_and_counted() {
    let mut ep = Engine::new(EngineConfig::default());
    let grh = grh_v4(3, 2);
    let flood = GSI_INBOX_LEN + 1000;
    for i in 0..flood {
        let p = mad_packet(&a_mad(i as u8));
        ep.handle_packet(i as u64, &p, Some(&grh), &mut NoMemory);
    }
    assert_eq!(ep.gsi_pending(), GSI_INBOX_LEN);
    let c = ep.counters();
    assert_eq!(c.drops(DropReason::GsiInboxFull), 1000, "{c}");
    assert_eq!(c.gsi_received, GSI_INBOX_LEN as u64);
    assert!(c.to_string().contains("dropped_gsi_inbox_full=1000"), "{c}");
    // Arrival order is kept: the first ones are there, the late ones were dropped.
    assert_eq!(ep.poll_gsi().unwrap().bytes[8], 0);
    let mut taken = 1;
    while ep.poll_gsi().is_some() {
        taken += 1;
        assert!(
            taken <= GSI_INBOX_LEN,
            "the inbox holds more than its bound"
        );
    }
    assert_eq!(taken, GSI_INBOX_LEN);
    ep.handle_packet(0, &mad_packet(&a_mad(7)), Some(&grh), &mut NoMemory);
    assert_eq!(ep.gsi_pending(), 1);
}

/// IBTA 13.5: a MAD leaves as a UD SEND ONLY (0x64) with BTH P_Key 0xFFFF and DestQP 1,
/// DETH Q_Key 0x80010000 and SrcQP 1, the MAD as payload; `Transmit` names QP 1 on both
/// ends and an address vector towards the destination GID. Another engine takes the
/// packet as a MAD from SrcQP 1.
#[test]
fn poll_transmit_writes_a_mad_as_a_ud_send_only_from_qp1_to_qp1() {
    let mut ep = Engine::new(EngineConfig::default());
    let mad = a_mad(4);
    ep.gsi_send(mapped(9), 1, &mad).unwrap();
    let mut buf = vec![0u8; ep.max_packet_len()];
    let t = ep
        .poll_transmit(0, &mut buf, &NoMemory)
        .expect("the MAD goes out");
    assert_eq!((t.src_qpn, t.dest_qpn), (GSI_QPN, GSI_QPN));
    assert_eq!(t.av.dgid, mapped(9));
    assert_eq!(t.av.sgid_index, 1);
    assert!(t.av.is_global);
    let p = buf[..t.len].to_vec();
    assert_eq!(p.len(), 12 + 8 + MAD_LEN + 4, "BTH, DETH, MAD, ICRC");
    assert_eq!(p[0], 0x64, "UD SEND ONLY");
    assert_eq!(p[1] & 0x30, 0, "no pad for 256 bytes");
    assert_eq!(p[1] & 0x0F, 0, "transport header version 0");
    assert_eq!(&p[2..4], &[0xFF, 0xFF], "P_Key");
    assert_eq!(&p[5..8], &[0, 0, 1], "DestQP 1");
    assert_eq!(&p[12..16], &[0x80, 0x01, 0x00, 0x00], "DETH Q_Key");
    assert_eq!(&p[17..20], &[0, 0, 1], "DETH SrcQP 1");
    assert_eq!(&p[20..20 + MAD_LEN], &mad[..]);
    assert!(ep.poll_transmit(0, &mut buf, &NoMemory).is_none());
    let c = ep.counters();
    assert_eq!((c.gsi_sent, c.packets_sent), (1, 1));

    let mut peer = Engine::new(EngineConfig::default());
    peer.handle_packet(0, &p, Some(&grh_v4(2, 9)), &mut NoMemory);
    let got = peer.poll_gsi().expect("the peer takes the MAD");
    assert_eq!((got.sgid, got.src_qpn, got.bytes), (mapped(2), 1, mad));
}

/// `gsi_send` refuses what cannot be a MAD (empty, longer than 256 bytes), a source GID
/// index outside the table, and a MAD beyond the outbox bound (`QueueFull`, ENOMEM): none
/// of them queues anything.
#[test]
fn gsi_send_refuses_bad_lengths_bad_gid_indexes_and_a_full_outbox() {
    let mut ep = Engine::new(EngineConfig::default());
    assert_eq!(
        ep.gsi_send(mapped(9), 0, &[]),
        Err(VerbsError::MadLength { len: 0, max: 256 })
    );
    assert_eq!(
        ep.gsi_send(mapped(9), 0, &[0; MAD_LEN + 1]),
        Err(VerbsError::MadLength { len: 257, max: 256 })
    );
    assert!(matches!(
        ep.gsi_send(mapped(9), 2, &a_mad(0)),
        Err(VerbsError::BadSgidIndex { index: 2, .. })
    ));
    for i in 0..GSI_OUTBOX_LEN {
        ep.gsi_send(mapped(9), 0, &a_mad(i as u8)).unwrap();
    }
    assert!(matches!(
        ep.gsi_send(mapped(9), 0, &a_mad(0)),
        Err(VerbsError::QueueFull { .. })
    ));
    let mut buf = vec![0u8; ep.max_packet_len()];
    let mut sent = 0;
    while ep.poll_transmit(0, &mut buf, &NoMemory).is_some() {
        sent += 1;
        assert!(sent <= GSI_OUTBOX_LEN);
    }
    assert_eq!(sent, GSI_OUTBOX_LEN);
    ep.gsi_send(mapped(9), 0, &a_mad(0)).unwrap();
}

/// IBTA 13.5 (QP0 and QP1 are the management QPs): `create_qp` never hands out 0 or 1,
/// whatever `first_qpn` says, and not after the 24-bit QPN space wraps either.
#[test]
fn create_qp_never_returns_qpn_0_or_1() {
    for first_qpn in [0, 1, 0xFF_FFFE, 0xFF_FFFF, u32::MAX] {
        let mut ep = Engine::new(EngineConfig {
            first_qpn,
            ..EngineConfig::default()
        });
        for _ in 0..4 {
            let qpn = ep.create_qp(QpInit::new(QpType::Ud)).unwrap();
            assert!(
                (2..0xFF_FFFF).contains(&qpn),
                "first_qpn {first_qpn:#x} gave QPN {qpn:#x}"
            );
        }
    }
}

/// A QPN range (one process's share of an address): every QPN `create_qp` hands out lies
/// in it, numbers are reused once destroyed, and a full range refuses the next QP with
/// `TooManyObjects` (`ENOMEM`, as the kernel's QPN allocator); 0, 1 and 0xFFFFFF stay out
/// of the first and last ranges.
#[test]
fn create_qp_stays_inside_its_qpn_range() {
    use softverbs_proto::{Object, QpnRange, VerbsError};
    for (range, first_qpn, usable) in [
        (0x3_0000..0x3_0010, 0x11, 0x3_0000..0x3_0010),
        (0..0x10, 0x11, 2..0x10),
        (0xFF_FFF0..0x100_0000, 0x11, 0xFF_FFF0..0xFF_FFFF),
        (0x3_0000..0x3_0010, 0x3_0008, 0x3_0000..0x3_0010),
    ] {
        let size = usable.end - usable.start;
        let mut ep = Engine::new(EngineConfig {
            first_qpn,
            qpn_range: QpnRange::from(range.clone()),
            ..EngineConfig::default()
        });
        let mut qpns = Vec::new();
        for _ in 0..size {
            let qpn = ep.create_qp(QpInit::new(QpType::Rc)).unwrap();
            assert!(usable.contains(&qpn), "{range:x?} gave QPN {qpn:#x}");
            qpns.push(qpn);
        }
        qpns.sort_unstable();
        qpns.dedup();
        assert_eq!(qpns.len() as u32, size);
        assert_eq!(
            ep.create_qp(QpInit::new(QpType::Rc)),
            Err(VerbsError::TooManyObjects {
                object: Object::Qp,
                max: size
            })
        );
        ep.destroy_qp(qpns[3]).unwrap();
        assert_eq!(ep.create_qp(QpInit::new(QpType::Ud)), Ok(qpns[3]));
    }
}
