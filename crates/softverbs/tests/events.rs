//! Completion channels and async events through the safe API (`ibv_req_notify_cq(3)`,
//! `ibv_get_cq_event(3)`, `ibv_ack_cq_events(3)`, `ibv_destroy_comp_channel(3)`,
//! `ibv_get_async_event(3)`).

mod common;

use common::*;
use softverbs::*;
use std::time::Duration;

/// A connected RC pair whose B side (on `channel_ctx`) completes into a CQ on `channel`;
/// the A side is on `peer`.
fn pair_with_channel(channel_ctx: Context, peer: Context) -> (Side, Side, CompChannel) {
    let channel = channel_ctx.create_comp_channel().unwrap();
    let a = side(peer, QpType::Rc);
    let pd = channel_ctx.alloc_pd();
    let cq = channel_ctx
        .cq_builder(64)
        .channel(&channel)
        .user_context(0xfeed)
        .build()
        .unwrap();
    let qp = pd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
    let mr = pd.reg_mr(4096, ALL_ACCESS).unwrap();
    let b = Side {
        ctx: channel_ctx,
        pd,
        cq,
        qp,
        mr,
    };
    connect(&a, &b);
    (a, b, channel)
}

fn send_one(a: &Side, b: &Side, wr_id: u64) {
    b.qp.post_recv(RecvRequest::new(wr_id, &[b.mr.slice(0..64).unwrap()]))
        .unwrap();
    a.qp.post_send(SendRequest::send_inline(wr_id, b"ping"))
        .unwrap();
    wait_for(&a.cq, 1);
}

/// `ibv_req_notify_cq(3)`: arming is one-shot; the next completion puts one event naming
/// the CQ and its context on the channel (`ibv_get_cq_event(3)`), and dropping the event
/// acknowledges it (`ibv_ack_cq_events(3)`).
#[test]
fn an_armed_cq_raises_one_event_per_arming_and_the_event_acks_on_drop() {
    let (a, b, channel) = pair_with_channel(in_process(), in_process());
    b.cq.req_notify(false);
    send_one(&a, &b, 1);
    let event = channel
        .get_event_timeout(PATIENCE)
        .unwrap()
        .expect("a completion event");
    assert!(event.is_for(b.cq.id()));
    assert_eq!(event.user_context(), 0xfeed);
    assert_eq!(wait_for(&b.cq, 1)[0].wr_id(), 1);
    drop(event);
    assert_eq!(b.cq.stats().events_acked, 1);

    // Not re-armed: the next completion raises nothing.
    send_one(&a, &b, 2);
    assert_eq!(wait_for(&b.cq, 1)[0].wr_id(), 2);
    assert!(channel
        .get_event_timeout(Duration::from_millis(50))
        .unwrap()
        .is_none());
}

/// `ibv_req_notify_cq(3)`: completions already in the CQ do not fire the arming;
/// `req_notify_and_check` is the race-free "arm, then look" and says to poll now.
#[test]
fn req_notify_and_check_reports_completions_already_waiting() {
    let (a, b, channel) = pair_with_channel(in_process(), in_process());
    send_one(&a, &b, 1);
    // Wait until the receive completion is in the CQ without taking it.
    let deadline = std::time::Instant::now() + PATIENCE;
    while b.cq.stats().depth == 0 {
        b.ctx.progress();
        assert!(std::time::Instant::now() < deadline);
    }
    assert!(b.cq.req_notify_and_check(false));
    assert_eq!(wait_for(&b.cq, 1)[0].wr_id(), 1);
    assert!(!b.cq.req_notify_and_check(false));
    send_one(&a, &b, 2);
    assert!(channel.get_event_timeout(PATIENCE).unwrap().is_some());
}

