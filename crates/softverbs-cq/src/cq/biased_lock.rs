//! A spin lock biased towards the thread that keeps taking it: the producer lock (the
//! device's progress thread pushes) and the thread-safe CQ's consumer lock (one thread
//! usually polls).
//!
//! Under a plain spin lock every acquisition pays a locked instruction, and on x86 a locked
//! instruction first waits for the store buffer to drain: the previous push's slot stores,
//! or the previous poll's head store, must reach a cache line the other side's core is
//! reading, one cross-core transfer per acquisition before the next can start. After
//! [`STREAK`] acquisitions in a row by one thread the lock is granted to it, and from then on
//! that thread enters with plain stores:
//!
//! - the owner enters: `busy = 1`, the light half of the asymmetric barrier (`sync.rs`),
//!   re-read `owner`; still its own token: it is inside. It leaves with `busy = 0`
//!   (`Release`).
//! - anyone else (another thread, or the owner already inside) takes the spin lock and, if
//!   there is an owner, revokes the bias: `owner = NO_OWNER`, the heavy half of the barrier,
//!   then waits for `busy == 0` (`Acquire`).
//!
//! The barrier pair orders like two `SeqCst` fences, so of the owner's re-read and the
//! revoker's read of `busy`, at least one sees the other's store: either the owner sees the
//! revocation (it clears `busy` and queues on the spin lock the revoker holds), or the
//! revoker sees the owner inside and waits, and `busy`'s `Release`/`Acquire` puts the
//! owner's critical section before its own. Everything else is ordered by the spin lock:
//! the grant (made while holding it) and the owner's earlier sections by the lock it took,
//! the revoker's successors by the lock it releases.
//!
//! One grant per lock: once revoked, the lock stays a plain spin lock for good, so an old
//! owner's late `busy = 0` can never clear a newer owner's flag. Threads that take turns pay
//! one heavy barrier (one `membarrier` system call) in the CQ's life and then the plain
//! lock's cost, as before the bias existed. Without `membarrier` (old kernels, some
//! sandboxes) no bias is granted: the light half would be a full fence there, which costs
//! what the locked instruction does, so the owner's path may take the light half as the
//! compiler fence it is wherever a bias exists. The process registers for `membarrier` on a
//! thread of its own when its first CQ is made (`sync.rs`: it can take an RCU grace period),
//! and a lock grants no bias before that is done. Under loom and Miri (where the light half is
//! always a `SeqCst` fence) the bias is granted after one acquisition, so that the models
//! explore grants and revocations.
//!
//! Like the spin lock it is built on, it is not reentrant: a thread that acquires it while
//! inside waits for itself for ever.

use crate::sync::{
    assigned_thread_token, heavy_barrier, light_barrier, spin_while, thread_token, Barriers,
    Registration, BARRIERS,
};
use crate::sync::{AtomicBool, AtomicU64, Ordering, SpinLock};

/// `owner` when no thread holds the bias: never a thread token (they count up from 1), nor
/// the 0 of a thread without one, so the owner test is one comparison.
const NO_OWNER: u64 = u64::MAX;
/// Acquisitions in a row by one thread (through the spin lock) before it is granted the
/// bias. One under loom and Miri, so that the models reach the biased path.
const STREAK: u64 = if cfg!(any(loom, miri)) { 1 } else { 64 };

/// How an acquisition got in, for [`BiasedLock::release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Hold {
    /// As the owner of the bias (`busy` set), without the spin lock.
    Biased,
    /// Through the spin lock.
    Locked,
}

/// The biased lock (see the module doc).
pub(super) struct BiasedLock {
    lock: SpinLock,
    /// The owner's thread token, or [`NO_OWNER`]. Written only by the holder of `lock` (the
    /// grant, the revocation); read `Relaxed` by the owner's fast path, which the
    /// barrier pair orders against the revocation (module doc).
    owner: AtomicU64,
    /// The owner is inside. Written only by the owner's thread (`Release` when it leaves, so
    /// a revoker that reads `false` with `Acquire` sees its critical section finished).
    busy: AtomicBool,
    /// Whether the bias may still be granted: `membarrier` is there or being registered (or
    /// a model runs) and it has not been granted yet. With `last_holder` and `streak` (the
    /// thread of the last acquisition through `lock` and how many in a row it made),
    /// bookkeeping of the `lock` holder only: `Relaxed`, the spin lock orders them.
    grantable: AtomicBool,
    /// The registration a grant waits for ([`Registration`]): the process's.
    barriers: &'static Registration,
    last_holder: AtomicU64,
    streak: AtomicU64,
}

impl std::fmt::Debug for BiasedLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BiasedLock")
            .field("owner", &self.owner.load(Ordering::Relaxed))
            .finish()
    }
}

