//! Completion and async events as tokio futures (feature `tokio`): events arrive through
//! the channel fd, a cancelled wait loses nothing, and a wake-up is never lost
//! (`ibv_get_cq_event(3)`, `ibv_get_async_event(3)`).
#![cfg(feature = "tokio")]

mod common;

use common::*;
use softverbs::*;
use std::time::Duration;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A side on `ctx` whose RC QP completes into a CQ on a channel of its own; the channel.
fn side_on_channel(ctx: Context) -> (Side, CompChannel) {
    let channel = ctx.create_comp_channel().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.cq_builder(64).channel(&channel).build().unwrap();
    let qp = pd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
    let mr = pd.reg_mr(4096, ALL_ACCESS).unwrap();
    let side = Side {
        ctx,
        pd,
        cq,
        qp,
        mr,
    };
    (side, channel)
}

/// `b` posts receive `round` and arms its CQ (nothing is waiting in it).
fn receive_armed(b: &Side, round: u64) {
    b.qp.post_recv(RecvRequest::new(round, &[b.mr.slice(0..64).unwrap()]))
        .unwrap();
    assert!(!b.cq.req_notify_and_check(false));
}

/// `a` sends message `round` from another thread.
fn send_from_another_thread(a: &Side, round: u64) {
    std::thread::scope(|s| {
        s.spawn(|| {
            a.qp.post_send(SendRequest::send_inline(round, b"ping"))
                .unwrap()
        });
    });
}

/// `events` wakes for `b`'s completion of message `round`; both sides' completions are
/// taken.
async fn event_then_completions(a: &Side, b: &Side, events: &AsyncCompChannel, round: u64) {
    let event = tokio::time::timeout(PATIENCE, events.next_event())
        .await
        .expect("woken by the completion")
        .unwrap();
    assert!(event.is_for(b.cq.id()));
    drop(event);
    assert_eq!(wait_for(&b.cq, 1)[0].wr_id(), round);
    wait_for(&a.cq, 1);
}

/// `ibv_get_cq_event(3)` as a future: a wait cancelled by a timeout takes no event, and
/// the event of a completion added later (from another thread) wakes the next wait.
#[test]
fn a_cancelled_wait_loses_nothing_and_a_later_completion_wakes_the_next() {
    runtime().block_on(async {
        let a = side(in_process(), QpType::Rc);
        let (b, channel) = side_on_channel(in_process());
        connect(&a, &b);
        let events = AsyncCompChannel::new(&channel).unwrap();
        for round in 0..50u64 {
            receive_armed(&b, round);
            // Cancelled: nothing queued yet.
            let early = tokio::time::timeout(Duration::from_millis(1), events.next_event()).await;
            assert!(early.is_err(), "no event before the completion");
            send_from_another_thread(&a, round);
            event_then_completions(&a, &b, &events, round).await;
        }
        assert_eq!(b.cq.stats().events_acked, 50);
    });
}

/// `ibv_get_async_event(3)` as a future: PORT_ACTIVE at open, then an SRQ limit event
/// raised later.
#[test]
fn async_device_events_arrive_as_futures() {
    runtime().block_on(async {
        let ctx = in_process();
        let events = AsyncEvents::new(&ctx).unwrap();
        assert_eq!(
            tokio::time::timeout(PATIENCE, events.next_event())
                .await
                .expect("stuck: no PORT_ACTIVE event")
                .unwrap(),
            AsyncEvent::PortActive { port: 1 }
        );
        let pending = tokio::time::timeout(Duration::from_millis(5), events.next_event()).await;
        assert!(pending.is_err());
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(8).unwrap();
        let srq = pd.create_srq(SrqInit::default()).unwrap();
        let mr = pd.reg_mr(64, ALL_ACCESS).unwrap();
        srq.post_recv(RecvRequest::new(1, &[mr.slice(..).unwrap()]))
            .unwrap();
        srq.arm_limit(1).unwrap();
        let qp = pd
            .qp_builder(QpType::Rc, &cq, &cq)
            .srq(&srq)
            .build()
            .unwrap();
        let peer = side(in_process(), QpType::Rc);
        for (me, other) in [(&qp, &peer.qp), (&peer.qp, &qp)] {
            me.to_init(AccessFlags::empty()).unwrap();
            me.to_rtr(other.local_info(1)).unwrap();
            me.to_rts(RtsAttr::new(1)).unwrap();
        }
        peer.qp
            .post_send(SendRequest::send_inline(1, b"x"))
            .unwrap();
        let event = tokio::time::timeout(PATIENCE, events.next_event())
            .await
            .expect("SRQ limit event")
            .unwrap();
        assert_eq!(event, AsyncEvent::SrqLimitReached { srq: srq.id().0 });
        // The poll-function form: nothing more is queued.
        let polled =
            std::future::poll_fn(|cx| std::task::Poll::Ready(events.poll_next_event(cx))).await;
        assert!(polled.is_pending());
    });
}

