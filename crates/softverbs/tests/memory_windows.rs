//! Memory windows through the safe API, between two devices (`ibv_alloc_mw(3)`,
//! `ibv_bind_mw(3)`, `ibv_post_send(3)` `IBV_WR_BIND_MW` / `IBV_WR_LOCAL_INV`, IBTA vol. 1
//! 10.6.7): the remote side reaches the window's range with its R_Key, with the window's
//! rights and bounds, inside the region's; a refused bind completes with
//! IBV_WC_MW_BIND_ERR; beyond the window, after invalidation and after
//! `ibv_dealloc_mw` the R_Key is refused (IBV_WC_REM_ACCESS_ERR at the requester).

mod common;

use common::*;
use softverbs::*;

/// Access of the responder's region windows are bound to.
const BINDABLE: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::MW_BIND);
const READ_WRITE: AccessFlags = AccessFlags::REMOTE_READ.union(AccessFlags::REMOTE_WRITE);

/// Two in-process devices, an RC QP on each, connected.
fn pair() -> (Side, Side) {
    rc_pair(in_process(), in_process())
}

/// Posts `request` on `side` and returns its completion.
fn complete(side: &Side, request: SendRequest) -> WorkCompletion {
    side.qp.post_send(request).unwrap();
    wait_for(&side.cq, 1)[0]
}

/// `ibv_post_send(3)` IBV_WR_BIND_MW, then RDMA WRITE and READ through the window's
/// R_Key: inside the window both land on the region's bytes; a write crossing the
/// window's end is refused (IBV_WC_REM_ACCESS_ERR) although the region goes on.
#[test]
fn type_2_window_reads_and_writes_inside_its_bounds_and_refuses_beyond() {
    let (a, b) = pair();
    let region = b.pd.reg_mr(4096, BINDABLE).unwrap();
    let mw = b.pd.alloc_mw(WindowType::Two).unwrap();
    let bind = complete(
        &b,
        mw.bind(7, region.slice(1024..2048).unwrap(), READ_WRITE),
    );
    assert_eq!((bind.wr_id(), bind.status()), (7, WcStatus::Success));
    assert_eq!(bind.result().unwrap().opcode(), WcOpcode::BindMw);
    let window = mw.remote(&region.slice(1024..2048).unwrap());
    assert_eq!(window.rkey, mw.rkey());
    assert_ne!(window.rkey, region.rkey());

    a.mr.write_at(0, b"through the window").unwrap();
    let write = SendRequest::write(1, &[a.mr.slice(0..18).unwrap()], window.offset(8));
    assert_eq!(complete(&a, write).status(), WcStatus::Success);
    assert_eq!(region.read_vec(1032..1050).unwrap(), b"through the window");

    let read = SendRequest::read(2, &[a.mr.slice(100..118).unwrap()], window.offset(8));
    assert_eq!(complete(&a, read).status(), WcStatus::Success);
    assert_eq!(a.mr.read_vec(100..118).unwrap(), b"through the window");

    let crossing = SendRequest::write(3, &[a.mr.slice(0..16).unwrap()], window.offset(1020));
    assert_eq!(complete(&a, crossing).status(), WcStatus::RemAccessErr);
    assert_eq!(region.read_vec(2044..2048).unwrap(), [0; 4]);
}

/// The window's own rights: a window granting only remote read refuses a write, though
/// the region (local write, MW_BIND) would let a remote write through another window.
#[test]
fn read_only_window_refuses_rdma_write() {
    let (a, b) = pair();
    let region = b.pd.reg_mr(4096, BINDABLE).unwrap();
    let mw = b.pd.alloc_mw(WindowType::Two).unwrap();
    let slice = region.slice(0..512).unwrap();
    let bind = complete(&b, mw.bind(1, slice, AccessFlags::REMOTE_READ));
    assert_eq!(bind.status(), WcStatus::Success);
    let window = mw.remote(&region.slice(0..512).unwrap());
    let write = SendRequest::write(2, &[a.mr.slice(0..8).unwrap()], window);
    assert_eq!(complete(&a, write).status(), WcStatus::RemAccessErr);
}

/// `IBV_WR_LOCAL_INV` invalidates a type 2 window's R_Key: the peer's access is refused
/// afterwards (IBV_WC_REM_ACCESS_ERR), as rxe's `rxe_invalidate_mw`.
#[test]
fn local_invalidate_makes_the_window_rkey_refuse_remote_access() {
    let (a, b) = pair();
    let region = b.pd.reg_mr(4096, BINDABLE).unwrap();
    let mw = b.pd.alloc_mw(WindowType::Two).unwrap();
    let bound = complete(&b, mw.bind(1, region.slice(..).unwrap(), READ_WRITE));
    assert_eq!(bound.status(), WcStatus::Success);
    let window = mw.remote(&region.slice(..).unwrap());
    let read = SendRequest::read(2, &[a.mr.slice(0..8).unwrap()], window);
    assert_eq!(complete(&a, read).status(), WcStatus::Success);

    let inv = complete(&b, SendRequest::local_invalidate(3, window.rkey));
    assert_eq!(
        (inv.status(), inv.result().unwrap().opcode()),
        (WcStatus::Success, WcOpcode::LocalInv)
    );
    let read = SendRequest::read(4, &[a.mr.slice(0..8).unwrap()], window);
    assert_eq!(complete(&a, read).status(), WcStatus::RemAccessErr);
}

