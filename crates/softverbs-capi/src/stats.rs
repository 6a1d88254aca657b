//! The `SOFTVERBS_STATS` report: one line of the device's engine and transport counters,
//! written when a context is closed or, if none was, when the process exits.
//!
//! Its own module so that both [`crate::device`] (`ibv_close_device`) and
//! [`crate::handles`] (the exit hook of the process's device) can call it without the two
//! depending on each other; it needs only the device runtime.

use softverbs::core::device::Device;

/// The environment variable naming where `ibv_close_device` reports the device's
/// counters: `stderr` (or `-`), or a file the report is appended to. Unset: no report.
pub const STATS_ENV: &str = "SOFTVERBS_STATS";

/// Writes one line of the device's engine and transport counters where
/// [`STATS_ENV`] says, so a C program's run (say, under packet loss) shows what the device
/// did: retransmissions, timeouts, NAKs, drops by reason.
pub fn report(device: &Device) {
    let Some(target) = std::env::var_os(STATS_ENV) else {
        return;
    };
    STATS_REPORTED.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut line = format!(
        "softverbs stats: device {} address {} pid {}: {}",
        device.name(),
        device.address(),
        std::process::id(),
        device.counters()
    );
    if let Some(t) = device.transport_counters() {
        line.push_str(&format!("; transport: {t}"));
    }
    line.push_str(&format!(
        "; memory: faulted_accesses={}",
        device.faulted_accesses()
    ));
    if let Some(capture) = device.capture() {
        line.push_str(&format!("; capture: {capture}"));
    }
    line.push('\n');
    use std::io::Write;
    let written = if target == "stderr" || target == "-" {
        std::io::stderr().write_all(line.as_bytes())
    } else {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&target)
            .and_then(|mut f| f.write_all(line.as_bytes()))
    };
    if let Err(e) = written {
        eprintln!("softverbs: cannot write the {STATS_ENV} report to {target:?}: {e}");
    }
}

/// Whether a [`STATS_ENV`] report was written (at exit, one is written only if not).
static STATS_REPORTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The [`STATS_ENV`] report of a program that leaves without closing its context (or
/// fails before it does).
pub fn report_once_at_exit(device: &Device) {
    if !STATS_REPORTED.load(std::sync::atomic::Ordering::Relaxed) {
        report(device);
    }
}
