//! The RoCEv2 invariant CRC (ICRC) and the IP / UDP header information it covers.
//!
//! Algorithm (reference §1.7, checked against ~1,900 hardware packets): CRC-32 (the
//! Ethernet / zlib CRC: reflected polynomial 0xEDB88320, initial value and final XOR
//! 0xFFFFFFFF) over a pseudo packet made of
//!
//! 1. 8 bytes of 0xFF (standing for the masked IB LRH);
//! 2. the IP header with its variant fields set to all ones: IPv4 TOS (byte 1), TTL
//!    (byte 8) and header checksum (bytes 10–11); IPv6 traffic class and flow label (the
//!    first 4 bytes become `6F FF FF FF`) and hop limit (byte 7);
//! 3. the UDP header with its checksum (bytes 6–7) set to 0xFFFF;
//! 4. the BTH with byte 4 (F, B and 6 reserved bits) set to 0xFF;
//! 5. the rest of the packet: extension headers, payload and pad (not the ICRC itself).
//!
//! The result goes on the wire **least-significant byte first** (like an Ethernet FCS):
//! ICRC 0x2A00FD82 is sent as `82 FD 00 2A`.
//!
//! What a sender and a receiver can know (reference §5.2, §5.3): the ICRC covers the IPv4
//! ID and flags. A sender using a plain UDP socket does not write its IP header; Linux
//! writes ID 0 with DF set only on an unconnected socket with `IP_PMTUDISC_DO`, which is
//! what [`IpHeaderInfo::linux_ipv4`] / [`linux_ipv4_header`] assume. A receiver on a plain
//! socket never sees the sender's ID, and peers other than softverbs send other IDs (`rxe`
//! hashes one per packet, NICs count). [`verify_any_ipv4_id`] checks such a packet anyway:
//! it accepts the packet if its ICRC is valid for *some* ID, and says which. The ICRC
//! then still protects the packet with 16 of its 32 bits (see
//! [below](#any-ipv4-id-how-and-what-is-left-of-the-check)). IPv6 has no ID, so its ICRC
//! is always checkable from addresses, lengths and ports.
//!
//! Holds [`IpHeaderInfo`], [`UdpHeaderInfo`], [`compute`], [`verify`],
//! [`verify_any_ipv4_id`], [`fill`], [`linux_ipv4_header`] and [`split_ip_packet`].
//!
//! # Any IPv4 ID: how, and what is left of the check
//!
//! CRC-32 is affine over GF(2): for two messages of the same length, CRC(a) ⊕ CRC(b) is
//! the CRC *register* (no initial value, no final XOR) of a ⊕ b. Changing the 16-bit ID
//! from 0 to `i` therefore changes the ICRC by `S_m(v(i))`: the ID bytes as a register
//! value `v(i)` (first byte in bits 0–7, second in bits 8–15), run through `m` bytes of
//! zeros, where `m` counts the hashed bytes from the ID to the end (2 + 14 IPv4 + 8 UDP +
//! the IB packet without its trailer). Running a register through zeros is multiplication
//! by x^(8m) modulo the CRC polynomial, which is invertible, so from the difference `D`
//! between the trailer and the ICRC computed with the assumed ID, [`verify_any_ipv4_id`]
//! gets `v = D · x^(-8m) mod P` (two GF(2) multiplications by constants from tables
//! built at compile time, no per-length state). The packet is accepted exactly when the
//! upper 16 bits of `v` are zero; the lower 16 are the ID. No two IDs can both fit.
//!
//! What is lost: one valid ICRC in 2^16 instead of 2^32 for random corruption. Every
//! single-bit error is still detected as long as it lies less than 26,768 bytes after the
//! ID (any RoCEv2 packet: the IB MTU is at most 4096 bytes) or in the 12 pseudo-header
//! bytes before it, and so is every error whose span, ID field included, is at most 32
//! bits; beyond that, corruption of two or more bits is caught with probability
//! 1 − 2^-16 instead of 1 − 2^-32. A packet whose sender wrote ID 0 (softverbs peers) is
//! checked with all 32 bits, at the cost of [`verify`].
//!
//! No-panic contract: nothing here panics, whatever the bytes. [`compute`] accepts any
//! slice (a packet shorter than a BTH is hashed with the masks that apply to the bytes
//! present); the other functions report short or malformed input as a [`WireError`].
//! Large payloads are hashed in place, never copied.

