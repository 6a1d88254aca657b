//! Extended polling (`ibv_start_poll(3)`, `ibv_next_poll`, `ibv_end_poll`, the
//! `ibv_wc_read_*` readers): the [`PollBatch`] guard and the `start_poll` of both consumer
//! handles.
//!
//! Guarantees: a batch holds the consumer lock of a thread-safe CQ from `start_poll` until
//! it is dropped (a single-threaded CQ needs none: the batch borrows it mutably); dropping
//! it consumes exactly the completions it was positioned on, publishing the head once; a
//! field that was not requested at creation reads as [`FieldNotRequested`], never stale data.

use super::biased_lock::Hold;
use super::{CompletionQueue, CqShared, SingleThreadedCq, STATE_ERROR};
use crate::clock::DeviceClock;
use crate::error::{FieldNotRequested, PollError};
use crate::ring::Entry;
use crate::sync::{Arc, Ordering};
use crate::wc::{WcFields, WcFlags, WcOpcode, WcStatus, WorkCompletion};
use std::fmt;

impl CompletionQueue {
    /// Starts an extended poll (`ibv_start_poll`): `Ok(None)` when the CQ is empty (the man
    /// page's `ENOENT`, a normal outcome), otherwise a [`PollBatch`] positioned on the
    /// first completion, holding the consumer lock until it is dropped (`ibv_end_poll`).
    pub fn start_poll(&self) -> Result<Option<PollBatch<'_>>, PollError> {
        if self.shared.state.load(Ordering::Relaxed) == STATE_ERROR {
            return Err(PollError::Overrun);
        }
        if self.shared.looks_empty() {
            return Ok(None);
        }
        let hold = self.shared.consumer.lock.acquire();
        let batch = PollBatch::start(&self.shared, Some(hold));
        if batch.is_none() {
            self.shared.consumer.lock.release(hold);
        }
        Ok(batch)
    }
}

impl SingleThreadedCq {
    /// Starts an extended poll; see [`CompletionQueue::start_poll`].
    pub fn start_poll(&mut self) -> Result<Option<PollBatch<'_>>, PollError> {
        if self.shared.state.load(Ordering::Relaxed) == STATE_ERROR {
            return Err(PollError::Overrun);
        }
        Ok(PollBatch::start(&self.shared, None))
    }
}

/// One extended-poll window (`ibv_start_poll` … `ibv_end_poll`): positioned on a
/// completion; [`PollBatch::next`] moves on (`ibv_next_poll`); dropping it ends the batch
/// (`ibv_end_poll`), consuming every completion it was positioned on.
///
/// Field readers exist for every field, but only those requested at creation return a
/// value; the others return [`FieldNotRequested`], never stale data.
pub struct PollBatch<'a> {
    shared: &'a Arc<CqShared>,
    /// The consumer lock this batch holds (`None`: a single-threaded CQ, or the
    /// thread-domain promise of `unsynchronized.rs`).
    hold: Option<Hold>,
    /// The head when the batch started.
    start: u64,
    /// Completions the batch was positioned on.
    delivered: u64,
    /// The position of the current entry.
    pos: u64,
    current: Entry,
    wallclock_offset: Option<i128>,
    exhausted: bool,
}

impl<'a> PollBatch<'a> {
    pub(super) fn start(shared: &'a Arc<CqShared>, hold: Option<Hold>) -> Option<Self> {
        let start = shared.consumer.head.load(Ordering::Relaxed);
        let mut head = start;
        let Some(entry) = shared.peek_entry(&mut head) else {
            if head != start {
                shared.publish_head(start, head, 0);
            }
            return None;
        };
        Some(PollBatch {
            shared,
            hold,
            start,
            delivered: 1,
            pos: head,
            current: entry,
            wallclock_offset: None,
            exhausted: false,
        })
    }

