//! The soft RDMA device: one [`softverbs_proto::Endpoint`] (every QP and SRQ of the
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
//! Other addresses go over the transport (UDP carrying RoCEv2).

use crate::events::{AsyncEvent, AsyncEventQueue};
use crate::fault::{FaultConfig, FaultTransport};
use crate::memory::{MemoryTable, Region, RegisterError};
use crate::pcap::{Capture, PcapTransport};
use crate::transport::{udp_src_port_for_qps, Endpoint as NetEndpoint, Gid, Transport};
use crate::udp::{UdpConfig, UdpTransport};
use softverbs_cq::{CqProducer, DeviceClock, PushError, MAX_CQE};
use softverbs_proto::{
    AccessFlags, AddressVector, AttrMask, Completion, CqTarget, Endpoint as Engine, EndpointConfig,
    Event, Mtu, QpAttr, QpInit, QpState, RecvWr, SendWr, SrqId, SrqInit, VerbsError,
};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// The vendor id the device reports: outside every vendor table (perftest treats unknown
/// vendors as generic devices).
pub const VENDOR_ID: u32 = 0x00ff_ffff;

/// How long the progress thread sleeps at most before looking at its timers again.
const PROGRESS_TICK: Duration = Duration::from_millis(5);

/// How recently the application must have driven progress for the progress thread to
/// leave the socket to it.
const APP_POLLING_WINDOW: Duration = Duration::from_millis(1);

/// Empty polls of a UDP device's application thread between two `sched_yield`s.
const EMPTY_POLLS_BEFORE_YIELD: u32 = 64;

/// Where the device's packets go.
#[derive(Clone, Debug)]
pub enum Network {
    /// Only devices of this process (no socket); the device gets an address in
    /// 127.1.0.0/16 that no socket uses.
    InProcess,
    /// RoCEv2 over UDP (reaches other processes and hosts), as configured.
    Udp(UdpConfig),
}

/// How to open a device.
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// The device name (`ibv_get_device_name`).
    pub name: String,
    /// Where packets go.
    pub network: Network,
    /// Protocol limits and the port MTU.
    pub engine: EndpointConfig,
    /// Whether to start the progress thread (tests of the sans-IO paths may not want it).
    pub progress_thread: bool,
    /// Fault injection on the transport path (drop, duplicate, delay, reorder, corrupt),
    /// switchable at run time through the shared [`FaultConfig`].
    pub faults: Option<FaultSetup>,
    /// Capture of every packet the transport sends and receives.
    pub capture: Option<Arc<Capture>>,
}

/// Fault injection for a device: the rules (shared, changeable while running) and the
/// seed of the device's random draws.
#[derive(Clone, Debug)]
pub struct FaultSetup {
    /// The rules.
    pub config: Arc<FaultConfig>,
    /// The seed.
    pub seed: u64,
}

/// Environment variable naming a pcap file to capture the device's traffic into.
pub const PCAP_ENV: &str = "SOFTVERBS_PCAP";
/// Environment variable with fault-injection rules, e.g.
/// `drop=0.05,duplicate=0.01,corrupt=0.001,delay=0.01:2ms,reorder=0.01:1ms,seed=7`.
pub const FAULTS_ENV: &str = "SOFTVERBS_FAULTS";

/// Parses fault rules in the [`FAULTS_ENV`] syntax.
pub fn parse_faults(spec: &str) -> Result<FaultSetup, String> {
    let config = FaultConfig::new();
    let mut seed = 1;
    let duration = |v: &str| -> Result<Duration, String> {
        let v = v.trim();
        let (num, scale) = if let Some(n) = v.strip_suffix("us") {
            (n, 1_000)
        } else if let Some(n) = v.strip_suffix("ms") {
            (n, 1_000_000)
        } else if let Some(n) = v.strip_suffix('s') {
            (n, 1_000_000_000)
        } else {
            return Err(format!("duration {v:?} needs a unit (us, ms, s)"));
        };
        let n: u64 = num.parse().map_err(|_| format!("bad duration {v:?}"))?;
        Ok(Duration::from_nanos(n * scale))
    };
    let probability = |v: &str| -> Result<f64, String> {
        let p: f64 = v.parse().map_err(|_| format!("bad probability {v:?}"))?;
        if (0.0..=1.0).contains(&p) {
            Ok(p)
        } else {
            Err(format!("probability {p} outside 0..=1"))
        }
    };
    for item in spec.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| format!("{item:?} is not key=value"))?;
        match key.trim() {
            "drop" => config.set_drop(probability(value)?),
            "duplicate" => config.set_duplicate(probability(value)?),
            "corrupt" => config.set_corrupt(probability(value)?),
            "delay" | "reorder" => {
                let (p, d) = value
                    .split_once(':')
                    .ok_or_else(|| format!("{key} wants probability:duration"))?;
                if key == "delay" {
                    config.set_delay(probability(p)?, duration(d)?);
                } else {
                    config.set_reorder(probability(p)?, duration(d)?);
                }
            }
            "seed" => {
                seed = value
                    .trim()
                    .parse()
                    .map_err(|_| format!("bad seed {value:?}"))?
            }
            other => return Err(format!("unknown fault rule {other:?}")),
        }
    }
    Ok(FaultSetup { config, seed })
}