use core::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::packet::ICRC_LEN;
use crate::WireError;

/// The RoCEv2 UDP destination port, 4791 (0x12B7).
pub const ROCEV2_PORT: u16 = 4791;

/// IP protocol / IPv6 next header number of UDP.
const PROTOCOL_UDP: u8 = 17;
const IPV4_HEADER_LEN: usize = 20;
const IPV6_HEADER_LEN: usize = 40;
const UDP_HEADER_LEN: usize = 8;
/// IPv4 flags + fragment offset with only DF set.
const FLAGS_DF: u16 = 0x4000;

/// The IP header fields of a RoCEv2 packet, as far as the ICRC (and a rebuilt header)
/// needs them. TOS / TTL / traffic class / flow label / hop limit are masked out of the
/// ICRC; they are kept so a real header can be written ([`IpHeaderInfo::emit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpHeaderInfo {
    /// IPv4 header without options (IHL 5), protocol UDP.
    V4 {
        /// Source address.
        src: Ipv4Addr,
        /// Destination address.
        dst: Ipv4Addr,
        /// TOS: DSCP and ECN (masked out of the ICRC).
        tos: u8,
        /// TTL (masked out of the ICRC).
        ttl: u8,
        /// Identification (covered by the ICRC).
        id: u16,
        /// Flags (bits 15..13) and fragment offset (covered by the ICRC); 0x4000 = DF.
        flags_frag: u16,
        /// Total length: 20 + UDP length (covered by the ICRC).
        total_len: u16,
    },
    /// IPv6 header without extension headers, next header UDP.
    V6 {
        /// Source address.
        src: Ipv6Addr,
        /// Destination address.
        dst: Ipv6Addr,
        /// Traffic class: DSCP and ECN (masked out of the ICRC).
        traffic_class: u8,
        /// Flow label, 20 bits (masked out of the ICRC).
        flow_label: u32,
        /// Payload length: the UDP length (covered by the ICRC).
        payload_len: u16,
        /// Hop limit (masked out of the ICRC).
        hop_limit: u8,
    },
}

impl IpHeaderInfo {
    /// The IPv4 header Linux writes for a datagram of `udp_len` bytes sent on an
    /// **unconnected** UDP socket with `IP_MTU_DISCOVER = IP_PMTUDISC_DO`: ID 0, DF set, no
    /// options (reference §5.2). `LengthOverflow` if 20 + `udp_len` exceeds 65535.
    pub fn linux_ipv4(
        src: Ipv4Addr,
        dst: Ipv4Addr,
        tos: u8,
        ttl: u8,
        udp_len: u16,
    ) -> Result<IpHeaderInfo, WireError> {
        let total_len = udp_len
            .checked_add(IPV4_HEADER_LEN as u16)
            .ok_or(WireError::LengthOverflow)?;
        Ok(IpHeaderInfo::V4 {
            src,
            dst,
            tos,
            ttl,
            id: 0,
            flags_frag: FLAGS_DF,
            total_len,
        })
    }

    /// The IPv6 header for a datagram of `udp_len` bytes (`flow_label` masked to 20 bits).
    pub fn ipv6(
        src: Ipv6Addr,
        dst: Ipv6Addr,
        traffic_class: u8,
        flow_label: u32,
        hop_limit: u8,
        udp_len: u16,
    ) -> IpHeaderInfo {
        IpHeaderInfo::V6 {
            src,
            dst,
            traffic_class,
            flow_label: flow_label & 0x000F_FFFF,
            payload_len: udp_len,
            hop_limit,
        }
    }

