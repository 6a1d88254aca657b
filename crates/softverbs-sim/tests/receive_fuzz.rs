//! A seeded fuzz of the receive path (seeded random sequences where no
//! fuzzer is at hand; issue #11). Real packets of an RC and a UC exchange — SEND, RDMA
//! WRITE, READ request and response, atomics and their acknowledgements, ACKs — are
//! captured, then mutated (bit flips, byte changes, truncation, extension, opcode swaps,
//! and mutations that keep the BTH's destination QP and PSN so the packet reaches the QP's
//! logic) and fed to a live pair of engines while the same exchange runs again.
//!
//! Two engines are driven by hand (as `robustness.rs` does) over a FIFO wire with a
//! virtual clock, each over a [`CanaryMemory`]: one flat backing store in which the
//! registered regions are carved out and everything else holds a canary pattern. After
//! every packet, real or mutated:
//! - nothing panicked;
//! - every completion is for a posted, not yet completed work request;
//! - no byte outside the registered regions changed, nor any byte of a region no request
//!   may write (a read-only region, a region without remote access, a region of another
//!   protection domain, the local source buffers), nor any byte of a receive or read
//!   buffer outside the scatter entries posted over it.
//!
//! Phase one sends mutated packets at a high rate (their PSNs are the live ones: they
//! reach the responder's and completer's full logic), and checks only those invariants.
//! Phase two interleaves at most one mutated packet per four real ones, with its PSN moved
//! far from every live PSN (so none can take a real packet's place), and checks that the
//! exchange still completes exactly: RC delivers everything once, in order, byte for byte;
//! UC, which may lose messages under attack, delivers every message sent after the last
//! mutated packet (no stall), in order and intact.
//!
//! `SOFTVERBS_FUZZ_SEED=<n>` changes the seed, `SOFTVERBS_FUZZ_ITERS=<n>` the iteration
//! count, `SOFTVERBS_FUZZ_ONLY=<i>` replays one iteration; a failure prints all three.

