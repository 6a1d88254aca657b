//! Protection domains on the drop-in, pinned by our own C program
//! (`tests/c/protection.c`) through the real inline verbs functions: a QP reaches only
//! memory regions of its own PD (IBTA vol. 1 ch. 10, protection domains: a QP may access a
//! memory region only if the PD assigned to the QP matches the region's; rxe refuses such
//! a key in its MR lookup). In one process with two PDs and loopback RC QP pairs, an RDMA
//! WRITE naming an rkey of the other PD completes with `IBV_WC_REM_ACCESS_ERR` (by
//! `ibv_post_send` and by `ibv_wr_rdma_write`) and leaves that region unchanged, a SEND
//! whose lkey is of the other PD completes with `IBV_WC_LOC_PROT_ERR` and sends nothing,
//! and the same operations within the QP's PD work, for QPs made by `ibv_create_qp` and
//! by `ibv_create_qp_ex` alike.
//!
//! As `cq_rules.rs` does, it runs twice: built with AddressSanitizer and
//! UndefinedBehaviorSanitizer (leak detection on), and built plainly under valgrind
//! memcheck (which also sees the library's own accesses). Each run must exit 0, print
//! every rule's line and the final `ok` line, and report nothing. `gcc`, `libibverbs-dev`
//! and `valgrind` are required; a missing one is a failure naming its Debian package.

mod common;

use std::path::Path;
use std::process::{Command, Output};

const VALGRIND: &str = "/usr/bin/valgrind";

/// The lines the program prints, one per rule, in order.
const RULES: [&str; 7] = [
    "rule setup: ",
    "rule 1: ",
    "rule 2: ",
    "rule 3: ",
    "rule 4: ",
    "rule 5: ",
    "rule teardown: ",
];

/// Runs `program args` on the drop-in in `lib` with the device at `addr`.
fn run(lib: &Path, addr: &str, program: &Path, args: &[&Path], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("LD_LIBRARY_PATH", lib)
        .env("LD_BIND_NOW", "1")
        .env("SOFTVERBS_ADDR", addr);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()))
}

/// Asserts a clean run: exit 0, every rule's line ending in `ok`, the final `ok` line.
/// Returns stderr.
fn assert_all_rules_passed(what: &str, out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        out.status.success() && lines.last().is_some_and(|l| l.starts_with("ok ")),
        "protection {what} failed ({}):\n--- stdout\n{stdout}--- stderr\n{stderr}",
        out.status
    );
    let mut at = 0;
    for rule in RULES {
        let found = lines[at..]
            .iter()
            .position(|l| l.starts_with(rule) && l.ends_with(": ok"));
        assert!(
            found.is_some(),
            "protection {what}: no line `{rule}…: ok` (after line {at}):\n{stdout}"
        );
        at += found.unwrap_or(0) + 1;
    }
    stderr
}

/// The error count of valgrind's `ERROR SUMMARY: N errors` line, if there is one.
fn valgrind_errors(stderr: &str) -> Option<u64> {
    let rest = stderr.split("ERROR SUMMARY: ").nth(1)?;
    rest.split_whitespace().next()?.parse().ok()
}

#[test]
fn keys_of_another_pd_are_refused_under_address_and_undefined_behavior_sanitizers() {
    let exe = common::compile_c(
        "protection.c",
        "protection_asan",
        &[
            "-g",
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
        ],
    );
    let lib = common::library_dir("c-protection-asan");
    let out = run(
        &lib,
        "127.0.0.223:0",
        &exe,
        &[],
        &[
            ("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0"),
            ("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1"),
        ],
    );
    let stderr = assert_all_rules_passed("under ASan/UBSan", &out);
    assert!(!stderr.contains("Sanitizer"), "sanitizer report:\n{stderr}");
}

#[test]
fn keys_of_another_pd_are_refused_under_valgrind_memcheck() {
    assert!(
        Path::new(VALGRIND).exists(),
        "{VALGRIND} is missing: install the Debian package valgrind"
    );
    let exe = common::compile_c("protection.c", "protection_plain", &["-g", "-O1"]);
    let lib = common::library_dir("c-protection-valgrind");
    let out = run(
        &lib,
        "127.0.0.224:0",
        Path::new(VALGRIND),
        &[
            Path::new("--error-exitcode=99"),
            Path::new("--leak-check=full"),
            Path::new("--errors-for-leak-kinds=definite"),
            Path::new("--show-leak-kinds=definite"),
            &exe,
        ],
        &[],
    );
    let stderr = assert_all_rules_passed("under valgrind", &out);
    assert_eq!(
        valgrind_errors(&stderr),
        Some(0),
        "valgrind reported errors (or no ERROR SUMMARY):\n{stderr}"
    );
}
