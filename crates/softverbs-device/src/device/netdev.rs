//! The network interface that holds the device's address, as kernel rxe has a netdev:
//! its index (the `ndev_ifindex` of every GID of the port, `ibv_query_gid_ex(3)`) and its
//! MTU (the port MTU, `mtu.rs`). Read once from the kernel when the device opens
//! (`getifaddrs(3)`, `if_nametoindex(3)`, `SIOCGIFMTU`).

use std::ffi::CStr;
use std::net::IpAddr;
use std::os::fd::AsRawFd;

/// The interface holding an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Netdev {
    /// Its index (`if_nametoindex(3)`), never 0.
    pub(crate) index: u32,
    /// Its MTU (`None` if the kernel would not say).
    pub(crate) mtu: Option<u32>,
}

/// The interface holding `address`: the one that has it as an address, else the loopback
/// interface whose prefix contains it (`lo` holds 127.0.0.1/8, and the kernel treats every
/// 127.x.y.z address as local to `lo`; another interface's prefix only says where an
/// address's neighbours are). `None` if no interface does (a wildcard address, an address
/// of no interface).
pub(crate) fn holding(address: IpAddr) -> Option<Netdev> {
    let name = interface_name(address)?;
    // SAFETY: a NUL-terminated name; if_nametoindex only reads it.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return None;
    }
    Some(Netdev {
        index,
        mtu: interface_mtu(&name),
    })
}

/// The name of the interface holding `address` (see [`holding`]).
fn interface_name(address: IpAddr) -> Option<std::ffi::CString> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a list we free below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut exact = None;
    let mut within = None;
    let mut entry = list;
    while !entry.is_null() {
        // SAFETY: a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*entry };
        entry = ifa.ifa_next;
        // SAFETY: the node's address and netmask are NULL or sockaddrs of the family they
        // name, alive until freeifaddrs.
        let Some((held, prefix_bits)) = (unsafe { address_and_prefix(ifa) }) else {
            continue;
        };
        // SAFETY: the node's NUL-terminated interface name, alive until freeifaddrs.
        let name = || unsafe { CStr::from_ptr(ifa.ifa_name) }.to_owned();
        if held == address {
            exact = Some(name());
            break;
        }
        let loopback = ifa.ifa_flags & libc::IFF_LOOPBACK as libc::c_uint != 0;
        if within.is_none() && loopback && same_prefix(held, address, prefix_bits) {
            within = Some(name());
        }
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(list) };
    exact.or(within)
}

/// The address of an `ifaddrs` node and the length of its prefix (from its netmask).
///
/// # Safety
///
/// `ifa.ifa_addr` and `ifa.ifa_netmask` are NULL or point to sockaddrs of the family their
/// `sa_family` names.
unsafe fn address_and_prefix(ifa: &libc::ifaddrs) -> Option<(IpAddr, u32)> {
    if ifa.ifa_addr.is_null() {
        return None;
    }
    // SAFETY: a non-NULL sockaddr (this function's `# Safety`).
    let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: an AF_INET sockaddr is a sockaddr_in (this function's `# Safety`).
            let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
            let address = IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes());
            let bits = if ifa.ifa_netmask.is_null() {
                32
            } else {
                // SAFETY: the netmask of an AF_INET address is a sockaddr_in.
                let mask = unsafe { &*ifa.ifa_netmask.cast::<libc::sockaddr_in>() };
                u32::from_be(mask.sin_addr.s_addr).count_ones()
            };
            Some((address, bits))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6 (this function's `# Safety`).
            let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
            let address = IpAddr::from(sin6.sin6_addr.s6_addr);
            let bits = if ifa.ifa_netmask.is_null() {
                128
            } else {
                // SAFETY: the netmask of an AF_INET6 address is a sockaddr_in6.
                let mask = unsafe { &*ifa.ifa_netmask.cast::<libc::sockaddr_in6>() };
                u128::from_be_bytes(mask.sin6_addr.s6_addr).count_ones()
            };
            Some((address, bits))
        }
        _ => None,
    }
}

/// Whether `a` and `b` (of one IP version) share their first `bits` bits.
fn same_prefix(a: IpAddr, b: IpAddr, bits: u32) -> bool {
    let mask = |width: u32| {
        let bits = bits.min(width);
        if bits == 0 {
            0
        } else {
            u128::MAX << (width - bits)
        }
    };
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let m = mask(32);
            u128::from(u32::from(a)) & m == u128::from(u32::from(b)) & m
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let m = mask(128);
            u128::from(a) & m == u128::from(b) & m
        }
        _ => false,
    }
}

/// The MTU of interface `name` (`SIOCGIFMTU`).
fn interface_mtu(name: &CStr) -> Option<u32> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).ok()?;
    // SAFETY: an all-zero ifreq is valid; the name is copied in bounded by IFNAMSIZ - 1.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in request
        .ifr_name
        .iter_mut()
        .zip(name.to_bytes().iter().take(libc::IFNAMSIZ - 1))
    {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFMTU reads the name and writes the MTU into the request we own.
    let rc = unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFMTU, &mut request) };
    if rc != 0 {
        return None;
    }
    // SAFETY: after a successful SIOCGIFMTU the union holds the MTU.
    u32::try_from(unsafe { request.ifr_ifru.ifru_mtu }).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    /// The loopback interface's index, as `if_nametoindex("lo")` gives it.
    fn lo_index() -> u32 {
        // SAFETY: a NUL-terminated name.
        let index = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
        assert_ne!(index, 0, "no interface `lo`");
        index
    }

    // rxe's GIDs belong to the netdev holding the address: 127.0.0.0/8 is `lo`'s, held
    // as 127.0.0.1/8, so 127.0.0.2 and the in-process 127.1.x.y are on `lo` too.
    #[test]
    fn the_interface_of_a_loopback_address_is_lo() {
        for address in ["127.0.0.1", "127.0.0.2", "127.1.0.7"] {
            let netdev = holding(address.parse().unwrap()).expect(address);
            assert_eq!(netdev.index, lo_index(), "{address}");
            assert_eq!(netdev.mtu, Some(65536), "{address}");
        }
    }

    #[test]
    fn an_address_no_interface_holds_has_no_interface() {
        // 192.0.2.0/24 is TEST-NET-1: no interface here holds 192.0.2.1 (a machine may
        // have another address of that prefix: its neighbour, not its own).
        assert_eq!(holding(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))), None);
        assert_eq!(holding(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), None);
    }

    #[test]
    fn prefixes_compare_only_their_bits() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(same_prefix(ip("127.0.0.1"), ip("127.9.8.7"), 8));
        assert!(!same_prefix(ip("127.0.0.1"), ip("128.0.0.1"), 8));
        assert!(same_prefix(ip("10.0.0.1"), ip("10.0.0.1"), 32));
        assert!(same_prefix(ip("fd99::1"), ip("fd99::2"), 64));
        assert!(!same_prefix(ip("fd99::1"), ip("fd98::1"), 64));
        assert!(!same_prefix(ip("::1"), ip("127.0.0.1"), 0));
    }
}
