//! The `ibv_qp_ex` work-request builders (`ibv_wr_post(3)`): `ibv_qp_to_qp_ex`, the
//! builder functions the `ibv_wr_*` inlines call through the `ibv_qp_ex`, and the batch
//! they fill until `ibv_wr_complete` posts it.
//!
//! # The builder contract
//!
//! The builders are not exported: C reaches them only through the function pointers of a
//! QP created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` (the `verbs.h` inlines call
//! `qpx->wr_send(qpx)` …), so `qpx` is a live extended QP of ours (the handle contract of
//! [`crate::handles`], which `QpBlock::state` still checks by its magic number); one thread
//! at a time uses a QP's builders between `ibv_wr_start` and `ibv_wr_complete` /
//! `ibv_wr_abort`; and the pointers they take (`sg_list`, `buf_list`, `addr`, `ah`) are
//! valid as `ibv_wr_post(3)` requires (an AH NULL or live).

use super::post::SEND_FLAGS_KNOWN;
use super::state::{Batch, QpBlock, QpState};
use crate::abi::*;
use crate::ah::AhBlock;
use crate::boundary::{errno_of, Errno};
use crate::mr::{set_window_rkey, window_bind};
use crate::verbs_h::{
    IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP, IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
    IBV_QP_EX_WITH_ATOMIC_WRITE, IBV_QP_EX_WITH_BIND_MW, IBV_QP_EX_WITH_LOCAL_INV,
    IBV_QP_EX_WITH_RDMA_READ, IBV_QP_EX_WITH_RDMA_WRITE, IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM,
    IBV_QP_EX_WITH_SEND, IBV_QP_EX_WITH_SEND_WITH_IMM, IBV_QP_EX_WITH_SEND_WITH_INV,
};
use crate::wr::{inline_payload, sges};
use softverbs::core::engine::{
    FlushPlacement, FlushSelectivity, Gather, SendFlags, SendOp, SendWr, Sge, SgeList, UdDest,
    WindowType,
};
use std::ffi::{c_int, c_void};

/// `IBV_QP_EX_WITH_FLUSH` (`enum ibv_qp_create_send_ops_flags` of rdma-core ≥ 45, which the
/// installed header predates).
pub(super) const IBV_QP_EX_WITH_FLUSH: u64 = 1 << 11;

/// What the device offers (no TSO; atomic write and flush).
pub(super) const SUPPORTED_SEND_OPS: u64 = IBV_QP_EX_WITH_FLUSH
    | IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | IBV_QP_EX_WITH_SEND_WITH_INV
    | IBV_QP_EX_WITH_LOCAL_INV
    | IBV_QP_EX_WITH_BIND_MW
    | IBV_QP_EX_WITH_ATOMIC_WRITE;

/// The `ibv_qp_ex` of a QP: the builders of the operations in `send_ops` (the others stay
/// NULL: the application did not ask for them).
pub(super) fn builders(qp_base: ibv_qp, send_ops: u64) -> ibv_qp_ex_45 {
    let with = |flag: u64| send_ops & flag != 0;
    let any = send_ops != 0;
    let ex = ibv_qp_ex {
        qp_base,
        comp_mask: 0,
        wr_id: 0,
        wr_flags: 0,
        wr_atomic_cmp_swp: with(IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP)
            .then_some(wr_atomic_cmp_swp as _),
        wr_atomic_fetch_add: with(IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)
            .then_some(wr_atomic_fetch_add as _),
        wr_bind_mw: with(IBV_QP_EX_WITH_BIND_MW).then_some(wr_bind_mw as _),
        wr_local_inv: with(IBV_QP_EX_WITH_LOCAL_INV).then_some(wr_local_inv as _),
        wr_rdma_read: with(IBV_QP_EX_WITH_RDMA_READ).then_some(wr_rdma_read as _),
        wr_rdma_write: with(IBV_QP_EX_WITH_RDMA_WRITE).then_some(wr_rdma_write as _),
        wr_rdma_write_imm: with(IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM)
            .then_some(wr_rdma_write_imm as _),
        wr_send: with(IBV_QP_EX_WITH_SEND).then_some(wr_send as _),
        wr_send_imm: with(IBV_QP_EX_WITH_SEND_WITH_IMM).then_some(wr_send_imm as _),
        wr_send_inv: with(IBV_QP_EX_WITH_SEND_WITH_INV).then_some(wr_send_inv as _),
        wr_send_tso: None,
        wr_set_ud_addr: any.then_some(wr_set_ud_addr as _),
        wr_set_xrc_srqn: None,
        wr_set_inline_data: any.then_some(wr_set_inline_data as _),
        wr_set_inline_data_list: any.then_some(wr_set_inline_data_list as _),
        wr_set_sge: any.then_some(wr_set_sge as _),
        wr_set_sge_list: any.then_some(wr_set_sge_list as _),
        wr_start: any.then_some(wr_start as _),
        wr_complete: any.then_some(wr_complete as _),
        wr_abort: any.then_some(wr_abort as _),
        wr_atomic_write: with(IBV_QP_EX_WITH_ATOMIC_WRITE).then_some(wr_atomic_write as _),
    };
    ibv_qp_ex_45 {
        ex,
        wr_flush: with(IBV_QP_EX_WITH_FLUSH).then_some(wr_flush as _),
    }
}

