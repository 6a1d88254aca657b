//! The `<infiniband/verbs.h>` values the library uses (rdma-core 44), named as in the
//! header, each with the `enum` it belongs to. This is the one place such a value is
//! written down: the area modules import them from here, never redefine them.
//!
//! C enums are plain integers here (reference §4.1 trap 11: a C caller may pass any
//! value); each constant has the Rust type of the field or argument it is compared with.
//! Values the library itself chooses (limits, timeouts, magic numbers, capability sets
//! built from these) live in the module that uses them.
//!
//! The unit test below compiles a C program against the installed header and compares
//! every constant of [`HEADER_VALUES`] with it. [`crate::abi`] re-exports this module, so
//! `softverbs_capi::abi::IBV_*` (the path `tests/abi_layout.rs` uses) names the same items.

/// Defines the constants and [`HEADER_VALUES`], the list of them by their header name.
macro_rules! verbs_h {
    ($($(#[doc = $doc:literal])* $name:ident: $ty:ty = $value:expr;)*) => {
        $(
            $(#[doc = $doc])*
            pub const $name: $ty = $value;
        )*
        /// Every constant of this module that the installed `verbs.h` defines, by name.
        pub const HEADER_VALUES: &[(&str, i128)] = &[$((stringify!($name), $name as i128)),*];
    };
}

verbs_h! {
    // ---------------------------------------------------------------- device and port

    /// `IBV_NODE_CA` (`enum ibv_node_type`).
    IBV_NODE_CA: i32 = 1;
    /// `IBV_TRANSPORT_IB` (`enum ibv_transport_type`).
    IBV_TRANSPORT_IB: i32 = 0;
    /// `IBV_PORT_ACTIVE` (`enum ibv_port_state`).
    IBV_PORT_ACTIVE: u32 = 4;
    /// `IBV_LINK_LAYER_ETHERNET` (the anonymous `enum` of `IBV_LINK_LAYER_*`).
    IBV_LINK_LAYER_ETHERNET: u8 = 2;
    /// `IBV_ATOMIC_HCA` (`enum ibv_atomic_cap`).
    IBV_ATOMIC_HCA: u32 = 1;
    /// `IBV_ATOMIC_NONE` (`enum ibv_atomic_cap`).
    IBV_ATOMIC_NONE: u32 = 0;
    /// `IBV_GID_TYPE_ROCE_V2` (`enum ibv_gid_type`).
    IBV_GID_TYPE_ROCE_V2: u32 = 2;
    /// `IBV_VALUES_MASK_RAW_CLOCK` (`enum ibv_values_mask`).
    IBV_VALUES_MASK_RAW_CLOCK: u32 = 1;
    /// `IBV_FORK_UNNEEDED` (`enum ibv_fork_status`).
    IBV_FORK_UNNEEDED: u32 = 2;
    /// `IBV_DEVICE_PORT_ACTIVE_EVENT` (`enum ibv_device_cap_flags`).
    IBV_DEVICE_PORT_ACTIVE_EVENT: u32 = 1 << 10;
    /// `IBV_DEVICE_SYS_IMAGE_GUID` (`enum ibv_device_cap_flags`).
    IBV_DEVICE_SYS_IMAGE_GUID: u32 = 1 << 11;
    /// `IBV_DEVICE_RC_RNR_NAK_GEN` (`enum ibv_device_cap_flags`).
    IBV_DEVICE_RC_RNR_NAK_GEN: u32 = 1 << 12;
    /// `IBV_DEVICE_MEM_WINDOW` (`enum ibv_device_cap_flags`).
    IBV_DEVICE_MEM_WINDOW: u32 = 1 << 17;
    /// `IBV_DEVICE_MEM_WINDOW_TYPE_2B` (`enum ibv_device_cap_flags`).
    IBV_DEVICE_MEM_WINDOW_TYPE_2B: u32 = 1 << 24;
    /// `IBV_MW_TYPE_1` (`enum ibv_mw_type`).
    IBV_MW_TYPE_1: u32 = 1;
    /// `IBV_MW_TYPE_2` (`enum ibv_mw_type`).
    IBV_MW_TYPE_2: u32 = 2;
    /// `IBV_PORT_IP_BASED_GIDS` (`enum ibv_port_cap_flags`).
    IBV_PORT_IP_BASED_GIDS: u32 = 1 << 26;

    // ------------------------------------------------------------- asynchronous events

    /// `IBV_EVENT_CQ_ERR` (`enum ibv_event_type`).
    IBV_EVENT_CQ_ERR: u32 = 0;
    /// `IBV_EVENT_QP_FATAL` (`enum ibv_event_type`).
    IBV_EVENT_QP_FATAL: u32 = 1;
    /// `IBV_EVENT_QP_REQ_ERR` (`enum ibv_event_type`).
    IBV_EVENT_QP_REQ_ERR: u32 = 2;
    /// `IBV_EVENT_QP_ACCESS_ERR` (`enum ibv_event_type`).
    IBV_EVENT_QP_ACCESS_ERR: u32 = 3;
    /// `IBV_EVENT_COMM_EST` (`enum ibv_event_type`).
    IBV_EVENT_COMM_EST: u32 = 4;
    /// `IBV_EVENT_SQ_DRAINED` (`enum ibv_event_type`).
    IBV_EVENT_SQ_DRAINED: u32 = 5;
    /// `IBV_EVENT_PATH_MIG` (`enum ibv_event_type`).
    IBV_EVENT_PATH_MIG: u32 = 6;
    /// `IBV_EVENT_PATH_MIG_ERR` (`enum ibv_event_type`).
    IBV_EVENT_PATH_MIG_ERR: u32 = 7;
    /// `IBV_EVENT_SRQ_ERR` (`enum ibv_event_type`).
    IBV_EVENT_SRQ_ERR: u32 = 14;
    /// `IBV_EVENT_SRQ_LIMIT_REACHED` (`enum ibv_event_type`).
    IBV_EVENT_SRQ_LIMIT_REACHED: u32 = 15;
    /// `IBV_EVENT_QP_LAST_WQE_REACHED` (`enum ibv_event_type`).
    IBV_EVENT_QP_LAST_WQE_REACHED: u32 = 16;

    // ------------------------------------------------------------ memory and addresses

    /// `IBV_ACCESS_ZERO_BASED` (`enum ibv_access_flags`).
    IBV_ACCESS_ZERO_BASED: u32 = 1 << 5;
    /// `IBV_ACCESS_ON_DEMAND` (`enum ibv_access_flags`).
    IBV_ACCESS_ON_DEMAND: u32 = 1 << 6;
    /// `IBV_ACCESS_HUGETLB` (`enum ibv_access_flags`).
    IBV_ACCESS_HUGETLB: u32 = 1 << 7;
    /// `IBV_ACCESS_OPTIONAL_RANGE` (`#define` of `verbs_api.h` for the optional part of
    /// `enum ibv_access_flags`): flags a device may ignore.
    IBV_ACCESS_OPTIONAL_RANGE: u32 = 0x3ff0_0000;
    /// `IBV_WC_GRH` (`enum ibv_wc_flags`).
    IBV_WC_GRH: u32 = 1 << 0;

    // -------------------------------------------------------------------------- CQs

    /// `IBV_CQ_INIT_ATTR_MASK_FLAGS` (`enum ibv_cq_init_attr_mask`).
    IBV_CQ_INIT_ATTR_MASK_FLAGS: u32 = 1 << 0;
    /// `IBV_CQ_INIT_ATTR_MASK_PD` (`enum ibv_cq_init_attr_mask`).
    IBV_CQ_INIT_ATTR_MASK_PD: u32 = 1 << 1;
    /// `IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS` (`enum ibv_parent_domain_init_attr_mask`).
    IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS: u32 = 1 << 0;
    /// `IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT` (`enum ibv_parent_domain_init_attr_mask`).
    IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT: u32 = 1 << 1;
    /// `IBV_CREATE_CQ_ATTR_SINGLE_THREADED` (`enum ibv_create_cq_attr_flags`).
    IBV_CREATE_CQ_ATTR_SINGLE_THREADED: u32 = 1 << 0;
    /// `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN` (`enum ibv_create_cq_attr_flags`).
    IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN: u32 = 1 << 1;
    /// `IBV_CQ_ATTR_MODERATE` (`enum ibv_cq_attr_mask`).
    IBV_CQ_ATTR_MODERATE: u32 = 1 << 0;
    /// `IBV_CREATE_CQ_SUP_WC_FLAGS` (an anonymous `enum`): every `enum ibv_create_cq_wc_flags`
    /// bit rdma-core 44 defines.
    IBV_CREATE_CQ_SUP_WC_FLAGS: u64 = 0xfff;

    // -------------------------------------------------------------------------- SRQs

    /// `IBV_SRQ_MAX_WR` (`enum ibv_srq_attr_mask`).
    IBV_SRQ_MAX_WR: i32 = 1 << 0;
    /// `IBV_SRQ_LIMIT` (`enum ibv_srq_attr_mask`).
    IBV_SRQ_LIMIT: i32 = 1 << 1;

    // -------------------------------------------------------------------------- QPs

    /// `IBV_QPT_RC` (`enum ibv_qp_type`).
    IBV_QPT_RC: u32 = 2;
    /// `IBV_QPT_UC` (`enum ibv_qp_type`).
    IBV_QPT_UC: u32 = 3;
    /// `IBV_QPT_UD` (`enum ibv_qp_type`).
    IBV_QPT_UD: u32 = 4;
    /// `IBV_QPT_RAW_PACKET` (`enum ibv_qp_type`).
    IBV_QPT_RAW_PACKET: u32 = 8;
    /// `IBV_QPT_XRC_SEND` (`enum ibv_qp_type`).
    IBV_QPT_XRC_SEND: u32 = 9;
    /// `IBV_QPT_XRC_RECV` (`enum ibv_qp_type`).
    IBV_QPT_XRC_RECV: u32 = 10;
    /// `IBV_QPT_DRIVER` (`enum ibv_qp_type`).
    IBV_QPT_DRIVER: u32 = 0xff;
    /// `IBV_QP_INIT_ATTR_PD` (`enum ibv_qp_init_attr_mask`).
    IBV_QP_INIT_ATTR_PD: u32 = 1 << 0;
    /// `IBV_QP_INIT_ATTR_CREATE_FLAGS` (`enum ibv_qp_init_attr_mask`).
    IBV_QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
    /// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` (`enum ibv_qp_init_attr_mask`).
    IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;
    /// `IBV_QP_EX_WITH_RDMA_WRITE` (`enum ibv_qp_create_send_ops_flags`).
    IBV_QP_EX_WITH_RDMA_WRITE: u64 = 1 << 0;
    /// `IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM` (`enum ibv_qp_create_send_ops_flags`).
    IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM: u64 = 1 << 1;
    /// `IBV_QP_EX_WITH_SEND` (`enum ibv_qp_create_send_ops_flags`).
    IBV_QP_EX_WITH_SEND: u64 = 1 << 2;
    /// `IBV_QP_EX_WITH_SEND_WITH_IMM` (`enum ibv_qp_create_send_ops_flags`).
    IBV_QP_EX_WITH_SEND_WITH_IMM: u64 = 1 << 3;
    /// `IBV_QP_EX_WITH_RDMA_READ` (`enum ibv_qp_create_send_ops_flags`).
    IBV_QP_EX_WITH_RDMA_READ: u64 = 1 << 4;
    /// `IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP` (`enum ibv_qp_create_send_ops_flags`).
    IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP: u64 = 1 << 5;
    /// `IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD` (`enum ibv_qp_create_send_ops_flags`).
    IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD: u64 = 1 << 6;
    /// `IBV_QP_EX_WITH_SEND_WITH_INV` (`enum ibv_qp_create_send_ops_flags`).
    IBV_QP_EX_WITH_SEND_WITH_INV: u64 = 1 << 9;
    /// `IBV_QP_EX_WITH_LOCAL_INV` (`enum ibv_qp_create_send_ops_flags`).
    IBV_QP_EX_WITH_LOCAL_INV: u64 = 1 << 7;
    /// `IBV_QP_EX_WITH_BIND_MW` (`enum ibv_qp_create_send_ops_flags`).
    IBV_QP_EX_WITH_BIND_MW: u64 = 1 << 8;
    /// `IBV_QP_EX_WITH_ATOMIC_WRITE` (`enum ibv_qp_create_send_ops_flags`, rdma-core 44).
    IBV_QP_EX_WITH_ATOMIC_WRITE: u64 = 1 << 12;

    // ---------------------------------------------------------------- work requests

    /// `IBV_WR_RDMA_WRITE` (`enum ibv_wr_opcode`).
    IBV_WR_RDMA_WRITE: u32 = 0;
    /// `IBV_WR_RDMA_WRITE_WITH_IMM` (`enum ibv_wr_opcode`).
    IBV_WR_RDMA_WRITE_WITH_IMM: u32 = 1;
    /// `IBV_WR_SEND` (`enum ibv_wr_opcode`).
    IBV_WR_SEND: u32 = 2;
    /// `IBV_WR_SEND_WITH_IMM` (`enum ibv_wr_opcode`).
    IBV_WR_SEND_WITH_IMM: u32 = 3;
    /// `IBV_WR_RDMA_READ` (`enum ibv_wr_opcode`).
    IBV_WR_RDMA_READ: u32 = 4;
    /// `IBV_WR_ATOMIC_CMP_AND_SWP` (`enum ibv_wr_opcode`).
    IBV_WR_ATOMIC_CMP_AND_SWP: u32 = 5;
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD` (`enum ibv_wr_opcode`).
    IBV_WR_ATOMIC_FETCH_AND_ADD: u32 = 6;
    /// `IBV_WR_SEND_WITH_INV` (`enum ibv_wr_opcode`).
    IBV_WR_SEND_WITH_INV: u32 = 9;
    /// `IBV_WR_LOCAL_INV` (`enum ibv_wr_opcode`).
    IBV_WR_LOCAL_INV: u32 = 7;
    /// `IBV_WR_BIND_MW` (`enum ibv_wr_opcode`).
    IBV_WR_BIND_MW: u32 = 8;
    /// `IBV_SEND_FENCE` (`enum ibv_send_flags`).
    IBV_SEND_FENCE: u32 = 1 << 0;
    /// `IBV_SEND_SIGNALED` (`enum ibv_send_flags`).
    IBV_SEND_SIGNALED: u32 = 1 << 1;
    /// `IBV_SEND_SOLICITED` (`enum ibv_send_flags`).
    IBV_SEND_SOLICITED: u32 = 1 << 2;
    /// `IBV_SEND_INLINE` (`enum ibv_send_flags`).
    IBV_SEND_INLINE: u32 = 1 << 3;
}

/// `IBV_GID_TYPE_SYSFS_ROCE_V2` (`enum ibv_gid_type_sysfs` of rdma-core's provider header
/// `infiniband/driver.h`, which Debian does not install; the private `ibv_query_gid_type`
/// reports it). Not in [`HEADER_VALUES`]: the installed `verbs.h` has no such name to check it
/// against.
pub const IBV_GID_TYPE_SYSFS_ROCE_V2: u32 = 1;

#[cfg(test)]
mod tests {
    use super::HEADER_VALUES;
    use std::process::Command;

    #[test]
    fn every_constant_has_the_value_of_the_installed_verbs_h() {
        let mut c =
            String::from("#include <stdio.h>\n#include <infiniband/verbs.h>\nint main(void) {\n");
        for (name, _) in HEADER_VALUES {
            c.push_str(&format!(
                "  printf(\"{name} %lld\\n\", (long long)({name}));\n"
            ));
        }
        c.push_str("  return 0;\n}\n");
        let dir =
            std::env::temp_dir().join(format!("softverbs-capi-verbs-h-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (src, exe) = (dir.join("values.c"), dir.join("values"));
        std::fs::write(&src, c).unwrap();
        let gcc = Command::new("gcc")
            .args(["-std=gnu11", "-Wall", "-o"])
            .arg(&exe)
            .arg(&src)
            .output()
            .expect("run gcc (Debian packages gcc and libibverbs-dev)");
        assert!(
            gcc.status.success(),
            "gcc: {}",
            String::from_utf8_lossy(&gcc.stderr)
        );
        let out = Command::new(&exe).output().expect("run the values program");
        std::fs::remove_dir_all(&dir).ok();
        let printed = String::from_utf8(out.stdout).unwrap();
        let mismatches: Vec<String> = HEADER_VALUES
            .iter()
            .zip(printed.lines())
            .filter_map(|((name, rust), line)| {
                let c: i128 = line.rsplit_once(' ').unwrap().1.parse().unwrap();
                (c != *rust).then(|| format!("{name}: verbs.h {c}, here {rust}"))
            })
            .collect();
        assert_eq!(printed.lines().count(), HEADER_VALUES.len());
        assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    }
}
