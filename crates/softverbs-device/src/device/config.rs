//! How to open a device: [`DeviceConfig`] (name, [`Network`], engine limits, progress
//! thread, fault injection, capture), and what the environment adds to it
//! ([`DeviceConfig::with_env`]): a capture file ([`PCAP_ENV`], capped by
//! `SOFTVERBS_PCAP_LIMIT`) and fault rules ([`FAULTS_ENV`], parsed by [`parse_faults`]).
//!
//! Nothing here opens a socket: the configuration is data until
//! [`Device::open`](super::Device::open) builds the transport stack from it. A malformed
//! variable is an error, never silently ignored.

use crate::fault::FaultConfig;
use crate::pcap::Capture;
use crate::udp::UdpConfig;
use softverbs_proto::EngineConfig;
use std::io;
use std::sync::Arc;
use std::time::Duration;

/// Where the device's packets go.
#[derive(Clone, Debug)]
pub enum Network {
    /// Only devices of this process (no socket); the device gets an address in
    /// 127.1.0.0/16 that no socket uses.
    InProcess,
    /// RoCEv2 over UDP (reaches other processes and hosts), as configured.
    Udp(UdpConfig),
}

/// How to open a device.
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// The device name (`ibv_get_device_name`).
    pub name: String,
    /// Where packets go.
    pub network: Network,
    /// Protocol limits and the port MTU.
    pub engine: EngineConfig,
    /// Whether to start the progress thread (tests of the sans-IO paths may not want it).
    pub progress_thread: bool,
    /// Fault injection (drop, duplicate, delay, reorder, corrupt) on every packet the
    /// device sends, over UDP or to a device of this process (in-process devices too),
    /// switchable at run time through the shared [`FaultConfig`].
    pub faults: Option<FaultSetup>,
    /// Capture of every packet the device sends and receives, over UDP or to and from a
    /// device of this process (in-process devices too).
    pub capture: Option<Arc<Capture>>,
    /// Whether a UDP device hands its packets for devices of other processes of this host
    /// (same user, same PID and network namespaces) through shared memory instead of the socket
    /// ([`HostTransport`](crate::shm::HostTransport)); true unless
    /// `SOFTVERBS_NETWORK=udp`. No effect in-process.
    pub shared_memory: bool,
}

/// Fault injection for a device: the rules (shared, changeable while running) and the
/// seed of the device's random draws.
#[derive(Clone, Debug)]
pub struct FaultSetup {
    /// The rules.
    pub config: Arc<FaultConfig>,
    /// The seed.
    pub seed: u64,
}

/// Environment variable naming a capture file to record the device's traffic into: pcapng
/// if the name ends in `.pcapng`, classic pcap otherwise
/// ([`CaptureFormat::for_path`](crate::pcap::CaptureFormat::for_path)).
pub const PCAP_ENV: &str = "SOFTVERBS_PCAP";

/// Environment variable choosing a device's network ([`DeviceConfig::from_env`]): `auto`
/// (the default: RoCEv2 over UDP, and shared memory to the devices of other processes of
/// this host), `udp` (RoCEv2 over UDP to every peer, e.g. to test the wire) or `inprocess`
/// (devices of this process only).
pub const NETWORK_ENV: &str = "SOFTVERBS_NETWORK";

/// Which network [`NETWORK_ENV`] asks for.
///
/// ```
/// use softverbs_device::{Device, DeviceConfig, NetworkKind};
/// let device = Device::open(DeviceConfig::in_process())?;
/// assert!(device.transport_counters().is_none()); // NetworkKind::InProcess
/// # let _ = NetworkKind::Udp;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetworkKind {
    /// Devices of this process only.
    InProcess,
    /// RoCEv2 over UDP (with shared memory to devices of this host unless
    /// `SOFTVERBS_NETWORK=udp`).
    Udp,
}

/// The network [`NETWORK_ENV`] asks for: `Udp` when unset, `auto` or `udp`; the value
/// itself when it is none of those nor `inprocess` (`in-process`), any case.
pub fn network_from_env() -> Result<NetworkKind, String> {
    match std::env::var(NETWORK_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(NetworkKind::Udp),
        Ok(v) if v.eq_ignore_ascii_case("udp") || v.eq_ignore_ascii_case("auto") => {
            Ok(NetworkKind::Udp)
        }
        Ok(v) if v.eq_ignore_ascii_case("inprocess") || v.eq_ignore_ascii_case("in-process") => {
            Ok(NetworkKind::InProcess)
        }
        Ok(v) => Err(v),
        Err(std::env::VarError::NotUnicode(v)) => Err(v.to_string_lossy().into_owned()),
    }
}
/// Environment variable with fault-injection rules, e.g.
/// `drop=0.05,duplicate=0.01,corrupt=0.001,delay=0.01:2ms,reorder=0.01:1ms,seed=7`.
pub const FAULTS_ENV: &str = "SOFTVERBS_FAULTS";

/// The [`FAULTS_ENV`] syntax, as its errors state it.
const FAULTS_SYNTAX: &str = "comma-separated rules: drop=P, duplicate=P, corrupt=P, \
                             delay=P:TIME, reorder=P:TIME, seed=N (P in 0..=1, TIME like 2ms)";

