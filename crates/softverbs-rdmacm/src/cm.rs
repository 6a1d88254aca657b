//! The CM thread and the translation between softverbs-cm and the `rdma_cm` events.
//!
//! Each device that takes part in a connection gets a [`DeviceCm`]: a `softverbs_cm::Cm`
//! (the IB CM of its port), the device's GSI fd, and the map from the manager's
//! connections to ids. One thread per process waits on every GSI fd and the managers'
//! timers, feeds received MADs to `Cm::handle_mad`, runs `Cm::handle_timeout`, sends what
//! `Cm::poll_transmit` gives through `softverbs_gsi_send`, and turns each `CmEvent` into
//! an `RDMA_CM_EVENT_*` on the right id's channel, moving the id's QP as librdmacm does:
//!
//! | softverbs-cm event | id | QP | rdma_cm event (status) |
//! |---|---|---|---|
//! | `ReqReceived` | a new id on the listener's channel | — | `CONNECT_REQUEST` |
//! | `RepReceived`, id with a QP | active | RTR, RTS, then RTU sent | `ESTABLISHED` |
//! | `RepReceived`, id without a QP | active | — | `CONNECT_RESPONSE` (`rdma_establish` sends the RTU) |
//! | `RtuReceived` | passive | (RTS at accept) | `ESTABLISHED` |
//! | `Rejected` | either | ERR | `REJECTED` (the REJ reason, e.g. 8 when nobody listens, 28 consumer) |
//! | `Timeout` | active / passive | ERR | `UNREACHABLE` / `CONNECT_ERROR` (−ETIMEDOUT) |
//! | `DreqReceived`, `DrepReceived`, `DreqTimeout` | either | ERR | `DISCONNECTED` (once per id) |
//! | `SidrReqReceived` | a new UD id | — | `CONNECT_REQUEST` (`param.ud`) |
//! | `SidrRepReceived` | active UD | — | `ESTABLISHED` (`param.ud`: AH, QPN, Q_Key) or `UNREACHABLE` (the SIDR status) |
//! | `SidrTimeout` | active UD | — | `UNREACHABLE` (−ETIMEDOUT) |
//!
//! `TimewaitExit` and `MraReceived` give no event.

use crate::abi::*;
use crate::addr;
use crate::boundary::Errno;
use crate::state::{lock, Phase, Remote, State};
use crate::verbs::gsi;
use softverbs_cm::cma::{CmaHeader, CMA_HEADER_LEN};
use softverbs_cm::{Cm, CmConfig, CmError, CmEvent, ConnId, MadSource};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::OnceLock;

/// One device's connection manager.
pub struct DeviceCm {
    /// The IB CM of the device's port.
    pub cm: Cm,
    /// The device's GSI fd (readable while MADs wait).
    pub fd: i32,
    /// Connections → ids.
    pub conns: HashMap<ConnId, usize>,
    /// Service IDs → listening ids.
    pub listeners: HashMap<u64, Vec<usize>>,
}

/// A connection of a device's manager.
pub type ConnRef = ConnId;

/// Monotonic nanoseconds (the managers' clock).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The errno of a softverbs-cm refusal.
pub fn errno_of(e: CmError) -> Errno {
    e.errno()
}

/// The eventfd that wakes the CM thread (timers changed, a device joined).
fn wake_fd() -> i32 {
    static FD: OnceLock<i32> = OnceLock::new();
    // SAFETY: eventfd with valid flags.
    *FD.get_or_init(|| unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })
}

/// Wakes the CM thread so it looks at the timers and fds again.
pub fn wake() {
    let one: u64 = 1;
    // SAFETY: the wake eventfd; 8 bytes.
    unsafe { libc::write(wake_fd(), &one as *const u64 as *const libc::c_void, 8) };
}

