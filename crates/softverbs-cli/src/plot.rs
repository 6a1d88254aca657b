//! `--plot FILE.svg`: pictures of a perf run and of a capture, drawn as SVG with
//! `plotters`.
//!
//! - [`perf`]: a lat test as its latency distribution, one curve per message size
//!   (latency against percentile, on HdrHistogram's "one in N" scale: the median at 2,
//!   p99 at 100, the maximum at the sample count; [`percentile_curve`]); a bw test as its
//!   bandwidth against the message size (every size with `-a`).
//! - [`capture_timeline`]: a capture as a per-QP timeline: one row per destination QP
//!   (BTH destination QP at the destination address), one mark per RoCEv2 packet at its
//!   capture time, its kind told by colour and size ([`MarkKind`]): requests,
//!   retransmitted requests, responses (ACK, read response, atomic ACK), NAKs, RNR NAKs.
//!
//! What the pictures guarantee, so that they can be checked by counting: every mark of a
//! data point or packet is an SVG `<circle>` and nothing else is (legend entries are
//! rectangles), and every curve is a `<polyline>` of one point per mark. No font is read:
//! the SVG backend writes `<text>` elements and leaves the fonts to the viewer (plotters is
//! built without its `ttf` feature, so nothing links fontconfig or FreeType). The picture
//! is drawn in memory and written at once; a file that cannot be written is an error
//! naming it.

use crate::stats::Latencies;
use crate::Error;
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use softverbs_device::pcap::{CaptureRecord, Direction};
use softverbs_wire::{AethSyndrome, Psn};
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;

/// Colours of the curves, in order (the picture cycles through them).
pub(crate) const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

pub(crate) const FONT: &str = "sans-serif";

/// Draws with `draw` into an SVG of `size` pixels and writes it to `path`.
pub(crate) fn write_svg(
    path: &Path,
    size: (u32, u32),
    draw: impl FnOnce(&DrawingArea<SVGBackend<'_>, plotters::coord::Shift>) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE)?;
        draw(&root)?;
        root.present()?;
    }
    std::fs::write(path, svg)
        .map_err(|e| format!("cannot write the picture {}: {e}", path.display()))?;
    Ok(())
}

/// The points of a latency distribution curve: `(n, latency in µs)`, `n` meaning "one
/// sample in n": the latency at quantile `1 - 1/n` (the minimum at 1, the median at 2,
/// p99 at 100), four points per halving of the tail, and the maximum at `n` = the sample
/// count. Empty for no sample. `n` rises strictly and the latency never falls.
pub fn percentile_curve(latencies: &Latencies) -> Vec<(f64, f64)> {
    let samples = latencies.len() as f64;
    let mut points = Vec::new();
    // 2^(i/4) passes any u64 sample count by i = 256.
    for i in 0..=256 {
        let one_in = 2f64.powf(f64::from(i) / 4.0);
        if one_in > samples {
            break;
        }
        points.push((one_in, latencies.quantile_us(1.0 - 1.0 / one_in)));
    }
    if points.last().is_some_and(|&(one_in, _)| one_in < samples) {
        points.push((samples, latencies.quantile_us(1.0)));
    }
    points
}

/// "90%", "99.9%": the percentile of "one in `n`".
fn percentile_label(one_in: f64) -> String {
    let percent = 100.0 * (1.0 - 1.0 / one_in);
    let text = format!("{percent:.4}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}%")
}

/// "64", "2K", "1M", or bytes as they are when not a whole number of KiB / MiB.
pub(crate) fn bytes_label(bytes: f64) -> String {
    let bytes = bytes.round() as u64;
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{}M", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
        format!("{}K", bytes >> 10)
    } else {
        bytes.to_string()
    }
}

/// One message size of a perf run, as [`perf`] draws it.
pub struct PerfSize<'a> {
    /// The message size in bytes.
    pub bytes: usize,
    /// Its latency distribution ([`percentile_curve`]).
    pub curve: &'a [(f64, f64)],
    /// Its bandwidth in Gbit/s (bw tests only).
    pub gbit_per_sec: Option<f64>,
}

