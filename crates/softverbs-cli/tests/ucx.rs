//! UCX 1.13 (Debian's `ucx-utils`) on the drop-in: `ucx_info -d` lists `rc_verbs` and
//! `ud_verbs` on softverbs0, and `ucx_perftest` runs `tag_lat`, `tag_bw`, `ucp_put_bw` and
//! `ucp_get` between two processes (each its own device, 127.0.0.x) over each transport.
//!
//! UCX skips a verbs device unless `/dev/infiniband/<dev_name>` is a character device the
//! process may read and write: every program here runs under `softverbs run --dev-node`,
//! which gives it one in a namespace of its own (`src/devnode.rs`). `UCX_TLS=rc_verbs` alone cannot connect UCP endpoints (RC
//! connects endpoint to endpoint, and UCP wires it up over an auxiliary transport); the RC
//! runs name UD as that auxiliary transport, `rc_verbs,ud_verbs:aux` (what UCX's own alias
//! `rc_v` means), and the counters show RC acknowledgements.
//!
//! A missing program is a failure naming the Debian package, never a skip.

mod common;
#[path = "common/stacks.rs"]
mod stacks;

use stacks::{assert_carried, counter};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Bound on one `ucx_perftest` run (each takes about a second).
const LIMIT: Duration = Duration::from_secs(120);

fn program(name: &str) -> PathBuf {
    stacks::program(name, "ucx-utils")
}

/// `softverbs run [--dev-node] -- UCX_PROGRAM ARGS` (the UCX program from /usr/bin).
fn ucx(name: &str, dev_node: bool, ucx_program: &str, args: &[&str]) -> Command {
    stacks::softverbs_run(name, dev_node, program(ucx_program), args)
}

/// `command` as the device at `address`, counters on stderr.
fn on_drop_in<'a>(command: &'a mut Command, address: &str) -> &'a mut Command {
    command
        .env("SOFTVERBS_ADDR", address)
        .env("SOFTVERBS_STATS", "stderr")
        .env("UCX_NET_DEVICES", "softverbs0:1")
}

#[test]
fn ucx_info_lists_rc_verbs_and_ud_verbs_on_softverbs0_under_dev_node() {
    let mut command = ucx("ucx-info", true, "ucx_info", &["-d"]);
    on_drop_in(&mut command, "127.0.0.151");
    let (status, stdout, stderr) = stacks::run_bounded(&mut command, LIMIT);
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "ucx_info -d:\n{stdout}\n{stderr}"
    );
    for expected in [
        "# Memory domain: softverbs0",
        "#      Transport: rc_verbs\n#         Device: softverbs0:1",
        "#      Transport: ud_verbs\n#         Device: softverbs0:1",
    ] {
        assert!(
            stdout.contains(expected),
            "ucx_info -d does not print {expected:?}:\n{stdout}\n{stderr}"
        );
    }
}

#[test]
fn ucx_info_skips_softverbs0_without_dev_node() {
    // What a user sees without --dev-node: the device opens, but UCX's access check on
    // /dev/infiniband/softverbs0 fails and no memory domain is listed.
    if Path::new("/dev/infiniband/softverbs0").exists() {
        panic!("/dev/infiniband/softverbs0 exists on this host: this test pins its absence");
    }
    let mut command = ucx("ucx-info-skip", false, "ucx_info", &["-d"]);
    on_drop_in(&mut command, "127.0.0.152");
    let (status, stdout, stderr) = stacks::run_bounded(&mut command, LIMIT);
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{stdout}\n{stderr}");
    assert!(
        !stdout.contains("Memory domain: softverbs0"),
        "UCX listed softverbs0 without its device node:\n{stdout}"
    );
}

/// One `ucx_perftest` exchange: the server as `server`, the client as `client` (with
/// `client_args` too), over `tls`, the control connection on TCP `port`; returns the
/// client's stdout and both stderrs (the counters) after asserting that both ended well.
fn perftest(
    tls: &str,
    (test, iterations, client_args): (&str, &str, &[&str]),
    (server, client): (&str, &str),
    port: u16,
) -> (String, String, String) {
    let port_arg = port.to_string();
    let mut server_command = ucx(
        &format!("ucx-perftest-server-{port}"),
        true,
        "ucx_perftest",
        &["-p", &port_arg],
    );
    on_drop_in(&mut server_command, server).env("UCX_TLS", tls);
    let mut server_child = server_command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the ucx_perftest server");
    if let Err(why) = stacks::wait_until_listening(&mut server_child, port, LIMIT) {
        let (_, out, err) = stacks::wait_bounded(server_child, Duration::from_secs(1));
        panic!("ucx_perftest server ({tls}): {why}\n{out}\n{err}");
    }
    let mut args = vec!["-p", &port_arg, "127.0.0.1", "-t", test, "-n", iterations];
    args.extend_from_slice(client_args);
    let mut client_command = ucx(
        &format!("ucx-perftest-client-{port}"),
        true,
        "ucx_perftest",
        &args,
    );
    on_drop_in(&mut client_command, client).env("UCX_TLS", tls);
    let (client_status, client_out, client_err) = stacks::run_bounded(&mut client_command, LIMIT);
    let (server_status, server_out, server_err) = stacks::wait_bounded(server_child, LIMIT);
    let all = format!(
        "client ({client_status:?}):\n{client_out}\n{client_err}\nserver ({server_status:?}):\n{server_out}\n{server_err}"
    );
    assert_eq!(
        client_status.and_then(|s| s.code()),
        Some(0),
        "{tls} {test}: {all}"
    );
    assert_eq!(
        server_status.and_then(|s| s.code()),
        Some(0),
        "{tls} {test}: {all}"
    );
    assert!(
        client_out.lines().any(|l| l.starts_with("Final:")),
        "{tls} {test}: no final figures: {all}"
    );
    (client_out, server_err, client_err)
}