/// Makes device `dev`'s manager (and the CM thread) on first use.
pub fn ensure_cm(st: &mut State, dev: usize) -> Result<(), Errno> {
    if st.devices[dev].cm.is_some() {
        return Ok(());
    }
    let g = gsi()?;
    let ctx = st.devices[dev].ctx.0;
    // SAFETY: an open context of the loaded libibverbs.
    let fd = unsafe { (g.fd)(ctx) };
    if fd < 0 {
        return Err(crate::boundary::errno().max(libc::ENODEV));
    }
    // SAFETY: an open context of the loaded libibverbs.
    let share = unsafe { (g.share)(ctx) };
    let share = u8::try_from(share).map_err(|_| crate::boundary::errno().max(libc::ENODEV))?;
    let seed =
        (u64::from(crate::state::random_u32()) << 32) | u64::from(crate::state::random_u32());
    let mut cm = Cm::new(CmConfig {
        local_ca_guid: st.devices[dev].guid,
        seed,
        share,
    });
    cm.set_unmatched_req_hold(UNMATCHED_REQ_HOLD_NS);
    st.devices[dev].cm = Some(DeviceCm {
        cm,
        fd,
        conns: HashMap::new(),
        listeners: HashMap::new(),
    });
    start_thread();
    wake();
    Ok(())
}

/// How long a connection request for a port nobody listens on waits for an `rdma_listen`
/// before it is rejected (REJ 8). Programs that connect right after telling the peer
/// (over another channel) to listen — perftest's `-R` data connection — would otherwise
/// race the peer's `rdma_listen` and lose on a fast path; 50 ms covers that gap and stays
/// far below the active side's response timeout.
const UNMATCHED_REQ_HOLD_NS: u64 = 50_000_000;

fn start_thread() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let _ = std::thread::Builder::new()
            .name("rdmacm-cm".into())
            .spawn(|| {
                // A panic in one pass is caught so the thread keeps serving.
                loop {
                    let _ = std::panic::catch_unwind(run_once);
                }
            });
    });
}

