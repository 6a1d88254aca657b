//! `softverbs pcap FILE`: a capture decoded one line per packet, then a summary.

use crate::Error;
use softverbs_device::pcap::read_capture;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Options of `softverbs pcap`.
#[derive(clap::Args, Clone, Debug)]
pub struct PcapArgs {
    /// The pcap file (from `--pcap`, SOFTVERBS_PCAP, or `tcpdump -w` on UDP port 4791).
    pub file: PathBuf,

    /// Print only the summary, not one line per packet.
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

/// Runs `softverbs pcap`.
pub fn run(args: &PcapArgs) -> Result<(), Error> {
    let records = read_capture(&args.file).map_err(|e| format!("{}: {e}", args.file.display()))?;
    let mut by_opcode: BTreeMap<String, u64> = BTreeMap::new();
    let (mut icrc_bad, mut unparsed) = (0u64, 0u64);
    for record in &records {
        if !args.quiet {
            println!("{record}");
        }
        match &record.packet {
            Ok((repr, _)) => *by_opcode.entry(repr.bth.opcode.to_string()).or_default() += 1,
            Err(_) => unparsed += 1,
        }
        if !record.icrc_ok() {
            icrc_bad += 1;
        }
    }
    println!(
        "{} packets, {} ICRC failures, {} not IB transport packets",
        records.len(),
        icrc_bad,
        unparsed
    );
    for (opcode, count) in &by_opcode {
        println!("  {count:>8}  {opcode}");
    }
    Ok(())
}
