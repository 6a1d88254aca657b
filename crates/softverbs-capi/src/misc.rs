//! Everything that is not an object: string tables, fork support, sysfs access, rate
//! conversions, kernel-struct copies, the async event queue, and import of objects from
//! another process.
//!
//! | function | version | status |
//! |---|---|---|
//! | `ibv_wc_status_str`, `ibv_node_type_str`, `ibv_port_state_str`, `ibv_event_type_str` | 1.1 | real (rdma-core 44's texts) |
//! | `ibv_rate_to_mult`, `mult_to_ibv_rate` | 1.0 | real |
//! | `ibv_rate_to_mbps`, `mbps_to_ibv_rate` | 1.1 | real |
//! | `ibv_fork_init` | 1.1 | real: 0 (the soft device pins no memory, so fork is always safe) |
//! | `ibv_is_fork_initialized` | 1.13 | real: `IBV_FORK_UNNEEDED` |
//! | `ibv_dontfork_range`, `ibv_dofork_range` | 1.1 | real: 0 (nothing to protect) |
//! | `ibv_get_sysfs_path` | 1.0 | `"/sys"` (`SYSFS_PATH` honoured, as rdma-core does) |
//! | `ibv_read_sysfs_file` | 1.0 | documented failure: -1, `errno = ENOENT` (the soft device has no sysfs entries) |
//! | `ibv_copy_qp_attr_from_kern`, `ibv_copy_ah_attr_from_kern`, `ibv_copy_path_rec_from_kern`, `ibv_copy_path_rec_to_kern` | 1.0 / 1.1 | documented failure: do nothing (void; no kernel structs exist here; only librdmacm's kernel path calls them) |
//! | `ibv_get_async_event` | 1.1 | real: CQ errors, QP fatal / request / access errors, communication established, SQ drained, last WQE reached, SRQ limit, port active, device fatal; `context->async_fd` is the device's pollable event fd (honours `O_NONBLOCK`); an event of an object destroyed before it was read is dropped |
//! | `ibv_ack_async_event` | 1.1 | real: counted in the object's `events_completed`; `ibv_destroy_qp` / `_srq` / `_cq` wait for every delivered event of the object to be acknowledged |
//! | `ibv_import_dm` | 1.13 | documented failure (`NULL`, `EOPNOTSUPP`): no device memory to import |
//! | `ibv_unimport_dm` | 1.13 | do nothing |
//!
//! `ibv_import_device` is with the contexts (`device.rs`), `ibv_import_pd` /
//! `ibv_unimport_pd` with the PDs (`pd.rs`), `ibv_import_mr` / `ibv_unimport_mr` with the
//! MRs (`mr.rs`).

use crate::abi::*;
use crate::boundary::{errno_of, infallible, minus_one, set_errno};
use crate::handles::{acknowledge, with_registry, ContextBlock, Registry};
use crate::verbs_h::{
    IBV_EVENT_COMM_EST, IBV_EVENT_CQ_ERR, IBV_EVENT_PATH_MIG, IBV_EVENT_PATH_MIG_ERR,
    IBV_EVENT_QP_ACCESS_ERR, IBV_EVENT_QP_FATAL, IBV_EVENT_QP_LAST_WQE_REACHED,
    IBV_EVENT_QP_REQ_ERR, IBV_EVENT_SQ_DRAINED, IBV_EVENT_SRQ_ERR, IBV_EVENT_SRQ_LIMIT_REACHED,
    IBV_FORK_UNNEEDED,
};
use softverbs::core::device::AsyncEvent;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::OnceLock;

const NODE_TYPE_STR: [&CStr; 7] = [
    c"InfiniBand channel adapter",
    c"InfiniBand switch",
    c"InfiniBand router",
    c"iWARP NIC",
    c"usNIC",
    c"usNIC UDP",
    c"unspecified",
];

const PORT_STATE_STR: [&CStr; 6] = [
    c"no state change (NOP)",
    c"down",
    c"init",
    c"armed",
    c"active",
    c"active defer",
];

