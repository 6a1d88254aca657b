//! The private exports `softverbs_gsi_send`, `softverbs_gsi_recv` and `softverbs_gsi_fd`
//! (`SOFTVERBS_PRIVATE_1.0`, for softverbs' librdmacm) called as a Rust program calls the
//! rlib's functions: the drop-in's device (UDP on the first free 127.0.0.x, port 4791,
//! with a capture: `SOFTVERBS_PCAP`) exchanges management datagrams QP1 to QP1 (IBTA vol.
//! 1 13.5: QP1, Q_Key 0x80010000) with a second device of the process over real sockets
//! (the in-process shortcut off on both), tshark reads the captured MAD as an InfiniBand
//! CM ConnectRequest, the fd polls readable exactly while a MAD waits, and bad arguments
//! are refused with errno, never a crash. At `SOFTVERBS_PRIVATE_1.1`: the device's share of
//! its address, and the services its CM listens on (one listener per address and port).
//! At `SOFTVERBS_PRIVATE_1.2`: `softverbs_app_waits` refuses what is not a context of ours
//! (what it does is pinned by the device's `tests/progress_naps.rs`).
//!
//! Alone in its test binary: it sets the environment before the drop-in opens its device.
//! Every wait is bounded.

use softverbs::core::device::{Device, DeviceConfig, UdpConfig};
use softverbs_capi::abi::{ibv_context, ibv_gid};
use softverbs_capi::device::{ibv_get_device_list, ibv_open_device, ibv_query_gid};
use softverbs_capi::gsi::{
    softverbs_app_waits, softverbs_gsi_fd, softverbs_gsi_listen, softverbs_gsi_recv,
    softverbs_gsi_send, softverbs_gsi_share, softverbs_gsi_unlisten,
};
use softverbs_capi::handles::ContextBlock;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The capture file of the drop-in's device.
fn capture_path() -> PathBuf {
    std::env::temp_dir().join(format!("softverbs-gsi-exports-{}.pcap", std::process::id()))
}

/// The drop-in's context, opened once for the binary: UDP on the first free 127.0.0.x
/// (port 4791), with a capture, the in-process shortcut off so MADs take the socket.
fn context() -> *mut ibv_context {
    static CONTEXT: OnceLock<usize> = OnceLock::new();
    let ctx = *CONTEXT.get_or_init(|| {
        for var in ["SOFTVERBS_ADDR", "SOFTVERBS_NETWORK", "SOFTVERBS_FAULTS"] {
            std::env::remove_var(var);
        }
        std::env::set_var("SOFTVERBS_PCAP", capture_path());
        let mut n = 0;
        // SAFETY: `n` is writable; the list is never freed (the device lives for the
        // process anyway).
        let list = unsafe { ibv_get_device_list(&mut n) };
        assert!(!list.is_null() && n == 1, "errno {}", errno());
        // SAFETY: `list` holds one device.
        let ctx = unsafe { ibv_open_device(*list) };
        assert!(!ctx.is_null(), "ibv_open_device: errno {}", errno());
        device(ctx).set_in_process_shortcut(false);
        ctx as usize
    });
    ctx as *mut ibv_context
}

/// The drop-in's device behind `ctx`.
fn device(ctx: *mut ibv_context) -> &'static Device {
    // SAFETY: `ctx` is open and never closed.
    &unsafe { ContextBlock::from_ptr(ctx) }.unwrap().entry.device
}

/// GID index 1 of `ctx` (its address as `::ffff:127.0.0.x`).
fn context_gid(ctx: *mut ibv_context) -> [u8; 16] {
    let mut gid = ibv_gid { raw: [0; 16] };
    // SAFETY: `ctx` is open, `gid` writable.
    assert_eq!(unsafe { ibv_query_gid(ctx, 1, 1, &mut gid) }, 0);
    // SAFETY: every 16-byte pattern is a valid `[u8; 16]`.
    unsafe { gid.raw }
}

/// A CM ConnectRequest MAD (the IBTA 13.4 MAD header: base version 1, class 0x07 CM,
/// class version 2, method 0x03 SEND, AttributeID 0x0010 REQ) with TransactionID `tag`.
fn cm_req(tag: u8) -> Vec<u8> {
    let mut mad = vec![0u8; 256];
    mad[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
    mad[8..16].copy_from_slice(&[tag; 8]);
    mad[16..18].copy_from_slice(&0x0010u16.to_be_bytes());
    mad
}

/// Whether `fd` polls readable within `ms` milliseconds.
fn readable_within(fd: i32, ms: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut pfd, 1, ms) == 1 }
}

