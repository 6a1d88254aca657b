//! Packet capture as transport middleware, and a reader for the files it writes.
//!
//! [`PcapTransport`] wraps any [`Transport`] and records every packet it transmits and
//! every packet it hands out of `recv` into a [`Capture`]: a pcap or pcapng file (link type
//! Ethernet) that Wireshark / `tshark` decode as RoCEv2 / InfiniBand (UDP destination port
//! 4791, IBTA Annex A17). Several transports may share one capture
//! (`Arc<Capture>`), e.g. both ends of an in-process connection; recording can be switched
//! on and off at run time ([`Capture::set_enabled`]).
//!
//! Where it sits in a stack decides what it shows: `PcapTransport<FaultTransport<T>>`
//! records what the device meant to send (faults happen below it), while
//! `FaultTransport<PcapTransport<T>>` records what went on the wire, corrupted ICRCs
//! included.
//!
//! # Formats
//!
//! The file name chooses the format ([`CaptureFormat::for_path`]): a name ending in
//! `.pcapng` (any case) is written as **pcapng**, Wireshark's own format, with nanosecond
//! timestamps (`if_tsresol` 9) and each packet's direction in its flags (`epb_flags`);
//! any other name as **classic pcap** (libpcap's format, microsecond timestamps), which
//! every tool reads. So `SOFTVERBS_PCAP=run.pcapng` (and `--pcap run.pcapng`) writes
//! pcapng and `SOFTVERBS_PCAP=run.pcap` classic pcap. [`Capture::create_as`] and
//! [`Capture::to_writer_as`] take the format explicitly.
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
//! Classic pcap has no direction field, so the Ethernet addresses carry it (in both
//! formats): the capturing device is always [`LOCAL_MAC`] (`02:53:56:00:00:01`) and its
//! peer [`PEER_MAC`] (`02:53:56:00:00:02`). A transmitted packet goes `LOCAL_MAC →
//! PEER_MAC`, a received one `PEER_MAC → LOCAL_MAC`; [`read_capture`] turns that back into
//! a [`Direction`] (in a pcapng file, a packet's `epb_flags` direction comes first).
//!
//! # Reading
//!
//! [`read_capture`] decodes a pcap or a pcapng file (ours, or any Ethernet / raw-IP
//! capture, e.g. from `tcpdump -w`, Wireshark or `editcap -F pcapng`; the format is told
//! by the file's first bytes, not its name) into [`CaptureRecord`]s: timestamp,
//! direction, IP / UDP headers, the parsed [`PacketRepr`] (or why it did not parse), and
//! whether the ICRC verifies. Each record prints like a tcpdump line. Frames that are not
//! IP / UDP, and pcapng packets of an interface whose link type is neither Ethernet nor
//! raw IP, are skipped. pcapng timestamps are read in each interface's resolution
//! (`if_tsresol`, `if_tsoffset`). Reading never panics on a malformed file: it returns an
//! error or skips the frame; [`read_capture_tolerant`] tells a file cut short
//! ([`CaptureError::is_truncated`]) from a damaged one.
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
use pcap_file::pcapng::blocks::enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption};
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::blocks::section_header::{SectionHeaderBlock, SectionHeaderOption};
use pcap_file::pcapng::{Block, PcapNgReader, PcapNgWriter};
use pcap_file::{DataLink, Endianness, PcapError};
use softverbs_wire::icrc::{self, IpHeaderInfo, UdpHeaderInfo};
use softverbs_wire::{PacketRepr, WireError};

use crate::transport::{Endpoint, OutgoingPacket, Received, Sent, Transport, TransportCounters};

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

/// The two file formats a [`Capture`] writes (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CaptureFormat {
    /// Classic pcap: microsecond timestamps, direction in the Ethernet addresses only.
    Pcap,
    /// pcapng: nanosecond timestamps, direction also in each packet's `epb_flags`.
    PcapNg,
}

