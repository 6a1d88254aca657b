//! Creating and destroying QPs: `ibv_create_qp`, `verbs_context.create_qp_ex` and
//! `ibv_destroy_qp`.

use super::attr::{ibv_cap, qp_type};
use super::qp_ex::{builders, SUPPORTED_SEND_OPS};
use super::state::{Batch, QpBlock, QpState};
use crate::abi::*;
use crate::boundary::{errno_code, errno_of, pointer, Errno};
use crate::cq::CqBlock;
use crate::handles::{once_acknowledged, with_registry, ContextBlock, DESTROY_ACK_WAIT};
use crate::pd::{PdParent, PdUse};
use crate::srq::SrqBlock;
use crate::verbs_h::{
    IBV_QP_INIT_ATTR_CREATE_FLAGS, IBV_QP_INIT_ATTR_PD, IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
};
use softverbs::core::engine::{QpCaps, QpInit, QpState as EngineQpState};
use std::cell::UnsafeCell;
use std::ffi::c_int;

/// What creation asked for, from `ibv_create_qp` or `ibv_create_qp_ex`.
struct QpRequest {
    pd: *mut ibv_pd,
    attr: ibv_qp_init_attr,
    send_ops: Option<u64>,
}

/// Creates a QP block; returns it and the capacities the QP really has.
///
/// # Safety
///
/// The handle contract ([`crate::handles`]): `request.pd` is NULL or a live PD; the
/// attributes' CQ and SRQ pointers are NULL or live.
unsafe fn create(request: QpRequest) -> Result<(*mut ibv_qp, ibv_qp_cap), Errno> {
    let QpRequest { pd, attr, send_ops } = request;
    // SAFETY: `pd` is NULL or a live PD (this function's `# Safety`).
    let PdParent {
        hold,
        context,
        ctx,
        handle: pd_handle,
    } = unsafe { PdUse::acquire(pd) }?;
    let qp_type = qp_type(attr.qp_type)?;
    // SAFETY: the attributes' CQ pointers are NULL or live CQs (this function's
    // `# Safety`).
    let (send_cq, recv_cq) =
        unsafe { (CqBlock::state(attr.send_cq)?, CqBlock::state(attr.recv_cq)?) };
    let srq = if attr.srq.is_null() {
        None
    } else {
        // SAFETY: the attributes' SRQ pointer is a live SRQ (this function's `# Safety`;
        // not NULL here).
        Some(unsafe { SrqBlock::state(attr.srq) }?.id)
    };
    let device = &ctx.entry.device;
    // The engine checks the capacities against the device's limits (EINVAL).
    let cap = attr.cap;
    let caps = QpCaps {
        // A queue of 0 still holds what the engine needs to run it; C asked for none.
        max_send_wr: cap.max_send_wr.max(1),
        max_recv_wr: if srq.is_some() {
            0
        } else {
            cap.max_recv_wr.max(1)
        },
        max_send_sge: cap.max_send_sge.max(1),
        max_recv_sge: cap.max_recv_sge.max(1),
        max_inline_data: cap.max_inline_data,
    };
    let init = QpInit {
        qp_type,
        caps,
        sq_sig_all: attr.sq_sig_all != 0,
        srq,
        // The device's PD number (`ibv_alloc_pd` set `pd->handle` to it, as `ibv_reg_mr`
        // reads it): every L_Key and R_Key the QP uses must be of a region of this PD.
        pd: pd_handle,
    };
    let qpn = device
        .create_qp(init, send_cq.cq.producer(), recv_cq.cq.producer())
        .map_err(errno_of)?;
    let caps = device
        .query_qp(qpn)
        .map(|(_, init)| init.caps)
        .unwrap_or(caps);
    let qp_base = ibv_qp {
        context,
        qp_context: attr.qp_context,
        pd,
        send_cq: attr.send_cq,
        recv_cq: attr.recv_cq,
        srq: attr.srq,
        handle: qpn,
        qp_num: qpn,
        state: EngineQpState::Reset.to_raw(),
        qp_type: attr.qp_type,
        mutex: PthreadMutex::default(),
        cond: PthreadCond::default(),
        events_completed: 0,
    };
    let ptr = QpBlock::allocate(
        builders(qp_base, send_ops.unwrap_or(0)),
        QpState {
            qpn,
            entry: ctx.entry,
            qp_type,
            caps,
            extended: send_ops.is_some(),
            _pd: hold,
            batch: UnsafeCell::new(Batch::default()),
        },
    );
    with_registry(|r| r.qps.insert(qpn, ptr as usize));
    Ok((ptr.cast(), ibv_cap(&caps)))
}

