//! Who owns every pointer that crosses the C boundary, and the one place raw pointers from
//! C become Rust references.
//!
//! | C type | what the pointer points into | allocated by | freed by | notes |
//! |---|---|---|---|---|
//! | `struct ibv_device *` | [`DeviceEntry::ibv_device`] of the process's one device | first `ibv_get_device_list` | never (lives for the process, like rdma-core's device objects) | pointers stay valid after `ibv_free_device_list` |
//! | `struct ibv_device **` (the list) | a `Box<[*mut ibv_device]>` (NULL-terminated) | `ibv_get_device_list` | `ibv_free_device_list` | [`DeviceList`] |
//! | `struct ibv_context *` | [`ContextBlock::verbs`]`.context` (offset 320 of the block) | `ibv_open_device`, `ibv_import_device` | `ibv_close_device` | the block begins with the full `verbs_context`, so `ctx - 320` is the extended context (reference §3.2); its `cmd_fd` is the block's own descriptor, closed with it |
//! | `struct ibv_pd *` | a [`PdBlock`] (a [`Block`]: the C struct at offset 0) | `ibv_alloc_pd`, `ibv_alloc_parent_domain`, `ibv_import_pd` | `ibv_dealloc_pd` (the PD too), `ibv_unimport_pd` (the struct only) | a parent domain's `handle` is its PD's; several structs may name one PD (imports) |
//! | `struct ibv_td *` | a [`TdBlock`](crate::pd::TdBlock) | `ibv_alloc_td` | `ibv_dealloc_td` | |
//! | `struct ibv_comp_channel *` | a [`ChannelBlock`] | `ibv_create_comp_channel` | `ibv_destroy_comp_channel` | its `fd` is the [`CompletionChannel`]'s fd (an epoll set), owned by the channel |
//! | `struct ibv_cq *`, `struct ibv_cq_ex *` | a [`CqBlock`](crate::cq::CqBlock) (an `ibv_cq_ex` for both kinds) | `ibv_create_cq`, `ibv_create_cq_ex` | `ibv_destroy_cq` | the CQ's user context is this pointer: events and `IBV_EVENT_CQ_ERR` name the CQ by it; listed in the [`Registry`] |
//! | `struct ibv_mr *` | an [`MrBlock`](crate::mr::MrBlock) | `ibv_reg_mr*`, `ibv_import_mr` | `ibv_dereg_mr` (the registration too), `ibv_unimport_mr` (the struct only) | several structs may name one registration (imports) |
//! | `struct ibv_qp *`, `struct ibv_qp_ex *` | a [`QpBlock`](crate::qp::QpBlock) (an `ibv_qp_ex` for both kinds) | `ibv_create_qp`, `ibv_create_qp_ex` | `ibv_destroy_qp` | listed in the [`Registry`] by QPN for async events; its destroy waits for their acknowledgement |
//! | `struct ibv_srq *` | an [`SrqBlock`](crate::srq::SrqBlock) | `ibv_create_srq` | `ibv_destroy_srq` | listed in the [`Registry`] by handle |
//! | `struct ibv_ah *` | an [`AhBlock`](crate::ah::AhBlock) | `ibv_create_ah*` | `ibv_destroy_ah` | |
//! | `const char *` from `*_str`, `ibv_get_device_name`, `ibv_get_sysfs_path` | static data | – | never | |
//!
//! Every block carries a magic number checked on entry: a pointer that is not one of ours
//! (or was already freed and reused for something else) is refused with `EINVAL` where a
//! check is possible. It is a best-effort guard, not a guarantee: C callers must still pass
//! pointers the library gave them, as libibverbs requires.
//!
//! # The handle contract
//!
//! Every exported function that takes an object pointer states in its `# Safety` that the
//! pointer is "NULL or a live X": C got it from the library's create call and has not yet
//! passed it to the matching destroy. That is the caller's promise (libibverbs makes the
//! same one); the library cannot check liveness, only the block's magic number. Two
//! functions turn such a pointer into the library's state, and they are the only places
//! that dereference one:
//!
//! - [`Block::state`] for every object kind (PD, channel, CQ, QP, SRQ, MR, AH), taking the
//!   pointer as C holds it (an `ibv_cq *` or an `ibv_cq_ex *` alike: see [`Prefix`]);
//! - [`ContextBlock::from_ptr`] for contexts, whose C struct sits inside the block.
//!
//! Their `# Safety` sections are the audit of that conversion; a call site's `// SAFETY:`
//! only names where its pointer's promise comes from (its own `# Safety`, or a live object
//! that holds the pointer).
//!
//! Objects are reached through `&` only (never `&mut`) once handed to C, because C may call
//! from several threads at once; mutable state lives behind the device's own locks.

