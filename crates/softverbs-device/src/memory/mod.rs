//! Registered memory: the table of memory regions and the one place in softverbs that
//! copies into and out of application memory.
//!
//! A region is a range of the process's memory that its owner promised (by the `unsafe`
//! [`MemoryTable::register`]) to keep valid until it is deregistered. Every access goes
//! through [`softverbs_proto::Memory`]: the key names the region, and the key, the region's
//! protection domain (it must be the PD of the QP making the access), the bounds and the
//! access flags are checked before a byte moves, so a request naming a region of another
//! PD, outside a region or without the right access is refused (the engine turns that into
//! the NAK or completion status the spec requires) and never touches other memory.
//!
//! Keys are unguessable: 32 random bits from the operating system per key, never reused
//! while registered (`ibv_reg_mr(3)`: lkey and rkey are the region's local and remote keys).
//!
//! Registration checks what the kernel's `ib_umem_get` checks when it pins the pages, with
//! the same errno (module [`crate::mappings`]): a non-empty range (`EINVAL`), every page
//! mapped (`EFAULT`), writable when the region asks for write access (`EFAULT`), and the
//! process's pinned pages within `RLIMIT_MEMLOCK` (`ENOMEM`; `EPERM` for a zero limit)
//! unless the thread has `CAP_IPC_LOCK`.
//!
//! Registered memory is shared with the application, which may read or write it while a
//! remote peer's RDMA write lands in it (that is what RDMA is for), and which may break its
//! promise and unmap or free it. Every copy and atomic on a region goes through
//! [`crate::guarded`]: on x86-64 assembly routines, opaque to the compiler, so a race with
//! the application is a race on values and never undefined behaviour, and fault tolerant,
//! so an access to memory that is no longer mapped fails with [`MemError::Fault`] instead
//! of killing the process. The table then counts the fault
//! ([`MemoryTable::faulted_accesses`]) and marks the region, whose later accesses are
//! refused the same way without touching memory.
//!
//! On-demand paging regions (`IBV_ACCESS_ON_DEMAND`, `ibv_reg_mr(3)`) are the exception
//! to "the memory stays valid": the range need not be mapped when it is registered (or ever
//! — the implicit region is the whole address space), nothing is pinned or charged to
//! `RLIMIT_MEMLOCK`, and an access reaches whatever is mapped at its time. An access to a
//! page not mapped then (or not writable, for a write) is the page fault a NIC cannot
//! resolve: it fails as rxe fails it (`rxe_odp_map_range_and_lock` returns `EFAULT` when
//! `hmm_range_fault` cannot map the page, and the responder answers
//! `RESPST_ERR_RKEY_VIOLATION`: a remote access error NAK, `IBV_WC_REM_ACCESS_ERR` at the
//! requester; a local scatter/gather entry ends with `IBV_WC_LOC_PROT_ERR`), is counted
//! ([`MemoryTable::unresolved_page_faults`]), and does not mark the region: memory mapped
//! there later is reached by the next access. Only where the guarded accesses are fault
//! tolerant (x86-64, [`ON_DEMAND_PAGING`]).
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | [`MemoryTable`]: the regions, their keys, registration and deregistration |
//! | `advice.rs` | [`MemoryTable::advise`] (`ibv_advise_mr(3)`): [`Advice`], [`AdviseError`], the prefetch |
//! | `registration.rs` | [`RegisterError`] and the checks a registration passes before the table records it |
//! | `access.rs` | the [`softverbs_proto::Memory`] accesses: a key's region for the trait's checks (key, PD, access, bounds), then the guarded copies and atomics |
//! | `shared.rs` | [`copy_from_shared`] / [`copy_to_shared`]: the copies into and out of application memory |

mod access;
mod advice;
mod registration;
pub(crate) mod shared;
#[cfg(test)]
mod tests;

pub use advice::{Advice, AdviseError, ADVISE_FLAG_FLUSH};
pub use registration::{is_implicit, RegisterError};