const EVENT_TYPE_STR: [&CStr; 20] = [
    c"CQ error",
    c"local work queue catastrophic error",
    c"invalid request local work queue error",
    c"local access violation work queue error",
    c"communication established",
    c"send queue drained",
    c"path migrated",
    c"path migration request error",
    c"local catastrophic error",
    c"port active",
    c"port error",
    c"LID change",
    c"P_Key change",
    c"SM change",
    c"SRQ catastrophic error",
    c"SRQ limit reached",
    c"last WQE reached",
    c"client reregistration",
    c"GID table change",
    c"WQ fatal",
];

fn lookup(table: &[&'static CStr], index: i64) -> *const c_char {
    usize::try_from(index)
        .ok()
        .and_then(|i| table.get(i))
        .copied()
        .unwrap_or(c"unknown")
        .as_ptr()
}

/// `ibv_wc_status_str(3)`: a static string, "unknown" for values the header does not name.
pub extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
    // The cq crate holds the one table of status texts (rdma-core 44's wording).
    u32::try_from(status)
        .map_or(c"unknown", |raw| {
            softverbs::core::cq::WcStatus::from_raw(raw).as_c_str()
        })
        .as_ptr()
}
symver!(ibv_wc_status_str, "IBVERBS_1.1");

/// `ibv_node_type_str(3)`: a static string, "unknown" out of range.
pub extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    // IBV_NODE_CA (1) is the first entry.
    lookup(&NODE_TYPE_STR, i64::from(node_type) - 1)
}
symver!(ibv_node_type_str, "IBVERBS_1.1");

/// `ibv_port_state_str(3)`: a static string, "unknown" out of range.
pub extern "C" fn ibv_port_state_str(port_state: c_int) -> *const c_char {
    lookup(&PORT_STATE_STR, i64::from(port_state))
}
symver!(ibv_port_state_str, "IBVERBS_1.1");

/// `ibv_event_type_str(3)`: a static string, "unknown" out of range.
pub extern "C" fn ibv_event_type_str(event: c_int) -> *const c_char {
    lookup(&EVENT_TYPE_STR, i64::from(event))
}
symver!(ibv_event_type_str, "IBVERBS_1.1");

/// `(enum ibv_rate, multiple of 2.5 Gb/s)` for the rates that are exact multiples.
const RATE_MULT: [(c_int, c_int); 15] = [
    (2, 1),
    (5, 2),
    (3, 4),
    (6, 8),
    (4, 12),
    (7, 16),
    (8, 24),
    (9, 32),
    (10, 48),
    (19, 11),
    (20, 20),
    (21, 160),
    (22, 240),
    (23, 320),
    (24, 480),
];

/// `(enum ibv_rate, Mb/s)`.
const RATE_MBPS: [(c_int, c_int); 23] = [
    (2, 2500),
    (5, 5000),
    (3, 10000),
    (6, 20000),
    (4, 30000),
    (7, 40000),
    (8, 60000),
    (9, 80000),
    (10, 120000),
    (11, 14062),
    (12, 56250),
    (13, 112500),
    (14, 168750),
    (15, 25781),
    (16, 103125),
    (17, 206250),
    (18, 309375),
    (19, 28125),
    (20, 53125),
    (21, 425000),
    (22, 637500),
    (23, 850000),
    (24, 1275000),
];

fn forward(table: &[(c_int, c_int)], key: c_int, missing: c_int) -> c_int {
    table
        .iter()
        .find(|(k, _)| *k == key)
        .map_or(missing, |(_, v)| *v)
}

fn backward(table: &[(c_int, c_int)], value: c_int) -> c_int {
    // IBV_RATE_MAX (0) when nothing matches.
    table
        .iter()
        .find(|(_, v)| *v == value)
        .map_or(0, |(k, _)| *k)
}

/// `ibv_rate_to_mult(3)`: -1 for rates that are not multiples of 2.5 Gb/s.
pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    forward(&RATE_MULT, rate, -1)
}
symver!(ibv_rate_to_mult, "IBVERBS_1.0");

