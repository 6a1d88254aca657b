//! The device's asynchronous event queue (`ibv_get_async_event(3)`): CQ errors, QP
//! errors, last-WQE-reached, SRQ limit, port and device events, delivered through a
//! pollable file descriptor like libibverbs' `context->async_fd`.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Mutex;
use std::time::Duration;

/// An asynchronous event (`enum ibv_event_type`, the ones a soft device raises).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AsyncEvent {
    /// `IBV_EVENT_CQ_ERR`: a CQ overran.
    CqError {
        /// The CQ's id.
        cq_id: u64,
        /// The CQ's user context.
        user_context: u64,
    },
    /// `IBV_EVENT_QP_FATAL`: a QP entered the error state on a local error.
    QpFatal {
        /// The QP number.
        qpn: u32,
    },
    /// `IBV_EVENT_QP_REQ_ERR`: the responder found an invalid request.
    QpRequestError {
        /// The QP number.
        qpn: u32,
    },
    /// `IBV_EVENT_QP_ACCESS_ERR`: the responder found an access violation.
    QpAccessError {
        /// The QP number.
        qpn: u32,
    },
    /// `IBV_EVENT_COMM_EST`: the first packet arrived on a QP in RTR.
    CommEst {
        /// The QP number.
        qpn: u32,
    },
    /// `IBV_EVENT_SQ_DRAINED`: a QP in SQD has no outstanding send.
    SqDrained {
        /// The QP number.
        qpn: u32,
    },
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: an SRQ-attached QP in error has no more WQEs.
    QpLastWqeReached {
        /// The QP number.
        qpn: u32,
    },
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: an armed SRQ dropped below its limit.
    SrqLimitReached {
        /// The SRQ handle.
        srq: u32,
    },
    /// `IBV_EVENT_PORT_ACTIVE`: the port became active.
    PortActive {
        /// The port number.
        port: u8,
    },
    /// `IBV_EVENT_DEVICE_FATAL`: the device failed (its transport died).
    DeviceFatal,
}

impl AsyncEvent {
    /// The `enum ibv_event_type` value.
    pub const fn raw_type(&self) -> u32 {
        match self {
            AsyncEvent::CqError { .. } => 0,
            AsyncEvent::QpFatal { .. } => 1,
            AsyncEvent::QpRequestError { .. } => 2,
            AsyncEvent::QpAccessError { .. } => 3,
            AsyncEvent::CommEst { .. } => 4,
            AsyncEvent::SqDrained { .. } => 5,
            AsyncEvent::PortActive { .. } => 9,
            AsyncEvent::SrqLimitReached { .. } => 15,
            AsyncEvent::QpLastWqeReached { .. } => 16,
            AsyncEvent::DeviceFatal => 8,
        }
    }
}

/// A queue of [`AsyncEvent`]s behind a pollable eventfd (one count per queued event).
#[derive(Debug)]
pub struct AsyncEventQueue {
    fd: OwnedFd,
    queue: Mutex<VecDeque<AsyncEvent>>,
}

impl AsyncEventQueue {
    /// An empty queue.
    pub fn new() -> io::Result<Self> {
        use rustix::event::{eventfd, EventfdFlags};
        Ok(AsyncEventQueue {
            fd: eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::SEMAPHORE)?,
            queue: Mutex::new(VecDeque::new()),
        })
    }

    /// Queues an event and wakes one reader.
    pub fn push(&self, event: AsyncEvent) {
        tracing::debug!(?event, "async event");
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(event);
        // Fails only on counter overflow (2^64 - 2 queued events).
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }

    /// Takes the next event without waiting.
    pub fn try_next(&self) -> Option<AsyncEvent> {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let event = queue.pop_front()?;
        drop(queue);
        // The count for this event is there (pushed before the write, popped here once).
        let mut buf = [0u8; 8];
        let _ = rustix::io::read(&self.fd, &mut buf);
        Some(event)
    }

    /// Waits up to `timeout` (`None`: forever) for the next event.
    pub fn next(&self, timeout: Option<Duration>) -> io::Result<Option<AsyncEvent>> {
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            if let Some(event) = self.try_next() {
                return Ok(Some(event));
            }
            let wait = match deadline {
                Some(d) => {
                    let now = std::time::Instant::now();
                    if now >= d {
                        return Ok(None);
                    }
                    Some(d - now)
                }
                None => None,
            };
            let ts = wait.map(|w| rustix::time::Timespec {
                tv_sec: w.as_secs() as i64,
                tv_nsec: i64::from(w.subsec_nanos()),
            });
            let mut fds = [rustix::event::PollFd::new(
                &self.fd,
                rustix::event::PollFlags::IN,
            )];
            match rustix::event::poll(&mut fds, ts.as_ref()) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl AsFd for AsyncEventQueue {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_come_out_in_order_and_the_fd_is_readable_while_any_is_queued() {
        // ibv_get_async_event(3): events are read from the context's async fd.
        let q = AsyncEventQueue::new().unwrap();
        assert_eq!(q.next(Some(Duration::ZERO)).unwrap(), None);
        q.push(AsyncEvent::QpFatal { qpn: 5 });
        q.push(AsyncEvent::PortActive { port: 1 });
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let mut fds = [rustix::event::PollFd::new(&q, rustix::event::PollFlags::IN)];
        assert_eq!(rustix::event::poll(&mut fds, Some(&zero)).unwrap(), 1);
        assert_eq!(q.try_next(), Some(AsyncEvent::QpFatal { qpn: 5 }));
        // Bounded: were the queued event lost, `next(None)` would wait forever.
        assert_eq!(
            q.next(Some(Duration::from_secs(60))).unwrap(),
            Some(AsyncEvent::PortActive { port: 1 })
        );
        let mut fds = [rustix::event::PollFd::new(&q, rustix::event::PollFlags::IN)];
        assert_eq!(rustix::event::poll(&mut fds, Some(&zero)).unwrap(), 0);
    }
}