/// Whether the device offers on-demand paging: where its accesses to application memory
/// are fault tolerant ([`crate::guarded`], x86-64), so a page not mapped fails the access
/// instead of killing the process.
pub const ON_DEMAND_PAGING: bool = cfg!(target_arch = "x86_64");

pub use shared::{copy_from_shared, copy_to_shared};

use crate::deferred::Deferred;
use crate::guarded;
use crate::mappings::{self, Pinned};
use rustc_hash::FxHashMap;
use softverbs_proto::{AccessFlags, MemError, MemKey, WindowBinding, WindowType};
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// One registered region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// Where the region starts in this process's address space.
    pub addr: usize,
    /// Its length in bytes.
    pub len: u64,
    /// The I/O virtual address remote peers use for its first byte (`ibv_reg_mr_iova2`;
    /// equal to `addr` for `ibv_reg_mr`).
    pub iova: u64,
    /// Access rights granted.
    pub access: AccessFlags,
    /// The protection domain it belongs to.
    pub pd: u32,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
}

/// What a re-registration changes (`ibv_rereg_mr(3)`: one field per flag); `None` keeps
/// what the region has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rereg {
    /// `IBV_REREG_MR_CHANGE_TRANSLATION`: the new range, `(addr, len, iova)`
    /// (`ibv_rereg_mr` passes the address as the iova, as `ibv_reg_mr` does).
    pub translation: Option<(usize, u64, u64)>,
    /// `IBV_REREG_MR_CHANGE_PD`: the new protection domain.
    pub pd: Option<u32>,
    /// `IBV_REREG_MR_CHANGE_ACCESS`: the new access rights.
    pub access: Option<AccessFlags>,
}

impl Rereg {
    /// Whether it changes nothing (no flag).
    pub fn is_empty(&self) -> bool {
        self.translation.is_none() && self.pd.is_none() && self.access.is_none()
    }
}

/// A region in the table, with what the table keeps about it.
#[derive(Debug)]
struct Slot {
    region: Region,
    /// An access faulted: the memory is gone, refuse every access without touching it.
    /// Shared with the payload reads left for later (`crate::deferred`), which mark it
    /// when they fault; a new translation (`ibv_rereg_mr`) gets a new mark.
    faulted: Arc<AtomicBool>,
    /// Its pages in the process's pinned count.
    pinned: Pinned,
    /// Memory windows bound to it: it cannot be deregistered while any is
    /// (`ibv_dereg_mr(3)`).
    windows: u32,
}

/// A memory window (`ibv_alloc_mw(3)`): its protection domain, type, current R_Key and
/// binding. Its handle is the R_Key's upper 24 bits, which no bind changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// The protection domain it was allocated in.
    pub pd: u32,
    /// Its type.
    pub kind: WindowType,
    /// Its R_Key now.
    pub rkey: u32,
    /// Its binding, and the index of the region it is bound to; `None` while unbound.
    binding: Option<(usize, WindowBinding)>,
}

impl Window {
    /// The binding (`None`: unbound, or invalidated).
    pub fn binding(&self) -> Option<WindowBinding> {
        self.binding.map(|(_, b)| b)
    }
}

/// The table of registered regions of one device.
#[derive(Debug, Default)]
pub struct MemoryTable {
    regions: Vec<Option<Slot>>,
    // Looked up for every work request and every packet with an R_Key: FxHash, not
    // SipHash. The keys are the device's own (a peer chooses which to look up, never
    // what is inserted), so no peer can make the tables degrade.
    by_lkey: FxHashMap<u32, usize>,
    by_rkey: FxHashMap<u32, usize>,
    /// Memory windows by handle (the upper 24 bits of their R_Keys, which no region's
    /// R_Key shares).
    windows: FxHashMap<u32, Window>,
    /// Accesses that faulted (the application unmapped registered memory).
    faulted_accesses: AtomicU64,
    /// Accesses to on-demand regions that met a page not mapped (with the access needed).
    unresolved_page_faults: AtomicU64,
    /// Payload reads left for when the packet is written (`crate::deferred`), while
    /// [`MemoryTable::defer_reads`] is on.
    deferral: Deferral,
    /// The payload pieces of the packet being handled that are still in the sender's
    /// regions (a device of this process left them for later): writes of its payload
    /// read them from there ([`MemoryTable::supply_from`]).
    supply: Supply,
    /// [`MemoryTable::direct_payload_bytes`].
    direct_payload_bytes: AtomicU64,
}

