//! softverbs-sim: a deterministic simulator for the `softverbs-proto` engine (dev and test
//! only).
//!
//! [`Sim`] joins several [`Engine`](softverbs_proto::Engine)s through a fabric with
//! seeded drop, duplicate, reorder, delay and corrupt rules ([`FaultRules`]) under a
//! virtual clock: nothing sleeps, and a run is a pure function of its seed. After every
//! step the invariants are checked (each completion matches a posted, outstanding work
//! request; send and receive completions of a QP come in posting order; every peer's
//! congestion window counts exactly what its QPs have in flight). A node's receive queue
//! may be bounded like a socket buffer ([`FaultRules::receive_queue`]). The drive loops
//! ([`Sim::run_until`], [`Sim::run_idle`]) are bounded and report livelock or a stall. A
//! failure's message names the seed and how to replay it (`SOFTVERBS_SIM_SEED=<seed>`);
//! `SOFTVERBS_SIM_SOAK=<count>` runs the seeded tests over many more seeds.
//!
//! Memory is [`SimMemory`], in-memory regions behind the engine's `Memory` trait. ICRCs are
//! computed and verified with `softverbs-wire` over synthetic IPv4 headers, so the corrupt
//! rule behaves like a real device (the packet is dropped).
#![forbid(unsafe_code)]

pub mod memory;
pub mod setup;
pub mod sim;

pub use memory::{Mr, Region, SimMemory};
pub use setup::{bring_up, connect, create_qp, run_seeds, seeds, QpParams};
pub use sim::{FabricStats, FaultRules, Intercept, Node, Sim, SimError, SimErrorKind};
