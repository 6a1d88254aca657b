//! Memory regions and memory windows.
//!
//! | function | version | status |
//! |---|---|---|
//! | `ibv_reg_mr`, `ibv_dereg_mr` | 1.1 | real |
//! | `ibv_reg_mr_iova` | 1.7 | real |
//! | `ibv_reg_mr_iova2` | 1.8 | real (perftest's registration path: remote peers address the region by `iova`) |
//! | `ibv_rereg_mr` | 1.1 | real: every flag (`CHANGE_TRANSLATION`, `CHANGE_PD`, `CHANGE_ACCESS`), keys kept |
//! | `ibv_reg_dmabuf_mr` | 1.12 | documented failure (no dma-buf) |
//! | `ibv_advise_mr` (`verbs_context.advise_mr`) | (inline) | real: the prefetches of on-demand paging regions |
//! | `ibv_import_mr`, `ibv_unimport_mr` | 1.10 | real: a new struct for a registration named by its `handle` (the lkey; `ENOENT` if none), `addr` / `length` / keys from the registration; unimport frees the struct only |
//! | `ops.alloc_mw`, `ops.dealloc_mw` | (ops) | real: type 1 and type 2 windows (`ibv_alloc_mw(3)`) |
//! | `ops.bind_mw` | (ops) | real: `ibv_bind_mw(3)` posts the bind of a type 1 window on the QP's send queue |
//!
//! Memory windows: a window is allocated unbound; `ibv_bind_mw` (type 1) or
//! `IBV_WR_BIND_MW` / `ibv_wr_bind_mw` (type 2) binds it to a range of a region registered
//! with `IBV_ACCESS_MW_BIND`, and its R_Key then reaches that range with the window's own
//! remote rights; `IBV_WR_LOCAL_INV` or a peer's SEND WITH INVALIDATE invalidates a type 2
//! window. The rules (and their completion statuses, `IBV_WC_MW_BIND_ERR` for a refused
//! bind) are the core's (`softverbs::core::engine::check_bind`); here `mw->rkey` takes the
//! window's new R_Key when a bind is posted, as rxe's provider sets it. A zero-based window
//! (`IBV_ACCESS_ZERO_BASED`) is refused with `EINVAL`, as rxe's provider refuses it.
//!
//! Re-registration (`ibv_rereg_mr(3)`) is the core's
//! (`softverbs::core::device::Device::rereg_mr`): the changes happen at once under the
//! device's lock, the lkey and rkey stay (rxe keeps them for a PD or access change; a
//! translation change keeps them too, as mlx5 does where it can), and a refusal changes
//! nothing. Here only its return codes: `IBV_REREG_MR_ERR_INPUT` for what libibverbs
//! refuses before the kernel (no flag, an unknown flag, a translation with a NULL address
//! or zero length, a bad MR or PD pointer) and for a region with a memory window bound;
//! `IBV_REREG_MR_ERR_CMD` for what the kernel would refuse (the new range not mapped or
//! not writable, `RLIMIT_MEMLOCK`, access flags), each with the core's errno. Unlike a
//! kernel device after `IBV_REREG_MR_ERR_CMD`, the region stays registered as it was.
//! `IBV_REREG_MR_ERR_DONT_FORK_NEW`, `_DO_FORK_OLD` and `_CMD_AND_DO_FORK_NEW` never
//! arise: `ibv_dontfork_range` and `ibv_dofork_range` have nothing to protect here.
//!
//! Access flags: `LOCAL_WRITE`, `REMOTE_WRITE`, `REMOTE_READ`, `REMOTE_ATOMIC`, `MW_BIND` are
//! enforced; `HUGETLB` is accepted (huge pages are only a hint); the optional range (`IBV_ACCESS_OPTIONAL_RANGE`, e.g. `RELAXED_ORDERING`) is
//! ignored, as libibverbs drops optional flags a device does not support; `ZERO_BASED`
//! fails with `EOPNOTSUPP`.
//!
//! On-demand paging (`IBV_ACCESS_ON_DEMAND`, x86-64; `ibv_query_device_ex(3)` reports it in
//! `odp_caps`): the range need not be mapped, nothing is pinned or charged to
//! `RLIMIT_MEMLOCK`, and the implicit region (`addr` NULL, `length` `SIZE_MAX`) is the
//! whole address space. An access to a page not mapped at its time fails as rxe fails an
//! ODP page fault it cannot resolve (`IBV_WC_REM_ACCESS_ERR` at the requester of a remote
//! access, `IBV_WC_LOC_PROT_ERR` for a local scatter/gather entry) and the region stays
//! usable. The rules are the core's (`softverbs::core::device::memory`); `ibv_advise_mr`
//! translates the call and returns the core's errno.
//!
//! Registration checks what a kernel device checks when it pins the pages
//! (`softverbs::core::device::memory`), and fails with the errno rdma-core reports there: `EINVAL`
//! for length 0, `EFAULT` for a page of the range that is not mapped (NULL included), or is
//! mapped read-only while the access asks for writing (`LOCAL_WRITE`, `REMOTE_WRITE`,
//! `REMOTE_ATOMIC`, `MW_BIND`), `ENOMEM` past `RLIMIT_MEMLOCK` without `CAP_IPC_LOCK`.
//!
//! The device reads and writes registered memory with fault-tolerant copies and atomics
//! (`softverbs::core::device::guarded`) that never touch a byte outside the range: memory the
//! application unmaps or frees while it is registered (which `ibv_reg_mr(3)` forbids) makes
//! the access fail — a peer's request gets a remote access error NAK (its completion
//! `IBV_WC_REM_ACCESS_ERR`), a local work request `IBV_WC_LOC_PROT_ERR` — instead of
//! killing the process with `SIGSEGV` (x86-64). The device installs a `SIGSEGV`/`SIGBUS`
//! handler for that, which passes every other fault on to the handler installed before it
//! (or to the default action).

