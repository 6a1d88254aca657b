//! The drop-in's logs and statistics (issue #17), seen from unmodified programs: the
//! library installs the `tracing` subscriber of `SOFTVERBS_LOG` / `RUST_LOG` (stderr, or
//! `SOFTVERBS_LOG_FILE`) when it is first used, and nothing without them; its
//! `SOFTVERBS_STATS` line is the one the command prints, with the faults injected by kind.
//!
//! The pair is Debian's `ibv_rc_pingpong` (`ibv_rc_pingpong(1)`; package `ibverbs-utils`)
//! on 127.0.0.241 and .242 with the exchange on TCP port 18661; the lines pinned are the
//! QP state changes `ibv_modify_qp(3)` makes (RESET → INIT → RTR → RTS) and the go-back-N
//! retransmissions (IBTA vol. 1 §9.7.5.1) that `SOFTVERBS_FAULTS=drop=…` causes. Our C
//! program `tests/c/teardown_at_exit.c` (on 127.0.0.243) tears its objects down from an
//! `atexit` handler with logging on.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Longest a program may run.
const LIMIT: Duration = Duration::from_secs(60);

/// Every variable that changes what the drop-in logs, reports or injects.
const CLEARED: [&str; 8] = [
    "SOFTVERBS_NETWORK",
    "SOFTVERBS_PCAP",
    "SOFTVERBS_FAULTS",
    "SOFTVERBS_STATS",
    "SOFTVERBS_LOG",
    "SOFTVERBS_LOG_FILE",
    "RUST_LOG",
    "NO_COLOR",
];

/// `/usr/bin/PROGRAM ARGS` on the drop-in at `lib` with device address `addr` and `env`.
fn program(lib: &Path, name: &str, args: &[&str], addr: &str, env: &[(&str, &str)]) -> Command {
    let path = Path::new("/usr/bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: install the Debian package ibverbs-utils",
        path.display()
    );
    let mut command = Command::new(path);
    for name in CLEARED {
        command.env_remove(name);
    }
    command
        .args(args)
        .env("LD_LIBRARY_PATH", lib)
        .env("LD_BIND_NOW", "1")
        .env("SOFTVERBS_ADDR", addr)
        .envs(env.iter().copied());
    command
}

/// The log lines (timestamp, then level) in `text`.
fn log_lines(text: &str) -> Vec<&str> {
    const LEVELS: [&str; 5] = [" TRACE ", " DEBUG ", "  INFO ", "  WARN ", " ERROR "];
    text.lines()
        .filter(|l| l.starts_with("20") && LEVELS.iter().any(|level| l.contains(level)))
        .collect()
}

/// How many `QP state change` lines of `log` are `from` → `to`.
fn transitions(log: &str, from: &str, to: &str) -> usize {
    let transition = format!("from={from} to={to} cause=\"modify_qp\"");
    log_lines(log)
        .iter()
        .filter(|l| l.contains("QP state change") && l.contains(&transition))
        .count()
}

/// The `name=value` pairs of one section of a statistics line.
fn section(line: &str, name: &str) -> std::collections::HashMap<String, u64> {
    line.split("; ")
        .find_map(|part| part.split_once(&format!("{name}: ")).map(|(_, body)| body))
        .unwrap_or_else(|| panic!("no {name} section in {line}"))
        .split(' ')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.split('/').next().unwrap().parse().unwrap()))
        .collect()
}

#[test]
fn ibv_devinfo_logs_nothing_without_a_log_variable_and_the_device_with_one() {
    let lib = common::library_dir("logs-devinfo");
    let (status, _, stderr) = common::run_bounded(
        &mut program(&lib, "ibv_devinfo", &[], "127.0.0.241:0", &[]),
        LIMIT,
    );
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{stderr}");
    assert!(stderr.is_empty(), "nothing logged unasked:\n{stderr}");
    let (status, _, stderr) = common::run_bounded(
        &mut program(
            &lib,
            "ibv_devinfo",
            &[],
            "127.0.0.241:0",
            &[("SOFTVERBS_LOG", "info")],
        ),
        LIMIT,
    );
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{stderr}");
    let opened: Vec<&str> = log_lines(&stderr)
        .into_iter()
        .filter(|l| l.contains("device opened"))
        .collect();
    assert_eq!(opened.len(), 1, "{stderr}");
    assert!(
        opened[0].contains("device{name=softverbs0 address=127.0.0.241}"),
        "{stderr}"
    );
}

