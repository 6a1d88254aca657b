//! The two sides of a connection driven against each other in memory: establishment,
//! rejection, retransmission, timeouts, disconnection, timewait and SIDR (IBTA chapter 12).

mod common;

use common::{Pair, Side, GID_A, GID_B, GUID_A, GUID_B};
use softverbs_cm::cma::{self, CmaAddresses, CmaHeader};
use softverbs_cm::mad::{reject_reason, sidr_status, CmMessage};
use softverbs_cm::{
    cm_timeout_ns, CmError, CmEvent, ConnId, ConnState, ConnectRequest, QpType, Reply, SidrReply,
    SidrRequest,
};

const SERVICE: u64 = 0x0000_0000_0106_1D2F; // RDMA_PS_TCP, port 7471

fn request(private_data: &[u8]) -> ConnectRequest {
    let mut r = ConnectRequest::new(SERVICE, GID_A, GID_B, 0x11, 0x00AB_CDEF);
    r.responder_resources = 4;
    r.initiator_depth = 2;
    r.remote_cm_response_timeout = 10; // 4.2 ms
    r.local_cm_response_timeout = 11;
    r.max_cm_retries = 3;
    r.private_data = private_data.to_vec();
    r
}

/// Runs REQ → ReqReceived on B; returns (A's conn, B's conn).
fn req_delivered(p: &mut Pair, private_data: &[u8]) -> (ConnId, ConnId) {
    p.b.listen(SERVICE).expect("listen");
    let ca = p.a.connect(p.now, request(private_data)).expect("connect");
    p.deliver_all();
    let events = p.take_events(Side::B);
    let [CmEvent::ReqReceived {
        conn,
        service_id,
        req,
    }] = events.as_slice()
    else {
        panic!("B expected one ReqReceived, got {events:?}");
    };
    assert_eq!(*service_id, SERVICE);
    assert_eq!(req.remote_qpn, 0x11);
    assert_eq!(req.starting_psn, 0xAB_CDEF);
    assert_eq!(req.remote_gid, GID_A);
    assert_eq!(req.local_gid, GID_B);
    assert_eq!(req.remote_ca_guid, GUID_A);
    assert_eq!(req.qp_type, QpType::Rc);
    assert_eq!((req.responder_resources, req.initiator_depth), (4, 2));
    assert_eq!(req.path_mtu, 3);
    assert_eq!(req.hop_limit, 64);
    assert_eq!(req.private_data.len(), 92);
    assert_eq!(&req.private_data[..private_data.len()], private_data);
    (ca, *conn)
}

fn establish(p: &mut Pair) -> (ConnId, ConnId) {
    let (ca, cb) = req_delivered(p, b"hi");
    let mut rep = Reply::new(0x22, 0x0012_3456);
    rep.private_data = b"welcome".to_vec();
    p.b.accept(p.now, cb, rep).expect("accept");
    p.deliver_all();
    let events = p.take_events(Side::A);
    let [CmEvent::RepReceived { conn, rep }] = events.as_slice() else {
        panic!("A expected RepReceived, got {events:?}");
    };
    assert_eq!(*conn, ca);
    assert_eq!(rep.remote_qpn, 0x22);
    assert_eq!(rep.starting_psn, 0x12_3456);
    assert_eq!(rep.remote_ca_guid, GUID_B);
    assert_eq!(&rep.private_data[..7], b"welcome");
    assert_eq!(p.a.state(ca), Some(ConnState::RepReceived));
    p.a.ready_to_use(p.now, ca, &[]).expect("rtu");
    p.deliver_all();
    let events = p.take_events(Side::B);
    assert!(
        matches!(events.as_slice(), [CmEvent::RtuReceived { conn, .. }] if *conn == cb),
        "{events:?}"
    );
    assert_eq!(p.a.state(ca), Some(ConnState::Established));
    assert_eq!(p.b.state(cb), Some(ConnState::Established));
    (ca, cb)
}

