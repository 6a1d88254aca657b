//! Packet capture as transport middleware, and a reader for the files it writes.
//!
//! [`PcapTransport`] wraps any [`Transport`] and records every packet it transmits and
//! every packet it hands out of `recv` into a [`Capture`]: a classic pcap file (microsecond
//! timestamps, link type Ethernet) that Wireshark / `tshark` decode as RoCEv2 / InfiniBand
//! (UDP destination port 4791, reference `rocev2.md` §1.1). Several transports may share
//! one capture (`Arc<Capture>`), e.g. both ends of an in-process connection; recording can
//! be switched on and off at run time ([`Capture::set_enabled`]).
//!
//! Where it sits in a stack decides what it shows: `PcapTransport<FaultTransport<T>>`
//! records what the device meant to send (faults happen below it), while
//! `FaultTransport<PcapTransport<T>>` records what went on the wire, corrupted ICRCs
//! included.
//!
//! # Frames
//!
//! Each packet becomes `Ethernet | IPv4 or IPv6 | UDP | IB transport packet (ICRC
//! included)`, the IP and UDP headers being exactly those the ICRC was computed over
//! ([`Sent`] / [`Received`]): for IPv4 as Linux writes them for a softverbs sender (ID 0,
//! DF, valid header checksum; §5.2), so the ICRC in the file verifies. The UDP checksum is
//! 0 over IPv4 (as `rxe` and ConnectX send, §1.1) and computed over IPv6 (where 0 is
//! illegal). Packets received from a socket carry the TOS / TTL the socket reported;
//! their IPv4 ID is shown as 0, which is what softverbs senders write and is all a socket
//! can know (§5.3).
//!
//! Classic pcap has no direction field, so the Ethernet addresses carry it: the capturing
//! device is always [`LOCAL_MAC`] (`02:53:56:00:00:01`) and its peer [`PEER_MAC`]
//! (`02:53:56:00:00:02`). A transmitted packet goes `LOCAL_MAC → PEER_MAC`, a received one
//! `PEER_MAC → LOCAL_MAC`; [`read_capture`] turns that back into a [`Direction`].
//!
//! # Reading
//!
//! [`read_capture`] decodes a pcap file (ours, or any Ethernet / raw-IP capture, e.g. from
//! `tcpdump -w`) into [`CaptureRecord`]s: timestamp, direction, IP / UDP headers, the
//! parsed [`PacketRepr`] (or why it did not parse), and whether the ICRC verifies. Each
//! record prints like a tcpdump line. Frames that are not IP / UDP are skipped. Reading
//! never panics on a malformed file: it returns an error or skips the frame.
//!
//! Write errors (disk full, …) never fail the transport: they are counted
//! ([`Capture::write_errors`]) and logged, and the packet still goes.

use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::{DataLink, Endianness};
use softverbs_wire::icrc::{self, IpHeaderInfo, UdpHeaderInfo};
use softverbs_wire::{PacketRepr, WireError};

use crate::transport::{Endpoint, Received, Sent, Transport, TransportCounters};

/// Ethernet address of the capturing device in every frame (locally administered).
pub const LOCAL_MAC: [u8; 6] = [0x02, 0x53, 0x56, 0x00, 0x00, 0x01];
/// Ethernet address of the peer in every frame.
pub const PEER_MAC: [u8; 6] = [0x02, 0x53, 0x56, 0x00, 0x00, 0x02];

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86DD;
const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERNET_HEADER_LEN: usize = 14;
const UDP_HEADER_LEN: usize = 8;

/// Which way a captured packet went, seen from the capturing device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Transmitted by the capturing device.
    Outbound,
    /// Received by the capturing device.
    Inbound,
    /// Not known (a frame from another capture tool).
    Unknown,
}

/// Prints `out`, `in` or `?`.
impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::Outbound => "out",
            Direction::Inbound => "in",
            Direction::Unknown => "?",
        })
    }
}

