//! The device's runtime: runs of the engine ([`DeviceInner::run`] and what it produced:
//! completions, events, packets), sending (to devices of this process directly, in order,
//! with no device lock held while another runs; to others over the transport), receiving,
//! the timers, and the progress thread that keeps all of it moving while the application
//! sleeps.
//!
//! Ordering guarantees, each noted at its code: packets leave in the order the engine
//! produced them (the send lock is taken before the state lock is released), and are
//! handled in the order they arrived (the receive lock is held from taking a packet off
//! the transport until the engine has handled it).
//!
//! Packets move in batches: a run's packets for the transport go to
//! [`Transport::send_batch`] together (one `sendmmsg(2)` on UDP), and what
//! [`Transport::recv_batch`] takes off the transport is handled in one run, so the
//! engine's acknowledgements of a burst coalesce into one (IBTA vol. 1 §9.7.5.1.1: a
//! responder may acknowledge several packets with one ACK) before any is sent.

use super::completions::deliver_completions;
use super::grh::grh_bytes;
use super::link::HOP_LIMIT;
use super::registry::{group_members, registered, registry};
use super::{lock, DeviceInner, State};
use crate::deferred::Deferred;
use crate::pcap::{Capture, Direction};
use crate::transport::{
    invalid_input, path_headers, udp_src_port_for_qps, Endpoint, Gid, OutgoingPacket, Received,
    Sent, Transport,
};
use softverbs_cq::{CqProducer, DeviceClock};
use softverbs_proto::{AttrMask, QpAttr, QpState};
use softverbs_wire::icrc;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard, Weak};
use std::time::Duration;

/// Rounds of local operations and transmission one drain runs at most.
const MAX_DRAIN_ROUNDS: usize = 1 << 16;

/// How long the progress thread sleeps at most before looking at its timers again.
const PROGRESS_TICK: Duration = Duration::from_millis(5);

/// How recently the application must have driven progress for the progress thread to
/// leave the socket to it.
const APP_POLLING_WINDOW: Duration = Duration::from_millis(1);

/// What [`DeviceInner::events_awaited_elsewhere`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Awaited {
    /// A CQ is armed, its waiter is not woken by the packets, and no thread waits through
    /// the device's channel service: the progress thread receives.
    Elsewhere,
    /// No CQ is armed, or a thread waits through the channel service (spinning or asleep
    /// on the device's readiness fd: it receives for itself).
    No,
    /// Only CQs whose waiter the packets wake are armed (`CqProducer::packets_wake_waiter`:
    /// asleep on a non-blocking channel's fd, which polls readable on the device's
    /// readiness too): it receives for itself once woken, and the progress thread naps.
    /// A wake-up may still be lost (or the application not come back to its fd for a
    /// while): the nap is bounded ([`ARMED_RECHECK`]), and a packet found waiting at two
    /// looks is taken (`take_stuck_packets`).
    Watched,
    /// Such a wait ended a moment ago ([`SERVED_GAP`]): the application probably arms and
    /// waits so again (`ibv_get_cq_event` in a loop); look again after this long.
    NotYet(Duration),
    /// A CQ is armed whose waiter the packets do not wake, but the application polled the
    /// device [`POLLS_AFTER_ARM`] times since the last arm: it is a busy poller beside a
    /// thread that waits for the events of a CQ armed for good (UCX arms the CQs of its
    /// `ud_verbs` transport for its own thread and polls every transport in its progress
    /// loop), and its polls receive the packets. The progress thread naps as for a poller,
    /// for [`ARMED_RECHECK`] at most.
    Polled,
}

/// How many polls of the device since a CQ was last armed make the application a busy
/// poller ([`Awaited::Polled`]) rather than an event loop between its arm and its sleep
/// (which polls once or a few times after the arm: the standard loop polls once more, UCX's
/// `ucp_worker_arm` once per transport). A busy poller makes them in tens of microseconds.
/// Before, a CQ armed for good kept the progress thread receiving beside the polling
/// application: `ucx_perftest -t tag_lat` (poll mode, `rc_verbs` with `ud_verbs` for
/// wire-up) through the drop-in averaged 8.3-11.5 us one way against 3.5-4.9 us since
/// (pinned pairs, 20,000 and 100,000 iterations), its progress thread napping 500-1,500
/// times a run where it had never napped.
pub(super) const POLLS_AFTER_ARM: u32 = 1024;

/// How long after a wait through the device's channel service (`ibv_get_cq_event`) ended
/// an armed CQ is still taken for the next such wait, not for one on the channel's fd: an
/// event loop acknowledges, arms, polls and waits again within a few microseconds, and
/// waking the progress thread for each arm would only take a CPU from it.
const SERVED_GAP: Duration = Duration::from_micros(50);

/// [`DeviceInner::stuck_look`] when the last look found no packet waiting.
pub(super) const NO_LOOK: u64 = u64::MAX;

/// How long the progress thread naps at most while a CQ is armed and the application waits
/// through the channel service (or did a moment ago): it may wait on the channel's fd next,
/// which nothing tells the device (an event loop that takes a stale event with
/// `ibv_get_cq_event`, then sleeps in its own `poll`). Bounds that wait's delay; costs at
/// most 2,000 wake-ups a second of a thread that would otherwise nap 1-5 ms (`ib_send_lat
/// -e` unchanged within the noise: 5.2-5.6 us one way, against 5.0-5.7 before).
const ARMED_RECHECK: Duration = Duration::from_micros(500);

/// While the application polls, the progress thread looks again this many times per local
/// ACK timeout of the device's QPs ([`polling_nap`]).
const NAPS_PER_ACK_TIMEOUT: u64 = 16;

/// How long the progress thread sleeps while the application polls for itself, given the
/// shortest local ACK timeout of the device's RC QPs (ns, `u64::MAX`: none): a sixteenth
/// of it, at least [`APP_POLLING_WINDOW`], at most [`PROGRESS_TICK`]. Every wake-up takes
/// the CPU from a thread busy polling on it (two context switches, several microseconds on
/// a virtual machine): once a millisecond, it put one round trip in a hundred of an 8-byte
/// ping-pong over UDP at 4-9 times the median. Once the application stops polling, a
/// packet waits at most the window and one nap before this thread takes it: 5.2 ms for
/// `ibv_rc_pingpong`'s timeout 14 (67 ms; 2 ms with a nap of the window), under a tenth of
/// the timeout from 13 up, and 2 ms as before for a timeout under 16 ms.
pub(super) fn polling_nap(shortest_ack_timeout_ns: u64) -> Duration {
    Duration::from_nanos((shortest_ack_timeout_ns / NAPS_PER_ACK_TIMEOUT).clamp(
        APP_POLLING_WINDOW.as_nanos() as u64,
        PROGRESS_TICK.as_nanos() as u64,
    ))
}

/// Receive rounds ([`DeviceInner::receive_queued`]) at most before due timers fire.
const DRAIN_BEFORE_TIMERS: usize = 64;

/// How long an in-process progress thread sleeps at most while the fault layer holds
/// packets back (as `FaultTransport::wait_readable` bounds a UDP device's wait).
const HELD_PACKETS_TICK: Duration = Duration::from_millis(1);

/// Slots of a receive batch ([`Transport::recv_batch`]): packets handled in one run.
const RECEIVE_SLOTS: usize = 32;

/// Batches one round of progress takes off the transport at most.
const RECEIVE_ROUNDS: usize = 2;

/// Polls in a row at most (an application's poll of an empty CQ, which comes back at
/// once) that, having taken packets in place (from shared-memory rings, from a socket's
/// coalesced datagrams), leave the copying receive ([`Transport::recv_batch`]: records a
/// ring holds for it, a socket without GRO, the multicast groups' sockets) to a later
/// poll. The poll that took a message returns to the application without another look at
/// every ring and the socket pacing on the way (~190 instructions and a lock here, between
/// the message and its completion); what only the copying receive takes waits this many
/// polls at most. The progress thread and a thread waiting for an event receive both ways
/// every time.
pub(super) const IN_PLACE_STREAK: u32 = 8;

/// The size of a receive slot: a packet of a direct segment between devices of this host
/// (`DIRECT_SEGMENT`, 32 KiB: the shared-memory path, whose records may come through a
/// receive slot) with every header, which is more than any IB transport packet at the
/// largest path MTU (4096, IBTA vol. 1 §9.6.1.1). A larger datagram is dropped as
/// truncated. (Packets between devices of this process are handed over, never received
/// into a slot.)
const RECEIVE_SLOT_LEN: usize = 36 * 1024;

