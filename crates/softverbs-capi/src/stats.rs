//! The `SOFTVERBS_STATS` report and the `SOFTVERBS_LOG` logs of the drop-in: when each
//! happens. What they say is the device's (`softverbs::core::device::DeviceStats`, one line
//! both front doors print; `softverbs::core::device::logging`, the subscriber the command
//! installs too).
//!
//! - The report is written when a context is closed (`ibv_close_device`) or, if none was,
//!   when the process exits: the process's device is never dropped, which is when the safe
//!   API reports.
//! - The logs start when the library is first used (the device opens, at
//!   `ibv_get_device_list` or whatever first needs the device).
//!
//! Its own module so that both [`crate::device`] (`ibv_close_device`) and
//! [`crate::handles`] (the device's opening and exit hook) can call it without the two
//! depending on each other; it needs only the device runtime.

use softverbs::core::device::{logging, Device};

/// The environment variable naming where `ibv_close_device` reports the device's
/// counters: `stderr` (or `-`), or a file the report is appended to. Unset: no report.
pub use softverbs::core::device::STATS_ENV;

/// Writes the device's statistics line where [`STATS_ENV`] says, so a C program's run
/// (say, under packet loss) shows what the device did: retransmissions, timeouts, NAKs,
/// drops by reason, faults injected by kind, CQ high-water marks, events.
pub fn report(device: &Device) {
    device.report_stats();
}

/// The [`STATS_ENV`] report of a program that leaves without closing its context (or
/// fails before it does): written only if no context close wrote one.
pub fn report_once_at_exit(device: &Device) {
    device.report_stats_once();
}

/// Installs the log subscriber the environment asks for (`SOFTVERBS_LOG` or `RUST_LOG`,
/// `SOFTVERBS_LOG_FILE`), once per process; with none set, nothing. A bad variable is
/// one line on stderr and the program goes on without logs: the library cannot end it.
pub fn start_logging() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        if let Err(error) = logging::init_from_env() {
            eprintln!("softverbs: {error}; continuing without logs");
        }
    });
}
