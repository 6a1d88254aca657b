//! The `tracing` subscriber the `softverbs` command and the drop-in `libibverbs.so.1`
//! install (feature `logging`; a library user keeps their own). The environment says
//! which events are shown and where they go:
//!
//! | variable | meaning |
//! |---|---|
//! | `SOFTVERBS_LOG` ([`LOG_ENV`]) | the filter, in `RUST_LOG` syntax: `debug`, `softverbs_proto=trace,info`; wins over `RUST_LOG` |
//! | `RUST_LOG` ([`RUST_LOG_ENV`]) | the same, when `SOFTVERBS_LOG` is unset or empty |
//! | `SOFTVERBS_LOG_FILE` ([`LOG_FILE_ENV`]) | append the lines to this file instead of writing them on stderr; set alone, it logs at [`FILE_ONLY_FILTER`] |
//!
//! With none of them set (or all empty) no subscriber is installed: nothing is printed,
//! and each event site the program reaches costs one relaxed load.
//!
//! What is logged, by level (targets `softverbs_proto` for the engine, `softverbs_device`
//! for the device; engine events carry the device's span `device{name, address}`):
//! - WARN: a work request failed and its QP went to the error state (with the status and
//!   the cause: retry or RNR retry count exhausted, a remote NAK, a responder error), a CQ
//!   overran, error events (`IBV_EVENT_CQ_ERR`, `QP_FATAL`, `QP_REQ_ERR`, `QP_ACCESS_ERR`);
//! - INFO: a device opened (its address and network), its statistics when it closes;
//! - DEBUG: QP state changes by `ibv_modify_qp` (with the PSNs, timeout and retry counts
//!   a connection hangs on) and refused modifies, go-back-N retransmissions with the PSN and
//!   their cause (local ACK timeout, NAK sequence error, implied NAK), RNR NAKs sent and
//!   received and the RNR waits, NAK sequence errors sent, flushes, other events;
//! - TRACE, per packet: every drop with its reason (as the statistics name it) and QP and
//!   PSN, every retransmitted packet, every injected fault, every duplicate request.

use std::fmt;
use std::fs::File;
use std::io::{self, IsTerminal};
use std::path::PathBuf;
use std::sync::Arc;
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::EnvFilter;

/// The filter variable of softverbs (`RUST_LOG` syntax); wins over [`RUST_LOG_ENV`].
pub const LOG_ENV: &str = "SOFTVERBS_LOG";

/// The usual filter variable, read when [`LOG_ENV`] is unset or empty.
pub const RUST_LOG_ENV: &str = "RUST_LOG";

/// A file the log lines are appended to, instead of stderr.
pub const LOG_FILE_ENV: &str = "SOFTVERBS_LOG_FILE";

/// The filter when only [`LOG_FILE_ENV`] is set: whoever names a log file wants the
/// debugging log in it.
pub const FILE_ONLY_FILTER: &str = "debug";

/// Why the logging the environment asks for cannot be set up. Its `Display` is one line
/// naming the variable and its value.
#[derive(Debug)]
pub enum LogSetupError {
    /// A filter variable whose value is not a filter.
    BadFilter {
        /// [`LOG_ENV`] or [`RUST_LOG_ENV`].
        variable: &'static str,
        /// Its value.
        value: String,
        /// What the parser said.
        reason: String,
    },
    /// [`LOG_FILE_ENV`] names a file that cannot be opened for appending.
    File {
        /// The path.
        path: PathBuf,
        /// Why.
        error: io::Error,
    },
}

impl fmt::Display for LogSetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogSetupError::BadFilter {
                variable,
                value,
                reason,
            } => write!(
                f,
                "{variable}={value:?} is not a log filter ({reason}); expected RUST_LOG \
                 syntax, such as debug or softverbs_proto=trace,info"
            ),
            LogSetupError::File { path, error } => write!(
                f,
                "{LOG_FILE_ENV}={}: cannot open the log file for appending: {error}",
                path.display()
            ),
        }
    }
}

impl std::error::Error for LogSetupError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LogSetupError::File { error, .. } => Some(error),
            LogSetupError::BadFilter { .. } => None,
        }
    }
}

/// A variable's value, `None` when unset or empty.
fn non_empty(variable: &str) -> Option<String> {
    std::env::var_os(variable)
        .map(|v| v.to_string_lossy().into_owned())
        .filter(|v| !v.trim().is_empty())
}

/// Installs the process's subscriber as the environment asks (module documentation).
/// Returns whether one was installed: `false` when nothing is asked, or when the process
/// already has a global subscriber (which then keeps the events).
pub fn init_from_env() -> Result<bool, LogSetupError> {
    let file = std::env::var_os(LOG_FILE_ENV).filter(|v| !v.is_empty());
    let (variable, value) = match (non_empty(LOG_ENV), non_empty(RUST_LOG_ENV)) {
        (Some(value), _) => (LOG_ENV, value),
        (None, Some(value)) => (RUST_LOG_ENV, value),
        (None, None) if file.is_some() => (LOG_FILE_ENV, FILE_ONLY_FILTER.to_owned()),
        (None, None) => return Ok(false),
    };
    let filter = EnvFilter::builder()
        .parse(&value)
        .map_err(|e| LogSetupError::BadFilter {
            variable,
            value: value.clone(),
            reason: e.to_string(),
        })?;
    let (writer, ansi) = match file {
        Some(path) => {
            let path = PathBuf::from(path);
            let file = File::options()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|error| LogSetupError::File { path, error })?;
            // Appending: one write per event, so the lines of several processes sharing
            // the file do not cut into each other.
            (BoxMakeWriter::new(Arc::new(file)), false)
        }
        None => {
            let ansi = io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            (BoxMakeWriter::new(io::stderr), ansi)
        }
    };
    let installed = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi)
        .try_init()
        .is_ok();
    Ok(installed)
}
