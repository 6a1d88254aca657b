//! An RC pair of devices for the device tests: each side a device, one CQ, one RC QP
//! and 64 KiB of registered memory with every access right, connected as
//! `ibv_rc_pingpong` connects (INIT, RTR, RTS; PSNs start at 100), and a bounded wait for
//! completions that drives progress as a busy-polling application does.

use softverbs_cq::{CompletionQueue, CqBuilder, WcStatus, WorkCompletion};
use softverbs_device::{Device, DeviceConfig};
use softverbs_proto::{
    AccessFlags, AddressVector, AttrMask, Mtu, QpAttr, QpInit, QpState, QpType, RecvWr, SendOp,
    SendWr, Sge,
};
use std::time::{Duration, Instant};

/// The first PSN of both directions.
pub const FIRST_PSN: u32 = 100;

/// One side of a connection.
pub struct Side {
    pub device: Device,
    pub qp_type: QpType,
    /// The protection domain of the QP and of `buf`'s region.
    pub pd: u32,
    pub cq: CompletionQueue,
    pub qpn: u32,
    pub buf: Vec<u8>,
    pub lkey: u32,
    pub rkey: u32,
}

/// One side of an RC connection.
pub fn side(config: DeviceConfig) -> Side {
    side_of(config, QpType::Rc)
}

/// One side of a connection of `qp_type` (RC or UC).
pub fn side_of(config: DeviceConfig, qp_type: QpType) -> Side {
    side_with_cq(config, qp_type, CqBuilder::new(256).build().unwrap())
}

/// One side of a connection of `qp_type` whose QP completes into `cq`.
pub fn side_with_cq(config: DeviceConfig, qp_type: QpType, cq: CompletionQueue) -> Side {
    let device = Device::open(config).unwrap();
    let pd = device.alloc_pd();
    // The QP and its memory share a PD: a key of another PD is refused (IBTA ch. 10).
    let mut init = QpInit::new(qp_type).with_pd(pd);
    init.sq_sig_all = true;
    let qpn = device
        .create_qp(init, cq.producer(), cq.producer())
        .unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    // SAFETY: `buf` lives in `Side` beside the device and is deregistered implicitly when
    // both drop together; nothing else touches it while the device may.
    let region = unsafe {
        device.reg_mr(
            pd,
            buf.as_mut_ptr() as usize,
            buf.len() as u64,
            buf.as_mut_ptr() as u64,
            access,
        )
    }
    .unwrap();
    Side {
        device,
        qp_type,
        pd,
        cq,
        qpn,
        buf,
        lkey: region.lkey,
        rkey: region.rkey,
    }
}

/// Connects `a` and `b` (both RC or both UC) as `ibv_rc_pingpong` and `ibv_uc_pingpong`
/// do: the attributes `ibv_modify_qp(3)` requires for each transition of the QP type.
/// Both sides use GID index 0 (`-g 0`).
pub fn connect(a: &Side, b: &Side) {
    connect_through(a, b, 0, 0);
}

/// [`connect`] with `a` on GID index `a_gid` and `b` on `b_gid`: each side's
/// `sgid_index` is its own index, and the peer's path its GID at that index (as the
/// pingpongs exchange `ibv_query_gid(gidx)`).
pub fn connect_through(a: &Side, b: &Side, a_gid: u8, b_gid: u8) {
    connect_with(a, b, a_gid, b_gid, Mtu::Mtu1024);
}

/// [`connect`] at path MTU `mtu`.
pub fn connect_mtu(a: &Side, b: &Side, mtu: Mtu) {
    connect_with(a, b, 0, 0, mtu);
}

fn connect_with(a: &Side, b: &Side, a_gid: u8, b_gid: u8, mtu: Mtu) {
    for (me, peer, my_gid, peer_gid) in [(a, b, a_gid, b_gid), (b, a, b_gid, a_gid)] {
        let dgid = peer.device.gid(u32::from(peer_gid)).unwrap().0;
        connect_to(me, dgid, peer.qpn, my_gid, mtu);
    }
}