    /// Parses an IPv4 header without options or an IPv6 header, whose protocol / next
    /// header is UDP. `Truncated` for a short buffer, `BadIpHeader` otherwise. Lengths are
    /// read, not checked against the buffer ([`split_ip_packet`] does that).
    pub fn parse(bytes: &[u8]) -> Result<IpHeaderInfo, WireError> {
        let version = bytes.first().ok_or(WireError::Truncated)? >> 4;
        match version {
            4 => {
                let header: &[u8; IPV4_HEADER_LEN] = bytes
                    .get(..IPV4_HEADER_LEN)
                    .and_then(|b| b.try_into().ok())
                    .ok_or(WireError::Truncated)?;
                if header[0] != 0x45 || header[9] != PROTOCOL_UDP {
                    return Err(WireError::BadIpHeader);
                }
                Ok(IpHeaderInfo::V4 {
                    src: Ipv4Addr::new(header[12], header[13], header[14], header[15]),
                    dst: Ipv4Addr::new(header[16], header[17], header[18], header[19]),
                    tos: header[1],
                    ttl: header[8],
                    id: u16::from_be_bytes([header[4], header[5]]),
                    flags_frag: u16::from_be_bytes([header[6], header[7]]),
                    total_len: u16::from_be_bytes([header[2], header[3]]),
                })
            }
            6 => {
                let header: &[u8; IPV6_HEADER_LEN] = bytes
                    .get(..IPV6_HEADER_LEN)
                    .and_then(|b| b.try_into().ok())
                    .ok_or(WireError::Truncated)?;
                if header[6] != PROTOCOL_UDP {
                    return Err(WireError::BadIpHeader);
                }
                let first = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
                let mut src = [0u8; 16];
                src.copy_from_slice(&header[8..24]);
                let mut dst = [0u8; 16];
                dst.copy_from_slice(&header[24..40]);
                Ok(IpHeaderInfo::V6 {
                    src: Ipv6Addr::from(src),
                    dst: Ipv6Addr::from(dst),
                    traffic_class: (first >> 20) as u8,
                    flow_label: first & 0x000F_FFFF,
                    payload_len: u16::from_be_bytes([header[4], header[5]]),
                    hop_limit: header[7],
                })
            }
            _ => Err(WireError::BadIpHeader),
        }
    }

    /// Length of the header: 20 (IPv4) or 40 (IPv6).
    pub const fn header_len(&self) -> usize {
        match self {
            IpHeaderInfo::V4 { .. } => IPV4_HEADER_LEN,
            IpHeaderInfo::V6 { .. } => IPV6_HEADER_LEN,
        }
    }

    /// The UDP length this header announces: IPv4 total length − 20, IPv6 payload length
    /// (`None` if an IPv4 total length is below 20).
    pub const fn udp_len(&self) -> Option<u16> {
        match *self {
            IpHeaderInfo::V4 { total_len, .. } => total_len.checked_sub(IPV4_HEADER_LEN as u16),
            IpHeaderInfo::V6 { payload_len, .. } => Some(payload_len),
        }
    }

