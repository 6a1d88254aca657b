//! What devices of dead processes left in `/dev/shm`.
//!
//! A device removes its inbox when it closes (`OwnInbox`'s drop), but a process that is
//! killed, crashes, or exits without closing its device (a C program on the drop-in that
//! returns from `main` with its context open) leaves the file behind, and with it every
//! page its senders wrote: up to a ring (4 MiB) per peer that sent to it. The next device
//! to take the same slot of the same address replaces the file; until then it stays, so a
//! developer whose programs crash or are interrupted fills `/dev/shm` address by address
//! (and a `/dev/shm` that has no room for another ring sends every new pair of devices
//! over UDP, `inbox.rs`).
//!
//! So the first device of a process to make an inbox sweeps the files of its user and PID
//! namespace first (in every network namespace: one that is gone leaves files no device of
//! it will sweep; another PID namespace's process IDs mean nothing here, and its files
//! are removed once nobody holds their lock, `inbox::abandoned`): in
//! every address's members file, each slot whose member is gone is claimed as a joining
//! device claims it — so no device can be making an inbox in that slot meanwhile — its
//! inbox removed, and the slot freed. An inbox a dead process was still making
//! (`…-sK.newPID`, renamed into place once made) goes too, and so does an inbox of the
//! layout before shared addresses (`…-ADDRESS-PORT`, no slot), which no device of this
//! version makes, once its owner (in its header) is gone. A slot whose member is alive, or
//! whose process ID was reused by an unrelated live process, is left as it is. An
//! address's members file goes once no live process holds a slot of it or its socket
//! (`Members::retire`): addresses and network namespaces come and go (a test suite makes
//! namespaces by the hundred), and each left a file that every process's sweep then opened.

use std::path::Path;
use std::sync::Once;

use super::inbox::{abandoned, owner_gone, pid_alive, unlink_if, Scope, SHM_DIR};
use super::members::Members;

/// Sweeps the files of `scope`'s user and PID namespace once per process (module doc).
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

/// Removes from `dir` the inboxes of the dead members of `scope`'s user and PID namespace,
/// and the members files of addresses no live device is at (module doc); returns how many
/// files went.
pub(crate) fn sweep(scope: &Scope, dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let prefix = scope.user_prefix();
    let any_pid_namespace = scope.any_pid_namespace_prefix();
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| n.starts_with(&any_pid_namespace)) else {
            continue;
        };
        if !name.starts_with(&prefix) {
            // Another PID namespace's: its process IDs mean nothing here, its holders' lock
            // does (`inbox::abandoned`).
            if foreign_file(&name[any_pid_namespace.len()..]) && remove_abandoned(&entry.path()) {
                removed += 1;
            }
            continue;
        }
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
            // An address no live device is at (any more): its members file goes too.
            if members.retire(&entry.path()) {
                removed += 1;
            }
        } else if let Some((_, pid)) = name.rsplit_once(".new") {
            let dead = pid.parse().is_ok_and(|pid| !pid_alive(pid));
            if dead && std::fs::remove_file(entry.path()).is_ok() {
                removed += 1;
            }
        } else if name
            .rsplit_once('-')
            .is_some_and(|(_, port)| port.parse::<u16>().is_ok())
            && owner_gone(&entry.path())
            && std::fs::remove_file(entry.path()).is_ok()
        {
            // The layout before shared addresses: `…-ADDRESS-PORT`.
            removed += 1;
        }
    }
    removed
}