use crate::abi::*;
use crate::boundary::{errno_code, errno_of, infallible, pointer, set_errno, Errno};
use crate::handles::{Block, ContextBlock, Tagged};
use crate::pd::{PdParent, PdUse};
use crate::qp::{QpBlock, SEND_FLAGS_KNOWN};
use crate::verbs_h::{IBV_ACCESS_HUGETLB, IBV_ACCESS_OPTIONAL_RANGE, IBV_ACCESS_ZERO_BASED};
use softverbs::core::device::memory::Advice;
use softverbs::core::device::Rereg;
use softverbs::core::engine::{
    AccessFlags, Gather, SendFlags, SendOp, SendWr, SgeList, WindowBind, WindowType,
};
use std::ffi::{c_int, c_void};

/// The library's part of a memory region.
pub struct MrState {
    /// The device's local key (what deregistration names).
    lkey: u32,
    /// The context (for its device).
    context: *mut ibv_context,
    _pd: PdUse,
}

impl Tagged for MrState {
    const MAGIC: u64 = u64::from_be_bytes(*b"svmr\0\0\0\x01");
}

/// A memory region as C sees it, followed by its state.
pub type MrBlock = Block<ibv_mr, MrState>;

fn access_flags(access: u32) -> Result<AccessFlags, Errno> {
    let access = access & !IBV_ACCESS_OPTIONAL_RANGE;
    if access & IBV_ACCESS_ZERO_BASED != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    let known = AccessFlags::all().bits() | IBV_ACCESS_HUGETLB;
    if access & !known != 0 {
        return Err(libc::EINVAL);
    }
    Ok(AccessFlags::from_bits_truncate(access))
}

