//! The accesses to registered memory ([`softverbs_proto::Memory`] for [`MemoryTable`]):
//! every read, write, atomic and invalidation checks the key, the region's protection
//! domain, the access flags and the bounds before a byte moves (the trait's rule, written
//! once in `softverbs-proto`; the table only finds a key's region), and moves it only through
//! the guarded copies and atomics ([`crate::guarded`]). An access that faults (the
//! application unmapped the region) is counted, marks the region, and fails with
//! [`MemError::Fault`]; later accesses to the region are refused without touching memory.

use super::shared::{copy_from_shared, copy_to_shared};
use super::{MemoryTable, Slot};
use crate::guarded::{self, Faulted};
use softverbs_proto::{
    AccessFlags, AtomicOp, MemError, MemKey, Memory, RegionInfo, WindowBinding, WindowInfo,
};
use std::sync::atomic::Ordering;

impl MemoryTable {
    /// The slot at `index` and the address of `[offset, offset + len)` of its memory, if
    /// the range is inside the region (`offset` counts from the region's first byte). The range was checked already
    /// ([`softverbs_proto::check_access`]) when the index comes from [`Memory::lookup`]:
    /// checking it again (one comparison) keeps the raw accesses, safe methods, sound for
    /// any index and offset.
    #[inline]
    fn target(&self, index: usize, offset: usize, len: usize) -> Result<(&Slot, usize), MemError> {
        let slot = self
            .regions
            .get(index)
            .and_then(Option::as_ref)
            .ok_or(MemError::InvalidKey)?;
        let end = offset.checked_add(len).ok_or(MemError::OutOfBounds)?;
        if end as u64 > slot.region.len {
            return Err(MemError::OutOfBounds);
        }
        Ok((slot, slot.region.addr.wrapping_add(offset)))
    }

    /// The region a bound memory window's R_Key reaches, as the window narrows it: its
    /// PD, range, rights and (type 2) QP, the faults of the region under it.
    fn window_region(&self, rkey: u32) -> Option<((usize, usize), RegionInfo)> {
        let window = self
            .window_by_handle(rkey >> 8)
            .filter(|w| w.rkey == rkey)?;
        let (index, binding) = window.binding?;
        let slot = self.regions.get(index)?.as_ref()?;
        let base = usize::try_from(binding.addr.checked_sub(slot.region.iova)?).ok()?;
        let info = RegionInfo {
            pd: window.pd,
            start: binding.addr,
            len: binding.length,
            access: binding.access,
            faulted: slot.faulted.load(Ordering::Relaxed),
            qp: binding.qp,
        };
        Some(((index, base), info))
    }

    /// Records that an access to `slot`'s memory faulted.
    #[cold]
    pub(super) fn faulted(&self, slot: &Slot, what: &'static str, fault: Faulted) -> MemError {
        if slot.region.access.contains(AccessFlags::ON_DEMAND) {
            // An on-demand region: the page is not there now, which is the region's
            // normal life, not a broken promise. This access fails; the next one looks
            // again (rxe_odp_map_range_and_lock faults the pages in on every access).
            self.unresolved_page_faults.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                lkey = format_args!("{:#x}", slot.region.lkey),
                what,
                moved = fault.moved,
                "on-demand page fault not resolved: the page is not mapped"
            );
            return MemError::Fault;
        }
        self.faulted_accesses.fetch_add(1, Ordering::Relaxed);
        if !slot.faulted.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                addr = format_args!("{:#x}", slot.region.addr),
                len = slot.region.len,
                lkey = format_args!("{:#x}", slot.region.lkey),
                what,
                moved = fault.moved,
                "registered memory is no longer mapped (unmapped or freed while \
                 registered): the access fails, and so will every later access to the region"
            );
        }
        MemError::Fault
    }
}

/// The rule (key, PD, access, bounds, fault; zero length) is the trait's provided methods;
/// the table finds the slot of a key (a region of another PD is as good as none for the QP
/// asking, IBTA ch. 10 protection domains, which [`softverbs_proto::check_access`] applies)
/// and moves the bytes.
impl Memory for MemoryTable {
    /// The index of the slot in `regions`, and where in the region offset 0 is: 0 for a
    /// region's own key, the window's first byte for a memory window's R_Key.
    type Handle = (usize, usize);

    #[inline]
    fn lookup(&self, key: MemKey) -> Result<((usize, usize), RegionInfo), MemError> {
        let (index, slot) = match self.slot(key) {
            Ok(found) => found,
            Err(e) => {
                return match key {
                    MemKey::Remote(rkey) => self.window_region(rkey).ok_or(e),
                    MemKey::Local(_) => Err(e),
                }
            }
        };
        let region = &slot.region;
        let info = RegionInfo {
            pd: region.pd,
            start: region.iova,
            len: region.len,
            access: region.access,
            faulted: slot.faulted.load(Ordering::Relaxed),
            qp: None,
        };
        Ok(((index, 0), info))
    }

