//! The verbs core: the tier both front doors stand on.
//!
//! The safe API above (this crate's types: [`Context`](crate::Context), [`Pd`](crate::Pd),
//! [`Mr`](crate::Mr), …) adds typing, ownership and lifetimes; the drop-in
//! `libibverbs.so.1` (`softverbs-capi`) adds ABI translation — pointers ↔ handles,
//! `repr(C)` layouts, errno — and reaches the device only through this module. The rules of
//! the man pages live below it, once, where both front doors meet them:
//!
//! | module | holds | rules it owns |
//! |---|---|---|
//! | [`device`] | [`device::Device`]: QP1's management datagrams for the drop-in's private `softverbs_gsi_*` exports ([`device::Device::gsi_send`], [`device::Device::gsi_recv`], [`device::Device::gsi_fd`]); the verbs objects of one device (protection domains and what holds them, memory regions, QPs, SRQs, address handles), registered memory, the runtime | registration (mapped range, access, `RLIMIT_MEMLOCK`), a PD's users (`ibv_dealloc_pd`: `EBUSY`), unknown PDs (`EINVAL`), the GID table, faults in registered memory |
//! | [`engine`] | the sans-IO queue-pair engine | QP states, transitions and attribute values, capacities against the device's limits, which opcodes and flags a QP type takes, address vectors (`sgid_index`, port), SRQ sizes and use, every completion status; what QP1 takes as a management datagram ([`engine::GsiMad`], IBTA 13.5) |
//! | [`cq`] | the completion queue | `ibv_poll_cq`, notification, channels, overrun, resize, moderation, a CQ in use (`EBUSY`) |
//!
//! Every refusal is one [`Error`]: the layers below state causes ([`engine::VerbsError`],
//! [`device::RegisterError`], the CQ's [`cq::CreateError`] and [`cq::ResizeError`], …),
//! each converting into it, and [`Error::errno`] is the one place a cause becomes the
//! errno libibverbs reports.
//!
//! A second backend (rdma-core's own `libibverbs.so.1` loaded at run time, for kernel rxe
//! and real NICs) would sit here, under the safe API's types, which hold this tier's
//! handles and never show them.

pub mod error;

pub use error::Error;
pub use softverbs_cq as cq;
pub use softverbs_device as device;
pub use softverbs_proto as engine;