/// Registers `[addr, addr + length)` with remote address `iova`.
///
/// # Safety
///
/// `pd` is NULL or a live PD; the range is memory of this process that stays mapped until
/// the region is deregistered (the `ibv_reg_mr(3)` contract).
unsafe fn register(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> Result<*mut ibv_mr, Errno> {
    // SAFETY: `pd` is NULL or a live PD (this function's `# Safety`).
    let PdParent {
        hold,
        context,
        ctx,
        handle,
    } = unsafe { PdUse::acquire(pd) }?;
    let flags = access_flags(access)?;
    // A NULL address is an unmapped page (EFAULT), length 0 is EINVAL: the device checks
    // both, as the kernel's ib_umem_get does.
    // SAFETY: the range is this process's memory and stays mapped until `ibv_dereg_mr`
    // (this function's `# Safety`), which is what `reg_mr` asks.
    let region = unsafe {
        ctx.entry
            .device
            .reg_mr(handle, addr as usize, length as u64, iova, flags)
    }
    .map_err(errno_of)?;
    let mr = ibv_mr {
        context,
        pd,
        addr,
        length,
        handle: region.lkey,
        lkey: region.lkey,
        rkey: region.rkey,
    };
    Ok(MrBlock::allocate(
        mr,
        MrState {
            lkey: region.lkey,
            context,
            _pd: hold,
        },
    ))
}

/// `ibv_reg_mr(3)`: remote peers address the region by its virtual address. `NULL` with
/// errno: `EINVAL` (bad PD, flags, length 0, remote write/atomic without local write, the
/// whole address space without `IBV_ACCESS_ON_DEMAND` or with an iova), `EFAULT` (a page
/// not mapped, or not writable when write access is asked; not for on-demand paging),
/// `ENOMEM` (past `RLIMIT_MEMLOCK`; not for on-demand paging), `EOVERFLOW` (an on-demand
/// range past the end of the address space), `EOPNOTSUPP` (zero-based).
///
/// # Safety
///
/// As `ibv_reg_mr(3)`: `pd` is NULL or live; the range stays mapped until deregistered.
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: `pd` is NULL or a live PD and the range stays mapped until deregistered
    // (this function's `# Safety`), which is all `register` asks.
    pointer(|| unsafe { register(pd, addr, length, addr as u64, access as u32) })
}
symver!(ibv_reg_mr, "IBVERBS_1.1");

/// `ibv_reg_mr_iova(3)`.
///
/// # Safety
///
/// As [`ibv_reg_mr`].
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: `pd` is NULL or a live PD and the range stays mapped until deregistered
    // (this function's `# Safety`), which is all `register` asks.
    pointer(|| unsafe { register(pd, addr, length, iova, access as u32) })
}
symver!(ibv_reg_mr_iova, "IBVERBS_1.7");

/// `ibv_reg_mr_iova2` (`ibv_reg_mr(3)`).
///
/// # Safety
///
/// As [`ibv_reg_mr`].
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    // SAFETY: `pd` is NULL or a live PD and the range stays mapped until deregistered
    // (this function's `# Safety`), which is all `register` asks.
    pointer(|| unsafe { register(pd, addr, length, iova, access) })
}
symver!(ibv_reg_mr_iova2, "IBVERBS_1.8");

/// `ibv_dereg_mr(3)`: 0, or `EINVAL` for a pointer that is not a live region. After it
/// returns the device never touches the memory again.
///
/// # Safety
///
/// `mr` is NULL or a live region, not used again after a successful call.
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    errno_code(|| {
        // SAFETY: `mr` is NULL or a live MR (this function's `# Safety`).
        let state = unsafe { MrBlock::state(mr) }?;
        // SAFETY: `state.context` is the context of the region's PD, saved at
        // registration; it is open while the region lives (libibverbs requires a
        // context's objects to be destroyed before `ibv_close_device`).
        let ctx = unsafe { ContextBlock::from_ptr(state.context) }?;
        ctx.entry.device.dereg_mr(state.lkey).map_err(errno_of)?;
        // SAFETY: `mr` passed `state` above, `state` is not used again, and the caller
        // gives the region up with this call.
        unsafe { MrBlock::free(mr) };
        Ok(())
    })
}
symver!(ibv_dereg_mr, "IBVERBS_1.1");

