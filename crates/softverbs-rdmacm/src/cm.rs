//! The CM thread and connections (filled in when softverbs-cm is merged).

use crate::boundary::Errno;
use crate::state::State;

/// One device's connection manager.
pub struct DeviceCm;

/// A connection of a device's manager.
#[derive(Clone, Copy, Debug)]
pub struct ConnRef;

/// Registers a listening id.
pub fn listen(_st: &mut State, _key: usize) -> Result<(), Errno> {
    Err(libc::ENOSYS)
}

/// Forgets an id's connection.
pub fn release(_st: &mut State, _key: usize) {}
