//! What every transport of the device offers: the [`Transport`] trait, the [`Endpoint`]
//! and [`Gid`] a packet is addressed with, and the counters a transport keeps.
//!
//! A transport moves **opaque IB transport packets** (BTH onward, with the 4-byte ICRC
//! trailer; IBTA Annex A17) between device endpoints. It knows nothing of queue
//! pairs. What it owns is the part of RoCEv2 below the BTH: the IP and UDP headers the
//! packet travels with, and therefore the ICRC (§1.7), which covers them:
//!
//! - [`Transport::prepare`] decides the IP / UDP headers a packet will be sent with and
//!   fills its ICRC for exactly that path; [`Transport::transmit`] puts the bytes on the
//!   path as they are. [`Transport::send`] does both. The split exists for middleware:
//!   fault injection corrupts bytes after the ICRC is filled, pcap capture records the
//!   bytes that are transmitted.
//! - [`Transport::send_batch`] and [`Transport::recv_batch`] do the same for many packets
//!   at once, so that a transport can move a burst in one system call (`sendmmsg(2)`,
//!   `recvmmsg(2)`). Their defaults loop over the single-packet methods, so a transport
//!   (or middleware) that has nothing better to do keeps working unchanged.
//! - [`Transport::recv`] hands out only packets whose ICRC verified (or, where the path
//!   makes that impossible and the configuration allows it, says so in
//!   [`Received::icrc_checked`]). Malformed datagrams and bad ICRCs are dropped and
//!   counted ([`TransportCounters`]), never returned as errors and never a panic: a wrong
//!   ICRC looks like packet loss, as on a real NIC (§1.7 step 5).
//!
//! Implementations: [`UdpTransport`](crate::udp::UdpTransport) (real RoCEv2 over UDP),
//! [`LoopbackTransport`](crate::loopback::LoopbackTransport) (in-process), and the
//! middleware [`FaultTransport`](crate::fault::FaultTransport) and
//! [`PcapTransport`](crate::pcap::PcapTransport), which wrap any transport.
//!
//! The UDP source port of a packet is chosen by the caller, per flow (reference §4.4):
//! [`udp_src_port_for_qps`] is the Linux `rdma_get_udp_sport` convention for a connected
//! QP pair, [`udp_src_port_for_qp`] the one for a QP without a remote (UD, or before RTR).

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::deferred::Deferred;
use softverbs_wire::icrc::{IpHeaderInfo, UdpHeaderInfo, ROCEV2_PORT};

/// The RoCEv2 UDP port, 4791 (reference §1.1): the default port of every endpoint.
pub const DEFAULT_PORT: u16 = ROCEV2_PORT;

/// The smallest IB transport packet a transport accepts: a BTH (12) and the ICRC (4).
pub const MIN_PACKET_LEN: usize = 16;

/// A 16-byte RoCEv2 GID: an IPv6 address, or an IPv4 address in IPv4-mapped form
/// `::ffff:a.b.c.d` (reference §4.3; DESIGN "GIDs are IP addresses").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID of an IP address: IPv6 as is, IPv4 as `::ffff:a.b.c.d`.
    pub fn from_ip(addr: IpAddr) -> Gid {
        match addr {
            IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// The IP address of this GID: an IPv4-mapped GID gives the IPv4 address, any other
    /// the IPv6 address. (`::ffff:a.b.c.d` is the only IPv4 form; the deprecated
    /// IPv4-compatible `::a.b.c.d` is read as IPv6.)
    pub fn ip(&self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }

    /// The IP address a device on `local` sends to for this GID
    /// ([`softverbs_proto::gid_address`]): [`Gid::ip`], except that a port's link-local
    /// GID (index 0 of a softverbs GID table) is the address it was made from.
    pub fn resolve(&self, local: IpAddr) -> IpAddr {
        softverbs_proto::gid_address(&self.0, local)
    }

    /// True if this GID is an IPv4-mapped address (the packet goes over IPv4).
    pub fn is_ipv4(&self) -> bool {
        Ipv6Addr::from(self.0).to_ipv4_mapped().is_some()
    }

    /// The raw 16 bytes, in network order (as `union ibv_gid.raw`).
    pub const fn octets(&self) -> [u8; 16] {
        self.0
    }
}

impl From<IpAddr> for Gid {
    fn from(addr: IpAddr) -> Gid {
        Gid::from_ip(addr)
    }
}

impl From<Ipv4Addr> for Gid {
    fn from(addr: Ipv4Addr) -> Gid {
        Gid::from_ip(IpAddr::V4(addr))
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(addr: Ipv6Addr) -> Gid {
        Gid::from_ip(IpAddr::V6(addr))
    }
}

impl From<Gid> for IpAddr {
    fn from(gid: Gid) -> IpAddr {
        gid.ip()
    }
}

/// Prints as an IPv6 address, e.g. `::ffff:127.0.0.2` or `fe80::1`.
impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Ipv6Addr::from(self.0).fmt(f)
    }
}

/// Where a device receives RoCEv2 packets: an IP address (v4 or v6) and a UDP port (4791
/// unless configured otherwise, e.g. an ephemeral port in tests).
///
/// The address is never an IPv4-mapped IPv6 address: [`Endpoint::new`] and
/// [`Endpoint::from_gid`] turn `::ffff:a.b.c.d` into `a.b.c.d`, so that the IP version of
/// an endpoint is the IP version on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    addr: IpAddr,
    port: u16,
}

