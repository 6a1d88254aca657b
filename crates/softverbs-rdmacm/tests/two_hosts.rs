//! UD multicast between two hosts over IPv6 (issue #16): two network namespaces joined by
//! a veth pair, made and removed by the test (root, as CI runs). Unmodified `mckey(1)` on
//! the drop-ins joins `ff0e::20:1` (`rdma_join_multicast(3)`; IBTA Annex A17: an IPv6
//! multicast GID is the group's address) in each namespace; the sender's datagrams cross
//! the veth as IPv6 multicast and the receiver gets every one. (Loopback has no IPv6
//! multicast route, and Linux 6.1's RDMA CM refuses IPv6 joins on RoCEv2, so neither the
//! loopback tests nor the interop stage can cover this path.)

mod common;

use common::{library_dir, program, spawn_at, ONE_AT_A_TIME};
use std::process::Command;
use std::time::Duration;

/// Runs a command that must succeed (set-up of the hosts).
fn sh(args: &[&str]) {
    let status = Command::new(args[0])
        .args(&args[1..])
        .status()
        .unwrap_or_else(|e| panic!("{args:?}: {e} (install iproute2)"));
    assert!(status.success(), "{args:?} failed: {status}");
}

/// Two namespaces joined by a veth pair with IPv6 addresses fd77::1 and fd77::2; removed
/// (with the pair) on drop.
struct Hosts {
    names: [String; 2],
}

impl Hosts {
    fn new() -> Hosts {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        assert!(
            euid == 0,
            "the two-host tests create network namespaces and need root (CI runs as root)"
        );
        let id = std::process::id() % 100_000;
        let hosts = Hosts {
            names: [format!("svmc-a-{id}"), format!("svmc-b-{id}")],
        };
        let veth = [format!("svmca{id}"), format!("svmcb{id}")];
        for ns in &hosts.names {
            sh(&["ip", "netns", "add", ns]);
        }
        sh(&[
            "ip", "link", "add", &veth[0], "type", "veth", "peer", "name", &veth[1],
        ]);
        for (i, (ns, dev)) in hosts.names.iter().zip(&veth).enumerate() {
            let addr = format!("fd77::{}/64", i + 1);
            sh(&["ip", "link", "set", dev, "netns", ns]);
            sh(&["ip", "-n", ns, "addr", "add", &addr, "dev", dev, "nodad"]);
            sh(&["ip", "-n", ns, "link", "set", dev, "up"]);
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        hosts
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in &self.names {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// mckey(1) over IPv6 between two hosts: the receiver in one namespace joins ff0e::20:1
/// and waits for 20 datagrams; the sender in the other joins and sends 60 (a datagram sent
/// while the receiver was still joining costs nothing); both exit 0.
#[test]
fn mckey_over_ipv6_reaches_a_receiver_on_another_host() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let hosts = Hosts::new();
    let lib = library_dir("two-hosts");
    let mckey = program("mckey", "rdmacm-utils");
    let receiver = spawn_at(
        Some(&hosts.names[1]),
        &lib,
        &mckey,
        &["-m", "ff0e::20:1", "-b", "fd77::2", "-C", "20"],
        "[fd77::2]:4791",
    );
    std::thread::sleep(Duration::from_secs(2));
    let sender = spawn_at(
        Some(&hosts.names[0]),
        &lib,
        &mckey,
        &["-m", "ff0e::20:1", "-s", "-b", "fd77::1", "-C", "60"],
        "[fd77::1]:4791",
    )
    .wait(Duration::from_secs(60));
    let receiver = receiver.wait(Duration::from_secs(30));
    for side in [&sender, &receiver] {
        assert!(
            side.ok()
                && side.stdout.contains("joined dgid: ff0e::20:1")
                && side.stdout.contains("data transfers complete"),
            "{}\n{}",
            sender.report(),
            receiver.report()
        );
    }
}
