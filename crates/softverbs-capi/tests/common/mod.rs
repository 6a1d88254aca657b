//! Helpers shared by the integration tests: the built cdylib and a directory where it is
//! named `libibverbs.so.1`, and running programs bounded in time.

#![allow(dead_code)]

mod process;
pub mod rules;

pub use process::*;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The cdylib cargo built for this test run (`libsoftverbs_capi.so`).
pub fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps directory");
    for dir in [deps, deps.parent().expect("profile directory")] {
        let candidate = dir.join("libsoftverbs_capi.so");
        if candidate.exists() {
            return candidate;
        }
    }
    panic!(
        "libsoftverbs_capi.so not found next to {} or in its parent: cargo builds the cdylib \
         with the library target, so this means the crate-type changed",
        exe.display()
    );
}

/// A directory (under cargo's per-target temporary directory) holding `libibverbs.so.1`
/// as a symlink to the built cdylib: what `LD_LIBRARY_PATH` points at.
pub fn library_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("softverbs-capi-{name}"));
    std::fs::create_dir_all(&dir).expect("create library directory");
    let link = dir.join("libibverbs.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(cdylib(), &link).expect("symlink libibverbs.so.1");
    dir
}

/// Runs `program args` on the drop-in (`LD_LIBRARY_PATH`, `LD_BIND_NOW=1`); returns
/// (exit status, stdout, stderr). A missing program is a failure naming its package.
pub fn run_on_drop_in(
    lib_dir: &Path,
    program: &str,
    args: &[&str],
    package: &str,
) -> (std::process::ExitStatus, String, String) {
    let path = Path::new("/usr/bin").join(program);
    assert!(
        path.exists(),
        "{} is missing: install the Debian package `{package}` (the project's test script \
         installs its packages)",
        path.display()
    );
    let out = Command::new(&path)
        .args(args)
        .env("LD_LIBRARY_PATH", lib_dir)
        .env("LD_BIND_NOW", "1")
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", path.display()));
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Compiles our C test program `tests/c/<source>` into `<name>` with gcc against the
/// installed `<infiniband/verbs.h>`, warnings as errors, plus `flags` (sanitizers,
/// optimisation). It links Debian's libibverbs at build time, so the program carries its
/// versioned references; it runs on whatever `LD_LIBRARY_PATH` names.
pub fn compile_c(source: &str, name: &str, flags: &[&str]) -> PathBuf {
    assert!(
        Path::new("/usr/include/infiniband/verbs.h").exists(),
        "verbs.h is missing: install the Debian package libibverbs-dev"
    );
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(source);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("softverbs-capi-c");
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
        .arg("-libverbs")
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
