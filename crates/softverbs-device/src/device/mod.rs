//! The soft RDMA device: one [`softverbs_proto::Engine`] (every QP and SRQ of the
//! device), its registered memory, its transport, the CQs its QPs complete into, and the
//! progress that keeps the protocol moving.
//!
//! Progress has two drivers, and either is enough:
//! - the application: every verb (post, modify, …) runs the engine, sends what it produced
//!   and pushes the completions; [`Device::progress`] (called by a poll that found its CQ
//!   empty) receives and handles whatever has arrived, without blocking;
//! - a progress thread per device, which sleeps in the transport's receive (or on a
//!   condition variable for in-process devices) until a packet arrives or the next
//!   retransmit / RNR deadline, so ACKs, retransmissions and completions keep coming while
//!   the application sleeps or computes.
//!
//! Devices in the same process reach each other directly: a packet for the address of a
//! device of this process is handed to that device's engine on the sending thread (through
//! a per-thread queue, so no lock is held while another device runs), with no system call.
//! Other addresses go over the transport (UDP carrying RoCEv2). A device with a capture or
//! fault injection sends every packet through that middleware instead, over a link
//! (`link.rs`) that hands packets for devices of this process over with their headers
//! and ICRC, so both knobs act on every path, in-process devices included; the receiving
//! device checks the ICRC of such a packet and records what it receives in its capture.
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | [`Device`] and its verbs (open, PD, MR, QP, SRQ, counters, capture), QP1's management datagrams (`gsi_send`, `gsi_recv`, `gsi_fd`), the state behind it |
//! | `config.rs` | [`DeviceConfig`], [`Network`], [`FaultSetup`]; the `SOFTVERBS_*` environment ([`PCAP_ENV`], [`FAULTS_ENV`], [`parse_faults`]) |
//! | `attr.rs` | [`DeviceAttr`], [`PortAttr`], [`VENDOR_ID`]: what `query_device` / `query_port` report; the GID table (link-local GID, then the address, as rxe lays it out) |
//! | `error.rs` | [`DeviceError`] and the errno the C side reports for it |
//! | `netdev.rs` | the interface holding the address: its index (every GID's `ndev_ifindex`) and MTU |
//! | `mtu.rs` | the port MTU: the largest IB MTU whose packets fit the interface holding the address |
//! | `link.rs` | the bottom of the stack of a device with a capture or faults: hands packets over to devices of this process, or to the socket |
//! | `registry.rs` | the devices of this process by address, and in-process addresses |
//! | `runtime.rs` | progress: the progress thread, runs of the engine, sending, receiving, timers |
//! | `completions.rs` | where a QP's completions go, and back-pressure on a full CQ |
//! | `grh.rs` | the GRH area a UD receive gets, rebuilt from the IP addresses |
//! | `stats.rs` | [`DeviceStats`]: every counter of the device in one structure, and the `SOFTVERBS_STATS` line ([`STATS_ENV`]) |
//!
//! Logging (`tracing`): each device has a span (`device{name, address}`, INFO) entered
//! around every run of its engine, so the engine's events (QP state changes,
//! retransmissions, drops) say which device of the process they come from; when no
//! subscriber listens, the span is empty and entering it is a test of an `Option`.

mod attr;
mod completions;
mod config;
mod error;
mod grh;
mod link;
mod mtu;
pub(crate) mod netdev;
mod objects;
mod registry;
mod runtime;
mod stats;

pub use attr::{DeviceAttr, OdpCaps, PortAttr, VENDOR_ID};
pub use config::{
    network_from_env, parse_faults, DeviceConfig, FaultSetup, Network, NetworkKind, FAULTS_ENV,
    NETWORK_ENV, PCAP_ENV,
};
pub use error::DeviceError;
pub use objects::AddressHandle;
pub use stats::{CaptureCounts, CqSummary, DeviceStats, STATS_ENV};

use attr::gid_table;
use completions::{Route, Routes};
use link::Link;
use registry::{next_in_process_address, note_registered, registry};
use runtime::progress_loop;

use crate::events::{AsyncEvent, AsyncEventQueue};
use crate::fault::FaultTransport;
use crate::memory::{Advice, MemoryTable, Region, RegisterError, Rereg, Window};
use crate::pcap::{Capture, PcapTransport};
use crate::shm::HostTransport;
use crate::transport::{Endpoint, Gid, Transport};
use softverbs_cq::{CompletionChannel, CqProducer, DeviceClock, MAX_CQE};
use softverbs_proto::{
    AccessFlags, AddressVector, AttrMask, Completion, Engine, GsiMad, Mtu, Object, QpAttr, QpInit,
    QpState, RecvWr, SendWr, Sge, SrqId, SrqInit, VerbsError, WindowType,
};
use stats::CqSummary as RetiredCqs;
use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// Empty polls of a UDP device's application thread between two `sched_yield`s.
const EMPTY_POLLS_BEFORE_YIELD: u32 = 64;

/// Memory windows per device (`max_mw`): rxe's `RXE_MAX_MW`.
const MAX_MW: u32 = 1 << 20;

/// The engine and everything a run of it touches, behind the device's state lock.
struct State {
    engine: Engine,
    memory: MemoryTable,
    routes: Routes,
    /// Completions a back-pressure CQ refused, retried in order on every run.
    held: VecDeque<Completion>,
    objects: objects::Objects,
    /// Every CQ a QP of the device completes into, by id, until the CQ is destroyed
    /// ([`Device::cq_destroyed`]): for the statistics' high-water marks and overruns.
    cqs: HashMap<u64, CqProducer>,
    /// The figures of the CQs destroyed so far.
    retired_cqs: RetiredCqs,
    /// How many received management datagrams waited after the last run or
    /// [`Device::gsi_recv`]: a run that leaves more signals [`DeviceInner::gsi_fd`].
    gsi_seen: usize,
    /// The destination GID of the last packet sent and the endpoint it resolved to
    /// (most packets of a run, and of the next, go where the last went).
    last_sent_to: Option<([u8; 16], Endpoint)>,
}