impl CaptureFormat {
    /// The format a file name asks for: [`CaptureFormat::PcapNg`] if it ends in `.pcapng`
    /// (any case), [`CaptureFormat::Pcap`] otherwise.
    pub fn for_path(path: impl AsRef<Path>) -> CaptureFormat {
        match path.as_ref().extension() {
            Some(extension) if extension.eq_ignore_ascii_case("pcapng") => CaptureFormat::PcapNg,
            _ => CaptureFormat::Pcap,
        }
    }

    /// Bytes a packet of `frame_len` bytes takes in the file: the record header and the
    /// frame (pcap); the Enhanced Packet Block with the frame padded to 4 bytes and its
    /// `epb_flags` option (pcapng).
    fn record_len(self, frame_len: usize) -> u64 {
        let frame_len = frame_len as u64;
        match self {
            CaptureFormat::Pcap => PCAP_RECORD_HEADER_LEN + frame_len,
            CaptureFormat::PcapNg => EPB_FIXED_LEN + frame_len.next_multiple_of(4),
        }
    }
}

/// `pcap` or `pcapng`.
impl fmt::Display for CaptureFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CaptureFormat::Pcap => "pcap",
            CaptureFormat::PcapNg => "pcapng",
        })
    }
}

/// Bytes of a classic pcap record header.
const PCAP_RECORD_HEADER_LEN: u64 = 16;
/// Bytes of an Enhanced Packet Block without its data: block type, both lengths (12),
/// interface, timestamp, captured and original lengths (20), and the `epb_flags` option
/// with the end-of-options marker (12).
const EPB_FIXED_LEN: u64 = 44;
/// `epb_flags` direction bits (pcapng specification, "Enhanced Packet Block Flags Word").
const EPB_FLAGS_INBOUND: u32 = 0b01;
const EPB_FLAGS_OUTBOUND: u32 = 0b10;
/// `if_tsresol` of the interface our pcapng files describe: 10^-9 s, the unit pcap-file
/// writes Enhanced Packet Block timestamps in.
const TSRESOL_NANOSECONDS: u8 = 9;
/// `if_tsresol` a pcapng interface has when it says nothing: 10^-6 s.
const TSRESOL_DEFAULT: u8 = 6;

/// The file behind the format's writer, shared so that [`Capture::flush`] can reach it
/// (`PcapWriter` offers no access to its writer), and counting the bytes written. Only
/// ever locked while the capture's own writer lock is held, so never contended.
#[derive(Clone)]
struct SharedWriter(Arc<Mutex<CountedWriter>>);

struct CountedWriter {
    out: Box<dyn Write + Send>,
    written: u64,
}

impl SharedWriter {
    fn new(out: Box<dyn Write + Send>) -> SharedWriter {
        SharedWriter(Arc::new(Mutex::new(CountedWriter { out, written: 0 })))
    }

    fn lock(&self) -> MutexGuard<'_, CountedWriter> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Bytes handed to the file so far.
    fn written(&self) -> u64 {
        self.lock().written
    }
}

impl Write for SharedWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut inner = self.lock();
        let n = inner.out.write(buf)?;
        inner.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.lock().out.flush()
    }
}

/// The writer of the capture's format.
enum FormatWriter {
    Pcap(PcapWriter<SharedWriter>),
    PcapNg(PcapNgWriter<SharedWriter>),
}

impl FormatWriter {
    /// Writes the file header: the pcap header, or pcapng's section header and the one
    /// interface every packet is on (Ethernet, nanosecond timestamps).
    fn start(format: CaptureFormat, file: SharedWriter) -> Result<FormatWriter, PcapError> {
        Ok(match format {
            CaptureFormat::Pcap => {
                let header = PcapHeader {
                    datalink: DataLink::ETHERNET,
                    endianness: Endianness::Little,
                    ..PcapHeader::default()
                };
                FormatWriter::Pcap(PcapWriter::with_header(file, header)?)
            }
            CaptureFormat::PcapNg => {
                let section = SectionHeaderBlock {
                    endianness: Endianness::Little,
                    options: vec![SectionHeaderOption::UserApplication("softverbs".into())],
                    ..SectionHeaderBlock::default()
                };
                let mut writer = PcapNgWriter::with_section_header(file, section)?;
                writer.write_pcapng_block(InterfaceDescriptionBlock {
                    linktype: DataLink::ETHERNET,
                    snaplen: 0xFFFF,
                    options: vec![
                        InterfaceDescriptionOption::IfName("softverbs".into()),
                        InterfaceDescriptionOption::IfTsResol(TSRESOL_NANOSECONDS),
                    ],
                })?;
                FormatWriter::PcapNg(writer)
            }
        })
    }

