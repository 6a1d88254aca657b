//! Devices and contexts: the device list, open/close, and every query of the device, the
//! port, the GID and P_Key tables, plus the extended-context ops the `verbs.h` inlines
//! reach (`query_port`, `query_device_ex`, `query_rt_values`).
//!
//! There is one device per process, `softverbs0`, opened on the first
//! `ibv_get_device_list` with its address from the environment (`SOFTVERBS_ADDR`, else the
//! first free 127.0.0.x). It reports: node type CA, transport IB, link layer Ethernet
//! (RoCEv2; GIDs below), port 1
//! ACTIVE / LinkUp, MTU per the device, vendor id 0xffffff, part 0 (outside perftest's
//! vendor tables), a 1 GHz device clock with a full 64-bit completion timestamp mask.
//!
//! The GID table is laid out as kernel rxe lays out a port's (RoCEv2 entries): index 0 the
//! IPv6 link-local GID, made from the device's address (`fe80::ffff:a.b.c.d`), index 1 the
//! address (`::ffff:a.b.c.d`, or the IPv6 address); `gid_tbl_len` counts them, and every
//! entry's `ndev_ifindex` is the interface holding the address (`lo` for 127.0.0.0/8).
//! Both indexes reach another softverbs device (`-g 0` and `-g 1`); a kernel rxe peer
//! reaches index 1.
//!
//! | function | version | status |
//! |---|---|---|
//! | `ibv_get_device_list`, `ibv_free_device_list`, `ibv_get_device_guid` | 1.1 | real |
//! | `ibv_get_device_name` | 1.1 | real: the struct's `name`, as rdma-core reads it, for any `struct ibv_device` |
//! | `ibv_get_device_index` | 1.9 | real (0) |
//! | `ibv_open_device`, `ibv_close_device` | 1.1 | real: an extended context (`abi_compat = UINTPTR_MAX`, `sz = 648`), its `cmd_fd` a command descriptor of the device ([`CommandFd`]); with `SOFTVERBS_STATS` set, closing reports the device's counters ([`STATS_ENV`]; at exit if no context was closed) |
//! | `ibv_import_device` | 1.10 | real in the process that opened the device (a `dup` of `cmd_fd`, or one passed back to it); `NULL`, `ENODEV` for a descriptor from another process, `EINVAL` for one that is not a device's ([`CommandFd`]) |
//! | `ibv_query_device`, `ibv_query_port` (48-byte legacy write), `ibv_query_gid`, `ibv_query_pkey` | 1.1 | real |
//! | `ibv_get_pkey_index` | 1.5 | real (the one P_Key, 0xffff, is index 0) |
//! | `_ibv_query_gid_ex`, `_ibv_query_gid_table` | 1.11 | real |
//! | `ibv_query_gid_type` | PRIVATE_34 | real (RoCE v2) |
//! | `verbs_context.query_port` / `.query_device_ex` / `.query_rt_values` | (ops) | real |

use crate::abi::*;
use crate::boundary::{errno_code, errno_of, infallible, minus_one, pointer, Errno};
use crate::handles::{device_entry, device_from_ptr, ContextBlock, DeviceEntry, DeviceList};
use crate::verbs_h::{
    IBV_ATOMIC_HCA, IBV_ATOMIC_NONE, IBV_DEVICE_PORT_ACTIVE_EVENT, IBV_DEVICE_RC_RNR_NAK_GEN,
    IBV_DEVICE_SYS_IMAGE_GUID, IBV_GID_TYPE_ROCE_V2, IBV_GID_TYPE_SYSFS_ROCE_V2,
    IBV_LINK_LAYER_ETHERNET, IBV_PORT_ACTIVE, IBV_PORT_IP_BASED_GIDS, IBV_VALUES_MASK_RAW_CLOCK,
};

// `enum ib_uverbs_device_cap_flags` bits of `device_cap_flags_ex` (`rdma/ib_user_ioctl_verbs.h`
// of kernel ≥ 6.2 / rdma-core ≥ 45); Debian 12's rdma-core 44 headers do not name them, so
// they are not in `verbs_h.rs` (whose constants a test checks against the installed headers).
/// `IB_UVERBS_DEVICE_FLUSH_GLOBAL`.
const IB_UVERBS_DEVICE_FLUSH_GLOBAL: u64 = 1 << 38;
/// `IB_UVERBS_DEVICE_FLUSH_PERSISTENT`.
const IB_UVERBS_DEVICE_FLUSH_PERSISTENT: u64 = 1 << 39;
/// `IB_UVERBS_DEVICE_ATOMIC_WRITE`.
const IB_UVERBS_DEVICE_ATOMIC_WRITE: u64 = 1 << 40;
use softverbs::core::cq::DeviceClock;
use std::ffi::{c_char, c_int, c_void};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

/// The firmware version string reported: the crate version.
const FW_VER: &str = env!("CARGO_PKG_VERSION");

/// The one port.
const PORT: u32 = 1;

/// The default (full-membership) P_Key, the only entry of the P_Key table.
const DEFAULT_PKEY: u16 = 0xffff;

