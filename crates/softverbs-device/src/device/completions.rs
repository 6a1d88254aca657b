//! Where a QP's completions go ([`Route`]: its send and receive CQs) and how the
//! completions of a run are delivered ([`deliver_completions`]): each CQ's through one
//! producer burst (one hold of its producer lock however many the run produced for it), in
//! the order the engine produced them. A CQ that is full under back-pressure holds the
//! completion back, and every later one for that CQ, in order; a CQ that overran or is in
//! error is reported, so the QPs completing into it go to error (a CQE is never dropped
//! silently).
//!
//! Order: IBTA requires the completions of a work queue to reach its CQ in order; a CQ's
//! completions are pushed in the order the engine produced them, so the order of each QP's
//! on each CQ holds. Completions of different CQs are independent: a run's are grouped by
//! CQ, and a CQ refusing one (back-pressure) holds back only its own.

use softverbs_cq::{CqProducer, ProducerBurst, PushError};
use softverbs_proto::{Completion, CqTarget};
use std::cell::RefCell;
use std::collections::VecDeque;

/// The CQs each QP completes into, by QPN (FxHash: the QPNs are the engine's, not the
/// network's, and a lookup is on every completion).
pub(super) type Routes = rustc_hash::FxHashMap<u32, Route>;

/// Where a QP's completions go.
pub(super) struct Route {
    pub(super) send: CqProducer,
    pub(super) recv: CqProducer,
}

thread_local! {
    /// The completions of a run for the CQs after its first, each with its CQ's id, kept
    /// aside while the first CQ's burst lasts: reused from run to run (taken while in use,
    /// as the runtime's buffers are), so a run that completes into several CQs allocates
    /// nothing either.
    static ASIDE: RefCell<Vec<(u64, Completion)>> = const { RefCell::new(Vec::new()) };
}

/// Delivers a run's completions: first those `held` back by a full back-pressure CQ in
/// earlier runs, then those the run `produced`, each CQ's through one burst, in order.
/// Leaves in `held` what a back-pressure CQ refused (that completion and every later one
/// for its CQ), and adds to `failed_qps` (once each) the QPs whose completion met a CQ that
/// overran or is in error. A completion of a QP without a route (destroyed) or for a
/// destroyed CQ is dropped, as a push to it would be.
///
/// The completions of the first CQ met are pushed as they come, the others kept aside; then
/// what was kept aside is sorted by CQ (a stable sort: each CQ's keep their order) and each
/// CQ's pushed in one burst. So a run that completes into one CQ (a batch of receives)
/// takes one pass, a run into several a sort of the completions after the first CQ's, and
/// each CQ's producer lock is taken once, with no other CQ's held. A run without
/// completions, with none held back, costs what looking costs (inlined).
#[inline]
pub(super) fn deliver_completions(
    routes: &Routes,
    held: &mut VecDeque<Completion>,
    mut produced: impl FnMut() -> Option<Completion>,
    failed_qps: &mut Vec<u32>,
) {
    let next = if held.is_empty() {
        let Some(c) = produced() else {
            return;
        };
        Some(c)
    } else {
        None
    };
    deliver(routes, held, next, produced, failed_qps);
}

/// [`deliver_completions`] once there is something to deliver: what is `held`, then
/// `next` (the run's first completion, if already taken), then the rest of `produced`.
fn deliver(
    routes: &Routes,
    held: &mut VecDeque<Completion>,
    next: Option<Completion>,
    mut produced: impl FnMut() -> Option<Completion>,
    failed_qps: &mut Vec<u32>,
) {
    let mut delivery = Delivery {
        routes,
        last: None,
        first: None,
        aside: None,
    };
    // A refused completion goes back to the end of `held`, behind those taken here.
    for _ in 0..held.len() {
        if let Some(c) = held.pop_front() {
            delivery.offer(c, held, failed_qps);
        }
    }
    for c in next.into_iter().chain(std::iter::from_fn(&mut produced)) {
        delivery.offer(c, held, failed_qps);
    }
    // Ends the first CQ's burst before the next is taken.
    drop(delivery.first.take());
    let Some(mut aside) = delivery.aside.take() else {
        return;
    };
    aside.sort_by_key(|&(cq_id, _)| cq_id);
    for group in aside.chunk_by(|a, b| a.0 == b.0) {
        // The CQ of the group's first completion is the group's (its route was there a
        // moment ago, and nothing changed the routes since).
        let Some(cq) = delivery.cq_of(&group[0].1) else {
            continue;
        };
        let mut serving = Serving::new(cq);
        for &(_, c) in group {
            serving.push(c, held, failed_qps);
        }
    }
    aside.clear();
    ASIDE.with(|cell| *cell.borrow_mut() = aside);
}

