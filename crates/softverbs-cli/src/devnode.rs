//! `softverbs run --dev-node`: the program runs where `/dev/infiniband/softverbs0` is a
//! character device it can open for reading and writing, as UCX requires.
//!
//! UCX 1.13 lists a verbs device only if `/dev/infiniband/<dev_name>` is a character device
//! the process may read and write (`uct_ib_device_is_accessible`: `stat`, `S_ISCHR`,
//! `access(R_OK | W_OK)`; the prefix is fixed and no UCX variable turns the check off). A
//! soft device has no such node, and a user cannot make one. So, before `exec`, this
//! process:
//!
//! 1. enters a new mount namespace — and, unless it may already mount (`CAP_SYS_ADMIN`, as
//!    root usually), first a new user namespace mapping the caller's own uid and gid to
//!    themselves (after `deny` in `setgroups`): the program keeps its identity, and a
//!    program of a non-root user loses the namespace's capabilities at `exec`;
//! 2. makes every mount private (`MS_REC | MS_PRIVATE` on `/`), so nothing propagates out;
//! 3. keeps the real `/dev` open, mounts a tmpfs on `/dev`, and puts every entry of the
//!    real one back: symlinks as symlinks, directories bound recursively (`/dev/pts`,
//!    `/dev/shm`, `/dev/mqueue` keep working), other files bound; `/dev/infiniband` is a
//!    new directory with the host's entries bound into it; `/dev/ptmx` is a symlink to the
//!    ptmx of the whole real `/dev`, bound at `/dev/.softverbs-host-dev` (a pseudo-terminal
//!    master finds its devpts at `pts` beside the ptmx it was opened through, which a bound
//!    file has not);
//! 4. binds the real `/dev/null` (a character device everyone may read and write) at
//!    `/dev/infiniband/softverbs0`, and checks UCX's condition on it.
//!
//! Nothing changes outside the program's namespaces: its network, processes and files are
//! the host's, and the namespaces end with the last process in them. When the kernel
//! refuses a user namespace (`kernel.unprivileged_userns_clone = 0`,
//! `user.max_user_namespaces = 0`, a container's seccomp policy, AppArmor) the program is
//! not started, and the error says which of these the host shows.

use crate::Error;
use rustix::mount::{MountFlags, MountPropagationFlags};
use rustix::thread::{CapabilitySet, UnshareFlags};
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Environment variable that has the same effect as `--dev-node` when it is `1`.
pub const ENV: &str = "SOFTVERBS_DEV_NODE";

/// Whether `SOFTVERBS_DEV_NODE` asks for the device node.
pub fn requested_by_env() -> bool {
    std::env::var_os(ENV).is_some_and(|v| v == "1")
}

/// The name of the drop-in's device (`ibv_device.dev_name`): the device's default name,
/// which the drop-in keeps.
pub fn device_name() -> String {
    softverbs_device::device::DeviceConfig::in_process().name
}

/// What [`enter`] did, for `-v`.
#[derive(Debug)]
pub struct Done {
    /// The device node made.
    pub node: PathBuf,
    /// Whether a user namespace was made (else the process could mount already).
    pub user_namespace: bool,
    /// The uid and gid mapped to themselves.
    pub ids: (u32, u32),
    /// How many entries of the real `/dev` were put back (`/dev/infiniband`'s included).
    pub entries: usize,
}

impl std::fmt::Display for Done {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (uid, gid) = self.ids;
        if self.user_namespace {
            write!(
                f,
                "--dev-node: new user namespace (uid {uid} -> {uid}, gid {gid} -> {gid}, \
                 setgroups denied) and mount namespace"
            )?;
        } else {
            write!(
                f,
                "--dev-node: new mount namespace (this process may mount: no user namespace, \
                 the program keeps uid {uid}, gid {gid} and its privileges)"
            )?;
        }
        write!(
            f,
            "; every mount private; a tmpfs on /dev with the real /dev's {} entries bound \
             back; the real /dev/null bound at {}",
            self.entries,
            self.node.display()
        )
    }
}

