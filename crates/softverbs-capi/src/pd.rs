//! Protection domains.
//!
//! | function | version | status |
//! |---|---|---|
//! | `ibv_alloc_pd`, `ibv_dealloc_pd` | 1.1 | real; `ibv_dealloc_pd` frees a parent domain too |
//! | `verbs_context.alloc_td`, `.dealloc_td` (`ibv_alloc_td`, `ibv_dealloc_td`) | (ops) | real |
//! | `verbs_context.alloc_parent_domain` (`ibv_alloc_parent_domain`) | (ops) | real: `td`, `pd_context`, the `alloc` / `free` callbacks (`IBV_ALLOCATOR_USE_DEFAULT` honoured) |
//! | `ibv_import_pd`, `ibv_unimport_pd` | 1.10 | real: a new struct for a PD named by its `handle` (`ENOENT` if the device has none); unimport frees the struct only |
//!
//! **Parent domains** (`ibv_alloc_parent_domain(3)`). A parent domain is a `struct ibv_pd`
//! whose `handle` is its protection domain's, so everything that takes a PD — `ibv_reg_mr`,
//! `ibv_create_qp`, `ibv_create_srq`, `ibv_create_ah`, `ibv_alloc_mw` — acts on that PD
//! (the objects are the PD's, as libibverbs documents: "the parent domain … can be used
//! wherever a PD is expected"). The device counts the parent domain as a user of its PD,
//! so `ibv_dealloc_pd` of the PD is refused (`EBUSY`) while it exists; `ibv_dealloc_pd` of
//! the parent domain is refused (`EBUSY`) while an object created through it — or a CQ
//! created in it, until its ring memory is released — still points at it.
//!
//! **What the allocator provides.** Only a CQ's ring: a CQ created in a parent domain
//! (`ibv_create_cq_ex` with `IBV_CQ_INIT_ATTR_MASK_PD`) takes its completion slots, and its
//! extra-field array if it asked for cvlan / flow tag / tag-matching fields, from `alloc`,
//! and gives them back through `free` when the CQ is destroyed; `ibv_resize_cq` takes the
//! new ring from `alloc` too (the old one is freed with the CQ). The completions are in
//! that memory, where the application can read them ([`softverbs::core::cq::memory`]).
//! The resource types passed to `alloc` / `free` are ours:
//! [`SOFTVERBS_RES_TYPE_CQ_RING`] (slots of 64 bytes, alignment 64: sequence word, the
//! `struct ibv_wc`, the timestamp) and [`SOFTVERBS_RES_TYPE_CQ_EXTRAS`] (24 bytes a slot,
//! alignment 8). A QP's work queues do not come from it: the engine keeps a QP's work
//! requests as Rust values inside the device (behind its state lock, read by the progress
//! thread), not in a buffer of WQEs that the application's memory could hold, so there is
//! no QP memory to ask for, and the allocator is not called for QPs, SRQs or doorbells.
//!
//! **Thread domains** (`ibv_alloc_td(3)`). A CQ created in a parent domain with a thread
//! domain polls without the CQ's consumer lock (`ibv_poll_cq`, `ibv_start_poll` …
//! `ibv_end_poll`, `ibv_resize_cq`): the application promised one thread at a time. The
//! producer lock stays (the device's progress thread pushes completions, and no thread
//! domain covers it); a QP's posting paths keep the device's state lock for the same reason.
//! `ibv_dealloc_td` is refused (`EBUSY`) while a parent domain uses the thread domain.
//!
//! Where those rules live: that a PD is held by its parent domains is the device's
//! ([`softverbs::core::device::Device::alloc_parent_domain`]); what a pointer may still be
//! named by (a parent domain by its objects, a thread domain by its parent domains) is
//! this file's, as pointer validity is the drop-in's.
//!
//! `ibv_dealloc_pd` refuses (`EBUSY`) a PD that MRs, QPs, SRQs or AHs still use, as the
//! kernel does: the device keeps that rule ([`softverbs::core::device::Device::dealloc_pd`]), for
//! the safe API too; this file translates. A QP reaches only memory regions of its own PD: an L_Key or R_Key of a
//! region in another PD is refused like an invalid key (`IBV_WC_LOC_PROT_ERR` locally,
//! `IBV_WC_REM_ACCESS_ERR` at the requester for a remote access), as rxe and hardware do.

