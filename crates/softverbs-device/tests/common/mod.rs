//! Helpers shared by the transport tests: IB transport packets of several opcodes built
//! with `softverbs_wire::PacketRepr`, and bounded waiting.

#![allow(dead_code)]

pub mod rc;

use std::time::Duration;

use softverbs_device::{Endpoint, Received, Transport};
use softverbs_wire::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Opcode, PacketRepr,
    Psn, Qpn, RethRepr,
};

/// Longest any test waits for one packet.
pub const PATIENCE: Duration = Duration::from_secs(5);

/// A BTH for `opcode` to QP 0x11 with `psn`.
pub fn bth(opcode: Opcode, psn: u32) -> BthRepr {
    BthRepr {
        opcode,
        dest_qp: Qpn::new(0x11),
        psn: Psn::new(psn),
        ack_req: opcode.info().is_some_and(|info| info.position.is_last()),
        ..BthRepr::default()
    }
}

/// Emits `repr` with `payload`, ICRC left zero (the transport fills it).
pub fn emit(repr: &PacketRepr, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; repr.buffer_len(payload.len())];
    let len = repr.emit(payload, &mut buf).expect("emit");
    buf.truncate(len);
    buf
}

/// An RC SEND ONLY with `psn` and `payload`.
pub fn send_only(psn: u32, payload: &[u8]) -> Vec<u8> {
    emit(
        &PacketRepr {
            bth: bth(Opcode::RC_SEND_ONLY, psn),
            ..PacketRepr::default()
        },
        payload,
    )
}

/// One packet of each of several opcodes (requests and responses, RC and UD), with PSNs
/// 100, 101, …: (repr, payload, the opcode line `tshark -V` prints for it).
pub fn sample_packets() -> Vec<(PacketRepr, Vec<u8>, &'static str)> {
    let reth = RethRepr {
        va: 0x0000_55f4_e59c_edb0,
        rkey: 0x0001_350d,
        dma_len: 22,
    };
    let ack = AethRepr {
        syndrome: AethSyndrome::Ack { credits: 31 },
        msn: 1,
    };
    let packets = vec![
        (
            PacketRepr {
                bth: bth(Opcode::RC_SEND_ONLY, 0),
                ..PacketRepr::default()
            },
            b"hello, RoCEv2".to_vec(),
            "Reliable Connection (RC) - SEND Only (4)",
        ),
        (
            PacketRepr {
                bth: bth(Opcode::RC_ACKNOWLEDGE, 0),
                aeth: Some(ack),
                ..PacketRepr::default()
            },
            Vec::new(),
            "Reliable Connection (RC) - Acknowledge (17)",
        ),
        (
            PacketRepr {
                bth: bth(Opcode::RC_RDMA_WRITE_ONLY, 0),
                reth: Some(reth),
                ..PacketRepr::default()
            },
            b"textstringdoghhhhhghgg".to_vec(),
            "Reliable Connection (RC) - RDMA WRITE Only (10)",
        ),
        (
            PacketRepr {
                bth: bth(Opcode::RC_RDMA_READ_REQUEST, 0),
                reth: Some(reth),
                ..PacketRepr::default()
            },
            Vec::new(),
            "Reliable Connection (RC) - RDMA READ Request (12)",
        ),
        (
            PacketRepr {
                bth: bth(Opcode::RC_RDMA_READ_RESPONSE_ONLY, 0),
                aeth: Some(ack),
                ..PacketRepr::default()
            },
            b"textstringdoghhhhhghgg".to_vec(),
            "Reliable Connection (RC) - RDMA READ response Only (16)",
        ),
        (
            PacketRepr {
                bth: bth(Opcode::RC_COMPARE_SWAP, 0),
                atomic_eth: Some(AtomicEthRepr {
                    va: 0x1000,
                    rkey: 0x77,
                    swap_add: 5,
                    compare: 4,
                }),
                ..PacketRepr::default()
            },
            Vec::new(),
            "Reliable Connection (RC) - CmpSwap (19)",
        ),
        (
            PacketRepr {
                bth: bth(Opcode::RC_ATOMIC_ACKNOWLEDGE, 0),
                aeth: Some(ack),
                atomic_ack_eth: Some(AtomicAckEthRepr { orig: 4 }),
                ..PacketRepr::default()
            },
            Vec::new(),
            "Reliable Connection (RC) - ATOMIC Acknowledge (18)",
        ),
        (
            PacketRepr {
                bth: bth(Opcode::RC_SEND_ONLY_WITH_IMMEDIATE, 0),
                immdt: Some(0x1234_5678),
                ..PacketRepr::default()
            },
            b"imm".to_vec(),
            "Reliable Connection (RC) - SEND Only with Immediate (5)",
        ),
        (
            PacketRepr {
                bth: BthRepr {
                    dest_qp: Qpn::new(0x33),
                    ..bth(Opcode::UD_SEND_ONLY, 0)
                },
                deth: Some(DethRepr {
                    qkey: 0x8001_0000,
                    src_qp: Qpn::new(0x22),
                }),
                ..PacketRepr::default()
            },
            vec![0xAB; 40],
            "Unreliable Datagram (UD) - SEND only (100)",
        ),
    ];
    packets
        .into_iter()
        .enumerate()
        .map(|(i, (mut repr, payload, name))| {
            repr.bth.psn = Psn::new(100 + i as u32);
            (repr, payload, name)
        })
        .collect()
}

/// Receives one packet within [`PATIENCE`], panicking with `what` otherwise.
pub fn recv_one(transport: &impl Transport, buf: &mut [u8], what: &str) -> Received {
    transport
        .recv(buf, Some(PATIENCE))
        .unwrap_or_else(|error| panic!("{what}: recv failed: {error}"))
        .unwrap_or_else(|| panic!("{what}: nothing received within {PATIENCE:?}"))
}

/// Sends `packet` from `from` to `to` with source port hint 0xC000 and returns its bytes
/// as transmitted (ICRC filled).
pub fn send(from: &impl Transport, to: &Endpoint, mut packet: Vec<u8>) -> Vec<u8> {
    from.send(to, 0xC000, &mut packet).expect("send");
    packet
}

/// A UDP device on 127.0.0.`last` (shared memory on, whatever the environment says).
pub fn shm_device_at(last: u8) -> softverbs_device::Device {
    use softverbs_device::{Device, DeviceConfig, UdpConfig};
    use std::net::{IpAddr, Ipv4Addr};
    Device::open(DeviceConfig::udp(UdpConfig {
        address: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))),
        ..UdpConfig::default()
    }))
    .expect("open a UDP device with shared memory")
}

/// The inbox files in /dev/shm of the devices on 127.0.0.`last`, port 4791.
pub fn inboxes_of(last: u8) -> Vec<String> {
    let tail = format!("-127.0.0.{last}-4791-s");
    std::fs::read_dir("/dev/shm")
        .expect("/dev/shm")
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| name.starts_with("softverbs-") && name.contains(&tail))
        .collect()
}

/// This test binary again, running only `test`, with `var` set to `value` (how a test
/// starts the child process it plays both sides of) and the device's network left to its
/// default (shared memory on).
pub fn this_test_again(test: &str, var: &str, value: &str) -> std::process::Command {
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(var, value)
        .env_remove("SOFTVERBS_NETWORK");
    command
}
