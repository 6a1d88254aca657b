//! RoCEv2 over UDP sockets: the transport that talks to other processes, other hosts,
//! kernel Soft-RoCE and RoCE NICs.
//!
//! # Addresses: one (address, 4791) pair per socket
//!
//! Only one plain socket can own `address:4791` (the RoCEv2 port, IBTA Annex A17), so a
//! [`UdpTransport`] needs an address of its own (devices of several processes share one
//! through [`HostTransport::open`](crate::shm::HostTransport::open): one of them holds the
//! socket). The address is chosen by [`UdpConfig::from_env`], in this order:
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
//!
//! # Segmentation offload (udp(7) `UDP_SEGMENT`, `UDP_GRO`)
//!
//! The kernel's cost is per datagram, and RoCEv2 packets are at most a path MTU (4 KiB)
//! long. With [`UdpConfig::offload`] on (the default; `SOFTVERBS_UDP_OFFLOAD=off`,
//! [`UDP_OFFLOAD_ENV`], turns it off):
//!
//! - **GSO on send.** [`Transport::send_batch`] gives consecutive packets for the same
//!   destination from the same socket, all of one length but the last (which may be
//!   shorter), to the kernel as one message with a `UDP_SEGMENT` control message whose
//!   segment size is that length — e.g. the MIDDLE … LAST packets of an RDMA WRITE (its
//!   FIRST carries a RETH, so it is a message of its own in the same `sendmmsg(2)`). The
//!   kernel, or the NIC, cuts the message back into those packets (Linux
//!   `Documentation/networking/segmentation-offloads.rst`), at most `UDP_MAX_SEGMENTS`
//!   (64) of them and 65,507 bytes in all. Each packet keeps its own ICRC, computed over
//!   the headers it has on the wire: over IPv4 these differ in one field the ICRC covers,
//!   the Identification. Linux gives the message ID 0 (as any of our datagrams, above) and
//!   numbers the segments from it (`inet_gso_segment`: ID `k` for segment `k`), so
//!   segment `k`'s ICRC is computed for ID `k` ([`Sent::ip`] says so). This is checked by
//!   the `gso_segments_on_the_wire_are_rocev2_packets_with_ids_0_1_2` test, which reads
//!   what the kernel hands to a network device without segmentation offload. A NIC that
//!   segments in hardware (USO) is expected to number the IDs the same way, as for TCP
//!   segmentation; that is not verified here (`SOFTVERBS_UDP_OFFLOAD=off` if a peer drops
//!   such packets as bad ICRCs).
//! - **GRO on receive.** The device socket sets `UDP_GRO`, so several packets of one flow
//!   may arrive as one datagram with a `UDP_GRO` control message giving the segment
//!   size (on loopback: exactly what a GSO sender sent). The transport receives into slots
//!   of 64 KiB of its own, cuts each datagram into its segments, checks each one as a
//!   datagram of its own (a malformed or corrupted segment is dropped and counted, the
//!   others delivered) and copies the good ones into the caller's buffers; segments that do
//!   not fit this call's buffers wait for the next call.
//! - **Fallback.** If `UDP_GRO` cannot be set, the socket receives one packet per datagram
//!   as before. If a GSO send is refused (`EINVAL`, `EOPNOTSUPP`, `EIO`: a kernel or path
//!   without support), GSO is turned off for the transport and the packets go again one
//!   per message (their ICRCs refilled for ID 0). Either is logged once.
//!
//! A receiver sees a segment of a softverbs GSO sender with IPv4 ID `k` (0 … 63), whether
//! it arrives coalesced (segment `k` of its datagram) or alone (a receiver without GRO:
//! its kernel cuts the message and numbers the pieces the same way). So
//! [`Ipv4IcrcCheck::IdZero`] accepts the IDs 0 … 63, trying first the one expected (the
//! segment's index in its datagram: 0 for a lone datagram, `k` for segment `k` of a
//! coalesced one, exact on loopback): a corrupted packet passes if its ICRC happens to fit
//! one of 64 IDs, a check of 26 bits instead of 32. [`Ipv4IcrcCheck::AnyId`] tries the
//! expected ID the same way and then any ID, as before (16 bits).
//!
//! Capture and fault injection (`pcap`, `fault`) sit above the socket and still see every
//! RoCEv2 packet on its own; a device with either sends one packet per message.

use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::mem::MaybeUninit;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use rustix::net::sockopt;
use socket2::{Domain, MaybeUninitSlice, MsgHdrMut, Protocol, SockAddr, Socket, Type};
use softverbs_wire::icrc::{self, IpHeaderInfo};

use crate::multicast::Groups;
use crate::transport::{
    add, bump, path_headers, plausible_packet_len, AtomicCounters, DropReason, Endpoint,
    OutgoingPacket, Received, Sent, Transport, TransportCounters, DEFAULT_PORT,
};
use crate::NETWORK_ENV;

/// The environment variable that sets the device address: `IP`, `IP:PORT` or
/// `[IPv6]:PORT`.
pub const ADDR_ENV: &str = "SOFTVERBS_ADDR";

/// The environment variable that sets [`UdpConfig::ipv4_icrc`]: `check` (the default,
/// [`Ipv4IcrcCheck::AnyId`]), `strict` ([`Ipv4IcrcCheck::IdZero`]) or `skip`
/// ([`Ipv4IcrcCheck::Skip`]).
pub const IPV4_ICRC_ENV: &str = "SOFTVERBS_IPV4_ICRC";

/// The environment variable that sets [`UdpConfig::offload`]: `on` (the default) or `off`
/// (no GSO on send, no GRO on receive; for tests and comparisons).
pub const UDP_OFFLOAD_ENV: &str = "SOFTVERBS_UDP_OFFLOAD";

/// Parses the value of `SOFTVERBS_UDP_OFFLOAD`: `on` or `off` (ASCII case and surrounding
/// blanks ignored). `InvalidInput` otherwise.
///
/// ```
/// # use softverbs_device::udp::parse_offload;
/// assert!(parse_offload("on").unwrap());
/// assert!(!parse_offload(" OFF ").unwrap());
/// assert!(parse_offload("maybe").is_err());
/// ```
pub fn parse_offload(value: &str) -> io::Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{UDP_OFFLOAD_ENV}={value:?} is not on or off"),
        )),
    }
}

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
    /// Accept only packets valid for an ID a softverbs sender writes: 0 for a datagram of
    /// its own, `k` (below 64) for segment `k` of a GSO message (see the module
    /// documentation). The expected ID is tried first; the check keeps 26 of the ICRC's 32
    /// bits, and packets from `rxe` or NICs are dropped as bad ICRCs.
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
    /// Segmentation offload: GSO on send, GRO on receive (see the module documentation).
    /// On by default; where the kernel refuses either, the transport does without it.
    pub offload: bool,
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
            offload: true,
        }
    }
}

impl UdpConfig {
    /// The default configuration with the address (and port) of `SOFTVERBS_ADDR`, the
    /// IPv4 ICRC check of `SOFTVERBS_IPV4_ICRC` ([`Ipv4IcrcCheck::parse`]) and the
    /// segmentation offload of `SOFTVERBS_UDP_OFFLOAD` ([`parse_offload`]) where those are
    /// set. `InvalidInput` if one is set but cannot be parsed.
    pub fn from_env() -> io::Result<UdpConfig> {
        let mut config = UdpConfig::default();
        if let Some(value) = std::env::var_os(UDP_OFFLOAD_ENV) {
            let value = value.to_str().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{UDP_OFFLOAD_ENV} is not UTF-8"),
                )
            })?;
            config.offload = parse_offload(value)?;
        }
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
    flow_sockets: RwLock<FxHashMap<u16, Option<Arc<Socket>>>>,
    counters: AtomicCounters,
    /// Whether batches are sent with GSO: [`UdpConfig::offload`], until the kernel refuses
    /// a `UDP_SEGMENT` message (then off for good). `Relaxed`: a switch read per batch,
    /// nothing is published through it.
    gso: AtomicBool,
    /// Where datagrams are received when the device socket has `UDP_GRO` on; `None`
    /// without GRO (datagrams then go straight into the caller's buffers).
    gro: Option<Mutex<GroArena>>,
    /// How many packets wait in the arena (`GroArena::held`), so that
    /// [`Transport::wait_readable`] does not wait while some do. Written under the arena's
    /// lock; read `Relaxed` as a hint (a stale zero costs one wait, bounded by its
    /// timeout, and the packets are handed out by the next receive).
    held: AtomicUsize,
    /// Set once the device takes the socket's packets in place
    /// ([`Transport::take_in_place`], with GRO): from then on [`Transport::recv_batch`]
    /// leaves the socket to it (one `recvmmsg(2)` a receive, not two) and takes only the
    /// multicast groups' datagrams. `Relaxed`: a switch, nothing is published through it.
    in_place: AtomicBool,
    /// The multicast groups the device receives, a socket each (`multicast.rs`).
    groups: Groups,
    /// The index of the interface holding the device's address (0: none), where an IPv6
    /// device joins its groups.
    ifindex: u32,
}

