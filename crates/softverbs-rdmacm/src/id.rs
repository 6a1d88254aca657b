//! Communication identifiers and addresses: `rdma_create_id(3)`, `rdma_destroy_id(3)`,
//! `rdma_bind_addr(3)`, `rdma_resolve_addr(3)`, `rdma_resolve_route(3)`,
//! `rdma_listen(3)`, `rdma_migrate_id(3)`, `rdma_set_option(3)`, `rdma_get_src_port(3)`,
//! `rdma_get_dst_port(3)`.
//!
//! Addresses: a device's addresses are the IP addresses of its GID table (rxe's layout:
//! index 1 holds the device's address as an IPv4-mapped GID). Binding to an address picks
//! the device holding it; resolving a destination without a source picks the device
//! holding the destination (a loopback connection) or else the first device, and checks
//! the destination is routable from this host (a UDP socket `connect`), queueing
//! `RDMA_CM_EVENT_ADDR_ERROR` with the routing error when it is not. Ports are allocated
//! per port space within the process; port 0 gives an ephemeral port (32768–60999).

use crate::abi::*;
use crate::addr;
use crate::boundary::{self, Errno};
use crate::channel::{ack_event, free_channel, get_event, new_channel};
use crate::state::{lock, Guard, Id, Phase, Ptr, State};
use crate::symver;
use libc::{c_int, c_void, sockaddr};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

/// The QP type of a port space (librdmacm: UDP and IPoIB are datagram, the rest RC).
fn qp_type_of(ps: u32) -> u32 {
    if ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB {
        IBV_QPT_UD
    } else {
        IBV_QPT_RC
    }
}

/// Creates an id on `channel` (key), synchronous when `sync`.
pub(crate) fn new_id(
    st: &mut State,
    channel: *mut rdma_event_channel,
    sync: bool,
    context: *mut c_void,
    ps: u32,
) -> *mut rdma_cm_id {
    // SAFETY: rdma_cm_id is plain data; all-zero is valid (NULL pointers, zeros).
    let mut id: Box<rdma_cm_id> = Box::new(unsafe { std::mem::zeroed() });
    id.channel = channel;
    id.context = context;
    id.ps = ps;
    id.qp_type = qp_type_of(ps);
    let p = Box::into_raw(id);
    st.ids.insert(
        p as usize,
        Id {
            ptr: Ptr(p),
            sync,
            channel: channel as usize,
            phase: Phase::Idle,
            dev: None,
            bound: None,
            unacked: 0,
            destroying: false,
            backlog: 0,
            listener: None,
            conn: None,
            local_psn: crate::state::random_u32() & 0x00ff_ffff,
            remote: None,
            ep_qp: None,
            owned_cqs: None,
            tos: 0,
            ack_timeout: None,
            reuse: false,
            afonly: false,
            groups: Vec::new(),
        },
    );
    p
}

/// `rdma_create_id(3)`: 0, or -1 with errno (`EINVAL`: NULL `id`, unknown channel or port
/// space). A NULL channel makes a synchronous id.
///
/// # Safety
///
/// `id` is NULL or writable.
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    boundary::zero(|| {
        if id.is_null() {
            return Err(libc::EINVAL);
        }
        let ps = ps as u32;
        if ![RDMA_PS_TCP, RDMA_PS_UDP, RDMA_PS_IB, RDMA_PS_IPOIB].contains(&ps) {
            return Err(libc::EINVAL);
        }
        let (ch, sync) = if channel.is_null() {
            (new_channel()?, true)
        } else {
            if !lock().channels.contains_key(&(channel as usize)) {
                return Err(libc::EINVAL);
            }
            (channel, false)
        };
        let p = new_id(&mut lock(), ch, sync, context, ps);
        // SAFETY: non-NULL out pointer.
        unsafe { *id = p };
        Ok(())
    })
}
symver!(rdma_create_id, "RDMACM_1.0");

