//! RoCEv2 over UDP sockets: the transport that talks to other processes, other hosts,
//! kernel Soft-RoCE and RoCE NICs.
//!
//! # Addresses: one (address, 4791) pair per process
//!
//! Only one plain socket can own `address:4791` (the RoCEv2 port, IBTA Annex A17), so every
//! device process needs its own address. The address is chosen by [`UdpConfig::from_env`], in this order:
//!
//! 1. `SOFTVERBS_ADDR` ([`ADDR_ENV`]) if set: `IP` or `IP:PORT` (`[IPv6]:PORT` for IPv6),
//!    e.g. `10.0.0.5`, `127.0.0.7:4791`, `[::1]:4791`. Binding exactly that, or an error.
//! 2. Otherwise the automatic scheme ([`UdpConfig::default`]): `127.0.0.1:4791`, and if
//!    that is taken (`EADDRINUSE`) `127.0.0.2:4791`, … up to `127.0.0.254:4791`; the first
//!    free one wins. Several processes on one host therefore work with nothing configured
//!    (the loopback range 127.0.0.0/8 is local on Linux), and a peer addresses a process by
//!    its GID `::ffff:127.0.0.x` (§5.7). Binding the unspecified address (`0.0.0.0`, `::`)
//!    is refused: the ICRC covers the source address, so the socket must be bound to the
//!    exact address of the device's GID (§5.2).
//!
//! `SOFTVERBS_PORT` is not a thing: tests that want several transports without touching
//! port 4791 set [`UdpConfig::port`] to 0 (an ephemeral port) in code.
//!
//! # Sending (reference §5.2)
//!
//! The kernel writes the IP header, so the sender predicts it: every socket is
//! **unconnected** with `IP_MTU_DISCOVER = IP_PMTUDISC_DO`, for which Linux sends DF and IPv4
//! ID 0 (checked by `kernel_really_sends_ipv4_id_zero_with_df` in the tests, which reads the
//! datagrams back through a raw socket). The ICRC is computed over
//! [`IpHeaderInfo::linux_ipv4`] / [`IpHeaderInfo::ipv6`] with the configured TOS / traffic
//! class and TTL / hop limit (set on the socket; they are masked anyway). Oversized packets
//! fail with `EMSGSIZE` instead of being fragmented. IPv6 sockets also set
//! `IPV6_MTU_DISCOVER = IPV6_PMTUDISC_DO`.
//!
//! UDP source port (§4.4): a plain socket sends from the port it is bound to, so per-flow
//! entropy needs one socket per source port. With [`SourcePorts::PerFlow`] (the default)
//! the transport opens, on first use, a send-only socket bound to (device address, the
//! requested port in 0xC000–0xFFFF), up to a limit; when the limit is reached, the port is
//! taken, or the hint is outside 0xC000–0xFFFF, the packet goes from the device socket
//! (port 4791), which receivers accept (they ignore the source port, §1.9).
//! [`SourcePorts::Bound`] always uses the device socket. [`Sent::udp`] says which port
//! was used.
//!
//! # Receiving (reference §5.3)
//!
//! Datagrams are read with `recvmsg`, with `IP_RECVTOS` / `IP_RECVTTL` (IPv6:
//! `IPV6_RECVTCLASS` / `IPV6_RECVHOPLIMIT`) so [`Received::ip`] carries the real TOS / ECN
//! bits and TTL. The destination address is the socket's own (it is bound to one unicast
//! address). IPv6 sockets set `UDP_NO_CHECK6_RX` so that zero UDP checksums (what `rxe`
//! sends, §5.2) are accepted.
//!
//! A socket never sees the sender's IPv4 ID, which the ICRC covers: softverbs peers send
//! ID 0, `rxe` a hashed ID per packet, NICs a counter. With [`Ipv4IcrcCheck::AnyId`] (the
//! default) the receiver verifies IPv4 packets over the header a softverbs sender writes
//! (ID 0, DF) and, if that fails, accepts the packet when its ICRC is valid for *some* ID
//! ([`icrc::verify_any_ipv4_id`]): exact for softverbs peers, and for `rxe` and NICs a
//! check that keeps 16 of the ICRC's 32 bits (every single-bit error is still caught) and
//! costs about 50 ns more for such a packet. [`Received::ip`] then carries the sender's ID.
//! [`Ipv4IcrcCheck::IdZero`] accepts only ID 0 (softverbs peers, full 32-bit check);
//! [`Ipv4IcrcCheck::Skip`] accepts IPv4 packets unchecked and counts them
//! (`icrc_unchecked`). [`UdpConfig::from_env`] reads the mode from `SOFTVERBS_IPV4_ICRC`
//! ([`IPV4_ICRC_ENV`]). IPv6 has no ID: its ICRC is always verified exactly.
//!
//! Datagrams shorter than a BTH and an ICRC, not a whole number of 4-byte words, larger
//! than the caller's buffer or with a bad ICRC are dropped and counted; `recv` never
//! panics on network input.

use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use rustix::net::{sockopt, MMsgHdr, SendAncillaryBuffer, SendFlags, SocketAddrAny};
use socket2::{Domain, MaybeUninitSlice, MsgHdrMut, Protocol, SockAddr, Socket, Type};
use softverbs_wire::icrc::{self, IpHeaderInfo};

use crate::transport::{
    bump, path_headers, plausible_packet_len, AtomicCounters, DropReason, Endpoint, OutgoingPacket,
    Received, Sent, Transport, TransportCounters, DEFAULT_PORT,
};

/// The environment variable that sets the device address: `IP`, `IP:PORT` or
/// `[IPv6]:PORT`.
pub const ADDR_ENV: &str = "SOFTVERBS_ADDR";

