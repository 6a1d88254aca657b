//! Registered memory the API owns (`ibv_reg_mr(3)`, `ibv_dereg_mr(3)`).
//!
//! An [`Mr`] allocates its own page-aligned, zeroed buffer and registers it; the
//! application reaches the bytes only by copying ([`Mr::write_at`], [`Mr::read_at`]),
//! never through a `&[u8]` or `&mut [u8]`, because the device (a remote peer's RDMA write,
//! a receive, a read response) may write them at any time. The buffer is made of atomic
//! 64-bit words (pages of `AtomicU64`, allocated with safe code), and the copies are
//! relaxed atomic loads and stores, while the device's are plain moves in assembly opaque
//! to the compiler (`softverbs_device::guarded`), the same machine operations, so a race
//! between the application and the network is a race on values, never undefined
//! behaviour. The only `unsafe` is the registration itself
//! ([`Device::reg_mr`](softverbs_device::Device::reg_mr)).
//!
//! Registration is refused as on a kernel device: length 0
//! ([`RegisterError::ZeroLength`](softverbs_device::RegisterError::ZeroLength), `EINVAL`),
//! and past the process's `RLIMIT_MEMLOCK` without `CAP_IPC_LOCK`
//! ([`RegisterError::OverMemlock`](softverbs_device::RegisterError::OverMemlock), `ENOMEM`),
//! both inside [`Error::Register`](crate::Error::Register):
//! the pages of every region count, page-rounded, until the region is dropped.
//!
//! Dropping an `Mr` first deregisters it, then frees the buffer. Every device access goes
//! through the registration table under the device's lock, so once deregistration has
//! returned nothing touches the buffer: a work request still naming it fails with a
//! protection error completion (`IBV_WC_LOC_PROT_ERR`), and a remote access with a NAK.
//!
//! A region is re-registered in place (`ibv_rereg_mr(3)`) with [`Mr::rereg`] and its
//! shorthands [`Mr::rereg_access`], [`Mr::rereg_pd`] and [`Mr::rereg_len`] (a new buffer,
//! the translation change): they take `&mut self`, so no [`MrSlice`] — and no memory
//! window bound through one ([`crate::Mw`]) — can be alive meanwhile, and the keys stay.
//! A refused re-registration changes nothing: the region stays registered as it was.
//!
//! Work requests name memory as [`MrSlice`]s (`mr.slice(range)`), checked against the
//! region when they are made, and remote memory as a [`RemoteAddr`].

use crate::error::{Error, RangeError};
use crate::pd::Pd;
use softverbs_device::{DeviceError, Region, Rereg};
use softverbs_proto::{AccessFlags, Sge};
use softverbs_proto::{Object, VerbsError};
use std::fmt;
use std::ops::{Bound, RangeBounds};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

/// The alignment of every buffer an [`Mr`] allocates.
pub const PAGE_SIZE: usize = 4096;

const WORDS_PER_PAGE: usize = PAGE_SIZE / 8;

/// One page of the buffer: atomic words, so that the device's writes (through the
/// registered address) and the application's copies may race without undefined behaviour.
#[repr(C, align(4096))]
struct Page([AtomicU64; WORDS_PER_PAGE]);

impl Page {
    fn zeroed() -> Page {
        Page([const { AtomicU64::new(0) }; WORDS_PER_PAGE])
    }
}

/// Allocates `len` bytes (rounded up to whole pages) of zeroed pages, or `None` when the
/// allocator refuses.
fn allocate(len: usize) -> Option<Vec<Page>> {
    let pages = len.div_ceil(PAGE_SIZE);
    let mut buffer = Vec::new();
    buffer.try_reserve_exact(pages).ok()?;
    buffer.resize_with(pages, Page::zeroed);
    Some(buffer)
}

/// A registered memory region owning its buffer (`struct ibv_mr`).
///
/// ```
/// use softverbs::{AccessFlags, Context, DeviceConfig};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let mr = ctx.alloc_pd().reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)?;
/// mr.write_at(8, b"hello")?;
/// let mut out = [0u8; 5];
/// mr.read_at(8, &mut out)?;
/// assert_eq!(&out, b"hello");
/// assert_eq!(mr.addr() % 4096, 0);
/// assert!(mr.write_at(62, b"toolong").is_err()); // an error, never a panic
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Mr {
    pd: Pd,
    region: Region,
    len: usize,
    /// The registered memory: `len` bytes from the start of the first page. Freed (by
    /// dropping) only after deregistration is confirmed; leaked otherwise.
    pages: Vec<Page>,
    /// Still registered.
    registered: bool,
}