/// Destroys id `p`: cancels its connection, drops its queued events, waits until every
/// event handed out for it is acknowledged (`rdma_destroy_id(3)`: "ack all related
/// events"; librdmacm blocks), then frees it.
pub(crate) fn destroy(p: *mut rdma_cm_id) -> Result<(), Errno> {
    let key = p as usize;
    let mut st = lock();
    st.id(p)?;
    // A synchronous id's last event is its own to acknowledge.
    // SAFETY: a live id.
    let last = unsafe { (*p).event };
    if !last.is_null() {
        // SAFETY: a live id.
        unsafe { (*p).event = std::ptr::null_mut() };
        drop(st);
        let _ = ack_event(last);
        st = lock();
    }
    crate::cm::release(&mut st, key);
    let id = st.ids.get_mut(&key).ok_or(libc::EINVAL)?;
    id.destroying = true;
    st.drop_queued_events(key);
    // Passive ids whose request is still queued on a listener being destroyed go too.
    let orphans: Vec<usize> = st
        .ids
        .iter()
        .filter(|(_, i)| i.listener == Some(key) && i.phase == Phase::Requested)
        .map(|(k, _)| *k)
        .collect();
    for o in &orphans {
        let queued = st.channels.values().any(|c| {
            c.queue
                .iter()
                // SAFETY: queued boxes are live.
                .any(|e| unsafe { (*e.0).ev.id as usize } == *o)
        });
        if queued {
            crate::cm::release(&mut st, *o);
            st.drop_queued_events(*o);
            free_id(&mut st, *o);
        }
    }
    // Bounded by the program's acknowledgements: each wait gives the lock up.
    loop {
        match st.ids.get(&key) {
            Some(id) if id.unacked > 0 => st = Guard::wait_acked(st, Duration::from_millis(100)),
            _ => break,
        }
    }
    free_id(&mut st, key);
    Ok(())
}

/// Forgets and frees id `key` (its port, its route, its private channel).
fn free_id(st: &mut State, key: usize) {
    let Some(id) = st.ids.remove(&key) else {
        return;
    };
    // SAFETY: the id's box from `new_id`, no longer in the table.
    let b = unsafe { Box::from_raw(id.ptr.0) };
    if let Some(bound) = id.bound {
        st.unbind_port(key, b.ps, bound.port());
    }
    if !b.route.path_rec.is_null() {
        // SAFETY: path records are boxes from `resolve_route`.
        drop(unsafe { Box::from_raw(b.route.path_rec) });
    }
    if id.sync {
        free_channel(st, id.channel);
    }
}

/// `rdma_destroy_id(3)`: 0, or -1 with `EINVAL` for an unknown id. Blocks until the
/// events reported on the id are acknowledged.
pub extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    boundary::zero(|| destroy(id))
}
symver!(rdma_destroy_id, "RDMACM_1.0");

/// For a synchronous id: acknowledges its previous event, waits for the next one and
/// keeps it in `id->event`; a failed event becomes the call's errno (`ECONNREFUSED` for a
/// rejection, the event's status otherwise). Asynchronous ids return at once.
pub(crate) fn complete_sync(p: *mut rdma_cm_id) -> Result<(), Errno> {
    let channel = {
        let mut st = lock();
        let id = st.id(p)?;
        if !id.sync {
            return Ok(());
        }
        id.channel
    };
    // SAFETY: a live id (checked above; the program does not destroy it meanwhile).
    let last = unsafe { (*p).event };
    if !last.is_null() {
        // SAFETY: as above.
        unsafe { (*p).event = std::ptr::null_mut() };
        let _ = ack_event(last);
    }
    let e = get_event(channel as *mut rdma_event_channel)?;
    // SAFETY: as above; `e` is a live event.
    unsafe { (*p).event = e };
    // SAFETY: a live event.
    let (kind, status) = unsafe { ((*e).event, (*e).status) };
    if status != 0 {
        return Err(if kind == event::REJECTED {
            libc::ECONNREFUSED
        } else {
            status.abs()
        });
    }
    match kind {
        event::ADDR_ERROR | event::ROUTE_ERROR | event::UNREACHABLE | event::CONNECT_ERROR => {
            Err(libc::EHOSTUNREACH)
        }
        event::REJECTED => Err(libc::ECONNREFUSED),
        _ => Ok(()),
    }
}