/// What an open device shares with its progress thread and with the devices of this
/// process that send to it (through the registry).
pub(crate) struct DeviceInner {
    name: String,
    address: IpAddr,
    /// The QP numbers this device hands out: all of them, or its share of an address that
    /// devices of other processes share too (a packet to this address for a QPN outside
    /// it is another process's).
    qpns: softverbs_proto::QpnRange,
    /// The port's GID table ([`attr::gid_table`]).
    gids: Vec<Gid>,
    /// The index of the interface holding the address (0: none).
    ifindex: u32,
    state: Mutex<State>,
    /// The UDP path (`None` in-process): the socket, under the capture and the faults if
    /// either is configured (then it is [`DeviceInner::stack`]).
    transport: Option<Box<dyn Transport>>,
    /// The capture and fault middleware every packet the device sends goes through, with
    /// either configured; `None` otherwise: packets for devices of this process are then
    /// handed over directly. (Boxed: the fields the packet path reads stay together.)
    tap: Option<Box<Tap>>,
    /// Packets handed over by a device of this process whose ICRC did not verify (a
    /// corruption its fault layer injected); part of `dropped_bad_icrc`. A statistic:
    /// `Relaxed` both ways, nothing is published through it.
    handed_bad_icrc: AtomicU64,
    /// The pcap capture of the transport, if any (flushed on request).
    capture: Option<Arc<Capture>>,
    /// Held from the end of a run (taken under the state lock) until its packets are
    /// handed to the transport or queued for local delivery, so they leave in order; it
    /// keeps the ACKs a receive run held for the application's next post.
    tx: Mutex<runtime::HeldAcks>,
    /// Whether `tx` holds ACKs (read without the lock by a run deciding whether to take
    /// it; written under it).
    acks_held: AtomicBool,
    /// Runs of the progress thread that sent ACKs alone (`DeviceStats::progress_ack_sends`).
    progress_ack_sends: AtomicU64,
    /// Held from taking a packet off the transport until the engine has handled it, so
    /// packets are handled in the order they arrived whichever thread receives them.
    rx: Mutex<()>,
    /// The fault-injection layer of the transport, for its counters.
    fault_layer: Option<Arc<FaultTransport<Box<dyn Transport>>>>,
    events: AsyncEventQueue,
    /// Readable while management datagrams wait for [`Device::gsi_recv`]: an eventfd
    /// (non-blocking, not a semaphore) written, under the state lock, by the run that
    /// queued a MAD, and emptied, under it too, by the `gsi_recv` that took the last one.
    gsi_fd: OwnedFd,
    /// Wakes an in-process device's progress thread when its deadlines change.
    wake: Condvar,
    shutdown: AtomicBool,
    /// Whether packets for devices of this process skip the transport.
    shortcut: AtomicBool,
    /// Device-clock time until which an in-process progress thread sleeps (`u64::MAX`
    /// while it is awake); written and read under the state lock.
    sleeping_until: AtomicU64,
    /// The earliest engine or CQ-moderation deadline (device clock; `u64::MAX`: none),
    /// refreshed at the end of every run, so an idle poll learns that nothing is due
    /// without taking the state lock.
    next_deadline: AtomicU64,
    /// When the application last drove progress itself (device clock): while it polls, the
    /// progress thread leaves the socket to it, so a packet is handled by the spinning
    /// thread instead of waking a sleeping one (tens of microseconds on a virtual machine).
    last_app_progress: AtomicU64,
    /// The progress thread, if the device has one: unparked to cut its nap short
    /// ([`Device::app_waits`], a CQ armed, and when the device closes).
    progress_thread: OnceLock<std::thread::Thread>,
    /// Set while the progress thread naps for a polling application (SeqCst with
    /// `cq_armed`: an arm either sees it and unparks the thread, or is seen by the thread's
    /// look before it parks).
    napping: AtomicBool,
    /// The application's polls of the device (`Device::progress`) since a CQ was last armed,
    /// counted up to [`runtime::POLLS_AFTER_ARM`]: an application that goes on polling long
    /// after an arm receives the packets of the armed CQ itself
    /// ([`Awaited::Polled`](runtime::Awaited::Polled)).
    polls_since_arm: AtomicU32,
    /// Set when a CQ of the device is armed (`CqProducer::set_arm_hook`), cleared by the
    /// progress thread once it finds none armed: whether it must look whether a thread
    /// waits for an event ([`DeviceInner::events_awaited_elsewhere`]).
    armed_hint: AtomicBool,
    /// Threads waiting for an event through [`Device::serve_channel_waits`] (spinning or
    /// asleep on the device's readiness fd): they receive the packets themselves.
    served_waiters: AtomicU32,
    /// When such a wait last ended (device clock).
    last_served_end: AtomicU64,
    /// The engine's shortest local ACK timeout (`Engine::shortest_ack_timeout_ns`, ns;
    /// `u64::MAX`: none), refreshed by every `modify_qp`: how long the progress thread may
    /// leave the socket to a polling application before it looks again.
    shortest_ack_timeout: AtomicU64,
    /// Times the progress thread slept while the application polled
    /// (`DeviceStats::progress_naps`).
    progress_naps: AtomicU64,
    /// Packets the progress thread received (`DeviceStats::progress_received`).
    progress_received: AtomicU64,
    /// Packets received by any thread (the progress thread's look for packets nobody took,
    /// [`DeviceInner::take_stuck_packets`]). Written under the receive lock (`rx`) only.
    packets_taken: AtomicU64,
    /// What `packets_taken` was when the progress thread, napping for an application woken
    /// by the packets, last found a packet waiting; [`NO_LOOK`](runtime::NO_LOOK) if it
    /// found none.
    stuck_look: AtomicU64,
    /// Polls in a row that took packets in place and left the copying receive for later
    /// ([`runtime::IN_PLACE_STREAK`]). Written under the receive lock (`rx`) only.
    in_place_streak: AtomicU32,
    port_mtu: Mtu,
    /// The figures of the last statistics report, if one was made (the drop, and the
    /// drop-in at exit, report only if something happened since: see
    /// [`DeviceStats::same_activity`]).
    last_report: Mutex<Option<DeviceStats>>,
    /// `device{name, address}`, entered around each run of the engine (empty when no
    /// subscriber listened as the device opened).
    span: tracing::Span,
    /// The IP multicast groups some QP of the device is attached to (a group's address is
    /// its GID's, `ibv_attach_mcast(3)`). Changed under the state lock; read, alone, by
    /// devices of this process sending to a group.
    groups: Mutex<HashSet<IpAddr>>,
}

/// The stack of a device with a capture or faults (`link.rs`).
struct Tap {
    /// The bottom of the stack, which takes the in-process shortcut switch.
    link: Arc<Link>,
    /// What every packet the device sends goes through, to the socket or to a device of
    /// this process: the faults over the capture over the link.
    stack: Arc<dyn Transport>,
}

impl DeviceInner {
    /// Whether some QP of the device is attached to multicast group `group`.
    fn in_group(&self, group: IpAddr) -> bool {
        lock(&self.groups).contains(&group)
    }

    /// Stops receiving `group`, its last QP gone (the caller holds the state lock).
    fn leave_group(&self, group: IpAddr) {
        lock(&self.groups).remove(&group);
        if let Some(transport) = &self.transport {
            if let Err(error) = transport.leave_multicast(group) {
                tracing::debug!(%group, %error, "leaving a multicast group failed");
            }
        }
    }
}

impl DeviceInner {
    /// [`Device::progress`] (an application thread's progress step); `may_yield`: whether
    /// a call that received nothing may give the core away now and then (a polling
    /// application's, not a thread waiting for a completion event:
    /// [`Device::serve_channel_waits`]); only such a call counts as a poll since the last
    /// arm (`polls_since_arm`).
    fn app_progress(self: &Arc<Self>, may_yield: bool) {
        if self.transport.is_none() {
            // In-process packets arrive by direct hand-over: only timers can be due, and an
            // idle poll with none pending reads neither the clock nor a lock.
            let deadline = self.next_deadline.load(Ordering::Relaxed);
            if deadline != u64::MAX && deadline <= DeviceClock::now() {
                self.run_due_timers(DeviceClock::now());
            }
            if self.fault_layer.is_some() {
                self.release_held();
            }
            return;
        }
        let now = DeviceClock::now();
        self.last_app_progress.store(now, Ordering::Relaxed);
        if may_yield && self.polls_since_arm.load(Ordering::Relaxed) < runtime::POLLS_AFTER_ARM {
            // A polling application's (not a thread waiting for an event). Once the count is
            // reached, a poll writes nothing here.
            self.polls_since_arm.fetch_add(1, Ordering::Relaxed);
        }
        let received = self.progress_once(now, Some(Duration::ZERO), may_yield);
        if received > 0 {
            // Its runs may have been long (sending what the ACKs let out): the application
            // polled until now, not only since it began (the progress thread leaves the
            // packets to a polling application).
            self.last_app_progress
                .store(DeviceClock::now(), Ordering::Relaxed);
        } else if may_yield {
            // An application spinning on an empty CQ gives its core away now and then, so
            // the threads that make its completions (the progress threads of this and of
            // a peer process on the same cores) are not starved by its polling.
            thread_local! {
                static EMPTY_POLLS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
            }
            let empty = EMPTY_POLLS.with(|n| {
                n.set(n.get().wrapping_add(1));
                n.get()
            });
            if empty.is_multiple_of(EMPTY_POLLS_BEFORE_YIELD) {
                std::thread::yield_now();
            }
        }
    }
}

