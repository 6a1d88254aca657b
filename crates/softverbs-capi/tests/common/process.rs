//! Programs run bounded in time, and a server's TCP listen awaited: shared by the drop-in's
//! tests (through `common`) and the command's stack tests (included by path from
//! `softverbs-cli/tests/common/stacks.rs`).

#![allow(dead_code)]

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
