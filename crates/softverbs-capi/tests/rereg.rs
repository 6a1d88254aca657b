//! `ibv_rereg_mr(3)` on the drop-in, pinned by our own C program (`tests/c/rereg.c`):
//! each flag (`IBV_REREG_MR_CHANGE_TRANSLATION`, `_PD`, `_ACCESS`) keeps the keys and
//! updates `mr->addr`, `mr->length`, `mr->pd`; a peer's write lands in the new range;
//! `IBV_REREG_MR_ERR_INPUT` with `EINVAL` for no flag, an unknown flag, an empty
//! translation and a window bound; `IBV_REREG_MR_ERR_CMD` with the registration's errno
//! (`EFAULT`, `EINVAL`) otherwise, the region unchanged. Run under
//! AddressSanitizer/UndefinedBehaviorSanitizer and valgrind memcheck.

mod common;

use common::rules::{assert_rules_hold, Checker};

const RULES: [&str; 6] = [
    "rule setup: ",
    "rule 1: ",
    "rule 2: ",
    "rule 3: ",
    "rule 4: ",
    "rule teardown: ",
];

#[test]
fn rereg_mr_rules_hold_under_address_and_undefined_behavior_sanitizers() {
    assert_rules_hold("rereg.c", Checker::Sanitizers, "127.0.0.233:0", &RULES);
}

#[test]
fn rereg_mr_rules_hold_under_valgrind_memcheck() {
    assert_rules_hold("rereg.c", Checker::Valgrind, "127.0.0.234:0", &RULES);
}
