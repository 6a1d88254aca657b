//! `#[repr(C)]` mirrors of the `<infiniband/verbs.h>` structs (rdma-core 44, x86_64) that the
//! exported functions, the `verbs.h` inline functions and the target programs touch, plus
//! (re-exported from [`crate::verbs_h`], where they are defined) the enum values the
//! library uses.
//!
//! Guarantees:
//! - every struct here has the size, alignment and field offsets of the installed header;
//!   `tests/abi_layout.rs` compiles a C program against `verbs.h` and compares every field
//!   of every mirror (sizes and offsets), and the `const` assertions below pin the sizes
//!   measured on Debian 12's `verbs.h` (rdma-core 44, x86_64);
//! - C enums are plain `u32` / `i32` (the header's enums are `int`-sized): a C caller may hand us any
//!   value, and an out-of-range Rust `enum` would be undefined behaviour;
//! - `pthread_mutex_t` / `pthread_cond_t` are opaque byte blocks ([`PthreadMutex`],
//!   [`PthreadCond`]); all-zero bytes are a valid default-initialised object on glibc;
//! - `struct ibv_wc` is [`softverbs::core::cq::WorkCompletion`], which already has the layout.
//!
//! Names are the C names, so that the mirrors read like the header.

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};

pub use softverbs::core::cq::WorkCompletion as ibv_wc;

/// `pthread_mutex_t` on x86_64 glibc: 40 bytes, align 8.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PthreadMutex(pub [u64; 5]);

/// `pthread_cond_t` on x86_64 glibc: 48 bytes, align 8.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PthreadCond(pub [u64; 6]);

/// A function-pointer slot whose signature the library never calls through (legacy or
/// unsupported ops): 8 bytes, `NULL` or a function.
pub type AnyFn = Option<unsafe extern "C" fn()>;

// ---------------------------------------------------------------------------------------
// Enum values (verbs.h)
// ---------------------------------------------------------------------------------------

// The values live in `verbs_h`, the one module that defines them; re-exported so that
// `abi::*` (what the area modules and `tests/abi_layout.rs` import) names every `verbs.h`
// item, structs and values alike.
pub use crate::verbs_h::*;

// ---------------------------------------------------------------------------------------
// Device and context
// ---------------------------------------------------------------------------------------

/// `struct _ibv_device_ops`: obsolete, never used.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct _ibv_device_ops {
    /// Obsolete.
    pub _dummy1: AnyFn,
    /// Obsolete.
    pub _dummy2: AnyFn,
}

/// `struct ibv_device` (664 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_device {
    /// Obsolete ops.
    pub _ops: _ibv_device_ops,
    /// `enum ibv_node_type`.
    pub node_type: i32,
    /// `enum ibv_transport_type`.
    pub transport_type: i32,
    /// Kernel IB device name.
    pub name: [c_char; 64],
    /// uverbs device name.
    pub dev_name: [c_char; 64],
    /// sysfs path of the uverbs device.
    pub dev_path: [c_char; 256],
    /// sysfs path of the IB device.
    pub ibdev_path: [c_char; 256],
}

/// `struct ibv_context_ops` (32 slots, 256 bytes). `poll_cq`, `req_notify_cq`,
/// `post_send`, `post_recv`, `post_srq_recv`, `bind_mw` and `dealloc_mw` are called by the
/// inline functions with no NULL check (reference §3.1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_context_ops {
    /// Legacy `query_device` (the library's own `ibv_query_device`).
    pub _compat_query_device:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int>,
    /// Legacy `query_port` (the library's own `ibv_query_port`).
    pub _compat_query_port:
        Option<unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int>,
    /// Legacy.
    pub _compat_alloc_pd: AnyFn,
    /// Legacy.
    pub _compat_dealloc_pd: AnyFn,
    /// Legacy.
    pub _compat_reg_mr: AnyFn,
    /// Legacy.
    pub _compat_rereg_mr: AnyFn,
    /// Legacy.
    pub _compat_dereg_mr: AnyFn,
    /// `ibv_alloc_mw` (NULL-checked by the inline).
    pub alloc_mw: Option<unsafe extern "C" fn(*mut ibv_pd, u32) -> *mut ibv_mw>,
    /// `ibv_bind_mw`.
    pub bind_mw: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int>,
    /// `ibv_dealloc_mw`.
    pub dealloc_mw: Option<unsafe extern "C" fn(*mut ibv_mw) -> c_int>,
    /// Legacy.
    pub _compat_create_cq: AnyFn,
    /// `ibv_poll_cq`.
    pub poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int>,
    /// `ibv_req_notify_cq`.
    pub req_notify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
    /// Legacy.
    pub _compat_cq_event: AnyFn,
    /// Legacy.
    pub _compat_resize_cq: AnyFn,
    /// Legacy.
    pub _compat_destroy_cq: AnyFn,
    /// Legacy.
    pub _compat_create_srq: AnyFn,
    /// Legacy.
    pub _compat_modify_srq: AnyFn,
    /// Legacy.
    pub _compat_query_srq: AnyFn,
    /// Legacy.
    pub _compat_destroy_srq: AnyFn,
    /// `ibv_post_srq_recv`.
    pub post_srq_recv: Option<
        unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int,
    >,
    /// Legacy.
    pub _compat_create_qp: AnyFn,
    /// Legacy.
    pub _compat_query_qp: AnyFn,
    /// Legacy.
    pub _compat_modify_qp: AnyFn,
    /// Legacy.
    pub _compat_destroy_qp: AnyFn,
    /// `ibv_post_send`.
    pub post_send:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int>,
    /// `ibv_post_recv`.
    pub post_recv:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    /// Legacy.
    pub _compat_create_ah: AnyFn,
    /// Legacy.
    pub _compat_destroy_ah: AnyFn,
    /// Legacy.
    pub _compat_attach_mcast: AnyFn,
    /// Legacy.
    pub _compat_detach_mcast: AnyFn,
    /// Legacy.
    pub _compat_async_event: AnyFn,
}

