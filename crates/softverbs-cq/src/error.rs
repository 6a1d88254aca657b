//! Typed errors of every CQ operation, one variant per cause. The errno each cause is
//! reported as is decided above this crate, in one place (`softverbs::core::Error`).

use crate::memory::RingResource;
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
    /// The application's allocator returned no memory for the ring (`NULL` from a parent
    /// domain's `alloc`).
    #[error("the application's allocator gave no memory for the CQ's {resource:?}")]
    RingMemoryRefused {
        /// What the memory was for.
        resource: RingResource,
    },
    /// The application's allocator returned memory not aligned as asked; it was handed back.
    #[error("the application's allocator gave {resource:?} memory not aligned to {align} bytes")]
    RingMemoryMisaligned {
        /// What the memory was for.
        resource: RingResource,
        /// The alignment asked for.
        align: usize,
    },
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

/// Why a CQ (`ibv_destroy_cq(3)`) or a completion channel (`ibv_destroy_comp_channel(3)`)
/// could not be destroyed yet.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum DestroyError {
    /// `ibv_destroy_cq(3)`: "fails if any queue pair is still associated with this CQ".
    #[error("{0} queue pairs still use this CQ")]
    QueuePairsAttached(usize),
    /// `ibv_get_cq_event(3)`: "destroying a CQ will wait for all completion events to be
    /// acknowledged". The non-waiting form refuses instead.
    #[error("{0} completion events were delivered but not acknowledged")]
    UnacknowledgedEvents(u64),
    /// `ibv_destroy_comp_channel(3)`: "fails if any CQs are still associated with the
    /// completion event channel being destroyed".
    #[error("{0} CQs still use this completion channel")]
    CqsAttached(usize),
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
