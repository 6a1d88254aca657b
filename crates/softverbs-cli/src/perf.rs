//! `softverbs perf OP KIND`: perftest-like latency (`ib_*_lat`) and bandwidth (`ib_*_bw`)
//! runs of send, RDMA write, RDMA read and atomics over one RC connection.
//!
//! The client drives; the server adopts the client's parameters (sent as the first
//! control message), so `--server` needs no other option. Per message size, the two
//! sides meet on the control connection (`Go` / `Ready`), run, and meet again (`Done`).
//!
//! What each test measures, as perftest does:
//! - `send lat`: ping-pong of sends; one-way latency = round trip / 2.
//! - `write lat`: ping-pong of RDMA writes, each side polling the last byte of its buffer
//!   for the peer's write; one-way latency = round trip / 2.
//! - `read lat`, `atomic lat`: one RDMA read (fetch-and-add) at a time; the full round
//!   trip from post to completion.
//! - `* bw`: up to `tx-depth` work requests outstanding; bandwidth and message rate over
//!   the whole run, and the post-to-completion time of every request.

use crate::conn::{self, Control, Hello, Mode, NetArgs, Side, PATIENCE};
use crate::stats::Latencies;
use crate::Error;
use serde::{Deserialize, Serialize};
use softverbs::*;
use std::collections::VecDeque;
use std::io::{IsTerminal, Write};
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

    /// Every power of two from 2 bytes to 1 MiB (bw) or 8 KiB (lat).
    #[arg(short = 'a', long = "all")]
    pub all: bool,

    /// Iterations per size [default: 1000 for lat, 5000 for bw].
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<u64>,

    /// Work requests kept outstanding in bw tests.
    #[arg(short = 't', long = "tx-depth", default_value_t = 128)]
    pub tx_depth: u32,

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

/// What the client tells the server before anything else.
#[derive(Serialize, Deserialize, Clone, Debug)]
struct Params {
    op: Op,
    kind: Kind,
    sizes: Vec<usize>,
    iters: u64,
    tx_depth: u32,
}

impl Params {
    fn from_args(args: &PerfArgs) -> Result<Params, Error> {
        let sizes = if args.op == Op::Atomic {
            if args.size.is_some_and(|s| s != 8) {
                return Err("atomics work on 8 bytes: -s must be 8 or absent".into());
            }
            vec![8]
        } else if args.all {
            let top = if args.kind == Kind::Bw { 20 } else { 13 };
            (1..=top).map(|p| 1usize << p).collect()
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
        let iters = args
            .iters
            .unwrap_or(if args.kind == Kind::Lat { 1000 } else { 5000 });
        if iters == 0 {
            return Err("-n must be at least 1".into());
        }
        Ok(Params {
            op: args.op,
            kind: args.kind,
            sizes,
            iters,
            tx_depth: args.tx_depth,
        })
    }

    fn max_size(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(8)
    }

    fn recv_depth(&self) -> u32 {
        if self.op == Op::Send {
            self.iters.min(1024).max(u64::from(self.tx_depth)) as u32
        } else {
            1
        }
    }

    fn send_depth(&self) -> u32 {
        match self.kind {
            Kind::Bw => self.tx_depth,
            Kind::Lat => 16,
        }
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
}

/// Control messages after the parameters and the hellos.
#[derive(Serialize, Deserialize, Debug)]
enum Msg {
    Go(usize),
    Ready,
    Done,
    Finish,
}

/// The results of one size.
#[derive(Serialize, Debug)]
struct SizeResult {
    bytes: usize,
    iterations: u64,
    /// Latency (lat) or post-to-completion time (bw) percentiles, microseconds.
    t_min_usec: f64,
    t_median_usec: f64,
    t_p99_usec: f64,
    t_p99_9_usec: f64,
    t_max_usec: f64,
    t_avg_usec: f64,
    t_stdev_usec: f64,
    /// Seconds the whole run of this size took.
    elapsed_sec: f64,
    /// Bandwidth (bw only), 10^9 bits per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    bw_gbit_per_sec: Option<f64>,
    /// Message rate (bw only), millions per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    msg_rate_mpps: Option<f64>,
    /// The distribution of the t_* times, for `--plot` (`plot::percentile_curve`).
    #[serde(skip)]
    curve: Vec<(f64, f64)>,
}

/// The client device's protocol counters over the whole run: retransmissions and NAKs
/// explain a slow run.
#[derive(Serialize, Debug, Default)]
struct RunCounters {
    packets_sent: u64,
    packets_received: u64,
    retransmitted_packets: u64,
    go_back_n_restarts: u64,
    ack_timeouts: u64,
    naks_received: u64,
    rnr_naks_received: u64,
    duplicates_received: u64,
    packets_dropped: u64,
}

impl RunCounters {
    fn of(ctx: &Context) -> RunCounters {
        let c = ctx.device().counters();
        RunCounters {
            packets_sent: c.packets_sent,
            packets_received: c.packets_received,
            retransmitted_packets: c.retransmitted_packets,
            go_back_n_restarts: c.retries,
            ack_timeouts: c.timeouts,
            naks_received: c.naks_received,
            rnr_naks_received: c.rnr_naks_received,
            duplicates_received: c.duplicates_received,
            packets_dropped: c.total_drops(),
        }
    }
}

/// The whole JSON document.
#[derive(Serialize, Debug)]
struct Report<'a> {
    test: String,
    op: Op,
    kind: Kind,
    network: &'a str,
    mtu: u32,
    tx_depth: u32,
    latency: &'static str,
    results: &'a [SizeResult],
    client_counters: RunCounters,
}

/// A progress line on stderr, only when stderr is a terminal.
struct Progress {
    on: bool,
    last: Instant,
    shown: bool,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            on: std::io::stderr().is_terminal(),
            last: Instant::now(),
            shown: false,
        }
    }

    fn tick(&mut self, size: usize, done: u64, total: u64) {
        if !self.on || done & 0xff != 0 || self.last.elapsed() < Duration::from_millis(200) {
            return;
        }
        self.last = Instant::now();
        self.shown = true;
        let _ = write!(
            std::io::stderr(),
            "\r  {size} bytes: {done}/{total} ({:.0}%)\x1b[K",
            done as f64 * 100.0 / total as f64
        );
    }

    fn clear(&mut self) {
        if self.shown {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
            self.shown = false;
        }
    }
}