/// Draws a perf run into the SVG file `path`: the bandwidth against the message size if
/// every size has a bandwidth (a bw test), else the latency distribution of each size.
pub fn perf(path: &Path, title: &str, sizes: &[PerfSize<'_>]) -> Result<(), Error> {
    let bandwidths: Option<Vec<(f64, f64)>> = sizes
        .iter()
        .map(|s| s.gbit_per_sec.map(|bw| (s.bytes as f64, bw)))
        .collect();
    match bandwidths {
        Some(mut points) if !points.is_empty() => {
            // A run too short to time has no finite bandwidth: left out, not drawn at
            // infinity.
            points.retain(|p| p.1.is_finite());
            bandwidth(path, title, &points)
        }
        _ => latency(path, title, sizes),
    }
}

fn bandwidth(path: &Path, title: &str, points: &[(f64, f64)]) -> Result<(), Error> {
    let largest = points.iter().map(|p| p.0).fold(1.0, f64::max);
    let smallest = points.iter().map(|p| p.0).fold(largest, f64::min);
    let fastest = points.iter().map(|p| p.1).fold(0.0, f64::max);
    let colour = PALETTE[0];
    write_svg(path, (1000, 600), |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(format!("{title}: bandwidth"), (FONT, 24))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(64)
            .build_cartesian_2d(
                (smallest / 1.5..largest * 1.5).log_scale().base(2.0),
                0.0..(fastest * 1.1).max(1e-3),
            )?;
        chart
            .configure_mesh()
            .x_desc("message size [bytes]")
            .y_desc("bandwidth [Gbit/s]")
            .x_label_formatter(&|bytes| bytes_label(*bytes))
            .draw()?;
        chart.draw_series(LineSeries::new(
            points.iter().copied(),
            colour.stroke_width(2),
        ))?;
        chart.draw_series(
            points
                .iter()
                .map(|&point| Circle::new(point, 4, colour.filled())),
        )?;
        Ok(())
    })
}

fn latency(path: &Path, title: &str, sizes: &[PerfSize<'_>]) -> Result<(), Error> {
    let samples = sizes
        .iter()
        .filter_map(|s| s.curve.last().map(|p| p.0))
        .fold(2.0, f64::max);
    let slowest = sizes
        .iter()
        .flat_map(|s| s.curve.iter().map(|p| p.1))
        .fold(0.0, f64::max);
    write_svg(path, (1000, 600), |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(format!("{title}: latency distribution"), (FONT, 24))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(64)
            .build_cartesian_2d((1.0..samples).log_scale(), 0.0..(slowest * 1.1).max(1e-3))?;
        chart
            .configure_mesh()
            .x_desc("percentile")
            .y_desc("latency [usec]")
            .x_label_formatter(&|one_in| percentile_label(*one_in))
            .draw()?;
        for (i, size) in sizes.iter().enumerate() {
            let colour = PALETTE[i % PALETTE.len()];
            chart
                .draw_series(LineSeries::new(
                    size.curve.iter().copied(),
                    colour.stroke_width(2),
                ))?
                .label(format!("{} B", size.bytes))
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 4), (x + 16, y + 4)], colour.filled())
                });
            chart.draw_series(
                size.curve
                    .iter()
                    .map(|&point| Circle::new(point, 2, colour.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font((FONT, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
        Ok(())
    })
}

/// The kind of a packet in a capture timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MarkKind {
    /// A request (send, write, read request, atomic) with a PSN after every PSN already
    /// seen on its QP in its direction.
    Request,
    /// A request whose PSN is not after the highest already seen on its QP in its
    /// direction: sent again (go-back-N, a timeout) or duplicated on the way.
    Retransmit,
    /// An ACK, a read response or an atomic ACK.
    Response,
    /// A NAK (PSN sequence error, invalid request, remote access or operational error).
    Nak,
    /// A receiver-not-ready NAK.
    RnrNak,
}

impl MarkKind {
    const ALL: [MarkKind; 5] = [
        MarkKind::Request,
        MarkKind::Response,
        MarkKind::Retransmit,
        MarkKind::Nak,
        MarkKind::RnrNak,
    ];

    fn name(self) -> &'static str {
        match self {
            MarkKind::Request => "requests",
            MarkKind::Retransmit => "retransmitted requests",
            MarkKind::Response => "ACKs and responses",
            MarkKind::Nak => "NAKs",
            MarkKind::RnrNak => "RNR NAKs",
        }
    }

    /// Colour, radius, and whether the circle is filled.
    fn style(self) -> (RGBColor, u32, bool) {
        match self {
            MarkKind::Request => (RGBColor(31, 119, 180), 3, true),
            MarkKind::Response => (RGBColor(44, 160, 44), 3, false),
            MarkKind::Retransmit => (RGBColor(214, 39, 40), 5, true),
            MarkKind::Nak => (RGBColor(255, 127, 14), 6, true),
            MarkKind::RnrNak => (RGBColor(148, 103, 189), 6, true),
        }
    }
}

