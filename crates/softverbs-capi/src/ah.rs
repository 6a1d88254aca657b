//! Address handles.
//!
//! | function | version | status |
//! |---|---|---|
//! | `ibv_create_ah`, `ibv_destroy_ah` | 1.1 | real; RoCE needs a GRH: `is_global = 0` is `EINVAL` |
//! | `ibv_init_ah_from_wc`, `ibv_create_ah_from_wc` | 1.1 | real: the reply address from a UD receive's GRH |
//! | `ibv_resolve_eth_l2_from_gid` | 1.1 | documented failure (`EOPNOTSUPP`): no Ethernet layer 2 under UDP |

use crate::abi::*;
use crate::boundary::{errno_code, errno_of, minus_one, pointer, Errno};
use crate::handles::{Block, DeviceEntry, PdBlock, Tagged};
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

/// `ibv_init_ah_from_wc(3)`: the address to reply to the sender of a UD receive: its GID
/// is the GRH's source GID. -1 with `EINVAL` when the completion has no GRH.
///
/// # Safety
///
/// `wc` and `grh` are readable, `ah_attr` writable (NULL gives `EINVAL`).
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr_out: *mut ibv_ah_attr,
) -> c_int {
    minus_one(|| {
        if context.is_null() || wc.is_null() || grh.is_null() || ah_attr_out.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: `wc` and `grh` are readable (this function's `# Safety`; not NULL here).
        let (wc, grh) = unsafe { (wc.read(), grh.read()) };
        if port_num != 1 || wc.raw().wc_flags & IBV_WC_GRH == 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: every 16-byte pattern is a valid `[u8; 16]`.
        let sgid = unsafe { grh.sgid.raw };
        let flow = u32::from_be(grh.version_tclass_flow);
        let av = AddressVector {
            dgid: sgid,
            sgid_index: 0,
            hop_limit: grh.hop_limit,
            traffic_class: ((flow >> 20) & 0xff) as u8,
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