/// The state of one [`deliver_completions`].
struct Delivery<'r> {
    routes: &'r Routes,
    /// The last route looked up, by QPN: a batch's completions are mostly one QP's, and a
    /// lookup hashes (SipHash) the QPN.
    last: Option<(u32, &'r Route)>,
    /// The first CQ met, served as its completions come.
    first: Option<Serving<'r>>,
    /// The completions of the other CQs, once there are any (taken from [`ASIDE`]).
    aside: Option<Vec<(u64, Completion)>>,
}

impl<'r> Delivery<'r> {
    /// Pushes `c` if it is for the first CQ met, else keeps it aside.
    fn offer(&mut self, c: Completion, held: &mut VecDeque<Completion>, failed_qps: &mut Vec<u32>) {
        let Some(cq) = self.cq_of(&c) else {
            return;
        };
        match &mut self.first {
            // The same handle (the same QP's) first: no load.
            Some(serving) if std::ptr::eq(serving.cq, cq) || serving.cq_id == cq.cq_id() => {
                serving.push(c, held, failed_qps)
            }
            Some(_) => self
                .aside
                .get_or_insert_with(|| ASIDE.with(|cell| std::mem::take(&mut *cell.borrow_mut())))
                .push((cq.cq_id(), c)),
            None => self
                .first
                .insert(Serving::new(cq))
                .push(c, held, failed_qps),
        }
    }

    /// The CQ `c` goes to, if its QP still has a route.
    fn cq_of(&mut self, c: &Completion) -> Option<&'r CqProducer> {
        let qpn = c.wc.qp_num();
        let route = match self.last {
            Some((last, route)) if last == qpn => route,
            _ => {
                let route = self.routes.get(&qpn)?;
                self.last = Some((qpn, route));
                route
            }
        };
        Some(match c.cq {
            CqTarget::Send => &route.send,
            CqTarget::Recv => &route.recv,
        })
    }
}

/// A CQ being delivered to: its burst, and whether it refused a completion (then every later
/// one for it is held back too, to keep their order).
struct Serving<'r> {
    /// The handle the burst was taken through, and the CQ's id (other QPs' handles of it
    /// are other values).
    cq: &'r CqProducer,
    cq_id: u64,
    burst: ProducerBurst<'r>,
    refused: bool,
}

impl<'r> Serving<'r> {
    fn new(cq: &'r CqProducer) -> Self {
        Serving {
            cq,
            cq_id: cq.cq_id(),
            burst: cq.burst(),
            refused: false,
        }
    }

