//! Completion channels (`ibv_create_comp_channel(3)`, `ibv_get_cq_event(3)`): one channel
//! serves many CQs; each event names its CQ and the CQ's user context.
//!
//! The channel is a pollable file descriptor, so it works blocking, non-blocking
//! (`O_NONBLOCK` gives `EAGAIN`) and from `poll`/`epoll`, exactly as the fd of a libibverbs
//! channel. The fd is an epoll set; in it, an `eventfd` in semaphore mode holds one count per
//! queued event (the counts below are that eventfd's). Events sit in a queue beside it; the
//! queue's lock is also what orders event delivery against CQ destruction.
//!
//! The protocol that keeps the two consistent: a deliverer queues the event (under the
//! lock), then adds its count to the fd. Whoever removes an event from the queue (a getter,
//! or a destroy withdrawing it) then removes exactly one count, waiting the moment it may
//! take for the deliverer's write to land. Getters wait with `poll(POLLIN)`, never by
//! reading the fd, so two getters racing for one event cannot leave one of them blocked in
//! `read` with nothing to come.
//!
//! One exception saves the two system calls per event of an application that waits in
//! `get_event`: while a thread spins there (before it sleeps), a deliverer queues its event
//! *uncounted* (no write), and the spinner takes it without a read. The fd then stays
//! unreadable for an event that a spinner takes within microseconds, as it would once that
//! spinner's read had consumed its count. The last spinner to stop spinning without taking
//! them writes the counts of the uncounted events left, so a thread asleep on the fd (in
//! `get_event` or its own `poll`/`epoll`) is woken for them.
//!
//! A thread that sleeps on the fd with its own `poll`/`epoll` (UCX's and libfabric's event
//! loops, tokio) is woken by the device's packets themselves while the fd is non-blocking:
//! the channel then puts the device's readiness fd ([`CompletionChannel::set_wait_progress`])
//! into its epoll set, and a non-blocking `get_event` that finds no event receives once
//! (the device's progress step) before it answers `EAGAIN`. The thread receives the packet
//! that makes its completion and takes the event in the same wake-up, instead of being
//! woken by the device's progress thread after it received the packet (two wake-ups). A
//! readable fd then no longer promises an event, which a non-blocking getter answers with
//! `EAGAIN` as after a race with another getter; a blocking one would sleep in `get_event`
//! instead of in its `poll`, so a blocking fd (libibverbs' default, and what a `poll` with a
//! timeout before a blocking `ibv_get_cq_event` relies on) keeps the readiness out. The
//! mode is looked at when a CQ of the channel is first armed, whenever a getter finds no
//! event, and when [`CompletionChannel::set_nonblocking`] changes it. A device whose
//! peers write into memory wakes such a thread only while it counts it a sleeper: the
//! channel counts one from an arm of one of its CQs until an event comes or a non-blocking
//! `get_event` finds the thread awake (the wait progress's `sleeping(true)` /
//! `sleeping(false)`; a getter that finds no event and so sleeps again counts again).
//!
//! Only a channel that is the sole channel of its device's CQs joins the readiness (and
//! only on a device without a shared-memory inbox, whose progress thread takes a peer's
//! record sooner than a doorbell wakes a sleeper: the device's `alone` says so): with
//! two (UCX's `rc_verbs` and `ud_verbs` interfaces, each with its channel, one served by
//! UCX's main thread, the other by its async thread), every packet would wake both
//! threads, and one's receive would make completions in the other's CQs between its
//! `ibv_get_cq_event` until `EAGAIN` and its arm (below): `ucx_perftest -E sleep` then hung
//! in most runs, both processes asleep. Such a channel's sleeper is woken by the progress
//! thread, as with a blocking fd.
//!
//! Such a getter receives only while every CQ with a channel of its device is armed. UCX
//! takes its events with `ibv_get_cq_event` until `EAGAIN`, then arms its CQs and sleeps,
//! with no poll in between (a ConnectX CQ armed while it holds completions raises an event
//! at once; by `ibv_req_notify_cq(3)` an event is for a new completion only, as here): a
//! completion made by that last `EAGAIN` call, in a CQ not yet armed, would raise no
//! event, and UCX would sleep on it (two `ucx_perftest -E sleep` processes, each waiting
//! for the other). Unreceived packets keep the fd readable (the socket; the doorbell, rung
//! for the sleeper counted at the arm), so the thread wakes again at once and receives
//! once all are armed, or in its own progress.
//!
//! In Rust a [`CqEvent`] acknowledges itself when dropped; the counted form
//! ([`CqEvent::into_unacknowledged`] then `ack_events(n)` on the CQ) is there for the C side.
//!
//! Waking a thread blocked in the kernel costs tens of microseconds on a virtual machine, so
//! a blocking [`CompletionChannel::get_event`] first spins for a short, configurable time
//! ([`CompletionChannel::set_spin`]) watching the queue, and receiving the device's packets
//! itself when the device gave the channel its progress step
//! ([`CompletionChannel::set_wait_progress`]).
//!
//! All the channel knows of a CQ is its event source (`CqEventSource`, here): the CQ's
//! identity, user context, channel attachment and event counts, which every queued or taken
//! event holds. The CQ (`cq/`) owns one and imports this module; this module never names
//! the CQ, so the dependency runs one way only.