    /// Moves to the next completion (`ibv_next_poll`). `false` when there is none (the man
    /// page's `ENOENT`); the batch must still be ended, which dropping it does.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> bool {
        if self.exhausted {
            return false;
        }
        let mut next = self.pos + 1;
        match self.shared.peek_entry(&mut next) {
            Some(entry) => {
                self.pos = next;
                self.current = entry;
                self.delivered += 1;
                true
            }
            None => {
                self.exhausted = true;
                false
            }
        }
    }

    fn require(&self, field: WcFields) -> Result<(), FieldNotRequested> {
        if self.shared.fields.contains(field) {
            Ok(())
        } else {
            Err(FieldNotRequested(field))
        }
    }

    fn raw(&self) -> crate::wc::RawFields {
        self.current.wc.raw()
    }

    /// The current completion as a whole `ibv_wc` (what `ibv_poll_cq` would return).
    pub fn completion(&self) -> &WorkCompletion {
        &self.current.wc
    }

    /// `cq_ex->wr_id`.
    pub fn wr_id(&self) -> u64 {
        self.current.wc.wr_id()
    }

    /// `cq_ex->status`.
    pub fn status(&self) -> WcStatus {
        self.current.wc.status()
    }

    /// `ibv_wc_read_opcode` (always available).
    pub fn opcode(&self) -> WcOpcode {
        WcOpcode::from_raw(self.raw().opcode)
    }

    /// `ibv_wc_read_vendor_err` (always available).
    pub fn vendor_err(&self) -> u32 {
        self.raw().vendor_err
    }

    /// `ibv_wc_read_wc_flags` (always available).
    pub fn wc_flags(&self) -> WcFlags {
        WcFlags::from_bits_retain(self.raw().wc_flags)
    }

    /// `ibv_wc_read_byte_len` (`IBV_WC_EX_WITH_BYTE_LEN`).
    pub fn byte_len(&self) -> Result<u32, FieldNotRequested> {
        self.require(WcFields::BYTE_LEN)?;
        Ok(self.raw().byte_len)
    }

    /// `ibv_wc_read_imm_data` in host order (`IBV_WC_EX_WITH_IMM`).
    pub fn imm_data(&self) -> Result<u32, FieldNotRequested> {
        self.require(WcFields::IMM)?;
        Ok(u32::from_be(self.raw().imm_or_rkey))
    }

    /// `ibv_wc_read_imm_data` exactly as C gets it (network order) (`IBV_WC_EX_WITH_IMM`).
    pub fn imm_data_raw(&self) -> Result<u32, FieldNotRequested> {
        self.require(WcFields::IMM)?;
        Ok(self.raw().imm_or_rkey)
    }

    /// `ibv_wc_read_invalidated_rkey` (`IBV_WC_EX_WITH_IMM`, which covers it).
    pub fn invalidated_rkey(&self) -> Result<u32, FieldNotRequested> {
        self.require(WcFields::IMM)?;
        Ok(self.raw().imm_or_rkey)
    }

    /// `ibv_wc_read_qp_num` (`IBV_WC_EX_WITH_QP_NUM`).
    pub fn qp_num(&self) -> Result<u32, FieldNotRequested> {
        self.require(WcFields::QP_NUM)?;
        Ok(self.raw().qp_num)
    }

    /// `ibv_wc_read_src_qp` (`IBV_WC_EX_WITH_SRC_QP`).
    pub fn src_qp(&self) -> Result<u32, FieldNotRequested> {
        self.require(WcFields::SRC_QP)?;
        Ok(self.raw().src_qp)
    }

    /// `ibv_wc_read_pkey_index` (covered by the standard fields; always available).
    pub fn pkey_index(&self) -> u16 {
        self.raw().pkey_index
    }

    /// `ibv_wc_read_slid` (`IBV_WC_EX_WITH_SLID`).
    pub fn slid(&self) -> Result<u32, FieldNotRequested> {
        self.require(WcFields::SLID)?;
        Ok(u32::from(self.raw().slid))
    }

    /// `ibv_wc_read_sl` (`IBV_WC_EX_WITH_SL`).
    pub fn sl(&self) -> Result<u8, FieldNotRequested> {
        self.require(WcFields::SL)?;
        Ok(self.raw().sl)
    }

    /// `ibv_wc_read_dlid_path_bits` (`IBV_WC_EX_WITH_DLID_PATH_BITS`).
    pub fn dlid_path_bits(&self) -> Result<u8, FieldNotRequested> {
        self.require(WcFields::DLID_PATH_BITS)?;
        Ok(self.raw().dlid_path_bits)
    }

    /// `ibv_wc_read_completion_ts`: the device clock (ns) when the completion was produced
    /// (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`).
    pub fn completion_ts(&self) -> Result<u64, FieldNotRequested> {
        self.require(WcFields::COMPLETION_TIMESTAMP)?;
        Ok(self.current.timestamp)
    }

    /// `ibv_wc_read_completion_wallclock_ns`
    /// (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`).
    pub fn completion_wallclock_ns(&mut self) -> Result<u64, FieldNotRequested> {
        self.require(WcFields::COMPLETION_TIMESTAMP_WALLCLOCK)?;
        let offset = *self
            .wallclock_offset
            .get_or_insert_with(DeviceClock::wallclock_offset);
        Ok(DeviceClock::to_wallclock(self.current.timestamp, offset))
    }

    /// `ibv_wc_read_cvlan` (`IBV_WC_EX_WITH_CVLAN`).
    pub fn cvlan(&self) -> Result<u16, FieldNotRequested> {
        self.require(WcFields::CVLAN)?;
        Ok(self.current.extra.cvlan)
    }

    /// `ibv_wc_read_flow_tag` (`IBV_WC_EX_WITH_FLOW_TAG`).
    pub fn flow_tag(&self) -> Result<u32, FieldNotRequested> {
        self.require(WcFields::FLOW_TAG)?;
        Ok(self.current.extra.flow_tag)
    }

    /// `ibv_wc_read_tm_info`: (tag, priv) (`IBV_WC_EX_WITH_TM_INFO`).
    pub fn tm_info(&self) -> Result<(u64, u32), FieldNotRequested> {
        self.require(WcFields::TM_INFO)?;
        Ok((self.current.extra.tm_tag, self.current.extra.tm_priv))
    }
}

impl Drop for PollBatch<'_> {
    fn drop(&mut self) {
        // ibv_end_poll: every completion the batch was positioned on is consumed.
        self.shared
            .publish_head(self.start, self.pos + 1, self.delivered);
        if let Some(hold) = self.hold {
            self.shared.consumer.lock.release(hold);
        }
    }
}

impl fmt::Debug for PollBatch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PollBatch")
            .field("pos", &self.pos)
            .field("current", &self.current.wc)
            .finish()
    }
}
