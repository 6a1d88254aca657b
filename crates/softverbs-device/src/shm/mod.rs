//! The host transport: RoCEv2 over UDP, and shared memory to the devices of other
//! processes of this host.
//!
//! [`HostTransport`] is a [`UdpTransport`] and an inbox (`inbox.rs`): a file in `/dev/shm`,
//! named by the user, the network namespace and the device's address and port, that a
//! device of another process of the same user maps to hand this device its packets, one
//! single-producer ring each (`ring.rs`). A packet for an address that has such an inbox
//! goes into the sender's ring there instead of the socket: no system call while the
//! receiver is polling, no trip through the kernel's UDP stack. Everything else — another
//! host, kernel rxe, a device of another user or namespace, multicast, a device with no
//! ring free — goes over UDP as before. The packets are the same IB transport packets as on
//! the wire, so every rule of the engine (keys, bounds, access, PSNs, path checks,
//! retransmission, RNR, ordering) holds unchanged; a sender that dies leaves a ring nobody
//! writes, a receiver that dies one nobody reads, and the requester's retry budget ends it
//! with `IBV_WC_RETRY_EXC_ERR` as on a wire.
//!
//! The ICRC: a device without capture or fault injection sends its packets to a ring
//! without one (nothing corrupts memory between two processes; the receiver hands them out
//! with [`Received::icrc_checked`] false); through a capture or fault stack, packets are
//! prepared as for the wire, ICRC filled, and the receiver checks it, so injected corruption
//! is caught as on UDP and a capture records the RoCEv2 packets the exchange stands for.
//!
//! One copy each side: the sender's engine leaves the payload of a packet in its registered
//! region (`crate::deferred`) and the record is written from the packet's headers and
//! straight from the region; the receiver hands each record to its engine where it lies
//! ([`Transport::take_in_place`]), which writes the payload into the target region. Records
//! that need a buffer (an ICRC to check, a forwarded datagram) are copied out as before.
//!
//! Sleeping receivers: a thread about to wait counts itself in the inbox's `waiters`; a
//! sender that finds waiters after publishing sends a one-byte datagram to the receiver's
//! doorbell, an abstract Unix socket that polls readable with the UDP socket
//! ([`Transport::readiness_fd`] is an epoll set of both). A polling receiver is never rung.
//!
//! Shared addresses (`members.rs`): devices of several processes may use one address. Each
//! has a slot of the address (and the slot's QPNs) and an inbox named by it; one holds the
//! address's socket and forwards each packet it receives for another member's QPN into that
//! member's inbox (records flagged `FORWARDED`); the others send from an ephemeral port of the
//! address, and one of them takes the socket over when its holder is gone. Senders of this
//! host route by address and slot of the destination QPN, straight to the member's inbox.
//!
//! Inboxes of dead processes (killed, or gone without closing their device) are removed by
//! the next process's first device to make an inbox (`sweep.rs`).
//!
//! `SOFTVERBS_NETWORK=udp` ([`crate::NETWORK_ENV`]) turns the inbox off: every packet goes
//! over UDP, as for tests of the wire.

mod inbox;
mod members;
mod ring;
mod sweep;

use crate::deferred::Deferred;
use crate::transport::{
    path_headers, plausible_packet_len, AtomicCounters, DropReason, Endpoint, Gid, OutgoingPacket,
    Received, Sent, Sharing, Transport, TransportCounters,
};
use crate::udp::{UdpConfig, UdpTransport};
use inbox::{pid_alive, OwnInbox, PeerInbox, Refused, Scope, RINGS};
use members::{ring_slot, Members};
use ring::{Pushed, Ring, CLOSING};
use rustc_hash::FxHashMap;
use rustix::event::epoll;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketAddrUnix, SocketFlags, SocketType};
use softverbs_wire::icrc;
use std::collections::hash_map::Entry;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Record flag: the packet's ICRC is filled for the headers the receiver derives.
const ICRC_FILLED: u16 = 1;

/// Record flag: a packet the holder of the address's socket received from the wire and
/// forwards; the record starts with a [`FORWARD_PREFIX`]-byte prefix: the sender's address
/// (16 bytes, a GID), the IP header's TOS and TTL, its IPv4 ID (big-endian), whether the
/// holder verified the ICRC (1 byte), 3 bytes of padding; the record's source port is the
/// datagram's.
const FORWARDED: u16 = 2;

/// Bytes before the packet in a [`FORWARDED`] record.
const FORWARD_PREFIX: usize = 24;

thread_local! {
    /// [`HostTransport`]'s send: the runs of a batch that go over UDP.
    static WIRE_RUNS: std::cell::RefCell<Vec<std::ops::Range<usize>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// How long a device whose address's socket is taken waits at most for the device that
/// took it to show in the members file (both opened at the same time).
const JOIN_WAIT: Duration = Duration::from_millis(100);

/// How often at most a member that does not hold the address's socket looks whether its
/// holder is still there (to take the socket over when it is not).
const HOLDER_CHECK: Duration = Duration::from_millis(100);

/// How long the holder of the socket hands packets for a ready member whose inbox it
/// could not open to its own engine before it tries again (the slot of a dead member shows
/// ready for an instant after another device claimed it, before its inbox exists).
const FORWARD_RETRY: Duration = Duration::from_millis(100);

/// How long an address found without a usable inbox is sent to over UDP before looking
/// again, in nanoseconds of the coarse clock ([`coarse_now`]), which the routes' upkeep
/// reads.
const RECHECK: u64 = Duration::from_secs(1).as_nanos() as u64;

/// While senders use the inbox, a polling receiver looks at the UDP socket (a system call)
/// only on one receive in this many, unless UDP brought packets recently or the socket
/// polled readable. A receive that finds nothing takes ~150 ns, the system call ~500 ns:
/// one in 16 put a system call into half the round trips of a busy-polling 8-byte
/// ping-pong (~9 empty receives each) and cost it 5 % (2.99 → 2.84 µs here); one in 128
/// looks at the socket every ~20 µs of polling, still nothing beside a datagram's way
/// through the kernel, and at least every [`UDP_AT_LEAST_EVERY`].
const UDP_EVERY: u64 = 128;

/// How long a polling receiver goes at most without looking at the UDP socket while
/// senders use the inbox, however seldom it polls (an application that polls once a
/// millisecond would otherwise look once in [`UDP_EVERY`] ms). Read on the coarse
/// monotonic clock (no TSC read), which moves every few milliseconds.
const UDP_AT_LEAST_EVERY: Duration = Duration::from_millis(1);

/// The coarse monotonic clock, in nanoseconds.
fn coarse_now() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
    (now.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec as u64)
}

/// Receives after a UDP packet during which the socket is looked at every time.
const UDP_RECENT: u64 = 1024;

/// How long a sender waits at most for room in a full ring (the receiver is taking
/// packets out) before it drops the packet: a lossless link with flow control, as RoCE
/// fabrics run with PFC, but never a wait without end (two devices each waiting for the
/// other to take packets would). A drop costs the sender a go-back-N of everything after
/// the packet and half its congestion window, so the wait outlasts the pauses of a
/// receiver whose CPU was taken for a while (a kernel thread, another program, a virtual
/// CPU waking up: a millisecond or more on a busy machine); a receiver that is gone is
/// noticed every [`FULL_CHECK`].
const FULL_WAIT: Duration = Duration::from_millis(5);

/// How often a sender waiting for room looks whether the receiver is still there.
const FULL_CHECK: Duration = Duration::from_micros(500);

/// How long a receiver that took packets from its rings looks at them before it sleeps
/// ([`Shm::spin_for_packets`]).
const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(50);

/// The hop limit the receiver assumes for a packet from a ring (masked out of the ICRC).
const HOP_LIMIT: u8 = 64;

/// RoCEv2 over UDP, with shared memory to devices of other processes of this host (module
/// documentation).
pub struct HostTransport {
    udp: UdpTransport,
    /// The device's endpoint: the UDP socket's, or the shared address's where the socket
    /// is another member's (bound to an ephemeral port, only to send from).
    local: Endpoint,
    shm: Option<Shm>,
}

/// Where packets for one address go.
enum Route {
    /// Over UDP, until then ([`coarse_now`]; then the inbox is looked for again).
    Wire(u64),
    /// Into a ring of the device's inbox.
    Shared(Box<Peer>),
}

/// A device of another process this one sends to through its inbox.
struct Peer {
    inbox: PeerInbox,
    doorbell: SocketAddrUnix,
    /// When the route to it was last checked ([`coarse_now`]).
    checked: u64,
    /// Where the receiver's consumer stood (its `head`) when a wait for room in its full
    /// ring last ran out ([`STALLED`] if none did, or the receiver took packets since).
    stalled_at: AtomicU64,
}