impl Endpoint {
    /// An endpoint at `addr`:`port` (an IPv4-mapped IPv6 address becomes IPv4).
    pub fn new(addr: IpAddr, port: u16) -> Endpoint {
        let addr = match addr {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(v6),
            },
            v4 => v4,
        };
        Endpoint { addr, port }
    }

    /// An endpoint at `addr`, port 4791.
    pub fn rocev2(addr: IpAddr) -> Endpoint {
        Endpoint::new(addr, DEFAULT_PORT)
    }

    /// The endpoint of a GID (reference §4.3) at `port`.
    pub fn from_gid(gid: Gid, port: u16) -> Endpoint {
        Endpoint::new(gid.ip(), port)
    }

    /// The IP address.
    pub const fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The UDP port.
    pub const fn port(&self) -> u16 {
        self.port
    }

    /// The GID of the address (IPv4 as `::ffff:a.b.c.d`).
    pub fn gid(&self) -> Gid {
        Gid::from_ip(self.addr)
    }

    /// True for an IPv4 endpoint.
    pub const fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }

    /// The socket address.
    pub const fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.addr, self.port)
    }
}

impl From<SocketAddr> for Endpoint {
    fn from(addr: SocketAddr) -> Endpoint {
        Endpoint::new(addr.ip(), addr.port())
    }
}

impl From<Endpoint> for SocketAddr {
    fn from(endpoint: Endpoint) -> SocketAddr {
        endpoint.socket_addr()
    }
}

/// Prints as a socket address: `127.0.0.2:4791`, `[::1]:4791`.
impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.socket_addr().fmt(f)
    }
}

/// The UDP source port of a connected QP pair, Linux `rdma_get_udp_sport` with flow label
/// 0 (reference §4.4): symmetric, so both ends of an RC connection pick the same port;
/// always in 0xC000–0xFFFF.
///
/// ```
/// # use softverbs_device::transport::udp_src_port_for_qps;
/// assert_eq!(udp_src_port_for_qps(361, 313), 0xF967); // the reference's example
/// assert_eq!(udp_src_port_for_qps(313, 361), 0xF967);
/// ```
pub fn udp_src_port_for_qps(local_qpn: u32, remote_qpn: u32) -> u16 {
    let mut fl = u64::from(local_qpn) * u64::from(remote_qpn);
    fl ^= fl >> 20;
    fl ^= fl >> 40;
    let fl = fl & 0xF_FFFF;
    0xC000 | (((fl & 0x3FFF) ^ ((fl & 0xF_C000) >> 14)) as u16)
}

/// The UDP source port of a QP without a remote QP (UD, or before RTR): `0xC000 | hash`
/// of the QPN, as `rxe` does (reference §4.4). The hash is the same 20-bit fold as
/// [`udp_src_port_for_qps`] applied to the QPN alone.
pub fn udp_src_port_for_qp(qpn: u32) -> u16 {
    udp_src_port_for_qps(qpn, 1)
}

/// The IP and UDP headers a packet is sent with, as [`Transport::prepare`] decided them,
/// and the ICRC it filled for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sent {
    /// Source endpoint (the transport's local endpoint).
    pub from: Endpoint,
    /// The IP header (for IPv4 over a socket: ID 0, DF, as Linux writes it, §5.2; ID `k`
    /// for segment `k` of a GSO message, see [`crate::udp`]).
    pub ip: IpHeaderInfo,
    /// The UDP header (its checksum is masked out of the ICRC and not kept).
    pub udp: UdpHeaderInfo,
    /// The ICRC written into the packet's trailer.
    pub icrc: u32,
}

/// A packet [`Transport::recv`] accepted: its length in the caller's buffer and where it
/// came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Received {
    /// The sender's address and the datagram's UDP source port. The port is the sender's
    /// per-flow choice (reference §4.4), not necessarily where it receives: replies go to
    /// the peer's device endpoint (port 4791 unless configured otherwise), as RoCE
    /// responders address the QP's path, never the source port.
    pub from: Endpoint,
    /// The endpoint it was addressed to (the transport's local endpoint).
    pub to: Endpoint,
    /// Length of the IB transport packet (BTH … ICRC) at the front of the buffer.
    pub len: usize,
    /// The IP header as far as the receiver knows it. A socket cannot see the IPv4 ID:
    /// the UDP transport recovers it from the ICRC (`icrc::verify_any_ipv4_id`), so it is
    /// the sender's (0 from softverbs peers, `k` for segment `k` of their GSO messages,
    /// rxe's own numbering from rxe).
    pub ip: IpHeaderInfo,
    /// The UDP header.
    pub udp: UdpHeaderInfo,
    /// True if the ICRC was verified; false only where the transport was configured not
    /// to check it (`SOFTVERBS_IPV4_ICRC=skip`), or for a packet from shared memory sent
    /// without one.
    pub icrc_checked: bool,
    /// True if the packet came through shared memory from a device of another process of
    /// this host ([`HostTransport`](crate::shm::HostTransport)), not through a socket.
    pub shared_memory: bool,
}

