//! QP1 management datagrams for softverbs' own `librdmacm.so.1`: a private ABI.
//!
//! | function | version | status |
//! |---|---|---|
//! | `softverbs_gsi_send`, `softverbs_gsi_recv`, `softverbs_gsi_fd` | `SOFTVERBS_PRIVATE_1.0` | real |
//! | `softverbs_gsi_share`, `softverbs_gsi_listen`, `softverbs_gsi_unlisten` | `SOFTVERBS_PRIVATE_1.1` | real |
//! | `softverbs_app_waits` | `SOFTVERBS_PRIVATE_1.2` | real |
//!
//! The RDMA connection manager speaks the IB CM protocol in management datagrams (MADs)
//! through QP1, the General Services Interface (IBTA vol. 1 13.5: QP1, Q_Key 0x80010000).
//! The kernel gives librdmacm QP1 through `/dev/infiniband/rdma_cm`; the soft device has
//! no kernel, so it lends its QP1 to softverbs' librdmacm through these three functions.
//!
//! # The private ABI
//!
//! These are not libibverbs functions: no header declares them and no program but
//! softverbs' `librdmacm.so.1` (crate `softverbs-rdmacm`) should call them. It finds them
//! in the loaded `libibverbs.so.1` with
//! `dlvsym(dlopen("libibverbs.so.1", RTLD_NOW), "softverbs_gsi_send", "SOFTVERBS_PRIVATE_1.0")`,
//! so a `libibverbs.so.1` that is not ours (rdma-core's) has no such symbol, and a change
//! of these signatures takes a new version node. At `SOFTVERBS_PRIVATE_1.0`:
//!
//! ```c
//! /* Sends one MAD (1..=256 bytes) from QP1 to QP1 of the port whose GID is dgid:
//!  * RoCEv2 UD SEND ONLY, P_Key 0xFFFF, Q_Key 0x80010000, SrcQP 1. Returns 0, or the
//!  * errno (also in errno): EINVAL for a context that is not ours, a NULL dgid or mad,
//!  * or a length outside 1..=256; ENOMEM when 256 MADs already wait to leave. */
//! int softverbs_gsi_send(struct ibv_context *ctx, const uint8_t dgid[16],
//!                        const void *mad, size_t len);
//!
//! /* Takes the next MAD QP1 received, in arrival order: copies it to buf (len must be
//!  * at least 256), the sender's GID to sgid and its QP (DETH SrcQP, 1 for a GSI) to
//!  * *src_qpn (either may be NULL). Returns the MAD's length, or -1 with errno EAGAIN
//!  * when none waits, EINVAL for a context that is not ours, a NULL buf or len < 256
//!  * (nothing is taken then). Never blocks. */
//! ssize_t softverbs_gsi_recv(struct ibv_context *ctx, uint8_t sgid[16],
//!                            uint32_t *src_qpn, void *buf, size_t len);
//!
//! /* A file descriptor, owned by the device (valid while the context is open; do not
//!  * close it), that polls readable exactly while MADs wait for softverbs_gsi_recv.
//!  * Poll it, then call softverbs_gsi_recv until EAGAIN; do not read it. -1 with errno
//!  * EINVAL for a context that is not ours. */
//! int softverbs_gsi_fd(struct ibv_context *ctx);
//! ```
//!
//! At `SOFTVERBS_PRIVATE_1.1`, for devices of several processes sharing one address (and
//! so one QP1: the device holding the address's socket hands each MAD to the process it is
//! for):
//!
//! ```c
//! /* The share of its address the device holds (0..=255; 0 when alone): the high byte of
//!  * every communication ID and SIDR request ID the caller's CM hands out, so the answers
//!  * reach it. -1 with errno EINVAL for a context that is not ours. */
//! int softverbs_gsi_share(struct ibv_context *ctx);
//!
//! /* The caller's CM listens on service_id: REQs and SIDR_REQs for it reach this device.
//!  * 0, or the errno (also in errno): EINVAL for a context that is not ours, EADDRINUSE
//!  * when a device of another process on the address listens on it, ENOMEM when the
//!  * address's 256 services are taken. */
//! int softverbs_gsi_listen(struct ibv_context *ctx, uint64_t service_id);
//!
//! /* Undoes softverbs_gsi_listen. 0, or EINVAL for a context that is not ours. */
//! int softverbs_gsi_unlisten(struct ibv_context *ctx, uint64_t service_id);
//! ```
//!
//! At `SOFTVERBS_PRIVATE_1.2`:
//!
//! ```c
//! /* The program is about to block in a call of the caller's (rdma_get_cm_event on a
//!  * channel with no event ready) that receives nothing for the device: packets it polled
//!  * for itself until now (and the progress thread left to it, napping) are the progress
//!  * thread's again at once, so the MAD the program waits for is not held for a nap.
//!  * 0, or EINVAL for a context that is not ours. */
//! int softverbs_app_waits(struct ibv_context *ctx);
//! ```
//!
//! All contexts of a process share its one device, so they share its QP1: every context
//! sees the same MADs (librdmacm runs one CM per device). MADs arrive whether or not the
//! program polls anything: the device's progress thread receives them. The engine decides
//! what is a MAD (a UD SEND ONLY to QP1 with the GSI Q_Key, at most 256 bytes) and drops
//! and counts the rest (`softverbs::core::engine::Engine::poll_gsi`); this file only
//! translates.

