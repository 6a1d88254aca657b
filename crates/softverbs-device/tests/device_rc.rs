//! The device end to end: two devices, RC queue pairs connected as `ibv_rc_pingpong` does
//! (reference §4.2), real CQs, every opcode, in-process and over UDP on 127.0.0.x.

mod common;

use common::rc::{connect, side, wait_for, Side};
use softverbs_cq::{WcOpcode, WcStatus};
use softverbs_device::{DeviceConfig, Network, UdpConfig};
use softverbs_proto::{QpState, RecvWr, SendFlags, SendOp, SendWr, Sge};

fn sge(side: &Side, offset: usize, len: u32) -> Sge {
    Sge {
        addr: side.buf.as_ptr() as u64 + offset as u64,
        length: len,
        lkey: side.lkey,
    }
}

fn exercise(a: &mut Side, b: &mut Side) {
    connect(a, b);
    // SEND → RECV, with immediate.
    b.device
        .post_recv(
            b.qpn,
            RecvWr {
                wr_id: 7,
                sg_list: [sge(b, 0, 4096)].into(),
            },
        )
        .unwrap();
    a.buf[..5].copy_from_slice(b"hello");
    a.device
        .post_send(
            a.qpn,
            SendWr::new(1, SendOp::SendWithImm { imm: 0xabcd }, vec![sge(a, 0, 5)]),
        )
        .unwrap();
    let recv = wait_for(b, 1);
    let done = recv[0].result().expect("receive succeeded");
    assert_eq!(done.opcode(), WcOpcode::Recv);
    assert_eq!(done.byte_len(), 5);
    assert_eq!(done.imm_data(), Some(0xabcd));
    assert_eq!(&b.buf[..5], b"hello");
    let sent = wait_for(a, 1);
    assert_eq!(sent[0].status(), WcStatus::Success);
    assert_eq!(sent[0].wr_id(), 1);

    // RDMA WRITE of several MTUs, then READ it back.
    for (i, byte) in a.buf[8192..8192 + 5000].iter_mut().enumerate() {
        *byte = (i % 251) as u8;
    }
    let remote = b.buf.as_ptr() as u64 + 16384;
    a.device
        .post_send(
            a.qpn,
            SendWr::new(
                2,
                SendOp::RdmaWrite {
                    remote_addr: remote,
                    rkey: b.rkey,
                },
                vec![sge(a, 8192, 5000)],
            ),
        )
        .unwrap();
    let w = wait_for(a, 1);
    assert_eq!(w[0].result().unwrap().opcode(), WcOpcode::RdmaWrite);
    assert_eq!(&b.buf[16384..16384 + 5000], &a.buf[8192..8192 + 5000]);
    a.device
        .post_send(
            a.qpn,
            SendWr::new(
                3,
                SendOp::RdmaRead {
                    remote_addr: remote,
                    rkey: b.rkey,
                },
                vec![sge(a, 32768, 5000)],
            ),
        )
        .unwrap();
    let r = wait_for(a, 1);
    let read = r[0].result().unwrap();
    assert_eq!(read.opcode(), WcOpcode::RdmaRead);
    assert_eq!(read.byte_len(), 5000);
    assert_eq!(&a.buf[32768..32768 + 5000], &a.buf[8192..8192 + 5000]);

    // Atomics on an aligned word of B.
    let word = (b.buf.as_ptr() as u64 + 40960 + 7) & !7;
    a.device
        .post_send(
            a.qpn,
            SendWr::new(
                4,
                SendOp::FetchAdd {
                    remote_addr: word,
                    rkey: b.rkey,
                    add: 5,
                },
                vec![sge(a, 48, 8)],
            ),
        )
        .unwrap();
    a.device
        .post_send(
            a.qpn,
            SendWr::new(
                5,
                SendOp::CompareSwap {
                    remote_addr: word,
                    rkey: b.rkey,
                    compare: 5,
                    swap: 42,
                },
                vec![sge(a, 56, 8)],
            ),
        )
        .unwrap();
    let atomics = wait_for(a, 2);
    assert_eq!(atomics[0].result().unwrap().opcode(), WcOpcode::FetchAdd);
    assert_eq!(atomics[1].result().unwrap().opcode(), WcOpcode::CompSwap);
    assert_eq!(u64::from_ne_bytes(a.buf[48..56].try_into().unwrap()), 0);
    assert_eq!(u64::from_ne_bytes(a.buf[56..64].try_into().unwrap()), 5);
    let offset = (word - b.buf.as_ptr() as u64) as usize;
    assert_eq!(
        u64::from_ne_bytes(b.buf[offset..offset + 8].try_into().unwrap()),
        42
    );

    // A remote write with a bad rkey: REM_ACCESS_ERR, then the QP is in error.
    a.device
        .post_send(
            a.qpn,
            SendWr::new(
                6,
                SendOp::RdmaWrite {
                    remote_addr: remote,
                    rkey: b.rkey ^ 0x5a5a,
                },
                vec![sge(a, 0, 8)],
            )
            .with_flags(SendFlags::SIGNALED),
        )
        .unwrap();
    let err = wait_for(a, 1);
    assert_eq!(err[0].status(), WcStatus::RemAccessErr);
    assert_eq!(a.device.qp_state(a.qpn), Some(QpState::Err));
}