/// The environment variable that sets [`UdpConfig::ipv4_icrc`]: `check` (the default,
/// [`Ipv4IcrcCheck::AnyId`]), `strict` ([`Ipv4IcrcCheck::IdZero`]) or `skip`
/// ([`Ipv4IcrcCheck::Skip`]).
pub const IPV4_ICRC_ENV: &str = "SOFTVERBS_IPV4_ICRC";

/// How IPv4 ICRCs are checked on receive (see the module documentation). A socket does not
/// see the sender's IPv4 ID, which the ICRC covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Ipv4IcrcCheck {
    /// Accept a packet whose ICRC is valid for some IPv4 ID, all other fields as a
    /// softverbs (Linux, unconnected, `IP_PMTUDISC_DO`) sender writes them (DF set). ID 0
    /// is tried first at no extra cost; another ID costs two GF(2) multiplications and
    /// leaves 16 bits of the check. Works with softverbs peers, `rxe` and NICs.
    #[default]
    AnyId,
    /// Accept only packets valid for ID 0, what a softverbs sender writes: the full 32-bit
    /// check, but packets from `rxe` or NICs are dropped as bad ICRCs.
    IdZero,
    /// Accept IPv4 packets without an ICRC check and count them (`icrc_unchecked`).
    Skip,
}

impl Ipv4IcrcCheck {
    /// Parses the value of `SOFTVERBS_IPV4_ICRC`: `check`, `strict` or `skip` (ASCII case
    /// and surrounding blanks ignored). `InvalidInput` otherwise.
    pub fn parse(value: &str) -> io::Result<Ipv4IcrcCheck> {
        match value.trim().to_ascii_lowercase().as_str() {
            "check" => Ok(Ipv4IcrcCheck::AnyId),
            "strict" => Ok(Ipv4IcrcCheck::IdZero),
            "skip" => Ok(Ipv4IcrcCheck::Skip),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{IPV4_ICRC_ENV}={value:?} is not check, strict or skip"),
            )),
        }
    }
}

/// Which UDP source port a packet goes from (reference §4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SourcePorts {
    /// Always the device socket's port (4791 by default).
    Bound,
    /// The caller's hint, through a send-only socket per port, opened on first use, at
    /// most `max_sockets` of them; the device port when that is not possible.
    PerFlow {
        /// Most extra sockets to open.
        max_sockets: usize,
    },
}

impl Default for SourcePorts {
    fn default() -> SourcePorts {
        SourcePorts::PerFlow { max_sockets: 64 }
    }
}

/// Configuration of a [`UdpTransport`]. `Default` is the automatic scheme of the module
/// documentation: no address (try 127.0.0.1 … 127.0.0.254), port 4791.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UdpConfig {
    /// The device address; `None` picks the first free 127.0.0.x (x = 1..=254).
    pub address: Option<IpAddr>,
    /// The UDP port to receive on (4791; 0 for an ephemeral port, in tests).
    pub port: u16,
    /// IPv4 TOS / IPv6 traffic class of sent packets (DSCP and ECN; masked out of the
    /// ICRC).
    pub traffic_class: u8,
    /// IPv4 TTL / IPv6 hop limit of sent packets (masked out of the ICRC).
    pub hop_limit: u8,
    /// How IPv4 ICRCs are checked on receive.
    pub ipv4_icrc: Ipv4IcrcCheck,
    /// Which UDP source port packets go from.
    pub source_ports: SourcePorts,
}

impl Default for UdpConfig {
    fn default() -> UdpConfig {
        UdpConfig {
            address: None,
            port: DEFAULT_PORT,
            traffic_class: 0,
            hop_limit: 64,
            ipv4_icrc: Ipv4IcrcCheck::default(),
            source_ports: SourcePorts::default(),
        }
    }
}

impl UdpConfig {
    /// The default configuration with the address (and port) of `SOFTVERBS_ADDR` and the
    /// IPv4 ICRC check of `SOFTVERBS_IPV4_ICRC` ([`Ipv4IcrcCheck::parse`]) where those are
    /// set. `InvalidInput` if one is set but cannot be parsed.
    pub fn from_env() -> io::Result<UdpConfig> {
        let mut config = UdpConfig::default();
        if let Some(value) = std::env::var_os(IPV4_ICRC_ENV) {
            let value = value.to_str().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{IPV4_ICRC_ENV} is not UTF-8"),
                )
            })?;
            config.ipv4_icrc = Ipv4IcrcCheck::parse(value)?;
        }
        if let Some(spec) = std::env::var_os(ADDR_ENV) {
            let spec = spec.to_str().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{ADDR_ENV} is not UTF-8"),
                )
            })?;
            let (address, port) = parse_address(spec)?;
            config.address = Some(address);
            if let Some(port) = port {
                config.port = port;
            }
        }
        Ok(config)
    }
}

/// Parses a device address as `SOFTVERBS_ADDR` gives it: `IP`, `IP:PORT` or `[IPv6]:PORT`.
///
/// ```
/// # use softverbs_device::udp::parse_address;
/// assert_eq!(parse_address("127.0.0.7").unwrap(), ("127.0.0.7".parse().unwrap(), None));
/// assert_eq!(parse_address("[::1]:4000").unwrap(), ("::1".parse().unwrap(), Some(4000)));
/// assert!(parse_address("localhost").is_err());
/// ```
pub fn parse_address(spec: &str) -> io::Result<(IpAddr, Option<u16>)> {
    let spec = spec.trim();
    if let Ok(addr) = spec.parse::<IpAddr>() {
        return Ok((addr, None));
    }
    if let Ok(addr) = spec.parse::<SocketAddr>() {
        return Ok((addr.ip(), Some(addr.port())));
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{ADDR_ENV}={spec:?} is not IP, IP:PORT or [IPv6]:PORT"),
    ))
}

