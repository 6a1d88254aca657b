#![cfg(not(loom))]
//! One test per CQ rule of the libibverbs man pages, each citing the sentence it checks.

use softverbs_cq::{
    CompletionChannel, CompletionQueue, CqBuilder, CqEvent, CqOverrun, CqProducer, CreateError,
    DestroyError, FieldNotRequested, Moderation, OverrunPolicy, PollError, PushError, ResizeError,
    WcExtra, WcFields, WcFlags, WcOpcode, WcStatus, WorkCompletion, MAX_CQE,
};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest a test waits for another thread (far above what any schedule needs, so only a
/// lost completion or event reaches it).
const PATIENCE: Duration = Duration::from_secs(60);

fn send(wr_id: u64) -> WorkCompletion {
    WorkCompletion::success(wr_id, WcOpcode::Send, 0x11).with_byte_len(8)
}

fn recv(wr_id: u64) -> WorkCompletion {
    WorkCompletion::success(wr_id, WcOpcode::Recv, 0x11).with_byte_len(64)
}

/// Takes, with the blocking `get_event`, an event that must already be queued: on an empty
/// channel `get_event` would wait forever, hanging the test instead of failing it.
fn queued_event(ch: &CompletionChannel) -> CqEvent {
    assert!(
        ch.pending() > 0,
        "stuck: no event queued for get_event to take"
    );
    ch.get_event().unwrap()
}

fn poll_all(cq: &softverbs_cq::CompletionQueue) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut buf = [WorkCompletion::default(); 7];
    loop {
        let n = cq.poll(&mut buf).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

#[test]
fn create_reports_a_capacity_at_least_the_requested_size() {
    // ibv_create_cq(3): "ibv_create_cq() may create a CQ with size greater than or equal to
    // the requested size. Check the cqe attribute in the returned CQ for the actual size."
    for cqe in [1, 2, 3, 100, 501, 4096, 32767] {
        let cq = CqBuilder::new(cqe).build().unwrap();
        assert!(cq.capacity() >= cqe, "cqe {cqe} gave {}", cq.capacity());
    }
}

#[test]
fn create_refuses_zero_and_sizes_above_the_device_maximum() {
    // ibv_create_cq(3) fails for an invalid cqe; the device reports max_cqe.
    let zero = CqBuilder::new(0).build().unwrap_err();
    assert_eq!(zero, CreateError::ZeroSize);
    let big = CqBuilder::new(MAX_CQE + 1).build().unwrap_err();
    assert_eq!(
        big,
        CreateError::TooLarge {
            requested: u64::from(MAX_CQE) + 1,
            max: MAX_CQE
        }
    );
    assert!(big.to_string().contains(&MAX_CQE.to_string()));
    assert!(CqBuilder::new(MAX_CQE).build().is_ok());
}

#[test]
fn create_refuses_unknown_wc_flags() {
    // libibverbs: wc_flags outside IBV_CREATE_CQ_SUP_WC_FLAGS (0xfff) -> EOPNOTSUPP.
    let err = CqBuilder::new(4).raw_fields(1 << 12).build().unwrap_err();
    assert_eq!(err, CreateError::UnsupportedFields(1 << 12));
    assert!(CqBuilder::new(4).raw_fields(0xfff).build().is_ok());
}

#[test]
fn poll_returns_at_most_num_entries_in_fifo_order_and_removes_them() {
    // ibv_poll_cq(3): "returns the first num_entries (or all available completions if the
    // CQ contains fewer than this number)"; "Each polled completion is removed from the CQ
    // and cannot be returned to it."
    let cq = CqBuilder::new(16).build().unwrap();
    let p = cq.producer();
    for i in 0..10 {
        p.push(send(i), false).unwrap();
    }
    let mut wcs = [WorkCompletion::default(); 4];
    assert_eq!(cq.poll(&mut wcs).unwrap(), 4);
    assert_eq!(wcs.map(|w| w.wr_id()), [0, 1, 2, 3]);
    let rest = poll_all(&cq);
    assert_eq!(
        rest.iter().map(|w| w.wr_id()).collect::<Vec<_>>(),
        (4..10).collect::<Vec<_>>()
    );
    assert_eq!(cq.poll(&mut wcs).unwrap(), 0);
}

#[test]
fn poll_with_an_empty_array_returns_zero_and_consumes_nothing() {
    let cq = CqBuilder::new(4).build().unwrap();
    cq.producer().push(send(1), false).unwrap();
    assert_eq!(cq.poll(&mut []).unwrap(), 0);
    assert_eq!(poll_all(&cq).len(), 1);
}

#[test]
fn single_threaded_cq_polls_the_same_entries_without_a_lock() {
    // ibv_create_cq_ex(3): IBV_CREATE_CQ_ATTR_SINGLE_THREADED, "This CQ is used from a
    // single threaded, thus no locking is required".
    let mut cq = CqBuilder::new(8).build_single_threaded().unwrap();
    let p = cq.producer();
    for i in 0..5 {
        p.push(recv(i), false).unwrap();
    }
    let mut wcs = [WorkCompletion::default(); 8];
    assert_eq!(cq.poll(&mut wcs).unwrap(), 5);
    assert_eq!(wcs[4].wr_id(), 4);
}

#[test]
fn extended_poll_returns_the_same_entries_in_the_same_order_as_poll() {
    // ibv_create_cq_ex(3): start_poll / next_poll / end_poll iterate the same completions.
    let fields = WcFields::STANDARD;
    let a = CqBuilder::new(32).fields(fields).build().unwrap();
    let b = CqBuilder::new(32).fields(fields).build().unwrap();
    let wcs: Vec<_> = (0..20)
        .map(|i| {
            recv(i)
                .with_imm(i as u32 * 3)
                .with_src_qp(9)
                .with_flags(WcFlags::GRH)
        })
        .collect();
    for wc in &wcs {
        a.producer().push(*wc, false).unwrap();
        b.producer().push(*wc, false).unwrap();
    }
    let polled = poll_all(&a);
    let mut extended = Vec::new();
    {
        let mut batch = b.start_poll().unwrap().expect("not empty");
        loop {
            extended.push(*batch.completion());
            if !batch.next() {
                break;
            }
        }
    }
    assert_eq!(polled, wcs);
    assert_eq!(extended, wcs);
    assert!(b.start_poll().unwrap().is_none());
}

#[test]
fn extended_poll_on_an_empty_cq_is_enoent_not_an_error() {
    // ibv_create_cq_ex(3): "When no completions are available on the CQ, ENOENT is returned,
    // but the CQ remains in a valid state."
    let cq = CqBuilder::new(4).build().unwrap();
    assert!(cq.start_poll().unwrap().is_none());
    cq.producer().push(send(3), false).unwrap();
    let batch = cq.start_poll().unwrap().unwrap();
    assert_eq!(batch.wr_id(), 3);
}

#[test]
fn end_poll_consumes_every_entry_the_batch_returned_and_no_more() {
    // ibv_create_cq_ex(3): end_poll "indicates the end of polling batch of work
    // completions"; entries not yet reached stay in the CQ.
    let cq = CqBuilder::new(8).build().unwrap();
    for i in 0..5 {
        cq.producer().push(send(i), false).unwrap();
    }
    {
        let mut batch = cq.start_poll().unwrap().unwrap();
        assert_eq!(batch.wr_id(), 0);
        assert!(batch.next());
        assert_eq!(batch.wr_id(), 1);
    }
    let rest: Vec<_> = poll_all(&cq).iter().map(|w| w.wr_id()).collect();
    assert_eq!(rest, [2, 3, 4]);
}

#[test]
fn end_poll_after_next_poll_enoent_consumes_the_whole_batch() {
    // ibv_create_cq_ex(3): "If an error code is given, end_poll should still be called,
    // indicating this is the end of the polled batch."
    let cq = CqBuilder::new(8).build().unwrap();
    for i in 0..2 {
        cq.producer().push(send(i), false).unwrap();
    }
    {
        let mut batch = cq.start_poll().unwrap().unwrap();
        assert!(batch.next());
        assert!(!batch.next());
        assert!(!batch.next());
    }
    assert!(poll_all(&cq).is_empty());
    cq.producer().push(send(9), false).unwrap();
    assert_eq!(poll_all(&cq)[0].wr_id(), 9);
}

#[test]
fn extended_poll_reads_only_the_fields_requested_at_creation() {
    // ibv_create_cq_ex(3): "Only fields that the user requested via wc_flags in
    // ibv_create_cq_ex could be queried."
    let cq = CqBuilder::new(4)
        .fields(WcFields::BYTE_LEN | WcFields::QP_NUM)
        .build()
        .unwrap();
    cq.producer()
        .push(recv(1).with_imm(5).with_src_qp(7), false)
        .unwrap();
    let batch = cq.start_poll().unwrap().unwrap();
    assert_eq!(batch.byte_len(), Ok(64));
    assert_eq!(batch.qp_num(), Ok(0x11));
    assert_eq!(batch.opcode(), WcOpcode::Recv);
    assert_eq!(batch.imm_data(), Err(FieldNotRequested(WcFields::IMM)));
    assert_eq!(batch.src_qp(), Err(FieldNotRequested(WcFields::SRC_QP)));
    assert_eq!(
        batch.completion_ts(),
        Err(FieldNotRequested(WcFields::COMPLETION_TIMESTAMP))
    );
    assert_eq!(batch.cvlan(), Err(FieldNotRequested(WcFields::CVLAN)));
}

#[test]
fn extended_poll_reports_extra_fields_only_when_requested() {
    // ibv_create_cq_ex(3): ibv_wc_read_cvlan, ibv_wc_read_flow_tag, ibv_wc_read_tm_info.
    let cq = CqBuilder::new(4)
        .fields(WcFields::CVLAN | WcFields::FLOW_TAG | WcFields::TM_INFO)
        .build()
        .unwrap();
    let extra = WcExtra {
        cvlan: 0x123,
        flow_tag: 0xabcdef,
        tm_tag: 0x1122_3344_5566_7788,
        tm_priv: 77,
    };
    cq.producer().push_extra(recv(1), false, extra).unwrap();
    cq.producer().push(recv(2), false).unwrap();
    let mut batch = cq.start_poll().unwrap().unwrap();
    assert_eq!(batch.cvlan(), Ok(0x123));
    assert_eq!(batch.flow_tag(), Ok(0xabcdef));
    assert_eq!(batch.tm_info(), Ok((0x1122_3344_5566_7788, 77)));
    assert!(batch.next());
    // A completion pushed without extras reads as zero, never the previous entry's data.
    assert_eq!(batch.cvlan(), Ok(0));
    assert_eq!(batch.tm_info(), Ok((0, 0)));
}

#[test]
fn completion_timestamps_are_device_clock_nanoseconds_taken_at_push() {
    // ibv_create_cq_ex(3): ibv_wc_read_completion_ts "Get the completion timestamp from the
    // current completion in HCA clock units"; the wall-clock reader converts it.
    let cq = CqBuilder::new(4)
        .fields(WcFields::COMPLETION_TIMESTAMP | WcFields::COMPLETION_TIMESTAMP_WALLCLOCK)
        .build()
        .unwrap();
    let before = softverbs_cq::DeviceClock::now();
    cq.producer().push(send(1), false).unwrap();
    std::thread::sleep(Duration::from_millis(2));
    cq.producer().push(send(2), false).unwrap();
    let after = softverbs_cq::DeviceClock::now();
    let mut batch = cq.start_poll().unwrap().unwrap();
    let t1 = batch.completion_ts().unwrap();
    let w1 = batch.completion_wallclock_ns().unwrap();
    assert!(batch.next());
    let t2 = batch.completion_ts().unwrap();
    assert!(before <= t1 && t1 < t2 && t2 <= after);
    assert!(t2 - t1 >= 2_000_000, "1 tick = 1 ns (hca_core_clock 1 GHz)");
    let now_wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    assert!(now_wall >= w1 && now_wall - w1 < 1_000_000_000);
    assert_eq!(softverbs_cq::DEVICE_CLOCK_KHZ, 1_000_000);
}

#[test]
fn notification_is_one_shot_and_fires_for_the_next_completion_only() {
    // ibv_req_notify_cq(3): "The request for notification is “one shot.” Only one
    // completion event will be generated for each call to ibv_req_notify_cq()."
    let ch = CompletionChannel::new().unwrap();
    let cq = CqBuilder::new(16).channel(&ch).build().unwrap();
    let p = cq.producer();
    p.push(send(0), false).unwrap(); // before arming: no event
    assert_eq!(ch.pending(), 0);
    cq.req_notify(false);
    p.push(send(1), false).unwrap();
    p.push(send(2), false).unwrap();
    assert_eq!(ch.pending(), 1);
    let ev = ch.get_event().unwrap();
    assert!(ev.is_for(cq.id()));
    drop(ev);
    p.push(send(3), false).unwrap(); // not re-armed: no event
    assert_eq!(ch.pending(), 0);
    cq.req_notify(false);
    p.push(send(4), false).unwrap();
    assert_eq!(ch.pending(), 1);
    assert_eq!(cq.stats().events_raised, 2);
}

/// A CQ armed while it holds completions added since its last event, not polled yet,
/// raises its event at once, as a ConnectX CQ does (the arm names the consumer index; the
/// HCA raises the event for an entry past it). `ibv_req_notify_cq(3)` speaks of the event
/// for "the addition of a new CQ entry"; UCX's event loop relies on the hardware's
/// behaviour: it takes its events with `ibv_get_cq_event` until `EAGAIN`, arms and sleeps,
/// with no poll in between, so a completion added between its last poll and the arm would
/// otherwise raise no event (`ucx_perftest -E sleep`: both processes asleep for ever in 2 of
/// 40 runs). The completion whose event is being handled raises no second one when the
/// documented loop arms before it polls (`ibv_get_cq_event(3)`'s example). Still one event
/// per arm, and an empty CQ's arm waits for the next completion.
#[test]
fn arming_a_cq_that_holds_unannounced_completions_raises_its_event_at_once() {
    let ch = CompletionChannel::new().unwrap();
    let cq = CqBuilder::new(8).channel(&ch).build().unwrap();
    cq.producer().push(send(1), false).unwrap();
    assert!(cq.req_notify_and_check(false), "completions are waiting");
    assert_eq!(ch.pending(), 1, "the arm raised the event");
    drop(ch.get_event().unwrap());
    // One shot: the arm is spent, a push adds no event.
    cq.producer().push(send(2), false).unwrap();
    assert_eq!(ch.pending(), 0);
    // Solicited-only too (what UCX arms its receive CQ with): 2 came since the event.
    cq.req_notify(true);
    assert_eq!(ch.pending(), 1);
    drop(ch.get_event().unwrap());
    // Announced, not polled: the documented loop (take the event, arm, poll) gets one
    // event per completion, not two.
    cq.req_notify(false);
    assert_eq!(ch.pending(), 0, "a second event for announced completions");
    assert_eq!(poll_all(&cq).len(), 2);
    // Empty: the arm waits for the next completion, which fires it.
    assert!(!cq.req_notify_and_check(false));
    assert_eq!(ch.pending(), 0);
    cq.producer().push(send(3), false).unwrap();
    assert_eq!(ch.pending(), 1);
    drop(ch.get_event().unwrap());
    cq.req_notify(false);
    assert_eq!(
        ch.pending(),
        0,
        "a second event for the completion that fired"
    );
    assert_eq!(cq.stats().events_raised, 3);
}

#[test]
fn solicited_only_fires_for_solicited_receives_and_for_errors_only() {
    // ibv_req_notify_cq(3): "A CQE is solicited if it is a receive completion for a message
    // with the Solicited Event header bit set, or if the status is not successful. All other
    // successful receive completions, or any successful send completion is unsolicited."
    let ch = CompletionChannel::new().unwrap();
    let cq = CqBuilder::new(16).channel(&ch).build().unwrap();
    let p = cq.producer();
    cq.req_notify(true);
    p.push(send(1), false).unwrap();
    p.push(recv(2), false).unwrap();
    assert_eq!(ch.pending(), 0);
    p.push(recv(3), true).unwrap();
    assert_eq!(ch.pending(), 1);
    drop(ch.get_event().unwrap());
    cq.req_notify(true);
    p.push(
        WorkCompletion::failure(4, WcStatus::RemAccessErr, 0x11, 0),
        false,
    )
    .unwrap();
    assert_eq!(ch.pending(), 1);
}

#[test]
fn arming_next_after_solicited_upgrades_the_arm() {
    // ibv_req_notify_cq(3): arming "next completion" after "solicited" upgrades the arm.
    let ch = CompletionChannel::new().unwrap();
    let cq = CqBuilder::new(16).channel(&ch).build().unwrap();
    cq.req_notify(true);
    cq.req_notify(false);
    cq.producer().push(send(1), false).unwrap();
    assert_eq!(ch.pending(), 1);
}

#[test]
fn one_channel_serves_many_cqs_and_each_event_names_its_cq_and_context() {
    // ibv_get_cq_event(3): "Fills the arguments cq with the CQ that got the event and
    // cq_context with the CQ's context."
    let ch = CompletionChannel::new().unwrap();
    let a = CqBuilder::new(4)
        .channel(&ch)
        .user_context(0xa)
        .build()
        .unwrap();
    let b = CqBuilder::new(4)
        .channel(&ch)
        .user_context(0xb)
        .build()
        .unwrap();
    assert_eq!(ch.attached_cqs(), 2);
    a.req_notify(false);
    b.req_notify(false);
    b.producer().push(send(1), false).unwrap();
    a.producer().push(send(2), false).unwrap();
    let first = queued_event(&ch);
    let second = queued_event(&ch);
    assert!(first.is_for(b.id()) && first.user_context() == 0xb);
    assert!(second.is_for(a.id()) && second.user_context() == 0xa);
}

#[test]
fn nonblocking_channel_gives_eagain_when_empty() {
    // ibv_get_cq_event(3) example: "Set the completion event channel to be non-blocked",
    // then get_cq_event fails with EAGAIN until an event is there.
    let ch = CompletionChannel::new().unwrap();
    ch.set_nonblocking(true).unwrap();
    let err = ch.get_event().unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock);
    assert_eq!(err.raw_os_error().unwrap_or(11), 11);
    let cq = CqBuilder::new(4).channel(&ch).build().unwrap();
    cq.req_notify(false);
    cq.producer().push(send(1), false).unwrap();
    assert!(ch.get_event().is_ok());
}

#[test]
fn channel_fd_is_readable_exactly_while_events_are_queued() {
    // ibv_get_cq_event(3) example: poll() the channel fd for POLLIN, then get the event.
    use rustix::event::{poll, PollFd, PollFlags};
    let ch = CompletionChannel::new().unwrap();
    let cq = CqBuilder::new(4).channel(&ch).build().unwrap();
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let readable = |ch: &CompletionChannel| {
        let mut fds = [PollFd::new(ch, PollFlags::IN)];
        poll(&mut fds, Some(&zero)).unwrap() == 1
    };
    assert!(!readable(&ch));
    cq.req_notify(false);
    cq.producer().push(send(1), false).unwrap();
    assert!(readable(&ch));
    drop(ch.get_event().unwrap());
    assert!(!readable(&ch));
}

#[test]
fn blocking_get_event_wakes_when_a_completion_arrives() {
    let ch = CompletionChannel::new().unwrap();
    ch.set_spin(Duration::ZERO);
    let cq = CqBuilder::new(4).channel(&ch).build().unwrap();
    cq.req_notify(false);
    let producer = cq.producer();
    let pusher = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        producer.push(send(1), false).unwrap();
    });
    // The blocking wait runs on its own thread, so a lost wake-up fails the test after
    // PATIENCE instead of blocking it forever.
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = ch.clone();
    std::thread::spawn(move || {
        let _ = tx.send(waiter.get_event());
    });
    let ev = rx
        .recv_timeout(PATIENCE)
        .expect("stuck: the blocked get_event was never woken")
        .unwrap();
    assert!(ev.is_for(cq.id()));
    pusher.join().unwrap();
}