impl BiasedLock {
    /// A lock as the registration of `membarrier` stands at its creation
    /// ([`crate::sync::init_barriers`]): a bias is granted once it is ready, never where it
    /// is unavailable.
    pub(super) fn new(barriers: Barriers) -> Self {
        Self::waiting_for(barriers, &BARRIERS)
    }

    /// [`BiasedLock::new`] with the registration `registration` (tests).
    fn waiting_for(barriers: Barriers, registration: &'static Registration) -> Self {
        BiasedLock {
            lock: SpinLock::new(),
            owner: AtomicU64::new(NO_OWNER),
            busy: AtomicBool::new(false),
            grantable: AtomicBool::new(barriers != Barriers::Unavailable || cfg!(any(loom, miri))),
            barriers: registration,
            last_holder: AtomicU64::new(NO_OWNER),
            streak: AtomicU64::new(0),
        }
    }

    /// Enters the exclusive section; pass the result to [`Self::release`].
    #[inline(always)]
    pub(super) fn acquire(&self) -> Hold {
        let owner = self.owner.load(Ordering::Relaxed);
        if owner == assigned_thread_token() && !self.busy.load(Ordering::Relaxed) {
            // (Only this thread writes `busy`; `true` would mean it is inside already, and
            // the spin lock's path below then waits for itself, as a nested spin lock did.)
            self.busy.store(true, Ordering::Relaxed);
            // Order the store of `busy` before the re-read of `owner`, against the heavy
            // barrier of `revoke` (module doc). A bias exists only where this is a compiler
            // fence (`membarrier`) or a model's SeqCst fence (`grantable`).
            light_barrier();
            if self.owner.load(Ordering::Relaxed) == owner {
                return Hold::Biased;
            }
            // Revoked meanwhile. `Release`: the revoker that reads this `false` also sees
            // every earlier critical section of this owner finished.
            self.busy.store(false, Ordering::Release);
        }
        self.lock.lock();
        if self.owner.load(Ordering::Relaxed) != NO_OWNER || self.grantable.load(Ordering::Relaxed)
        {
            return self.locked_slow();
        }
        Hold::Locked
    }

    /// Leaves the exclusive section entered by `hold`.
    #[inline(always)]
    pub(super) fn release(&self, hold: Hold) {
        match hold {
            // Release: a revoker's Acquire load of `false` sees the critical section.
            Hold::Biased => self.busy.store(false, Ordering::Release),
            Hold::Locked => self.lock.unlock(),
        }
    }

    /// The spin lock is held and there is a bias to revoke or a streak to count. Returns
    /// how the caller is inside: still through the spin lock, or (its streak complete) as
    /// the new owner, the spin lock released.
    #[inline(never)]
    fn locked_slow(&self) -> Hold {
        if self.owner.load(Ordering::Relaxed) != NO_OWNER {
            // Another thread's bias, or this thread's own whose fast path refused it (it is
            // inside already: the wait below never ends, as a nested spin lock never did).
            self.revoke();
            return Hold::Locked;
        }
        let me = thread_token();
        let streak = if self.last_holder.load(Ordering::Relaxed) == me {
            self.streak.load(Ordering::Relaxed) + 1
        } else {
            self.last_holder.store(me, Ordering::Relaxed);
            1
        };
        self.streak.store(streak, Ordering::Relaxed);
        if streak < STREAK {
            return Hold::Locked;
        }
        // Not before the registration is done (the owner's light barrier is only a compiler
        // fence): looked at again by the next acquisitions of the streak. Models grant at once.
        if !cfg!(any(loom, miri)) {
            match self.barriers.state() {
                Barriers::Ready => {}
                Barriers::Pending => return Hold::Locked,
                Barriers::Unavailable => {
                    self.grantable.store(false, Ordering::Relaxed);
                    return Hold::Locked;
                }
            }
        }
        // The grant, the only one: once it is revoked, `grantable` stays false. This thread
        // stays inside as the owner (`busy` set), so an acquisition nested in this hold waits
        // for itself as it would have on the spin lock, never entering beside it. A revoker
        // reads `owner` and `busy` after taking the spin lock this unlock releases.
        self.grantable.store(false, Ordering::Relaxed);
        self.owner.store(me, Ordering::Relaxed);
        self.busy.store(true, Ordering::Relaxed);
        self.lock.unlock();
        Hold::Biased
    }