/// RoCEv2 over UDP. See the module documentation.
#[derive(Debug)]
pub struct UdpTransport {
    socket: Socket,
    local: Endpoint,
    config: UdpConfig,
    /// Send-only sockets per UDP source port ([`SourcePorts::PerFlow`]); `None` marks a
    /// port that could not be bound, so it is not retried on every packet.
    flow_sockets: RwLock<HashMap<u16, Option<Arc<Socket>>>>,
    counters: AtomicCounters,
}

const IPV6_PMTUDISC_DO: i32 = 2;
/// `UDP_NO_CHECK6_RX` (linux/udp.h): accept zero UDP checksums over IPv6.
const UDP_NO_CHECK6_RX: libc::c_int = 102;

/// Sets an `int` socket option that neither socket2 nor rustix offers.
fn set_int_option(
    socket: &Socket,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the fd is open for the duration of the call (borrowed from `socket`), and the
    // option value pointer / length describe a live `c_int` on this stack frame.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A UDP socket bound to `addr`, set up for RoCEv2 as the module documentation says.
fn rocev2_socket(addr: SocketAddr, config: &UdpConfig, receive: bool) -> io::Result<Socket> {
    let domain = Domain::for_address(addr);
    let socket = Socket::new(domain, Type::DGRAM.cloexec(), Some(Protocol::UDP))?;
    match addr {
        SocketAddr::V4(_) => {
            sockopt::set_ip_mtu_discover(socket.as_fd(), sockopt::Ipv4PathMtuDiscovery::DO)?;
            socket.set_tos(u32::from(config.traffic_class))?;
            socket.set_ttl(u32::from(config.hop_limit))?;
            if receive {
                socket.set_recv_tos(true)?;
                set_int_option(&socket, libc::IPPROTO_IP, libc::IP_RECVTTL, 1)?;
            }
        }
        SocketAddr::V6(_) => {
            socket.set_only_v6(true)?;
            set_int_option(
                &socket,
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                IPV6_PMTUDISC_DO,
            )?;
            socket.set_tclass_v6(u32::from(config.traffic_class))?;
            socket.set_unicast_hops_v6(u32::from(config.hop_limit))?;
            if receive {
                socket.set_recv_tclass_v6(true)?;
                socket.set_recv_hoplimit_v6(true)?;
                set_int_option(&socket, libc::IPPROTO_UDP, UDP_NO_CHECK6_RX, 1)?;
            }
        }
    }
    if receive {
        // socket(7) SO_RXQ_OVFL: every datagram received carries the socket's count of
        // datagrams dropped for lack of buffer space, so those drops are counted too.
        set_int_option(&socket, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, 1)?;
        // A requester keeps up to `max_unacked_psns` packets (128 of up to 4 KiB) in flight
        // per QP: the default 208 KiB receive buffer overflows under one such burst and
        // every overflow costs a go-back-N retransmission. Ask for 8 MiB; the kernel caps
        // it at `net.core.rmem_max` (as root, SO_RCVBUFFORCE passes the cap).
        const RECEIVE_BUFFER: usize = 8 << 20;
        if set_int_option(
            &socket,
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            RECEIVE_BUFFER as libc::c_int,
        )
        .is_err()
        {
            let _ = socket.set_recv_buffer_size(RECEIVE_BUFFER);
        }
    }
    let _ = socket.set_send_buffer_size(4 << 20);
    socket.bind(&SockAddr::from(addr))?;
    Ok(socket)
}

/// The error of binding the device socket to `addr`, saying which address and port and,
/// where there is one, the fix. The kind stays the operating system's (`AddrInUse`,
/// `AddrNotAvailable`, …) so callers can still match on it; the message is one line.
fn bind_error(addr: SocketAddr, error: io::Error) -> io::Error {
    let message = match error.kind() {
        io::ErrorKind::AddrInUse => format!(
            "UDP {addr} is already in use ({error}), by another softverbs device or program: \
             give this device another address with {ADDR_ENV} (`softverbs run --addr`), or \
             leave {ADDR_ENV} unset to take the first free 127.0.0.x"
        ),
        io::ErrorKind::AddrNotAvailable => format!(
            "{} is not an address of this host, so the device cannot bind UDP {addr} \
             ({error}): set {ADDR_ENV} to one of the host's addresses (`ip address`), or \
             leave it unset to take the first free 127.0.0.x",
            addr.ip()
        ),
        io::ErrorKind::PermissionDenied => format!(
            "binding UDP {addr} is not permitted ({error}): ports below 1024 need privileges; \
             give another port in {ADDR_ENV} (IP:PORT)"
        ),
        _ => format!("cannot open the device's UDP socket on {addr}: {error}"),
    };
    io::Error::new(error.kind(), message)
}

/// Views an initialised byte buffer as `MaybeUninit` bytes for `recvmsg`.
fn as_uninit(buf: &mut [u8]) -> &mut [MaybeUninit<u8>] {
    // SAFETY: `MaybeUninit<u8>` has the layout of `u8`; the slice starts initialised and
    // `recvmsg` only ever writes initialised bytes into it, so it stays a valid `[u8]`.
    unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast(), buf.len()) }
}

/// TOS / TTL (IPv6: traffic class / hop limit) and the socket's drop count found in the
/// ancillary data of `recvmsg`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Ancillary {
    traffic_class: Option<u8>,
    hop_limit: Option<u8>,
    /// `SO_RXQ_OVFL` (socket(7)): datagrams the socket dropped since it was opened, sent
    /// by Linux only once there is at least one.
    socket_drops: Option<u32>,
}

