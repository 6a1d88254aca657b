//! Our C rule programs (`tests/c/*.c` on `tests/c/rules.h`), run on the drop-in under a
//! checker. Each program prints one `rule NAME…: ok` line per rule and a final
//! `ok N checks` line, and exits 0; it must do so under both checkers, because they see
//! different things:
//! * AddressSanitizer and UndefinedBehaviorSanitizer (with leak detection) check the C side
//!   and every allocation, but not the accesses the uninstrumented Rust library makes;
//! * valgrind memcheck, on a plain `-g -O1` build, checks every access, the library's
//!   included (a use-after-free inside the drop-in shows up only here).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

const VALGRIND: &str = "/usr/bin/valgrind";

/// Longest a run may take; the programs' own watchdog (120 s per rule) normally ends a
/// stuck one first.
const LIMIT: Duration = Duration::from_secs(15 * 60);

/// What a rule program runs under.
#[derive(Clone, Copy, Debug)]
pub enum Checker {
    /// Built with `-fsanitize=address,undefined`, leak detection on.
    Sanitizers,
    /// Built plainly and run under valgrind memcheck.
    Valgrind,
}

/// Compiles `tests/c/<source>` for `checker`, runs it on the drop-in with the device at
/// `addr`, and asserts a clean run: exit 0, a `…: ok` line starting with each of `rules`
/// in order, the final `ok` line, and nothing reported by the checker.
pub fn assert_rules_hold(source: &str, checker: Checker, addr: &str, rules: &[&str]) {
    let stem = source.trim_end_matches(".c");
    let dir = stem.replace('_', "-");
    let (exe, lib, mut command) = match checker {
        Checker::Sanitizers => {
            let exe = super::compile_c(
                source,
                &format!("{stem}_asan"),
                &[
                    "-g",
                    "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=all",
                ],
            );
            let mut command = Command::new(&exe);
            command
                .env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
                .env("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1");
            (exe, super::library_dir(&format!("c-{dir}-asan")), command)
        }
        Checker::Valgrind => {
            assert!(
                Path::new(VALGRIND).exists(),
                "{VALGRIND} is missing: install the Debian package valgrind"
            );
            let exe = super::compile_c(source, &format!("{stem}_plain"), &["-g", "-O1"]);
            let mut command = Command::new(VALGRIND);
            command.args([
                "--error-exitcode=99",
                "--leak-check=full",
                "--errors-for-leak-kinds=definite",
                "--show-leak-kinds=definite",
            ]);
            command.arg(&exe);
            (
                exe,
                super::library_dir(&format!("c-{dir}-valgrind")),
                command,
            )
        }
    };
    command
        .env("LD_LIBRARY_PATH", &lib)
        .env("LD_BIND_NOW", "1")
        .env("SOFTVERBS_ADDR", addr);
    let what = format!("{} under {checker:?}", exe.display());
    let (status, stdout, stderr) = super::run_bounded(&mut command, LIMIT);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        status.is_some_and(|s| s.success()) && lines.last().is_some_and(|l| l.starts_with("ok ")),
        "{what} failed ({}):\n--- stdout\n{stdout}--- stderr\n{stderr}{}",
        status.map_or_else(
            || format!("stuck: killed after {LIMIT:?}"),
            |s| s.to_string()
        ),
        diagnosis(&stderr)
    );
    let mut at = 0;
    for rule in rules {
        let found = lines[at..]
            .iter()
            .position(|l| l.starts_with(rule) && l.ends_with(": ok"));
        assert!(
            found.is_some(),
            "{what}: no line `{rule}…: ok` (after line {at}):\n{stdout}"
        );
        at += found.unwrap_or(0) + 1;
    }
    match checker {
        Checker::Sanitizers => {
            assert!(!stderr.contains("Sanitizer"), "sanitizer report:\n{stderr}")
        }
        Checker::Valgrind => assert_eq!(
            valgrind_errors(&stderr),
            Some(0),
            "valgrind reported errors (or no ERROR SUMMARY):\n{stderr}"
        ),
    }
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