/// One pass of the CM thread: wait for a MAD, a wake-up or the next timer, then handle
/// what is due.
fn run_once() {
    let (mut fds, deadline) = {
        let st = lock();
        let mut fds = vec![libc::pollfd {
            fd: wake_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let mut deadline: Option<u64> = None;
        for d in &st.devices {
            if let Some(c) = &d.cm {
                fds.push(libc::pollfd {
                    fd: c.fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
                if let Some(t) = c.cm.poll_timeout() {
                    deadline = Some(deadline.map_or(t, |d| d.min(t)));
                }
            }
        }
        (fds, deadline)
    };
    let timeout_ms = match deadline {
        None => 1000,
        Some(t) => {
            let now = now_ns();
            (t.saturating_sub(now).div_ceil(1_000_000)).min(1000) as i32
        }
    };
    // SAFETY: a valid array of pollfds.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if fds[0].revents != 0 {
        let mut v: u64 = 0;
        // SAFETY: the non-blocking wake eventfd.
        unsafe { libc::read(wake_fd(), &mut v as *mut u64 as *mut libc::c_void, 8) };
    }
    let mut st = lock();
    let now = now_ns();
    for dev in 0..st.devices.len() {
        if st.devices[dev].cm.is_none() {
            continue;
        }
        receive(&mut st, dev, now);
        if let Some(c) = st.devices[dev].cm.as_mut() {
            if c.cm.poll_timeout().is_some_and(|t| t <= now) {
                c.cm.handle_timeout(now);
            }
        }
        pump(&mut st, dev);
    }
}

/// Feeds the MADs waiting on device `dev` to its manager (bounded per pass).
fn receive(st: &mut State, dev: usize, now: u64) {
    let Ok(g) = gsi() else { return };
    let ctx = st.devices[dev].ctx.0;
    for _ in 0..256 {
        let mut sgid = [0u8; 16];
        let mut qpn = 0u32;
        let mut buf = [0u8; 256];
        // SAFETY: an open context and buffers of the sizes given.
        let n = unsafe {
            (g.recv)(
                ctx,
                sgid.as_mut_ptr(),
                &mut qpn,
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
            )
        };
        if n < 0 {
            break;
        }
        let Some(c) = st.devices[dev].cm.as_mut() else {
            return;
        };
        c.cm.handle_mad(
            now,
            MadSource { sgid, src_qpn: qpn },
            &buf[..(n as usize).min(256)],
        );
    }
}

/// Sends what device `dev`'s manager wants sent and turns its events into rdma_cm events,
/// until both are drained (an event may make the manager send, e.g. the RTU).
pub fn pump(st: &mut State, dev: usize) {
    let Ok(g) = gsi() else { return };
    let ctx = st.devices[dev].ctx.0;
    // Bounded: each pass drains queues the manager fills only in answer to calls made here.
    for _ in 0..1024 {
        let Some(c) = st.devices[dev].cm.as_mut() else {
            return;
        };
        let mut idle = true;
        while let Some(m) = c.cm.poll_transmit() {
            idle = false;
            // SAFETY: an open context, a 16-byte GID and the 256-byte MAD.
            unsafe {
                (g.send)(
                    ctx,
                    m.dgid.as_ptr(),
                    m.bytes.as_ptr() as *const libc::c_void,
                    m.bytes.len(),
                )
            };
        }
        let Some(ev) = c.cm.poll_event() else {
            if idle {
                return;
            }
            continue;
        };
        on_event(st, dev, ev);
    }
}

/// The id of a connection.
fn id_of(st: &State, dev: usize, conn: ConnId) -> Option<usize> {
    st.devices[dev].cm.as_ref()?.conns.get(&conn).copied()
}

/// Forgets a connection's id mapping.
fn unmap(st: &mut State, dev: usize, conn: ConnId) {
    if let Some(c) = st.devices[dev].cm.as_mut() {
        c.conns.remove(&conn);
    }
}

/// Copies private data into an event and points `param.conn` at it.
fn conn_param(b: &mut crate::state::EventBox, data: &[u8], f: impl FnOnce(&mut rdma_conn_param)) {
    let n = data.len().min(255);
    b.data[..n].copy_from_slice(&data[..n]);
    let mut p = rdma_conn_param {
        private_data: if n == 0 {
            std::ptr::null()
        } else {
            b.data.as_ptr() as *const libc::c_void
        },
        private_data_len: n as u8,
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: 0,
        retry_count: 0,
        rnr_retry_count: 0,
        srq: 0,
        qp_num: 0,
    };
    f(&mut p);
    b.ev.param.conn = p;
}

/// Copies private data into an event and points `param.ud` at it.
fn ud_param(b: &mut crate::state::EventBox, data: &[u8], ah: ibv_ah_attr, qpn: u32, qkey: u32) {
    let n = data.len().min(255);
    b.data[..n].copy_from_slice(&data[..n]);
    b.ev.param.ud = rdma_ud_param {
        private_data: if n == 0 {
            std::ptr::null()
        } else {
            b.data.as_ptr() as *const libc::c_void
        },
        private_data_len: n as u8,
        ah_attr: ah,
        qp_num: qpn,
        qkey,
    };
}

/// The address vector towards `dgid` from id `key`'s source GID.
pub(crate) fn ah_towards(st: &State, key: usize, dev: usize, dgid: [u8; 16]) -> ibv_ah_attr {
    let p = st.ids[&key].ptr.0;
    // SAFETY: a live id.
    let sgid = unsafe { (*p).route.addr.ibaddr.sgid.bytes() };
    let sgid_index = st.devices[dev]
        .gids
        .iter()
        .find(|(_, g)| *g == sgid)
        .map_or(1, |(i, _)| *i);
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid::from_bytes(dgid),
            flow_label: 0,
            sgid_index,
            hop_limit: 64,
            traffic_class: st.ids[&key].tos,
        },
        dlid: 0,
        sl: 0,
        src_path_bits: 0,
        static_rate: 0,
        is_global: 1,
        port_num: 1,
    }
}

/// Reports a connection's end once, moving the QP to ERR.
fn end(st: &mut State, dev: usize, conn: ConnId, kind: u32, status: i32, data: &[u8]) {
    let Some(key) = id_of(st, dev, conn) else {
        return;
    };
    let Some(id) = st.ids.get_mut(&key) else {
        return;
    };
    if id.phase == Phase::Disconnected {
        return;
    }
    id.phase = Phase::Disconnected;
    let p = id.ptr.0;
    crate::qp::to_error(p);
    st.queue_event(key, key, kind, status, |b| conn_param(b, data, |_| {}));
}

/// The listening id for a request to `service_id` addressed to `dst` on device `dev`.
fn listener_for(
    st: &State,
    dev: usize,
    service_id: u64,
    dst: Option<std::net::IpAddr>,
) -> Option<usize> {
    let keys = st.devices[dev].cm.as_ref()?.listeners.get(&service_id)?;
    let fits = |k: &usize| {
        st.ids.get(k).is_some_and(|i| {
            i.phase == Phase::Listening
                && !i.destroying
                && i.bound.is_some_and(|b| {
                    b.ip().is_unspecified() || dst.is_none_or(|d| addr::same_ip(b.ip(), d))
                })
        })
    };
    keys.iter().copied().find(|k| fits(k))
}

/// Makes the passive id of a request on listener `lkey`.
fn new_passive(
    st: &mut State,
    dev: usize,
    lkey: usize,
    conn: ConnId,
    hdr: Option<CmaHeader>,
    remote_gid: [u8; 16],
) -> Result<usize, Errno> {
    let (sync, ch, ctx_ptr, ps, local) = {
        let l = &st.ids[&lkey];
        // SAFETY: a live id.
        let (ctx_ptr, ps) = unsafe { ((*l.ptr.0).context, (*l.ptr.0).ps) };
        (l.sync, l.channel, ctx_ptr, ps, l.bound)
    };
    let channel = if sync {
        // A synchronous listener's requests are synchronous ids with their own channel.
        crate::channel::new_channel_locked(st)?
    } else {
        ch as *mut rdma_event_channel
    };
    let p = crate::id::new_id(st, channel, sync, ctx_ptr, ps);
    let key = p as usize;
    let dctx = st.devices[dev].ctx.0;
    let mtu = st.devices[dev].active_mtu;
    let local_gid_ip = st.devices[dev].ip();
    let (src, dst) = match hdr {
        Some(h) => (
            SocketAddr::new(h.addresses.dst(), local.map_or(0, |l| l.port())),
            SocketAddr::new(h.addresses.src(), h.src_port),
        ),
        None => (
            SocketAddr::new(
                local_gid_ip.unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into()),
                local.map_or(0, |l| l.port()),
            ),
            SocketAddr::new(addr::ip_of_gid(remote_gid), 0),
        ),
    };
    let sgid = st.devices[dev]
        .gid_index(src.ip())
        .map_or_else(|| addr::gid_of(src.ip()), |_| addr::gid_of(src.ip()));
    // SAFETY: a fresh id.
    unsafe {
        (*p).verbs = dctx;
        (*p).port_num = 1;
        addr::to_storage(&mut (*p).route.addr.src_storage, src);
        addr::to_storage(&mut (*p).route.addr.dst_storage, dst);
        (*p).route.addr.ibaddr.sgid = ibv_gid::from_bytes(sgid);
        (*p).route.addr.ibaddr.dgid = ibv_gid::from_bytes(remote_gid);
        (*p).route.addr.ibaddr.pkey = 0xffff;
        (*p).route.path_rec =
            Box::into_raw(Box::new(crate::id::path_record(sgid, remote_gid, mtu, 0)));
        (*p).route.num_paths = 1;
    }
    let id = st.ids.get_mut(&key).ok_or(libc::EINVAL)?;
    id.dev = Some(dev);
    id.listener = Some(lkey);
    id.conn = Some(conn);
    id.phase = Phase::Requested;
    if let Some(c) = st.devices[dev].cm.as_mut() {
        c.conns.insert(conn, key);
    }
    Ok(key)
}

