//! Fault-tolerant access to application memory: the copies and 8-byte atomics through
//! which the device reads and writes registered regions, made so that a page the
//! application unmapped (or freed, or `mprotect`ed) after registering it makes the access
//! fail instead of killing the process.
//!
//! The mechanism is the kernel's exception table (`copy_from_user` and its fix-ups). On
//! x86-64 every access to application memory is one instruction of a small assembly
//! routine ([`copy`]: `rep movsb`; [`compare_swap`]: `lock cmpxchg`; [`fetch_add`]:
//! `lock xadd`) whose address is in a table beside the address of the routine's recovery
//! code. A `SIGSEGV`/`SIGBUS` handler, installed once per process
//! (`SA_SIGINFO | SA_ONSTACK | SA_NODEFER`) before the first guarded access, looks the
//! faulting instruction pointer up in that table: when it is one of ours, it moves the
//! instruction pointer to the recovery code, which returns "faulted"; any other fault is
//! passed to the handler installed before ours (its `sa_sigaction` or `sa_handler`), or,
//! when that was the default disposition (or ignore), the default is restored and the
//! faulting instruction runs again, so the process dies exactly as it would have without
//! softverbs.
//!
//! Guarantees:
//! * a guarded access never touches a byte outside the range it was given: `rep movsb`
//!   moves exactly `len` bytes, upward, and stops at the first byte it cannot access (the
//!   registers at the fault tell how many bytes moved); the atomics touch one aligned word;
//! * a race with the application (which may read and write its registered memory while
//!   the network does) is a race on values, never undefined behaviour: the accesses are
//!   made by assembly, opaque to the compiler, with plain moves (x86-64 stores and loads
//!   are single-copy atomic per byte, and aligned 8-byte ones as a whole), the same machine
//!   operations the relaxed atomic loads and stores of the safe API's buffers compile to;
//! * a fault neither loses nor reorders the recovery: the routines are leaf functions (no
//!   stack frame), so the recovery code returns straight to the caller.
//!
//! What it cannot do: see a page that was unmapped and then mapped again by something else
//! (the access lands in the new mapping), or survive an application that replaces the
//! `SIGSEGV`/`SIGBUS` handler afterwards without chaining to ours, or blocks those signals
//! while the device works (a blocked synchronous fault kills the process, as before).
//!
//! On other architectures the accesses are relaxed atomic loads and stores of aligned
//! 64-bit words (a partial word at an edge merged with compare-and-swap) and are **not**
//! fault tolerant: an unmapped page kills the process there.

/// A guarded access hit memory that is not mapped with the access it needs; `moved`
/// bytes (from the start of the range) were copied before the fault (0 for an atomic).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("memory fault after {moved} bytes")]
pub struct Faulted {
    /// Bytes copied before the fault.
    pub moved: usize,
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::Faulted;
    use std::ffi::{c_int, c_void};
    use std::sync::{Once, OnceLock};

