//! A device's inbox: a file in `/dev/shm` that devices of other processes of the same user
//! map to hand it packets, one [`Ring`] per sending device.
//!
//! Layout (all offsets in bytes): a header page, then [`RINGS`] rings of a header page and
//! [`RING_CAP`] bytes of data each. The file is sparse: only the header page and the rings
//! senders claimed take memory, each as much as its sender reserved ([`ring_cap`]: all of
//! it where `/dev/shm` has room, down to [`MIN_RING_CAP`] where it has little). Every page
//! is allocated in the file ([`reserve`]) before anyone writes to it through a mapping: a
//! write to a page a full tmpfs cannot give is a `SIGBUS` in the writer, while a
//! reservation that fails is an error (`ENOSPC`) — the device goes without an inbox, the
//! sender to this inbox uses UDP, or (for the part of its ring a sender reserves after
//! claiming it, [`PeerInbox::usable`]) the sender keeps to the pages it has.
//!
//! | offset | field |
//! |---|---|
//! | 0 | magic `"softvrb1"` (`u64`) |
//! | 8 | owner's process ID (`u32`) |
//! | 12 | closed (`u32`): the owner let go of the inbox |
//! | 64 | waiters (`u32`): threads of the owner about to sleep until a packet comes |
//! | 128 | rung (`u32`): a doorbell was sent and not drained |
//! | 192 | active (`u64`): bit `i` set while ring `i` is claimed or closing |
//!
//! Who writes what: the owner creates the file (mode 0600, so only its user can open it)
//! and writes the magic and its process ID before anyone can see the file (it is created
//! under a temporary name and renamed into place), `closed` and `waiters`, `head` of every
//! ring, and frees closing rings; a sender claims a free ring (compare-and-swap of its
//! state), writes its address and the capacity it reserved, sets the ring's `active` bit,
//! produces into it, and marks it closing when it lets go; a sender also sets `rung`, the
//! owner clears it.

use super::ring::{Ring, RingHeader, CLAIMED, CLOSING, FREE};
use rustix::fd::OwnedFd;
use rustix::fs::{Mode, OFlags};
use rustix::mm::{MapFlags, ProtFlags};
use std::ffi::c_void;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Rings in an inbox: devices of other processes that can send to one device through
/// shared memory at a time (more send over UDP).
pub(crate) const RINGS: usize = 32;

/// Bytes of data per ring: the most a sender reserves.
pub(crate) const RING_CAP: usize = 4 << 20;

/// The least a sender reserves for its ring's data: 8 packets of 32 KiB.
pub(crate) const MIN_RING_CAP: usize = 256 << 10;

/// While `/dev/shm` has room for [`FULL_RINGS`] more rings of [`RING_CAP`] (beyond
/// [`HEADROOM_SHARE`]), a sender takes one; below, at most `1 / RING_SHARE` of the room
/// left, in halvings of [`RING_CAP`]: rings get smaller as `/dev/shm` fills, so that many
/// pairs of processes still find room (a default container's 64 MiB holds some sixty
/// rings, where 4 MiB rings would be eleven: an MPI job of eight ranks talking all to all
/// needs 56), while the first pairs keep the bandwidth of the largest (a 64 KiB RDMA WRITE
/// stream through a 2 MiB ring ran at 0.79 times that of a 4 MiB one).
const RING_SHARE: u64 = 16;

/// See [`RING_SHARE`].
const FULL_RINGS: u64 = 6;

const PAGE: usize = 4096;
const MAGIC: u64 = u64::from_le_bytes(*b"softvrb1");

/// Bytes of an inbox file.
pub(crate) const INBOX_LEN: usize = PAGE + RINGS * RING_LEN;

/// The data bytes of a ring its sender allocates and maps as it claims it
/// ([`PeerInbox::open`]); the rest are allocated by a thread of their own meanwhile, and
/// fault in as they are first written. Room for a record of the largest packet (a direct
/// segment, 32 KiB and its headers) with a wrap marker after it.
const POPULATED: usize = 64 << 10;

/// The part of `/dev/shm` a sender leaves free for other programs when it takes a ring:
/// `1 / HEADROOM_SHARE` of the filesystem's size. Other programs write their own sparse
/// files there (Open MPI's and UCX's shared-memory transports, `shm_open(3)` users), and a
/// full tmpfs is a `SIGBUS` in whichever of them writes a new page next; so rings stop
/// where a quarter is left, and the senders that find no room use UDP.
const HEADROOM_SHARE: u64 = 4;

