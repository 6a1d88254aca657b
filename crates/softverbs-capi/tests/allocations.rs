//! Heap allocations of the drop-in's post path: a ping-pong between two RC QPs of the
//! drop-in's device allocates nothing per round trip once warm, with every request built
//! by the application as C builds it — one way by `ibv_post_send` (8 bytes inline, as
//! `ib_send_lat` posts them), the other by
//! the extended post (`ibv_wr_start`, `ibv_wr_send`, `ibv_wr_set_sge`, `ibv_wr_complete`),
//! each receive re-posted by `ibv_post_recv` (one SGE). RDMA applications expect a post
//! that does not call `malloc`: the drop-in reads a C scatter/gather list straight into
//! the engine's `SgeList` (one entry inline), an inline payload of up to 16 bytes into its
//! `InlineData`, and an extended post's batch keeps its list from one `ibv_wr_start` to the
//! next.
//!
//! The exports are called from Rust as a C program calls them, the `verbs.h` inlines
//! through the context's ops table and the QP's function pointers (as `rule_table.rs`
//! does). The device is in-process (`SOFTVERBS_NETWORK=inprocess`), so a packet is handed
//! over on the posting thread and everything a round trip does runs on the test's thread,
//! the only one counted (by the global allocator of `counting_alloc`). Alone
//! in its test binary: it sets the environment before the drop-in opens its device.

#[path = "../../softverbs-device/tests/common/counting_alloc.rs"]
mod counting_alloc;

#[path = "common/verbs_values.rs"]
mod verbs_values;
use verbs_values::*;

use softverbs::core::cq::WcStatus;
use softverbs_capi::abi::{
    ibv_context, ibv_cq, ibv_gid, ibv_mr, ibv_pd, ibv_qp, ibv_qp_attr, ibv_qp_cap, ibv_qp_ex,
    ibv_qp_init_attr, ibv_qp_init_attr_ex, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_wc,
    verbs_context, IBV_QPT_RC, IBV_QP_EX_WITH_SEND, IBV_QP_INIT_ATTR_PD,
    IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, IBV_SEND_INLINE, IBV_SEND_SIGNALED, IBV_WR_SEND,
};
use softverbs_capi::cq::ibv_create_cq;
use softverbs_capi::device::{ibv_get_device_list, ibv_open_device, ibv_query_gid};
use softverbs_capi::mr::ibv_reg_mr;
use softverbs_capi::pd::ibv_alloc_pd;
use softverbs_capi::qp::{ibv_create_qp, ibv_modify_qp, ibv_qp_to_qp_ex};
use std::ffi::c_int;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

/// Longest a wait for one completion lasts.
const PATIENCE: Duration = Duration::from_secs(10);

/// Where a SEND reads its 8 bytes.
const SEND_AT: u64 = 1024;
/// The bytes a receive may fill, at the start of the region.
const RECV_LEN: u32 = 64;

/// The calling thread's `errno`.
fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The drop-in's objects of the test (never freed: the device lives for the process).
struct Setup {
    mr: *mut ibv_mr,
    /// Sends by `ibv_post_send`.
    a: *mut ibv_qp,
    a_cq: *mut ibv_cq,
    /// Sends by the extended post.
    b: *mut ibv_qp_ex,
    b_cq: *mut ibv_cq,
}

fn caps() -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    }
}

/// `struct ibv_qp_attr` with every byte zero, as C's `memset` makes it.
fn zeroed_attr() -> ibv_qp_attr {
    // SAFETY: `ibv_qp_attr` holds integers, structs of integers and a GID union of byte
    // arrays: all-zero bytes are a valid value.
    unsafe { std::mem::zeroed() }
}

/// RESET → INIT → RTR → RTS towards the QP numbered `remote` of the same device, at `gid`.
fn connect(qp: *mut ibv_qp, remote: u32, gid: ibv_gid) {
    let mut init = zeroed_attr();
    init.qp_state = IBV_QPS_INIT;
    init.port_num = 1;
    let mut rtr = zeroed_attr();
    rtr.qp_state = IBV_QPS_RTR;
    rtr.path_mtu = IBV_MTU_1024;
    rtr.dest_qp_num = remote;
    rtr.max_dest_rd_atomic = 1;
    rtr.min_rnr_timer = 12;
    rtr.ah_attr.is_global = 1;
    rtr.ah_attr.grh.dgid = gid;
    rtr.ah_attr.grh.hop_limit = 64;
    rtr.ah_attr.port_num = 1;
    let mut rts = zeroed_attr();
    rts.qp_state = IBV_QPS_RTS;
    rts.timeout = 14;
    rts.retry_cnt = 7;
    rts.rnr_retry = 7;
    rts.max_rd_atomic = 1;
    let steps = [
        (
            init,
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
        ),
        (
            rtr,
            IBV_QP_STATE
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER,
        ),
        (
            rts,
            IBV_QP_STATE
                | IBV_QP_SQ_PSN
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_MAX_QP_RD_ATOMIC,
        ),
    ];
    for (mut attr, mask) in steps {
        // SAFETY: `qp` is live; `attr` is readable.
        let rc = unsafe { ibv_modify_qp(qp, &mut attr, mask) };
        assert_eq!(rc, 0, "ibv_modify_qp to state {}", attr.qp_state);
    }
}

