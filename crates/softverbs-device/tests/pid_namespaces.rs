//! Processes of two PID namespaces can share `/dev/shm` and a network namespace: a
//! container run with `--ipc=host --network=host` beside the host's programs (as
//! shared-memory HPC and machine-learning stacks are often run), the containers of one
//! Kubernetes pod. A process ID written in a file by a process of the other namespace names
//! another process, or none, in this one (kill(2) looks it up in the caller's namespace):
//! a device there must not take a live device here for a dead one — neither sweep its inbox
//! and its address's members file away, nor claim its slot.
//!
//! The test runs itself again in a new PID namespace (`unshare --pid --fork`, root, as the
//! suite runs) while a device of this process is open, and that child opens a device of its
//! own (its first: it sweeps). One test in this binary: the sweep runs once per process.

mod common;

use common::{inboxes_of, shm_device_at};
use std::process::Command;

/// Set in the child: the last byte of the address it opens its device on.
const CHILD: &str = "SOFTVERBS_TEST_PIDNS_CHILD";

/// The device of this process.
const HERE: u8 = 212;
/// The child's, in the other PID namespace.
const THERE: u8 = 214;

#[test]
fn a_device_in_another_pid_namespace_leaves_the_files_of_live_devices_here_alone() {
    const NAME: &str =
        "a_device_in_another_pid_namespace_leaves_the_files_of_live_devices_here_alone";
    if let Ok(last) = std::env::var(CHILD) {
        let ns = |which: &str| std::fs::read_link(format!("/proc/self/ns/{which}")).unwrap();
        println!("child pid namespace {:?}", ns("pid"));
        let _device = shm_device_at(last.parse().unwrap());
        assert!(
            !inboxes_of(THERE).is_empty(),
            "the child's device has an inbox"
        );
        return;
    }
    assert!(
        rustix::process::geteuid().is_root(),
        "this test needs root: it makes a PID namespace (unshare --pid)"
    );
    let unshare = std::path::Path::new("/usr/bin/unshare");
    assert!(
        unshare.exists(),
        "/usr/bin/unshare is missing: install the Debian package `util-linux`"
    );
    let _device = shm_device_at(HERE);
    let before = inboxes_of(HERE);
    assert_eq!(before.len(), 1, "this device's inbox: {before:?}");
    let out = Command::new(unshare)
        .args(["--pid", "--fork", "--kill-child", "--"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
        .env(CHILD, THERE.to_string())
        .env_remove("SOFTVERBS_NETWORK")
        .output()
        .expect("run the test again in a new PID namespace");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the child failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let here = std::fs::read_link("/proc/self/ns/pid").unwrap();
    assert!(
        stdout.contains("child pid namespace") && !stdout.contains(&format!("{here:?}")),
        "the child ran in another PID namespace: {stdout}"
    );
    assert_eq!(
        inboxes_of(HERE),
        before,
        "the inbox of this live device is still there"
    );
    let members = std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| name.ends_with(&format!("-127.0.0.{HERE}-4791.members")))
        .count();
    assert_eq!(members, 1, "so is its address's members file");
}