/// The last `Final:` line of a `ucx_perftest` client's output (its overall figures).
fn final_figures(out: &str) -> &str {
    out.lines()
        .rfind(|l| l.starts_with("Final:"))
        .unwrap_or_default()
}

/// Runs the four UCP tests over `tls` and checks the counters of both devices after
/// each; prints each test's final figures.
fn four_ucp_tests(tls: &str, (server, client): (&str, &str), first_port: u16) {
    for (i, (test, iterations)) in [
        ("tag_lat", "2000"),
        ("tag_bw", "2000"),
        ("ucp_put_bw", "2000"),
        ("ucp_get", "200"),
    ]
    .into_iter()
    .enumerate()
    {
        let (out, server_err, client_err) = perftest(
            tls,
            (test, iterations, &[]),
            (server, client),
            first_port + i as u16,
        );
        // The messages travelled through the devices: a packet at least per iteration
        // from the client to the server, and packets back.
        let min = iterations.parse::<u64>().expect("a number");
        let server_line = assert_carried(&server_err, server, 1);
        let client_line = assert_carried(&client_err, client, 1);
        assert!(
            counter(client_line, "packets_sent") >= min
                && counter(server_line, "packets_received") >= min,
            "{tls} {test}: fewer than {min} packets from the client:\n{client_line}\n{server_line}"
        );
        for line in [server_line, client_line] {
            assert_eq!(counter(line, "dropped_bad_icrc"), 0, "{line}");
        }
        if tls.starts_with("rc_verbs") {
            // RC carried them: the responder acknowledged.
            let acks = counter(server_line, "acks_sent") + counter(client_line, "acks_sent");
            assert!(
                acks > 0,
                "{tls} {test}: no RC acknowledgement:\n{server_line}\n{client_line}"
            );
        }
        eprintln!("{tls} {test}: {}", final_figures(&out));
    }
}

#[test]
fn ucx_perftest_runs_tag_lat_tag_bw_put_bw_and_get_over_rc_verbs() {
    four_ucp_tests(
        "rc_verbs,ud_verbs:aux",
        ("127.0.0.153", "127.0.0.154"),
        13410,
    );
}

#[test]
fn ucx_perftest_runs_tag_lat_tag_bw_put_bw_and_get_over_ud_verbs() {
    four_ucp_tests("ud_verbs", ("127.0.0.155", "127.0.0.156"), 13420);
}

/// UCX's event mode (`ucx_perftest -E sleep`: the client sleeps in `ucp_worker_wait`, an
/// `epoll` on the worker's fds, among them the completion channel fd of each verbs
/// transport; before it sleeps, UCX takes its events with `ibv_get_cq_event` until
/// `EAGAIN` and arms its CQs, without polling them after the arm). A completion made
/// between its last poll and the arm (by the device's progress thread, or UCX's async
/// thread) raises its event at the arm, as on a ConnectX HCA (`softverbs-cq`'s
/// `arming_a_cq_that_holds_unannounced_completions_raises_its_event_at_once`): before, the two
/// processes could sleep for ever, each waiting for the other (2 of 40 runs). Five runs.
#[test]
fn ucx_perftest_sleeping_between_messages_runs_to_the_end_over_rc_verbs() {
    let (server, client) = ("127.0.3.23", "127.0.3.24");
    for run in 0..5 {
        let (out, server_err, client_err) = perftest(
            "rc_verbs,ud_verbs:aux",
            ("tag_lat", "2000", &["-E", "sleep"]),
            (server, client),
            13430 + run,
        );
        let client_line = assert_carried(&client_err, client, 2000);
        let server_line = assert_carried(&server_err, server, 2000);
        for line in [client_line, server_line] {
            assert_eq!(counter(line, "dropped_bad_icrc"), 0, "{line}");
        }
        eprintln!("tag_lat -E sleep, run {run}: {}", final_figures(&out));
    }
}

/// UCX in poll mode keeps the CQs of its `ud_verbs` transport armed for good, for its
/// async thread asleep on their channel, while its main thread polls every transport. The
/// device takes such an application for the busy poller it is once it has polled 1,024
/// times since the last arm, and its progress thread naps, leaving the packets to the
/// polling thread (`softverbs-device`'s
/// `a_cq_armed_for_good_beside_a_busy_poller_lets_the_progress_thread_nap`). Before, an
/// armed CQ kept the progress thread receiving beside the poller: it never napped (0 naps
/// in every run), took 3-4 % of the packets and the core with them, and `tag_lat` averaged
/// 9.3-11.5 us one way against 4.1-4.9 us since (pinned pair, 20,000 iterations).
#[test]
fn ucx_perftest_polling_with_its_ud_cqs_armed_lets_the_progress_thread_nap() {
    let (server, client) = ("127.0.3.25", "127.0.3.26");
    let (out, _server_err, client_err) = perftest(
        "rc_verbs,ud_verbs:aux",
        ("tag_lat", "20000", &[]),
        (server, client),
        13440,
    );
    let client_line = assert_carried(&client_err, client, 20000);
    // `progress: naps=N received=M`: the progress thread's naps and the packets it took.
    let naps = counter(client_line, "naps");
    assert!(
        naps >= 1,
        "the client's progress thread never napped beside UCX's polling thread:\n{client_line}"
    );
    eprintln!(
        "tag_lat (poll mode): {}\n{client_line}",
        final_figures(&out)
    );
}
