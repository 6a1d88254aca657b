//! Memory windows (`ibv_alloc_mw(3)`, `ibv_bind_mw(3)`, `ibv_dealloc_mw(3)`): a remote key
//! onto part of a region, with its own bounds and rights.
//!
//! An [`Mw<'a>`](Mw) borrows, for `'a`, every [`Mr`] it is bound to (a bind takes an
//! [`MrSlice<'a>`]), so a region cannot be dropped — deregistered — while a window that
//! may be bound to it lives; it holds its [`Pd`], which lives as long as it does. Dropping
//! the window frees it (`ibv_dealloc_mw(3)`), which unbinds it.
//!
//! A type 1 window is bound with [`Qp::bind_mw`] (the verb `ibv_bind_mw`), a type 2 window
//! with the work request [`Mw::bind`] posted by [`Qp::post_send`] (`IBV_WR_BIND_MW`) and
//! invalidated with [`SendRequest::local_invalidate`] or a peer's
//! [`SendRequest::send_with_invalidate`]. The rules are the core's
//! ([`check_bind`](softverbs_proto::check_bind)): a refused bind completes with
//! [`WcStatus::MwBindErr`](softverbs_cq::WcStatus::MwBindErr).

use crate::error::Error;
use crate::mr::{Mr, MrSlice, RemoteAddr};
use crate::pd::Pd;
use crate::qp::Qp;
use crate::wr::SendRequest;
use softverbs_proto::{AccessFlags, SendOp, SendWr, SgeList, WindowBind, WindowType};
use std::fmt;
use std::marker::PhantomData;

/// The R_Key after `rkey` with its low 8 bits (the key) incremented (`ibv_inc_rkey`).
pub const fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// A memory window (`struct ibv_mw`), bound only to regions that outlive `'a`.
///
/// ```
/// use softverbs::{AccessFlags, Context, DeviceConfig, WindowType};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let pd = ctx.alloc_pd();
/// let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)?;
/// let mw = pd.alloc_mw(WindowType::Two)?;
/// let bind = mw.bind(1, mr.slice(0..1024)?, AccessFlags::REMOTE_READ);
/// assert_eq!(bind.len(), 0);
/// // drop(mr); // would not compile: `mw` may be bound to it
/// drop(mw);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Mw<'a> {
    pd: Pd,
    handle: u32,
    kind: WindowType,
    bound_to: PhantomData<&'a Mr>,
}

impl fmt::Debug for Mw<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mw")
            .field("handle", &self.handle)
            .field("kind", &self.kind)
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .finish()
    }
}

impl Pd {
    /// Allocates an unbound memory window of `kind` (`ibv_alloc_mw(3)`).
    pub fn alloc_mw<'a>(&self, kind: WindowType) -> Result<Mw<'a>, Error> {
        let (handle, _) = self.inner.ctx.inner.device.alloc_mw(self.handle(), kind)?;
        Ok(Mw {
            pd: self.clone(),
            handle,
            kind,
            bound_to: PhantomData,
        })
    }
}

impl<'a> Mw<'a> {
    /// Its type.
    pub fn kind(&self) -> WindowType {
        self.kind
    }

    /// Its handle (`mw->handle`).
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// The protection domain it was allocated in.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// Its R_Key as the device has it now: binds change the low 8 bits once they have
    /// executed.
    pub fn rkey(&self) -> u32 {
        self.pd
            .inner
            .ctx
            .inner
            .device
            .query_mw(self.handle)
            .map_or(0, |w| w.rkey)
    }

    /// The remote address of `slice`'s first byte through this window, for a peer, with
    /// the window's R_Key now.
    pub fn remote(&self, slice: &MrSlice<'_>) -> RemoteAddr {
        RemoteAddr::new(slice.addr(), self.rkey())
    }

    /// The bind request `IBV_WR_BIND_MW` (`ibv_post_send(3)`) of this window to `slice`,
    /// granting `access` (remote read, write, atomic), asking for the R_Key after the
    /// current one ([`inc_rkey`]). Post it with [`Qp::post_send`]: it completes with
    /// `IBV_WC_BIND_MW`, or `IBV_WC_MW_BIND_ERR` if the core refuses it (a type 1 window,
    /// a bound one, a region without `MW_BIND`, …).
    pub fn bind(&self, wr_id: u64, slice: MrSlice<'a>, access: AccessFlags) -> SendRequest {
        bind_request(
            wr_id,
            self.window_bind(Some(slice), access, WindowType::Two),
        )
    }

    fn window_bind(
        &self,
        slice: Option<MrSlice<'a>>,
        access: AccessFlags,
        verb: WindowType,
    ) -> WindowBind {
        let rkey = self.rkey();
        WindowBind {
            window_rkey: rkey,
            new_rkey: inc_rkey(rkey),
            kind: verb,
            mr_lkey: slice.as_ref().map_or(0, MrSlice::lkey),
            addr: slice.as_ref().map_or(0, MrSlice::addr),
            length: slice.as_ref().map_or(0, |s| u64::from(s.len())),
            access,
        }
    }

    /// Frees the window (`ibv_dealloc_mw(3)`), unbinding it. Dropping does the same,
    /// ignoring the outcome.
    pub fn dealloc(mut self) -> Result<(), Error> {
        self.free()
    }

    fn free(&mut self) -> Result<(), Error> {
        let handle = std::mem::replace(&mut self.handle, 0);
        if handle == 0 {
            return Ok(());
        }
        Ok(self.pd.inner.ctx.inner.device.dealloc_mw(handle)?)
    }
}

fn bind_request(wr_id: u64, bind: WindowBind) -> SendRequest {
    SendRequest {
        wr: SendWr::new(wr_id, SendOp::BindMw(bind), SgeList::new()),
    }
}

impl Drop for Mw<'_> {
    fn drop(&mut self) {
        let _ = self.free();
    }
}

impl SendRequest {
    /// `IBV_WR_LOCAL_INV`: invalidates the type 2 window of R_Key `rkey` (it completes
    /// with `IBV_WC_LOCAL_INV`, or `IBV_WC_LOC_QP_OP_ERR` for a key that is not a type 2
    /// window's of the QP's PD).
    pub fn local_invalidate(wr_id: u64, rkey: u32) -> Self {
        SendRequest {
            wr: SendWr::new(
                wr_id,
                SendOp::LocalInv {
                    invalidate_rkey: rkey,
                },
                SgeList::new(),
            ),
        }
    }
}

impl Qp {
    /// Binds the type 1 window `mw` to `slice` with `access` (`ibv_bind_mw(3)`), or
    /// unbinds it (`slice` `None`): posts the bind on this QP's send queue with the
    /// request's `wr_id` and flags of `signaled`, and returns the R_Key the window has
    /// once it executes ([`inc_rkey`] of the current one). The bind completes with
    /// `IBV_WC_BIND_MW`, or `IBV_WC_MW_BIND_ERR` if the core refuses it (a type 2 window,
    /// a region without `MW_BIND`, a range outside the region, …).
    pub fn bind_mw<'a>(
        &self,
        mw: &Mw<'a>,
        wr_id: u64,
        slice: Option<MrSlice<'a>>,
        access: AccessFlags,
        signaled: bool,
    ) -> Result<u32, Error> {
        let bind = mw.window_bind(slice, access, WindowType::One);
        let mut request = bind_request(wr_id, bind);
        if signaled {
            request = request.signaled();
        }
        self.post_send(request)?;
        Ok(bind.bound_rkey())
    }
}
