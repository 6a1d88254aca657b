//! `rdma_get_devices(3)` and `rdma_free_devices(3)`: the contexts the connection manager
//! opened (one per device of the loaded libibverbs, open for the life of the process).

use crate::boundary;
use crate::state::lock;
use crate::symver;
use libc::{c_int, c_void};

/// `rdma_get_devices(3)`: a NULL-terminated array of `struct ibv_context *` (free it with
/// `rdma_free_devices`), its length in `*num_devices` if non-NULL; NULL with errno
/// (`ENODEV` no device, `ENOMEM`) on failure.
///
/// # Safety
///
/// `num_devices` is NULL or writable.
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut c_void {
    boundary::pointer(|| {
        let mut st = lock();
        st.open_devices()?;
        let n = st.devices.len();
        // SAFETY: plain allocation, freed by `rdma_free_devices`.
        let list =
            unsafe { libc::calloc(n + 1, std::mem::size_of::<*mut c_void>()) } as *mut *mut c_void;
        if list.is_null() {
            return Err(libc::ENOMEM);
        }
        for (i, d) in st.devices.iter().enumerate() {
            // SAFETY: the array has n + 1 slots.
            unsafe { *list.add(i) = d.ctx.0 };
        }
        if !num_devices.is_null() {
            // SAFETY: caller's contract.
            unsafe { *num_devices = n as c_int };
        }
        Ok(list)
    })
}
symver!(rdma_get_devices, "RDMACM_1.0");

/// `rdma_free_devices(3)`: frees the array (the contexts stay open).
///
/// # Safety
///
/// `list` is NULL or an array `rdma_get_devices` returned, not yet freed.
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut c_void) {
    // SAFETY: caller's contract; free(NULL) is a no-op.
    boundary::infallible((), || unsafe { libc::free(list as *mut c_void) })
}
symver!(rdma_free_devices, "RDMACM_1.0");