/// Binds id `key` to `a` (port 0: ephemeral); sets the id's device and source address.
pub(crate) fn bind(st: &mut State, p: *mut rdma_cm_id, a: SocketAddr) -> Result<(), Errno> {
    let key = p as usize;
    st.open_devices()?;
    let mut a = a;
    let dev = if a.ip().is_unspecified() {
        None
    } else if let Some(d) = st.device_of_ip(a.ip()) {
        Some(d)
    } else if a.ip().is_loopback()
        && st
            .devices
            .first()
            .and_then(|d| d.ip())
            .map(|ip| ip.is_ipv4())
            == Some(a.is_ipv4())
    {
        // A loopback address no device holds (`localhost`, as libfabric's verbs provider
        // binds when given no address) stands for this host: the first device, as the
        // kernel's CM binds loopback to its first active port; the id takes that device's
        // address, so a peer told it (`rdma_get_local_addr`) reaches this process.
        a.set_ip(st.devices[0].ip().ok_or(libc::EADDRNOTAVAIL)?);
        Some(0)
    } else {
        return Err(libc::EADDRNOTAVAIL);
    };
    let id = st.id(p)?;
    if id.phase != Phase::Idle {
        return Err(libc::EINVAL);
    }
    // SAFETY: a live id.
    let ps = unsafe { (*p).ps };
    let bound = st.bind_port(key, ps, a)?;
    let ctx = dev.map_or(std::ptr::null_mut(), |d| st.devices[d].ctx.0);
    let id = st.id(p)?;
    id.bound = Some(bound);
    id.dev = dev;
    id.phase = Phase::Bound;
    // SAFETY: a live id; the program reads these fields (`rdma_get_local_addr`).
    unsafe {
        addr::to_storage(&mut (*p).route.addr.src_storage, bound);
        if !ctx.is_null() {
            (*p).verbs = ctx;
            (*p).port_num = 1;
            (*p).route.addr.ibaddr.sgid = ibv_gid::from_bytes(addr::gid_of(bound.ip()));
            (*p).route.addr.ibaddr.pkey = 0xffff;
        }
    }
    Ok(())
}

/// `rdma_bind_addr(3)`: 0, or -1 with errno (`EINVAL` bad id or already bound,
/// `EAFNOSUPPORT` not IPv4/IPv6, `EADDRNOTAVAIL` no device holds the address (a loopback
/// address none holds binds to the first device, with its address), `EADDRINUSE` the port is taken in the id's port space).
///
/// # Safety
///
/// `addr` is NULL or a valid `sockaddr_in` / `sockaddr_in6`.
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    boundary::zero(|| {
        // SAFETY: caller's contract.
        let a = unsafe { addr::read(addr) }?;
        bind(&mut lock(), id, a)
    })
}
symver!(rdma_bind_addr, "RDMACM_1.0");

