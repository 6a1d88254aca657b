//! A thread waiting for a completion event receives the device's packets itself, while it
//! spins before it sleeps (`Device::serve_channel_waits`, `CompletionChannel::set_spin`):
//! the completion it waits for needs a packet received, and without that it could only come
//! from the device's progress thread, asleep in the kernel until the packet wakes it, and
//! then the waiter woken by it. `ib_send_lat -e -s 8` over UDP took 16 us one way where
//! busy polling takes 4.4; with the waiter receiving, 6.2. Pinned as a count: which thread
//! received the packets (`DeviceStats::progress_received`).
//!
//! `ibv_get_cq_event(3)`: the channel delivers one event per armed CQ that got a completion;
//! `ibv_req_notify_cq(3)`: arm, then poll again before waiting (a completion that came
//! before the arm is found by that poll; its event, raised by the arm, is taken later).

mod common;

use common::rc::{connect, recv_wr, send_wr, side_with_cq, Side};
use softverbs_cq::{CompletionChannel, CqBuilder, WcOpcode, WorkCompletion};
use softverbs_device::{DeviceConfig, UdpConfig};
use softverbs_proto::QpType;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

/// Messages each way.
const ROUNDS: u64 = 200;

/// A side at `address` whose packets go over UDP, never handed over in memory (the
/// in-process shortcut off, as between two processes), whose CQ reports to a channel its
/// device serves, spinning `spin` before it sleeps.
fn side_on_channel(address: Ipv4Addr, spin: Duration) -> (Side, CompletionChannel) {
    let channel = CompletionChannel::new().unwrap();
    channel.set_spin(spin);
    let cq = CqBuilder::new(256).channel(&channel).build().unwrap();
    let mut config = DeviceConfig::udp(UdpConfig {
        address: Some(IpAddr::V4(address)),
        ..UdpConfig::default()
    });
    // Devices of one process do not share memory (their inboxes are for other processes);
    // `softverbs/tests/shared_memory.rs` has the two-process tests.
    config.shared_memory = false;
    let side = side_with_cq(config, QpType::Rc, cq);
    side.device.set_in_process_shortcut(false);
    side.device.serve_channel_waits(&channel);
    (side, channel)
}