use crate::abi::*;
use crate::boundary::{errno_of, Errno};
use softverbs::core::cq::CompletionChannel;
use softverbs::core::device::{Device, DeviceConfig};
use std::ffi::c_char;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The name of the one device.
pub const DEVICE_NAME: &str = "softverbs0";

const CONTEXT_MAGIC: u64 = u64::from_be_bytes(*b"svctx\0\0\x01");
const PD_MAGIC: u64 = u64::from_be_bytes(*b"svpd\0\0\0\x01");
const CHANNEL_MAGIC: u64 = u64::from_be_bytes(*b"svchan\0\x01");

/// The process's soft device and the `struct ibv_device` that names it.
#[repr(C)]
pub struct DeviceEntry {
    /// What `ibv_get_device_list` hands out.
    pub ibv_device: ibv_device,
    /// The device runtime.
    pub device: Device,
    /// Node GUID (host order).
    pub node_guid: u64,
}

// SAFETY: `ibv_device` holds only byte arrays, integers and `None` function pointers; the
// device runtime is `Sync`. The entry is never mutated after creation.
unsafe impl Sync for DeviceEntry {}
// SAFETY: as above.
unsafe impl Send for DeviceEntry {}

impl DeviceEntry {
    /// The pointer C sees.
    pub fn as_ptr(&'static self) -> *mut ibv_device {
        std::ptr::from_ref(&self.ibv_device).cast_mut()
    }
}

fn copy_c_string(dst: &mut [c_char], src: &str) {
    let n = src.len().min(dst.len() - 1);
    for (d, s) in dst.iter_mut().zip(src.bytes().take(n)) {
        *d = s as c_char;
    }
    dst[n] = 0;
}

static DEVICE: Mutex<Option<&'static DeviceEntry>> = Mutex::new(None);

/// Says once per process, as one line on stderr, why the device could not open: a C
/// program sees only the errno (`Failed to get IB devices list: Invalid argument`), while
/// the device's message names the variable and what is wrong with it.
fn say_why_not_opened(why: &dyn std::fmt::Display) {
    use std::io::Write;
    static SAID: AtomicBool = AtomicBool::new(false);
    // Relaxed: the flag guards only itself (one swap decides who speaks), nothing is
    // published through it.
    if SAID.swap(true, Ordering::Relaxed) {
        return;
    }
    let line = why.to_string().replace('\n', " ");
    // Nothing to do if stderr is gone: the errno still says that the device failed.
    let _ = writeln!(std::io::stderr(), "softverbs: {line}");
}