/// Whether `fd` polls readable now.
fn readable(fd: &impl std::os::fd::AsFd) -> bool {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    poll(
        &mut fds,
        Some(&rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        }),
    )
    .unwrap()
        == 1
}

/// A thread that sleeps on a non-blocking channel's fd with its own `poll` (UCX's, libfabric's
/// and tokio's event loops) is woken by the device's packets themselves: the fd polls
/// readable when the wait progress's fd does, and `get_event`, finding no event, runs the
/// progress step once (receiving the packet that makes the completion) before it answers
/// `EAGAIN` (`ibv_get_cq_event(3)` on a non-blocking channel). A blocking fd keeps the
/// readiness out: a readable fd there promises an event, which a blocking
/// `ibv_get_cq_event` after a `poll` with a timeout relies on. Here an eventfd stands for
/// the device's socket and the step pushes a completion per count it reads.
#[test]
fn a_non_blocking_channel_polls_readable_on_its_wait_progress_and_its_get_event_runs_it() {
    use rustix::event::{eventfd, EventfdFlags};
    let ch = CompletionChannel::new().unwrap();
    let cq = CqBuilder::new(4).channel(&ch).build().unwrap();
    let socket = Arc::new(eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC).unwrap());
    let producer = Mutex::new(cq.producer());
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (step_socket, step_runs) = (socket.clone(), runs.clone());
    assert!(ch.set_wait_progress(socket.try_clone().unwrap(), move || {
        step_runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut count = [0u8; 8];
        if rustix::io::read(&*step_socket, &mut count).is_ok() {
            producer.lock().unwrap().push(recv(9), false).unwrap();
        }
    }));
    let packet = || rustix::io::write(&*socket, &1u64.to_ne_bytes()).unwrap();

    // Blocking (libibverbs' default): a packet does not make the fd readable.
    cq.req_notify(false);
    assert!(!cq.producer().packets_wake_waiter());
    packet();
    assert!(
        !readable(&ch),
        "a blocking channel's fd readable without an event"
    );
    let mut count = [0u8; 8];
    rustix::io::read(&*socket, &mut count).unwrap();

    // Non-blocking: the packet makes it readable, and get_event receives it.
    ch.set_nonblocking(true).unwrap();
    assert!(cq.producer().packets_wake_waiter());
    assert!(!readable(&ch));
    packet();
    assert!(readable(&ch), "the packet did not make the fd readable");
    let event = ch
        .get_event()
        .expect("the event of the completion the step pushed");
    assert!(event.is_for(cq.id()));
    assert_eq!(runs.load(std::sync::atomic::Ordering::Relaxed), 1);
    drop(event);
    assert!(!readable(&ch), "readable with nothing left");
    // Nothing there: one run, then EAGAIN.
    let err = ch.get_event().expect_err("no event");
    assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock);
    assert_eq!(runs.load(std::sync::atomic::Ordering::Relaxed), 2);

    // Blocking again (set by fcntl behind the channel's back: seen by the next getter).
    let flags = rustix::fs::fcntl_getfl(&ch).unwrap();
    rustix::fs::fcntl_setfl(&ch, flags - rustix::fs::OFlags::NONBLOCK).unwrap();
    // Polled first: an arm of a CQ holding unannounced completions raises its event at
    // once (recv(9) came while the CQ was not armed).
    poll_all(&cq);
    cq.req_notify(false);
    assert!(ch.get_event_timeout(Duration::ZERO).unwrap().is_none());
    std::thread::spawn({
        let cq = cq.producer();
        move || {
            std::thread::sleep(Duration::from_millis(20));
            cq.push(recv(10), false).unwrap();
        }
    });
    let event = ch.get_event().expect("a blocking get_event");
    assert!(event.is_for(cq.id()));
    assert!(!cq.producer().packets_wake_waiter());
    packet();
    assert!(!readable(&ch), "readable again once blocking");
}

