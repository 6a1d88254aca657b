//! IBTA 1.5's ATOMIC WRITE and FLUSH between two engines under seeded loss, duplication and
//! reordering: every value lands exactly, a replayed ATOMIC WRITE is answered but never
//! executed again (oA19-14, oA19-15; rxe's `res->replay`), every work request completes
//! once, in order, with `IBV_WC_ATOMIC_WRITE` / `IBV_WC_FLUSH` (ibv_wr_post(3)); and the
//! responder's rules give `REM_ACCESS_ERR` / `REM_INV_REQ_ERR` at the requester.

mod common;

use common::{word_at, ALL_ACCESS};
use softverbs_cq::{WcOpcode, WcStatus};
use softverbs_proto::{
    AccessFlags, CqTarget, FlushPlacement, FlushSelectivity, QpType, SendFlags, SendOp, SendWr,
};
use softverbs_sim::{connect, run_seeds, FaultRules, QpParams, Sim};

const FLUSH_ALL: AccessFlags = AccessFlags::FLUSH_GLOBAL.union(AccessFlags::FLUSH_PERSISTENT);

fn params() -> QpParams {
    let mut p = QpParams::default();
    p.access |= FLUSH_ALL;
    p
}

fn atomic_write(wr_id: u64, addr: u64, rkey: u32, value: u64) -> SendWr {
    let op = SendOp::AtomicWrite {
        remote_addr: addr,
        rkey,
        value: value.to_ne_bytes(),
    };
    SendWr::new(wr_id, op, Vec::new()).with_flags(SendFlags::SIGNALED)
}

fn flush(wr_id: u64, addr: u64, rkey: u32, len: u64, placement: FlushPlacement) -> SendWr {
    let op = SendOp::Flush {
        remote_addr: addr,
        rkey,
        len,
        placement,
        selectivity: FlushSelectivity::Range,
    };
    SendWr::new(wr_id, op, Vec::new()).with_flags(SendFlags::SIGNALED)
}

#[test]
fn atomic_writes_and_flushes_land_exactly_once_under_loss() {
    run_seeds(
        "atomic_writes_and_flushes_land_exactly_once_under_loss",
        &[1, 2, 3, 4, 5, 6],
        |seed| {
            let mut sim = Sim::new(seed, FaultRules::lossy(0.15));
            let a = sim.add_node(Default::default());
            let b = sim.add_node(Default::default());
            let (qa, _qb) = connect(&mut sim, a, b, QpType::Rc, &params())?;
            let target = sim.nodes[b].mem.register(4096, ALL_ACCESS | FLUSH_ALL);
            let n = 120u64;
            let mut expected = Vec::new();
            for i in 0..n {
                let wr = match i % 4 {
                    // The same word, written again and again: a replayed old write would
                    // leave an older value behind.
                    0 | 1 => atomic_write(i, target.addr, target.rkey, 1000 + i),
                    2 => atomic_write(i, target.addr + 8 * (1 + i), target.rkey, i * 7),
                    _ => flush(i, target.addr, target.rkey, 4096, FlushPlacement::GLOBAL),
                };
                expected.push(if i % 4 == 3 {
                    WcOpcode::Flush
                } else {
                    WcOpcode::AtomicWrite
                });
                sim.post_send(a, qa, wr)?;
                if i % 16 == 15 {
                    sim.run_idle(200_000)?;
                }
            }
            sim.run_idle(2_000_000)?;
            let done: Vec<_> = sim
                .completions(a)
                .iter()
                .filter(|c| c.cq == CqTarget::Send)
                .map(|c| {
                    let opcode = c.wc.result().ok().map(|d| d.opcode());
                    (c.wc.wr_id(), c.wc.status(), opcode)
                })
                .collect();
            assert_eq!(done.len(), n as usize, "every work request completes once");
            for (i, (wr_id, status, opcode)) in done.into_iter().enumerate() {
                assert_eq!(wr_id, i as u64, "in order");
                assert_eq!(status, WcStatus::Success);
                assert_eq!(opcode, Some(expected[i]));
            }
            let last_same_word = (0..n).filter(|i| i % 4 < 2).max().unwrap();
            assert_eq!(word_at(&sim, b, target.addr), 1000 + last_same_word);
            for i in (0..n).filter(|i| i % 4 == 2) {
                assert_eq!(word_at(&sim, b, target.addr + 8 * (1 + i)), i * 7);
            }
            assert!(sim.stats.dropped > 0 && sim.stats.duplicated > 0);
            Ok(())
        },
    );
}

