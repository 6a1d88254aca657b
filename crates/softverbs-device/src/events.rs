//! The device's asynchronous event queue (`ibv_get_async_event(3)`): CQ errors, QP
//! errors, last-WQE-reached, SRQ limit, port and device events, delivered through a
//! pollable file descriptor like libibverbs' `context->async_fd`. Every event raised is
//! counted by kind ([`EventCounts`], in the device's statistics) and logged: the errors
//! (CQ overrun, QP fatal / request / access error, device fatal) at WARN, the others at
//! DEBUG.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Mutex;
use std::time::Duration;

// One enum for the asynchronous event, defined with the engine, which raises the QP and
// SRQ ones; the device queues those and its own (CQ error, port active).
pub use softverbs_proto::AsyncEvent;
use softverbs_proto::Object;

/// How many asynchronous events of each kind a device raised (queued, whether or not the
/// program read them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventCounts {
    /// `IBV_EVENT_CQ_ERR`: CQ overruns.
    pub cq_error: u64,
    /// `IBV_EVENT_QP_FATAL`.
    pub qp_fatal: u64,
    /// `IBV_EVENT_QP_REQ_ERR`.
    pub qp_request_error: u64,
    /// `IBV_EVENT_QP_ACCESS_ERR`.
    pub qp_access_error: u64,
    /// `IBV_EVENT_COMM_EST`.
    pub comm_est: u64,
    /// `IBV_EVENT_SQ_DRAINED`.
    pub sq_drained: u64,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`.
    pub qp_last_wqe_reached: u64,
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`.
    pub srq_limit_reached: u64,
    /// `IBV_EVENT_PORT_ACTIVE`.
    pub port_active: u64,
    /// `IBV_EVENT_DEVICE_FATAL`.
    pub device_fatal: u64,
}

impl EventCounts {
    /// Counts one event; returns whether it reports an error (for its log level).
    fn record(&mut self, event: &AsyncEvent) -> bool {
        let (count, error) = match event {
            AsyncEvent::CqError { .. } => (&mut self.cq_error, true),
            AsyncEvent::QpFatal { .. } => (&mut self.qp_fatal, true),
            AsyncEvent::QpRequestError { .. } => (&mut self.qp_request_error, true),
            AsyncEvent::QpAccessError { .. } => (&mut self.qp_access_error, true),
            AsyncEvent::CommEst { .. } => (&mut self.comm_est, false),
            AsyncEvent::SqDrained { .. } => (&mut self.sq_drained, false),
            AsyncEvent::QpLastWqeReached { .. } => (&mut self.qp_last_wqe_reached, false),
            AsyncEvent::SrqLimitReached { .. } => (&mut self.srq_limit_reached, false),
            AsyncEvent::PortActive { .. } => (&mut self.port_active, false),
            AsyncEvent::DeviceFatal => (&mut self.device_fatal, true),
        };
        *count += 1;
        error
    }

    /// `(name, count)` of every kind, in `enum ibv_event_type` order of the kinds the
    /// device raises.
    pub fn fields(&self) -> [(&'static str, u64); 10] {
        [
            ("cq_error", self.cq_error),
            ("qp_fatal", self.qp_fatal),
            ("qp_request_error", self.qp_request_error),
            ("qp_access_error", self.qp_access_error),
            ("comm_est", self.comm_est),
            ("sq_drained", self.sq_drained),
            ("qp_last_wqe_reached", self.qp_last_wqe_reached),
            ("srq_limit_reached", self.srq_limit_reached),
            ("port_active", self.port_active),
            ("device_fatal", self.device_fatal),
        ]
    }

    /// Every event raised.
    pub fn total(&self) -> u64 {
        self.fields().iter().map(|(_, n)| n).sum()
    }
}

/// `total=N` and then `name=N` for each kind raised at least once.
impl std::fmt::Display for EventCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "total={}", self.total())?;
        for (name, count) in self.fields() {
            if count > 0 {
                write!(f, " {name}={count}")?;
            }
        }
        Ok(())
    }
}

/// A queue of [`AsyncEvent`]s behind a pollable eventfd (one count per queued event).
#[derive(Debug)]
pub struct AsyncEventQueue {
    fd: OwnedFd,
    queue: Mutex<VecDeque<AsyncEvent>>,
    /// What was queued, by kind (counted before queueing).
    counts: Mutex<EventCounts>,
}

impl AsyncEventQueue {
    /// An empty queue.
    pub fn new() -> io::Result<Self> {
        use rustix::event::{eventfd, EventfdFlags};
        Ok(AsyncEventQueue {
            fd: eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::SEMAPHORE)?,
            queue: Mutex::new(VecDeque::new()),
            counts: Mutex::new(EventCounts::default()),
        })
    }

    /// Queues an event and wakes one reader.
    pub fn push(&self, event: AsyncEvent) {
        let error = self
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(&event);
        if error {
            tracing::warn!(?event, "async event");
        } else {
            tracing::debug!(?event, "async event");
        }
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        queue.push_back(event);
        // Under the lock, so that the fd's count is the queue's length whenever the lock
        // is free. Fails only on counter overflow (2^64 - 2 queued events).
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }

    /// How many events of each kind were queued so far.
    pub fn counts(&self) -> EventCounts {
        *self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the next event without waiting.
    pub fn try_next(&self) -> Option<AsyncEvent> {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let event = queue.pop_front()?;
        Self::take_count(&self.fd);
        Some(event)
    }

    /// Forgets the queued events affiliated with `object` number `id`, as the kernel
    /// drops a destroyed object's unread events: once an object is destroyed, no event
    /// names it, and one created after it (the same number, or for the drop-in the same
    /// address) never receives its predecessor's. Returns how many were dropped.
    pub fn forget(&self, object: Object, id: u64) -> usize {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let before = queue.len();
        queue.retain(|event| event.affiliated() != Some((object, id)));
        let dropped = before - queue.len();
        for _ in 0..dropped {
            Self::take_count(&self.fd);
        }
        dropped
    }

    /// Takes one event's count from the semaphore fd; the caller holds the queue's lock
    /// and has removed that event, so the count is there and the read does not block.
    fn take_count(fd: &OwnedFd) {
        let mut buf = [0u8; 8];
        let _ = rustix::io::read(fd, &mut buf);
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

    #[test]
    fn a_destroyed_objects_unread_events_are_forgotten_and_the_fd_count_follows() {
        // ibv_get_async_event(3): no event is retrieved "after the corresponding object has
        // already been destroyed"; the kernel drops a destroyed object's unread events.
        let q = AsyncEventQueue::new().unwrap();
        q.push(AsyncEvent::QpFatal { qpn: 5 });
        q.push(AsyncEvent::CqError {
            cq_id: 9,
            user_context: 0x1000,
        });
        q.push(AsyncEvent::QpAccessError { qpn: 6 });
        q.push(AsyncEvent::QpRequestError { qpn: 5 });
        assert_eq!(q.forget(Object::Qp, 5), 2);
        assert_eq!(q.forget(Object::Cq, 9), 1);
        assert_eq!(q.forget(Object::Srq, 5), 0);
        assert_eq!(q.try_next(), Some(AsyncEvent::QpAccessError { qpn: 6 }));
        // The fd's count went down with the queue: nothing left to read.
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let mut fds = [rustix::event::PollFd::new(&q, rustix::event::PollFlags::IN)];
        assert_eq!(rustix::event::poll(&mut fds, Some(&zero)).unwrap(), 0);
        assert_eq!(q.try_next(), None);
    }
}
