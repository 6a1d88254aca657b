//! Parent domains and thread domains in the safe API (`ibv_alloc_parent_domain(3)`,
//! `ibv_alloc_td(3)`, `ibv_create_cq_ex(3)`'s `parent_domain`): a CQ's ring from the
//! application's allocator (counted: create, resize, release on drop), the default
//! allocation (`IBV_ALLOCATOR_USE_DEFAULT`), a refusal (`ENOMEM`), and a thread domain's
//! lock-free CQ. That a thread-domain CQ is not `Send` is a compile-fail doc test on
//! `TdCq`.

use softverbs::{
    Context, DeviceConfig, RingAllocator, RingLayout, RingMemory, RingResource, WorkCompletion,
};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Counts its calls and answers as told (0: memory, 1: use default, 2: refuse).
#[derive(Default)]
struct Counting {
    allocations: AtomicUsize,
    releases: AtomicUsize,
    answer: AtomicUsize,
    slot_bytes: AtomicUsize,
}

// SAFETY: `Provided` memory is a fresh `std::alloc` block of the asked layout, freed once in
// `release`.
unsafe impl RingAllocator for Counting {
    fn allocate(&self, layout: RingLayout) -> RingMemory {
        self.allocations.fetch_add(1, Ordering::Relaxed);
        match self.answer.load(Ordering::Relaxed) {
            1 => return RingMemory::UseDefault,
            2 => return RingMemory::Refused,
            _ => {}
        }
        if layout.resource == RingResource::Slots {
            self.slot_bytes.store(layout.size, Ordering::Relaxed);
        }
        let heap = std::alloc::Layout::from_size_align(layout.size, layout.align).unwrap();
        // SAFETY: the ring never asks for zero bytes.
        NonNull::new(unsafe { std::alloc::alloc(heap) })
            .map_or(RingMemory::Refused, RingMemory::Provided)
    }

    unsafe fn release(&self, ptr: NonNull<u8>, layout: RingLayout) {
        self.releases.fetch_add(1, Ordering::Relaxed);
        let heap = std::alloc::Layout::from_size_align(layout.size, layout.align).unwrap();
        // SAFETY: allocated in `allocate` with this layout, released once.
        unsafe { std::alloc::dealloc(ptr.as_ptr(), heap) };
    }
}

fn context() -> Context {
    Context::open_with(DeviceConfig::in_process()).unwrap()
}

#[test]
fn a_parent_domain_cq_takes_its_ring_and_its_resized_ring_from_the_allocator() {
    // ibv_alloc_parent_domain(3): the provider uses the application's allocator for its
    // resources, and frees through it.
    let ctx = context();
    let counting = Arc::new(Counting::default());
    let domain = ctx
        .alloc_pd()
        .parent_domain(Some(counting.clone()))
        .unwrap();
    let cq = domain.cq_builder(8).build().unwrap();
    assert_eq!(counting.allocations.load(Ordering::Relaxed), 1);
    assert_eq!(
        counting.slot_bytes.load(Ordering::Relaxed),
        64 * cq.capacity() as usize
    );
    cq.resize(32).unwrap();
    assert_eq!(counting.allocations.load(Ordering::Relaxed), 2);
    assert_eq!(counting.releases.load(Ordering::Relaxed), 0);
    let mut wcs = [WorkCompletion::default(); 2];
    assert_eq!(cq.poll(&mut wcs).unwrap(), 0);
    drop(cq);
    assert_eq!(counting.releases.load(Ordering::Relaxed), 2);
}

#[test]
fn use_default_is_never_released_and_a_refusal_is_enomem() {
    // IBV_ALLOCATOR_USE_DEFAULT: the default allocation, no free; NULL: creation fails.
    let ctx = context();
    let counting = Arc::new(Counting::default());
    counting.answer.store(1, Ordering::Relaxed);
    let domain = ctx
        .alloc_pd()
        .parent_domain(Some(counting.clone()))
        .unwrap();
    drop(domain.cq_builder(4).build().unwrap());
    assert_eq!(counting.allocations.load(Ordering::Relaxed), 1);
    assert_eq!(counting.releases.load(Ordering::Relaxed), 0);
    counting.answer.store(2, Ordering::Relaxed);
    let err = domain.cq_builder(4).build().unwrap_err();
    assert_eq!(err.errno(), libc::ENOMEM);
}

#[test]
fn a_parent_domain_stands_for_its_pd_wherever_a_pd_is_used() {
    // ibv_alloc_parent_domain(3): the parent domain can be used wherever a PD is; its
    // objects are the PD's.
    let ctx = context();
    let pd = ctx.alloc_pd();
    let domain = pd.parent_domain(None).unwrap();
    assert_eq!(domain.handle(), pd.handle());
    let mr = domain
        .reg_mr(4096, softverbs::AccessFlags::LOCAL_WRITE)
        .unwrap();
    assert_eq!(mr.len(), 4096);
}

#[test]
fn a_thread_domain_cq_polls_without_a_lock() {
    // ibv_alloc_td(3): objects under a thread domain disable internal locking; here the
    // CQ is polled through `&mut` and stays on its thread.
    let ctx = context();
    let td = ctx.alloc_td();
    let counting = Arc::new(Counting::default());
    let domain = ctx
        .alloc_pd()
        .parent_domain(Some(counting.clone()))
        .unwrap();
    let mut cq = domain.td_cq(&td, 4).unwrap();
    assert_eq!(cq.poll(&mut [WorkCompletion::default(); 4]).unwrap(), 0);
    assert_eq!(cq.local().resize(16).unwrap(), 16);
    assert_eq!(counting.allocations.load(Ordering::Relaxed), 2);
    drop(cq);
    assert_eq!(counting.releases.load(Ordering::Relaxed), 2);
    let other = Context::open_with(DeviceConfig::in_process()).unwrap();
    assert!(domain.td_cq(&other.alloc_td(), 4).is_err());
}