/// The packets a run produced, to send once the state lock is released: their bytes one
/// after another in `bytes[..used]` (reused from run to run, so no allocation per packet).
/// The engine writes each packet straight into the room after them: no copy between its
/// build and the transport.
#[derive(Default)]
struct Outgoing {
    packets: Vec<OutgoingSlot>,
    /// The packets' bytes, then room already initialized (never zeroed again).
    bytes: Vec<u8>,
    used: usize,
    /// Payload left to be read from registered memory as the packets leave (offsets in
    /// `bytes`, in order; `crate::deferred`): the bytes there are not the packet's yet.
    deferred: Vec<Deferred>,
}

/// The payload pieces of one packet of [`Outgoing`] left to be read, and their range in
/// its `deferred`.
struct Pieces<'a> {
    own: &'a [Deferred],
    range: std::ops::Range<usize>,
}

/// One packet of [`Outgoing`]: the next `len` bytes.
#[derive(Clone, Copy)]
struct OutgoingSlot {
    to: Endpoint,
    src_port: u16,
    len: usize,
}

/// The room the engine is given to build one packet in: a packet of the largest direct
/// segment (`IN_PROCESS_SEGMENT`, 64 KiB, between devices of this process) with every
/// header fits. (Its payload is mostly not written there: the engine leaves it in the
/// region, `crate::deferred`.)
const PACKET_ROOM: usize = 64 * 1024 + 512;

impl Outgoing {
    fn clear(&mut self) {
        self.packets.clear();
        self.used = 0;
        self.deferred.clear();
    }

    /// `len` bytes of room after the packets, for the next one.
    fn room(&mut self, len: usize) -> &mut [u8] {
        let end = self.used + len;
        if self.bytes.len() < end {
            self.bytes.resize(end, 0);
        }
        &mut self.bytes[self.used..end]
    }

    /// Takes the first `slot.len` bytes of the room as the next packet.
    fn push(&mut self, slot: OutgoingSlot) {
        self.used += slot.len;
        self.packets.push(slot);
    }

    /// The packets' bytes.
    fn filled(&self) -> &[u8] {
        &self.bytes[..self.used]
    }

    /// Whether every packet is a plain RC ACKNOWLEDGE: BTH opcode 0x11 with an AETH
    /// syndrome of ACK, not a NAK or an RNR NAK (IBTA vol. 1 §9.7.5.2.1, table 44).
    fn only_acks(&self) -> bool {
        let mut at = 0;
        let filled = self.filled();
        self.packets.iter().all(|slot| {
            let bytes = &filled[at..at + slot.len];
            at += slot.len;
            bytes.len() > 12 && bytes[0] == RC_ACKNOWLEDGE && bytes[12] >> 5 == 0
        })
    }

    /// Appends `other`'s packets after these.
    fn append(&mut self, other: &Outgoing) {
        self.room(other.used).copy_from_slice(other.filled());
        let shift = self.used;
        self.deferred
            .extend(other.deferred.iter().map(|piece| piece.shifted(shift)));
        self.used += other.used;
        self.packets.extend_from_slice(&other.packets);
    }

    /// Puts `first`'s packets before these (moving only the packets' bytes, not the room
    /// after them).
    fn prepend(&mut self, first: &Outgoing) {
        let n = first.used;
        self.room(n);
        self.bytes.copy_within(..self.used, n);
        self.bytes[..n].copy_from_slice(first.filled());
        self.used += n;
        // Appended, then turned to the front: `Vec::splice` costs a few hundred
        // instructions even for the one ACK of a ping-pong.
        self.packets.extend_from_slice(&first.packets);
        self.packets.rotate_right(first.packets.len());
        for piece in &mut self.deferred {
            piece.at += n;
        }
        if !first.deferred.is_empty() {
            self.deferred.extend(first.deferred.iter().cloned());
            self.deferred.rotate_right(first.deferred.len());
        }
    }

    /// The packets, each with its bytes, its offset in the run's bytes and its pieces
    /// left to be read (offsets in the run's bytes; their range in `deferred`).
    fn split(&mut self) -> impl Iterator<Item = (&OutgoingSlot, &mut [u8], usize, Pieces<'_>)> {
        let mut rest: &mut [u8] = &mut self.bytes[..self.used];
        let mut pieces: &[Deferred] = &self.deferred;
        let mut first = 0;
        let mut at = 0;
        self.packets.iter().map(move |slot| {
            let (bytes, tail) = std::mem::take(&mut rest).split_at_mut(slot.len);
            rest = tail;
            let start = at;
            at += slot.len;
            let mine = pieces.iter().take_while(|piece| piece.at < at).count();
            let (own, later) = pieces.split_at(mine);
            pieces = later;
            let range = first..first + mine;
            first += mine;
            (slot, bytes, start, Pieces { own, range })
        })
    }
}

/// The ACKs a receive run in the application's poll produced, held (under the device's
/// send lock) until the application's next post or poll, so that the reply the
/// application is about to post and the ACK leave in one system call: the reply's
/// request does not wait behind a call of its own for the ACK (IBTA vol. 1 §9.7.5.1.1
/// lets a responder coalesce and delay ACKs). Every other run sends them first, before its
/// own packets, so the order of the device's packets never changes. First also ahead of the
/// reply, in a datagram of its own, except where the two can share one: a NIC acknowledges
/// before its application sees the request, programs count on the send completing no later
/// than the reply arrives (`ib_send_lat -e` hangs otherwise), and a peer that takes the
/// two in separate receives would complete them the other way round. To a peer that takes
/// them whole ([`Transport::acks_may_follow`]: over UDP with GSO, on loopback, where the
/// peer is a softverbs device with GRO), the one ACK rides behind the reply in its GSO
/// message ([`DeviceInner::acks_may_trail`]), and the peer, handling the datagram in one
/// run, completes the send first (`Engine::order_send_completions_first`): one datagram
/// through the kernel each way instead of two (8-byte `ib_send_lat` over UDP, pinned pair:
/// 9.08 -> 7.25 µs one way). `tests/batching.rs` pins both orders.
///
/// Only ACKs of packets that came through the socket are held. One of packets taken from
/// shared-memory rings goes back as a record in the peer's ring, no system call to save,
/// so it leaves at once, as a NIC's does: held, it waited for the application's next post
/// or poll, or for the progress thread (up to [`ACK_HOLD_LIMIT`], more on a busy machine),
/// and the sender's completion with it whenever the application did something else next
/// (a program's connection set-up between two messages). It costs the ping-pong nothing
/// (8-byte round trip through shared memory, pinned pair, 8 runs each: 2.96 µs held,
/// 2.85 µs at once).
#[derive(Default)]
pub(super) struct HeldAcks(Outgoing);

/// BTH opcode of an RC ACKNOWLEDGE (IBTA vol. 1 table 38).
const RC_ACKNOWLEDGE: u8 = 0x11;

/// How long the progress thread sleeps at most while ACKs are held, before it sends them
/// itself (the application stopped posting and polling).
const ACK_HOLD_LIMIT: Duration = Duration::from_micros(100);

/// Buffers a thread receives into, reused from batch to batch.
struct ReceiveBuffers {
    /// [`RECEIVE_SLOTS`] slots of [`RECEIVE_SLOT_LEN`] bytes.
    slots: Vec<u8>,
    received: Vec<Received>,
}

/// A packet for a device of this process.
struct HandedOver {
    to: Arc<DeviceInner>,
    /// The sender's address.
    from: IpAddr,
    /// The address it was sent to: the receiving device's, or a multicast group it is in.
    dest: IpAddr,
    /// The UDP source port the sender's transport would have used.
    src_port: u16,
    bytes: Handed,
    /// The headers the sender's link prepared, its ICRC filled, when the sender captures
    /// or injects faults (`link.rs`); `None` for the direct hand-over (no ICRC).
    sent: Option<Box<Sent>>,
}

/// The bytes of a handed-over packet.
enum Handed {
    /// A copy of its own (a sender's link, `link.rs`).
    Own(Vec<u8>),
    /// `len` bytes at `at` of the sending run's packets, handed over as they were built:
    /// no copy. The last packet of the run to be handled gives the buffer back to the
    /// thread's spares. `pieces` (a range of the run's `deferred`): its payload left in
    /// the sender's regions, which the receiver writes straight into its own.
    Run {
        run: Rc<Outgoing>,
        at: usize,
        len: usize,
        pieces: std::ops::Range<usize>,
    },
}