use crate::abi::*;
use crate::boundary::{errno_code, errno_of, pointer, Errno};
use crate::handles::{Block, ContextBlock, PdBlock, PdState, Tagged};
use crate::verbs_h::{
    IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS, IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
};
use softverbs::core::cq::{
    RingAllocator, RingLayout, RingMemory, RingResource, SharedRingAllocator,
};
use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The `resource_type` a parent domain's `alloc` / `free` receive for a CQ's completion
/// slots: `("SV" << 32) | 1`, in the shape of rdma-core's provider types (driver id in the
/// upper half). 64 bytes a slot, alignment 64.
pub const SOFTVERBS_RES_TYPE_CQ_RING: u64 = (0x5356 << 32) | 1;
/// The `resource_type` for a CQ's extra-field array (cvlan, flow tag, tag-matching info):
/// 24 bytes a slot, alignment 8; only for CQs that asked for those fields.
pub const SOFTVERBS_RES_TYPE_CQ_EXTRAS: u64 = (0x5356 << 32) | 2;

/// `IBV_ALLOCATOR_USE_DEFAULT`: `((void *)-1)`.
const IBV_ALLOCATOR_USE_DEFAULT: usize = usize::MAX;

/// The parent-domain part of a PD block (`None` in the state of an ordinary PD).
pub struct ParentDomain {
    /// The handle of the protection domain it stands for (this block's `handle` too; kept
    /// here, not read through the PD's struct, which `ibv_unimport_pd` may free while the
    /// PD itself lives on).
    pd_handle: u32,
    /// Its thread domain, or NULL.
    pub td: *mut ibv_td,
    /// `alloc`, `free` and `pd_context`, when `IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS` was
    /// given.
    callbacks: Option<Callbacks>,
    /// Objects and CQs that still point at this block.
    users: AtomicUsize,
}

// SAFETY: the raw pointer names a block that outlives this one (`ibv_dealloc_td` refuses
// the TD while this parent domain exists); the
// callbacks are the application's, which `ibv_alloc_parent_domain(3)` lets the provider
// call from any thread that creates or destroys its objects.
unsafe impl Send for ParentDomain {}
// SAFETY: as above; `users` is atomic and the rest is read-only.
unsafe impl Sync for ParentDomain {}

#[derive(Clone, Copy)]
struct Callbacks {
    alloc: ParentDomainAlloc,
    free: ParentDomainFree,
    pd_context: *mut c_void,
}

/// A count on a parent domain's `users`, released when dropped.
pub struct DomainHold {
    users: *const AtomicUsize,
}

// SAFETY: `users` points into a parent domain's block, which `ibv_dealloc_pd` refuses to
// free while this hold exists; the counter is atomic.
unsafe impl Send for DomainHold {}
// SAFETY: as above.
unsafe impl Sync for DomainHold {}

impl DomainHold {
    fn new(domain: &ParentDomain) -> DomainHold {
        domain.users.fetch_add(1, Ordering::AcqRel);
        DomainHold {
            users: &domain.users,
        }
    }
}

impl Drop for DomainHold {
    fn drop(&mut self) {
        // SAFETY: the block outlives the hold (see the `Send` impl).
        unsafe { (*self.users).fetch_sub(1, Ordering::AcqRel) };
    }
}

/// The application's `alloc` / `free` as a ring allocator for one CQ.
struct CallbackAllocator {
    /// The parent domain, passed back to the callbacks as their `pd`.
    parent: *mut ibv_pd,
    callbacks: Callbacks,
    /// Keeps the parent domain from being freed while a ring of this CQ is allocated.
    _hold: DomainHold,
}

// SAFETY: as `ParentDomain`'s: the callbacks may be called from any thread.
unsafe impl Send for CallbackAllocator {}
// SAFETY: as above; nothing here is mutated.
unsafe impl Sync for CallbackAllocator {}

fn resource_type(resource: RingResource) -> u64 {
    match resource {
        RingResource::Slots => SOFTVERBS_RES_TYPE_CQ_RING,
        RingResource::Extras => SOFTVERBS_RES_TYPE_CQ_EXTRAS,
    }
}

