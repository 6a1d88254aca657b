//! Issue #12's rule table (`crates/softverbs/tests/rules/table.rs`, included below by path
//! so it is written once) through the drop-in `libibverbs.so.1`: every case calls the
//! exported functions directly from Rust as a C program would (`ibv_post_send` and
//! `ibv_poll_cq` are `verbs.h` inlines, so through the context's ops table), and its
//! outcome is compared with the documented errno: `errno` after a call returning a
//! pointer, the return value of a call returning `int` (`ibv_modify_qp(3)`,
//! `ibv_destroy_*`, `ibv_dealloc_pd(3)`, `ibv_post_send(3)`: "returns 0 on success, or the
//! value of errno on failure"). All failures are reported together at the end. The same
//! table runs through the safe API in `crates/softverbs/tests/rule_table.rs`.
//!
//! The drop-in opens one device per process, configured from the environment: this test
//! binary gives it `SOFTVERBS_ADDR=127.0.0.229:0` (an address of its own, an ephemeral
//! port) before the first call.

#[path = "../../softverbs/tests/rules/table.rs"]
mod table;

use softverbs_capi::abi::{
    ibv_ah, ibv_ah_attr, ibv_context, ibv_cq, ibv_device, ibv_device_attr, ibv_gid,
    ibv_global_route, ibv_mr, ibv_pd, ibv_qp, ibv_qp_attr, ibv_qp_cap, ibv_qp_init_attr,
    ibv_send_wr, ibv_send_wr_rdma, ibv_send_wr_ud, ibv_sge, ibv_srq, ibv_srq_attr,
    ibv_srq_init_attr, ibv_wc, IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, IBV_SEND_INLINE,
    IBV_SEND_SIGNALED, IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE, IBV_WR_SEND,
};
use softverbs_capi::ah::{ibv_create_ah, ibv_destroy_ah};
use softverbs_capi::boundary::set_errno;
use softverbs_capi::cq::{ibv_create_cq, ibv_destroy_cq};
use softverbs_capi::device::{
    ibv_close_device, ibv_free_device_list, ibv_get_device_list, ibv_open_device, ibv_query_device,
    ibv_query_gid,
};
use softverbs_capi::mr::{ibv_dereg_mr, ibv_reg_mr};
use softverbs_capi::pd::{ibv_alloc_pd, ibv_dealloc_pd};
use softverbs_capi::qp::{ibv_create_qp, ibv_destroy_qp, ibv_modify_qp, ibv_query_qp};
use softverbs_capi::srq::{ibv_create_srq, ibv_destroy_srq};
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::time::{Duration, Instant};
use table::{Case, Expect, Opcode, PdUser, QpKind, QpStateName, RULES};

/// The device address of this test binary (`SOFTVERBS_ADDR`).
const DEVICE_ADDR: &str = "127.0.0.229:0";

/// Longest a case waits for a completion.
const PATIENCE: Duration = Duration::from_secs(10);

/// The Q_Key of the UD cases.
const QKEY: u32 = 0x1111_1111;

// `verbs.h` values the library's `verbs_h` module does not carry (rdma-core 44):
// `enum ibv_qp_state`, `enum ibv_qp_attr_mask`, `enum ibv_mtu`, `enum ibv_access_flags`.
const IBV_QPS_RESET: u32 = 0;
const IBV_QPS_INIT: u32 = 1;
const IBV_QPS_RTR: u32 = 2;
const IBV_QPS_RTS: u32 = 3;
const IBV_QP_STATE: c_int = 1 << 0;
const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
const IBV_QP_PORT: c_int = 1 << 5;
const IBV_QP_QKEY: c_int = 1 << 6;
const IBV_QP_AV: c_int = 1 << 7;
const IBV_QP_PATH_MTU: c_int = 1 << 8;
const IBV_QP_TIMEOUT: c_int = 1 << 9;
const IBV_QP_RETRY_CNT: c_int = 1 << 10;
const IBV_QP_RNR_RETRY: c_int = 1 << 11;
const IBV_QP_RQ_PSN: c_int = 1 << 12;
const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
const IBV_QP_SQ_PSN: c_int = 1 << 16;
const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
const IBV_QP_DEST_QPN: c_int = 1 << 20;
const IBV_MTU_1024: u32 = 3;
const IBV_ACCESS_LOCAL_WRITE: u32 = 1 << 0;
const IBV_ACCESS_REMOTE_WRITE: u32 = 1 << 1;
const IBV_ACCESS_REMOTE_READ: u32 = 1 << 2;
const IBV_ACCESS_REMOTE_ATOMIC: u32 = 1 << 3;

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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Ok,
    Failed(i32),
}