use crate::error::DestroyError;
use crate::sync::{lock, Arc, AtomicU64, AtomicUsize, Condvar, Mutex, MutexGuard, Ordering};
use std::collections::VecDeque;
use std::fmt;
use std::io;
#[cfg(not(loom))]
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::Duration;

/// How long a blocking `get_event` spins before sleeping, by default.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(20);

/// Spin rounds (`std::hint::spin_loop`) between two runs of a channel's wait progress in
/// the spin phase of a blocking wait, and between two looks at the clock. Without the
/// runs, a completion that needs a packet received (a device on UDP or shared memory)
/// could only come from the device's progress thread, asleep in the kernel: `ib_send_lat
/// -e -s 8` over UDP took 16 us one way where busy polling takes 4.4 (3.6x), with them
/// 6.2 us (1.4x); on shared memory 13 -> 2.9 us (polling 1.5). Every 64 rounds gave 6.5 us,
/// every 4, 6.0: a run that finds nothing costs a system call on UDP (~0.5 us) and nothing
/// on shared memory.
#[cfg(not(loom))]
const SPINS_PER_PROGRESS: u32 = 16;

/// What a CQ's events point back to: the CQ's identity and user context, the channel it
/// is attached to, and the events raised and acknowledged. The CQ's shared state owns one
/// (`cq/mod.rs`) and every event on the queue or in the application's hands holds it, so
/// it lives until the CQ and all its events are gone; only then does the CQ stop counting
/// as attached to its channel ([`CompletionChannel::attached_cqs`]).
pub(crate) struct CqEventSource {
    id: u64,
    user_context: AtomicU64,
    channel: Option<Arc<ChannelInner>>,
    counts: Mutex<EventCounts>,
    /// Notified by an acknowledgement while a destroy waits for one.
    acked_cv: Condvar,
}

/// A CQ's event counts, under the source's lock.
#[derive(Default)]
pub(crate) struct EventCounts {
    /// Events put on the channel (minus those purged unread at destroy).
    pub(crate) raised: u64,
    pub(crate) acked: u64,
    /// Threads waiting in `destroy_wait` for an ack (an ack wakes them only if any).
    pub(crate) waiters: u32,
}

impl CqEventSource {
    /// The source of the CQ `id`; counts the CQ as attached to `channel` until dropped.
    pub(crate) fn new(id: u64, user_context: u64, channel: Option<Arc<ChannelInner>>) -> Self {
        if let Some(ch) = &channel {
            ch.attached.fetch_add(1, Ordering::Relaxed);
        }
        CqEventSource {
            id,
            user_context: AtomicU64::new(user_context),
            channel,
            counts: Mutex::new(EventCounts::default()),
            acked_cv: Condvar::new(),
        }
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn user_context(&self) -> u64 {
        self.user_context.load(Ordering::Relaxed)
    }

    pub(crate) fn set_user_context(&self, context: u64) {
        self.user_context.store(context, Ordering::Relaxed);
    }

    /// The channel the CQ's events go to.
    pub(crate) fn channel(&self) -> Option<&Arc<ChannelInner>> {
        self.channel.as_ref()
    }

    /// The event counts, locked. Taken after the channel's queue lock when both are held.
    pub(crate) fn counts(&self) -> MutexGuard<'_, EventCounts> {
        lock(&self.counts)
    }

    /// What a destroy waiting for an acknowledgement waits on (with `waiters` counted).
    pub(crate) fn acked_cv(&self) -> &Condvar {
        &self.acked_cv
    }

    pub(crate) fn raised(&self) -> u64 {
        self.counts().raised
    }

    pub(crate) fn note_raised(&self) {
        self.counts().raised += 1;
    }

    pub(crate) fn note_purged(&self, n: u64) {
        self.counts().raised -= n;
    }

    pub(crate) fn ack(&self, n: u64) {
        let mut ev = self.counts();
        ev.acked += n;
        let waiters = ev.waiters;
        drop(ev);
        // A futex wake is a system call: only when a destroy is waiting for this ack.
        if waiters > 0 {
            self.acked_cv.notify_all();
        }
    }
}

