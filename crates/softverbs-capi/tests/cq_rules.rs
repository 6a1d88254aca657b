//! The completion-queue rules the pingpong programs never reach, pinned by our own C
//! program (`tests/c/cq_rules.c`) against the drop-in: CQ overrun (error, negative poll,
//! `IBV_EVENT_CQ_ERR`), `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN`, solicited-only and one-shot
//! arming, non-blocking channel and async fds, `EBUSY` from `ibv_destroy_cq`, resize with
//! completions outstanding, the extended poll with completion timestamps, and the
//! acknowledgement wait of `ibv_destroy_cq`. The program makes its own completions: two
//! RC QPs of the one device, connected to each other through it.
//!
//! It runs twice, because the two tools see different things:
//! * built with AddressSanitizer and UndefinedBehaviorSanitizer (with leak detection),
//!   which check the C side and every allocation, but not the accesses the
//!   uninstrumented Rust library makes;
//! * built plainly (`-g -O1`) under valgrind memcheck, which checks every access,
//!   the library's included (a use-after-free inside the drop-in shows up only here).
//!
//! Each run must exit 0, print every rule's line and the final `ok` line, and report
//! nothing. `gcc` (with its sanitizer runtimes), `libibverbs-dev` and `valgrind` are
//! required; a missing one is a failure naming its Debian package, never a skip.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const VALGRIND: &str = "/usr/bin/valgrind";

/// The lines the program prints, one per rule, in order.
const RULES: [&str; 11] = [
    "rule setup: ok",
    "rule 1 ",
    "rule 2 ",
    "rule 3 ",
    "rule 4 ",
    "rule 5 ",
    "rule 6 ",
    "rule 7 ",
    "rule 8 ",
    "rule 9a ",
    "rule 9b ",
];

/// Compiles `tests/c/cq_rules.c` into `name` with the extra `flags`.
fn compile(name: &str, flags: &[&str]) -> PathBuf {
    common::compile_c("cq_rules.c", name, flags)
}

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

/// Asserts a clean run: exit 0, every rule's line, the final `ok` line.
fn assert_all_rules_passed(what: &str, out: &Output) -> (String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        out.status.success() && lines.last().is_some_and(|l| l.starts_with("ok ")),
        "cq_rules {what} failed ({}):\n--- stdout\n{stdout}--- stderr\n{stderr}{}",
        out.status,
        diagnosis(&stderr)
    );
    let mut at = 0;
    for rule in RULES {
        let found = lines[at..].iter().position(|l| l.starts_with(rule));
        assert!(
            found.is_some(),
            "cq_rules {what}: no line starting with {rule:?} (after line {at}):\n{stdout}"
        );
        at += found.unwrap_or(0) + 1;
    }
    (stdout, stderr)
}

/// Known causes of a failed run, recognised in the output, as a hint for the reader.
fn diagnosis(stderr: &str) -> &'static str {
    if stderr.contains("rustix::backend::param::auxv") {
        "\n--- hint: valgrind 3.19 passes prctl(PR_GET_AUXV) through to the kernel, so \
         rustix's linux_raw backend reads the host's AT_SYSINFO_EHDR, a vDSO valgrind does \
         not map for the program (rustix issue #1559): the drop-in dies in \
         rustix::backend::param::auxv::check_elf_base. rustix's `use-libc-auxv` feature \
         (auxv from getauxval, which valgrind synthesises without the vDSO) avoids it."
    } else {
        ""
    }
}

/// The error count of valgrind's `ERROR SUMMARY: N errors` line, if there is one.
fn valgrind_errors(stderr: &str) -> Option<u64> {
    let rest = stderr.split("ERROR SUMMARY: ").nth(1)?;
    rest.split_whitespace().next()?.parse().ok()
}

#[test]
fn cq_rules_hold_under_address_and_undefined_behavior_sanitizers() {
    let exe = compile(
        "cq_rules_asan",
        &[
            "-g",
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
        ],
    );
    let lib = common::library_dir("c-cq-rules-asan");
    let out = run(
        &lib,
        "127.0.0.221:0",
        &exe,
        &[],
        &[
            ("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0"),
            ("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1"),
        ],
    );
    let (_, stderr) = assert_all_rules_passed("under ASan/UBSan", &out);
    assert!(!stderr.contains("Sanitizer"), "sanitizer report:\n{stderr}");
}

#[test]
fn cq_rules_hold_under_valgrind_memcheck() {
    assert!(
        Path::new(VALGRIND).exists(),
        "{VALGRIND} is missing: install the Debian package valgrind"
    );
    let exe = compile("cq_rules_plain", &["-g", "-O1"]);
    let lib = common::library_dir("c-cq-rules-valgrind");
    let out = run(
        &lib,
        "127.0.0.222:0",
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
    let (_, stderr) = assert_all_rules_passed("under valgrind", &out);
    let errors = valgrind_errors(&stderr);
    assert_eq!(
        errors,
        Some(0),
        "valgrind reported errors (or no ERROR SUMMARY):\n{stderr}"
    );
}