/// The drop-in's device, a region, and the two QPs, connected, each with one receive
/// posted.
fn setup() -> Setup {
    std::env::remove_var("SOFTVERBS_PCAP");
    std::env::set_var("SOFTVERBS_NETWORK", "inprocess");
    let mut n = 0;
    // SAFETY: `n` is writable; the list is never freed (the device lives for the process).
    let list = unsafe { ibv_get_device_list(&mut n) };
    assert!(!list.is_null() && n == 1, "errno {}", errno());
    // SAFETY: `list` holds one device.
    let ctx: *mut ibv_context = unsafe { ibv_open_device(*list) };
    assert!(!ctx.is_null(), "errno {}", errno());
    let mut gid = ibv_gid { raw: [0; 16] };
    // SAFETY: `ctx` is open, `gid` writable.
    assert_eq!(unsafe { ibv_query_gid(ctx, 1, 0, &mut gid) }, 0);
    // SAFETY: `ctx` is open.
    let pd: *mut ibv_pd = unsafe { ibv_alloc_pd(ctx) };
    assert!(!pd.is_null(), "errno {}", errno());
    let buf = Box::leak(vec![0u8; 64 * 1024].into_boxed_slice());
    // SAFETY: `pd` is live; `buf` lives for the process.
    let mr = unsafe {
        ibv_reg_mr(
            pd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            IBV_ACCESS_LOCAL_WRITE as c_int,
        )
    };
    assert!(!mr.is_null(), "errno {}", errno());
    // SAFETY: `ctx` is open; no channel.
    let (a_cq, b_cq) = unsafe {
        (
            ibv_create_cq(ctx, 16, null_mut(), null_mut(), 0),
            ibv_create_cq(ctx, 16, null_mut(), null_mut(), 0),
        )
    };
    assert!(!a_cq.is_null() && !b_cq.is_null(), "errno {}", errno());

    let mut attr = ibv_qp_init_attr {
        qp_context: null_mut(),
        send_cq: a_cq,
        recv_cq: a_cq,
        srq: null_mut(),
        cap: caps(),
        qp_type: IBV_QPT_RC,
        sq_sig_all: 1,
    };
    // SAFETY: `pd` and `a_cq` are live; `attr` is readable and writable.
    let a = unsafe { ibv_create_qp(pd, &mut attr) };
    assert!(!a.is_null(), "ibv_create_qp: errno {}", errno());

    // SAFETY: `ibv_qp_init_attr_ex` holds integers, raw pointers and a struct of those:
    // all-zero bytes are a valid value.
    let mut attr: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
    attr.send_cq = b_cq;
    attr.recv_cq = b_cq;
    attr.cap = caps();
    attr.qp_type = IBV_QPT_RC;
    attr.sq_sig_all = 1;
    attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    attr.pd = pd;
    attr.send_ops_flags = IBV_QP_EX_WITH_SEND;
    // SAFETY: the drop-in's contexts are extended: the `ibv_context` is the `context`
    // field of a `verbs_context`, as `verbs_get_ctx` of `verbs.h` assumes.
    let create = unsafe {
        (*ctx
            .cast::<u8>()
            .sub(std::mem::offset_of!(verbs_context, context))
            .cast::<verbs_context>())
        .create_qp_ex
    }
    .expect("verbs_context.create_qp_ex");
    // SAFETY: `ctx` is open; `attr` is readable and writable, its PD and CQ live.
    let b = unsafe { create(ctx, &mut attr) };
    assert!(!b.is_null(), "ibv_create_qp_ex: errno {}", errno());
    // SAFETY: `b` is a live QP made with send_ops_flags.
    let b_ex = unsafe { ibv_qp_to_qp_ex(b) };
    assert!(!b_ex.is_null());

    // SAFETY: both QPs are live.
    let (a_num, b_num) = unsafe { ((*a).qp_num, (*b).qp_num) };
    connect(a, b_num, gid);
    connect(b, a_num, gid);
    let setup = Setup {
        mr,
        a,
        a_cq,
        b: b_ex,
        b_cq,
    };
    post_recv(&setup, a, 0);
    post_recv(&setup, b, 0);
    setup
}