impl fmt::Debug for Mr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mr")
            .field("addr", &format_args!("{:#x}", self.region.addr))
            .field("len", &self.region.len)
            .field("lkey", &format_args!("{:#x}", self.region.lkey))
            .field("rkey", &format_args!("{:#x}", self.region.rkey))
            .field("access", &self.region.access)
            .finish()
    }
}

impl Mr {
    pub(crate) fn register(pd: &Pd, len: usize, access: AccessFlags) -> Result<Mr, Error> {
        // A zero length is the device's to refuse (`RegisterError::ZeroLength`); the buffer
        // has a page all the same.
        let pages = allocate(len.max(1)).ok_or(Error::NoMemory { bytes: len })?;
        let addr = pages.as_ptr().expose_provenance();
        // SAFETY: `addr .. addr + len` lies in `pages`, a heap allocation owned by the `Mr`
        // built below, which never moves or resizes it and drops it only after
        // `dereg_mr` has returned for this lkey (it leaks it if that is not confirmed).
        // The memory is made of `AtomicU64`s (inside `UnsafeCell`s), and the application
        // reaches it only through relaxed atomic loads and stores, like the device's own
        // accesses: nothing accesses it in conflict with the device.
        #[allow(unsafe_code)]
        let region = unsafe {
            pd.inner
                .ctx
                .inner
                .device
                .reg_mr(pd.inner.handle, addr, len as u64, addr as u64, access)
        }?;
        Ok(Mr {
            pd: pd.clone(),
            region,
            len,
            pages,
            registered: true,
        })
    }

    /// The region's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: a region has at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The local key, named by this side's work requests.
    pub fn lkey(&self) -> u32 {
        self.region.lkey
    }

    /// The remote key, which a peer names in RDMA reads, writes and atomics.
    pub fn rkey(&self) -> u32 {
        self.region.rkey
    }

    /// The address of the first byte, as work requests and remote peers name it.
    pub fn addr(&self) -> u64 {
        self.region.iova
    }

    /// The access rights the region was registered (or last re-registered) with.
    pub fn access(&self) -> AccessFlags {
        self.region.access
    }