impl DeviceConfig {
    /// An in-process device with default limits.
    pub fn in_process() -> Self {
        DeviceConfig {
            name: "softverbs0".into(),
            network: Network::InProcess,
            engine: EndpointConfig::default(),
            progress_thread: true,
            faults: None,
            capture: None,
        }
    }

    /// A UDP device with this configuration and default limits.
    pub fn udp(udp: UdpConfig) -> Self {
        DeviceConfig {
            network: Network::Udp(udp),
            ..DeviceConfig::in_process()
        }
    }

    /// Adds what the environment asks for: a capture file ([`PCAP_ENV`]) and fault rules
    /// ([`FAULTS_ENV`]).
    pub fn with_env(mut self) -> io::Result<Self> {
        if let Some(path) = std::env::var_os(PCAP_ENV) {
            let capture = Capture::create(&path).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("{PCAP_ENV}={}: {e}", path.to_string_lossy()),
                )
            })?;
            if let Some(limit) = std::env::var_os(crate::pcap::PCAP_LIMIT_ENV) {
                let limit = crate::pcap::parse_size(&limit.to_string_lossy()).map_err(|e| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{}: {e}", crate::pcap::PCAP_LIMIT_ENV),
                    )
                })?;
                capture.set_limit(limit);
            }
            self.capture = Some(capture);
        }
        if let Some(spec) = std::env::var_os(FAULTS_ENV) {
            let spec = spec.to_string_lossy();
            self.faults = Some(
                parse_faults(&spec).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
            );
        }
        Ok(self)
    }

    /// A UDP device configured from the environment (`SOFTVERBS_ADDR`, else the first free
    /// 127.0.0.x:4791).
    pub fn udp_from_env() -> io::Result<Self> {
        DeviceConfig::udp(UdpConfig::from_env()?).with_env()
    }
}

/// The device's limits (`struct ibv_device_attr`, the fields that mean something here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Node GUID (derived from the address).
    pub node_guid: u64,
    /// Vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Largest registrable region.
    pub max_mr_size: u64,
    /// Page sizes supported.
    pub page_size_cap: u64,
    /// Queue pairs.
    pub max_qp: u32,
    /// Work requests per queue.
    pub max_qp_wr: u32,
    /// Scatter/gather entries per work request.
    pub max_sge: u32,
    /// Completion queues.
    pub max_cq: u32,
    /// Entries per completion queue.
    pub max_cqe: u32,
    /// Memory regions.
    pub max_mr: u32,
    /// Protection domains.
    pub max_pd: u32,
    /// Incoming reads/atomics per QP.
    pub max_qp_rd_atom: u8,
    /// Outgoing reads/atomics per QP.
    pub max_qp_init_rd_atom: u8,
    /// Shared receive queues.
    pub max_srq: u32,
    /// Work requests per SRQ.
    pub max_srq_wr: u32,
    /// Scatter/gather entries per SRQ work request.
    pub max_srq_sge: u32,
    /// Largest inline payload.
    pub max_inline_data: u32,
    /// Atomic guarantees: `IBV_ATOMIC_HCA` (atomic among this device's atomics).
    pub atomic_cap_hca: bool,
    /// Completion timestamp valid bits (`completion_timestamp_mask`).
    pub completion_timestamp_mask: u64,
    /// Device clock in kHz (`hca_core_clock`).
    pub hca_core_clock_khz: u64,
    /// Physical ports.
    pub phys_port_cnt: u8,
}

/// The port's state (`struct ibv_port_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortAttr {
    /// Always `IBV_PORT_ACTIVE`.
    pub active: bool,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU in use.
    pub active_mtu: Mtu,
    /// GID table length.
    pub gid_tbl_len: u32,
    /// Link layer: Ethernet (RoCE).
    pub link_layer_ethernet: bool,
}