#[test]
fn req_rep_rtu_establishes_both_sides_ibta_12_9_5() {
    let mut p = Pair::new(1);
    establish(&mut p);
    let names: Vec<_> = p.log.iter().map(|(s, n, _)| (*s, n.as_str())).collect();
    assert_eq!(
        names,
        [(Side::A, "REQ"), (Side::B, "REP"), (Side::A, "RTU")]
    );
    assert_eq!(p.a.poll_timeout(), None, "no timer once established");
    assert_eq!(p.b.poll_timeout(), None);
}

#[test]
fn rdma_cm_req_private_data_starts_with_the_cma_header() {
    let mut p = Pair::new(2);
    let header = CmaHeader {
        src_port: 40000,
        addresses: CmaAddresses::V4 {
            src: [127, 0, 0, 1].into(),
            dst: [127, 0, 0, 2].into(),
        },
    };
    let data = header.with_user_data(&[7; cma::REQ_USER_PRIVATE_DATA_LEN]);
    p.b.listen(SERVICE).expect("listen");
    p.a.connect(p.now, request(&data))
        .expect("56 user bytes fit");
    p.deliver_all();
    let Some(CmEvent::ReqReceived { req, .. }) = p.events_b.first() else {
        panic!("no REQ");
    };
    assert_eq!(CmaHeader::parse(&req.private_data), Ok(header));
    let too_long = header.with_user_data(&[7; cma::REQ_USER_PRIVATE_DATA_LEN + 1]);
    assert_eq!(
        p.a.connect(p.now, request(&too_long)),
        Err(CmError::PrivateDataTooLong { len: 93, max: 92 })
    );
}

#[test]
fn consumer_reject_is_rej_reason_28_with_private_data_ibta_12_6_7() {
    let mut p = Pair::new(3);
    let (ca, cb) = req_delivered(&mut p, b"");
    p.b.reject(p.now, cb, reject_reason::CONSUMER, b"not today")
        .expect("reject");
    p.deliver_all();
    let events = p.take_events(Side::A);
    let [CmEvent::Rejected {
        conn,
        reason,
        private_data,
        ..
    }] = events.as_slice()
    else {
        panic!("{events:?}");
    };
    assert_eq!((*conn, *reason), (ca, 28));
    assert_eq!(private_data.len(), 148);
    assert_eq!(&private_data[..9], b"not today");
    assert_eq!(p.a.state(ca), Some(ConnState::Idle));
    assert_eq!(p.a.poll_timeout(), None, "REQ timer stopped");
    assert_eq!(
        p.b.reject(p.now, cb, 28, &[0; 149]),
        Err(CmError::PrivateDataTooLong { len: 149, max: 148 })
    );
}

#[test]
fn req_for_a_service_nobody_listens_on_gets_rej_reason_8() {
    let mut p = Pair::new(4);
    let ca = p.a.connect(p.now, request(b"")).expect("connect");
    p.deliver_all();
    let events = p.take_events(Side::A);
    assert!(
        matches!(events.as_slice(), [CmEvent::Rejected { conn, reason: 8, .. }] if *conn == ca),
        "{events:?}"
    );
    assert!(p.events_b.is_empty());
    assert_eq!(p.b.counters().no_listener, 1);
    // After unlisten, the same again.
    p.b.listen(SERVICE).expect("listen");
    p.b.unlisten(SERVICE);
    p.a.connect(p.now, request(b"")).expect("connect");
    p.deliver_all();
    assert!(matches!(
        p.take_events(Side::A).as_slice(),
        [CmEvent::Rejected { reason: 8, .. }]
    ));
}

