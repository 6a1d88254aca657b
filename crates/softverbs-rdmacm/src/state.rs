//! The process-wide state of the connection manager, behind one lock: the devices it
//! opened, the event channels, the ids, the events handed out and not yet acknowledged,
//! and the bound ports. Every export takes the lock for its bookkeeping and never holds it
//! while it blocks (reading a channel, waiting for acknowledgements uses the condvar).
//!
//! The C objects (`rdma_cm_id`, `rdma_event_channel`, `rdma_cm_event`) are boxes whose
//! addresses are the keys of the tables here: a pointer the program passes in is looked up
//! before it is dereferenced, so a stale or foreign pointer is `EINVAL`, never a crash.

use crate::abi::*;
use crate::boundary::Errno;
use crate::verbs::verbs;
use libc::c_void;
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Condvar, Mutex, MutexGuard};

/// A raw pointer the state owns or records (the lock serialises every use).
#[derive(Debug)]
pub struct Ptr<T>(pub *mut T);
impl<T> Clone for Ptr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Ptr<T> {}
// SAFETY: the pointers are only dereferenced under the state lock (or by the owning
// program, as in C librdmacm); the marker lets the state live in a static.
unsafe impl<T> Send for Ptr<T> {}

/// One device the connection manager opened (the program sees its context as
/// `id->verbs` and in `rdma_get_devices`).
pub struct Device {
    /// The `struct ibv_context *`.
    pub ctx: Ptr<c_void>,
    /// The node GUID.
    pub guid: u64,
    /// The GID table of port 1: (index, GID), non-zero entries.
    pub gids: Vec<(u8, [u8; 16])>,
    /// The port's active MTU (`enum ibv_mtu`).
    pub active_mtu: u32,
    /// The default protection domain (`rdma_create_qp` with a NULL `pd`), made on demand.
    pub pd: Option<Ptr<c_void>>,
    /// The connection manager of this device's port, once connections are used.
    pub cm: Option<crate::cm::DeviceCm>,
}

impl Device {
    /// The GID index of `ip` in this device's table.
    pub fn gid_index(&self, ip: IpAddr) -> Option<u8> {
        let gid = crate::addr::gid_of(ip);
        self.gids.iter().find(|(_, g)| *g == gid).map(|(i, _)| *i)
    }

    /// The IP address of GID index 1 (rxe's layout: the address), or the first
    /// non-link-local GID.
    pub fn ip(&self) -> Option<IpAddr> {
        let pick = self
            .gids
            .iter()
            .find(|(i, _)| *i == 1)
            .or_else(|| self.gids.iter().find(|(_, g)| g[0] != 0xfe))?;
        Some(crate::addr::ip_of_gid(pick.1))
    }
}