/// The inbox header (the first page).
#[repr(C)]
pub(crate) struct InboxHeader {
    magic: AtomicU64,
    pub(crate) owner: AtomicU32,
    pub(crate) closed: AtomicU32,
    /// 1 if the owning device takes packets of direct segments (it neither captures nor
    /// injects faults: its packets need not be the wire's); 0 (an inbox of a version
    /// without the field too) if not.
    pub(crate) direct: AtomicU32,
    _pad0: [u8; 44],
    pub(crate) waiters: AtomicU32,
    _pad1: [u8; 60],
    pub(crate) rung: AtomicU32,
    _pad2: [u8; 60],
    pub(crate) active: AtomicU64,
}

impl InboxHeader {
    /// The bits of `active` that name rings (a bit beyond [`RINGS`], which no correct sender
    /// sets, names none).
    pub(crate) fn active_rings(&self) -> u64 {
        self.active.load(Ordering::Acquire) & ((1 << RINGS) - 1)
    }
}

/// A shared mapping of an inbox file, unmapped when dropped.
pub(crate) struct Mapping {
    base: *mut u8,
    /// The file's inode, to tell a re-created inbox from the one mapped.
    pub(crate) inode: u64,
}

// SAFETY: the mapping is plain shared memory accessed through atomics and ring copies
// ordered by them (`ring.rs`); it can be used from any thread.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base` is the start of a mapping of `INBOX_LEN` bytes made by `map`, and
        // no `Ring` or header reference outlives the `Mapping` (they borrow it or are owned
        // beside it by the same struct, dropped first).
        if let Err(error) = unsafe { rustix::mm::munmap(self.base as *mut c_void, INBOX_LEN) } {
            tracing::debug!(%error, "munmap of an inbox failed");
        }
    }
}

impl Mapping {
    fn map(fd: &OwnedFd) -> io::Result<Mapping> {
        let stat = rustix::fs::fstat(fd)?;
        // SAFETY: a fresh shared mapping of the whole file (checked to be INBOX_LEN bytes by
        // the callers); nothing else in this process refers to its addresses.
        let base = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                INBOX_LEN,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )?
        };
        Ok(Mapping {
            base: base as *mut u8,
            inode: stat.st_ino,
        })
    }

    pub(crate) fn header(&self) -> &InboxHeader {
        // SAFETY: the first page of the mapping is an `InboxHeader` (atomics only, valid for
        // any bytes), aligned to the page.
        unsafe { &*(self.base as *const InboxHeader) }
    }

    /// Ring `index` (< [`RINGS`]), with the capacity its producer reserved.
    pub(crate) fn ring(&self, index: usize) -> Ring {
        assert!(index < RINGS);
        let at = ring_at(index);
        let header = self.base.wrapping_add(at) as *const RingHeader;
        // SAFETY: the ring's header lies inside the mapping (`INBOX_LEN`), page-aligned,
        // atomics only (valid for any bytes).
        let cap = ring_cap_of(unsafe { &*header }.cap.load(Ordering::Relaxed));
        // SAFETY: the ring's header page and data area (at most `RING_CAP` bytes) lie
        // inside the mapping, page-aligned; the `Ring` is used only while `self` lives
        // (owners keep both).
        unsafe { Ring::new(header, self.base.add(at + PAGE), cap) }
    }
}

/// The identity of this user, PID namespace and network namespace, which every file name
/// carries: a device reaches through shared memory only devices it could reach over UDP on
/// this host, and whose process IDs mean in its PID namespace what they mean in theirs.
/// Processes of two PID namespaces can share `/dev/shm` and a network namespace (a
/// container run with `--ipc=host --network=host`, the containers of one Kubernetes pod):
/// a process ID in a file of the other namespace names another process, or none, here, so
/// a device would take a live member's slot for a dead one's, and its sweep remove live
/// devices' inboxes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Scope {
    pub(crate) euid: u32,
    pub(crate) pidns: u64,
    pub(crate) netns: u64,
}

impl Scope {
    /// This process's scope; `None` where the namespaces cannot be told (no `/proc`), so
    /// no inbox is used.
    pub(crate) fn current() -> Option<Scope> {
        let pidns = rustix::fs::stat("/proc/self/ns/pid").ok()?.st_ino;
        let netns = rustix::fs::stat("/proc/self/ns/net").ok()?.st_ino;
        Some(Scope {
            euid: rustix::process::geteuid().as_raw(),
            pidns,
            netns,
        })
    }