/// [`Peer::stalled_at`] when no wait for room ran out.
const STALLED: u64 = u64::MAX;

/// A member of this address that the holder of its socket forwards packets to.
struct Forward {
    /// The member's process ID when its inbox was opened (another one there: open again).
    pid: u32,
    peer: Option<Peer>,
    /// Without a peer: when to look for its inbox again.
    retry: Instant,
    /// A record being made (prefix and packet).
    record: Vec<u8>,
}

/// This device's slot in its address's members file, freed when dropped.
struct Membership {
    members: Members,
    slot: usize,
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.members.release_services(None);
        self.members.clear_holder();
        self.members.release(self.slot);
    }
}

/// The shared-memory half of a [`HostTransport`].
struct Shm {
    scope: Scope,
    inbox: OwnInbox,
    /// The address's socket, taken over from a holder that went away (a member that did
    /// not bind it at first).
    taken: OnceLock<UdpTransport>,
    /// Whether this member holds the address's socket (bound it at first, or took it
    /// over).
    holds_socket: AtomicBool,
    /// When the holder was last looked at (a member without the socket).
    holder_checked: Mutex<Option<Instant>>,
    /// The members this one forwards packets to, by slot (the holder of the socket).
    forwards: Mutex<FxHashMap<usize, Forward>>,
    /// An abstract datagram socket: receives doorbells, and sends them to peers.
    doorbell: OwnedFd,
    /// The UDP socket and the doorbell, for [`Transport::readiness_fd`].
    epoll: OwnedFd,
    /// By address and slot of the destination QPN; looked up for every packet sent (so
    /// FxHash: the keys are the peers this device sends to, not a peer's choice).
    routes: Mutex<FxHashMap<(Endpoint, usize), Route>>,
    /// When the routes were last looked over ([`coarse_now`], [`Shm::forget_gone`]).
    routes_looked_at: AtomicU64,
    /// The consumer's state (one receiving thread at a time).
    consumer: Mutex<Consumer>,
    /// Set by a wait that saw the UDP socket readable: the next receive looks at it.
    udp_ready: AtomicBool,
    /// Set once the device takes packets in place ([`Shm::take_in_place`]): from then on
    /// [`Shm::take`] copies out only the records that cannot be taken so (a packet that
    /// arrives between the two is left for the next in-place take, not copied).
    in_place: AtomicBool,
    /// [`TransportCounters::shm_direct_bytes`] and
    /// [`TransportCounters::shm_in_place_packets`] (the latter written under the consumer
    /// lock only, as the received counts of `counters`: no locked add).
    direct_bytes: AtomicU64,
    in_place_packets: AtomicU64,
    /// [`TransportCounters::shm_stalls`].
    stalls: AtomicU64,
    /// The packets received from the rings when the receiver last waited
    /// ([`Shm::spin_for_packets`]).
    received_at_wait: AtomicU64,
    /// Receives so far, and the receive until which UDP is looked at every time.
    receives: AtomicU64,
    udp_until: AtomicU64,
    /// When a receive last looked at the UDP socket ([`coarse_now`]).
    udp_looked_at: AtomicU64,
    /// What went through the rings: the received counts written under the consumer lock
    /// only, the sent ones under the routes lock only (no locked add for either).
    counters: AtomicCounters,
    /// What the holder of the address's socket forwarded into members' rings (under the
    /// forwards lock), sent packets and bytes beside `counters`' own.
    forwarded: AtomicCounters,
    /// Fill the ICRC of packets that came without one (for a capture above).
    complete_icrc: bool,
    /// Last: the slot is freed after the inbox is gone.
    membership: Membership,
}

#[derive(Default)]
struct Consumer {
    /// The ring to start at next time (so no sender starves the others).
    next: usize,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shm {
    /// Joins the address `local` (a slot in its members file, an inbox and a doorbell
    /// named by the slot); `holds_socket` if this device bound the address's socket.
    fn open(
        local: Endpoint,
        scope: Scope,
        members: Members,
        holds_socket: bool,
        udp_fd: BorrowedFd<'_>,
    ) -> io::Result<Shm> {
        let (members, slot) = Members::join(Some(members), &scope.members_path(&local))?;
        let membership = Membership { members, slot };
        let doorbell = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::DGRAM,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )?;
        // Binding the name first: a second device in this slot (impossible while the slot
        // is held, but cheap to refuse) cannot take the inbox over.
        let name = SocketAddrUnix::new_abstract_name(scope.doorbell_name(&local, slot).as_bytes())?;
        rustix::net::bind(&doorbell, &name)?;
        let inbox = OwnInbox::create(&scope.path(&local, slot))?;
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        for (fd, data) in [(udp_fd, 0u64), (doorbell.as_fd(), 1)] {
            epoll::add(
                &epoll,
                fd,
                epoll::EventData::new_u64(data),
                epoll::EventFlags::IN,
            )?;
        }
        membership.members.set_ready(slot);
        if holds_socket {
            membership.members.set_holder();
        }
        Ok(Shm {
            scope,
            inbox,
            taken: OnceLock::new(),
            holds_socket: AtomicBool::new(holds_socket),
            holder_checked: Mutex::new(None),
            forwards: Mutex::new(FxHashMap::default()),
            doorbell,
            epoll,
            routes: Mutex::new(FxHashMap::default()),
            routes_looked_at: AtomicU64::new(0),
            consumer: Mutex::new(Consumer::default()),
            udp_ready: AtomicBool::new(false),
            in_place: AtomicBool::new(false),
            direct_bytes: AtomicU64::new(0),
            in_place_packets: AtomicU64::new(0),
            stalls: AtomicU64::new(0),
            received_at_wait: AtomicU64::new(0),
            receives: AtomicU64::new(0),
            udp_until: AtomicU64::new(0),
            udp_looked_at: AtomicU64::new(0),
            counters: AtomicCounters::default(),
            forwarded: AtomicCounters::default(),
            complete_icrc: false,
            membership,
        })
    }

    /// This device's QPNs.
    fn qpn_range(&self) -> softverbs_proto::QpnRange {
        Members::qpn_range(self.membership.slot)
    }