    /// The protection domain the region belongs to.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), RangeError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(RangeError {
                start: offset,
                end: offset.saturating_add(len),
                len: self.len(),
            }),
        }
    }

    fn word(&self, index: usize) -> &AtomicU64 {
        &self.pages[index / WORDS_PER_PAGE].0[index % WORDS_PER_PAGE]
    }

    /// Copies `data` into the region at `offset`: whole words with relaxed atomic stores,
    /// the partial words at either end with an atomic read-modify-write that keeps the
    /// other bytes as they are.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<(), RangeError> {
        self.check(offset, data.len())?;
        let mut done = 0;
        while done < data.len() {
            let at = offset + done;
            let (index, skip) = (at / 8, at % 8);
            let n = (8 - skip).min(data.len() - done);
            let bytes = &data[done..done + n];
            let word = self.word(index);
            if n == 8 {
                let value = u64::from_ne_bytes(bytes.try_into().unwrap_or([0; 8]));
                word.store(value, Ordering::Relaxed);
            } else {
                // A partial word: merge under compare-and-swap, so a concurrent write of
                // the word's other bytes (by the device) is not undone.
                let _ = word.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                    let mut merged = old.to_ne_bytes();
                    merged[skip..skip + n].copy_from_slice(bytes);
                    Some(u64::from_ne_bytes(merged))
                });
            }
            done += n;
        }
        Ok(())
    }

    /// Copies `out.len()` bytes of the region at `offset` into `out` (relaxed atomic loads
    /// of whole words).
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<(), RangeError> {
        self.check(offset, out.len())?;
        let mut done = 0;
        while done < out.len() {
            let at = offset + done;
            let (index, skip) = (at / 8, at % 8);
            let n = (8 - skip).min(out.len() - done);
            let word = self.word(index).load(Ordering::Relaxed).to_ne_bytes();
            out[done..done + n].copy_from_slice(&word[skip..skip + n]);
            done += n;
        }
        Ok(())
    }

    /// The bytes of `range`, copied out.
    pub fn read_vec(&self, range: impl RangeBounds<usize>) -> Result<Vec<u8>, RangeError> {
        let (start, end) = self.bounds(range)?;
        let mut out = vec![0u8; end - start];
        self.read_at(start, &mut out)?;
        Ok(out)
    }

    /// The native-endian 64-bit word at `offset` (where atomics leave the original value).
    pub fn read_u64(&self, offset: usize) -> Result<u64, RangeError> {
        let mut word = [0u8; 8];
        self.read_at(offset, &mut word)?;
        Ok(u64::from_ne_bytes(word))
    }

    /// Writes a native-endian 64-bit word at `offset` (the target of remote atomics).
    pub fn write_u64(&self, offset: usize, value: u64) -> Result<(), RangeError> {
        self.write_at(offset, &value.to_ne_bytes())
    }

    /// Sets every byte of `range` to `byte`.
    pub fn fill(&self, range: impl RangeBounds<usize>, byte: u8) -> Result<(), RangeError> {
        let (start, end) = self.bounds(range)?;
        let chunk = [byte; 4096];
        let mut at = start;
        while at < end {
            let n = (end - at).min(chunk.len());
            self.write_at(at, &chunk[..n])?;
            at += n;
        }
        Ok(())
    }

    fn bounds(&self, range: impl RangeBounds<usize>) -> Result<(usize, usize), RangeError> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => self.len(),
        };
        if start > end || end > self.len() {
            return Err(RangeError {
                start,
                end,
                len: self.len(),
            });
        }
        Ok((start, end))
    }

    /// A part of the region for a work request's scatter/gather list. Fails if the range
    /// is outside the region or longer than `u32::MAX` bytes (one `ibv_sge`).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<MrSlice<'_>, RangeError> {
        let (start, end) = self.bounds(range)?;
        let len = u32::try_from(end - start).map_err(|_| RangeError {
            start,
            end,
            len: self.len(),
        })?;
        Ok(MrSlice {
            mr: self,
            offset: start,
            len,
        })
    }

    /// Where a remote peer finds this region's first byte: its address and rkey.
    pub fn remote(&self) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr(),
            rkey: self.rkey(),
        }
    }

    /// Deregisters the region (`ibv_dereg_mr(3)`) and frees its buffer. Dropping does the
    /// same, ignoring the outcome.
    pub fn dereg(mut self) -> Result<(), Error> {
        self.deregister_and_free()
    }

    fn deregister_and_free(&mut self) -> Result<(), Error> {
        if !self.registered {
            return Ok(());
        }
        match self.pd.inner.ctx.inner.device.dereg_mr(self.region.lkey) {
            // Deregistered now, or (NoSuch) no longer known to the device: either way the
            // device no longer reaches the buffer, which may be freed with the `Mr`.
            Ok(_) | Err(DeviceError::Verbs(VerbsError::NoSuchObject { .. })) => {
                self.registered = false;
                Ok(())
            }
            // Not confirmed: leak the buffer rather than free memory the device may use.
            Err(e) => {
                std::mem::forget(std::mem::take(&mut self.pages));
                self.registered = false;
                Err(e.into())
            }
        }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // Deregister first; the pages are freed after this, when the fields drop.
        let _ = self.deregister_and_free();
    }
}

/// A byte range of an [`Mr`], named by a work request (it becomes one `struct ibv_sge`).
///
/// ```
/// use softverbs::{AccessFlags, Context, DeviceConfig};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let mr = ctx.alloc_pd().reg_mr(4096, AccessFlags::LOCAL_WRITE)?;
/// let part = mr.slice(1024..2048)?;
/// assert_eq!(part.len(), 1024);
/// assert_eq!(part.addr(), mr.addr() + 1024);
/// assert_eq!(part.lkey(), mr.lkey());
/// assert!(mr.slice(4000..5000).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct MrSlice<'a> {
    mr: &'a Mr,
    offset: usize,
    len: u32,
}

impl<'a> MrSlice<'a> {
    /// The region the slice is part of.
    pub fn mr(&self) -> &'a Mr {
        self.mr
    }

    /// The offset of the slice in its region.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Its length in bytes.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of its first byte.
    pub fn addr(&self) -> u64 {
        self.mr.addr() + self.offset as u64
    }

    /// The region's local key.
    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }

    /// The scatter/gather entry it stands for.
    pub fn sge(&self) -> Sge {
        Sge {
            addr: self.addr(),
            length: self.len,
            lkey: self.lkey(),
        }
    }

    /// Where a remote peer finds this slice.
    pub fn remote(&self) -> RemoteAddr {
        self.mr.remote().offset(self.offset as u64)
    }
}

