//! Shared scenario pieces: a two-node world and a mixed-opcode traffic generator whose
//! every byte and completion is checked.

#![allow(dead_code)]

use std::cell::RefCell;
use std::rc::Rc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use softverbs_cq::{WcFlags, WcOpcode, WcStatus};
use softverbs_proto::{
    AccessFlags, CqTarget, EngineConfig, Mtu, QpType, RecvWr, SendFlags, SendOp, SendWr, Sge,
};
use softverbs_sim::{connect, FaultRules, Mr, QpParams, Sim, SimError};
use softverbs_wire::Opcode;

pub const ALL_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// Two nodes with default engine config.
pub fn two_nodes(seed: u64, rules: FaultRules) -> Sim {
    let mut sim = Sim::new(seed, rules);
    sim.add_node(EngineConfig::default());
    sim.add_node(EngineConfig::default());
    sim
}

pub fn sge(mr: &Mr, offset: u64, len: u32) -> Sge {
    Sge {
        addr: mr.addr + offset,
        length: len,
        lkey: mr.lkey,
    }
}

pub fn recv(wr_id: u64, mr: &Mr, offset: u64, len: u32) -> RecvWr {
    RecvWr {
        wr_id,
        sg_list: [sge(mr, offset, len)].into(),
    }
}

/// Every packet `(from node, bytes)` in send order.
pub type Capture = Rc<RefCell<Vec<(usize, Vec<u8>)>>>;

/// Records every packet the simulator carries from now on (and lets it through).
pub fn capture(sim: &mut Sim) -> Capture {
    let log: Capture = Rc::new(RefCell::new(Vec::new()));
    let sink = log.clone();
    sim.intercept = Some(Box::new(move |from, _, b: &mut Vec<u8>| {
        sink.borrow_mut().push((from, b.clone()));
        true
    }));
    log
}

/// The PSN of the BTH of packet `b`.
pub fn psn_of(b: &[u8]) -> u32 {
    u32::from_be_bytes([0, b[9], b[10], b[11]])
}

/// The first packet captured from node `from` with BTH opcode `opcode`.
pub fn first_packet(log: &Capture, from: usize, opcode: Opcode) -> Vec<u8> {
    log.borrow()
        .iter()
        .find(|(f, b)| *f == from && b[0] == opcode.0)
        .map(|(_, b)| b.clone())
        .unwrap_or_else(|| panic!("a packet of opcode {:#04x} from node {from}", opcode.0))
}

/// The original values every AtomicAck captured from node `from` carries, in order.
pub fn atomic_ack_values(log: &Capture, from: usize) -> Vec<u64> {
    log.borrow()
        .iter()
        .filter(|(f, b)| *f == from && b[0] == Opcode::RC_ATOMIC_ACKNOWLEDGE.0)
        .map(|(_, b)| u64::from_be_bytes(b[16..24].try_into().unwrap()))
        .collect()
}

/// The 8-byte word (native byte order) at `addr` of `node`'s memory.
pub fn word_at(sim: &Sim, node: usize, addr: u64) -> u64 {
    u64::from_ne_bytes(sim.nodes[node].mem.bytes(addr, 8).try_into().unwrap())
}

/// One request from A to B on a fresh RC connection, run to completion with every packet
/// captured from just before it was posted.
pub struct OneRequest {
    pub qa: u32,
    pub qb: u32,
    /// A's region (the local side).
    pub a: Mr,
    /// B's region (the target).
    pub b: Mr,
    pub log: Capture,
    /// The request packet as A sent it.
    pub request: Vec<u8>,
}

/// An RDMA READ by A of `data`, placed at the start of B's 8 KiB region, into A's; checks
/// that A got it.
pub fn rc_read_once(sim: &mut Sim, data: &[u8], steps: u64) -> Result<OneRequest, SimError> {
    let (qa, qb) = connect(sim, 0, 1, QpType::Rc, &QpParams::default())?;
    let a = sim.nodes[0].mem.register(8192, ALL_ACCESS);
    let b = sim.nodes[1].mem.register(8192, ALL_ACCESS);
    sim.nodes[1].mem.fill(b.addr, data);
    let log = capture(sim);
    let read = SendOp::RdmaRead {
        remote_addr: b.addr,
        rkey: b.rkey,
    };
    let len = data.len() as u32;
    sim.post_send(0, qa, SendWr::new(1, read, vec![sge(&a, 0, len)]))?;
    sim.run_idle(steps)?;
    assert_eq!(sim.nodes[0].mem.bytes(a.addr, data.len()), data);
    let request = first_packet(&log, 0, Opcode::RC_RDMA_READ_REQUEST);
    Ok(OneRequest {
        qa,
        qb,
        a,
        b,
        log,
        request,
    })
}

