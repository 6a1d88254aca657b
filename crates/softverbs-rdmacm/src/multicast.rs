//! UD multicast through the connection manager (`rdma_join_multicast(3)`,
//! `rdma_join_multicast_ex(3)`, `rdma_leave_multicast(3)`), as the kernel's RDMA CM does it
//! on RoCE (`cma_iboe_join_multicast`): no subnet administrator to ask, so a join completes
//! at once. The group's GID is its IP address (`::ffff:a.b.c.d` for IPv4, IBTA Annex
//! A17), the id's QP — if it has one — is attached to it (`ibv_attach_mcast(3)`, as
//! librdmacm does when it hands out the join event), and `RDMA_CM_EVENT_MULTICAST_JOIN`
//! carries what a sender needs in `param.ud`: an address vector towards the group, QPN
//! 0xFFFFFF and the Q_Key of the port space (`RDMA_UDP_QKEY`), and the `context` given to
//! the join as `private_data`.
//!
//! A send-only join (`RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER`) attaches nothing. Leaving
//! detaches the QP; destroying the id's QP or the id leaves every group first.

use crate::abi::*;
use crate::addr;
use crate::boundary;
use crate::state::{lock, Phase, State};
use crate::symver;
use crate::verbs::verbs;
use libc::{c_int, c_void, sockaddr};
use std::net::SocketAddr;

type Errno = c_int;

/// `RDMA_CM_JOIN_MC_ATTR_ADDRESS` (`enum rdma_cm_join_mc_attr_mask`).
const JOIN_MC_ATTR_ADDRESS: u32 = 1 << 0;
/// `RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS`.
const JOIN_MC_ATTR_JOIN_FLAGS: u32 = 1 << 1;
/// `RDMA_MC_JOIN_FLAG_FULLMEMBER` (`enum rdma_cm_mc_join_flags`).
const JOIN_FLAG_FULLMEMBER: u32 = 0;
/// `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER`.
const JOIN_FLAG_SENDONLY_FULLMEMBER: u32 = 1;
/// The destination QPN of multicast packets (IBTA 9.2).
const MULTICAST_QPN: u32 = 0xFF_FFFF;

/// A group an id joined.
pub struct Joined {
    /// The address the program joined.
    pub addr: SocketAddr,
    /// The group's GID.
    pub mgid: [u8; 16],
    /// Whether the id's QP was attached to it.
    pub attached: bool,
}

/// `rdma_join_multicast` and `_ex` after their arguments were read.
fn join(
    p: *mut rdma_cm_id,
    group: SocketAddr,
    send_only: bool,
    context: *mut c_void,
) -> Result<(), Errno> {
    let key = p as usize;
    let mut st = lock();
    let id = st.id(p)?;
    // The kernel's rdma_join_multicast: a bound or resolved id (on a device), UD only.
    if !matches!(id.phase, Phase::Bound | Phase::AddrResolved) || id.dev.is_none() {
        return Err(libc::EINVAL);
    }
    if !group.ip().is_multicast() || id.bound.is_some_and(|b| b.is_ipv4() != group.is_ipv4()) {
        return Err(libc::EINVAL);
    }
    // SAFETY: a live id.
    let (qp_type, ps, qp) = unsafe { ((*p).qp_type, (*p).ps, (*p).qp) };
    if qp_type != IBV_QPT_UD {
        return Err(libc::EINVAL);
    }
    let mgid = addr::gid_of(group.ip());
    if id.groups.iter().any(|g| g.mgid == mgid) {
        return Err(libc::EADDRINUSE);
    }
    let attached = !send_only && !qp.is_null();
    if attached {
        let v = verbs()?;
        let gid = ibv_gid::from_bytes(mgid);
        // SAFETY: the id's live QP and a GID on this stack frame.
        let rc = unsafe { (v.attach_mcast)(qp as *mut c_void, &gid, 0) };
        if rc != 0 {
            return Err(rc);
        }
    }
    let id = st.id(p)?;
    id.groups.push(Joined {
        addr: group,
        mgid,
        attached,
    });
    let dev = id.dev.unwrap_or(0);
    let qkey = if ps == RDMA_PS_UDP { RDMA_UDP_QKEY } else { 0 };
    let ah = crate::cm::ah_towards(&st, key, dev, mgid);
    st.queue_event(key, key, event::MULTICAST_JOIN, 0, |b| {
        b.ev.param.ud = rdma_ud_param {
            private_data: context,
            private_data_len: 0,
            ah_attr: ah,
            qp_num: MULTICAST_QPN,
            qkey,
        };
    });
    Ok(())
}

