//! Latency distributions (HdrHistogram, nanosecond resolution, 3 significant digits).

use hdrhistogram::Histogram;
use std::time::Duration;

/// Recorded latencies.
pub struct Latencies {
    histogram: Histogram<u64>,
}

impl Latencies {
    /// An empty distribution (1 ns to 1000 s).
    pub fn new() -> Latencies {
        Latencies {
            histogram: Histogram::new_with_bounds(1, 1_000_000_000_000, 3)
                .expect("valid histogram bounds"),
        }
    }

    /// Records one sample.
    pub fn record(&mut self, latency: Duration) {
        let ns = (latency.as_nanos() as u64).clamp(1, self.histogram.high());
        // Within the bounds by the clamp, so recording cannot fail.
        let _ = self.histogram.record(ns);
    }

    /// The number of samples.
    pub fn len(&self) -> u64 {
        self.histogram.len()
    }

    /// Whether there is no sample.
    pub fn is_empty(&self) -> bool {
        self.histogram.is_empty()
    }

    /// The latency at quantile `q` (0 = min, 1 = max) in microseconds.
    pub fn quantile_us(&self, q: f64) -> f64 {
        let ns = if q <= 0.0 {
            self.histogram.min()
        } else if q >= 1.0 {
            self.histogram.max()
        } else {
            self.histogram.value_at_quantile(q)
        };
        ns as f64 / 1e3
    }

    /// The mean in microseconds.
    pub fn mean_us(&self) -> f64 {
        self.histogram.mean() / 1e3
    }

    /// The distribution itself (nanoseconds).
    pub fn histogram(&self) -> &Histogram<u64> {
        &self.histogram
    }

    /// The standard deviation in microseconds.
    pub fn stdev_us(&self) -> f64 {
        self.histogram.stdev() / 1e3
    }
}

impl Default for Latencies {
    fn default() -> Self {
        Latencies::new()
    }
}
