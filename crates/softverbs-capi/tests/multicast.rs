//! UD multicast on the drop-in, pinned by our own C program (`tests/c/multicast.c`), each
//! rule citing its man page: `ibv_query_device(3)` reports the multicast limits;
//! `ibv_attach_mcast(3)` refuses an RC QP, a unicast and a NULL GID (`EINVAL`); a UD send to
//! QPN 0xFFFFFF reaches every attached QP with a matching Q_Key once, the group in its GRH
//! area, and no other; `ibv_destroy_qp(3)` of an attached QP is `EBUSY`, and a detached QP
//! leaves the group.
//!
//! Under AddressSanitizer/UndefinedBehaviorSanitizer and under valgrind memcheck
//! (`tests/common/rules.rs`).

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
fn multicast_rules_hold_under_address_and_undefined_behavior_sanitizers() {
    assert_rules_hold("multicast.c", Checker::Sanitizers, "127.0.0.178:0", &RULES);
}

#[test]
fn multicast_rules_hold_under_valgrind_memcheck() {
    assert_rules_hold("multicast.c", Checker::Valgrind, "127.0.0.179:0", &RULES);
}