/// `ibv_post_send(3)` IBV_WR_SEND_WITH_INV naming a type 2 window's R_Key: the responder
/// invalidates it (the receive completion carries IBV_WC_WITH_INV and the key), and a
/// later access through it is refused.
#[test]
fn send_with_invalidate_invalidates_the_window_on_the_responder() {
    let (a, b) = pair();
    let region = b.pd.reg_mr(4096, BINDABLE).unwrap();
    let mw = b.pd.alloc_mw(WindowType::Two).unwrap();
    let bound = complete(&b, mw.bind(1, region.slice(..).unwrap(), READ_WRITE));
    assert_eq!(bound.status(), WcStatus::Success);
    let window = mw.remote(&region.slice(..).unwrap());
    b.qp.post_recv(RecvRequest::new(9, &[b.mr.slice(0..64).unwrap()]))
        .unwrap();
    let send = SendRequest::send_with_invalidate(2, &[a.mr.slice(0..16).unwrap()], window.rkey);
    assert_eq!(complete(&a, send).status(), WcStatus::Success);
    let recv = wait_for(&b.cq, 1)[0];
    assert_eq!(recv.status(), WcStatus::Success);
    assert_eq!(recv.result().unwrap().invalidated_rkey(), Some(window.rkey));
    let write = SendRequest::write(3, &[a.mr.slice(0..8).unwrap()], window);
    assert_eq!(complete(&a, write).status(), WcStatus::RemAccessErr);
}

/// `ibv_dealloc_mw(3)` of a bound window: its R_Key is refused afterwards.
#[test]
fn dealloc_of_a_bound_window_makes_its_rkey_refuse_remote_access() {
    let (a, b) = pair();
    let region = b.pd.reg_mr(4096, BINDABLE).unwrap();
    let mw = b.pd.alloc_mw(WindowType::Two).unwrap();
    let bound = complete(&b, mw.bind(1, region.slice(..).unwrap(), READ_WRITE));
    assert_eq!(bound.status(), WcStatus::Success);
    let window = mw.remote(&region.slice(..).unwrap());
    let read = SendRequest::read(2, &[a.mr.slice(0..8).unwrap()], window);
    assert_eq!(complete(&a, read).status(), WcStatus::Success);
    mw.dealloc().unwrap();
    let read = SendRequest::read(3, &[a.mr.slice(0..8).unwrap()], window);
    assert_eq!(complete(&a, read).status(), WcStatus::RemAccessErr);
    // The region has no window left: it deregisters.
    region.dereg().unwrap();
}

/// `ibv_bind_mw(3)` on a type 1 window: the returned R_Key (`ibv_inc_rkey` of the old one)
/// reaches the range once the bind completes; binding again gives a new key and the old
/// one is refused; a zero-length bind unbinds.
#[test]
fn type_1_bind_gives_a_new_rkey_each_time_and_the_old_one_is_refused() {
    let (a, b) = pair();
    let region = b.pd.reg_mr(4096, BINDABLE).unwrap();
    region.write_at(0, b"type one").unwrap();
    let mw = b.pd.alloc_mw(WindowType::One).unwrap();
    let old = mw.rkey();
    let first =
        b.qp.bind_mw(&mw, 1, Some(region.slice(0..64).unwrap()), READ_WRITE, true)
            .unwrap();
    assert_eq!(first, inc_rkey(old));
    assert_eq!(wait_for(&b.cq, 1)[0].status(), WcStatus::Success);
    assert_eq!(mw.rkey(), first);
    let read = SendRequest::read(
        2,
        &[a.mr.slice(0..8).unwrap()],
        RemoteAddr::new(region.addr(), first),
    );
    assert_eq!(complete(&a, read).status(), WcStatus::Success);
    assert_eq!(a.mr.read_vec(0..8).unwrap(), b"type one");

    let second =
        b.qp.bind_mw(&mw, 3, Some(region.slice(0..64).unwrap()), READ_WRITE, true)
            .unwrap();
    assert_ne!(second, first);
    assert_eq!(wait_for(&b.cq, 1)[0].status(), WcStatus::Success);
    let stale = SendRequest::read(
        4,
        &[a.mr.slice(0..8).unwrap()],
        RemoteAddr::new(region.addr(), first),
    );
    assert_eq!(complete(&a, stale).status(), WcStatus::RemAccessErr);
}