/// Why a verb failed.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The engine refused it.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// Registration refused.
    #[error(transparent)]
    Register(#[from] RegisterError),
    /// A transport or OS error.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// No such object.
    #[error("no such {0}")]
    NoSuch(&'static str),
}

impl DeviceError {
    /// The errno the C side reports.
    pub fn errno(&self) -> i32 {
        match self {
            DeviceError::Verbs(e) => e.errno(),
            DeviceError::Register(e) => e.errno(),
            DeviceError::Io(e) => e.raw_os_error().unwrap_or(5),
            DeviceError::NoSuch(_) => 22,
        }
    }
}

/// Entries of the port's GID table: the device's own address at index 0.
const GID_TABLE_LEN: u32 = 1;

/// Where a QP's completions go.
struct Route {
    send: CqProducer,
    recv: CqProducer,
}

struct State {
    engine: Engine,
    memory: MemoryTable,
    routes: HashMap<u32, Route>,
    /// Completions a back-pressure CQ refused, retried in order on every run.
    held: VecDeque<Completion>,
    next_pd: u32,
    scratch: Vec<u8>,
}

/// A packet produced by a run, to send once the state lock is released.
struct Outgoing {
    to: NetEndpoint,
    src_port: u16,
    bytes: Vec<u8>,
}

pub(crate) struct DeviceInner {
    name: String,
    address: IpAddr,
    gid: Gid,
    state: Mutex<State>,
    transport: Option<Box<dyn Transport>>,
    /// The pcap capture of the transport, if any (flushed on request).
    capture: Option<Arc<Capture>>,
    /// Held from the end of a run (taken under the state lock) until its packets are
    /// handed to the transport or queued for local delivery, so they leave in order.
    tx: Mutex<()>,
    /// Held from taking a packet off the transport until the engine has handled it, so
    /// packets are handled in the order they arrived whichever thread receives them.
    rx: Mutex<()>,
    /// The fault-injection layer of the transport, for its counters.
    fault_layer: Option<Arc<FaultTransport<Box<dyn Transport>>>>,
    events: AsyncEventQueue,
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
    port_mtu: Mtu,
}

fn registry() -> &'static Mutex<HashMap<IpAddr, Weak<DeviceInner>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<IpAddr, Weak<DeviceInner>>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Packets for devices of this process: (destination, source address, bytes).
type LocalQueue = VecDeque<(Arc<DeviceInner>, IpAddr, Vec<u8>)>;

thread_local! {
    /// Packets for devices of this process, delivered in order by the outermost run on
    /// this thread (so no device lock is held while another device runs). The flag says
    /// whether a run on this thread is already draining the queue.
    static LOCAL_DELIVERY: RefCell<(bool, LocalQueue)> =
        const { RefCell::new((false, VecDeque::new())) };
}

/// An open soft RDMA device.
///
/// ```
/// use softverbs_device::{Device, DeviceConfig};
/// let device = Device::open(DeviceConfig::in_process())?;
/// assert!(device.query_port().active);
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

/// The largest IB MTU whose RoCEv2 packets fit in `link_mtu`-byte IP datagrams: IP, UDP,
/// BTH, the largest extended header a payload-carrying packet adds (RETH + ImmDt, 20
/// bytes), the ICRC.
fn largest_ib_mtu(address: IpAddr, link_mtu: u32) -> Mtu {
    let ip = if address.is_ipv4() { 20 } else { 40 };
    let overhead = ip + 8 + 12 + 20 + 4;
    [Mtu::Mtu4096, Mtu::Mtu2048, Mtu::Mtu1024, Mtu::Mtu512]
        .into_iter()
        .find(|m| m.bytes() + overhead <= link_mtu)
        .unwrap_or(Mtu::Mtu256)
}

/// The MTU of the network interface that holds `address` (`None` if no interface does).
fn interface_mtu(address: IpAddr) -> Option<u32> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a list we free below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut name = None;
    let mut entry = list;
    while !entry.is_null() {
        // SAFETY: a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*entry };
        entry = ifa.ifa_next;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: a non-NULL address of the node; the family says which sockaddr it is.
        let holds = unsafe {
            match (i32::from((*ifa.ifa_addr).sa_family), address) {
                (libc::AF_INET, IpAddr::V4(v4)) => {
                    let sin = &*ifa.ifa_addr.cast::<libc::sockaddr_in>();
                    u32::from_be(sin.sin_addr.s_addr) == u32::from(v4)
                }
                (libc::AF_INET6, IpAddr::V6(v6)) => {
                    let sin6 = &*ifa.ifa_addr.cast::<libc::sockaddr_in6>();
                    sin6.sin6_addr.s6_addr == v6.octets()
                }
                _ => false,
            }
        };
        if holds {
            // SAFETY: the node's NUL-terminated interface name.
            name = Some(unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_owned());
            break;
        }
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(list) };
    let name = name?;
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).ok()?;
    // SAFETY: an all-zero ifreq is valid; the name is copied in bounded by IFNAMSIZ - 1.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in request
        .ifr_name
        .iter_mut()
        .zip(name.as_bytes().iter().take(libc::IFNAMSIZ - 1))
    {
        *dst = *src as libc::c_char;
    }
    use std::os::fd::AsRawFd;
    // SAFETY: SIOCGIFMTU reads the name and writes the MTU into the request we own.
    let rc = unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFMTU, &mut request) };
    if rc != 0 {
        return None;
    }
    // SAFETY: after a successful SIOCGIFMTU the union holds the MTU.
    Some(unsafe { request.ifr_ifru.ifru_mtu } as u32)
}