const SEND_WRID: u64 = u64::MAX;
const RECV_WRID: u64 = u64::MAX - 1;

/// The value the `i`th write of a write-latency run puts in the last byte (never 0, the
/// cleared value, and never the previous one).
fn write_mark(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

/// Waits until the byte at `offset` of the side's buffer is `value`, draining (and
/// checking) completions meanwhile; the poll drives the device's progress.
fn wait_byte(side: &Side, offset: usize, value: u8) -> Result<(), Error> {
    let deadline = Instant::now() + PATIENCE;
    let mut wcs = [WorkCompletion::default(); 16];
    let mut byte = [0u8];
    let mut empty_polls = 0u32;
    loop {
        side.mr.read_at(offset, &mut byte)?;
        if byte[0] == value {
            return Ok(());
        }
        if side.try_poll(&mut wcs)? == 0 {
            conn::spin_pause(&mut empty_polls);
        }
        if Instant::now() > deadline {
            return Err("timed out waiting for the peer's RDMA write".into());
        }
    }
}

/// Waits for the next completion of `wr_id`, counting (and discarding) others.
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

fn post_recv(side: &Side, size: usize) -> Result<(), Error> {
    side.qp
        .post_recv(RecvRequest::new(RECV_WRID, &[side.mr.slice(0..size)?]))?;
    Ok(())
}

/// The client's part of one size; returns the per-operation times and the elapsed time.
fn client_size(
    side: &Side,
    peer: RemoteAddr,
    p: &Params,
    size: usize,
    progress: &mut Progress,
) -> Result<(Latencies, Duration), Error> {
    let mut lat = Latencies::new();
    let mut pending = VecDeque::new();
    let iters = p.iters;
    let start;
    match p.kind {
        Kind::Lat => {
            start = Instant::now();
            for i in 0..iters {
                let t0 = Instant::now();
                match p.op {
                    Op::Send => {
                        side.qp
                            .post_send(SendRequest::send(SEND_WRID, &[side.mr.slice(0..size)?]))?;
                        wait_for(side, RECV_WRID, &mut pending)?;
                        let rtt = t0.elapsed();
                        if i + u64::from(p.recv_depth()) < iters {
                            post_recv(side, size)?;
                        }
                        lat.record(rtt / 2);
                    }
                    Op::Write => {
                        let mark = write_mark(i);
                        side.mr.write_at(2 * size - 1, &[mark])?;
                        side.qp.post_send(SendRequest::write(
                            SEND_WRID,
                            &[side.mr.slice(size..2 * size)?],
                            peer,
                        ))?;
                        wait_byte(side, size - 1, mark)?;
                        lat.record(t0.elapsed() / 2);
                    }
                    Op::Read => {
                        side.qp.post_send(SendRequest::read(
                            SEND_WRID,
                            &[side.mr.slice(0..size)?],
                            peer,
                        ))?;
                        wait_for(side, SEND_WRID, &mut pending)?;
                        lat.record(t0.elapsed());
                    }
                    Op::Atomic => {
                        side.qp.post_send(SendRequest::fetch_add(
                            SEND_WRID,
                            side.mr.slice(0..8)?,
                            peer,
                            1,
                        ))?;
                        wait_for(side, SEND_WRID, &mut pending)?;
                        lat.record(t0.elapsed());
                    }
                }
                progress.tick(size, i + 1, iters);
            }
            // Send completions of the ping-pongs may still be queued: take them.
            let mut wcs = [WorkCompletion::default(); 64];
            while side.try_poll(&mut wcs)? > 0 {}
        }
        Kind::Bw => {
            let window = u64::from(p.tx_depth);
            let mut posted_at: VecDeque<Instant> = VecDeque::with_capacity(p.tx_depth as usize);
            let mut wcs = [WorkCompletion::default(); 64];
            let (mut posted, mut completed) = (0u64, 0u64);
            start = Instant::now();
            while completed < iters {
                while posted < iters && posted - completed < window {
                    let wr = match p.op {
                        Op::Send => SendRequest::send(posted, &[side.mr.slice(0..size)?]),
                        Op::Write => SendRequest::write(posted, &[side.mr.slice(0..size)?], peer),
                        Op::Read => SendRequest::read(posted, &[side.mr.slice(0..size)?], peer),
                        Op::Atomic => SendRequest::fetch_add(posted, side.mr.slice(0..8)?, peer, 1),
                    };
                    side.qp.post_send(wr)?;
                    posted_at.push_back(Instant::now());
                    posted += 1;
                }
                let n = side.wait(&mut wcs)?;
                let now = Instant::now();
                for _ in &wcs[..n] {
                    // RC completes in order: the oldest outstanding request.
                    if let Some(at) = posted_at.pop_front() {
                        lat.record(now - at);
                    }
                    completed += 1;
                }
                progress.tick(size, completed, iters);
            }
        }
    }
    let elapsed = start.elapsed();
    progress.clear();
    Ok((lat, elapsed))
}

/// The server's part of one size (after `Ready`): answers send and write ping-pongs,
/// receives the sends of a bandwidth run; reads, writes and atomics need nothing from it.
fn server_size(
    side: &Side,
    peer: RemoteAddr,
    p: &Params,
    size: usize,
    preposted: u64,
) -> Result<(), Error> {
    let mut wcs = [WorkCompletion::default(); 64];
    match (p.op, p.kind) {
        (Op::Send, kind) => {
            let (mut received, mut posted) = (0u64, preposted);
            while received < p.iters {
                let n = side.wait(&mut wcs)?;
                for wc in &wcs[..n] {
                    if wc.wr_id() != RECV_WRID {
                        continue;
                    }
                    received += 1;
                    if posted < p.iters {
                        post_recv(side, size)?;
                        posted += 1;
                    }
                    if kind == Kind::Lat {
                        side.qp
                            .post_send(SendRequest::send(SEND_WRID, &[side.mr.slice(0..size)?]))?;
                    }
                }
            }
        }
        (Op::Write, Kind::Lat) => {
            for i in 0..p.iters {
                let mark = write_mark(i);
                wait_byte(side, size - 1, mark)?;
                side.mr.write_at(2 * size - 1, &[mark])?;
                side.qp.post_send(SendRequest::write(
                    SEND_WRID,
                    &[side.mr.slice(size..2 * size)?],
                    peer,
                ))?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn connect(
    side: &Side,
    control: &mut Control,
    mine: Hello,
    client: bool,
) -> Result<(RemoteInfo, RemoteAddr), Error> {
    let psn: RemoteInfo = mine.qp.parse()?;
    let peer: Hello = if client {
        let peer = control.recv()?;
        control.send(&mine)?;
        peer
    } else {
        control.send(&mine)?;
        control.recv()?
    };
    let info: RemoteInfo = peer.qp.parse()?;
    let addr: RemoteAddr = peer.mr.parse()?;
    side.connect(info, psn.psn)?;
    Ok((info, addr))
}

/// The client: sends the parameters, connects, runs every size; returns the results.
fn client(ctx: &Context, control: &mut Control, p: &Params) -> Result<Vec<SizeResult>, Error> {
    control.send(p)?;
    let side = Side::new(ctx, 2 * p.max_size(), p.send_depth(), p.recv_depth(), false)?;
    let (_, peer) = connect(
        &side,
        control,
        side.hello(conn::random_psn(), Mtu::Mtu4096),
        true,
    )?;
    let mut progress = Progress::new();
    let mut results = Vec::new();
    for &size in &p.sizes {
        // Receives for the pongs, and a clean landing area for the peer's writes.
        if p.op == Op::Send && p.kind == Kind::Lat {
            for _ in 0..u64::from(p.recv_depth()).min(p.iters) {
                post_recv(&side, size)?;
            }
        }
        side.mr.fill(0..size, 0)?;
        control.send(&Msg::Go(size))?;
        match control.recv()? {
            Msg::Ready => {}
            other => return Err(format!("unexpected {other:?} from the server").into()),
        }
        let (lat, elapsed) = client_size(&side, peer, p, size, &mut progress)?;
        control.send(&Msg::Done)?;
        match control.recv()? {
            Msg::Done => {}
            other => return Err(format!("unexpected {other:?} from the server").into()),
        }
        let secs = elapsed.as_secs_f64();
        let bw = p.kind == Kind::Bw;
        results.push(SizeResult {
            bytes: size,
            iterations: p.iters,
            t_min_usec: lat.quantile_us(0.0),
            t_median_usec: lat.quantile_us(0.5),
            t_p99_usec: lat.quantile_us(0.99),
            t_p99_9_usec: lat.quantile_us(0.999),
            t_max_usec: lat.quantile_us(1.0),
            t_avg_usec: lat.mean_us(),
            t_stdev_usec: lat.stdev_us(),
            elapsed_sec: secs,
            bw_gbit_per_sec: bw.then(|| (p.iters as f64 * size as f64 * 8.0) / secs / 1e9),
            msg_rate_mpps: bw.then(|| p.iters as f64 / secs / 1e6),
            curve: crate::plot::percentile_curve(&lat),
        });
    }
    control.send(&Msg::Finish)?;
    Ok(results)
}

/// The server: takes the parameters, connects, serves every size the client asks for.
fn server(ctx: &Context, control: &mut Control) -> Result<Params, Error> {
    let p: Params = control.recv()?;
    let side = Side::new(ctx, 2 * p.max_size(), p.send_depth(), p.recv_depth(), false)?;
    let (_, peer) = connect(
        &side,
        control,
        side.hello(conn::random_psn(), Mtu::Mtu4096),
        false,
    )?;
    loop {
        match control.recv()? {
            Msg::Go(size) if size >= 1 && size <= p.max_size() => {
                let mut preposted = 0;
                if p.op == Op::Send {
                    preposted = u64::from(p.recv_depth()).min(p.iters);
                    for _ in 0..preposted {
                        post_recv(&side, size)?;
                    }
                }
                side.mr.fill(0..size, 0)?;
                control.send(&Msg::Ready)?;
                server_size(&side, peer, &p, size, preposted)?;
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

fn print_header(p: &Params, network: &str) {
    let rule = "-".repeat(95);
    println!("{rule}");
    println!("{:>50}", p.title());
    println!(" Connection type : RC          Network : {network}");
    println!(" Iterations      : {}", p.iters);
    if p.kind == Kind::Bw {
        println!(" TX depth        : {}", p.tx_depth);
    }
    println!(" Mtu             : 4096[B]");
    if p.kind == Kind::Lat {
        println!(
            " Latency         : {}",
            if p.halves_round_trip() {
                "one-way (round trip / 2), as perftest"
            } else {
                "round trip, post to completion"
            }
        );
    } else {
        println!(" t_* columns     : post-to-completion time of each work request");
    }
    println!("{rule}");
    match p.kind {
        Kind::Lat => println!(
            " {:>8} {:>12} {:>12} {:>14} {:>12} {:>14} {:>12} {:>12} {:>14}",
            "#bytes",
            "#iterations",
            "t_min[usec]",
            "t_median[usec]",
            "t_p99[usec]",
            "t_p99.9[usec]",
            "t_max[usec]",
            "t_avg[usec]",
            "t_stdev[usec]"
        ),
        Kind::Bw => println!(
            " {:>8} {:>12} {:>18} {:>14} {:>14} {:>12} {:>14} {:>12}",
            "#bytes",
            "#iterations",
            "BW average[Gb/s]",
            "MsgRate[Mpps]",
            "t_median[usec]",
            "t_p99[usec]",
            "t_p99.9[usec]",
            "t_max[usec]"
        ),
    }
}

fn print_row(p: &Params, r: &SizeResult) {
    match p.kind {
        Kind::Lat => println!(
            " {:>8} {:>12} {:>12.2} {:>14.2} {:>12.2} {:>14.2} {:>12.2} {:>12.2} {:>14.2}",
            r.bytes,
            r.iterations,
            r.t_min_usec,
            r.t_median_usec,
            r.t_p99_usec,
            r.t_p99_9_usec,
            r.t_max_usec,
            r.t_avg_usec,
            r.t_stdev_usec
        ),
        Kind::Bw => println!(
            " {:>8} {:>12} {:>18.3} {:>14.4} {:>14.2} {:>12.2} {:>14.2} {:>12.2}",
            r.bytes,
            r.iterations,
            r.bw_gbit_per_sec.unwrap_or(0.0),
            r.msg_rate_mpps.unwrap_or(0.0),
            r.t_median_usec,
            r.t_p99_usec,
            r.t_p99_9_usec,
            r.t_max_usec
        ),
    }
}

fn print_results(
    args: &PerfArgs,
    p: &Params,
    network: &str,
    results: &[SizeResult],
    counters: RunCounters,
) -> Result<(), Error> {
    if args.json {
        let report = Report {
            test: p.title(),
            op: p.op,
            kind: p.kind,
            network,
            mtu: 4096,
            tx_depth: p.tx_depth,
            latency: if p.kind == Kind::Bw {
                "post to completion"
            } else if p.halves_round_trip() {
                "one-way (round trip / 2)"
            } else {
                "round trip"
            },
            results,
            client_counters: counters,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for r in results {
            print_row(p, r);
        }
        println!("{}", "-".repeat(95));
        let c = counters;
        println!(
            " client device: {} packets sent, {} received, {} retransmitted ({} go-back-N \
             restarts, {} ACK timeouts), {} NAKs and {} RNR NAKs received, {} duplicates, \
             {} dropped",
            c.packets_sent,
            c.packets_received,
            c.retransmitted_packets,
            c.go_back_n_restarts,
            c.ack_timeouts,
            c.naks_received,
            c.rnr_naks_received,
            c.duplicates_received,
            c.packets_dropped
        );
    }
    if let Some(path) = &args.plot {
        let sizes = results.iter().map(|r| crate::plot::PerfSize {
            bytes: r.bytes,
            curve: &r.curve,
            gbit_per_sec: r.bw_gbit_per_sec,
        });
        crate::plot::perf(path, &p.title(), &sizes.collect::<Vec<_>>())?;
    }
    Ok(())
}

/// Runs `softverbs perf`.
pub fn run(args: &PerfArgs) -> Result<(), Error> {
    let (ctx, server_ctx) = args.net.open()?;
    match args.net.mode() {
        Mode::Server => {
            let (listener, port) = args.net.listen(false)?;
            println!("waiting for a client on TCP port {port}");
            std::io::stdout().flush()?;
            let (stream, peer) = listener.accept()?;
            let mut control = Control::new(stream)?;
            let p = server(&ctx, &mut control)?;
            println!(
                "served {} for {peer}: {} size(s), {} iterations each",
                p.title(),
                p.sizes.len(),
                p.iters
            );
        }
        Mode::Client(host) => {
            let p = Params::from_args(args)?;
            let network = format!("UDP, {} -> server {host}", ctx.device().address());
            let mut control = Control::new(conn::connect_tcp(&host, args.net.tcp_port)?)?;
            if !args.json {
                print_header(&p, &network);
            }
            let results = client(&ctx, &mut control, &p)?;
            print_results(args, &p, &network, &results, RunCounters::of(&ctx))?;
        }
        Mode::Loopback | Mode::InProcess => {
            let p = Params::from_args(args)?;
            let server_ctx = server_ctx.ok_or("no server device")?;
            let network = match args.net.mode() {
                Mode::InProcess => "in-process (one process, no socket)".to_owned(),
                _ => format!(
                    "UDP loopback, {} <-> {} (one process)",
                    ctx.device().address(),
                    server_ctx.device().address()
                ),
            };
            if !args.json {
                print_header(&p, &network);
            }
            let (listener, port) = args.net.listen(true)?;
            let results = std::thread::scope(|s| -> Result<_, Error> {
                let served = s.spawn(|| -> Result<(), String> {
                    let (stream, _) = listener.accept().map_err(|e| e.to_string())?;
                    let mut control = Control::new(stream).map_err(|e| e.to_string())?;
                    server(&server_ctx, &mut control)
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                });
                let mut control = Control::new(conn::connect_tcp("127.0.0.1", port)?)?;
                let results = client(&ctx, &mut control, &p);
                drop(control);
                let served = served.join().map_err(|_| "the server side panicked")?;
                let results = results?;
                served.map_err(|e| format!("server side: {e}"))?;
                Ok(results)
            })?;
            print_results(args, &p, &network, &results, RunCounters::of(&ctx))?;
        }
    }
    Ok(())
}
