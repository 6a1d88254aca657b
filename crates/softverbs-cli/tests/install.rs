//! `softverbs install --prefix DIR`: the command and its drop-in library installed
//! together, and the installed `softverbs run` loading the installed library from any
//! working directory with nothing of the build tree reachable (no `SOFTVERBS_LIB`, no
//! `--lib`, an executable outside cargo's target directory). Every invocation is bounded
//! in time; devices use 127.0.0.241..=127.0.0.245 (port 0: any free port).

mod common;

use common::{bounded, bounded_ok, env_var, in_runtime, private_dir};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A fresh directory of this user, mode 0700, under cargo's temporary directory.
fn fresh_dir(name: &str) -> PathBuf {
    private_dir(&format!("install-test-{name}"))
}

/// `program` with none of the variables `run` reads inherited, `runtime` as its
/// XDG_RUNTIME_DIR (where `run` would make a private library directory) and `cwd` as its
/// working directory.
fn command(program: &Path, runtime: &Path, cwd: &Path) -> Command {
    let mut command = in_runtime(program, runtime);
    command.current_dir(cwd);
    command
}

/// The entries of `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

/// Installs the cargo-built `softverbs` under `prefix` and checks the files it wrote.
fn install(prefix: &Path, runtime: &Path) -> String {
    let (stdout, _) = bounded_ok(
        command(Path::new(env!("CARGO_BIN_EXE_softverbs")), runtime, runtime)
            .args(["install", "--prefix"])
            .arg(prefix),
    );
    let exe = prefix.join("bin/softverbs");
    let mode = fs::metadata(&exe)
        .expect("installed executable")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755, "mode {mode:o}");
    let lib_dir = prefix.join("lib/softverbs");
    assert_eq!(
        entries(&lib_dir),
        [
            "libibverbs.so.1",
            "librdmacm.so.1",
            "libsoftverbs_capi.so",
            "libsoftverbs_rdmacm.so"
        ],
        "nothing else (no temporary file) is left"
    );
    assert_eq!(entries(&prefix.join("bin")), ["softverbs"]);
    assert_eq!(
        fs::read_link(lib_dir.join("libibverbs.so.1")).expect("libibverbs.so.1 symlink"),
        Path::new("libsoftverbs_capi.so"),
        "a relative link, so that the directory can move"
    );
    assert_eq!(
        fs::read_link(lib_dir.join("librdmacm.so.1")).expect("librdmacm.so.1 symlink"),
        Path::new("libsoftverbs_rdmacm.so"),
        "the connection manager's library goes with the verbs library"
    );
    for lib in ["libsoftverbs_capi.so", "libsoftverbs_rdmacm.so"] {
        let magic = fs::read(lib_dir.join(lib)).expect("installed library");
        assert_eq!(magic.get(..4), Some(&b"\x7fELF"[..]), "{lib}");
    }
    stdout
}

#[test]
fn the_installed_run_loads_the_installed_library_from_anywhere_with_the_build_tree_out_of_reach() {
    let ibv_devinfo = Path::new("/usr/bin/ibv_devinfo");
    assert!(
        ibv_devinfo.exists(),
        "{} is missing: install the Debian package `ibverbs-utils` (scripts/test.sh installs \
         the packages the suite needs)",
        ibv_devinfo.display()
    );
    let root = fresh_dir("anywhere");
    let (prefix, runtime, elsewhere) = (root.join("prefix"), root.join("run"), root.join("cwd"));
    for dir in [&runtime, &elsewhere] {
        fs::create_dir(dir).expect("create directory");
    }
    let printed = install(&prefix, &runtime);
    let installed_lib = prefix.join("lib/softverbs/libsoftverbs_capi.so");
    assert!(
        printed.contains(&installed_lib.display().to_string()),
        "{printed}"
    );

    // Only the installed files: the executable is outside cargo's target directory, and
    // nothing names a library.
    let installed = prefix.join("bin/softverbs");
    let (stdout, stderr) = bounded_ok(
        command(&installed, &runtime, &elsewhere)
            .env("SOFTVERBS_ADDR", "127.0.0.241:0")
            .args(["run", "-v", "--", "ibv_devinfo"]),
    );
    assert!(stdout.contains("hca_id:\tsoftverbs0"), "{stdout}");
    assert!(stdout.contains("PORT_ACTIVE"), "{stdout}");
    assert!(
        stderr.contains(&format!(
            "drop-in library {} (installed beside this executable)",
            installed_lib.display()
        )),
        "{stderr}"
    );

    // The installed directory itself goes first on LD_LIBRARY_PATH: no private directory
    // is made for an installed library.
    let (stdout, _) = bounded_ok(command(&installed, &runtime, &elsewhere).args(["run", "env"]));
    assert_eq!(
        env_var(&stdout, "LD_LIBRARY_PATH"),
        Some(prefix.join("lib/softverbs").to_str().expect("UTF-8 path")),
        "{stdout}"
    );
    assert!(entries(&runtime).is_empty(), "{:?}", entries(&runtime));
}