fn device_attr(entry: &DeviceEntry) -> ibv_device_attr {
    let d = entry.device.query_device();
    let clamp = |v: u32| v.min(i32::MAX as u32) as c_int;
    let mut fw_ver = [0 as c_char; 64];
    for (dst, src) in fw_ver.iter_mut().zip(FW_VER.bytes()) {
        *dst = src as c_char;
    }
    ibv_device_attr {
        fw_ver,
        node_guid: d.node_guid.to_be(),
        sys_image_guid: d.node_guid.to_be(),
        max_mr_size: d.max_mr_size,
        page_size_cap: d.page_size_cap,
        vendor_id: d.vendor_id,
        vendor_part_id: d.vendor_part_id,
        hw_ver: 0,
        max_qp: clamp(d.max_qp),
        max_qp_wr: clamp(d.max_qp_wr),
        device_cap_flags: IBV_DEVICE_PORT_ACTIVE_EVENT
            | IBV_DEVICE_SYS_IMAGE_GUID
            | IBV_DEVICE_RC_RNR_NAK_GEN
            | IBV_DEVICE_MEM_WINDOW
            | IBV_DEVICE_MEM_WINDOW_TYPE_2B,
        max_sge: clamp(d.max_sge),
        max_sge_rd: clamp(d.max_sge),
        max_cq: clamp(d.max_cq),
        max_cqe: clamp(d.max_cqe),
        max_mr: clamp(d.max_mr),
        max_pd: clamp(d.max_pd),
        max_qp_rd_atom: c_int::from(d.max_qp_rd_atom),
        max_ee_rd_atom: 0,
        max_res_rd_atom: clamp(d.max_qp.saturating_mul(u32::from(d.max_qp_rd_atom))),
        max_qp_init_rd_atom: c_int::from(d.max_qp_init_rd_atom),
        max_ee_init_rd_atom: 0,
        atomic_cap: if d.atomic_cap_hca {
            IBV_ATOMIC_HCA
        } else {
            IBV_ATOMIC_NONE
        },
        max_ee: 0,
        max_rdd: 0,
        max_mw: clamp(d.max_mw),
        max_raw_ipv6_qp: 0,
        max_raw_ethy_qp: 0,
        max_mcast_grp: clamp(d.max_mcast_grp),
        max_mcast_qp_attach: clamp(d.max_mcast_qp_attach),
        max_total_mcast_qp_attach: clamp(d.max_total_mcast_qp_attach),
        max_ah: clamp(d.max_qp),
        max_fmr: 0,
        max_map_per_fmr: 0,
        max_srq: clamp(d.max_srq),
        max_srq_wr: clamp(d.max_srq_wr),
        max_srq_sge: clamp(d.max_srq_sge),
        max_pkeys: 1,
        local_ca_ack_delay: 15,
        phys_port_cnt: d.phys_port_cnt,
    }
}

fn device_attr_ex(entry: &DeviceEntry) -> ibv_device_attr_ex {
    let d = entry.device.query_device();
    ibv_device_attr_ex {
        orig_attr: device_attr(entry),
        comp_mask: 0,
        // ibv_query_device_ex(3): the core's on-demand paging capabilities.
        odp_caps: ibv_odp_caps {
            general_caps: d.odp.general,
            per_transport_caps: ibv_odp_per_transport_caps {
                rc_odp_caps: d.odp.rc,
                uc_odp_caps: d.odp.uc,
                ud_odp_caps: d.odp.ud,
            },
        },
        completion_timestamp_mask: d.completion_timestamp_mask,
        hca_core_clock: d.hca_core_clock_khz,
        // IBTA 1.5 (the kernel's IB_UVERBS_DEVICE_FLUSH_GLOBAL / _PERSISTENT /
        // _ATOMIC_WRITE, bits 38–40, as rxe reports them): FLUSH of both placement types
        // (persistent = a memory fence: there is no persistent memory) and ATOMIC WRITE.
        device_cap_flags_ex: u64::from(device_attr(entry).device_cap_flags)
            | IB_UVERBS_DEVICE_FLUSH_GLOBAL
            | IB_UVERBS_DEVICE_FLUSH_PERSISTENT
            | IB_UVERBS_DEVICE_ATOMIC_WRITE,
        tso_caps: ibv_tso_caps::default(),
        rss_caps: ibv_rss_caps::default(),
        max_wq_type_rq: 0,
        packet_pacing_caps: ibv_packet_pacing_caps::default(),
        raw_packet_caps: 0,
        tm_caps: ibv_tm_caps::default(),
        cq_mod_caps: ibv_cq_moderation_caps::default(),
        max_dm_size: 0,
        pci_atomic_caps: ibv_pci_atomic_caps::default(),
        xrc_odp_caps: 0,
        phys_port_cnt_ex: u32::from(d.phys_port_cnt),
    }
}

fn port_attr(entry: &DeviceEntry) -> ibv_port_attr {
    let p = entry.device.port_attr();
    ibv_port_attr {
        state: if p.active { IBV_PORT_ACTIVE } else { 1 },
        max_mtu: p.max_mtu.to_raw(),
        active_mtu: p.active_mtu.to_raw(),
        gid_tbl_len: p.gid_tbl_len as c_int,
        port_cap_flags: IBV_PORT_IP_BASED_GIDS,
        max_msg_sz: 1 << 31,
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: 1,
        lid: 0,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        // 4X EDR: what `ibv_devinfo` prints as 100 Gb/s; a soft device has no real rate.
        active_width: 2,
        active_speed: 32,
        phys_state: 5,
        link_layer: if p.link_layer_ethernet {
            IBV_LINK_LAYER_ETHERNET
        } else {
            1
        },
        flags: 0,
        port_cap_flags2: 0,
    }
}

/// Writes `value` into a caller struct of `len` bytes: `min(len, size_of::<T>())` bytes
/// of `value`, zeros for the rest (newer headers append fields; reference §3.2).
///
/// # Safety
///
/// `out` is valid for writes of `len` bytes.
unsafe fn write_sized<T: Copy>(out: *mut T, len: usize, value: &T) {
    let ours = std::mem::size_of::<T>();
    let n = len.min(ours);
    // SAFETY: `value` is readable for `ours >= n` bytes; `out` writable for `len >= n`;
    // the two cannot overlap (`value` is a local of the caller).
    unsafe {
        std::ptr::copy_nonoverlapping(std::ptr::from_ref(value).cast::<u8>(), out.cast::<u8>(), n)
    };
    if len > ours {
        // SAFETY: bytes `ours..len` of `out` are inside the caller's `len` bytes.
        unsafe { std::ptr::write_bytes(out.cast::<u8>().add(ours), 0, len - ours) };
    }
}