/// Reads the control messages Linux delivers (`struct cmsghdr`: `size_t len; int level;
/// int type;` then data, each aligned to `size_t`). Never panics: a malformed buffer ends
/// the walk.
fn parse_ancillary(control: &[u8]) -> Ancillary {
    const ALIGN: usize = std::mem::size_of::<usize>();
    let header_len = std::mem::size_of::<libc::cmsghdr>();
    let align = |n: usize| n.div_ceil(ALIGN) * ALIGN;
    let int_at = |bytes: &[u8]| -> Option<u8> {
        match bytes.len() {
            1 => Some(bytes[0]),
            4.. => {
                let value = i32::from_ne_bytes(bytes[..4].try_into().ok()?);
                u8::try_from(value).ok()
            }
            _ => None,
        }
    };
    let mut found = Ancillary::default();
    let mut at = 0;
    while let Some(header) = control.get(at..at + header_len) {
        let len = usize::from_ne_bytes(header[..ALIGN].try_into().unwrap_or([0; ALIGN]));
        let level = i32::from_ne_bytes(header[ALIGN..ALIGN + 4].try_into().unwrap_or([0; 4]));
        let kind = i32::from_ne_bytes(header[ALIGN + 4..ALIGN + 8].try_into().unwrap_or([0; 4]));
        if len < header_len {
            break;
        }
        let Some(data) = control.get(at + header_len..at + len) else {
            break;
        };
        match (level, kind) {
            (libc::IPPROTO_IP, libc::IP_TOS) | (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                found.traffic_class = int_at(data);
            }
            (libc::IPPROTO_IP, libc::IP_TTL) | (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT) => {
                found.hop_limit = int_at(data);
            }
            (libc::SOL_SOCKET, libc::SO_RXQ_OVFL) => {
                found.socket_drops = data
                    .get(..4)
                    .and_then(|bytes| bytes.try_into().ok())
                    .map(u32::from_ne_bytes);
            }
            _ => {}
        }
        at += align(len);
    }
    found
}