    fn abandon_reads(&self) {
        self.abandon_deferred();
    }

    fn window(&self, rkey: u32) -> Option<WindowInfo> {
        let window = self
            .window_by_handle(rkey >> 8)
            .filter(|w| w.rkey == rkey)?;
        Some(WindowInfo {
            pd: window.pd,
            kind: window.kind,
            rkey,
            bound: window.binding().is_some(),
        })
    }

    fn set_window(
        &mut self,
        rkey: u32,
        new_rkey: u32,
        binding: Option<WindowBinding>,
    ) -> Result<(), MemError> {
        self.rebind(rkey, new_rkey, binding)
    }

    #[inline]
    fn read_region(
        &self,
        (index, base): (usize, usize),
        offset: usize,
        buf: &mut [u8],
    ) -> Result<(), MemError> {
        let offset = offset.checked_add(base).ok_or(MemError::OutOfBounds)?;
        let (slot, src) = self.target(index, offset, buf.len())?;
        if self.defer(slot, src, buf) {
            return Ok(());
        }
        // SAFETY: `target` proved `[offset, offset + buf.len())` lies inside the region,
        // whose memory the registration contract keeps readable and accessed only
        // atomically, through these copies or by the application outside Rust's view; if
        // the application broke the contract and unmapped it, the guarded copy reports the
        // fault instead of touching anything else.
        unsafe { copy_from_shared(src as *const u8, buf) }
            .map_err(|f| self.faulted(slot, "read", f))
    }

    #[inline]
    fn write_region(
        &mut self,
        (index, base): (usize, usize),
        offset: usize,
        data: &[u8],
    ) -> Result<(), MemError> {
        let offset = offset.checked_add(base).ok_or(MemError::OutOfBounds)?;
        let (slot, dst) = self.target(index, offset, data.len())?;
        if let Some(result) = self.write_supplied(slot, dst, data) {
            return result;
        }
        // SAFETY: as in `read_region`: the range is inside a registered region whose memory
        // the registration keeps valid (a fault is reported, not fatal); `data` is engine
        // memory, not the region, and the copy writes nothing outside the range.
        unsafe { copy_to_shared(data, dst as *mut u8) }.map_err(|f| self.faulted(slot, "write", f))
    }

    fn atomic_region(
        &mut self,
        (index, base): (usize, usize),
        offset: usize,
        op: AtomicOp,
    ) -> Result<u64, MemError> {
        let offset = offset.checked_add(base).ok_or(MemError::OutOfBounds)?;
        let (slot, target) = self.target(index, offset, 8)?;
        if !target.is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        let word = target as *mut u64;
        // SAFETY: the 8 bytes are inside a registered region (checked), 8-byte aligned
        // (checked), and valid for the registration's life (a fault is reported, not
        // fatal); the guarded routines are `lock`ed read-modify-writes, atomic against
        // every other atomic on the word and sequentially consistent.
        let result = unsafe {
            match op {
                AtomicOp::CompareSwap { compare, swap } => {
                    guarded::compare_swap(word, compare, swap)
                }
                AtomicOp::FetchAdd { add } => guarded::fetch_add(word, add),
            }
        };
        result.map_err(|f| self.faulted(slot, "atomic", f))
    }

    fn atomic_write_region(
        &mut self,
        (index, base): (usize, usize),
        offset: usize,
        value: [u8; 8],
    ) -> Result<(), MemError> {
        let offset = offset.checked_add(base).ok_or(MemError::OutOfBounds)?;
        let (slot, target) = self.target(index, offset, 8)?;
        if !target.is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        // SAFETY: as in `atomic_region`: inside a registered region (checked), 8-byte
        // aligned (checked), valid for the registration's life (a fault is reported). The
        // bytes land as they came (`from_ne_bytes` keeps their order in memory).
        unsafe { guarded::store(target as *mut u64, u64::from_ne_bytes(value)) }
            .map_err(|f| self.faulted(slot, "atomic write", f))
    }

    fn invalidate_region(&mut self, _: (usize, usize)) -> Result<(), MemError> {
        // Every region of this table comes from `ibv_reg_mr`; only memory windows and
        // fast-registered regions can be invalidated (IBTA 10.6.6; rxe's
        // `rxe_invalidate_mr` refuses any other type), so the R_Key stays valid and the
        // request is refused.
        Err(MemError::NotInvalidatable)
    }
}
