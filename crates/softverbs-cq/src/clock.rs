//! The device clock that completion timestamps are taken from, and its conversion to
//! wall-clock time.
//!
//! The device clock is `CLOCK_MONOTONIC` in nanoseconds, so one tick is one nanosecond:
//! the C side reports `hca_core_clock` as [`DEVICE_CLOCK_KHZ`] (1 GHz) and
//! `completion_timestamp_mask` as all ones, and `ibv_query_rt_values_ex` returns
//! [`DeviceClock::now`]. `ibv_create_cq_ex(3)`: `ibv_wc_read_completion_ts` "Get the
//! completion timestamp from the current completion in HCA clock units", and
//! `ibv_wc_read_completion_wallclock_ns` converts "from HCA clock units to wall clock
//! nanoseconds".

use rustix::time::{clock_gettime, ClockId};

/// The device clock frequency in kHz (`hca_core_clock`): 1 GHz, one tick per nanosecond.
pub const DEVICE_CLOCK_KHZ: u64 = 1_000_000;

/// The valid bits of a device timestamp (`completion_timestamp_mask`): it never wraps in
/// practice (584 years).
pub const DEVICE_CLOCK_MASK: u64 = u64::MAX;

/// The device clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeviceClock;

fn nanos(clock: ClockId) -> u64 {
    let ts = clock_gettime(clock);
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

impl DeviceClock {
    /// The device clock now, in ticks (nanoseconds of `CLOCK_MONOTONIC`).
    #[inline]
    pub fn now() -> u64 {
        nanos(ClockId::Monotonic)
    }

    /// The offset to add to a device timestamp to get wall-clock nanoseconds since the
    /// Unix epoch, measured now (the tightest of three bracketed samples).
    pub fn wallclock_offset() -> i128 {
        let mut best: Option<(u64, i128)> = None;
        for _ in 0..3 {
            let before = nanos(ClockId::Monotonic);
            let wall = nanos(ClockId::Realtime);
            let after = nanos(ClockId::Monotonic);
            let width = after.wrapping_sub(before);
            let mid = before + width / 2;
            let offset = i128::from(wall) - i128::from(mid);
            if best.is_none_or(|(w, _)| width < w) {
                best = Some((width, offset));
            }
        }
        best.map_or(0, |(_, offset)| offset)
    }

    /// A device timestamp converted to wall-clock nanoseconds with `offset` from
    /// [`DeviceClock::wallclock_offset`].
    #[inline]
    pub fn to_wallclock(ticks: u64, offset: i128) -> u64 {
        (i128::from(ticks) + offset).clamp(0, i128::from(u64::MAX)) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_clock_is_monotonic_and_converts_to_realtime() {
        // ibv_create_cq_ex(3): read_completion_wallclock_ns converts "from HCA clock units
        // to wall clock nanoseconds".
        let a = DeviceClock::now();
        let b = DeviceClock::now();
        assert!(b >= a);
        let wall = DeviceClock::to_wallclock(b, DeviceClock::wallclock_offset());
        let real = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let diff = real.abs_diff(wall);
        assert!(diff < 50_000_000, "wall-clock conversion off by {diff} ns");
    }
}
