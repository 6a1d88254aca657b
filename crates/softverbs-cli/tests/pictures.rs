//! `--plot FILE.svg` through the `softverbs` command: the pictures of `perf` and `pcap`
//! read back as XML and counted (see the guarantees in `src/plot.rs`: a `<circle>` per
//! mark, a `<polyline>` per curve). Devices in-process, or on automatically chosen
//! 127.0.0.x addresses.

mod common;

use common::{packets, run_ok, text, TempDir};
use std::path::Path;

/// What a picture holds: its circles (marks), its curves (polylines of more than two
/// points: the axes are two-point polylines) as pixel points, and its texts.
struct Picture {
    circles: usize,
    curves: Vec<Vec<(f64, f64)>>,
    texts: Vec<String>,
}

/// Parses the SVG at `path` as XML: the root must be `<svg>` in the SVG namespace.
fn picture(path: &Path) -> Picture {
    let source = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let svg = roxmltree::Document::parse(&source).expect("well-formed XML");
    let root = svg.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(
        root.tag_name().namespace(),
        Some("http://www.w3.org/2000/svg")
    );
    let curves = svg
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .map(|n| {
            n.attribute("points")
                .expect("points")
                .split_whitespace()
                .map(|xy| {
                    let (x, y) = xy.split_once(',').expect("x,y");
                    (x.parse().unwrap(), y.parse().unwrap())
                })
                .collect::<Vec<(f64, f64)>>()
        })
        .filter(|points| points.len() > 2)
        .collect();
    Picture {
        circles: svg
            .descendants()
            .filter(|n| n.has_tag_name("circle"))
            .count(),
        curves,
        texts: svg
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .map(|n| n.text().unwrap_or("").trim().to_owned())
            .collect(),
    }
}

// `perf lat -a --plot`: a latency distribution curve per message size (23 sizes, 2 B to
// 8 MiB, as perftest's -a), each a mark per point, percentiles rising left to right and
// latency never falling (pixel y never rising); the JSON on stdout is untouched.
#[test]
fn perf_lat_plot_draws_a_latency_distribution_per_size() {
    let dir = TempDir::new("perf-lat-plot");
    let svg = dir.join("lat.svg");
    let out = run_ok(&[
        "perf",
        "send",
        "lat",
        "-a",
        "-n",
        "200",
        "--in-process",
        "--json",
        "--plot",
        text(&svg),
    ]);
    let doc: serde_json::Value = serde_json::from_str(&out).expect("JSON alone on stdout");
    assert_eq!(doc["results"].as_array().unwrap().len(), 23);
    let picture = picture(&svg);
    assert_eq!(picture.curves.len(), 23);
    for curve in &picture.curves {
        for pair in curve.windows(2) {
            assert!(pair[0].0 < pair[1].0 && pair[0].1 >= pair[1].1, "{pair:?}");
        }
    }
    let points: usize = picture.curves.iter().map(Vec::len).sum();
    assert_eq!(picture.circles, points);
    for label in [
        "Send Latency Test: latency distribution",
        "2 B",
        "8192 B",
        "percentile",
    ] {
        assert!(picture.texts.iter().any(|t| t == label), "{label:?}");
    }
}

// `perf bw -a --plot`: one curve of bandwidth against the message size, a mark per size
// (23 sizes, 2 B to 8 MiB, as perftest's -a), sizes rising left to right.
#[test]
fn perf_bw_all_sizes_plot_draws_bandwidth_against_every_size() {
    let dir = TempDir::new("perf-bw-plot");
    let svg = dir.join("bw.svg");
    run_ok(&[
        "perf",
        "send",
        "bw",
        "-a",
        "--in-process",
        "-n",
        "20",
        "-t",
        "8",
        "--plot",
        text(&svg),
    ]);
    let picture = picture(&svg);
    assert_eq!(picture.curves.len(), 1);
    assert_eq!(picture.curves[0].len(), 23);
    assert_eq!(picture.circles, 23);
    for pair in picture.curves[0].windows(2) {
        assert!(pair[0].0 < pair[1].0, "{pair:?}");
    }
    assert!(picture.texts.iter().any(|t| t == "Send BW Test: bandwidth"));
}

// `pcap --plot`: a mark per packet of the capture (as many as `softverbs pcap` counts), on
// a row per destination QP: the ping-pong's two QPs, the client's and the server's.
#[test]
fn pcap_plot_draws_a_mark_per_packet_on_a_row_per_qp() {
    let dir = TempDir::new("pcap-plot");
    let capture = dir.join("pingpong.pcap");
    run_ok(&["pingpong", "-n", "5", "-s", "100", "--pcap", text(&capture)]);
    let svg = dir.join("timeline.svg");
    let listing = run_ok(&["pcap", "-q", text(&capture), "--plot", text(&svg)]);
    let count = packets(&listing);
    assert!(count >= 20, "{listing}");
    let picture = picture(&svg);
    assert_eq!(picture.circles, count);
    let rows = picture
        .texts
        .iter()
        .filter(|t| t.starts_with("QP 0x"))
        .count();
    assert_eq!(rows, 2, "{:?}", picture.texts);
    let help = run_ok(&["pcap", "--help"]);
    assert!(help.contains("--plot"), "{help}");
}
