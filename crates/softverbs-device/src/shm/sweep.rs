//! What devices of dead processes left in `/dev/shm`.
//!
//! A device removes its inbox when it closes (`OwnInbox`'s drop), but a process that is
//! killed, crashes, or exits without closing its device (a C program on the drop-in that
//! returns from `main` with its context open) leaves the file behind, and with it every
//! page its senders wrote: up to a ring (4 MiB) per peer that sent to it. The next device
//! to take the same slot of the same address replaces the file; until then it stays, so a
//! developer whose programs crash or are interrupted fills `/dev/shm` address by address
//! (and a nearly full `/dev/shm` makes every new device UDP only, `inbox.rs`).
//!
//! So the first device of a process to make an inbox sweeps its scope (this user, this
//! network namespace) first: in every address's members file, each slot whose member is
//! gone is claimed as a joining device claims it — so no device can be making an inbox in
//! that slot meanwhile — its inbox removed, and the slot freed. An inbox a dead process was
//! still making (`…-sK.newPID`, renamed into place once made) goes too. A slot whose member
//! is alive, or whose process ID was reused by an unrelated live process, is left as it is.

use std::path::Path;
use std::sync::Once;

use super::inbox::{pid_alive, Scope, SHM_DIR};
use super::members::Members;

/// Sweeps `scope` once per process (module doc).
pub(crate) fn once(scope: &Scope) {
    static SWEPT: Once = Once::new();
    SWEPT.call_once(|| {
        let removed = sweep(scope, Path::new(SHM_DIR));
        if removed > 0 {
            tracing::info!(
                removed,
                "removed the shared-memory inboxes of devices of processes that are gone"
            );
        }
    });
}

/// Removes from `dir` the inboxes of `scope`'s dead members (module doc); returns how
/// many files went.
pub(crate) fn sweep(scope: &Scope, dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let prefix = scope.prefix();
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| n.starts_with(&prefix)) else {
            continue;
        };
        if let Some(address) = name.strip_suffix(".members") {
            let Ok(members) = Members::open(&entry.path()) else {
                continue;
            };
            members.reclaim_dead(|slot| {
                let inbox = dir.join(format!("{address}-s{slot}"));
                if std::fs::remove_file(inbox).is_ok() {
                    removed += 1;
                }
            });
        } else if let Some((_, pid)) = name.rsplit_once(".new") {
            let dead = pid.parse().is_ok_and(|pid| !pid_alive(pid));
            if dead && std::fs::remove_file(entry.path()).is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::Endpoint;
    use std::net::{IpAddr, Ipv4Addr};

    /// A process ID no process has: the highest `pid_max` allows is below it.
    const GONE: u32 = (1 << 22) + 1;

    #[test]
    fn only_the_inboxes_of_slots_whose_member_is_gone_are_removed() {
        let dir = std::env::temp_dir().join(format!("softverbs-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let scope = Scope::current().unwrap();
        let local = Endpoint::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 99)), 4791);
        let name = |suffix: &str| {
            let members = scope.members_path(&local);
            let base = members.file_name().unwrap().to_str().unwrap();
            dir.join(format!(
                "{}{suffix}",
                base.strip_suffix(".members").unwrap()
            ))
        };
        let members = Members::open(&name(".members")).unwrap();
        // Slot 0: this process (alive); slot 1: a process that is gone; slot 2: free.
        assert_eq!(members.claim(), Some(0));
        members.set_member(1, GONE);
        for file in ["-s0", "-s1", "-s2", "-s1.new4194305", "-s3.new1"] {
            std::fs::write(name(file), b"inbox").unwrap();
        }
        // Another user's or namespace's files are not looked at.
        let foreign = dir.join("softverbs-99999-1-127.0.0.99-4791-s1");
        std::fs::write(&foreign, b"inbox").unwrap();

        assert_eq!(sweep(&scope, &dir), 2);
        assert!(name("-s0").exists(), "a live member's inbox stays");
        assert!(!name("-s1").exists(), "a dead member's inbox goes");
        assert!(
            name("-s2").exists(),
            "a free slot's file is not the sweep's"
        );
        assert!(!name("-s1.new4194305").exists(), "a dead maker's file goes");
        assert!(name("-s3.new1").exists(), "pid 1 is alive");
        assert!(foreign.exists());
        // The dead member's slot is free again, the live one's still held.
        assert_eq!(members.claim(), Some(1));
        assert_eq!(sweep(&scope, &dir), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
