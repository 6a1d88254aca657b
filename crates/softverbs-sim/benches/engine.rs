//! Engine benchmark: two `softverbs-proto` engines joined in memory (no loss, no
//! simulator overhead, no ICRC), RC QPs at path MTU 4096. Measures messages/s and bytes/s
//! for 8-byte SENDs and 64 KiB RDMA WRITEs, and a plain `memcpy` of the same bytes in the
//! same run, then prints the ratio.
//!
//! The `qps` groups run the device's loop instead (`Fleet`): packets are delivered in
//! batches and, after every input, the receiving engine runs its local operations,
//! transmits, `poll_timeout` and due timers, as `softverbs-device` does. They measure 4 KiB
//! RDMA WRITEs spread over 8, 512 and 2,048 QP pairs (the same messages in total), and 8 B
//! SENDs on one QP beside 2,047 idle ones: a scheduler that scans every QP per call pays
//! for the idle ones there (issue #15).
//!
//! Run: `cargo bench -p softverbs-sim --bench engine` (criterion numbers, then a summary
//! table); `-- qps` for the many-QP groups only.

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use softverbs_proto::{
    AccessFlags, AddressVector, AttrMask, Engine, EngineConfig, Mtu, QpAttr, QpCaps, QpInit,
    QpState, QpType, RecvWr, SendOp, SendWr, Sge,
};
use softverbs_sim::{Mr, SimMemory};

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

const DEPTH: u32 = 512;

struct Pair {
    a: Engine,
    b: Engine,
    mem_a: SimMemory,
    mem_b: SimMemory,
    qa: u32,
    qb: u32,
    src: Mr,
    dst: Mr,
    buf: Vec<u8>,
    next_id: u64,
}

fn up(ep: &mut Engine, qpn: u32, peer: u32, psn: u32, peer_psn: u32) {
    let mut attr = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        ..QpAttr::default()
    };
    ep.modify_qp(
        qpn,
        &attr,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    attr.qp_state = QpState::Rtr;
    attr.ah_attr = AddressVector {
        port_num: 1,
        is_global: true,
        ..AddressVector::default()
    };
    attr.path_mtu = Mtu::Mtu4096;
    attr.dest_qp_num = peer;
    attr.rq_psn = peer_psn;
    attr.max_dest_rd_atomic = 4;
    attr.min_rnr_timer = 1;
    ep.modify_qp(
        qpn,
        &attr,
        AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER,
    )
    .unwrap();
    attr.qp_state = QpState::Rts;
    attr.sq_psn = psn;
    attr.timeout = 14;
    attr.retry_cnt = 7;
    attr.rnr_retry = 7;
    attr.max_rd_atomic = 4;
    ep.modify_qp(
        qpn,
        &attr,
        AttrMask::STATE
            | AttrMask::SQ_PSN
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::MAX_QP_RD_ATOMIC,
    )
    .unwrap();
}

impl Pair {
    fn new(region: usize) -> Pair {
        let config = EngineConfig {
            max_unacked_psns: 1024,
            ..EngineConfig::default()
        };
        let mut a = Engine::new(config);
        let mut b = Engine::new(config);
        let caps = QpCaps {
            max_send_wr: DEPTH,
            max_recv_wr: DEPTH,
            ..QpCaps::default()
        };
        let init = QpInit {
            qp_type: QpType::Rc,
            caps,
            sq_sig_all: false,
            srq: None,
            pd: 0,
        };
        let qa = a.create_qp(init).unwrap();
        let qb = b.create_qp(init).unwrap();
        up(&mut a, qa, qb, 100, 200);
        up(&mut b, qb, qa, 200, 100);
        let mut mem_a = SimMemory::new();
        let mut mem_b = SimMemory::new();
        let src = mem_a.register(region, ALL);
        let dst = mem_b.register(region, ALL);
        let buf = vec![0u8; a.max_packet_len()];
        Pair {
            a,
            b,
            mem_a,
            mem_b,
            qa,
            qb,
            src,
            dst,
            buf,
            next_id: 0,
        }
    }

    /// Moves packets both ways until neither side has anything to send.
    fn pump(&mut self) {
        loop {
            let mut moved = false;
            while let Some(t) = self.a.poll_transmit(0, &mut self.buf, &self.mem_a) {
                self.b
                    .handle_packet(0, &self.buf[..t.len], None, &mut self.mem_b);
                moved = true;
            }
            while let Some(t) = self.b.poll_transmit(0, &mut self.buf, &self.mem_b) {
                self.a
                    .handle_packet(0, &self.buf[..t.len], None, &mut self.mem_a);
                moved = true;
            }
            if !moved {
                break;
            }
        }
    }

