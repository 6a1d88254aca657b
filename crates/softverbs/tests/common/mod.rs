//! Helpers shared by the integration tests: pairs of contexts (in-process, or UDP on
//! explicit 127.0.0.x addresses with the in-process shortcut off), RC connection as
//! `ibv_rc_pingpong` does it, and bounded waiting for completions.

#![allow(dead_code)]

use softverbs::*;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

/// Longest any test waits for completions.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Every access right a test region may need.
pub const ALL_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// An in-process context.
pub fn in_process() -> Context {
    Context::open_with(DeviceConfig::in_process()).expect("open an in-process device")
}

/// A UDP context on 127.0.0.`last`, with the in-process shortcut off so every packet
/// crosses the kernel as RoCEv2.
pub fn udp(last: u8) -> Context {
    let config = DeviceConfig {
        name: format!("softverbs-api{last}"),
        network: Network::Udp(UdpConfig {
            address: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))),
            ..UdpConfig::default()
        }),
        engine: Default::default(),
        progress_thread: true,
        faults: None,
        capture: None,
        shared_memory: true,
    };
    let ctx = Context::open_with(config).expect("open a UDP device");
    ctx.device().set_in_process_shortcut(false);
    ctx
}

/// One side of a connection: context, PD, one CQ for both queues, an RC QP, a region.
pub struct Side {
    pub ctx: Context,
    pub pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
    pub mr: Mr,
}

/// A side with a QP of `qp_type` (every send signaled) and a 64 KiB region.
pub fn side(ctx: Context, qp_type: QpType) -> Side {
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256).unwrap();
    let qp = pd
        .qp_builder(qp_type, &cq, &cq)
        .sq_sig_all(true)
        .build()
        .unwrap();
    let mr = pd.reg_mr(64 * 1024, ALL_ACCESS).unwrap();
    Side {
        ctx,
        pd,
        cq,
        qp,
        mr,
    }
}

/// Connects two RC or UC QPs both ways (RESET → INIT → RTR → RTS), PSNs 100 and 200.
pub fn connect(a: &Side, b: &Side) {
    let access = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let access = if a.qp.qp_type() == QpType::Uc {
        AccessFlags::REMOTE_WRITE
    } else {
        access
    };
    for (me, peer, peer_psn, my_psn) in [(a, b, 200, 100), (b, a, 100, 200)] {
        me.qp.to_init(access).unwrap();
        me.qp.to_rtr(peer.qp.local_info(peer_psn)).unwrap();
        me.qp.to_rts(RtsAttr::new(my_psn)).unwrap();
    }
}

/// A connected pair of RC sides.
pub fn rc_pair(a: Context, b: Context) -> (Side, Side) {
    let (a, b) = (side(a, QpType::Rc), side(b, QpType::Rc));
    connect(&a, &b);
    (a, b)
}

/// Polls `cq` until `n` completions arrived (the poll itself drives progress); panics
/// after [`PATIENCE`].
pub fn wait_for(cq: &Cq, n: usize) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + PATIENCE;
    let mut got = Vec::new();
    let mut wcs = [WorkCompletion::default(); 16];
    while got.len() < n {
        let k = cq.poll(&mut wcs).expect("poll");
        got.extend_from_slice(&wcs[..k]);
        assert!(
            Instant::now() < deadline,
            "only {} of {n} completions: {got:?}",
            got.len()
        );
        if k == 0 {
            std::thread::yield_now();
        }
    }
    got
}

/// Polls `cq` for `quiet` and asserts that nothing arrived.
pub fn assert_nothing_for(cq: &Cq, quiet: Duration) {
    let deadline = Instant::now() + quiet;
    let mut wcs = [WorkCompletion::default(); 4];
    while Instant::now() < deadline {
        assert_eq!(cq.poll(&mut wcs).unwrap(), 0, "unexpected {:?}", wcs[0]);
        std::thread::sleep(Duration::from_millis(1));
    }
}
