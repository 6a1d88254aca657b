//! Shared receive queues (`ibv_create_srq(3)`, `ibv_modify_srq(3)`,
//! `ibv_post_srq_recv(3)`, `ibv_destroy_srq(3)`).

use crate::error::Error;
use crate::pd::Pd;
use crate::wr::RecvRequest;
use softverbs_proto::{Object, VerbsError};
use softverbs_proto::{SrqId, SrqInit};
use std::sync::Arc;

pub(crate) struct SrqInner {
    pub(crate) pd: Pd,
    pub(crate) id: SrqId,
    live: bool,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        if self.live {
            let _ = self.pd.inner.ctx.inner.device.destroy_srq(self.id);
        }
    }
}

/// A shared receive queue (`struct ibv_srq`). QPs created with it
/// ([`QpBuilder::srq`](crate::QpBuilder::srq)) hold it, so it outlives them.
///
/// ```
/// use softverbs::{AccessFlags, Context, DeviceConfig, RecvRequest, SrqInit};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let pd = ctx.alloc_pd();
/// let srq = pd.create_srq(SrqInit { max_wr: 16, ..SrqInit::default() })?;
/// let mr = pd.reg_mr(1024, AccessFlags::LOCAL_WRITE)?;
/// srq.post_recv(RecvRequest::new(1, &[mr.slice(..)?]))?;
/// srq.arm_limit(1)?;
/// assert!(pd.create_srq(SrqInit { max_wr: 0, ..SrqInit::default() }).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Srq {
    pub(crate) inner: Arc<SrqInner>,
}

impl std::fmt::Debug for Srq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Srq").field(&self.inner.id).finish()
    }
}

impl Srq {
    /// The SRQ's handle inside the device (named by `SrqLimitReached` events).
    pub fn id(&self) -> SrqId {
        self.inner.id
    }

    /// The protection domain it belongs to.
    pub fn pd(&self) -> &Pd {
        &self.inner.pd
    }

    /// Posts a receive (`ibv_post_srq_recv(3)`).
    pub fn post_recv(&self, wr: RecvRequest) -> Result<(), Error> {
        Ok(self
            .inner
            .pd
            .inner
            .ctx
            .inner
            .device
            .post_srq_recv(self.inner.id, wr.wr)?)
    }

    /// Arms the limit event (`ibv_modify_srq(3)` with `IBV_SRQ_LIMIT`): when fewer than
    /// `limit` receives remain, `SrqLimitReached` is raised once (0 disarms).
    pub fn arm_limit(&self, limit: u32) -> Result<(), Error> {
        Ok(self
            .inner
            .pd
            .inner
            .ctx
            .inner
            .device
            .arm_srq_limit(self.inner.id, limit)?)
    }

    /// Destroys the SRQ (`ibv_destroy_srq(3)`), refused (handed back) while a QP or another
    /// handle holds it.
    pub fn destroy(self) -> Result<(), (Srq, Error)> {
        match Arc::try_unwrap(self.inner) {
            Err(inner) => {
                let holders = Arc::strong_count(&inner) - 1;
                let in_use = VerbsError::InUse {
                    object: Object::Srq,
                    by: Object::Qp,
                    count: u32::try_from(holders).unwrap_or(u32::MAX),
                };
                Err((Srq { inner }, in_use.into()))
            }
            Ok(mut inner) => match inner.pd.inner.ctx.inner.device.destroy_srq(inner.id) {
                Ok(()) => {
                    inner.live = false;
                    Ok(())
                }
                Err(e) => Err((
                    Srq {
                        inner: Arc::new(inner),
                    },
                    e.into(),
                )),
            },
        }
    }
}

impl Pd {
    /// Creates a shared receive queue (`ibv_create_srq(3)`).
    pub fn create_srq(&self, init: SrqInit) -> Result<Srq, Error> {
        let id = self
            .inner
            .ctx
            .inner
            .device
            .create_srq(self.inner.handle, init)?;
        Ok(Srq {
            inner: Arc::new(SrqInner {
                pd: self.clone(),
                id,
                live: true,
            }),
        })
    }
}
