//! `softverbs pcap FILE`: a capture (pcap or pcapng) decoded one line per packet, then a
//! summary; `--plot` draws its per-QP timeline.

use crate::Error;
use softverbs_device::pcap::{read_capture_tolerant, CaptureRecord};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

/// Options of `softverbs pcap`.
#[derive(clap::Args, Clone, Debug)]
#[command(after_help = "\
Formats: classic pcap (tcpdump -w) and pcapng (Wireshark's default; editcap -F pcapng \
converts), told apart by the file's first bytes. softverbs writes its own captures \
(SOFTVERBS_PCAP=FILE, or --pcap FILE of pingpong and perf) as pcapng when FILE ends in \
.pcapng, and as classic pcap otherwise.

A capture that ends in a partial record (its writer died) is decoded up to it, with a \
warning; a damaged one is decoded up to the damage, then fails.")]
pub struct PcapArgs {
    /// The capture file, pcap or pcapng (from --pcap, SOFTVERBS_PCAP, Wireshark, or
    /// `tcpdump -w` on UDP port 4791).
    pub file: PathBuf,

    /// Print only the summary, not one line per packet.
    #[arg(short = 'q', long)]
    pub quiet: bool,

    /// Draw a per-QP timeline of the capture into an SVG file: a row per destination QP,
    /// a mark per packet at its time (requests, retransmitted requests, ACKs and
    /// responses, NAKs, RNR NAKs).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

/// Runs `softverbs pcap`. A capture that ends in a partial record (its writer died
/// mid-record) is decoded up to it, with a warning on stderr; a damaged one is listed up
/// to the damage, then is an error naming the file. A closed stdout (`| head`) ends the
/// listing quietly (the picture is still drawn).
pub fn run(args: &PcapArgs) -> Result<(), Error> {
    let named = |e: &dyn std::fmt::Display| format!("{}: {e}", args.file.display());
    let file = std::fs::File::open(&args.file).map_err(|e| named(&e))?;
    let (records, broken) =
        read_capture_tolerant(std::io::BufReader::new(file)).map_err(|e| named(&e))?;
    let complete = records.last().map_or(0, |r| r.frame + 1);
    match print(args, &records) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other.map_err(|e| format!("writing the listing: {e}"))?,
    }
    if let Some(error) = &broken {
        if !error.is_truncated() {
            return Err(named(&format!(
                "damaged after {complete} complete frames ({error})"
            ))
            .into());
        }
    }
    if let Some(plot) = &args.plot {
        let title = format!("{}: packets by destination QP", args.file.display());
        crate::plot::capture_timeline(plot, &title, &records)?;
    }
    if let Some(error) = broken {
        eprintln!(
            "warning: {}: the capture ends in a broken record after {complete} complete \
             frames ({error})",
            args.file.display(),
        );
    }
    Ok(())
}

fn print(args: &PcapArgs, records: &[CaptureRecord]) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    let mut by_opcode: BTreeMap<String, u64> = BTreeMap::new();
    let (mut icrc_bad, mut unparsed) = (0u64, 0u64);
    for record in records {
        if !args.quiet {
            writeln!(out, "{record}")?;
        }
        match &record.packet {
            Ok((repr, _)) => *by_opcode.entry(repr.bth.opcode.to_string()).or_default() += 1,
            Err(_) => unparsed += 1,
        }
        if !record.icrc_ok() {
            icrc_bad += 1;
        }
    }
    writeln!(
        out,
        "{} packets, {} ICRC failures, {} not IB transport packets",
        records.len(),
        icrc_bad,
        unparsed
    )?;
    for (opcode, count) in &by_opcode {
        writeln!(out, "  {count:>8}  {opcode}")?;
    }
    out.flush()
}