    /// The route to `to`, looking for its inbox if it is time to. `now` is read at most
    /// once per batch, on the coarse clock ([`coarse_now`]): the looks are a second apart,
    /// and a read of the precise one costs ~40 ns here, on every batch sent.
    fn route<'a>(
        &self,
        routes: &'a mut FxHashMap<(Endpoint, usize), Route>,
        to: &Endpoint,
        slot: Option<usize>,
        from: Gid,
        now: &mut Option<u64>,
    ) -> Option<&'a Peer> {
        if to.addr().is_multicast() {
            return None;
        }
        let slot = slot?;
        let time = |now: &mut Option<u64>| *now.get_or_insert_with(coarse_now);
        // One look-up of the table (the hot path: a route that stands).
        let route = match routes.entry((*to, slot)) {
            Entry::Occupied(entry) => {
                let route = entry.into_mut();
                let look = match route {
                    // Once every RECHECK: is the member there still the one this route
                    // reaches? (A device that died leaves its slot to the next one, with a
                    // new inbox.)
                    Route::Shared(peer) => {
                        let at = time(now);
                        if at >= peer.checked.saturating_add(RECHECK) {
                            peer.checked = at;
                            !peer.inbox.still_there()
                        } else {
                            false
                        }
                    }
                    Route::Wire(until) => time(now) >= *until,
                };
                if look {
                    *route = self.open_route(to, slot, from, time(now));
                }
                route
            }
            Entry::Vacant(entry) => entry.insert(self.open_route(to, slot, from, time(now))),
        };
        match route {
            Route::Shared(peer) => Some(peer),
            Route::Wire(_) => None,
        }
    }

    /// A route to member `slot` of `to` as found now: into its inbox if it has one this
    /// device may use, else over UDP until [`RECHECK`] from `now`.
    fn open_route(&self, to: &Endpoint, slot: usize, from: Gid, now: u64) -> Route {
        match PeerInbox::open(&self.scope.path(to, slot), from.octets()) {
            Ok(inbox) => {
                match SocketAddrUnix::new_abstract_name(
                    self.scope.doorbell_name(to, slot).as_bytes(),
                ) {
                    Ok(doorbell) => {
                        tracing::debug!(to = %to, slot, "sending through shared memory");
                        Route::Shared(Box::new(Peer {
                            inbox,
                            doorbell,
                            checked: now,
                            stalled_at: AtomicU64::new(STALLED),
                        }))
                    }
                    Err(_) => Route::Wire(now.saturating_add(RECHECK)),
                }
            }
            Err(refused) => {
                if let Refused::Unusable(why) = refused {
                    tracing::debug!(to = %to, why, "a device of this host, over UDP");
                }
                Route::Wire(now.saturating_add(RECHECK))
            }
        }
    }

    /// At most once every [`RECHECK`] (`now`: [`coarse_now`]): drops the routes to devices
    /// that are gone (closed, dead, or replaced at their address) and those over UDP that
    /// are due to be looked at again, and likewise what the holder of a shared address's
    /// socket keeps to forward to members that are gone. A route (or a forward) is
    /// otherwise looked at only when a packet goes its way, and a device that no longer
    /// sends to a peer that left (a server whose client exited) kept its mapping of the
    /// peer's inbox, and with it the inbox's pages and the ring it had claimed there:
    /// 4 MiB of `/dev/shm` per departed peer, until `/dev/shm` had no room for anyone's
    /// ring.
    fn forget_gone(&self, now: u64) {
        let last = self.routes_looked_at.load(Ordering::Relaxed);
        if now < last.saturating_add(RECHECK)
            || self
                .routes_looked_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let at = Instant::now();
        // Never in a sender's way: the next look is soon enough.
        if let Ok(mut routes) = self.routes.try_lock() {
            routes.retain(|(to, slot), route| match route {
                Route::Shared(peer) => {
                    let there = peer.inbox.still_there();
                    if !there {
                        tracing::debug!(to = %to, slot, "the device there is gone: its ring let go");
                    }
                    there
                }
                Route::Wire(until) => now < *until,
            });
        }
        if let Ok(mut forwards) = self.forwards.try_lock() {
            forwards.retain(|slot, forward| match &forward.peer {
                Some(peer) => {
                    let there = peer.inbox.still_there();
                    if !there {
                        tracing::debug!(slot, "the member there is gone: its ring let go");
                    }
                    there
                }
                // Kept while it stands for a wait before the next look for its inbox.
                None => at < forward.retry,
            });
        }
    }

    /// Rings `peer`'s doorbell if a thread of it waits (after its ring was published).
    fn ring_doorbell(&self, peer: &Peer) {
        // Pairs with the waiter's SeqCst increment of `waiters` and its look at the rings
        // after it: either it sees the records, or this sees it waiting.
        fence(Ordering::SeqCst);
        let header = peer.inbox.mapping.header();
        if header.waiters.load(Ordering::SeqCst) > 0 && header.rung.swap(1, Ordering::AcqRel) == 0 {
            let _ = rustix::net::sendto(&self.doorbell, &[1], SendFlags::DONTWAIT, &peer.doorbell);
        }
    }

    /// Pushes a packet into `peer`'s ring, its payload left for later (`pieces`, offsets
    /// counted from `base` before `bytes`) read straight from its region into the record;
    /// if the ring is full, publishes what was pushed, wakes the receiver and waits for
    /// room, up to [`FULL_WAIT`] (less if the receiver is gone). [`Pushed::Full`] if there
    /// was none, [`Pushed::Refused`] if a piece's region faulted (the packet is lost).
    ///
    /// A receiver that took nothing out of the ring since a wait for room last ran out is
    /// stalled (stopped, in a debugger, off its CPU): the packet is dropped at once, not
    /// after another wait. The packets after a dropped one would be discarded by the
    /// receiver anyway (IBTA vol. 1 §9.7.5.1.1: a responder drops the packets after a
    /// missing PSN), and a sender that waited [`FULL_WAIT`] for each of them would hold
    /// its application's post or poll for that long times the packets of its window —
    /// seconds, during which its retransmission timer could not run, so a peer that hung
    /// failed the QP (`RETRY_EXC_ERR`) only long after its retry budget, not within it as
    /// over UDP.
    fn push(
        &self,
        peer: &Peer,
        producer: &mut ring::Producer<'_>,
        src_port: u16,
        flags: u16,
        (bytes, base, pieces): (&[u8], usize, &[Deferred]),
    ) -> Pushed {
        let write = |record: &mut [u8]| crate::deferred::write_packet(bytes, base, pieces, record);
        let pushed = producer.push_with(src_port, flags, bytes.len(), write);
        if pushed != Pushed::Full {
            return pushed;
        }
        let ring = peer.inbox.ring();
        if !ring.fits(bytes.len()) {
            return Pushed::Full;
        }
        if producer.publish() > 0 {
            self.ring_doorbell(peer);
        }
        let consumed = || ring.header().head.load(Ordering::Acquire);
        if peer.stalled_at.load(Ordering::Relaxed) == consumed() {
            return Pushed::Full;
        }
        let start = Instant::now();
        let mut check = start + FULL_CHECK;
        loop {
            std::thread::yield_now();
            let pushed = producer.push_with(src_port, flags, bytes.len(), write);
            if pushed != Pushed::Full {
                peer.stalled_at.store(STALLED, Ordering::Relaxed);
                return pushed;
            }
            let now = Instant::now();
            if now >= check {
                if !peer.inbox.still_there() {
                    return pushed;
                }
                if now >= start + FULL_WAIT {
                    crate::transport::bump(&self.stalls);
                    peer.stalled_at.store(consumed(), Ordering::Relaxed);
                    return pushed;
                }
                check = now + FULL_CHECK;
            }
        }
    }

    /// What to do after a ring refused a packet: drop the route if the peer is gone.
    fn full(&self, routes: &mut FxHashMap<(Endpoint, usize), Route>, key: (Endpoint, usize)) {
        crate::transport::bump(&self.counters.dropped_undeliverable);
        if let Some(Route::Shared(peer)) = routes.get(&key) {
            if !peer.inbox.still_there() {
                tracing::debug!(to = %key.0, slot = key.1, "the device there is gone: back to UDP");
                routes.insert(key, Route::Wire(coarse_now().saturating_add(RECHECK)));
            }
        }
    }

    /// True if a ring of `active` holds a record or is closing (to be freed).
    fn any_ring_to_visit(&self, mut active: u64) -> bool {
        while active != 0 {
            let index = active.trailing_zeros() as usize;
            active &= active - 1;
            let ring = self.inbox.mapping.ring(index);
            if !ring.is_empty() || ring.header().state.load(Ordering::Acquire) == CLOSING {
                return true;
            }
        }
        false
    }

    /// True if a ring of the inbox holds a packet.
    fn has_packets(&self) -> bool {
        let mut active = self.inbox.mapping.header().active_rings();
        while active != 0 {
            let index = active.trailing_zeros() as usize;
            active &= active - 1;
            if !self.inbox.mapping.ring(index).is_empty() {
                return true;
            }
        }
        false
    }

    /// Looks at the rings for up to [`SPIN_BEFORE_SLEEP`] (less if `timeout` is shorter)
    /// if packets came through them since the receiver last looked here, before it sleeps:
    /// true if one came. While a sender streams, the receiver catches up with it now and
    /// then; asleep, it would wake up only when its CPU does, which a CPU that went idle
    /// (a virtual one most of all) can take longer to do than the sender takes to fill the
    /// ring — and a sender that waits [`FULL_WAIT`] for room in vain drops the packet,
    /// which costs a go-back-N of everything after it.
    fn spin_for_packets(&self, timeout: Option<Duration>) -> bool {
        let received = self.counters.received_packets.load(Ordering::Relaxed);
        if self.received_at_wait.swap(received, Ordering::Relaxed) == received {
            return false;
        }
        let spin = timeout.map_or(SPIN_BEFORE_SLEEP, |t| t.min(SPIN_BEFORE_SLEEP));
        let start = Instant::now();
        loop {
            for _ in 0..32 {
                std::hint::spin_loop();
            }
            if self.has_packets() {
                return true;
            }
            if start.elapsed() >= spin {
                return false;
            }
        }
    }

    /// Drains the doorbell if a sender rang it (`rung`) or the caller saw it readable, and
    /// only then lets senders ring it again. The other way round — `rung` cleared, then the
    /// socket drained — a sender ringing in between has its datagram drained with the old
    /// one while `rung` stays set: every later sender sees it set and sends nothing, and
    /// the receiver sleeps through their packets until its timeout (5 ms per sleep of a
    /// progress thread). A sender that finds `rung` still set during the drain sends
    /// nothing either, but its packet is already in a ring, which the receiver looks at
    /// after counting itself a waiter before it sleeps again. A datagram that lands after
    /// `rung` is cleared (its sender set `rung` before the drain and sent after it) makes
    /// the next sleep return at once, readable: drained then.
    fn clear_doorbell(&self, readable: bool) {
        let header = self.inbox.mapping.header();
        if readable || header.rung.load(Ordering::Relaxed) != 0 {
            let mut byte = [0u8; 8];
            while rustix::net::recv(&self.doorbell, &mut byte, RecvFlags::DONTWAIT).is_ok() {}
            header.rung.store(0, Ordering::SeqCst);
        }
    }

    /// Visits the active rings that hold records once each, starting after the ring the
    /// last visit stopped at (so no sender starves the others): `consume` takes records of
    /// a ring (from its sender's address) and says whether the caller is full, which stops
    /// the visit there. A ring found inconsistent is emptied, a closed one that is empty
    /// freed. Nothing is visited while another thread consumes.
    ///
    /// A busy-polling application looks here on every empty poll, twice (in place, then
    /// for what needs a buffer): an empty ring costs two loads of its header and no more,
    /// and the rings nobody holds are not looked at.
    fn visit_rings(
        &self,
        mut consume: impl FnMut(&Ring, IpAddr) -> (Result<usize, ring::Broken>, bool),
    ) {
        let active = self.inbox.mapping.header().active_rings();
        // Nothing to take or free: no lock taken (a locked instruction each way).
        if !self.any_ring_to_visit(active) {
            return;
        }
        let Ok(mut consumer) = self.consumer.try_lock() else {
            return;
        };
        // The active rings from `next` on, then those before it.
        let from_next = active & !((1u64 << consumer.next) - 1);
        for mut bits in [from_next, active & !from_next] {
            while bits != 0 {
                let index = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let ring = self.inbox.mapping.ring(index);
                if ring.is_empty() {
                    if ring.header().state.load(Ordering::Acquire) == CLOSING {
                        self.inbox.free_closed(1 << index);
                    }
                    continue;
                }
                let (taken, full) = consume(&ring, ring_sender(&ring));
                if taken.is_err() {
                    self.broken(&ring, index);
                }
                if ring.header().state.load(Ordering::Acquire) == CLOSING {
                    self.inbox.free_closed(1 << index);
                }
                if full {
                    consumer.next = (index + 1) % RINGS;
                    return;
                }
            }
        }
    }

    /// Takes packets out of the rings into `bufs` (from the front), appending one
    /// [`Received`] each; returns how many. Once the device takes packets in place, only
    /// the records that cannot be taken so.
    fn take(&self, local: Endpoint, bufs: &mut [&mut [u8]], received: &mut Vec<Received>) -> usize {
        if bufs.is_empty() {
            return 0;
        }
        let mut filled = 0;
        let in_place = self.in_place.load(Ordering::Relaxed);
        self.visit_rings(|ring, from| {
            let taken = ring.consume(|record, bytes| {
                if in_place && record.flags == 0 {
                    return false;
                }
                let Some(buf) = bufs.get_mut(filled) else {
                    return false;
                };
                if let Some(packet) = self.accept(local, from, record, bytes, buf) {
                    received.push(packet);
                    filled += 1;
                }
                true
            });
            (taken, filled == bufs.len())
        });
        filled
    }

    /// Hands up to `max` packets of the rings to `handle` where they lie (no copy), up to
    /// the first of a ring that needs a buffer (forwarded, or with an ICRC to check: left
    /// for [`Shm::take`]); returns how many. The bytes are the producer's memory: each
    /// header field is read once (`softverbs_proto`'s parse reads them into values), and
    /// the payload is moved only by guarded copies, so a producer writing into a record
    /// it published changes values the engine reads, never what it checked against what it
    /// uses.
    fn take_in_place(
        &self,
        local: Endpoint,
        max: usize,
        handle: &mut dyn FnMut(&Received, &[u8]),
    ) -> usize {
        if max == 0 || self.complete_icrc {
            return 0;
        }
        if !self.in_place.load(Ordering::Relaxed) {
            self.in_place.store(true, Ordering::Relaxed);
        }
        let mut handed = 0;
        self.visit_rings(|ring, from| {
            let before = handed;
            let taken = ring.consume(|record, bytes| {
                if handed == max || record.flags != 0 {
                    return false;
                }
                if let Some(packet) = self.check(local, from, record, bytes) {
                    handle(&packet, bytes);
                    handed += 1;
                }
                true
            });
            // Under the consumer lock, as every count of what the rings gave.
            crate::transport::add_exclusive(&self.in_place_packets, handed - before);
            (taken, handed == max)
        });
        handed
    }

    /// Drops what is left in a ring found inconsistent (counted); the sender's next
    /// records start clean.
    fn broken(&self, ring: &Ring, index: usize) {
        tracing::warn!(
            ring = index,
            "a shared-memory ring is inconsistent: dropped"
        );
        crate::transport::bump(&self.counters.dropped_malformed);
        let header = ring.header();
        header
            .head
            .store(header.tail.load(Ordering::Acquire), Ordering::Release);
    }

    /// Checks a packet from a ring sent without an ICRC: its length, and the headers the
    /// receiver derives for it; `None` (counted) if dropped.
    fn check(
        &self,
        local: Endpoint,
        from: IpAddr,
        record: ring::Record,
        bytes: &[u8],
    ) -> Option<Received> {
        if !plausible_packet_len(bytes.len()) {
            self.counters.count_drop(DropReason::Malformed);
            return None;
        }
        let packet = self.derive(local, from, record, bytes.len())?;
        self.counters.count_received_exclusive(bytes.len());
        Some(packet)
    }

    /// The headers the receiver derives for a packet of `len` bytes from a ring, as a
    /// [`Received`] whose ICRC is not checked; `None` (counted as malformed) if a packet
    /// that long cannot have them.
    fn derive(
        &self,
        local: Endpoint,
        from: IpAddr,
        record: ring::Record,
        len: usize,
    ) -> Option<Received> {
        let from = Endpoint::new(from, record.src_port);
        let (ip, udp) = path_headers(&from, &local, record.src_port, 0, HOP_LIMIT, len)
            .map_err(|_| self.counters.count_drop(DropReason::Malformed))
            .ok()?;
        Some(Received {
            from,
            to: local,
            len,
            ip,
            udp,
            icrc_checked: false,
            shared_memory: true,
        })
    }

    /// Checks a packet from a ring and copies it into `buf`; `None` (counted) if dropped.
    fn accept(
        &self,
        local: Endpoint,
        from: IpAddr,
        record: ring::Record,
        bytes: &[u8],
        buf: &mut [u8],
    ) -> Option<Received> {
        if record.flags & FORWARDED != 0 {
            return self.accept_forwarded(local, record, bytes, buf);
        }
        if !plausible_packet_len(bytes.len()) {
            self.counters.count_drop(DropReason::Malformed);
            return None;
        }
        let Some(slot) = buf.get_mut(..bytes.len()) else {
            self.counters.count_drop(DropReason::Truncated);
            return None;
        };
        let mut packet = self.derive(local, from, record, bytes.len())?;
        packet.icrc_checked = record.flags & ICRC_FILLED != 0;
        if packet.icrc_checked && icrc::verify(&packet.ip, &packet.udp, bytes).is_err() {
            self.counters.count_drop(DropReason::BadIcrc);
            return None;
        }
        slot.copy_from_slice(bytes);
        if !packet.icrc_checked && self.complete_icrc {
            // Shorter than an ICRC: refused as malformed above.
            let _ = icrc::fill(&packet.ip, &packet.udp, slot);
        }
        self.counters.count_received_exclusive(bytes.len());
        Some(packet)
    }
}

