//! The memory trait the device implements, through which the engine reaches registered
//! memory.
//!
//! The engine never holds a pointer: every access names the protection domain of the QP
//! making it, a key (an L_Key for the local side of a work request, an R_Key for a remote
//! request) and an address range, and the implementation checks key, protection domain,
//! bounds and access rights before it touches a byte. The engine additionally checks whole
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

/// Registered memory as the engine sees it. Implemented by the device (over real
/// registrations) and by the simulator (over in-memory regions).
///
/// Contract: every method takes `pd`, the protection domain of the QP making the access,
/// and validates its key, that the key's region belongs to `pd` (else
/// [`MemError::PdMismatch`]), the range, and the access rights it needs (local read needs
/// nothing; local write `LOCAL_WRITE`; remote read / write / atomic the corresponding
/// `REMOTE_*` flag); it returns an error without touching memory when they fail. Zero-length
/// accesses are always valid and touch nothing.
///
/// The PD is always the QP's own, also for receive WQEs taken from a shared receive queue:
/// rxe's behaviour (it scatters SRQ receives with the QP's PD). A device that checks SRQ
/// receives against the SRQ's PD gives the same answer whenever the SRQ is in the QP's PD,
/// which the safe API requires (the C API, like the kernel, does not check it).
pub trait Memory {
    /// Is `[addr, addr + len)` inside the region of L_Key `lkey` in `pd`, with `need`
    /// granted?
    fn check_local(
        &self,
        pd: u32,
        lkey: u32,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(), MemError>;

    /// Is `[va, va + len)` inside the region of R_Key `rkey` in `pd`, with `need` granted?
    fn check_remote(
        &self,
        pd: u32,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(), MemError>;

    /// Copies `buf.len()` bytes starting at `addr` into `buf` (local read or remote read)
    /// from the region of `key` in `pd`.
    fn read(&self, pd: u32, key: MemKey, addr: u64, buf: &mut [u8]) -> Result<(), MemError>;

    /// Copies `data` to `addr` (local write or remote write) in the region of `key` in
    /// `pd`.
    fn write(&mut self, pd: u32, key: MemKey, addr: u64, data: &[u8]) -> Result<(), MemError>;

    /// Executes an atomic on the 8-byte, 8-byte-aligned word at `va` of the region of
    /// `rkey` in `pd` (native byte order, reference §1.3), serialised against every other
    /// atomic; returns the original value.
    fn atomic(&mut self, pd: u32, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, MemError>;

    /// Invalidates R_Key `rkey` (send with invalidate). Fails if no region or window of
    /// `pd` has it: a peer may invalidate only keys of the PD of the QP it talks to
    /// (rdmavt's `rvt_invalidate_rkey` checks the PD too; rxe does not).
    fn invalidate(&mut self, pd: u32, rkey: u32) -> Result<(), MemError>;
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