/// Whether `rest`, a file name after `softverbs-UID-`, is an inbox (or one being made) or
/// an address's members file of another PID namespace: `PIDNS-NETNS-ADDRESS-PORT-sK`, or
/// that and `.newPID`, or `PIDNS-NETNS-ADDRESS-PORT.members`. (A name of the layout before
/// PID namespaces, `NETNS-ADDRESS-…`, has an address where the network namespace would
/// be: not one.)
fn foreign_file(rest: &str) -> bool {
    let number = |part: Option<&str>| {
        part.is_some_and(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
    };
    let mut parts = rest.splitn(3, '-');
    if !(number(parts.next()) && number(parts.next())) {
        return false;
    }
    let Some(tail) = parts.next() else {
        return false;
    };
    if tail.ends_with(".members") {
        return true;
    }
    let inbox = tail.split_once(".new").map_or(tail, |(inbox, _)| inbox);
    inbox
        .rsplit_once("-s")
        .is_some_and(|(_, slot)| number(Some(slot)))
}

/// Removes the file at `path` if nobody holds it ([`abandoned`]) and the path still names
/// the file found so; whether it did.
fn remove_abandoned(path: &Path) -> bool {
    abandoned(path).is_some_and(|(_locked, inode)| unlink_if(path, inode))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::Endpoint;
    use std::net::{IpAddr, Ipv4Addr};

    /// A process ID no process has: the highest `pid_max` allows is below it.
    const GONE: u32 = (1 << 22) + 1;

    /// The names of another PID namespace's files are told from every other name.
    #[test]
    fn a_file_of_another_pid_namespace_is_told_by_its_name() {
        for file in [
            "4026532001-4026531833-127.0.0.5-4791-s0",
            "4026532001-4026531833-fd00::1-4791-s17",
            "4026532001-4026531833-127.0.0.5-4791-s3.new42",
            "4026532001-4026531833-127.0.0.5-4791.members",
        ] {
            assert!(foreign_file(file), "{file}");
        }
        for other in [
            // The layout before PID namespaces: an address where NETNS would be.
            "4026531833-127.0.0.5-4791.members",
            "4026531833-127.0.0.5-4791-s0",
            "4026531833-127.0.0.5-4791",
            "4026532001-4026531833-127.0.0.5-4791-sx",
            "x-4026531833-127.0.0.5-4791-s0",
        ] {
            assert!(!foreign_file(other), "{other}");
        }
    }

    /// A file whose owner holds its lock stays; one nobody holds goes.
    #[test]
    fn a_file_goes_only_once_nobody_holds_its_lock() {
        let dir = std::env::temp_dir().join(format!("softverbs-locks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("inbox");
        std::fs::write(&path, b"inbox").unwrap();
        let held = std::fs::File::open(&path).unwrap();
        rustix::fs::flock(&held, rustix::fs::FlockOperation::LockShared).unwrap();
        assert!(!remove_abandoned(&path));
        assert!(path.exists(), "its owner holds it");
        drop(held);
        assert!(remove_abandoned(&path));
        assert!(!path.exists(), "nobody holds it");
        std::fs::remove_dir_all(&dir).unwrap();
    }

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
        // Inboxes of the layout before shared addresses (no slot): one whose owner is
        // gone, one whose owner is alive, one that is no inbox.
        let old = |address: u8, owner: u32| {
            let mut head = b"softvrb1".to_vec();
            head.extend_from_slice(&owner.to_ne_bytes());
            head.resize(4096, 0);
            let path = dir.join(format!("{}127.0.0.{address}-4791", scope.prefix()));
            std::fs::write(&path, head).unwrap();
            path
        };
        let (old_gone, old_alive) = (old(98, GONE), old(97, std::process::id()));
        let not_an_inbox = dir.join(format!("{}127.0.0.96-4791", scope.prefix()));
        std::fs::write(&not_an_inbox, [0u8; 64]).unwrap();
        // Another network namespace's files of this user are swept too; another user's
        // are not looked at.
        let elsewhere = Scope {
            netns: scope.netns + 1,
            ..scope
        };
        let there = elsewhere.path(&local, 0);
        let there = dir.join(there.file_name().unwrap());
        let there_members_path = dir.join(elsewhere.members_path(&local).file_name().unwrap());
        let there_members = Members::open(&there_members_path).unwrap();
        there_members.set_member(0, GONE);
        std::fs::write(&there, b"inbox").unwrap();
        let foreign = dir.join("softverbs-99999-1-127.0.0.99-4791-s1");
        std::fs::write(&foreign, b"inbox").unwrap();

        assert_eq!(sweep(&scope, &dir), 5);
        assert!(
            !there.exists(),
            "a dead member's inbox in another namespace goes"
        );
        assert!(
            !there_members_path.exists(),
            "so does the members file of an address no live device is at"
        );
        assert!(
            name(".members").exists(),
            "the members file of an address with a live member stays"
        );
        assert!(!old_gone.exists(), "an old inbox whose owner is gone goes");
        assert!(old_alive.exists() && not_an_inbox.exists());
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