use crate::abi::*;
use crate::boundary::{errno_code, errno_of, guarded, minus_one, set_errno, Errno};
use crate::handles::ContextBlock;
use softverbs::core::engine::MAD_LEN;
use std::ffi::{c_int, c_void};

/// The device of a context pointer from C.
///
/// # Safety
///
/// `ctx` is NULL or an open context (the handle contract, `handles.rs`).
unsafe fn device<'a>(ctx: *mut ibv_context) -> Result<&'a softverbs::core::device::Device, Errno> {
    // SAFETY: forwarded from this function's `# Safety`.
    let block = unsafe { ContextBlock::from_ptr(ctx) }?;
    Ok(&block.entry.device)
}

/// `softverbs_gsi_send` (private, module documentation): 0 or an errno value.
///
/// # Safety
///
/// `ctx` is NULL or an open context; `dgid` is NULL or 16 readable bytes; `mad` is NULL
/// or `len` readable bytes.
pub unsafe extern "C" fn softverbs_gsi_send(
    ctx: *mut ibv_context,
    dgid: *const u8,
    mad: *const c_void,
    len: usize,
) -> c_int {
    errno_code(|| {
        // SAFETY: `ctx` is NULL or open (this function's `# Safety`).
        let device = unsafe { device(ctx) }?;
        if dgid.is_null() || mad.is_null() || len == 0 || len > MAD_LEN {
            return Err(libc::EINVAL);
        }
        let mut gid = [0u8; 16];
        // SAFETY: `dgid` is not NULL, so it points at 16 readable bytes (`# Safety`).
        gid.copy_from_slice(unsafe { std::slice::from_raw_parts(dgid, 16) });
        // SAFETY: `mad` is not NULL, so it points at `len` readable bytes (`# Safety`),
        // and `len` is at most 256.
        let bytes = unsafe { std::slice::from_raw_parts(mad.cast::<u8>(), len) };
        device.gsi_send(gid, bytes).map_err(errno_of)
    })
}
symver!(softverbs_gsi_send, "SOFTVERBS_PRIVATE_1.0");