/// The one's-complement sum of `bytes` added to `sum` (16-bit words, big-endian).
fn checksum_add(mut sum: u32, bytes: &[u8]) -> u32 {
    let mut chunks = bytes.chunks_exact(2);
    for pair in &mut chunks {
        sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(u16::from_be_bytes([*last, 0]));
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    sum
}

/// The UDP checksum over IPv6 (RFC 8200 §8.1), never 0.
fn udp6_checksum(ip: &IpHeaderInfo, udp_header: &[u8], payload: &[u8]) -> u16 {
    let IpHeaderInfo::V6 { src, dst, .. } = *ip else {
        return 0;
    };
    let mut sum = checksum_add(0, &src.octets());
    sum = checksum_add(sum, &dst.octets());
    sum = checksum_add(sum, &u32::from(ip.udp_len().unwrap_or(0)).to_be_bytes());
    sum = checksum_add(sum, &[0, 0, 0, 17]);
    sum = checksum_add(sum, udp_header);
    sum = checksum_add(sum, payload);
    match !(sum as u16) {
        0 => 0xFFFF,
        value => value,
    }
}

/// Builds the Ethernet frame of an IB transport packet (see the module documentation).
/// Errors if the headers do not describe `ib_packet` (`BadIpHeader`) or a length field
/// overflows.
pub fn ethernet_frame(
    direction: Direction,
    ip: &IpHeaderInfo,
    udp: &UdpHeaderInfo,
    ib_packet: &[u8],
) -> Result<Vec<u8>, WireError> {
    if usize::from(udp.length) != UDP_HEADER_LEN + ib_packet.len()
        || ip.udp_len() != Some(udp.length)
    {
        return Err(WireError::BadIpHeader);
    }
    let (src_mac, dst_mac) = match direction {
        Direction::Inbound => (PEER_MAC, LOCAL_MAC),
        Direction::Outbound | Direction::Unknown => (LOCAL_MAC, PEER_MAC),
    };
    let ethertype = match ip {
        IpHeaderInfo::V4 { .. } => ETHERTYPE_IPV4,
        IpHeaderInfo::V6 { .. } => ETHERTYPE_IPV6,
    };
    let ip_len = ip.header_len();
    let mut frame = vec![0u8; ETHERNET_HEADER_LEN + ip_len + UDP_HEADER_LEN + ib_packet.len()];
    frame[0..6].copy_from_slice(&dst_mac);
    frame[6..12].copy_from_slice(&src_mac);
    frame[12..14].copy_from_slice(&ethertype.to_be_bytes());
    let (_, rest) = frame.split_at_mut(ETHERNET_HEADER_LEN);
    ip.emit(rest)?;
    let (_, rest) = rest.split_at_mut(ip_len);
    udp.emit(rest)?;
    let (udp_header, payload) = rest.split_at_mut(UDP_HEADER_LEN);
    payload.copy_from_slice(ib_packet);
    if matches!(ip, IpHeaderInfo::V6 { .. }) {
        let checksum = udp6_checksum(ip, udp_header, payload);
        udp_header[6..8].copy_from_slice(&checksum.to_be_bytes());
    }
    Ok(frame)
}

/// The file behind a [`PcapWriter`], shared so that [`Capture::flush`] can reach it
/// (`PcapWriter` offers no access to its writer). Only ever locked while the capture's
/// own writer lock is held, so never contended.
#[derive(Clone)]
struct SharedWriter(Arc<Mutex<Box<dyn Write + Send>>>);

impl SharedWriter {
    fn lock(&self) -> MutexGuard<'_, Box<dyn Write + Send>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Write for SharedWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.lock().write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.lock().flush()
    }
}

/// The pcap writer and another handle to its file.
type Writer = (PcapWriter<SharedWriter>, SharedWriter);

/// A pcap file being written, shared by the transports that record into it.
pub struct Capture {
    enabled: AtomicBool,
    writer: Mutex<Option<Writer>>,
    /// Largest file size in bytes (`u64::MAX`: no limit); packets that would pass it are
    /// not written. Written before recording starts or at any time; `Relaxed`.
    limit: AtomicU64,
    /// Bytes written so far (the file header included). Updated under the writer lock.
    bytes: AtomicU64,
    /// Ordering for the counters: independent statistics, `Relaxed`.
    packets: AtomicU64,
    write_errors: AtomicU64,
    over_limit: AtomicU64,
}

/// Environment variable capping a capture's size (`SOFTVERBS_PCAP_LIMIT=100M`): bytes, or
/// a number with a `K`, `M` or `G` suffix (powers of 1024). Packets past the cap are not
/// written but counted ([`Capture::over_limit`]), so a flood cannot fill a disk.
pub const PCAP_LIMIT_ENV: &str = "SOFTVERBS_PCAP_LIMIT";

/// Bytes of a pcap file header and of a record header.
const FILE_HEADER_LEN: u64 = 24;
const RECORD_HEADER_LEN: u64 = 16;

/// Parses a size as [`PCAP_LIMIT_ENV`] takes it: `4096`, `64K`, `100M`, `2G`.
pub fn parse_size(spec: &str) -> Result<u64, String> {
    let spec = spec.trim();
    let (digits, unit) = match spec.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => spec.split_at(at),
        None => (spec, ""),
    };
    let shift = match unit.to_ascii_uppercase().trim_end_matches(['B', 'I']) {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("{spec:?}: not a size (bytes, or a K/M/G/T suffix)")),
    };
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("{spec:?}: not a size (bytes, or a K/M/G/T suffix)"))?;
    value
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{spec:?}: too large"))
}

