//! The loaded `libibverbs.so.1`, reached through its public symbols only: `dlopen` gives
//! the copy the program already loaded and `dlvsym` each function at its version node, so
//! the connection manager works on the very contexts, PDs, CQs and QPs the program uses and
//! never links a second copy of the device. The GSI (QP1) functions are softverbs' private
//! exports (`SOFTVERBS_PRIVATE_1.0`); when they are missing the loaded libibverbs is not
//! softverbs' and the library says so once on stderr and fails with `ENODEV`.

use crate::abi::{ibv_gid, ibv_port_attr, ibv_qp_attr, ibv_qp_init_attr};
use crate::boundary::Errno;
use libc::{c_int, c_void};
use std::ffi::CStr;
use std::sync::OnceLock;

type Ctx = *mut c_void;

/// The public `ibv_*` functions the connection manager calls.
#[allow(missing_docs)]
pub struct Verbs {
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void,
    pub free_device_list: unsafe extern "C" fn(*mut *mut c_void),
    pub open_device: unsafe extern "C" fn(*mut c_void) -> Ctx,
    pub close_device: unsafe extern "C" fn(Ctx) -> c_int,
    pub get_device_guid: unsafe extern "C" fn(*mut c_void) -> u64,
    pub query_port: unsafe extern "C" fn(Ctx, u8, *mut ibv_port_attr) -> c_int,
    pub query_gid: unsafe extern "C" fn(Ctx, u8, c_int, *mut ibv_gid) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(Ctx) -> *mut c_void,
    pub dealloc_pd: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub create_comp_channel: unsafe extern "C" fn(Ctx) -> *mut c_void,
    pub destroy_comp_channel: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub create_cq: unsafe extern "C" fn(Ctx, c_int, *mut c_void, *mut c_void, c_int) -> *mut c_void,
    pub destroy_cq: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub create_qp: unsafe extern "C" fn(*mut c_void, *mut ibv_qp_init_attr) -> *mut c_void,
    pub modify_qp: unsafe extern "C" fn(*mut c_void, *mut ibv_qp_attr, c_int) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub create_srq: unsafe extern "C" fn(*mut c_void, *mut c_void) -> *mut c_void,
    pub destroy_srq: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub attach_mcast: unsafe extern "C" fn(*mut c_void, *const ibv_gid, u16) -> c_int,
    pub detach_mcast: unsafe extern "C" fn(*mut c_void, *const ibv_gid, u16) -> c_int,
}

/// softverbs' private GSI exports (`SOFTVERBS_PRIVATE_1.0` of our libibverbs.so.1).
#[allow(missing_docs)]
pub struct Gsi {
    pub send: unsafe extern "C" fn(Ctx, *const u8, *const c_void, usize) -> c_int,
    pub recv: unsafe extern "C" fn(Ctx, *mut u8, *mut u32, *mut c_void, usize) -> isize,
    pub fd: unsafe extern "C" fn(Ctx) -> c_int,
    pub share: unsafe extern "C" fn(Ctx) -> c_int,
    pub listen: unsafe extern "C" fn(Ctx, u64) -> c_int,
    pub unlisten: unsafe extern "C" fn(Ctx, u64) -> c_int,
    /// `SOFTVERBS_PRIVATE_1.2`; `None` in a libibverbs.so.1 of softverbs older than it
    /// (the CM works without it, its events only later).
    pub app_waits: Option<unsafe extern "C" fn(Ctx) -> c_int>,
}

/// The version node of libibverbs' public functions.
const IBVERBS_1_1: &CStr = c"IBVERBS_1.1";
const IBVERBS_1_0: &CStr = c"IBVERBS_1.0";
const PRIVATE: &CStr = c"SOFTVERBS_PRIVATE_1.0";
const PRIVATE_1_1: &CStr = c"SOFTVERBS_PRIVATE_1.1";
const PRIVATE_1_2: &CStr = c"SOFTVERBS_PRIVATE_1.2";

