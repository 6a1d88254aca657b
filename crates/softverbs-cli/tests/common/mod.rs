//! What the `softverbs` command's tests share: the command with a clean environment, runs
//! bounded in time, a server started on a free port, and files in a private folder.
//! Network use stays on 127.0.0.0/8 and ::1.

#![allow(dead_code)] // each test binary uses its own part

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Longest any one invocation may take.
pub const LIMIT: Duration = Duration::from_secs(60);

/// The command, without any SOFTVERBS_* variable of the caller's environment.
pub fn softverbs() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_softverbs"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("SOFTVERBS_") {
            command.env_remove(name);
        }
    }
    command
}

/// Waits for `child` within [`LIMIT`], killing it (and failing) past that.
pub fn finish(mut child: Child) -> Output {
    let deadline = Instant::now() + LIMIT;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("softverbs did not finish within {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().expect("output")
}

/// Runs a prepared command, bounded; returns (exit code, stdout, stderr).
pub fn run_command(mut command: Command) -> (i32, String, String) {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start softverbs");
    let out = finish(child);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `softverbs ARGS`, bounded; returns (exit code, stdout, stderr).
pub fn run(args: &[&str]) -> (i32, String, String) {
    let mut command = softverbs();
    command.args(args);
    run_command(command)
}

/// Runs `softverbs ARGS` with `env` set, bounded; returns (exit code, stdout, stderr).
pub fn run_with_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut command = softverbs();
    command.args(args).envs(env.iter().copied());
    run_command(command)
}

/// Runs `softverbs ARGS` and expects success; returns stdout.
pub fn run_ok(args: &[&str]) -> String {
    let (code, out, err) = run(args);
    assert_eq!(
        code, 0,
        "softverbs {args:?} failed\nstdout:\n{out}\nstderr:\n{err}"
    );
    out
}

/// Starts `softverbs ARGS --server -p 0 [EXTRA]` (with `env`) and reads the TCP port it
/// announces on its first line.
pub fn start_server_with(
    args: &[&str],
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Child, BufReader<ChildStdout>, u16) {
    let mut child = softverbs()
        .args(args)
        .args(["--server", "-p", "0"])
        .args(extra)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    // The first line is read on a thread of its own, so a server that never announces its
    // port fails the test after LIMIT instead of blocking it in read_line forever.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let read = stdout.read_line(&mut line).map(|_| line);
        let _ = tx.send((read, stdout));
    });
    let Ok((line, stdout)) = rx.recv_timeout(LIMIT) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("stuck: the server announced no TCP port within {LIMIT:?}");
    };
    let line = line.expect("the server's first line");
    let Some(port) = line
        .trim()
        .strip_prefix("waiting for a client on TCP port ")
        .and_then(|p| p.parse().ok())
    else {
        let _ = child.kill();
        let out = finish(child);
        panic!(
            "the server said {line:?}; stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    (child, stdout, port)
}

/// Starts `softverbs ARGS --server -p 0 --listen 127.0.0.1`; see [`start_server_with`].
pub fn start_server(args: &[&str]) -> (Child, BufReader<ChildStdout>, u16) {
    start_server_with(args, &["--listen", "127.0.0.1"], &[])
}

/// Waits for the server and returns its exit code and the rest of its output (stdout,
/// then stderr).
pub fn finish_server(child: Child, mut stdout: BufReader<ChildStdout>) -> (i32, String) {
    let out = finish(child);
    let mut text = String::new();
    stdout.read_to_string(&mut text).expect("server output");
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

/// A private folder for one test's files, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new folder named after the test.
    pub fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("softverbs-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a temporary folder");
        TempDir(dir)
    }

    /// A path in the folder.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