fn on_event(st: &mut State, dev: usize, ev: CmEvent) {
    let now = now_ns();
    match ev {
        CmEvent::ReqReceived {
            conn,
            service_id,
            req,
        } => {
            let hdr = CmaHeader::parse(&req.private_data).ok();
            let lkey = listener_for(st, dev, service_id, hdr.map(|h| h.addresses.dst()));
            let backlog_ok = lkey.is_some_and(|l| {
                let pending = st
                    .ids
                    .values()
                    .filter(|i| i.listener == Some(l) && i.phase == Phase::Requested)
                    .count();
                pending < st.ids[&l].backlog.max(1) as usize
            });
            let (Some(lkey), true, Some(_)) = (lkey, backlog_ok, hdr) else {
                if let Some(c) = st.devices[dev].cm.as_mut() {
                    let _ = c.cm.reject(now, conn, 28, &[]);
                }
                return;
            };
            let Ok(key) = new_passive(st, dev, lkey, conn, hdr, req.remote_gid) else {
                if let Some(c) = st.devices[dev].cm.as_mut() {
                    let _ = c.cm.reject(now, conn, 28, &[]);
                }
                return;
            };
            let mtu = u32::from(req.path_mtu)
                .min(st.devices[dev].active_mtu)
                .max(1);
            if let Some(id) = st.ids.get_mut(&key) {
                id.remote = Some(Remote {
                    qpn: req.remote_qpn,
                    psn: req.starting_psn,
                    gid: req.remote_gid,
                    mtu,
                    responder_resources: req.initiator_depth,
                    initiator_depth: req.responder_resources,
                    retry_count: req.retry_count,
                    rnr_retry_count: req.rnr_retry_count,
                    qkey: 0,
                });
            }
            let user = req
                .private_data
                .get(CMA_HEADER_LEN..)
                .unwrap_or(&[])
                .to_vec();
            st.queue_event(key, lkey, event::CONNECT_REQUEST, 0, |b| {
                conn_param(b, &user, |p| {
                    p.responder_resources = req.responder_resources;
                    p.initiator_depth = req.initiator_depth;
                    p.flow_control = req.flow_control as u8;
                    p.retry_count = req.retry_count;
                    p.rnr_retry_count = req.rnr_retry_count;
                    p.srq = req.srq as u8;
                    p.qp_num = req.remote_qpn;
                })
            });
        }
        CmEvent::RepReceived { conn, rep } => {
            let Some(key) = id_of(st, dev, conn) else {
                return;
            };
            let Some(id) = st.ids.get_mut(&key) else {
                return;
            };
            if id.phase != Phase::Connecting {
                return;
            }
            let mut r = id.remote.unwrap_or_default();
            r.qpn = rep.remote_qpn;
            r.psn = rep.starting_psn;
            r.responder_resources = r.responder_resources.min(rep.initiator_depth);
            r.initiator_depth = r.initiator_depth.min(rep.responder_resources);
            r.rnr_retry_count = rep.rnr_retry_count;
            id.remote = Some(r);
            let p = id.ptr.0;
            // SAFETY: a live id.
            let has_qp = !unsafe { (*p).qp }.is_null();
            let fill = |b: &mut crate::state::EventBox| {
                conn_param(b, &rep.private_data, |c| {
                    c.responder_resources = rep.responder_resources;
                    c.initiator_depth = rep.initiator_depth;
                    c.flow_control = rep.flow_control as u8;
                    c.rnr_retry_count = rep.rnr_retry_count;
                    c.srq = rep.srq as u8;
                    c.qp_num = rep.remote_qpn;
                })
            };
            if !has_qp {
                if let Some(id) = st.ids.get_mut(&key) {
                    id.phase = Phase::RepReceived;
                }
                st.queue_event(key, key, event::CONNECT_RESPONSE, 0, fill);
                return;
            }
            let moved = crate::qp::modify(st, p, IBV_QPS_RTR)
                .and_then(|()| crate::qp::modify(st, p, IBV_QPS_RTS));
            match moved {
                Ok(()) => {
                    if let Some(c) = st.devices[dev].cm.as_mut() {
                        let _ = c.cm.ready_to_use(now, conn, &[]);
                    }
                    if let Some(id) = st.ids.get_mut(&key) {
                        id.phase = Phase::Connected;
                    }
                    st.queue_event(key, key, event::ESTABLISHED, 0, fill);
                }
                Err(e) => {
                    if let Some(c) = st.devices[dev].cm.as_mut() {
                        let _ = c.cm.reject(now, conn, 28, &[]);
                    }
                    end(st, dev, conn, event::CONNECT_ERROR, -e, &[]);
                }
            }
        }
        CmEvent::RtuReceived { conn, private_data } => {
            let Some(key) = id_of(st, dev, conn) else {
                return;
            };
            let Some(id) = st.ids.get_mut(&key) else {
                return;
            };
            if id.phase != Phase::Accepted {
                return;
            }
            id.phase = Phase::Connected;
            st.queue_event(key, key, event::ESTABLISHED, 0, |b| {
                conn_param(b, &private_data, |_| {})
            });
        }
        CmEvent::Rejected {
            conn,
            reason,
            private_data,
            ..
        } => {
            end(
                st,
                dev,
                conn,
                event::REJECTED,
                i32::from(reason),
                &private_data,
            );
            unmap(st, dev, conn);
        }
        CmEvent::Timeout { conn } => {
            let kind = match id_of(st, dev, conn)
                .and_then(|k| st.ids.get(&k))
                .map(|i| i.phase)
            {
                Some(Phase::Connecting) => event::UNREACHABLE,
                _ => event::CONNECT_ERROR,
            };
            end(st, dev, conn, kind, -libc::ETIMEDOUT, &[]);
            unmap(st, dev, conn);
        }
        CmEvent::MraReceived { .. } | CmEvent::TimewaitExit { .. } => {}
        CmEvent::DreqReceived { conn, private_data } => {
            end(st, dev, conn, event::DISCONNECTED, 0, &private_data);
        }
        CmEvent::DrepReceived { conn, private_data } => {
            end(st, dev, conn, event::DISCONNECTED, 0, &private_data);
        }
        CmEvent::DreqTimeout { conn } => {
            end(st, dev, conn, event::DISCONNECTED, 0, &[]);
        }
        CmEvent::SidrReqReceived {
            conn,
            service_id,
            source,
            private_data,
            ..
        } => {
            let hdr = CmaHeader::parse(&private_data).ok();
            let lkey = listener_for(st, dev, service_id, hdr.map(|h| h.addresses.dst()));
            let reply_no = |st: &mut State, status: u8| {
                if let Some(c) = st.devices[dev].cm.as_mut() {
                    let _ = c.cm.sidr_reply(
                        now,
                        conn,
                        softverbs_cm::SidrReply {
                            status,
                            qpn: 0,
                            qkey: 0,
                            private_data: Vec::new(),
                        },
                    );
                }
            };
            let (Some(lkey), Some(_)) = (lkey, hdr) else {
                reply_no(st, 1);
                return;
            };
            let Ok(key) = new_passive(st, dev, lkey, conn, hdr, source.sgid) else {
                reply_no(st, 2);
                return;
            };
            let ah = ah_towards(st, key, dev, source.sgid);
            let user = private_data.get(CMA_HEADER_LEN..).unwrap_or(&[]).to_vec();
            st.queue_event(key, lkey, event::CONNECT_REQUEST, 0, |b| {
                ud_param(b, &user, ah, 0, 0)
            });
        }
        CmEvent::SidrRepReceived {
            conn,
            status,
            qpn,
            qkey,
            private_data,
        } => {
            let Some(key) = id_of(st, dev, conn) else {
                return;
            };
            let Some(id) = st.ids.get_mut(&key) else {
                return;
            };
            if id.phase != Phase::Connecting {
                return;
            }
            unmap(st, dev, conn);
            if status != 0 {
                if let Some(id) = st.ids.get_mut(&key) {
                    id.phase = Phase::Disconnected;
                }
                st.queue_event(key, key, event::UNREACHABLE, i32::from(status), |b| {
                    ud_param(b, &private_data, ibv_ah_attr::default(), 0, 0)
                });
                return;
            }
            let p = st.ids[&key].ptr.0;
            // SAFETY: a live id.
            let dgid = unsafe { (*p).route.addr.ibaddr.dgid.bytes() };
            let ah = ah_towards(st, key, dev, dgid);
            if let Some(id) = st.ids.get_mut(&key) {
                id.phase = Phase::Connected;
                id.conn = None;
            }
            st.queue_event(key, key, event::ESTABLISHED, 0, |b| {
                ud_param(b, &private_data, ah, qpn, qkey)
            });
        }
        CmEvent::SidrTimeout { conn } => {
            let Some(key) = id_of(st, dev, conn) else {
                return;
            };
            unmap(st, dev, conn);
            if let Some(id) = st.ids.get_mut(&key) {
                id.phase = Phase::Disconnected;
                id.conn = None;
            }
            st.queue_event(key, key, event::UNREACHABLE, -libc::ETIMEDOUT, |_| {});
        }
    }
}

