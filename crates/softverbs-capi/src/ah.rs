//! Address handles.
//!
//! | function | version | status |
//! |---|---|---|
//! | `ibv_create_ah`, `ibv_destroy_ah` | 1.1 | real; RoCE needs a GRH: `is_global = 0` is `EINVAL` |
//! | `ibv_init_ah_from_wc`, `ibv_create_ah_from_wc` | 1.1 | real: the reply address from a UD receive's GRH area (IPv4 or IPv6 header), `sgid_index` the receiving address's GID index |
//! | `ibv_resolve_eth_l2_from_gid` | 1.1 | documented failure (`EOPNOTSUPP`): no Ethernet layer 2 under UDP |

use crate::abi::*;
use crate::boundary::{errno_code, errno_of, minus_one, pointer, Errno};
use crate::handles::{Block, ContextBlock, DeviceEntry, PdBlock, Tagged};
use crate::pd::{PdParent, PdUse};
use crate::verbs_h::IBV_WC_GRH;
use softverbs::core::engine::AddressVector;
use std::ffi::c_int;

/// The library's part of an address handle.
pub struct AhState {
    /// Where it points.
    pub av: AddressVector,
    /// The handle of its protection domain (a UD QP of another PD refuses it).
    pub pd: u32,
    /// The device's address handle (it holds the PD).
    id: u32,
    entry: &'static DeviceEntry,
    _pd: PdUse,
}

impl Tagged for AhState {
    const MAGIC: u64 = u64::from_be_bytes(*b"svah\0\0\0\x01");
}

/// An address handle as C sees it, followed by its state.
pub type AhBlock = Block<ibv_ah, AhState>;

/// The engine's address vector for an `ibv_ah_attr`: `EINVAL` for another port than 1 or
/// no GRH (on RoCE the GRH carries the destination address).
pub fn address_vector(attr: &ibv_ah_attr) -> Result<AddressVector, Errno> {
    if attr.port_num != 1 || attr.is_global == 0 {
        return Err(libc::EINVAL);
    }
    // SAFETY: every 16-byte pattern is a valid `[u8; 16]`.
    let dgid = unsafe { attr.grh.dgid.raw };
    Ok(AddressVector {
        dgid,
        sgid_index: attr.grh.sgid_index,
        hop_limit: attr.grh.hop_limit,
        traffic_class: attr.grh.traffic_class,
        flow_label: attr.grh.flow_label & 0xf_ffff,
        sl: attr.sl,
        port_num: attr.port_num,
        is_global: true,
    })
}

/// The `ibv_ah_attr` of an address vector.
pub fn ah_attr(av: &AddressVector) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: av.dgid },
            flow_label: av.flow_label,
            sgid_index: av.sgid_index,
            hop_limit: av.hop_limit,
            traffic_class: av.traffic_class,
        },
        dlid: 0,
        sl: av.sl,
        src_path_bits: 0,
        static_rate: 0,
        is_global: u8::from(av.is_global),
        port_num: av.port_num,
    }
}

/// `ibv_create_ah(3)`: `NULL` with errno (`EINVAL` for a bad PD, port or missing GRH).
///
/// # Safety
///
/// `pd` is NULL or a live PD; `attr` is NULL or readable.
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    pointer(|| {
        // SAFETY: `pd` is NULL or a live PD (this function's `# Safety`).
        let PdParent {
            hold,
            context,
            ctx,
            handle: pd_handle,
        } = unsafe { PdUse::acquire(pd) }?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: `attr` is readable (this function's `# Safety`; not NULL here).
        let av = address_vector(&unsafe { attr.read() })?;
        let id = ctx
            .entry
            .device
            .create_ah(pd_handle, av)
            .map_err(errno_of)?;
        Ok(AhBlock::allocate(
            ibv_ah {
                context,
                pd,
                handle: 0,
            },
            AhState {
                av,
                pd: pd_handle,
                id,
                entry: ctx.entry,
                _pd: hold,
            },
        ))
    })
}
symver!(ibv_create_ah, "IBVERBS_1.1");