/// A FETCH ADD of 2 by A on the word at the start of B's 4 KiB region, which holds 40.
pub fn rc_fetch_add_once(sim: &mut Sim, steps: u64) -> Result<OneRequest, SimError> {
    let (qa, qb) = connect(sim, 0, 1, QpType::Rc, &QpParams::default())?;
    let a = sim.nodes[0].mem.register(4096, ALL_ACCESS);
    let b = sim.nodes[1].mem.register(4096, ALL_ACCESS);
    sim.nodes[1].mem.fill(b.addr, &40u64.to_ne_bytes());
    let log = capture(sim);
    let faa = SendOp::FetchAdd {
        remote_addr: b.addr,
        rkey: b.rkey,
        add: 2,
    };
    sim.post_send(0, qa, SendWr::new(1, faa, vec![sge(&a, 0, 8)]))?;
    sim.run_idle(steps)?;
    let request = first_packet(&log, 0, Opcode::RC_FETCH_ADD);
    Ok(OneRequest {
        qa,
        qb,
        a,
        b,
        log,
        request,
    })
}

/// The operations the traffic generator mixes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    CompareSwap,
    FetchAdd,
}

impl Op {
    pub const ALL: [Op; 7] = [
        Op::Send,
        Op::SendImm,
        Op::Write,
        Op::WriteImm,
        Op::Read,
        Op::CompareSwap,
        Op::FetchAdd,
    ];
    pub const UC: [Op; 4] = [Op::Send, Op::SendImm, Op::Write, Op::WriteImm];

    fn consumes_recv(self) -> bool {
        matches!(self, Op::Send | Op::SendImm | Op::WriteImm)
    }

    fn is_atomic(self) -> bool {
        matches!(self, Op::CompareSwap | Op::FetchAdd)
    }
}

#[derive(Clone, Debug)]
pub struct Msg {
    pub op: Op,
    pub len: u32,
    pub imm: u32,
    /// Expected original value (atomics).
    pub orig: u64,
    pub add_or_swap: u64,
    pub compare: u64,
}

/// A stream of `n` random messages from A (node 0) to B (node 1) over one QP pair.
pub struct Traffic {
    pub msgs: Vec<Msg>,
    pub slot: u64,
    pub a_src: Mr,
    pub a_dst: Mr,
    pub b_recv: Mr,
    pub b_target: Mr,
    pub qa: u32,
    pub qb: u32,
    pub qp_type: QpType,
    pub mtu: u32,
}

pub fn pattern(seed: u64, i: usize, len: usize) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9));
    (0..len).map(|_| rng.gen()).collect()
}

const FAA_OFFSET: u64 = 0;
const CAS_OFFSET: u64 = 8;

