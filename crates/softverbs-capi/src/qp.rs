//! Queue pairs and their work requests.
//!
//! | function | version | status |
//! |---|---|---|
//! | `ibv_create_qp`, `ibv_destroy_qp`, `ibv_modify_qp`, `ibv_query_qp` | 1.1 | real: RC, UC, UD |
//! | `ibv_attach_mcast`, `ibv_detach_mcast` | 1.1 | documented failure (`EOPNOTSUPP`): no multicast |
//! | `ibv_qp_to_qp_ex` | 1.6 | real: the `ibv_qp_ex` of a QP made by `ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`, else `NULL` |
//! | `ibv_query_qp_data_in_order` | 1.14 | 0 ("not guaranteed"), the documented answer when unknown |
//! | `ibv_query_ece`, `ibv_set_ece` | 1.10 | `EOPNOTSUPP` (documented: no ECE) |
//! | `ops.post_send`, `ops.post_recv` | (ops) | real; a list stops at the first bad request (`*bad_wr`) |
//! | `verbs_context.create_qp_ex` | (ops) | real: PD, no create flags, `send_ops_flags` for the work-request builders (send, send with immediate / invalidate, RDMA write (with immediate), RDMA read, both atomics) |
//! | `ibv_qp_ex` builders (`ibv_wr_start` … `ibv_wr_complete`) | (ops) | real for the operations above and every `set_*` but XRC; a builder's error is returned by `ibv_wr_complete`, which then posts nothing |
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
use crate::handles::{
    once_acknowledged, with_registry, Block, ContextBlock, DeviceEntry, Tagged, DESTROY_ACK_WAIT,
};
use crate::pd::PdUse;
use crate::srq::srq_state;
use softverbs_proto::{
    AccessFlags, AttrMask, Gather, Mtu, QpAttr, QpCaps, QpInit, QpState as EngineQpState, QpType,
    RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest,
};
use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};

/// `enum ibv_qp_type` values.
const QPT_RC: u32 = 2;
const QPT_UC: u32 = 3;
const QPT_UD: u32 = 4;
const QPT_RAW_PACKET: u32 = 8;
const QPT_XRC_SEND: u32 = 9;
const QPT_XRC_RECV: u32 = 10;
const QPT_DRIVER: u32 = 0xff;

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
    /// Created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`: `ibv_qp_to_qp_ex` hands it out.
    extended: bool,
    _pd: PdUse,
    /// The work requests built since `ibv_wr_start` (one thread at a time, between
    /// `ibv_wr_start` and `ibv_wr_complete` / `ibv_wr_abort`, as `ibv_wr_post(3)` requires).
    batch: UnsafeCell<Batch>,
}

/// Work requests built with the `ibv_qp_ex` builders, posted by `ibv_wr_complete`.
#[derive(Default)]
struct Batch {
    requests: Vec<SendWr>,
    /// The first error of the batch (a builder cannot return one): `ibv_wr_complete`
    /// returns it and posts nothing.
    error: Option<Errno>,
}

impl Tagged for QpState {
    const MAGIC: u64 = u64::from_be_bytes(*b"svqp\0\0\0\x01");
}

/// A QP as C sees it (an `ibv_qp_ex`, whose first member is the `ibv_qp`), followed by its
/// state.
pub type QpBlock = Block<ibv_qp_ex, QpState>;

/// The state of a QP pointer from C.
///
/// # Safety
///
/// `qp` is NULL or a live QP of this library.
unsafe fn qp_state<'a>(qp: *mut ibv_qp) -> Result<&'a QpState, Errno> {
    // SAFETY: per the contract (a QP block begins with its `ibv_qp`).
    unsafe { QpBlock::state(qp.cast()) }
}