/// The process's device, opened on first use from the environment (`SOFTVERBS_ADDR`, else
/// the first free 127.0.0.x, port 4791). A failure is returned (and retried next call),
/// and said on stderr the first time (`say_why_not_opened`).
pub fn device_entry() -> Result<&'static DeviceEntry, Errno> {
    let mut slot = DEVICE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(entry) = *slot {
        return Ok(entry);
    }
    // The library's first use: logs as SOFTVERBS_LOG / RUST_LOG ask, from the opening on.
    crate::stats::start_logging();
    // As the safe API opens it: SOFTVERBS_NETWORK, SOFTVERBS_ADDR, SOFTVERBS_PCAP,
    // SOFTVERBS_FAULTS.
    let config = DeviceConfig::from_env().map_err(|e| {
        say_why_not_opened(&e);
        e.raw_os_error().unwrap_or(libc::EINVAL)
    })?;
    let device = Device::open(config).map_err(|e| {
        say_why_not_opened(&e);
        errno_of(e)
    })?;
    let node_guid = device.query_device().node_guid;
    let mut ibv = ibv_device {
        _ops: _ibv_device_ops::default(),
        node_type: IBV_NODE_CA,
        transport_type: IBV_TRANSPORT_IB,
        name: [0; 64],
        dev_name: [0; 64],
        dev_path: [0; 256],
        ibdev_path: [0; 256],
    };
    copy_c_string(&mut ibv.name, device.name());
    copy_c_string(&mut ibv.dev_name, device.name());
    // No sysfs entry exists for a soft device; these paths name where one would be, and
    // `ibv_read_sysfs_file` under them fails with ENOENT.
    copy_c_string(
        &mut ibv.dev_path,
        &format!("/sys/class/infiniband_verbs/{}", device.name()),
    );
    copy_c_string(
        &mut ibv.ibdev_path,
        &format!("/sys/class/infiniband/{}", device.name()),
    );
    let entry: &'static DeviceEntry = Box::leak(Box::new(DeviceEntry {
        ibv_device: ibv,
        device,
        node_guid,
    }));
    *slot = Some(entry);
    drop(slot);
    // A program may leave without closing its context: the capture is flushed at exit too.
    // SAFETY: registers a function with no preconditions; a failure (the table is full)
    // only loses that flush.
    unsafe { libc::atexit(flush_at_exit) };
    Ok(entry)
}

/// At exit: held ACKs are sent, the counters report if no `ibv_close_device` gave one, and the capture is
/// closed (packets the progress thread handles while the process ends are not recorded,
/// so the file never ends in a half-written record).
extern "C" fn flush_at_exit() {
    let slot = DEVICE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(entry) = *slot {
        crate::boundary::infallible((), || {
            // ACKs held for a post that will not come leave before the process does.
            entry.device.send_held_acks();
            crate::stats::report_once_at_exit(&entry.device);
            if let Err(e) = entry.device.close_capture() {
                eprintln!("softverbs: cannot write the packet capture: {e}");
            }
        });
    }
}

/// The entry for a `struct ibv_device *` C passed in: `ENODEV` unless it is ours.
pub fn device_from_ptr(device: *mut ibv_device) -> Result<&'static DeviceEntry, Errno> {
    if device.is_null() {
        return Err(libc::EINVAL);
    }
    let slot = DEVICE.lock().unwrap_or_else(|e| e.into_inner());
    match *slot {
        Some(entry) if entry.as_ptr() == device => Ok(entry),
        _ => Err(libc::ENODEV),
    }
}

/// A NULL-terminated device list (`ibv_get_device_list`).
pub struct DeviceList;

impl DeviceList {
    /// Allocates the list for C: `devices` followed by `NULL`.
    pub fn into_raw(devices: &[*mut ibv_device]) -> *mut *mut ibv_device {
        let mut list: Vec<*mut ibv_device> = devices.to_vec();
        list.push(std::ptr::null_mut());
        Box::into_raw(list.into_boxed_slice()).cast()
    }

    /// Frees a list from [`DeviceList::into_raw`].
    ///
    /// # Safety
    ///
    /// `list` came from [`DeviceList::into_raw`] and is freed once.
    pub unsafe fn free(list: *mut *mut ibv_device) {
        let mut len = 0;
        // SAFETY: the list is NULL-terminated (into_raw put the NULL there) and readable.
        while !unsafe { *list.add(len) }.is_null() {
            len += 1;
        }
        let slice = std::ptr::slice_from_raw_parts_mut(list, len + 1);
        // SAFETY: the same allocation `into_raw` leaked, with its length.
        drop(unsafe { Box::from_raw(slice) });
    }
}

