//! One side of the verifying mixed-opcode RC workload (see the crate docs).
//!
//! ```text
//! softverbs-e2e-peer --server [--port P] [--clients K] # prints "port P", then serves K
//! softverbs-e2e-peer --client HOST --port P [-n N]    # runs N messages, verifies all
//! ```
//!
//! A server serves `--clients` clients (default 1) at once, each on a QP of its own of one
//! device, and succeeds once every one of them verified. Other options: `--window W` (work requests in flight, default 32), `--timeout-code T`
//! (local ACK timeout, 4.096 us * 2^T, default 12), `--retry-cnt R` (default 7),
//! `--deadline S` (seconds before giving up, default 600). The device address comes from
//! the environment as `Context::open` reads it (`SOFTVERBS_ADDR`, else the first free
//! 127.0.0.x). Exit status: 0 verified, 3 an error completion (then the flushed work
//! requests are counted and printed), 4 a verification failure or timeout, 2 bad usage.

use softverbs::*;
use softverbs_e2e::{op_of, pattern, size_of_message, Op, DONE_IMM};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

const SLOT: usize = 4096;
const RX_DEPTH: usize = 128;
/// Write slots on the server; message `i` writes slot `(i / 6) % WRITE_SLOTS`.
const WRITE_SLOTS: usize = 64;
const COUNTER: usize = 0;
const CAS_WORD: usize = 8;
const SLOTS_BASE: usize = SLOT;
const PSN: u32 = 0x00ab_cdef;

struct Options {
    server: bool,
    clients: usize,
    host: String,
    port: u16,
    messages: u64,
    window: usize,
    timeout_code: u8,
    retry_cnt: u8,
    deadline: Duration,
}

enum Failure {
    /// An error completion (exit 3).
    Completion(String),
    /// Wrong data, wrong order, or no progress (exit 4).
    Verify(String),
    /// Bad usage or setup (exit 2).
    Setup(String),
}

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure::Setup(e.to_string())
    }
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        server: false,
        clients: 1,
        host: String::new(),
        port: 0,
        messages: 10_000,
        window: 32,
        timeout_code: 12,
        retry_cnt: 7,
        deadline: Duration::from_secs(600),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        let parse_err = |e: std::num::ParseIntError| e.to_string();
        match arg.as_str() {
            "--server" => o.server = true,
            "--clients" => o.clients = value()?.parse().map_err(parse_err)?,
            "--client" => o.host = value()?,
            "--port" => o.port = value()?.parse().map_err(parse_err)?,
            "-n" => o.messages = value()?.parse().map_err(parse_err)?,
            "--window" => o.window = value()?.parse().map_err(parse_err)?,
            "--timeout-code" => o.timeout_code = value()?.parse().map_err(parse_err)?,
            "--retry-cnt" => o.retry_cnt = value()?.parse().map_err(parse_err)?,
            "--deadline" => o.deadline = Duration::from_secs(value()?.parse().map_err(parse_err)?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if !o.server && o.host.is_empty() {
        return Err("--server or --client HOST".into());
    }
    if o.window == 0 || o.window > 128 {
        return Err("--window must be 1..=128".into());
    }
    Ok(o)
}

fn main() -> ExitCode {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("usage: {e}");
            return ExitCode::from(2);
        }
    };
    let result = if o.server { server(&o) } else { client(&o) };
    // The reader may be gone (a test that killed or abandoned this peer): a failed write of
    // the verdict must not turn into a panic.
    let mut out = std::io::stdout();
    match result {
        Ok(summary) => {
            let _ = writeln!(out, "OK {summary}");
            ExitCode::SUCCESS
        }
        Err(Failure::Completion(e)) => {
            let _ = writeln!(out, "FAILED: {e}");
            ExitCode::from(3)
        }
        Err(Failure::Verify(e)) => {
            let _ = writeln!(out, "VERIFY FAILED: {e}");
            ExitCode::from(4)
        }
        Err(Failure::Setup(e)) => {
            let _ = writeln!(out, "SETUP FAILED: {e}");
            ExitCode::from(2)
        }
    }
}