impl DeviceInner {
    /// Whether `ib_packet`, sent to this device's address, is this device's: its
    /// destination QPN (BTH bytes 5..8) is one this device hands out, or the multicast
    /// QPN. A packet too short for a BTH is (the engine drops it).
    pub(super) fn owns_packet(&self, ib_packet: &[u8]) -> bool {
        let Some(qpn) = ib_packet.get(5..8) else {
            return true;
        };
        let qpn = u32::from_be_bytes([0, qpn[0], qpn[1], qpn[2]]);
        qpn == 0xFF_FFFF || (self.qpns.start..self.qpns.end).contains(&qpn)
    }

    /// Whether this device hands its packets for other devices of this process over in
    /// memory as they are: no capture or faults (whose packets are the wire's), the
    /// in-process shortcut on.
    fn hands_over_directly(&self) -> bool {
        self.tap.is_none() && (self.transport.is_none() || self.shortcut.load(Ordering::Relaxed))
    }

    /// The segment size a connected QP entering RTR with `attr` (its path) uses:
    /// [`IN_PROCESS_SEGMENT`] when the peer QP is a device's of this process (this one
    /// included) and neither device captures, injects faults or has the shortcut off;
    /// [`DIRECT_SEGMENT`] when it is a device's of another process of this host reached
    /// through shared memory both ways, neither capturing nor injecting faults; else the
    /// path MTU (`None`): whenever a packet of either end may meet a wire or a socket's
    /// size limit. Both ends decide alike.
    fn segment_for(&self, attr: &QpAttr) -> Option<std::num::NonZeroU32> {
        let dest = Gid(attr.ah_attr.dgid).resolve(self.address);
        let peer = lock(registry())
            .get(&dest)
            .and_then(std::sync::Weak::upgrade)
            .filter(|peer| (peer.qpns.start..peer.qpns.end).contains(&attr.dest_qp_num));
        if let Some(peer) = peer {
            let direct = self.hands_over_directly() && peer.hands_over_directly();
            return direct.then_some(IN_PROCESS_SEGMENT);
        }
        // A device of another process of this host, through shared memory both ways.
        let transport = self.transport.as_ref()?;
        let to = Endpoint::new(dest, self.port());
        (self.tap.is_none() && transport.direct_segments_to(&to, attr.dest_qp_num))
            .then_some(DIRECT_SEGMENT)
    }
}

/// The payload of a packet between two QPs of devices of this host that reach each other
/// through shared memory (a ring record each): 32 KiB instead of the path MTU, an eighth
/// of the packets — and of their headers, checks and hand-overs — of a large message at a
/// 4096 MTU (`Engine::set_segment_size`). Not more: a packet's length must still fit the
/// 16-bit length fields of the IP and UDP headers its receiver derives for it, and larger
/// records measured slower (60 KiB: 1 MiB RDMA WRITEs 20-30 % slower between two pinned
/// processes, the ring's records fewer and coarser for the receiver to follow).
const DIRECT_SEGMENT: std::num::NonZeroU32 = match std::num::NonZeroU32::new(32 * 1024) {
    Some(size) => size,
    None => unreachable!(),
};

/// The payload of a packet between two QPs of devices of this process, handed over in
/// memory: 64 KiB, so that a 64 KiB message is one packet (the size RDMA programs and
/// benchmarks use most for bandwidth) and each packet's headers, checks, hand-over and
/// acknowledgement are paid once per 64 KiB (callgrind, 64 KiB RDMA WRITE stream between
/// two devices of one process: 14,700 instructions per message besides the copy with
/// 32 KiB packets, 11,900 with one packet). Such a packet is longer than an IP datagram
/// can be; nothing between the two devices needs its length in a 16-bit field (its GRH,
/// `grh.rs`, says the longest an IPv4 header can).
const IN_PROCESS_SEGMENT: std::num::NonZeroU32 = match std::num::NonZeroU32::new(64 * 1024) {
    Some(size) => size,
    None => unreachable!(),
};

/// Locks `m`, going on past poisoning (a thread that panicked while holding it).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An open soft RDMA device.
///
/// ```
/// use softverbs_device::{Device, DeviceConfig};
/// let device = Device::open(DeviceConfig::in_process())?;
/// assert!(device.query_port(1).unwrap().active);
/// # Ok::<(), softverbs_device::DeviceError>(())
/// ```
pub struct Device {
    inner: Arc<DeviceInner>,
    progress: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.inner.name)
            .field("address", &self.inner.address)
            .finish()
    }
}