    /// Writes the real header into the front of `buf` (IPv4 with a valid header checksum)
    /// and returns its length. `BufferTooSmall` if `buf` is too short.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let len = self.header_len();
        let available = buf.len();
        let out = buf.get_mut(..len).ok_or(WireError::BufferTooSmall {
            needed: len,
            available,
        })?;
        self.write_header(out, false);
        Ok(len)
    }

    /// Writes the header (20 or 40 bytes in `out`); with `masked`, the fields outside the
    /// ICRC are all ones, as the pseudo packet needs them.
    fn write_header(&self, out: &mut [u8], masked: bool) {
        match *self {
            IpHeaderInfo::V4 {
                src,
                dst,
                tos,
                ttl,
                id,
                flags_frag,
                total_len,
            } => {
                out[0] = 0x45;
                out[1] = if masked { 0xFF } else { tos };
                out[2..4].copy_from_slice(&total_len.to_be_bytes());
                out[4..6].copy_from_slice(&id.to_be_bytes());
                out[6..8].copy_from_slice(&flags_frag.to_be_bytes());
                out[8] = if masked { 0xFF } else { ttl };
                out[9] = PROTOCOL_UDP;
                out[10..12].fill(0);
                out[12..16].copy_from_slice(&src.octets());
                out[16..20].copy_from_slice(&dst.octets());
                let checksum = if masked {
                    0xFFFF
                } else {
                    ipv4_checksum(&out[..20])
                };
                out[10..12].copy_from_slice(&checksum.to_be_bytes());
            }
            IpHeaderInfo::V6 {
                src,
                dst,
                traffic_class,
                flow_label,
                payload_len,
                hop_limit,
            } => {
                let first = if masked {
                    0x6FFF_FFFF
                } else {
                    (6 << 28) | (u32::from(traffic_class) << 20) | (flow_label & 0x000F_FFFF)
                };
                out[0..4].copy_from_slice(&first.to_be_bytes());
                out[4..6].copy_from_slice(&payload_len.to_be_bytes());
                out[6] = PROTOCOL_UDP;
                out[7] = if masked { 0xFF } else { hop_limit };
                out[8..24].copy_from_slice(&src.octets());
                out[24..40].copy_from_slice(&dst.octets());
            }
        }
    }
}

/// Prints like `IPv4 172.17.242.47 > 172.17.242.56 tos=0x02 ttl=64 id=0x4694 df len=60`.
impl fmt::Display for IpHeaderInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            IpHeaderInfo::V4 {
                src,
                dst,
                tos,
                ttl,
                id,
                flags_frag,
                total_len,
            } => {
                write!(
                    f,
                    "IPv4 {src} > {dst} tos={tos:#04x} ttl={ttl} id={id:#06x}"
                )?;
                if flags_frag & FLAGS_DF != 0 {
                    f.write_str(" df")?;
                }
                if flags_frag & !FLAGS_DF != 0 {
                    write!(f, " frag={:#06x}", flags_frag & !FLAGS_DF)?;
                }
                write!(f, " len={total_len}")
            }
            IpHeaderInfo::V6 {
                src,
                dst,
                traffic_class,
                flow_label,
                payload_len,
                hop_limit,
            } => {
                write!(
                    f,
                    "IPv6 {src} > {dst} tclass={traffic_class:#04x} flowlabel={flow_label:#07x} \
                     hlim={hop_limit} plen={payload_len}"
                )
            }
        }
    }
}

/// The one's-complement header checksum of an IPv4 header whose checksum field is zero.
fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|pair| u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

/// The UDP header fields the ICRC covers (the checksum is masked and not kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpHeaderInfo {
    /// Source port (any value; `rxe` uses 0xC000 | hash, reference §4.4).
    pub src_port: u16,
    /// Destination port ([`ROCEV2_PORT`]).
    pub dst_port: u16,
    /// UDP length: 8 + the whole IB transport packet, ICRC included.
    pub length: u16,
}

impl UdpHeaderInfo {
    /// The UDP header of a RoCEv2 datagram from `src_port` to port 4791 carrying an IB
    /// transport packet of `ib_len` bytes, ICRC included. `LengthOverflow` if 8 + `ib_len`
    /// exceeds 65535.
    pub fn rocev2(src_port: u16, ib_len: usize) -> Result<UdpHeaderInfo, WireError> {
        let length = ib_len
            .checked_add(UDP_HEADER_LEN)
            .and_then(|len| u16::try_from(len).ok())
            .ok_or(WireError::LengthOverflow)?;
        Ok(UdpHeaderInfo {
            src_port,
            dst_port: ROCEV2_PORT,
            length,
        })
    }

