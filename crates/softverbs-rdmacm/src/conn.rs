//! Connections: `rdma_connect(3)`, `rdma_get_request(3)`, `rdma_accept(3)`,
//! `rdma_reject(3)`, `rdma_disconnect(3)`, `rdma_establish(3)`, `rdma_notify(3)`, and the
//! ECE calls (`rdma_set_local_ece(3)`, `rdma_get_remote_ece(3)`, `rdma_reject_ece(3)`).
//!
//! Connected ids (RC, `RDMA_PS_TCP` / `RDMA_PS_IB`) use the IB CM REQ/REP/RTU exchange;
//! datagram ids (`RDMA_PS_UDP`) use SIDR (`rdma_connect` sends a SIDR_REQ, `rdma_accept`
//! answers with the QPN and `RDMA_UDP_QKEY`). The CMA header (source port, IP addresses)
//! goes first in the REQ / SIDR_REQ private data, so the program's private data may be
//! 56 bytes (REQ) or 180 bytes (SIDR_REQ); a REP carries 196, a REJ 148.

use crate::abi::*;
use crate::boundary::{self, Errno};
use crate::channel::{ack_event, get_event};
use crate::cm::{ensure_cm, errno_of, now_ns, pump, service_id_of, wake};
use crate::id::complete_sync;
use crate::state::{lock, Phase, Remote};
use crate::symver;
use libc::{c_int, c_void};
use softverbs_cm::cma::{
    CmaAddresses, CmaHeader, REQ_USER_PRIVATE_DATA_LEN, SIDR_REQ_USER_PRIVATE_DATA_LEN,
};
use softverbs_cm::{ConnectRequest, QpType, Reply, SidrReply, SidrRequest};

/// The REJ reason of `rdma_reject(3)`: consumer reject (IBTA 12.6.7.2, reason 28).
pub const REJ_CONSUMER: u16 = 28;
/// The REJ reason of `rdma_reject_ece(3)`: vendor option not supported (reason 35).
pub const REJ_VENDOR_OPTION_NOT_SUPPORTED: u16 = 35;
/// SIDR_REP status of a rejected SIDR request (IBTA 12.11.2: 2, "rejected").
pub const SIDR_REJECT: u8 = 2;
/// `IBV_EVENT_COMM_EST`.
pub const IBV_EVENT_COMM_EST: c_int = 4;

/// The private data a program passes, or `EINVAL` when longer than `max`.
///
/// # Safety
///
/// `data` is NULL or points at `len` readable bytes.
unsafe fn private_data(data: *const c_void, len: u8, max: usize) -> Result<Vec<u8>, Errno> {
    if data.is_null() || len == 0 {
        return Ok(Vec::new());
    }
    if usize::from(len) > max {
        return Err(libc::EINVAL);
    }
    // SAFETY: caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(data as *const u8, usize::from(len)) }.to_vec())
}

/// The QP type of an id (its QP's, or the port space's).
fn qp_type(p: *mut rdma_cm_id) -> u32 {
    // SAFETY: callers pass a live id; a QP on it is live.
    unsafe {
        if (*p).qp.is_null() {
            (*p).qp_type
        } else {
            (*(*p).qp).qp_type
        }
    }
}