impl Outcome {
    /// The outcome of a call returning an `int`: 0, or the errno value.
    fn of_rc(rc: c_int) -> Outcome {
        if rc == 0 {
            Outcome::Ok
        } else {
            Outcome::Failed(rc)
        }
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
/// [`PATIENCE`]); a problem if none does or it is not successful.
fn await_completion(cq: *mut ibv_cq, problems: &mut Vec<String>) {
    // SAFETY: `cq` is a live CQ and its context open (the inline reads them the same way).
    let Some(poll) = (unsafe { (*(*cq).context).ops.poll_cq }) else {
        problems.push("the context's ops.poll_cq is NULL".into());
        return;
    };
    let deadline = Instant::now() + PATIENCE;
    let mut wc = [ibv_wc::default(); 4];
    loop {
        // SAFETY: `cq` is live; `wc` has room for 4 completions.
        let n = unsafe { poll(cq, 4, wc.as_mut_ptr()) };
        if n > 0 {
            if wc[0].result().is_err() {
                problems.push(format!("the completion failed: {:?}", wc[0]));
            }
            return;
        }
        if n < 0 {
            problems.push(format!("ibv_poll_cq returned {n}"));
            return;
        }
        if Instant::now() > deadline {
            problems.push(format!("no completion within {PATIENCE:?}"));
            return;
        }
        std::thread::yield_now();
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
    let mut scope = Scope::default();
    let mut problems = Vec::new();
    let outcome = match *case {
        Case::CreateAh { sgid_index, port } => {
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            match create_ah(dev, pd, sgid_index, port, &mut scope) {
                Ok(_) => Outcome::Ok,
                Err(e) => Outcome::Failed(e),
            }
        }
        Case::ModifyQpToInit { port, pkey_index } => {
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            let (cq, _) = create_cq(dev, 16, &mut scope)?;
            let qp = create_qp(pd, cq, null_mut(), IBV_QPT_RC, small_caps(0), &mut scope)?;
            let outcome = Outcome::of_rc(modify(qp, init_attr(port, pkey_index, 0), INIT_MASK));
            let want = match outcome {
                Outcome::Ok => IBV_QPS_INIT,
                Outcome::Failed(_) => IBV_QPS_RESET,
            };
            expect_state(qp, want, &mut problems);
            outcome
        }
        Case::ModifyQpToRtr {
            sgid_index,
            max_dest_rd_atomic,
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
            let attr = rtr_attr(dev, qp_num(peer), sgid_index, n);
            let outcome = Outcome::of_rc(modify(qp, attr, RTR_MASK));
            let want = match outcome {
                Outcome::Ok => IBV_QPS_RTR,
                Outcome::Failed(_) => IBV_QPS_INIT,
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
            let want = match outcome {
                Outcome::Ok => state_value(to),
                Outcome::Failed(_) => state_value(from),
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
                    Outcome::Ok
                }
                Err(e) => Outcome::Failed(e),
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
                Ok(_) => Outcome::Ok,
                Err(e) => Outcome::Failed(e),
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
                Outcome::Failed(errno())
            } else {
                // SAFETY: `cq` is live until this step, which runs once.
                scope.defer("ibv_destroy_cq", move || unsafe { ibv_destroy_cq(cq) });
                Outcome::Ok
            }
        }
        Case::CreateSrq { max_wr } => {
            let max = dev.limit(dev.attr.max_srq_wr, "max_srq_wr")?;
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            match create_srq(pd, max_wr.resolve(max), &mut scope) {
                Ok(_) => Outcome::Ok,
                Err(e) => Outcome::Failed(e),
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
            if outcome == Outcome::Ok {
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
            if outcome == Outcome::Ok {
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
            }
            // SAFETY: `pd` is live (an object is in it; the call must refuse).
            let outcome = Outcome::of_rc(unsafe { ibv_dealloc_pd(pd) });
            if outcome == Outcome::Ok {
                // Gone despite the object in it: not deallocated twice.
                scope.cancel(pd_step);
            }
            outcome
        }
        Case::DestroyCqInUse => {
            let (pd, _) = alloc_pd(dev, &mut scope)?;
            let (cq, cq_step) = create_cq(dev, 16, &mut scope)?;
            create_qp(pd, cq, null_mut(), IBV_QPT_RC, small_caps(0), &mut scope)?;
            // SAFETY: `cq` is live (a QP uses it; the call must refuse).
            let outcome = Outcome::of_rc(unsafe { ibv_destroy_cq(cq) });
            if outcome == Outcome::Ok {
                scope.cancel(cq_step);
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
            if outcome == Outcome::Ok {
                scope.cancel(srq_step);
            }
            outcome
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
    let expected = match rule.expect {
        Expect::Ok => "success".to_string(),
        Expect::Errno(e) => format!("errno {e}"),
    };
    let got = match run.outcome {
        Outcome::Ok => "success".to_string(),
        Outcome::Failed(e) => format!("errno {e}"),
    };
    let holds = match (rule.expect, run.outcome) {
        (Expect::Ok, Outcome::Ok) => true,
        (Expect::Errno(want), Outcome::Failed(e)) => e == want,
        _ => false,
    };
    if !holds {
        failures.push(format!(
            "{name}: expected {expected}, got {got} [{}]",
            rule.man
        ));
    }
    (format!("{name}: expected {expected}, got {got}"), failures)
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
