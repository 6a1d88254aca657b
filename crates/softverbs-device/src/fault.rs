//! Fault injection as transport middleware: [`FaultTransport`] wraps any [`Transport`]
//! and drops, duplicates, corrupts, delays or reorders the packets it transmits, by seeded
//! random rules that can be changed while it runs ([`FaultConfig`], shared as an `Arc`).
//!
//! # Where and how faults happen
//!
//! Faults act on the **egress** path, like a lossy link behind the sender: after the inner
//! transport's [`Transport::prepare`] filled the ICRC, before its [`Transport::transmit`].
//! Receiving passes through, except that it also releases held (delayed / reordered)
//! packets when they are due. Per transmitted packet, in this order:
//!
//! 1. **drop** with probability `drop`: the packet is gone;
//! 2. **corrupt** with probability `corrupt`: one bit is flipped anywhere in the packet
//!    except BTH byte 4 (FECN / BECN / reserved, which the ICRC does not cover,
//!    IBTA Annex A17), so the receiver's ICRC check always catches it and the packet is
//!    lost there (`dropped_bad_icrc` of the receiving transport);
//! 3. **delay** with probability `delay`: held back for the configured delay;
//! 4. **reorder** (if not delayed) with probability `reorder`: held back until the next
//!    packet has been transmitted (or the hold time passes), so the two swap;
//! 5. otherwise transmitted now, and then **duplicated** with probability `duplicate`
//!    (the copy is transmitted right after the original).
//!
//! Held packets are released, when due, by the next `transmit` or `recv` on this
//! transport; `recv` waits no longer than the next due time, so a device whose progress
//! loop sits in `recv` releases them on time. [`FaultTransport::release_all`] releases
//! everything at once.
//!
//! # Determinism
//!
//! The random stream is ChaCha8 from a `u64` seed, and every transmitted packet draws the
//! same number of values whatever the rules say, so a run with the same seed, the same
//! sequence of transmits and the same rule changes at the same points makes the same
//! decisions — changing one probability never shifts the decisions of the others. (Time
//! only decides *when* held packets go, not *which* faults happen.) Transmits are
//! serialised by a mutex, which keeps decisions in call order when several threads send.
//!
//! Everything done is counted ([`FaultCounters`], part of the device's statistics) and
//! logged at TRACE, one event per fault naming the packet's QP, PSN and opcode.

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::transport::{Endpoint, Received, Sent, Transport, TransportCounters};

/// One million: probabilities are stored in parts per million.
const PPM: u32 = 1_000_000;

fn to_ppm(probability: f64) -> u32 {
    if probability.is_nan() {
        return 0;
    }
    (probability.clamp(0.0, 1.0) * f64::from(PPM)).round() as u32
}

/// The fault rules, changeable at run time from any thread.
///
/// Ordering: each field is an independent knob written and read with `Relaxed`; a change
/// applies from some later packet on (no packet sees half a change of one knob, but a
/// packet may see a new drop rate with the old delay). Nothing else is published through
/// these atomics.
#[derive(Debug)]
pub struct FaultConfig {
    enabled: AtomicBool,
    drop_ppm: AtomicU32,
    duplicate_ppm: AtomicU32,
    corrupt_ppm: AtomicU32,
    delay_ppm: AtomicU32,
    reorder_ppm: AtomicU32,
    delay_ns: AtomicU64,
    reorder_hold_ns: AtomicU64,
}