impl Traffic {
    /// Connects A and B with `qp_type`, registers memory and posts every message (and the
    /// receives they need).
    pub fn start(
        sim: &mut Sim,
        qp_type: QpType,
        ops: &[Op],
        n: usize,
        params: &QpParams,
    ) -> Result<Traffic, SimError> {
        let mtu = params.mtu.bytes();
        let sizes = [0, 1, 7, 64, mtu - 1, mtu, mtu + 1, 2 * mtu, 3 * mtu + 5];
        let slot = u64::from(4 * mtu);
        let (qa, qb) = connect(sim, 0, 1, qp_type, params)?;
        let region = (n as u64 + 1) * slot;
        let a_src = sim.nodes[0].mem.register(region as usize, ALL_ACCESS);
        let a_dst = sim.nodes[0].mem.register(region as usize, ALL_ACCESS);
        let b_recv = sim.nodes[1].mem.register(region as usize, ALL_ACCESS);
        let b_target = sim.nodes[1].mem.register(region as usize, ALL_ACCESS);
        let mut rng = ChaCha8Rng::seed_from_u64(sim.seed.wrapping_add(7));
        let mut msgs = Vec::with_capacity(n);
        let (mut faa, mut cas) = (0u64, 0u64);
        for _ in 0..n {
            let op = ops[rng.gen_range(0..ops.len())];
            let len = if op.is_atomic() {
                8
            } else {
                sizes[rng.gen_range(0..sizes.len())]
            };
            let mut m = Msg {
                op,
                len,
                imm: rng.gen(),
                orig: 0,
                add_or_swap: 0,
                compare: 0,
            };
            match op {
                Op::FetchAdd => {
                    m.orig = faa;
                    m.add_or_swap = rng.gen_range(1..1000);
                    faa += m.add_or_swap;
                }
                Op::CompareSwap => {
                    m.orig = cas;
                    m.compare = cas;
                    m.add_or_swap = rng.gen();
                    cas = m.add_or_swap;
                }
                _ => {}
            }
            msgs.push(m);
        }
        let t = Traffic {
            msgs,
            slot,
            a_src,
            a_dst,
            b_recv,
            b_target,
            qa,
            qb,
            qp_type,
            mtu,
        };
        // Data: A's sources and B's read sources (in b_target's slots).
        for (i, m) in t.msgs.iter().enumerate() {
            let off = (i as u64 + 1) * slot;
            let data = pattern(sim.seed, i, m.len as usize);
            match m.op {
                Op::Read => sim.nodes[1].mem.fill(t.b_target.addr + off, &data),
                _ if !m.op.is_atomic() => sim.nodes[0].mem.fill(t.a_src.addr + off, &data),
                _ => {}
            }
        }
        // Receives, in message order.
        for (i, m) in t.msgs.iter().enumerate() {
            if m.op.consumes_recv() {
                let off = (i as u64 + 1) * slot;
                sim.post_recv(1, qb, recv(i as u64, &t.b_recv, off, slot as u32))?;
            }
        }
        for (i, m) in t.msgs.iter().enumerate() {
            let off = (i as u64 + 1) * slot;
            let remote = t.b_target.addr + off;
            let rkey = t.b_target.rkey;
            let (op, sges) = match m.op {
                Op::Send => (SendOp::Send, vec![sge(&t.a_src, off, m.len)]),
                Op::SendImm => (
                    SendOp::SendWithImm { imm: m.imm },
                    vec![sge(&t.a_src, off, m.len)],
                ),
                Op::Write => (
                    SendOp::RdmaWrite {
                        remote_addr: remote,
                        rkey,
                    },
                    vec![sge(&t.a_src, off, m.len)],
                ),
                Op::WriteImm => (
                    SendOp::RdmaWriteWithImm {
                        remote_addr: remote,
                        rkey,
                        imm: m.imm,
                    },
                    vec![sge(&t.a_src, off, m.len)],
                ),
                Op::Read => (
                    SendOp::RdmaRead {
                        remote_addr: remote,
                        rkey,
                    },
                    vec![sge(&t.a_dst, off, m.len)],
                ),
                Op::FetchAdd => (
                    SendOp::FetchAdd {
                        remote_addr: t.b_target.addr + FAA_OFFSET,
                        rkey,
                        add: m.add_or_swap,
                    },
                    vec![sge(&t.a_dst, off, 8)],
                ),
                Op::CompareSwap => (
                    SendOp::CompareSwap {
                        remote_addr: t.b_target.addr + CAS_OFFSET,
                        rkey,
                        compare: m.compare,
                        swap: m.add_or_swap,
                    },
                    vec![sge(&t.a_dst, off, 8)],
                ),
            };
            // Split long buffers over two SGEs now and then.
            let sges = if sges[0].length > 100 && i % 3 == 0 {
                let s = sges[0];
                let half = s.length / 2;
                vec![
                    Sge { length: half, ..s },
                    Sge {
                        addr: s.addr + u64::from(half),
                        length: s.length - half,
                        ..s
                    },
                ]
            } else {
                sges
            };
            let mut wr = SendWr::new(i as u64, op, sges);
            if i % 5 == 0 {
                wr = wr.with_flags(SendFlags::SOLICITED);
            }
            sim.post_send(0, t.qa, wr)?;
        }
        Ok(t)
    }

    pub fn expected_recvs(&self) -> usize {
        self.msgs.iter().filter(|m| m.op.consumes_recv()).count()
    }

    /// Whether A has a completion for every message and B for every receive.
    pub fn done(&self, sim: &Sim) -> bool {
        let (n, r) = (self.msgs.len(), self.expected_recvs());
        let count =
            |node: usize, cq: CqTarget| sim.completions(node).iter().filter(|c| c.cq == cq).count();
        count(0, CqTarget::Send) >= n && count(1, CqTarget::Recv) >= r
    }