/// The service ID of an id's port.
pub fn service_id_of(ps: u32, port: u16) -> u64 {
    softverbs_cm::cma::service_id(ps as u16, port)
}

/// Registers listening id `key` with the managers of its device (or of every device when
/// it is bound to the wildcard address).
pub fn listen(st: &mut State, key: usize) -> Result<(), Errno> {
    let id = st.ids.get(&key).ok_or(libc::EINVAL)?;
    let bound = id.bound.ok_or(libc::EINVAL)?;
    // SAFETY: a live id.
    let ps = unsafe { (*id.ptr.0).ps };
    let devs: Vec<usize> = match id.dev {
        Some(d) => vec![d],
        None => (0..st.devices.len()).collect(),
    };
    let sid = service_id_of(ps, bound.port());
    for d in devs {
        ensure_cm(st, d)?;
        let ctx = st.devices[d].ctx.0;
        let Some(c) = st.devices[d].cm.as_mut() else {
            continue;
        };
        let l = c.listeners.entry(sid).or_default();
        if l.is_empty() {
            c.cm.listen(sid).map_err(errno_of)?;
            // Processes sharing the device's address share its QP1: the device hands
            // this one the REQs for `sid` (or refuses: another listens there).
            let g = gsi()?;
            // SAFETY: an open context of the loaded libibverbs.
            let refused = unsafe { (g.listen)(ctx, sid) };
            if refused != 0 {
                c.cm.unlisten(sid);
                c.listeners.remove(&sid);
                return Err(refused);
            }
        }
        l.push(key);
    }
    Ok(())
}