    /// Takes the bias away for good; the caller holds the spin lock.
    #[cold]
    fn revoke(&self) {
        self.owner.store(NO_OWNER, Ordering::Relaxed);
        // Order the store of `owner` before the read of `busy`, against the owner's light
        // barrier in `acquire` (module doc).
        heavy_barrier();
        // Acquire: pairs with the owner's Release of `false`; its critical section is over
        // and visible. (The owner may be inside for a while: a burst, an extended-poll
        // batch.)
        spin_while(|| self.busy.load(Ordering::Acquire));
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A lock as a CQ makes it, or `None` where no bias can be granted (no `membarrier`):
    /// the bias tests have nothing to check there.
    fn biasable() -> Option<BiasedLock> {
        // The registration runs on a thread of its own: waited for (bounded).
        crate::sync::await_membarrier(std::time::Duration::from_secs(10))
            .then(|| BiasedLock::new(crate::sync::init_barriers()))
    }

    /// Acquires and releases once, returning how it got in.
    fn take(lock: &BiasedLock) -> Hold {
        let hold = lock.acquire();
        lock.release(hold);
        hold
    }

    #[test]
    fn a_thread_that_keeps_taking_the_lock_is_granted_it_after_its_streak() {
        let Some(lock) = biasable() else { return };
        for i in 1..STREAK {
            assert_eq!(take(&lock), Hold::Locked, "acquisition {i}");
        }
        // The acquisition that completes the streak comes out as the owner; from then on:
        // no locked instruction, no spin lock.
        for _ in 0..3 * STREAK {
            assert_eq!(take(&lock), Hold::Biased);
        }
    }

    #[test]
    fn another_thread_revokes_the_bias_for_good() {
        let Some(lock) = biasable() else { return };
        while take(&lock) != Hold::Biased {}
        std::thread::scope(|s| {
            s.spawn(|| {
                // Takes the spin lock and revokes; then never granted, however long its streak.
                for _ in 0..3 * STREAK {
                    assert_eq!(take(&lock), Hold::Locked);
                }
            });
        });
        for _ in 0..3 * STREAK {
            assert_eq!(take(&lock), Hold::Locked);
        }
    }

    #[test]
    fn a_streak_broken_by_another_thread_starts_again() {
        if STREAK < 2 {
            return;
        }
        let Some(lock) = biasable() else { return };
        for _ in 1..STREAK {
            take(&lock);
        }
        std::thread::scope(|s| {
            s.spawn(|| assert_eq!(take(&lock), Hold::Locked));
        });
        for _ in 1..STREAK {
            assert_eq!(take(&lock), Hold::Locked);
        }
        assert_ne!(take(&lock), Hold::Locked);
    }

    #[test]
    fn the_owner_excludes_a_revoker_while_inside() {
        let Some(lock) = biasable() else { return };
        while take(&lock) != Hold::Biased {}
        let inside = AtomicBool::new(false);
        let hold = lock.acquire();
        assert_eq!(hold, Hold::Biased);
        inside.store(true, Ordering::Relaxed);
        std::thread::scope(|s| {
            let revoker = s.spawn(|| {
                let hold = lock.acquire();
                // The owner left before this acquisition returned.
                let owner_was_inside = inside.load(Ordering::Relaxed);
                lock.release(hold);
                owner_was_inside
            });
            std::thread::sleep(std::time::Duration::from_millis(20));
            inside.store(false, Ordering::Relaxed);
            lock.release(hold);
            assert!(
                !revoker.join().unwrap(),
                "the revoker entered while the owner was inside"
            );
        });
    }

    /// Lets [`slow_registration`] finish.
    static REGISTERED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    /// A registration that takes until the test says (as the kernel's may take an RCU grace
    /// period), then succeeds.
    fn slow_registration() -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !REGISTERED.load(Ordering::Acquire) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        true
    }

    static SLOW: Registration = Registration::new(slow_registration);

    /// A CQ made while the process's registration for `membarrier` is still under way
    /// (it runs on a thread of its own, so that the creation does not wait for it) locks
    /// without a bias until it is done — the owner's light barrier is only a compiler fence,
    /// right only once revocations can run the system call — and is granted its bias then.
    #[test]
    #[cfg(not(miri))]
    fn a_lock_made_while_membarrier_registers_is_granted_its_bias_once_registered() {
        let barriers = SLOW.start();
        assert_eq!(barriers, Barriers::Pending, "the creation did not wait");
        let lock = BiasedLock::waiting_for(barriers, &SLOW);
        for i in 0..3 * STREAK {
            assert_eq!(
                take(&lock),
                Hold::Locked,
                "acquisition {i}, still registering"
            );
        }
        REGISTERED.store(true, Ordering::Release);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while SLOW.state() != Barriers::Ready {
            assert!(
                std::time::Instant::now() < deadline,
                "the registration ended"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // The streak went on meanwhile: the next acquisition is granted the bias.
        assert_eq!(take(&lock), Hold::Biased);
        assert_eq!(take(&lock), Hold::Biased);
    }

    #[test]
    #[cfg(not(miri))]
    fn without_membarrier_no_bias_is_granted() {
        // The owner's path takes the light barrier as a compiler fence, which is only right
        // with membarrier's heavy half.
        let lock = BiasedLock::new(Barriers::Unavailable);
        for _ in 0..3 * STREAK {
            assert_eq!(take(&lock), Hold::Locked);
        }
    }
}