impl fmt::Debug for Capture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Capture")
            .field("enabled", &self.enabled())
            .field("packets", &self.packets())
            .field("write_errors", &self.write_errors())
            .finish_non_exhaustive()
    }
}

impl Capture {
    /// Creates (truncates) the pcap file at `path` and writes its header. Recording is on.
    /// An error names the file and, when its folder does not exist, the folder (the
    /// error's kind is the operating system's).
    pub fn create(path: impl AsRef<Path>) -> io::Result<Arc<Capture>> {
        let path = path.as_ref();
        let named = |error: io::Error| {
            let folder = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty() && !p.is_dir());
            let message = match folder {
                Some(folder) => format!(
                    "cannot create the capture file {}: the folder {} does not exist ({error})",
                    path.display(),
                    folder.display()
                ),
                None => format!("cannot create the capture file {}: {error}", path.display()),
            };
            io::Error::new(error.kind(), message)
        };
        let file = File::create(path).map_err(named)?;
        Capture::to_writer(BufWriter::new(file)).map_err(named)
    }

    /// A capture into any writer (the pcap header is written now). Recording is on.
    pub fn to_writer(writer: impl Write + Send + 'static) -> io::Result<Arc<Capture>> {
        let header = PcapHeader {
            datalink: DataLink::ETHERNET,
            endianness: Endianness::Little,
            ..PcapHeader::default()
        };
        let boxed: Box<dyn Write + Send> = Box::new(writer);
        let shared = SharedWriter(Arc::new(Mutex::new(boxed)));
        let writer = PcapWriter::with_header(shared.clone(), header).map_err(pcap_to_io)?;
        Ok(Arc::new(Capture {
            enabled: AtomicBool::new(true),
            writer: Mutex::new(Some((writer, shared))),
            limit: AtomicU64::new(u64::MAX),
            bytes: AtomicU64::new(FILE_HEADER_LEN),
            packets: AtomicU64::new(0),
            write_errors: AtomicU64::new(0),
            over_limit: AtomicU64::new(0),
        }))
    }

    /// Caps the file at `bytes` (headers included): a packet whose record would pass it
    /// is not written, and counted in [`Capture::over_limit`].
    pub fn set_limit(&self, bytes: u64) {
        self.limit.store(bytes, Ordering::Relaxed);
    }

    /// Bytes written so far, headers included.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Packets not written because the file reached its cap.
    pub fn over_limit(&self) -> u64 {
        self.over_limit.load(Ordering::Relaxed)
    }

    /// Switches recording on or off (a packet in flight may still be recorded).
    pub fn set_enabled(&self, enabled: bool) {
        self.enabled.store(enabled, Ordering::Relaxed);
    }

    /// Whether packets are recorded.
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Packets written so far.
    pub fn packets(&self) -> u64 {
        self.packets.load(Ordering::Relaxed)
    }

    /// Packets that could not be written.
    pub fn write_errors(&self) -> u64 {
        self.write_errors.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, Option<Writer>> {
        self.writer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records one packet with the headers it travelled with, timestamped now. Does
    /// nothing while recording is off or after [`Capture::close`]; counts failures.
    pub fn record(
        &self,
        direction: Direction,
        ip: &IpHeaderInfo,
        udp: &UdpHeaderInfo,
        ib_packet: &[u8],
    ) {
        if !self.enabled() {
            return;
        }
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        let result = ethernet_frame(direction, ip, udp, ib_packet)
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))
            .and_then(|frame| {
                let mut writer = self.lock();
                let Some((writer, _)) = writer.as_mut() else {
                    return Ok(());
                };
                let record_len = RECORD_HEADER_LEN + frame.len() as u64;
                let written = self.bytes.load(Ordering::Relaxed);
                if written.saturating_add(record_len) > self.limit.load(Ordering::Relaxed) {
                    if self.over_limit.fetch_add(1, Ordering::Relaxed) == 0 {
                        tracing::warn!(
                            bytes = written,
                            "pcap capture reached its {PCAP_LIMIT_ENV} cap: later packets are \
                             counted, not written"
                        );
                    }
                    return Ok(());
                }
                let packet = PcapPacket::new(timestamp, frame.len() as u32, &frame);
                writer.write_packet(&packet).map_err(pcap_to_io)?;
                self.bytes.store(written + record_len, Ordering::Relaxed);
                self.packets.fetch_add(1, Ordering::Relaxed);
                Ok(())
            });
        if let Err(error) = result {
            self.write_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%error, "pcap capture: packet not written");
        }
    }

    /// Flushes buffered packets to the file.
    pub fn flush(&self) -> io::Result<()> {
        match self.lock().as_mut() {
            // `PcapWriter` only gives its writer back by value: flush through the handle.
            Some((_, file)) => file.flush(),
            None => Ok(()),
        }
    }

    /// Flushes and closes the file; later packets are not recorded.
    pub fn close(&self) -> io::Result<()> {
        match self.lock().take() {
            Some((writer, _)) => writer.into_writer().flush(),
            None => Ok(()),
        }
    }
}

