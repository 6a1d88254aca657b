//! Tests of the memory table: registration refusals and their errnos, keys, the checks
//! of every access (bounds, rights, protection domains, invalidation), atomics, the
//! shared copies, and regions the application unmaps while they are registered.

use super::*;
use softverbs_proto::{AtomicOp, Memory, Sge};

fn table_with(buf: &mut [u8], access: AccessFlags) -> (MemoryTable, Region) {
    let mut t = MemoryTable::new();
    // SAFETY: `buf` outlives the table in every test that uses it.
    let r = unsafe {
        t.register(
            1,
            buf.as_mut_ptr() as usize,
            buf.len() as u64,
            0x1000,
            access,
        )
    }
    .unwrap();
    (t, r)
}

#[test]
fn remote_write_without_local_write_is_refused_at_registration() {
    // ibv_reg_mr(3): "If IBV_ACCESS_REMOTE_WRITE or IBV_ACCESS_REMOTE_ATOMIC is set,
    // then IBV_ACCESS_LOCAL_WRITE must be set too."
    let mut buf = [0u8; 8];
    let mut t = MemoryTable::new();
    // SAFETY: refused before anything is recorded.
    let err = unsafe {
        t.register(
            1,
            buf.as_mut_ptr() as usize,
            8,
            0,
            AccessFlags::REMOTE_WRITE,
        )
    };
    assert_eq!(err, Err(RegisterError::MissingLocalWrite));
}

#[test]
fn keys_are_distinct_random_and_lkey_differs_from_rkey() {
    let mut buf = [0u8; 64];
    let mut t = MemoryTable::new();
    let mut keys = std::collections::HashSet::new();
    for _ in 0..32 {
        // SAFETY: `buf` outlives `t`.
        let r = unsafe {
            t.register(
                1,
                buf.as_mut_ptr() as usize,
                64,
                0,
                AccessFlags::LOCAL_WRITE,
            )
        }
        .unwrap();
        assert!(keys.insert(r.lkey));
        assert!(keys.insert(r.rkey));
    }
}

#[test]
fn remote_access_outside_the_region_or_without_rights_touches_nothing() {
    let mut buf = [7u8; 16];
    let (mut t, r) = table_with(
        &mut buf,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
    );
    let mut out = [0u8; 8];
    assert_eq!(t.read(1, MemKey::Remote(r.rkey), 0x1008, &mut out), Ok(()));
    assert_eq!(
        t.read(1, MemKey::Remote(r.rkey), 0x100c, &mut out),
        Err(MemError::OutOfBounds)
    );
    assert_eq!(
        t.read(1, MemKey::Remote(r.rkey), 0x0ff8, &mut out),
        Err(MemError::OutOfBounds)
    );
    assert_eq!(
        t.write(1, MemKey::Remote(r.rkey), 0x1000, &[1, 2]),
        Err(MemError::AccessDenied)
    );
    assert_eq!(
        t.read(1, MemKey::Remote(r.rkey ^ 1), 0x1000, &mut out),
        Err(MemError::InvalidKey)
    );
    assert_eq!(buf, [7u8; 16]);
}

#[test]
fn atomics_are_aligned_checked_and_return_the_original_value() {
    let mut buf = [0u64; 2];
    let bytes = 16;
    let mut t = MemoryTable::new();
    // SAFETY: `buf` outlives `t`.
    let r = unsafe {
        t.register(
            1,
            buf.as_mut_ptr() as usize,
            bytes,
            0,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
        )
    }
    .unwrap();
    assert_eq!(t.atomic(1, r.rkey, 8, AtomicOp::FetchAdd { add: 5 }), Ok(0));
    assert_eq!(
        t.atomic(
            1,
            r.rkey,
            8,
            AtomicOp::CompareSwap {
                compare: 5,
                swap: 9
            }
        ),
        Ok(5)
    );
    assert_eq!(
        t.atomic(1, r.rkey, 4, AtomicOp::FetchAdd { add: 1 }),
        Err(MemError::Misaligned)
    );
    assert_eq!(
        t.atomic(1, r.rkey, 16, AtomicOp::FetchAdd { add: 1 }),
        Err(MemError::OutOfBounds)
    );
    assert_eq!(buf, [0, 9]);
}

#[test]
fn shared_copies_move_every_byte_at_any_alignment_and_touch_nothing_else() {
    let src: Vec<u8> = (0..100u8).collect();
    for start in 0..9 {
        for len in [0, 1, 7, 8, 9, 31, 64, 90] {
            // Word-aligned backing store, as registered memory of the safe API is.
            let mut words = vec![u64::from_ne_bytes([0xee; 8]); 14];
            // SAFETY: viewing the vector's words as bytes; it outlives `region`.
            let region: &mut [u8] =
                unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut u8, 112) };
            // SAFETY: both ranges are inside live vectors of this test.
            let wrote = unsafe { copy_to_shared(&src[..len], region.as_mut_ptr().add(start)) };
            assert_eq!(wrote, Ok(()));
            assert_eq!(&region[start..start + len], &src[..len]);
            assert!(region[..start].iter().all(|&b| b == 0xee));
            assert!(region[start + len..].iter().all(|&b| b == 0xee));
            let mut out = vec![0u8; len];
            // SAFETY: as above.
            let read = unsafe { copy_from_shared(region.as_ptr().add(start), &mut out) };
            assert_eq!(read, Ok(()));
            assert_eq!(out, &src[..len]);
        }
    }
}