/// `Cm::set_unmatched_req_hold`: a REQ that comes before the listen waits for it — taken as
/// if it came after (REQ_RECEIVED on the passive side, the connection completes) when the
/// listener appears within the hold, rejected with reason 8 when the hold ends without one;
/// its retransmissions while it waits are duplicates, not second requests.
#[test]
fn a_req_held_for_a_listener_is_taken_by_the_listen_or_rejected_when_the_hold_ends() {
    const HOLD: u64 = 2_000_000; // shorter than A's first REQ timeout (4.2 ms)
    let mut p = Pair::new(12);
    p.b.set_unmatched_req_hold(HOLD);
    let ca = p.a.connect(p.now, request(b"early")).expect("connect");
    p.deliver_all();
    assert!(p.take_events(Side::A).is_empty(), "no REJ while held");
    assert!(p.take_events(Side::B).is_empty());
    assert_eq!(p.b.poll_timeout(), Some(p.now + HOLD));
    p.b.listen(SERVICE).expect("listen");
    p.collect();
    let events = p.take_events(Side::B);
    assert!(
        matches!(events.as_slice(), [CmEvent::ReqReceived { .. }]),
        "the held REQ is taken by the listen: {events:?}"
    );
    assert_eq!(p.b.counters().no_listener, 0);
    let _ = ca;

    // No listener within the hold: REJ 8 at its end, once however often A retransmits.
    let mut p = Pair::new(13);
    p.b.set_unmatched_req_hold(HOLD);
    let ca = p.a.connect(p.now, request(b"")).expect("connect");
    p.deliver_all();
    let mut rounds = 0;
    while p.events_a.is_empty() && rounds < 100 {
        assert!(p.advance(), "a timer runs until A hears back");
        p.deliver_all();
        p.collect();
        rounds += 1;
    }
    let events = p.take_events(Side::A);
    assert!(
        matches!(events.as_slice(), [CmEvent::Rejected { conn, reason: 8, .. }] if *conn == ca),
        "{events:?}"
    );
    assert_eq!(p.b.counters().no_listener, 1, "one REJ for the held REQ");
}

#[test]
fn listen_twice_on_a_service_id_is_address_in_use() {
    let mut p = Pair::new(5);
    p.b.listen(SERVICE).expect("first");
    let err = p.b.listen(SERVICE).expect_err("second");
    assert_eq!(err, CmError::AddressInUse(SERVICE));
    assert_eq!(err.errno(), 98);
}

#[test]
fn lost_req_is_retransmitted_after_the_remote_cm_response_timeout_ibta_12_7() {
    let mut p = Pair::new(6);
    p.b.listen(SERVICE).expect("listen");
    let start = p.now;
    p.a.connect(p.now, request(b"")).expect("connect");
    assert_eq!(p.a.poll_timeout(), Some(start + cm_timeout_ns(10)));
    let mut first = true;
    p.deliver(|_, _| std::mem::take(&mut first));
    assert!(p.events_b.is_empty());
    assert!(p.advance());
    assert_eq!(p.now, start + cm_timeout_ns(10));
    p.deliver_all();
    assert!(matches!(
        p.events_b.as_slice(),
        [CmEvent::ReqReceived { .. }]
    ));
    assert_eq!(p.a.counters().retransmissions, 1);
}

#[test]
fn lost_rep_is_resent_on_the_duplicate_req_and_by_its_own_timer() {
    let mut p = Pair::new(7);
    let (ca, cb) = req_delivered(&mut p, b"");
    p.b.accept(p.now, cb, Reply::new(0x22, 1)).expect("accept");
    p.deliver(|side, _| side == Side::B); // REP lost
    assert_eq!(p.a.state(ca), Some(ConnState::ReqSent));
    // A's REQ retransmission reaches B, a duplicate: B resends the REP (B's own REP timer,
    // 4.096 µs × 2^11, fires later than A's 2^10).
    assert!(p.advance());
    p.deliver_all();
    assert_eq!(p.b.counters().duplicates, 1);
    assert_eq!(p.a.state(ca), Some(ConnState::RepReceived));
    let req_received = p
        .events_b
        .iter()
        .filter(|e| matches!(e, CmEvent::ReqReceived { .. }));
    assert_eq!(
        req_received.count(),
        0,
        "a duplicate REQ is not a new connection"
    );
}

