//! [`Sim`]: several engines joined by a seeded, faulty fabric under a virtual clock, with
//! invariant checks after every step and a bounded drive loop.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::fmt;
use std::net::Ipv4Addr;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use softverbs_proto::{
    AsyncEvent, Completion, CqTarget, Engine, EngineConfig, RecvWr, SendFlags, SendWr, SrqId,
    Transmit, VerbsError,
};
use softverbs_wire::icrc::{self, IpHeaderInfo, UdpHeaderInfo};

use crate::memory::SimMemory;

/// Fault rules of the fabric; probabilities are per packet, in `[0, 1]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FaultRules {
    /// Probability a packet is lost.
    pub drop: f64,
    /// Probability a packet is delivered twice.
    pub duplicate: f64,
    /// Probability a packet gets extra delay (up to `jitter_ns`), which reorders it.
    pub reorder: f64,
    /// Probability one byte is flipped (the receiver's ICRC check then drops it).
    pub corrupt: f64,
    /// One-way latency in nanoseconds.
    pub latency_ns: u64,
    /// Largest extra delay of a reordered packet.
    pub jitter_ns: u64,
    /// Packets the fabric holds towards one node, like the receive buffer of its UDP
    /// socket: a packet that finds this many already on their way to its destination is
    /// dropped (counted in [`FabricStats::overflowed`]). 0: unbounded.
    pub receive_queue: usize,
}

impl FaultRules {
    /// A perfect link with 1 µs latency.
    pub fn perfect() -> Self {
        FaultRules {
            drop: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
            latency_ns: 1_000,
            jitter_ns: 0,
            receive_queue: 0,
        }
    }

    /// `loss` drop rate plus proportional duplication, reordering and corruption.
    pub fn lossy(loss: f64) -> Self {
        FaultRules {
            drop: loss,
            duplicate: loss / 2.0,
            reorder: loss / 2.0,
            corrupt: loss / 10.0,
            latency_ns: 1_000,
            jitter_ns: 20_000,
            receive_queue: 0,
        }
    }
}

/// What the fabric did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FabricStats {
    /// Packets handed to the fabric.
    pub sent: u64,
    /// Packets delivered to an engine.
    pub delivered: u64,
    /// Packets lost by the drop rule (or because an end was down).
    pub dropped: u64,
    /// Extra copies made by the duplicate rule.
    pub duplicated: u64,
    /// Packets delayed by the reorder rule.
    pub reordered: u64,
    /// Packets corrupted (and then dropped by the ICRC check).
    pub corrupted: u64,
    /// Packets whose destination GID matched no node.
    pub unroutable: u64,
    /// Packets dropped because their destination's receive queue was full
    /// ([`FaultRules::receive_queue`]).
    pub overflowed: u64,
    /// The most packets ever on their way to one node at once.
    pub peak_queued: u64,
}

/// Why a simulation run failed; its `Display` names the seed and how to replay it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimError {
    /// Seed of the run.
    pub seed: u64,
    /// Virtual time of the failure.
    pub now: u64,
    /// What went wrong.
    pub kind: SimErrorKind,
}

/// The failure classes of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SimErrorKind {
    /// An invariant check failed.
    Invariant(String),
    /// The step budget ran out before the goal was reached (livelock).
    Livelock {
        /// Steps taken.
        steps: u64,
    },
    /// Nothing left to do (no packet, no timer) and the goal is not reached.
    Stalled,
    /// A verb failed where the scenario expected success.
    Verb(VerbsError),
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            SimErrorKind::Invariant(msg) => write!(f, "invariant violated: {msg}")?,
            SimErrorKind::Livelock { steps } => {
                write!(f, "livelock: goal not reached in {steps} steps")?
            }
            SimErrorKind::Stalled => {
                write!(f, "stalled: no packet or timer left, goal not reached")?
            }
            SimErrorKind::Verb(e) => write!(f, "verb failed: {e}")?,
        }
        write!(
            f,
            " (seed {seed}, virtual time {now} ns; replay with SOFTVERBS_SIM_SEED={seed})",
            seed = self.seed,
            now = self.now
        )
    }
}

impl std::error::Error for SimError {}