    // The routines, System V calling convention, Intel syntax. Each possibly faulting
    // instruction has a local label (`.L…_access`) and its recovery code another
    // (`.L…_fixup`); the table `softverbs_guarded_fixups` pairs them. The symbols are
    // hidden: they never leave the library or program this crate is linked into, so two
    // copies of the crate in one process (the drop-in loaded by a Rust program) keep apart.
    core::arch::global_asm!(
        ".pushsection .text.softverbs_guarded,\"ax\",@progbits",
        // usize softverbs_guarded_copy(dst: *mut u8 (rdi), src: *const u8 (rsi),
        //                              len: usize (rdx)) -> bytes NOT copied (rax)
        ".balign 16",
        ".globl softverbs_guarded_copy",
        ".hidden softverbs_guarded_copy",
        ".type softverbs_guarded_copy,@function",
        "softverbs_guarded_copy:",
        "    mov rcx, rdx",
        ".Lsoftverbs_copy_access:",
        "    rep movsb",
        "    xor eax, eax",
        "    ret",
        ".Lsoftverbs_copy_fixup:",
        // A fault leaves rcx at the number of bytes not yet moved (the instruction is
        // restartable: rsi, rdi and rcx describe the remaining iterations).
        "    mov rax, rcx",
        "    ret",
        ".size softverbs_guarded_copy, . - softverbs_guarded_copy",
        // u32 softverbs_guarded_cas(word: *mut u64 (rdi), compare: u64 (rsi),
        //                           swap: u64 (rdx), original: *mut u64 (rcx)) -> 0 | 1
        ".balign 16",
        ".globl softverbs_guarded_cas",
        ".hidden softverbs_guarded_cas",
        ".type softverbs_guarded_cas,@function",
        "softverbs_guarded_cas:",
        "    mov rax, rsi",
        ".Lsoftverbs_cas_access:",
        "    lock cmpxchg qword ptr [rdi], rdx",
        "    mov qword ptr [rcx], rax",
        "    xor eax, eax",
        "    ret",
        ".Lsoftverbs_cas_fixup:",
        "    mov eax, 1",
        "    ret",
        ".size softverbs_guarded_cas, . - softverbs_guarded_cas",
        // u32 softverbs_guarded_xadd(word: *mut u64 (rdi), add: u64 (rsi),
        //                            original: *mut u64 (rdx)) -> 0 | 1
        ".balign 16",
        ".globl softverbs_guarded_xadd",
        ".hidden softverbs_guarded_xadd",
        ".type softverbs_guarded_xadd,@function",
        "softverbs_guarded_xadd:",
        "    mov rax, rsi",
        ".Lsoftverbs_xadd_access:",
        "    lock xadd qword ptr [rdi], rax",
        "    mov qword ptr [rdx], rax",
        "    xor eax, eax",
        "    ret",
        ".Lsoftverbs_xadd_fixup:",
        "    mov eax, 1",
        "    ret",
        ".size softverbs_guarded_xadd, . - softverbs_guarded_xadd",
        // u32 softverbs_guarded_xchg(word: *mut u64 (rdi), value: u64 (rsi)) -> 0 | 1
        // (xchg with a memory operand is locked: one atomic 8-byte store.)
        ".balign 16",
        ".globl softverbs_guarded_xchg",
        ".hidden softverbs_guarded_xchg",
        ".type softverbs_guarded_xchg,@function",
        "softverbs_guarded_xchg:",
        "    mov rax, rsi",
        ".Lsoftverbs_xchg_access:",
        "    xchg qword ptr [rdi], rax",
        "    xor eax, eax",
        "    ret",
        ".Lsoftverbs_xchg_fixup:",
        "    mov eax, 1",
        "    ret",
        ".size softverbs_guarded_xchg, . - softverbs_guarded_xchg",
        ".popsection",
        // The exception table: (faulting instruction, recovery code) pairs.
        ".pushsection .data.rel.ro.softverbs_guarded,\"aw\",@progbits",
        ".balign 8",
        ".globl softverbs_guarded_fixups",
        ".hidden softverbs_guarded_fixups",
        "softverbs_guarded_fixups:",
        "    .quad .Lsoftverbs_copy_access, .Lsoftverbs_copy_fixup",
        "    .quad .Lsoftverbs_cas_access, .Lsoftverbs_cas_fixup",
        "    .quad .Lsoftverbs_xadd_access, .Lsoftverbs_xadd_fixup",
        "    .quad .Lsoftverbs_xchg_access, .Lsoftverbs_xchg_fixup",
        ".popsection",
    );

    /// Entries of `softverbs_guarded_fixups`.
    const FIXUPS: usize = 4;

    extern "C" {
        fn softverbs_guarded_copy(dst: *mut u8, src: *const u8, len: usize) -> usize;
        fn softverbs_guarded_cas(
            word: *mut u64,
            compare: u64,
            swap: u64,
            original: *mut u64,
        ) -> u32;
        fn softverbs_guarded_xadd(word: *mut u64, add: u64, original: *mut u64) -> u32;
        fn softverbs_guarded_xchg(word: *mut u64, value: u64) -> u32;
        static softverbs_guarded_fixups: [[usize; 2]; FIXUPS];
    }