/// A snapshot of a transport's counters. Receive drops are counted per reason:
/// `received_packets` + `dropped_bad_icrc` + `dropped_malformed` + `dropped_truncated` is
/// every packet the transport took in (every datagram, a coalesced one counting once per
/// segment). `dropped_undeliverable` counts on the sending side (in-process transport
/// only).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct TransportCounters {
    /// Packets handed to the path.
    pub sent_packets: u64,
    /// Bytes of those packets (IB transport packet bytes, ICRC included).
    pub sent_bytes: u64,
    /// Sends that failed (the error was also returned to the caller).
    pub send_errors: u64,
    /// Packets handed out by `recv`.
    pub received_packets: u64,
    /// Bytes of those packets.
    pub received_bytes: u64,
    /// Datagrams dropped because their ICRC did not verify (§1.7 step 5).
    pub dropped_bad_icrc: u64,
    /// Datagrams dropped because they cannot be an IB transport packet: shorter than a BTH
    /// and an ICRC, or not a whole number of 4-byte words (§1.6).
    pub dropped_malformed: u64,
    /// Datagrams dropped because they did not fit the caller's buffer.
    pub dropped_truncated: u64,
    /// Packets addressed to an endpoint nobody listens on, or dropped because the
    /// receiver's queue was full (in-process transport only; UDP loses them silently).
    pub dropped_undeliverable: u64,
    /// Packets handed out without an ICRC check (counted in `received_packets` too).
    pub icrc_unchecked: u64,
    /// System calls made to send (`sendto`, `sendmmsg`), failed ones included:
    /// `sent_packets / send_calls` is how many packets one call carried.
    pub send_calls: u64,
    /// System calls made to receive (`recvmsg`, `recvmmsg`), including those that found
    /// nothing (`EAGAIN`): `received_packets / recv_calls` is how many one call carried.
    pub recv_calls: u64,
    /// Datagrams the kernel dropped because the socket's receive buffer was full, as the
    /// kernel last reported it (`SO_RXQ_OVFL`, socket(7)): they never reach the transport,
    /// so they are not in the sum above. Reported with the next datagram received after a
    /// drop, so it can lag.
    pub socket_drops: u64,
    /// Super-datagrams sent with UDP segmentation offload (`UDP_SEGMENT`, udp(7)): one
    /// message that the kernel (or the NIC) cuts into several packets, each counted in
    /// `sent_packets`.
    pub gso_sends: u64,
    /// Packets that arrived coalesced with others into one datagram by UDP receive
    /// offload (`UDP_GRO`, udp(7)), good or dropped: each is also counted as a packet
    /// above (received or dropped by reason).
    pub gro_segments: u64,
    /// Packets of the socket's coalesced datagrams the device handled where they lay in
    /// the transport's receive arena (no copy into a receive buffer first; also counted in
    /// `received_packets`).
    pub gro_in_place_packets: u64,
    /// Packets sent into the shared-memory inbox of a device of another process of this
    /// host (also counted in `sent_packets`; no system call carried them).
    pub shm_sent_packets: u64,
    /// Packets taken from this device's shared-memory inbox (also counted in
    /// `received_packets`).
    pub shm_received_packets: u64,
    /// Payload bytes read from this device's registered memory straight into the record
    /// of a peer's ring (one copy on the sending side: no packet buffer between).
    pub shm_direct_bytes: u64,
    /// Packets of the inbox the device handled where they lay (no copy into a receive
    /// buffer first; also counted in `shm_received_packets`).
    pub shm_in_place_packets: u64,
    /// Times a sender waited in vain for room in a peer's full ring (the receiver took
    /// nothing out for 5 ms: stopped, in a debugger, or off its CPU). The packet is
    /// dropped (`dropped_undeliverable`), and so is every packet for that ring, at once,
    /// until the receiver takes one out.
    pub shm_stalls: u64,
}

impl fmt::Display for TransportCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sent {} pkts / {} B ({} errors) in {} calls, received {} pkts / {} B in {} calls, \
             dropped: bad icrc {}, malformed {}, truncated {}, undeliverable {}, by the socket \
             {}; icrc unchecked {}; offload: {} GSO sends, {} GRO segments ({} handled in \
             place); shared memory: {} \
             sent, {} received, {} payload bytes sent straight from registered memory, {} \
             handled in place, {} stalls",
            self.sent_packets,
            self.sent_bytes,
            self.send_errors,
            self.send_calls,
            self.received_packets,
            self.received_bytes,
            self.recv_calls,
            self.dropped_bad_icrc,
            self.dropped_malformed,
            self.dropped_truncated,
            self.dropped_undeliverable,
            self.socket_drops,
            self.icrc_unchecked,
            self.gso_sends,
            self.gro_segments,
            self.gro_in_place_packets,
            self.shm_sent_packets,
            self.shm_received_packets,
            self.shm_direct_bytes,
            self.shm_in_place_packets,
            self.shm_stalls
        )
    }
}

/// The live counters behind [`TransportCounters`], shared by a transport's senders and
/// receivers.
///
/// Ordering: every counter is an independent statistic, incremented with `Relaxed` by the
/// thread that saw the event and read with `Relaxed` by [`AtomicCounters::snapshot`]; no
/// other memory is published through them, so a snapshot may mix counts from slightly
/// different instants but each count is exact. A counter whose writers a lock serialises
/// may be incremented with a load and a store ([`add_exclusive`]) by its holder.
#[derive(Debug, Default)]
pub(crate) struct AtomicCounters {
    pub(crate) sent_packets: AtomicU64,
    pub(crate) sent_bytes: AtomicU64,
    pub(crate) send_errors: AtomicU64,
    pub(crate) received_packets: AtomicU64,
    pub(crate) received_bytes: AtomicU64,
    pub(crate) dropped_bad_icrc: AtomicU64,
    pub(crate) dropped_malformed: AtomicU64,
    pub(crate) dropped_truncated: AtomicU64,
    pub(crate) dropped_undeliverable: AtomicU64,
    pub(crate) icrc_unchecked: AtomicU64,
    pub(crate) send_calls: AtomicU64,
    pub(crate) recv_calls: AtomicU64,
    /// The largest `SO_RXQ_OVFL` count seen (the kernel's count only grows; `fetch_max`
    /// keeps two receiving threads from moving it back).
    pub(crate) socket_drops: AtomicU64,
    pub(crate) gso_sends: AtomicU64,
    pub(crate) gro_segments: AtomicU64,
    pub(crate) gro_in_place_packets: AtomicU64,
}