/// `struct ibv_context` (328 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_context {
    /// The device.
    pub device: *mut ibv_device,
    /// The ops the inline functions call.
    pub ops: ibv_context_ops,
    /// Command fd (`-1`: the soft device has none).
    pub cmd_fd: c_int,
    /// Async event fd.
    pub async_fd: c_int,
    /// Completion vectors.
    pub num_comp_vectors: c_int,
    /// Context mutex.
    pub mutex: PthreadMutex,
    /// `UINTPTR_MAX` for an extended ([`verbs_context`]) context.
    pub abi_compat: *mut c_void,
}

/// `struct verbs_context` (648 bytes): extended ops placed *before* the `ibv_context` the
/// application holds (reference §3.2, §4.1 trap 1).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct verbs_context {
    /// `ibv_query_port` with the caller's struct size.
    pub query_port:
        Option<unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int>,
    /// `ibv_advise_mr`: `(pd, advice, flags, sg_list, num_sge)`, returning the errno.
    pub advise_mr: Option<unsafe extern "C" fn(*mut ibv_pd, u32, u32, *mut ibv_sge, u32) -> c_int>,
    /// `ibv_alloc_null_mr`.
    pub alloc_null_mr: AnyFn,
    /// `ibv_read_counters`.
    pub read_counters: AnyFn,
    /// `ibv_attach_counters_point_flow`.
    pub attach_counters_point_flow: AnyFn,
    /// `ibv_create_counters`.
    pub create_counters: AnyFn,
    /// `ibv_destroy_counters`.
    pub destroy_counters: AnyFn,
    /// `ibv_reg_dm_mr`.
    pub reg_dm_mr: AnyFn,
    /// `ibv_alloc_dm`.
    pub alloc_dm: AnyFn,
    /// `ibv_free_dm`.
    pub free_dm: AnyFn,
    /// `ibv_modify_flow_action_esp`.
    pub modify_flow_action_esp: AnyFn,
    /// `ibv_destroy_flow_action`.
    pub destroy_flow_action: AnyFn,
    /// `ibv_create_flow_action_esp`.
    pub create_flow_action_esp: AnyFn,
    /// `ibv_modify_qp_rate_limit`.
    pub modify_qp_rate_limit: AnyFn,
    /// `ibv_alloc_parent_domain`.
    pub alloc_parent_domain: Option<
        unsafe extern "C" fn(*mut ibv_context, *mut ibv_parent_domain_init_attr) -> *mut ibv_pd,
    >,
    /// `ibv_dealloc_td`.
    pub dealloc_td: Option<unsafe extern "C" fn(*mut ibv_td) -> c_int>,
    /// `ibv_alloc_td`.
    pub alloc_td:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_td_init_attr) -> *mut ibv_td>,
    /// `ibv_modify_cq`.
    pub modify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, *mut ibv_modify_cq_attr) -> c_int>,
    /// `ibv_post_srq_ops`.
    pub post_srq_ops: AnyFn,
    /// `ibv_destroy_rwq_ind_table`.
    pub destroy_rwq_ind_table: AnyFn,
    /// `ibv_create_rwq_ind_table`.
    pub create_rwq_ind_table: AnyFn,
    /// `ibv_destroy_wq`.
    pub destroy_wq: AnyFn,
    /// `ibv_modify_wq`.
    pub modify_wq: AnyFn,
    /// `ibv_create_wq`.
    pub create_wq: AnyFn,
    /// `ibv_query_rt_values_ex`.
    pub query_rt_values:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_values_ex) -> c_int>,
    /// `ibv_create_cq_ex`.
    pub create_cq_ex:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex>,
    /// The library's private pointer (not an op).
    pub priv_: *mut c_void,
    /// `ibv_query_device_ex` with the caller's struct size.
    pub query_device_ex: Option<
        unsafe extern "C" fn(
            *mut ibv_context,
            *const ibv_query_device_ex_input,
            *mut ibv_device_attr_ex,
            usize,
        ) -> c_int,
    >,
    /// `ibv_destroy_flow`.
    pub ibv_destroy_flow: AnyFn,
    /// Do not use.
    pub ABI_placeholder2: AnyFn,
    /// `ibv_create_flow`.
    pub ibv_create_flow: AnyFn,
    /// Do not use.
    pub ABI_placeholder1: AnyFn,
    /// `ibv_open_qp`.
    pub open_qp: AnyFn,
    /// `ibv_create_qp_ex`.
    pub create_qp_ex:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp>,
    /// `ibv_get_srq_num`.
    pub get_srq_num: AnyFn,
    /// `ibv_create_srq_ex`.
    pub create_srq_ex: AnyFn,
    /// `ibv_open_xrcd`.
    pub open_xrcd: AnyFn,
    /// `ibv_close_xrcd`.
    pub close_xrcd: AnyFn,
    /// Do not use.
    pub _ABI_placeholder3: u64,
    /// Size of this struct as the library knows it: must be 648 (trap 1).
    pub sz: usize,
    /// The context the application sees.
    pub context: ibv_context,
}