    /// The recovery address for a fault at `rip`, if `rip` is one of our accesses.
    fn fixup_for(rip: usize) -> Option<usize> {
        // SAFETY: the table is read-only data of this module, relocated before any code
        // runs; reading it is async-signal-safe.
        let table = unsafe { &*std::ptr::addr_of!(softverbs_guarded_fixups) };
        table.iter().find(|e| e[0] == rip).map(|e| e[1])
    }

    /// The dispositions of `SIGSEGV` and `SIGBUS` before ours, in that order.
    static PREVIOUS: OnceLock<[libc::sigaction; 2]> = OnceLock::new();
    static INSTALL: Once = Once::new();

    const SIGNALS: [c_int; 2] = [libc::SIGSEGV, libc::SIGBUS];

    /// Installs the fault handler once per process (a no-op after the first call).
    pub fn ensure_installed() {
        INSTALL.call_once(install);
    }

    fn install() {
        // SAFETY: an all-zero `sigaction` is a valid value (SIG_DFL, empty mask, no flags).
        let mut previous: [libc::sigaction; 2] = unsafe { std::mem::zeroed() };
        for (sig, old) in SIGNALS.iter().zip(previous.iter_mut()) {
            // SAFETY: a query (null new action) into a valid, writable `sigaction`.
            unsafe { libc::sigaction(*sig, std::ptr::null(), old) };
        }
        let _ = PREVIOUS.set(previous);
        // SAFETY: as above, all-zero is a valid `sigaction`, filled in below.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_fault as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
        // SAFETY: `sa_mask` is a valid, writable signal set.
        unsafe { libc::sigemptyset(&mut action.sa_mask) };
        for sig in SIGNALS {
            // SAFETY: installs a valid action whose handler has the SA_SIGINFO signature.
            if unsafe { libc::sigaction(sig, &action, std::ptr::null_mut()) } != 0 {
                tracing::warn!(sig, "cannot install the memory fault handler");
            }
        }
    }

    /// The `SIGSEGV` / `SIGBUS` handler: redirects a fault of one of our accesses to its
    /// recovery code, passes every other signal on. Async-signal-safe: it reads the
    /// fix-up table and the saved dispositions, and calls only `sigaction` and `raise`.
    extern "C" fn on_fault(sig: c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
        // si_code > 0: the kernel reports a fault (not a signal sent by kill or raise).
        // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
        let from_kernel = !info.is_null() && unsafe { (*info).si_code } > 0;
        if from_kernel && !context.is_null() {
            let uc = context.cast::<libc::ucontext_t>();
            let at = libc::REG_RIP as usize;
            // SAFETY: `context` is the ucontext the kernel saved for this signal; it is
            // ours to read and change until the handler returns (sigreturn restores it).
            let rip = unsafe { (*uc).uc_mcontext.gregs[at] } as usize;
            if let Some(fixup) = fixup_for(rip) {
                // SAFETY: as above; resuming at the routine's recovery code, whose
                // registers and stack are those of the faulting instruction.
                unsafe { (*uc).uc_mcontext.gregs[at] = fixup as i64 };
                return;
            }
        }
        // SAFETY: forwarding the signal as the kernel delivered it.
        unsafe { chain(sig, info, context, from_kernel) };
    }