fn next_in_process_address() -> IpAddr {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    IpAddr::V4(Ipv4Addr::new(127, 1, (n >> 8) as u8, n as u8))
}

impl Device {
    /// Opens a device.
    pub fn open(config: DeviceConfig) -> Result<Device, DeviceError> {
        let mut fault_layer = None;
        let (transport, address): (Option<Box<dyn Transport>>, IpAddr) = match &config.network {
            Network::InProcess => (None, next_in_process_address()),
            Network::Udp(udp) => {
                // The stack: faults decide what is sent, the capture records what really
                // went to (and came from) the socket.
                let udp = UdpTransport::bind(udp.clone())?;
                let addr = udp.local().addr();
                let captured: Box<dyn Transport> = match &config.capture {
                    Some(capture) => Box::new(PcapTransport::new(udp, capture.clone())),
                    None => Box::new(udp),
                };
                let stack: Box<dyn Transport> = match &config.faults {
                    Some(f) => {
                        let layer =
                            Arc::new(FaultTransport::new(captured, f.config.clone(), f.seed));
                        fault_layer = Some(layer.clone());
                        Box::new(layer)
                    }
                    None => captured,
                };
                (Some(stack), addr)
            }
        };
        let mut engine_config = config.engine;
        // Loopback carries 64 KiB. A real interface carries its own MTU: the port's MTU is
        // the largest IB MTU whose packets fit (1024 for 1500-byte Ethernet frames, 4096
        // for jumbo frames), as rxe derives it from its netdev. An address no interface
        // holds (a wildcard) gets the Ethernet answer.
        if !address.is_loopback() {
            let fits = largest_ib_mtu(address, interface_mtu(address).unwrap_or(1500));
            if engine_config.port_mtu > fits {
                engine_config.port_mtu = fits;
            }
        }
        // One GID, the device's address (index 0); the engine checks every source GID
        // index against this table.
        engine_config.gid_table_len = GID_TABLE_LEN;
        let inner = Arc::new(DeviceInner {
            name: config.name,
            address,
            gid: Gid::from_ip(address),
            state: Mutex::new(State {
                engine: Engine::new(engine_config),
                memory: MemoryTable::new(),
                routes: HashMap::new(),
                held: VecDeque::new(),
                next_pd: 1,
                scratch: vec![0u8; 16 * 1024],
            }),
            transport,
            tx: Mutex::new(()),
            rx: Mutex::new(()),
            fault_layer,
            events: AsyncEventQueue::new()?,
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            shortcut: AtomicBool::new(true),
            sleeping_until: AtomicU64::new(0),
            next_deadline: AtomicU64::new(u64::MAX),
            last_app_progress: AtomicU64::new(0),
            port_mtu: engine_config.port_mtu,
            capture: config.capture.clone(),
        });
        lock(registry()).insert(address, Arc::downgrade(&inner));
        inner.events.push(AsyncEvent::PortActive { port: 1 });
        let progress = if config.progress_thread {
            let weak = Arc::downgrade(&inner);
            Some(
                std::thread::Builder::new()
                    .name(format!("softverbs-progress-{address}"))
                    .spawn(move || progress_loop(weak))?,
            )
        } else {
            None
        };
        Ok(Device { inner, progress })
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The device's address (its GID 0 as an IP address).
    pub fn address(&self) -> IpAddr {
        self.inner.address
    }

    /// GID table entry `index` (only index 0 exists).
    pub fn gid(&self, index: u32) -> Option<Gid> {
        (index < GID_TABLE_LEN).then_some(self.inner.gid)
    }

    /// The device's limits.
    pub fn query_device(&self) -> DeviceAttr {
        let config = *lock(&self.inner.state).engine.config();
        let guid_bytes = self.inner.gid.0;
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
            max_qp: 0x00ff_ff00,
            max_qp_wr: config.max_qp_wr,
            max_sge: config.max_sge,
            max_cq: 1 << 20,
            max_cqe: MAX_CQE,
            max_mr: 1 << 20,
            max_pd: 1 << 20,
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
        }
    }

