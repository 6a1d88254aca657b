//! `softverbs run -- CMD ARGS…`: unmodified verbs programs (rdma-core's ibverbs-utils, from
//! /usr/bin) on the drop-in libibverbs.so.1 that building this package builds, plus how the
//! library is found, the private directory that names it libibverbs.so.1, the program's
//! environment, and the exit status. Every invocation is bounded in time; devices use
//! 127.0.0.231..=127.0.0.240 (port 0: any free port). Each test has its own
//! XDG_RUNTIME_DIR, so the library directories it looks at are its own.

mod common;

use common::{bounded, bounded_ok, env_var, finish, in_runtime};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

/// A fresh directory of this user, mode 0700, under cargo's temporary directory.
fn private_dir(name: &str) -> PathBuf {
    common::private_dir(&format!("run-test-{name}"))
}

/// `softverbs` with none of the variables `run` reads or sets inherited, and `runtime` as
/// its XDG_RUNTIME_DIR.
fn softverbs(runtime: &Path) -> Command {
    in_runtime(env!("CARGO_BIN_EXE_softverbs"), runtime)
}

/// A program from /usr/bin, which must be installed: a missing one is a failure naming
/// its Debian package, never a skip.
fn require(program: &str, package: &str) {
    let path = Path::new("/usr/bin").join(program);
    assert!(
        path.exists(),
        "{} is missing: install the Debian package `{package}` (scripts/test.sh installs the \
         packages the suite needs)",
        path.display()
    );
}

/// The drop-in cargo built with this package, where `softverbs run` looks for it.
fn cargo_library() -> PathBuf {
    let exe = Path::new(env!("CARGO_BIN_EXE_softverbs"));
    let lib = exe
        .parent()
        .expect("profile directory")
        .join("deps")
        .join("libsoftverbs_capi.so");
    assert!(
        lib.is_file(),
        "{} missing: building softverbs-cli should build its dependency softverbs-capi's cdylib",
        lib.display()
    );
    fs::canonicalize(lib).expect("canonical library path")
}

