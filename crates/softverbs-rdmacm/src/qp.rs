//! Queue pairs on ids: `rdma_create_qp(3)`, `rdma_create_qp_ex`, `rdma_destroy_qp(3)`,
//! `rdma_create_srq(3)`, `rdma_create_srq_ex`, `rdma_destroy_srq(3)`,
//! `rdma_init_qp_attr(3)`, and the state transitions the connection manager makes on a
//! program's QP (through the public `ibv_modify_qp`).
//!
//! As librdmacm does: `rdma_create_qp` with a NULL `pd` uses the device's default PD,
//! with NULL CQs creates a completion channel and a CQ for each direction (kept in the
//! id, destroyed by `rdma_destroy_qp`); a connected QP (RC/UC) is moved to INIT, a
//! datagram QP (UD) through INIT and RTR to RTS with the port space's Q_Key
//! (`RDMA_UDP_QKEY` for `RDMA_PS_UDP`).

use crate::abi::*;
use crate::boundary::{self, Errno};
use crate::state::{lock, OwnedCqs, Ptr, State};
use crate::symver;
use crate::verbs::verbs;
use libc::{c_int, c_void};

/// Access rights a connected QP gets: local write, remote write, read and atomic (the
/// kernel grants read and atomic when the connection has responder resources; the soft
/// device keeps them whatever the count, so they are granted from INIT).
const CONN_ACCESS: c_int = IBV_ACCESS_LOCAL_WRITE
    | IBV_ACCESS_REMOTE_WRITE
    | IBV_ACCESS_REMOTE_READ
    | IBV_ACCESS_REMOTE_ATOMIC;

/// The device's bound on RDMA READ / atomic depths (`max_qp_rd_atom`).
pub(crate) const MAX_RD_ATOMIC: u8 = 128;

/// The local ACK timeout (4.096 µs × 2^14 ≈ 67 ms) unless `RDMA_OPTION_ID_ACK_TIMEOUT`.
pub const DEFAULT_ACK_TIMEOUT: u8 = 14;