/// `struct ibv_query_device_ex_input`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_query_device_ex_input {
    /// Must be 0.
    pub comp_mask: u32,
}

/// `struct ibv_device_attr` (232 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_device_attr {
    /// Firmware version string.
    pub fw_ver: [c_char; 64],
    /// Node GUID (network byte order).
    pub node_guid: u64,
    /// System image GUID (network byte order).
    pub sys_image_guid: u64,
    /// Largest MR.
    pub max_mr_size: u64,
    /// Page sizes.
    pub page_size_cap: u64,
    /// Vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Max QPs.
    pub max_qp: c_int,
    /// Max WRs per queue.
    pub max_qp_wr: c_int,
    /// `enum ibv_device_cap_flags`.
    pub device_cap_flags: c_uint,
    /// Max SGEs.
    pub max_sge: c_int,
    /// Max SGEs for RDMA read.
    pub max_sge_rd: c_int,
    /// Max CQs.
    pub max_cq: c_int,
    /// Max CQEs.
    pub max_cqe: c_int,
    /// Max MRs.
    pub max_mr: c_int,
    /// Max PDs.
    pub max_pd: c_int,
    /// Incoming reads/atomics per QP.
    pub max_qp_rd_atom: c_int,
    /// RD only.
    pub max_ee_rd_atom: c_int,
    /// Total incoming reads/atomics.
    pub max_res_rd_atom: c_int,
    /// Outgoing reads/atomics per QP.
    pub max_qp_init_rd_atom: c_int,
    /// RD only.
    pub max_ee_init_rd_atom: c_int,
    /// `enum ibv_atomic_cap`.
    pub atomic_cap: u32,
    /// RD only.
    pub max_ee: c_int,
    /// RD only.
    pub max_rdd: c_int,
    /// Max memory windows.
    pub max_mw: c_int,
    /// Raw IPv6 QPs.
    pub max_raw_ipv6_qp: c_int,
    /// Raw Ethertype QPs.
    pub max_raw_ethy_qp: c_int,
    /// Multicast groups.
    pub max_mcast_grp: c_int,
    /// QPs per multicast group.
    pub max_mcast_qp_attach: c_int,
    /// Total multicast attachments.
    pub max_total_mcast_qp_attach: c_int,
    /// Max AHs.
    pub max_ah: c_int,
    /// Obsolete.
    pub max_fmr: c_int,
    /// Obsolete.
    pub max_map_per_fmr: c_int,
    /// Max SRQs.
    pub max_srq: c_int,
    /// Max WRs per SRQ.
    pub max_srq_wr: c_int,
    /// Max SGEs per SRQ WR.
    pub max_srq_sge: c_int,
    /// P_Key table size.
    pub max_pkeys: u16,
    /// Local CA ACK delay.
    pub local_ca_ack_delay: u8,
    /// Physical ports.
    pub phys_port_cnt: u8,
}

/// `struct ibv_odp_caps`' per-transport part.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_odp_per_transport_caps {
    /// RC.
    pub rc_odp_caps: u32,
    /// UC.
    pub uc_odp_caps: u32,
    /// UD.
    pub ud_odp_caps: u32,
}

/// `struct ibv_odp_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_odp_caps {
    /// `enum ibv_odp_general_caps`.
    pub general_caps: u64,
    /// Per transport.
    pub per_transport_caps: ibv_odp_per_transport_caps,
}

/// `struct ibv_tso_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_tso_caps {
    /// Max TSO size.
    pub max_tso: u32,
    /// QP types.
    pub supported_qpts: u32,
}

/// `struct ibv_rss_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_rss_caps {
    /// QP types.
    pub supported_qpts: u32,
    /// Tables.
    pub max_rwq_indirection_tables: u32,
    /// Table size.
    pub max_rwq_indirection_table_size: u32,
    /// `enum ibv_rx_hash_fields`.
    pub rx_hash_fields_mask: u64,
    /// `enum ibv_rx_hash_function_flags`.
    pub rx_hash_function: u8,
}

/// `struct ibv_packet_pacing_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_packet_pacing_caps {
    /// kbps.
    pub qp_rate_limit_min: u32,
    /// kbps.
    pub qp_rate_limit_max: u32,
    /// QP types.
    pub supported_qpts: u32,
}

/// `struct ibv_tm_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_tm_caps {
    /// Rendezvous header size.
    pub max_rndv_hdr_size: u32,
    /// Tags.
    pub max_num_tags: u32,
    /// `enum ibv_tm_cap_flags`.
    pub flags: u32,
    /// Outstanding list operations.
    pub max_ops: u32,
    /// SGEs per tagged buffer.
    pub max_sge: u32,
}

/// `struct ibv_cq_moderation_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_cq_moderation_caps {
    /// Max completion count.
    pub max_cq_count: u16,
    /// Max period (µs).
    pub max_cq_period: u16,
}

/// `struct ibv_pci_atomic_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_pci_atomic_caps {
    /// `enum ibv_pci_atomic_op_size`.
    pub fetch_add: u16,
    /// `enum ibv_pci_atomic_op_size`.
    pub swap: u16,
    /// `enum ibv_pci_atomic_op_size`.
    pub compare_swap: u16,
}

