//! `softverbs run --dev-node`: inside, `/dev/infiniband/softverbs0` is a character device
//! the program can open for reading and writing, the program has the caller's uid and gid
//! (root and a normal user, and root without `CAP_SYS_ADMIN`, which takes the user
//! namespace), the rest of `/dev` works and is the host's, and nothing is visible outside;
//! where user namespaces are disabled the program is not started and the error names the
//! cause. (`ucx.rs` pins that UCX then lists softverbs0.)
//!
//! The programs inside are `sh` and coreutils, plus `python3` for a pseudo-terminal and
//! util-linux's `setpriv` and `unshare` to change who runs the command; no device is
//! opened. Every run is bounded in time.

mod common;

use common::{finish, first_line, in_runtime, LIMIT};
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const NODE: &str = "/dev/infiniband/softverbs0";

/// A program from /usr/bin, which must be installed: a missing one is a failure naming its
/// Debian package, never a skip.
fn require(program: &str, package: &str) -> PathBuf {
    let path = Path::new("/usr/bin").join(program);
    assert!(
        path.exists(),
        "{} is missing: install the Debian package `{package}`",
        path.display()
    );
    path
}

/// `softverbs` (or `exe`) with none of the caller's SOFTVERBS_* or loader variables.
fn softverbs_at(exe: &Path, name: &str) -> Command {
    // (Another user than this one ignores this directory, and `run` takes the temporary
    // directory instead.)
    in_runtime(exe, &common::private_dir(&format!("dev-node-{name}")))
}