/// IBTA 13.5 through the private exports: a MAD sent with `softverbs_gsi_send` reaches
/// the peer device's QP1 over UDP from our GID and SrcQP 1; the peer's answer makes
/// `softverbs_gsi_fd` readable, `softverbs_gsi_recv` returns its 256 bytes with the
/// peer's GID and QP 1, then -1 with `EAGAIN`, and the fd is no longer readable. The
/// capture holds both MADs, which tshark decodes as an InfiniBand CM ConnectRequest and
/// ConnectReply.
#[test]
fn the_exports_exchange_mads_with_another_device_over_udp_and_the_capture_shows_them() {
    let ctx = context();
    let peer = Device::open(DeviceConfig::udp(UdpConfig::default())).expect("the peer");
    peer.set_in_process_shortcut(false);
    let peer_gid = peer.query_gid(1, 1).unwrap();
    let request = cm_req(0x5A);
    // SAFETY: `ctx` open; the GID and the MAD are readable for their lengths.
    let sent = unsafe {
        softverbs_gsi_send(
            ctx,
            peer_gid.as_ptr(),
            request.as_ptr().cast(),
            request.len(),
        )
    };
    assert_eq!(sent, 0, "errno {}", errno());
    let deadline = Instant::now() + Duration::from_secs(5);
    let got = loop {
        if let Some(mad) = peer.gsi_recv() {
            break mad;
        }
        assert!(Instant::now() < deadline, "{}", peer.counters());
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(
        (got.bytes.as_slice(), got.sgid, got.src_qpn),
        (request.as_slice(), context_gid(ctx), 1)
    );

    // SAFETY: `ctx` is open.
    let fd = unsafe { softverbs_gsi_fd(ctx) };
    assert!(fd >= 0, "errno {}", errno());
    assert!(!readable_within(fd, 0), "nothing waits yet");
    let mut reply = cm_req(0xA5);
    reply[16..18].copy_from_slice(&0x0013u16.to_be_bytes()); // REP
    peer.gsi_send(got.sgid, &reply).unwrap();
    assert!(readable_within(fd, 5000), "the answer arrives within 5 s");
    let mut buf = [0u8; 300];
    let mut sgid = [0u8; 16];
    let mut src_qpn = 0u32;
    // SAFETY: `ctx` open; `sgid`, `src_qpn` and `buf` writable for their sizes.
    let n = unsafe {
        softverbs_gsi_recv(
            ctx,
            sgid.as_mut_ptr(),
            &mut src_qpn,
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    assert_eq!(n, 256, "errno {}", errno());
    assert_eq!(
        (&buf[..256], sgid, src_qpn),
        (reply.as_slice(), peer_gid, 1)
    );
    assert!(!readable_within(fd, 0), "no MAD waits any more");
    // SAFETY: as above; NULL sgid and src_qpn are allowed.
    let none = unsafe {
        softverbs_gsi_recv(
            ctx,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    assert_eq!((none, errno()), (-1, libc::EAGAIN));
    let ours = device(ctx).counters();
    assert_eq!((ours.gsi_sent, ours.gsi_received), (1, 1), "{ours}");

    device(ctx).flush_capture().unwrap();
    let out = Command::new("tshark")
        .arg("-r")
        .arg(capture_path())
        .arg("-V")
        .output()
        .expect("run tshark (Debian package tshark)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "Unreliable Datagram (UD) - SEND only",
        "Destination Queue Pair: 0x000001",
        "Queue Key: 0x0000000080010000",
        "Source Queue Pair: 0x00000001",
        "Management Class: 0x07",
        "CM ConnectRequest",
        "CM ConnectReply",
    ] {
        assert!(
            text.contains(expected),
            "tshark lacks {expected:?}:\n{text}"
        );
    }
    let _ = std::fs::remove_file(capture_path());
}

/// The exports refuse what is not a context of ours, NULL pointers and lengths outside
/// a MAD (1..=256 to send; a receive buffer under 256 bytes) with `EINVAL` in their own
/// conventions (errno returned, or -1 with errno), and take nothing off the inbox.
#[test]
fn the_exports_refuse_bad_arguments_with_einval() {
    let ctx = context();
    let mad = cm_req(1);
    let gid = [0u8; 16];
    let mut buf = [0u8; 256];
    let null_ctx: *mut ibv_context = std::ptr::null_mut();
    // SAFETY: every pointer is NULL or valid for its length; the functions check.
    unsafe {
        assert_eq!(
            softverbs_gsi_send(null_ctx, gid.as_ptr(), mad.as_ptr().cast(), 256),
            libc::EINVAL
        );
        assert_eq!(
            softverbs_gsi_send(ctx, std::ptr::null(), mad.as_ptr().cast(), 256),
            libc::EINVAL
        );
        assert_eq!(
            softverbs_gsi_send(ctx, gid.as_ptr(), std::ptr::null(), 256),
            libc::EINVAL
        );
        assert_eq!(
            softverbs_gsi_send(ctx, gid.as_ptr(), mad.as_ptr().cast(), 0),
            libc::EINVAL
        );
        let long = [0u8; 257];
        assert_eq!(
            softverbs_gsi_send(ctx, gid.as_ptr(), long.as_ptr().cast(), 257),
            libc::EINVAL
        );
        assert_eq!(errno(), libc::EINVAL);
        let no = std::ptr::null_mut();
        let recv = |ctx, buf: *mut u8, len| softverbs_gsi_recv(ctx, no, no.cast(), buf.cast(), len);
        assert_eq!(
            (recv(null_ctx, buf.as_mut_ptr(), 256), errno()),
            (-1, libc::EINVAL)
        );
        assert_eq!(
            (recv(ctx, std::ptr::null_mut(), 256), errno()),
            (-1, libc::EINVAL)
        );
        assert_eq!(
            (recv(ctx, buf.as_mut_ptr(), 255), errno()),
            (-1, libc::EINVAL)
        );
        assert_eq!((softverbs_gsi_fd(null_ctx), errno()), (-1, libc::EINVAL));
        let fd = softverbs_gsi_fd(ctx);
        assert!(fd >= 0);
        assert_eq!(softverbs_gsi_fd(ctx), fd, "one fd, owned by the device");
        assert_eq!(softverbs_app_waits(null_ctx), libc::EINVAL);
        assert_eq!(softverbs_app_waits(ctx), 0);
    }
}

/// A device alone on its address holds share 0 (the high byte of its CM's communication
/// IDs); a service is listened on once per address — a second listen is `EADDRINUSE`, as
/// `rdma_listen` on a port in use — and is free again after the unlisten. A context that
/// is not ours is `EINVAL` for all three.
#[test]
fn a_service_is_listened_on_once_per_address_and_a_lone_device_holds_share_0() {
    let ctx = context();
    // The services table lives in the address's members file, in /dev/shm: a device
    // without one (SOFTVERBS_NETWORK=udp, or /dev/shm full) has an address of its own.
    assert!(
        device(ctx).sharing().is_some(),
        "the device has no shared-memory inbox: is /dev/shm full? ({})",
        device(ctx).stats_line()
    );
    let service = 0x0000_0000_0106_1D2F; // RDMA_PS_TCP, port 7471
    let null_ctx: *mut ibv_context = std::ptr::null_mut();
    // SAFETY: `ctx` is open; NULL is allowed and refused.
    unsafe {
        assert_eq!(softverbs_gsi_share(ctx), 0);
        assert_eq!(softverbs_gsi_listen(ctx, service), 0);
        assert_eq!(softverbs_gsi_listen(ctx, service), libc::EADDRINUSE);
        assert_eq!(errno(), libc::EADDRINUSE);
        assert_eq!(softverbs_gsi_unlisten(ctx, service), 0);
        assert_eq!(softverbs_gsi_listen(ctx, service), 0);
        assert_eq!(softverbs_gsi_unlisten(ctx, service), 0);
        assert_eq!((softverbs_gsi_share(null_ctx), errno()), (-1, libc::EINVAL));
        assert_eq!(softverbs_gsi_listen(null_ctx, service), libc::EINVAL);
        assert_eq!(softverbs_gsi_unlisten(null_ctx, service), libc::EINVAL);
    }
}