/// Adds one to a counter (see [`AtomicCounters`] for the ordering).
pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Adds `n` to a counter that only the caller writes at the moment (it holds the lock
/// that serialises its writers, which orders each write after the last): a load and a
/// store, no locked instruction.
pub(crate) fn add_exclusive(counter: &AtomicU64, n: usize) {
    if n > 0 {
        counter.store(
            counter.load(Ordering::Relaxed).wrapping_add(n as u64),
            Ordering::Relaxed,
        );
    }
}

/// Adds `n` to a counter (see [`AtomicCounters`] for the ordering); adding nothing
/// (a packet sent without a payload read from a region, most often) is no locked add.
pub(crate) fn add(counter: &AtomicU64, n: usize) {
    if n > 0 {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
}

impl AtomicCounters {
    pub(crate) fn snapshot(&self) -> TransportCounters {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        TransportCounters {
            sent_packets: load(&self.sent_packets),
            sent_bytes: load(&self.sent_bytes),
            send_errors: load(&self.send_errors),
            received_packets: load(&self.received_packets),
            received_bytes: load(&self.received_bytes),
            dropped_bad_icrc: load(&self.dropped_bad_icrc),
            dropped_malformed: load(&self.dropped_malformed),
            dropped_truncated: load(&self.dropped_truncated),
            dropped_undeliverable: load(&self.dropped_undeliverable),
            icrc_unchecked: load(&self.icrc_unchecked),
            send_calls: load(&self.send_calls),
            recv_calls: load(&self.recv_calls),
            socket_drops: load(&self.socket_drops),
            gso_sends: load(&self.gso_sends),
            gro_segments: load(&self.gro_segments),
            gro_in_place_packets: load(&self.gro_in_place_packets),
            shm_sent_packets: 0,
            shm_received_packets: 0,
            shm_direct_bytes: 0,
            shm_in_place_packets: 0,
            shm_stalls: 0,
        }
    }

    pub(crate) fn count_sent(&self, len: usize) {
        bump(&self.sent_packets);
        add(&self.sent_bytes, len);
    }

    /// [`count_sent`](Self::count_sent) by the only thread that writes the sent counters
    /// at the moment (it holds the lock that serialises them), with no locked add.
    pub(crate) fn count_sent_exclusive(&self, len: usize) {
        add_exclusive(&self.sent_packets, 1);
        add_exclusive(&self.sent_bytes, len);
    }

    pub(crate) fn count_drop(&self, reason: DropReason) {
        bump(match reason {
            DropReason::BadIcrc => &self.dropped_bad_icrc,
            DropReason::Malformed => &self.dropped_malformed,
            DropReason::Truncated => &self.dropped_truncated,
            DropReason::Undeliverable => &self.dropped_undeliverable,
        });
    }

    pub(crate) fn count_received(&self, len: usize) {
        bump(&self.received_packets);
        add(&self.received_bytes, len);
    }

    /// [`count_received`](Self::count_received) by the only thread that writes the
    /// received counters at the moment (it holds the lock that serialises them: the
    /// shared-memory consumer's), with no locked add.
    pub(crate) fn count_received_exclusive(&self, len: usize) {
        add_exclusive(&self.received_packets, 1);
        add_exclusive(&self.received_bytes, len);
    }
}

/// Why a transport dropped a datagram (one [`TransportCounters`] field each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DropReason {
    BadIcrc,
    Malformed,
    Truncated,
    Undeliverable,
}

/// One packet of [`Transport::send_batch`]: where it goes, the UDP source port hint, its
/// bytes (BTH … ICRC; the ICRC is filled by the batch send, as by [`Transport::send`]),
/// and, after the call, the headers it was sent with.
#[derive(Debug)]
pub struct OutgoingPacket<'a> {
    /// The destination.
    pub to: Endpoint,
    /// The UDP source port hint (see [`udp_src_port_for_qps`]).
    pub src_port: u16,
    /// The IB transport packet; its last 4 bytes become the ICRC.
    pub bytes: &'a mut [u8],
    /// Set by [`Transport::send_batch`] to the headers the packet went with when it was
    /// handed to the path; `None` if it was not (the failure was logged and, for a socket
    /// error, counted in `send_errors`).
    pub sent: Option<Sent>,
    /// Payload still to be read from registered memory into `bytes` (only for a transport
    /// that [takes them](Transport::takes_deferred)); the pieces' offsets count from
    /// `deferred_base` before `bytes`' first byte.
    pub(crate) deferred: &'a [Deferred],
    pub(crate) deferred_base: usize,
}

impl<'a> OutgoingPacket<'a> {
    /// A packet for `to` from source port hint `src_port`, not sent yet.
    pub fn new(to: Endpoint, src_port: u16, bytes: &'a mut [u8]) -> OutgoingPacket<'a> {
        OutgoingPacket {
            to,
            src_port,
            bytes,
            sent: None,
            deferred: &[],
            deferred_base: 0,
        }
    }

    /// A packet part of whose payload is still to be read (`crate::deferred`): `pieces`,
    /// with offsets counted from `base` before `bytes`' first byte.
    pub(crate) fn with_deferred(
        to: Endpoint,
        src_port: u16,
        bytes: &'a mut [u8],
        base: usize,
        pieces: &'a [Deferred],
    ) -> OutgoingPacket<'a> {
        OutgoingPacket {
            deferred: pieces,
            deferred_base: base,
            ..OutgoingPacket::new(to, src_port, bytes)
        }
    }

