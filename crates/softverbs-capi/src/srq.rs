//! Shared receive queues.
//!
//! | function | version | status |
//! |---|---|---|
//! | `ibv_create_srq`, `ibv_destroy_srq`, `ibv_query_srq` | 1.1 | real |
//! | `ibv_modify_srq` | 1.1 | real for `IBV_SRQ_LIMIT` (arms `IBV_EVENT_SRQ_LIMIT_REACHED`); `IBV_SRQ_MAX_WR` (resizing) is `EOPNOTSUPP` |
//! | `ops.post_srq_recv` | (ops) | real |
//! | `verbs_context.create_srq_ex` | (ops) | NULL: the inline falls back to `ibv_create_srq` for basic SRQs |

use crate::abi::*;
use crate::boundary::{errno_code, errno_of, pointer};
use crate::handles::{
    once_acknowledged, with_registry, Block, DeviceEntry, Tagged, DESTROY_ACK_WAIT,
};
use crate::pd::{PdParent, PdUse};
use crate::verbs_h::{IBV_SRQ_LIMIT, IBV_SRQ_MAX_WR};
use crate::wr::post_recv_list;
use softverbs::core::engine::{SrqId, SrqInit};
use std::ffi::c_int;

/// The library's part of an SRQ.
pub struct SrqState {
    /// The engine's handle.
    pub id: SrqId,
    entry: &'static DeviceEntry,
    max_sge: u32,
    _pd: PdUse,
}

impl Tagged for SrqState {
    const MAGIC: u64 = u64::from_be_bytes(*b"svsrq\0\0\x01");
}

/// An SRQ as C sees it, followed by its state.
pub type SrqBlock = Block<ibv_srq, SrqState>;

/// `ibv_create_srq(3)`: `NULL` with `EINVAL` for sizes above the device's; on success
/// `srq_init_attr->attr` holds the real sizes.
///
/// # Safety
///
/// `pd` is NULL or a live PD; `init_attr` is NULL or readable and writable.
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    init_attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    pointer(|| {
        // SAFETY: `pd` is NULL or a live PD (this function's `# Safety`).
        let PdParent {
            hold,
            context,
            ctx,
            handle,
        } = unsafe { PdUse::acquire(pd) }?;
        if init_attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: `init_attr` is readable (this function's `# Safety`; not NULL here).
        let attr = unsafe { init_attr.read() };
        // The engine checks the sizes against the device's limits (EINVAL).
        let device = &ctx.entry.device;
        let id = device
            .create_srq(
                handle,
                SrqInit {
                    max_wr: attr.attr.max_wr,
                    max_sge: attr.attr.max_sge.max(1),
                    srq_limit: attr.attr.srq_limit,
                },
            )
            .map_err(errno_of)?;
        let (max_wr, max_sge, srq_limit) = device.query_srq(id).map_err(errno_of)?;
        // SAFETY: `init_attr` is writable (this function's `# Safety`; not NULL here).
        unsafe {
            (&raw mut (*init_attr).attr).write(ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit,
            })
        };
        let srq = ibv_srq {
            context,
            srq_context: attr.srq_context,
            pd,
            handle: id.0,
            mutex: PthreadMutex::default(),
            cond: PthreadCond::default(),
            events_completed: 0,
        };
        let ptr = SrqBlock::allocate(
            srq,
            SrqState {
                id,
                entry: ctx.entry,
                max_sge,
                _pd: hold,
            },
        );
        with_registry(|r| r.srqs.insert(id.0, ptr as usize));
        Ok(ptr)
    })
}
symver!(ibv_create_srq, "IBVERBS_1.1");

/// `ibv_destroy_srq(3)`: `EBUSY` while a QP uses it.
///
/// # Safety
///
/// `srq` is NULL or a live SRQ, not used again after a successful call.
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    errno_code(|| {
        // SAFETY: `srq` is NULL or a live SRQ (this function's `# Safety`).
        let state = unsafe { SrqBlock::state(srq) }?;
        // Its delivered async events acknowledged, it leaves the registry: no later event
        // names it (`ibv_get_async_event(3)`).
        once_acknowledged(srq as usize, DESTROY_ACK_WAIT, |r| {
            r.srqs.remove(&state.id.0)
        })?;
        if let Err(e) = state.entry.device.destroy_srq(state.id) {
            with_registry(|r| r.srqs.insert(state.id.0, srq as usize));
            return Err(errno_of(e));
        }
        // SAFETY: `srq` passed `state` above, `state` is not used again, and the caller
        // gives the SRQ up with this call.
        unsafe { SrqBlock::free(srq) };
        Ok(())
    })
}
symver!(ibv_destroy_srq, "IBVERBS_1.1");

/// `ibv_modify_srq(3)`: `IBV_SRQ_LIMIT` arms the limit event; resizing (`IBV_SRQ_MAX_WR`)
/// is `EOPNOTSUPP`; other mask bits are `EINVAL`.
///
/// # Safety
///
/// `srq` is NULL or a live SRQ; `attr` is NULL or readable.
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    errno_code(|| {
        // SAFETY: `srq` is NULL or a live SRQ (this function's `# Safety`).
        let state = unsafe { SrqBlock::state(srq) }?;
        if attr.is_null() || mask & !(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != 0 {
            return Err(libc::EINVAL);
        }
        if mask & IBV_SRQ_MAX_WR != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        if mask & IBV_SRQ_LIMIT != 0 {
            // SAFETY: `attr` is readable (this function's `# Safety`; not NULL here).
            let limit = unsafe { attr.read() }.srq_limit;
            state
                .entry
                .device
                .arm_srq_limit(state.id, limit)
                .map_err(errno_of)?;
        }
        Ok(())
    })
}
symver!(ibv_modify_srq, "IBVERBS_1.1");

/// `ibv_query_srq(3)`: sizes and the armed limit (0 when disarmed).
///
/// # Safety
///
/// `srq` is NULL or a live SRQ; `attr` is NULL or writable.
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    errno_code(|| {
        // SAFETY: `srq` is NULL or a live SRQ (this function's `# Safety`).
        let state = unsafe { SrqBlock::state(srq) }?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        let (max_wr, max_sge, srq_limit) =
            state.entry.device.query_srq(state.id).map_err(errno_of)?;
        // SAFETY: `attr` is writable (this function's `# Safety`; not NULL here).
        unsafe {
            attr.write(ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit,
            })
        };
        Ok(())
    })
}
symver!(ibv_query_srq, "IBVERBS_1.1");

/// `ops.post_srq_recv` (`ibv_post_srq_recv(3)`): as `ibv_post_recv`.
///
/// # Safety
///
/// `srq` is NULL or a live SRQ; the list is valid as `ibv_post_srq_recv(3)` requires.
pub unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: `srq` is NULL or a live SRQ (this function's `# Safety`).
    let state = unsafe { SrqBlock::state(srq) };
    // SAFETY: the list, its scatter/gather lists and `bad_wr` are valid as
    // `ibv_post_srq_recv(3)` requires (this function's `# Safety`).
    unsafe {
        post_recv_list(wr, bad_wr, state.map(|s| s.max_sge), |request| {
            let state = state?;
            state
                .entry
                .device
                .post_srq_recv(state.id, request)
                .map_err(errno_of)
        })
    }
}
