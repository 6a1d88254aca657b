//! Protection domains.
//!
//! | function | version | status |
//! |---|---|---|
//! | `ibv_alloc_pd`, `ibv_dealloc_pd` | 1.1 | real |
//!
//! `ibv_dealloc_pd` refuses (`EBUSY`) a PD that MRs, QPs, SRQs or AHs still use, as the
//! kernel does. A QP reaches only memory regions of its own PD: an L_Key or R_Key of a
//! region in another PD is refused like an invalid key (`IBV_WC_LOC_PROT_ERR` locally,
//! `IBV_WC_REM_ACCESS_ERR` at the requester for a remote access), as rxe and hardware do.

use crate::abi::*;
use crate::boundary::Errno;
use crate::boundary::{errno_code, pointer};
use crate::handles::{ContextBlock, PdBlock, PdState};
use std::ffi::c_int;
use std::sync::atomic::Ordering;

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
        Ok(PdBlock::allocate(
            ibv_pd { context, handle },
            PdState::default(),
        ))
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
        let state = unsafe { PdBlock::state(pd) }?;
        if state.users.load(Ordering::Acquire) > 0 {
            return Err(libc::EBUSY);
        }
        // SAFETY: checked above; the caller gives it up.
        unsafe { PdBlock::free(pd) };
        Ok(())
    })
}
symver!(ibv_dealloc_pd, "IBVERBS_1.1");

/// An object's hold on its PD: `ibv_dealloc_pd` refuses while one exists. Dropped with the
/// object's state.
#[derive(Debug)]
pub struct PdUse {
    pd: *mut ibv_pd,
}

impl PdUse {
    /// Takes a hold on `pd` (`EINVAL` if it is not a live PD of ours).
    ///
    /// # Safety
    ///
    /// `pd` is NULL or a live PD.
    pub unsafe fn acquire(pd: *mut ibv_pd) -> Result<PdUse, Errno> {
        // SAFETY: per the contract.
        let state = unsafe { PdBlock::state(pd) }?;
        state.users.fetch_add(1, Ordering::AcqRel);
        Ok(PdUse { pd })
    }
}

impl Drop for PdUse {
    fn drop(&mut self) {
        // SAFETY: the PD outlives every hold on it (its dealloc refuses while one exists).
        if let Ok(state) = unsafe { PdBlock::state(self.pd) } {
            state.users.fetch_sub(1, Ordering::AcqRel);
        }
    }
}
