//! Address handles.
//!
//! | function | version | status |
//! |---|---|---|
//! | `ibv_create_ah`, `ibv_destroy_ah`, `ibv_create_ah_from_wc`, `ibv_init_ah_from_wc` | 1.1 | documented failure (next slice) |
//! | `ibv_resolve_eth_l2_from_gid` | 1.1 | documented failure (a soft device has no L2 neighbour; only libmlx5 imports it) |

use crate::abi::*;

unsupported! {
    /// `ibv_create_ah(3)`.
    null "IBVERBS_1.1" fn ibv_create_ah(*mut ibv_pd, *mut ibv_ah_attr) -> *mut ibv_ah
}
unsupported! {
    /// `ibv_destroy_ah(3)`.
    errno "IBVERBS_1.1" fn ibv_destroy_ah(*mut ibv_ah)
}
unsupported! {
    /// `ibv_create_ah_from_wc(3)`.
    null "IBVERBS_1.1" fn ibv_create_ah_from_wc(*mut ibv_pd, *mut ibv_wc, *mut ibv_grh, u8) -> *mut ibv_ah
}
unsupported! {
    /// `ibv_init_ah_from_wc(3)`.
    minus_one "IBVERBS_1.1" fn ibv_init_ah_from_wc(*mut ibv_context, u8, *mut ibv_wc, *mut ibv_grh, *mut ibv_ah_attr)
}
unsupported! {
    /// `ibv_resolve_eth_l2_from_gid` (provider helper).
    minus_one "IBVERBS_1.1" fn ibv_resolve_eth_l2_from_gid(*mut ibv_context, *mut ibv_ah_attr, *mut u8, *mut u16)
}
