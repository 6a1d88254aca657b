//! The synchronisation primitives the CQ is built from, switchable to loom.
//!
//! Under `--cfg loom` every atomic, lock and thread comes from loom so that the models in
//! `tests/loom.rs` explore every interleaving the C11 memory model allows; otherwise from
//! `std`. The asymmetric barrier pair ([`light_barrier`] on the hot path of a biased lock's
//! owner, [`heavy_barrier`] on the rare revocation of the bias, `cq/biased_lock.rs`) is what
//! lets the thread that keeps taking a CQ's lock enter it without a locked instruction:
//!
//! - With `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` available, the light side is a
//!   compiler fence and the heavy side is the syscall, which runs a full memory barrier on
//!   every CPU running a thread of this process. Together they order like a pair of
//!   `SeqCst` fences (the scheme of Linux `sys_membarrier` users and folly's asymmetric
//!   fences).
//! - Without it (older kernels, sandboxes) no bias is granted and neither side runs; under
//!   Miri and loom both sides are `SeqCst` fences.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU64, AtomicU8, AtomicUsize,
};
#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU64, AtomicU8, AtomicUsize,
};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};

pub(crate) use std::sync::atomic::Ordering;

/// One iteration of a spin-wait (a scheduling point under loom).
#[inline(always)]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

/// Spins while `busy()` holds, giving the core away every 1024 rounds (the holder may be
/// inside for a while, or preempted).
#[inline]
pub(crate) fn spin_while(mut busy: impl FnMut() -> bool) {
    let mut spins = 0u32;
    while busy() {
        spin_hint();
        spins += 1;
        if spins > 1 << 10 {
            #[cfg(not(loom))]
            std::thread::yield_now();
            spins = 0;
        }
    }
}

/// Locks a mutex, treating poisoning as recovered: every critical section in this crate
/// leaves its data consistent at each step, so a panic elsewhere cannot corrupt it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(loom)]
    {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }
    #[cfg(not(loom))]
    {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Where the process stands with its registration for private expedited `membarrier`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Barriers {
    /// Registered: the heavy side is the system call, a bias may be granted.
    Ready,
    /// Being registered on a thread of its own: no bias yet.
    Pending,
    /// Not to be had (older kernels, sandboxes): no bias ever.
    Unavailable,
}

/// The process's registration for private expedited `membarrier`, made once, on a thread of
/// its own. Registering a process that already runs other threads waits for an RCU grace
/// period in the kernel (14 ms measured on the benchmark VMs): made by the first CQ's
/// creation itself, it was most of the time `rdma_create_qp` took (15-20 ms). Until it is
/// done, CQs lock as they do without `membarrier` (no bias), correct and a little slower;
/// a lock's grant looks again ([`Registration::state`]).
pub(crate) struct Registration {
    /// Process-wide, outside the models (loom and Miri never register): `std`'s atomic.
    state: std::sync::atomic::AtomicU8,
    register: fn() -> bool,
}

const UNKNOWN: u8 = 0;
const REGISTERING: u8 = 1;
const AVAILABLE: u8 = 2;
const UNAVAILABLE: u8 = 3;

impl Registration {
    /// A registration that `register` makes (true: done and usable).
    pub(crate) const fn new(register: fn() -> bool) -> Self {
        Registration {
            state: std::sync::atomic::AtomicU8::new(UNKNOWN),
            register,
        }
    }

    /// Starts the registration unless started, and says where it stands. Where no thread
    /// can be started, it registers on this one.
    pub(crate) fn start(&'static self) -> Barriers {
        if self
            .state
            .compare_exchange(UNKNOWN, REGISTERING, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            let register = move || self.finish((self.register)());
            let spawned = std::thread::Builder::new()
                .name("softverbs-membarrier".into())
                .spawn(register);
            if spawned.is_err() {
                self.finish((self.register)());
            }
        }
        self.state()
    }

    fn finish(&self, ok: bool) {
        // Release: a lock that reads `AVAILABLE` (Acquire) sees the registration done.
        self.state
            .store(if ok { AVAILABLE } else { UNAVAILABLE }, Ordering::Release);
    }

    /// Where the registration stands.
    pub(crate) fn state(&self) -> Barriers {
        match self.state.load(Ordering::Acquire) {
            AVAILABLE => Barriers::Ready,
            UNAVAILABLE => Barriers::Unavailable,
            _ => Barriers::Pending,
        }
    }
}

/// Registers this process for private expedited `membarrier` and checks the barrier runs.
#[cfg(not(any(loom, miri)))]
fn register_membarrier() -> bool {
    use rustix::thread::{membarrier, MembarrierCommand};
    membarrier(MembarrierCommand::RegisterPrivateExpedited).is_ok()
        && membarrier(MembarrierCommand::PrivateExpedited).is_ok()
}

/// Under loom and Miri both halves are `SeqCst` fences: nothing to register.
#[cfg(any(loom, miri))]
fn register_membarrier() -> bool {
    true
}

/// The process's registration.
pub(crate) static BARRIERS: Registration = Registration::new(register_membarrier);

/// Waits, at most `timeout`, for the process's registration for `membarrier`, which the
/// first CQ made starts on a thread of its own (a CQ's locks grant their bias only once it is
/// done); true if it is done and usable. For measurements of the steady state (benchmarks,
/// instruction counts); a CQ is correct without it.
pub fn await_membarrier(timeout: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match init_barriers() {
            Barriers::Ready => return true,
            Barriers::Unavailable => return false,
            Barriers::Pending if std::time::Instant::now() >= deadline => return false,
            Barriers::Pending => std::thread::sleep(std::time::Duration::from_micros(200)),
        }
    }
}