/// `rdma_join_multicast(3)`: 0 and `RDMA_CM_EVENT_MULTICAST_JOIN` (its `param.ud` holds the
/// address vector towards the group, QPN 0xFFFFFF, the Q_Key, and `context` as
/// `private_data`), or -1 with errno: `EINVAL` for an id that is not bound or resolved, not
/// UD, or an address that is not multicast; `EADDRINUSE` for a group the id joined already;
/// the errno of `ibv_attach_mcast` otherwise.
///
/// # Safety
///
/// `addr` is NULL or a valid sockaddr.
pub unsafe extern "C" fn rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut sockaddr,
    context: *mut c_void,
) -> c_int {
    boundary::zero(|| {
        // SAFETY: caller's contract.
        let group = unsafe { addr::read(addr) }?;
        join(id, group, false, context)?;
        crate::id::complete_sync(id)
    })
}
symver!(rdma_join_multicast, "RDMACM_1.0");

/// `rdma_join_multicast_ex(3)`: as `rdma_join_multicast`, with the join type in
/// `mc_join_attr`: the address and the join flags must both be given
/// (`RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS`), the flags being
/// `RDMA_MC_JOIN_FLAG_FULLMEMBER` or `_SENDONLY_FULLMEMBER` (which attaches no QP);
/// `EINVAL` otherwise.
///
/// # Safety
///
/// `mc_join_attr` is NULL or a valid `struct rdma_cm_join_mc_attr_ex` whose `addr` is NULL or
/// a valid sockaddr.
pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    mc_join_attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    boundary::zero(|| {
        // SAFETY: caller's contract.
        let attr = unsafe { mc_join_attr.as_ref() }.ok_or(libc::EINVAL)?;
        let needed = JOIN_MC_ATTR_ADDRESS | JOIN_MC_ATTR_JOIN_FLAGS;
        if attr.comp_mask & needed != needed || attr.comp_mask & !needed != 0 {
            return Err(libc::EINVAL);
        }
        let send_only = match attr.join_flags {
            JOIN_FLAG_FULLMEMBER => false,
            JOIN_FLAG_SENDONLY_FULLMEMBER => true,
            _ => return Err(libc::EINVAL),
        };
        // SAFETY: caller's contract.
        let group = unsafe { addr::read(attr.addr) }?;
        join(id, group, send_only, context)?;
        crate::id::complete_sync(id)
    })
}
symver!(rdma_join_multicast_ex, "RDMACM_1.1");

/// Detaches the id's QP from a group it was attached to.
fn detach(qp: *mut ibv_qp, joined: &Joined) {
    if joined.attached && !qp.is_null() {
        if let Ok(v) = verbs() {
            let gid = ibv_gid::from_bytes(joined.mgid);
            // SAFETY: the id's live QP and a GID on this stack frame.
            unsafe { (v.detach_mcast)(qp as *mut c_void, &gid, 0) };
        }
    }
}

/// `rdma_leave_multicast(3)`: 0 (the QP detached), or -1 with `EADDRNOTAVAIL` for a group
/// the id did not join (librdmacm), `EINVAL` for an unknown id.
///
/// # Safety
///
/// `addr` is NULL or a valid sockaddr.
pub unsafe extern "C" fn rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    boundary::zero(|| {
        // SAFETY: caller's contract.
        let group = unsafe { addr::read(addr) }?;
        let mgid = addr::gid_of(group.ip());
        let mut st = lock();
        let entry = st.id(id)?;
        let at = entry
            .groups
            .iter()
            .position(|g| g.mgid == mgid)
            .ok_or(libc::EADDRNOTAVAIL)?;
        let joined = entry.groups.remove(at);
        // SAFETY: a live id.
        detach(unsafe { (*id).qp }, &joined);
        Ok(())
    })
}
symver!(rdma_leave_multicast, "RDMACM_1.0");

/// Detaches the id's QP from every group (before the QP is destroyed: a QP still attached
/// cannot be, `ibv_destroy_qp(3)` `EBUSY`). The groups stay joined for the id.
pub(crate) fn detach_all(st: &mut State, p: *mut rdma_cm_id) {
    let Ok(id) = st.id(p) else { return };
    // SAFETY: a live id.
    let qp = unsafe { (*p).qp };
    for joined in id.groups.iter_mut() {
        detach(qp, joined);
        joined.attached = false;
    }
}