/// `struct ibv_device_attr_ex` (400 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_device_attr_ex {
    /// The legacy attributes.
    pub orig_attr: ibv_device_attr,
    /// Valid fields.
    pub comp_mask: u32,
    /// On-demand paging.
    pub odp_caps: ibv_odp_caps,
    /// Valid bits of completion timestamps.
    pub completion_timestamp_mask: u64,
    /// Device clock in kHz.
    pub hca_core_clock: u64,
    /// `enum ibv_device_cap_flags` (64-bit).
    pub device_cap_flags_ex: u64,
    /// TSO.
    pub tso_caps: ibv_tso_caps,
    /// RSS.
    pub rss_caps: ibv_rss_caps,
    /// Max receive WQs.
    pub max_wq_type_rq: u32,
    /// Packet pacing.
    pub packet_pacing_caps: ibv_packet_pacing_caps,
    /// `enum ibv_raw_packet_caps`.
    pub raw_packet_caps: u32,
    /// Tag matching.
    pub tm_caps: ibv_tm_caps,
    /// CQ moderation.
    pub cq_mod_caps: ibv_cq_moderation_caps,
    /// Device memory.
    pub max_dm_size: u64,
    /// PCI atomics.
    pub pci_atomic_caps: ibv_pci_atomic_caps,
    /// XRC ODP.
    pub xrc_odp_caps: u32,
    /// Ports (beyond 255).
    pub phys_port_cnt_ex: u32,
}

/// `struct ibv_port_attr` (52 bytes, align 4). The exported `ibv_query_port` sees only the
/// first [`LEGACY_PORT_ATTR_LEN`] bytes (reference §4.1 trap 6).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_port_attr {
    /// `enum ibv_port_state`.
    pub state: u32,
    /// `enum ibv_mtu`.
    pub max_mtu: u32,
    /// `enum ibv_mtu`.
    pub active_mtu: u32,
    /// GID table length.
    pub gid_tbl_len: c_int,
    /// `enum ibv_port_cap_flags`.
    pub port_cap_flags: u32,
    /// Largest message.
    pub max_msg_sz: u32,
    /// Bad P_Key counter.
    pub bad_pkey_cntr: u32,
    /// Q_Key violation counter.
    pub qkey_viol_cntr: u32,
    /// P_Key table length.
    pub pkey_tbl_len: u16,
    /// LID.
    pub lid: u16,
    /// SM LID.
    pub sm_lid: u16,
    /// LMC.
    pub lmc: u8,
    /// VLs.
    pub max_vl_num: u8,
    /// SM SL.
    pub sm_sl: u8,
    /// Subnet timeout.
    pub subnet_timeout: u8,
    /// Init type reply.
    pub init_type_reply: u8,
    /// Width code.
    pub active_width: u8,
    /// Speed code.
    pub active_speed: u8,
    /// Physical state (5: LinkUp).
    pub phys_state: u8,
    /// `IBV_LINK_LAYER_*`.
    pub link_layer: u8,
    /// `enum ibv_port_attr_flags`.
    pub flags: u8,
    /// `enum ibv_port_cap_flags2`.
    pub port_cap_flags2: u16,
}

/// Bytes of `ibv_port_attr` the exported (legacy) `ibv_query_port` may write.
pub const LEGACY_PORT_ATTR_LEN: usize = 48;

/// `union ibv_gid`'s `global` view.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_gid_global {
    /// Subnet prefix (network byte order).
    pub subnet_prefix: u64,
    /// Interface id (network byte order).
    pub interface_id: u64,
}

/// `union ibv_gid` (16 bytes, align 8).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_gid {
    /// Raw bytes.
    pub raw: [u8; 16],
    /// Prefix / interface id.
    pub global: ibv_gid_global,
}

impl std::fmt::Debug for ibv_gid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // SAFETY: every 16-byte pattern is a valid `[u8; 16]`.
        let raw = unsafe { self.raw };
        f.debug_tuple("ibv_gid").field(&raw).finish()
    }
}

/// `struct ibv_gid_entry` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_gid_entry {
    /// The GID.
    pub gid: ibv_gid,
    /// Its index.
    pub gid_index: u32,
    /// Its port.
    pub port_num: u32,
    /// `enum ibv_gid_type`.
    pub gid_type: u32,
    /// Network device ifindex (0: none).
    pub ndev_ifindex: u32,
}

/// `struct ibv_values_ex` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_values_ex {
    /// In: fields wanted; out: fields filled.
    pub comp_mask: u32,
    /// Raw device clock.
    pub raw_clock: libc::timespec,
}

// ---------------------------------------------------------------------------------------
// PD, MR, MW, AH
// ---------------------------------------------------------------------------------------

/// `struct ibv_pd` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_pd {
    /// The context.
    pub context: *mut ibv_context,
    /// Handle.
    pub handle: u32,
}

/// `struct ibv_td` (8 bytes): a thread domain.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_td {
    /// The context.
    pub context: *mut ibv_context,
}

/// `struct ibv_td_init_attr` (4 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_td_init_attr {
    /// No bit is defined: must be 0.
    pub comp_mask: u32,
}

/// A parent domain's `alloc` callback.
pub type ParentDomainAlloc =
    unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, usize, u64) -> *mut c_void;
/// A parent domain's `free` callback.
pub type ParentDomainFree = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, *mut c_void, u64);

