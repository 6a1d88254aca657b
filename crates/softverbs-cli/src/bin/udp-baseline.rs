//! `udp-baseline`: the bare baselines `scripts/bench-device.sh` sets beside softverbs.
//!
//! ```text
//! udp-baseline pingpong-server --bind ADDR:PORT
//! udp-baseline pingpong-client --connect ADDR:PORT [-s 8] [-n 100000]
//! udp-baseline stream-server --bind ADDR:PORT
//! udp-baseline stream-client --connect ADDR:PORT [-s 65507] [--secs 1]
//! udp-baseline memcpy [-s 65536] [--secs 0.3]
//! udp-baseline --test-link ...   (any of the above between two network namespaces)
//! ```
//!
//! - `pingpong-*`: two processes bounce the same `-s` bytes over UDP, both sides
//!   busy-polling a non-blocking socket (no sleep, no wake-up), as sockperf's busy-poll
//!   mode does. The client prints the round-trip distribution as JSON.
//! - `stream-*`: the client sends datagrams of `-s` bytes as fast as it can for `--secs`
//!   seconds; the server receives them and prints the goodput (bytes received from the
//!   first datagram to the last) as JSON. Datagrams the kernel drops do not count.
//! - `memcpy`: copies `-s` bytes from one buffer into another over and over, as the
//!   in-process device copies a write from the local into the remote region, and prints
//!   the bandwidth as JSON.
//!
//! Addresses must be loopback ones (127.0.0.0/8 or ::1): this is a benchmark for one host,
//! and the stream floods whatever link it crosses. `--test-link` lifts that for a link the
//! caller made for the test and owns both ends of (two network namespaces joined by a veth
//! pair, as `scripts/bench-device.sh` makes for its two-host rows); the servers then
//! answer datagrams from any address.

use clap::{Parser, Subcommand};
use serde_json::json;
use std::io::ErrorKind;
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::process::ExitCode;
use std::time::{Duration, Instant};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Bare UDP ping-pong, UDP throughput and memcpy baselines (JSON on stdout).
#[derive(Parser, Debug)]
#[command(
    name = "udp-baseline",
    about = "Baselines for scripts/bench-device.sh: bare UDP ping-pong and stream between two processes on loopback (or a test link), and memcpy",
    long_about = None
)]
struct Cli {
    /// Allow addresses that are not loopback ones: only for a link made for the test, whose
    /// both ends are yours (network namespaces joined by a veth pair).
    #[arg(long, global = true)]
    test_link: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Echo every datagram back to its sender, busy-polling, until the client says stop.
    PingpongServer {
        /// Loopback address (or, with --test-link, the link's) and port to bind.
        #[arg(long)]
        bind: String,
        /// Give up after this many seconds without a datagram.
        #[arg(long, default_value_t = 30.0)]
        idle_secs: f64,
    },
    /// Ping-pong with the server and print the round-trip times as JSON.
    PingpongClient {
        /// The server's loopback address (or, with --test-link, its address on the link)
        /// and port.
        #[arg(long)]
        connect: String,
        /// Datagram size in bytes.
        #[arg(short = 's', long, default_value_t = 8)]
        size: usize,
        /// Timed iterations.
        #[arg(short = 'n', long, default_value_t = 100_000)]
        iters: usize,
        /// Untimed iterations first.
        #[arg(short = 'w', long, default_value_t = 2_000)]
        warmup: usize,
    },
    /// Receive a stream of datagrams and print the goodput as JSON.
    StreamServer {
        /// Loopback address (or, with --test-link, the link's) and port to bind.
        #[arg(long)]
        bind: String,
        /// Give up after this many seconds without the first datagram.
        #[arg(long, default_value_t = 30.0)]
        idle_secs: f64,
    },
    /// Send datagrams to the server as fast as possible.
    StreamClient {
        /// The server's loopback address (or, with --test-link, its address on the link)
        /// and port.
        #[arg(long)]
        connect: String,
        /// Datagram size in bytes (at most 65507 over IPv4).
        #[arg(short = 's', long, default_value_t = 65507)]
        size: usize,
        /// Seconds to send for.
        #[arg(long, default_value_t = 1.0)]
        secs: f64,
    },
    /// Copy -s bytes between two buffers repeatedly and print the bandwidth as JSON.
    Memcpy {
        /// Bytes per copy.
        #[arg(short = 's', long, default_value_t = 65536)]
        size: usize,
        /// Seconds to copy for.
        #[arg(long, default_value_t = 0.3)]
        secs: f64,
    },
}

/// The first byte of a datagram that ends the exchange.
const STOP: u8 = 0xff;
/// The first byte of an ordinary datagram.
const DATA: u8 = 0x01;

/// Which addresses the benchmark may talk to: loopback ones, or (`--test-link`) any.
#[derive(Clone, Copy, Debug)]
enum Reach {
    Loopback,
    TestLink,
}