// SAFETY: `ibv_alloc_parent_domain(3)`: `alloc` returns `size` bytes aligned to `alignment`
// for the provider's use until it calls `free` (the application's promise, which this
// forwards; a misaligned answer is refused by the CQ core, not trusted).
unsafe impl RingAllocator for CallbackAllocator {
    fn allocate(&self, layout: RingLayout) -> RingMemory {
        let c = self.callbacks;
        // SAFETY: the application's callback, called with its own parent domain and
        // `pd_context` as `ibv_alloc_parent_domain(3)` describes.
        let ptr = unsafe {
            (c.alloc)(
                self.parent,
                c.pd_context,
                layout.size,
                layout.align,
                resource_type(layout.resource),
            )
        };
        if ptr as usize == IBV_ALLOCATOR_USE_DEFAULT {
            return RingMemory::UseDefault;
        }
        match NonNull::new(ptr.cast::<u8>()) {
            Some(ptr) => RingMemory::Provided(ptr),
            None => RingMemory::Refused,
        }
    }

    unsafe fn release(&self, ptr: NonNull<u8>, layout: RingLayout) {
        let c = self.callbacks;
        // SAFETY: `ptr` is what `alloc` returned for this resource (the trait's contract),
        // handed back once, as `free` expects.
        unsafe {
            (c.free)(
                self.parent,
                c.pd_context,
                ptr.as_ptr().cast(),
                resource_type(layout.resource),
            )
        };
    }
}

/// What a CQ created in a parent domain takes from it.
pub struct CqInDomain {
    /// The ring allocator, if the parent domain has callbacks.
    pub allocator: Option<SharedRingAllocator>,
    /// Whether the parent domain has a thread domain (the CQ's consumer lock is dropped).
    pub thread_domain: bool,
    /// The hold on the parent domain (the allocator holds its own).
    pub hold: DomainHold,
}

/// Checks `pd` as `ibv_create_cq_ex`'s `parent_domain` for a CQ of `context`: `EINVAL` if
/// it is not a parent domain of ours or belongs to another context.
///
/// # Safety
///
/// The handle contract for `pd`: NULL or a live PD.
pub unsafe fn cq_in_domain(
    pd: *mut ibv_pd,
    context: *mut ibv_context,
) -> Result<CqInDomain, Errno> {
    // SAFETY: this function's contract.
    let state = unsafe { PdBlock::state(pd) }?;
    let domain = state.domain.as_ref().ok_or(libc::EINVAL)?;
    // SAFETY: `pd` passed `PdBlock::state`: a live `ibv_pd`.
    if unsafe { (*pd).context } != context {
        return Err(libc::EINVAL);
    }
    let allocator = domain.callbacks.map(|callbacks| {
        Arc::new(CallbackAllocator {
            parent: pd,
            callbacks,
            _hold: DomainHold::new(domain),
        }) as SharedRingAllocator
    });
    Ok(CqInDomain {
        allocator,
        thread_domain: !domain.td.is_null(),
        hold: DomainHold::new(domain),
    })
}

// -------------------------------------------------------------------- thread domains

/// The library's part of a thread domain.
pub struct TdState {
    /// Parent domains that name it.
    parent_domains: AtomicUsize,
}

impl Tagged for TdState {
    const MAGIC: u64 = u64::from_be_bytes(*b"svtd\0\0\0\x01");
}

/// A thread domain as C sees it, followed by its state.
pub type TdBlock = Block<ibv_td, TdState>;

/// `verbs_context.alloc_td` (`ibv_alloc_td(3)`): `EINVAL` for a `comp_mask` bit (none is
/// defined) or a context not ours.
///
/// # Safety
///
/// `context` is NULL or an open context; `init_attr` is NULL or readable.
pub unsafe extern "C" fn alloc_td(
    context: *mut ibv_context,
    init_attr: *mut ibv_td_init_attr,
) -> *mut ibv_td {
    pointer(|| {
        // SAFETY: this function's contract.
        unsafe { ContextBlock::from_ptr(context) }?;
        // SAFETY: NULL or readable (this function's contract).
        let attr = unsafe { init_attr.as_ref() }.ok_or(libc::EINVAL)?;
        if attr.comp_mask != 0 {
            return Err(libc::EINVAL);
        }
        Ok(TdBlock::allocate(
            ibv_td { context },
            TdState {
                parent_domains: AtomicUsize::new(0),
            },
        ))
    })
}

