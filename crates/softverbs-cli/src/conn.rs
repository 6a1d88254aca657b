//! What every two-sided command shares: where the two sides run (one process over UDP
//! loopback, one process in-process, or two processes), opening the devices, one side's
//! verbs objects, the TCP control connection and bounded completion waiting.

use crate::Error;
use softverbs::*;
use softverbs_device::Capture;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The TCP port `ibv_rc_pingpong` and this command exchange QP information on.
pub const DEFAULT_TCP_PORT: u16 = 18515;

/// How long any wait for a completion, a peer or a byte in memory may take.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// Where the two sides run, from the command line.
#[derive(clap::Args, Clone, Debug)]
pub struct NetArgs {
    /// Run only the server side: open a UDP device (SOFTVERBS_ADDR, else the first free
    /// 127.0.0.x:4791) and wait for one client on the TCP port.
    #[arg(long, conflicts_with_all = ["client", "in_process"])]
    pub server: bool,

    /// Run only the client side, connecting to the server at HOST over TCP.
    #[arg(long, value_name = "HOST", conflicts_with = "in_process")]
    pub client: Option<String>,

    /// Both sides in this process with in-process devices (no socket at all), instead
    /// of the default: both sides in this process over UDP loopback with the in-process
    /// shortcut off, so every packet crosses the kernel as RoCEv2.
    #[arg(long)]
    pub in_process: bool,

    /// TCP port of the QP information exchange (0 with --server: any free port, which
    /// the server prints).
    #[arg(short = 'p', long = "port", default_value_t = DEFAULT_TCP_PORT)]
    pub tcp_port: u16,

    /// Address the server listens on for the exchange.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0")]
    pub listen: String,

    /// Capture this side's RoCEv2 traffic into a pcap file (UDP devices only; in the
    /// one-process run, the client's device, which sees every packet once).
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<PathBuf>,
}

/// Where the sides run.
pub enum Mode {
    /// Both sides here, over UDP loopback between two devices.
    Loopback,
    /// Both sides here, in-process devices.
    InProcess,
    /// The server side only.
    Server,
    /// The client side only, to this host.
    Client(String),
}

impl NetArgs {
    /// The mode the arguments ask for.
    pub fn mode(&self) -> Mode {
        if self.server {
            Mode::Server
        } else if let Some(host) = &self.client {
            Mode::Client(host.clone())
        } else if self.in_process {
            Mode::InProcess
        } else {
            Mode::Loopback
        }
    }

    fn capture(&self) -> Result<Option<Arc<Capture>>, Error> {
        match &self.pcap {
            Some(path) => Ok(Some(Capture::create(path).map_err(|e| {
                format!("cannot create the capture {}: {e}", path.display())
            })?)),
            None => Ok(None),
        }
    }

    /// Opens the device(s) the mode needs: `(client or only side, server side if here)`.
    pub fn open(&self) -> Result<(Context, Option<Context>), Error> {
        let capture = self.capture()?;
        match self.mode() {
            Mode::Server | Mode::Client(_) => {
                let mut config = DeviceConfig::udp_from_env()?;
                if capture.is_some() {
                    config.capture = capture;
                }
                Ok((Context::open_with(config)?, None))
            }
            Mode::Loopback => {
                // Two devices, each on the first free 127.0.0.x, packets through the kernel.
                let mut client = DeviceConfig::udp(UdpConfig::default());
                client.capture = capture;
                let client = Context::open_with(client)?;
                let server = Context::open_with(DeviceConfig::udp(UdpConfig::default()))?;
                for ctx in [&client, &server] {
                    ctx.device().set_in_process_shortcut(false);
                }
                Ok((client, Some(server)))
            }
            Mode::InProcess => {
                if capture.is_some() {
                    return Err("--pcap needs UDP devices: in-process devices have no \
                                transport to capture"
                        .into());
                }
                Ok((
                    Context::open_with(DeviceConfig::in_process())?,
                    Some(Context::open_with(DeviceConfig::in_process())?),
                ))
            }
        }
    }

    /// Listens for the exchange; returns the listener and the port it got.
    pub fn listen(&self, one_process: bool) -> Result<(TcpListener, u16), Error> {
        let (host, port) = if one_process {
            ("127.0.0.1", 0)
        } else {
            (self.listen.as_str(), self.tcp_port)
        };
        let listener = TcpListener::bind((host, port))
            .map_err(|e| format!("cannot listen on TCP {host}:{port}: {e}"))?;
        let port = listener.local_addr()?.port();
        Ok((listener, port))
    }
}

/// Connects to the server's exchange port, retrying for a while (the server may still be
/// starting).
pub fn connect_tcp(host: &str, port: u16) -> Result<TcpStream, Error> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpStream::connect((host, port)) {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                return Ok(stream);
            }
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(format!("cannot connect to {host}:{port}: {e}").into()),
        }
    }
}

/// A line-oriented control connection (JSON messages, one a line).
pub struct Control {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Control {
    /// Wraps a connected stream.
    pub fn new(stream: TcpStream) -> Result<Control, Error> {
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(120)))?;
        let reader = BufReader::new(stream.try_clone()?);
        Ok(Control { stream, reader })
    }

    /// Sends one message.
    pub fn send<T: serde::Serialize>(&mut self, message: &T) -> Result<(), Error> {
        let mut line = serde_json::to_string(message)?;
        line.push('\n');
        self.stream.write_all(line.as_bytes())?;
        Ok(())
    }

    /// Receives one message.
    pub fn recv<T: serde::de::DeserializeOwned>(&mut self) -> Result<T, Error> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err("the peer closed the control connection".into());
        }
        Ok(serde_json::from_str(line.trim())?)
    }
}

