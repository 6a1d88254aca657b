//! What registration checks about the process before it accepts a range, as the kernel's
//! `ib_umem_get` does when it pins the pages of an `ibv_reg_mr`: that every page of the
//! range is mapped with the access the region needs, and that the pages pinned by the
//! process's registrations stay within `RLIMIT_MEMLOCK`.
//!
//! * Mappings come from `/proc/self/maps` (sorted ranges with their `rwxp` permissions):
//!   every page of the range must be covered, readable, and writable too when the region
//!   asks for write access (`LOCAL_WRITE`, `REMOTE_WRITE`, `REMOTE_ATOMIC` or `MW_BIND`:
//!   the kernel then pins with `FOLL_WRITE`, `ib_access_writable`). The special mappings
//!   `get_user_pages` refuses (`[vvar]`, `[vsyscall]`, `VM_IO | VM_PFNMAP`) are refused as
//!   unmapped. When `/proc` cannot be read the check is skipped (the guarded copies keep a
//!   bad registration from crashing the process).
//! * Pinned memory is counted in pages, per process, across every device (one global
//!   atomic), like the kernel's `mm->pinned_vm`: a registration that would take it past the
//!   soft `RLIMIT_MEMLOCK` is refused, unless the limit is infinite or the calling thread
//!   has `CAP_IPC_LOCK` (bit 14 of `CapEff` in `/proc/thread-self/status`: capabilities
//!   are per thread, as the kernel's `capable()` check is). A zero limit without the
//!   capability refuses every registration (`can_do_mlock`).

use std::sync::atomic::{AtomicU64, Ordering};

/// Why a range cannot be pinned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MappingError {
    /// The page at `addr` is not mapped (or not memory `get_user_pages` can pin).
    Unmapped {
        /// The first byte (of the range) in that page.
        addr: usize,
    },
    /// The page at `addr` is mapped without the permission needed (readable; writable
    /// when writing).
    NotPermitted {
        /// The first byte (of the range) in that page.
        addr: usize,
        /// Whether write permission was the one missing.
        write: bool,
    },
}

/// The size of a page.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|s| s.is_power_of_two())
        .unwrap_or(4096)
}

/// One line of `/proc/self/maps`: `[start, end)`, readable, writable, and whether it is a
/// special mapping pinning refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mapping {
    start: usize,
    end: usize,
    read: bool,
    write: bool,
    special: bool,
}

fn parse_line(line: &str) -> Option<Mapping> {
    let mut fields = line.split_ascii_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?.as_bytes();
    if perms.len() < 2 {
        return None;
    }
    let name = fields.nth(3).unwrap_or("");
    Some(Mapping {
        start: usize::from_str_radix(start, 16).ok()?,
        end: usize::from_str_radix(end, 16).ok()?,
        read: perms[0] == b'r',
        write: perms[1] == b'w',
        special: matches!(name, "[vvar]" | "[vvar_vclock]" | "[vsyscall]"),
    })
}

/// Checks that every page of `[addr, addr + len)` is covered by the mappings listed in
/// `maps` (the text of `/proc/self/maps`: sorted, non-overlapping) with read permission,
/// or write permission if `write`. `len` is not zero and the range does not wrap.
fn check_in(maps: &str, addr: usize, len: usize, write: bool) -> Result<(), MappingError> {
    let end = addr.saturating_add(len);
    let mut cursor = addr;
    for mapping in maps.lines().filter_map(parse_line) {
        if mapping.end <= cursor {
            continue;
        }
        if mapping.start > cursor || mapping.special {
            return Err(MappingError::Unmapped { addr: cursor });
        }
        let permitted = if write { mapping.write } else { mapping.read };
        if !permitted {
            return Err(MappingError::NotPermitted {
                addr: cursor,
                write,
            });
        }
        cursor = mapping.end;
        if cursor >= end {
            return Ok(());
        }
    }
    Err(MappingError::Unmapped { addr: cursor })
}

