//! The softverbs device runtime: the [`Device`] (engine, memory, CQ routing, progress),
//! its asynchronous events, registered memory, and the transports it sends through.
//!
//! | module | holds |
//! |---|---|
//! | [`device`] | [`Device`]: the engine, registered memory, CQ routing, in-process delivery, the progress thread, QP1's management datagrams behind a pollable fd; [`DeviceStats`], the `SOFTVERBS_STATS` line |
//! | [`events`] | [`AsyncEventQueue`]: the async event queue behind a pollable fd, of [`AsyncEvent`]s (the engine's type, re-exported) |
//! | [`memory`] | [`MemoryTable`]: registrations, keys, the one place that copies application memory |
//! | [`transport`] | the [`Transport`] trait, [`Endpoint`] and [`Gid`], counters, UDP source port choice |
//! | [`udp`] | [`UdpTransport`]: real RoCEv2 over UDP sockets (IPv4 and IPv6), automatic 127.0.0.x address, batches in one system call, segmentation offload (GSO / GRO) |
//! | [`shm`] | [`HostTransport`]: a UDP transport and a shared-memory inbox in `/dev/shm`, through which devices of other processes of this host (same user, same PID and network namespaces) hand packets without a system call |
//! | `multicast` | the IP multicast groups a UDP device receives: a socket per group, the epoll set a receiver waits on |
//! | [`loopback`] | [`LoopbackNetwork`] / [`LoopbackTransport`]: several endpoints in one process, no syscalls |
//! | [`fault`] | [`FaultTransport`]: seeded drop / duplicate / delay / reorder / corrupt middleware |
//! | [`pcap`] | [`PcapTransport`]: capture middleware writing Wireshark-readable RoCEv2 pcap or pcapng files (`*.pcapng`: pcapng), and a reader of both |
//! | `logging` | (feature `logging`) the `tracing` subscriber of `SOFTVERBS_LOG` / `RUST_LOG` / `SOFTVERBS_LOG_FILE`, for the programs that install one |
//!
//! The device, the engine below it and the transports log through `tracing` (spans and
//! events, no subscriber of their own): a program that installs none pays one relaxed
//! load per event site reached, and the per-packet paths reach none unless a packet is
//! dropped, retransmitted or faulted.
//!
//! Every transport moves opaque IB transport packets (BTH onward, ICRC included) and owns
//! the IP / UDP encapsulation and the ICRC (IBTA Annex A17); the QP
//! engine above never sees an IP header. Middleware wraps any transport and is itself a
//! transport, so stacks compose: `PcapTransport<FaultTransport<UdpTransport>>`.
//!
//! ```
//! use softverbs_device::transport::udp_src_port_for_qps;
//! use softverbs_device::{LoopbackNetwork, Transport};
//! use softverbs_wire::{BthRepr, Opcode, PacketRepr, Psn, Qpn};
//!
//! let network = LoopbackNetwork::new();
//! let (a, b) = (network.attach_next()?, network.attach_next()?);
//! let repr = PacketRepr {
//!     bth: BthRepr { opcode: Opcode::RC_SEND_ONLY, dest_qp: Qpn::new(313), psn: Psn::new(1), ..BthRepr::default() },
//!     ..PacketRepr::default()
//! };
//! let mut packet = vec![0u8; repr.buffer_len(5)];
//! repr.emit(b"hello", &mut packet).unwrap();
//! let sent = a.send(&b.local(), udp_src_port_for_qps(361, 313), &mut packet)?; // fills the ICRC
//!
//! let mut buf = [0u8; 4096];
//! let received = b.recv(&mut buf, None)?.expect("a packet"); // ICRC verified
//! assert_eq!(&buf[..received.len], &packet[..]);
//! assert_eq!(received.from.addr(), a.local().addr());
//! assert_eq!(received.udp.src_port, sent.udp.src_port);
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! # Tests
//!
//! The tests (`tests/`) use only 127.0.0.0/8 and `::1`, and need: the loopback interface
//! with IPv6 (`::1`); a raw socket (root or `CAP_NET_RAW`) for the two tests that check
//! what the kernel really puts on the wire; and `tshark` (Debian package `tshark`) for the
//! capture-decoding tests. A missing requirement fails the test, never skips it.

mod deferred;
pub mod device;
pub mod events;
pub mod fault;
pub mod guarded;
#[cfg(feature = "logging")]
pub mod logging;
pub mod loopback;
pub mod mappings;
pub mod memory;
mod multicast;
pub mod pcap;
pub mod shm;
pub mod transport;
pub mod udp;

pub use device::{
    network_from_env, parse_faults, AddressHandle, CaptureCounts, CqSummary, Device, DeviceAttr,
    DeviceConfig, DeviceError, DeviceStats, FaultSetup, Network, NetworkKind, PortAttr, FAULTS_ENV,
    NETWORK_ENV, PCAP_ENV, STATS_ENV,
};
pub use events::{AsyncEvent, AsyncEventQueue, EventCounts};
pub use fault::{FaultConfig, FaultCounters, FaultTransport};
pub use loopback::{LoopbackNetwork, LoopbackTransport};
pub use memory::{
    copy_from_shared, copy_to_shared, MemoryTable, Region, RegisterError, Rereg, Window,
};
pub use pcap::{Capture, CaptureFormat, CaptureRecord, Direction, PcapTransport};
pub use shm::HostTransport;
pub use transport::{
    Endpoint, Gid, OutgoingPacket, Received, Sent, Sharing, Transport, TransportCounters,
};
pub use udp::{UdpConfig, UdpTransport};
