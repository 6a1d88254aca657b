//! Queue pairs and their work requests.
//!
//! | function | version | status |
//! |---|---|---|
//! | `ibv_create_qp`, `ibv_destroy_qp`, `ibv_modify_qp`, `ibv_query_qp` | 1.1 | real: RC, UC, UD |
//! | `ibv_attach_mcast`, `ibv_detach_mcast` | 1.1 | documented failure (`EOPNOTSUPP`): no multicast |
//! | `ibv_qp_to_qp_ex` | 1.6 | documented failure (`NULL`, `EOPNOTSUPP`): no `ibv_qp_ex` builders |
//! | `ibv_query_qp_data_in_order` | 1.14 | 0 ("not guaranteed"), the documented answer when unknown |
//! | `ibv_query_ece`, `ibv_set_ece` | 1.10 | `EOPNOTSUPP` (documented: no ECE) |
//! | `ops.post_send`, `ops.post_recv` | (ops) | real; a list stops at the first bad request (`*bad_wr`) |
//! | `verbs_context.create_qp_ex` | (ops) | NULL: the inline falls back to `ibv_create_qp` for PD-only requests |
//!
//! Work requests: `SEND`, `SEND_WITH_IMM`, `SEND_WITH_INV`, `RDMA_WRITE`,
//! `RDMA_WRITE_WITH_IMM`, `RDMA_READ`, `ATOMIC_CMP_AND_SWP`, `ATOMIC_FETCH_AND_ADD`; flags
//! `FENCE`, `SIGNALED`, `SOLICITED`, `INLINE` (the payload is copied at post time, the
//! lkeys are ignored). Other opcodes (`LOCAL_INV`, `BIND_MW`, `TSO`, …) are `EINVAL`, as
//! for a device without them.

use crate::abi::*;
use crate::ah::{address_vector, ah_attr, AhBlock};
use crate::boundary::{errno_code, guarded, pointer, Errno};
use crate::cq::cq_state;
use crate::handles::{with_registry, Block, ContextBlock, DeviceEntry, PdBlock, Tagged};
use crate::srq::srq_state;
use softverbs_proto::{
    AccessFlags, AttrMask, Gather, Mtu, QpAttr, QpCaps, QpInit, QpState as EngineQpState, QpType,
    RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest,
};
use std::ffi::{c_int, c_void};

/// `enum ibv_qp_type` values.
const QPT_RC: u32 = 2;
const QPT_UC: u32 = 3;
const QPT_UD: u32 = 4;

/// `enum ibv_wr_opcode` values.
const WR_RDMA_WRITE: u32 = 0;
const WR_RDMA_WRITE_WITH_IMM: u32 = 1;
const WR_SEND: u32 = 2;
const WR_SEND_WITH_IMM: u32 = 3;
const WR_RDMA_READ: u32 = 4;
const WR_ATOMIC_CMP_AND_SWP: u32 = 5;
const WR_ATOMIC_FETCH_AND_ADD: u32 = 6;
const WR_SEND_WITH_INV: u32 = 9;

/// `enum ibv_send_flags` the device honours.
const SEND_FLAGS_KNOWN: u32 = 0xf;

/// The library's part of a QP.
pub struct QpState {
    /// The QP number.
    pub qpn: u32,
    /// The device.
    pub entry: &'static DeviceEntry,
    qp_type: QpType,
    caps: QpCaps,
}

impl Tagged for QpState {
    const MAGIC: u64 = u64::from_be_bytes(*b"svqp\0\0\0\x01");
}

/// A QP as C sees it, followed by its state.
pub type QpBlock = Block<ibv_qp, QpState>;

fn qp_type(raw: u32) -> Result<QpType, Errno> {
    match raw {
        QPT_RC => Ok(QpType::Rc),
        QPT_UC => Ok(QpType::Uc),
        QPT_UD => Ok(QpType::Ud),
        // XRC, raw packet, driver QPs: not offered by the soft device.
        _ => Err(libc::EOPNOTSUPP),
    }
}

fn raw_qp_type(t: QpType) -> u32 {
    match t {
        QpType::Rc => QPT_RC,
        QpType::Uc => QPT_UC,
        QpType::Ud => QPT_UD,
    }
}

fn ibv_cap(caps: &QpCaps) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: caps.max_send_wr,
        max_recv_wr: caps.max_recv_wr,
        max_send_sge: caps.max_send_sge,
        max_recv_sge: caps.max_recv_sge,
        max_inline_data: caps.max_inline_data,
    }
}