fn connect(id: *mut rdma_cm_id, param: Option<rdma_conn_param>) -> Result<(), Errno> {
    let mut st = lock();
    let i = st.id(id)?;
    if i.phase != Phase::RouteResolved {
        return Err(libc::EINVAL);
    }
    let p = i.ptr.0;
    let key = p as usize;
    let dev = i.dev.ok_or(libc::EINVAL)?;
    let local = i.bound.ok_or(libc::EINVAL)?;
    let tos = i.tos;
    let ack_timeout = i.ack_timeout;
    let local_psn = i.local_psn;
    // SAFETY: a live id.
    let (dst, ps, sgid, dgid, qp) = unsafe {
        (
            crate::addr::from_storage(&(*p).route.addr.dst_storage).ok_or(libc::EINVAL)?,
            (*p).ps,
            (*p).route.addr.ibaddr.sgid.bytes(),
            (*p).route.addr.ibaddr.dgid.bytes(),
            (*p).qp,
        )
    };
    ensure_cm(&mut st, dev)?;
    let sid = service_id_of(ps, dst.port());
    let hdr = CmaHeader {
        src_port: local.port(),
        addresses: CmaAddresses::new(local.ip(), dst.ip()).ok_or(libc::EINVAL)?,
    };
    let now = now_ns();
    let ud = qp_type(p) == IBV_QPT_UD;
    let (pd_ptr, pd_len) = param.map_or((std::ptr::null(), 0), |c| {
        (c.private_data, c.private_data_len)
    });
    let max = if ud {
        SIDR_REQ_USER_PRIVATE_DATA_LEN
    } else {
        REQ_USER_PRIVATE_DATA_LEN
    };
    // SAFETY: the program's private data (rdma_connect(3)'s contract).
    let user = unsafe { private_data(pd_ptr, pd_len, max) }?;
    let mtu = st.devices[dev].active_mtu.clamp(1, 5);
    let c = st.devices[dev].cm.as_mut().ok_or(libc::ENODEV)?;
    let conn = if ud {
        let mut req = SidrRequest::new(sid, dgid);
        req.private_data = hdr.with_user_data(&user);
        c.cm.sidr_request(now, req).map_err(errno_of)?
    } else {
        let qpn = if qp.is_null() {
            param.map_or(0, |c| c.qp_num)
        } else {
            // SAFETY: the id's QP.
            unsafe { (*qp).qp_num }
        };
        if qpn == 0 {
            return Err(libc::EINVAL);
        }
        let prm = param.unwrap_or(rdma_conn_param {
            private_data: std::ptr::null(),
            private_data_len: 0,
            responder_resources: 0,
            initiator_depth: 0,
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: 0,
            qp_num: 0,
        });
        let mut req = ConnectRequest::new(sid, sgid, dgid, qpn, local_psn);
        req.qp_type = if qp_type(p) == IBV_QPT_UC {
            QpType::Uc
        } else {
            QpType::Rc
        };
        req.responder_resources = prm.responder_resources.min(crate::qp::MAX_RD_ATOMIC);
        req.initiator_depth = prm.initiator_depth.min(crate::qp::MAX_RD_ATOMIC);
        req.retry_count = prm.retry_count.min(7);
        req.rnr_retry_count = prm.rnr_retry_count.min(7);
        req.flow_control = prm.flow_control != 0;
        // SAFETY: a live id.
        req.srq = prm.srq != 0 || !unsafe { (*p).srq }.is_null();
        req.path_mtu = mtu as u8;
        req.traffic_class = tos;
        req.local_ack_timeout = ack_timeout.unwrap_or(crate::qp::DEFAULT_ACK_TIMEOUT);
        req.private_data = hdr.with_user_data(&user);
        let conn = c.cm.connect(now, req).map_err(errno_of)?;
        let i = st.ids.get_mut(&key).ok_or(libc::EINVAL)?;
        i.remote = Some(Remote {
            gid: dgid,
            mtu,
            responder_resources: prm.responder_resources.min(crate::qp::MAX_RD_ATOMIC),
            initiator_depth: prm.initiator_depth.min(crate::qp::MAX_RD_ATOMIC),
            retry_count: prm.retry_count.min(7),
            rnr_retry_count: prm.rnr_retry_count.min(7),
            ..Default::default()
        });
        conn
    };
    if let Some(c) = st.devices[dev].cm.as_mut() {
        c.conns.insert(conn, key);
    }
    let i = st.ids.get_mut(&key).ok_or(libc::EINVAL)?;
    i.conn = Some(conn);
    i.phase = Phase::Connecting;
    pump(&mut st, dev);
    wake();
    Ok(())
}

/// `rdma_connect(3)`: 0 and later `RDMA_CM_EVENT_ESTABLISHED` (or `REJECTED`,
/// `UNREACHABLE`, `CONNECT_RESPONSE` for an id without a QP), or -1 with errno (`EINVAL`:
/// route not resolved, private data too long, no QP and no `qp_num`).
///
/// # Safety
///
/// `conn_param` is NULL or valid, its private data readable.
pub unsafe extern "C" fn rdma_connect(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    boundary::zero(|| {
        // SAFETY: caller's contract.
        let param = unsafe { conn_param.as_ref() }.copied();
        connect(id, param)?;
        complete_sync(id)
    })
}
symver!(rdma_connect, "RDMACM_1.0");