/// Parses fault rules in the [`FAULTS_ENV`] syntax.
pub fn parse_faults(spec: &str) -> Result<FaultSetup, String> {
    let config = FaultConfig::new();
    let mut seed = 1;
    let duration = |v: &str| -> Result<Duration, String> {
        let v = v.trim();
        let (num, scale) = if let Some(n) = v.strip_suffix("us") {
            (n, 1_000)
        } else if let Some(n) = v.strip_suffix("ms") {
            (n, 1_000_000)
        } else if let Some(n) = v.strip_suffix('s') {
            (n, 1_000_000_000)
        } else {
            return Err(format!("duration {v:?} needs a unit (us, ms, s)"));
        };
        let n: u64 = num.parse().map_err(|_| format!("bad duration {v:?}"))?;
        Ok(Duration::from_nanos(n * scale))
    };
    let probability = |v: &str| -> Result<f64, String> {
        let p: f64 = v.parse().map_err(|_| format!("bad probability {v:?}"))?;
        if (0.0..=1.0).contains(&p) {
            Ok(p)
        } else {
            Err(format!("probability {p} outside 0..=1"))
        }
    };
    for item in spec.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| format!("{item:?} is not key=value"))?;
        match key.trim() {
            "drop" => config.set_drop(probability(value)?),
            "duplicate" => config.set_duplicate(probability(value)?),
            "corrupt" => config.set_corrupt(probability(value)?),
            "delay" | "reorder" => {
                let (p, d) = value
                    .split_once(':')
                    .ok_or_else(|| format!("{key} wants probability:duration"))?;
                if key == "delay" {
                    config.set_delay(probability(p)?, duration(d)?);
                } else {
                    config.set_reorder(probability(p)?, duration(d)?);
                }
            }
            "seed" => {
                seed = value
                    .trim()
                    .parse()
                    .map_err(|_| format!("bad seed {value:?}"))?
            }
            other => return Err(format!("unknown fault rule {other:?}")),
        }
    }
    Ok(FaultSetup { config, seed })
}

impl DeviceConfig {
    /// An in-process device with default limits.
    pub fn in_process() -> Self {
        DeviceConfig {
            name: "softverbs0".into(),
            network: Network::InProcess,
            engine: EngineConfig::default(),
            progress_thread: true,
            faults: None,
            capture: None,
            shared_memory: true,
        }
    }

    /// A UDP device with this configuration and default limits.
    pub fn udp(udp: UdpConfig) -> Self {
        DeviceConfig {
            network: Network::Udp(udp),
            ..DeviceConfig::in_process()
        }
    }

    /// Adds what the environment asks for: a capture file ([`PCAP_ENV`]) and fault rules
    /// ([`FAULTS_ENV`]).
    pub fn with_env(mut self) -> io::Result<Self> {
        if let Some(path) = std::env::var_os(PCAP_ENV) {
            // The capture's error names the file (and a missing folder); this names the
            // variable that asked for it.
            let capture = Capture::create(&path)
                .map_err(|e| io::Error::new(e.kind(), format!("{PCAP_ENV}: {e}")))?;
            if let Some(limit) = std::env::var_os(crate::pcap::PCAP_LIMIT_ENV) {
                let limit = crate::pcap::parse_size(&limit.to_string_lossy()).map_err(|e| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{}: {e}", crate::pcap::PCAP_LIMIT_ENV),
                    )
                })?;
                capture.set_limit(limit);
            }
            self.capture = Some(capture);
        }
        if let Some(spec) = std::env::var_os(FAULTS_ENV) {
            let spec = spec.to_string_lossy();
            self.faults = Some(parse_faults(&spec).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{FAULTS_ENV}={spec:?}: {e}; expected {FAULTS_SYNTAX}"),
                )
            })?);
        }
        Ok(self)
    }

    /// A UDP device configured from the environment (`SOFTVERBS_ADDR`, else the first free
    /// 127.0.0.x:4791; `SOFTVERBS_IPV4_ICRC`, `SOFTVERBS_UDP_OFFLOAD`: see
    /// [`UdpConfig::from_env`]), with shared memory to devices of this host unless
    /// [`NETWORK_ENV`] is `udp`.
    pub fn udp_from_env() -> io::Result<Self> {
        let wire_only = std::env::var(NETWORK_ENV).is_ok_and(|v| v.eq_ignore_ascii_case("udp"));
        Ok(DeviceConfig {
            shared_memory: !wire_only,
            ..DeviceConfig::udp(UdpConfig::from_env()?).with_env()?
        })
    }

    /// The device the environment asks for, as every front door opens it: the network of
    /// [`NETWORK_ENV`] (for UDP, `SOFTVERBS_ADDR` as [`DeviceConfig::udp_from_env`] reads
    /// it), with the capture and faults of [`DeviceConfig::with_env`]. A bad
    /// `SOFTVERBS_NETWORK` is `InvalidInput` naming the variable and its value.
    pub fn from_env() -> io::Result<Self> {
        match network_from_env() {
            Ok(NetworkKind::InProcess) => DeviceConfig::in_process().with_env(),
            Ok(NetworkKind::Udp) => DeviceConfig::udp_from_env(),
            Err(value) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{NETWORK_ENV}={value:?}: expected \"auto\", \"udp\" or \"inprocess\""),
            )),
        }
    }
}
