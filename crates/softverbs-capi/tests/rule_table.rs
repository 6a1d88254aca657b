//! Issue #12's rule table (`crates/softverbs/tests/rules/table.rs`, included below by path
//! so it is written once) through the drop-in `libibverbs.so.1`: every case calls the
//! exported functions directly from Rust as a C program would, and reaches the `verbs.h`
//! inlines the way they do: `ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv`,
//! `ibv_poll_cq` and `ibv_req_notify_cq` through the context's ops table;
//! `ibv_create_cq_ex`, `ibv_create_qp_ex`, `ibv_query_device_ex` and
//! `ibv_query_rt_values_ex` through the `verbs_context` in front of the context; the
//! extended poll (`ibv_start_poll` …) and post (`ibv_wr_*`) through the CQ's and QP's own
//! function pointers. Its outcome is compared with the documented one (or, for a row that
//! records a drop-in discrepancy, with what the drop-in does): `errno` after a call
//! returning a pointer, the return value of a call returning `int` (`ibv_modify_qp(3)`,
//! `ibv_destroy_*`, `ibv_dealloc_pd(3)`, `ibv_post_send(3)`: "returns 0 on success, or the
//! value of errno on failure"), the negated return value of `ibv_poll_cq(3)`, completion
//! statuses, completion and asynchronous events, a destroy that waits. All failures are
//! reported together at the end. The same table runs through the safe API in
//! `crates/softverbs/tests/rule_table.rs`.
//!
//! The drop-in opens one device per process, configured from the environment: this test
//! binary gives it `SOFTVERBS_ADDR=127.0.0.229:0` (an address of its own, an ephemeral
//! port) before the first call. `context->async_fd` is made non-blocking, as the C rule
//! programs do, so every wait for an asynchronous event is a bounded `poll(2)`. A destroy
//! that may wait runs on a thread of its own (left behind, with its object, if it never
//! returns). The memlock cases lower this thread's soft `RLIMIT_MEMLOCK` and drop
//! `CAP_IPC_LOCK` from its effective set for the call, restoring both after.

#[path = "../../softverbs/tests/memlock/mod.rs"]
mod memlock;
#[path = "../../softverbs/tests/rules/table.rs"]
mod table;

#[path = "common/verbs_values.rs"]
mod verbs_values;
use verbs_values::*;

use softverbs_capi::abi::{
    ibv_ah, ibv_ah_attr, ibv_async_event, ibv_comp_channel, ibv_context, ibv_cq,
    ibv_cq_init_attr_ex, ibv_device, ibv_device_attr, ibv_device_attr_ex, ibv_gid,
    ibv_global_route, ibv_mr, ibv_mw, ibv_pd, ibv_poll_cq_attr, ibv_qp, ibv_qp_attr, ibv_qp_cap,
    ibv_qp_init_attr, ibv_qp_init_attr_ex, ibv_recv_wr, ibv_send_wr, ibv_send_wr_rdma,
    ibv_send_wr_ud, ibv_sge, ibv_srq, ibv_srq_attr, ibv_srq_init_attr, ibv_values_ex, ibv_wc,
    verbs_context, IBV_CQ_INIT_ATTR_MASK_FLAGS, IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN,
    IBV_EVENT_COMM_EST, IBV_EVENT_CQ_ERR, IBV_EVENT_QP_ACCESS_ERR, IBV_EVENT_QP_FATAL,
    IBV_EVENT_QP_LAST_WQE_REACHED, IBV_EVENT_QP_REQ_ERR, IBV_EVENT_SQ_DRAINED, IBV_EVENT_SRQ_ERR,
    IBV_EVENT_SRQ_LIMIT_REACHED, IBV_MW_TYPE_1, IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD,
    IBV_QP_EX_WITH_RDMA_WRITE, IBV_QP_EX_WITH_SEND, IBV_QP_INIT_ATTR_PD,
    IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, IBV_SEND_INLINE, IBV_SEND_SIGNALED, IBV_SEND_SOLICITED,
    IBV_SRQ_LIMIT, IBV_VALUES_MASK_RAW_CLOCK, IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE, IBV_WR_SEND,
};
use softverbs_capi::ah::{ibv_create_ah, ibv_destroy_ah};
use softverbs_capi::boundary::set_errno;
use softverbs_capi::cq::{
    ibv_ack_cq_events, ibv_create_comp_channel, ibv_create_cq, ibv_destroy_comp_channel,
    ibv_destroy_cq, ibv_get_cq_event, ibv_resize_cq,
};
use softverbs_capi::device::{
    ibv_close_device, ibv_free_device_list, ibv_get_device_list, ibv_open_device, ibv_query_device,
    ibv_query_gid,
};
use softverbs_capi::misc::{ibv_ack_async_event, ibv_get_async_event};
use softverbs_capi::mr::{ibv_dereg_mr, ibv_reg_mr, ibv_reg_mr_iova, ibv_reg_mr_iova2};
use softverbs_capi::pd::{ibv_alloc_pd, ibv_dealloc_pd};
use softverbs_capi::qp::{
    ibv_create_qp, ibv_destroy_qp, ibv_modify_qp, ibv_qp_to_qp_ex, ibv_query_qp,
};
use softverbs_capi::srq::{ibv_create_srq, ibv_destroy_srq, ibv_modify_srq};
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::time::{Duration, Instant};
use table::{
    AsyncSource, Case, CqRole, CqStep, DropIn, EventType, Expect, Memory, Opcode, PdUser, PostPath,
    QpKind, QpStateName, RegCall, RegionPd, Status, MAX_ITERS, QUIET, RULES, WAIT,
};

/// The device address of this test binary (`SOFTVERBS_ADDR`).
const DEVICE_ADDR: &str = "127.0.0.229:0";

/// Longest a case waits for a completion.
const PATIENCE: Duration = WAIT;

/// The Q_Key of the UD cases.
const QKEY: u32 = 0x1111_1111;

/// The mask of RESET → INIT for RC.
const INIT_MASK: c_int = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
/// The mask of INIT → RTR for RC.
const RTR_MASK: c_int = IBV_QP_STATE
    | IBV_QP_AV
    | IBV_QP_PATH_MTU
    | IBV_QP_DEST_QPN
    | IBV_QP_RQ_PSN
    | IBV_QP_MAX_DEST_RD_ATOMIC
    | IBV_QP_MIN_RNR_TIMER;
/// The mask of RTR → RTS for RC.
const RTS_MASK: c_int = IBV_QP_STATE
    | IBV_QP_SQ_PSN
    | IBV_QP_TIMEOUT
    | IBV_QP_RETRY_CNT
    | IBV_QP_RNR_RETRY
    | IBV_QP_MAX_QP_RD_ATOMIC;

/// `repr(C)` plain-data `verbs.h` structs: integers, raw pointers, optional function
/// pointers and unions of those, for which all-zero bytes are a valid value (what C's
/// `memset(&x, 0, sizeof(x))` makes).
///
/// # Safety
///
/// Only for types whose every field is valid when all its bytes are zero.
unsafe trait Zeroable: Copy {
    fn zeroed() -> Self {
        // SAFETY: the implementor guarantees all-zero bytes are a valid value (the trait's
        // contract).
        unsafe { std::mem::zeroed() }
    }
}

// SAFETY: integers and arrays of them, a `c_char` array.
unsafe impl Zeroable for ibv_device_attr {}
// SAFETY: integers, two nested structs of integers and a GID union of byte arrays.
unsafe impl Zeroable for ibv_qp_attr {}
// SAFETY: raw pointers, integers and a struct of integers.
unsafe impl Zeroable for ibv_qp_init_attr {}
// SAFETY: integers, raw pointers and unions of structs of those.
unsafe impl Zeroable for ibv_send_wr {}
// SAFETY: a union of a byte array and a struct of two integers.
unsafe impl Zeroable for ibv_gid {}

/// The calling thread's `errno`.
fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// What a call through the drop-in gave.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    /// An outcome in the table's terms.
    Seen(Expect),
    /// One the table has no word for (a completion status it does not name, …).
    Other(String),
}

impl Outcome {
    const OK: Outcome = Outcome::Seen(Expect::Ok);

    /// A refusal with this errno.
    fn failed(errno: i32) -> Outcome {
        Outcome::Seen(Expect::Errno(errno))
    }

    /// The outcome of a call returning an `int`: 0, or the errno value.
    fn of_rc(rc: c_int) -> Outcome {
        if rc == 0 {
            Outcome::OK
        } else {
            Outcome::failed(rc)
        }
    }

    fn is_ok(&self) -> bool {
        *self == Outcome::OK
    }

    fn describe(&self) -> String {
        match self {
            Outcome::Seen(e) => describe(*e),
            Outcome::Other(text) => text.clone(),
        }
    }
}

/// An expected outcome in words.
fn describe(e: Expect) -> String {
    match e {
        Expect::Ok => "success".into(),
        Expect::Errno(n) => format!("errno {n}"),
        other => format!("{other:?}"),
    }
}

/// A step undoing what a case made (a destroy, dealloc or dereg): what it is and the call.
type Undo = (String, Box<dyn FnOnce() -> c_int>);

/// Everything a case made, destroyed in reverse order at the end of the case (also when a
/// setup step fails and the case returns early).
#[derive(Default)]
struct Scope {
    undo: Vec<Option<Undo>>,
}

impl Scope {
    /// Registers `f` to undo something; returns its index for [`Scope::cancel`].
    fn defer(&mut self, what: impl Into<String>, f: impl FnOnce() -> c_int + 'static) -> usize {
        self.undo.push(Some((what.into(), Box::new(f))));
        self.undo.len() - 1
    }

    /// Forgets step `i`: what it would undo is already gone.
    fn cancel(&mut self, i: usize) {
        self.undo[i] = None;
    }

    /// Runs every remaining step, latest first; the ones that failed.
    fn finish(&mut self) -> Vec<String> {
        let mut failed = Vec::new();
        while let Some(step) = self.undo.pop() {
            if let Some((what, f)) = step {
                let rc = f();
                if rc != 0 {
                    failed.push(format!("cleanup: {what} returned {rc}"));
                }
            }
        }
        failed
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// The open context and what the device reports, shared by every case.
struct Device {
    ctx: *mut ibv_context,
    attr: ibv_device_attr,
    gid: ibv_gid,
}

impl Device {
    fn limit(&self, value: c_int, what: &str) -> Result<u32, String> {
        u32::try_from(value).map_err(|_| format!("setup: ibv_query_device gave {what} {value}"))
    }
}

fn alloc_pd(dev: &Device, scope: &mut Scope) -> Result<(*mut ibv_pd, usize), String> {
    // SAFETY: `dev.ctx` is the open context.
    let pd = unsafe { ibv_alloc_pd(dev.ctx) };
    if pd.is_null() {
        return Err(format!("setup: ibv_alloc_pd: errno {}", errno()));
    }
    // SAFETY: `pd` is live until this step, which runs once, after the PD's objects are
    // destroyed (steps run latest first).
    let i = scope.defer("ibv_dealloc_pd", move || unsafe { ibv_dealloc_pd(pd) });
    Ok((pd, i))
}

fn create_cq(dev: &Device, cqe: c_int, scope: &mut Scope) -> Result<(*mut ibv_cq, usize), String> {
    // SAFETY: `dev.ctx` is the open context; no channel.
    let cq = unsafe { ibv_create_cq(dev.ctx, cqe, null_mut(), null_mut(), 0) };
    if cq.is_null() {
        return Err(format!("setup: ibv_create_cq({cqe}): errno {}", errno()));
    }
    // SAFETY: `cq` is live until this step, which runs once, after its QPs are destroyed.
    let i = scope.defer("ibv_destroy_cq", move || unsafe { ibv_destroy_cq(cq) });
    Ok((cq, i))
}

/// `ibv_create_qp`: the QP (deferred for destruction) or the errno.
fn try_create_qp(
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    qp_type: u32,
    cap: ibv_qp_cap,
    scope: &mut Scope,
) -> Result<(*mut ibv_qp, usize), i32> {
    let mut init = ibv_qp_init_attr {
        qp_context: null_mut(),
        send_cq: cq,
        recv_cq: cq,
        srq,
        cap,
        qp_type,
        sq_sig_all: 1,
    };
    set_errno(0);
    // SAFETY: `pd`, `cq` and `srq` (or NULL) are live; `init` is readable and writable.
    let qp = unsafe { ibv_create_qp(pd, &mut init) };
    if qp.is_null() {
        return Err(errno());
    }
    // SAFETY: `qp` is live until this step, which runs once.
    let i = scope.defer("ibv_destroy_qp", move || unsafe { ibv_destroy_qp(qp) });
    Ok((qp, i))
}

fn small_caps(max_inline_data: u32) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data,
    }
}

fn create_qp(
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    qp_type: u32,
    cap: ibv_qp_cap,
    scope: &mut Scope,
) -> Result<*mut ibv_qp, String> {
    try_create_qp(pd, cq, srq, qp_type, cap, scope)
        .map(|(qp, _)| qp)
        .map_err(|e| format!("setup: ibv_create_qp: errno {e}"))
}

fn create_srq(
    pd: *mut ibv_pd,
    max_wr: u32,
    scope: &mut Scope,
) -> Result<(*mut ibv_srq, usize), i32> {
    let mut init = ibv_srq_init_attr {
        srq_context: null_mut(),
        attr: ibv_srq_attr {
            max_wr,
            max_sge: 1,
            srq_limit: 0,
        },
    };
    set_errno(0);
    // SAFETY: `pd` is live; `init` is readable and writable.
    let srq = unsafe { ibv_create_srq(pd, &mut init) };
    if srq.is_null() {
        return Err(errno());
    }
    // SAFETY: `srq` is live until this step, which runs once, after its QPs are destroyed.
    let i = scope.defer("ibv_destroy_srq", move || unsafe { ibv_destroy_srq(srq) });
    Ok((srq, i))
}