/// Where an id is in its life (librdmacm's states, as far as the checks need them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Created.
    Idle,
    /// `rdma_bind_addr` done.
    Bound,
    /// `RDMA_CM_EVENT_ADDR_RESOLVED` queued.
    AddrResolved,
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED` queued.
    RouteResolved,
    /// `rdma_listen` done.
    Listening,
    /// Active side: REQ (or SIDR_REQ) sent.
    Connecting,
    /// Passive side: a connection request is waiting for accept or reject.
    Requested,
    /// Passive side: REP sent, waiting for RTU.
    Accepted,
    /// Active side, no QP on the id: REP received, waiting for `rdma_establish`.
    RepReceived,
    /// Connected.
    Connected,
    /// Disconnected (by either side), or rejected, or failed.
    Disconnected,
}

/// The parameters of a connection the QP transitions need.
#[derive(Clone, Copy, Debug, Default)]
pub struct Remote {
    /// The peer's QPN.
    pub qpn: u32,
    /// The peer's starting PSN (our receive PSN).
    pub psn: u32,
    /// The peer's GID.
    pub gid: [u8; 16],
    /// Path MTU (`enum ibv_mtu`).
    pub mtu: u32,
    /// RDMA READ / atomic operations the peer may have outstanding at us.
    pub responder_resources: u8,
    /// RDMA READ / atomic operations we may have outstanding at the peer.
    pub initiator_depth: u8,
    /// Transport retries.
    pub retry_count: u8,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// The UD peer's Q_Key (SIDR).
    pub qkey: u32,
}

/// CQs and completion channels `rdma_create_qp` made for an id (destroyed with its QP).
#[derive(Clone, Copy)]
pub struct OwnedCqs {
    /// The send CQ.
    pub send_cq: Ptr<c_void>,
    /// The receive CQ.
    pub recv_cq: Ptr<c_void>,
    /// The send CQ's completion channel.
    pub send_channel: Ptr<c_void>,
    /// The receive CQ's completion channel.
    pub recv_channel: Ptr<c_void>,
}

/// One `rdma_cm_id`.
pub struct Id {
    /// The C object.
    pub ptr: Ptr<rdma_cm_id>,
    /// Created without a channel: its calls wait for their own events.
    pub sync: bool,
    /// The channel its events go to (key in `State::channels`).
    pub channel: usize,
    /// Where the id is.
    pub phase: Phase,
    /// Index in `State::devices` once bound to or resolved on a device.
    pub dev: Option<usize>,
    /// The bound local address (its port is in `State::ports`).
    pub bound: Option<SocketAddr>,
    /// Events counted on this id that were handed out and are not yet acknowledged.
    pub unacked: u32,
    /// `rdma_destroy_id` started.
    pub destroying: bool,
    /// Listening: the backlog.
    pub backlog: i32,
    /// A passive id's listening id.
    pub listener: Option<usize>,
    /// The connection of softverbs-cm (on `dev`'s manager).
    pub conn: Option<crate::cm::ConnRef>,
    /// Our starting PSN.
    pub local_psn: u32,
    /// The peer's parameters, once known.
    pub remote: Option<Remote>,
    /// `rdma_create_ep` on a passive endpoint: the QP every request gets.
    pub ep_qp: Option<EpQp>,
    /// CQs `rdma_create_qp` made.
    pub owned_cqs: Option<OwnedCqs>,
    /// `RDMA_OPTION_ID_TOS`.
    pub tos: u8,
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`.
    pub ack_timeout: Option<u8>,
    /// `RDMA_OPTION_ID_REUSEADDR`.
    pub reuse: bool,
    /// `RDMA_OPTION_ID_AFONLY`.
    pub afonly: bool,
    /// The multicast groups joined (`rdma_join_multicast`), in order.
    pub groups: Vec<crate::multicast::Joined>,
}

/// The QP a passive endpoint of `rdma_create_ep` gives every request.
#[derive(Clone, Copy)]
pub struct EpQp {
    /// The PD (NULL: the device's default).
    pub pd: Ptr<c_void>,
    /// The program's attributes, copied.
    pub attr: ibv_qp_init_attr,
}
// SAFETY: the pointers in the attributes are the program's CQs/SRQ, only passed back to
// libibverbs under the state lock.
unsafe impl Send for EpQp {}

/// One `rdma_event_channel`.
pub struct Channel {
    /// The C object.
    pub ptr: Ptr<rdma_event_channel>,
    /// Events queued and not yet retrieved; the channel's eventfd (a semaphore) counts them.
    pub queue: VecDeque<Ptr<EventBox>>,
}

/// An event with the storage its private data points into.
#[repr(C)]
pub struct EventBox {
    /// The C event (first: the box's address is the event's).
    pub ev: rdma_cm_event,
    /// The id the event is counted on (its listening id for a connection request).
    pub counted_on: usize,
    /// The private data `param.conn.private_data` / `param.ud.private_data` points at.
    pub data: [u8; 256],
}

/// A bound port: who holds it.
#[derive(Clone, Copy)]
pub struct PortUse {
    /// The bound IP (unspecified: every address).
    pub ip: IpAddr,
    /// The id holding it.
    pub id: usize,
}

/// Everything.
#[derive(Default)]
pub struct State {
    /// `devices` was filled.
    pub devices_opened: bool,
    /// The devices, in libibverbs' order.
    pub devices: Vec<Device>,
    /// The ids, by address.
    pub ids: HashMap<usize, Id>,
    /// The channels, by address.
    pub channels: HashMap<usize, Channel>,
    /// Handed out, not yet acknowledged: event → the id it is counted on.
    pub events: HashMap<usize, usize>,
    /// Bound ports by (port space, port).
    pub ports: HashMap<(u32, u16), Vec<PortUse>>,
    /// Port-space-wide counter for ephemeral ports.
    pub next_port: u16,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);
