//! Parent domains and thread domains (`ibv_alloc_parent_domain(3)`, `ibv_alloc_td(3)`).
//!
//! A [`ParentDomain`] stands for its [`Pd`] (it dereferences to it, so it is usable
//! wherever a PD is: memory regions, QPs, SRQs, address handles are the PD's) and may carry
//! the application's [`RingAllocator`]: a CQ made by [`ParentDomain::cq_builder`] takes its
//! ring from it (the completion slots, and the extra-field array if asked for), resizes
//! through it, and gives the memory back when the CQ is dropped. Only CQ rings go through
//! the allocator: a QP's work requests live inside the device's engine, not in a buffer the
//! application could provide. The device counts the parent domain as a user of its PD.
//!
//! A [`ThreadDomain`] is `!Send` and `!Sync`: a CQ made in it ([`ParentDomain::td_cq`]) is
//! a [`TdCq`], polled through `&mut self` with no consumer lock (the lock-free paths of
//! [`LocalCq`]), and it cannot leave the thread — the promise `ibv_alloc_td(3)` asks of a C
//! program ("objects created under this thread domain will disable internal locking") is
//! here a type. The producer side (the device's progress thread) keeps its lock.

use crate::context::Context;
use crate::cq::{CqBuilder, LocalCq};
use crate::error::Error;
use crate::pd::Pd;
use softverbs_cq::{PollError, SharedRingAllocator, WorkCompletion};
use std::rc::Rc;

pub use softverbs_cq::{RingAllocator, RingLayout, RingMemory, RingResource};

/// A parent domain (`ibv_alloc_parent_domain(3)`): a [`Pd`] with an optional allocator for
/// CQ rings.
///
/// ```
/// use softverbs::{Context, DeviceConfig, RingAllocator, RingLayout, RingMemory};
/// use std::ptr::NonNull;
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
///
/// /// Counts its calls; memory from the global allocator.
/// #[derive(Default)]
/// struct Counting(AtomicUsize, AtomicUsize);
/// // SAFETY: fresh `std::alloc` blocks of the asked layout, freed once in `release`.
/// unsafe impl RingAllocator for Counting {
///     fn allocate(&self, l: RingLayout) -> RingMemory {
///         self.0.fetch_add(1, Ordering::Relaxed);
///         let layout = std::alloc::Layout::from_size_align(l.size, l.align).unwrap();
///         // SAFETY: never zero-sized.
///         NonNull::new(unsafe { std::alloc::alloc(layout) }).map_or(RingMemory::Refused, RingMemory::Provided)
///     }
///     unsafe fn release(&self, ptr: NonNull<u8>, l: RingLayout) {
///         self.1.fetch_add(1, Ordering::Relaxed);
///         let layout = std::alloc::Layout::from_size_align(l.size, l.align).unwrap();
///         // SAFETY: allocated above with this layout.
///         unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) }
///     }
/// }
///
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let counting = Arc::new(Counting::default());
/// let domain = ctx.alloc_pd().parent_domain(Some(counting.clone()))?;
/// let cq = domain.cq_builder(16).build()?;
/// assert_eq!(counting.0.load(Ordering::Relaxed), 1);
/// let _mr = domain.reg_mr(4096, softverbs::AccessFlags::LOCAL_WRITE)?; // usable as a PD
/// drop(cq);
/// assert_eq!(counting.1.load(Ordering::Relaxed), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ParentDomain {
    pd: Pd,
    allocator: Option<SharedRingAllocator>,
}

impl std::fmt::Debug for ParentDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParentDomain")
            .field("pd", &self.pd)
            .field("allocator", &self.allocator.is_some())
            .finish()
    }
}

impl Drop for ParentDomain {
    fn drop(&mut self) {
        self.pd
            .context()
            .inner
            .device
            .dealloc_parent_domain(self.pd.handle());
    }
}

impl std::ops::Deref for ParentDomain {
    type Target = Pd;

    fn deref(&self) -> &Pd {
        &self.pd
    }
}

