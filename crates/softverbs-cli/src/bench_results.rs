//! `softverbs plot --input RESULTS.json --output FILE.svg`: the results of
//! `scripts/bench-device.sh --json` (or `--plot FILE.svg`, which runs this) as one SVG
//! picture, so that a user sees at a glance where each of softverbs' paths stands beside
//! the tools a user would pick instead.
//!
//! What is read: the document's `series` object, two lists of named curves,
//! `latency_rtt_usec` (round trips in µs) and `bandwidth_gbit_per_sec` (Gbit/s), each
//! curve `{"name", "softverbs", "points": [{"bytes", "value"}]}` with `softverbs` true for
//! softverbs' own paths; and `repetitions`, for the title. Every other field (the table's
//! rows, the two-host details) is left alone, so the document can grow.
//!
//! What is drawn ([`draw`]): two panels, latency and bandwidth against the message size,
//! both axes logarithmic; a legend beside them naming every curve once, in the colour it
//! has in both panels. softverbs' paths are thick lines with filled marks, the others thin
//! lines with hollow marks. A point that cannot sit on a logarithmic axis (a value or size
//! of zero, negative or not finite) is left out; a curve with no point left says
//! "(not measured)" in the legend instead of vanishing. As in [`crate::plot`], every mark is
//! an SVG `<circle>` and nothing else is.
//!
//! Errors: an input that cannot be read, or is not such a document, is an error naming the
//! file and what is wrong (status 1, one line), never a panic.

use crate::plot::{bytes_label, write_svg, FONT, PALETTE};
use crate::Error;
use plotters::coord::Shift;
use plotters::prelude::*;
use serde::Deserialize;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Options of `softverbs plot`.
#[derive(clap::Args, Clone, Debug)]
#[command(after_help = "\
The input is the document `scripts/bench-device.sh --json` prints (its `series`: round \
trips in usec and bandwidths in Gbit/s against the message size, one curve per path or \
tool). `scripts/bench-device.sh --plot FILE.svg` measures and draws in one go.")]
pub struct PlotArgs {
    /// The results: the JSON of `scripts/bench-device.sh --json` ("-": standard input).
    #[arg(short = 'i', long, value_name = "RESULTS.json")]
    pub input: PathBuf,

    /// The SVG file to write.
    #[arg(short = 'o', long, value_name = "FILE.svg")]
    pub output: PathBuf,

    /// The picture's title (default: what the document says of its runs).
    #[arg(long)]
    pub title: Option<String>,
}

/// The part of `scripts/bench-device.sh --json` that `softverbs plot` reads.
#[derive(Deserialize, Debug)]
pub struct BenchResults {
    /// How many repetitions each figure is the median of.
    #[serde(default)]
    pub repetitions: Option<u64>,
    /// The curves to draw.
    pub series: Series,
}

/// The curves of the two panels.
#[derive(Deserialize, Debug)]
pub struct Series {
    /// Round trips in µs against the message size.
    pub latency_rtt_usec: Vec<Curve>,
    /// Bandwidths in Gbit/s (10^9 bits/s) against the message size.
    pub bandwidth_gbit_per_sec: Vec<Curve>,
}

/// One path or tool in one panel.
#[derive(Deserialize, Debug)]
pub struct Curve {
    /// As the legend shows it; a name in both panels is one legend entry, one colour.
    pub name: String,
    /// Whether this is one of softverbs' paths (drawn thick, marks filled).
    #[serde(default)]
    pub softverbs: bool,
    /// The measured points, in any order; none if the measurement failed.
    pub points: Vec<Point>,
}

/// A measured figure at a message size.
#[derive(Deserialize, Debug, Clone, Copy)]
pub struct Point {
    /// The message size in bytes.
    pub bytes: f64,
    /// µs (latency) or Gbit/s (bandwidth).
    pub value: f64,
}

impl Point {
    /// Whether the point can sit on the logarithmic axes.
    fn drawable(self) -> bool {
        self.bytes.is_finite() && self.bytes > 0.0 && self.value.is_finite() && self.value > 0.0
    }
}