/// An open context: the full `verbs_context` (the application holds a pointer to its
/// `context` member) followed by private state.
#[repr(C)]
pub struct ContextBlock {
    /// The extended context; `verbs.context` is what C sees.
    pub verbs: verbs_context,
    magic: u64,
    /// The device it was opened on.
    pub entry: &'static DeviceEntry,
    /// The context's command descriptor (`verbs.context.cmd_fd`), closed with the context:
    /// a descriptor of the device's ([`crate::device::CommandFd`]).
    _cmd_fd: OwnedFd,
}

impl ContextBlock {
    /// Allocates a context block for `entry` whose `cmd_fd` is `cmd_fd` (owned by the
    /// context from now on); `verbs` holds the C-visible parts.
    pub fn allocate(
        entry: &'static DeviceEntry,
        verbs: verbs_context,
        cmd_fd: OwnedFd,
    ) -> *mut ibv_context {
        let block = Box::into_raw(Box::new(ContextBlock {
            verbs,
            magic: CONTEXT_MAGIC,
            entry,
            _cmd_fd: cmd_fd,
        }));
        // SAFETY: `block` is a live allocation; the field projection stays inside it.
        unsafe { &raw mut (*block).verbs.context }
    }

    /// The block of a context pointer from C: `EINVAL` for NULL or a block that does not
    /// carry the context magic number.
    ///
    /// # Safety
    ///
    /// The handle contract (module documentation): `ctx` is NULL or a pointer
    /// `ibv_open_device` returned that C has not passed to `ibv_close_device`, and the
    /// reference is not used after that close. Such a pointer is the `verbs.context` member
    /// of a live [`ContextBlock`] allocated by [`ContextBlock::allocate`].
    pub unsafe fn from_ptr<'a>(ctx: *mut ibv_context) -> Result<&'a ContextBlock, Errno> {
        if ctx.is_null() {
            return Err(libc::EINVAL);
        }
        let offset = std::mem::offset_of!(verbs_context, context);
        // SAFETY: by the handle contract `ctx` is the `verbs.context` member of a live
        // `ContextBlock` (not NULL: checked above), which begins `offset` bytes earlier; the
        // block is only read through `&` (C writes its own fields through the pointer, and
        // the magic number and `entry` are never written after `allocate`).
        let block = unsafe { &*ctx.byte_sub(offset).cast::<ContextBlock>() };
        if block.magic != CONTEXT_MAGIC {
            return Err(libc::EINVAL);
        }
        Ok(block)
    }

    /// Frees a context block.
    ///
    /// # Safety
    ///
    /// `ctx` passed [`ContextBlock::from_ptr`] and is not used again by anyone.
    pub unsafe fn free(ctx: *mut ibv_context) {
        let offset = std::mem::offset_of!(verbs_context, context);
        // SAFETY: the allocation `allocate` made, recovered from its `context` member.
        let mut block = unsafe { Box::from_raw(ctx.byte_sub(offset).cast::<ContextBlock>()) };
        block.magic = 0;
        drop(block);
    }
}

/// The library's part of a protection domain: for a parent domain, what
/// `ibv_alloc_parent_domain` gave (the device keeps which objects are in a PD).
#[derive(Default)]
pub struct PdState {
    /// Set for a parent domain ([`crate::pd`]).
    pub domain: Option<crate::pd::ParentDomain>,
}

impl Tagged for PdState {
    const MAGIC: u64 = PD_MAGIC;
}

/// A protection domain as C sees it, followed by its state.
pub type PdBlock = Block<ibv_pd, PdState>;