#[test]
fn lost_rtu_is_resent_when_the_rep_is_retransmitted_ibta_12_9_5_1() {
    let mut p = Pair::new(8);
    let (ca, cb) = req_delivered(&mut p, b"");
    p.b.accept(p.now, cb, Reply::new(0x22, 1)).expect("accept");
    p.deliver_all();
    p.a.ready_to_use(p.now, ca, b"rtu").expect("rtu");
    p.deliver(|side, _| side == Side::A); // RTU lost
    assert_eq!(p.b.state(cb), Some(ConnState::RepSent));
    assert!(p.advance()); // B's REP timer
    p.deliver_all();
    assert_eq!(p.b.state(cb), Some(ConnState::Established));
    assert_eq!(p.a.counters().duplicates, 1);
    assert!(p
        .events_b
        .iter()
        .any(|e| matches!(e, CmEvent::RtuReceived { private_data, .. } if private_data.starts_with(b"rtu"))));
}

#[test]
fn req_retries_exhausted_is_timeout_and_rej_4_with_the_ca_guid() {
    let mut p = Pair::new(9);
    let ca = p.a.connect(p.now, request(b"")).expect("connect");
    let mut sent = Vec::new();
    for _ in 0..10 {
        p.deliver(|_, m| {
            sent.push(CmMessage::parse(&m.bytes).expect("valid"));
            true
        });
        if !p.advance() {
            break;
        }
    }
    p.deliver(|_, m| {
        sent.push(CmMessage::parse(&m.bytes).expect("valid"));
        true
    });
    let reqs = sent
        .iter()
        .filter(|m| matches!(m, CmMessage::Req(_)))
        .count();
    assert_eq!(reqs, 4, "the REQ and max_cm_retries (3) retransmissions");
    let Some(CmMessage::Rej(rej)) = sent.last() else {
        panic!("last MAD {sent:?}");
    };
    assert_eq!(rej.reason, reject_reason::TIMEOUT);
    assert_eq!(rej.ari(), GUID_A.to_be_bytes());
    assert_eq!(p.take_events(Side::A), [CmEvent::Timeout { conn: ca }]);
    assert_eq!(p.a.state(ca), Some(ConnState::Idle));
    assert_eq!(p.a.poll_timeout(), None);
}

#[test]
fn rep_retries_exhausted_is_timeout_on_the_passive_side() {
    let mut p = Pair::new(10);
    let (ca, cb) = req_delivered(&mut p, b"");
    p.b.accept(p.now, cb, Reply::new(0x22, 1)).expect("accept");
    p.deliver_all();
    // A never sends the RTU; B gives up after its retries and rejects with reason 4.
    for _ in 0..20 {
        p.deliver_all();
        if !p.advance() {
            break;
        }
    }
    assert!(p.events_b.contains(&CmEvent::Timeout { conn: cb }));
    assert!(p
        .events_a
        .iter()
        .any(|e| matches!(e, CmEvent::Rejected { conn, reason: 4, .. } if *conn == ca)));
}