impl UdpTransport {
    /// Opens the transport `config` describes (see the module documentation for the
    /// automatic address). Errors: `InvalidInput` for an unspecified or multicast address,
    /// `AddrInUse` if the address (or every automatic one) is taken, other socket errors.
    pub fn bind(config: UdpConfig) -> io::Result<UdpTransport> {
        let (socket, addr) = match config.address {
            Some(address) => {
                if address.is_unspecified() || address.is_multicast() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "device address {address} is not one unicast address: the ICRC \
                             covers the source address, so the device binds exactly its own; \
                             set {ADDR_ENV} to an address of this host (e.g. 127.0.0.1), or \
                             leave it unset to take the first free 127.0.0.x"
                        ),
                    ));
                }
                let addr = SocketAddr::new(Endpoint::new(address, 0).addr(), config.port);
                let socket = rocev2_socket(addr, &config, true).map_err(|e| bind_error(addr, e))?;
                (socket, addr)
            }
            None => Self::bind_automatic(&config)?,
        };
        let bound = socket
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("socket has no IP address"))?;
        tracing::debug!(local = %bound, requested = %addr, "UDP RoCEv2 transport bound");
        Ok(UdpTransport {
            socket,
            local: Endpoint::from(bound),
            config,
            flow_sockets: RwLock::new(HashMap::new()),
            counters: AtomicCounters::default(),
        })
    }

    /// [`UdpTransport::bind`] with [`UdpConfig::from_env`].
    pub fn from_env() -> io::Result<UdpTransport> {
        UdpTransport::bind(UdpConfig::from_env()?)
    }

    fn bind_automatic(config: &UdpConfig) -> io::Result<(Socket, SocketAddr)> {
        for host in 1..=254u8 {
            let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, host)), config.port);
            match rocev2_socket(addr, config, true) {
                Ok(socket) => return Ok((socket, addr)),
                Err(error) if error.kind() == io::ErrorKind::AddrInUse => continue,
                Err(error) => return Err(bind_error(addr, error)),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "127.0.0.1..=127.0.0.254 port {} are all taken; set {ADDR_ENV}",
                config.port
            ),
        ))
    }

    /// The configuration the transport was opened with.
    pub fn config(&self) -> &UdpConfig {
        &self.config
    }

    /// The socket a packet with source port hint `src_port` goes from, and its port.
    fn source_socket(&self, src_port: u16) -> (Option<Arc<Socket>>, u16) {
        let SourcePorts::PerFlow { max_sockets } = self.config.source_ports else {
            return (None, self.local.port());
        };
        if src_port < 0xC000 || src_port == self.local.port() {
            return (None, self.local.port());
        }
        let found = self
            .flow_sockets
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&src_port)
            .cloned();
        let entry = match found {
            Some(entry) => entry,
            None => {
                let mut sockets = self
                    .flow_sockets
                    .write()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                if sockets.len() >= max_sockets && !sockets.contains_key(&src_port) {
                    None
                } else {
                    sockets
                        .entry(src_port)
                        .or_insert_with(|| {
                            let addr = SocketAddr::new(self.local.addr(), src_port);
                            match rocev2_socket(addr, &self.config, false) {
                                Ok(socket) => {
                                    // Send-only: keep what strays in small.
                                    let _ = socket.set_recv_buffer_size(1);
                                    Some(Arc::new(socket))
                                }
                                Err(error) => {
                                    tracing::debug!(%addr, %error, "no per-flow source socket");
                                    None
                                }
                            }
                        })
                        .clone()
                }
            }
        };
        match entry {
            Some(socket) => (Some(socket), src_port),
            None => (None, self.local.port()),
        }
    }

    fn receive_one(&self, buf: &mut [u8]) -> io::Result<Result<Received, DropReason>> {
        let mut control = Control::new();
        let mut from = SockAddr::from(SocketAddr::new(self.local.addr(), 0));
        let (len, truncated, control_len) = {
            let mut bufs = [MaybeUninitSlice::new(as_uninit(buf))];
            let mut msg = MsgHdrMut::new()
                .with_addr(&mut from)
                .with_buffers(&mut bufs)
                .with_control(as_uninit(&mut control.0));
            bump(&self.counters.recv_calls);
            let len = self
                .socket
                .recvmsg(&mut msg, libc::MSG_DONTWAIT | libc::MSG_TRUNC)?;
            (len, msg.flags().is_truncated(), msg.control_len())
        };
        let control = control.0.get(..control_len).unwrap_or(&[]);
        let checked = self
            .check_datagram(buf, len, truncated, from.as_socket(), control)
            .inspect(|packet| self.count_accepted(packet));
        Ok(checked)
    }

    /// Takes up to [`MAX_BATCH`] datagrams off the socket with one `recvmmsg(2)`
    /// (`MSG_DONTWAIT`), checks each as [`UdpTransport::receive_one`] does and appends the
    /// good ones to `received`, packet `k` moved to `bufs[k]`. Returns how many datagrams
    /// were taken, good or dropped; `WouldBlock` if there were none.
    fn receive_many(
        &self,
        bufs: &mut [&mut [u8]],
        received: &mut Vec<Received>,
    ) -> io::Result<usize> {
        let count = bufs.len().min(MAX_BATCH);
        if count == 0 {
            return Ok(0);
        }
        let mut batch = ReceiveBatch::new();
        let mut slots = bufs.iter_mut().map(|buf| &mut **buf);
        let taken = self.receive_into(&mut batch, &mut slots, count)?;
        for index in 0..taken {
            let datagram = batch.datagram(index);
            let slot = received.len();
            match self.check_datagram(
                bufs[index],
                datagram.len,
                datagram.truncated,
                datagram.from,
                datagram.control,
            ) {
                Ok(packet) => {
                    self.count_accepted(&packet);
                    bufs.swap(slot, index);
                    received.push(packet);
                }
                Err(reason) => {
                    tracing::trace!(?reason, "dropped a datagram");
                    self.counters.count_drop(reason);
                }
            }
        }
        Ok(taken)
    }

    /// One `recvmmsg(2)` (`MSG_DONTWAIT`) of up to `count` datagrams into the first
    /// `count` buffers `slots` yields, with `batch` for their addresses and control
    /// messages. Returns how many were taken; `WouldBlock` if there were none.
    fn receive_into<'a>(
        &self,
        batch: &mut ReceiveBatch,
        slots: &mut impl Iterator<Item = &'a mut [u8]>,
        count: usize,
    ) -> io::Result<usize> {
        let mut count = count.min(MAX_BATCH);
        let ReceiveBatch {
            controls,
            addresses,
            iovecs,
            messages,
        } = batch;
        for index in 0..count {
            let Some(buf) = slots.next() else {
                count = index;
                break;
            };
            iovecs[index] = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            let header = &mut messages[index].msg_hdr;
            header.msg_name = (&mut addresses[index] as *mut libc::sockaddr_storage).cast();
            header.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            header.msg_iov = &mut iovecs[index];
            header.msg_iovlen = 1;
            header.msg_control = controls[index].0.as_mut_ptr().cast();
            header.msg_controllen = controls[index].0.len() as _;
        }
        if count == 0 {
            return Ok(0);
        }
        bump(&self.counters.recv_calls);
        // SAFETY: the fd is open (borrowed from `self.socket`) for the call. Each of the
        // first `count` messages points at live memory that nothing else touches during
        // the call: its address storage and control buffer in `batch`, and one iovec over
        // a buffer `slots` lent exclusively for `'a` (which outlives this call), each with
        // its true length, which the kernel writes within. No timeout: MSG_DONTWAIT.
        let taken = unsafe {
            libc::recvmmsg(
                self.socket.as_raw_fd(),
                messages.as_mut_ptr(),
                count as libc::c_uint,
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                std::ptr::null_mut(),
            )
        };
        let taken = usize::try_from(taken).map_err(|_| io::Error::last_os_error())?;
        Ok(taken.min(count))
    }

    /// Counts a packet handed out.
    fn count_accepted(&self, packet: &Received) {
        self.counters.count_received(packet.len);
        if !packet.icrc_checked {
            bump(&self.counters.icrc_unchecked);
        }
    }

    /// Reads the ancillary data of a datagram, keeping the socket's drop count.
    fn check_ancillary(&self, control: &[u8]) -> Ancillary {
        let ancillary = parse_ancillary(control);
        if let Some(drops) = ancillary.socket_drops {
            self.counters
                .socket_drops
                .fetch_max(u64::from(drops), Ordering::Relaxed);
        }
        ancillary
    }

    /// Checks a datagram of `len` bytes (its real length) taken into `buf` from `from`,
    /// with the ancillary data `control`: a packet to hand out, or why it is dropped.
    fn check_datagram(
        &self,
        buf: &[u8],
        len: usize,
        truncated: bool,
        from: Option<SocketAddr>,
        control: &[u8],
    ) -> Result<Received, DropReason> {
        let ancillary = self.check_ancillary(control);
        if truncated {
            return Err(DropReason::Truncated);
        }
        let bytes = buf.get(..len).ok_or(DropReason::Truncated)?;
        let from = from.ok_or(DropReason::Malformed)?;
        self.check_packet(bytes, Endpoint::from(from), &ancillary)
    }

    /// Checks one packet from `from`, with the ancillary data of its datagram: a packet to
    /// hand out, or why it is dropped. Counts nothing.
    fn check_packet(
        &self,
        packet: &[u8],
        from: Endpoint,
        ancillary: &Ancillary,
    ) -> Result<Received, DropReason> {
        let len = packet.len();
        if !plausible_packet_len(len) {
            return Err(DropReason::Malformed);
        }
        let traffic_class = ancillary.traffic_class.unwrap_or(0);
        let hop_limit = ancillary.hop_limit.unwrap_or(self.config.hop_limit);
        let Ok((mut ip, mut udp)) = path_headers(
            &from,
            &self.local,
            from.port(),
            traffic_class,
            hop_limit,
            len,
        ) else {
            return Err(DropReason::Malformed);
        };
        udp.dst_port = self.local.port();
        let icrc_checked = match (ip, self.config.ipv4_icrc) {
            (IpHeaderInfo::V4 { .. }, Ipv4IcrcCheck::Skip) => false,
            (IpHeaderInfo::V4 { .. }, Ipv4IcrcCheck::AnyId) => {
                // ID 0 (softverbs peers) costs one verify; another ID two multiplications.
                let Ok(sent) = icrc::verify_any_ipv4_id(&ip, &udp, packet) else {
                    return Err(DropReason::BadIcrc);
                };
                ip = sent;
                true
            }
            _ => {
                if icrc::verify(&ip, &udp, packet).is_err() {
                    return Err(DropReason::BadIcrc);
                }
                true
            }
        };
        Ok(Received {
            from,
            to: self.local,
            len,
            ip,
            udp,
            icrc_checked,
        })
    }

    /// Sends `packets` (all prepared for `socket`) with as few `sendmmsg(2)` calls as it
    /// takes, in order; sets `sent` of each one the kernel took.
    fn transmit_group(&self, socket: &Socket, packets: &mut [OutgoingPacket<'_>]) {
        for chunk in packets.chunks_mut(MAX_SEND_BATCH) {
            let addresses: Vec<SocketAddrAny> = chunk
                .iter()
                .map(|packet| SocketAddrAny::from(packet.to.socket_addr()))
                .collect();
            let iovecs: Vec<[IoSlice<'_>; 1]> = chunk
                .iter()
                .map(|packet| [IoSlice::new(packet.bytes)])
                .collect();
            let mut controls: Vec<SendAncillaryBuffer<'_, '_, '_>> = chunk
                .iter()
                .map(|_| SendAncillaryBuffer::default())
                .collect();
            let mut messages: Vec<MMsgHdr<'_>> = addresses
                .iter()
                .zip(&iovecs)
                .zip(controls.iter_mut())
                .map(|((address, iov), control)| MMsgHdr::new_with_addr(address, iov, control))
                .collect();
            let mut done = vec![false; chunk.len()];
            let mut at = 0;
            let mut retries = 0;
            while at < messages.len() {
                bump(&self.counters.send_calls);
                match rustix::net::sendmmsg(socket, &mut messages[at..], SendFlags::empty()) {
                    Ok(0) => {
                        // Nothing taken and no error: count the head as failed so the loop
                        // always moves on.
                        bump(&self.counters.send_errors);
                        at += 1;
                    }
                    Ok(taken) => {
                        for (offset, message) in messages[at..at + taken].iter().enumerate() {
                            let index = at + offset;
                            if message.bytes_sent() == iovecs[index][0].len() {
                                self.counters.count_sent(message.bytes_sent());
                                done[index] = true;
                            } else {
                                bump(&self.counters.send_errors);
                            }
                        }
                        at += taken;
                    }
                    Err(rustix::io::Errno::INTR) => {}
                    // The send buffer is full for now (sendmmsg(2): the rest can be
                    // retried from the first message not sent): a few more tries, then
                    // the packet counts as failed, like a loss the peer recovers from.
                    Err(rustix::io::Errno::AGAIN | rustix::io::Errno::NOBUFS)
                        if retries < SEND_RETRIES =>
                    {
                        retries += 1;
                        std::thread::yield_now();
                    }
                    Err(errno) => {
                        bump(&self.counters.send_errors);
                        tracing::debug!(
                            error = %io::Error::from(errno),
                            to = %chunk[at].to.addr(),
                            "send failed"
                        );
                        at += 1;
                    }
                }
            }
            drop(messages);
            drop(controls);
            drop(iovecs);
            for (packet, done) in chunk.iter_mut().zip(done) {
                if !done {
                    packet.sent = None;
                }
            }
        }
    }
}

/// The most datagrams one `recvmmsg(2)` takes.
pub const MAX_BATCH: usize = 64;

/// The most datagrams one `sendmmsg(2)` is given (`UIO_MAXIOV`, sendmmsg(2)).
const MAX_SEND_BATCH: usize = 1024;

/// How many times a batch send retries after `EAGAIN` / `ENOBUFS` before it counts the
/// packet it is at as failed.
const SEND_RETRIES: u32 = 8;

/// A control-message buffer for one `recvmsg`, aligned for `struct cmsghdr`.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct Control([u8; 128]);

impl Control {
    const fn new() -> Control {
        Control([0; 128])
    }
}

/// The addresses, control buffers, iovecs and headers of one `recvmmsg(2)`
/// ([`UdpTransport::receive_into`] points the headers at the rest and at the buffers).
struct ReceiveBatch {
    controls: [Control; MAX_BATCH],
    addresses: [libc::sockaddr_storage; MAX_BATCH],
    iovecs: [libc::iovec; MAX_BATCH],
    messages: [libc::mmsghdr; MAX_BATCH],
}

/// What `recvmmsg(2)` says of one datagram it took.
struct Datagram<'a> {
    /// Its real length (`MSG_TRUNC`, recv(2)).
    len: usize,
    /// Whether it was longer than its buffer.
    truncated: bool,
    /// The sender.
    from: Option<SocketAddr>,
    /// Its control messages.
    control: &'a [u8],
}