/// See [`MemoryTable::supply_from`].
#[derive(Debug, Default)]
struct Supply {
    /// The packet's bytes: address and length.
    base: usize,
    len: usize,
    /// Where the packet starts in the buffer the pieces' offsets count in.
    origin: usize,
    pieces: Vec<Deferred>,
}

/// The reads [`MemoryTable`] leaves for later while a packet is built (cells: set for
/// every packet built, so kept cheap; the pieces only touched when a read is kept).
#[derive(Debug, Default)]
struct Deferral {
    /// Whether reads are left for later now.
    on: Cell<bool>,
    /// The address of the packet buffer being built, and its offset in the run's bytes.
    base: Cell<usize>,
    offset: Cell<usize>,
    /// Whether `pieces` holds any.
    kept: Cell<bool>,
    /// The pieces of the packet being built (offsets in the run's bytes).
    pieces: RefCell<Vec<Deferred>>,
}

impl Deferral {
    fn clear(&self) {
        if self.kept.replace(false) {
            self.pieces.borrow_mut().clear();
        }
    }
}

/// Reads shorter than this are made at once (their copy costs less than keeping them).
#[cfg(target_arch = "x86_64")]
const DEFER_AT_LEAST: usize = 1024;

impl MemoryTable {
    /// Leaves the payload reads of the packet about to be built in `buf` (at `offset` of
    /// the run's bytes) for when it is written where it goes: until
    /// [`stop_deferring`](Self::stop_deferring), a read of [`DEFER_AT_LEAST`] bytes or more
    /// of a region that is not on-demand is kept as a [`Deferred`] piece instead of being
    /// copied (x86-64 only: elsewhere every read is made at once, module `deferred`).
    pub(crate) fn defer_reads(&self, buf: &[u8], offset: usize) {
        let deferral = &self.deferral;
        deferral.on.set(cfg!(target_arch = "x86_64"));
        deferral.base.set(buf.as_ptr() as usize);
        deferral.offset.set(offset);
        deferral.clear();
    }

    /// Moves the pieces of the packet just built to `into`.
    pub(crate) fn take_deferred(&self, into: &mut Vec<Deferred>) {
        if self.deferral.kept.replace(false) {
            into.append(&mut self.deferral.pieces.borrow_mut());
        }
    }

    /// Every read is made at once again; pieces not taken are dropped.
    pub(crate) fn stop_deferring(&self) {
        self.deferral.on.set(false);
        self.deferral.clear();
    }