    /// The inbox file of the member in `slot` of the address `endpoint`.
    pub(crate) fn path(&self, endpoint: &crate::transport::Endpoint, slot: usize) -> PathBuf {
        PathBuf::from(format!("{SHM_DIR}/{}-s{slot}", self.name(endpoint)))
    }

    /// The members file of the address `endpoint` (`members.rs`).
    pub(crate) fn members_path(&self, endpoint: &crate::transport::Endpoint) -> PathBuf {
        PathBuf::from(format!("{SHM_DIR}/{}.members", self.name(endpoint)))
    }

    /// The abstract Unix socket name of the doorbell of the member in `slot`.
    pub(crate) fn doorbell_name(
        &self,
        endpoint: &crate::transport::Endpoint,
        slot: usize,
    ) -> String {
        format!("{}-s{slot}", self.name(endpoint))
    }

    /// `softverbs-UID-PIDNS-NETNS-ADDRESS-PORT`.
    fn name(&self, endpoint: &crate::transport::Endpoint) -> String {
        format!("{}{}-{}", self.prefix(), endpoint.addr(), endpoint.port())
    }

    /// `softverbs-UID-PIDNS-NETNS-`: what the name of every file of this scope starts with.
    pub(crate) fn prefix(&self) -> String {
        format!("{}{}-", self.user_prefix(), self.netns)
    }

    /// `softverbs-UID-PIDNS-`: what the name of every file of this user and PID namespace
    /// starts with, in any network namespace (the sweep's: process IDs are this PID
    /// namespace's).
    pub(crate) fn user_prefix(&self) -> String {
        format!("{}{}-", self.any_pid_namespace_prefix(), self.pidns)
    }

    /// `softverbs-UID-`: what the name of every file of this user starts with, in any PID
    /// namespace.
    pub(crate) fn any_pid_namespace_prefix(&self) -> String {
        format!("softverbs-{}-", self.euid)
    }
}

/// Where inboxes live.
pub(crate) const SHM_DIR: &str = "/dev/shm";

/// The owner's inbox: the mapping, and the path to remove when it closes.
pub(crate) struct OwnInbox {
    pub(crate) mapping: Mapping,
    path: PathBuf,
    /// The file, with a shared `flock(2)` on it from before it took its name until the
    /// owner closes it or dies (the kernel lets go of it then, in whatever PID namespace):
    /// the sign of life a sweep of another PID namespace goes by ([`abandoned`]).
    file: OwnedFd,
}

/// The inbox (or inbox being made, or members file) at `path`, locked exclusively, if no
/// process holds it: its owner's (its members') shared `flock(2)` ([`OwnInbox`],
/// `Members::join`), which the kernel drops when the holder closes it or dies, keeps an
/// exclusive one from being taken. How a device tells whether the devices of another PID
/// namespace, whose process IDs mean nothing here, are gone. `None` while one lives, and
/// where the file cannot be opened or locked (nothing is taken for gone that is not known
/// to be).
pub(crate) fn abandoned(path: &Path) -> Option<(OwnedFd, u64)> {
    let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).ok()?;
    rustix::fs::flock(&fd, rustix::fs::FlockOperation::NonBlockingLockExclusive).ok()?;
    let inode = rustix::fs::fstat(&fd).ok()?.st_ino;
    Some((fd, inode))
}

impl OwnInbox {
    /// Creates the inbox at `path`, replacing one a dead process left there (the device
    /// holds the slot the name carries, so no live device owns this inbox).
    pub(crate) fn create(path: &Path) -> io::Result<OwnInbox> {
        // The file is sparse: it takes its header page now (refused, `ENOSPC`, where
        // /dev/shm is full), and each ring's pages when a sender claims it
        // (`PeerInbox::open`, which leaves other programs their share).
        let temporary = PathBuf::from(format!("{}.new{}", path.display(), std::process::id()));
        let fd = rustix::fs::open(
            &temporary,
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
            Mode::RUSR | Mode::WUSR,
        )?;
        let made = (|| {
            // Alive from before the file has its name (`abandoned`).
            rustix::fs::flock(&fd, rustix::fs::FlockOperation::LockShared)?;
            rustix::fs::ftruncate(&fd, INBOX_LEN as u64)?;
            // The header page, which the owner writes now.
            reserve(&fd, 0, PAGE)?;
            let mapping = Mapping::map(&fd)?;
            let header = mapping.header();
            header.owner.store(std::process::id(), Ordering::Relaxed);
            header.magic.store(MAGIC, Ordering::Release);
            rustix::fs::rename(&temporary, path)?;
            Ok::<_, io::Error>(mapping)
        })();
        match made {
            Ok(mapping) => {
                at_exit::register(path, mapping.inode);
                Ok(OwnInbox {
                    mapping,
                    path: path.to_owned(),
                    file: fd,
                })
            }
            Err(error) => {
                let _ = rustix::fs::unlink(&temporary);
                Err(error)
            }
        }
    }

