//! Parent domains and thread domains on the drop-in, pinned by our own C program
//! (`tests/c/parent_domain.c`): `ibv_alloc_td(3)` / `ibv_dealloc_td` (`EINVAL`, `EBUSY`),
//! `ibv_alloc_parent_domain(3)` (`EINVAL` rules, usable wherever a PD is, `EBUSY` both
//! ways), a CQ created in a parent domain (`ibv_create_cq_ex(3)`,
//! `IBV_CQ_INIT_ATTR_MASK_PD`) whose ring comes from a counting allocator and is read in the
//! application's buffer while polled, `IBV_ALLOCATOR_USE_DEFAULT`, `pd_context` passed back,
//! and a thread domain's CQ. Run under AddressSanitizer/UndefinedBehaviorSanitizer and
//! valgrind memcheck.

mod common;

use common::rules::{assert_rules_hold, Checker};

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
fn parent_domain_and_thread_domain_rules_hold_under_address_and_undefined_behavior_sanitizers() {
    assert_rules_hold(
        "parent_domain.c",
        Checker::Sanitizers,
        "127.0.0.235:0",
        &RULES,
    );
}

#[test]
fn parent_domain_and_thread_domain_rules_hold_under_valgrind_memcheck() {
    assert_rules_hold(
        "parent_domain.c",
        Checker::Valgrind,
        "127.0.0.236:0",
        &RULES,
    );
}