/// The routing error towards `dst`, if the host has no route to it.
fn unreachable(dst: SocketAddr) -> Option<Errno> {
    let any: SocketAddr = match dst {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = std::net::UdpSocket::bind(any).ok()?;
    let mut probe = dst;
    probe.set_port(4791);
    s.connect(probe).err().and_then(|e| e.raw_os_error())
}

/// `rdma_resolve_addr` without the synchronous wait.
fn resolve_addr(p: *mut rdma_cm_id, src: Option<SocketAddr>, dst: SocketAddr) -> Result<(), Errno> {
    let key = p as usize;
    let mut st = lock();
    st.open_devices()?;
    let phase = st.id(p)?.phase;
    if phase == Phase::Idle {
        let src = match src {
            Some(s) => s,
            None => {
                let d = st.device_of_ip(dst.ip()).unwrap_or(0);
                let ip = st.devices[d].ip().ok_or(libc::EADDRNOTAVAIL)?;
                SocketAddr::new(ip, 0)
            }
        };
        bind(&mut st, p, src)?;
    } else if phase != Phase::Bound && phase != Phase::AddrResolved {
        return Err(libc::EINVAL);
    }
    let id = st.id(p)?;
    let mut local = id.bound.ok_or(libc::EINVAL)?;
    let dev = match id.dev {
        Some(d) => d,
        None => st.device_of_ip(dst.ip()).unwrap_or(0),
    };
    if local.ip().is_unspecified() {
        local.set_ip(st.devices[dev].ip().ok_or(libc::EADDRNOTAVAIL)?);
    }
    let sgid_ok = st.devices[dev].gid_index(local.ip()).is_some();
    let ctx = st.devices[dev].ctx.0;
    let id = st.id(p)?;
    id.dev = Some(dev);
    id.bound = Some(local);
    if !sgid_ok {
        return Err(libc::EADDRNOTAVAIL);
    }
    // A multicast group is reached out of the source's interface (the kernel's route
    // lookup picks the device of a bound source for a multicast destination), no route
    // needed.
    if let Some(e) = unreachable(dst).filter(|_| !dst.ip().is_multicast()) {
        st.queue_event(key, key, event::ADDR_ERROR, -e, |_| {});
        return Ok(());
    }
    let id = st.id(p)?;
    id.phase = Phase::AddrResolved;
    // SAFETY: a live id.
    unsafe {
        (*p).verbs = ctx;
        (*p).port_num = 1;
        addr::to_storage(&mut (*p).route.addr.src_storage, local);
        addr::to_storage(&mut (*p).route.addr.dst_storage, dst);
        (*p).route.addr.ibaddr.sgid = ibv_gid::from_bytes(addr::gid_of(local.ip()));
        (*p).route.addr.ibaddr.dgid = ibv_gid::from_bytes(addr::gid_of(dst.ip()));
        (*p).route.addr.ibaddr.pkey = 0xffff;
    }
    st.queue_event(key, key, event::ADDR_RESOLVED, 0, |_| {});
    Ok(())
}

/// `rdma_resolve_addr(3)`: 0 and `RDMA_CM_EVENT_ADDR_RESOLVED` (or `ADDR_ERROR`) later,
/// or -1 with errno (`EINVAL`, `EAFNOSUPPORT`, `EADDRNOTAVAIL`, `EADDRINUSE`).
///
/// # Safety
///
/// `src_addr` is NULL or a valid sockaddr; `dst_addr` a valid sockaddr.
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src_addr: *mut sockaddr,
    dst_addr: *mut sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    boundary::zero(|| {
        // SAFETY: caller's contract.
        let dst = unsafe { addr::read(dst_addr) }?;
        let src = if src_addr.is_null() {
            None
        } else {
            // SAFETY: caller's contract.
            Some(unsafe { addr::read(src_addr) }?)
        };
        if src.is_some_and(|s| s.is_ipv4() != dst.is_ipv4()) {
            return Err(libc::EINVAL);
        }
        resolve_addr(id, src, dst)?;
        complete_sync(id)
    })
}
symver!(rdma_resolve_addr, "RDMACM_1.0");

/// The path record of a RoCE route between two GIDs.
pub(crate) fn path_record(sgid: [u8; 16], dgid: [u8; 16], mtu: u32, tos: u8) -> ibv_sa_path_rec {
    ibv_sa_path_rec {
        dgid: ibv_gid::from_bytes(dgid),
        sgid: ibv_gid::from_bytes(sgid),
        dlid: 0,
        slid: 0,
        raw_traffic: 0,
        flow_label: 0,
        hop_limit: 64,
        traffic_class: tos,
        reversible: 1,
        numb_path: 1,
        pkey: 0xffff,
        sl: 0,
        mtu_selector: 2, // exactly
        mtu: mtu as u8,
        rate_selector: 2,
        rate: 0,
        packet_life_time_selector: 2,
        packet_life_time: 16,
        preference: 0,
    }
}