    /// Frees the rings whose producers let go and that are empty, and gives their data
    /// pages back to `/dev/shm` (the next sender to claim one reserves what it needs
    /// again): a device that served many senders in turn holds the rings of those it
    /// serves now, not of every one it ever had.
    pub(crate) fn free_closed(&self, active: u64) {
        let mut bits = active;
        while bits != 0 {
            let index = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let ring = self.mapping.ring(index);
            let header = ring.header();
            if header.state.load(Ordering::Acquire) == CLOSING && ring.is_empty() {
                // While the ring is still closing: nobody writes it, nor claims it.
                let punched = rustix::fs::fallocate(
                    &self.file,
                    rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
                    (ring_at(index) + PAGE) as u64,
                    RING_CAP as u64,
                );
                if let Err(error) = punched {
                    tracing::debug!(%error, ring = index, "a freed ring's pages stay allocated");
                }
                self.mapping
                    .header()
                    .active
                    .fetch_and(!(1 << index), Ordering::AcqRel);
                header.pid.store(0, Ordering::Relaxed);
                header.state.store(FREE, Ordering::Release);
            }
        }
    }
}

impl Drop for OwnInbox {
    fn drop(&mut self) {
        self.mapping.header().closed.store(1, Ordering::Release);
        at_exit::forget(&self.path);
        let _ = unlink_if(&self.path, self.mapping.inode);
    }
}

/// The data capacity of a ring a sender can take in `/dev/shm` now ([`ring_cap`]); `None`
/// if there is no room for one. A filesystem that cannot be asked has none.
fn ring_cap_now() -> Option<usize> {
    let room = rustix::fs::statvfs(SHM_DIR).ok()?;
    ring_cap(
        room.f_blocks.saturating_mul(room.f_frsize),
        room.f_bavail.saturating_mul(room.f_frsize),
    )
}

/// The data capacity of a ring a sender takes in a `/dev/shm` of `size` bytes with `free`
/// free, given the room rings have there (what is free beyond [`HEADROOM_SHARE`] of the
/// size): [`RING_CAP`] while the room holds [`FULL_RINGS`] such rings, else the largest
/// halving of it, down to [`MIN_RING_CAP`], of at most `1 / RING_SHARE` of the room; and
/// only if it fits in the room with its header page (`None` if not even the least does).
/// A tmpfs without a size limit (`size=0`) reports no blocks: room for the largest.
fn ring_cap(size: u64, free: u64) -> Option<usize> {
    if size == 0 {
        return Some(RING_CAP);
    }
    let room = free.saturating_sub(size / HEADROOM_SHARE);
    let mut cap = RING_CAP;
    if room < FULL_RINGS * RING_CAP as u64 {
        while cap > MIN_RING_CAP && cap as u64 > room / RING_SHARE {
            cap /= 2;
        }
    }
    (room >= (PAGE + cap) as u64).then_some(cap)
}

/// The capacity a ring's header says (`RingHeader::cap`): 0 for [`RING_CAP`]; a value no
/// sender writes (not a power of two in [`MIN_RING_CAP`] ..= [`RING_CAP`]) for the least,
/// so that a producer that wrote one never makes the consumer look past what the least
/// reservation holds (its records then read as inconsistent, and are dropped).
fn ring_cap_of(raw: u32) -> usize {
    let cap = raw as usize;
    match cap {
        0 => RING_CAP,
        _ if cap.is_power_of_two() && (MIN_RING_CAP..=RING_CAP).contains(&cap) => cap,
        _ => MIN_RING_CAP,
    }
}

/// Where ring `index` (its header page, then its data) starts in an inbox file.
fn ring_at(index: usize) -> usize {
    PAGE + index * RING_LEN
}

/// Bytes of a ring in an inbox file: its header page and its data.
const RING_LEN: usize = PAGE + RING_CAP;

