//! Standard output of the command: every line goes through [`outln!`], which returns an
//! [`OutputError`] instead of panicking as `println!` does when stdout is gone.
//!
//! A reader that goes away (`softverbs perf ... | head -1`: `EPIPE`) ends the command
//! quietly with status 0, as `head` users expect; any other failure to write (a full disk,
//! `/dev/full`) is one line on stderr and status 1 ([`report`]). Only errors of standard
//! output become an `OutputError`: a peer that closes the TCP exchange is an error of the
//! run, never mistaken for a closed pipe.

use std::fmt;
use std::io::{self, Write};

/// Writing to standard output failed.
#[derive(Debug)]
pub struct OutputError(pub io::Error);

impl OutputError {
    /// Whether the reader of standard output went away (`EPIPE`).
    pub fn is_closed_pipe(&self) -> bool {
        self.0.kind() == io::ErrorKind::BrokenPipe
    }
}

impl fmt::Display for OutputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot write to standard output: {}", self.0)
    }
}

impl std::error::Error for OutputError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// Writes one line to standard output (what [`outln!`] calls).
pub fn write_line(args: fmt::Arguments<'_>) -> Result<(), OutputError> {
    let mut out = io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .map_err(OutputError)
}

/// Flushes standard output (a line a peer or a test waits for, before blocking).
pub fn flush() -> Result<(), OutputError> {
    io::stdout().flush().map_err(OutputError)
}

/// `println!` that returns `Result<(), OutputError>` instead of panicking.
macro_rules! outln {
    () => {
        $crate::output::write_line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::output::write_line(format_args!($($arg)*))
    };
}
pub(crate) use outln;

/// The exit status of a command that failed with `error`, which is reported on stderr
/// (one line, `softverbs: ...`) unless it is a closed standard output: that one is the
/// reader's choice and ends the command quietly with status 0. Writing to stderr never
/// panics either.
pub fn report(error: &(dyn std::error::Error + 'static)) -> std::process::ExitCode {
    if error
        .downcast_ref::<OutputError>()
        .is_some_and(OutputError::is_closed_pipe)
    {
        return std::process::ExitCode::SUCCESS;
    }
    let _ = writeln!(io::stderr(), "softverbs: {error}");
    std::process::ExitCode::FAILURE
}
