//! A process that exits with a device it never closed (a C program on the drop-in that
//! returns from `main` with its context open, a Rust program that calls
//! `std::process::exit`) removes its shared-memory inbox from `/dev/shm` as it goes: the
//! file is not left for a later sweep, nor its pages held meanwhile.
//!
//! The parent here opens no device (one would sweep what the child left, `sweep.rs`).

mod common;

use common::{inboxes_of, shm_device_at, this_test_again};
use std::time::{Duration, Instant};

/// Set in the child: the last byte of the address it opens its device on.
const CHILD: &str = "SOFTVERBS_TEST_EXIT_CHILD";

#[test]
fn a_process_that_exits_without_closing_its_device_removes_its_inbox() {
    if let Ok(last) = std::env::var(CHILD) {
        let device = shm_device_at(last.parse().unwrap());
        assert!(device.sharing().is_some(), "the device has an inbox");
        assert!(!inboxes_of(last.parse().unwrap()).is_empty());
        // Exit with the device open: no destructor runs.
        std::process::exit(0);
    }
    const ADDRESS: u8 = 211;
    let mut child = this_test_again(
        "a_process_that_exits_without_closing_its_device_removes_its_inbox",
        CHILD,
        &ADDRESS.to_string(),
    )
    .spawn()
    .expect("start the child");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the child did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "the child: {status}");
    assert_eq!(inboxes_of(ADDRESS), Vec::<String>::new());
}