/// The attributes `rdma_init_qp_attr` gives for moving id `p`'s QP to `attr.qp_state`.
pub(crate) fn qp_attr(
    st: &mut State,
    p: *mut rdma_cm_id,
    attr: &mut ibv_qp_attr,
) -> Result<c_int, Errno> {
    let id = st.id(p)?;
    // SAFETY: a live id.
    let (ps, qp_type, sgid, port_num) = unsafe {
        let qp_type = if (*p).qp.is_null() {
            (*p).qp_type
        } else {
            (*(*p).qp).qp_type
        };
        (
            (*p).ps,
            qp_type,
            (*p).route.addr.ibaddr.sgid.bytes(),
            (*p).port_num.max(1),
        )
    };
    let ud = qp_type == IBV_QPT_UD;
    let state = attr.qp_state;
    let mut m = mask::STATE;
    match state {
        IBV_QPS_INIT => {
            attr.pkey_index = 0;
            attr.port_num = port_num;
            m |= mask::PKEY_INDEX | mask::PORT;
            if ud {
                attr.qkey = if ps == RDMA_PS_IPOIB {
                    0
                } else {
                    RDMA_UDP_QKEY
                };
                m |= mask::QKEY;
            } else {
                attr.qp_access_flags = CONN_ACCESS;
                m |= mask::ACCESS_FLAGS;
            }
        }
        IBV_QPS_RTR if ud => {}
        IBV_QPS_RTR => {
            let r = id.remote.ok_or(libc::EINVAL)?;
            let dev = id.dev.ok_or(libc::EINVAL)?;
            let tos = id.tos;
            let local_psn = id.local_psn;
            let sgid_index = st.devices[dev]
                .gids
                .iter()
                .find(|(_, g)| *g == sgid)
                .map_or(1, |(i, _)| *i);
            attr.ah_attr = ibv_ah_attr {
                grh: ibv_global_route {
                    dgid: ibv_gid::from_bytes(r.gid),
                    flow_label: 0,
                    sgid_index,
                    hop_limit: 64,
                    traffic_class: tos,
                },
                dlid: 0,
                sl: 0,
                src_path_bits: 0,
                static_rate: 0,
                is_global: 1,
                port_num,
            };
            attr.path_mtu = r.mtu;
            attr.dest_qp_num = r.qpn;
            // The Starting PSN a side puts in its REQ or REP is the PSN it will receive
            // from (IBTA 12.7.39; the kernel's cm.c sets the peer's send PSN from it):
            // this side receives from its own, and sends from the peer's.
            attr.rq_psn = local_psn;
            m |= mask::AV | mask::PATH_MTU | mask::DEST_QPN | mask::RQ_PSN;
            if qp_type == IBV_QPT_RC {
                attr.max_dest_rd_atomic = r.responder_resources.min(MAX_RD_ATOMIC);
                attr.min_rnr_timer = 12;
                m |= mask::MAX_DEST_RD_ATOMIC | mask::MIN_RNR_TIMER;
            }
        }
        IBV_QPS_RTS => {
            attr.sq_psn = match (ud, id.remote) {
                (true, _) => 0,
                (false, Some(r)) => r.psn,
                (false, None) => return Err(libc::EINVAL),
            };
            m |= mask::SQ_PSN;
            if qp_type == IBV_QPT_RC {
                let r = id.remote.ok_or(libc::EINVAL)?;
                attr.timeout = id.ack_timeout.unwrap_or(DEFAULT_ACK_TIMEOUT);
                attr.retry_cnt = r.retry_count.min(7);
                attr.rnr_retry = r.rnr_retry_count.min(7);
                attr.max_rd_atomic = r.initiator_depth.min(MAX_RD_ATOMIC);
                m |= mask::TIMEOUT | mask::RETRY_CNT | mask::RNR_RETRY | mask::MAX_QP_RD_ATOMIC;
            }
        }
        _ => return Err(libc::EINVAL),
    }
    Ok(m)
}

/// Moves id `p`'s QP to `state` with the attributes of [`qp_attr`].
pub(crate) fn modify(st: &mut State, p: *mut rdma_cm_id, state: u32) -> Result<(), Errno> {
    // SAFETY: callers pass a live id.
    let qp = unsafe { (*p).qp };
    if qp.is_null() {
        return Ok(());
    }
    let mut attr = ibv_qp_attr {
        qp_state: state,
        ..Default::default()
    };
    let m = qp_attr(st, p, &mut attr)?;
    // SAFETY: the id's QP (the program keeps it alive while it is on the id).
    let r = unsafe { (verbs()?.modify_qp)(qp as *mut c_void, &mut attr, m) };
    if r != 0 {
        return Err(r);
    }
    Ok(())
}

/// Moves id `p`'s QP to the error state (disconnect), if it has one.
pub(crate) fn to_error(p: *mut rdma_cm_id) {
    // SAFETY: callers pass a live id.
    let qp = unsafe { (*p).qp };
    if qp.is_null() {
        return;
    }
    let Ok(v) = verbs() else { return };
    let mut attr = ibv_qp_attr {
        qp_state: IBV_QPS_ERR,
        ..Default::default()
    };
    // SAFETY: the id's QP.
    unsafe { (v.modify_qp)(qp as *mut c_void, &mut attr, mask::STATE) };
}

/// `rdma_init_qp_attr(3)`: fills the attributes and mask for moving the id's QP to
/// `qp_attr->qp_state` (INIT, RTR or RTS); -1 with `EINVAL` for other states, a bad id,
/// or RTR/RTS before the peer is known.
///
/// # Safety
///
/// `qp_attr` and `qp_attr_mask` are NULL or writable.
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr_p: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    boundary::zero(|| {
        if qp_attr_p.is_null() || qp_attr_mask.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: non-NULL, writable (caller's contract).
        let attr = unsafe { &mut *qp_attr_p };
        let m = qp_attr(&mut lock(), id, attr)?;
        // SAFETY: as above.
        unsafe { *qp_attr_mask = m };
        Ok(())
    })
}
symver!(rdma_init_qp_attr, "RDMACM_1.2");

