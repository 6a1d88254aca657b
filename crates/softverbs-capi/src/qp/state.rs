//! The QP block: the library's state of a QP after the `ibv_qp_ex` C sees.

use crate::abi::*;
use crate::boundary::Errno;
use crate::handles::{Block, DeviceEntry, Tagged};
use crate::pd::PdUse;
use softverbs::core::engine::{QpCaps, QpType, SendWr};
use std::cell::UnsafeCell;

/// The library's part of a QP.
pub struct QpState {
    /// The QP number.
    pub qpn: u32,
    /// The device.
    pub entry: &'static DeviceEntry,
    pub(super) qp_type: QpType,
    pub(super) caps: QpCaps,
    /// Created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`: `ibv_qp_to_qp_ex` hands it out.
    pub(super) extended: bool,
    pub(super) _pd: PdUse,
    /// The work requests built since `ibv_wr_start` (one thread at a time, between
    /// `ibv_wr_start` and `ibv_wr_complete` / `ibv_wr_abort`, as `ibv_wr_post(3)` requires).
    pub(super) batch: UnsafeCell<Batch>,
}

/// Work requests built with the `ibv_qp_ex` builders, posted by `ibv_wr_complete`.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) requests: Vec<SendWr>,
    /// The first error of the batch (a builder cannot return one): `ibv_wr_complete`
    /// returns it and posts nothing.
    pub(super) error: Option<Errno>,
}

impl Batch {
    /// Empties the batch (`ibv_wr_start`, `ibv_wr_abort`), keeping the list's room: a
    /// batch built after it allocates nothing until it holds more requests than any before.
    pub(super) fn clear(&mut self) {
        self.requests.clear();
        self.error = None;
    }
}

impl Tagged for QpState {
    const MAGIC: u64 = u64::from_be_bytes(*b"svqp\0\0\0\x01");
}

/// A QP as C sees it (an `ibv_qp_ex`, whose first member is the `ibv_qp`), followed by its
/// state. [`Block::state`] takes either pointer.
pub type QpBlock = Block<ibv_qp_ex_45, QpState>;
