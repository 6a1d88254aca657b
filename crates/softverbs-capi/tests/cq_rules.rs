//! The completion-queue rules the pingpong programs never reach, pinned by our own C
//! program (`tests/c/cq_rules.c`) against the drop-in: CQ overrun (error, negative poll,
//! `IBV_EVENT_CQ_ERR`), `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN`, solicited-only and one-shot
//! arming, non-blocking channel and async fds, `EBUSY` from `ibv_destroy_cq`, resize with
//! completions outstanding, the extended poll with completion timestamps, and the
//! acknowledgement wait of `ibv_destroy_cq`. The program makes its own completions: two
//! RC QPs of the one device, connected to each other through it.
//!
//! It runs twice, under AddressSanitizer/UndefinedBehaviorSanitizer and under valgrind
//! memcheck (see `tests/common/rules.rs` for why both). Each run must exit 0, print every
//! rule's `…: ok` line and the final `ok` line, and report nothing. `gcc` (with its
//! sanitizer runtimes), `libibverbs-dev` and `valgrind` are required; a missing one is a
//! failure naming its Debian package, never a skip.

mod common;

use common::rules::{assert_rules_hold, Checker};

/// The lines the program prints, one per rule, in order.
const RULES: [&str; 11] = [
    "rule setup: ok",
    "rule 1 ",
    "rule 2 ",
    "rule 3 ",
    "rule 4 ",
    "rule 5 ",
    "rule 6 ",
    "rule 7 ",
    "rule 8 ",
    "rule 9a ",
    "rule 9b ",
];

#[test]
fn cq_rules_hold_under_address_and_undefined_behavior_sanitizers() {
    assert_rules_hold("cq_rules.c", Checker::Sanitizers, "127.0.0.221:0", &RULES);
}

#[test]
fn cq_rules_hold_under_valgrind_memcheck() {
    assert_rules_hold("cq_rules.c", Checker::Valgrind, "127.0.0.222:0", &RULES);
}