/// The library directories `run` made under `runtime` (the only entries there).
fn library_dirs(runtime: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(runtime)
        .expect("read runtime directory")
        .map(|entry| entry.expect("entry").path())
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn ibv_devices_lists_softverbs0() {
    require("ibv_devices", "ibverbs-utils");
    let runtime = private_dir("ibv-devices");
    let (out, _) = bounded_ok(
        softverbs(&runtime)
            .env("SOFTVERBS_ADDR", "127.0.0.231:0")
            .args(["run", "--", "ibv_devices"]),
    );
    assert!(
        out.lines()
            .any(|l| l.trim_start().starts_with("softverbs0")),
        "{out}"
    );
}

#[test]
fn ibv_devinfo_shows_softverbs0_with_an_active_port() {
    require("ibv_devinfo", "ibverbs-utils");
    let runtime = private_dir("ibv-devinfo");
    let (out, _) = bounded_ok(
        softverbs(&runtime)
            .env("SOFTVERBS_ADDR", "127.0.0.232:0")
            .args(["run", "--", "ibv_devinfo"]),
    );
    assert!(out.contains("hca_id:\tsoftverbs0"), "{out}");
    assert!(out.contains("PORT_ACTIVE"), "{out}");
}

#[test]
fn addr_sets_the_device_address_and_pcap_the_capture_file() {
    require("ibv_devinfo", "ibverbs-utils");
    let runtime = private_dir("addr-pcap");
    let pcap = runtime.join("devinfo.pcap");
    let (out, _) = bounded_ok(softverbs(&runtime).args([
        "run",
        "--addr",
        "127.0.0.233:0",
        "--pcap",
        pcap.to_str().expect("UTF-8 path"),
        "--",
        "ibv_devinfo",
        "-v",
    ]));
    assert!(out.contains("::ffff:127.0.0.233, RoCE v2"), "{out}");
    // The device creates the capture when it opens (what is in it is the device's affair).
    assert!(pcap.is_file(), "{} not created", pcap.display());
}

#[test]
fn the_program_gets_the_drop_in_first_on_ld_library_path_and_softverbs_variables_unchanged() {
    let runtime = private_dir("environment");
    let (out, _) = bounded_ok(
        softverbs(&runtime)
            .env("LD_LIBRARY_PATH", "/opt/elsewhere/lib")
            .env("SOFTVERBS_ADDR", "127.0.0.234:0")
            .env("SOFTVERBS_FAULTS", "drop=0.5,seed=7")
            .env("SOFTVERBS_NETWORK", "udp")
            .args(["run", "--", "env"]),
    );
    let dirs = library_dirs(&runtime);
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let dir = &dirs[0];
    assert_eq!(
        env_var(&out, "LD_LIBRARY_PATH"),
        Some(format!("{}:/opt/elsewhere/lib", dir.display()).as_str()),
        "{out}"
    );
    assert_eq!(
        fs::read_link(dir.join("libibverbs.so.1")).expect("libibverbs.so.1 symlink"),
        cargo_library()
    );
    // The connection manager's drop-in, built beside the verbs library, goes with it.
    assert_eq!(
        fs::read_link(dir.join("librdmacm.so.1")).expect("librdmacm.so.1 symlink"),
        cargo_library().with_file_name("libsoftverbs_rdmacm.so")
    );
    let meta = fs::symlink_metadata(dir).expect("library directory");
    assert!(meta.is_dir());
    assert_eq!(meta.mode() & 0o777, 0o700, "mode {:o}", meta.mode());
    assert_eq!(meta.uid(), fs::metadata(&runtime).expect("runtime").uid());
    assert_eq!(env_var(&out, "SOFTVERBS_ADDR"), Some("127.0.0.234:0"));
    assert_eq!(env_var(&out, "SOFTVERBS_FAULTS"), Some("drop=0.5,seed=7"));
    assert_eq!(env_var(&out, "SOFTVERBS_NETWORK"), Some("udp"));
    assert_eq!(env_var(&out, "SOFTVERBS_PCAP"), None);
    assert_eq!(env_var(&out, "LD_BIND_NOW"), None, "{out}");

    // --addr and --pcap override what the environment says.
    let (out, _) = bounded_ok(
        softverbs(&runtime)
            .env("SOFTVERBS_ADDR", "127.0.0.1")
            .env("LD_LIBRARY_PATH", "")
            .args([
                "run",
                "--addr",
                "127.0.0.235",
                "--pcap",
                "capture.pcap",
                "--",
                "env",
            ]),
    );
    assert_eq!(env_var(&out, "SOFTVERBS_ADDR"), Some("127.0.0.235"));
    assert_eq!(env_var(&out, "SOFTVERBS_PCAP"), Some("capture.pcap"));
    assert_eq!(
        env_var(&out, "LD_LIBRARY_PATH"),
        Some(dir.to_str().expect("UTF-8 path")),
        "no empty entry (which would mean the current directory) from an empty LD_LIBRARY_PATH"
    );
    assert_eq!(library_dirs(&runtime), dirs, "the directory is reused");
}

#[test]
fn lib_option_wins_over_softverbs_lib_which_wins_over_the_cargo_build() {
    let runtime = private_dir("lib-choice");
    let copy = private_dir("lib-choice-copy").join("libibverbs-copy.so");
    fs::copy(cargo_library(), &copy).expect("copy the library");
    let copy = fs::canonicalize(copy).expect("canonical copy");
    let linked = |command: &mut Command| -> PathBuf {
        let (out, _) = bounded_ok(command.args(["--", "env"]));
        let dir = env_var(&out, "LD_LIBRARY_PATH")
            .expect("LD_LIBRARY_PATH")
            .to_owned();
        fs::read_link(Path::new(&dir).join("libibverbs.so.1")).expect("symlink")
    };
    assert_eq!(
        linked(softverbs(&runtime).env("SOFTVERBS_LIB", &copy).arg("run")),
        copy
    );
    assert_eq!(
        linked(
            softverbs(&runtime)
                .env("SOFTVERBS_LIB", "/nonexistent/libsoftverbs_capi.so")
                .args(["run", "--lib"])
                .arg(cargo_library())
        ),
        cargo_library()
    );
    assert_eq!(linked(softverbs(&runtime).arg("run")), cargo_library());
    assert_eq!(library_dirs(&runtime).len(), 2, "one directory per library");
}

#[test]
fn a_missing_library_fails_naming_it_and_runs_nothing() {
    let runtime = private_dir("missing-lib");
    let (code, stdout, stderr) =
        bounded(softverbs(&runtime).args(["run", "--lib", "/nonexistent", "--", "echo", "ran"]));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("--lib /nonexistent: No such file or directory"),
        "{stderr}"
    );
    assert_eq!(stdout, "");

    let (code, stdout, stderr) = bounded(
        softverbs(&runtime)
            .env("SOFTVERBS_LIB", "/nonexistent/lib.so")
            .args(["run", "--", "echo", "ran"]),
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("SOFTVERBS_LIB=/nonexistent/lib.so: No such file or directory"),
        "{stderr}"
    );
    assert_eq!(stdout, "");

    let not_elf = runtime.join("not-a-library.so");
    fs::write(&not_elf, "text\n").expect("write");
    let (code, _, stderr) = bounded(
        softverbs(&runtime)
            .args(["run", "--lib"])
            .arg(&not_elf)
            .args(["--", "true"]),
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("not a shared library"), "{stderr}");
}

