//! Where a QP's completions go ([`Route`]: its send and receive CQs) and how one is
//! delivered ([`push_completion`]): a CQ that is full under back-pressure holds the
//! completion back, in order; a CQ that overran or is in error is reported, so the QPs
//! completing into it go to error (a CQE is never dropped silently).

use softverbs_cq::{CqProducer, PushError};
use softverbs_proto::{Completion, CqTarget};
use std::collections::{HashMap, VecDeque};

/// Where a QP's completions go.
pub(super) struct Route {
    pub(super) send: CqProducer,
    pub(super) recv: CqProducer,
}

/// Pushes one completion to its CQ. Returns false when it was held back (back-pressure).
pub(super) fn push_completion(
    routes: &HashMap<u32, Route>,
    c: Completion,
    failed_cqs: &mut Vec<u32>,
    held: &mut VecDeque<Completion>,
) -> bool {
    let qpn = c.wc.qp_num();
    let Some(route) = routes.get(&qpn) else {
        return true;
    };
    let cq = match c.cq {
        CqTarget::Send => &route.send,
        CqTarget::Recv => &route.recv,
    };
    match cq.push(c.wc, c.solicited) {
        Ok(()) => true,
        Err(PushError::Full(wc)) => {
            held.push_front(Completion { wc, ..c });
            false
        }
        Err(PushError::Overrun) | Err(PushError::InError) => {
            if !failed_cqs.contains(&qpn) {
                failed_cqs.push(qpn);
            }
            true
        }
        Err(PushError::Destroyed) => true,
    }
}