/// `struct ibv_parent_domain_init_attr` (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_parent_domain_init_attr {
    /// The protection domain (not NULL).
    pub pd: *mut ibv_pd,
    /// A thread domain, or NULL.
    pub td: *mut ibv_td,
    /// `enum ibv_parent_domain_init_attr_mask`.
    pub comp_mask: u32,
    /// The allocator (with `IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS`).
    pub alloc: Option<ParentDomainAlloc>,
    /// Its free (with `IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS`).
    pub free: Option<ParentDomainFree>,
    /// Passed back to `alloc` and `free` (with `IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT`).
    pub pd_context: *mut c_void,
}

/// `struct ibv_mr` (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_mr {
    /// The context.
    pub context: *mut ibv_context,
    /// The PD.
    pub pd: *mut ibv_pd,
    /// Start address.
    pub addr: *mut c_void,
    /// Length.
    pub length: usize,
    /// Handle.
    pub handle: u32,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
}

/// `struct ibv_mw` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_mw {
    /// The context.
    pub context: *mut ibv_context,
    /// The PD.
    pub pd: *mut ibv_pd,
    /// Remote key.
    pub rkey: u32,
    /// Handle.
    pub handle: u32,
    /// `enum ibv_mw_type`.
    pub type_: u32,
}

/// `struct ibv_mw_bind_info` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_mw_bind_info {
    /// The MR.
    pub mr: *mut ibv_mr,
    /// Start.
    pub addr: u64,
    /// Length.
    pub length: u64,
    /// `enum ibv_access_flags`.
    pub mw_access_flags: c_uint,
}

/// `struct ibv_mw_bind`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_mw_bind {
    /// Work request id.
    pub wr_id: u64,
    /// `enum ibv_send_flags`.
    pub send_flags: c_uint,
    /// What to bind.
    pub bind_info: ibv_mw_bind_info,
}

/// `struct ibv_global_route` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_global_route {
    /// Destination GID.
    pub dgid: ibv_gid,
    /// Flow label.
    pub flow_label: u32,
    /// Source GID index.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// `struct ibv_grh` (40 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_grh {
    /// Version, class, flow (network order).
    pub version_tclass_flow: u32,
    /// Payload length (network order).
    pub paylen: u16,
    /// Next header.
    pub next_hdr: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Source GID.
    pub sgid: ibv_gid,
    /// Destination GID.
    pub dgid: ibv_gid,
}

/// `struct ibv_ah_attr` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_ah_attr {
    /// Global route (valid if `is_global`).
    pub grh: ibv_global_route,
    /// Destination LID.
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate.
    pub static_rate: u8,
    /// Whether `grh` is valid.
    pub is_global: u8,
    /// Port.
    pub port_num: u8,
}

/// `struct ibv_ah` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_ah {
    /// The context.
    pub context: *mut ibv_context,
    /// The PD.
    pub pd: *mut ibv_pd,
    /// Handle.
    pub handle: u32,
}

// ---------------------------------------------------------------------------------------
// CQ
// ---------------------------------------------------------------------------------------

/// `struct ibv_comp_channel` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_comp_channel {
    /// The context.
    pub context: *mut ibv_context,
    /// The pollable fd.
    pub fd: c_int,
    /// CQs using it.
    pub refcnt: c_int,
}

/// `struct ibv_cq` (128 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_cq {
    /// The context.
    pub context: *mut ibv_context,
    /// The channel (or NULL).
    pub channel: *mut ibv_comp_channel,
    /// User context.
    pub cq_context: *mut c_void,
    /// Handle.
    pub handle: u32,
    /// Entries.
    pub cqe: c_int,
    /// Mutex.
    pub mutex: PthreadMutex,
    /// Condition.
    pub cond: PthreadCond,
    /// Completion events acknowledged.
    pub comp_events_completed: u32,
    /// Async events acknowledged.
    pub async_events_completed: u32,
}

/// `struct ibv_poll_cq_attr` (4 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_poll_cq_attr {
    /// Must be 0.
    pub comp_mask: u32,
}

/// `struct ibv_wc_tm_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_wc_tm_info {
    /// Tag.
    pub tag: u64,
    /// Opaque user data.
    pub priv_: u32,
}

/// `struct ibv_cq_ex` (288 bytes): the 128 bytes of `ibv_cq`, then the extended-poll ops
/// (reference §4.1 trap 3). Called with no NULL check.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_cq_ex {
    /// The context.
    pub context: *mut ibv_context,
    /// The channel.
    pub channel: *mut ibv_comp_channel,
    /// User context.
    pub cq_context: *mut c_void,
    /// Handle.
    pub handle: u32,
    /// Entries.
    pub cqe: c_int,
    /// Mutex.
    pub mutex: PthreadMutex,
    /// Condition.
    pub cond: PthreadCond,
    /// Completion events acknowledged.
    pub comp_events_completed: u32,
    /// Async events acknowledged.
    pub async_events_completed: u32,
    /// Valid fields.
    pub comp_mask: u32,
    /// Status of the current completion.
    pub status: u32,
    /// `wr_id` of the current completion.
    pub wr_id: u64,
    /// `ibv_start_poll`.
    pub start_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int>,
    /// `ibv_next_poll`.
    pub next_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int>,
    /// `ibv_end_poll`.
    pub end_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex)>,
    /// `ibv_wc_read_opcode`.
    pub read_opcode: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_vendor_err`.
    pub read_vendor_err: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_byte_len`.
    pub read_byte_len: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_imm_data` / `ibv_wc_read_invalidated_rkey`.
    pub read_imm_data: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_qp_num`.
    pub read_qp_num: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_src_qp`.
    pub read_src_qp: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_wc_flags`.
    pub read_wc_flags: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_uint>,
    /// `ibv_wc_read_slid`.
    pub read_slid: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_sl`.
    pub read_sl: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    /// `ibv_wc_read_dlid_path_bits`.
    pub read_dlid_path_bits: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    /// `ibv_wc_read_completion_ts`.
    pub read_completion_ts: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u64>,
    /// `ibv_wc_read_cvlan`.
    pub read_cvlan: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u16>,
    /// `ibv_wc_read_flow_tag`.
    pub read_flow_tag: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_tm_info`.
    pub read_tm_info: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_wc_tm_info)>,
    /// `ibv_wc_read_completion_wallclock_ns`.
    pub read_completion_wallclock_ns: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u64>,
}

