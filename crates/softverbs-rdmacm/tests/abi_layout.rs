//! Every `#[repr(C)]` mirror in `softverbs_rdmacm::abi` against the installed
//! `<rdma/rdma_cma.h>` (and the `verbs.h` / `sa.h` structs it uses): the size and
//! alignment of each struct, the offset and size of each field, and the values of the
//! enums and macros the library uses. A C program generated from the table is compiled with
//! `gcc` against the real headers; the Rust side is `size_of` / `align_of` / `offset_of!`.
//! Needs `gcc` and `librdmacm-dev`; a missing one is a failure, never a skip.

use softverbs_rdmacm::abi::*;
use std::collections::BTreeMap;
use std::mem::{align_of, offset_of, size_of};
use std::path::Path;
use std::process::Command;

const RDMA_CMA_H: &str = "/usr/include/rdma/rdma_cma.h";

struct Field {
    c: &'static str,
    offset: usize,
    size: usize,
}

struct Struct {
    c: &'static str,
    size: usize,
    align: usize,
    fields: Vec<Field>,
}

fn field_size<T, F>(_: impl Fn(*const T) -> *const F) -> usize {
    size_of::<F>()
}

macro_rules! layout {
    ($rty:ty, $cname:literal; $($rf:ident $(. $rsub:ident)* => $cf:literal),* $(,)?) => {
        Struct {
            c: $cname,
            size: size_of::<$rty>(),
            align: align_of::<$rty>(),
            fields: vec![$(Field {
                c: $cf,
                offset: offset_of!($rty, $rf $(. $rsub)*),
                // SAFETY: the closure is never called; it only names the field's type.
                size: field_size(|p: *const $rty| unsafe { &raw const (*p).$rf $(. $rsub)* }),
            }),*],
        }
    };
}

/// A mirror of only a prefix of a C struct: its fields are checked, not its size.
fn prefix(mut s: Struct) -> Struct {
    s.size = usize::MAX;
    s
}