#[test]
fn without_the_library_beside_the_executable_the_error_says_how_to_install_it() {
    let runtime = private_dir("no-lib-beside");
    let alone = private_dir("no-lib-beside-exe").join("softverbs");
    // A hard link (the running executable's path is the link's), else a copy: writing a
    // copy while other tests fork could make executing it fail with ETXTBSY.
    fs::hard_link(env!("CARGO_BIN_EXE_softverbs"), &alone)
        .or_else(|_| fs::copy(env!("CARGO_BIN_EXE_softverbs"), &alone).map(drop))
        .expect("link or copy softverbs");
    let (code, _, stderr) = bounded(in_runtime(&alone, &runtime).args(["run", "--", "true"]));
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("libsoftverbs_capi.so"), "{stderr}");
    // The executable's directory is not named bin/, so no --prefix is suggested.
    assert!(
        stderr.contains("`cargo run --release --locked -p softverbs-cli -- install`"),
        "{stderr}"
    );
    assert!(stderr.contains("--lib") && stderr.contains("SOFTVERBS_LIB"));
}

#[test]
fn a_missing_program_exits_127_and_an_unexecutable_one_126_with_a_message() {
    let runtime = private_dir("missing-program");
    let (code, _, stderr) =
        bounded(softverbs(&runtime).args(["run", "--", "softverbs-no-such-program", "-x"]));
    assert_eq!(code, 127, "{stderr}");
    assert!(
        stderr.contains("softverbs-no-such-program: command not found"),
        "{stderr}"
    );

    let (code, _, stderr) =
        bounded(softverbs(&runtime).args(["run", "--", "/nonexistent/program"]));
    assert_eq!(code, 127, "{stderr}");
    assert!(
        stderr.contains("/nonexistent/program: No such file or directory"),
        "{stderr}"
    );

    let not_executable = runtime.join("not-executable");
    fs::write(&not_executable, "#!/bin/sh\n").expect("write");
    fs::set_permissions(&not_executable, fs::Permissions::from_mode(0o644)).expect("chmod");
    let (code, _, stderr) = bounded(softverbs(&runtime).args(["run", "--"]).arg(&not_executable));
    assert_eq!(code, 126, "{stderr}");
    assert!(stderr.contains("not-executable"), "{stderr}");
}

#[test]
fn the_program_replaces_softverbs_so_exit_status_and_signals_are_its_own() {
    let runtime = private_dir("exec");
    let (code, _, _) = bounded(softverbs(&runtime).args(["run", "--", "sh", "-c", "exit 7"]));
    assert_eq!(code, 7);

    let out = finish(
        softverbs(&runtime)
            .args(["run", "--", "sh", "-c", "kill -TERM $$"])
            .spawn()
            .expect("start softverbs"),
    );
    assert_eq!(out.status.signal(), Some(15), "{:?}", out.status);

    // Same process: the pid the program sees is the one softverbs was started as.
    let child = softverbs(&runtime)
        .args(["run", "--", "sh", "-c", "echo $$"])
        .spawn()
        .expect("start softverbs");
    let pid = child.id();
    let out = finish(child);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), pid.to_string());

    // Rust ignores SIGPIPE in its own process; the program starts with no signal ignored.
    let (out, _) =
        bounded_ok(softverbs(&runtime).args(["run", "--", "grep", "SigIgn", "/proc/self/status"]));
    let mask = out
        .split_whitespace()
        .nth(1)
        .and_then(|m| u64::from_str_radix(m, 16).ok())
        .unwrap_or_else(|| panic!("no SigIgn mask in {out:?}"));
    assert_eq!(
        mask & (1 << (13 - 1)),
        0,
        "SIGPIPE ignored in the program: {out}"
    );
}

#[test]
fn options_after_the_program_are_the_programs() {
    let runtime = private_dir("program-options");
    let (out, _) =
        bounded_ok(softverbs(&runtime).args(["run", "--", "echo", "--lib", "-v", "--help"]));
    assert_eq!(out, "--lib -v --help\n");
    // Without `--` too: everything from the program's name on is the program's.
    let (out, _) = bounded_ok(softverbs(&runtime).args(["run", "echo", "--addr", "x"]));
    assert_eq!(out, "--addr x\n");
}