/// `ibv_destroy_ah(3)`.
///
/// # Safety
///
/// `ah` is NULL or a live address handle, not used again after a successful call.
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    errno_code(|| {
        // SAFETY: `ah` is NULL or a live AH (this function's `# Safety`).
        let state = unsafe { AhBlock::state(ah) }?;
        state.entry.device.destroy_ah(state.id).map_err(errno_of)?;
        // SAFETY: `ah` passed `state` above and the caller gives the AH up with this call.
        unsafe { AhBlock::free(ah) };
        Ok(())
    })
}
symver!(ibv_destroy_ah, "IBVERBS_1.1");

/// `ibv_init_ah_from_wc(3)`: the address to reply to the sender of a UD receive, read
/// from the GRH area as libibverbs reads it: an IPv4 header 20 bytes in (RoCEv2 over IPv4,
/// the IPv4-mapped GID of its source) or an IPv6 header (its source GID), the version
/// told apart as libibverbs does; `sgid_index` is the index of the receiving address (the
/// header's destination) in the GID table, as libibverbs finds it with `ibv_query_gid`.
/// -1 with `EINVAL` when the completion has no GRH or the destination is not in the table,
/// `EPROTONOSUPPORT` for a header that is neither.
///
/// # Safety
///
/// `context` is NULL or an open context; `wc` and `grh` are readable, `ah_attr` writable
/// (NULL gives `EINVAL`).
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr_out: *mut ibv_ah_attr,
) -> c_int {
    minus_one(|| {
        // SAFETY: `context` is NULL or an open context (this function's `# Safety`).
        let block = unsafe { ContextBlock::from_ptr(context) }?;
        if wc.is_null() || grh.is_null() || ah_attr_out.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: `wc` is readable and `grh` readable for the 40 bytes of a GRH (this
        // function's `# Safety`; not NULL here).
        let (wc, area) = unsafe { (wc.read(), grh.cast::<[u8; 40]>().read_unaligned()) };
        if port_num != 1 || wc.raw().wc_flags & IBV_WC_GRH == 0 {
            return Err(libc::EINVAL);
        }
        let route = grh_route(&area)?;
        let sgid_index = block
            .entry
            .device
            .gid_table()
            .iter()
            .position(|gid| gid.octets() == route.local)
            .ok_or(libc::EINVAL)?;
        let flow = u32::from_be_bytes([area[0], area[1], area[2], area[3]]);
        let av = AddressVector {
            dgid: route.source,
            sgid_index: sgid_index as u8,
            hop_limit: route.hop_limit,
            traffic_class: route.traffic_class,
            flow_label: flow & 0xf_ffff,
            sl: wc.raw().sl,
            port_num,
            is_global: true,
        };
        // SAFETY: `ah_attr_out` is writable (this function's `# Safety`; not NULL here).
        unsafe { ah_attr_out.write(ah_attr(&av)) };
        Ok(0)
    })
}

/// What a UD receive's GRH area says of its packet, as GIDs.
#[derive(Debug, PartialEq, Eq)]
struct GrhRoute {
    /// The sender's GID (the IPv4-mapped form for IPv4).
    source: [u8; 16],
    /// The GID the packet was addressed to.
    local: [u8; 16],
    hop_limit: u8,
    traffic_class: u8,
}

/// Reads a GRH area (reference §3.4): an IPv6 header, or 20 bytes then an IPv4 header.
/// Which one is told as libibverbs tells it: IPv6 if the first nibble says 6, unless the
/// bytes at 20 are an IPv4 header without options whose checksum verifies.
fn grh_route(area: &[u8; 40]) -> Result<GrhRoute, Errno> {
    let ipv4 = &area[20..40];
    let is_ipv4 = if area[0] >> 4 != 6 {
        if ipv4[0] >> 4 != 4 {
            return Err(libc::EPROTONOSUPPORT);
        }
        true
    } else {
        ipv4[0] == 0x45 && ipv4_checksum_verifies(ipv4)
    };
    let gid = |bytes: &[u8]| {
        let mut gid = [0u8; 16];
        if bytes.len() == 4 {
            gid[10] = 0xff;
            gid[11] = 0xff;
            gid[12..].copy_from_slice(bytes);
        } else {
            gid.copy_from_slice(bytes);
        }
        gid
    };
    if is_ipv4 {
        return Ok(GrhRoute {
            source: gid(&ipv4[12..16]),
            local: gid(&ipv4[16..20]),
            hop_limit: ipv4[8],
            traffic_class: ipv4[1],
        });
    }
    if area[6] != libc::IPPROTO_UDP as u8 {
        // RoCE v1 (next header 0x1B) or anything else: not a RoCEv2 packet.
        return Err(libc::EPROTONOSUPPORT);
    }
    let flow = u32::from_be_bytes([area[0], area[1], area[2], area[3]]);
    Ok(GrhRoute {
        source: gid(&area[8..24]),
        local: gid(&area[24..40]),
        hop_limit: area[7],
        traffic_class: ((flow >> 20) & 0xff) as u8,
    })
}

/// Whether a 20-byte IPv4 header's checksum verifies (RFC 791: the ones'-complement sum
/// of its 16-bit words, checksum included, is 0xffff).
fn ipv4_checksum_verifies(header: &[u8]) -> bool {
    let mut sum: u32 = header
        .chunks_exact(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum == 0xffff
}
symver!(ibv_init_ah_from_wc, "IBVERBS_1.1");

/// `ibv_create_ah_from_wc(3)`.
///
/// # Safety
///
/// As [`ibv_init_ah_from_wc`] and [`ibv_create_ah`].
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port_num: u8,
) -> *mut ibv_ah {
    pointer(|| {
        // SAFETY: `pd` is NULL or a live PD (this function's `# Safety`).
        unsafe { PdBlock::state(pd) }?;
        let mut attr = ah_attr(&AddressVector::default());
        // SAFETY: `pd` passed `PdBlock::state`, so `(*pd).context` is its live C field;
        // `wc` and `grh` are readable (this function's `# Safety`); `attr` is a local.
        let rc = unsafe { ibv_init_ah_from_wc((*pd).context, port_num, wc, grh, &mut attr) };
        if rc != 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: `pd` is a live PD (checked above, this function's `# Safety`); `attr` is
        // a local.
        let ah = unsafe { ibv_create_ah(pd, &mut attr) };
        if ah.is_null() {
            Err(libc::EINVAL)
        } else {
            Ok(ah)
        }
    })
}
symver!(ibv_create_ah_from_wc, "IBVERBS_1.1");

unsupported! {
    /// `ibv_resolve_eth_l2_from_gid` (provider helper): no Ethernet layer 2 under UDP.
    minus_one "IBVERBS_1.1" fn ibv_resolve_eth_l2_from_gid(*mut ibv_context, *mut ibv_ah_attr, *mut u8, *mut u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{ibv_close_device, ibv_free_device_list, ibv_get_device_list};
    use softverbs::core::cq::{WcFlags, WcOpcode};
    use std::net::Ipv4Addr;

    /// A GRH area as a UD receive gets it for IPv4 (reference §3.4): 20 zero bytes, then
    /// the sender's IPv4 header with a valid checksum.
    fn ipv4_area(src: Ipv4Addr, dst: Ipv4Addr, tos: u8, ttl: u8) -> [u8; 40] {
        let mut area = [0u8; 40];
        let h = &mut area[20..];
        h[0] = 0x45;
        h[1] = tos;
        h[2..4].copy_from_slice(&48u16.to_be_bytes());
        h[6] = 0x40;
        h[8] = ttl;
        h[9] = 17;
        h[12..16].copy_from_slice(&src.octets());
        h[16..20].copy_from_slice(&dst.octets());
        let mut sum: u32 = h
            .chunks_exact(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        area
    }

    // libibverbs' ibv_init_ah_from_wc (verbs.c, get_grh_header_version): a GRH area with
    // no IPv6 version nibble holds an IPv4 header at byte 20; its source is the reply's
    // destination, as an IPv4-mapped GID.
    #[test]
    fn an_ipv4_grh_area_gives_the_ipv4_mapped_source() {
        let src = Ipv4Addr::new(127, 0, 0, 9);
        let dst = Ipv4Addr::new(127, 0, 0, 10);
        let route = grh_route(&ipv4_area(src, dst, 0x20, 17)).unwrap();
        assert_eq!(
            route,
            GrhRoute {
                source: src.to_ipv6_mapped().octets(),
                local: dst.to_ipv6_mapped().octets(),
                hop_limit: 17,
                traffic_class: 0x20,
            }
        );
    }

    #[test]
    fn an_ipv6_grh_area_gives_its_source_gid_and_other_headers_are_refused() {
        let mut area = [0u8; 40];
        area[..4].copy_from_slice(&(0x6000_0000u32 | (0x24 << 20) | 0x12345).to_be_bytes());
        area[6] = 17;
        area[7] = 9;
        area[23] = 1; // ::1
        area[24] = 0xfd; // fd00::2
        area[39] = 2;
        let route = grh_route(&area).unwrap();
        assert_eq!(route.source[15], 1);
        assert_eq!((route.local[0], route.local[15]), (0xfd, 2));
        assert_eq!((route.hop_limit, route.traffic_class), (9, 0x24));
        area[6] = 0x1b; // RoCE v1's next header: not RoCEv2
        assert_eq!(grh_route(&area), Err(libc::EPROTONOSUPPORT));
        assert_eq!(grh_route(&[0u8; 40]), Err(libc::EPROTONOSUPPORT));
    }

    // ibv_init_ah_from_wc(3) on the device: the reply goes to the sender's address, from
    // the GID index the packet arrived on (libibverbs finds the GRH's destination in the
    // GID table: index 1 for an IPv4 device).
    #[test]
    fn a_reply_address_handle_uses_the_gid_index_of_the_receiving_address() {
        // SAFETY: a NULL count pointer is allowed.
        let list = unsafe { ibv_get_device_list(std::ptr::null_mut()) };
        assert!(!list.is_null());
        // SAFETY: the list has one device and a NULL terminator.
        let context = unsafe { crate::device::ibv_open_device(*list) };
        // SAFETY: the list from ibv_get_device_list, freed once.
        unsafe { ibv_free_device_list(list) };
        assert!(!context.is_null());
        // SAFETY: an open context.
        let block = unsafe { ContextBlock::from_ptr(context) }.unwrap();
        let std::net::IpAddr::V4(own) = block.entry.device.address() else {
            panic!("the test device is on IPv4");
        };
        let peer = Ipv4Addr::new(127, 0, 0, 9);
        let mut wc = ibv_wc::success(1, WcOpcode::Recv, 0x11).with_flags(WcFlags::GRH);
        let mut area = ipv4_area(peer, own, 0, 64);
        let mut attr = ah_attr(&AddressVector::default());
        // SAFETY: an open context, a readable wc and 40-byte GRH area, a writable attr.
        let rc = unsafe {
            ibv_init_ah_from_wc(context, 1, &mut wc, area.as_mut_ptr().cast(), &mut attr)
        };
        assert_eq!(rc, 0);
        // SAFETY: any 16 bytes are a valid GID.
        assert_eq!(unsafe { attr.grh.dgid.raw }, peer.to_ipv6_mapped().octets());
        assert_eq!(attr.grh.sgid_index, 1);
        assert_eq!(
            (attr.is_global, attr.port_num, attr.grh.hop_limit),
            (1, 1, 64)
        );
        // Addressed to an address that is not the device's: not in the GID table.
        let mut elsewhere = ipv4_area(peer, Ipv4Addr::new(127, 0, 0, 8), 0, 64);
        // SAFETY: as above.
        let rc = unsafe {
            ibv_init_ah_from_wc(
                context,
                1,
                &mut wc,
                elsewhere.as_mut_ptr().cast(),
                &mut attr,
            )
        };
        assert_eq!(rc, -1);
        // SAFETY: the context from ibv_open_device.
        assert_eq!(unsafe { ibv_close_device(context) }, 0);
    }
}
