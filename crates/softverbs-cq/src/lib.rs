//! The softverbs completion-queue core.
//!
//! Everything a verbs completion queue is, exactly as the libibverbs man pages specify it
//! (`ibv_poll_cq(3)`, `ibv_create_cq_ex(3)`, `ibv_req_notify_cq(3)`, `ibv_get_cq_event(3)`,
//! `ibv_create_comp_channel(3)`, `ibv_resize_cq(3)`, `ibv_modify_cq(3)`): the `ibv_wc`-layout
//! [`WorkCompletion`], the ring producers push into and consumers poll from, extended
//! polling, notification arming, completion channels, overrun, resize, moderation and
//! completion timestamps. The device, the safe API and the C drop-in only feed and expose it.
//!
//! The unsafe code is about concurrency — the ring pointer that resize replaces
//! (`cq/mod.rs`, `cq/resize.rs`), the lock-free consumer paths — plus one memory contract:
//! a ring's arrays may live in memory the application's allocator provides
//! ([`RingAllocator`], `memory.rs`, for a CQ in a parent domain). Every shared access is an
//! atomic with its ordering explained where it is used; the concurrency is checked by loom
//! models (`RUSTFLAGS="--cfg loom" cargo test -p softverbs-cq --test loom`) and the memory
//! contract by Miri (`tests/miri_ring.rs`).

pub mod channel;
pub mod clock;
pub mod cq;
pub mod error;
pub mod memory;
mod ring;
mod sync;
pub mod wc;

pub use channel::{CompletionChannel, CqEvent};
pub use clock::{DeviceClock, DEVICE_CLOCK_KHZ, DEVICE_CLOCK_MASK};
pub use cq::{
    moderation_in_use, CompletionQueue, CqBuilder, CqOverrun, CqProducer, CqStats, Moderation,
    OverrunPolicy, OverrunSink, PollBatch, ProducerBurst, SingleThreadedCq, MAX_CQE,
};
pub use error::{
    CreateError, DestroyError, FieldNotRequested, ModifyError, PollError, PushError, ResizeError,
};
pub use memory::{RingAllocator, RingLayout, RingMemory, RingResource, SharedRingAllocator};
pub use ring::WcExtra;
pub use sync::await_membarrier;
pub use wc::{Completed, Failed, RawFields, WcFields, WcFlags, WcOpcode, WcStatus, WorkCompletion};