    fn format(&self) -> CaptureFormat {
        match self {
            FormatWriter::Pcap(_) => CaptureFormat::Pcap,
            FormatWriter::PcapNg(_) => CaptureFormat::PcapNg,
        }
    }

    fn write(
        &mut self,
        timestamp: Duration,
        direction: Direction,
        frame: &[u8],
        comment: Option<&'static str>,
    ) -> Result<(), PcapError> {
        match self {
            FormatWriter::Pcap(writer) => {
                writer.write_packet(&PcapPacket::new(timestamp, frame.len() as u32, frame))?;
            }
            FormatWriter::PcapNg(writer) => {
                let flags = match direction {
                    Direction::Inbound => EPB_FLAGS_INBOUND,
                    Direction::Outbound | Direction::Unknown => EPB_FLAGS_OUTBOUND,
                };
                writer.write_pcapng_block(EnhancedPacketBlock {
                    interface_id: 0,
                    timestamp,
                    original_len: frame.len() as u32,
                    data: frame.into(),
                    options: std::iter::once(EnhancedPacketOption::Flags(flags))
                        .chain(comment.map(|c| EnhancedPacketOption::Comment(c.into())))
                        .collect(),
                })?;
            }
        }
        Ok(())
    }

    fn into_file(self) -> SharedWriter {
        match self {
            FormatWriter::Pcap(writer) => writer.into_writer(),
            FormatWriter::PcapNg(writer) => writer.into_inner(),
        }
    }
}

/// The format's writer and another handle to its file.
type Writer = (FormatWriter, SharedWriter);

/// A pcap or pcapng file being written, shared by the transports that record into it.
pub struct Capture {
    enabled: AtomicBool,
    format: CaptureFormat,
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
    /// Creates (truncates) the capture file at `path` and writes its header, in the format
    /// its name asks for ([`CaptureFormat::for_path`]: pcapng for `*.pcapng`, classic
    /// pcap otherwise). Recording is on.
    pub fn create(path: impl AsRef<Path>) -> io::Result<Arc<Capture>> {
        let format = CaptureFormat::for_path(&path);
        Capture::create_as(path, format)
    }

    /// Creates (truncates) the capture file at `path` in `format`, whatever its name. An
    /// error names the file and, when its folder does not exist, the folder (the error's
    /// kind is the operating system's).
    pub fn create_as(path: impl AsRef<Path>, format: CaptureFormat) -> io::Result<Arc<Capture>> {
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
        Capture::to_writer_as(BufWriter::new(file), format).map_err(named)
    }

    /// A classic pcap capture into any writer (the header is written now). Recording is on.
    pub fn to_writer(writer: impl Write + Send + 'static) -> io::Result<Arc<Capture>> {
        Capture::to_writer_as(writer, CaptureFormat::Pcap)
    }

    /// A capture in `format` into any writer (the header is written now). Recording is on.
    pub fn to_writer_as(
        writer: impl Write + Send + 'static,
        format: CaptureFormat,
    ) -> io::Result<Arc<Capture>> {
        let file = SharedWriter::new(Box::new(writer));
        let writer = FormatWriter::start(format, file.clone()).map_err(pcap_to_io)?;
        Ok(Arc::new(Capture {
            enabled: AtomicBool::new(true),
            format,
            bytes: AtomicU64::new(file.written()),
            writer: Mutex::new(Some((writer, file))),
            limit: AtomicU64::new(u64::MAX),
            packets: AtomicU64::new(0),
            write_errors: AtomicU64::new(0),
            over_limit: AtomicU64::new(0),
        }))
    }

