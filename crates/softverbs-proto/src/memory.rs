//! The memory trait the device implements, through which the engine reaches registered
//! memory.
//!
//! The engine never holds a pointer: every access names a key (an L_Key for the local side
//! of a work request, an R_Key for a remote request) and an address range, and the
//! implementation checks key, bounds and access rights before it touches a byte. The
//! engine additionally checks whole ranges up front ([`Memory::check_local`],
//! [`Memory::check_remote`]) so that a request is either refused whole (a NAK or an error
//! completion) or executed whole. A failed check never touches memory.

use crate::types::AccessFlags;

/// Why a memory access was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum MemError {
    /// No region (or an invalidated one) has this key.
    #[error("invalid key")]
    InvalidKey,
    /// The range is not inside the region.
    #[error("out of bounds")]
    OutOfBounds,
    /// The region does not grant the access needed.
    #[error("access denied")]
    AccessDenied,
    /// An atomic address that is not 8-byte aligned.
    #[error("misaligned")]
    Misaligned,
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
/// Contract: every method validates its key, range and the access rights it needs (local
/// read needs nothing; local write `LOCAL_WRITE`; remote read / write / atomic the
/// corresponding `REMOTE_*` flag) and returns an error without touching memory when
/// they fail. Zero-length accesses are always valid and touch nothing.
pub trait Memory {
    /// Is `[addr, addr + len)` inside the region of L_Key `lkey`, with `need` granted?
    fn check_local(
        &self,
        lkey: u32,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(), MemError>;

    /// Is `[va, va + len)` inside the region of R_Key `rkey`, with `need` granted?
    fn check_remote(&self, rkey: u32, va: u64, len: u64, need: AccessFlags)
        -> Result<(), MemError>;

    /// Copies `buf.len()` bytes starting at `addr` into `buf` (local read or remote read).
    fn read(&self, key: MemKey, addr: u64, buf: &mut [u8]) -> Result<(), MemError>;

    /// Copies `data` to `addr` (local write or remote write).
    fn write(&mut self, key: MemKey, addr: u64, data: &[u8]) -> Result<(), MemError>;

    /// Executes an atomic on the 8-byte, 8-byte-aligned word at `va` (native byte order,
    /// reference §1.3), serialised against every other atomic; returns the original value.
    fn atomic(&mut self, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, MemError>;

    /// Invalidates R_Key `rkey` (send with invalidate). Fails if no region or window has it.
    fn invalidate(&mut self, rkey: u32) -> Result<(), MemError>;
}