/// A device whose packets arrive on a socket gives the channel that socket and its
/// progress step (`set_wait_progress`): a thread blocked in `get_event` then receives the
/// packet that makes its completion itself. Here an eventfd stands for the socket and the
/// step pushes the completion: nobody else does, so the event can only come from the
/// blocked getter running the step once the fd became readable.
#[test]
fn a_blocked_get_event_runs_its_wait_progress_when_that_fd_is_readable() {
    use rustix::event::{eventfd, EventfdFlags};
    let ch = CompletionChannel::new().unwrap();
    ch.set_spin(Duration::ZERO);
    let cq = CqBuilder::new(4).channel(&ch).build().unwrap();
    cq.req_notify(false);
    let socket = Arc::new(eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC).unwrap());
    let producer = Mutex::new(cq.producer());
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (step_socket, step_runs) = (socket.clone(), runs.clone());
    let installed = ch.set_wait_progress(socket.try_clone().unwrap(), move || {
        step_runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut count = [0u8; 8];
        if rustix::io::read(&*step_socket, &mut count).is_ok() {
            producer.lock().unwrap().push(recv(9), false).unwrap();
        }
    });
    assert!(installed);
    assert!(
        !ch.set_wait_progress(socket.try_clone().unwrap(), || {}),
        "set once"
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = ch.clone();
    std::thread::spawn(move || {
        let _ = tx.send(waiter.get_event());
    });
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        runs.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "fd not readable yet"
    );
    rustix::io::write(&*socket, &1u64.to_ne_bytes()).unwrap();
    let ev = rx
        .recv_timeout(PATIENCE)
        .expect("stuck: the blocked get_event did not run its wait progress")
        .unwrap();
    assert!(ev.is_for(cq.id()));
    assert!(runs.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    drop(ev);
    assert_eq!(poll_all(&cq)[0].wr_id(), 9);
}

