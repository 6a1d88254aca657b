//! The memory trait the device implements, through which the engine reaches registered
//! memory.
//!
//! The engine never holds a pointer: every access names the protection domain of the QP
//! making it, a key (an L_Key for the local side of a work request, an R_Key for a remote
//! request) and an address range, and key, protection domain, access rights and bounds are
//! checked, in that order and in one place ([`check_access`] and the provided methods of
//! [`Memory`]), before the implementation touches a byte. The engine additionally checks whole
//! ranges up front ([`Memory::check_local`], [`Memory::check_remote`]) so that a request is
//! either refused whole (a NAK or an error completion) or executed whole. A failed check
//! never touches memory.
//!
//! Protection domains: an L_Key or R_Key is valid for a QP only if its region belongs to
//! the QP's protection domain (IBTA vol. 1 ch. 10, protection domains: a QP may access a
//! memory region only if the PD assigned to the QP matches the region's; rxe's MR lookup
//! and rdmavt's key checks refuse a region of another PD). The engine passes the PD of the
//! QP doing the access ([`QpInit::pd`](crate::QpInit::pd)) to every method; a region of
//! another PD is refused as [`MemError::PdMismatch`], which the engine treats exactly as an
//! invalid key (the same NAK or completion status).

use crate::types::AccessFlags;

/// Why a memory access was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum MemError {
    /// No region (or an invalidated one) has this key.
    #[error("invalid key")]
    InvalidKey,
    /// A region has this key, but it belongs to another protection domain than the QP
    /// making the access: for that QP the key is invalid (same status as [`InvalidKey`]).
    ///
    /// [`InvalidKey`]: MemError::InvalidKey
    #[error("key of a region in another protection domain")]
    PdMismatch,
    /// The range is not inside the region.
    #[error("out of bounds")]
    OutOfBounds,
    /// The region does not grant the access needed.
    #[error("access denied")]
    AccessDenied,
    /// An atomic address that is not 8-byte aligned.
    #[error("misaligned")]
    Misaligned,
    /// SEND WITH INVALIDATE named the R_Key of a region that cannot be invalidated: only
    /// memory windows and fast-registered regions can (IBTA vol. 1 10.6.6 and o10-37.2.x;
    /// rxe refuses an ordinary `ibv_reg_mr` region). The engine treats it as an invalid
    /// request (NAK invalid request; the requester sees `REM_INV_REQ_ERR`).
    #[error("region cannot be invalidated")]
    NotInvalidatable,
    /// The region's memory is no longer mapped with the access needed: the application
    /// unmapped, freed or re-protected it while it was registered (`ibv_reg_mr(3)` forbids
    /// that; a kernel device keeps the pages pinned). The device's access faulted and was
    /// recovered (bytes before the fault, all inside the region, may have moved), and every
    /// later access to the region is refused the same way without touching memory. The
    /// engine treats it like any refused access (NAK remote access error for a remote
    /// request, `LOC_PROT_ERR` for a local scatter/gather entry).
    #[error("memory of the region is no longer mapped")]
    Fault,
}

/// A key naming a region, as the engine presents it to [`Memory`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemKey {
    /// An L_Key from a local scatter/gather entry.
    Local(u32),
    /// An R_Key from a remote request.
    Remote(u32),
}

impl MemKey {
    /// Whether this key is `lkey` (if it is an L_Key) or `rkey` (if it is an R_Key): the
    /// region with those keys is the one it names.
    #[inline]
    pub const fn names(self, lkey: u32, rkey: u32) -> bool {
        match self {
            MemKey::Local(k) => k == lkey,
            MemKey::Remote(k) => k == rkey,
        }
    }
}

/// The atomic operations a responder executes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomicOp {
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`: if the word equals `compare`, store `swap`.
    CompareSwap {
        /// Value compared with memory.
        compare: u64,
        /// Value stored on equality.
        swap: u64,
    },
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`: add `add` (wrapping).
    FetchAdd {
        /// Value added.
        add: u64,
    },
}

