//! `softverbs perf OP KIND`: perftest-like latency (`ib_*_lat`) and bandwidth (`ib_*_bw`)
//! runs of send, RDMA write, RDMA read and atomics over RC connections (one, or `-q N` in
//! bw tests), with perftest's common flags in their perftest meaning (`-s -n -a -D -F -t
//! -q -I -R -e`, `--report_gbits`, `--output`) and its result table.
//!
//! The client drives; the server adopts the client's parameters (sent as the first
//! control message), so `--server` needs no other option. Per message size, the two
//! sides meet on the control connection (`Go` / `Ready`), run, and meet again (`Done`).
//! In a duration run (`-D`) the server does not know the count: it serves until the
//! client's `Done` arrives.
//!
//! What each test measures, as perftest does:
//! - `send lat`: ping-pong of sends; one-way latency = round trip / 2.
//! - `write lat`: ping-pong of RDMA writes, each side polling the last byte of its buffer
//!   for the peer's write; one-way latency = round trip / 2.
//! - `read lat`, `atomic lat`: one RDMA read (fetch-and-add) at a time; the full round
//!   trip from post to completion.
//! - `* bw`: up to `tx-depth` work requests outstanding on each QP; average bandwidth and
//!   message rate over the run (first post to last completion), the peak as perftest
//!   computes it (the best rate over any run of consecutive work requests, from the post
//!   of the first to the completion of the last; only up to 20000 requests and not with
//!   `-D`), and the post-to-completion time of every request.
//! - `-q N` (bw only, as perftest): N RC QPs between the two sides, one CQ for all of them
//!   on each side, each QP with its own part of the buffer and its own `-t` requests
//!   outstanding. As perftest's `run_iter_bw`, every QP runs the `-n` iterations (the
//!   requests are posted round-robin over the QPs) and the result counts them all:
//!   `#iterations` is `-n` × N, the bandwidth and message rate are the total.
//! - `-D SECONDS`: as perftest, only the middle of the run counts: a margin of a quarter
//!   of the duration at each end is run but not measured.

use crate::conn::{self, Control, DeviceCounters, Hello, Mode, NetArgs, Side, PATIENCE};
use crate::output::{self, outln};
use crate::stats::Latencies;
use crate::Error;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};
use softverbs::*;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// The operation measured.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// Send / receive.
    Send,
    /// RDMA write.
    Write,
    /// RDMA read.
    Read,
    /// Fetch-and-add on an 8-byte word.
    Atomic,
}

/// Latency or bandwidth.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// One operation at a time: latency percentiles.
    Lat,
    /// A window of outstanding operations: bandwidth and message rate.
    Bw,
}

/// perftest's `--output`: print only one number per message size.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputLevel {
    /// The average bandwidth (bw tests), in the unit of --report_gbits.
    #[value(name = "bandwidth")]
    Bandwidth,
    /// The message rate in Mpps (bw tests).
    #[value(name = "message_rate")]
    MessageRate,
    /// The average latency in usec (lat tests).
    #[value(name = "latency")]
    Latency,
}

/// Options of `softverbs perf`.
#[derive(clap::Args, Clone, Debug)]
pub struct PerfArgs {
    /// The operation: send, write, read or atomic.
    #[arg(value_enum)]
    pub op: Op,

    /// lat (latency percentiles) or bw (bandwidth, message rate).
    #[arg(value_enum)]
    pub kind: Kind,

    /// Message size in bytes [default: 2 for lat, 65536 for bw; atomics are always 8].
    #[arg(short = 's', long = "size", conflicts_with = "all")]
    pub size: Option<usize>,

    /// Run every size from 2 bytes to 2^23 (8 MiB), the powers of two, as perftest.
    #[arg(short = 'a', long = "all")]
    pub all: bool,

    /// Iterations per size [default: 1000; 5000 for write bw, as perftest].
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<u64>,

    /// Run for this many seconds instead of a number of iterations, measuring only the
    /// middle half (a margin of a quarter at each end), as perftest. Not with -a, -n or
    /// -e (perftest's rules); no peak bandwidth.
    #[arg(
        short = 'D',
        long = "duration",
        value_name = "SECONDS",
        conflicts_with_all = ["all", "iters", "events"],
        value_parser = clap::value_parser!(u32).range(1..=86_400)
    )]
    pub duration: Option<u32>,

    /// Accepted for perftest's habits: softverbs times with the system's monotonic clock,
    /// not CPU cycles, so there is no CPU frequency to check.
    #[arg(short = 'F', long = "CPU-freq")]
    pub cpu_freq: bool,

    /// Work requests kept outstanding in bw tests.
    #[arg(short = 't', long = "tx-depth", default_value_t = 128)]
    pub tx_depth: u32,

    /// Number of QPs, bw tests only (perftest's -q, 1 to 16384): each runs the
    /// iterations with its own TX depth; the result is their total.
    #[arg(short = 'q', long = "qp", value_name = "QPS", default_value_t = 1)]
    pub qps: u32,

    /// Send messages of at most this many bytes inline (IBV_SEND_INLINE; send and write
    /// only, as perftest) [default: 0, what perftest uses on a device it does not know].
    #[arg(
        short = 'I',
        long = "inline_size",
        value_name = "SIZE",
        default_value_t = 0
    )]
    pub inline_size: u32,

    /// perftest's rdma_cm connection (-R): not yet supported, refused.
    #[arg(short = 'R', long = "rdma_cm")]
    pub rdma_cm: bool,

    /// Report bandwidth in Gb/sec (10^9 bits) instead of MiB/sec (2^20 bytes), as perftest.
    #[arg(long = "report_gbits")]
    pub report_gbits: bool,

    /// Print only one number per size, as perftest: bandwidth or message_rate (bw tests),
    /// latency (lat tests: the average, usec).
    #[arg(
        long = "output",
        value_enum,
        value_name = "UNITS",
        conflicts_with = "json"
    )]
    pub output: Option<OutputLevel>,

    /// Sleep on CQ events (a completion channel) instead of busy polling; both sides.
    #[arg(short = 'e', long = "events")]
    pub events: bool,

    /// Also print the distribution of latencies (lat) or post-to-completion times (bw)
    /// of each size, from its HdrHistogram: value, percentile, count.
    #[arg(long)]
    pub histogram: bool,

    /// Print the results as one JSON document on stdout, nothing else.
    #[arg(long)]
    pub json: bool,

    /// Draw the results into an SVG file: a lat test's latency distribution (a curve per
    /// size), a bw test's bandwidth against the message size (every size with -a).
    #[arg(long, value_name = "FILE.svg", conflicts_with = "server")]
    pub plot: Option<std::path::PathBuf>,

    /// Where the two sides run.
    #[command(flatten)]
    pub net: NetArgs,
}

/// The largest size of `-a` (perftest's MAX_SIZE, 2^23).
const ALL_SIZES_TOP: u32 = 23;

/// Above this many requests in all the peak bandwidth is not computed (perftest's limit
/// of 20000 iterations: the search is quadratic). perftest counts its 20000 per QP, but
/// searches only every 100th completion (its CQ moderation); this search takes every one,
/// so the limit holds for the requests of all QPs together.
const PEAK_MAX_ITERS: u64 = 20_000;

