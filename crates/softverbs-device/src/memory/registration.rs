//! Registration checks: what a range must pass before the table records it, the checks
//! the kernel's `ib_umem_get` makes when it pins the pages, each refusal a cause the front
//! doors report with the kernel's errno. The access flags are consistent (`EINVAL`), the range is
//! non-empty and does not wrap (`EINVAL`), the process's pinned pages stay within
//! `RLIMIT_MEMLOCK` unless the thread has `CAP_IPC_LOCK` (`ENOMEM`; `EPERM` for a zero
//! limit), and every page is mapped (`EFAULT`), writable when the region asks for write
//! access (`EFAULT`). A refused registration leaves nothing charged.
//!
//! An on-demand paging region (`IBV_ACCESS_ON_DEMAND`) is what the kernel's
//! `ib_umem_odp_get` makes instead: nothing is pinned, charged or required to be mapped,
//! so only the range itself is checked — non-empty (`EINVAL`), its end not past the
//! address space (`ib_init_umem_odp`: `EOVERFLOW`) — or it is the implicit region of the
//! whole address space (`ibv_reg_mr(3)`: address 0, length `SIZE_MAX`), which takes an
//! iova of 0 only (rxe's `rxe_odp_mr_init_user` and mlx5's `mlx5_ib_reg_user_mr`:
//! `EINVAL`). Without `IBV_ACCESS_ON_DEMAND` that range wraps, and is refused as any
//! wrapping range (`EINVAL`).

use crate::mappings::{self, MappingError, MemlockError, Pinned};
use softverbs_proto::AccessFlags;

/// Why a registration was refused, one variant per cause; each names the errno rdma-core's
/// `ibv_reg_mr` reports for the same cause on a kernel device.
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
pub enum RegisterError {
    /// `ibv_reg_mr(3)`: remote write or remote atomic access requires local write.
    #[error("REMOTE_WRITE or REMOTE_ATOMIC access requires LOCAL_WRITE")]
    MissingLocalWrite,
    /// A zero-length range (`ib_umem_get`: `EINVAL`).
    #[error("a memory region needs at least one byte")]
    ZeroLength,
    /// A range (or remote address range) that wraps around the address space, or more
    /// than `u32::MAX` pages (`EINVAL`).
    #[error("invalid memory range")]
    BadRange,
    /// A page of the range is not mapped, or is not memory that can be pinned
    /// (`get_user_pages`: `EFAULT`).
    #[error("address {addr:#x} of the range is not mapped")]
    Unmapped {
        /// A byte of the range in the first page that is not mapped.
        addr: usize,
    },
    /// A page of the range is mapped without read permission (`EFAULT`).
    #[error("address {addr:#x} of the range is not readable")]
    NotReadable {
        /// A byte of the range in the first such page.
        addr: usize,
    },
    /// The region asks for write access (`LOCAL_WRITE`, `REMOTE_WRITE`, `REMOTE_ATOMIC`
    /// or `MW_BIND`, with which the kernel pins with `FOLL_WRITE`) and a page of the range
    /// is mapped without write permission (`EFAULT`).
    #[error("address {addr:#x} of the range is not writable, and write access was asked")]
    NotWritable {
        /// A byte of the range in the first such page.
        addr: usize,
    },
    /// Pinning the range would take the process's registered pages past the soft
    /// `RLIMIT_MEMLOCK`, and the thread lacks `CAP_IPC_LOCK` (`ENOMEM`).
    #[error(
        "registering {requested} bytes with {pinned} already registered exceeds \
         RLIMIT_MEMLOCK ({limit} bytes)"
    )]
    OverMemlock {
        /// Bytes of whole pages the region would pin.
        requested: u64,
        /// Bytes the process's registrations already pin.
        pinned: u64,
        /// The soft `RLIMIT_MEMLOCK` in bytes.
        limit: u64,
    },
    /// `RLIMIT_MEMLOCK` is 0 and the thread lacks `CAP_IPC_LOCK`: the process may not pin
    /// memory at all (`can_do_mlock`: `EPERM`).
    #[error("RLIMIT_MEMLOCK is 0: the process may not pin memory")]
    MemlockNotPermitted,
    /// The operating system gave no randomness for a key.
    #[error("no randomness for a memory key")]
    NoRandomness,
    /// `ibv_rereg_mr(3)` asked to change nothing (no flag; libibverbs and the kernel's
    /// `ib_uverbs_rereg_mr` refuse it with `EINVAL`).
    #[error("a re-registration must change the translation, the PD or the access")]
    NothingToChange,
    /// `ibv_rereg_mr(3)` with `IBV_REREG_MR_CHANGE_TRANSLATION` and a NULL address or a
    /// zero length (libibverbs refuses it, `EINVAL`, before the kernel sees it).
    #[error("a new translation needs a non-NULL address and a non-zero length")]
    EmptyTranslation,
    /// An on-demand paging range whose end, rounded up to a page, is past the end of the
    /// address space (the kernel's `ib_init_umem_odp`: `EOVERFLOW`).
    #[error("the on-demand range ends past the end of the address space")]
    Overflow,
    /// The implicit on-demand region (address 0, length `SIZE_MAX`) with an iova other
    /// than 0 (rxe's `rxe_odp_mr_init_user`, mlx5's `mlx5_ib_reg_user_mr`: `EINVAL`).
    #[error("the implicit on-demand region takes iova 0 only")]
    ImplicitIova,
    /// `IBV_ACCESS_ON_DEMAND` where the device's accesses are not fault tolerant (targets
    /// other than x86-64, [`crate::guarded`]): an access to a page not mapped would kill
    /// the process, so on-demand paging is not offered (`odp_caps` reports none), and
    /// refused as a kernel without `CONFIG_INFINIBAND_ON_DEMAND_PAGING` refuses it
    /// (`ib_check_mr_access`: `EOPNOTSUPP`).
    #[error("on-demand paging is not supported on this target")]
    OnDemandUnsupported,
    /// `ibv_advise_mr(3)` refused.
    #[error(transparent)]
    Advice(#[from] super::advice::AdviseError),
}

