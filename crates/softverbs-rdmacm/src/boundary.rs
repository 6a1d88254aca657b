//! The edge between C and Rust: the panic boundary every export runs inside, `errno`, and
//! the failure conventions librdmacm uses (`-1` + `errno` for almost everything, `NULL` +
//! `errno` for the constructors). Errors are `Result<_, Errno>` inside the library and
//! become C codes only here; a panic never crosses the boundary (it fails the call with
//! `EIO`).

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// An errno value (`libc::EINVAL`, …).
pub type Errno = c_int;

/// The errno a panic inside the library turns into.
pub const PANIC_ERRNO: Errno = libc::EIO;

/// Sets the calling thread's `errno`.
pub fn set_errno(errno: Errno) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot, valid for the
    // thread's lifetime.
    unsafe { *libc::__errno_location() = errno };
}

/// The calling thread's `errno`.
pub fn errno() -> Errno {
    // SAFETY: as in `set_errno`.
    unsafe { *libc::__errno_location() }
}

/// Runs `f`, catching a panic: the panic gives `Err(PANIC_ERRNO)`.
pub fn guarded<T>(f: impl FnOnce() -> Result<T, Errno>) -> Result<T, Errno> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(Err(PANIC_ERRNO))
}

/// The `NULL` + `errno` convention.
pub fn pointer<T>(f: impl FnOnce() -> Result<*mut T, Errno>) -> *mut T {
    match guarded(f) {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    }
}

/// The `-1` + `errno` convention; success returns the value `f` gives.
pub fn minus_one(f: impl FnOnce() -> Result<c_int, Errno>) -> c_int {
    match guarded(f) {
        Ok(v) => v,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// The `-1` + `errno` convention for calls that return 0 on success.
pub fn zero(f: impl FnOnce() -> Result<(), Errno>) -> c_int {
    minus_one(|| f().map(|()| 0))
}

/// Runs a function that cannot fail (void or infallible) inside the panic boundary; a
/// panic gives `fallback`.
pub fn infallible<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_eio_and_never_unwinds_into_the_caller() {
        let p: *mut u8 = pointer(|| panic!("bug"));
        assert!(p.is_null());
        assert_eq!(errno(), PANIC_ERRNO);
        assert_eq!(zero(|| panic!("bug")), -1);
        assert_eq!(errno(), PANIC_ERRNO);
        assert_eq!(infallible(7, || panic!("bug")), 7);
    }

    #[test]
    fn minus_one_sets_errno_and_passes_values_through() {
        assert_eq!(minus_one(|| Err(libc::ENODEV)), -1);
        assert_eq!(errno(), libc::ENODEV);
        assert_eq!(minus_one(|| Ok(3)), 3);
        assert_eq!(zero(|| Ok(())), 0);
    }
}
