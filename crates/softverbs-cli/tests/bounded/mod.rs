//! Runs of the built `softverbs` for the logging and statistics tests: each within a
//! time limit, with a clean environment (none of the `SOFTVERBS_*` variables nor
//! `RUST_LOG` of the caller leaks in), devices on automatically chosen 127.0.0.x addresses
//! and the exchange on 127.0.0.1.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Longest any one invocation may take.
pub const LIMIT: Duration = Duration::from_secs(60);

/// Every variable that changes what the command logs, reports or injects.
const CLEARED: [&str; 9] = [
    "SOFTVERBS_ADDR",
    "SOFTVERBS_NETWORK",
    "SOFTVERBS_PCAP",
    "SOFTVERBS_FAULTS",
    "SOFTVERBS_STATS",
    "SOFTVERBS_LOG",
    "SOFTVERBS_LOG_FILE",
    "RUST_LOG",
    "NO_COLOR",
];

/// What a run left: exit code (-1 if killed by a signal), stdout, stderr.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// `softverbs ARGS` with `env` set and everything else of [`CLEARED`] removed.
pub fn softverbs(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_softverbs"));
    for name in CLEARED {
        command.env_remove(name);
    }
    command.envs(env.iter().copied()).args(args);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Reads `pipe` to its end on a thread of its own.
fn collect(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// Waits for `child` within [`LIMIT`] (its pipes read meanwhile), killing it (and
/// failing) past that. `stdout_head` is what was already read of its stdout.
fn finish(mut child: Child, stdout_head: String) -> Run {
    let out = child.stdout.take().map(collect);
    let err = child.stderr.take().map(collect);
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
    let text = |h: Option<std::thread::JoinHandle<String>>| {
        h.map(|h| h.join().unwrap_or_default()).unwrap_or_default()
    };
    Run {
        code: status.code().unwrap_or(-1),
        stdout: stdout_head + &text(out),
        stderr: text(err),
    }
}

/// Runs `softverbs ARGS` with `env`, bounded.
pub fn run(args: &[&str], env: &[(&str, &str)]) -> Run {
    let child = softverbs(args, env).spawn().expect("start softverbs");
    finish(child, String::new())
}

/// `softverbs pingpong --server` and `--client` as two processes, each side with its own
/// environment and both with `args` (the same `-n` and `-s`, as ibv_rc_pingpong wants).
/// Returns (server, client).
pub fn pingpong_pair(
    args: &[&str],
    server_env: &[(&str, &str)],
    client_env: &[(&str, &str)],
) -> (Run, Run) {
    let mut server_args = vec!["pingpong", "--server", "-p", "0", "--listen", "127.0.0.1"];
    server_args.extend_from_slice(args);
    let mut server = softverbs(&server_args, server_env)
        .spawn()
        .expect("start the server");
    let mut stdout = BufReader::new(server.stdout.take().expect("stdout"));
    // The first line is read on a thread of its own, so a server that never announces its
    // port fails the test after LIMIT instead of blocking it in read_line forever.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let read = stdout.read_line(&mut line).map(|_| line);
        let _ = tx.send((read, stdout));
    });
    let Ok((line, stdout)) = rx.recv_timeout(LIMIT) else {
        let _ = server.kill();
        let _ = server.wait();
        panic!("stuck: the server announced no TCP port within {LIMIT:?}");
    };
    let line = line.expect("the server's first line");
    let Some(port) = line
        .trim()
        .strip_prefix("waiting for a client on TCP port ")
        .map(str::to_owned)
    else {
        let _ = server.kill();
        let _ = server.wait();
        panic!("the server said {line:?}");
    };
    let mut client_args = vec!["pingpong", "--client", "127.0.0.1", "-p", &port];
    client_args.extend_from_slice(args);
    let client = run(&client_args, client_env);
    server.stdout = None;
    let mut server_run = finish(server, line);
    let mut rest = String::new();
    let mut stdout = stdout;
    let _ = stdout.read_to_string(&mut rest);
    server_run.stdout.push_str(&rest);
    (server_run, client)
}

/// The log lines (as the fmt subscriber writes them: a timestamp, then the level) in
/// `text`.
pub fn log_lines(text: &str) -> Vec<&str> {
    const LEVELS: [&str; 5] = [" TRACE ", " DEBUG ", "  INFO ", "  WARN ", " ERROR "];
    text.lines()
        .filter(|l| l.starts_with("20") && LEVELS.iter().any(|level| l.contains(level)))
        .collect()
}
