//! CQ moderation (`ibv_modify_cq(3)` with `IBV_CQ_MODERATE`): [`Moderation`], the count
//! of qualifying completions held back while an armed CQ waits for more, and the period
//! timer the device calls.
//!
//! Guarantees: with moderation active, an armed CQ's event fires after `count` qualifying
//! completions or `period_us` after the first of them, whichever comes first; without it,
//! every qualifying completion fires. The lock-free `moderation_active` flag keeps the
//! unmoderated path from taking the moderation lock.

use super::notify::ARM_NONE;
use super::{CqShared, STATE_ERROR};
use crate::clock::DeviceClock;
use crate::error::ModifyError;
use crate::sync::{lock, Arc, Ordering};

/// CQ moderation (`struct ibv_moderate_cq`): an armed CQ raises its event after `count`
/// completions or `period_us` microseconds after the first one, whichever comes first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moderation {
    /// Completions per event (`cq_count`); 0 or 1 means every completion.
    pub count: u16,
    /// Microseconds from the first pending completion to the event (`cq_period`); 0 means
    /// no time bound.
    pub period_us: u16,
}

impl Moderation {
    fn is_active(&self) -> bool {
        self.count > 1 || self.period_us > 0
    }
}

/// CQs of this process with moderation set (`ibv_modify_cq(3)`), changed under each CQ's
/// moderation lock. A plain `std` atomic, not a modelled one: loom models no moderation.
static MODERATED_CQS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Whether any CQ of this process has moderation set. While none has, no CQ has a
/// moderation deadline ([`CqProducer::moderation_deadline`](super::CqProducer::moderation_deadline)
/// is `None` for every CQ), so a device that looks for the earliest deadline of its CQs
/// after every run of its engine need not visit them (one load where it visited every CQ:
/// a cache line of each, for a program with a CQ per connection). A push that held an event
/// back for moderation took the CQ's moderation lock, which `modify` changes this count
/// under: the thread that made that push sees the count of that CQ afterwards.
pub fn moderation_in_use() -> bool {
    MODERATED_CQS.load(std::sync::atomic::Ordering::Relaxed) > 0
}

#[derive(Default)]
pub(super) struct ModerationState {
    config: Moderation,
    pending: u32,
    first_pending_at: u64,
}

impl CqShared {
    /// Counts a completion that qualifies for the armed event (device clock `at`, 0 if
    /// not timestamped) against moderation: `true` if the event waits for more completions
    /// or for the period, `false` if it fires now.
    pub(super) fn moderation_holds_back(&self, at: u64) -> bool {
        if self.moderation_active.load(Ordering::Relaxed) {
            let mut m = lock(&self.moderation);
            if m.config.is_active() {
                m.pending += 1;
                if m.pending == 1 {
                    m.first_pending_at = if at != 0 { at } else { DeviceClock::now() };
                }
                if m.pending < u32::from(m.config.count.max(1)) {
                    return true;
                }
                m.pending = 0;
            }
        }
        false
    }

    /// Sets moderation (`ibv_modify_cq(3)`).
    pub(super) fn modify(&self, moderation: Moderation) -> Result<(), ModifyError> {
        if self.state.load(Ordering::Relaxed) == STATE_ERROR {
            return Err(ModifyError::InError);
        }
        let mut m = lock(&self.moderation);
        m.config = moderation;
        m.pending = 0;
        let active = moderation.is_active();
        if active != self.moderation_active.load(Ordering::Relaxed) {
            count_moderated(active);
        }
        self.moderation_active.store(active, Ordering::Release);
        Ok(())
    }

    /// The CQ goes: it no longer counts as moderated ([`moderation_in_use`]).
    pub(super) fn forget_moderation(&self) {
        if self.moderation_active.load(Ordering::Relaxed) {
            count_moderated(false);
        }
    }

    pub(super) fn moderation_deadline(&self) -> Option<u64> {
        if !self.moderation_active.load(Ordering::Relaxed) {
            return None;
        }
        let m = lock(&self.moderation);
        (m.pending > 0 && m.config.period_us > 0)
            .then(|| m.first_pending_at + u64::from(m.config.period_us) * 1000)
    }

    pub(super) fn moderation_timer(this: &Arc<Self>, now: u64) -> bool {
        {
            let mut m = lock(&this.moderation);
            if m.pending == 0
                || m.config.period_us == 0
                || now < m.first_pending_at + u64::from(m.config.period_us) * 1000
            {
                return false;
            }
            m.pending = 0;
        }
        let before = this.events.raised();
        Self::fire(this, |arm| arm != ARM_NONE);
        this.events.raised() != before
    }
}

/// One more CQ with moderation set (`true`), or one fewer.
fn count_moderated(active: bool) {
    use std::sync::atomic::Ordering::Relaxed;
    if active {
        MODERATED_CQS.fetch_add(1, Relaxed);
    } else {
        MODERATED_CQS.fetch_sub(1, Relaxed);
    }
}