/// The device's default PD (made on first use).
fn default_pd(st: &mut State, dev: usize) -> Result<*mut c_void, Errno> {
    if let Some(pd) = st.devices[dev].pd {
        return Ok(pd.0);
    }
    // SAFETY: an open context.
    let pd = unsafe { (verbs()?.alloc_pd)(st.devices[dev].ctx.0) };
    if pd.is_null() {
        return Err(boundary::errno().max(libc::ENOMEM));
    }
    st.devices[dev].pd = Some(Ptr(pd));
    Ok(pd)
}

/// Creates the CQs `attr` lacks (librdmacm's `ucma_create_cqs`).
fn create_cqs(ctx: *mut c_void, attr: &mut ibv_qp_init_attr) -> Result<Option<OwnedCqs>, Errno> {
    if !attr.send_cq.is_null() && !attr.recv_cq.is_null() {
        return Ok(None);
    }
    let v = verbs()?;
    let mut owned = OwnedCqs {
        send_cq: Ptr(std::ptr::null_mut()),
        recv_cq: Ptr(std::ptr::null_mut()),
        send_channel: Ptr(std::ptr::null_mut()),
        recv_channel: Ptr(std::ptr::null_mut()),
    };
    let make = |depth: u32| -> Result<(Ptr<c_void>, Ptr<c_void>), Errno> {
        // SAFETY: an open context.
        let ch = unsafe { (v.create_comp_channel)(ctx) };
        if ch.is_null() {
            return Err(boundary::errno().max(libc::ENOMEM));
        }
        // SAFETY: an open context and its channel.
        let cq = unsafe { (v.create_cq)(ctx, depth.max(1) as c_int, std::ptr::null_mut(), ch, 0) };
        if cq.is_null() {
            let e = boundary::errno().max(libc::ENOMEM);
            // SAFETY: the channel made above, unused.
            unsafe { (v.destroy_comp_channel)(ch) };
            return Err(e);
        }
        Ok((Ptr(cq), Ptr(ch)))
    };
    if attr.recv_cq.is_null() {
        let (cq, ch) = make(attr.cap.max_recv_wr)?;
        owned.recv_cq = cq;
        owned.recv_channel = ch;
        attr.recv_cq = cq.0;
    }
    if attr.send_cq.is_null() {
        match make(attr.cap.max_send_wr) {
            Ok((cq, ch)) => {
                owned.send_cq = cq;
                owned.send_channel = ch;
                attr.send_cq = cq.0;
            }
            Err(e) => {
                destroy_cqs(&owned);
                return Err(e);
            }
        }
    }
    Ok(Some(owned))
}

fn destroy_cqs(o: &OwnedCqs) {
    let Ok(v) = verbs() else { return };
    // SAFETY: objects made by `create_cqs`, no QP uses them any more.
    unsafe {
        for cq in [o.send_cq, o.recv_cq] {
            if !cq.0.is_null() {
                (v.destroy_cq)(cq.0);
            }
        }
        for ch in [o.send_channel, o.recv_channel] {
            if !ch.0.is_null() {
                (v.destroy_comp_channel)(ch.0);
            }
        }
    }
}

