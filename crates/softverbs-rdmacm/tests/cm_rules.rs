//! The rdma_cm rules of the man pages, as our C program `tests/c/cm_rules.c` checks them
//! through the drop-ins: compiled with `gcc` against the installed `<rdma/rdma_cma.h>`
//! (linked with Debian's librdmacm at build time, so it carries its versioned
//! references) and run on ours, once under AddressSanitizer + UndefinedBehaviorSanitizer
//! and once under valgrind (memcheck, errors fail the run). Two-process rules fork a
//! server and a client, each with its own device address. Needs gcc, librdmacm-dev and
//! valgrind; a missing one is a failure, never a skip.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

const RUN_TIMEOUT: Duration = Duration::from_secs(180);

fn compile(name: &str, flags: &[&str]) -> PathBuf {
    assert!(
        Path::new("/usr/include/rdma/rdma_cma.h").exists(),
        "rdma_cma.h is missing: install the Debian package librdmacm-dev"
    );
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/cm_rules.c");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("softverbs-rdmacm-c");
    std::fs::create_dir_all(&dir).expect("create the build directory");
    let exe = dir.join(name);
    let out = Command::new("gcc")
        .args([
            "-std=gnu11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pthread",
            "-g",
        ])
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .args(["-lrdmacm", "-libverbs"])
        .output()
        .expect("run gcc: install the Debian package gcc");
    assert!(
        out.status.success(),
        "gcc {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

fn asan_exe() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        compile(
            "cm_rules_asan",
            &["-fsanitize=address,undefined", "-fno-sanitize-recover=all"],
        )
    })
}

fn plain_exe() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| compile("cm_rules", &["-O1"]))
}

fn check(what: &str, out: (Option<std::process::ExitStatus>, String, String), scenario: &str) {
    let (status, stdout, stderr) = out;
    assert!(
        status.is_some_and(|s| s.success()) && stdout.contains(&format!("ok {scenario}")),
        "{scenario} under {what}: status {status:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(
        !stderr.contains("Sanitizer"),
        "{scenario}: sanitizer report:\n{stderr}"
    );
}

fn run(mut cmd: Command) -> (Option<std::process::ExitStatus>, String, String) {
    let child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let r = common::spawn_wait(child, RUN_TIMEOUT);
    (r.0, r.1, r.2)
}

/// Runs `scenario` under the sanitizers and under valgrind.
fn scenario(name: &str, server: u8, client: u8, port: u16) {
    let (lib, args) = under_asan(name, server, client, port);
    assert!(
        Path::new("/usr/bin/valgrind").exists(),
        "valgrind is missing: install the Debian package valgrind"
    );
    let mut vg = Command::new("/usr/bin/valgrind");
    vg.args(["-q", "--error-exitcode=99", "--leak-check=no"])
        .arg(plain_exe())
        .args(&args)
        .env("LD_LIBRARY_PATH", &lib);
    check("valgrind", run(vg), name);
}

/// Runs scenario `name` under AddressSanitizer; the library directory and the arguments,
/// for another run.
fn under_asan(name: &str, server: u8, client: u8, port: u16) -> (PathBuf, [String; 4]) {
    let lib = common::library_dir(&format!("c-{name}"));
    let args = [
        name.to_string(),
        server.to_string(),
        client.to_string(),
        port.to_string(),
    ];
    let mut asan = Command::new(asan_exe());
    asan.args(&args)
        .env("LD_LIBRARY_PATH", &lib)
        .env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0");
    check("AddressSanitizer", run(asan), name);
    (lib, args)
}

/// rdma_cm(7) / rdma_get_cm_event(3): bad pointers and arguments fail with -1 and EINVAL
/// (EAFNOSUPPORT for an AF_IB address; EINVAL for a multicast join on an id neither bound
/// nor resolved), never a crash.
#[test]
fn bad_arguments_fail_with_the_documented_errno() {
    scenario("bad_arguments", 162, 0, 0);
}

/// rdma_get_cm_event(3): a channel whose fd is O_NONBLOCK returns EAGAIN when empty and
/// polls readable when an event waits.
#[test]
fn a_nonblocking_channel_returns_eagain_when_empty() {
    scenario("nonblocking_channel", 163, 0, 0);
}

/// rdma_destroy_id(3): "ack all related events" — destroy blocks until they are.
#[test]
fn destroy_id_blocks_until_its_events_are_acknowledged() {
    scenario("destroy_waits_for_ack", 164, 0, 0);
}

/// rdma_reject(3): the private data reaches the active side with RDMA_CM_EVENT_REJECTED,
/// status 28 (IBTA 12.6.7.2, consumer reject).
#[test]
fn reject_carries_private_data_to_the_active_side() {
    scenario("reject", 165, 166, 7101);
}

/// rdma_connect(3) to a port nobody listens on: RDMA_CM_EVENT_REJECTED with status 8
/// (REJ "invalid service ID"), as the kernel's CM gives over RoCE.
#[test]
fn connecting_to_an_unlistened_port_is_rejected_with_status_8() {
    scenario("no_listener", 167, 168, 7201);
}

/// rdma_disconnect(3) from the active side: both sides get RDMA_CM_EVENT_DISCONNECTED.
#[test]
fn a_disconnect_by_the_active_side_reaches_both() {
    scenario("active_disconnects", 169, 170, 7301);
}

/// rdma_disconnect(3) from the passive side: both sides get RDMA_CM_EVENT_DISCONNECTED.
#[test]
fn a_disconnect_by_the_passive_side_reaches_both() {
    scenario("passive_disconnects", 171, 172, 7401);
}

/// A connection request that comes before the server's rdma_listen(3) (the CM holds it
/// 50 ms for a listen, as the kernel's does not: programs that connect right after telling
/// their peer to listen, as perftest's -R does, would otherwise be rejected) is the
/// listener's as soon as rdma_listen returns: RDMA_CM_EVENT_CONNECT_REQUEST comes within
/// 30 ms of it, not when the hold runs out. Before, the CM thread slept until the hold's
/// end, and perftest's data connection waited 50 ms for it. Under AddressSanitizer only:
/// the bound is wall-clock time, which valgrind stretches twentyfold and more.
#[test]
fn a_request_held_for_a_listen_is_delivered_when_the_listen_comes() {
    under_asan("listen_after_request", 207, 208, 7501);
}

/// What libfabric's verbs provider calls: rdma_getaddrinfo(3) with only the hints'
/// addresses, rdma_bind_addr(3) to 127.0.0.1 (bound to the device, its address as the
/// source), rdma_migrate_id(3) of a synchronous id holding its last event.
#[test]
fn libfabric_style_getaddrinfo_loopback_bind_and_sync_migrate_work() {
    scenario("libfabric_calls", 189, 0, 0);
}
