//! `ibv_rereg_mr(3)` through the safe API, between two devices: `Mr::rereg` changes the
//! translation (a new buffer), the protection domain or the access rights at once,
//! keeping the lkey and rkey, and the peer's next access meets the region as it now is;
//! a refused re-registration leaves the region as it was.

mod common;

use common::*;
use softverbs::*;

/// Posts `request` on `side` and returns its completion.
fn complete(side: &Side, request: SendRequest) -> WorkCompletion {
    side.qp.post_send(request).unwrap();
    wait_for(&side.cq, 1)[0]
}

const WRITABLE: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);

/// `IBV_REREG_MR_CHANGE_ACCESS`: taking remote write away makes the peer's next RDMA
/// WRITE fail with IBV_WC_REM_ACCESS_ERR; the keys stay.
#[test]
fn rereg_access_takes_remote_write_away_and_keeps_the_keys() {
    let (a, b) = rc_pair(in_process(), in_process());
    let mut region = b.pd.reg_mr(4096, WRITABLE).unwrap();
    let (lkey, rkey) = (region.lkey(), region.rkey());
    a.mr.write_at(0, b"before").unwrap();
    let write = SendRequest::write(1, &[a.mr.slice(0..6).unwrap()], region.remote());
    assert_eq!(complete(&a, write).status(), WcStatus::Success);
    assert_eq!(region.read_vec(0..6).unwrap(), b"before");

    region.rereg_access(AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!((region.lkey(), region.rkey()), (lkey, rkey));
    assert_eq!(region.access(), AccessFlags::LOCAL_WRITE);
    let write = SendRequest::write(2, &[a.mr.slice(0..6).unwrap()], region.remote());
    assert_eq!(complete(&a, write).status(), WcStatus::RemAccessErr);
}

/// `IBV_REREG_MR_CHANGE_ACCESS` refuses what `ibv_reg_mr(3)` refuses (remote write
/// without local write, EINVAL), and the region keeps working as before.
#[test]
fn rereg_access_refused_leaves_the_region_registered_as_it_was() {
    let (a, b) = rc_pair(in_process(), in_process());
    let mut region = b.pd.reg_mr(4096, WRITABLE).unwrap();
    let err = region.rereg_access(AccessFlags::REMOTE_WRITE).unwrap_err();
    assert!(matches!(
        err,
        Error::Register(error::RegisterError::MissingLocalWrite)
    ));
    assert_eq!(err.errno(), libc::EINVAL);
    let err = region.rereg(MrChange::default()).unwrap_err();
    assert!(matches!(
        err,
        Error::Register(error::RegisterError::NothingToChange)
    ));
    assert_eq!(err.errno(), libc::EINVAL);
    assert_eq!(region.access(), WRITABLE);
    let write = SendRequest::write(1, &[a.mr.slice(0..8).unwrap()], region.remote());
    assert_eq!(complete(&a, write).status(), WcStatus::Success);
}

/// `IBV_REREG_MR_CHANGE_PD`: a region moved to another PD is no longer reached by the
/// QP of its old PD (IBTA 10.6.3.1: a QP reaches only regions of its own PD), so the
/// peer's RDMA WRITE is refused; moving it back makes it reachable again through the
/// same rkey. A PD of another context is refused.
#[test]
fn rereg_pd_moves_the_region_out_of_reach_of_the_old_pds_qp() {
    let (a, b) = rc_pair(in_process(), in_process());
    let mut region = b.pd.reg_mr(4096, WRITABLE).unwrap();
    let elsewhere = b.ctx.alloc_pd();
    region.rereg_pd(&elsewhere).unwrap();
    assert_eq!(region.pd().handle(), elsewhere.handle());
    let foreign = a.ctx.alloc_pd();
    assert!(matches!(
        region.rereg_pd(&foreign),
        Err(Error::ForeignObject { object: Object::Pd })
    ));
    let write = SendRequest::write(1, &[a.mr.slice(0..8).unwrap()], region.remote());
    assert_eq!(complete(&a, write).status(), WcStatus::RemAccessErr);

    let (a, b) = rc_pair(in_process(), in_process());
    let mut region = b.ctx.alloc_pd().reg_mr(4096, WRITABLE).unwrap();
    region.rereg_pd(&b.pd).unwrap();
    a.mr.write_at(0, b"moved in").unwrap();
    let write = SendRequest::write(2, &[a.mr.slice(0..8).unwrap()], region.remote());
    assert_eq!(complete(&a, write).status(), WcStatus::Success);
    assert_eq!(region.read_vec(0..8).unwrap(), b"moved in");
}

/// `IBV_REREG_MR_CHANGE_TRANSLATION`: a new, smaller, zeroed buffer under the same keys;
/// the peer's write lands in it at the region's new address, and a write past its end
/// (inside the old, larger range) is refused.
#[test]
fn rereg_translation_moves_the_keys_to_a_new_buffer_and_its_bounds() {
    let (a, b) = rc_pair(in_process(), in_process());
    let mut region = b.pd.reg_mr(3 * 4096, WRITABLE).unwrap();
    region.write_at(0, b"old bytes").unwrap();
    let (old_addr, rkey) = (region.addr(), region.rkey());
    region.rereg_len(4096).unwrap();
    assert_eq!((region.len(), region.rkey()), (4096, rkey));
    assert_ne!(region.addr(), old_addr);
    assert_eq!(region.read_vec(0..9).unwrap(), [0; 9]);

    a.mr.write_at(0, b"new bytes").unwrap();
    let write = SendRequest::write(1, &[a.mr.slice(0..9).unwrap()], region.remote());
    assert_eq!(complete(&a, write).status(), WcStatus::Success);
    assert_eq!(region.read_vec(0..9).unwrap(), b"new bytes");
    let past = SendRequest::write(
        2,
        &[a.mr.slice(0..9).unwrap()],
        region.remote().offset(5000),
    );
    assert_eq!(complete(&a, past).status(), WcStatus::RemAccessErr);
}

/// A re-registration while the peer's multi-packet RDMA WRITE is in flight: every packet
/// is checked against the region as it is when it arrives, so the write either completes
/// or is refused (IBV_WC_REM_ACCESS_ERR), and what reached the new buffer is the
/// peer's pattern inside its bounds — never a byte outside it (the device's memory tests
/// pin the old range untouched).
#[test]
fn rereg_translation_during_a_peers_write_stays_inside_the_new_range() {
    for round in 0..8u8 {
        let (a, b) = rc_pair(in_process(), in_process());
        let mut region = b.pd.reg_mr(64 * 1024, WRITABLE).unwrap();
        a.mr.fill(.., round + 1).unwrap();
        let write = SendRequest::write(1, &[a.mr.slice(..).unwrap()], region.remote());
        a.qp.post_send(write).unwrap();
        region.rereg_len(16 * 1024).unwrap();
        let status = wait_for(&a.cq, 1)[0].status();
        assert!(
            matches!(status, WcStatus::Success | WcStatus::RemAccessErr),
            "round {round}: {status:?}"
        );
        let bytes = region.read_vec(..).unwrap();
        assert!(bytes.iter().all(|&x| x == 0 || x == round + 1));
    }
}