/// `mult_to_ibv_rate(3)`: `IBV_RATE_MAX` (0) when no rate matches.
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    backward(&RATE_MULT, mult)
}
symver!(mult_to_ibv_rate, "IBVERBS_1.0");

/// `ibv_rate_to_mbps(3)`: -1 for unknown rates.
pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    forward(&RATE_MBPS, rate, -1)
}
symver!(ibv_rate_to_mbps, "IBVERBS_1.1");

/// `mbps_to_ibv_rate(3)`: `IBV_RATE_MAX` (0) when no rate matches.
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    backward(&RATE_MBPS, mbps)
}
symver!(mbps_to_ibv_rate, "IBVERBS_1.1");

/// `ibv_fork_init(3)`: 0. The soft device never pins application memory for DMA, so a
/// forked child cannot corrupt it.
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}
symver!(ibv_fork_init, "IBVERBS_1.1");

/// `ibv_is_fork_initialized(3)`: `IBV_FORK_UNNEEDED`.
pub extern "C" fn ibv_is_fork_initialized() -> u32 {
    IBV_FORK_UNNEEDED
}
symver!(ibv_is_fork_initialized, "IBVERBS_1.13");

/// `ibv_dontfork_range`: 0, nothing to protect.
pub extern "C" fn ibv_dontfork_range(_: *mut c_void, _: usize) -> c_int {
    0
}
symver!(ibv_dontfork_range, "IBVERBS_1.1");

/// `ibv_dofork_range`: 0, nothing to undo.
pub extern "C" fn ibv_dofork_range(_: *mut c_void, _: usize) -> c_int {
    0
}
symver!(ibv_dofork_range, "IBVERBS_1.1");

/// `ibv_get_sysfs_path`: `$SYSFS_PATH` (trailing slashes removed) when set and the
/// process is not set-uid, else `"/sys"`, as rdma-core. The string lives for the process.
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    static PATH: OnceLock<std::ffi::CString> = OnceLock::new();
    crate::boundary::infallible(c"/sys".as_ptr(), || {
        PATH.get_or_init(|| {
            // SAFETY: getuid/geteuid have no preconditions.
            let same_user = unsafe { libc::getuid() == libc::geteuid() };
            let env = same_user
                .then(|| std::env::var_os("SYSFS_PATH"))
                .flatten()
                .and_then(|p| {
                    let p = p.into_encoded_bytes();
                    let trimmed = p
                        .iter()
                        .rposition(|&b| b != b'/')
                        .map_or(&p[..0], |i| &p[..=i]);
                    std::ffi::CString::new(trimmed).ok()
                });
            env.unwrap_or_else(|| c"/sys".to_owned())
        })
        .as_ptr()
    })
}
symver!(ibv_get_sysfs_path, "IBVERBS_1.0");

/// `ibv_read_sysfs_file`: -1 with `errno = ENOENT`. The soft device has no sysfs entries
/// (`ibv_devinfo` reads `board_id` through this and tolerates the failure).
pub extern "C" fn ibv_read_sysfs_file(
    _: *const c_char,
    _: *const c_char,
    _: *mut c_char,
    _: usize,
) -> c_int {
    set_errno(libc::ENOENT);
    -1
}
symver!(ibv_read_sysfs_file, "IBVERBS_1.0");

