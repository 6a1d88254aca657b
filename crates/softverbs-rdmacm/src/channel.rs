//! Event channels and events (`rdma_create_event_channel(3)`, `rdma_get_cm_event(3)`,
//! `rdma_ack_cm_event(3)`, `rdma_event_str(3)`).
//!
//! A channel's `fd` is an eventfd in semaphore mode counting the queued events: reading it
//! blocks while the channel is empty, or fails with `EAGAIN` when the program made the fd
//! non-blocking (`fcntl(channel->fd, F_SETFL, O_NONBLOCK)`, as `rdma_get_cm_event(3)`
//! describes), and `poll`/`select` see it readable while events wait.

use crate::abi::*;
use crate::boundary::{self, Errno};
use crate::state::{lock, Channel, EventBox, Ptr};
use crate::symver;
use libc::{c_char, c_int, c_void};
use std::collections::VecDeque;

/// Makes a channel (also the private channel of a synchronous id).
pub(crate) fn new_channel() -> Result<*mut rdma_event_channel, Errno> {
    new_channel_locked(&mut lock())
}

/// [`new_channel`] with the state already locked.
pub(crate) fn new_channel_locked(
    st: &mut crate::state::State,
) -> Result<*mut rdma_event_channel, Errno> {
    // SAFETY: eventfd with valid flags.
    let fd = unsafe { libc::eventfd(0, libc::EFD_SEMAPHORE | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(boundary::errno());
    }
    let p = Box::into_raw(Box::new(rdma_event_channel { fd }));
    st.channels.insert(
        p as usize,
        Channel {
            ptr: Ptr(p),
            queue: VecDeque::new(),
        },
    );
    Ok(p)
}

/// Frees a channel no id uses any more: its queued events, its fd, its box.
pub(crate) fn free_channel(st: &mut crate::state::State, key: usize) {
    if let Some(ch) = st.channels.remove(&key) {
        for e in ch.queue {
            // SAFETY: queued boxes are owned by the queue.
            drop(unsafe { Box::from_raw(e.0) });
        }
        // SAFETY: the channel's box (from Box::into_raw in `new_channel`), now unreachable
        // from the tables; its fd is ours.
        let b = unsafe { Box::from_raw(ch.ptr.0) };
        // SAFETY: the eventfd opened in `new_channel`.
        unsafe { libc::close(b.fd) };
    }
}

/// `rdma_create_event_channel(3)`: NULL with errno on failure.
pub extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    boundary::pointer(new_channel)
}
symver!(rdma_create_event_channel, "RDMACM_1.0");

/// `rdma_destroy_event_channel(3)`: "All rdma_cm_id's associated with the event channel
/// must be destroyed, and all returned events must be acked before calling this function."
/// A channel still in use is left alone (and said on stderr) rather than freed under its
/// ids.
pub extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    boundary::infallible((), || {
        let mut st = lock();
        let key = channel as usize;
        if !st.channels.contains_key(&key) {
            return;
        }
        if st.ids.values().any(|id| id.channel == key) {
            eprintln!(
                "librdmacm (softverbs): rdma_destroy_event_channel: ids still use the channel; not destroyed"
            );
            return;
        }
        free_channel(&mut st, key);
    })
}
symver!(rdma_destroy_event_channel, "RDMACM_1.0");