#[test]
fn ibv_rc_pingpong_on_the_drop_in_logs_qp_state_changes_and_retransmissions_under_loss() {
    let lib = common::library_dir("logs-pingpong");
    let file = Path::new(env!("CARGO_TARGET_TMPDIR")).join("softverbs-capi-logs-client.log");
    let _ = std::fs::remove_file(&file);
    let port: u16 = 18661;
    let args = ["-g", "0", "-n", "100", "-s", "64", "-p", "18661"];
    let mut server = program(
        &lib,
        "ibv_rc_pingpong",
        &args,
        "127.0.0.241:4791",
        &[("SOFTVERBS_LOG", "debug")],
    )
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("start the server");
    if let Err(why) = common::wait_until_listening(&mut server, port, LIMIT) {
        let (_, out, err) = common::wait_bounded(server, Duration::ZERO);
        panic!("{why}\n{out}\n{err}");
    }
    let mut client_args = args.to_vec();
    client_args.push("127.0.0.1");
    let (client_status, client_out, client_err) = common::run_bounded(
        &mut program(
            &lib,
            "ibv_rc_pingpong",
            &client_args,
            "127.0.0.242:4791",
            &[
                ("RUST_LOG", "debug"),
                ("SOFTVERBS_LOG_FILE", file.to_str().unwrap()),
                ("SOFTVERBS_FAULTS", "drop=0.1,seed=41"),
                ("SOFTVERBS_STATS", "stderr"),
            ],
        ),
        LIMIT,
    );
    let (server_status, server_out, server_err) = common::wait_bounded(server, LIMIT);
    let outputs =
        format!("client:\n{client_out}\n{client_err}\nserver:\n{server_out}\n{server_err}");
    assert_eq!(client_status.and_then(|s| s.code()), Some(0), "{outputs}");
    assert_eq!(server_status.and_then(|s| s.code()), Some(0), "{outputs}");

    // The server logged on stderr: its QP's bring-up, once each.
    for (from, to) in [("Reset", "Init"), ("Init", "Rtr"), ("Rtr", "Rts")] {
        assert_eq!(transitions(&server_err, from, to), 1, "{outputs}");
    }
    // The client logged into its file, and nothing on stderr but its statistics line.
    let client_log = std::fs::read_to_string(&file).expect("the client's log file");
    assert!(log_lines(&client_err).is_empty(), "{outputs}");
    for (from, to) in [("Reset", "Init"), ("Init", "Rtr"), ("Rtr", "Rts")] {
        assert_eq!(transitions(&client_log, from, to), 1, "{client_log}");
    }
    // Its dropped packets were retransmitted by go-back-N, each line naming QP and PSN.
    let retransmissions: Vec<&str> = log_lines(&client_log)
        .into_iter()
        .chain(log_lines(&server_err))
        .filter(|l| l.contains("go-back-N: retransmitting from PSN"))
        .collect();
    assert!(!retransmissions.is_empty(), "{client_log}\n{outputs}");
    assert!(
        retransmissions
            .iter()
            .all(|l| l.contains(" qpn=") && l.contains(" psn=") && l.contains(" cause=")),
        "{retransmissions:#?}"
    );
    // The statistics line has the faults by kind, matching what reached the socket.
    let line = client_err
        .lines()
        .find(|l| l.starts_with("softverbs stats: device softverbs0 address 127.0.0.242"))
        .unwrap_or_else(|| panic!("no statistics line:\n{outputs}"));
    let faults = section(line, "faults");
    let engine = section(line, "engine");
    let transport = section(line, "transport");
    assert!(faults["dropped"] > 0, "{line}");
    assert_eq!(faults["duplicated"] + faults["corrupted"], 0, "{line}");
    assert_eq!(faults["packets"], engine["packets_sent"], "{line}");
    assert_eq!(
        transport["sent_packets"],
        faults["packets"] - faults["dropped"],
        "{line}"
    );
    let _ = std::fs::remove_file(&file);
}

#[test]
fn verbs_called_from_an_atexit_handler_with_logging_on_still_succeed() {
    // exit(3) destroys the main thread's thread-locals before it runs the atexit handlers:
    // the logs must not touch them there, nor fail the call (tokio-rs/tracing#3239).
    let lib = common::library_dir("logs-teardown");
    let exe = common::compile_c("teardown_at_exit.c", "teardown_at_exit", &["-O1"]);
    let mut command = Command::new(&exe);
    for name in CLEARED {
        command.env_remove(name);
    }
    command
        .env("LD_LIBRARY_PATH", &lib)
        .env("SOFTVERBS_ADDR", "127.0.0.243:0")
        .env("SOFTVERBS_LOG", "debug")
        .env("SOFTVERBS_STATS", "stderr");
    let (status, stdout, stderr) = common::run_bounded(&mut command, LIMIT);
    let outputs = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{outputs}");
    assert!(
        stdout.contains("teardown: destroy_qp 0 destroy_cq 0 dealloc_pd 0 close_device 0"),
        "{outputs}"
    );
    assert!(!stderr.contains("panicked"), "{outputs}");
    // It logged while main ran, and its close (in the handler) wrote the one report.
    assert_eq!(transitions(&stderr, "Reset", "Init"), 1, "{outputs}");
    assert_eq!(
        stderr.matches("softverbs stats: device softverbs0").count(),
        1,
        "{outputs}"
    );
}
