//! The edge between C and Rust: the panic boundary every export runs inside, `errno`, and
//! the three failure conventions libibverbs uses.
//!
//! | convention | success | failure | used by |
//! |---|---|---|---|
//! | [`pointer()`] | the object | `NULL`, `errno` set | `ibv_alloc_pd`, `ibv_create_*`, `ibv_reg_mr*`, `ibv_open_device` |
//! | [`errno_code`] | `0` | the errno value itself (positive) | `ibv_query_port`, `ibv_modify_qp`, `ibv_destroy_*`, `ibv_dealloc_pd` |
//! | [`minus_one`] | `0` (or a count) | `-1`, `errno` set | `ibv_query_gid`, `ibv_get_cq_event`, `ibv_query_pkey` |
//!
//! Errors are `Result<_, Errno>` inside the library and become C codes only here. A panic
//! never crosses the boundary: it is caught, reported by the panic hook on stderr, and the
//! call fails with `EIO`.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// An errno value (`libc::EINVAL`, …).
pub type Errno = c_int;

/// The errno of an error of the verbs core: [`Error::errno`](softverbs::core::Error::errno),
/// the one place a cause becomes an errno. Every refusal of the core reaches C through here.
pub fn errno_of(e: impl Into<softverbs::core::Error>) -> Errno {
    e.into().errno()
}

/// The errno a panic inside the library turns into.
pub const PANIC_ERRNO: Errno = libc::EIO;

/// Sets the calling thread's `errno`.
pub fn set_errno(errno: Errno) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot, valid for the
    // thread's lifetime; writing an int there is what C code does with `errno = e`.
    unsafe { *libc::__errno_location() = errno };
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

/// The "return the errno" convention (0 on success). `errno` is set too, as rdma-core
/// does for most of these.
pub fn errno_code(f: impl FnOnce() -> Result<(), Errno>) -> c_int {
    match guarded(f) {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            e
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

/// Runs a function that cannot fail (void or infallible) inside the panic boundary; a
/// panic gives `fallback`.
pub fn infallible<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errno() -> Errno {
        // SAFETY: the calling thread's errno slot.
        unsafe { *libc::__errno_location() }
    }

    #[test]
    fn a_panic_becomes_eio_and_never_unwinds_into_the_caller() {
        let p: *mut u8 = pointer(|| panic!("bug"));
        assert!(p.is_null());
        assert_eq!(errno(), PANIC_ERRNO);
        assert_eq!(errno_code(|| panic!("bug")), PANIC_ERRNO);
        assert_eq!(minus_one(|| panic!("bug")), -1);
    }

    #[test]
    fn each_convention_reports_failure_its_own_way() {
        let p: *mut u8 = pointer(|| Err(libc::EOPNOTSUPP));
        assert!(p.is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP);
        assert_eq!(errno_code(|| Err(libc::EINVAL)), libc::EINVAL);
        assert_eq!(minus_one(|| Err(libc::ENOENT)), -1);
        assert_eq!(errno(), libc::ENOENT);
        assert_eq!(minus_one(|| Ok(3)), 3);
    }
}
