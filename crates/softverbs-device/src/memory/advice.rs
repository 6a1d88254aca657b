//! `ibv_advise_mr(3)` on the table: the checks a prefetch passes, in the kernel's order and
//! with its errnos, and the prefetch itself — each page of the range touched through the
//! guarded accesses ([`crate::guarded`]), so a page that cannot be mapped is reported
//! (`EFAULT`) instead of killing the process.
//!
//! The order is the kernel's: `ib_uverbs_advise_mr` (`uverbs_std_types_mr.c`) checks the
//! flags (only `IBV_ADVISE_MR_FLAG_FLUSH`; else `EINVAL`) and returns 0 for an empty
//! scatter/gather list before the driver sees the advice; the driver (rxe's and mlx5's
//! `*_ib_advise_mr`) refuses an advice other than the three prefetches with
//! `EOPNOTSUPP`; then, entry by entry, mlx5's `get_prefetchable_mr` (whose errnos the man
//! page documents): an lkey that names no on-demand region `ENOENT` (only on-demand
//! regions are prefetchable: "all the lkeys … must be associated with ODP MRs"), a region
//! of another protection domain `EPERM`, `PREFETCH_WRITE` on a region not registered for
//! writing `EPERM`. With `IBV_ADVISE_MR_FLAG_FLUSH` the prefetch is synchronous and its
//! faults are the caller's (mlx5's `pagefault_mr`, rxe's `rxe_ib_prefetch_sg_list`): a
//! range outside the region, or a page not mapped (for `PREFETCH_WRITE`: not writable),
//! `EFAULT`. Without it the kernel queues the prefetch and ignores its faults ("best
//! effort"); here it happens at once, its faults ignored the same way.
//! `PREFETCH_NO_FAULT` maps only what is present (rxe's `RXE_PAGEFAULT_SNAPSHOT`): here
//! there is nothing to map, so it touches nothing.

use super::{MemoryTable, Slot};
use crate::guarded;
use crate::mappings;
use softverbs_proto::{AccessFlags, MemKey, Sge};

