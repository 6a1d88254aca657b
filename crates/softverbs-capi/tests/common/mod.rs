//! Helpers shared by the integration tests: the built cdylib and a directory where it is
//! named `libibverbs.so.1`, and running programs bounded in time.

#![allow(dead_code)]

pub mod rules;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The cdylib cargo built for this test run (`libsoftverbs_capi.so`).
pub fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps directory");
    for dir in [deps, deps.parent().expect("profile directory")] {
        let candidate = dir.join("libsoftverbs_capi.so");
        if candidate.exists() {
            return candidate;
        }
    }
    panic!(
        "libsoftverbs_capi.so not found next to {} or in its parent: cargo builds the cdylib \
         with the library target, so this means the crate-type changed",
        exe.display()
    );
}

/// A directory (under cargo's per-target temporary directory) holding `libibverbs.so.1`
/// as a symlink to the built cdylib: what `LD_LIBRARY_PATH` points at.
pub fn library_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("softverbs-capi-{name}"));
    std::fs::create_dir_all(&dir).expect("create library directory");
    let link = dir.join("libibverbs.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(cdylib(), &link).expect("symlink libibverbs.so.1");
    dir
}

/// Runs `program args` on the drop-in (`LD_LIBRARY_PATH`, `LD_BIND_NOW=1`); returns
/// (exit status, stdout, stderr). A missing program is a failure naming its package.
pub fn run_on_drop_in(
    lib_dir: &Path,
    program: &str,
    args: &[&str],
    package: &str,
) -> (std::process::ExitStatus, String, String) {
    let path = Path::new("/usr/bin").join(program);
    assert!(
        path.exists(),
        "{} is missing: install the Debian package `{package}` (the project's test script \
         installs its packages)",
        path.display()
    );
    let out = Command::new(&path)
        .args(args)
        .env("LD_LIBRARY_PATH", lib_dir)
        .env("LD_BIND_NOW", "1")
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", path.display()));
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Compiles our C test program `tests/c/<source>` into `<name>` with gcc against the
/// installed `<infiniband/verbs.h>`, warnings as errors, plus `flags` (sanitizers,
/// optimisation). It links Debian's libibverbs at build time, so the program carries its
/// versioned references; it runs on whatever `LD_LIBRARY_PATH` names.
pub fn compile_c(source: &str, name: &str, flags: &[&str]) -> PathBuf {
    assert!(
        Path::new("/usr/include/infiniband/verbs.h").exists(),
        "verbs.h is missing: install the Debian package libibverbs-dev"
    );
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(source);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("softverbs-capi-c");
    std::fs::create_dir_all(&dir).expect("create the build directory");
    let exe = dir.join(name);
    let out = Command::new("gcc")
        .args([
            "-std=gnu11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pthread",
            "-g",
        ])
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-libverbs")
        .output()
        .expect("run gcc: install the Debian package gcc");
    assert!(
        out.status.success(),
        "gcc {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Reads `pipe` to its end on a thread of its own.
fn collect(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// Waits for `child` (stdout and stderr piped) to exit, or kills it once it has been waited
/// for `timeout`; returns its exit status (`None` when killed), stdout and stderr. The pipes
/// are read meanwhile, so a child never blocks on a full one.
pub fn wait_bounded(mut child: Child, timeout: Duration) -> (Option<ExitStatus>, String, String) {
    let out = collect(child.stdout.take().expect("piped stdout"));
    let err = collect(child.stderr.take().expect("piped stderr"));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for a child") {
            break Some(status);
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

/// Runs `command` (stdin closed, output captured) to completion, or kills it after
/// `timeout`: [`wait_bounded`] for a program started here.
pub fn run_bounded(
    command: &mut Command,
    timeout: Duration,
) -> (Option<ExitStatus>, String, String) {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {command:?}: {e}"));
    wait_bounded(child, timeout)
}

/// Socket inodes in LISTEN state on local TCP port `port` (IPv4 and IPv6).
fn listening_inodes(port: u16) -> Vec<String> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 10 {
                continue;
            }
            let local_port = fields[1]
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port) && fields[3] == "0A" {
                inodes.push(fields[9].to_string());
            }
        }
    }
    inodes
}

/// Whether process `pid` holds a socket listening on TCP port `port`.
pub fn listens(pid: u32, port: u16) -> bool {
    let inodes = listening_inodes(port);
    if inodes.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(Result::ok).any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| {
            let target = target.to_string_lossy().into_owned();
            inodes.iter().any(|i| target == format!("socket:[{i}]"))
        })
    })
}

/// Waits (bounded by `limit`) until `server` listens on TCP port `port`; an `Err` says why
/// not (it exited first, or the time ran out). A client started before that would find no
/// server, and a pause of fixed length is too short on a loaded machine.
pub fn wait_until_listening(server: &mut Child, port: u16, limit: Duration) -> Result<(), String> {
    let start = Instant::now();
    while !listens(server.id(), port) {
        if let Ok(Some(status)) = server.try_wait() {
            return Err(format!(
                "the server exited ({status}) before listening on TCP port {port}"
            ));
        }
        if start.elapsed() > limit {
            return Err(format!(
                "stuck: the server did not listen on TCP port {port} within {limit:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}