#[test]
fn destroy_refuses_while_an_event_is_unacknowledged_and_succeeds_after_ack() {
    // ibv_get_cq_event(3): "To avoid races, destroying a CQ will wait for all completion
    // events to be acknowledged; this guarantees a one-to-one correspondence between acks
    // and successful gets."
    let ch = CompletionChannel::new().unwrap();
    let cq = CqBuilder::new(4).channel(&ch).build().unwrap();
    cq.req_notify(false);
    cq.producer().push(send(1), false).unwrap();
    let ev = queued_event(&ch);
    let (cq, err) = cq.destroy().unwrap_err();
    assert_eq!(err, DestroyError::UnacknowledgedEvents(1));
    // The counted C form: take the event out, then ack it by count.
    let _ = ev.into_unacknowledged();
    let (cq, _) = cq.destroy().unwrap_err();
    cq.ack_events(1);
    cq.destroy().unwrap();
    assert_eq!(ch.attached_cqs(), 0);
}

#[test]
fn destroy_wait_returns_once_another_thread_acknowledges() {
    let ch = CompletionChannel::new().unwrap();
    let cq = CqBuilder::new(4).channel(&ch).build().unwrap();
    cq.req_notify(false);
    cq.producer().push(send(1), false).unwrap();
    let ev = queued_event(&ch);
    let acker = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        drop(ev);
    });
    cq.destroy_wait(Duration::from_secs(10)).unwrap();
    acker.join().unwrap();
}