/// The poll-function form of the channel wait: `Pending` while empty, then the event.
#[test]
fn poll_next_event_is_pending_then_ready() {
    runtime().block_on(async {
        let ctx = in_process();
        let channel = ctx.create_comp_channel().unwrap();
        let cq = ctx.cq_builder(8).channel(&channel).build().unwrap();
        let events = AsyncCompChannel::new(&channel).unwrap();
        let first =
            std::future::poll_fn(|cx| std::task::Poll::Ready(events.poll_next_event(cx))).await;
        assert!(first.is_pending());
        let pd = ctx.alloc_pd();
        let qp = pd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
        cq.req_notify(false);
        // A QP moved to ERR flushes nothing (empty queues); post a receive first so the
        // flush produces one completion and fires the arming.
        qp.to_init(AccessFlags::empty()).unwrap();
        let mr = pd.reg_mr(64, ALL_ACCESS).unwrap();
        qp.post_recv(RecvRequest::new(1, &[mr.slice(..).unwrap()]))
            .unwrap();
        qp.to_error().unwrap();
        let event = tokio::time::timeout(
            PATIENCE,
            std::future::poll_fn(|cx| events.poll_next_event(cx)),
        )
        .await
        .expect("flush completion event")
        .unwrap();
        assert!(event.is_for(cq.id()));
        drop(event);
        assert_eq!(wait_for(&cq, 1)[0].status(), WcStatus::WrFlushErr);
    });
}

/// A UDP context at `address` (its packets cross the kernel: the in-process shortcut off),
/// without a shared-memory inbox (a channel's sleeper is woken by the packets only then).
fn udp_at(address: std::net::Ipv4Addr) -> Context {
    let ctx = Context::open_with(DeviceConfig {
        shared_memory: false,
        ..DeviceConfig::udp(UdpConfig {
            address: Some(std::net::IpAddr::V4(address)),
            ..UdpConfig::default()
        })
    })
    .expect("open a UDP device");
    ctx.device().set_in_process_shortcut(false);
    ctx
}

/// tokio's event loop sleeps in `epoll` on the channel's fd, which `AsyncCompChannel` makes
/// non-blocking: the device's packets make it readable too, and `next_event` receives
/// them itself (`ibv_get_cq_event(3)` on a non-blocking channel, then `EAGAIN` if no event
/// came), so each event costs one wake-up, not the progress thread's and then the task's.
/// Pinned as a count: which thread received the SENDs (`DeviceStats::progress_received`;
/// all of them before).
#[test]
fn next_event_receives_the_packets_that_make_its_events_itself() {
    const ROUNDS: u64 = 100;
    let a = side(udp_at(std::net::Ipv4Addr::new(127, 0, 3, 3)), QpType::Rc);
    let (b, channel) = side_on_channel(udp_at(std::net::Ipv4Addr::new(127, 0, 3, 4)));
    connect(&a, &b);
    runtime().block_on(async {
        let events = AsyncCompChannel::new(&channel).unwrap();
        for round in 0..ROUNDS {
            receive_armed(&b, round);
            send_from_another_thread(&a, round);
            event_then_completions(&a, &b, &events, round).await;
        }
    });
    let stats = b.ctx.device().stats();
    let received = stats.transport.expect("a UDP device").received_packets;
    assert!(received >= ROUNDS, "{received} packets received");
    // A loaded machine may keep the task off its CPU long enough for the progress thread
    // to look (it naps while the application receives): a quarter at most.
    assert!(
        stats.progress_received * 4 <= received,
        "the progress thread received {} of {received} packets",
        stats.progress_received
    );
}
