//! Queue pairs.
//!
//! | function | version | status |
//! |---|---|---|
//! | `ibv_create_qp`, `ibv_destroy_qp`, `ibv_modify_qp`, `ibv_query_qp`, `ibv_attach_mcast`, `ibv_detach_mcast` | 1.1 | documented failure (next slice) |
//! | `ibv_qp_to_qp_ex` | 1.6 | documented failure (`NULL`, `EOPNOTSUPP`) |
//! | `ibv_query_qp_data_in_order` | 1.14 | 0 ("not guaranteed"), the documented answer when unknown |
//! | `ibv_query_ece`, `ibv_set_ece` | 1.10 | `EOPNOTSUPP` (documented: no ECE) |
//! | `ops.post_send`, `ops.post_recv` | (ops) | documented failure (next slice); always non-NULL |
//! | `verbs_context.create_qp_ex` | (ops) | NULL: the inline falls back to `ibv_create_qp` for PD-only requests |

use crate::abi::*;
use std::ffi::{c_int, c_void};

unsupported! {
    /// `ibv_create_qp(3)`.
    null "IBVERBS_1.1" fn ibv_create_qp(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp
}
unsupported! {
    /// `ibv_destroy_qp(3)`.
    errno "IBVERBS_1.1" fn ibv_destroy_qp(*mut ibv_qp)
}
unsupported! {
    /// `ibv_modify_qp(3)`.
    errno "IBVERBS_1.1" fn ibv_modify_qp(*mut ibv_qp, *mut ibv_qp_attr, c_int)
}
unsupported! {
    /// `ibv_query_qp(3)`.
    errno "IBVERBS_1.1" fn ibv_query_qp(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr)
}
unsupported! {
    /// `ibv_attach_mcast(3)`: the soft device has no multicast.
    errno "IBVERBS_1.1" fn ibv_attach_mcast(*mut ibv_qp, *const ibv_gid, u16)
}
unsupported! {
    /// `ibv_detach_mcast(3)`: the soft device has no multicast.
    errno "IBVERBS_1.1" fn ibv_detach_mcast(*mut ibv_qp, *const ibv_gid, u16)
}
unsupported! {
    /// `ibv_qp_to_qp_ex` (`ibv_wr_post(3)`).
    null "IBVERBS_1.6" fn ibv_qp_to_qp_ex(*mut ibv_qp) -> *mut ibv_qp_ex
}
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

/// `ops.post_send` (`ibv_post_send(3)`): not supported yet, returns `EOPNOTSUPP`.
pub extern "C" fn post_send(
    _: *mut ibv_qp,
    _: *mut ibv_send_wr,
    _: *mut *mut ibv_send_wr,
) -> c_int {
    libc::EOPNOTSUPP
}

/// `ops.post_recv` (`ibv_post_recv(3)`): not supported yet, returns `EOPNOTSUPP`.
pub extern "C" fn post_recv(
    _: *mut ibv_qp,
    _: *mut ibv_recv_wr,
    _: *mut *mut ibv_recv_wr,
) -> c_int {
    libc::EOPNOTSUPP
}