fn resolve_route(p: *mut rdma_cm_id) -> Result<(), Errno> {
    let key = p as usize;
    let mut st = lock();
    let id = st.id(p)?;
    if id.phase != Phase::AddrResolved && id.phase != Phase::RouteResolved {
        return Err(libc::EINVAL);
    }
    let dev = id.dev.ok_or(libc::EINVAL)?;
    let tos = id.tos;
    id.phase = Phase::RouteResolved;
    let mtu = st.devices[dev].active_mtu;
    // SAFETY: a live id.
    unsafe {
        let ib = (*p).route.addr.ibaddr;
        let rec = Box::new(path_record(ib.sgid.bytes(), ib.dgid.bytes(), mtu, tos));
        if !(*p).route.path_rec.is_null() {
            drop(Box::from_raw((*p).route.path_rec));
        }
        (*p).route.path_rec = Box::into_raw(rec);
        (*p).route.num_paths = 1;
    }
    st.queue_event(key, key, event::ROUTE_RESOLVED, 0, |_| {});
    Ok(())
}

/// `rdma_resolve_route(3)`: 0 and `RDMA_CM_EVENT_ROUTE_RESOLVED` later (the route is the
/// one RoCE path: `id->route.path_rec[0]`), or -1 with `EINVAL` before the address is
/// resolved.
pub extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    boundary::zero(|| {
        resolve_route(id)?;
        complete_sync(id)
    })
}
symver!(rdma_resolve_route, "RDMACM_1.0");

/// `rdma_listen(3)`: 0, or -1 with errno. An id not yet bound is bound to the wildcard
/// address and an ephemeral port first (as the kernel does).
pub extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    boundary::zero(|| {
        let mut st = lock();
        let phase = st.id(id)?.phase;
        match phase {
            Phase::Idle => bind(&mut st, id, (Ipv4Addr::UNSPECIFIED, 0).into())?,
            Phase::Bound => {}
            Phase::Listening => {
                st.id(id)?.backlog = backlog;
                return Ok(());
            }
            _ => return Err(libc::EINVAL),
        }
        crate::cm::listen(&mut st, id as usize)?;
        let i = st.id(id)?;
        i.phase = Phase::Listening;
        i.backlog = if backlog <= 0 { 128 } else { backlog };
        // A request that came before the listen and was held for it (`Cm::listen` took it)
        // is this id's now: the CM thread delivers it at once, not when the hold it slept
        // for runs out (perftest's -R data connection waited 50 ms for its server).
        crate::cm::wake();
        Ok(())
    })
}
symver!(rdma_listen, "RDMACM_1.0");