/// `ibv_create_qp(3)`: `NULL` with errno: `EINVAL` (bad PD, CQ, SRQ or capacities above
/// the device's), `EOPNOTSUPP` (a QP type the device has no transport for). On success
/// `init_attr->cap` holds the capacities the QP really has.
///
/// # Safety
///
/// `pd` is NULL or a live PD; `init_attr` is NULL or a readable and writable struct whose
/// CQ and SRQ pointers are NULL or live.
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    init_attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    pointer(|| {
        // SAFETY: per the contract.
        unsafe { PdBlock::from_ptr(pd) }?;
        if init_attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: readable per the contract.
        let attr = unsafe { init_attr.read() };
        // SAFETY: a live PD's field, and its open context.
        let context = unsafe { (*pd).context };
        // SAFETY: as above.
        let ctx = unsafe { ContextBlock::from_ptr(context) }?;
        let qp_type = qp_type(attr.qp_type)?;
        // SAFETY: the CQ pointers are NULL or live per the contract.
        let (send_cq, recv_cq) = unsafe { (cq_state(attr.send_cq)?, cq_state(attr.recv_cq)?) };
        let srq = if attr.srq.is_null() {
            None
        } else {
            // SAFETY: live per the contract.
            Some(unsafe { srq_state(attr.srq) }?.id)
        };
        if srq.is_some() && qp_type == QpType::Ud {
            // An SRQ with UD is allowed by IBTA, but the engine only attaches SRQs to
            // connected QPs.
            return Err(libc::EOPNOTSUPP);
        }
        let device = &ctx.entry.device;
        let limits = device.query_device();
        let cap = attr.cap;
        let sge_max = limits.max_sge;
        if cap.max_send_wr > limits.max_qp_wr
            || (srq.is_none() && cap.max_recv_wr > limits.max_qp_wr)
            || cap.max_send_sge > sge_max
            || cap.max_recv_sge > sge_max
        {
            return Err(libc::EINVAL);
        }
        let caps = QpCaps {
            // A queue of 0 still holds what the engine needs to run it; C asked for none.
            max_send_wr: cap.max_send_wr.max(1),
            max_recv_wr: if srq.is_some() {
                0
            } else {
                cap.max_recv_wr.max(1)
            },
            max_send_sge: cap.max_send_sge.max(1),
            max_recv_sge: cap.max_recv_sge.max(1),
            max_inline_data: cap.max_inline_data,
        };
        let init = QpInit {
            qp_type,
            caps,
            sq_sig_all: attr.sq_sig_all != 0,
            srq,
        };
        let qpn = device
            .create_qp(init, send_cq.cq.producer(), recv_cq.cq.producer())
            .map_err(|e| e.errno())?;
        let caps = device
            .query_qp(qpn)
            .map(|(_, init)| init.caps)
            .unwrap_or(caps);
        // SAFETY: writable per the contract.
        unsafe { (&raw mut (*init_attr).cap).write(ibv_cap(&caps)) };
        let qp = ibv_qp {
            context,
            qp_context: attr.qp_context,
            pd,
            send_cq: attr.send_cq,
            recv_cq: attr.recv_cq,
            srq: attr.srq,
            handle: qpn,
            qp_num: qpn,
            state: EngineQpState::Reset.to_raw(),
            qp_type: attr.qp_type,
            mutex: PthreadMutex::default(),
            cond: PthreadCond::default(),
            events_completed: 0,
        };
        let ptr = QpBlock::allocate(
            qp,
            QpState {
                qpn,
                entry: ctx.entry,
                qp_type,
                caps,
            },
        );
        with_registry(|r| r.qps.insert(qpn, ptr as usize));
        Ok(ptr)
    })
}
symver!(ibv_create_qp, "IBVERBS_1.1");

/// `ibv_destroy_qp(3)`: the QP's outstanding work requests are discarded and its CQs may be
/// destroyed afterwards.
///
/// # Safety
///
/// `qp` is NULL or a live QP, not used again after a successful call.
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    errno_code(|| {
        // SAFETY: per the contract.
        let state = unsafe { QpBlock::state(qp) }?;
        state
            .entry
            .device
            .destroy_qp(state.qpn)
            .map_err(|e| e.errno())?;
        with_registry(|r| r.qps.remove(&state.qpn));
        // SAFETY: checked; the caller gives it up.
        unsafe { QpBlock::free(qp) };
        Ok(())
    })
}
symver!(ibv_destroy_qp, "IBVERBS_1.1");

