//! `softverbs pingpong`: RC send/receive ping-pong like rdma-core's `ibv_rc_pingpong`,
//! with its TCP exchange (message format and order of rdma-core's `pingpong.c`, meant to
//! let either side be the real `ibv_rc_pingpong` on the drop-in library), its options and
//! its closing lines, plus the round-trip latency distribution.

use crate::conn::{self, DeviceCounters, Mode, NetArgs, Side};
use crate::output::{self, outln};
use crate::stats::Latencies;
use crate::Error;
use softverbs::*;
use std::io::{Read, Write};
use std::net::{Ipv6Addr, TcpStream};
use std::time::{Duration, Instant};

/// Options of `softverbs pingpong`.
#[derive(clap::Args, Clone, Debug)]
pub struct PingpongArgs {
    /// Size of each message in bytes.
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    pub size: usize,

    /// Number of round trips.
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    pub iters: u64,

    /// Number of receives kept posted.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    pub rx_depth: u32,

    /// Path MTU in bytes (256, 512, 1024, 2048 or 4096).
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    pub mtu: u32,

    /// Sleep on CQ events (completion channel, re-armed each time) instead of busy polling.
    #[arg(short = 'e', long = "events")]
    pub events: bool,

    /// Where the two sides run.
    #[command(flatten)]
    pub net: NetArgs,
}

/// `ibv_rc_pingpong`'s exchange message: `LID:QPN:PSN:GID` in hexadecimal, NUL-terminated.
const MSG_LEN: usize = "0000:000000:000000:00000000000000000000000000000000".len() + 1;

fn wire_message(info: &RemoteInfo) -> [u8; MSG_LEN] {
    let mut text = format!("{:04x}:{:06x}:{:06x}:", 0, info.qpn, info.psn);
    for byte in info.gid.0 {
        text.push_str(&format!("{byte:02x}"));
    }
    let mut msg = [0u8; MSG_LEN];
    msg[..text.len()].copy_from_slice(text.as_bytes());
    msg
}

fn parse_wire_message(msg: &[u8], mtu: Mtu) -> Result<RemoteInfo, Error> {
    let text = std::str::from_utf8(msg)?.trim_end_matches('\0');
    let bad = || format!("bad QP information from the peer: {text:?}");
    let mut parts = text.split(':');
    let mut field = |len: usize| {
        parts
            .next()
            .filter(|p| p.len() == len)
            .ok_or_else(bad)
            .map(str::to_owned)
    };
    let _lid = field(4)?;
    let qpn = u32::from_str_radix(&field(6)?, 16).map_err(|_| bad())?;
    let psn = u32::from_str_radix(&field(6)?, 16).map_err(|_| bad())?;
    let gid_hex = field(32)?;
    let mut gid = [0u8; 16];
    for (i, byte) in gid.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&gid_hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(RemoteInfo {
        qpn,
        psn,
        gid: Gid(gid),
        mtu,
    })
}

fn print_address(label: &str, info: &RemoteInfo) -> Result<(), Error> {
    outln!(
        "  {label} LID 0x0000, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        info.qpn,
        info.psn,
        Ipv6Addr::from(info.gid.0)
    )?;
    Ok(())
}

/// The exchange of `ibv_rc_pingpong`'s `pp_server_exch_dest`: read the client's message,
/// connect, answer, read "done".
fn server_exchange(
    stream: &mut TcpStream,
    side: &Side,
    mine: RemoteInfo,
) -> Result<RemoteInfo, Error> {
    let mut msg = [0u8; MSG_LEN];
    stream.read_exact(&mut msg)?;
    let peer = parse_wire_message(&msg, mine.mtu)?;
    side.connect(peer, mine.psn)?;
    stream.write_all(&wire_message(&mine))?;
    let mut done = [0u8; 5];
    stream.read_exact(&mut done)?;
    Ok(peer)
}

/// The exchange of `ibv_rc_pingpong`'s `pp_client_exch_dest`: send, read the server's
/// message, send "done"; then connect.
fn client_exchange(
    stream: &mut TcpStream,
    side: &Side,
    mine: RemoteInfo,
) -> Result<RemoteInfo, Error> {
    stream.write_all(&wire_message(&mine))?;
    let mut msg = [0u8; MSG_LEN];
    stream.read_exact(&mut msg)?;
    let peer = parse_wire_message(&msg, mine.mtu)?;
    stream.write_all(b"done\0")?;
    side.connect(peer, mine.psn)?;
    Ok(peer)
}

