//! Work-request pieces QPs and SRQs share: reading a C scatter/gather list or an inline
//! payload, the engine's receive request for a C one, and walking a C list of work
//! requests the way `ibv_post_*(3)` report failure (`*bad_wr`).
//!
//! Its own module so that [`crate::srq`] (`post_srq_recv`) reaches them without depending
//! on [`crate::qp`], which depends on `srq` (a QP may use an SRQ).

use crate::abi::*;
use crate::boundary::{guarded, Errno};
use softverbs::core::engine::{InlineData, RecvWr, Sge, SgeList};
use std::ffi::c_int;

/// Reads a C scatter/gather list of `num_sge` entries (`EINVAL` for a negative count, more
/// than `max`, or a NULL list with entries), straight into the engine's list: no allocation
/// for up to [`SgeList::INLINE`] entries.
///
/// # Safety
///
/// `sg_list` is readable for `num_sge` entries when `num_sge > 0`.
pub(crate) unsafe fn sges(
    sg_list: *const ibv_sge,
    num_sge: c_int,
    max: u32,
) -> Result<SgeList, Errno> {
    if num_sge < 0 || num_sge as u32 > max || (num_sge > 0 && sg_list.is_null()) {
        return Err(libc::EINVAL);
    }
    // SAFETY: `num_sge` entries are readable (this function's contract; not NULL, checked
    // above).
    Ok(unsafe { read_sges(sg_list, num_sge as usize) })
}

/// The `count` entries of a C scatter/gather list, in the engine's list (no allocation for
/// up to [`SgeList::INLINE`] entries).
///
/// # Safety
///
/// `sg_list` is readable for `count` entries (not NULL when `count > 0`).
pub(crate) unsafe fn read_sges(sg_list: *const ibv_sge, count: usize) -> SgeList {
    (0..count)
        .map(|i| {
            // SAFETY: `i < count` entries are readable (this function's contract).
            let s = unsafe { sg_list.add(i).read() };
            Sge {
                addr: s.addr,
                length: s.length,
                lkey: s.lkey,
            }
        })
        .collect()
}

/// Copies an inline payload out of the application's buffers (`IBV_SEND_INLINE`: the
/// buffers may be reused as soon as `ibv_post_send` returns; the lkeys are not checked).
///
/// # Safety
///
/// Every entry's `[addr, addr + length)` is readable (the `ibv_post_send(3)` contract).
pub(crate) unsafe fn inline_payload(list: &[Sge], max: u32) -> Result<InlineData, Errno> {
    let total: u64 = list.iter().map(|s| u64::from(s.length)).sum();
    if total > u64::from(max) {
        return Err(libc::EINVAL);
    }
    let mut bytes = InlineData::with_capacity(total as usize);
    for s in list.iter().filter(|s| s.length > 0) {
        // SAFETY: the caller's contract makes `[addr, addr + length)` readable; the bytes
        // are copied before the slice goes out of scope.
        let src = unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.length as usize) };
        bytes.extend_from_slice(src);
    }
    Ok(bytes)
}

/// The engine's receive request for a C one.
///
/// # Safety
///
/// `wr.sg_list` is readable for `wr.num_sge` entries.
pub unsafe fn recv_wr(wr: &ibv_recv_wr, max_sge: u32) -> Result<RecvWr, Errno> {
    Ok(RecvWr {
        wr_id: wr.wr_id,
        // SAFETY: `sges` needs exactly this function's contract.
        sg_list: unsafe { sges(wr.sg_list, wr.num_sge, max_sge) }?,
    })
}

/// Posts a C list of work requests one by one; on the first failure `*bad_wr` names it
/// and its errno is returned (the ones before it were posted).
///
/// # Safety
///
/// The list from `first` (linked by `next`) is readable, and `bad_wr` is NULL or writable:
/// the `ibv_post_*(3)` contract the caller was given.
pub(crate) unsafe fn post_list<W>(
    first: *mut W,
    bad_wr: *mut *mut W,
    next: impl Fn(&W) -> *mut W,
    mut post: impl FnMut(&W) -> Result<(), Errno>,
) -> c_int {
    let mut wr = first;
    let result = guarded(|| {
        while !wr.is_null() {
            // SAFETY: the list is readable (this function's `# Safety`).
            let w = unsafe { &*wr };
            post(w)?;
            wr = next(w);
        }
        Ok(())
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            if !bad_wr.is_null() {
                // SAFETY: `bad_wr` is writable (this function's `# Safety`; not NULL here).
                unsafe { bad_wr.write(wr) };
            }
            e
        }
    }
}

/// Posts a C list of receive requests, as `ibv_post_recv(3)` and `ibv_post_srq_recv(3)` both
/// do: each is read against `max_sge`, the receive queue's limit (or the errno saying there
/// is no such queue), and handed to `post`; failures as [`post_list`].
///
/// # Safety
///
/// As [`post_list`], and every request's scatter/gather list is readable for its
/// `num_sge` entries.
pub(crate) unsafe fn post_recv_list(
    first: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    max_sge: Result<u32, Errno>,
    mut post: impl FnMut(RecvWr) -> Result<(), Errno>,
) -> c_int {
    let post_one = |w: &ibv_recv_wr| {
        let max_sge = max_sge?;
        // SAFETY: `w`'s scatter/gather list is readable (this function's `# Safety`), which
        // is what `recv_wr` asks.
        post(unsafe { recv_wr(w, max_sge) }?)
    };
    // SAFETY: the list and `bad_wr` are as `post_list` asks (this function's `# Safety`).
    unsafe { post_list(first, bad_wr, |w| w.next, post_one) }
}