#[test]
fn deregistered_keys_are_refused_and_ordinary_regions_cannot_be_invalidated() {
    let mut buf = [0u8; 8];
    let (mut t, r) = table_with(
        &mut buf,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    );
    // An ordinary region refuses invalidation and keeps its R_Key (IBTA 10.6.6).
    assert_eq!(t.invalidate(1, r.rkey), Err(MemError::NotInvalidatable));
    assert!(t.write(1, MemKey::Remote(r.rkey), 0x1000, &[1]).is_ok());
    assert!(t.write(1, MemKey::Local(r.lkey), 0x1000, &[1]).is_ok());
    t.deregister(r.lkey).unwrap();
    assert_eq!(
        t.write(1, MemKey::Local(r.lkey), 0x1000, &[1]),
        Err(MemError::InvalidKey)
    );
    assert!(t.is_empty());
}

/// IBTA vol. 1 ch. 10, protection domains: a key is valid for a QP only if its region
/// is in the QP's PD. Every access naming a key of a region in another PD is refused
/// (local and remote, read, write, atomic, invalidate, and the up-front checks) and
/// touches nothing; the region's own PD still reaches it.
#[test]
fn a_key_of_a_region_in_another_pd_is_refused_and_touches_nothing() {
    let mut buf = [7u64; 2];
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_ATOMIC;
    let mut t = MemoryTable::new();
    // SAFETY: `buf` outlives `t`.
    let r = unsafe { t.register(1, buf.as_mut_ptr() as usize, 16, 0x1000, all) }.unwrap();
    let other = 2;
    let mut out = [0u8; 8];
    let refused = Err(MemError::PdMismatch);
    assert_eq!(t.check_local(other, r.lkey, 0x1000, 8, all), refused);
    assert_eq!(t.check_remote(other, r.rkey, 0x1000, 8, all), refused);
    assert_eq!(
        t.read(other, MemKey::Local(r.lkey), 0x1000, &mut out),
        refused
    );
    assert_eq!(
        t.read(other, MemKey::Remote(r.rkey), 0x1000, &mut out),
        refused
    );
    assert_eq!(t.write(other, MemKey::Local(r.lkey), 0x1000, &[1]), refused);
    assert_eq!(
        t.write(other, MemKey::Remote(r.rkey), 0x1000, &[1]),
        refused
    );
    assert_eq!(
        t.atomic(other, r.rkey, 0x1000, AtomicOp::FetchAdd { add: 1 }),
        Err(MemError::PdMismatch)
    );
    assert_eq!(t.invalidate(other, r.rkey), refused);
    assert_eq!(out, [0; 8]);
    assert_eq!(buf, [7, 7]);
    // Its own PD: everything works, and the R_Key survived the refused invalidate.
    assert_eq!(t.check_remote(1, r.rkey, 0x1000, 16, all), Ok(()));
    assert_eq!(
        t.atomic(1, r.rkey, 0x1008, AtomicOp::FetchAdd { add: 1 }),
        Ok(7)
    );
    assert_eq!(buf, [7, 8]);
}

/// An anonymous private mapping of `pages` pages with `protection`, at an address no
/// other test maps again once it is unmapped.
fn map(pages: usize, protection: libc::c_int) -> usize {
    crate::mappings::map_far(pages, protection)
}

fn unmap(addr: usize, pages: usize) {
    // SAFETY: a mapping of this test.
    let unmapped = unsafe { libc::munmap(addr as *mut libc::c_void, pages * 4096) };
    assert_eq!(unmapped, 0);
}