/// `struct ibv_cq_init_attr_ex` (56 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_cq_init_attr_ex {
    /// Minimum entries.
    pub cqe: u32,
    /// User context.
    pub cq_context: *mut c_void,
    /// Channel (or NULL).
    pub channel: *mut ibv_comp_channel,
    /// Completion vector.
    pub comp_vector: u32,
    /// `enum ibv_create_cq_wc_flags`.
    pub wc_flags: u64,
    /// `enum ibv_cq_init_attr_mask`.
    pub comp_mask: u32,
    /// `enum ibv_create_cq_attr_flags`.
    pub flags: u32,
    /// Parent domain.
    pub parent_domain: *mut ibv_pd,
}

/// `struct ibv_moderate_cq`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_moderate_cq {
    /// Completions per event.
    pub cq_count: u16,
    /// Microseconds per event.
    pub cq_period: u16,
}

/// `struct ibv_modify_cq_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_modify_cq_attr {
    /// `enum ibv_cq_attr_mask`.
    pub attr_mask: u32,
    /// Moderation.
    pub moderate: ibv_moderate_cq,
}

// ---------------------------------------------------------------------------------------
// QP, SRQ, work requests
// ---------------------------------------------------------------------------------------

/// `struct ibv_qp_cap` (20 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_qp_cap {
    /// Send WRs.
    pub max_send_wr: u32,
    /// Receive WRs.
    pub max_recv_wr: u32,
    /// Send SGEs.
    pub max_send_sge: u32,
    /// Receive SGEs.
    pub max_recv_sge: u32,
    /// Inline bytes.
    pub max_inline_data: u32,
}

/// `struct ibv_qp` (160 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_qp {
    /// The context.
    pub context: *mut ibv_context,
    /// User context.
    pub qp_context: *mut c_void,
    /// The PD.
    pub pd: *mut ibv_pd,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ (or NULL).
    pub srq: *mut ibv_srq,
    /// Handle.
    pub handle: u32,
    /// QP number.
    pub qp_num: u32,
    /// `enum ibv_qp_state`.
    pub state: u32,
    /// `enum ibv_qp_type`.
    pub qp_type: u32,
    /// Mutex.
    pub mutex: PthreadMutex,
    /// Condition.
    pub cond: PthreadCond,
    /// Async events acknowledged.
    pub events_completed: u32,
}

/// `struct ibv_data_buf`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_data_buf {
    /// Address.
    pub addr: *mut c_void,
    /// Length.
    pub length: usize,
}

/// `struct ibv_qp_ex` (352 bytes): `ibv_qp`, then the work-request builders (reference
/// §4.1 trap 4).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_qp_ex {
    /// The plain QP.
    pub qp_base: ibv_qp,
    /// Valid fields.
    pub comp_mask: u64,
    /// `wr_id` of the WR being built.
    pub wr_id: u64,
    /// `enum ibv_send_flags` of the WR being built.
    pub wr_flags: c_uint,
    /// `ibv_wr_atomic_cmp_swp`.
    pub wr_atomic_cmp_swp: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64)>,
    /// `ibv_wr_atomic_fetch_add`.
    pub wr_atomic_fetch_add: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64)>,
    /// `ibv_wr_bind_mw`.
    pub wr_bind_mw:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_mw, u32, *const ibv_mw_bind_info)>,
    /// `ibv_wr_local_inv`.
    pub wr_local_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    /// `ibv_wr_rdma_read`.
    pub wr_rdma_read: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    /// `ibv_wr_rdma_write`.
    pub wr_rdma_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    /// `ibv_wr_rdma_write_imm`.
    pub wr_rdma_write_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    /// `ibv_wr_send`.
    pub wr_send: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    /// `ibv_wr_send_imm`.
    pub wr_send_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    /// `ibv_wr_send_inv`.
    pub wr_send_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    /// `ibv_wr_send_tso`.
    pub wr_send_tso: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, u16, u16)>,
    /// `ibv_wr_set_ud_addr`.
    pub wr_set_ud_addr: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_ah, u32, u32)>,
    /// `ibv_wr_set_xrc_srqn`.
    pub wr_set_xrc_srqn: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    /// `ibv_wr_set_inline_data`.
    pub wr_set_inline_data: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, usize)>,
    /// `ibv_wr_set_inline_data_list`.
    pub wr_set_inline_data_list:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_data_buf)>,
    /// `ibv_wr_set_sge`.
    pub wr_set_sge: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    /// `ibv_wr_set_sge_list`.
    pub wr_set_sge_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_sge)>,
    /// `ibv_wr_start`.
    pub wr_start: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    /// `ibv_wr_complete`.
    pub wr_complete: Option<unsafe extern "C" fn(*mut ibv_qp_ex) -> c_int>,
    /// `ibv_wr_abort`.
    pub wr_abort: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    /// `ibv_wr_atomic_write`.
    pub wr_atomic_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, *const c_void)>,
}

