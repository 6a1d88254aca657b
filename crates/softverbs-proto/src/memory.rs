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
use crate::wr::{FlushPlacement, FlushSelectivity};

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
    ///
    /// For an on-demand paging region (`IBV_ACCESS_ON_DEMAND`) it is a page fault that
    /// could not be resolved (the page is not mapped, or not writable for a write, at the
    /// time of the access): the same NAK or status (rxe's ODP path answers
    /// `RESPST_ERR_RKEY_VIOLATION`), but the region is not marked, and a later access
    /// reaches whatever is mapped then.
    #[error("memory of the region is no longer mapped")]
    Fault,
    /// The R_Key is a type 2 memory window's, bound through another QP than the one making
    /// the access: only that QP may use it (IBTA 10.6.7.2, type 2B windows; rxe's
    /// `rxe_lookup_mw` refuses `mw->qp != qp`). The engine treats it as an invalid key.
    #[error("R_Key of a type 2 memory window bound through another QP")]
    WrongQp,
}

/// Who makes an access: the protection domain of the QP making it and, where there is one,
/// the QP's number (a type 2 memory window answers only the QP it was bound through). A
/// bare PD (`u32`) converts into an accessor without a QP, which no type 2 window answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Accessor {
    /// The protection domain of the QP making the access.
    pub pd: u32,
    /// The QP making it.
    pub qpn: Option<u32>,
}

impl Accessor {
    /// QP `qpn` of protection domain `pd`.
    #[inline]
    pub const fn qp(pd: u32, qpn: u32) -> Self {
        Accessor { pd, qpn: Some(qpn) }
    }
}

