//! Protection domains (`ibv_alloc_pd(3)`): the parent of memory regions, queue pairs,
//! shared receive queues and address handles.

use crate::context::Context;
use std::sync::Arc;

pub(crate) struct PdInner {
    pub(crate) ctx: Context,
    pub(crate) handle: u32,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        // Every object in the PD holds a `Pd` and destroys its device object before
        // letting it go, so the device's rule (`ibv_dealloc_pd(3)`: refused while an
        // object is in the PD) always lets it go here; were it to refuse, the PD number
        // would only stay allocated.
        let _ = self.ctx.inner.device.dealloc_pd(self.handle);
    }
}

/// A protection domain (`struct ibv_pd`). Cloning gives another handle to the same PD;
/// every object created in it holds one, so it lives as long as they do
/// (`ibv_dealloc_pd(3)` "fails if any other resource is still associated": here it
/// simply cannot happen).
///
/// ```
/// use softverbs::{AccessFlags, Context, DeviceConfig};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let pd = ctx.alloc_pd();
/// let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE)?;
/// assert_eq!(mr.len(), 4096);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Pd {
    pub(crate) inner: Arc<PdInner>,
}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pd")
            .field("handle", &self.inner.handle)
            .finish()
    }
}

impl Pd {
    pub(crate) fn new(ctx: Context) -> Pd {
        let handle = ctx.inner.device.alloc_pd();
        Pd {
            inner: Arc::new(PdInner { ctx, handle }),
        }
    }

    /// The context the PD belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// The PD's handle (`pd->handle`).
    pub fn handle(&self) -> u32 {
        self.inner.handle
    }
}

impl Context {
    /// Allocates a protection domain (`ibv_alloc_pd(3)`).
    pub fn alloc_pd(&self) -> Pd {
        Pd::new(self.clone())
    }
}
