//! Every `#[repr(C)]` mirror in `softverbs_capi::abi` against the installed
//! `<infiniband/verbs.h>`: the size and alignment of each struct and the offset and size of
//! each of its fields (nested anonymous members by their C path), plus the enum values the
//! library reports.
//!
//! A C program generated from the table below is compiled with `gcc` against the real
//! header and prints what the C compiler sees; the Rust side is `size_of` / `align_of` /
//! `offset_of!`. Needs `gcc` and `libibverbs-dev` (the project's test script installs
//! them); a missing header or compiler is a failure, never a skip.

use softverbs_capi::abi::*;
use std::collections::BTreeMap;
use std::mem::{align_of, offset_of, size_of};
use std::path::Path;
use std::process::Command;

const VERBS_H: &str = "/usr/include/infiniband/verbs.h";

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

/// The size of the field a (never called) projection closure reaches.
fn field_size<T, F>(_: impl Fn(*const T) -> *const F) -> usize {
    size_of::<F>()
}

/// `layout!(RustType, "struct c_name"; rust.path => "c.path", ...)`.
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

fn mirrors() -> Vec<Struct> {
    vec![
        layout!(_ibv_device_ops, "struct _ibv_device_ops"; _dummy1 => "_dummy1", _dummy2 => "_dummy2"),
        layout!(ibv_device, "struct ibv_device";
            _ops => "_ops", node_type => "node_type", transport_type => "transport_type",
            name => "name", dev_name => "dev_name", dev_path => "dev_path", ibdev_path => "ibdev_path"),
        layout!(ibv_context_ops, "struct ibv_context_ops";
            _compat_query_device => "_compat_query_device", _compat_query_port => "_compat_query_port",
            _compat_alloc_pd => "_compat_alloc_pd", _compat_dealloc_pd => "_compat_dealloc_pd",
            _compat_reg_mr => "_compat_reg_mr", _compat_rereg_mr => "_compat_rereg_mr",
            _compat_dereg_mr => "_compat_dereg_mr", alloc_mw => "alloc_mw", bind_mw => "bind_mw",
            dealloc_mw => "dealloc_mw", _compat_create_cq => "_compat_create_cq", poll_cq => "poll_cq",
            req_notify_cq => "req_notify_cq", _compat_cq_event => "_compat_cq_event",
            _compat_resize_cq => "_compat_resize_cq", _compat_destroy_cq => "_compat_destroy_cq",
            _compat_create_srq => "_compat_create_srq", _compat_modify_srq => "_compat_modify_srq",
            _compat_query_srq => "_compat_query_srq", _compat_destroy_srq => "_compat_destroy_srq",
            post_srq_recv => "post_srq_recv", _compat_create_qp => "_compat_create_qp",
            _compat_query_qp => "_compat_query_qp", _compat_modify_qp => "_compat_modify_qp",
            _compat_destroy_qp => "_compat_destroy_qp", post_send => "post_send", post_recv => "post_recv",
            _compat_create_ah => "_compat_create_ah", _compat_destroy_ah => "_compat_destroy_ah",
            _compat_attach_mcast => "_compat_attach_mcast", _compat_detach_mcast => "_compat_detach_mcast",
            _compat_async_event => "_compat_async_event"),
        layout!(ibv_context, "struct ibv_context";
            device => "device", ops => "ops", cmd_fd => "cmd_fd", async_fd => "async_fd",
            num_comp_vectors => "num_comp_vectors", mutex => "mutex", abi_compat => "abi_compat"),
        layout!(verbs_context, "struct verbs_context";
            query_port => "query_port", advise_mr => "advise_mr", alloc_null_mr => "alloc_null_mr",
            read_counters => "read_counters", attach_counters_point_flow => "attach_counters_point_flow",
            create_counters => "create_counters", destroy_counters => "destroy_counters",
            reg_dm_mr => "reg_dm_mr", alloc_dm => "alloc_dm", free_dm => "free_dm",
            modify_flow_action_esp => "modify_flow_action_esp", destroy_flow_action => "destroy_flow_action",
            create_flow_action_esp => "create_flow_action_esp", modify_qp_rate_limit => "modify_qp_rate_limit",
            alloc_parent_domain => "alloc_parent_domain", dealloc_td => "dealloc_td", alloc_td => "alloc_td",
            modify_cq => "modify_cq", post_srq_ops => "post_srq_ops",
            destroy_rwq_ind_table => "destroy_rwq_ind_table", create_rwq_ind_table => "create_rwq_ind_table",
            destroy_wq => "destroy_wq", modify_wq => "modify_wq", create_wq => "create_wq",
            query_rt_values => "query_rt_values", create_cq_ex => "create_cq_ex", priv_ => "priv",
            query_device_ex => "query_device_ex", ibv_destroy_flow => "ibv_destroy_flow",
            ABI_placeholder2 => "ABI_placeholder2", ibv_create_flow => "ibv_create_flow",
            ABI_placeholder1 => "ABI_placeholder1", open_qp => "open_qp", create_qp_ex => "create_qp_ex",
            get_srq_num => "get_srq_num", create_srq_ex => "create_srq_ex", open_xrcd => "open_xrcd",
            close_xrcd => "close_xrcd", _ABI_placeholder3 => "_ABI_placeholder3", sz => "sz",
            context => "context"),
        layout!(ibv_query_device_ex_input, "struct ibv_query_device_ex_input"; comp_mask => "comp_mask"),
        layout!(ibv_device_attr, "struct ibv_device_attr";
            fw_ver => "fw_ver", node_guid => "node_guid", sys_image_guid => "sys_image_guid",
            max_mr_size => "max_mr_size", page_size_cap => "page_size_cap", vendor_id => "vendor_id",
            vendor_part_id => "vendor_part_id", hw_ver => "hw_ver", max_qp => "max_qp",
            max_qp_wr => "max_qp_wr", device_cap_flags => "device_cap_flags", max_sge => "max_sge",
            max_sge_rd => "max_sge_rd", max_cq => "max_cq", max_cqe => "max_cqe", max_mr => "max_mr",
            max_pd => "max_pd", max_qp_rd_atom => "max_qp_rd_atom", max_ee_rd_atom => "max_ee_rd_atom",
            max_res_rd_atom => "max_res_rd_atom", max_qp_init_rd_atom => "max_qp_init_rd_atom",
            max_ee_init_rd_atom => "max_ee_init_rd_atom", atomic_cap => "atomic_cap", max_ee => "max_ee",
            max_rdd => "max_rdd", max_mw => "max_mw", max_raw_ipv6_qp => "max_raw_ipv6_qp",
            max_raw_ethy_qp => "max_raw_ethy_qp", max_mcast_grp => "max_mcast_grp",
            max_mcast_qp_attach => "max_mcast_qp_attach",
            max_total_mcast_qp_attach => "max_total_mcast_qp_attach", max_ah => "max_ah",
            max_fmr => "max_fmr", max_map_per_fmr => "max_map_per_fmr", max_srq => "max_srq",
            max_srq_wr => "max_srq_wr", max_srq_sge => "max_srq_sge", max_pkeys => "max_pkeys",
            local_ca_ack_delay => "local_ca_ack_delay", phys_port_cnt => "phys_port_cnt"),
        layout!(ibv_odp_caps, "struct ibv_odp_caps";
            general_caps => "general_caps", per_transport_caps => "per_transport_caps",
            per_transport_caps.rc_odp_caps => "per_transport_caps.rc_odp_caps",
            per_transport_caps.uc_odp_caps => "per_transport_caps.uc_odp_caps",
            per_transport_caps.ud_odp_caps => "per_transport_caps.ud_odp_caps"),
        layout!(ibv_tso_caps, "struct ibv_tso_caps"; max_tso => "max_tso", supported_qpts => "supported_qpts"),
        layout!(ibv_rss_caps, "struct ibv_rss_caps";
            supported_qpts => "supported_qpts", max_rwq_indirection_tables => "max_rwq_indirection_tables",
            max_rwq_indirection_table_size => "max_rwq_indirection_table_size",
            rx_hash_fields_mask => "rx_hash_fields_mask", rx_hash_function => "rx_hash_function"),
        layout!(ibv_packet_pacing_caps, "struct ibv_packet_pacing_caps";
            qp_rate_limit_min => "qp_rate_limit_min", qp_rate_limit_max => "qp_rate_limit_max",
            supported_qpts => "supported_qpts"),
        layout!(ibv_tm_caps, "struct ibv_tm_caps";
            max_rndv_hdr_size => "max_rndv_hdr_size", max_num_tags => "max_num_tags", flags => "flags",
            max_ops => "max_ops", max_sge => "max_sge"),
        layout!(ibv_cq_moderation_caps, "struct ibv_cq_moderation_caps";
            max_cq_count => "max_cq_count", max_cq_period => "max_cq_period"),
        layout!(ibv_pci_atomic_caps, "struct ibv_pci_atomic_caps";
            fetch_add => "fetch_add", swap => "swap", compare_swap => "compare_swap"),
        layout!(ibv_device_attr_ex, "struct ibv_device_attr_ex";
            orig_attr => "orig_attr", comp_mask => "comp_mask", odp_caps => "odp_caps",
            completion_timestamp_mask => "completion_timestamp_mask", hca_core_clock => "hca_core_clock",
            device_cap_flags_ex => "device_cap_flags_ex", tso_caps => "tso_caps", rss_caps => "rss_caps",
            max_wq_type_rq => "max_wq_type_rq", packet_pacing_caps => "packet_pacing_caps",
            raw_packet_caps => "raw_packet_caps", tm_caps => "tm_caps", cq_mod_caps => "cq_mod_caps",
            max_dm_size => "max_dm_size", pci_atomic_caps => "pci_atomic_caps",
            xrc_odp_caps => "xrc_odp_caps", phys_port_cnt_ex => "phys_port_cnt_ex"),
        layout!(ibv_port_attr, "struct ibv_port_attr";
            state => "state", max_mtu => "max_mtu", active_mtu => "active_mtu", gid_tbl_len => "gid_tbl_len",
            port_cap_flags => "port_cap_flags", max_msg_sz => "max_msg_sz", bad_pkey_cntr => "bad_pkey_cntr",
            qkey_viol_cntr => "qkey_viol_cntr", pkey_tbl_len => "pkey_tbl_len", lid => "lid",
            sm_lid => "sm_lid", lmc => "lmc", max_vl_num => "max_vl_num", sm_sl => "sm_sl",
            subnet_timeout => "subnet_timeout", init_type_reply => "init_type_reply",
            active_width => "active_width", active_speed => "active_speed", phys_state => "phys_state",
            link_layer => "link_layer", flags => "flags", port_cap_flags2 => "port_cap_flags2"),
        layout!(ibv_gid, "union ibv_gid";
            raw => "raw", global => "global", global.subnet_prefix => "global.subnet_prefix",
            global.interface_id => "global.interface_id"),
        layout!(ibv_gid_entry, "struct ibv_gid_entry";
            gid => "gid", gid_index => "gid_index", port_num => "port_num", gid_type => "gid_type",
            ndev_ifindex => "ndev_ifindex"),
        layout!(ibv_values_ex, "struct ibv_values_ex"; comp_mask => "comp_mask", raw_clock => "raw_clock"),
        layout!(ibv_pd, "struct ibv_pd"; context => "context", handle => "handle"),
        layout!(ibv_mr, "struct ibv_mr";
            context => "context", pd => "pd", addr => "addr", length => "length", handle => "handle",
            lkey => "lkey", rkey => "rkey"),
        layout!(ibv_mw, "struct ibv_mw";
            context => "context", pd => "pd", rkey => "rkey", handle => "handle", type_ => "type"),
        layout!(ibv_mw_bind_info, "struct ibv_mw_bind_info";
            mr => "mr", addr => "addr", length => "length", mw_access_flags => "mw_access_flags"),
        layout!(ibv_mw_bind, "struct ibv_mw_bind";
            wr_id => "wr_id", send_flags => "send_flags", bind_info => "bind_info"),
        layout!(ibv_global_route, "struct ibv_global_route";
            dgid => "dgid", flow_label => "flow_label", sgid_index => "sgid_index",
            hop_limit => "hop_limit", traffic_class => "traffic_class"),
        layout!(ibv_grh, "struct ibv_grh";
            version_tclass_flow => "version_tclass_flow", paylen => "paylen", next_hdr => "next_hdr",
            hop_limit => "hop_limit", sgid => "sgid", dgid => "dgid"),
        layout!(ibv_ah_attr, "struct ibv_ah_attr";
            grh => "grh", dlid => "dlid", sl => "sl", src_path_bits => "src_path_bits",
            static_rate => "static_rate", is_global => "is_global", port_num => "port_num"),
        layout!(ibv_ah, "struct ibv_ah"; context => "context", pd => "pd", handle => "handle"),
        layout!(ibv_comp_channel, "struct ibv_comp_channel"; context => "context", fd => "fd", refcnt => "refcnt"),
        layout!(ibv_cq, "struct ibv_cq";
            context => "context", channel => "channel", cq_context => "cq_context", handle => "handle",
            cqe => "cqe", mutex => "mutex", cond => "cond", comp_events_completed => "comp_events_completed",
            async_events_completed => "async_events_completed"),
        layout!(ibv_poll_cq_attr, "struct ibv_poll_cq_attr"; comp_mask => "comp_mask"),
        layout!(ibv_wc_tm_info, "struct ibv_wc_tm_info"; tag => "tag", priv_ => "priv"),
        layout!(ibv_cq_ex, "struct ibv_cq_ex";
            context => "context", channel => "channel", cq_context => "cq_context", handle => "handle",
            cqe => "cqe", mutex => "mutex", cond => "cond", comp_events_completed => "comp_events_completed",
            async_events_completed => "async_events_completed", comp_mask => "comp_mask", status => "status",
            wr_id => "wr_id", start_poll => "start_poll", next_poll => "next_poll", end_poll => "end_poll",
            read_opcode => "read_opcode", read_vendor_err => "read_vendor_err", read_byte_len => "read_byte_len",
            read_imm_data => "read_imm_data", read_qp_num => "read_qp_num", read_src_qp => "read_src_qp",
            read_wc_flags => "read_wc_flags", read_slid => "read_slid", read_sl => "read_sl",
            read_dlid_path_bits => "read_dlid_path_bits", read_completion_ts => "read_completion_ts",
            read_cvlan => "read_cvlan", read_flow_tag => "read_flow_tag", read_tm_info => "read_tm_info",
            read_completion_wallclock_ns => "read_completion_wallclock_ns"),
        layout!(ibv_cq_init_attr_ex, "struct ibv_cq_init_attr_ex";
            cqe => "cqe", cq_context => "cq_context", channel => "channel", comp_vector => "comp_vector",
            wc_flags => "wc_flags", comp_mask => "comp_mask", flags => "flags", parent_domain => "parent_domain"),
        layout!(ibv_td, "struct ibv_td"; context => "context"),
        layout!(ibv_td_init_attr, "struct ibv_td_init_attr"; comp_mask => "comp_mask"),
        layout!(ibv_parent_domain_init_attr, "struct ibv_parent_domain_init_attr";
            pd => "pd", td => "td", comp_mask => "comp_mask", alloc => "alloc", free => "free",
            pd_context => "pd_context"),
        layout!(ibv_moderate_cq, "struct ibv_moderate_cq"; cq_count => "cq_count", cq_period => "cq_period"),
        layout!(ibv_modify_cq_attr, "struct ibv_modify_cq_attr"; attr_mask => "attr_mask", moderate => "moderate"),
        layout!(ibv_qp_cap, "struct ibv_qp_cap";
            max_send_wr => "max_send_wr", max_recv_wr => "max_recv_wr", max_send_sge => "max_send_sge",
            max_recv_sge => "max_recv_sge", max_inline_data => "max_inline_data"),
        layout!(ibv_qp, "struct ibv_qp";
            context => "context", qp_context => "qp_context", pd => "pd", send_cq => "send_cq",
            recv_cq => "recv_cq", srq => "srq", handle => "handle", qp_num => "qp_num", state => "state",
            qp_type => "qp_type", mutex => "mutex", cond => "cond", events_completed => "events_completed"),
        layout!(ibv_data_buf, "struct ibv_data_buf"; addr => "addr", length => "length"),
        layout!(ibv_qp_ex, "struct ibv_qp_ex";
            qp_base => "qp_base", comp_mask => "comp_mask", wr_id => "wr_id", wr_flags => "wr_flags",
            wr_atomic_cmp_swp => "wr_atomic_cmp_swp", wr_atomic_fetch_add => "wr_atomic_fetch_add",
            wr_bind_mw => "wr_bind_mw", wr_local_inv => "wr_local_inv", wr_rdma_read => "wr_rdma_read",
            wr_rdma_write => "wr_rdma_write", wr_rdma_write_imm => "wr_rdma_write_imm", wr_send => "wr_send",
            wr_send_imm => "wr_send_imm", wr_send_inv => "wr_send_inv", wr_send_tso => "wr_send_tso",
            wr_set_ud_addr => "wr_set_ud_addr", wr_set_xrc_srqn => "wr_set_xrc_srqn",
            wr_set_inline_data => "wr_set_inline_data", wr_set_inline_data_list => "wr_set_inline_data_list",
            wr_set_sge => "wr_set_sge", wr_set_sge_list => "wr_set_sge_list", wr_start => "wr_start",
            wr_complete => "wr_complete", wr_abort => "wr_abort", wr_atomic_write => "wr_atomic_write"),
        layout!(ibv_qp_init_attr, "struct ibv_qp_init_attr";
            qp_context => "qp_context", send_cq => "send_cq", recv_cq => "recv_cq", srq => "srq",
            cap => "cap", qp_type => "qp_type", sq_sig_all => "sq_sig_all"),
        layout!(ibv_rx_hash_conf, "struct ibv_rx_hash_conf";
            rx_hash_function => "rx_hash_function", rx_hash_key_len => "rx_hash_key_len",
            rx_hash_key => "rx_hash_key", rx_hash_fields_mask => "rx_hash_fields_mask"),
        layout!(ibv_qp_init_attr_ex, "struct ibv_qp_init_attr_ex";
            qp_context => "qp_context", send_cq => "send_cq", recv_cq => "recv_cq", srq => "srq",
            cap => "cap", qp_type => "qp_type", sq_sig_all => "sq_sig_all", comp_mask => "comp_mask",
            pd => "pd", xrcd => "xrcd", create_flags => "create_flags", max_tso_header => "max_tso_header",
            rwq_ind_tbl => "rwq_ind_tbl", rx_hash_conf => "rx_hash_conf", source_qpn => "source_qpn",
            send_ops_flags => "send_ops_flags"),
        layout!(ibv_qp_attr, "struct ibv_qp_attr";
            qp_state => "qp_state", cur_qp_state => "cur_qp_state", path_mtu => "path_mtu",
            path_mig_state => "path_mig_state", qkey => "qkey", rq_psn => "rq_psn", sq_psn => "sq_psn",
            dest_qp_num => "dest_qp_num", qp_access_flags => "qp_access_flags", cap => "cap",
            ah_attr => "ah_attr", alt_ah_attr => "alt_ah_attr", pkey_index => "pkey_index",
            alt_pkey_index => "alt_pkey_index", en_sqd_async_notify => "en_sqd_async_notify",
            sq_draining => "sq_draining", max_rd_atomic => "max_rd_atomic",
            max_dest_rd_atomic => "max_dest_rd_atomic", min_rnr_timer => "min_rnr_timer",
            port_num => "port_num", timeout => "timeout", retry_cnt => "retry_cnt", rnr_retry => "rnr_retry",
            alt_port_num => "alt_port_num", alt_timeout => "alt_timeout", rate_limit => "rate_limit"),
        layout!(ibv_sge, "struct ibv_sge"; addr => "addr", length => "length", lkey => "lkey"),
        layout!(ibv_send_wr, "struct ibv_send_wr";
            wr_id => "wr_id", next => "next", sg_list => "sg_list", num_sge => "num_sge", opcode => "opcode",
            send_flags => "send_flags", imm_data => "imm_data", imm_data => "invalidate_rkey", wr => "wr",
            wr.rdma => "wr.rdma", wr.rdma.remote_addr => "wr.rdma.remote_addr", wr.rdma.rkey => "wr.rdma.rkey",
            wr.atomic => "wr.atomic", wr.atomic.remote_addr => "wr.atomic.remote_addr",
            wr.atomic.compare_add => "wr.atomic.compare_add", wr.atomic.swap => "wr.atomic.swap",
            wr.atomic.rkey => "wr.atomic.rkey", wr.ud => "wr.ud", wr.ud.ah => "wr.ud.ah",
            wr.ud.remote_qpn => "wr.ud.remote_qpn", wr.ud.remote_qkey => "wr.ud.remote_qkey",
            qp_type => "qp_type", qp_type.xrc => "qp_type.xrc", qp_type.xrc.remote_srqn => "qp_type.xrc.remote_srqn",
            ext.bind_mw => "bind_mw", ext.bind_mw.mw => "bind_mw.mw", ext.bind_mw.rkey => "bind_mw.rkey",
            ext.bind_mw.bind_info => "bind_mw.bind_info", ext.tso => "tso", ext.tso.hdr => "tso.hdr",
            ext.tso.hdr_sz => "tso.hdr_sz", ext.tso.mss => "tso.mss"),
        layout!(ibv_recv_wr, "struct ibv_recv_wr";
            wr_id => "wr_id", next => "next", sg_list => "sg_list", num_sge => "num_sge"),
        layout!(ibv_srq, "struct ibv_srq";
            context => "context", srq_context => "srq_context", pd => "pd", handle => "handle",
            mutex => "mutex", cond => "cond", events_completed => "events_completed"),
        layout!(ibv_srq_attr, "struct ibv_srq_attr"; max_wr => "max_wr", max_sge => "max_sge", srq_limit => "srq_limit"),
        layout!(ibv_srq_init_attr, "struct ibv_srq_init_attr"; srq_context => "srq_context", attr => "attr"),
        layout!(ibv_async_event, "struct ibv_async_event";
            element => "element", element.cq => "element.cq", element.qp => "element.qp",
            element.srq => "element.srq", element.wq => "element.wq", element.port_num => "element.port_num",
            event_type => "event_type"),
        // Fields: softverbs-cq's tests/ibv_wc_layout.rs checks every one.
        layout!(ibv_wc, "struct ibv_wc";),
    ]
}