impl Curve {
    /// Its drawable points, by size.
    fn drawable(&self) -> Vec<(f64, f64)> {
        let mut points: Vec<(f64, f64)> = self
            .points
            .iter()
            .filter(|p| p.drawable())
            .map(|p| (p.bytes, p.value))
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        points
    }
}

/// Reads the document at `path` ("-": standard input).
pub fn read(path: &Path) -> Result<BenchResults, Error> {
    let shown = if path == Path::new("-") {
        "standard input".to_owned()
    } else {
        path.display().to_string()
    };
    let text = if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map(|_| text)
    } else {
        std::fs::read_to_string(path)
    }
    .map_err(|e| format!("cannot read the results {shown}: {e}"))?;
    serde_json::from_str(&text).map_err(|e| {
        format!("{shown} is not the JSON of scripts/bench-device.sh --json: {e}").into()
    })
}

/// Runs `softverbs plot`.
pub fn run(args: &PlotArgs) -> Result<(), Error> {
    let results = read(&args.input)?;
    let runs = match results.repetitions {
        Some(1) => ", one run".to_owned(),
        Some(n) => format!(", medians of {n} runs"),
        None => String::new(),
    };
    let title = args
        .title
        .clone()
        .unwrap_or_else(|| format!("softverbs beside its peers (scripts/bench-device.sh{runs})"));
    draw(&args.output, &title, &results.series)
}

/// A legend entry: a name, whether it is softverbs', whether any panel has a point of it.
struct Entry<'a> {
    name: &'a str,
    softverbs: bool,
    measured: bool,
}

/// The legend: every name once, in order of first appearance (latency first); a name's
/// index is its colour's.
fn entries(series: &Series) -> Vec<Entry<'_>> {
    let mut entries: Vec<Entry<'_>> = Vec::new();
    for curve in series
        .latency_rtt_usec
        .iter()
        .chain(&series.bandwidth_gbit_per_sec)
    {
        let measured = !curve.drawable().is_empty();
        match entries.iter_mut().find(|e| e.name == curve.name) {
            Some(entry) => {
                entry.measured |= measured;
                entry.softverbs |= curve.softverbs;
            }
            None => entries.push(Entry {
                name: &curve.name,
                softverbs: curve.softverbs,
                measured,
            }),
        }
    }
    entries
}

/// The colour of the curve `name` (its legend entry's).
fn colour(entries: &[Entry<'_>], name: &str) -> RGBColor {
    let index = entries.iter().position(|e| e.name == name).unwrap_or(0);
    PALETTE[index % PALETTE.len()]
}

/// "0.5", "12", "3.25": a value as an axis label, without trailing zeros.
fn value_label(value: f64) -> String {
    let text = if value >= 100.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.3}")
    };
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

const WIDTH: u32 = 1500;
const HEIGHT: u32 = 640;
const LEGEND_WIDTH: u32 = 300;

/// Draws `series` into the SVG file `path`, with `title` above: see the module's doc.
pub fn draw(path: &Path, title: &str, series: &Series) -> Result<(), Error> {
    let entries = entries(series);
    write_svg(path, (WIDTH, HEIGHT), |root| {
        let area = root.titled(title, (FONT, 22))?;
        let (panels, legend_area) = area.split_horizontally(WIDTH - LEGEND_WIDTH);
        let panels = panels.split_evenly((1, 2));
        panel(
            &panels[0],
            "round trip (softverbs, UCX: median; fi_pingpong: average)",
            "round trip [usec]",
            &series.latency_rtt_usec,
            &entries,
        )?;
        panel(
            &panels[1],
            "bandwidth (RDMA write, ucp_put_bw, memcpy, UDP stream)",
            "bandwidth [Gbit/s]",
            &series.bandwidth_gbit_per_sec,
            &entries,
        )?;
        legend(&legend_area, &entries)
    })
}