#[test]
fn destroy_withdraws_events_still_queued_unread() {
    // An event the application never received needs no ack (libibverbs counts only events
    // reported to it); the channel no longer offers it.
    let ch = CompletionChannel::new().unwrap();
    ch.set_nonblocking(true).unwrap();
    let cq = CqBuilder::new(4).channel(&ch).build().unwrap();
    cq.req_notify(false);
    cq.producer().push(send(1), false).unwrap();
    assert_eq!(ch.pending(), 1);
    cq.destroy().unwrap();
    assert_eq!(ch.pending(), 0);
    assert!(ch.get_event().is_err());
}

#[test]
fn destroy_refuses_while_a_queue_pair_uses_the_cq() {
    // ibv_destroy_cq(3): "ibv_destroy_cq() fails if any queue pair is still associated with
    // this CQ."
    let cq = CqBuilder::new(4).build().unwrap();
    let p = cq.producer();
    p.attach_qp();
    let (cq, err) = cq.destroy().unwrap_err();
    assert_eq!(err, DestroyError::QueuePairsAttached(1));
    p.detach_qp();
    cq.destroy().unwrap();
    assert_eq!(p.push(send(1), false), Err(PushError::Destroyed));
}

/// Pushes and polls until the producer's next push would take the fast path (its position
/// below the point where it re-checks the CQ's state and room): the case destroy must
/// still stop.
fn warm(cq: &CompletionQueue, p: &CqProducer) {
    let mut wcs = [WorkCompletion::default(); 8];
    for round in 0..3 {
        for i in 0..4 {
            p.push(send(round * 4 + i), false).unwrap();
        }
        assert_eq!(cq.poll(&mut wcs).unwrap(), 4);
    }
    p.push(send(99), false).unwrap();
    assert_eq!(cq.poll(&mut wcs).unwrap(), 1);
}

