//! The members of an address: the devices of this host's processes (one user, one PID
//! namespace, one network namespace) that share one (address, UDP port) pair.
//!
//! RoCEv2 fixes the UDP port (4791), and only one socket can own `address:4791`. A NIC
//! tells its QPs apart by the destination QPN of each packet; so do devices sharing an
//! address: each claims a slot `k` of the address's members file and hands out only the
//! QPNs `k << 16 .. (k + 1) << 16` ([`Members::qpn_range`]), so that the destination QPN
//! of a packet names the device it is for ([`slot_of`]). The device holding the socket
//! forwards every packet for another member's slot into that member's inbox; devices of
//! this host send straight to the member's inbox (`mod.rs`).
//!
//! The file, `/dev/shm/softverbs-UID-PIDNS-NETNS-ADDRESS-PORT.members` (mode 0600, only its
//! user can open it), is [`SLOTS`] slots after a header; all fields are `u32` atomics, zero when
//! free:
//!
//! | offset | field |
//! |---|---|
//! | 0 | holder: process ID of the device holding `address:port` |
//! | 64 + 8k | slot `k`: process ID of its member |
//! | 68 + 8k | slot `k`: state, [`JOINING`] or [`READY`] (the member's inbox exists) |
//! | 2112 | services lock: process ID of the device changing the services table |
//! | 2176 + 16s | service entry `s`: process ID of its listener (0: free) |
//! | 2180 + 16s | service entry `s`: the listener's slot |
//! | 2184 + 16s | service entry `s`: the service ID |
//!
//! The services table says which member's connection manager listens on which service ID
//! ([`Members::claim_service`]): the holder hands it the REQs and SIDR_REQs for that
//! service, which arrive on QP1 like every management datagram of the address. The table
//! was added after the slots; a file made before it (2112 bytes) is grown in place, and a
//! device that does not know the table still reads its slots where they were.
//!
//! Who writes what: a device claims a slot by compare-and-swap of its process ID (over 0,
//! or over the ID of a process that is gone, so a member that died blocks nobody), marks it
//! ready once its inbox exists, and frees it when it closes; the device that binds the
//! socket writes `holder`, and clears it when it closes. A process ID reused by an unrelated
//! process keeps a dead member's slot until that process ends (the slot's range is lost
//! meanwhile, nothing else). The file stays while a live process holds a slot or the
//! socket; once none does, the next sweep removes it (`sweep.rs`, [`Members::retire`]),
//! and a device that opened it at that moment claims its slot in the file made at the path
//! after it ([`Members::join`]). Its size is fixed; a device that finds it takes it as it
//! is.

use super::inbox::pid_alive;
use rustix::fs::{Mode, OFlags};
use rustix::mm::{MapFlags, ProtFlags};
use softverbs_cm::mad::{comm_id_share, Addressee};
use std::ffi::c_void;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Slots of an address: devices that can share it at a time.
pub(crate) const SLOTS: usize = 256;

/// How long [`Members::join`] keeps trying while sweeps remove the file it opened or hold
/// its slots (a sweep holds them for microseconds).
const JOIN_PATIENCE: std::time::Duration = std::time::Duration::from_millis(100);

/// Set in a slot's process ID while a sweep holds the slot to remove the file
/// ([`Members::retire`]): the slot is held (by the live sweeper), but nobody is a member
/// there. Process IDs are below 2^22 (`pid_max`).
const RETIRING: u32 = 1 << 31;

/// Whether the process holding a slot (`held`, its process ID or a sweep's claim) is alive.
fn holder_alive(held: u32) -> bool {
    pid_alive(held & !RETIRING)
}

/// QPNs per slot.
const SLOT_QPNS: u32 = 1 << 16;

/// Entries of the services table: services listened on at a time, over all members.
pub(crate) const SERVICES: usize = 256;

/// How long a device waits for the services lock held by a live process.
const SERVICES_LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// A slot claimed by a device whose inbox is not there yet.
pub(crate) const JOINING: u32 = 0;
/// A slot whose member has its inbox.
pub(crate) const READY: u32 = 1;

#[repr(C)]
struct Slot {
    pid: AtomicU32,
    state: AtomicU32,
}

/// A service one member's connection manager listens on.
#[repr(C)]
struct Service {
    /// The listener's process ID; 0: the entry is free. Written last when claimed
    /// (Release), first when freed.
    pid: AtomicU32,
    slot: AtomicU32,
    id: AtomicU64,
}

