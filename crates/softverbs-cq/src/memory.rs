//! Where a ring's memory comes from: the Rust heap, or the application's allocator
//! ([`RingAllocator`]), as a CQ created in a parent domain asks (`ibv_alloc_parent_domain(3)`:
//! "the provider will use the application's allocator to allocate and free memory for
//! resources").
//!
//! Two arrays make a ring, each one allocation, each named by a [`RingResource`]:
//! [`RingResource::Slots`], the 64-byte completion slots (the ring proper: a sequence word,
//! the 48-byte `struct ibv_wc` image, the timestamp), and [`RingResource::Extras`], the
//! side array of fields `struct ibv_wc` has no room for (only for a CQ that asked for cvlan,
//! flow tag or tag-matching fields).
//!
//! The memory contract, the one unsafe promise of this crate that is not about concurrency:
//! an allocator that answers [`RingMemory::Provided`] hands over `size` bytes aligned to
//! `align`, readable and writable, that nothing else writes until the crate gives them back
//! with [`RingAllocator::release`] — exactly once, with the same [`RingLayout`], when the
//! CQ's shared state is dropped (a ring replaced by `ibv_resize_cq` is retired with the CQ,
//! not before: a lock-free empty check may still read it). The application may *read* the
//! memory at any time: every field of a slot is an atomic, written with the orderings
//! `ring.rs` describes, so what it reads is a snapshot of whole 64-bit words. The crate
//! writes every slot before use, so the memory's initial contents do not matter.
//!
//! [`RingMemory::UseDefault`] (`IBV_ALLOCATOR_USE_DEFAULT`) makes that array come from the
//! Rust heap, and the allocator is not told when it is freed; [`RingMemory::Refused`] fails
//! creation or resize with [`CreateError::RingMemoryRefused`] (`ENOMEM`); a pointer that
//! is not aligned as asked is handed back through `release` at once and fails with
//! [`CreateError::RingMemoryMisaligned`] (`EINVAL`).

use crate::error::CreateError;
use std::alloc::Layout;
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

/// Which of a ring's arrays an allocation is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RingResource {
    /// The completion slots: 64 bytes each, aligned to 64; slot `i` holds position
    /// `pos` with `pos % capacity == i`: bytes 0..8 its sequence word (`pos + 1` once
    /// complete), 8..56 the completion in `struct ibv_wc`'s layout, 56..64 its timestamp.
    Slots,
    /// The extra fields (cvlan, flow tag, tag-matching info): 24 bytes per slot.
    Extras,
}

/// One allocation request: how many bytes, their alignment, and what they are for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLayout {
    /// Bytes wanted (never 0).
    pub size: usize,
    /// Alignment wanted (a power of two).
    pub align: usize,
    /// What the bytes will hold.
    pub resource: RingResource,
}

/// An allocator's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingMemory {
    /// The memory, under the contract of [`RingAllocator`].
    Provided(NonNull<u8>),
    /// Allocate it the default way (`IBV_ALLOCATOR_USE_DEFAULT`); the allocator is not
    /// asked to free it.
    UseDefault,
    /// No memory (`NULL`): creation or resize fails with `ENOMEM`.
    Refused,
}

/// The application's allocator for ring memory (`ibv_parent_domain_init_attr`'s `alloc`
/// and `free`).
///
/// # Safety
///
/// [`RingMemory::Provided`] from [`RingAllocator::allocate`] must point at `layout.size`
/// bytes, readable and writable, that nothing but the CQ writes until they are handed back
/// with [`RingAllocator::release`]. (A misaligned pointer is refused, not trusted.)
pub unsafe trait RingAllocator: Send + Sync {
    /// Allocates memory for `layout`.
    fn allocate(&self, layout: RingLayout) -> RingMemory;

    /// Takes back memory [`RingAllocator::allocate`] provided.
    ///
    /// # Safety
    ///
    /// `ptr` came from `allocate(layout)` on this allocator as [`RingMemory::Provided`] and
    /// has not been released; nothing uses it after this call.
    unsafe fn release(&self, ptr: NonNull<u8>, layout: RingLayout);
}

/// A shared allocator handle, as [`CqBuilder::allocator`](crate::CqBuilder::allocator) takes it.
pub type SharedRingAllocator = Arc<dyn RingAllocator>;