/// Allocates bytes `at .. at + len` of the shared-memory file `fd` (fallocate(2), mode 0:
/// the size does not change), so that writing them through a mapping needs no page the
/// filesystem might not have; `ENOSPC` when it has not. Pages already there stay as they
/// are.
pub(crate) fn reserve(fd: &OwnedFd, at: usize, len: usize) -> io::Result<()> {
    rustix::fs::fallocate(
        fd,
        rustix::fs::FallocateFlags::empty(),
        at as u64,
        len as u64,
    )?;
    Ok(())
}

/// Removes the file at `path` if it is still the one with inode `inode`; whether it did.
pub(crate) fn unlink_if(path: &Path, inode: u64) -> bool {
    rustix::fs::stat(path).is_ok_and(|stat| stat.st_ino == inode)
        && rustix::fs::unlink(path).is_ok()
}

/// The inboxes of this process's devices, removed when the process exits with devices it
/// never closed (a C program that returns from `main` with its context open, a Rust one
/// that calls `std::process::exit`): their names go, and their pages with the last
/// mapping. A process killed leaves them to the next process's sweep (`sweep.rs`).
mod at_exit {
    use std::path::{Path, PathBuf};
    use std::sync::{Mutex, Once};

    /// Each open inbox: its path, inode, and the process that made it (a child forked
    /// since exits with the parent's list, and must leave the parent's inboxes alone).
    static OPEN: Mutex<Vec<(PathBuf, u64, u32)>> = Mutex::new(Vec::new());

    pub(super) fn register(path: &Path, inode: u64) {
        static HOOK: Once = Once::new();
        // SAFETY: registers a function without preconditions; if the table is full the
        // inboxes are left to the sweep.
        HOOK.call_once(|| unsafe {
            libc::atexit(remove_all);
        });
        let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
        open.push((path.to_owned(), inode, std::process::id()));
    }

    pub(super) fn forget(path: &Path) {
        let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|(p, _, _)| p != path);
    }

    extern "C" fn remove_all() {
        // A thread of the exiting process may hold the list (making an inbox): then the
        // sweep gets these.
        let Ok(open) = OPEN.try_lock() else {
            return;
        };
        let me = std::process::id();
        for (path, inode, _) in open.iter().filter(|(_, _, pid)| *pid == me) {
            let _ = super::unlink_if(path, *inode);
        }
    }
}

/// A sender's hold on another device's inbox: the mapping and the ring it claimed.
pub(crate) struct PeerInbox {
    pub(crate) mapping: Mapping,
    pub(crate) index: usize,
    pub(crate) owner: u32,
    path: PathBuf,
    /// The bytes of the ring's data allocated so far: the sender writes within them
    /// ([`PeerInbox::usable`]).
    usable: Arc<AtomicUsize>,
    /// The thread allocating the rest of the ring, until it is done.
    reserving: Option<JoinHandle<()>>,
}

/// Why a peer's inbox cannot be used.
#[derive(Debug)]
pub(crate) enum Refused {
    /// No inbox at that address (no device of this host and user there, or one without
    /// shared memory).
    Absent,
    /// An inbox that is not usable now: full of senders, closed, of a dead process, of this
    /// process, or not of this user.
    Unusable(&'static str),
}

/// Whether the file at `path` is an inbox (its header's magic) whose owner is gone; read
/// without mapping it. For the sweep of inboxes of an older layout (`sweep.rs`).
pub(crate) fn owner_gone(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 12];
    let read = std::fs::File::open(path).and_then(|mut file| file.read_exact(&mut head));
    if read.is_err() || u64::from_le_bytes(head[..8].try_into().unwrap()) != MAGIC {
        return false;
    }
    // `InboxHeader::owner`, right after the magic, in every layout so far.
    !pid_alive(u32::from_ne_bytes(head[8..].try_into().unwrap()))
}

/// Whether process `pid` exists (`kill(pid, 0)` does not say ESRCH). A value no process
/// ID can be (0, or one above `i32::MAX`, which `kill` would take for a process group) is
/// no live process.
pub(crate) fn pid_alive(pid: u32) -> bool {
    let pid = i32::try_from(pid).ok().filter(|&pid| pid > 0);
    match pid.and_then(rustix::process::Pid::from_raw) {
        Some(pid) => !matches!(
            rustix::process::test_kill_process(pid),
            Err(rustix::io::Errno::SRCH)
        ),
        None => false,
    }
}

