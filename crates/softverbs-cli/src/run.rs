//! `softverbs run -- CMD ARGS…`: any verbs program, unmodified, on the drop-in
//! `libibverbs.so.1` (`libsoftverbs_capi.so`).
//!
//! The library is `--lib PATH`, else `SOFTVERBS_LIB`, else the first of:
//!
//! 1. `../lib/softverbs/libsoftverbs_capi.so` beside this executable, where
//!    `softverbs install` puts it (`PREFIX/bin/softverbs`, `PREFIX/lib/softverbs/`);
//! 2. `libsoftverbs_capi.so` in the `deps/` directory beside this executable, or next to it
//!    (cargo's layout: building this package builds the drop-in as a dependency, into
//!    `deps/`).
//!
//! `cargo install` copies this executable alone and deletes the build directory with the
//! library in it: nothing then finds a library, and the error says the one command that
//! installs it beside the executable (`softverbs install --prefix` the executable's
//! prefix, run from a clone).
//!
//! The program must find the library as `libibverbs.so.1`. An installed library has that
//! name beside it (a symlink `softverbs install` makes), and its directory goes first on
//! `LD_LIBRARY_PATH`; for any other library a private directory, one per user and
//! library, holds the symlink. The program then replaces this process (`exec`), so its
//! signals and exit status are its own. `SOFTVERBS_*` variables reach the program as they
//! are; `--addr` and `--pcap` set `SOFTVERBS_ADDR` and `SOFTVERBS_PCAP`; `-v` says on
//! stderr which library the program gets and why.
//!
//! `--dev-node` (or `SOFTVERBS_DEV_NODE=1`) runs the program in its own user and mount
//! namespaces where `/dev/infiniband/softverbs0` is a character device it can open for
//! reading and writing (the real `/dev/null` bound there), which UCX requires before it
//! lists a verbs device (`devnode.rs`). The program keeps the caller's uid and gid; its
//! `/dev` is otherwise the host's; nothing changes outside its namespaces. If the kernel
//! refuses the namespaces the program is not started, and the error names the cause.

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

/// The file cargo builds from `softverbs-capi`, and the name it is installed under.
pub const LIB_FILE: &str = "libsoftverbs_capi.so";
/// Environment variable naming the drop-in when `--lib` is not given.
pub const LIB_ENV: &str = "SOFTVERBS_LIB";
/// The name programs load the library by.
pub const SONAME: &str = "libibverbs.so.1";
/// The file cargo builds from `softverbs-rdmacm`, the drop-in `librdmacm.so.1`: it goes with
/// the verbs library, from the same directory.
pub const CM_LIB_FILE: &str = "libsoftverbs_rdmacm.so";
/// The name programs load the connection manager's library by.
pub const CM_SONAME: &str = "librdmacm.so.1";

/// The drop-in `librdmacm.so.1` that goes with the verbs library `lib`: the file beside it,
/// if there is one (absolute, without symlinks).
pub fn cm_library(lib: &Path) -> Option<PathBuf> {
    let path = lib.parent()?.join(CM_LIB_FILE);
    path.is_file()
        .then(|| fs::canonicalize(&path).ok())
        .flatten()
}

/// Where `softverbs install --prefix PREFIX` puts the library, beside `PREFIX/bin/softverbs`.
pub fn installed_lib_dir(prefix: &Path) -> PathBuf {
    prefix.join("lib").join("softverbs")
}

/// Options of `softverbs run`.
#[derive(clap::Args, Clone, Debug)]
pub struct RunArgs {
    /// The drop-in library [default: SOFTVERBS_LIB, else ../lib/softverbs/ beside this
    /// executable, where `softverbs install` puts it, else the deps/ directory beside it or
    /// the executable's own directory, where cargo builds it].
    #[arg(long = "lib", value_name = "PATH")]
    pub lib: Option<PathBuf>,

    /// Say on stderr which drop-in library the program gets (its path, and where it was
    /// found) and the directory put first on LD_LIBRARY_PATH.
    #[arg(short = 'v', long = "verbose")]
    pub verbose: bool,

