//! The devices of this process, by address: a packet for one of these addresses is handed
//! to that device directly instead of going through a transport. Holds weak references
//! only, so a device in the registry is still dropped when its owner drops it (and its
//! `Drop` removes its own entry); also hands out the 127.1.0.0/16 addresses of in-process
//! devices, in turn.

use super::DeviceInner;
use rustc_hash::FxHashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// The devices of this process by address, looked up once per packet sent (by a device
/// with a transport, only while the process has others: [`registered`]; so not SipHash:
/// the keys are this process's own addresses).
pub(super) type Registry = FxHashMap<IpAddr, Weak<DeviceInner>>;

/// The devices of this process by address (weak: the registry keeps none alive).
pub(super) fn registry() -> &'static Mutex<Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(Registry::default()))
}

/// How many devices the registry holds ([`note_registered`] after every change).
static REGISTERED: AtomicUsize = AtomicUsize::new(0);

/// Notes how many devices `devices` (the registry, under its lock) holds now.
pub(super) fn note_registered(devices: &Registry) {
    REGISTERED.store(devices.len(), Ordering::Release);
}

/// How many devices the registry holds, without its lock: a device with a transport
/// alone in its process (the common case) need not look there for the packets it sends.
pub(super) fn registered() -> usize {
    REGISTERED.load(Ordering::Acquire)
}

/// The next address in 127.1.0.0/16 for an in-process device (no socket uses it).
pub(super) fn next_in_process_address() -> IpAddr {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    IpAddr::V4(Ipv4Addr::new(127, 1, (n >> 8) as u8, n as u8))
}

/// The devices of this process in multicast group `group` (an in-process device's
/// multicast goes to each of them; `ibv_attach_mcast(3)`).
pub(super) fn group_members(devices: &Registry, group: IpAddr) -> Vec<Arc<DeviceInner>> {
    devices
        .values()
        .filter_map(Weak::upgrade)
        .filter(|device| device.in_group(group))
        .collect()
}