/// `ibv_post_recv`, the `verbs.h` inline, of a receive into the start of the region.
fn post_recv(setup: &Setup, qp: *mut ibv_qp, wr_id: u64) {
    // SAFETY: the region is live.
    let (base, lkey) = unsafe { ((*setup.mr).addr as u64, (*setup.mr).lkey) };
    let mut sge = ibv_sge {
        addr: base,
        length: RECV_LEN,
        lkey,
    };
    let mut wr = ibv_recv_wr {
        wr_id,
        next: null_mut(),
        sg_list: &mut sge,
        num_sge: 1,
    };
    let mut bad = null_mut();
    // SAFETY: `qp` is live and its context open (the inline reads them the same way).
    let post = unsafe { (*(*qp).context).ops.post_recv }.expect("ops.post_recv");
    // SAFETY: `qp` is live; `wr` is one request whose list is readable; `bad` writable.
    assert_eq!(unsafe { post(qp, &mut wr, &mut bad) }, 0);
}

/// `ibv_post_send`, the `verbs.h` inline, of an 8-byte SEND from `setup.a`, its payload
/// inline (`IBV_SEND_INLINE`: copied out of the buffer at the post).
fn post_send(setup: &Setup, wr_id: u64) {
    // SAFETY: the region is live.
    let (base, lkey) = unsafe { ((*setup.mr).addr as u64, (*setup.mr).lkey) };
    let mut sge = ibv_sge {
        addr: base + SEND_AT,
        length: 8,
        lkey,
    };
    // SAFETY: `ibv_send_wr` holds integers, raw pointers and unions of structs of those:
    // all-zero bytes are a valid value.
    let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = wr_id;
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    let mut bad = null_mut();
    let qp = setup.a;
    // SAFETY: `qp` is live and its context open (the inline reads them the same way).
    let post = unsafe { (*(*qp).context).ops.post_send }.expect("ops.post_send");
    // SAFETY: `qp` is live; `wr` is one request whose list is readable; `bad` writable.
    assert_eq!(unsafe { post(qp, &mut wr, &mut bad) }, 0);
}

/// The extended post of an 8-byte SEND from `setup.b`: `ibv_wr_start`, `ibv_wr_send`,
/// `ibv_wr_set_sge`, `ibv_wr_complete` (the `verbs.h` inlines call the QP's pointers).
fn wr_send(setup: &Setup, wr_id: u64) {
    // SAFETY: the region is live.
    let (base, lkey) = unsafe { ((*setup.mr).addr as u64, (*setup.mr).lkey) };
    let qpx = setup.b;
    // SAFETY: `qpx` is a live extended QP made with IBV_QP_EX_WITH_SEND, used by this
    // thread alone between `wr_start` and `wr_complete` (the builder contract).
    unsafe {
        (*qpx).wr_start.expect("wr_start")(qpx);
        (*qpx).wr_id = wr_id;
        (*qpx).wr_flags = IBV_SEND_SIGNALED;
        (*qpx).wr_send.expect("wr_send")(qpx);
        (*qpx).wr_set_sge.expect("wr_set_sge")(qpx, lkey, base + SEND_AT, 8);
        assert_eq!((*qpx).wr_complete.expect("wr_complete")(qpx), 0);
    }
}

/// `ibv_poll_cq`, the `verbs.h` inline, until one completion arrives: a success.
fn wait_one(cq: *mut ibv_cq) {
    let deadline = Instant::now() + PATIENCE;
    let mut wc = [ibv_wc::default(); 1];
    // SAFETY: `cq` is live and its context open.
    let poll = unsafe { (*(*cq).context).ops.poll_cq }.expect("ops.poll_cq");
    loop {
        // SAFETY: `cq` is live; `wc` has room for one completion.
        let n = unsafe { poll(cq, 1, wc.as_mut_ptr()) };
        assert!(n >= 0, "ibv_poll_cq: {n}");
        if n == 1 {
            assert_eq!(wc[0].status(), WcStatus::Success, "{:?}", wc[0]);
            return;
        }
        assert!(Instant::now() < deadline, "no completion");
    }
}

/// One round trip: `a` sends by `ibv_post_send`, `b` answers by the extended post; each
/// reposts the receive its peer's message took. Counted when `counted`.
fn round_trip(setup: &Setup, n: u64, counted: bool) {
    // SAFETY: both QPs are live.
    let (a, b) = (setup.a, unsafe { &raw mut (*setup.b).qp_base });
    counting_alloc::count(counted);
    post_send(setup, n);
    wait_one(setup.b_cq);
    post_recv(setup, b, n);
    wait_one(setup.a_cq);
    wr_send(setup, n);
    wait_one(setup.a_cq);
    post_recv(setup, a, n);
    wait_one(setup.b_cq);
    counting_alloc::count(false);
}

/// Before the drop-in read scatter/gather lists into an inline list and kept the
/// extended post's batch list, a round trip here allocated 5 times: a `Vec` per request
/// read from C (two sends, two receives) and the batch's list; and once more, before an
/// inline payload of 8 bytes stayed in the request, for the `Vec` it was copied into.
#[test]
fn posting_through_the_c_verbs_allocates_nothing_per_round_trip() {
    let setup = setup();
    counting_alloc::assert_round_trips_allocate_nothing(|n, counted| {
        round_trip(&setup, n, counted)
    });
}
