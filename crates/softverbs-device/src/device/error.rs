//! [`DeviceError`]: why a verb failed, and [`DeviceError::errno`], the errno the C side
//! reports for it (the engine's and the registration's own errnos, an OS error's code).

use crate::memory::RegisterError;
use softverbs_proto::VerbsError;
use std::io;

/// Why a verb failed.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The engine refused it.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// Registration refused.
    #[error(transparent)]
    Register(#[from] RegisterError),
    /// A transport or OS error.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// No such object.
    #[error("no such {0}")]
    NoSuch(&'static str),
    /// The protection domain was never allocated, or is deallocated (`EINVAL`, as the
    /// kernel answers an unknown PD handle).
    #[error("no protection domain {pd}")]
    NoSuchPd {
        /// The PD asked for.
        pd: u32,
    },
    /// The object is still used by others (`EBUSY`): `ibv_dealloc_pd(3)` of a PD that
    /// memory regions, queue pairs, shared receive queues or address handles still hold.
    #[error("{object} still in use by {count} {by}(s)")]
    InUse {
        /// What was to be destroyed.
        object: &'static str,
        /// The kind of object still holding it.
        by: &'static str,
        /// How many of them.
        count: u32,
    },
}

impl DeviceError {
    /// The errno the C side reports.
    pub fn errno(&self) -> i32 {
        match self {
            DeviceError::Verbs(e) => e.errno(),
            DeviceError::Register(e) => e.errno(),
            DeviceError::Io(e) => e.raw_os_error().unwrap_or(5),
            DeviceError::NoSuch(_) | DeviceError::NoSuchPd { .. } => 22,
            DeviceError::InUse { .. } => 16,
        }
    }
}