/// The engine's attributes for a C `ibv_qp_attr` and mask: `EINVAL` for unknown mask bits
/// or values `verbs.h` does not define.
fn engine_attr(
    attr: &ibv_qp_attr,
    mask: c_int,
    qp_type: QpType,
) -> Result<(QpAttr, AttrMask), Errno> {
    let mask = AttrMask::from_bits(mask as u32).ok_or(libc::EINVAL)?;
    let state = |raw| EngineQpState::from_raw(raw).ok_or(libc::EINVAL);
    let mut out = QpAttr::default();
    if mask.contains(AttrMask::STATE) {
        out.qp_state = state(attr.qp_state)?;
    }
    if mask.contains(AttrMask::CUR_STATE) {
        out.cur_qp_state = state(attr.cur_qp_state)?;
    }
    if mask.contains(AttrMask::PATH_MTU) {
        out.path_mtu = Mtu::from_raw(attr.path_mtu).ok_or(libc::EINVAL)?;
    }
    if mask.contains(AttrMask::AV) {
        // RoCE: the GRH is the address (no GRH, no route; what a RoCE device answers).
        out.ah_attr = address_vector(&attr.ah_attr)?;
    }
    if mask.contains(AttrMask::ACCESS_FLAGS) {
        out.qp_access_flags = AccessFlags::from_bits(attr.qp_access_flags).ok_or(libc::EINVAL)?;
    }
    out.qkey = attr.qkey;
    out.rq_psn = attr.rq_psn;
    out.sq_psn = attr.sq_psn;
    out.dest_qp_num = attr.dest_qp_num;
    out.pkey_index = attr.pkey_index;
    out.en_sqd_async_notify = attr.en_sqd_async_notify != 0;
    out.max_rd_atomic = attr.max_rd_atomic;
    out.max_dest_rd_atomic = attr.max_dest_rd_atomic;
    out.min_rnr_timer = attr.min_rnr_timer;
    out.port_num = attr.port_num;
    out.timeout = attr.timeout;
    out.retry_cnt = attr.retry_cnt;
    out.rnr_retry = attr.rnr_retry;
    let _ = qp_type;
    Ok((out, mask))
}

/// `ibv_modify_qp(3)`: 0 or an errno value (`EINVAL` for an illegal transition, a missing
/// or forbidden attribute, or a bad value); on failure nothing changed.
///
/// # Safety
///
/// `qp` is NULL or a live QP; `attr` is NULL or readable.
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    errno_code(|| {
        // SAFETY: per the contract.
        let state = unsafe { QpBlock::state(qp) }?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: readable per the contract.
        let (attr, mask) = engine_attr(&unsafe { attr.read() }, mask, state.qp_type)?;
        let device = &state.entry.device;
        device
            .modify_qp(state.qpn, &attr, mask)
            .map_err(|e| e.errno())?;
        if let Some(now) = device.qp_state(state.qpn) {
            // SAFETY: the live QP's field, which the library keeps.
            unsafe { (&raw mut (*qp).state).write(now.to_raw()) };
        }
        Ok(())
    })
}
symver!(ibv_modify_qp, "IBVERBS_1.1");

