//! The safe Rust API of softverbs, the userspace RDMA device with RoCEv2.
//!
//! | type | verbs object | man page |
//! |---|---|---|
//! | [`Context`] ([`devices`]) | `ibv_context` | `ibv_open_device(3)`, `ibv_query_device(3)`, `ibv_get_async_event(3)` |
//! | [`Pd`] | `ibv_pd` | `ibv_alloc_pd(3)` |
//! | [`Mr`], [`MrSlice`], [`RemoteAddr`] | `ibv_mr`, `ibv_sge` | `ibv_reg_mr(3)` |
//! | [`OdpMr`], [`Advice`] | `ibv_mr` (`IBV_ACCESS_ON_DEMAND`) | `ibv_reg_mr(3)`, `ibv_advise_mr(3)` |
//! | [`Cq`], [`LocalCq`], [`CqBuilder`], [`PollBatch`] | `ibv_cq`, `ibv_cq_ex` | `ibv_create_cq_ex(3)`, `ibv_poll_cq(3)`, `ibv_req_notify_cq(3)` |
//! | [`CompChannel`], [`CqEvent`] | `ibv_comp_channel` | `ibv_get_cq_event(3)` |
//! | [`Qp`], [`QpBuilder`], [`InitAttr`], [`RtrAttr`], [`RtsAttr`], [`RemoteInfo`] | `ibv_qp` | `ibv_create_qp(3)`, `ibv_modify_qp(3)` |
//! | [`SendRequest`], [`RecvRequest`] | `ibv_send_wr`, `ibv_recv_wr` | `ibv_post_send(3)`, `ibv_post_recv(3)` |
//! | [`Srq`] | `ibv_srq` | `ibv_create_srq(3)` |
//! | [`Ah`], [`AhAttr`] | `ibv_ah` | `ibv_create_ah(3)` |
//!
//! # What the types guarantee
//!
//! - **No use after destroy.** Every object holds its parents (`Arc`s): an MR, QP, SRQ or
//!   AH keeps its PD and context alive; a QP keeps its CQs and SRQ alive, and
//!   [`Cq::destroy`] / [`Srq::destroy`] refuse, handing the object back with the error,
//!   while a QP uses them. Dropping an object destroys it.
//! - **No undefined behaviour from safe code.** An [`Mr`] owns its page-aligned buffer;
//!   the application copies in and out ([`Mr::write_at`], [`Mr::read_at`]) and never holds
//!   a reference into memory the device may write. Work requests name memory as
//!   [`MrSlice`]s, checked when made; the device reaches memory only through its
//!   registration table, so a request naming an MR dropped meanwhile completes with an
//!   error status instead of touching freed memory. An on-demand region over memory the
//!   API does not own ([`OdpMr`]) is the exception, and `unsafe` to create: its caller
//!   promises what the type system cannot see.
//! - **Errors are values.** Every operation has its own error type with `errno()`; a bad
//!   attribute, mask, transition or range never panics.
//! - **Polling makes progress.** [`Cq::poll`] runs the device's progress once when it finds
//!   the CQ empty, so busy polling needs no other thread; a progress thread also runs.
//!
//! # Opening a device
//!
//! [`Context::open`] follows the environment: `SOFTVERBS_NETWORK=inprocess|udp` (default
//! `udp`: RoCEv2 over UDP port 4791, reaching other processes and hosts) and, for UDP,
//! `SOFTVERBS_ADDR` (`IP`, `IP:PORT` or `[IPv6]:PORT`; unset, the first free 127.0.0.x).
//! [`Context::open_with`] takes an explicit [`DeviceConfig`]; the examples here use
//! in-process devices, which reach each other with no socket.
//!
//! # Features
//!
//! - `tokio`: `AsyncCompChannel` and `AsyncEvents`, completion and async events as
//!   cancellation-safe futures over the event fds. Without it, the fds are still
//!   [`AsFd`](std::os::fd::AsFd) for any other event loop.
//!
//! # Example: an RC send between two in-process devices
//!
//! ```
//! use softverbs::*;
//!
//! let (a, b) = (
//!     Context::open_with(DeviceConfig::in_process())?,
//!     Context::open_with(DeviceConfig::in_process())?,
//! );
//! let (pd_a, pd_b) = (a.alloc_pd(), b.alloc_pd());
//! let (cq_a, cq_b) = (a.create_cq(16)?, b.create_cq(16)?);
//! let qp_a = pd_a.qp_builder(QpType::Rc, &cq_a, &cq_a).sq_sig_all(true).build()?;
//! let qp_b = pd_b.qp_builder(QpType::Rc, &cq_b, &cq_b).build()?;
//! for (me, peer) in [(&qp_a, &qp_b), (&qp_b, &qp_a)] {
//!     me.to_init(AccessFlags::empty())?;
//!     me.to_rtr(peer.local_info(0))?;
//!     me.to_rts(RtsAttr::new(0))?;
//! }
//! let mr_a = pd_a.reg_mr(64, AccessFlags::LOCAL_WRITE)?;
//! let mr_b = pd_b.reg_mr(64, AccessFlags::LOCAL_WRITE)?;
//! qp_b.post_recv(RecvRequest::new(1, &[mr_b.slice(..)?]))?;
//! mr_a.write_at(0, b"hello")?;
//! qp_a.post_send(SendRequest::send(2, &[mr_a.slice(0..5)?]))?;
//!
//! let mut wcs = [WorkCompletion::default(); 4];
//! let n = loop {
//!     match cq_b.poll(&mut wcs)? { 0 => continue, n => break n }
//! };
//! assert_eq!(n, 1);
//! assert_eq!(wcs[0].result().unwrap().byte_len(), 5);
//! assert_eq!(mr_b.read_vec(0..5)?, b"hello");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
// Unsafe code is refused except at the places that cannot avoid it, each allowed where
// it stands: registering memory with the device (`mr.rs`, `odp.rs`) and registering an fd
// with tokio (`tokio_support.rs`).
#![deny(unsafe_code)]

