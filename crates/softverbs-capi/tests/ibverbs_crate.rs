//! The `ibverbs` Rust crate (rust-ibverbs, version 0.9.2, from crates.io) runs its own
//! example, `examples/loopback.rs`, unmodified on the drop-in (issue #17). The example
//! opens the first device, creates a CQ, a PD and an RC QP with `set_gid_index(1)`
//! (rxe's IPv4 RoCEv2 GID, which the crate checks against the table
//! `ibv_query_gid_table(3)` returns), connects the QP to itself, and sends one `u64`
//! from one half of a memory region to the other, printing `sent` and `received`.
//!
//! The test asks cargo for that exact version (a probe package depending on
//! `ibverbs = "=0.9.2"`, then `cargo metadata` for where cargo unpacked it), copies the
//! crate as published into the target directory, builds the example with the crate's own
//! `Cargo.lock` (`--locked`), and runs it with `LD_LIBRARY_PATH` at the drop-in. Building
//! needs crates.io, and what `ibverbs-sys` builds with: cmake (it configures its vendored
//! rdma-core to generate headers), libclang (bindgen) and libibverbs-dev (the example
//! links `-libverbs`); scripts/test.sh installs them. About a minute on two cores the
//! first time; later runs reuse the build.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The crate and version the issue names.
const CRATE: &str = "ibverbs";
const VERSION: &str = "0.9.2";

/// Longest the fetch and the build may take (a loaded two-core machine builds it in about
/// a minute and a half).
const BUILD_LIMIT: Duration = Duration::from_secs(15 * 60);

/// Longest the example may run (it finishes in milliseconds; it busy-polls forever if a
/// completion never comes).
const RUN_LIMIT: Duration = Duration::from_secs(60);

fn cargo() -> Command {
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    // The nested builds use their own target directory, never the one running this test.
    command.env_remove("CARGO_TARGET_DIR");
    command
}

/// Runs `command` (bounded) and returns its stdout; panics with its output if it fails.
fn run(command: &mut Command, what: &str) -> String {
    let (status, stdout, stderr) = common::run_bounded(command, BUILD_LIMIT);
    assert!(
        status.is_some_and(|s| s.success()),
        "{what} failed ({}):\n--- stdout\n{stdout}--- stderr\n{stderr}",
        status.map_or_else(
            || format!("killed after {BUILD_LIMIT:?}"),
            |s| s.to_string()
        )
    );
    stdout
}

/// The directory where cargo unpacked `CRATE` `VERSION` from crates.io (downloading it if
/// needed): a probe package depends on exactly that version, and `cargo metadata` names
/// the manifest it resolved to.
fn published_crate(work: &Path) -> PathBuf {
    let probe = work.join("probe");
    std::fs::create_dir_all(probe.join("src")).expect("create the probe package");
    std::fs::write(
        probe.join("Cargo.toml"),
        format!(
            "[package]\nname = \"probe\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
             publish = false\n\n[dependencies]\n{CRATE} = \"={VERSION}\"\n"
        ),
    )
    .expect("write the probe manifest");
    std::fs::write(probe.join("src/lib.rs"), "").expect("write the probe library");
    let json = run(
        cargo()
            .args(["metadata", "--format-version", "1", "--manifest-path"])
            .arg(probe.join("Cargo.toml")),
        "cargo metadata of the probe package",
    );
    let metadata: serde_json::Value = serde_json::from_str(&json).expect("cargo metadata JSON");
    let manifest = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == CRATE && p["version"] == VERSION)
        .and_then(|p| p["manifest_path"].as_str())
        .unwrap_or_else(|| panic!("{CRATE} {VERSION} not in the probe's metadata:\n{json}"));
    Path::new(manifest)
        .parent()
        .expect("the manifest's directory")
        .to_path_buf()
}

/// Copies the directory `from` to `to` (files and directories only).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the copy");
    for entry in std::fs::read_dir(from).expect("read the crate") {
        let entry = entry.expect("a directory entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy a file of the crate");
        }
    }
}

/// `ibverbs` 0.9.2's `examples/loopback.rs`, built as published, runs to its end on the
/// drop-in: it finds GID index 1 in the table (index 0 the link-local GID, 1 the
/// IPv4-mapped address, as kernel rxe lays out a port's table), connects an RC QP to
/// itself through it, and moves its message (`ibv_post_send(3)`, `ibv_poll_cq(3)`).
#[test]
fn the_ibverbs_crates_loopback_example_runs_unmodified_on_the_drop_in() {
    let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{CRATE}-{VERSION}"));
    let published = published_crate(&work);
    let source = work.join("crate");
    let _ = std::fs::remove_dir_all(&source);
    copy_tree(&published, &source);
    let example = source.join("examples/loopback.rs");
    assert!(example.is_file(), "{} missing", example.display());

    let target = work.join("target");
    run(
        cargo()
            .args([
                "build",
                "--locked",
                "--example",
                "loopback",
                "--manifest-path",
            ])
            .arg(source.join("Cargo.toml"))
            .env("CARGO_TARGET_DIR", &target),
        &format!("building {CRATE} {VERSION}'s example loopback"),
    );

    let exe = target.join("debug/examples/loopback");
    let lib = common::library_dir("ibverbs-crate");
    let (status, stdout, stderr) = common::run_bounded(
        Command::new(&exe)
            .env("LD_LIBRARY_PATH", &lib)
            .env("LD_BIND_NOW", "1")
            .env("SOFTVERBS_ADDR", "127.0.0.239:0"),
        RUN_LIMIT,
    );
    // One line per completion, in the order the CQ gave them: a receive completion may
    // come before the send's (whose ACK arrives after the data).
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort_unstable();
    assert!(
        status.is_some_and(|s| s.success()) && lines == ["received", "sent"],
        "{} on the drop-in ({}):\n--- stdout\n{stdout}--- stderr\n{stderr}",
        exe.display(),
        status.map_or_else(|| format!("killed after {RUN_LIMIT:?}"), |s| s.to_string())
    );
}