/// `ibv_qp_to_qp_ex` (`ibv_wr_post(3)`): the QP's `ibv_qp_ex` when it was created with
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`, else `NULL` (as libibverbs).
///
/// # Safety
///
/// `qp` is NULL or a live QP.
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    crate::boundary::infallible(std::ptr::null_mut(), || {
        // SAFETY: `qp` is NULL or a live QP (this function's `# Safety`).
        match unsafe { QpBlock::state(qp) } {
            Ok(state) if state.extended => qp.cast(),
            _ => std::ptr::null_mut(),
        }
    })
}
symver!(ibv_qp_to_qp_ex, "IBVERBS_1.6");

/// Runs a builder on the QP's batch (nothing happens for a pointer that is not one of
/// our extended QPs: the builders have no way to report it).
fn with_batch(qpx: *mut ibv_qp_ex, f: impl FnOnce(&QpState, &mut Batch)) {
    crate::boundary::infallible((), || {
        // SAFETY: `qpx` is a live extended QP (the builder contract, module
        // documentation).
        let Ok(state) = (unsafe { QpBlock::state(qpx) }) else {
            return;
        };
        // SAFETY: the batch is used by one thread at a time, between `ibv_wr_start` and
        // `ibv_wr_complete` / `ibv_wr_abort` (the builder contract), and `f` cannot reach
        // it another way.
        let batch = unsafe { &mut *state.batch.get() };
        f(state, batch);
    })
}

/// Starts the next work request of the batch with `op`, taking `wr_id` and `wr_flags`
/// from the `ibv_qp_ex` as they are now.
fn begin(qpx: *mut ibv_qp_ex, op: SendOp) {
    // SAFETY: `qpx` points at a live `ibv_qp_ex` (the builder contract); `wr_id` and
    // `wr_flags` are the application's fields, read as it set them.
    let (wr_id, flags) = unsafe {
        (
            (&raw const (*qpx).wr_id).read(),
            (&raw const (*qpx).wr_flags).read(),
        )
    };
    with_batch(qpx, |_, batch| {
        if flags & !SEND_FLAGS_KNOWN != 0 {
            batch.error.get_or_insert(libc::EINVAL);
        }
        batch.requests.push(SendWr {
            wr_id,
            op,
            gather: Gather::Sges(SgeList::new()),
            flags: SendFlags::from_bits_truncate(flags),
            ud: None,
        });
    });
}

/// Sets the payload of the request being built.
fn set_gather(qpx: *mut ibv_qp_ex, gather: Result<Gather, Errno>) {
    with_batch(qpx, |_, batch| match (batch.requests.last_mut(), gather) {
        (Some(wr), Ok(gather)) => wr.gather = gather,
        (_, Err(e)) => {
            batch.error.get_or_insert(e);
        }
        (None, Ok(_)) => {
            batch.error.get_or_insert(libc::EINVAL);
        }
    });
}

unsafe extern "C" fn wr_start(qpx: *mut ibv_qp_ex) {
    with_batch(qpx, |_, batch| batch.clear());
}