impl Drop for CqEventSource {
    fn drop(&mut self) {
        if let Some(ch) = &self.channel {
            ch.attached.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

pub(crate) struct QueuedEvent {
    cq: Arc<CqEventSource>,
}

impl QueuedEvent {
    pub(crate) fn new(cq: Arc<CqEventSource>) -> Self {
        QueuedEvent { cq }
    }

    pub(crate) fn id(&self) -> u64 {
        self.cq.id()
    }
}

pub(crate) struct ChannelInner {
    /// The channel's fd: an epoll set of `counts` and, while joined, the wait progress's fd.
    #[cfg(not(loom))]
    fd: OwnedFd,
    /// The eventfd of the events' counts (semaphore mode, non-blocking).
    #[cfg(not(loom))]
    counts: OwnedFd,
    /// Whether the wait progress's fd is in the epoll set: [`READINESS_UNCHECKED`],
    /// [`READINESS_APART`] or [`READINESS_JOINED`] (module doc).
    #[cfg(not(loom))]
    readiness: std::sync::atomic::AtomicU8,
    /// Held while the readiness joins or leaves the epoll set.
    #[cfg(not(loom))]
    joining: std::sync::Mutex<()>,
    /// The fd's `O_NONBLOCK` when it was last looked at.
    #[cfg(not(loom))]
    nonblocking_seen: std::sync::atomic::AtomicBool,
    /// Whether the channel counts a thread asleep on its fd as the wait progress's sleeper
    /// (from an arm of one of its CQs while joined until the next non-blocking getter).
    #[cfg(not(loom))]
    own_sleeper: std::sync::atomic::AtomicBool,
    queue: Mutex<EventQueue>,
    /// Events queued and not yet taken (mirrors the queue length for the spin phase).
    queued: AtomicUsize,
    /// CQs using this channel. (Event-fd counts of events withdrawn at CQ destruction stay
    /// behind; a getter that consumes one finds the queue empty and waits again.)
    attached: AtomicUsize,
    spin_ns: AtomicU64,
    /// System calls made on the event fd to add or remove counts
    /// ([`CompletionChannel::fd_calls`]).
    #[cfg(not(loom))]
    fd_calls: std::sync::atomic::AtomicU64,
    /// What a blocked getter does besides watching the fd
    /// ([`CompletionChannel::set_wait_progress`]).
    #[cfg(not(loom))]
    progress: std::sync::OnceLock<WaitProgress>,
}

/// The channel's fd has not been looked at since the wait progress was set.
#[cfg(not(loom))]
const READINESS_UNCHECKED: u8 = 0;
/// The fd is blocking (or has no wait progress): the readiness fd is not in its epoll set.
#[cfg(not(loom))]
const READINESS_APART: u8 = 1;
/// The fd is non-blocking: the readiness fd is in its epoll set.
#[cfg(not(loom))]
const READINESS_JOINED: u8 = 2;

/// A second fd a blocked getter watches, and the work it does when that fd is readable.
#[cfg(not(loom))]
struct WaitProgress {
    fd: OwnedFd,
    /// The device's progress step; `true` when the thread goes back to sleep on the fd
    /// with its own `poll` after it (a non-blocking getter, an arm): the device must leave
    /// nothing for the thread's next call (ACKs held for its next post), and must not make
    /// a completion in a CQ that thread has yet to arm (module doc).
    run: Box<dyn Fn(bool) + Send + Sync>,
    /// Called with `true` before the thread sleeps on `fd` (returning true if there is
    /// work already, so it does not sleep) and with `false` after.
    sleeping: Box<dyn Fn(bool) -> bool + Send + Sync>,
    /// Called with `true` when a getter starts to wait (no event was there: it spins, then
    /// sleeps) and with `false` when it stops (event, timeout or error).
    waiting: Box<dyn Fn(bool) + Send + Sync>,
    /// Whether the channel is the only one of the device's CQs (module doc): only then do
    /// the device's packets wake the thread asleep on it.
    alone: Box<dyn Fn() -> bool + Send + Sync>,
}

/// A getter's whole wait (spin and sleep), told to the wait progress's `waiting`; ended
/// when dropped, whichever way the wait ends.
#[cfg(not(loom))]
struct Waiting<'a>(Option<&'a WaitProgress>);

#[cfg(not(loom))]
impl<'a> Waiting<'a> {
    fn start(progress: Option<&'a WaitProgress>) -> Self {
        if let Some(progress) = progress {
            (progress.waiting)(true);
        }
        Waiting(progress)
    }
}

#[cfg(not(loom))]
impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(progress) = self.0 {
            (progress.waiting)(false);
        }
    }
}

/// The queued events, and the bookkeeping of the events queued without their count on the
/// fd while a getter spins (module doc).
pub(crate) struct EventQueue {
    events: VecDeque<QueuedEvent>,
    /// Getters in the spin phase of a blocking wait.
    spinners: usize,
    /// Queued events whose count is not on the fd (at most `events.len()`).
    uncounted: usize,
}

