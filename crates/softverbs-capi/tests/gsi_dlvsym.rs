//! How softverbs' librdmacm finds the private exports: `dlopen("libibverbs.so.1")` of
//! the built drop-in and `dlvsym(handle, "softverbs_gsi_send", "SOFTVERBS_PRIVATE_1.0")`
//! (and `_recv`, `_fd`) give callable functions; the same names at a libibverbs node are
//! not there, so only the private node finds them. Called through the pointer found,
//! `softverbs_gsi_fd(NULL)` fails with -1 and `EINVAL`.

mod common;

use std::ffi::{c_int, c_void, CString};

fn lookup(handle: *mut c_void, name: &str, version: &str) -> *mut c_void {
    let (name, version) = (CString::new(name).unwrap(), CString::new(version).unwrap());
    // SAFETY: `handle` came from dlopen; both strings are NUL-terminated.
    unsafe { libc::dlvsym(handle, name.as_ptr(), version.as_ptr()) }
}

#[test]
fn dlvsym_finds_the_gsi_exports_at_softverbs_private_1_0_only() {
    let path = common::library_dir("gsi-dlvsym").join("libibverbs.so.1");
    let path = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; the library is never closed (its device, if one
    // opened, would live for the process as in any program).
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null(), "dlopen of the drop-in failed");
    for name in [
        "softverbs_gsi_send",
        "softverbs_gsi_recv",
        "softverbs_gsi_fd",
    ] {
        assert!(
            !lookup(handle, name, "SOFTVERBS_PRIVATE_1.0").is_null(),
            "{name}@SOFTVERBS_PRIVATE_1.0 not found"
        );
        for node in ["IBVERBS_1.1", "IBVERBS_PRIVATE_34"] {
            assert!(lookup(handle, name, node).is_null(), "{name}@{node} found");
        }
    }
    let fd = lookup(handle, "softverbs_gsi_fd", "SOFTVERBS_PRIVATE_1.0");
    // SAFETY: the symbol is `int softverbs_gsi_fd(struct ibv_context *)` (src/gsi.rs).
    let fd: unsafe extern "C" fn(*mut c_void) -> c_int = unsafe { std::mem::transmute(fd) };
    // SAFETY: NULL is allowed and refused.
    let result = unsafe { fd(std::ptr::null_mut()) };
    let errno = std::io::Error::last_os_error().raw_os_error();
    assert_eq!((result, errno), (-1, Some(libc::EINVAL)));
}