    /// The device address (sets SOFTVERBS_ADDR): IP, IP:PORT or [IPv6]:PORT.
    #[arg(long = "addr", value_name = "IP[:PORT]", value_parser = device_address)]
    pub addr: Option<String>,

    /// Capture every packet of the program's device into this pcap file (sets
    /// SOFTVERBS_PCAP).
    #[arg(long = "pcap", value_name = "FILE")]
    pub pcap: Option<PathBuf>,

    /// Run the program where /dev/infiniband/softverbs0 is a character device it can read
    /// and write, as UCX requires before it uses a verbs device: a user and mount namespace
    /// of its own (the program keeps your uid and gid) with the real /dev/null bound there
    /// and the rest of /dev as it is. Nothing changes outside the program's namespace. Also
    /// SOFTVERBS_DEV_NODE=1. Fails, without starting the program, where the kernel forbids
    /// unprivileged user namespaces.
    #[arg(long = "dev-node")]
    pub dev_node: bool,

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
    if args.dev_node || crate::devnode::requested_by_env() {
        match crate::devnode::enter() {
            Ok(done) if args.verbose => eprintln!("softverbs: {done}"),
            Ok(_) => {}
            Err(error) => {
                eprintln!("softverbs: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
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
    let cm = cm_library(&lib.path);
    let dir = match installed_dir(&lib.path, cm.as_deref()) {
        Some(dir) => dir,
        None => library_dir(&lib.path, cm.as_deref())?,
    };
    if args.verbose {
        eprintln!(
            "softverbs: drop-in library {} ({}), loaded as {SONAME} from {} (first on \
             LD_LIBRARY_PATH)",
            lib.path.display(),
            lib.origin,
            dir.display()
        );
        match &cm {
            Some(cm) => eprintln!(
                "softverbs: drop-in {CM_SONAME} {} (beside the verbs library)",
                cm.display()
            ),
            None => eprintln!(
                "softverbs: no {CM_LIB_FILE} beside the verbs library: a program using the \
                 RDMA connection manager gets the system's {CM_SONAME}"
            ),
        }
    }
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

/// The drop-in library found, and how.
#[derive(Debug)]
pub struct Library {
    /// Absolute, without symlinks.
    pub path: PathBuf,
    /// Where it was found, for messages: "--lib", "SOFTVERBS_LIB", "installed beside this
    /// executable", "cargo's build directory".
    pub origin: &'static str,
}

/// The drop-in: `lib` (`--lib`), else `SOFTVERBS_LIB`, else the installed one beside this
/// executable, else cargo's.
pub fn find_library(lib: Option<&Path>) -> Result<Library, Error> {
    let (path, origin, prefix) = match (lib, std::env::var_os(LIB_ENV).filter(|v| !v.is_empty())) {
        (Some(path), _) => (path.to_owned(), "--lib", "--lib "),
        (None, Some(path)) => (PathBuf::from(path), LIB_ENV, "SOFTVERBS_LIB="),
        (None, None) => {
            let (path, origin) = beside_executable()?;
            (path, origin, "")
        }
    };
    let name = format!("{prefix}{}", path.display());
    let path = fs::canonicalize(&path).map_err(|e| format!("{name}: {e}"))?;
    let mut magic = [0u8; 4];
    fs::File::open(&path)
        .and_then(|mut file| file.read_exact(&mut magic))
        .map_err(|e| format!("{name}: {e}"))?;
    if &magic != b"\x7fELF" {
        return Err(format!("{name}: not a shared library (no ELF header)").into());
    }
    Ok(Library { path, origin })
}

/// `libsoftverbs_capi.so` for this executable: installed in `../lib/softverbs/`, else
/// where cargo puts it: in `deps/` (what rustc wrote last: a build of this package
/// rebuilds it there) or next to the executable (where `cargo build -p softverbs-capi`
/// copies it).
fn beside_executable() -> Result<(PathBuf, &'static str), Error> {
    let exe = std::env::current_exe().map_err(|e| format!("this executable's path: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    // `current_exe` has no symlinks: its directory's parent is `..`.
    let installed_dir = installed_lib_dir(dir.parent().unwrap_or(dir));
    let installed = installed_dir.join(LIB_FILE);
    if installed.is_file() {
        return Ok((installed, "installed beside this executable"));
    }
    for candidate in [dir.join("deps").join(LIB_FILE), dir.join(LIB_FILE)] {
        if candidate.is_file() {
            return Ok((candidate, "cargo's build directory"));
        }
    }
    // `cargo install` leaves PREFIX/bin/softverbs alone: install the library beside it.
    let prefix = match dir.file_name() {
        Some(name) if name == "bin" => dir.parent().map(|p| format!(" --prefix {}", p.display())),
        _ => None,
    }
    .unwrap_or_default();
    Err(format!(
        "the drop-in library {LIB_FILE} is neither installed beside this executable \
         ({installed}) nor built beside it ({deps}, {dir}).\n`cargo install` installs the \
         command alone; to install its library beside it, run from a clone of softverbs:\n  \
         `cargo run --release --locked -p softverbs-cli -- install{prefix}`\nor name a \
         library with --lib PATH or {LIB_ENV}=PATH",
        installed = installed_dir.display(),
        deps = dir.join("deps").display(),
        dir = dir.display(),
    )
    .into())
}

/// The directory of an installed library, when it can go on `LD_LIBRARY_PATH` as it is:
/// it holds `libibverbs.so.1` resolving to `lib` itself and, when there is a connection
/// manager's library `cm`, `librdmacm.so.1` resolving to it (the symlinks `softverbs
/// install` makes), and its path holds no `:` or `;`.
fn installed_dir(lib: &Path, cm: Option<&Path>) -> Option<PathBuf> {
    let dir = lib.parent()?;
    let named = fs::canonicalize(dir.join(SONAME)).ok()?;
    let cm_named = match cm {
        Some(cm) => fs::canonicalize(dir.join(CM_SONAME)).ok()? == cm,
        None => true,
    };
    let usable = !dir.as_os_str().as_bytes().iter().any(|b| b":;".contains(b));
    (named == lib && cm_named && usable).then(|| dir.to_owned())
}

/// The private directory holding `libibverbs.so.1` → `lib` (and `librdmacm.so.1` → `cm`,
/// when there is one): one per user and library
/// (stable, so repeated runs reuse it instead of leaving directories behind, since the
/// program replaces this process and nothing cleans up after it). Under `XDG_RUNTIME_DIR`
/// if that is a directory of this user, else the temporary directory. Safe against other
/// users (an existing directory must be a real directory of this user that no one else
/// can write) and against concurrent runs (the symlink is replaced by an atomic rename).
fn library_dir(lib: &Path, cm: Option<&Path>) -> Result<PathBuf, Error> {
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
    link_as(&dir, SONAME, Some(lib))?;
    link_as(&dir, CM_SONAME, cm)?;
    Ok(dir)
}

/// Makes `dir/name` a symlink to `target` (replaced by an atomic rename, so a concurrent
/// run never sees it missing), or removes it when there is no target.
fn link_as(dir: &Path, name: &str, target: Option<&Path>) -> Result<(), Error> {
    let link = dir.join(name);
    let Some(target) = target else {
        return match fs::remove_file(&link) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(format!("remove {}: {e}", link.display()).into())
            }
            _ => Ok(()),
        };
    };
    if fs::read_link(&link).ok().as_deref() != Some(target) {
        let temporary = dir.join(format!(".{name}.{}", std::process::id()));
        let _ = fs::remove_file(&temporary);
        std::os::unix::fs::symlink(target, &temporary)
            .and_then(|()| fs::rename(&temporary, &link))
            .map_err(|e| format!("symlink {} -> {}: {e}", link.display(), target.display()))?;
    }
    Ok(())
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