/// `ibv_alloc_mw`, the `verbs.h` inline: through the context's `ops.alloc_mw` (an error
/// if it is NULL); the window, or the errno of its refusal. A window is freed by
/// `ibv_dealloc_mw` (the inline: `ops.dealloc_mw`) at the end of the case.
fn alloc_mw(
    pd: *mut ibv_pd,
    mw_type: u32,
    scope: &mut Scope,
) -> Result<Result<*mut ibv_mw, i32>, String> {
    // SAFETY: `pd` is live and its context open (the inline reads them the same way).
    let ops = unsafe { &(*(*pd).context).ops };
    let alloc = ops
        .alloc_mw
        .ok_or("setup: the context's ops.alloc_mw is NULL")?;
    let dealloc = ops
        .dealloc_mw
        .ok_or("setup: the context's ops.dealloc_mw is NULL")?;
    set_errno(0);
    // SAFETY: `pd` is live; any type value may be passed (the call checks it).
    let mw = unsafe { alloc(pd, mw_type) };
    if mw.is_null() {
        return Ok(Err(errno()));
    }
    // SAFETY: `mw` is live until this step, which runs once, before its PD's.
    scope.defer("ibv_dealloc_mw", move || unsafe { dealloc(mw) });
    Ok(Ok(mw))
}

fn create_ah(
    dev: &Device,
    pd: *mut ibv_pd,
    sgid_index: u8,
    port: u8,
    scope: &mut Scope,
) -> Result<*mut ibv_ah, i32> {
    let mut attr = ibv_ah_attr {
        grh: ibv_global_route {
            dgid: dev.gid,
            flow_label: 0,
            sgid_index,
            hop_limit: 64,
            traffic_class: 0,
        },
        dlid: 0,
        sl: 0,
        src_path_bits: 0,
        static_rate: 0,
        is_global: 1,
        port_num: port,
    };
    set_errno(0);
    // SAFETY: `pd` is live; `attr` is readable.
    let ah = unsafe { ibv_create_ah(pd, &mut attr) };
    if ah.is_null() {
        return Err(errno());
    }
    // SAFETY: `ah` is live until this step, which runs once.
    scope.defer("ibv_destroy_ah", move || unsafe { ibv_destroy_ah(ah) });
    Ok(ah)
}

/// `ibv_reg_mr` of `buf[..len]`: the region (deferred for deregistration) or the errno.
/// `buf` outlives the scope (the caller declares it first).
fn reg_mr(
    pd: *mut ibv_pd,
    buf: &mut [u8],
    len: usize,
    access: u32,
    scope: &mut Scope,
) -> Result<*mut ibv_mr, i32> {
    assert!(len <= buf.len());
    set_errno(0);
    // SAFETY: `pd` is live; `buf` stays allocated and unmoved until after the scope's
    // steps ran, so until the region is deregistered.
    let mr = unsafe { ibv_reg_mr(pd, buf.as_mut_ptr().cast::<c_void>(), len, access as c_int) };
    if mr.is_null() {
        return Err(errno());
    }
    // SAFETY: `mr` is live until this step, which runs once.
    scope.defer("ibv_dereg_mr", move || unsafe { ibv_dereg_mr(mr) });
    Ok(mr)
}

fn modify(qp: *mut ibv_qp, mut attr: ibv_qp_attr, mask: c_int) -> c_int {
    // SAFETY: `qp` is live; `attr` is readable.
    unsafe { ibv_modify_qp(qp, &mut attr, mask) }
}

fn state_of(qp: *mut ibv_qp) -> Result<u32, String> {
    let mut attr = ibv_qp_attr::zeroed();
    let mut init = ibv_qp_init_attr::zeroed();
    // SAFETY: `qp` is live; both structs are writable.
    let rc = unsafe { ibv_query_qp(qp, &mut attr, IBV_QP_STATE, &mut init) };
    if rc != 0 {
        return Err(format!("ibv_query_qp returned {rc}"));
    }
    Ok(attr.qp_state)
}

/// Records a problem if `qp` is not in `want`.
fn expect_state(qp: *mut ibv_qp, want: u32, problems: &mut Vec<String>) {
    match state_of(qp) {
        Ok(now) if now == want => {}
        Ok(now) => problems.push(format!(
            "after the call the QP is in state {now}, expected {want} (enum ibv_qp_state)"
        )),
        Err(e) => problems.push(format!("after the call: {e}")),
    }
}

fn init_attr(port: u8, pkey_index: u16, access: u32) -> ibv_qp_attr {
    let mut a = ibv_qp_attr::zeroed();
    a.qp_state = IBV_QPS_INIT;
    a.port_num = port;
    a.pkey_index = pkey_index;
    a.qp_access_flags = access;
    a
}

fn rtr_attr(dev: &Device, dest_qp_num: u32, sgid_index: u8, max_dest: u8) -> ibv_qp_attr {
    let mut a = ibv_qp_attr::zeroed();
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = dest_qp_num;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = max_dest;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = dev.gid;
    a.ah_attr.grh.sgid_index = sgid_index;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    a
}

fn rts_attr() -> ibv_qp_attr {
    let mut a = ibv_qp_attr::zeroed();
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    a
}

fn qp_num(qp: *mut ibv_qp) -> u32 {
    // SAFETY: `qp` is a live QP (C reads `qp->qp_num` the same way).
    unsafe { (*qp).qp_num }
}

/// `ibv_post_send`, the `verbs.h` inline: `qp->context->ops.post_send`. Returns the result
/// and whether `*bad_wr` named the request when it failed.
fn post_send(qp: *mut ibv_qp, wr: &mut ibv_send_wr) -> Result<(c_int, bool), String> {
    // SAFETY: `qp` is a live QP and its context open (the inline reads them the same way).
    let post = unsafe { (*(*qp).context).ops.post_send }
        .ok_or("setup: the context's ops.post_send is NULL")?;
    let mut bad: *mut ibv_send_wr = null_mut();
    let wr_ptr: *mut ibv_send_wr = wr;
    // SAFETY: `qp` is live; `wr` is one valid request (no next) whose scatter/gather list
    // and AH are live; `bad` is writable.
    let rc = unsafe { post(qp, wr_ptr, &mut bad) };
    Ok((rc, rc == 0 || bad == wr_ptr))
}

/// `ibv_poll_cq`, the `verbs.h` inline, until one completion arrives (bounded by
/// [`PATIENCE`] and [`MAX_ITERS`]); a problem if none does or it is not successful.
fn await_completion(cq: *mut ibv_cq, problems: &mut Vec<String>) {
    if let Some(wc) = poll_n(cq, 1, "a completion", problems).first() {
        if wc.result().is_err() {
            problems.push(format!("the completion failed: {wc:?}"));
        }
    }
}

fn qp_type(kind: QpKind) -> u32 {
    match kind {
        QpKind::Rc => IBV_QPT_RC,
        QpKind::Uc => IBV_QPT_UC,
        QpKind::Ud => IBV_QPT_UD,
    }
}

fn state_value(name: QpStateName) -> u32 {
    match name {
        QpStateName::Reset => IBV_QPS_RESET,
        QpStateName::Init => IBV_QPS_INIT,
        QpStateName::Rtr => IBV_QPS_RTR,
        QpStateName::Rts => IBV_QPS_RTS,
    }
}

// ------------------------------------------------------------------ more of verbs.h

/// `enum ibv_create_cq_wc_flags` bits of the extended-CQ cases.
const IBV_WC_EX_WITH_BYTE_LEN: u64 = 1 << 0;
const IBV_WC_EX_WITH_QP_NUM: u64 = 1 << 2;
const IBV_WC_EX_WITH_COMPLETION_TIMESTAMP: u64 = 1 << 7;
/// `IBV_QPS_ERR`.
const IBV_QPS_ERR: u32 = 6;
/// `enum ibv_wc_opcode`: `IBV_WC_SEND`, `IBV_WC_RECV`.
const IBV_WC_SEND: u32 = 0;
const IBV_WC_RECV: u32 = 128;
/// `ENOENT`: an empty extended poll.
const ENOENT: c_int = 2;

/// The `cq_context` of the CQs with a channel (never dereferenced).
const CQ_TAG: usize = 0x7a6;
/// The bytes a SEND carries in the completion cases.
const MSG: u32 = 64;
/// The bytes a receive of the completion cases has room for.
const SLOT: u32 = 256;
/// A page.
const PAGE: usize = 4096;

// SAFETY: raw pointers, integers, a struct of integers and a struct with a raw pointer.
unsafe impl Zeroable for ibv_qp_init_attr_ex {}
// SAFETY: integers, raw pointers and a struct of integers.
unsafe impl Zeroable for ibv_device_attr_ex {}
// SAFETY: a union of raw pointers and an int, and an integer.
unsafe impl Zeroable for ibv_async_event {}

/// The `verbs_context` an extended context sits in (`verbs_get_ctx` of `verbs.h`: the
/// extended ops are placed before the `ibv_context` the application holds).
fn verbs_ctx(dev: &Device) -> *mut verbs_context {
    // SAFETY: the drop-in's contexts are extended (`abi_compat` = UINTPTR_MAX): the
    // `ibv_context` is the `context` field of a `verbs_context`, as `verbs_get_ctx` assumes.
    unsafe {
        dev.ctx
            .cast::<u8>()
            .sub(std::mem::offset_of!(verbs_context, context))
            .cast::<verbs_context>()
    }
}

/// `fcntl(fd, F_SETFL, flags | O_NONBLOCK)`.
fn set_nonblocking(fd: c_int) -> Result<(), String> {
    // SAFETY: F_GETFL / F_SETFL on an fd this process holds open.
    let ok = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
    };
    if ok {
        Ok(())
    } else {
        Err(format!("setup: fcntl(O_NONBLOCK) on fd {fd}"))
    }
}

/// Whether `fd` polls readable within `timeout` (`poll(2)`).
fn fd_readable(fd: c_int, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    for _ in 0..10_000 {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `p` is one valid pollfd.
        let rc = unsafe { libc::poll(&mut p, 1, left.as_millis() as c_int) };
        if rc > 0 {
            return p.revents & libc::POLLIN != 0;
        }
        if rc < 0 && errno() == libc::EINTR {
            continue;
        }
        if rc < 0 || Instant::now() >= deadline {
            return false;
        }
    }
    false
}

// ------------------------------------------------------------------ CQs and completions

/// `ibv_poll_cq`, the `verbs.h` inline, once.
fn poll_cq(cq: *mut ibv_cq, wcs: &mut [ibv_wc]) -> c_int {
    // SAFETY: `cq` is a live CQ and its context open (the inline reads them the same way).
    let Some(poll) = (unsafe { (*(*cq).context).ops.poll_cq }) else {
        return -libc::ENOSYS;
    };
    // SAFETY: `cq` is live; `wcs` has room for `wcs.len()` completions.
    unsafe { poll(cq, wcs.len() as c_int, wcs.as_mut_ptr()) }
}

/// Polls `cq` until `n` completions arrived or [`PATIENCE`] passed (a problem then), and
/// returns them.
fn poll_n(cq: *mut ibv_cq, n: usize, what: &str, problems: &mut Vec<String>) -> Vec<ibv_wc> {
    let deadline = Instant::now() + PATIENCE;
    let mut got = Vec::new();
    let mut wcs = [ibv_wc::default(); 16];
    for _ in 0..MAX_ITERS {
        if got.len() >= n {
            break;
        }
        let want = (n - got.len()).min(wcs.len());
        let rc = poll_cq(cq, &mut wcs[..want]);
        if rc < 0 {
            problems.push(format!("{what}: ibv_poll_cq returned {rc}"));
            break;
        }
        if rc > 0 {
            got.extend_from_slice(&wcs[..rc as usize]);
        } else if Instant::now() > deadline {
            problems.push(format!(
                "{what}: {} of {n} completions within {PATIENCE:?}",
                got.len()
            ));
            break;
        } else {
            std::thread::yield_now();
        }
    }
    got
}