/// Enum values the library reports, by their header name.
fn constants() -> Vec<(&'static str, i64)> {
    vec![
        ("IBV_NODE_CA", IBV_NODE_CA.into()),
        ("IBV_TRANSPORT_IB", IBV_TRANSPORT_IB.into()),
        ("IBV_PORT_ACTIVE", IBV_PORT_ACTIVE.into()),
        ("IBV_LINK_LAYER_ETHERNET", IBV_LINK_LAYER_ETHERNET.into()),
        ("IBV_ATOMIC_HCA", IBV_ATOMIC_HCA.into()),
        ("IBV_ATOMIC_NONE", IBV_ATOMIC_NONE.into()),
        ("IBV_GID_TYPE_ROCE_V2", IBV_GID_TYPE_ROCE_V2.into()),
        (
            "IBV_VALUES_MASK_RAW_CLOCK",
            IBV_VALUES_MASK_RAW_CLOCK.into(),
        ),
        ("IBV_FORK_UNNEEDED", IBV_FORK_UNNEEDED.into()),
        (
            "IBV_DEVICE_PORT_ACTIVE_EVENT",
            IBV_DEVICE_PORT_ACTIVE_EVENT.into(),
        ),
        (
            "IBV_DEVICE_SYS_IMAGE_GUID",
            IBV_DEVICE_SYS_IMAGE_GUID.into(),
        ),
        (
            "IBV_DEVICE_RC_RNR_NAK_GEN",
            IBV_DEVICE_RC_RNR_NAK_GEN.into(),
        ),
        ("IBV_PORT_IP_BASED_GIDS", IBV_PORT_IP_BASED_GIDS.into()),
    ]
}