fn qp_type(raw: u32) -> Result<QpType, Errno> {
    match raw {
        QPT_RC => Ok(QpType::Rc),
        QPT_UC => Ok(QpType::Uc),
        QPT_UD => Ok(QpType::Ud),
        // Raw packet, XRC send and receive, driver QPs: types `verbs.h` defines that the
        // soft device does not offer.
        QPT_RAW_PACKET | QPT_XRC_SEND | QPT_XRC_RECV | QPT_DRIVER => Err(libc::EOPNOTSUPP),
        // A value `verbs.h` does not define: the kernel's create_qp answers EINVAL.
        _ => Err(libc::EINVAL),
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

/// What creation asked for, from `ibv_create_qp` or `ibv_create_qp_ex`.
struct QpRequest {
    pd: *mut ibv_pd,
    attr: ibv_qp_init_attr,
    send_ops: Option<u64>,
}

/// Creates a QP block; returns it and the capacities the QP really has.
///
/// # Safety
///
/// `request.pd` is NULL or a live PD; the attributes' CQ and SRQ pointers are NULL or live.
unsafe fn create(request: QpRequest) -> Result<(*mut ibv_qp, ibv_qp_cap), Errno> {
    let QpRequest { pd, attr, send_ops } = request;
    // SAFETY: per the contract.
    let hold = unsafe { PdUse::acquire(pd) }?;
    // SAFETY: a live PD's fields, and its open context.
    let (context, pd_handle) = unsafe { ((*pd).context, (*pd).handle) };
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
        // The device's PD number (`ibv_alloc_pd` set `pd->handle` to it, as `ibv_reg_mr`
        // reads it): every L_Key and R_Key the QP uses must be of a region of this PD.
        pd: pd_handle,
    };
    let qpn = device
        .create_qp(init, send_cq.cq.producer(), recv_cq.cq.producer())
        .map_err(|e| e.errno())?;
    let caps = device
        .query_qp(qpn)
        .map(|(_, init)| init.caps)
        .unwrap_or(caps);
    let qp_base = ibv_qp {
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
        builders(qp_base, send_ops.unwrap_or(0)),
        QpState {
            qpn,
            entry: ctx.entry,
            qp_type,
            caps,
            extended: send_ops.is_some(),
            _pd: hold,
            batch: UnsafeCell::new(Batch::default()),
        },
    );
    with_registry(|r| r.qps.insert(qpn, ptr as usize));
    Ok((ptr.cast(), ibv_cap(&caps)))
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
        if init_attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: readable per the contract.
        let attr = unsafe { init_attr.read() };
        // SAFETY: per the contract.
        let (qp, cap) = unsafe {
            create(QpRequest {
                pd,
                attr,
                send_ops: None,
            })
        }?;
        // SAFETY: writable per the contract.
        unsafe { (&raw mut (*init_attr).cap).write(cap) };
        Ok(qp)
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
        let state = unsafe { qp_state(qp) }?;
        // Its delivered async events acknowledged, it leaves the registry: no later event
        // names it (`ibv_get_async_event(3)`).
        once_acknowledged(qp as usize, DESTROY_ACK_WAIT, |r| r.qps.remove(&state.qpn))?;
        if let Err(e) = state.entry.device.destroy_qp(state.qpn) {
            with_registry(|r| r.qps.insert(state.qpn, qp as usize));
            return Err(e.errno());
        }
        // SAFETY: checked; the caller gives it up.
        unsafe { QpBlock::free(qp.cast()) };
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
        let state = unsafe { qp_state(qp) }?;
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
        let state = unsafe { qp_state(qp) }?;
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
    let state = unsafe { qp_state(qp) };
    post_list(
        wr,
        bad_wr,
        |w| w.next,
        |w| {
            let state = state?;
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
    let state = unsafe { qp_state(qp) };
    post_list(
        wr,
        bad_wr,
        |w| w.next,
        |w| {
            let state = state?;
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

// ------------------------------------------------------------ ibv_qp_ex (ibv_wr_post(3))

/// `IBV_QP_INIT_ATTR_PD`.
const INIT_ATTR_PD: u32 = 1 << 0;
/// `IBV_QP_INIT_ATTR_CREATE_FLAGS`.
const INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`.
const INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;

/// `IBV_QP_EX_WITH_*`: the builders a QP can be created with.
const WITH_RDMA_WRITE: u64 = 1 << 0;
const WITH_RDMA_WRITE_WITH_IMM: u64 = 1 << 1;
const WITH_SEND: u64 = 1 << 2;
const WITH_SEND_WITH_IMM: u64 = 1 << 3;
const WITH_RDMA_READ: u64 = 1 << 4;
const WITH_ATOMIC_CMP_AND_SWP: u64 = 1 << 5;
const WITH_ATOMIC_FETCH_AND_ADD: u64 = 1 << 6;
const WITH_SEND_WITH_INV: u64 = 1 << 9;
/// What the device offers (no local invalidate, memory windows, TSO, atomic write).
const SUPPORTED_SEND_OPS: u64 = WITH_RDMA_WRITE
    | WITH_RDMA_WRITE_WITH_IMM
    | WITH_SEND
    | WITH_SEND_WITH_IMM
    | WITH_RDMA_READ
    | WITH_ATOMIC_CMP_AND_SWP
    | WITH_ATOMIC_FETCH_AND_ADD
    | WITH_SEND_WITH_INV;

/// The `ibv_qp_ex` of a QP: the builders of the operations in `send_ops` (the others stay
/// NULL: the application did not ask for them).
fn builders(qp_base: ibv_qp, send_ops: u64) -> ibv_qp_ex {
    let with = |flag: u64| send_ops & flag != 0;
    let any = send_ops != 0;
    ibv_qp_ex {
        qp_base,
        comp_mask: 0,
        wr_id: 0,
        wr_flags: 0,
        wr_atomic_cmp_swp: with(WITH_ATOMIC_CMP_AND_SWP).then_some(wr_atomic_cmp_swp as _),
        wr_atomic_fetch_add: with(WITH_ATOMIC_FETCH_AND_ADD).then_some(wr_atomic_fetch_add as _),
        wr_bind_mw: None,
        wr_local_inv: None,
        wr_rdma_read: with(WITH_RDMA_READ).then_some(wr_rdma_read as _),
        wr_rdma_write: with(WITH_RDMA_WRITE).then_some(wr_rdma_write as _),
        wr_rdma_write_imm: with(WITH_RDMA_WRITE_WITH_IMM).then_some(wr_rdma_write_imm as _),
        wr_send: with(WITH_SEND).then_some(wr_send as _),
        wr_send_imm: with(WITH_SEND_WITH_IMM).then_some(wr_send_imm as _),
        wr_send_inv: with(WITH_SEND_WITH_INV).then_some(wr_send_inv as _),
        wr_send_tso: None,
        wr_set_ud_addr: any.then_some(wr_set_ud_addr as _),
        wr_set_xrc_srqn: None,
        wr_set_inline_data: any.then_some(wr_set_inline_data as _),
        wr_set_inline_data_list: any.then_some(wr_set_inline_data_list as _),
        wr_set_sge: any.then_some(wr_set_sge as _),
        wr_set_sge_list: any.then_some(wr_set_sge_list as _),
        wr_start: any.then_some(wr_start as _),
        wr_complete: any.then_some(wr_complete as _),
        wr_abort: any.then_some(wr_abort as _),
        wr_atomic_write: None,
    }
}

/// `verbs_context.create_qp_ex` (`ibv_create_qp_ex(3)`): a PD is required; `create_flags`
/// must be 0 (the device has none of them); `send_ops_flags` outside what the device
/// offers is `EOPNOTSUPP`; XRC, TSO, RSS and indirection tables are `EOPNOTSUPP`.
///
/// # Safety
///
/// `context` is NULL or an open context; `attr` is NULL or a readable and writable
/// struct whose PD, CQ and SRQ pointers are NULL or live.
pub unsafe extern "C" fn create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    pointer(|| {
        // SAFETY: per the contract.
        unsafe { ContextBlock::from_ptr(context) }?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: readable per the contract.
        let a = unsafe { attr.read() };
        let known = INIT_ATTR_PD | INIT_ATTR_CREATE_FLAGS | INIT_ATTR_SEND_OPS_FLAGS;
        if a.comp_mask & !known != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        if a.comp_mask & INIT_ATTR_PD == 0 {
            return Err(libc::EINVAL);
        }
        if a.comp_mask & INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let send_ops = if a.comp_mask & INIT_ATTR_SEND_OPS_FLAGS != 0 {
            if a.send_ops_flags & !SUPPORTED_SEND_OPS != 0 {
                return Err(libc::EOPNOTSUPP);
            }
            Some(a.send_ops_flags)
        } else {
            None
        };
        let base = ibv_qp_init_attr {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        };
        // SAFETY: per the contract.
        let (qp, cap) = unsafe {
            create(QpRequest {
                pd: a.pd,
                attr: base,
                send_ops,
            })
        }?;
        // SAFETY: writable per the contract.
        unsafe { (&raw mut (*attr).cap).write(cap) };
        Ok(qp)
    })
}

/// `ibv_qp_to_qp_ex` (`ibv_wr_post(3)`): the QP's `ibv_qp_ex` when it was created with
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`, else `NULL` (as libibverbs).
///
/// # Safety
///
/// `qp` is NULL or a live QP.
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    crate::boundary::infallible(std::ptr::null_mut(), || {
        // SAFETY: per the contract.
        match unsafe { qp_state(qp) } {
            Ok(state) if state.extended => qp.cast(),
            _ => std::ptr::null_mut(),
        }
    })
}
symver!(ibv_qp_to_qp_ex, "IBVERBS_1.6");

/// Runs a builder on the QP's batch (nothing happens for a pointer that is not one of
/// our extended QPs: the builders have no way to report it).
fn with_batch(qpx: *mut ibv_qp_ex, f: impl FnOnce(&QpState, &mut Batch)) {
    crate::boundary::infallible((), || {
        // SAFETY: the builders are only reachable through a live extended QP of ours.
        let Ok(state) = (unsafe { QpBlock::state(qpx) }) else {
            return;
        };
        // SAFETY: between `ibv_wr_start` and `ibv_wr_complete` one thread at a time
        // (ibv_wr_post(3)).
        let batch = unsafe { &mut *state.batch.get() };
        f(state, batch);
    })
}

/// Starts the next work request of the batch with `op`, taking `wr_id` and `wr_flags`
/// from the `ibv_qp_ex` as they are now.
fn begin(qpx: *mut ibv_qp_ex, op: SendOp) {
    // SAFETY: the application's fields of the live QP.
    let (wr_id, flags) = unsafe {
        (
            (&raw const (*qpx).wr_id).read(),
            (&raw const (*qpx).wr_flags).read(),
        )
    };
    with_batch(qpx, |_, batch| {
        if flags & !SEND_FLAGS_KNOWN != 0 {
            batch.error.get_or_insert(libc::EINVAL);
        }
        batch.requests.push(SendWr {
            wr_id,
            op,
            gather: Gather::Sges(Vec::new()),
            flags: SendFlags::from_bits_truncate(flags),
            ud: None,
        });
    });
}

/// Sets the payload of the request being built.
fn set_gather(qpx: *mut ibv_qp_ex, gather: Result<Gather, Errno>) {
    with_batch(qpx, |_, batch| match (batch.requests.last_mut(), gather) {
        (Some(wr), Ok(gather)) => wr.gather = gather,
        (_, Err(e)) => {
            batch.error.get_or_insert(e);
        }
        (None, Ok(_)) => {
            batch.error.get_or_insert(libc::EINVAL);
        }
    });
}

unsafe extern "C" fn wr_start(qpx: *mut ibv_qp_ex) {
    with_batch(qpx, |_, batch| *batch = Batch::default());
}

unsafe extern "C" fn wr_complete(qpx: *mut ibv_qp_ex) -> c_int {
    let mut result = Ok(());
    with_batch(qpx, |state, batch| {
        let Batch { requests, error } = std::mem::take(batch);
        result = match error {
            Some(e) => Err(e),
            None => requests.into_iter().try_for_each(|wr| {
                state
                    .entry
                    .device
                    .post_send(state.qpn, wr)
                    .map_err(|e| e.errno())
            }),
        };
    });
    result.err().unwrap_or(0)
}

unsafe extern "C" fn wr_abort(qpx: *mut ibv_qp_ex) {
    with_batch(qpx, |_, batch| *batch = Batch::default());
}

unsafe extern "C" fn wr_send(qpx: *mut ibv_qp_ex) {
    begin(qpx, SendOp::Send);
}

unsafe extern "C" fn wr_send_imm(qpx: *mut ibv_qp_ex, imm_data: u32) {
    begin(
        qpx,
        SendOp::SendWithImm {
            imm: u32::from_be(imm_data),
        },
    );
}

unsafe extern "C" fn wr_send_inv(qpx: *mut ibv_qp_ex, invalidate_rkey: u32) {
    begin(qpx, SendOp::SendWithInv { invalidate_rkey });
}

unsafe extern "C" fn wr_rdma_write(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    begin(qpx, SendOp::RdmaWrite { remote_addr, rkey });
}

unsafe extern "C" fn wr_rdma_write_imm(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm_data: u32,
) {
    begin(
        qpx,
        SendOp::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm: u32::from_be(imm_data),
        },
    );
}

unsafe extern "C" fn wr_rdma_read(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    begin(qpx, SendOp::RdmaRead { remote_addr, rkey });
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    begin(
        qpx,
        SendOp::CompareSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        },
    );
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    begin(
        qpx,
        SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        },
    );
}

unsafe extern "C" fn wr_set_sge(qpx: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    set_gather(qpx, Ok(Gather::Sges(vec![Sge { addr, length, lkey }])));
}

unsafe extern "C" fn wr_set_sge_list(qpx: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge) {
    // SAFETY: the builder's contract: `sg_list` has `num_sge` readable entries.
    let max = unsafe { QpBlock::state(qpx) }.map_or(0, |s| s.caps.max_send_sge);
    let num = c_int::try_from(num_sge).unwrap_or(c_int::MAX);
    // SAFETY: as above.
    set_gather(qpx, unsafe { sges(sg_list, num, max) }.map(Gather::Sges));
}

unsafe extern "C" fn wr_set_inline_data(qpx: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    let buf = ibv_data_buf { addr, length };
    // SAFETY: the builder's contract: `addr` is readable for `length` bytes.
    unsafe { wr_set_inline_data_list(qpx, 1, &buf) };
}

unsafe extern "C" fn wr_set_inline_data_list(
    qpx: *mut ibv_qp_ex,
    num_buf: usize,
    buf_list: *const ibv_data_buf,
) {
    // SAFETY: the builders are only reachable through a live QP of ours.
    let max = unsafe { QpBlock::state(qpx) }.map_or(0, |s| s.caps.max_inline_data);
    let gather = (|| {
        if num_buf > 0 && buf_list.is_null() {
            return Err(libc::EINVAL);
        }
        let mut list = Vec::with_capacity(num_buf);
        for i in 0..num_buf {
            // SAFETY: the builder's contract: `num_buf` readable entries.
            let b = unsafe { buf_list.add(i).read() };
            let length = u32::try_from(b.length).map_err(|_| libc::EINVAL)?;
            list.push(Sge {
                addr: b.addr as u64,
                length,
                lkey: 0,
            });
        }
        // SAFETY: each buffer is readable for its length (the builder's contract); the
        // bytes are copied now, so the application may reuse them on return.
        unsafe { inline_payload(&list, max) }.map(Gather::Inline)
    })();
    set_gather(qpx, gather);
}

unsafe extern "C" fn wr_set_ud_addr(
    qpx: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    // SAFETY: the AH is NULL or live (the builder's contract).
    let av = unsafe { AhBlock::state(ah) }.map(|a| (a.av, a.pd));
    with_batch(qpx, |_, batch| match (batch.requests.last_mut(), av) {
        (Some(wr), Ok((av, pd))) => {
            wr.ud = Some(UdDest {
                av,
                remote_qpn,
                remote_qkey,
                pd,
            })
        }
        (_, Err(e)) => {
            batch.error.get_or_insert(e);
        }
        (None, Ok(_)) => {
            batch.error.get_or_insert(libc::EINVAL);
        }
    });
}