fn handle() -> Result<usize, String> {
    // SAFETY: dlopen with a constant, NUL-terminated name; RTLD_NOW resolves everything
    // now. The program normally has libibverbs loaded already, so this returns that copy.
    let h = unsafe {
        libc::dlopen(
            c"libibverbs.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_GLOBAL,
        )
    };
    if h.is_null() {
        return Err(format!("dlopen(libibverbs.so.1): {}", dlerror()));
    }
    Ok(h as usize)
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl call
    // on this thread; it is copied at once.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-NULL, NUL-terminated (above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

fn sym(h: usize, name: &CStr, node: &CStr) -> Result<*mut c_void, String> {
    // SAFETY: `h` is a handle dlopen returned and never closed; names are NUL-terminated.
    let p = unsafe { libc::dlvsym(h as *mut c_void, name.as_ptr(), node.as_ptr()) };
    if p.is_null() {
        Err(format!(
            "libibverbs.so.1 has no {}@{}",
            name.to_string_lossy(),
            node.to_string_lossy()
        ))
    } else {
        Ok(p)
    }
}

macro_rules! load {
    ($h:expr, $name:literal, $node:expr) => {{
        let p = sym($h, $name, $node)?;
        // SAFETY: the symbol is libibverbs' function of that name and version, whose C
        // prototype (verbs.h) is the field's type (inferred from the field).
        #[allow(clippy::missing_transmute_annotations)]
        unsafe {
            std::mem::transmute::<*mut c_void, _>(p)
        }
    }};
}

fn load_verbs() -> Result<Verbs, String> {
    let h = handle()?;
    Ok(Verbs {
        get_device_list: load!(h, c"ibv_get_device_list", IBVERBS_1_1),
        free_device_list: load!(h, c"ibv_free_device_list", IBVERBS_1_1),
        open_device: load!(h, c"ibv_open_device", IBVERBS_1_1),
        close_device: load!(h, c"ibv_close_device", IBVERBS_1_1),
        get_device_guid: load!(h, c"ibv_get_device_guid", IBVERBS_1_1),
        query_port: load!(h, c"ibv_query_port", IBVERBS_1_1),
        query_gid: load!(h, c"ibv_query_gid", IBVERBS_1_1),
        alloc_pd: load!(h, c"ibv_alloc_pd", IBVERBS_1_1),
        dealloc_pd: load!(h, c"ibv_dealloc_pd", IBVERBS_1_1),
        create_comp_channel: load!(h, c"ibv_create_comp_channel", IBVERBS_1_0),
        destroy_comp_channel: load!(h, c"ibv_destroy_comp_channel", IBVERBS_1_0),
        create_cq: load!(h, c"ibv_create_cq", IBVERBS_1_1),
        destroy_cq: load!(h, c"ibv_destroy_cq", IBVERBS_1_1),
        create_qp: load!(h, c"ibv_create_qp", IBVERBS_1_1),
        modify_qp: load!(h, c"ibv_modify_qp", IBVERBS_1_1),
        destroy_qp: load!(h, c"ibv_destroy_qp", IBVERBS_1_1),
        create_srq: load!(h, c"ibv_create_srq", IBVERBS_1_1),
        destroy_srq: load!(h, c"ibv_destroy_srq", IBVERBS_1_1),
        attach_mcast: load!(h, c"ibv_attach_mcast", IBVERBS_1_1),
        detach_mcast: load!(h, c"ibv_detach_mcast", IBVERBS_1_1),
    })
}

fn load_gsi() -> Result<Gsi, String> {
    let h = handle()?;
    Ok(Gsi {
        send: load!(h, c"softverbs_gsi_send", PRIVATE),
        recv: load!(h, c"softverbs_gsi_recv", PRIVATE),
        fd: load!(h, c"softverbs_gsi_fd", PRIVATE),
        share: load!(h, c"softverbs_gsi_share", PRIVATE_1_1),
        listen: load!(h, c"softverbs_gsi_listen", PRIVATE_1_1),
        unlisten: load!(h, c"softverbs_gsi_unlisten", PRIVATE_1_1),
        app_waits: sym(h, c"softverbs_app_waits", PRIVATE_1_2).ok().map(|p| {
            // SAFETY: softverbs' `softverbs_app_waits` at that version, whose prototype
            // (`int (struct ibv_context *)`) is the field's type.
            unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(Ctx) -> c_int>(p) }
        }),
    })
}

/// Says `msg` on stderr once per process.
fn say_once(cell: &OnceLock<()>, msg: &str) {
    cell.get_or_init(|| eprintln!("librdmacm (softverbs): {msg}"));
}

/// The loaded libibverbs' functions, or `ENODEV` (said once on stderr) when it lacks them.
pub fn verbs() -> Result<&'static Verbs, Errno> {
    static V: OnceLock<Result<Verbs, String>> = OnceLock::new();
    static SAID: OnceLock<()> = OnceLock::new();
    match V.get_or_init(load_verbs) {
        Ok(v) => Ok(v),
        Err(e) => {
            say_once(&SAID, e);
            Err(libc::ENODEV)
        }
    }
}

/// softverbs' GSI exports, or `ENODEV` (said once on stderr): the loaded libibverbs.so.1
/// is not softverbs', whose QP1 this connection manager needs.
pub fn gsi() -> Result<&'static Gsi, Errno> {
    static G: OnceLock<Result<Gsi, String>> = OnceLock::new();
    static SAID: OnceLock<()> = OnceLock::new();
    match G.get_or_init(load_gsi) {
        Ok(g) => Ok(g),
        Err(e) => {
            say_once(
                &SAID,
                &format!("{e}: the loaded libibverbs.so.1 is not softverbs' (its QP1 is needed)"),
            );
            Err(libc::ENODEV)
        }
    }
}