    /// Parses a UDP header. `Truncated` for fewer than 8 bytes, `BadIpHeader` if the
    /// length field is below 8.
    pub fn parse(bytes: &[u8]) -> Result<UdpHeaderInfo, WireError> {
        let header = bytes.get(..UDP_HEADER_LEN).ok_or(WireError::Truncated)?;
        let field = |at: usize| u16::from_be_bytes([header[at], header[at + 1]]);
        let info = UdpHeaderInfo {
            src_port: field(0),
            dst_port: field(2),
            length: field(4),
        };
        if usize::from(info.length) < UDP_HEADER_LEN {
            return Err(WireError::BadIpHeader);
        }
        Ok(info)
    }

    /// Writes the 8-byte UDP header with checksum 0 (what `rxe` and ConnectX send, reference
    /// §1.1) and returns 8. `BufferTooSmall` if `buf` is too short.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let available = buf.len();
        let out = buf
            .get_mut(..UDP_HEADER_LEN)
            .ok_or(WireError::BufferTooSmall {
                needed: UDP_HEADER_LEN,
                available,
            })?;
        self.write_header(out, false);
        Ok(UDP_HEADER_LEN)
    }

    fn write_header(&self, out: &mut [u8], masked: bool) {
        out[0..2].copy_from_slice(&self.src_port.to_be_bytes());
        out[2..4].copy_from_slice(&self.dst_port.to_be_bytes());
        out[4..6].copy_from_slice(&self.length.to_be_bytes());
        let checksum: u16 = if masked { 0xFFFF } else { 0 };
        out[6..8].copy_from_slice(&checksum.to_be_bytes());
    }
}

/// Prints like `UDP 63431 > 4791 len=40`.
impl fmt::Display for UdpHeaderInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "UDP {} > {} len={}",
            self.src_port, self.dst_port, self.length
        )
    }
}

/// The 20-byte IPv4 header (valid checksum) Linux sends for a datagram of `udp_len` bytes on
/// an unconnected UDP socket with `IP_PMTUDISC_DO`: ID 0, DF set, no options, protocol UDP
/// (reference §5.2). Also the header to synthesise for a UD receive buffer's GRH area
/// (reference §5.3).
pub fn linux_ipv4_header(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    tos: u8,
    ttl: u8,
    udp_len: u16,
) -> Result<[u8; 20], WireError> {
    let mut header = [0u8; IPV4_HEADER_LEN];
    IpHeaderInfo::linux_ipv4(src, dst, tos, ttl, udp_len)?.write_header(&mut header, false);
    Ok(header)
}

/// The ICRC of an IB transport packet given **without** its 4-byte ICRC trailer
/// (reference §1.7). Any slice is accepted.
pub fn compute(ip: &IpHeaderInfo, udp: &UdpHeaderInfo, ib_packet: &[u8]) -> u32 {
    // The masked headers in one buffer, hashed with one call (each call costs its setup,
    // and bytes short of a 16-byte block are hashed one at a time), then the packet after
    // its BTH with another.
    let mut prefix = [0u8; 8 + IPV6_HEADER_LEN + UDP_HEADER_LEN + crate::bth::HEADER_LEN];
    prefix[..8].fill(0xFF);
    let ip_len = ip.header_len();
    ip.write_header(&mut prefix[8..8 + ip_len], true);
    let udp_at = 8 + ip_len;
    udp.write_header(&mut prefix[udp_at..udp_at + UDP_HEADER_LEN], true);

    let bth_at = udp_at + UDP_HEADER_LEN;
    let bth_len = ib_packet.len().min(crate::bth::HEADER_LEN);
    prefix[bth_at..bth_at + bth_len].copy_from_slice(&ib_packet[..bth_len]);
    if bth_len > 4 {
        prefix[bth_at + 4] = 0xFF;
    }

    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&prefix[..bth_at + bth_len]);
    hasher.update(&ib_packet[bth_len..]);
    hasher.finalize()
}