impl std::ops::Deref for EventQueue {
    type Target = VecDeque<QueuedEvent>;
    fn deref(&self) -> &Self::Target {
        &self.events
    }
}

impl std::ops::DerefMut for EventQueue {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.events
    }
}

impl ChannelInner {
    pub(crate) fn lock_queue(&self) -> MutexGuard<'_, EventQueue> {
        lock(&self.queue)
    }

    /// Counts one event just queued in `queue` (whose lock the caller holds, so `queued`
    /// always equals the queue length once it is released). Returns whether its count is
    /// to be written to the fd ([`ChannelInner::wake_one`], after the lock is released):
    /// not while a getter spins, which takes it without a read (module doc).
    pub(crate) fn note_queued(&self, queue: &mut EventQueue) -> bool {
        self.queued.fetch_add(1, Ordering::Release);
        if queue.spinners > 0 {
            queue.uncounted += 1;
            false
        } else {
            true
        }
    }

    /// Wakes one getter: one more count on the event fd. Called after queueing an event,
    /// outside the queue lock.
    pub(crate) fn wake_one(&self) {
        self.add_counts(1);
    }

    /// Adds `n` counts to the event fd.
    fn add_counts(&self, n: u64) {
        #[cfg(not(loom))]
        {
            // An eventfd write fails only if the counter would overflow, which 2^64-2
            // queued events cannot reach.
            let _ = rustix::io::write(&self.counts, &n.to_ne_bytes());
            self.fd_calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        #[cfg(loom)]
        let _ = n;
    }

    /// Records `n` events withdrawn from `queue` (whose lock the caller holds) and removes
    /// their counts from the fd (uncounted ones first: they have none).
    pub(crate) fn note_purged(&self, queue: &mut EventQueue, n: usize) {
        self.queued.fetch_sub(n, Ordering::Release);
        let uncounted = n.min(queue.uncounted);
        queue.uncounted -= uncounted;
        for _ in uncounted..n {
            self.consume_count();
        }
    }

    /// Removes one event's count from the fd. The count was written, or is about to be, by
    /// the deliverer of an event the caller just removed from the queue, so this waits at
    /// most for that write.
    fn consume_count(&self) {
        #[cfg(not(loom))]
        {
            let mut buf = [0u8; 8];
            loop {
                self.fd_calls
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                match rustix::io::read(&self.counts, &mut buf) {
                    Ok(_) => return,
                    Err(rustix::io::Errno::INTR) => {}
                    // The write has not landed yet: it is imminent.
                    Err(rustix::io::Errno::AGAIN) => std::thread::yield_now(),
                    Err(_) => return,
                }
            }
        }
    }

    /// Takes the next event and its fd count (none if an uncounted event is queued).
    fn pop(&self) -> Option<QueuedEvent> {
        let mut queue = self.lock_queue();
        let ev = queue.events.pop_front();
        let mut counted = ev.is_some();
        if counted {
            self.queued.fetch_sub(1, Ordering::Release);
            if queue.uncounted > 0 {
                queue.uncounted -= 1;
                counted = false;
            }
        }
        drop(queue);
        if counted {
            self.consume_count();
        }
        ev
    }

    /// A getter starts spinning: events queued from now on are left uncounted.
    #[cfg(not(loom))]
    fn start_spinning(&self) {
        self.lock_queue().spinners += 1;
    }

    /// A getter stops spinning; the last one writes the counts of the uncounted events
    /// left, so that a sleeper on the fd sees them.
    #[cfg(not(loom))]
    fn stop_spinning(&self) {
        let mut queue = self.lock_queue();
        queue.spinners -= 1;
        let left = if queue.spinners == 0 {
            std::mem::take(&mut queue.uncounted)
        } else {
            0
        };
        drop(queue);
        if left > 0 {
            self.add_counts(left as u64);
        }
    }

    /// Puts the wait progress's fd into the epoll set while the channel's fd is
    /// non-blocking, and takes it out while it is blocking (module doc). Nothing without a
    /// wait progress; if the kernel refuses, the readiness stays apart.
    #[cfg(not(loom))]
    fn sync_readiness(&self, nonblocking: bool) {
        use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
        let Some(progress) = self.progress.get() else {
            return;
        };
        self.nonblocking_seen.store(nonblocking, Relaxed);
        let joins = nonblocking && (progress.alone)();
        let want = if joins {
            READINESS_JOINED
        } else {
            READINESS_APART
        };
        if self.readiness.load(Acquire) == want {
            return;
        }
        let _joining = self
            .joining
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = self.readiness.load(Acquire);
        if now == want {
            return;
        }
        use rustix::event::epoll;
        if joins {
            let added = epoll::add(
                &self.fd,
                &progress.fd,
                epoll::EventData::new_u64(1),
                epoll::EventFlags::IN,
            );
            if added.is_err() {
                self.readiness.store(READINESS_APART, Release);
                return;
            }
        } else {
            if now == READINESS_JOINED {
                let _ = epoll::delete(&self.fd, &progress.fd);
            }
            if self.own_sleeper.swap(false, AcqRel) {
                (progress.sleeping)(false);
            }
        }
        self.readiness.store(want, Release);
    }

    /// Whether the device's packets make the channel's fd readable (module doc).
    pub(crate) fn packets_wake_sleepers(&self) -> bool {
        #[cfg(not(loom))]
        {
            self.readiness.load(std::sync::atomic::Ordering::Acquire) == READINESS_JOINED
        }
        #[cfg(loom)]
        false
    }

    /// A CQ of the channel was armed: a thread will wait for its event, maybe asleep on the
    /// fd with its own `poll`. Looks at the fd's mode the first time; while the readiness
    /// is joined, counts that thread as the wait progress's sleeper (so that peers writing
    /// into memory wake it), and runs the progress step for what is already there (which
    /// no peer will ring for). Returns whether the device's packets make the fd readable.
    pub(crate) fn note_armed(&self) -> bool {
        #[cfg(not(loom))]
        {
            use std::sync::atomic::Ordering::{AcqRel, Acquire};
            let Some(progress) = self.progress.get() else {
                return false;
            };
            if self.readiness.load(Acquire) == READINESS_UNCHECKED {
                if let Ok(nonblocking) = nonblocking(&self.fd) {
                    self.sync_readiness(nonblocking);
                }
            } else {
                // Whether the channel is still its device's only one (CQs of another may
                // have come to the device's QPs since).
                self.sync_readiness(
                    self.nonblocking_seen
                        .load(std::sync::atomic::Ordering::Relaxed),
                );
            }
            if self.readiness.load(Acquire) != READINESS_JOINED {
                return false;
            }
            if !self.own_sleeper.swap(true, AcqRel) {
                (progress.sleeping)(true);
            }
            // What came before the count, which no peer rings for (and which the device
            // receives only once its CQs with a channel are all armed: see `run`).
            (progress.run)(true);
            true
        }
        #[cfg(loom)]
        false
    }

    /// An event was queued: a thread asleep on the fd is woken by its count, no longer by
    /// the device's packets, so the channel stops counting it a sleeper (until the next
    /// arm). Without this, a program that goes on busy polling after its last event, a CQ
    /// armed, would have its peers ring for it on every packet.
    pub(crate) fn note_delivered(&self) {
        #[cfg(not(loom))]
        if self.own_sleeper.load(std::sync::atomic::Ordering::Relaxed)
            && self
                .own_sleeper
                .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            if let Some(progress) = self.progress.get() {
                (progress.sleeping)(false);
            }
        }
    }

    /// A non-blocking getter found no event: the thread that slept on the fd is awake (no
    /// longer a sleeper to wake), and receives what is there once, which may make its
    /// event. Without one, it goes back to sleep on the fd (its CQ still armed): a sleeper
    /// again, and what came meanwhile, which no peer rings for, is received now.
    #[cfg(not(loom))]
    fn receive_once(&self) -> Option<CqEvent> {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        let progress = self.progress.get()?;
        if self.readiness.load(Acquire) != READINESS_JOINED {
            // Not its device's only channel: another thread may wait on another, and this
            // one's receive would make completions in its CQs (module doc).
            return None;
        }
        let counted = self.own_sleeper.swap(false, AcqRel);
        if counted {
            (progress.sleeping)(false);
        }
        (progress.run)(true);
        if let Some(event) = self.take() {
            return Some(event);
        }
        if counted
            && self.readiness.load(Acquire) == READINESS_JOINED
            && !self.own_sleeper.swap(true, AcqRel)
            && (progress.sleeping)(true)
        {
            (progress.run)(true);
            return self.take();
        }
        None
    }

    fn take(&self) -> Option<CqEvent> {
        self.pop().map(|e| CqEvent {
            cq: e.cq,
            acknowledged: false,
        })
    }
}