    /// The file's format.
    pub fn format(&self) -> CaptureFormat {
        self.format
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
        self.record_with(direction, ip, udp, ib_packet, None);
    }

    /// [`Capture::record`], with a comment on the packet in a pcapng file (a classic pcap
    /// file has nowhere to put one): [`SHARED_MEMORY_COMMENT`] for a packet that went
    /// through shared memory, not the UDP socket its headers describe.
    pub fn record_with(
        &self,
        direction: Direction,
        ip: &IpHeaderInfo,
        udp: &UdpHeaderInfo,
        ib_packet: &[u8],
        comment: Option<&'static str>,
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
                let Some((writer, file)) = writer.as_mut() else {
                    return Ok(());
                };
                let record_len = writer.format().record_len(frame.len());
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
                let result = writer.write(timestamp, direction, &frame, comment);
                self.bytes.store(file.written(), Ordering::Relaxed);
                result.map_err(pcap_to_io)?;
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
            Some((writer, _)) => writer.into_file().flush(),
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

/// The comment a pcapng capture puts on a packet that went through shared memory to (or
/// from) a device of another process of this host: the bytes and headers are those the
/// packet would have on the wire, but no socket carried it.
pub const SHARED_MEMORY_COMMENT: &str = "softverbs: through shared memory, not the socket";

/// The comment for a packet, from whether shared memory carried it.
fn comment_of(shared_memory: bool) -> Option<&'static str> {
    shared_memory.then_some(SHARED_MEMORY_COMMENT)
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
    crate::transport::pass_to_inner!();

    fn local(&self) -> Endpoint {
        self.inner.local()
    }

    fn prepare(&self, to: &Endpoint, src_port: u16, ib_packet: &mut [u8]) -> io::Result<Sent> {
        self.inner.prepare(to, src_port, ib_packet)
    }

    fn transmit(&self, to: &Endpoint, sent: &Sent, ib_packet: &[u8]) -> io::Result<()> {
        self.inner.transmit(to, sent, ib_packet)?;
        self.capture.record_with(
            Direction::Outbound,
            &sent.ip,
            &sent.udp,
            ib_packet,
            comment_of(self.inner.in_memory(to)),
        );
        Ok(())
    }

    fn wait_readable(&self, timeout: Duration) -> io::Result<()> {
        self.inner.wait_readable(timeout)
    }

    fn readiness_fd(&self) -> Option<BorrowedFd<'_>> {
        self.inner.readiness_fd()
    }

    fn pending_packets(&self) -> bool {
        self.inner.pending_packets()
    }

    fn recv(&self, buf: &mut [u8], timeout: Option<Duration>) -> io::Result<Option<Received>> {
        let received = self.inner.recv(buf, timeout)?;
        if let Some(received) = &received {
            if let Some(packet) = buf.get(..received.len) {
                self.capture.record_with(
                    Direction::Inbound,
                    &received.ip,
                    &received.udp,
                    packet,
                    comment_of(received.shared_memory),
                );
            }
        }
        Ok(received)
    }

