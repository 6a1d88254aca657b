//! What the device reports about itself: [`DeviceAttr`] (`ibv_query_device`) and
//! [`PortAttr`] (`ibv_query_port`), with the constants behind them ([`VENDOR_ID`], the
//! GID table's length). Plain data; [`Device::query_device`](super::Device::query_device)
//! and [`Device::query_port`](super::Device::query_port) fill them in.

use softverbs_proto::Mtu;

/// The vendor id the device reports: outside every vendor table (perftest treats unknown
/// vendors as generic devices).
pub const VENDOR_ID: u32 = 0x00ff_ffff;

/// Entries of the port's GID table: the device's own address at index 0.
pub(super) const GID_TABLE_LEN: u32 = 1;

/// The device's limits (`struct ibv_device_attr`, the fields that mean something here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Node GUID (derived from the address).
    pub node_guid: u64,
    /// Vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Largest registrable region.
    pub max_mr_size: u64,
    /// Page sizes supported.
    pub page_size_cap: u64,
    /// Queue pairs.
    pub max_qp: u32,
    /// Work requests per queue.
    pub max_qp_wr: u32,
    /// Scatter/gather entries per work request.
    pub max_sge: u32,
    /// Completion queues.
    pub max_cq: u32,
    /// Entries per completion queue.
    pub max_cqe: u32,
    /// Memory regions.
    pub max_mr: u32,
    /// Protection domains.
    pub max_pd: u32,
    /// Incoming reads/atomics per QP.
    pub max_qp_rd_atom: u8,
    /// Outgoing reads/atomics per QP.
    pub max_qp_init_rd_atom: u8,
    /// Shared receive queues.
    pub max_srq: u32,
    /// Work requests per SRQ.
    pub max_srq_wr: u32,
    /// Scatter/gather entries per SRQ work request.
    pub max_srq_sge: u32,
    /// Largest inline payload.
    pub max_inline_data: u32,
    /// Atomic guarantees: `IBV_ATOMIC_HCA` (atomic among this device's atomics).
    pub atomic_cap_hca: bool,
    /// Completion timestamp valid bits (`completion_timestamp_mask`).
    pub completion_timestamp_mask: u64,
    /// Device clock in kHz (`hca_core_clock`).
    pub hca_core_clock_khz: u64,
    /// Physical ports.
    pub phys_port_cnt: u8,
}

/// The port's state (`struct ibv_port_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortAttr {
    /// Always `IBV_PORT_ACTIVE`.
    pub active: bool,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU in use.
    pub active_mtu: Mtu,
    /// GID table length.
    pub gid_tbl_len: u32,
    /// Link layer: Ethernet (RoCE).
    pub link_layer_ethernet: bool,
}
