//! What every two-sided command shares: where the two sides run (one process over UDP
//! loopback, one process in-process, or two processes), opening the devices, one side's
//! verbs objects, the TCP control connection and bounded completion waiting.

use crate::Error;
use softverbs::*;
use softverbs_device::{Capture, RegisterError, PCAP_ENV};
use std::io::{self, BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The TCP port `ibv_rc_pingpong` and this command exchange QP information on.
pub const DEFAULT_TCP_PORT: u16 = 18515;

/// How long any wait for a completion, a peer or a byte in memory may take.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// Where the two sides run, from the command line.
///
/// The device knobs of the environment (`SOFTVERBS_PCAP`, `SOFTVERBS_PCAP_LIMIT`,
/// `SOFTVERBS_FAULTS`; `SOFTVERBS_ADDR` for a one-side run) are read by the device
/// (`DeviceConfig::with_env`) in every mode; see [`NetArgs::open`].
#[derive(clap::Args, Clone, Debug)]
pub struct NetArgs {
    /// Run only the server side: open a UDP device (SOFTVERBS_ADDR, else the first free
    /// 127.0.0.x:4791) and wait for one client on the TCP port.
    #[arg(long, conflicts_with_all = ["client", "in_process"])]
    pub server: bool,

    /// Run only the client side, connecting to the server at HOST (a name, an IPv4 or an
    /// IPv6 address such as ::1) over TCP.
    #[arg(long, value_name = "HOST", conflicts_with = "in_process")]
    pub client: Option<String>,

    /// Both sides in this process with in-process devices (no socket at all), instead
    /// of the default: both sides in this process over UDP loopback with the in-process
    /// shortcut off, so every packet crosses the kernel as RoCEv2. Capture and fault
    /// injection (--pcap, SOFTVERBS_PCAP, SOFTVERBS_FAULTS) work here as in the default
    /// mode.
    #[arg(long)]
    pub in_process: bool,

    /// TCP port of the QP information exchange (0 with --server: any free port, which
    /// the server prints).
    #[arg(short = 'p', long = "port", default_value_t = DEFAULT_TCP_PORT)]
    pub tcp_port: u16,

    /// Address the server listens on for the exchange [default: every address of the
    /// host, IPv6 and IPv4 (:: dual-stack; 0.0.0.0 where IPv6 is off)].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,

    /// With --client: how long to wait for the server to answer on its TCP port, in
    /// seconds (the client says what it waits for meanwhile).
    #[arg(long, value_name = "SECONDS", default_value = "10", value_parser = seconds)]
    pub timeout: Duration,

    /// Capture RoCEv2 traffic into this pcap file, as SOFTVERBS_PCAP=FILE does (give one
    /// or the other). With both sides in this process, the client's device writes the
    /// file: it sends and receives every packet of the run once. SOFTVERBS_FAULTS applies
    /// to both devices there (each loses its own outgoing packets; the server's device
    /// draws from seed+1).
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<PathBuf>,
}

/// Parses a number of seconds (`--timeout`): positive, at most a day, fractions allowed.
fn seconds(text: &str) -> Result<Duration, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(value > 0.0 && value <= 86_400.0) {
        return Err(format!("{text}: give 0 < SECONDS <= 86400"));
    }
    Ok(Duration::from_secs_f64(value))
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

    /// Applies `--pcap` to a configuration the environment has filled (SOFTVERBS_PCAP is
    /// unset then: [`NetArgs::check_pcap`]).
    fn apply_pcap(&self, config: &mut DeviceConfig) -> Result<(), Error> {
        if let Some(path) = &self.pcap {
            config.capture = Some(Capture::create(path)?);
        }
        Ok(())
    }

    /// `--pcap` and SOFTVERBS_PCAP both name a capture file: refused, so that neither
    /// file is created (or truncated) for nothing.
    fn check_pcap(&self) -> Result<(), Error> {
        if let (Some(path), Some(env)) = (&self.pcap, std::env::var_os(PCAP_ENV)) {
            return Err(format!(
                "--pcap {} and {PCAP_ENV}={} both name a capture file: give one",
                path.display(),
                env.to_string_lossy()
            )
            .into());
        }
        Ok(())
    }

    /// Opens the device(s) the mode needs: `(client or only side, server side if here)`.
    ///
    /// Every device takes the environment's capture and faults through
    /// `DeviceConfig::with_env`. With both sides here (UDP or in-process devices), the
    /// client's device captures (it sees every packet once) and both inject faults, the
    /// server's from seed + 1 so that the two directions do not lose packets in lockstep.
    pub fn open(&self) -> Result<(Context, Option<Context>), Error> {
        self.check_pcap()?;
        match self.mode() {
            Mode::Server | Mode::Client(_) => {
                let mut config = DeviceConfig::udp_from_env()?;
                self.apply_pcap(&mut config)?;
                Ok((Context::open_with(config)?, None))
            }
            mode @ (Mode::Loopback | Mode::InProcess) => {
                let udp = matches!(mode, Mode::Loopback);
                // UDP: two devices, each on the first free 127.0.0.x, packets through the
                // kernel. In-process: two devices handing packets to each other.
                let mut client = if udp {
                    DeviceConfig::udp(UdpConfig::default())
                } else {
                    DeviceConfig::in_process()
                }
                .with_env()?;
                self.apply_pcap(&mut client)?;
                let mut server = client.clone();
                server.capture = None;
                if let Some(faults) = &mut server.faults {
                    faults.seed = faults.seed.wrapping_add(1);
                }
                let client = Context::open_with(client)?;
                let server = Context::open_with(server)?;
                if udp {
                    for ctx in [&client, &server] {
                        ctx.device().set_in_process_shortcut(false);
                    }
                }
                Ok((client, Some(server)))
            }
        }
    }

    /// Listens for the exchange; returns the listener and the port it got. One process:
    /// 127.0.0.1, any port. Server: `--listen`, else every address, IPv6 and IPv4.
    pub fn listen(&self, one_process: bool) -> Result<(TcpListener, u16), Error> {
        let (listener, shown) = if one_process {
            let listener = TcpListener::bind(("127.0.0.1", 0))
                .map_err(|e| format!("cannot listen on TCP 127.0.0.1 (any port): {e}"))?;
            (listener, "127.0.0.1".to_owned())
        } else {
            let port = self.tcp_port;
            match &self.listen {
                Some(host) => {
                    let host = host.trim_start_matches('[').trim_end_matches(']');
                    let shown = tcp_address(host, port);
                    let listener = TcpListener::bind((host, port))
                        .map_err(|e| listen_error(&shown, port, &e))?;
                    (listener, shown)
                }
                None => match dual_stack_listener(port) {
                    Ok(listener) => (listener, tcp_address("::", port)),
                    // No IPv6 on this host: IPv4 alone.
                    Err(e) if e.kind() != io::ErrorKind::AddrInUse => {
                        let shown = tcp_address("0.0.0.0", port);
                        let listener = TcpListener::bind(("0.0.0.0", port))
                            .map_err(|e| listen_error(&shown, port, &e))?;
                        (listener, shown)
                    }
                    Err(e) => return Err(listen_error(&tcp_address("::", port), port, &e)),
                },
            }
        };
        let port = listener
            .local_addr()
            .map_err(|e| format!("TCP {shown}: {e}"))?
            .port();
        Ok((listener, port))
    }
}

