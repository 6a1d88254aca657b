//! The members of an address: the devices of this host's processes (one user, one network
//! namespace) that share one (address, UDP port) pair.
//!
//! RoCEv2 fixes the UDP port (4791), and only one socket can own `address:4791`. A NIC
//! tells its QPs apart by the destination QPN of each packet; so do devices sharing an
//! address: each claims a slot `k` of the address's members file and hands out only the
//! QPNs `k << 16 .. (k + 1) << 16` ([`Members::qpn_range`]), so that the destination QPN
//! of a packet names the device it is for ([`slot_of`]). The device holding the socket
//! forwards every packet for another member's slot into that member's inbox; devices of
//! this host send straight to the member's inbox (`mod.rs`).
//!
//! The file, `/dev/shm/softverbs-UID-NETNS-ADDRESS-PORT.members` (mode 0600, only its user
//! can open it), is [`SLOTS`] slots after a header; all fields are `u32` atomics, zero when
//! free:
//!
//! | offset | field |
//! |---|---|
//! | 0 | holder: process ID of the device holding `address:port` |
//! | 64 + 8k | slot `k`: process ID of its member |
//! | 68 + 8k | slot `k`: state, [`JOINING`] or [`READY`] (the member's inbox exists) |
//!
//! Who writes what: a device claims a slot by compare-and-swap of its process ID (over 0,
//! or over the ID of a process that is gone, so a member that died blocks nobody), marks it
//! ready once its inbox exists, and frees it when it closes; the device that binds the
//! socket writes `holder`, and clears it when it closes. A process ID reused by an unrelated
//! process keeps a dead member's slot until that process ends (the slot's range is lost
//! meanwhile, nothing else). The file is never removed (its size is fixed; a device that
//! finds it takes it as it is).

use super::inbox::pid_alive;
use rustix::fs::{Mode, OFlags};
use rustix::mm::{MapFlags, ProtFlags};
use std::ffi::c_void;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

/// Slots of an address: devices that can share it at a time.
pub(crate) const SLOTS: usize = 256;

/// QPNs per slot.
const SLOT_QPNS: u32 = 1 << 16;

/// A slot claimed by a device whose inbox is not there yet.
pub(crate) const JOINING: u32 = 0;
/// A slot whose member has its inbox.
pub(crate) const READY: u32 = 1;

#[repr(C)]
struct Slot {
    pid: AtomicU32,
    state: AtomicU32,
}

/// The file's layout.
#[repr(C)]
struct MembersFile {
    holder: AtomicU32,
    _pad: [u8; 60],
    slots: [Slot; SLOTS],
}

const LEN: usize = std::mem::size_of::<MembersFile>();

/// The slot whose member owns `qpn`: its upper 8 bits (QPN 1, the management QP, is slot
/// 0's). `None` for the multicast QPN 0xFFFFFF, which every member receives on its own
/// group sockets.
pub(crate) fn slot_of(qpn: u32) -> Option<usize> {
    (qpn != 0xFF_FFFF).then_some((qpn >> 16) as usize & (SLOTS - 1))
}

/// The destination QPN of an IB transport packet (BTH bytes 5..8); `None` if it is too
/// short for a BTH.
pub(crate) fn destination_qpn(ib_packet: &[u8]) -> Option<u32> {
    let bytes = ib_packet.get(5..8)?;
    Some(u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]))
}

/// A shared mapping of an address's members file.
pub(crate) struct Members {
    base: *const MembersFile,
}

// SAFETY: the mapping is shared memory accessed through atomics only.
unsafe impl Send for Members {}
// SAFETY: as for `Send`.
unsafe impl Sync for Members {}

impl Drop for Members {
    fn drop(&mut self) {
        // SAFETY: `base` is a mapping of `LEN` bytes made by `open`; no reference into it
        // outlives `self` (`file` borrows it).
        if let Err(error) = unsafe { rustix::mm::munmap(self.base as *mut c_void, LEN) } {
            tracing::debug!(%error, "munmap of a members file failed");
        }
    }
}

