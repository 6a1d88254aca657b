//! Memory registration on the drop-in as on a kernel device, pinned by our own C program
//! (`tests/c/registration.c`): `ibv_reg_mr`, `ibv_reg_mr_iova` and `ibv_reg_mr_iova2`
//! return NULL with the errno rdma-core reports when the kernel's `ib_umem_get` cannot pin
//! the range (`ibv_reg_mr(3)`): `EFAULT` for unmapped pages (NULL included) and for a
//! read-only mapping with write access asked, `EINVAL` for length 0, `EFAULT` (or `ENOMEM`
//! under `RLIMIT_MEMLOCK`) for 1 TiB over a 4 KiB malloc, `ENOMEM` past `RLIMIT_MEMLOCK`
//! without `CAP_IPC_LOCK`; a read-only mapping without write access registers. And memory
//! unmapped while registered makes a peer's RDMA WRITE complete with
//! `IBV_WC_REM_ACCESS_ERR` while the program lives.
//!
//! Before the checks every refused registration above succeeded (and the next access
//! killed the process with SIGSEGV); before the fault-tolerant copies rule 6 died with
//! SIGSEGV.
//!
//! Three runs, each of which must exit 0, print every rule's line and the final `ok`
//! line, and (under a checker) report nothing: under AddressSanitizer and
//! UndefinedBehaviorSanitizer, under valgrind memcheck (which leaves rule 6 out: memcheck
//! reports the device's store into the unmapped pages itself), and a plain build with no
//! checker. `gcc`, `libibverbs-dev` and `valgrind` are required; a missing one is a
//! failure naming its Debian package.

mod common;

use common::rules::{assert_rules_hold, Checker};
use std::time::Duration;

/// The lines the program prints, one per rule, in order.
const RULES: [&str; 9] = [
    "rule setup: ",
    "rule 1: ",
    "rule 2: ",
    "rule 3: ",
    "rule 4: ",
    "rule 5: ",
    "rule 6: ",
    "rule 7: ",
    "rule teardown: ",
];

#[test]
fn registration_errnos_and_unmapped_memory_under_address_and_undefined_behavior_sanitizers() {
    assert_rules_hold(
        "registration.c",
        Checker::Sanitizers,
        "127.0.0.173:0",
        &RULES,
    );
}

#[test]
fn registration_errnos_under_valgrind_memcheck() {
    let rules: Vec<&str> = RULES.into_iter().filter(|r| *r != "rule 6: ").collect();
    assert_rules_hold("registration.c", Checker::Valgrind, "127.0.0.174:0", &rules);
}

#[test]
fn registration_errnos_and_unmapped_memory_in_a_plain_build() {
    let exe = common::compile_c("registration.c", "registration_plain_direct", &["-O1"]);
    let lib = common::library_dir("c-registration-plain");
    let mut command = std::process::Command::new(&exe);
    command
        .env("LD_LIBRARY_PATH", &lib)
        .env("LD_BIND_NOW", "1")
        .env("SOFTVERBS_ADDR", "127.0.0.175:0");
    let (status, stdout, stderr) = common::run_bounded(&mut command, Duration::from_secs(300));
    assert!(
        status.is_some_and(|s| s.success()),
        "{} failed ({status:?}):\n--- stdout\n{stdout}--- stderr\n{stderr}",
        exe.display()
    );
    let lines: Vec<&str> = stdout.lines().collect();
    let mut at = 0;
    for rule in RULES {
        let found = lines[at..]
            .iter()
            .position(|l| l.starts_with(rule) && l.ends_with(": ok"));
        assert!(found.is_some(), "no line `{rule}…: ok`:\n{stdout}");
        at += found.unwrap_or(0) + 1;
    }
    assert!(
        lines.last().is_some_and(|l| l.starts_with("ok ")),
        "{stdout}"
    );
}