impl Handed {
    fn bytes(&self) -> &[u8] {
        match self {
            Handed::Own(bytes) => bytes,
            Handed::Run { run, at, len, .. } => &run.bytes[*at..*at + *len],
        }
    }

    /// The payload left in the sender's regions, and where the packet starts in the buffer
    /// their offsets count in.
    fn pieces(&self) -> (&[Deferred], usize) {
        match self {
            Handed::Own(_) => (&[], 0),
            Handed::Run {
                run, at, pieces, ..
            } => (run.deferred.get(pieces.clone()).unwrap_or_default(), *at),
        }
    }

    /// Done with: the run's buffer goes back to the thread's spares once its last packet
    /// is handled.
    fn release(self) {
        if let Handed::Run { run, .. } = self {
            if Rc::strong_count(&run) == 1 {
                SPARE_RUNS.with(|cell| {
                    let mut spare = cell.borrow_mut();
                    if spare.len() < SPARE_OUTGOING {
                        spare.push(run);
                    }
                });
            }
        }
    }
}

/// Packets for devices of this process, in order.
type LocalQueue = VecDeque<HandedOver>;

/// A packet of a run for a device of this process: (device, address sent to, UDP source
/// port, offset and length in the run's bytes).
type LocalTarget = (
    Arc<DeviceInner>,
    IpAddr,
    u16,
    usize,
    usize,
    std::ops::Range<usize>,
);

/// [`Outgoing`]s a thread keeps (runs nest as deep as devices of this process hand
/// packets to each other within one delivery; more than this are dropped when done).
const SPARE_OUTGOING: usize = 8;

/// An [`Outgoing`] for a run: one of the thread's spares, or a new one.
fn take_outgoing() -> Outgoing {
    OUTGOING
        .with(|cell| cell.borrow_mut().pop())
        .unwrap_or_default()
}

/// Keeps `outgoing` for a later run on this thread (one whose buffer was handed over is
/// empty: dropped, its buffer comes back when its packets are handled).
fn spare_outgoing(mut outgoing: Outgoing) {
    if outgoing.bytes.capacity() == 0 {
        return;
    }
    outgoing.clear();
    OUTGOING.with(|cell| {
        let mut spare = cell.borrow_mut();
        if spare.len() < SPARE_OUTGOING {
            spare.push(outgoing);
        }
    });
}