/// Who frees a [`RingArray`].
enum Owner {
    /// `std::alloc` (no allocator, or [`RingMemory::UseDefault`]).
    Heap,
    /// The application's allocator.
    Allocator(SharedRingAllocator),
}

/// A fixed-length array of `T` in memory from the heap or from a [`RingAllocator`].
pub(crate) struct RingArray<T> {
    ptr: NonNull<T>,
    len: usize,
    /// The layout as the heap knows it (what `new` allocated with, in the heap case).
    heap_layout: Layout,
    layout: RingLayout,
    owner: Owner,
    _owns: PhantomData<T>,
}

// SAFETY: a `RingArray<T>` owns its `T`s like a `Box<[T]>` does; the allocator handle is
// `Send + Sync` by the trait's bound.
unsafe impl<T: Send> Send for RingArray<T> {}
// SAFETY: as above: shared access gives only `&[T]`.
unsafe impl<T: Sync> Sync for RingArray<T> {}

impl<T> RingArray<T> {
    /// `len` (non-zero) elements made by `init`, in memory from `allocator` if there is one.
    pub(crate) fn new(
        len: usize,
        resource: RingResource,
        allocator: Option<&SharedRingAllocator>,
        init: impl Fn() -> T,
    ) -> Result<RingArray<T>, CreateError> {
        let refused = CreateError::RingMemoryRefused { resource };
        let heap_layout = Layout::array::<T>(len).map_err(|_| refused)?;
        if heap_layout.size() == 0 {
            // Only a zero-sized `T` under a test cfg could get here; refuse rather than
            // hand an allocator a zero-byte request.
            return Err(refused);
        }
        let layout = RingLayout {
            size: heap_layout.size(),
            align: heap_layout.align(),
            resource,
        };
        let (base, owner) = match allocator.map(|a| (a, a.allocate(layout))) {
            Some((a, RingMemory::Provided(ptr))) => {
                if ptr.as_ptr().align_offset(layout.align) != 0 {
                    // SAFETY: `ptr` is what `allocate(layout)` just provided, released once.
                    unsafe { a.release(ptr, layout) };
                    return Err(CreateError::RingMemoryMisaligned {
                        resource,
                        align: layout.align,
                    });
                }
                (ptr, Owner::Allocator(a.clone()))
            }
            Some((_, RingMemory::Refused)) => return Err(refused),
            None | Some((_, RingMemory::UseDefault)) => {
                // SAFETY: `heap_layout` has a non-zero size (checked above).
                let raw = unsafe { std::alloc::alloc(heap_layout) };
                match NonNull::new(raw) {
                    Some(ptr) => (ptr, Owner::Heap),
                    None => std::alloc::handle_alloc_error(heap_layout),
                }
            }
        };
        let ptr = base.cast::<T>();
        for i in 0..len {
            // SAFETY: the block holds `len` `T`s, aligned for `T` (the heap's layout, or the
            // allocator's pointer checked against `layout.align` above); `i < len`.
            unsafe { ptr.add(i).write(init()) };
        }
        Ok(RingArray {
            ptr,
            len,
            heap_layout,
            layout,
            owner,
            _owns: PhantomData,
        })
    }
}

impl<T> std::ops::Deref for RingArray<T> {
    type Target = [T];

    #[inline(always)]
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` holds `len` initialised `T`s (written in `new`) until `drop`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for RingArray<T> {
    fn drop(&mut self) {
        // SAFETY: the `len` elements were initialised in `new` and are dropped once, here.
        unsafe {
            std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(
                self.ptr.as_ptr(),
                self.len,
            ))
        };
        let base = self.ptr.cast::<u8>();
        match &self.owner {
            // SAFETY: `base` came from `std::alloc::alloc(self.heap_layout)` in `new`.
            Owner::Heap => unsafe { std::alloc::dealloc(base.as_ptr(), self.heap_layout) },
            // SAFETY: `base` came from `allocate(self.layout)` on this allocator as
            // `Provided` (`new`), and is released once, here.
            Owner::Allocator(a) => unsafe { a.release(base, self.layout) },
        }
    }
}

impl<T> fmt::Debug for RingArray<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingArray")
            .field("len", &self.len)
            .field("layout", &self.layout)
            .field("external", &matches!(self.owner, Owner::Allocator(_)))
            .finish()
    }
}
