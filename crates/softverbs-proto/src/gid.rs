//! GIDs as addresses (reference §4.3): the IP address a RoCEv2 GID names for a device at a
//! given address ([`gid_address`]), and the link-local GID a softverbs port keeps at index
//! 0 of its GID table ([`link_local_gid`]). Pure functions of bytes and addresses: the
//! engine's path check and the device's sending both go through [`gid_address`], so a
//! QP sends to exactly the address it accepts packets from.
//!
//! Kernel rxe fills a port's GID table from its network interface: index 0 the
//! interface's IPv6 link-local address, then its IPv4 addresses as `::ffff:a.b.c.d`, then
//! its other IPv6 addresses (one RoCEv2 entry each). A softverbs device has no interface
//! of its own, only a UDP socket on one address `A`, so its link-local GID is made from
//! `A`, and a peer's device turns it back into `A`:
//!
//! | `A` | link-local GID | a peer at `L` reads it as |
//! |---|---|---|
//! | IPv4 `a.b.c.d` | `fe80::ffff:a.b.c.d` (prefix `fe80::/64`, interface identifier `0:ffff:a.b.c.d`) | `a.b.c.d` (when `L` is IPv4) |
//! | IPv6, not link-local | `fe80::` and the low 64 bits of `A` (its interface identifier) | the prefix of `L` (its high 64 bits) and that identifier: link-local means on one link, hence one /64 |
//! | IPv6 link-local | `A` itself | `A` |
//!
//! The RoCEv2 wire does not change with the GID index: packets travel between the UDP
//! sockets' addresses whatever `sgid_index` a QP names. A link-local GID of another
//! device (kernel rxe's, made from a MAC address) names no softverbs socket: a peer
//! reaches rxe through rxe's IPv4-mapped or global IPv6 GID.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The first 8 bytes of a link-local GID made by [`link_local_gid`]: `fe80::/64`.
const LINK_LOCAL_PREFIX: [u8; 8] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0];

/// Bytes 8..12 of the link-local GID of an IPv4 address (interface identifier
/// `0:ffff:a.b.c.d`).
const IPV4_IDENTIFIER: [u8; 4] = [0, 0, 0xff, 0xff];

/// The link-local GID of a device on `address` (the module's table): `fe80::ffff:a.b.c.d`
/// for IPv4, `fe80::` and the interface identifier for IPv6, a link-local IPv6 address
/// as it is.
///
/// ```
/// # use softverbs_proto::link_local_gid;
/// # use std::net::Ipv6Addr;
/// let gid = link_local_gid("127.0.0.2".parse().unwrap());
/// assert_eq!(Ipv6Addr::from(gid), "fe80::ffff:7f00:2".parse::<Ipv6Addr>().unwrap());
/// let gid = link_local_gid("2001:db8::5".parse().unwrap());
/// assert_eq!(Ipv6Addr::from(gid), "fe80::5".parse::<Ipv6Addr>().unwrap());
/// ```
pub fn link_local_gid(address: IpAddr) -> [u8; 16] {
    let mut gid = [0u8; 16];
    gid[..8].copy_from_slice(&LINK_LOCAL_PREFIX);
    match address {
        IpAddr::V4(v4) => {
            gid[8..12].copy_from_slice(&IPV4_IDENTIFIER);
            gid[12..].copy_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) if v6.is_unicast_link_local() => return v6.octets(),
        IpAddr::V6(v6) => gid[8..].copy_from_slice(&v6.octets()[8..]),
    }
    gid
}

/// The IP address a packet to `gid` goes to, for a device on `local` (reference §4.3 and
/// the module's table): an IPv4-mapped GID is its IPv4 address; a link-local GID made by
/// [`link_local_gid`] is the address it was made from; any other GID is its IPv6 address.
///
/// ```
/// # use softverbs_proto::{gid_address, link_local_gid};
/// # use std::net::{IpAddr, Ipv6Addr};
/// let me: IpAddr = "127.0.0.3".parse().unwrap();
/// let peer: IpAddr = "127.0.0.2".parse().unwrap();
/// assert_eq!(gid_address(&link_local_gid(peer), me), peer);
/// let mapped = "::ffff:127.0.0.2".parse::<Ipv6Addr>().unwrap().octets();
/// assert_eq!(gid_address(&mapped, me), peer);
/// ```
pub fn gid_address(gid: &[u8; 16], local: IpAddr) -> IpAddr {
    let v6 = Ipv6Addr::from(*gid);
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    if gid[..8] == LINK_LOCAL_PREFIX {
        match local {
            IpAddr::V4(_) if gid[8..12] == IPV4_IDENTIFIER => {
                return IpAddr::V4(Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15]));
            }
            IpAddr::V6(l) if !l.is_unicast_link_local() => {
                let mut address = l.octets();
                address[8..].copy_from_slice(&gid[8..]);
                return IpAddr::V6(Ipv6Addr::from(address));
            }
            _ => {}
        }
    }
    IpAddr::V6(v6)
}