/// Checks that every page of `[addr, addr + len)` (non-empty, not wrapping) is mapped with
/// read permission, or write permission if `write`, in this process now.
pub fn check_mapped(addr: usize, len: usize, write: bool) -> Result<(), MappingError> {
    match std::fs::read_to_string("/proc/self/maps") {
        Ok(maps) => check_in(&maps, addr, len, write),
        Err(error) => {
            tracing::debug!(%error, "no /proc/self/maps: registration skips the mapping check");
            Ok(())
        }
    }
}

/// Pages pinned by the registrations of every device of the process.
static PINNED_PAGES: AtomicU64 = AtomicU64::new(0);

/// Why pinning more pages was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemlockError {
    /// The soft `RLIMIT_MEMLOCK` is 0 and the thread lacks `CAP_IPC_LOCK`.
    NotPermitted,
    /// The pages would exceed the limit: `pinned` bytes already pinned, `requested` more,
    /// `limit` the soft limit in bytes.
    OverLimit {
        /// Bytes the registration would pin (whole pages).
        requested: u64,
        /// Bytes already pinned by the process's registrations.
        pinned: u64,
        /// The soft limit in bytes.
        limit: u64,
    },
}

/// A reservation of pinned pages, returned by [`release_pages`] when the region goes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pinned {
    pages: u64,
}

/// The soft `RLIMIT_MEMLOCK` in bytes, `None` if infinite (or unreadable).
fn memlock_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the valid `rlimit` it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0
        || limit.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    Some(limit.rlim_cur)
}

/// Whether the calling thread has `CAP_IPC_LOCK` in its effective set.
pub fn has_ipc_lock() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    let status = std::fs::read_to_string("/proc/thread-self/status")
        .or_else(|_| std::fs::read_to_string("/proc/self/status"));
    let Ok(status) = status else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// Reserves `pages` pages of size `page` in `counter` under `limit` (bytes, `None` for
/// infinite), exempt if `capable()` says so (asked only when the limit is in the way), as
/// the kernel's `ib_umem_get` does.
fn reserve_in(
    counter: &AtomicU64,
    pages: u64,
    page: u64,
    limit: Option<u64>,
    capable: impl Fn() -> bool,
) -> Result<Pinned, MemlockError> {
    if let Some(limit) = limit {
        if limit == 0 && !capable() {
            return Err(MemlockError::NotPermitted);
        }
        let before = counter.fetch_add(pages, Ordering::Relaxed);
        if before.saturating_add(pages) > limit / page && !capable() {
            counter.fetch_sub(pages, Ordering::Relaxed);
            return Err(MemlockError::OverLimit {
                requested: pages.saturating_mul(page),
                pinned: before.saturating_mul(page),
                limit,
            });
        }
    } else {
        counter.fetch_add(pages, Ordering::Relaxed);
    }
    Ok(Pinned { pages })
}

/// Reserves the pages of `[addr, addr + len)` against the process's `RLIMIT_MEMLOCK`.
pub fn reserve_pages(addr: usize, len: usize) -> Result<Pinned, MemlockError> {
    let page = page_size();
    let first = addr / page;
    let last = addr.saturating_add(len).div_ceil(page);
    let pages = (last - first) as u64;
    reserve_in(
        &PINNED_PAGES,
        pages,
        page as u64,
        memlock_limit(),
        has_ipc_lock,
    )
}

/// Gives back a reservation of [`reserve_pages`].
pub fn release_pages(pinned: Pinned) {
    PINNED_PAGES.fetch_sub(pinned.pages, Ordering::Relaxed);
}

/// Bytes currently pinned by the registrations of the process.
pub fn pinned_bytes() -> u64 {
    PINNED_PAGES
        .load(Ordering::Relaxed)
        .saturating_mul(page_size() as u64)
}