/// ibv_reg_mr(3) on a kernel device: `ib_umem_get` refuses length 0 with EINVAL and
/// `get_user_pages` refuses an unmapped page, or a page without write permission when
/// the region asks for write access (FOLL_WRITE), with EFAULT.
#[test]
fn registration_refuses_empty_unmapped_and_unwritable_ranges_with_the_kernels_errno() {
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_ATOMIC;
    let mut t = MemoryTable::new();
    let mut buf = [0u64; 4];
    let at = buf.as_mut_ptr() as usize;
    // SAFETY: refused before anything is recorded.
    let empty = unsafe { t.register(1, at, 0, 0, all) };
    assert_eq!(empty, Err(RegisterError::ZeroLength));

    let gone = map(2, libc::PROT_READ | libc::PROT_WRITE);
    unmap(gone, 2);
    // SAFETY: refused: the range is not mapped.
    let unmapped = unsafe { t.register(1, gone + 8, 4096, 0, all) };
    assert_eq!(unmapped, Err(RegisterError::Unmapped { addr: gone + 8 }));

    let read_only = map(1, libc::PROT_READ);
    for write in [
        AccessFlags::LOCAL_WRITE,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
        AccessFlags::MW_BIND,
    ] {
        // SAFETY: refused: write access on a read-only mapping.
        let refused = unsafe { t.register(1, read_only, 4096, 0, write) };
        assert_eq!(refused, Err(RegisterError::NotWritable { addr: read_only }));
    }
    // SAFETY: the mapping outlives the region (deregistered below).
    let ok = unsafe { t.register(1, read_only, 4096, 0, AccessFlags::REMOTE_READ) }.unwrap();
    let mut out = [1u8; 8];
    assert_eq!(t.read(1, MemKey::Remote(ok.rkey), 8, &mut out), Ok(()));
    assert_eq!(out, [0; 8]);
    t.deregister(ok.lkey).unwrap();

    // Half mapped: 1 TiB over a small buffer.
    // SAFETY: refused: most of the range is not mapped.
    let huge = unsafe { t.register(1, at, 1 << 40, 0, all) };
    // A page missing (or not writable) where no limit applies, over RLIMIT_MEMLOCK where
    // one does (ib_umem_get charges the pages before pinning them).
    assert!(
        matches!(
            huge,
            Err(RegisterError::Unmapped { .. }
                | RegisterError::NotWritable { .. }
                | RegisterError::OverMemlock { .. })
        ),
        "{huge:?}"
    );
    assert!(t.is_empty());
    unmap(read_only, 1);
}

/// A region the application unmaps while registered: every access fails with
/// `MemError::Fault` (the engine's REM_ACCESS_ERR NAK / LOC_PROT_ERR), the fault is
/// counted once per faulting access, the process lives, and later accesses are refused
/// without touching memory.
#[test]
fn accesses_to_a_region_unmapped_while_registered_fail_are_counted_and_fail_fast() {
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_ATOMIC;
    let mut t = MemoryTable::new();
    let mut regions = Vec::new();
    for _ in 0..3 {
        let addr = map(2, libc::PROT_READ | libc::PROT_WRITE);
        // SAFETY: the contract is broken on purpose below (munmap): that is the test.
        let r = unsafe { t.register(1, addr, 8192, 0x10_000, all) }.unwrap();
        unmap(addr, 2);
        regions.push(r);
    }
    let mut out = [0u8; 16];
    assert_eq!(
        t.write(1, MemKey::Remote(regions[0].rkey), 0x10_100, &[1; 16]),
        Err(MemError::Fault)
    );
    assert_eq!(
        t.read(1, MemKey::Remote(regions[1].rkey), 0x10_100, &mut out),
        Err(MemError::Fault)
    );
    assert_eq!(
        t.atomic(1, regions[2].rkey, 0x10_008, AtomicOp::FetchAdd { add: 1 }),
        Err(MemError::Fault)
    );
    assert_eq!(t.faulted_accesses(), 3);
    // Marked: refused up front, not faulting again.
    assert_eq!(
        t.check_local(1, regions[0].lkey, 0x10_000, 8, AccessFlags::empty()),
        Err(MemError::Fault)
    );
    assert_eq!(
        t.read(1, MemKey::Local(regions[0].lkey), 0x10_000, &mut out),
        Err(MemError::Fault)
    );
    assert_eq!(t.faulted_accesses(), 3);
    for r in regions {
        assert!(t.deregister(r.lkey).is_some());
    }
}

/// A region over two pages whose second page the application unmaps: a write
/// spanning both lands in the region's part of the first page and fails at the
/// second; nothing outside the region moves (the bytes before it, the page after it).
#[test]
fn a_write_over_a_partly_unmapped_region_changes_only_the_mapped_part_of_the_region() {
    let addr = map(3, libc::PROT_READ | libc::PROT_WRITE);
    // SAFETY: our three pages, mapped read-write.
    unsafe { std::ptr::write_bytes(addr as *mut u8, 0xee, 3 * 4096) };
    let mut t = MemoryTable::new();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let start = addr + 4096 - 32;
    // SAFETY: page 1 is unmapped on purpose below; that is the test.
    let r = unsafe { t.register(1, start, 64, 0x2000, access) }.unwrap();
    unmap(addr + 4096, 1);
    assert_eq!(
        t.write(1, MemKey::Remote(r.rkey), 0x2000, &[1; 64]),
        Err(MemError::Fault)
    );
    // SAFETY: pages 0 and 2 are still mapped.
    let (page0, page2) = unsafe {
        (
            std::slice::from_raw_parts(addr as *const u8, 4096),
            std::slice::from_raw_parts((addr + 2 * 4096) as *const u8, 4096),
        )
    };
    assert!(page0[..4096 - 32].iter().all(|&b| b == 0xee));
    assert!(page0[4096 - 32..].iter().all(|&b| b == 1));
    assert!(page2.iter().all(|&b| b == 0xee));
    // Registering a range with an unmapped page is refused from now on.
    // SAFETY: refused.
    let again = unsafe { t.register(1, start, 64, 0, access) };
    assert_eq!(again, Err(RegisterError::Unmapped { addr: addr + 4096 }));
    t.deregister(r.lkey);
    unmap(addr, 1);
    unmap(addr + 2 * 4096, 1);
}