    /// Sends `n` messages of `len` bytes (SEND or RDMA WRITE), every 64th signaled, and
    /// runs them to completion.
    fn run(&mut self, n: u64, len: u32, write: bool) {
        let mut left = n;
        while left > 0 {
            let batch = left.min(u64::from(DEPTH) / 2);
            for i in 0..batch {
                let id = self.next_id;
                self.next_id += 1;
                if !write {
                    let sge = Sge {
                        addr: self.dst.addr,
                        length: len,
                        lkey: self.dst.lkey,
                    };
                    self.b
                        .post_recv(
                            self.qb,
                            RecvWr {
                                wr_id: id,
                                sg_list: [sge].into(),
                            },
                        )
                        .unwrap();
                }
                let op = if write {
                    SendOp::RdmaWrite {
                        remote_addr: self.dst.addr,
                        rkey: self.dst.rkey,
                    }
                } else {
                    SendOp::Send
                };
                let sge = Sge {
                    addr: self.src.addr,
                    length: len,
                    lkey: self.src.lkey,
                };
                let mut wr = SendWr::new(id, op, vec![sge]);
                if i + 1 == batch || i % 64 == 63 {
                    wr = wr.with_flags(softverbs_proto::SendFlags::SIGNALED);
                }
                self.a.post_send(self.qa, wr).unwrap();
            }
            self.pump();
            while let Some(c) = self.a.poll_completion() {
                assert!(c.wc.result().is_ok());
            }
            while let Some(c) = self.b.poll_completion() {
                assert!(c.wc.result().is_ok());
            }
            left -= batch;
        }
    }
}

/// Packets a device hands to its engine per run (a receive batch).
const RX_BATCH: usize = 32;

/// Two engines with `qps.len()` RC QP pairs, run as the device runs them.
struct Fleet {
    a: Engine,
    b: Engine,
    mem_a: SimMemory,
    mem_b: SimMemory,
    /// `(QP on a, QP on b)`.
    qps: Vec<(u32, u32)>,
    src: Mr,
    dst: Mr,
    buf: Vec<u8>,
    to_a: VecDeque<Vec<u8>>,
    to_b: VecDeque<Vec<u8>>,
    next_id: u64,
}

impl Fleet {
    fn new(pairs: usize, region: usize) -> Fleet {
        let config = EngineConfig::default();
        let mut a = Engine::new(config);
        let mut b = Engine::new(config);
        let init = QpInit {
            qp_type: QpType::Rc,
            caps: QpCaps {
                max_send_wr: 64,
                max_recv_wr: 64,
                ..QpCaps::default()
            },
            sq_sig_all: false,
            srq: None,
            pd: 0,
        };
        let qps = (0..pairs)
            .map(|_| {
                let qa = a.create_qp(init).unwrap();
                let qb = b.create_qp(init).unwrap();
                up(&mut a, qa, qb, 100, 200);
                up(&mut b, qb, qa, 200, 100);
                (qa, qb)
            })
            .collect();
        let mut mem_a = SimMemory::new();
        let mut mem_b = SimMemory::new();
        let src = mem_a.register(region, ALL);
        let dst = mem_b.register(region, ALL);
        let buf = vec![0u8; a.max_packet_len()];
        Fleet {
            a,
            b,
            mem_a,
            mem_b,
            qps,
            src,
            dst,
            buf,
            to_a: VecDeque::new(),
            to_b: VecDeque::new(),
            next_id: 0,
        }
    }

    /// The device's run after an input: local operations and transmits until neither
    /// does anything, then the timers due.
    fn run_engine(
        engine: &mut Engine,
        mem: &mut SimMemory,
        buf: &mut [u8],
        out: &mut VecDeque<Vec<u8>>,
    ) {
        loop {
            let ran = engine.execute_local_operations(mem);
            let before = out.len();
            while let Some(t) = engine.poll_transmit(0, buf, mem) {
                out.push_back(buf[..t.len].to_vec());
            }
            if ran == 0 && out.len() == before {
                break;
            }
        }
        if engine.poll_timeout().is_some_and(|t| t == 0) {
            engine.handle_timeout(0);
        }
    }

    /// Delivers packets in batches of `RX_BATCH`, running the receiver after each batch,
    /// until no packet is left.
    fn pump(&mut self) {
        while !self.to_a.is_empty() || !self.to_b.is_empty() {
            for _ in 0..RX_BATCH.min(self.to_b.len()) {
                let p = self.to_b.pop_front().unwrap();
                self.b.handle_packet(0, &p, None, &mut self.mem_b);
            }
            Self::run_engine(&mut self.b, &mut self.mem_b, &mut self.buf, &mut self.to_a);
            for _ in 0..RX_BATCH.min(self.to_a.len()) {
                let p = self.to_a.pop_front().unwrap();
                self.a.handle_packet(0, &p, None, &mut self.mem_a);
            }
            Self::run_engine(&mut self.a, &mut self.mem_a, &mut self.buf, &mut self.to_b);
        }
    }

