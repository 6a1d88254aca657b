//! Attribute checks on the drop-in, pinned by our own C program (`tests/c/attributes.c`):
//! every index and enum the kernel checks is refused with the kernel's errno and a refused
//! `ibv_modify_qp` changes nothing (`ibv_modify_qp(3)`, `ibv_create_qp(3)`,
//! `ibv_create_ah(3)`): an undefined `qp_type` is `EINVAL` and an unoffered one
//! `EOPNOTSUPP`; `sgid_index` outside the GID table, `port_num` 2, `pkey_index` 1, an
//! undefined `path_mtu` and `max_dest_rd_atomic` above `max_qp_rd_atom` are `EINVAL`, in
//! `ibv_modify_qp` and (for the address) in `ibv_create_ah`; `ibv_dealloc_pd` is `EBUSY`
//! while a memory region, QP, SRQ or address handle is in the PD. The rules live in the engine
//! and the device, so the safe API meets the same ones (`crates/softverbs/tests/errors.rs`).
//!
//! As the other rule programs, it runs under AddressSanitizer/UndefinedBehaviorSanitizer
//! and under valgrind memcheck (`tests/common/rules.rs`).

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
fn bad_attributes_get_the_kernels_errno_under_address_and_undefined_behavior_sanitizers() {
    assert_rules_hold("attributes.c", Checker::Sanitizers, "127.0.0.225:0", &RULES);
}

#[test]
fn bad_attributes_get_the_kernels_errno_under_valgrind_memcheck() {
    assert_rules_hold("attributes.c", Checker::Valgrind, "127.0.0.226:0", &RULES);
}