struct Conn {
    qp: Qp,
    cq: Cq,
}

/// Polls one completion, failing with the status if it is not a success. `None` if the
/// deadline passed.
fn next_completion(cq: &Cq, deadline: Instant) -> Result<WorkCompletion, Failure> {
    let mut wc = [WorkCompletion::default()];
    loop {
        if cq.poll(&mut wc)? == 1 {
            return Ok(wc[0]);
        }
        if Instant::now() > deadline {
            return Err(Failure::Verify("no completion before the deadline".into()));
        }
    }
}

/// Accepts one connection on `listener`, giving up (a timeout, exit 4) after `limit`.
fn accept_within(listener: &TcpListener, limit: Duration) -> Result<TcpStream, Failure> {
    let deadline = Instant::now() + limit;
    listener.set_nonblocking(true)?;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                return Ok(stream);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(Failure::Verify(
                        "no client connected before the deadline".into(),
                    ));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Reads one line of the TCP exchange. A read that timed out (the stream's timeout comes
/// from the deadline) is a timeout (exit 4), not a setup error.
fn read_line(reader: &mut BufReader<TcpStream>, line: &mut String) -> Result<(), Failure> {
    match reader.read_line(line) {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Err(
            Failure::Verify("the peer sent nothing before the deadline".into()),
        ),
        Err(e) => Err(e.into()),
    }
}

fn connect(conn: &Conn, peer: RemoteInfo, o: &Options) -> Result<(), Failure> {
    conn.qp.to_rtr(peer)?;
    conn.qp.to_rts(
        RtsAttr::new(PSN)
            .timeout(o.timeout_code)
            .retry_cnt(o.retry_cnt),
    )?;
    Ok(())
}

fn setup(ctx: &Context, pd: &Pd, max_recv: u32) -> Result<Conn, Failure> {
    let cq = ctx.create_cq(1024)?;
    let qp = pd
        .qp_builder(QpType::Rc, &cq, &cq)
        .sq_sig_all(true)
        .max_send_wr(256)
        .max_recv_wr(max_recv)
        .build()?;
    qp.to_init(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC)?;
    Ok(Conn { qp, cq })
}

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

fn server(o: &Options) -> Result<String, Failure> {
    let ctx = Context::open()?;
    let listener = TcpListener::bind(("0.0.0.0", o.port))?;
    writeln!(std::io::stdout(), "port {}", listener.local_addr()?.port())?;
    std::io::stdout().flush()?;
    // Every wait is bounded by the deadline, the exchange's too: a client that never comes
    // or never answers (its test failed, or it was killed) ends this server.
    std::thread::scope(|scope| {
        let mut served = Vec::new();
        for _ in 0..o.clients {
            let stream = accept_within(&listener, o.deadline)?;
            let ctx = &ctx;
            served.push(scope.spawn(move || serve(ctx, stream, o)));
        }
        let mut summaries = Vec::new();
        for handle in served {
            summaries.push(
                handle
                    .join()
                    .map_err(|_| Failure::Setup("a serving thread panicked".into()))??,
            );
        }
        Ok(summaries.join("; "))
    })
}

/// Serves one client on a QP of its own.
fn serve(ctx: &Context, mut stream: TcpStream, o: &Options) -> Result<String, Failure> {
    let pd = ctx.alloc_pd();
    let conn = setup(ctx, &pd, RX_DEPTH as u32)?;
    let recv = pd.reg_mr(RX_DEPTH * SLOT, AccessFlags::LOCAL_WRITE)?;
    let target = pd.reg_mr(SLOTS_BASE + WRITE_SLOTS * SLOT, ALL)?;
    stream.set_read_timeout(Some(o.deadline))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    writeln!(stream, "{} {}", conn.qp.local_info(PSN), target.remote())?;
    let mut line = String::new();
    read_line(&mut reader, &mut line)?;
    let peer: RemoteInfo = line.trim().parse()?;
    for slot in 0..RX_DEPTH {
        conn.qp.post_recv(RecvRequest::new(
            slot as u64,
            &[recv.slice(slot * SLOT..(slot + 1) * SLOT)?],
        ))?;
    }
    connect(&conn, peer, o)?;
    // Tell the client this QP is in RTR/RTS with its receives posted, so its first packet
    // does not meet a QP still in INIT (dropped, then retransmitted after a timeout), as
    // ibv_rc_pingpong's closing exchange does.
    writeln!(stream, "ready")?;
    let deadline = Instant::now() + o.deadline;
    let mut sends_seen: u64 = 0;
    loop {
        let wc = next_completion(&conn.cq, deadline)?;
        let done = wc
            .result()
            .map_err(|f| Failure::Completion(format!("{} (wr {})", f.status(), f.wr_id())))?;
        let slot = wc.wr_id() as usize;
        let bytes = recv.read_vec(slot * SLOT..slot * SLOT + done.byte_len() as usize)?;
        if done.imm_data() == Some(DONE_IMM) {
            let n = u64::from_ne_bytes(
                bytes
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .ok_or_else(|| Failure::Verify("short DONE message".into()))?,
            );
            let expected_sends = (0..n)
                .filter(|&i| matches!(op_of(i), Op::Send | Op::SendImm))
                .count() as u64;
            let expected_sum: u64 = (0..n).filter(|&i| op_of(i) == Op::FetchAdd).sum();
            let expected_cas = (0..n).filter(|&i| op_of(i) == Op::CompareSwap).count() as u64;
            let (sum, cas) = (target.read_u64(COUNTER)?, target.read_u64(CAS_WORD)?);
            if sends_seen != expected_sends || sum != expected_sum || cas != expected_cas {
                return Err(Failure::Verify(format!(
                    "end state: sends {sends_seen}/{expected_sends}, counter {sum}/{expected_sum}, cas {cas}/{expected_cas}"
                )));
            }
            conn.qp
                .post_send(SendRequest::send_inline(u64::MAX, b"OK"))?;
            let wc = next_completion(&conn.cq, deadline)?;
            wc.result()
                .map_err(|f| Failure::Completion(f.status().to_string()))?;
            // The client keeps its QP until it hears this: had it left as soon as "OK"
            // arrived, a lost ACK of "OK" would leave this side retransmitting to a
            // closed QP until RETRY_EXC_ERR (the closing exchange of ibv_rc_pingpong).
            writeln!(stream, "bye")?;
            // And this side keeps its QP until the client has its completion for "DONE":
            // had the ACK of "DONE" been lost, the client retransmits it, and only a live
            // QP here answers (a duplicate, re-ACKed); a closed one would end the client
            // with RETRY_EXC_ERR.
            line.clear();
            read_line(&mut reader, &mut line)?;
            if line.trim() != "done" {
                return Err(Failure::Setup(format!("client said {line:?}, not done")));
            }
            return Ok(format!(
                "server: {n} messages, {sends_seen} sends verified, counter {sum}, cas {cas}"
            ));
        }
        // The k-th send is message (k / 2) * 6 + k % 2.
        let i = (sends_seen / 2) * 6 + sends_seen % 2;
        let (len, imm) = match op_of(i) {
            Op::Send => (size_of_message(i), None),
            _ => (16, Some(i as u32)),
        };
        if bytes.len() != len || done.imm_data() != imm {
            return Err(Failure::Verify(format!(
                "message {i}: {} bytes imm {:?}, expected {len} bytes imm {imm:?}",
                bytes.len(),
                done.imm_data()
            )));
        }
        if let Some(j) = (0..len).find(|&j| bytes[j] != pattern(i, j)) {
            return Err(Failure::Verify(format!("message {i}: byte {j} differs")));
        }
        sends_seen += 1;
        conn.qp.post_recv(RecvRequest::new(
            slot as u64,
            &[recv.slice(slot * SLOT..(slot + 1) * SLOT)?],
        ))?;
    }
}

fn client(o: &Options) -> Result<String, Failure> {
    let ctx = Context::open()?;
    let pd = ctx.alloc_pd();
    let conn = setup(&ctx, &pd, 4)?;
    let w = o.window;
    // Source slots, read landing slots, atomic results, the final receive.
    let local = pd.reg_mr(2 * w * SLOT + w * 8 + SLOT, AccessFlags::LOCAL_WRITE)?;
    let (land_base, atomic_base, ok_base) = (w * SLOT, 2 * w * SLOT, 2 * w * SLOT + w * 8);
    let mut stream = TcpStream::connect((o.host.as_str(), o.port))?;
    // Bounded: a server that stops answering ends this client too.
    stream.set_read_timeout(Some(o.deadline))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    read_line(&mut reader, &mut line)?;
    let mut parts = line.split_whitespace();
    let peer: RemoteInfo = parts.next().ok_or("no QP info")?.parse()?;
    let target: RemoteAddr = parts.next().ok_or("no region")?.parse()?;
    writeln!(stream, "{}", conn.qp.local_info(PSN))?;
    conn.qp.post_recv(RecvRequest::new(
        u64::MAX,
        &[local.slice(ok_base..ok_base + SLOT)?],
    ))?;
    connect(&conn, peer, o)?;
    line.clear();
    read_line(&mut reader, &mut line)?;
    if line.trim() != "ready" {
        return Err(Failure::Setup(format!("server said {line:?}, not ready")));
    }
    let deadline = Instant::now() + o.deadline;
    let at = |offset: usize| RemoteAddr::new(target.addr + offset as u64, target.rkey);
    let slot_of = |i: u64| SLOTS_BASE + ((i / 6) as usize % WRITE_SLOTS) * SLOT;
    let mut outstanding: VecDeque<u64> = VecDeque::new();
    let (mut fetch_sum, mut cas_count) = (0u64, 0u64);
    let mut expected_fetch: Vec<u64> = vec![0; w];
    let mut expected_cas: Vec<u64> = vec![0; w];
    let started = Instant::now();
    let complete_one = |outstanding: &mut VecDeque<u64>,
                        expected_fetch: &[u64],
                        expected_cas: &[u64]|
     -> Result<(), Failure> {
        let wc = next_completion(&conn.cq, deadline)?;
        let Some(i) = outstanding.pop_front() else {
            return Err(Failure::Verify(format!("unexpected completion {wc:?}")));
        };
        if let Err(failed) = wc.result() {
            // Error, then flush: every outstanding request completes, in order, with
            // WR_FLUSH_ERR (ibv_poll_cq(3); IBTA 10.8.3).
            let mut flushed = 0;
            let mut others = Vec::new();
            while let Some(j) = outstanding.pop_front() {
                let wc = next_completion(&conn.cq, deadline)?;
                if wc.wr_id() != j {
                    others.push(format!("wr {} where {j} was next", wc.wr_id()));
                } else if wc.status() == WcStatus::WrFlushErr {
                    flushed += 1;
                } else {
                    others.push(format!("{} for {j}", wc.status()));
                }
            }
            return Err(Failure::Completion(format!(
                "{} at message {i}; flushed {flushed}; other {others:?}",
                failed.status()
            )));
        }
        if wc.wr_id() != i {
            return Err(Failure::Verify(format!(
                "completion for {} where {i} was next",
                wc.wr_id()
            )));
        }
        let k = i as usize % w;
        match op_of(i) {
            Op::Read => {
                let len = size_of_message(i - 1);
                let got = local.read_vec(land_base + k * SLOT..land_base + k * SLOT + len)?;
                if let Some(j) = (0..len).find(|&j| got[j] != pattern(i - 1, j)) {
                    return Err(Failure::Verify(format!("read {i}: byte {j} differs")));
                }
            }
            Op::FetchAdd if local.read_u64(atomic_base + k * 8)? != expected_fetch[k] => {
                return Err(Failure::Verify(format!("fetch-add {i}: wrong original")));
            }
            Op::CompareSwap if local.read_u64(atomic_base + k * 8)? != expected_cas[k] => {
                return Err(Failure::Verify(format!("compare-swap {i}: wrong original")));
            }
            _ => {}
        }
        Ok(())
    };
    for i in 0..o.messages {
        if outstanding.len() == w {
            complete_one(&mut outstanding, &expected_fetch, &expected_cas)?;
        }
        let k = i as usize % w;
        let src = k * SLOT;
        let request = match op_of(i) {
            Op::Send => {
                let len = size_of_message(i);
                local.write_at(src, &(0..len).map(|j| pattern(i, j)).collect::<Vec<_>>())?;
                SendRequest::send(i, &[local.slice(src..src + len)?])
            }
            Op::SendImm => {
                local.write_at(src, &(0..16).map(|j| pattern(i, j)).collect::<Vec<_>>())?;
                SendRequest::send_with_imm(i, &[local.slice(src..src + 16)?], i as u32)
            }
            Op::Write => {
                let len = size_of_message(i);
                local.write_at(src, &(0..len).map(|j| pattern(i, j)).collect::<Vec<_>>())?;
                SendRequest::write(i, &[local.slice(src..src + len)?], at(slot_of(i)))
            }
            Op::Read => {
                let len = size_of_message(i - 1);
                let land = land_base + k * SLOT;
                SendRequest::read(i, &[local.slice(land..land + len)?], at(slot_of(i - 1)))
            }
            Op::FetchAdd => {
                expected_fetch[k] = fetch_sum;
                fetch_sum += i;
                let slot = atomic_base + k * 8;
                SendRequest::fetch_add(i, local.slice(slot..slot + 8)?, at(COUNTER), i)
            }
            Op::CompareSwap => {
                expected_cas[k] = cas_count;
                let slot = atomic_base + k * 8;
                let request = SendRequest::compare_swap(
                    i,
                    local.slice(slot..slot + 8)?,
                    at(CAS_WORD),
                    cas_count,
                    cas_count + 1,
                );
                cas_count += 1;
                request
            }
        };
        conn.qp.post_send(request)?;
        outstanding.push_back(i);
        if i > 0 && i % 20_000 == 0 {
            let _ = writeln!(std::io::stderr(), "progress: {i} messages");
        }
    }
    while !outstanding.is_empty() {
        complete_one(&mut outstanding, &expected_fetch, &expected_cas)?;
    }
    // The final message: its payload is the count; the server answers "OK".
    local.write_at(0, &o.messages.to_ne_bytes())?;
    conn.qp.post_send(SendRequest::send_with_imm(
        u64::MAX - 1,
        &[local.slice(0..8)?],
        DONE_IMM,
    ))?;
    let mut got_ok = false;
    let mut done_sent = false;
    while !(got_ok && done_sent) {
        let wc = next_completion(&conn.cq, deadline)?;
        wc.result()
            .map_err(|f| Failure::Completion(format!("{} at the end", f.status())))?;
        match wc.wr_id() {
            u64::MAX => got_ok = true,
            _ => done_sent = true,
        }
    }
    let elapsed = started.elapsed();
    // Stay connected (the progress thread answers a retransmitted "OK" whose ACK was
    // lost) until the server has its completion for "OK".
    stream.set_read_timeout(Some(
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_secs(1)),
    ))?;
    line.clear();
    read_line(&mut reader, &mut line)?;
    if line.trim() != "bye" {
        return Err(Failure::Setup(format!("server said {line:?}, not bye")));
    }
    // Both completions are in: the server may now close its QP.
    writeln!(stream, "done")?;
    let counters = ctx.device().counters();
    Ok(format!(
        "client: {} messages verified in {:.2} s; retransmitted packets {}, timeouts {}, naks received {}",
        o.messages,
        elapsed.as_secs_f64(),
        counters.retransmitted_packets,
        counters.timeouts,
        counters.naks_received
    ))
}