    /// The inner transport's batch, then every packet it sent recorded, in order.
    fn send_batch(&self, packets: &mut [OutgoingPacket<'_>]) -> usize {
        let sent = self.inner.send_batch(packets);
        for packet in packets.iter() {
            if let Some(headers) = &packet.sent {
                self.capture.record_with(
                    Direction::Outbound,
                    &headers.ip,
                    &headers.udp,
                    packet.bytes,
                    comment_of(self.inner.in_memory(&packet.to)),
                );
            }
        }
        sent
    }

    /// The inner transport's batch, then every packet of it recorded, in order.
    fn recv_batch(
        &self,
        bufs: &mut [&mut [u8]],
        received: &mut Vec<Received>,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        let count = self.inner.recv_batch(bufs, received, timeout)?;
        for (packet, buf) in received.iter().zip(bufs.iter()) {
            if let Some(bytes) = buf.get(..packet.len) {
                self.capture.record_with(
                    Direction::Inbound,
                    &packet.ip,
                    &packet.udp,
                    bytes,
                    comment_of(packet.shared_memory),
                );
            }
        }
        Ok(count)
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
    /// The pcap or pcapng structure is broken (or cut short: see
    /// [`CaptureError::is_truncated`]).
    #[error("{}", describe_pcap_error(.0))]
    Pcap(#[from] PcapError),
    /// The link type is neither Ethernet nor raw IP (of a classic pcap file, or of every
    /// interface of a pcapng file that has packets).
    #[error("unsupported link type {0:?} (Ethernet and raw IP are supported)")]
    LinkType(DataLink),
    /// The file starts with neither a pcap nor a pcapng magic number: its first bytes.
    #[error("{}", describe_start(.0))]
    UnknownFormat(Vec<u8>),
}

impl CaptureError {
    /// True if the file ends in the middle of a record or block, as a capture does whose
    /// writer died while writing (`tcpdump`'s "truncated dump file"), rather than being
    /// damaged.
    pub fn is_truncated(&self) -> bool {
        let eof = |error: &io::Error| error.kind() == io::ErrorKind::UnexpectedEof;
        match self {
            CaptureError::Io(error) | CaptureError::Pcap(PcapError::IoError(error)) => eof(error),
            CaptureError::Pcap(PcapError::IncompleteBuffer) => true,
            _ => false,
        }
    }
}

fn describe_pcap_error(error: &PcapError) -> String {
    match error {
        PcapError::IncompleteBuffer => "the file ends in the middle of a record".to_owned(),
        PcapError::IoError(error) if error.kind() == io::ErrorKind::UnexpectedEof => {
            "the file ends in the middle of a record".to_owned()
        }
        PcapError::IoError(error) => format!("cannot read the capture: {error}"),
        PcapError::InvalidInterfaceId(id) => {
            format!("damaged capture: a packet names interface {id}, which no block describes")
        }
        other => format!("damaged capture: {other}"),
    }
}

fn describe_start(start: &[u8]) -> String {
    if start.is_empty() {
        return "not a capture: the file is empty".to_owned();
    }
    let hex: Vec<String> = start.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "neither a pcap nor a pcapng file (it begins with {})",
        hex.join(" ")
    )
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
    /// The packet's comment in a pcapng file (e.g. [`SHARED_MEMORY_COMMENT`]).
    pub comment: Option<String>,
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
            Ok(()) => f.write_str(" icrc ok")?,
            Err(WireError::BadIcrc { expected, found }) => {
                write!(
                    f,
                    " icrc BAD (computed {expected:#010x}, trailer {found:#010x})"
                )?;
            }
            Err(error) => write!(f, " icrc BAD ({error})")?,
        }
        match &self.comment {
            Some(comment) if comment == SHARED_MEMORY_COMMENT => f.write_str(" (shared memory)"),
            Some(comment) => write!(f, " ({comment})"),
            None => Ok(()),
        }
    }
}

/// Decodes the pcap or pcapng file at `path` (see the module documentation).
pub fn read_capture(path: impl AsRef<Path>) -> Result<Vec<CaptureRecord>, CaptureError> {
    read_capture_from(BufReader::new(File::open(path)?))
}

/// Decodes a pcap or pcapng stream (see the module documentation).
pub fn read_capture_from(reader: impl Read) -> Result<Vec<CaptureRecord>, CaptureError> {
    match read_capture_tolerant(reader)? {
        (records, None) => Ok(records),
        (_, Some(error)) => Err(error),
    }
}

/// The magic numbers a file starts with: classic pcap (microsecond or nanosecond
/// timestamps, either byte order) and pcapng's Section Header Block type.
const PCAP_MAGICS: [[u8; 4]; 4] = [
    [0xd4, 0xc3, 0xb2, 0xa1],
    [0xa1, 0xb2, 0xc3, 0xd4],
    [0x4d, 0x3c, 0xb2, 0xa1],
    [0xa1, 0xb2, 0x3c, 0x4d],
];
const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];

