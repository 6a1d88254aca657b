//! UD multicast: which groups the engine's UD QPs are attached to (`ibv_attach_mcast(3)`),
//! and the rules of attaching and detaching, as the kernel applies them before a driver
//! sees the call (`ib_attach_mcast`, `ib_uverbs_attach_mcast`) and as rxe keeps its groups
//! (`rxe_mcast.c`).
//!
//! A multicast packet carries destination QPN 0xFFFFFF (IBTA 9.2: the multicast QP
//! number) and the group's GID as the destination of its GRH — on RoCEv2 the IP
//! destination of the datagram. The engine hands a copy to every QP attached to that group
//! (IBTA 10.5.2.2: "each QP attached to the multicast group" receives it), each checking its
//! own state and Q_Key as for a unicast datagram; a group with nobody attached drops the
//! packet ([`DropReason::UnknownGroup`](crate::DropReason::UnknownGroup)).
//!
//! On RoCE the multicast LID of the call is ignored (IBA Annex A16/A17: there are no LIDs;
//! the kernel's `is_valid_mcast_lid` accepts any on an Ethernet port), so an attachment is
//! named by its GID alone.

use std::collections::BTreeMap;

use crate::error::{Object, VerbsError};

/// The destination QPN of every multicast packet (IBTA 9.2).
pub const MULTICAST_QPN: u32 = 0xFF_FFFF;

/// Multicast groups a device may have (rxe's `RXE_MAX_MCAST_GRP`, `max_mcast_grp`).
pub const MAX_MCAST_GROUPS: u32 = 8192;

/// QPs one group may hold (rxe's `RXE_MAX_MCAST_QP_ATTACH`, `max_mcast_qp_attach`).
pub const MAX_MCAST_QP_ATTACH: u32 = 56;

/// Attachments over all groups (rxe's `RXE_MAX_TOT_MCAST_QP_ATTACH`,
/// `max_total_mcast_qp_attach`).
pub const MAX_TOTAL_MCAST_QP_ATTACH: u32 = 0x70000;

/// Whether a GID is a multicast address, the kernel's `rdma_is_multicast_addr`: an IPv6
/// multicast address (`ff00::/8`), or an IPv4-mapped one in 224.0.0.0/4.
pub fn is_multicast_gid(gid: &[u8; 16]) -> bool {
    let ipv4_mapped = gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff;
    gid[0] == 0xff || (ipv4_mapped && gid[12] & 0xf0 == 0xe0)
}

/// The groups and who is attached to each.
#[derive(Debug, Default)]
pub(crate) struct Groups {
    /// Group GID → the QPs attached, in the order they attached.
    members: BTreeMap<[u8; 16], Vec<u32>>,
    /// Attachments over all groups.
    total: u32,
}

impl Groups {
    /// Attaches `qpn` to group `gid`; true if the group is new (no QP of this engine was
    /// attached to it). Attaching a QP again is a success that changes nothing, as rxe's
    /// `rxe_attach_mcg`. Refused past the device's limits (`ENOMEM`, as rxe).
    pub(crate) fn attach(&mut self, gid: [u8; 16], qpn: u32) -> Result<bool, VerbsError> {
        let new = !self.members.contains_key(&gid);
        if new && self.members.len() as u32 >= MAX_MCAST_GROUPS {
            return Err(VerbsError::TooManyObjects {
                object: Object::McastGroup,
                max: MAX_MCAST_GROUPS,
            });
        }
        let attached = self.members.get(&gid).map_or(&[][..], Vec::as_slice);
        if attached.contains(&qpn) {
            return Ok(false);
        }
        if attached.len() as u32 >= MAX_MCAST_QP_ATTACH {
            return Err(VerbsError::TooManyObjects {
                object: Object::McastAttachment,
                max: MAX_MCAST_QP_ATTACH,
            });
        }
        if self.total >= MAX_TOTAL_MCAST_QP_ATTACH {
            return Err(VerbsError::TooManyObjects {
                object: Object::McastAttachment,
                max: MAX_TOTAL_MCAST_QP_ATTACH,
            });
        }
        self.members.entry(gid).or_default().push(qpn);
        self.total += 1;
        Ok(new)
    }

    /// Detaches `qpn` from group `gid`; true if nobody is attached to the group any more.
    /// A QP that is not attached is `EINVAL` (`ib_uverbs_detach_mcast`, rxe's
    /// `rxe_detach_mcg`).
    pub(crate) fn detach(&mut self, gid: [u8; 16], qpn: u32) -> Result<bool, VerbsError> {
        let members = self
            .members
            .get_mut(&gid)
            .ok_or(VerbsError::NotAttached { gid, qpn })?;
        let at = members
            .iter()
            .position(|&m| m == qpn)
            .ok_or(VerbsError::NotAttached { gid, qpn })?;
        members.remove(at);
        self.total -= 1;
        let empty = members.is_empty();
        if empty {
            self.members.remove(&gid);
        }
        Ok(empty)
    }