impl Default for FaultConfig {
    /// Enabled, every probability 0, delay 0, reorder hold 10 ms.
    fn default() -> FaultConfig {
        FaultConfig {
            enabled: AtomicBool::new(true),
            drop_ppm: AtomicU32::new(0),
            duplicate_ppm: AtomicU32::new(0),
            corrupt_ppm: AtomicU32::new(0),
            delay_ppm: AtomicU32::new(0),
            reorder_ppm: AtomicU32::new(0),
            delay_ns: AtomicU64::new(0),
            reorder_hold_ns: AtomicU64::new(10_000_000),
        }
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

impl FaultConfig {
    /// A shared configuration with no faults ([`FaultConfig::default`]).
    pub fn new() -> Arc<FaultConfig> {
        Arc::new(FaultConfig::default())
    }

    /// Turns every rule on or off without forgetting the probabilities.
    pub fn set_enabled(&self, enabled: bool) {
        self.enabled.store(enabled, Ordering::Relaxed);
    }

    /// Whether the rules apply.
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Probability (0.0–1.0, in steps of one millionth) that a packet is dropped.
    pub fn set_drop(&self, probability: f64) {
        self.drop_ppm.store(to_ppm(probability), Ordering::Relaxed);
    }

    /// Probability that a transmitted packet is sent twice.
    pub fn set_duplicate(&self, probability: f64) {
        self.duplicate_ppm
            .store(to_ppm(probability), Ordering::Relaxed);
    }

    /// Probability that one bit of a packet is flipped.
    pub fn set_corrupt(&self, probability: f64) {
        self.corrupt_ppm
            .store(to_ppm(probability), Ordering::Relaxed);
    }

    /// Probability that a packet is held back for `delay`.
    pub fn set_delay(&self, probability: f64, delay: Duration) {
        self.delay_ns.store(nanos(delay), Ordering::Relaxed);
        self.delay_ppm.store(to_ppm(probability), Ordering::Relaxed);
    }

    /// Probability that a packet is held back until the next one is transmitted (at most
    /// `max_hold`).
    pub fn set_reorder(&self, probability: f64, max_hold: Duration) {
        self.reorder_hold_ns
            .store(nanos(max_hold), Ordering::Relaxed);
        self.reorder_ppm
            .store(to_ppm(probability), Ordering::Relaxed);
    }

    /// Sets every probability back to 0 (held packets are still released when due).
    pub fn clear(&self) {
        for knob in [
            &self.drop_ppm,
            &self.duplicate_ppm,
            &self.corrupt_ppm,
            &self.delay_ppm,
            &self.reorder_ppm,
        ] {
            knob.store(0, Ordering::Relaxed);
        }
    }

    fn rules(&self) -> Rules {
        let load = |knob: &AtomicU32| knob.load(Ordering::Relaxed);
        if !self.enabled() {
            return Rules::default();
        }
        Rules {
            drop: load(&self.drop_ppm),
            duplicate: load(&self.duplicate_ppm),
            corrupt: load(&self.corrupt_ppm),
            delay: load(&self.delay_ppm),
            reorder: load(&self.reorder_ppm),
            delay_for: Duration::from_nanos(self.delay_ns.load(Ordering::Relaxed)),
            reorder_hold: Duration::from_nanos(self.reorder_hold_ns.load(Ordering::Relaxed)),
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Rules {
    drop: u32,
    duplicate: u32,
    corrupt: u32,
    delay: u32,
    reorder: u32,
    delay_for: Duration,
    reorder_hold: Duration,
}

/// Logs (TRACE) a fault done to `packet` going `to`, with the QP, PSN and opcode its BTH
/// names. Costs one level check when TRACE is off.
fn trace_fault(fault: &'static str, to: &Endpoint, packet: &[u8]) {
    if !tracing::enabled!(tracing::Level::TRACE) {
        return;
    }
    match softverbs_wire::bth::Header::new_checked(packet) {
        Ok(bth) => tracing::trace!(
            fault,
            to = %to.addr(),
            qpn = %bth.dest_qp(),
            psn = %bth.psn(),
            opcode = %bth.opcode(),
            "fault injected"
        ),
        Err(_) => tracing::trace!(fault, to = %to.addr(), len = packet.len(), "fault injected"),
    }
}

/// What a [`FaultTransport`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FaultCounters {
    /// Packets that went through `transmit`.
    pub packets: u64,
    /// Packets dropped.
    pub dropped: u64,
    /// Extra copies transmitted.
    pub duplicated: u64,
    /// Packets with one bit flipped.
    pub corrupted: u64,
    /// Packets held back for the delay.
    pub delayed: u64,
    /// Packets held back until the next one (reordered).
    pub reordered: u64,
    /// Held packets transmitted later.
    pub released: u64,
}

/// `packets=N dropped=N duplicated=N corrupted=N delayed=N reordered=N released=N`, as
/// the device's statistics print it.
impl std::fmt::Display for FaultCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "packets={} dropped={} duplicated={} corrupted={} delayed={} reordered={} \
             released={}",
            self.packets,
            self.dropped,
            self.duplicated,
            self.corrupted,
            self.delayed,
            self.reordered,
            self.released
        )
    }
}

#[derive(Debug)]
struct Held {
    due: Instant,
    /// Released after the next directly transmitted packet (reorder), or only when due.
    after_next: bool,
    to: Endpoint,
    sent: Sent,
    bytes: Vec<u8>,
}

#[derive(Debug)]
struct State {
    rng: ChaCha8Rng,
    held: Vec<Held>,
    counters: FaultCounters,
}

/// Fault-injection middleware over `T`. See the module documentation.
#[derive(Debug)]
pub struct FaultTransport<T> {
    inner: T,
    config: Arc<FaultConfig>,
    state: Mutex<State>,
}

impl<T: Transport> FaultTransport<T> {
    /// Wraps `inner`, drawing from a ChaCha8 stream seeded with `seed`, with the rules of
    /// `config` (which the caller keeps to change them).
    pub fn new(inner: T, config: Arc<FaultConfig>, seed: u64) -> FaultTransport<T> {
        FaultTransport {
            inner,
            config,
            state: Mutex::new(State {
                rng: ChaCha8Rng::seed_from_u64(seed),
                held: Vec::new(),
                counters: FaultCounters::default(),
            }),
        }
    }

    /// The rules.
    pub fn config(&self) -> &Arc<FaultConfig> {
        &self.config
    }

    /// The wrapped transport.
    pub fn inner(&self) -> &T {
        &self.inner
    }

    /// What was done so far.
    pub fn fault_counters(&self) -> FaultCounters {
        self.lock().counters
    }