impl From<u32> for Accessor {
    #[inline]
    fn from(pd: u32) -> Self {
        Accessor { pd, qpn: None }
    }
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
    /// For a type 2 memory window, the QP it was bound through: no other QP may use it
    /// ([`MemError::WrongQp`]). `None` for a region or a type 1 window.
    pub qp: Option<u32>,
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
            qp: None,
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
/// 1. the region belongs to `pd`, else [`MemError::PdMismatch`], and a type 2 window was
///    bound through the accessing QP, else [`MemError::WrongQp`];
/// 2. it grants `need`, else [`MemError::AccessDenied`];
/// 3. the range is inside it (and does not wrap), else [`MemError::OutOfBounds`];
/// 4. its memory is still there, else [`MemError::Fault`].
///
/// The key itself ([`MemError::InvalidKey`]) is checked before, by finding the region
/// ([`Memory::lookup`]); zero-length accesses never get here ([`Memory`]).
#[inline]
pub fn check_access(
    region: &RegionInfo,
    by: impl Into<Accessor>,
    addr: u64,
    len: u64,
    need: AccessFlags,
) -> Result<usize, MemError> {
    let by = by.into();
    if region.pd != by.pd {
        return Err(MemError::PdMismatch);
    }
    if region.qp.is_some() && region.qp != by.qpn {
        return Err(MemError::WrongQp);
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
    ///
    /// `buf` is always (part of) the payload of a packet the engine is building. An
    /// implementation may leave the bytes to be read when the packet is written where it
    /// goes (one copy from the region to the peer instead of two); it then forgets those
    /// it was asked for since the last packet when the engine calls
    /// [`abandon_reads`](Memory::abandon_reads).
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

    /// Writes the 8 bytes of `value` at `offset` of the region at once (a single 8-byte
    /// store no reader sees half of), after every earlier write: IBTA 1.5's ATOMIC WRITE.
    /// Called by [`atomic_write`](Memory::atomic_write) once the address is aligned and
    /// the word passed [`check_access`]. The provided body is a plain
    /// [`write_region`](Memory::write_region), right for an implementation no other thread
    /// reads (the simulator); the device overrides it with one atomic store.
    fn atomic_write_region(
        &mut self,
        region: Self::Handle,
        offset: usize,
        value: [u8; 8],
    ) -> Result<(), MemError> {
        self.write_region(region, offset, &value)
    }

    /// Makes every write placed so far in the region reach `placement` (IBTA 1.5's FLUSH):
    /// called by [`flush`](Memory::flush) once the range passed [`check_access`]. The
    /// provided body is a full memory fence: a device that places data with the CPU on
    /// receipt has placed every earlier write already, and the fence makes it globally
    /// visible. There is no persistent memory here, so a persistent flush is the same
    /// fence (the data is as persistent as the host's memory).
    fn flush_region(
        &mut self,
        region: Self::Handle,
        offset: usize,
        len: u64,
        placement: FlushPlacement,
    ) -> Result<(), MemError> {
        let _ = (region, offset, len, placement);
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

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
        by: impl Into<Accessor>,
        key: MemKey,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(Self::Handle, usize), MemError> {
        let (region, info) = self.lookup(key)?;
        let offset = check_access(&info, by, addr, len, need)?;
        Ok((region, offset))
    }

    /// Is `[addr, addr + len)` inside the region of L_Key `lkey` in `pd`, with `need`
    /// granted?
    #[inline]
    fn check_local(
        &self,
        by: impl Into<Accessor>,
        lkey: u32,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(), MemError> {
        if len == 0 {
            return Ok(());
        }
        self.checked(by, MemKey::Local(lkey), addr, len, need)
            .map(|_| ())
    }

    /// Is `[va, va + len)` inside the region of R_Key `rkey` in `pd`, with `need` granted?
    #[inline]
    fn check_remote(
        &self,
        by: impl Into<Accessor>,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(), MemError> {
        if len == 0 {
            return Ok(());
        }
        self.checked(by, MemKey::Remote(rkey), va, len, need)
            .map(|_| ())
    }

    /// Copies `buf.len()` bytes starting at `addr` into `buf` (local read or remote read)
    /// from the region of `key` in `pd`.
    #[inline]
    fn read(
        &self,
        by: impl Into<Accessor>,
        key: MemKey,
        addr: u64,
        buf: &mut [u8],
    ) -> Result<(), MemError> {
        if buf.is_empty() {
            return Ok(());
        }
        let need = access_needed(key, false);
        let (region, offset) = self.checked(by, key, addr, buf.len() as u64, need)?;
        self.read_region(region, offset, buf)
    }

    /// The packet being built will not be sent: the reads into it since the last packet
    /// sent are void (an implementation that leaves reads for later drops them). The
    /// engine calls it when a gather fails part way. The default does nothing.
    fn abandon_reads(&self) {}

    /// Copies `data` to `addr` (local write or remote write) in the region of `key` in
    /// `pd`.
    #[inline]
    fn write(
        &mut self,
        by: impl Into<Accessor>,
        key: MemKey,
        addr: u64,
        data: &[u8],
    ) -> Result<(), MemError> {
        if data.is_empty() {
            return Ok(());
        }
        let need = access_needed(key, true);
        let (region, offset) = self.checked(by, key, addr, data.len() as u64, need)?;
        self.write_region(region, offset, data)
    }

    /// Executes an atomic on the 8-byte, 8-byte-aligned word at `va` of the region of
    /// `rkey` in `pd` (native byte order, reference §1.3), serialised against every other
    /// atomic; returns the original value.
    #[inline]
    fn atomic(
        &mut self,
        by: impl Into<Accessor>,
        rkey: u32,
        va: u64,
        op: AtomicOp,
    ) -> Result<u64, MemError> {
        if !va.is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        let need = AccessFlags::REMOTE_ATOMIC;
        let (region, offset) = self.checked(by, MemKey::Remote(rkey), va, 8, need)?;
        self.atomic_region(region, offset, op)
    }

    /// ATOMIC WRITE (IBTA 1.5): writes the 8 bytes of `value` at once at the 8-byte-aligned
    /// `va` of the region of `rkey` in `pd`. The region must grant `REMOTE_WRITE` (rxe's
    /// `check_rkey` asks for `IB_ACCESS_REMOTE_WRITE`); the alignment is checked first,
    /// as for [`atomic`](Memory::atomic).
    #[inline]
    fn atomic_write(
        &mut self,
        by: impl Into<Accessor>,
        rkey: u32,
        va: u64,
        value: [u8; 8],
    ) -> Result<(), MemError> {
        if !va.is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        let need = AccessFlags::REMOTE_WRITE;
        let (region, offset) = self.checked(by, MemKey::Remote(rkey), va, 8, need)?;
        self.atomic_write_region(region, offset, value)
    }

    /// FLUSH (IBTA 1.5): the region of `rkey` in `pd` must grant the `FLUSH_*` rights of
    /// `placement` (rxe's `check_rkey`); for [`FlushSelectivity::Range`] `[va, va + len)`
    /// must be inside it (a zero length flushes nothing but still needs the key), for
    /// [`FlushSelectivity::Mr`] the whole region is flushed and `va`, `len` are not looked
    /// at (rxe skips its range check).
    #[inline]
    fn flush(
        &mut self,
        by: impl Into<Accessor>,
        rkey: u32,
        va: u64,
        len: u64,
        selectivity: FlushSelectivity,
        placement: FlushPlacement,
    ) -> Result<(), MemError> {
        let mut need = AccessFlags::empty();
        if placement.contains(FlushPlacement::GLOBAL) {
            need |= AccessFlags::FLUSH_GLOBAL;
        }
        if placement.contains(FlushPlacement::PERSISTENT) {
            need |= AccessFlags::FLUSH_PERSISTENT;
        }
        let (region, info) = self.lookup(MemKey::Remote(rkey))?;
        let (addr, len) = match selectivity {
            FlushSelectivity::Range => (va, len),
            FlushSelectivity::Mr => (info.start, info.len),
        };
        let offset = check_access(&info, by, addr, len, need)?;
        self.flush_region(region, offset, len, placement)
    }

    /// The memory window whose R_Key is `rkey` (exactly: a window's key changes with each
    /// bind), if the implementation has windows and `rkey` names one.
    fn window(&self, rkey: u32) -> Option<WindowInfo> {
        let _ = rkey;
        None
    }

    /// Gives the window of R_Key `rkey` the key `new_rkey` and `binding` (`None`: unbound).
    /// Called by [`bind_window`](Memory::bind_window) and the invalidations once the rules
    /// passed; an implementation without windows refuses ([`MemError::InvalidKey`]).
    fn set_window(
        &mut self,
        rkey: u32,
        new_rkey: u32,
        binding: Option<WindowBinding>,
    ) -> Result<(), MemError> {
        let _ = (rkey, new_rkey, binding);
        Err(MemError::InvalidKey)
    }

    /// Executes a bind (`ibv_bind_mw(3)` for a type 1 window, `IBV_WR_BIND_MW` for a type
    /// 2 window) for the QP `by`, after [`check_bind`]: on success the window has the R_Key
    /// [`WindowBind::bound_rkey`] and grants `bind.access` on `[bind.addr, bind.addr +
    /// bind.length)` of the region (a zero length unbinds a type 1 window).
    fn bind_window(&mut self, by: Accessor, bind: &WindowBind) -> Result<u32, BindError> {
        let window = self
            .window(bind.window_rkey)
            .ok_or(BindError::UnknownWindow)?;
        let region = if bind.length > 0 {
            let (_, region) = self
                .lookup(MemKey::Local(bind.mr_lkey))
                .map_err(|_| BindError::UnknownRegion)?;
            Some(region)
        } else {
            None
        };
        check_bind(&window, region.as_ref(), by, bind)?;
        let new_rkey = bind.bound_rkey();
        let binding = region.map(|_| WindowBinding {
            mr_lkey: bind.mr_lkey,
            addr: bind.addr,
            length: bind.length,
            access: bind.access & WINDOW_ACCESS,
            qp: match window.kind {
                WindowType::One => None,
                WindowType::Two => by.qpn,
            },
        });
        self.set_window(bind.window_rkey, new_rkey, binding)
            .map_err(|_| BindError::UnknownWindow)?;
        Ok(new_rkey)
    }

    /// `IBV_WR_LOCAL_INV` by the QP `by`: invalidates the type 2 window of R_Key `rkey`,
    /// which becomes free to bind again. Refused ([`MemError::InvalidKey`]) for a key no
    /// window has, [`MemError::PdMismatch`] for a window of another PD, and
    /// [`MemError::NotInvalidatable`] for a type 1 window (IBTA o10-37.2.26: only
    /// `ibv_bind_mw` changes a type 1 window) or a region registered with `ibv_reg_mr`.
    fn invalidate_local(&mut self, by: Accessor, rkey: u32) -> Result<(), MemError> {
        let Some(window) = self.window(rkey) else {
            // A region's key: it cannot be invalidated (not a fast-registered region).
            self.lookup(MemKey::Local(rkey))
                .or_else(|_| self.lookup(MemKey::Remote(rkey)))?;
            return Err(MemError::NotInvalidatable);
        };
        invalidate_window(self, &window, by.pd)
    }

    /// Invalidates R_Key `rkey` (send with invalidate). Fails if no region or window of
    /// `pd` has it: a peer may invalidate only keys of the PD of the QP it talks to
    /// (rdmavt's `rvt_invalidate_rkey` checks the PD too; rxe does not). A type 2 window's
    /// key is invalidated (the window is unbound and free to bind again, as rxe's
    /// `rxe_invalidate_mw`); a type 1 window's or a region's is refused
    /// ([`MemError::NotInvalidatable`]).
    fn invalidate(&mut self, pd: u32, rkey: u32) -> Result<(), MemError> {
        if let Some(window) = self.window(rkey) {
            return invalidate_window(self, &window, pd);
        }
        let (region, info) = self.lookup(MemKey::Remote(rkey))?;
        if info.pd != pd {
            return Err(MemError::PdMismatch);
        }
        self.invalidate_region(region)
    }
}

/// The rule of both invalidations of a window: of the invalidating QP's PD, type 2.
fn invalidate_window<M: Memory + ?Sized>(
    mem: &mut M,
    window: &WindowInfo,
    pd: u32,
) -> Result<(), MemError> {
    if window.pd != pd {
        return Err(MemError::PdMismatch);
    }
    if window.kind == WindowType::One {
        return Err(MemError::NotInvalidatable);
    }
    mem.set_window(window.rkey, window.rkey, None)
}

/// The access rights a window can grant (`ibv_bind_mw(3)`, `mw_access_flags`): remote
/// read, write and atomic. Other bits are ignored, as rxe ignores them.
pub const WINDOW_ACCESS: AccessFlags = AccessFlags::REMOTE_READ
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_ATOMIC);

/// A memory window's type (`enum ibv_mw_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WindowType {
    /// `IBV_MW_TYPE_1`: bound with `ibv_bind_mw(3)`, tied to its PD.
    One,
    /// `IBV_MW_TYPE_2` (type 2B): bound with `IBV_WR_BIND_MW`, tied to the QP that bound
    /// it, invalidated with `IBV_WR_LOCAL_INV` or a SEND WITH INVALIDATE.
    Two,
}

impl WindowType {
    /// The `enum ibv_mw_type` value.
    pub const fn to_raw(self) -> u32 {
        match self {
            WindowType::One => 1,
            WindowType::Two => 2,
        }
    }

    /// From the `enum ibv_mw_type` value.
    pub const fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            1 => Some(WindowType::One),
            2 => Some(WindowType::Two),
            _ => None,
        }
    }
}

/// What the bind and invalidation rules need to know of a window ([`Memory::window`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WindowInfo {
    /// Its protection domain.
    pub pd: u32,
    /// Its type.
    pub kind: WindowType,
    /// Its R_Key now.
    pub rkey: u32,
    /// Bound to a region (a type 2 window that is not is "free").
    pub bound: bool,
}