/// Test helper: an anonymous private mapping of `pages` pages with `protection`, placed
/// far below the kernel's usual mmap area (a distinct 16 MiB slot per call), so that once
/// a test unmaps it no other mapping of the (multi-threaded) test process lands at the
/// same address and turns an expected fault into a write into someone else's memory.
#[cfg(test)]
pub(crate) fn map_far(pages: usize, protection: libc::c_int) -> usize {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    for _ in 0..64 {
        let slot = NEXT.fetch_add(1, Ordering::Relaxed) as usize;
        let hint = 0x5000_0000_0000usize + slot * 0x100_0000;
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping.
        let p = unsafe {
            libc::mmap(
                hint as *mut libc::c_void,
                pages * 4096,
                protection,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p as usize == hint {
            return hint;
        }
    }
    panic!("no free address for a test mapping");
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
00400000-00401000 r--p 00000000 08:01 1234                       /usr/bin/x
00401000-00402000 r-xp 00001000 08:01 1234                       /usr/bin/x
00402000-00404000 rw-p 00000000 00:00 0                          [heap]
00500000-00501000 ---p 00000000 00:00 0
7ffd0000-7ffd2000 r--p 00000000 00:00 0                          [vvar]
";

    #[test]
    fn coverage_needs_every_page_mapped_with_the_permission_asked() {
        assert_eq!(check_in(MAPS, 0x400010, 0x3000, false), Ok(()));
        assert_eq!(
            check_in(MAPS, 0x400010, 0x3000, true),
            Err(MappingError::NotPermitted {
                addr: 0x400010,
                write: true
            })
        );
        assert_eq!(check_in(MAPS, 0x402000, 0x2000, true), Ok(()));
        assert_eq!(
            check_in(MAPS, 0x403000, 0x1001, false),
            Err(MappingError::Unmapped { addr: 0x404000 })
        );
        assert_eq!(
            check_in(MAPS, 0x500000, 1, false),
            Err(MappingError::NotPermitted {
                addr: 0x500000,
                write: false
            })
        );
        assert_eq!(
            check_in(MAPS, 0x7ffd0000, 8, false),
            Err(MappingError::Unmapped { addr: 0x7ffd0000 })
        );
        assert_eq!(
            check_in(MAPS, 0x10, 8, false),
            Err(MappingError::Unmapped { addr: 0x10 })
        );
        assert_eq!(
            check_in(MAPS, 0x900000, 8, false),
            Err(MappingError::Unmapped { addr: 0x900000 })
        );
        // Garbage lines are skipped, never a panic.
        assert_eq!(
            check_in("zz\n-\n1-2 r\n", 0x10, 8, false),
            Err(MappingError::Unmapped { addr: 0x10 })
        );
    }

    #[test]
    fn the_live_maps_cover_the_stack_and_refuse_a_freed_mapping() {
        let local = [0u8; 64];
        assert_eq!(check_mapped(local.as_ptr() as usize, 64, true), Ok(()));
        let page = page_size();
        let p = map_far(page.div_ceil(4096), libc::PROT_READ) as *mut libc::c_void;
        assert_eq!(check_mapped(p as usize, page, false), Ok(()));
        assert_eq!(
            check_mapped(p as usize, page, true),
            Err(MappingError::NotPermitted {
                addr: p as usize,
                write: true
            })
        );
        // SAFETY: our mapping.
        unsafe { libc::munmap(p, page) };
        assert_eq!(
            check_mapped(p as usize, page, false),
            Err(MappingError::Unmapped { addr: p as usize })
        );
    }

    #[test]
    fn memlock_counts_pages_refuses_past_the_limit_and_exempts_the_capable() {
        let counter = AtomicU64::new(0);
        let limit = Some(16 * 4096);
        let a = reserve_in(&counter, 10, 4096, limit, || false).unwrap();
        assert_eq!(
            reserve_in(&counter, 7, 4096, limit, || false),
            Err(MemlockError::OverLimit {
                requested: 7 * 4096,
                pinned: 10 * 4096,
                limit: 16 * 4096
            })
        );
        assert_eq!(
            counter.load(Ordering::Relaxed),
            10,
            "a refusal pins nothing"
        );
        let b = reserve_in(&counter, 6, 4096, limit, || false).unwrap();
        assert_eq!(counter.load(Ordering::Relaxed), 16);
        let c = reserve_in(&counter, 100, 4096, limit, || true).unwrap();
        let d = reserve_in(&counter, 100, 4096, None, || false).unwrap();
        assert_eq!(
            reserve_in(&counter, 1, 4096, Some(0), || false),
            Err(MemlockError::NotPermitted)
        );
        assert_eq!(a.pages + b.pages + c.pages + d.pages, 216);
    }
}