    /// Keeps the read of `len` bytes at `src` into `dst` for later if reads are deferred
    /// now and it qualifies; true if kept.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    fn defer(&self, slot: &Slot, src: usize, dst: &[u8]) -> bool {
        if dst.len() < DEFER_AT_LEAST || slot.region.access.contains(AccessFlags::ON_DEMAND) {
            return false;
        }
        let deferral = &self.deferral;
        if !deferral.on.get() {
            return false;
        }
        let at = deferral.offset.get() + (dst.as_ptr() as usize).wrapping_sub(deferral.base.get());
        deferral.kept.set(true);
        deferral.pieces.borrow_mut().push(Deferred {
            at,
            len: dst.len(),
            src,
            faulted: Arc::clone(&slot.faulted),
        });
        true
    }

    #[cfg(not(target_arch = "x86_64"))]
    #[inline]
    fn defer(&self, _slot: &Slot, _src: usize, _dst: &[u8]) -> bool {
        false
    }

    /// Until [`stop_supplying`](Self::stop_supplying): `packet` (starting at `origin` of the
    /// buffer the offsets of `pieces` count in) is being handled, and its bytes at the
    /// pieces' places are not there yet but in the sender's regions (a device of this
    /// process that left its reads for later, `crate::deferred`). A write of the payload
    /// into a region reads them from the sender's region: one copy from region to region.
    pub(crate) fn supply_from(&mut self, packet: &[u8], origin: usize, pieces: &[Deferred]) {
        self.supply.base = packet.as_ptr() as usize;
        self.supply.len = packet.len();
        self.supply.origin = origin;
        self.supply.pieces.clear();
        self.supply.pieces.extend_from_slice(pieces);
    }

    /// Writes take their bytes from where they are given again.
    pub(crate) fn stop_supplying(&mut self) {
        self.supply.pieces.clear();
        self.supply.len = 0;
    }

    /// Writes `data` to `dst` (in `slot`'s region, checked) where `data` is part of the
    /// packet being handled whose pieces are supplied: the pieces' bytes straight from the
    /// sender's region, the rest from `data`. `None` if `data` is not such a part.
    fn write_supplied(&self, slot: &Slot, dst: usize, data: &[u8]) -> Option<Result<(), MemError>> {
        let supply = &self.supply;
        if supply.pieces.is_empty() {
            return None;
        }
        let start = (data.as_ptr() as usize).checked_sub(supply.base)?;
        let end = start.checked_add(data.len())?;
        if end > supply.len {
            return None;
        }
        let mut at = start;
        for piece in &supply.pieces {
            let piece_start = piece.at.wrapping_sub(supply.origin);
            let piece_end = piece_start.saturating_add(piece.len);
            if piece_end <= at || piece_start >= end {
                continue;
            }
            let from = piece_start.max(at);
            let to = piece_end.min(end);
            if from > at {
                // SAFETY: `dst .. dst + data.len()` is inside the checked region; the bytes
                // before the piece are the packet's own.
                let before = unsafe {
                    shared::copy_to_shared(
                        &data[at - start..from - start],
                        (dst + (at - start)) as *mut u8,
                    )
                };
                if let Err(f) = before {
                    return Some(Err(self.faulted(slot, "write", f)));
                }
            }
            let src = piece.src + (from - piece_start);
            // SAFETY: the destination as above; the source is inside the sender's region,
            // which its engine checked when it built the packet; a page of either gone is
            // a fault, reported (`crate::guarded`).
            if let Err(fault) = unsafe {
                guarded::copy(
                    (dst + (from - start)) as *mut u8,
                    src as *const u8,
                    to - from,
                )
            } {
                // Whose page is gone? Only a fault of the target marks the target.
                let src_gone = !crate::deferred::readable(src + fault.moved);
                return Some(Err(if src_gone {
                    piece.mark_faulted(fault);
                    MemError::Fault
                } else {
                    self.faulted(slot, "write", fault)
                }));
            }
            self.direct_payload_bytes
                .fetch_add((to - from) as u64, Ordering::Relaxed);
            at = to;
        }
        if at < end {
            // SAFETY: as above.
            if let Err(f) = unsafe {
                shared::copy_to_shared(&data[at - start..], (dst + (at - start)) as *mut u8)
            } {
                return Some(Err(self.faulted(slot, "write", f)));
            }
        }
        Some(Ok(()))
    }

    /// Drops the pieces of the packet being built (the engine gave it up).
    fn abandon_deferred(&self) {
        self.deferral.clear();
    }
}

impl Drop for MemoryTable {
    fn drop(&mut self) {
        for slot in self.regions.drain(..).flatten() {
            mappings::release_pages(slot.pinned);
        }
    }
}

/// 32 random bits from the operating system, for a key.
fn random_u32() -> Result<u32, RegisterError> {
    let mut bytes = [0u8; 4];
    rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty())
        .map_err(|_| RegisterError::NoRandomness)?;
    Ok(u32::from_ne_bytes(bytes))
}

impl MemoryTable {
    /// An empty table. Installs the process's memory fault handler ([`crate::guarded`]).
    pub fn new() -> Self {
        guarded::ensure_installed();
        Self::default()
    }