/// `rdma_get_request(3)`: the next connection request of a synchronous listening id (a
/// new id, with a QP when the listener came from `rdma_create_ep` with QP attributes);
/// -1 with `EINVAL` for other ids.
///
/// # Safety
///
/// `id` is NULL or writable.
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    boundary::zero(|| {
        if id.is_null() {
            return Err(libc::EINVAL);
        }
        let (channel, ep) = {
            let mut st = lock();
            let l = st.id(listen)?;
            if !l.sync || l.phase != Phase::Listening {
                return Err(libc::EINVAL);
            }
            (l.channel, l.ep_qp)
        };
        let e = get_event(channel as *mut rdma_event_channel)?;
        // SAFETY: a live event.
        let (kind, status, child) = unsafe { ((*e).event, (*e).status, (*e).id) };
        if kind != event::CONNECT_REQUEST || status != 0 {
            let _ = ack_event(e);
            return Err(if status != 0 {
                status.abs()
            } else {
                libc::EINVAL
            });
        }
        if let Some(ep) = ep {
            let mut attr = ep.attr;
            let r = crate::qp::create_qp(&mut lock(), child, ep.pd.0, &mut attr);
            if let Err(err) = r {
                // SAFETY: our own export on the new id.
                unsafe { rdma_reject(child, std::ptr::null(), 0) };
                let _ = ack_event(e);
                let _ = crate::id::destroy(child);
                return Err(err);
            }
        }
        // SAFETY: the new, live id; `id` is writable.
        unsafe {
            (*child).event = e;
            *id = child;
        }
        Ok(())
    })
}
symver!(rdma_get_request, "RDMACM_1.0");

fn accept(id: *mut rdma_cm_id, param: Option<rdma_conn_param>) -> Result<bool, Errno> {
    let mut st = lock();
    let i = st.id(id)?;
    if i.phase != Phase::Requested {
        return Err(libc::EINVAL);
    }
    let p = i.ptr.0;
    let key = p as usize;
    let dev = i.dev.ok_or(libc::EINVAL)?;
    let conn = i.conn.ok_or(libc::EINVAL)?;
    let local_psn = i.local_psn;
    let now = now_ns();
    let (pd_ptr, pd_len) = param.map_or((std::ptr::null(), 0), |c| {
        (c.private_data, c.private_data_len)
    });
    // SAFETY: a live id.
    let qp = unsafe { (*p).qp };
    let qpn = if qp.is_null() {
        param.map_or(0, |c| c.qp_num)
    } else {
        // SAFETY: the id's QP.
        unsafe { (*qp).qp_num }
    };
    if qp_type(p) == IBV_QPT_UD {
        // SAFETY: the program's private data.
        let user =
            unsafe { private_data(pd_ptr, pd_len, softverbs_cm::mad::SIDR_REP_PRIVATE_DATA_LEN) }?;
        let c = st.devices[dev].cm.as_mut().ok_or(libc::ENODEV)?;
        c.cm.sidr_reply(
            now,
            conn,
            SidrReply {
                status: 0,
                qpn,
                qkey: RDMA_UDP_QKEY,
                private_data: user,
            },
        )
        .map_err(errno_of)?;
        let i = st.ids.get_mut(&key).ok_or(libc::EINVAL)?;
        i.phase = Phase::Connected;
        pump(&mut st, dev);
        return Ok(false);
    }
    // SAFETY: the program's private data.
    let user = unsafe { private_data(pd_ptr, pd_len, softverbs_cm::mad::REP_PRIVATE_DATA_LEN) }?;
    if qpn == 0 {
        return Err(libc::EINVAL);
    }
    let mut r = i.remote.ok_or(libc::EINVAL)?;
    if let Some(c) = param {
        r.responder_resources = c.responder_resources.min(crate::qp::MAX_RD_ATOMIC);
        r.initiator_depth = c.initiator_depth.min(crate::qp::MAX_RD_ATOMIC);
    }
    i.remote = Some(r);
    if !qp.is_null() {
        crate::qp::modify(&mut st, p, IBV_QPS_RTR)?;
        crate::qp::modify(&mut st, p, IBV_QPS_RTS)?;
    }
    let mut rep = Reply::new(qpn, local_psn);
    rep.responder_resources = r.responder_resources;
    rep.initiator_depth = r.initiator_depth;
    rep.rnr_retry_count = param.map_or(7, |c| c.rnr_retry_count.min(7));
    rep.flow_control = param.is_none_or(|c| c.flow_control != 0);
    // SAFETY: a live id.
    rep.srq = param.is_some_and(|c| c.srq != 0) || !unsafe { (*p).srq }.is_null();
    rep.private_data = user;
    let c = st.devices[dev].cm.as_mut().ok_or(libc::ENODEV)?;
    c.cm.accept(now, conn, rep).map_err(errno_of)?;
    st.ids.get_mut(&key).ok_or(libc::EINVAL)?.phase = Phase::Accepted;
    pump(&mut st, dev);
    wake();
    Ok(true)
}