impl<'a> From<MrSlice<'a>> for Sge {
    fn from(slice: MrSlice<'a>) -> Sge {
        slice.sge()
    }
}

/// Remote memory as a peer announced it: an address in its region and the region's rkey.
/// It prints and parses as `ADDR:RKEY` in hexadecimal, for exchange over any channel.
///
/// ```
/// use softverbs::RemoteAddr;
/// let remote = RemoteAddr::new(0x7f00_1000, 0xabcd);
/// let text = remote.to_string();
/// assert_eq!(text.parse::<RemoteAddr>()?, remote);
/// assert_eq!(remote.offset(16).addr, 0x7f00_1010);
/// # Ok::<(), softverbs::ParseError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteAddr {
    /// Remote virtual address.
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
}

impl RemoteAddr {
    /// A remote address from the peer's values.
    pub const fn new(addr: u64, rkey: u32) -> Self {
        RemoteAddr { addr, rkey }
    }

    /// The address `bytes` further on, same key.
    pub const fn offset(self, bytes: u64) -> Self {
        RemoteAddr {
            addr: self.addr.wrapping_add(bytes),
            rkey: self.rkey,
        }
    }
}

impl fmt::Display for RemoteAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}:{:08x}", self.addr, self.rkey)
    }
}

/// Text that is not a [`RemoteAddr`] or [`RemoteInfo`](crate::RemoteInfo).
///
/// ```
/// let err = "12".parse::<softverbs::RemoteAddr>().unwrap_err();
/// assert_eq!(err.text, "12");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot parse {what} from {text:?}")]
pub struct ParseError {
    /// What was being parsed.
    pub what: &'static str,
    /// The text.
    pub text: String,
}

impl FromStr for RemoteAddr {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        let err = || ParseError {
            what: "remote address",
            text: s.to_owned(),
        };
        let (addr, rkey) = s.trim().split_once(':').ok_or_else(err)?;
        Ok(RemoteAddr {
            addr: u64::from_str_radix(addr, 16).map_err(|_| err())?,
            rkey: u32::from_str_radix(rkey, 16).map_err(|_| err())?,
        })
    }
}

/// What [`Mr::rereg`] changes, one field per `ibv_rereg_mr(3)` flag; `None` keeps what the
/// region has, and at least one field must be set.
#[derive(Clone, Copy, Debug, Default)]
pub struct MrChange<'a> {
    /// `IBV_REREG_MR_CHANGE_TRANSLATION`: a new zeroed, page-aligned buffer of this many
    /// bytes replaces the region's (the old one is freed once the device no longer
    /// reaches it); the region's address changes, its keys do not.
    pub len: Option<usize>,
    /// `IBV_REREG_MR_CHANGE_PD`: the protection domain the region moves to (of the
    /// same context).
    pub pd: Option<&'a Pd>,
    /// `IBV_REREG_MR_CHANGE_ACCESS`: the new access rights.
    pub access: Option<AccessFlags>,
}