/// Puts this process into namespaces where `/dev/infiniband/<device>` is a character
/// device it can read and write (see the module's documentation). Must run while the
/// process has one thread, right before `exec`.
pub fn enter() -> Result<Done, Error> {
    let name = device_name();
    let uid = rustix::process::getuid().as_raw();
    let gid = rustix::process::getgid().as_raw();
    let privileged = rustix::thread::capabilities(None)
        .is_ok_and(|sets| sets.effective.contains(CapabilitySet::SYS_ADMIN));
    let fail = |what: String, user_namespace: bool| -> Error {
        let mut message = format!("--dev-node: {what}");
        if user_namespace {
            message.push_str(&causes());
        }
        message.push_str(&format!(
            "; the program was not started (without /dev/infiniband/{name}, UCX would not \
             list {name})"
        ));
        message.into()
    };
    if privileged {
        // SAFETY: no file-descriptor table is unshared (no CLONE_FILES).
        unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWNS) }.map_err(|e| {
            fail(
                format!("cannot create a mount namespace (unshare: {e})"),
                false,
            )
        })?;
    } else {
        // SAFETY: as above.
        unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWUSER | UnshareFlags::NEWNS) }
            .map_err(|e| {
                let why = if e == rustix::io::Errno::INVAL {
                    " (this process has more than one thread)"
                } else {
                    ""
                };
                fail(
                    format!("cannot create a user namespace (unshare: {e}){why}"),
                    true,
                )
            })?;
        for (file, line) in [
            ("/proc/self/setgroups", "deny".to_owned()),
            ("/proc/self/uid_map", format!("{uid} {uid} 1\n")),
            ("/proc/self/gid_map", format!("{gid} {gid} 1\n")),
        ] {
            fs::write(file, &line).map_err(|e| fail(format!("write {file}: {e}"), true))?;
        }
    }
    let user_namespace = !privileged;
    let mount_fail = |what: String| fail(what, user_namespace);
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
    )
    .map_err(|e| {
        mount_fail(format!(
            "make the mounts private (mount / MS_REC|MS_PRIVATE): {e}"
        ))
    })?;
    // The real /dev stays reachable through this descriptor (closed at exec) once the tmpfs
    // covers it, and nowhere else.
    let real = fs::File::open("/dev").map_err(|e| mount_fail(format!("open /dev: {e}")))?;
    let real_dev = PathBuf::from(format!("/proc/self/fd/{}", real.as_raw_fd()));
    // A detached copy of the real /dev with its submounts, for /dev/ptmx (taken now: once
    // the tmpfs covers /dev, a copy would take the tmpfs too).
    let whole = clone_whole().map_err(&mount_fail)?;
    rustix::mount::mount(
        "softverbs-dev",
        "/dev",
        "tmpfs",
        MountFlags::NOSUID,
        Some(c"mode=755"),
    )
    .map_err(|e| mount_fail(format!("mount a tmpfs on /dev: {e}")))?;
    let mut entries = 0;
    for (entry, meta) in listing(&real_dev).map_err(&mount_fail)? {
        let target = Path::new("/dev").join(&entry);
        if entry == "infiniband" && meta.is_dir() {
            make_dir(&target, &meta).map_err(&mount_fail)?;
            for (sub, sub_meta) in listing(&real_dev.join(&entry)).map_err(&mount_fail)? {
                if sub.as_os_str() != name.as_str() {
                    put_back(
                        &real_dev.join(&entry).join(&sub),
                        &target.join(&sub),
                        &sub_meta,
                    )
                    .map_err(&mount_fail)?;
                    entries += 1;
                }
            }
        } else if entry == "ptmx" && meta.file_type().is_char_device() {
            // A pseudo-terminal master finds its devpts at "pts" beside the ptmx it was
            // opened through, in the same mount: a bound file has none. The ptmx of the
            // real /dev, bound whole (submounts included), has /dev/pts beside it.
            let host = Path::new("/dev").join(HOST_DEV);
            make_dir(&host, &real_dev_meta(&real_dev).map_err(&mount_fail)?)
                .map_err(&mount_fail)?;
            attach(&whole, &host).map_err(&mount_fail)?;
            let link = Path::new(HOST_DEV).join("ptmx");
            std::os::unix::fs::symlink(&link, &target)
                .map_err(|e| mount_fail(format!("symlink /dev/ptmx -> {}: {e}", link.display())))?;
            entries += 1;
        } else {
            put_back(&real_dev.join(&entry), &target, &meta).map_err(&mount_fail)?;
            entries += 1;
        }
    }
    let infiniband = Path::new("/dev/infiniband");
    if !infiniband.is_dir() {
        fs::DirBuilder::new()
            .mode(0o755)
            .create(infiniband)
            .map_err(|e| mount_fail(format!("create /dev/infiniband: {e}")))?;
    }
    let node = infiniband.join(&name);
    let null = real_dev.join("null");
    bind(&null, &node, false).map_err(&mount_fail)?;
    check_node(&node).map_err(&mount_fail)?;
    drop(real);
    Ok(Done {
        node,
        user_namespace,
        ids: (uid, gid),
        entries,
    })
}

