//! The repository explains itself: every file README.md and ARCHITECTURE.md name exists in
//! the repository, and neither points at a document outside it (a user who clones the
//! repository has nothing else).

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every file below `dir`, as paths relative to the root, `target` and `.git` left out.
fn files(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if name == "target" || name == ".git" {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(relative) = path.strip_prefix(root) {
                out.push(relative.to_string_lossy().into_owned());
            }
        }
    }
    out
}

/// The backquoted names of source and document files in `text` (`a/b.rs`, `c.md`, …); a
/// bare header name (`verbs.h`) is the system's, not ours.
fn named_files(text: &str) -> Vec<String> {
    const EXTENSIONS: [&str; 6] = [".md", ".rs", ".sh", ".c", ".py", ".toml"];
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| !s.contains(char::is_whitespace) && !s.contains('*'))
        .filter(|s| {
            EXTENSIONS.iter().any(|e| s.ends_with(e)) || (s.ends_with(".h") && s.contains('/'))
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_file_the_readme_and_architecture_name_is_in_the_repository() {
    let root = root();
    let tree = files(&root);
    let mut missing = Vec::new();
    for doc in ["README.md", "ARCHITECTURE.md"] {
        let text = std::fs::read_to_string(root.join(doc)).expect(doc);
        let named = named_files(&text);
        assert!(
            !named.is_empty(),
            "{doc} names no file: the check reads nothing"
        );
        for name in named {
            // A path from the root, or the tail of one (`device/link.rs`, `abi.rs`).
            let found = tree
                .iter()
                .any(|f| *f == name || f.ends_with(&format!("/{name}")));
            if !found || name.starts_with("../") {
                missing.push(format!("{doc}: `{name}`"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "named but not in the repository:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_readme_points_at_no_design_document_outside_the_repository() {
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    for outside in ["../shared", "DESIGN.md", "STYLE.md"] {
        assert!(
            !text.contains(outside),
            "README.md mentions {outside}, which a clone does not have"
        );
    }
}

#[test]
fn no_file_of_the_repository_points_at_the_teams_reference_documents() {
    // The documents the code was first written from are not part of the repository: a
    // comment or doc that cites them sends a reader nowhere. Cite the primary source (the
    // man page, IBTA, the header) instead.
    const OUTSIDE: [&str; 6] = [
        "rocev2.md",
        "verbs-abi.md",
        "baselines.md",
        "DESIGN.md",
        "STYLE.md",
        "../shared",
    ];
    let root = root();
    let this = "crates/softverbs/tests/docs.rs";
    let mut found = Vec::new();
    for file in files(&root) {
        if file == this || file.starts_with("target/") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(root.join(&file)) else {
            continue; // not text
        };
        for (n, line) in text.lines().enumerate() {
            if let Some(name) = OUTSIDE.iter().find(|name| line.contains(*name)) {
                found.push(format!("{file}:{}: {name}", n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "files citing documents outside the repository:\n{}",
        found.join("\n")
    );
}