impl Members {
    /// Opens the members file at `path`, making it if there is none.
    pub(crate) fn open(path: &Path) -> io::Result<Members> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC,
            Mode::RUSR | Mode::WUSR,
        )?;
        let stat = rustix::fs::fstat(&fd)?;
        if stat.st_uid != rustix::process::geteuid().as_raw() || stat.st_mode & 0o077 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "the members file is not this user's own",
            ));
        }
        match stat.st_size {
            // Made now, or by a device opening it at the same time: either size is LEN,
            // and ftruncate to the same size keeps what the other wrote.
            0 => rustix::fs::ftruncate(&fd, LEN as u64)?,
            size if size == LEN as i64 => {}
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the members file has the wrong size",
                ))
            }
        }
        // SAFETY: a fresh shared mapping of the whole file (LEN bytes); nothing else in this
        // process refers to its addresses.
        let base = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                LEN,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )?
        };
        Ok(Members {
            base: base as *const MembersFile,
        })
    }

    fn file(&self) -> &MembersFile {
        // SAFETY: the mapping is a `MembersFile` (atomics only, valid for any bytes),
        // page-aligned, and lives as long as `self`.
        unsafe { &*self.base }
    }

    /// Claims a free slot (or one whose member is gone) for this process, lowest first.
    pub(crate) fn claim(&self) -> Option<usize> {
        let me = std::process::id();
        for (index, slot) in self.file().slots.iter().enumerate() {
            // Acquire: pairs with a leaving member's Release of 0.
            let pid = slot.pid.load(Ordering::Acquire);
            if pid != 0 && pid_alive(pid) {
                continue;
            }
            if slot
                .pid
                .compare_exchange(pid, me, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                slot.state.store(JOINING, Ordering::Release);
                return Some(index);
            }
        }
        None
    }

    /// Marks `slot` ready: the member's inbox exists.
    pub(crate) fn set_ready(&self, slot: usize) {
        // Release: after the inbox was created (renamed into place); a forwarder's Acquire
        // load that sees READY finds the file.
        self.file().slots[slot]
            .state
            .store(READY, Ordering::Release);
    }

    /// Frees `slot` (this process's).
    pub(crate) fn release(&self, slot: usize) {
        let slot = &self.file().slots[slot];
        slot.state.store(JOINING, Ordering::Relaxed);
        // Release: a claimant that sees 0 sees the state reset.
        slot.pid.store(0, Ordering::Release);
    }

    /// The member of `slot` if its inbox is ready: its process ID (which may be gone; the
    /// inbox tells).
    pub(crate) fn ready_member(&self, slot: usize) -> Option<u32> {
        let slot = &self.file().slots[slot];
        // Acquire both: pairs with the claimant's and `set_ready`'s Release stores.
        let pid = slot.pid.load(Ordering::Acquire);
        (pid != 0 && slot.state.load(Ordering::Acquire) == READY).then_some(pid)
    }

    /// Whether a live member other than this process holds a slot; and whether one of this
    /// process does.
    pub(crate) fn live_members(&self) -> (bool, bool) {
        let me = std::process::id();
        let (mut others, mut mine) = (false, false);
        for slot in &self.file().slots {
            match slot.pid.load(Ordering::Acquire) {
                0 => {}
                pid if pid == me => mine = true,
                pid => others |= pid_alive(pid),
            }
        }
        (others, mine)
    }

    /// The process holding the address's socket (0: none said so).
    pub(crate) fn holder(&self) -> u32 {
        // Only a process ID is published through it: Acquire / Release for symmetry, no
        // other data depends on it.
        self.file().holder.load(Ordering::Acquire)
    }

    /// Records this process as the socket's holder.
    pub(crate) fn set_holder(&self) {
        self.file()
            .holder
            .store(std::process::id(), Ordering::Release);
    }

    /// Clears the holder if it is this process.
    pub(crate) fn clear_holder(&self) {
        let _ = self.file().holder.compare_exchange(
            std::process::id(),
            0,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// The QPNs of `slot`: `k << 16 .. (k + 1) << 16` (the engine leaves out 0, 1 and
    /// 0xFFFFFF).
    pub(crate) fn qpn_range(slot: usize) -> softverbs_proto::QpnRange {
        let start = slot as u32 * SLOT_QPNS;
        softverbs_proto::QpnRange::from(start..start + SLOT_QPNS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_destination_qpn_names_the_slot() {
        let mut bth = [0u8; 12];
        bth[5..8].copy_from_slice(&[0x03, 0x00, 0x11]);
        assert_eq!(destination_qpn(&bth), Some(0x03_0011));
        assert_eq!(slot_of(0x03_0011), Some(3));
        assert_eq!(slot_of(1), Some(0));
        assert_eq!(slot_of(0xFF_FFFE), Some(255));
        assert_eq!(slot_of(0xFF_FFFF), None);
        assert_eq!(destination_qpn(&bth[..7]), None);
        assert_eq!(Members::qpn_range(0).usable(), 2..0x1_0000);
        assert_eq!(Members::qpn_range(255).usable(), 0xFF_0000..0xFF_FFFF);
    }

    #[test]
    fn slots_are_claimed_once_and_freed() {
        let path = std::env::temp_dir().join(format!("softverbs-members-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let members = Members::open(&path).unwrap();
        let again = Members::open(&path).unwrap();
        let a = members.claim().unwrap();
        let b = again.claim().unwrap();
        assert_ne!(a, b);
        assert_eq!(members.ready_member(a), None);
        members.set_ready(a);
        assert_eq!(again.ready_member(a), Some(std::process::id()));
        assert_eq!(members.live_members(), (false, true));
        members.release(a);
        assert_eq!(again.ready_member(a), None);
        assert_eq!(again.claim(), Some(a));
        std::fs::remove_file(&path).unwrap();
    }

    /// A member that died without freeing its slot blocks nobody: the next claimant takes
    /// its slot (the lowest), and it no longer counts as a live member.
    #[test]
    fn the_slot_of_a_dead_process_is_claimed_again() {
        let path = std::env::temp_dir().join(format!("softverbs-dead-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let members = Members::open(&path).unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        for slot in &members.file().slots[..2] {
            slot.pid.store(dead, Ordering::Relaxed);
            slot.state.store(READY, Ordering::Relaxed);
        }
        members.file().holder.store(dead, Ordering::Relaxed);
        assert_eq!(members.live_members(), (false, false));
        assert_eq!(members.claim(), Some(0));
        assert_eq!(members.ready_member(0), None, "joining, not ready");
        assert_eq!(members.claim(), Some(1));
        assert_eq!(members.live_members(), (false, true));
        std::fs::remove_file(&path).unwrap();
    }
}
