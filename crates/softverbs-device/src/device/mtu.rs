//! The port MTU of a device: the largest IB MTU whose RoCEv2 packets fit in the IP
//! datagrams of the interface that holds the device's address, as rxe derives it from its
//! netdev (`netdev.rs` reads the interface's MTU); never raises the MTU the configuration
//! asks for.

use softverbs_proto::Mtu;
use std::net::IpAddr;

/// The port MTU of a device at `address` whose configuration asks for `configured`:
/// `configured`, lowered to what the interface holding `address` carries (`link_mtu`,
/// `None` if no interface holds it).
pub(super) fn port_mtu(address: IpAddr, link_mtu: Option<u32>, configured: Mtu) -> Mtu {
    // Loopback carries 64 KiB. A real interface carries its own MTU: the port's MTU is
    // the largest IB MTU whose packets fit (1024 for 1500-byte Ethernet frames, 4096
    // for jumbo frames), as rxe derives it from its netdev. An address no interface
    // holds (a wildcard) gets the Ethernet answer.
    if !address.is_loopback() {
        let fits = largest_ib_mtu(address, link_mtu.unwrap_or(1500));
        if configured > fits {
            return fits;
        }
    }
    configured
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

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
}
