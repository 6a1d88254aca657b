//! What the device reports about itself: [`DeviceAttr`] (`ibv_query_device`) and
//! [`PortAttr`] (`ibv_query_port`), with what is behind them ([`VENDOR_ID`], the GID
//! table). Plain data; [`Device::query_device`](super::Device::query_device)
//! and [`Device::query_port`](super::Device::query_port) fill them in.

use crate::transport::Gid;
use softverbs_proto::Mtu;
use std::net::IpAddr;

/// The vendor id the device reports: outside every vendor table (perftest treats unknown
/// vendors as generic devices).
pub const VENDOR_ID: u32 = 0x00ff_ffff;

/// The port's GID table for a device on `address`, laid out as kernel rxe lays out the
/// table of an interface holding that address (RoCEv2 entries only): index 0 the
/// link-local GID ([`softverbs_proto::link_local_gid`]: made from the address, so that a
/// peer's device reaches it), index 1 the GID of the address itself (`::ffff:a.b.c.d`
/// for IPv4, the address for IPv6). A device on a link-local IPv6 address has that one
/// GID, as rxe's interface whose only address is link-local. Programs written for rxe
/// use index 1 for IPv4 RoCEv2 (`ibv_rc_pingpong -g 1`); older habits use 0; both reach
/// a softverbs peer.
pub(super) fn gid_table(address: IpAddr) -> Vec<Gid> {
    let link_local = Gid(softverbs_proto::link_local_gid(address));
    let own = Gid::from_ip(address);
    if link_local == own {
        vec![own]
    } else {
        vec![link_local, own]
    }
}

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
    /// Memory windows (type 1 and type 2B, as rxe: `IBV_DEVICE_MEM_WINDOW`,
    /// `IBV_DEVICE_MEM_WINDOW_TYPE_2B`).
    pub max_mw: u32,
    /// Protection domains.
    pub max_pd: u32,
    /// Multicast groups (`max_mcast_grp`, rxe's limit).
    pub max_mcast_grp: u32,
    /// QPs one multicast group holds (`max_mcast_qp_attach`).
    pub max_mcast_qp_attach: u32,
    /// Attachments over all groups (`max_total_mcast_qp_attach`).
    pub max_total_mcast_qp_attach: u32,
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
    /// On-demand paging (`ibv_query_device_ex(3)`: `odp_caps`).
    pub odp: OdpCaps,
}

/// On-demand paging capabilities (`struct ibv_odp_caps`; the bits are
/// `enum ibv_odp_general_caps` and `enum ibv_odp_transport_cap_bits`, same values).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OdpCaps {
    /// `general_caps`: [`OdpCaps::SUPPORT`], [`OdpCaps::SUPPORT_IMPLICIT`].
    pub general: u64,
    /// `per_transport_caps.rc_odp_caps`.
    pub rc: u32,
    /// `per_transport_caps.uc_odp_caps`.
    pub uc: u32,
    /// `per_transport_caps.ud_odp_caps`.
    pub ud: u32,
}

impl OdpCaps {
    /// `IBV_ODP_SUPPORT`.
    pub const SUPPORT: u64 = 1 << 0;
    /// `IBV_ODP_SUPPORT_IMPLICIT`.
    pub const SUPPORT_IMPLICIT: u64 = 1 << 1;
    /// `IBV_ODP_SUPPORT_SEND`.
    pub const SEND: u32 = 1 << 0;
    /// `IBV_ODP_SUPPORT_RECV`.
    pub const RECV: u32 = 1 << 1;
    /// `IBV_ODP_SUPPORT_WRITE`.
    pub const WRITE: u32 = 1 << 2;
    /// `IBV_ODP_SUPPORT_READ`.
    pub const READ: u32 = 1 << 3;
    /// `IBV_ODP_SUPPORT_ATOMIC`.
    pub const ATOMIC: u32 = 1 << 4;
    /// `IBV_ODP_SUPPORT_SRQ_RECV`.
    pub const SRQ_RECV: u32 = 1 << 5;

    /// What the device offers: nothing where on-demand paging is not
    /// ([`crate::memory::ON_DEMAND_PAGING`]); else explicit and implicit regions, and per
    /// transport what rxe reports (`rxe_init_device_param`: RC send, receive, write,
    /// read, atomic and SRQ receive; UD send, receive and SRQ receive), plus UC send,
    /// receive, write and SRQ receive, which rxe leaves out: every transport here reaches
    /// an on-demand region through the same memory table, so a UC QP takes one as any
    /// other. rxe also sets the kernel's `IB_ODP_SUPPORT_FLUSH` and
    /// `IB_ODP_SUPPORT_ATOMIC_WRITE` (bits 6 and 7), which the rdma-core 44 `verbs.h`
    /// does not name; they are left out.
    pub const fn offered() -> Self {
        if !crate::memory::ON_DEMAND_PAGING {
            return OdpCaps {
                general: 0,
                rc: 0,
                uc: 0,
                ud: 0,
            };
        }
        OdpCaps {
            general: Self::SUPPORT | Self::SUPPORT_IMPLICIT,
            rc: Self::SEND | Self::RECV | Self::WRITE | Self::READ | Self::ATOMIC | Self::SRQ_RECV,
            uc: Self::SEND | Self::RECV | Self::WRITE | Self::SRQ_RECV,
            ud: Self::SEND | Self::RECV | Self::SRQ_RECV,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn table(address: &str) -> Vec<String> {
        gid_table(address.parse().unwrap())
            .iter()
            .map(|g| g.to_string())
            .collect()
    }

    // Kernel rxe's table of an interface (roce_gid_mgmt: the default link-local GID, then
    // the IPv4 addresses as IPv4-mapped GIDs, then the other IPv6 addresses), one RoCEv2
    // entry each; the link-local GID made from the address.
    #[test]
    fn the_gid_table_is_link_local_then_the_address_as_rxe_lays_it_out() {
        assert_eq!(
            table("127.0.0.2"),
            ["fe80::ffff:7f00:2", "::ffff:127.0.0.2"]
        );
        assert_eq!(table("10.99.0.1"), ["fe80::ffff:a63:1", "::ffff:10.99.0.1"]);
        assert_eq!(table("fd99::1"), ["fe80::1", "fd99::1"]);
        assert_eq!(table("::1"), ["fe80::1", "::1"]);
        assert_eq!(table("fe80::5054:ff:fe99:1"), ["fe80::5054:ff:fe99:1"]);
    }
}
