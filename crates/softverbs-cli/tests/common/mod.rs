//! What the `softverbs` command's tests share: the command with a clean environment, runs
//! bounded in time with one result (exit code, stdout, stderr), a server started on a free
//! port and a ping-pong pair of processes, files in a private folder, and what the tests
//! read back (log lines, `softverbs pcap`'s summary, tshark's fields, pcapng's magic).
//! Network use stays on 127.0.0.0/8 and ::1.

#![allow(dead_code)] // each test binary uses its own part

#[path = "../../../softverbs-e2e/tests/common/first_line.rs"]
mod first_line;

pub use first_line::first_line;
use std::ffi::OsStr;
use std::fs;
use std::io::{BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Longest any one invocation may take.
pub const LIMIT: Duration = Duration::from_secs(60);

/// The variables besides the `SOFTVERBS_*` ones that change what the command logs.
const LOGGING: [&str; 2] = ["RUST_LOG", "NO_COLOR"];

/// `program` (the built `softverbs`, or a copy or installation of it) without any
/// `SOFTVERBS_*` variable of the caller's environment, nor [`LOGGING`]'s.
pub fn command(program: impl AsRef<OsStr>) -> Command {
    let mut command = Command::new(program);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("SOFTVERBS_") {
            command.env_remove(name);
        }
    }
    for name in LOGGING {
        command.env_remove(name);
    }
    command
}

/// The command, without any SOFTVERBS_* variable of the caller's environment nor the
/// logging ones (see [`command`]).
pub fn softverbs() -> Command {
    command(env!("CARGO_BIN_EXE_softverbs"))
}

/// `program` as the tests of `softverbs run` and `install` start it: a [`command`] also
/// without the loader's variables `run` sets (`LD_LIBRARY_PATH`, `LD_BIND_NOW`), with
/// `runtime` as its XDG_RUNTIME_DIR (where `run` makes a private library directory), no
/// stdin, and stdout and stderr piped.
pub fn in_runtime(program: impl AsRef<OsStr>, runtime: &Path) -> Command {
    let mut command = command(program);
    command
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("LD_BIND_NOW")
        .env("XDG_RUNTIME_DIR", runtime)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Reads `pipe` to its end on a thread of its own.
fn collect(mut pipe: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        bytes
    })
}

/// Waits for `child` within [`LIMIT`], killing it (and failing) past that. The stdout and
/// stderr pipes still in `child` are read meanwhile, so a child cannot stall on a full one.
pub fn finish(mut child: Child) -> Output {
    let stdout = child.stdout.take().map(collect);
    let stderr = child.stderr.take().map(collect);
    let deadline = Instant::now() + LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("softverbs did not finish within {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let bytes = |pipe: Option<JoinHandle<Vec<u8>>>| {
        pipe.map(|reader| reader.join().expect("pipe reader"))
            .unwrap_or_default()
    };
    Output {
        status,
        stdout: bytes(stdout),
        stderr: bytes(stderr),
    }
}