#[test]
fn installing_again_with_the_installed_command_replaces_the_installation_in_place() {
    let root = fresh_dir("again");
    let (prefix, runtime) = (root.join("prefix"), root.join("run"));
    fs::create_dir(&runtime).expect("create directory");
    install(&prefix, &runtime);
    let installed = prefix.join("bin/softverbs");
    let before = fs::read(&installed).expect("installed executable");

    // The installed command reinstalls itself and its own library onto themselves.
    let (stdout, _) = bounded_ok(
        command(&installed, &runtime, &root)
            .args(["install", "--prefix"])
            .arg(&prefix),
    );
    assert!(
        stdout.contains("from installed beside this executable"),
        "{stdout}"
    );
    assert_eq!(
        fs::read(&installed).expect("reinstalled executable"),
        before
    );
    assert_eq!(
        entries(&prefix.join("lib/softverbs")),
        [
            "libibverbs.so.1",
            "librdmacm.so.1",
            "libsoftverbs_capi.so",
            "libsoftverbs_rdmacm.so"
        ]
    );
    let (stdout, _) = bounded_ok(command(&installed, &runtime, &root).args(["run", "env"]));
    assert_eq!(
        env_var(&stdout, "LD_LIBRARY_PATH"),
        Some(prefix.join("lib/softverbs").to_str().expect("UTF-8 path"))
    );
}

#[test]
fn without_a_prefix_the_installation_goes_to_dot_local_in_home_and_says_when_bin_is_not_on_path() {
    let root = fresh_dir("home");
    let runtime = root.join("run");
    fs::create_dir(&runtime).expect("create directory");
    let (stdout, _) = bounded_ok(
        command(Path::new(env!("CARGO_BIN_EXE_softverbs")), &runtime, &root)
            .env("HOME", &root)
            .env("PATH", "/usr/bin:/bin")
            .arg("install"),
    );
    let bin = root.join(".local/bin");
    assert!(bin.join("softverbs").is_file(), "{stdout}");
    assert!(
        root.join(".local/lib/softverbs/libsoftverbs_capi.so")
            .is_file(),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("{} is not on PATH", bin.display())),
        "{stdout}"
    );
}

#[test]
fn a_library_that_is_not_elf_is_refused_and_nothing_is_installed() {
    let root = fresh_dir("not-elf");
    let (prefix, runtime) = (root.join("prefix"), root.join("run"));
    fs::create_dir(&runtime).expect("create directory");
    let not_elf = root.join("libnot.so");
    fs::write(&not_elf, "text\n").expect("write");
    let (code, stdout, stderr) = bounded(
        command(Path::new(env!("CARGO_BIN_EXE_softverbs")), &runtime, &root)
            .args(["install", "--prefix"])
            .arg(&prefix)
            .arg("--lib")
            .arg(&not_elf),
    );
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(stderr.contains("not a shared library"), "{stderr}");
    assert!(!prefix.exists(), "{:?}", entries(&prefix));
}

#[test]
fn a_command_installed_alone_as_cargo_install_leaves_it_names_the_install_command_that_fixes_it() {
    let root = fresh_dir("cargo-install");
    let (cargo_home, runtime) = (root.join("cargo-home"), root.join("run"));
    fs::create_dir_all(cargo_home.join("bin")).expect("create directory");
    fs::create_dir(&runtime).expect("create directory");
    // What `cargo install` leaves: PREFIX/bin/softverbs and nothing else. A hard link (the
    // running executable's path is the link's), else a copy: writing a copy while other
    // tests fork could make executing it fail with ETXTBSY.
    let alone = cargo_home.join("bin/softverbs");
    fs::hard_link(env!("CARGO_BIN_EXE_softverbs"), &alone)
        .or_else(|_| fs::copy(env!("CARGO_BIN_EXE_softverbs"), &alone).map(drop))
        .expect("link or copy softverbs");
    let (code, stdout, stderr) =
        bounded(command(&alone, &runtime, &root).args(["run", "--", "echo", "ran"]));
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stdout, "");
    let fix = format!(
        "`cargo run --release --locked -p softverbs-cli -- install --prefix {}`",
        cargo_home.display()
    );
    assert!(stderr.contains(&fix), "{stderr}");

    // The command it names (here with the cargo-built executable) makes `run` work.
    bounded_ok(
        command(Path::new(env!("CARGO_BIN_EXE_softverbs")), &runtime, &root)
            .args(["install", "--prefix"])
            .arg(&cargo_home),
    );
    let (stdout, stderr) =
        bounded_ok(command(&alone, &runtime, &root).args(["run", "-v", "--", "echo", "ran"]));
    assert_eq!(stdout, "ran\n");
    assert!(
        stderr.contains(&format!(
            "{} (installed beside this executable)",
            cargo_home
                .join("lib/softverbs/libsoftverbs_capi.so")
                .display()
        )),
        "{stderr}"
    );
}

#[test]
fn an_installed_library_wins_over_one_built_beside_the_executable() {
    let root = fresh_dir("order");
    let (prefix, runtime) = (root.join("prefix"), root.join("run"));
    fs::create_dir(&runtime).expect("create directory");
    install(&prefix, &runtime);
    // A library where cargo would have built one too (bin/deps/), as in a prefix that is
    // also a build directory: the installed one is loaded.
    let built = prefix.join("bin/deps/libsoftverbs_capi.so");
    fs::create_dir(prefix.join("bin/deps")).expect("create directory");
    fs::copy(prefix.join("lib/softverbs/libsoftverbs_capi.so"), &built).expect("copy");
    let installed = prefix.join("bin/softverbs");
    let (_, stderr) = bounded_ok(command(&installed, &runtime, &root).args(["run", "-v", "true"]));
    assert!(
        stderr.contains(&format!(
            "{} (installed beside this executable)",
            prefix.join("lib/softverbs/libsoftverbs_capi.so").display()
        )),
        "{stderr}"
    );

    // Without the installed one, the built one.
    fs::remove_file(prefix.join("lib/softverbs/libsoftverbs_capi.so")).expect("remove");
    let (_, stderr) = bounded_ok(command(&installed, &runtime, &root).args(["run", "-v", "true"]));
    assert!(
        stderr.contains(&format!("{} (cargo's build directory)", built.display())),
        "{stderr}"
    );
}