/// What each side tells the other: its QP ([`RemoteInfo`] text) and its buffer
/// ([`RemoteAddr`] text).
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Hello {
    /// `QPN:PSN:MTU:GID`.
    pub qp: String,
    /// `ADDR:RKEY`.
    pub mr: String,
}

/// One side's verbs objects: a CQ (on a channel with events), an RC QP and a buffer.
pub struct Side {
    /// The completion channel, when completions are waited for by events.
    pub channel: Option<CompChannel>,
    /// Send and receive completions.
    pub cq: Cq,
    /// The RC QP.
    pub qp: Qp,
    /// The buffer (every access right).
    pub mr: Mr,
}

/// Every access a buffer may need.
pub const ALL_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

impl Side {
    /// A side with a buffer of `len` bytes, `send_depth` send and `recv_depth` receive
    /// WRs; every send signaled; the QP moved to INIT.
    pub fn new(
        ctx: &Context,
        len: usize,
        send_depth: u32,
        recv_depth: u32,
        events: bool,
    ) -> Result<Side, Error> {
        let pd = ctx.alloc_pd();
        let channel = if events {
            Some(ctx.create_comp_channel()?)
        } else {
            None
        };
        let mut builder = ctx.cq_builder(send_depth + recv_depth + 16);
        if let Some(channel) = &channel {
            builder = builder.channel(channel);
        }
        let cq = builder.build()?;
        let qp = pd
            .qp_builder(QpType::Rc, &cq, &cq)
            .max_send_wr(send_depth)
            .max_recv_wr(recv_depth.max(1))
            .sq_sig_all(true)
            .build()?;
        let mr = pd.reg_mr(len.max(PAGE_SIZE), ALL_ACCESS)?;
        qp.to_init(
            AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
        )?;
        if channel.is_some() {
            cq.req_notify(false);
        }
        Ok(Side {
            channel,
            cq,
            qp,
            mr,
        })
    }

    /// This side's hello, announcing `psn`.
    pub fn hello(&self, psn: u32, mtu: Mtu) -> Hello {
        let mut info = self.qp.local_info(psn);
        info.mtu = info.mtu.min(mtu);
        Hello {
            qp: info.to_string(),
            mr: self.mr.remote().to_string(),
        }
    }

    /// Moves the QP to RTR towards `peer` and to RTS sending from `my_psn`.
    pub fn connect(&self, peer: RemoteInfo, my_psn: u32) -> Result<(), Error> {
        self.qp.to_rtr(RtrAttr::from(peer).max_dest_rd_atomic(16))?;
        self.qp.to_rts(RtsAttr::new(my_psn).max_rd_atomic(16))?;
        Ok(())
    }

    /// Polls completions into `wcs`, waiting up to [`PATIENCE`] for at least one: by busy
    /// polling, or with a channel by sleeping on it (arm, check, then wait, as
    /// `ibv_get_cq_event(3)` describes). A failed completion is an error.
    pub fn wait(&self, wcs: &mut [WorkCompletion]) -> Result<usize, Error> {
        let deadline = Instant::now() + PATIENCE;
        let mut empty_polls = 0u32;
        loop {
            let n = self.cq.poll(wcs)?;
            if n > 0 {
                for wc in &wcs[..n] {
                    if let Err(failed) = wc.result() {
                        return Err(format!(
                            "work request {} failed: {}",
                            failed.wr_id(),
                            failed.status()
                        )
                        .into());
                    }
                }
                return Ok(n);
            }
            let now = Instant::now();
            if now > deadline {
                return Err("timed out waiting for a completion".into());
            }
            if let Some(channel) = &self.channel {
                if self.cq.req_notify_and_check(false) {
                    continue;
                }
                // The event acknowledges itself when dropped.
                let _event = channel.get_event_timeout(deadline - now)?;
            } else {
                // Busy polling, but giving the core away now and then: with both sides
                // and the progress threads on a machine of few cores, a poller that never
                // yields keeps the peer it waits for off the CPU.
                spin_pause(&mut empty_polls);
            }
        }
    }

    /// Polls without waiting; a failed completion is an error.
    pub fn try_poll(&self, wcs: &mut [WorkCompletion]) -> Result<usize, Error> {
        let n = self.cq.poll(wcs)?;
        for wc in &wcs[..n] {
            if let Err(failed) = wc.result() {
                return Err(format!(
                    "work request {} failed: {}",
                    failed.wr_id(),
                    failed.status()
                )
                .into());
            }
        }
        Ok(n)
    }
}

/// Empty polls between two `yield_now` of a busy-polling wait.
const SPINS_BEFORE_YIELD: u32 = 64;

/// Counts one empty poll of a busy-polling loop and yields the core every
/// `SPINS_BEFORE_YIELD` of them.
pub fn spin_pause(empty_polls: &mut u32) {
    *empty_polls = empty_polls.wrapping_add(1);
    if empty_polls.is_multiple_of(SPINS_BEFORE_YIELD) {
        std::thread::yield_now();
    }
}

/// A random-enough 24-bit PSN (`ibv_rc_pingpong` uses `lrand48() & 0xffffff`).
pub fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    (hasher.finish() & 0xff_ffff) as u32
}

/// Parses an MTU in bytes.
pub fn mtu_from_bytes(bytes: u32) -> Result<Mtu, Error> {
    Ok(match bytes {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        1024 => Mtu::Mtu1024,
        2048 => Mtu::Mtu2048,
        4096 => Mtu::Mtu4096,
        other => {
            return Err(format!("MTU {other} is not one of 256, 512, 1024, 2048, 4096").into())
        }
    })
}
