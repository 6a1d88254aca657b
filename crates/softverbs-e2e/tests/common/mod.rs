#![allow(dead_code)] // each test binary uses a different part of these helpers
//! Running the verifying peer as processes, bounded in time.

mod first_line;

use first_line::first_line;
use std::io::{BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The peer binary.
pub fn peer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_softverbs-e2e-peer"))
}

/// A running server: the child and the TCP port it announced.
pub struct Server {
    pub child: Child,
    pub port: u16,
    pub stdout: BufReader<std::process::ChildStdout>,
}

/// Longest a server may take to announce its port.
const ANNOUNCE_LIMIT: Duration = Duration::from_secs(60);

/// Starts `command` (a `--server` invocation) and reads the port it announces (within
/// [`ANNOUNCE_LIMIT`], killing it and failing past that).
pub fn start_server(mut command: Command) -> Server {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the server");
    let (line, stdout) = first_line(&mut child, ANNOUNCE_LIMIT, "port");
    let port = line
        .trim()
        .strip_prefix("port ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("server said {line:?}"));
    Server {
        child,
        port,
        stdout,
    }
}

/// Waits for `child` to exit within `limit`, killing it (and failing) if it does not.
/// Returns its exit code and the rest of its output.
pub fn finish(mut child: Child, out: Option<&mut dyn Read>, limit: Duration) -> (i32, String) {
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("a peer did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut text = String::new();
    if let Some(out) = out {
        let _ = out.read_to_string(&mut text);
    } else if let Some(mut stdout) = child.stdout.take() {
        let _ = stdout.read_to_string(&mut text);
    }
    (status.code().unwrap_or(-1), text)
}
