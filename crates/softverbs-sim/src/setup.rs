//! Helpers that build the usual scenarios: QPs brought to RTS the way `ibv_rc_pingpong`
//! does (reference §4.2), memory regions, and seed lists with replay by environment.

use softverbs_proto::{
    AccessFlags, AddressVector, AttrMask, Mtu, QpAttr, QpCaps, QpInit, QpState, QpType, SrqId,
};

use crate::sim::{Sim, SimError, SimErrorKind};

/// Connection parameters for [`connect`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpParams {
    /// Path MTU (RC / UC).
    pub mtu: Mtu,
    /// Local ACK timeout code (RC).
    pub timeout: u8,
    /// `retry_cnt` (RC).
    pub retry_cnt: u8,
    /// `rnr_retry` (RC).
    pub rnr_retry: u8,
    /// `min_rnr_timer` (RC).
    pub min_rnr_timer: u8,
    /// `max_rd_atomic` (RC).
    pub max_rd_atomic: u8,
    /// `max_dest_rd_atomic` (RC).
    pub max_dest_rd_atomic: u8,
    /// `qp_access_flags`.
    pub access: AccessFlags,
    /// `sq_sig_all`.
    pub sq_sig_all: bool,
    /// Queue sizes.
    pub caps: QpCaps,
    /// UD Q_Key.
    pub qkey: u32,
    /// Protection domain of the QPs (regions of [`SimMemory::register`] are in PD 0).
    ///
    /// [`SimMemory::register`]: crate::SimMemory::register
    pub pd: u32,
    /// Initial send PSN of the first QP; the second uses `psn ^ 0x5A5A5A`. Close to the
    /// 2^24 wrap by default so every run crosses it.
    pub psn: u32,
}

impl Default for QpParams {
    fn default() -> Self {
        QpParams {
            mtu: Mtu::Mtu1024,
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 4,
            max_dest_rd_atomic: 4,
            access: AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            sq_sig_all: true,
            caps: QpCaps {
                max_send_wr: 1024,
                max_recv_wr: 1024,
                ..QpCaps::default()
            },
            qkey: 0x1111_1111,
            pd: 0,
            psn: 0xFF_FFF0,
        }
    }
}

fn verb<T>(sim: &Sim, r: Result<T, softverbs_proto::VerbsError>) -> Result<T, SimError> {
    r.map_err(|e| SimError {
        seed: sim.seed,
        now: sim.now,
        kind: SimErrorKind::Verb(e),
    })
}

/// Creates a QP on `node` (tracked for the invariants).
pub fn create_qp(
    sim: &mut Sim,
    node: usize,
    qp_type: QpType,
    p: &QpParams,
    srq: Option<SrqId>,
) -> Result<u32, SimError> {
    let init = QpInit {
        qp_type,
        caps: p.caps,
        sq_sig_all: p.sq_sig_all,
        srq,
        pd: p.pd,
    };
    let r = sim.nodes[node].engine.create_qp(init);
    let qpn = verb(sim, r)?;
    sim.track_qp(node, qpn, p.sq_sig_all, srq);
    Ok(qpn)
}