    /// Reads the payload still to be read into `bytes`; false if that faulted (the packet
    /// must not be sent).
    pub(crate) fn fill_deferred(&mut self) -> bool {
        let pieces = std::mem::take(&mut self.deferred);
        crate::deferred::fill(self.bytes, self.deferred_base, pieces)
    }
}

/// True if `len` bytes can be an IB transport packet: a BTH and an ICRC at least, and a
/// whole number of 4-byte words (headers, payload + pad and ICRC all are, §1.6).
pub(crate) fn plausible_packet_len(len: usize) -> bool {
    len >= MIN_PACKET_LEN && len.is_multiple_of(4)
}

/// A device's path to its peers: moves IB transport packets (BTH … ICRC) between
/// [`Endpoint`]s, owning the IP / UDP encapsulation and the ICRC.
///
/// Contract:
///
/// - All methods take `&self` and may be called from several threads at once (sends from
///   application threads, receives from the progress thread).
/// - `prepare` fills the last 4 bytes of `ib_packet` with the ICRC for the headers it
///   returns; `transmit` sends the bytes unchanged. A packet must be at least
///   [`MIN_PACKET_LEN`] bytes. Both return errors for local problems only (bad argument,
///   socket error); a packet lost on the way is not an error.
/// - `recv` waits at most `timeout` (`None`: until a packet arrives; `Some(ZERO)`: does
///   not wait) and returns `Ok(None)` when the time is up. It drops and counts datagrams
///   that are malformed, do not fit `buf` or fail the ICRC check, and keeps waiting for a
///   good one within the same timeout.
/// - `send_batch` sends its packets in order, each as `send` would; `recv_batch` returns
///   packets in the order they arrived, each checked as `recv` checks it.
pub trait Transport: Send + Sync {
    /// The endpoint this transport receives on and sends from.
    fn local(&self) -> Endpoint;

    /// Chooses the IP / UDP headers `ib_packet` will travel with to `to` (UDP source port
    /// `src_port` if the transport can, see [`udp_src_port_for_qps`]) and fills its ICRC.
    fn prepare(&self, to: &Endpoint, src_port: u16, ib_packet: &mut [u8]) -> io::Result<Sent>;

    /// Sends `ib_packet` exactly as it is, with the headers `sent` describes (as returned
    /// by [`Transport::prepare`] of the same transport for the same destination).
    fn transmit(&self, to: &Endpoint, sent: &Sent, ib_packet: &[u8]) -> io::Result<()>;

    /// [`Transport::prepare`] then [`Transport::transmit`].
    fn send(&self, to: &Endpoint, src_port: u16, ib_packet: &mut [u8]) -> io::Result<Sent> {
        let sent = self.prepare(to, src_port, ib_packet)?;
        self.transmit(to, &sent, ib_packet)?;
        Ok(sent)
    }