/// The device's port rule (only port 1 exists), for the verbs that name a port.
fn check_port(entry: &DeviceEntry, port: u32) -> Result<(), Errno> {
    entry.device.query_port(port).map(drop).map_err(errno_of)
}

/// `ibv_get_device_list(3)`: the one soft device. Returns `NULL` with `errno` when the
/// device cannot be opened (bad `SOFTVERBS_ADDR`, no free address).
///
/// # Safety
///
/// `num_devices` is NULL or writable.
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    pointer(|| {
        let entry = device_entry()?;
        if !num_devices.is_null() {
            // SAFETY: `num_devices` is writable (this function's `# Safety`; not NULL here).
            unsafe { *num_devices = 1 };
        }
        Ok(DeviceList::into_raw(&[entry.as_ptr()]))
    })
}
symver!(ibv_get_device_list, "IBVERBS_1.1");

/// `ibv_free_device_list(3)`. The devices themselves stay valid.
///
/// # Safety
///
/// `list` is NULL or came from `ibv_get_device_list` and is freed once.
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    infallible((), || {
        if !list.is_null() {
            // SAFETY: `list` came from `ibv_get_device_list` and is freed once (this
            // function's `# Safety`; not NULL here), which is what `DeviceList::free` asks.
            unsafe { DeviceList::free(list) }
        }
    })
}
symver!(ibv_free_device_list, "IBVERBS_1.1");

/// `ibv_get_device_name(3)`: the `name` of the `struct ibv_device`, read from the struct
/// as rdma-core reads it (so a struct the program built itself names itself); `NULL` with
/// errno `EINVAL` for a NULL pointer.
///
/// # Safety
///
/// `device` is NULL or points to a `struct ibv_device` (from `ibv_get_device_list` or the
/// program's own).
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    pointer(|| {
        if device.is_null() {
            return Err(libc::EINVAL);
        }
        // The field's address, not its bytes: the caller reads the name.
        let name = device
            .cast::<u8>()
            .wrapping_add(std::mem::offset_of!(ibv_device, name));
        Ok(name.cast::<c_char>())
    })
}
symver!(ibv_get_device_name, "IBVERBS_1.1");

/// `ibv_get_device_guid(3)`: the node GUID in network byte order. 0 with errno `ENODEV`
/// for a `struct ibv_device` that is not the device's: rdma-core reads the GUID through
/// the provider's `verbs_device` around the struct (its sysfs entry), which a struct the
/// program built does not have, and answers 0 when it cannot read one.
///
/// # Safety
///
/// `device` is NULL or any pointer (only compared with the device's).
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    crate::boundary::guarded(|| Ok(device_from_ptr(device)?.node_guid.to_be())).unwrap_or_else(
        |e| {
            crate::boundary::set_errno(e);
            0
        },
    )
}
symver!(ibv_get_device_guid, "IBVERBS_1.1");

/// `ibv_get_device_index(3)`: 0 for our device; -1 for any other struct, as rdma-core
/// answers for a device without a sysfs entry (it reads the index from the provider's
/// `verbs_device` around the struct).
///
/// # Safety
///
/// `device` is NULL or any pointer (only compared with the device's).
pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    minus_one(|| device_from_ptr(device).map(|_| 0))
}
symver!(ibv_get_device_index, "IBVERBS_1.9");

/// `ibv_open_device(3)`: an extended context (reference §3.2): `abi_compat =
/// UINTPTR_MAX`, `sz = 648`, the ops the inlines call, `async_fd` the device's async
/// event fd, `cmd_fd` a new command descriptor of the device ([`CommandFd`]).
///
/// # Safety
///
/// `device` is NULL or a pointer C got from `ibv_get_device_list`.
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    pointer(|| {
        let entry = device_from_ptr(device)?;
        let cmd_fd = CommandFd::create(entry)?;
        Ok(new_context(entry, cmd_fd))
    })
}
symver!(ibv_open_device, "IBVERBS_1.1");

/// `ibv_import_device(3)`: a new context of the device whose command descriptor `cmd_fd`
/// is (a `dup` of a context's `cmd_fd`, or one received with `SCM_RIGHTS`). The context
/// is its own struct over the same device (the process's one device, which lives as long
/// as the process): closing it or the context the descriptor came from leaves the other
/// working. It owns `cmd_fd` from now on and `ibv_close_device` closes it, as
/// `ibv_import_device(3)` allows ("may cleanup ... including closing the command FD").
/// `NULL` with errno as [`CommandFd::device`] refuses: `EINVAL` for a descriptor that is
/// not open or not a device's, `ENODEV` for one naming a device of another process.
///
/// # Safety
///
/// None beyond C's: `cmd_fd` is any integer.
pub unsafe extern "C" fn ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    pointer(|| {
        let entry = CommandFd::device(cmd_fd)?;
        // SAFETY: `cmd_fd` is an open descriptor (`CommandFd::device` found it with
        // fstat) that the caller hands over to the context, as ibv_import_device(3) says.
        let owned = unsafe { OwnedFd::from_raw_fd(cmd_fd) };
        Ok(new_context(entry, owned))
    })
}
symver!(ibv_import_device, "IBVERBS_1.10");