/// Waits for the next completion of `opcode` as an event-driven application does (never
/// calling the device's progress itself): arms, polls, and while nothing came, `sleep`s on
/// the channel for at most what is left of a bounded time.
fn wait_for_opcode(side: &Side, opcode: WcOpcode, sleep: impl Fn(Duration)) -> WorkCompletion {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut wc = [WorkCompletion::default(); 1];
    loop {
        // Arm, then poll (a completion that came before the arm is taken here; its event,
        // which the arm raised, in a later sleep).
        side.cq.req_notify(false);
        while side.cq.poll(&mut wc).unwrap() == 1 {
            let done = wc[0].result().expect("a successful completion");
            if done.opcode() == opcode {
                return wc[0];
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no {opcode:?} completion");
        sleep(left);
    }
}

/// Waits in `get_event` (`ibv_get_cq_event(3)` on a blocking channel), for the next
/// completion of `opcode`.
fn wait_by_event(side: &Side, channel: &CompletionChannel, opcode: WcOpcode) -> WorkCompletion {
    wait_for_opcode(side, opcode, |left| {
        // Dropping the event acknowledges it.
        drop(channel.get_event_timeout(left).unwrap());
    })
}

/// Waits as an event loop does (tokio's, libfabric's), for the next completion of
/// `opcode`: asleep on the channel's (non-blocking) fd in its own `poll(2)`, then taking
/// the events with a non-blocking `get_event` (`EAGAIN` when none came).
fn wait_in_own_poll(side: &Side, channel: &CompletionChannel, opcode: WcOpcode) -> WorkCompletion {
    use rustix::event::{poll, PollFd, PollFlags};
    wait_for_opcode(side, opcode, |left| {
        let mut fds = [PollFd::new(channel, PollFlags::IN)];
        let timeout = rustix::time::Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        poll(&mut fds, Some(&timeout)).unwrap();
        while let Ok(event) = channel.get_event() {
            drop(event);
        }
    })
}

/// An 8-byte RC SEND ping-pong over UDP between devices at `addresses`, both sides waiting
/// for every completion on their completion channel with `wait` (the channel non-blocking
/// if `nonblocking`), spinning 1 s in `get_event` (long enough for the peer's answer even on
/// a loaded machine); returns the packets the two devices received and how many of them
/// their progress threads received.
fn event_ping_pong(
    addresses: (Ipv4Addr, Ipv4Addr),
    nonblocking: bool,
    wait: fn(&Side, &CompletionChannel, WcOpcode) -> WorkCompletion,
) -> (u64, u64) {
    let spin = Duration::from_secs(1);
    let (a, a_channel) = side_on_channel(addresses.0, spin);
    let (b, b_channel) = side_on_channel(addresses.1, spin);
    for channel in [&a_channel, &b_channel] {
        channel.set_nonblocking(nonblocking).unwrap();
    }
    connect(&a, &b);
    for side in [&a, &b] {
        side.device.post_recv(side.qpn, recv_wr(side, 0)).unwrap();
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..ROUNDS {
                wait(&b, &b_channel, WcOpcode::Recv);
                b.device.post_recv(b.qpn, recv_wr(&b, i)).unwrap();
                b.device.post_send(b.qpn, send_wr(&b, i)).unwrap();
                wait(&b, &b_channel, WcOpcode::Send);
            }
        });
        for i in 0..ROUNDS {
            a.device.post_send(a.qpn, send_wr(&a, i)).unwrap();
            wait(&a, &a_channel, WcOpcode::Send);
            wait(&a, &a_channel, WcOpcode::Recv);
            a.device.post_recv(a.qpn, recv_wr(&a, i)).unwrap();
        }
    });
    let (a_stats, b_stats) = (a.device.stats(), b.device.stats());
    assert!(a_stats.to_string().contains(" received="));
    let transport = |s: &softverbs_device::DeviceStats| s.transport.unwrap();
    let received = transport(&a_stats).received_packets + transport(&b_stats).received_packets;
    (
        received,
        a_stats.progress_received + b_stats.progress_received,
    )
}

/// `ib_send_lat -e` in miniature: the packets of an event-driven ping-pong are received by
/// the waiting threads; the progress threads take (nearly) none. The device before left
/// them all to the progress threads (800 of 800).
#[test]
fn a_thread_waiting_for_an_event_receives_the_packets_itself_while_it_spins() {
    let (received, by_progress) = event_ping_pong(
        (Ipv4Addr::new(127, 0, 0, 240), Ipv4Addr::new(127, 0, 0, 252)),
        false,
        wait_by_event,
    );
    assert_taken_by_the_waiters(received, by_progress);
}

/// What [`event_ping_pong`] returned: `received` packets, `by_progress` of them by the
/// progress threads.
fn assert_taken_by_the_waiters(received: u64, by_progress: u64) {
    // Each message and its ACK: at least 2 * ROUNDS packets each way.
    assert!(received >= 4 * ROUNDS, "{received} packets received");
    // A loaded machine may keep a waiter off its CPU long enough for a progress thread to
    // look (it naps while the application receives): a quarter at most.
    assert!(
        by_progress * 4 <= received,
        "the progress threads received {by_progress} of {received} packets"
    );
}

/// The same ping-pong with both sides asleep in their own `poll(2)` on a non-blocking
/// channel's fd (an event loop's, tokio's `AsyncCompChannel`): the fd polls
/// readable on the device's packets too, and the woken thread's non-blocking `get_event`
/// receives them (`CompletionChannel`'s module doc). One wake-up per message: an 8-byte
/// round trip over UDP between two processes through the drop-in takes 20-65 us, against
/// 95-105 us when the progress thread received each packet and then woke the application
/// (all 800 packets here, before).
#[test]
fn a_thread_asleep_in_its_own_poll_on_a_non_blocking_channel_receives_the_packets_itself() {
    let (received, by_progress) = event_ping_pong(
        (Ipv4Addr::new(127, 0, 3, 1), Ipv4Addr::new(127, 0, 3, 2)),
        true,
        wait_in_own_poll,
    );
    assert_taken_by_the_waiters(received, by_progress);
}