/// perftest's range of `-q` (MIN_QP_NUM, MAX_QP_NUM).
const MAX_QPS: u32 = 16_384;

/// What the client tells the server before anything else.
#[derive(Serialize, Deserialize, Clone, Debug)]
struct Params {
    op: Op,
    kind: Kind,
    sizes: Vec<usize>,
    /// Iterations per size and QP; 0 in a duration run.
    iters: u64,
    /// RC QPs (perftest's -q); a client that does not send it runs one.
    #[serde(default = "one_qp")]
    qps: u32,
    /// Seconds per size in a duration run.
    duration_secs: Option<u32>,
    tx_depth: u32,
    inline_size: u32,
    events: bool,
}

fn one_qp() -> u32 {
    1
}

/// perftest's rules of `-q`: 1 to 16384 QPs, several only in bw tests.
fn check_qps(qps: u32, kind: Kind) -> Result<(), Error> {
    if qps == 0 || qps > MAX_QPS {
        return Err(format!("-q {qps}: give 1 to {MAX_QPS} QPs (perftest's range)").into());
    }
    if qps > 1 && kind == Kind::Lat {
        return Err(format!(
            "-q {qps}: multiple QPs are only for bw tests (perftest's rule); lat tests run \
             one QP"
        )
        .into());
    }
    Ok(())
}

impl Params {
    fn from_args(args: &PerfArgs) -> Result<Params, Error> {
        if args.rdma_cm {
            return Err(
                "-R (rdma_cm): not yet supported: softverbs perf connects its QP \
                        through its own TCP exchange, as perftest does without -R"
                    .into(),
            );
        }
        check_qps(args.qps, args.kind)?;
        if args.inline_size > 0 && matches!(args.op, Op::Read | Op::Atomic) {
            return Err(
                "-I: inline data is not available for read and atomic (perftest's \
                        rule): only sends and writes carry it"
                    .into(),
            );
        }
        match (args.output, args.kind) {
            (Some(OutputLevel::Latency), Kind::Bw) => {
                return Err("--output for a bw test can be: bandwidth, message_rate".into())
            }
            (Some(OutputLevel::Bandwidth | OutputLevel::MessageRate), Kind::Lat) => {
                return Err("--output for a lat test can be: latency".into())
            }
            _ => {}
        }
        let sizes = if args.op == Op::Atomic {
            if args.size.is_some_and(|s| s != 8) {
                return Err("atomics work on 8 bytes: -s must be 8 or absent".into());
            }
            vec![8]
        } else if args.all {
            (1..=ALL_SIZES_TOP).map(|p| 1usize << p).collect()
        } else {
            vec![args
                .size
                .unwrap_or(if args.kind == Kind::Lat { 2 } else { 65536 })]
        };
        if sizes.iter().any(|&s| s == 0 || s > 1 << 30) {
            return Err("the message size must be 1 byte to 1 GiB".into());
        }
        if args.tx_depth == 0 || args.tx_depth > 8192 {
            return Err("-t must be 1..=8192".into());
        }
        let iters = match args.duration {
            Some(_) => 0,
            None => args.iters.unwrap_or(match (args.op, args.kind) {
                (Op::Write, Kind::Bw) => 5000,
                _ => 1000,
            }),
        };
        if args.duration.is_none() && iters == 0 {
            return Err("-n must be at least 1".into());
        }
        Ok(Params {
            op: args.op,
            kind: args.kind,
            sizes,
            iters,
            qps: args.qps,
            duration_secs: args.duration,
            tx_depth: args.tx_depth,
            inline_size: args.inline_size,
            events: args.events,
        })
    }

    fn max_size(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(8)
    }

    /// The buffer of each side: a part of [`Params::max_size`] bytes per QP, and at least
    /// two (the write latency test's two halves).
    fn buffer_len(&self) -> usize {
        self.max_size().saturating_mul(self.qps.max(2) as usize)
    }

    /// Requests of one size in an iteration run, every QP's together.
    fn total_iters(&self) -> u64 {
        self.iters.saturating_mul(u64::from(self.qps))
    }

    /// Progress units of one size: every QP's iterations, or the milliseconds of a
    /// duration run.
    fn progress_per_size(&self) -> u64 {
        match self.duration_secs {
            Some(secs) => u64::from(secs) * 1000,
            None => self.total_iters(),
        }
    }

    /// Receives kept posted for sends: enough for the window, at most 1024.
    fn recv_depth(&self) -> u32 {
        if self.op == Op::Send {
            let want = if self.duration_secs.is_some() {
                1024
            } else {
                self.iters.min(1024)
            };
            want.max(u64::from(self.tx_depth)) as u32
        } else {
            1
        }
    }

    /// Receives to post before a size: the depth, or fewer if fewer messages come.
    fn recv_prepost(&self) -> u64 {
        let depth = u64::from(self.recv_depth());
        if self.duration_secs.is_some() {
            depth
        } else {
            depth.min(self.iters)
        }
    }

    /// Whether the receive taken by message `received` (counted from 1) is replaced.
    fn repost_after(&self, received: u64) -> bool {
        self.duration_secs.is_some() || received + u64::from(self.recv_depth()) <= self.iters
    }

    fn send_depth(&self) -> u32 {
        match self.kind {
            Kind::Bw => self.tx_depth,
            Kind::Lat => 16,
        }
    }

    /// Whether a message of `size` bytes goes inline.
    fn inline(&self, size: usize) -> bool {
        matches!(self.op, Op::Send | Op::Write) && size <= self.inline_size as usize
    }

    fn title(&self) -> String {
        let op = match self.op {
            Op::Send => "Send",
            Op::Write => "RDMA_Write",
            Op::Read => "RDMA_Read",
            Op::Atomic => "Atomic FETCH_AND_ADD",
        };
        let kind = match self.kind {
            Kind::Lat => "Latency",
            Kind::Bw => "BW",
        };
        format!("{op} {kind} Test")
    }

    /// Whether the latency reported is half the round trip (perftest's send and write
    /// latency) or the whole of it (read, atomic).
    fn halves_round_trip(&self) -> bool {
        self.kind == Kind::Lat && matches!(self.op, Op::Send | Op::Write)
    }

    /// Whether the peak bandwidth is computed (perftest: bw, iterations, at most 20000;
    /// see [`PEAK_MAX_ITERS`]).
    fn peak(&self) -> bool {
        self.kind == Kind::Bw
            && self.duration_secs.is_none()
            && self.total_iters() <= PEAK_MAX_ITERS
    }
}

/// When a size's run stops and which of its iterations are measured.
#[derive(Clone, Copy)]
struct Plan {
    start: Instant,
    /// Iteration count, or the end of a duration run with its measured window.
    limit: Limit,
}

#[derive(Clone, Copy)]
enum Limit {
    Iterations(u64),
    Duration {
        measure_from: Instant,
        measure_until: Instant,
        end: Instant,
    },
}