/// A window's binding, as [`Memory::set_window`] records it after the rules passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WindowBinding {
    /// L_Key of the region it is bound to.
    pub mr_lkey: u32,
    /// First address it covers (in the region's address space: its `iova`).
    pub addr: u64,
    /// Its length in bytes (not zero).
    pub length: u64,
    /// The remote rights it grants ([`WINDOW_ACCESS`] bits only).
    pub access: AccessFlags,
    /// A type 2 window: the QP it was bound through, the only one that may use it.
    pub qp: Option<u32>,
}

/// A bind request (`struct ibv_mw_bind_info` with the window's keys), the operand of
/// [`SendOp::BindMw`](crate::SendOp::BindMw).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WindowBind {
    /// The window's R_Key when the bind was posted (names it).
    pub window_rkey: u32,
    /// The R_Key asked for: its low 8 bits (the key, `ibv_inc_rkey`) replace the window's.
    pub new_rkey: u32,
    /// Which verb posted it: `ibv_bind_mw` binds type 1 windows only, `IBV_WR_BIND_MW`
    /// type 2 windows only.
    pub kind: WindowType,
    /// L_Key of the region (ignored when `length` is 0).
    pub mr_lkey: u32,
    /// First address the window covers.
    pub addr: u64,
    /// Length; 0 unbinds a type 1 window.
    pub length: u64,
    /// Remote rights the window grants.
    pub access: AccessFlags,
}

