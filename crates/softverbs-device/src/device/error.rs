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
}

impl DeviceError {
    /// The errno the C side reports.
    pub fn errno(&self) -> i32 {
        match self {
            DeviceError::Verbs(e) => e.errno(),
            DeviceError::Register(e) => e.errno(),
            DeviceError::Io(e) => e.raw_os_error().unwrap_or(5),
            DeviceError::NoSuch(_) => 22,
        }
    }
}