impl Shm {
    /// Checks a packet the holder of the socket forwarded (a [`FORWARDED`] record) and
    /// copies it into `buf`: the datagram as the holder received it.
    fn accept_forwarded(
        &self,
        local: Endpoint,
        record: ring::Record,
        bytes: &[u8],
        buf: &mut [u8],
    ) -> Option<Received> {
        let (Some(prefix), Some(packet)) =
            (bytes.get(..FORWARD_PREFIX), bytes.get(FORWARD_PREFIX..))
        else {
            self.counters.count_drop(DropReason::Malformed);
            return None;
        };
        if !plausible_packet_len(packet.len()) {
            self.counters.count_drop(DropReason::Malformed);
            return None;
        }
        let Some(slot) = buf.get_mut(..packet.len()) else {
            self.counters.count_drop(DropReason::Truncated);
            return None;
        };
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&prefix[..16]);
        let from = Endpoint::new(Gid(gid).ip(), record.src_port);
        let (mut ip, udp) = path_headers(
            &from,
            &local,
            record.src_port,
            prefix[16],
            prefix[17],
            packet.len(),
        )
        .map_err(|_| self.counters.count_drop(DropReason::Malformed))
        .ok()?;
        if let softverbs_wire::icrc::IpHeaderInfo::V4 { id, .. } = &mut ip {
            *id = u16::from_be_bytes([prefix[18], prefix[19]]);
        }
        slot.copy_from_slice(packet);
        self.counters.count_received_exclusive(packet.len());
        Some(Received {
            from,
            to: local,
            len: packet.len(),
            ip,
            udp,
            icrc_checked: prefix[20] != 0,
            shared_memory: false,
        })
    }

    /// The holder of the socket: hands every packet of `received` (in `bufs`) whose
    /// destination QPN is another ready member's to that member's inbox, and keeps the
    /// others (moved to the front). Returns how many it kept. Packets in a row for one
    /// member go into its ring together, published at once: a member takes the packets
    /// of one datagram (a reply and the ACK behind it, [`Transport::acks_may_follow`]) in
    /// one run, as the holder would have.
    fn forward(&self, bufs: &mut [&mut [u8]], received: &mut Vec<Received>) -> usize {
        let own = self.membership.slot;
        let target = |index: usize, bufs: &[&mut [u8]], received: &[Received]| {
            let bytes = bufs[index].get(..received[index].len).unwrap_or(&[]);
            let slot = self.membership.members.packet_slot(bytes);
            slot.filter(|&slot| slot != own)
        };
        let mut kept = 0;
        let mut index = 0;
        // Each packet's target is looked at once: the one that ends a run starts the next.
        let mut next = (!received.is_empty()).then(|| target(0, bufs, received));
        while let Some(this) = next {
            let mut end = index + 1;
            next = None;
            while end < received.len() {
                let after = target(end, bufs, received);
                if after != this {
                    next = Some(after);
                    break;
                }
                end += 1;
            }
            if let Some(slot) = this {
                let mut run = received[index..end]
                    .iter()
                    .zip(&bufs[index..end])
                    .map(|(packet, buf)| (packet, buf.get(..packet.len).unwrap_or(&[])));
                index += self.forward_run(slot, &mut run);
            }
            // What was not forwarded is this device's to handle.
            for at in index..end {
                let packet = received[at];
                if kept != at {
                    let (front, back) = bufs.split_at_mut(at);
                    let Some(slot) = front[kept].get_mut(..packet.len) else {
                        // Buffers of different sizes, a shorter one in front: as if truncated.
                        self.counters.count_drop(DropReason::Truncated);
                        continue;
                    };
                    slot.copy_from_slice(&back[0][..packet.len]);
                    received[kept] = packet;
                }
                kept += 1;
            }
            index = end;
        }
        received.truncate(kept);
        kept
    }

    /// Pushes `packets` into the inbox of the member in `slot`, in order, and publishes
    /// them at once (a full ring may publish those before it). Returns how many it took:
    /// none if no member is there (the packets are this device's to handle: its engine
    /// counts them as for an unknown QP), fewer than all if the member went away on the
    /// way. A packet its ring had no room for is counted as undeliverable.
    fn forward_run<'a>(
        &self,
        slot: usize,
        packets: &mut dyn Iterator<Item = (&'a Received, &'a [u8])>,
    ) -> usize {
        let Some(pid) = self.membership.members.ready_member(slot) else {
            return 0;
        };
        let mut forwards = lock(&self.forwards);
        let stale = match forwards.get(&slot) {
            Some(forward) if forward.pid == pid => {
                forward.peer.is_none() && Instant::now() >= forward.retry
            }
            _ => true,
        };
        if stale {
            let mut packets = packets.peekable();
            let Some((first, _)) = packets.peek() else {
                return 0;
            };
            let local = first.to;
            let peer = PeerInbox::open(&self.scope.path(&local, slot), local.gid().octets())
                .ok()
                .and_then(|inbox| {
                    let name = self.scope.doorbell_name(&local, slot);
                    let doorbell = SocketAddrUnix::new_abstract_name(name.as_bytes()).ok()?;
                    tracing::debug!(slot, pid, "forwarding to a member of this address");
                    Some(Peer {
                        inbox,
                        doorbell,
                        checked: coarse_now(),
                        stalled_at: AtomicU64::new(STALLED),
                    })
                });
            forwards.insert(
                slot,
                Forward {
                    pid,
                    peer,
                    retry: Instant::now() + FORWARD_RETRY,
                    record: Vec::new(),
                },
            );
            return self.push_run(&mut forwards, slot, &mut packets);
        }
        self.push_run(&mut forwards, slot, packets)
    }

    /// [`Shm::forward_run`] once the member's forward is set up.
    fn push_run<'a>(
        &self,
        forwards: &mut FxHashMap<usize, Forward>,
        slot: usize,
        packets: &mut dyn Iterator<Item = (&'a Received, &'a [u8])>,
    ) -> usize {
        let Some(forward) = forwards.get_mut(&slot) else {
            return 0;
        };
        let Forward {
            peer,
            record,
            retry,
            ..
        } = forward;
        let Some(target) = peer.as_ref() else {
            return 0;
        };
        let ring = target.inbox.ring();
        let mut producer = ring.producer_within(target.inbox.usable());
        let (mut taken, mut pushed, mut gone) = (0, 0, false);
        for (packet, bytes) in packets {
            record.clear();
            record.extend_from_slice(&packet.from.gid().octets());
            let (tos, ttl, id) = match packet.ip {
                softverbs_wire::icrc::IpHeaderInfo::V4 { tos, ttl, id, .. } => (tos, ttl, id),
                softverbs_wire::icrc::IpHeaderInfo::V6 {
                    traffic_class,
                    hop_limit,
                    ..
                } => (traffic_class, hop_limit, 0),
            };
            record.extend_from_slice(&[tos, ttl]);
            record.extend_from_slice(&id.to_be_bytes());
            record.extend_from_slice(&[u8::from(packet.icrc_checked), 0, 0, 0]);
            record.extend_from_slice(bytes);
            let contents = (&record[..], 0, &[][..]);
            taken += 1;
            if self.push(
                target,
                &mut producer,
                packet.from.port(),
                FORWARDED,
                contents,
            ) == Pushed::Yes
            {
                self.forwarded.count_sent(bytes.len());
                pushed += 1;
            } else {
                crate::transport::bump(&self.counters.dropped_undeliverable);
                if !target.inbox.still_there() {
                    tracing::debug!(slot, "the member there is gone");
                    gone = true;
                    break;
                }
            }
        }
        if producer.publish() > 0 || pushed > 0 {
            self.ring_doorbell(target);
        }
        if gone {
            *peer = None;
            *retry = Instant::now() + FORWARD_RETRY;
        }
        taken
    }
}

