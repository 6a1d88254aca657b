//! Processes of two PID namespaces can share `/dev/shm` and a network namespace: a
//! container run with `--ipc=host --network=host` beside the host's programs (as
//! shared-memory HPC and machine-learning stacks are often run), the containers of one
//! Kubernetes pod. A process ID written in a file by a process of the other namespace names
//! another process, or none, in this one (kill(2) looks it up in the caller's namespace):
//! a device there must not take a live device here for a dead one — neither sweep its inbox
//! and its address's members file away, nor claim its slot.
//!
//! But a device of the other namespace that died leaves its inbox (a killed process, a
//! stopped container), with every page its peers wrote into it, and its address's members
//! file: the next sweep here removes them, going by the lock their holders held (the
//! kernel lets go of it at the holder's death, in any namespace), not by process IDs.
//!
//! The tests run themselves again in a new PID namespace (`unshare --pid --fork`, root, as
//! the suite runs); one at a time, and this process sweeps at most once (at its first
//! device), so the sweeps that count are the children's.

mod common;

use common::{inboxes_of, shm_device_at};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Mutex;

/// Set in the child: the last byte of the address it opens its device on.
const CHILD: &str = "SOFTVERBS_TEST_PIDNS_CHILD";

/// Set in a child that opens a device and dies with it open.
const DIES: &str = "SOFTVERBS_TEST_PIDNS_DIES";

/// Set in a child that opens a device (its sweep) and exits.
const SWEEPS: &str = "SOFTVERBS_TEST_PIDNS_SWEEPS";

/// The tests of this binary run one at a time.
static ALONE: Mutex<()> = Mutex::new(());

/// Checks the test can make PID namespaces: root, and util-linux's `unshare`.
fn unshare() -> &'static Path {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test needs root: it makes a PID namespace (unshare --pid)"
    );
    let unshare = Path::new("/usr/bin/unshare");
    assert!(
        unshare.exists(),
        "/usr/bin/unshare is missing: install the Debian package `util-linux`"
    );
    unshare
}

/// Test `name` of this binary again with `var` set to `value`: in a new PID namespace if
/// `new_pid_namespace`.
fn again(name: &str, var: &str, value: &str, new_pid_namespace: bool) -> Output {
    let mut command = if new_pid_namespace {
        let mut command = Command::new(unshare());
        command
            .args(["--pid", "--fork", "--kill-child", "--"])
            .arg(std::env::current_exe().unwrap());
        command
    } else {
        Command::new(std::env::current_exe().unwrap())
    };
    command
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(var, value)
        .env_remove("SOFTVERBS_NETWORK")
        .output()
        .expect("run the test again")
}

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
    unshare();
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let _device = shm_device_at(HERE);
    let before = inboxes_of(HERE);
    assert_eq!(before.len(), 1, "this device's inbox: {before:?}");
    let out = again(NAME, CHILD, &THERE.to_string(), true);
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
    assert_eq!(
        members_files_of(HERE),
        1,
        "so is its address's members file"
    );
}

/// The members files in /dev/shm of 127.0.0.`last`, port 4791, in any namespace.
fn members_files_of(last: u8) -> usize {
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| name.ends_with(&format!("-127.0.0.{last}-4791.members")))
        .count()
}

/// The device that dies, in the other PID namespace.
const DEAD: u8 = 215;
/// The device whose sweep removes its inbox, here.
const SWEEPER: u8 = 216;

#[test]
fn the_inbox_of_a_dead_device_of_another_pid_namespace_is_swept() {
    const NAME: &str = "the_inbox_of_a_dead_device_of_another_pid_namespace_is_swept";
    if std::env::var(DIES).is_ok() {
        let _device = shm_device_at(DEAD);
        println!("dying with the device open");
        use std::io::Write;
        std::io::stdout().flush().unwrap();
        // No exit handler runs: the inbox stays, as a killed process's does. (Not a
        // signal: the first process of a PID namespace ignores those it has no handler
        // for, even its own abort(3)'s.)
        // SAFETY: _exit(2) ends the process at once; nothing of it runs after.
        unsafe { libc::_exit(3) };
    }
    if std::env::var(SWEEPS).is_ok() {
        let _device = shm_device_at(SWEEPER);
        return;
    }
    unshare();
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let died = again(NAME, DIES, "1", true);
    assert!(
        !died.status.success() && String::from_utf8_lossy(&died.stdout).contains("dying"),
        "the child opened its device and died: {}\n{}",
        String::from_utf8_lossy(&died.stdout),
        String::from_utf8_lossy(&died.stderr)
    );
    assert!(
        !inboxes_of(DEAD).is_empty(),
        "a process that died leaves its inbox"
    );
    let swept = again(NAME, SWEEPS, "1", false);
    assert!(
        swept.status.success(),
        "the sweeper failed: {}",
        String::from_utf8_lossy(&swept.stderr)
    );
    assert_eq!(
        inboxes_of(DEAD),
        Vec::<String>::new(),
        "the next device here swept the dead device's inbox"
    );
    assert_eq!(
        members_files_of(DEAD),
        0,
        "and its address's members file (nobody else of its namespace was there)"
    );
}