#[test]
fn destroying_or_dropping_the_cq_stops_a_producer_in_full_stream() {
    // ibv_destroy_cq(3) frees the CQ: the device's next completion for it must not land.
    let cq = CqBuilder::new(8).build().unwrap();
    let p = cq.producer();
    warm(&cq, &p);
    cq.destroy().unwrap();
    assert_eq!(p.push(send(1), false), Err(PushError::Destroyed));
    assert_eq!(p.push(send(2), false), Err(PushError::Destroyed));
    // Dropped without destroy: the same.
    let cq = CqBuilder::new(8).build().unwrap();
    let p = cq.producer();
    warm(&cq, &p);
    drop(cq);
    assert_eq!(p.push(send(1), false), Err(PushError::Destroyed));
    let mut burst = p.burst();
    assert_eq!(burst.push(send(2), false), Err(PushError::Destroyed));
}

#[test]
fn overrun_puts_the_cq_in_error_raises_cq_err_and_polling_reports_it() {
    // ibv_poll_cq(3): "In case of a CQ overrun, the async event IBV_EVENT_CQ_ERR will be
    // triggered, and the CQ cannot be used."
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink_seen = seen.clone();
    let cq = CqBuilder::new(4)
        .user_context(7)
        .overrun_sink(Arc::new(move |e| sink_seen.lock().unwrap().push(e)))
        .build()
        .unwrap();
    let p = cq.producer();
    for i in 0..u64::from(cq.capacity()) {
        p.push(send(i), false).unwrap();
    }
    assert_eq!(p.push(send(99), false), Err(PushError::Overrun));
    assert_eq!(
        *seen.lock().unwrap(),
        [CqOverrun {
            cq_id: cq.id(),
            user_context: 7
        }]
    );
    let mut wcs = [WorkCompletion::default(); 8];
    assert_eq!(cq.poll(&mut wcs), Err(PollError::Overrun));
    assert!(matches!(cq.start_poll(), Err(PollError::Overrun)));
    assert_eq!(p.push(send(100), false), Err(PushError::InError));
    let stats = cq.stats();
    assert!(stats.in_error);
    assert_eq!(stats.overruns, 1);
    assert_eq!(seen.lock().unwrap().len(), 1, "CQ_ERR is raised once");
}

