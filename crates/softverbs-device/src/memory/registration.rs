//! Registration checks: what a range must pass before the table records it, the checks
//! the kernel's `ib_umem_get` makes when it pins the pages, each refusal a cause the front
//! doors report with the kernel's errno. The access flags are consistent (`EINVAL`), the range is
//! non-empty and does not wrap (`EINVAL`), the process's pinned pages stay within
//! `RLIMIT_MEMLOCK` unless the thread has `CAP_IPC_LOCK` (`ENOMEM`; `EPERM` for a zero
//! limit), and every page is mapped (`EFAULT`), writable when the region asks for write
//! access (`EFAULT`). A refused registration leaves nothing charged.

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

/// Whether a region with `access` is pinned for writing (the kernel's `FOLL_WRITE`), so
/// every page must be writable.
fn asks_writing(access: AccessFlags) -> bool {
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
    let size = usize::try_from(len).map_err(|_| RegisterError::BadRange)?;
    mappings::check_mapped(addr, size, asks_writing(access))?;
    Ok(())
}