/// `softverbs run --dev-node -- sh -c SCRIPT` as run by `prefix` (e.g. setpriv and its
/// options; empty: this process's user), from `exe`; returns (exit code, stdout, stderr).
fn dev_node_sh(exe: &Path, name: &str, prefix: &[&str], script: &str) -> (i32, String, String) {
    let mut command = match prefix.split_first() {
        Some((first, rest)) => {
            let mut command = softverbs_at(Path::new(first), name);
            command.args(rest).arg(exe);
            command
        }
        None => softverbs_at(exe, name),
    };
    command.args(["run", "-v", "--dev-node", "--", "sh", "-c", script]);
    let out = finish(command.spawn().expect("start softverbs"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn built() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_softverbs"))
}

/// Prints `node=chr` if the node is a character device, then `open=rw` if the shell can
/// open it for reading and writing (`<>`), and `access=rw` if `test -r` and `-w` agree.
const NODE_CHECK: &str = r#"
n=/dev/infiniband/softverbs0
[ -c "$n" ] && echo node=chr
(exec 3<>"$n") && echo open=rw
[ -r "$n" ] && [ -w "$n" ] && echo access=rw
echo uid=$(id -u) gid=$(id -g)
grep '^CapEff:' /proc/self/status
"#;

/// The identity `id` reports for this process: (uid, gid).
fn my_ids() -> (u32, u32) {
    (
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    )
}

/// Asserts NODE_CHECK's output: the node usable, and the program's uid and gid `ids`.
fn assert_node_and_ids(out: &str, err: &str, ids: (u32, u32)) {
    for line in ["node=chr", "open=rw", "access=rw"] {
        assert!(
            out.lines().any(|l| l == line),
            "no {line}:\n{out}\nstderr:\n{err}"
        );
    }
    let expected = format!("uid={} gid={}", ids.0, ids.1);
    assert!(
        out.lines().any(|l| l == expected),
        "the program is not {expected}:\n{out}\nstderr:\n{err}"
    );
}

#[test]
fn dev_node_gives_the_program_a_read_write_character_device_and_keeps_its_uid_and_gid() {
    let (code, out, err) = dev_node_sh(built(), "node", &[], NODE_CHECK);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_node_and_ids(&out, &err, my_ids());
    // -v says what was done.
    assert!(
        err.contains("softverbs: --dev-node: ")
            && err.contains("the real /dev/null bound at /dev/infiniband/softverbs0"),
        "{err}"
    );
}

#[test]
fn softverbs_dev_node_1_in_the_environment_does_what_dev_node_does() {
    let mut command = softverbs_at(built(), "env");
    command
        .env("SOFTVERBS_DEV_NODE", "1")
        .args(["run", "--", "sh", "-c", NODE_CHECK]);
    let out = finish(command.spawn().expect("start softverbs"));
    let (out, err) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_node_and_ids(&out, &err, my_ids());
}

/// A copy of the built command beside a copy of its drop-in, in a directory everyone can
/// reach (cargo's target directory may sit under a home that other users cannot search).
fn reachable_copy(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("softverbs-dev-node-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("create the copy's directory");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
    let exe = dir.join("softverbs");
    fs::copy(built(), &exe).expect("copy softverbs");
    let lib = built()
        .parent()
        .expect("profile directory")
        .join("deps")
        .join("libsoftverbs_capi.so");
    fs::copy(&lib, dir.join("libsoftverbs_capi.so"))
        .unwrap_or_else(|e| panic!("copy {}: {e}", lib.display()));
    exe
}

#[test]
fn dev_node_as_a_normal_user_maps_its_own_uid_and_gid_and_the_program_has_no_capabilities() {
    // As root, the command runs as nobody (65534) through setpriv; as a normal user, as
    // that user. Either way the command cannot mount, so it makes a user namespace.
    let setpriv = require("setpriv", "util-linux");
    let exe = reachable_copy("normal-user");
    let root = rustix::process::geteuid().is_root();
    let setpriv = setpriv.to_str().expect("UTF-8 path");
    let prefix: &[&str] = if root {
        &[
            setpriv,
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
        ]
    } else {
        &[]
    };
    let ids = if root { (65534, 65534) } else { my_ids() };
    let (code, out, err) = dev_node_sh(&exe, "normal-user", prefix, NODE_CHECK);
    let _ = fs::remove_dir_all(exe.parent().expect("copy's directory"));
    assert_eq!(code, 0, "{out}\n{err}");
    assert_node_and_ids(&out, &err, ids);
    assert!(
        err.contains(&format!(
            "new user namespace (uid {0} -> {0}, gid {1} -> {1}, setgroups denied)",
            ids.0, ids.1
        )),
        "{err}"
    );
    // The namespace's capabilities are gone at exec for a non-root uid.
    assert!(
        out.lines()
            .any(|l| l.split_whitespace().eq(["CapEff:", "0000000000000000"])),
        "{out}"
    );
}

#[test]
fn dev_node_as_root_without_cap_sys_admin_maps_root_to_itself() {
    // Root that may not mount takes the user namespace too, mapping 0 to 0. (A normal user
    // cannot drop capabilities it lacks: the test is then the normal user's own run.)
    let setpriv = require("setpriv", "util-linux");
    let root = rustix::process::geteuid().is_root();
    let setpriv = setpriv.to_str().expect("UTF-8 path");
    let prefix: &[&str] = if root {
        &[
            setpriv,
            "--bounding-set=-sys_admin",
            "--inh-caps=-sys_admin",
            "--",
        ]
    } else {
        &[]
    };
    let (code, out, err) = dev_node_sh(built(), "root-no-admin", prefix, NODE_CHECK);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_node_and_ids(&out, &err, my_ids());
    let (uid, gid) = my_ids();
    assert!(
        err.contains(&format!(
            "new user namespace (uid {uid} -> {uid}, gid {gid} -> {gid}, setgroups denied)"
        )),
        "{err}"
    );
}

#[test]
fn dev_node_keeps_dev_null_zero_shm_and_pts_working_and_dev_shm_is_the_hosts() {
    require("python3", "python3");
    let shm_name = format!("softverbs-dev-node-test-{}", std::process::id());
    let shm = Path::new("/dev/shm").join(&shm_name);
    let script = format!(
        r#"set -e
echo discarded > /dev/null && echo null=ok
[ "$(head -c 8 /dev/zero | od -An -tx1 | tr -d ' \n')" = 0000000000000000 ] && echo zero=ok
echo written-inside > /dev/shm/{shm_name} && echo shm=ok
python3 -c 'import os; m, s = os.openpty(); print("pts=" + os.ttyname(s))'
"#
    );
    let (code, out, err) = dev_node_sh(built(), "dev", &[], &script);
    let outside = fs::read_to_string(&shm);
    let _ = fs::remove_file(&shm);
    assert_eq!(code, 0, "{out}\n{err}");
    for line in ["null=ok", "zero=ok", "shm=ok"] {
        assert!(out.lines().any(|l| l == line), "no {line}:\n{out}\n{err}");
    }
    let pty = out
        .lines()
        .find_map(|l| l.strip_prefix("pts="))
        .unwrap_or_else(|| panic!("no pseudo-terminal:\n{out}\n{err}"));
    // (The terminal is named through the real /dev bound whole beside the tmpfs's entries,
    // where /dev/ptmx leads: /dev/.softverbs-host-dev/pts/N.)
    assert!(pty.starts_with("/dev/") && pty.contains("/pts/"), "{pty}");
    assert_eq!(
        outside.expect("the file written in /dev/shm inside, read outside"),
        "written-inside\n",
        "/dev/shm inside is the host's"
    );
}

/// Mount points whose source is the namespace's tmpfs, in `/proc/self/mountinfo`.
fn softverbs_dev_mounts() -> Vec<String> {
    fs::read_to_string("/proc/self/mountinfo")
        .expect("read /proc/self/mountinfo")
        .lines()
        .filter(|l| l.contains(" softverbs-dev "))
        .map(String::from)
        .collect()
}

#[test]
fn dev_node_leaves_nothing_visible_outside_the_program() {
    let before = Path::new(NODE).exists();
    let dev_entries = fs::read_dir("/dev").expect("read /dev").count();
    // The program says it sees the node, then waits for a line on stdin: meanwhile the
    // host is looked at.
    let mut command = softverbs_at(built(), "outside");
    command
        .args(["run", "--dev-node", "--", "sh", "-c"])
        .arg("[ -c /dev/infiniband/softverbs0 ] && echo inside; read line; echo done")
        .stdin(Stdio::piped());
    let mut child = command.spawn().expect("start softverbs");
    let mut stdin = child.stdin.take().expect("stdin piped");
    let (line, mut rest) = first_line(&mut child, LIMIT, "a line from the program");
    assert_eq!(line.trim(), "inside");
    let during = (Path::new(NODE).exists(), softverbs_dev_mounts());
    stdin.write_all(b"go\n").expect("write to the program");
    drop(stdin);
    let out = finish(child);
    let mut tail = String::new();
    std::io::Read::read_to_string(&mut rest, &mut tail).expect("the program's output");
    assert!(
        out.status.success(),
        "{tail}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(tail.trim(), "done");
    assert_eq!(
        during,
        (before, Vec::new()),
        "seen outside while the program ran"
    );
    assert_eq!(Path::new(NODE).exists(), before, "{NODE} after the run");
    assert!(softverbs_dev_mounts().is_empty());
    assert_eq!(
        fs::read_dir("/dev").expect("read /dev").count(),
        dev_entries
    );
}

#[test]
fn dev_node_refuses_with_the_cause_when_user_namespaces_are_disabled() {
    // In a user namespace of its own whose user.max_user_namespaces is 0 (a limit of that
    // namespace only), the command, without capabilities, cannot make its namespace: it
    // must say so, naming the sysctl, and not start the program.
    let unshare = require("unshare", "util-linux");
    let setpriv = require("setpriv", "util-linux");
    let mut command = softverbs_at(&unshare, "disabled");
    command
        .args(["--user", "--map-root-user", "--", "sh", "-c"])
        .arg(
            r#"echo 0 > /proc/sys/user/max_user_namespaces &&
exec "$0" --inh-caps=-all --bounding-set=-all -- "$1" run --dev-node -- echo started"#,
        )
        .arg(&setpriv)
        .arg(built());
    let out = finish(command.spawn().expect("start unshare"));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(!stdout.contains("started"), "the program ran: {stdout}");
    for expected in [
        "softverbs: --dev-node: cannot create a user namespace",
        "user.max_user_namespaces = 0",
        "the program was not started",
    ] {
        assert!(stderr.contains(expected), "no {expected:?} in:\n{stderr}");
    }
}