/// One packet of a timeline: its row, its time since the first packet, its kind.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mark {
    /// Index into the rows.
    pub row: usize,
    /// Milliseconds since the earliest packet of the capture.
    pub ms: f64,
    /// What the packet is.
    pub kind: MarkKind,
}

/// The timeline of a capture: row labels (a destination QP each, in order of first
/// appearance) and a mark per packet that parsed as an IB transport packet.
#[derive(Debug, Default)]
pub struct Timeline {
    /// `QP 0x000011 @ 127.0.0.2`: BTH destination QP and destination address.
    pub rows: Vec<String>,
    /// One per RoCEv2 packet, in capture order.
    pub marks: Vec<Mark>,
}

impl Timeline {
    /// Sorts the packets of `records` into rows and kinds (see [`MarkKind`]). Retransmits
    /// are judged per row and direction, so a capture holding each packet twice (sent and
    /// received, both ends of an in-process connection) counts no packet twice.
    pub fn of(records: &[CaptureRecord]) -> Timeline {
        let origin = records
            .iter()
            .map(|r| r.timestamp)
            .min()
            .unwrap_or_default();
        let mut timeline = Timeline::default();
        let mut row_of: HashMap<(IpAddr, u32), usize> = HashMap::new();
        let mut highest: HashMap<(usize, Direction), Psn> = HashMap::new();
        for record in records {
            let Ok((repr, _)) = &record.packet else {
                continue;
            };
            let dst = match record.ip {
                softverbs_wire::icrc::IpHeaderInfo::V4 { dst, .. } => IpAddr::V4(dst),
                softverbs_wire::icrc::IpHeaderInfo::V6 { dst, .. } => IpAddr::V6(dst),
            };
            let qpn = repr.bth.dest_qp.value();
            let row = *row_of.entry((dst, qpn)).or_insert_with(|| {
                timeline.rows.push(format!("QP {qpn:#08x} @ {dst}"));
                timeline.rows.len() - 1
            });
            let response = repr
                .bth
                .opcode
                .info()
                .is_some_and(|info| info.is_response());
            let kind = match repr.aeth.map(|aeth| aeth.syndrome) {
                Some(AethSyndrome::Nak(_)) => MarkKind::Nak,
                Some(AethSyndrome::RnrNak { .. }) => MarkKind::RnrNak,
                _ if response => MarkKind::Response,
                _ => {
                    let psn = repr.bth.psn;
                    match highest.get(&(row, record.direction)) {
                        Some(top) if !psn.is_after(*top) => MarkKind::Retransmit,
                        _ => {
                            highest.insert((row, record.direction), psn);
                            MarkKind::Request
                        }
                    }
                }
            };
            let ms = record.timestamp.saturating_sub(origin).as_secs_f64() * 1e3;
            timeline.marks.push(Mark { row, ms, kind });
        }
        timeline
    }

    /// How many marks are of `kind`.
    pub fn count(&self, kind: MarkKind) -> usize {
        self.marks.iter().filter(|m| m.kind == kind).count()
    }
}

