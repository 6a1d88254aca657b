//! Protection domains.
//!
//! | function | version | status |
//! |---|---|---|
//! | `ibv_alloc_pd`, `ibv_dealloc_pd` | 1.1 | real |
//!
//! `ibv_dealloc_pd` refuses (`EBUSY`) a PD that MRs, QPs, SRQs or AHs still use, as the
//! kernel does: the device keeps that rule ([`softverbs::core::device::Device::dealloc_pd`]), for
//! the safe API too; this file translates. A QP reaches only memory regions of its own PD: an L_Key or R_Key of a
//! region in another PD is refused like an invalid key (`IBV_WC_LOC_PROT_ERR` locally,
//! `IBV_WC_REM_ACCESS_ERR` at the requester for a remote access), as rxe and hardware do.

use crate::abi::*;
use crate::boundary::{errno_code, errno_of, pointer, Errno};
use crate::handles::{ContextBlock, PdBlock, PdState};
use std::ffi::c_int;

/// `ibv_alloc_pd(3)`: `NULL` with errno on failure.
///
/// # Safety
///
/// `context` is NULL or an open context.
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    pointer(|| {
        // SAFETY: `context` is NULL or an open context (this function's `# Safety`).
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
        // SAFETY: `pd` is NULL or a live PD (this function's `# Safety`).
        unsafe { PdBlock::state(pd) }?;
        // SAFETY: `pd` passed `PdBlock::state`, so it points at a live `ibv_pd`.
        let (context, handle) = unsafe { ((*pd).context, (*pd).handle) };
        // SAFETY: the context of a live PD is open (libibverbs requires a context's
        // objects to be destroyed before `ibv_close_device`).
        let ctx = unsafe { ContextBlock::from_ptr(context) }?;
        // The rule: refused while a memory region, QP, SRQ or address handle is in the PD.
        // Every object of ours that points at this block is one of those, so once the
        // device lets the PD go, nothing of ours refers to the block any more.
        ctx.entry.device.dealloc_pd(handle).map_err(errno_of)?;
        // SAFETY: `pd` passed `state` above, and the caller gives the PD up with this call;
        // the device confirmed no object is left in it.
        unsafe { PdBlock::free(pd) };
        Ok(())
    })
}
symver!(ibv_dealloc_pd, "IBVERBS_1.1");

/// An object's link to its PD: the PD block outlives it because the device refuses
/// `ibv_dealloc_pd` while the object exists ([`softverbs::core::device::Device::dealloc_pd`]).
#[derive(Debug)]
pub struct PdUse {
    _pd: *mut ibv_pd,
}

/// What creating an object in a PD takes from it (MRs, QPs, SRQs, AHs).
pub struct PdParent<'a> {
    /// The hold on the PD, for the new object's state.
    pub hold: PdUse,
    /// `pd->context`, which the new object's C struct repeats.
    pub context: *mut ibv_context,
    /// That context's block (for its device).
    pub ctx: &'a ContextBlock,
    /// `pd->handle`: the device's PD number (`ibv_alloc_pd` set it).
    pub handle: u32,
}

impl PdUse {
    /// Checks `pd` and finds its context: `EINVAL` if `pd` is not a live PD of ours or its
    /// context is not a live context of ours.
    ///
    /// # Safety
    ///
    /// The handle contract ([`crate::handles`]) for `pd`: NULL or a live PD. Its context
    /// is then open too: libibverbs requires a context's objects to be destroyed before
    /// `ibv_close_device`.
    pub unsafe fn acquire<'a>(pd: *mut ibv_pd) -> Result<PdParent<'a>, Errno> {
        // SAFETY: `pd`'s handle contract is this function's.
        unsafe { PdBlock::state(pd) }?;
        let hold = PdUse { _pd: pd };
        // SAFETY: `pd` passed `PdBlock::state`, so it points at a live `ibv_pd` (C's
        // fields, read as C left them).
        let (context, handle) = unsafe { ((*pd).context, (*pd).handle) };
        // SAFETY: the context of a live PD is open (this function's contract).
        let ctx = unsafe { ContextBlock::from_ptr(context) }?;
        Ok(PdParent {
            hold,
            context,
            ctx,
            handle,
        })
    }
}
