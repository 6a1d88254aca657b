//! `softverbs perf` takes perftest's common flags with perftest's meaning (perftest's
//! usage text, src/perftest_parameters.c: `-s` size, `-n` iterations, `-a` "sizes from 2
//! till 2^23", `-D` duration in seconds measured within margins, `-F` no CPU-frequency
//! warning, `-t` TX depth, `-q` QPs, `-I` inline size, `-R` rdma_cm, `--report_gbits`
//! "Gbit/sec (instead of MiB/sec)", `--output=bandwidth|message_rate|latency` "print only
//! the measured value", `-e` sleep on CQ events) and prints perftest's result table
//! (RESULT_FMT, RESULT_FMT_G, RESULT_FMT_LAT of perftest_parameters.h); `--histogram`
//! prints the distribution it measured. `-q N` runs N RC QPs in a bw test as perftest's
//! `run_iter_bw` does (src/perftest_resources.c). Runs in one process over UDP loopback or
//! in process, and for `-q` with the server in another process.

mod common;

use common::{finish_server, run, run_ok, start_server};
use std::time::{Duration, Instant};

/// The whitespace-separated numbers of the one row whose first column is `bytes`.
fn row(out: &str, bytes: &str) -> Vec<f64> {
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.first() == Some(&bytes) && w.len() > 2)
        .collect();
    assert_eq!(rows.len(), 1, "one row of {bytes} bytes in\n{out}");
    rows[0]
        .iter()
        .map(|w| w.parse().unwrap_or_else(|_| panic!("{w:?} in\n{out}")))
        .collect()
}

fn json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["perf"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = run_ok(&all);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}):\n{out}"))
}

#[test]
fn bw_prints_perftests_table_in_mib_per_sec_or_with_report_gbits_in_gb_per_sec() {
    let out = run_ok(&[
        "perf", "write", "bw", "-s", "4096", "-n", "300", "-t", "16", "-F",
    ]);
    assert!(
        out.contains(
            " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]"
        ),
        "{out}"
    );
    let out = run_ok(&[
        "perf",
        "write",
        "bw",
        "-s",
        "4096",
        "-n",
        "300",
        "-t",
        "16",
        "--report_gbits",
    ]);
    assert!(
        out.contains(
            " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
        ),
        "{out}"
    );
    let r = row(&out, "4096");
    let (iterations, peak, average, rate) = (r[1], r[2], r[3], r[4]);
    assert_eq!(iterations, 300.0, "{out}");
    // The whole run is one of the runs the peak is the best of.
    assert!(average > 0.0 && peak >= average * 0.999, "{out}");
    // Gb/sec = messages/sec * bytes * 8 / 10^9.
    let from_rate = rate * 1e6 * 4096.0 * 8.0 / 1e9;
    assert!(
        (from_rate - average).abs() <= average * 0.01 + 0.01,
        "{out}"
    );
}

#[test]
fn lat_prints_perftests_table() {
    let out = run_ok(&["perf", "send", "lat", "-s", "64", "-n", "300"]);
    assert!(
        out.contains(
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    \
             t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]"
        ),
        "{out}"
    );
    let r = row(&out, "64");
    let (iterations, min, max, typical, avg, p99, p999) =
        (r[1], r[2], r[3], r[4], r[5], r[7], r[8]);
    assert_eq!(iterations, 300.0);
    assert!(0.0 < min && min <= typical && typical <= max, "{out}");
    assert!(min <= avg && avg <= max, "{out}");
    assert!(typical <= p99 && p99 <= p999 && p999 <= max, "{out}");
}

