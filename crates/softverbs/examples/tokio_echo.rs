//! An RC echo server and its clients on tokio (feature `tokio`): every completion is
//! awaited through its CQ's completion channel ([`AsyncCompChannel`]), never busy-polled,
//! so one thread serves every connection.
//!
//! ```text
//! cargo run -p softverbs --features tokio --example tokio_echo       # a server and 3 clients in this process
//! cargo run -p softverbs --features tokio --example tokio_echo -- --server [-p PORT]
//! cargo run -p softverbs --features tokio --example tokio_echo -- --client HOST [-p PORT] [-n N] [-s SIZE]
//! ```
//!
//! Each side opens its device as [`Context::open`] does (`SOFTVERBS_ADDR`, else the first
//! free 127.0.0.x; `SOFTVERBS_NETWORK`, `SOFTVERBS_FAULTS`, `SOFTVERBS_PCAP` as everywhere).
//! A client connects over TCP (port 18517 unless `-p`), and each sends its line: its
//! [`RemoteInfo`], and from the client the number and size of the messages. The server
//! makes one QP, CQ and channel per connection, echoes that many messages and says `done`
//! over TCP; the client checks every echo byte for byte. With no option, a server and
//! three concurrent clients run in this process on one thread; the example exits 0 when
//! every echo came back intact, and 1 naming what failed.

use softverbs::*;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The longest any one wait (a completion, a line from the peer) may take.
const PATIENCE: Duration = Duration::from_secs(10);
/// The first PSN each side sends with.
const PSN: u32 = 0x100;

/// One connection's verbs objects: the message buffer holds the receive slot at
/// `0..size` and the send slot at `size..2 * size`.
struct Connection {
    qp: Qp,
    cq: Cq,
    events: AsyncCompChannel,
    mr: Mr,
    size: usize,
}

impl Connection {
    /// A QP in INIT with its receive posted (so that the peer may send as soon as it knows
    /// us), its CQ and the CQ's channel registered with tokio.
    fn new(ctx: &Context, size: usize) -> Result<Connection, Error> {
        let pd = ctx.alloc_pd();
        let channel = ctx.create_comp_channel()?;
        let cq = ctx.cq_builder(16).channel(&channel).build()?;
        let qp = pd
            .qp_builder(QpType::Rc, &cq, &cq)
            .sq_sig_all(true)
            .build()?;
        let mr = pd.reg_mr(2 * size.max(1), AccessFlags::LOCAL_WRITE)?;
        qp.to_init(AccessFlags::empty())?;
        let connection = Connection {
            qp,
            cq,
            events: AsyncCompChannel::new(&channel)?,
            mr,
            size,
        };
        connection.post_receive()?;
        Ok(connection)
    }

    fn post_receive(&self) -> Result<(), Error> {
        let slot = self.mr.slice(0..self.size)?;
        self.qp.post_recv(RecvRequest::new(0, &[slot]))?;
        Ok(())
    }

    fn connect(&self, peer: RemoteInfo) -> Result<(), Error> {
        self.qp.to_rtr(peer)?;
        self.qp.to_rts(RtsAttr::new(PSN))?;
        Ok(())
    }

    /// Sends the send slot's bytes.
    fn post_send(&self) -> Result<(), Error> {
        let slot = self.mr.slice(self.size..2 * self.size)?;
        self.qp.post_send(SendRequest::send(1, &[slot]))?;
        Ok(())
    }

    /// The next completion, successful, awaited: its opcode and length. Arms the CQ, and
    /// sleeps on the channel only if nothing is waiting (`req_notify_and_check`, so no
    /// completion slips between the poll and the arming). The event acknowledges itself
    /// when dropped.
    async fn next_completion(&self) -> Result<(WcOpcode, usize), Error> {
        let mut wc = [WorkCompletion::default()];
        loop {
            if self.cq.poll(&mut wc)? == 1 {
                return match wc[0].result() {
                    Ok(done) => Ok((done.opcode(), done.byte_len() as usize)),
                    Err(failed) => Err(format!("completion failed: {:?}", failed.status()).into()),
                };
            }
            if !self.cq.req_notify_and_check(false) {
                tokio::time::timeout(PATIENCE, self.events.next_event())
                    .await
                    .map_err(|_| format!("no completion within {PATIENCE:?}"))??;
            }
        }
    }

    /// Waits for the send completion and the receive completion of one round, in either
    /// order; returns the received length.
    async fn round_trip(&self) -> Result<usize, Error> {
        let (mut sent, mut received) = (false, None);
        while !sent || received.is_none() {
            match self.next_completion().await? {
                (WcOpcode::Send, _) => sent = true,
                (_, len) => received = Some(len),
            }
        }
        Ok(received.unwrap_or_default())
    }
}

/// Reads one line within [`PATIENCE`]; an empty result means the peer closed.
async fn read_line(reader: &mut BufReader<TcpStream>) -> Result<String, Error> {
    let mut line = String::new();
    tokio::time::timeout(PATIENCE, reader.read_line(&mut line))
        .await
        .map_err(|_| format!("no answer over TCP within {PATIENCE:?}"))??;
    Ok(line)
}