    /// Sends every packet of `packets`, in order, as [`Transport::send`] sends one (the
    /// ICRC filled for the headers chosen), and sets [`OutgoingPacket::sent`] of each one
    /// handed to the path. Returns how many were. A packet that cannot be sent is logged
    /// and skipped (a socket error is counted in `send_errors`); the others still go.
    /// The default sends them one by one.
    fn send_batch(&self, packets: &mut [OutgoingPacket<'_>]) -> usize {
        let mut sent = 0;
        for packet in packets.iter_mut() {
            match self.send(&packet.to, packet.src_port, packet.bytes) {
                Ok(headers) => {
                    packet.sent = Some(headers);
                    sent += 1;
                }
                Err(error) => {
                    packet.sent = None;
                    tracing::debug!(%error, to = %packet.to.addr(), "send failed");
                }
            }
        }
        sent
    }

    /// Receives the next good packet into the front of `buf`; see the trait contract.
    fn recv(&self, buf: &mut [u8], timeout: Option<Duration>) -> io::Result<Option<Received>>;

    /// Receives up to `bufs.len()` good packets: waits as [`Transport::recv`] does (at
    /// most `timeout`) for the first, then takes only what is already there. Clears
    /// `received` and appends one [`Received`] per packet, in arrival order; packet `k` is
    /// at the front of `bufs[k]` (an implementation may swap the slices of `bufs` to put
    /// it there). Returns how many packets there are; `Ok(0)` when the time is up. An error
    /// after some packets were taken returns those packets (the error comes back on a
    /// later call, if it persists). The default calls [`Transport::recv`] per packet.
    fn recv_batch(
        &self,
        bufs: &mut [&mut [u8]],
        received: &mut Vec<Received>,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        received.clear();
        for (index, buf) in bufs.iter_mut().enumerate() {
            let wait = if index == 0 {
                timeout
            } else {
                Some(Duration::ZERO)
            };
            match self.recv(buf, wait) {
                Ok(Some(packet)) => received.push(packet),
                Ok(None) => break,
                Err(error) if received.is_empty() => return Err(error),
                Err(_) => break,
            }
        }
        Ok(received.len())
    }

    /// Hands up to `max` packets that wait in memory (a shared-memory ring, the datagrams
    /// a socket with GRO took in one receive) to `handle` where they lie, without copying
    /// them into a buffer first, in arrival order, each checked as [`Transport::recv`]
    /// checks it; returns how many it handed. What it cannot hand in place (a socket's
    /// datagrams without GRO, ring records with an ICRC to check, or after one) stays for
    /// [`Transport::recv_batch`], which a receiver calls next. `handle` must not keep the
    /// bytes: their memory is reused once it returns. The default hands none.
    fn take_in_place(&self, max: usize, handle: &mut dyn FnMut(&Received, &[u8])) -> usize {
        let _ = (max, handle);
        0
    }

    /// Waits up to `timeout` until a packet may be there to receive, without receiving it
    /// (so a caller can wait without holding the lock that orders its receives). May
    /// return early; the default sleeps briefly.
    fn wait_readable(&self, timeout: Duration) -> io::Result<()> {
        std::thread::sleep(timeout.min(Duration::from_micros(200)));
        Ok(())
    }

    /// A file descriptor that polls readable (`POLLIN`) when a packet may be there to
    /// receive, for a thread that waits on it together with other fds (a blocked
    /// `get_event` that receives its CQ's packets itself). `None` if the transport has no
    /// such fd; [`Transport::wait_readable`] is then the only way to wait.
    fn readiness_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// Called by a thread about to sleep on [`Transport::readiness_fd`] (`true`) and after
    /// it woke (`false`). Before: returns true if a packet is there already (the thread
    /// should receive instead of sleeping). A transport whose peers write into memory
    /// rather than into the fd counts the sleeper, so that they wake it. The default does
    /// nothing and returns false.
    fn sleeping(&self, before: bool) -> bool {
        let _ = before;
        false
    }

    /// Whether peers of this host write packets into this transport's memory (a
    /// shared-memory inbox), ringing a doorbell only for a counted sleeper. The default:
    /// false.
    fn memory_inbox(&self) -> bool {
        false
    }

    /// Whether a packet waits to be received, looked at without receiving it and without
    /// draining what a sleeper waits on (a shared-memory doorbell): how the progress thread
    /// finds packets that a thread woken for them did not take. The default: false.
    fn pending_packets(&self) -> bool {
        false
    }

    /// Whether [`Transport::send_batch`] reads the payload a device left to be read as
    /// packets leave (`crate::deferred`: one copy from the region into shared memory); if
    /// not, the device reads it into the packets first. The default: false.
    fn takes_deferred(&self) -> bool {
        false
    }

    /// Says that the device takes packets of direct segments (larger than any path MTU)
    /// from peers that send without a wire between them: it neither captures nor injects
    /// faults. Middleware that needs the wire's packets (capture, faults) does not pass it
    /// on. The default does nothing.
    fn offer_direct_segments(&self) {}

    /// Whether QP `dest_qpn` at `to` is reached without a wire, both ways, by a device
    /// that takes direct segments — and this one offered them too: a QP connected to it
    /// may send (and take) packets of a direct segment (`Engine::set_segment_size`). Both
    /// ends answer alike. The default: false.
    fn direct_segments_to(&self, to: &Endpoint, dest_qpn: u32) -> bool {
        let _ = (to, dest_qpn);
        false
    }

    /// Whether an ACK held for `to` may leave right behind the packet that takes it along,
    /// in one datagram with it (a GSO message the peer receives whole, with `UDP_GRO`),
    /// instead of ahead of it in a datagram of its own. Only where the peer is a softverbs
    /// device for sure: it takes the datagram's packets in one run and completes the
    /// ACK's send before the packet's receive, as the wire's order would have; another
    /// stack could complete them the other way round. The default: false.
    fn acks_may_follow(&self, to: &Endpoint) -> bool {
        let _ = to;
        false
    }

    /// Gets ready to send to QP `dest_qpn` at `to` (a connected QP entering RTR): a
    /// transport that reaches devices of this host through shared memory opens the
    /// peer's inbox and claims its ring now, so the first packet of the connection
    /// (and the first answer, the peer doing the same) does not pay for it. The default:
    /// nothing.
    fn prepare_route(&self, to: &Endpoint, dest_qpn: u32) {
        let _ = (to, dest_qpn);
    }

    /// The share of its address this transport's device holds when devices of several
    /// processes share the address (their slot; QPNs `share << 16 ..`), which the high
    /// byte of its connection manager's communication IDs must carry
    /// (`softverbs_cm::CmConfig::share`). The default: 0, an address of its own.
    fn address_share(&self) -> u8 {
        0
    }

    /// How this transport's device uses an address that devices of several processes of
    /// this host may share: its slot, whether it holds the address's socket, the other
    /// members now. `None` for a transport that never shares its address. The default:
    /// `None`.
    fn sharing(&self) -> Option<Sharing> {
        None
    }

    /// Says that the device's connection manager listens on `service_id`, so that REQs and
    /// SIDR_REQs for it reach this device when its address is shared. `EADDRINUSE` when a
    /// device of another process on the address listens on it (one port space per
    /// address, as the kernel's). The default: `Ok`, an address of its own.
    fn listen_service(&self, service_id: u64) -> io::Result<()> {
        let _ = service_id;
        Ok(())
    }

    /// Undoes [`Transport::listen_service`]. The default does nothing.
    fn unlisten_service(&self, service_id: u64) {
        let _ = service_id;
    }

    /// True if packets for `to` go through shared memory rather than a socket (a capture
    /// marks them so). The default: false.
    fn in_memory(&self, to: &Endpoint) -> bool {
        let _ = to;
        false
    }

    /// A snapshot of the counters.
    fn counters(&self) -> TransportCounters;

    /// Starts receiving the packets sent to IP multicast address `group` (a multicast GID's
    /// address, `ibv_attach_mcast(3)`), as well as those sent to [`Transport::local`].
    /// Joining a group twice changes nothing. The default refuses (`Unsupported`): a
    /// transport that can deliver multicast says so; middleware passes the call down.
    fn join_multicast(&self, group: IpAddr) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("this transport cannot receive multicast group {group}"),
        ))
    }

    /// Stops receiving `group` ([`Transport::join_multicast`]); `NotFound` if not joined.
    fn leave_multicast(&self, group: IpAddr) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("not in multicast group {group}"),
        ))
    }
}

