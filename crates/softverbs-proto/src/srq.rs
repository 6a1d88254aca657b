//! Shared receive queues: receive WQEs several QPs of one engine consume in arrival
//! order, with the armed limit of `ibv_modify_srq(3)`.

use std::collections::VecDeque;

use crate::wr::RecvWr;

/// What an SRQ is created with (`struct ibv_srq_init_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqInit {
    /// Queue depth.
    pub max_wr: u32,
    /// Scatter/gather entries per WR.
    pub max_sge: u32,
    /// Limit: when the number of WQEs falls below it, `SrqLimitReached` is raised once
    /// and the limit disarms (0 = disarmed).
    pub srq_limit: u32,
}

impl Default for SrqInit {
    fn default() -> Self {
        SrqInit {
            max_wr: 256,
            max_sge: 4,
            srq_limit: 0,
        }
    }
}

/// A shared receive queue.
#[derive(Debug)]
pub(crate) struct Srq {
    pub wqes: VecDeque<RecvWr>,
    pub max_wr: u32,
    pub max_sge: u32,
    /// Armed limit (0 = disarmed).
    pub limit: u32,
    /// QPs attached.
    pub users: u32,
}

impl Srq {
    pub fn new(init: SrqInit) -> Self {
        Srq {
            wqes: VecDeque::new(),
            max_wr: init.max_wr,
            max_sge: init.max_sge,
            limit: init.srq_limit,
            users: 0,
        }
    }
}