const SEND_WRID: u64 = u64::MAX;

/// The ping-pong loop. The client sends first and times each round trip; each side
/// answers each receive and re-posts it at once.
fn run_loop(
    side: &Side,
    client: bool,
    args: &PingpongArgs,
    rx_posted: u64,
) -> Result<(Duration, Latencies), Error> {
    let size = args.size;
    let recv = || -> Result<(), Error> {
        side.qp
            .post_recv(RecvRequest::new(0, &[side.mr.slice(0..size.max(1))?]))?;
        Ok(())
    };
    let send = || -> Result<(), Error> {
        side.qp
            .post_send(SendRequest::send(SEND_WRID, &[side.mr.slice(0..size)?]))?;
        Ok(())
    };
    let mut latencies = Latencies::new();
    let mut wcs = [WorkCompletion::default(); 16];
    let start = Instant::now();
    let mut ping_sent = start;
    if client {
        send()?;
    }
    let (mut received, mut sent, mut posted) = (0u64, 0u64, rx_posted);
    while received < args.iters || sent < args.iters {
        let n = side.wait(&mut wcs)?;
        for wc in &wcs[..n] {
            if wc.wr_id() == SEND_WRID {
                sent += 1;
                continue;
            }
            received += 1;
            if client {
                latencies.record(ping_sent.elapsed());
            }
            if posted < args.iters {
                recv()?;
                posted += 1;
            }
            if !client || received < args.iters {
                ping_sent = Instant::now();
                send()?;
            }
        }
    }
    Ok((start.elapsed(), latencies))
}

fn report(elapsed: Duration, args: &PingpongArgs, latencies: &Latencies) -> Result<(), Error> {
    let usec = elapsed.as_secs_f64() * 1e6;
    let bytes = args.size as u64 * args.iters * 2;
    outln!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    )?;
    outln!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        args.iters,
        usec / 1e6,
        usec / args.iters as f64
    )?;
    if !latencies.is_empty() {
        outln!(
            "round trip: min {:.2} usec, median {:.2} usec, p99 {:.2} usec, max {:.2} usec ({} samples)",
            latencies.quantile_us(0.0),
            latencies.quantile_us(0.5),
            latencies.quantile_us(0.99),
            latencies.quantile_us(1.0),
            latencies.len()
        )?;
    }
    Ok(())
}

/// One side from the device to the result: builds it, posts the receives, exchanges,
/// runs.
fn side_run(
    ctx: &Context,
    args: &PingpongArgs,
    mut stream: TcpStream,
    client: bool,
    verbose: bool,
) -> Result<(Duration, Latencies), Error> {
    let mtu = conn::mtu_from_bytes(args.mtu)?;
    // The exchange is a few bytes each way: a peer silent for this long is gone.
    stream.set_read_timeout(Some(conn::PATIENCE))?;
    let side = Side::new(ctx, args.size, 16, args.rx_depth, 0, args.events)?;
    let rx_posted = u64::from(args.rx_depth).min(args.iters.max(1));
    for _ in 0..rx_posted {
        side.qp
            .post_recv(RecvRequest::new(0, &[side.mr.slice(0..args.size.max(1))?]))?;
    }
    let mut mine = side.qp.local_info(conn::random_psn());
    mine.mtu = mine.mtu.min(mtu);
    let peer = if client {
        client_exchange(&mut stream, &side, mine)?
    } else {
        server_exchange(&mut stream, &side, mine)?
    };
    if verbose {
        print_address("local address: ", &mine)?;
        print_address("remote address:", &peer)?;
    }
    let result = run_loop(&side, client, args, rx_posted)?;
    close_exchange(&mut stream);
    Ok(result)
}

/// How long a side waits for its peer's closing word.
const CLOSE_WAIT: Duration = Duration::from_secs(30);

