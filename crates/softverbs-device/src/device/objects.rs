//! The device's record of its protection domains and of what holds each: memory regions,
//! memory windows, queue pairs, shared receive queues, address handles and parent domains. It is what makes
//! `ibv_dealloc_pd(3)` ("fails if any other resource is still associated with the PD",
//! `EBUSY`) one rule for both front doors, and what refuses an object in a PD that was
//! never allocated or is gone (`EINVAL`, as the kernel refuses an unknown PD handle).
//!
//! Everything here is read and written under the device's state lock.

use std::collections::HashMap;

use softverbs_proto::{AddressVector, Object, VerbsError};

use super::DeviceError;

/// The kinds of object a protection domain holds, in the order of their counters
/// (`Object::Pd`: parent domains over it, `ibv_alloc_parent_domain(3)`).
const PD_USERS: [Object; 6] = [
    Object::Mr,
    Object::Mw,
    Object::Qp,
    Object::Srq,
    Object::Ah,
    Object::Pd,
];

/// The counter of `user` among a PD's [`PD_USERS`].
fn slot(user: Object) -> usize {
    PD_USERS.iter().position(|u| *u == user).unwrap_or(0)
}

/// An address handle: its protection domain and the checked address vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressHandle {
    /// The protection domain it was created in.
    pub pd: u32,
    /// Where it points.
    pub av: AddressVector,
}

/// Protection domains, their users, and the objects whose PD the engine does not keep.
#[derive(Debug)]
pub(super) struct Objects {
    next_pd: u32,
    /// Live PDs and how many objects of each kind hold each.
    pds: HashMap<u32, [u32; 6]>,
    /// The PD of each SRQ (the engine's SRQs have none).
    srq_pds: HashMap<u32, u32>,
    next_ah: u32,
    ahs: HashMap<u32, AddressHandle>,
}

impl Objects {
    pub(super) fn new() -> Objects {
        Objects {
            next_pd: 1,
            pds: HashMap::new(),
            srq_pds: HashMap::new(),
            next_ah: 1,
            ahs: HashMap::new(),
        }
    }

    pub(super) fn alloc_pd(&mut self) -> u32 {
        let pd = self.next_pd;
        self.next_pd = self.next_pd.wrapping_add(1).max(1);
        self.pds.insert(pd, [0; 6]);
        pd
    }

    /// `ibv_dealloc_pd(3)`: refused while an object holds the PD.
    pub(super) fn dealloc_pd(&mut self, pd: u32) -> Result<(), DeviceError> {
        let users = self.pds.get(&pd).ok_or(no_pd(pd))?;
        if let Some((by, &count)) = PD_USERS.iter().zip(users).find(|(_, n)| **n > 0) {
            return Err(VerbsError::InUse {
                object: Object::Pd,
                by: *by,
                count,
            }
            .into());
        }
        self.pds.remove(&pd);
        Ok(())
    }

    /// Refuses a PD that is not allocated (`EINVAL`).
    pub(super) fn check_pd(&self, pd: u32) -> Result<(), DeviceError> {
        if self.pds.contains_key(&pd) {
            Ok(())
        } else {
            Err(no_pd(pd).into())
        }
    }

    /// Counts one more `user` of `pd` (checked with [`Objects::check_pd`] before the object
    /// was made).
    pub(super) fn hold(&mut self, pd: u32, user: Object) {
        if let Some(users) = self.pds.get_mut(&pd) {
            users[slot(user)] += 1;
        }
    }

    /// Counts one `user` of `pd` fewer.
    pub(super) fn release(&mut self, pd: u32, user: Object) {
        if let Some(users) = self.pds.get_mut(&pd) {
            users[slot(user)] = users[slot(user)].saturating_sub(1);
        }
    }

    pub(super) fn add_srq(&mut self, srq: u32, pd: u32) {
        self.srq_pds.insert(srq, pd);
        self.hold(pd, Object::Srq);
    }

    pub(super) fn remove_srq(&mut self, srq: u32) {
        if let Some(pd) = self.srq_pds.remove(&srq) {
            self.release(pd, Object::Srq);
        }
    }

    pub(super) fn add_ah(&mut self, ah: AddressHandle) -> u32 {
        let id = self.next_ah;
        self.next_ah = self.next_ah.wrapping_add(1).max(1);
        self.ahs.insert(id, ah);
        self.hold(ah.pd, Object::Ah);
        id
    }

    pub(super) fn remove_ah(&mut self, id: u32) -> Result<AddressHandle, DeviceError> {
        let ah = self.ahs.remove(&id).ok_or(VerbsError::NoSuchObject {
            object: Object::Ah,
            id,
        })?;
        self.release(ah.pd, Object::Ah);
        Ok(ah)
    }
}

/// The error for a protection domain that was never allocated or is deallocated (`EINVAL`,
/// as the kernel answers an unknown PD handle).
fn no_pd(pd: u32) -> VerbsError {
    VerbsError::NoSuchObject {
        object: Object::Pd,
        id: pd,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pd_under_a_parent_domain_is_busy_until_the_parent_domain_goes() {
        // ibv_dealloc_pd(3): "fails if any other resource is still associated with the
        // PD"; a parent domain over it (ibv_alloc_parent_domain(3)) is one.
        let mut objects = Objects::new();
        let pd = objects.alloc_pd();
        objects.check_pd(pd).unwrap();
        objects.hold(pd, Object::Pd);
        assert!(matches!(
            objects.dealloc_pd(pd),
            Err(DeviceError::Verbs(VerbsError::InUse {
                object: Object::Pd,
                by: Object::Pd,
                count: 1
            }))
        ));
        objects.release(pd, Object::Pd);
        objects.dealloc_pd(pd).unwrap();
    }
}