use std::collections::{HashSet, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use softverbs_cq::{WcOpcode, WcStatus};
use softverbs_proto::{
    atomic_result, AccessFlags, AddressVector, AtomicOp, AttrMask, Completion, CqTarget, Engine,
    EngineConfig, MemError, MemKey, Memory, Mtu, QpAttr, QpCaps, QpInit, QpState, QpType, RecvWr,
    RegionInfo, SendOp, SendWr, Sge,
};

const DEFAULT_SEED: u64 = 0x5EED_0011;
/// Iterations by default: each runs one exchange per phase (RC or UC alternately).
const DEFAULT_ITERS: u64 = 600;

/// First address of the backing store, its size, and the canary byte at an offset.
const BASE: u64 = 0x10_0000;
const STORE: usize = 0x1_0000;
fn canary(i: usize) -> u8 {
    ((i as u32).wrapping_mul(0x9E37_79B1) >> 13) as u8 ^ 0xA5
}

/// One message slot of every buffer; messages use at most `MAX_LEN` bytes of it.
const SLOT: u64 = 1024;
const MAX_LEN: u32 = 768;
/// Receive WQEs posted at B (each `MAX_LEN` bytes over a slot of the receive region).
const RECVS: u64 = 31;
/// A's send PSN; B's is on the far side of the PSN circle, so a PSN far from A's stream
/// is far from B's as well.
const PSN_A: u32 = 0xFF_FF80;
const PSN_B: u32 = (PSN_A + 0x80_0000) & 0xFF_FFFF;
const LATENCY: u64 = 1_000;
const MAX_STEPS: u64 = 200_000;

#[derive(Clone, Copy, Debug)]
struct Region {
    addr: u64,
    len: u64,
    lkey: u32,
    rkey: u32,
    access: AccessFlags,
    pd: u32,
    valid: bool,
}

/// Registered regions carved out of one canary-filled backing store.
struct CanaryMemory {
    store: Vec<u8>,
    /// What every byte must still hold unless it is in `writable`.
    expected: Vec<u8>,
    /// Ranges (offsets into `store`) requests may legitimately change.
    writable: Vec<(usize, usize)>,
    regions: Vec<Region>,
    next_key: u32,
}

impl CanaryMemory {
    fn new() -> Self {
        let store: Vec<u8> = (0..STORE).map(canary).collect();
        CanaryMemory {
            expected: store.clone(),
            store,
            writable: Vec::new(),
            regions: Vec::new(),
            next_key: 0x100,
        }
    }

    /// Registers `len` bytes at `offset` of the store, filled with `fill`.
    fn register(
        &mut self,
        offset: u64,
        len: u64,
        access: AccessFlags,
        pd: u32,
        fill: u8,
    ) -> Region {
        let r = Region {
            addr: BASE + offset,
            len,
            lkey: self.next_key,
            rkey: self.next_key + 1,
            access,
            pd,
            valid: true,
        };
        self.next_key += 2;
        let range = offset as usize..(offset + len) as usize;
        for (k, i) in range.enumerate() {
            self.store[i] = fill.wrapping_add(k as u8);
        }
        self.expected.copy_from_slice(&self.store);
        self.regions.push(r);
        r
    }

    /// Sets bytes at `addr` (test setup: sources, read data, atomic words).
    fn fill(&mut self, addr: u64, data: &[u8]) {
        let at = (addr - BASE) as usize;
        self.store[at..at + data.len()].copy_from_slice(data);
        self.expected[at..at + data.len()].copy_from_slice(data);
    }

    fn allow_writes(&mut self, addr: u64, len: u64) {
        let at = (addr - BASE) as usize;
        self.writable.push((at, at + len as usize));
    }

    fn bytes(&self, addr: u64, len: usize) -> &[u8] {
        let at = (addr - BASE) as usize;
        &self.store[at..at + len]
    }

    /// Every byte outside the writable ranges is what it was: the canary outside the
    /// regions, the initial contents of the rest.
    fn check(&self) -> Result<(), String> {
        let mut ranges = self.writable.clone();
        ranges.sort_unstable();
        let mut at = 0usize;
        for (start, end) in ranges.into_iter().chain([(STORE, STORE)]) {
            if start > at && self.store[at..start] != self.expected[at..start] {
                let i = (at..start)
                    .find(|&i| self.store[i] != self.expected[i])
                    .unwrap_or(at);
                let inside = self
                    .regions
                    .iter()
                    .find(|r| (r.addr..r.addr + r.len).contains(&(BASE + i as u64)));
                return Err(format!(
                    "byte {:#x} changed ({:#04x} -> {:#04x}), {}",
                    BASE + i as u64,
                    self.expected[i],
                    self.store[i],
                    match inside {
                        Some(r) => format!("inside region {r:?}, where no request may write"),
                        None => "outside every registered region".to_string(),
                    }
                ));
            }
            at = at.max(end);
        }
        Ok(())
    }
}

/// The rule is the trait's provided methods; the canary memory finds a key's region and
/// copies within the store.
impl Memory for CanaryMemory {
    /// The index of the region.
    type Handle = usize;

    fn lookup(&self, key: MemKey) -> Result<(usize, RegionInfo), MemError> {
        let i = self
            .regions
            .iter()
            .position(|r| r.valid && key.names(r.lkey, r.rkey))
            .ok_or(MemError::InvalidKey)?;
        let r = self.regions[i];
        Ok((i, RegionInfo::new(r.pd, r.addr, r.len, r.access)))
    }

    fn read_region(&self, i: usize, offset: usize, buf: &mut [u8]) -> Result<(), MemError> {
        let at = (self.regions[i].addr - BASE) as usize + offset;
        buf.copy_from_slice(&self.store[at..at + buf.len()]);
        Ok(())
    }

    fn write_region(&mut self, i: usize, offset: usize, data: &[u8]) -> Result<(), MemError> {
        let at = (self.regions[i].addr - BASE) as usize + offset;
        self.store[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn atomic_region(&mut self, i: usize, offset: usize, op: AtomicOp) -> Result<u64, MemError> {
        let at = (self.regions[i].addr - BASE) as usize + offset;
        let word = &mut self.store[at..at + 8];
        let orig = u64::from_ne_bytes(word.try_into().map_err(|_| MemError::OutOfBounds)?);
        word.copy_from_slice(&atomic_result(orig, op).to_ne_bytes());
        Ok(orig)
    }

    fn invalidate_region(&mut self, i: usize) -> Result<(), MemError> {
        self.regions[i].valid = false;
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    FetchAdd,
    CompareSwap,
}

/// Message lengths: ONLY packets (0, 1, up to one MTU of 256), FIRST + LAST (257), FIRST +
/// MIDDLE + LAST (600, `MAX_LEN`), for sends, writes and reads alike.
const LENS: [u32; 14] = [0, 255, 600, 100, 256, MAX_LEN, 0, 600, 0, 1, 50, 1, 257, 30];

/// Message `i` (1-based: slot 0 of the target holds the atomic words) of an exchange.
fn message(qp_type: QpType, i: u64) -> (Kind, u32) {
    let kind = match qp_type {
        QpType::Rc => [
            Kind::Send,
            Kind::Write,
            Kind::Read,
            Kind::FetchAdd,
            Kind::SendImm,
            Kind::WriteImm,
            Kind::CompareSwap,
        ][(i % 7) as usize],
        // Every UC message carries its number as immediate data.
        _ => [Kind::SendImm, Kind::WriteImm][(i % 2) as usize],
    };
    let len = match kind {
        Kind::FetchAdd | Kind::CompareSwap => 8,
        _ => LENS[i as usize % LENS.len()],
    };
    (kind, len)
}

fn pattern(i: u64, len: u32) -> Vec<u8> {
    (0..len)
        .map(|k| (i as u8).wrapping_mul(37) ^ (k as u8).wrapping_mul(11) ^ 0x5C)
        .collect()
}

const FAA_ADD: u64 = 3;

/// Hands over mutated packets `(node, bytes)` to deliver.
type Injector<'a> = dyn FnMut(&mut ChaCha8Rng) -> Vec<(usize, Vec<u8>)> + 'a;

/// What the runs did, summed over them and printed at the end.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    /// Mutated packets fed to the engines.
    mutated: u64,
    /// Packets the engines received, real and mutated.
    received: u64,
    /// Packets they dropped (and counted).
    dropped: u64,
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, o: Tally) {
        self.mutated += o.mutated;
        self.received += o.received;
        self.dropped += o.dropped;
    }
}

/// The two nodes of an exchange: A (node 0) requests, B (node 1) responds.
struct World {
    eps: [Engine; 2],
    mems: [CanaryMemory; 2],
    qpn: [u32; 2],
    qp_type: QpType,
    now: u64,
    wire: VecDeque<(usize, Vec<u8>, u64)>,
    outstanding: HashSet<(usize, CqTarget, u64)>,
    completions: [Vec<Completion>; 2],
    /// Every packet the engines sent: (destination node, bytes).
    sent: Vec<(usize, Vec<u8>)>,
    /// Mutated packets delivered.
    mutated: u64,
    buf: Vec<u8>,
    // A's regions, B's regions.
    src: Region,
    dst: Region,
    recv: Region,
    target: Region,
}

fn bring_up(ep: &mut Engine, qpn: u32, qp_type: QpType, peer: u32, sq: u32, rq: u32) {
    let all = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let mut attr = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: if qp_type == QpType::Rc {
            all
        } else {
            AccessFlags::REMOTE_WRITE
        },
        ..QpAttr::default()
    };
    let m = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
    ep.modify_qp(qpn, &attr, m).expect("INIT");
    attr.qp_state = QpState::Rtr;
    attr.ah_attr = AddressVector {
        port_num: 1,
        hop_limit: 64,
        is_global: true,
        ..AddressVector::default()
    };
    attr.path_mtu = Mtu::Mtu256;
    attr.dest_qp_num = peer;
    attr.rq_psn = rq;
    attr.max_dest_rd_atomic = 4;
    attr.min_rnr_timer = 1;
    let mut m = AttrMask::STATE | AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN;
    m |= AttrMask::RQ_PSN;
    if qp_type == QpType::Rc {
        m |= AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
    }
    ep.modify_qp(qpn, &attr, m).expect("RTR");
    attr.qp_state = QpState::Rts;
    attr.sq_psn = sq;
    attr.timeout = 10;
    attr.retry_cnt = 7;
    attr.rnr_retry = 7;
    attr.max_rd_atomic = 4;
    let mut m = AttrMask::STATE | AttrMask::SQ_PSN;
    if qp_type == QpType::Rc {
        m |= AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::MAX_QP_RD_ATOMIC;
    }
    ep.modify_qp(qpn, &attr, m).expect("RTS");
}

impl World {
    /// Two connected QPs of `qp_type`, their memory, B's receives and the read sources;
    /// always the same QPNs, PSNs, keys and addresses, so captured packets fit any world.
    fn new(qp_type: QpType) -> World {
        let mut eps = [
            Engine::new(EngineConfig::default()),
            Engine::new(EngineConfig::default()),
        ];
        let caps = QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            ..QpCaps::default()
        };
        let init = QpInit {
            caps,
            sq_sig_all: true,
            ..QpInit::new(qp_type)
        };
        let qa = eps[0].create_qp(init).expect("QP A");
        let qb = eps[1].create_qp(init).expect("QP B");
        bring_up(&mut eps[0], qa, qp_type, qb, PSN_A, PSN_B);
        bring_up(&mut eps[1], qb, qp_type, qa, PSN_B, PSN_A);
        let all = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let mut a = CanaryMemory::new();
        let src = a.register(0x1000, 16 * SLOT, AccessFlags::LOCAL_WRITE, 0, 0x11);
        let dst = a.register(0x5400, 16 * SLOT, AccessFlags::LOCAL_WRITE, 0, 0x22);
        let mut b = CanaryMemory::new();
        let recv = b.register(0x1000, 32 * SLOT, AccessFlags::LOCAL_WRITE, 0, 0x33);
        let target = b.register(0x9400, 16 * SLOT, all, 0, 0x44);
        // Regions no request may change: read-only, local-only, another PD's.
        b.register(0xD800, SLOT, AccessFlags::REMOTE_READ, 0, 0x55);
        b.register(0xE000, SLOT, AccessFlags::LOCAL_WRITE, 0, 0x66);
        b.register(0xE800, SLOT, all, 1, 0x77);
        b.allow_writes(target.addr, target.len);
        b.fill(target.addr, &[0u8; 16]); // the atomic words
        let mut w = World {
            eps,
            mems: [a, b],
            qpn: [qa, qb],
            qp_type,
            now: 0,
            wire: VecDeque::new(),
            outstanding: HashSet::new(),
            completions: [Vec::new(), Vec::new()],
            sent: Vec::new(),
            mutated: 0,
            buf: vec![0; 8192],
            src,
            dst,
            recv,
            target,
        };
        for j in 0..RECVS {
            let sge = Sge {
                addr: recv.addr + j * SLOT,
                length: MAX_LEN,
                lkey: recv.lkey,
            };
            w.mems[1].allow_writes(sge.addr, u64::from(sge.length));
            let wr = RecvWr {
                wr_id: j,
                sg_list: [sge].into(),
            };
            w.eps[1].post_recv(qb, wr).expect("post_recv");
            w.outstanding.insert((1, CqTarget::Recv, j));
        }
        for i in 1..14u64 {
            let (kind, len) = message(qp_type, i);
            let off = i * SLOT;
            w.mems[0].fill(src.addr + off, &pattern(i, len));
            if kind == Kind::Read {
                w.mems[1].fill(target.addr + off, &pattern(i, len));
            }
        }
        w
    }

    /// Posts messages `range` at A.
    fn post(&mut self, range: std::ops::Range<u64>) {
        let (src, dst, target) = (self.src, self.dst, self.target);
        let mut cas = 0u64;
        for i in range {
            let (kind, len) = message(self.qp_type, i);
            let off = i * SLOT;
            let remote_addr = target.addr + off;
            let rkey = target.rkey;
            let from = |r: &Region| Sge {
                addr: r.addr + off,
                length: len,
                lkey: r.lkey,
            };
            let (op, sge) = match kind {
                Kind::Send => (SendOp::Send, from(&src)),
                Kind::SendImm => (SendOp::SendWithImm { imm: i as u32 }, from(&src)),
                Kind::Write => (SendOp::RdmaWrite { remote_addr, rkey }, from(&src)),
                Kind::WriteImm => (
                    SendOp::RdmaWriteWithImm {
                        remote_addr,
                        rkey,
                        imm: i as u32,
                    },
                    from(&src),
                ),
                Kind::Read => (SendOp::RdmaRead { remote_addr, rkey }, from(&dst)),
                Kind::FetchAdd => (
                    SendOp::FetchAdd {
                        remote_addr: target.addr,
                        rkey,
                        add: FAA_ADD,
                    },
                    from(&dst),
                ),
                Kind::CompareSwap => {
                    let swap = 1000 + i;
                    let op = SendOp::CompareSwap {
                        remote_addr: target.addr + 8,
                        rkey,
                        compare: cas,
                        swap,
                    };
                    cas = swap;
                    (op, from(&dst))
                }
            };
            if matches!(kind, Kind::Read | Kind::FetchAdd | Kind::CompareSwap) {
                self.mems[0].allow_writes(sge.addr, u64::from(sge.length));
            }
            self.eps[0]
                .post_send(self.qpn[0], SendWr::new(i, op, vec![sge]))
                .expect("post_send");
            self.outstanding.insert((0, CqTarget::Send, i));
        }
    }

    fn tally(&self) -> Tally {
        Tally {
            mutated: self.mutated,
            received: self.eps.iter().map(|e| e.counters().packets_received).sum(),
            dropped: self.eps.iter().map(|e| e.counters().total_drops()).sum(),
        }
    }

    /// Drains completions and checks every invariant.
    fn check(&mut self) -> Result<(), String> {
        for n in 0..2 {
            while let Some(c) = self.eps[n].poll_completion() {
                if !self.outstanding.remove(&(n, c.cq, c.wc.wr_id())) {
                    return Err(format!(
                        "node {n}: completion for a work request not outstanding: {c:?}"
                    ));
                }
                self.completions[n].push(c);
            }
            while self.eps[n].poll_event().is_some() {}
            self.mems[n].check().map_err(|e| format!("node {n}: {e}"))?;
        }
        Ok(())
    }

    fn deliver(&mut self, to: usize, bytes: &[u8]) -> Result<(), String> {
        let now = self.now;
        self.eps[to].handle_packet(now, bytes, None, &mut self.mems[to]);
        self.check()
    }

    fn transmit(&mut self) -> Result<(), String> {
        for n in 0..2 {
            let mut burst = 0u32;
            while let Some(t) = self.eps[n].poll_transmit(self.now, &mut self.buf, &self.mems[n]) {
                let bytes = self.buf[..t.len].to_vec();
                self.sent.push((1 - n, bytes.clone()));
                self.wire.push_back((1 - n, bytes, self.now + LATENCY));
                burst += 1;
                if burst > 100_000 {
                    return Err(format!("node {n}: endless transmit burst"));
                }
            }
        }
        self.check()
    }

    /// Runs until nothing is in flight and no timer is armed; after every `every`-th real
    /// packet delivered, `inject` may hand over mutated packets `(node, bytes)`.
    fn run(
        &mut self,
        every: u64,
        inject: &mut Injector<'_>,
        rng: &mut ChaCha8Rng,
    ) -> Result<(), String> {
        let mut delivered = 0u64;
        for _ in 0..MAX_STEPS {
            self.transmit()?;
            if let Some(&(_, _, at)) = self.wire.front() {
                if at <= self.now {
                    let Some((to, bytes, _)) = self.wire.pop_front() else {
                        unreachable!()
                    };
                    self.deliver(to, &bytes)?;
                    delivered += 1;
                    if every > 0 && delivered.is_multiple_of(every) {
                        for (to, bytes) in inject(rng) {
                            self.mutated += 1;
                            self.deliver(to, &bytes)?;
                        }
                    }
                    continue;
                }
            }
            let next_packet = self.wire.front().map(|p| p.2);
            let next_timer = self.eps.iter().filter_map(Engine::poll_timeout).min();
            let next = match (next_packet, next_timer) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => match a.or(b) {
                    Some(t) => t,
                    None => return Ok(()),
                },
            };
            self.now = self.now.max(next);
            for ep in self.eps.iter_mut() {
                if ep.poll_timeout().is_some_and(|t| t <= self.now) {
                    ep.handle_timeout(self.now);
                }
            }
            self.check()?;
        }
        Err(format!("no quiescence in {MAX_STEPS} steps"))
    }
}

