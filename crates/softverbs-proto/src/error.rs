//! [`VerbsError`]: why the engine refused a verb, one variant per cause, each carrying
//! what a caller needs to see the mistake (the value given and the limit it broke).
//!
//! The engine states causes only; the errno each cause is reported as is decided in one
//! place above it (`softverbs::core::Error::errno`), where the device's and the CQ's
//! causes meet the engine's.

use crate::types::{AttrMask, QpState, QpType};

/// A kind of verbs object, as errors name them ("the SRQ is still used by 2 QPs").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Object {
    /// A device context (`struct ibv_context`).
    Context,
    /// A protection domain.
    Pd,
    /// A memory region.
    Mr,
    /// A completion queue.
    Cq,
    /// A completion event channel.
    Channel,
    /// A queue pair.
    Qp,
    /// A shared receive queue.
    Srq,
    /// An address handle.
    Ah,
    /// A memory window.
    Mw,
    /// A multicast group (`ibv_attach_mcast(3)`).
    McastGroup,
    /// A QP's attachment to a multicast group.
    McastAttachment,
}

impl std::fmt::Display for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Object::Context => "context",
            Object::Pd => "protection domain",
            Object::Mr => "memory region",
            Object::Cq => "CQ",
            Object::Channel => "completion channel",
            Object::Qp => "QP",
            Object::Srq => "SRQ",
            Object::Ah => "address handle",
            Object::Mw => "memory window",
            Object::McastGroup => "multicast group",
            Object::McastAttachment => "multicast attachment",
        })
    }
}

/// A capacity a QP or SRQ is created with, checked against the device's limit for it
/// (`ibv_query_device(3)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Capacity {
    /// `cap.max_send_wr` or `cap.max_recv_wr` against `max_qp_wr`.
    QueueDepth,
    /// `cap.max_send_sge` or `cap.max_recv_sge` against `max_sge`.
    SgeCount,
    /// `cap.max_inline_data` against the device's inline limit.
    InlineData,
    /// An SRQ's `max_wr` (1 ..= `max_srq_wr`).
    SrqDepth,
    /// An SRQ's `max_sge` against `max_srq_sge`.
    SrqSgeCount,
}

impl std::fmt::Display for Capacity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Capacity::QueueDepth => "queue depth (max_send_wr / max_recv_wr)",
            Capacity::SgeCount => "scatter/gather entries (max_send_sge / max_recv_sge)",
            Capacity::InlineData => "max_inline_data",
            Capacity::SrqDepth => "SRQ max_wr",
            Capacity::SrqSgeCount => "SRQ max_sge",
        })
    }
}

/// A work queue that can be full.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Queue {
    /// A QP's send queue (`max_send_wr` outstanding).
    Send,
    /// A QP's receive queue (`max_recv_wr` outstanding).
    Receive,
    /// A shared receive queue (`max_wr` outstanding).
    Srq,
    /// The MADs waiting to be sent through QP1
    /// ([`GSI_OUTBOX_LEN`](crate::GSI_OUTBOX_LEN)).
    Gsi,
}

/// A verb that posts work, for the errors that depend on the QP's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PostVerb {
    /// `ibv_post_send(3)`: the QP must be in RTS (or SQD, SQE, ERR).
    Send,
    /// `ibv_post_recv(3)`: the QP must not be in RESET.
    Recv,
}