#[test]
fn rc_between_two_in_process_devices_completes_every_opcode() {
    let mut a = side(DeviceConfig::in_process());
    let mut b = side(DeviceConfig::in_process());
    exercise(&mut a, &mut b);
}

#[test]
fn rc_over_udp_on_loopback_completes_every_opcode() {
    // Two devices on distinct 127.0.0.x addresses with the in-process shortcut off, so
    // every packet crosses the kernel's UDP path as RoCEv2.
    let udp = |last: u8| DeviceConfig {
        name: format!("softverbs-udp{last}"),
        network: Network::Udp(UdpConfig {
            address: Some(std::net::IpAddr::V4(std::net::Ipv4Addr::new(
                127, 0, 0, last,
            ))),
            ..UdpConfig::default()
        }),
        engine: Default::default(),
        progress_thread: true,
        faults: None,
        capture: None,
        shared_memory: true,
    };
    let mut a = side(udp(201));
    let mut b = side(udp(202));
    a.device.set_in_process_shortcut(false);
    b.device.set_in_process_shortcut(false);
    exercise(&mut a, &mut b);
    let counters = a.device.transport_counters().unwrap();
    assert!(counters.sent_packets > 0);
}

#[test]
fn rc_over_udp_recovers_from_injected_loss_and_the_capture_records_it() {
    // IBTA 9.7.5.1 (go-back-N): with 30 % of A's packets dropped and 5 % duplicated on the
    // way out, every operation still completes once with intact data; the drops are counted
    // and the capture holds exactly what reached the socket.
    let dir = std::env::temp_dir().join(format!("softverbs-capture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("lossy.pcap");
    let faults = softverbs_device::parse_faults("drop=0.3,duplicate=0.05,seed=11").unwrap();
    let capture = softverbs_device::Capture::create(&path).unwrap();
    let udp = |last: u8| {
        DeviceConfig::udp(UdpConfig {
            address: Some(std::net::IpAddr::V4(std::net::Ipv4Addr::new(
                127, 0, 0, last,
            ))),
            ..UdpConfig::default()
        })
    };
    let mut a = side(DeviceConfig {
        faults: Some(faults.clone()),
        capture: Some(capture.clone()),
        ..udp(203)
    });
    let mut b = side(udp(204));
    a.device.set_in_process_shortcut(false);
    b.device.set_in_process_shortcut(false);
    exercise(&mut a, &mut b);
    let faults = a.device.fault_counters().unwrap();
    assert!(faults.dropped > 0, "{faults:?}");
    capture.flush().unwrap();
    let records = softverbs_device::pcap::read_capture(&path).unwrap();
    let sent = records
        .iter()
        .filter(|r| r.direction == softverbs_device::Direction::Outbound)
        .count() as u64;
    assert_eq!(sent, faults.packets - faults.dropped + faults.duplicated);
    assert!(records.iter().all(|r| r.packet.is_ok() && r.icrc.is_ok()));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// IBTA 10.6.6 (and rxe's `rxe_invalidate_mr`): only memory windows and fast-registered
/// regions can be invalidated. SEND WITH INVALIDATE naming the R_Key of an ordinary
/// `ibv_reg_mr` region is an invalid request: the requester gets `REM_INV_REQ_ERR`, the
/// receive is not completed as a success, and the region keeps its R_Key.
#[test]
fn send_with_invalidate_of_an_ordinary_region_is_refused_with_rem_inv_req_err() {
    let a = side(DeviceConfig::in_process());
    let b = side(DeviceConfig::in_process());
    connect(&a, &b);
    b.device
        .post_recv(
            b.qpn,
            RecvWr {
                wr_id: 3,
                sg_list: [sge(&b, 0, 64)].into(),
            },
        )
        .unwrap();
    a.device
        .post_send(
            a.qpn,
            SendWr::new(
                4,
                SendOp::SendWithInv {
                    invalidate_rkey: b.rkey,
                },
                vec![sge(&a, 0, 8)],
            ),
        )
        .unwrap();
    let sent = wait_for(&a, 1);
    assert_eq!(sent[0].status(), WcStatus::RemInvReqErr, "{sent:?}");
    let received = wait_for(&b, 1);
    assert_eq!(received[0].status(), WcStatus::RemInvReqErr, "{received:?}");
    let region = b
        .device
        .dereg_mr(b.lkey)
        .expect("the region is still registered");
    assert_eq!(region.rkey, b.rkey);
}
