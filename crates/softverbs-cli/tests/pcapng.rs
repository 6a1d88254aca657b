//! pcapng through the `softverbs` command: captures written as pcapng (by name) decoded
//! by tshark, a pcapng written by tshark read as the pcap it came from, damaged pcapng
//! files refused naming the file. Devices on automatically chosen 127.0.0.x addresses.

mod common;

use common::{packets, run, run_ok, run_with_env, text, tshark, TempDir, PCAPNG_MAGIC};

// `--pcap FILE.pcapng` (and SOFTVERBS_PCAP=FILE.pcapng) write pcapng: tshark decodes every
// frame of the ping-pong as RoCEv2 (an InfiniBand BTH opcode on each), as many as
// `softverbs pcap` reads back.
#[test]
fn a_pcapng_capture_decodes_in_tshark_and_in_softverbs_pcap() {
    let dir = TempDir::new("pcapng-capture");
    let pcapng = dir.join("pingpong.pcapng");
    run_ok(&["pingpong", "-n", "5", "-s", "100", "--pcap", text(&pcapng)]);
    assert_eq!(std::fs::read(&pcapng).unwrap()[..4], PCAPNG_MAGIC);
    let listing = run_ok(&["pcap", text(&pcapng)]);
    let count = packets(&listing);
    assert!(count >= 20, "{listing}");
    assert!(
        listing.contains(" out 127.0.0.") && listing.contains(" in 127.0.0."),
        "{listing}"
    );
    let opcodes = tshark(&[
        "-r",
        text(&pcapng),
        "-T",
        "fields",
        "-e",
        "infiniband.bth.opcode",
    ]);
    assert_eq!(opcodes.lines().count(), count, "{opcodes}");
    assert!(
        opcodes.lines().all(|l| l.parse::<u8>().is_ok()),
        "{opcodes}"
    );

    let from_env = dir.join("env.pcapng");
    let (code, _, err) = run_with_env(&["devinfo"], &[("SOFTVERBS_PCAP", text(&from_env))]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read(&from_env).unwrap()[..4], PCAPNG_MAGIC);
    assert_eq!(packets(&run_ok(&["pcap", text(&from_env)])), 0);
}

// A pcapng written by tshark (its default format) from our classic pcap lists the very
// same lines in `softverbs pcap` as the pcap: times, directions, headers, ICRCs, summary.
#[test]
fn softverbs_pcap_reads_a_tshark_written_pcapng_as_the_pcap_it_came_from() {
    let dir = TempDir::new("tshark-pcapng");
    let pcap = dir.join("pingpong.pcap");
    let pcapng = dir.join("converted.pcapng");
    run_ok(&["pingpong", "-n", "5", "-s", "100", "--pcap", text(&pcap)]);
    tshark(&["-r", text(&pcap), "-w", text(&pcapng)]);
    assert_eq!(std::fs::read(&pcapng).unwrap()[..4], PCAPNG_MAGIC);
    let from_pcap = run_ok(&["pcap", text(&pcap)]);
    let from_pcapng = run_ok(&["pcap", text(&pcapng)]);
    assert!(packets(&from_pcap) >= 20, "{from_pcap}");
    assert_eq!(from_pcapng, from_pcap);
}

/// The offsets of the blocks of a little-endian pcapng file.
fn blocks(bytes: &[u8]) -> Vec<usize> {
    let mut offsets = Vec::new();
    let mut at = 0;
    while at + 8 <= bytes.len() {
        offsets.push(at);
        let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        assert!(len >= 12, "block at {at}");
        at += len;
    }
    offsets
}

// A damaged pcapng (a block whose two length fields disagree; a file with pcapng's magic
// and nothing valid after it) is listed up to the damage and then refused: exit status 1,
// an error naming the file, no panic. A pcapng cut mid-block (its writer died) is read up
// to the cut with a warning, as a cut pcap is.
#[test]
fn a_damaged_pcapng_fails_naming_the_file_and_a_cut_one_is_read_up_to_the_cut() {
    let dir = TempDir::new("damaged-pcapng");
    let whole = dir.join("whole.pcapng");
    run_ok(&["pingpong", "-n", "5", "-s", "100", "--pcap", text(&whole)]);
    let bytes = std::fs::read(&whole).unwrap();
    let count = packets(&run_ok(&["pcap", "-q", text(&whole)]));
    // Section header, interface description, then a block per packet.
    let offsets = blocks(&bytes);
    assert_eq!(offsets.len(), 2 + count);

    let damaged = dir.join("damaged.pcapng");
    let mut broken = bytes.clone();
    // The trailing length of the fifth packet's block.
    let trailer = offsets[2 + 5] - 4;
    broken[trailer] ^= 0x04;
    std::fs::write(&damaged, &broken).unwrap();
    let (code, out, err) = run(&["pcap", text(&damaged)]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains(text(&damaged)) && err.contains("damaged after 4 complete frames"),
        "{err}"
    );
    assert_eq!(packets(&out), 4, "the packets before the damage are listed");

    let garbage = dir.join("garbage.pcapng");
    let mut junk = PCAPNG_MAGIC.to_vec();
    junk.extend_from_slice(&[0x55; 60]);
    std::fs::write(&garbage, &junk).unwrap();
    let (code, _, err) = run(&["pcap", text(&garbage)]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(text(&garbage)) && !err.contains("panicked"),
        "{err}"
    );

    let cut = dir.join("cut.pcapng");
    std::fs::write(&cut, &bytes[..bytes.len() - 10]).unwrap();
    let (code, out, err) = run(&["pcap", "-q", text(&cut)]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(packets(&out) + 1, count);
    assert!(err.contains("ends in a broken record"), "{err}");

    let help = run_ok(&["pcap", "--help"]);
    assert!(help.contains("pcapng"), "{help}");
}
