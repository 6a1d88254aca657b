//! UD multicast through the safe API (`ibv_attach_mcast(3)`, IBTA 10.5.2.2 and Annex A17:
//! a multicast GID is an IP multicast address, the packet goes to QPN 0xFFFFFF): a datagram
//! sent to a group reaches every QP attached to it — on devices of this process and in
//! other processes, over UDP — and no QP that is not attached or has detached; the GRH area
//! of each receive names the group as the destination.

mod common;

use common::*;
use softverbs::*;
use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const QKEY: u32 = 0x0b0b_0000;

/// The child role of the several-process test: the last octet of its device's address.
const CHILD_ENV: &str = "SOFTVERBS_TEST_MCAST_CHILD";

fn ud_side(ctx: Context) -> Side {
    let s = side(ctx, QpType::Ud);
    s.qp.to_init(InitAttr::default().qkey(QKEY)).unwrap();
    s.qp.to_rtr(RtrAttr::datagram()).unwrap();
    s.qp.to_rts(RtsAttr::new(0)).unwrap();
    s
}

fn group(octets: [u8; 4]) -> Gid {
    Gid::from(Ipv4Addr::from(octets))
}

/// Sends `payload` from `from` to `group` (remote QPN 0xFFFFFF) and waits for the send's
/// completion.
fn send_to_group(from: &Side, group: &Gid, wr_id: u64, payload: &[u8]) {
    let ah = from.pd.create_ah(&AhAttr::new(*group)).unwrap();
    from.qp
        .post_send(SendRequest::send_inline(wr_id, payload).to(&ah, MULTICAST_QPN, QKEY))
        .unwrap();
    assert_eq!(wait_for(&from.cq, 1)[0].status(), WcStatus::Success);
}

/// Waits for `side`'s one receive and checks it: `payload` after the GRH area, whose IPv4
/// header names `group` as the destination and the sender's QP as the source.
fn assert_received(side: &Side, group: [u8; 4], payload: &[u8], src_qp: u32) {
    let wc = wait_for(&side.cq, 1);
    let done = wc[0].result().expect("the multicast datagram is received");
    assert_eq!(done.opcode(), WcOpcode::Recv);
    assert_eq!(done.byte_len() as usize, 40 + payload.len());
    assert_eq!(done.src_qp(), src_qp);
    assert_eq!(done.qp_num(), side.qp.qpn());
    let grh = side.mr.read_vec(0..40 + payload.len()).unwrap();
    assert_eq!(
        &grh[36..40],
        &group,
        "the GRH area's destination is the group"
    );
    assert_eq!(&grh[40..], payload);
}

fn post_receive(side: &Side) {
    side.qp
        .post_recv(RecvRequest::new(7, &[side.mr.slice(0..2048).unwrap()]))
        .unwrap();
}

/// ibv_attach_mcast(3): every QP attached to the group, on every device of this process,
/// gets the datagram; a QP that is not attached does not, nor one that detached
/// (ibv_detach_mcast(3)).
#[test]
fn a_multicast_send_reaches_every_attached_qp_of_the_process_and_no_other() {
    let g = [239, 255, 17, 1];
    let sender = ud_side(in_process());
    let (b, c) = (ud_side(in_process()), ud_side(in_process()));
    let bystander = ud_side(in_process());
    for s in [&b, &c, &bystander] {
        post_receive(s);
    }
    b.qp.attach_mcast(&group(g)).unwrap();
    c.qp.attach_mcast(&group(g)).unwrap();
    c.qp.attach_mcast(&group(g)).unwrap(); // twice: no second copy
    send_to_group(&sender, &group(g), 1, b"hello group");
    assert_received(&b, g, b"hello group", sender.qp.qpn());
    assert_received(&c, g, b"hello group", sender.qp.qpn());
    assert_nothing_for(&bystander.cq, Duration::from_millis(50));
    assert_nothing_for(&c.cq, Duration::from_millis(10));

    c.qp.detach_mcast(&group(g)).unwrap();
    post_receive(&b);
    post_receive(&c);
    send_to_group(&sender, &group(g), 2, b"again");
    assert_received(&b, g, b"again", sender.qp.qpn());
    assert_nothing_for(&c.cq, Duration::from_millis(50));
    assert_nothing_for(&bystander.cq, Duration::from_millis(10));
}