/// What the access rule needs to know of a region: [`check_access`] compares it with a
/// request. An implementation of [`Memory`] describes the region of a key this way
/// ([`Memory::lookup`]); everything else about the region (where its bytes are) stays the
/// implementation's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RegionInfo {
    /// The protection domain it belongs to.
    pub pd: u32,
    /// The address its first byte is named by (the I/O virtual address, `iova`, for a
    /// region registered with `ibv_reg_mr_iova2`).
    pub start: u64,
    /// Its length in bytes.
    pub len: u64,
    /// The access rights granted at registration.
    pub access: AccessFlags,
    /// Its memory is gone (an earlier access faulted, [`MemError::Fault`]): every access
    /// that passes the other checks is refused with [`MemError::Fault`].
    pub faulted: bool,
}

impl RegionInfo {
    /// A region of `pd` whose first byte is named `start`, `len` bytes long, granting
    /// `access`, its memory there (not [`faulted`](RegionInfo::faulted)).
    #[inline]
    pub const fn new(pd: u32, start: u64, len: u64, access: AccessFlags) -> Self {
        RegionInfo {
            pd,
            start,
            len,
            access,
            faulted: false,
        }
    }
}

/// The access rights an access with `key` needs: a local read nothing, a local write
/// `LOCAL_WRITE`, a remote read `REMOTE_READ`, a remote write `REMOTE_WRITE` (what rxe's
/// `copy_data` and `check_rkey` ask for). Atomics need
/// `REMOTE_ATOMIC` ([`Memory::atomic`]).
#[inline]
pub const fn access_needed(key: MemKey, write: bool) -> AccessFlags {
    match (key, write) {
        (MemKey::Local(_), false) => AccessFlags::empty(),
        (MemKey::Local(_), true) => AccessFlags::LOCAL_WRITE,
        (MemKey::Remote(_), false) => AccessFlags::REMOTE_READ,
        (MemKey::Remote(_), true) => AccessFlags::REMOTE_WRITE,
    }
}

/// The access rule, for a key already found to name `region`: may the QP of protection
/// domain `pd` access `[addr, addr + len)` with `need`? Returns the offset of `addr` in the
/// region.
///
/// The checks, in this order, each refusing with its own error (the order is the
/// contract's, [`Memory`]; a request failing several is refused for the first):
/// 1. the region belongs to `pd`, else [`MemError::PdMismatch`];
/// 2. it grants `need`, else [`MemError::AccessDenied`];
/// 3. the range is inside it (and does not wrap), else [`MemError::OutOfBounds`];
/// 4. its memory is still there, else [`MemError::Fault`].
///
/// The key itself ([`MemError::InvalidKey`]) is checked before, by finding the region
/// ([`Memory::lookup`]); zero-length accesses never get here ([`Memory`]).
#[inline]
pub fn check_access(
    region: &RegionInfo,
    pd: u32,
    addr: u64,
    len: u64,
    need: AccessFlags,
) -> Result<usize, MemError> {
    if region.pd != pd {
        return Err(MemError::PdMismatch);
    }
    if !region.access.contains(need) {
        return Err(MemError::AccessDenied);
    }
    let offset = addr
        .checked_sub(region.start)
        .ok_or(MemError::OutOfBounds)?;
    let end = offset.checked_add(len).ok_or(MemError::OutOfBounds)?;
    if end > region.len {
        return Err(MemError::OutOfBounds);
    }
    if region.faulted {
        return Err(MemError::Fault);
    }
    usize::try_from(offset).map_err(|_| MemError::OutOfBounds)
}

