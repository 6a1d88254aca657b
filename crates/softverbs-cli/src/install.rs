//! `softverbs install [--prefix DIR]`: this command and its drop-in library, installed
//! together so that `softverbs run` finds the library wherever they went and after the
//! build directory is gone.
//!
//! ```text
//! PREFIX/bin/softverbs                          this executable
//! PREFIX/lib/softverbs/libsoftverbs_capi.so     the drop-in libibverbs.so.1
//! PREFIX/lib/softverbs/libibverbs.so.1          -> libsoftverbs_capi.so
//! PREFIX/lib/softverbs/libsoftverbs_rdmacm.so   the drop-in librdmacm.so.1
//! PREFIX/lib/softverbs/librdmacm.so.1           -> libsoftverbs_rdmacm.so
//! ```
//!
//! `run` looks in `../lib/softverbs/` beside its executable ([`installed_lib_dir`]), so the pair can
//! live under any prefix; `LD_LIBRARY_PATH=PREFIX/lib/softverbs` also works without `run`.
//! The library installed is the one `run` would load (`--lib`, `SOFTVERBS_LIB`, else the one
//! beside this executable: cargo's build, when this executable is cargo's). Each file is
//! written beside its destination and renamed over it, so a running `softverbs` or a
//! program that has the library loaded keeps its old copy, and an interrupted install
//! leaves the old installation whole.

use crate::output::outln;
use crate::run::{
    cm_library, find_library, installed_lib_dir, CM_LIB_FILE, CM_SONAME, LIB_FILE, SONAME,
};
use crate::Error;
use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Options of `softverbs install`.
#[derive(clap::Args, Clone, Debug)]
pub struct InstallArgs {
    /// Install into DIR/bin/softverbs and DIR/lib/softverbs/ [default: ~/.local].
    #[arg(long = "prefix", value_name = "DIR")]
    pub prefix: Option<PathBuf>,

    /// The drop-in library to install [default: the one `softverbs run` would load:
    /// SOFTVERBS_LIB, else the one installed or built beside this executable].
    #[arg(long = "lib", value_name = "PATH")]
    pub lib: Option<PathBuf>,
}

/// Runs `softverbs install`: copies this executable and the drop-in under the prefix and
/// prints what it wrote.
pub fn run(args: &InstallArgs) -> Result<(), Error> {
    let prefix = match &args.prefix {
        Some(prefix) => std::path::absolute(prefix)
            .map_err(|e| format!("--prefix {}: {e}", prefix.display()))?,
        None => default_prefix()?,
    };
    let lib = find_library(args.lib.as_deref())?;
    let exe = std::env::current_exe().map_err(|e| format!("this executable's path: {e}"))?;

    let bin_dir = prefix.join("bin");
    let lib_dir = installed_lib_dir(&prefix);
    for dir in [&bin_dir, &lib_dir] {
        fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    }

    let installed_exe = bin_dir.join("softverbs");
    replace_with_copy(&exe, &installed_exe, 0o755)?;
    let installed_lib = lib_dir.join(LIB_FILE);
    replace_with_copy(&lib.path, &installed_lib, 0o644)?;
    let link = lib_dir.join(SONAME);
    replace_with_symlink(Path::new(LIB_FILE), &link)?;

    outln!("installed {}", installed_exe.display())?;
    outln!(
        "installed {} (from {}: {})",
        installed_lib.display(),
        lib.origin,
        lib.path.display()
    )?;
    outln!("installed {} -> {LIB_FILE}", link.display())?;
    // The connection manager's library comes from beside the verbs library; a verbs library
    // named by hand may have none, and then the programs get the system's librdmacm.
    match cm_library(&lib.path) {
        Some(cm) => {
            let installed_cm = lib_dir.join(CM_LIB_FILE);
            replace_with_copy(&cm, &installed_cm, 0o644)?;
            let cm_link = lib_dir.join(CM_SONAME);
            replace_with_symlink(Path::new(CM_LIB_FILE), &cm_link)?;
            outln!(
                "installed {} (from {})",
                installed_cm.display(),
                cm.display()
            )?;
            outln!("installed {} -> {CM_LIB_FILE}", cm_link.display())?;
        }
        None => outln!(
            "no {CM_LIB_FILE} beside {}: {CM_SONAME} not installed (RDMA CM programs get \
             the system's)",
            lib.path.display()
        )?,
    }
    if !on_path(&bin_dir, std::env::var_os("PATH")) {
        outln!(
            "{} is not on PATH: add it, e.g. export PATH=\"{}:$PATH\"",
            bin_dir.display(),
            bin_dir.display()
        )?;
    }
    Ok(())
}

/// `~/.local`, from `HOME`.
fn default_prefix() -> Result<PathBuf, Error> {
    match std::env::var_os("HOME").map(PathBuf::from) {
        Some(home) if home.is_absolute() => Ok(home.join(".local")),
        _ => Err("HOME is not set to an absolute path: give the prefix with --prefix DIR".into()),
    }
}

/// A temporary name beside `path`, unique to this process.
fn temporary_beside(path: &Path) -> PathBuf {
    let mut name = OsString::from(".");
    name.push(path.file_name().unwrap_or_default());
    name.push(format!(".install-{}", std::process::id()));
    path.with_file_name(name)
}

/// Copies `from` to a temporary file beside `to`, sets its mode, and renames it over `to`.
fn replace_with_copy(from: &Path, to: &Path, mode: u32) -> Result<(), Error> {
    let temporary = temporary_beside(to);
    let result = fs::copy(from, &temporary)
        .and_then(|_| fs::set_permissions(&temporary, fs::Permissions::from_mode(mode)))
        .and_then(|()| fs::rename(&temporary, to));
    result.map_err(|e| {
        let _ = fs::remove_file(&temporary);
        format!("install {} as {}: {e}", from.display(), to.display()).into()
    })
}

/// Makes `link` a symlink to `target`, replacing what was there by a rename.
fn replace_with_symlink(target: &Path, link: &Path) -> Result<(), Error> {
    let temporary = temporary_beside(link);
    let _ = fs::remove_file(&temporary);
    let result =
        std::os::unix::fs::symlink(target, &temporary).and_then(|()| fs::rename(&temporary, link));
    result.map_err(|e| {
        let _ = fs::remove_file(&temporary);
        format!("symlink {} -> {}: {e}", link.display(), target.display()).into()
    })
}

/// Whether `dir` is one of `PATH`'s entries.
fn on_path(dir: &Path, path: Option<OsString>) -> bool {
    path.is_some_and(|path| std::env::split_paths(&path).any(|entry| entry == dir))
}
