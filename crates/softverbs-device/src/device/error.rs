//! [`DeviceError`]: why a device verb failed — a rule of the engine or of the device's own
//! objects ([`VerbsError`]: PDs, address handles, memory regions), a registration refused
//! ([`RegisterError`]), or the operating system. The errno each is reported as is decided
//! above the device, in one place (`softverbs::core::Error::errno`).

use crate::memory::RegisterError;
use softverbs_proto::VerbsError;
use std::io;

/// Why a verb failed.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// A verbs rule refused it: the engine's (QP, SRQ, address vector) or the device's
    /// (a PD still in use or unknown, an unknown memory region or address handle).
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// Registration refused.
    #[error(transparent)]
    Register(#[from] RegisterError),
    /// A transport or OS error.
    #[error(transparent)]
    Io(#[from] io::Error),
}