/// Whether `gid` names the IPv4 address `v4` for a device of an IPv4 address: what
/// [`gid_address`] says, worked out on the bytes (a path check runs it per packet).
pub(crate) fn names_ipv4(gid: &[u8; 16], v4: [u8; 4]) -> bool {
    gid[12..] == v4
        && gid[8..12] == IPV4_IDENTIFIER
        && (gid[..8] == [0; 8] || gid[..8] == LINK_LOCAL_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `names_ipv4` is `gid_address`'s answer for an IPv4 device, for mapped, link-local
    /// and other GIDs.
    #[test]
    fn names_ipv4_agrees_with_gid_address() {
        let me = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));
        let peer = [127, 0, 0, 2];
        let gids = [
            gid("::ffff:127.0.0.2"),
            gid("::ffff:127.0.0.9"),
            gid("fe80::ffff:7f00:2"),
            gid("fe80::ffff:7f00:9"),
            gid("fe80::1:ffff:7f00:2"),
            gid("fe80::5054:ff:fe12:3456"),
            gid("2001:db8::ffff:7f00:2"),
            gid("::1:ffff:7f00:2"),
            gid("::"),
        ];
        for g in gids {
            assert_eq!(
                names_ipv4(&g, peer),
                gid_address(&g, me) == IpAddr::V4(Ipv4Addr::from(peer)),
                "{g:?}"
            );
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn gid(s: &str) -> [u8; 16] {
        s.parse::<Ipv6Addr>().unwrap().octets()
    }

    // The module's table: each link-local GID names the address it was made from, for a
    // peer of the same IP version on the same link.
    #[test]
    fn a_link_local_gid_names_the_address_it_was_made_from() {
        for (address, link_local, peer) in [
            ("127.0.0.2", "fe80::ffff:7f00:2", "127.0.0.3"),
            ("10.99.0.1", "fe80::ffff:a63:1", "10.99.0.2"),
            ("::1", "fe80::1", "::1"),
            ("fd99::1", "fe80::1", "fd99::2"),
            (
                "2001:db8:1:2:aa:bb:cc:dd",
                "fe80::aa:bb:cc:dd",
                "2001:db8:1:2::7",
            ),
            ("fe80::5054:ff:fe99:2", "fe80::5054:ff:fe99:2", "fe80::1"),
        ] {
            let made = link_local_gid(ip(address));
            assert_eq!(made, gid(link_local), "link-local GID of {address}");
            assert_eq!(
                gid_address(&made, ip(peer)),
                ip(address),
                "{link_local} at {peer}"
            );
        }
    }

    // Reference §4.3: IPv4-mapped GIDs are IPv4 addresses, other GIDs IPv6 addresses,
    // whatever the local address.
    #[test]
    fn mapped_and_global_gids_are_their_own_address() {
        assert_eq!(
            gid_address(&gid("::ffff:10.0.0.1"), ip("::1")),
            ip("10.0.0.1")
        );
        assert_eq!(gid_address(&gid("fd99::2"), ip("127.0.0.1")), ip("fd99::2"));
        assert_eq!(gid_address(&gid("fd99::2"), ip("fd99::1")), ip("fd99::2"));
    }

    // A link-local GID that is not a softverbs one (rxe's, from a MAC address) names that
    // IPv6 address for an IPv4 device: no IPv4 socket reaches it, nothing is invented.
    #[test]
    fn a_foreign_link_local_gid_is_not_read_as_ipv4() {
        let rxe = gid("fe80::5054:ff:fe99:2");
        assert_eq!(
            gid_address(&rxe, ip("10.99.0.1")),
            ip("fe80::5054:ff:fe99:2")
        );
        // A link-local device takes link-local GIDs as they are.
        assert_eq!(gid_address(&rxe, ip("fe80::1")), ip("fe80::5054:ff:fe99:2"));
    }
}