/// The file's layout.
#[repr(C)]
struct MembersFile {
    holder: AtomicU32,
    _pad: [u8; 60],
    slots: [Slot; SLOTS],
    services_lock: AtomicU32,
    _pad2: [u8; 60],
    services: [Service; SERVICES],
}

const LEN: usize = std::mem::size_of::<MembersFile>();

/// The size of a members file made before the services table: its slots end there.
const LEN_WITHOUT_SERVICES: usize = std::mem::offset_of!(MembersFile, services_lock);

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

/// Where a management datagram starts in an IB transport packet to QP1: after the BTH (12
/// bytes) and the DETH (8).
const GSI_MAD_AT: usize = 20;

/// The slot whose ring a packet may go into straight from a device of this host: its
/// destination QPN's. `None` for multicast and for QP1 (a management datagram is for the
/// member whose connection manager its contents name: the holder of the socket tells,
/// [`Members::packet_slot`], so those go to the address's socket).
pub(crate) fn ring_slot(ib_packet: &[u8]) -> Option<usize> {
    destination_qpn(ib_packet).and_then(qpn_ring_slot)
}

/// [`ring_slot`] of a packet for QP `qpn`.
pub(crate) fn qpn_ring_slot(qpn: u32) -> Option<usize> {
    (qpn != GSI_QPN).then_some(qpn).and_then(slot_of)
}

/// QP1, the General Services Interface.
const GSI_QPN: u32 = 1;