/// A context of `entry` (the same for `ibv_open_device` and `ibv_import_device`) whose
/// command descriptor is `cmd_fd`.
fn new_context(entry: &'static DeviceEntry, cmd_fd: OwnedFd) -> *mut ibv_context {
    {
        let device = entry.as_ptr();
        let ops = ibv_context_ops {
            _compat_query_device: Some(ibv_query_device),
            _compat_query_port: Some(ibv_query_port),
            alloc_mw: Some(crate::mr::alloc_mw),
            bind_mw: Some(crate::mr::bind_mw),
            dealloc_mw: Some(crate::mr::dealloc_mw),
            poll_cq: Some(crate::cq::poll_cq),
            req_notify_cq: Some(crate::cq::req_notify_cq),
            post_srq_recv: Some(crate::srq::post_srq_recv),
            post_send: Some(crate::qp::post_send),
            post_recv: Some(crate::qp::post_recv),
            ..ibv_context_ops::default()
        };
        let context = ibv_context {
            device,
            ops,
            cmd_fd: cmd_fd.as_raw_fd(),
            async_fd: entry.device.async_events().as_fd().as_raw_fd(),
            num_comp_vectors: 1,
            mutex: PthreadMutex::default(),
            abi_compat: usize::MAX as *mut c_void,
        };
        let verbs = verbs_context {
            query_port: Some(query_port_ex),
            advise_mr: Some(crate::mr::advise_mr),
            alloc_null_mr: None,
            read_counters: None,
            attach_counters_point_flow: None,
            create_counters: None,
            destroy_counters: None,
            reg_dm_mr: None,
            alloc_dm: None,
            free_dm: None,
            modify_flow_action_esp: None,
            destroy_flow_action: None,
            create_flow_action_esp: None,
            modify_qp_rate_limit: None,
            alloc_parent_domain: Some(crate::pd::alloc_parent_domain),
            dealloc_td: Some(crate::pd::dealloc_td),
            alloc_td: Some(crate::pd::alloc_td),
            modify_cq: Some(crate::cq::modify_cq),
            post_srq_ops: None,
            destroy_rwq_ind_table: None,
            create_rwq_ind_table: None,
            destroy_wq: None,
            modify_wq: None,
            create_wq: None,
            query_rt_values: Some(query_rt_values),
            create_cq_ex: Some(crate::cq::create_cq_ex),
            priv_: std::ptr::null_mut(),
            query_device_ex: Some(query_device_ex),
            ibv_destroy_flow: None,
            ABI_placeholder2: None,
            ibv_create_flow: None,
            ABI_placeholder1: None,
            open_qp: None,
            create_qp_ex: Some(crate::qp::create_qp_ex),
            get_srq_num: None,
            create_srq_ex: None,
            open_xrcd: None,
            close_xrcd: None,
            _ABI_placeholder3: 0,
            sz: std::mem::size_of::<verbs_context>(),
            context,
        };
        ContextBlock::allocate(entry, verbs, cmd_fd)
    }
}

/// Command descriptors: what a context's `cmd_fd` is. A kernel device's is the open
/// `/dev/infiniband/uverbsN` file whose objects the context's handles name; ours is a
/// sealed memfd (`O_CLOEXEC`, named `softverbs-cmd`) that the device issues per context and
/// that says, in its few bytes, which process and device issued it. The process keeps a
/// table of the descriptors it issued by file identity, `(st_dev, st_ino)`, so a `dup`
/// of one, or one passed back over a socket, names the same device; the bytes (pid,
/// device, serial) are compared too, so a file that happens to reuse the identity of a
/// closed one names nothing. An entry stays while the process lives: a descriptor may
/// outlive the context it came from (`dup` it, close the context, import it), as a
/// kernel command file outlives its first context.
///
/// Across processes a descriptor cannot name the device: the device's state — its
/// objects, registered memory (addresses of the issuing process), queue pairs and their
/// progress thread — lives in the process that opened it, and a descriptor received with
/// `SCM_RIGHTS` (or inherited over `fork`, whose child has a copy of the memory but not
/// the threads) carries only the file. `ibv_import_device` then answers `ENODEV`, which
/// is what rdma-core answers for a descriptor that is a device file but names no device
/// of this process (`libibverbs/device.c`, `ibv_import_device`: no device's `sysfs_cdev`
/// equals the file's `st_rdev`); a descriptor that is not open or not a device's at all
/// is `EINVAL`, as there (`fstat` fails, or the file is not a character device).
pub struct CommandFd;

/// The first bytes of every command descriptor.
const COMMAND_FD_MAGIC: &str = "softverbs command descriptor 1\n";

/// One descriptor this process issued.
struct Issued {
    entry: &'static DeviceEntry,
    /// The process that issued it (a `fork` child has a copy of this table, not the
    /// device's threads).
    pid: u32,
    /// What its bytes say.
    record: String,
}

/// Descriptors issued by this process, by `(st_dev, st_ino)`.
static ISSUED: std::sync::Mutex<std::collections::BTreeMap<(u64, u64), Issued>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

fn last_errno() -> Errno {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// `fstat` of any descriptor number.
fn stat_of(fd: c_int) -> Result<libc::stat, Errno> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `fstat` writes a `struct stat` into the buffer, or fails (a bad descriptor is
    // EBADF, not undefined behaviour).
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return Err(last_errno());
    }
    // SAFETY: written by the successful fstat.
    Ok(unsafe { st.assume_init() })
}

/// A file's identity: `(st_dev, st_ino)`, the same for every descriptor of it.
fn identity(st: &libc::stat) -> (u64, u64) {
    (st.st_dev, st.st_ino)
}

