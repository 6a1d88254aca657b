//! `softverbs`: the command line of the softverbs userspace RDMA device.
//!
//! ```text
//! softverbs devinfo [-v]                      the device, like ibv_devinfo
//! softverbs pingpong                          RC ping-pong, both sides here over UDP loopback
//! softverbs pingpong --server | --client HOST like ibv_rc_pingpong, two processes
//! softverbs perf send|write|read|atomic lat|bw   perftest-like latency and bandwidth
//! softverbs pcap FILE                         decode a RoCEv2 capture
//! softverbs plot -i RESULTS.json -o FILE.svg  scripts/bench-device.sh's results as a picture
//! softverbs run [--addr IP] -- CMD ARGS...    run a verbs program on the drop-in libibverbs
//! softverbs install [--prefix DIR]            install the command and the drop-in (~/.local)
//! ```

mod bench_results;
mod capture;
mod conn;
mod devinfo;
mod devnode;
mod install;
mod logging;
mod output;
mod perf;
mod pingpong;
mod plot;
mod run;
mod stats;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Errors of any command, printed on stderr.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The softverbs userspace RDMA device (RoCEv2 over UDP, or in-process): device
/// information, ping-pong, perftest-like benchmarks, capture decoding.
#[derive(Parser, Debug)]
#[command(name = "softverbs", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show the device like `ibv_devinfo` (-v: every attribute, like `ibv_devinfo -v`).
    ///
    /// The device is opened as any program opens it: SOFTVERBS_NETWORK (udp, the default,
    /// or inprocess) and SOFTVERBS_ADDR (else the first free 127.0.0.x).
    Devinfo(devinfo::DevinfoArgs),

    /// RC send/receive ping-pong like `ibv_rc_pingpong`.
    ///
    /// With no arguments, both sides run in this process over UDP loopback (two devices on
    /// two automatically chosen 127.0.0.x addresses, every packet crossing the kernel) and
    /// the bandwidth, the time per iteration and the round-trip latency distribution are
    /// printed. --server / --client HOST run one side each in two processes, exchanging
    /// QP information over TCP (port 18515) in ibv_rc_pingpong's message format and
    /// order; as with ibv_rc_pingpong, give both sides the same -s and -n.
    ///
    /// SOFTVERBS_PCAP=FILE captures the traffic in every mode: with both sides in this
    /// process (over UDP, or --in-process) the client's device writes FILE (it sends and
    /// receives every packet once); with --server / --client each process writes its own.
    /// SOFTVERBS_FAULTS injects faults on what each device sends, in every mode.
    Pingpong(pingpong::PingpongArgs),

    /// perftest-like benchmarks: `perf OP lat|bw` with OP one of send, write, read, atomic.
    ///
    /// perftest's common flags mean what they mean to perftest (-s -n -a -D -F -t -I -e,
    /// --report_gbits, --output; -q above 1 and -R are refused), and the results come as
    /// perftest's table: latency runs print t_min, t_max, t_typical, t_avg, t_stdev, 99%
    /// and 99.9% (HdrHistogram; --histogram prints the distribution); bandwidth runs keep
    /// -t work requests outstanding and print the peak and average bandwidth (MiB/sec, or
    /// Gb/sec with --report_gbits) and the message rate; --json prints everything as one
    /// document. A progress bar shows on a terminal. By default both sides run in this
    /// process over UDP loopback; --in-process uses the direct in-process path; --server /
    /// --client HOST run two processes (the server takes its parameters from the client).
    /// SOFTVERBS_PCAP and SOFTVERBS_FAULTS work as for pingpong.
    Perf(perf::PerfArgs),

    /// Decode a pcap or pcapng capture of RoCEv2 traffic: one line per packet, then a
    /// summary (--plot: a per-QP timeline as SVG).
    Pcap(capture::PcapArgs),

    /// Draw the results of `scripts/bench-device.sh --json` as an SVG picture: round trip
    /// and bandwidth against the message size, softverbs' paths (in-process, shared
    /// memory, UDP) beside UCX, libfabric, memcpy and bare UDP.
    Plot(bench_results::PlotArgs),

    /// Run a program on the drop-in libibverbs.so.1: `run [OPTIONS] -- CMD ARGS...`.
    ///
    /// Any verbs program, unmodified (ibv_devinfo, ibv_rc_pingpong, ib_write_bw...), finds
    /// the softverbs device softverbs0 instead of the real libibverbs. The drop-in is
    /// --lib, else SOFTVERBS_LIB, else the one `softverbs install` put in ../lib/softverbs/
    /// beside this executable, else libsoftverbs_capi.so where cargo builds it beside this
    /// executable (building softverbs-cli builds it); -v says which. Its directory (or a
    /// private one holding the symlink libibverbs.so.1) goes first on LD_LIBRARY_PATH, then
    /// the program replaces this process: its exit status is the program's own (127 if it
    /// is not found). SOFTVERBS_* variables reach it unchanged. --dev-node (for UCX and
    /// Open MPI over UCX) gives the program /dev/infiniband/softverbs0 in a namespace of its
    /// own.
    #[command(override_usage = "softverbs run [OPTIONS] -- CMD [ARGS]...")]
    Run(run::RunArgs),

    /// Install this command and its drop-in library: DIR/bin/softverbs and
    /// DIR/lib/softverbs/ (default DIR: ~/.local), where `run` finds the library wherever DIR
    /// is and once the build directory is gone.
    Install(install::InstallArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init();
    let result = match &cli.command {
        Command::Devinfo(args) => devinfo::run(args),
        Command::Pingpong(args) => pingpong::run(args),
        Command::Perf(args) => perf::run(args),
        Command::Pcap(args) => capture::run(args),
        Command::Plot(args) => bench_results::run(args),
        Command::Install(args) => install::run(args),
        // Returns only if the program could not be started, with a shell's exit status.
        Command::Run(args) => return run::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // One line on stderr; a closed stdout (`| head`) ends quietly with status 0.
        Err(error) => output::report(error.as_ref()),
    }
}