/// Splits an IB packet into the bytes before the trailer and the trailer value (read
/// least-significant byte first).
fn split_trailer(ib_packet: &[u8]) -> Result<(&[u8], u32), WireError> {
    let at = ib_packet
        .len()
        .checked_sub(ICRC_LEN)
        .ok_or(WireError::Truncated)?;
    let (body, trailer) = ib_packet.split_at(at);
    let mut bytes = [0u8; ICRC_LEN];
    bytes.copy_from_slice(trailer);
    Ok((body, u32::from_le_bytes(bytes)))
}

/// Checks the ICRC of an IB transport packet given **with** its trailer. `Truncated` for
/// fewer than 4 bytes; `BadIcrc { expected: computed, found: trailer }` on a mismatch.
pub fn verify(ip: &IpHeaderInfo, udp: &UdpHeaderInfo, ib_packet: &[u8]) -> Result<(), WireError> {
    let (body, found) = split_trailer(ib_packet)?;
    let expected = compute(ip, udp, body);
    if expected == found {
        Ok(())
    } else {
        Err(WireError::BadIcrc { expected, found })
    }
}

/// Checks the ICRC of an IB transport packet given **with** its trailer, treating the IPv4
/// Identification as unknown: returns `ip` with the ID for which the ICRC is valid (see the
/// [module documentation](self#any-ipv4-id-how-and-what-is-left-of-the-check)).
///
/// For a receiver on a plain UDP socket, which never sees the sender's ID: pass the header
/// it assumes (e.g. [`IpHeaderInfo::linux_ipv4`], ID 0). If the ICRC is valid for that
/// header, `ip` comes back unchanged at the cost of one [`verify`]; otherwise the one ID
/// that makes it valid, if there is one, is found from the ICRC difference in constant
/// time (no second pass over the packet). Every other field, DF flag included, must be
/// right. An IPv6 header (no ID) is checked exactly as [`verify`] does.
///
/// Errors: `Truncated` for fewer than 4 bytes; `BadIcrc { expected, found }` if no ID
/// fits, where `expected` is the ICRC computed over `ip` as given.
///
/// ```
/// use softverbs_wire::icrc::{self, IpHeaderInfo, UdpHeaderInfo};
/// # fn main() -> Result<(), softverbs_wire::WireError> {
/// let src = "10.99.0.2".parse().unwrap();
/// let dst = "10.99.0.1".parse().unwrap();
/// let mut packet = vec![0u8; 16]; // a BTH, 4 bytes of payload, room for the ICRC
/// let udp = UdpHeaderInfo::rocev2(0xC1A9, packet.len())?;
/// let assumed = IpHeaderInfo::linux_ipv4(src, dst, 0, 64, udp.length)?; // ID 0
/// let IpHeaderInfo::V4 { src, dst, tos, ttl, flags_frag, total_len, .. } = assumed else {
///     unreachable!()
/// };
/// let sent = IpHeaderInfo::V4 { src, dst, tos, ttl, id: 0x1F4B, flags_frag, total_len };
/// icrc::fill(&sent, &udp, &mut packet)?; // what rxe puts on the wire
/// assert!(icrc::verify(&assumed, &udp, &packet).is_err());
/// assert_eq!(icrc::verify_any_ipv4_id(&assumed, &udp, &packet)?, sent);
/// # Ok(())
/// # }
/// ```
pub fn verify_any_ipv4_id(
    ip: &IpHeaderInfo,
    udp: &UdpHeaderInfo,
    ib_packet: &[u8],
) -> Result<IpHeaderInfo, WireError> {
    let (body, found) = split_trailer(ib_packet)?;
    let expected = compute(ip, udp, body);
    if expected == found {
        return Ok(*ip);
    }
    let mismatch = WireError::BadIcrc { expected, found };
    let IpHeaderInfo::V4 {
        src,
        dst,
        tos,
        ttl,
        id,
        flags_frag,
        total_len,
    } = *ip
    else {
        return Err(mismatch);
    };
    // Hashed bytes from the first ID byte to the end: the ID, IPv4 bytes 6..20, the UDP
    // header and the IB packet without its trailer.
    let from_id = (body.len() as u64).saturating_add(2 + 14 + UDP_HEADER_LEN as u64);
    let id_change = id_change_for_icrc_change(expected ^ found, from_id).ok_or(mismatch)?;
    Ok(IpHeaderInfo::V4 {
        src,
        dst,
        tos,
        ttl,
        id: id ^ id_change,
        flags_frag,
        total_len,
    })
}