thread_local! {
    /// Packets for devices of this process, delivered in order by the outermost run on
    /// this thread (so no device lock is held while another device runs). The flag says
    /// whether a run on this thread is already draining the queue.
    static LOCAL_DELIVERY: RefCell<(bool, LocalQueue)> =
        const { RefCell::new((false, VecDeque::new())) };

    /// The packets of runs, kept for the next runs on this thread: a run takes one, and a
    /// run nested in it (through local delivery) takes another, so a ping-pong between
    /// devices of this process allocates nothing per run.
    static OUTGOING: RefCell<Vec<Outgoing>> = const { RefCell::new(Vec::new()) };

    /// Where the packets of a run for devices of this process go, kept from run to run:
    /// (device, address sent to, UDP source port, offset and length in the run's bytes,
    /// its pieces in the run's `deferred`).
    static LOCAL_TARGETS: RefCell<Vec<LocalTarget>> = const { RefCell::new(Vec::new()) };

    /// The room of the batch a run hands its transport, kept from run to run (empty).
    static TRANSPORT_BATCH: RefCell<Vec<OutgoingPacket<'static>>> = const { RefCell::new(Vec::new()) };

    /// Buffers of runs whose packets were handed over and handled, for the next run to
    /// hand over its own in (swapped, so neither allocates).
    static SPARE_RUNS: RefCell<Vec<Rc<Outgoing>>> = const { RefCell::new(Vec::new()) };

    /// This thread's receive buffers (taken while in use, as `OUTGOING`).
    static RECEIVE_BUFFERS: RefCell<Option<ReceiveBuffers>> = const { RefCell::new(None) };

    /// Whether this thread is a device's progress thread.
    static PROGRESS_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// The progress thread of a device: rounds of progress until the device is dropped.
pub(super) fn progress_loop(weak: Weak<DeviceInner>) {
    PROGRESS_THREAD.with(|cell| cell.set(true));
    loop {
        let Some(inner) = weak.upgrade() else { return };
        if inner.shutdown.load(Ordering::Acquire) {
            return;
        }
        let received = inner.progress_once(DeviceClock::now(), None, false);
        if received > 0 {
            inner
                .progress_received
                .fetch_add(received as u64, Ordering::Relaxed);
        }
    }
}

impl DeviceInner {
    /// A CQ of the device was armed (`ibv_req_notify_cq(3)`): a thread will wait for its
    /// event. If it waits where it receives nothing for the device (its own `poll` or
    /// `epoll` on the channel's fd), only the progress thread can receive the packet that
    /// makes the completion, and it must not be napping for an application that polled
    /// a moment before it armed ([`events_awaited_elsewhere`](Self::events_awaited_elsewhere)).
    /// Unless the packets themselves wake that thread (`packets_wake`: a non-blocking
    /// channel, whose fd polls readable on the device's readiness too, and whose
    /// non-blocking `get_event` receives): it receives them itself.
    pub(super) fn cq_armed(&self, packets_wake: bool) {
        // Before the hint: a look that sees the hint sees the count from this arm on.
        self.polls_since_arm.store(0, Ordering::SeqCst);
        self.armed_hint.store(true, Ordering::SeqCst);
        if packets_wake {
            return;
        }
        // Not for an application that waits through the channel service (it armed between
        // two such waits): it receives for itself, and waking the progress thread would
        // only take a CPU from it.
        if self.napping.load(Ordering::SeqCst)
            && self.served_waiters.load(Ordering::SeqCst) == 0
            && self.served_gap_left(DeviceClock::now()).is_none()
        {
            if let Some(thread) = self.progress_thread.get() {
                thread.unpark();
            }
        }
    }

    /// Whether a thread waits for a CQ event where it receives nothing for the device: a
    /// CQ is armed and no thread waits through the device's channel service
    /// (`Device::serve_channel_waits`, which receives for itself while it spins and while
    /// it sleeps on the readiness fd; nor did one end within [`SERVED_GAP`]). Then the
    /// progress thread receives even while the application polled recently: the standard
    /// event loop polls the CQ, arms it, polls once more and only then sleeps, on the
    /// channel's fd, which no packet makes readable if the channel is blocking (with the
    /// progress thread napping, each of its events came 1-5 ms late). A CQ whose channel
    /// is non-blocking does not count: its fd polls readable on the packets too, and the
    /// woken thread receives them (`CqProducer::packets_wake_waiter`); nor does an
    /// application that went on polling long after the arm ([`Awaited::Polled`]). Takes the
    /// state lock only while a CQ was armed since the last look.
    pub(super) fn events_awaited_elsewhere(&self, now: u64) -> Awaited {
        if !self.armed_hint.load(Ordering::SeqCst) || self.served_waiters.load(Ordering::SeqCst) > 0
        {
            return Awaited::No;
        }
        if let Some(left) = self.served_gap_left(now) {
            return Awaited::NotYet(left);
        }
        // Cleared before the look: an arm after it sets it again.
        self.armed_hint.store(false, Ordering::SeqCst);
        let polled_on = self.polls_since_arm.load(Ordering::SeqCst) >= POLLS_AFTER_ARM;
        let st = lock(&self.state);
        let mut found = Awaited::No;
        for cq in st.cqs.values().filter(|cq| cq.is_armed()) {
            if !cq.packets_wake_waiter() {
                if !polled_on {
                    self.armed_hint.store(true, Ordering::SeqCst);
                    return Awaited::Elsewhere;
                }
                found = Awaited::Polled;
            } else if found == Awaited::No {
                found = Awaited::Watched;
            }
        }
        if found != Awaited::No {
            self.armed_hint.store(true, Ordering::SeqCst);
        }
        found
    }

    /// Whether the device's CQs report to one completion channel at most.
    pub(super) fn one_channel_at_most(&self) -> bool {
        let st = lock(&self.state);
        let mut channels = st.cqs.values().filter_map(CqProducer::channel_key);
        channels
            .next()
            .is_none_or(|first| channels.all(|key| key == first))
    }

    /// Whether every CQ of the device that reports to a completion channel is armed: no
    /// thread of the application is between taking its events and arming its CQs.
    pub(super) fn channel_cqs_armed(&self) -> bool {
        lock(&self.state)
            .cqs
            .values()
            .all(|cq| !cq.has_channel() || cq.is_armed())
    }

    /// Whether the application receives the packets, so the progress thread leaves them
    /// to it: while it polls (within [`APP_POLLING_WINDOW`] of its last look), unless it
    /// waits for an event where no packet wakes it; and whenever the packets wake it where
    /// it waits ([`Awaited::Watched`]), however long ago it polled (an event loop asleep
    /// between sparse requests).
    fn app_receives(&self, now: u64) -> bool {
        match self.events_awaited_elsewhere(now) {
            Awaited::Elsewhere => false,
            Awaited::Watched => true,
            Awaited::No | Awaited::NotYet(_) | Awaited::Polled => {
                now.saturating_sub(self.last_app_progress.load(Ordering::Relaxed))
                    < APP_POLLING_WINDOW.as_nanos() as u64
            }
        }
    }

    /// What is left at `now` of the [`SERVED_GAP`] after the last wait through the channel
    /// service ended; `None` once it has passed.
    fn served_gap_left(&self, now: u64) -> Option<Duration> {
        let since = now.saturating_sub(self.last_served_end.load(Ordering::Relaxed));
        (SERVED_GAP.as_nanos() as u64)
            .checked_sub(since)
            .filter(|left| *left > 0)
            .map(Duration::from_nanos)
    }

    /// Runs `f` on the engine, then delivers what it produced: completions to their CQs,
    /// events to the async queue, packets (after the lock is released) to their peers.
    /// The clock is read only if the run left something to deliver (a post of a receive
    /// most often does not, and a read costs ~40 ns here).
    pub(super) fn run<R>(self: &Arc<Self>, f: impl FnOnce(&mut State) -> R) -> R {
        self.run_at(None, false, f)
    }

    /// [`run`](Self::run) at `now` (a clock reading the caller has, else one taken at the
    /// end of the run if needed); with `hold_acks`, a run that produced nothing but ACKs
    /// keeps them for the application's next post or poll ([`HeldAcks`]).
    fn run_at<R>(
        self: &Arc<Self>,
        now: Option<u64>,
        hold_acks: bool,
        f: impl FnOnce(&mut State) -> R,
    ) -> R {
        // The device's span (module doc of `device`): not over the delivery at the end of
        // the run, which runs other devices' engines.
        let span = self.span.enter();
        let mut st = lock(&self.state);
        let result = f(&mut st);
        self.end_run(st, span, now, hold_acks);
        result
    }

    /// The end of a run of the engine under `st` (and in the device's `span`): collects
    /// what it produced, releases the lock and the span, then delivers it (`run_at`).
    fn end_run(
        self: &Arc<Self>,
        mut st: MutexGuard<'_, State>,
        span: tracing::span::Entered<'_>,
        now: Option<u64>,
        hold_acks: bool,
    ) {
        // A run that left the engine nothing to send, complete or signal and set no earlier
        // timer (a post of a receive, most often) ends here: there is nothing to drain or
        // deliver. (A timer it cancelled leaves the stored deadline early: the progress
        // thread wakes up for nothing once.)
        if st.held.is_empty()
            && !st.engine.has_output()
            && st.engine.gsi_pending() == st.gsi_seen
            && st.engine.poll_timeout().unwrap_or(u64::MAX)
                >= self.next_deadline.load(Ordering::Relaxed)
        {
            return;
        }
        let now = now.unwrap_or_else(DeviceClock::now);
        let mut outgoing = take_outgoing();
        outgoing.clear();
        self.drain(&mut st, now, &mut outgoing);
        // Packets leave in the order the engine produced them, whichever thread ran it:
        // the send lock is taken before the state lock is released (a reordered pair of
        // packets costs the peer a NAK and a go-back-N).
        let sending = (!outgoing.packets.is_empty()).then(|| lock(&self.tx));
        drop(st);
        drop(span);
        if let Some(mut guard) = sending {
            if hold_acks && self.tap.is_none() && outgoing.only_acks() {
                guard.0.append(&outgoing);
                self.acks_held.store(true, Ordering::Relaxed);
            } else {
                // Held ACKs go in one call with what this run sends (a run that sends
                // nothing, e.g. a post_recv, leaves them for the next post): first, or
                // in the datagram of the run's one packet, behind it.
                // (A load first: the swap, a locked instruction, only when ACKs are held.)
                if self.acks_held.load(Ordering::Relaxed)
                    && self.acks_held.swap(false, Ordering::Relaxed)
                {
                    if self.acks_may_trail(&guard.0, &outgoing) {
                        outgoing.append(&guard.0);
                    } else {
                        outgoing.prepend(&guard.0);
                    }
                    guard.0.clear();
                }
                if outgoing.only_acks() && PROGRESS_THREAD.with(Cell::get) {
                    self.progress_ack_sends.fetch_add(1, Ordering::Relaxed);
                }
                self.send_all(&mut outgoing, guard);
            }
        }
        spare_outgoing(outgoing);
    }

    /// Whether the ACK `held` may leave behind `run`'s one packet, in the same GSO message
    /// (a reply to the request it acknowledges, most often: one datagram instead of two
    /// each way of a ping-pong). The wire's order, the ACK first, is what a program sees
    /// when the two are taken apart: a receiver that takes them in one datagram completes
    /// the ACK's send first (`Engine::order_send_completions_first`), one that takes
    /// them one by one would not ([`Transport::acks_may_follow`] says where the peer
    /// takes them whole). So: one ACK, to the packet's destination and from its port, no
    /// longer than it (a GSO message's segments after the first may only be shorter),
    /// through the transport and not handed to a device of this process.
    fn acks_may_trail(&self, held: &Outgoing, run: &Outgoing) -> bool {
        let ([ack], [packet]) = (held.packets.as_slice(), run.packets.as_slice()) else {
            return false;
        };
        let to = packet.to;
        ack.to == to
            && ack.src_port == packet.src_port
            && ack.len <= packet.len
            && self
                .transport
                .as_ref()
                .is_some_and(|transport| transport.acks_may_follow(&to))
            && (!self.shortcut.load(Ordering::Relaxed)
                || (registered() <= 1 && to.addr() != self.address))
    }

    /// Collects transmits, completions and events from the engine.
    fn drain(&self, st: &mut State, now: u64, outgoing: &mut Outgoing) {
        let State {
            engine,
            memory,
            last_sent_to,
            ..
        } = st;
        // Payload read as the packets leave, straight into a peer's ring or region, where
        // the transport can or no transport is in between (`crate::deferred`).
        let defer = self.tap.is_none()
            && self
                .transport
                .as_ref()
                .is_none_or(|transport| transport.takes_deferred());
        // Local operations (binds, local invalidations) and packets in turn: a local
        // operation runs once it heads its send queue, and what follows it is sent only
        // after. Every round retires work requests or sends packets, so the send queues
        // bound it; the cap is a guard.
        for _ in 0..MAX_DRAIN_ROUNDS {
            let ran = engine.execute_local_operations(memory);
            let mut sent = 0usize;
            loop {
                let offset = outgoing.used;
                let room = outgoing.room(PACKET_ROOM);
                if defer {
                    memory.defer_reads(room, offset);
                }
                let Some(tx) = engine.poll_transmit(now, room, memory) else {
                    break;
                };
                if defer {
                    memory.take_deferred(&mut outgoing.deferred);
                }
                // The peer's address as the path check reads it (a link-local GID is the
                // address it was made from).
                let to = match last_sent_to {
                    Some((dgid, to)) if *dgid == tx.av.dgid => *to,
                    _ => {
                        let to = Endpoint::new(Gid(tx.av.dgid).resolve(self.address), self.port());
                        *last_sent_to = Some((tx.av.dgid, to));
                        to
                    }
                };
                outgoing.push(OutgoingSlot {
                    to,
                    src_port: udp_src_port_for_qps(tx.src_qpn, tx.dest_qpn),
                    len: tx.len,
                });
                sent += 1;
            }
            // Another round only for a local operation that sending brought to the head of
            // its send queue: what the ones that ran let out was sent in this round.
            if (ran == 0 && sent == 0) || !engine.has_local_operations() {
                break;
            }
        }
        if defer {
            memory.stop_deferring();
        }
        // Completions, each CQ's through one burst: what a back-pressure CQ refused goes
        // first, to keep order.
        let mut failed_cqs: Vec<u32> = Vec::new();
        st.engine.order_send_completions_first();
        deliver_completions(
            &st.routes,
            &mut st.held,
            || st.engine.poll_completion(),
            &mut failed_cqs,
        );
        while let Some(event) = st.engine.poll_event() {
            self.events.push(event);
        }
        // Management datagrams received: the GSI fd is readable while any wait.
        let gsi_pending = st.engine.gsi_pending();
        if gsi_pending > st.gsi_seen {
            // Fails only on counter overflow (2^64 - 2 signals).
            let _ = rustix::io::write(&self.gsi_fd, &1u64.to_ne_bytes());
        }
        st.gsi_seen = gsi_pending;
        // A CQ that overran is in error: every QP completing into it goes to error too
        // (reference §3.7: "never drop a CQE silently").
        for qpn in failed_cqs {
            tracing::warn!(
                qpn,
                "a CQ of this QP overran (it is in error): the QP goes to the error state"
            );
            let attr = QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            };
            let _ = st.engine.modify_qp(qpn, &attr, AttrMask::STATE);
        }
        let deadline = next_deadline(st);
        self.next_deadline.store(deadline, Ordering::Relaxed);
        // Wake an in-process progress thread only if a deadline now comes before the time
        // it sleeps until (a futex wake is a system call: not on every verb).
        if self.transport.is_none() && deadline < self.sleeping_until.load(Ordering::Relaxed) {
            self.wake.notify_all();
        }
    }

    pub(super) fn port(&self) -> u16 {
        self.transport
            .as_ref()
            .map_or(crate::transport::DEFAULT_PORT, |t| t.local().port())
    }

    /// Sends packets: to devices of this process directly, to others over the transport
    /// in one batch ([`Transport::send_batch`], in order); with a capture or faults, all
    /// of them through the device's stack (`link.rs`).
    fn send_all(self: &Arc<Self>, outgoing: &mut Outgoing, sending: MutexGuard<'_, HeldAcks>) {
        if let Some(tap) = &self.tap {
            send_through(&*tap.stack, outgoing, sending);
            return;
        }
        let mut batch = match self.transport {
            Some(_) => reuse(TRANSPORT_BATCH.with(|cell| std::mem::take(&mut *cell.borrow_mut()))),
            None => Vec::new(),
        };
        let mut local = LOCAL_TARGETS.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
        {
            let shortcut = self.shortcut.load(Ordering::Relaxed) || self.transport.is_none();
            // A device with a transport alone in this process (the common case) hands over
            // to itself only: no lock of the registry, no look-up there.
            let alone = self.transport.is_some() && registered() <= 1;
            let reg = (shortcut && !alone).then(|| lock(registry()));
            for (slot, bytes, at, pieces) in outgoing.split() {
                let dest = slot.to.addr();
                let len = bytes.len();
                // A device of this process at that address, unless the address is shared
                // with other processes and the QPN is another one's.
                let peer = match &reg {
                    Some(reg) => reg.get(&dest).and_then(Weak::upgrade),
                    None => (shortcut && dest == self.address).then(|| Arc::clone(self)),
                }
                .filter(|peer| peer.owns_packet(bytes));
                match peer {
                    // Its payload, if left for later, read by the receiver straight into
                    // its region (one copy).
                    Some(peer) => local.push((peer, dest, slot.src_port, at, len, pieces.range)),
                    // An in-process device's multicast: a copy to every device of this
                    // process in the group (a UDP device's goes to the socket, and the
                    // kernel hands a copy to every group socket of the host).
                    None if dest.is_multicast() && self.transport.is_none() => {
                        if let Some(reg) = &reg {
                            for member in group_members(reg, dest) {
                                local.push((
                                    member,
                                    dest,
                                    slot.src_port,
                                    at,
                                    len,
                                    pieces.range.clone(),
                                ));
                            }
                        }
                    }
                    None if self.transport.is_some() => {
                        batch.push(OutgoingPacket::with_deferred(
                            slot.to,
                            slot.src_port,
                            bytes,
                            at,
                            pieces.own,
                        ));
                    }
                    None => {
                        tracing::debug!(to = %slot.to.addr(), "no route for in-process device");
                    }
                }
            }
        }
        if let (Some(transport), false) = (&self.transport, batch.is_empty()) {
            // Still under the send lock: the batch leaves in the order of the run.
            transport.send_batch(&mut batch);
        }
        if batch.capacity() > 0 {
            TRANSPORT_BATCH.with(|cell| *cell.borrow_mut() = reuse(batch));
        }
        if !local.is_empty() {
            // The run's packets are handed over as they were built: the buffer goes with
            // them (the run continues with a spare one), and comes back to the thread's
            // spares when the last is handled.
            let from = self.address;
            let mut run = SPARE_RUNS
                .with(|cell| cell.borrow_mut().pop())
                .unwrap_or_default();
            match Rc::get_mut(&mut run) {
                // The run keeps the spare's buffer (cleared before its next use).
                Some(spare) => std::mem::swap(spare, outgoing),
                None => run = Rc::new(std::mem::take(outgoing)),
            }
            LOCAL_DELIVERY.with(|cell| {
                let mut queue = cell.borrow_mut();
                for (to, dest, src_port, at, len, pieces) in local.drain(..) {
                    queue.1.push_back(HandedOver {
                        to,
                        from,
                        dest,
                        src_port,
                        bytes: Handed::Run {
                            run: Rc::clone(&run),
                            at,
                            len,
                            pieces,
                        },
                        sent: None,
                    });
                }
            });
        }
        LOCAL_TARGETS.with(|cell| *cell.borrow_mut() = local);
        let drain_here = LOCAL_DELIVERY.with(|cell| {
            let mut q = cell.borrow_mut();
            if q.0 || q.1.is_empty() {
                false
            } else {
                q.0 = true;
                true
            }
        });
        // Delivering runs other devices' engines (and, through their answers, this one's
        // again): never while holding the send lock.
        drop(sending);
        if drain_here {
            drain_local();
        }
    }

    /// Handles a packet a device of this process handed over. One that came through the
    /// sender's link (`sent`) is checked as a receiving transport checks it, its ICRC
    /// against its headers, so a corruption injected on the way is a loss here; a device
    /// with a capture records what it accepts, as its `PcapTransport` does on UDP.
    fn receive_handed(
        self: &Arc<Self>,
        from: IpAddr,
        dest: IpAddr,
        src_port: u16,
        bytes: Handed,
        sent: Option<Box<Sent>>,
    ) {
        let accepted = match sent {
            Some(sent) => self.accept_framed(&sent, bytes.bytes(), from),
            None => {
                if let Some(capture) = &self.capture {
                    // The capture fills the payload and the ICRC of its own copy.
                    let mut copy = bytes.bytes().to_vec();
                    let (pieces, origin) = bytes.pieces();
                    if crate::deferred::fill(&mut copy, origin, pieces) {
                        self.record_direct(capture, &mut copy, from, dest, src_port);
                    }
                }
                true
            }
        };
        if accepted {
            let (pieces, origin) = bytes.pieces();
            self.receive(bytes.bytes(), from, dest, (origin, pieces));
        }
        bytes.release();
    }

    /// Checks the ICRC of a packet a sender's link handed over (a bad one is dropped and
    /// counted), and records it in the capture if there is one.
    #[inline(never)]
    fn accept_framed(&self, sent: &Sent, bytes: &[u8], from: IpAddr) -> bool {
        if icrc::verify(&sent.ip, &sent.udp, bytes).is_err() {
            self.handed_bad_icrc.fetch_add(1, Ordering::Relaxed);
            tracing::trace!(%from, reason = "bad ICRC", "dropped a handed-over packet");
            return false;
        }
        if let Some(capture) = &self.capture {
            capture.record(Direction::Inbound, &sent.ip, &sent.udp, bytes);
        }
        true
    }

    /// Records a packet a device without a link handed over directly: with the headers a
    /// sender's transport gives it (`link.rs`), and the ICRC it fills for them.
    #[inline(never)]
    fn record_direct(
        &self,
        capture: &Capture,
        bytes: &mut [u8],
        from: IpAddr,
        dest: IpAddr,
        src_port: u16,
    ) {
        let to = Endpoint::new(dest, self.port());
        let from = Endpoint::new(from, to.port());
        let framed =
            path_headers(&from, &to, src_port, 0, HOP_LIMIT, bytes.len()).and_then(|(ip, udp)| {
                icrc::fill(&ip, &udp, bytes).map_err(invalid_input)?;
                Ok((ip, udp))
            });
        match framed {
            Ok((ip, udp)) => capture.record(Direction::Inbound, &ip, &udp, bytes),
            Err(e) => tracing::debug!(error = %e, %from, "handed-over packet not captured"),
        }
    }

    /// Handles one packet from `from`.
    /// Its payload at `pieces` (offsets from `origin` before `bytes`) is still in the
    /// sender's regions: the writes of the payload read it from there.
    fn receive(
        self: &Arc<Self>,
        bytes: &[u8],
        from: IpAddr,
        dest: IpAddr,
        (origin, pieces): (usize, &[Deferred]),
    ) {
        let grh = grh_bytes(from, dest, bytes.len());
        let now = DeviceClock::now();
        self.run_at(Some(now), false, |st| {
            let State { engine, memory, .. } = st;
            if pieces.is_empty() {
                engine.handle_packet(now, bytes, Some(&grh), memory);
            } else if !crate::deferred::readable_all(pieces) {
                // The sender's memory is gone: the packet is lost (module `deferred`).
                tracing::debug!(%from, "dropped a handed-over packet: its payload is gone");
            } else {
                memory.supply_from(bytes, origin, pieces);
                engine.handle_packet(now, bytes, Some(&grh), memory);
                memory.stop_supplying();
            }
        });
    }

    /// Takes the packets already queued on the transport off it, a batch at a time, and
    /// handles each batch in one run (so its acknowledgements coalesce and leave together).
    /// The caller holds the receive lock. Returns how many packets it handled.
    ///
    /// `fresh`: a clock reading the caller took just before (the application's poll has
    /// one), for the first run; later runs read the clock.
    fn receive_queued(
        self: &Arc<Self>,
        transport: &dyn Transport,
        hold_acks: bool,
        mut fresh: Option<u64>,
        polling: bool,
    ) -> usize {
        let mut handled = 0;
        // Packets in memory first (shared-memory rings, a UDP socket's coalesced
        // datagrams), handled where they lie (no copy into a slot), a batch per run; the
        // state lock is taken only if there is one. (The clock too is read only then: a
        // poll that finds nothing pays nothing.) The ACKs of packets from shared memory
        // are not held ([`HeldAcks`]), those of packets from the socket are.
        for _ in 0..RECEIVE_ROUNDS {
            let mut run = None;
            let mut from_socket = false;
            let count = transport.take_in_place(RECEIVE_SLOTS, &mut |packet, bytes| {
                let (_, st, now) = run.get_or_insert_with(|| {
                    let now = fresh.take().unwrap_or_else(DeviceClock::now);
                    (self.span.enter(), lock(&self.state), now)
                });
                from_socket |= !packet.shared_memory;
                let State { engine, memory, .. } = &mut **st;
                let grh = grh_bytes(packet.from.addr(), packet.to.addr(), bytes.len());
                engine.handle_packet(*now, bytes, Some(&grh), memory);
            });
            if let Some((span, st, now)) = run {
                self.end_run(st, span, Some(now), hold_acks && from_socket);
            }
            handled += count;
            if count < RECEIVE_SLOTS {
                break;
            }
        }
        // A polling application that took packets in place comes back at once: the
        // copying receive waits for a later poll ([`IN_PLACE_STREAK`]). Like the count
        // below, written under the receive lock only.
        let streak = self.in_place_streak.load(Ordering::Relaxed);
        let (copying, next) = copying_receive(polling, handled > 0, streak);
        if next != streak {
            self.in_place_streak.store(next, Ordering::Relaxed);
        }
        if copying {
            handled += self.receive_copied(transport, hold_acks, fresh);
        }
        if handled > 0 {
            // No locked add: every receive holds the receive lock.
            let taken = self.packets_taken.load(Ordering::Relaxed);
            self.packets_taken
                .store(taken.wrapping_add(handled as u64), Ordering::Relaxed);
        }
        handled
    }

    /// The copying receive of [`receive_queued`](Self::receive_queued): packets the
    /// transport copies into the thread's receive slots ([`Transport::recv_batch`]), a
    /// batch per run.
    fn receive_copied(
        self: &Arc<Self>,
        transport: &dyn Transport,
        hold_acks: bool,
        mut fresh: Option<u64>,
    ) -> usize {
        let mut buffers = RECEIVE_BUFFERS
            .with(|cell| cell.borrow_mut().take())
            .unwrap_or_else(|| ReceiveBuffers {
                slots: vec![0u8; RECEIVE_SLOTS * RECEIVE_SLOT_LEN],
                received: Vec::with_capacity(RECEIVE_SLOTS),
            });
        let ReceiveBuffers { slots, received } = &mut buffers;
        let mut handled = 0;
        for _ in 0..RECEIVE_ROUNDS {
            // A slice per slot, made on every receive (an empty poll's too): one length
            // check, no iterator (through `chunks_exact_mut`, ~300 instructions). The
            // buffer stays one flat allocation zeroed by the allocator (`vec![[0; L]; S]`
            // would clone a 36 KiB element from the stack of whatever thread receives
            // first, maybe a C program's small one).
            let (chunks, _) = slots.as_chunks_mut::<RECEIVE_SLOT_LEN>();
            let Ok(chunks) = <&mut [[u8; RECEIVE_SLOT_LEN]; RECEIVE_SLOTS]>::try_from(chunks)
            else {
                unreachable!("the receive buffer holds RECEIVE_SLOTS slots");
            };
            let mut bufs: [&mut [u8]; RECEIVE_SLOTS] =
                chunks.each_mut().map(|slot| slot.as_mut_slice());
            let count = match transport.recv_batch(&mut bufs, received, Some(Duration::ZERO)) {
                Ok(count) => count,
                Err(e) => {
                    tracing::warn!(error = %e, "receive failed");
                    break;
                }
            };
            if count == 0 {
                break;
            }
            handled += count;
            let now = fresh.take().unwrap_or_else(DeviceClock::now);
            self.run_at(Some(now), hold_acks, |st| {
                let State { engine, memory, .. } = st;
                for (packet, buf) in received.iter().zip(bufs.iter()) {
                    let Some(bytes) = buf.get(..packet.len) else {
                        continue;
                    };
                    // To the device's address, or to a multicast group it is in.
                    let grh = grh_bytes(packet.from.addr(), packet.to.addr(), bytes.len());
                    engine.handle_packet(now, bytes, Some(&grh), memory);
                }
            });
            if count < RECEIVE_SLOTS {
                break;
            }
        }
        RECEIVE_BUFFERS.with(|cell| *cell.borrow_mut() = Some(buffers));
        handled
    }

    /// While the application waits for its events where the packets wake it (a non-blocking
    /// channel's fd, `Awaited::Watched`), the progress thread leaves them to it; but a
    /// wake-up can be lost (a shared-memory doorbell drained by another waiter first, a
    /// packet the fault layer held back), and the application may not come back to its fd
    /// for a while. A packet found waiting at two looks a nap apart, with nothing received
    /// by anyone in between, is taken here.
    fn take_stuck_packets(self: &Arc<Self>, transport: &dyn Transport) -> usize {
        if !transport.pending_packets() {
            self.stuck_look.store(NO_LOOK, Ordering::Relaxed);
            return 0;
        }
        let taken = self.packets_taken.load(Ordering::Relaxed);
        if self.stuck_look.swap(taken, Ordering::Relaxed) != taken {
            // The first look, or someone received since the last.
            return 0;
        }
        self.stuck_look.store(NO_LOOK, Ordering::Relaxed);
        match self.rx.try_lock() {
            Ok(_receiving) => self.receive_queued(transport, false, None, false),
            Err(_) => 0,
        }
    }

    /// One round of progress: receive (waiting up to `wait`, or until the next deadline
    /// when `None`), handle, and run due timers. `polling`: the application's poll of an
    /// empty CQ, which comes back at once ([`IN_PLACE_STREAK`]).
    /// Returns how many packets it received.
    pub(super) fn progress_once(
        self: &Arc<Self>,
        now: u64,
        wait: Option<Duration>,
        polling: bool,
    ) -> usize {
        // ACKs held for a post that did not come leave now, before anything else.
        if self.acks_held.load(Ordering::Relaxed) && self.send_held_acks() {
            self.progress_ack_sends.fetch_add(1, Ordering::Relaxed);
        }
        let mut received = 0;
        let deadline = self.next_deadline.load(Ordering::Relaxed);
        let until_deadline =
            (deadline != u64::MAX).then(|| Duration::from_nanos(deadline.saturating_sub(now)));
        let timeout = match (wait, until_deadline) {
            (Some(w), Some(d)) => w.min(d),
            (Some(w), None) => w,
            (None, Some(d)) => d.min(PROGRESS_TICK),
            (None, None) => PROGRESS_TICK,
        };
        let app_is_polling = wait.is_none() && self.app_receives(now);
        match &self.transport {
            Some(_) if app_is_polling => {
                // The application receives for itself; only timers, and ACKs it held but
                // did not send (it stopped posting and polling), are ours.
                let nap = if self.acks_held.load(Ordering::Relaxed) {
                    ACK_HOLD_LIMIT
                } else {
                    polling_nap(self.shortest_ack_timeout.load(Ordering::Relaxed))
                };
                self.progress_naps.fetch_add(1, Ordering::Relaxed);
                // Parked, not asleep: an application about to block elsewhere
                // (`Device::app_waits`), a CQ armed (`cq_armed`), or the device closing,
                // cuts the nap short. Announced first, then looked at again (SeqCst both
                // ways): an arm either sees the nap and unparks, or is seen here.
                self.napping.store(true, Ordering::SeqCst);
                match self.events_awaited_elsewhere(now) {
                    Awaited::Elsewhere => {}
                    Awaited::NotYet(left) => std::thread::park_timeout(timeout.min(nap).min(left)),
                    // A CQ armed while the application waits through the channel service:
                    // it may go on to wait on the channel's fd instead, unseen (an arm right
                    // after such a wait does not wake this thread).
                    Awaited::Watched => {
                        std::thread::park_timeout(timeout.min(nap).min(ARMED_RECHECK));
                        if let Some(transport) = &self.transport {
                            received += self.take_stuck_packets(&**transport);
                        }
                    }
                    Awaited::Polled => {
                        std::thread::park_timeout(timeout.min(nap).min(ARMED_RECHECK))
                    }
                    Awaited::No if self.armed_hint.load(Ordering::Relaxed) => {
                        std::thread::park_timeout(timeout.min(nap).min(ARMED_RECHECK))
                    }
                    Awaited::No => std::thread::park_timeout(timeout.min(nap)),
                }
                self.napping.store(false, Ordering::Relaxed);
            }
            Some(transport) => {
                // Wait without the receive lock; then take packets off and handle them
                // under it, so two receiving threads cannot swap two packets.
                if wait.is_none() {
                    if let Err(e) = transport.wait_readable(timeout) {
                        tracing::warn!(error = %e, "waiting for packets failed");
                        std::thread::sleep(PROGRESS_TICK);
                    }
                }
                let receiving = if wait.is_none() {
                    // The application may have started polling while this thread waited,
                    // or be receiving now (holding the lock through a long run): the
                    // packets are its. Queueing behind it for the lock would have this
                    // thread woken as the application lets go, and take the core from it
                    // (a core they share) just when its completions are in the CQ.
                    // The lock is tried only when the packets are this thread's: a guard
                    // taken for nothing was held through the sleep below (the match's
                    // scrutinee lives to its end), and the application's receives in that
                    // time found the lock taken and went back to sleep without the packet
                    // that woke them.
                    let polling = self.app_receives(DeviceClock::now());
                    match (!polling).then(|| self.rx.try_lock().ok()).flatten() {
                        Some(receiving) => Some(receiving),
                        None => {
                            std::thread::sleep(ACK_HOLD_LIMIT);
                            None
                        }
                    }
                } else {
                    let got = self.rx.try_lock().ok();
                    if got.is_none() {
                        // Another thread is receiving. If it was preempted while holding the
                        // lock, a polling application spinning here would keep it off the
                        // CPU, and nobody would receive: give it the core.
                        std::thread::yield_now();
                    }
                    got
                };
                if let Some(_receiving) = receiving {
                    // The application's own poll (`wait` given) holds the ACKs of what it
                    // receives for its next post; the progress thread sends them.
                    // A call that does not wait (the application's poll) read the clock
                    // just before.
                    let fresh = wait.is_some_and(|w| w.is_zero()).then_some(now);
                    received += self.receive_queued(&**transport, wait.is_some(), fresh, polling);
                }
                if self.tap.is_some() {
                    // Receiving released packets the fault layer held back: those for
                    // devices of this process are queued.
                    deliver_local();
                }
            }
            None => {
                // Packets the fault layer holds back (delay, reorder) are released by this
                // thread: it wakes up in time for them.
                let timeout = match &self.fault_layer {
                    Some(faults) if faults.held() > 0 => timeout.min(HELD_PACKETS_TICK),
                    _ => timeout,
                };
                if !timeout.is_zero() {
                    let st = lock(&self.state);
                    if !self.shutdown.load(Ordering::Acquire) {
                        self.sleeping_until.store(
                            now.saturating_add(timeout.as_nanos() as u64),
                            Ordering::Relaxed,
                        );
                        let (st, _) = self
                            .wake
                            .wait_timeout(st, timeout)
                            .unwrap_or_else(|e| e.into_inner());
                        self.sleeping_until.store(0, Ordering::Relaxed);
                        drop(st);
                    }
                }
                self.release_held();
            }
        }
        // After a wait the clock has moved; a non-waiting call reuses its reading.
        let now = if wait.is_some_and(|w| w.is_zero()) {
            now
        } else {
            DeviceClock::now()
        };
        if self.next_deadline.load(Ordering::Relaxed) <= now {
            // `None`: another thread is receiving; it runs the timers once it has.
            if let Some(more) = self.receive_before_timers() {
                received += more;
                self.run_due_timers(now);
            }
        }
        received
    }

    /// Sends the ACKs a receive run held ([`HeldAcks`]); whether there were any.
    pub(super) fn send_held_acks(self: &Arc<Self>) -> bool {
        let mut guard = lock(&self.tx);
        if !self.acks_held.swap(false, Ordering::Relaxed) {
            return false;
        }
        let mut outgoing = std::mem::take(&mut guard.0);
        self.send_all(&mut outgoing, guard);
        outgoing.clear();
        // Give the arena back for the next hold.
        let mut guard = lock(&self.tx);
        if guard.0.packets.is_empty() {
            guard.0 = outgoing;
        }
        true
    }

    /// Handles everything already waiting on the transport before a timer fires, so an
    /// ACK that arrived in time is never taken for a loss (a local ACK timeout fires only
    /// when no acknowledgement came within the timeout: IBTA 9.7.6.1.3). A busy
    /// application thread, or a progress thread that left the socket to a polling
    /// application, would otherwise fire timers with the answers unread in the socket.
    /// Bounded: at most [`DRAIN_BEFORE_TIMERS`] batches. `None` when another thread holds
    /// the receive lock (it runs the timers after receiving); the packets handled
    /// otherwise.
    fn receive_before_timers(self: &Arc<Self>) -> Option<usize> {
        let Some(transport) = &self.transport else {
            return Some(0);
        };
        let _receiving = self.rx.try_lock().ok()?;
        let mut handled = 0;
        for _ in 0..DRAIN_BEFORE_TIMERS {
            let got = self.receive_queued(&**transport, false, None, false);
            handled += got;
            if got == 0 {
                break;
            }
        }
        Some(handled)
    }

    /// Sends the packets the fault layer of an in-process device held back (delay,
    /// reorder) that are due, and delivers them. Nothing without fault injection.
    #[inline(never)]
    pub(super) fn release_held(&self) {
        if let Some(faults) = &self.fault_layer {
            if let Err(e) = faults.release_due() {
                tracing::debug!(error = %e, "releasing held packets failed");
            }
            deliver_local();
        }
    }

    /// Runs the engine's timers and the CQs' moderation timers that are due at `now`.
    pub(super) fn run_due_timers(self: &Arc<Self>, now: u64) {
        self.run(|st| {
            if st.engine.poll_timeout().is_some_and(|d| d <= now) {
                st.engine.handle_timeout(now);
            }
            // Each CQ once, however many QPs complete into it.
            for cq in st.cqs.values() {
                cq.moderation_timer(now);
            }
        });
    }
}

