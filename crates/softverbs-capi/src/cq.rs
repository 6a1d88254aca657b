//! Completion channels and completion queues.
//!
//! | function | version | status |
//! |---|---|---|
//! | `ibv_create_comp_channel`, `ibv_destroy_comp_channel` | 1.0 | real: the fd is a [`CompletionChannel`]'s eventfd (pollable, honours `O_NONBLOCK`) |
//! | `ibv_create_cq`, `ibv_destroy_cq`, `ibv_resize_cq`, `ibv_get_cq_event`, `ibv_ack_cq_events` | 1.1 | documented failure (next slice) |
//! | `ops.poll_cq`, `ops.req_notify_cq` | (ops) | documented failure (next slice); always non-NULL |
//! | `verbs_context.create_cq_ex`, `.modify_cq` | (ops) | NULL: the inline gives `EOPNOTSUPP` |

use crate::abi::*;
use crate::boundary::{errno_code, pointer};
use crate::handles::{ChannelBlock, ContextBlock};
use softverbs_cq::CompletionChannel;
use std::ffi::{c_int, c_uint, c_void};
use std::os::fd::AsRawFd;

/// `ibv_create_comp_channel(3)`: `NULL` with errno on failure.
///
/// # Safety
///
/// `context` is NULL or an open context.
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    pointer(|| {
        // SAFETY: per the contract.
        unsafe { ContextBlock::from_ptr(context) }?;
        let inner =
            CompletionChannel::new().map_err(|e| e.raw_os_error().unwrap_or(libc::ENOMEM))?;
        let channel = ibv_comp_channel {
            context,
            fd: inner.as_raw_fd(),
            refcnt: 0,
        };
        Ok(ChannelBlock::allocate(channel, inner))
    })
}
symver!(ibv_create_comp_channel, "IBVERBS_1.0");

/// `ibv_destroy_comp_channel(3)`: `EBUSY` while a CQ uses the channel, else 0 (the fd is
/// closed).
///
/// # Safety
///
/// `channel` is NULL or a channel from `ibv_create_comp_channel`, not used again after a
/// successful call.
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    errno_code(|| {
        // SAFETY: per the contract.
        let block = unsafe { ChannelBlock::from_ptr(channel) }?;
        // SAFETY: `refcnt` is read through the raw pointer: C owns the struct's fields.
        let refcnt = unsafe { (*channel).refcnt };
        if block.inner.attached_cqs() > 0 || refcnt != 0 {
            return Err(libc::EBUSY);
        }
        // SAFETY: checked above; the caller gives it up.
        unsafe { ChannelBlock::free(channel) };
        Ok(())
    })
}
symver!(ibv_destroy_comp_channel, "IBVERBS_1.0");

unsupported! {
    /// `ibv_create_cq(3)`.
    null "IBVERBS_1.1" fn ibv_create_cq(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq
}
unsupported! {
    /// `ibv_destroy_cq(3)`.
    errno "IBVERBS_1.1" fn ibv_destroy_cq(*mut ibv_cq)
}
unsupported! {
    /// `ibv_resize_cq(3)`.
    errno "IBVERBS_1.1" fn ibv_resize_cq(*mut ibv_cq, c_int)
}
unsupported! {
    /// `ibv_get_cq_event(3)`.
    minus_one "IBVERBS_1.1" fn ibv_get_cq_event(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void)
}
unsupported! {
    /// `ibv_ack_cq_events(3)`.
    void "IBVERBS_1.1" fn ibv_ack_cq_events(*mut ibv_cq, c_uint)
}

/// `ops.poll_cq` (`ibv_poll_cq(3)`): not supported yet, returns a negative value (no CQ
/// can exist yet, so this is never reached through a valid CQ).
pub extern "C" fn poll_cq(_: *mut ibv_cq, _: c_int, _: *mut ibv_wc) -> c_int {
    -libc::EOPNOTSUPP
}

/// `ops.req_notify_cq` (`ibv_req_notify_cq(3)`): not supported yet, returns `EOPNOTSUPP`.
pub extern "C" fn req_notify_cq(_: *mut ibv_cq, _: c_int) -> c_int {
    libc::EOPNOTSUPP
}
