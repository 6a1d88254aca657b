//! RC ping-pong, like rdma-core's `ibv_rc_pingpong`.
//!
//! ```text
//! cargo run -p softverbs --example rc_pingpong                    # both sides in this process
//! cargo run -p softverbs --example rc_pingpong -- --server        # UDP device, waits on TCP 18515
//! cargo run -p softverbs --example rc_pingpong -- --client HOST   # UDP device, connects to HOST
//! ```
//!
//! Options: `-n ITERS` (default 1000), `-s SIZE` (default 8), `-p TCP_PORT` (18515).
//! The server and client pick their device address as `Context::open` does
//! (`SOFTVERBS_ADDR`, else the first free 127.0.0.x), and exchange their `RemoteInfo`
//! and nothing else over TCP, as `ibv_rc_pingpong` does.

use softverbs::*;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Options {
    mode: Mode,
    iters: u64,
    size: usize,
    port: u16,
}

enum Mode {
    Loopback,
    Server,
    Client(String),
}

fn options() -> Result<Options, Error> {
    let mut opts = Options {
        mode: Mode::Loopback,
        iters: 1000,
        size: 8,
        port: 18515,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--server" => opts.mode = Mode::Server,
            "--client" => opts.mode = Mode::Client(value()?),
            "-n" => opts.iters = value()?.parse()?,
            "-s" => opts.size = value()?.parse()?,
            "-p" => opts.port = value()?.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    Ok(opts)
}

/// One side: a CQ, a QP and a buffer of `size` bytes.
struct Side {
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn side(ctx: &Context, size: usize) -> Result<Side, Error> {
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16)?;
    let qp = pd
        .qp_builder(QpType::Rc, &cq, &cq)
        .sq_sig_all(true)
        .build()?;
    let mr = pd.reg_mr(size.max(1), AccessFlags::LOCAL_WRITE)?;
    qp.to_init(AccessFlags::empty())?;
    Ok(Side { cq, qp, mr })
}

fn connect(side: &Side, my_psn: u32, peer: RemoteInfo) -> Result<(), Error> {
    side.qp.to_rtr(peer)?;
    side.qp.to_rts(RtsAttr::new(my_psn))?;
    Ok(())
}

fn wait_one(cq: &Cq) -> Result<WorkCompletion, Error> {
    let mut wc = [WorkCompletion::default()];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if cq.poll(&mut wc)? == 1 {
            return match wc[0].result() {
                Ok(_) => Ok(wc[0]),
                Err(failed) => Err(format!("completion failed: {failed:?}").into()),
            };
        }
        if Instant::now() > deadline {
            return Err("timed out waiting for a completion".into());
        }
    }
}

/// Receives kept posted ahead, as `ibv_rc_pingpong`'s `rx_depth`, so a ping never meets
/// an empty receive queue (which would cost an RNR NAK and a retry).
const RX_DEPTH: u64 = 16;

/// The ping-pong loop: the client sends first, each side sends when it receives; each
/// receive is re-posted as soon as it completes. Returns the elapsed time.
fn pingpong(side: &Side, client: bool, iters: u64, size: usize) -> Result<Duration, Error> {
    const SEND: u64 = u64::MAX;
    let recv = || -> Result<(), Error> {
        side.qp
            .post_recv(RecvRequest::new(0, &[side.mr.slice(..)?]))?;
        Ok(())
    };
    let send = || -> Result<(), Error> {
        side.qp
            .post_send(SendRequest::send(SEND, &[side.mr.slice(0..size)?]))?;
        Ok(())
    };
    for _ in 0..RX_DEPTH {
        recv()?;
    }
    let start = Instant::now();
    if client {
        send()?;
    }
    // A send completion and the next receive may come in either order: count both.
    let (mut received, mut sent) = (0, 0);
    while received < iters || sent < iters {
        let wc = wait_one(&side.cq)?;
        if wc.wr_id() == SEND {
            sent += 1;
            continue;
        }
        received += 1;
        recv()?;
        // The server answers every ping; the client pings again after each pong.
        if !client || received < iters {
            send()?;
        }
    }
    Ok(start.elapsed())
}

fn report(elapsed: Duration, iters: u64, size: usize) {
    let rtt = elapsed.as_secs_f64() / iters as f64;
    println!(
        "{iters} iterations of {size} bytes in {:.3} s: {:.2} us round trip, {:.2} Mbit/s",
        elapsed.as_secs_f64(),
        rtt * 1e6,
        (2 * iters as usize * size * 8) as f64 / elapsed.as_secs_f64() / 1e6
    );
}

/// Sends our line and reads the peer's, through one reader kept for the whole
/// connection (a fresh reader per exchange could swallow a line the peer sent early).
fn exchange(
    stream: &mut TcpStream,
    reader: &mut BufReader<TcpStream>,
    mine: RemoteInfo,
) -> Result<RemoteInfo, Error> {
    writeln!(stream, "{mine}")?;
    let mut line = String::new();
    reader.read_line(&mut line)?;
    Ok(line.parse()?)
}

fn main() -> Result<(), Error> {
    let opts = options()?;
    let psn = 0x1234;
    match &opts.mode {
        Mode::Loopback => {
            let (ctx_a, ctx_b) = (
                Context::open_with(DeviceConfig::in_process())?,
                Context::open_with(DeviceConfig::in_process())?,
            );
            let (a, b) = (side(&ctx_a, opts.size)?, side(&ctx_b, opts.size)?);
            connect(&a, psn, b.qp.local_info(psn))?;
            connect(&b, psn, a.qp.local_info(psn))?;
            println!(
                "local  {}\nremote {}",
                a.qp.local_info(psn),
                b.qp.local_info(psn)
            );
            let elapsed = std::thread::scope(|s| {
                let server = s.spawn(|| pingpong(&b, false, opts.iters, opts.size));
                let elapsed = pingpong(&a, true, opts.iters, opts.size);
                server.join().expect("server thread")?;
                elapsed
            })?;
            report(elapsed, opts.iters, opts.size);
        }
        Mode::Server | Mode::Client(_) => {
            let ctx = Context::open()?;
            let me = side(&ctx, opts.size)?;
            let mine = me.qp.local_info(psn);
            let (mut stream, client) = match &opts.mode {
                Mode::Client(host) => (TcpStream::connect((host.as_str(), opts.port))?, true),
                _ => {
                    let listener = TcpListener::bind(("0.0.0.0", opts.port))?;
                    println!("waiting for a client on TCP port {}", opts.port);
                    (listener.accept()?.0, false)
                }
            };
            let mut reader = BufReader::new(stream.try_clone()?);
            let peer = exchange(&mut stream, &mut reader, mine)?;
            println!("local  {mine}\nremote {peer}");
            connect(&me, psn, peer)?;
            // Both sides ready before the first send (ibv_rc_pingpong's second exchange).
            exchange(&mut stream, &mut reader, mine)?;
            let elapsed = pingpong(&me, client, opts.iters, opts.size)?;
            report(elapsed, opts.iters, opts.size);
        }
    }
    Ok(())
}
