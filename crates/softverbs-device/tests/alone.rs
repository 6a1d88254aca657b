//! A device with a transport alone in its process (this test binary holds one test, so one
//! device): the packets of a QP connected to another QP of the same device are handed over
//! in memory, as between any two devices of one process, without the registry of devices
//! being looked at; none goes through the socket.

mod common;

use common::rc::{connect_to, recv_wr, send_wr, side, wait_for};
use softverbs_cq::WcOpcode;
use softverbs_device::{DeviceConfig, UdpConfig};
use softverbs_proto::Mtu;
use std::net::{IpAddr, Ipv4Addr};

#[test]
fn a_device_alone_in_its_process_hands_its_own_qps_packets_over_in_memory() {
    let a = side(DeviceConfig::udp(UdpConfig {
        address: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 211))),
        port: 0,
        ..UdpConfig::default()
    }));
    // An RC QP connected to itself (IBTA allows any QP of the fabric as the destination,
    // this one included): its SEND consumes its own receive.
    let gid = a.device.gid(0).unwrap().0;
    connect_to(&a, gid, a.qpn, 0, Mtu::Mtu1024);
    const MESSAGES: u64 = 8;
    for i in 0..MESSAGES {
        a.device.post_recv(a.qpn, recv_wr(&a, i)).unwrap();
        a.device.post_send(a.qpn, send_wr(&a, i)).unwrap();
        let wcs = wait_for(&a, 2);
        let opcodes: Vec<_> = wcs
            .iter()
            .map(|wc| wc.result().ok().map(|done| done.opcode()))
            .collect();
        assert!(
            opcodes.contains(&Some(WcOpcode::Send)) && opcodes.contains(&Some(WcOpcode::Recv)),
            "{wcs:?}"
        );
    }
    let counters = a.device.transport_counters().unwrap();
    assert_eq!(
        (counters.sent_packets, counters.received_packets),
        (0, 0),
        "the packets went through the transport: {counters}"
    );
}