#[test]
fn dreq_drep_enter_timewait_then_timewait_exit_ibta_12_9_7() {
    let mut p = Pair::new(11);
    let (ca, cb) = establish(&mut p);
    p.a.set_timewait(Some(5_000_000));
    p.a.disconnect(p.now, ca, b"bye").expect("dreq");
    p.deliver_all();
    let events = p.take_events(Side::B);
    assert!(
        matches!(events.as_slice(), [CmEvent::DreqReceived { conn, private_data }] if *conn == cb && private_data.starts_with(b"bye")),
        "{events:?}"
    );
    assert_eq!(p.b.state(cb), Some(ConnState::DreqReceived));
    p.b.disconnect(p.now, cb, &[]).expect("drep");
    p.deliver_all();
    assert!(matches!(
        p.take_events(Side::A).as_slice(),
        [CmEvent::DrepReceived { .. }]
    ));
    assert_eq!(p.a.state(ca), Some(ConnState::Timewait));
    assert_eq!(p.b.state(cb), Some(ConnState::Timewait));
    let t0 = p.now;
    while p.advance() {}
    assert!(p.now >= t0 + 5_000_000);
    assert_eq!(p.take_events(Side::A), [CmEvent::TimewaitExit { conn: ca }]);
    assert_eq!(p.take_events(Side::B), [CmEvent::TimewaitExit { conn: cb }]);
    assert_eq!(p.a.state(ca), Some(ConnState::Idle));
    assert_eq!(
        p.a.disconnect(p.now, ca, &[]),
        Err(CmError::InvalidState {
            conn: ca,
            state: ConnState::Idle
        })
    );
    p.a.release(ca);
    p.b.release(cb);
    assert_eq!(p.a.state(ca), None);
}

#[test]
fn lost_dreq_is_retransmitted_and_a_dreq_in_timewait_gets_the_drep_again() {
    let mut p = Pair::new(12);
    let (ca, cb) = establish(&mut p);
    p.a.disconnect(p.now, ca, &[]).expect("dreq");
    let mut first = true;
    p.deliver(|_, _| std::mem::take(&mut first)); // DREQ lost
    assert!(p.advance()); // retransmitted
    p.deliver_all();
    assert_eq!(p.b.state(cb), Some(ConnState::DreqReceived));
    p.b.disconnect(p.now, cb, &[]).expect("drep");
    p.deliver(|side, _| side == Side::B); // DREP lost
    assert_eq!(p.a.state(ca), Some(ConnState::DreqSent));
    assert!(p.advance()); // DREQ again, B in timewait answers
    p.deliver_all();
    assert_eq!(p.a.state(ca), Some(ConnState::Timewait));
    assert!(p.b.counters().duplicates >= 1);
}

#[test]
fn dreq_retries_exhausted_is_dreq_timeout_then_timewait() {
    let mut p = Pair::new(13);
    let (ca, _) = establish(&mut p);
    p.a.disconnect(p.now, ca, &[]).expect("dreq");
    for _ in 0..10 {
        p.deliver(|_, _| true);
        if p.a.state(ca) != Some(ConnState::DreqSent) {
            break;
        }
        assert!(p.advance());
    }
    assert!(p.events_a.contains(&CmEvent::DreqTimeout { conn: ca }));
    assert_eq!(p.a.state(ca), Some(ConnState::Timewait));
}

#[test]
fn simultaneous_disconnect_each_side_answers_the_others_dreq() {
    let mut p = Pair::new(14);
    let (ca, cb) = establish(&mut p);
    p.a.disconnect(p.now, ca, &[]).expect("a dreq");
    p.b.disconnect(p.now, cb, &[]).expect("b dreq");
    p.deliver_all();
    assert!(matches!(
        p.take_events(Side::A).as_slice(),
        [CmEvent::DreqReceived { .. }]
    ));
    assert!(matches!(
        p.take_events(Side::B).as_slice(),
        [CmEvent::DreqReceived { .. }]
    ));
    p.a.disconnect(p.now, ca, &[]).expect("a drep");
    p.b.disconnect(p.now, cb, &[]).expect("b drep");
    p.deliver_all();
    assert_eq!(p.a.state(ca), Some(ConnState::Timewait));
    assert_eq!(p.b.state(cb), Some(ConnState::Timewait));
    assert!(p.a.poll_timeout().is_some(), "timewait timer runs");
}

