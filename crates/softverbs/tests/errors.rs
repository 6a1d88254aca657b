//! Bad arguments and attributes are error values with the errno libibverbs documents,
//! never panics (`ibv_modify_qp(3)`, `ibv_create_qp(3)`, `ibv_reg_mr(3)`,
//! `ibv_post_send(3)`, `ibv_create_cq(3)`, `ibv_create_ah(3)`, `ibv_query_port(3)`).

mod common;

use common::*;
use softverbs::error::{Capacity, CqCreateError, RegisterError};
use softverbs::*;

const EINVAL: i32 = 22;

/// `ibv_modify_qp(3)`: an illegal transition (RESET → RTS), a missing required attribute
/// and an attribute the QP type does not take all fail with EINVAL, and the QP stays
/// usable.
#[test]
fn illegal_transitions_and_masks_are_einval() {
    let s = side(in_process(), QpType::Rc);
    let e = s.qp.to_rts(RtsAttr::new(0)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Verbs(VerbsError::IllegalTransition {
                from: QpState::Reset,
                to: QpState::Rts,
                ..
            })
        ),
        "{e}"
    );
    assert_eq!(e.errno(), EINVAL);
    assert_eq!(s.qp.state().unwrap(), QpState::Reset);

    s.qp.to_init(AccessFlags::empty()).unwrap();
    // RTR of an RC QP needs the peer.
    let e = s.qp.to_rtr(RtrAttr::datagram()).unwrap_err();
    assert!(matches!(e, Error::MissingRemote));
    assert_eq!(e.errno(), EINVAL);
    // RTR with only the state: the required attributes are missing.
    let attr = QpAttr {
        qp_state: QpState::Rtr,
        ..QpAttr::default()
    };
    let e = s.qp.modify(&attr, AttrMask::STATE).unwrap_err();
    assert!(
        matches!(e, Error::Verbs(VerbsError::MissingAttributes { .. })),
        "{e}"
    );
    assert_eq!(e.errno(), EINVAL);
    // Q_Key is not an RC attribute.
    let attr = QpAttr {
        qp_state: QpState::Init,
        qkey: 5,
        ..QpAttr::default()
    };
    let e =
        s.qp.modify(&attr, AttrMask::STATE | AttrMask::QKEY)
            .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Verbs(VerbsError::AttributesNotAllowed {
                extra: AttrMask::QKEY
            })
        ),
        "{e}"
    );
    assert_eq!(e.errno(), EINVAL);
    // Out-of-range codes.
    let info = s.qp.local_info(0);
    assert!(s.qp.to_rtr(RtrAttr::from(info).min_rnr_timer(32)).is_err());
    assert!(s
        .qp
        .to_rtr(RtrAttr::from(info).max_dest_rd_atomic(255))
        .is_err());
    // Port 2 does not exist.
    let ud = side(in_process(), QpType::Ud);
    let e = ud.qp.to_init(InitAttr::default().port(2)).unwrap_err();
    assert!(
        matches!(e, Error::Verbs(VerbsError::NoSuchPort { port: 2 })),
        "{e}"
    );
    assert_eq!(e.errno(), EINVAL);
    // Still fine afterwards.
    s.qp.to_rtr(info).unwrap();
    assert_eq!(s.qp.state().unwrap(), QpState::Rtr);
}

/// `ibv_create_qp(3)`: capacities above the device's limits are refused.
#[test]
fn oversized_qp_capacities_are_refused() {
    let ctx = in_process();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(8).unwrap();
    let max = ctx.query_device();
    let e = pd
        .qp_builder(QpType::Rc, &cq, &cq)
        .max_send_wr(max.max_qp_wr + 1)
        .build()
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Verbs(VerbsError::CapacityAboveLimit {
                what: Capacity::QueueDepth,
                ..
            })
        ),
        "{e}"
    );
    assert_eq!(e.errno(), EINVAL, "{e}");
    let e = pd
        .qp_builder(QpType::Rc, &cq, &cq)
        .max_send_sge(max.max_sge + 1)
        .build()
        .unwrap_err();
    assert_eq!(e.errno(), EINVAL, "{e}");
    // A CQ of another context is refused.
    let foreign = in_process().create_cq(8).unwrap();
    let e = pd
        .qp_builder(QpType::Rc, &foreign, &cq)
        .build()
        .unwrap_err();
    assert!(matches!(e, Error::ForeignObject { object: Object::Cq }));
    assert_eq!(e.errno(), EINVAL);
}