/// Draws the timeline of `records` (see [`Timeline::of`]) into the SVG file `path`, with
/// `title` above it; returns the timeline drawn.
pub fn capture_timeline(
    path: &Path,
    title: &str,
    records: &[CaptureRecord],
) -> Result<Timeline, Error> {
    let timeline = Timeline::of(records);
    let rows = timeline.rows.len().max(1);
    let end = timeline.marks.iter().map(|m| m.ms).fold(0.0, f64::max);
    // Room on the right for the legend.
    let right = if end > 0.0 { end * 1.3 } else { 1.0 };
    let height = (140 + 50 * rows as u32).max(360);
    let caption = if timeline.marks.is_empty() {
        format!("{title} (no RoCEv2 packets)")
    } else {
        title.to_owned()
    };
    write_svg(path, (1200, height), |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(caption, (FONT, 22))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(200)
            // An integer range is inclusive: rows 0 ..= rows - 1.
            .build_cartesian_2d(0.0..right, (0..rows - 1).into_segmented())?;
        let label = |value: &SegmentValue<usize>| match value {
            SegmentValue::CenterOf(row) => timeline.rows.get(*row).cloned().unwrap_or_default(),
            _ => String::new(),
        };
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_desc("time since the first packet [ms]")
            .y_labels(rows)
            .y_label_formatter(&label)
            .draw()?;
        for kind in MarkKind::ALL {
            let count = timeline.count(kind);
            if count == 0 {
                continue;
            }
            let (colour, radius, filled) = kind.style();
            let style = if filled {
                colour.filled()
            } else {
                colour.stroke_width(1)
            };
            chart
                .draw_series(
                    timeline
                        .marks
                        .iter()
                        .filter(|m| m.kind == kind)
                        .map(|m| Circle::new((m.ms, SegmentValue::CenterOf(m.row)), radius, style)),
                )?
                .label(format!("{} ({count})", kind.name()))
                .legend(move |(x, y)| Rectangle::new([(x, y - 4), (x + 12, y + 4)], style));
        }
        if !timeline.marks.is_empty() {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .label_font((FONT, 14))
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()?;
        }
        Ok(())
    })?;
    Ok(timeline)
}

#[cfg(test)]
mod tests {
    use super::*;
    use softverbs_wire::icrc::{IpHeaderInfo, UdpHeaderInfo};
    use softverbs_wire::{AethRepr, NakCode, Opcode, PacketRepr, Qpn};
    use std::net::Ipv4Addr;
    use std::time::Duration;