impl Plan {
    fn new(p: &Params, start: Instant) -> Plan {
        let limit = match p.duration_secs {
            Some(secs) => {
                let total = Duration::from_secs(u64::from(secs));
                let margin = total / 4;
                Limit::Duration {
                    measure_from: start + margin,
                    measure_until: start + total - margin,
                    end: start + total,
                }
            }
            None => Limit::Iterations(p.iters),
        };
        Plan { start, limit }
    }

    /// Whether to start one more iteration after `done`.
    fn more(&self, done: u64, now: Instant) -> bool {
        match self.limit {
            Limit::Iterations(n) => done < n,
            Limit::Duration { end, .. } => now < end,
        }
    }

    /// Whether an iteration that started at `t` counts.
    fn measures(&self, t: Instant) -> bool {
        match self.limit {
            Limit::Iterations(_) => true,
            Limit::Duration {
                measure_from,
                measure_until,
                ..
            } => t >= measure_from && t < measure_until,
        }
    }

    /// Progress units: iterations, or milliseconds of a duration run.
    fn progress(&self, done: u64, now: Instant) -> u64 {
        match self.limit {
            Limit::Iterations(_) => done,
            Limit::Duration { .. } => (now - self.start).as_millis() as u64,
        }
    }
}

/// Control messages after the parameters and the hellos.
#[derive(Serialize, Deserialize, Debug)]
enum Msg {
    Go(usize),
    Ready,
    Done,
    Finish,
}

/// One line of a size's distribution (`--histogram`).
#[derive(Serialize, Debug)]
struct HistogramLine {
    usec: f64,
    percentile: f64,
    count: u64,
}

/// The results of one size.
#[derive(Serialize, Debug)]
struct SizeResult {
    bytes: usize,
    /// Iterations measured (in a duration run, those of the measured window).
    iterations: u64,
    /// Latency (lat) or post-to-completion time (bw) percentiles, microseconds.
    t_min_usec: f64,
    t_median_usec: f64,
    /// perftest's t_typical: the median.
    t_typical_usec: f64,
    t_p99_usec: f64,
    t_p99_9_usec: f64,
    t_max_usec: f64,
    t_avg_usec: f64,
    t_stdev_usec: f64,
    /// Seconds the measured run of this size took.
    elapsed_sec: f64,
    /// Average bandwidth (bw only), 10^9 bits per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    bw_gbit_per_sec: Option<f64>,
    /// Peak bandwidth (bw only, when computed), 10^9 bits per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    bw_peak_gbit_per_sec: Option<f64>,
    /// Message rate (bw only), millions per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    msg_rate_mpps: Option<f64>,
    /// Completions of each QP, in the order of the QPs, over the whole run (measured or
    /// not; bw only): what the device reported for each QP (the completion's qp_num).
    #[serde(skip_serializing_if = "Option::is_none")]
    completions_per_qp: Option<Vec<u64>>,
    /// The distribution (`--histogram`).
    #[serde(skip_serializing_if = "Option::is_none")]
    histogram: Option<Vec<HistogramLine>>,
    /// The distribution of the t_* times, for `--plot` (`plot::percentile_curve`).
    #[serde(skip)]
    curve: Vec<(f64, f64)>,
}

/// The whole JSON document.
#[derive(Serialize, Debug)]
struct Report<'a> {
    test: String,
    op: Op,
    kind: Kind,
    network: &'a str,
    mtu: u32,
    /// RC QPs (perftest's -q, its "Number of qps").
    qps: u32,
    tx_depth: u32,
    inline_size: u32,
    events: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_sec: Option<u32>,
    latency: &'static str,
    results: &'a [SizeResult],
    client_counters: DeviceCounters,
    #[serde(skip_serializing_if = "Option::is_none")]
    server_counters: Option<DeviceCounters>,
}

/// The progress bar on stderr: drawn only when stderr is a terminal (hidden, and free,
/// when it is piped or redirected).
struct Progress {
    bar: ProgressBar,
}