impl CommandFd {
    /// A new command descriptor of `entry`'s device, recorded as issued by this process.
    pub fn create(entry: &'static DeviceEntry) -> Result<OwnedFd, Errno> {
        use std::io::Write;
        // SAFETY: a literal C string and flags; returns a new descriptor or -1.
        let raw = unsafe {
            libc::memfd_create(
                c"softverbs-cmd".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(last_errno());
        }
        // SAFETY: a descriptor memfd_create just returned, owned by nobody else.
        let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(raw) });
        static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        // Relaxed: the counter only has to give distinct values.
        let serial = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let record = format!(
            "{COMMAND_FD_MAGIC}pid {pid}\ndevice {}\nserial {serial}\n",
            entry.device.name()
        );
        file.write_all(record.as_bytes())
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        let seals =
            libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
        // SAFETY: adds seals to our own memfd; no memory is passed.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(last_errno());
        }
        let st = stat_of(file.as_raw_fd())?;
        ISSUED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(identity(&st), Issued { entry, pid, record });
        Ok(OwnedFd::from(file))
    }

    /// The device a descriptor names (`ibv_import_device(3)`): one this process issued
    /// (or a `dup` of one). `EINVAL` for a descriptor that is not open or not a command
    /// descriptor (nor a device file); `ENODEV` for a command descriptor of another
    /// process (or of this process's parent, before a `fork`) and for any other
    /// character device, as rdma-core answers (the type documentation above).
    pub fn device(fd: c_int) -> Result<&'static DeviceEntry, Errno> {
        let st = stat_of(fd).map_err(|_| libc::EINVAL)?;
        let mut bytes = [0u8; 256];
        // A command descriptor is a regular file (a memfd); nothing else is read (a device
        // file's read may block or have effects).
        let n = if st.st_mode & libc::S_IFMT == libc::S_IFREG {
            // SAFETY: reads at most `bytes.len()` bytes into the buffer, at offset 0
            // (the descriptor's own offset is not moved).
            unsafe { libc::pread(fd, bytes.as_mut_ptr().cast(), bytes.len(), 0) }
        } else {
            0
        };
        let bytes = &bytes[..usize::try_from(n).unwrap_or(0)];
        let issued = ISSUED.lock().unwrap_or_else(|e| e.into_inner());
        match issued.get(&identity(&st)) {
            // No allocation on this path or the refusals: a `fork` child may call it.
            Some(ours) if ours.pid == std::process::id() && ours.record.as_bytes() == bytes => {
                Ok(ours.entry)
            }
            _ if bytes.starts_with(COMMAND_FD_MAGIC.as_bytes()) => Err(libc::ENODEV),
            _ if st.st_mode & libc::S_IFMT == libc::S_IFCHR => Err(libc::ENODEV),
            _ => Err(libc::EINVAL),
        }
    }
}

/// `ibv_close_device(3)`.
///
/// # Safety
///
/// `context` is NULL or an open context, not used again after this call.
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    errno_code(|| {
        // SAFETY: `context` is NULL or an open context (this function's `# Safety`).
        let block = unsafe { ContextBlock::from_ptr(context) }?;
        // The device outlives its contexts: ACKs it holds for a post that will not come
        // leave now.
        block.entry.device.send_held_acks();
        crate::stats::report(&block.entry.device);
        flush_capture(block.entry);
        // SAFETY: `context` passed `from_ptr` above, `block` is not used again, and the
        // caller gives the context up with this call.
        unsafe { ContextBlock::free(context) };
        Ok(())
    })
}
symver!(ibv_close_device, "IBVERBS_1.1");

/// Re-exported from [`crate::stats`], which writes the report, so the name stays where the
/// table above points.
pub use crate::stats::STATS_ENV;

/// Writes out what `SOFTVERBS_PCAP` captured so far (the process's device is never
/// dropped: closing a context and leaving the process are the moments a capture must be
/// complete).
pub fn flush_capture(entry: &DeviceEntry) {
    if let Err(e) = entry.device.flush_capture() {
        eprintln!("softverbs: cannot write the packet capture: {e}");
    }
}

/// `ibv_query_device(3)`: returns 0 or an errno value.
///
/// # Safety
///
/// `context` is NULL or an open context; `attr` is NULL or writable.
pub unsafe extern "C" fn ibv_query_device(
    context: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    errno_code(|| {
        // SAFETY: `context` is NULL or an open context (this function's `# Safety`).
        let block = unsafe { ContextBlock::from_ptr(context) }?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: `attr` is writable (this function's `# Safety`; not NULL here).
        unsafe { attr.write_unaligned(device_attr(block.entry)) };
        Ok(())
    })
}
symver!(ibv_query_device, "IBVERBS_1.1");

/// The exported `ibv_query_port(3)`: the legacy entry point, which writes only the first
/// 48 bytes (`port_cap_flags2` did not exist; reference §4.1 trap 6). Programs built with
/// the v44 header reach [`query_port_ex`] through the extended context instead.
///
/// # Safety
///
/// `context` is NULL or an open context; `attr` is NULL or writable for 48 bytes.
pub unsafe extern "C" fn ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    errno_code(|| {
        // SAFETY: `context` is NULL or an open context (this function's `# Safety`).
        let block = unsafe { ContextBlock::from_ptr(context) }?;
        check_port(block.entry, u32::from(port_num))?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        let value = port_attr(block.entry);
        // SAFETY: `attr` is writable for the legacy 48 bytes; `value` is a local.
        unsafe {
            std::ptr::copy_nonoverlapping(
                std::ptr::from_ref(&value).cast::<u8>(),
                attr.cast::<u8>(),
                LEGACY_PORT_ATTR_LEN,
            )
        };
        Ok(())
    })
}
symver!(ibv_query_port, "IBVERBS_1.1");