mod ah;
mod context;
pub mod core;
mod cq;
mod domain;
pub mod error;
mod mr;
mod mw;
mod odp;
mod pd;
mod qp;
mod srq;
#[cfg(feature = "tokio")]
mod tokio_support;
mod wr;

pub use ah::{Ah, AhAttr};
pub use context::{devices, Context, DeviceInfo, NetworkKind, NETWORK_ENV};
pub use cq::{AnyCq, CompChannel, Cq, CqBuilder, CqLinkHandle, LocalCq};
pub use domain::{
    ParentDomain, RingAllocator, RingLayout, RingMemory, RingResource, TdCq, ThreadDomain,
};
pub use error::{Error, Object, RangeError, VerbsError};
pub use mr::{Mr, MrChange, MrSlice, ParseError, RemoteAddr, PAGE_SIZE};
pub use mw::{inc_rkey, Mw};
pub use odp::OdpMr;
pub use pd::Pd;
pub use qp::{InitAttr, Qp, QpBuilder, RemoteInfo, RtrAttr, RtsAttr};
pub use srq::Srq;
#[cfg(feature = "tokio")]
pub use tokio_support::{AsyncCompChannel, AsyncEvents};
pub use wr::{RecvRequest, SendRequest};

pub use softverbs_cq::{
    Completed, CqEvent, CqStats, Failed, Moderation, OverrunPolicy, PollBatch, PollError, WcFields,
    WcFlags, WcOpcode, WcStatus, WorkCompletion,
};
pub use softverbs_device::device::OdpCaps;
pub use softverbs_device::memory::Advice;
pub use softverbs_device::{
    AsyncEvent, DeviceAttr, DeviceConfig, Gid, Network, PortAttr, UdpConfig,
};
pub use softverbs_proto::{
    AccessFlags, AttrMask, FlushPlacement, FlushSelectivity, Mtu, QpAttr, QpCaps, QpInit, QpState,
    QpType, Sge, SrqInit, WindowType, MULTICAST_QPN,
};