/// Decodes a pcap or pcapng stream as far as its records are whole: the records before
/// a broken one, and what broke it (a file whose writer died mid-record ends in a partial
/// record, as `tcpdump` says of a "truncated dump file"; [`CaptureError::is_truncated`]
/// tells that from a damaged file). Errors before the first record (neither pcap nor
/// pcapng, a broken file header, an unsupported link type) are errors.
pub fn read_capture_tolerant(
    mut reader: impl Read,
) -> Result<(Vec<CaptureRecord>, Option<CaptureError>), CaptureError> {
    let mut magic = [0u8; 4];
    let mut got = 0;
    while got < magic.len() {
        match reader.read(&mut magic[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error.into()),
        }
    }
    let start = &magic[..got];
    let whole = start.chain(reader);
    if start == PCAPNG_MAGIC {
        read_pcapng(whole)
    } else if PCAP_MAGICS.iter().any(|m| m == start) {
        read_pcap(whole)
    } else {
        Err(CaptureError::UnknownFormat(start.to_vec()))
    }
}

fn supported_link(datalink: DataLink) -> bool {
    matches!(
        datalink,
        DataLink::ETHERNET | DataLink::RAW | DataLink::IPV4 | DataLink::IPV6
    )
}

fn read_pcap(
    reader: impl Read,
) -> Result<(Vec<CaptureRecord>, Option<CaptureError>), CaptureError> {
    let mut reader = PcapReader::new(reader)?;
    let datalink = reader.header().datalink;
    if !supported_link(datalink) {
        return Err(CaptureError::LinkType(datalink));
    }
    let mut records = Vec::new();
    let mut frame = 0;
    while let Some(packet) = reader.next_packet() {
        let packet = match packet {
            Ok(packet) => packet,
            Err(error) => return Ok((records, Some(error.into()))),
        };
        if let Some(record) = decode_frame(frame, datalink, packet.timestamp, None, &packet.data) {
            records.push(record);
        }
        frame += 1;
    }
    Ok((records, None))
}

/// What a pcapng Interface Description Block says about the packets on it.
struct Interface {
    datalink: DataLink,
    /// `if_tsresol`: bit 7 clear, 10^-n s; set, 2^-n s.
    tsresol: u8,
    /// `if_tsoffset`: seconds to add to every timestamp.
    tsoffset: i64,
}

impl Interface {
    fn of(block: &InterfaceDescriptionBlock<'_>) -> Interface {
        let mut interface = Interface {
            datalink: block.linktype,
            tsresol: TSRESOL_DEFAULT,
            tsoffset: 0,
        };
        for option in &block.options {
            match option {
                InterfaceDescriptionOption::IfTsResol(value) => interface.tsresol = *value,
                // A signed 64-bit integer in the specification.
                InterfaceDescriptionOption::IfTsOffset(value) => interface.tsoffset = *value as i64,
                _ => {}
            }
        }
        interface
    }

    /// The time of a timestamp of `units` in this interface's resolution and offset.
    fn time(&self, units: u64) -> Duration {
        let units = u128::from(units);
        let since_offset = if self.tsresol & 0x80 == 0 {
            let exponent = u32::from(self.tsresol);
            match 10u128.checked_pow(exponent) {
                Some(per_second) => {
                    let fraction = units % per_second;
                    let nanos = if exponent >= 9 {
                        fraction / 10u128.pow(exponent - 9)
                    } else {
                        fraction * 10u128.pow(9 - exponent)
                    };
                    duration(units / per_second, nanos)
                }
                // More than 10^38 units per second: every timestamp is below 1 ns.
                None => Duration::ZERO,
            }
        } else {
            let shift = u32::from(self.tsresol & 0x7f);
            let fraction = units & ((1u128 << shift) - 1);
            duration(units >> shift, (fraction * 1_000_000_000) >> shift)
        };
        let offset = Duration::from_secs(self.tsoffset.unsigned_abs());
        if self.tsoffset >= 0 {
            since_offset.saturating_add(offset)
        } else {
            since_offset.saturating_sub(offset)
        }
    }
}