/// Opens the inbox at `path` of a live device of another process of this user: its
/// mapping, owner and file.
fn open_live(path: &Path) -> Result<(Mapping, u32, OwnedFd), Refused> {
    let fd = match rustix::fs::open(path, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Err(Refused::Absent),
        Err(_) => return Err(Refused::Unusable("cannot open")),
    };
    let stat = rustix::fs::fstat(&fd).map_err(|_| Refused::Unusable("cannot stat"))?;
    if stat.st_uid != rustix::process::geteuid().as_raw()
        || stat.st_mode & 0o077 != 0
        || stat.st_size != INBOX_LEN as i64
    {
        return Err(Refused::Unusable("not this user's inbox"));
    }
    let mapping = Mapping::map(&fd).map_err(|_| Refused::Unusable("cannot map"))?;
    let header = mapping.header();
    if header.magic.load(Ordering::Acquire) != MAGIC {
        return Err(Refused::Unusable("not an inbox"));
    }
    let owner = header.owner.load(Ordering::Relaxed);
    if owner == std::process::id() {
        return Err(Refused::Unusable("a device of this process"));
    }
    if header.closed.load(Ordering::Acquire) != 0 || !pid_alive(owner) {
        return Err(Refused::Unusable("closed"));
    }
    Ok((mapping, owner, fd))
}

/// Whether the inbox at `path` is a live device's of another process of this user that
/// takes packets of direct segments (its header's flag): decided by each end of a
/// connection from the other's inbox alone, claiming no ring, so both decide alike.
pub(crate) fn offers_direct_segments(path: &Path) -> bool {
    open_live(path).is_ok_and(|(mapping, _, _)| mapping.offers_direct_segments())
}

impl Mapping {
    /// Whether the inbox's owner takes packets of direct segments (its header's flag).
    fn offers_direct_segments(&self) -> bool {
        self.header().direct.load(Ordering::Acquire) == 1
    }
}

impl PeerInbox {
    /// Opens the inbox at `path` and claims a ring in it, writing `from` (the sender's
    /// GID) into it. A ring is claimed only once its first pages are allocated
    /// ([`reserve`]): where `/dev/shm` has no room for them, the inbox is refused ("no
    /// room"), and the sender uses UDP instead of dying of a `SIGBUS` in its first write;
    /// the rest of the ring is allocated on another thread, and the sender writes within
    /// what is allocated ([`PeerInbox::usable`]). Nor is one claimed where it would leave
    /// other programs less than their share of `/dev/shm` ([`HEADROOM_SHARE`]), as large as
    /// the room allows ([`ring_cap`]).
    pub(crate) fn open(path: &Path, from: [u8; 16]) -> Result<PeerInbox, Refused> {
        let (mapping, owner, fd) = open_live(path)?;
        let Some(cap) = ring_cap_now() else {
            return Err(Refused::Unusable(
                "no room in /dev/shm for a ring beside other programs' share",
            ));
        };
        let header = mapping.header();
        let me = std::process::id();
        let mut no_room = false;
        // The ring's first pages now, the rest on another thread (below).
        let first = cap.min(POPULATED);
        for index in 0..RINGS {
            // Its header page (the compare-and-swap below writes it) and its first data.
            if reserve(&fd, ring_at(index), PAGE + first).is_err() {
                no_room = true;
                continue;
            }
            let ring = mapping.ring(index);
            let ring_header = ring.header();
            if ring_header
                .state
                .compare_exchange(FREE, CLAIMED, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                ring_header.pid.store(me, Ordering::Relaxed);
                // What an earlier producer kept there is not this one's to trust.
                ring_header
                    .seen_head
                    .store(ring_header.head.load(Ordering::Acquire), Ordering::Relaxed);
                // Before the active bit's Release: a consumer that sees the ring sees it.
                ring_header.cap.store(cap as u32, Ordering::Relaxed);
                for (word, bytes) in ring_header.from.iter().zip(from.chunks_exact(4)) {
                    word.store(
                        u32::from_ne_bytes(bytes.try_into().unwrap_or_default()),
                        Ordering::Relaxed,
                    );
                }
                header.active.fetch_or(1 << index, Ordering::Release);
                // Map the ring's first pages now (allocated above), so that the first
                // packets take no page fault; the rest fault in as they are first written,
                // once each. Not more: a connected QP's route is prepared as it enters RTR,
                // i.e. inside `rdma_accept` and before the RTU, and on the benchmark VMs
                // mapping 4 MiB there took 1-25 ms, 256 KiB about half a millisecond
                // (`cmtime` connect through the drop-in: 2.5-3.6 ms with 256 KiB mapped and
                // allocated, 1.4-1.7 ms with 64 KiB; 1.0-1.9 ms over UDP alone). Best
                // effort: an older kernel has no MADV_POPULATE_WRITE, and the pages then
                // fault in as they are written.
                // SAFETY: a range of this process's mapping of the file (`INBOX_LEN` bytes,
                // page-aligned), whose pages `reserve` allocated; populating changes no byte.
                let _ = unsafe {
                    rustix::mm::madvise(
                        mapping.base.add(ring_at(index)).cast::<c_void>(),
                        PAGE + first,
                        rustix::mm::Advice::LinuxPopulateWrite,
                    )
                };
                let usable = Arc::new(AtomicUsize::new(first));
                let reserving = (first < cap).then(|| reserve_rest(fd, index, first, cap, &usable));
                return Ok(PeerInbox {
                    mapping,
                    index,
                    owner,
                    path: path.to_owned(),
                    usable,
                    reserving: reserving.flatten(),
                });
            }
        }
        // Every ring is held: hand back those of senders that died, for the next try. Only
        // the active ones are looked at: a ring never claimed may have no pages, and a read
        // of a page a full tmpfs cannot give is a `SIGBUS` too.
        let mut active = header.active_rings();
        while active != 0 {
            let index = active.trailing_zeros() as usize;
            active &= active - 1;
            let ring = mapping.ring(index);
            let ring_header = ring.header();
            let pid = ring_header.pid.load(Ordering::Relaxed);
            if ring_header.state.load(Ordering::Acquire) == CLAIMED && pid != 0 && !pid_alive(pid) {
                let _ = ring_header.state.compare_exchange(
                    CLAIMED,
                    CLOSING,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                );
            }
        }
        Err(Refused::Unusable(if no_room {
            "no room in /dev/shm for a ring"
        } else {
            "every ring is held"
        }))
    }