/// A shared mapping of an address's members file.
pub(crate) struct Members {
    base: *const MembersFile,
    /// The file's inode: whether its path still names it ([`Members::is_at`]).
    inode: u64,
    /// The file: a member holds a shared `flock(2)` on it ([`Members::join`]), its sign of
    /// life to a sweep of another PID namespace (`inbox::abandoned`).
    fd: rustix::fd::OwnedFd,
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

/// Takes `slot` for process `me` if its member is still `pid` (free, or gone): it is then
/// joining.
fn take(slot: &Slot, pid: u32, me: u32) -> bool {
    let taken = slot
        .pid
        .compare_exchange(pid, me, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok();
    if taken {
        slot.state.store(JOINING, Ordering::Release);
    }
    taken
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
            // and ftruncate to the same size keeps what the other wrote. A file of a
            // version without the services table grows (the new part reads zero: free).
            0 => rustix::fs::ftruncate(&fd, LEN as u64)?,
            size if size == LEN_WITHOUT_SERVICES as i64 => rustix::fs::ftruncate(&fd, LEN as u64)?,
            size if size == LEN as i64 => {}
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the members file has the wrong size",
                ))
            }
        }
        // Every page allocated before a write through the mapping could need one that a
        // full /dev/shm cannot give (a SIGBUS): ENOSPC here instead.
        super::inbox::reserve(&fd, 0, LEN)?;
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
            inode: stat.st_ino,
            fd,
        })
    }

    /// Whether `path` still names this file: a sweep may have removed it
    /// ([`Members::retire`]) since it was opened.
    pub(crate) fn is_at(&self, path: &Path) -> bool {
        rustix::fs::stat(path).is_ok_and(|stat| stat.st_ino == self.inode)
    }

    /// Opens the members file at `path` (`members`, if already open) and claims a slot in
    /// it for this process, as [`Members::claim`]: with the file at `path` again if a sweep
    /// removed the one opened ([`Members::retire`]: the slot claimed there, or none to
    /// claim, counts for nothing), and again a moment later while a sweep holds slots of
    /// it; for at most [`JOIN_PATIENCE`]. `AddrInUse` when live members hold every slot.
    pub(crate) fn join(members: Option<Members>, path: &Path) -> io::Result<(Members, usize)> {
        let mut members = match members {
            Some(members) => members,
            None => Members::open(path)?,
        };
        let deadline = std::time::Instant::now() + JOIN_PATIENCE;
        // Whether the last claim found every slot held and no sweep among the holders: a
        // sweep that let go of the slots behind the claim's scan, and finished before the
        // look for sweeps, leaves exactly that, so it takes two in a row to give up.
        let mut full = false;
        loop {
            // Held from before the check that the path names the file: a sweep of another
            // PID namespace removes the file only while nobody holds it.
            rustix::fs::flock(&members.fd, rustix::fs::FlockOperation::LockShared)?;
            let claimed = members.claim();
            let here = members.is_at(path);
            match claimed {
                Some(slot) if here => return Ok((members, slot)),
                Some(slot) => members.release(slot),
                None if here && !members.sweep_holds_slots() => {
                    if full {
                        break;
                    }
                    full = true;
                    continue;
                }
                None => {}
            }
            full = false;
            if std::time::Instant::now() >= deadline {
                break;
            }
            if here {
                // A sweep holds slots: it lets go, or removes the file, in microseconds.
                std::thread::sleep(JOIN_PATIENCE / 100);
            } else {
                members = Members::open(path)?;
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "no slot of {} could be claimed: live devices hold all {SLOTS}",
                path.display()
            ),
        ))
    }

    /// Whether a live sweep holds a slot ([`RETIRING`]).
    fn sweep_holds_slots(&self) -> bool {
        self.file().slots.iter().any(|slot| {
            let held = slot.pid.load(Ordering::Acquire);
            held & RETIRING != 0 && holder_alive(held)
        })
    }

    /// Removes the file from `path` if no live process holds a slot of it or the address's
    /// socket: every slot is claimed for this process first, marked [`RETIRING`] (so no
    /// device can join it meanwhile, nor take the claims for members; one that opened it
    /// and claims nothing, or a slot only after this process is gone, finds the path no
    /// longer names it and opens the file there again, [`Members::join`]), and the file is
    /// removed only if `path` still names it. The slots stay claimed in the removed file.
    /// Whether it was removed.
    pub(crate) fn retire(&self, path: &Path) -> bool {
        let me = std::process::id();
        let slots = &self.file().slots;
        let mut taken = 0;
        while taken < SLOTS {
            let slot = &slots[taken];
            let pid = slot.pid.load(Ordering::Acquire);
            // Free, or a claim of a sweep that died; not a member, even a dead one (the
            // next sweep removes its inbox first, `reclaim_dead`).
            let free = pid == 0 || (pid & RETIRING != 0 && !holder_alive(pid));
            if !free || !take(slot, pid, me | RETIRING) {
                break;
            }
            taken += 1;
        }
        let holder = self.holder();
        let unused = taken == SLOTS && (holder == 0 || !pid_alive(holder));
        if unused && super::inbox::unlink_if(path, self.inode) {
            return true;
        }
        for index in 0..taken {
            self.release(index);
        }
        false
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
            if pid != 0 && holder_alive(pid) {
                continue;
            }
            if take(slot, pid, me) {
                return Some(index);
            }
        }
        None
    }

    /// Claims each slot whose member is gone, as [`Members::claim`] would but marked
    /// [`RETIRING`] (no member for a device looking for members meanwhile), calls `remove`
    /// with it (the sweep removes its inbox, `sweep.rs`) and frees it again: no device can
    /// be making an inbox in a slot while it is claimed.
    pub(crate) fn reclaim_dead(&self, mut remove: impl FnMut(usize)) {
        let me = std::process::id();
        for (index, slot) in self.file().slots.iter().enumerate() {
            let pid = slot.pid.load(Ordering::Acquire);
            if pid == 0 || pid == me || holder_alive(pid) {
                continue;
            }
            if take(slot, pid, me | RETIRING) {
                remove(index);
                self.release(index);
            }
        }
    }

    /// Writes `pid` into `slot` as its member, ready (tests: a member that died).
    #[cfg(test)]
    pub(crate) fn set_member(&self, slot: usize, pid: u32) {
        let slot = &self.file().slots[slot];
        slot.pid.store(pid, Ordering::Release);
        slot.state.store(READY, Ordering::Release);
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
        (pid != 0 && pid & RETIRING == 0 && slot.state.load(Ordering::Acquire) == READY)
            .then_some(pid)
    }

    /// Whether a live member other than this process holds a slot; and whether one of this
    /// process does.
    pub(crate) fn live_members(&self) -> (bool, bool) {
        let me = std::process::id();
        let (mut others, mut mine) = (false, false);
        for slot in &self.file().slots {
            match slot.pid.load(Ordering::Acquire) {
                0 => {}
                // A sweep's claim is no member.
                pid if pid & RETIRING != 0 => {}
                pid if pid == me => mine = true,
                pid => others |= pid_alive(pid),
            }
        }
        (others, mine)
    }

    /// How many slots live processes other than this one hold.
    pub(crate) fn other_members(&self) -> u32 {
        let me = std::process::id();
        let pids = self.file().slots.iter();
        pids.map(|slot| slot.pid.load(Ordering::Acquire))
            .filter(|&pid| pid != 0 && pid & RETIRING == 0 && pid != me && pid_alive(pid))
            .count() as u32
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

    /// The slot of the member a packet received on the address's socket is for: its
    /// destination QPN's; for a management datagram (QP1), the member whose connection
    /// manager listens on the service a REQ or SIDR_REQ names, or handed out the
    /// communication ID an answer names (its high byte, `softverbs_cm::CmConfig::share`).
    /// `None` for multicast and for a management datagram no member is named by (the
    /// holder's own connection manager answers it, or drops it).
    pub(crate) fn packet_slot(&self, ib_packet: &[u8]) -> Option<usize> {
        let qpn = destination_qpn(ib_packet)?;
        if qpn != GSI_QPN {
            return slot_of(qpn);
        }
        let mad = ib_packet
            .get(GSI_MAD_AT..)?
            .get(..softverbs_cm::mad::MAD_LEN)?;
        match softverbs_cm::mad::addressee(mad)? {
            Addressee::Service(id) => self.service_slot(id),
            Addressee::Connection(0) => None,
            Addressee::Connection(id) => Some(usize::from(comm_id_share(id))),
        }
    }

    /// Records that the connection manager of this process's member in `slot` listens on
    /// `service_id`. `EADDRINUSE` if a live member listens on it already (this process's
    /// included: a device has one connection manager), `ENOMEM` when the table is full,
    /// `EBUSY` when the table's lock stays held by a live process.
    pub(crate) fn claim_service(&self, slot: usize, service_id: u64) -> io::Result<()> {
        let me = std::process::id();
        self.with_services_lock(|file| {
            let mut free = None;
            for (index, entry) in file.services.iter().enumerate() {
                match self.service_listener(entry) {
                    Some((_, id)) if id == service_id => {
                        return Err(io::Error::from_raw_os_error(libc::EADDRINUSE))
                    }
                    Some(_) => {}
                    None => {
                        free.get_or_insert(index);
                    }
                }
            }
            let entry = &file.services[free.ok_or(io::Error::from_raw_os_error(libc::ENOMEM))?];
            entry.pid.store(0, Ordering::Release);
            entry.slot.store(slot as u32, Ordering::Relaxed);
            entry.id.store(service_id, Ordering::Relaxed);
            // Release: a reader that sees the process ID sees the slot and the ID.
            entry.pid.store(me, Ordering::Release);
            Ok(())
        })
    }

    /// Forgets that this process listens on `service_id` (every service when `None`: the
    /// device closes).
    pub(crate) fn release_services(&self, service_id: Option<u64>) {
        let me = std::process::id();
        let release = |file: &MembersFile| {
            for entry in &file.services {
                if entry.pid.load(Ordering::Acquire) == me
                    && service_id.is_none_or(|id| entry.id.load(Ordering::Relaxed) == id)
                {
                    entry.pid.store(0, Ordering::Release);
                }
            }
            Ok(())
        };
        // Without the lock if it cannot be had: a free store races only with a claim
        // that then finds the entry taken (and another one).
        if self.with_services_lock(release).is_err() {
            let _ = release(self.file());
        }
    }

    /// The slot of the member listening on `service_id`, if one does and is still there.
    /// Lock-free: what the holder asks of each REQ and SIDR_REQ.
    pub(crate) fn service_slot(&self, service_id: u64) -> Option<usize> {
        self.file()
            .services
            .iter()
            .filter_map(|entry| self.service_listener(entry))
            .find(|&(_, id)| id == service_id)
            .map(|(slot, _)| slot)
    }

    /// The (slot, service ID) of an entry whose listener is still the member of its slot.
    fn service_listener(&self, entry: &Service) -> Option<(usize, u64)> {
        // Acquire: pairs with the claimant's Release store of its process ID.
        let pid = entry.pid.load(Ordering::Acquire);
        if pid == 0 {
            return None;
        }
        let slot = entry.slot.load(Ordering::Relaxed) as usize;
        let id = entry.id.load(Ordering::Relaxed);
        let member = self.file().slots.get(slot)?.pid.load(Ordering::Acquire);
        (member == pid && pid_alive(pid)).then_some((slot, id))
    }

    /// Runs `change` on the file while holding the services lock (a process ID in the
    /// file, taken over from a process that is gone).
    fn with_services_lock<T>(
        &self,
        change: impl FnOnce(&MembersFile) -> io::Result<T>,
    ) -> io::Result<T> {
        let me = std::process::id();
        let lock = &self.file().services_lock;
        let start = std::time::Instant::now();
        loop {
            let held = lock.load(Ordering::Acquire);
            if (held == 0 || (held != me && !pid_alive(held)))
                && lock
                    .compare_exchange(held, me, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                break;
            }
            if start.elapsed() > SERVICES_LOCK_WAIT {
                return Err(io::Error::from_raw_os_error(libc::EBUSY));
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        let result = change(self.file());
        // Release: the next holder of the lock sees this one's changes.
        lock.store(0, Ordering::Release);
        result
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

    /// A path in the temporary directory for a test's members file, named by `what` and
    /// this process, with nothing left there by an earlier run.
    fn fresh_path(what: &str) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("softverbs-{what}-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        path
    }

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
        let path = fresh_path("members");
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

    /// The services table: one listener per service ID among the members (the kernel's
    /// port space is host-wide: a second `rdma_listen` on a port is EADDRINUSE), found by
    /// the holder while its member is there, freed by release and by the member's going.
    #[test]
    fn a_service_has_one_listener_among_the_members() {
        let path = fresh_path("services");
        let members = Members::open(&path).unwrap();
        let slot = members.claim().unwrap();
        assert_eq!(members.service_slot(0x0106_1D2F), None);
        members.claim_service(slot, 0x0106_1D2F).unwrap();
        members.claim_service(slot, 0x0106_1D30).unwrap();
        assert_eq!(members.service_slot(0x0106_1D2F), Some(slot));
        let again = members.claim_service(slot, 0x0106_1D2F).unwrap_err();
        assert_eq!(again.raw_os_error(), Some(libc::EADDRINUSE));
        members.release_services(Some(0x0106_1D2F));
        assert_eq!(members.service_slot(0x0106_1D2F), None);
        assert_eq!(members.service_slot(0x0106_1D30), Some(slot));
        // A member that left (its slot freed, or taken by another process) listens no more.
        members.release(slot);
        assert_eq!(members.service_slot(0x0106_1D30), None);
        members.claim_service(slot, 0x0106_1D30).unwrap();
        members.release_services(None);
        assert_eq!(members.service_slot(0x0106_1D30), None);
        std::fs::remove_file(&path).unwrap();
    }

    /// A members file of a version without the services table is grown to hold it; its
    /// slots stay as they were.
    #[test]
    fn a_members_file_without_the_services_table_is_grown() {
        let path = fresh_path("old");
        let mut old = vec![0u8; LEN_WITHOUT_SERVICES];
        old[64..68].copy_from_slice(&4_000_000u32.to_ne_bytes());
        std::fs::write(&path, &old).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let members = Members::open(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), LEN as u64);
        assert_eq!(
            members.file().slots[0].pid.load(Ordering::Relaxed),
            4_000_000
        );
        assert_eq!(members.service_slot(1), None);
        std::fs::remove_file(&path).unwrap();
    }

    /// A member that died without freeing its slot blocks nobody: the next claimant takes
    /// its slot (the lowest), and it no longer counts as a live member.
    #[test]
    fn the_slot_of_a_dead_process_is_claimed_again() {
        let path = fresh_path("dead");
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

    /// A members file goes only when no live process is at the address: a live member's
    /// slot, or a live holder of the socket, keeps it (and every slot the sweep took on the
    /// way is free again); a file of dead members only is removed once their slots are
    /// reclaimed.
    #[test]
    fn a_members_file_is_retired_only_when_no_live_process_is_at_the_address() {
        let path = fresh_path("retire");
        let members = Members::open(&path).unwrap();
        let sweeper = Members::open(&path).unwrap();
        // A live member (this process) in slot 3.
        members.set_member(3, std::process::id());
        assert!(!sweeper.retire(&path));
        assert!(path.exists());
        assert_eq!(
            members.claim(),
            Some(0),
            "the slots the sweep took are free"
        );
        members.release(0);
        // Only the socket's holder is alive (it has not claimed its slot yet).
        members.release(3);
        members.set_holder();
        assert!(!sweeper.retire(&path));
        assert!(path.exists());
        members.clear_holder();
        // Dead members only.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        members.set_member(5, dead);
        members.file().holder.store(dead, Ordering::Relaxed);
        // As the sweep does: the dead member's slot (and inbox) first.
        sweeper.reclaim_dead(|_| {});
        assert!(sweeper.retire(&path));
        assert!(!path.exists());
        assert!(!members.is_at(&path));
    }

    /// While a sweep holds the slots of a file it is about to remove, a device looking for
    /// the address's members (to join a socket another process holds) sees none: a claim
    /// of the sweep is no member, neither ready nor live, and not free either.
    #[test]
    fn a_sweeps_claims_are_no_members() {
        let path = fresh_path("sweeping");
        let members = Members::open(&path).unwrap();
        // A sweep of this process, and one of process 1 (alive), hold slots 0 and 1.
        members.set_member(0, std::process::id() | RETIRING);
        members.set_member(1, 1 | RETIRING);
        assert_eq!(members.live_members(), (false, false));
        assert_eq!(members.other_members(), 0);
        assert_eq!(members.ready_member(0), None);
        assert_eq!(members.ready_member(1), None);
        assert_eq!(members.claim(), Some(2), "held slots are not claimed");
        std::fs::remove_file(&path).unwrap();
    }

    /// A sweep holds every slot for the microseconds it takes to see whether the file is
    /// in use: a device joining then waits for it to let go, and takes a slot, instead of
    /// failing as if live members held them all.
    #[test]
    fn a_device_joining_while_a_sweep_holds_the_slots_waits_for_it() {
        let path = fresh_path("wait");
        let members = Members::open(&path).unwrap();
        // A live sweep (process 1's): every slot held.
        for slot in 0..SLOTS {
            members.set_member(slot, 1 | RETIRING);
        }
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(JOIN_PATIENCE / 10);
                for slot in 0..SLOTS {
                    members.release(slot);
                }
            });
            let (joined, slot) = Members::join(None, &path).unwrap();
            assert!(joined.is_at(&path));
            // Any slot the releasing thread has let go of: the claim may pass slot 0
            // before it is released and take a later one.
            assert_eq!(
                joined.file().slots[slot].pid.load(Ordering::Relaxed),
                std::process::id()
            );
        });
        std::fs::remove_file(&path).unwrap();
    }

    /// Live members holding every slot is a full address: joining fails with `AddrInUse`
    /// (it does not take them for a sweep's claims and wait for ever).
    #[test]
    fn a_device_joining_an_address_whose_slots_live_members_hold_gets_addr_in_use() {
        let path = fresh_path("full");
        let members = Members::open(&path).unwrap();
        for slot in 0..SLOTS {
            members.set_member(slot, 1);
        }
        let error = Members::join(None, &path).err().expect("no slot is free");
        assert_eq!(error.kind(), io::ErrorKind::AddrInUse);
        std::fs::remove_file(&path).unwrap();
    }

    /// A member that died after the sweep reclaimed the dead ones keeps the file for the
    /// next sweep, which removes its inbox first: the file is not removed with its inbox
    /// left behind.
    #[test]
    fn a_dead_members_slot_stops_a_retirement() {
        let path = fresh_path("dead-stop");
        let members = Members::open(&path).unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        members.set_member(5, dead);
        assert!(!members.retire(&path));
        assert!(path.exists());
        assert_eq!(members.file().slots[5].pid.load(Ordering::Relaxed), dead);
        assert_eq!(
            members.claim(),
            Some(0),
            "the slots the sweep took are free"
        );
        members.release(0);
        members.reclaim_dead(|_| {});
        assert!(members.retire(&path));
    }

    /// A device that opened a members file a sweep then removed joins the file at the path
    /// instead (made anew), not the removed one, where it would be alone: whether it had yet
    /// to claim (every slot held by the sweep) or claimed a slot after the sweeper was gone.
    #[test]
    fn a_device_joins_the_file_at_the_path_not_one_a_sweep_removed() {
        let path = fresh_path("rejoin");
        // Every slot held by the sweep (this process: alive).
        let opened = Members::open(&path).unwrap();
        assert!(Members::open(&path).unwrap().retire(&path));
        let (members, slot) = Members::join(Some(opened), &path).unwrap();
        assert!(members.is_at(&path), "the file at the path");
        assert_eq!(slot, 0, "alone in a new file");
        std::fs::remove_file(&path).unwrap();
        // The slots of a removed file free (its sweeper gone): one is claimed, and let go.
        let opened = Members::open(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let new = Members::open(&path).unwrap();
        new.set_member(0, std::process::id());
        let (members, slot) = Members::join(Some(opened), &path).unwrap();
        assert!(members.is_at(&path));
        assert_eq!(slot, 1, "beside the member of the file at the path");
        std::fs::remove_file(&path).unwrap();
    }
}