impl Reach {
    /// Whether a datagram from `ip` is one of ours.
    fn allows(self, ip: std::net::IpAddr) -> bool {
        matches!(self, Reach::TestLink) || ip.is_loopback()
    }

    /// `addr` resolved, if it is an address this benchmark may use.
    fn resolve(self, addr: &str) -> Result<SocketAddr, Error> {
        let sa = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| format!("{addr}: no address"))?;
        if !self.allows(sa.ip()) {
            return Err(format!(
                "{addr}: only loopback addresses (127.0.0.0/8, ::1) are allowed, unless \
                 --test-link says it is a link made for the test"
            )
            .into());
        }
        Ok(sa)
    }
}

/// Socket buffers as large as the softverbs device asks for its own (8 MiB receive,
/// 4 MiB send): the `FORCE` options pass `net.core.[rw]mem_max` as root; otherwise the
/// plain ones get what the cap allows.
fn big_buffers(sock: &UdpSocket) {
    use rustix::net::sockopt;
    if sockopt::set_socket_recv_buffer_size_force(sock, 8 << 20).is_err() {
        let _ = sockopt::set_socket_recv_buffer_size(sock, 8 << 20);
    }
    if sockopt::set_socket_send_buffer_size_force(sock, 4 << 20).is_err() {
        let _ = sockopt::set_socket_send_buffer_size(sock, 4 << 20);
    }
}

/// The client's local address for talking to `peer`, any port: on loopback the peer's own
/// address (every 127.x.y.z is local); across a test link the unspecified address of its
/// family, for which the kernel picks the link's own address from the route.
fn any_port_like(peer: SocketAddr) -> SocketAddr {
    let mut local = peer;
    local.set_port(0);
    if !peer.ip().is_loopback() {
        local.set_ip(match peer {
            SocketAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
        });
    }
    local
}