    /// A temporary file path for a picture.
    fn picture(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("softverbs-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    /// What an SVG holds: its circles, its polylines of more than two points (the
    /// curves: the axes are two-point polylines) as (x, y) pixel lists, and its texts.
    struct Shapes {
        circles: usize,
        curves: Vec<Vec<(f64, f64)>>,
        texts: Vec<String>,
    }

    /// The SVG at `path`, parsed as XML (its root must be `<svg>`).
    fn shapes(path: &Path) -> Shapes {
        let text = std::fs::read_to_string(path).unwrap();
        let svg = roxmltree::Document::parse(&text).expect("well-formed XML");
        assert_eq!(svg.root_element().tag_name().name(), "svg");
        let curves = svg
            .descendants()
            .filter(|n| n.has_tag_name("polyline"))
            .map(|n| {
                n.attribute("points")
                    .unwrap()
                    .split_whitespace()
                    .map(|xy| {
                        let (x, y) = xy.split_once(',').unwrap();
                        (x.parse().unwrap(), y.parse().unwrap())
                    })
                    .collect::<Vec<(f64, f64)>>()
            })
            .filter(|points| points.len() > 2)
            .collect();
        Shapes {
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

    fn latencies(micros: impl IntoIterator<Item = u64>) -> Latencies {
        let mut latencies = Latencies::new();
        for us in micros {
            latencies.record(Duration::from_micros(us));
        }
        latencies
    }

    // The curve runs from the minimum at "one in 1" to the maximum at "one in N" (N
    // samples), through the median at 2 and p99 at 100 (HdrHistogram keeps 3 significant
    // digits); "one in n" rises strictly, the latency never falls.
    #[test]
    fn the_percentile_curve_runs_from_the_minimum_through_the_median_to_the_maximum() {
        assert!(percentile_curve(&Latencies::new()).is_empty());
        let one = percentile_curve(&latencies([7]));
        assert_eq!(one.len(), 1);
        assert!((one[0].1 - 7.0).abs() < 0.01, "{one:?}");

        let curve = percentile_curve(&latencies(1..=1000));
        let near = |value: f64, expected: f64| (value - expected).abs() <= expected * 0.002;
        assert_eq!(curve[0].0, 1.0);
        assert!(near(curve[0].1, 1.0), "{curve:?}");
        let at = |one_in: f64| curve.iter().find(|p| p.0 == one_in).unwrap().1;
        assert!(near(at(2.0), 500.0), "{curve:?}");
        assert!(near(at(16.0), 937.5), "{curve:?}");
        let last = *curve.last().unwrap();
        assert_eq!(last.0, 1000.0);
        assert!(near(last.1, 1000.0), "{curve:?}");
        for pair in curve.windows(2) {
            assert!(pair[0].0 < pair[1].0 && pair[0].1 <= pair[1].1, "{pair:?}");
        }
        // Four points per halving: 2^0 ..= 2^(39/4) < 1000, and the maximum.
        assert_eq!(curve.len(), 41);
        assert_eq!(percentile_label(2.0), "50%");
        assert_eq!(percentile_label(1000.0), "99.9%");
        assert_eq!(bytes_label(2048.0), "2K");
        assert_eq!(bytes_label(1_048_576.0), "1M");
        assert_eq!(bytes_label(1000.0), "1000");
    }

    // A bw run is one curve of bandwidth against size, a mark per size, sizes left to
    // right; a lat run is a curve per size, each a mark per point, latency never falling
    // from left to right (pixel y never rising), with the sizes in the legend.
    #[test]
    fn perf_pictures_hold_a_curve_per_size_or_one_bandwidth_curve() {
        let curves: Vec<Vec<(f64, f64)>> = [10u64, 20, 30]
            .iter()
            .map(|&base| percentile_curve(&latencies((0..200).map(|i| base + i % 17))))
            .collect();
        let sizes: Vec<PerfSize<'_>> = [64usize, 128, 256]
            .iter()
            .zip(&curves)
            .map(|(&bytes, curve)| PerfSize {
                bytes,
                curve,
                gbit_per_sec: None,
            })
            .collect();
        let path = picture("lat.svg");
        perf(&path, "Send Latency Test", &sizes).unwrap();
        let Shapes {
            circles,
            curves: drawn,
            texts,
        } = shapes(&path);
        assert_eq!(drawn.len(), 3);
        for (line, curve) in drawn.iter().zip(&curves) {
            assert_eq!(line.len(), curve.len());
            for pair in line.windows(2) {
                assert!(pair[0].0 < pair[1].0 && pair[0].1 >= pair[1].1, "{pair:?}");
            }
        }
        assert_eq!(circles, curves.iter().map(Vec::len).sum::<usize>());
        for label in [
            "64 B",
            "128 B",
            "256 B",
            "Send Latency Test: latency distribution",
        ] {
            assert!(texts.iter().any(|t| t == label), "{label:?} in {texts:?}");
        }

        let sizes: Vec<PerfSize<'_>> = (1..=20)
            .map(|p| PerfSize {
                bytes: 1 << p,
                curve: &[],
                gbit_per_sec: Some(f64::from(p)),
            })
            .collect();
        let path = picture("bw.svg");
        perf(&path, "Send BW Test", &sizes).unwrap();
        let Shapes {
            circles,
            curves: drawn,
            texts,
        } = shapes(&path);
        assert_eq!(circles, 20);
        assert_eq!(drawn.len(), 1);
        assert_eq!(drawn[0].len(), 20);
        for pair in drawn[0].windows(2) {
            assert!(pair[0].0 < pair[1].0 && pair[0].1 > pair[1].1, "{pair:?}");
        }
        assert!(texts.iter().any(|t| t == "512K"), "{texts:?}");
    }

    /// A captured packet from `src` to `dst` (the last octet of 127.0.0.x) for `dest_qp`.
    fn record(
        ms: u64,
        direction: Direction,
        (src, dst): (u8, u8),
        dest_qp: u32,
        opcode: u8,
        psn: u32,
        syndrome: Option<AethSyndrome>,
    ) -> CaptureRecord {
        let mut repr = PacketRepr::default();
        repr.bth.opcode = Opcode(opcode);
        repr.bth.dest_qp = Qpn::new(dest_qp);
        repr.bth.psn = Psn::new(psn);
        repr.aeth = syndrome.map(|syndrome| AethRepr { syndrome, msn: 0 });
        let udp = UdpHeaderInfo::rocev2(0xC000, 64).unwrap();
        let ip = IpHeaderInfo::linux_ipv4(
            Ipv4Addr::new(127, 0, 0, src),
            Ipv4Addr::new(127, 0, 0, dst),
            0,
            64,
            udp.length,
        )
        .unwrap();
        CaptureRecord {
            frame: 0,
            timestamp: Duration::from_secs(1_700_000_000) + Duration::from_millis(ms),
            direction,
            ip,
            udp,
            packet: Ok((repr, 0)),
            icrc: Ok(()),
            comment: None,
        }
    }

    // IBTA 9.7.5.1 / 9.7.5.2: a NAK (PSN sequence error) and the go-back-N resend that
    // follows it, an RNR NAK, ACKs and read responses: each packet gets the right kind and
    // its destination QP's row; a request is a retransmit when its PSN is not after the
    // highest already seen on its row in its direction, so the same packet recorded going
    // out and coming in (a shared in-process capture) is not one. The picture holds one
    // circle per packet and a label per row.
    #[test]
    fn the_timeline_marks_retransmits_naks_and_rnr_naks_on_a_row_per_qp() {
        use Direction::{Inbound as In, Outbound as Out};
        const SEND: u8 = 0x04;
        const ACK: u8 = 0x11;
        const READ_RESPONSE: u8 = 0x10;
        let requester = (1, 2);
        let responder = (2, 1);
        let nak = Some(AethSyndrome::Nak(NakCode::PsnSequenceError));
        let records = [
            record(0, Out, requester, 0x12, SEND, 10, None),
            record(0, In, requester, 0x12, SEND, 10, None),
            record(1, Out, requester, 0x12, SEND, 11, None),
            record(2, Out, requester, 0x12, SEND, 12, None),
            record(3, In, responder, 0x11, ACK, 11, nak),
            record(4, Out, requester, 0x12, SEND, 11, None),
            record(5, Out, requester, 0x12, SEND, 12, None),
            record(6, Out, requester, 0x12, SEND, 13, None),
            record(7, In, responder, 0x11, ACK, 13, Some(AethSyndrome::ACK)),
            record(
                8,
                In,
                responder,
                0x11,
                ACK,
                14,
                Some(AethSyndrome::RnrNak { timer: 1 }),
            ),
            record(
                9,
                In,
                responder,
                0x11,
                READ_RESPONSE,
                14,
                Some(AethSyndrome::ACK),
            ),
            record(10, Out, (1, 3), 0x12, SEND, 5, None),
        ];
        let timeline = Timeline::of(&records);
        use MarkKind::*;
        let kinds: Vec<MarkKind> = timeline.marks.iter().map(|m| m.kind).collect();
        assert_eq!(
            kinds,
            [
                Request, Request, Request, Request, Nak, Retransmit, Retransmit, Request, Response,
                RnrNak, Response, Request
            ]
        );
        let rows: Vec<usize> = timeline.marks.iter().map(|m| m.row).collect();
        assert_eq!(rows, [0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 2]);
        assert_eq!(
            timeline.rows,
            [
                "QP 0x000012 @ 127.0.0.2",
                "QP 0x000011 @ 127.0.0.1",
                "QP 0x000012 @ 127.0.0.3"
            ]
        );
        assert_eq!(timeline.marks[7].ms, 6.0);

        let path = picture("timeline.svg");
        let drawn = capture_timeline(&path, "test capture", &records).unwrap();
        assert_eq!(drawn.marks, timeline.marks);
        let Shapes { circles, texts, .. } = shapes(&path);
        assert_eq!(circles, records.len());
        for label in &timeline.rows {
            assert!(texts.contains(label), "{label:?} in {texts:?}");
        }
        for legend in ["retransmitted requests (2)", "NAKs (1)", "RNR NAKs (1)"] {
            assert!(texts.iter().any(|t| t == legend), "{legend:?} in {texts:?}");
        }

        let path = picture("empty.svg");
        let drawn = capture_timeline(&path, "empty", &[]).unwrap();
        assert!(drawn.marks.is_empty());
        let Shapes { circles, texts, .. } = shapes(&path);
        assert_eq!(circles, 0);
        assert!(
            texts.iter().any(|t| t == "empty (no RoCEv2 packets)"),
            "{texts:?}"
        );
    }

    // A picture that cannot be written is an error naming the file.
    #[test]
    fn an_unwritable_picture_is_an_error_naming_the_file() {
        let path = picture("no such folder").join("lat.svg");
        let error = capture_timeline(&path, "t", &[]).unwrap_err().to_string();
        assert!(error.contains(&path.display().to_string()), "{error}");
    }
}