/// Whether a receive that `took_in_place` packets (by the application's poll if `polling`)
/// goes on to the copying receive, after `streak` that did not; and the streak after it
/// ([`IN_PLACE_STREAK`]).
fn copying_receive(polling: bool, took_in_place: bool, streak: u32) -> (bool, u32) {
    let copying = !polling || !took_in_place || streak >= IN_PLACE_STREAK;
    (copying, if copying { 0 } else { streak + 1 })
}

/// Sends every packet through a device's capture and fault stack, whose link queues what
/// it hands to devices of this process; then delivers those (other devices' engines run:
/// never while holding the send lock).
#[inline(never)]
fn send_through(stack: &dyn Transport, outgoing: &mut Outgoing, sending: MutexGuard<'_, HeldAcks>) {
    let mut batch: Vec<OutgoingPacket<'_>> = outgoing
        .split()
        // (A device with a stack reads no payload for later: `pieces` is empty.)
        .filter_map(|(slot, bytes, at, pieces)| {
            crate::deferred::fill(bytes, at, pieces.own)
                .then(|| OutgoingPacket::new(slot.to, slot.src_port, bytes))
        })
        .collect();
    stack.send_batch(&mut batch);
    drop(batch);
    drop(sending);
    deliver_local();
}

/// `spare`'s room, emptied, for packets of another lifetime: a batch borrows the bytes
/// of one run, and its vector serves the next run's (no allocation per run).
fn reuse<'b>(mut spare: Vec<OutgoingPacket<'_>>) -> Vec<OutgoingPacket<'b>> {
    spare.clear();
    let mut spare = std::mem::ManuallyDrop::new(spare);
    let (ptr, capacity) = (spare.as_mut_ptr(), spare.capacity());
    // SAFETY: the allocation is handed over whole (`spare` is not dropped) to a vector of
    // the same type but for a lifetime, so of the same layout, with no element: no packet
    // of the old lifetime is reachable through it.
    unsafe { Vec::from_raw_parts(ptr.cast::<OutgoingPacket<'b>>(), 0, capacity) }
}

/// Queues a packet the link of a device with a capture or faults hands to `to`, a device
/// of this process, with the headers it prepared (`sent`); [`deliver_local`] delivers it.
pub(super) fn hand_over(to: Arc<DeviceInner>, dest: IpAddr, sent: &Sent, bytes: Vec<u8>) {
    let handed = HandedOver {
        to,
        from: sent.from.addr(),
        dest,
        src_port: sent.udp.src_port,
        bytes: Handed::Own(bytes),
        sent: Some(Box::new(*sent)),
    };
    LOCAL_DELIVERY.with(|cell| cell.borrow_mut().1.push_back(handed));
}

/// Delivers the packets queued for devices of this process, unless a run further up this
/// thread's stack is already delivering them (it will deliver these too, in order).
fn deliver_local() {
    let drain_here = LOCAL_DELIVERY.with(|cell| {
        let mut q = cell.borrow_mut();
        if q.0 || q.1.is_empty() {
            false
        } else {
            q.0 = true;
            true
        }
    });
    if drain_here {
        drain_local();
    }
}

/// Delivers the queue of packets for devices of this process; the caller set its flag.
fn drain_local() {
    while let Some(HandedOver {
        to,
        from,
        dest,
        src_port,
        bytes,
        sent,
    }) = LOCAL_DELIVERY.with(|cell| cell.borrow_mut().1.pop_front())
    {
        to.receive_handed(from, dest, src_port, bytes, sent);
    }
    LOCAL_DELIVERY.with(|cell| cell.borrow_mut().0 = false);
}

/// The earliest deadline of the engine's timers and of the CQs' moderation periods.
fn next_deadline(st: &State) -> u64 {
    let mut deadline = st.engine.poll_timeout().unwrap_or(u64::MAX);
    // Each CQ once, and only while some CQ of the process is moderated (none has a
    // deadline otherwise): a run costs nothing per CQ, as it costs nothing per QP.
    if softverbs_cq::moderation_in_use() {
        for cq in st.cqs.values() {
            if let Some(d) = cq.moderation_deadline() {
                deadline = deadline.min(d);
            }
        }
    }
    deadline
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    /// A polling application whose polls keep taking packets in place leaves the copying
    /// receive (`Transport::recv_batch`: a ring's records kept for it, a socket without
    /// GRO, the multicast sockets) to a later poll, never more than `IN_PLACE_STREAK` in
    /// a row, so what only that receive takes is never starved; a poll that took nothing,
    /// the progress thread and a thread waiting for an event always go on to it.
    #[test]
    fn a_polling_receive_leaves_the_copying_receive_to_a_later_poll_eight_times_at_most() {
        let mut streak = 0;
        let mut left = 0;
        let mut copying_polls = 0;
        for _ in 0..100 {
            let (copying, next) = copying_receive(true, true, streak);
            if copying {
                assert_eq!(left, IN_PLACE_STREAK);
                copying_polls += 1;
                left = 0;
            } else {
                left += 1;
            }
            streak = next;
        }
        assert_eq!(copying_polls, 100 / (IN_PLACE_STREAK as usize + 1));
        assert_eq!(copying_receive(true, false, 3), (true, 0));
        assert_eq!(copying_receive(false, true, 0), (true, 0));
        assert_eq!(copying_receive(true, true, 0), (false, 1));
    }

    /// While the application polls, the progress thread wakes once per sixteenth of the
    /// shortest local ACK timeout (IBTA 9.7.6.1.3: 4.096 µs · 2^timeout), never more often
    /// than once a millisecond nor less often than once per 5 ms.
    #[test]
    fn the_progress_thread_naps_a_sixteenth_of_the_ack_timeout_between_1_and_5_ms() {
        let timeout = |t: u32| 4096u64 << t;
        let ms = |n: f64| Duration::from_nanos((n * 1e6) as u64);
        // No RC QP: nothing to answer in time.
        assert_eq!(polling_nap(u64::MAX), PROGRESS_TICK);
        // ibv_rc_pingpong's and perftest's 14 (67.1 ms): 4.19 ms.
        assert_eq!(polling_nap(timeout(14)), Duration::from_nanos(4_194_304));
        assert_eq!(polling_nap(timeout(13)), Duration::from_nanos(2_097_152));
        // 16.8 ms and below: the 1 ms of before.
        assert_eq!(polling_nap(timeout(12)), Duration::from_nanos(1_048_576));
        assert_eq!(polling_nap(timeout(11)), ms(1.0));
        assert_eq!(polling_nap(timeout(1)), ms(1.0));
        // 268 ms and above (rdma_cm's 18 is 1.07 s): 5 ms.
        assert_eq!(polling_nap(timeout(16)), ms(5.0));
        assert_eq!(polling_nap(timeout(31)), ms(5.0));
    }

    /// A run with one packet per byte string, built as the engine builds them: into the
    /// room after the packets before.
    fn run_of(packets: &[&[u8]]) -> Outgoing {
        let mut run = Outgoing::default();
        for bytes in packets {
            run.room(PACKET_ROOM)[..bytes.len()].copy_from_slice(bytes);
            run.push(OutgoingSlot {
                to: Endpoint::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 4791),
                src_port: bytes.len() as u16,
                len: bytes.len(),
            });
        }
        run
    }

    fn packets(run: &mut Outgoing) -> Vec<(u16, Vec<u8>)> {
        run.split()
            .map(|(slot, bytes, _, _)| (slot.src_port, bytes.to_vec()))
            .collect()
    }

    /// Held ACKs go first, then the run's packets, each with its bytes; the room after the
    /// packets is not part of them.
    #[test]
    fn held_packets_are_prepended_and_appended_whole_and_in_order() {
        let mut run = run_of(&[b"third", b"fourth!"]);
        let held = run_of(&[b"1", b"second"]);
        run.prepend(&held);
        let expected: Vec<(u16, Vec<u8>)> = [&b"1"[..], b"second", b"third", b"fourth!"]
            .iter()
            .map(|b| (b.len() as u16, b.to_vec()))
            .collect();
        assert_eq!(packets(&mut run), expected);
        assert_eq!(run.filled(), b"1secondthirdfourth!");
        let mut more = run_of(&[b"x"]);
        more.append(&run);
        assert_eq!(more.filled(), b"x1secondthirdfourth!");
        assert_eq!(more.packets.len(), 5);
        run.clear();
        assert!(packets(&mut run).is_empty());
        assert!(run.filled().is_empty());
    }
}