impl Pd {
    /// A parent domain over this PD (`ibv_alloc_parent_domain(3)`), whose CQs take their
    /// rings from `allocator` (`None`: the default allocation, as
    /// `IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS` left out).
    pub fn parent_domain(
        &self,
        allocator: Option<SharedRingAllocator>,
    ) -> Result<ParentDomain, Error> {
        self.context()
            .inner
            .device
            .alloc_parent_domain(self.handle())?;
        Ok(ParentDomain {
            pd: self.clone(),
            allocator,
        })
    }
}

impl ParentDomain {
    /// A CQ builder whose ring comes from the parent domain's allocator
    /// (`ibv_create_cq_ex(3)` with `IBV_CQ_INIT_ATTR_MASK_PD`).
    pub fn cq_builder(&self, cqe: u32) -> CqBuilder {
        let builder = self.pd.context().cq_builder(cqe);
        match &self.allocator {
            Some(allocator) => builder.ring_allocator(allocator.clone()),
            None => builder,
        }
    }

    /// A CQ in this parent domain and the thread domain `td`: polled without a consumer
    /// lock, bound to the thread ([`TdCq`] is `!Send`).
    pub fn td_cq(&self, td: &ThreadDomain, cqe: u32) -> Result<TdCq, Error> {
        if !td.ctx.same(self.pd.context()) {
            return Err(Error::ForeignObject {
                object: softverbs_proto::Object::Pd,
            });
        }
        Ok(TdCq {
            cq: self.cq_builder(cqe).build_single_threaded()?,
            _td: td.bound.clone(),
        })
    }
}

/// A thread domain (`ibv_alloc_td(3)`): `!Send` and `!Sync`, so what is made in it stays on
/// this thread.
///
/// ```compile_fail
/// fn send<T: Send>(_: T) {}
/// let ctx = softverbs::Context::open_with(softverbs::DeviceConfig::in_process()).unwrap();
/// send(ctx.alloc_td());
/// ```
#[derive(Clone, Debug)]
pub struct ThreadDomain {
    ctx: Context,
    /// `Rc`: not `Send`, not `Sync`; shared by the objects made in it.
    bound: Rc<()>,
}

impl Context {
    /// Allocates a thread domain (`ibv_alloc_td(3)`).
    pub fn alloc_td(&self) -> ThreadDomain {
        ThreadDomain {
            ctx: self.clone(),
            bound: Rc::new(()),
        }
    }
}

/// A CQ in a thread domain: [`LocalCq`]'s lock-free polling, and `!Send`.
///
/// ```
/// use softverbs::{Context, DeviceConfig, WorkCompletion};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let td = ctx.alloc_td();
/// let domain = ctx.alloc_pd().parent_domain(None)?;
/// let mut cq = domain.td_cq(&td, 8)?;
/// assert_eq!(cq.poll(&mut [WorkCompletion::default(); 4])?, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// It cannot be sent to another thread:
///
/// ```compile_fail
/// fn send<T: Send>(_: T) {}
/// let ctx = softverbs::Context::open_with(softverbs::DeviceConfig::in_process()).unwrap();
/// let td = ctx.alloc_td();
/// let domain = ctx.alloc_pd().parent_domain(None).unwrap();
/// send(domain.td_cq(&td, 8).unwrap());
/// ```
#[derive(Debug)]
pub struct TdCq {
    cq: LocalCq,
    _td: Rc<()>,
}

impl TdCq {
    /// Polls with no lock ([`LocalCq::poll`]).
    pub fn poll(&mut self, wcs: &mut [WorkCompletion]) -> Result<usize, PollError> {
        self.cq.poll(wcs)
    }

    /// The CQ, for what [`LocalCq`] offers (resize, extended polling, completing QPs into).
    pub fn local(&mut self) -> &mut LocalCq {
        &mut self.cq
    }

    /// The CQ by shared reference (for a QP builder).
    pub fn as_local(&self) -> &LocalCq {
        &self.cq
    }
}