/// Takes `me`'s QP through INIT and RTR to RTS, connected to QP `dest_qpn` at `dgid` (a
/// device of the test or a peer it plays itself), on `me`'s GID index `sgid_index`.
pub fn connect_to(me: &Side, dgid: [u8; 16], dest_qpn: u32, sgid_index: u8, mtu: Mtu) {
    let rc = me.qp_type == QpType::Rc;
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: if rc {
            AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC
        } else {
            AccessFlags::REMOTE_WRITE
        },
        ..QpAttr::default()
    };
    me.device
        .modify_qp(
            me.qpn,
            &init,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
        )
        .unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: mtu,
        dest_qp_num: dest_qpn,
        rq_psn: FIRST_PSN,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        ah_attr: AddressVector {
            dgid,
            sgid_index,
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..AddressVector::default()
        },
        ..QpAttr::default()
    };
    let mut mask =
        AttrMask::STATE | AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN;
    if rc {
        mask |= AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
    }
    me.device.modify_qp(me.qpn, &rtr, mask).unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: FIRST_PSN,
        // ibv_rc_pingpong's local ACK timeout (4.096 µs · 2^14 ≈ 67 ms): a shorter one
        // lets a starved progress thread on a loaded 2-core machine exhaust the retries
        // of a lossless path.
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 4,
        ..QpAttr::default()
    };
    let mut mask = AttrMask::STATE | AttrMask::SQ_PSN;
    if rc {
        mask |= AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::MAX_QP_RD_ATOMIC;
    }
    me.device.modify_qp(me.qpn, &rts, mask).unwrap();
}

/// Polls until `n` completions arrived, driving progress as a busy-polling application
/// does; bounded in time.
pub fn wait_for(side: &Side, n: usize) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    let mut wcs = [WorkCompletion::default(); 16];
    while got.len() < n {
        let k = side.cq.poll(&mut wcs).unwrap();
        got.extend_from_slice(&wcs[..k]);
        if k == 0 {
            side.device.progress();
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {n} completions",
            got.len()
        );
    }
    got
}

/// A receive of 64 bytes at the start of `side`'s buffer.
pub fn recv_wr(side: &Side, wr_id: u64) -> RecvWr {
    let sge = Sge {
        addr: side.buf.as_ptr() as u64,
        length: 64,
        lkey: side.lkey,
    };
    RecvWr::new(wr_id, [sge])
}

/// A SEND of 8 bytes at offset 1024 of `side`'s buffer.
pub fn send_wr(side: &Side, wr_id: u64) -> SendWr {
    let sge = Sge {
        addr: side.buf.as_ptr() as u64 + 1024,
        length: 8,
        lkey: side.lkey,
    };
    SendWr::new(wr_id, SendOp::Send, [sge])
}

/// The next completion of `side`, which must be a success, polling as a busy-polling
/// application does (into an array: nothing allocated); bounded in time.
pub fn wait_one(side: &Side) -> WorkCompletion {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut wcs = [WorkCompletion::default(); 1];
    loop {
        if side.cq.poll(&mut wcs).unwrap() == 1 {
            assert_eq!(wcs[0].status(), WcStatus::Success, "{:?}", wcs[0]);
            return wcs[0];
        }
        side.device.progress();
        assert!(Instant::now() < deadline, "no completion");
    }
}

/// Two in-process devices with an RC QP each, connected, each with one receive posted: the
/// ping-pong pair of the allocation and instruction-count tests.
pub fn in_process_pair() -> (Side, Side) {
    let (a, b) = (
        side(DeviceConfig::in_process()),
        side(DeviceConfig::in_process()),
    );
    connect(&a, &b);
    for side in [&a, &b] {
        side.device.post_recv(side.qpn, recv_wr(side, 0)).unwrap();
    }
    (a, b)
}
