#![allow(dead_code)] // each test binary uses a different part of these helpers
//! Running the verifying peer as processes, bounded in time.

use std::io::{BufRead, BufReader, Read};
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
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    // The line is read on a thread of its own: a server that never announces its port
    // fails the test instead of blocking it in read_line forever.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let read = stdout.read_line(&mut line).map(|_| line);
        let _ = tx.send((read, stdout));
    });
    let Ok((line, stdout)) = rx.recv_timeout(ANNOUNCE_LIMIT) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("stuck: the server announced no port within {ANNOUNCE_LIMIT:?}");
    };
    let line = line.expect("the server's port line");
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
