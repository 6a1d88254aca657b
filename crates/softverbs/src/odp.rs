//! On-demand paging regions (`ibv_reg_mr(3)` with `IBV_ACCESS_ON_DEMAND`) and their
//! prefetch (`ibv_advise_mr(3)`).
//!
//! An [`OdpMr`] registers memory the API does not own: a range of the address space that
//! need not be mapped yet ([`Pd::reg_mr_on_demand`]), or the whole address space (the
//! implicit region, [`Pd::reg_mr_implicit_on_demand`]). Nothing is pinned or charged to
//! `RLIMIT_MEMLOCK`, and each access of the device reaches whatever is mapped at its time.
//! An access to a page not mapped then fails as rxe fails an on-demand page fault it
//! cannot resolve (`rxe_odp_map_range_and_lock`: `EFAULT`, answered as an R_Key
//! violation): a peer's request completes at the peer with [`WcStatus::RemAccessErr`],
//! a local scatter/gather entry with [`WcStatus::LocProtErr`]; the region stays usable,
//! and once the page is mapped the next access reaches it. The device's accesses are
//! the guarded copies of every region, so an unmapped page never crashes the process
//! (on-demand paging is offered only where they are fault tolerant, x86-64;
//! elsewhere the registration is refused, `EOPNOTSUPP`).
//!
//! Creating one is `unsafe`: the device may then read (and, with write access, write)
//! memory the type system knows nothing about, so the caller promises that nothing in the
//! range is accessed in a way that conflicts with that — no Rust reference (`&T`,
//! `&mut T`) to memory there while the region lives, unless through atomics or
//! `UnsafeCell`s, as [`Mr`](crate::Mr) does with its own buffer. Everything after is
//! safe: the device checks keys, PDs, rights and bounds as for any region, and
//! [`Pd::advise_mr`] touches only registered on-demand memory, through the same guarded
//! accesses (a `PREFETCH_WRITE` adds 0 to a word with one locked instruction: a write
//! fault that changes no value).
//!
//! [`WcStatus::RemAccessErr`]: crate::WcStatus::RemAccessErr
//! [`WcStatus::LocProtErr`]: crate::WcStatus::LocProtErr

use crate::error::Error;
use crate::mr::RemoteAddr;
use crate::pd::Pd;
use softverbs_device::memory::{is_implicit, Advice, ADVISE_FLAG_FLUSH};
use softverbs_device::{DeviceError, Region};
use softverbs_proto::{AccessFlags, Sge, VerbsError};
use std::fmt;

/// An on-demand paging region over memory the program keeps for itself (`struct ibv_mr`
/// of an `IBV_ACCESS_ON_DEMAND` registration). Deregistered when dropped.
pub struct OdpMr {
    pd: Pd,
    region: Region,
    registered: bool,
}

impl fmt::Debug for OdpMr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OdpMr")
            .field("addr", &format_args!("{:#x}", self.region.addr))
            .field("len", &self.region.len)
            .field("lkey", &format_args!("{:#x}", self.region.lkey))
            .field("rkey", &format_args!("{:#x}", self.region.rkey))
            .field("access", &self.region.access)
            .finish()
    }
}