/// `ibv_create_qp(3)`: `NULL` with errno: `EINVAL` (bad PD, CQ, SRQ or capacities above
/// the device's), `EOPNOTSUPP` (a QP type the device has no transport for). On success
/// `init_attr->cap` holds the capacities the QP really has.
///
/// # Safety
///
/// `pd` is NULL or a live PD; `init_attr` is NULL or a readable and writable struct whose
/// CQ and SRQ pointers are NULL or live.
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    init_attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    pointer(|| {
        if init_attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: `init_attr` is readable (this function's `# Safety`; not NULL here).
        let attr = unsafe { init_attr.read() };
        // SAFETY: `pd` and the CQ and SRQ pointers in `attr` are NULL or live (this
        // function's `# Safety`), which is all `create` asks.
        let (qp, cap) = unsafe {
            create(QpRequest {
                pd,
                attr,
                send_ops: None,
            })
        }?;
        // SAFETY: `init_attr` is writable (this function's `# Safety`; not NULL here).
        unsafe { (&raw mut (*init_attr).cap).write(cap) };
        Ok(qp)
    })
}
symver!(ibv_create_qp, "IBVERBS_1.1");

/// `verbs_context.create_qp_ex` (`ibv_create_qp_ex(3)`): a PD is required; `create_flags`
/// must be 0 (the device has none of them); `send_ops_flags` outside what the device
/// offers is `EOPNOTSUPP`; XRC, TSO, RSS and indirection tables are `EOPNOTSUPP`.
///
/// # Safety
///
/// `context` is NULL or an open context; `attr` is NULL or a readable and writable
/// struct whose PD, CQ and SRQ pointers are NULL or live.
pub unsafe extern "C" fn create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    pointer(|| {
        // SAFETY: `context` is NULL or an open context (this function's `# Safety`).
        unsafe { ContextBlock::from_ptr(context) }?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: `attr` is readable (this function's `# Safety`; not NULL here).
        let a = unsafe { attr.read() };
        let known =
            IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        if a.comp_mask & !known != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
            return Err(libc::EINVAL);
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let send_ops = if a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 {
            if a.send_ops_flags & !SUPPORTED_SEND_OPS != 0 {
                return Err(libc::EOPNOTSUPP);
            }
            Some(a.send_ops_flags)
        } else {
            None
        };
        let base = ibv_qp_init_attr {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        };
        // SAFETY: the PD, CQ and SRQ pointers in `attr` are NULL or live (this function's
        // `# Safety`), which is all `create` asks.
        let (qp, cap) = unsafe {
            create(QpRequest {
                pd: a.pd,
                attr: base,
                send_ops,
            })
        }?;
        // SAFETY: `attr` is writable (this function's `# Safety`; not NULL here).
        unsafe { (&raw mut (*attr).cap).write(cap) };
        Ok(qp)
    })
}

/// `ibv_destroy_qp(3)`: the QP's outstanding work requests are discarded and its CQs may be
/// destroyed afterwards.
///
/// # Safety
///
/// `qp` is NULL or a live QP, not used again after a successful call.
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    errno_code(|| {
        // SAFETY: `qp` is NULL or a live QP (this function's `# Safety`).
        let state = unsafe { QpBlock::state(qp) }?;
        // Its delivered async events acknowledged, it leaves the registry: no later event
        // names it (`ibv_get_async_event(3)`).
        once_acknowledged(qp as usize, DESTROY_ACK_WAIT, |r| r.qps.remove(&state.qpn))?;
        if let Err(e) = state.entry.device.destroy_qp(state.qpn) {
            with_registry(|r| r.qps.insert(state.qpn, qp as usize));
            return Err(errno_of(e));
        }
        // SAFETY: `qp` passed `state` above, `state` is not used again, and the caller
        // gives the QP up with this call.
        unsafe { QpBlock::free(qp) };
        Ok(())
    })
}
symver!(ibv_destroy_qp, "IBVERBS_1.1");
