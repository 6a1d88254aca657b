//! The RDMA CM's IP addressing over the IB CM, as Linux's `rdma_cm` puts it on the wire:
//! service IDs built from a port space and a port, and the 36-byte CMA header that opens
//! the private data of a REQ or SIDR_REQ sent by an `RDMA_PS_TCP` / `RDMA_PS_UDP` id.
//!
//! The header (the kernel's `struct cma_hdr`, IBTA annex A11 "RDMA IP CM Service"):
//!
//! | bytes | field |
//! |---|---|
//! | 0 | `cma_version` = 0x00 |
//! | 1 | `ip_version` in the high nibble (4 or 6), low nibble 0 |
//! | 2..4 | source port, big-endian |
//! | 4..20 | source address: IPv6, or IPv4 in the last 4 bytes (first 12 zero) |
//! | 20..36 | destination address, same form |
//!
//! The destination port is not in the header: it is the low 16 bits of the service ID.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Size of the CMA header.
pub const CMA_HEADER_LEN: usize = 36;
/// `cma_version` the kernel writes and requires.
pub const CMA_VERSION: u8 = 0x00;

/// Port space `RDMA_PS_IPOIB`.
pub const RDMA_PS_IPOIB: u16 = 0x0002;
/// Port space `RDMA_PS_IB`.
pub const RDMA_PS_IB: u16 = 0x013F;
/// Port space `RDMA_PS_TCP`.
pub const RDMA_PS_TCP: u16 = 0x0106;
/// Port space `RDMA_PS_UDP`.
pub const RDMA_PS_UDP: u16 = 0x0111;

/// Mask of the port-space part of an IP-based service ID.
pub const RDMA_IB_IP_PS_MASK: u64 = 0xFFFF_FFFF_FFFF_0000;
/// `RDMA_IB_IP_PS_TCP`: service ID prefix of `RDMA_PS_TCP` ids.
pub const RDMA_IB_IP_PS_TCP: u64 = 0x0000_0000_0106_0000;
/// `RDMA_IB_IP_PS_UDP`.
pub const RDMA_IB_IP_PS_UDP: u64 = 0x0000_0000_0111_0000;
/// `RDMA_IB_IP_PS_IB`.
pub const RDMA_IB_IP_PS_IB: u64 = 0x0000_0000_013F_0000;
/// Service ID prefix of `RDMA_PS_IPOIB` ids.
pub const RDMA_IB_IP_PS_IPOIB: u64 = 0x0000_0000_0002_0000;

/// CM response timeout the kernel's rdma_cm puts in a REQ (`CMA_CM_RESPONSE_TIMEOUT`,
/// 4.096 µs × 2^20 ≈ 4.3 s).
pub const CMA_CM_RESPONSE_TIMEOUT: u8 = 20;
/// Max CM retries the kernel's rdma_cm puts in a REQ (`CMA_MAX_CM_RETRIES`).
pub const CMA_MAX_CM_RETRIES: u8 = 15;

/// User private data an rdma_cm REQ carries after the header (92 − 36).
pub const REQ_USER_PRIVATE_DATA_LEN: usize = crate::mad::REQ_PRIVATE_DATA_LEN - CMA_HEADER_LEN;
/// User private data an rdma_cm SIDR_REQ carries after the header (216 − 36).
pub const SIDR_REQ_USER_PRIVATE_DATA_LEN: usize =
    crate::mad::SIDR_REQ_PRIVATE_DATA_LEN - CMA_HEADER_LEN;

/// The service ID of `port` in port space `ps` (the kernel's `cma_get_service_id`).
pub fn service_id(ps: u16, port: u16) -> u64 {
    (u64::from(ps) << 16) | u64::from(port)
}

/// The port space and port of an IP-based service ID, or `None` if the ID is not in the
/// IP-based range (`0x0000_0000_01xx_pppp` or the IPoIB space).
pub fn split_service_id(service_id: u64) -> Option<(u16, u16)> {
    let ps = match service_id & RDMA_IB_IP_PS_MASK {
        RDMA_IB_IP_PS_TCP => RDMA_PS_TCP,
        RDMA_IB_IP_PS_UDP => RDMA_PS_UDP,
        RDMA_IB_IP_PS_IB => RDMA_PS_IB,
        RDMA_IB_IP_PS_IPOIB => RDMA_PS_IPOIB,
        _ => return None,
    };
    Some((ps, (service_id & 0xFFFF) as u16))
}

/// The two addresses of a CMA header, of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmaAddresses {
    /// `ip_version` 4.
    V4 {
        /// Source (the active side).
        src: Ipv4Addr,
        /// Destination (the listener).
        dst: Ipv4Addr,
    },
    /// `ip_version` 6.
    V6 {
        /// Source.
        src: Ipv6Addr,
        /// Destination.
        dst: Ipv6Addr,
    },
}

impl CmaAddresses {
    /// Pairs two addresses; `None` if their families differ.
    pub fn new(src: IpAddr, dst: IpAddr) -> Option<Self> {
        match (src, dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => Some(Self::V4 { src, dst }),
            (IpAddr::V6(src), IpAddr::V6(dst)) => Some(Self::V6 { src, dst }),
            _ => None,
        }
    }

    /// The source address.
    pub fn src(&self) -> IpAddr {
        match *self {
            Self::V4 { src, .. } => IpAddr::V4(src),
            Self::V6 { src, .. } => IpAddr::V6(src),
        }
    }

    /// The destination address.
    pub fn dst(&self) -> IpAddr {
        match *self {
            Self::V4 { dst, .. } => IpAddr::V4(dst),
            Self::V6 { dst, .. } => IpAddr::V6(dst),
        }
    }
}