/// RESET → INIT → RTR → RTS with exactly the masks `ibv_modify_qp(3)` requires;
/// `psns` is `(sq_psn, rq_psn)`.
pub fn bring_up(
    sim: &mut Sim,
    node: usize,
    qpn: u32,
    qp_type: QpType,
    peer: Option<(usize, u32)>,
    p: &QpParams,
    (sq_psn, rq_psn): (u32, u32),
) -> Result<(), SimError> {
    let av = peer.map(|(n, _)| AddressVector {
        dgid: sim.nodes[n].gid,
        hop_limit: 64,
        port_num: 1,
        is_global: true,
        ..AddressVector::default()
    });
    let mut attr = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: p.access,
        qkey: p.qkey,
        ..QpAttr::default()
    };
    let init_mask = AttrMask::STATE
        | AttrMask::PKEY_INDEX
        | AttrMask::PORT
        | if qp_type == QpType::Ud {
            AttrMask::QKEY
        } else {
            AttrMask::ACCESS_FLAGS
        };
    let r = sim.nodes[node].engine.modify_qp(qpn, &attr, init_mask);
    verb(sim, r)?;

    attr.qp_state = QpState::Rtr;
    let rtr_mask = match qp_type {
        QpType::Ud => AttrMask::STATE,
        QpType::Uc => {
            AttrMask::STATE
                | AttrMask::AV
                | AttrMask::PATH_MTU
                | AttrMask::DEST_QPN
                | AttrMask::RQ_PSN
        }
        QpType::Rc => {
            AttrMask::STATE
                | AttrMask::AV
                | AttrMask::PATH_MTU
                | AttrMask::DEST_QPN
                | AttrMask::RQ_PSN
                | AttrMask::MAX_DEST_RD_ATOMIC
                | AttrMask::MIN_RNR_TIMER
        }
    };
    if let (Some(av), Some((_, peer_qpn))) = (av, peer) {
        attr.ah_attr = av;
        attr.dest_qp_num = peer_qpn;
    }
    attr.path_mtu = p.mtu;
    attr.rq_psn = rq_psn;
    attr.max_dest_rd_atomic = p.max_dest_rd_atomic;
    attr.min_rnr_timer = p.min_rnr_timer;
    let r = sim.nodes[node].engine.modify_qp(qpn, &attr, rtr_mask);
    verb(sim, r)?;

    attr.qp_state = QpState::Rts;
    attr.sq_psn = sq_psn;
    attr.timeout = p.timeout;
    attr.retry_cnt = p.retry_cnt;
    attr.rnr_retry = p.rnr_retry;
    attr.max_rd_atomic = p.max_rd_atomic;
    let rts_mask = match qp_type {
        QpType::Rc => {
            AttrMask::STATE
                | AttrMask::SQ_PSN
                | AttrMask::TIMEOUT
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::MAX_QP_RD_ATOMIC
        }
        _ => AttrMask::STATE | AttrMask::SQ_PSN,
    };
    let r = sim.nodes[node].engine.modify_qp(qpn, &attr, rts_mask);
    verb(sim, r)
}

/// Two connected QPs of `qp_type` (RC or UC) on nodes `a` and `b`, both in RTS.
pub fn connect(
    sim: &mut Sim,
    a: usize,
    b: usize,
    qp_type: QpType,
    p: &QpParams,
) -> Result<(u32, u32), SimError> {
    let qa = create_qp(sim, a, qp_type, p, None)?;
    let qb = create_qp(sim, b, qp_type, p, None)?;
    let (psn_a, psn_b) = (p.psn, p.psn ^ 0x5A_5A5A);
    bring_up(sim, a, qa, qp_type, Some((b, qb)), p, (psn_a, psn_b))?;
    bring_up(sim, b, qb, qp_type, Some((a, qa)), p, (psn_b, psn_a))?;
    Ok((qa, qb))
}

/// Seeds to run: `SOFTVERBS_SIM_SEED=<n>` replays one seed; `SOFTVERBS_SIM_SOAK=<count>`
/// runs that many derived seeds (a soak); otherwise `defaults`.
pub fn seeds(defaults: &[u64]) -> Vec<u64> {
    if let Some(seed) = std::env::var("SOFTVERBS_SIM_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
    {
        return vec![seed];
    }
    if let Some(n) = std::env::var("SOFTVERBS_SIM_SOAK")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
    {
        return (0..n)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03)
            .collect();
    }
    defaults.to_vec()
}

/// Runs `scenario` for every seed of [`seeds`]; on failure panics with the error, which
/// names the seed and the environment variable that replays it.
pub fn run_seeds(
    name: &str,
    defaults: &[u64],
    mut scenario: impl FnMut(u64) -> Result<(), SimError>,
) {
    for seed in seeds(defaults) {
        println!("{name}: seed {seed}");
        if let Err(e) = scenario(seed) {
            panic!("{name} failed: {e}\n  replay: SOFTVERBS_SIM_SEED={seed} cargo test -p softverbs-sim -- {name}");
        }
    }
}