/// Keeps this side's QP until the peer has its last completion too: the last ACK of
/// either side may be lost, and only a live QP answers the retransmission (a QP closed
/// early leaves the peer retrying until RETRY_EXC_ERR, IBTA 9.7.5.1). Each side says
/// "fin" once its own completions are in and waits for the peer's. `ibv_rc_pingpong` does
/// not do this (it closes its socket after the set-up exchange), so an error or an end of
/// stream here is not a failure: the run itself has succeeded.
fn close_exchange(stream: &mut TcpStream) {
    if stream.write_all(b"fin\0").is_err() || stream.set_read_timeout(Some(CLOSE_WAIT)).is_err() {
        return;
    }
    let mut word = [0u8; 4];
    let _ = stream.read_exact(&mut word);
}

/// Runs `softverbs pingpong`.
pub fn run(args: &PingpongArgs) -> Result<(), Error> {
    if args.iters == 0 {
        return Err("-n must be at least 1".into());
    }
    let (ctx, server_ctx) = args.net.open()?;
    match args.net.mode() {
        Mode::Server => {
            let (listener, port) = args.net.listen(false)?;
            outln!("waiting for a client on TCP port {port}")?;
            output::flush()?;
            let (stream, _) = listener.accept()?;
            let (elapsed, latencies) = side_run(&ctx, args, stream, false, true)?;
            report(elapsed, args, &latencies)?;
            outln!("device: {}", DeviceCounters::of(&ctx))?;
        }
        Mode::Client(host) => {
            let stream = conn::connect_tcp(
                &host,
                args.net.tcp_port,
                args.net.timeout,
                "softverbs pingpong --server",
            )?;
            let (elapsed, latencies) = side_run(&ctx, args, stream, true, true)?;
            report(elapsed, args, &latencies)?;
            outln!("device: {}", DeviceCounters::of(&ctx))?;
        }
        Mode::Loopback | Mode::InProcess => {
            let server_ctx = server_ctx.ok_or("no server device")?;
            let (listener, port) = args.net.listen(true)?;
            let network = match args.net.mode() {
                Mode::InProcess => "in-process".to_owned(),
                _ => format!(
                    "UDP loopback, {} <-> {}",
                    ctx.device().address(),
                    server_ctx.device().address()
                ),
            };
            outln!(
                "softverbs pingpong: both sides in this process ({network}), {} bytes x {} iters{}",
                args.size,
                args.iters,
                if args.events {
                    ", completion events"
                } else {
                    ""
                }
            )?;
            // The server side runs on a thread of its own that is not waited for when the
            // client side fails (a closed stdout, say): the error ends the process at once
            // instead of after the server's wait for a peer that is gone.
            let server = {
                let (server_ctx, args) = (server_ctx.clone(), args.clone());
                std::thread::spawn(move || -> Result<(), String> {
                    let (stream, _) = listener.accept().map_err(|e| e.to_string())?;
                    side_run(&server_ctx, &args, stream, false, false)
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                })
            };
            let stream = conn::connect_tcp("127.0.0.1", port, conn::PATIENCE, "")?;
            let (elapsed, latencies) = side_run(&ctx, args, stream, true, true)?;
            let served = server.join().map_err(|_| "the server side panicked")?;
            served.map_err(|e| format!("server side: {e}"))?;
            report(elapsed, args, &latencies)?;
            outln!("client device: {}", DeviceCounters::of(&ctx))?;
            outln!("server device: {}", DeviceCounters::of(&server_ctx))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exchange_message_is_ibv_rc_pingpongs() {
        let info = RemoteInfo {
            qpn: 0x11,
            psn: 0xabcdef,
            gid: Gid::from_ip("127.0.0.2".parse().unwrap()),
            mtu: Mtu::Mtu1024,
        };
        let msg = wire_message(&info);
        assert_eq!(
            std::str::from_utf8(&msg[..MSG_LEN - 1]).unwrap(),
            "0000:000011:abcdef:00000000000000000000ffff7f000002"
        );
        assert_eq!(msg[MSG_LEN - 1], 0);
        assert_eq!(parse_wire_message(&msg, Mtu::Mtu1024).unwrap(), info);
        assert!(parse_wire_message(b"0000:11:22:33", Mtu::Mtu1024).is_err());
    }
}