/// Each bind rule of IBTA 10.6.7 (rxe's `rxe_check_bind_mw`) completes the bind with
/// IBV_WC_MW_BIND_ERR: a region without IBV_ACCESS_MW_BIND (C10-73), remote write on a
/// region without local write (C10-74), a window of
/// another PD than the QP (C10-72), a type 1 window bound with IBV_WR_BIND_MW, a type 2
/// window bound with `ibv_bind_mw`, a type 2 window already bound (o10-37.2.30).
#[test]
fn every_bind_rule_completes_with_mw_bind_err() {
    type Case = fn(&Side) -> WcStatus;
    let cases: [(&str, Case); 6] = [
        ("region without MW_BIND", |b| {
            let region = b.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
            let mw = b.pd.alloc_mw(WindowType::Two).unwrap();
            complete(b, mw.bind(1, region.slice(..).unwrap(), READ_WRITE)).status()
        }),
        ("remote write without local write", |b| {
            let region = b.pd.reg_mr(4096, AccessFlags::MW_BIND).unwrap();
            let mw = b.pd.alloc_mw(WindowType::Two).unwrap();
            let slice = region.slice(..).unwrap();
            complete(b, mw.bind(1, slice, AccessFlags::REMOTE_WRITE)).status()
        }),
        ("window of another PD", |b| {
            let pd = b.ctx.alloc_pd();
            let region = pd.reg_mr(4096, BINDABLE).unwrap();
            let mw = pd.alloc_mw(WindowType::Two).unwrap();
            complete(b, mw.bind(1, region.slice(..).unwrap(), READ_WRITE)).status()
        }),
        ("type 1 window with IBV_WR_BIND_MW", |b| {
            let region = b.pd.reg_mr(4096, BINDABLE).unwrap();
            let mw = b.pd.alloc_mw(WindowType::One).unwrap();
            complete(b, mw.bind(1, region.slice(..).unwrap(), READ_WRITE)).status()
        }),
        ("type 2 window with ibv_bind_mw", |b| {
            let region = b.pd.reg_mr(4096, BINDABLE).unwrap();
            let mw = b.pd.alloc_mw(WindowType::Two).unwrap();
            let slice = Some(region.slice(..).unwrap());
            b.qp.bind_mw(&mw, 1, slice, READ_WRITE, true).unwrap();
            wait_for(&b.cq, 1)[0].status()
        }),
        ("type 2 window already bound", |b| {
            let region = b.pd.reg_mr(4096, BINDABLE).unwrap();
            let mw = b.pd.alloc_mw(WindowType::Two).unwrap();
            let first = complete(b, mw.bind(1, region.slice(..).unwrap(), READ_WRITE));
            assert_eq!(first.status(), WcStatus::Success);
            complete(b, mw.bind(2, region.slice(..).unwrap(), READ_WRITE)).status()
        }),
    ];
    for (rule, case) in cases {
        let (_a, b) = pair();
        assert_eq!(case(&b), WcStatus::MwBindErr, "{rule}");
        assert_eq!(
            b.qp.state().unwrap(),
            QpState::Err,
            "{rule}: a failed bind moves the QP to ERR"
        );
    }
}

/// `IBV_WR_LOCAL_INV` of a type 1 window's R_Key (o10-37.2.26) or an ordinary region's
/// completes with IBV_WC_LOC_QP_OP_ERR (rxe's `rxe_do_local_ops`).
#[test]
fn local_invalidate_of_a_type_1_window_or_a_region_is_loc_qp_op_err() {
    for type_1 in [true, false] {
        let (_a, b) = pair();
        let mw = b.pd.alloc_mw(WindowType::One).unwrap();
        let rkey = if type_1 { mw.rkey() } else { b.mr.rkey() };
        let done = complete(&b, SendRequest::local_invalidate(1, rkey));
        assert_eq!(done.status(), WcStatus::LocQpOpErr, "type 1: {type_1}");
    }
}

/// `ibv_dereg_mr(3)` "fails if any memory window is still bound to this MR" (EINVAL, as
/// rxe's `rxe_dereg_mr`), and `ibv_dealloc_pd(3)` while a window is in the PD (EBUSY).
/// The safe API cannot express either (an `Mw` borrows its regions and holds its PD), so
/// the core's device is asked directly.
#[test]
fn dereg_of_a_region_with_a_bound_window_is_einval_and_dealloc_pd_with_a_window_ebusy() {
    let (_a, b) = pair();
    let region = b.pd.reg_mr(4096, BINDABLE).unwrap();
    let mw = b.pd.alloc_mw(WindowType::Two).unwrap();
    let bound = complete(&b, mw.bind(1, region.slice(..).unwrap(), READ_WRITE));
    assert_eq!(bound.status(), WcStatus::Success);
    let device = b.ctx.device();
    let refused = Error::from(device.dereg_mr(region.lkey()).unwrap_err());
    assert_eq!(refused.errno(), libc::EINVAL);
    let busy = Error::from(device.dealloc_pd(b.pd.handle()).unwrap_err());
    assert_eq!(busy.errno(), libc::EBUSY);
}

/// `query_device`: rxe's memory-window limit.
#[test]
fn device_reports_max_mw() {
    assert_eq!(in_process().query_device().max_mw, 1 << 20);
}