/// The change of a 16-bit field that changes a CRC-32 by `icrc_change`, when `from_field`
/// bytes are hashed from the field's first byte to the end of the message; `None` if no
/// change of those 16 bits alone does.
///
/// With the notation of the module documentation, `icrc_change = S_m(v)`, so
/// `v = icrc_change · x^(-8m) mod P`; a change of the field leaves bits 16–31 of `v` zero.
fn id_change_for_icrc_change(icrc_change: u32, from_field: u64) -> Option<u16> {
    let v = times_x_to_minus_8n(icrc_change, from_field);
    if v >> 16 != 0 {
        return None;
    }
    // Bits 0–7 hold the first (high) byte of the field, bits 8–15 the second.
    Some(u16::from_be_bytes([v as u8, (v >> 8) as u8]))
}

// GF(2)[x] modulo the CRC-32 polynomial P, in the reflected representation crc32fast and
// zlib use for the CRC register: bit 31 is the coefficient of x^0, bit 0 that of x^31.

/// P without its x^32 term, reflected (the Ethernet / zlib CRC-32 polynomial).
const POLY_REFLECTED: u32 = 0xEDB8_8320;
/// The polynomial 1.
const X_TO_0: u32 = 1 << 31;

/// `r · x mod P`: one bit step of the CRC register over a zero bit.
const fn times_x(r: u32) -> u32 {
    (r >> 1) ^ (POLY_REFLECTED & (r & 1).wrapping_neg())
}

/// `r · x^(-1) mod P`: [`times_x`] undone. `times_x` sets bit 31 exactly when it reduces
/// (bit 31 of the reduction term is P's x^0 coefficient, 1), which tells which case it was.
const fn times_x_inverse(r: u32) -> u32 {
    let reduced = r >> 31;
    ((r ^ (POLY_REFLECTED & reduced.wrapping_neg())) << 1) | reduced
}

/// `a · b mod P`. Branch-free: 32 rounds whatever the operands.
const fn multiply_mod_p(a: u32, b: u32) -> u32 {
    let mut b = b;
    let mut product = 0;
    // Walk a's coefficients from x^0 (bit 31) up while b runs through b, b·x, b·x², …
    let mut bit = 0;
    while bit < 32 {
        product ^= b & ((a >> (31 - bit)) & 1).wrapping_neg();
        b = times_x(b);
        bit += 1;
    }
    product
}

/// x^(-8): one byte of zeros undone.
const X_TO_MINUS_8: u32 = {
    let mut r = X_TO_0;
    let mut bit = 0;
    while bit < 8 {
        r = times_x_inverse(r);
        bit += 1;
    }
    r
};

/// `[1, base, base², …, base^255]`.
const fn powers(base: u32) -> [u32; 256] {
    let mut table = [X_TO_0; 256];
    let mut n = 1;
    while n < 256 {
        table[n] = multiply_mod_p(table[n - 1], base);
        n += 1;
    }
    table
}

/// `X_TO_MINUS_8N_LOW[n] = x^(-8n)` for n < 256.
static X_TO_MINUS_8N_LOW: [u32; 256] = powers(X_TO_MINUS_8);
/// `X_TO_MINUS_8N_HIGH[n] = x^(-8·256n)` for n < 256.
static X_TO_MINUS_8N_HIGH: [u32; 256] =
    powers(multiply_mod_p(X_TO_MINUS_8N_LOW[255], X_TO_MINUS_8));