fn mirrors() -> Vec<Struct> {
    vec![
        layout!(ibv_gid, "union ibv_gid"; raw => "raw", global.subnet_prefix => "global.subnet_prefix",
            global.interface_id => "global.interface_id"),
        layout!(ibv_global_route, "struct ibv_global_route"; dgid => "dgid", flow_label => "flow_label",
            sgid_index => "sgid_index", hop_limit => "hop_limit", traffic_class => "traffic_class"),
        layout!(ibv_ah_attr, "struct ibv_ah_attr"; grh => "grh", dlid => "dlid", sl => "sl",
            src_path_bits => "src_path_bits", static_rate => "static_rate", is_global => "is_global",
            port_num => "port_num"),
        layout!(ibv_qp_cap, "struct ibv_qp_cap"; max_send_wr => "max_send_wr", max_recv_wr => "max_recv_wr",
            max_send_sge => "max_send_sge", max_recv_sge => "max_recv_sge", max_inline_data => "max_inline_data"),
        layout!(ibv_qp_attr, "struct ibv_qp_attr"; qp_state => "qp_state", cur_qp_state => "cur_qp_state",
            path_mtu => "path_mtu", path_mig_state => "path_mig_state", qkey => "qkey", rq_psn => "rq_psn",
            sq_psn => "sq_psn", dest_qp_num => "dest_qp_num", qp_access_flags => "qp_access_flags",
            cap => "cap", ah_attr => "ah_attr", alt_ah_attr => "alt_ah_attr", pkey_index => "pkey_index",
            alt_pkey_index => "alt_pkey_index", en_sqd_async_notify => "en_sqd_async_notify",
            sq_draining => "sq_draining", max_rd_atomic => "max_rd_atomic",
            max_dest_rd_atomic => "max_dest_rd_atomic", min_rnr_timer => "min_rnr_timer",
            port_num => "port_num", timeout => "timeout", retry_cnt => "retry_cnt", rnr_retry => "rnr_retry",
            alt_port_num => "alt_port_num", alt_timeout => "alt_timeout", rate_limit => "rate_limit"),
        layout!(ibv_qp_init_attr, "struct ibv_qp_init_attr"; qp_context => "qp_context", send_cq => "send_cq",
            recv_cq => "recv_cq", srq => "srq", cap => "cap", qp_type => "qp_type", sq_sig_all => "sq_sig_all"),
        layout!(ibv_rx_hash_conf, "struct ibv_rx_hash_conf"; rx_hash_function => "rx_hash_function",
            rx_hash_key_len => "rx_hash_key_len", rx_hash_key => "rx_hash_key",
            rx_hash_fields_mask => "rx_hash_fields_mask"),
        layout!(ibv_qp_init_attr_ex, "struct ibv_qp_init_attr_ex"; qp_context => "qp_context",
            send_cq => "send_cq", recv_cq => "recv_cq", srq => "srq", cap => "cap", qp_type => "qp_type",
            sq_sig_all => "sq_sig_all", comp_mask => "comp_mask", pd => "pd", xrcd => "xrcd",
            create_flags => "create_flags", max_tso_header => "max_tso_header", rwq_ind_tbl => "rwq_ind_tbl",
            rx_hash_conf => "rx_hash_conf", source_qpn => "source_qpn", send_ops_flags => "send_ops_flags"),
        prefix(
            layout!(ibv_qp, "struct ibv_qp"; context => "context", qp_context => "qp_context", pd => "pd",
            send_cq => "send_cq", recv_cq => "recv_cq", srq => "srq", handle => "handle", qp_num => "qp_num",
            state => "state", qp_type => "qp_type"),
        ),
        prefix(layout!(ibv_pd, "struct ibv_pd"; context => "context", handle => "handle")),
        prefix(
            layout!(ibv_srq, "struct ibv_srq"; context => "context", srq_context => "srq_context", pd => "pd"),
        ),
        layout!(ibv_srq_attr, "struct ibv_srq_attr"; max_wr => "max_wr", max_sge => "max_sge",
            srq_limit => "srq_limit"),
        layout!(ibv_srq_init_attr_ex, "struct ibv_srq_init_attr_ex"; srq_context => "srq_context",
            attr => "attr", comp_mask => "comp_mask", srq_type => "srq_type", pd => "pd", xrcd => "xrcd",
            cq => "cq", tm_cap_max_num_tags => "tm_cap.max_num_tags", tm_cap_max_ops => "tm_cap.max_ops"),
        layout!(ibv_port_attr, "struct ibv_port_attr"; state => "state", max_mtu => "max_mtu",
            active_mtu => "active_mtu", gid_tbl_len => "gid_tbl_len", port_cap_flags => "port_cap_flags",
            max_msg_sz => "max_msg_sz", bad_pkey_cntr => "bad_pkey_cntr", qkey_viol_cntr => "qkey_viol_cntr",
            pkey_tbl_len => "pkey_tbl_len", lid => "lid", sm_lid => "sm_lid", lmc => "lmc",
            max_vl_num => "max_vl_num", sm_sl => "sm_sl", subnet_timeout => "subnet_timeout",
            init_type_reply => "init_type_reply", active_width => "active_width",
            active_speed => "active_speed", phys_state => "phys_state", link_layer => "link_layer",
            flags => "flags", port_cap_flags2 => "port_cap_flags2"),
        layout!(ibv_ece, "struct ibv_ece"; vendor_id => "vendor_id", options => "options", comp_mask => "comp_mask"),
        layout!(ibv_sa_path_rec, "struct ibv_sa_path_rec"; dgid => "dgid", sgid => "sgid", dlid => "dlid",
            slid => "slid", raw_traffic => "raw_traffic", flow_label => "flow_label", hop_limit => "hop_limit",
            traffic_class => "traffic_class", reversible => "reversible", numb_path => "numb_path",
            pkey => "pkey", sl => "sl", mtu_selector => "mtu_selector", mtu => "mtu",
            rate_selector => "rate_selector", rate => "rate",
            packet_life_time_selector => "packet_life_time_selector",
            packet_life_time => "packet_life_time", preference => "preference"),
        layout!(rdma_ib_addr, "struct rdma_ib_addr"; sgid => "sgid", dgid => "dgid", pkey => "pkey"),
        layout!(rdma_addr, "struct rdma_addr"; src_storage => "src_storage", dst_storage => "dst_storage",
            ibaddr => "addr.ibaddr"),
        layout!(rdma_route, "struct rdma_route"; addr => "addr", path_rec => "path_rec", num_paths => "num_paths"),
        layout!(rdma_event_channel, "struct rdma_event_channel"; fd => "fd"),
        layout!(rdma_cm_id, "struct rdma_cm_id"; verbs => "verbs", channel => "channel", context => "context",
            qp => "qp", route => "route", ps => "ps", port_num => "port_num", event => "event",
            send_cq_channel => "send_cq_channel", send_cq => "send_cq", recv_cq_channel => "recv_cq_channel",
            recv_cq => "recv_cq", srq => "srq", pd => "pd", qp_type => "qp_type"),
        layout!(rdma_conn_param, "struct rdma_conn_param"; private_data => "private_data",
            private_data_len => "private_data_len", responder_resources => "responder_resources",
            initiator_depth => "initiator_depth", flow_control => "flow_control", retry_count => "retry_count",
            rnr_retry_count => "rnr_retry_count", srq => "srq", qp_num => "qp_num"),
        layout!(rdma_ud_param, "struct rdma_ud_param"; private_data => "private_data",
            private_data_len => "private_data_len", ah_attr => "ah_attr", qp_num => "qp_num", qkey => "qkey"),
        layout!(rdma_cm_event, "struct rdma_cm_event"; id => "id", listen_id => "listen_id", event => "event",
            status => "status", param.conn => "param.conn", param.ud => "param.ud"),
        layout!(rdma_addrinfo, "struct rdma_addrinfo"; ai_flags => "ai_flags", ai_family => "ai_family",
            ai_qp_type => "ai_qp_type", ai_port_space => "ai_port_space", ai_src_len => "ai_src_len",
            ai_dst_len => "ai_dst_len", ai_src_addr => "ai_src_addr", ai_dst_addr => "ai_dst_addr",
            ai_src_canonname => "ai_src_canonname", ai_dst_canonname => "ai_dst_canonname",
            ai_route_len => "ai_route_len", ai_route => "ai_route", ai_connect_len => "ai_connect_len",
            ai_connect => "ai_connect", ai_next => "ai_next"),
        layout!(rdma_cm_join_mc_attr_ex, "struct rdma_cm_join_mc_attr_ex"; comp_mask => "comp_mask",
            join_flags => "join_flags", addr => "addr"),
    ]
}

