//! QP attribute translation: the C QP type and capacities to the engine's and back, and
//! `ibv_qp_attr` ↔ the engine's attributes for `ibv_modify_qp` and `ibv_query_qp`.

use super::state::QpBlock;
use crate::abi::*;
use crate::ah::{address_vector, ah_attr};
use crate::boundary::{errno_code, errno_of, Errno};
use crate::verbs_h::{
    IBV_QPT_DRIVER, IBV_QPT_RAW_PACKET, IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, IBV_QPT_XRC_RECV,
    IBV_QPT_XRC_SEND,
};
use softverbs::core::engine::{
    AccessFlags, AttrMask, Mtu, QpAttr, QpCaps, QpState as EngineQpState, QpType,
};
use std::ffi::c_int;

/// The engine's QP type for a C `enum ibv_qp_type` value.
pub(super) fn qp_type(raw: u32) -> Result<QpType, Errno> {
    match raw {
        IBV_QPT_RC => Ok(QpType::Rc),
        IBV_QPT_UC => Ok(QpType::Uc),
        IBV_QPT_UD => Ok(QpType::Ud),
        // Raw packet, XRC send and receive, driver QPs: types `verbs.h` defines that the
        // soft device does not offer.
        IBV_QPT_RAW_PACKET | IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV | IBV_QPT_DRIVER => {
            Err(libc::EOPNOTSUPP)
        }
        // A value `verbs.h` does not define: the kernel's create_qp answers EINVAL.
        _ => Err(libc::EINVAL),
    }
}

/// The C `enum ibv_qp_type` value of an engine QP type.
fn raw_qp_type(t: QpType) -> u32 {
    match t {
        QpType::Rc => IBV_QPT_RC,
        QpType::Uc => IBV_QPT_UC,
        QpType::Ud => IBV_QPT_UD,
    }
}

/// The C capacities of an engine QP's.
pub(super) fn ibv_cap(caps: &QpCaps) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: caps.max_send_wr,
        max_recv_wr: caps.max_recv_wr,
        max_send_sge: caps.max_send_sge,
        max_recv_sge: caps.max_recv_sge,
        max_inline_data: caps.max_inline_data,
    }
}

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
        // SAFETY: `qp` is NULL or a live QP (this function's `# Safety`).
        let state = unsafe { QpBlock::state(qp) }?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: `attr` is readable (this function's `# Safety`; not NULL here).
        let (attr, mask) = engine_attr(&unsafe { attr.read() }, mask, state.qp_type)?;
        let device = &state.entry.device;
        device.modify_qp(state.qpn, &attr, mask).map_err(errno_of)?;
        if let Some(now) = device.qp_state(state.qpn) {
            // SAFETY: `qp` passed `QpBlock::state`, so it points at a live `ibv_qp`; its
            // `state` field is the library's to keep current.
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
        // SAFETY: `qp` is NULL or a live QP (this function's `# Safety`).
        let state = unsafe { QpBlock::state(qp) }?;
        if attr.is_null() || init_attr.is_null() {
            return Err(libc::EINVAL);
        }
        let (a, init) = state.entry.device.query_qp(state.qpn).map_err(errno_of)?;
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
        // SAFETY: `qp` passed `QpBlock::state`, so it points at a live `ibv_qp`; `attr` and
        // `init_attr` are writable (this function's `# Safety`; not NULL here).
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
