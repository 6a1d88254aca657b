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

use super::completions::push_completion;
use super::grh::grh_bytes;
use super::registry::registry;
use super::{lock, DeviceInner, State};
use crate::transport::{udp_src_port_for_qps, Endpoint, Gid};
use softverbs_cq::DeviceClock;
use softverbs_proto::{AttrMask, QpAttr, QpState};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard, Weak};
use std::time::Duration;

/// How long the progress thread sleeps at most before looking at its timers again.
const PROGRESS_TICK: Duration = Duration::from_millis(5);

/// How recently the application must have driven progress for the progress thread to
/// leave the socket to it.
const APP_POLLING_WINDOW: Duration = Duration::from_millis(1);

/// A packet produced by a run, to send once the state lock is released.
struct Outgoing {
    to: Endpoint,
    src_port: u16,
    bytes: Vec<u8>,
}

/// Packets for devices of this process: (destination, source address, bytes).
type LocalQueue = VecDeque<(Arc<DeviceInner>, IpAddr, Vec<u8>)>;

thread_local! {
    /// Packets for devices of this process, delivered in order by the outermost run on
    /// this thread (so no device lock is held while another device runs). The flag says
    /// whether a run on this thread is already draining the queue.
    static LOCAL_DELIVERY: RefCell<(bool, LocalQueue)> =
        const { RefCell::new((false, VecDeque::new())) };
}

/// The progress thread of a device: rounds of progress until the device is dropped.
pub(super) fn progress_loop(weak: Weak<DeviceInner>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        if inner.shutdown.load(Ordering::Acquire) {
            return;
        }
        inner.progress_once(DeviceClock::now(), None);
    }
}

impl DeviceInner {
    /// Runs `f` on the engine, then delivers what it produced: completions to their CQs,
    /// events to the async queue, packets (after the lock is released) to their peers.
    pub(super) fn run<R>(self: &Arc<Self>, f: impl FnOnce(&mut State) -> R) -> R {
        let now = DeviceClock::now();
        let mut outgoing = Vec::new();
        let (result, sending) = {
            // The device's span (module doc of `device`): not over the delivery below,
            // which runs other devices' engines.
            let _span = self.span.enter();
            let mut st = lock(&self.state);
            let result = f(&mut st);
            self.drain(&mut st, now, &mut outgoing);
            // Packets leave in the order the engine produced them, whichever thread ran
            // it: the send lock is taken before the state lock is released (a reordered
            // pair of packets costs the peer a NAK and a go-back-N).
            let sending = (!outgoing.is_empty()).then(|| lock(&self.tx));
            (result, sending)
        };
        if let Some(guard) = sending {
            self.send_all(outgoing, guard);
        }
        result
    }