#[test]
fn dreq_for_an_unknown_connection_gets_a_drep() {
    let mut p = Pair::new(15);
    let (ca, cb) = establish(&mut p);
    // B forgets the connection without telling A (its DREQ is lost).
    p.b.release(cb);
    p.deliver(|side, _| side == Side::B);
    while p.advance() {
        if p.b.state(cb).is_none() && p.b.poll_timeout().is_none() {
            break;
        }
    }
    p.a.disconnect(p.now, ca, &[]).expect("dreq");
    p.deliver_all();
    assert_eq!(p.a.state(ca), Some(ConnState::Timewait), "DREP from B");
    assert!(p.b.counters().unmatched >= 1);
    assert!(p
        .events_b
        .iter()
        .all(|e| !matches!(e, CmEvent::DreqReceived { .. })));
}

#[test]
fn release_of_an_established_connection_sends_one_dreq_and_no_event_names_it_again() {
    let mut p = Pair::new(16);
    let (ca, cb) = establish(&mut p);
    p.a.release(ca);
    assert_eq!(p.a.state(ca), None);
    p.deliver_all();
    assert!(matches!(
        p.take_events(Side::B).as_slice(),
        [CmEvent::DreqReceived { .. }]
    ));
    p.b.disconnect(p.now, cb, &[]).expect("drep");
    p.deliver_all();
    while p.advance() {}
    assert!(p.events_a.is_empty(), "{:?}", p.events_a);
    assert_eq!(
        p.a.poll_timeout(),
        None,
        "released and forgotten after timewait"
    );
}

#[test]
fn release_before_the_rep_rejects_with_timeout() {
    let mut p = Pair::new(17);
    let (ca, cb) = req_delivered(&mut p, b"");
    p.a.release(ca);
    p.deliver_all();
    assert!(
        matches!(p.take_events(Side::B).as_slice(), [CmEvent::Rejected { conn, reason: 4, .. }] if *conn == cb)
    );
}

#[test]
fn notify_established_completes_the_passive_side_without_rtu() {
    let mut p = Pair::new(18);
    let (_, cb) = req_delivered(&mut p, b"");
    p.b.accept(p.now, cb, Reply::new(0x22, 1)).expect("accept");
    p.b.notify_established(cb);
    p.collect();
    assert_eq!(p.b.state(cb), Some(ConnState::Established));
    assert!(matches!(
        p.take_events(Side::B).as_slice(),
        [CmEvent::RtuReceived { conn, private_data }] if *conn == cb && private_data.is_empty()
    ));
    assert_eq!(p.b.poll_timeout(), None, "REP timer stopped");
}

#[test]
fn mra_extends_the_req_timer_ibta_12_6_6() {
    let mut p = Pair::new(19);
    let (ca, cb) = req_delivered(&mut p, b"");
    p.b.send_mra(p.now, cb, 20, &[]).expect("mra");
    p.deliver_all();
    assert_eq!(
        p.take_events(Side::A),
        [CmEvent::MraReceived {
            conn: ca,
            service_timeout: 20
        }]
    );
    assert_eq!(p.a.state(ca), Some(ConnState::MraReqReceived));
    assert_eq!(
        p.a.poll_timeout(),
        Some(p.now + cm_timeout_ns(20) + cm_timeout_ns(10))
    );
    p.b.accept(p.now, cb, Reply::new(0x22, 1))
        .expect("accept after MRA");
    p.deliver_all();
    assert_eq!(p.a.state(ca), Some(ConnState::RepReceived));
}

#[test]
fn calls_in_the_wrong_state_are_errors_not_panics() {
    let mut p = Pair::new(20);
    let (ca, cb) = req_delivered(&mut p, b"");
    assert!(matches!(
        p.a.accept(p.now, ca, Reply::new(0x22, 1)),
        Err(CmError::InvalidState { .. })
    ));
    assert!(matches!(
        p.b.ready_to_use(p.now, cb, &[]),
        Err(CmError::InvalidState { .. })
    ));
    let ghost = {
        p.a.release(ca);
        ca
    };
    assert_eq!(
        p.a.disconnect(p.now, ghost, &[]),
        Err(CmError::UnknownConnection(ghost))
    );
    let mut bad = request(b"");
    bad.path_mtu = 0;
    assert!(matches!(
        p.a.connect(p.now, bad),
        Err(CmError::InvalidParameter(_))
    ));
    assert_eq!(CmError::UnknownConnection(ca).errno(), 22);
}

