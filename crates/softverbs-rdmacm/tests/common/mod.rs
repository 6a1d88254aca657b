//! Helpers of the integration tests: the two drop-ins (`librdmacm.so.1`, this crate's
//! cdylib, and `libibverbs.so.1`, softverbs-capi's) in one directory for
//! `LD_LIBRARY_PATH`, and programs run bounded in time.

#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A cdylib cargo built in this target directory's profile directory.
fn built(name: &str, how: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps directory");
    for dir in [deps, deps.parent().expect("profile directory")] {
        let candidate = dir.join(name);
        if candidate.exists() {
            return candidate;
        }
    }
    panic!("{name} not found next to {}: {how}", exe.display());
}

/// A directory holding `librdmacm.so.1` and `libibverbs.so.1` as symlinks to the built
/// cdylibs. softverbs-capi's must have been built first (`cargo build -p
/// softverbs-capi -p softverbs-rdmacm`): its absence is a failure, never a skip.
pub fn library_dir(name: &str) -> PathBuf {
    let rdmacm = built(
        "libsoftverbs_rdmacm.so",
        "cargo builds this crate's cdylib with its tests",
    );
    let capi = built(
        "libsoftverbs_capi.so",
        "build softverbs' libibverbs.so.1 first: cargo build -p softverbs-capi -p softverbs-rdmacm",
    );
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("softverbs-rdmacm-{name}"));
    std::fs::create_dir_all(&dir).expect("create library directory");
    for (link, target) in [("librdmacm.so.1", &rdmacm), ("libibverbs.so.1", &capi)] {
        let link = dir.join(link);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(target, &link).expect("symlink a drop-in");
    }
    dir
}

/// The path of an installed program; a missing one is a failure naming its package.
pub fn program(name: &str, package: &str) -> PathBuf {
    let path = Path::new("/usr/bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: install the Debian package `{package}`",
        path.display()
    );
    path
}

fn collect(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// A started process with its output being read.
pub struct Running {
    pub child: Child,
    out: JoinHandle<String>,
    err: JoinHandle<String>,
    pub what: String,
}

/// What a process did: its status (`None`: killed after the timeout) and output.
pub struct Finished {
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    pub what: String,
}

impl Finished {
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
    pub fn report(&self) -> String {
        format!(
            "===== {}\n----- status: {:?}\n----- stdout:\n{}\n----- stderr:\n{}",
            self.what, self.status, self.stdout, self.stderr
        )
    }
}

/// Starts `path args` on the drop-ins with the device address 127.0.0.`octet`.
pub fn spawn(lib: &Path, path: &Path, args: &[&str], octet: u8) -> Running {
    spawn_at(None, lib, path, args, &format!("127.0.0.{octet}:4791"))
}

/// Starts `path args` on the drop-ins with the device address `addr` (`SOFTVERBS_ADDR`),
/// in network namespace `netns` if given (`ip netns exec`).
pub fn spawn_at(
    netns: Option<&str>,
    lib: &Path,
    path: &Path,
    args: &[&str],
    addr: &str,
) -> Running {
    let what = format!(
        "{}SOFTVERBS_ADDR={addr} LD_LIBRARY_PATH={} {} {}",
        netns.map_or(String::new(), |n| format!("ip netns exec {n} ")),
        lib.display(),
        path.display(),
        args.join(" ")
    );
    let mut command = match netns {
        Some(netns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", netns, "/usr/bin/stdbuf"]);
            c
        }
        None => Command::new("/usr/bin/stdbuf"),
    };
    let mut child = command
        .args(["-oL", "-eL"])
        .arg(path)
        .args(args)
        .env("LD_LIBRARY_PATH", lib)
        .env("LD_BIND_NOW", "1")
        .env("SOFTVERBS_ADDR", addr)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let out = collect(child.stdout.take().expect("piped"));
    let err = collect(child.stderr.take().expect("piped"));
    Running {
        child,
        out,
        err,
        what,
    }
}

impl Running {
    /// Waits for the exit, killing the process after `timeout`.
    pub fn wait(mut self, timeout: Duration) -> Finished {
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                break Some(s);
            }
            if start.elapsed() > timeout {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Finished {
            status,
            stdout: self.out.join().unwrap_or_default(),
            stderr: self.err.join().unwrap_or_default(),
            what: self.what,
        }
    }

    /// Kills a persistent server and collects its output; `exited` says whether it had
    /// already ended (and how).
    pub fn stop(mut self) -> (Option<ExitStatus>, Finished) {
        let before = self.child.try_wait().expect("wait");
        if before.is_none() {
            let _ = self.child.kill();
        }
        let status = self.child.wait().ok();
        (
            before,
            Finished {
                status,
                stdout: self.out.join().unwrap_or_default(),
                stderr: self.err.join().unwrap_or_default(),
                what: self.what,
            },
        )
    }
}

/// Programs run one pair at a time (the machine is small and each side busy-polls).
pub static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Waits for a started child (stdout/stderr piped), killing it after `timeout`: status
/// (`None` when killed), stdout, stderr.
pub fn spawn_wait(mut child: Child, timeout: Duration) -> (Option<ExitStatus>, String, String) {
    let out = collect(child.stdout.take().expect("piped stdout"));
    let err = collect(child.stderr.take().expect("piped stderr"));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status,
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    )
}

/// How long after its device is up a server is given to reach `rdma_listen`.
pub const LISTEN_GRACE: Duration = Duration::from_millis(500);

/// Whether process `pid` runs librdmacm's CM thread (named `rdmacm-cm`): it starts when
/// the library first opens the devices, in the program's `rdma_bind_addr` (or
/// `rdma_create_ep`), right before its `rdma_listen`.
pub fn cm_started(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.filter_map(Result::ok).any(|t| {
        std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "rdmacm-cm")
    })
}

/// Waits (at most 30 s) until `server`'s CM thread runs, then [`LISTEN_GRACE`]; an error
/// if it exits first or never gets there.
pub fn wait_listening(server: &mut Running) -> Result<(), String> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if let Ok(Some(s)) = server.child.try_wait() {
            return Err(format!("server exited early ({s})"));
        }
        if cm_started(server.child.id()) {
            std::thread::sleep(LISTEN_GRACE);
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err("the server's connection manager never started".into())
}