/// `struct ibv_qp_ex` as rdma-core 45 and later define it: the rdma-core 44 struct above
/// (the installed header's, checked by `tests/abi_layout.rs`) and the builder 45 appended,
/// `wr_flush`. A QP's block begins with it, so a program built against newer headers finds
/// `qp->wr_flush` where it looks, and older programs see the struct they know.
#[repr(C)]
pub struct ibv_qp_ex_45 {
    /// The rdma-core 44 part.
    pub ex: ibv_qp_ex,
    /// `ibv_wr_flush(qp, rkey, remote_addr, len, type, level)`.
    pub wr_flush: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, usize, u8, u8)>,
}

/// `struct ibv_qp_init_attr` (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_qp_init_attr {
    /// User context.
    pub qp_context: *mut c_void,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ (or NULL).
    pub srq: *mut ibv_srq,
    /// Capacities.
    pub cap: ibv_qp_cap,
    /// `enum ibv_qp_type`.
    pub qp_type: u32,
    /// Signal every send.
    pub sq_sig_all: c_int,
}

/// `struct ibv_rx_hash_conf` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_rx_hash_conf {
    /// `enum ibv_rx_hash_function_flags`.
    pub rx_hash_function: u8,
    /// Key length.
    pub rx_hash_key_len: u8,
    /// Key.
    pub rx_hash_key: *mut u8,
    /// `enum ibv_rx_hash_fields`.
    pub rx_hash_fields_mask: u64,
}

/// `struct ibv_qp_init_attr_ex` (136 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_qp_init_attr_ex {
    /// User context.
    pub qp_context: *mut c_void,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ (or NULL).
    pub srq: *mut ibv_srq,
    /// Capacities.
    pub cap: ibv_qp_cap,
    /// `enum ibv_qp_type`.
    pub qp_type: u32,
    /// Signal every send.
    pub sq_sig_all: c_int,
    /// `enum ibv_qp_init_attr_mask`.
    pub comp_mask: u32,
    /// The PD.
    pub pd: *mut ibv_pd,
    /// XRC domain.
    pub xrcd: *mut c_void,
    /// `enum ibv_qp_create_flags`.
    pub create_flags: u32,
    /// TSO header size.
    pub max_tso_header: u16,
    /// RWQ indirection table.
    pub rwq_ind_tbl: *mut c_void,
    /// RX hash.
    pub rx_hash_conf: ibv_rx_hash_conf,
    /// Source QPN.
    pub source_qpn: u32,
    /// `enum ibv_qp_create_send_ops_flags`.
    pub send_ops_flags: u64,
}

/// `struct ibv_qp_attr` (144 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_qp_attr {
    /// `enum ibv_qp_state`.
    pub qp_state: u32,
    /// `enum ibv_qp_state`.
    pub cur_qp_state: u32,
    /// `enum ibv_mtu`.
    pub path_mtu: u32,
    /// `enum ibv_mig_state`.
    pub path_mig_state: u32,
    /// Q_Key.
    pub qkey: u32,
    /// Receive PSN.
    pub rq_psn: u32,
    /// Send PSN.
    pub sq_psn: u32,
    /// Destination QPN.
    pub dest_qp_num: u32,
    /// `enum ibv_access_flags`.
    pub qp_access_flags: c_uint,
    /// Capacities.
    pub cap: ibv_qp_cap,
    /// Primary path.
    pub ah_attr: ibv_ah_attr,
    /// Alternate path.
    pub alt_ah_attr: ibv_ah_attr,
    /// P_Key index.
    pub pkey_index: u16,
    /// Alternate P_Key index.
    pub alt_pkey_index: u16,
    /// SQD async notification.
    pub en_sqd_async_notify: u8,
    /// SQ draining.
    pub sq_draining: u8,
    /// Outgoing reads/atomics.
    pub max_rd_atomic: u8,
    /// Incoming reads/atomics.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code.
    pub min_rnr_timer: u8,
    /// Port.
    pub port_num: u8,
    /// Local ACK timeout code.
    pub timeout: u8,
    /// Retry count.
    pub retry_cnt: u8,
    /// RNR retry count.
    pub rnr_retry: u8,
    /// Alternate port.
    pub alt_port_num: u8,
    /// Alternate timeout.
    pub alt_timeout: u8,
    /// Rate limit (kbps).
    pub rate_limit: u32,
}

/// `struct ibv_sge` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_sge {
    /// Address.
    pub addr: u64,
    /// Length.
    pub length: u32,
    /// Local key.
    pub lkey: u32,
}

/// `ibv_send_wr.wr.rdma`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_rdma {
    /// Remote address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// `ibv_send_wr.wr.atomic`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_atomic {
    /// Remote address.
    pub remote_addr: u64,
    /// Compare (CAS) or add (FAA) operand.
    pub compare_add: u64,
    /// Swap operand.
    pub swap: u64,
    /// Remote key.
    pub rkey: u32,
}

