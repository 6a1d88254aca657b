//! Registered memory the application unmaps while it is registered (`ibv_reg_mr(3)`
//! forbids it; a kernel device keeps the pages pinned, so its accesses never fault): the
//! device's access faults, is recovered, and fails as a refused access would, and the
//! process lives. A peer's RDMA WRITE, READ or atomic naming the region completes on the
//! requester with `REM_ACCESS_ERR` (the responder NAKs remote access error); a local SEND
//! gathering from it completes with `LOC_PROT_ERR`; the device counts each fault
//! (`Device::faulted_accesses`). Two devices, RC connected as `ibv_rc_pingpong` does, in
//! process and over UDP on 127.0.0.x.
//!
//! On the code before the guarded copies every one of these tests died with SIGSEGV.

mod common;

use common::rc::{connect, side, wait_for, Side};
use softverbs_cq::WcStatus;
use softverbs_device::{DeviceConfig, UdpConfig};
use softverbs_proto::{AccessFlags, SendOp, SendWr, Sge};
use std::sync::atomic::{AtomicUsize, Ordering};

const PAGE: usize = 4096;
const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// `pages` fresh read-write pages far below the kernel's usual mmap area (a distinct
/// 16 MiB slot per call), so that once a test unmaps them no other mapping of this
/// multi-threaded test process (another test's, a thread stack) lands at the same address:
/// an address unmapped and mapped again by something else is the one case the device
/// cannot see (its write would land in the new mapping).
fn map_far(pages: usize) -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    for _ in 0..64 {
        let hint = 0x5800_0000_0000usize + NEXT.fetch_add(1, Ordering::Relaxed) * 0x100_0000;
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping.
        let p = unsafe {
            libc::mmap(
                hint as *mut libc::c_void,
                pages * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p as usize == hint {
            return hint;
        }
    }
    panic!("no free address for a test mapping");
}

/// A region of two fresh pages registered with every access in `pd` and then unmapped:
/// (address, lkey, rkey).
fn unmapped_region(side: &Side, pd: u32) -> (u64, u32, u32) {
    let at = map_far(2);
    let addr = at as *mut libc::c_void;
    // SAFETY: the contract (keep it mapped) is broken on purpose right below: that is
    // what the test is about; the device must survive it.
    let region = unsafe { side.device.reg_mr(pd, at, 2 * PAGE as u64, at as u64, ALL) }.unwrap();
    // SAFETY: our own mapping.
    assert_eq!(unsafe { libc::munmap(addr, 2 * PAGE) }, 0);
    (at as u64, region.lkey, region.rkey)
}

fn in_process_pair() -> (Side, Side, u32, u32) {
    let a = side(DeviceConfig::in_process());
    let pd_a = a.pd;
    let b = side(DeviceConfig::in_process());
    let pd_b = b.pd;
    connect(&a, &b);
    (a, b, pd_a, pd_b)
}

fn sge(side: &Side, offset: usize, len: u32) -> Sge {
    Sge {
        addr: side.buf.as_ptr() as u64 + offset as u64,
        length: len,
        lkey: side.lkey,
    }
}

/// A posts `op` (gathering / scattering 64 bytes of its own buffer) and its one
/// completion must be `status`.
fn expect_status(a: &Side, op: SendOp, local: Sge, status: WcStatus) {
    a.device
        .post_send(a.qpn, SendWr::new(9, op, vec![local]))
        .unwrap();
    let wc = wait_for(a, 1);
    assert_eq!(wc[0].wr_id(), 9);
    assert_eq!(wc[0].status(), status, "{:?}", wc[0]);
}

#[test]
fn a_peers_rdma_write_into_a_region_unmapped_while_registered_gives_rem_access_err() {
    let (a, b, _, pd_b) = in_process_pair();
    let (addr, _, rkey) = unmapped_region(&b, pd_b);
    let op = SendOp::RdmaWrite {
        remote_addr: addr + 100,
        rkey,
    };
    expect_status(&a, op, sge(&a, 0, 64), WcStatus::RemAccessErr);
    assert_eq!(b.device.faulted_accesses(), 1);
    assert_eq!(a.device.faulted_accesses(), 0);
}

#[test]
fn a_peers_rdma_read_of_a_region_unmapped_while_registered_gives_rem_access_err() {
    let (a, b, _, pd_b) = in_process_pair();
    let (addr, _, rkey) = unmapped_region(&b, pd_b);
    let op = SendOp::RdmaRead {
        remote_addr: addr + 4000,
        rkey,
    };
    expect_status(&a, op, sge(&a, 0, 200), WcStatus::RemAccessErr);
    assert_eq!(b.device.faulted_accesses(), 1);
}

#[test]
fn a_peers_atomics_on_a_region_unmapped_while_registered_give_rem_access_err() {
    for compare_swap in [false, true] {
        let (a, b, _, pd_b) = in_process_pair();
        let (addr, _, rkey) = unmapped_region(&b, pd_b);
        let remote_addr = addr + 8;
        let op = if compare_swap {
            SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare: 0,
                swap: 1,
            }
        } else {
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add: 1,
            }
        };
        expect_status(&a, op, sge(&a, 64, 8), WcStatus::RemAccessErr);
        assert_eq!(b.device.faulted_accesses(), 1);
    }
}

#[test]
fn a_send_gathering_from_a_region_unmapped_while_registered_gives_loc_prot_err() {
    let (a, _b, pd_a, _) = in_process_pair();
    let (addr, lkey, _) = unmapped_region(&a, pd_a);
    let local = Sge {
        addr: addr + 16,
        length: 64,
        lkey,
    };
    expect_status(&a, SendOp::Send, local, WcStatus::LocProtErr);
    assert_eq!(a.device.faulted_accesses(), 1);
}

#[test]
fn a_peers_rdma_write_over_udp_into_an_unmapped_region_gives_rem_access_err() {
    let udp = |last: u8| {
        DeviceConfig::udp(UdpConfig {
            address: Some(std::net::IpAddr::V4(std::net::Ipv4Addr::new(
                127, 0, 0, last,
            ))),
            ..UdpConfig::default()
        })
    };
    // The in-process shortcut off: every packet crosses the kernel's UDP path.
    let a = side(udp(171));
    let b = side(udp(172));
    let pd_b = b.pd;
    a.device.set_in_process_shortcut(false);
    b.device.set_in_process_shortcut(false);
    connect(&a, &b);
    let (addr, _, rkey) = unmapped_region(&b, pd_b);
    // Several MTUs: the first packet faults, the rest of the message is refused.
    let op = SendOp::RdmaWrite {
        remote_addr: addr,
        rkey,
    };
    expect_status(&a, op, sge(&a, 0, 5000), WcStatus::RemAccessErr);
    assert_eq!(b.device.faulted_accesses(), 1);
}
