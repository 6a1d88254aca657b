//! Several processes sharing one address share its QP1: the host hands each received CM
//! MAD to the process it is for by [`mad::addressee`]. These tests pin what that rests on:
//! every MAD a `Cm` sends in answer to another names the other's communication ID (IBTA
//! 12.6: RemoteCommunicationID, SIDR_REP's RequestID), whose high byte is the share the
//! other was configured with (`CmConfig::share`); REQ and SIDR_REQ name the service.

mod common;

use common::{Pair, Side, GID_A, GID_B};
use softverbs_cm::cma;
use softverbs_cm::mad::{self, comm_id_share, sidr_status, Addressee, CmMessage, MAD_LEN};
use softverbs_cm::{CmEvent, ConnectRequest, OutgoingMad, Reply, SidrReply, SidrRequest};

const SERVICE: u64 = 0x0000_0000_0106_1D2F; // RDMA_PS_TCP, port 7471
const SHARE_A: u8 = 7;
const SHARE_B: u8 = 200;

type Sent = Vec<(Side, [u8; MAD_LEN])>;

/// Delivers everything queued, keeping a copy of each MAD with its sender.
fn deliver(p: &mut Pair, sent: &mut Sent) {
    p.deliver(|side, m: &OutgoingMad| {
        sent.push((side, m.bytes));
        false
    });
}

/// Asserts that each MAD of `sent` is addressed to its receiver: the service for a REQ or
/// SIDR_REQ, else a communication ID of the receiver's share.
fn assert_addressed(sent: &Sent) {
    assert!(!sent.is_empty());
    for (side, bytes) in sent {
        let receiver_share = match side {
            Side::A => SHARE_B,
            Side::B => SHARE_A,
        };
        let name = CmMessage::parse(bytes).expect("a CM MAD").name();
        match mad::addressee(bytes) {
            Some(Addressee::Service(service)) => {
                assert!(
                    name == "REQ" || name == "SIDR_REQ",
                    "{name} names a service"
                );
                assert!(service == SERVICE || service >> 16 == u64::from(cma::RDMA_PS_UDP));
            }
            Some(Addressee::Connection(id)) => assert_eq!(
                comm_id_share(id),
                receiver_share,
                "{name} from {side:?} names {id:#010x}"
            ),
            None => panic!("{name} from {side:?} has no addressee"),
        }
    }
}

fn request() -> ConnectRequest {
    ConnectRequest::new(SERVICE, GID_A, GID_B, 0x07_0011, 0x00AB_CDEF)
}

#[test]
fn every_message_of_a_connection_names_its_receivers_share_ibta_12_6() {
    let mut p = Pair::with_shares(5, SHARE_A, SHARE_B);
    let mut sent = Sent::new();
    p.b.listen(SERVICE).expect("listen");
    let ca = p.a.connect(p.now, request()).expect("connect");
    assert_eq!(comm_id_share(ca.local_comm_id()), SHARE_A);
    deliver(&mut p, &mut sent);
    let events = p.take_events(Side::B);
    let [CmEvent::ReqReceived { conn: cb, .. }] = events.as_slice() else {
        panic!("{events:?}");
    };
    let cb = *cb;
    assert_eq!(comm_id_share(cb.local_comm_id()), SHARE_B);
    p.b.accept(p.now, cb, Reply::new(0xC8_0022, 0x12_3456))
        .expect("accept");
    deliver(&mut p, &mut sent);
    p.a.ready_to_use(p.now, ca, &[]).expect("rtu");
    deliver(&mut p, &mut sent);
    p.a.disconnect(p.now, ca, &[]).expect("dreq");
    deliver(&mut p, &mut sent);
    p.b.disconnect(p.now, cb, &[]).expect("drep");
    deliver(&mut p, &mut sent);
    let names: Vec<&str> = sent
        .iter()
        .map(|(_, b)| CmMessage::parse(b).expect("CM").name())
        .collect();
    assert_eq!(names, ["REQ", "REP", "RTU", "DREQ", "DREP"]);
    assert_addressed(&sent);
}

#[test]
fn a_rejection_and_a_sidr_reply_name_the_requesters_share_ibta_12_6_and_12_11() {
    let mut p = Pair::with_shares(9, SHARE_A, SHARE_B);
    let mut sent = Sent::new();
    // Nobody listens: REJ 8 names the REQ's communication ID.
    p.a.connect(p.now, request()).expect("connect");
    deliver(&mut p, &mut sent);
    // SIDR: the reply names the request ID.
    let ud_service = cma::service_id(cma::RDMA_PS_UDP, 5000);
    p.b.listen(ud_service).expect("listen");
    let ca =
        p.a.sidr_request(p.now, SidrRequest::new(ud_service, GID_B))
            .expect("sidr");
    assert_eq!(comm_id_share(ca.local_comm_id()), SHARE_A);
    deliver(&mut p, &mut sent);
    let events = p.take_events(Side::B);
    let Some(CmEvent::SidrReqReceived { conn, .. }) = events.last() else {
        panic!("{events:?}");
    };
    let reply = SidrReply {
        status: sidr_status::SUCCESS,
        qpn: 0xC8_0033,
        qkey: 0x1234_5678,
        private_data: vec![],
    };
    p.b.sidr_reply(p.now, *conn, reply).expect("reply");
    deliver(&mut p, &mut sent);
    let names: Vec<&str> = sent
        .iter()
        .map(|(_, b)| CmMessage::parse(b).expect("CM").name())
        .collect();
    assert_eq!(names, ["REQ", "REJ", "SIDR_REQ", "SIDR_REP"]);
    assert_addressed(&sent);
}

#[test]
fn a_mad_that_is_no_cm_message_has_no_addressee() {
    let mut p = Pair::with_shares(3, SHARE_A, SHARE_B);
    p.b.listen(SERVICE).expect("listen");
    p.a.connect(p.now, request()).expect("connect");
    let req = p.a.poll_transmit().expect("a REQ").bytes;
    assert_eq!(mad::addressee(&req), Some(Addressee::Service(SERVICE)));
    // Too short, too long, another management class, a ClassPortInfo: none.
    assert_eq!(mad::addressee(&req[..200]), None);
    assert_eq!(mad::addressee(&[req.as_slice(), &[0]].concat()), None);
    let mut other = req;
    other[1] = 0x03; // subnet administration
    assert_eq!(mad::addressee(&other), None);
    let mut port_info = req;
    port_info[16..18].copy_from_slice(&0x0001u16.to_be_bytes());
    assert_eq!(mad::addressee(&port_info), None);
}
