//! Memory windows on the drop-in, pinned by our own C program
//! (`tests/c/memory_windows.c`) through the real inline verbs functions, each rule citing
//! its man page: `ibv_alloc_mw(3)` (a bad type is `EINVAL`), `ibv_bind_mw(3)` type 1 (the
//! bind completes, `mw->rkey` advances, READ and WRITE inside the window succeed and
//! beyond it are `IBV_WC_REM_ACCESS_ERR`; a type 2 window is `EINVAL`, a region without
//! `IBV_ACCESS_MW_BIND` or a range beyond it `IBV_WC_MW_BIND_ERR`), `ibv_post_send(3)`
//! `IBV_WR_BIND_MW` and `ibv_wr_bind_mw` type 2, `IBV_WR_LOCAL_INV` and a peer's
//! `IBV_WR_SEND_WITH_INV` (the receive completion's `IBV_WC_WITH_INV` and
//! `invalidated_rkey`) after which the R_Key is refused, and `ibv_dereg_mr(3)` /
//! `ibv_dealloc_pd(3)` refused while a window holds the region / PD.
//!
//! As `protection.rs` does, it runs under AddressSanitizer/UndefinedBehaviorSanitizer and
//! under valgrind memcheck (`tests/common/rules.rs`).

mod common;

use common::rules::{assert_rules_hold, Checker};

/// The lines the program prints, one per rule, in order.
const RULES: [&str; 9] = [
    "rule setup: ",
    "rule 1: ",
    "rule 2: ",
    "rule 3: ",
    "rule 4: ",
    "rule 5: ",
    "rule 6: ",
    "rule 7: ",
    "rule teardown: ",
];

#[test]
fn memory_window_rules_hold_under_address_and_undefined_behavior_sanitizers() {
    assert_rules_hold(
        "memory_windows.c",
        Checker::Sanitizers,
        "127.0.0.231:0",
        &RULES,
    );
}

#[test]
fn memory_window_rules_hold_under_valgrind_memcheck() {
    assert_rules_hold(
        "memory_windows.c",
        Checker::Valgrind,
        "127.0.0.232:0",
        &RULES,
    );
}