    /// Collects transmits, completions and events from the engine.
    fn drain(&self, st: &mut State, now: u64, outgoing: &mut Vec<Outgoing>) {
        let State {
            engine,
            memory,
            scratch,
            ..
        } = st;
        while let Some(tx) = engine.poll_transmit(now, scratch, memory) {
            // The peer's address as the path check reads it (a link-local GID is the
            // address it was made from).
            let to = Endpoint::new(Gid(tx.av.dgid).resolve(self.address), self.port());
            outgoing.push(Outgoing {
                to,
                src_port: udp_src_port_for_qps(tx.src_qpn, tx.dest_qpn),
                bytes: scratch[..tx.len].to_vec(),
            });
        }
        // Completions: retry what a back-pressure CQ refused first, to keep order.
        let mut failed_cqs: Vec<u32> = Vec::new();
        while let Some(c) = st.held.pop_front() {
            if !push_completion(&st.routes, c, &mut failed_cqs, &mut st.held) {
                break;
            }
        }
        while let Some(c) = st.engine.poll_completion() {
            if !st.held.is_empty() {
                st.held.push_back(c);
                continue;
            }
            push_completion(&st.routes, c, &mut failed_cqs, &mut st.held);
        }
        while let Some(event) = st.engine.poll_event() {
            self.events.push(event);
        }
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

    fn port(&self) -> u16 {
        self.transport
            .as_ref()
            .map_or(crate::transport::DEFAULT_PORT, |t| t.local().port())
    }

    /// Sends packets: to devices of this process directly, to others over the transport.
    fn send_all(self: &Arc<Self>, outgoing: Vec<Outgoing>, sending: MutexGuard<'_, ()>) {
        let mut local = Vec::new();
        {
            let reg = lock(registry());
            let shortcut = self.shortcut.load(Ordering::Relaxed) || self.transport.is_none();
            for mut out in outgoing {
                let peer = if shortcut {
                    reg.get(&out.to.addr()).and_then(Weak::upgrade)
                } else {
                    None
                };
                match peer {
                    Some(peer) => local.push((peer, out.bytes)),
                    None => match &self.transport {
                        Some(t) => {
                            if let Err(e) = t.send(&out.to, out.src_port, &mut out.bytes) {
                                tracing::debug!(error = %e, to = %out.to.addr(), "send failed");
                            }
                        }
                        None => {
                            tracing::debug!(to = %out.to.addr(), "no route for in-process device");
                        }
                    },
                }
            }
        }
        let from = self.address;
        let drain_here = LOCAL_DELIVERY.with(|cell| {
            let mut q = cell.borrow_mut();
            for (peer, bytes) in local {
                q.1.push_back((peer, from, bytes));
            }
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
            while let Some((peer, from, bytes)) =
                LOCAL_DELIVERY.with(|cell| cell.borrow_mut().1.pop_front())
            {
                peer.receive(&bytes, from);
            }
            LOCAL_DELIVERY.with(|cell| cell.borrow_mut().0 = false);
        }
    }

    /// Handles one packet from `from`.
    fn receive(self: &Arc<Self>, bytes: &[u8], from: IpAddr) {
        let grh = grh_bytes(from, self.address, bytes.len());
        let now = DeviceClock::now();
        self.run(|st| {
            let State { engine, memory, .. } = st;
            engine.handle_packet(now, bytes, Some(&grh), memory);
        });
    }

    /// One round of progress: receive (waiting up to `wait`, or until the next deadline
    /// when `None`), handle, and run due timers.
    /// Returns how many packets it received.
    pub(super) fn progress_once(self: &Arc<Self>, now: u64, wait: Option<Duration>) -> usize {
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
        let app_is_polling = wait.is_none()
            && now.saturating_sub(self.last_app_progress.load(Ordering::Relaxed))
                < APP_POLLING_WINDOW.as_nanos() as u64;
        match &self.transport {
            Some(_) if app_is_polling => {
                // The application receives for itself; only timers are ours.
                std::thread::sleep(timeout.min(APP_POLLING_WINDOW));
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
                    Some(lock(&self.rx))
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
                    thread_local! {
                        static RECV_BUF: RefCell<Vec<u8>> = RefCell::new(vec![0u8; 16 * 1024]);
                    }
                    let mut buf = RECV_BUF.with(|b| std::mem::take(&mut *b.borrow_mut()));
                    if buf.len() < 16 * 1024 {
                        buf = vec![0u8; 16 * 1024];
                    }
                    // Handle everything already queued, without waiting.
                    for _ in 0..64 {
                        match transport.recv(&mut buf, Some(Duration::ZERO)) {
                            Ok(Some(rx)) => {
                                received += 1;
                                self.receive(&buf[..rx.len], rx.from.addr());
                            }
                            Ok(None) => break,
                            Err(e) => {
                                tracing::warn!(error = %e, "receive failed");
                                break;
                            }
                        }
                    }
                    RECV_BUF.with(|b| *b.borrow_mut() = buf);
                }
            }
            None => {
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
            }
        }
        // After a wait the clock has moved; a non-waiting call reuses its reading.
        let now = if wait.is_some_and(|w| w.is_zero()) {
            now
        } else {
            DeviceClock::now()
        };
        if self.next_deadline.load(Ordering::Relaxed) <= now {
            self.run_due_timers(now);
        }
        received
    }

    /// Runs the engine's timers and the CQs' moderation timers that are due at `now`.
    pub(super) fn run_due_timers(self: &Arc<Self>, now: u64) {
        self.run(|st| {
            if st.engine.poll_timeout().is_some_and(|d| d <= now) {
                st.engine.handle_timeout(now);
            }
            for route in st.routes.values() {
                route.send.moderation_timer(now);
                if route.recv.cq_id() != route.send.cq_id() {
                    route.recv.moderation_timer(now);
                }
            }
        });
    }
}

/// The earliest deadline of the engine's timers and of the CQs' moderation periods.
fn next_deadline(st: &State) -> u64 {
    let mut deadline = st.engine.poll_timeout().unwrap_or(u64::MAX);
    for route in st.routes.values() {
        for cq in [&route.send, &route.recv] {
            if let Some(d) = cq.moderation_deadline() {
                deadline = deadline.min(d);
            }
        }
    }
    deadline
}
