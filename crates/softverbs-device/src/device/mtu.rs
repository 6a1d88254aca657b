//! The port MTU of a device: the largest IB MTU whose RoCEv2 packets fit in the IP
//! datagrams of the interface that holds the device's address, as rxe derives it from its
//! netdev. Reads the interface's MTU from the kernel (`getifaddrs`, `SIOCGIFMTU`); never
//! raises the MTU the configuration asks for.

use softverbs_proto::Mtu;
use std::net::IpAddr;

/// The port MTU of a device at `address` whose configuration asks for `configured`:
/// `configured`, lowered to what the interface holding `address` carries.
pub(super) fn port_mtu(address: IpAddr, configured: Mtu) -> Mtu {
    // Loopback carries 64 KiB. A real interface carries its own MTU: the port's MTU is
    // the largest IB MTU whose packets fit (1024 for 1500-byte Ethernet frames, 4096
    // for jumbo frames), as rxe derives it from its netdev. An address no interface
    // holds (a wildcard) gets the Ethernet answer.
    if !address.is_loopback() {
        let fits = largest_ib_mtu(address, interface_mtu(address).unwrap_or(1500));
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

/// The MTU of the network interface that holds `address` (`None` if no interface does).
fn interface_mtu(address: IpAddr) -> Option<u32> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a list we free below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut name = None;
    let mut entry = list;
    while !entry.is_null() {
        // SAFETY: a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*entry };
        entry = ifa.ifa_next;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: a non-NULL address of the node; the family says which sockaddr it is.
        let holds = unsafe {
            match (i32::from((*ifa.ifa_addr).sa_family), address) {
                (libc::AF_INET, IpAddr::V4(v4)) => {
                    let sin = &*ifa.ifa_addr.cast::<libc::sockaddr_in>();
                    u32::from_be(sin.sin_addr.s_addr) == u32::from(v4)
                }
                (libc::AF_INET6, IpAddr::V6(v6)) => {
                    let sin6 = &*ifa.ifa_addr.cast::<libc::sockaddr_in6>();
                    sin6.sin6_addr.s6_addr == v6.octets()
                }
                _ => false,
            }
        };
        if holds {
            // SAFETY: the node's NUL-terminated interface name.
            name = Some(unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_owned());
            break;
        }
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(list) };
    let name = name?;
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).ok()?;
    // SAFETY: an all-zero ifreq is valid; the name is copied in bounded by IFNAMSIZ - 1.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in request
        .ifr_name
        .iter_mut()
        .zip(name.as_bytes().iter().take(libc::IFNAMSIZ - 1))
    {
        *dst = *src as libc::c_char;
    }
    use std::os::fd::AsRawFd;
    // SAFETY: SIOCGIFMTU reads the name and writes the MTU into the request we own.
    let rc = unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFMTU, &mut request) };
    if rc != 0 {
        return None;
    }
    // SAFETY: after a successful SIOCGIFMTU the union holds the MTU.
    Some(unsafe { request.ifr_ifru.ifru_mtu } as u32)
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

    #[test]
    fn the_interface_mtu_is_read_from_the_interface_holding_the_address() {
        assert_eq!(interface_mtu(IpAddr::V4(Ipv4Addr::LOCALHOST)), Some(65536));
        // 192.0.2.0/24 is TEST-NET-1: no interface here holds it.
        assert_eq!(interface_mtu(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))), None);
    }
}