/// `packets=N bytes=N over_limit=N write_errors=N`, as `SOFTVERBS_STATS` prints it.
impl fmt::Display for Capture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "packets={} bytes={} over_limit={} write_errors={}",
            self.packets(),
            self.bytes(),
            self.over_limit(),
            self.write_errors()
        )
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

fn pcap_to_io(error: pcap_file::PcapError) -> io::Error {
    match error {
        pcap_file::PcapError::IoError(error) => error,
        other => io::Error::new(io::ErrorKind::InvalidData, other),
    }
}

/// Capture middleware over `T`: records what `T` transmits and what its `recv` hands out.
#[derive(Debug)]
pub struct PcapTransport<T> {
    inner: T,
    capture: Arc<Capture>,
}

impl<T: Transport> PcapTransport<T> {
    /// Wraps `inner`, recording into `capture`.
    pub fn new(inner: T, capture: Arc<Capture>) -> PcapTransport<T> {
        PcapTransport { inner, capture }
    }

    /// The capture.
    pub fn capture(&self) -> &Arc<Capture> {
        &self.capture
    }

    /// The wrapped transport.
    pub fn inner(&self) -> &T {
        &self.inner
    }
}

impl<T: Transport> Transport for PcapTransport<T> {
    fn local(&self) -> Endpoint {
        self.inner.local()
    }

    fn prepare(&self, to: &Endpoint, src_port: u16, ib_packet: &mut [u8]) -> io::Result<Sent> {
        self.inner.prepare(to, src_port, ib_packet)
    }

    fn transmit(&self, to: &Endpoint, sent: &Sent, ib_packet: &[u8]) -> io::Result<()> {
        self.inner.transmit(to, sent, ib_packet)?;
        self.capture
            .record(Direction::Outbound, &sent.ip, &sent.udp, ib_packet);
        Ok(())
    }

    fn wait_readable(&self, timeout: Duration) -> io::Result<()> {
        self.inner.wait_readable(timeout)
    }

    fn readiness_fd(&self) -> Option<BorrowedFd<'_>> {
        self.inner.readiness_fd()
    }

    fn recv(&self, buf: &mut [u8], timeout: Option<Duration>) -> io::Result<Option<Received>> {
        let received = self.inner.recv(buf, timeout)?;
        if let Some(received) = &received {
            if let Some(packet) = buf.get(..received.len) {
                self.capture
                    .record(Direction::Inbound, &received.ip, &received.udp, packet);
            }
        }
        Ok(received)
    }

    fn counters(&self) -> TransportCounters {
        self.inner.counters()
    }
}

/// Why a capture file could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// The file could not be opened or read.
    #[error("cannot read the capture: {0}")]
    Io(#[from] io::Error),
    /// The file is not a pcap file pcap-file can read (pcapng is not supported).
    #[error("not a readable pcap file: {0}")]
    Pcap(#[from] pcap_file::PcapError),
    /// The link type is neither Ethernet nor raw IP.
    #[error("unsupported link type {0:?} (Ethernet and raw IP are supported)")]
    LinkType(DataLink),
}

/// One RoCEv2 packet of a capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureRecord {
    /// Position of the frame in the file (0-based, counting skipped frames).
    pub frame: usize,
    /// Capture time since the Unix epoch.
    pub timestamp: Duration,
    /// Which way it went (from the Ethernet addresses, see the module documentation).
    pub direction: Direction,
    /// The IP header.
    pub ip: IpHeaderInfo,
    /// The UDP header.
    pub udp: UdpHeaderInfo,
    /// The parsed IB transport headers and the payload length, or why they did not parse.
    pub packet: Result<(PacketRepr, usize), WireError>,
    /// The ICRC check: `Ok` if it verifies.
    pub icrc: Result<(), WireError>,
}

impl CaptureRecord {
    /// True if the ICRC verifies.
    pub fn icrc_ok(&self) -> bool {
        self.icrc.is_ok()
    }
}