/// `ibv_query_qp(3)`: every attribute (the mask is a hint, as the man page allows) and the
/// creation parameters.
///
/// # Safety
///
/// `qp` is NULL or a live QP; `attr` and `init_attr` are NULL or writable.
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    errno_code(|| {
        // SAFETY: per the contract.
        let state = unsafe { QpBlock::state(qp) }?;
        if attr.is_null() || init_attr.is_null() {
            return Err(libc::EINVAL);
        }
        let (a, init) = state
            .entry
            .device
            .query_qp(state.qpn)
            .map_err(|e| e.errno())?;
        let cap = ibv_cap(&init.caps);
        let out = ibv_qp_attr {
            qp_state: a.qp_state.to_raw(),
            cur_qp_state: a.qp_state.to_raw(),
            path_mtu: a.path_mtu.to_raw(),
            path_mig_state: 0,
            qkey: a.qkey,
            rq_psn: a.rq_psn,
            sq_psn: a.sq_psn,
            dest_qp_num: a.dest_qp_num,
            qp_access_flags: a.qp_access_flags.bits(),
            cap,
            ah_attr: ah_attr(&a.ah_attr),
            alt_ah_attr: ah_attr(&Default::default()),
            pkey_index: a.pkey_index,
            alt_pkey_index: 0,
            en_sqd_async_notify: u8::from(a.en_sqd_async_notify),
            sq_draining: 0,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            port_num: a.port_num,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            alt_port_num: 0,
            alt_timeout: 0,
            rate_limit: 0,
        };
        // SAFETY: the live QP's fields; the out-structs are writable per the contract.
        unsafe {
            (&raw mut (*qp).state).write(a.qp_state.to_raw());
            attr.write(out);
            init_attr.write(ibv_qp_init_attr {
                qp_context: (*qp).qp_context,
                send_cq: (*qp).send_cq,
                recv_cq: (*qp).recv_cq,
                srq: (*qp).srq,
                cap,
                qp_type: raw_qp_type(init.qp_type),
                sq_sig_all: c_int::from(init.sq_sig_all),
            });
        }
        Ok(())
    })
}
symver!(ibv_query_qp, "IBVERBS_1.1");

/// Reads a C scatter/gather list of `num_sge` entries.
///
/// # Safety
///
/// `sg_list` is readable for `num_sge` entries when `num_sge > 0`.
unsafe fn sges(sg_list: *const ibv_sge, num_sge: c_int, max: u32) -> Result<Vec<Sge>, Errno> {
    if num_sge < 0 || num_sge as u32 > max || (num_sge > 0 && sg_list.is_null()) {
        return Err(libc::EINVAL);
    }
    let mut out = Vec::with_capacity(num_sge as usize);
    for i in 0..num_sge as usize {
        // SAFETY: readable per the contract.
        let s = unsafe { sg_list.add(i).read() };
        out.push(Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        });
    }
    Ok(out)
}

/// Copies an inline payload out of the application's buffers (`IBV_SEND_INLINE`: the
/// buffers may be reused as soon as `ibv_post_send` returns; the lkeys are not checked).
///
/// # Safety
///
/// Every entry's `[addr, addr + length)` is readable (the `ibv_post_send(3)` contract).
unsafe fn inline_payload(list: &[Sge], max: u32) -> Result<Vec<u8>, Errno> {
    let total: u64 = list.iter().map(|s| u64::from(s.length)).sum();
    if total > u64::from(max) {
        return Err(libc::EINVAL);
    }
    let mut bytes = Vec::with_capacity(total as usize);
    for s in list.iter().filter(|s| s.length > 0) {
        // SAFETY: readable per the contract.
        let src = unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.length as usize) };
        bytes.extend_from_slice(src);
    }
    Ok(bytes)
}

