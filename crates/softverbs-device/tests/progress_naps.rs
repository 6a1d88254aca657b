//! The progress thread leaves the socket to an application that polls the device itself,
//! and wakes only to see whether it still does: every wake-up takes the CPU from a thread
//! busy polling on it. Those wake-ups are counted (`DeviceStats::progress_naps`), and
//! pinned here as a count: about one per sixteenth of the shortest local ACK timeout of
//! the device's QPs (IBTA 9.7.6.1.3), at least 1 ms and at most 5 ms apart. Once a
//! millisecond (the device before), one round trip in a hundred of an 8-byte ping-pong
//! over UDP took 4-9 times the median. An application that stops polling to block
//! elsewhere says so (`Device::app_waits`), and the nap ends at once.

mod common;

use common::rc::{connect_to, side, side_with_cq, Side};
use common::{send, send_only};
use softverbs_cq::CqBuilder;
use softverbs_device::{DeviceConfig, Endpoint, Gid, UdpConfig, UdpTransport};
use softverbs_proto::{Mtu, QpType};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

/// How long the application polls.
const POLLING: Duration = Duration::from_millis(300);

/// Polls `side` as a busy-polling application does (CQ empty: the device's progress) for
/// [`POLLING`]; returns the progress thread's naps meanwhile.
fn naps_while_polling(side: &Side) -> u64 {
    let before = side.device.stats().progress_naps;
    let mut wcs = [softverbs_cq::WorkCompletion::default(); 4];
    let start = Instant::now();
    while start.elapsed() < POLLING {
        assert_eq!(side.cq.poll(&mut wcs).unwrap(), 0);
        side.device.progress();
    }
    side.device.stats().progress_naps - before
}

/// An RC QP connected as `ibv_rc_pingpong` connects (local ACK timeout 14: 67 ms), its
/// peer an address nobody answers on: nothing moves, the application only polls. The
/// progress thread naps 4.19 ms at a time, about 72 naps in 300 ms; the device before
/// napped 1 ms at a time (about 300).
#[test]
fn a_polling_application_is_interrupted_once_per_sixteenth_of_the_ack_timeout() {
    let a = side(DeviceConfig::udp(UdpConfig {
        address: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 237))),
        ..UdpConfig::default()
    }));
    let peer = Gid::from_ip(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 239))).octets();
    connect_to(&a, peer, 0x51, 0, Mtu::Mtu1024);
    // The first poll tells the progress thread the application polls; give it a nap to
    // notice, then count.
    naps_while_polling(&a);
    let naps = naps_while_polling(&a);
    // A loaded machine makes naps longer, never shorter: only an upper bound, halfway
    // between the 72 expected and the 300 of a 1 ms nap.
    assert!(
        naps <= 150,
        "{naps} naps of the progress thread in {POLLING:?} of polling"
    );
    assert!(a.device.stats().to_string().contains("progress: naps="));
}

/// How long after the application's last poll the progress thread leaves the packets to
/// it at least (the device's polling window, 1 ms), less a margin.
const STILL_POLLING: Duration = Duration::from_micros(800);

/// Trials of [`taken_at_once`].
const TRIALS: u64 = 20;

/// A UDP device at 127.0.2.`last`.
fn udp_at(last: u8) -> DeviceConfig {
    DeviceConfig::udp(UdpConfig {
        address: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 2, last))),
        ..UdpConfig::default()
    })
}

/// [`TRIALS`] times: the application polls `a` (so its progress thread naps, leaving the
/// socket to it), then does `stop` (what it does before it blocks somewhere that receives
/// nothing for the device), then a peer at 127.0.2.`peer` sends it a packet (a SEND to a QP
/// the device does not have: received, and dropped by the engine). Returns in how many
/// trials the progress thread took the packet within [`STILL_POLLING`] of the last poll:
/// a progress thread that napped on cannot (it leaves the packets to the application for
/// the polling window), so each such trial is one where `stop` (or the state `a` was left
/// in) ended its nap.
fn taken_at_once(a: &Side, peer: u8, stop: impl Fn(&Side)) -> u64 {
    taken_at_once_after(a, peer, 100, stop)
}

/// [`taken_at_once`], the application polling `polls` times before each trial's `stop`.
fn taken_at_once_after(a: &Side, peer: u8, polls: u32, stop: impl Fn(&Side)) -> u64 {
    let peer = UdpTransport::bind(UdpConfig {
        address: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 2, peer))),
        ..UdpConfig::default()
    })
    .expect("bind the peer");
    let to = Endpoint::new(a.device.address(), 4791);
    let received = || a.device.stats().progress_received;
    let start = Instant::now();
    let mut at_once = 0;
    for trial in 0..TRIALS {
        for _ in 0..polls {
            a.device.progress();
        }
        let polled = Instant::now();
        let before = received();
        stop(a);
        send(&peer, &to, send_only(trial as u32, b"wake"));
        while polled.elapsed() < STILL_POLLING && received() == before {
            std::thread::sleep(Duration::from_micros(20));
        }
        if received() > before {
            at_once += 1;
        }
        // Taken by the progress thread in any case, within its nap.
        while received() == before {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the progress thread never received the packet"
            );
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    eprintln!("{at_once} of {TRIALS} packets taken by the progress thread at once");
    at_once
}

