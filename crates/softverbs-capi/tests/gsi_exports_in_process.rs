//! The private exports `softverbs_gsi_send`, `softverbs_gsi_recv` and `softverbs_gsi_fd`
//! (`SOFTVERBS_PRIVATE_1.0`) on the in-process path: with `SOFTVERBS_NETWORK=inprocess`
//! and fault injection that changes nothing (`SOFTVERBS_FAULTS=drop=0`, so every packet
//! goes through the fault middleware), the drop-in's device and a second in-process
//! device of the process exchange management datagrams QP1 to QP1 (IBTA vol. 1 13.5: QP1,
//! Q_Key 0x80010000), with no socket.
//!
//! Alone in its test binary: it sets the environment before the drop-in opens its device.
//! Every wait is bounded.

use softverbs::core::device::{Device, DeviceConfig};
use softverbs_capi::abi::ibv_gid;
use softverbs_capi::device::{ibv_get_device_list, ibv_open_device, ibv_query_gid};
use softverbs_capi::gsi::{softverbs_gsi_fd, softverbs_gsi_recv, softverbs_gsi_send};
use std::time::{Duration, Instant};

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// IBTA 13.5 in process: a MAD sent through `softverbs_gsi_send` reaches the other
/// device from our GID and SrcQP 1; its answer makes `softverbs_gsi_fd` readable and
/// `softverbs_gsi_recv` returns it, then `EAGAIN`.
#[test]
fn the_exports_exchange_mads_with_an_in_process_device_through_the_fault_layer() {
    std::env::remove_var("SOFTVERBS_PCAP");
    std::env::set_var("SOFTVERBS_NETWORK", "inprocess");
    std::env::set_var("SOFTVERBS_FAULTS", "drop=0,seed=5");
    let mut n = 0;
    // SAFETY: `n` writable; the list is never freed (the device lives for the process).
    let list = unsafe { ibv_get_device_list(&mut n) };
    assert!(!list.is_null() && n == 1, "errno {}", errno());
    // SAFETY: `list` holds one device.
    let ctx = unsafe { ibv_open_device(*list) };
    assert!(!ctx.is_null(), "errno {}", errno());
    let mut gid = ibv_gid { raw: [0; 16] };
    // SAFETY: `ctx` open, `gid` writable.
    assert_eq!(unsafe { ibv_query_gid(ctx, 1, 1, &mut gid) }, 0);
    // SAFETY: every 16-byte pattern is a valid `[u8; 16]`.
    let our_gid = unsafe { gid.raw };
    assert_eq!(&our_gid[12..14], &[127, 1], "an in-process address");

    let peer = Device::open(DeviceConfig::in_process()).unwrap();
    let peer_gid = peer.query_gid(1, 1).unwrap();
    let mut mad = vec![0u8; 256];
    mad[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
    // SAFETY: `ctx` open; the GID and the MAD readable for their lengths.
    let sent = unsafe { softverbs_gsi_send(ctx, peer_gid.as_ptr(), mad.as_ptr().cast(), 256) };
    assert_eq!(sent, 0, "errno {}", errno());
    let deadline = Instant::now() + Duration::from_secs(5);
    let got = loop {
        if let Some(got) = peer.gsi_recv() {
            break got;
        }
        assert!(Instant::now() < deadline, "{}", peer.counters());
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(
        (got.bytes.as_slice(), got.sgid, got.src_qpn),
        (&mad[..], our_gid, 1)
    );

    mad[3] = 0x81; // another method, to tell the answer apart
    peer.gsi_send(our_gid, &mad).unwrap();
    // SAFETY: `ctx` open.
    let fd = unsafe { softverbs_gsi_fd(ctx) };
    assert!(fd >= 0);
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let ready = unsafe { libc::poll(&mut pfd, 1, 5000) };
    assert_eq!(ready, 1, "readable within 5 s");
    let mut buf = [0u8; 256];
    let (mut sgid, mut src_qpn) = ([0u8; 16], 0u32);
    // SAFETY: `ctx` open; the outputs writable for their sizes.
    let n = unsafe {
        softverbs_gsi_recv(
            ctx,
            sgid.as_mut_ptr(),
            &mut src_qpn,
            buf.as_mut_ptr().cast(),
            256,
        )
    };
    assert_eq!((n, &buf[..], sgid, src_qpn), (256, &mad[..], peer_gid, 1));
    // SAFETY: as above.
    let none = unsafe {
        softverbs_gsi_recv(
            ctx,
            sgid.as_mut_ptr(),
            &mut src_qpn,
            buf.as_mut_ptr().cast(),
            256,
        )
    };
    assert_eq!((none, errno()), (-1, libc::EAGAIN));
    // SAFETY: one valid pollfd.
    let ready = unsafe { libc::poll(&mut pfd, 1, 0) };
    assert_eq!(ready, 0, "no longer readable");
}