/// Why the engine refused a verb. The engine never panics on a bad argument.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// `ibv_modify_qp(3)`: this QP type has no transition from `from` to `to` (IBTA
    /// 10.3.1, the QP state machine).
    #[error("no {qp_type:?} QP transition from {from:?} to {to:?}")]
    IllegalTransition {
        /// The QP's type.
        qp_type: QpType,
        /// The QP's state.
        from: QpState,
        /// The state asked for.
        to: QpState,
    },
    /// `ibv_modify_qp(3)`: the transition requires attributes the mask lacks.
    #[error("the transition requires {missing:?} in attr_mask")]
    MissingAttributes {
        /// The required attributes not in the mask.
        missing: AttrMask,
    },
    /// `ibv_modify_qp(3)`: the mask names attributes this transition does not take.
    #[error("{extra:?} may not be modified in this transition")]
    AttributesNotAllowed {
        /// The attributes the transition does not allow.
        extra: AttrMask,
    },
    /// `IBV_QP_CUR_STATE` given and not the QP's state.
    #[error("cur_qp_state {given:?} is not the QP's state {actual:?}")]
    CurrentStateMismatch {
        /// `attr.cur_qp_state`.
        given: QpState,
        /// The QP's state.
        actual: QpState,
    },
    /// A QP attribute outside its range (`timeout` > 31, a PSN wider than 24 bits,
    /// `max_rd_atomic` above the device's limit, `path_mtu` above the port's active MTU, a
    /// P_Key index outside the one-entry table, …).
    #[error("attribute {attr:?} = {value} is above its limit {max}")]
    AttributeOutOfRange {
        /// The attribute (one flag).
        attr: AttrMask,
        /// The value given.
        value: u64,
        /// The largest value allowed.
        max: u64,
    },
    /// `qp_access_flags` names rights a QP cannot grant.
    #[error("qp_access_flags {bits:#x} names unknown rights")]
    UnknownAccessFlags {
        /// The flags given.
        bits: u32,
    },
    /// A port other than 1 (the device has one port; 0 in an address vector means "the
    /// QP's port").
    #[error("port {port} does not exist (the device has port 1)")]
    NoSuchPort {
        /// The port asked for.
        port: u32,
    },
    /// A GID index outside the port's GID table: an address vector's `sgid_index`, as the
    /// kernel's `rdma_get_gid_attr` refuses it in `ibv_modify_qp` and `ibv_create_ah`, or
    /// the index of `ibv_query_gid(3)`.
    #[error("GID index {index} outside the GID table ({table_len} entries)")]
    BadSgidIndex {
        /// The index asked for.
        index: u32,
        /// Entries in the port's GID table.
        table_len: u32,
    },
    /// `ibv_create_qp(3)` / `ibv_create_srq(3)`: a capacity above the device's limit (or an
    /// SRQ of zero entries).
    #[error("{what} = {requested} is outside 1..={max} (0 allowed for a QP)")]
    CapacityAboveLimit {
        /// Which capacity.
        what: Capacity,
        /// What was asked for.
        requested: u32,
        /// The device's limit.
        max: u32,
    },
    /// `ibv_create_srq(3)` / `ibv_modify_srq(3)`: `srq_limit` above the SRQ's `max_wr`.
    #[error("srq_limit {srq_limit} is above the SRQ's max_wr {max_wr}")]
    SrqLimitAboveMaxWr {
        /// The limit asked for.
        srq_limit: u32,
        /// The SRQ's size.
        max_wr: u32,
    },
    /// A post in a state that does not take it (`ibv_post_send` before RTS,
    /// `ibv_post_recv` in RESET).
    #[error("{verb:?} post in state {state:?}")]
    WrongState {
        /// The verb.
        verb: PostVerb,
        /// The QP's state.
        state: QpState,
    },
    /// `ibv_post_send(3)`'s table of opcodes per QP type: this opcode is not for this QP.
    #[error("opcode {opcode} is not supported on a {qp_type:?} QP")]
    OpcodeNotForQpType {
        /// The opcode (`IBV_WR_*` name).
        opcode: &'static str,
        /// The QP's type.
        qp_type: QpType,
    },
    /// More scatter/gather entries than the queue was created with.
    #[error("{num_sge} scatter/gather entries, the queue takes {max}")]
    TooManySges {
        /// `num_sge`.
        num_sge: usize,
        /// The queue's `max_*_sge`.
        max: u32,
    },
    /// Inline data longer than the QP's `max_inline_data`.
    #[error("{len} bytes inline, the QP takes {max}")]
    InlineTooLong {
        /// Bytes given.
        len: usize,
        /// `cap.max_inline_data`.
        max: u32,
    },
    /// `IBV_SEND_INLINE` on an RDMA READ or atomic: `ibv_post_send(3)` "valid only for
    /// Send and RDMA Write".
    #[error("IBV_SEND_INLINE is valid only for send and RDMA write")]
    InlineOnReadOrAtomic,
    /// A message longer than 2^31 bytes (IBTA: the maximum message size).
    #[error("a {len}-byte message is longer than 2^31 bytes")]
    MessageTooLong {
        /// Its length.
        len: u64,
    },
    /// A management datagram to send through QP1 that is empty or longer than a MAD
    /// (IBTA 13.4: 256 bytes).
    #[error("a management datagram is 1..={max} bytes, not {len}")]
    MadLength {
        /// Its length.
        len: usize,
        /// [`MAD_LEN`](crate::MAD_LEN).
        max: usize,
    },
    /// A FLUSH whose placement type is empty or has bits `ibv_wr_post(3)` does not name
    /// (`IBV_FLUSH_GLOBAL`, `IBV_FLUSH_PERSISTENT`), or whose selectivity level is neither
    /// `IBV_FLUSH_RANGE` nor `IBV_FLUSH_MR`.
    #[error("a FLUSH with placement type {placement:#x} and selectivity level {selectivity} is not one ibv_wr_flush names")]
    BadFlush {
        /// The placement type asked for.
        placement: u8,
        /// The selectivity level asked for.
        selectivity: u8,
    },
    /// An atomic whose local buffer is not 8 bytes.
    #[error("an atomic needs exactly 8 bytes of local buffer, not {len}")]
    AtomicLength {
        /// The buffer's length.
        len: u64,
    },
    /// A UD send without an address handle.
    #[error("a UD send needs an address handle")]
    MissingAddressHandle,
    /// A UD send whose address handle belongs to another protection domain than the QP.
    #[error("the address handle belongs to another protection domain than the QP")]
    AddressHandleOfAnotherPd,
    /// A send on a connected (RC or UC) QP that names a UD destination: the destination
    /// is the QP's, set at RTR (`wr.ud` is read only on UD QPs).
    #[error("a connected QP's sends take no UD destination")]
    AddressHandleOnConnectedQp,
    /// `ibv_post_recv` on a QP whose receives come from an SRQ.
    #[error("the QP takes its receives from an SRQ: post to the SRQ")]
    ReceivesFromSrq,
    /// A work queue already holds as many requests as it was created for (`ENOMEM`).
    #[error("the {queue:?} queue is full")]
    QueueFull {
        /// Which queue.
        queue: Queue,
    },
    /// No QP or SRQ by this number.
    #[error("no {object} {id}")]
    NoSuchObject {
        /// The kind.
        object: Object,
        /// Its number.
        id: u32,
    },
    /// A device holds `max` objects of this kind already (`ibv_alloc_mw(3)` past
    /// `max_mw`).
    #[error("the device holds {max} {object}s already")]
    TooManyObjects {
        /// The kind.
        object: Object,
        /// The device's limit.
        max: u32,
    },
    /// `ibv_attach_mcast(3)`, `ibv_detach_mcast(3)`: only a UD QP joins a multicast group
    /// (the kernel's `ib_attach_mcast`: `EINVAL`).
    #[error("a {qp_type:?} QP cannot join a multicast group: only UD QPs do")]
    MulticastNeedsUd {
        /// The QP's type.
        qp_type: QpType,
    },
    /// `ibv_attach_mcast(3)`, `ibv_detach_mcast(3)`: the GID is not a multicast address
    /// (`rdma_is_multicast_addr`: `ff00::/8` or IPv4-mapped 224.0.0.0/4; `EINVAL`).
    #[error("GID {} is not a multicast address", std::net::Ipv6Addr::from(*gid))]
    NotMulticast {
        /// The GID given.
        gid: [u8; 16],
    },
    /// `ibv_detach_mcast(3)`: the QP is not attached to this group (`EINVAL`, as the
    /// kernel's `ib_uverbs_detach_mcast`).
    #[error("QP {qpn} is not attached to multicast group {}", std::net::Ipv6Addr::from(*gid))]
    NotAttached {
        /// The group.
        gid: [u8; 16],
        /// The QP.
        qpn: u32,
    },
    /// The object is still used by others (`ibv_destroy_srq(3)` of an SRQ QPs use).
    #[error("the {object} is still used by {count} {by}(s)")]
    InUse {
        /// What was to be destroyed.
        object: Object,
        /// The kind of object still holding it.
        by: Object,
        /// How many of them.
        count: u32,
    },
}
