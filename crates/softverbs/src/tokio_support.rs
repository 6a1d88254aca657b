//! Completion and async events as futures on tokio (feature `tokio`).
//!
//! Both wait on the event fd through [`tokio::io::unix::AsyncFd`] and take an event only
//! when the fd says so, with no `.await` between taking it and returning it: dropping a
//! pending `next_event()` (a timeout, a `select!` branch that lost) loses no event, and
//! readiness is cleared only when a non-blocking read found nothing, with tokio's
//! readiness ticks guarding against a wake-up that arrives in between (no lost wake-up).
//!
//! `poll_next_event` is the same step as a poll function, for a `Stream`
//! (`futures::stream::poll_fn(|cx| events.poll_next_event(cx).map(Some))`) or a
//! hand-written future. Other runtimes use the fds directly: [`CompChannel`] and the
//! device's async event queue are [`AsFd`], readable while an event is queued, and
//! [`CompChannel::try_get_event`] / [`Context::try_async_event`] take one without blocking.

use crate::context::Context;
use crate::cq::CompChannel;
use crate::error::Error;
use softverbs_cq::{CompletionChannel, CqEvent};
use softverbs_device::AsyncEvent;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::task::{ready, Context as TaskContext, Poll};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// A completion channel whose events are awaited (`ibv_get_cq_event(3)` as a future).
///
/// Creating it makes the channel's fd non-blocking (for every clone of the channel:
/// a blocking [`CompChannel::get_event`] then returns `WouldBlock` when empty; use
/// [`CompChannel::get_event_timeout`] for blocking waits beside it). It must be created
/// inside a tokio runtime with I/O enabled.
///
/// ```
/// use softverbs::{AsyncCompChannel, Context, DeviceConfig};
/// let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
/// rt.block_on(async {
///     let ctx = Context::open_with(DeviceConfig::in_process())?;
///     let channel = ctx.create_comp_channel()?;
///     let cq = ctx.cq_builder(8).channel(&channel).build()?;
///     let events = AsyncCompChannel::new(&channel)?;
///     cq.req_notify(false);
///     // Nothing happened yet: the wait times out, and is cancelled safely.
///     let waited = tokio::time::timeout(std::time::Duration::from_millis(5), events.next_event()).await;
///     assert!(waited.is_err());
///     Ok::<(), Box<dyn std::error::Error>>(())
/// })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct AsyncCompChannel {
    fd: AsyncFd<CompletionChannel>,
    channel: CompChannel,
}

impl std::fmt::Debug for AsyncCompChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AsyncCompChannel")
            .field(&self.channel)
            .finish()
    }
}

impl AsyncCompChannel {
    /// Registers `channel`'s fd with the current tokio runtime.
    pub fn new(channel: &CompChannel) -> Result<Self, Error> {
        channel.set_nonblocking(true)?;
        // SAFETY: the fd is the channel's (an epoll set), an `OwnedFd` inside the channel's
        // shared state, which the `CompletionChannel` clone moved into the `AsyncFd` keeps
        // alive and never replaces: it stays open, and `as_raw_fd` returns it, until the
        // `AsyncFd` is dropped. Non-blocking, it polls readable on the device's packets
        // too, and `get_event` then receives them (one wake-up per event).
        #[allow(unsafe_code)]
        let registered =
            unsafe { AsyncFd::register_with_interest(channel.channel.clone(), Interest::READABLE) };
        let fd = registered.map_err(io::Error::from)?;
        Ok(AsyncCompChannel {
            fd,
            channel: channel.clone(),
        })
    }

    /// The channel underneath.
    pub fn channel(&self) -> &CompChannel {
        &self.channel
    }

    /// Waits for the next completion event. Cancellation-safe: a dropped call took no
    /// event.
    pub async fn next_event(&self) -> Result<CqEvent, Error> {
        loop {
            let mut guard = self.fd.readable().await?;
            // `get_event` on the non-blocking fd: an event, or `WouldBlock` (which makes
            // `try_io` clear this readiness, unless a newer one arrived meanwhile).
            match guard.try_io(|fd| fd.get_ref().get_event()) {
                Ok(result) => return Ok(result?),
                Err(_would_block) => continue,
            }
        }
    }

    /// The poll-function form of [`AsyncCompChannel::next_event`]: `Ready` with an event
    /// or an error, or `Pending` with `cx` registered for the next readiness.
    pub fn poll_next_event(&self, cx: &mut TaskContext<'_>) -> Poll<Result<CqEvent, Error>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            match guard.try_io(|fd| fd.get_ref().get_event()) {
                Ok(result) => return Poll::Ready(result.map_err(Error::from)),
                Err(_would_block) => continue,
            }
        }
    }
}

/// The device's async event fd, borrowed through the context that owns it.
struct AsyncEventFd(Context);

impl AsRawFd for AsyncEventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.device().async_events().as_fd().as_raw_fd()
    }
}

/// The device's asynchronous events, awaited (`ibv_get_async_event(3)` as a future).
/// Create it inside a tokio runtime with I/O enabled.
///
/// ```
/// use softverbs::{AsyncEvent, AsyncEvents, Context, DeviceConfig};
/// let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
/// rt.block_on(async {
///     let ctx = Context::open_with(DeviceConfig::in_process())?;
///     let events = AsyncEvents::new(&ctx)?;
///     assert_eq!(events.next_event().await?, AsyncEvent::PortActive { port: 1 });
///     Ok::<(), Box<dyn std::error::Error>>(())
/// })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct AsyncEvents {
    fd: AsyncFd<AsyncEventFd>,
}

impl std::fmt::Debug for AsyncEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AsyncEvents")
            .field(&self.fd.get_ref().0)
            .finish()
    }
}

impl AsyncEvents {
    /// Registers the device's async event fd with the current tokio runtime.
    pub fn new(ctx: &Context) -> Result<Self, Error> {
        // SAFETY: the fd is the device's async eventfd, an `OwnedFd` inside the device,
        // which the `Context` moved into the `AsyncFd` keeps open and never replaces until
        // the `AsyncFd` is dropped; `as_raw_fd` always returns it.
        #[allow(unsafe_code)]
        let fd = unsafe {
            AsyncFd::register_with_interest(AsyncEventFd(ctx.clone()), Interest::READABLE)
        }
        .map_err(io::Error::from)?;
        Ok(AsyncEvents { fd })
    }

    /// Waits for the next asynchronous event. Cancellation-safe.
    pub async fn next_event(&self) -> Result<AsyncEvent, Error> {
        loop {
            let mut guard = self.fd.readable().await?;
            let taken = guard.try_io(|fd| {
                fd.get_ref()
                    .0
                    .try_async_event()
                    .ok_or_else(|| io::Error::from(io::ErrorKind::WouldBlock))
            });
            match taken {
                Ok(result) => return Ok(result?),
                Err(_would_block) => continue,
            }
        }
    }

    /// The poll-function form of [`AsyncEvents::next_event`].
    pub fn poll_next_event(&self, cx: &mut TaskContext<'_>) -> Poll<Result<AsyncEvent, Error>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let taken = guard.try_io(|fd| {
                fd.get_ref()
                    .0
                    .try_async_event()
                    .ok_or_else(|| io::Error::from(io::ErrorKind::WouldBlock))
            });
            match taken {
                Ok(result) => return Poll::Ready(result.map_err(Error::from)),
                Err(_would_block) => continue,
            }
        }
    }
}
