//! The 40-byte GRH area a UD receive gets, rebuilt from the IP addresses of the packet
//! (RoCEv2 carries no GRH on the wire: the IP header stands in for it).

use std::net::IpAddr;

/// The 40-byte GRH area a UD receive gets (reference §3.4): for IPv4, 20 zero bytes then
/// the IPv4 header as the sender's kernel built it; for IPv6, the IPv6 header.
pub(super) fn grh_bytes(from: IpAddr, to: IpAddr, ib_len: usize) -> [u8; 40] {
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