    /// Hands the signal to the disposition that was installed before ours.
    ///
    /// # Safety
    ///
    /// Called from the signal handler with the kernel's arguments.
    unsafe fn chain(sig: c_int, info: *mut libc::siginfo_t, context: *mut c_void, fault: bool) {
        let index = usize::from(sig == libc::SIGBUS);
        let previous = PREVIOUS.get().map(|p| p[index]);
        match previous {
            Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
                if p.sa_flags & libc::SA_SIGINFO != 0 {
                    // SAFETY: with SA_SIGINFO the saved value is a three-argument handler.
                    let handler: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
                        unsafe { std::mem::transmute(p.sa_sigaction) };
                    handler(sig, info, context);
                } else {
                    // SAFETY: without SA_SIGINFO it is a one-argument handler.
                    let handler: extern "C" fn(c_int) =
                        unsafe { std::mem::transmute(p.sa_sigaction) };
                    handler(sig);
                }
            }
            _ => {
                // The default (or ignore, which the kernel overrides for a fault): restore
                // it; a fault then happens again when the instruction re-executes and
                // kills the process as it would have without us; a sent signal is
                // raised again (SA_NODEFER: it is not blocked here).
                // SAFETY: all-zero is SIG_DFL with an empty mask.
                let default: libc::sigaction = unsafe { std::mem::zeroed() };
                // SAFETY: sigaction and raise are async-signal-safe.
                unsafe {
                    libc::sigaction(sig, &default, std::ptr::null_mut());
                    if !fault {
                        libc::raise(sig);
                    }
                }
            }
        }
    }

    /// See [`super::copy`].
    ///
    /// # Safety
    ///
    /// See [`super::copy`].
    #[inline]
    pub unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> Result<(), Faulted> {
        ensure_installed();
        // SAFETY: forwarded contract; the routine touches exactly the two ranges and
        // returns the count not copied when a fault stops it.
        let left = unsafe { softverbs_guarded_copy(dst, src, len) };
        if left == 0 {
            Ok(())
        } else {
            Err(Faulted { moved: len - left })
        }
    }

    /// See [`super::compare_swap`].
    ///
    /// # Safety
    ///
    /// See [`super::compare_swap`].
    pub unsafe fn compare_swap(word: *mut u64, compare: u64, swap: u64) -> Result<u64, Faulted> {
        ensure_installed();
        let mut original = 0;
        // SAFETY: forwarded contract; `original` is a local the routine writes only on
        // success.
        match unsafe { softverbs_guarded_cas(word, compare, swap, &mut original) } {
            0 => Ok(original),
            _ => Err(Faulted { moved: 0 }),
        }
    }

    /// See [`super::fetch_add`].
    ///
    /// # Safety
    ///
    /// See [`super::fetch_add`].
    pub unsafe fn fetch_add(word: *mut u64, add: u64) -> Result<u64, Faulted> {
        ensure_installed();
        let mut original = 0;
        // SAFETY: as in `compare_swap`.
        match unsafe { softverbs_guarded_xadd(word, add, &mut original) } {
            0 => Ok(original),
            _ => Err(Faulted { moved: 0 }),
        }
    }

    /// See [`super::store`].
    ///
    /// # Safety
    ///
    /// See [`super::store`].
    pub unsafe fn store(word: *mut u64, value: u64) -> Result<(), Faulted> {
        ensure_installed();
        // SAFETY: forwarded contract; the routine touches only the word.
        match unsafe { softverbs_guarded_xchg(word, value) } {
            0 => Ok(()),
            _ => Err(Faulted { moved: 0 }),
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod imp {
    //! Not fault tolerant: relaxed atomic 64-bit words, as before the guarded copies.
    use super::Faulted;
    use std::sync::atomic::{AtomicU64, Ordering};

    pub fn ensure_installed() {}

    /// # Safety
    ///
    /// The aligned words covering both ranges are valid and accessed only atomically.
    pub unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> Result<(), Faulted> {
        let mut done = 0;
        while done < len {
            let from = src.wrapping_add(done);
            let to = dst.wrapping_add(done);
            let skip_from = from as usize % 8;
            let skip_to = to as usize % 8;
            let take = (8 - skip_from).min(8 - skip_to).min(len - done);
            // SAFETY: aligned words holding `from`, valid per the contract.
            let word = unsafe { AtomicU64::from_ptr(from.wrapping_sub(skip_from) as *mut u64) }
                .load(Ordering::Relaxed)
                .to_ne_bytes();
            // SAFETY: aligned word holding `to`, valid per the contract.
            let target = unsafe { AtomicU64::from_ptr(to.wrapping_sub(skip_to) as *mut u64) };
            if take == 8 {
                target.store(u64::from_ne_bytes(word), Ordering::Relaxed);
            } else {
                let _ = target.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                    let mut bytes = old.to_ne_bytes();
                    bytes[skip_to..skip_to + take]
                        .copy_from_slice(&word[skip_from..skip_from + take]);
                    Some(u64::from_ne_bytes(bytes))
                });
            }
            done += take;
        }
        Ok(())
    }

    /// # Safety
    ///
    /// `word` is valid, aligned, accessed only atomically.
    pub unsafe fn compare_swap(word: *mut u64, compare: u64, swap: u64) -> Result<u64, Faulted> {
        // SAFETY: per the contract.
        let w = unsafe { AtomicU64::from_ptr(word) };
        Ok(
            match w.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    /// # Safety
    ///
    /// `word` is valid, aligned, accessed only atomically.
    pub unsafe fn fetch_add(word: *mut u64, add: u64) -> Result<u64, Faulted> {
        // SAFETY: per the contract.
        Ok(unsafe { AtomicU64::from_ptr(word) }.fetch_add(add, Ordering::SeqCst))
    }

    /// # Safety
    ///
    /// `word` is valid, aligned, accessed only atomically.
    pub unsafe fn store(word: *mut u64, value: u64) -> Result<(), Faulted> {
        // SAFETY: per the contract.
        unsafe { AtomicU64::from_ptr(word) }.store(value, Ordering::SeqCst);
        Ok(())
    }
}

/// Whether accesses through this module survive unmapped memory on this architecture.
pub const FAULT_TOLERANT: bool = cfg!(target_arch = "x86_64");

/// Installs the process's fault handler now (it is otherwise installed by the first
/// guarded access). Idempotent.
pub fn ensure_installed() {
    imp::ensure_installed();
}

/// Copies `len` bytes from `src` to `dst`, upward, touching no byte outside the two
/// ranges. Returns [`Faulted`] (with the number of bytes moved) if a page of either range
/// is not mapped with the access needed, instead of dying (x86-64; elsewhere a fault kills
/// the process).
///
/// # Safety
///
/// The ranges do not overlap. Whatever of them is mapped is memory the caller may read
/// (`src`) and write (`dst`) for the duration of the call, and any concurrent access to it
/// is by this module or by atomic (or, for application memory, foreign-language) code, so
/// that a race is one on values. On non-x86-64 targets both ranges must be mapped, and the
/// aligned 64-bit words covering them accessed only atomically.
pub unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> Result<(), Faulted> {
    // SAFETY: forwarded contract.
    unsafe { imp::copy(dst, src, len) }
}

/// Atomically (sequentially consistent) compares the 8-byte word at `word` with `compare`
/// and stores `swap` if they are equal; returns the original value, or [`Faulted`] if the
/// word is not mapped writable (x86-64).
///
/// # Safety
///
/// `word` is 8-byte aligned; if mapped it is memory the caller may read and write, and
/// every concurrent access to it is atomic or by this module.
pub unsafe fn compare_swap(word: *mut u64, compare: u64, swap: u64) -> Result<u64, Faulted> {
    // SAFETY: forwarded contract.
    unsafe { imp::compare_swap(word, compare, swap) }
}

/// Atomically (sequentially consistent) adds `add` (wrapping) to the 8-byte word at
/// `word`; returns the original value, or [`Faulted`] if the word is not mapped writable
/// (x86-64).
///
/// # Safety
///
/// As [`compare_swap`].
pub unsafe fn fetch_add(word: *mut u64, add: u64) -> Result<u64, Faulted> {
    // SAFETY: forwarded contract.
    unsafe { imp::fetch_add(word, add) }
}

/// Stores `value` in the 8-byte word at `word` at once (sequentially consistent, a single
/// locked store no reader sees half of: IBTA 1.5's ATOMIC WRITE), or returns [`Faulted`]
/// if the word is not mapped writable (x86-64).
///
/// # Safety
///
/// As [`compare_swap`].
pub unsafe fn store(word: *mut u64, value: u64) -> Result<(), Faulted> {
    // SAFETY: forwarded contract.
    unsafe { imp::store(word, value) }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    const PAGE: usize = 4096;

    /// Two pages: the first read-write filled with `fill`, the second with `second`
    /// protection. Unmapped on drop.
    struct Pages(*mut u8);

    impl Pages {
        fn new(fill: u8, second: libc::c_int) -> Pages {
            // SAFETY: an anonymous private mapping chosen by the kernel.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    2 * PAGE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            let p = p.cast::<u8>();
            // SAFETY: the mapping is ours and writable.
            unsafe { std::ptr::write_bytes(p, fill, 2 * PAGE) };
            // SAFETY: the second page of our mapping.
            let protected = unsafe { libc::mprotect(p.add(PAGE).cast(), PAGE, second) };
            assert_eq!(protected, 0);
            Pages(p)
        }

        fn first_page(&self) -> &[u8] {
            // SAFETY: the first page stays mapped read-write while `self` lives, and
            // nothing writes it concurrently in these tests.
            unsafe { std::slice::from_raw_parts(self.0, PAGE) }
        }
    }

    impl Drop for Pages {
        fn drop(&mut self) {
            // SAFETY: our mapping, unmapped once.
            unsafe { libc::munmap(self.0.cast(), 2 * PAGE) };
        }
    }

    #[test]
    fn a_copy_into_a_prot_none_page_faults_and_writes_only_the_mapped_bytes() {
        let pages = Pages::new(0xee, libc::PROT_NONE);
        let src = [0x5au8; 64];
        // 32 bytes fit before the PROT_NONE page.
        // SAFETY: the first 32 bytes of the range are our writable page; the rest faults.
        let result = unsafe { copy(pages.0.add(PAGE - 32), src.as_ptr(), 64) };
        assert_eq!(result, Err(Faulted { moved: 32 }));
        let first = pages.first_page();
        assert!(first[..PAGE - 32].iter().all(|&b| b == 0xee));
        assert!(first[PAGE - 32..].iter().all(|&b| b == 0x5a));
    }

    #[test]
    fn a_copy_out_of_a_prot_none_page_faults_and_reads_only_the_mapped_bytes() {
        let pages = Pages::new(0x33, libc::PROT_NONE);
        let mut dst = [0u8; 64];
        // SAFETY: `dst` is ours; the source's first 16 bytes are mapped, the rest faults.
        let result = unsafe { copy(dst.as_mut_ptr(), pages.0.add(PAGE - 16), 64) };
        assert_eq!(result, Err(Faulted { moved: 16 }));
        assert_eq!(dst[..16], [0x33; 16]);
        assert_eq!(dst[16..], [0; 48]);
    }

    #[test]
    fn a_write_to_a_read_only_page_faults_and_a_read_of_it_works() {
        let pages = Pages::new(0x44, libc::PROT_READ);
        let mut out = [0u8; 8];
        // SAFETY: readable memory of ours into a local.
        let read = unsafe { copy(out.as_mut_ptr(), pages.0.add(PAGE + 8), 8) };
        assert_eq!(read, Ok(()));
        assert_eq!(out, [0x44; 8]);
        // SAFETY: the target is read-only: the write faults.
        let wrote = unsafe { copy(pages.0.add(PAGE), [1u8; 8].as_ptr(), 8) };
        assert_eq!(wrote, Err(Faulted { moved: 0 }));
    }

    #[test]
    fn atomics_on_unwritable_words_fault_and_on_mapped_words_work() {
        for protection in [libc::PROT_NONE, libc::PROT_READ] {
            let pages = Pages::new(0, protection);
            // SAFETY: an aligned word of a page that is not writable: the access faults.
            let word = unsafe { pages.0.add(PAGE + 64) }.cast::<u64>();
            // SAFETY: as above.
            let swapped = unsafe { compare_swap(word, 0, 1) };
            assert_eq!(swapped, Err(Faulted { moved: 0 }));
            // SAFETY: as above.
            let added = unsafe { fetch_add(word, 1) };
            assert_eq!(added, Err(Faulted { moved: 0 }));
            // SAFETY: as above (the ATOMIC WRITE store).
            let stored = unsafe { store(word, 1) };
            assert_eq!(stored, Err(Faulted { moved: 0 }));
        }
        let mut value = 5u64;
        // SAFETY: a local aligned word.
        assert_eq!(unsafe { fetch_add(&mut value, 3) }, Ok(5));
        // SAFETY: as above.
        assert_eq!(unsafe { compare_swap(&mut value, 8, 42) }, Ok(8));
        // SAFETY: as above.
        assert_eq!(unsafe { compare_swap(&mut value, 8, 7) }, Ok(42));
        assert_eq!(value, 42);
        // SAFETY: as above.
        assert_eq!(unsafe { store(&mut value, 0x0102_0304_0506_0708) }, Ok(()));
        assert_eq!(value, 0x0102_0304_0506_0708);
    }

    #[test]
    fn copies_move_every_byte_at_any_alignment_and_touch_nothing_else() {
        let src: Vec<u8> = (0..200u8).collect();
        for start in 0..9 {
            for len in [0, 1, 7, 8, 9, 31, 64, 90, 150] {
                let mut region = vec![0xeeu8; 180];
                // SAFETY: both ranges are inside live vectors of this test.
                let r = unsafe { copy(region.as_mut_ptr().add(start), src.as_ptr(), len) };
                assert_eq!(r, Ok(()));
                assert_eq!(&region[start..start + len], &src[..len]);
                assert!(region[..start].iter().all(|&b| b == 0xee));
                assert!(region[start + len..].iter().all(|&b| b == 0xee));
            }
        }
    }

    /// A fault outside our routines keeps its meaning: with our handler installed, a
    /// plain store to a PROT_NONE page still kills the process with SIGSEGV (checked in a
    /// forked child, bounded wait).
    #[test]
    fn a_fault_outside_the_guarded_routines_still_kills_with_sigsegv() {
        ensure_installed();
        let pages = Pages::new(0, libc::PROT_NONE);
        let target = pages.0 as usize + PAGE;
        // SAFETY: the child only stores (the fault) and calls _exit; no locks, no
        // allocation (async-signal-safe after fork in a threaded process).
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork");
        if child == 0 {
            // SAFETY: deliberately faulting store in the child.
            unsafe {
                std::ptr::write_volatile(target as *mut u8, 1);
                libc::_exit(0);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut status = 0;
        loop {
            // SAFETY: waiting for our own child.
            let r = unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) };
            if r == child {
                break;
            }
            if Instant::now() > deadline {
                // SAFETY: our own child.
                unsafe { libc::kill(child, libc::SIGKILL) };
                panic!("the child neither died nor exited");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSEGV,
            "status {status:#x}: expected death by SIGSEGV"
        );
    }

    /// SIGBUS (an access past the end of a shared file mapping) is recovered too.
    #[test]
    fn a_read_past_the_end_of_a_file_mapping_faults_with_sigbus_and_is_recovered() {
        // SAFETY: a fresh anonymous memory file.
        let fd = unsafe { libc::memfd_create(c"softverbs-sigbus".as_ptr(), 0) };
        assert!(fd >= 0);
        // SAFETY: our fd.
        assert_eq!(unsafe { libc::ftruncate(fd, PAGE as libc::off_t) }, 0);
        // SAFETY: a shared mapping of two pages of a one-page file.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let mut out = [0u8; 32];
        // SAFETY: the first 16 bytes are in the file, the rest past its end (SIGBUS).
        let r = unsafe { copy(out.as_mut_ptr(), p.cast::<u8>().add(PAGE - 16), 32) };
        assert_eq!(r, Err(Faulted { moved: 16 }));
        // SAFETY: our mapping and fd.
        unsafe {
            libc::munmap(p, 2 * PAGE);
            libc::close(fd);
        }
    }
}
