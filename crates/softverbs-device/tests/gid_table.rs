//! Every entry of the GID table reaches a softverbs peer (issue #17): the table is laid out
//! as kernel rxe lays it out (index 0 the IPv6 link-local GID, here `fe80::ffff:a.b.c.d`
//! made from the device's address; index 1 `::ffff:a.b.c.d`), and programs pass either
//! index (`ibv_rc_pingpong -g 0`, the old habit, or `-g 1`, rxe's IPv4 RoCEv2 entry). A QP
//! whose `sgid_index` is 0 or 1 and whose path is the peer's GID 0 or 1 exchanges traffic
//! over UDP with the peer, and the path check (IBTA 9.6.1.5) still admits the peer's
//! address only: a path through a link-local GID is the address it was made from.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use common::rc::{connect_through, side, wait_for, Side};
use softverbs_device::{DeviceConfig, UdpConfig};
use softverbs_proto::{DropReason, QpState, RecvWr, SendOp, SendWr, Sge};

fn udp_side(last: u8) -> Side {
    let side = side(DeviceConfig::udp(UdpConfig {
        address: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))),
        ..UdpConfig::default()
    }));
    // Through the sockets, as between two processes.
    side.device.set_in_process_shortcut(false);
    side
}

fn sge(side: &Side, offset: usize, len: u32) -> Sge {
    Sge {
        addr: side.buf.as_ptr() as u64 + offset as u64,
        length: len,
        lkey: side.lkey,
    }
}

#[test]
fn the_table_is_the_link_local_gid_then_the_address() {
    let a = udp_side(241);
    let gids: Vec<String> = a.device.gid_table().iter().map(|g| g.to_string()).collect();
    assert_eq!(gids, ["fe80::ffff:7f00:f1", "::ffff:127.0.0.241"]);
    assert_eq!(a.device.port_attr().gid_tbl_len, 2);
    assert_eq!(a.device.gid(2), None);
}

#[test]
fn qps_on_gid_index_0_or_1_exchange_sends_over_udp_in_every_combination() {
    for (n, (a_gid, b_gid)) in [(0, 0), (1, 1), (0, 1), (1, 0)].into_iter().enumerate() {
        let a = udp_side(242 + 2 * n as u8);
        let b = udp_side(243 + 2 * n as u8);
        connect_through(&a, &b, a_gid, b_gid);
        let what = format!("a on GID {a_gid}, b on GID {b_gid}");
        for (me, peer, id) in [(&a, &b, 1), (&b, &a, 2)] {
            peer.device
                .post_recv(
                    peer.qpn,
                    RecvWr {
                        wr_id: id,
                        sg_list: [sge(peer, 4096, 64)].into(),
                    },
                )
                .unwrap();
            me.device
                .post_send(me.qpn, SendWr::new(id, SendOp::Send, vec![sge(me, 0, 32)]))
                .unwrap();
        }
        for side in [&a, &b] {
            let wcs = wait_for(side, 2);
            assert!(wcs.iter().all(|wc| wc.result().is_ok()), "{what}: {wcs:?}");
            assert_eq!(side.device.qp_state(side.qpn), Some(QpState::Rts), "{what}");
            assert_eq!(
                side.device.counters().drops(DropReason::OffPath),
                0,
                "{what}: the peer's packets were taken as off its path"
            );
            // Its SEND and its ACK of the peer's. The ACK may still be on its way into the
            // socket when the completions show: a run pushes its completions before it
            // sends what it produced (the ACK of a batch goes out with the batch's others).
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut sent = side.device.transport_counters().unwrap().sent_packets;
            while sent < 2 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
                sent = side.device.transport_counters().unwrap().sent_packets;
            }
            assert!(sent >= 2, "{what}: {sent} packets through the socket");
        }
    }
}