/// Where a transport with GRO receives: slots for datagrams of up to 64 KiB (a coalesced
/// one holds several packets), and the packets taken off the socket and checked that were
/// not handed out yet.
struct GroArena {
    /// [`GRO_SLOTS`] slots of [`GRO_SLOT_LEN`] bytes, allocated on first use (their pages
    /// are mapped as datagrams are written into them).
    slots: Vec<u8>,
    /// Packets waiting to be checked and handed out, in arrival order. The slots are
    /// refilled only once this is empty.
    held: VecDeque<HeldPacket>,
    /// The `recvmmsg(2)` headers, kept from call to call (a receive that finds nothing
    /// then costs no 20 KiB of zeroing).
    batch: Option<Box<ReceiveBatch>>,
}

/// A packet in the GRO arena: a datagram of its own, or segment `segment` of a coalesced
/// one.
#[derive(Debug, Clone, Copy)]
struct HeldPacket {
    /// Where it starts in the arena's slots.
    start: usize,
    len: usize,
    /// The sender.
    from: Endpoint,
    /// The ancillary data of its datagram (TOS, TTL: the same for every segment).
    ancillary: Ancillary,
    /// Its index in its datagram (0 for a datagram of its own).
    segment: usize,
}

impl std::fmt::Debug for GroArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroArena")
            .field("slots", &self.slots.len())
            .field("held", &self.held.len())
            .finish()
    }
}

/// Slots of the GRO arena: datagrams one `recvmmsg(2)` takes at most.
const GRO_SLOTS: usize = 32;

/// `recvmmsg(2)` calls [`Transport::take_in_place`] makes at most while every datagram it
/// took was dropped (bad ones flooding the socket), before it leaves the rest to the next
/// receive.
const IN_PLACE_REFILLS: usize = 4;

/// The size of a GRO slot: the largest UDP datagram (a coalesced one is at most 64 KiB,
/// `UDP_GRO`), rounded up.
const GRO_SLOT_LEN: usize = 64 * 1024;

/// The most packets one GSO message carries (`UDP_MAX_SEGMENTS`, linux/udp.h).
const UDP_MAX_SEGMENTS: usize = 64;

/// The most bytes one GSO message carries: the UDP payload of the largest IPv4 datagram
/// (65,535 bytes less 20 of IP header and 8 of UDP header).
const MAX_GSO_BYTES: usize = 65_507;

const IPV6_PMTUDISC_DO: i32 = 2;
/// `UDP_NO_CHECK6_RX` (linux/udp.h): accept zero UDP checksums over IPv6.
const UDP_NO_CHECK6_RX: libc::c_int = 102;

/// Sets an `int` socket option that neither socket2 nor rustix offers.
pub(crate) fn set_int_option(
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
    let socket = unbound_rocev2_socket(addr, config, receive)?;
    socket.bind(&SockAddr::from(addr))?;
    Ok(socket)
}