    /// The port's state.
    pub fn query_port(&self) -> PortAttr {
        PortAttr {
            active: true,
            max_mtu: Mtu::Mtu4096,
            active_mtu: self.inner.port_mtu,
            gid_tbl_len: GID_TABLE_LEN,
            link_layer_ethernet: true,
        }
    }

    /// The asynchronous event queue.
    pub fn async_events(&self) -> &AsyncEventQueue {
        &self.inner.events
    }

    /// Allocates a protection domain handle.
    pub fn alloc_pd(&self) -> u32 {
        let mut st = lock(&self.inner.state);
        let pd = st.next_pd;
        st.next_pd += 1;
        pd
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
        // SAFETY: forwarded contract.
        Ok(unsafe {
            lock(&self.inner.state)
                .memory
                .register(pd, addr, len, iova, access)
        }?)
    }

    /// Deregisters the region with local key `lkey`; the device never touches it again.
    pub fn dereg_mr(&self, lkey: u32) -> Result<Region, DeviceError> {
        lock(&self.inner.state)
            .memory
            .deregister(lkey)
            .ok_or(DeviceError::NoSuch("memory region"))
    }

    /// How many accesses to registered memory faulted because the application unmapped
    /// (or freed) a region while it was registered
    /// ([`MemoryTable::faulted_accesses`]); each failed (REM_ACCESS_ERR NAK, LOC_PROT_ERR)
    /// and the process lived.
    pub fn faulted_accesses(&self) -> u64 {
        lock(&self.inner.state).memory.faulted_accesses()
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
        let qpn = st.engine.create_qp(init)?;
        send_cq.attach_qp();
        if recv_cq.cq_id() != send_cq.cq_id() {
            recv_cq.attach_qp();
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

    /// Destroys a QP; its CQs may then be destroyed.
    pub fn destroy_qp(&self, qpn: u32) -> Result<(), DeviceError> {
        let mut st = lock(&self.inner.state);
        st.engine.destroy_qp(qpn)?;
        if let Some(route) = st.routes.remove(&qpn) {
            route.send.detach_qp();
            if route.recv.cq_id() != route.send.cq_id() {
                route.recv.detach_qp();
            }
        }
        Ok(())
    }

    /// Checks an address vector (`ibv_create_ah(3)`): port and source GID index, by the
    /// same rule a QP's path gets in [`Device::modify_qp`].
    pub fn check_address_vector(&self, av: &AddressVector) -> Result<(), DeviceError> {
        Ok(lock(&self.inner.state).engine.check_address_vector(av)?)
    }

    /// Modifies a QP (`ibv_modify_qp(3)`).
    pub fn modify_qp(&self, qpn: u32, attr: &QpAttr, mask: AttrMask) -> Result<(), DeviceError> {
        self.inner.run(|st| st.engine.modify_qp(qpn, attr, mask))?;
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

    /// Creates a shared receive queue (`ibv_create_srq(3)`).
    pub fn create_srq(&self, init: SrqInit) -> Result<SrqId, DeviceError> {
        Ok(lock(&self.inner.state).engine.create_srq(init)?)
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
        Ok(lock(&self.inner.state).engine.destroy_srq(srq)?)
    }

    /// Receives and handles what has arrived and runs due timers, without blocking.
    /// Called by a poll that found its CQ empty, so a busy-polling application needs no
    /// other thread to make progress.
    pub fn progress(&self) {
        let inner = &self.inner;
        if inner.transport.is_none() {
            // In-process packets arrive by direct hand-over: only timers can be due, and an
            // idle poll with none pending reads neither the clock nor a lock.
            let deadline = inner.next_deadline.load(Ordering::Relaxed);
            if deadline != u64::MAX && deadline <= DeviceClock::now() {
                inner.run_due_timers(DeviceClock::now());
            }
            return;
        }
        let now = DeviceClock::now();
        inner.last_app_progress.store(now, Ordering::Relaxed);
        if inner.progress_once(now, Some(Duration::ZERO)) == 0 {
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

    /// Whether packets for devices of this process are handed over directly (the
    /// default) or sent through the transport like any other (tests of the wire path).
    pub fn set_in_process_shortcut(&self, on: bool) {
        self.inner.shortcut.store(on, Ordering::Relaxed);
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

    /// The transport's counters (`None` for an in-process device).
    pub fn transport_counters(&self) -> Option<crate::transport::TransportCounters> {
        self.inner.transport.as_ref().map(|t| t.counters())
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Ordering::Release);
        self.inner.wake.notify_all();
        if let Some(handle) = self.progress.take() {
            let _ = handle.join();
        }
        let mut reg = lock(registry());
        if reg
            .get(&self.inner.address)
            .is_some_and(|w| w.as_ptr() == Arc::as_ptr(&self.inner))
        {
            reg.remove(&self.inner.address);
        }
    }
}

fn progress_loop(weak: Weak<DeviceInner>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        if inner.shutdown.load(Ordering::Acquire) {
            return;
        }
        inner.progress_once(DeviceClock::now(), None);
    }
}

impl DeviceInner {
    /// Runs `f` on the engine, then delivers what it produced: completions to their CQs,
    /// events to the async queue, packets (after the lock is released) to their peers.
    fn run<R>(self: &Arc<Self>, f: impl FnOnce(&mut State) -> R) -> R {
        let now = DeviceClock::now();
        let mut outgoing = Vec::new();
        let (result, sending) = {
            let mut st = lock(&self.state);
            let result = f(&mut st);
            self.drain(&mut st, now, &mut outgoing);
            // Packets leave in the order the engine produced them, whichever thread ran
            // it: the send lock is taken before the state lock is released (a reordered
            // pair of packets costs the peer a NAK and a go-back-N).
            let sending = (!outgoing.is_empty()).then(|| lock(&self.tx));
            (result, sending)
        };
        if let Some(guard) = sending {
            self.send_all(outgoing, guard);
        }
        result
    }

    /// Collects transmits, completions and events from the engine.
    fn drain(&self, st: &mut State, now: u64, outgoing: &mut Vec<Outgoing>) {
        let State {
            engine,
            memory,
            scratch,
            ..
        } = st;
        while let Some(tx) = engine.poll_transmit(now, scratch, memory) {
            let to = NetEndpoint::from_gid(Gid(tx.av.dgid), self.port());
            outgoing.push(Outgoing {
                to,
                src_port: udp_src_port_for_qps(tx.src_qpn, tx.dest_qpn),
                bytes: scratch[..tx.len].to_vec(),
            });
        }
        // Completions: retry what a back-pressure CQ refused first, to keep order.
        let mut failed_cqs: Vec<u32> = Vec::new();
        while let Some(c) = st.held.pop_front() {
            if !push_completion(&st.routes, c, &mut failed_cqs, &mut st.held) {
                break;
            }
        }
        while let Some(c) = st.engine.poll_completion() {
            if !st.held.is_empty() {
                st.held.push_back(c);
                continue;
            }
            push_completion(&st.routes, c, &mut failed_cqs, &mut st.held);
        }
        while let Some(event) = st.engine.poll_event() {
            self.events.push(match event {
                Event::QpFatal { qpn } => AsyncEvent::QpFatal { qpn },
                Event::QpRequestError { qpn } => AsyncEvent::QpRequestError { qpn },
                Event::QpAccessError { qpn } => AsyncEvent::QpAccessError { qpn },
                Event::CommEst { qpn } => AsyncEvent::CommEst { qpn },
                Event::SqDrained { qpn } => AsyncEvent::SqDrained { qpn },
                Event::LastWqeReached { qpn } => AsyncEvent::QpLastWqeReached { qpn },
                Event::SrqLimitReached { srq } => AsyncEvent::SrqLimitReached { srq: srq.0 },
            });
        }
        // A CQ that overran is in error: every QP completing into it goes to error too
        // (reference §3.7: "never drop a CQE silently").
        for qpn in failed_cqs {
            let attr = QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            };
            let _ = st.engine.modify_qp(qpn, &attr, AttrMask::STATE);
        }
        let deadline = next_deadline(st);
        self.next_deadline.store(deadline, Ordering::Relaxed);
        // Wake an in-process progress thread only if a deadline now comes before the time
        // it sleeps until (a futex wake is a system call: not on every verb).
        if self.transport.is_none() && deadline < self.sleeping_until.load(Ordering::Relaxed) {
            self.wake.notify_all();
        }
    }

    fn port(&self) -> u16 {
        self.transport
            .as_ref()
            .map_or(crate::transport::DEFAULT_PORT, |t| t.local().port())
    }

    /// Sends packets: to devices of this process directly, to others over the transport.
    fn send_all(self: &Arc<Self>, outgoing: Vec<Outgoing>, sending: MutexGuard<'_, ()>) {
        let mut local = Vec::new();
        {
            let reg = lock(registry());
            let shortcut = self.shortcut.load(Ordering::Relaxed) || self.transport.is_none();
            for mut out in outgoing {
                let peer = if shortcut {
                    reg.get(&out.to.addr()).and_then(Weak::upgrade)
                } else {
                    None
                };
                match peer {
                    Some(peer) => local.push((peer, out.bytes)),
                    None => match &self.transport {
                        Some(t) => {
                            if let Err(e) = t.send(&out.to, out.src_port, &mut out.bytes) {
                                tracing::debug!(error = %e, to = %out.to.addr(), "send failed");
                            }
                        }
                        None => {
                            tracing::debug!(to = %out.to.addr(), "no route for in-process device");
                        }
                    },
                }
            }
        }
        let from = self.address;
        let drain_here = LOCAL_DELIVERY.with(|cell| {
            let mut q = cell.borrow_mut();
            for (peer, bytes) in local {
                q.1.push_back((peer, from, bytes));
            }
            if q.0 || q.1.is_empty() {
                false
            } else {
                q.0 = true;
                true
            }
        });
        // Delivering runs other devices' engines (and, through their answers, this one's
        // again): never while holding the send lock.
        drop(sending);
        if drain_here {
            while let Some((peer, from, bytes)) =
                LOCAL_DELIVERY.with(|cell| cell.borrow_mut().1.pop_front())
            {
                peer.receive(&bytes, from);
            }
            LOCAL_DELIVERY.with(|cell| cell.borrow_mut().0 = false);
        }
    }

    /// Handles one packet from `from`.
    fn receive(self: &Arc<Self>, bytes: &[u8], from: IpAddr) {
        let grh = grh_bytes(from, self.address, bytes.len());
        let now = DeviceClock::now();
        self.run(|st| {
            let State { engine, memory, .. } = st;
            engine.handle_packet(now, bytes, Some(&grh), memory);
        });
    }

    /// One round of progress: receive (waiting up to `wait`, or until the next deadline
    /// when `None`), handle, and run due timers.
    /// Returns how many packets it received.
    fn progress_once(self: &Arc<Self>, now: u64, wait: Option<Duration>) -> usize {
        let mut received = 0;
        let deadline = self.next_deadline.load(Ordering::Relaxed);
        let until_deadline =
            (deadline != u64::MAX).then(|| Duration::from_nanos(deadline.saturating_sub(now)));
        let timeout = match (wait, until_deadline) {
            (Some(w), Some(d)) => w.min(d),
            (Some(w), None) => w,
            (None, Some(d)) => d.min(PROGRESS_TICK),
            (None, None) => PROGRESS_TICK,
        };
        let app_is_polling = wait.is_none()
            && now.saturating_sub(self.last_app_progress.load(Ordering::Relaxed))
                < APP_POLLING_WINDOW.as_nanos() as u64;
        match &self.transport {
            Some(_) if app_is_polling => {
                // The application receives for itself; only timers are ours.
                std::thread::sleep(timeout.min(APP_POLLING_WINDOW));
            }
            Some(transport) => {
                // Wait without the receive lock; then take packets off and handle them
                // under it, so two receiving threads cannot swap two packets.
                if wait.is_none() {
                    if let Err(e) = transport.wait_readable(timeout) {
                        tracing::warn!(error = %e, "waiting for packets failed");
                        std::thread::sleep(PROGRESS_TICK);
                    }
                }
                let receiving = if wait.is_none() {
                    Some(lock(&self.rx))
                } else {
                    let got = self.rx.try_lock().ok();
                    if got.is_none() {
                        // Another thread is receiving. If it was preempted while holding the
                        // lock, a polling application spinning here would keep it off the
                        // CPU, and nobody would receive: give it the core.
                        std::thread::yield_now();
                    }
                    got
                };
                if let Some(_receiving) = receiving {
                    thread_local! {
                        static RECV_BUF: RefCell<Vec<u8>> = RefCell::new(vec![0u8; 16 * 1024]);
                    }
                    let mut buf = RECV_BUF.with(|b| std::mem::take(&mut *b.borrow_mut()));
                    if buf.len() < 16 * 1024 {
                        buf = vec![0u8; 16 * 1024];
                    }
                    // Handle everything already queued, without waiting.
                    for _ in 0..64 {
                        match transport.recv(&mut buf, Some(Duration::ZERO)) {
                            Ok(Some(rx)) => {
                                received += 1;
                                self.receive(&buf[..rx.len], rx.from.addr());
                            }
                            Ok(None) => break,
                            Err(e) => {
                                tracing::warn!(error = %e, "receive failed");
                                break;
                            }
                        }
                    }
                    RECV_BUF.with(|b| *b.borrow_mut() = buf);
                }
            }
            None => {
                if !timeout.is_zero() {
                    let st = lock(&self.state);
                    if !self.shutdown.load(Ordering::Acquire) {
                        self.sleeping_until.store(
                            now.saturating_add(timeout.as_nanos() as u64),
                            Ordering::Relaxed,
                        );
                        let (st, _) = self
                            .wake
                            .wait_timeout(st, timeout)
                            .unwrap_or_else(|e| e.into_inner());
                        self.sleeping_until.store(0, Ordering::Relaxed);
                        drop(st);
                    }
                }
            }
        }
        // After a wait the clock has moved; a non-waiting call reuses its reading.
        let now = if wait.is_some_and(|w| w.is_zero()) {
            now
        } else {
            DeviceClock::now()
        };
        if self.next_deadline.load(Ordering::Relaxed) <= now {
            self.run_due_timers(now);
        }
        received
    }

    /// Runs the engine's timers and the CQs' moderation timers that are due at `now`.
    fn run_due_timers(self: &Arc<Self>, now: u64) {
        self.run(|st| {
            if st.engine.poll_timeout().is_some_and(|d| d <= now) {
                st.engine.handle_timeout(now);
            }
            for route in st.routes.values() {
                route.send.moderation_timer(now);
                if route.recv.cq_id() != route.send.cq_id() {
                    route.recv.moderation_timer(now);
                }
            }
        });
    }
}

/// The earliest deadline of the engine's timers and of the CQs' moderation periods.
fn next_deadline(st: &State) -> u64 {
    let mut deadline = st.engine.poll_timeout().unwrap_or(u64::MAX);
    for route in st.routes.values() {
        for cq in [&route.send, &route.recv] {
            if let Some(d) = cq.moderation_deadline() {
                deadline = deadline.min(d);
            }
        }
    }
    deadline
}

/// Pushes one completion to its CQ. Returns false when it was held back (back-pressure).
fn push_completion(
    routes: &HashMap<u32, Route>,
    c: Completion,
    failed_cqs: &mut Vec<u32>,
    held: &mut VecDeque<Completion>,
) -> bool {
    let qpn = c.wc.qp_num();
    let Some(route) = routes.get(&qpn) else {
        return true;
    };
    let cq = match c.cq {
        CqTarget::Send => &route.send,
        CqTarget::Recv => &route.recv,
    };
    match cq.push(c.wc, c.solicited) {
        Ok(()) => true,
        Err(PushError::Full(wc)) => {
            held.push_front(Completion { wc, ..c });
            false
        }
        Err(PushError::Overrun) | Err(PushError::InError) => {
            if !failed_cqs.contains(&qpn) {
                failed_cqs.push(qpn);
            }
            true
        }
        Err(PushError::Destroyed) => true,
    }
}

/// The 40-byte GRH area a UD receive gets (reference §3.4): for IPv4, 20 zero bytes then
/// the IPv4 header as the sender's kernel built it; for IPv6, the IPv6 header.
fn grh_bytes(from: IpAddr, to: IpAddr, ib_len: usize) -> [u8; 40] {
    let mut grh = [0u8; 40];
    let udp_len = (ib_len + 8) as u16;
    match (from, to) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            if let Ok(header) = softverbs_wire::icrc::linux_ipv4_header(src, dst, 0, 64, udp_len) {
                grh[20..40].copy_from_slice(&header);
            }
        }
        (IpAddr::V6(src), IpAddr::V6(dst)) => {
            grh[0] = 0x60;
            grh[4..6].copy_from_slice(&udp_len.to_be_bytes());
            grh[6] = 17;
            grh[7] = 64;
            grh[8..24].copy_from_slice(&src.octets());
            grh[24..40].copy_from_slice(&dst.octets());
        }
        _ => {}
    }
    grh
}

#[cfg(test)]
mod mtu_tests {
    use super::*;

    #[test]
    fn the_port_mtu_is_the_largest_ib_mtu_whose_packets_fit_the_link() {
        let v4 = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let v6 = IpAddr::V6(std::net::Ipv6Addr::LOCALHOST);
        assert_eq!(largest_ib_mtu(v4, 1500), Mtu::Mtu1024);
        assert_eq!(largest_ib_mtu(v4, 9000), Mtu::Mtu4096);
        assert_eq!(largest_ib_mtu(v4, 4096 + 64), Mtu::Mtu4096);
        assert_eq!(largest_ib_mtu(v4, 4096 + 63), Mtu::Mtu2048);
        assert_eq!(largest_ib_mtu(v6, 4096 + 64), Mtu::Mtu2048);
        assert_eq!(largest_ib_mtu(v4, 576), Mtu::Mtu512);
        assert_eq!(largest_ib_mtu(v4, 100), Mtu::Mtu256);
    }

    #[test]
    fn the_interface_mtu_is_read_from_the_interface_holding_the_address() {
        assert_eq!(interface_mtu(IpAddr::V4(Ipv4Addr::LOCALHOST)), Some(65536));
        // 192.0.2.0/24 is TEST-NET-1: no interface here holds it.
        assert_eq!(interface_mtu(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))), None);
    }
}