    /// Runs until A has a completion for every message and B for every receive.
    pub fn run(&self, sim: &mut Sim, max_steps: u64) -> Result<(), SimError> {
        sim.run_until(max_steps, |s| self.done(s))?;
        sim.run_idle(max_steps)
    }

    /// Checks every completion field and every byte (RC: all delivered exactly once).
    pub fn verify_rc(&self, sim: &Sim) {
        let seed = sim.seed;
        let sends: Vec<_> = sim
            .completions(0)
            .iter()
            .filter(|c| c.cq == CqTarget::Send)
            .collect();
        assert_eq!(
            sends.len(),
            self.msgs.len(),
            "seed {seed}: one send completion per WR"
        );
        for (i, (c, m)) in sends.iter().zip(&self.msgs).enumerate() {
            let done =
                c.wc.result()
                    .unwrap_or_else(|f| panic!("seed {seed}: wr {i} failed: {f:?}"));
            assert_eq!(
                done.wr_id(),
                i as u64,
                "seed {seed}: send completions in order"
            );
            let (opcode, byte_len) = match m.op {
                Op::Send | Op::SendImm => (WcOpcode::Send, m.len),
                Op::Write | Op::WriteImm => (WcOpcode::RdmaWrite, m.len),
                Op::Read => (WcOpcode::RdmaRead, m.len),
                Op::CompareSwap => (WcOpcode::CompSwap, 8),
                Op::FetchAdd => (WcOpcode::FetchAdd, 8),
            };
            assert_eq!(done.opcode(), opcode, "seed {seed}: wr {i}");
            assert_eq!(done.byte_len(), byte_len, "seed {seed}: wr {i} byte_len");
            assert_eq!(done.qp_num(), self.qa);
        }
        let recvs: Vec<_> = sim
            .completions(1)
            .iter()
            .filter(|c| c.cq == CqTarget::Recv)
            .collect();
        let expected: Vec<(usize, &Msg)> = self
            .msgs
            .iter()
            .enumerate()
            .filter(|(_, m)| m.op.consumes_recv())
            .collect();
        assert_eq!(
            recvs.len(),
            expected.len(),
            "seed {seed}: one receive completion per message"
        );
        for (c, (i, m)) in recvs.iter().zip(expected) {
            let done =
                c.wc.result()
                    .unwrap_or_else(|f| panic!("seed {seed}: recv {i} failed: {f:?}"));
            assert_eq!(
                done.wr_id(),
                i as u64,
                "seed {seed}: receive completions in order"
            );
            assert_eq!(done.byte_len(), m.len, "seed {seed}: recv {i} byte_len");
            assert_eq!(done.qp_num(), self.qb);
            assert!(!done.flags().contains(WcFlags::GRH));
            match m.op {
                Op::Send => {
                    assert_eq!(done.opcode(), WcOpcode::Recv);
                    assert_eq!(done.imm_data(), None);
                }
                Op::SendImm => {
                    assert_eq!(done.opcode(), WcOpcode::Recv);
                    assert_eq!(done.imm_data(), Some(m.imm), "seed {seed}: imm of {i}");
                }
                Op::WriteImm => {
                    assert_eq!(done.opcode(), WcOpcode::RecvRdmaWithImm);
                    assert_eq!(done.imm_data(), Some(m.imm), "seed {seed}: imm of {i}");
                }
                _ => unreachable!(),
            }
        }
        self.verify_data(sim, |_| true);
        // Atomics executed exactly once, in order.
        let faa: u64 = self
            .msgs
            .iter()
            .filter(|m| m.op == Op::FetchAdd)
            .map(|m| m.add_or_swap)
            .sum();
        let word = |off: u64| {
            u64::from_ne_bytes(
                sim.nodes[1]
                    .mem
                    .bytes(self.b_target.addr + off, 8)
                    .try_into()
                    .unwrap(),
            )
        };
        assert_eq!(
            word(FAA_OFFSET),
            faa,
            "seed {seed}: fetch-and-add executed exactly once each"
        );
        if let Some(last_cas) = self.msgs.iter().rev().find(|m| m.op == Op::CompareSwap) {
            assert_eq!(
                word(CAS_OFFSET),
                last_cas.add_or_swap,
                "seed {seed}: CAS chain"
            );
        }
    }

