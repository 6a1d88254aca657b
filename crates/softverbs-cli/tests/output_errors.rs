//! No panic on output errors: a reader that goes away (`softverbs ... | head -1`) ends
//! every subcommand quietly with status 0, as `head` users expect, and any other failure
//! to write standard output (a full disk) is one line on stderr and status 1.

mod common;

use common::{finish, run_ok, softverbs, TempDir};
use std::io::{BufRead, BufReader};
use std::process::Stdio;

/// The subcommands, each with arguments that print more than one line. `pcap` reads the
/// capture of a short run made first.
fn subcommands(capture: &str) -> Vec<Vec<String>> {
    [
        &["devinfo", "-v"][..],
        &["pingpong", "-n", "20", "-s", "64"][..],
        &["pingpong", "--in-process", "-n", "20"][..],
        &["perf", "send", "lat", "-a", "--in-process", "-n", "20"][..],
        &["perf", "write", "bw", "-n", "50", "--json"][..],
        &["pcap", capture][..],
        &["--help"][..],
    ]
    .iter()
    .map(|args| args.iter().map(|a| a.to_string()).collect())
    .collect()
}

/// Runs `softverbs ARGS` into a pipe whose reader reads `lines` lines and goes away;
/// returns (exit code, stderr).
fn into_reader_that_leaves_after(args: &[String], lines: usize) -> (i32, String) {
    let (reader, writer) = std::io::pipe().expect("pipe");
    // The Command, and with it our copy of the writer, is dropped at the end of this
    // statement: the child holds the only writer, the reader below is the only reader.
    let child = softverbs()
        .args(args)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start softverbs");
    let mut reader = BufReader::new(reader);
    for _ in 0..lines {
        let mut line = String::new();
        let _ = reader.read_line(&mut line);
    }
    drop(reader);
    let out = finish(child);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_subcommand_ends_quietly_with_status_0_when_its_reader_goes_away() {
    let dir = TempDir::new("closed-pipe");
    let capture = dir.join("run.pcap");
    run_ok(&["pingpong", "-n", "10", "--pcap", capture.to_str().unwrap()]);
    for args in subcommands(capture.to_str().unwrap()) {
        // Gone before the first line (the first write fails), and after the first line
        // (`| head -1`).
        for lines in [0, 1] {
            let started = std::time::Instant::now();
            let (code, err) = into_reader_that_leaves_after(&args, lines);
            // At once: not after a peer's wait for a side that has stopped.
            let took = started.elapsed();
            assert!(
                took < std::time::Duration::from_secs(10),
                "{args:?} after {lines} line(s) took {took:?}"
            );
            assert_eq!(code, 0, "{args:?} after {lines} line(s): {err}");
            assert!(
                !err.contains("panicked") && !err.contains("Broken pipe"),
                "{args:?} after {lines} line(s): {err}"
            );
        }
    }
}

#[test]
fn a_full_disk_on_stdout_is_one_line_and_status_1() {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let child = softverbs()
        .args(["devinfo", "-v"])
        .stdin(Stdio::null())
        .stdout(full)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start softverbs");
    let out = finish(child);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("softverbs: cannot write to standard output: ")
            && err.contains("No space left on device"),
        "{err}"
    );
}
