//! A server's announcement, read within a time limit: shared by the end-to-end tests and
//! the `softverbs` command's tests (which include this file by path).

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout};
use std::time::Duration;

/// Reads the first line of `child`'s piped stdout within `limit`, on a thread of its own,
/// so that a server that never announces itself fails the test (killed, `what` named)
/// instead of blocking it in `read_line` forever. Returns the line and the rest of stdout.
pub fn first_line(
    child: &mut Child,
    limit: Duration,
    what: &str,
) -> (String, BufReader<ChildStdout>) {
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout piped"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let read = stdout.read_line(&mut line).map(|_| line);
        let _ = tx.send((read, stdout));
    });
    let Ok((line, stdout)) = rx.recv_timeout(limit) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("stuck: the server announced no {what} within {limit:?}");
    };
    (line.expect("the server's first line"), stdout)
}