/// Takes the next event of `channel`, blocking as its fd does.
pub(crate) fn get_event(channel: *mut rdma_event_channel) -> Result<*mut rdma_cm_event, Errno> {
    let (fd, waiting) = {
        let st = lock();
        let ch = st.channels.get(&(channel as usize)).ok_or(libc::EINVAL)?;
        // SAFETY: a live channel box.
        let fd = unsafe { (*ch.ptr.0).fd };
        // The devices whose MADs make events, if the read below may block.
        let waiting: Vec<*mut c_void> = if ch.queue.is_empty() && blocking(fd) {
            st.devices
                .iter()
                .filter(|d| d.cm.is_some())
                .map(|d| d.ctx.0)
                .collect()
        } else {
            Vec::new()
        };
        (fd, waiting)
    };
    // The program blocks here instead of polling its CQs: the devices' progress threads
    // receive the MADs it waits for at once (not after a nap they took while it polled).
    if let Some(app_waits) = crate::verbs::gsi().ok().and_then(|g| g.app_waits) {
        for ctx in waiting {
            // SAFETY: a context the library opened and keeps open.
            unsafe { app_waits(ctx) };
        }
    }
    // Bounded: each pass consumes one count of the semaphore; a count left over by an
    // event dropped with its id is consumed and the read repeated.
    loop {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into `v` from the channel's eventfd.
        let n = unsafe { libc::read(fd, &mut v as *mut u64 as *mut c_void, 8) };
        if n < 0 {
            let e = boundary::errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        let mut st = lock();
        let Some(ch) = st.channels.get_mut(&(channel as usize)) else {
            return Err(libc::EINVAL);
        };
        let Some(e) = ch.queue.pop_front() else {
            continue;
        };
        // SAFETY: a queued box, now handed out.
        let counted = unsafe { (*e.0).counted_on };
        st.events.insert(e.0 as usize, counted);
        if let Some(id) = st.ids.get_mut(&counted) {
            id.unacked += 1;
        }
        return Ok(e.0 as *mut rdma_cm_event);
    }
}

/// Whether a read of `fd` blocks until there is something to read (no `O_NONBLOCK`).
fn blocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL reads the flags of a descriptor; a bad one fails (-1).
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    flags >= 0 && flags & libc::O_NONBLOCK == 0
}

/// `rdma_get_cm_event(3)`: 0, or -1 with errno (`EINVAL` bad arguments, `EAGAIN` on a
/// non-blocking channel with no event).
///
/// # Safety
///
/// `event` is NULL or writable.
pub unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    boundary::zero(|| {
        if event.is_null() {
            return Err(libc::EINVAL);
        }
        let e = get_event(channel)?;
        // SAFETY: non-NULL out pointer (caller's contract).
        unsafe { *event = e };
        Ok(())
    })
}
symver!(rdma_get_cm_event, "RDMACM_1.0");

/// Acknowledges and frees an event handed out by `get_event`.
pub(crate) fn ack_event(e: *mut rdma_cm_event) -> Result<(), Errno> {
    let mut st = lock();
    let counted = st.events.remove(&(e as usize)).ok_or(libc::EINVAL)?;
    if let Some(id) = st.ids.get_mut(&counted) {
        id.unacked = id.unacked.saturating_sub(1);
    }
    // SAFETY: handed-out events are boxes from `queue_event`, removed from the table above.
    drop(unsafe { Box::from_raw(e as *mut EventBox) });
    drop(st);
    crate::state::ACKED.notify_all();
    Ok(())
}

/// `rdma_ack_cm_event(3)`: 0, or -1 with `EINVAL` for an event not handed out (or acked
/// twice).
pub extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    boundary::zero(|| ack_event(event))
}
symver!(rdma_ack_cm_event, "RDMACM_1.0");

/// `rdma_event_str(3)`: the event's name; "UNKNOWN EVENT" for other values.
pub extern "C" fn rdma_event_str(event: c_int) -> *const c_char {
    let s: &'static std::ffi::CStr = match event as u32 {
        event::ADDR_RESOLVED => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        event::ADDR_ERROR => c"RDMA_CM_EVENT_ADDR_ERROR",
        event::ROUTE_RESOLVED => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        event::ROUTE_ERROR => c"RDMA_CM_EVENT_ROUTE_ERROR",
        event::CONNECT_REQUEST => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        event::CONNECT_RESPONSE => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        event::CONNECT_ERROR => c"RDMA_CM_EVENT_CONNECT_ERROR",
        event::UNREACHABLE => c"RDMA_CM_EVENT_UNREACHABLE",
        event::REJECTED => c"RDMA_CM_EVENT_REJECTED",
        event::ESTABLISHED => c"RDMA_CM_EVENT_ESTABLISHED",
        event::DISCONNECTED => c"RDMA_CM_EVENT_DISCONNECTED",
        event::DEVICE_REMOVAL => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        event::MULTICAST_JOIN => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        event::MULTICAST_ERROR => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        event::ADDR_CHANGE => c"RDMA_CM_EVENT_ADDR_CHANGE",
        event::TIMEWAIT_EXIT => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    };
    s.as_ptr()
}
symver!(rdma_event_str, "RDMACM_1.0");