#[cfg(not(loom))]
impl Drop for ChannelInner {
    fn drop(&mut self) {
        if *self.own_sleeper.get_mut() {
            if let Some(progress) = self.progress.get() {
                (progress.sleeping)(false);
            }
        }
    }
}

/// Whether `fd` is non-blocking.
#[cfg(not(loom))]
fn nonblocking(fd: &OwnedFd) -> io::Result<bool> {
    use rustix::fs::{fcntl_getfl, OFlags};
    Ok(fcntl_getfl(fd)?.contains(OFlags::NONBLOCK))
}

/// A completion channel.
///
/// ```
/// use softverbs_cq::{CompletionChannel, CqBuilder, WorkCompletion, WcOpcode};
/// let channel = CompletionChannel::new()?;
/// let cq = CqBuilder::new(8).channel(&channel).user_context(42).build().unwrap();
/// cq.req_notify(false);
/// cq.producer().push(WorkCompletion::success(1, WcOpcode::Recv, 3), false).unwrap();
/// let event = channel.get_event()?;
/// assert!(event.is_for(cq.id()));
/// assert_eq!(event.user_context(), 42);
/// drop(event); // acknowledges it
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone)]
pub struct CompletionChannel {
    inner: Arc<ChannelInner>,
}

impl fmt::Debug for CompletionChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("CompletionChannel");
        #[cfg(not(loom))]
        s.field("fd", &self.inner.fd.as_raw_fd());
        s.field("queued", &self.inner.queued.load(Ordering::Relaxed))
            .field("cqs", &self.inner.attached.load(Ordering::Relaxed))
            .finish()
    }
}

