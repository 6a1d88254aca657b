//! The link at the bottom of the transport stack of a device with a capture or fault
//! injection: [`Link`], under the same middleware as on UDP
//! (`FaultTransport<PcapTransport<Link>>`), so that those knobs act on every path a
//! packet can take, the direct hand-over between devices of this process included.
//!
//! A packet for a device of this process (always, for an in-process device; while the
//! in-process shortcut is on, for a UDP device) is handed over with the headers the link
//! prepared for it: the receiving device checks its ICRC as a receiving transport does
//! (so injected corruption is caught there) and records it in its own capture. Any other
//! packet goes to the UDP socket, unchanged from a device without a link.
//!
//! A device with neither knob has no link: its packets are handed over directly, with no
//! headers, no ICRC and no middleware (`runtime.rs`).

use super::registry::{group_members, registry};
use super::runtime::hand_over;
use super::{lock, DeviceInner};
use crate::shm::HostTransport;
use crate::transport::{
    invalid_input, path_headers, AtomicCounters, DropReason, Endpoint, Received, Sent, Transport,
    TransportCounters,
};
use softverbs_wire::icrc;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The hop limit (IPv4 TTL) of the headers of packets handed over between in-process
/// devices, as a UDP device sends with by default. Not covered by the ICRC.
pub(super) const HOP_LIMIT: u8 = 64;

/// The bottom of a device's stack when it captures or injects faults: hands packets for
/// devices of this process over, sends the others over UDP (a UDP device), or drops and
/// counts them as undeliverable (an in-process device).
pub(crate) struct Link {
    local: Endpoint,
    udp: Option<HostTransport>,
    /// Whether a UDP device's packets for devices of this process are handed over
    /// (`Device::set_in_process_shortcut`); an in-process device always hands over.
    /// `Relaxed`: a switch read per packet, nothing is published through it (as the
    /// device's own `shortcut`).
    shortcut: AtomicBool,
    /// Packets handed over, and packets for no device of this process (in-process only).
    counters: AtomicCounters,
}

impl Link {
    /// The link of a device at `local`, over `udp` for a UDP device.
    pub(super) fn new(local: Endpoint, udp: Option<HostTransport>) -> Link {
        Link {
            local,
            udp,
            shortcut: AtomicBool::new(true),
            counters: AtomicCounters::default(),
        }
    }

    /// See [`Link::shortcut`](Link).
    pub(super) fn set_shortcut(&self, on: bool) {
        self.shortcut.store(on, Ordering::Relaxed);
    }

    /// The device of this process `ib_packet` for `to` is handed to, if any (not one
    /// whose address other processes share, for another one's QPN).
    fn peer(&self, to: &Endpoint, ib_packet: &[u8]) -> Option<Arc<DeviceInner>> {
        if self.udp.is_some() && !self.shortcut.load(Ordering::Relaxed) {
            return None;
        }
        lock(registry())
            .get(&to.addr())
            .and_then(Weak::upgrade)
            .filter(|peer| peer.owns_packet(ib_packet))
    }
}

impl Transport for Link {
    fn local(&self) -> Endpoint {
        self.local
    }

    fn prepare(&self, to: &Endpoint, src_port: u16, ib_packet: &mut [u8]) -> io::Result<Sent> {
        // A UDP device's packets carry the socket's headers whichever way they go, so a
        // handed-over packet is captured exactly as it would have crossed the socket.
        if let Some(udp) = &self.udp {
            return udp.prepare(to, src_port, ib_packet);
        }
        let (ip, udp) = path_headers(&self.local, to, src_port, 0, HOP_LIMIT, ib_packet.len())?;
        let icrc = icrc::fill(&ip, &udp, ib_packet).map_err(invalid_input)?;
        Ok(Sent {
            from: self.local,
            ip,
            udp,
            icrc,
        })
    }