/// Where, in the namespace's `/dev`, the real `/dev` is bound whole for `/dev/ptmx` (a
/// symlink into it).
pub const HOST_DEV: &str = ".softverbs-host-dev";

/// A detached copy of the mounts of `/dev` (`open_tree`, Linux 5.2).
fn clone_whole() -> Result<rustix::fd::OwnedFd, String> {
    use rustix::mount::OpenTreeFlags;
    rustix::mount::open_tree(
        rustix::fs::CWD,
        "/dev",
        OpenTreeFlags::OPEN_TREE_CLONE
            | OpenTreeFlags::OPEN_TREE_CLOEXEC
            | OpenTreeFlags::AT_RECURSIVE,
    )
    .map_err(|e| format!("copy the mounts of /dev (open_tree, Linux 5.2): {e}"))
}

/// Attaches the detached mounts `tree` at `target`.
fn attach(tree: &rustix::fd::OwnedFd, target: &Path) -> Result<(), String> {
    rustix::mount::move_mount(
        tree,
        "",
        rustix::fs::CWD,
        target,
        rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(|e| format!("bind the real /dev at {}: {e}", target.display()))
}

/// The metadata of the real `/dev`.
fn real_dev_meta(real_dev: &Path) -> Result<fs::Metadata, String> {
    fs::metadata(real_dev).map_err(|e| format!("/dev: {e}"))
}

/// The entries of the directory `dir` with their metadata (not following symlinks), in
/// name order.
fn listing(dir: &Path) -> Result<Vec<(std::ffi::OsString, fs::Metadata)>, String> {
    let shown = shown(dir);
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| format!("read {shown}: {e}"))? {
        let entry = entry.map_err(|e| format!("read {shown}: {e}"))?;
        let meta = entry
            .metadata()
            .map_err(|e| format!("{}/{}: {e}", shown, entry.file_name().to_string_lossy()))?;
        entries.push((entry.file_name(), meta));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(entries)
}

/// A path under the real `/dev` as the user knows it (`/proc/self/fd/N/x` → `/dev/x`).
fn shown(path: &Path) -> String {
    match path.strip_prefix("/proc/self/fd") {
        Ok(rest) => {
            let mut parts = rest.components();
            parts.next(); // the descriptor's number
            Path::new("/dev")
                .join(parts.as_path())
                .display()
                .to_string()
        }
        Err(_) => path.display().to_string(),
    }
}

/// A directory at `target` with the mode of `meta`'s.
fn make_dir(target: &Path, meta: &fs::Metadata) -> Result<(), String> {
    fs::DirBuilder::new()
        .mode(meta.mode() & 0o7777)
        .create(target)
        .map_err(|e| format!("create {}: {e}", target.display()))
}

/// Puts the real `/dev` entry `source` (of metadata `meta`) at `target` on the tmpfs: a
/// symlink as a symlink, a directory bound recursively, anything else bound.
fn put_back(source: &Path, target: &Path, meta: &fs::Metadata) -> Result<(), String> {
    let kind = meta.file_type();
    if kind.is_symlink() {
        let link = fs::read_link(source).map_err(|e| format!("read {}: {e}", shown(source)))?;
        std::os::unix::fs::symlink(&link, target)
            .map_err(|e| format!("symlink {} -> {}: {e}", target.display(), link.display()))
    } else if kind.is_dir() {
        make_dir(target, meta)?;
        bind(source, target, true)
    } else {
        bind(source, target, false)
    }
}

/// Binds `source` at `target` (made first: an empty file, unless `recursive`, where the
/// directory exists already).
fn bind(source: &Path, target: &Path, recursive: bool) -> Result<(), String> {
    if !recursive {
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(target)
            .map_err(|e| format!("create {}: {e}", target.display()))?;
    }
    let result = if recursive {
        rustix::mount::mount_bind_recursive(source, target)
    } else {
        rustix::mount::mount_bind(source, target)
    };
    result.map_err(|e| format!("bind {} at {}: {e}", shown(source), target.display()))
}

/// UCX's condition on the node: a character device this process may read and write.
fn check_node(node: &Path) -> Result<(), String> {
    let meta = fs::metadata(node).map_err(|e| format!("{}: {e}", node.display()))?;
    if !meta.file_type().is_char_device() {
        return Err(format!(
            "{} is not a character device (the real /dev/null is not one)",
            node.display()
        ));
    }
    rustix::fs::access(
        node,
        rustix::fs::Access::READ_OK | rustix::fs::Access::WRITE_OK,
    )
    .map_err(|e| format!("{} cannot be read and written: {e}", node.display()))
}

/// What the host shows that forbids unprivileged user namespaces, as the end of a sentence.
fn causes() -> String {
    let read = |file: &str| -> Option<i64> { fs::read_to_string(file).ok()?.trim().parse().ok() };
    let mut causes = Vec::new();
    if read("/proc/sys/kernel/unprivileged_userns_clone") == Some(0) {
        causes.push(
            "unprivileged user namespaces are disabled (sysctl kernel.unprivileged_userns_clone \
             = 0; `sysctl -w kernel.unprivileged_userns_clone=1` as root enables them)",
        );
    }
    if read("/proc/sys/user/max_user_namespaces") == Some(0) {
        causes.push(
            "user namespaces are disabled (sysctl user.max_user_namespaces = 0; `sysctl -w \
             user.max_user_namespaces=10000` as root enables them)",
        );
    }
    if read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == Some(1) {
        causes.push(
            "AppArmor restricts unprivileged user namespaces (sysctl \
             kernel.apparmor_restrict_unprivileged_userns = 1)",
        );
    }
    if causes.is_empty() {
        ": the kernel refused the user namespace, though its sysctls allow them (a \
         container's seccomp policy, or SELinux, may forbid it; the number of user \
         namespaces may be at user.max_user_namespaces)"
            .to_owned()
    } else {
        format!(": {}", causes.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_under_the_real_dev_are_shown_as_dev_paths() {
        assert_eq!(shown(Path::new("/proc/self/fd/3/null")), "/dev/null");
        assert_eq!(
            shown(Path::new("/proc/self/fd/3/infiniband/uverbs0")),
            "/dev/infiniband/uverbs0"
        );
        assert_eq!(shown(Path::new("/dev/infiniband/x")), "/dev/infiniband/x");
    }

    #[test]
    fn the_device_name_is_the_drop_ins() {
        assert_eq!(device_name(), "softverbs0");
    }
}
