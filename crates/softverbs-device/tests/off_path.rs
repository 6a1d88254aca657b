//! Attacks from off the path: an injector on another 127.0.0.x address, sending RoCEv2
//! packets with a correct ICRC, the right QPN, the right PSN and the right R_Key, at an
//! RC connection between two devices. IBTA vol. 1 9.6.1.5 (header validation: a
//! connected QP accepts packets only from its remote address; rxe's `check_addr`): every
//! forged request, response, ACK or NAK is dropped and counted as `off_path`, the target
//! memory is unchanged, no completion appears, the QPs stay in RTS, and the legitimate
//! traffic that follows is unharmed (the forged packets moved no PSN).

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use common::rc::{connect, side, side_of, wait_for, Side, FIRST_PSN};
use softverbs_cq::{WcOpcode, WcStatus, WorkCompletion};
use softverbs_device::{DeviceConfig, Endpoint, Transport, UdpConfig, UdpTransport};
use softverbs_proto::{DropReason, QpState, QpType, RecvWr, SendOp, SendWr, Sge};
use softverbs_wire::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, BthRepr, NakCode, Opcode, PacketRepr,
    Psn, Qpn, RethRepr,
};

fn address(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

fn udp_side(last: u8) -> Side {
    side(DeviceConfig::udp(UdpConfig {
        address: Some(address(last)),
        ..UdpConfig::default()
    }))
}

/// The injector: a RoCEv2 endpoint of its own on `last` (any UDP source port), which
/// computes a correct ICRC for every packet it sends.
fn injector(last: u8) -> UdpTransport {
    UdpTransport::bind(UdpConfig {
        address: Some(address(last)),
        port: 0,
        ..UdpConfig::default()
    })
    .unwrap_or_else(|e| panic!("cannot bind the injector on 127.0.0.{last}: {e}"))
}

fn forge(to: &Side, opcode: Opcode, psn: u32) -> PacketRepr {
    PacketRepr {
        bth: BthRepr {
            opcode,
            dest_qp: Qpn::new(to.qpn),
            psn: Psn::new(psn),
            ack_req: true,
            ..BthRepr::default()
        },
        ..PacketRepr::default()
    }
}

fn inject(from: &UdpTransport, to: &Side, repr: &PacketRepr, payload: &[u8]) {
    let mut bytes = vec![0u8; repr.buffer_len(payload.len())];
    let len = repr.emit(payload, &mut bytes).expect("emit");
    bytes.truncate(len);
    from.send(&Endpoint::rocev2(to.device.address()), 0xC123, &mut bytes)
        .expect("the injector sends");
}

/// Waits (bounded) until `side` counted `n` off-path drops.
fn wait_off_path(side: &Side, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let dropped = side.device.counters().drops(DropReason::OffPath);
        if dropped >= n {
            assert_eq!(dropped, n, "{}", side.device.counters());
            return;
        }
        assert!(
            Instant::now() < deadline,
            "stuck: {dropped} of {n} off-path drops ({})",
            side.device.counters()
        );
        side.device.progress();
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn no_completion(side: &Side) {
    let mut wcs = [WorkCompletion::default(); 4];
    side.device.progress();
    assert_eq!(side.cq.poll(&mut wcs).unwrap(), 0, "{:?}", &wcs[..1]);
}

fn sge(side: &Side, offset: usize, len: u32) -> Sge {
    Sge {
        addr: side.buf.as_ptr() as u64 + offset as u64,
        length: len,
        lkey: side.lkey,
    }
}

fn read_buf(side: &Side, range: std::ops::Range<usize>) -> Vec<u8> {
    // The device writes `buf` through its registration; read it back the same way a
    // poller of registered memory would, after the completion that covers it.
    side.buf[range].to_vec()
}

#[test]
fn forged_rc_requests_from_another_address_are_dropped_and_touch_nothing() {
    let a = udp_side(211);
    let b = udp_side(212);
    connect(&a, &b);
    let attacker = injector(219);
    b.device
        .post_recv(
            b.qpn,
            RecvWr {
                wr_id: 1,
                sg_list: [sge(&b, 4096, 64)].into(),
            },
        )
        .unwrap();
    let target = b.buf.as_ptr() as u64;
    let before = read_buf(&b, 0..8192);

    // RDMA WRITE ONLY with the right QPN, PSN and R_Key.
    let mut write = forge(&b, Opcode::RC_RDMA_WRITE_ONLY, FIRST_PSN);
    write.reth = Some(RethRepr {
        va: target,
        rkey: b.rkey,
        dma_len: 8,
    });
    inject(&attacker, &b, &write, &[0xee; 8]);
    // SEND ONLY into the posted receive.
    inject(
        &attacker,
        &b,
        &forge(&b, Opcode::RC_SEND_ONLY, FIRST_PSN),
        b"forged",
    );
    // RDMA READ REQUEST: the responder must not answer (no data leaves to the attacker).
    let mut read = forge(&b, Opcode::RC_RDMA_READ_REQUEST, FIRST_PSN);
    read.reth = Some(RethRepr {
        va: target,
        rkey: b.rkey,
        dma_len: 64,
    });
    inject(&attacker, &b, &read, &[]);
    // FETCH AND ADD on the first word.
    let mut fetch_add = forge(&b, Opcode::RC_FETCH_ADD, FIRST_PSN);
    fetch_add.atomic_eth = Some(AtomicEthRepr {
        va: target,
        rkey: b.rkey,
        swap_add: 0x0101_0101,
        compare: 0,
    });
    inject(&attacker, &b, &fetch_add, &[]);
    // A sweep of PSNs, as an attacker who knows only the QPN would send.
    for psn in (0..1u32 << 24).step_by(1 << 20) {
        inject(
            &attacker,
            &b,
            &forge(&b, Opcode::RC_SEND_ONLY, psn),
            b"sweep",
        );
    }

    wait_off_path(&b, 4 + 16);
    // SOFTVERBS_STATS prints the counters this way: the reason is named.
    let stats = b.device.counters().to_string();
    assert!(stats.contains("dropped_off_path=20"), "{stats}");
    assert_eq!(
        read_buf(&b, 0..8192),
        before,
        "forged packets changed memory"
    );
    no_completion(&b);
    assert_eq!(b.device.qp_state(b.qpn), Some(QpState::Rts));
    let mut buf = [0u8; 256];
    assert!(
        attacker
            .recv(&mut buf, Some(Duration::from_millis(200)))
            .unwrap()
            .is_none(),
        "the victim answered the attacker"
    );

    // The real peer's traffic starts at the PSN the forged packets claimed.
    a.device
        .post_send(
            a.qpn,
            SendWr::new(
                10,
                SendOp::RdmaWrite {
                    remote_addr: target,
                    rkey: b.rkey,
                },
                vec![sge(&a, 0, 8)],
            ),
        )
        .unwrap();
    a.device
        .post_send(a.qpn, SendWr::new(11, SendOp::Send, vec![sge(&a, 8, 5)]))
        .unwrap();
    let sent = wait_for(&a, 2);
    assert!(
        sent.iter().all(|wc| wc.status() == WcStatus::Success),
        "{sent:?}"
    );
    let received = wait_for(&b, 1);
    let done = received[0].result().expect("the real SEND is received");
    assert_eq!(done.opcode(), WcOpcode::Recv);
    assert_eq!(done.byte_len(), 5, "the real SEND, not the forged one");
}

#[test]
fn forged_acks_and_naks_to_the_requester_are_dropped() {
    let a = udp_side(213);
    let b = udp_side(214);
    connect(&a, &b);
    let attacker = injector(220);
    // A NAK (remote access error) and an ACK for the PSN a's next request takes, and an
    // atomic ACK: accepted, they would fail or complete a's work early.
    let mut nak = forge(&a, Opcode::RC_ACKNOWLEDGE, FIRST_PSN);
    nak.aeth = Some(AethRepr {
        syndrome: AethSyndrome::Nak(NakCode::RemoteAccessError),
        msn: 0,
    });
    inject(&attacker, &a, &nak, &[]);
    let mut ack = forge(&a, Opcode::RC_ACKNOWLEDGE, FIRST_PSN);
    ack.aeth = Some(AethRepr {
        syndrome: AethSyndrome::Ack { credits: 31 },
        msn: 1,
    });
    inject(&attacker, &a, &ack, &[]);
    let mut atomic_ack = forge(&a, Opcode::RC_ATOMIC_ACKNOWLEDGE, FIRST_PSN);
    atomic_ack.aeth = ack.aeth;
    atomic_ack.atomic_ack_eth = Some(AtomicAckEthRepr { orig: 0xdead });
    inject(&attacker, &a, &atomic_ack, &[]);
    wait_off_path(&a, 3);
    no_completion(&a);
    assert_eq!(a.device.qp_state(a.qpn), Some(QpState::Rts));

    a.device
        .post_send(
            a.qpn,
            SendWr::new(
                20,
                SendOp::RdmaWrite {
                    remote_addr: b.buf.as_ptr() as u64 + 100,
                    rkey: b.rkey,
                },
                vec![sge(&a, 0, 16)],
            ),
        )
        .unwrap();
    let done = wait_for(&a, 1);
    assert_eq!(done[0].status(), WcStatus::Success, "{done:?}");
    assert_eq!(done[0].wr_id(), 20);
}

/// UC (IBTA 9.6.1.5 applies to every connected QP): a forged SEND ONLY and RDMA WRITE ONLY
/// with far-away PSNs from another address neither deliver nor move the expected PSN; the
/// peer's messages that follow are all delivered, in order (before the path check, two
/// such packets stalled `ibv_uc_pingpong`).
#[test]
fn forged_uc_packets_from_another_address_are_dropped_and_the_peer_goes_on() {
    let udp = |last| {
        side_of(
            DeviceConfig::udp(UdpConfig {
                address: Some(address(last)),
                ..UdpConfig::default()
            }),
            QpType::Uc,
        )
    };
    let a = udp(217);
    let b = udp(218);
    connect(&a, &b);
    let attacker = injector(221);
    for wr_id in 0..3 {
        b.device
            .post_recv(
                b.qpn,
                RecvWr {
                    wr_id,
                    sg_list: [sge(&b, 4096 + 64 * wr_id as usize, 64)].into(),
                },
            )
            .unwrap();
    }
    let before = read_buf(&b, 0..8192);
    for psn in [FIRST_PSN + 0x40_0000, FIRST_PSN + 0x80_0000] {
        inject(
            &attacker,
            &b,
            &forge(&b, Opcode::UC_SEND_ONLY, psn),
            b"forged",
        );
        let mut write = forge(&b, Opcode::UC_RDMA_WRITE_ONLY, psn + 1);
        write.reth = Some(RethRepr {
            va: b.buf.as_ptr() as u64,
            rkey: b.rkey,
            dma_len: 8,
        });
        inject(&attacker, &b, &write, &[0xee; 8]);
    }
    wait_off_path(&b, 4);
    assert_eq!(
        read_buf(&b, 0..8192),
        before,
        "forged packets changed memory"
    );
    no_completion(&b);
    for (wr_id, len) in [(30, 3u32), (31, 5), (32, 7)] {
        a.device
            .post_send(
                a.qpn,
                SendWr::new(wr_id, SendOp::Send, vec![sge(&a, 0, len)]),
            )
            .unwrap();
    }
    let received = wait_for(&b, 3);
    let lens: Vec<u32> = received
        .iter()
        .map(|wc| wc.result().expect("delivered").byte_len())
        .collect();
    assert_eq!(lens, [3, 5, 7], "the peer's messages, in order");
}
