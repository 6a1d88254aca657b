//! The dynamic symbol table of the built library: every symbol a target program or one of
//! its rdma libraries imports (here: every default-version
//! public symbol of Debian's rdma-core 44 libibverbs, plus the 62 `IBVERBS_PRIVATE_34`
//! names libmlx5/libefa/ibv_devinfo import) at its version node, softverbs' seven private
//! functions (`softverbs_gsi_*` at `SOFTVERBS_PRIVATE_1.0` and `_1.1`,
//! `softverbs_app_waits` at `_1.2`: for its librdmacm, found by `dlvsym`), nothing else
//! exported, the 16 version nodes defined, and the SONAME `libibverbs.so.1`.
//!
//! Reads the library with `objdump` (Debian package binutils); a missing tool is a
//! failure, never a skip.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

/// (symbol, version node): 75 public + 62 provider-private + 3 softverbs-private.
const EXPECTED: [(&str, &str); 144] = [
    ("ibv_copy_path_rec_from_kern", "IBVERBS_1.0"),
    ("ibv_copy_path_rec_to_kern", "IBVERBS_1.0"),
    ("ibv_copy_qp_attr_from_kern", "IBVERBS_1.0"),
    ("ibv_create_comp_channel", "IBVERBS_1.0"),
    ("ibv_destroy_comp_channel", "IBVERBS_1.0"),
    ("ibv_get_sysfs_path", "IBVERBS_1.0"),
    ("ibv_rate_to_mult", "IBVERBS_1.0"),
    ("ibv_read_sysfs_file", "IBVERBS_1.0"),
    ("mult_to_ibv_rate", "IBVERBS_1.0"),
    ("ibv_ack_async_event", "IBVERBS_1.1"),
    ("ibv_ack_cq_events", "IBVERBS_1.1"),
    ("ibv_alloc_pd", "IBVERBS_1.1"),
    ("ibv_attach_mcast", "IBVERBS_1.1"),
    ("ibv_close_device", "IBVERBS_1.1"),
    ("ibv_copy_ah_attr_from_kern", "IBVERBS_1.1"),
    ("ibv_create_ah", "IBVERBS_1.1"),
    ("ibv_create_ah_from_wc", "IBVERBS_1.1"),
    ("ibv_create_cq", "IBVERBS_1.1"),
    ("ibv_create_qp", "IBVERBS_1.1"),
    ("ibv_create_srq", "IBVERBS_1.1"),
    ("ibv_dealloc_pd", "IBVERBS_1.1"),
    ("ibv_dereg_mr", "IBVERBS_1.1"),
    ("ibv_destroy_ah", "IBVERBS_1.1"),
    ("ibv_destroy_cq", "IBVERBS_1.1"),
    ("ibv_destroy_qp", "IBVERBS_1.1"),
    ("ibv_destroy_srq", "IBVERBS_1.1"),
    ("ibv_detach_mcast", "IBVERBS_1.1"),
    ("ibv_dofork_range", "IBVERBS_1.1"),
    ("ibv_dontfork_range", "IBVERBS_1.1"),
    ("ibv_event_type_str", "IBVERBS_1.1"),
    ("ibv_fork_init", "IBVERBS_1.1"),
    ("ibv_free_device_list", "IBVERBS_1.1"),
    ("ibv_get_async_event", "IBVERBS_1.1"),
    ("ibv_get_cq_event", "IBVERBS_1.1"),
    ("ibv_get_device_guid", "IBVERBS_1.1"),
    ("ibv_get_device_list", "IBVERBS_1.1"),
    ("ibv_get_device_name", "IBVERBS_1.1"),
    ("ibv_init_ah_from_wc", "IBVERBS_1.1"),
    ("ibv_modify_qp", "IBVERBS_1.1"),
    ("ibv_modify_srq", "IBVERBS_1.1"),
    ("ibv_node_type_str", "IBVERBS_1.1"),
    ("ibv_open_device", "IBVERBS_1.1"),
    ("ibv_port_state_str", "IBVERBS_1.1"),
    ("ibv_query_device", "IBVERBS_1.1"),
    ("ibv_query_gid", "IBVERBS_1.1"),
    ("ibv_query_pkey", "IBVERBS_1.1"),
    ("ibv_query_port", "IBVERBS_1.1"),
    ("ibv_query_qp", "IBVERBS_1.1"),
    ("ibv_query_srq", "IBVERBS_1.1"),
    ("ibv_rate_to_mbps", "IBVERBS_1.1"),
    ("ibv_reg_mr", "IBVERBS_1.1"),
    ("ibv_rereg_mr", "IBVERBS_1.1"),
    ("ibv_resize_cq", "IBVERBS_1.1"),
    ("ibv_resolve_eth_l2_from_gid", "IBVERBS_1.1"),
    ("ibv_wc_status_str", "IBVERBS_1.1"),
    ("mbps_to_ibv_rate", "IBVERBS_1.1"),
    ("ibv_get_pkey_index", "IBVERBS_1.5"),
    ("ibv_qp_to_qp_ex", "IBVERBS_1.6"),
    ("ibv_reg_mr_iova", "IBVERBS_1.7"),
    ("ibv_reg_mr_iova2", "IBVERBS_1.8"),
    ("ibv_get_device_index", "IBVERBS_1.9"),
    ("ibv_import_device", "IBVERBS_1.10"),
    ("ibv_import_mr", "IBVERBS_1.10"),
    ("ibv_import_pd", "IBVERBS_1.10"),
    ("ibv_query_ece", "IBVERBS_1.10"),
    ("ibv_set_ece", "IBVERBS_1.10"),
    ("ibv_unimport_mr", "IBVERBS_1.10"),
    ("ibv_unimport_pd", "IBVERBS_1.10"),
    ("_ibv_query_gid_ex", "IBVERBS_1.11"),
    ("_ibv_query_gid_table", "IBVERBS_1.11"),
    ("ibv_reg_dmabuf_mr", "IBVERBS_1.12"),
    ("ibv_import_dm", "IBVERBS_1.13"),
    ("ibv_is_fork_initialized", "IBVERBS_1.13"),
    ("ibv_unimport_dm", "IBVERBS_1.13"),
    ("ibv_query_qp_data_in_order", "IBVERBS_1.14"),
    ("__verbs_log", "IBVERBS_PRIVATE_34"),
    ("_verbs_init_and_alloc_context", "IBVERBS_PRIVATE_34"),
    ("execute_ioctl", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_advise_mr", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_alloc_dm", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_alloc_mw", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_alloc_pd", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_attach_mcast", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_close_xrcd", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_ah", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_counters", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_cq_ex", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_flow", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_flow_action_esp", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_qp_ex", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_qp_ex2", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_rwq_ind_table", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_srq", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_srq_ex", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_wq", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_dealloc_mw", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_dealloc_pd", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_dereg_mr", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_destroy_ah", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_destroy_counters", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_destroy_cq", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_destroy_flow", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_destroy_flow_action", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_destroy_qp", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_destroy_rwq_ind_table", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_destroy_srq", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_destroy_wq", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_detach_mcast", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_free_dm", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_get_context", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_modify_cq", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_modify_flow_action_esp", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_modify_qp", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_modify_qp_ex", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_modify_srq", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_modify_wq", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_open_qp", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_open_xrcd", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_query_context", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_query_device_any", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_query_mr", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_query_port", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_query_qp", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_query_srq", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_read_counters", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_reg_dm_mr", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_reg_dmabuf_mr", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_reg_mr", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_rereg_mr", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_resize_cq", "IBVERBS_PRIVATE_34"),
    ("ibv_query_gid_type", "IBVERBS_PRIVATE_34"),
    ("verbs_allow_disassociate_destroy", "IBVERBS_PRIVATE_34"),
    ("verbs_init_cq", "IBVERBS_PRIVATE_34"),
    ("verbs_open_device", "IBVERBS_PRIVATE_34"),
    ("verbs_register_driver_34", "IBVERBS_PRIVATE_34"),
    ("verbs_set_ops", "IBVERBS_PRIVATE_34"),
    ("verbs_uninit_context", "IBVERBS_PRIVATE_34"),
    ("softverbs_gsi_send", "SOFTVERBS_PRIVATE_1.0"),
    ("softverbs_gsi_recv", "SOFTVERBS_PRIVATE_1.0"),
    ("softverbs_gsi_fd", "SOFTVERBS_PRIVATE_1.0"),
    ("softverbs_gsi_share", "SOFTVERBS_PRIVATE_1.1"),
    ("softverbs_gsi_listen", "SOFTVERBS_PRIVATE_1.1"),
    ("softverbs_gsi_unlisten", "SOFTVERBS_PRIVATE_1.1"),
    ("softverbs_app_waits", "SOFTVERBS_PRIVATE_1.2"),
];