#[test]
fn no_program_or_a_bad_addr_is_a_usage_error() {
    let runtime = private_dir("usage");
    let (code, _, stderr) = bounded(softverbs(&runtime).args(["run"]));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("Usage: softverbs run"), "{stderr}");

    let (code, stdout, stderr) =
        bounded(softverbs(&runtime).args(["run", "--addr", "localhost", "--", "echo", "ran"]));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("\"localhost\" is not IP"), "{stderr}");
    assert_eq!(stdout, "");
}

#[test]
fn concurrent_runs_share_one_library_directory_and_leave_nothing_else() {
    let runtime = private_dir("concurrent");
    let children: Vec<Child> = (0..8)
        .map(|_| {
            softverbs(&runtime)
                .args(["run", "--", "true"])
                .spawn()
                .expect("start softverbs")
        })
        .collect();
    for child in children {
        let out = finish(child);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let dirs = library_dirs(&runtime);
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let mut entries: Vec<_> = fs::read_dir(&dirs[0])
        .expect("read library directory")
        .map(|e| e.expect("entry").file_name())
        .collect();
    entries.sort();
    assert_eq!(entries, ["libibverbs.so.1", "librdmacm.so.1"]);
}

#[test]
fn a_library_directory_others_can_write_is_refused_and_a_stale_link_repaired() {
    require("ibv_devices", "ibverbs-utils");
    let runtime = private_dir("tampered");
    bounded_ok(softverbs(&runtime).args(["run", "--", "true"]));
    let dir = library_dirs(&runtime).pop().expect("library directory");
    let link = dir.join("libibverbs.so.1");

    fs::remove_file(&link).expect("remove link");
    std::os::unix::fs::symlink("/nonexistent/libibverbs.so.1", &link).expect("stale link");
    let (out, _) = bounded_ok(
        softverbs(&runtime)
            .env("SOFTVERBS_ADDR", "127.0.0.236:0")
            .args(["run", "--", "ibv_devices"]),
    );
    assert!(out.contains("softverbs0"), "{out}");
    assert_eq!(fs::read_link(&link).expect("link"), cargo_library());

    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).expect("chmod 0777");
    let (code, stdout, stderr) = bounded(softverbs(&runtime).args(["run", "--", "echo", "ran"]));
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("is not a private directory"), "{stderr}");
    assert_eq!(stdout, "");
}

#[test]
fn without_a_usable_xdg_runtime_dir_the_library_directory_goes_in_tmpdir() {
    let runtime = private_dir("tmpdir-runtime");
    let tmpdir = private_dir("tmpdir");
    let (out, _) = bounded_ok(
        softverbs(&runtime)
            .env("XDG_RUNTIME_DIR", "/nonexistent/runtime")
            .env("TMPDIR", &tmpdir)
            .args(["run", "--", "env"]),
    );
    let dirs = library_dirs(&tmpdir);
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    assert_eq!(
        env_var(&out, "LD_LIBRARY_PATH"),
        Some(dirs[0].to_str().expect("UTF-8 path"))
    );
    assert!(library_dirs(&runtime).is_empty());
}

#[test]
fn rping_runs_through_the_drop_in_librdmacm_that_run_puts_beside_the_verbs_library() {
    // rping(1): the client connects through the RDMA CM, both sides verify (-V) every ping.
    require("rping", "rdmacm-utils");
    let runtime = private_dir("rping");
    let server_addr = "127.0.0.238";
    let start_server = || {
        softverbs(&runtime)
            .args(["run", "--addr", server_addr, "--", "rping", "-s", "-a"])
            .args([server_addr, "-p", "7471", "-V", "-C", "20"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start the rping server")
    };
    // A client that comes before the server's rdma_listen is rejected (REJ 8, "connection
    // refused" as the kernel's CM answers): try again, a bounded number of times.
    let mut last = String::new();
    for _attempt in 0..5 {
        let mut server = start_server();
        std::thread::sleep(std::time::Duration::from_millis(500));
        let (code, out, err) = bounded(softverbs(&runtime).args([
            "run",
            "--addr",
            "127.0.0.239",
            "--",
            "rping",
            "-c",
            "-a",
            server_addr,
            "-p",
            "7471",
            "-V",
            "-C",
            "20",
        ]));
        if code != 0 {
            // The server would wait for a client that gave up.
            let _ = server.kill();
        }
        let served = finish(server);
        if code == 0 && served.status.success() {
            return;
        }
        last = format!(
            "client exit {code}\n{out}{err}\nserver {:?}\n{}{}",
            served.status,
            String::from_utf8_lossy(&served.stdout),
            String::from_utf8_lossy(&served.stderr)
        );
        if !last.contains("REJECTED") {
            break;
        }
    }
    panic!("rping over softverbs run failed:\n{last}");
}
