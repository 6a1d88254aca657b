//! A device's statistics lines (`SOFTVERBS_STATS=stderr`) read back: included by path from
//! `libfabric.rs`, and from the `softverbs` command's UCX and Open MPI tests
//! (`crates/softverbs-cli/tests/common/stacks.rs`).

#![allow(dead_code)]

/// The statistics lines (`SOFTVERBS_STATS=stderr`) of the device at `address` in `stderr`.
pub fn stats_lines<'a>(stderr: &'a str, address: &str) -> Vec<&'a str> {
    let prefix = format!("softverbs stats: device softverbs0 address {address} ");
    stderr.lines().filter(|l| l.starts_with(&prefix)).collect()
}

/// The value of the counter `name=` in a statistics line (0 when absent).
pub fn counter(line: &str, name: &str) -> u64 {
    line.split([' ', ';'])
        .find_map(|field| field.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Asserts that the device at `address` sent and received packets (at least `min` of each),
/// as its last statistics line in `stderr` says; returns that line.
pub fn assert_carried<'a>(stderr: &'a str, address: &str, min: u64) -> &'a str {
    let lines = stats_lines(stderr, address);
    let last = lines
        .last()
        .unwrap_or_else(|| panic!("no statistics line for {address}:\n{stderr}"));
    for name in ["packets_sent", "packets_received"] {
        assert!(
            counter(last, name) >= min,
            "the device at {address} shows {name} < {min}: {last}"
        );
    }
    last
}
