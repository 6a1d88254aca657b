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

use crate::guarded::{self, Faulted};
use crate::mappings::{self, MappingError, MemlockError, Pinned};
use softverbs_proto::{AccessFlags, AtomicOp, MemError, MemKey, Memory};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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

impl Region {
    /// The offset of `[va, va + len)` inside the region, if it is inside.
    fn offset(&self, va: u64, len: u64) -> Result<usize, MemError> {
        let start = va.checked_sub(self.iova).ok_or(MemError::OutOfBounds)?;
        let end = start.checked_add(len).ok_or(MemError::OutOfBounds)?;
        if end > self.len {
            return Err(MemError::OutOfBounds);
        }
        usize::try_from(start).map_err(|_| MemError::OutOfBounds)
    }
}

/// Why a registration was refused. [`RegisterError::errno`] is what rdma-core's
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
}

impl RegisterError {
    /// The errno libibverbs reports: `EINVAL` (bad flags or range), `EFAULT` (a page not
    /// mapped with the access asked), `ENOMEM` (over `RLIMIT_MEMLOCK`; no randomness),
    /// `EPERM` (a zero `RLIMIT_MEMLOCK`).
    pub const fn errno(&self) -> i32 {
        match self {
            RegisterError::MissingLocalWrite
            | RegisterError::ZeroLength
            | RegisterError::BadRange => libc::EINVAL,
            RegisterError::Unmapped { .. }
            | RegisterError::NotReadable { .. }
            | RegisterError::NotWritable { .. } => libc::EFAULT,
            RegisterError::OverMemlock { .. } | RegisterError::NoRandomness => libc::ENOMEM,
            RegisterError::MemlockNotPermitted => libc::EPERM,
        }
    }
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

/// A region in the table, with what the table keeps about it.
#[derive(Debug)]
struct Slot {
    region: Region,
    /// An access faulted: the memory is gone, refuse every access without touching it.
    faulted: AtomicBool,
    /// Its pages in the process's pinned count.
    pinned: Pinned,
}

/// The table of registered regions of one device.
#[derive(Debug, Default)]
pub struct MemoryTable {
    regions: Vec<Option<Slot>>,
    by_lkey: HashMap<u32, usize>,
    by_rkey: HashMap<u32, usize>,
    /// Accesses that faulted (the application unmapped registered memory).
    faulted_accesses: AtomicU64,
}

impl Drop for MemoryTable {
    fn drop(&mut self) {
        for slot in self.regions.drain(..).flatten() {
            mappings::release_pages(slot.pinned);
        }
    }
}

/// Copies `dst.len()` bytes from shared (application) memory at `src` into `dst`
/// ([`guarded::copy`]: on x86-64 one `rep movsb`, opaque to the compiler, so a concurrent
/// writer makes the values unspecified, never the behaviour). Returns [`Faulted`] if a page
/// of the source is not mapped readable (x86-64; elsewhere relaxed atomic 64-bit words, not
/// fault tolerant).
///
/// # Safety
///
/// Whatever of `src .. src + dst.len()` is mapped may be read for the duration of the call,
/// and every concurrent access to it is atomic, by this module's functions, or by the
/// application outside Rust's view (on targets other than x86-64 the range must be
/// mapped, and the aligned 64-bit words covering it accessed only atomically).
pub unsafe fn copy_from_shared(src: *const u8, dst: &mut [u8]) -> Result<(), Faulted> {
    // SAFETY: forwarded contract; `dst` is an exclusive slice of engine memory, disjoint
    // from the shared range.
    unsafe { guarded::copy(dst.as_mut_ptr(), src, dst.len()) }
}

/// Copies `src` into shared (application) memory at `dst`, never changing a byte outside
/// `dst .. dst + src.len()`; returns [`Faulted`] if a page of the target is not mapped
/// writable (x86-64; see [`copy_from_shared`]).
///
/// # Safety
///
/// Whatever of `dst .. dst + src.len()` is mapped may be written for the duration of the
/// call, and every concurrent access to it is atomic, by this module's functions, or by
/// the application outside Rust's view (on targets other than x86-64 the range must be
/// mapped, and the aligned 64-bit words covering it accessed only atomically).
pub unsafe fn copy_to_shared(src: &[u8], dst: *mut u8) -> Result<(), Faulted> {
    // SAFETY: forwarded contract; `src` is engine memory, disjoint from the shared range.
    unsafe { guarded::copy(dst, src.as_ptr(), src.len()) }
}

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
    /// Refused, touching nothing, as a kernel device refuses it (`ibv_reg_mr(3)`; errno
    /// from [`RegisterError::errno`]): remote write or atomic without local write; an
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
    pub unsafe fn register(
        &mut self,
        pd: u32,
        addr: usize,
        len: u64,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Region, RegisterError> {
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
        if iova.checked_add(len).is_none() || (end - addr / page * page) / page > u32::MAX as usize
        {
            return Err(RegisterError::BadRange);
        }
        // The kernel (ib_umem_get) charges the pages to RLIMIT_MEMLOCK before it pins
        // them: over the limit is ENOMEM even when the pages are not there.
        let pinned = mappings::reserve_pages(addr, size)?;
        let writable = access.intersects(
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_ATOMIC
                | AccessFlags::MW_BIND,
        );
        let keys = mappings::check_mapped(addr, size, writable)
            .map_err(RegisterError::from)
            .and_then(|()| Ok((self.fresh_key(true)?, self.fresh_key(false)?)));
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
            faulted: AtomicBool::new(false),
            pinned,
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
                self.by_rkey.contains_key(&key)
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

    fn slot(&self, key: MemKey) -> Result<&Slot, MemError> {
        let index = match key {
            MemKey::Local(k) => self.by_lkey.get(&k),
            MemKey::Remote(k) => self.by_rkey.get(&k),
        }
        .ok_or(MemError::InvalidKey)?;
        self.regions[*index].as_ref().ok_or(MemError::InvalidKey)
    }

    fn region(&self, key: MemKey) -> Result<&Region, MemError> {
        self.slot(key).map(|slot| &slot.region)
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    fn table_with(buf: &mut [u8], access: AccessFlags) -> (MemoryTable, Region) {
        let mut t = MemoryTable::new();
        // SAFETY: `buf` outlives the table in every test that uses it.
        let r = unsafe {
            t.register(
                1,
                buf.as_mut_ptr() as usize,
                buf.len() as u64,
                0x1000,
                access,
            )
        }
        .unwrap();
        (t, r)
    }

    #[test]
    fn remote_write_without_local_write_is_refused_at_registration() {
        // ibv_reg_mr(3): "If IBV_ACCESS_REMOTE_WRITE or IBV_ACCESS_REMOTE_ATOMIC is set,
        // then IBV_ACCESS_LOCAL_WRITE must be set too."
        let mut buf = [0u8; 8];
        let mut t = MemoryTable::new();
        // SAFETY: refused before anything is recorded.
        let err = unsafe {
            t.register(
                1,
                buf.as_mut_ptr() as usize,
                8,
                0,
                AccessFlags::REMOTE_WRITE,
            )
        };
        assert_eq!(err, Err(RegisterError::MissingLocalWrite));
    }

    #[test]
    fn keys_are_distinct_random_and_lkey_differs_from_rkey() {
        let mut buf = [0u8; 64];
        let mut t = MemoryTable::new();
        let mut keys = std::collections::HashSet::new();
        for _ in 0..32 {
            // SAFETY: `buf` outlives `t`.
            let r = unsafe {
                t.register(
                    1,
                    buf.as_mut_ptr() as usize,
                    64,
                    0,
                    AccessFlags::LOCAL_WRITE,
                )
            }
            .unwrap();
            assert!(keys.insert(r.lkey));
            assert!(keys.insert(r.rkey));
        }
    }

    #[test]
    fn remote_access_outside_the_region_or_without_rights_touches_nothing() {
        let mut buf = [7u8; 16];
        let (mut t, r) = table_with(
            &mut buf,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        );
        let mut out = [0u8; 8];
        assert_eq!(t.read(1, MemKey::Remote(r.rkey), 0x1008, &mut out), Ok(()));
        assert_eq!(
            t.read(1, MemKey::Remote(r.rkey), 0x100c, &mut out),
            Err(MemError::OutOfBounds)
        );
        assert_eq!(
            t.read(1, MemKey::Remote(r.rkey), 0x0ff8, &mut out),
            Err(MemError::OutOfBounds)
        );
        assert_eq!(
            t.write(1, MemKey::Remote(r.rkey), 0x1000, &[1, 2]),
            Err(MemError::AccessDenied)
        );
        assert_eq!(
            t.read(1, MemKey::Remote(r.rkey ^ 1), 0x1000, &mut out),
            Err(MemError::InvalidKey)
        );
        assert_eq!(buf, [7u8; 16]);
    }

    #[test]
    fn atomics_are_aligned_checked_and_return_the_original_value() {
        let mut buf = [0u64; 2];
        let bytes = 16;
        let mut t = MemoryTable::new();
        // SAFETY: `buf` outlives `t`.
        let r = unsafe {
            t.register(
                1,
                buf.as_mut_ptr() as usize,
                bytes,
                0,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
            )
        }
        .unwrap();
        assert_eq!(t.atomic(1, r.rkey, 8, AtomicOp::FetchAdd { add: 5 }), Ok(0));
        assert_eq!(
            t.atomic(
                1,
                r.rkey,
                8,
                AtomicOp::CompareSwap {
                    compare: 5,
                    swap: 9
                }
            ),
            Ok(5)
        );
        assert_eq!(
            t.atomic(1, r.rkey, 4, AtomicOp::FetchAdd { add: 1 }),
            Err(MemError::Misaligned)
        );
        assert_eq!(
            t.atomic(1, r.rkey, 16, AtomicOp::FetchAdd { add: 1 }),
            Err(MemError::OutOfBounds)
        );
        assert_eq!(buf, [0, 9]);
    }

    #[test]
    fn shared_copies_move_every_byte_at_any_alignment_and_touch_nothing_else() {
        let src: Vec<u8> = (0..100u8).collect();
        for start in 0..9 {
            for len in [0, 1, 7, 8, 9, 31, 64, 90] {
                // Word-aligned backing store, as registered memory of the safe API is.
                let mut words = vec![u64::from_ne_bytes([0xee; 8]); 14];
                // SAFETY: viewing the vector's words as bytes; it outlives `region`.
                let region: &mut [u8] =
                    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut u8, 112) };
                // SAFETY: both ranges are inside live vectors of this test.
                let wrote = unsafe { copy_to_shared(&src[..len], region.as_mut_ptr().add(start)) };
                assert_eq!(wrote, Ok(()));
                assert_eq!(&region[start..start + len], &src[..len]);
                assert!(region[..start].iter().all(|&b| b == 0xee));
                assert!(region[start + len..].iter().all(|&b| b == 0xee));
                let mut out = vec![0u8; len];
                // SAFETY: as above.
                let read = unsafe { copy_from_shared(region.as_ptr().add(start), &mut out) };
                assert_eq!(read, Ok(()));
                assert_eq!(out, &src[..len]);
            }
        }
    }

    #[test]
    fn deregistered_keys_are_refused_and_ordinary_regions_cannot_be_invalidated() {
        let mut buf = [0u8; 8];
        let (mut t, r) = table_with(
            &mut buf,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        );
        // An ordinary region refuses invalidation and keeps its R_Key (IBTA 10.6.6).
        assert_eq!(t.invalidate(1, r.rkey), Err(MemError::NotInvalidatable));
        assert!(t.write(1, MemKey::Remote(r.rkey), 0x1000, &[1]).is_ok());
        assert!(t.write(1, MemKey::Local(r.lkey), 0x1000, &[1]).is_ok());
        t.deregister(r.lkey).unwrap();
        assert_eq!(
            t.write(1, MemKey::Local(r.lkey), 0x1000, &[1]),
            Err(MemError::InvalidKey)
        );
        assert!(t.is_empty());
    }

    /// IBTA vol. 1 ch. 10, protection domains: a key is valid for a QP only if its region
    /// is in the QP's PD. Every access naming a key of a region in another PD is refused
    /// (local and remote, read, write, atomic, invalidate, and the up-front checks) and
    /// touches nothing; the region's own PD still reaches it.
    #[test]
    fn a_key_of_a_region_in_another_pd_is_refused_and_touches_nothing() {
        let mut buf = [7u64; 2];
        let all = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_ATOMIC;
        let mut t = MemoryTable::new();
        // SAFETY: `buf` outlives `t`.
        let r = unsafe { t.register(1, buf.as_mut_ptr() as usize, 16, 0x1000, all) }.unwrap();
        let other = 2;
        let mut out = [0u8; 8];
        let refused = Err(MemError::PdMismatch);
        assert_eq!(t.check_local(other, r.lkey, 0x1000, 8, all), refused);
        assert_eq!(t.check_remote(other, r.rkey, 0x1000, 8, all), refused);
        assert_eq!(
            t.read(other, MemKey::Local(r.lkey), 0x1000, &mut out),
            refused
        );
        assert_eq!(
            t.read(other, MemKey::Remote(r.rkey), 0x1000, &mut out),
            refused
        );
        assert_eq!(t.write(other, MemKey::Local(r.lkey), 0x1000, &[1]), refused);
        assert_eq!(
            t.write(other, MemKey::Remote(r.rkey), 0x1000, &[1]),
            refused
        );
        assert_eq!(
            t.atomic(other, r.rkey, 0x1000, AtomicOp::FetchAdd { add: 1 }),
            Err(MemError::PdMismatch)
        );
        assert_eq!(t.invalidate(other, r.rkey), refused);
        assert_eq!(out, [0; 8]);
        assert_eq!(buf, [7, 7]);
        // Its own PD: everything works, and the R_Key survived the refused invalidate.
        assert_eq!(t.check_remote(1, r.rkey, 0x1000, 16, all), Ok(()));
        assert_eq!(
            t.atomic(1, r.rkey, 0x1008, AtomicOp::FetchAdd { add: 1 }),
            Ok(7)
        );
        assert_eq!(buf, [7, 8]);
    }

    /// An anonymous private mapping of `pages` pages with `protection`, at an address no
    /// other test maps again once it is unmapped.
    fn map(pages: usize, protection: libc::c_int) -> usize {
        crate::mappings::map_far(pages, protection)
    }

    fn unmap(addr: usize, pages: usize) {
        // SAFETY: a mapping of this test.
        let unmapped = unsafe { libc::munmap(addr as *mut libc::c_void, pages * 4096) };
        assert_eq!(unmapped, 0);
    }

    /// ibv_reg_mr(3) on a kernel device: `ib_umem_get` refuses length 0 with EINVAL and
    /// `get_user_pages` refuses an unmapped page, or a page without write permission when
    /// the region asks for write access (FOLL_WRITE), with EFAULT.
    #[test]
    fn registration_refuses_empty_unmapped_and_unwritable_ranges_with_the_kernels_errno() {
        let all = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_ATOMIC;
        let mut t = MemoryTable::new();
        let mut buf = [0u64; 4];
        let at = buf.as_mut_ptr() as usize;
        // SAFETY: refused before anything is recorded.
        let empty = unsafe { t.register(1, at, 0, 0, all) };
        assert_eq!(empty, Err(RegisterError::ZeroLength));
        assert_eq!(RegisterError::ZeroLength.errno(), libc::EINVAL);

        let gone = map(2, libc::PROT_READ | libc::PROT_WRITE);
        unmap(gone, 2);
        // SAFETY: refused: the range is not mapped.
        let unmapped = unsafe { t.register(1, gone + 8, 4096, 0, all) };
        assert_eq!(unmapped, Err(RegisterError::Unmapped { addr: gone + 8 }));
        assert_eq!(unmapped.unwrap_err().errno(), libc::EFAULT);

        let read_only = map(1, libc::PROT_READ);
        for write in [
            AccessFlags::LOCAL_WRITE,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
            AccessFlags::MW_BIND,
        ] {
            // SAFETY: refused: write access on a read-only mapping.
            let refused = unsafe { t.register(1, read_only, 4096, 0, write) };
            assert_eq!(refused, Err(RegisterError::NotWritable { addr: read_only }));
            assert_eq!(refused.unwrap_err().errno(), libc::EFAULT);
        }
        // SAFETY: the mapping outlives the region (deregistered below).
        let ok = unsafe { t.register(1, read_only, 4096, 0, AccessFlags::REMOTE_READ) }.unwrap();
        let mut out = [1u8; 8];
        assert_eq!(t.read(1, MemKey::Remote(ok.rkey), 8, &mut out), Ok(()));
        assert_eq!(out, [0; 8]);
        t.deregister(ok.lkey).unwrap();

        // Half mapped: 1 TiB over a small buffer.
        // SAFETY: refused: most of the range is not mapped.
        let huge = unsafe { t.register(1, at, 1 << 40, 0, all) };
        // EFAULT where the pages are missing (or not writable), ENOMEM where
        // RLIMIT_MEMLOCK applies (ib_umem_get charges the pages before pinning them).
        let errno = huge.map(|_| 0).unwrap_or_else(|e| e.errno());
        assert!(errno == libc::EFAULT || errno == libc::ENOMEM, "{huge:?}");
        assert!(t.is_empty());
        unmap(read_only, 1);
    }

    /// A region the application unmaps while registered: every access fails with
    /// `MemError::Fault` (the engine's REM_ACCESS_ERR NAK / LOC_PROT_ERR), the fault is
    /// counted once per faulting access, the process lives, and later accesses are refused
    /// without touching memory.
    #[test]
    fn accesses_to_a_region_unmapped_while_registered_fail_are_counted_and_fail_fast() {
        let all = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_ATOMIC;
        let mut t = MemoryTable::new();
        let mut regions = Vec::new();
        for _ in 0..3 {
            let addr = map(2, libc::PROT_READ | libc::PROT_WRITE);
            // SAFETY: the contract is broken on purpose below (munmap): that is the test.
            let r = unsafe { t.register(1, addr, 8192, 0x10_000, all) }.unwrap();
            unmap(addr, 2);
            regions.push(r);
        }
        let mut out = [0u8; 16];
        assert_eq!(
            t.write(1, MemKey::Remote(regions[0].rkey), 0x10_100, &[1; 16]),
            Err(MemError::Fault)
        );
        assert_eq!(
            t.read(1, MemKey::Remote(regions[1].rkey), 0x10_100, &mut out),
            Err(MemError::Fault)
        );
        assert_eq!(
            t.atomic(1, regions[2].rkey, 0x10_008, AtomicOp::FetchAdd { add: 1 }),
            Err(MemError::Fault)
        );
        assert_eq!(t.faulted_accesses(), 3);
        // Marked: refused up front, not faulting again.
        assert_eq!(
            t.check_local(1, regions[0].lkey, 0x10_000, 8, AccessFlags::empty()),
            Err(MemError::Fault)
        );
        assert_eq!(
            t.read(1, MemKey::Local(regions[0].lkey), 0x10_000, &mut out),
            Err(MemError::Fault)
        );
        assert_eq!(t.faulted_accesses(), 3);
        for r in regions {
            assert!(t.deregister(r.lkey).is_some());
        }
    }

    /// A region over two pages whose second page the application unmaps: a write
    /// spanning both lands in the region's part of the first page and fails at the
    /// second; nothing outside the region moves (the bytes before it, the page after it).
    #[test]
    fn a_write_over_a_partly_unmapped_region_changes_only_the_mapped_part_of_the_region() {
        let addr = map(3, libc::PROT_READ | libc::PROT_WRITE);
        // SAFETY: our three pages, mapped read-write.
        unsafe { std::ptr::write_bytes(addr as *mut u8, 0xee, 3 * 4096) };
        let mut t = MemoryTable::new();
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let start = addr + 4096 - 32;
        // SAFETY: page 1 is unmapped on purpose below; that is the test.
        let r = unsafe { t.register(1, start, 64, 0x2000, access) }.unwrap();
        unmap(addr + 4096, 1);
        assert_eq!(
            t.write(1, MemKey::Remote(r.rkey), 0x2000, &[1; 64]),
            Err(MemError::Fault)
        );
        // SAFETY: pages 0 and 2 are still mapped.
        let (page0, page2) = unsafe {
            (
                std::slice::from_raw_parts(addr as *const u8, 4096),
                std::slice::from_raw_parts((addr + 2 * 4096) as *const u8, 4096),
            )
        };
        assert!(page0[..4096 - 32].iter().all(|&b| b == 0xee));
        assert!(page0[4096 - 32..].iter().all(|&b| b == 1));
        assert!(page2.iter().all(|&b| b == 0xee));
        // Registering a range with an unmapped page is refused from now on.
        // SAFETY: refused.
        let again = unsafe { t.register(1, start, 64, 0, access) };
        assert_eq!(again, Err(RegisterError::Unmapped { addr: addr + 4096 }));
        t.deregister(r.lkey);
        unmap(addr, 1);
        unmap(addr + 2 * 4096, 1);
    }
}