    /// Like [`Traffic::run`], but also accepts that the requester gave up: returns the
    /// index of the WR that failed with `RETRY_EXC_ERR`, if one did.
    pub fn run_tolerant(&self, sim: &mut Sim, max_steps: u64) -> Result<Option<usize>, SimError> {
        let n = self.msgs.len();
        sim.run_until(max_steps, |s| {
            s.completions(0)
                .iter()
                .filter(|c| c.cq == CqTarget::Send)
                .count()
                >= n
        })?;
        let failed = sim
            .completions(0)
            .iter()
            .position(|c| c.wc.status() != WcStatus::Success);
        if failed.is_none() {
            self.run(sim, max_steps)?;
        } else {
            sim.run_idle(max_steps)?;
        }
        Ok(failed)
    }

    /// What an RC run that ended in `RETRY_EXC_ERR` at WR `f` must look like (reference
    /// §2.4, §2.7): every WR before `f` succeeded with intact data, `f` failed with
    /// `RETRY_EXC_ERR`, every later WR was flushed in order, and the responder delivered
    /// a prefix of the receives, in order, exactly once.
    pub fn verify_retry_exceeded(&self, sim: &Sim, f: usize) {
        let seed = sim.seed;
        let sends: Vec<_> = sim
            .completions(0)
            .iter()
            .filter(|c| c.cq == CqTarget::Send)
            .collect();
        assert_eq!(sends.len(), self.msgs.len());
        for (i, c) in sends.iter().enumerate() {
            assert_eq!(c.wc.wr_id(), i as u64, "seed {seed}: in order");
            let want = match i.cmp(&f) {
                std::cmp::Ordering::Less => WcStatus::Success,
                std::cmp::Ordering::Equal => WcStatus::RetryExcErr,
                std::cmp::Ordering::Greater => WcStatus::WrFlushErr,
            };
            assert_eq!(c.wc.status(), want, "seed {seed}: wr {i}");
        }
        let expected: Vec<usize> = self
            .msgs
            .iter()
            .enumerate()
            .filter(|(_, m)| m.op.consumes_recv())
            .map(|(i, _)| i)
            .collect();
        let recvs: Vec<_> = sim
            .completions(1)
            .iter()
            .filter(|c| c.cq == CqTarget::Recv)
            .collect();
        for (c, &i) in recvs.iter().zip(&expected) {
            assert_eq!(
                c.wc.wr_id(),
                i as u64,
                "seed {seed}: receive prefix in order"
            );
            assert_eq!(c.wc.status(), WcStatus::Success);
        }
        self.verify_data(sim, |i| i < f);
    }

    /// Checks the bytes of every message `include` accepts.
    pub fn verify_data(&self, sim: &Sim, include: impl Fn(usize) -> bool) {
        let seed = sim.seed;
        for (i, m) in self.msgs.iter().enumerate().filter(|(i, _)| include(*i)) {
            let off = (i as u64 + 1) * self.slot;
            let want = pattern(seed, i, m.len as usize);
            let len = m.len as usize;
            match m.op {
                Op::Send | Op::SendImm => {
                    assert_eq!(
                        sim.nodes[1].mem.bytes(self.b_recv.addr + off, len),
                        &want[..],
                        "seed {seed}: send {i} data"
                    )
                }
                Op::Write | Op::WriteImm => {
                    assert_eq!(
                        sim.nodes[1].mem.bytes(self.b_target.addr + off, len),
                        &want[..],
                        "seed {seed}: write {i} data"
                    )
                }
                Op::Read => {
                    assert_eq!(
                        sim.nodes[0].mem.bytes(self.a_dst.addr + off, len),
                        &want[..],
                        "seed {seed}: read {i} data"
                    )
                }
                Op::FetchAdd | Op::CompareSwap => {
                    let got = u64::from_ne_bytes(
                        sim.nodes[0]
                            .mem
                            .bytes(self.a_dst.addr + off, 8)
                            .try_into()
                            .unwrap(),
                    );
                    assert_eq!(got, m.orig, "seed {seed}: atomic {i} original value");
                }
            }
        }
    }
}

/// Default parameters with `mtu`.
pub fn params(mtu: Mtu) -> QpParams {
    QpParams {
        mtu,
        ..QpParams::default()
    }
}

/// Asserts a completion failed with `status`.
pub fn assert_status(c: &softverbs_proto::Completion, status: WcStatus) {
    assert_eq!(c.wc.status(), status, "{:?}", c.wc);
}