/// `verbs_context.advise_mr` (`ibv_advise_mr(3)`, a `verbs.h` inline): 0, or the errno
/// (also in `errno`) of the core's refusal, in the kernel's order: `EINVAL` (a bad PD,
/// flags other than `IBV_ADVISE_MR_FLAG_FLUSH`), 0 for an empty list, `EOPNOTSUPP` (an
/// advice other than the three prefetches), then per entry `ENOENT` (an lkey of no
/// on-demand region), `EPERM` (a region of another PD; `PREFETCH_WRITE` on a region not
/// registered for writing) and, with `IBV_ADVISE_MR_FLAG_FLUSH`, `EFAULT` (the range
/// outside the region, or a page that cannot be mapped). A NULL list with entries is
/// `EFAULT`, as the kernel's copy of the list from user memory fails.
///
/// # Safety
///
/// `pd` is NULL or a live PD; `sg_list` is NULL or readable for `num_sge` entries.
pub unsafe extern "C" fn advise_mr(
    pd: *mut ibv_pd,
    advice: u32,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sge: u32,
) -> c_int {
    errno_code(|| {
        // SAFETY: `pd` is NULL or a live PD (this function's `# Safety`).
        let parent = unsafe { PdUse::acquire(pd) }?;
        if num_sge > 0 && sg_list.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: `num_sge` entries are readable (this function's `# Safety`; not NULL,
        // checked above).
        let sges = unsafe { crate::wr::read_sges(sg_list, num_sge as usize) };
        parent
            .ctx
            .entry
            .device
            .advise_mr(parent.handle, Advice::from_raw(advice), flags, &sges)
            .map_err(errno_of)
    })
}

unsupported! {
    /// `ibv_reg_dmabuf_mr(3)`.
    null "IBVERBS_1.12" fn ibv_reg_dmabuf_mr(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr
}
/// `enum ibv_rereg_mr_flags` (`verbs.h`).
pub const IBV_REREG_MR_CHANGE_TRANSLATION: c_int = 1 << 0;
/// `enum ibv_rereg_mr_flags`.
pub const IBV_REREG_MR_CHANGE_PD: c_int = 1 << 1;
/// `enum ibv_rereg_mr_flags`.
pub const IBV_REREG_MR_CHANGE_ACCESS: c_int = 1 << 2;
/// `IBV_REREG_MR_FLAGS_SUPPORTED`.
pub const IBV_REREG_MR_FLAGS_SUPPORTED: c_int = (IBV_REREG_MR_CHANGE_ACCESS << 1) - 1;
/// `enum ibv_rereg_mr_err_code`: the old MR is valid, an input error was detected.
pub const IBV_REREG_MR_ERR_INPUT: c_int = -1;
/// `enum ibv_rereg_mr_err_code`: the command failed.
pub const IBV_REREG_MR_ERR_CMD: c_int = -4;

/// A refused re-registration: its `enum ibv_rereg_mr_err_code` and errno.
struct ReregRefusal {
    code: c_int,
    errno: Errno,
}

impl ReregRefusal {
    fn input(errno: Errno) -> Self {
        ReregRefusal {
            code: IBV_REREG_MR_ERR_INPUT,
            errno,
        }
    }

    /// A refusal of the core: the input checks libibverbs makes before the kernel (and a
    /// window bound, which the region's user must undo first) are `ERR_INPUT`, the
    /// rest the kernel command's (`ERR_CMD`).
    fn of(e: softverbs::core::Error) -> Self {
        use softverbs::core::device::RegisterError;
        use softverbs::core::engine::{Object, VerbsError};
        use softverbs::core::Error;
        let input = matches!(
            e,
            Error::Register(RegisterError::NothingToChange | RegisterError::EmptyTranslation)
                | Error::Verbs(VerbsError::InUse {
                    object: Object::Mr,
                    ..
                })
        );
        ReregRefusal {
            code: if input {
                IBV_REREG_MR_ERR_INPUT
            } else {
                IBV_REREG_MR_ERR_CMD
            },
            errno: e.errno(),
        }
    }
}

/// The re-registration of `ibv_rereg_mr`.
///
/// # Safety
///
/// As [`ibv_rereg_mr`].
unsafe fn rereg(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> Result<(), ReregRefusal> {
    // SAFETY: `mr` is NULL or a live MR (this function's `# Safety`).
    let state = unsafe { MrBlock::state(mr) }.map_err(ReregRefusal::input)?;
    if flags & !IBV_REREG_MR_FLAGS_SUPPORTED != 0 {
        return Err(ReregRefusal::input(libc::EINVAL));
    }
    // SAFETY: the context of a live region is open (libibverbs requires a context's
    // objects to be destroyed before `ibv_close_device`).
    let ctx = unsafe { ContextBlock::from_ptr(state.context) }.map_err(ReregRefusal::input)?;
    let new_pd = if flags & IBV_REREG_MR_CHANGE_PD != 0 {
        // SAFETY: `pd` is NULL or a live PD (this function's `# Safety`).
        let parent = unsafe { PdUse::acquire(pd) }.map_err(ReregRefusal::input)?;
        if parent.context != state.context {
            return Err(ReregRefusal::input(libc::EINVAL));
        }
        Some(parent.handle)
    } else {
        None
    };
    let new_access = if flags & IBV_REREG_MR_CHANGE_ACCESS != 0 {
        Some(access_flags(access as u32).map_err(|errno| ReregRefusal {
            code: IBV_REREG_MR_ERR_CMD,
            errno,
        })?)
    } else {
        None
    };
    let translation = (flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0).then_some((
        addr as usize,
        length as u64,
        addr as u64,
    ));
    let change = Rereg {
        translation,
        pd: new_pd,
        access: new_access,
    };
    // SAFETY: a new range is memory of this process that stays mapped until the region
    // is deregistered (this function's `# Safety`), which is what `rereg_mr` asks.
    let region = unsafe { ctx.entry.device.rereg_mr(state.lkey, change) }
        .map_err(|e| ReregRefusal::of(e.into()))?;
    // SAFETY: `mr` passed `state`: a live region whose C fields libibverbs updates after
    // a re-registration (rdma-core's `ibv_rereg_mr` sets `pd`, `addr` and `length`), read
    // by C only between verbs. The PD hold is the device's count, which `rereg_mr` moved
    // to the new PD; `state._pd` only records the registration's.
    unsafe {
        if new_pd.is_some() {
            (&raw mut (*mr).pd).write(pd);
        }
        if translation.is_some() {
            (&raw mut (*mr).addr).write(addr);
            (&raw mut (*mr).length).write(length);
        }
        (&raw mut (*mr).lkey).write(region.lkey);
        (&raw mut (*mr).rkey).write(region.rkey);
    }
    Ok(())
}

/// `ibv_rereg_mr(3)`: changes the region's translation (`IBV_REREG_MR_CHANGE_TRANSLATION`:
/// `addr`, `length`, registered as `ibv_reg_mr` registers), PD (`IBV_REREG_MR_CHANGE_PD`)
/// and access (`IBV_REREG_MR_CHANGE_ACCESS`), keeping `lkey` and `rkey`. 0, or an
/// `enum ibv_rereg_mr_err_code` with errno set: `IBV_REREG_MR_ERR_INPUT` (`EINVAL`: no
/// flag, an unknown flag, a NULL address or zero length with a new translation, a bad
/// MR or PD, a memory window bound to the region), `IBV_REREG_MR_ERR_CMD` (the errno
/// `ibv_reg_mr` gives for the same range and access: `EFAULT`, `ENOMEM`, `EPERM`,
/// `EINVAL`, `EOPNOTSUPP`). A refused call leaves the region as it was.
///
/// # Safety
///
/// As `ibv_rereg_mr(3)`: `mr` is NULL or live, `pd` NULL or live; with a new translation
/// the new range stays mapped until the region is deregistered, and the old range is
/// the application's again once the call returns 0.
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    let panicked = Err(ReregRefusal {
        code: IBV_REREG_MR_ERR_CMD,
        errno: crate::boundary::PANIC_ERRNO,
    });
    // SAFETY: forwarded contract (this function's `# Safety`).
    match infallible(panicked, || unsafe {
        rereg(mr, flags, pd, addr, length, access)
    }) {
        Ok(()) => 0,
        Err(refusal) => {
            set_errno(refusal.errno);
            refusal.code
        }
    }
}
symver!(ibv_rereg_mr, "IBVERBS_1.1");

/// `ibv_import_mr(3)`: a new `struct ibv_mr` in `pd` for the registration whose handle is
/// `mr_handle` (another struct's `handle`; ours is the lkey), filled from the
/// registration as it is now: `addr` (the address it was registered at; rdma-core's
/// import leaves `addr` NULL because the kernel's `QUERY_MR` does not return it, while
/// here the registration is this process's and the address is known), `length`, `lkey`,
/// `rkey`, `handle`. `ibv_dereg_mr` of either struct deregisters the region.
/// `NULL` with `ENOENT` for a handle the device has no registration for (the kernel's
/// answer to an unknown object handle, `lookup_get_idr_uobject`), `EINVAL` for a `pd`
/// not ours or one the registration is not in (the kernel does not check this; a struct
/// whose `pd` is not the region's would mislead every later check, so it is refused).
///
/// # Safety
///
/// `pd` is NULL or a live PD.
pub unsafe extern "C" fn ibv_import_mr(pd: *mut ibv_pd, mr_handle: u32) -> *mut ibv_mr {
    pointer(|| {
        // SAFETY: this function's contract.
        let PdParent {
            hold,
            context,
            ctx,
            handle,
        } = unsafe { PdUse::acquire(pd) }?;
        // The rule (which registrations exist, and their keys) is the device's; its only
        // refusal is an unknown handle, which for an import is the kernel's ENOENT.
        let region = ctx
            .entry
            .device
            .query_mr(mr_handle)
            .map_err(|_| libc::ENOENT)?;
        if region.pd != handle {
            return Err(libc::EINVAL);
        }
        let mr = ibv_mr {
            context,
            pd,
            addr: region.addr as *mut c_void,
            length: usize::try_from(region.len).map_err(|_| libc::EINVAL)?,
            handle: region.lkey,
            lkey: region.lkey,
            rkey: region.rkey,
        };
        Ok(MrBlock::allocate(
            mr,
            MrState {
                lkey: region.lkey,
                context,
                _pd: hold,
            },
        ))
    })
}
symver!(ibv_import_mr, "IBVERBS_1.10");

/// `ibv_unimport_mr(3)`: frees the struct only; the registration stays. Nothing for NULL
/// or a pointer not ours.
///
/// # Safety
///
/// `mr` is NULL or a live MR, not used again after this call.
pub unsafe extern "C" fn ibv_unimport_mr(mr: *mut ibv_mr) {
    infallible((), || {
        // SAFETY: this function's contract.
        if unsafe { MrBlock::state(mr) }.is_ok() {
            // SAFETY: live (checked above); the caller gives the struct up, and no state
            // of ours points at an MR block.
            unsafe { MrBlock::free(mr) };
        }
    })
}
symver!(ibv_unimport_mr, "IBVERBS_1.10");

/// The library's part of a memory window.
pub struct MwState {
    /// The device's handle of the window (`mw->handle`).
    handle: u32,
    /// Its type.
    kind: WindowType,
    /// The context (for its device).
    context: *mut ibv_context,
    _pd: PdUse,
}

impl Tagged for MwState {
    const MAGIC: u64 = u64::from_be_bytes(*b"svmw\0\0\0\x01");
}

/// A memory window as C sees it, followed by its state.
pub type MwBlock = Block<ibv_mw, MwState>;

/// `ops.alloc_mw` (`ibv_alloc_mw(3)`): a window of `type_` (`IBV_MW_TYPE_1` or
/// `IBV_MW_TYPE_2`) in `pd`, unbound; `NULL` with errno `EINVAL` for a bad PD or type,
/// `ENOMEM` past `max_mw`.
///
/// # Safety
///
/// `pd` is NULL or a live PD.
pub unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, type_: u32) -> *mut ibv_mw {
    pointer(|| {
        // SAFETY: `pd` is NULL or a live PD (this function's `# Safety`).
        let PdParent {
            hold,
            context,
            ctx,
            handle,
        } = unsafe { PdUse::acquire(pd) }?;
        let kind = WindowType::from_raw(type_).ok_or(libc::EINVAL)?;
        let (mw_handle, rkey) = ctx.entry.device.alloc_mw(handle, kind).map_err(errno_of)?;
        let mw = ibv_mw {
            context,
            pd,
            rkey,
            handle: mw_handle,
            type_,
        };
        Ok(MwBlock::allocate(
            mw,
            MwState {
                handle: mw_handle,
                kind,
                context,
                _pd: hold,
            },
        ))
    })
}

/// `ops.dealloc_mw` (`ibv_dealloc_mw(3)`): 0, or `EINVAL` for a pointer that is not a live
/// window. A bound window is unbound: its R_Key is invalid from now on.
///
/// # Safety
///
/// `mw` is NULL or a live window, not used again after a successful call.
pub unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    errno_code(|| {
        // SAFETY: `mw` is NULL or a live window (this function's `# Safety`).
        let state = unsafe { MwBlock::state(mw) }?;
        // SAFETY: the context of a live window is open (libibverbs requires a context's
        // objects to be destroyed before `ibv_close_device`).
        let ctx = unsafe { ContextBlock::from_ptr(state.context) }?;
        ctx.entry
            .device
            .dealloc_mw(state.handle)
            .map_err(errno_of)?;
        // SAFETY: `mw` passed `state` above, `state` is not used again, and the caller
        // gives the window up with this call.
        unsafe { MwBlock::free(mw) };
        Ok(())
    })
}