impl CompletionChannel {
    /// Creates a channel (`ibv_create_comp_channel(3)`). Its fd is blocking, like
    /// libibverbs'; set `O_NONBLOCK` with [`CompletionChannel::set_nonblocking`] or `fcntl`.
    pub fn new() -> io::Result<Self> {
        #[cfg(not(loom))]
        let (fd, counts) = {
            use rustix::event::{epoll, eventfd, EventfdFlags};
            let counts = eventfd(
                0,
                EventfdFlags::CLOEXEC | EventfdFlags::SEMAPHORE | EventfdFlags::NONBLOCK,
            )?;
            let fd = epoll::create(epoll::CreateFlags::CLOEXEC)?;
            epoll::add(
                &fd,
                &counts,
                epoll::EventData::new_u64(0),
                epoll::EventFlags::IN,
            )?;
            (fd, counts)
        };
        Ok(CompletionChannel {
            inner: Arc::new(ChannelInner {
                #[cfg(not(loom))]
                fd,
                #[cfg(not(loom))]
                counts,
                #[cfg(not(loom))]
                readiness: std::sync::atomic::AtomicU8::new(READINESS_UNCHECKED),
                #[cfg(not(loom))]
                joining: std::sync::Mutex::new(()),
                #[cfg(not(loom))]
                nonblocking_seen: std::sync::atomic::AtomicBool::new(false),
                #[cfg(not(loom))]
                own_sleeper: std::sync::atomic::AtomicBool::new(false),
                queue: Mutex::new(EventQueue {
                    events: VecDeque::new(),
                    spinners: 0,
                    uncounted: 0,
                }),
                queued: AtomicUsize::new(0),
                attached: AtomicUsize::new(0),
                spin_ns: AtomicU64::new(DEFAULT_SPIN.as_nanos() as u64),
                #[cfg(not(loom))]
                fd_calls: std::sync::atomic::AtomicU64::new(0),
                #[cfg(not(loom))]
                progress: std::sync::OnceLock::new(),
            }),
        })
    }

    pub(crate) fn inner(&self) -> &Arc<ChannelInner> {
        &self.inner
    }

    /// How long a blocking [`CompletionChannel::get_event`] spins before it sleeps in the
    /// kernel (0 disables spinning).
    pub fn set_spin(&self, spin: Duration) {
        self.inner.spin_ns.store(
            spin.as_nanos().min(u128::from(u64::MAX)) as u64,
            Ordering::Relaxed,
        );
    }

    /// The number of CQs using this channel. `ibv_destroy_comp_channel(3)` "fails if any
    /// CQs are still associated with the completion event channel being destroyed".
    pub fn attached_cqs(&self) -> usize {
        self.inner.attached.load(Ordering::Relaxed)
    }

    /// `ibv_destroy_comp_channel(3)`'s rule: the channel "fails if any CQs are still
    /// associated with the completion event channel being destroyed"
    /// ([`DestroyError::CqsAttached`]). Both front doors check it before they let go of
    /// the channel.
    pub fn check_unused(&self) -> Result<(), DestroyError> {
        match self.attached_cqs() {
            0 => Ok(()),
            n => Err(DestroyError::CqsAttached(n)),
        }
    }

    /// Events waiting to be taken.
    pub fn pending(&self) -> usize {
        self.inner.queued.load(Ordering::Relaxed)
    }