    /// The QP attached to group `gid` at position `index`, if any.
    pub(crate) fn member(&self, gid: &[u8; 16], index: usize) -> Option<u32> {
        self.members.get(gid).and_then(|m| m.get(index)).copied()
    }

    /// Whether any QP is attached to group `gid`.
    pub(crate) fn has(&self, gid: &[u8; 16]) -> bool {
        self.members.contains_key(gid)
    }

    /// How many groups `qpn` is attached to.
    pub(crate) fn groups_of(&self, qpn: u32) -> u32 {
        self.members.values().filter(|m| m.contains(&qpn)).count() as u32
    }

    /// Detaches `qpn` from every group; returns the groups nobody is attached to any more.
    pub(crate) fn detach_all(&mut self, qpn: u32) -> Vec<[u8; 16]> {
        let mut emptied = Vec::new();
        let gids: Vec<[u8; 16]> = self
            .members
            .iter()
            .filter(|(_, m)| m.contains(&qpn))
            .map(|(gid, _)| *gid)
            .collect();
        for gid in gids {
            if let Ok(true) = self.detach(gid, qpn) {
                emptied.push(gid);
            }
        }
        emptied
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(a: u8, b: u8, c: u8, d: u8) -> [u8; 16] {
        std::net::Ipv4Addr::new(a, b, c, d)
            .to_ipv6_mapped()
            .octets()
    }

    #[test]
    fn multicast_gids_are_ff00_8_and_ipv4_mapped_224_4_as_rdma_is_multicast_addr() {
        assert!(is_multicast_gid(&v4(224, 0, 0, 1)));
        assert!(is_multicast_gid(&v4(239, 255, 255, 255)));
        assert!(!is_multicast_gid(&v4(240, 0, 0, 1)));
        assert!(!is_multicast_gid(&v4(127, 0, 0, 1)));
        let mut v6 = [0u8; 16];
        v6[0] = 0xff;
        v6[1] = 0x0e;
        assert!(is_multicast_gid(&v6));
        // ::224.0.0.1 (IPv4-compatible, not mapped) is not an IPv4 multicast GID.
        let mut compat = [0u8; 16];
        compat[12] = 224;
        assert!(!is_multicast_gid(&compat));
    }

    #[test]
    fn attach_is_idempotent_and_detach_of_a_qp_not_attached_is_refused() {
        let mut groups = Groups::default();
        let g = v4(239, 1, 2, 3);
        assert_eq!(groups.attach(g, 5), Ok(true));
        assert_eq!(groups.attach(g, 5), Ok(false));
        assert_eq!(groups.attach(g, 6), Ok(false));
        assert_eq!(groups.groups_of(5), 1);
        assert_eq!(groups.detach(g, 5), Ok(false));
        assert!(matches!(
            groups.detach(g, 5),
            Err(VerbsError::NotAttached { qpn: 5, .. })
        ));
        assert_eq!(groups.detach(g, 6), Ok(true));
        assert!(!groups.has(&g));
        assert_eq!(groups.total, 0);
    }

    #[test]
    fn a_group_holds_at_most_max_mcast_qp_attach_qps() {
        let mut groups = Groups::default();
        let g = v4(239, 1, 2, 3);
        for qpn in 0..MAX_MCAST_QP_ATTACH {
            groups.attach(g, 100 + qpn).unwrap();
        }
        assert_eq!(
            groups.attach(g, 1),
            Err(VerbsError::TooManyObjects {
                object: Object::McastAttachment,
                max: MAX_MCAST_QP_ATTACH
            })
        );
        // Another group still takes it.
        assert_eq!(groups.attach(v4(239, 1, 2, 4), 1), Ok(true));
    }

    #[test]
    fn detach_all_names_the_groups_left_empty() {
        let mut groups = Groups::default();
        let (a, b) = (v4(239, 0, 0, 1), v4(239, 0, 0, 2));
        groups.attach(a, 7).unwrap();
        groups.attach(b, 7).unwrap();
        groups.attach(b, 8).unwrap();
        assert_eq!(groups.detach_all(7), vec![a]);
        assert_eq!(groups.member(&b, 0), Some(8));
        assert_eq!(groups.total, 1);
    }
}
