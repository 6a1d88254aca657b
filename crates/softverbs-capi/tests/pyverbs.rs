//! pyverbs (rdma-core's Python binding, Debian package `python3-pyverbs`) over the
//! drop-in: `tests/py/cq_traffic.py` run by Debian's `/usr/bin/python3` (not the
//! `python3` first on `PATH`, which may be another build without pyverbs), with
//! `LD_LIBRARY_PATH` pointing at the drop-in `libibverbs.so.1` and `SOFTVERBS_ADDR` giving
//! the device its address.
//!
//! The script opens `softverbs0`, creates a completion channel, a CQ (`pyverbs.cq.CQ`,
//! `ibv_create_cq`) and an extended CQ (`pyverbs.cq.CQEX`, `ibv_create_cq_ex` with byte
//! length, QP number, immediate and completion timestamp), and moves real traffic between
//! QPs of the one device (it sends to its own GID): RC SEND, SEND_WITH_IMM, RDMA WRITE
//! and RDMA READ polled through `ibv_poll_cq` and through `ibv_start_poll` /
//! `ibv_next_poll` / `ibv_end_poll` with the `ibv_wc_read_*` accessors, a completion event
//! through the channel (`ibv_req_notify_cq`, `ibv_get_cq_event`, `ibv_ack_cq_events`), and
//! a UD SEND through an address handle with a GRH. It checks statuses, opcodes, wr_ids,
//! byte lengths, QP numbers, immediate data and the data itself, and prints
//! `pyverbs-softverbs: ok …` last. Every wait in the script is bounded, and this test
//! kills it after [`TIMEOUT`].
//!
//! A missing interpreter or pyverbs is a failure naming the Debian package, never a skip.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

const PYTHON: &str = "/usr/bin/python3";
const TIMEOUT: Duration = Duration::from_secs(120);
/// The device address of the script's process (127.0.0.100–200 are this crate's
/// program tests' addresses; 4791 is the RoCEv2 port its QPs send to).
const DEVICE_ADDR: &str = "127.0.0.190:4791";

/// pyverbs drives CQs, an extended CQ and a completion channel over real RC and UD traffic
/// on the drop-in (rdma-core `pyverbs/cq.pyx`: `CQ.poll`, `CQEX.start_poll` /
/// `poll_next` / `end_poll` / `read_*`, `CompChannel.get_cq_event`, `CQ.ack_events`;
/// `ibv_poll_cq(3)`, `ibv_create_cq_ex(3)`, `ibv_get_cq_event(3)`).
#[test]
fn pyverbs_moves_rc_and_ud_traffic_through_a_cq_an_extended_cq_and_a_channel() {
    assert!(
        Path::new(PYTHON).exists(),
        "{PYTHON} is missing: install the Debian package python3 (and python3-pyverbs)"
    );
    assert!(
        Path::new("/usr/lib/python3/dist-packages/pyverbs").is_dir(),
        "pyverbs is missing: install the Debian package python3-pyverbs"
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/cq_traffic.py");
    let lib = common::library_dir("pyverbs");
    let mut command = Command::new(PYTHON);
    command
        .arg(&script)
        .env("LD_LIBRARY_PATH", &lib)
        .env("LD_BIND_NOW", "1")
        .env("SOFTVERBS_ADDR", DEVICE_ADDR)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("PYTHONPATH")
        .env_remove("PYTHONHOME");
    let (status, stdout, stderr) = common::run_bounded(&mut command, TIMEOUT);
    let code = status.map(|s| s.code().unwrap_or(-1));
    let report = format!(
        "SOFTVERBS_ADDR={DEVICE_ADDR} LD_LIBRARY_PATH={} {PYTHON} {}\n----- status: {}\n\
         ----- stdout:\n{stdout}\n----- stderr:\n{stderr}",
        lib.display(),
        script.display(),
        code.map_or_else(|| format!("killed after {TIMEOUT:?}"), |c| c.to_string()),
    );
    assert_eq!(code, Some(0), "the pyverbs script failed:\n{report}");
    let last = stdout.lines().last().unwrap_or("");
    assert!(
        last.starts_with("pyverbs-softverbs: ok device softverbs0 ")
            // The GID of 127.0.0.190: the script ran on our device at that address.
            && last.contains("gid 0000:0000:0000:0000:0000:ffff:7f00:00be ")
            && last.contains("rc_completions 9 ud_completions 2"),
        "the pyverbs script did not report success:\n{report}"
    );
}