    /// `n` messages of `len` bytes, SENDs or RDMA WRITEs, over the first `busy` QP pairs
    /// in turn (at most 32 outstanding per QP, every 16th signaled), each post followed by
    /// the device's run, and all of them to completion.
    fn run(&mut self, n: u64, len: u32, write: bool, busy: usize) {
        let per_qp = 32u64;
        let mut left = n;
        while left > 0 {
            let batch = left.min(per_qp * busy as u64);
            for i in 0..batch {
                let (qa, qb) = self.qps[(i % busy as u64) as usize];
                let id = self.next_id;
                self.next_id += 1;
                if !write {
                    let sge = Sge {
                        addr: self.dst.addr,
                        length: len,
                        lkey: self.dst.lkey,
                    };
                    self.b
                        .post_recv(
                            qb,
                            RecvWr {
                                wr_id: id,
                                sg_list: [sge].into(),
                            },
                        )
                        .unwrap();
                }
                let op = if write {
                    SendOp::RdmaWrite {
                        remote_addr: self.dst.addr,
                        rkey: self.dst.rkey,
                    }
                } else {
                    SendOp::Send
                };
                let sge = Sge {
                    addr: self.src.addr,
                    length: len,
                    lkey: self.src.lkey,
                };
                let mut wr = SendWr::new(id, op, vec![sge]);
                if i / busy as u64 % 16 == 15 || i + busy as u64 >= batch {
                    wr = wr.with_flags(softverbs_proto::SendFlags::SIGNALED);
                }
                self.a.post_send(qa, wr).unwrap();
                Self::run_engine(&mut self.a, &mut self.mem_a, &mut self.buf, &mut self.to_b);
            }
            self.pump();
            while let Some(c) = self.a.poll_completion() {
                assert!(c.wc.result().is_ok());
            }
            while let Some(c) = self.b.poll_completion() {
                assert!(c.wc.result().is_ok());
            }
            left -= batch;
        }
    }
}

fn memcpy(dst: &mut [u8], src: &[u8], n: u64) {
    let len = src.len();
    for i in 0..n as usize {
        let at = (i * 64) % (dst.len() - len + 1);
        dst[at..at + len].copy_from_slice(black_box(src));
    }
    black_box(&dst[0]);
}

fn bench(c: &mut Criterion) {
    for (name, len, write) in [
        ("send_8B", 8u32, false),
        ("rdma_write_64KiB", 65536u32, true),
    ] {
        let mut group = c.benchmark_group(name);
        group.throughput(Throughput::Bytes(u64::from(len)));
        let mut pair = Pair::new(1 << 17);
        group.bench_function("engine", |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                pair.run(iters, len, write);
                t.elapsed()
            })
        });
        let src = vec![7u8; len as usize];
        let mut dst = vec![0u8; (len as usize).max(4096) * 4];
        group.bench_function("memcpy", |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                memcpy(&mut dst, &src, iters);
                t.elapsed()
            })
        });
        group.finish();
    }
    for (name, pairs, busy, len, write) in [
        ("qps_write_4KiB/8", 8, 8, 4096u32, true),
        ("qps_write_4KiB/512", 512, 512, 4096, true),
        ("qps_write_4KiB/2048", 2048, 2048, 4096, true),
        ("qps_send_8B_beside_2047_idle", 2048, 1, 8, false),
    ] {
        let mut group = c.benchmark_group(name);
        group.throughput(Throughput::Elements(1));
        let mut fleet = Fleet::new(pairs, 1 << 13);
        group.bench_function("engine", |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                fleet.run(iters, len, write, busy);
                t.elapsed()
            })
        });
        group.finish();
    }
    summary();
}

/// A fixed-duration measurement of both, printed as a table with the ratio.
fn summary() {
    println!();
    println!(
        "{:<18} {:>14} {:>14} {:>14} {:>10}",
        "workload", "engine msg/s", "engine GB/s", "memcpy GB/s", "ratio"
    );
    for (name, len, write) in [
        ("send 8 B", 8u32, false),
        ("rdma write 64 KiB", 65536u32, true),
    ] {
        let mut pair = Pair::new(1 << 17);
        let batch = if write { 256 } else { 16384 };
        pair.run(batch, len, write); // warm up
        let (mut n, t) = (0u64, Instant::now());
        while t.elapsed() < Duration::from_millis(1500) {
            pair.run(batch, len, write);
            n += batch;
        }
        let engine_s = t.elapsed().as_secs_f64();
        let src = vec![7u8; len as usize];
        let mut dst = vec![0u8; (len as usize).max(4096) * 4];
        let t = Instant::now();
        memcpy(&mut dst, &src, n);
        let memcpy_s = t.elapsed().as_secs_f64();
        let bytes = n as f64 * f64::from(len);
        println!(
            "{:<18} {:>14.0} {:>14.3} {:>14.3} {:>9.1}x",
            name,
            n as f64 / engine_s,
            bytes / engine_s / 1e9,
            bytes / memcpy_s / 1e9,
            engine_s / memcpy_s
        );
    }
    println!("(ratio = engine time / memcpy time for the same bytes)");
}

// `criterion_group!` generates an undocumented `pub fn benches`.
#[allow(missing_docs)]
mod group {
    use super::*;
    criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1)).sample_size(20);
    targets = bench
    }
}
criterion_main!(group::benches);
