//! Posting work requests: the engine's request for a C `ibv_send_wr`, and
//! `ops.post_send` / `ops.post_recv`.

use super::state::{QpBlock, QpState};
use crate::abi::*;
use crate::ah::AhBlock;
use crate::boundary::{errno_of, Errno};
use crate::mr::{set_window_rkey, window_bind};
use crate::verbs_h::{
    IBV_SEND_FENCE, IBV_SEND_INLINE, IBV_SEND_SIGNALED, IBV_SEND_SOLICITED,
    IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_BIND_MW, IBV_WR_LOCAL_INV,
    IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND,
    IBV_WR_SEND_WITH_IMM, IBV_WR_SEND_WITH_INV,
};
use crate::wr::{inline_payload, post_list, post_recv_list, sges};
use softverbs::core::engine::{
    Gather, InlineData, QpType, SendFlags, SendOp, SendWr, SgeList, UdDest, WindowType,
};
use std::ffi::c_int;

/// The `enum ibv_send_flags` the device honours (`0xf`).
pub(crate) const SEND_FLAGS_KNOWN: u32 =
    IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE;

/// The engine's work request for a C one.
///
/// # Safety
///
/// `wr`'s pointers are valid as `ibv_post_send(3)` requires: its scatter/gather list is
/// readable (and, with `IBV_SEND_INLINE`, the buffers it names), for a UD QP its AH is
/// NULL or live, and for `IBV_WR_BIND_MW` its window and region are NULL or live (the
/// handle contract of [`crate::handles`]).
unsafe fn send_wr(wr: &ibv_send_wr, state: &QpState) -> Result<SendWr, Errno> {
    // SAFETY: `wr.sg_list` has `wr.num_sge` readable entries (this function's `# Safety`).
    let list = unsafe { sges(wr.sg_list, wr.num_sge, state.caps.max_send_sge) }?;
    if wr.send_flags & !SEND_FLAGS_KNOWN != 0 {
        return Err(libc::EINVAL);
    }
    let flags = SendFlags::from_bits_truncate(wr.send_flags);
    let imm = u32::from_be(wr.imm_data);
    // SAFETY: the union member the opcode selects (all members are plain data).
    let (rdma, atomic) = unsafe { (wr.wr.rdma, wr.wr.atomic) };
    let op = match wr.opcode {
        IBV_WR_SEND => SendOp::Send,
        IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm { imm },
        IBV_WR_SEND_WITH_INV => SendOp::SendWithInv {
            invalidate_rkey: wr.imm_data,
        },
        IBV_WR_RDMA_WRITE => SendOp::RdmaWrite {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::RdmaWriteWithImm {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
            imm,
        },
        IBV_WR_RDMA_READ => SendOp::RdmaRead {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            add: atomic.compare_add,
        },
        IBV_WR_LOCAL_INV => SendOp::LocalInv {
            invalidate_rkey: wr.imm_data,
        },
        IBV_WR_BIND_MW => {
            // SAFETY: the member `IBV_WR_BIND_MW` selects (plain data).
            let bind = unsafe { wr.ext.bind_mw };
            // SAFETY: the window and region are NULL or live (this function's `# Safety`).
            let bind =
                unsafe { window_bind(bind.mw, bind.rkey, &bind.bind_info, WindowType::Two) }?;
            SendOp::BindMw(bind)
        }
        _ => return Err(libc::EINVAL),
    };
    let gather = if op.is_local() {
        // A bind or local invalidate has no payload: its list is ignored, as rxe does.
        Gather::Sges(SgeList::new())
    } else if flags.contains(SendFlags::INLINE) && op.is_read_or_atomic() {
        // `ibv_post_send(3)`: IBV_SEND_INLINE is "valid only for Send and RDMA Write"; the
        // engine refuses the flag on a READ or atomic (EINVAL), so it gets the flag, not
        // the buffers (which a READ writes, not reads).
        Gather::Inline(InlineData::new())
    } else if flags.contains(SendFlags::INLINE) {
        // SAFETY: with `IBV_SEND_INLINE` every entry's buffer is readable for its length
        // (this function's `# Safety`).
        Gather::Inline(unsafe { inline_payload(&list, state.caps.max_inline_data) }?)
    } else {
        Gather::Sges(list)
    };
    let ud = if state.qp_type == QpType::Ud {
        // SAFETY: the UD member, per the QP type.
        let ud = unsafe { wr.wr.ud };
        // SAFETY: `ud.ah` is NULL or a live AH (this function's `# Safety`).
        let ah = unsafe { AhBlock::state(ud.ah) }?;
        Some(UdDest {
            av: ah.av,
            remote_qpn: ud.remote_qpn,
            remote_qkey: ud.remote_qkey,
            pd: ah.pd,
        })
    } else {
        None
    };
    Ok(SendWr {
        wr_id: wr.wr_id,
        op,
        gather,
        flags,
        ud,
    })
}

/// `ops.post_send` (`ibv_post_send(3)`): 0, or an errno value with `*bad_wr` at the
/// first request not posted (`EINVAL` for a bad request, `ENOMEM` for a full send queue).
///
/// # Safety
///
/// `qp` is NULL or a live QP; the list and what it points at are valid as
/// `ibv_post_send(3)` requires.
pub unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: `qp` is NULL or a live QP (this function's `# Safety`).
    let state = unsafe { QpBlock::state(qp) };
    let post_one = |w: &ibv_send_wr| {
        let state = state?;
        // SAFETY: every request of the list is valid as `ibv_post_send(3)` requires (this
        // function's `# Safety`), which is what `send_wr` asks.
        let request = unsafe { send_wr(w, state) }?;
        let bind = match request.op {
            SendOp::BindMw(bind) => Some(bind),
            _ => None,
        };
        state
            .entry
            .device
            .post_send(state.qpn, request)
            .map_err(errno_of)?;
        if let Some(bind) = bind {
            // SAFETY: the request's window passed `window_bind` in `send_wr` and is live.
            unsafe { set_window_rkey(w.ext.bind_mw.mw, &bind) };
        }
        Ok(())
    };
    // SAFETY: the list and `bad_wr` are valid as `ibv_post_send(3)` requires (this
    // function's `# Safety`).
    unsafe { post_list(wr, bad_wr, |w| w.next, post_one) }
}

/// `ops.post_recv` (`ibv_post_recv(3)`): as [`post_send`]; a QP with an SRQ has no
/// receive queue (`EINVAL`).
///
/// # Safety
///
/// As [`post_send`].
pub unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: `qp` is NULL or a live QP (this function's `# Safety`).
    let state = unsafe { QpBlock::state(qp) };
    // SAFETY: the list, its scatter/gather lists and `bad_wr` are valid as
    // `ibv_post_recv(3)` requires (this function's `# Safety`).
    unsafe {
        post_recv_list(wr, bad_wr, state.map(|s| s.caps.max_recv_sge), |request| {
            let state = state?;
            state
                .entry
                .device
                .post_recv(state.qpn, request)
                .map_err(errno_of)
        })
    }
}