/// `rdma_migrate_id(3)`: moves the id (and its queued events) to `channel`; NULL makes it
/// synchronous. Blocks while events of the id are unacknowledged.
pub extern "C" fn rdma_migrate_id(id: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int {
    boundary::zero(|| {
        let key = id as usize;
        let mut st = lock();
        st.id(id)?;
        if !channel.is_null() && !st.channels.contains_key(&(channel as usize)) {
            return Err(libc::EINVAL);
        }
        let i = st.id(id)?;
        if i.sync {
            // A synchronous id holds its last event (`id->event`) until its next call:
            // this is that call, so the event is acknowledged here, not waited for.
            let p = i.ptr.0;
            // SAFETY: a live id (found in the table).
            let last = unsafe { std::mem::replace(&mut (*p).event, std::ptr::null_mut()) };
            if !last.is_null() {
                drop(st);
                let _ = ack_event(last);
                st = lock();
            }
        }
        loop {
            let i = st.id(id)?;
            if i.unacked == 0 {
                break;
            }
            st = Guard::wait_acked(st, Duration::from_millis(100));
        }
        drop(st);
        let (new, sync) = if channel.is_null() {
            (new_channel()?, true)
        } else {
            (channel, false)
        };
        let mut st = lock();
        let old = st.id(id)?.channel;
        let old_sync = st.id(id)?.sync;
        if old == new as usize {
            return Ok(());
        }
        let mut moved = Vec::new();
        if let Some(ch) = st.channels.get_mut(&old) {
            ch.queue.retain(|e| {
                // SAFETY: queued boxes are live.
                let mine = unsafe { (*e.0).ev.id as usize == key || (*e.0).counted_on == key };
                if mine {
                    moved.push(*e);
                }
                !mine
            });
        }
        let ch = st.channels.get_mut(&(new as usize)).ok_or(libc::EINVAL)?;
        for e in moved {
            ch.queue.push_back(e);
            let one: u64 = 1;
            // SAFETY: the live channel's eventfd.
            unsafe { libc::write((*ch.ptr.0).fd, &one as *const u64 as *const c_void, 8) };
        }
        let i = st.id(id)?;
        i.channel = new as usize;
        i.sync = sync;
        let p = i.ptr.0;
        // SAFETY: a live id (found in the table).
        unsafe { (*p).channel = new };
        if old_sync {
            free_channel(&mut st, old);
        }
        Ok(())
    })
}
symver!(rdma_migrate_id, "RDMACM_1.0");

/// `rdma_set_option(3)`: `RDMA_OPTION_ID_TOS` (uint8_t), `_REUSEADDR` (int), `_AFONLY`
/// (int), `_ACK_TIMEOUT` (uint8_t) are kept; `RDMA_OPTION_IB_PATH` is accepted (the one
/// RoCE path is used). Wrong sizes or NULL values: `EINVAL`; other options: `ENOSYS`.
///
/// # Safety
///
/// `optval` is NULL or points at `optlen` readable bytes.
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    boundary::zero(|| {
        let mut st = lock();
        let i = st.id(id)?;
        if optval.is_null() {
            return Err(libc::EINVAL);
        }
        let byte = || -> Result<u8, Errno> {
            if optlen != 1 {
                return Err(libc::EINVAL);
            }
            // SAFETY: one readable byte (caller's contract).
            Ok(unsafe { *(optval as *const u8) })
        };
        let int = || -> Result<c_int, Errno> {
            if optlen != std::mem::size_of::<c_int>() {
                return Err(libc::EINVAL);
            }
            // SAFETY: an int's worth of readable bytes (caller's contract).
            Ok(unsafe { std::ptr::read_unaligned(optval as *const c_int) })
        };
        match (level, optname) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) => i.tos = byte()?,
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR) => i.reuse = int()? != 0,
            (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY) => i.afonly = int()? != 0,
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => i.ack_timeout = Some(byte()?.min(31)),
            (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => {}
            _ => return Err(libc::ENOSYS),
        }
        Ok(())
    })
}
symver!(rdma_set_option, "RDMACM_1.0");

fn port_of(id: *mut rdma_cm_id, local: bool) -> u16 {
    boundary::infallible(0, || {
        let mut st = lock();
        if st.id(id).is_err() {
            return 0;
        }
        // SAFETY: a live id.
        let a = unsafe {
            if local {
                addr::from_storage(&(*id).route.addr.src_storage)
            } else {
                addr::from_storage(&(*id).route.addr.dst_storage)
            }
        };
        a.map_or(0, |a| a.port().to_be())
    })
}

/// `rdma_get_src_port(3)`: the local port in network byte order (0 when none).
pub extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    port_of(id, true)
}
symver!(rdma_get_src_port, "RDMACM_1.0");

/// `rdma_get_dst_port(3)`: the peer's port in network byte order (0 when none).
pub extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    port_of(id, false)
}
symver!(rdma_get_dst_port, "RDMACM_1.0");