/// Registered memory as the engine sees it. Implemented by the device (over real
/// registrations) and by the simulator (over in-memory regions).
///
/// Contract: every access takes `pd`, the protection domain of the QP making it, and is
/// refused without touching memory unless it passes, in this order:
/// 1. an atomic's address is 8-byte aligned, else [`MemError::Misaligned`];
/// 2. the key names a valid region, else [`MemError::InvalidKey`];
/// 3. the region belongs to `pd`, else [`MemError::PdMismatch`];
/// 4. the region grants the access needed (local read nothing; local write
///    `LOCAL_WRITE`; remote read / write / atomic the corresponding `REMOTE_*` flag:
///    [`access_needed`]), else [`MemError::AccessDenied`];
/// 5. the range is inside the region, else [`MemError::OutOfBounds`];
/// 6. the region's memory is still there, else [`MemError::Fault`].
///
/// Zero-length accesses are always valid and touch nothing (not even the key is looked
/// at: a zero-length RDMA READ or WRITE need not carry a valid R_Key, IBTA C9-88 as rxe's
/// `check_rkey` cites it).
///
/// Access rights before bounds is rxe's order: its `lookup_mr` refuses a region of another
/// PD or without the access asked for as it refuses an unknown key, and `mr_check_range`
/// checks the range of the region it returned; it is also the order the device always had
/// (the simulator checked bounds first). The engine folds every refusal into the same NAK or completion
/// status, so the order shows only in the [`MemError`] (the trace) and in tests asking
/// for it; it is written once, in [`check_access`] and the provided methods below.
///
/// An implementation provides [`lookup`](Memory::lookup) (the region of a key) and the raw
/// accesses to a region found that way ([`read_region`](Memory::read_region),
/// [`write_region`](Memory::write_region), [`atomic_region`](Memory::atomic_region),
/// [`invalidate_region`](Memory::invalidate_region)); the provided methods, which the
/// engine calls and which an implementation does not override, apply the rule. The raw
/// accesses are safe methods: one that would be unsound for some handle or offset (a copy
/// through a pointer) must refuse it itself.
///
/// The PD is always the QP's own, also for receive WQEs taken from a shared receive queue:
/// rxe's behaviour (it scatters SRQ receives with the QP's PD). A device that checks SRQ
/// receives against the SRQ's PD gives the same answer whenever the SRQ is in the QP's PD,
/// which the safe API requires (the C API, like the kernel, does not check it).
pub trait Memory {
    /// How the implementation names a region [`lookup`](Memory::lookup) found, for the raw
    /// accesses (an index, typically).
    type Handle: Copy;

    /// The valid (registered, not invalidated) region of `key` (its L_Key or R_Key), else
    /// [`MemError::InvalidKey`].
    fn lookup(&self, key: MemKey) -> Result<(Self::Handle, RegionInfo), MemError>;

    /// Copies `buf.len()` bytes at `offset` of the region into `buf`. Called by
    /// [`read`](Memory::read) once the range passed [`check_access`], never empty.
    fn read_region(
        &self,
        region: Self::Handle,
        offset: usize,
        buf: &mut [u8],
    ) -> Result<(), MemError>;

    /// Copies `data` to `offset` of the region. Called by [`write`](Memory::write) once the
    /// range passed [`check_access`], never empty.
    fn write_region(
        &mut self,
        region: Self::Handle,
        offset: usize,
        data: &[u8],
    ) -> Result<(), MemError>;

    /// Executes `op` on the 8-byte word at `offset` of the region (native byte order,
    /// reference §1.3), serialised against every other atomic; returns the original value.
    /// Called by [`atomic`](Memory::atomic) once the address is aligned and the word passed
    /// [`check_access`].
    fn atomic_region(
        &mut self,
        region: Self::Handle,
        offset: usize,
        op: AtomicOp,
    ) -> Result<u64, MemError>;

    /// Invalidates the region (its R_Key): [`invalidate`](Memory::invalidate) found it in
    /// the right PD. [`MemError::NotInvalidatable`] if it is not a memory window or a
    /// fast-registered region.
    fn invalidate_region(&mut self, region: Self::Handle) -> Result<(), MemError>;

