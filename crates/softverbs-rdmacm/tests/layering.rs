//! librdmacm.so.1 never carries a second copy of the device: its only dependencies are
//! libc and the sans-IO softverbs-cm (the device is reached through the loaded
//! libibverbs.so.1), and no code of softverbs, softverbs-device or softverbs-proto is
//! linked into the built library (its symbol table names none of their functions).

mod common;

use std::process::Command;

#[test]
fn the_crate_depends_on_libc_and_softverbs_cm_only() {
    let toml = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .expect("read Cargo.toml");
    let deps: Vec<&str> = toml
        .split("[dependencies]")
        .nth(1)
        .expect("a [dependencies] table")
        .split("\n[")
        .next()
        .unwrap_or("")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split(['=', ' ']).next())
        .collect();
    assert_eq!(deps, ["libc", "softverbs-cm"], "dependencies: {deps:?}");
}

#[test]
fn no_device_code_is_linked_into_the_library() {
    let lib = common::library_dir("layering").join("librdmacm.so.1");
    let out = Command::new("nm")
        .arg(&lib)
        .output()
        .expect("run nm: install the Debian package binutils");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("softverbs_rdmacm"),
        "nm shows no symbols of ours:\n{text:.2000}"
    );
    for foreign in [
        "softverbs_device",
        "softverbs_proto",
        "softverbs_capi",
        "9softverbs4core",
    ] {
        assert!(
            !text.contains(foreign),
            "{foreign} code is linked into librdmacm.so.1"
        );
    }
}