/// The address of the device producing into `ring`.
fn ring_sender(ring: &Ring) -> IpAddr {
    let mut octets = [0u8; 16];
    for (chunk, word) in octets.chunks_exact_mut(4).zip(ring.header().from.iter()) {
        chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
    }
    Gid(octets).ip()
}

impl HostTransport {
    /// `udp`, and an inbox for devices of other processes of this host if `shared_memory`
    /// (where the inbox cannot be made, e.g. without `/dev/shm`, the transport is UDP only,
    /// and says so in the log).
    pub fn new(udp: UdpTransport, shared_memory: bool) -> HostTransport {
        let local = udp.local();
        let shm = if shared_memory {
            let opened = Scope::current()
                .ok_or_else(|| io::Error::new(io::ErrorKind::Unsupported, "no /proc/self/ns/net"))
                .and_then(|scope| {
                    // What devices of dead processes left goes first (and frees room for
                    // this inbox), before the address's members file is opened: a sweep
                    // removes one nobody is in yet.
                    sweep::once(&scope);
                    let members = Members::open(&scope.members_path(&local))?;
                    Shm::open(local, scope, members, true, udp.wait_fd())
                });
            match opened {
                Ok(shm) => Some(shm),
                Err(error) => {
                    tracing::info!(%error, "no shared-memory inbox: RoCEv2 over UDP only");
                    None
                }
            }
        } else {
            None
        };
        HostTransport { udp, local, shm }
    }

    /// Opens the transport `config` describes: [`UdpTransport::bind`], and with
    /// `shared_memory` an inbox ([`HostTransport::new`]). Where the address's socket is
    /// taken by a device of another process of this user and network namespace (a live
    /// member of the address), this device joins the address instead: it takes a slot
    /// (and the slot's QPNs, [`HostTransport::qpn_range`]), sends from an ephemeral port
    /// of the address, and receives what the socket's holder forwards; it takes the socket
    /// over if the holder goes away. Otherwise the errors of [`UdpTransport::bind`].
    pub fn open(config: UdpConfig, shared_memory: bool) -> io::Result<HostTransport> {
        let error = match UdpTransport::bind(config.clone()) {
            Ok(udp) => return Ok(HostTransport::new(udp, shared_memory)),
            Err(error) => error,
        };
        let Some(address) = config.address.filter(|_| shared_memory) else {
            return Err(error);
        };
        if error.kind() != io::ErrorKind::AddrInUse {
            return Err(error);
        }
        let local = Endpoint::new(address, config.port);
        let Some(scope) = Scope::current() else {
            return Err(error);
        };
        sweep::once(&scope);
        let path = scope.members_path(&local);
        let Ok(mut members) = Members::open(&path) else {
            return Err(error);
        };
        // Another program, a device without shared memory, or a device of this process
        // (devices of one process keep one address each): the address is taken. A device
        // that bound the socket an instant ago may not have claimed its slot yet: looked
        // at a few times, for at most JOIN_WAIT.
        let deadline = Instant::now() + JOIN_WAIT;
        loop {
            match members.live_members() {
                (true, false) => break,
                (_, true) => return Err(error),
                (false, false) if Instant::now() >= deadline => return Err(error),
                (false, false) => std::thread::sleep(JOIN_WAIT / 10),
            }
            // A sweep may have removed the file opened (no member was in it yet): the
            // members are in the one at the path.
            if !members.is_at(&path) {
                match Members::open(&path) {
                    Ok(fresh) => members = fresh,
                    Err(_) => return Err(error),
                }
            }
        }
        let udp = UdpTransport::bind(UdpConfig {
            port: 0,
            ..config.clone()
        })?;
        let shm = Shm::open(local, scope, members, false, udp.wait_fd())?;
        tracing::info!(
            %local,
            slot = shm.membership.slot,
            sends_from = %udp.local(),
            "sharing the address with devices of other processes"
        );
        Ok(HostTransport {
            udp,
            local,
            shm: Some(shm),
        })
    }