/// One simulated device: an engine and its memory, with everything it produced.
#[derive(Debug)]
pub struct Node {
    /// The engine.
    pub engine: Engine,
    /// Its registered memory.
    pub mem: SimMemory,
    /// Its GID (IPv4-mapped `::ffff:10.0.0.n`).
    pub gid: [u8; 16],
    /// Every completion polled so far, in order.
    pub completions: Vec<Completion>,
    /// Every event polled so far, in order.
    pub events: Vec<AsyncEvent>,
    /// A down node neither sends nor receives (the peer disappeared).
    pub down: bool,
}

impl Node {
    fn ipv4(&self) -> Ipv4Addr {
        Ipv4Addr::new(self.gid[12], self.gid[13], self.gid[14], self.gid[15])
    }
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct InFlight {
    at: u64,
    seq: u64,
    from: usize,
    to: usize,
    bytes: Vec<u8>,
}

/// A hook that sees (and may rewrite) every packet `(from node, to node, bytes)` before the
/// fault rules; returning `false` drops it. The ICRC is computed after the hook.
pub type Intercept = Box<dyn FnMut(usize, usize, &mut Vec<u8>) -> bool>;

/// Bookkeeping for the invariant checks.
#[derive(Debug, Default)]
struct Tracker {
    /// Posted, not yet completed send WRs: (wr_id, signaled).
    sends: HashMap<(usize, u32), VecDeque<(u64, bool)>>,
    /// Posted, not yet completed receive WRs per QP.
    recvs: HashMap<(usize, u32), VecDeque<u64>>,
    /// Posted, not yet consumed SRQ WRs.
    srq_recvs: HashMap<(usize, u32), HashSet<u64>>,
    /// QP → SRQ.
    qp_srq: HashMap<(usize, u32), u32>,
    /// sq_sig_all per QP.
    sig_all: HashMap<(usize, u32), bool>,
}

/// The simulator.
pub struct Sim {
    /// The nodes.
    pub nodes: Vec<Node>,
    /// Virtual time in nanoseconds.
    pub now: u64,
    /// The seed this run was built from.
    pub seed: u64,
    /// Fault rules in force.
    pub rules: FaultRules,
    /// What the fabric did.
    pub stats: FabricStats,
    /// Optional packet hook.
    pub intercept: Option<Intercept>,
    rng: ChaCha8Rng,
    queue: BinaryHeap<Reverse<InFlight>>,
    /// Packets in `queue` per destination node.
    queued: Vec<usize>,
    seq: u64,
    tracker: Tracker,
    buf: Vec<u8>,
    steps: u64,
}

impl fmt::Debug for Sim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sim")
            .field("now", &self.now)
            .field("seed", &self.seed)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Sim {
    /// An empty simulation seeded with `seed`.
    pub fn new(seed: u64, rules: FaultRules) -> Self {
        Sim {
            nodes: Vec::new(),
            now: 0,
            seed,
            rules,
            stats: FabricStats::default(),
            intercept: None,
            rng: ChaCha8Rng::seed_from_u64(seed),
            queue: BinaryHeap::new(),
            queued: Vec::new(),
            seq: 0,
            tracker: Tracker::default(),
            buf: vec![0; 8192],
            steps: 0,
        }
    }

    /// Adds a node; returns its index.
    pub fn add_node(&mut self, config: EngineConfig) -> usize {
        let i = self.nodes.len();
        let mut gid = [0u8; 16];
        gid[10] = 0xFF;
        gid[11] = 0xFF;
        gid[12..].copy_from_slice(&[10, 0, 0, i as u8 + 1]);
        let engine = Engine::new(config);
        self.queued.push(0);
        self.buf
            .resize(engine.max_packet_len().max(self.buf.len()), 0);
        self.nodes.push(Node {
            engine,
            mem: SimMemory::new(),
            gid,
            completions: Vec::new(),
            events: Vec::new(),
            down: false,
        });
        i
    }

    fn error(&self, kind: SimErrorKind) -> SimError {
        SimError {
            seed: self.seed,
            now: self.now,
            kind,
        }
    }

    /// Records QP facts the invariant checks need (call after `create_qp`).
    pub fn track_qp(&mut self, node: usize, qpn: u32, sq_sig_all: bool, srq: Option<SrqId>) {
        self.tracker.sig_all.insert((node, qpn), sq_sig_all);
        if let Some(s) = srq {
            self.tracker.qp_srq.insert((node, qpn), s.0);
        }
    }

    /// `post_send` on `node`, tracked for the invariants.
    pub fn post_send(&mut self, node: usize, qpn: u32, wr: SendWr) -> Result<(), SimError> {
        let sig_all = self
            .tracker
            .sig_all
            .get(&(node, qpn))
            .copied()
            .unwrap_or(false);
        let signaled = sig_all || wr.flags.contains(SendFlags::SIGNALED);
        let wr_id = wr.wr_id;
        self.nodes[node]
            .engine
            .post_send(qpn, wr)
            .map_err(|e| self.error(SimErrorKind::Verb(e)))?;
        self.tracker
            .sends
            .entry((node, qpn))
            .or_default()
            .push_back((wr_id, signaled));
        self.collect()
    }

    /// `post_recv` on `node`, tracked.
    pub fn post_recv(&mut self, node: usize, qpn: u32, wr: RecvWr) -> Result<(), SimError> {
        let wr_id = wr.wr_id;
        self.nodes[node]
            .engine
            .post_recv(qpn, wr)
            .map_err(|e| self.error(SimErrorKind::Verb(e)))?;
        self.tracker
            .recvs
            .entry((node, qpn))
            .or_default()
            .push_back(wr_id);
        self.collect()
    }

    /// `post_srq_recv` on `node`, tracked.
    pub fn post_srq_recv(&mut self, node: usize, srq: SrqId, wr: RecvWr) -> Result<(), SimError> {
        let wr_id = wr.wr_id;
        self.nodes[node]
            .engine
            .post_srq_recv(srq, wr)
            .map_err(|e| self.error(SimErrorKind::Verb(e)))?;
        self.tracker
            .srq_recvs
            .entry((node, srq.0))
            .or_default()
            .insert(wr_id);
        Ok(())
    }

    /// Delivers raw bytes to `node` now, bypassing the fabric (a rogue peer).
    pub fn inject(&mut self, node: usize, bytes: &[u8]) -> Result<(), SimError> {
        let Node { engine, mem, .. } = &mut self.nodes[node];
        engine.handle_packet(self.now, bytes, None, mem);
        self.collect()
    }

    /// Lets every node transmit everything it has now, into the fabric, without delivering
    /// a packet or moving the clock (the first half of [`Sim::step`]). A test that injects
    /// packets one by one calls it between them, as a device drains `poll_transmit` after
    /// every input. Returns the number of packets sent.
    pub fn transmit(&mut self) -> Result<u64, SimError> {
        let mut sent = 0u64;
        for i in 0..self.nodes.len() {
            loop {
                let now = self.now;
                let Node { engine, mem, .. } = &mut self.nodes[i];
                let Some(t) = engine.poll_transmit(now, &mut self.buf, mem) else {
                    break;
                };
                let bytes = self.buf[..t.len].to_vec();
                self.send(i, t, &bytes);
                sent += 1;
                if sent > 1_000_000 {
                    return Err(self.error(SimErrorKind::Livelock { steps: self.steps }));
                }
            }
        }
        self.collect()?;
        Ok(sent)
    }

    fn route(&self, gid: &[u8; 16]) -> Option<usize> {
        self.nodes.iter().position(|n| &n.gid == gid)
    }

    fn send(&mut self, from: usize, t: Transmit, bytes: &[u8]) {
        self.stats.sent += 1;
        let Some(to) = self.route(&t.av.dgid) else {
            self.stats.unroutable += 1;
            return;
        };
        if self.nodes[from].down || self.nodes[to].down {
            self.stats.dropped += 1;
            return;
        }
        let mut pkt = bytes.to_vec();
        if let Some(hook) = self.intercept.as_mut() {
            if !hook(from, to, &mut pkt) {
                self.stats.dropped += 1;
                return;
            }
        }
        if let Ok((ip, udp)) = self.headers(from, to, pkt.len()) {
            let _ = icrc::fill(&ip, &udp, &mut pkt);
        }
        if self.rng.gen_bool(self.rules.drop) {
            self.stats.dropped += 1;
            return;
        }
        let copies = if self.rng.gen_bool(self.rules.duplicate) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut bytes = pkt.clone();
            if self.rng.gen_bool(self.rules.corrupt) && !bytes.is_empty() {
                let i = self.rng.gen_range(0..bytes.len());
                bytes[i] ^= 1 << self.rng.gen_range(0..8);
                self.stats.corrupted += 1;
            }
            let mut delay = self.rules.latency_ns;
            if self.rules.jitter_ns > 0 && self.rng.gen_bool(self.rules.reorder) {
                delay += self.rng.gen_range(0..self.rules.jitter_ns);
                self.stats.reordered += 1;
            }
            if self.rules.receive_queue > 0 && self.queued[to] >= self.rules.receive_queue {
                self.stats.overflowed += 1;
                continue;
            }
            self.queued[to] += 1;
            self.stats.peak_queued = self.stats.peak_queued.max(self.queued[to] as u64);
            self.seq += 1;
            self.queue.push(Reverse(InFlight {
                at: self.now + delay,
                seq: self.seq,
                from,
                to,
                bytes,
            }));
        }
    }