unsupported! {
    /// `ibv_copy_qp_attr_from_kern` (kernel ABI helper).
    void "IBVERBS_1.0" fn ibv_copy_qp_attr_from_kern(*mut ibv_qp_attr, *mut c_void)
}
unsupported! {
    /// `ibv_copy_path_rec_from_kern` (kernel ABI helper).
    void "IBVERBS_1.0" fn ibv_copy_path_rec_from_kern(*mut c_void, *mut c_void)
}
unsupported! {
    /// `ibv_copy_path_rec_to_kern` (kernel ABI helper).
    void "IBVERBS_1.0" fn ibv_copy_path_rec_to_kern(*mut c_void, *mut c_void)
}
unsupported! {
    /// `ibv_copy_ah_attr_from_kern` (kernel ABI helper).
    void "IBVERBS_1.1" fn ibv_copy_ah_attr_from_kern(*mut ibv_ah_attr, *mut c_void)
}
/// `ibv_get_async_event(3)`: waits for the device's next asynchronous event (or fails
/// with `EAGAIN` when `context->async_fd` is non-blocking and none is queued) and names its
/// object by the pointer C knows: the CQ, QP or SRQ, or the port number. 0, or -1 with
/// errno. An event of an object destroyed before it was taken is dropped, as the kernel
/// drops the unread events of a destroyed object: no event names freed memory. Every event
/// naming an object counts until `ibv_ack_async_event`, which that object's destroy waits
/// for.
///
/// # Safety
///
/// `context` is NULL or an open context; `event` is NULL or writable.
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    minus_one(|| {
        // SAFETY: `context` is NULL or an open context (this function's `# Safety`).
        let ctx = unsafe { ContextBlock::from_ptr(context) }?;
        if event.is_null() {
            return Err(libc::EINVAL);
        }
        let queue = ctx.entry.device.async_events();
        loop {
            // SAFETY: F_GETFL on the queue's own open fd.
            let flags = unsafe { libc::fcntl(queue.as_fd().as_raw_fd(), libc::F_GETFL) };
            let next = if flags >= 0 && flags & libc::O_NONBLOCK != 0 {
                queue.try_next()
            } else {
                queue.next(None).map_err(errno_of)?
            };
            let next = next.ok_or(libc::EAGAIN)?;
            let Some(element) = with_registry(|r| deliver(r, &next)) else {
                continue;
            };
            // SAFETY: `event` is writable (this function's `# Safety`; not NULL here).
            unsafe {
                event.write(ibv_async_event {
                    element,
                    event_type: next.raw_type(),
                })
            };
            return Ok(0);
        }
    })
}
symver!(ibv_get_async_event, "IBVERBS_1.1");

/// The element of `event` as C knows it, counted as delivered and unacknowledged if it
/// names an object; `None` if that object no longer exists.
fn deliver(r: &mut Registry, event: &AsyncEvent) -> Option<ibv_async_event_element> {
    let (element, object) = match *event {
        // The CQ's user context is its C pointer (set at creation).
        AsyncEvent::CqError { user_context, .. } => {
            let cq = user_context as usize;
            (
                ibv_async_event_element {
                    cq: cq as *mut ibv_cq,
                },
                r.cqs.get(&cq).copied(),
            )
        }
        AsyncEvent::QpFatal { qpn }
        | AsyncEvent::QpRequestError { qpn }
        | AsyncEvent::QpAccessError { qpn }
        | AsyncEvent::CommEst { qpn }
        | AsyncEvent::SqDrained { qpn }
        | AsyncEvent::QpLastWqeReached { qpn } => {
            let qp = r.qps.get(&qpn).copied();
            (
                ibv_async_event_element {
                    qp: qp.unwrap_or(0) as *mut ibv_qp,
                },
                qp,
            )
        }
        AsyncEvent::SrqLimitReached { srq } => {
            let srq = r.srqs.get(&srq).copied();
            (
                ibv_async_event_element {
                    srq: srq.unwrap_or(0) as *mut ibv_srq,
                },
                srq,
            )
        }
        AsyncEvent::PortActive { port } => {
            let element = ibv_async_event_element {
                port_num: c_int::from(port),
            };
            return Some(element);
        }
        AsyncEvent::DeviceFatal => return Some(ibv_async_event_element { port_num: 0 }),
    };
    let object = object?;
    *r.unacked.entry(object).or_default() += 1;
    Some(element)
}

/// Event types whose element is a CQ.
const CQ_EVENTS: [u32; 1] = [IBV_EVENT_CQ_ERR];
/// Event types whose element is a QP.
const QP_EVENTS: [u32; 8] = [
    IBV_EVENT_QP_FATAL,
    IBV_EVENT_QP_REQ_ERR,
    IBV_EVENT_QP_ACCESS_ERR,
    IBV_EVENT_COMM_EST,
    IBV_EVENT_SQ_DRAINED,
    IBV_EVENT_PATH_MIG,
    IBV_EVENT_PATH_MIG_ERR,
    IBV_EVENT_QP_LAST_WQE_REACHED,
];
/// Event types whose element is an SRQ.
const SRQ_EVENTS: [u32; 2] = [IBV_EVENT_SRQ_ERR, IBV_EVENT_SRQ_LIMIT_REACHED];

