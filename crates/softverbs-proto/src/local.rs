//! Local operations of the send queue: memory window binds (`IBV_WR_BIND_MW`, and the work
//! request `ibv_bind_mw(3)` posts) and local invalidations (`IBV_WR_LOCAL_INV`).
//!
//! They change local memory state rather than send a packet, so the requester stops at one
//! ([`SendOp::is_local`]) and [`Engine::execute_local_operations`](crate::Engine::execute_local_operations)
//! runs it once it heads the send queue: every earlier work request has completed (rxe's
//! local invalidate fence, IBTA 10.6.5.1, which rxe applies to `LOCAL_INV`; applied here
//! to binds as well, which only delays them), so its effect is ordered after theirs and
//! before every later one's, and it completes in order. A refused bind completes with
//! `IBV_WC_MW_BIND_ERR`, a refused local invalidation with `IBV_WC_LOC_QP_OP_ERR` (rxe's
//! `rxe_do_local_ops`); either moves the QP to the error state like any failed work
//! request.

use softverbs_cq::WcStatus;

use crate::memory::{Accessor, Memory};
use crate::qp::{Ctx, Qp};
use crate::wr::SendOp;

impl Qp {
    /// Executes the local operations heading the send queue; returns how many ran.
    pub(crate) fn execute_local_operations(
        &mut self,
        mem: &mut impl Memory,
        ctx: &mut Ctx<'_>,
    ) -> usize {
        let by = Accessor::qp(self.init.pd, self.qpn);
        let mut ran = 0;
        // Each pass completes (removes) the head, so the queue bounds the loop.
        while self.has_local_head() {
            let Some(head) = self.sq.front() else {
                break;
            };
            let status = match head.wr.op {
                SendOp::BindMw(bind) => match mem.bind_window(by, &bind) {
                    Ok(rkey) => {
                        tracing::debug!(qpn = self.qpn, rkey, "memory window bound");
                        WcStatus::Success
                    }
                    Err(error) => {
                        tracing::debug!(qpn = self.qpn, %error, "memory window bind refused");
                        WcStatus::MwBindErr
                    }
                },
                SendOp::LocalInv { invalidate_rkey } => {
                    match mem.invalidate_local(by, invalidate_rkey) {
                        Ok(()) => WcStatus::Success,
                        Err(error) => {
                            tracing::debug!(
                                qpn = self.qpn,
                                rkey = invalidate_rkey,
                                %error,
                                "local invalidate refused"
                            );
                            WcStatus::LocQpOpErr
                        }
                    }
                }
                _ => break,
            };
            ran += 1;
            self.complete_head(status, 0, ctx);
        }
        ran
    }
}
