//! The in-process transport: several device endpoints in one process, joined by queues.
//!
//! A [`LoopbackNetwork`] is a switch with one mailbox (a bounded FIFO queue) per attached
//! [`Endpoint`]; [`LoopbackNetwork::attach`] hands out a [`LoopbackTransport`] for an
//! endpoint, which detaches when dropped. Sending appends the packet, with the IP / UDP
//! headers it would carry on the wire, to the destination's mailbox; receiving takes the
//! oldest packet of one's own mailbox. Delivery is in order per (sender, receiver) pair —
//! in fact globally per receiver — and nothing is lost unless the destination is not
//! attached or its mailbox is full ([`LoopbackNetwork::with_capacity`]); those packets are
//! dropped and counted as `dropped_undeliverable`, as a UDP path would lose them.
//!
//! The ICRC is filled on send and verified on receive exactly as on the wire (IPv4 headers
//! as a softverbs UDP sender writes them), so corruption
//! injected by [`FaultTransport`](crate::fault::FaultTransport) is caught the same way, and
//! a [`PcapTransport`](crate::pcap::PcapTransport) capture of loopback traffic decodes like
//! a real one.
//!
//! Cost: no syscall on the send or receive path while the receiver is not blocked (a
//! mutex-protected queue; the condition variable is signalled only when a receiver waits),
//! one allocation per packet.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use softverbs_wire::icrc;

use crate::transport::{
    invalid_input, path_headers, plausible_packet_len, AtomicCounters, DropReason, Endpoint,
    Received, Sent, Transport, TransportCounters, DEFAULT_PORT,
};

/// Mailbox capacity of [`LoopbackNetwork::new`], in packets.
pub const DEFAULT_CAPACITY: usize = 4096;

/// A packet in a mailbox: the bytes as transmitted and the headers they travelled with.
#[derive(Debug)]
struct Frame {
    sent: Sent,
    bytes: Vec<u8>,
}

#[derive(Debug, Default)]
struct Queue {
    frames: VecDeque<Frame>,
    /// Receivers blocked in `recv` (so a sender knows whether to signal).
    waiting: usize,
}

#[derive(Debug, Default)]
struct Mailbox {
    queue: Mutex<Queue>,
    ready: Condvar,
}

impl Mailbox {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[derive(Debug)]
struct Switch {
    mailboxes: Mutex<HashMap<Endpoint, Arc<Mailbox>>>,
    capacity: usize,
}

impl Switch {
    fn mailboxes(&self) -> MutexGuard<'_, HashMap<Endpoint, Arc<Mailbox>>> {
        self.mailboxes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A process-local network of [`LoopbackTransport`]s. Cloning gives another handle to
/// the same network.
#[derive(Debug, Clone)]
pub struct LoopbackNetwork {
    switch: Arc<Switch>,
}

impl Default for LoopbackNetwork {
    fn default() -> LoopbackNetwork {
        LoopbackNetwork::new()
    }
}

impl LoopbackNetwork {
    /// A network whose mailboxes hold [`DEFAULT_CAPACITY`] packets each.
    pub fn new() -> LoopbackNetwork {
        LoopbackNetwork::with_capacity(DEFAULT_CAPACITY)
    }

    /// A network whose mailboxes hold `capacity` packets each (at least 1).
    pub fn with_capacity(capacity: usize) -> LoopbackNetwork {
        LoopbackNetwork {
            switch: Arc::new(Switch {
                mailboxes: Mutex::new(HashMap::new()),
                capacity: capacity.max(1),
            }),
        }
    }

    /// Attaches an endpoint. `AddrInUse` if it is already attached; `InvalidInput` for an
    /// unspecified address.
    pub fn attach(&self, endpoint: Endpoint) -> io::Result<LoopbackTransport> {
        if endpoint.addr().is_unspecified() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a loopback endpoint needs a unicast address",
            ));
        }
        let mailbox = Arc::new(Mailbox::default());
        let mut mailboxes = self.switch.mailboxes();
        if mailboxes.contains_key(&endpoint) {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{endpoint} is already attached"),
            ));
        }
        mailboxes.insert(endpoint, Arc::clone(&mailbox));
        Ok(LoopbackTransport {
            switch: Arc::downgrade(&self.switch),
            local: endpoint,
            mailbox,
            hop_limit: 64,
            counters: AtomicCounters::default(),
        })
    }

    /// Attaches the first free endpoint among `127.0.0.1:4791` … `127.0.0.254:4791`, the
    /// addresses the UDP transport would pick. `AddrInUse` when all are attached.
    pub fn attach_next(&self) -> io::Result<LoopbackTransport> {
        for host in 1..=254u8 {
            let endpoint = Endpoint::rocev2(IpAddr::V4(Ipv4Addr::new(127, 0, 0, host)));
            match self.attach(endpoint) {
                Err(error) if error.kind() == io::ErrorKind::AddrInUse => continue,
                other => return other,
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("every 127.0.0.x:{DEFAULT_PORT} is attached"),
        ))
    }

    /// The attached endpoints, sorted.
    pub fn endpoints(&self) -> Vec<Endpoint> {
        let mut endpoints: Vec<Endpoint> = self.switch.mailboxes().keys().copied().collect();
        endpoints.sort();
        endpoints
    }
}

