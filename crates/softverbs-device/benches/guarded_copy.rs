//! The cost of fault-tolerant copies on the hot path: the copies into and out of
//! registered memory before the guarded routines (relaxed atomic 64-bit words, an edge
//! merged with compare-and-swap; reproduced here verbatim) against the guarded ones
//! (`softverbs_device::copy_to_shared` / `copy_from_shared`: one `rep movsb` on x86-64),
//! for 8 B, 4 KiB and 64 KiB at an aligned and an unaligned start, and the 8-byte atomic.
//!
//! `cargo bench -p softverbs-device --bench guarded_copy`; prints the best of several
//! rounds in nanoseconds per copy (and GB/s).

use softverbs_device::{copy_from_shared, copy_to_shared, guarded};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The pre-guarded `copy_from_shared`.
///
/// # Safety
///
/// The words covering `src .. src + dst.len()` are valid and accessed only atomically.
unsafe fn old_copy_from_shared(src: *const u8, dst: &mut [u8]) {
    let mut done = 0;
    while done < dst.len() {
        let at = src.wrapping_add(done);
        let skip = at as usize % 8;
        let word_ptr = at.wrapping_sub(skip) as *mut u64;
        let take = (8 - skip).min(dst.len() - done);
        // SAFETY: per the contract.
        let word = unsafe { AtomicU64::from_ptr(word_ptr) }.load(Ordering::Relaxed);
        dst[done..done + take].copy_from_slice(&word.to_ne_bytes()[skip..skip + take]);
        done += take;
    }
}

/// The pre-guarded `copy_to_shared`.
///
/// # Safety
///
/// As [`old_copy_from_shared`], for writes.
unsafe fn old_copy_to_shared(src: &[u8], dst: *mut u8) {
    let mut done = 0;
    while done < src.len() {
        let at = dst.wrapping_add(done);
        let skip = at as usize % 8;
        let word_ptr = at.wrapping_sub(skip) as *mut u64;
        let take = (8 - skip).min(src.len() - done);
        // SAFETY: per the contract.
        let word = unsafe { AtomicU64::from_ptr(word_ptr) };
        if take == 8 {
            let value = u64::from_ne_bytes(src[done..done + 8].try_into().expect("8 bytes"));
            word.store(value, Ordering::Relaxed);
        } else {
            let _ = word.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                let mut bytes = old.to_ne_bytes();
                bytes[skip..skip + take].copy_from_slice(&src[done..done + take]);
                Some(u64::from_ne_bytes(bytes))
            });
        }
        done += take;
    }
}

/// Best nanoseconds per call of `f` over several rounds.
fn measure(mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..15 {
        let iterations = 2000;
        let start = Instant::now();
        for _ in 0..iterations {
            f();
        }
        best = best.min(start.elapsed().as_nanos() as f64 / iterations as f64);
    }
    best
}

fn report(what: &str, len: usize, old: f64, new: f64) {
    let gbps = |ns: f64| len as f64 / ns;
    println!(
        "{what:<28} {len:>6} B   old {old:>9.1} ns ({:>6.2} GB/s)   new {new:>9.1} ns ({:>6.2} GB/s)   new/old {:.2}",
        gbps(old),
        gbps(new),
        new / old
    );
}

fn main() {
    // Word-aligned "registered memory" (as the safe API's pages are) and engine buffers.
    let mut shared = vec![0u64; 64 * 1024 / 8 + 2];
    let base = shared.as_mut_ptr().cast::<u8>();
    let mut engine = vec![0x5au8; 64 * 1024 + 16];
    guarded::ensure_installed();
    for len in [8usize, 4096, 64 * 1024] {
        for offset in [0usize, 3] {
            let src = &engine[..len];
            let old = measure(|| {
                // SAFETY: the ranges (here and below) lie inside `shared` and `engine`,
                // which outlive the loop; nothing else touches them.
                unsafe { old_copy_to_shared(black_box(src), base.add(offset)) }
            });
            let new = measure(|| {
                // SAFETY: as above.
                let r = unsafe { copy_to_shared(black_box(src), base.add(offset)) };
                black_box(r).unwrap();
            });
            report(&format!("into registered (+{offset})"), len, old, new);
            let dst = &mut engine[..len];
            let old = measure(|| {
                // SAFETY: as above.
                unsafe { old_copy_from_shared(black_box(base.add(offset)), dst) }
            });
            let dst = &mut engine[..len];
            let new = measure(|| {
                // SAFETY: as above.
                let r = unsafe { copy_from_shared(black_box(base.add(offset)), dst) };
                black_box(r).unwrap();
            });
            report(&format!("out of registered (+{offset})"), len, old, new);
        }
    }
    let word = shared.as_mut_ptr();
    // SAFETY: an aligned word of `shared`.
    let atomic = unsafe { AtomicU64::from_ptr(word) };
    let old = measure(|| {
        black_box(atomic.fetch_add(black_box(1), Ordering::SeqCst));
    });
    let new = measure(|| {
        // SAFETY: as above.
        black_box(unsafe { guarded::fetch_add(word, black_box(1)) }.unwrap());
    });
    report("fetch_add", 8, old, new);
}