fn constants() -> Vec<(&'static str, i64)> {
    use event::*;
    let mut v: Vec<(&'static str, i64)> = vec![
        ("RDMA_CM_EVENT_ADDR_RESOLVED", ADDR_RESOLVED.into()),
        ("RDMA_CM_EVENT_ADDR_ERROR", ADDR_ERROR.into()),
        ("RDMA_CM_EVENT_ROUTE_RESOLVED", ROUTE_RESOLVED.into()),
        ("RDMA_CM_EVENT_ROUTE_ERROR", ROUTE_ERROR.into()),
        ("RDMA_CM_EVENT_CONNECT_REQUEST", CONNECT_REQUEST.into()),
        ("RDMA_CM_EVENT_CONNECT_RESPONSE", CONNECT_RESPONSE.into()),
        ("RDMA_CM_EVENT_CONNECT_ERROR", CONNECT_ERROR.into()),
        ("RDMA_CM_EVENT_UNREACHABLE", UNREACHABLE.into()),
        ("RDMA_CM_EVENT_REJECTED", REJECTED.into()),
        ("RDMA_CM_EVENT_ESTABLISHED", ESTABLISHED.into()),
        ("RDMA_CM_EVENT_DISCONNECTED", DISCONNECTED.into()),
        ("RDMA_CM_EVENT_DEVICE_REMOVAL", DEVICE_REMOVAL.into()),
        ("RDMA_CM_EVENT_MULTICAST_JOIN", MULTICAST_JOIN.into()),
        ("RDMA_CM_EVENT_MULTICAST_ERROR", MULTICAST_ERROR.into()),
        ("RDMA_CM_EVENT_ADDR_CHANGE", ADDR_CHANGE.into()),
        ("RDMA_CM_EVENT_TIMEWAIT_EXIT", TIMEWAIT_EXIT.into()),
        ("RDMA_PS_IPOIB", RDMA_PS_IPOIB.into()),
        ("RDMA_PS_TCP", RDMA_PS_TCP.into()),
        ("RDMA_PS_UDP", RDMA_PS_UDP.into()),
        ("RDMA_PS_IB", RDMA_PS_IB.into()),
        ("RDMA_UDP_QKEY", RDMA_UDP_QKEY.into()),
        ("RDMA_MAX_RESP_RES", RDMA_MAX_RESP_RES.into()),
        ("RDMA_MAX_INIT_DEPTH", RDMA_MAX_INIT_DEPTH.into()),
        ("RAI_PASSIVE", RAI_PASSIVE.into()),
        ("RAI_NUMERICHOST", RAI_NUMERICHOST.into()),
        ("RAI_NOROUTE", RAI_NOROUTE.into()),
        ("RAI_FAMILY", RAI_FAMILY.into()),
        ("RDMA_OPTION_ID", RDMA_OPTION_ID.into()),
        ("RDMA_OPTION_IB", RDMA_OPTION_IB.into()),
        ("RDMA_OPTION_ID_TOS", RDMA_OPTION_ID_TOS.into()),
        ("RDMA_OPTION_ID_REUSEADDR", RDMA_OPTION_ID_REUSEADDR.into()),
        ("RDMA_OPTION_ID_AFONLY", RDMA_OPTION_ID_AFONLY.into()),
        (
            "RDMA_OPTION_ID_ACK_TIMEOUT",
            RDMA_OPTION_ID_ACK_TIMEOUT.into(),
        ),
        ("RDMA_OPTION_IB_PATH", RDMA_OPTION_IB_PATH.into()),
        ("IBV_QPT_RC", IBV_QPT_RC.into()),
        ("IBV_QPT_UC", IBV_QPT_UC.into()),
        ("IBV_QPT_UD", IBV_QPT_UD.into()),
        ("IBV_QPS_RESET", IBV_QPS_RESET.into()),
        ("IBV_QPS_INIT", IBV_QPS_INIT.into()),
        ("IBV_QPS_RTR", IBV_QPS_RTR.into()),
        ("IBV_QPS_RTS", IBV_QPS_RTS.into()),
        ("IBV_QPS_ERR", IBV_QPS_ERR.into()),
        ("IBV_ACCESS_LOCAL_WRITE", IBV_ACCESS_LOCAL_WRITE.into()),
        ("IBV_ACCESS_REMOTE_WRITE", IBV_ACCESS_REMOTE_WRITE.into()),
        ("IBV_ACCESS_REMOTE_READ", IBV_ACCESS_REMOTE_READ.into()),
        ("IBV_ACCESS_REMOTE_ATOMIC", IBV_ACCESS_REMOTE_ATOMIC.into()),
        ("IBV_QP_INIT_ATTR_PD", IBV_QP_INIT_ATTR_PD.into()),
        ("IBV_SRQ_INIT_ATTR_PD", IBV_SRQ_INIT_ATTR_PD.into()),
        ("IBV_SRQ_INIT_ATTR_CQ", IBV_SRQ_INIT_ATTR_CQ.into()),
        ("IBV_SRQT_XRC", IBV_SRQT_XRC.into()),
    ];
    use mask::*;
    v.extend([
        ("IBV_QP_STATE", STATE.into()),
        ("IBV_QP_ACCESS_FLAGS", ACCESS_FLAGS.into()),
        ("IBV_QP_PKEY_INDEX", PKEY_INDEX.into()),
        ("IBV_QP_PORT", PORT.into()),
        ("IBV_QP_QKEY", QKEY.into()),
        ("IBV_QP_AV", AV.into()),
        ("IBV_QP_PATH_MTU", PATH_MTU.into()),
        ("IBV_QP_TIMEOUT", TIMEOUT.into()),
        ("IBV_QP_RETRY_CNT", RETRY_CNT.into()),
        ("IBV_QP_RNR_RETRY", RNR_RETRY.into()),
        ("IBV_QP_RQ_PSN", RQ_PSN.into()),
        ("IBV_QP_MAX_QP_RD_ATOMIC", MAX_QP_RD_ATOMIC.into()),
        ("IBV_QP_MIN_RNR_TIMER", MIN_RNR_TIMER.into()),
        ("IBV_QP_SQ_PSN", SQ_PSN.into()),
        ("IBV_QP_MAX_DEST_RD_ATOMIC", MAX_DEST_RD_ATOMIC.into()),
        ("IBV_QP_DEST_QPN", DEST_QPN.into()),
    ]);
    v
}

