//! IBA 1.5's ATOMIC WRITE on the drop-in, pinned by our own C program
//! (`tests/c/atomic_write.c`) through the real inline verbs functions, each rule citing
//! its man page: `ibv_query_device_ex(3)` reports the capability (the kernel's
//! `IB_UVERBS_DEVICE_ATOMIC_WRITE`, bit 40 of `device_cap_flags_ex`, which rdma-core 44's
//! headers do not name), and `ibv_wr_post(3)` `ibv_wr_atomic_write` on a QP created by
//! `ibv_create_qp_ex` with `IBV_QP_EX_WITH_ATOMIC_WRITE`: the 8 bytes land exactly with
//! `IBV_WC_ATOMIC_WRITE`; a misaligned address is `IBV_WC_REM_INV_REQ_ERR`. And RDMA FLUSH
//! through rdma-core 45's `ibv_wr_flush` (the program declares 45's `struct ibv_qp_ex`, as a
//! program built against newer headers sees it): `IBV_WC_FLUSH` on a region with
//! `IBV_ACCESS_FLUSH_GLOBAL`, `IBV_WC_REM_ACCESS_ERR` for a persistent flush of a region
//! without `IBV_ACCESS_FLUSH_PERSISTENT`.
//!
//! As `memory_windows.rs` does, it runs under AddressSanitizer/UndefinedBehaviorSanitizer
//! and under valgrind memcheck (`tests/common/rules.rs`).

mod common;

use common::rules::{assert_rules_hold, Checker};

/// The lines the program prints, one per rule, in order.
const RULES: [&str; 7] = [
    "rule setup: ",
    "rule 1: ",
    "rule 2: ",
    "rule 3: ",
    "rule 4: ",
    "rule 5: ",
    "rule teardown: ",
];

#[test]
fn atomic_write_rules_hold_under_address_and_undefined_behavior_sanitizers() {
    assert_rules_hold(
        "atomic_write.c",
        Checker::Sanitizers,
        "127.0.0.247:0",
        &RULES,
    );
}

#[test]
fn atomic_write_rules_hold_under_valgrind_memcheck() {
    assert_rules_hold("atomic_write.c", Checker::Valgrind, "127.0.0.248:0", &RULES);
}