    /// The QP numbers this device's engine may hand out: its slot's share of the address
    /// (`None`: all of them, no inbox).
    pub fn qpn_range(&self) -> Option<softverbs_proto::QpnRange> {
        self.shm.as_ref().map(Shm::qpn_range)
    }

    /// A member without the address's socket: if the holder is gone, binds the socket and
    /// forwards from then on. Looks at most every [`HOLDER_CHECK`].
    fn check_holder(&self, shm: &Shm) {
        if shm.holds_socket.load(Ordering::Relaxed) {
            return;
        }
        let now = Instant::now();
        {
            let mut checked = lock(&shm.holder_checked);
            if checked.is_some_and(|at| now < at + HOLDER_CHECK) {
                return;
            }
            *checked = Some(now);
        }
        let holder = shm.membership.members.holder();
        if holder != 0 && pid_alive(holder) {
            return;
        }
        let config = UdpConfig {
            port: self.local.port(),
            ..self.udp.config().clone()
        };
        match UdpTransport::bind(config) {
            Ok(udp) => {
                if let Err(error) = epoll::add(
                    &shm.epoll,
                    udp.wait_fd(),
                    epoll::EventData::new_u64(2),
                    epoll::EventFlags::IN,
                ) {
                    tracing::warn!(%error, "cannot wait on the address's socket");
                    return;
                }
                if shm.taken.set(udp).is_ok() {
                    shm.membership.members.set_holder();
                    shm.holds_socket.store(true, Ordering::Relaxed);
                    tracing::info!(local = %self.local, "took the address's socket over");
                }
            }
            Err(error) => tracing::debug!(%error, "the address's socket is not free yet"),
        }
    }

    /// Whether a socket holds packets of a coalesced datagram.
    fn sockets_hold_packets(&self, shm: &Shm) -> bool {
        self.udp.holds_packets() || shm.taken.get().is_some_and(UdpTransport::holds_packets)
    }

    /// Fills the ICRC of every packet that came from shared memory without one, so that a
    /// capture above records the packet as it would be on the wire (a device with a
    /// capture asks for it).
    pub fn with_icrc_completed(mut self) -> HostTransport {
        if let Some(shm) = &mut self.shm {
            shm.complete_icrc = true;
        }
        self
    }

    /// Whether devices of other processes of this host can reach this one through shared
    /// memory.
    pub fn shared_memory(&self) -> bool {
        self.shm.is_some()
    }

    /// The UDP transport under it.
    pub fn udp(&self) -> &UdpTransport {
        &self.udp
    }

    /// Sends `packets` over UDP, their payload left for later read first (one whose
    /// region faulted is lost, `crate::deferred`); returns how many were sent.
    fn send_wire(&self, packets: &mut [OutgoingPacket<'_>]) -> usize {
        // Collects nothing (allocates nothing) unless a region faulted.
        let lost: Vec<usize> = packets
            .iter_mut()
            .enumerate()
            .filter_map(|(index, packet)| (!packet.fill_deferred()).then_some(index))
            .collect();
        if lost.is_empty() {
            return self.udp.send_batch(packets);
        }
        let mut kept: Vec<OutgoingPacket<'_>> = Vec::with_capacity(packets.len());
        let mut indices = Vec::with_capacity(packets.len());
        for (index, packet) in packets.iter_mut().enumerate() {
            packet.sent = None;
            if !lost.contains(&index) {
                indices.push(index);
                kept.push(OutgoingPacket::new(
                    packet.to,
                    packet.src_port,
                    &mut *packet.bytes,
                ));
            }
        }
        let sent = self.udp.send_batch(&mut kept);
        let results: Vec<Option<Sent>> = kept.into_iter().map(|packet| packet.sent).collect();
        for (index, result) in indices.into_iter().zip(results) {
            packets[index].sent = result;
        }
        sent
    }

    /// Whether a receive at count `call` (`Shm::receives`), at `now` (coarse), looks at the
    /// sockets too: always if `anyway` (no sender uses the rings, or the receiver was
    /// woken), else one receive in [`UDP_EVERY`], while they were recently busy, at least
    /// every [`UDP_AT_LEAST_EVERY`], when the socket was found readable, or while packets
    /// of theirs wait to be handed out. Notes the look.
    fn udp_due(&self, shm: &Shm, call: u64, anyway: bool, now: u64) -> bool {
        let due = anyway
            || call.is_multiple_of(UDP_EVERY)
            || call < shm.udp_until.load(Ordering::Relaxed)
            || now
                >= shm
                    .udp_looked_at
                    .load(Ordering::Relaxed)
                    .saturating_add(UDP_AT_LEAST_EVERY.as_nanos() as u64)
            || (shm.udp_ready.load(Ordering::Relaxed)
                && shm.udp_ready.swap(false, Ordering::Relaxed))
            || self.sockets_hold_packets(shm);
        if due {
            shm.udp_looked_at.store(now, Ordering::Relaxed);
        }
        due
    }

    /// Receives from the rings and the socket; `Ok(0)` if neither had a packet.
    fn receive_now(
        &self,
        shm: &Shm,
        bufs: &mut [&mut [u8]],
        received: &mut Vec<Received>,
        woken: bool,
    ) -> io::Result<usize> {
        // Not a locked increment: one on every empty poll of a busy-polling application
        // cost it as much as the look at the rings. The count only paces the looks at the
        // socket and the holder, which a receive of another thread lost now and then
        // does not upset.
        let call = shm.receives.load(Ordering::Relaxed);
        shm.receives.store(call.wrapping_add(1), Ordering::Relaxed);
        let header = shm.inbox.mapping.header();
        let senders = header.active.load(Ordering::Relaxed) != 0;
        if call.is_multiple_of(1024) {
            self.check_holder(shm);
        }
        let now = coarse_now();
        shm.forget_gone(now);
        if self.udp_due(shm, call, woken || !senders, now) {
            let mut count = self.udp.recv_batch(bufs, received, Some(Duration::ZERO))?;
            if count == 0 {
                if let Some(taken) = shm.taken.get() {
                    count = taken.recv_batch(bufs, received, Some(Duration::ZERO))?;
                }
            }
            if count > 0 {
                shm.udp_until.store(call + UDP_RECENT, Ordering::Relaxed);
                let kept = shm.forward(bufs, received);
                if kept > 0 {
                    return Ok(kept);
                }
            }
        }
        shm.clear_doorbell(false);
        received.clear();
        Ok(shm.take(self.local, bufs, received))
    }

    /// Waits until a ring has a packet, the socket is readable or the doorbell rang, at
    /// most `timeout` (`None`: no limit).
    fn wait(&self, shm: &Shm, timeout: Option<Duration>) -> io::Result<()> {
        self.check_holder(shm);
        shm.forget_gone(coarse_now());
        if self.sockets_hold_packets(shm) || shm.has_packets() {
            return Ok(());
        }
        if shm.spin_for_packets(timeout) {
            return Ok(());
        }
        // A member without the socket wakes up to look at its holder.
        let timeout = if shm.holds_socket.load(Ordering::Relaxed) {
            timeout
        } else {
            Some(timeout.map_or(HOLDER_CHECK, |t| t.min(HOLDER_CHECK)))
        };
        let header = shm.inbox.mapping.header();
        header.waiters.fetch_add(1, Ordering::SeqCst);
        let mut rang = false;
        let result = if shm.has_packets() {
            Ok(())
        } else {
            let timespec = timeout.map(|t| rustix::event::Timespec {
                tv_sec: t.as_secs().min(i64::MAX as u64) as i64,
                tv_nsec: i64::from(t.subsec_nanos()),
            });
            let udp_fd = self.udp.wait_fd();
            let taken_fd = shm.taken.get().map(UdpTransport::wait_fd);
            let mut fds = [
                rustix::event::PollFd::new(&udp_fd, rustix::event::PollFlags::IN),
                rustix::event::PollFd::new(&shm.doorbell, rustix::event::PollFlags::IN),
                rustix::event::PollFd::new(
                    taken_fd.as_ref().unwrap_or(&udp_fd),
                    rustix::event::PollFlags::IN,
                ),
            ];
            match rustix::event::poll(&mut fds, timespec.as_ref()) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {
                    if !fds[0].revents().is_empty() || !fds[2].revents().is_empty() {
                        shm.udp_ready.store(true, Ordering::Relaxed);
                    }
                    rang = !fds[1].revents().is_empty();
                    Ok(())
                }
                Err(errno) => Err(errno.into()),
            }
        };
        // A ring (`rung` set) is drained by the last waiter only: another (an application
        // asleep on its channel's fd, which holds the doorbell too) must still find it
        // readable when it looks, and drains it itself, or whoever receives does. A
        // datagram with `rung` clear is stale (its packet was taken after the clear that
        // preceded it): drained by anyone, or a waiter that is not the last would find it
        // readable on every wait.
        let last = header.waiters.fetch_sub(1, Ordering::SeqCst) == 1;
        if last || header.rung.load(Ordering::SeqCst) == 0 {
            shm.clear_doorbell(rang);
        }
        result
    }