/// `ibv_rereg_mr(3)` with `IBV_REREG_MR_CHANGE_TRANSLATION`: the keys stay and reach the
/// new range only. A write at the old address, or past the new range's end, is refused
/// and neither the old buffer nor the bytes around the new range change — a peer whose
/// access was in flight across the re-registration writes inside the new range or not
/// at all.
#[test]
fn rereg_translation_keeps_the_keys_and_reaches_only_the_new_range() {
    let mut old = vec![0u8; 256];
    // The new range is the middle of `arena`: its two ends are canaries.
    let mut arena = vec![0xeeu8; 3 * 64];
    let (mut t, r) = table_with(
        &mut old,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    );
    let new_addr = arena.as_mut_ptr() as usize + 64;
    let change = Rereg {
        translation: Some((new_addr, 64, new_addr as u64)),
        ..Rereg::default()
    };
    // SAFETY: `arena` outlives `t`.
    let now = unsafe { t.reregister(r.lkey, change) }.unwrap().unwrap();
    assert_eq!(
        (now.lkey, now.rkey, now.addr, now.len),
        (r.lkey, r.rkey, new_addr, 64)
    );
    assert_eq!(
        t.write(1, MemKey::Remote(r.rkey), 0x1000 + 8, &[1; 8]),
        Err(MemError::OutOfBounds)
    );
    let base = new_addr as u64;
    assert_eq!(
        t.write(1, MemKey::Remote(r.rkey), base + 60, &[2; 8]),
        Err(MemError::OutOfBounds)
    );
    assert!(t.write(1, MemKey::Remote(r.rkey), base, &[3; 64]).is_ok());
    drop(t);
    assert!(old.iter().all(|&b| b == 0), "the old range was written");
    assert!(arena[..64].iter().all(|&b| b == 0xee));
    assert!(arena[64..128].iter().all(|&b| b == 3));
    assert!(arena[128..].iter().all(|&b| b == 0xee));
}

/// `ibv_rereg_mr(3)` with `IBV_REREG_MR_CHANGE_ACCESS`: the new rights apply to the next
/// access; remote write without local write is refused as at registration
/// (`ibv_reg_mr(3)`), leaving the region as it was.
#[test]
fn rereg_access_applies_to_the_next_access_and_refuses_what_registration_refuses() {
    let mut buf = [0u8; 64];
    let (mut t, r) = table_with(
        &mut buf,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    );
    assert!(t.write(1, MemKey::Remote(r.rkey), 0x1000, &[1]).is_ok());
    let to = |access| Rereg {
        access: Some(access),
        ..Rereg::default()
    };
    // SAFETY: no new translation.
    let refused = unsafe { t.reregister(r.lkey, to(AccessFlags::REMOTE_WRITE)) };
    assert_eq!(refused, Some(Err(RegisterError::MissingLocalWrite)));
    assert_eq!(t.by_lkey(r.lkey), Some(&r));
    // SAFETY: no new translation.
    let now = unsafe { t.reregister(r.lkey, to(AccessFlags::REMOTE_READ)) };
    assert_eq!(now.unwrap().unwrap().access, AccessFlags::REMOTE_READ);
    assert_eq!(
        t.write(1, MemKey::Remote(r.rkey), 0x1000, &[1]),
        Err(MemError::AccessDenied)
    );
}

/// `ibv_rereg_mr(3)` refusals that libibverbs makes before the kernel (no flag; a new
/// translation with a NULL address or zero length): `EINVAL`, nothing changed. An
/// unknown lkey is `None`.
#[test]
fn rereg_of_nothing_or_of_an_empty_translation_is_refused() {
    let mut buf = [0u8; 64];
    let (mut t, r) = table_with(&mut buf, AccessFlags::LOCAL_WRITE);
    // SAFETY: refused before anything changes.
    unsafe {
        assert_eq!(
            t.reregister(r.lkey, Rereg::default()),
            Some(Err(RegisterError::NothingToChange))
        );
        let null = Rereg {
            translation: Some((0, 64, 0)),
            ..Rereg::default()
        };
        assert_eq!(
            t.reregister(r.lkey, null),
            Some(Err(RegisterError::EmptyTranslation))
        );
        let empty = Rereg {
            translation: Some((buf.as_ptr() as usize, 0, 0)),
            ..Rereg::default()
        };
        assert_eq!(
            t.reregister(r.lkey, empty),
            Some(Err(RegisterError::EmptyTranslation))
        );
        assert_eq!(t.reregister(r.lkey ^ 1, Rereg::default()), None);
    }
    assert_eq!(t.by_lkey(r.lkey), Some(&r));
}

