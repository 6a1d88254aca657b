//! A process that exits with a device it never closed (a C program on the drop-in that
//! returns from `main` with its context open, a Rust program that calls
//! `std::process::exit`) removes its shared-memory inbox from `/dev/shm` as it goes: the
//! file is not left for a later sweep, nor its pages held meanwhile.
//!
//! The parent here opens no device (one would sweep what the child left, `sweep.rs`).

use softverbs_device::{Device, DeviceConfig, UdpConfig};
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::time::{Duration, Instant};

/// Set in the child: the last byte of the address it opens its device on.
const CHILD: &str = "SOFTVERBS_TEST_EXIT_CHILD";

/// The inbox files in /dev/shm of the devices on 127.0.0.`last`, port 4791.
fn inboxes_of(last: u8) -> Vec<String> {
    let tail = format!("-127.0.0.{last}-4791-s");
    std::fs::read_dir("/dev/shm")
        .expect("/dev/shm")
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| name.starts_with("softverbs-") && name.contains(&tail))
        .collect()
}

#[test]
fn a_process_that_exits_without_closing_its_device_removes_its_inbox() {
    if let Ok(last) = std::env::var(CHILD) {
        let device = Device::open(DeviceConfig::udp(UdpConfig {
            address: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last.parse().unwrap()))),
            ..UdpConfig::default()
        }))
        .expect("open a UDP device with shared memory");
        assert!(device.sharing().is_some(), "the device has an inbox");
        assert!(!inboxes_of(last.parse().unwrap()).is_empty());
        // Exit with the device open: no destructor runs.
        std::process::exit(0);
    }
    const ADDRESS: u8 = 211;
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_process_that_exits_without_closing_its_device_removes_its_inbox",
            "--nocapture",
        ])
        .env(CHILD, ADDRESS.to_string())
        .env_remove("SOFTVERBS_NETWORK")
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