/// The groups' sockets are read with the device socket whatever the receive path: without
/// UDP offload (no GRO arena, `SOFTVERBS_UDP_OFFLOAD=off`) a datagram that arrives for a group
/// while the device socket is empty is handed out too, not dropped with the empty batch.
#[test]
fn a_multicast_datagram_is_received_without_udp_offload_too() {
    let g = [239, 255, 17, 5];
    let without_offload = |last: u8| {
        let config = DeviceConfig {
            name: format!("softverbs-mc{last}"),
            network: Network::Udp(UdpConfig {
                address: Some(Ipv4Addr::new(127, 0, 0, last).into()),
                offload: false,
                ..UdpConfig::default()
            }),
            ..DeviceConfig::in_process()
        };
        let ctx = Context::open_with(config).expect("open a UDP device");
        ctx.device().set_in_process_shortcut(false);
        ud_side(ctx)
    };
    let (sender, receiver) = (without_offload(239), without_offload(240));
    for round in 0..3u64 {
        post_receive(&receiver);
        if round == 0 {
            receiver.qp.attach_mcast(&group(g)).unwrap();
        }
        send_to_group(&sender, &group(g), 10 + round, b"no offload");
        assert_received(&receiver, g, b"no offload", sender.qp.qpn());
    }
}

/// ibv_destroy_qp(3) of a QP still attached to a group is EBUSY (the kernel's
/// `uverbs_free_qp`); detached, it is destroyed. A QP of another type cannot join (EINVAL).
#[test]
fn an_attached_qp_is_not_destroyed_and_only_ud_qps_join() {
    let g = group([239, 255, 17, 2]);
    let s = ud_side(in_process());
    let rc = side(in_process(), QpType::Rc);
    assert_eq!(rc.qp.attach_mcast(&g).unwrap_err().errno(), libc::EINVAL);
    let unicast = Gid::from(Ipv4Addr::new(127, 0, 0, 1));
    assert_eq!(
        s.qp.attach_mcast(&unicast).unwrap_err().errno(),
        libc::EINVAL
    );
    s.qp.attach_mcast(&g).unwrap();
    let Side { qp, .. } = s;
    let (qp, error) = qp.destroy().expect_err("attached");
    assert_eq!(error.errno(), libc::EBUSY);
    qp.detach_mcast(&g).unwrap();
    qp.destroy().expect("detached, it is destroyed");
}