    /// System calls the channel made on its fd to add and remove events' counts (eventfd
    /// writes and reads), since it was created: two per event, none for an event that a
    /// getter spinning in [`CompletionChannel::get_event`] takes (module doc).
    #[cfg(not(loom))]
    pub fn fd_calls(&self) -> u64 {
        self.inner
            .fd_calls
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Takes one event without waiting: `None` if none is queued.
    pub fn try_get_event(&self) -> io::Result<Option<CqEvent>> {
        Ok(self.inner.take())
    }
}

#[cfg(not(loom))]
impl CompletionChannel {
    /// Waits for the next event (`ibv_get_cq_event(3)`). Blocks unless the fd is
    /// non-blocking, in which case an empty channel gives `EAGAIN`
    /// (`io::ErrorKind::WouldBlock`).
    ///
    /// With a [wait progress](CompletionChannel::set_wait_progress), a non-blocking call
    /// that finds no event receives once before it answers (module doc).
    pub fn get_event(&self) -> io::Result<CqEvent> {
        if let Some(event) = self.inner.take() {
            return Ok(event);
        }
        let nonblocking = self.is_nonblocking()?;
        self.inner.sync_readiness(nonblocking);
        if nonblocking {
            if let Some(event) = self.inner.receive_once() {
                return Ok(event);
            }
            // EAGAIN itself (kind `WouldBlock`), so the C side can hand the errno on.
            return Err(io::Error::from(rustix::io::Errno::AGAIN));
        }
        let _waiting = Waiting::start(self.inner.progress.get());
        if let Some(event) = self.spin_for_event(Duration::MAX) {
            return Ok(event);
        }
        loop {
            if let Some(event) = self.inner.take() {
                return Ok(event);
            }
            self.wait_readable(None)?;
        }
    }

    /// Waits up to `timeout` for an event: `Ok(None)` if none came. Spins first as
    /// [`CompletionChannel::get_event`] does (at most `timeout`).
    pub fn get_event_timeout(&self, timeout: Duration) -> io::Result<Option<CqEvent>> {
        let deadline = std::time::Instant::now() + timeout;
        if let Some(event) = self.inner.take() {
            return Ok(Some(event));
        }
        let _waiting = Waiting::start(self.inner.progress.get());
        if let Some(event) = self.spin_for_event(timeout) {
            return Ok(Some(event));
        }
        loop {
            if let Some(event) = self.inner.take() {
                return Ok(Some(event));
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            self.wait_readable(Some(deadline - now))?;
        }
    }

    /// Makes a blocking [`CompletionChannel::get_event`] (and
    /// [`CompletionChannel::get_event_timeout`]) sleep on `fd` too, calling `run` whenever
    /// it is readable. A device gives its receive socket and its non-blocking progress step
    /// here, so the thread waiting for an event receives the packet that makes the
    /// completion itself instead of sleeping until the thread that received it wakes it:
    /// one wake-up per event instead of two. The spin phase before the sleep calls `run`
    /// every `SPINS_PER_PROGRESS` (16) rounds too. `run` must neither block nor give the CPU
    /// away (`sched_yield`): a waiter that yields on a loaded core hands it to whatever else
    /// runs there for a whole time slice. Set once: `false` (and nothing changed) if the
    /// channel already has one.
    pub fn set_wait_progress(&self, fd: OwnedFd, run: impl Fn() + Send + Sync + 'static) -> bool {
        self.set_wait_progress_watched(fd, move |_| run(), |_| false, |_| {}, || true)
    }

    /// [`CompletionChannel::set_wait_progress`], and tells the device when the thread goes
    /// to sleep on `fd` and wakes: `sleeping(true)` before it sleeps (true if there is work
    /// already, so it does not sleep; `run` is called instead), `sleeping(false)` after;
    /// and when a getter waits at all: `waiting(true)` as it starts (no event was there)
    /// and `waiting(false)` as it returns, so the device knows a thread receives for
    /// itself from the first to the last.
    /// A device whose peers write into memory, not into `fd`, counts the sleeper there so
    /// they make `fd` readable for it (a shared-memory path's doorbell). `run` is told
    /// whether the thread goes back to sleep in its own `poll` on the channel's fd after it
    /// (`true` from a non-blocking `get_event` and an arm: module doc), rather than in the
    /// channel's wait, which runs it again as packets come. `alone` says whether the
    /// channel is the only one of the device's CQs: the device's packets make a
    /// non-blocking channel's fd readable only then (module doc).
    pub fn set_wait_progress_watched(
        &self,
        fd: OwnedFd,
        run: impl Fn(bool) + Send + Sync + 'static,
        sleeping: impl Fn(bool) -> bool + Send + Sync + 'static,
        waiting: impl Fn(bool) + Send + Sync + 'static,
        alone: impl Fn() -> bool + Send + Sync + 'static,
    ) -> bool {
        self.inner
            .progress
            .set(WaitProgress {
                fd,
                run: Box::new(run),
                sleeping: Box::new(sleeping),
                waiting: Box::new(waiting),
                alone: Box::new(alone),
            })
            .is_ok()
    }

    /// Waits until the fd is readable (an event's count is there) or `timeout` passes;
    /// with a [wait progress](CompletionChannel::set_wait_progress), also until its fd is
    /// readable, and then runs it.
    fn wait_readable(&self, timeout: Option<Duration>) -> io::Result<()> {
        use rustix::event::{PollFd, PollFlags};
        let ts = timeout.map(|left| rustix::time::Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: i64::from(left.subsec_nanos()),
        });
        let progress = self.inner.progress.get();
        let mut fds = [
            PollFd::new(&self.inner.fd, PollFlags::IN),
            PollFd::new(progress.map_or(&self.inner.fd, |p| &p.fd), PollFlags::IN),
        ];
        let watched = if progress.is_some() { 2 } else { 1 };
        if let Some(progress) = progress {
            if (progress.sleeping)(true) {
                (progress.sleeping)(false);
                (progress.run)(false);
                return Ok(());
            }
        }
        let polled = rustix::event::poll(&mut fds[..watched], ts.as_ref());
        if let Some(progress) = progress {
            (progress.sleeping)(false);
        }
        match polled {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
        if let Some(progress) = progress {
            if !fds[1].revents().is_empty() {
                (progress.run)(false);
            }
        }
        Ok(())
    }

    /// Sets or clears `O_NONBLOCK` on the channel's fd.
    /// Non-blocking, the device's packets make the fd readable too (module doc).
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
        let mut flags = fcntl_getfl(&self.inner.fd)?;
        flags.set(OFlags::NONBLOCK, nonblocking);
        fcntl_setfl(&self.inner.fd, flags)?;
        self.inner.sync_readiness(nonblocking);
        Ok(())
    }

