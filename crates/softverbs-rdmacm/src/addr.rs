//! IP addresses as librdmacm takes them (`struct sockaddr` of family `AF_INET` or
//! `AF_INET6`) and as RoCEv2 carries them (GIDs: an IPv4 address as the IPv4-mapped IPv6
//! address `::ffff:a.b.c.d`, an IPv6 address as itself).

use crate::boundary::Errno;
use libc::{sa_family_t, sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// Reads a caller's `struct sockaddr`: `EINVAL` for NULL, `EAFNOSUPPORT` for a family
/// other than `AF_INET` / `AF_INET6` (`AF_IB` included: the soft device is RoCE only).
///
/// # Safety
///
/// A non-NULL `p` points at a `sockaddr_in` when its family is `AF_INET` and at a
/// `sockaddr_in6` when it is `AF_INET6` (the caller's contract in `rdma_cma.h`).
pub unsafe fn read(p: *const sockaddr) -> Result<SocketAddr, Errno> {
    if p.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: non-NULL; every sockaddr starts with its family.
    let family = unsafe { (*p).sa_family } as i32;
    match family {
        libc::AF_INET => {
            // SAFETY: an AF_INET sockaddr is a sockaddr_in (caller's contract); read
            // unaligned since callers may pass a byte buffer.
            let s = unsafe { std::ptr::read_unaligned(p as *const sockaddr_in) };
            Ok(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
                u16::from_be(s.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6 (caller's contract).
            let s = unsafe { std::ptr::read_unaligned(p as *const sockaddr_in6) };
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(s.sin6_addr.s6_addr),
                u16::from_be(s.sin6_port),
                u32::from_be(s.sin6_flowinfo),
                s.sin6_scope_id,
            )))
        }
        _ => Err(libc::EAFNOSUPPORT),
    }
}

/// The address held in a `sockaddr_storage` we wrote, if any.
pub fn from_storage(s: &sockaddr_storage) -> Option<SocketAddr> {
    // SAFETY: a sockaddr_storage is large and aligned enough for any sockaddr; `read`
    // looks at the family first.
    unsafe { read(s as *const sockaddr_storage as *const sockaddr) }.ok()
}

/// Writes `a` into a `sockaddr_storage` (zeroing the rest).
pub fn to_storage(dst: &mut sockaddr_storage, a: SocketAddr) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    *dst = unsafe { std::mem::zeroed() };
    let len = write(dst as *mut sockaddr_storage as *mut sockaddr, a);
    debug_assert!(len <= std::mem::size_of::<sockaddr_storage>());
}

/// Writes `a` at `p` as a `sockaddr_in` or `sockaddr_in6`; returns its length.
fn write(p: *mut sockaddr, a: SocketAddr) -> usize {
    match a {
        SocketAddr::V4(v4) => {
            let s = sockaddr_in {
                sin_family: libc::AF_INET as sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: callers pass room for a sockaddr_storage (≥ sockaddr_in).
            unsafe { std::ptr::write_unaligned(p as *mut sockaddr_in, s) };
            std::mem::size_of::<sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let s = sockaddr_in6 {
                sin6_family: libc::AF_INET6 as sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo().to_be(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: callers pass room for a sockaddr_storage (≥ sockaddr_in6).
            unsafe { std::ptr::write_unaligned(p as *mut sockaddr_in6, s) };
            std::mem::size_of::<sockaddr_in6>()
        }
    }
}

/// A freshly allocated (`malloc`) copy of `a` and its length, for `rdma_addrinfo`.
pub fn malloc_sockaddr(a: SocketAddr) -> Result<(*mut sockaddr, u32), Errno> {
    let size = std::mem::size_of::<sockaddr_storage>();
    // SAFETY: plain allocation; freed by `rdma_freeaddrinfo` with `free`.
    let p = unsafe { libc::calloc(1, size) } as *mut sockaddr;
    if p.is_null() {
        return Err(libc::ENOMEM);
    }
    let len = write(p, a);
    Ok((p, len as u32))
}

/// The GID RoCEv2 uses for an IP address.
pub fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The IP address a GID stands for (an IPv4-mapped GID is IPv4).
pub fn ip_of_gid(gid: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// Whether two addresses name the same host (IPv4 and its mapped IPv6 form are one).
pub fn same_ip(a: IpAddr, b: IpAddr) -> bool {
    gid_of(a) == gid_of(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_addresses_are_carried_as_ipv4_mapped_gids() {
        let ip: IpAddr = "127.0.0.7".parse().unwrap();
        let gid = gid_of(ip);
        assert_eq!(&gid[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
        assert_eq!(&gid[12..], &[127, 0, 0, 7]);
        assert_eq!(ip_of_gid(gid), ip);
        let v6: IpAddr = "fe80::1".parse().unwrap();
        assert_eq!(ip_of_gid(gid_of(v6)), v6);
    }

    #[test]
    fn sockaddrs_round_trip_through_storage_and_foreign_families_are_refused() {
        // SAFETY: all-zero is a valid sockaddr_storage.
        let mut st: sockaddr_storage = unsafe { std::mem::zeroed() };
        for a in ["127.0.0.9:7471", "[::1]:18515"] {
            let a: SocketAddr = a.parse().unwrap();
            to_storage(&mut st, a);
            assert_eq!(from_storage(&st), Some(a));
        }
        st.ss_family = 27; // AF_IB
                           // SAFETY: a valid storage.
        let r = unsafe { read(&st as *const _ as *const sockaddr) };
        assert_eq!(r, Err(libc::EAFNOSUPPORT));
        // SAFETY: NULL is checked.
        assert_eq!(unsafe { read(std::ptr::null()) }, Err(libc::EINVAL));
    }
}