/// An application that polled the device and then blocks in a call that receives nothing
/// for it — librdmacm's `rdma_get_cm_event`, waiting for the REP or the RTU the device must
/// receive — says so with `Device::app_waits`: the progress thread takes the next packet at
/// once, not after its nap (up to 5 ms; perftest's `-R` connection waited 3-4 ms for its
/// ESTABLISHED event so). One trial of [`TRIALS`] is required (a loaded machine may delay
/// the wake-up of the thread); without the call none can succeed.
#[test]
fn an_application_about_to_wait_elsewhere_ends_the_progress_threads_nap() {
    let at_once = taken_at_once(&side(udp_at(1)), 2, |a| a.device.app_waits());
    assert!(
        at_once >= 1,
        "the progress thread kept napping after the application said it waits elsewhere"
    );
}

/// The event loop of a program that sleeps on the completion channel's fd with its own
/// `poll`/`epoll` (UCX, libfabric) polls the CQ, arms it (`ibv_req_notify_cq(3)`), polls
/// once more and sleeps where no packet wakes it: only the progress thread can receive the
/// packet that makes the completion. An armed CQ ends the progress thread's nap, and keeps
/// it receiving while the application still polled a moment ago. The device before let
/// each such event wait for the nap: an 8-byte RC ping-pong of two processes sleeping so
/// took 4.7 ms per round trip (over UDP and through shared memory alike; 0.1 ms after).
#[test]
fn an_armed_cq_ends_the_progress_threads_nap() {
    let at_once = taken_at_once(&side(udp_at(3)), 4, |a| {
        a.cq.req_notify(false);
        // The poll after the arm (the standard loop's: arm, poll once more, sleep).
        let mut wcs = [softverbs_cq::WorkCompletion::default(); 4];
        assert_eq!(a.cq.poll(&mut wcs).unwrap(), 0);
        a.device.progress();
    });
    assert!(
        at_once >= 1,
        "the progress thread kept napping while a CQ was armed"
    );
}

/// A CQ armed before any QP used it (programs often arm a CQ as they create it) counts from
/// the QP's creation on: the application polls a little, then sleeps on the channel's fd
/// without arming again, and the progress thread takes the packet at once. The device
/// before knew of an arm only as it happened, so it napped on. (Ten polls a trial, 200 in
/// all: fewer than make a busy poller of the application, see the next test.)
#[test]
fn a_cq_armed_before_its_qp_was_created_ends_the_progress_threads_nap() {
    let cq = CqBuilder::new(256).build().unwrap();
    cq.req_notify(false);
    let a = side_with_cq(udp_at(5), QpType::Rc, cq);
    let at_once = taken_at_once_after(&a, 6, 10, |_| {});
    assert!(
        at_once >= 1,
        "the progress thread kept napping while a CQ armed before its QP was"
    );
}

/// A CQ armed for good beside a busy poller (UCX arms the CQs of its `ud_verbs` transport
/// for its own thread, which sleeps on their channel, and polls every transport in its
/// progress loop): once the application has polled the device 1,024 times since the arm,
/// it is taken for a busy poller, whose polls receive the packets, and the progress thread
/// naps as for one (at most 0.5 ms at a time while a CQ is armed; 35 naps in 300 ms here
/// with this file's other tests polling beside it on two cores). The device before kept
/// the progress thread receiving beside the poller for as long as the CQ stayed armed, and
/// it never napped (0 naps, whatever the load): its receives took the poller's packets and
/// its core, and `ucx_perftest -t tag_lat` averaged 10 us one way through the drop-in
/// instead of 4. An arm starts the count again (the previous tests). Three naps are
/// required: a loaded machine delays the thread's wake-ups, never adds naps.
#[test]
fn a_cq_armed_for_good_beside_a_busy_poller_lets_the_progress_thread_nap() {
    let a = side(udp_at(7));
    a.cq.req_notify(false);
    // The first 1,024 polls after the arm, and a nap to notice.
    naps_while_polling(&a);
    let naps = naps_while_polling(&a);
    eprintln!("{naps} naps in {POLLING:?} of polling with a CQ armed");
    assert!(
        naps >= 3,
        "{naps} naps of the progress thread in {POLLING:?} of polling with a CQ armed for good"
    );
}