/// The progress thread leaves the packets to a thread asleep on a non-blocking channel's fd
/// (the packets wake it), but not for ever: an application that armed its CQ and then does
/// not come back to the fd (busy elsewhere, or its wake-up lost) still gets its completion,
/// the packet taken by the progress thread once it found it waiting at two looks a nap
/// apart (500 us each); and the peer its ACK.
#[test]
fn a_packet_a_non_blocking_channels_sleeper_does_not_take_is_received_by_the_progress_thread() {
    let spin = Duration::ZERO;
    let (a, _a_channel) = side_on_channel(Ipv4Addr::new(127, 0, 3, 5), spin);
    let (b, b_channel) = side_on_channel(Ipv4Addr::new(127, 0, 3, 6), spin);
    b_channel.set_nonblocking(true).unwrap();
    connect(&a, &b);
    b.device.post_recv(b.qpn, recv_wr(&b, 7)).unwrap();
    b.cq.req_notify(false);
    assert!(b.cq.producer().packets_wake_waiter());
    a.device.post_send(a.qpn, send_wr(&a, 7)).unwrap();
    // Nobody on b's side polls, waits or receives: only its progress thread can.
    let deadline = Instant::now() + Duration::from_secs(5);
    while b.cq.is_empty() {
        assert!(Instant::now() < deadline, "the SEND was never received");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Counted as the progress thread's round ends, a moment after the completion.
    while b.device.stats().progress_received == 0 {
        assert!(
            Instant::now() < deadline,
            "not received by the progress thread"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut wc = [WorkCompletion::default(); 1];
    assert_eq!(b.cq.poll(&mut wc).unwrap(), 1);
    assert_eq!(wc[0].result().unwrap().opcode(), WcOpcode::Recv);
    // The event came too, for a getter that comes later.
    assert!(b_channel.get_event().is_ok());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        a.device.progress();
        if a.cq.poll(&mut wc).unwrap() == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "no ACK");
    }
    assert_eq!(wc[0].result().unwrap().opcode(), WcOpcode::Send);
}

/// A UDP device at `address` (no shared memory between devices of one process), with or
/// without its progress thread, whose RC QP completes its sends into `send_cq` and its
/// receives into `recv_cq`; as a [`Side`] whose `cq` is `recv_cq`.
fn side_with_cqs(
    address: Ipv4Addr,
    progress_thread: bool,
    send_cq: &softverbs_cq::CompletionQueue,
    recv_cq: softverbs_cq::CompletionQueue,
) -> Side {
    let mut config = DeviceConfig::udp(UdpConfig {
        address: Some(IpAddr::V4(address)),
        ..UdpConfig::default()
    });
    config.shared_memory = false;
    config.progress_thread = progress_thread;
    let mut side = side_with_cq(config, QpType::Rc, recv_cq);
    // A second QP on the same PD with the two CQs; the side's QP becomes it.
    let mut init = softverbs_proto::QpInit::new(QpType::Rc).with_pd(side.pd);
    init.sq_sig_all = true;
    side.qpn = side
        .device
        .create_qp(init, send_cq.producer(), side.cq.producer())
        .unwrap();
    side.device.set_in_process_shortcut(false);
    side
}

/// A non-blocking channel's fd polls readable on the device's packets only while it is the
/// only channel of the device's CQs. UCX has two (its `rc_verbs` and `ud_verbs`
/// interfaces), each served by a thread of its own: every packet would wake both, and one
/// thread's receive would make completions in the other's CQs while it takes its events
/// and arms, without polling after the arm (`ucx_perftest -E sleep` hung in most runs).
#[test]
fn only_the_sole_channel_of_a_device_without_an_inbox_is_woken_by_its_packets() {
    let (send_channel, recv_channel) = (
        CompletionChannel::new().unwrap(),
        CompletionChannel::new().unwrap(),
    );
    let send_cq = CqBuilder::new(16).channel(&send_channel).build().unwrap();
    let recv_cq = CqBuilder::new(16).channel(&recv_channel).build().unwrap();
    let two = side_with_cqs(Ipv4Addr::new(127, 0, 3, 9), true, &send_cq, recv_cq);
    for channel in [&send_channel, &recv_channel] {
        two.device.serve_channel_waits(channel);
        channel.set_nonblocking(true).unwrap();
    }
    send_cq.req_notify(false);
    two.cq.req_notify(false);
    assert!(!send_cq.producer().packets_wake_waiter());
    assert!(!two.cq.producer().packets_wake_waiter());

    let channel = CompletionChannel::new().unwrap();
    let send_cq = CqBuilder::new(16).channel(&channel).build().unwrap();
    let recv_cq = CqBuilder::new(16).channel(&channel).build().unwrap();
    let one = side_with_cqs(Ipv4Addr::new(127, 0, 3, 10), true, &send_cq, recv_cq);
    one.device.serve_channel_waits(&channel);
    channel.set_nonblocking(true).unwrap();
    send_cq.req_notify(false);
    one.cq.req_notify(false);
    assert!(send_cq.producer().packets_wake_waiter());
    assert!(one.cq.producer().packets_wake_waiter());

    // A device with a shared-memory inbox keeps its progress thread receiving (it spins a
    // moment for its peers' records before it sleeps, faster than a doorbell's wake-up).
    let channel = CompletionChannel::new().unwrap();
    let cq = CqBuilder::new(16).channel(&channel).build().unwrap();
    let mut config = DeviceConfig::udp(UdpConfig {
        address: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 3, 17))),
        ..UdpConfig::default()
    });
    config.shared_memory = true;
    let inbox = side_with_cq(config, QpType::Rc, cq);
    inbox.device.serve_channel_waits(&channel);
    channel.set_nonblocking(true).unwrap();
    inbox.cq.req_notify(false);
    assert!(!inbox.cq.producer().packets_wake_waiter());
}