impl WindowBind {
    /// The window's R_Key after the bind: its index bits with the new key's low 8 bits.
    pub const fn bound_rkey(&self) -> u32 {
        (self.window_rkey & !0xff) | (self.new_rkey & 0xff)
    }
}

/// Why a bind failed (the work request completes with `IBV_WC_MW_BIND_ERR`), one variant
/// per rule of [`check_bind`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum BindError {
    /// No window has the R_Key the bind names.
    #[error("no memory window has this R_Key")]
    UnknownWindow,
    /// `ibv_bind_mw` named a type 2 window, or `IBV_WR_BIND_MW` a type 1 window.
    #[error("a type {window} window cannot be bound with the type {verb} verb")]
    WrongType {
        /// The window's type.
        window: u32,
        /// The type the verb binds.
        verb: u32,
    },
    /// The window is not in the binding QP's protection domain (C10-72).
    #[error("the window is in another protection domain than the QP")]
    QpPdMismatch,
    /// A type 2 window already bound (o10-37.2.30: only a free one may be bound).
    #[error("the type 2 window is bound; invalidate it first")]
    AlreadyBound,
    /// A type 2 bind of zero length (o10-37.2.40).
    #[error("a type 2 window cannot be bound with zero length")]
    ZeroLength,
    /// No region has the L_Key, or it is of another protection domain than the window.
    #[error("no region of the window's protection domain has this L_Key")]
    UnknownRegion,
    /// The region was not registered with `IBV_ACCESS_MW_BIND` (C10-73).
    #[error("the region was registered without IBV_ACCESS_MW_BIND")]
    NoBindAccess,
    /// Remote write or atomic rights on a region without local write (C10-74).
    #[error("remote write or atomic rights need a region with local write")]
    WriteWithoutLocalWrite,
    /// The window's range is not inside the region (C10-75).
    #[error("the window's range is outside the region")]
    OutOfRegion,
}

