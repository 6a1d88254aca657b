//! The calling thread's soft `RLIMIT_MEMLOCK` and its `CAP_IPC_LOCK`, for the tests of
//! `ibv_reg_mr(3)`'s memlock rule (the kernel's `ib_umem_get` charges a registration
//! against the limit unless the thread has `CAP_IPC_LOCK`). Capabilities are per thread:
//! only the calling thread loses it.

#![allow(dead_code)] // each test binary uses part of it

/// `struct __user_cap_header_struct` (not in the `libc` crate).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct` (not in the `libc` crate).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
const CAP_IPC_LOCK: u32 = 14;

fn capabilities() -> Result<[CapData; 2], String> {
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut caps = [CapData::default(); 2];
    // SAFETY: capget reads the header and writes the two data structs of version 3, both
    // laid out as the kernel's.
    let got = unsafe { libc::syscall(libc::SYS_capget, &mut header, caps.as_mut_ptr()) };
    if got != 0 {
        return Err(format!("capget: {}", std::io::Error::last_os_error()));
    }
    Ok(caps)
}

fn set_capabilities(caps: &[CapData; 2]) -> Result<(), String> {
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    // SAFETY: capset reads the header and the two data structs of version 3, laid out as
    // the kernel's; it changes only the calling thread's capabilities.
    let set = unsafe { libc::syscall(libc::SYS_capset, &mut header, caps.as_ptr()) };
    if set != 0 {
        return Err(format!("capset: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

fn memlock() -> Result<libc::rlimit, String> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the `struct rlimit` it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 {
        return Err(format!("getrlimit: {}", std::io::Error::last_os_error()));
    }
    Ok(limit)
}

fn set_memlock(limit: &libc::rlimit) -> Result<(), String> {
    // SAFETY: setrlimit reads the `struct rlimit` it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, limit) } != 0 {
        return Err(format!("setrlimit: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// The calling thread under a soft `RLIMIT_MEMLOCK` of `bytes` (at most the hard limit)
/// without `CAP_IPC_LOCK` in its effective set, until dropped: both are restored then.
pub struct MemlockGuard {
    limit: libc::rlimit,
    caps: [CapData; 2],
}

impl MemlockGuard {
    /// Lowers the limit and drops the capability.
    pub fn lower(bytes: u64) -> Result<MemlockGuard, String> {
        let limit = memlock()?;
        let caps = capabilities()?;
        let guard = MemlockGuard { limit, caps };
        set_memlock(&libc::rlimit {
            rlim_cur: bytes.min(limit.rlim_max),
            rlim_max: limit.rlim_max,
        })?;
        let mut dropped = caps;
        dropped[0].effective &= !(1 << CAP_IPC_LOCK);
        set_capabilities(&dropped)?;
        Ok(guard)
    }
}

impl Drop for MemlockGuard {
    fn drop(&mut self) {
        let _ = set_capabilities(&self.caps);
        let _ = set_memlock(&self.limit);
    }
}
