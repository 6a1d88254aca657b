//! What programs written for kernel rxe assume about a port (issue #17), pinned by our own
//! C program (`tests/c/gid_table.c`): the GID table laid out as rxe lays out the table of
//! an interface holding the device's IPv4 address (index 0 the IPv6 link-local GID, index
//! 1 `::ffff:a.b.c.d`; `gid_tbl_len` 2), `ibv_query_gid(3)`, `ibv_query_gid_ex(3)`,
//! `ibv_query_gid_table(3)` and `ibv_query_gid_type` agreeing on it, every entry's
//! `ndev_ifindex` the interface holding the address (`lo`, so `if_indextoname(3)` works),
//! `ibv_get_device_name(3)` reading the `struct ibv_device` it is given as rdma-core does,
//! and RC traffic through GID index 0 on one side and 1 on the other.
//!
//! As the other rule programs, it runs under AddressSanitizer/UndefinedBehaviorSanitizer
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
fn the_port_is_what_rxe_programs_expect_under_address_and_undefined_behavior_sanitizers() {
    assert_rules_hold("gid_table.c", Checker::Sanitizers, "127.0.0.237:0", &RULES);
}

#[test]
fn the_port_is_what_rxe_programs_expect_under_valgrind_memcheck() {
    assert_rules_hold("gid_table.c", Checker::Valgrind, "127.0.0.238:0", &RULES);
}