fn one(wr: SendWr, target_access: AccessFlags, qp_access: AccessFlags) -> (WcStatus, u64) {
    let mut sim = Sim::new(9, FaultRules::perfect());
    let a = sim.add_node(Default::default());
    let b = sim.add_node(Default::default());
    let mut p = params();
    p.access = qp_access;
    let (qa, _) = connect(&mut sim, a, b, QpType::Rc, &p).unwrap();
    let target = sim.nodes[b].mem.register(64, target_access);
    let mut wr = wr;
    match &mut wr.op {
        SendOp::AtomicWrite {
            remote_addr, rkey, ..
        }
        | SendOp::Flush {
            remote_addr, rkey, ..
        } => {
            *remote_addr += target.addr;
            *rkey = target.rkey;
        }
        _ => unreachable!(),
    }
    sim.post_send(a, qa, wr).unwrap();
    sim.run_idle(100_000).unwrap();
    let c = sim
        .completions(a)
        .iter()
        .find(|c| c.cq == CqTarget::Send)
        .expect("a completion");
    (c.wc.status(), word_at(&sim, b, target.addr + 8))
}

// IBTA 1.5 / rxe's check_rkey and check_qp_attr_access: the region needs REMOTE_WRITE for
// an ATOMIC WRITE (REMOTE_ATOMIC is not enough) → NAK remote access → REM_ACCESS_ERR; a
// misaligned address → NAK invalid request → REM_INV_REQ_ERR; the QP's qp_access_flags
// need REMOTE_WRITE → REM_INV_REQ_ERR. Nothing is written.
#[test]
fn atomic_write_rights_and_alignment_give_remote_statuses() {
    let rw = ALL_ACCESS;
    let qp = params().access;
    let ok = one(atomic_write(1, 8, 0, 42), rw, qp);
    assert_eq!(ok, (WcStatus::Success, 42));
    let no_write = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC;
    assert_eq!(
        one(atomic_write(1, 8, 0, 42), no_write, qp),
        (WcStatus::RemAccessErr, 0)
    );
    assert_eq!(
        one(atomic_write(1, 4, 0, 42), rw, qp),
        (WcStatus::RemInvReqErr, 0)
    );
    assert_eq!(
        one(atomic_write(1, 64, 0, 42), rw, qp),
        (WcStatus::RemAccessErr, 0)
    );
    assert_eq!(
        one(atomic_write(1, 8, 0, 42), rw, AccessFlags::REMOTE_ATOMIC),
        (WcStatus::RemInvReqErr, 0)
    );
}

// IBTA 1.5 / rxe: a FLUSH needs the placement's FLUSH_* right on the region (else
// REM_ACCESS_ERR) and on the QP (else REM_INV_REQ_ERR); a range outside the region is a
// remote access error.
#[test]
fn flush_rights_and_ranges_give_remote_statuses() {
    let qp = params().access;
    let global = FlushPlacement::GLOBAL;
    let persistent = FlushPlacement::PERSISTENT;
    let region = ALL_ACCESS | AccessFlags::FLUSH_GLOBAL;
    assert_eq!(
        one(flush(1, 0, 0, 64, global), region, qp).0,
        WcStatus::Success
    );
    assert_eq!(
        one(flush(1, 0, 0, 64, persistent), region, qp).0,
        WcStatus::RemAccessErr
    );
    assert_eq!(
        one(flush(1, 0, 0, 65, global), region, qp).0,
        WcStatus::RemAccessErr
    );
    assert_eq!(
        one(
            flush(1, 0, 0, 64, global),
            region,
            AccessFlags::REMOTE_WRITE
        )
        .0,
        WcStatus::RemInvReqErr
    );
}
