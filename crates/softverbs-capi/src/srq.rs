//! Shared receive queues.
//!
//! | function | version | status |
//! |---|---|---|
//! | `ibv_create_srq`, `ibv_destroy_srq`, `ibv_modify_srq`, `ibv_query_srq` | 1.1 | documented failure (next slice) |
//! | `ops.post_srq_recv` | (ops) | documented failure (next slice); always non-NULL |
//! | `verbs_context.create_srq_ex`, `.get_srq_num` | (ops) | NULL: the inline falls back or gives `EOPNOTSUPP` |

use crate::abi::*;
use std::ffi::c_int;

unsupported! {
    /// `ibv_create_srq(3)`.
    null "IBVERBS_1.1" fn ibv_create_srq(*mut ibv_pd, *mut ibv_srq_init_attr) -> *mut ibv_srq
}
unsupported! {
    /// `ibv_destroy_srq(3)`.
    errno "IBVERBS_1.1" fn ibv_destroy_srq(*mut ibv_srq)
}
unsupported! {
    /// `ibv_modify_srq(3)`.
    errno "IBVERBS_1.1" fn ibv_modify_srq(*mut ibv_srq, *mut ibv_srq_attr, c_int)
}
unsupported! {
    /// `ibv_query_srq(3)`.
    errno "IBVERBS_1.1" fn ibv_query_srq(*mut ibv_srq, *mut ibv_srq_attr)
}

/// `ops.post_srq_recv` (`ibv_post_srq_recv(3)`): not supported yet, returns `EOPNOTSUPP`.
pub extern "C" fn post_srq_recv(
    _: *mut ibv_srq,
    _: *mut ibv_recv_wr,
    _: *mut *mut ibv_recv_wr,
) -> c_int {
    libc::EOPNOTSUPP
}