/// `ibv_get_cq_event(3)`: "destroying a CQ will wait for all completion events to be
/// acknowledged"; the non-waiting destroy refuses and hands the CQ back, and
/// `ibv_destroy_comp_channel(3)` fails while a CQ uses the channel.
#[test]
fn destroy_is_refused_until_events_are_acknowledged_and_cqs_are_gone() {
    let (a, b, channel) = pair_with_channel(in_process(), in_process());
    b.cq.req_notify(false);
    send_one(&a, &b, 1);
    let (cq_id, _) = channel
        .get_event_timeout(PATIENCE)
        .unwrap()
        .expect("event")
        .into_unacknowledged();
    assert_eq!(cq_id, b.cq.id());
    let Side { qp, cq, mr, .. } = b;
    drop(qp);
    drop(mr);
    let cq = match cq.destroy() {
        Err((
            cq,
            Error::UnacknowledgedEvents {
                object: Object::Cq,
                count: 1,
            },
        )) => cq,
        other => panic!("expected UnacknowledgedEvents(1), got {other:?}"),
    };
    let channel = match channel.destroy() {
        Err((channel, e)) => {
            assert!(
                matches!(
                    e,
                    Error::Verbs(VerbsError::InUse {
                        object: Object::Channel,
                        by: Object::Cq,
                        count: 1
                    })
                ),
                "{e}"
            );
            assert_eq!(e.errno(), 16);
            channel
        }
        Ok(()) => panic!("destroyed a channel in use"),
    };
    cq.ack_events(1);
    cq.destroy().map_err(|(_, e)| e).unwrap();
    channel.destroy().map_err(|(_, e)| e).unwrap();
}

/// `ibv_destroy_cq(3)`: "fails if any queue pair is still associated with this CQ"; the
/// CQ comes back with the error and can be destroyed once the QP is gone.
#[test]
fn a_cq_cannot_be_destroyed_while_a_qp_completes_into_it() {
    let ctx = in_process();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(8).unwrap();
    let qp = pd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
    let cq = match cq.destroy() {
        Err((cq, e)) => {
            assert!(
                matches!(
                    e,
                    Error::Verbs(VerbsError::InUse {
                        object: Object::Cq,
                        by: Object::Qp,
                        count: 1
                    })
                ),
                "{e}"
            );
            assert_eq!(e.errno(), 16);
            cq
        }
        Ok(()) => panic!("destroyed a CQ in use"),
    };
    assert_eq!(cq.attachments(), 2);
    qp.destroy().map_err(|(_, e)| e).unwrap();
    cq.destroy().map_err(|(_, e)| e).unwrap();
}

/// `ibv_get_async_event(3)`: opening the device raises IBV_EVENT_PORT_ACTIVE.
#[test]
fn opening_a_device_raises_port_active() {
    let ctx = in_process();
    assert_eq!(
        ctx.async_event_timeout(PATIENCE).unwrap(),
        Some(AsyncEvent::PortActive { port: 1 })
    );
    assert_eq!(ctx.try_async_event(), None);
}

/// `ibv_poll_cq(3)` / IBTA: an RDMA write with a bad R_Key completes with
/// IBV_WC_REM_ACCESS_ERR at the requester, and the responder's QP raises
/// IBV_EVENT_QP_ACCESS_ERR (`ibv_get_async_event(3)`).
#[test]
fn a_bad_rkey_gives_rem_access_err_and_an_access_error_event() {
    let (a, b) = rc_pair(in_process(), in_process());
    let bad = RemoteAddr::new(b.mr.addr(), b.mr.rkey() ^ 0x5a5a);
    a.qp.post_send(SendRequest::write(1, &[a.mr.slice(0..8).unwrap()], bad))
        .unwrap();
    let done = wait_for(&a.cq, 1);
    assert_eq!(done[0].status(), WcStatus::RemAccessErr);
    assert_eq!(a.qp.state().unwrap(), QpState::Err);
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        match b.ctx.async_event_timeout(PATIENCE).unwrap() {
            Some(AsyncEvent::QpAccessError { qpn }) => {
                assert_eq!(qpn, b.qp.qpn());
                break;
            }
            Some(_) => {}
            None => panic!("no access error event"),
        }
        assert!(std::time::Instant::now() < deadline);
    }
}

