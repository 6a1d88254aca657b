//! The spin phase of a blocking `get_event` (`ibv_get_cq_event(3)`) and the channel's fd.
//!
//! `ibv_get_cq_event(3)`: the channel's fd can be polled; it is readable while an event
//! waits, and `ibv_get_cq_event` takes one. An event that a getter spinning in `get_event`
//! takes as it comes is queued without its count on the fd (no `eventfd` write, and no read
//! to take it back): two system calls fewer per event for an application that waits in
//! `get_event` (`ib_send_lat -e` on the shared-memory path: 2.73 -> 2.47 us one way). Events
//! the spinner leaves get their counts when it stops spinning, so a thread asleep on the fd
//! (in `get_event` or its own `poll`) is woken for them.
#![cfg(not(loom))]

use rustix::event::{poll, PollFd, PollFlags};
use softverbs_cq::{CompletionChannel, CqBuilder, WcOpcode, WorkCompletion};
use std::sync::mpsc;
use std::time::Duration;

/// How long a test waits at most for something that must happen.
const PATIENCE: Duration = Duration::from_secs(60);

/// Events of the count test.
const EVENTS: u64 = 100;

fn recv(wr_id: u64) -> WorkCompletion {
    WorkCompletion::success(wr_id, WcOpcode::Recv, 0x11).with_byte_len(8)
}

/// Whether `channel`'s fd polls readable within `timeout`.
fn readable_within(channel: &CompletionChannel, timeout: Duration) -> bool {
    let timeout = rustix::time::Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    let mut fds = [PollFd::new(channel, PollFlags::IN)];
    poll(&mut fds, Some(&timeout)).unwrap() == 1
}

/// A getter that waits in `get_event` for every event, spinning long enough (1 s) that each
/// event comes while it spins, takes them all without a system call on the fd. The channel
/// before wrote each event's count and read it back: 200 calls for 100 events.
#[test]
fn events_taken_by_a_spinning_getter_cost_no_system_call_on_the_fd() {
    let channel = CompletionChannel::new().unwrap();
    channel.set_spin(Duration::from_secs(1));
    let cq = CqBuilder::new(16).channel(&channel).build().unwrap();
    let (taken, taken_rx) = mpsc::channel();
    std::thread::scope(|s| {
        let getter = channel.clone();
        s.spawn(move || {
            for _ in 0..EVENTS {
                let event = getter.get_event().unwrap();
                drop(event);
                taken.send(()).unwrap();
            }
        });
        let producer = cq.producer();
        let mut wcs = [WorkCompletion::default(); 4];
        for n in 0..EVENTS {
            cq.req_notify(false);
            producer.push(recv(n), false).unwrap();
            taken_rx
                .recv_timeout(PATIENCE)
                .unwrap_or_else(|_| panic!("event {n} was never taken"));
            assert_eq!(cq.poll(&mut wcs).unwrap(), 1);
            // Give the getter the moment it needs to be back in its spin.
            std::thread::sleep(Duration::from_micros(200));
        }
    });
    // A getter kept off its CPU (a loaded machine) may come back to its spin only after the
    // next event came: that event costs its two calls. A quarter of the events at most.
    let calls = channel.fd_calls();
    assert!(
        calls <= EVENTS / 2,
        "{calls} system calls on the fd for {EVENTS} events"
    );
    assert!(!readable_within(&channel, Duration::ZERO));
}

/// Two events come while a getter spins; it takes one and stops. The other, queued without
/// its count, gets it then: a thread sleeping in `poll` on the fd is woken, and the event is
/// there for the next `get_event` (whose read takes the count: the fd is quiet after).
/// Holds whether the spinner took the first event while spinning or the second came after
/// it stopped (then counted as it is queued).
#[test]
fn an_event_a_spinning_getter_leaves_wakes_a_thread_asleep_on_the_fd() {
    let channel = CompletionChannel::new().unwrap();
    channel.set_spin(Duration::from_secs(1));
    let cq = CqBuilder::new(16).channel(&channel).build().unwrap();
    let other = CqBuilder::new(16).channel(&channel).build().unwrap();
    let (asleep, asleep_rx) = mpsc::channel();
    let first = std::thread::scope(|s| {
        // The sleeper: poll(2) on the fd, as an application's own event loop.
        let watched = channel.clone();
        s.spawn(move || asleep.send(readable_within(&watched, PATIENCE)).unwrap());
        let getter = channel.clone();
        let spinner = s.spawn(move || getter.get_event().unwrap().cq_id());
        std::thread::sleep(Duration::from_millis(20));
        cq.req_notify(false);
        other.req_notify(false);
        cq.producer().push(recv(1), false).unwrap();
        other.producer().push(recv(2), false).unwrap();
        let first = spinner.join().unwrap();
        assert!(first == cq.id() || first == other.id());
        assert!(
            asleep_rx.recv_timeout(PATIENCE).unwrap(),
            "the thread asleep on the fd was never woken for the event left"
        );
        first
    });
    assert!(readable_within(&channel, Duration::ZERO));
    let second = channel
        .get_event_timeout(PATIENCE)
        .unwrap()
        .expect("the event the spinner left");
    // One event per CQ: the other one.
    assert_ne!(second.cq_id(), first);
    assert!(second.cq_id() == cq.id() || second.cq_id() == other.id());
    drop(second);
    assert!(!readable_within(&channel, Duration::ZERO));
    assert_eq!(channel.pending(), 0);
}
