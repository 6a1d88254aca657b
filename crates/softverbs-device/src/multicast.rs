//! The IP multicast groups a UDP device receives: one socket per group, and the epoll set
//! a receiver waits on once there is one.
//!
//! RoCEv2 maps a multicast GID to an IP multicast address (IBTA Annex A17.4.5: the group's
//! GID is the destination address of the IP header; `::ffff:239.1.2.3` is 239.1.2.3), and
//! a multicast packet is a datagram to that address at the RoCEv2 port. The device socket
//! is bound to the device's unicast address and never sees such a datagram, so every group
//! the device joins gets a socket of its own:
//!
//! - bound to *(group, port)* with `SO_REUSEADDR`, so that any number of devices, in any
//!   number of processes of any user, receive the same group on one host — each gets its
//!   own copy (ip(7): a datagram to a multicast address goes to every socket bound to it);
//! - member of the group on the interface holding the device's address only
//!   (`IP_ADD_MEMBERSHIP` with that address; IPv6: `IPV6_JOIN_GROUP` with its index), with
//!   `IP_MULTICAST_ALL` (`IPV6_MULTICAST_ALL`) off, so it receives the group only where
//!   this device joined it, not wherever another socket of the host did;
//! - otherwise set up as the device socket (receive TOS/TTL, `SO_RXQ_OVFL`, a large receive
//!   buffer): its datagrams get the same checks, the ICRC over the header with the group
//!   as destination.
//!
//! Closing the socket leaves the group (the kernel drops the membership with the socket),
//! so a process that dies leaves nothing behind.
//!
//! Sending needs nothing here: the device socket sends to the group's address out of its
//! own interface (`unbound_rocev2_socket` sets `IP_MULTICAST_IF`), with loopback on.
//!
//! A thread that waits for packets waits on the device socket alone while the device is in
//! no group; from the first join on, on an epoll set holding the device socket and every
//! group socket (one `poll(2)` on the epoll fd, as before on the socket).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use rustix::event::epoll;
use socket2::{SockAddr, Socket};

use crate::udp::{set_int_option, unbound_rocev2_socket, UdpConfig};

/// The groups one UDP device receives.
#[derive(Debug, Default)]
pub(crate) struct Groups {
    /// Each group and its socket.
    sockets: Mutex<Vec<(IpAddr, Socket)>>,
    /// How many groups (read without the lock on every receive and wait: `Relaxed`, a
    /// hint; a stale value costs one receive or wait that misses a group socket, bounded
    /// by its timeout, never a packet).
    count: AtomicUsize,
    /// The device socket and every group socket, made at the first join.
    epoll: OnceLock<OwnedFd>,
}

impl Groups {
    /// Whether the device is in any group.
    pub(crate) fn any(&self) -> bool {
        self.count.load(Ordering::Relaxed) > 0
    }

    fn sockets(&self) -> MutexGuard<'_, Vec<(IpAddr, Socket)>> {
        self.sockets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Joins `group` at `port` on the interface holding `local` (of index `ifindex`, for
    /// IPv6); `device_socket` is the device's own socket, for the epoll set. Joining a
    /// group already joined changes nothing. `InvalidInput` for an address that is not
    /// multicast or not of the device's IP version.
    pub(crate) fn join(
        &self,
        group: IpAddr,
        port: u16,
        local: IpAddr,
        ifindex: u32,
        config: &UdpConfig,
        device_socket: BorrowedFd<'_>,
    ) -> io::Result<()> {
        if !group.is_multicast() || group.is_ipv4() != local.is_ipv4() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{group} is not a multicast address this device ({local}) can join"),
            ));
        }
        let mut sockets = self.sockets();
        if sockets.iter().any(|(g, _)| *g == group) {
            return Ok(());
        }
        let addr = SocketAddr::new(group, port);
        let socket = unbound_rocev2_socket(addr, config, true)?;
        socket.set_reuse_address(true)?;
        match (group, local) {
            (IpAddr::V4(group), IpAddr::V4(local)) => {
                socket.set_multicast_all_v4(false)?;
                socket.bind(&SockAddr::from(addr))?;
                socket.join_multicast_v4(&group, &local)?;
            }
            (IpAddr::V6(group), _) => {
                // ipv6(7) IPV6_MULTICAST_ALL (Linux 4.20), as IP_MULTICAST_ALL above.
                set_int_option(&socket, libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_ALL, 0)?;
                socket.bind(&SockAddr::from(addr))?;
                socket.join_multicast_v6(&group, ifindex)?;
            }
            // Refused above.
            (IpAddr::V4(_), IpAddr::V6(_)) => return Err(io::ErrorKind::InvalidInput.into()),
        }
        let epoll = match self.epoll.get() {
            Some(epoll) => epoll,
            None => {
                let made = epoll::create(epoll::CreateFlags::CLOEXEC)?;
                epoll::add(
                    &made,
                    device_socket,
                    epoll::EventData::new_u64(0),
                    epoll::EventFlags::IN,
                )?;
                // Under the lock: only one join makes it.
                self.epoll.get_or_init(|| made)
            }
        };
        epoll::add(
            epoll,
            socket.as_fd(),
            epoll::EventData::new_u64(1),
            epoll::EventFlags::IN,
        )?;
        tracing::debug!(%group, port, %local, "joined a multicast group");
        sockets.push((group, socket));
        self.count.store(sockets.len(), Ordering::Relaxed);
        Ok(())
    }

    /// Leaves `group` (closes its socket). `NotFound` if the device is not in it.
    pub(crate) fn leave(&self, group: IpAddr) -> io::Result<()> {
        let mut sockets = self.sockets();
        let at = sockets
            .iter()
            .position(|(g, _)| *g == group)
            .ok_or(io::ErrorKind::NotFound)?;
        let (_, socket) = sockets.swap_remove(at);
        if let Some(epoll) = self.epoll.get() {
            let _ = epoll::delete(epoll, socket.as_fd());
        }
        drop(socket);
        self.count.store(sockets.len(), Ordering::Relaxed);
        tracing::debug!(%group, "left a multicast group");
        Ok(())
    }

    /// Runs `f` on each group and its socket, under the lock (the receives it makes do not
    /// block).
    pub(crate) fn for_each(&self, mut f: impl FnMut(IpAddr, &Socket)) {
        for (group, socket) in self.sockets().iter() {
            f(*group, socket);
        }
    }

    /// The fd to wait on for the device socket and every group socket: the epoll set, once
    /// the device joined a group (`None` before).
    pub(crate) fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        self.any()
            .then(|| self.epoll.get().map(|fd| fd.as_fd()))
            .flatten()
    }
}