impl Mr {
    /// Re-registers the region (`ibv_rereg_mr(3)`), changing what `change` sets at once,
    /// keeping the lkey and rkey. Refused, leaving the region registered as it was: an
    /// empty change ([`RegisterError::NothingToChange`](crate::error::RegisterError), `EINVAL`), a
    /// PD of another context ([`Error::ForeignObject`]), a zero length, access rights
    /// [`Pd::reg_mr`] would refuse, or a new buffer past `RLIMIT_MEMLOCK` (as
    /// [`Pd::reg_mr`] refuses them). A memory window bound to the region (which the
    /// kernel's verbs refuse too) cannot be: a window borrows the region it is bound to.
    ///
    /// ```
    /// use softverbs::{AccessFlags, Context, DeviceConfig, MrChange};
    /// let ctx = Context::open_with(DeviceConfig::in_process())?;
    /// let pd = ctx.alloc_pd();
    /// let mut mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE)?;
    /// let (lkey, rkey) = (mr.lkey(), mr.rkey());
    /// let other = ctx.alloc_pd();
    /// mr.rereg(MrChange { len: Some(8192), pd: Some(&other), access: Some(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ) })?;
    /// assert_eq!((mr.len(), mr.lkey(), mr.rkey()), (8192, lkey, rkey));
    /// assert!(mr.rereg(MrChange::default()).is_err()); // an error, never a panic
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn rereg(&mut self, change: MrChange<'_>) -> Result<(), Error> {
        if let Some(pd) = change.pd {
            if !pd.inner.ctx.same(&self.pd.inner.ctx) {
                return Err(Error::ForeignObject { object: Object::Pd });
            }
        }
        let pages = match change.len {
            Some(len) => Some(allocate(len.max(1)).ok_or(Error::NoMemory { bytes: len })?),
            None => None,
        };
        let translation = match (&pages, change.len) {
            (Some(pages), Some(len)) => {
                let addr = pages.as_ptr().expose_provenance();
                Some((addr, len as u64, addr as u64))
            }
            _ => None,
        };
        let rereg = Rereg {
            translation,
            pd: change.pd.map(Pd::handle),
            access: change.access,
        };
        // SAFETY: a new translation lies in `pages`, a heap allocation this `Mr` takes
        // below and keeps, never moved or resized, until deregistration has returned (as
        // `Mr::register`); it is made of `AtomicU64`s the application reaches only by
        // relaxed atomic copies. The old buffer is dropped only after the device has
        // confirmed (`Ok`) that it no longer reaches it; on a refusal the new buffer,
        // never registered, is the one dropped.
        #[allow(unsafe_code)]
        let region = unsafe {
            self.pd
                .inner
                .ctx
                .inner
                .device
                .rereg_mr(self.region.lkey, rereg)
        }?;
        self.region = region;
        if let (Some(pages), Some(len)) = (pages, change.len) {
            self.pages = pages;
            self.len = len;
        }
        if let Some(pd) = change.pd {
            self.pd = pd.clone();
        }
        Ok(())
    }

    /// [`Mr::rereg`] changing the access rights only (`IBV_REREG_MR_CHANGE_ACCESS`).
    pub fn rereg_access(&mut self, access: AccessFlags) -> Result<(), Error> {
        self.rereg(MrChange {
            access: Some(access),
            ..MrChange::default()
        })
    }

    /// [`Mr::rereg`] moving the region to `pd` only (`IBV_REREG_MR_CHANGE_PD`).
    pub fn rereg_pd(&mut self, pd: &Pd) -> Result<(), Error> {
        self.rereg(MrChange {
            pd: Some(pd),
            ..MrChange::default()
        })
    }

    /// [`Mr::rereg`] giving the region a new zeroed buffer of `len` bytes only
    /// (`IBV_REREG_MR_CHANGE_TRANSLATION`).
    pub fn rereg_len(&mut self, len: usize) -> Result<(), Error> {
        self.rereg(MrChange {
            len: Some(len),
            ..MrChange::default()
        })
    }
}

impl Pd {
    /// Allocates a zeroed, page-aligned buffer of `len` bytes and registers it with
    /// `access` (`ibv_reg_mr(3)`). `REMOTE_WRITE` and `REMOTE_ATOMIC` need `LOCAL_WRITE`.
    pub fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<Mr, Error> {
        Mr::register(self, len, access)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Context, DeviceConfig};

    /// Copies at every alignment and length agree with a plain byte array kept beside
    /// the region (the partial-word merges keep the neighbouring bytes).
    #[test]
    fn copies_at_every_alignment_match_a_shadow_array() {
        let ctx = Context::open_with(DeviceConfig::in_process()).unwrap();
        let mr = ctx
            .alloc_pd()
            .reg_mr(100, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let mut shadow = vec![0u8; 100];
        let mut seed = 1u32;
        for round in 0..2000u32 {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
            let offset = (seed >> 8) as usize % 100;
            let len = (seed >> 20) as usize % (101 - offset);
            let data: Vec<u8> = (0..len).map(|i| (round as usize + i) as u8).collect();
            mr.write_at(offset, &data).unwrap();
            shadow[offset..offset + len].copy_from_slice(&data);
            let mut out = vec![0u8; len];
            mr.read_at(offset, &mut out).unwrap();
            assert_eq!(out, data);
        }
        assert_eq!(mr.read_vec(..).unwrap(), shadow);
        assert_eq!(mr.addr() % PAGE_SIZE as u64, 0);
    }
}
