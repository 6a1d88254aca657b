//! The command's `SOFTVERBS_STATS` line (issue #17): each device prints, when it closes,
//! the one statistics line the drop-in prints too, with every counter a user needs to
//! explain a run — the faults injected by kind, and what they did: retransmissions,
//! drops by reason, the CQs' high-water marks, the events.
//!
//! The fault layer sits between the engine and the socket (`SOFTVERBS_FAULTS`, egress,
//! one decision per packet), so its counts must close exactly against the engine's and the
//! transport's: every packet the engine sent is one the layer saw, and what reached the
//! socket is what it saw, less what it dropped or still holds, plus its copies.

mod common;

use common::pingpong_pair;
use std::collections::HashMap;

/// The `name=value` pairs of one section (`faults`, `engine`, …) of a statistics line.
fn section(line: &str, name: &str) -> HashMap<String, u64> {
    let body = line
        .split("; ")
        .find_map(|part| part.split_once(&format!("{name}: ")).map(|(_, body)| body))
        .unwrap_or_else(|| panic!("no {name} section in {line}"));
    body.split(' ')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| {
            let v = v.split('/').next().unwrap_or(v);
            (
                k.to_owned(),
                v.parse().unwrap_or_else(|_| panic!("{k}={v}")),
            )
        })
        .collect()
}

/// The one statistics line of a process's device.
fn stats_line(stderr: &str) -> &str {
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("softverbs stats: device softverbs0 address 127.0.0."))
        .collect();
    assert_eq!(lines.len(), 1, "one line per device:\n{stderr}");
    lines[0]
}

#[test]
fn softverbs_stats_shows_the_faults_injected_by_kind_and_they_add_up() {
    // Every kind of fault on both sides' egress (delays and reorders held 1 ms).
    let faults = "drop=0.05,duplicate=0.05,corrupt=0.05,delay=0.05:1ms,reorder=0.05:1ms";
    let server_faults = format!("{faults},seed=31");
    let client_faults = format!("{faults},seed=32");
    let ((server_code, server_out, server_err), (client_code, client_out, client_err)) =
        pingpong_pair(
            &["-n", "200", "-s", "64"],
            &[
                ("SOFTVERBS_FAULTS", &server_faults),
                ("SOFTVERBS_STATS", "stderr"),
            ],
            &[
                ("SOFTVERBS_FAULTS", &client_faults),
                ("SOFTVERBS_STATS", "-"),
            ],
        );
    assert_eq!(
        client_code, 0,
        "client:\n{client_out}\n{client_err}\nserver:\n{server_out}\n{server_err}"
    );
    assert_eq!(server_code, 0, "server:\n{server_out}\n{server_err}");
    let lines = [stats_line(&server_err), stats_line(&client_err)];
    let mut by_kind: HashMap<String, u64> = HashMap::new();
    let mut retransmitted = 0;
    for (me, peer) in [(lines[0], lines[1]), (lines[1], lines[0])] {
        let f = section(me, "faults");
        let engine = section(me, "engine");
        let transport = section(me, "transport");
        for kind in [
            "packets",
            "dropped",
            "duplicated",
            "corrupted",
            "delayed",
            "reordered",
            "released",
        ] {
            let n = *f
                .get(kind)
                .unwrap_or_else(|| panic!("no faults {kind} in {me}"));
            *by_kind.entry(kind.into()).or_default() += n;
        }
        // The layer saw every packet the engine sent, and the socket got what it passed.
        assert_eq!(f["packets"], engine["packets_sent"], "{me}");
        assert_eq!(
            transport["sent_packets"] + f["dropped"] + f["delayed"] + f["reordered"],
            f["packets"] + f["duplicated"] + f["released"],
            "{me}"
        );
        // A corrupted packet (and its copy, if it was duplicated too) is caught by the
        // receiver's ICRC check, never handled.
        assert!(
            section(peer, "transport")["dropped_bad_icrc"] <= f["corrupted"] + f["duplicated"],
            "{peer}\n{me}"
        );
        retransmitted += engine["retransmitted_packets"];
        let cq = section(me, "cq");
        assert!(cq["cqs"] >= 1 && cq["high_water"] >= 1, "{me}");
        assert!(section(me, "events")["port_active"] == 1, "{me}");
    }
    for (kind, n) in &by_kind {
        assert!(*n > 0, "no fault of kind {kind}: {lines:#?}");
    }
    assert!(
        retransmitted > 0,
        "losses and no retransmission: {lines:#?}"
    );
}