/// Records a problem if a completion arrives on `cq` within [`QUIET`].
fn expect_no_completion(cq: *mut ibv_cq, what: &str, problems: &mut Vec<String>) {
    let deadline = Instant::now() + QUIET;
    let mut wc = [ibv_wc::default(); 1];
    for _ in 0..MAX_ITERS {
        if Instant::now() >= deadline {
            break;
        }
        let rc = poll_cq(cq, &mut wc);
        if rc != 0 {
            problems.push(format!("{what}: ibv_poll_cq gave {rc}: {:?}", wc[0]));
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Checks that `wcs` are `n` successful receives of `len` bytes with wr_ids `first..`.
fn expect_receives(wcs: &[ibv_wc], first: u64, n: usize, len: u32, problems: &mut Vec<String>) {
    if wcs.len() != n {
        problems.push(format!("{} receive completions, expected {n}", wcs.len()));
    }
    for (i, wc) in wcs.iter().enumerate() {
        let raw = wc.raw();
        if raw.status != 0 || raw.opcode != IBV_WC_RECV || raw.byte_len != len {
            problems.push(format!("receive {i} is not a {len}-byte RECV: {wc:?}"));
        }
        if raw.wr_id != first + i as u64 {
            problems.push(format!(
                "receive {i} has wr_id {}, expected {} (order)",
                raw.wr_id,
                first + i as u64
            ));
        }
    }
}

/// `ibv_req_notify_cq`, the `verbs.h` inline.
fn req_notify(cq: *mut ibv_cq, solicited_only: bool) -> c_int {
    // SAFETY: `cq` is a live CQ and its context open.
    let Some(notify) = (unsafe { (*(*cq).context).ops.req_notify_cq }) else {
        return libc::ENOSYS;
    };
    // SAFETY: `cq` is live.
    unsafe { notify(cq, c_int::from(solicited_only)) }
}

/// A CQ with a channel and a `cq_context`, deferred for destruction.
fn create_cq_on(
    dev: &Device,
    cqe: c_int,
    channel: *mut ibv_comp_channel,
    scope: &mut Scope,
) -> Result<(*mut ibv_cq, usize), String> {
    // SAFETY: `dev.ctx` is the open context, `channel` NULL or live.
    let cq = unsafe { ibv_create_cq(dev.ctx, cqe, CQ_TAG as *mut c_void, channel, 0) };
    if cq.is_null() {
        return Err(format!("setup: ibv_create_cq({cqe}): errno {}", errno()));
    }
    // SAFETY: `cq` is live until this step, which runs once, after its QPs are destroyed.
    let i = scope.defer("ibv_destroy_cq", move || unsafe { ibv_destroy_cq(cq) });
    Ok((cq, i))
}

/// A non-blocking completion channel, deferred for destruction (after its CQs: made first).
fn create_channel(
    dev: &Device,
    scope: &mut Scope,
) -> Result<(*mut ibv_comp_channel, usize), String> {
    // SAFETY: `dev.ctx` is the open context.
    let channel = unsafe { ibv_create_comp_channel(dev.ctx) };
    if channel.is_null() {
        return Err(format!("setup: ibv_create_comp_channel: errno {}", errno()));
    }
    // SAFETY: `channel` is live until this step, which runs once, after its CQs are gone.
    let i = scope.defer("ibv_destroy_comp_channel", move || unsafe {
        ibv_destroy_comp_channel(channel)
    });
    // SAFETY: a live channel's fd field.
    set_nonblocking(unsafe { (*channel).fd })?;
    Ok((channel, i))
}

/// Takes the events that come on `channel` within [`QUIET`] each (at most 16), checking
/// that they name `cq` and its context, acknowledging each; how many came.
fn take_events(channel: *mut ibv_comp_channel, cq: *mut ibv_cq, problems: &mut Vec<String>) -> u32 {
    let mut n = 0;
    for _ in 0..16 {
        // SAFETY: a live channel's fd field.
        if !fd_readable(unsafe { (*channel).fd }, QUIET) {
            break;
        }
        let mut ev_cq: *mut ibv_cq = null_mut();
        let mut ev_ctx: *mut c_void = null_mut();
        // SAFETY: `channel` is live; both out-pointers are writable.
        if unsafe { ibv_get_cq_event(channel, &mut ev_cq, &mut ev_ctx) } != 0 {
            break;
        }
        if ev_cq != cq || ev_ctx as usize != CQ_TAG {
            problems.push(format!(
                "an event names CQ {ev_cq:?} (context {ev_ctx:?}), expected {cq:?} ({CQ_TAG:#x})"
            ));
        }
        // SAFETY: the event named `ev_cq`, a live CQ (its destroy waits for this ack).
        unsafe { ibv_ack_cq_events(ev_cq, 1) };
        n += 1;
    }
    n
}

// ------------------------------------------------------------------ QPs and regions

/// A page-aligned, zeroed buffer of `len` bytes that lives as long as `bufs`.
fn buffer(bufs: &mut Vec<Vec<u8>>, len: usize) -> *mut u8 {
    let mut v = vec![0u8; len + PAGE];
    let offset = v.as_ptr().align_offset(PAGE);
    // SAFETY: `offset < PAGE`, inside the allocation of `len + PAGE` bytes; the vector's
    // heap block does not move when `bufs` grows.
    let p = unsafe { v.as_mut_ptr().add(offset) };
    bufs.push(v);
    p
}

/// `ibv_reg_mr` of `len` bytes at `addr`, deferred for deregistration.
fn reg(
    pd: *mut ibv_pd,
    addr: *mut u8,
    len: usize,
    access: u32,
    scope: &mut Scope,
) -> Result<*mut ibv_mr, String> {
    // SAFETY: `pd` is live; the range stays allocated until after the scope's steps.
    let mr = unsafe { ibv_reg_mr(pd, addr.cast(), len, access as c_int) };
    if mr.is_null() {
        return Err(format!("setup: ibv_reg_mr({len}): errno {}", errno()));
    }
    // SAFETY: `mr` is live until this step, which runs once.
    scope.defer("ibv_dereg_mr", move || unsafe { ibv_dereg_mr(mr) });
    Ok(mr)
}

/// A region for the completion cases: SENDs gather from its first page, receives land in
/// its second.
fn message_region(
    pd: *mut ibv_pd,
    bufs: &mut Vec<Vec<u8>>,
    scope: &mut Scope,
) -> Result<*mut ibv_mr, String> {
    let p = buffer(bufs, 2 * PAGE);
    // SAFETY: `p` has `2 * PAGE` writable bytes.
    unsafe { std::ptr::write_bytes(p, 0x33, PAGE) };
    reg(pd, p, 2 * PAGE, IBV_ACCESS_LOCAL_WRITE, scope)
}

/// An RC QP in RESET, every send signalled, `depth` WRs each way (none if `srq`).
fn rc_qp(
    pd: *mut ibv_pd,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    depth: u32,
    scope: &mut Scope,
) -> Result<(*mut ibv_qp, usize), String> {
    let mut init = ibv_qp_init_attr {
        qp_context: null_mut(),
        send_cq,
        recv_cq,
        srq,
        cap: ibv_qp_cap {
            max_send_wr: depth,
            max_recv_wr: if srq.is_null() { depth } else { 0 },
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: IBV_QPT_RC,
        sq_sig_all: 1,
    };
    // SAFETY: `pd`, the CQs and `srq` (or NULL) are live; `init` is writable.
    let qp = unsafe { ibv_create_qp(pd, &mut init) };
    if qp.is_null() {
        return Err(format!("setup: ibv_create_qp(RC): errno {}", errno()));
    }
    // SAFETY: `qp` is live until this step, which runs once.
    let i = scope.defer("ibv_destroy_qp", move || unsafe { ibv_destroy_qp(qp) });
    Ok((qp, i))
}

/// An RC QP made by `ibv_create_qp_ex` with the extended post's SEND and RDMA WRITE.
fn rc_qp_ex(
    dev: &Device,
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    scope: &mut Scope,
) -> Result<*mut ibv_qp, String> {
    let mut attr = ibv_qp_init_attr_ex::zeroed();
    attr.send_cq = cq;
    attr.recv_cq = cq;
    attr.cap = small_caps(0);
    attr.qp_type = IBV_QPT_RC;
    attr.sq_sig_all = 1;
    attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    attr.pd = pd;
    attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
    // SAFETY: `verbs_ctx` is the live verbs context of the open context.
    let create = unsafe { (*verbs_ctx(dev)).create_qp_ex }
        .ok_or("setup: verbs_context.create_qp_ex is NULL")?;
    // SAFETY: the context is open; `attr` is readable and writable, its PD and CQ live.
    let qp = unsafe { create(dev.ctx, &mut attr) };
    if qp.is_null() {
        return Err(format!("setup: ibv_create_qp_ex(RC): errno {}", errno()));
    }
    // SAFETY: `qp` is live until this step, which runs once.
    scope.defer("ibv_destroy_qp", move || unsafe { ibv_destroy_qp(qp) });
    Ok(qp)
}

/// RESET → INIT → RTR → RTS towards the QP numbered `remote`, which may `access`.
fn connect(dev: &Device, qp: *mut ibv_qp, remote: u32, access: u32) -> Result<(), String> {
    let steps = [
        ("RESET -> INIT", init_attr(1, 0, access), INIT_MASK),
        ("INIT -> RTR", rtr_attr(dev, remote, 0, 1), RTR_MASK),
        ("RTR -> RTS", rts_attr(), RTS_MASK),
    ];
    for (what, attr, mask) in steps {
        let rc = modify(qp, attr, mask);
        if rc != 0 {
            return Err(format!("setup: {what} returned {rc}"));
        }
    }
    Ok(())
}

/// An RC QP connected to itself: its SENDs are its own receives.
fn loopback(
    dev: &Device,
    pd: *mut ibv_pd,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    depth: u32,
    scope: &mut Scope,
) -> Result<(*mut ibv_qp, usize), String> {
    let (qp, i) = rc_qp(pd, send_cq, recv_cq, null_mut(), depth, scope)?;
    connect(dev, qp, qp_num(qp), 0)?;
    Ok((qp, i))
}

/// `ibv_post_recv`, the `verbs.h` inline, of `n` receives of [`SLOT`] bytes in the
/// region's second page, wr_ids `first..`.
fn post_recvs(qp: *mut ibv_qp, mr: *mut ibv_mr, first: u64, n: u32) -> Result<(), String> {
    // SAFETY: `qp` is a live QP and its context open.
    let post = unsafe { (*(*qp).context).ops.post_recv }.ok_or("setup: ops.post_recv is NULL")?;
    for i in 0..n {
        // SAFETY: `mr` is a live region of two pages.
        let (addr, lkey) = unsafe { ((*mr).addr as u64 + PAGE as u64, (*mr).lkey) };
        let mut sge = ibv_sge {
            addr,
            length: SLOT,
            lkey,
        };
        let mut wr = ibv_recv_wr {
            wr_id: first + u64::from(i),
            next: null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = null_mut();
        // SAFETY: `qp` is live; `wr` is one request whose SGE is in a live region.
        let rc = unsafe { post(qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(format!("setup: ibv_post_recv returned {rc}"));
        }
    }
    Ok(())
}

/// A signalled SEND of `len` bytes from the region's first page (solicited if asked).
fn send(
    qp: *mut ibv_qp,
    mr: *mut ibv_mr,
    wr_id: u64,
    len: u32,
    solicited: bool,
) -> Result<(), String> {
    // SAFETY: `mr` is a live region.
    let (addr, lkey) = unsafe { ((*mr).addr as u64, (*mr).lkey) };
    let mut sge = ibv_sge {
        addr,
        length: len,
        lkey,
    };
    let mut wr = ibv_send_wr::zeroed();
    wr.wr_id = wr_id;
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED | if solicited { IBV_SEND_SOLICITED } else { 0 };
    let (rc, _) = post_send(qp, &mut wr)?;
    if rc != 0 {
        return Err(format!("setup: ibv_post_send(SEND) returned {rc}"));
    }
    Ok(())
}

/// A SEND received by the QP itself; waits for the SEND's completion on `send_cq`, which
/// exists only once the receive completed.
fn send_and_wait(
    qp: *mut ibv_qp,
    mr: *mut ibv_mr,
    send_cq: *mut ibv_cq,
    wr_id: u64,
    solicited: bool,
    problems: &mut Vec<String>,
) -> Result<(), String> {
    send(qp, mr, wr_id, MSG, solicited)?;
    if let Some(wc) = poll_n(send_cq, 1, "a SEND", problems).first() {
        if wc.result().is_err() {
            problems.push(format!("the SEND failed: {wc:?}"));
        }
    }
    Ok(())
}

/// A work completion status in the table's terms, if it names it.
fn status_of(wc: &ibv_wc) -> Outcome {
    match wc.raw().status {
        0 => Outcome::Seen(Expect::Completes(Status::Success)),
        4 => Outcome::Seen(Expect::Completes(Status::LocProtErr)),
        10 => Outcome::Seen(Expect::Completes(Status::RemAccessErr)),
        other => Outcome::Other(format!("completes with status {other}")),
    }
}

/// Whether `len` bytes at `p` are all `byte`.
fn all_bytes(p: *const u8, len: usize, byte: u8) -> bool {
    // SAFETY: the callers pass ranges of their live buffers.
    unsafe { std::slice::from_raw_parts(p, len) }
        .iter()
        .all(|b| *b == byte)
}

// ------------------------------------------------------------------ asynchronous events

/// The next asynchronous event within `timeout` (`context->async_fd` is non-blocking).
fn next_async(dev: &Device, timeout: Duration) -> Option<ibv_async_event> {
    let deadline = Instant::now() + timeout;
    for _ in 0..10_000 {
        let mut ev = ibv_async_event::zeroed();
        // SAFETY: the context is open; `ev` is writable.
        if unsafe { ibv_get_async_event(dev.ctx, &mut ev) } == 0 {
            return Some(ev);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if errno() != libc::EAGAIN || left.is_zero() {
            return None;
        }
        // SAFETY: the context's async_fd field.
        fd_readable(
            unsafe { (*dev.ctx).async_fd },
            left.min(Duration::from_millis(50)),
        );
    }
    None
}

/// `ibv_ack_async_event`.
fn ack_async(mut ev: ibv_async_event) {
    // SAFETY: `ev` came from `ibv_get_async_event` and is acknowledged once.
    unsafe { ibv_ack_async_event(&mut ev) };
}

/// Takes and acknowledges every queued event (at most 1000).
fn drain_async(dev: &Device) {
    for _ in 0..1000 {
        match next_async(dev, Duration::ZERO) {
            Some(ev) => ack_async(ev),
            None => break,
        }
    }
}

/// The event's type in the table's terms, if it names it, and the object it names (the
/// pointer; 0 for a port or the device).
fn event_parts(ev: &ibv_async_event) -> (Option<EventType>, usize) {
    // SAFETY: every member of the element union is a pointer or an int, any bit pattern
    // of which is valid to read; which one is meant depends on `event_type`.
    let (cq, qp, srq) = unsafe {
        (
            ev.element.cq as usize,
            ev.element.qp as usize,
            ev.element.srq as usize,
        )
    };
    match ev.event_type {
        IBV_EVENT_CQ_ERR => (Some(EventType::CqErr), cq),
        IBV_EVENT_QP_ACCESS_ERR => (Some(EventType::QpAccessErr), qp),
        IBV_EVENT_SRQ_LIMIT_REACHED => (Some(EventType::SrqLimitReached), srq),
        IBV_EVENT_QP_FATAL
        | IBV_EVENT_QP_REQ_ERR
        | IBV_EVENT_COMM_EST
        | IBV_EVENT_SQ_DRAINED
        | IBV_EVENT_QP_LAST_WQE_REACHED => (None, qp),
        IBV_EVENT_SRQ_ERR => (None, srq),
        _ => (None, 0),
    }
}

/// Waits up to [`PATIENCE`] for an event of `kind` naming `object`, acknowledging the others
/// it passes over (at most 64); the one found is returned unacknowledged. Events of `kind`
/// naming another object, and other events naming `object`, are problems.
fn await_async(
    dev: &Device,
    kind: EventType,
    object: usize,
    problems: &mut Vec<String>,
) -> Option<ibv_async_event> {
    let deadline = Instant::now() + PATIENCE;
    let mut passed = Vec::new();
    for _ in 0..64 {
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = next_async(dev, left)?;
        match event_parts(&ev) {
            (Some(k), o) if k == kind && o == object => return Some(ev),
            (Some(k), o) if k == kind => {
                problems.push(format!("{kind:?} names {o:#x}, not {object:#x}"))
            }
            (_, o) if o == object => passed.push(ev.event_type),
            _ => {}
        }
        ack_async(ev);
    }
    if !passed.is_empty() {
        problems.push(format!("other events named {object:#x}: types {passed:?}"));
    }
    None
}

/// What an [`AsyncSource`] made: the object its event names, the event's type, and the
/// objects a destroy of it must wait for (QPs first).
struct Raised {
    object: usize,
    kind: EventType,
    /// The object's scope step.
    step: usize,
    /// The QPs (with their scope steps), responder last.
    qps: Vec<(*mut ibv_qp, usize)>,
}

/// Raises the event of `source`.
fn raise(
    dev: &Device,
    source: AsyncSource,
    bufs: &mut Vec<Vec<u8>>,
    scope: &mut Scope,
    problems: &mut Vec<String>,
) -> Result<Raised, String> {
    let (pd, _) = alloc_pd(dev, scope)?;
    let p = buffer(bufs, 2 * PAGE);
    let mr = reg(
        pd,
        p,
        2 * PAGE,
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
        scope,
    )?;
    // SAFETY: `mr` is a live region.
    let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
    let write = |qp: *mut ibv_qp, wr_id: u64, rkey: u32| -> Result<(), String> {
        let mut sge = ibv_sge {
            addr: p as u64,
            length: 64,
            lkey,
        };
        let mut wr = ibv_send_wr::zeroed();
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.rdma = ibv_send_wr_rdma {
            remote_addr: p as u64 + PAGE as u64,
            rkey,
        };
        match post_send(qp, &mut wr)? {
            (0, _) => Ok(()),
            (rc, _) => Err(format!("setup: ibv_post_send(RDMA WRITE) returned {rc}")),
        }
    };
    match source {
        AsyncSource::BadRkeyWrite => {
            let (req_cq, _) = create_cq(dev, 16, scope)?;
            let (resp_cq, _) = create_cq(dev, 16, scope)?;
            let req = rc_qp(pd, req_cq, req_cq, null_mut(), 8, scope)?;
            let resp = rc_qp(pd, resp_cq, resp_cq, null_mut(), 8, scope)?;
            connect(dev, req.0, qp_num(resp.0), IBV_ACCESS_REMOTE_WRITE)?;
            connect(dev, resp.0, qp_num(req.0), IBV_ACCESS_REMOTE_WRITE)?;
            write(req.0, 1, rkey ^ 0x5a_5a00)?;
            if let Some(wc) = poll_n(req_cq, 1, "the bad-rkey write", problems).first() {
                if wc.raw().status != 10 {
                    problems.push(format!("the bad-rkey write completed with {wc:?}"));
                }
            }
            Ok(Raised {
                object: resp.0 as usize,
                kind: EventType::QpAccessErr,
                step: resp.1,
                qps: vec![req, resp],
            })
        }
        AsyncSource::SrqLimit => {
            let (srq, srq_step) = create_srq(pd, 8, scope)
                .map_err(|e| format!("setup: ibv_create_srq: errno {e}"))?;
            // SAFETY: `srq` is a live SRQ and its context open.
            let post = unsafe { (*(*srq).context).ops.post_srq_recv }
                .ok_or("setup: ops.post_srq_recv is NULL")?;
            for i in 0..4 {
                let mut sge = ibv_sge {
                    addr: p as u64 + PAGE as u64,
                    length: 64,
                    lkey,
                };
                let mut wr = ibv_recv_wr {
                    wr_id: 100 + i,
                    next: null_mut(),
                    sg_list: &mut sge,
                    num_sge: 1,
                };
                let mut bad = null_mut();
                // SAFETY: `srq` is live; `wr` is one request whose SGE is in a live region.
                if unsafe { post(srq, &mut wr, &mut bad) } != 0 {
                    return Err("setup: ibv_post_srq_recv failed".into());
                }
            }
            let mut attr = ibv_srq_attr {
                max_wr: 0,
                max_sge: 0,
                srq_limit: 3,
            };
            // SAFETY: `srq` is live; `attr` is readable.
            if unsafe { ibv_modify_srq(srq, &mut attr, IBV_SRQ_LIMIT) } != 0 {
                return Err("setup: ibv_modify_srq(IBV_SRQ_LIMIT) failed".into());
            }
            let (req_cq, _) = create_cq(dev, 16, scope)?;
            let (resp_cq, _) = create_cq(dev, 16, scope)?;
            let req = rc_qp(pd, req_cq, req_cq, null_mut(), 8, scope)?;
            let resp = rc_qp(pd, resp_cq, resp_cq, srq, 8, scope)?;
            connect(dev, req.0, qp_num(resp.0), IBV_ACCESS_REMOTE_WRITE)?;
            connect(dev, resp.0, qp_num(req.0), IBV_ACCESS_REMOTE_WRITE)?;
            for wr_id in [2, 3] {
                send(req.0, mr, wr_id, 64, false)?;
            }
            poll_n(req_cq, 2, "the SENDs", problems);
            poll_n(resp_cq, 2, "the receives", problems);
            Ok(Raised {
                object: srq as usize,
                kind: EventType::SrqLimitReached,
                step: srq_step,
                qps: vec![req, resp],
            })
        }
        AsyncSource::CqOverrun => {
            let (small, small_step) = create_cq(dev, 1, scope)?;
            // SAFETY: a live CQ's `cqe`.
            let room = unsafe { (*small).cqe };
            if room >= 8 {
                problems.push(format!("a CQ of 1 got {room} entries"));
            }
            let (resp_cq, _) = create_cq(dev, 16, scope)?;
            let req = rc_qp(pd, small, small, null_mut(), 32, scope)?;
            let resp = rc_qp(pd, resp_cq, resp_cq, null_mut(), 32, scope)?;
            connect(dev, req.0, qp_num(resp.0), IBV_ACCESS_REMOTE_WRITE)?;
            connect(dev, resp.0, qp_num(req.0), IBV_ACCESS_REMOTE_WRITE)?;
            for i in 0..room.max(0) as u64 + 17 {
                write(req.0, 10 + i, rkey)?;
            }
            Ok(Raised {
                object: small as usize,
                kind: EventType::CqErr,
                step: small_step,
                qps: vec![req, resp],
            })
        }
    }
}

/// Runs `destroy` on another thread. With a `release` (an acknowledgement), gives it
/// [`QUIET`] to return on its own, then runs `release` and gives it [`WAIT`] more; without,
/// gives it [`WAIT`]. The outcome: the destroy's result if it returned without a release,
/// [`Expect::WaitsForAck`] if it returned 0 once released; whether `release` ran; whether
/// the object is gone (or, stuck, must not be touched again).
fn destroy_waiting(
    destroy: impl FnOnce() -> c_int + Send + 'static,
    release: Option<&mut dyn FnMut()>,
) -> (Outcome, bool, bool) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(destroy());
    });
    let first = if release.is_some() { QUIET } else { WAIT };
    match rx.recv_timeout(first) {
        Ok(rc) => return (Outcome::of_rc(rc), false, rc == 0),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            return (
                Outcome::Other("the destroy thread died".into()),
                false,
                false,
            )
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
    }
    let Some(release) = release else {
        // Still blocked: the thread is left behind, the object leaked.
        return (
            Outcome::Other(format!("the destroy still waits after {WAIT:?}")),
            false,
            true,
        );
    };
    release();
    match rx.recv_timeout(WAIT) {
        Ok(0) => (Outcome::Seen(Expect::WaitsForAck), true, true),
        Ok(rc) => (Outcome::failed(rc), true, false),
        // Still blocked: the thread is left behind, the object leaked.
        Err(_) => (
            Outcome::Other(format!(
                "the destroy still waits {WAIT:?} after the acknowledgement"
            )),
            true,
            true,
        ),
    }
}

// ------------------------------------------------------------------ memory

/// Fresh pages at an address of their own, far below the usual mmap area (a distinct
/// 16 MiB slot per call), so that once a case unmaps them nothing else lands there (as
/// `registration.c` places them).
fn map_pages(pages: usize, prot: c_int) -> Result<*mut u8, String> {
    static NEXT: std::sync::atomic::AtomicUsize =
        std::sync::atomic::AtomicUsize::new(0x5200_0000_0000);
    for _ in 0..64 {
        let at = NEXT.fetch_add(0x100_0000, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: a new private anonymous mapping at a free address (MAP_FIXED_NOREPLACE
        // never replaces one).
        let p = unsafe {
            libc::mmap(
                at as *mut c_void,
                pages * PAGE,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p as usize == at {
            return Ok(p.cast());
        }
        if p != libc::MAP_FAILED {
            // SAFETY: the mapping just made, elsewhere than asked.
            unsafe { libc::munmap(p, pages * PAGE) };
        }
    }
    Err(format!("setup: no free address for {pages} pages"))
}

/// `via` of `len` bytes at `addr` with `access`: the region (deferred for
/// deregistration) or the errno.
fn reg_via(
    pd: *mut ibv_pd,
    via: RegCall,
    addr: *mut c_void,
    len: usize,
    access: u32,
    scope: &mut Scope,
) -> Result<*mut ibv_mr, i32> {
    set_errno(0);
    // SAFETY: `pd` is live; the drop-in checks the range is mapped before it keeps it, and
    // a region it keeps is deregistered by the scope before the range goes.
    let mr = unsafe {
        match via {
            RegCall::RegMr => ibv_reg_mr(pd, addr, len, access as c_int),
            RegCall::RegMrIova => ibv_reg_mr_iova(pd, addr, len, 0x1000, access as c_int),
            RegCall::RegMrIova2 => ibv_reg_mr_iova2(pd, addr, len, 0, access),
        }
    };
    if mr.is_null() {
        return Err(errno());
    }
    // SAFETY: `mr` is live until this step, which runs once.
    scope.defer("ibv_dereg_mr", move || unsafe { ibv_dereg_mr(mr) });
    Ok(mr)
}

/// A case's outcome and whatever else went wrong in it.
struct Run {
    outcome: Outcome,
    problems: Vec<String>,
}

/// Runs `case`; `Err` if a valid setup step failed. Everything made is destroyed before it
/// returns.
fn run(dev: &Device, case: &Case) -> Result<Run, String> {
    // Declared before the scope, so it is freed after the scope deregistered its regions.
    let mut buf = vec![0u8; 8192];
    let mut bufs: Vec<Vec<u8>> = Vec::new();
    let mut scope = Scope::default();
    let mut problems = Vec::new();
    let outcome = match *case {
        Case::CreateAh { sgid_index, port } => {
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            match create_ah(dev, pd, sgid_index, port, &mut scope) {
                Ok(_) => Outcome::OK,
                Err(e) => Outcome::failed(e),
            }
        }
        Case::ModifyQpToInit { port, pkey_index } => {
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            let (cq, _) = create_cq(dev, 16, &mut scope)?;
            let qp = create_qp(pd, cq, null_mut(), IBV_QPT_RC, small_caps(0), &mut scope)?;
            let outcome = Outcome::of_rc(modify(qp, init_attr(port, pkey_index, 0), INIT_MASK));
            let want = if outcome.is_ok() {
                IBV_QPS_INIT
            } else {
                IBV_QPS_RESET
            };
            expect_state(qp, want, &mut problems);
            outcome
        }
        Case::ModifyQpToRtr {
            sgid_index,
            max_dest_rd_atomic,
            path_mtu,
        } => {
            let max = dev.limit(dev.attr.max_qp_rd_atom, "max_qp_rd_atom")?;
            let Ok(n) = u8::try_from(max_dest_rd_atomic.resolve(max)) else {
                return Err(format!(
                    "setup: max_dest_rd_atomic {max_dest_rd_atomic:?} does not fit the u8 of \
                     ibv_qp_attr on a device whose max_qp_rd_atom is {max}"
                ));
            };
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            let (cq, _) = create_cq(dev, 16, &mut scope)?;
            let qp = create_qp(pd, cq, null_mut(), IBV_QPT_RC, small_caps(0), &mut scope)?;
            let peer = create_qp(pd, cq, null_mut(), IBV_QPT_RC, small_caps(0), &mut scope)?;
            let rc = modify(qp, init_attr(1, 0, 0), INIT_MASK);
            if rc != 0 {
                return Err(format!("setup: RESET -> INIT returned {rc}"));
            }
            let mut attr = rtr_attr(dev, qp_num(peer), sgid_index, n);
            attr.path_mtu = path_mtu;
            let outcome = Outcome::of_rc(modify(qp, attr, RTR_MASK));
            let want = if outcome.is_ok() {
                IBV_QPS_RTR
            } else {
                IBV_QPS_INIT
            };
            expect_state(qp, want, &mut problems);
            outcome
        }
        Case::ModifyQpBadTransition { from, to } => {
            if from != QpStateName::Reset || to != QpStateName::Rts {
                return Err(format!(
                    "setup: this runner writes RESET -> RTS only, not {from:?} -> {to:?}"
                ));
            }
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            let (cq, _) = create_cq(dev, 16, &mut scope)?;
            let qp = create_qp(pd, cq, null_mut(), IBV_QPT_RC, small_caps(0), &mut scope)?;
            let outcome = Outcome::of_rc(modify(qp, rts_attr(), RTS_MASK));
            let want = if outcome.is_ok() {
                state_value(to)
            } else {
                state_value(from)
            };
            expect_state(qp, want, &mut problems);
            outcome
        }
        Case::RegMr { len, access } => {
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            match reg_mr(pd, &mut buf, len, access.0, &mut scope) {
                Ok(mr) => {
                    // SAFETY: `mr` is a live region.
                    let length = unsafe { (*mr).length };
                    if length != len {
                        problems.push(format!("mr->length is {length}, not {len}"));
                    }
                    Outcome::OK
                }
                Err(e) => Outcome::failed(e),
            }
        }
        Case::CreateQp {
            qp_type: kind,
            with_srq,
            max_send_wr,
        } => {
            let max = dev.limit(dev.attr.max_qp_wr, "max_qp_wr")?;
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            let (cq, _) = create_cq(dev, 16, &mut scope)?;
            let srq = if with_srq {
                create_srq(pd, 4, &mut scope)
                    .map_err(|e| format!("setup: ibv_create_srq: errno {e}"))?
                    .0
            } else {
                null_mut()
            };
            let cap = ibv_qp_cap {
                max_send_wr: max_send_wr.resolve(max),
                ..small_caps(0)
            };
            match try_create_qp(pd, cq, srq, qp_type(kind), cap, &mut scope) {
                Ok(_) => Outcome::OK,
                Err(e) => Outcome::failed(e),
            }
        }
        Case::CreateCq { cqe } => {
            let max = dev.limit(dev.attr.max_cqe, "max_cqe")?;
            let Ok(n) = c_int::try_from(cqe.resolve(max)) else {
                return Err(format!(
                    "setup: cqe {cqe:?} does not fit an int (max_cqe {max})"
                ));
            };
            set_errno(0);
            // SAFETY: `dev.ctx` is the open context; no channel.
            let cq = unsafe { ibv_create_cq(dev.ctx, n, null_mut(), null_mut(), 0) };
            if cq.is_null() {
                Outcome::failed(errno())
            } else {
                // SAFETY: `cq` is live until this step, which runs once.
                scope.defer("ibv_destroy_cq", move || unsafe { ibv_destroy_cq(cq) });
                Outcome::OK
            }
        }
        Case::AllocMw { mw_type } => {
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            match alloc_mw(pd, mw_type, &mut scope)? {
                Ok(mw) => {
                    // SAFETY: `mw` is a live window.
                    let (ty, mw_pd) = unsafe { ((*mw).type_, (*mw).pd) };
                    if ty != mw_type || mw_pd != pd {
                        problems.push(format!("mw->type {ty}, mw->pd {mw_pd:?}: not the call's"));
                    }
                    Outcome::OK
                }
                Err(e) => Outcome::failed(e),
            }
        }
        Case::CreateSrq { max_wr } => {
            let max = dev.limit(dev.attr.max_srq_wr, "max_srq_wr")?;
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            match create_srq(pd, max_wr.resolve(max), &mut scope) {
                Ok(_) => Outcome::OK,
                Err(e) => Outcome::failed(e),
            }
        }
        Case::PostSend { opcode, inline } => {
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            let (cq, _) = create_cq(dev, 16, &mut scope)?;
            let qp = create_qp(pd, cq, null_mut(), IBV_QPT_RC, small_caps(64), &mut scope)?;
            let all = IBV_ACCESS_LOCAL_WRITE
                | IBV_ACCESS_REMOTE_WRITE
                | IBV_ACCESS_REMOTE_READ
                | IBV_ACCESS_REMOTE_ATOMIC;
            let base = buf.as_ptr() as u64;
            let mr = reg_mr(pd, &mut buf, 4096, all, &mut scope)
                .map_err(|e| format!("setup: ibv_reg_mr: errno {e}"))?;
            // Connected to itself: only the request can be wrong.
            let steps = [
                (
                    "RESET -> INIT",
                    init_attr(1, 0, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ),
                    INIT_MASK,
                ),
                ("INIT -> RTR", rtr_attr(dev, qp_num(qp), 0, 1), RTR_MASK),
                ("RTR -> RTS", rts_attr(), RTS_MASK),
            ];
            for (what, attr, mask) in steps {
                let rc = modify(qp, attr, mask);
                if rc != 0 {
                    return Err(format!("setup: {what} returned {rc}"));
                }
            }
            // SAFETY: `mr` is a live region.
            let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
            let mut sge = ibv_sge {
                addr: base,
                length: 16,
                lkey,
            };
            let mut wr = ibv_send_wr::zeroed();
            wr.wr_id = 1;
            wr.sg_list = &mut sge;
            wr.num_sge = 1;
            wr.opcode = match opcode {
                Opcode::Send => IBV_WR_SEND,
                Opcode::RdmaWrite => IBV_WR_RDMA_WRITE,
                Opcode::RdmaRead => IBV_WR_RDMA_READ,
            };
            wr.send_flags = IBV_SEND_SIGNALED | if inline { IBV_SEND_INLINE } else { 0 };
            wr.wr.rdma = ibv_send_wr_rdma {
                remote_addr: base + 2048,
                rkey,
            };
            let (rc, bad_wr_named) = post_send(qp, &mut wr)?;
            if !bad_wr_named {
                problems.push("on failure *bad_wr does not name the request".into());
            }
            let outcome = Outcome::of_rc(rc);
            if outcome.is_ok() {
                await_completion(cq, &mut problems);
            }
            outcome
        }
        Case::UdSend { ah_of_another_pd } => {
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            let (other, _) = alloc_pd(dev, &mut scope)?;
            let (cq, _) = create_cq(dev, 16, &mut scope)?;
            let qp = create_qp(pd, cq, null_mut(), IBV_QPT_UD, small_caps(0), &mut scope)?;
            let mut init = init_attr(1, 0, 0);
            init.qkey = QKEY;
            let mut rtr = ibv_qp_attr::zeroed();
            rtr.qp_state = IBV_QPS_RTR;
            let mut rts = ibv_qp_attr::zeroed();
            rts.qp_state = IBV_QPS_RTS;
            let steps = [
                (
                    "RESET -> INIT",
                    init,
                    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY,
                ),
                ("INIT -> RTR", rtr, IBV_QP_STATE),
                ("RTR -> RTS", rts, IBV_QP_STATE | IBV_QP_SQ_PSN),
            ];
            for (what, attr, mask) in steps {
                let rc = modify(qp, attr, mask);
                if rc != 0 {
                    return Err(format!("setup: UD {what} returned {rc}"));
                }
            }
            let ah_pd = if ah_of_another_pd { other } else { pd };
            let ah = create_ah(dev, ah_pd, 0, 1, &mut scope)
                .map_err(|e| format!("setup: ibv_create_ah: errno {e}"))?;
            let base = buf.as_ptr() as u64;
            let mr = reg_mr(pd, &mut buf, 4096, IBV_ACCESS_LOCAL_WRITE, &mut scope)
                .map_err(|e| format!("setup: ibv_reg_mr: errno {e}"))?;
            let mut sge = ibv_sge {
                addr: base,
                length: 16,
                // SAFETY: `mr` is a live region.
                lkey: unsafe { (*mr).lkey },
            };
            let mut wr = ibv_send_wr::zeroed();
            wr.wr_id = 1;
            wr.sg_list = &mut sge;
            wr.num_sge = 1;
            wr.opcode = IBV_WR_SEND;
            wr.send_flags = IBV_SEND_SIGNALED;
            // To itself, with no receive posted: the datagram is dropped, the send completes.
            wr.wr.ud = ibv_send_wr_ud {
                ah,
                remote_qpn: qp_num(qp),
                remote_qkey: QKEY,
            };
            let (rc, bad_wr_named) = post_send(qp, &mut wr)?;
            if !bad_wr_named {
                problems.push("on failure *bad_wr does not name the request".into());
            }
            let outcome = Outcome::of_rc(rc);
            if outcome.is_ok() {
                await_completion(cq, &mut problems);
            }
            outcome
        }
        Case::DeallocPdInUse { by } => {
            let (pd, pd_step) = alloc_pd(dev, &mut scope)?;
            match by {
                PdUser::Mr => {
                    reg_mr(pd, &mut buf, 4096, IBV_ACCESS_LOCAL_WRITE, &mut scope)
                        .map_err(|e| format!("setup: ibv_reg_mr: errno {e}"))?;
                }
                PdUser::Qp => {
                    let (cq, _) = create_cq(dev, 16, &mut scope)?;
                    create_qp(pd, cq, null_mut(), IBV_QPT_RC, small_caps(0), &mut scope)?;
                }
                PdUser::Srq => {
                    create_srq(pd, 4, &mut scope)
                        .map_err(|e| format!("setup: ibv_create_srq: errno {e}"))?;
                }
                PdUser::Ah => {
                    create_ah(dev, pd, 0, 1, &mut scope)
                        .map_err(|e| format!("setup: ibv_create_ah: errno {e}"))?;
                }
                PdUser::Mw => {
                    alloc_mw(pd, IBV_MW_TYPE_1, &mut scope)?
                        .map_err(|e| format!("setup: ibv_alloc_mw: errno {e}"))?;
                }
            }
            // SAFETY: `pd` is live (an object is in it; the call must refuse).
            let outcome = Outcome::of_rc(unsafe { ibv_dealloc_pd(pd) });
            if outcome.is_ok() {
                // Gone despite the object in it: not deallocated twice.
                scope.cancel(pd_step);
            }
            outcome
        }
        Case::DestroyCqInUse { role, qps } => {
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            let (other, _) = create_cq(dev, 16, &mut scope)?;
            let (cq, cq_step) = create_cq(dev, 16, &mut scope)?;
            let (send_cq, recv_cq) = match role {
                CqRole::Send => (cq, other),
                CqRole::Recv => (other, cq),
                CqRole::Both => (cq, cq),
            };
            let mut users = Vec::new();
            for _ in 0..qps.max(1) {
                users.push(rc_qp(pd, send_cq, recv_cq, null_mut(), 4, &mut scope)?);
            }
            // All but the last are gone before the call.
            for &(qp, step) in &users[..users.len() - 1] {
                // SAFETY: `qp` is live; its scope step is cancelled.
                let rc = unsafe { ibv_destroy_qp(qp) };
                if rc != 0 {
                    return Err(format!("setup: ibv_destroy_qp returned {rc}"));
                }
                scope.cancel(step);
            }
            // SAFETY: `cq` is live (a QP uses it; the call must refuse).
            let outcome = Outcome::of_rc(unsafe { ibv_destroy_cq(cq) });
            if outcome.is_ok() {
                scope.cancel(cq_step);
            } else {
                // Refused, not half-destroyed: the CQ still works.
                let mut wc = [ibv_wc::default(); 1];
                let n = poll_cq(cq, &mut wc);
                if n != 0 {
                    problems.push(format!("polling the refused CQ gave {n}"));
                }
                let rc = req_notify(cq, false);
                if rc != 0 {
                    problems.push(format!("arming the refused CQ gave {rc}"));
                }
            }
            outcome
        }
        Case::DestroySrqInUse => {
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            let (cq, _) = create_cq(dev, 16, &mut scope)?;
            let (srq, srq_step) = create_srq(pd, 4, &mut scope)
                .map_err(|e| format!("setup: ibv_create_srq: errno {e}"))?;
            create_qp(pd, cq, srq, IBV_QPT_RC, small_caps(0), &mut scope)?;
            // SAFETY: `srq` is live (a QP uses it; the call must refuse).
            let outcome = Outcome::of_rc(unsafe { ibv_destroy_srq(srq) });
            if outcome.is_ok() {
                scope.cancel(srq_step);
            }
            outcome
        }
        Case::CqOverrun { ignore_overrun } => {
            // Events of earlier cases' objects are taken first, while no CQ of this case can
            // have a destroyed one's address (cq_err_of_a_destroyed_cq_is_not_delivered).
            drain_async(dev);
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            let mr = message_region(pd, &mut bufs, &mut scope)?;
            let cq = if ignore_overrun {
                let mut attr = ibv_cq_init_attr_ex {
                    cqe: 2,
                    cq_context: null_mut(),
                    channel: null_mut(),
                    comp_vector: 0,
                    wc_flags: IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM,
                    comp_mask: IBV_CQ_INIT_ATTR_MASK_FLAGS,
                    flags: IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN,
                    parent_domain: null_mut(),
                };
                // SAFETY: `verbs_ctx` is the live verbs context of the open context.
                let create = unsafe { (*verbs_ctx(dev)).create_cq_ex }
                    .ok_or("setup: verbs_context.create_cq_ex is NULL")?;
                // SAFETY: the context is open; `attr` is readable.
                let cq = unsafe { create(dev.ctx, &mut attr) }.cast::<ibv_cq>();
                if cq.is_null() {
                    return Err(format!(
                        "setup: ibv_create_cq_ex(IGNORE_OVERRUN): errno {}",
                        errno()
                    ));
                }
                // SAFETY: `cq` is live until this step, which runs once, after its QP.
                scope.defer("ibv_destroy_cq", move || unsafe { ibv_destroy_cq(cq) });
                cq
            } else {
                create_cq(dev, 2, &mut scope)?.0
            };
            // SAFETY: a live CQ's `cqe`.
            let c = unsafe { (*cq).cqe } as u32;
            let n = c + 2;
            let (aux, _) = create_cq(dev, (n + 8) as c_int, &mut scope)?;
            let (qp, _) = loopback(dev, pd, aux, cq, n + 2, &mut scope)?;
            post_recvs(qp, mr, 2000, n + 1)?;
            for i in 0..n {
                send(qp, mr, u64::from(i), MSG, false)?;
            }
            // Every SEND completed: every receive went into the CQ, none polled.
            poll_n(aux, n as usize, "the SENDs", &mut problems);
            let mut wcs = [ibv_wc::default(); 64];
            let got = poll_cq(cq, &mut wcs);
            if got < 0 {
                let again = poll_cq(cq, &mut wcs[..1]);
                if again >= 0 {
                    problems.push(format!("a second poll of the overrun CQ gave {again}"));
                }
                Outcome::failed(-got)
            } else {
                let got = got as usize;
                if got == 0 || got > c as usize {
                    problems.push(format!("polled {got} completions from a CQ of {c}"));
                }
                for (i, wc) in wcs[..got].iter().enumerate() {
                    let id = wc.raw().wr_id;
                    if !(2000..2000 + u64::from(n)).contains(&id) || wc.result().is_err() {
                        problems.push(format!("completion {i} is none of the receives: {wc:?}"));
                    }
                    if wcs[..i].iter().any(|w| w.raw().wr_id == id) {
                        problems.push(format!("wr_id {id} polled twice"));
                    }
                }
                let rest = poll_cq(cq, &mut wcs[..1]);
                if rest != 0 {
                    problems.push(format!("the CQ polled dry then gave {rest}"));
                }
                // Polling keeps working.
                send_and_wait(qp, mr, aux, 100, false, &mut problems)?;
                let more = poll_n(cq, 1, "the receive after the overrun", &mut problems);
                expect_receives(&more, 2000 + u64::from(n), 1, MSG, &mut problems);
                let deadline = Instant::now() + QUIET;
                for _ in 0..64 {
                    let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                        break;
                    };
                    let Some(ev) = next_async(dev, left) else {
                        break;
                    };
                    if event_parts(&ev) == (Some(EventType::CqErr), cq as usize) {
                        problems.push("IBV_EVENT_CQ_ERR for an IGNORE_OVERRUN CQ".into());
                    }
                    ack_async(ev);
                }
                Outcome::OK
            }
        }
        Case::CompletionEvents { steps } => {
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            let mr = message_region(pd, &mut bufs, &mut scope)?;
            let (channel, _) = create_channel(dev, &mut scope)?;
            let (cq, _) = create_cq_on(dev, 16, channel, &mut scope)?;
            let (aux, _) = create_cq(dev, 16, &mut scope)?;
            let (qp, _) = loopback(dev, pd, aux, cq, 8, &mut scope)?;
            let received = steps
                .iter()
                .filter(|s| matches!(s, CqStep::Receive { .. }))
                .count();
            let flushed = steps
                .iter()
                .filter(|s| matches!(s, CqStep::FlushedReceive))
                .count();
            post_recvs(qp, mr, 3000, (received + flushed) as u32)?;
            let mut events = 0;
            let mut sent = 0;
            for step in steps {
                match *step {
                    CqStep::Arm { solicited_only } => {
                        let rc = req_notify(cq, solicited_only);
                        if rc != 0 {
                            problems.push(format!("ibv_req_notify_cq returned {rc}"));
                        }
                    }
                    CqStep::Receive { solicited } => {
                        send_and_wait(qp, mr, aux, sent, solicited, &mut problems)?;
                        sent += 1;
                        events += take_events(channel, cq, &mut problems);
                    }
                    CqStep::FlushedReceive => {
                        let mut attr = ibv_qp_attr::zeroed();
                        attr.qp_state = IBV_QPS_ERR;
                        let rc = modify(qp, attr, IBV_QP_STATE);
                        if rc != 0 {
                            return Err(format!("setup: moving the QP to ERR returned {rc}"));
                        }
                        events += take_events(channel, cq, &mut problems);
                    }
                }
            }
            let wcs = poll_n(cq, received + flushed, "the receives", &mut problems);
            let (done, rest) = wcs.split_at(received.min(wcs.len()));
            expect_receives(done, 3000, received, MSG, &mut problems);
            for wc in rest {
                if wc.raw().status != 5 {
                    problems.push(format!("expected a flushed receive: {wc:?}"));
                }
            }
            Outcome::Seen(Expect::CompletionEvents(events))
        }
        Case::NonBlockingGetCqEvent { after_event } => {
            let (channel, _) = create_channel(dev, &mut scope)?;
            // SAFETY: a live channel's fd field.
            let fd = unsafe { (*channel).fd };
            if after_event {
                let (pd, _) = alloc_pd(dev, &mut scope)?;
                let mr = message_region(pd, &mut bufs, &mut scope)?;
                let (cq, _) = create_cq_on(dev, 16, channel, &mut scope)?;
                let (aux, _) = create_cq(dev, 16, &mut scope)?;
                let (qp, _) = loopback(dev, pd, aux, cq, 4, &mut scope)?;
                post_recvs(qp, mr, 5000, 1)?;
                let rc = req_notify(cq, false);
                if rc != 0 {
                    problems.push(format!("ibv_req_notify_cq returned {rc}"));
                }
                send_and_wait(qp, mr, aux, 0, false, &mut problems)?;
                if !fd_readable(fd, PATIENCE) {
                    problems.push("the channel fd never polled readable".into());
                }
                let mut ev_cq: *mut ibv_cq = null_mut();
                let mut ev_ctx: *mut c_void = null_mut();
                // SAFETY: `channel` is live; both out-pointers are writable.
                if unsafe { ibv_get_cq_event(channel, &mut ev_cq, &mut ev_ctx) } == 0 {
                    if ev_cq != cq || ev_ctx as usize != CQ_TAG {
                        problems.push(format!("the event names {ev_cq:?} / {ev_ctx:?}"));
                    }
                    // SAFETY: the event named `ev_cq`, a live CQ.
                    unsafe { ibv_ack_cq_events(ev_cq, 1) };
                } else {
                    problems.push(format!("ibv_get_cq_event: errno {}", errno()));
                }
                if fd_readable(fd, Duration::ZERO) {
                    problems.push("the channel fd still polls readable".into());
                }
                let wcs = poll_n(cq, 1, "the receive", &mut problems);
                expect_receives(&wcs, 5000, 1, MSG, &mut problems);
            }
            let mut ev_cq: *mut ibv_cq = null_mut();
            let mut ev_ctx: *mut c_void = null_mut();
            set_errno(0);
            // SAFETY: `channel` is live; both out-pointers are writable.
            match unsafe { ibv_get_cq_event(channel, &mut ev_cq, &mut ev_ctx) } {
                -1 => Outcome::failed(errno()),
                rc => Outcome::Other(format!("ibv_get_cq_event returned {rc}")),
            }
        }
        Case::NonBlockingGetAsyncEvent => {
            drain_async(dev);
            // SAFETY: the context's async_fd field.
            if fd_readable(unsafe { (*dev.ctx).async_fd }, Duration::ZERO) {
                problems.push("async_fd polls readable with no event queued".into());
            }
            let mut ev = ibv_async_event::zeroed();
            set_errno(0);
            // SAFETY: the context is open; `ev` is writable.
            match unsafe { ibv_get_async_event(dev.ctx, &mut ev) } {
                -1 => Outcome::failed(errno()),
                rc => {
                    ack_async(ev);
                    Outcome::Other(format!("ibv_get_async_event returned {rc}"))
                }
            }
        }
        Case::DestroyChannelInUse => {
            let (channel, channel_step) = create_channel(dev, &mut scope)?;
            create_cq_on(dev, 16, channel, &mut scope)?;
            // SAFETY: `channel` is live (a CQ uses it; the call must refuse).
            let outcome = Outcome::of_rc(unsafe { ibv_destroy_comp_channel(channel) });
            if outcome.is_ok() {
                scope.cancel(channel_step);
            }
            outcome
        }
        Case::ResizeCq {
            cqe,
            outstanding,
            to,
        } => {
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            let mr = message_region(pd, &mut bufs, &mut scope)?;
            let (cq, _) = create_cq(dev, cqe as c_int, &mut scope)?;
            // SAFETY: a live CQ's `cqe`.
            let before = unsafe { (*cq).cqe };
            let total = outstanding.max(to);
            let (aux, _) = create_cq(dev, (total + 8) as c_int, &mut scope)?;
            let (qp, _) = loopback(dev, pd, aux, cq, total + 2, &mut scope)?;
            post_recvs(qp, mr, 7000, total)?;
            for i in 0..outstanding {
                send_and_wait(qp, mr, aux, u64::from(i), false, &mut problems)?;
            }
            // SAFETY: `cq` is live.
            let rc = unsafe { ibv_resize_cq(cq, to as c_int) };
            // SAFETY: a live CQ's `cqe`.
            let now = unsafe { (*cq).cqe };
            let polled = if rc != 0 {
                if now != before {
                    problems.push(format!(
                        "a refused resize changed cq->cqe from {before} to {now}"
                    ));
                }
                outstanding
            } else {
                if now < to as c_int {
                    problems.push(format!("resized to {to}: cq->cqe is {now}"));
                }
                for i in outstanding..to {
                    send_and_wait(qp, mr, aux, u64::from(i), false, &mut problems)?;
                }
                total
            };
            let wcs = poll_n(cq, polled as usize, "the receives", &mut problems);
            expect_receives(&wcs, 7000, polled as usize, MSG, &mut problems);
            let mut extra = [ibv_wc::default(); 1];
            let rest = poll_cq(cq, &mut extra);
            if rest != 0 {
                problems.push(format!("a completion beyond those made: {rest}"));
            }
            Outcome::of_rc(rc)
        }
        Case::CqExTimestamps { timestamp } => {
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            let mr = message_region(pd, &mut bufs, &mut scope)?;
            let verbs = verbs_ctx(dev);
            let mut attr = ibv_cq_init_attr_ex {
                cqe: 16,
                cq_context: null_mut(),
                channel: null_mut(),
                comp_vector: 0,
                wc_flags: IBV_WC_EX_WITH_BYTE_LEN
                    | IBV_WC_EX_WITH_QP_NUM
                    | if timestamp {
                        IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
                    } else {
                        0
                    },
                comp_mask: 0,
                flags: 0,
                parent_domain: null_mut(),
            };
            // SAFETY: `verbs` is the live verbs context of the open context.
            let (create, query_values, query_ex) = unsafe {
                (
                    (*verbs).create_cq_ex,
                    (*verbs).query_rt_values,
                    (*verbs).query_device_ex,
                )
            };
            let create = create.ok_or("setup: verbs_context.create_cq_ex is NULL")?;
            let query_values =
                query_values.ok_or("setup: verbs_context.query_rt_values is NULL")?;
            let query_ex = query_ex.ok_or("setup: verbs_context.query_device_ex is NULL")?;
            let mut ax = ibv_device_attr_ex::zeroed();
            // SAFETY: the context is open; `ax` is writable for its size.
            let rc = unsafe {
                query_ex(
                    dev.ctx,
                    std::ptr::null(),
                    &mut ax,
                    std::mem::size_of::<ibv_device_attr_ex>(),
                )
            };
            if rc != 0 || ax.completion_timestamp_mask == 0 {
                return Err(format!(
                    "setup: ibv_query_device_ex: {rc}, mask {:#x}",
                    ax.completion_timestamp_mask
                ));
            }
            let mask = ax.completion_timestamp_mask;
            let raw_clock = || -> Result<u64, String> {
                let mut v = ibv_values_ex {
                    comp_mask: IBV_VALUES_MASK_RAW_CLOCK,
                    raw_clock: libc::timespec {
                        tv_sec: 0,
                        tv_nsec: 0,
                    },
                };
                // SAFETY: the context is open; `v` is readable and writable.
                let rc = unsafe { query_values(dev.ctx, &mut v) };
                if rc != 0 || v.comp_mask & IBV_VALUES_MASK_RAW_CLOCK == 0 {
                    return Err(format!("setup: ibv_query_rt_values_ex: {rc}"));
                }
                Ok(v.raw_clock.tv_sec as u64 * 1_000_000_000 + v.raw_clock.tv_nsec as u64)
            };
            // SAFETY: the context is open; `attr` is readable.
            let cqx = unsafe { create(dev.ctx, &mut attr) };
            if cqx.is_null() {
                return Err(format!("setup: ibv_create_cq_ex: errno {}", errno()));
            }
            let cq = cqx.cast::<ibv_cq>();
            // SAFETY: `cq` is live until this step, which runs once, after its QP.
            scope.defer("ibv_destroy_cq", move || unsafe { ibv_destroy_cq(cq) });
            // SAFETY: a live extended CQ's ops (called with no NULL check, as the inlines do).
            let ops = unsafe { *cqx };
            let (
                Some(start),
                Some(next),
                Some(end),
                Some(opcode),
                Some(byte_len),
                Some(qpn),
                Some(ts),
            ) = (
                ops.start_poll,
                ops.next_poll,
                ops.end_poll,
                ops.read_opcode,
                ops.read_byte_len,
                ops.read_qp_num,
                ops.read_completion_ts,
            )
            else {
                return Err("setup: an extended-poll op is NULL".into());
            };
            let mut pattr = ibv_poll_cq_attr::default();
            // SAFETY: `cqx` is live; `pattr` is readable.
            let rc = unsafe { start(cqx, &mut pattr) };
            if rc != ENOENT {
                problems.push(format!("ibv_start_poll on an empty CQ returned {rc}"));
            }
            let (qp, _) = loopback(dev, pd, cq, cq, 8, &mut scope)?;
            post_recvs(qp, mr, 8000, 2)?;
            let before = raw_clock()?;
            send(qp, mr, 1, 100, false)?;
            send(qp, mr, 2, 200, false)?;
            // (wr_id, status, opcode, byte_len, qp_num, timestamp)
            let mut got: Vec<(u64, u32, u32, u32, u32, u64)> = Vec::new();
            let read = |got: &mut Vec<_>| {
                // SAFETY: inside the poll window of the live `cqx`: the current completion's
                // fields, as the `ibv_wc_read_*` inlines read them.
                got.push(unsafe {
                    (
                        (*cqx).wr_id,
                        (*cqx).status,
                        opcode(cqx),
                        byte_len(cqx),
                        qpn(cqx),
                        ts(cqx),
                    )
                });
            };
            let deadline = Instant::now() + PATIENCE;
            for _ in 0..MAX_ITERS {
                if got.len() >= 4 || Instant::now() >= deadline {
                    break;
                }
                // SAFETY: `cqx` is live; `pattr` is readable.
                match unsafe { start(cqx, &mut pattr) } {
                    ENOENT => {
                        std::thread::yield_now();
                        continue;
                    }
                    0 => {}
                    rc => {
                        problems.push(format!("ibv_start_poll returned {rc}"));
                        break;
                    }
                }
                read(&mut got);
                for _ in 0..8 {
                    // SAFETY: inside the poll window of the live `cqx`.
                    match unsafe { next(cqx) } {
                        0 => read(&mut got),
                        ENOENT => break,
                        rc => {
                            problems.push(format!("ibv_next_poll returned {rc}"));
                            break;
                        }
                    }
                }
                // SAFETY: closes the window `start` opened (also after next's ENOENT).
                unsafe { end(cqx) };
            }
            let after = raw_clock()?;
            if got.len() != 4 {
                problems.push(format!(
                    "{} of 4 completions with start/next/end",
                    got.len()
                ));
            }
            // SAFETY: `cqx` is live; `pattr` is readable.
            let rc = unsafe { start(cqx, &mut pattr) };
            if rc != ENOENT {
                problems.push(format!("ibv_start_poll after the batch returned {rc}"));
            }
            let mut receives = 0;
            for &(wr_id, status, op, len, num, _) in &got {
                let (want_op, want_len) = match wr_id {
                    1 | 2 => (IBV_WC_SEND, None),
                    _ => {
                        receives += 1;
                        (IBV_WC_RECV, Some(if receives == 1 { 100 } else { 200 }))
                    }
                };
                if status != 0
                    || op != want_op
                    || want_len.is_some_and(|l| l != len)
                    || num != qp_num(qp)
                {
                    problems.push(format!(
                        "completion {wr_id}: status {status} opcode {op} {len} bytes QP {num}"
                    ));
                }
            }
            let stamps: Vec<u64> = got.iter().map(|g| g.5).collect();
            if stamps.iter().all(|t| *t == 0) {
                Outcome::Seen(Expect::NoValue)
            } else {
                for (i, t) in stamps.iter().enumerate() {
                    let inside = (after & mask) < (before & mask)
                        || (before & mask..=after & mask).contains(t);
                    if *t == 0 || t & !mask != 0 || !inside {
                        problems.push(format!(
                            "completion {i}: timestamp {t} outside [{before}, {after}] \
                                 / mask {mask:#x}"
                        ));
                    }
                    if i > 0 && *t < stamps[i - 1] {
                        problems.push(format!("timestamps go backwards: {stamps:?}"));
                    }
                }
                Outcome::OK
            }
        }
        Case::DestroyCqWithCompletionEvents {
            events,
            acknowledged,
        } => {
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            let mr = message_region(pd, &mut bufs, &mut scope)?;
            let (channel, _) = create_channel(dev, &mut scope)?;
            let (cq, cq_step) = create_cq_on(dev, 16, channel, &mut scope)?;
            let (aux, _) = create_cq(dev, 16, &mut scope)?;
            let (qp, qp_step) = loopback(dev, pd, aux, cq, 8, &mut scope)?;
            post_recvs(qp, mr, 9000, events)?;
            let mut taken = 0;
            for i in 0..events {
                let rc = req_notify(cq, false);
                if rc != 0 {
                    problems.push(format!("ibv_req_notify_cq returned {rc}"));
                }
                send_and_wait(qp, mr, aux, u64::from(i), false, &mut problems)?;
                // SAFETY: a live channel's fd field.
                if !fd_readable(unsafe { (*channel).fd }, PATIENCE) {
                    problems.push(format!("no event {i} within {PATIENCE:?}"));
                    continue;
                }
                let mut ev_cq: *mut ibv_cq = null_mut();
                let mut ev_ctx: *mut c_void = null_mut();
                // SAFETY: `channel` is live; both out-pointers are writable.
                if unsafe { ibv_get_cq_event(channel, &mut ev_cq, &mut ev_ctx) } == 0 && ev_cq == cq
                {
                    taken += 1;
                } else {
                    problems.push(format!("event {i}: errno {} / {ev_cq:?}", errno()));
                }
            }
            let wcs = poll_n(cq, events as usize, "the receives", &mut problems);
            expect_receives(&wcs, 9000, events as usize, MSG, &mut problems);
            // SAFETY: `qp` is live; its scope step is cancelled below.
            let rc = unsafe { ibv_destroy_qp(qp) };
            if rc != 0 {
                return Err(format!("setup: ibv_destroy_qp returned {rc}"));
            }
            scope.cancel(qp_step);
            if acknowledged {
                // SAFETY: `cq` is live; `taken` events of it were delivered.
                unsafe { ibv_ack_cq_events(cq, taken) };
                // SAFETY: a live CQ's counter.
                let counted = unsafe { (*cq).comp_events_completed };
                if counted != taken {
                    problems.push(format!(
                        "comp_events_completed is {counted} after acknowledging {taken}"
                    ));
                }
            }
            scope.cancel(cq_step);
            let cq_addr = cq as usize;
            let mut ack = || {
                // SAFETY: the destroy is still waiting, so the CQ is alive.
                unsafe { ibv_ack_cq_events(cq, taken) };
            };
            let (outcome, released, gone) = destroy_waiting(
                // SAFETY: `cq` is live, its QP gone; this is its one destroy.
                move || unsafe { ibv_destroy_cq(cq_addr as *mut ibv_cq) },
                if acknowledged {
                    None
                } else {
                    Some(&mut ack as &mut dyn FnMut())
                },
            );
            if !gone {
                if !released && !acknowledged {
                    // SAFETY: the destroy refused, the CQ is alive.
                    unsafe { ibv_ack_cq_events(cq, taken) };
                }
                // SAFETY: the destroy refused, the CQ is alive; its events acknowledged.
                scope.defer("ibv_destroy_cq", move || unsafe { ibv_destroy_cq(cq) });
            }
            outcome
        }
        Case::AsyncEvent { source } => {
            drain_async(dev);
            let raised = raise(dev, source, &mut bufs, &mut scope, &mut problems)?;
            match await_async(dev, raised.kind, raised.object, &mut problems) {
                Some(ev) => {
                    ack_async(ev);
                    Outcome::Seen(Expect::AsyncEvent(raised.kind))
                }
                None => Outcome::Seen(Expect::NoAsyncEvent),
            }
        }
        Case::DestroyWithUnackedAsyncEvent { source } => {
            drain_async(dev);
            let raised = raise(dev, source, &mut bufs, &mut scope, &mut problems)?;
            let Some(ev) = await_async(dev, raised.kind, raised.object, &mut problems) else {
                return Err(format!("setup: no {:?} naming the object", raised.kind));
            };
            // The SRQ and the CQ go after the QPs using them.
            if source != AsyncSource::BadRkeyWrite {
                for &(qp, step) in &raised.qps {
                    // SAFETY: `qp` is live; its scope step is cancelled.
                    let rc = unsafe { ibv_destroy_qp(qp) };
                    if rc != 0 {
                        return Err(format!("setup: ibv_destroy_qp returned {rc}"));
                    }
                    scope.cancel(step);
                }
            }
            scope.cancel(raised.step);
            let object = raised.object;
            let destroy = move || -> c_int {
                // SAFETY: the object is live and this is its one destroy (its scope step
                // is cancelled); the SRQ's and CQ's QPs are gone.
                unsafe {
                    match source {
                        AsyncSource::BadRkeyWrite => ibv_destroy_qp(object as *mut ibv_qp),
                        AsyncSource::SrqLimit => ibv_destroy_srq(object as *mut ibv_srq),
                        AsyncSource::CqOverrun => ibv_destroy_cq(object as *mut ibv_cq),
                    }
                }
            };
            let mut held = Some(ev);
            let mut ack = || {
                if let Some(ev) = held.take() {
                    ack_async(ev);
                }
            };
            let (outcome, _, gone) = destroy_waiting(destroy, Some(&mut ack));
            if !gone {
                // Refused: the object is alive; its event acknowledged, it goes at the end.
                ack();
                scope.defer("the object's destroy", destroy);
            }
            outcome
        }
        Case::AckAsyncEvent => {
            drain_async(dev);
            let raised = raise(
                dev,
                AsyncSource::BadRkeyWrite,
                &mut bufs,
                &mut scope,
                &mut problems,
            )?;
            let Some(ev) = await_async(dev, raised.kind, raised.object, &mut problems) else {
                return Err("setup: no IBV_EVENT_QP_ACCESS_ERR naming the responder".into());
            };
            let resp = raised.object as *mut ibv_qp;
            // SAFETY: a live QP's counter.
            let before = unsafe { (*resp).events_completed };
            ack_async(ev);
            // SAFETY: as above.
            let after = unsafe { (*resp).events_completed };
            if (before, after) != (0, 1) {
                problems.push(format!(
                    "events_completed {before} -> {after}, expected 0 -> 1"
                ));
            }
            scope.cancel(raised.step);
            let addr = raised.object;
            let destroy = move || -> c_int {
                // SAFETY: the QP is live and this is its one destroy (its scope step is
                // cancelled; re-deferred below if it refuses).
                unsafe { ibv_destroy_qp(addr as *mut ibv_qp) }
            };
            let (outcome, _, gone) = destroy_waiting(destroy, None);
            if !gone {
                scope.defer("ibv_destroy_qp", destroy);
            }
            outcome
        }
        Case::AsyncEventOfDestroyedQp => {
            drain_async(dev);
            let raised = raise(
                dev,
                AsyncSource::BadRkeyWrite,
                &mut bufs,
                &mut scope,
                &mut problems,
            )?;
            std::thread::sleep(QUIET);
            // SAFETY: the responder is live and no event naming it was read.
            let rc = unsafe { ibv_destroy_qp(raised.object as *mut ibv_qp) };
            if rc != 0 {
                return Err(format!("setup: ibv_destroy_qp returned {rc}"));
            }
            scope.cancel(raised.step);
            let mut outcome = Outcome::Seen(Expect::NoAsyncEvent);
            for _ in 0..64 {
                let Some(ev) = next_async(dev, QUIET) else {
                    break;
                };
                let (kind, object) = event_parts(&ev);
                if object == raised.object {
                    outcome = match kind {
                        Some(kind) => Outcome::Seen(Expect::AsyncEvent(kind)),
                        None => Outcome::Other(format!("event type {}", ev.event_type)),
                    };
                }
                ack_async(ev);
            }
            outcome
        }
        Case::AsyncEventOfDestroyedCq => {
            drain_async(dev);
            let raised = raise(
                dev,
                AsyncSource::CqOverrun,
                &mut bufs,
                &mut scope,
                &mut problems,
            )?;
            let old = raised.object as *mut ibv_cq;
            // In the error state a poll fails and takes nothing; before, a probe takes at
            // most one completion, and 16 probes cannot keep the 17 extra ones from
            // overrunning it.
            let deadline = Instant::now() + PATIENCE;
            let mut overran = false;
            let mut pause = Duration::from_millis(10);
            for _ in 0..16 {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
                let mut wc = [ibv_wc::default(); 1];
                if poll_cq(old, &mut wc) < 0 {
                    overran = true;
                    break;
                }
                if Instant::now() >= deadline {
                    break;
                }
            }
            if !overran {
                return Err("setup: the CQ did not overrun (16 polls did not fail)".into());
            }
            for &(qp, step) in &raised.qps {
                // SAFETY: `qp` is live; its scope step is cancelled.
                let rc = unsafe { ibv_destroy_qp(qp) };
                if rc != 0 {
                    return Err(format!("setup: ibv_destroy_qp returned {rc}"));
                }
                scope.cancel(step);
            }
            // SAFETY: `old` is live, its QPs gone, no event of it delivered; its scope step
            // is cancelled.
            let rc = unsafe { ibv_destroy_cq(old) };
            if rc != 0 {
                return Err(format!("setup: ibv_destroy_cq returned {rc}"));
            }
            scope.cancel(raised.step);
            let mut reused = false;
            for _ in 0..16 {
                let (cq, _) = create_cq(dev, 1, &mut scope)?;
                if cq == old {
                    reused = true;
                    break;
                }
            }
            if !reused {
                problems.push(format!(
                    "no new CQ got the destroyed CQ's address {old:?} in 16 tries: the case \
                     could not look at a CQ there"
                ));
            }
            let mut outcome = Outcome::Seen(Expect::NoAsyncEvent);
            for _ in 0..64 {
                let Some(ev) = next_async(dev, QUIET) else {
                    break;
                };
                if event_parts(&ev) == (Some(EventType::CqErr), old as usize) {
                    outcome = Outcome::Seen(Expect::AsyncEvent(EventType::CqErr));
                }
                ack_async(ev);
            }
            outcome
        }
        Case::RcTransfer { op, region, path } => {
            let all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
            let (pd_a, _) = alloc_pd(dev, &mut scope)?;
            let (pd_b, _) = alloc_pd(dev, &mut scope)?;
            let a = buffer(&mut bufs, 2 * PAGE);
            let b = buffer(&mut bufs, 2 * PAGE);
            // SAFETY: both buffers have `2 * PAGE` writable bytes.
            unsafe {
                std::ptr::write_bytes(a, 0x11, 2 * PAGE);
                std::ptr::write_bytes(a.add(PAGE), 0, 64);
                std::ptr::write_bytes(b, 0x5a, 2 * PAGE);
            }
            let mr_a = reg(pd_a, a, 2 * PAGE, all, &mut scope)?;
            let mr_b = reg(pd_b, b, 2 * PAGE, all, &mut scope)?;
            let (req_cq, _) = create_cq(dev, 16, &mut scope)?;
            let (resp_cq, _) = create_cq(dev, 16, &mut scope)?;
            let req = match path {
                PostPath::PostSend => rc_qp(pd_a, req_cq, req_cq, null_mut(), 8, &mut scope)?.0,
                PostPath::WrApi => rc_qp_ex(dev, pd_a, req_cq, &mut scope)?,
            };
            let (resp, _) = rc_qp(pd_a, resp_cq, resp_cq, null_mut(), 8, &mut scope)?;
            let remote_access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
            connect(dev, req, qp_num(resp), remote_access)?;
            connect(dev, resp, qp_num(req), remote_access)?;
            let (named, named_buf) = match region {
                RegionPd::Same => (mr_a, a),
                RegionPd::Other => (mr_b, b),
            };
            // SAFETY: live regions.
            let (a_lkey, named_lkey, named_rkey) =
                unsafe { ((*mr_a).lkey, (*named).lkey, (*named).rkey) };
            let rc = match (op, path) {
                (Opcode::RdmaWrite, PostPath::PostSend) => {
                    let mut sge = ibv_sge {
                        addr: a as u64,
                        length: 64,
                        lkey: a_lkey,
                    };
                    let mut wr = ibv_send_wr::zeroed();
                    wr.wr_id = 1;
                    wr.sg_list = &mut sge;
                    wr.num_sge = 1;
                    wr.opcode = IBV_WR_RDMA_WRITE;
                    wr.send_flags = IBV_SEND_SIGNALED;
                    wr.wr.rdma = ibv_send_wr_rdma {
                        remote_addr: named_buf as u64 + PAGE as u64,
                        rkey: named_rkey,
                    };
                    post_send(req, &mut wr)?.0
                }
                (Opcode::RdmaWrite, PostPath::WrApi) => {
                    // SAFETY: `req` is a live QP made by ibv_create_qp_ex.
                    let qpx = unsafe { ibv_qp_to_qp_ex(req) };
                    if qpx.is_null() {
                        return Err("setup: ibv_qp_to_qp_ex gave NULL".into());
                    }
                    // SAFETY: a live extended QP's builders (called with no NULL check, as
                    // the inlines do).
                    let ops = unsafe { *qpx };
                    let (Some(start), Some(write), Some(sge), Some(complete)) = (
                        ops.wr_start,
                        ops.wr_rdma_write,
                        ops.wr_set_sge,
                        ops.wr_complete,
                    ) else {
                        return Err("setup: an ibv_wr_* builder is NULL".into());
                    };
                    // SAFETY: `qpx` is live; one request is built between start and
                    // complete, its SGE in a live region.
                    unsafe {
                        start(qpx);
                        (*qpx).wr_id = 1;
                        (*qpx).wr_flags = IBV_SEND_SIGNALED;
                        write(qpx, named_rkey, named_buf as u64 + PAGE as u64);
                        sge(qpx, a_lkey, a as u64, 64);
                        complete(qpx)
                    }
                }
                (Opcode::Send, PostPath::PostSend) => {
                    // SAFETY: `resp` is a live QP and its context open.
                    let post = unsafe { (*(*resp).context).ops.post_recv }
                        .ok_or("setup: ops.post_recv is NULL")?;
                    let mut rsge = ibv_sge {
                        addr: a as u64 + PAGE as u64,
                        length: 64,
                        lkey: a_lkey,
                    };
                    let mut rwr = ibv_recv_wr {
                        wr_id: 30,
                        next: null_mut(),
                        sg_list: &mut rsge,
                        num_sge: 1,
                    };
                    let mut bad = null_mut();
                    // SAFETY: `resp` is live; one receive into a live region.
                    if unsafe { post(resp, &mut rwr, &mut bad) } != 0 {
                        return Err("setup: ibv_post_recv failed".into());
                    }
                    let mut sge = ibv_sge {
                        addr: named_buf as u64,
                        length: 64,
                        lkey: named_lkey,
                    };
                    let mut wr = ibv_send_wr::zeroed();
                    wr.wr_id = 1;
                    wr.sg_list = &mut sge;
                    wr.num_sge = 1;
                    wr.opcode = IBV_WR_SEND;
                    wr.send_flags = IBV_SEND_SIGNALED;
                    post_send(req, &mut wr)?.0
                }
                _ => {
                    return Err(
                        "setup: RcTransfer takes SEND or RDMA WRITE, SEND by ibv_post_send".into(),
                    )
                }
            };
            if rc != 0 {
                Outcome::failed(rc)
            } else {
                match poll_n(req_cq, 1, "the request", &mut problems).first() {
                    None => Outcome::Other("no completion".into()),
                    Some(wc) => {
                        // SAFETY: a range of the live buffer `a`.
                        let landed = unsafe { a.add(PAGE) };
                        match (op, wc.raw().status) {
                            (_, 0) => {
                                if !all_bytes(landed, 64, 0x11) {
                                    problems.push("the bytes did not land".into());
                                }
                                if op == Opcode::Send {
                                    let r = poll_n(resp_cq, 1, "the receive", &mut problems);
                                    expect_receives(&r, 30, 1, 64, &mut problems);
                                }
                            }
                            (Opcode::RdmaWrite, 10) => {
                                if !all_bytes(b, 2 * PAGE, 0x5a) {
                                    problems.push("region B (another PD) was written".into());
                                }
                                expect_state(resp, IBV_QPS_ERR, &mut problems);
                                expect_state(req, IBV_QPS_ERR, &mut problems);
                                expect_no_completion(resp_cq, "responder", &mut problems);
                            }
                            (Opcode::Send, 4) => {
                                expect_no_completion(resp_cq, "responder", &mut problems);
                                if !all_bytes(landed, 64, 0) {
                                    problems.push("bytes of a refused SEND were received".into());
                                }
                                expect_state(req, IBV_QPS_ERR, &mut problems);
                                expect_state(resp, IBV_QPS_RTS, &mut problems);
                            }
                            _ => {}
                        }
                        status_of(wc)
                    }
                }
            }
        }
        Case::CreateQpOfType { qp_type } => {
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            let (cq, _) = create_cq(dev, 16, &mut scope)?;
            match try_create_qp(pd, cq, null_mut(), qp_type, small_caps(0), &mut scope) {
                Ok(_) => Outcome::OK,
                Err(e) => Outcome::failed(e),
            }
        }
        Case::RegMrMemory {
            memory,
            access,
            via,
        } => {
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            let mut guard = None;
            let (addr, len): (*mut u8, usize) = match memory {
                Memory::Unmapped => {
                    let p = map_pages(2, libc::PROT_READ | libc::PROT_WRITE)?;
                    // SAFETY: the two pages just mapped, used by nothing.
                    if unsafe { libc::munmap(p.cast(), 2 * PAGE) } != 0 {
                        return Err("setup: munmap failed".into());
                    }
                    (p, 2 * PAGE)
                }
                Memory::Null => (null_mut(), PAGE),
                Memory::ReadOnly => {
                    let p = map_pages(2, libc::PROT_READ)?;
                    // SAFETY: the pages are unmapped once, after the region over them is
                    // deregistered (steps run latest first).
                    scope.defer("munmap", move || unsafe {
                        libc::munmap(p.cast(), 2 * PAGE)
                    });
                    (p, 2 * PAGE)
                }
                Memory::ZeroLength => (buffer(&mut bufs, 64), 0),
                Memory::TebibyteOverPageUnderMemlock => {
                    guard = Some(memlock::MemlockGuard::lower(64 * 1024)?);
                    (buffer(&mut bufs, PAGE), 1 << 40)
                }
            };
            let result = reg_via(pd, via, addr.cast(), len, access.0, &mut scope);
            drop(guard);
            match result {
                Ok(mr) => {
                    // SAFETY: a live region.
                    let (at, length) = unsafe { ((*mr).addr, (*mr).length) };
                    if at != addr.cast() || length != len {
                        problems.push(format!(
                            "the region is {at:?} + {length}, not {addr:?} + {len}"
                        ));
                    }
                    Outcome::OK
                }
                Err(e) => Outcome::failed(e),
            }
        }
        Case::RegMrPastMemlock => {
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            let p = map_pages(32, libc::PROT_READ | libc::PROT_WRITE)?;
            // SAFETY: the pages are unmapped once, after every region over them is gone.
            scope.defer("munmap", move || unsafe {
                libc::munmap(p.cast(), 32 * PAGE)
            });
            let guard = memlock::MemlockGuard::lower(64 * 1024)?;
            let mut inner = Scope::default();
            reg_via(
                pd,
                RegCall::RegMr,
                p.cast(),
                8 * PAGE,
                IBV_ACCESS_LOCAL_WRITE,
                &mut inner,
            )
            .map_err(|e| format!("setup: 32 KiB under a 64 KiB RLIMIT_MEMLOCK: errno {e}"))?;
            // SAFETY: a range of the 32 mapped pages.
            let more = unsafe { p.add(8 * PAGE) };
            let outcome = match reg_via(
                pd,
                RegCall::RegMr,
                more.cast(),
                16 * PAGE,
                IBV_ACCESS_LOCAL_WRITE,
                &mut inner,
            ) {
                Ok(_) => Outcome::OK,
                Err(e) => Outcome::failed(e),
            };
            problems.extend(inner.finish());
            if let Err(e) = reg_via(
                pd,
                RegCall::RegMr,
                p.cast(),
                16 * PAGE,
                IBV_ACCESS_LOCAL_WRITE,
                &mut inner,
            ) {
                problems.push(format!(
                    "64 KiB once the 32 KiB are deregistered: errno {e} (the pages not given back)"
                ));
            }
            problems.extend(inner.finish());
            drop(guard);
            outcome
        }
        Case::RdmaWriteIntoUnmappedRegion => {
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            let (req_cq, _) = create_cq(dev, 16, &mut scope)?;
            let (resp_cq, _) = create_cq(dev, 16, &mut scope)?;
            let (req, _) = rc_qp(pd, req_cq, req_cq, null_mut(), 8, &mut scope)?;
            let (resp, _) = rc_qp(pd, resp_cq, resp_cq, null_mut(), 8, &mut scope)?;
            connect(dev, req, qp_num(resp), IBV_ACCESS_REMOTE_WRITE)?;
            connect(dev, resp, qp_num(req), IBV_ACCESS_REMOTE_WRITE)?;
            let src = buffer(&mut bufs, PAGE);
            // SAFETY: `src` has a page of writable bytes.
            unsafe { std::ptr::write_bytes(src, 0x5a, PAGE) };
            let src_mr = reg(pd, src, PAGE, 0, &mut scope)?;
            let target = map_pages(2, libc::PROT_READ | libc::PROT_WRITE)?;
            let target_mr = reg(
                pd,
                target,
                2 * PAGE,
                IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
                &mut scope,
            )?;
            // Breaking ibv_reg_mr(3)'s contract on purpose: the pages go while registered.
            // SAFETY: the two pages mapped above; only the device could still touch them,
            // and the case checks that it does so safely.
            if unsafe { libc::munmap(target.cast(), 2 * PAGE) } != 0 {
                return Err("setup: munmap failed".into());
            }
            // SAFETY: live regions.
            let (lkey, rkey) = unsafe { ((*src_mr).lkey, (*target_mr).rkey) };
            let mut sge = ibv_sge {
                addr: src as u64,
                length: 256,
                lkey,
            };
            let mut wr = ibv_send_wr::zeroed();
            wr.wr_id = 6;
            wr.sg_list = &mut sge;
            wr.num_sge = 1;
            wr.opcode = IBV_WR_RDMA_WRITE;
            wr.send_flags = IBV_SEND_SIGNALED;
            wr.wr.rdma = ibv_send_wr_rdma {
                remote_addr: target as u64 + PAGE as u64 - 128,
                rkey,
            };
            let (rc, _) = post_send(req, &mut wr)?;
            if rc != 0 {
                Outcome::failed(rc)
            } else {
                match poll_n(req_cq, 1, "the RDMA WRITE", &mut problems).first() {
                    Some(wc) => status_of(wc),
                    None => Outcome::Other("no completion".into()),
                }
            }
        }
    };
    problems.extend(scope.finish());
    Ok(Run { outcome, problems })
}

/// Checks one rule: a line saying what happened, and the failures found.
fn check(dev: &Device, rule: &table::Rule) -> (String, Vec<String>) {
    let name = rule.name;
    let run = match run(dev, &rule.case) {
        Ok(run) => run,
        Err(e) => return (format!("{name}: {e}"), vec![format!("{name}: {e}")]),
    };
    let mut failures: Vec<String> = run
        .problems
        .iter()
        .map(|p| format!("{name}: {p}"))
        .collect();
    // What the drop-in must do: the documented outcome, or what a known discrepancy says.
    let (want, note) = match rule.drop_in {
        DropIn::Holds => (rule.expect, String::new()),
        DropIn::Discrepancy { observed, .. } => (
            observed,
            format!(" [DISCREPANCY, the rule: {}]", describe(rule.expect)),
        ),
    };
    let expected = describe(want);
    let got = run.outcome.describe();
    if run.outcome != Outcome::Seen(want) {
        failures.push(format!(
            "{name}: expected {expected}{note}, got {got} [{}]",
            rule.man
        ));
    }
    (
        format!("{name}: expected {expected}{note}, got {got}"),
        failures,
    )
}

/// Opens the drop-in's device as a C program does: the device list, the first entry.
fn open() -> *mut ibv_context {
    let mut n: c_int = 0;
    // SAFETY: `n` is writable.
    let list = unsafe { ibv_get_device_list(&mut n) };
    assert!(!list.is_null(), "ibv_get_device_list: errno {}", errno());
    assert!(n >= 1, "ibv_get_device_list listed {n} devices");
    // SAFETY: the list has `n` >= 1 entries.
    let device: *mut ibv_device = unsafe { *list };
    // SAFETY: `device` came from the list, which is still allocated.
    let ctx = unsafe { ibv_open_device(device) };
    let open_errno = errno();
    // SAFETY: the list came from `ibv_get_device_list` and is freed once; the device stays
    // valid (`ibv_free_device_list(3)`).
    unsafe { ibv_free_device_list(list) };
    assert!(!ctx.is_null(), "ibv_open_device: errno {open_errno}");
    ctx
}

/// Every rule of the table, through the drop-in; all failures reported at the end.
#[test]
fn every_rule_of_the_table_holds_through_the_drop_in() {
    table::check_table().expect("the table is well formed");
    // Before the first call into the drop-in, which opens its one device from the
    // environment; this binary's only test.
    std::env::set_var("SOFTVERBS_ADDR", DEVICE_ADDR);
    let ctx = open();
    let mut attr = ibv_device_attr::zeroed();
    // SAFETY: `ctx` is open; `attr` is writable.
    assert_eq!(unsafe { ibv_query_device(ctx, &mut attr) }, 0);
    let mut gid = ibv_gid::zeroed();
    // SAFETY: `ctx` is open; `gid` is writable.
    assert_eq!(unsafe { ibv_query_gid(ctx, 1, 0, &mut gid) }, 0);
    // Async events are read without blocking (ibv_get_async_event(3), non-blocking example).
    // SAFETY: the open context's async_fd field.
    set_nonblocking(unsafe { (*ctx).async_fd }).expect("async_fd non-blocking");
    let dev = Device { ctx, attr, gid };

    let mut failures = Vec::new();
    for rule in RULES {
        let (summary, found) = check(&dev, rule);
        println!(
            "{} {summary}",
            if found.is_empty() { "ok  " } else { "FAIL" }
        );
        failures.extend(found);
    }
    // SAFETY: `ctx` is open and every object made in it was destroyed by its case.
    let rc = unsafe { ibv_close_device(ctx) };
    if rc != 0 {
        failures.push(format!("ibv_close_device returned {rc}"));
    }
    assert!(
        failures.is_empty(),
        "{} failures in the {} rules through the drop-in:\n{}",
        failures.len(),
        RULES.len(),
        failures.join("\n")
    );
}