/// The engine's bind of `mw` for `info`, asking for R_Key `new_rkey`, by the verb that
/// binds windows of type `kind`: `EINVAL` for a window or region pointer that is not live,
/// a window of another type (`ibv_bind_mw` takes type 1 only, `IBV_WR_BIND_MW` type 2
/// only), a NULL region with an address or length, or `IBV_ACCESS_ZERO_BASED`.
///
/// # Safety
///
/// `mw` and `info.mr` are NULL or live (the handle contract of [`crate::handles`]).
pub(crate) unsafe fn window_bind(
    mw: *mut ibv_mw,
    new_rkey: u32,
    info: &ibv_mw_bind_info,
    kind: WindowType,
) -> Result<WindowBind, Errno> {
    // SAFETY: `mw` is NULL or live (this function's `# Safety`).
    let state = unsafe { MwBlock::state(mw) }?;
    if state.kind != kind || info.mw_access_flags & IBV_ACCESS_ZERO_BASED != 0 {
        return Err(libc::EINVAL);
    }
    let mr_lkey = if info.mr.is_null() {
        if info.addr != 0 || info.length != 0 {
            return Err(libc::EINVAL);
        }
        0
    } else {
        // SAFETY: `info.mr` is live (this function's `# Safety`).
        unsafe { MrBlock::state(info.mr) }?.lkey
    };
    // SAFETY: `mw` passed `state`: a live window whose `rkey` the library keeps.
    let window_rkey = unsafe { (*mw).rkey };
    Ok(WindowBind {
        window_rkey,
        new_rkey,
        kind,
        mr_lkey,
        addr: info.addr,
        length: info.length,
        access: AccessFlags::from_bits_truncate(info.mw_access_flags),
    })
}

