//! The accesses to registered memory ([`softverbs_proto::Memory`] for [`MemoryTable`]):
//! every read, write, atomic and invalidation checks the key, the region's protection
//! domain, the access flags and the bounds before a byte moves, and moves it only through
//! the guarded copies and atomics ([`crate::guarded`]). An access that faults (the
//! application unmapped the region) is counted, marks the region, and fails with
//! [`MemError::Fault`]; later accesses to the region are refused without touching memory.

use super::shared::{copy_from_shared, copy_to_shared};
use super::{MemoryTable, Slot};
use crate::guarded::{self, Faulted};
use softverbs_proto::{AccessFlags, AtomicOp, MemError, MemKey, Memory};
use std::sync::atomic::Ordering;

impl MemoryTable {
    /// The slot of `key` if its region belongs to `pd` (a key of another PD is as good
    /// as none for the QP asking, IBTA ch. 10 protection domains; rxe's MR lookup compares
    /// the PDs the same way), grants `need`, holds `[va, va + len)` and has not faulted,
    /// with the offset of `va`.
    fn check(
        &self,
        pd: u32,
        key: MemKey,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(&Slot, usize), MemError> {
        let slot = self.slot(key)?;
        let region = &slot.region;
        if region.pd != pd {
            return Err(MemError::PdMismatch);
        }
        if !region.access.contains(need) {
            return Err(MemError::AccessDenied);
        }
        let offset = region.offset(va, len)?;
        if slot.faulted.load(Ordering::Relaxed) {
            return Err(MemError::Fault);
        }
        Ok((slot, offset))
    }

    /// Records that an access to `slot`'s memory faulted.
    fn faulted(&self, slot: &Slot, what: &'static str, fault: Faulted) -> MemError {
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

impl Memory for MemoryTable {
    fn check_local(
        &self,
        pd: u32,
        lkey: u32,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(), MemError> {
        if len == 0 {
            return Ok(());
        }
        self.check(pd, MemKey::Local(lkey), addr, len, need)
            .map(|_| ())
    }

    fn check_remote(
        &self,
        pd: u32,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(), MemError> {
        if len == 0 {
            return Ok(());
        }
        self.check(pd, MemKey::Remote(rkey), va, len, need)
            .map(|_| ())
    }

    fn read(&self, pd: u32, key: MemKey, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        if buf.is_empty() {
            return Ok(());
        }
        let need = match key {
            MemKey::Local(_) => AccessFlags::empty(),
            MemKey::Remote(_) => AccessFlags::REMOTE_READ,
        };
        let (slot, offset) = self.check(pd, key, addr, buf.len() as u64, need)?;
        let src = slot.region.addr.wrapping_add(offset) as *const u8;
        // SAFETY: `check` proved `[offset, offset + buf.len())` lies inside the region,
        // whose memory the registration contract keeps readable and accessed only
        // atomically, through these copies or by the application outside Rust's view; if
        // the application broke the contract and unmapped it, the guarded copy reports the
        // fault instead of touching anything else.
        unsafe { copy_from_shared(src, buf) }.map_err(|f| self.faulted(slot, "read", f))
    }

    fn write(&mut self, pd: u32, key: MemKey, addr: u64, data: &[u8]) -> Result<(), MemError> {
        if data.is_empty() {
            return Ok(());
        }
        let need = match key {
            MemKey::Local(_) => AccessFlags::LOCAL_WRITE,
            MemKey::Remote(_) => AccessFlags::REMOTE_WRITE,
        };
        let (slot, offset) = self.check(pd, key, addr, data.len() as u64, need)?;
        let dst = slot.region.addr.wrapping_add(offset) as *mut u8;
        // SAFETY: as in `read`: the range is inside a registered region whose memory the
        // registration keeps valid (a fault is reported, not fatal); `data` is engine
        // memory, not the region, and the copy writes nothing outside the range.
        unsafe { copy_to_shared(data, dst) }.map_err(|f| self.faulted(slot, "write", f))
    }

    fn atomic(&mut self, pd: u32, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, MemError> {
        if !va.is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        let (slot, offset) =
            self.check(pd, MemKey::Remote(rkey), va, 8, AccessFlags::REMOTE_ATOMIC)?;
        let target = slot.region.addr.wrapping_add(offset);
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

    fn invalidate(&mut self, pd: u32, rkey: u32) -> Result<(), MemError> {
        let region = self.region(MemKey::Remote(rkey))?;
        if region.pd != pd {
            // A peer may invalidate only keys of its QP's PD (rdmavt checks this too).
            return Err(MemError::PdMismatch);
        }
        // Every region of this table comes from `ibv_reg_mr`; only memory windows and
        // fast-registered regions can be invalidated (IBTA 10.6.6; rxe's
        // `rxe_invalidate_mr` refuses any other type), so the R_Key stays valid and the
        // request is refused.
        Err(MemError::NotInvalidatable)
    }
}
