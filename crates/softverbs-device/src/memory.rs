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
//! Registered memory is shared with the application, which may read or write it while a
//! remote peer's RDMA write lands in it (that is what RDMA is for). So that such a race is
//! a race on values and never undefined behaviour, every copy into or out of a region is
//! made of relaxed atomic loads and stores of aligned 64-bit words ([`copy_from_shared`],
//! [`copy_to_shared`]; a partial word at an edge is merged with compare-and-swap). On x86-64
//! these are plain moves.

use softverbs_proto::{AccessFlags, AtomicOp, MemError, MemKey, Memory};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

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

/// Why a registration was refused.
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
pub enum RegisterError {
    /// `ibv_reg_mr(3)`: remote write or remote atomic access requires local write.
    #[error("REMOTE_WRITE or REMOTE_ATOMIC access requires LOCAL_WRITE")]
    MissingLocalWrite,
    /// A zero-length or wrapping range.
    #[error("invalid memory range")]
    BadRange,
    /// The operating system gave no randomness for a key.
    #[error("no randomness for a memory key")]
    NoRandomness,
}

impl RegisterError {
    /// The errno libibverbs reports: `EINVAL` (`ENOMEM` with no randomness).
    pub const fn errno(&self) -> i32 {
        match self {
            RegisterError::NoRandomness => 12,
            _ => 22,
        }
    }
}

/// The table of registered regions of one device.
#[derive(Debug, Default)]
pub struct MemoryTable {
    regions: Vec<Option<Region>>,
    by_lkey: HashMap<u32, usize>,
    by_rkey: HashMap<u32, usize>,
}

/// Copies `dst.len()` bytes from shared memory at `src` into `dst` with relaxed atomic
/// loads of whole aligned 64-bit words, so a concurrent writer makes the values unspecified,
/// never the behaviour. Bytes at unaligned edges are taken from the aligned word that holds
/// them, so every access to shared memory is the same size (the safe API's memory regions
/// are arrays of such words).
///
/// # Safety
///
/// The aligned 64-bit words covering `src .. src + dst.len()` must be valid for reads for
/// the duration of the call, and every concurrent access to them must be an atomic 64-bit
/// access or by this module's functions.
pub unsafe fn copy_from_shared(src: *const u8, dst: &mut [u8]) {
    let mut done = 0;
    while done < dst.len() {
        let at = src.wrapping_add(done);
        let skip = at as usize % 8;
        let word_ptr = at.wrapping_sub(skip) as *mut u64;
        let take = (8 - skip).min(dst.len() - done);
        // SAFETY: `word_ptr` is 8-byte aligned and is the word holding `at`, which the
        // contract makes valid for reads and accessed only atomically.
        let word = unsafe { AtomicU64::from_ptr(word_ptr) }.load(Ordering::Relaxed);
        dst[done..done + take].copy_from_slice(&word.to_ne_bytes()[skip..skip + take]);
        done += take;
    }
}

/// Copies `src` into shared memory at `dst` with relaxed atomic 64-bit stores; a partial
/// word at an edge is merged into its aligned word with compare-and-swap, so bytes outside
/// the range are never changed.
///
/// # Safety
///
/// The aligned 64-bit words covering `dst .. dst + src.len()` must be valid for reads and
/// writes for the duration of the call, and every concurrent access to them must be an
/// atomic 64-bit access or by this module's functions.
pub unsafe fn copy_to_shared(src: &[u8], dst: *mut u8) {
    let mut done = 0;
    while done < src.len() {
        let at = dst.wrapping_add(done);
        let skip = at as usize % 8;
        let word_ptr = at.wrapping_sub(skip) as *mut u64;
        let take = (8 - skip).min(src.len() - done);
        // SAFETY: `word_ptr` is 8-byte aligned and is the word holding `at`, which the
        // contract makes valid for reads and writes and accessed only atomically.
        let word = unsafe { AtomicU64::from_ptr(word_ptr) };
        if take == 8 {
            let value = u64::from_ne_bytes(src[done..done + 8].try_into().expect("8 bytes"));
            word.store(value, Ordering::Relaxed);
        } else {
            let _ = word.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                let mut bytes = old.to_ne_bytes();
                bytes[skip..skip + take].copy_from_slice(&src[done..done + take]);
                Some(u64::from_ne_bytes(bytes))
            });
        }
        done += take;
    }
}

fn random_u32() -> Result<u32, RegisterError> {
    let mut bytes = [0u8; 4];
    rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty())
        .map_err(|_| RegisterError::NoRandomness)?;
    Ok(u32::from_ne_bytes(bytes))
}