/// Compiles and runs the C side; returns `key -> value` of every line it printed.
fn measure(structs: &[Struct], constants: &[(&str, i64)]) -> BTreeMap<String, i64> {
    assert!(
        Path::new(VERBS_H).exists(),
        "{VERBS_H} is missing: install the Debian package libibverbs-dev (the project's test \
         script installs it). This test fails rather than skips without it."
    );
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <stdalign.h>\n\
         #include <infiniband/verbs.h>\nint main(void) {\n",
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
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("softverbs-capi-abi-layout");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c).unwrap();
    let gcc = Command::new("gcc")
        .args(["-std=gnu11", "-Wall", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run gcc: install the Debian package gcc (the project's test script does)");
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
fn every_field_of_every_mirror_matches_the_installed_verbs_h() {
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
        check(format!("S|{}|size", s.c), s.size as i64);
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
    assert!(checked > 600, "only {checked} values compared");
}

#[test]
fn the_traps_of_the_reference_hold() {
    // The numbers the inline functions of verbs.h depend on.
    assert_eq!(size_of::<verbs_context>(), 648);
    assert_eq!(offset_of!(verbs_context, context), 320);
    assert_eq!(offset_of!(verbs_context, sz), 312);
    assert_eq!(offset_of!(ibv_cq_ex, status), 132);
    assert_eq!(offset_of!(ibv_cq_ex, wr_id), 136);
    assert_eq!(offset_of!(ibv_qp_ex, wr_id), 168);
    assert_eq!(
        LEGACY_PORT_ATTR_LEN,
        offset_of!(ibv_port_attr, port_cap_flags2)
    );
}