    /// Sends one packet to a ring if `to` has an inbox; false if it goes over UDP.
    fn send_shared(
        &self,
        shm: &Shm,
        to: &Endpoint,
        src_port: u16,
        flags: u16,
        bytes: &[u8],
    ) -> bool {
        let mut routes = lock(&shm.routes);
        let mut now = None;
        let slot = ring_slot(bytes);
        let Some(peer) = shm.route(&mut routes, to, slot, self.local.gid(), &mut now) else {
            return false;
        };
        let ring = peer.inbox.ring();
        let mut producer = ring.producer_within(peer.inbox.usable());
        match shm.push(peer, &mut producer, src_port, flags, (bytes, 0, &[])) {
            Pushed::Yes => {
                producer.publish();
                shm.counters.count_sent_exclusive(bytes.len());
                shm.ring_doorbell(peer);
            }
            Pushed::Full | Pushed::Refused => {
                if let Some(slot) = slot {
                    shm.full(&mut routes, (*to, slot));
                }
            }
        }
        true
    }
}

impl Transport for HostTransport {
    /// The device's endpoint: where a member of a shared address sends from an ephemeral
    /// port, still the address's (the port peers send to).
    fn local(&self) -> Endpoint {
        self.local
    }

    /// The headers of the wire, whichever way the packet goes (a capture records the
    /// packet the exchange stands for).
    fn prepare(&self, to: &Endpoint, src_port: u16, ib_packet: &mut [u8]) -> io::Result<Sent> {
        self.udp.prepare(to, src_port, ib_packet)
    }

    fn transmit(&self, to: &Endpoint, sent: &Sent, ib_packet: &[u8]) -> io::Result<()> {
        if let Some(shm) = &self.shm {
            if self.send_shared(shm, to, sent.udp.src_port, ICRC_FILLED, ib_packet) {
                return Ok(());
            }
        }
        self.udp.transmit(to, sent, ib_packet)
    }

    /// Packets for devices with an inbox go into their rings (one publication per run of
    /// packets for one device, no ICRC), the others to [`UdpTransport::send_batch`].
    fn send_batch(&self, packets: &mut [OutgoingPacket<'_>]) -> usize {
        let Some(shm) = &self.shm else {
            return self.udp.send_batch(packets);
        };
        let local = self.local;
        let mut routes = lock(&shm.routes);
        let mut now = None;
        // The runs of packets that go over UDP (none, or all of them, most often): the
        // thread's vector, kept from call to call.
        let mut wire = WIRE_RUNS.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
        wire.clear();
        let mut sent = 0;
        let mut start = 0;
        let slot = |packet: &OutgoingPacket<'_>| ring_slot(packet.bytes);
        while start < packets.len() {
            let to = packets[start].to;
            let to_slot = slot(&packets[start]);
            let mut end = start + 1;
            while end < packets.len() && packets[end].to == to && slot(&packets[end]) == to_slot {
                end += 1;
            }
            match shm.route(&mut routes, &to, to_slot, local.gid(), &mut now) {
                Some(peer) => {
                    let ring = peer.inbox.ring();
                    let mut producer = ring.producer_within(peer.inbox.usable());
                    let mut pushed = 0;
                    let mut refused = false;
                    for packet in &mut packets[start..end] {
                        let headers = path_headers(
                            &local,
                            &to,
                            packet.src_port,
                            0,
                            HOP_LIMIT,
                            packet.bytes.len(),
                        );
                        let contents = (&*packet.bytes, packet.deferred_base, packet.deferred);
                        match headers.map(|headers| {
                            let pushed =
                                shm.push(peer, &mut producer, packet.src_port, 0, contents);
                            (headers, pushed)
                        }) {
                            Ok(((ip, udp), Pushed::Yes)) => {
                                shm.counters.count_sent_exclusive(packet.bytes.len());
                                let direct = packet.deferred.iter().map(|piece| piece.len).sum();
                                crate::transport::add(&shm.direct_bytes, direct);
                                packet.sent = Some(Sent {
                                    from: local,
                                    ip,
                                    udp,
                                    icrc: 0,
                                });
                                pushed += 1;
                            }
                            Ok((_, Pushed::Full)) => {
                                packet.sent = None;
                                refused = true;
                            }
                            // Its region faulted: lost (`crate::deferred`).
                            Ok((_, Pushed::Refused)) => packet.sent = None,
                            Err(error) => {
                                tracing::debug!(%error, to = %to, "send failed");
                                packet.sent = None;
                            }
                        }
                    }
                    producer.publish();
                    if pushed > 0 {
                        shm.ring_doorbell(peer);
                    }
                    if let (true, Some(to_slot)) = (refused, to_slot) {
                        shm.full(&mut routes, (to, to_slot));
                    }
                    sent += pushed;
                }
                None => wire.push(start..end),
            }
            start = end;
        }
        drop(routes);
        let whole = wire.len() == 1 && wire[0] == (0..packets.len());
        if wire.is_empty() || whole {
            WIRE_RUNS.with(|cell| *cell.borrow_mut() = wire);
            return if whole {
                sent + self.send_wire(packets)
            } else {
                sent
            };
        }
        // The packets for UDP, in order, as one batch.
        let mut batch: Vec<OutgoingPacket<'_>> = Vec::new();
        let mut rest: &mut [OutgoingPacket<'_>] = packets;
        let mut at = 0;
        let mut wire_indices = Vec::new();
        for range in &wire {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(range.start - at);
            let (run, tail) = tail.split_at_mut(range.len());
            for (offset, packet) in run.iter_mut().enumerate() {
                wire_indices.push(range.start + offset);
                batch.push(OutgoingPacket::with_deferred(
                    packet.to,
                    packet.src_port,
                    packet.bytes,
                    packet.deferred_base,
                    packet.deferred,
                ));
            }
            rest = tail;
            at = range.end;
        }
        sent += self.send_wire(&mut batch);
        let results: Vec<Option<Sent>> = batch.into_iter().map(|packet| packet.sent).collect();
        for (index, result) in wire_indices.into_iter().zip(results) {
            packets[index].sent = result;
        }
        sent
    }

    fn recv(&self, buf: &mut [u8], timeout: Option<Duration>) -> io::Result<Option<Received>> {
        if self.shm.is_none() {
            return self.udp.recv(buf, timeout);
        }
        let mut received = Vec::with_capacity(1);
        self.recv_batch(&mut [buf], &mut received, timeout)?;
        Ok(received.pop())
    }

    /// The rings first while senders use them (no system call), the socket one receive
    /// in `UDP_EVERY` or whenever it was readable or recently busy; waits on both.
    fn recv_batch(
        &self,
        bufs: &mut [&mut [u8]],
        received: &mut Vec<Received>,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        let Some(shm) = &self.shm else {
            return self.udp.recv_batch(bufs, received, timeout);
        };
        received.clear();
        let deadline = match timeout {
            Some(t) if t.is_zero() => None,
            Some(t) => Some(Instant::now() + t),
            None => None,
        };
        let mut woken = false;
        loop {
            let count = self.receive_now(shm, bufs, received, woken)?;
            if count > 0 || timeout.is_some_and(|t| t.is_zero()) {
                return Ok(count);
            }
            let left = match deadline {
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Ok(0);
                    }
                    Some(deadline - now)
                }
                None => None,
            };
            self.wait(shm, left)?;
            woken = true;
        }
    }