    /// The region of `key` and the offset of `addr` in it, if `[addr, addr + len)` may be
    /// accessed with `need` by a QP of `pd` (steps 2 to 6 of the contract; `len` is not
    /// zero).
    #[inline]
    fn checked(
        &self,
        pd: u32,
        key: MemKey,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(Self::Handle, usize), MemError> {
        let (region, info) = self.lookup(key)?;
        let offset = check_access(&info, pd, addr, len, need)?;
        Ok((region, offset))
    }

    /// Is `[addr, addr + len)` inside the region of L_Key `lkey` in `pd`, with `need`
    /// granted?
    #[inline]
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
        self.checked(pd, MemKey::Local(lkey), addr, len, need)
            .map(|_| ())
    }

    /// Is `[va, va + len)` inside the region of R_Key `rkey` in `pd`, with `need` granted?
    #[inline]
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
        self.checked(pd, MemKey::Remote(rkey), va, len, need)
            .map(|_| ())
    }

    /// Copies `buf.len()` bytes starting at `addr` into `buf` (local read or remote read)
    /// from the region of `key` in `pd`.
    #[inline]
    fn read(&self, pd: u32, key: MemKey, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        if buf.is_empty() {
            return Ok(());
        }
        let need = access_needed(key, false);
        let (region, offset) = self.checked(pd, key, addr, buf.len() as u64, need)?;
        self.read_region(region, offset, buf)
    }

    /// Copies `data` to `addr` (local write or remote write) in the region of `key` in
    /// `pd`.
    #[inline]
    fn write(&mut self, pd: u32, key: MemKey, addr: u64, data: &[u8]) -> Result<(), MemError> {
        if data.is_empty() {
            return Ok(());
        }
        let need = access_needed(key, true);
        let (region, offset) = self.checked(pd, key, addr, data.len() as u64, need)?;
        self.write_region(region, offset, data)
    }

    /// Executes an atomic on the 8-byte, 8-byte-aligned word at `va` of the region of
    /// `rkey` in `pd` (native byte order, reference §1.3), serialised against every other
    /// atomic; returns the original value.
    #[inline]
    fn atomic(&mut self, pd: u32, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, MemError> {
        if !va.is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        let need = AccessFlags::REMOTE_ATOMIC;
        let (region, offset) = self.checked(pd, MemKey::Remote(rkey), va, 8, need)?;
        self.atomic_region(region, offset, op)
    }

    /// Invalidates R_Key `rkey` (send with invalidate). Fails if no region or window of
    /// `pd` has it: a peer may invalidate only keys of the PD of the QP it talks to
    /// (rdmavt's `rvt_invalidate_rkey` checks the PD too; rxe does not).
    fn invalidate(&mut self, pd: u32, rkey: u32) -> Result<(), MemError> {
        let (region, info) = self.lookup(MemKey::Remote(rkey))?;
        if info.pd != pd {
            return Err(MemError::PdMismatch);
        }
        self.invalidate_region(region)
    }
}

/// Applies `op` to the word `orig`: the value an atomic stores (reference §1.3).
#[inline]
pub fn atomic_result(orig: u64, op: AtomicOp) -> u64 {
    match op {
        AtomicOp::CompareSwap { compare, swap } => {
            if orig == compare {
                swap
            } else {
                orig
            }
        }
        AtomicOp::FetchAdd { add } => orig.wrapping_add(add),
    }
}

/// Passes `result` on, logging a refusal (at debug level, with the QP and what was being
/// accessed): the engine folds every [`MemError`] into one NAK or status, so the trace is
/// where a key of another PD is told apart from an unknown key or a bad range.
pub(crate) fn traced<T>(
    qpn: u32,
    what: &'static str,
    result: Result<T, MemError>,
) -> Result<T, MemError> {
    if let Err(error) = &result {
        tracing::debug!(qpn, what, %error, "memory access refused");
    }
    result
}