fn measure(structs: &[Struct], constants: &[(&str, i64)]) -> BTreeMap<String, i64> {
    assert!(
        Path::new(RDMA_CMA_H).exists(),
        "{RDMA_CMA_H} is missing: install the Debian package librdmacm-dev. This test fails \
         rather than skips without it."
    );
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <stdalign.h>\n\
         #include <rdma/rdma_cma.h>\nint main(void) {\n",
    );
    for s in structs {
        c.push_str(&format!(
            "  printf(\"S|{0}|size %zu\\n\", sizeof({0}));\n  printf(\"S|{0}|align %zu\\n\", alignof({0}));\n",
            s.c
        ));
        for f in &s.fields {
            c.push_str(&format!(
                "  printf(\"F|{0}|{1}|offset %zu\\n\", offsetof({0}, {1}));\n  printf(\"F|{0}|{1}|size %zu\\n\", sizeof((({0} *)0)->{1}));\n",
                s.c, f.c
            ));
        }
    }
    for (name, _) in constants {
        c.push_str(&format!(
            "  printf(\"C|{name}|value %lld\\n\", (long long)({name}));\n"
        ));
    }
    c.push_str("  return 0;\n}\n");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("softverbs-rdmacm-abi-layout");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c).unwrap();
    let gcc = Command::new("gcc")
        .args(["-std=gnu11", "-Wall", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run gcc: install the Debian package gcc");
    assert!(
        gcc.status.success(),
        "gcc failed on the generated layout program ({}):\n{}",
        src.display(),
        String::from_utf8_lossy(&gcc.stderr)
    );
    let out = Command::new(&exe).output().expect("run the layout program");
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let (key, value) = line.rsplit_once(' ').expect("key value");
            (key.to_owned(), value.parse().expect("a number"))
        })
        .collect()
}

#[test]
fn every_field_of_every_mirror_matches_the_installed_rdma_cma_h() {
    let structs = mirrors();
    let constants = constants();
    let c = measure(&structs, &constants);
    let mut mismatches = Vec::new();
    let mut checked = 0;
    let mut check = |key: String, rust: i64| {
        let c_value = *c
            .get(&key)
            .unwrap_or_else(|| panic!("the C program printed no {key}"));
        checked += 1;
        if c_value != rust {
            mismatches.push(format!("{key}: C {c_value}, Rust {rust}"));
        }
    };
    for s in &structs {
        if s.size != usize::MAX {
            check(format!("S|{}|size", s.c), s.size as i64);
        }
        check(format!("S|{}|align", s.c), s.align as i64);
        for f in &s.fields {
            check(format!("F|{}|{}|offset", s.c, f.c), f.offset as i64);
            check(format!("F|{}|{}|size", s.c, f.c), f.size as i64);
        }
    }
    for (name, value) in &constants {
        check(format!("C|{name}|value"), *value);
    }
    assert!(
        mismatches.is_empty(),
        "layout mismatches:\n{}",
        mismatches.join("\n")
    );
    assert!(checked > 400, "only {checked} values compared");
}
