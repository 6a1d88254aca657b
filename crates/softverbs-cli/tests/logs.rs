//! The command's logs (issue #17): `RUST_LOG` or `SOFTVERBS_LOG` (the same filter syntax;
//! `SOFTVERBS_LOG` wins) turn on a `tracing` subscriber writing to stderr, or to the file
//! `SOFTVERBS_LOG_FILE` names; with neither, nothing is logged. What a user debugging a
//! hang needs is there: each QP's state changes with their cause and the PSNs of the
//! connection, and under loss (`SOFTVERBS_FAULTS=drop=…`) each go-back-N retransmission
//! with its QP, PSN and cause. IBTA vol. 1 §9.7.5.1 (go-back-N on the local ACK timeout)
//! and `ibv_modify_qp(3)` (RESET → INIT → RTR → RTS) are what the lines describe.

mod common;

use common::{log_lines, pingpong_pair, run, run_with_env, TempDir};

/// The QP state changes of a connection's bring-up, as the engine logs them.
const BRING_UP: [&str; 3] = [
    "from=Reset to=Init cause=\"modify_qp\"",
    "from=Init to=Rtr cause=\"modify_qp\"",
    "from=Rtr to=Rts cause=\"modify_qp\"",
];

/// Checks that `log` holds each bring-up transition `times` times, on `QP state change`
/// lines naming a QP number.
fn assert_bring_up(log: &str, times: usize) {
    for transition in BRING_UP {
        let lines: Vec<&str> = log_lines(log)
            .into_iter()
            .filter(|l| l.contains("QP state change") && l.contains(transition))
            .collect();
        assert_eq!(lines.len(), times, "{transition} in:\n{log}");
        assert!(lines.iter().all(|l| l.contains(" qpn=")), "{lines:#?}");
    }
    let rtr = log_lines(log)
        .into_iter()
        .find(|l| l.contains("to=Rtr"))
        .unwrap_or_default();
    assert!(
        rtr.contains(" dest_qpn=") && rtr.contains(" rq_psn="),
        "RTR names its peer and PSN: {rtr}"
    );
}

#[test]
fn rust_log_debug_shows_both_qps_state_changes_and_nothing_is_logged_without_it() {
    // Both sides in this process: two devices, two QPs, each brought up once.
    let args = ["pingpong", "-n", "5", "-s", "64"];
    let (code, out, err) = run(&args);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        err.is_empty(),
        "nothing on stderr without a log variable:\n{err}"
    );
    let (code, out, err) = run_with_env(&args, &[("RUST_LOG", "debug")]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_bring_up(&err, 2);
    // Each device says where it is, and the engine's lines carry the device's span.
    assert_eq!(
        log_lines(&err)
            .iter()
            .filter(|l| l.contains("device opened"))
            .count(),
        2,
        "{err}"
    );
    assert!(
        err.lines()
            .any(|l| l.contains("device{name=softverbs0 address=127.0.0.")
                && l.contains("QP state change")),
        "{err}"
    );
    // The report on stdout is unchanged: the logs go to stderr.
    assert_eq!(log_lines(&out), Vec::<&str>::new(), "{out}");
}

#[test]
fn softverbs_log_takes_the_same_syntax_and_wins_over_rust_log() {
    let args = ["pingpong", "-n", "3", "-s", "64"];
    let (code, out, err) = run_with_env(
        &args,
        &[
            ("SOFTVERBS_LOG", "softverbs_proto=debug"),
            ("RUST_LOG", "off"),
        ],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert_bring_up(&err, 2);
    assert!(
        log_lines(&err)
            .iter()
            .all(|l| l.contains("softverbs_proto")),
        "a per-target filter keeps the other targets out:\n{err}"
    );
    let (code, out, err) = run_with_env(&args, &[("SOFTVERBS_LOG", "warn"), ("RUST_LOG", "debug")]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        log_lines(&err).is_empty(),
        "SOFTVERBS_LOG=warn wins over RUST_LOG=debug:\n{err}"
    );
}

#[test]
fn dropped_packets_show_as_retransmissions_with_their_qp_and_psn() {
    // 10 % of each side's packets dropped on the way out: some pings and ACKs are lost,
    // the requester's local ACK timeout fires, and it goes back to the oldest
    // unacknowledged PSN.
    let args = ["-n", "100", "-s", "64"];
    let ((server_code, server_out, server_err), (client_code, client_out, client_err)) =
        pingpong_pair(
            &args,
            &[
                ("SOFTVERBS_FAULTS", "drop=0.1,seed=21"),
                ("SOFTVERBS_LOG", "debug"),
            ],
            &[
                ("SOFTVERBS_FAULTS", "drop=0.1,seed=22"),
                ("RUST_LOG", "debug"),
            ],
        );
    assert_eq!(
        client_code, 0,
        "client:\n{client_out}\n{client_err}\nserver:\n{server_out}\n{server_err}"
    );
    assert_eq!(server_code, 0, "server:\n{server_out}\n{server_err}");
    let mut retransmissions = Vec::new();
    for stderr in [&server_err, &client_err] {
        assert_bring_up(stderr, 1);
        retransmissions.extend(
            log_lines(stderr)
                .into_iter()
                .filter(|l| l.contains("go-back-N: retransmitting from PSN")),
        );
    }
    assert!(
        !retransmissions.is_empty(),
        "no retransmission logged:\nserver:\n{server_err}\nclient:\n{client_err}"
    );
    for line in &retransmissions {
        let psn = line
            .split(" psn=")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse::<u32>().ok());
        assert!(psn.is_some_and(|p| p < 1 << 24), "a 24-bit PSN in: {line}");
        assert!(line.contains(" qpn=") && line.contains(" cause="), "{line}");
    }
}

#[test]
fn softverbs_log_file_gets_the_lines_and_stderr_none() {
    let dir = TempDir::new("logs");
    let file = dir.join("run.log");
    let path = file.to_str().unwrap();
    let args = ["pingpong", "-n", "3", "-s", "64"];
    let (code, out, err) = run_with_env(
        &args,
        &[("SOFTVERBS_LOG_FILE", path), ("SOFTVERBS_LOG", "debug")],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(err.is_empty(), "{err}");
    let log = std::fs::read_to_string(&file).expect("the log file was written");
    assert_bring_up(&log, 2);
    // Set alone, the file gets the debugging log; lines are appended.
    let (code, out, err) = run_with_env(&args, &[("SOFTVERBS_LOG_FILE", path)]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(err.is_empty(), "{err}");
    let log = std::fs::read_to_string(&file).unwrap();
    assert_bring_up(&log, 4);
}

#[test]
fn an_unopenable_log_file_or_a_bad_filter_is_one_line_naming_the_variable() {
    let missing = std::env::temp_dir()
        .join(format!("softverbs-no-such-dir-{}", std::process::id()))
        .join("run.log");
    let missing = missing.to_str().unwrap();
    let (code, out, err) = run_with_env(
        &["pingpong", "-n", "3"],
        &[("SOFTVERBS_LOG_FILE", missing), ("SOFTVERBS_LOG", "debug")],
    );
    assert_eq!(code, 1, "{out}\n{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!("softverbs: SOFTVERBS_LOG_FILE={missing}: ")),
        "{err}"
    );
    assert!(out.is_empty(), "nothing ran: {out}");

    let (code, out, err) = run_with_env(&["pingpong", "-n", "3"], &[("SOFTVERBS_LOG", "debug,[")]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("softverbs: SOFTVERBS_LOG=\"debug,[\" "),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}