/// `rdma_accept(3)`: for a connected id moves its QP to RTR and RTS and sends the REP
/// (`RDMA_CM_EVENT_ESTABLISHED` follows the RTU); for a datagram id sends the SIDR_REP
/// with its QPN and `RDMA_UDP_QKEY`. -1 with `EINVAL` when the id has no pending request,
/// its private data is too long, or it has neither a QP nor `qp_num`.
///
/// # Safety
///
/// `conn_param` is NULL or valid, its private data readable.
pub unsafe extern "C" fn rdma_accept(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    boundary::zero(|| {
        // SAFETY: caller's contract.
        let param = unsafe { conn_param.as_ref() }.copied();
        if accept(id, param)? {
            complete_sync(id)?;
        }
        Ok(())
    })
}
symver!(rdma_accept, "RDMACM_1.0");

fn reject(id: *mut rdma_cm_id, data: *const c_void, len: u8, reason: u16) -> Result<(), Errno> {
    let mut st = lock();
    let i = st.id(id)?;
    if i.phase != Phase::Requested {
        return Err(libc::EINVAL);
    }
    let p = i.ptr.0;
    let dev = i.dev.ok_or(libc::EINVAL)?;
    let conn = i.conn.ok_or(libc::EINVAL)?;
    let now = now_ns();
    let ud = qp_type(p) == IBV_QPT_UD;
    let max = if ud {
        softverbs_cm::mad::SIDR_REP_PRIVATE_DATA_LEN
    } else {
        softverbs_cm::mad::REJ_PRIVATE_DATA_LEN
    };
    // SAFETY: the program's private data (rdma_reject(3)'s contract).
    let user = unsafe { private_data(data, len, max) }?;
    let c = st.devices[dev].cm.as_mut().ok_or(libc::ENODEV)?;
    if ud {
        c.cm.sidr_reply(
            now,
            conn,
            SidrReply {
                status: SIDR_REJECT,
                qpn: 0,
                qkey: 0,
                private_data: user,
            },
        )
    } else {
        c.cm.reject(now, conn, reason, &user)
    }
    .map_err(errno_of)?;
    let i = st.ids.get_mut(&(p as usize)).ok_or(libc::EINVAL)?;
    i.phase = Phase::Disconnected;
    pump(&mut st, dev);
    Ok(())
}

/// `rdma_reject(3)`: sends a REJ (reason 28, consumer reject) with the private data
/// (≤ 148 bytes), or a SIDR_REP with status "rejected" for a datagram id; the peer sees
/// `RDMA_CM_EVENT_REJECTED` with that private data.
///
/// # Safety
///
/// `private_data` is NULL or points at `private_data_len` readable bytes.
pub unsafe extern "C" fn rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    boundary::zero(|| reject(id, private_data, private_data_len, REJ_CONSUMER))
}
symver!(rdma_reject, "RDMACM_1.0");

/// `rdma_reject_ece(3)`: a reject with reason 35 (vendor option not supported).
///
/// # Safety
///
/// As `rdma_reject`.
pub unsafe extern "C" fn rdma_reject_ece(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    boundary::zero(|| {
        reject(
            id,
            private_data,
            private_data_len,
            REJ_VENDOR_OPTION_NOT_SUPPORTED,
        )
    })
}
symver!(rdma_reject_ece, "RDMACM_1.3");