const NODES: [&str; 16] = [
    "IBVERBS_1.0",
    "IBVERBS_1.1",
    "IBVERBS_1.5",
    "IBVERBS_1.6",
    "IBVERBS_1.7",
    "IBVERBS_1.8",
    "IBVERBS_1.9",
    "IBVERBS_1.10",
    "IBVERBS_1.11",
    "IBVERBS_1.12",
    "IBVERBS_1.13",
    "IBVERBS_1.14",
    "IBVERBS_PRIVATE_34",
    "SOFTVERBS_PRIVATE_1.0",
    "SOFTVERBS_PRIVATE_1.1",
    "SOFTVERBS_PRIVATE_1.2",
];

fn objdump(flag: &str) -> String {
    let lib = common::cdylib();
    let out = Command::new("objdump")
        .arg(flag)
        .arg(&lib)
        .output()
        .expect("run objdump: install the Debian package binutils");
    assert!(
        out.status.success(),
        "objdump {flag} {} failed",
        lib.display()
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Defined dynamic symbols: name -> (version, type flag `F`/`O`).
fn defined_symbols() -> BTreeMap<String, (String, String)> {
    let mut map = BTreeMap::new();
    for line in objdump("-T").lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        // address flags... section size version name
        if parts.len() < 5 || !parts[0].chars().all(|c| c.is_ascii_hexdigit()) {
            continue;
        }
        let Some(section_at) = parts
            .iter()
            .position(|p| p.starts_with('.') || *p == "*UND*" || *p == "*ABS*")
        else {
            continue;
        };
        if parts[section_at] == "*UND*" || parts[section_at] == "*ABS*" {
            continue;
        }
        let kind = parts[1..section_at].join("");
        let name = parts[parts.len() - 1].to_owned();
        let version = parts[parts.len() - 2]
            .trim_matches(|c| c == '(' || c == ')')
            .to_owned();
        map.insert(name, (version, kind));
    }
    map
}

#[test]
fn every_expected_symbol_is_exported_at_its_version_and_nothing_else_is() {
    let symbols = defined_symbols();
    let mut problems = Vec::new();
    for (name, node) in EXPECTED {
        match symbols.get(name) {
            None => problems.push(format!("{name}@@{node} is not exported")),
            Some((version, _)) if version != node => {
                problems.push(format!("{name} is at {version}, expected {node}"))
            }
            Some(_) => {}
        }
    }
    for (name, (version, _)) in &symbols {
        if !EXPECTED.iter().any(|(n, _)| n == name) {
            problems.push(format!("unexpected export {name} at {version}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn verbs_allow_disassociate_destroy_is_a_one_byte_data_object() {
    // libmlx5 reads it through the GOT (a data symbol, not a function).
    let line = objdump("-T")
        .lines()
        .find(|l| l.ends_with(" verbs_allow_disassociate_destroy"))
        .expect("exported")
        .to_owned();
    let parts: Vec<&str> = line.split_whitespace().collect();
    assert!(line.contains(" DO "), "not a data object: {line}");
    let size_at = parts.len() - 3;
    assert_eq!(
        u64::from_str_radix(parts[size_at], 16).unwrap(),
        1,
        "{line}"
    );
}

#[test]
fn every_version_node_is_defined_and_the_soname_is_libibverbs_so_1() {
    let private = objdump("-p");
    let definitions = private
        .split("Version definitions:")
        .nth(1)
        .expect("a version definition section");
    for node in NODES {
        assert!(
            definitions
                .lines()
                .any(|l| l.split_whitespace().last() == Some(node)),
            "version node {node} is not defined"
        );
    }
    assert!(
        private
            .lines()
            .any(|l| l.trim().starts_with("SONAME") && l.trim().ends_with("libibverbs.so.1")),
        "SONAME is not libibverbs.so.1"
    );
}
