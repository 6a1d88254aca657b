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
//!
//! # Logging while a process exits
//!
//! The drop-in runs inside C programs, which close devices and destroy objects from their
//! `atexit` handlers, and reports its own statistics from one: by then the C library has
//! destroyed the main thread's thread-locals, and the `fmt` subscriber (its line buffer,
//! its span stack) cannot be used on that thread without panicking (tokio-rs/tracing#3239).
//! The subscriber is therefore wrapped in a gate (`Gated`) which sees, per thread,
//! whether its thread-locals are gone and then lets no event or span through: such a
//! thread logs nothing, every other thread goes on.

use std::cell::Cell;
use std::fmt;
use std::fs::File;
use std::io::{self, IsTerminal};
use std::path::PathBuf;
use std::sync::Arc;
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};
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
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi)
        .finish();
    Ok(tracing::subscriber::set_global_default(Gated(subscriber)).is_ok())
}

thread_local! {
    /// Whether this thread's thread-locals have been destroyed. It has no destructor of
    /// its own, so it can be read until the thread is gone.
    static TORN_DOWN: Cell<bool> = const { Cell::new(false) };
    /// Destroyed with the thread's other thread-locals, which it records in [`TORN_DOWN`].
    static SENTINEL: Sentinel = const { Sentinel };
}

struct Sentinel;

impl Drop for Sentinel {
    fn drop(&mut self) {
        TORN_DOWN.with(|torn_down| torn_down.set(true));
    }
}

/// Whether this thread can still use thread-locals. The first call on a thread registers
/// the sentinel; on a thread whose thread-locals are gone, it fails or finds them marked.
fn thread_alive() -> bool {
    !TORN_DOWN.with(Cell::get) && SENTINEL.try_with(|_| ()).is_ok()
}

/// A subscriber that forwards to `S` on threads whose thread-locals are alive, and drops
/// events and span entries on the others (module documentation, "Logging while a process
/// exits"). Callsites `S` always enables are asked again each time ([`Interest::sometimes`]),
/// so the check runs before a span is created too; callsites `S` never enables stay off.
/// Only a process with logging on pays for it.
struct Gated<S>(S);

impl<S: Subscriber> Subscriber for Gated<S> {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        let interest = self.0.register_callsite(metadata);
        if interest.is_always() {
            Interest::sometimes()
        } else {
            interest
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        thread_alive() && self.0.enabled(metadata)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        self.0.max_level_hint()
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        self.0.new_span(span)
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        if thread_alive() {
            self.0.record(span, values);
        }
    }

    fn record_follows_from(&self, span: &Id, follows: &Id) {
        if thread_alive() {
            self.0.record_follows_from(span, follows);
        }
    }

    fn event_enabled(&self, event: &Event<'_>) -> bool {
        thread_alive() && self.0.event_enabled(event)
    }

    fn event(&self, event: &Event<'_>) {
        if thread_alive() {
            self.0.event(event);
        }
    }

    fn enter(&self, span: &Id) {
        if thread_alive() {
            self.0.enter(span);
        }
    }

    fn exit(&self, span: &Id) {
        if thread_alive() {
            self.0.exit(span);
        }
    }

    fn clone_span(&self, id: &Id) -> Id {
        self.0.clone_span(id)
    }

    fn try_close(&self, id: Id) -> bool {
        self.0.try_close(id)
    }
}
