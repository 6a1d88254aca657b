//! The 40-byte GRH area a UD receive gets, rebuilt from the IP addresses of the packet
//! (RoCEv2 carries no GRH on the wire: the IP header stands in for it).

use std::net::IpAddr;

/// The longest UDP datagram (header included) an IPv4 packet can carry: 65,535 bytes
/// less the IPv4 header's 20.
const MAX_UDP_LEN: usize = u16::MAX as usize - 20;

/// The 40-byte GRH area a UD receive gets (reference §3.4): for IPv4, 20 zero bytes then
/// the IPv4 header as the sender's kernel built it; for IPv6, the IPv6 header. A packet
/// handed over between devices of this process may be longer than an IP datagram (a
/// connected QP's 64 KiB segments, never a UD packet): its length fields then say the
/// longest an IPv4 datagram can carry, and its addresses are right (all a connected QP's
/// path check reads).
pub(super) fn grh_bytes(from: IpAddr, to: IpAddr, ib_len: usize) -> [u8; 40] {
    let mut grh = [0u8; 40];
    let udp_len = (ib_len + 8).min(MAX_UDP_LEN) as u16;
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
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    /// A packet longer than an IP datagram (a 64 KiB segment handed over between devices
    /// of this process) still gets a GRH naming its sender and receiver, with the longest
    /// length an IPv4 datagram can say; a UD-sized one its exact length.
    #[test]
    fn a_packet_longer_than_a_datagram_gets_a_grh_with_its_addresses() {
        let (a, b) = (Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2));
        let grh = grh_bytes(IpAddr::V4(a), IpAddr::V4(b), 65_568);
        assert_eq!(grh[20] >> 4, 4, "an IPv4 header");
        assert_eq!(grh[32..36], a.octets());
        assert_eq!(grh[36..40], b.octets());
        assert_eq!(u16::from_be_bytes([grh[22], grh[23]]), u16::MAX);
        let grh = grh_bytes(IpAddr::V4(a), IpAddr::V4(b), 4_124);
        assert_eq!(u16::from_be_bytes([grh[22], grh[23]]), 20 + 8 + 4_124);

        let (a6, b6) = (
            Ipv6Addr::LOCALHOST,
            Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2),
        );
        let grh = grh_bytes(IpAddr::V6(a6), IpAddr::V6(b6), 65_568);
        assert_eq!(grh[8..24], a6.octets());
        assert_eq!(grh[24..40], b6.octets());
        assert_eq!(
            usize::from(u16::from_be_bytes([grh[4], grh[5]])),
            MAX_UDP_LEN
        );
    }
}