/// `verbs_context.query_port`: `ibv_query_port` as the v44 inline calls it, with the
/// caller's `sizeof(struct ibv_port_attr)`.
///
/// # Safety
///
/// `context` is NULL or an open context; `attr` is NULL or writable for `len` bytes.
pub unsafe extern "C" fn query_port_ex(
    context: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    errno_code(|| {
        // SAFETY: `context` is NULL or an open context (this function's `# Safety`).
        let block = unsafe { ContextBlock::from_ptr(context) }?;
        check_port(block.entry, u32::from(port_num))?;
        if attr.is_null() || len < LEGACY_PORT_ATTR_LEN {
            return Err(libc::EINVAL);
        }
        // SAFETY: `attr` is writable for `len` bytes (this function's `# Safety`).
        unsafe { write_sized(attr, len, &port_attr(block.entry)) };
        Ok(())
    })
}

/// `verbs_context.query_device_ex` (`ibv_query_device_ex(3)`): writes `attr_size` bytes
/// (zeros past what this library knows).
///
/// # Safety
///
/// `context` is NULL or an open context; `input` is NULL or readable; `attr` is NULL or
/// writable for `attr_size` bytes.
pub unsafe extern "C" fn query_device_ex(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    errno_code(|| {
        // SAFETY: `context` is NULL or an open context (this function's `# Safety`).
        let block = unsafe { ContextBlock::from_ptr(context) }?;
        // SAFETY: `input` is NULL or readable (this function's `# Safety`; not NULL here).
        if !input.is_null() && unsafe { input.read_unaligned() }.comp_mask != 0 {
            return Err(libc::EINVAL);
        }
        if attr.is_null() || attr_size < std::mem::size_of::<ibv_device_attr>() {
            return Err(libc::EINVAL);
        }
        // SAFETY: `attr` is writable for `attr_size` bytes (this function's `# Safety`).
        unsafe { write_sized(attr, attr_size, &device_attr_ex(block.entry)) };
        Ok(())
    })
}

/// `verbs_context.query_rt_values` (`ibv_query_rt_values_ex(3)`): with
/// `IBV_VALUES_MASK_RAW_CLOCK`, the device clock in `raw_clock` as providers report it
/// (`tv_sec = 0`, `tv_nsec` = ticks; one tick is one nanosecond). `comp_mask` comes back
/// holding the fields filled.
///
/// # Safety
///
/// `context` is NULL or an open context; `values` is NULL or readable and writable.
pub unsafe extern "C" fn query_rt_values(
    context: *mut ibv_context,
    values: *mut ibv_values_ex,
) -> c_int {
    errno_code(|| {
        // SAFETY: `context` is NULL or an open context (this function's `# Safety`).
        unsafe { ContextBlock::from_ptr(context) }?;
        if values.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: `values` is readable and writable (this function's `# Safety`; not
        // NULL here), and nothing else refers to it during the call.
        let values = unsafe { &mut *values };
        let wanted = values.comp_mask;
        let mut filled = 0;
        if wanted & IBV_VALUES_MASK_RAW_CLOCK != 0 {
            values.raw_clock = libc::timespec {
                tv_sec: 0,
                tv_nsec: DeviceClock::now() as libc::c_long,
            };
            filled |= IBV_VALUES_MASK_RAW_CLOCK;
        }
        values.comp_mask = filled;
        Ok(())
    })
}

fn gid_of(entry: &DeviceEntry, index: u32) -> Result<[u8; 16], Errno> {
    entry.device.query_gid(PORT, index).map_err(errno_of)
}

/// `ibv_query_gid(3)`: 0, or -1 with errno (`EINVAL` for a bad port or index).
///
/// # Safety
///
/// `context` is NULL or an open context; `gid` is NULL or writable.
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    minus_one(|| {
        // SAFETY: `context` is NULL or an open context (this function's `# Safety`).
        let block = unsafe { ContextBlock::from_ptr(context) }?;
        check_port(block.entry, u32::from(port_num))?;
        let index = u32::try_from(index).map_err(|_| libc::EINVAL)?;
        if gid.is_null() {
            return Err(libc::EINVAL);
        }
        let raw = gid_of(block.entry, index)?;
        // SAFETY: `gid` is writable (this function's `# Safety`; not NULL here).
        unsafe { gid.write_unaligned(ibv_gid { raw }) };
        Ok(0)
    })
}
symver!(ibv_query_gid, "IBVERBS_1.1");

/// `ibv_query_gid_type` (provider-private, used by `ibv_devinfo`): RoCE v2 (`enum
/// ibv_gid_type_sysfs` value 1) for every GID. 0, or -1 with errno.
///
/// # Safety
///
/// `context` is NULL or an open context; `gid_type` is NULL or writable.
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut ibv_context,
    port_num: u8,
    index: u32,
    gid_type: *mut u32,
) -> c_int {
    minus_one(|| {
        // SAFETY: `context` is NULL or an open context (this function's `# Safety`).
        let block = unsafe { ContextBlock::from_ptr(context) }?;
        check_port(block.entry, u32::from(port_num))?;
        gid_of(block.entry, index)?;
        if gid_type.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: `gid_type` is writable (this function's `# Safety`; not NULL here).
        unsafe { gid_type.write_unaligned(IBV_GID_TYPE_SYSFS_ROCE_V2) };
        Ok(0)
    })
}
symver!(ibv_query_gid_type, "IBVERBS_PRIVATE_34");

fn gid_entry(entry: &DeviceEntry, index: u32) -> Result<ibv_gid_entry, Errno> {
    let raw = gid_of(entry, index)?;
    if raw == [0; 16] {
        return Err(libc::ENODATA);
    }
    Ok(ibv_gid_entry {
        gid: ibv_gid { raw },
        gid_index: index,
        port_num: PORT,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: entry.device.interface_index(),
    })
}

/// `ibv_query_gid_ex(3)` (the exported worker of the inline): 0 or an errno value
/// (`EINVAL` for a bad port, index, flags or size; `ENODATA` for an empty entry).
///
/// # Safety
///
/// `context` is NULL or an open context; `entry` is NULL or writable for `entry_size`
/// bytes.
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    errno_code(|| {
        // SAFETY: `context` is NULL or an open context (this function's `# Safety`).
        let block = unsafe { ContextBlock::from_ptr(context) }?;
        check_port(block.entry, port_num)?;
        if entry.is_null() || flags != 0 || entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return Err(libc::EINVAL);
        }
        let value = gid_entry(block.entry, gid_index)?;
        // SAFETY: `entry` is writable for `entry_size` bytes (this function's `# Safety`).
        unsafe { write_sized(entry, entry_size, &value) };
        Ok(())
    })
}
symver!(_ibv_query_gid_ex, "IBVERBS_1.11");