/// Serves one client: its line is `REMOTE_INFO COUNT SIZE`.
async fn serve(ctx: Context, stream: TcpStream) -> Result<u64, Error> {
    let mut reader = BufReader::new(stream);
    let line = read_line(&mut reader).await?;
    let mut words = line.split_whitespace();
    let (Some(info), Some(count), Some(size)) = (words.next(), words.next(), words.next()) else {
        return Err(format!("bad client line {line:?}").into());
    };
    let (peer, count, size): (RemoteInfo, u64, usize) =
        (info.parse()?, count.parse()?, size.parse()?);
    let connection = Connection::new(&ctx, size)?;
    connection.connect(peer)?;
    let mine = format!("{}\n", connection.qp.local_info(PSN));
    reader.get_mut().write_all(mine.as_bytes()).await?;
    // An echo's send completion may come before or after the next ping.
    let (mut received, mut echoed) = (0, 0);
    while received < count || echoed < count {
        let (opcode, len) = connection.next_completion().await?;
        if opcode == WcOpcode::Send {
            echoed += 1;
            continue;
        }
        // A ping: copy it to the send slot, post the next receive, echo it.
        received += 1;
        let message = connection.mr.read_vec(0..len)?;
        connection.mr.write_at(size, &message)?;
        connection.post_receive()?;
        connection.post_send()?;
    }
    reader.get_mut().write_all(b"done\n").await?;
    Ok(count)
}

/// Accepts clients forever (or `clients` of them), one task each.
async fn server(listener: TcpListener, clients: Option<usize>) -> Result<(), Error> {
    let ctx = Context::open()?;
    println!(
        "server: device {} at {}, waiting on TCP {}",
        ctx.name(),
        ctx.gid(0).map(|g| g.to_string()).unwrap_or_default(),
        listener.local_addr()?
    );
    let mut tasks = Vec::new();
    while clients.is_none_or(|n| tasks.len() < n) {
        let (stream, from) = listener.accept().await?;
        let ctx = ctx.clone();
        tasks.push(tokio::spawn(async move {
            match serve(ctx, stream).await {
                Ok(count) => println!("server: echoed {count} messages to {from}"),
                Err(error) => eprintln!("server: client {from}: {error}"),
            }
        }));
    }
    for task in tasks {
        task.await?;
    }
    Ok(())
}

/// One client: `count` messages of `size` bytes, each checked when it comes back.
/// Returns the mean round trip.
async fn client(address: String, count: u64, size: usize) -> Result<Duration, Error> {
    let ctx = Context::open()?;
    let connection = Connection::new(&ctx, size)?;
    let stream = tokio::time::timeout(PATIENCE, TcpStream::connect(&address))
        .await
        .map_err(|_| format!("{address}: no answer within {PATIENCE:?}"))?
        .map_err(|e| format!("{address}: {e}"))?;
    let mut reader = BufReader::new(stream);
    let mine = format!("{} {count} {size}\n", connection.qp.local_info(PSN));
    reader.get_mut().write_all(mine.as_bytes()).await?;
    let peer: RemoteInfo = read_line(&mut reader).await?.parse()?;
    connection.connect(peer)?;
    let started = Instant::now();
    for i in 0..count {
        let message: Vec<u8> = (0..size).map(|j| (i as usize * 7 + j) as u8).collect();
        connection.mr.write_at(size, &message)?;
        connection.post_send()?;
        let received = connection.round_trip().await?;
        if received != size || connection.mr.read_vec(0..size)? != message {
            return Err(format!("echo {i} came back different ({received} bytes)").into());
        }
        connection.post_receive()?;
    }
    let elapsed = started.elapsed();
    let goodbye = read_line(&mut reader).await?;
    if goodbye.trim() != "done" {
        return Err(format!("the server ended with {goodbye:?}, not done").into());
    }
    Ok(elapsed / u32::try_from(count.max(1)).unwrap_or(u32::MAX))
}

struct Options {
    mode: Mode,
    port: u16,
    count: u64,
    size: usize,
}

enum Mode {
    Both,
    Server,
    Client(String),
}

fn options() -> Result<Options, Error> {
    let mut options = Options {
        mode: Mode::Both,
        port: 18517,
        count: 1000,
        size: 4096,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--server" => options.mode = Mode::Server,
            "--client" => options.mode = Mode::Client(value()?),
            "-p" => options.port = value()?.parse()?,
            "-n" => options.count = value()?.parse()?,
            "-s" => options.size = value()?.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    Ok(options)
}

async fn run(options: Options) -> Result<(), Error> {
    match options.mode {
        Mode::Server => server(TcpListener::bind(("::", options.port)).await?, None).await,
        Mode::Client(host) => {
            let address = if host.contains(':') {
                format!("[{host}]:{}", options.port)
            } else {
                format!("{host}:{}", options.port)
            };
            let rtt = client(address, options.count, options.size).await?;
            println!(
                "{} echoes of {} bytes, each intact: {rtt:?} per round trip",
                options.count, options.size
            );
            Ok(())
        }
        Mode::Both => {
            const CLIENTS: usize = 3;
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            let address = listener.local_addr()?.to_string();
            let server = tokio::spawn(server(listener, Some(CLIENTS)));
            let clients: Vec<_> = (0..CLIENTS)
                .map(|_| tokio::spawn(client(address.clone(), options.count, options.size)))
                .collect();
            for (i, task) in clients.into_iter().enumerate() {
                let rtt = task.await??;
                println!(
                    "client {i}: {} echoes of {} bytes, each intact: {rtt:?} per round trip",
                    options.count, options.size
                );
            }
            server.await??;
            println!("tokio echo: every echo came back intact");
            Ok(())
        }
    }
}

fn main() -> Result<(), Error> {
    let options = options()?;
    // One thread: the tasks interleave at their awaits.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run(options))
}