    fn transmit(&self, to: &Endpoint, sent: &Sent, ib_packet: &[u8]) -> io::Result<()> {
        if let Some(peer) = self.peer(to, ib_packet) {
            self.counters.count_sent(ib_packet.len());
            hand_over(peer, to.addr(), sent, ib_packet.to_vec());
            return Ok(());
        }
        if self.udp.is_none() && to.addr().is_multicast() {
            // An in-process device's multicast: a copy to each device of this process in
            // the group (a UDP device's goes to the socket).
            self.counters.count_sent(ib_packet.len());
            let members = group_members(&lock(registry()), to.addr());
            for member in members {
                hand_over(member, to.addr(), sent, ib_packet.to_vec());
            }
            return Ok(());
        }
        match &self.udp {
            Some(udp) => udp.transmit(to, sent, ib_packet),
            None => {
                self.counters.count_sent(ib_packet.len());
                self.counters.count_drop(DropReason::Undeliverable);
                tracing::debug!(to = %to.addr(), "no device of this process at this address");
                Ok(())
            }
        }
    }

    fn recv(&self, buf: &mut [u8], timeout: Option<Duration>) -> io::Result<Option<Received>> {
        match &self.udp {
            Some(udp) => udp.recv(buf, timeout),
            // Handed-over packets never wait here: they are handed to the device itself.
            None => Ok(None),
        }
    }

    fn recv_batch(
        &self,
        bufs: &mut [&mut [u8]],
        received: &mut Vec<Received>,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        match &self.udp {
            Some(udp) => udp.recv_batch(bufs, received, timeout),
            None => {
                received.clear();
                Ok(0)
            }
        }
    }

    fn wait_readable(&self, timeout: Duration) -> io::Result<()> {
        match &self.udp {
            Some(udp) => udp.wait_readable(timeout),
            None => Ok(()),
        }
    }

    fn in_memory(&self, to: &Endpoint) -> bool {
        self.udp.as_ref().is_some_and(|udp| udp.in_memory(to))
    }

    fn address_share(&self) -> u8 {
        self.udp.as_ref().map_or(0, |udp| udp.address_share())
    }

    fn sharing(&self) -> Option<crate::transport::Sharing> {
        self.udp.as_ref().and_then(|udp| udp.sharing())
    }

    fn listen_service(&self, service_id: u64) -> io::Result<()> {
        self.udp
            .as_ref()
            .map_or(Ok(()), |udp| udp.listen_service(service_id))
    }

    fn unlisten_service(&self, service_id: u64) {
        if let Some(udp) = &self.udp {
            udp.unlisten_service(service_id);
        }
    }

    fn sleeping(&self, before: bool) -> bool {
        self.udp.as_ref().is_some_and(|udp| udp.sleeping(before))
    }

    fn readiness_fd(&self) -> Option<BorrowedFd<'_>> {
        self.udp.as_ref().and_then(|udp| udp.readiness_fd())
    }

    fn pending_packets(&self) -> bool {
        self.udp.as_ref().is_some_and(|udp| udp.pending_packets())
    }

    fn memory_inbox(&self) -> bool {
        self.udp.as_ref().is_some_and(|udp| udp.memory_inbox())
    }

    /// A UDP device's socket joins; an in-process device's groups are the device's own
    /// (devices of this process hand multicast packets to each member).
    fn join_multicast(&self, group: std::net::IpAddr) -> io::Result<()> {
        match &self.udp {
            Some(udp) => udp.join_multicast(group),
            None => Ok(()),
        }
    }

    fn leave_multicast(&self, group: std::net::IpAddr) -> io::Result<()> {
        match &self.udp {
            Some(udp) => udp.leave_multicast(group),
            None => Ok(()),
        }
    }

    /// A UDP device's socket counters; an in-process device's hand-overs.
    fn counters(&self) -> TransportCounters {
        match &self.udp {
            Some(udp) => udp.counters(),
            None => self.counters.snapshot(),
        }
    }
}