/// The library's part of a completion channel.
pub struct ChannelState {
    /// The channel (its fd is the C struct's `fd`).
    pub inner: CompletionChannel,
}

impl Tagged for ChannelState {
    const MAGIC: u64 = CHANNEL_MAGIC;
}

/// A completion channel as C sees it, followed by its state.
pub type ChannelBlock = Block<ibv_comp_channel, ChannelState>;

/// The state every object block carries after the C struct: its magic number.
pub trait Tagged {
    /// The magic number blocks of this kind carry (never 0: freed blocks are zeroed).
    const MAGIC: u64;
}

/// A C struct that a block's C struct `C` begins with, so that C may name the block by a
/// pointer to either: `struct ibv_qp *` and `struct ibv_qp_ex *` name the same QP block,
/// `struct ibv_cq *` and `struct ibv_cq_ex *` the same CQ block. Every type begins with
/// itself.
///
/// # Safety
///
/// A `*mut Self` pointing at the start of a `C` is a `*mut C`: `C` is `#[repr(C)]` and its
/// first `size_of::<Self>()` bytes are a `Self` (checked against the header by
/// `tests/abi_layout.rs`).
pub unsafe trait Prefix<C> {}

// SAFETY: a type begins with itself.
unsafe impl<T> Prefix<T> for T {}
// SAFETY: `qp_base`, an `ibv_qp`, is the first member of `#[repr(C)]` `ibv_qp_ex`.
unsafe impl Prefix<ibv_qp_ex> for ibv_qp {}
// SAFETY: `ex`, an `ibv_qp_ex` (which begins with its `ibv_qp`), is the first member of
// `#[repr(C)]` `ibv_qp_ex_45`.
unsafe impl Prefix<ibv_qp_ex_45> for ibv_qp_ex {}
// SAFETY: as above, through `ibv_qp_ex`'s first member.
unsafe impl Prefix<ibv_qp_ex_45> for ibv_qp {}
// SAFETY: `ibv_cq_ex` begins with the 128 bytes of `ibv_cq`, field for field (both
// mirrors are checked against `verbs.h` by `tests/abi_layout.rs`).
unsafe impl Prefix<ibv_cq_ex> for ibv_cq {}

/// An object handed to C: the C struct `C` first (C holds a pointer to it), then a magic
/// number, then the library's state `S`.
///
/// C owns the fields of `C` (it may read and write them at any time), so the library
/// reaches them only through the raw pointer; [`Block::state`] hands out the Rust part.
#[repr(C)]
pub struct Block<C, S: Tagged> {
    c: C,
    magic: u64,
    state: S,
}

impl<C, S: Tagged> Block<C, S> {
    /// Allocates a block; the pointer C sees.
    pub fn allocate(c: C, state: S) -> *mut C {
        Box::into_raw(Box::new(Block {
            c,
            magic: S::MAGIC,
            state,
        }))
        .cast()
    }

    /// The state of an object pointer from C (a `*mut C`, or a pointer to a struct `C`
    /// begins with: [`Prefix`]): `EINVAL` for NULL or a pointer whose block does not carry
    /// this kind's magic number.
    ///
    /// This is the one conversion of an object pointer from C; the magic number check is
    /// the only check it makes.
    ///
    /// # Safety
    ///
    /// The handle contract (module documentation): `ptr` is NULL or a pointer
    /// [`Block::allocate`] returned for this `C`/`S` (C got it from the object's create
    /// call) that has not been passed to [`Block::free`] (C has not destroyed the object),
    /// and the returned state is not used after the block is freed. The C caller owns the
    /// pointer and makes this promise in every exported function's `# Safety`.
    pub unsafe fn state<'a, P: Prefix<C>>(ptr: *mut P) -> Result<&'a S, Errno> {
        if ptr.is_null() {
            return Err(libc::EINVAL);
        }
        // `Prefix`: a pointer to the `P` a `C` begins with is a pointer to the `C`, which
        // is the start of the block (offset 0 of `#[repr(C)]` `Block`).
        let block = ptr.cast::<Self>();
        // SAFETY: by the handle contract `block` is a live allocation of this `Block`; the
        // magic number and the state are the library's own fields, which C never writes
        // and the library writes only in `allocate` and `free` (so `&` to the state is
        // sound while the block lives).
        unsafe {
            if (&raw const (*block).magic).read() != S::MAGIC {
                return Err(libc::EINVAL);
            }
            Ok(&(*block).state)
        }
    }