impl From<MappingError> for RegisterError {
    fn from(e: MappingError) -> Self {
        match e {
            MappingError::Unmapped { addr } => RegisterError::Unmapped { addr },
            MappingError::NotPermitted { addr, write: true } => RegisterError::NotWritable { addr },
            MappingError::NotPermitted { addr, write: false } => {
                RegisterError::NotReadable { addr }
            }
        }
    }
}

impl From<MemlockError> for RegisterError {
    fn from(e: MemlockError) -> Self {
        match e {
            MemlockError::NotPermitted => RegisterError::MemlockNotPermitted,
            MemlockError::OverLimit {
                requested,
                pinned,
                limit,
            } => RegisterError::OverMemlock {
                requested,
                pinned,
                limit,
            },
        }
    }
}

/// Checks a registration of `[addr, addr + len)` with `access`, remote peers naming its
/// first byte `iova`, as [`MemoryTable::register`](super::MemoryTable::register)
/// documents, and charges its pages to the process's pinned count. Returns the charge,
/// for the caller to release ([`mappings::release_pages`]) when the region goes; a refusal
/// charges nothing.
pub(super) fn check_registration(
    addr: usize,
    len: u64,
    iova: u64,
    access: AccessFlags,
) -> Result<Pinned, RegisterError> {
    if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
        && !access.contains(AccessFlags::LOCAL_WRITE)
    {
        return Err(RegisterError::MissingLocalWrite);
    }
    if access.contains(AccessFlags::ON_DEMAND) {
        check_on_demand(addr, len, iova)?;
        return Ok(Pinned::default());
    }
    if len == 0 {
        return Err(RegisterError::ZeroLength);
    }
    let page = mappings::page_size();
    let size = usize::try_from(len).map_err(|_| RegisterError::BadRange)?;
    let end = addr
        .checked_add(size)
        .and_then(|end| end.checked_next_multiple_of(page))
        .ok_or(RegisterError::BadRange)?;
    if iova.checked_add(len).is_none() || (end - addr / page * page) / page > u32::MAX as usize {
        return Err(RegisterError::BadRange);
    }
    // The kernel (ib_umem_get) charges the pages to RLIMIT_MEMLOCK before it pins
    // them: over the limit is ENOMEM even when the pages are not there.
    let pinned = mappings::reserve_pages(addr, size)?;
    if let Err(e) = mappings::check_mapped(addr, size, asks_writing(access)) {
        mappings::release_pages(pinned);
        return Err(e.into());
    }
    Ok(pinned)
}

/// Whether `[addr, addr + len)` is the implicit on-demand region: the whole address
/// space (`ibv_reg_mr(3)`: "addr should be 0 and length should be SIZE_MAX").
pub fn is_implicit(addr: usize, len: u64) -> bool {
    addr == 0 && len == usize::MAX as u64
}

/// The range checks of an on-demand paging registration (the kernel's `ib_umem_odp_get`
/// and `ib_init_umem_odp`): nothing about the pages, which need not be mapped.
fn check_on_demand(addr: usize, len: u64, iova: u64) -> Result<(), RegisterError> {
    if !super::ON_DEMAND_PAGING {
        return Err(RegisterError::OnDemandUnsupported);
    }
    if is_implicit(addr, len) {
        return if iova == 0 {
            Ok(())
        } else {
            Err(RegisterError::ImplicitIova)
        };
    }
    if len == 0 {
        return Err(RegisterError::ZeroLength);
    }
    let size = usize::try_from(len).map_err(|_| RegisterError::Overflow)?;
    addr.checked_add(size)
        .and_then(|end| end.checked_next_multiple_of(mappings::page_size()))
        .ok_or(RegisterError::Overflow)?;
    if iova.checked_add(len).is_none() {
        return Err(RegisterError::BadRange);
    }
    Ok(())
}

/// Whether a region with `access` is pinned for writing (the kernel's `FOLL_WRITE`), so
/// every page must be writable.
pub(super) fn asks_writing(access: AccessFlags) -> bool {
    access.intersects(
        AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_ATOMIC
            | AccessFlags::MW_BIND,
    )
}

/// Checks new access rights for the pages a region already holds (a re-registration
/// that keeps the translation): consistent (`EINVAL`), and every page still mapped,
/// writable when the new rights write (`EFAULT`), as a registration of the same range
/// with those rights would be checked. Charges nothing: the pages are charged already.
pub(super) fn check_new_access(
    addr: usize,
    len: u64,
    access: AccessFlags,
) -> Result<(), RegisterError> {
    if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
        && !access.contains(AccessFlags::LOCAL_WRITE)
    {
        return Err(RegisterError::MissingLocalWrite);
    }
    if access.contains(AccessFlags::ON_DEMAND) {
        // Nothing is pinned: the pages are looked at when an access reaches them.
        return Ok(());
    }
    let size = usize::try_from(len).map_err(|_| RegisterError::BadRange)?;
    mappings::check_mapped(addr, size, asks_writing(access))?;
    Ok(())
}
