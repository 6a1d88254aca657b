//! UD through the safe API: an address handle, a Q_Key, and the 40-byte GRH area at the
//! start of every receive buffer (`ibv_post_recv(3)`, `ibv_create_ah(3)`: for IPv4
//! the last 20 bytes hold the IPv4 header).

mod common;

use common::*;
use softverbs::*;

const QKEY: u32 = 0x1111_0000;

fn ud_side(ctx: Context) -> Side {
    let s = side(ctx, QpType::Ud);
    s.qp.to_init(InitAttr::default().qkey(QKEY)).unwrap();
    s.qp.to_rtr(RtrAttr::datagram()).unwrap();
    s.qp.to_rts(RtsAttr::new(0)).unwrap();
    s
}

/// `ibv_post_recv(3)`: "the first 40 bytes of the buffer will contain the GRH"; the
/// payload follows, `byte_len` counts both, and the completion names the sender's QP.
fn ud_send_lands_after_the_40_byte_grh(a: &Side, b: &Side) {
    b.qp.post_recv(RecvRequest::new(3, &[b.mr.slice(0..40 + 1024).unwrap()]))
        .unwrap();
    a.mr.write_at(0, b"datagram").unwrap();
    let ah = a.pd.create_ah(&AhAttr::new(b.ctx.gid(0).unwrap())).unwrap();
    a.qp.post_send(SendRequest::send(1, &[a.mr.slice(0..8).unwrap()]).to(&ah, b.qp.qpn(), QKEY))
        .unwrap();
    let recv = wait_for(&b.cq, 1);
    let done = recv[0].result().expect("UD receive succeeded");
    assert_eq!(done.opcode(), WcOpcode::Recv);
    assert_eq!(done.byte_len(), 40 + 8);
    assert_eq!(done.src_qp(), a.qp.qpn());
    assert!(done.flags().contains(WcFlags::GRH));
    assert_eq!(b.mr.read_vec(40..48).unwrap(), b"datagram");
    let grh = b.mr.read_vec(0..40).unwrap();
    assert_eq!(grh[20] >> 4, 4, "IPv4 header in the last 20 bytes: {grh:?}");
    let src = a.ctx.gid(0).unwrap();
    assert_eq!(&grh[32..36], &src.0[12..16], "source address");
    assert_eq!(wait_for(&a.cq, 1)[0].status(), WcStatus::Success);
}

/// IBTA C10-15 / `ibv_post_send(3)`: a UD send with the wrong Q_Key is silently dropped
/// by the receiver (the sender still completes: UD is unreliable).
fn ud_send_with_a_wrong_qkey_is_dropped(a: &Side, b: &Side) {
    b.qp.post_recv(RecvRequest::new(4, &[b.mr.slice(0..2048).unwrap()]))
        .unwrap();
    let ah = a.pd.create_ah(&AhAttr::new(b.ctx.gid(0).unwrap())).unwrap();
    a.qp.post_send(SendRequest::send_inline(2, b"x").to(&ah, b.qp.qpn(), 0x2222))
        .unwrap();
    assert_eq!(wait_for(&a.cq, 1)[0].status(), WcStatus::Success);
    assert_nothing_for(&b.cq, std::time::Duration::from_millis(50));
}

#[test]
fn ud_between_in_process_devices_delivers_after_the_grh() {
    let (a, b) = (ud_side(in_process()), ud_side(in_process()));
    ud_send_lands_after_the_40_byte_grh(&a, &b);
    ud_send_with_a_wrong_qkey_is_dropped(&a, &b);
}

#[test]
fn ud_over_udp_loopback_delivers_after_the_grh() {
    let (a, b) = (ud_side(udp(221)), ud_side(udp(222)));
    ud_send_lands_after_the_40_byte_grh(&a, &b);
    ud_send_with_a_wrong_qkey_is_dropped(&a, &b);
}

/// IBTA 10.2.3: a UD QP uses only address handles of its own protection domain (rdmavt
/// refuses another's in its post_send, `EINVAL`). The post is refused with nothing sent,
/// and the QP goes on working: the same send with an address handle of its own PD lands.
#[test]
fn ud_send_with_an_address_handle_of_another_pd_is_refused() {
    let (a, b) = (ud_side(in_process()), ud_side(in_process()));
    b.qp.post_recv(RecvRequest::new(5, &[b.mr.slice(0..2048).unwrap()]))
        .unwrap();
    let other_pd = a.ctx.alloc_pd();
    let foreign = other_pd
        .create_ah(&AhAttr::new(b.ctx.gid(0).unwrap()))
        .unwrap();
    let refused =
        a.qp.post_send(SendRequest::send_inline(6, b"x").to(&foreign, b.qp.qpn(), QKEY));
    assert!(
        matches!(
            refused,
            Err(Error::Verbs(VerbsError::AddressHandleOfAnotherPd))
        ),
        "{refused:?}"
    );
    assert_nothing_for(&a.cq, std::time::Duration::from_millis(50));
    assert_nothing_for(&b.cq, std::time::Duration::from_millis(50));
    let own = a.pd.create_ah(&AhAttr::new(b.ctx.gid(0).unwrap())).unwrap();
    a.qp.post_send(SendRequest::send_inline(7, b"y").to(&own, b.qp.qpn(), QKEY))
        .unwrap();
    assert_eq!(wait_for(&a.cq, 1)[0].status(), WcStatus::Success);
    let got = wait_for(&b.cq, 1);
    assert_eq!((got[0].wr_id(), got[0].status()), (5, WcStatus::Success));
    assert_eq!(b.mr.read_vec(40..41).unwrap(), b"y");
}
