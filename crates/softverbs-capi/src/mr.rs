//! Memory regions and memory windows.
//!
//! | function | version | status |
//! |---|---|---|
//! | `ibv_reg_mr`, `ibv_rereg_mr`, `ibv_dereg_mr` | 1.1 | documented failure (next slice) |
//! | `ibv_reg_mr_iova` | 1.7 | documented failure (next slice) |
//! | `ibv_reg_mr_iova2` | 1.8 | documented failure (next slice; perftest's registration path) |
//! | `ibv_reg_dmabuf_mr` | 1.12 | documented failure (no dma-buf) |
//! | `ibv_import_mr`, `ibv_unimport_mr` | 1.10 | documented failure (no shared command fd) |
//! | `ops.alloc_mw` | (ops) | NULL: the inline gives `EOPNOTSUPP` |
//! | `ops.bind_mw`, `ops.dealloc_mw` | (ops) | `EOPNOTSUPP` (no memory windows); always non-NULL |

use crate::abi::*;
use std::ffi::{c_int, c_void};

unsupported! {
    /// `ibv_reg_mr(3)`.
    null "IBVERBS_1.1" fn ibv_reg_mr(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr
}
unsupported! {
    /// `ibv_reg_mr_iova(3)`.
    null "IBVERBS_1.7" fn ibv_reg_mr_iova(*mut ibv_pd, *mut c_void, usize, u64, c_int) -> *mut ibv_mr
}
unsupported! {
    /// `ibv_reg_mr_iova2` (`ibv_reg_mr(3)`).
    null "IBVERBS_1.8" fn ibv_reg_mr_iova2(*mut ibv_pd, *mut c_void, usize, u64, u32) -> *mut ibv_mr
}
unsupported! {
    /// `ibv_reg_dmabuf_mr(3)`.
    null "IBVERBS_1.12" fn ibv_reg_dmabuf_mr(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr
}
unsupported! {
    /// `ibv_rereg_mr(3)` (returns an `enum ibv_rereg_mr_err_code` on failure in rdma-core;
    /// with `errno` set, `EOPNOTSUPP` here).
    errno "IBVERBS_1.1" fn ibv_rereg_mr(*mut ibv_mr, c_int, *mut ibv_pd, *mut c_void, usize, c_int)
}
unsupported! {
    /// `ibv_dereg_mr(3)`.
    errno "IBVERBS_1.1" fn ibv_dereg_mr(*mut ibv_mr)
}
unsupported! {
    /// `ibv_import_mr(3)`.
    null "IBVERBS_1.10" fn ibv_import_mr(*mut ibv_pd, u32) -> *mut ibv_mr
}
unsupported! {
    /// `ibv_unimport_mr(3)`.
    void "IBVERBS_1.10" fn ibv_unimport_mr(*mut ibv_mr)
}

/// `ops.bind_mw` (`ibv_bind_mw(3)`): no memory windows, returns `EOPNOTSUPP`.
pub extern "C" fn bind_mw(_: *mut ibv_qp, _: *mut ibv_mw, _: *mut ibv_mw_bind) -> c_int {
    libc::EOPNOTSUPP
}

/// `ops.dealloc_mw` (`ibv_dealloc_mw(3)`): no memory windows, returns `EOPNOTSUPP`.
pub extern "C" fn dealloc_mw(_: *mut ibv_mw) -> c_int {
    libc::EOPNOTSUPP
}
