//! Protection domains.
//!
//! | function | version | status |
//! |---|---|---|
//! | `ibv_alloc_pd`, `ibv_dealloc_pd` | 1.1 | real |
//!
//! `ibv_dealloc_pd` does not refuse (`EBUSY`) a PD that MRs, QPs, SRQs or AHs still use:
//! the device keeps no per-PD count yet (their blocks name the PD only for C), and the
//! responder does not check that a remote key's PD matches the QP's (noted as left out).

use crate::abi::*;
use crate::boundary::{errno_code, pointer};
use crate::handles::{ContextBlock, PdBlock, PdState};
use std::ffi::c_int;

/// `ibv_alloc_pd(3)`: `NULL` with errno on failure.
///
/// # Safety
///
/// `context` is NULL or an open context.
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    pointer(|| {
        // SAFETY: per the contract.
        let block = unsafe { ContextBlock::from_ptr(context) }?;
        let handle = block.entry.device.alloc_pd();
        Ok(PdBlock::allocate(ibv_pd { context, handle }, PdState))
    })
}
symver!(ibv_alloc_pd, "IBVERBS_1.1");

/// `ibv_dealloc_pd(3)`: 0 or an errno value.
///
/// # Safety
///
/// `pd` is NULL or a PD from `ibv_alloc_pd`, not used again after this call.
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    errno_code(|| {
        // SAFETY: per the contract.
        unsafe { PdBlock::state(pd) }?;
        // SAFETY: checked above; the caller gives it up.
        unsafe { PdBlock::free(pd) };
        Ok(())
    })
}
symver!(ibv_dealloc_pd, "IBVERBS_1.1");
