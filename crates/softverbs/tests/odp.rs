//! On-demand paging through the safe API (`ibv_reg_mr(3)` with `IBV_ACCESS_ON_DEMAND`,
//! `ibv_advise_mr(3)`, `ibv_query_device_ex(3)`'s `odp_caps`): the rules
//! `crates/softverbs-capi/tests/c/odp.c` pins through the drop-in, here through
//! `Pd::reg_mr_on_demand`, `Pd::reg_mr_implicit_on_demand` and `Pd::advise_mr`. (The
//! implicit range without `ON_DEMAND`, `EINVAL`, cannot be asked for here: the safe API
//! adds `ON_DEMAND` itself; the device's unit tests and odp.c pin it.)

mod common;

use common::*;
use softverbs::core::device::memory::AdviseError;
use softverbs::error::RegisterError;
use softverbs::*;
use std::sync::atomic::{AtomicUsize, Ordering};

const PAGE: usize = 4096;
const WRITABLE: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);

/// `pages` fresh pages with `protection`, at an address nothing else of the process maps
/// (a 16 MiB slot of its own), so that once unmapped no other mapping lands there.
fn map(pages: usize, protection: libc::c_int) -> *mut u8 {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    loop {
        let hint = 0x5400_0000_0000usize + NEXT.fetch_add(1, Ordering::Relaxed) * 0x100_0000;
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping.
        let p = unsafe {
            libc::mmap(
                hint as *mut libc::c_void,
                pages * PAGE,
                protection,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p as usize == hint {
            return p.cast();
        }
        assert!(
            hint < 0x5500_0000_0000,
            "no free address for a test mapping"
        );
    }
}

/// Maps `pages` read-write pages exactly at `at`, where nothing is mapped.
fn map_at(at: *mut u8, pages: usize) {
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping.
    let p = unsafe {
        libc::mmap(
            at.cast(),
            pages * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    assert_eq!(p.cast(), at);
}

fn unmap(at: *mut u8, pages: usize) {
    // SAFETY: a mapping of this test, which no reference points into.
    assert_eq!(unsafe { libc::munmap(at.cast(), pages * PAGE) }, 0);
}

/// Reads the byte at `at` (a mapping of this test the device may have written).
fn byte(at: *const u8) -> u8 {
    // SAFETY: a mapped byte of this test's, read without forming a reference.
    unsafe { at.read_volatile() }
}

/// Posts an RDMA WRITE of `len` bytes of `a.mr` to `remote` and returns its status.
fn write(a: &Side, len: usize, remote: RemoteAddr) -> WcStatus {
    let request = SendRequest::write(9, &[a.mr.slice(0..len).unwrap()], remote);
    a.qp.post_send(request).unwrap();
    wait_for(&a.cq, 1)[0].status()
}

/// ibv_query_device_ex(3): odp_caps reports on-demand paging, explicit and implicit, and
/// per transport what rxe's rxe_init_device_param reports (RC send, receive, write,
/// read, atomic, SRQ receive; UD send, receive, SRQ receive), and UC send, receive,
/// write and SRQ receive.
#[test]
fn odp_caps_report_explicit_and_implicit_paging_per_transport() {
    let odp = in_process().query_device().odp;
    assert_eq!(odp.general, OdpCaps::SUPPORT | OdpCaps::SUPPORT_IMPLICIT);
    let send_recv = OdpCaps::SEND | OdpCaps::RECV | OdpCaps::SRQ_RECV;
    assert_eq!(
        odp.rc,
        send_recv | OdpCaps::WRITE | OdpCaps::READ | OdpCaps::ATOMIC
    );
    assert_eq!(odp.uc, send_recv | OdpCaps::WRITE);
    assert_eq!(odp.ud, send_recv);
}

/// ibv_reg_mr(3) with IBV_ACCESS_ON_DEMAND over memory that is PROT_NONE, or not mapped
/// at all, succeeds (the kernel's ib_umem_odp_get pins and touches nothing); memory
/// mapped afterwards is reached by a peer's RDMA WRITE.
#[test]
fn an_odp_region_over_unmapped_memory_reaches_what_is_mapped_later() {
    let (a, b) = rc_pair(in_process(), in_process());
    let protected = map(2, libc::PROT_NONE);
    let gone = map(2, libc::PROT_READ | libc::PROT_WRITE);
    unmap(gone, 2);
    // SAFETY: the test's own mappings, reached only through raw pointers, unmapped after
    // the regions are dropped.
    let (p, g) = unsafe {
        (
            b.pd.reg_mr_on_demand(protected, 2 * PAGE, WRITABLE)
                .unwrap(),
            b.pd.reg_mr_on_demand(gone, 2 * PAGE, WRITABLE).unwrap(),
        )
    };
    assert!(p.access().contains(AccessFlags::ON_DEMAND) && !p.is_implicit());
    assert_eq!((p.addr(), p.len()), (protected as u64, 2 * PAGE as u64));
    // SAFETY: the test's own PROT_NONE mapping.
    let opened = unsafe {
        libc::mprotect(
            protected.cast(),
            2 * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    assert_eq!(opened, 0);
    map_at(gone, 2);
    a.mr.fill(0..256, 0x3c).unwrap();
    let across = p.remote().offset(PAGE as u64 - 128);
    assert_eq!(write(&a, 256, across), WcStatus::Success);
    assert_eq!(byte(protected.wrapping_add(PAGE - 128)), 0x3c);
    assert_eq!(byte(protected.wrapping_add(PAGE + 127)), 0x3c);
    assert_eq!(write(&a, 64, g.remote().offset(64)), WcStatus::Success);
    assert_eq!(byte(gone.wrapping_add(64)), 0x3c);
    assert_eq!(byte(gone.wrapping_add(128)), 0);
    drop((p, g));
    unmap(protected, 2);
    unmap(gone, 2);
}

/// A page still unmapped when a peer's RDMA WRITE comes: the WR ends with
/// IBV_WC_REM_ACCESS_ERR, as rxe ends an ODP page fault it cannot resolve
/// (rxe_odp_map_range_and_lock's EFAULT, RESPST_ERR_RKEY_VIOLATION); the process lives
/// and the region stays usable: once the page is mapped a WRITE on a fresh pair lands.
#[test]
fn a_write_to_a_page_still_unmapped_fails_with_rem_access_err_and_the_region_lives_on() {
    let (a, b) = rc_pair(in_process(), in_process());
    let gone = map(1, libc::PROT_READ | libc::PROT_WRITE);
    unmap(gone, 1);
    // SAFETY: the test's own address range, reached only through raw pointers.
    let region = unsafe { b.pd.reg_mr_on_demand(gone, PAGE, WRITABLE) }.unwrap();
    a.mr.fill(0..64, 0x5a).unwrap();
    assert_eq!(write(&a, 64, region.remote()), WcStatus::RemAccessErr);

    map_at(gone, 1);
    let (a2, b2) = rc_pair(in_process(), in_process());
    // SAFETY: as above.
    let region = unsafe { b2.pd.reg_mr_on_demand(gone, PAGE, WRITABLE) }.unwrap();
    a2.mr.fill(0..64, 0x5a).unwrap();
    assert_eq!(write(&a2, 64, region.remote()), WcStatus::Success);
    assert_eq!(byte(gone.wrapping_add(63)), 0x5a);
    drop(region);
    drop(b);
    unmap(gone, 1);
}

/// Implicit ODP (ibv_reg_mr(3): "addr should be 0 and length should be SIZE_MAX"): the
/// whole address space, its addresses the process's own; a peer's RDMA WRITE through its
/// rkey lands at any mapped address, and an unmapped one fails (IBV_WC_REM_ACCESS_ERR).
#[test]
fn the_implicit_region_reaches_any_mapped_address() {
    let (a, b) = rc_pair(in_process(), in_process());
    let target = map(1, libc::PROT_READ | libc::PROT_WRITE);
    // SAFETY: only this test's mapping (and address 0) are ever named through the key.
    let all = unsafe { b.pd.reg_mr_implicit_on_demand(WRITABLE) }.unwrap();
    assert!(all.is_implicit());
    assert_eq!((all.addr(), all.len()), (0, usize::MAX as u64));
    a.mr.fill(0..32, 0x71).unwrap();
    let remote = RemoteAddr::new(target as u64 + 16, all.rkey());
    assert_eq!(write(&a, 32, remote), WcStatus::Success);
    assert_eq!(byte(target.wrapping_add(15)), 0);
    assert_eq!(byte(target.wrapping_add(16)), 0x71);
    assert_eq!(byte(target.wrapping_add(47)), 0x71);
    assert_eq!(
        write(&a, 8, RemoteAddr::new(0, all.rkey())),
        WcStatus::RemAccessErr
    );
    drop(all);
    unmap(target, 1);
}

fn advice_refusal(result: Result<(), Error>) -> (AdviseError, i32) {
    match result {
        Err(e @ Error::Register(RegisterError::Advice(cause))) => (cause, e.errno()),
        other => panic!("expected an advice refusal, got {other:?}"),
    }
}

/// ibv_advise_mr(3) with the kernel's answers: 0 for the three prefetches of an ODP range
/// (synchronous or not) and for an empty list; EOPNOTSUPP for another advice (rxe's and
/// mlx5's *_ib_advise_mr); ENOENT for an lkey of a region without ON_DEMAND, EPERM for
/// a region of another PD and for PREFETCH_WRITE without write access (mlx5's
/// get_prefetchable_mr); with IBV_ADVISE_MR_FLAG_FLUSH, EFAULT for a range outside the
/// region and for a page that cannot be mapped (pagefault_mr, hmm_range_fault), which
/// the asynchronous (best-effort) prefetch ignores.
#[test]
fn advise_mr_prefetches_odp_ranges_and_refuses_as_the_kernel() {
    let ctx = in_process();
    let pd = ctx.alloc_pd();
    let pages = map(2, libc::PROT_READ | libc::PROT_WRITE);
    let read_only = map(1, libc::PROT_READ);
    // SAFETY: the test's own mappings, reached only through raw pointers.
    let (odp, ro) = unsafe {
        (
            pd.reg_mr_on_demand(pages, 2 * PAGE, WRITABLE).unwrap(),
            pd.reg_mr_on_demand(read_only, PAGE, AccessFlags::empty())
                .unwrap(),
        )
    };
    let whole = odp.sge(odp.addr(), 2 * PAGE as u32);
    for advice in [
        Advice::Prefetch,
        Advice::PrefetchWrite,
        Advice::PrefetchNoFault,
    ] {
        pd.advise_mr(advice, true, &[whole]).unwrap();
        pd.advise_mr(advice, false, &[whole]).unwrap();
    }
    pd.advise_mr(Advice::Unknown(7), true, &[]).unwrap();
    let (cause, errno) = advice_refusal(pd.advise_mr(Advice::Unknown(7), true, &[whole]));
    assert_eq!(
        (cause, errno),
        (AdviseError::Unsupported(7), libc::EOPNOTSUPP)
    );

    let pinned = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let (cause, errno) =
        advice_refusal(pd.advise_mr(Advice::Prefetch, true, &[pinned.slice(..).unwrap().sge()]));
    let lkey = pinned.lkey();
    assert_eq!(
        (cause, errno),
        (AdviseError::NotOnDemand { lkey }, libc::ENOENT)
    );
    let other = ctx.alloc_pd();
    let (cause, errno) = advice_refusal(other.advise_mr(Advice::Prefetch, true, &[whole]));
    let lkey = odp.lkey();
    assert_eq!((cause, errno), (AdviseError::OtherPd { lkey }, libc::EPERM));
    let ro_page = ro.sge(ro.addr(), PAGE as u32);
    let (cause, errno) = advice_refusal(pd.advise_mr(Advice::PrefetchWrite, true, &[ro_page]));
    let lkey = ro.lkey();
    assert_eq!(
        (cause, errno),
        (AdviseError::NotWritable { lkey }, libc::EPERM)
    );
    ro.prefetch(ro.addr(), PAGE as u32, Advice::Prefetch)
        .unwrap();

    let outside = odp.sge(odp.addr() + PAGE as u64, 2 * PAGE as u32);
    let (cause, errno) = advice_refusal(pd.advise_mr(Advice::Prefetch, true, &[outside]));
    assert!(matches!(cause, AdviseError::OutOfRange { .. }));
    assert_eq!(errno, libc::EFAULT);
    unmap(pages.wrapping_add(PAGE), 1);
    let hole = odp.sge(odp.addr() + PAGE as u64, 8);
    let (cause, errno) = advice_refusal(odp.prefetch(hole.addr, 8, Advice::Prefetch));
    let addr = pages as usize + PAGE;
    assert_eq!(
        (cause, errno),
        (AdviseError::Unmapped { addr }, libc::EFAULT)
    );
    pd.advise_mr(Advice::Prefetch, false, &[hole]).unwrap();
    pd.advise_mr(Advice::PrefetchNoFault, true, &[hole])
        .unwrap();
    drop((odp, ro));
    unmap(pages, 1);
    unmap(read_only, 1);
}