/// `ibv_query_gid_table(3)` (the exported worker of the inline): the number of entries
/// written, or a negative errno value.
///
/// # Safety
///
/// `context` is NULL or an open context; `entries` is NULL or writable for `max_entries`
/// elements of `entry_size` bytes.
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    crate::boundary::guarded(|| {
        // SAFETY: `context` is NULL or an open context (this function's `# Safety`).
        let block = unsafe { ContextBlock::from_ptr(context) }?;
        if entries.is_null() || flags != 0 || entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return Err(libc::EINVAL);
        }
        let len = block.entry.device.port_attr().gid_tbl_len;
        let mut written = 0usize;
        for index in 0..len {
            let Ok(value) = gid_entry(block.entry, index) else {
                continue;
            };
            if written == max_entries {
                return Err(libc::EINVAL);
            }
            // SAFETY: element `written < max_entries` of the caller's array.
            unsafe { write_sized(entries.byte_add(written * entry_size), entry_size, &value) };
            written += 1;
        }
        Ok(written as isize)
    })
    .unwrap_or_else(|e| -(e as isize))
}
symver!(_ibv_query_gid_table, "IBVERBS_1.11");

/// `ibv_query_pkey(3)`: index 0 is the default P_Key 0xffff (network order). 0, or -1
/// with errno.
///
/// # Safety
///
/// `context` is NULL or an open context; `pkey` is NULL or writable.
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    minus_one(|| {
        // SAFETY: `context` is NULL or an open context (this function's `# Safety`).
        let block = unsafe { ContextBlock::from_ptr(context) }?;
        check_port(block.entry, u32::from(port_num))?;
        if index != 0 || pkey.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: `pkey` is writable (this function's `# Safety`; not NULL here).
        unsafe { pkey.write_unaligned(DEFAULT_PKEY.to_be()) };
        Ok(0)
    })
}
symver!(ibv_query_pkey, "IBVERBS_1.1");