/// `rdma_disconnect(3)`: moves the QP to the error state and sends a DREQ (or the DREP
/// when the peer disconnected first); `RDMA_CM_EVENT_DISCONNECTED` follows on both sides.
/// -1 with `EINVAL` for an id that is not connected.
pub extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    boundary::zero(|| {
        let mut st = lock();
        let i = st.id(id)?;
        let p = i.ptr.0;
        let phase = i.phase;
        let conn = i.conn;
        let dev = i.dev;
        match phase {
            Phase::Connected | Phase::Accepted | Phase::RepReceived | Phase::Disconnected => {}
            _ => return Err(libc::EINVAL),
        }
        crate::qp::to_error(p);
        let (Some(conn), Some(dev)) = (conn, dev) else {
            // A datagram id has no connection to end.
            return if phase == Phase::Connected {
                Ok(())
            } else {
                Err(libc::EINVAL)
            };
        };
        let now = now_ns();
        if let Some(c) = st.devices[dev].cm.as_mut() {
            if let Err(e) = c.cm.disconnect(now, conn, &[]) {
                // Already disconnecting or in timewait: nothing more to send.
                if phase != Phase::Disconnected
                    && !matches!(e, softverbs_cm::CmError::InvalidState { .. })
                {
                    return Err(errno_of(e));
                }
            }
        }
        pump(&mut st, dev);
        wake();
        Ok(())
    })
}
symver!(rdma_disconnect, "RDMACM_1.0");

/// `rdma_establish(3)`: for an active id without a QP, after
/// `RDMA_CM_EVENT_CONNECT_RESPONSE`: sends the RTU. -1 with `EINVAL` otherwise.
pub extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    boundary::zero(|| {
        let mut st = lock();
        let i = st.id(id)?;
        if i.phase != Phase::RepReceived {
            return Err(libc::EINVAL);
        }
        let (dev, conn) = (i.dev.ok_or(libc::EINVAL)?, i.conn.ok_or(libc::EINVAL)?);
        i.phase = Phase::Connected;
        let c = st.devices[dev].cm.as_mut().ok_or(libc::ENODEV)?;
        c.cm.ready_to_use(now_ns(), conn, &[]).map_err(errno_of)?;
        pump(&mut st, dev);
        Ok(())
    })
}
symver!(rdma_establish, "RDMACM_1.2");

/// `rdma_notify(3)`: `IBV_EVENT_COMM_EST` on a passive id waiting for the RTU establishes
/// the connection (`RDMA_CM_EVENT_ESTABLISHED`); other events are accepted and ignored.
pub extern "C" fn rdma_notify(id: *mut rdma_cm_id, event: c_int) -> c_int {
    boundary::zero(|| {
        let mut st = lock();
        let i = st.id(id)?;
        if event != IBV_EVENT_COMM_EST || i.phase != Phase::Accepted {
            return Ok(());
        }
        let (Some(dev), Some(conn)) = (i.dev, i.conn) else {
            return Ok(());
        };
        if let Some(c) = st.devices[dev].cm.as_mut() {
            c.cm.notify_established(conn);
        }
        pump(&mut st, dev);
        Ok(())
    })
}
symver!(rdma_notify, "RDMACM_1.0");

/// `rdma_set_local_ece(3)`: the soft device has no enhanced connection establishment
/// options; the call is accepted (0) and nothing is sent. -1 with `EINVAL` for a bad id
/// or NULL `ece`.
pub extern "C" fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    boundary::zero(|| {
        lock().id(id)?;
        if ece.is_null() {
            return Err(libc::EINVAL);
        }
        Ok(())
    })
}
symver!(rdma_set_local_ece, "RDMACM_1.3");

/// `rdma_get_remote_ece(3)`: the peer's ECE options, none (all zero) on the soft device.
///
/// # Safety
///
/// `ece` is NULL or writable.
pub unsafe extern "C" fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    boundary::zero(|| {
        lock().id(id)?;
        if ece.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: non-NULL, writable (caller's contract).
        unsafe {
            *ece = ibv_ece {
                vendor_id: 0,
                options: 0,
                comp_mask: 0,
            }
        };
        Ok(())
    })
}
symver!(rdma_get_remote_ece, "RDMACM_1.3");