impl MemoryTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `[addr, addr + len)` under protection domain `pd`, remote peers naming
    /// its first byte `iova`. Returns the region with its new keys.
    ///
    /// # Safety
    ///
    /// The range must be memory of this process that stays allocated, and is not
    /// otherwise accessed in a way that conflicts with the device reading and writing it,
    /// until [`MemoryTable::deregister`] returns for its lkey. (This is the contract of
    /// `ibv_reg_mr(3)`; the safe API upholds it by owning the buffer.)
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
        if (addr as u64).checked_add(len).is_none() || iova.checked_add(len).is_none() {
            return Err(RegisterError::BadRange);
        }
        let lkey = self.fresh_key(true)?;
        let rkey = self.fresh_key(false)?;
        let region = Region {
            addr,
            len,
            iova,
            access,
            pd,
            lkey,
            rkey,
        };
        let index = match self.regions.iter().position(Option::is_none) {
            Some(free) => {
                self.regions[free] = Some(region);
                free
            }
            None => {
                self.regions.push(Some(region));
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
    /// touches its memory again.
    pub fn deregister(&mut self, lkey: u32) -> Option<Region> {
        let index = self.by_lkey.remove(&lkey)?;
        let region = self.regions[index].take()?;
        self.by_rkey.remove(&region.rkey);
        Some(region)
    }

    /// The region with local key `lkey`.
    pub fn by_lkey(&self, lkey: u32) -> Option<&Region> {
        self.by_lkey
            .get(&lkey)
            .and_then(|&i| self.regions[i].as_ref())
    }

    /// The number of registered regions.
    pub fn len(&self) -> usize {
        self.by_lkey.len()
    }

    /// Whether no region is registered.
    pub fn is_empty(&self) -> bool {
        self.by_lkey.is_empty()
    }

    fn region(&self, key: MemKey) -> Result<&Region, MemError> {
        let index = match key {
            MemKey::Local(k) => self.by_lkey.get(&k),
            MemKey::Remote(k) => self.by_rkey.get(&k),
        }
        .ok_or(MemError::InvalidKey)?;
        self.regions[*index].as_ref().ok_or(MemError::InvalidKey)
    }

    /// The region of `key` if it belongs to `pd` (a key of another PD is as good as none
    /// for the QP asking, IBTA ch. 10 protection domains; rxe's MR lookup compares the PDs
    /// the same way), grants `need` and holds `[va, va + len)`, with the offset of `va`.
    fn check(
        &self,
        pd: u32,
        key: MemKey,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(&Region, usize), MemError> {
        let region = self.region(key)?;
        if region.pd != pd {
            return Err(MemError::PdMismatch);
        }
        if !region.access.contains(need) {
            return Err(MemError::AccessDenied);
        }
        let offset = region.offset(va, len)?;
        Ok((region, offset))
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
        let (region, offset) = self.check(pd, key, addr, buf.len() as u64, need)?;
        // SAFETY: `check` proved `[offset, offset + buf.len())` lies inside the region, and
        // the registration contract keeps the region's memory valid while it is in the
        // table and accessed only atomically or through these copies.
        unsafe { copy_from_shared((region.addr as *const u8).add(offset), buf) };
        Ok(())
    }

    fn write(&mut self, pd: u32, key: MemKey, addr: u64, data: &[u8]) -> Result<(), MemError> {
        if data.is_empty() {
            return Ok(());
        }
        let need = match key {
            MemKey::Local(_) => AccessFlags::LOCAL_WRITE,
            MemKey::Remote(_) => AccessFlags::REMOTE_WRITE,
        };
        let (region, offset) = self.check(pd, key, addr, data.len() as u64, need)?;
        // SAFETY: as in `read`: the range is inside a registered region whose memory the
        // registration keeps valid; `data` is engine memory, not the region.
        unsafe { copy_to_shared(data, (region.addr as *mut u8).add(offset)) };
        Ok(())
    }

    fn atomic(&mut self, pd: u32, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, MemError> {
        if !va.is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        let (region, offset) =
            self.check(pd, MemKey::Remote(rkey), va, 8, AccessFlags::REMOTE_ATOMIC)?;
        let target = region.addr + offset;
        if !target.is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        // SAFETY: the 8 bytes are inside a registered region (checked), 8-byte aligned
        // (checked), and valid for the registration's life; `AtomicU64::from_ptr` makes the
        // read-modify-write atomic against other atomics on the same word.
        let word = unsafe { AtomicU64::from_ptr(target as *mut u64) };
        let original = match op {
            AtomicOp::CompareSwap { compare, swap } => {
                match word.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(v) | Err(v) => v,
                }
            }
            AtomicOp::FetchAdd { add } => word.fetch_add(add, Ordering::SeqCst),
        };
        Ok(original)
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
                unsafe { copy_to_shared(&src[..len], region.as_mut_ptr().add(start)) };
                assert_eq!(&region[start..start + len], &src[..len]);
                assert!(region[..start].iter().all(|&b| b == 0xee));
                assert!(region[start + len..].iter().all(|&b| b == 0xee));
                let mut out = vec![0u8; len];
                // SAFETY: as above.
                unsafe { copy_from_shared(region.as_ptr().add(start), &mut out) };
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
}