/// One endpoint of a [`LoopbackNetwork`]. Detaches when dropped.
#[derive(Debug)]
pub struct LoopbackTransport {
    switch: Weak<Switch>,
    local: Endpoint,
    mailbox: Arc<Mailbox>,
    hop_limit: u8,
    counters: AtomicCounters,
}

impl Drop for LoopbackTransport {
    fn drop(&mut self) {
        if let Some(switch) = self.switch.upgrade() {
            let mut mailboxes = switch.mailboxes();
            if mailboxes
                .get(&self.local)
                .is_some_and(|m| Arc::ptr_eq(m, &self.mailbox))
            {
                mailboxes.remove(&self.local);
            }
        }
    }
}

impl LoopbackTransport {
    /// Packets waiting in this endpoint's mailbox.
    pub fn pending(&self) -> usize {
        self.mailbox.lock().frames.len()
    }
}

impl Transport for LoopbackTransport {
    fn local(&self) -> Endpoint {
        self.local
    }

    fn prepare(&self, to: &Endpoint, src_port: u16, ib_packet: &mut [u8]) -> io::Result<Sent> {
        let (ip, udp) = path_headers(
            &self.local,
            to,
            src_port,
            0,
            self.hop_limit,
            ib_packet.len(),
        )?;
        let icrc = icrc::fill(&ip, &udp, ib_packet).map_err(invalid_input)?;
        Ok(Sent {
            from: self.local,
            ip,
            udp,
            icrc,
        })
    }

    fn transmit(&self, to: &Endpoint, sent: &Sent, ib_packet: &[u8]) -> io::Result<()> {
        let mailbox = self.switch.upgrade().and_then(|switch| {
            switch
                .mailboxes()
                .get(to)
                .cloned()
                .map(|m| (m, switch.capacity))
        });
        self.counters.count_sent(ib_packet.len());
        let Some((mailbox, capacity)) = mailbox else {
            self.counters.count_drop(DropReason::Undeliverable);
            return Ok(());
        };
        let mut queue = mailbox.lock();
        if queue.frames.len() >= capacity {
            drop(queue);
            self.counters.count_drop(DropReason::Undeliverable);
            return Ok(());
        }
        queue.frames.push_back(Frame {
            sent: *sent,
            bytes: ib_packet.to_vec(),
        });
        let wake = queue.waiting > 0;
        drop(queue);
        if wake {
            mailbox.ready.notify_one();
        }
        Ok(())
    }

    fn recv(&self, buf: &mut [u8], timeout: Option<Duration>) -> io::Result<Option<Received>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut queue = self.mailbox.lock();
        loop {
            if let Some(frame) = queue.frames.pop_front() {
                drop(queue);
                let Frame { sent, bytes } = frame;
                let len = bytes.len();
                let reason = if len > buf.len() {
                    Some(DropReason::Truncated)
                } else if !plausible_packet_len(len) {
                    Some(DropReason::Malformed)
                } else if icrc::verify(&sent.ip, &sent.udp, &bytes).is_err() {
                    Some(DropReason::BadIcrc)
                } else {
                    None
                };
                if let Some(reason) = reason {
                    self.counters.count_drop(reason);
                    queue = self.mailbox.lock();
                    continue;
                }
                buf[..len].copy_from_slice(&bytes);
                self.counters.count_received(len);
                return Ok(Some(Received {
                    from: Endpoint::new(sent.from.addr(), sent.udp.src_port),
                    to: self.local,
                    len,
                    ip: sent.ip,
                    udp: sent.udp,
                    icrc_checked: true,
                    shared_memory: false,
                }));
            }
            let remaining = match deadline {
                None => None,
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Ok(None);
                    }
                    Some(deadline - now)
                }
            };
            queue.waiting += 1;
            queue = match remaining {
                None => self
                    .mailbox
                    .ready
                    .wait(queue)
                    .unwrap_or_else(|poisoned| poisoned.into_inner()),
                Some(remaining) => {
                    self.mailbox
                        .ready
                        .wait_timeout(queue, remaining)
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .0
                }
            };
            queue.waiting -= 1;
        }
    }

    fn counters(&self) -> TransportCounters {
        self.counters.snapshot()
    }
}