impl ReceiveBatch {
    fn new() -> ReceiveBatch {
        ReceiveBatch {
            controls: [Control::new(); MAX_BATCH],
            // SAFETY: `sockaddr_storage` is plain old data, for which all zeroes is valid.
            addresses: unsafe { std::mem::zeroed() },
            iovecs: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; MAX_BATCH],
            // SAFETY: `mmsghdr` is plain old data (pointers, lengths, flags), for which all
            // zeroes is valid: null pointers with zero lengths.
            messages: unsafe { std::mem::zeroed() },
        }
    }

    /// Datagram `index` of those the last `recvmmsg(2)` took (`index` below its count).
    fn datagram(&self, index: usize) -> Datagram<'_> {
        let message = &self.messages[index];
        let address_len = message
            .msg_hdr
            .msg_namelen
            .min(std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t);
        // SAFETY: the kernel wrote a socket address of `address_len` bytes (at most the
        // storage's size, which it was told, and clamped to it) into this storage; a
        // storage it did not write is all zeroes, an address of no family.
        let from = unsafe { SockAddr::new(self.addresses[index], address_len) };
        // `size_t` on glibc, `socklen_t` elsewhere.
        let control_len: usize = message.msg_hdr.msg_controllen as _;
        Datagram {
            len: message.msg_len as usize,
            truncated: message.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
            from: from.as_socket(),
            control: self.controls[index].0.get(..control_len).unwrap_or(&[]),
        }
    }
}