/// Opcodes every capture must hold: the FIRST / MIDDLE / LAST packets of multi-packet
/// sends, writes and read responses, READ request, ACK, atomic ACK, both atomics.
const FIRST_OF: [u8; 16] = [
    0x00, 0x01, 0x06, 0x07, 0x0C, 0x0D, 0x0E, 0x0F, 0x10, 0x11, 0x12, 0x13, 0x14, 0x20, 0x21, 0x26,
];

/// The opcodes a swap picks from: every RC and UC opcode, a few UD and unknown ones.
const OPCODES: [u8; 32] = [
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F,
    0x10, 0x11, 0x12, 0x13, 0x14, 0x16, 0x17, 0x20, 0x21, 0x22, 0x24, 0x26, 0x28, 0x2A, 0x64, 0x1C,
];

/// A mutation of `pkt`. With `keep_target`, the destination QP and PSN (BTH bytes 5..12)
/// are kept as they were, so the packet reaches the QP's PSN logic where the original did.
fn mutate(rng: &mut ChaCha8Rng, pkt: &[u8], keep_target: bool) -> Vec<u8> {
    let mut p = pkt.to_vec();
    for _ in 0..rng.gen_range(1..=3) {
        match rng.gen_range(0..7) {
            0 if !p.is_empty() => {
                let i = rng.gen_range(0..p.len());
                p[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if !p.is_empty() => {
                let i = rng.gen_range(0..p.len());
                p[i] = rng.gen();
            }
            2 if !p.is_empty() => {
                let keep = rng.gen_range(0..p.len());
                p.truncate(keep);
            }
            3 => {
                for _ in 0..rng.gen_range(1..64) {
                    p.push(rng.gen());
                }
            }
            4 if !p.is_empty() => p[0] = OPCODES[rng.gen_range(0..OPCODES.len())],
            5 if p.len() > 12 => {
                // Extension headers and payload: RETH VA / R_Key / length, AETH, atomic
                // operands, immediate data.
                let i = rng.gen_range(12..p.len());
                p[i] = rng.gen();
            }
            6 if p.len() > 12 => {
                // Header flags: SE, migration, pad count, AckReq.
                p[1] ^= 1 << rng.gen_range(4..8);
                p[8] ^= 0x80;
            }
            _ => {}
        }
    }
    if keep_target && p.len() >= 12 && pkt.len() >= 12 {
        p[4..12].copy_from_slice(&pkt[4..12]);
    }
    p
}

/// Moves the PSN of `p` far (a quarter of the PSN circle or more) from both live streams.
fn far_psn(rng: &mut ChaCha8Rng, p: &mut [u8]) {
    if p.len() >= 12 {
        let psn = (PSN_A + rng.gen_range(0x30_0000..0x50_0000)) & 0xFF_FFFF;
        p[9..12].copy_from_slice(&psn.to_be_bytes()[1..]);
    }
}

/// The captured packets of a clean exchange of `qp_type`.
fn capture(qp_type: QpType) -> Vec<(usize, Vec<u8>)> {
    let mut w = World::new(qp_type);
    w.post(1..14);
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    w.run(0, &mut |_| Vec::new(), &mut rng)
        .expect("clean exchange");
    let sends = w.completions[0].len();
    assert_eq!(sends, 13, "clean exchange completes");
    w.sent
}

/// Phase one: mutated packets at a high rate, live PSNs; invariants only.
fn invariants_under_mutation(
    rng: &mut ChaCha8Rng,
    qp_type: QpType,
    real: &[(usize, Vec<u8>)],
) -> Result<Tally, String> {
    let mut w = World::new(qp_type);
    w.post(1..14);
    let mut budget = 200u32;
    let mut inject = |rng: &mut ChaCha8Rng| {
        let mut out = Vec::new();
        for _ in 0..rng.gen_range(1..=3) {
            if budget == 0 {
                break;
            }
            budget -= 1;
            let (to, pkt) = &real[rng.gen_range(0..real.len())];
            let keep = rng.gen_bool(0.5);
            let to = if rng.gen_bool(0.125) { 1 - to } else { *to };
            out.push((to, mutate(rng, pkt, keep)));
        }
        out
    };
    w.run(1, &mut inject, rng)?;
    // And the rest straight at both engines, QPs in whatever state the run left them.
    for _ in 0..budget {
        let (to, pkt) = &real[rng.gen_range(0..real.len())];
        let keep = rng.gen_bool(0.5);
        let p = mutate(rng, pkt, keep);
        w.mutated += 1;
        w.deliver(*to, &p)?;
        w.transmit()?;
    }
    Ok(w.tally())
}

/// Phase two: at most one mutated packet per four real ones, PSNs far from the live
/// streams; the exchange must complete exactly (RC) or deliver everything sent after the
/// mutated packets stopped (UC).
fn exchange_survives_bounded_mutation(
    rng: &mut ChaCha8Rng,
    qp_type: QpType,
    real: &[(usize, Vec<u8>)],
) -> Result<Tally, String> {
    let mut w = World::new(qp_type);
    let mut inject = |rng: &mut ChaCha8Rng| {
        let (to, pkt) = &real[rng.gen_range(0..real.len())];
        let mut p = mutate(rng, pkt, false);
        far_psn(rng, &mut p);
        vec![(*to, p)]
    };
    match qp_type {
        QpType::Rc => {
            w.post(1..14);
            w.run(4, &mut inject, rng)?;
            verify_rc(&w)?;
        }
        _ => {
            w.post(1..7);
            w.run(4, &mut inject, rng)?;
            let before = w.completions[1].len();
            w.post(7..14);
            w.run(0, &mut inject, rng)?;
            verify_uc_tail(&w, before, 7..14)?;
        }
    }
    Ok(w.tally())
}

fn verify_rc(w: &World) -> Result<(), String> {
    let sends: Vec<_> = w.completions[0]
        .iter()
        .filter(|c| c.cq == CqTarget::Send)
        .collect();
    if sends.len() != 13 {
        return Err(format!("{} of 13 send completions", sends.len()));
    }
    let mut recv_index = 0usize;
    let recvs: Vec<_> = w.completions[1]
        .iter()
        .filter(|c| c.cq == CqTarget::Recv)
        .collect();
    let (mut faa, mut cas) = (0u64, 0u64);
    for (c, i) in sends.iter().zip(1u64..) {
        let (kind, len) = message(QpType::Rc, i);
        let off = i * SLOT;
        if c.wc.wr_id() != i || c.wc.status() != WcStatus::Success {
            return Err(format!("send {i}: {:?}", c.wc));
        }
        let want = pattern(i, len);
        match kind {
            Kind::Send | Kind::SendImm | Kind::WriteImm => {
                let Some(r) = recvs.get(recv_index) else {
                    return Err(format!("message {i}: no receive completion"));
                };
                let imm = (kind != Kind::Send).then_some(i as u32);
                let opcode = if kind == Kind::WriteImm {
                    WcOpcode::RecvRdmaWithImm
                } else {
                    WcOpcode::Recv
                };
                let ok = r.wc.result().is_ok_and(|d| {
                    d.wr_id() == recv_index as u64
                        && d.byte_len() == len
                        && d.imm_data() == imm
                        && d.opcode() == opcode
                });
                if !ok {
                    return Err(format!("message {i}: receive completion {:?}", r.wc));
                }
                let at = if kind == Kind::WriteImm {
                    w.target.addr + off
                } else {
                    w.recv.addr + recv_index as u64 * SLOT
                };
                if w.mems[1].bytes(at, len as usize) != &want[..] {
                    return Err(format!("message {i}: data"));
                }
                recv_index += 1;
            }
            Kind::Write => {
                if w.mems[1].bytes(w.target.addr + off, len as usize) != &want[..] {
                    return Err(format!("write {i}: data"));
                }
            }
            Kind::Read => {
                if w.mems[0].bytes(w.dst.addr + off, len as usize) != &want[..] {
                    return Err(format!("read {i}: data"));
                }
            }
            Kind::FetchAdd | Kind::CompareSwap => {
                let got = u64::from_ne_bytes(
                    w.mems[0]
                        .bytes(w.dst.addr + off, 8)
                        .try_into()
                        .unwrap_or_default(),
                );
                let orig = if kind == Kind::FetchAdd { faa } else { cas };
                if got != orig {
                    return Err(format!("atomic {i}: original {got}, expected {orig}"));
                }
                if kind == Kind::FetchAdd {
                    faa += FAA_ADD;
                } else {
                    cas = 1000 + i;
                }
            }
        }
    }
    if recvs.len() != recv_index {
        return Err(format!(
            "{} receive completions, {recv_index} expected",
            recvs.len()
        ));
    }
    let word = |off: u64| {
        u64::from_ne_bytes(
            w.mems[1]
                .bytes(w.target.addr + off, 8)
                .try_into()
                .unwrap_or_default(),
        )
    };
    if word(0) != faa || word(8) != cas {
        return Err(format!("atomic words {} / {}", word(0), word(8)));
    }
    Ok(())
}

/// The receive completions after the first `before` are exactly the `tail` messages.
fn verify_uc_tail(w: &World, before: usize, tail: std::ops::Range<u64>) -> Result<(), String> {
    let sends = w.completions[0].len();
    if sends != 13
        || w.completions[0]
            .iter()
            .any(|c| c.wc.status() != WcStatus::Success)
    {
        return Err(format!("UC send completions: {sends} of 13, or one failed"));
    }
    // (Before them, messages may be lost, or forged: UC cannot tell a forged FIRST or ONLY
    // packet from a real one.)
    let got: Vec<_> = w.completions[1][before..]
        .iter()
        .filter_map(|c| c.wc.result().ok())
        .collect();
    if got.len() != w.completions[1].len() - before {
        return Err("a receive of the tail failed".to_string());
    }
    let numbers: Vec<u64> = got
        .iter()
        .map(|d| u64::from(d.imm_data().unwrap_or(0)))
        .collect();
    if numbers != tail.clone().collect::<Vec<_>>() {
        return Err(format!("UC messages after the mutations: {numbers:?}"));
    }
    for d in got {
        let i = u64::from(d.imm_data().unwrap_or(0));
        let (kind, len) = message(QpType::Uc, i);
        let at = if kind == Kind::WriteImm {
            w.target.addr + i * SLOT
        } else {
            w.recv.addr + d.wr_id() * SLOT
        };
        if d.byte_len() != len || w.mems[1].bytes(at, len as usize) != &pattern(i, len)[..] {
            return Err(format!("UC message {i}: {d:?}"));
        }
    }
    Ok(())
}

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

#[test]
fn mutated_real_packets_keep_every_invariant_and_the_exchange_completes() {
    let seed = env("SOFTVERBS_FUZZ_SEED").unwrap_or(DEFAULT_SEED);
    let iters = env("SOFTVERBS_FUZZ_ITERS").unwrap_or(DEFAULT_ITERS);
    let only = env("SOFTVERBS_FUZZ_ONLY");
    let rc = capture(QpType::Rc);
    let uc = capture(QpType::Uc);
    let has = |log: &[(usize, Vec<u8>)], ops: std::ops::RangeInclusive<u8>| {
        ops.clone()
            .all(|op| log.iter().any(|(_, b)| b[0] == op) || !FIRST_OF.contains(&op))
            && log.iter().any(|(_, b)| ops.contains(&b[0]))
    };
    // SEND, RDMA WRITE, READ request and responses (FIRST, MIDDLE, LAST, ONLY), ACK,
    // atomic ACK, atomics; UC SEND and RDMA WRITE.
    for ops in [
        0x00..=0x05,
        0x06..=0x0B,
        0x0C..=0x0C,
        0x0D..=0x10,
        0x11..=0x14,
    ] {
        assert!(
            has(&rc, ops.clone()),
            "the RC capture has opcodes {ops:#04x?}"
        );
    }
    for ops in [0x20..=0x25, 0x26..=0x2B] {
        assert!(
            has(&uc, ops.clone()),
            "the UC capture has opcodes {ops:#04x?}"
        );
    }
    let mut tally = [Tally::default(); 2];
    for i in 0..iters {
        if only.is_some_and(|o| o != i) {
            continue;
        }
        let (qp_type, real) = if i % 2 == 0 {
            (QpType::Rc, &rc)
        } else {
            (QpType::Uc, &uc)
        };
        let iter_seed = seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let mut rng = ChaCha8Rng::seed_from_u64(iter_seed);
            let one = invariants_under_mutation(&mut rng, qp_type, real)
                .map_err(|e| format!("phase 1 (invariants): {e}"))?;
            let two = exchange_survives_bounded_mutation(&mut rng, qp_type, real)
                .map_err(|e| format!("phase 2 (bounded rate): {e}"))?;
            Ok::<_, String>((one, two))
        }));
        let failure = match outcome {
            Ok(Ok((one, two))) => {
                tally[0] += one;
                tally[1] += two;
                continue;
            }
            Ok(Err(e)) => e,
            Err(panic) => format!(
                "panic: {}",
                panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("?")
            ),
        };
        panic!(
            "receive fuzz failed, {qp_type:?}, seed {seed}, iteration {i}: {failure}\n  replay: \
             SOFTVERBS_FUZZ_SEED={seed} SOFTVERBS_FUZZ_ONLY={i} cargo test -p softverbs-sim \
             --test receive_fuzz"
        );
    }
    println!(
        "receive fuzz, seed {seed}, {iters} iterations: phase 1 {:?}; phase 2 {:?}",
        tally[0], tally[1]
    );
    assert!(
        only.is_some() || tally[0].mutated >= iters * 150,
        "the mutated packets were fed"
    );
}