impl Progress {
    fn new(p: &Params) -> Progress {
        let per_size = p.progress_per_size();
        let bar = ProgressBar::with_draw_target(
            Some(per_size.saturating_mul(p.sizes.len() as u64)),
            ProgressDrawTarget::stderr(),
        );
        if let Ok(style) =
            ProgressStyle::with_template("  {msg:>14} [{bar:30}] {percent:>3}% {elapsed}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        Progress { bar }
    }

    fn on(&self) -> bool {
        !self.bar.is_hidden()
    }

    fn size(&self, size: usize) {
        if self.on() {
            self.bar.set_message(format!("{size} bytes"));
        }
    }

    /// `done` units of the `index`th size (units per size: `per_size`).
    fn tick(&self, index: usize, per_size: u64, done: u64) {
        if self.on() {
            self.bar
                .set_position((index as u64).saturating_mul(per_size).saturating_add(done));
        }
    }

    /// Runs `f` with the bar out of the way (a result line on a terminal).
    fn suspend<T>(&self, f: impl FnOnce() -> T) -> T {
        self.bar.suspend(f)
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// A run that fails leaves no half-drawn bar above its error.
impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

const SEND_WRID: u64 = u64::MAX;
const RECV_WRID: u64 = u64::MAX - 1;

/// The value the `i`th write of a write-latency run puts in the last byte (never 0, the
/// cleared value, and never the previous one).
fn write_mark(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

/// Asks, at most once a millisecond, whether the client has said `Done` (duration runs:
/// the server does not know the count). Never true in an iteration run.
struct Stop<'a> {
    control: Option<&'a mut Control>,
    last: Instant,
}

impl<'a> Stop<'a> {
    fn new(p: &Params, control: &'a mut Control) -> Stop<'a> {
        Stop {
            control: p.duration_secs.is_some().then_some(control),
            last: Instant::now(),
        }
    }

    /// A stop never requested (the client's own waits).
    fn never() -> Stop<'a> {
        Stop {
            control: None,
            last: Instant::now(),
        }
    }

    fn requested(&mut self) -> Result<bool, Error> {
        let Some(control) = self.control.as_deref_mut() else {
            return Ok(false);
        };
        if self.last.elapsed() < Duration::from_millis(1) {
            return Ok(false);
        }
        self.last = Instant::now();
        control.has_message()
    }

    fn asked(&self) -> bool {
        self.control.is_some()
    }
}

/// Waits until the byte at `offset` of the side's buffer is `value`, draining (and
/// checking) completions meanwhile; the poll drives the device's progress. `false` if
/// `stop` said so first.
fn wait_byte(side: &Side, offset: usize, value: u8, stop: &mut Stop<'_>) -> Result<bool, Error> {
    let deadline = Instant::now() + PATIENCE;
    let mut wcs = [WorkCompletion::default(); 16];
    let mut byte = [0u8];
    let mut empty_polls = 0u32;
    loop {
        side.mr.read_at(offset, &mut byte)?;
        if byte[0] == value {
            return Ok(true);
        }
        if side.try_poll(&mut wcs)? == 0 {
            conn::spin_pause(&mut empty_polls);
        }
        if stop.requested()? {
            return Ok(false);
        }
        if Instant::now() > deadline {
            return Err("timed out waiting for the peer's RDMA write".into());
        }
    }
}

/// Waits for the next completion of `wr_id`, keeping receive completions for later.
fn wait_for(side: &Side, wr_id: u64, pending: &mut VecDeque<WorkCompletion>) -> Result<(), Error> {
    if let Some(at) = pending.iter().position(|wc| wc.wr_id() == wr_id) {
        pending.remove(at);
        return Ok(());
    }
    let mut wcs = [WorkCompletion::default(); 16];
    loop {
        let n = side.wait(&mut wcs)?;
        let mut found = false;
        for wc in &wcs[..n] {
            if !found && wc.wr_id() == wr_id {
                found = true;
            } else if wc.wr_id() == RECV_WRID {
                pending.push_back(*wc);
            }
        }
        if found {
            return Ok(());
        }
    }
}

/// Posts a receive of `size` bytes on `qp` into the buffer at `offset`.
fn post_recv(side: &Side, qp: &Qp, offset: usize, size: usize) -> Result<(), Error> {
    qp.post_recv(RecvRequest::new(
        RECV_WRID,
        &[side.mr.slice(offset..offset + size)?],
    ))?;
    Ok(())
}

/// A send or write of `len` bytes at `offset` of the buffer: inline (a copy taken now) when
/// `p` says so for this size.
fn payload_request(
    side: &Side,
    p: &Params,
    wr_id: u64,
    offset: usize,
    len: usize,
    peer: Option<RemoteAddr>,
) -> Result<SendRequest, Error> {
    let local = [side.mr.slice(offset..offset + len)?];
    let wr = match peer {
        Some(peer) => SendRequest::write(wr_id, &local, peer),
        None => SendRequest::send(wr_id, &local),
    };
    if p.inline(len) {
        let mut data = vec![0u8; len];
        side.mr.read_at(offset, &mut data)?;
        Ok(wr.inline(&data))
    } else {
        Ok(wr)
    }
}

/// What the client measured for one size.
struct Measured {
    lat: Latencies,
    iterations: u64,
    elapsed: Duration,
    /// The best message rate over any run of consecutive requests (bw, when computed).
    peak_msgs_per_sec: Option<f64>,
    /// Completions of each QP over the whole run (bw).
    completions_per_qp: Option<Vec<u64>>,
}

/// What a size's run has measured so far: the samples of the iterations that count, the
/// start of the first of them and the end of the last.
struct Tally {
    lat: Latencies,
    measured: u64,
    first: Option<Instant>,
    last: Instant,
}

impl Tally {
    fn new(start: Instant) -> Tally {
        Tally {
            lat: Latencies::new(),
            measured: 0,
            first: None,
            last: start,
        }
    }

    /// One measured iteration: started at `started`, took `sample`, ended at `ended`.
    fn record(&mut self, started: Instant, sample: Duration, ended: Instant) {
        self.lat.record(sample);
        self.measured += 1;
        self.first.get_or_insert(started);
        self.last = ended;
    }

    /// The result; the run's whole time if nothing was measured.
    fn finish(self, start: Instant, peak_msgs_per_sec: Option<f64>) -> Measured {
        let elapsed = match self.first {
            Some(first) => self.last.saturating_duration_since(first),
            None => start.elapsed(),
        };
        Measured {
            lat: self.lat,
            iterations: self.measured,
            elapsed,
            peak_msgs_per_sec,
            completions_per_qp: None,
        }
    }
}

/// perftest's peak: over every run of consecutive work requests `i..=j`, the time from
/// the post of `i` to the completion of `j` divided by their number; the smallest such
/// time per message gives the peak rate. `posted` and `completed` are in nanoseconds
/// from the start, one per request, both in order (so a run is never negative; one that
/// takes no time has no rate, and neither has the whole: `None`).
///
/// perftest tries every pair, O(n²): minutes at the end of a long run. The same minimum in
/// O(n log n): with the posts as points `(i, posted[i])` and a completion as the point
/// `(j + 1, completed[j])`, a run's time per message is the slope between the two. The
/// smallest slope from a completion to the posts before it is reached at a post on their
/// upper convex hull (every post lies on or below the line of that slope), and along the
/// hull the slopes fall then rise, so a binary search finds it.
fn peak_rate(posted: &[u64], completed: &[u64]) -> Option<f64> {
    let n = posted.len().min(completed.len());
    if n == 0 || (0..n).any(|j| completed[j] <= posted[j]) {
        return None;
    }
    type Point = (i128, i128);
    // The slope from `a` to `b` (b to the right) is at most the slope from `c` to `b`.
    let flatter =
        |a: Point, c: Point, b: Point| (b.1 - a.1) * (b.0 - c.0) <= (b.1 - c.1) * (b.0 - a.0);
    let mut hull: Vec<Point> = Vec::with_capacity(n);
    // The best slope so far as a fraction (time, messages).
    let mut best: Option<(i128, i128)> = None;
    for j in 0..n {
        let post = (j as i128, i128::from(posted[j]));
        while let [.., o, a] = hull[..] {
            // Not a right turn o -> a -> post: `a` is not on the upper hull any more.
            if (a.0 - o.0) * (post.1 - o.1) - (a.1 - o.1) * (post.0 - o.0) >= 0 {
                hull.pop();
            } else {
                break;
            }
        }
        hull.push(post);
        let done = (j as i128 + 1, i128::from(completed[j]));
        let (mut lo, mut hi) = (0, hull.len() - 1);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if flatter(hull[mid + 1], hull[mid], done) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let run = (done.1 - hull[lo].1, done.0 - hull[lo].0);
        if best.is_none_or(|b| run.0 * b.1 < b.0 * run.1) {
            best = Some(run);
        }
    }
    best.map(|(time, messages)| 1e9 * messages as f64 / time as f64)
}

/// The client's part of one size; `peers` holds the peer's buffer of each QP.
fn client_size(
    side: &Side,
    peers: &[RemoteAddr],
    p: &Params,
    size: usize,
    progress: &Progress,
    index: usize,
) -> Result<Measured, Error> {
    let per_size = p.progress_per_size();
    let start = Instant::now();
    let plan = Plan::new(p, start);
    let tick = |done: u64, now: Instant| progress.tick(index, per_size, plan.progress(done, now));
    match p.kind {
        Kind::Lat => {
            let peer = *peers.first().ok_or("the server announced no QP")?;
            client_lat(side, peer, p, size, &plan, tick)
        }
        Kind::Bw => client_bw(side, peers, p, size, &plan, tick),
    }
}

/// A lat test's size: one operation at a time.
fn client_lat(
    side: &Side,
    peer: RemoteAddr,
    p: &Params,
    size: usize,
    plan: &Plan,
    tick: impl Fn(u64, Instant),
) -> Result<Measured, Error> {
    let mut tally = Tally::new(plan.start);
    let mut pending = VecDeque::new();
    let mut i = 0u64;
    while plan.more(i, Instant::now()) {
        let t0 = Instant::now();
        let sample = match p.op {
            Op::Send => {
                side.qp
                    .post_send(payload_request(side, p, SEND_WRID, 0, size, None)?)?;
                wait_for(side, RECV_WRID, &mut pending)?;
                let rtt = t0.elapsed();
                if p.repost_after(i + 1) {
                    post_recv(side, &side.qp, 0, size)?;
                }
                rtt / 2
            }
            Op::Write => {
                let mark = write_mark(i);
                side.mr.write_at(2 * size - 1, &[mark])?;
                side.qp
                    .post_send(payload_request(side, p, SEND_WRID, size, size, Some(peer))?)?;
                wait_byte(side, size - 1, mark, &mut Stop::never())?;
                t0.elapsed() / 2
            }
            Op::Read => {
                side.qp.post_send(SendRequest::read(
                    SEND_WRID,
                    &[side.mr.slice(0..size)?],
                    peer,
                ))?;
                wait_for(side, SEND_WRID, &mut pending)?;
                t0.elapsed()
            }
            Op::Atomic => {
                side.qp.post_send(SendRequest::fetch_add(
                    SEND_WRID,
                    side.mr.slice(0..8)?,
                    peer,
                    1,
                ))?;
                wait_for(side, SEND_WRID, &mut pending)?;
                t0.elapsed()
            }
        };
        if plan.measures(t0) {
            tally.record(t0, sample, Instant::now());
        }
        i += 1;
        if i.is_multiple_of(64) {
            tick(i, Instant::now());
        }
    }
    // Send completions of the ping-pongs may still be queued: take them.
    let mut wcs = [WorkCompletion::default(); 64];
    while side.try_poll(&mut wcs)? > 0 {}
    Ok(tally.finish(plan.start, None))
}

/// One QP of a bw run: what it has posted and completed, and when each of its outstanding
/// requests was posted (RC completes a QP's requests in order).
struct Lane {
    posted: u64,
    completed: u64,
    /// Whether it posts more (its iterations, or the duration, are not over).
    open: bool,
    posted_at: VecDeque<Instant>,
}

/// A bw test's size, as perftest's `run_iter_bw`: round-robin over the QPs, each QP posts
/// while it has fewer than `tx-depth` requests outstanding and iterations left, then the
/// one CQ is polled, each completion going to its QP by the completion's `qp_num`.
fn client_bw(
    side: &Side,
    peers: &[RemoteAddr],
    p: &Params,
    size: usize,
    plan: &Plan,
    tick: impl Fn(u64, Instant),
) -> Result<Measured, Error> {
    let start = plan.start;
    let mut tally = Tally::new(start);
    let window = u64::from(p.tx_depth);
    let qps: Vec<&Qp> = side.qps().collect();
    if qps.len() != peers.len() {
        return Err(format!(
            "{} QP(s) here, {} buffer(s) of the server",
            qps.len(),
            peers.len()
        )
        .into());
    }
    let lane_of: HashMap<u32, usize> = qps
        .iter()
        .enumerate()
        .map(|(i, qp)| (qp.qpn(), i))
        .collect();
    let mut lanes: Vec<Lane> = qps
        .iter()
        .map(|_| Lane {
            posted: 0,
            completed: 0,
            open: true,
            posted_at: VecDeque::with_capacity(p.tx_depth as usize),
        })
        .collect();
    let part = p.max_size();
    // perftest's peak takes the posts and the completions each in their order over all
    // QPs (tposted[totscnt], tcompleted[totccnt]).
    let keep_times = p.peak();
    let capacity = if keep_times {
        p.total_iters() as usize
    } else {
        0
    };
    let (mut post_ns, mut done_ns) = (Vec::with_capacity(capacity), Vec::new());
    done_ns.reserve(capacity);
    let mut wcs = [WorkCompletion::default(); 64];
    let (mut posted, mut completed) = (0u64, 0u64);
    let mut open = lanes.len();
    while open > 0 || completed < posted {
        for (i, ((qp, &peer), lane)) in qps.iter().zip(peers).zip(&mut lanes).enumerate() {
            let offset = i * part;
            while lane.open && lane.posted - lane.completed < window {
                let now = Instant::now();
                if !plan.more(lane.posted, now) {
                    lane.open = false;
                    open -= 1;
                    break;
                }
                let wr_id = lane.posted;
                let wr = match p.op {
                    Op::Send => payload_request(side, p, wr_id, offset, size, None)?,
                    Op::Write => payload_request(side, p, wr_id, offset, size, Some(peer))?,
                    Op::Read => {
                        SendRequest::read(wr_id, &[side.mr.slice(offset..offset + size)?], peer)
                    }
                    Op::Atomic => {
                        SendRequest::fetch_add(wr_id, side.mr.slice(offset..offset + 8)?, peer, 1)
                    }
                };
                qp.post_send(wr)?;
                let at = Instant::now();
                lane.posted_at.push_back(at);
                if keep_times {
                    post_ns.push((at - start).as_nanos() as u64);
                }
                lane.posted += 1;
                posted += 1;
            }
        }
        if completed == posted {
            continue;
        }
        let n = side.wait(&mut wcs)?;
        let now = Instant::now();
        for wc in &wcs[..n] {
            let lane = lane_of
                .get(&wc.qp_num())
                .and_then(|&i| lanes.get_mut(i))
                .ok_or_else(|| {
                    format!(
                        "a completion of QP {:#x}, not one of this run's",
                        wc.qp_num()
                    )
                })?;
            // The oldest outstanding request of its QP.
            let Some(at) = lane.posted_at.pop_front() else {
                return Err(format!(
                    "QP {:#x} completed more requests than were posted on it",
                    wc.qp_num()
                )
                .into());
            };
            if plan.measures(at) {
                tally.record(at, now - at, now);
            }
            if keep_times {
                done_ns.push((now - start).as_nanos() as u64);
            }
            lane.completed += 1;
            completed += 1;
        }
        tick(completed, now);
    }
    let peak = if keep_times {
        peak_rate(&post_ns, &done_ns)
    } else {
        None
    };
    let mut measured = tally.finish(start, peak);
    measured.completions_per_qp = Some(lanes.iter().map(|lane| lane.completed).collect());
    Ok(measured)
}

/// The server's part of one size (after `Ready`): answers send and write ping-pongs,
/// receives the sends of a bandwidth run; reads, writes and atomics need nothing from it.
/// In a duration run it serves until the client's `Done` is waiting on `stop`.
fn server_size(
    side: &Side,
    peer: RemoteAddr,
    p: &Params,
    size: usize,
    stop: &mut Stop<'_>,
) -> Result<(), Error> {
    let mut wcs = [WorkCompletion::default(); 64];
    match (p.op, p.kind) {
        (Op::Send, kind) => {
            // Each QP receives its iterations into its own part of the buffer and keeps
            // its own receives posted (perftest's run_iter_bw_server: rcnt_for_qp); a lat
            // test has one QP. By QP number: the QP, where its receives land, how many
            // it has taken.
            let part = p.max_size();
            let mut lanes: HashMap<u32, (&Qp, usize, u64)> = side
                .qps()
                .enumerate()
                .map(|(i, qp)| (qp.qpn(), (qp, i * part, 0)))
                .collect();
            let mut received = 0u64;
            while stop.asked() || received < p.total_iters() {
                let n = if stop.asked() {
                    let n = side.wait_until(&mut wcs, Instant::now() + Duration::from_millis(1))?;
                    if n == 0 && stop.requested()? {
                        break;
                    }
                    n
                } else {
                    side.wait(&mut wcs)?
                };
                for wc in &wcs[..n] {
                    if wc.wr_id() != RECV_WRID {
                        continue;
                    }
                    let Some((qp, offset, taken)) = lanes.get_mut(&wc.qp_num()) else {
                        return Err(format!(
                            "a receive on QP {:#x}, not one of this run's",
                            wc.qp_num()
                        )
                        .into());
                    };
                    *taken += 1;
                    received += 1;
                    if p.repost_after(*taken) {
                        post_recv(side, qp, *offset, size)?;
                    }
                    if kind == Kind::Lat {
                        side.qp
                            .post_send(payload_request(side, p, SEND_WRID, 0, size, None)?)?;
                    }
                }
            }
        }
        (Op::Write, Kind::Lat) => {
            let mut i = 0u64;
            while stop.asked() || i < p.iters {
                let mark = write_mark(i);
                if !wait_byte(side, size - 1, mark, stop)? {
                    break;
                }
                side.mr.write_at(2 * size - 1, &[mark])?;
                side.qp
                    .post_send(payload_request(side, p, SEND_WRID, size, size, Some(peer))?)?;
                i += 1;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Exchanges the hellos (the server's first) and connects every QP of `side` to the
/// peer's QP of the same rank; returns the peer's buffer of each QP, parts of
/// [`Params::max_size`] bytes.
fn connect(
    side: &Side,
    p: &Params,
    control: &mut Control,
    client: bool,
) -> Result<Vec<RemoteAddr>, Error> {
    let mine = side.hello(Mtu::Mtu4096, p.max_size());
    let peer: Hello = if client {
        let peer = control.recv()?;
        control.send(&mine)?;
        peer
    } else {
        control.send(&mine)?;
        control.recv()?
    };
    side.connect_all(&mine, &peer)
}

fn side_for(ctx: &Context, p: &Params) -> Result<Side, Error> {
    Side::with_qps(
        ctx,
        p.qps,
        p.buffer_len(),
        p.send_depth(),
        p.recv_depth(),
        p.inline_size,
        p.events,
    )
}

/// The client: sends the parameters, connects, runs every size, handing each result to
/// `each` as soon as it is known (a closed stdout stops the run there).
fn client(
    ctx: &Context,
    control: &mut Control,
    p: &Params,
    args: &PerfArgs,
    mut each: impl FnMut(&Progress, SizeResult) -> Result<(), Error>,
) -> Result<(), Error> {
    control.send(p)?;
    let side = side_for(ctx, p)?;
    let peers = connect(&side, p, control, true)?;
    let progress = Progress::new(p);
    for (index, &size) in p.sizes.iter().enumerate() {
        progress.size(size);
        // Receives for the pongs, and a clean landing area for the peer's writes.
        if p.op == Op::Send && p.kind == Kind::Lat {
            for _ in 0..p.recv_prepost() {
                post_recv(&side, &side.qp, 0, size)?;
            }
        }
        side.mr.fill(0..size, 0)?;
        control.send(&Msg::Go(size))?;
        match control.recv()? {
            Msg::Ready => {}
            other => return Err(format!("unexpected {other:?} from the server").into()),
        }
        let m = client_size(&side, &peers, p, size, &progress, index)?;
        control.send(&Msg::Done)?;
        match control.recv()? {
            Msg::Done => {}
            other => return Err(format!("unexpected {other:?} from the server").into()),
        }
        let secs = m.elapsed.as_secs_f64();
        let bw = p.kind == Kind::Bw;
        let rate = |n: f64| if secs > 0.0 { n / secs } else { 0.0 };
        let histogram = args.histogram.then(|| {
            m.lat
                .histogram()
                .iter_quantiles(2)
                .map(|v| HistogramLine {
                    usec: v.value_iterated_to() as f64 / 1e3,
                    percentile: v.quantile_iterated_to() * 100.0,
                    count: v.count_since_last_iteration(),
                })
                .collect()
        });
        let result = SizeResult {
            bytes: size,
            iterations: m.iterations,
            t_min_usec: m.lat.quantile_us(0.0),
            t_median_usec: m.lat.quantile_us(0.5),
            t_typical_usec: m.lat.quantile_us(0.5),
            t_p99_usec: m.lat.quantile_us(0.99),
            t_p99_9_usec: m.lat.quantile_us(0.999),
            t_max_usec: m.lat.quantile_us(1.0),
            t_avg_usec: m.lat.mean_us(),
            t_stdev_usec: m.lat.stdev_us(),
            elapsed_sec: secs,
            bw_gbit_per_sec: bw.then(|| rate(m.iterations as f64 * size as f64 * 8.0) / 1e9),
            bw_peak_gbit_per_sec: m
                .peak_msgs_per_sec
                .filter(|_| bw)
                .map(|r| r * size as f64 * 8.0 / 1e9),
            msg_rate_mpps: bw.then(|| rate(m.iterations as f64) / 1e6),
            completions_per_qp: m.completions_per_qp,
            histogram,
            curve: crate::plot::percentile_curve(&m.lat),
        };
        each(&progress, result)?;
    }
    progress.finish();
    control.send(&Msg::Finish)?;
    Ok(())
}

/// The server: takes the parameters, connects, serves every size the client asks for.
fn server(ctx: &Context, control: &mut Control) -> Result<Params, Error> {
    let p: Params = control.recv()?;
    // The client checked them too; a server takes no QP count it would not run.
    check_qps(p.qps, p.kind).map_err(|e| format!("the client's parameters: {e}"))?;
    // The client's Done may come after a long run: wait for it as long as it takes (a
    // client that dies closes the connection).
    control.set_patience(None)?;
    let side = side_for(ctx, &p)?;
    let peers = connect(&side, &p, control, false)?;
    let peer = *peers.first().ok_or("the client announced no QP")?;
    loop {
        match control.recv()? {
            Msg::Go(size) if size >= 1 && size <= p.max_size() => {
                if p.op == Op::Send {
                    for (i, qp) in side.qps().enumerate() {
                        for _ in 0..p.recv_prepost() {
                            post_recv(&side, qp, i * p.max_size(), size)?;
                        }
                    }
                }
                side.mr.fill(0..size, 0)?;
                control.send(&Msg::Ready)?;
                server_size(&side, peer, &p, size, &mut Stop::new(&p, control))?;
                match control.recv()? {
                    Msg::Done => control.send(&Msg::Done)?,
                    other => return Err(format!("unexpected {other:?} from the client").into()),
                }
                let mut wcs = [WorkCompletion::default(); 64];
                while side.try_poll(&mut wcs)? > 0 {}
            }
            Msg::Finish => return Ok(p),
            other => return Err(format!("unexpected {other:?} from the client").into()),
        }
    }
}

/// perftest's rule of dashes.
const RULE_LEN: usize = 87;

/// The bandwidth unit: perftest's MiB/sec (2^20 bytes), or Gb/sec (10^9 bits) with
/// --report_gbits.
fn bw_unit(args: &PerfArgs) -> &'static str {
    if args.report_gbits {
        "Gb/sec"
    } else {
        "MiB/sec"
    }
}

/// `gbit_per_sec` in the unit of [`bw_unit`].
fn bw_value(args: &PerfArgs, gbit_per_sec: f64) -> f64 {
    if args.report_gbits {
        gbit_per_sec
    } else {
        gbit_per_sec * 1e9 / 8.0 / f64::from(1u32 << 20)
    }
}

fn print_header(args: &PerfArgs, p: &Params, network: &str) -> Result<(), Error> {
    let rule = "-".repeat(RULE_LEN);
    outln!("{rule}")?;
    outln!("{:>50}", p.title())?;
    outln!(" Connection type : RC          Network : {network}")?;
    outln!(" Number of qps   : {}", p.qps)?;
    match p.duration_secs {
        Some(secs) => outln!(
            " Duration        : {secs} s (measured: the middle {:.2} s)",
            f64::from(secs) / 2.0
        )?,
        None if p.qps > 1 => outln!(
            " Iterations      : {} per QP ({} in all)",
            p.iters,
            p.total_iters()
        )?,
        None => outln!(" Iterations      : {}", p.iters)?,
    }
    if p.kind == Kind::Bw {
        outln!(" TX depth        : {}", p.tx_depth)?;
    }
    outln!(" Mtu             : 4096[B]")?;
    outln!(" Max inline data : {}[B]", p.inline_size)?;
    outln!(
        " Completions     : {}",
        if p.events {
            "CQ events"
        } else {
            "busy polling"
        }
    )?;
    if p.kind == Kind::Lat {
        outln!(
            " Latency         : {}",
            if p.halves_round_trip() {
                "one-way (round trip / 2), as perftest"
            } else {
                "round trip, post to completion"
            }
        )?;
    }
    outln!("{rule}")?;
    let unit = bw_unit(args);
    match p.kind {
        Kind::Lat => outln!(
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    \
             t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]"
        )?,
        Kind::Bw => outln!(
            " #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]"
        )?,
    }
    Ok(())
}

/// One result as perftest prints it: its table row, or with --output only the number.
fn print_row(args: &PerfArgs, p: &Params, r: &SizeResult) -> Result<(), Error> {
    let bw = |value: Option<f64>| bw_value(args, value.unwrap_or(0.0));
    match (args.output, p.kind) {
        (Some(OutputLevel::Bandwidth), _) => outln!("{:.6}", bw(r.bw_gbit_per_sec))?,
        (Some(OutputLevel::MessageRate), _) => outln!("{:.6}", r.msg_rate_mpps.unwrap_or(0.0))?,
        (Some(OutputLevel::Latency), _) => outln!("{:.6}", r.t_avg_usec)?,
        (None, Kind::Lat) => outln!(
            " {:<7} {:<14} {:<14.2} {:<14.2} {:<16.2} {:<14.2} {:<15.2} {:<22.2} {:.2}",
            r.bytes,
            r.iterations,
            r.t_min_usec,
            r.t_max_usec,
            r.t_typical_usec,
            r.t_avg_usec,
            r.t_stdev_usec,
            r.t_p99_usec,
            r.t_p99_9_usec
        )?,
        (None, Kind::Bw) => outln!(
            " {:<10} {:<14} {:<18.2} {:<21.2} {:.6}",
            r.bytes,
            r.iterations,
            bw(r.bw_peak_gbit_per_sec),
            bw(r.bw_gbit_per_sec),
            r.msg_rate_mpps.unwrap_or(0.0)
        )?,
    }
    if args.output.is_none() {
        if let Some(lines) = &r.histogram {
            outln!(
                "   {} bytes, {} (usec):",
                r.bytes,
                match p.kind {
                    Kind::Lat => "latency distribution",
                    Kind::Bw => "post-to-completion distribution",
                }
            )?;
            outln!(
                "   {:>14} {:>12} {:>12}",
                "value[usec]",
                "percentile",
                "count"
            )?;
            for line in lines {
                outln!(
                    "   {:>14.3} {:>12.6} {:>12}",
                    line.usec,
                    line.percentile,
                    line.count
                )?;
            }
        }
    }
    Ok(())
}

/// The closing lines: the rule and the devices' counters (not with --output).
fn print_footer(
    args: &PerfArgs,
    client: DeviceCounters,
    server: Option<DeviceCounters>,
) -> Result<(), Error> {
    if args.output.is_some() {
        return Ok(());
    }
    outln!("{}", "-".repeat(RULE_LEN))?;
    outln!(" client device: {client}")?;
    if let Some(server) = server {
        outln!(" server device: {server}")?;
    }
    Ok(())
}

fn latency_meaning(p: &Params) -> &'static str {
    if p.kind == Kind::Bw {
        "post to completion"
    } else if p.halves_round_trip() {
        "one-way (round trip / 2)"
    } else {
        "round trip"
    }
}

/// Runs the client over `control` and prints as the arguments ask: rows as they come (or
/// the JSON document at the end), then the counters of the devices in this process.
fn run_client(
    args: &PerfArgs,
    p: &Params,
    network: &str,
    ctx: &Context,
    server_ctx: Option<&Context>,
    control: &mut Control,
) -> Result<(), Error> {
    let mut results = Vec::new();
    client(ctx, control, p, args, |progress, result| {
        if !args.json {
            progress.suspend(|| print_row(args, p, &result))?;
        }
        if args.json || args.plot.is_some() {
            results.push(result);
        }
        Ok(())
    })?;
    if let Some(path) = &args.plot {
        let sizes = results.iter().map(|r| crate::plot::PerfSize {
            bytes: r.bytes,
            curve: &r.curve,
            gbit_per_sec: r.bw_gbit_per_sec,
        });
        crate::plot::perf(path, &p.title(), &sizes.collect::<Vec<_>>())?;
    }
    let client_counters = DeviceCounters::of(ctx);
    let server_counters = server_ctx.map(DeviceCounters::of);
    if args.json {
        let report = Report {
            test: p.title(),
            op: p.op,
            kind: p.kind,
            network,
            mtu: 4096,
            qps: p.qps,
            tx_depth: p.tx_depth,
            inline_size: p.inline_size,
            events: p.events,
            duration_sec: p.duration_secs,
            latency: latency_meaning(p),
            results: &results,
            client_counters,
            server_counters,
        };
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
        Ok(())
    } else {
        print_footer(args, client_counters, server_counters)
    }
}

/// Checks what only the device can say: the inline size it takes, and whether one CQ holds
/// the completions of every QP (perftest sizes its CQ as TX depth x QPs too).
fn check_device(ctx: &Context, p: &Params) -> Result<(), Error> {
    let attr = ctx.query_device();
    let max = attr.max_inline_data;
    if p.inline_size > max {
        return Err(format!(
            "-I {}: above the device's max_inline_data ({max} bytes)",
            p.inline_size
        )
        .into());
    }
    let entries = (u64::from(p.send_depth()) + u64::from(p.recv_depth())) * u64::from(p.qps) + 16;
    if entries > u64::from(attr.max_cqe) {
        return Err(format!(
            "-q {} with -t {}: the CQ the QPs share would need {entries} entries, above the \
             device's max_cqe ({}): use fewer QPs or a smaller -t",
            p.qps, p.tx_depth, attr.max_cqe
        )
        .into());
    }
    Ok(())
}

/// Runs `softverbs perf`.
pub fn run(args: &PerfArgs) -> Result<(), Error> {
    match args.net.mode() {
        Mode::Server => serve(args),
        // The client's parameters are checked before any device is opened.
        mode => drive(args, mode, &Params::from_args(args)?),
    }
}

/// `--server`: one client, whose parameters it takes.
fn serve(args: &PerfArgs) -> Result<(), Error> {
    let (ctx, _) = args.net.open()?;
    let (listener, port) = args.net.listen(false)?;
    outln!("waiting for a client on TCP port {port}")?;
    output::flush()?;
    let (stream, peer) = listener.accept()?;
    let mut control = Control::new(stream)?;
    let p = server(&ctx, &mut control)?;
    outln!(
        "served {} for {peer}: {} size(s), {}",
        p.title(),
        p.sizes.len(),
        match p.duration_secs {
            Some(secs) => format!("{secs} s each"),
            None if p.qps > 1 => format!("{} QPs x {} iterations each", p.qps, p.iters),
            None => format!("{} iterations each", p.iters),
        }
    )?;
    Ok(())
}

/// The client side, with the server in another process (`--client`) or on a thread here.
fn drive(args: &PerfArgs, mode: Mode, p: &Params) -> Result<(), Error> {
    let (ctx, server_ctx) = args.net.open()?;
    check_device(&ctx, p)?;
    let quiet = args.json || args.output.is_some();
    let (network, stream, served) = match (mode, server_ctx) {
        (Mode::Client(host), _) => {
            // The device picks the path when the QPs connect (shared memory to a device of
            // this host, UDP otherwise): the counters at the end say which carried the run.
            let network = format!("RoCEv2, {} -> server {host}", ctx.device().address());
            let stream = conn::connect_tcp(
                &host,
                args.net.tcp_port,
                args.net.timeout,
                "softverbs perf OP KIND --server",
            )?;
            (network, stream, None)
        }
        (mode, Some(server_ctx)) => {
            let network = match mode {
                Mode::InProcess => "in-process (one process, no socket)".to_owned(),
                _ => format!(
                    "UDP loopback, {} <-> {} (one process)",
                    ctx.device().address(),
                    server_ctx.device().address()
                ),
            };
            let (listener, port) = args.net.listen(true)?;
            // The server side runs on a thread of its own that is not waited for when the
            // client side fails (a closed stdout, say): the error ends the process at once.
            let thread_ctx = server_ctx.clone();
            let thread = std::thread::spawn(move || -> Result<(), String> {
                let (stream, _) = listener.accept().map_err(|e| e.to_string())?;
                let mut control = Control::new(stream).map_err(|e| e.to_string())?;
                server(&thread_ctx, &mut control)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            });
            let stream = conn::connect_tcp("127.0.0.1", port, PATIENCE, "")?;
            (network, stream, Some((server_ctx, thread)))
        }
        (_, None) => return Err("no device for the server side".into()),
    };
    if !quiet {
        print_header(args, p, &network)?;
    }
    let mut control = Control::new(stream)?;
    let server_ctx = served.as_ref().map(|(ctx, _)| ctx);
    run_client(args, p, &network, &ctx, server_ctx, &mut control)?;
    drop(control);
    if let Some((_, thread)) = served {
        let served = thread.join().map_err(|_| "the server side panicked")?;
        served.map_err(|e| format!("server side: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_is_the_best_rate_over_any_run_of_consecutive_requests() {
        // Four requests posted at once; completions at 10, 11, 12, 13 ns: the run 0..=3
        // takes 13 ns for 4 messages (3.25 ns each), better than any shorter run.
        let posted = [0, 0, 0, 0];
        let completed = [10, 11, 12, 13];
        let rate = peak_rate(&posted, &completed).unwrap();
        assert!((rate - 1e9 / 3.25).abs() < 1.0, "{rate}");
        assert_eq!(peak_rate(&[], &[]), None);
    }

    /// perftest's definition, pair by pair (O(n²)): what [`peak_rate`] must equal.
    fn peak_rate_of_every_pair(posted: &[u64], completed: &[u64]) -> Option<f64> {
        let mut best = f64::INFINITY;
        for (i, &post) in posted.iter().enumerate() {
            for (count, &done) in (1u32..).zip(completed.iter().skip(i)) {
                best = best.min(done.saturating_sub(post) as f64 / f64::from(count));
            }
        }
        (best.is_finite() && best > 0.0).then(|| 1e9 / best)
    }

    #[test]
    fn the_peak_equals_perftests_pair_by_pair_minimum_on_random_runs() {
        // Runs of 1..300 requests: posts in order, each completion after its post and
        // after the previous completion, with bursts and stalls (xorshift, fixed seed).
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |bound: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % bound
        };
        for round in 0..400 {
            let n = 1 + next(300) as usize;
            let (mut posted, mut completed) = (Vec::new(), Vec::new());
            let (mut post, mut done) = (next(1_000), 0);
            for _ in 0..n {
                post += if next(4) == 0 { next(5_000) } else { next(3) };
                done = done.max(post) + 1 + if next(8) == 0 { next(20_000) } else { next(50) };
                posted.push(post);
                completed.push(done);
            }
            let fast = peak_rate(&posted, &completed).unwrap();
            let slow = peak_rate_of_every_pair(&posted, &completed).unwrap();
            assert!(
                (fast - slow).abs() <= slow * 1e-12,
                "round {round}: {fast} vs {slow}"
            );
        }
        // A run that takes no time has no rate, as perftest's division would say.
        assert_eq!(peak_rate(&[5, 6], &[5, 9]), None);
        assert_eq!(peak_rate_of_every_pair(&[5, 6], &[5, 9]), None);
    }

    #[test]
    fn mib_per_sec_is_perftests_unit() {
        // perftest: Factor = 10^9 / (2^20 * 8) = 119.2 MiB/sec per Gb/sec.
        let args = PerfArgs {
            op: Op::Write,
            kind: Kind::Bw,
            size: None,
            all: false,
            iters: None,
            duration: None,
            cpu_freq: false,
            tx_depth: 128,
            qps: 1,
            inline_size: 0,
            rdma_cm: false,
            report_gbits: false,
            output: None,
            events: false,
            histogram: false,
            json: false,
            plot: None,
            net: NetArgs {
                server: false,
                client: None,
                in_process: true,
                tcp_port: 0,
                listen: None,
                timeout: Duration::from_secs(1),
                pcap: None,
            },
        };
        assert!((bw_value(&args, 1.0) - 119.209).abs() < 0.001);
        assert_eq!(
            bw_value(
                &PerfArgs {
                    report_gbits: true,
                    ..args
                },
                1.0
            ),
            1.0
        );
    }
}
