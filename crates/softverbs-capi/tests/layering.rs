//! The drop-in is ABI translation over the verbs core: it depends on `softverbs` (whose
//! `softverbs::core` re-exports the device, the engine and the CQ) and on nothing of ours
//! below it, so every verbs rule it meets is the one the safe API meets. This test fails
//! if a direct edge to `softverbs-device`, `softverbs-cq` or `softverbs-proto` comes back
//! (as `cargo tree` shows it), or if a source file names those crates.

use std::path::Path;
use std::process::Command;

const BELOW_THE_CORE: [&str; 3] = ["softverbs-device", "softverbs-cq", "softverbs-proto"];

#[test]
fn the_drop_in_depends_on_the_core_and_on_nothing_below_it() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "tree",
            "--locked",
            "--offline",
            "-p",
            "softverbs-capi",
            "--depth",
            "1",
            "-e",
            "normal,build,dev",
            "--prefix",
            "none",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let direct: Vec<&str> = tree
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert!(
        direct.contains(&"softverbs"),
        "no edge to the core:\n{tree}"
    );
    for crate_name in BELOW_THE_CORE {
        assert!(
            !direct.contains(&crate_name),
            "softverbs-capi depends on {crate_name} directly; reach it through \
             softverbs::core:\n{tree}"
        );
    }
}

#[test]
fn no_source_of_the_drop_in_names_a_crate_below_the_core() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut stack = vec![root.join("src"), root.join("tests"), root.join("build.rs")];
    let mut offenders = Vec::new();
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap() {
                stack.push(entry.unwrap().path());
            }
        } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("layering.rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            for crate_name in BELOW_THE_CORE {
                if text.contains(&crate_name.replace('-', "_")) {
                    offenders.push(format!("{} names {crate_name}", path.display()));
                }
            }
        }
    }
    assert!(offenders.is_empty(), "{offenders:#?}");
}