/// `X_TO_MINUS_8_POW2[k] = x^(-8·2^k)`, for lengths of 64 KiB and more.
static X_TO_MINUS_8_POW2: [u32; 64] = {
    let mut table = [X_TO_MINUS_8; 64];
    let mut k = 1;
    while k < 64 {
        table[k] = multiply_mod_p(table[k - 1], table[k - 1]);
        k += 1;
    }
    table
};

/// `r · x^(-8n) mod P`: the CRC register before `n` bytes of zeros that leave it at `r`.
/// Two multiplications for n < 65536.
fn times_x_to_minus_8n(r: u32, n: u64) -> u32 {
    let mut r = multiply_mod_p(r, X_TO_MINUS_8N_LOW[(n & 0xFF) as usize]);
    r = multiply_mod_p(r, X_TO_MINUS_8N_HIGH[((n >> 8) & 0xFF) as usize]);
    for (k, &factor) in X_TO_MINUS_8_POW2.iter().enumerate().skip(16) {
        if n >> k == 0 {
            break;
        }
        if (n >> k) & 1 != 0 {
            r = multiply_mod_p(r, factor);
        }
    }
    r
}

/// Computes the ICRC of an IB transport packet given **with** room for its trailer (as
/// [`PacketRepr::emit`](crate::PacketRepr::emit) leaves it), writes it into the last 4
/// bytes least-significant byte first, and returns it. `Truncated` for fewer than 4 bytes.
pub fn fill(
    ip: &IpHeaderInfo,
    udp: &UdpHeaderInfo,
    ib_packet: &mut [u8],
) -> Result<u32, WireError> {
    let at = ib_packet
        .len()
        .checked_sub(ICRC_LEN)
        .ok_or(WireError::Truncated)?;
    let (body, trailer) = ib_packet.split_at_mut(at);
    let icrc = compute(ip, udp, body);
    trailer.copy_from_slice(&icrc.to_le_bytes());
    Ok(icrc)
}

/// Splits a raw IP packet (IPv4 or IPv6 header first, e.g. from a capture or a raw socket)
/// into its IP header information, UDP header information and IB transport packet (ICRC
/// included). The IB packet is located by the UDP length, never by the buffer length, so
/// Ethernet padding or capture trailers are ignored (reference §5.3).
///
/// Errors: `Truncated` if the buffer is shorter than the lengths the headers announce;
/// `BadIpHeader` for a header [`IpHeaderInfo::parse`] refuses or inconsistent lengths.
pub fn split_ip_packet(packet: &[u8]) -> Result<(IpHeaderInfo, UdpHeaderInfo, &[u8]), WireError> {
    let ip = IpHeaderInfo::parse(packet)?;
    let ip_len = ip.header_len();
    let udp_bytes = packet.get(ip_len..).ok_or(WireError::Truncated)?;
    let udp = UdpHeaderInfo::parse(udp_bytes)?;
    let ip_udp_len = usize::from(ip.udp_len().ok_or(WireError::BadIpHeader)?);
    let udp_len = usize::from(udp.length);
    if udp_len > ip_udp_len {
        return Err(WireError::BadIpHeader);
    }
    let ib_packet = udp_bytes
        .get(UDP_HEADER_LEN..udp_len)
        .ok_or(WireError::Truncated)?;
    Ok((ip, udp, ib_packet))
}

/// [`split_ip_packet`] then [`verify`]: checks the ICRC of a raw IP packet.
pub fn verify_ip_packet(packet: &[u8]) -> Result<(), WireError> {
    let (ip, udp, ib_packet) = split_ip_packet(packet)?;
    verify(&ip, &udp, ib_packet)
}

#[cfg(test)]
mod tests;