/// `ibv_get_pkey_index(3)`: the index of a P_Key (network order), or -1 with errno
/// `ENOENT`.
///
/// # Safety
///
/// `context` is NULL or an open context.
pub unsafe extern "C" fn ibv_get_pkey_index(
    context: *mut ibv_context,
    port_num: u8,
    pkey: u16,
) -> c_int {
    minus_one(|| {
        // SAFETY: `context` is NULL or an open context (this function's `# Safety`).
        let block = unsafe { ContextBlock::from_ptr(context) }?;
        check_port(block.entry, u32::from(port_num))?;
        if u16::from_be(pkey) == DEFAULT_PKEY {
            Ok(0)
        } else {
            Err(libc::ENOENT)
        }
    })
}
symver!(ibv_get_pkey_index, "IBVERBS_1.5");

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::MaybeUninit;

    /// One context on an in-process-free UDP device (address from the environment or
    /// 127.0.0.x), closed at the end.
    fn with_context(f: impl FnOnce(*mut ibv_context)) {
        // SAFETY: a NULL count pointer is allowed.
        let list = unsafe { ibv_get_device_list(std::ptr::null_mut()) };
        assert!(
            !list.is_null(),
            "device list: errno {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: the list has one device and a NULL terminator.
        let device = unsafe { *list };
        // SAFETY: a device from the list.
        let ctx = unsafe { ibv_open_device(device) };
        assert!(!ctx.is_null());
        // SAFETY: the list from ibv_get_device_list, freed once.
        unsafe { ibv_free_device_list(list) };
        f(ctx);
        // SAFETY: the context from ibv_open_device.
        assert_eq!(unsafe { ibv_close_device(ctx) }, 0);
    }

    #[test]
    fn the_context_is_extended_with_the_full_size_so_every_inline_finds_its_op() {
        // verbs.h's verbs_get_ctx: abi_compat == UINTPTR_MAX and sz >= 648, else ops are dropped.
        with_context(|ctx| {
            // SAFETY: an open context.
            let block = unsafe { ContextBlock::from_ptr(ctx) }.unwrap();
            assert_eq!(block.verbs.sz, 648);
            assert_eq!(block.verbs.context.abi_compat as usize, usize::MAX);
            assert!(block.verbs.query_port.is_some());
            assert!(block.verbs.query_device_ex.is_some());
            assert!(block.verbs.context.ops.poll_cq.is_some());
            assert!(block.verbs.context.ops.post_send.is_some());
        });
    }

    #[test]
    fn the_exported_query_port_writes_only_the_48_byte_legacy_prefix() {
        with_context(|ctx| {
            let mut attr = [0xaau8; 52];
            // SAFETY: 52 writable bytes.
            let rc = unsafe { ibv_query_port(ctx, 1, attr.as_mut_ptr().cast()) };
            assert_eq!(rc, 0);
            assert_eq!(&attr[48..], &[0xaa; 4]);
            assert_eq!(attr[0], 4, "PORT_ACTIVE");
            assert_eq!(attr[46], IBV_LINK_LAYER_ETHERNET);
            // SAFETY: 52 writable bytes.
            let rc = unsafe { ibv_query_port(ctx, 2, attr.as_mut_ptr().cast()) };
            assert_eq!(rc, libc::EINVAL);
        });
    }

    #[test]
    fn query_device_ex_zeroes_what_a_newer_header_appended() {
        with_context(|ctx| {
            let mut buf = [0xaau8; 480];
            // SAFETY: 480 writable bytes, NULL input.
            let rc =
                unsafe { query_device_ex(ctx, std::ptr::null(), buf.as_mut_ptr().cast(), 480) };
            assert_eq!(rc, 0);
            assert!(buf[400..].iter().all(|&b| b == 0));
            // SAFETY: the first 400 bytes are an ibv_device_attr_ex.
            let attr = unsafe { buf.as_ptr().cast::<ibv_device_attr_ex>().read_unaligned() };
            assert_ne!(attr.completion_timestamp_mask, 0);
            assert_eq!(attr.hca_core_clock, 1_000_000);
            assert_eq!(attr.orig_attr.vendor_id, 0xffffff);
            let input = ibv_query_device_ex_input { comp_mask: 1 };
            // SAFETY: as above.
            let rc = unsafe { query_device_ex(ctx, &input, buf.as_mut_ptr().cast(), 480) };
            assert_eq!(rc, libc::EINVAL);
        });
    }

    // ibv_query_gid(3), ibv_query_gid_ex(3): the table as kernel rxe lays it out for an
    // IPv4 address, the link-local GID at 0 and the IPv4-mapped one at 1; gid_tbl_len
    // entries, EINVAL past them; every entry on the interface holding the address.
    #[test]
    fn gids_are_link_local_then_the_ipv4_address_and_out_of_range_indexes_fail() {
        with_context(|ctx| {
            // SAFETY: an open context.
            let block = unsafe { ContextBlock::from_ptr(ctx) }.unwrap();
            let std::net::IpAddr::V4(address) = block.entry.device.address() else {
                panic!("the test device is on IPv4");
            };
            let mut gid = MaybeUninit::<ibv_gid>::uninit();
            // SAFETY: writable.
            assert_eq!(unsafe { ibv_query_gid(ctx, 1, 0, gid.as_mut_ptr()) }, 0);
            // SAFETY: written above; any bytes are a valid [u8; 16].
            let raw = unsafe { gid.assume_init().raw };
            let mut link_local = [0u8; 16];
            link_local[..2].copy_from_slice(&[0xfe, 0x80]);
            link_local[10..12].copy_from_slice(&[0xff, 0xff]);
            link_local[12..].copy_from_slice(&address.octets());
            assert_eq!(raw, link_local);
            // SAFETY: writable.
            assert_eq!(unsafe { ibv_query_gid(ctx, 1, 1, gid.as_mut_ptr()) }, 0);
            // SAFETY: written above.
            let raw = unsafe { gid.assume_init().raw };
            assert_eq!(raw, address.to_ipv6_mapped().octets());
            // SAFETY: writable.
            assert_eq!(unsafe { ibv_query_gid(ctx, 1, 2, gid.as_mut_ptr()) }, -1);
            assert_eq!(port_attr(block.entry).gid_tbl_len, 2);
            // SAFETY: the interface name is a literal C string.
            let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
            for index in 0..2 {
                let mut entry = MaybeUninit::<ibv_gid_entry>::uninit();
                // SAFETY: writable for its size.
                let rc = unsafe { _ibv_query_gid_ex(ctx, 1, index, entry.as_mut_ptr(), 0, 32) };
                assert_eq!(rc, 0);
                // SAFETY: written above.
                let entry = unsafe { entry.assume_init() };
                assert_eq!(entry.gid_type, IBV_GID_TYPE_ROCE_V2);
                assert_eq!(entry.gid_index, index);
                assert_eq!(entry.ndev_ifindex, lo, "GID {index} is on lo");
            }
        });
    }

    // rdma-core's ibv_get_device_name is `return device->name;`: any struct ibv_device
    // names itself.
    #[test]
    fn the_device_name_is_read_from_the_struct_given() {
        let mut own = ibv_device {
            _ops: _ibv_device_ops::default(),
            node_type: 0,
            transport_type: 0,
            name: [0; 64],
            dev_name: [0; 64],
            dev_path: [0; 256],
            ibdev_path: [0; 256],
        };
        for (dst, src) in own.name.iter_mut().zip(b"mine0") {
            *dst = *src as c_char;
        }
        // SAFETY: a struct ibv_device of ours; the name is only pointed at.
        let name = unsafe { ibv_get_device_name(&mut own) };
        assert_eq!(name, own.name.as_ptr());
        // SAFETY: NULL is refused.
        assert!(unsafe { ibv_get_device_name(std::ptr::null_mut()) }.is_null());
    }

    #[test]
    fn null_and_foreign_pointers_are_refused_with_errno() {
        // SAFETY: NULL is allowed and refused.
        let rc = unsafe { ibv_query_device(std::ptr::null_mut(), std::ptr::null_mut()) };
        assert_eq!(rc, libc::EINVAL);
        // SAFETY: as above.
        assert!(unsafe { ibv_open_device(std::ptr::null_mut()) }.is_null());
        let mut not_ours = [0u8; 664];
        // SAFETY: a readable block that is not our device; only compared by address.
        let guid = unsafe { ibv_get_device_guid(not_ours.as_mut_ptr().cast()) };
        assert_eq!(guid, 0);
        // SAFETY: as above.
        let index = unsafe { ibv_get_device_index(not_ours.as_mut_ptr().cast()) };
        assert_eq!(index, -1);
    }
}