#[test]
fn sidr_request_gets_the_qpn_and_qkey_of_the_listener_ibta_12_11() {
    let mut p = Pair::new(21);
    let ud_service = cma::service_id(cma::RDMA_PS_UDP, 5000);
    p.b.listen(ud_service).expect("listen");
    let mut req = SidrRequest::new(ud_service, GID_B);
    req.private_data = b"sidr".to_vec();
    let ca = p.a.sidr_request(p.now, req).expect("sidr");
    p.deliver_all();
    let events = p.take_events(Side::B);
    let [CmEvent::SidrReqReceived {
        conn,
        service_id,
        private_data,
        source,
        ..
    }] = events.as_slice()
    else {
        panic!("{events:?}");
    };
    assert_eq!(*service_id, ud_service);
    assert_eq!(source.sgid, GID_A);
    assert!(private_data.starts_with(b"sidr"));
    p.b.sidr_reply(
        p.now,
        *conn,
        SidrReply {
            status: sidr_status::SUCCESS,
            qpn: 0x33,
            qkey: 0x1234_5678,
            private_data: vec![],
        },
    )
    .expect("reply");
    p.deliver_all();
    let events = p.take_events(Side::A);
    assert!(
        matches!(events.as_slice(), [CmEvent::SidrRepReceived { conn, status: 0, qpn: 0x33, qkey: 0x1234_5678, .. }] if *conn == ca),
        "{events:?}"
    );
    assert_eq!(p.a.poll_timeout(), None);
}

#[test]
fn sidr_request_to_an_unlistened_service_is_status_1_and_a_silent_peer_is_sidr_timeout() {
    let mut p = Pair::new(22);
    let mut req = SidrRequest::new(cma::service_id(cma::RDMA_PS_UDP, 1), GID_B);
    req.cm_response_timeout = 8;
    req.max_cm_retries = 2;
    p.a.sidr_request(p.now, req.clone()).expect("sidr");
    p.deliver_all();
    assert!(matches!(
        p.take_events(Side::A).as_slice(),
        [CmEvent::SidrRepReceived { status: 1, .. }]
    ));
    let ca = p.a.sidr_request(p.now, req).expect("sidr");
    let mut sent = 0;
    for _ in 0..10 {
        sent += p.deliver(|_, _| true);
        if !p.advance() {
            break;
        }
    }
    assert_eq!(sent, 3, "the SIDR_REQ and 2 retransmissions");
    assert_eq!(p.take_events(Side::A), [CmEvent::SidrTimeout { conn: ca }]);
}

#[test]
fn duplicate_sidr_req_gets_the_same_reply_again() {
    let mut p = Pair::new(23);
    let service = cma::service_id(cma::RDMA_PS_UDP, 9);
    p.b.listen(service).expect("listen");
    let mut req = SidrRequest::new(service, GID_B);
    req.cm_response_timeout = 8;
    p.a.sidr_request(p.now, req).expect("sidr");
    p.deliver_all();
    let Some(CmEvent::SidrReqReceived { conn, .. }) = p.take_events(Side::B).pop() else {
        panic!("no SIDR_REQ");
    };
    p.b.sidr_reply(
        p.now,
        conn,
        SidrReply {
            status: 0,
            qpn: 0x44,
            qkey: 1,
            private_data: vec![],
        },
    )
    .expect("reply");
    p.deliver(|side, _| side == Side::B); // reply lost
    assert!(p.advance());
    p.deliver_all();
    assert!(matches!(
        p.take_events(Side::A).as_slice(),
        [CmEvent::SidrRepReceived { qpn: 0x44, .. }]
    ));
    assert!(
        p.take_events(Side::B).is_empty(),
        "no second SidrReqReceived"
    );
}