impl Device {
    /// Opens a device.
    pub fn open(config: DeviceConfig) -> Result<Device, DeviceError> {
        let (udp, address) = match &config.network {
            Network::InProcess => (None, next_in_process_address()),
            Network::Udp(udp) => {
                let mut udp = HostTransport::open(udp.clone(), config.shared_memory)?;
                if config.capture.is_some() {
                    udp = udp.with_icrc_completed();
                }
                let addr = udp.local().addr();
                (Some(udp), addr)
            }
        };
        // Devices of several processes sharing the address split its QPNs.
        let qpn_range = udp.as_ref().and_then(HostTransport::qpn_range);
        let port = udp
            .as_ref()
            .map_or(crate::transport::DEFAULT_PORT, |u| u.local().port());
        let (mut transport, mut tap, mut fault_layer) = (None, None, None);
        if config.capture.is_none() && config.faults.is_none() {
            // Its packets need not be the wire's: peers reaching it without a wire may
            // send it packets of direct segments (`Device::modify_qp`).
            if let Some(udp) = &udp {
                udp.offer_direct_segments();
            }
            transport = udp.map(|u| Box::new(u) as Box<dyn Transport>);
        } else {
            // The stack: faults decide what is sent, the capture records what really went
            // to (and came from) the link: the socket, or a device of this process.
            let bottom = Arc::new(Link::new(Endpoint::new(address, port), udp));
            let captured: Box<dyn Transport> = match &config.capture {
                Some(capture) => Box::new(PcapTransport::new(bottom.clone(), capture.clone())),
                None => Box::new(bottom.clone()),
            };
            let top: Arc<dyn Transport> = match &config.faults {
                Some(f) => {
                    let layer = Arc::new(FaultTransport::new(captured, f.config.clone(), f.seed));
                    fault_layer = Some(layer.clone());
                    layer
                }
                None => Arc::from(captured),
            };
            if matches!(config.network, Network::Udp(_)) {
                transport = Some(Box::new(top.clone()) as Box<dyn Transport>);
            }
            tap = Some(Box::new(Tap {
                link: bottom,
                stack: top,
            }));
        }
        let netdev = netdev::holding(address);
        let mut engine_config = config.engine;
        if let Some(range) = qpn_range {
            engine_config.qpn_range = range;
        }
        engine_config.port_mtu = mtu::port_mtu(
            address,
            netdev.as_ref().and_then(|n| n.mtu),
            engine_config.port_mtu,
        );
        // The engine checks every source GID index against this table.
        let gids = gid_table(address);
        engine_config.gid_table_len = gids.len() as u32;
        let span = tracing::info_span!("device", name = %config.name, %address);
        tracing::info!(
            parent: &span,
            network = if transport.is_some() { "udp" } else { "in-process" },
            port_mtu = engine_config.port_mtu.bytes(),
            faults = config.faults.is_some(),
            capture = config.capture.is_some(),
            "device opened"
        );
        let inner = Arc::new(DeviceInner {
            name: config.name,
            address,
            qpns: engine_config.qpn_range,
            gids,
            ifindex: netdev.map_or(0, |n| n.index),
            state: Mutex::new(State {
                engine: Engine::new(engine_config),
                memory: MemoryTable::new(),
                routes: Routes::default(),
                held: VecDeque::new(),
                objects: objects::Objects::new(),
                cqs: HashMap::new(),
                retired_cqs: RetiredCqs::default(),
                gsi_seen: 0,
                last_sent_to: None,
            }),
            transport,
            tap,
            handed_bad_icrc: AtomicU64::new(0),
            tx: Mutex::new(runtime::HeldAcks::default()),
            acks_held: AtomicBool::new(false),
            progress_ack_sends: AtomicU64::new(0),
            rx: Mutex::new(()),
            fault_layer,
            events: AsyncEventQueue::new()?,
            gsi_fd: rustix::event::eventfd(
                0,
                rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
            )
            .map_err(io::Error::from)?,
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            shortcut: AtomicBool::new(true),
            sleeping_until: AtomicU64::new(0),
            next_deadline: AtomicU64::new(u64::MAX),
            last_app_progress: AtomicU64::new(0),
            progress_thread: OnceLock::new(),
            napping: AtomicBool::new(false),
            polls_since_arm: AtomicU32::new(0),
            armed_hint: AtomicBool::new(false),
            served_waiters: AtomicU32::new(0),
            last_served_end: AtomicU64::new(0),
            shortest_ack_timeout: AtomicU64::new(u64::MAX),
            progress_naps: AtomicU64::new(0),
            progress_received: AtomicU64::new(0),
            packets_taken: AtomicU64::new(0),
            stuck_look: AtomicU64::new(runtime::NO_LOOK),
            in_place_streak: AtomicU32::new(0),
            port_mtu: engine_config.port_mtu,
            capture: config.capture.clone(),
            last_report: Mutex::new(None),
            span,
            groups: Mutex::new(HashSet::new()),
        });
        {
            let mut reg = lock(registry());
            reg.insert(address, Arc::downgrade(&inner));
            note_registered(&reg);
        }
        inner
            .span
            .in_scope(|| inner.events.push(AsyncEvent::PortActive { port: 1 }));
        let progress = if config.progress_thread {
            let weak = Arc::downgrade(&inner);
            let handle = std::thread::Builder::new()
                .name(format!("softverbs-progress-{address}"))
                .spawn(move || progress_loop(weak))?;
            let _ = inner.progress_thread.set(handle.thread().clone());
            Some(handle)
        } else {
            None
        };
        Ok(Device { inner, progress })
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The device's address: where its socket receives, and what its GIDs name.
    pub fn address(&self) -> IpAddr {
        self.inner.address
    }

    /// GID table entry `index`: 0 the link-local GID, 1 the GID of the address (one entry
    /// only for a link-local IPv6 address); see [`Device::gid_table`].
    pub fn gid(&self, index: u32) -> Option<Gid> {
        self.inner.gids.get(index as usize).copied()
    }

    /// The port's GID table, laid out as kernel rxe lays out the table of an interface
    /// holding the device's address (RoCEv2 entries only): index 0 the IPv6 link-local GID,
    /// made from the address ([`softverbs_proto::link_local_gid`]: `fe80::ffff:a.b.c.d`
    /// for IPv4), index 1 the address itself (`::ffff:a.b.c.d` for IPv4). Every entry
    /// reaches the device: a peer's device sends a link-local GID to the address it was
    /// made from, so QPs and address handles work with either index on either side.
    pub fn gid_table(&self) -> &[Gid] {
        &self.inner.gids
    }

    /// The index of the network interface holding the device's address (`lo` for
    /// 127.0.0.0/8), as `if_nametoindex(3)` gives it: the `ndev_ifindex` of every GID
    /// (`ibv_query_gid_ex(3)`). 0 when no interface holds the address (a wildcard).
    pub fn interface_index(&self) -> u32 {
        self.inner.ifindex
    }

    /// The device's limits.
    pub fn query_device(&self) -> DeviceAttr {
        let config = *lock(&self.inner.state).engine.config();
        let guid_bytes = Gid::from_ip(self.inner.address).0;
        let node_guid = u64::from_be_bytes([
            0x02,
            0x53,
            0x56,
            0xff,
            guid_bytes[12],
            guid_bytes[13],
            guid_bytes[14],
            guid_bytes[15],
        ]);
        DeviceAttr {
            node_guid,
            vendor_id: VENDOR_ID,
            vendor_part_id: 0,
            max_mr_size: u64::MAX,
            page_size_cap: 0xffff_f000,
            // The QPNs this device hands out: its share where the address is shared
            // (the engine refuses past it with ENOMEM).
            max_qp: {
                let usable = config.qpn_range.usable();
                usable.end.saturating_sub(usable.start).min(0x00ff_ff00)
            },
            max_qp_wr: config.max_qp_wr,
            max_sge: config.max_sge,
            max_cq: 1 << 20,
            max_cqe: MAX_CQE,
            max_mr: 1 << 20,
            max_mw: MAX_MW,
            max_pd: 1 << 20,
            max_mcast_grp: softverbs_proto::MAX_MCAST_GROUPS,
            max_mcast_qp_attach: softverbs_proto::MAX_MCAST_QP_ATTACH,
            max_total_mcast_qp_attach: softverbs_proto::MAX_TOTAL_MCAST_QP_ATTACH,
            max_qp_rd_atom: config.max_qp_rd_atom,
            max_qp_init_rd_atom: config.max_qp_init_rd_atom,
            max_srq: 1 << 16,
            max_srq_wr: config.max_qp_wr,
            max_srq_sge: config.max_sge,
            max_inline_data: config.max_inline_data,
            atomic_cap_hca: true,
            completion_timestamp_mask: softverbs_cq::DEVICE_CLOCK_MASK,
            hca_core_clock_khz: softverbs_cq::DEVICE_CLOCK_KHZ,
            phys_port_cnt: 1,
            odp: OdpCaps::offered(),
        }
    }

    /// The port's state.
    pub fn port_attr(&self) -> PortAttr {
        PortAttr {
            active: true,
            max_mtu: Mtu::Mtu4096,
            active_mtu: self.inner.port_mtu,
            gid_tbl_len: self.inner.gids.len() as u32,
            link_layer_ethernet: true,
        }
    }

    /// `ibv_query_port(3)`: the attributes of `port`, which must be 1 (the device has one
    /// port; [`VerbsError::NoSuchPort`] otherwise).
    pub fn query_port(&self, port: u32) -> Result<PortAttr, DeviceError> {
        check_port(port)?;
        Ok(self.port_attr())
    }

    /// `ibv_query_gid(3)`: entry `index` of `port`'s GID table ([`VerbsError::NoSuchPort`]
    /// for a port other than 1, [`VerbsError::BadSgidIndex`] outside the table, whose
    /// length is `gid_tbl_len`: every entry of it holds a GID).
    pub fn query_gid(&self, port: u32, index: u32) -> Result<[u8; 16], DeviceError> {
        check_port(port)?;
        match self.gid(index) {
            Some(gid) => Ok(gid.octets()),
            None => Err(VerbsError::BadSgidIndex {
                index,
                table_len: self.inner.gids.len() as u32,
            }
            .into()),
        }
    }

    /// The asynchronous event queue.
    pub fn async_events(&self) -> &AsyncEventQueue {
        &self.inner.events
    }

    /// A CQ was destroyed (`ibv_destroy_cq(3)`): its unread `IBV_EVENT_CQ_ERR` is never
    /// delivered, as the kernel drops a destroyed object's events (QPs and SRQs, which the
    /// device destroys itself, get the same in [`Device::destroy_qp`] and
    /// [`Device::destroy_srq`]). The CQ core does not know the device, so both front doors
    /// call this when they destroy a CQ.
    pub fn cq_destroyed(&self, cq_id: u64) {
        self.inner.events.forget(Object::Cq, cq_id);
        let mut st = lock(&self.inner.state);
        if let Some(producer) = st.cqs.remove(&cq_id) {
            st.retired_cqs.add(&producer.stats());
        }
    }

    /// Allocates a protection domain (`ibv_alloc_pd(3)`); returns its handle.
    pub fn alloc_pd(&self) -> u32 {
        lock(&self.inner.state).objects.alloc_pd()
    }

    /// Deallocates a protection domain (`ibv_dealloc_pd(3)`): refused with
    /// [`VerbsError::InUse`] while a memory region, queue pair, shared receive queue or
    /// address handle is in it, [`VerbsError::NoSuchObject`] for a PD not allocated.
    pub fn dealloc_pd(&self, pd: u32) -> Result<(), DeviceError> {
        lock(&self.inner.state).objects.dealloc_pd(pd)
    }

    /// Finds the protection domain `pd` (`ibv_import_pd(3)`: a PD named by its handle, as
    /// `ibv_pd.handle` gives it): [`VerbsError::NoSuchObject`] for a PD not allocated or
    /// already deallocated.
    pub fn query_pd(&self, pd: u32) -> Result<(), DeviceError> {
        lock(&self.inner.state).objects.check_pd(pd)
    }

    /// Records a parent domain over `pd` (`ibv_alloc_parent_domain(3)`): the PD must be
    /// allocated ([`VerbsError::NoSuchObject`] otherwise), and [`Device::dealloc_pd`] refuses
    /// it ([`VerbsError::InUse`] by a PD) until [`Device::dealloc_parent_domain`]. Objects
    /// created through a parent domain are objects of `pd` and hold it themselves.
    pub fn alloc_parent_domain(&self, pd: u32) -> Result<(), DeviceError> {
        let mut st = lock(&self.inner.state);
        st.objects.check_pd(pd)?;
        st.objects.hold(pd, Object::Pd);
        Ok(())
    }

    /// Forgets a parent domain over `pd` (`ibv_dealloc_pd(3)` of the parent domain).
    pub fn dealloc_parent_domain(&self, pd: u32) {
        lock(&self.inner.state).objects.release(pd, Object::Pd);
    }

    /// Creates an address handle in `pd` (`ibv_create_ah(3)`): the PD must be allocated
    /// and the address vector pass [`Device::check_address_vector`]. The handle holds the
    /// PD until [`Device::destroy_ah`].
    pub fn create_ah(&self, pd: u32, av: AddressVector) -> Result<u32, DeviceError> {
        let mut st = lock(&self.inner.state);
        st.objects.check_pd(pd)?;
        st.engine.check_address_vector(&av)?;
        Ok(st.objects.add_ah(AddressHandle { pd, av }))
    }

    /// Destroys an address handle (`ibv_destroy_ah(3)`); returns what it was.
    pub fn destroy_ah(&self, ah: u32) -> Result<AddressHandle, DeviceError> {
        lock(&self.inner.state).objects.remove_ah(ah)
    }

    /// Registers memory (`ibv_reg_mr_iova2(3)`). Refused as [`MemoryTable::register`]
    /// refuses it, as [`DeviceError::Register`] whose errno is the kernel device's
    /// (`EINVAL` empty range or bad flags, `EFAULT` a page not mapped with the access
    /// asked, `ENOMEM` past `RLIMIT_MEMLOCK`).
    ///
    /// # Safety
    ///
    /// As [`MemoryTable::register`]: the range stays valid, and not accessed in conflict
    /// with the device, until [`Device::dereg_mr`] returns for its lkey.
    pub unsafe fn reg_mr(
        &self,
        pd: u32,
        addr: usize,
        len: u64,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Region, DeviceError> {
        let mut st = lock(&self.inner.state);
        st.objects.check_pd(pd)?;
        // SAFETY: forwarded contract.
        let region = unsafe { st.memory.register(pd, addr, len, iova, access) }?;
        st.objects.hold(pd, Object::Mr);
        Ok(region)
    }

    /// Deregisters the region with local key `lkey`; the device never touches it again.
    /// Refused while a memory window is bound to it (`ibv_dereg_mr(3)`: "fails if any
    /// memory window is still bound to this MR"; rxe's `rxe_dereg_mr`, IBA 10.6.7.2.6),
    /// as [`VerbsError::InUse`].
    pub fn dereg_mr(&self, lkey: u32) -> Result<Region, DeviceError> {
        let mut st = lock(&self.inner.state);
        let windows = st.memory.bound_windows(lkey);
        if windows > 0 {
            return Err(VerbsError::InUse {
                object: Object::Mr,
                by: Object::Mw,
                count: windows,
            }
            .into());
        }
        let region = st.memory.deregister(lkey).ok_or(VerbsError::NoSuchObject {
            object: Object::Mr,
            id: lkey,
        })?;
        st.objects.release(region.pd, Object::Mr);
        Ok(region)
    }

    /// `ibv_advise_mr(3)` for the regions `sges` name, in protection domain `pd`: the
    /// checks and prefetch of [`MemoryTable::advise`] (the kernel's order and errnos),
    /// after the PD itself ([`VerbsError::NoSuchObject`] for an unknown one, `EINVAL`).
    pub fn advise_mr(
        &self,
        pd: u32,
        advice: Advice,
        flags: u32,
        sges: &[Sge],
    ) -> Result<(), DeviceError> {
        let st = lock(&self.inner.state);
        st.objects.check_pd(pd)?;
        st.memory
            .advise(pd, advice, flags, sges)
            .map_err(|e| RegisterError::Advice(e).into())
    }

    /// The registration whose handle is `handle` (`ibv_import_mr(3)`; a region's handle is
    /// its local key, as `ibv_mr.handle` gives it): its range, keys and PD as they are now.
    /// [`VerbsError::NoSuchObject`] for a handle no live region has.
    pub fn query_mr(&self, handle: u32) -> Result<Region, DeviceError> {
        lock(&self.inner.state)
            .memory
            .by_lkey(handle)
            .copied()
            .ok_or_else(|| {
                VerbsError::NoSuchObject {
                    object: Object::Mr,
                    id: handle,
                }
                .into()
            })
    }

    /// Re-registers the region with local key `lkey` (`ibv_rereg_mr(3)`), keeping its
    /// keys; returns the region as it now is. Refused, changing nothing, for an unknown
    /// lkey or new PD ([`VerbsError::NoSuchObject`]), while a memory window is bound to
    /// the region ([`VerbsError::InUse`], as [`Device::dereg_mr`]: a window's bounds and
    /// rights were checked against the region as it was), and as
    /// [`MemoryTable::reregister`] refuses it. A new PD takes the region from the old one
    /// (`ibv_dealloc_pd` of the old PD no longer counts it).
    ///
    /// # Safety
    ///
    /// With a new translation, as [`Device::reg_mr`] for the new range; the device never
    /// touches the old range again once this returns `Ok`.
    pub unsafe fn rereg_mr(&self, lkey: u32, change: Rereg) -> Result<Region, DeviceError> {
        let mut st = lock(&self.inner.state);
        let old_pd = st
            .memory
            .by_lkey(lkey)
            .ok_or(VerbsError::NoSuchObject {
                object: Object::Mr,
                id: lkey,
            })?
            .pd;
        let windows = st.memory.bound_windows(lkey);
        if windows > 0 {
            return Err(VerbsError::InUse {
                object: Object::Mr,
                by: Object::Mw,
                count: windows,
            }
            .into());
        }
        if let Some(pd) = change.pd {
            st.objects.check_pd(pd)?;
        }
        // SAFETY: forwarded contract.
        let region =
            unsafe { st.memory.reregister(lkey, change) }.ok_or(VerbsError::NoSuchObject {
                object: Object::Mr,
                id: lkey,
            })??;
        if region.pd != old_pd {
            st.objects.release(old_pd, Object::Mr);
            st.objects.hold(region.pd, Object::Mr);
        }
        Ok(region)
    }

    /// Allocates a memory window of `kind` in `pd` (`ibv_alloc_mw(3)`); returns its handle
    /// and R_Key. The window is unbound: its R_Key reaches nothing until a bind
    /// (`ibv_bind_mw(3)` for type 1, `IBV_WR_BIND_MW` for type 2) executes. It holds the PD
    /// until [`Device::dealloc_mw`]. Refused for a PD not allocated
    /// ([`VerbsError::NoSuchObject`]) and past [`DeviceAttr::max_mw`]
    /// ([`VerbsError::TooManyObjects`]).
    pub fn alloc_mw(&self, pd: u32, kind: WindowType) -> Result<(u32, u32), DeviceError> {
        let mut st = lock(&self.inner.state);
        st.objects.check_pd(pd)?;
        if st.memory.window_count() >= MAX_MW as usize {
            return Err(VerbsError::TooManyObjects {
                object: Object::Mw,
                max: MAX_MW,
            }
            .into());
        }
        let window = st.memory.alloc_window(pd, kind)?;
        st.objects.hold(pd, Object::Mw);
        Ok(window)
    }

    /// Frees the memory window `handle` (`ibv_dealloc_mw(3)`), bound or not (rxe's
    /// `rxe_dealloc_mw`): its R_Key is invalid from now on, its region may be deregistered
    /// again, its PD loses a user. [`VerbsError::NoSuchObject`] for an unknown handle.
    pub fn dealloc_mw(&self, handle: u32) -> Result<(), DeviceError> {
        let mut st = lock(&self.inner.state);
        let window = st
            .memory
            .dealloc_window(handle)
            .ok_or(VerbsError::NoSuchObject {
                object: Object::Mw,
                id: handle,
            })?;
        st.objects.release(window.pd, Object::Mw);
        Ok(())
    }

    /// The memory window `handle`: its PD, type, current R_Key and binding.
    pub fn query_mw(&self, handle: u32) -> Option<Window> {
        lock(&self.inner.state)
            .memory
            .window_by_handle(handle)
            .copied()
    }

    /// How many accesses to registered memory faulted because the application unmapped
    /// (or freed) a region while it was registered
    /// ([`MemoryTable::faulted_accesses`]); each failed (REM_ACCESS_ERR NAK, LOC_PROT_ERR)
    /// and the process lived.
    pub fn faulted_accesses(&self) -> u64 {
        lock(&self.inner.state).memory.faulted_accesses()
    }

    /// How many accesses to on-demand paging regions met a page not mapped at the time
    /// ([`MemoryTable::unresolved_page_faults`]); each failed as a NIC fails an ODP page
    /// fault it cannot resolve, and the region stayed usable.
    pub fn unresolved_page_faults(&self) -> u64 {
        lock(&self.inner.state).memory.unresolved_page_faults()
    }

    /// Creates a QP completing into `send_cq` and `recv_cq`; returns its number. The QP is
    /// in protection domain `init.pd` (a number from [`Device::alloc_pd`]): it reaches only
    /// regions registered in that PD, a key of another PD being refused like an invalid
    /// one.
    pub fn create_qp(
        &self,
        init: QpInit,
        send_cq: CqProducer,
        recv_cq: CqProducer,
    ) -> Result<u32, DeviceError> {
        let mut st = lock(&self.inner.state);
        st.objects.check_pd(init.pd)?;
        let qpn = st.engine.create_qp(init)?;
        st.objects.hold(init.pd, Object::Qp);
        send_cq.attach_qp();
        if recv_cq.cq_id() != send_cq.cq_id() {
            recv_cq.attach_qp();
        }
        for cq in [&send_cq, &recv_cq] {
            st.cqs.entry(cq.cq_id()).or_insert_with(|| {
                let inner = Arc::downgrade(&self.inner);
                cq.set_arm_hook(move |packets_wake| {
                    if let Some(inner) = inner.upgrade() {
                        inner.cq_armed(packets_wake);
                    }
                });
                // Armed before any QP of the device used it (programs often arm a CQ as
                // they create it): as if armed now.
                if cq.is_armed() {
                    self.inner.cq_armed(cq.packets_wake_waiter());
                }
                cq.clone()
            });
        }
        st.routes.insert(
            qpn,
            Route {
                send: send_cq,
                recv: recv_cq,
            },
        );
        Ok(qpn)
    }

    /// Sends the ACKs the device holds for the application's next post (`runtime.rs`,
    /// `HeldAcks`) now. The device does so itself when a QP is destroyed and when it is
    /// dropped; a front door whose device outlives its contexts calls it when a context
    /// closes and when the process exits, so a peer never waits for an ACK of a message
    /// this process received before it left.
    pub fn send_held_acks(&self) {
        self.inner.send_held_acks();
    }

    /// `ibv_attach_mcast(3)`: attaches UD QP `qpn` to the multicast group `gid` (the rules
    /// are the engine's, [`Engine::attach_mcast`]). The device starts receiving the group
    /// with its first QP in it: a UDP device joins the IP multicast group on its interface
    /// (a socket of its own, so any number of processes of the host receive it); an
    /// in-process device gets a copy of what devices of this process send to it. If the
    /// socket cannot join, nothing is attached and the error is the operating system's.
    pub fn attach_mcast(&self, qpn: u32, gid: [u8; 16]) -> Result<(), DeviceError> {
        let mut st = lock(&self.inner.state);
        if st.engine.attach_mcast(qpn, gid)? {
            let group = Gid(gid).ip();
            if let Some(transport) = &self.inner.transport {
                if let Err(error) = transport.join_multicast(group) {
                    let _ = st.engine.detach_mcast(qpn, gid);
                    return Err(error.into());
                }
            }
            lock(&self.inner.groups).insert(group);
        }
        Ok(())
    }

    /// `ibv_detach_mcast(3)`: detaches `qpn` from group `gid` ([`Engine::detach_mcast`]); the
    /// device stops receiving the group when its last QP leaves it.
    pub fn detach_mcast(&self, qpn: u32, gid: [u8; 16]) -> Result<(), DeviceError> {
        let mut st = lock(&self.inner.state);
        if st.engine.detach_mcast(qpn, gid)? {
            self.inner.leave_group(Gid(gid).ip());
        }
        Ok(())
    }

    /// Detaches `qpn` from every multicast group, as the kernel does when the process that
    /// attached it goes away: for a front door whose QP handle is dropped without a way to
    /// fail ([`Device::destroy_qp`] refuses a QP still attached, `EBUSY`).
    pub fn detach_all_mcast(&self, qpn: u32) {
        let mut st = lock(&self.inner.state);
        for gid in st.engine.detach_all_mcast(qpn) {
            self.inner.leave_group(Gid(gid).ip());
        }
    }

    /// Destroys a QP; its CQs may then be destroyed. A QP still attached to a multicast
    /// group is refused (`EBUSY`, [`Engine::destroy_qp`]).
    pub fn destroy_qp(&self, qpn: u32) -> Result<(), DeviceError> {
        // The ACKs of what the QP received leave before it goes (the application that
        // destroys it posts nothing more to carry them).
        self.inner.send_held_acks();
        let _span = self.inner.span.enter();
        let mut st = lock(&self.inner.state);
        let (_, init) = st.engine.query_qp(qpn)?;
        st.engine.destroy_qp(qpn)?;
        st.objects.release(init.pd, Object::Qp);
        if let Some(route) = st.routes.remove(&qpn) {
            route.send.detach_qp();
            if route.recv.cq_id() != route.send.cq_id() {
                route.recv.detach_qp();
            }
        }
        self.inner.events.forget(Object::Qp, u64::from(qpn));
        Ok(())
    }

    /// Checks an address vector (`ibv_create_ah(3)`): port and source GID index, by the
    /// same rule a QP's path gets in [`Device::modify_qp`].
    pub fn check_address_vector(&self, av: &AddressVector) -> Result<(), DeviceError> {
        Ok(lock(&self.inner.state).engine.check_address_vector(av)?)
    }

    /// Modifies a QP (`ibv_modify_qp(3)`).
    pub fn modify_qp(&self, qpn: u32, attr: &QpAttr, mask: AttrMask) -> Result<(), DeviceError> {
        // A connected QP entering RTR learns its peer: one of a device of this process
        // takes larger packets than the path MTU (both ends decide alike).
        let to_rtr = mask.contains(AttrMask::STATE | AttrMask::AV) && attr.qp_state == QpState::Rtr;
        // The route first: the segment size is read from the peer's inbox it mapped.
        if let (true, Some(transport), None) = (to_rtr, &self.inner.transport, &self.inner.tap) {
            let dest = Gid(attr.ah_attr.dgid).resolve(self.inner.address);
            transport.prepare_route(&Endpoint::new(dest, self.inner.port()), attr.dest_qp_num);
        }
        let segment = to_rtr.then(|| self.inner.segment_for(attr));
        self.inner.run(|st| {
            st.engine.modify_qp(qpn, attr, mask)?;
            if let Some(segment) = segment {
                // A UD QP (no path MTU to replace) refuses; nothing to do then.
                let _ = st.engine.set_segment_size(qpn, segment);
            }
            self.inner.shortest_ack_timeout.store(
                st.engine.shortest_ack_timeout_ns().unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
            Ok::<(), VerbsError>(())
        })?;
        Ok(())
    }

    /// Queries a QP (`ibv_query_qp(3)`).
    pub fn query_qp(&self, qpn: u32) -> Result<(QpAttr, QpInit), DeviceError> {
        Ok(lock(&self.inner.state).engine.query_qp(qpn)?)
    }

    /// The state of a QP.
    pub fn qp_state(&self, qpn: u32) -> Option<QpState> {
        lock(&self.inner.state).engine.qp_state(qpn)
    }

    /// Posts a send work request (`ibv_post_send(3)`).
    pub fn post_send(&self, qpn: u32, wr: SendWr) -> Result<(), DeviceError> {
        self.inner.run(|st| st.engine.post_send(qpn, wr))?;
        Ok(())
    }

    /// Posts a receive work request (`ibv_post_recv(3)`).
    pub fn post_recv(&self, qpn: u32, wr: RecvWr) -> Result<(), DeviceError> {
        self.inner.run(|st| st.engine.post_recv(qpn, wr))?;
        Ok(())
    }

    /// Creates a shared receive queue in protection domain `pd` (`ibv_create_srq(3)`).
    pub fn create_srq(&self, pd: u32, init: SrqInit) -> Result<SrqId, DeviceError> {
        let mut st = lock(&self.inner.state);
        st.objects.check_pd(pd)?;
        let srq = st.engine.create_srq(init)?;
        st.objects.add_srq(srq.0, pd);
        Ok(srq)
    }

    /// Posts to a shared receive queue (`ibv_post_srq_recv(3)`).
    pub fn post_srq_recv(&self, srq: SrqId, wr: RecvWr) -> Result<(), DeviceError> {
        self.inner.run(|st| st.engine.post_srq_recv(srq, wr))?;
        Ok(())
    }

    /// Arms an SRQ's limit event (`ibv_modify_srq(3)` with `IBV_SRQ_LIMIT`).
    pub fn arm_srq_limit(&self, srq: SrqId, limit: u32) -> Result<(), DeviceError> {
        Ok(lock(&self.inner.state).engine.arm_srq_limit(srq, limit)?)
    }

    /// Queries a shared receive queue (`ibv_query_srq(3)`): `(max_wr, max_sge, srq_limit)`.
    pub fn query_srq(&self, srq: SrqId) -> Result<(u32, u32, u32), DeviceError> {
        Ok(lock(&self.inner.state).engine.query_srq(srq)?)
    }

    /// Destroys a shared receive queue.
    pub fn destroy_srq(&self, srq: SrqId) -> Result<(), DeviceError> {
        let mut st = lock(&self.inner.state);
        st.engine.destroy_srq(srq)?;
        st.objects.remove_srq(srq.0);
        self.inner.events.forget(Object::Srq, u64::from(srq.0));
        Ok(())
    }

    /// Receives and handles what has arrived and runs due timers, without blocking.
    /// Called by a poll that found its CQ empty, so a busy-polling application needs no
    /// other thread to make progress.
    pub fn progress(&self) {
        self.inner.app_progress(true);
    }

    /// The application is about to block in a call that does not receive for this device
    /// (waiting for a connection manager event): its polling is over. While it polled
    /// ([`Device::progress`]), the progress thread left the packets to it and napped
    /// (1-5 ms); from now on they are the progress thread's at once, not after the nap, so
    /// the packet the application waits for (the CM's REP, its RTU) is not held that long.
    /// A thread of the application that polls again takes the packets back.
    pub fn app_waits(&self) {
        self.inner.last_app_progress.store(0, Ordering::Relaxed);
        if let Some(thread) = self.inner.progress_thread.get() {
            thread.unpark();
        }
    }

    /// A duplicate of the fd that polls readable when a packet may have arrived for this
    /// device (its UDP socket); `None` in-process, where packets are handed over directly.
    /// A thread that blocks waiting for a completion can wait on it too and call
    /// [`Device::progress`] when it is readable: it then receives the packet that makes
    /// its completion itself, instead of being woken by the progress thread that did
    /// (one thread wake-up instead of two).
    pub fn readiness_fd(&self) -> Option<std::os::fd::OwnedFd> {
        let transport = self.inner.transport.as_ref()?;
        transport.readiness_fd()?.try_clone_to_owned().ok()
    }

    /// Lets a thread waiting for an event of `channel` (`CompletionChannel::get_event`,
    /// `ibv_get_cq_event`) receive this device's packets itself: it sleeps on the device's
    /// [readiness fd](Device::readiness_fd) too and runs [`Device::progress`] when that is
    /// readable, so the packet that makes its completion wakes it, not the progress thread
    /// that would then wake it (one wake-up per event, not two); while it spins before it
    /// sleeps, it receives too. Does nothing in-process
    /// (packets are handed over, there is no fd). The channel holds the device weakly: it
    /// does not keep it open.
    pub fn serve_channel_waits(&self, channel: &CompletionChannel) {
        let Some(fd) = self.readiness_fd() else {
            return;
        };
        let progress = Arc::downgrade(&self.inner);
        let sleeper = progress.clone();
        let waiter = progress.clone();
        let alone = progress.clone();
        channel.set_wait_progress_watched(
            fd,
            // Never yields: the channel runs it while it spins waiting for the event, and
            // a waiter that yields on a loaded core gives it to whatever else runs there
            // for a whole time slice (`ibv_rc_pingpong -e -s 8` with both cores busy:
            // 150-175 us per iteration, 260-300 with the yields of a polling application).
            // A thread that sleeps in its own `poll` after the run (`own_poll`: it found no
            // event with a non-blocking `get_event`, or took one and goes back to its event
            // loop) sends the ACKs of what it received now, not with a next post that
            // may not come before it sleeps (the progress thread, napping for it, would
            // send them only after its nap).
            // Such a thread receives only while every CQ with a channel is armed: it may be
            // between taking its events and arming its CQs, and a completion made now in a
            // CQ it has yet to arm would raise no event (`CompletionChannel`'s module doc).
            move |own_poll| {
                if let Some(inner) = progress.upgrade() {
                    if own_poll && !inner.channel_cqs_armed() {
                        return;
                    }
                    inner.app_progress(false);
                    if own_poll && inner.acks_held.load(Ordering::Relaxed) {
                        inner.send_held_acks();
                    }
                }
            },
            // Peers on the shared-memory path wake a sleeper they know of.
            move |before| {
                sleeper.upgrade().is_some_and(|inner| {
                    inner
                        .transport
                        .as_ref()
                        .is_some_and(|transport| transport.sleeping(before))
                })
            },
            // While a thread waits so, the progress thread leaves the packets to it.
            move |starts| {
                if let Some(inner) = waiter.upgrade() {
                    if starts {
                        inner.served_waiters.fetch_add(1, Ordering::SeqCst);
                    } else {
                        inner
                            .last_served_end
                            .store(DeviceClock::now(), Ordering::Relaxed);
                        inner.served_waiters.fetch_sub(1, Ordering::SeqCst);
                    }
                }
            },
            // The channel's sleeper is woken by the packets only while it is the device's
            // only channel, and the device has no shared-memory inbox: there the progress
            // thread, spinning a moment before it sleeps, takes a peer's packet at once,
            // and the thread it then wakes was often not asleep yet (an 8-byte own-poll
            // ping-pong between two processes: median 9-11 us that way, 62-74 us with the
            // sleeper woken by the doorbell).
            move || {
                alone.upgrade().is_some_and(|inner| {
                    !inner
                        .transport
                        .as_ref()
                        .is_some_and(|transport| transport.memory_inbox())
                        && inner.one_channel_at_most()
                })
            },
        );
    }

    /// Sends a management datagram (a MAD, 1..=256 bytes) from QP1 of this port to QP1 of
    /// the port whose GID is `dgid` (IBTA 13.5: UD SEND ONLY, P_Key 0xFFFF, Q_Key
    /// 0x80010000, SrcQP 1; [`Engine::gsi_send`]), from the GID of the device's address.
    /// It leaves now, over UDP or handed to a device of this process, through the capture
    /// and faults if configured. Refused with [`VerbsError::MadLength`] or, while 256 MADs
    /// wait to leave, [`VerbsError::QueueFull`] (`ENOMEM`).
    pub fn gsi_send(&self, dgid: [u8; 16], mad: &[u8]) -> Result<(), DeviceError> {
        // The address's GID: the last entry of the table (`attr::gid_table`).
        let sgid_index = self.inner.gids.len().saturating_sub(1) as u8;
        self.inner
            .run(|st| st.engine.gsi_send(dgid, sgid_index, mad))?;
        Ok(())
    }

    /// The next management datagram QP1 received, in arrival order, with the sender's GID
    /// and QP ([`Engine::poll_gsi`]); `None` when none waits. Whoever received the packet
    /// (the progress thread, or an application thread in [`Device::progress`] or a verb)
    /// queued it, so MADs arrive while the application polls no CQ.
    pub fn gsi_recv(&self) -> Option<GsiMad> {
        let mut st = lock(&self.inner.state);
        let mad = st.engine.poll_gsi();
        st.gsi_seen = st.engine.gsi_pending();
        if st.gsi_seen == 0 {
            // Empties the eventfd (non-blocking: nothing to read is fine).
            let mut count = [0u8; 8];
            let _ = rustix::io::read(&self.inner.gsi_fd, &mut count);
        }
        mad
    }

    /// How many received management datagrams wait for [`Device::gsi_recv`].
    pub fn gsi_pending(&self) -> usize {
        lock(&self.inner.state).engine.gsi_pending()
    }

    /// A file descriptor that polls readable exactly while management datagrams wait for
    /// [`Device::gsi_recv`] (an eventfd owned by the device). Poll it, then call
    /// `gsi_recv` until it returns `None`; do not read it (a read empties it while MADs
    /// may still wait, until the next one arrives).
    pub fn gsi_fd(&self) -> BorrowedFd<'_> {
        self.inner.gsi_fd.as_fd()
    }

    /// The share of its address this device holds: devices of several processes of one
    /// user can share an address, each with a share (QPNs `share << 16 ..`, see the
    /// README); 0 for a device alone on its address, or in-process. A connection manager
    /// using QP1 ([`Device::gsi_send`]) hands out communication IDs whose high byte is
    /// this (`softverbs_cm::CmConfig::share`), so that the answers to its messages, which
    /// reach the address's socket, are handed to this device.
    pub fn address_share(&self) -> u8 {
        self.inner
            .transport
            .as_ref()
            .map_or(0, |transport| transport.address_share())
    }

    /// Says that the connection manager using QP1 listens on `service_id` (an
    /// `rdma_listen`), so that REQs and SIDR_REQs for it reach this device when its
    /// address is shared. Refused with `EADDRINUSE` when a device of another process on the
    /// address listens on it (the port space is the address's, as on a kernel), `ENOMEM`
    /// when 256 services of the address are listened on.
    pub fn gsi_listen(&self, service_id: u64) -> Result<(), DeviceError> {
        match &self.inner.transport {
            Some(transport) => Ok(transport.listen_service(service_id)?),
            None => Ok(()),
        }
    }

    /// Undoes [`Device::gsi_listen`] (an `rdma_destroy_id` of the listener). Every service
    /// is forgotten when the device closes.
    pub fn gsi_unlisten(&self, service_id: u64) {
        if let Some(transport) = &self.inner.transport {
            transport.unlisten_service(service_id);
        }
    }

    /// Whether packets for devices of this process are handed over directly (the
    /// default) or sent through the transport like any other (tests of the wire path).
    /// Set it before connecting QPs: a QP whose peer is a device of this process decides
    /// at RTR, with its peer, whether they exchange direct segments (larger than any path
    /// MTU), which only the direct hand-over carries.
    pub fn set_in_process_shortcut(&self, on: bool) {
        self.inner.shortcut.store(on, Ordering::Relaxed);
        if let Some(tap) = &self.inner.tap {
            tap.link.set_shortcut(on);
        }
    }

    /// Writes the packets captured so far to the capture file (a no-op without
    /// capture). The file is complete up to here even if the process never drops the
    /// device, as a C program using the drop-in never does.
    pub fn flush_capture(&self) -> io::Result<()> {
        match &self.inner.capture {
            Some(capture) => capture.flush(),
            None => Ok(()),
        }
    }

    /// Flushes and closes the capture file: nothing is recorded after this, so a file
    /// closed as the process leaves never ends in a half-written record.
    pub fn close_capture(&self) -> io::Result<()> {
        match &self.inner.capture {
            Some(capture) => capture.close(),
            None => Ok(()),
        }
    }

    /// The engine's counters.
    pub fn counters(&self) -> softverbs_proto::Counters {
        lock(&self.inner.state).engine.counters().clone()
    }

    /// The capture this device records into, if any (its counters: [`Capture`]'s
    /// `Display`).
    pub fn capture(&self) -> Option<&Arc<Capture>> {
        self.inner.capture.as_ref()
    }

    /// What fault injection did (`None` without fault injection).
    pub fn fault_counters(&self) -> Option<crate::fault::FaultCounters> {
        self.inner.fault_layer.as_ref().map(|f| f.fault_counters())
    }

    /// The transport's counters (`None` for an in-process device). `dropped_bad_icrc`
    /// includes the packets a device of this process handed over whose ICRC did not
    /// verify (its faults corrupted them).
    pub fn transport_counters(&self) -> Option<crate::transport::TransportCounters> {
        self.inner.transport.as_ref().map(|t| {
            let mut counters = t.counters();
            counters.dropped_bad_icrc += self.inner.handed_bad_icrc.load(Ordering::Relaxed);
            counters
        })
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.inner.send_held_acks();
        self.inner.shutdown.store(true, Ordering::Release);
        self.inner.wake.notify_all();
        if let Some(handle) = self.progress.take() {
            handle.thread().unpark();
            let _ = handle.join();
        }
        // The safe API's (and so the command's) moment to report: SOFTVERBS_STATS.
        self.report_stats_once();
        let mut reg = lock(registry());
        if reg
            .get(&self.inner.address)
            .is_some_and(|w| w.as_ptr() == Arc::as_ptr(&self.inner))
        {
            reg.remove(&self.inner.address);
            note_registered(&reg);
        }
    }
}

/// The device has one port, 1.
fn check_port(port: u32) -> Result<(), VerbsError> {
    if port == 1 {
        Ok(())
    } else {
        Err(VerbsError::NoSuchPort { port })
    }
}
