//! Queue pairs and their work requests.
//!
//! | function | version | status |
//! |---|---|---|
//! | `ibv_create_qp`, `ibv_destroy_qp`, `ibv_modify_qp`, `ibv_query_qp` | 1.1 | real: RC, UC, UD |
//! | `ibv_attach_mcast`, `ibv_detach_mcast` | 1.1 | real: UD QPs, IPv4 and IPv6 multicast GIDs as IP multicast on the device's interface (loopback too, for IPv4) |
//! | `ibv_qp_to_qp_ex` | 1.6 | real: the `ibv_qp_ex` of a QP made by `ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`, else `NULL` |
//! | `ibv_query_qp_data_in_order` | 1.14 | 0 ("not guaranteed"), the documented answer when unknown |
//! | `ibv_query_ece`, `ibv_set_ece` | 1.10 | `EOPNOTSUPP` (documented: no ECE) |
//! | `ops.post_send`, `ops.post_recv` | (ops) | real; a list stops at the first bad request (`*bad_wr`) |
//! | `verbs_context.create_qp_ex` | (ops) | real: PD, no create flags, `send_ops_flags` for the work-request builders (send, send with immediate / invalidate, RDMA write (with immediate), RDMA read, both atomics, ATOMIC WRITE, FLUSH — `wr_flush` after rdma-core 44's struct, as rdma-core 45 lays it out) |
//! | `ibv_qp_ex` builders (`ibv_wr_start` … `ibv_wr_complete`) | (ops) | real for the operations above and every `set_*` but XRC; a builder's error is returned by `ibv_wr_complete`, which then posts nothing |
//!
//! Work requests: `SEND`, `SEND_WITH_IMM`, `SEND_WITH_INV`, `RDMA_WRITE`,
//! `RDMA_WRITE_WITH_IMM`, `RDMA_READ`, `ATOMIC_CMP_AND_SWP`, `ATOMIC_FETCH_AND_ADD`,
//! `LOCAL_INV`, `BIND_MW` (type 2 windows); flags `FENCE`, `SIGNALED`, `SOLICITED`,
//! `INLINE` (the payload is copied at post time, the lkeys are ignored). Other opcodes
//! (`TSO`, …) are `EINVAL`, as for a device without them.
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | the re-exports and the functions the device does not offer |
//! | `state.rs` | the QP block: [`QpState`], [`QpBlock`] |
//! | `create.rs` | creation (`ibv_create_qp`, `create_qp_ex`) and `ibv_destroy_qp` |
//! | `attr.rs` | attribute translation: QP type, capacities, `ibv_qp_attr` ↔ engine; `ibv_modify_qp`, `ibv_query_qp` |
//! | `post.rs` | `ibv_send_wr` → engine request; `ops.post_send`, `ops.post_recv` |
//! | `qp_ex.rs` | the `ibv_qp_ex` builders (`ibv_wr_*`) and `ibv_qp_to_qp_ex` |
//!
//! The submodules depend on each other without a cycle (`create` → `attr`, `qp_ex`,
//! `state`; `qp_ex` → `post`, `state`; `attr`, `post` → `state`), and not on this file;
//! work-request pieces shared with SRQs are in [`crate::wr`].

mod attr;
mod create;
mod post;
mod qp_ex;
mod state;

pub use attr::{ibv_modify_qp, ibv_query_qp};
pub use create::{create_qp_ex, ibv_create_qp, ibv_destroy_qp};
pub(crate) use post::SEND_FLAGS_KNOWN;
pub use post::{post_recv, post_send};
pub use qp_ex::ibv_qp_to_qp_ex;
pub use state::{QpBlock, QpState};

use crate::abi::*;
use crate::boundary::{errno_code, errno_of};
use std::ffi::{c_int, c_void};

/// Runs `verb` (the device's attach or detach) on the QP and GID a multicast call names;
/// the convention of both calls (0 or the errno; NULL arguments `EINVAL`).
///
/// # Safety
///
/// As [`ibv_attach_mcast`].
unsafe fn with_group(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    verb: fn(
        &softverbs::core::device::Device,
        u32,
        [u8; 16],
    ) -> Result<(), softverbs::core::device::DeviceError>,
) -> c_int {
    errno_code(|| {
        // SAFETY: `qp` is NULL or a live QP (the caller's `# Safety`).
        let state = unsafe { QpBlock::state(qp) }?;
        // SAFETY: `gid` is NULL or 16 readable bytes (the caller's `# Safety`), and every
        // bit pattern is a valid `raw`.
        let gid = unsafe { gid.as_ref().map(|g| g.raw) }.ok_or(libc::EINVAL)?;
        verb(&state.entry.device, state.qpn, gid).map_err(errno_of)
    })
}

/// `ibv_attach_mcast(3)`: attaches a UD QP to the multicast group `gid` (the device's
/// rules: `Device::attach_mcast`; the LID is ignored on RoCE). 0, or the errno: `EINVAL` for
/// a QP that is not UD, a GID that is not multicast or a NULL argument, `ENOMEM` past the
/// device's limits, the socket's errno if the group cannot be joined.
///
/// # Safety
///
/// `qp` is NULL or a live QP; `gid` is NULL or points at 16 readable bytes.
pub unsafe extern "C" fn ibv_attach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    // SAFETY: this function's `# Safety`.
    unsafe { with_group(qp, gid, softverbs::core::device::Device::attach_mcast) }
}
crate::symver!(ibv_attach_mcast, "IBVERBS_1.1");

/// `ibv_detach_mcast(3)`: detaches a QP from the multicast group `gid`. 0, or `EINVAL` (a
/// QP not attached to it, or the checks of `ibv_attach_mcast`).
///
/// # Safety
///
/// As [`ibv_attach_mcast`].
pub unsafe extern "C" fn ibv_detach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    // SAFETY: this function's `# Safety`.
    unsafe { with_group(qp, gid, softverbs::core::device::Device::detach_mcast) }
}
crate::symver!(ibv_detach_mcast, "IBVERBS_1.1");

unsupported! {
    /// `ibv_query_ece(3)`: enhanced connection establishment is not offered.
    errno "IBVERBS_1.10" fn ibv_query_ece(*mut ibv_qp, *mut c_void)
}
unsupported! {
    /// `ibv_set_ece(3)`: enhanced connection establishment is not offered.
    errno "IBVERBS_1.10" fn ibv_set_ece(*mut ibv_qp, *mut c_void)
}

/// `ibv_query_qp_data_in_order(3)`: 0, "not guaranteed" (the answer for an unknown
/// ordering).
pub extern "C" fn ibv_query_qp_data_in_order(_: *mut ibv_qp, _: u32, _: u32) -> c_int {
    0
}
crate::symver!(ibv_query_qp_data_in_order, "IBVERBS_1.14");