/// The engine's work request for a C one.
///
/// # Safety
///
/// `wr`'s pointers are valid as `ibv_post_send(3)` requires.
unsafe fn send_wr(wr: &ibv_send_wr, state: &QpState) -> Result<SendWr, Errno> {
    // SAFETY: forwarded contract.
    let list = unsafe { sges(wr.sg_list, wr.num_sge, state.caps.max_send_sge) }?;
    if wr.send_flags & !SEND_FLAGS_KNOWN != 0 {
        return Err(libc::EINVAL);
    }
    let flags = SendFlags::from_bits_truncate(wr.send_flags);
    let imm = u32::from_be(wr.imm_data);
    // SAFETY: the union member the opcode selects (all members are plain data).
    let (rdma, atomic) = unsafe { (wr.wr.rdma, wr.wr.atomic) };
    let op = match wr.opcode {
        WR_SEND => SendOp::Send,
        WR_SEND_WITH_IMM => SendOp::SendWithImm { imm },
        WR_SEND_WITH_INV => SendOp::SendWithInv {
            invalidate_rkey: wr.imm_data,
        },
        WR_RDMA_WRITE => SendOp::RdmaWrite {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        WR_RDMA_WRITE_WITH_IMM => SendOp::RdmaWriteWithImm {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
            imm,
        },
        WR_RDMA_READ => SendOp::RdmaRead {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        WR_ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        WR_ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            add: atomic.compare_add,
        },
        _ => return Err(libc::EINVAL),
    };
    let inline = flags.contains(SendFlags::INLINE) && !op.is_read_or_atomic();
    let gather = if inline {
        // SAFETY: forwarded contract.
        Gather::Inline(unsafe { inline_payload(&list, state.caps.max_inline_data) }?)
    } else {
        Gather::Sges(list)
    };
    let ud = if state.qp_type == QpType::Ud {
        // SAFETY: the UD member, per the QP type.
        let ud = unsafe { wr.wr.ud };
        // SAFETY: the AH is NULL or live per the contract.
        let ah = unsafe { AhBlock::state(ud.ah) }?;
        Some(UdDest {
            av: ah.av,
            remote_qpn: ud.remote_qpn,
            remote_qkey: ud.remote_qkey,
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

/// Posts a C list of work requests one by one; on the first failure `*bad_wr` names it
/// and its errno is returned (the ones before it were posted).
pub(crate) fn post_list<W>(
    first: *mut W,
    bad_wr: *mut *mut W,
    next: impl Fn(&W) -> *mut W,
    mut post: impl FnMut(&W) -> Result<(), Errno>,
) -> c_int {
    let mut wr = first;
    let result = guarded(|| {
        while !wr.is_null() {
            // SAFETY: the list is readable (the `ibv_post_*(3)` contract).
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
                // SAFETY: writable per the contract.
                unsafe { bad_wr.write(wr) };
            }
            e
        }
    }
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
    // SAFETY: per the contract.
    let state = match unsafe { QpBlock::state(qp) } {
        Ok(s) => s,
        Err(e) => return post_list(wr, bad_wr, |w| w.next, |_| Err(e)),
    };
    post_list(
        wr,
        bad_wr,
        |w| w.next,
        |w| {
            // SAFETY: per the contract.
            let request = unsafe { send_wr(w, state) }?;
            state
                .entry
                .device
                .post_send(state.qpn, request)
                .map_err(|e| e.errno())
        },
    )
}

/// The engine's receive request for a C one.
///
/// # Safety
///
/// `wr.sg_list` is readable for `wr.num_sge` entries.
pub unsafe fn recv_wr(wr: &ibv_recv_wr, max_sge: u32) -> Result<RecvWr, Errno> {
    Ok(RecvWr {
        wr_id: wr.wr_id,
        // SAFETY: forwarded contract.
        sg_list: unsafe { sges(wr.sg_list, wr.num_sge, max_sge) }?,
    })
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
    // SAFETY: per the contract.
    let state = match unsafe { QpBlock::state(qp) } {
        Ok(s) => s,
        Err(e) => return post_list(wr, bad_wr, |w| w.next, |_| Err(e)),
    };
    post_list(
        wr,
        bad_wr,
        |w| w.next,
        |w| {
            // SAFETY: per the contract.
            let request = unsafe { recv_wr(w, state.caps.max_recv_sge) }?;
            state
                .entry
                .device
                .post_recv(state.qpn, request)
                .map_err(|e| e.errno())
        },
    )
}

unsupported! {
    /// `ibv_attach_mcast(3)`: the soft device has no multicast.
    errno "IBVERBS_1.1" fn ibv_attach_mcast(*mut ibv_qp, *const ibv_gid, u16)
}
unsupported! {
    /// `ibv_detach_mcast(3)`: the soft device has no multicast.
    errno "IBVERBS_1.1" fn ibv_detach_mcast(*mut ibv_qp, *const ibv_gid, u16)
}
unsupported! {
    /// `ibv_qp_to_qp_ex` (`ibv_wr_post(3)`).
    null "IBVERBS_1.6" fn ibv_qp_to_qp_ex(*mut ibv_qp) -> *mut ibv_qp_ex
}
unsupported! {
    /// `ibv_query_ece(3)`: enhanced connection establishment is not offered.
    errno "IBVERBS_1.10" fn ibv_query_ece(*mut ibv_qp, *mut c_void)
}
unsupported! {
    /// `ibv_set_ece(3)`: enhanced connection establishment is not offered.
    errno "IBVERBS_1.10" fn ibv_set_ece(*mut ibv_qp, *mut c_void)
}

/// `ibv_query_qp_data_in_order(3)`: 0, "not guaranteed" (the answer for an unknown
/// ordering).
pub extern "C" fn ibv_query_qp_data_in_order(_: *mut ibv_qp, _: u32, _: u32) -> c_int {
    0
}
crate::symver!(ibv_query_qp_data_in_order, "IBVERBS_1.14");
