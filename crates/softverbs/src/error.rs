//! Errors. Every verb of the safe API fails with [`Error`], the verbs core's one error
//! type: one variant per cause, and [`Error::errno`], the errno libibverbs reports for the
//! same failure (the drop-in returns exactly that number). A bad argument or attribute is
//! always one of these values, never a panic.
//!
//! The causes below it are re-exported here so that a caller can match them:
//! [`VerbsError`] (attributes, states, capacities, work requests, objects still in use),
//! [`RegisterError`] (`ibv_reg_mr`), [`CqCreateError`] and [`ResizeError`] (CQ sizes),
//! [`PollError`] (a CQ in the error state, the one failure of the polling hot path, which
//! converts into [`Error`] with `?`).

pub use crate::core::error::Error;
pub use softverbs_cq::{CreateError as CqCreateError, PollError, ResizeError};
pub use softverbs_device::RegisterError;
pub use softverbs_proto::{Capacity, Object, PostVerb, Queue, VerbsError};

/// A byte range outside a memory region, or too long for one scatter/gather entry (the
/// safe API's own slicing of a region, not a verb).
///
/// ```
/// use softverbs::{AccessFlags, Context, DeviceConfig};
/// let mr = Context::open_with(DeviceConfig::in_process())?.alloc_pd().reg_mr(16, AccessFlags::empty())?;
/// let err = mr.slice(8..32).unwrap_err();
/// assert_eq!((err.start, err.end, err.len), (8, 32, 16));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("range {start}..{end} is not inside the {len}-byte region (or is longer than u32::MAX)")]
pub struct RangeError {
    /// First byte asked for.
    pub start: usize,
    /// One past the last byte asked for.
    pub end: usize,
    /// The region's length.
    pub len: usize,
}