    /// Pushes `c`, one of this CQ's completions.
    fn push(&mut self, c: Completion, held: &mut VecDeque<Completion>, failed_qps: &mut Vec<u32>) {
        if self.refused {
            held.push_back(c);
            return;
        }
        match self.burst.push(c.wc, c.solicited) {
            Ok(()) => {}
            Err(PushError::Full(wc)) => {
                self.refused = true;
                held.push_back(Completion { wc, ..c });
            }
            Err(PushError::Overrun) | Err(PushError::InError) => {
                let qpn = c.wc.qp_num();
                if !failed_qps.contains(&qpn) {
                    failed_qps.push(qpn);
                }
            }
            Err(PushError::Destroyed) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    //! Delivery by bursts against the reference it replaced, one push per completion: the
    //! same completions in the same order per CQ, the same overrun (the CQ in error, its
    //! notice once, the same QPs failed), the same events (`ibv_req_notify_cq(3)`, solicited
    //! only, moderation); and one burst per CQ per run.

    use super::*;
    use softverbs_cq::{
        CompletionChannel, CompletionQueue, CqBuilder, CqStats, Moderation, OverrunPolicy,
        WcOpcode, WcStatus, WorkCompletion,
    };
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Work request `wr_id` of QP `qpn` completed, for its send or its receive CQ.
    fn completion(qpn: u32, cq: CqTarget, wr_id: u64) -> Completion {
        let opcode = match cq {
            CqTarget::Send => WcOpcode::Send,
            CqTarget::Recv => WcOpcode::Recv,
        };
        Completion {
            cq,
            wc: WorkCompletion::success(wr_id, opcode, qpn),
            solicited: false,
        }
    }

    /// A send CQ and a receive CQ on one channel, shared by QPs 1, 2 and 3 (each QP's route
    /// holds its own producer handles, as the device's do), counting overrun notices.
    struct Fixture {
        send: CompletionQueue,
        recv: CompletionQueue,
        channel: CompletionChannel,
        routes: Routes,
        overrun_notices: Arc<AtomicUsize>,
    }

    fn fixture(send: (u32, OverrunPolicy), recv: (u32, OverrunPolicy)) -> Fixture {
        let channel = CompletionChannel::new().unwrap();
        let overrun_notices = Arc::new(AtomicUsize::new(0));
        let cq = |(cqe, policy): (u32, OverrunPolicy)| {
            let notices = overrun_notices.clone();
            CqBuilder::new(cqe)
                .overrun(policy)
                .channel(&channel)
                .overrun_sink(Arc::new(move |_| {
                    notices.fetch_add(1, Ordering::Relaxed);
                }))
                .build()
                .unwrap()
        };
        let (send, recv) = (cq(send), cq(recv));
        let routes = (1..=3)
            .map(|qpn| {
                let route = Route {
                    send: send.producer(),
                    recv: recv.producer(),
                };
                (qpn, route)
            })
            .collect();
        Fixture {
            send,
            recv,
            channel,
            routes,
            overrun_notices,
        }
    }

    /// Delivers `run` as the completions of one run; returns the QPs failed.
    fn deliver(f: &Fixture, held: &mut VecDeque<Completion>, run: &[Completion]) -> Vec<u32> {
        let mut failed = Vec::new();
        let mut run = run.iter().copied();
        deliver_completions(&f.routes, held, || run.next(), &mut failed);
        failed
    }

    /// The reference: one push per completion, as the device pushed before bursts.
    fn push_one_at_a_time(f: &Fixture, run: &[Completion]) -> Vec<u32> {
        let mut failed = Vec::new();
        for c in run {
            let qpn = c.wc.qp_num();
            let route = &f.routes[&qpn];
            let cq = match c.cq {
                CqTarget::Send => &route.send,
                CqTarget::Recv => &route.recv,
            };
            match cq.push(c.wc, c.solicited) {
                Ok(()) | Err(PushError::Destroyed) => {}
                Err(PushError::Full(_)) => panic!("the reference has no back-pressure"),
                Err(PushError::Overrun) | Err(PushError::InError) => {
                    if !failed.contains(&qpn) {
                        failed.push(qpn);
                    }
                }
            }
        }
        failed
    }

    /// What an application and the device can see after a delivery.
    #[derive(Debug, PartialEq)]
    struct Outcome {
        /// Each CQ's figures, its bursts left out (they are what differs).
        stats: [CqStats; 2],
        polled: [Vec<WorkCompletion>; 2],
        /// Events on the channel for each CQ.
        events: [usize; 2],
        overrun_notices: usize,
        failed: Vec<u32>,
    }

    fn outcome(f: &Fixture, mut failed: Vec<u32>) -> Outcome {
        let stats = [f.send.stats(), f.recv.stats()].map(|s| CqStats { bursts: 0, ..s });
        let polled = [&f.send, &f.recv].map(poll_all);
        let mut events = [0, 0];
        while let Some(event) = f.channel.try_get_event().unwrap() {
            events[usize::from(event.is_for(f.recv.id()))] += 1;
        }
        // Over several runs: the QPs that failed in any.
        failed.sort_unstable();
        failed.dedup();
        Outcome {
            stats,
            polled,
            events,
            overrun_notices: f.overrun_notices.load(Ordering::Relaxed),
            failed,
        }
    }

    fn poll_all(cq: &CompletionQueue) -> Vec<WorkCompletion> {
        let mut all = Vec::new();
        let mut wcs = [WorkCompletion::default(); 16];
        while let Ok(n @ 1..) = cq.poll(&mut wcs) {
            all.extend_from_slice(&wcs[..n]);
        }
        all
    }

    /// `n` completions of QPs 1, 2 and 3 in turn, into the send and receive CQs in a
    /// pattern that interleaves them (wr_id is the position in the run).
    fn interleaved(n: u64) -> Vec<Completion> {
        (0..n)
            .map(|i| {
                let cq = if i % 3 == 1 {
                    CqTarget::Send
                } else {
                    CqTarget::Recv
                };
                completion(1 + (i % 3) as u32, cq, i)
            })
            .collect()
    }

    /// Delivers `runs` (each one run) by bursts and one at a time, each to a fresh
    /// `fixture()` prepared by `prepare`, and checks the two outcomes are the same.
    fn same_as_one_at_a_time(
        fixture: impl Fn() -> Fixture,
        prepare: impl Fn(&Fixture),
        runs: &[Vec<Completion>],
    ) -> Outcome {
        let (batched, reference) = (fixture(), fixture());
        prepare(&batched);
        prepare(&reference);
        let mut held = VecDeque::new();
        let (mut failed, mut failed_reference) = (Vec::new(), Vec::new());
        for run in runs {
            let bursts_before = [batched.send.stats().bursts, batched.recv.stats().bursts];
            failed.extend(deliver(&batched, &mut held, run));
            failed_reference.extend(push_one_at_a_time(&reference, run));
            assert!(held.is_empty(), "no back-pressure here");
            // One burst for each CQ the run completed into.
            for (i, target) in [CqTarget::Send, CqTarget::Recv].into_iter().enumerate() {
                let bursts = [&batched.send, &batched.recv][i].stats().bursts;
                let expected = u64::from(run.iter().any(|c| c.cq == target));
                assert_eq!(bursts - bursts_before[i], expected, "{target:?} CQ");
            }
        }
        let got = outcome(&batched, failed);
        assert_eq!(got, outcome(&reference, failed_reference));
        got
    }

    #[test]
    fn a_run_completing_into_two_cqs_pushes_each_through_one_burst_in_order() {
        let f = fixture((64, OverrunPolicy::Error), (64, OverrunPolicy::Error));
        let run = interleaved(48);
        let mut held = VecDeque::new();
        assert!(deliver(&f, &mut held, &run).is_empty());
        assert!(held.is_empty());
        let (send, recv) = (f.send.stats(), f.recv.stats());
        assert_eq!((send.produced, send.bursts), (16, 1));
        assert_eq!((recv.produced, recv.bursts), (32, 1));
        // Each CQ's completions in the order of the run (each QP's among them, IBTA).
        for (cq, target) in [(&f.send, CqTarget::Send), (&f.recv, CqTarget::Recv)] {
            let order: Vec<u64> = run
                .iter()
                .filter(|c| c.cq == target)
                .map(|c| c.wc.wr_id())
                .collect();
            let polled: Vec<u64> = poll_all(cq).iter().map(|wc| wc.wr_id()).collect();
            assert_eq!(polled, order, "{target:?} CQ");
        }
    }

    #[test]
    fn a_run_completing_into_many_cqs_pushes_each_through_one_burst_in_order() {
        // Eight QPs, each with a send and a receive CQ of its own; the CQ ids do not
        // follow the order the run meets them in.
        let cqs: Vec<CompletionQueue> = (0..16)
            .map(|_| CqBuilder::new(64).build().unwrap())
            .rev()
            .collect();
        let routes: Routes = (0..8)
            .map(|qp| {
                let route = Route {
                    send: cqs[2 * qp].producer(),
                    recv: cqs[2 * qp + 1].producer(),
                };
                (qp as u32 + 1, route)
            })
            .collect();
        let run: Vec<Completion> = (0..200)
            .map(|i: u64| {
                let cq = if i % 5 < 2 {
                    CqTarget::Send
                } else {
                    CqTarget::Recv
                };
                completion(1 + (i * 7 % 8) as u32, cq, i)
            })
            .collect();
        let mut completions = run.iter().copied();
        let (mut held, mut failed) = (VecDeque::new(), Vec::new());
        deliver_completions(&routes, &mut held, || completions.next(), &mut failed);
        assert!(held.is_empty() && failed.is_empty());
        for (i, cq) in cqs.iter().enumerate() {
            let target = [CqTarget::Send, CqTarget::Recv][i % 2];
            let order: Vec<u64> = run
                .iter()
                .filter(|c| c.cq == target && c.wc.qp_num() == i as u32 / 2 + 1)
                .map(|c| c.wc.wr_id())
                .collect();
            let polled: Vec<u64> = poll_all(cq).iter().map(|wc| wc.wr_id()).collect();
            assert_eq!(polled, order, "CQ {i}");
            assert_eq!(cq.stats().bursts, u64::from(!order.is_empty()), "CQ {i}");
        }
    }

    #[test]
    fn a_run_of_one_cq_takes_one_burst_and_the_next_run_another() {
        // A receive batch of 32 packets completing 32 receives: one producer-lock hold.
        let f = fixture((64, OverrunPolicy::Error), (64, OverrunPolicy::Error));
        let run: Vec<_> = (0..32).map(|i| completion(1, CqTarget::Recv, i)).collect();
        let mut held = VecDeque::new();
        deliver(&f, &mut held, &run);
        assert_eq!((f.recv.stats().produced, f.recv.stats().bursts), (32, 1));
        deliver(&f, &mut held, &run[..1]);
        assert_eq!((f.recv.stats().produced, f.recv.stats().bursts), (33, 2));
        // A run without completions takes no lock.
        deliver(&f, &mut held, &[]);
        assert_eq!(f.recv.stats().bursts, 2);
        assert_eq!(f.send.stats().bursts, 0);
    }

    #[test]
    fn an_overrun_in_the_middle_of_a_burst_fails_the_cq_and_its_qps_as_single_pushes_do() {
        // ibv_poll_cq(3): "In case of a CQ overrun, the async event IBV_EVENT_CQ_ERR will be
        // triggered, and the CQ cannot be used." The completion that overran and every
        // later one for the CQ are lost, and their QPs go to error (reference §3.7).
        let fixture = || fixture((64, OverrunPolicy::Error), (8, OverrunPolicy::Error));
        let capacity = u64::from(fixture().recv.capacity());
        // The receive CQ overruns at its (capacity + 1)th completion, within the first run;
        // the second run finds it in error.
        let first = interleaved(capacity * 3 / 2 + 3);
        let second = vec![
            completion(1, CqTarget::Recv, 100),
            completion(1, CqTarget::Send, 101),
        ];
        let got = same_as_one_at_a_time(fixture, |_| {}, &[first.clone(), second]);
        let [send, recv] = got.stats;
        assert!(recv.in_error && !send.in_error);
        assert_eq!(recv.overruns, 1);
        assert_eq!(got.overrun_notices, 1, "IBV_EVENT_CQ_ERR once");
        assert_eq!(recv.produced, capacity);
        assert_eq!(got.polled[0].len() as u64, send.produced);
        // The QPs of the receive completions from the overrun on.
        let overrun_at = first
            .iter()
            .filter(|c| c.cq == CqTarget::Recv)
            .nth(capacity as usize)
            .unwrap()
            .wc
            .wr_id();
        let mut failed: Vec<u32> = first
            .iter()
            .filter(|c| c.cq == CqTarget::Recv && c.wc.wr_id() >= overrun_at)
            .map(|c| c.wc.qp_num())
            .collect();
        failed.sort_unstable();
        failed.dedup();
        assert_eq!(got.failed, failed);
    }

    #[test]
    fn armed_cqs_fire_one_event_per_arm_as_single_pushes_do() {
        // ibv_req_notify_cq(3): one event for the next completion (solicited_only: the next
        // solicited or unsuccessful one), one shot.
        let fixture = || fixture((64, OverrunPolicy::Error), (64, OverrunPolicy::Error));
        let mut run = interleaved(12);
        // The receive CQ is armed solicited-only: its fourth receive completion carries the
        // solicited bit; a failed receive after it must not fire a second event.
        run[5].solicited = true;
        run[9].wc = WorkCompletion::failure(9, WcStatus::RemAccessErr, 1, 0);
        let arm = |f: &Fixture| {
            f.send.req_notify(false);
            f.recv.req_notify(true);
        };
        let got = same_as_one_at_a_time(fixture, arm, &[run.clone(), run]);
        assert_eq!(got.events, [1, 1]);
        // Armed solicited-only, a failed completion fires it: a run of only those.
        let failed: Vec<_> = (0..3)
            .map(|i| Completion {
                wc: WorkCompletion::failure(i, WcStatus::WrFlushErr, 2, 0),
                ..completion(2, CqTarget::Recv, i)
            })
            .collect();
        let got = same_as_one_at_a_time(fixture, |f| f.recv.req_notify(true), &[failed]);
        assert_eq!(got.events, [0, 1]);
    }

    #[test]
    fn a_moderated_cq_fires_after_its_count_within_a_burst_as_single_pushes_do() {
        // ibv_modify_cq(3): with cq_count, the event waits for that many completions.
        let fixture = || fixture((64, OverrunPolicy::Error), (64, OverrunPolicy::Error));
        let prepare = |f: &Fixture| {
            f.recv
                .modify(Moderation {
                    count: 5,
                    period_us: 0,
                })
                .unwrap();
            f.recv.req_notify(false);
        };
        // Four receive completions hold the event back; the run's fifth fires it.
        let runs = [interleaved(6), interleaved(4)];
        let got = same_as_one_at_a_time(fixture, prepare, &runs);
        assert_eq!(got.events, [0, 1]);
    }

    #[test]
    fn a_full_backpressure_cq_holds_back_its_own_completions_in_order_and_only_those() {
        let f = fixture((64, OverrunPolicy::Error), (8, OverrunPolicy::Backpressure));
        let capacity = u64::from(f.recv.capacity());
        let run = interleaved(capacity * 3 / 2 + 6);
        let recv_order: Vec<u64> = run
            .iter()
            .filter(|c| c.cq == CqTarget::Recv)
            .map(|c| c.wc.wr_id())
            .collect();
        let mut held = VecDeque::new();
        assert!(deliver(&f, &mut held, &run).is_empty(), "nothing fails");
        // The receive CQ took what fits; the rest of its completions wait, in order. The
        // send CQ took all of its own.
        let waiting: Vec<u64> = held.iter().map(|c| c.wc.wr_id()).collect();
        assert_eq!(waiting, recv_order[capacity as usize..]);
        assert_eq!(f.send.stats().produced, capacity / 2 + 2);
        assert_eq!(f.recv.stats().refused, 1, "one refusal holds back the rest");
        // Once polled, the next run delivers what waited before its own.
        let mut polled: Vec<u64> = poll_all(&f.recv).iter().map(|wc| wc.wr_id()).collect();
        let next = [completion(3, CqTarget::Recv, 1000)];
        deliver(&f, &mut held, &next);
        assert!(held.is_empty());
        polled.extend(poll_all(&f.recv).iter().map(|wc| wc.wr_id()));
        let mut expected = recv_order;
        expected.push(1000);
        assert_eq!(polled, expected);
        assert_eq!(f.recv.stats().bursts, 2, "one burst per run");
    }

    #[test]
    fn completions_of_a_destroyed_qp_or_cq_are_dropped_without_failing_a_qp() {
        let (send, recv) = (
            CqBuilder::new(8).build().unwrap(),
            CqBuilder::new(8).build().unwrap(),
        );
        let route = Route {
            send: send.producer(),
            recv: recv.producer(),
        };
        let routes = Routes::from_iter([(1, route)]);
        recv.destroy().unwrap();
        // QP 9 has no route; QP 1's receive CQ is destroyed.
        let mut run = [
            completion(9, CqTarget::Send, 0),
            completion(1, CqTarget::Recv, 1),
            completion(1, CqTarget::Send, 2),
        ]
        .into_iter();
        let (mut held, mut failed) = (VecDeque::new(), Vec::new());
        deliver_completions(&routes, &mut held, || run.next(), &mut failed);
        assert!(held.is_empty() && failed.is_empty());
        let polled: Vec<u64> = poll_all(&send).iter().map(|wc| wc.wr_id()).collect();
        assert_eq!(polled, [2]);
    }
}