    /// The ring this sender produces into.
    pub(crate) fn ring(&self) -> Ring {
        self.mapping.ring(self.index)
    }

    /// The bytes at the start of the ring's data that are allocated, within which the
    /// sender writes (`Ring::producer_within`): the first [`POPULATED`] until the rest is
    /// allocated too, all of it after. (Where `/dev/shm` then has no room for the rest,
    /// the ring stays that small.)
    pub(crate) fn usable(&self) -> usize {
        self.usable.load(Ordering::Acquire)
    }

    /// [`offers_direct_segments`] for this inbox, without mapping it again.
    pub(crate) fn offers_direct_segments(&self) -> bool {
        self.mapping.offers_direct_segments()
    }

    /// Whether the inbox still reaches a live device: not closed, its owner alive, and the
    /// file at its path still the one mapped (a device that re-opened the address made a
    /// new one).
    pub(crate) fn still_there(&self) -> bool {
        self.mapping.header().closed.load(Ordering::Acquire) == 0
            && pid_alive(self.owner)
            && rustix::fs::stat(&self.path).is_ok_and(|stat| stat.st_ino == self.mapping.inode)
    }
}

/// Allocates the data of ring `index` after its `first` bytes, up to `cap`, on a thread of
/// its own, then makes it usable: `fallocate(2)` of 4 MiB took 0.5-0.7 ms on the benchmark
/// VMs, which a connection's set-up (the route is prepared as the QP enters RTR, inside
/// `rdma_accept` and before the RTU) need not wait for; the sender writes within the first
/// bytes meanwhile. Done here if no thread can be started; `None` then.
fn reserve_rest(
    fd: OwnedFd,
    index: usize,
    first: usize,
    cap: usize,
    usable: &Arc<AtomicUsize>,
) -> Option<JoinHandle<()>> {
    let at = ring_at(index) + PAGE + first;
    let rest = cap - first;
    let run = {
        let usable = Arc::clone(usable);
        move |fd: &OwnedFd| match reserve(fd, at, rest) {
            Ok(()) => usable.store(cap, Ordering::Release),
            Err(error) => tracing::debug!(
                %error,
                ring = index,
                usable = first,
                "no room in /dev/shm for the rest of a ring: it stays small"
            ),
        }
    };
    let fd = Arc::new(fd);
    let spawned = std::thread::Builder::new()
        .name("softverbs-shm-ring".into())
        .spawn({
            let (fd, run) = (Arc::clone(&fd), run.clone());
            move || run(&fd)
        });
    match spawned {
        Ok(handle) => Some(handle),
        Err(_) => {
            run(&fd);
            None
        }
    }
}

