//! The dynamic symbol table of the built `librdmacm.so.1`: exactly the default-version
//! symbols of Debian's rdma-core 44 librdmacm (`objdump -T
//! /usr/lib/x86_64-linux-gnu/librdmacm.so.1`), each at its version node (`RDMACM_1.0` …
//! `RDMACM_1.3`), nothing else exported, and the SONAME `librdmacm.so.1`. Needs
//! `objdump` (binutils) and Debian's librdmacm1; missing ones are failures.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

const SYSTEM: &str = "/usr/lib/x86_64-linux-gnu/librdmacm.so.1";

/// (symbol, node) of every defined dynamic symbol, version-node definitions left out.
fn exports(lib: &Path) -> BTreeSet<(String, String)> {
    let out = Command::new("objdump")
        .arg("-T")
        .arg(lib)
        .output()
        .expect("run objdump: install the Debian package binutils");
    assert!(out.status.success(), "objdump -T {}", lib.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.contains("*UND*"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 4 || !(f.contains(&"DF") || f.contains(&"DO")) {
                return None;
            }
            let name = f[f.len() - 1].to_string();
            let node = f[f.len() - 2]
                .trim_matches(|c| c == '(' || c == ')')
                .to_string();
            (name != node).then_some((name, node))
        })
        .collect()
}

#[test]
fn every_librdmacm_symbol_is_exported_at_its_node_and_nothing_else() {
    assert!(
        Path::new(SYSTEM).exists(),
        "{SYSTEM} missing: install librdmacm1"
    );
    let ours = common::library_dir("symbols").join("librdmacm.so.1");
    let want = exports(Path::new(SYSTEM));
    let got = exports(&ours);
    assert!(want.len() >= 67, "the system table looks wrong: {want:?}");
    let missing: Vec<_> = want.difference(&got).collect();
    let extra: Vec<_> = got.difference(&want).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:?}\nextra {extra:?}"
    );
}

/// The SONAME and the four nodes. (The nodes' inheritance, written in the version
/// script, is not recorded by the linker for nodes that list no symbols — as in
/// softverbs-capi — and plays no part in binding.)
#[test]
fn the_soname_is_librdmacm_so_1_and_the_four_nodes_are_defined() {
    let ours = common::library_dir("soname").join("librdmacm.so.1");
    let out = Command::new("objdump")
        .arg("-p")
        .arg(&ours)
        .output()
        .expect("objdump");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["SONAME", "librdmacm.so.1"]),
        "{text}"
    );
    let defs = text
        .split("Version definitions:")
        .nth(1)
        .and_then(|t| t.split("Version References:").next())
        .unwrap_or_else(|| panic!("no version definitions:\n{text}"));
    let nodes: Vec<&str> = defs
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .collect();
    assert_eq!(
        nodes,
        [
            "librdmacm.so.1",
            "RDMACM_1.0",
            "RDMACM_1.1",
            "RDMACM_1.2",
            "RDMACM_1.3"
        ]
    );
}