/// `ibv_send_wr.wr.ud`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_ud {
    /// Address handle.
    pub ah: *mut ibv_ah,
    /// Remote QPN.
    pub remote_qpn: u32,
    /// Remote Q_Key.
    pub remote_qkey: u32,
}

/// `ibv_send_wr.wr` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    /// RDMA write / read.
    pub rdma: ibv_send_wr_rdma,
    /// Atomics.
    pub atomic: ibv_send_wr_atomic,
    /// UD.
    pub ud: ibv_send_wr_ud,
}

/// `ibv_send_wr.qp_type.xrc`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_xrc {
    /// Remote SRQ number.
    pub remote_srqn: u32,
}

/// `ibv_send_wr.qp_type`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_qp_type {
    /// XRC.
    pub xrc: ibv_send_wr_xrc,
}

/// `ibv_send_wr.bind_mw`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_bind_mw {
    /// The window.
    pub mw: *mut ibv_mw,
    /// New rkey.
    pub rkey: u32,
    /// What to bind.
    pub bind_info: ibv_mw_bind_info,
}

/// `ibv_send_wr.tso`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_tso {
    /// Header.
    pub hdr: *mut c_void,
    /// Header size.
    pub hdr_sz: u16,
    /// MSS.
    pub mss: u16,
}

/// The anonymous `bind_mw` / `tso` union of `ibv_send_wr` (48 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_ext {
    /// Memory-window bind.
    pub bind_mw: ibv_send_wr_bind_mw,
    /// TSO.
    pub tso: ibv_send_wr_tso,
}

/// `struct ibv_send_wr` (128 bytes). `imm_data` (network order) shares its slot with
/// `invalidate_rkey`; the anonymous `bind_mw`/`tso` union is the field [`ibv_send_wr::ext`]
/// (C code names its members directly).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr {
    /// Work request id.
    pub wr_id: u64,
    /// Next in the list.
    pub next: *mut ibv_send_wr,
    /// Scatter/gather list.
    pub sg_list: *mut ibv_sge,
    /// Entries in `sg_list`.
    pub num_sge: c_int,
    /// `enum ibv_wr_opcode`.
    pub opcode: u32,
    /// `enum ibv_send_flags`.
    pub send_flags: c_uint,
    /// Immediate data (network order) or the rkey to invalidate.
    pub imm_data: u32,
    /// Opcode-specific part.
    pub wr: ibv_send_wr_wr,
    /// QP-type-specific part.
    pub qp_type: ibv_send_wr_qp_type,
    /// `bind_mw` / `tso`.
    pub ext: ibv_send_wr_ext,
}

/// `struct ibv_recv_wr` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_recv_wr {
    /// Work request id.
    pub wr_id: u64,
    /// Next in the list.
    pub next: *mut ibv_recv_wr,
    /// Scatter list.
    pub sg_list: *mut ibv_sge,
    /// Entries in `sg_list`.
    pub num_sge: c_int,
}

/// `struct ibv_srq` (128 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_srq {
    /// The context.
    pub context: *mut ibv_context,
    /// User context.
    pub srq_context: *mut c_void,
    /// The PD.
    pub pd: *mut ibv_pd,
    /// Handle.
    pub handle: u32,
    /// Mutex.
    pub mutex: PthreadMutex,
    /// Condition.
    pub cond: PthreadCond,
    /// Async events acknowledged.
    pub events_completed: u32,
}

/// `struct ibv_srq_attr` (12 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_srq_attr {
    /// WRs.
    pub max_wr: u32,
    /// SGEs per WR.
    pub max_sge: u32,
    /// Limit event threshold.
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_srq_init_attr {
    /// User context.
    pub srq_context: *mut c_void,
    /// Attributes.
    pub attr: ibv_srq_attr,
}

/// `ibv_async_event.element`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_async_event_element {
    /// CQ events.
    pub cq: *mut ibv_cq,
    /// QP events.
    pub qp: *mut ibv_qp,
    /// SRQ events.
    pub srq: *mut ibv_srq,
    /// WQ events.
    pub wq: *mut c_void,
    /// Port events.
    pub port_num: c_int,
}

/// `struct ibv_async_event` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_async_event {
    /// The object the event is about.
    pub element: ibv_async_event_element,
    /// `enum ibv_event_type`.
    pub event_type: u32,
}

// The sizes of Debian 12's `verbs.h` (rdma-core 44, x86_64); tests/abi_layout.rs checks every
// field against the installed header.
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<ibv_device>() == 664);
    assert!(size_of::<ibv_context_ops>() == 256);
    assert!(size_of::<ibv_context>() == 328);
    assert!(size_of::<verbs_context>() == 648);
    assert!(offset_of!(verbs_context, sz) == 312);
    assert!(offset_of!(verbs_context, context) == 320);
    assert!(offset_of!(ibv_context, abi_compat) == 320);
    assert!(size_of::<ibv_device_attr>() == 232);
    assert!(size_of::<ibv_device_attr_ex>() == 400);
    assert!(size_of::<ibv_port_attr>() == 52);
    assert!(size_of::<ibv_cq>() == 128);
    assert!(size_of::<ibv_cq_ex>() == 288);
    assert!(size_of::<ibv_qp>() == 160);
    assert!(size_of::<ibv_qp_ex>() == 352);
    assert!(size_of::<ibv_send_wr>() == 128);
    assert!(size_of::<ibv_qp_attr>() == 144);
    assert!(size_of::<ibv_wc>() == 48);
};