/// `seconds` and `nanos` (below 10^9) as a duration, saturating.
fn duration(seconds: u128, nanos: u128) -> Duration {
    Duration::new(
        u64::try_from(seconds).unwrap_or(u64::MAX),
        u32::try_from(nanos).unwrap_or(0),
    )
}

fn read_pcapng(
    reader: impl Read,
) -> Result<(Vec<CaptureRecord>, Option<CaptureError>), CaptureError> {
    let mut reader = PcapNgReader::new(reader)?;
    let mut interfaces: Vec<Interface> = Vec::new();
    let mut unsupported = None;
    let mut records = Vec::new();
    let mut frame = 0;
    let mut last_time = Duration::ZERO;
    while let Some(block) = reader.next_block() {
        let block = match block {
            Ok(block) => block,
            Err(error) => return Ok((records, Some(error.into()))),
        };
        // (interface, timestamp in the interface's units if the block has one, frame,
        // direction from the flags)
        let mut comment = None;
        let (interface_id, units, data, direction) = match block {
            Block::SectionHeader(_) => {
                interfaces.clear();
                continue;
            }
            Block::InterfaceDescription(block) => {
                interfaces.push(Interface::of(&block));
                continue;
            }
            Block::EnhancedPacket(block) => {
                let direction = block.options.iter().find_map(|option| match option {
                    EnhancedPacketOption::Flags(flags) => match flags & 0b11 {
                        EPB_FLAGS_INBOUND => Some(Direction::Inbound),
                        EPB_FLAGS_OUTBOUND => Some(Direction::Outbound),
                        _ => None,
                    },
                    _ => None,
                });
                comment = block.options.iter().find_map(|option| match option {
                    EnhancedPacketOption::Comment(text) => Some(text.to_string()),
                    _ => None,
                });
                // pcap-file hands the raw timestamp over as that many nanoseconds.
                let units = u64::try_from(block.timestamp.as_nanos()).unwrap_or(u64::MAX);
                (block.interface_id, Some(units), block.data, direction)
            }
            Block::Packet(block) => (
                u32::from(block.interface_id),
                Some(block.timestamp),
                block.data,
                None,
            ),
            Block::SimplePacket(block) => {
                // The block's data runs to its end, padding included.
                let mut data = block.data;
                let len = usize::try_from(block.original_len).unwrap_or(usize::MAX);
                if len < data.len() {
                    data.to_mut().truncate(len);
                }
                (0, None, data, None)
            }
            _ => continue,
        };
        let Some(interface) = interfaces.get(interface_id as usize) else {
            let error = PcapError::InvalidInterfaceId(interface_id);
            return Ok((records, Some(error.into())));
        };
        // A Simple Packet Block has no timestamp: it is shown at the time of the packet
        // before it.
        let time = units.map_or(last_time, |units| interface.time(units));
        last_time = time;
        if supported_link(interface.datalink) {
            if let Some(mut record) =
                decode_frame(frame, interface.datalink, time, direction, &data)
            {
                record.comment = comment;
                records.push(record);
            }
        } else {
            unsupported.get_or_insert(interface.datalink);
        }
        frame += 1;
    }
    match unsupported {
        Some(datalink) if records.is_empty() => Err(CaptureError::LinkType(datalink)),
        _ => Ok((records, None)),
    }
}

/// Decodes one frame; `None` if it is not IP / UDP. `direction` (a pcapng packet's flags)
/// comes before what the Ethernet addresses say.
fn decode_frame(
    frame: usize,
    datalink: DataLink,
    timestamp: Duration,
    direction: Option<Direction>,
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
        let direction = if let Some(direction) = direction {
            direction
        } else if src == LOCAL_MAC {
            Direction::Outbound
        } else if dst == LOCAL_MAC {
            Direction::Inbound
        } else {
            Direction::Unknown
        };
        (direction, data.get(at + 2..)?)
    } else {
        (direction.unwrap_or(Direction::Unknown), data)
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
        comment: None,
    })
}
