//! `softverbs plot`: the results of `scripts/bench-device.sh --json` as a picture, through
//! the command: from a file or standard input it writes an SVG naming every curve; an
//! input it cannot read or understand is one line on stderr naming the file, status 1,
//! and no picture.

mod common;

use common::{finish, run, softverbs, text, TempDir};
use std::process::Stdio;

/// A document as the script prints it: the table's rows, then the curves.
const RESULTS: &str = r#"{
  "repetitions": 1,
  "statistic": "median",
  "rows": [{"workload": "1. in-process send 8 B RTT median", "softverbs": 0.9}],
  "series": {
    "latency_rtt_usec": [
      {"name": "softverbs in-process", "softverbs": true, "points": [{"bytes": 8, "value": 0.9}, {"bytes": 65536, "value": 14.0}]},
      {"name": "softverbs shared memory", "softverbs": true, "points": [{"bytes": 8, "value": 2.1}]},
      {"name": "softverbs UDP", "softverbs": true, "points": [{"bytes": 8, "value": 22.0}]},
      {"name": "UCX posix,cma", "softverbs": false, "points": [{"bytes": 8, "value": 0.7}]},
      {"name": "UCX tcp", "softverbs": false, "points": [{"bytes": 8, "value": 30.5}]},
      {"name": "fi_pingpong tcp", "softverbs": false, "points": [{"bytes": 8, "value": 35.0}]},
      {"name": "bare UDP", "softverbs": false, "points": [{"bytes": 8, "value": 15.0}]}
    ],
    "bandwidth_gbit_per_sec": [
      {"name": "softverbs in-process", "softverbs": true, "points": [{"bytes": 65536, "value": 60.0}, {"bytes": 1048576, "value": 45.0}]},
      {"name": "memcpy", "softverbs": false, "points": [{"bytes": 65536, "value": 120.0}, {"bytes": 1048576, "value": 80.0}]}
    ]
  }
}"#;

const NAMES: [&str; 8] = [
    "softverbs in-process",
    "softverbs shared memory",
    "softverbs UDP",
    "UCX posix,cma",
    "UCX tcp",
    "fi_pingpong tcp",
    "bare UDP",
    "memcpy",
];

/// The texts of the SVG document `svg`, which must be well-formed with an `<svg>` root.
fn texts(svg: &str) -> Vec<String> {
    let document = roxmltree::Document::parse(svg).expect("well-formed XML");
    assert_eq!(document.root_element().tag_name().name(), "svg");
    document
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim().to_owned())
        .collect()
}

#[test]
fn the_results_of_a_file_or_of_standard_input_become_a_picture_naming_every_curve() {
    let dir = TempDir::new("bench-plot");
    let input = dir.join("results.json");
    std::fs::write(&input, RESULTS).unwrap();

    let from_file = dir.join("from-file.svg");
    let (code, out, err) = run(&[
        "plot",
        "--input",
        text(&input),
        "--output",
        text(&from_file),
    ]);
    assert!(
        code == 0 && out.is_empty() && err.is_empty(),
        "{code}\n{out}\n{err}"
    );

    let from_stdin = dir.join("from-stdin.svg");
    let child = softverbs()
        .args([
            "plot",
            "-i",
            "-",
            "-o",
            text(&from_stdin),
            "--title",
            "a title",
        ])
        .stdin(Stdio::from(std::fs::File::open(&input).unwrap()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let output = finish(child);
    assert!(output.status.success(), "{output:?}");

    for picture in [&from_file, &from_stdin] {
        let texts = texts(&std::fs::read_to_string(picture).unwrap());
        for name in NAMES {
            assert!(texts.iter().any(|t| t == name), "{name:?} in {texts:?}");
        }
    }
    let texts = texts(&std::fs::read_to_string(&from_stdin).unwrap());
    assert!(texts.iter().any(|t| t == "a title"), "{texts:?}");
}

#[test]
fn an_unreadable_or_malformed_input_is_one_line_naming_the_file_and_status_1() {
    let dir = TempDir::new("bench-plot-errors");
    let picture = dir.join("out.svg");
    let truncated = dir.join("truncated.json");
    std::fs::write(&truncated, &RESULTS[..RESULTS.len() / 2]).unwrap();
    let table = dir.join("table.txt");
    std::fs::write(&table, "workload  softverbs  baseline\n").unwrap();
    let missing = dir.join("missing.json");
    for (input, says) in [
        (
            &truncated,
            "is not the JSON of scripts/bench-device.sh --json",
        ),
        (&table, "is not the JSON of scripts/bench-device.sh --json"),
        (&missing, "cannot read the results"),
    ] {
        let (code, _, err) = run(&["plot", "-i", text(input), "-o", text(&picture)]);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.lines().count() == 1
                && err.starts_with("softverbs: ")
                && err.contains(text(input))
                && err.contains(says)
                && !err.contains("panicked"),
            "{err}"
        );
        assert!(!picture.exists());
    }
}
