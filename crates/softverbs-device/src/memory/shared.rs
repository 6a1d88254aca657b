//! The copies into and out of application (shared) memory, [`copy_from_shared`] and
//! [`copy_to_shared`], both through [`guarded::copy`], so a race with the application is
//! a race on values, never undefined behaviour, and a page that is not mapped is reported
//! ([`Faulted`]) instead of killing the process (x86-64).

use crate::guarded::{self, Faulted};

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