impl Pd {
    /// Registers `[addr, addr + len)` for on-demand paging (`ibv_reg_mr(3)` with
    /// `IBV_ACCESS_ON_DEMAND`, added to `access`); remote peers name its first byte
    /// `addr`. The range need not be mapped. Refused as the kernel's `ib_umem_odp_get`
    /// refuses it: length 0 (`EINVAL`), a range past the end of the address space
    /// (`EOVERFLOW`), remote write or atomic without local write (`EINVAL`); `EOPNOTSUPP`
    /// where on-demand paging is not offered.
    ///
    /// # Safety
    ///
    /// Until the returned region is dropped, the device may read — and, with
    /// `LOCAL_WRITE`, `REMOTE_WRITE` or `REMOTE_ATOMIC`, write — whatever memory is mapped
    /// in the range when an access comes. The caller ensures that no memory there is
    /// accessed in a way that conflicts with that (no Rust reference to it other than
    /// through atomics or `UnsafeCell`s) for as long as the region lives.
    #[allow(unsafe_code)]
    pub unsafe fn reg_mr_on_demand(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<OdpMr, Error> {
        let addr = addr.expose_provenance();
        // SAFETY: the caller's promise (this function's `# Safety`) is the device's
        // contract for an on-demand region: whatever is mapped in the range may be read
        // and written by the device until deregistration, which `OdpMr`'s drop does.
        let region = unsafe {
            self.inner.ctx.inner.device.reg_mr(
                self.inner.handle,
                addr,
                len as u64,
                addr as u64,
                access | AccessFlags::ON_DEMAND,
            )
        }?;
        Ok(OdpMr {
            pd: self.clone(),
            region,
            registered: true,
        })
    }

    /// Registers the whole address space for on-demand paging: the implicit region
    /// (`ibv_reg_mr(3)`: "addr should be 0 and length should be SIZE_MAX"), whose
    /// addresses are the process's own virtual addresses.
    ///
    /// # Safety
    ///
    /// As [`Pd::reg_mr_on_demand`] for every address of the process: until the region is
    /// dropped, a peer holding its R_Key (or a work request naming its L_Key) reaches any
    /// mapped memory with `access`. The caller ensures that only memory it is prepared to
    /// have read (and written, with write access) that way is ever named, for as long as
    /// the region lives; the key is as powerful as a pointer to anywhere.
    #[allow(unsafe_code)]
    pub unsafe fn reg_mr_implicit_on_demand(&self, access: AccessFlags) -> Result<OdpMr, Error> {
        // SAFETY: the caller's promise (this function's `# Safety`), for the whole
        // address space.
        let region = unsafe {
            self.inner.ctx.inner.device.reg_mr(
                self.inner.handle,
                0,
                usize::MAX as u64,
                0,
                access | AccessFlags::ON_DEMAND,
            )
        }?;
        Ok(OdpMr {
            pd: self.clone(),
            region,
            registered: true,
        })
    }

    /// `ibv_advise_mr(3)` on this protection domain: `advice` for the ranges `sges` name
    /// (each an address and length in the region of its lkey), synchronously when `flush`
    /// (`IBV_ADVISE_MR_FLAG_FLUSH`: the pages are faulted in, and the faults reported,
    /// before it returns). Refused as the kernel refuses it (the core's rule,
    /// `softverbs_device::memory::AdviseError` inside [`Error::Register`]): `EOPNOTSUPP`
    /// for an unknown advice, `ENOENT` for an lkey of no on-demand region of this
    /// device, `EPERM` for a region of another PD or `PREFETCH_WRITE` of a region
    /// without write access, and with `flush` `EFAULT` for a range outside its region or
    /// a page that cannot be mapped. An empty list does nothing.
    pub fn advise_mr(&self, advice: Advice, flush: bool, sges: &[Sge]) -> Result<(), Error> {
        let flags = if flush { ADVISE_FLAG_FLUSH } else { 0 };
        self.inner
            .ctx
            .inner
            .device
            .advise_mr(self.inner.handle, advice, flags, sges)
            .map_err(Error::from)
    }
}

impl OdpMr {
    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.region.lkey
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        self.region.rkey
    }

    /// The address of the first byte (0 for the implicit region).
    pub fn addr(&self) -> u64 {
        self.region.iova
    }

    /// The length in bytes (`u64::MAX` on 64-bit targets for the implicit region).
    pub fn len(&self) -> u64 {
        self.region.len
    }

    /// Always `false`: a region has at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether it is the implicit region of the whole address space.
    pub fn is_implicit(&self) -> bool {
        is_implicit(self.region.addr, self.region.len)
    }

    /// The access rights (with [`AccessFlags::ON_DEMAND`]).
    pub fn access(&self) -> AccessFlags {
        self.region.access
    }

    /// The protection domain it belongs to.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// Where a remote peer finds its first byte.
    pub fn remote(&self) -> RemoteAddr {
        RemoteAddr::new(self.addr(), self.rkey())
    }

    /// The scatter/gather entry for `len` bytes at address `addr` of the region (for
    /// [`Pd::advise_mr`]; the device checks it is inside the region).
    pub fn sge(&self, addr: u64, len: u32) -> Sge {
        Sge {
            addr,
            length: len,
            lkey: self.lkey(),
        }
    }

    /// Prefetches `len` bytes at address `addr` of the region ([`Pd::advise_mr`] of one
    /// entry, synchronous): `Ok` once the pages are present, `EFAULT` if one cannot be
    /// mapped (or the range leaves the region).
    pub fn prefetch(&self, addr: u64, len: u32, advice: Advice) -> Result<(), Error> {
        self.pd.advise_mr(advice, true, &[self.sge(addr, len)])
    }

    /// Deregisters the region (`ibv_dereg_mr(3)`); after it returns the device never
    /// touches the memory again. Dropping does the same, ignoring the outcome.
    pub fn dereg(mut self) -> Result<(), Error> {
        self.deregister()
    }

    fn deregister(&mut self) -> Result<(), Error> {
        if !self.registered {
            return Ok(());
        }
        self.registered = false;
        match self.pd.inner.ctx.inner.device.dereg_mr(self.region.lkey) {
            Ok(_) | Err(DeviceError::Verbs(VerbsError::NoSuchObject { .. })) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

impl Drop for OdpMr {
    fn drop(&mut self) {
        let _ = self.deregister();
    }
}
