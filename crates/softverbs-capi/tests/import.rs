//! Import on the drop-in, pinned by our own C program (`tests/c/import.c`), each rule
//! citing its man page: `ibv_import_device(3)` (a context's `cmd_fd` is an open,
//! close-on-exec descriptor; a `dup` of it imports a context of the same device),
//! `ibv_import_pd(3)` and `ibv_import_mr(3)` (new structs for the same PD and registration,
//! used for an RDMA WRITE between two QPs of the imported context), `ibv_unimport_pd` /
//! `ibv_unimport_mr` (the structs only), unknown handles (`ENOENT`), descriptors that are
//! not a device's (`EINVAL`, `/dev/null` `ENODEV`), a descriptor passed with `SCM_RIGHTS`
//! to another process (`ENODEV` there: the device's state lives in the process that
//! opened it), and the imported context outliving the original.
//!
//! As `memory_windows.rs` does, it runs under AddressSanitizer/UndefinedBehaviorSanitizer
//! and under valgrind memcheck (`tests/common/rules.rs`).

mod common;

use common::rules::{assert_rules_hold, Checker};

/// The lines the program prints, one per rule, in order.
const RULES: [&str; 11] = [
    "rule setup: ",
    "rule 1: ",
    "rule 2: ",
    "rule 3: ",
    "rule 4: ",
    "rule 5: ",
    "rule 6: ",
    "rule 7: ",
    "rule 8: ",
    "rule 9: ",
    "rule teardown: ",
];

#[test]
fn import_rules_hold_under_address_and_undefined_behavior_sanitizers() {
    assert_rules_hold("import.c", Checker::Sanitizers, "127.0.0.246:0", &RULES);
}

#[test]
fn import_rules_hold_under_valgrind_memcheck() {
    assert_rules_hold("import.c", Checker::Valgrind, "127.0.0.247:0", &RULES);
}