    /// Packets held back right now.
    pub fn held(&self) -> usize {
        self.lock().held.len()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Transmits every held packet that is due (all of them with `everything`), oldest
    /// first; returns the earliest due time of those still held.
    fn release(&self, state: &mut State, everything: bool) -> io::Result<Option<Instant>> {
        let now = Instant::now();
        let mut index = 0;
        let mut result = Ok(());
        while index < state.held.len() {
            if everything || state.held[index].due <= now {
                let held = state.held.remove(index);
                state.counters.released += 1;
                let sent = self.inner.transmit(&held.to, &held.sent, &held.bytes);
                if result.is_ok() {
                    result = sent;
                }
            } else {
                index += 1;
            }
        }
        result?;
        Ok(state.held.iter().map(|held| held.due).min())
    }

    /// Transmits the held packets that are due now; returns the next due time.
    pub fn release_due(&self) -> io::Result<Option<Instant>> {
        let mut state = self.lock();
        self.release(&mut state, false)
    }

    /// Transmits every held packet now, whatever its due time.
    pub fn release_all(&self) -> io::Result<()> {
        let mut state = self.lock();
        self.release(&mut state, true).map(|_| ())
    }
}

impl<T: Transport> Transport for FaultTransport<T> {
    crate::transport::pass_to_inner!();

    fn local(&self) -> Endpoint {
        self.inner.local()
    }

    fn prepare(&self, to: &Endpoint, src_port: u16, ib_packet: &mut [u8]) -> io::Result<Sent> {
        self.inner.prepare(to, src_port, ib_packet)
    }

    fn transmit(&self, to: &Endpoint, sent: &Sent, ib_packet: &[u8]) -> io::Result<()> {
        let rules = self.config.rules();
        let mut state = self.lock();
        self.release(&mut state, false)?;
        state.counters.packets += 1;
        // Always the same six draws per packet (see "Determinism").
        let mut draw = || state.rng.gen_range(0..PPM);
        let (drop, corrupt, delay, reorder, duplicate) = (draw(), draw(), draw(), draw(), draw());
        let position: u64 = state.rng.gen();

        if drop < rules.drop {
            state.counters.dropped += 1;
            trace_fault("dropped", to, ib_packet);
            return Ok(());
        }
        let mut bytes = ib_packet.to_vec();
        if corrupt < rules.corrupt && bytes.len() > 1 {
            // Any byte but BTH byte 4, which the ICRC does not cover (§1.7).
            let span = bytes.len() as u64 - 1;
            let mut at = (position % span) as usize;
            if at >= 4 {
                at += 1;
            }
            trace_fault("corrupted", to, &bytes);
            bytes[at] ^= 1 << ((position >> 32) % 8);
            state.counters.corrupted += 1;
        }
        let now = Instant::now();
        if delay < rules.delay {
            state.counters.delayed += 1;
            trace_fault("delayed", to, &bytes);
            state.held.push(Held {
                due: now + rules.delay_for,
                after_next: false,
                to: *to,
                sent: *sent,
                bytes,
            });
            return Ok(());
        }
        if reorder < rules.reorder {
            state.counters.reordered += 1;
            trace_fault("reordered", to, &bytes);
            state.held.push(Held {
                due: now + rules.reorder_hold,
                after_next: true,
                to: *to,
                sent: *sent,
                bytes,
            });
            return Ok(());
        }
        self.inner.transmit(to, sent, &bytes)?;
        if duplicate < rules.duplicate {
            state.counters.duplicated += 1;
            trace_fault("duplicated", to, &bytes);
            self.inner.transmit(to, sent, &bytes)?;
        }
        // Packets held for reordering go out right after this one.
        let mut index = 0;
        let mut result = Ok(());
        while index < state.held.len() {
            if state.held[index].after_next {
                let held = state.held.remove(index);
                state.counters.released += 1;
                let sent = self.inner.transmit(&held.to, &held.sent, &held.bytes);
                if result.is_ok() {
                    result = sent;
                }
            } else {
                index += 1;
            }
        }
        result
    }

    fn wait_readable(&self, timeout: Duration) -> io::Result<()> {
        // Held (delayed or reordered) packets are released by later calls: do not sleep
        // long past their time.
        let timeout = if self.held() > 0 {
            timeout.min(Duration::from_millis(1))
        } else {
            timeout
        };
        self.inner.wait_readable(timeout)
    }

    /// Packets this layer holds back count: receiving releases them.
    fn pending_packets(&self) -> bool {
        self.held() > 0 || self.inner.pending_packets()
    }

    fn readiness_fd(&self) -> Option<BorrowedFd<'_>> {
        // Packets this layer holds back (delay, reorder) do not show on it; the device's
        // progress thread releases those.
        self.inner.readiness_fd()
    }

    fn recv(&self, buf: &mut [u8], timeout: Option<Duration>) -> io::Result<Option<Received>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let next_due = self.release_due()?;
            let now = Instant::now();
            let until_deadline = deadline.map(|d| d.saturating_duration_since(now));
            let until_due = next_due.map(|d| d.saturating_duration_since(now));
            let wait = match (until_deadline, until_due) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if let Some(received) = self.inner.recv(buf, wait)? {
                return Ok(Some(received));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
        }
    }

    fn counters(&self) -> TransportCounters {
        self.inner.counters()
    }
}