/// The range of a logarithmic axis holding `values` with some room around them (1 to 10
/// when there is none).
fn log_range(values: impl Iterator<Item = f64>, room: f64) -> std::ops::Range<f64> {
    let (low, high) = values.fold((f64::INFINITY, 0.0f64), |(low, high), v| {
        (low.min(v), high.max(v))
    });
    if high == 0.0 {
        1.0..10.0
    } else {
        low / room..high * room
    }
}

/// One panel: `curves` on logarithmic axes, message size across.
fn panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    caption: &str,
    y_desc: &str,
    curves: &[Curve],
    entries: &[Entry<'_>],
) -> Result<(), Error> {
    let drawn: Vec<(&Curve, Vec<(f64, f64)>)> = curves.iter().map(|c| (c, c.drawable())).collect();
    let all = || drawn.iter().flat_map(|(_, points)| points.iter().copied());
    let x = log_range(all().map(|p| p.0), 2.0);
    let y = log_range(all().map(|p| p.1), 1.6);
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 16))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d(x.log_scale().base(2.0), y.log_scale())?;
    chart
        .configure_mesh()
        .x_desc("message size [bytes]")
        .y_desc(y_desc)
        .x_label_formatter(&|bytes| bytes_label(*bytes))
        .y_label_formatter(&|value| value_label(*value))
        .draw()?;
    for (curve, points) in &drawn {
        if points.is_empty() {
            continue;
        }
        let colour = colour(entries, &curve.name);
        let (line, mark) = if curve.softverbs {
            (colour.stroke_width(3), colour.filled())
        } else {
            (colour.stroke_width(1), colour.stroke_width(2))
        };
        chart.draw_series(LineSeries::new(points.iter().copied(), line))?;
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, mark)))?;
    }
    Ok(())
}