/// Gives `mw` the R_Key its posted bind asked for (`mw->rkey`, which names the window in
/// the next bind or invalidation the application posts).
///
/// # Safety
///
/// `mw` passed [`window_bind`] and is still live.
pub(crate) unsafe fn set_window_rkey(mw: *mut ibv_mw, bind: &WindowBind) {
    // SAFETY: a live window (this function's `# Safety`); C reads `rkey` only between
    // verbs on the same thread (libibverbs' rules for a window being bound).
    unsafe { (&raw mut (*mw).rkey).write(bind.bound_rkey()) };
}

/// `ops.bind_mw` (`ibv_bind_mw(3)`): posts the bind of a type 1 window on `qp`'s send
/// queue and sets `mw->rkey` to the window's next R_Key (`ibv_inc_rkey`); 0, or an errno
/// (`EINVAL` for a bad pointer, a type 2 window, flags or a bind `window_bind` refuses,
/// `ENOMEM` for a full send queue). The bind completes with `IBV_WC_BIND_MW`, or
/// `IBV_WC_MW_BIND_ERR` when a rule of the core refuses it.
///
/// # Safety
///
/// `qp`, `mw` and `mw_bind->bind_info.mr` are NULL or live; `mw_bind` is NULL or readable.
pub unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    mw_bind: *mut ibv_mw_bind,
) -> c_int {
    errno_code(|| {
        // SAFETY: `qp` is NULL or live (this function's `# Safety`).
        let state = unsafe { QpBlock::state(qp) }?;
        if mw_bind.is_null() || mw.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: `mw_bind` is readable (this function's `# Safety`; NULL checked).
        let request = unsafe { mw_bind.read() };
        if request.send_flags & !SEND_FLAGS_KNOWN != 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: `mw` is live (checked non-NULL; this function's `# Safety`).
        let rkey = unsafe { (&raw const (*mw).rkey).read() };
        let next = (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff);
        // SAFETY: `mw` and `bind_info.mr` are NULL or live (this function's `# Safety`).
        let bind = unsafe { window_bind(mw, next, &request.bind_info, WindowType::One) }?;
        let wr = SendWr {
            wr_id: request.wr_id,
            op: SendOp::BindMw(bind),
            gather: Gather::Sges(SgeList::new()),
            flags: SendFlags::from_bits_truncate(request.send_flags),
            ud: None,
        };
        state
            .entry
            .device
            .post_send(state.qpn, wr)
            .map_err(errno_of)?;
        // SAFETY: `mw` passed `window_bind` and is live.
        unsafe { set_window_rkey(mw, &bind) };
        Ok(())
    })
}