/// Capture on the multicast path (issue #14/#16: a capture shows the RoCEv2 packets): an
/// in-process sender that captures records the datagram to the group's address with a good
/// ICRC, and a receiver that captures records it inbound; both attached receivers get it.
#[test]
fn a_capture_records_the_multicast_datagram_at_the_sender_and_at_a_receiver() {
    use softverbs::core::device::pcap::{read_capture, Capture, Direction};
    let g = [239, 255, 17, 4];
    let dir = std::env::temp_dir().join(format!("softverbs-mcast-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (sender_path, receiver_path) = (dir.join("sender.pcap"), dir.join("receiver.pcap"));
    let with_capture = |capture| {
        Context::open_with(DeviceConfig {
            capture: Some(capture),
            ..DeviceConfig::in_process()
        })
        .unwrap()
    };
    let sender_capture = Capture::create(&sender_path).unwrap();
    let receiver_capture = Capture::create(&receiver_path).unwrap();
    let sender = ud_side(with_capture(sender_capture.clone()));
    let captured = ud_side(with_capture(receiver_capture.clone()));
    let plain = ud_side(in_process());
    for r in [&captured, &plain] {
        post_receive(r);
        r.qp.attach_mcast(&group(g)).unwrap();
    }
    send_to_group(&sender, &group(g), 4, b"seen");
    assert_received(&captured, g, b"seen", sender.qp.qpn());
    assert_received(&plain, g, b"seen", sender.qp.qpn());
    for (capture, path, direction) in [
        (&sender_capture, &sender_path, Direction::Outbound),
        (&receiver_capture, &receiver_path, Direction::Inbound),
    ] {
        capture.flush().unwrap();
        let records = read_capture(path).unwrap();
        let to_group: Vec<_> = records
            .iter()
            .filter(|r| r.to_string().contains("> 239.255.17.4.4791"))
            .collect();
        assert_eq!(to_group.len(), 1, "{records:?}");
        assert_eq!(to_group[0].direction, direction);
        assert!(to_group[0].icrc_ok(), "{}", to_group[0]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The child of the several-process test: a UD QP attached to the group and one that is
/// not, on a UDP device at 127.0.0.`last`; says "ready", then waits (bounded) for one
/// datagram and checks it, and that the other QP got nothing.
fn child(last: u8, g: [u8; 4]) {
    let attached = ud_side(udp(last));
    let bystander = {
        let pd = &attached.pd;
        let qp = pd
            .qp_builder(QpType::Ud, &attached.cq, &attached.cq)
            .build()
            .unwrap();
        qp.to_init(InitAttr::default().qkey(QKEY)).unwrap();
        qp.to_rtr(RtrAttr::datagram()).unwrap();
        qp.to_rts(RtsAttr::new(0)).unwrap();
        qp.post_recv(RecvRequest::new(
            9,
            &[attached.mr.slice(4096..8192).unwrap()],
        ))
        .unwrap();
        qp
    };
    post_receive(&attached);
    attached.qp.attach_mcast(&group(g)).unwrap();
    // libtest may print "test … … " on the same line first.
    println!("\nchild-ready");
    let wc = wait_for(&attached.cq, 1);
    assert_eq!(
        wc[0].qp_num(),
        attached.qp.qpn(),
        "only the attached QP receives"
    );
    let done = wc[0].result().expect("received");
    let grh = attached.mr.read_vec(0..40).unwrap();
    assert_eq!(&grh[36..40], &g);
    let len = done.byte_len() as usize - 40;
    println!(
        "\nchild-got {}",
        String::from_utf8_lossy(&attached.mr.read_vec(40..40 + len).unwrap())
    );
    assert_nothing_for(&attached.cq, Duration::from_millis(100));
    drop(bystander);
}

/// Several receivers in several processes (issue #16, IBTA 10.5.2.2): two child processes
/// and a device of this process attach a UD QP each to one group over UDP on loopback; one
/// send reaches all three, each through its own socket of the group (`SO_REUSEADDR`).
#[test]
fn a_multicast_send_reaches_attached_qps_in_several_processes_over_udp() {
    let g = [239, 255, 17, 3];
    if let Ok(last) = std::env::var(CHILD_ENV) {
        child(last.parse().unwrap(), g);
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<_> = [236u8, 237]
        .iter()
        .map(|last| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "a_multicast_send_reaches_attached_qps_in_several_processes_over_udp",
                    "--test-threads=1",
                    "--nocapture",
                ])
                .env(CHILD_ENV, last.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut outputs: Vec<_> = children
        .iter_mut()
        .map(|c| BufReader::new(c.stdout.take().unwrap()).lines())
        .collect();
    for lines in &mut outputs {
        let ready = lines.find(|l| l.as_deref().is_ok_and(|l| l.ends_with("child-ready")));
        assert!(ready.is_some(), "a child did not get ready");
    }
    let sender = ud_side(udp(235));
    let here = ud_side(udp(238));
    post_receive(&here);
    here.qp.attach_mcast(&group(g)).unwrap();
    send_to_group(&sender, &group(g), 3, b"to three");
    assert_received(&here, g, b"to three", sender.qp.qpn());
    let deadline = Instant::now() + PATIENCE;
    for (child, lines) in children.iter_mut().zip(outputs) {
        let got: Vec<String> = lines.map_while(Result::ok).collect();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("a child did not finish: {got:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(status.success(), "child failed: {got:?}");
        assert!(got.iter().any(|l| l == "child-got to three"), "{got:?}");
    }
}
