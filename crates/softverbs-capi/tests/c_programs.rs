//! Our own C programs against the drop-in: compiled with `gcc` against the installed
//! `<infiniband/verbs.h>` (linked at build time with Debian's libibverbs, so they carry
//! its versioned references), run with `LD_LIBRARY_PATH` pointing at the drop-in, under
//! AddressSanitizer and UndefinedBehaviorSanitizer.
//!
//! `tests/c/exports_and_inlines.c` drives device, port and GID queries, PDs and CQs through
//! the exported symbols and through the `verbs.h` inline functions that reach the library only through
//! the extended context (`ibv_query_port`, `ibv_query_device_ex`,
//! `ibv_query_rt_values_ex`, `ibv_create_cq_ex`, `ibv_query_gid_ex`), plus the documented
//! failures and NULL handling.
//!
//! Needs `gcc` (with its sanitizer runtimes) and `libibverbs-dev`; missing ones are
//! failures, never skips.

mod common;

use std::process::Command;

fn compile(source: &str, name: &str) -> std::path::PathBuf {
    common::compile_c(
        source,
        name,
        &["-fsanitize=address,undefined", "-fno-sanitize-recover=all"],
    )
}

#[test]
fn queries_pds_and_cqs_work_through_exports_and_inlines_under_sanitizers() {
    let exe = compile("exports_and_inlines.c", "exports_and_inlines");
    let lib = common::library_dir("c-exports-and-inlines");
    let out = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &lib)
        .env("LD_BIND_NOW", "1")
        .env("SOFTVERBS_ADDR", "127.0.0.79:0")
        .env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
        .output()
        .expect("run exports_and_inlines");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.starts_with("ok "),
        "exports_and_inlines failed ({}):\n{stdout}{stderr}",
        out.status
    );
    assert!(!stderr.contains("Sanitizer"), "sanitizer report:\n{stderr}");
}