/// Signalled when an event is acknowledged (`rdma_destroy_id` waits on it).
pub static ACKED: Condvar = Condvar::new();

/// The locked state.
pub struct Guard(MutexGuard<'static, Option<State>>);

impl std::ops::Deref for Guard {
    type Target = State;
    fn deref(&self) -> &State {
        self.0.as_ref().expect("initialised by lock()")
    }
}
impl std::ops::DerefMut for Guard {
    fn deref_mut(&mut self) -> &mut State {
        self.0.as_mut().expect("initialised by lock()")
    }
}

impl Guard {
    /// Waits on [`ACKED`], giving the lock up meanwhile.
    pub fn wait_acked(self, timeout: std::time::Duration) -> Guard {
        let (g, _) = ACKED
            .wait_timeout(self.0, timeout)
            .unwrap_or_else(|p| p.into_inner());
        Guard(g)
    }
}

/// Takes the state lock (a panic while it was held does not poison it for others).
pub fn lock() -> Guard {
    let mut g = STATE.lock().unwrap_or_else(|p| p.into_inner());
    if g.is_none() {
        *g = Some(State::default());
    }
    Guard(g)
}

/// 32 random bits (`getrandom`).
pub fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: writes at most 4 bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr() as *mut c_void, 4, 0) };
    if n != 4 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        return t ^ std::process::id();
    }
    u32::from_ne_bytes(b)
}

impl State {
    /// Opens every device of the loaded libibverbs once (librdmacm keeps them open for the
    /// life of the process).
    pub fn open_devices(&mut self) -> Result<(), Errno> {
        if self.devices_opened {
            return Ok(());
        }
        let v = verbs()?;
        let mut n = 0;
        // SAFETY: ibv_get_device_list with a valid out pointer.
        let list = unsafe { (v.get_device_list)(&mut n) };
        if list.is_null() {
            return Err(crate::boundary::errno().max(libc::ENODEV));
        }
        for i in 0..n.max(0) as usize {
            // SAFETY: the list holds `n` device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: a device of the list.
            let ctx = unsafe { (v.open_device)(dev) };
            if ctx.is_null() {
                continue;
            }
            // SAFETY: as above.
            let guid = unsafe { (v.get_device_guid)(dev) };
            let mut port = ibv_port_attr::default();
            // SAFETY: an open context and a full-size attribute struct.
            if unsafe { (v.query_port)(ctx, 1, &mut port) } != 0 {
                continue;
            }
            let mut gids = Vec::new();
            for index in 0..port.gid_tbl_len.clamp(0, 256) {
                let mut gid = ibv_gid::default();
                // SAFETY: an open context, a valid out pointer.
                if unsafe { (v.query_gid)(ctx, 1, index, &mut gid) } == 0 && gid.bytes() != [0; 16]
                {
                    gids.push((index as u8, gid.bytes()));
                }
            }
            self.devices.push(Device {
                ctx: Ptr(ctx),
                guid,
                gids,
                active_mtu: port.active_mtu,
                pd: None,
                cm: None,
            });
        }
        // SAFETY: the list ibv_get_device_list returned; opened contexts stay valid.
        unsafe { (v.free_device_list)(list) };
        self.devices_opened = true;
        if self.devices.is_empty() {
            return Err(libc::ENODEV);
        }
        // As the kernel's CM, each device answers requests from the start (a REQ for a
        // port nobody listens on gets REJ 8); without softverbs' GSI exports this waits
        // until a connection needs it and fails there.
        for dev in 0..self.devices.len() {
            let _ = crate::cm::ensure_cm(self, dev);
        }
        Ok(())
    }

    /// The device whose context is `ctx`.
    pub fn device_of_ctx(&self, ctx: *mut c_void) -> Option<usize> {
        self.devices.iter().position(|d| d.ctx.0 == ctx)
    }

    /// The device holding `ip` in its GID table.
    pub fn device_of_ip(&self, ip: IpAddr) -> Option<usize> {
        self.devices.iter().position(|d| d.gid_index(ip).is_some())
    }