/// `HOST:PORT`, with brackets around an IPv6 address.
fn tcp_address(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The error of listening on `shown`, with the fix for a port in use.
fn listen_error(shown: &str, port: u16, error: &io::Error) -> Error {
    if error.kind() == io::ErrorKind::AddrInUse {
        format!(
            "cannot listen on TCP {shown}: port {port} is already in use ({error}), perhaps by \
             another server: give another with -p/--port (the client the same), or -p 0 for \
             any free port, which the server prints"
        )
        .into()
    } else {
        format!("cannot listen on TCP {shown}: {error}").into()
    }
}

/// A TCP listener on `[::]:port` that takes IPv4 clients too (`IPV6_V6ONLY` off, whatever
/// `net.ipv6.bindv6only` says), as `SO_REUSEADDR` as the standard library's.
fn dual_stack_listener(port: u16) -> io::Result<TcpListener> {
    use rustix::net::{ipproto, sockopt, AddressFamily, SocketFlags, SocketType};
    let socket = rustix::net::socket_with(
        AddressFamily::INET6,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        Some(ipproto::TCP),
    )?;
    sockopt::set_ipv6_v6only(&socket, false)?;
    sockopt::set_socket_reuseaddr(&socket, true)?;
    let any = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port);
    rustix::net::bind(&socket, &any)?;
    rustix::net::listen(&socket, 128)?;
    Ok(TcpListener::from(socket))
}