/// `verbs_context.dealloc_td` (`ibv_dealloc_td(3)`): `EBUSY` while a parent domain uses it
/// ("All resources created with the td should be destroyed prior to deallocating the td").
///
/// # Safety
///
/// `td` is NULL or a live thread domain.
pub unsafe extern "C" fn dealloc_td(td: *mut ibv_td) -> c_int {
    errno_code(|| {
        // SAFETY: this function's contract.
        let state = unsafe { TdBlock::state(td) }?;
        if state.parent_domains.load(Ordering::Acquire) != 0 {
            return Err(libc::EBUSY);
        }
        // SAFETY: live (checked above) and unused; the caller gives it up.
        unsafe { TdBlock::free(td) };
        Ok(())
    })
}

/// `verbs_context.alloc_parent_domain` (`ibv_alloc_parent_domain(3)`). `EINVAL` for a NULL
/// `attr`, a `pd` that is not an ordinary PD of this context (NULL, foreign, or itself a
/// parent domain), a `td` not of this context, an unknown `comp_mask` bit, or
/// `IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS` without both callbacks.
///
/// # Safety
///
/// `context` is NULL or an open context; `attr` is NULL or readable, its `pd` NULL or a
/// live PD and its `td` NULL or a live thread domain.
pub unsafe extern "C" fn alloc_parent_domain(
    context: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    pointer(|| {
        // SAFETY: this function's contract.
        let ctx = unsafe { ContextBlock::from_ptr(context) }?;
        // SAFETY: NULL or readable (this function's contract).
        let attr = unsafe { attr.as_ref() }.ok_or(libc::EINVAL)?;
        let known = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
        if attr.comp_mask & !known != 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: `attr.pd` is NULL or a live PD (this function's contract).
        let pd_state = unsafe { PdBlock::state(attr.pd) }?;
        // SAFETY: passed `PdBlock::state`: a live `ibv_pd`.
        let (pd_context, handle) = unsafe { ((*attr.pd).context, (*attr.pd).handle) };
        if pd_state.domain.is_some() || pd_context != context {
            return Err(libc::EINVAL);
        }
        let td_state = if attr.td.is_null() {
            None
        } else {
            // SAFETY: `attr.td` is a live thread domain (this function's contract).
            let state = unsafe { TdBlock::state(attr.td) }?;
            // SAFETY: passed `TdBlock::state`: a live `ibv_td`.
            if unsafe { (*attr.td).context } != context {
                return Err(libc::EINVAL);
            }
            Some(state)
        };
        let callbacks = if attr.comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS != 0 {
            let (Some(alloc), Some(free)) = (attr.alloc, attr.free) else {
                return Err(libc::EINVAL);
            };
            let pd_context = if attr.comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT != 0 {
                attr.pd_context
            } else {
                std::ptr::null_mut()
            };
            Some(Callbacks {
                alloc,
                free,
                pd_context,
            })
        } else {
            None
        };
        // The rule: the PD is held while the parent domain exists (the device's).
        ctx.entry
            .device
            .alloc_parent_domain(handle)
            .map_err(errno_of)?;
        if let Some(td) = td_state {
            td.parent_domains.fetch_add(1, Ordering::AcqRel);
        }
        Ok(PdBlock::allocate(
            ibv_pd { context, handle },
            PdState {
                domain: Some(ParentDomain {
                    pd_handle: handle,
                    td: attr.td,
                    callbacks,
                    users: AtomicUsize::new(0),
                }),
            },
        ))
    })
}

/// `ibv_dealloc_pd` of a parent domain: `EBUSY` while an object or CQ points at it.
///
/// # Safety
///
/// `pd` is a live parent domain whose state is `domain`, given up by the caller on success.
unsafe fn dealloc_parent_domain(
    pd: *mut ibv_pd,
    domain: &ParentDomain,
    ctx: &ContextBlock,
) -> Result<(), Errno> {
    if domain.users.load(Ordering::Acquire) != 0 {
        return Err(libc::EBUSY);
    }
    ctx.entry.device.dealloc_parent_domain(domain.pd_handle);
    if !domain.td.is_null() {
        // SAFETY: the thread domain outlives its parent domains (`dealloc_td` refuses).
        if let Ok(td) = unsafe { TdBlock::state(domain.td) } {
            td.parent_domains.fetch_sub(1, Ordering::AcqRel);
        }
    }
    // SAFETY: the caller gives the parent domain up; nothing points at it any more.
    unsafe { PdBlock::free(pd) };
    Ok(())
}

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
        // SAFETY: `pd` is NULL or a live PD (this function's `# Safety`).
        let state = unsafe { PdBlock::state(pd) }?;
        // SAFETY: `pd` passed `PdBlock::state`, so it points at a live `ibv_pd`.
        let (context, handle) = unsafe { ((*pd).context, (*pd).handle) };
        // SAFETY: the context of a live PD is open (libibverbs requires a context's
        // objects to be destroyed before `ibv_close_device`).
        let ctx = unsafe { ContextBlock::from_ptr(context) }?;
        if let Some(domain) = &state.domain {
            // SAFETY: `pd` is a live parent domain; the caller gives it up with this call.
            return unsafe { dealloc_parent_domain(pd, domain, ctx) };
        }
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

/// `ibv_import_pd(3)`: a new `struct ibv_pd` of `context` for the protection domain whose
/// handle is `pd_handle` (another struct's `handle`, of any context of the device). The
/// PD is the device's: objects created through either struct are in it, and
/// `ibv_dealloc_pd` of either deallocates it (by the same rule). `NULL` with `ENOENT` for
/// a handle the device has no PD for — the kernel's answer to an unknown object handle
/// (`lookup_get_idr_uobject` in `drivers/infiniband/core/rdma_core.c`), which mlx5's
/// `ibv_import_pd` returns — and `EINVAL` for a context not ours. A parent domain's
/// handle imports its PD, an ordinary one (the parent domain is this library's struct,
/// not a device object).
///
/// # Safety
///
/// `context` is NULL or an open context.
pub unsafe extern "C" fn ibv_import_pd(context: *mut ibv_context, pd_handle: u32) -> *mut ibv_pd {
    pointer(|| {
        // SAFETY: this function's contract.
        let ctx = unsafe { ContextBlock::from_ptr(context) }?;
        // The rule (which PDs exist) is the device's; its only refusal is an unknown PD,
        // which for an import is the kernel's ENOENT (the create verbs' EINVAL otherwise).
        ctx.entry
            .device
            .query_pd(pd_handle)
            .map_err(|_| libc::ENOENT)?;
        Ok(PdBlock::allocate(
            ibv_pd {
                context,
                handle: pd_handle,
            },
            PdState::default(),
        ))
    })
}
symver!(ibv_import_pd, "IBVERBS_1.10");

/// `ibv_unimport_pd(3)`: frees the struct only; the PD stays, for the other structs that
/// name it. Nothing for NULL, a pointer not ours, or a parent domain (which is not
/// imported: `ibv_dealloc_pd` frees it; mlx5 refuses it too).
///
/// # Safety
///
/// `pd` is NULL or a live PD, not used again after this call (objects created through
/// it keep working: they are the PD's).
pub unsafe extern "C" fn ibv_unimport_pd(pd: *mut ibv_pd) {
    crate::boundary::infallible((), || {
        // SAFETY: this function's contract.
        if let Ok(state) = unsafe { PdBlock::state(pd) } {
            if state.domain.is_none() {
                // SAFETY: live (checked above); the caller gives the struct up. No state
                // of ours points at a PD block: objects hold the PD by handle in the
                // device, and their `PdUse` never reads the pointer it keeps.
                unsafe { PdBlock::free(pd) };
            }
        }
    })
}
symver!(ibv_unimport_pd, "IBVERBS_1.10");

/// An object's link to its PD: the PD outlives it because the device refuses
/// `ibv_dealloc_pd` while the object exists ([`softverbs::core::device::Device::dealloc_pd`]).
/// The pointer is kept for debugging only and never read: the struct it points at may be
/// an imported one that `ibv_unimport_pd` frees while the PD lives on. Through a parent
/// domain it also holds that block (`ibv_dealloc_pd` of the parent domain refuses while
/// it exists; parent domains are never unimported).
pub struct PdUse {
    _pd: *mut ibv_pd,
    _domain: Option<DomainHold>,
}

impl std::fmt::Debug for PdUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PdUse")
            .field("pd", &self._pd)
            .field("through_parent_domain", &self._domain.is_some())
            .finish()
    }
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
        let state = unsafe { PdBlock::state(pd) }?;
        let hold = PdUse {
            _pd: pd,
            _domain: state.domain.as_ref().map(DomainHold::new),
        };
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
