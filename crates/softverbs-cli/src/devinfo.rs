//! `softverbs devinfo`: the device as `ibv_devinfo(1)` shows it.

use crate::output::outln;
use crate::Error;
use softverbs::*;
use std::net::{IpAddr, Ipv6Addr};

/// Options of `softverbs devinfo`.
#[derive(clap::Args, Clone, Debug)]
pub struct DevinfoArgs {
    /// Print every device attribute, as `ibv_devinfo -v`.
    #[arg(short = 'v', long = "verbose")]
    pub verbose: bool,
}

fn guid(value: u64) -> String {
    let b = value.to_be_bytes();
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

fn mtu_code(mtu: Mtu) -> u32 {
    match mtu.bytes() {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        _ => 5,
    }
}

/// Runs `softverbs devinfo`.
pub fn run(args: &DevinfoArgs) -> Result<(), Error> {
    let ctx = Context::open()?;
    let attr = ctx.query_device();
    let port = ctx.query_port(1)?;
    let transport = match ctx.network() {
        NetworkKind::Udp => "RoCEv2 over UDP",
        NetworkKind::InProcess => "in-process",
    };
    outln!("hca_id:\t{}", ctx.name())?;
    outln!("\ttransport:\t\t\tInfiniBand (0)")?;
    outln!("\tfw_ver:\t\t\t\tn/a")?;
    outln!("\tnode_guid:\t\t\t{}", guid(attr.node_guid))?;
    outln!("\tsys_image_guid:\t\t\t{}", guid(attr.node_guid))?;
    outln!("\tvendor_id:\t\t\t0x{:04x}", attr.vendor_id)?;
    outln!("\tvendor_part_id:\t\t\t{}", attr.vendor_part_id)?;
    outln!("\thw_ver:\t\t\t\tn/a")?;
    outln!("\tphys_port_cnt:\t\t\t{}", attr.phys_port_cnt)?;
    if args.verbose {
        outln!("\tmax_mr_size:\t\t\t0x{:x}", attr.max_mr_size)?;
        outln!("\tpage_size_cap:\t\t\t0x{:x}", attr.page_size_cap)?;
        outln!("\tmax_qp:\t\t\t\t{}", attr.max_qp)?;
        outln!("\tmax_qp_wr:\t\t\t{}", attr.max_qp_wr)?;
        outln!("\tmax_sge:\t\t\t{}", attr.max_sge)?;
        outln!("\tmax_cq:\t\t\t\t{}", attr.max_cq)?;
        outln!("\tmax_cqe:\t\t\t{}", attr.max_cqe)?;
        outln!("\tmax_mr:\t\t\t\t{}", attr.max_mr)?;
        outln!("\tmax_pd:\t\t\t\t{}", attr.max_pd)?;
        outln!("\tmax_qp_rd_atom:\t\t\t{}", attr.max_qp_rd_atom)?;
        outln!("\tmax_res_rd_atom:\t\t0")?;
        outln!("\tmax_qp_init_rd_atom:\t\t{}", attr.max_qp_init_rd_atom)?;
        outln!(
            "\tatomic_cap:\t\t\t{}",
            if attr.atomic_cap_hca {
                "ATOMIC_HCA (1)"
            } else {
                "ATOMIC_NONE (0)"
            }
        )?;
        outln!("\tmax_srq:\t\t\t{}", attr.max_srq)?;
        outln!("\tmax_srq_wr:\t\t\t{}", attr.max_srq_wr)?;
        outln!("\tmax_srq_sge:\t\t\t{}", attr.max_srq_sge)?;
        outln!("\tmax_inline_data:\t\t{}", attr.max_inline_data)?;
        outln!("\tmax_pkeys:\t\t\t1")?;
        outln!("\tlocal_ca_ack_delay:\t\t15")?;
        outln!(
            "\tcompletion timestamp_mask:\t\t\t0x{:016x}",
            attr.completion_timestamp_mask
        )?;
        outln!("\thca_core_clock:\t\t\t{}kHZ", attr.hca_core_clock_khz)?;
    }
    outln!("\t\tport:\t1")?;
    outln!(
        "\t\t\tstate:\t\t\t{}",
        if port.active {
            "PORT_ACTIVE (4)"
        } else {
            "PORT_DOWN (1)"
        }
    )?;
    outln!(
        "\t\t\tmax_mtu:\t\t{} ({})",
        port.max_mtu.bytes(),
        mtu_code(port.max_mtu)
    )?;
    outln!(
        "\t\t\tactive_mtu:\t\t{} ({})",
        port.active_mtu.bytes(),
        mtu_code(port.active_mtu)
    )?;
    outln!("\t\t\tsm_lid:\t\t\t0")?;
    outln!("\t\t\tport_lid:\t\t0")?;
    outln!("\t\t\tport_lmc:\t\t0x00")?;
    outln!(
        "\t\t\tlink_layer:\t\t{}",
        if port.link_layer_ethernet {
            "Ethernet"
        } else {
            "InfiniBand"
        }
    )?;
    if args.verbose {
        outln!("\t\t\tgid_tbl_len:\t\t{}", port.gid_tbl_len)?;
        outln!("\t\t\tpkey_tbl_len:\t\t1")?;
        outln!("\t\t\tphys_state:\t\tLINK_UP (5)")?;
        for index in 0..port.gid_tbl_len {
            if let Some(gid) = ctx.gid(index) {
                let v6 = Ipv6Addr::from(gid.0);
                outln!("\t\t\tGID[{index:>3}]:\t\t{v6}, RoCE v2")?;
            }
        }
    } else if let Some(gid) = ctx.gid(0) {
        outln!("\t\t\tGID[  0]:\t\t{}, RoCE v2", Ipv6Addr::from(gid.0))?;
    }
    let address = ctx.device().address();
    let mapped = match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(address),
        v4 => v4,
    };
    outln!("\t\t\taddress:\t\t{mapped} ({transport}, UDP port 4791)")?;
    Ok(())
}