/// How a device uses its address when devices of several processes of this host may share
/// it ([`Transport::sharing`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sharing {
    /// The device's slot among the address's members: its QP numbers are
    /// `slot << 16 .. (slot + 1) << 16`.
    pub slot: u8,
    /// Whether this device holds the address's socket (it bound it first, or took it over
    /// from a holder that went away) and forwards the other members' packets.
    pub holds_socket: bool,
    /// The process holding the socket (0: none said so).
    pub holder: u32,
    /// Devices of other live processes on the address now.
    pub others: u32,
}

impl Sharing {
    /// Whether the address is shared now, or was when the device joined it: a member (a
    /// slot after the first, or no socket), or a holder with members.
    pub fn is_shared(&self) -> bool {
        self.slot != 0 || !self.holds_socket || self.others > 0
    }
}

/// `shared: slot S, holds the socket, N other members`, or `… the socket held by pid P …`.
impl fmt::Display for Sharing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shared: slot {}, ", self.slot)?;
        match (self.holds_socket, self.holder) {
            (true, _) => write!(f, "holds the socket")?,
            (false, 0) => write!(f, "no process holds the socket")?,
            (false, pid) => write!(f, "the socket held by pid {pid}")?,
        }
        let noun = if self.others == 1 {
            "member"
        } else {
            "members"
        };
        write!(f, ", {} other {noun}", self.others)
    }
}

/// Forwards every method of [`Transport`] through a smart pointer, so `Arc<T>` and
/// `Box<T>` (and `Box<dyn Transport>`) are transports too.
macro_rules! forward_transport {
    ($pointer:ident) => {
        impl<T: Transport + ?Sized> Transport for $pointer<T> {
            fn local(&self) -> Endpoint {
                (**self).local()
            }
            fn prepare(
                &self,
                to: &Endpoint,
                src_port: u16,
                ib_packet: &mut [u8],
            ) -> io::Result<Sent> {
                (**self).prepare(to, src_port, ib_packet)
            }
            fn transmit(&self, to: &Endpoint, sent: &Sent, ib_packet: &[u8]) -> io::Result<()> {
                (**self).transmit(to, sent, ib_packet)
            }
            fn send(&self, to: &Endpoint, src_port: u16, ib_packet: &mut [u8]) -> io::Result<Sent> {
                (**self).send(to, src_port, ib_packet)
            }
            fn send_batch(&self, packets: &mut [OutgoingPacket<'_>]) -> usize {
                (**self).send_batch(packets)
            }
            fn recv(
                &self,
                buf: &mut [u8],
                timeout: Option<Duration>,
            ) -> io::Result<Option<Received>> {
                (**self).recv(buf, timeout)
            }
            fn recv_batch(
                &self,
                bufs: &mut [&mut [u8]],
                received: &mut Vec<Received>,
                timeout: Option<Duration>,
            ) -> io::Result<usize> {
                (**self).recv_batch(bufs, received, timeout)
            }
            fn take_in_place(&self, max: usize, handle: &mut dyn FnMut(&Received, &[u8])) -> usize {
                (**self).take_in_place(max, handle)
            }
            fn wait_readable(&self, timeout: Duration) -> io::Result<()> {
                (**self).wait_readable(timeout)
            }
            fn readiness_fd(&self) -> Option<BorrowedFd<'_>> {
                (**self).readiness_fd()
            }
            fn sleeping(&self, before: bool) -> bool {
                (**self).sleeping(before)
            }
            fn pending_packets(&self) -> bool {
                (**self).pending_packets()
            }
            fn memory_inbox(&self) -> bool {
                (**self).memory_inbox()
            }
            fn in_memory(&self, to: &Endpoint) -> bool {
                (**self).in_memory(to)
            }
            fn offer_direct_segments(&self) {
                (**self).offer_direct_segments()
            }
            fn takes_deferred(&self) -> bool {
                (**self).takes_deferred()
            }
            fn direct_segments_to(&self, to: &Endpoint, dest_qpn: u32) -> bool {
                (**self).direct_segments_to(to, dest_qpn)
            }
            fn prepare_route(&self, to: &Endpoint, dest_qpn: u32) {
                (**self).prepare_route(to, dest_qpn)
            }
            fn acks_may_follow(&self, to: &Endpoint) -> bool {
                (**self).acks_may_follow(to)
            }
            fn address_share(&self) -> u8 {
                (**self).address_share()
            }
            fn sharing(&self) -> Option<Sharing> {
                (**self).sharing()
            }
            fn listen_service(&self, service_id: u64) -> io::Result<()> {
                (**self).listen_service(service_id)
            }
            fn unlisten_service(&self, service_id: u64) {
                (**self).unlisten_service(service_id)
            }
            fn counters(&self) -> TransportCounters {
                (**self).counters()
            }
            fn join_multicast(&self, group: IpAddr) -> io::Result<()> {
                (**self).join_multicast(group)
            }
            fn leave_multicast(&self, group: IpAddr) -> io::Result<()> {
                (**self).leave_multicast(group)
            }
        }
    };
}

forward_transport!(Arc);
forward_transport!(Box);

