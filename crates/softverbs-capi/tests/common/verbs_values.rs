//! `verbs.h` values the library's `verbs_h` module does not carry (rdma-core 44), for the
//! tests that drive QPs through the C exports (`rule_table.rs`, `allocations.rs`, which
//! include this file): `enum ibv_qp_state`, `enum ibv_qp_attr_mask`, `enum ibv_mtu`,
//! `enum ibv_access_flags`. Each test uses some of them.
#![allow(dead_code)]

use std::ffi::c_int;

pub const IBV_QPS_RESET: u32 = 0;
pub const IBV_QPS_INIT: u32 = 1;
pub const IBV_QPS_RTR: u32 = 2;
pub const IBV_QPS_RTS: u32 = 3;
pub const IBV_QP_STATE: c_int = 1 << 0;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_QKEY: c_int = 1 << 6;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;
pub const IBV_MTU_1024: u32 = 3;
pub const IBV_ACCESS_LOCAL_WRITE: u32 = 1 << 0;
pub const IBV_ACCESS_REMOTE_WRITE: u32 = 1 << 1;
pub const IBV_ACCESS_REMOTE_READ: u32 = 1 << 2;
pub const IBV_ACCESS_REMOTE_ATOMIC: u32 = 1 << 3;