/// Connects to the server's exchange port at `host` (a name, an IPv4 address, or an IPv6
/// one with or without brackets), retrying until `timeout` has passed: the server may
/// still be starting. Once the first attempt has failed, says on stderr what it waits for
/// (the client's stdout may be JSON); `server_command` names the command to start there.
pub fn connect_tcp(
    host: &str,
    port: u16,
    timeout: Duration,
    server_command: &str,
) -> Result<TcpStream, Error> {
    let deadline = Instant::now() + timeout;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let shown = tcp_address(bare, port);
    let addresses: Vec<SocketAddr> = (bare, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot find the server {host} (--client): {e}"))?
        .collect();
    if addresses.is_empty() {
        return Err(format!("cannot find the server {host} (--client): no address").into());
    }
    let mut announced = false;
    loop {
        let mut last_error = None;
        for address in &addresses {
            // Each attempt waits at most a second, so a silent host is announced soon.
            let left = deadline.saturating_duration_since(Instant::now());
            let attempt = left.clamp(Duration::from_millis(10), Duration::from_secs(1));
            match TcpStream::connect_timeout(address, attempt) {
                Ok(stream) => {
                    stream.set_nodelay(true)?;
                    return Ok(stream);
                }
                Err(e) => last_error = Some(e),
            }
        }
        let why = last_error.map_or_else(String::new, |e| e.to_string());
        if Instant::now() >= deadline {
            return Err(format!(
                "no server answered on TCP {shown} within {} s ({why}): start `{server_command}` \
                 there, check the host and -p/--port, or wait longer with --timeout",
                timeout.as_secs_f64()
            )
            .into());
        }
        if !announced {
            announced = true;
            let _ = writeln!(
                std::io::stderr(),
                "softverbs: waiting for the server on TCP {shown} ({why}); giving up after {} s \
                 (--timeout)",
                timeout.as_secs_f64()
            );
        }
        let left = deadline.saturating_duration_since(Instant::now());
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
}

/// A line-oriented control connection (JSON messages, one a line).
pub struct Control {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Control {
    /// Wraps a connected stream; a message is awaited at most 120 s
    /// ([`Control::set_patience`] changes that).
    pub fn new(stream: TcpStream) -> Result<Control, Error> {
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(120)))?;
        let reader = BufReader::new(stream.try_clone()?);
        Ok(Control { stream, reader })
    }

    /// How long [`Control::recv`] waits for a message (`None`: as long as it takes).
    pub fn set_patience(&mut self, patience: Option<Duration>) -> Result<(), Error> {
        self.stream.set_read_timeout(patience)?;
        Ok(())
    }

    /// Whether a message (or the end of the stream) is waiting, without blocking.
    pub fn has_message(&mut self) -> Result<bool, Error> {
        if !self.reader.buffer().is_empty() {
            return Ok(true);
        }
        self.stream.set_nonblocking(true)?;
        let peeked = self.stream.peek(&mut [0u8; 1]);
        self.stream.set_nonblocking(false)?;
        match peeked {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e.into()),
        }
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
/// ([`RemoteAddr`] text); with several QPs (perftest's `-q`), the same for each further QP
/// and its part of the buffer, as perftest exchanges one such record per QP.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Hello {
    /// `QPN:PSN:MTU:GID` of the first (or only) QP.
    pub qp: String,
    /// `ADDR:RKEY` of the first QP's buffer.
    pub mr: String,
    /// The further QPs, in order; absent with one QP, so that a one-QP hello reads as it
    /// always has.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more_qps: Vec<QpHello>,
}

/// One further QP of a [`Hello`].
#[derive(serde::Serialize, serde::Deserialize)]
pub struct QpHello {
    /// `QPN:PSN:MTU:GID`.
    pub qp: String,
    /// `ADDR:RKEY` of this QP's part of the buffer.
    pub mr: String,
}

impl Hello {
    /// Every QP announced, first to last: its information and its buffer.
    pub fn parse(&self) -> Result<Vec<(RemoteInfo, RemoteAddr)>, Error> {
        std::iter::once((&self.qp, &self.mr))
            .chain(self.more_qps.iter().map(|q| (&q.qp, &q.mr)))
            .map(|(qp, mr)| Ok((qp.parse()?, mr.parse()?)))
            .collect()
    }
}

/// One side's verbs objects: a CQ (on a channel with events), one or more RC QPs that all
/// complete into it (perftest's `-q` shares one CQ between its QPs too) and a buffer.
pub struct Side {
    /// The completion channel, when completions are waited for by events.
    pub channel: Option<CompChannel>,
    /// Send and receive completions of every QP.
    pub cq: Cq,
    /// The RC QP (the first of several).
    pub qp: Qp,
    /// The further RC QPs ([`Side::with_qps`]); empty for one.
    pub more_qps: Vec<Qp>,
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
    /// WRs, room for `inline` bytes of inline data; every send signaled; the QP moved to
    /// INIT.
    pub fn new(
        ctx: &Context,
        len: usize,
        send_depth: u32,
        recv_depth: u32,
        inline: u32,
        events: bool,
    ) -> Result<Side, Error> {
        Side::with_qps(ctx, 1, len, send_depth, recv_depth, inline, events)
    }

    /// As [`Side::new`], with `qps` RC QPs (at least one), each with its own `send_depth`
    /// and `recv_depth`, all completing into one CQ large enough for all of them.
    pub fn with_qps(
        ctx: &Context,
        qps: u32,
        len: usize,
        send_depth: u32,
        recv_depth: u32,
        inline: u32,
        events: bool,
    ) -> Result<Side, Error> {
        let pd = ctx.alloc_pd();
        let channel = if events {
            Some(ctx.create_comp_channel()?)
        } else {
            None
        };
        let entries = send_depth
            .saturating_add(recv_depth)
            .saturating_mul(qps.max(1))
            .saturating_add(16);
        let mut builder = ctx.cq_builder(entries);
        if let Some(channel) = &channel {
            builder = builder.channel(channel);
        }
        let cq = builder.build()?;
        let new_qp = || -> Result<Qp, Error> {
            let qp = pd
                .qp_builder(QpType::Rc, &cq, &cq)
                .max_send_wr(send_depth)
                .max_recv_wr(recv_depth.max(1))
                .max_inline_data(inline)
                .sq_sig_all(true)
                .build()?;
            qp.to_init(
                AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
            )?;
            Ok(qp)
        };
        let qp = new_qp()?;
        let more_qps = (1..qps).map(|_| new_qp()).collect::<Result<Vec<_>, _>>()?;
        let len = len.max(PAGE_SIZE);
        let mr = pd.reg_mr(len, ALL_ACCESS).map_err(|e| {
            let hint = match e {
                softverbs::Error::Register(
                    RegisterError::OverMemlock { .. } | RegisterError::MemlockNotPermitted,
                ) => {
                    " (a limit of locked memory: raise it with `ulimit -l`, or use smaller \
                     messages, -s)"
                }
                _ => "",
            };
            format!("cannot register a buffer of {len} bytes: {e}{hint}")
        })?;
        if channel.is_some() {
            cq.req_notify(false);
        }
        Ok(Side {
            channel,
            cq,
            qp,
            more_qps,
            mr,
        })
    }

    /// Every QP, the first first.
    pub fn qps(&self) -> impl Iterator<Item = &Qp> {
        std::iter::once(&self.qp).chain(&self.more_qps)
    }

    /// This side's hello: each QP announcing a PSN of its own (`ibv_rc_pingpong` and
    /// perftest draw one per QP), QP `i` the buffer from `i * part` bytes on.
    pub fn hello(&self, mtu: Mtu, part: usize) -> Hello {
        let mut announced = self.qps().enumerate().map(|(i, qp)| {
            let mut info = qp.local_info(random_psn());
            info.mtu = info.mtu.min(mtu);
            let offset = (i as u64).saturating_mul(part as u64);
            (
                info.to_string(),
                self.mr.remote().offset(offset).to_string(),
            )
        });
        let (qp, mr) = announced.next().unwrap_or_default();
        Hello {
            qp,
            mr,
            more_qps: announced.map(|(qp, mr)| QpHello { qp, mr }).collect(),
        }
    }

    /// Moves the QP to RTR towards `peer` and to RTS sending from `my_psn`.
    pub fn connect(&self, peer: RemoteInfo, my_psn: u32) -> Result<(), Error> {
        connect_qp(&self.qp, peer, my_psn)
    }

    /// Connects QP `i` to the peer's QP `i`, sending from the PSN `mine` announced for it;
    /// returns the peer's buffer of each QP. The two hellos must announce as many QPs as
    /// this side has.
    pub fn connect_all(&self, mine: &Hello, peer: &Hello) -> Result<Vec<RemoteAddr>, Error> {
        let (mine, peer) = (mine.parse()?, peer.parse()?);
        let count = self.qps().count();
        if mine.len() != count {
            return Err(format!("this side has {count} QP(s), its hello {}", mine.len()).into());
        }
        if peer.len() != count {
            return Err(format!(
                "the peer announced {} QP(s) where this side has {count} (-q {count}): is the \
                 peer a softverbs older than -q?",
                peer.len()
            )
            .into());
        }
        self.qps()
            .zip(mine.iter().zip(&peer))
            .map(|(qp, ((me, _), (info, addr)))| {
                connect_qp(qp, *info, me.psn)?;
                Ok(*addr)
            })
            .collect()
    }

    /// Polls completions into `wcs`, waiting up to [`PATIENCE`] for at least one (see
    /// [`Side::wait_until`]); none by then is an error.
    pub fn wait(&self, wcs: &mut [WorkCompletion]) -> Result<usize, Error> {
        match self.wait_until(wcs, Instant::now() + PATIENCE)? {
            0 => Err(format!(
                "timed out waiting for a completion ({} s)",
                PATIENCE.as_secs()
            )
            .into()),
            n => Ok(n),
        }
    }

    /// Polls completions into `wcs`, waiting until `deadline` for at least one: by busy
    /// polling, or with a channel by sleeping on it (arm, check, then wait, as
    /// `ibv_get_cq_event(3)` describes). 0 when the deadline passed with none; a failed
    /// completion is an error.
    pub fn wait_until(
        &self,
        wcs: &mut [WorkCompletion],
        deadline: Instant,
    ) -> Result<usize, Error> {
        let mut empty_polls = 0u32;
        loop {
            let n = self.try_poll(wcs)?;
            if n > 0 {
                return Ok(n);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(0);
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

/// Moves `qp` to RTR towards `peer` and to RTS sending from `my_psn`.
fn connect_qp(qp: &Qp, peer: RemoteInfo, my_psn: u32) -> Result<(), Error> {
    qp.to_rtr(RtrAttr::from(peer).max_dest_rd_atomic(16))?;
    qp.to_rts(RtsAttr::new(my_psn).max_rd_atomic(16))?;
    Ok(())
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

/// A device's counters that explain a result: what it sent and received, what it sent
/// again and why, what it dropped, and the faults it injected (SOFTVERBS_FAULTS).
#[derive(serde::Serialize, Debug, Default, Clone, Copy)]
pub struct DeviceCounters {
    /// Packets the engine sent.
    pub packets_sent: u64,
    /// Of those, the ones that crossed the kernel's UDP stack.
    pub udp_packets_sent: u64,
    /// Of those, the ones put into the shared-memory inbox of a device of another process
    /// of this host (no system call).
    pub shm_packets_sent: u64,
    /// Of those, the ones handed to a device of this process directly (no transport).
    pub in_process_packets_sent: u64,
    /// Packets the engine received.
    pub packets_received: u64,
    /// Request packets sent again (go-back-N).
    pub retransmitted_packets: u64,
    /// Go-back-N restarts (timeout, NAK, implied NAK).
    pub go_back_n_restarts: u64,
    /// Local ACK timeouts with work outstanding.
    pub ack_timeouts: u64,
    /// NAKs received.
    pub naks_received: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// Duplicate requests received.
    pub duplicates_received: u64,
    /// Packets the engine dropped, every reason.
    pub packets_dropped: u64,
    /// What the fault injector did, when SOFTVERBS_FAULTS is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub faults: Option<InjectedFaults>,
}

/// What a device's fault injector did to its outgoing packets.
#[derive(serde::Serialize, Debug, Default, Clone, Copy)]
pub struct InjectedFaults {
    /// Packets dropped.
    pub dropped: u64,
    /// Extra copies sent.
    pub duplicated: u64,
    /// Packets with a flipped bit (lost at the receiver's ICRC check).
    pub corrupted: u64,
    /// Packets held back for the delay.
    pub delayed: u64,
    /// Packets swapped with the next one.
    pub reordered: u64,
}

impl DeviceCounters {
    /// The counters of `ctx`'s device now.
    pub fn of(ctx: &Context) -> DeviceCounters {
        let device = ctx.device();
        let c = device.counters();
        // Every packet the engine sent went through the transport (UDP, or the shared-memory
        // inbox of another process's device) or was handed over within this process.
        let (udp, shm) = device.stats().transport.map_or((0, 0), |t| {
            (t.sent_packets - t.shm_sent_packets, t.shm_sent_packets)
        });
        DeviceCounters {
            packets_sent: c.packets_sent,
            udp_packets_sent: udp,
            shm_packets_sent: shm,
            in_process_packets_sent: c.packets_sent.saturating_sub(udp + shm),
            packets_received: c.packets_received,
            retransmitted_packets: c.retransmitted_packets,
            go_back_n_restarts: c.retries,
            ack_timeouts: c.timeouts,
            naks_received: c.naks_received,
            rnr_naks_received: c.rnr_naks_received,
            duplicates_received: c.duplicates_received,
            packets_dropped: c.total_drops(),
            faults: device.fault_counters().map(|f| InjectedFaults {
                dropped: f.dropped,
                duplicated: f.duplicated,
                corrupted: f.corrupted,
                delayed: f.delayed,
                reordered: f.reordered,
            }),
        }
    }
}

/// One line, `LABEL device: N packets sent, ...`, and the faults injected if any.
impl std::fmt::Display for DeviceCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let paths = [
            ("UDP", self.udp_packets_sent),
            ("shared memory", self.shm_packets_sent),
            ("in-process", self.in_process_packets_sent),
        ];
        let paths: Vec<String> = paths
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(path, n)| format!("{path} {n}"))
            .collect();
        write!(
            f,
            "{} packets sent ({}), {} received, {} retransmitted ({} go-back-N restarts, {} \
             ACK timeouts), {} NAKs and {} RNR NAKs received, {} duplicates, {} dropped",
            self.packets_sent,
            if paths.is_empty() {
                "none".to_owned()
            } else {
                paths.join(", ")
            },
            self.packets_received,
            self.retransmitted_packets,
            self.go_back_n_restarts,
            self.ack_timeouts,
            self.naks_received,
            self.rnr_naks_received,
            self.duplicates_received,
            self.packets_dropped
        )?;
        if let Some(x) = &self.faults {
            write!(
                f,
                "; faults injected (SOFTVERBS_FAULTS): {} dropped, {} duplicated, {} corrupted, \
                 {} delayed, {} reordered",
                x.dropped, x.duplicated, x.corrupted, x.delayed, x.reordered
            )?;
        }
        Ok(())
    }
}