/// Prints like tcpdump -tt: `1700000000.123456 out 127.0.0.1.49152 > 127.0.0.2.4791:
/// BTH opcode=RC SEND ONLY dqpn=0x000011 psn=42 ackreq pad=3 payload=5 icrc ok`.
impl fmt::Display for CaptureRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (src, dst) = match self.ip {
            IpHeaderInfo::V4 { src, dst, .. } => (src.to_string(), dst.to_string()),
            IpHeaderInfo::V6 { src, dst, .. } => (src.to_string(), dst.to_string()),
        };
        write!(
            f,
            "{}.{:06} {} {}.{} > {}.{}: ",
            self.timestamp.as_secs(),
            self.timestamp.subsec_micros(),
            self.direction,
            src,
            self.udp.src_port,
            dst,
            self.udp.dst_port
        )?;
        match &self.packet {
            Ok((repr, payload_len)) => write!(f, "{repr} payload={payload_len}")?,
            Err(error) => write!(f, "not an IB transport packet ({error})")?,
        }
        match self.icrc {
            Ok(()) => f.write_str(" icrc ok"),
            Err(WireError::BadIcrc { expected, found }) => {
                write!(
                    f,
                    " icrc BAD (computed {expected:#010x}, trailer {found:#010x})"
                )
            }
            Err(error) => write!(f, " icrc BAD ({error})"),
        }
    }
}

/// Decodes the pcap file at `path` (see the module documentation).
pub fn read_capture(path: impl AsRef<Path>) -> Result<Vec<CaptureRecord>, CaptureError> {
    read_capture_from(BufReader::new(File::open(path)?))
}

/// Decodes a pcap stream (see the module documentation).
pub fn read_capture_from(reader: impl Read) -> Result<Vec<CaptureRecord>, CaptureError> {
    match read_capture_tolerant(reader)? {
        (records, None) => Ok(records),
        (_, Some(error)) => Err(error),
    }
}

/// Decodes a pcap stream as far as its records are whole: the records before a broken
/// one, and what broke it (a file whose writer died mid-record ends in a partial
/// record, as `tcpdump` says of a "truncated dump file"). Errors before the first record
/// (not a pcap file, unsupported link type) are errors.
pub fn read_capture_tolerant(
    reader: impl Read,
) -> Result<(Vec<CaptureRecord>, Option<CaptureError>), CaptureError> {
    let mut reader = PcapReader::new(reader)?;
    let datalink = reader.header().datalink;
    if !matches!(
        datalink,
        DataLink::ETHERNET | DataLink::RAW | DataLink::IPV4 | DataLink::IPV6
    ) {
        return Err(CaptureError::LinkType(datalink));
    }
    let mut records = Vec::new();
    let mut frame = 0;
    while let Some(packet) = reader.next_packet() {
        let packet = match packet {
            Ok(packet) => packet,
            Err(error) => return Ok((records, Some(error.into()))),
        };
        if let Some(record) = decode_frame(frame, datalink, packet.timestamp, &packet.data) {
            records.push(record);
        }
        frame += 1;
    }
    Ok((records, None))
}

/// Decodes one frame; `None` if it is not IP / UDP.
fn decode_frame(
    frame: usize,
    datalink: DataLink,
    timestamp: Duration,
    data: &[u8],
) -> Option<CaptureRecord> {
    let (direction, ip_packet) = if datalink == DataLink::ETHERNET {
        let dst = data.get(0..6)?;
        let src = data.get(6..12)?;
        let mut at = 12;
        let mut ethertype = u16::from_be_bytes([*data.get(at)?, *data.get(at + 1)?]);
        while ethertype == ETHERTYPE_VLAN {
            at += 4;
            ethertype = u16::from_be_bytes([*data.get(at)?, *data.get(at + 1)?]);
        }
        if ethertype != ETHERTYPE_IPV4 && ethertype != ETHERTYPE_IPV6 {
            return None;
        }
        let direction = if src == LOCAL_MAC {
            Direction::Outbound
        } else if dst == LOCAL_MAC {
            Direction::Inbound
        } else {
            Direction::Unknown
        };
        (direction, data.get(at + 2..)?)
    } else {
        (Direction::Unknown, data)
    };
    let (ip, udp, ib_packet) = icrc::split_ip_packet(ip_packet).ok()?;
    let packet = PacketRepr::parse(ib_packet).map(|(repr, payload)| (repr, payload.len()));
    let icrc = icrc::verify(&ip, &udp, ib_packet);
    Some(CaptureRecord {
        frame,
        timestamp,
        direction,
        ip,
        udp,
        packet,
        icrc,
    })
}