/// `enum ibv_advise_mr_advice` (`IB_UVERBS_ADVISE_MR_ADVICE_*`, same values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Advice {
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH`: make the pages present for reading.
    Prefetch,
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE`: make them present for reading and writing.
    PrefetchWrite,
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT`: make present to the device what is
    /// present already, without faulting.
    PrefetchNoFault,
    /// Any other value (refused, `EOPNOTSUPP`).
    Unknown(u32),
}

impl Advice {
    /// The advice of a C `enum ibv_advise_mr_advice` value.
    pub const fn from_raw(raw: u32) -> Self {
        match raw {
            0 => Advice::Prefetch,
            1 => Advice::PrefetchWrite,
            2 => Advice::PrefetchNoFault,
            other => Advice::Unknown(other),
        }
    }

    /// Its C value.
    pub const fn to_raw(self) -> u32 {
        match self {
            Advice::Prefetch => 0,
            Advice::PrefetchWrite => 1,
            Advice::PrefetchNoFault => 2,
            Advice::Unknown(raw) => raw,
        }
    }
}

/// `IBV_ADVISE_MR_FLAG_FLUSH` (`IB_UVERBS_ADVISE_MR_FLAG_FLUSH`): the prefetch is done,
/// and its faults reported, before the call returns.
pub const ADVISE_FLAG_FLUSH: u32 = 1 << 0;

/// Why `ibv_advise_mr(3)` was refused, one variant per cause, each naming the kernel's
/// errno for it (decided in `softverbs::core::Error::errno`).
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
pub enum AdviseError {
    /// Flags other than `IBV_ADVISE_MR_FLAG_FLUSH` (`uverbs_get_flags32`: `EINVAL`).
    #[error("unknown advise flags {flags:#x}")]
    UnknownFlags {
        /// The flags given.
        flags: u32,
    },
    /// An advice other than the three prefetches (rxe's and mlx5's `*_ib_advise_mr`:
    /// `EOPNOTSUPP`).
    #[error("advice {0} is not supported")]
    Unsupported(u32),
    /// The lkey names no on-demand paging region: none at all, or one registered without
    /// `IBV_ACCESS_ON_DEMAND` (mlx5's `get_prefetchable_mr`, which looks among the
    /// on-demand keys only: `ENOENT`).
    #[error("lkey {lkey:#x} names no on-demand paging region")]
    NotOnDemand {
        /// The lkey.
        lkey: u32,
    },
    /// The region belongs to another protection domain (`get_prefetchable_mr`: `EPERM`,
    /// "a valid lkey outside the caller's security scope").
    #[error("lkey {lkey:#x} names a region of another protection domain")]
    OtherPd {
        /// The lkey.
        lkey: u32,
    },
    /// `PREFETCH_WRITE` on a region not registered for writing (`get_prefetchable_mr`:
    /// `EPERM`).
    #[error("PREFETCH_WRITE on region {lkey:#x}, which is not registered for writing")]
    NotWritable {
        /// The lkey.
        lkey: u32,
    },
    /// With `IBV_ADVISE_MR_FLAG_FLUSH`: the range is not inside the region (mlx5's
    /// `pagefault_mr`, `ib_umem_odp_map_dma_and_lock`: `EFAULT`).
    #[error("range {addr:#x}+{length} is outside region {lkey:#x}")]
    OutOfRange {
        /// The lkey.
        lkey: u32,
        /// The entry's address.
        addr: u64,
        /// Its length.
        length: u32,
    },
    /// With `IBV_ADVISE_MR_FLAG_FLUSH`: a page of the range is not mapped (for
    /// `PREFETCH_WRITE`, not mapped writable): the fault cannot be resolved
    /// (`hmm_range_fault`: `EFAULT`).
    #[error("address {addr:#x} of the range cannot be mapped")]
    Unmapped {
        /// A byte of the range in the first page that faulted (as the process sees it).
        addr: usize,
    },
}

impl MemoryTable {
    /// `ibv_advise_mr(3)` for protection domain `pd` (which the caller has checked
    /// exists): the checks and prefetch of this module's documentation.
    pub fn advise(
        &self,
        pd: u32,
        advice: Advice,
        flags: u32,
        sges: &[Sge],
    ) -> Result<(), AdviseError> {
        if flags & !ADVISE_FLAG_FLUSH != 0 {
            return Err(AdviseError::UnknownFlags { flags });
        }
        if sges.is_empty() {
            return Ok(());
        }
        if let Advice::Unknown(raw) = advice {
            return Err(AdviseError::Unsupported(raw));
        }
        let flush = flags & ADVISE_FLAG_FLUSH != 0;
        let mut targets = Vec::with_capacity(sges.len());
        for sge in sges {
            let slot = self.prefetchable(pd, advice, sge.lkey)?;
            if flush {
                // Synchronous: entry by entry, each one's faults the caller's.
                self.prefetch(slot, advice, sge)?;
            } else {
                targets.push(slot);
            }
        }
        // Asynchronous in the kernel, best effort: every lkey was checked, faults are
        // ignored.
        for (slot, sge) in targets.into_iter().zip(sges) {
            let _ = self.prefetch(slot, advice, sge);
        }
        Ok(())
    }

    /// The on-demand region `lkey` names, if `pd` may prefetch it with `advice`.
    fn prefetchable(&self, pd: u32, advice: Advice, lkey: u32) -> Result<&Slot, AdviseError> {
        let slot = self
            .slot(MemKey::Local(lkey))
            .map(|(_, slot)| slot)
            .ok()
            .filter(|slot| slot.region.access.contains(AccessFlags::ON_DEMAND))
            .ok_or(AdviseError::NotOnDemand { lkey })?;
        if slot.region.pd != pd {
            return Err(AdviseError::OtherPd { lkey });
        }
        if advice == Advice::PrefetchWrite && !super::registration::asks_writing(slot.region.access)
        {
            return Err(AdviseError::NotWritable { lkey });
        }
        Ok(slot)
    }

    /// Touches every page `sge` covers in `slot`'s region: reads a byte of each
    /// (`PREFETCH`), or adds 0 to an aligned word of each with one locked instruction
    /// (`PREFETCH_WRITE`: a write fault that changes no value, whatever the application
    /// does to the word meanwhile), never a byte outside the range; nothing for
    /// `PREFETCH_NO_FAULT`.
    fn prefetch(&self, slot: &Slot, advice: Advice, sge: &Sge) -> Result<(), AdviseError> {
        let region = &slot.region;
        let out_of_range = AdviseError::OutOfRange {
            lkey: sge.lkey,
            addr: sge.addr,
            length: sge.length,
        };
        let offset = sge.addr.checked_sub(region.iova).ok_or(out_of_range)?;
        let end = offset
            .checked_add(u64::from(sge.length))
            .filter(|&end| end <= region.len)
            .ok_or(out_of_range)?;
        if sge.length == 0 || advice == Advice::PrefetchNoFault {
            return Ok(());
        }
        let to_address = |at: u64| usize::try_from(at).map(|at| region.addr.wrapping_add(at));
        let (Ok(start), Ok(end)) = (to_address(offset), to_address(end)) else {
            return Err(out_of_range);
        };
        let page = mappings::page_size();
        let mut at = start;
        while at < end {
            let page_end = (at / page).saturating_add(1).saturating_mul(page).min(end);
            let word = at.next_multiple_of(8);
            let touched = if advice == Advice::PrefetchWrite && word.saturating_add(8) <= page_end {
                // SAFETY: the aligned word lies inside the entry's range, inside an
                // on-demand region whose registration lets the device read and write
                // whatever is mapped there; adding 0 with one locked instruction leaves
                // the value as it is, atomically against every other access, and a fault
                // is reported, not fatal.
                unsafe { guarded::fetch_add(word as *mut u64, 0) }.map(|_| ())
            } else {
                let mut byte = [0u8; 1];
                // SAFETY: `at` is a byte of the entry's range, inside an on-demand region
                // the device may read; a fault is reported, not fatal.
                unsafe { super::copy_from_shared(at as *const u8, &mut byte) }
            };
            touched.map_err(|_| AdviseError::Unmapped { addr: at })?;
            at = page_end;
        }
        Ok(())
    }
}
