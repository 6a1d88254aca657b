//! The progress thread leaves the socket to an application that polls the device itself,
//! and wakes only to see whether it still does: every wake-up takes the CPU from a thread
//! busy polling on it. Those wake-ups are counted (`DeviceStats::progress_naps`), and
//! pinned here as a count: about one per sixteenth of the shortest local ACK timeout of
//! the device's QPs (IBTA 9.7.6.1.3), at least 1 ms and at most 5 ms apart. Once a
//! millisecond (the device before), one round trip in a hundred of an 8-byte ping-pong
//! over UDP took 4-9 times the median.

mod common;

use common::rc::{connect_to, side, Side};
use softverbs_device::{DeviceConfig, Gid, UdpConfig};
use softverbs_proto::Mtu;
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