#[test]
fn under_seeded_loss_every_connection_ends_established_or_timed_out_on_both_sides() {
    use rand::{Rng, SeedableRng};
    for seed in 0..40u64 {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut p = Pair::new(seed);
        p.b.listen(SERVICE).expect("listen");
        let ca = p.a.connect(p.now, request(b"")).expect("connect");
        let mut cb = None;
        let mut steps = 0;
        loop {
            steps += 1;
            assert!(
                steps < 500,
                "seed {seed}: no end after 500 steps: {:?}",
                p.log
            );
            p.deliver(|_, _| rng.gen_bool(0.3));
            for e in p.take_events(Side::B) {
                if let CmEvent::ReqReceived { conn, .. } = e {
                    cb = Some(conn);
                    p.b.accept(p.now, conn, Reply::new(0x22, 1))
                        .expect("accept");
                }
            }
            for e in p.take_events(Side::A) {
                if let CmEvent::RepReceived { conn, .. } = e {
                    p.a.ready_to_use(p.now, conn, &[]).expect("rtu");
                }
            }
            if !p.advance() {
                p.deliver(|_, _| rng.gen_bool(0.3));
                if !p.advance() {
                    break;
                }
            }
        }
        let sa = p.a.state(ca);
        let sb = cb.and_then(|cb| p.b.state(cb));
        match sa {
            Some(ConnState::Established) => assert!(
                matches!(sb, Some(ConnState::Established) | Some(ConnState::Idle)),
                "seed {seed}: A established, B {sb:?}"
            ),
            Some(ConnState::Idle) => assert!(
                matches!(sb, None | Some(ConnState::Idle)),
                "seed {seed}: A idle, B {sb:?}"
            ),
            other => panic!("seed {seed}: A ended {other:?}, B {sb:?}"),
        }
    }
}

#[test]
fn rej_after_the_rep_puts_the_connection_in_timewait_as_the_kernel_does() {
    let mut p = Pair::new(24);
    let (ca, cb) = req_delivered(&mut p, b"");
    p.b.accept(p.now, cb, Reply::new(0x22, 1)).expect("accept");
    p.deliver_all();
    p.take_events(Side::A);
    // The active side rejects the REP (reason 28): the passive side, in RepSent, goes idle;
    // the active side's own state after a REP is timewait only when it receives a REJ.
    p.a.reject(p.now, ca, reject_reason::CONSUMER, b"rep no")
        .expect("reject the REP");
    p.deliver_all();
    assert_eq!(p.a.state(ca), Some(ConnState::Idle));
    assert_eq!(p.b.state(cb), Some(ConnState::Idle));
    assert!(matches!(
        p.take_events(Side::B).as_slice(),
        [CmEvent::Rejected { reason: 28, .. }]
    ));

    // Every RTU (and REP retransmission's RTU) is lost: B's REP retries run out, its
    // REJ (reason 4) reaches the established A, which goes to timewait.
    let mut p = Pair::new(25);
    let (ca, cb) = req_delivered(&mut p, b"");
    p.b.accept(p.now, cb, Reply::new(0x22, 1)).expect("accept");
    p.deliver_all();
    p.a.ready_to_use(p.now, ca, &[]).expect("rtu");
    for _ in 0..20 {
        p.deliver(|_, m| common::name(m) == "RTU");
        if p.b.state(cb) == Some(ConnState::Idle) {
            break;
        }
        assert!(p.advance());
    }
    p.deliver_all();
    assert!(p.events_b.contains(&CmEvent::Timeout { conn: cb }));
    assert!(p
        .events_a
        .iter()
        .any(|e| matches!(e, CmEvent::Rejected { conn, reason: 4, .. } if *conn == ca)));
    assert_eq!(p.a.state(ca), Some(ConnState::Timewait));
}