    /// Frees a block, dropping its state.
    ///
    /// # Safety
    ///
    /// `ptr` passed [`Block::state`], no reference to its state is alive, and nobody uses
    /// the pointer again (C gave it up by calling the destroy).
    pub unsafe fn free<P: Prefix<C>>(ptr: *mut P) {
        // SAFETY: `ptr` is the start of the block `allocate` leaked (it passed `state`;
        // `Prefix` makes it a pointer to the block), and nobody uses it again.
        let mut block = unsafe { Box::from_raw(ptr.cast::<Self>()) };
        block.magic = 0;
        drop(block);
    }
}

/// C objects the device names in asynchronous events (QPs by QPN, SRQs by handle, CQs by
/// their pointer) and the pointers C knows them by, so `ibv_get_async_event` can fill
/// `event.element`; and the ledger of delivered, unacknowledged events per object, which
/// a destroy waits on (`ibv_get_async_event(3)`: "destroying an object (CQ, SRQ or QP)
/// will wait for all affiliated events for the object to be acknowledged").
#[derive(Default)]
pub struct Registry {
    /// QPN → `struct ibv_qp *`.
    pub qps: std::collections::HashMap<u32, usize>,
    /// SRQ handle → `struct ibv_srq *`.
    pub srqs: std::collections::HashMap<u32, usize>,
    /// Live `struct ibv_cq *`s.
    pub cqs: std::collections::HashSet<usize>,
    /// Object pointer → async events `ibv_get_async_event` delivered naming it and
    /// `ibv_ack_async_event` has not acknowledged yet (absent: none).
    pub unacked: std::collections::HashMap<usize, u32>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

/// How long a destroy waits for delivered events (completion or async) to be
/// acknowledged. libibverbs waits forever; a day is forever for a test and still lets a
/// stuck program be diagnosed.
pub const DESTROY_ACK_WAIT: Duration = Duration::from_secs(24 * 3600);

/// Signalled by every acknowledgement of an async event.
static ACKNOWLEDGED: Condvar = Condvar::new();

/// Runs `f` on the process's registry.
pub fn with_registry<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    let mut slot = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    f(slot.get_or_insert_with(Registry::default))
}

/// Counts an async event naming `object` as acknowledged (and wakes the destroys waiting
/// for it); `false` if no delivered event of `object` was outstanding.
pub fn acknowledge(object: usize) -> bool {
    with_registry(|r| {
        let Some(n) = r.unacked.get_mut(&object) else {
            return false;
        };
        *n -= 1;
        if *n == 0 {
            r.unacked.remove(&object);
        }
        ACKNOWLEDGED.notify_all();
        true
    })
}

/// Waits until every async event delivered naming `object` is acknowledged, then runs `f`
/// on the registry under the same lock (so no event for it is delivered in between: `f`
/// removes the object). `EBUSY` if `limit` passes first (libibverbs waits forever).
pub fn once_acknowledged<T>(
    object: usize,
    limit: Duration,
    f: impl FnOnce(&mut Registry) -> T,
) -> Result<T, Errno> {
    let deadline = Instant::now() + limit;
    let mut slot = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let registry = slot.get_or_insert_with(Registry::default);
        if !registry.unacked.contains_key(&object) {
            return Ok(f(registry));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(libc::EBUSY);
        }
        slot = ACKNOWLEDGED
            .wait_timeout(slot, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}