/// (exit code, -1 if killed by a signal; stdout; stderr) of `out`.
fn result(out: Output) -> (i32, String, String) {
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `command` with no stdin and stdout and stderr piped, bounded; returns (exit code,
/// stdout, stderr).
pub fn bounded(command: &mut Command) -> (i32, String, String) {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start softverbs");
    result(finish(child))
}

/// Runs `command` as [`bounded`] does; it must succeed without a panic. Returns (stdout,
/// stderr).
pub fn bounded_ok(command: &mut Command) -> (String, String) {
    let (code, out, err) = bounded(command);
    assert!(
        code == 0 && !err.contains("panicked"),
        "{command:?} exited with {code}\nstdout:\n{out}\nstderr:\n{err}"
    );
    (out, err)
}

/// Runs a prepared command, bounded; returns (exit code, stdout, stderr).
pub fn run_command(mut command: Command) -> (i32, String, String) {
    bounded(&mut command)
}

/// Runs `softverbs ARGS`, bounded; returns (exit code, stdout, stderr).
pub fn run(args: &[&str]) -> (i32, String, String) {
    bounded(softverbs().args(args))
}

/// Runs `softverbs ARGS` with `env` set, bounded; returns (exit code, stdout, stderr).
pub fn run_with_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    bounded(softverbs().args(args).envs(env.iter().copied()))
}

/// Runs `softverbs ARGS` and expects success without a panic; returns stdout.
pub fn run_ok(args: &[&str]) -> String {
    bounded_ok(softverbs().args(args)).0
}

/// Starts `softverbs ARGS --server -p 0 [EXTRA]` (with `env`) and reads the TCP port it
/// announces on its first line; returns the server, the rest of its stdout, the port and
/// that first line.
fn serve(
    args: &[&str],
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Child, BufReader<ChildStdout>, u16, String) {
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
    let (line, stdout) = first_line(&mut child, LIMIT, "TCP port");
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
    (child, stdout, port, line)
}

/// Starts `softverbs ARGS --server -p 0 [EXTRA]` (with `env`) and reads the TCP port it
/// announces on its first line.
pub fn start_server_with(
    args: &[&str],
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Child, BufReader<ChildStdout>, u16) {
    let (child, stdout, port, _) = serve(args, extra, env);
    (child, stdout, port)
}

/// Starts `softverbs ARGS --server -p 0 --listen 127.0.0.1`; see [`start_server_with`].
pub fn start_server(args: &[&str]) -> (Child, BufReader<ChildStdout>, u16) {
    start_server_with(args, &["--listen", "127.0.0.1"], &[])
}

/// Waits for a started server, bounded; returns (exit code, `head` and the rest of its
/// stdout, stderr).
fn finish_started(
    child: Child,
    head: String,
    mut stdout: BufReader<ChildStdout>,
) -> (i32, String, String) {
    let (code, _, err) = result(finish(child));
    let mut out = head;
    stdout.read_to_string(&mut out).expect("server output");
    (code, out, err)
}

/// Waits for the server and returns its exit code and the rest of its output (stdout,
/// then stderr).
pub fn finish_server(child: Child, stdout: BufReader<ChildStdout>) -> (i32, String) {
    let (code, out, err) = finish_started(child, String::new(), stdout);
    (code, out + &err)
}

/// `softverbs pingpong --server` and `--client` as two processes, each side with its own
/// environment and both with `args` (the same `-n` and `-s`, as ibv_rc_pingpong wants).
/// Returns (server, client), each (exit code, stdout, stderr).
pub fn pingpong_pair(
    args: &[&str],
    server_env: &[(&str, &str)],
    client_env: &[(&str, &str)],
) -> ((i32, String, String), (i32, String, String)) {
    let server_args: Vec<&str> = [&"pingpong"].into_iter().chain(args).copied().collect();
    let (server, stdout, port, line) = serve(&server_args, &["--listen", "127.0.0.1"], server_env);
    let port = port.to_string();
    let mut client_args = vec!["pingpong", "--client", "127.0.0.1", "-p", &port];
    client_args.extend_from_slice(args);
    let client = run_with_env(&client_args, client_env);
    (finish_started(server, line, stdout), client)
}

/// The log lines (as the fmt subscriber writes them: a timestamp, then the level) in
/// `text`.
pub fn log_lines(text: &str) -> Vec<&str> {
    const LEVELS: [&str; 5] = [" TRACE ", " DEBUG ", "  INFO ", "  WARN ", " ERROR "];
    text.lines()
        .filter(|l| l.starts_with("20") && LEVELS.iter().any(|level| l.contains(level)))
        .collect()
}

/// Empties (or makes) the folder `dir`.
fn fresh(dir: PathBuf) -> PathBuf {
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("create a temporary folder");
    dir
}

/// A private folder for one test's files, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new folder named after the test.
    pub fn new(name: &str) -> TempDir {
        TempDir(fresh(
            std::env::temp_dir().join(format!("softverbs-cli-{name}-{}", std::process::id())),
        ))
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
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A fresh folder `softverbs-NAME` of this user, mode 0700, under cargo's temporary
/// directory (the target's file system, where the built executable can be hard-linked),
/// left there after the test.
pub fn private_dir(name: &str) -> PathBuf {
    let dir = fresh(Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("softverbs-{name}")));
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).expect("chmod 0700");
    dir
}

/// The value of the variable `name` in the output of `env`.
pub fn env_var<'a>(env_output: &'a str, name: &str) -> Option<&'a str> {
    env_output
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix('='))
}

/// A path as a command-line argument.
pub fn text(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temporary path")
}

/// The packet count of `softverbs pcap` output's summary line.
pub fn packets(listing: &str) -> usize {
    listing
        .lines()
        .find(|l| l.contains(" packets, "))
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no summary in {listing}"))
}

/// Runs `tshark ARGS`, which must succeed; returns its stdout.
pub fn tshark(args: &[&str]) -> String {
    let out = Command::new("tshark")
        .args(args)
        .output()
        .expect("tshark (Debian package tshark; scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "tshark {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The first four bytes of a pcapng file (a Section Header Block).
pub const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];
