//! Registration through the safe API is refused as on a kernel device (`ibv_reg_mr(3)`):
//! length 0 is [`Error::Register(RegisterError::ZeroLength)`] (`EINVAL`), and registering past the process's
//! soft `RLIMIT_MEMLOCK` without `CAP_IPC_LOCK` is
//! `Error::Register(RegisterError::OverMemlock { .. })` (`ENOMEM`, the kernel's
//! `ib_umem_get`), the pages of a dropped region given back.
//!
//! The memlock test changes a process-wide limit, so it runs in a child: this test binary
//! again, with only that test selected and [`CHILD_ENV`] set. In the child it drops
//! `CAP_IPC_LOCK` from the test thread's effective capabilities (capabilities are per
//! thread; the device checks the calling thread's, as the kernel does) and lowers the soft
//! limit. Before the memlock accounting the over-limit registration succeeded.

use softverbs::{AccessFlags, Context, DeviceConfig, Error};
use softverbs_device::RegisterError;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "SOFTVERBS_REGISTRATION_TEST_CHILD";
const KIB: usize = 1024;

#[test]
fn a_zero_length_region_is_refused_with_einval() {
    let pd = Context::open_with(DeviceConfig::in_process())
        .unwrap()
        .alloc_pd();
    let err = pd.reg_mr(0, AccessFlags::LOCAL_WRITE).unwrap_err();
    assert!(
        matches!(err, Error::Register(RegisterError::ZeroLength)),
        "{err:?}"
    );
    assert_eq!(err.errno(), 22);
}

// The system call numbers below are x86-64 Linux's.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[test]
fn registration_past_rlimit_memlock_is_refused_with_enomem_as_a_typed_error() {
    if std::env::var_os(CHILD_ENV).is_some() {
        memlock_child();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "registration_past_rlimit_memlock_is_refused_with_enomem_as_a_typed_error",
            "--test-threads=1",
            "--nocapture",
        ])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the child test did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        status.success() && stdout.contains("1 passed"),
        "child {status}:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
/// In the child: no CAP_IPC_LOCK on this thread, soft RLIMIT_MEMLOCK 64 KiB.
fn memlock_child() {
    sys::drop_ipc_lock();
    sys::set_memlock_soft(64 * KIB as u64);
    let pd = Context::open_with(DeviceConfig::in_process())
        .unwrap()
        .alloc_pd();
    let first = pd.reg_mr(32 * KIB, AccessFlags::LOCAL_WRITE).unwrap();
    let err = pd.reg_mr(48 * KIB, AccessFlags::LOCAL_WRITE).unwrap_err();
    match err {
        Error::Register(RegisterError::OverMemlock {
            requested,
            pinned,
            limit,
        }) => {
            assert_eq!(
                (requested, pinned, limit),
                (48 * 1024, 32 * 1024, 64 * 1024)
            );
        }
        other => panic!("expected OverMemlock, got {other:?}"),
    }
    assert_eq!(err.errno(), 12, "ENOMEM");
    let second = pd.reg_mr(32 * KIB, AccessFlags::empty()).unwrap();
    assert!(pd.reg_mr(1, AccessFlags::empty()).is_err());
    // Dropping a region gives its pages back.
    drop(first);
    drop(second);
    let all = pd.reg_mr(64 * KIB, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(all.len(), 64 * KIB);
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
/// The two system calls the child needs, declared here (the crate has no `libc`
/// dependency; the C library is linked into every test binary anyway).
mod sys {
    use std::ffi::{c_int, c_long};

    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: c_int,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }

    #[repr(C)]
    struct Rlimit {
        cur: u64,
        max: u64,
    }

    extern "C" {
        fn syscall(number: c_long, ...) -> c_long;
        fn getrlimit(resource: c_int, limit: *mut Rlimit) -> c_int;
        fn setrlimit(resource: c_int, limit: *const Rlimit) -> c_int;
    }

    const SYS_CAPGET: c_long = 125;
    const SYS_CAPSET: c_long = 126;
    const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    const CAP_IPC_LOCK: u32 = 14;
    const RLIMIT_MEMLOCK: c_int = 8;

    /// Removes CAP_IPC_LOCK from the calling thread's effective set.
    pub fn drop_ipc_lock() {
        let mut header = CapHeader {
            version: CAPABILITY_VERSION_3,
            pid: 0,
        };
        let mut data = [CapData::default(); 2];
        // SAFETY: capget fills the header-described two-element array it is given.
        let got = unsafe { syscall(SYS_CAPGET, &mut header as *mut CapHeader, data.as_mut_ptr()) };
        assert_eq!(got, 0, "capget");
        data[0].effective &= !(1 << CAP_IPC_LOCK);
        // SAFETY: capset reads the header and the two-element array.
        let set = unsafe { syscall(SYS_CAPSET, &mut header as *mut CapHeader, data.as_ptr()) };
        assert_eq!(set, 0, "capset");
    }

    /// Sets the soft RLIMIT_MEMLOCK to `bytes`, the hard limit unchanged.
    pub fn set_memlock_soft(bytes: u64) {
        let mut limit = Rlimit { cur: 0, max: 0 };
        // SAFETY: getrlimit writes the struct it is given.
        assert_eq!(unsafe { getrlimit(RLIMIT_MEMLOCK, &mut limit) }, 0);
        limit.cur = bytes.min(limit.max);
        // SAFETY: setrlimit reads the struct it is given.
        assert_eq!(unsafe { setrlimit(RLIMIT_MEMLOCK, &limit) }, 0);
    }
}