    /// Registers `[addr, addr + len)` under protection domain `pd`, remote peers naming
    /// its first byte `iova`. Returns the region with its new keys.
    ///
    /// Refused, touching nothing, as a kernel device refuses it (`ibv_reg_mr(3)`; one
    /// [`RegisterError`] per cause): remote write or atomic without local write; an
    /// empty or wrapping range; a page not mapped, or not readable, or not writable when
    /// the access asks for writing (`LOCAL_WRITE`, `REMOTE_WRITE`, `REMOTE_ATOMIC`,
    /// `MW_BIND`); more pinned pages than `RLIMIT_MEMLOCK` allows without `CAP_IPC_LOCK`.
    ///
    /// # Safety
    ///
    /// The range must be memory of this process that stays allocated, and is not
    /// otherwise accessed in a way that conflicts with the device reading and writing it,
    /// until [`MemoryTable::deregister`] returns for its lkey. (This is the contract of
    /// `ibv_reg_mr(3)`; the safe API upholds it by owning the buffer.) Breaking the first
    /// half by unmapping the memory makes the device's accesses fail (x86-64), not the
    /// process crash; memory mapped again at the same address is written as if it were
    /// the region.
    ///
    /// With [`AccessFlags::ON_DEMAND`] the range need not be mapped: until the region is
    /// deregistered, whatever is mapped in it when an access comes may be read (and, with
    /// write access, written) by the device, and nothing else may access that memory in
    /// a way that conflicts with the device's accesses (for the implicit region,
    /// [`is_implicit`], that is the whole address space).
    pub unsafe fn register(
        &mut self,
        pd: u32,
        addr: usize,
        len: u64,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Region, RegisterError> {
        let pinned = registration::check_registration(addr, len, iova, access)?;
        let keys = self
            .fresh_key(true)
            .and_then(|lkey| Ok((lkey, self.fresh_key(false)?)));
        let (lkey, rkey) = match keys {
            Ok(keys) => keys,
            Err(e) => {
                mappings::release_pages(pinned);
                return Err(e);
            }
        };
        let region = Region {
            addr,
            len,
            iova,
            access,
            pd,
            lkey,
            rkey,
        };
        let slot = Slot {
            region,
            faulted: Arc::new(AtomicBool::new(false)),
            pinned,
            windows: 0,
        };
        let index = match self.regions.iter().position(Option::is_none) {
            Some(free) => {
                self.regions[free] = Some(slot);
                free
            }
            None => {
                self.regions.push(Some(slot));
                self.regions.len() - 1
            }
        };
        self.by_lkey.insert(lkey, index);
        self.by_rkey.insert(rkey, index);
        Ok(region)
    }

    fn fresh_key(&self, local: bool) -> Result<u32, RegisterError> {
        for _ in 0..64 {
            let key = random_u32()?;
            let taken = if local {
                self.by_lkey.contains_key(&key)
            } else {
                self.by_rkey.contains_key(&key) || self.windows.contains_key(&(key >> 8))
            };
            if key != 0 && !taken {
                return Ok(key);
            }
        }
        Err(RegisterError::NoRandomness)
    }

    /// Removes the region with local key `lkey`; after this returns the device never
    /// touches its memory again, and its pages no longer count against `RLIMIT_MEMLOCK`.
    pub fn deregister(&mut self, lkey: u32) -> Option<Region> {
        let index = self.by_lkey.remove(&lkey)?;
        let slot = self.regions[index].take()?;
        self.by_rkey.remove(&slot.region.rkey);
        mappings::release_pages(slot.pinned);
        Some(slot.region)
    }

    /// Re-registers the region with local key `lkey` (`ibv_rereg_mr(3)`): "conceptually a
    /// deregistration followed by a registration", done at once under the caller's
    /// exclusive borrow, so every access sees either the old region or the new one, each
    /// checked against its own bounds. The keys stay (rxe keeps them for a PD or access
    /// change; so does a translation change here, as mlx5 keeps them where it can), so
    /// work requests and peers keep naming the region; a peer's access in flight from
    /// before a translation change lands inside the new range or is refused by its
    /// bounds, never outside both ranges.
    ///
    /// The new translation passes every check of [`MemoryTable::register`], with the new
    /// access, and is charged to `RLIMIT_MEMLOCK` before the old pages are released (as
    /// the kernel pins the new range before it lets the old go); new access rights alone
    /// are checked against the pages the region holds. Refused, changing nothing:
    /// [`RegisterError::NothingToChange`], [`RegisterError::EmptyTranslation`] (a NULL
    /// address or zero length), and the registration's refusals. `None` for an unknown
    /// lkey. The caller checks the new PD exists and no window is bound
    /// ([`crate::Device::rereg_mr`]).
    ///
    /// # Safety
    ///
    /// With a new translation, as [`MemoryTable::register`] for the new range; the old
    /// range is never touched again once this returns `Ok`.
    pub unsafe fn reregister(
        &mut self,
        lkey: u32,
        change: Rereg,
    ) -> Option<Result<Region, RegisterError>> {
        let index = *self.by_lkey.get(&lkey)?;
        let slot = self.regions.get_mut(index)?.as_mut()?;
        Some(Self::reregister_slot(slot, change))
    }

    fn reregister_slot(slot: &mut Slot, change: Rereg) -> Result<Region, RegisterError> {
        if change.is_empty() {
            return Err(RegisterError::NothingToChange);
        }
        let old = slot.region;
        let access = change.access.unwrap_or(old.access);
        let mut region = Region {
            access,
            pd: change.pd.unwrap_or(old.pd),
            ..old
        };
        if let Some((addr, len, _)) = change.translation {
            if addr == 0 || len == 0 {
                return Err(RegisterError::EmptyTranslation);
            }
        }
        // Access that turns on-demand paging on or off registers the range anew (pinned
        // and charged, or released), as a new translation of the same range does.
        let paging_changes = (access ^ old.access).contains(AccessFlags::ON_DEMAND);
        let translation = change
            .translation
            .or(paging_changes.then_some((old.addr, old.len, old.iova)));
        match translation {
            Some((addr, len, iova)) => {
                let pinned = registration::check_registration(addr, len, iova, access)?;
                mappings::release_pages(std::mem::replace(&mut slot.pinned, pinned));
                // New memory: the old range's faults say nothing about it (and a read of
                // the old range left for later marks the old range's mark).
                slot.faulted = Arc::new(AtomicBool::new(false));
                region.addr = addr;
                region.len = len;
                region.iova = iova;
            }
            None => {
                if change.access.is_some() {
                    registration::check_new_access(old.addr, old.len, access)?;
                }
            }
        }
        slot.region = region;
        Ok(region)
    }

    /// How many memory windows are bound to the region with local key `lkey`.
    pub fn bound_windows(&self, lkey: u32) -> u32 {
        self.by_lkey
            .get(&lkey)
            .and_then(|&i| self.regions[i].as_ref())
            .map_or(0, |slot| slot.windows)
    }

    /// Allocates an unbound memory window of `kind` in `pd` (`ibv_alloc_mw(3)`); returns
    /// its handle and R_Key (random, as region keys, its upper 24 bits the handle and
    /// shared with no region's R_Key).
    pub fn alloc_window(&mut self, pd: u32, kind: WindowType) -> Result<(u32, u32), RegisterError> {
        for _ in 0..64 {
            let rkey = random_u32()?;
            let handle = rkey >> 8;
            let taken =
                self.windows.contains_key(&handle) || self.by_rkey.keys().any(|k| k >> 8 == handle);
            if handle != 0 && !taken {
                self.windows.insert(
                    handle,
                    Window {
                        pd,
                        kind,
                        rkey,
                        binding: None,
                    },
                );
                return Ok((handle, rkey));
            }
        }
        Err(RegisterError::NoRandomness)
    }

    /// Frees the memory window `handle` (`ibv_dealloc_mw(3)`), bound or not: its R_Key is
    /// invalid from now on and its region no longer counts it.
    pub fn dealloc_window(&mut self, handle: u32) -> Option<Window> {
        let window = self.windows.remove(&handle)?;
        if let Some((index, _)) = window.binding {
            self.unbind_from(index);
        }
        Some(window)
    }

    /// The memory window `handle`.
    pub fn window_by_handle(&self, handle: u32) -> Option<&Window> {
        self.windows.get(&handle)
    }

    /// The number of memory windows.
    pub fn window_count(&self) -> usize {
        self.windows.len()
    }

    fn unbind_from(&mut self, index: usize) {
        if let Some(slot) = self.regions.get_mut(index).and_then(Option::as_mut) {
            slot.windows = slot.windows.saturating_sub(1);
        }
    }

    /// Records a window's new key and binding ([`softverbs_proto::Memory::set_window`]).
    fn rebind(
        &mut self,
        rkey: u32,
        new_rkey: u32,
        binding: Option<WindowBinding>,
    ) -> Result<(), MemError> {
        let handle = rkey >> 8;
        let current = self
            .windows
            .get(&handle)
            .filter(|w| w.rkey == rkey)
            .ok_or(MemError::InvalidKey)?
            .binding;
        let target = match binding {
            Some(b) => Some((
                *self.by_lkey.get(&b.mr_lkey).ok_or(MemError::InvalidKey)?,
                b,
            )),
            None => None,
        };
        if let Some((index, _)) = current {
            self.unbind_from(index);
        }
        if let Some((index, _)) = target {
            if let Some(slot) = self.regions.get_mut(index).and_then(Option::as_mut) {
                slot.windows += 1;
            }
        }
        if let Some(window) = self.windows.get_mut(&handle) {
            window.rkey = new_rkey;
            window.binding = target;
        }
        Ok(())
    }

    /// The region with local key `lkey`.
    pub fn by_lkey(&self, lkey: u32) -> Option<&Region> {
        self.by_lkey
            .get(&lkey)
            .and_then(|&i| self.regions[i].as_ref())
            .map(|slot| &slot.region)
    }

    /// The number of registered regions.
    pub fn len(&self) -> usize {
        self.by_lkey.len()
    }

    /// Whether no region is registered.
    pub fn is_empty(&self) -> bool {
        self.by_lkey.is_empty()
    }

    /// How many accesses to registered memory faulted because the application had
    /// unmapped (or freed, or re-protected) it; each failed with [`MemError::Fault`] and
    /// left the process running. Accesses refused afterwards because their region had
    /// faulted are not counted.
    pub fn faulted_accesses(&self) -> u64 {
        self.faulted_accesses.load(Ordering::Relaxed)
    }

    /// How many payload bytes writes into the table's regions took straight from the
    /// registered region of a sender of this process (`MemoryTable::supply_from`): one
    /// copy from region to region, no packet buffer between.
    pub fn direct_payload_bytes(&self) -> u64 {
        self.direct_payload_bytes.load(Ordering::Relaxed)
    }

    /// How many accesses to on-demand paging regions met a page that was not mapped (or
    /// not writable, for a write) at the time: the page fault a NIC cannot resolve. Each
    /// failed (remote access error NAK, `IBV_WC_LOC_PROT_ERR`) and left the region as it
    /// was, so a later access, once the page is mapped, succeeds.
    pub fn unresolved_page_faults(&self) -> u64 {
        self.unresolved_page_faults.load(Ordering::Relaxed)
    }

    /// The index and slot of the region of `key`.
    #[inline]
    fn slot(&self, key: MemKey) -> Result<(usize, &Slot), MemError> {
        let index = *match key {
            MemKey::Local(k) => self.by_lkey.get(&k),
            MemKey::Remote(k) => self.by_rkey.get(&k),
        }
        .ok_or(MemError::InvalidKey)?;
        let slot = self.regions[index].as_ref().ok_or(MemError::InvalidKey)?;
        Ok((index, slot))
    }
}
