//! `softverbs run -- CMD ARGS…`: any verbs program, unmodified, on the drop-in
//! `libibverbs.so.1` (`libsoftverbs_capi.so`).
//!
//! The library is `--lib PATH`, else `SOFTVERBS_LIB`, else `libsoftverbs_capi.so` in the
//! `deps/` directory beside this executable or next to it (cargo's layout: building this
//! package builds the drop-in as a dependency, into `deps/`). A private directory, one per
//! user and library, holds a symlink `libibverbs.so.1` to it; that directory goes first on
//! `LD_LIBRARY_PATH` and the program replaces this process (`exec`), so its signals and
//! exit status are its own. `SOFTVERBS_*` variables reach the program as they are;
//! `--addr` and `--pcap` set `SOFTVERBS_ADDR` and `SOFTVERBS_PCAP`.

use crate::Error;
use softverbs_device::device::PCAP_ENV;
use softverbs_device::udp::{parse_address, ADDR_ENV};
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The file cargo builds from `softverbs-capi`.
const LIB_FILE: &str = "libsoftverbs_capi.so";
/// Environment variable naming the drop-in when `--lib` is not given.
const LIB_ENV: &str = "SOFTVERBS_LIB";
/// The name programs load the library by.
const SONAME: &str = "libibverbs.so.1";

/// Options of `softverbs run`.
#[derive(clap::Args, Clone, Debug)]
pub struct RunArgs {
    /// The drop-in library [default: SOFTVERBS_LIB, else libsoftverbs_capi.so in the deps/
    /// directory beside this executable or next to it, where cargo builds it].
    #[arg(long = "lib", value_name = "PATH")]
    pub lib: Option<PathBuf>,

    /// The device address (sets SOFTVERBS_ADDR): IP, IP:PORT or [IPv6]:PORT.
    #[arg(long = "addr", value_name = "IP[:PORT]", value_parser = device_address)]
    pub addr: Option<String>,

    /// Capture every packet of the program's device into this pcap file (sets
    /// SOFTVERBS_PCAP).
    #[arg(long = "pcap", value_name = "FILE")]
    pub pcap: Option<PathBuf>,