/// Creates a QP on id `p` and moves it to INIT (RC/UC) or RTS (UD).
pub(crate) fn create_qp(
    st: &mut State,
    p: *mut rdma_cm_id,
    pd: *mut c_void,
    attr: &mut ibv_qp_init_attr,
) -> Result<(), Errno> {
    let id = st.id(p)?;
    let dev = id.dev.ok_or(libc::EINVAL)?;
    // SAFETY: a live id.
    if !unsafe { (*p).qp }.is_null() {
        return Err(libc::EINVAL);
    }
    let ctx = st.devices[dev].ctx.0;
    let pd = if pd.is_null() {
        default_pd(st, dev)?
    } else {
        // SAFETY: a PD of the program (libibverbs' object, its first field the context).
        if unsafe { (*(pd as *mut ibv_pd)).context } != ctx {
            return Err(libc::EINVAL);
        }
        pd
    };
    // SAFETY: a live id.
    unsafe {
        if attr.srq.is_null() && !(*p).srq.is_null() {
            attr.srq = (*p).srq;
        }
    }
    let owned = create_cqs(ctx, attr)?;
    let v = verbs()?;
    // SAFETY: the PD belongs to the id's context; `attr` is a full ibv_qp_init_attr.
    let qp = unsafe { (v.create_qp)(pd, attr) };
    if qp.is_null() {
        let e = boundary::errno().max(libc::EINVAL);
        if let Some(o) = &owned {
            destroy_cqs(o);
        }
        return Err(e);
    }
    // SAFETY: a live id; the QP is now the id's.
    unsafe {
        (*p).qp = qp as *mut ibv_qp;
        (*p).pd = pd;
        if let Some(o) = &owned {
            (*p).send_cq = o.send_cq.0;
            (*p).recv_cq = o.recv_cq.0;
            (*p).send_cq_channel = o.send_channel.0;
            (*p).recv_cq_channel = o.recv_channel.0;
        }
    }
    st.id(p)?.owned_cqs = owned;
    let ud = attr.qp_type == IBV_QPT_UD;
    let r = modify(st, p, IBV_QPS_INIT).and_then(|()| {
        if ud {
            modify(st, p, IBV_QPS_RTR)?;
            modify(st, p, IBV_QPS_RTS)
        } else {
            Ok(())
        }
    });
    if let Err(e) = r {
        destroy_qp(st, p);
        return Err(e);
    }
    Ok(())
}

/// Destroys id `p`'s QP and the CQs made for it.
pub(crate) fn destroy_qp(st: &mut State, p: *mut rdma_cm_id) {
    // A QP attached to a multicast group cannot be destroyed: it leaves them first.
    crate::multicast::detach_all(st, p);
    let Ok(id) = st.id(p) else { return };
    let owned = id.owned_cqs.take();
    // SAFETY: a live id.
    let qp = unsafe { std::mem::replace(&mut (*p).qp, std::ptr::null_mut()) };
    if !qp.is_null() {
        if let Ok(v) = verbs() {
            // SAFETY: the id's QP, which the program gives up with this call.
            unsafe { (v.destroy_qp)(qp as *mut c_void) };
        }
    }
    if let Some(o) = owned {
        destroy_cqs(&o);
        // SAFETY: a live id.
        unsafe {
            (*p).send_cq = std::ptr::null_mut();
            (*p).recv_cq = std::ptr::null_mut();
            (*p).send_cq_channel = std::ptr::null_mut();
            (*p).recv_cq_channel = std::ptr::null_mut();
        }
    }
}

/// `rdma_create_qp(3)`: 0, or -1 with errno (`EINVAL`: bad id, id without a device (bind
/// or resolve first), a PD of another device, a QP already on the id; the verbs' errno
/// otherwise).
///
/// # Safety
///
/// `qp_init_attr` is NULL or a valid, writable `ibv_qp_init_attr` (the capabilities are
/// written back, as by `ibv_create_qp`).
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut c_void,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    boundary::zero(|| {
        if qp_init_attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: caller's contract.
        let attr = unsafe { &mut *qp_init_attr };
        let mut st = lock();
        create_qp(&mut st, id, pd, attr)
    })
}
symver!(rdma_create_qp, "RDMACM_1.0");