    /// The id behind a program's pointer, or `EINVAL`.
    pub fn id(&mut self, p: *mut rdma_cm_id) -> Result<&mut Id, Errno> {
        match self.ids.get_mut(&(p as usize)) {
            Some(id) if !id.destroying => Ok(id),
            _ => Err(libc::EINVAL),
        }
    }

    /// Queues an event for id `key` on its channel; `fill` sets the event's fields (the
    /// private data storage is `data`).
    pub fn queue_event(
        &mut self,
        key: usize,
        counted_on: usize,
        kind: u32,
        status: i32,
        fill: impl FnOnce(&mut EventBox),
    ) {
        let Some(id) = self.ids.get(&key) else {
            return;
        };
        let listen_id = id.listener.filter(|_| kind == event::CONNECT_REQUEST);
        // A connection request goes to its listener's channel (the new id of a
        // synchronous listener has a channel of its own for its later events).
        let Some(ch_key) = self.ids.get(&counted_on).map(|i| i.channel) else {
            return;
        };
        let Some(ch) = self.channels.get_mut(&ch_key) else {
            return;
        };
        // SAFETY: rdma_cm_event is plain data; all-zero is valid (NULL pointers, zeros).
        let mut b: Box<EventBox> = Box::new(unsafe { std::mem::zeroed() });
        b.ev.id = key as *mut rdma_cm_id;
        b.ev.listen_id = listen_id.map_or(std::ptr::null_mut(), |l| l as *mut rdma_cm_id);
        b.ev.event = kind;
        b.ev.status = status;
        b.counted_on = counted_on;
        fill(&mut b);
        ch.queue.push_back(Ptr(Box::into_raw(b)));
        let one: u64 = 1;
        // SAFETY: the channel's eventfd (open while the channel exists); 8 bytes.
        unsafe { libc::write((*ch.ptr.0).fd, &one as *const u64 as *const c_void, 8) };
    }

    /// Drops the queued (not yet retrieved) events of id `key` from its channel.
    pub fn drop_queued_events(&mut self, key: usize) {
        for ch in self.channels.values_mut() {
            ch.queue.retain(|e| {
                // SAFETY: queued boxes are live until retrieved or dropped here.
                let (id, counted) = unsafe { ((*e.0).ev.id as usize, (*e.0).counted_on) };
                if id == key || counted == key {
                    // SAFETY: the box came from Box::into_raw and is in no other table.
                    drop(unsafe { Box::from_raw(e.0) });
                    false
                } else {
                    true
                }
            });
        }
    }

    /// Binds `addr` (port 0: an ephemeral port) for id `key` in port space `ps`.
    pub fn bind_port(
        &mut self,
        key: usize,
        ps: u32,
        addr: SocketAddr,
    ) -> Result<SocketAddr, Errno> {
        let ip = addr.ip();
        let conflict = |uses: &Vec<PortUse>| {
            uses.iter().any(|u| {
                u.id != key
                    && (u.ip.is_unspecified()
                        || ip.is_unspecified()
                        || crate::addr::same_ip(u.ip, ip))
            })
        };
        let port = if addr.port() != 0 {
            if self.ports.get(&(ps, addr.port())).is_some_and(conflict) {
                return Err(libc::EADDRINUSE);
            }
            addr.port()
        } else {
            if self.next_port == 0 {
                self.next_port = 32768 + (random_u32() % 28000) as u16;
            }
            let mut found = None;
            for _ in 0..28232u32 {
                let p = self.next_port;
                self.next_port = if p >= 60999 { 32768 } else { p + 1 };
                if !self.ports.get(&(ps, p)).is_some_and(conflict) {
                    found = Some(p);
                    break;
                }
            }
            found.ok_or(libc::EADDRINUSE)?
        };
        self.ports
            .entry((ps, port))
            .or_default()
            .push(PortUse { ip, id: key });
        let mut bound = addr;
        bound.set_port(port);
        Ok(bound)
    }

    /// Gives up id `key`'s port.
    pub fn unbind_port(&mut self, key: usize, ps: u32, port: u16) {
        if let Some(uses) = self.ports.get_mut(&(ps, port)) {
            uses.retain(|u| u.id != key);
            if uses.is_empty() {
                self.ports.remove(&(ps, port));
            }
        }
    }
}