/// The legend column: softverbs' paths, then the others, each a swatch (filled for
/// softverbs) and its name.
fn legend(area: &DrawingArea<SVGBackend<'_>, Shift>, entries: &[Entry<'_>]) -> Result<(), Error> {
    let mut y = 60;
    for (heading, softverbs) in [("softverbs", true), ("peers and floors", false)] {
        area.draw(&Text::new(
            heading,
            (10, y),
            (FONT, 16).into_font().style(FontStyle::Bold),
        ))?;
        y += 26;
        for entry in entries.iter().filter(|e| e.softverbs == softverbs) {
            let colour = colour(entries, entry.name);
            let swatch = if softverbs {
                colour.filled()
            } else {
                colour.stroke_width(2)
            };
            area.draw(&Rectangle::new([(14, y + 2), (34, y + 12)], swatch))?;
            let text = if entry.measured {
                entry.name.to_owned()
            } else {
                format!("{} (not measured)", entry.name)
            };
            area.draw(&Text::new(text, (42, y), (FONT, 14)))?;
            y += 24;
        }
        y += 14;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A temporary file path.
    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("softverbs-bench-results-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    /// The texts and the circle count of the SVG at `path`, read as XML.
    fn texts_and_circles(path: &Path) -> (Vec<String>, usize) {
        let text = std::fs::read_to_string(path).unwrap();
        let svg = roxmltree::Document::parse(&text).expect("well-formed XML");
        assert_eq!(svg.root_element().tag_name().name(), "svg");
        let texts = svg
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .map(|n| n.text().unwrap_or("").trim().to_owned())
            .collect();
        let circles = svg
            .descendants()
            .filter(|n| n.has_tag_name("circle"))
            .count();
        (texts, circles)
    }

    /// A document as the script writes it, with other fields around the series, a curve
    /// in both panels, one point not drawable (zero) and one curve with no point.
    const SAMPLE: &str = r#"{
      "repetitions": 3, "statistic": "median", "rows": [{"workload": "ignored"}],
      "series": {
        "latency_rtt_usec": [
          {"name": "softverbs in-process", "softverbs": true,
           "points": [{"bytes": 8, "value": 0.8}, {"bytes": 65536, "value": 12.5}]},
          {"name": "softverbs UDP", "softverbs": true,
           "points": [{"bytes": 1048576, "value": 400}, {"bytes": 8, "value": 21}]},
          {"name": "UCX posix,cma", "softverbs": false, "points": [{"bytes": 8, "value": 0.6}]},
          {"name": "fi_pingpong udp", "softverbs": false, "points": []}
        ],
        "bandwidth_gbit_per_sec": [
          {"name": "softverbs in-process", "softverbs": true,
           "points": [{"bytes": 65536, "value": 40}, {"bytes": 1048576, "value": 0}]},
          {"name": "memcpy", "softverbs": false, "points": [{"bytes": 65536, "value": 90}]}
        ]
      }
    }"#;

    // Every curve of both panels is named in the legend once (a dropped curve would be
    // missing), a curve with nothing to draw says so, and every drawable point is one
    // mark: 2 + 2 + 1 latency points, 1 + 1 bandwidth points (the zero left out).
    #[test]
    fn the_picture_names_every_series_once_and_marks_every_drawable_point() {
        let input = scratch("sample.json");
        std::fs::write(&input, SAMPLE).unwrap();
        let output = scratch("sample.svg");
        run(&PlotArgs {
            input,
            output: output.clone(),
            title: None,
        })
        .unwrap();
        let (texts, circles) = texts_and_circles(&output);
        for name in [
            "softverbs in-process",
            "softverbs UDP",
            "UCX posix,cma",
            "fi_pingpong udp (not measured)",
            "memcpy",
        ] {
            let count = texts.iter().filter(|t| *t == name).count();
            assert_eq!(count, 1, "{name:?} in {texts:?}");
        }
        assert_eq!(circles, 7);
        assert!(
            texts.iter().any(|t| t.contains("medians of 3 runs")),
            "{texts:?}"
        );
        assert!(texts.iter().any(|t| t == "round trip [usec]"), "{texts:?}");
        assert!(texts.iter().any(|t| t == "bandwidth [Gbit/s]"), "{texts:?}");
    }

    // A name keeps its colour in both panels and its place in the legend.
    #[test]
    fn a_name_in_both_panels_is_one_legend_entry_of_one_colour() {
        let results: BenchResults = serde_json::from_str(SAMPLE).unwrap();
        let entries = entries(&results.series);
        let names: Vec<&str> = entries.iter().map(|e| e.name).collect();
        assert_eq!(
            names,
            [
                "softverbs in-process",
                "softverbs UDP",
                "UCX posix,cma",
                "fi_pingpong udp",
                "memcpy"
            ]
        );
        assert!(entries[0].softverbs && entries[0].measured);
        assert!(!entries[3].measured);
        assert_eq!(colour(&entries, "memcpy"), PALETTE[4]);
    }

    // An input that is missing, not JSON, or JSON of something else is an error naming
    // the file and the fault, not a panic.
    #[test]
    fn an_unreadable_or_malformed_input_is_an_error_naming_the_file() {
        let missing = scratch("no such results.json");
        let error = read(&missing).unwrap_err().to_string();
        assert!(
            error.contains("cannot read the results") && error.contains("no such results.json"),
            "{error}"
        );
        for (name, text, fault) in [
            ("truncated.json", &SAMPLE[..40], "EOF"),
            ("other.json", r#"{"rows": []}"#, "missing field `series`"),
            (
                "wrong.json",
                r#"{"series": {"latency_rtt_usec": 3, "bandwidth_gbit_per_sec": []}}"#,
                "invalid type",
            ),
        ] {
            let path = scratch(name);
            std::fs::write(&path, text).unwrap();
            let error = read(&path).unwrap_err().to_string();
            assert!(
                error.contains(name)
                    && error.contains("is not the JSON of scripts/bench-device.sh --json")
                    && error.contains(fault),
                "{error}"
            );
        }
    }

    #[test]
    fn axis_labels_have_no_trailing_zeros() {
        assert_eq!(value_label(0.5), "0.5");
        assert_eq!(value_label(2.0), "2");
        assert_eq!(value_label(12.25), "12.25");
        assert_eq!(value_label(400.0), "400");
        assert_eq!(value_label(0.001), "0.001");
    }
}
