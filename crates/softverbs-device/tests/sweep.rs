//! A process that dies without closing its device (killed, crashed, or a C program that
//! returns from `main` with its context open) leaves its shared-memory inbox in `/dev/shm`,
//! with every page its peers wrote into it. The next process's first device to make an
//! inbox removes it: `/dev/shm` does not fill up with the inboxes of programs that are
//! gone (a nearly full one would make every new device UDP only).
//!
//! One test in this binary: the sweep runs once per process, at its first inbox.

mod common;

use common::{inboxes_of, shm_device_at, this_test_again};
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

/// Set in the child: the last byte of the address it opens its device on.
const CHILD: &str = "SOFTVERBS_TEST_SWEEP_CHILD";

#[test]
fn the_inbox_of_a_killed_process_is_removed_when_another_process_opens_a_device() {
    if let Ok(last) = std::env::var(CHILD) {
        // The child: a device, then nothing until it is killed (bounded all the same).
        let _device = shm_device_at(last.parse().unwrap());
        println!("sweep-child-ready");
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    const ADDRESS: u8 = 209;
    let mut child = this_test_again(
        "the_inbox_of_a_killed_process_is_removed_when_another_process_opens_a_device",
        CHILD,
        &ADDRESS.to_string(),
    )
    .stdout(Stdio::piped())
    .spawn()
    .expect("start the child");
    let stdout = child.stdout.take().unwrap();
    let ready = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.contains("sweep-child-ready"));
    assert!(ready, "the child did not open its device");
    assert!(
        !inboxes_of(ADDRESS).is_empty(),
        "the child's device has an inbox"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        !inboxes_of(ADDRESS).is_empty(),
        "a killed process cannot remove its inbox"
    );

    let _device = shm_device_at(ADDRESS + 1);
    assert_eq!(
        inboxes_of(ADDRESS),
        Vec::<String>::new(),
        "the next device swept the dead process's inbox"
    );
}
