//! What the UCX and Open MPI tests share (included by path from `ucx.rs` and `openmpi.rs`):
//! a program under `softverbs run [--dev-node]`, runs bounded by a limit of their own, a
//! server's TCP port awaited, and the devices' statistics lines read back.

#![allow(dead_code)]

#[path = "../../../softverbs-capi/tests/common/stats.rs"]
mod stats;

pub use stats::{assert_carried, counter};

#[path = "../../../softverbs-capi/tests/common/process.rs"]
mod process;

// Each test binary uses some of them.
#[allow(unused_imports)]
pub use process::{run_bounded, wait_bounded, wait_until_listening};

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `/usr/bin/NAME`, which must be installed: a missing program is a failure naming its
/// Debian package, never a skip.
pub fn program(name: &str, package: &str) -> PathBuf {
    let path = Path::new("/usr/bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: install the Debian package {package}",
        path.display()
    );
    path
}

/// `softverbs run [--dev-node] -- PROGRAM ARGS` on the drop-in cargo built with this
/// package, with none of the caller's SOFTVERBS_* or loader variables and `runtime` (under
/// cargo's temporary directory, named `name`) as its XDG_RUNTIME_DIR.
pub fn softverbs_run(
    name: &str,
    dev_node: bool,
    program: impl AsRef<OsStr>,
    args: &[&str],
) -> Command {
    let runtime = crate::common::private_dir(&format!("stacks-{name}"));
    let mut command = crate::common::in_runtime(env!("CARGO_BIN_EXE_softverbs"), &runtime);
    command.arg("run");
    if dev_node {
        command.arg("--dev-node");
    }
    command.arg("--").arg(program).args(args);
    command
}