/// Receives one datagram, spinning on a non-blocking socket; `None` after `idle`.
fn spin_recv(
    sock: &UdpSocket,
    buf: &mut [u8],
    idle: Duration,
) -> Result<Option<(usize, SocketAddr)>, Error> {
    let mut spins = 0u32;
    let mut since: Option<Instant> = None;
    loop {
        match sock.recv_from(buf) {
            Ok(got) => return Ok(Some(got)),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                spins = spins.wrapping_add(1);
                if spins & 4095 == 0 {
                    let start = *since.get_or_insert_with(Instant::now);
                    if start.elapsed() > idle {
                        return Ok(None);
                    }
                }
                std::hint::spin_loop();
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
}

fn pingpong_server(reach: Reach, bind: &str, idle_secs: f64) -> Result<(), Error> {
    let sock = UdpSocket::bind(reach.resolve(bind)?)?;
    sock.set_nonblocking(true)?;
    let mut buf = vec![0u8; 65536];
    let idle = Duration::from_secs_f64(idle_secs);
    let mut echoed = 0u64;
    while let Some((n, from)) = spin_recv(&sock, &mut buf, idle)? {
        if !reach.allows(from.ip()) {
            continue;
        }
        if n > 0 && buf[0] == STOP {
            break;
        }
        loop {
            match sock.send_to(&buf[..n], from) {
                Ok(_) => break,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
                Err(e) => return Err(e.into()),
            }
        }
        echoed += 1;
    }
    eprintln!("udp-baseline: pingpong server echoed {echoed} datagrams");
    Ok(())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn pingpong_client(
    reach: Reach,
    connect: &str,
    size: usize,
    iters: usize,
    warmup: usize,
) -> Result<(), Error> {
    if !(1..=65507).contains(&size) {
        return Err("-s must be 1..=65507".into());
    }
    let peer = reach.resolve(connect)?;
    let sock = UdpSocket::bind(any_port_like(peer))?;
    sock.connect(peer)?;
    sock.set_nonblocking(true)?;
    let mut out = vec![0u8; size];
    out[0] = DATA;
    let mut buf = vec![0u8; 65536];
    let lost = Duration::from_millis(200);
    let mut rtts = Vec::with_capacity(iters);
    let mut retries = 0u64;
    let mut i = 0usize;
    while i < warmup + iters {
        let start = Instant::now();
        sock.send(&out)?;
        let got = loop {
            match sock.recv(&mut buf) {
                Ok(n) => break Some(n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if start.elapsed() > lost {
                        break None;
                    }
                    std::hint::spin_loop();
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        };
        let rtt = start.elapsed();
        match got {
            Some(n) if n == size => {
                if i >= warmup {
                    rtts.push(rtt.as_secs_f64() * 1e6);
                }
                i += 1;
            }
            _ => {
                retries += 1;
                if retries > 100 {
                    return Err("too many lost ping-pong datagrams".into());
                }
            }
        }
    }
    let mut stop = [0u8; 1];
    stop[0] = STOP;
    for _ in 0..5 {
        let _ = sock.send(&stop);
    }
    let sum: f64 = rtts.iter().sum();
    let avg = sum / rtts.len() as f64;
    rtts.sort_by(f64::total_cmp);
    let doc = json!({
        "test": "udp_pingpong",
        "bytes": size,
        "iterations": iters,
        "lost": retries,
        "rtt_min_usec": percentile(&rtts, 0.0),
        "rtt_median_usec": percentile(&rtts, 50.0),
        "rtt_p99_usec": percentile(&rtts, 99.0),
        "rtt_p99_9_usec": percentile(&rtts, 99.9),
        "rtt_max_usec": percentile(&rtts, 100.0),
        "rtt_avg_usec": avg,
    });
    println!("{doc}");
    Ok(())
}

fn stream_server(reach: Reach, bind: &str, idle_secs: f64) -> Result<(), Error> {
    let sock = UdpSocket::bind(reach.resolve(bind)?)?;
    big_buffers(&sock);
    sock.set_read_timeout(Some(Duration::from_secs_f64(idle_secs)))?;
    let mut buf = vec![0u8; 65536];
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    let mut bytes = 0u64;
    let mut datagrams = 0u64;
    loop {
        match sock.recv_from(&mut buf) {
            Ok((n, from)) => {
                if !reach.allows(from.ip()) {
                    continue;
                }
                if n == 1 && buf[0] == STOP {
                    break;
                }
                let now = Instant::now();
                if first.is_none() {
                    first = Some(now);
                    // Once the stream flows, a short silence means the sender is gone.
                    sock.set_read_timeout(Some(Duration::from_millis(500)))?;
                } else {
                    bytes += n as u64;
                    datagrams += 1;
                }
                last = now;
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let first = first.ok_or("no datagram received")?;
    // The first datagram starts the clock; the bytes counted are those after it.
    let secs = last.duration_since(first).as_secs_f64();
    let doc = json!({
        "test": "udp_stream",
        "bytes": bytes,
        "datagrams": datagrams,
        "elapsed_sec": secs,
        "bw_gbit_per_sec": if secs > 0.0 { bytes as f64 * 8.0 / secs / 1e9 } else { 0.0 },
    });
    println!("{doc}");
    Ok(())
}

fn stream_client(reach: Reach, connect: &str, size: usize, secs: f64) -> Result<(), Error> {
    if !(2..=65507).contains(&size) {
        return Err("-s must be 2..=65507".into());
    }
    let peer = reach.resolve(connect)?;
    let sock = UdpSocket::bind(any_port_like(peer))?;
    big_buffers(&sock);
    sock.connect(peer)?;
    let mut out = vec![0x5au8; size];
    out[0] = DATA;
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut sent = 0u64;
    let mut errors = 0u64;
    while Instant::now() < deadline {
        for _ in 0..16 {
            match sock.send(&out) {
                Ok(_) => sent += 1,
                // ECONNREFUSED from an earlier ICMP, ENOBUFS: count and go on.
                Err(_) => errors += 1,
            }
        }
    }
    std::thread::sleep(Duration::from_millis(20));
    for _ in 0..20 {
        let _ = sock.send(&[STOP]);
        std::thread::sleep(Duration::from_millis(1));
    }
    let doc = json!({
        "test": "udp_stream_sender",
        "bytes_per_datagram": size,
        "datagrams_sent": sent,
        "send_errors": errors,
        "offered_gbit_per_sec": sent as f64 * size as f64 * 8.0 / secs / 1e9,
    });
    println!("{doc}");
    Ok(())
}

fn memcpy_bw(size: usize, secs: f64) -> Result<(), Error> {
    if size == 0 {
        return Err("-s must be at least 1".into());
    }
    let src: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let mut dst = vec![0u8; size];
    // Warm both buffers (page faults, caches) before the clock starts.
    for _ in 0..4 {
        dst.copy_from_slice(&src);
    }
    let budget = Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut copies = 0u64;
    let elapsed = loop {
        for _ in 0..8 {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
        }
        copies += 8;
        let elapsed = start.elapsed();
        if elapsed >= budget {
            break elapsed;
        }
    };
    let secs = elapsed.as_secs_f64();
    let doc = json!({
        "test": "memcpy",
        "bytes": size,
        "copies": copies,
        "elapsed_sec": secs,
        "bw_gbit_per_sec": copies as f64 * size as f64 * 8.0 / secs / 1e9,
    });
    println!("{doc}");
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let reach = if cli.test_link {
        Reach::TestLink
    } else {
        Reach::Loopback
    };
    let result = match cli.command {
        Command::PingpongServer { bind, idle_secs } => pingpong_server(reach, &bind, idle_secs),
        Command::PingpongClient {
            connect,
            size,
            iters,
            warmup,
        } => pingpong_client(reach, &connect, size, iters, warmup),
        Command::StreamServer { bind, idle_secs } => stream_server(reach, &bind, idle_secs),
        Command::StreamClient {
            connect,
            size,
            secs,
        } => stream_client(reach, &connect, size, secs),
        Command::Memcpy { size, secs } => memcpy_bw(size, secs),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("udp-baseline: {error}");
            ExitCode::FAILURE
        }
    }
}