/// `ibv_reg_mr(3)`: "IBV_ACCESS_REMOTE_WRITE or IBV_ACCESS_REMOTE_ATOMIC requires
/// IBV_ACCESS_LOCAL_WRITE"; a zero-length region is EINVAL; out-of-range copies and
/// slices are errors.
#[test]
fn bad_registrations_and_ranges_are_errors() {
    let ctx = in_process();
    let pd = ctx.alloc_pd();
    let e = pd.reg_mr(4096, AccessFlags::REMOTE_WRITE).unwrap_err();
    assert!(
        matches!(e, Error::Register(RegisterError::MissingLocalWrite)),
        "{e}"
    );
    assert_eq!(e.errno(), EINVAL);
    let e = pd.reg_mr(0, AccessFlags::empty()).unwrap_err();
    assert!(
        matches!(e, Error::Register(RegisterError::ZeroLength)),
        "{e}"
    );
    assert_eq!(e.errno(), EINVAL);
    let mr = pd.reg_mr(100, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(
        mr.write_at(99, b"ab").unwrap_err(),
        RangeError {
            start: 99,
            end: 101,
            len: 100
        }
    );
    assert!(mr.read_at(usize::MAX, &mut [0u8; 2]).is_err());
    assert!(mr.slice(50..101).is_err());
    #[allow(clippy::reversed_empty_ranges)]
    let reversed = mr.slice(60..50);
    assert!(reversed.is_err());
    assert!(mr.read_vec(..=100).is_err());
    assert_eq!(mr.slice(..).unwrap().len(), 100);
}

/// `ibv_post_send(3)`: requests that cannot be carried out are refused at post time.
#[test]
fn invalid_work_requests_are_refused_at_post() {
    let (a, b) = rc_pair(in_process(), in_process());
    // An atomic needs exactly 8 local bytes.
    let e =
        a.qp.post_send(SendRequest::fetch_add(
            1,
            a.mr.slice(0..4).unwrap(),
            b.mr.remote(),
            1,
        ))
        .unwrap_err();
    assert!(
        matches!(e, Error::Verbs(VerbsError::AtomicLength { len: 4 })),
        "{e}"
    );
    assert_eq!(e.errno(), EINVAL);
    // A connected QP takes no UD destination.
    let ah = a.pd.create_ah(&AhAttr::new(b.ctx.gid(0).unwrap())).unwrap();
    let e =
        a.qp.post_send(SendRequest::send_inline(2, b"x").to(&ah, 5, 5))
            .unwrap_err();
    assert!(
        matches!(e, Error::Verbs(VerbsError::AddressHandleOnConnectedQp)),
        "{e}"
    );
    assert_eq!(e.errno(), EINVAL);
    // Too many SGEs for the QP.
    let many: Vec<MrSlice<'_>> = (0..64).map(|i| a.mr.slice(i..i + 1).unwrap()).collect();
    let e = a.qp.post_send(SendRequest::send(3, &many)).unwrap_err();
    assert!(
        matches!(e, Error::Verbs(VerbsError::TooManySges { num_sge: 64, .. })),
        "{e}"
    );
    assert_eq!(e.errno(), EINVAL, "{e}");
    // A UD QP needs a destination, and takes no reads.
    let ud = side(in_process(), QpType::Ud);
    ud.qp.to_init(InitAttr::default()).unwrap();
    ud.qp.to_rtr(RtrAttr::datagram()).unwrap();
    ud.qp.to_rts(RtsAttr::new(0)).unwrap();
    let e = ud
        .qp
        .post_send(SendRequest::send_inline(4, b"x"))
        .unwrap_err();
    assert!(
        matches!(e, Error::Verbs(VerbsError::MissingAddressHandle)),
        "{e}"
    );
    let e = ud
        .qp
        .post_send(SendRequest::read(5, &[ud.mr.slice(0..8).unwrap()], b.mr.remote()).to(&ah, 1, 1))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Verbs(VerbsError::OpcodeNotForQpType {
                opcode: "IBV_WR_RDMA_READ",
                qp_type: QpType::Ud
            })
        ),
        "{e}"
    );
    // Nothing was posted: no completion comes.
    assert_nothing_for(&a.cq, std::time::Duration::from_millis(20));
}

/// `ibv_create_cq(3)`: zero entries and more than `max_cqe` are EINVAL.
#[test]
fn bad_cq_sizes_are_einval() {
    let ctx = in_process();
    let e = ctx.create_cq(0).unwrap_err();
    assert!(matches!(e, Error::CqCreate(CqCreateError::ZeroSize)), "{e}");
    assert_eq!(e.errno(), EINVAL);
    let e = ctx.create_cq(u32::MAX).unwrap_err();
    assert!(
        matches!(e, Error::CqCreate(CqCreateError::TooLarge { .. })),
        "{e}"
    );
    assert_eq!(e.errno(), EINVAL);
    // A channel of another context is refused.
    let channel = in_process().create_comp_channel().unwrap();
    assert!(matches!(
        ctx.cq_builder(8).channel(&channel).build(),
        Err(Error::ForeignObject {
            object: Object::Channel
        })
    ));
}

/// `ibv_query_port(3)` and `ibv_create_ah(3)`: only port 1 and GID indexes 0 and 1 (the
/// table as kernel rxe lays it out for an IPv4 address) exist.
#[test]
fn nonexistent_ports_and_gid_indexes_are_einval() {
    let ctx = in_process();
    let e = ctx.query_port(2).unwrap_err();
    assert!(
        matches!(e, Error::Verbs(VerbsError::NoSuchPort { port: 2 })),
        "{e}"
    );
    assert_eq!(e.errno(), EINVAL);
    assert!(ctx.gid(1).is_some());
    assert!(ctx.gid(2).is_none());
    let pd = ctx.alloc_pd();
    let mut attr = AhAttr::new(ctx.gid(0).unwrap());
    attr.sgid_index = 3;
    let e = pd.create_ah(&attr).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Verbs(VerbsError::BadSgidIndex {
                index: 3,
                table_len: 2
            })
        ),
        "{e}"
    );
    assert_eq!(e.errno(), EINVAL);
}

/// Remote information that does not parse is an error value.
#[test]
fn malformed_remote_information_does_not_parse() {
    for text in [
        "",
        "1:2:3",
        "zz:1:1024:::1",
        "11:22:1000:::1",
        "11:22:1024:nohost",
    ] {
        assert!(text.parse::<RemoteInfo>().is_err(), "{text:?}");
    }
    assert!("12".parse::<RemoteAddr>().is_err());
}
