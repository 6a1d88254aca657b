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

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod memlock;

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
    // The child never restores them: it exits after this test.
    std::mem::forget(memlock::MemlockGuard::lower(64 * KIB as u64).unwrap());
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