#[test]
fn ignore_overrun_overwrites_the_oldest_and_counts_what_was_lost() {
    // ibv_create_cq_ex(3): IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN, "This CQ will not pass to error
    // state if overrun, CQE always will be written to next entry. ... otherwise CQEs might
    // be lost."
    let cq = CqBuilder::new(4)
        .overrun(OverrunPolicy::Overwrite)
        .build()
        .unwrap();
    let cap = u64::from(cq.capacity());
    let p = cq.producer();
    for i in 0..cap + 3 {
        p.push(send(i), false).unwrap();
    }
    assert!(!cq.is_in_error());
    let got: Vec<_> = poll_all(&cq).iter().map(|w| w.wr_id()).collect();
    assert_eq!(got, (3..cap + 3).collect::<Vec<_>>());
    assert_eq!(cq.stats().overruns, 3);
    p.push(send(1000), false).unwrap();
    assert_eq!(poll_all(&cq)[0].wr_id(), 1000);
}

#[test]
fn backpressure_policy_hands_the_completion_back_and_loses_nothing() {
    let cq = CqBuilder::new(2)
        .overrun(OverrunPolicy::Backpressure)
        .build()
        .unwrap();
    let p = cq.producer();
    let cap = u64::from(cq.capacity());
    for i in 0..cap {
        p.push(send(i), false).unwrap();
    }
    let held = match p.push(send(cap), false) {
        Err(PushError::Full(wc)) => wc,
        other => panic!("expected Full, got {other:?}"),
    };
    assert!(!cq.is_in_error());
    let mut one = [WorkCompletion::default(); 1];
    assert_eq!(cq.poll(&mut one).unwrap(), 1);
    p.push(held, false).unwrap();
    let got: Vec<_> = poll_all(&cq).iter().map(|w| w.wr_id()).collect();
    assert_eq!(got, (1..=cap).collect::<Vec<_>>());
    assert_eq!(cq.stats().refused, 1);
    assert_eq!(cq.stats().overruns, 0);
}

#[test]
fn resize_grows_and_shrinks_keeping_every_outstanding_completion_in_order() {
    // ibv_resize_cq(3): "resizes the completion queue (CQ) cq to have at least cqe entries".
    let cq = CqBuilder::new(4).build().unwrap();
    let p = cq.producer();
    for i in 0..4 {
        p.push(send(i), false).unwrap();
    }
    let grown = cq.resize(64).unwrap();
    assert!(grown >= 64 && cq.capacity() == grown);
    for i in 4..40 {
        p.push(send(i), false).unwrap();
    }
    let mut wcs = [WorkCompletion::default(); 30];
    assert_eq!(cq.poll(&mut wcs).unwrap(), 30);
    let shrunk = cq.resize(10).unwrap();
    assert!((10..64).contains(&shrunk));
    let rest: Vec<_> = poll_all(&cq).iter().map(|w| w.wr_id()).collect();
    assert_eq!(rest, (30..40).collect::<Vec<_>>());
    assert_eq!(
        wcs.iter().map(|w| w.wr_id()).collect::<Vec<_>>(),
        (0..30).collect::<Vec<_>>()
    );
}

#[test]
fn resize_below_the_unpolled_count_fails_with_einval() {
    // ibv_resize_cq(3): "cqe must be at least the number of unpolled entries in the CQ cq."
    let cq = CqBuilder::new(16).build().unwrap();
    for i in 0..10 {
        cq.producer().push(send(i), false).unwrap();
    }
    let err = cq.resize(5).unwrap_err();
    assert_eq!(
        err,
        ResizeError::TooSmall {
            requested: 5,
            outstanding: 10
        }
    );
    assert_eq!(poll_all(&cq).len(), 10, "a failed resize loses nothing");
}

#[test]
fn moderation_fires_after_cq_count_completions() {
    // ibv_modify_cq(3): cq_count, "number of completions per event".
    let ch = CompletionChannel::new().unwrap();
    let cq = CqBuilder::new(16).channel(&ch).build().unwrap();
    cq.modify(Moderation {
        count: 3,
        period_us: 0,
    })
    .unwrap();
    cq.req_notify(false);
    let p = cq.producer();
    p.push(send(1), false).unwrap();
    p.push(send(2), false).unwrap();
    assert_eq!(ch.pending(), 0);
    p.push(send(3), false).unwrap();
    assert_eq!(ch.pending(), 1);
}