    fn headers(
        &self,
        from: usize,
        to: usize,
        len: usize,
    ) -> Result<(IpHeaderInfo, UdpHeaderInfo), softverbs_wire::WireError> {
        let udp = UdpHeaderInfo::rocev2(0xC000, len)?;
        let ip = IpHeaderInfo::linux_ipv4(
            self.nodes[from].ipv4(),
            self.nodes[to].ipv4(),
            0,
            64,
            udp.length,
        )?;
        Ok((ip, udp))
    }

    fn deliver(&mut self, p: InFlight) {
        self.queued[p.to] = self.queued[p.to].saturating_sub(1);
        let Ok((ip, udp)) = self.headers(p.from, p.to, p.bytes.len()) else {
            return;
        };
        if self.nodes[p.to].down {
            self.stats.dropped += 1;
            return;
        }
        if icrc::verify(&ip, &udp, &p.bytes).is_err() {
            // What a device does with a bad ICRC: drop silently (reference §1.7).
            return;
        }
        let mut grh = [0u8; 40];
        let is_ud = p.bytes.first().is_some_and(|op| op >> 5 == 3);
        if is_ud {
            let _ = ip.emit(&mut grh[20..]);
        }
        self.stats.delivered += 1;
        let now = self.now;
        let Node { engine, mem, .. } = &mut self.nodes[p.to];
        engine.handle_packet(now, &p.bytes, is_ud.then_some(&grh), mem);
    }