impl Drop for PeerInbox {
    fn drop(&mut self) {
        // Nothing is allocated in the ring once it is closing: the owner may give its pages
        // back as soon as it has taken what is left in it.
        if let Some(reserving) = self.reserving.take() {
            let _ = reserving.join();
        }
        // The owner frees the ring once it has taken what is left in it.
        self.ring().header().state.store(CLOSING, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A sender takes the largest ring where `/dev/shm` has room (a host's, or a tmpfs
    /// without a size limit), smaller ones as it fills, and none where even the least would
    /// eat into the quarter left to other programs.
    #[test]
    fn a_ring_is_as_large_as_the_room_allows_down_to_the_least() {
        assert_eq!(ring_cap(0, 0), Some(RING_CAP), "no size limit");
        assert_eq!(
            ring_cap(8 << 30, 8 << 30),
            Some(RING_CAP),
            "a host's /dev/shm"
        );
        // A default container's: 48 MiB for rings, room for six of the largest and more.
        assert_eq!(ring_cap(64 * MIB, 64 * MIB), Some(RING_CAP));
        let quarter = 16 * MIB;
        assert_eq!(ring_cap(64 * MIB, quarter + 24 * MIB), Some(RING_CAP));
        // Below six of the largest, a sixteenth of the room: 24 MiB less a byte, 1 MiB.
        assert_eq!(ring_cap(64 * MIB, quarter + 24 * MIB - 1), Some(1 << 20));
        let least = (PAGE + MIN_RING_CAP) as u64;
        assert_eq!(ring_cap(64 * MIB, quarter + least), Some(MIN_RING_CAP));
        assert_eq!(ring_cap(64 * MIB, quarter + least - 1), None);
        assert_eq!(ring_cap(64 * MIB, quarter), None);
        assert_eq!(ring_cap(64 * MIB, 0), None);
    }

    /// An MPI job of eight ranks on one host, all to all, needs 56 rings; in a default
    /// container's 64 MiB `/dev/shm` (eight inboxes made: a page each) every one of them
    /// finds room, none smaller than the least, and a quarter stays free. (Rings of 4 MiB
    /// were eleven.)
    #[test]
    fn a_default_containers_dev_shm_holds_the_rings_of_eight_ranks_talking_all_to_all() {
        let size = 64 * MIB;
        let mut free = size - 8 * PAGE as u64;
        let mut rings = 0;
        while let Some(cap) = ring_cap(size, free) {
            assert!((MIN_RING_CAP..=RING_CAP).contains(&cap));
            free -= (PAGE + cap) as u64;
            rings += 1;
        }
        assert!(rings >= 56, "{rings} rings");
        assert!(free >= size / HEADROOM_SHARE, "{free} bytes left");
    }

    /// The bits of `active` beyond the rings (no correct sender sets them; a buggy one
    /// may) name no ring: a receiver that looks at the active rings never asks for ring 40
    /// (which would panic, or read outside the inbox).
    #[test]
    fn active_bits_beyond_the_rings_name_none() {
        // SAFETY: all-zero bytes are a valid `InboxHeader` (atomics and byte arrays).
        let header: InboxHeader = unsafe { std::mem::zeroed() };
        header.active.store(u64::MAX, Ordering::Relaxed);
        assert_eq!(header.active_rings(), (1 << RINGS) - 1);
        header.active.store(1 << 40 | 1 << 3, Ordering::Relaxed);
        assert_eq!(header.active_rings(), 1 << 3);
    }

    /// A ring's capacity is read from its header, as its producer wrote it; a value no
    /// producer writes reads as the least (no look beyond what any reservation holds).
    #[test]
    fn a_rings_capacity_is_what_its_producer_reserved() {
        assert_eq!(ring_cap_of(0), RING_CAP);
        assert_eq!(ring_cap_of(MIN_RING_CAP as u32), MIN_RING_CAP);
        assert_eq!(ring_cap_of(1 << 20), 1 << 20);
        for bad in [
            1,
            3 << 18,
            (RING_CAP * 2) as u32,
            (MIN_RING_CAP / 2) as u32,
            u32::MAX,
        ] {
            assert_eq!(ring_cap_of(bad), MIN_RING_CAP, "{bad}");
        }
    }
}