/// `rdma_create_qp_ex`: the plain attributes plus `comp_mask` `IBV_QP_INIT_ATTR_PD`; other
/// extended attributes give `EOPNOTSUPP`.
///
/// # Safety
///
/// `attr` is NULL or a valid, writable `ibv_qp_init_attr_ex`.
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    boundary::zero(|| {
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: caller's contract.
        let a = unsafe { &mut *attr };
        if a.comp_mask & !IBV_QP_INIT_ATTR_PD != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let pd = if a.comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
            a.pd
        } else {
            std::ptr::null_mut()
        };
        let mut plain = ibv_qp_init_attr {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        };
        let mut st = lock();
        create_qp(&mut st, id, pd, &mut plain)?;
        a.cap = plain.cap;
        a.send_cq = plain.send_cq;
        a.recv_cq = plain.recv_cq;
        Ok(())
    })
}
symver!(rdma_create_qp_ex, "RDMACM_1.0");

/// `rdma_destroy_qp(3)`.
pub extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    boundary::infallible((), || destroy_qp(&mut lock(), id))
}
symver!(rdma_destroy_qp, "RDMACM_1.0");

/// Creates an SRQ on id `p` (`id->srq`).
fn create_srq(p: *mut rdma_cm_id, pd: *mut c_void, attr: *mut c_void) -> Result<(), Errno> {
    let mut st = lock();
    let id = st.id(p)?;
    let dev = id.dev.ok_or(libc::EINVAL)?;
    let pd = if pd.is_null() {
        default_pd(&mut st, dev)?
    } else {
        pd
    };
    // SAFETY: a PD and the caller's `ibv_srq_init_attr`.
    let srq = unsafe { (verbs()?.create_srq)(pd, attr) };
    if srq.is_null() {
        return Err(boundary::errno().max(libc::EINVAL));
    }
    // SAFETY: a live id.
    unsafe { (*p).srq = srq };
    Ok(())
}

/// `rdma_create_srq(3)`: an SRQ on the id (used by `rdma_create_qp` when the QP's
/// attributes name none).
///
/// # Safety
///
/// `attr` is NULL or a valid `ibv_srq_init_attr`.
pub unsafe extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut c_void,
    attr: *mut c_void,
) -> c_int {
    boundary::zero(|| {
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        create_srq(id, pd, attr)
    })
}
symver!(rdma_create_srq, "RDMACM_1.0");

/// `rdma_create_srq_ex`: basic SRQs (`IBV_SRQ_INIT_ATTR_PD` and the plain attributes);
/// XRC SRQs give `EOPNOTSUPP`.
///
/// # Safety
///
/// `attr` is NULL or a valid `ibv_srq_init_attr_ex`.
pub unsafe extern "C" fn rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    boundary::zero(|| {
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: caller's contract.
        let a = unsafe { &*attr };
        if a.srq_type == IBV_SRQT_XRC || a.comp_mask & !(IBV_SRQ_INIT_ATTR_PD | 1) != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let pd = if a.comp_mask & IBV_SRQ_INIT_ATTR_PD != 0 {
            a.pd
        } else {
            std::ptr::null_mut()
        };
        // `struct ibv_srq_init_attr` is the prefix {srq_context, attr} of the _ex form.
        create_srq(id, pd, attr as *mut c_void)
    })
}
symver!(rdma_create_srq_ex, "RDMACM_1.0");

/// `rdma_destroy_srq(3)`.
pub extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    boundary::infallible((), || {
        let mut st = lock();
        let Ok(i) = st.id(id) else { return };
        let p = i.ptr.0;
        // SAFETY: a live id (found in the table).
        let srq = unsafe { std::mem::replace(&mut (*p).srq, std::ptr::null_mut()) };
        if !srq.is_null() {
            if let Ok(v) = verbs() {
                // SAFETY: the id's SRQ.
                unsafe { (v.destroy_srq)(srq) };
            }
        }
    })
}
symver!(rdma_destroy_srq, "RDMACM_1.0");
