//! Typed errors of every CQ operation, each mapping to the errno libibverbs documents for
//! it (`errno()`), which only the C boundary turns into a number.

use crate::wc::{WcFields, WorkCompletion};
use thiserror::Error;

/// Why a CQ could not be created (`ibv_create_cq(3)`, `ibv_create_cq_ex(3)`).
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum CreateError {
    /// A CQ needs at least one entry.
    #[error("a CQ needs at least one entry (cqe = 0)")]
    ZeroSize,
    /// More entries than the device supports (`max_cqe`).
    #[error("{requested} CQ entries requested, the device supports at most {max}")]
    TooLarge {
        /// What was asked for.
        requested: u64,
        /// The device maximum.
        max: u32,
    },
    /// `wc_flags` outside `IBV_CREATE_CQ_SUP_WC_FLAGS`.
    #[error("unsupported wc_flags {0:#x}")]
    UnsupportedFields(u64),
}

impl CreateError {
    /// The errno libibverbs reports: `EINVAL` for sizes, `EOPNOTSUPP` for unknown flags.
    pub const fn errno(&self) -> i32 {
        match self {
            CreateError::ZeroSize | CreateError::TooLarge { .. } => libc_errno::EINVAL,
            CreateError::UnsupportedFields(_) => libc_errno::EOPNOTSUPP,
        }
    }
}

/// Why a poll failed (`ibv_poll_cq(3)`: "On failure, a negative value is returned").
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum PollError {
    /// The CQ overran and is in the error state: `ibv_poll_cq(3)`, "In case of a CQ
    /// overrun, the async event IBV_EVENT_CQ_ERR will be triggered, and the CQ cannot be
    /// used."
    #[error("the CQ overran and is in the error state")]
    Overrun,
}

impl PollError {
    /// The errno the C side reports.
    pub const fn errno(&self) -> i32 {
        libc_errno::EIO
    }
}

/// Why a producer could not add a completion.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum PushError {
    /// The CQ is full and its policy is back-pressure: nothing was lost, the completion is
    /// handed back and the producer must hold it until the consumer polls.
    #[error("the CQ is full (back-pressure): completion handed back")]
    Full(WorkCompletion),
    /// This push overran the CQ: the CQ is now in the error state and `IBV_EVENT_CQ_ERR`
    /// was raised. The completion is lost, as the spec says.
    #[error("CQ overrun: the CQ entered the error state")]
    Overrun,
    /// The CQ was already in the error state.
    #[error("the CQ is in the error state")]
    InError,
    /// The CQ was destroyed.
    #[error("the CQ was destroyed")]
    Destroyed,
}

/// Why `resize` failed (`ibv_resize_cq(3)`).
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum ResizeError {
    /// `ibv_resize_cq(3)`: "cqe must be at least the number of unpolled entries in the CQ".
    #[error("{requested} entries cannot hold the {outstanding} unpolled completions")]
    TooSmall {
        /// What was asked for.
        requested: u32,
        /// Completions waiting in the CQ.
        outstanding: u64,
    },
    /// Zero or above the device maximum.
    #[error(transparent)]
    Size(#[from] CreateError),
    /// The CQ is in the error state.
    #[error("the CQ is in the error state")]
    InError,
}

impl ResizeError {
    /// The errno libibverbs reports: `EINVAL` (or `EIO` for an errored CQ).
    pub const fn errno(&self) -> i32 {
        match self {
            ResizeError::InError => libc_errno::EIO,
            _ => libc_errno::EINVAL,
        }
    }
}

/// Why a CQ could not be destroyed yet (`ibv_destroy_cq(3)`).
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum DestroyError {
    /// `ibv_destroy_cq(3)`: "fails if any queue pair is still associated with this CQ".
    #[error("{0} queue pairs still use this CQ")]
    QueuePairsAttached(usize),
    /// `ibv_get_cq_event(3)`: "destroying a CQ will wait for all completion events to be
    /// acknowledged". The non-waiting form refuses instead.
    #[error("{0} completion events were delivered but not acknowledged")]
    UnacknowledgedEvents(u64),
}

impl DestroyError {
    /// The errno the C side reports: `EBUSY`.
    pub const fn errno(&self) -> i32 {
        libc_errno::EBUSY
    }
}

/// Reading a field the extended CQ was not asked for at creation (`ibv_create_cq_ex(3)`:
/// "Only fields that the user requested via wc_flags in ibv_create_cq_ex could be queried").
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
#[error("field {0:?} was not requested in wc_flags when the CQ was created")]
pub struct FieldNotRequested(pub WcFields);

/// Why `modify` (moderation) failed (`ibv_modify_cq(3)`).
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum ModifyError {
    /// The CQ is in the error state.
    #[error("the CQ is in the error state")]
    InError,
}

/// The errno values this crate reports (Linux numbering).
pub mod libc_errno {
    /// Operation not permitted.
    pub const EPERM: i32 = 1;
    /// No such entry (empty CQ in extended polling).
    pub const ENOENT: i32 = 2;
    /// I/O error.
    pub const EIO: i32 = 5;
    /// Try again (non-blocking channel with no event).
    pub const EAGAIN: i32 = 11;
    /// Out of memory.
    pub const ENOMEM: i32 = 12;
    /// Resource busy.
    pub const EBUSY: i32 = 16;
    /// Invalid argument.
    pub const EINVAL: i32 = 22;
    /// Operation not supported.
    pub const EOPNOTSUPP: i32 = 95;
}
