//! Protection domains on the drop-in, pinned by our own C program
//! (`tests/c/protection.c`) through the real inline verbs functions: a QP reaches only
//! memory regions of its own PD (IBTA vol. 1 ch. 10, protection domains: a QP may access a
//! memory region only if the PD assigned to the QP matches the region's; rxe refuses such
//! a key in its MR lookup). In one process with two PDs and loopback RC QP pairs, an RDMA
//! WRITE naming an rkey of the other PD completes with `IBV_WC_REM_ACCESS_ERR` (by
//! `ibv_post_send` and by `ibv_wr_rdma_write`) and leaves that region unchanged, a SEND
//! whose lkey is of the other PD completes with `IBV_WC_LOC_PROT_ERR` and sends nothing,
//! and the same operations within the QP's PD work, for QPs made by `ibv_create_qp` and
//! by `ibv_create_qp_ex` alike; and a UD send whose address handle is of the other PD is
//! refused by `ibv_post_send` with `EINVAL` (IBTA 10.2.3), nothing sent.
//!
//! As `cq_rules.rs` does, it runs twice, under AddressSanitizer/UndefinedBehaviorSanitizer
//! and under valgrind memcheck (`tests/common/rules.rs`). Each run must exit 0, print every
//! rule's line and the final `ok` line, and report nothing. `gcc`, `libibverbs-dev` and
//! `valgrind` are required; a missing one is a failure naming its Debian package.

mod common;

use common::rules::{assert_rules_hold, Checker};

/// The lines the program prints, one per rule, in order.
const RULES: [&str; 8] = [
    "rule setup: ",
    "rule 1: ",
    "rule 2: ",
    "rule 3: ",
    "rule 4: ",
    "rule 5: ",
    "rule 6: ",
    "rule teardown: ",
];

#[test]
fn keys_of_another_pd_are_refused_under_address_and_undefined_behavior_sanitizers() {
    assert_rules_hold("protection.c", Checker::Sanitizers, "127.0.0.223:0", &RULES);
}

#[test]
fn keys_of_another_pd_are_refused_under_valgrind_memcheck() {
    assert_rules_hold("protection.c", Checker::Valgrind, "127.0.0.224:0", &RULES);
}