unsafe extern "C" fn wr_complete(qpx: *mut ibv_qp_ex) -> c_int {
    let mut result = Ok(());
    with_batch(qpx, |state, batch| {
        // The requests leave the batch but its list stays, for the next batch to fill
        // without an allocation.
        let mut requests = batch.requests.drain(..);
        result = match batch.error.take() {
            Some(e) => Err(e),
            None => requests.try_for_each(|wr| {
                state
                    .entry
                    .device
                    .post_send(state.qpn, wr)
                    .map_err(errno_of)
            }),
        };
    });
    result.err().unwrap_or(0)
}

unsafe extern "C" fn wr_abort(qpx: *mut ibv_qp_ex) {
    with_batch(qpx, |_, batch| batch.clear());
}

unsafe extern "C" fn wr_send(qpx: *mut ibv_qp_ex) {
    begin(qpx, SendOp::Send);
}

unsafe extern "C" fn wr_send_imm(qpx: *mut ibv_qp_ex, imm_data: u32) {
    begin(
        qpx,
        SendOp::SendWithImm {
            imm: u32::from_be(imm_data),
        },
    );
}

/// `ibv_wr_local_inv`.
unsafe extern "C" fn wr_local_inv(qpx: *mut ibv_qp_ex, invalidate_rkey: u32) {
    begin(qpx, SendOp::LocalInv { invalidate_rkey });
}

/// `ibv_wr_bind_mw`: binds type 2 window `mw` with R_Key `rkey`; `mw->rkey` takes the new
/// key when the request is built (the batch fails with `EINVAL` for a bad window, region
/// or flags, as `ibv_post_send` refuses them).
unsafe extern "C" fn wr_bind_mw(
    qpx: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    let bind = if info.is_null() {
        Err(libc::EINVAL)
    } else {
        // SAFETY: `info` is readable, `mw` and `info.mr` NULL or live (the builder
        // contract).
        unsafe { window_bind(mw, rkey, &info.read(), WindowType::Two) }
    };
    match bind {
        Ok(bind) => {
            begin(qpx, SendOp::BindMw(bind));
            // SAFETY: `mw` passed `window_bind` and is live.
            unsafe { set_window_rkey(mw, &bind) };
        }
        Err(e) => {
            with_batch(qpx, |_, batch| {
                batch.error.get_or_insert(e);
            });
        }
    }
}

unsafe extern "C" fn wr_send_inv(qpx: *mut ibv_qp_ex, invalidate_rkey: u32) {
    begin(qpx, SendOp::SendWithInv { invalidate_rkey });
}

unsafe extern "C" fn wr_rdma_write(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    begin(qpx, SendOp::RdmaWrite { remote_addr, rkey });
}

unsafe extern "C" fn wr_rdma_write_imm(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm_data: u32,
) {
    begin(
        qpx,
        SendOp::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm: u32::from_be(imm_data),
        },
    );
}

unsafe extern "C" fn wr_rdma_read(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    begin(qpx, SendOp::RdmaRead { remote_addr, rkey });
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    begin(
        qpx,
        SendOp::CompareSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        },
    );
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    begin(
        qpx,
        SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        },
    );
}

/// `ibv_wr_atomic_write` (ibv_wr_post(3), IBTA 1.5): the 8 bytes at `atomic_wr` are
/// copied now, as they are, and land at once at `remote_addr`; a NULL `atomic_wr` fails the
/// batch with `EINVAL` at `ibv_wr_complete`.
unsafe extern "C" fn wr_atomic_write(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    atomic_wr: *const c_void,
) {
    let value = if atomic_wr.is_null() {
        None
    } else {
        // SAFETY: a non-NULL `atomic_wr` points at 8 readable bytes (the man page's
        // contract); read unaligned, as the application may hold them anywhere.
        Some(unsafe { atomic_wr.cast::<[u8; 8]>().read_unaligned() })
    };
    begin(
        qpx,
        SendOp::AtomicWrite {
            remote_addr,
            rkey,
            value: value.unwrap_or_default(),
        },
    );
    if value.is_none() {
        set_gather(qpx, Err(libc::EINVAL));
    }
}