/// Forgets id `key`'s connection and listens (its destruction).
pub fn release(st: &mut State, key: usize) {
    let Some(id) = st.ids.get_mut(&key) else {
        return;
    };
    let conn = id.conn.take();
    let dev = id.dev;
    let listening = id.phase == Phase::Listening;
    let bound = id.bound;
    let p = id.ptr.0;
    if let (Some(conn), Some(dev)) = (conn, dev) {
        if let Some(c) = st.devices[dev].cm.as_mut() {
            c.cm.release(conn);
            c.conns.remove(&conn);
        }
        pump(st, dev);
        wake();
    }
    if listening {
        // SAFETY: a live id.
        let ps = unsafe { (*p).ps };
        let sid = service_id_of(ps, bound.map_or(0, |b| b.port()));
        for d in st.devices.iter_mut() {
            if let Some(c) = d.cm.as_mut() {
                if let Some(l) = c.listeners.get_mut(&sid) {
                    l.retain(|k| *k != key);
                    if l.is_empty() {
                        c.listeners.remove(&sid);
                        c.cm.unlisten(sid);
                        if let Ok(g) = gsi() {
                            // SAFETY: an open context of the loaded libibverbs.
                            unsafe { (g.unlisten)(d.ctx.0, sid) };
                        }
                    }
                }
            }
        }
    }
}
