//! On-demand paging on the drop-in, pinned by our own C program (`tests/c/odp.c`):
//! `ibv_query_device_ex(3)` reports `odp_caps` (explicit and implicit ODP; RC, UC and UD
//! operations); `ibv_reg_mr(3)` with `IBV_ACCESS_ON_DEMAND` registers a range that is
//! `PROT_NONE` or not mapped at all (without it: `EFAULT`), and memory mapped afterwards
//! is reached by a peer's RDMA WRITE; a page still unmapped when the access comes ends the
//! WR with `IBV_WC_REM_ACCESS_ERR` (the peer's write) or `IBV_WC_LOC_PROT_ERR` (a local
//! SGE), as rxe's ODP path does, and the program lives; the implicit region (NULL,
//! `SIZE_MAX`) only with `ON_DEMAND` and iova 0 (`EINVAL`); `ibv_advise_mr(3)` returns 0
//! for prefetches of ODP ranges and the kernel's `EINVAL`, `EOPNOTSUPP`, `ENOENT`,
//! `EPERM`, `EFAULT` for the rest.
//!
//! Under AddressSanitizer/UndefinedBehaviorSanitizer, and under valgrind memcheck, which
//! leaves out rule 4 and the prefetch of an unmapped page (memcheck reports the device's
//! access to an unmapped page itself).

mod common;

use common::rules::{assert_rules_hold, Checker};

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
fn on_demand_paging_rules_hold_under_address_and_undefined_behavior_sanitizers() {
    assert_rules_hold("odp.c", Checker::Sanitizers, "127.0.0.176:0", &RULES);
}

#[test]
fn on_demand_paging_rules_hold_under_valgrind_memcheck() {
    let rules: Vec<&str> = RULES.into_iter().filter(|r| *r != "rule 4: ").collect();
    assert_rules_hold("odp.c", Checker::Valgrind, "127.0.0.177:0", &rules);
}