/// The [`Transport`] methods a middleware (fault injection, capture) passes to the
/// transport below it, `self.inner`, unchanged: multicast membership, the sleeper count,
/// the shared-memory questions and the address share. Expands inside its `impl Transport`.
/// Not the direct-segment offer (`offer_direct_segments`, `direct_segments_to`): a
/// middleware's packets must be the wire's, so it keeps the defaults.
macro_rules! pass_to_inner {
    () => {
        fn join_multicast(&self, group: std::net::IpAddr) -> io::Result<()> {
            self.inner.join_multicast(group)
        }
        fn leave_multicast(&self, group: std::net::IpAddr) -> io::Result<()> {
            self.inner.leave_multicast(group)
        }
        fn sleeping(&self, before: bool) -> bool {
            self.inner.sleeping(before)
        }
        fn memory_inbox(&self) -> bool {
            self.inner.memory_inbox()
        }
        fn in_memory(&self, to: &Endpoint) -> bool {
            self.inner.in_memory(to)
        }
        fn address_share(&self) -> u8 {
            self.inner.address_share()
        }
        fn sharing(&self) -> Option<crate::transport::Sharing> {
            self.inner.sharing()
        }
        fn listen_service(&self, service_id: u64) -> io::Result<()> {
            self.inner.listen_service(service_id)
        }
        fn unlisten_service(&self, service_id: u64) {
            self.inner.unlisten_service(service_id)
        }
    };
}
pub(crate) use pass_to_inner;

/// The IP header a packet of `ib_len` bytes from `from` to `to` carries when the sender
/// writes it the way softverbs does: IPv4 as Linux writes it for an unconnected
/// `IP_PMTUDISC_DO` socket (ID 0, DF; §5.2), IPv6 with flow label 0 (masked anyway).
/// `InvalidInput` for mixed IP versions or a packet too long for the length fields.
pub(crate) fn path_headers(
    from: &Endpoint,
    to: &Endpoint,
    src_port: u16,
    traffic_class: u8,
    hop_limit: u8,
    ib_len: usize,
) -> io::Result<(IpHeaderInfo, UdpHeaderInfo)> {
    if ib_len < MIN_PACKET_LEN {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "IB transport packet shorter than a BTH and an ICRC",
        ));
    }
    let mut udp = UdpHeaderInfo::rocev2(src_port, ib_len).map_err(invalid_input)?;
    udp.dst_port = to.port();
    let ip = match (from.addr(), to.addr()) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            IpHeaderInfo::linux_ipv4(src, dst, traffic_class, hop_limit, udp.length)
                .map_err(invalid_input)?
        }
        (IpAddr::V6(src), IpAddr::V6(dst)) => {
            IpHeaderInfo::ipv6(src, dst, traffic_class, 0, hop_limit, udp.length)
        }
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{from} and {to} are not the same IP version (reference §4.3)"),
            ))
        }
    };
    Ok((ip, udp))
}

pub(crate) fn invalid_input(error: softverbs_wire::WireError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, error)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Reference §4.3: an IPv4 address is the GID ::ffff:a.b.c.d, an IPv6 address is itself,
    // and both convert back.
    #[test]
    fn gid_of_ipv4_is_ipv4_mapped_and_converts_back() {
        let v4: IpAddr = "127.0.0.2".parse().unwrap();
        let gid = Gid::from(v4);
        assert_eq!(
            gid.octets(),
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 127, 0, 0, 2]
        );
        assert_eq!(gid.to_string(), "::ffff:127.0.0.2");
        assert!(gid.is_ipv4());
        assert_eq!(gid.ip(), v4);
        let endpoint = Endpoint::from_gid(gid, DEFAULT_PORT);
        assert_eq!(endpoint, Endpoint::rocev2(v4));
        assert_eq!(endpoint.gid(), gid);
        assert_eq!(endpoint.to_string(), "127.0.0.2:4791");

        let v6: IpAddr = "fe80::1".parse().unwrap();
        let gid6 = Gid::from(v6);
        assert!(!gid6.is_ipv4());
        assert_eq!(gid6.ip(), v6);
        assert_eq!(Endpoint::from_gid(gid6, 7).to_string(), "[fe80::1]:7");

        // A mapped IPv6 address given as an endpoint address becomes IPv4.
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert!(Endpoint::new(mapped, 1).is_ipv4());
    }

    // Reference §4.4: QPNs 361 and 313 give source port 0xF967, both ways round; every
    // port is in 0xC000..=0xFFFF.
    #[test]
    fn udp_source_port_follows_rdma_get_udp_sport() {
        assert_eq!(udp_src_port_for_qps(361, 313), 0xF967);
        assert_eq!(udp_src_port_for_qps(313, 361), 0xF967);
        for qpn in [0u32, 1, 2, 17, 0xFF_FFFF, 12345] {
            assert!(udp_src_port_for_qp(qpn) >= 0xC000);
            assert!(udp_src_port_for_qps(qpn, 0xFF_FFFF) >= 0xC000);
        }
    }

    #[test]
    fn path_headers_refuse_mixed_versions_and_short_packets() {
        let v4 = Endpoint::rocev2("127.0.0.1".parse().unwrap());
        let v6 = Endpoint::rocev2("::1".parse().unwrap());
        assert!(path_headers(&v4, &v6, 0xC000, 0, 64, 16).is_err());
        assert!(path_headers(&v4, &v4, 0xC000, 0, 64, 15).is_err());
        assert!(path_headers(&v4, &v4, 0xC000, 0, 64, 70_000).is_err());
        let (ip, udp) = path_headers(&v4, &v4, 0xC123, 0, 64, 16).unwrap();
        assert_eq!(udp.length, 24);
        assert_eq!(udp.src_port, 0xC123);
        assert!(matches!(
            ip,
            IpHeaderInfo::V4 {
                id: 0,
                flags_frag: 0x4000,
                total_len: 44,
                ..
            }
        ));
    }
}