/// [`rocev2_socket`] before `bind(2)`. A socket at a unicast address sends multicast
/// datagrams out of the interface holding that address, never by the routing table (which
/// could pick another interface): `IP_MULTICAST_IF` (IPv6: `IPV6_MULTICAST_IF`), with the
/// configured hop limit and loopback on, so other processes of the host get them too
/// (ip(7), ipv6(7)).
pub(crate) fn unbound_rocev2_socket(
    addr: SocketAddr,
    config: &UdpConfig,
    receive: bool,
) -> io::Result<Socket> {
    let domain = Domain::for_address(addr);
    let socket = Socket::new(domain, Type::DGRAM.cloexec(), Some(Protocol::UDP))?;
    let sends_multicast = !addr.ip().is_multicast();
    match addr {
        SocketAddr::V4(v4) => {
            sockopt::set_ip_mtu_discover(socket.as_fd(), sockopt::Ipv4PathMtuDiscovery::DO)?;
            socket.set_tos(u32::from(config.traffic_class))?;
            socket.set_ttl(u32::from(config.hop_limit))?;
            if sends_multicast {
                socket.set_multicast_if_v4(v4.ip())?;
                socket.set_multicast_ttl_v4(u32::from(config.hop_limit))?;
                socket.set_multicast_loop_v4(true)?;
            }
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
            if sends_multicast {
                if let Some(netdev) = crate::device::netdev::holding(addr.ip()) {
                    socket.set_multicast_if_v6(netdev.index)?;
                }
                socket.set_multicast_hops_v6(u32::from(config.hop_limit))?;
                socket.set_multicast_loop_v6(true)?;
            }
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
    Ok(socket)
}

/// The error of binding the device socket to `addr`, saying which address and port and,
/// where there is one, the fix. The kind stays the operating system's (`AddrInUse`,
/// `AddrNotAvailable`, …) so callers can still match on it; the message is one line.
fn bind_error(addr: SocketAddr, error: io::Error) -> io::Error {
    let message = match error.kind() {
        io::ErrorKind::AddrInUse => format!(
            "UDP {addr} is already in use ({error}), by a program or a device this one cannot \
             share it with (devices of one user, PID and network namespace share an address, \
             except two of one process or with {NETWORK_ENV}=udp): give this device another \
             address with {ADDR_ENV} (`softverbs run --addr`), or leave {ADDR_ENV} unset to \
             take the first free 127.0.0.x"
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
    /// `UDP_GRO` (udp(7)): the datagram is several packets of this size coalesced (the
    /// last may be shorter).
    segment_size: Option<u16>,
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
            // Linux puts the segment size as an `int` (udp_cmsg_recv).
            (libc::SOL_UDP, libc::UDP_GRO) => {
                found.segment_size = data
                    .get(..4)
                    .and_then(|bytes| bytes.try_into().ok())
                    .map(i32::from_ne_bytes)
                    .and_then(|size| u16::try_from(size).ok())
                    .filter(|&size| size > 0);
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
        // udp(7) UDP_GRO (Linux 5.0): without it, one packet per datagram as before.
        let gro = config.offload
            && match set_int_option(&socket, libc::SOL_UDP, libc::UDP_GRO, 1) {
                Ok(()) => true,
                Err(error) => {
                    tracing::info!(%error, "no UDP receive offload (UDP_GRO): one packet per datagram");
                    false
                }
            };
        Ok(UdpTransport {
            socket,
            local: Endpoint::from(bound),
            gso: AtomicBool::new(config.offload),
            config,
            flow_sockets: RwLock::new(FxHashMap::default()),
            counters: AtomicCounters::default(),
            gro: gro.then(|| {
                Mutex::new(GroArena {
                    slots: Vec::new(),
                    held: VecDeque::new(),
                    batch: None,
                })
            }),
            held: AtomicUsize::new(0),
            in_place: AtomicBool::new(false),
            groups: Groups::default(),
            ifindex: crate::device::netdev::holding(bound.ip()).map_or(0, |n| n.index),
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

    /// With GRO ([`Transport::take_in_place`]), the socket's packets where they lie in the
    /// arena: each datagram of up to 64 KiB is received once, and its segments are checked
    /// (ICRC included) and handed to `handle` from there (the device's engine, which
    /// writes their payload into the target region: no copy into a buffer of the
    /// caller), at most `max`, up to the first packet for which `stop` (given its bytes)
    /// is true: that one and those after it wait for [`Transport::recv_batch`], which
    /// copies them out. Without GRO, none.
    pub(crate) fn take_in_place_until(
        &self,
        max: usize,
        stop: &dyn Fn(&[u8]) -> bool,
        handle: &mut dyn FnMut(&Received, &[u8]),
    ) -> usize {
        let Some(arena) = &self.gro else {
            return 0;
        };
        if max == 0 {
            return 0;
        }
        if !self.in_place.load(Ordering::Relaxed) {
            self.in_place.store(true, Ordering::Relaxed);
        }
        let mut arena = arena
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut handed = self.hand_out_in_place(&mut arena, max, stop, handle);
        // One `recvmmsg(2)` a call, as `recv_batch`; a few more only while every datagram
        // taken was dropped.
        for _ in 0..IN_PLACE_REFILLS {
            if handed == max || !arena.held.is_empty() {
                break;
            }
            match self.refill(&mut arena, GRO_SLOTS) {
                Ok(0) => break,
                Ok(_) => {}
                Err(error) => {
                    match error.kind() {
                        io::ErrorKind::WouldBlock
                        | io::ErrorKind::Interrupted
                        // ICMP errors queued on the socket are not about this receive.
                        | io::ErrorKind::ConnectionRefused => {}
                        _ => tracing::warn!(%error, "receive failed"),
                    }
                    break;
                }
            }
            let now = self.hand_out_in_place(&mut arena, max - handed, stop, handle);
            handed += now;
            if now > 0 {
                break;
            }
        }
        self.held.store(arena.held.len(), Ordering::Relaxed);
        if handed > 0 {
            add(&self.counters.gro_in_place_packets, handed);
        }
        handed
    }

    /// Whether the socket has `UDP_GRO` on: its datagrams can be taken in place
    /// ([`Transport::take_in_place`]).
    pub(crate) fn coalesces(&self) -> bool {
        self.gro.is_some()
    }

    /// Whether packets of a coalesced datagram wait to be handed out (they do not show on
    /// any fd).
    pub(crate) fn holds_packets(&self) -> bool {
        self.held.load(Ordering::Relaxed) > 0
    }

    /// The fd that polls readable when a datagram may be there: the socket, or the set of
    /// it and the multicast groups' sockets once a group is joined.
    pub(crate) fn wait_fd(&self) -> BorrowedFd<'_> {
        self.groups.wait_fd().unwrap_or_else(|| self.socket.as_fd())
    }

    /// The configuration the transport was opened with.
    pub fn config(&self) -> &UdpConfig {
        &self.config
    }

    /// Waits until the socket is readable or `deadline` (none: forever) passes; false
    /// once it has passed, so a receive loop gives up.
    fn wait_until(&self, deadline: Option<Instant>) -> io::Result<bool> {
        let remaining = match deadline {
            None => None,
            Some(deadline) => {
                let now = Instant::now();
                if now >= deadline {
                    return Ok(false);
                }
                Some(deadline - now)
            }
        };
        match self.groups.wait_fd() {
            Some(all) => wait_readable(all, remaining)?,
            None => wait_readable(&self.socket, remaining)?,
        };
        Ok(true)
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
        self.receive_one_on(&self.socket, self.local, buf)
    }

    /// One `recvmsg(2)` (`MSG_DONTWAIT`) on `socket`, whose datagrams are addressed to
    /// `to`: the device socket, or a multicast group's.
    fn receive_one_on(
        &self,
        socket: &Socket,
        to: Endpoint,
        buf: &mut [u8],
    ) -> io::Result<Result<Received, DropReason>> {
        let mut control = Control::new();
        let mut from = SockAddr::from(SocketAddr::new(self.local.addr(), 0));
        let (len, truncated, control_len) = {
            let mut bufs = [MaybeUninitSlice::new(as_uninit(buf))];
            let mut msg = MsgHdrMut::new()
                .with_addr(&mut from)
                .with_buffers(&mut bufs)
                .with_control(as_uninit(&mut control.0));
            bump(&self.counters.recv_calls);
            let len = socket.recvmsg(&mut msg, libc::MSG_DONTWAIT | libc::MSG_TRUNC)?;
            (len, msg.flags().is_truncated(), msg.control_len())
        };
        let control = control.0.get(..control_len).unwrap_or(&[]);
        let checked = self
            .check_datagram(buf, len, truncated, from.as_socket(), to, control)
            .inspect(|packet| self.count_accepted(packet));
        Ok(checked)
    }

    /// Takes datagrams off the multicast groups' sockets into `bufs[received.len()..]`
    /// (at most [`MAX_BATCH`] from each a call), checked as the device socket's are, the
    /// ICRC over the header addressed to the group. Returns how many it took, good or
    /// dropped.
    fn receive_groups(&self, bufs: &mut [&mut [u8]], received: &mut Vec<Received>) -> usize {
        let mut taken = 0;
        let port = self.local.port();
        self.groups.for_each(|group, socket| {
            for _ in 0..MAX_BATCH {
                let Some(buf) = bufs.get_mut(received.len()) else {
                    return;
                };
                match self.receive_one_on(socket, Endpoint::new(group, port), buf) {
                    Ok(Ok(packet)) => received.push(packet),
                    Ok(Err(reason)) => {
                        tracing::trace!(?reason, %group, "dropped a datagram");
                        self.counters.count_drop(reason);
                    }
                    // Nothing there (or an error about an earlier send): the next group.
                    Err(_) => return,
                }
                taken += 1;
            }
        });
        taken
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
        ReceiveBatch::with(|batch| self.receive_many_with(batch, bufs, received, count))
    }

    /// [`UdpTransport::receive_many`] of `count` datagrams with `batch`.
    fn receive_many_with(
        &self,
        batch: &mut ReceiveBatch,
        bufs: &mut [&mut [u8]],
        received: &mut Vec<Received>,
        count: usize,
    ) -> io::Result<usize> {
        let mut slots = bufs.iter_mut().map(|buf| &mut **buf);
        let taken = self.receive_into(batch, &mut slots, count)?;
        for index in 0..taken {
            let datagram = batch.datagram(index);
            let slot = received.len();
            match self.check_datagram(
                bufs[index],
                datagram.len,
                datagram.truncated,
                datagram.from,
                self.local,
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
        batch.armed = None;
        for index in 0..count {
            let Some(buf) = slots.next() else {
                count = index;
                break;
            };
            batch.point(index, buf);
        }
        if count == 0 {
            return Ok(0);
        }
        // SAFETY: the first `count` headers point at `batch`'s own storage and at buffers
        // `slots` lent exclusively for `'a`, which outlives this call.
        unsafe { self.recvmmsg(batch, count) }
    }

    /// One `recvmmsg(2)` (`MSG_DONTWAIT`) of up to `count` datagrams into the first
    /// `count` [`GRO_SLOT_LEN`]-byte slots of `slots`, with `batch` for their addresses and
    /// control messages. The headers are pointed at `slots` once and kept from call to
    /// call: a call sets back only the lengths the last one had the kernel write (none
    /// after a receive that found nothing), not every header of the batch (about 600
    /// instructions a call, an empty one included). Returns how many were taken;
    /// `WouldBlock` if there were none.
    fn receive_into_slots(
        &self,
        batch: &mut ReceiveBatch,
        slots: &mut [u8],
        count: usize,
    ) -> io::Result<usize> {
        let count = count.min(MAX_BATCH).min(slots.len() / GRO_SLOT_LEN);
        if count == 0 {
            return Ok(0);
        }
        // The headers point into the batch itself too: armed for this batch where it is.
        let buffer = (
            std::ptr::from_ref::<ReceiveBatch>(batch).cast::<u8>(),
            slots.as_mut_ptr(),
            slots.len(),
        );
        if batch.armed == Some(buffer) {
            for index in 0..batch.written.min(MAX_BATCH) {
                batch.reset_lengths(index);
            }
        } else {
            for (index, slot) in slots
                .chunks_exact_mut(GRO_SLOT_LEN)
                .take(MAX_BATCH)
                .enumerate()
            {
                batch.point(index, slot);
            }
            batch.armed = Some(buffer);
        }
        // SAFETY: the first `count` headers point at `batch`'s own storage (boxed in the
        // arena, never moved; `armed` says they were made for the batch where it is) and
        // at slots of `slots`, exclusively borrowed here (`armed` says they were made for
        // this very buffer, and `count` slots fit in it).
        let taken = unsafe { self.recvmmsg(batch, count) };
        // Nothing there: nothing written. Any other failure: maybe some headers.
        batch.written = match &taken {
            Ok(taken) => *taken,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => 0,
            Err(_) => count,
        };
        taken
    }

    /// One `recvmmsg(2)` (`MSG_DONTWAIT`, no timeout) into `batch`'s first `count`
    /// headers. Returns how many datagrams it took; `WouldBlock` if there were none.
    ///
    /// # Safety
    ///
    /// Each of the first `count` headers must point at live memory that nothing else
    /// touches during the call: its address storage, control buffer and iovec in `batch`
    /// ([`ReceiveBatch::point`]), and through the iovec a buffer of its true length.
    unsafe fn recvmmsg(&self, batch: &mut ReceiveBatch, count: usize) -> io::Result<usize> {
        let count = count.min(MAX_BATCH);
        bump(&self.counters.recv_calls);
        // SAFETY: the fd is open (borrowed from `self.socket`) for the call; the headers
        // are as the caller promises, and the kernel writes within the lengths they give.
        let taken = unsafe {
            libc::recvmmsg(
                self.socket.as_raw_fd(),
                batch.messages.as_mut_ptr(),
                count as libc::c_uint,
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                std::ptr::null_mut(),
            )
        };
        let taken = usize::try_from(taken).map_err(|_| io::Error::last_os_error())?;
        Ok(taken.min(count))
    }

    /// Receives through the GRO arena: hands out into `bufs` (in order, appended to
    /// `received`) the packets an earlier call left waiting, then, if `bufs` has room,
    /// takes up to [`GRO_SLOTS`] datagrams off the socket with one `recvmmsg(2)`, cuts
    /// each into its segments and hands them out; each is checked as a datagram of its own
    /// as it is handed out (dropped and counted if bad), and those `bufs` has no room for
    /// wait for the next call. Returns how many datagrams were taken off the socket, or,
    /// if no packet was handed out, the socket's error (`WouldBlock`: nothing there).
    fn receive_coalesced(
        &self,
        arena: &Mutex<GroArena>,
        bufs: &mut [&mut [u8]],
        received: &mut Vec<Received>,
        refill: bool,
    ) -> io::Result<usize> {
        let mut arena = arena
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if !refill {
            self.hand_out(&mut arena, bufs, received);
            self.held.store(arena.held.len(), Ordering::Relaxed);
            return Ok(0);
        }
        let result = self.receive_coalesced_locked(&mut arena, bufs, received);
        self.held.store(arena.held.len(), Ordering::Relaxed);
        result
    }

    fn receive_coalesced_locked(
        &self,
        arena: &mut MutexGuard<'_, GroArena>,
        bufs: &mut [&mut [u8]],
        received: &mut Vec<Received>,
    ) -> io::Result<usize> {
        self.hand_out(arena, bufs, received);
        let room = bufs.len() - received.len();
        if !arena.held.is_empty() || room == 0 {
            return Ok(0);
        }
        let taken = match self.refill(arena, room) {
            Ok(taken) => taken,
            // Packets were handed out: they go back now, the error (if it persists) on a
            // later call.
            Err(_) if !received.is_empty() => return Ok(0),
            Err(error) => return Err(error),
        };
        self.hand_out(arena, bufs, received);
        Ok(taken)
    }

    /// Takes up to `room` datagrams (at most [`GRO_SLOTS`]) off the socket into the
    /// arena's slots with one `recvmmsg(2)` and holds their packets, each segment of a
    /// coalesced datagram as a packet of its own; the held packets must all have been
    /// handed out. Returns how many datagrams were taken.
    fn refill(&self, arena: &mut GroArena, room: usize) -> io::Result<usize> {
        let GroArena { slots, held, batch } = arena;
        debug_assert!(held.is_empty());
        if slots.is_empty() {
            *slots = vec![0u8; GRO_SLOTS * GRO_SLOT_LEN];
        }
        let batch = batch.get_or_insert_with(|| Box::new(ReceiveBatch::new()));
        let taken = self.receive_into_slots(batch, slots, room.min(GRO_SLOTS))?;
        for index in 0..taken {
            let datagram = batch.datagram(index);
            let ancillary = self.check_ancillary(datagram.control);
            // A datagram is at most 64 KiB: one longer than its slot cannot be RoCEv2.
            let (false, Some(from)) = (
                datagram.truncated || datagram.len > GRO_SLOT_LEN,
                datagram.from,
            ) else {
                let reason = if datagram.from.is_some() {
                    DropReason::Truncated
                } else {
                    DropReason::Malformed
                };
                tracing::trace!(?reason, "dropped a datagram");
                self.counters.count_drop(reason);
                continue;
            };
            let start = index * GRO_SLOT_LEN;
            let packet = HeldPacket {
                start,
                len: datagram.len,
                from: Endpoint::from(from),
                ancillary,
                segment: 0,
            };
            match ancillary
                .segment_size
                .map(usize::from)
                .filter(|&size| size < datagram.len)
            {
                None => held.push_back(packet),
                Some(size) => {
                    // udp(7) UDP_GRO: segments of `size` bytes, the last maybe shorter.
                    let segments = datagram.len.div_ceil(size);
                    add(&self.counters.gro_segments, segments);
                    held.extend((0..segments).map(|segment| HeldPacket {
                        start: start + segment * size,
                        len: size.min(datagram.len - segment * size),
                        segment,
                        ..packet
                    }));
                }
            }
        }
        Ok(taken)
    }

    /// Checks the waiting packets, in order, while `bufs[received.len()..]` has room: one
    /// too long for its buffer, malformed or with a bad ICRC is dropped and counted, a
    /// good one copied into its buffer and appended to `received`.
    fn hand_out(&self, arena: &mut GroArena, bufs: &mut [&mut [u8]], received: &mut Vec<Received>) {
        while received.len() < bufs.len() {
            let buf = &mut bufs[received.len()];
            let Some(handed) = self.next_held(arena, |packet| buf.len() >= packet.len) else {
                break;
            };
            if let Some((checked, bytes)) = handed {
                buf[..bytes.len()].copy_from_slice(bytes);
                received.push(checked);
            }
        }
    }

    /// Hands the waiting packets to `handle` where they lie in the arena, in order, at
    /// most `max` and up to the first for which `stop` (given its bytes, unchecked) is
    /// true, each checked as [`UdpTransport::hand_out`] checks it; returns how many it
    /// handed.
    fn hand_out_in_place(
        &self,
        arena: &mut GroArena,
        max: usize,
        stop: &dyn Fn(&[u8]) -> bool,
        handle: &mut dyn FnMut(&Received, &[u8]),
    ) -> usize {
        let mut handed = 0;
        while handed < max {
            let stopped = arena.held.front().is_some_and(|packet| {
                arena
                    .slots
                    .get(packet.start..packet.start + packet.len)
                    .is_some_and(stop)
            });
            if stopped {
                break;
            }
            let Some(next) = self.next_held(arena, |_| true) else {
                break;
            };
            if let Some((checked, bytes)) = next {
                handle(&checked, bytes);
                handed += 1;
            }
        }
        handed
    }

    /// Takes the next waiting packet: `None` if there is none; `Some(None)` if it was
    /// dropped (counted: too long for where it goes, `fits` false, malformed, or a bad
    /// ICRC); otherwise the packet and its bytes in the arena, counted as received.
    fn next_held<'a>(
        &self,
        arena: &'a mut GroArena,
        fits: impl FnOnce(&HeldPacket) -> bool,
    ) -> Option<Option<(Received, &'a [u8])>> {
        let packet = arena.held.pop_front()?;
        let checked = match arena.slots.get(packet.start..packet.start + packet.len) {
            _ if !fits(&packet) => Err(DropReason::Truncated),
            Some(bytes) => self
                .check_packet(
                    bytes,
                    packet.from,
                    self.local,
                    &packet.ancillary,
                    packet.segment,
                )
                .map(|checked| (checked, bytes)),
            // Cannot happen: every held packet lies within its slot.
            None => Err(DropReason::Malformed),
        };
        match checked {
            Ok((checked, bytes)) => {
                self.count_accepted(&checked);
                Some(Some((checked, bytes)))
            }
            Err(reason) => {
                tracing::trace!(?reason, segment = packet.segment, "dropped a packet");
                self.counters.count_drop(reason);
                Some(None)
            }
        }
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
    /// addressed to `to`, with the ancillary data `control`: a packet to hand out, or why
    /// it is dropped.
    fn check_datagram(
        &self,
        buf: &[u8],
        len: usize,
        truncated: bool,
        from: Option<SocketAddr>,
        to: Endpoint,
        control: &[u8],
    ) -> Result<Received, DropReason> {
        let ancillary = self.check_ancillary(control);
        if truncated {
            return Err(DropReason::Truncated);
        }
        let bytes = buf.get(..len).ok_or(DropReason::Truncated)?;
        let from = from.ok_or(DropReason::Malformed)?;
        self.check_packet(bytes, Endpoint::from(from), to, &ancillary, 0)
    }

    /// Checks one packet from `from` to `to` (the device's endpoint, or a multicast
    /// group's), with the ancillary data of its datagram, segment `segment` of it (0 for a
    /// datagram of its own): a packet to hand out, or why it is dropped. Counts nothing.
    fn check_packet(
        &self,
        packet: &[u8],
        from: Endpoint,
        to: Endpoint,
        ancillary: &Ancillary,
        segment: usize,
    ) -> Result<Received, DropReason> {
        let len = packet.len();
        if !plausible_packet_len(len) {
            return Err(DropReason::Malformed);
        }
        let traffic_class = ancillary.traffic_class.unwrap_or(0);
        let hop_limit = ancillary.hop_limit.unwrap_or(self.config.hop_limit);
        let Ok((mut ip, mut udp)) =
            path_headers(&from, &to, from.port(), traffic_class, hop_limit, len)
        else {
            return Err(DropReason::Malformed);
        };
        udp.dst_port = to.port();
        let icrc_checked = match (&mut ip, self.config.ipv4_icrc) {
            (IpHeaderInfo::V4 { .. }, Ipv4IcrcCheck::Skip) => false,
            (IpHeaderInfo::V4 { id, .. }, check) => {
                // The ID a softverbs sender gave it (module documentation) costs one
                // verify; another ID two multiplications more.
                *id = u16::try_from(segment).unwrap_or(0);
                let Ok(sent) = icrc::verify_any_ipv4_id(&ip, &udp, packet) else {
                    return Err(DropReason::BadIcrc);
                };
                if check == Ipv4IcrcCheck::IdZero
                    && !matches!(sent, IpHeaderInfo::V4 { id, .. } if usize::from(id) < UDP_MAX_SEGMENTS)
                {
                    return Err(DropReason::BadIcrc);
                }
                ip = sent;
                true
            }
            (IpHeaderInfo::V6 { .. }, _) => {
                if icrc::verify(&ip, &udp, packet).is_err() {
                    return Err(DropReason::BadIcrc);
                }
                true
            }
        };
        Ok(Received {
            from,
            to,
            len,
            ip,
            udp,
            icrc_checked,
            shared_memory: false,
        })
    }

    /// [`Transport::send_batch`] with `buffers` to build its system calls' arguments in.
    fn send_batch_with(
        &self,
        packets: &mut [OutgoingPacket<'_>],
        buffers: &mut SendBuffers,
    ) -> usize {
        // The socket of each packet, looked up once for a run of packets with one source
        // port hint (the packets of a message, of a QP's burst, most often): each run's
        // first packet, hint, socket and port. (Taken out of `buffers` for the call, put
        // back empty.)
        let mut runs = std::mem::take(&mut buffers.runs);
        runs.clear();
        for (index, packet) in packets.iter_mut().enumerate() {
            if runs.last().is_none_or(|run| run.1 != packet.src_port) {
                let (socket, port) = self.source_socket(packet.src_port);
                runs.push((index, packet.src_port, socket, port));
            }
            let port = runs.last().map_or(self.local.port(), |run| run.3);
            packet.sent = path_headers(
                &self.local,
                &packet.to,
                port,
                self.config.traffic_class,
                self.config.hop_limit,
                packet.bytes.len(),
            )
            .map(|(ip, udp)| Sent {
                from: self.local,
                ip,
                udp,
                // Filled once the message the packet goes in is known.
                icrc: 0,
            })
            .inspect_err(|error| {
                tracing::debug!(%error, to = %packet.to.addr(), "send failed");
            })
            .ok();
        }
        // The socket of packet `index`, moving `run` on to the run that holds it (indices
        // only grow).
        let socket_at = |run: &mut usize, index: usize| {
            while runs.get(*run + 1).is_some_and(|next| next.0 <= index) {
                *run += 1;
            }
            runs.get(*run).and_then(|run| run.2.as_ref())
        };
        // Runs of packets for one socket; a packet that could not be prepared ends a run.
        let same = |a: Option<&Arc<Socket>>, b: Option<&Arc<Socket>>| match (a, b) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        let mut run = 0;
        let mut start = 0;
        while start < packets.len() {
            if packets[start].sent.is_none() {
                start += 1;
                continue;
            }
            let first = socket_at(&mut run, start);
            let mut end = start + 1;
            while end < packets.len()
                && packets[end].sent.is_some()
                && same(first, socket_at(&mut run, end))
            {
                end += 1;
            }
            let from = first.map_or(&self.socket, |socket| &**socket);
            self.transmit_group(from, &mut packets[start..end], buffers);
            start = end;
        }
        // The sockets' references go now; the room stays for the next call.
        runs.clear();
        buffers.runs = runs;
        packets
            .iter()
            .filter(|packet| packet.sent.is_some())
            .count()
    }

    /// Sends `packets` (all prepared for `socket`, their ICRCs not filled yet) with as few
    /// `sendmmsg(2)` calls as it takes, in order, as GSO messages where it can (see the
    /// module documentation); fills each ICRC for the headers its packet goes with, and
    /// sets `sent` of each one the kernel took.
    fn transmit_group(
        &self,
        socket: &Socket,
        packets: &mut [OutgoingPacket<'_>],
        buffers: &mut SendBuffers,
    ) {
        let mut from = 0;
        let mut messages = std::mem::take(&mut buffers.messages);
        while from < packets.len() {
            let rest = &mut packets[from..];
            plan_messages(rest, self.gso.load(Ordering::Relaxed), &mut messages);
            for message in &messages {
                let segmented = message.len() > 1;
                for (segment, packet) in rest[message.clone()].iter_mut().enumerate() {
                    // Segment k of a GSO message carries IPv4 ID k; a message of its own, 0.
                    fill_icrc(packet, if segmented { segment } else { 0 });
                }
            }
            match self.send_messages(socket, rest, &messages, buffers) {
                None => break,
                // GSO is off now: the packets from there go again, one per message.
                Some(refused) => from += refused,
            }
        }
        buffers.messages = messages;
    }

    /// Sends `messages` (ranges of `packets`, each one message: a GSO message if it holds
    /// more than one packet) with `sendmmsg(2)`, in order. Returns where GSO was refused
    /// (the first packet of the message the kernel refused; GSO is then off and nothing
    /// from there on was sent), or `None` when every message was sent or failed.
    fn send_messages(
        &self,
        socket: &Socket,
        packets: &mut [OutgoingPacket<'_>],
        messages: &[Range<usize>],
        buffers: &mut SendBuffers,
    ) -> Option<usize> {
        let SendBuffers {
            addresses,
            iovecs,
            controls,
            headers,
            done,
            ..
        } = buffers;
        for chunk in messages.chunks(MAX_SEND_BATCH) {
            addresses.clear();
            addresses.extend(
                chunk
                    .iter()
                    .map(|message| SockAddr::from(packets[message.start].to.socket_addr())),
            );
            let first = chunk.first().map_or(0, |message| message.start);
            let last = chunk.last().map_or(0, |message| message.end);
            iovecs.clear();
            iovecs.extend(packets[first..last].iter().map(|packet| libc::iovec {
                iov_base: packet.bytes.as_ptr().cast_mut().cast(),
                iov_len: packet.bytes.len(),
            }));
            controls.clear();
            controls.extend(chunk.iter().map(|message| {
                let size = packets[message.start].bytes.len();
                SegmentControl::new(size as u16)
            }));
            headers.clear();
            // SAFETY: `mmsghdr` is plain old data (pointers, lengths, flags), for which all
            // zeroes is valid: null pointers with zero lengths.
            headers.resize(chunk.len(), unsafe { std::mem::zeroed() });
            for (index, message) in chunk.iter().enumerate() {
                let header = &mut headers[index].msg_hdr;
                header.msg_name = addresses[index].as_ptr().cast_mut().cast();
                header.msg_namelen = addresses[index].len();
                header.msg_iov = iovecs[message.start - first..].as_ptr().cast_mut();
                header.msg_iovlen = message.len();
                if message.len() > 1 {
                    header.msg_control = controls[index].0.as_mut_ptr().cast();
                    header.msg_controllen = controls[index].0.len();
                }
            }
            done.clear();
            done.resize(chunk.len(), false);
            let mut at = 0;
            let mut retries = 0;
            while at < headers.len() {
                bump(&self.counters.send_calls);
                // SAFETY: the fd is open (borrowed from `socket`) for the call. Each
                // message from `at` on points at memory live for the call and not written
                // during it: its address (`addresses`), its iovecs (`iovecs`, over the
                // packets' bytes, each with its true length), and for a GSO message its
                // control buffer (`controls`, one `UDP_SEGMENT` message of its true
                // length). The kernel writes only `msg_len` of each header.
                let result = unsafe {
                    libc::sendmmsg(
                        socket.as_raw_fd(),
                        headers[at..].as_mut_ptr(),
                        (headers.len() - at) as libc::c_uint,
                        0,
                    )
                };
                let errno = (result < 0).then(io::Error::last_os_error);
                match usize::try_from(result) {
                    Ok(0) => {
                        // Nothing taken and no error: count the head as failed so the loop
                        // always moves on.
                        add(&self.counters.send_errors, chunk[at].len());
                        at += 1;
                    }
                    Ok(taken) => {
                        for index in at..(at + taken).min(chunk.len()) {
                            let message = &chunk[index];
                            let bytes: usize =
                                packets[message.clone()].iter().map(|p| p.bytes.len()).sum();
                            if headers[index].msg_len as usize == bytes {
                                // One add per message, not two locked adds per packet.
                                add(&self.counters.sent_packets, message.len());
                                add(&self.counters.sent_bytes, bytes);
                                if message.len() > 1 {
                                    bump(&self.counters.gso_sends);
                                }
                                done[index] = true;
                            } else {
                                add(&self.counters.send_errors, message.len());
                            }
                        }
                        at += taken;
                    }
                    Err(_) => {
                        let error = errno.unwrap_or_else(|| io::Error::from_raw_os_error(0));
                        let message = &chunk[at];
                        match error.raw_os_error() {
                            Some(libc::EINTR) => {}
                            // The send buffer is full for now (sendmmsg(2): the rest can be
                            // retried from the first message not sent): a few more tries,
                            // then the packets count as failed, like a loss the peer
                            // recovers from.
                            Some(libc::EAGAIN | libc::ENOBUFS) if retries < SEND_RETRIES => {
                                retries += 1;
                                std::thread::yield_now();
                            }
                            // udp(7): a kernel, device or path without UDP segmentation
                            // offload refuses the message. Without GSO from here on.
                            Some(
                                libc::EINVAL | libc::EOPNOTSUPP | libc::EIO | libc::ENOPROTOOPT,
                            ) if message.len() > 1 => {
                                if self.gso.swap(false, Ordering::Relaxed) {
                                    tracing::info!(
                                        %error,
                                        "UDP segmentation offload (UDP_SEGMENT) refused: \
                                         one packet per datagram from now on"
                                    );
                                }
                                // Those before the refused message went or failed; the
                                // rest are still to send (their headers kept).
                                let refused = message.start;
                                for (message, done) in chunk[..at].iter().zip(done.iter()) {
                                    if !done {
                                        for packet in &mut packets[message.clone()] {
                                            packet.sent = None;
                                        }
                                    }
                                }
                                return Some(refused);
                            }
                            _ => {
                                add(&self.counters.send_errors, message.len());
                                let to = packets[message.start].to.addr();
                                tracing::debug!(%error, %to, "send failed");
                                at += 1;
                            }
                        }
                    }
                }
            }
            for (message, done) in chunk.iter().zip(done.iter()) {
                if !done {
                    for packet in &mut packets[message.clone()] {
                        packet.sent = None;
                    }
                }
            }
        }
        None
    }
}

/// The most datagrams one `recvmmsg(2)` takes.
pub const MAX_BATCH: usize = 64;

/// The most messages one `sendmmsg(2)` is given (`UIO_MAXIOV`, sendmmsg(2)).
const MAX_SEND_BATCH: usize = 1024;

/// How many times a batch send retries after `EAGAIN` / `ENOBUFS` before it counts the
/// packets of the message it is at as failed.
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
    /// Where the batch was and the buffer (start, length) it was for when
    /// [`UdpTransport::receive_into_slots`] pointed the headers at them, if it did (and
    /// [`UdpTransport::receive_into`] did not since).
    armed: Option<(*const u8, *mut u8, usize)>,
    /// How many headers the last call may have had the kernel write: their name and
    /// control lengths are set back before the next call on the same buffer.
    written: usize,
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

// SAFETY: the raw pointers in `iovecs`, `messages` and `armed` are only ever dereferenced
// by the kernel, inside `UdpTransport::recvmmsg`, called by `UdpTransport::receive_into`
// (which points every header it passes at memory borrowed for that call) and by
// `UdpTransport::receive_into_slots` (which passes them only while it holds the very
// buffer they were made for exclusively borrowed). Between calls nothing reads through
// them, so the batch may move to (and be used by) another thread.
unsafe impl Send for ReceiveBatch {}

thread_local! {
    /// The batch of [`UdpTransport::receive_many`] (receives without GRO), kept from call
    /// to call on each thread: a fresh one is some 20 KiB of zeroes a call, an empty
    /// receive included.
    static RECEIVE_BATCH: RefCell<Option<Box<ReceiveBatch>>> = const { RefCell::new(None) };
}

impl ReceiveBatch {
    /// Calls `f` with this thread's batch (a fresh one if a receive further up this
    /// thread's stack holds it).
    fn with<R>(f: impl FnOnce(&mut ReceiveBatch) -> R) -> R {
        RECEIVE_BATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut batch) => f(batch.get_or_insert_with(|| Box::new(ReceiveBatch::new()))),
            Err(_) => f(&mut ReceiveBatch::new()),
        })
    }

    /// Points header `index` at its address storage, its control buffer and, through its
    /// iovec, `buf`, with their whole lengths.
    fn point(&mut self, index: usize, buf: &mut [u8]) {
        self.iovecs[index] = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let header = &mut self.messages[index].msg_hdr;
        header.msg_name = (&mut self.addresses[index] as *mut libc::sockaddr_storage).cast();
        header.msg_iov = &mut self.iovecs[index];
        header.msg_iovlen = 1;
        header.msg_control = self.controls[index].0.as_mut_ptr().cast();
        self.reset_lengths(index);
    }

    /// Sets header `index`'s address and control lengths back to their storage's whole
    /// size (the kernel writes what it used there).
    fn reset_lengths(&mut self, index: usize) {
        let header = &mut self.messages[index].msg_hdr;
        header.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        header.msg_controllen = self.controls[index].0.len() as _;
    }

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
            armed: None,
            written: 0,
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

/// Bytes of a `struct cmsghdr` (`size_t len; int level; int type;`), where its data starts.
const CMSG_HEADER_LEN: usize = std::mem::size_of::<libc::cmsghdr>();

/// `CMSG_SPACE(sizeof(uint16_t))`: a control message with a `u16`, padded to `size_t`.
const SEGMENT_CONTROL_LEN: usize = CMSG_HEADER_LEN + std::mem::size_of::<usize>();

/// A control buffer holding one `UDP_SEGMENT` message (udp(7)): the segment size of a GSO
/// message, a `u16`. Aligned for `struct cmsghdr`.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct SegmentControl([u8; SEGMENT_CONTROL_LEN]);

impl SegmentControl {
    fn new(segment_size: u16) -> SegmentControl {
        const WORD: usize = std::mem::size_of::<usize>();
        let mut bytes = [0u8; SEGMENT_CONTROL_LEN];
        // cmsg_len = CMSG_LEN(sizeof(uint16_t)).
        let len = CMSG_HEADER_LEN + std::mem::size_of::<u16>();
        bytes[..WORD].copy_from_slice(&len.to_ne_bytes());
        bytes[WORD..WORD + 4].copy_from_slice(&libc::SOL_UDP.to_ne_bytes());
        bytes[WORD + 4..WORD + 8].copy_from_slice(&libc::UDP_SEGMENT.to_ne_bytes());
        bytes[CMSG_HEADER_LEN..CMSG_HEADER_LEN + 2].copy_from_slice(&segment_size.to_ne_bytes());
        SegmentControl(bytes)
    }
}

/// What a send builds its `sendmmsg(2)` calls in, kept from call to call on each thread
/// (an allocation each, seven in all, per send cost a busy ping-pong about 1,200
/// instructions of `malloc` and `free` per message).
#[derive(Default)]
struct SendBuffers {
    /// Runs of packets with one source port hint: first packet, hint, socket and port.
    runs: Vec<(usize, u16, Option<Arc<Socket>>, u16)>,
    /// The messages the packets go as ([`plan_messages`]).
    messages: Vec<Range<usize>>,
    /// Per message of a `sendmmsg(2)` call: its destination, GSO control and header, and
    /// whether it went; per packet, its iovec.
    addresses: Vec<SockAddr>,
    iovecs: Vec<libc::iovec>,
    controls: Vec<SegmentControl>,
    headers: Vec<libc::mmsghdr>,
    done: Vec<bool>,
}

thread_local! {
    static SEND_BUFFERS: RefCell<SendBuffers> = RefCell::default();
}

impl SendBuffers {
    /// Calls `f` with this thread's buffers (fresh ones if a send further up this
    /// thread's stack holds them).
    fn with<R>(f: impl FnOnce(&mut SendBuffers) -> R) -> R {
        SEND_BUFFERS.with(|cell| match cell.try_borrow_mut() {
            Ok(mut buffers) => f(&mut buffers),
            Err(_) => f(&mut SendBuffers::default()),
        })
    }
}

/// Cuts `packets` into the messages they are sent as, in order: with `gso`, a run of
/// packets for one destination, all of the first one's length but the last (which may be
/// shorter, unless it starts a run of its own), at most [`UDP_MAX_SEGMENTS`] of them and
/// [`MAX_GSO_BYTES`] in all, is one message (udp(7) `UDP_SEGMENT`); without, every packet
/// is one.
fn plan_messages(packets: &[OutgoingPacket<'_>], gso: bool, messages: &mut Vec<Range<usize>>) {
    messages.clear();
    let mut start = 0;
    while start < packets.len() {
        let size = packets[start].bytes.len();
        let mut end = start + 1;
        let mut total = size;
        while gso && end < packets.len() && end - start < UDP_MAX_SEGMENTS {
            let next = &packets[end];
            let len = next.bytes.len();
            if next.to != packets[start].to || len > size || total + len > MAX_GSO_BYTES {
                break;
            }
            if len < size {
                // Only the last segment may be shorter; one that starts a run of its own
                // length (a WRITE's MIDDLE packets after its FIRST) is left to that run.
                let starts_run = packets
                    .get(end + 1)
                    .is_some_and(|after| after.to == next.to && after.bytes.len() == len);
                if !starts_run {
                    end += 1;
                }
                break;
            }
            total += len;
            end += 1;
        }
        messages.push(start..end);
        start = end;
    }
}

/// Fills the ICRC of a prepared packet for the headers it goes with as segment `segment`
/// of its message (0 for a message of its own): over IPv4, with that IP ID (Linux numbers
/// the segments of a GSO message from the message's ID, 0; module documentation).
fn fill_icrc(packet: &mut OutgoingPacket<'_>, segment: usize) {
    let Some(sent) = &mut packet.sent else {
        return;
    };
    if let IpHeaderInfo::V4 { id, .. } = &mut sent.ip {
        *id = u16::try_from(segment).unwrap_or(0);
    }
    match icrc::fill(&sent.ip, &sent.udp, packet.bytes) {
        Ok(icrc) => sent.icrc = icrc,
        // Shorter than an ICRC: `path_headers` refused it before this.
        Err(error) => {
            tracing::debug!(%error, to = %packet.to.addr(), "send failed");
            packet.sent = None;
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
        if self.gro.is_some() || self.groups.any() {
            // A datagram may hold several packets, or come from a group's socket: through
            // the batch receive, one packet at most.
            let mut received = Vec::with_capacity(1);
            self.recv_batch(&mut [buf], &mut received, timeout)?;
            return Ok(received.pop());
        }
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
            if !self.wait_until(deadline)? {
                return Ok(None);
            }
        }
    }

    /// Chooses the headers of every packet, then hands each run of consecutive packets
    /// that leave from the same socket (the same UDP source port, see [`SourcePorts`]) to
    /// one `sendmmsg(2)`, in order, as GSO messages where it can (module documentation);
    /// each ICRC is filled for the IP ID its packet carries on the wire.
    fn send_batch(&self, packets: &mut [OutgoingPacket<'_>]) -> usize {
        SendBuffers::with(|buffers| self.send_batch_with(packets, buffers))
    }

    /// With GSO, to a loopback address: the peer is a process of this host, a softverbs
    /// device in practice (kernel RoCE devices sit on Ethernet interfaces), which receives
    /// with GRO (a GSO message arrives whole on loopback) and takes the datagram's packets
    /// in one run. Elsewhere the peer may be kernel rxe or a NIC, which take the segments
    /// one by one and could complete the reply's receive before the ACK's send.
    fn acks_may_follow(&self, to: &Endpoint) -> bool {
        self.gso.load(Ordering::Relaxed) && to.addr().is_loopback()
    }

    /// Takes what is queued with `recvmmsg(2)`, up to [`MAX_BATCH`] datagrams a call
    /// (32 with GRO, each possibly several packets), waiting (without the call)
    /// up to `timeout` for the first.
    fn recv_batch(
        &self,
        bufs: &mut [&mut [u8]],
        received: &mut Vec<Received>,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        received.clear();
        // A zero timeout (a polling application's receive) looks once and reads no clock.
        let once = timeout == Some(Duration::ZERO);
        let deadline = match timeout {
            Some(t) if !once => Some(Instant::now() + t),
            _ => None,
        };
        loop {
            let in_place = self.in_place.load(Ordering::Relaxed);
            let taken = match &self.gro {
                // Nothing left in the arena by `take_in_place` (as a hint: one left behind
                // is handed out by its next call, or by a later one of this).
                Some(_) if in_place && self.held.load(Ordering::Relaxed) == 0 => Ok(0),
                Some(arena) => self.receive_coalesced(
                    arena, bufs, received,
                    // The socket's datagrams go through `take_in_place`; what it left in
                    // the arena is handed out here.
                    !in_place,
                ),
                None => self.receive_many(bufs, received),
            };
            let from_groups = if self.groups.any() {
                self.receive_groups(bufs, received)
            } else {
                0
            };
            // Packets from the device socket or a group's go back now, whatever the device
            // socket said (an error that persists comes back with the next call).
            if !received.is_empty() {
                return Ok(received.len());
            }
            match taken {
                // Every datagram taken was dropped: look again at once.
                Ok(taken) if taken > 0 || from_groups > 0 => continue,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock && from_groups > 0 => {
                    continue
                }
                Ok(_) => return Ok(0), // no buffers
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                // ICMP errors queued on the socket are not about this receive (as `recv`).
                Err(error) if error.kind() == io::ErrorKind::ConnectionRefused => continue,
                Err(error) => return Err(error),
            }
            if once || !self.wait_until(deadline)? {
                return Ok(0);
            }
        }
    }

    /// With GRO, the socket's packets where they lie in the arena
    /// (`UdpTransport::take_in_place_until`). Without GRO, none (`recv_batch` receives
    /// each datagram straight into a buffer of the caller).
    fn take_in_place(&self, max: usize, handle: &mut dyn FnMut(&Received, &[u8])) -> usize {
        self.take_in_place_until(max, &|_| false, handle)
    }

    fn counters(&self) -> TransportCounters {
        self.counters.snapshot()
    }

    /// Returns at once while packets of a coalesced datagram wait to be handed out.
    fn wait_readable(&self, timeout: Duration) -> io::Result<()> {
        if self.held.load(Ordering::Relaxed) > 0 {
            return Ok(());
        }
        match self.groups.wait_fd() {
            Some(all) => wait_readable(all, Some(timeout)).map(|_| ()),
            None => wait_readable(&self.socket, Some(timeout)).map(|_| ()),
        }
    }

    /// Packets of a coalesced datagram waiting to be handed out, or a datagram on the socket
    /// or a multicast group's (`poll` with no timeout).
    fn pending_packets(&self) -> bool {
        if self.held.load(Ordering::Relaxed) > 0 {
            return true;
        }
        match self.groups.wait_fd() {
            Some(all) => wait_readable(all, Some(Duration::ZERO)),
            None => wait_readable(&self.socket, Some(Duration::ZERO)),
        }
        .unwrap_or(false)
    }

    /// The socket. Packets of a coalesced datagram already taken off it and waiting to be
    /// handed out do not show on it, nor do datagrams for a multicast group (they arrive
    /// on the group's socket); [`Transport::wait_readable`] sees both, and the device's
    /// progress thread hands them out.
    fn readiness_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.socket.as_fd())
    }

    /// Opens a socket for `group` (module `multicast`).
    fn join_multicast(&self, group: IpAddr) -> io::Result<()> {
        self.groups.join(
            group,
            self.local.port(),
            self.local.addr(),
            self.ifindex,
            &self.config,
            self.socket.as_fd(),
        )
    }

    fn leave_multicast(&self, group: IpAddr) -> io::Result<()> {
        self.groups.leave(group)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ancillary_parser_reads_tos_ttl_socket_drops_and_segment_size_and_survives_garbage() {
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
        // udp(7) UDP_GRO: the segment size of a coalesced datagram, an int.
        push(
            &mut control,
            libc::SOL_UDP,
            libc::UDP_GRO,
            &4112i32.to_ne_bytes(),
        );
        assert_eq!(
            parse_ancillary(&control),
            Ancillary {
                traffic_class: Some(2),
                hop_limit: Some(64),
                socket_drops: Some(70_000),
                segment_size: Some(4112),
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

    // udp(7) UDP_SEGMENT takes a uint16_t: the control message is laid out as the libc
    // macros lay it out.
    #[test]
    fn segment_control_message_is_cmsg_len_and_space_of_a_u16() {
        let control = SegmentControl::new(4112);
        // SAFETY: CMSG_LEN and CMSG_SPACE only compute with their argument.
        let (len, space) = unsafe { (libc::CMSG_LEN(2), libc::CMSG_SPACE(2)) };
        assert_eq!(control.0.len(), space as usize);
        assert_eq!(
            usize::from_ne_bytes(control.0[..8].try_into().unwrap()),
            len as usize
        );
        let parsed = parse_cmsg_for_test(&control.0);
        assert_eq!(
            parsed,
            (
                libc::SOL_UDP,
                libc::UDP_SEGMENT,
                4112u16.to_ne_bytes().to_vec()
            )
        );
    }

    /// The level, type and data of the one control message in `control`.
    fn parse_cmsg_for_test(control: &[u8]) -> (i32, i32, Vec<u8>) {
        let len = usize::from_ne_bytes(control[..8].try_into().unwrap());
        let level = i32::from_ne_bytes(control[8..12].try_into().unwrap());
        let kind = i32::from_ne_bytes(control[12..16].try_into().unwrap());
        (level, kind, control[CMSG_HEADER_LEN..len].to_vec())
    }

    /// Packets of these lengths for these destinations (1 or 2), as `plan_messages` cuts
    /// them into messages with GSO.
    fn plan(packets: &[(usize, u8)]) -> Vec<Range<usize>> {
        let mut bytes: Vec<Vec<u8>> = packets.iter().map(|&(len, _)| vec![0u8; len]).collect();
        let outgoing: Vec<OutgoingPacket<'_>> = bytes
            .iter_mut()
            .zip(packets)
            .map(|(bytes, &(_, to))| {
                let to = Endpoint::rocev2(IpAddr::V4(Ipv4Addr::new(127, 0, 0, to)));
                OutgoingPacket::new(to, 0xC000, bytes)
            })
            .collect();
        let mut messages = vec![7..9, 1..2];
        plan_messages(&outgoing, false, &mut messages);
        assert_eq!(
            messages,
            (0..packets.len()).map(|i| i..i + 1).collect::<Vec<_>>(),
            "without GSO, one packet per message"
        );
        plan_messages(&outgoing, true, &mut messages);
        messages
    }

    // udp(7) UDP_SEGMENT, Documentation/networking/segmentation-offloads.rst: the segments
    // of one message all have the segment size but the last, which may be shorter; at most
    // UDP_MAX_SEGMENTS (64) of them, 65,507 bytes in all, to one destination.
    #[test]
    fn gso_messages_are_runs_of_equal_packets_to_one_destination() {
        // A 64 KiB RDMA WRITE at MTU 4096: FIRST (RETH), 14 MIDDLE, LAST; then a
        // one-packet WRITE, which may end the message as its shorter last segment, and two
        // ACKs.
        let mut write = vec![(12 + 16 + 4096 + 4, 1)];
        write.extend([(12 + 4096 + 4, 1); 15]);
        write.extend([(12 + 16 + 100 + 4, 1), (20, 1), (20, 1)]);
        assert_eq!(plan(&write), [0..1, 1..17, 17..19]);
        // 16 packets of 4112 bytes exceed 65,507 bytes: 15 and 1.
        assert_eq!(plan(&[(4112, 1); 16]), [0..15, 15..16]);
        // 64 segments at most.
        assert_eq!(plan(&[(20, 1); 130]), [0..64, 64..128, 128..130]);
        // A shorter packet ends a message, unless a run of its length follows; a longer
        // one starts the next.
        assert_eq!(
            plan(&[
                (1040, 1),
                (1040, 1),
                (100, 1),
                (1040, 1),
                (1040, 1),
                (100, 1),
                (100, 1)
            ]),
            [0..3, 3..5, 5..7]
        );
        assert_eq!(plan(&[(100, 1), (1040, 1), (1040, 1)]), [0..1, 1..3]);
        // Another destination starts a message.
        assert_eq!(
            plan(&[(1040, 1), (1040, 2), (1040, 2), (1040, 1)]),
            [0..1, 1..3, 3..4]
        );
    }

    #[test]
    fn offload_spellings() {
        assert!(UdpConfig::default().offload);
        assert!(parse_offload("on").unwrap());
        assert!(parse_offload(" On\n").unwrap());
        assert!(!parse_offload("OFF").unwrap());
        for bad in ["", "1", "gso", "on,off"] {
            let error = parse_offload(bad).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
            assert!(error.to_string().contains(UDP_OFFLOAD_ENV), "{error}");
        }
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

    /// A held ACK rides behind the reply in its datagram only to a peer on loopback (a
    /// softverbs device, which takes the datagram whole) and only with GSO; to any other
    /// address it leads, in a datagram of its own (`Transport::acks_may_follow`). Nothing
    /// is sent.
    #[test]
    fn acks_follow_replies_only_to_loopback_peers_with_gso() {
        let bind = |offload| {
            UdpTransport::bind(UdpConfig {
                address: Some("127.0.0.78".parse().unwrap()),
                port: 0,
                offload,
                ..UdpConfig::default()
            })
            .unwrap()
        };
        let to = |addr: &str| Endpoint::rocev2(addr.parse().unwrap());
        let with_gso = bind(true);
        assert!(with_gso.acks_may_follow(&to("127.0.0.79")));
        assert!(with_gso.acks_may_follow(&to("::1")));
        assert!(!with_gso.acks_may_follow(&to("192.0.2.1")));
        assert!(!with_gso.acks_may_follow(&to("2001:db8::1")));
        drop(with_gso);
        assert!(!bind(false).acks_may_follow(&to("127.0.0.79")));
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