/// `ibv_req_notify_cq(3)`: armed with `solicited_only`, the CQ raises its event for the
/// next completion of a message sent with IBV_SEND_SOLICITED (and not for an unsolicited
/// one).
#[test]
fn a_solicited_only_arming_fires_on_a_solicited_send() {
    let (a, b, channel) = pair_with_channel(in_process(), in_process());
    b.cq.req_notify(true);
    send_one(&a, &b, 1);
    assert_eq!(wait_for(&b.cq, 1)[0].wr_id(), 1);
    assert!(channel
        .get_event_timeout(std::time::Duration::from_millis(50))
        .unwrap()
        .is_none());
    b.qp.post_recv(RecvRequest::new(2, &[b.mr.slice(0..64).unwrap()]))
        .unwrap();
    a.qp.post_send(SendRequest::send_inline(2, b"wake").solicited())
        .unwrap();
    wait_for(&a.cq, 1);
    let event = channel.get_event_timeout(PATIENCE).unwrap();
    assert!(event.is_some(), "no event for a solicited completion");
}

/// `ibv_modify_cq(3)`: with moderation, an armed CQ raises its event after `cq_count`
/// completions or `cq_period` microseconds, whichever first. Here one completion and a
/// 2 ms period: the device's progress fires the event when the period ends, with no
/// further completion and no poll.
#[test]
fn a_moderated_cq_raises_its_event_when_the_period_ends() {
    let (a, b, channel) = pair_with_channel(in_process(), in_process());
    b.cq.modify(Moderation {
        count: 10,
        period_us: 2000,
    })
    .unwrap();
    b.cq.req_notify(false);
    let start = std::time::Instant::now();
    send_one(&a, &b, 1);
    let event = channel
        .get_event_timeout(PATIENCE)
        .unwrap()
        .expect("the moderation period fires the event");
    assert!(event.is_for(b.cq.id()));
    assert!(
        start.elapsed() >= Duration::from_micros(1500),
        "fired after {:?}, before the period",
        start.elapsed()
    );
}

/// A program that sleeps in its own `epoll_wait(2)` on the channel's fd instead of in
/// `ibv_get_cq_event(3)` (the man page's "the fd can be used with poll/epoll" pattern,
/// with the fd non-blocking) is woken exactly once per completion event, over a real UDP
/// path between two devices: the fd turns readable when the armed CQ's event is queued
/// and stops being readable once the event is taken, so no wake-up is spurious or lost.
#[test]
fn an_epoll_on_the_channel_fd_wakes_once_per_event_over_udp() {
    const EVENTS: u64 = 200;
    let (a, b, channel) = pair_with_channel(udp(233), udp(234));
    channel.set_nonblocking(true).unwrap();

    // SAFETY: plain epoll system calls on descriptors this test owns; `ev` outlives them.
    let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    assert!(
        epfd >= 0,
        "epoll_create1: {}",
        std::io::Error::last_os_error()
    );
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: 7,
    };
    let fd = std::os::fd::AsRawFd::as_raw_fd(&channel);
    // SAFETY: as above: descriptors this test owns, `ev` a live local.
    let added = unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) };
    assert_eq!(added, 0);
    let wait = |timeout_ms: i32| -> i32 {
        let mut out = [libc::epoll_event { events: 0, u64: 0 }; 4];
        // SAFETY: `out` has room for the 4 events the call may write.
        unsafe { libc::epoll_wait(epfd, out.as_mut_ptr(), 4, timeout_ms) }
    };

    let mut wakeups = 0;
    for id in 0..EVENTS {
        b.cq.req_notify(false);
        assert_eq!(
            wait(0),
            0,
            "event {id}: the fd is readable before the completion"
        );
        send_one(&a, &b, id);
        let ready = wait(PATIENCE.as_millis() as i32);
        assert_eq!(ready, 1, "event {id}: epoll_wait woke {ready} times");
        wakeups += 1;
        let event = channel
            .try_get_event()
            .unwrap()
            .unwrap_or_else(|| panic!("event {id}: the fd was readable with no event"));
        assert!(event.is_for(b.cq.id()));
        assert_eq!(wait_for(&b.cq, 1)[0].wr_id(), id);
        drop(event);
        assert_eq!(
            wait(0),
            0,
            "event {id}: the fd stayed readable after the event"
        );
    }
    assert_eq!(wakeups, EVENTS);
    assert_eq!(b.cq.stats().events_acked, EVENTS);
    // SAFETY: closes the epoll descriptor this test created.
    unsafe { libc::close(epfd) };
}