/// The bind rules (IBTA vol. 1 10.6.7; rxe's `rxe_check_bind_mw`), in this order, for
/// `window`, bound by the QP `by` to `region` (the region of `bind.mr_lkey`, `None` when
/// `bind.length` is 0):
/// 1. the verb binds the window's type, else [`BindError::WrongType`];
/// 2. a type 2 window is in the QP's PD ([`BindError::QpPdMismatch`], C10-72), free
///    ([`BindError::AlreadyBound`], o10-37.2.30) and bound with a length
///    ([`BindError::ZeroLength`], o10-37.2.40);
/// 3. the region exists in the window's PD ([`BindError::UnknownRegion`]), was registered
///    with `MW_BIND` ([`BindError::NoBindAccess`], C10-73), has local write if the window
///    grants remote write or atomic ([`BindError::WriteWithoutLocalWrite`], C10-74), and
///    holds the whole range ([`BindError::OutOfRegion`], C10-75).
pub fn check_bind(
    window: &WindowInfo,
    region: Option<&RegionInfo>,
    by: Accessor,
    bind: &WindowBind,
) -> Result<(), BindError> {
    if window.kind != bind.kind {
        return Err(BindError::WrongType {
            window: window.kind.to_raw(),
            verb: bind.kind.to_raw(),
        });
    }
    if window.kind == WindowType::Two {
        if window.pd != by.pd {
            return Err(BindError::QpPdMismatch);
        }
        if window.bound {
            return Err(BindError::AlreadyBound);
        }
        if bind.length == 0 {
            return Err(BindError::ZeroLength);
        }
    }
    let Some(region) = region else {
        return if bind.length == 0 {
            Ok(())
        } else {
            Err(BindError::UnknownRegion)
        };
    };
    if region.pd != window.pd {
        return Err(BindError::UnknownRegion);
    }
    if !region.access.contains(AccessFlags::MW_BIND) {
        return Err(BindError::NoBindAccess);
    }
    if bind
        .access
        .intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
        && !region.access.contains(AccessFlags::LOCAL_WRITE)
    {
        return Err(BindError::WriteWithoutLocalWrite);
    }
    let end = bind.addr.checked_add(bind.length);
    let region_end = region.start.saturating_add(region.len);
    if bind.addr < region.start || end.is_none_or(|end| end > region_end) {
        return Err(BindError::OutOfRegion);
    }
    Ok(())
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

#[cfg(test)]
mod window_tests {
    use super::*;

    fn type_2(pd: u32) -> WindowInfo {
        WindowInfo {
            pd,
            kind: WindowType::Two,
            rkey: 0x1234_5600,
            bound: false,
        }
    }

    fn bind(addr: u64, length: u64) -> WindowBind {
        WindowBind {
            window_rkey: 0x1234_5600,
            new_rkey: 0x1234_5601,
            kind: WindowType::Two,
            mr_lkey: 9,
            addr,
            length,
            access: AccessFlags::REMOTE_READ,
        }
    }

    /// C10-75: the window's range must lie inside the region's; o10-37.2.40: a type 2
    /// window is never bound with zero length.
    #[test]
    fn bind_outside_the_region_or_of_zero_length_is_refused() {
        let region = RegionInfo::new(1, 0x1000, 0x1000, AccessFlags::MW_BIND);
        let by = Accessor::qp(1, 5);
        let window = type_2(1);
        assert_eq!(
            check_bind(&window, Some(&region), by, &bind(0x1000, 0x1000)),
            Ok(())
        );
        for (addr, len) in [(0xfff, 8), (0x1ff9, 8), (0x1000, 0x1001), (u64::MAX, 2)] {
            assert_eq!(
                check_bind(&window, Some(&region), by, &bind(addr, len)),
                Err(BindError::OutOfRegion),
                "{addr:#x}+{len}"
            );
        }
        assert_eq!(
            check_bind(&window, None, by, &bind(0, 0)),
            Err(BindError::ZeroLength)
        );
    }

    /// A type 2 window's binding answers only the QP that bound it (rxe's
    /// `rxe_lookup_mw`: `mw->qp != qp`).
    #[test]
    fn type_2_window_refuses_another_qp() {
        let mut info = RegionInfo::new(1, 0, 64, AccessFlags::REMOTE_READ);
        info.qp = Some(5);
        let need = AccessFlags::REMOTE_READ;
        assert_eq!(check_access(&info, Accessor::qp(1, 5), 0, 8, need), Ok(0));
        assert_eq!(
            check_access(&info, Accessor::qp(1, 6), 0, 8, need),
            Err(MemError::WrongQp)
        );
        assert_eq!(check_access(&info, 1, 0, 8, need), Err(MemError::WrongQp));
    }
}