#[test]
fn output_prints_only_the_measured_value() {
    for (args, lines) in [
        (
            &["perf", "write", "bw", "-n", "200", "--output=bandwidth"][..],
            1,
        ),
        (
            &["perf", "write", "bw", "-n", "200", "--output=message_rate"][..],
            1,
        ),
        (
            &["perf", "read", "lat", "-n", "200", "--output", "latency"][..],
            1,
        ),
        (
            &[
                "perf",
                "send",
                "lat",
                "-n",
                "20",
                "-a",
                "--in-process",
                "--output=latency",
            ][..],
            23,
        ),
    ] {
        let out = run_ok(args);
        let values: Vec<f64> = out
            .lines()
            .map(|l| {
                l.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{l:?} in\n{out}"))
            })
            .collect();
        assert_eq!(values.len(), lines, "{args:?}:\n{out}");
        assert!(values.iter().all(|v| *v > 0.0), "{args:?}:\n{out}");
    }
    // perftest: "Output verbosity level for BW can be: bandwidth, message_rate".
    let (code, _, err) = run(&["perf", "write", "bw", "--output=latency"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("bandwidth, message_rate"), "{err}");
}

#[test]
fn duration_runs_that_long_and_measures_the_middle_half() {
    for (op, kind) in [
        ("send", "lat"),
        ("write", "lat"),
        ("send", "bw"),
        ("read", "bw"),
    ] {
        let started = Instant::now();
        let doc = json(&[op, kind, "-D", "2", "-s", "1024", "--in-process"]);
        let took = started.elapsed();
        assert!(took >= Duration::from_secs(2), "{op} {kind} took {took:?}");
        assert_eq!(doc["duration_sec"], 2, "{doc}");
        let r = &doc["results"][0];
        assert!(r["iterations"].as_u64() > Some(0), "{doc}");
        // The margins are a quarter of the duration at each end (perftest: margin =
        // duration / 4): one second measured.
        let measured = r["elapsed_sec"].as_f64().unwrap();
        // (0.8 to 1.3 s: the edges of the window fall between iterations, on a busy
        // machine too; the whole run would be 2 s.)
        assert!((0.8..=1.3).contains(&measured), "{op} {kind}: {doc}");
        if kind == "bw" {
            // perftest: "BW peak won't be measured in this run".
            assert!(r.get("bw_peak_gbit_per_sec").is_none(), "{doc}");
        }
    }
    // perftest: "Duration mode currently doesn't support running on all sizes", and
    // "Duration mode doesn't work with events".
    for conflict in ["-a", "-e"] {
        let (code, _, err) = run(&["perf", "send", "bw", "-D", "1", conflict]);
        assert_eq!(code, 2, "{conflict}: {err}");
    }
}

#[test]
fn defaults_sizes_and_iterations_are_perftests() {
    // perftest: DEF_ITERS 1000, DEF_ITERS_WB 5000 for write bw; DEF_SIZE_BW 65536,
    // DEF_SIZE_LAT 2.
    let doc = json(&["write", "bw", "--in-process"]);
    assert_eq!(doc["results"][0]["iterations"], 5000, "{doc}");
    assert_eq!(doc["results"][0]["bytes"], 65536, "{doc}");
    let doc = json(&["send", "bw", "--in-process"]);
    assert_eq!(doc["results"][0]["iterations"], 1000, "{doc}");
    let doc = json(&["send", "lat", "--in-process"]);
    assert_eq!(doc["results"][0]["iterations"], 1000, "{doc}");
    assert_eq!(doc["results"][0]["bytes"], 2, "{doc}");
}

#[test]
fn events_inline_and_tx_depth_are_taken() {
    // (arguments, iterations, events, inline size, TX depth)
    for (args, iterations, events, inline, tx_depth) in [
        (&["send", "lat", "-n", "200", "-e"][..], 200, true, 0, 128),
        (
            &["read", "bw", "-n", "500", "-e", "-t", "4"][..],
            500,
            true,
            0,
            4,
        ),
        (
            &["send", "bw", "-n", "500", "-I", "64", "-s", "64", "-t", "8"][..],
            500,
            false,
            64,
            8,
        ),
        (
            &["write", "lat", "-n", "200", "-I", "128", "-s", "100"][..],
            200,
            false,
            128,
            128,
        ),
    ] {
        let doc = json(args);
        assert_eq!(
            doc["results"][0]["iterations"], iterations,
            "{args:?}: {doc}"
        );
        assert_eq!(doc["events"], events, "{args:?}: {doc}");
        assert_eq!(doc["inline_size"], inline, "{args:?}: {doc}");
        assert_eq!(doc["tx_depth"], tx_depth, "{args:?}: {doc}");
    }
}

#[test]
fn what_softverbs_does_not_do_is_refused_by_name() {
    for (args, says) in [
        (
            &["perf", "write", "bw", "-R"][..],
            "-R (rdma_cm): not yet supported",
        ),
        // perftest: "Inline feature not available on READ/Atomic verbs".
        (
            &["perf", "read", "bw", "-I", "64"][..],
            "not available for read and atomic",
        ),
        (
            &["perf", "send", "lat", "-I", "100000"][..],
            "max_inline_data",
        ),
    ] {
        let (code, out, err) = run(args);
        assert_eq!(code, 1, "{args:?}:\n{out}\n{err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

/// The QPs of a `-q 4 -n 400` bw run.
const QPS: u64 = 4;
/// The iterations of each QP in that run.
const ITERS_PER_QP: u64 = 400;

/// Checks the JSON report of `perf OP bw -q 4 -n 400`. perftest's run_iter_bw
/// (src/perftest_resources.c) has every QP post while `scnt[index] < iters`, so each QP
/// runs all of `-n`, and print_report_bw (src/perftest_parameters.c) reports
/// `iters * num_of_qps` iterations and the bandwidth of them all.
fn assert_every_qp_ran_every_iteration(doc: &serde_json::Value, what: &str) {
    assert_eq!(doc["qps"], QPS, "{what}: {doc}");
    let r = &doc["results"][0];
    // Counted by the QP each completion names (its qp_num): an idle QP shows 0, a lost
    // or an extra message shows in its QP's count.
    assert_eq!(
        r["completions_per_qp"],
        serde_json::json!(vec![ITERS_PER_QP; QPS as usize]),
        "{what}: {doc}"
    );
    let total = QPS * ITERS_PER_QP;
    assert_eq!(r["iterations"], total, "{what}: {doc}");
    // The bandwidth is that of every QP's messages together.
    let bytes = r["bytes"].as_u64().expect("bytes");
    let (elapsed, bw) = (r["elapsed_sec"].as_f64(), r["bw_gbit_per_sec"].as_f64());
    let (Some(elapsed), Some(bw)) = (elapsed, bw) else {
        panic!("{what}: no elapsed_sec or bw_gbit_per_sec in {doc}");
    };
    let all = (total * bytes * 8) as f64 / elapsed / 1e9;
    assert!(
        (bw - all).abs() <= all * 0.01,
        "{what}: {bw} Gb/s, not {all}: {doc}"
    );
    // And the client's device carried them: the data of every message left it (send,
    // write, atomic) or reached it (read) — at least one packet per 64 KiB, the largest
    // segment (between devices of this process; 32 KiB through shared memory, one per
    // 4096-byte MTU over the wire).
    let packets = total * bytes.div_ceil(64 * 1024);
    let counters = &doc["client_counters"];
    let carried = if what.starts_with("read") {
        &counters["packets_received"]
    } else {
        &counters["packets_sent"]
    };
    assert!(
        carried.as_u64().is_some_and(|n| n >= packets),
        "{what}: fewer than {packets} packets: {doc}"
    );
}

#[test]
fn q_runs_every_iteration_on_each_of_the_qps_and_reports_their_total() {
    for mode in [&["--in-process"][..], &[][..]] {
        for op in ["write", "send", "read", "atomic"] {
            let mut args = vec![op, "bw", "-q", "4", "-n", "400"];
            args.extend_from_slice(mode);
            assert_every_qp_ran_every_iteration(&json(&args), &args.join(" "));
        }
    }
}

#[test]
fn q_reaches_every_qp_of_a_server_in_another_process() {
    for op in ["write", "send", "read"] {
        // The server takes -q from the client: it is given none.
        let (mut server, stdout, port) = start_server(&["perf", op, "bw"]);
        let port = port.to_string();
        let (code, out, err) = run(&[
            "perf",
            op,
            "bw",
            "-q",
            "4",
            "-n",
            "400",
            "--client",
            "127.0.0.1",
            "-p",
            &port,
            "--json",
        ]);
        if code != 0 {
            // A client that failed leaves the server waiting: stop it now.
            let _ = server.kill();
        }
        let (server_code, server_out) = finish_server(server, stdout);
        assert_eq!(code, 0, "client:\n{out}\n{err}\nserver:\n{server_out}");
        assert_eq!(server_code, 0, "server:\n{server_out}");
        let doc = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}):\n{out}"));
        assert_every_qp_ran_every_iteration(&doc, &format!("{op} bw --client"));
        assert!(
            server_out.contains("4 QPs x 400 iterations each"),
            "{server_out}"
        );
    }
}

#[test]
fn q_prints_perftests_number_of_qps_and_counts_every_qps_iterations_in_the_table() {
    // perftest_parameters.c, ctx_print_test_info: " Number of qps   : %d".
    let out = run_ok(&["perf", "send", "bw", "-q", "4", "-n", "400", "-s", "4096"]);
    assert!(out.contains(" Number of qps   : 4\n"), "{out}");
    assert_eq!(row(&out, "4096")[1], 1600.0, "{out}");
    let out = run_ok(&["perf", "send", "bw", "-n", "400", "-s", "4096"]);
    assert!(out.contains(" Number of qps   : 1\n"), "{out}");
}

#[test]
fn q_is_refused_where_perftest_refuses_it_naming_the_rule() {
    for (args, says) in [
        // perftest_parameters.c, case 'q': "Multiple QPs only available on bw tests".
        (
            &["perf", "send", "lat", "-q", "2"][..],
            "-q 2: multiple QPs are only for bw tests (perftest's rule)",
        ),
        (
            &["perf", "write", "lat", "-q", "2"][..],
            "-q 2: multiple QPs are only for bw tests (perftest's rule)",
        ),
        (
            &["perf", "read", "lat", "-q", "3"][..],
            "-q 3: multiple QPs are only for bw tests (perftest's rule)",
        ),
        (
            &["perf", "atomic", "lat", "-q", "2"][..],
            "-q 2: multiple QPs are only for bw tests (perftest's rule)",
        ),
        // CHECK_VALUE_IN_RANGE(num_of_qps, MIN_QP_NUM 1, MAX_QP_NUM 16384).
        (
            &["perf", "write", "bw", "-q", "0"][..],
            "-q 0: give 1 to 16384 QPs (perftest's range)",
        ),
        (
            &["perf", "write", "bw", "-q", "16385"][..],
            "-q 16385: give 1 to 16384 QPs (perftest's range)",
        ),
    ] {
        let (code, out, err) = run(args);
        assert_eq!(code, 1, "{args:?}:\n{out}\n{err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
    }
}

#[test]
fn histogram_prints_the_distribution_it_measured() {
    let out = run_ok(&["perf", "send", "lat", "-n", "300", "--histogram"]);
    let at = out
        .lines()
        .position(|l| l.trim() == "value[usec]   percentile        count")
        .unwrap_or_else(|| panic!("no histogram in\n{out}"));
    let lines: Vec<Vec<f64>> = out
        .lines()
        .skip(at + 1)
        .map_while(|l| {
            let words: Vec<f64> = l
                .split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect();
            (words.len() == 3).then_some(words)
        })
        .collect();
    assert!(lines.len() > 3, "{out}");
    assert!(
        lines
            .windows(2)
            .all(|w| w[0][0] <= w[1][0] && w[0][1] <= w[1][1]),
        "{out}"
    );
    assert_eq!(lines.last().unwrap()[1], 100.0, "{out}");
    let counted: f64 = lines.iter().map(|l| l[2]).sum();
    assert_eq!(counted, 300.0, "{out}");

    let doc = json(&["write", "bw", "-n", "400", "--histogram", "--in-process"]);
    let histogram = doc["results"][0]["histogram"]
        .as_array()
        .expect("histogram");
    let counted: u64 = histogram.iter().map(|l| l["count"].as_u64().unwrap()).sum();
    assert_eq!(counted, 400, "{doc}");
}

#[test]
fn a_long_run_shows_progress_on_a_terminal_and_nothing_when_piped() {
    let binary = env!("CARGO_BIN_EXE_softverbs");
    let run_args = "perf write bw -D 1 -s 4096 --in-process";
    // On a terminal: util-linux's script(1) gives the command a pseudo-terminal for its
    // stdout and stderr, and copies what it writes there to our pipe.
    let output = std::process::Command::new("script")
        .args(["-qfec", &format!("{binary} {run_args}"), "/dev/null"])
        .env("TERM", "xterm")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("script(1) is required (Debian package bsdutils): {e}"));
    let screen = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{screen}");
    assert!(
        screen.contains("4096 bytes [") && screen.contains("100%"),
        "no progress bar on the terminal:\n{screen}"
    );
    // Piped: stderr stays empty.
    let args: Vec<&str> = run_args.split(' ').collect();
    let (code, out, err) = run(&args);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(err.is_empty(), "progress on a pipe: {err:?}");
    assert!(!out.contains('\r'), "{out:?}");
}
