//! Helpers of the command's capture and picture tests: `softverbs` run as a process and
//! bounded in time, scratch directories, `softverbs pcap`'s summary, tshark.

#![allow(dead_code)] // each test binary uses a different part of these helpers

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Longest any one invocation may take.
pub const LIMIT: Duration = Duration::from_secs(60);

/// Runs `softverbs ARGS` with `env`, bounded by [`LIMIT`]; returns (exit code, stdout,
/// stderr).
pub fn softverbs_with(env: &[(&str, &Path)], args: &[&str]) -> (i32, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_softverbs"));
    command
        .env_remove("SOFTVERBS_ADDR")
        .env_remove("SOFTVERBS_NETWORK")
        .env_remove("SOFTVERBS_PCAP")
        .env_remove("SOFTVERBS_FAULTS")
        .envs(env.iter().copied())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = finish(command.spawn().expect("start softverbs"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Waits for `child` within [`LIMIT`], killing it (and failing) past that.
pub fn finish(mut child: std::process::Child) -> Output {
    let deadline = Instant::now() + LIMIT;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("softverbs did not finish within {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().expect("output")
}

/// Runs `softverbs ARGS`, bounded; returns (exit code, stdout, stderr).
pub fn softverbs(args: &[&str]) -> (i32, String, String) {
    softverbs_with(&[], args)
}

/// Runs `softverbs ARGS`, which must succeed without a panic; returns its stdout.
pub fn softverbs_ok(args: &[&str]) -> String {
    let (code, out, err) = softverbs(args);
    assert_eq!(code, 0, "softverbs {args:?} failed\n{out}\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    out
}

/// A fresh directory for one test's files.
pub fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("softverbs-cli-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A path as a command-line argument.
pub fn text(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temporary path")
}

/// The packet count of `softverbs pcap` output's summary line.
pub fn packets(listing: &str) -> usize {
    listing
        .lines()
        .find(|l| l.contains(" packets, "))
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no summary in {listing}"))
}

/// Runs `tshark ARGS`, which must succeed; returns its stdout.
pub fn tshark(args: &[&str]) -> String {
    let out = Command::new("tshark")
        .args(args)
        .output()
        .expect("tshark (Debian package tshark; scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "tshark {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The first four bytes of a pcapng file (a Section Header Block).
pub const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];
