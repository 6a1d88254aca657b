//! The `SOFTVERBS_STATS` report of the drop-in: when it happens. What it says is the
//! device's (`softverbs::core::device::DeviceStats`, one line both front doors print).
//! It is written when a context is closed (`ibv_close_device`) or, if none was, when the
//! process exits: the process's device is never dropped, which is when the safe API
//! reports.
//!
//! Its own module so that both [`crate::device`] (`ibv_close_device`) and
//! [`crate::handles`] (the exit hook of the process's device) can call it without the two
//! depending on each other; it needs only the device runtime.

use softverbs::core::device::Device;

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