// IBTA 1.5 ATOMIC WRITE (rxe's check_rkey asks for IB_ACCESS_REMOTE_WRITE; oA19-28: 8
// bytes, 8-byte aligned): the bytes land as they came, in one store; misaligned, out of
// bounds and without REMOTE_WRITE are refused without touching memory.
#[test]
fn atomic_write_stores_eight_bytes_at_once_with_remote_write_only() {
    let mut buf = [0u64; 2];
    let mut t = MemoryTable::new();
    // SAFETY: `buf` outlives `t`.
    let r = unsafe {
        t.register(
            1,
            buf.as_mut_ptr() as usize,
            16,
            0,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
    }
    .unwrap();
    let bytes = [1, 2, 3, 4, 5, 6, 7, 8];
    assert_eq!(t.atomic_write(1, r.rkey, 8, bytes), Ok(()));
    assert_eq!(
        t.atomic_write(1, r.rkey, 4, bytes),
        Err(MemError::Misaligned)
    );
    assert_eq!(
        t.atomic_write(1, r.rkey, 16, bytes),
        Err(MemError::OutOfBounds)
    );
    assert_eq!(buf, [0, u64::from_ne_bytes(bytes)]);

    let mut other = [0u64; 1];
    // SAFETY: `other` outlives `t`.
    let atomic_only = unsafe {
        t.register(
            1,
            other.as_mut_ptr() as usize,
            8,
            0,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
        )
    }
    .unwrap();
    assert_eq!(
        t.atomic_write(1, atomic_only.rkey, 0, bytes),
        Err(MemError::AccessDenied)
    );
    assert_eq!(other, [0]);
}

// IBTA 1.5 FLUSH (rxe's check_rkey): the region needs the FLUSH_* right of each placement
// bit; a range must be inside it, the whole-region level ignores address and length.
#[test]
fn flush_needs_the_placement_rights_and_checks_ranges_but_not_whole_regions() {
    use softverbs_proto::{FlushPlacement, FlushSelectivity};
    let mut buf = [0u8; 64];
    let mut t = MemoryTable::new();
    // SAFETY: `buf` outlives `t`.
    let r = unsafe {
        t.register(
            1,
            buf.as_mut_ptr() as usize,
            64,
            0,
            AccessFlags::LOCAL_WRITE | AccessFlags::FLUSH_GLOBAL,
        )
    }
    .unwrap();
    let (range, mr) = (FlushSelectivity::Range, FlushSelectivity::Mr);
    let global = FlushPlacement::GLOBAL;
    assert_eq!(t.flush(1, r.rkey, 0, 64, range, global), Ok(()));
    assert_eq!(
        t.flush(1, r.rkey, 8, 64, range, global),
        Err(MemError::OutOfBounds)
    );
    assert_eq!(t.flush(1, r.rkey, 1 << 40, 1 << 40, mr, global), Ok(()));
    assert_eq!(
        t.flush(1, r.rkey, 0, 8, range, FlushPlacement::PERSISTENT),
        Err(MemError::AccessDenied)
    );
    assert_eq!(
        t.flush(2, r.rkey, 0, 8, range, global),
        Err(MemError::PdMismatch)
    );
    assert_eq!(
        t.flush(1, r.rkey ^ 0x100, 0, 8, mr, global),
        Err(MemError::InvalidKey)
    );
}

const ODP_ALL: AccessFlags = AccessFlags::ON_DEMAND
    .union(AccessFlags::LOCAL_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_ATOMIC);

/// Maps `pages` read-write pages exactly at `addr` (which must be free).
fn map_at(addr: usize, pages: usize) {
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            pages * 4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    assert_eq!(p as usize, addr);
}

/// ibv_reg_mr(3) with IBV_ACCESS_ON_DEMAND, as the kernel's ib_umem_odp_get: the range
/// need not be mapped (PROT_NONE, or not mapped at all) and nothing is pinned. An access
/// to a page not mapped at the time fails (MemError::Fault: the engine's REM_ACCESS_ERR
/// NAK / LOC_PROT_ERR, as rxe_odp_map_range_and_lock's EFAULT), is counted as an
/// unresolved page fault, and does not mark the region: once the page is mapped the
/// next access lands.
#[test]
fn an_on_demand_region_reaches_memory_mapped_after_registration() {
    let mut t = MemoryTable::new();
    let protected = map(2, libc::PROT_NONE);
    let gone = map(2, libc::PROT_READ | libc::PROT_WRITE);
    unmap(gone, 2);
    // SAFETY: an on-demand region: the device reaches whatever is mapped there; these
    // mappings are the test's own.
    let a = unsafe { t.register(1, protected, 8192, 0x10_000, ODP_ALL) }.unwrap();
    // SAFETY: as above; nothing is mapped there yet.
    let b = unsafe { t.register(1, gone, 8192, 0x20_000, ODP_ALL) }.unwrap();
    for (r, at) in [(a, 0x10_100), (b, 0x20_100)] {
        assert_eq!(
            t.write(1, MemKey::Remote(r.rkey), at, &[5; 16]),
            Err(MemError::Fault)
        );
    }
    assert_eq!((t.unresolved_page_faults(), t.faulted_accesses()), (2, 0));

    // SAFETY: the test's own PROT_NONE mapping.
    let opened = unsafe {
        libc::mprotect(
            protected as *mut libc::c_void,
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    assert_eq!(opened, 0);
    map_at(gone, 2);
    let mut out = [0u8; 16];
    for (r, at) in [(a, 0x10_100), (b, 0x20_100)] {
        assert_eq!(t.write(1, MemKey::Remote(r.rkey), at, &[5; 16]), Ok(()));
        assert_eq!(t.read(1, MemKey::Local(r.lkey), at, &mut out), Ok(()));
        assert_eq!(out, [5; 16]);
    }
    // A page unmapped again fails again, the region still usable after.
    unmap(gone + 4096, 1);
    assert_eq!(
        t.write(1, MemKey::Remote(b.rkey), 0x21_000, &[6; 8]),
        Err(MemError::Fault)
    );
    assert_eq!(
        t.write(1, MemKey::Remote(b.rkey), 0x20_000, &[6; 8]),
        Ok(())
    );
    assert_eq!(t.unresolved_page_faults(), 3);
    t.deregister(a.lkey).unwrap();
    t.deregister(b.lkey).unwrap();
    unmap(protected, 2);
    unmap(gone, 1);
}

/// ibv_reg_mr(3): "To create an implicit ODP MR, IBV_ACCESS_ON_DEMAND should be set, addr
/// should be 0 and length should be SIZE_MAX." It reaches every mapped address by its
/// own value; its iova must be 0 (rxe_odp_mr_init_user, mlx5_ib_reg_user_mr: EINVAL).
/// Without ON_DEMAND the range wraps (EINVAL). An on-demand range past the end of the
/// address space is ib_init_umem_odp's EOVERFLOW; length 0 stays EINVAL.
#[test]
fn the_implicit_region_is_the_whole_address_space_and_only_on_demand() {
    let mut t = MemoryTable::new();
    let whole = usize::MAX as u64;
    // SAFETY: refused before anything is recorded.
    unsafe {
        assert_eq!(
            t.register(1, 0, whole, 0, AccessFlags::LOCAL_WRITE),
            Err(RegisterError::BadRange)
        );
        assert_eq!(
            t.register(1, 0, whole, 0x1000, ODP_ALL),
            Err(RegisterError::ImplicitIova)
        );
        assert_eq!(
            t.register(1, usize::MAX - 4095, 8192, 0, ODP_ALL),
            Err(RegisterError::Overflow)
        );
        assert_eq!(
            t.register(1, 0x1000, 0, 0, ODP_ALL),
            Err(RegisterError::ZeroLength)
        );
    }
    assert!(t.is_empty());
    // SAFETY: the device may reach any mapped memory through this region; it is used
    // only on `buf` and on an unmapped address below.
    let r = unsafe { t.register(1, 0, whole, 0, ODP_ALL) }.unwrap();
    assert_eq!((r.addr, r.len, r.iova), (0, whole, 0));
    let buf = [0u64; 2];
    let at = buf.as_ptr() as u64;
    assert_eq!(
        t.atomic(1, r.rkey, at + 8, AtomicOp::FetchAdd { add: 3 }),
        Ok(0)
    );
    assert_eq!(
        // SAFETY: `buf` is written by the device's atomic above only.
        unsafe { std::ptr::read_volatile(&buf[1]) },
        3
    );
    let mut out = [1u8; 8];
    assert_eq!(
        t.read(1, MemKey::Remote(r.rkey), 0, &mut out),
        Err(MemError::Fault)
    );
    assert_eq!(t.unresolved_page_faults(), 1);
    t.deregister(r.lkey).unwrap();
}

/// ibv_advise_mr(3) in the kernel's order and with its errnos (module `advice`): flags
/// (EINVAL), an empty list (0), the advice (EOPNOTSUPP), then per entry the region
/// (not on-demand: ENOENT; another PD: EPERM; PREFETCH_WRITE without write access:
/// EPERM) and, with IBV_ADVISE_MR_FLAG_FLUSH only, the range and its pages (EFAULT).
#[test]
fn advise_checks_in_the_kernels_order_and_faults_only_when_flushed() {
    let mut t = MemoryTable::new();
    let page = map(2, libc::PROT_READ | libc::PROT_WRITE);
    let read_only = map(1, libc::PROT_READ);
    // SAFETY: the test's own mappings, unmapped after deregistration.
    let (odp, ro, pinned) = unsafe {
        (
            t.register(1, page, 8192, page as u64, ODP_ALL).unwrap(),
            t.register(1, read_only, 4096, read_only as u64, AccessFlags::ON_DEMAND)
                .unwrap(),
            t.register(1, page, 4096, page as u64, AccessFlags::LOCAL_WRITE)
                .unwrap(),
        )
    };
    let sge = |r: &Region, off: u64, length: u32| Sge {
        addr: r.iova + off,
        length,
        lkey: r.lkey,
    };
    let flush = ADVISE_FLAG_FLUSH;
    let ok = [sge(&odp, 0, 8192)];
    assert_eq!(
        t.advise(1, Advice::Prefetch, 2, &ok),
        Err(AdviseError::UnknownFlags { flags: 2 })
    );
    assert_eq!(t.advise(1, Advice::Unknown(9), flush, &[]), Ok(()));
    assert_eq!(
        t.advise(1, Advice::Unknown(9), flush, &ok),
        Err(AdviseError::Unsupported(9))
    );
    for advice in [
        Advice::Prefetch,
        Advice::PrefetchWrite,
        Advice::PrefetchNoFault,
    ] {
        assert_eq!(t.advise(1, advice, flush, &ok), Ok(()));
        assert_eq!(t.advise(1, advice, 0, &ok), Ok(()));
    }
    let not_odp = [sge(&pinned, 0, 8)];
    assert_eq!(
        t.advise(1, Advice::Prefetch, flush, &not_odp),
        Err(AdviseError::NotOnDemand { lkey: pinned.lkey })
    );
    assert_eq!(
        t.advise(2, Advice::Prefetch, flush, &ok),
        Err(AdviseError::OtherPd { lkey: odp.lkey })
    );
    assert_eq!(
        t.advise(1, Advice::PrefetchWrite, flush, &[sge(&ro, 0, 8)]),
        Err(AdviseError::NotWritable { lkey: ro.lkey })
    );
    let outside = [sge(&odp, 8000, 400)];
    assert!(matches!(
        t.advise(1, Advice::Prefetch, flush, &outside),
        Err(AdviseError::OutOfRange { .. })
    ));
    assert_eq!(t.advise(1, Advice::Prefetch, 0, &outside), Ok(()));
    // A read-only page is read, not written: PREFETCH of it passes.
    assert_eq!(
        t.advise(1, Advice::Prefetch, flush, &[sge(&ro, 0, 4096)]),
        Ok(())
    );
    unmap(page + 4096, 1);
    let second = [sge(&odp, 4096, 16)];
    assert_eq!(
        t.advise(1, Advice::Prefetch, flush, &second),
        Err(AdviseError::Unmapped { addr: page + 4096 })
    );
    assert_eq!(t.advise(1, Advice::Prefetch, 0, &second), Ok(()));
    assert_eq!(t.advise(1, Advice::PrefetchNoFault, flush, &second), Ok(()));
    for r in [odp, ro, pinned] {
        t.deregister(r.lkey).unwrap();
    }
    unmap(page, 1);
    unmap(read_only, 1);
}

/// ibv_rereg_mr(3) with IBV_REREG_MR_CHANGE_ACCESS turning ON_DEMAND off registers the
/// range anew: every page must then be mapped (EFAULT otherwise), as ibv_reg_mr without
/// ON_DEMAND checks it; a refusal leaves the region on demand.
#[test]
fn rereg_access_off_demand_checks_the_pages_as_a_registration() {
    let mut t = MemoryTable::new();
    let gone = map(1, libc::PROT_READ | libc::PROT_WRITE);
    unmap(gone, 1);
    // SAFETY: on demand over an unmapped page of the test's.
    let r = unsafe { t.register(1, gone, 4096, 0, ODP_ALL) }.unwrap();
    let pinned = Rereg {
        access: Some(AccessFlags::LOCAL_WRITE),
        ..Rereg::default()
    };
    // SAFETY: refused: the page is not mapped.
    let refused = unsafe { t.reregister(r.lkey, pinned) }.unwrap();
    assert_eq!(refused, Err(RegisterError::Unmapped { addr: gone }));
    assert_eq!(t.by_lkey(r.lkey).unwrap().access, ODP_ALL);
    t.deregister(r.lkey).unwrap();
}

/// Reads left for when the packet is written (`crate::deferred`): a read of 1 KiB or more
/// while a packet is built is kept as a piece (its place in the run's bytes and the
/// region's address), not copied; a shorter one is copied at once; a packet the engine
/// gives up (a gather failing part way: `Memory::abandon_reads`) leaves no piece behind to
/// overwrite the next packet built in the same room; after `stop_deferring` every read is
/// made at once again. Only x86-64 leaves reads for later (elsewhere a region unmapped
/// before the packet leaves would not be a fault but a crash).
#[test]
fn reads_of_a_packet_being_built_are_left_for_later_and_a_given_up_packet_leaves_none() {
    let mut buf: Vec<u8> = (0..4096).map(|i| i as u8).collect();
    let base = buf.as_ptr() as usize;
    let (t, r) = table_with(&mut buf, AccessFlags::LOCAL_WRITE);
    // The room of a packet at offset 100 of its run's bytes.
    let mut room = vec![0u8; 8192];
    t.defer_reads(&room, 100);
    t.read(
        1,
        MemKey::Local(r.lkey),
        0x1000 + 8,
        &mut room[12..12 + 2048],
    )
    .unwrap();
    t.read(1, MemKey::Local(r.lkey), 0x1000, &mut room[2060..2060 + 16])
        .unwrap();
    assert_eq!(
        &room[2060..2076],
        &buf[..16],
        "a short read is copied at once"
    );
    let mut pieces = Vec::new();
    t.take_deferred(&mut pieces);
    if cfg!(target_arch = "x86_64") {
        assert!(room[12..2060].iter().all(|&b| b == 0), "not copied");
        let found: Vec<_> = pieces.iter().map(|p| (p.at, p.len, p.src)).collect();
        assert_eq!(found, [(100 + 12, 2048, base + 8)]);
        assert!(crate::deferred::fill(&mut room, 100, &pieces));
    } else {
        assert!(pieces.is_empty());
    }
    assert_eq!(&room[12..2060], &buf[8..2056], "the bytes are the region's");
    // A packet given up: its pieces go.
    t.defer_reads(&room, 0);
    t.read(1, MemKey::Local(r.lkey), 0x1000, &mut room[0..1024])
        .unwrap();
    t.abandon_reads();
    let mut pieces = Vec::new();
    t.take_deferred(&mut pieces);
    assert!(pieces.is_empty(), "a given-up packet leaves no piece");
    // Deferring off: copied at once.
    t.stop_deferring();
    let mut plain = vec![0u8; 1024];
    t.read(1, MemKey::Local(r.lkey), 0x1000, &mut plain)
        .unwrap();
    assert_eq!(plain, buf[..1024]);
    t.take_deferred(&mut pieces);
    assert!(pieces.is_empty());
}

/// A write of a handed-over packet's payload whose pieces are still in the sender's
/// regions (`MemoryTable::supply_from`) takes those bytes from there and the rest from the
/// packet, and counts them; a piece whose source page is gone fails the write with
/// `MemError::Fault` and marks the *sender's* region, not this one (whose next access
/// still works).
#[cfg(target_arch = "x86_64")]
#[test]
fn supplied_writes_read_pieces_from_the_senders_region_and_blame_a_fault_on_it() {
    use crate::deferred::Deferred;
    use std::sync::atomic::AtomicBool;
    let mut target = vec![0u8; 256];
    let (mut t, r) = table_with(&mut target, AccessFlags::LOCAL_WRITE);
    let sender: Vec<u8> = (0..100).map(|i| 100 + i as u8).collect();
    let sender_mark = Arc::new(AtomicBool::new(false));
    // A 40-byte packet at offset 500 of its run: bytes 10..30 are the sender's 20 bytes.
    let packet: Vec<u8> = (0..40).map(|i| i as u8).collect();
    let piece = Deferred {
        at: 500 + 10,
        len: 20,
        src: sender.as_ptr() as usize + 5,
        faulted: sender_mark.clone(),
    };
    t.supply_from(&packet, 500, &[piece]);
    t.write(1, MemKey::Local(r.lkey), 0x1000, &packet[4..36])
        .unwrap();
    t.stop_supplying();
    let mut expected: Vec<u8> = (4..10).collect();
    expected.extend_from_slice(&sender[5..25]);
    expected.extend(30..36u8);
    assert_eq!(&target[..32], &expected[..]);
    assert_eq!(t.direct_payload_bytes(), 20);

    // The sender's page gone.
    let gone = map(1, libc::PROT_READ | libc::PROT_WRITE);
    unmap(gone, 1);
    let piece = Deferred {
        at: 500 + 10,
        len: 20,
        src: gone,
        faulted: sender_mark.clone(),
    };
    t.supply_from(&packet, 500, &[piece]);
    assert_eq!(
        t.write(1, MemKey::Local(r.lkey), 0x1000, &packet[..40]),
        Err(MemError::Fault)
    );
    t.stop_supplying();
    assert!(
        sender_mark.load(Ordering::Relaxed),
        "the sender's region is marked"
    );
    assert_eq!(t.faulted_accesses(), 0, "not this table's fault");
    t.write(1, MemKey::Local(r.lkey), 0x1000, &[9; 8])
        .expect("this region still works");
    assert_eq!(&target[..8], &[9; 8]);
}
