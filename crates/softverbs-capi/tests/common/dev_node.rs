//! Running a program where UCX sees softverbs0 (included by path from `ucx.rs` and
//! `openmpi.rs`).
//!
//! UCX 1.13 lists an InfiniBand memory domain only if `/dev/infiniband/<dev_name>` (the
//! `ibv_device.dev_name` the verbs library reports) is a character device the process can
//! open for reading and writing (`uct_ib_device_is_accessible`, `src/uct/ib/base/ib_md.c`:
//! `stat`, `S_ISCHR`, `access(R_OK | W_OK)`; the prefix is fixed, so no device name can
//! point elsewhere, and no UCX variable turns the check off). A soft device has no such
//! node, and a user cannot create one under `/dev`. Without root, an unprivileged user and
//! mount namespace (`unshare --user --map-root-user --mount`) can: the script below
//! mounts a fresh tmpfs on `/dev` inside the namespace, binds every entry of the real
//! `/dev` back into it, and binds `/dev/null` (a character device everyone may read and
//! write) at `/dev/infiniband/softverbs0`. Nothing changes outside the namespace; the
//! process's network, processes and files are the host's.

#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

/// The `ibv_device.dev_name` of the drop-in's device.
pub const DEV_NAME: &str = "softverbs0";

/// Sets up `/dev` in the new mount namespace and runs the program: `$1` the device node's
/// name, `$2` an empty directory where the real `/dev` stays reachable, the rest the
/// command. The host's own `/dev/infiniband` entries, if any, are bound back too.
const SCRIPT: &str = r#"set -eu
dev=$1 old=$2
shift 2
mount --rbind /dev "$old"
mount -t tmpfs -o mode=755 softverbs-dev /dev
for e in "$old"/* "$old"/.[!.]*; do
  [ -e "$e" ] || [ -L "$e" ] || continue
  n=/dev/${e##*/}
  if [ -L "$e" ]; then ln -s "$(readlink "$e")" "$n"
  elif [ "${e##*/}" = infiniband ]; then
    mkdir "$n"
    for f in "$e"/*; do
      if [ -e "$f" ]; then : > "$n/${f##*/}"; mount --bind "$f" "$n/${f##*/}"; fi
    done
  elif [ -d "$e" ]; then mkdir "$n"; mount --rbind "$e" "$n"
  else : > "$n"; mount --bind "$e" "$n"; fi
done
mkdir -p /dev/infiniband
: > "/dev/infiniband/$dev"
mount --bind "$old/null" "/dev/infiniband/$dev"
exec "$@"
"#;

/// A command running `program args` in a user and mount namespace where
/// `/dev/infiniband/softverbs0` is a character device the process may read and write.
/// A missing `unshare` (util-linux) is a failure.
pub fn with_device_node(program: &Path, args: &[&str]) -> Command {
    let unshare = Path::new("/usr/bin/unshare");
    assert!(
        unshare.exists(),
        "/usr/bin/unshare is missing: install the Debian package util-linux"
    );
    let old = Path::new(env!("CARGO_TARGET_TMPDIR")).join("softverbs-real-dev");
    std::fs::create_dir_all(&old).expect("create the directory for the real /dev");
    let mut command = Command::new(unshare);
    command
        .args([
            "--user",
            "--map-root-user",
            "--mount",
            "--",
            "/bin/sh",
            "-c",
        ])
        .arg(SCRIPT)
        .arg("softverbs-dev-node")
        .arg(DEV_NAME)
        .arg(&old)
        .arg(program)
        .args(args);
    command
}

/// The statistics lines (`SOFTVERBS_STATS=stderr`) of the device at `address` in `stderr`.
pub fn stats_lines<'a>(stderr: &'a str, address: &str) -> Vec<&'a str> {
    let prefix = format!("softverbs stats: device softverbs0 address {address} ");
    stderr.lines().filter(|l| l.starts_with(&prefix)).collect()
}

/// The value of the counter `name=` in a statistics line (0 when absent).
pub fn counter(line: &str, name: &str) -> u64 {
    line.split([' ', ';'])
        .find_map(|field| field.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Asserts that the device at `address` sent and received packets (at least `min` of each),
/// as its last statistics line in `stderr` says; returns that line.
pub fn assert_carried<'a>(stderr: &'a str, address: &str, min: u64) -> &'a str {
    let lines = stats_lines(stderr, address);
    let last = lines
        .last()
        .unwrap_or_else(|| panic!("no statistics line for {address}:\n{stderr}"));
    for name in ["packets_sent", "packets_received"] {
        assert!(
            counter(last, name) >= min,
            "the device at {address} shows {name} < {min}: {last}"
        );
    }
    last
}