/// `softverbs_gsi_recv` (private, module documentation): the MAD's length, or -1 with
/// errno.
///
/// # Safety
///
/// `ctx` is NULL or an open context; `sgid` is NULL or 16 writable bytes; `src_qpn` is
/// NULL or a writable `uint32_t`; `buf` is NULL or `len` writable bytes.
pub unsafe extern "C" fn softverbs_gsi_recv(
    ctx: *mut ibv_context,
    sgid: *mut u8,
    src_qpn: *mut u32,
    buf: *mut c_void,
    len: usize,
) -> isize {
    let result = guarded(|| {
        // SAFETY: `ctx` is NULL or open (this function's `# Safety`).
        let device = unsafe { device(ctx) }?;
        if buf.is_null() || len < MAD_LEN {
            return Err(libc::EINVAL);
        }
        let mad = device.gsi_recv().ok_or(libc::EAGAIN)?;
        // The engine keeps MADs of at most MAD_LEN bytes; `len` is at least that.
        let n = mad.bytes.len().min(len);
        // SAFETY: `buf` is not NULL, so it points at `len` writable bytes (`# Safety`);
        // `n <= len`, and the source is a separate Rust allocation.
        unsafe { std::ptr::copy_nonoverlapping(mad.bytes.as_ptr(), buf.cast::<u8>(), n) };
        if !sgid.is_null() {
            // SAFETY: not NULL, so 16 writable bytes (`# Safety`).
            unsafe { std::ptr::copy_nonoverlapping(mad.sgid.as_ptr(), sgid, 16) };
        }
        if !src_qpn.is_null() {
            // SAFETY: not NULL, so a writable `uint32_t` (`# Safety`); C need not align it
            // for us to be safe.
            unsafe { src_qpn.write_unaligned(mad.src_qpn) };
        }
        Ok(n as isize)
    });
    match result {
        Ok(n) => n,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}
symver!(softverbs_gsi_recv, "SOFTVERBS_PRIVATE_1.0");

/// `softverbs_gsi_fd` (private, module documentation): the fd, or -1 with errno.
///
/// # Safety
///
/// `ctx` is NULL or an open context.
pub unsafe extern "C" fn softverbs_gsi_fd(ctx: *mut ibv_context) -> c_int {
    minus_one(|| {
        use std::os::fd::AsRawFd;
        // SAFETY: `ctx` is NULL or open (this function's `# Safety`).
        let device = unsafe { device(ctx) }?;
        Ok(device.gsi_fd().as_raw_fd())
    })
}
symver!(softverbs_gsi_fd, "SOFTVERBS_PRIVATE_1.0");

/// `softverbs_gsi_share` (private, module documentation): the share, or -1 with errno.
///
/// # Safety
///
/// `ctx` is NULL or an open context.
pub unsafe extern "C" fn softverbs_gsi_share(ctx: *mut ibv_context) -> c_int {
    minus_one(|| {
        // SAFETY: `ctx` is NULL or open (this function's `# Safety`).
        let device = unsafe { device(ctx) }?;
        Ok(c_int::from(device.address_share()))
    })
}
symver!(softverbs_gsi_share, "SOFTVERBS_PRIVATE_1.1");

/// `softverbs_gsi_listen` (private, module documentation): 0 or an errno value.
///
/// # Safety
///
/// `ctx` is NULL or an open context.
pub unsafe extern "C" fn softverbs_gsi_listen(ctx: *mut ibv_context, service_id: u64) -> c_int {
    errno_code(|| {
        // SAFETY: `ctx` is NULL or open (this function's `# Safety`).
        let device = unsafe { device(ctx) }?;
        device.gsi_listen(service_id).map_err(errno_of)
    })
}
symver!(softverbs_gsi_listen, "SOFTVERBS_PRIVATE_1.1");

/// `softverbs_gsi_unlisten` (private, module documentation): 0 or an errno value.
///
/// # Safety
///
/// `ctx` is NULL or an open context.
pub unsafe extern "C" fn softverbs_gsi_unlisten(ctx: *mut ibv_context, service_id: u64) -> c_int {
    errno_code(|| {
        // SAFETY: `ctx` is NULL or open (this function's `# Safety`).
        let device = unsafe { device(ctx) }?;
        device.gsi_unlisten(service_id);
        Ok(())
    })
}
symver!(softverbs_gsi_unlisten, "SOFTVERBS_PRIVATE_1.1");

/// `softverbs_app_waits` (private, module documentation): 0 or an errno value.
///
/// # Safety
///
/// `ctx` is NULL or an open context.
pub unsafe extern "C" fn softverbs_app_waits(ctx: *mut ibv_context) -> c_int {
    errno_code(|| {
        // SAFETY: `ctx` is NULL or open (this function's `# Safety`).
        let device = unsafe { device(ctx) }?;
        device.app_waits();
        Ok(())
    })
}
symver!(softverbs_app_waits, "SOFTVERBS_PRIVATE_1.2");