/// `ibv_wr_flush` (rdma-core ≥ 45, IBTA 1.5 RDMA FLUSH): `type` is the placement
/// (`IBV_FLUSH_GLOBAL` 1, `IBV_FLUSH_PERSISTENT` 2, or both), `level` the selectivity
/// (`IBV_FLUSH_RANGE` 0, `IBV_FLUSH_MR` 1); the engine checks the rest as for the safe
/// API's `SendRequest::flush`. Another placement bit, no placement or another level fails
/// the batch with `EINVAL` at `ibv_wr_complete`.
unsafe extern "C" fn wr_flush(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    len: usize,
    placement: u8,
    level: u8,
) {
    let placement = FlushPlacement::from_bits(placement).filter(|p| !p.is_empty());
    let selectivity = FlushSelectivity::from_raw(level);
    begin(
        qpx,
        SendOp::Flush {
            remote_addr,
            rkey,
            len: len as u64,
            placement: placement.unwrap_or(FlushPlacement::GLOBAL),
            selectivity: selectivity.unwrap_or_default(),
        },
    );
    if placement.is_none() || selectivity.is_none() {
        set_gather(qpx, Err(libc::EINVAL));
    }
}

unsafe extern "C" fn wr_set_sge(qpx: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    set_gather(
        qpx,
        Ok(Gather::Sges(SgeList::from(Sge { addr, length, lkey }))),
    );
}

unsafe extern "C" fn wr_set_sge_list(qpx: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge) {
    // SAFETY: `qpx` is a live extended QP (the builder contract).
    let max = unsafe { QpBlock::state(qpx) }.map_or(0, |s| s.caps.max_send_sge);
    let num = c_int::try_from(num_sge).unwrap_or(c_int::MAX);
    // SAFETY: `sg_list` has `num_sge` readable entries (the builder contract); `sges`
    // reads at most that many (`num` is `num_sge` or less).
    set_gather(qpx, unsafe { sges(sg_list, num, max) }.map(Gather::Sges));
}

unsafe extern "C" fn wr_set_inline_data(qpx: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    let buf = ibv_data_buf { addr, length };
    // SAFETY: `qpx` is a live extended QP and `addr` is readable for `length` bytes (the
    // builder contract); `buf` is that one buffer, a local.
    unsafe { wr_set_inline_data_list(qpx, 1, &buf) };
}

unsafe extern "C" fn wr_set_inline_data_list(
    qpx: *mut ibv_qp_ex,
    num_buf: usize,
    buf_list: *const ibv_data_buf,
) {
    // SAFETY: `qpx` is a live extended QP (the builder contract).
    let max = unsafe { QpBlock::state(qpx) }.map_or(0, |s| s.caps.max_inline_data);
    let gather = (|| {
        if num_buf > 0 && buf_list.is_null() {
            return Err(libc::EINVAL);
        }
        let mut list = SgeList::new();
        for i in 0..num_buf {
            // SAFETY: `i < num_buf`, and `buf_list` has `num_buf` readable entries (the
            // builder contract; not NULL: checked above).
            let b = unsafe { buf_list.add(i).read() };
            let length = u32::try_from(b.length).map_err(|_| libc::EINVAL)?;
            list.push(Sge {
                addr: b.addr as u64,
                length,
                lkey: 0,
            });
        }
        // SAFETY: each buffer is readable for its length (the builder's contract); the
        // bytes are copied now, so the application may reuse them on return.
        unsafe { inline_payload(&list, max) }.map(Gather::Inline)
    })();
    set_gather(qpx, gather);
}

unsafe extern "C" fn wr_set_ud_addr(
    qpx: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    // SAFETY: `ah` is NULL or a live AH (the builder contract).
    let av = unsafe { AhBlock::state(ah) }.map(|a| (a.av, a.pd));
    with_batch(qpx, |_, batch| match (batch.requests.last_mut(), av) {
        (Some(wr), Ok((av, pd))) => {
            wr.ud = Some(UdDest {
                av,
                remote_qpn,
                remote_qkey,
                pd,
            })
        }
        (_, Err(e)) => {
            batch.error.get_or_insert(e);
        }
        (None, Ok(_)) => {
            batch.error.get_or_insert(libc::EINVAL);
        }
    });
}