    /// The program and its arguments (after `--`, so that its options are its own).
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// `--addr`: what `SOFTVERBS_ADDR` accepts, checked here rather than by the device (which
/// would only make the program find no device).
fn device_address(spec: &str) -> Result<String, String> {
    parse_address(spec)
        .map(|_| spec.to_owned())
        .map_err(|_| format!("{spec:?} is not IP, IP:PORT or [IPv6]:PORT"))
}

/// Runs `softverbs run`: returns only if the program could not be started (exit status
/// 127 if it does not exist, 126 if it cannot be executed, as a shell), or 1 if the
/// library could not be set up.
pub fn run(args: &RunArgs) -> ExitCode {
    let mut command = match prepare(args) {
        Ok(command) => command,
        Err(error) => {
            eprintln!("softverbs: {error}");
            return ExitCode::FAILURE;
        }
    };
    let error = command.exec();
    let program = args.command[0].to_string_lossy();
    if error.kind() == io::ErrorKind::NotFound {
        if program.contains('/') {
            eprintln!("softverbs: {program}: No such file or directory");
        } else {
            eprintln!("softverbs: {program}: command not found");
        }
        ExitCode::from(127)
    } else {
        eprintln!("softverbs: {program}: {error}");
        ExitCode::from(126)
    }
}

/// The program's command: the library found, its directory on `LD_LIBRARY_PATH`, the
/// `SOFTVERBS_*` variables of the options.
fn prepare(args: &RunArgs) -> Result<std::process::Command, Error> {
    let lib = find_library(args.lib.as_deref())?;
    let dir = library_dir(&lib)?;
    let mut command = std::process::Command::new(&args.command[0]);
    command.args(&args.command[1..]).env(
        "LD_LIBRARY_PATH",
        library_path(&dir, std::env::var_os("LD_LIBRARY_PATH"))?,
    );
    if let Some(addr) = &args.addr {
        command.env(ADDR_ENV, addr);
    }
    if let Some(pcap) = &args.pcap {
        command.env(PCAP_ENV, pcap);
    }
    Ok(command)
}

/// The drop-in, as an absolute path without symlinks.
fn find_library(lib: Option<&Path>) -> Result<PathBuf, Error> {
    let (path, origin) = match (lib, std::env::var_os(LIB_ENV).filter(|v| !v.is_empty())) {
        (Some(path), _) => (path.to_owned(), "--lib ".to_owned()),
        (None, Some(path)) => (PathBuf::from(path), format!("{LIB_ENV}=")),
        (None, None) => (beside_executable()?, String::new()),
    };
    let name = format!("{origin}{}", path.display());
    let path = fs::canonicalize(&path).map_err(|e| format!("{name}: {e}"))?;
    let mut magic = [0u8; 4];
    fs::File::open(&path)
        .and_then(|mut file| file.read_exact(&mut magic))
        .map_err(|e| format!("{name}: {e}"))?;
    if &magic != b"\x7fELF" {
        return Err(format!("{name}: not a shared library (no ELF header)").into());
    }
    Ok(path)
}

/// `libsoftverbs_capi.so` where cargo puts it for this executable: in `deps/` (what rustc
/// wrote last: a build of this package rebuilds it there) or else next to it (where only
/// `cargo build -p softverbs-capi` copies it, and where an installation would put it).
fn beside_executable() -> Result<PathBuf, Error> {
    let exe = std::env::current_exe().map_err(|e| format!("this executable's path: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    for candidate in [dir.join("deps").join(LIB_FILE), dir.join(LIB_FILE)] {
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(format!(
        "the drop-in library {LIB_FILE} is neither in {deps} nor in {dir}: build it with \
         `cargo build --release -p softverbs-capi` (building softverbs-cli builds it too), or \
         name it with --lib PATH or {LIB_ENV}=PATH",
        deps = dir.join("deps").display(),
        dir = dir.display(),
    )
    .into())
}

/// The private directory holding `libibverbs.so.1` → `lib`: one per user and library
/// (stable, so repeated runs reuse it instead of leaving directories behind, since the
/// program replaces this process and nothing cleans up after it). Under `XDG_RUNTIME_DIR`
/// if that is a directory of this user, else the temporary directory. Safe against other
/// users (an existing directory must be a real directory of this user that no one else
/// can write) and against concurrent runs (the symlink is replaced by an atomic rename).
fn library_dir(lib: &Path) -> Result<PathBuf, Error> {
    let uid = rustix::process::getuid().as_raw();
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|dir| {
            dir.is_absolute()
                && fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir() && m.uid() == uid)
        })
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!(
        "softverbs-run-{uid}-{:016x}",
        fnv1a(lib.as_os_str().as_bytes())
    ));
    match fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("create {}: {e}", dir.display()).into()),
    }
    let meta = fs::symlink_metadata(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is not a private directory of this user (uid {uid}, not writable by others): \
             remove it, or set XDG_RUNTIME_DIR or TMPDIR to a directory of your own",
            dir.display()
        )
        .into());
    }
    let link = dir.join(SONAME);
    if fs::read_link(&link).ok().as_deref() != Some(lib) {
        let temporary = dir.join(format!(".{SONAME}.{}", std::process::id()));
        let _ = fs::remove_file(&temporary);
        std::os::unix::fs::symlink(lib, &temporary)
            .and_then(|()| fs::rename(&temporary, &link))
            .map_err(|e| format!("symlink {} -> {}: {e}", link.display(), lib.display()))?;
    }
    Ok(dir)
}

/// 64-bit FNV-1a: a stable name for a library path (std's hashers may change between
/// releases, which would only scatter directories, but need not).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `LD_LIBRARY_PATH` with `dir` first, then the current value (if any).
fn library_path(dir: &Path, current: Option<OsString>) -> Result<OsString, Error> {
    // The dynamic loader splits LD_LIBRARY_PATH at ':' and ';'.
    if dir.as_os_str().as_bytes().iter().any(|b| b":;".contains(b)) {
        return Err(format!(
            "{} cannot go on LD_LIBRARY_PATH (it contains ':' or ';'): set XDG_RUNTIME_DIR or \
             TMPDIR to another directory",
            dir.display()
        )
        .into());
    }
    let mut value = dir.as_os_str().to_owned();
    if let Some(current) = current.filter(|c| !c.is_empty()) {
        value.push(OsStr::new(":"));
        value.push(current);
    }
    Ok(value)
}