    fn is_nonblocking(&self) -> io::Result<bool> {
        nonblocking(&self.inner.fd)
    }

    /// The spin phase of a blocking wait: watches the queue for up to the channel's spin
    /// time (at most `at_most`) and takes the first event that comes, which its deliverer
    /// left uncounted (module doc); with a [wait
    /// progress](CompletionChannel::set_wait_progress) runs it every [`SPINS_PER_PROGRESS`]
    /// rounds, so the packet that makes the completion is received by the spinning thread
    /// itself as soon as it arrives.
    fn spin_for_event(&self, at_most: Duration) -> Option<CqEvent> {
        let spin = self.inner.spin_ns.load(Ordering::Relaxed);
        if spin == 0 || at_most.is_zero() {
            return None;
        }
        let start = std::time::Instant::now();
        let limit = Duration::from_nanos(spin).min(at_most);
        let progress = self.inner.progress.get();
        let _spinning = Spinning::start(&self.inner);
        let mut i = 0u32;
        loop {
            if self.inner.queued.load(Ordering::Acquire) > 0 {
                if let Some(event) = self.inner.take() {
                    return Some(event);
                }
            }
            std::hint::spin_loop();
            i = i.wrapping_add(1);
            if i.is_multiple_of(SPINS_PER_PROGRESS) {
                if start.elapsed() >= limit {
                    return None;
                }
                if let Some(progress) = progress {
                    (progress.run)(false);
                }
            }
        }
    }
}

/// A getter's spin phase, ended when dropped (also if the wait progress panics, so events
/// are never left uncounted without a spinner to take them).
#[cfg(not(loom))]
struct Spinning<'a>(&'a ChannelInner);

#[cfg(not(loom))]
impl<'a> Spinning<'a> {
    fn start(inner: &'a ChannelInner) -> Self {
        inner.start_spinning();
        Spinning(inner)
    }
}

#[cfg(not(loom))]
impl Drop for Spinning<'_> {
    fn drop(&mut self) {
        self.0.stop_spinning();
    }
}

#[cfg(not(loom))]
impl AsFd for CompletionChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.fd.as_fd()
    }
}

#[cfg(not(loom))]
impl AsRawFd for CompletionChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.fd.as_raw_fd()
    }
}

/// One completion event: "this CQ got a completion while armed". Acknowledges itself when
/// dropped (`ibv_ack_cq_events(3)`).
pub struct CqEvent {
    cq: Arc<CqEventSource>,
    acknowledged: bool,
}

impl CqEvent {
    /// The CQ the event is for ([`CompletionQueue::id`](crate::CompletionQueue::id)).
    pub fn cq_id(&self) -> u64 {
        self.cq.id()
    }

    /// Whether the event is for the CQ with this id.
    pub fn is_for(&self, cq_id: u64) -> bool {
        self.cq.id() == cq_id
    }

    /// The CQ's user context (`cq_context`).
    pub fn user_context(&self) -> u64 {
        self.cq.user_context()
    }

    /// Gives up acknowledging on drop: the caller must call `ack_events` on the CQ later
    /// (the C side's counted `ibv_ack_cq_events`). Returns (CQ id, user context).
    pub fn into_unacknowledged(mut self) -> (u64, u64) {
        self.acknowledged = true;
        (self.cq.id(), self.cq.user_context())
    }
}

impl Drop for CqEvent {
    fn drop(&mut self) {
        if !self.acknowledged {
            self.cq.ack(1);
        }
    }
}

impl fmt::Debug for CqEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqEvent")
            .field("cq", &self.cq.id())
            .field("user_context", &self.cq.user_context())
            .finish()
    }
}