    /// Polls every node's completions and events and checks the invariants.
    fn collect(&mut self) -> Result<(), SimError> {
        for i in 0..self.nodes.len() {
            while let Some(c) = self.nodes[i].engine.poll_completion() {
                if let Err(msg) = self.check_completion(i, &c) {
                    return Err(self.error(SimErrorKind::Invariant(msg)));
                }
                self.nodes[i].completions.push(c);
            }
            while let Some(e) = self.nodes[i].engine.poll_event() {
                self.nodes[i].events.push(e);
            }
            let node = &self.nodes[i];
            if let Err(msg) = node
                .engine
                .check_peer_windows()
                .and_then(|()| node.engine.check_schedule(&node.mem))
            {
                return Err(self.error(SimErrorKind::Invariant(format!("node {i}: {msg}"))));
            }
        }
        Ok(())
    }

    /// Invariants (with [`Engine::check_peer_windows`] and [`Engine::check_schedule`] after
    /// every step): every completion matches a posted, not yet completed WR; send
    /// completions of a QP come in posting order (an unsignaled WR before a completed one
    /// is implicitly complete, a signaled one must have completed first); receive
    /// completions of a QP come in posting order; SRQ entries complete once.
    fn check_completion(&mut self, node: usize, c: &Completion) -> Result<(), String> {
        let qpn = c.wc.qp_num();
        let wr_id = c.wc.wr_id();
        match c.cq {
            CqTarget::Send => {
                let q = self.tracker.sends.entry((node, qpn)).or_default();
                let Some(pos) = q.iter().position(|&(id, _)| id == wr_id) else {
                    return Err(format!(
                        "node {node} qp {qpn:#x}: send completion for wr_id {wr_id} that is not outstanding ({:?})",
                        c.wc
                    ));
                };
                if let Some(&(earlier, _)) = q.iter().take(pos).find(|&&(_, signaled)| signaled) {
                    return Err(format!(
                        "node {node} qp {qpn:#x}: send completion for wr_id {wr_id} before signaled wr_id {earlier} posted earlier"
                    ));
                }
                q.drain(..=pos);
            }
            CqTarget::Recv => {
                if let Some(&srq) = self.tracker.qp_srq.get(&(node, qpn)) {
                    let set = self.tracker.srq_recvs.entry((node, srq)).or_default();
                    if !set.remove(&wr_id) {
                        return Err(format!(
                            "node {node} srq {srq}: completion for wr_id {wr_id} not outstanding"
                        ));
                    }
                } else {
                    let q = self.tracker.recvs.entry((node, qpn)).or_default();
                    match q.front() {
                        Some(&front) if front == wr_id => {
                            q.pop_front();
                        }
                        other => {
                            return Err(format!(
                                "node {node} qp {qpn:#x}: receive completion for wr_id {wr_id}, expected {other:?}"
                            ))
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// One unit of work: every node transmits what it can; then the earliest due packet is
    /// delivered, or time advances to the next packet or timer. Returns false when there
    /// was nothing to do at all.
    pub fn step(&mut self) -> Result<bool, SimError> {
        self.steps += 1;
        let mut did = false;
        for i in 0..self.nodes.len() {
            let mut burst = 0u32;
            loop {
                let now = self.now;
                let Node { engine, mem, .. } = &mut self.nodes[i];
                let Some(t) = engine.poll_transmit(now, &mut self.buf, mem) else {
                    break;
                };
                let bytes = self.buf[..t.len].to_vec();
                self.send(i, t, &bytes);
                did = true;
                burst += 1;
                if burst > 1_000_000 {
                    return Err(self.error(SimErrorKind::Livelock { steps: self.steps }));
                }
            }
        }
        self.collect()?;
        if let Some(Reverse(p)) = self.queue.peek() {
            if p.at <= self.now {
                let Some(Reverse(p)) = self.queue.pop() else {
                    unreachable!()
                };
                self.deliver(p);
                self.collect()?;
                return Ok(true);
            }
        }
        let next_packet = self.queue.peek().map(|Reverse(p)| p.at);
        let next_timer = self
            .nodes
            .iter()
            .filter(|n| !n.down)
            .filter_map(|n| n.engine.poll_timeout())
            .min();
        let next = match (next_packet, next_timer) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(t) => t,
                None => return Ok(did),
            },
        };
        self.now = self.now.max(next);
        let now = self.now;
        for n in self.nodes.iter_mut().filter(|n| !n.down) {
            if n.engine.poll_timeout().is_some_and(|t| t <= now) {
                n.engine.handle_timeout(now);
            }
        }
        self.collect()?;
        Ok(true)
    }

    /// Steps until `goal` holds; fails on an invariant, on livelock (`max_steps`
    /// exhausted) or when nothing is left to do.
    pub fn run_until(
        &mut self,
        max_steps: u64,
        mut goal: impl FnMut(&Sim) -> bool,
    ) -> Result<(), SimError> {
        let start = self.steps;
        loop {
            if goal(self) {
                return Ok(());
            }
            if self.steps - start >= max_steps {
                return Err(self.error(SimErrorKind::Livelock { steps: max_steps }));
            }
            if !self.step()? {
                return if goal(self) {
                    Ok(())
                } else {
                    Err(self.error(SimErrorKind::Stalled))
                };
            }
        }
    }

    /// Steps until nothing is left to do (no packet in flight, no timer armed); fails on
    /// an invariant or livelock.
    pub fn run_idle(&mut self, max_steps: u64) -> Result<(), SimError> {
        let start = self.steps;
        loop {
            if self.steps - start >= max_steps {
                return Err(self.error(SimErrorKind::Livelock { steps: max_steps }));
            }
            if !self.step()? {
                return Ok(());
            }
        }
    }

    /// Completions node `node` produced so far.
    pub fn completions(&self, node: usize) -> &[Completion] {
        &self.nodes[node].completions
    }

    /// Takes the completions node `node` produced so far.
    pub fn take_completions(&mut self, node: usize) -> Vec<Completion> {
        std::mem::take(&mut self.nodes[node].completions)
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }
}
