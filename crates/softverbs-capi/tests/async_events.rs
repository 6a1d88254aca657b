//! Asynchronous events and their acknowledgement on the drop-in, pinned by our own C
//! program (`tests/c/async_events.c`) through the real functions. `ibv_get_async_event(3)`:
//! "All async events that ibv_get_async_event() returns must be acknowledged using
//! ibv_ack_async_event(). To avoid races, destroying an object (CQ, SRQ or QP) will wait
//! for all affiliated events for the object to be acknowledged." So: `IBV_EVENT_QP_ACCESS_ERR`,
//! `IBV_EVENT_SRQ_LIMIT_REACHED` and `IBV_EVENT_CQ_ERR` name their object; the destroy of
//! a QP, an SRQ or a CQ with a delivered, unacknowledged event waits until it is
//! acknowledged; the acknowledgement counts in the object's `events_completed`; and an
//! event of an object destroyed before the event was read is never delivered (the kernel
//! drops such events too), so no event names freed memory.
//!
//! As `cq_rules.rs` does, it runs twice, under AddressSanitizer/UndefinedBehaviorSanitizer
//! and under valgrind memcheck (`tests/common/rules.rs`). Each run must exit 0, print every
//! rule's line and the final `ok` line, and report nothing. `gcc`, `libibverbs-dev` and
//! `valgrind` are required; a missing one is a failure naming its Debian package.

mod common;

use common::rules::{assert_rules_hold, Checker};

/// The lines the program prints, one per rule, in order.
const RULES: [&str; 7] = [
    "rule setup: ",
    "rule 1: ",
    "rule 1b: ",
    "rule 2: ",
    "rule 3: ",
    "rule 4: ",
    "rule teardown: ",
];

#[test]
fn destroys_wait_for_async_event_acks_under_address_and_undefined_behavior_sanitizers() {
    assert_rules_hold(
        "async_events.c",
        Checker::Sanitizers,
        "127.0.0.227:0",
        &RULES,
    );
}

#[test]
fn destroys_wait_for_async_event_acks_under_valgrind_memcheck() {
    assert_rules_hold("async_events.c", Checker::Valgrind, "127.0.0.228:0", &RULES);
}