    /// The rings' packets sent without an ICRC (by a device of another process that
    /// neither captures nor injects faults), then, when the socket is due a look (as in
    /// `recv_batch`), the packets of the socket's coalesced datagrams, all handed where
    /// they lie (`UdpTransport::take_in_place_until`), up to one for another member of the
    /// address.
    fn take_in_place(&self, max: usize, handle: &mut dyn FnMut(&Received, &[u8])) -> usize {
        let Some(shm) = &self.shm else {
            return self.udp.take_in_place(max, handle);
        };
        let handed = shm.take_in_place(self.local, max, handle);
        if handed == max || !self.udp.coalesces() {
            return handed;
        }
        // The receive that follows (`recv_batch`) counts the call.
        let call = shm.receives.load(Ordering::Relaxed);
        let senders = shm.inbox.mapping.header().active.load(Ordering::Relaxed) != 0;
        if !self.udp_due(shm, call, !senders, coarse_now()) {
            return handed;
        }
        // A packet for another member stops the run: it and those after it go through
        // `recv_batch`, which forwards it (a push into a full ring may wait, not under
        // the device's lock that `handle` holds).
        let own = shm.membership.slot;
        let members = &shm.membership.members;
        let for_another = |bytes: &[u8]| {
            members
                .packet_slot(bytes)
                .is_some_and(|slot| slot != own && members.ready_member(slot).is_some())
        };
        let taken = self
            .udp
            .take_in_place_until(max - handed, &for_another, handle);
        if taken > 0 {
            shm.udp_until.store(call + UDP_RECENT, Ordering::Relaxed);
        }
        handed + taken
    }

    fn wait_readable(&self, timeout: Duration) -> io::Result<()> {
        match &self.shm {
            Some(shm) => self.wait(shm, Some(timeout)),
            None => self.udp.wait_readable(timeout),
        }
    }

    /// Counts a thread sleeping on [`Transport::readiness_fd`] as a waiter of the inbox, so
    /// senders ring the doorbell for it (the rings do not show on the fd).
    fn sleeping(&self, before: bool) -> bool {
        let Some(shm) = &self.shm else {
            return false;
        };
        let header = shm.inbox.mapping.header();
        if before {
            header.waiters.fetch_add(1, Ordering::SeqCst);
            self.check_holder(shm);
            // After counting itself: either a sender sees it, or it sees the packet.
            self.sockets_hold_packets(shm) || shm.has_packets()
        } else {
            header.waiters.fetch_sub(1, Ordering::SeqCst);
            // The sleeper waited on the readiness fd (an epoll set with the doorbell in it)
            // and cannot say whether the doorbell was readable: drained either way.
            shm.clear_doorbell(true);
            false
        }
    }

    /// With an inbox: the payload of a packet for a ring is read from its region into
    /// the record (one copy), that of a packet for the socket into the packet first.
    fn takes_deferred(&self) -> bool {
        self.shm.is_some()
    }

    fn offer_direct_segments(&self) {
        if let Some(shm) = &self.shm {
            // Release: published with the inbox, read by a peer deciding at RTR.
            shm.inbox
                .mapping
                .header()
                .direct
                .store(1, Ordering::Release);
        }
    }

    /// Both ends look at the other's inbox only (not at whether a ring of it could be
    /// claimed, which one end may find and the other not): each sees the other's, or
    /// neither does. A packet of a direct segment that still takes the socket (every ring
    /// of the peer's inbox held) crosses loopback whole: it is under 64 KiB.
    ///
    /// Through the route's mapping of the inbox when there is one still there (the device
    /// prepares the route first, `Device::modify_qp`), else through a mapping of its own
    /// for the look: mapping the inbox and unmapping it again for every connection cost
    /// each a TLB shootdown (an interrupt to every CPU running a thread of the process),
    /// and `cmtime -c 200` through the drop-in took 27 ms to connect where it took 4 ms
    /// over UDP.
    fn direct_segments_to(&self, to: &Endpoint, dest_qpn: u32) -> bool {
        let Some(shm) = &self.shm else {
            return false;
        };
        if shm.inbox.mapping.header().direct.load(Ordering::Acquire) != 1 {
            return false;
        }
        let Some(slot) = members::slot_of(dest_qpn) else {
            return false;
        };
        if let Some(Route::Shared(peer)) = lock(&shm.routes).get(&(*to, slot)) {
            if peer.inbox.still_there() {
                return peer.inbox.offers_direct_segments();
            }
        }
        inbox::offers_direct_segments(&shm.scope.path(to, slot))
    }

    /// Over UDP only (no inbox): a packet for a ring goes whole, without a datagram.
    fn acks_may_follow(&self, to: &Endpoint) -> bool {
        self.shm.is_none() && self.udp.acks_may_follow(to)
    }

    fn prepare_route(&self, to: &Endpoint, dest_qpn: u32) {
        // The route of the packets to `dest_qpn` (none to multicast: `Shm::route`).
        let (Some(shm), Some(slot)) = (&self.shm, members::qpn_ring_slot(dest_qpn)) else {
            return;
        };
        let mut routes = lock(&shm.routes);
        let _ = shm.route(&mut routes, to, Some(slot), self.local.gid(), &mut None);
    }

    fn address_share(&self) -> u8 {
        // SLOTS is 256: a slot is one byte.
        self.shm.as_ref().map_or(0, |shm| shm.membership.slot as u8)
    }

    fn sharing(&self) -> Option<Sharing> {
        let shm = self.shm.as_ref()?;
        let members = &shm.membership.members;
        Some(Sharing {
            slot: shm.membership.slot as u8,
            holds_socket: shm.holds_socket.load(Ordering::Relaxed),
            holder: members.holder(),
            others: members.other_members(),
        })
    }

    fn listen_service(&self, service_id: u64) -> io::Result<()> {
        match &self.shm {
            Some(shm) => shm
                .membership
                .members
                .claim_service(shm.membership.slot, service_id),
            None => Ok(()),
        }
    }

    fn unlisten_service(&self, service_id: u64) {
        if let Some(shm) = &self.shm {
            shm.membership.members.release_services(Some(service_id));
        }
    }

    fn in_memory(&self, to: &Endpoint) -> bool {
        self.shm.as_ref().is_some_and(|shm| {
            lock(&shm.routes)
                .iter()
                .any(|((at, _), route)| at == to && matches!(route, Route::Shared(_)))
        })
    }

    fn memory_inbox(&self) -> bool {
        self.shm.is_some()
    }

    /// A record in a ring, or a datagram on a socket; the doorbell left as it is.
    fn pending_packets(&self) -> bool {
        self.udp.pending_packets()
            || self.shm.as_ref().is_some_and(|shm| {
                shm.has_packets() || shm.taken.get().is_some_and(UdpTransport::pending_packets)
            })
    }

    /// The UDP socket, or an epoll set of it and the doorbell.
    fn readiness_fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.shm {
            Some(shm) => Some(shm.epoll.as_fd()),
            None => self.udp.readiness_fd(),
        }
    }

    /// The socket's counters, with the packets that went through shared memory added to
    /// the packet counts (and counted apart in `shm_sent_packets` / `shm_received_packets`).
    fn counters(&self) -> TransportCounters {
        let mut counters = self.udp.counters();
        if let Some(shm) = &self.shm {
            if let Some(taken) = shm.taken.get() {
                let socket = taken.counters();
                counters.received_packets += socket.received_packets;
                counters.received_bytes += socket.received_bytes;
                counters.dropped_bad_icrc += socket.dropped_bad_icrc;
                counters.dropped_malformed += socket.dropped_malformed;
                counters.dropped_truncated += socket.dropped_truncated;
            }
            let mut shared = shm.counters.snapshot();
            let forwarded = shm.forwarded.snapshot();
            shared.sent_packets += forwarded.sent_packets;
            shared.sent_bytes += forwarded.sent_bytes;
            counters.sent_packets += shared.sent_packets;
            counters.sent_bytes += shared.sent_bytes;
            counters.received_packets += shared.received_packets;
            counters.received_bytes += shared.received_bytes;
            counters.dropped_bad_icrc += shared.dropped_bad_icrc;
            counters.dropped_malformed += shared.dropped_malformed;
            counters.dropped_truncated += shared.dropped_truncated;
            counters.dropped_undeliverable += shared.dropped_undeliverable;
            counters.shm_sent_packets = shared.sent_packets;
            counters.shm_received_packets = shared.received_packets;
            counters.shm_direct_bytes = shm.direct_bytes.load(Ordering::Relaxed);
            counters.shm_in_place_packets = shm.in_place_packets.load(Ordering::Relaxed);
            counters.shm_stalls = shm.stalls.load(Ordering::Relaxed);
        }
        counters
    }

    fn join_multicast(&self, group: IpAddr) -> io::Result<()> {
        self.udp.join_multicast(group)
    }

    fn leave_multicast(&self, group: IpAddr) -> io::Result<()> {
        self.udp.leave_multicast(group)
    }
}