/// Why private data does not start with a CMA header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CmaError {
    /// Fewer than 36 bytes.
    #[error("CMA header truncated: {0} bytes, it is 36")]
    Truncated(usize),
    /// `cma_version` is not 0.
    #[error("CMA version {0:#04x}, expected 0x00")]
    Version(u8),
    /// `ip_version` is neither 4 nor 6.
    #[error("CMA IP version {0}, expected 4 or 6")]
    IpVersion(u8),
}

/// The CMA header at the start of an rdma_cm REQ / SIDR_REQ's private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmaHeader {
    /// The active side's port.
    pub src_port: u16,
    /// Source and destination addresses.
    pub addresses: CmaAddresses,
}

impl CmaHeader {
    /// Reads the header from the first 36 bytes of `private_data`.
    pub fn parse(private_data: &[u8]) -> Result<Self, CmaError> {
        let b = private_data
            .get(..CMA_HEADER_LEN)
            .ok_or(CmaError::Truncated(private_data.len()))?;
        if b[0] != CMA_VERSION {
            return Err(CmaError::Version(b[0]));
        }
        let src_port = u16::from_be_bytes([b[2], b[3]]);
        let mut src = [0u8; 16];
        src.copy_from_slice(&b[4..20]);
        let mut dst = [0u8; 16];
        dst.copy_from_slice(&b[20..36]);
        let addresses = match b[1] >> 4 {
            4 => CmaAddresses::V4 {
                src: Ipv4Addr::new(src[12], src[13], src[14], src[15]),
                dst: Ipv4Addr::new(dst[12], dst[13], dst[14], dst[15]),
            },
            6 => CmaAddresses::V6 {
                src: Ipv6Addr::from(src),
                dst: Ipv6Addr::from(dst),
            },
            other => return Err(CmaError::IpVersion(other)),
        };
        Ok(Self {
            src_port,
            addresses,
        })
    }

    /// The 36 header bytes.
    pub fn to_bytes(&self) -> [u8; CMA_HEADER_LEN] {
        let mut b = [0u8; CMA_HEADER_LEN];
        b[0] = CMA_VERSION;
        b[2..4].copy_from_slice(&self.src_port.to_be_bytes());
        match self.addresses {
            CmaAddresses::V4 { src, dst } => {
                b[1] = 4 << 4;
                b[16..20].copy_from_slice(&src.octets());
                b[32..36].copy_from_slice(&dst.octets());
            }
            CmaAddresses::V6 { src, dst } => {
                b[1] = 6 << 4;
                b[4..20].copy_from_slice(&src.octets());
                b[20..36].copy_from_slice(&dst.octets());
            }
        }
        b
    }

    /// The header followed by `user` private data, as the REQ / SIDR_REQ private data of an
    /// rdma_cm id.
    pub fn with_user_data(&self, user: &[u8]) -> Vec<u8> {
        let mut v = Vec::with_capacity(CMA_HEADER_LEN + user.len());
        v.extend_from_slice(&self.to_bytes());
        v.extend_from_slice(user);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_port_space_service_id_is_0x0106_then_the_port() {
        assert_eq!(service_id(RDMA_PS_TCP, 7471), 0x0000_0000_0106_1D2F);
        assert_eq!(service_id(RDMA_PS_UDP, 1), RDMA_IB_IP_PS_UDP | 1);
        assert_eq!(service_id(RDMA_PS_IB, 0xFFFF), RDMA_IB_IP_PS_IB | 0xFFFF);
        assert_eq!(
            split_service_id(0x0000_0000_0106_1D2F),
            Some((RDMA_PS_TCP, 7471))
        );
        assert_eq!(split_service_id(0x1000_0000_0106_0001), None);
    }

    #[test]
    fn ipv4_cma_header_puts_the_address_in_the_last_four_bytes() {
        let h = CmaHeader {
            src_port: 0x1234,
            addresses: CmaAddresses::V4 {
                src: Ipv4Addr::new(127, 0, 0, 1),
                dst: Ipv4Addr::new(127, 0, 0, 2),
            },
        };
        let b = h.to_bytes();
        let mut want = [0u8; 36];
        want[1] = 0x40;
        want[2] = 0x12;
        want[3] = 0x34;
        want[16..20].copy_from_slice(&[127, 0, 0, 1]);
        want[32..36].copy_from_slice(&[127, 0, 0, 2]);
        assert_eq!(b, want);
        assert_eq!(CmaHeader::parse(&b), Ok(h));
    }

    #[test]
    fn ipv6_cma_header_round_trips_and_bad_versions_are_errors() {
        let h = CmaHeader {
            src_port: 1,
            addresses: CmaAddresses::V6 {
                src: "fe80::1".parse().unwrap_or(Ipv6Addr::UNSPECIFIED),
                dst: "::ffff:127.0.0.2".parse().unwrap_or(Ipv6Addr::UNSPECIFIED),
            },
        };
        let mut b = h.to_bytes();
        assert_eq!(b[1], 0x60);
        assert_eq!(CmaHeader::parse(&b), Ok(h));
        assert_eq!(CmaHeader::parse(&b[..35]), Err(CmaError::Truncated(35)));
        b[1] = 0x50;
        assert_eq!(CmaHeader::parse(&b), Err(CmaError::IpVersion(5)));
        b[0] = 1;
        assert_eq!(CmaHeader::parse(&b), Err(CmaError::Version(1)));
    }

    #[test]
    fn user_private_data_is_what_is_left_after_the_header() {
        assert_eq!(REQ_USER_PRIVATE_DATA_LEN, 56);
        assert_eq!(SIDR_REQ_USER_PRIVATE_DATA_LEN, 180);
    }
}