/// Prepares the asymmetric barrier: starts the registration for membarrier (on a thread
/// of its own, [`Registration`]). Called when a CQ is created. Returns where it stands: a
/// CQ's locks grant a bias (whose owner runs [`light_barrier`], a compiler fence) only once
/// it is [`Barriers::Ready`], and never where it is unavailable. Under loom and Miri, ready
/// at once.
pub(crate) fn init_barriers() -> Barriers {
    #[cfg(not(any(loom, miri)))]
    {
        BARRIERS.start()
    }
    #[cfg(any(loom, miri))]
    {
        Barriers::Ready
    }
}

/// The fast half of the asymmetric barrier: orders the caller's earlier store before its
/// later load, against [`heavy_barrier`]. A compiler fence: only a biased lock's owner
/// runs it, and a bias is granted only where [`init_barriers`] found `membarrier` (or a
/// model runs, where it is a `SeqCst` fence).
#[inline(always)]
pub(crate) fn light_barrier() {
    #[cfg(not(any(loom, miri)))]
    std::sync::atomic::compiler_fence(Ordering::SeqCst);
    #[cfg(any(loom, miri))]
    fence(Ordering::SeqCst);
}

/// The slow half of the asymmetric barrier: orders the caller's earlier store before its
/// later load, against [`light_barrier`]. A `membarrier` system call: an interrupt to every
/// CPU running a thread of the process (15 us on the benchmark VMs when another thread
/// runs), so only for what happens once in a CQ's life.
pub(crate) fn heavy_barrier() {
    #[cfg(not(any(loom, miri)))]
    {
        use rustix::thread::{membarrier, MembarrierCommand};
        // Only a revocation runs it, after a grant, i.e. once the registration is done.
        if BARRIERS.state() != Barriers::Ready
            || membarrier(MembarrierCommand::PrivateExpedited).is_err()
        {
            fence(Ordering::SeqCst);
        }
    }
    #[cfg(any(loom, miri))]
    fence(Ordering::SeqCst);
}

/// A test-and-test-and-set spin lock whose release is a plain store, so a producer that
/// holds it over a burst of pushes issues one locked instruction per burst (the producer
/// lock, `cq/biased_lock.rs`, builds its bias on it).
#[derive(Debug, Default)]
pub(crate) struct SpinLock {
    locked: AtomicBool,
}

impl SpinLock {
    pub(crate) fn new() -> Self {
        SpinLock {
            locked: AtomicBool::new(false),
        }
    }

    /// Acquires. `Acquire` on success: everything the previous holder wrote before
    /// `unlock` is visible.
    #[inline]
    pub(crate) fn lock(&self) {
        loop {
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
            spin_while(|| self.locked.load(Ordering::Relaxed));
        }
    }

    /// Releases. `Release`: publishes the holder's writes to the next holder.
    #[inline]
    pub(crate) fn unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }
}

/// The source of [`thread_token`]s: every thread that asks gets the next number, so a token
/// is never reused, not even after its thread exits. A `std` atomic under loom too: it only
/// hands out distinct numbers, which is not part of what the models explore.
static NEXT_THREAD_TOKEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

#[cfg(not(loom))]
std::thread_local! {
    static THREAD_TOKEN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}
#[cfg(loom)]
loom::thread_local! {
    static THREAD_TOKEN: std::cell::Cell<u64> = std::cell::Cell::new(0);
}

/// A number naming the calling thread, nonzero and never given to another thread (the
/// biased locks, `cq/biased_lock.rs`, names its owner by it). Assigned on a
/// thread's first call; afterwards one thread-local load.
#[inline(always)]
pub(crate) fn thread_token() -> u64 {
    THREAD_TOKEN.with(|token| {
        let known = token.get();
        if known != 0 {
            return known;
        }
        // Relaxed: only uniqueness matters, which the RMW gives in any ordering.
        let fresh = NEXT_THREAD_TOKEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        token.set(fresh);
        fresh
    })
}

/// The calling thread's [`thread_token`] if it has been assigned one, else 0 (never a
/// token): one thread-local load, for a fast path that only compares it with a stored token.
#[inline(always)]
pub(crate) fn assigned_thread_token() -> u64 {
    THREAD_TOKEN.with(|token| token.get())
}