#[test]
fn moderation_fires_after_cq_period_when_fewer_completions_came() {
    // ibv_modify_cq(3): cq_period, "in micro seconds": whichever of count and period first.
    let ch = CompletionChannel::new().unwrap();
    let cq = CqBuilder::new(16).channel(&ch).build().unwrap();
    cq.modify(Moderation {
        count: 100,
        period_us: 50,
    })
    .unwrap();
    cq.req_notify(false);
    let p = cq.producer();
    p.push(send(1), false).unwrap();
    let deadline = p.moderation_deadline().expect("a pending moderated event");
    assert!(!p.moderation_timer(deadline - 1));
    assert_eq!(ch.pending(), 0);
    assert!(p.moderation_timer(deadline));
    assert_eq!(ch.pending(), 1);
    assert_eq!(p.moderation_deadline(), None);
}

#[test]
fn stats_report_depth_high_water_and_counts() {
    let cq = CqBuilder::new(8).build().unwrap();
    let p = cq.producer();
    for i in 0..6 {
        p.push(send(i), false).unwrap();
    }
    let mut wcs = [WorkCompletion::default(); 4];
    cq.poll(&mut wcs).unwrap();
    p.push(send(6), false).unwrap();
    let s = cq.stats();
    assert_eq!(s.depth, 3);
    assert_eq!(s.high_water, 6);
    assert_eq!(s.produced, 7);
    assert_eq!(s.polled, 4);
    assert_eq!(s.overruns, 0);
    assert_eq!(s.bursts, 7, "each push takes the producer lock once");
}

#[test]
fn stats_count_a_burst_once_however_many_it_pushes() {
    let cq = CqBuilder::new(8).build().unwrap();
    let p = cq.producer();
    p.push(send(0), false).unwrap();
    {
        let mut burst = p.burst();
        for i in 1..6 {
            burst.push(send(i), false).unwrap();
        }
    }
    let s = cq.stats();
    assert_eq!((s.produced, s.bursts), (6, 2));
    assert_eq!(p.stats().bursts, 2, "the producer's view is the same");
}

#[test]
fn many_producers_and_consumers_lose_and_duplicate_nothing_and_keep_per_producer_order() {
    const PRODUCERS: u64 = 3;
    const CONSUMERS: usize = 2;
    const PER: u64 = 50_000;
    let cq = Arc::new(
        CqBuilder::new(256)
            .overrun(OverrunPolicy::Backpressure)
            .build()
            .unwrap(),
    );
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|t| {
            let p = cq.producer();
            std::thread::spawn(move || {
                for i in 0..PER {
                    let mut wc = send((t << 32) | i);
                    let deadline = std::time::Instant::now() + Duration::from_secs(60);
                    loop {
                        match p.push(wc, false) {
                            Ok(()) => break,
                            Err(PushError::Full(back)) => {
                                wc = back;
                                assert!(std::time::Instant::now() < deadline, "stuck");
                                std::thread::yield_now();
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
            })
        })
        .collect();
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            let cq = cq.clone();
            let done = done.clone();
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                let mut wcs = [WorkCompletion::default(); 16];
                // Bounded like the producers: a CQ that never empties fails the test.
                let deadline = Instant::now() + PATIENCE;
                loop {
                    let n = cq.poll(&mut wcs).unwrap();
                    seen.extend(wcs[..n].iter().map(|w| w.wr_id()));
                    if n == 0 {
                        if done.load(std::sync::atomic::Ordering::Acquire) && cq.is_empty() {
                            return seen;
                        }
                        assert!(Instant::now() < deadline, "stuck: the CQ never drained");
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    let per_consumer: Vec<Vec<u64>> = consumers.into_iter().map(|c| c.join().unwrap()).collect();
    // Per-producer order within each consumer's view.
    for seen in &per_consumer {
        let mut last = [None::<u64>; PRODUCERS as usize];
        for id in seen {
            let (t, i) = ((id >> 32) as usize, id & 0xffff_ffff);
            if let Some(prev) = last[t] {
                assert!(i > prev, "producer {t}: {i} after {prev}");
            }
            last[t] = Some(i);
        }
    }
    let mut all: Vec<u64> = per_consumer.into_iter().flatten().collect();
    all.sort_unstable();
    let expected: Vec<u64> = (0..PRODUCERS)
        .flat_map(|t| (0..PER).map(move |i| (t << 32) | i))
        .collect();
    assert_eq!(all.len(), expected.len(), "lost or duplicated completions");
    assert_eq!(all, expected);
}

#[test]
fn concurrent_arming_and_pushing_never_loses_a_wakeup() {
    // The race-free pattern: arm, check, sleep. A completion pushed concurrently with arming
    // is either seen by the check or fires the event.
    let ch = CompletionChannel::new().unwrap();
    ch.set_nonblocking(true).unwrap();
    let cq = CqBuilder::new(1024).channel(&ch).build().unwrap();
    for round in 0..2000u64 {
        let p = cq.producer();
        let pusher = std::thread::spawn(move || p.push(send(round), false).unwrap());
        let waiting = cq.req_notify_and_check(false);
        pusher.join().unwrap();
        let got_event = match ch.get_event() {
            Ok(ev) => {
                drop(ev);
                true
            }
            Err(_) => false,
        };
        assert!(
            waiting || got_event,
            "round {round}: completion neither seen nor signalled"
        );
        poll_all(&cq);
        while ch.get_event().is_ok() {}
    }
}