/// UCX takes its events with a non-blocking `ibv_get_cq_event` until `EAGAIN`, then arms
/// its CQs one after the other and sleeps, with no poll in between. So a non-blocking
/// `get_event` that finds no event receives only while every CQ with a channel of the
/// device is armed: a completion it made in a CQ not yet armed would be one its caller
/// never hears of. The packet waits (the fd stays readable), and the arm of the last CQ
/// receives it, its completion raising the event. No progress thread: only these calls
/// receive.
#[test]
fn a_non_blocking_get_event_receives_only_while_every_cq_with_a_channel_is_armed() {
    let a = {
        let (side, _channel) = side_on_channel(Ipv4Addr::new(127, 0, 3, 15), Duration::ZERO);
        side
    };
    let channel = CompletionChannel::new().unwrap();
    let send_cq = CqBuilder::new(16).channel(&channel).build().unwrap();
    let recv_cq = CqBuilder::new(16).channel(&channel).build().unwrap();
    let b = side_with_cqs(Ipv4Addr::new(127, 0, 3, 16), false, &send_cq, recv_cq);
    b.device.serve_channel_waits(&channel);
    channel.set_nonblocking(true).unwrap();
    connect(&a, &b);
    b.device.post_recv(b.qpn, recv_wr(&b, 5)).unwrap();
    send_cq.req_notify(false);
    a.device.post_send(a.qpn, send_wr(&a, 5)).unwrap();
    // The SEND makes the fd readable (the socket is in its epoll set).
    let mut fds = [rustix::event::PollFd::new(
        &channel,
        rustix::event::PollFlags::IN,
    )];
    let timeout = rustix::time::Timespec {
        tv_sec: 10,
        tv_nsec: 0,
    };
    assert_eq!(rustix::event::poll(&mut fds, Some(&timeout)).unwrap(), 1);
    // The receive CQ is not armed: not received.
    let err = channel.get_event().expect_err("no event");
    assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock);
    assert!(
        b.cq.is_empty(),
        "received into a CQ its caller has yet to arm"
    );
    // Its arm receives it, and the completion raises the event.
    b.cq.req_notify(false);
    let event = channel.get_event().expect("the receive's event");
    assert!(event.is_for(b.cq.id()));
    let mut wc = [WorkCompletion::default(); 1];
    assert_eq!(b.cq.poll(&mut wc).unwrap(), 1);
    assert_eq!(wc[0].result().unwrap().opcode(), WcOpcode::Recv);
}