/// What an event's element is.
enum Affiliated {
    Cq,
    Qp,
    Srq,
}

/// `ibv_ack_async_event(3)`: acknowledges an event `ibv_get_async_event` returned; the
/// destroy of the object it names waits for this. The object's `events_completed`
/// (`async_events_completed` of a CQ) counts it, as in libibverbs. An event that names no
/// object, or that was never delivered (or is acknowledged twice), changes nothing.
///
/// # Safety
///
/// `event` is NULL or readable.
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    infallible((), || {
        if event.is_null() {
            return;
        }
        // SAFETY: `event` is readable (this function's `# Safety`; not NULL here).
        let event = unsafe { event.read() };
        let kind = if CQ_EVENTS.contains(&event.event_type) {
            Affiliated::Cq
        } else if QP_EVENTS.contains(&event.event_type) {
            Affiliated::Qp
        } else if SRQ_EVENTS.contains(&event.event_type) {
            Affiliated::Srq
        } else {
            return;
        };
        // SAFETY: the union member per the event type.
        let object = unsafe {
            match kind {
                Affiliated::Cq => event.element.cq as usize,
                Affiliated::Qp => event.element.qp as usize,
                Affiliated::Srq => event.element.srq as usize,
            }
        };
        // The object is alive while a delivered event of it is unacknowledged (its destroy
        // waits for that under this lock), so its counter is written only then.
        with_registry(|r| {
            if r.unacked.contains_key(&object) {
                // SAFETY: a live object's field, written under the registry's lock.
                unsafe {
                    let counter = match kind {
                        Affiliated::Cq => {
                            &raw mut (*(object as *mut ibv_cq)).async_events_completed
                        }
                        Affiliated::Qp => &raw mut (*(object as *mut ibv_qp)).events_completed,
                        Affiliated::Srq => &raw mut (*(object as *mut ibv_srq)).events_completed,
                    };
                    *counter = (*counter).wrapping_add(1);
                }
            }
        });
        acknowledge(object);
    })
}
symver!(ibv_ack_async_event, "IBVERBS_1.1");
unsupported! {
    /// `ibv_import_dm(3)`.
    null "IBVERBS_1.13" fn ibv_import_dm(*mut ibv_context, u32) -> *mut c_void
}
unsupported! {
    /// `ibv_unimport_dm(3)`.
    void "IBVERBS_1.13" fn ibv_unimport_dm(*mut c_void)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(p: *const c_char) -> &'static str {
        // SAFETY: every table entry is a static NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_str().unwrap()
    }

    #[test]
    fn strings_are_rdma_core_44s_and_unknown_values_say_unknown() {
        assert_eq!(text(ibv_wc_status_str(5)), "Work Request Flushed Error");
        assert_eq!(text(ibv_wc_status_str(24)), "unknown");
        assert_eq!(text(ibv_wc_status_str(-1)), "unknown");
        assert_eq!(text(ibv_node_type_str(1)), "InfiniBand channel adapter");
        assert_eq!(text(ibv_node_type_str(0)), "unknown");
        assert_eq!(text(ibv_port_state_str(4)), "active");
        assert_eq!(text(ibv_event_type_str(19)), "WQ fatal");
        assert_eq!(text(ibv_event_type_str(20)), "unknown");
    }

    #[test]
    fn rate_conversions_round_trip() {
        assert_eq!(ibv_rate_to_mult(3), 4);
        assert_eq!(mult_to_ibv_rate(4), 3);
        assert_eq!(ibv_rate_to_mult(11), -1);
        assert_eq!(ibv_rate_to_mbps(16), 103125);
        assert_eq!(mbps_to_ibv_rate(103125), 16);
        assert_eq!(mbps_to_ibv_rate(1), 0);
    }
}