/// Waits until `fd` is readable or `timeout` passes (`None`: forever). True if readable.
fn wait_readable(fd: impl AsFd, timeout: Option<Duration>) -> io::Result<bool> {
    let timespec = timeout.map(|t| rustix::event::Timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: i64::from(t.subsec_nanos()),
    });
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    match rustix::event::poll(&mut fds, timespec.as_ref()) {
        Ok(n) => Ok(n > 0),
        Err(rustix::io::Errno::INTR) => Ok(false),
        Err(errno) => Err(errno.into()),
    }
}

impl Transport for UdpTransport {
    fn local(&self) -> Endpoint {
        self.local
    }

    fn prepare(&self, to: &Endpoint, src_port: u16, ib_packet: &mut [u8]) -> io::Result<Sent> {
        let (_, port) = self.source_socket(src_port);
        let (ip, udp) = path_headers(
            &self.local,
            to,
            port,
            self.config.traffic_class,
            self.config.hop_limit,
            ib_packet.len(),
        )?;
        let icrc = icrc::fill(&ip, &udp, ib_packet).map_err(crate::transport::invalid_input)?;
        Ok(Sent {
            from: self.local,
            ip,
            udp,
            icrc,
        })
    }

    fn transmit(&self, to: &Endpoint, sent: &Sent, ib_packet: &[u8]) -> io::Result<()> {
        let (flow_socket, _) = self.source_socket(sent.udp.src_port);
        let socket = flow_socket.as_deref().unwrap_or(&self.socket);
        bump(&self.counters.send_calls);
        let result = socket.send_to(ib_packet, &SockAddr::from(to.socket_addr()));
        match result {
            Ok(n) if n == ib_packet.len() => {
                self.counters.count_sent(n);
                Ok(())
            }
            Ok(n) => {
                bump(&self.counters.send_errors);
                Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("sent {n} of {} bytes", ib_packet.len()),
                ))
            }
            Err(error) => {
                bump(&self.counters.send_errors);
                Err(error)
            }
        }
    }

    fn recv(&self, buf: &mut [u8], timeout: Option<Duration>) -> io::Result<Option<Received>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            match self.receive_one(buf) {
                Ok(Ok(received)) => return Ok(Some(received)),
                Ok(Err(reason)) => {
                    tracing::trace!(?reason, "dropped a datagram");
                    self.counters.count_drop(reason);
                    continue;
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                // ICMP errors queued on the socket (e.g. port unreachable after a send to
                // a closed port) are not about this receive: read the next datagram.
                Err(error) if error.kind() == io::ErrorKind::ConnectionRefused => continue,
                Err(error) => return Err(error),
            }
            let remaining = match deadline {
                None => None,
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Ok(None);
                    }
                    Some(deadline - now)
                }
            };
            wait_readable(&self.socket, remaining)?;
        }
    }

    /// Prepares every packet, then hands each run of consecutive packets that leave from
    /// the same socket (the same UDP source port, see [`SourcePorts`]) to one
    /// `sendmmsg(2)`, in order.
    fn send_batch(&self, packets: &mut [OutgoingPacket<'_>]) -> usize {
        let mut sockets: Vec<Option<Arc<Socket>>> = Vec::with_capacity(packets.len());
        for packet in packets.iter_mut() {
            let (socket, port) = self.source_socket(packet.src_port);
            packet.sent = path_headers(
                &self.local,
                &packet.to,
                port,
                self.config.traffic_class,
                self.config.hop_limit,
                packet.bytes.len(),
            )
            .and_then(|(ip, udp)| {
                let icrc =
                    icrc::fill(&ip, &udp, packet.bytes).map_err(crate::transport::invalid_input)?;
                Ok(Sent {
                    from: self.local,
                    ip,
                    udp,
                    icrc,
                })
            })
            .inspect_err(|error| {
                tracing::debug!(%error, to = %packet.to.addr(), "send failed");
            })
            .ok();
            sockets.push(socket);
        }
        // Runs of packets for one socket; a packet that could not be prepared ends a run.
        let same = |a: &Option<Arc<Socket>>, b: &Option<Arc<Socket>>| match (a, b) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        let mut start = 0;
        while start < packets.len() {
            if packets[start].sent.is_none() {
                start += 1;
                continue;
            }
            let mut end = start + 1;
            while end < packets.len()
                && packets[end].sent.is_some()
                && same(&sockets[start], &sockets[end])
            {
                end += 1;
            }
            let socket = sockets[start].as_deref().unwrap_or(&self.socket);
            self.transmit_group(socket, &mut packets[start..end]);
            start = end;
        }
        packets
            .iter()
            .filter(|packet| packet.sent.is_some())
            .count()
    }

    /// Takes what is queued with `recvmmsg(2)`, up to [`MAX_BATCH`] datagrams a call,
    /// waiting (without the call) up to `timeout` for the first.
    fn recv_batch(
        &self,
        bufs: &mut [&mut [u8]],
        received: &mut Vec<Received>,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        received.clear();
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            match self.receive_many(bufs, received) {
                Ok(_) if !received.is_empty() => return Ok(received.len()),
                // Every datagram taken was dropped: look again at once.
                Ok(taken) if taken > 0 => continue,
                Ok(_) => return Ok(0), // no buffers
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                // ICMP errors queued on the socket are not about this receive (as `recv`).
                Err(error) if error.kind() == io::ErrorKind::ConnectionRefused => continue,
                Err(error) => return Err(error),
            }
            let remaining = match deadline {
                None => None,
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Ok(0);
                    }
                    Some(deadline - now)
                }
            };
            wait_readable(&self.socket, remaining)?;
        }
    }

    fn counters(&self) -> TransportCounters {
        self.counters.snapshot()
    }

    fn wait_readable(&self, timeout: Duration) -> io::Result<()> {
        wait_readable(&self.socket, Some(timeout)).map(|_| ())
    }

    fn readiness_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.socket.as_fd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ancillary_parser_reads_tos_ttl_and_socket_drops_and_survives_garbage() {
        let mut control = Vec::new();
        let push = |control: &mut Vec<u8>, level: i32, kind: i32, data: &[u8]| {
            let header = std::mem::size_of::<libc::cmsghdr>();
            control.extend_from_slice(&(header + data.len()).to_ne_bytes());
            control.extend_from_slice(&level.to_ne_bytes());
            control.extend_from_slice(&kind.to_ne_bytes());
            control.extend_from_slice(data);
            while !control.len().is_multiple_of(std::mem::size_of::<usize>()) {
                control.push(0);
            }
        };
        push(&mut control, libc::IPPROTO_IP, libc::IP_TOS, &[0x02]);
        push(
            &mut control,
            libc::IPPROTO_IP,
            libc::IP_TTL,
            &64i32.to_ne_bytes(),
        );
        // socket(7) SO_RXQ_OVFL: a u32 count of datagrams the socket dropped.
        push(
            &mut control,
            libc::SOL_SOCKET,
            libc::SO_RXQ_OVFL,
            &70_000u32.to_ne_bytes(),
        );
        assert_eq!(
            parse_ancillary(&control),
            Ancillary {
                traffic_class: Some(2),
                hop_limit: Some(64),
                socket_drops: Some(70_000),
            }
        );
        for len in 0..control.len() {
            let _ = parse_ancillary(&control[..len]);
        }
        let mut garbage = control.clone();
        garbage[0] = 0xFF;
        let _ = parse_ancillary(&garbage);
        assert_eq!(parse_ancillary(&[0u8; 40]), Ancillary::default());
    }

    #[test]
    fn address_spec_forms() {
        assert_eq!(
            parse_address(" 127.0.0.9:4791 ").unwrap(),
            ("127.0.0.9".parse().unwrap(), Some(4791))
        );
        assert_eq!(
            parse_address("::1").unwrap(),
            ("::1".parse().unwrap(), None)
        );
        assert!(parse_address("127.0.0.1:99999").is_err());
        assert!(parse_address("").is_err());
    }

    #[test]
    fn ipv4_icrc_mode_spellings() {
        assert_eq!(Ipv4IcrcCheck::default(), Ipv4IcrcCheck::AnyId);
        assert_eq!(Ipv4IcrcCheck::parse("check").unwrap(), Ipv4IcrcCheck::AnyId);
        assert_eq!(
            Ipv4IcrcCheck::parse(" Strict ").unwrap(),
            Ipv4IcrcCheck::IdZero
        );
        assert_eq!(Ipv4IcrcCheck::parse("SKIP").unwrap(), Ipv4IcrcCheck::Skip);
        for bad in ["", "off", "id0", "skip,check"] {
            let error = Ipv4IcrcCheck::parse(bad).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
    }

    #[test]
    fn unspecified_address_is_refused() {
        let config = UdpConfig {
            address: Some("0.0.0.0".parse().unwrap()),
            port: 0,
            ..UdpConfig::default()
        };
        let error = UdpTransport::bind(config).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        assert!(error.to_string().contains(ADDR_ENV), "{error}");
    }

    #[test]
    fn an_address_in_use_names_the_address_the_port_and_the_fix() {
        let first = UdpTransport::bind(UdpConfig {
            address: Some("127.0.0.77".parse().unwrap()),
            port: 0,
            ..UdpConfig::default()
        })
        .unwrap();
        let port = first.local().port();
        let error = UdpTransport::bind(UdpConfig {
            address: Some("127.0.0.77".parse().unwrap()),
            port,
            ..UdpConfig::default()
        })
        .unwrap_err();
        // The kind stays the operating system's: callers (and errno) still match on it.
        assert_eq!(error.kind(), io::ErrorKind::AddrInUse);
        let text = error.to_string();
        assert!(
            text.contains(&format!("UDP 127.0.0.77:{port} is already in use"))
                && text.contains(ADDR_ENV)
                && !text.contains('\n'),
            "{text}"
        );
    }

    #[test]
    fn an_address_of_another_host_says_so_and_names_the_variable() {
        // 192.0.2.1 (TEST-NET-1, RFC 5737) is no address of this host: bind(2) refuses it
        // with EADDRNOTAVAIL at once, and no packet is sent.
        let error = UdpTransport::bind(UdpConfig {
            address: Some("192.0.2.1".parse().unwrap()),
            port: 0,
            ..UdpConfig::default()
        })
        .unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::AddrNotAvailable);
        let text = error.to_string();
        assert!(
            text.contains("192.0.2.1 is not an address of this host") && text.contains(ADDR_ENV),
            "{text}"
        );
    }
}
