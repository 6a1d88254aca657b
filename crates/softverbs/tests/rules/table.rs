//! The verbs rules issue #12 asks both front doors to keep, written once, as data.
//!
//! Each [`Rule`] is a short name, an input ([`Case`]), the outcome libibverbs documents
//! ([`Expect`]: success or an errno), what the safe API says about it ([`SafeApi`]: the
//! typed error variant expected, or why the case cannot be written with its types) and
//! the man-page citation. Two runners interpret the table:
//! * `crates/softverbs/tests/rule_table.rs`, through the safe Rust API;
//! * `crates/softverbs-capi/tests/rule_table.rs`, through the drop-in `libibverbs.so.1`'s
//!   exported functions (it includes this file by path).
//!
//! A front door that forgets a rule fails its runner. Sizes that depend on the device
//! ([`Amount`]) are resolved against what the device reports (`ibv_query_device(3)`), so
//! the table holds no limit of its own. The device has one port (1), a GID table of one
//! entry (index 0) and a P_Key table of one entry (index 0).
//!
//! Plain data, std only.

// Each runner reads the parts it needs: the safe runner never reads the drop-in-only
// notes and the drop-in runner never reads the safe API's causes.
#![allow(dead_code)]

/// `EINVAL` (`<errno.h>`).
pub const EINVAL: i32 = 22;
/// `EBUSY` (`<errno.h>`).
pub const EBUSY: i32 = 16;

/// The outcome libibverbs documents for a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The call succeeds.
    Ok,
    /// The call fails with this errno (set in `errno` by a call returning a pointer,
    /// returned by one returning `int`).
    Errno(i32),
}

/// A size given relative to the device's limit for it, resolved by each runner from the
/// device's own answer (`ibv_query_device(3)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Amount {
    /// Exactly this many.
    Value(u32),
    /// The device's maximum.
    DeviceMax,
    /// One above the device's maximum.
    AboveDeviceMax,
}

impl Amount {
    /// The number this stands for on a device whose limit is `max`.
    pub fn resolve(self, max: u32) -> u32 {
        match self {
            Amount::Value(v) => v,
            Amount::DeviceMax => max,
            Amount::AboveDeviceMax => max.saturating_add(1),
        }
    }
}

/// A QP transport service type (`enum ibv_qp_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpKind {
    /// `IBV_QPT_RC`.
    Rc,
    /// `IBV_QPT_UC`.
    Uc,
    /// `IBV_QPT_UD`.
    Ud,
}

/// A QP state (`enum ibv_qp_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpStateName {
    /// `IBV_QPS_RESET`.
    Reset,
    /// `IBV_QPS_INIT`.
    Init,
    /// `IBV_QPS_RTR`.
    Rtr,
    /// `IBV_QPS_RTS`.
    Rts,
}

/// Memory access rights (`enum ibv_access_flags`), as bits with the `verbs.h` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access(pub u32);

impl Access {
    /// No access beyond local read.
    pub const NONE: Access = Access(0);
    /// `IBV_ACCESS_LOCAL_WRITE`.
    pub const LOCAL_WRITE: Access = Access(1 << 0);
    /// `IBV_ACCESS_REMOTE_WRITE`.
    pub const REMOTE_WRITE: Access = Access(1 << 1);
    /// `IBV_ACCESS_REMOTE_READ`.
    pub const REMOTE_READ: Access = Access(1 << 2);
    /// `IBV_ACCESS_REMOTE_ATOMIC`.
    pub const REMOTE_ATOMIC: Access = Access(1 << 3);

    /// Both sets of rights.
    pub const fn with(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }
}

/// A send opcode (`enum ibv_wr_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opcode {
    /// `IBV_WR_SEND`.
    Send,
    /// `IBV_WR_RDMA_WRITE`.
    RdmaWrite,
    /// `IBV_WR_RDMA_READ`.
    RdmaRead,
}

/// The kind of object that keeps a PD in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PdUser {
    /// A memory region (`ibv_reg_mr`).
    Mr,
    /// A queue pair (`ibv_create_qp`).
    Qp,
    /// A shared receive queue (`ibv_create_srq`).
    Srq,
    /// An address handle (`ibv_create_ah`).
    Ah,
}

/// The input of a case. Every object a case needs besides the one under test (a PD, a
/// CQ, a peer QP, a region) is made in the valid way by the runner, so only the named
/// input can be wrong; everything made is destroyed at the end of the case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    /// `ibv_create_ah` to the device's own GID 0 (global: RoCE needs the GRH), through
    /// `port`, from GID index `sgid_index`.
    CreateAh {
        /// `ah_attr.grh.sgid_index`.
        sgid_index: u8,
        /// `ah_attr.port_num`.
        port: u8,
    },
    /// An RC QP moved RESET → INIT with `port` and `pkey_index` (and `IBV_QP_ACCESS_FLAGS`
    /// 0). On failure the QP must still be in RESET.
    ModifyQpToInit {
        /// `attr.port_num`.
        port: u8,
        /// `attr.pkey_index`.
        pkey_index: u16,
    },
    /// An RC QP in INIT (port 1, P_Key index 0) moved to RTR towards a peer RC QP of the
    /// same PD, with every attribute RTR requires (path MTU 1024, the peer's QPN and
    /// GID, PSN 0, min RNR timer 12), `ah_attr.grh.sgid_index` and `max_dest_rd_atomic`
    /// as given (resolved against `max_qp_rd_atom`). On failure the QP must still be in
    /// INIT; on success it is in RTR.
    ModifyQpToRtr {
        /// `attr.ah_attr.grh.sgid_index`.
        sgid_index: u8,
        /// `attr.max_dest_rd_atomic`, against the device's `max_qp_rd_atom`.
        max_dest_rd_atomic: Amount,
    },
    /// An RC QP in `from` asked to go to `to` with the attributes that transition would
    /// take from the state before it (for RTS: `IBV_QP_SQ_PSN` and RC's retry
    /// attributes). On failure the QP must still be in `from`.
    ModifyQpBadTransition {
        /// The QP's state (it is freshly created: RESET).
        from: QpStateName,
        /// The state asked for.
        to: QpStateName,
    },
    /// `ibv_reg_mr` of `len` bytes with `access`.
    RegMr {
        /// Bytes (0 is a zero-length region).
        len: usize,
        /// The rights asked for.
        access: Access,
    },
    /// `ibv_create_qp` of `qp_type`, its CQs valid, with an SRQ of the same PD if
    /// `with_srq`, and `max_send_wr` resolved against `max_qp_wr` (the rest of the
    /// capacities small).
    CreateQp {
        /// The transport.
        qp_type: QpKind,
        /// Whether receives come from an SRQ (`init_attr.srq`).
        with_srq: bool,
        /// `init_attr.cap.max_send_wr`, against the device's `max_qp_wr`.
        max_send_wr: Amount,
    },
    /// `ibv_create_cq` with `cqe` entries, resolved against `max_cqe`.
    CreateCq {
        /// `cqe`, against the device's `max_cqe`.
        cqe: Amount,
    },
    /// `ibv_create_srq` with `max_wr`, resolved against `max_srq_wr` (`max_sge` 1).
    CreateSrq {
        /// `srq_init_attr.attr.max_wr`, against the device's `max_srq_wr`.
        max_wr: Amount,
    },
    /// `ibv_post_send` of one `opcode` request on an RC QP in RTS (connected to itself,
    /// `max_inline_data` 64), 16 bytes of a region with every access right, to that same
    /// region by its rkey; with `IBV_SEND_INLINE` if `inline`.
    PostSend {
        /// The operation.
        opcode: Opcode,
        /// `IBV_SEND_INLINE`.
        inline: bool,
    },
    /// `ibv_post_send` of a SEND on a UD QP in RTS whose address handle is in the QP's PD
    /// (`ah_of_another_pd` false) or in another PD of the same context (true).
    UdSend {
        /// Whether the AH is of another protection domain than the QP's.
        ah_of_another_pd: bool,
    },
    /// `ibv_dealloc_pd` of a PD that a `by` is still in (the object is destroyed after,
    /// then the PD).
    DeallocPdInUse {
        /// What is still in the PD.
        by: PdUser,
    },
    /// `ibv_destroy_cq` of a CQ that an RC QP completes into (the QP is destroyed after,
    /// then the CQ).
    DestroyCqInUse,
    /// `ibv_destroy_srq` of an SRQ an RC QP receives from (the QP is destroyed after,
    /// then the SRQ).
    DestroySrqInUse,
}

/// What the safe API says about a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SafeApi {
    /// The case can be written; when it fails, its error renders as `cause`: the error
    /// type, its variant and, where the variant wraps another error enum, that one's
    /// variant — `"Error::Verbs(BadSgidIndex)"`, `"Error::Register(ZeroLength)"`.
    /// `None` for a case expected to succeed.
    Expressible {
        /// The typed error variant expected.
        cause: Option<&'static str>,
    },
    /// The safe API's types make the case impossible to write; why.
    NotExpressible(&'static str),
}

/// One rule: a case, its documented outcome and where it is documented.
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    /// A short unique name.
    pub name: &'static str,
    /// The input.
    pub case: Case,
    /// The documented outcome.
    pub expect: Expect,
    /// The safe API's side of it.
    pub safe_api: SafeApi,
    /// The man page (and, where the page only says "fails", whose behaviour fixes the
    /// errno).
    pub man: &'static str,
}

const fn cause(c: &'static str) -> SafeApi {
    SafeApi::Expressible { cause: Some(c) }
}

const SUCCEEDS: SafeApi = SafeApi::Expressible { cause: None };

const PD_OUTLIVES_OBJECTS: SafeApi = SafeApi::NotExpressible(
    "a Pd has no dealloc: every object in it holds a clone, so the PD is deallocated only \
     when the last object is gone (`ibv_dealloc_pd` of a PD in use cannot be written)",
);

/// The rules, in the order the runners run them.
pub const RULES: &[Rule] = &[
    // ------------------------------------------------------------ address handles
    Rule {
        name: "ah_sgid_index_0_is_ok",
        case: Case::CreateAh {
            sgid_index: 0,
            port: 1,
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        man: "ibv_create_ah(3): returns a pointer to the created AH (control: GID index 0, \
              port 1 exist)",
    },
    Rule {
        name: "ah_sgid_index_outside_gid_table",
        case: Case::CreateAh {
            sgid_index: 1,
            port: 1,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Verbs(BadSgidIndex)"),
        man: "ibv_create_ah(3): \"returns ... NULL if the request fails\"; grh.sgid_index 1 \
              is outside the port's GID table (ibv_query_port(3) gid_tbl_len = 1): EINVAL, \
              as the kernel's rdma_get_gid_attr refuses it",
    },
    Rule {
        name: "ah_port_2",
        case: Case::CreateAh {
            sgid_index: 0,
            port: 2,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Verbs(NoSuchPort)"),
        man: "ibv_create_ah(3): \"returns ... NULL if the request fails\"; port_num 2 does \
              not exist (ibv_query_device(3) phys_port_cnt = 1): EINVAL",
    },
    // ------------------------------------------------------------ ibv_modify_qp
    Rule {
        name: "init_port_1_pkey_0_is_ok",
        case: Case::ModifyQpToInit {
            port: 1,
            pkey_index: 0,
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        man: "ibv_modify_qp(3): RESET -> INIT with IBV_QP_STATE, IBV_QP_PKEY_INDEX, \
              IBV_QP_PORT, IBV_QP_ACCESS_FLAGS (control)",
    },
    Rule {
        name: "init_port_2",
        case: Case::ModifyQpToInit {
            port: 2,
            pkey_index: 0,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Verbs(NoSuchPort)"),
        man: "ibv_modify_qp(3): \"returns ... the value of errno on failure\"; \"If any of the \
              modify attributes or the modify mask are invalid, none of the attributes will \
              be modified (including the QP state)\": port_num 2 does not exist, EINVAL, the \
              QP stays in RESET",
    },
    Rule {
        name: "init_pkey_index_1",
        case: Case::ModifyQpToInit {
            port: 1,
            pkey_index: 1,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Verbs(AttributeOutOfRange)"),
        man: "ibv_modify_qp(3): invalid attributes modify nothing; pkey_index 1 is outside \
              the P_Key table (ibv_query_device(3) max_pkeys = 1): EINVAL, the QP stays in \
              RESET",
    },
    Rule {
        name: "rtr_sgid_index_0_is_ok",
        case: Case::ModifyQpToRtr {
            sgid_index: 0,
            max_dest_rd_atomic: Amount::Value(1),
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        man: "ibv_modify_qp(3): INIT -> RTR of an RC QP with IBV_QP_STATE, IBV_QP_AV, \
              IBV_QP_PATH_MTU, IBV_QP_DEST_QPN, IBV_QP_RQ_PSN, IBV_QP_MAX_DEST_RD_ATOMIC, \
              IBV_QP_MIN_RNR_TIMER (control)",
    },
    Rule {
        name: "rtr_sgid_index_99",
        case: Case::ModifyQpToRtr {
            sgid_index: 99,
            max_dest_rd_atomic: Amount::Value(1),
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Verbs(BadSgidIndex)"),
        man: "ibv_modify_qp(3): invalid attributes modify nothing (including the QP state); \
              ah_attr.grh.sgid_index 99 is outside the GID table (ibv_query_port(3) \
              gid_tbl_len = 1): EINVAL as the kernel's rdma_get_gid_attr, the QP stays in \
              INIT",
    },
    Rule {
        name: "rtr_max_dest_rd_atomic_at_device_max_is_ok",
        case: Case::ModifyQpToRtr {
            sgid_index: 0,
            max_dest_rd_atomic: Amount::DeviceMax,
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        man: "ibv_query_device(3): max_qp_rd_atom, the most RDMA reads and atomics a QP can \
              have outstanding as the target (control: exactly that many)",
    },
    Rule {
        name: "rtr_max_dest_rd_atomic_above_device",
        case: Case::ModifyQpToRtr {
            sgid_index: 0,
            max_dest_rd_atomic: Amount::AboveDeviceMax,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Verbs(AttributeOutOfRange)"),
        man: "ibv_modify_qp(3): invalid attributes modify nothing; max_dest_rd_atomic above \
              ibv_query_device(3)'s max_qp_rd_atom: EINVAL (the kernel's ib_modify_qp_is_ok \
              / rxe_qp_chk_attr), the QP stays in INIT",
    },
    Rule {
        name: "reset_to_rts",
        case: Case::ModifyQpBadTransition {
            from: QpStateName::Reset,
            to: QpStateName::Rts,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Verbs(IllegalTransition)"),
        man: "ibv_modify_qp(3): the state diagram allows RESET -> INIT only (RESET -> RTS is \
              no transition); invalid attributes or mask modify nothing: EINVAL, the QP stays \
              in RESET",
    },
    // ------------------------------------------------------------ ibv_reg_mr
    Rule {
        name: "reg_mr_is_ok",
        case: Case::RegMr {
            len: 4096,
            access: Access::LOCAL_WRITE.with(Access::REMOTE_WRITE),
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        man: "ibv_reg_mr(3): REMOTE_WRITE with LOCAL_WRITE (control)",
    },
    Rule {
        name: "reg_mr_length_0",
        case: Case::RegMr {
            len: 0,
            access: Access::LOCAL_WRITE,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Register(ZeroLength)"),
        man: "ibv_reg_mr(3): \"returns ... NULL if the request fails\"; a region of length 0: \
              EINVAL, as the kernel's ib_umem_get",
    },
    Rule {
        name: "reg_mr_remote_write_without_local_write",
        case: Case::RegMr {
            len: 4096,
            access: Access::REMOTE_WRITE,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Register(MissingLocalWrite)"),
        man: "ibv_reg_mr(3): \"If IBV_ACCESS_REMOTE_WRITE or IBV_ACCESS_REMOTE_ATOMIC is set, \
              then IBV_ACCESS_LOCAL_WRITE must be set too\": EINVAL",
    },
    // ------------------------------------------------------------ creation limits
    Rule {
        name: "qp_max_send_wr_at_device_max_is_ok",
        case: Case::CreateQp {
            qp_type: QpKind::Rc,
            with_srq: false,
            max_send_wr: Amount::DeviceMax,
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        man: "ibv_query_device(3): max_qp_wr, \"Maximum number of outstanding WR on any work \
              queue\" (control: exactly that many)",
    },
    Rule {
        name: "qp_max_send_wr_above_device",
        case: Case::CreateQp {
            qp_type: QpKind::Rc,
            with_srq: false,
            max_send_wr: Amount::AboveDeviceMax,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Verbs(CapacityAboveLimit)"),
        man: "ibv_create_qp(3): \"returns ... NULL if the request fails\"; cap.max_send_wr \
              above ibv_query_device(3)'s max_qp_wr: EINVAL, as the kernel's create_qp",
    },
    Rule {
        // Control with 16 entries, not max_cqe: the device's max_cqe (4,194,303) is a ring
        // allocated up front, hundreds of MiB for a control.
        name: "cq_cqe_16_is_ok",
        case: Case::CreateCq {
            cqe: Amount::Value(16),
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        man: "ibv_create_cq(3): \"creates a completion queue (CQ) with at least cqe entries\" \
              (control)",
    },
    Rule {
        name: "cq_cqe_above_device",
        case: Case::CreateCq {
            cqe: Amount::AboveDeviceMax,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::CqCreate(TooLarge)"),
        man: "ibv_create_cq(3): \"returns ... NULL if the request fails\"; cqe above \
              ibv_query_device(3)'s max_cqe: EINVAL, as the kernel's ib_uverbs_create_cq",
    },
    Rule {
        name: "srq_max_wr_at_device_max_is_ok",
        case: Case::CreateSrq {
            max_wr: Amount::DeviceMax,
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        man: "ibv_create_srq(3): max_wr, \"Requested max number of outstanding work requests \
              (WRs) in the SRQ\" (control: max_srq_wr)",
    },
    Rule {
        name: "srq_max_wr_above_device",
        case: Case::CreateSrq {
            max_wr: Amount::AboveDeviceMax,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Verbs(CapacityAboveLimit)"),
        man: "ibv_create_srq(3): \"returns ... NULL if the request fails\"; max_wr above \
              ibv_query_device(3)'s max_srq_wr: EINVAL",
    },
    Rule {
        name: "rc_qp_with_srq_is_ok",
        case: Case::CreateQp {
            qp_type: QpKind::Rc,
            with_srq: true,
            max_send_wr: Amount::Value(4),
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        man: "ibv_create_qp(3) NOTES: an SRQ may be associated with IBV_QPT_RC (control)",
    },
    Rule {
        name: "ud_qp_with_srq_is_ok",
        case: Case::CreateQp {
            qp_type: QpKind::Ud,
            with_srq: true,
            max_send_wr: Amount::Value(4),
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        man: "ibv_create_qp(3) NOTES: \"ibv_create_qp() will fail if a it is asked to create \
              QP of a type other than IBV_QPT_RC or IBV_QPT_UD associated with an SRQ\": UD \
              with an SRQ is allowed (rxe allows it)",
    },
    // ------------------------------------------------------------ ibv_post_send
    Rule {
        name: "inline_rdma_write_is_ok",
        case: Case::PostSend {
            opcode: Opcode::RdmaWrite,
            inline: true,
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        man: "ibv_post_send(3): IBV_SEND_INLINE is \"Valid only for Send and RDMA Write\" \
              (control: an RDMA Write)",
    },
    Rule {
        name: "rdma_read_is_ok",
        case: Case::PostSend {
            opcode: Opcode::RdmaRead,
            inline: false,
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        man: "ibv_post_send(3): IBV_WR_RDMA_READ on an RC QP in RTS (control: the same \
              request without IBV_SEND_INLINE)",
    },
    Rule {
        name: "inline_rdma_read",
        case: Case::PostSend {
            opcode: Opcode::RdmaRead,
            inline: true,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Verbs(InlineOnReadOrAtomic)"),
        man: "ibv_post_send(3): IBV_SEND_INLINE is \"Valid only for Send and RDMA Write\"; \
              \"returns 0 on success, or the value of errno on failure\": EINVAL",
    },
    Rule {
        name: "ud_send_ah_of_own_pd_is_ok",
        case: Case::UdSend {
            ah_of_another_pd: false,
        },
        expect: Expect::Ok,
        safe_api: SUCCEEDS,
        man: "ibv_post_send(3): wr.ud.ah, an AH of the QP's PD (control)",
    },
    Rule {
        name: "ud_send_ah_of_another_pd",
        case: Case::UdSend {
            ah_of_another_pd: true,
        },
        expect: Expect::Errno(EINVAL),
        safe_api: cause("Error::Verbs(AddressHandleOfAnotherPd)"),
        man: "ibv_post_send(3): \"returns ... the value of errno on failure\"; \
              ibv_create_ah(3): an AH is \"associated with the protection domain pd\", and a \
              QP uses only address handles of its own PD (IBTA 10.2.3): EINVAL",
    },
    // ------------------------------------------------------------ destroy while in use
    Rule {
        name: "dealloc_pd_with_mr",
        case: Case::DeallocPdInUse { by: PdUser::Mr },
        expect: Expect::Errno(EBUSY),
        safe_api: PD_OUTLIVES_OBJECTS,
        man: "ibv_alloc_pd(3) NOTES: \"ibv_dealloc_pd() may fail if any other resource is \
              still associated with the PD being freed\": EBUSY, as the kernel",
    },
    Rule {
        name: "dealloc_pd_with_qp",
        case: Case::DeallocPdInUse { by: PdUser::Qp },
        expect: Expect::Errno(EBUSY),
        safe_api: PD_OUTLIVES_OBJECTS,
        man: "ibv_alloc_pd(3) NOTES: ibv_dealloc_pd() fails while a resource is associated \
              with the PD: EBUSY",
    },
    Rule {
        name: "dealloc_pd_with_srq",
        case: Case::DeallocPdInUse { by: PdUser::Srq },
        expect: Expect::Errno(EBUSY),
        safe_api: PD_OUTLIVES_OBJECTS,
        man: "ibv_alloc_pd(3) NOTES: ibv_dealloc_pd() fails while a resource is associated \
              with the PD: EBUSY",
    },
    Rule {
        name: "dealloc_pd_with_ah",
        case: Case::DeallocPdInUse { by: PdUser::Ah },
        expect: Expect::Errno(EBUSY),
        safe_api: PD_OUTLIVES_OBJECTS,
        man: "ibv_alloc_pd(3) NOTES: ibv_dealloc_pd() fails while a resource is associated \
              with the PD: EBUSY",
    },
    Rule {
        name: "destroy_cq_in_use",
        case: Case::DestroyCqInUse,
        expect: Expect::Errno(EBUSY),
        safe_api: cause("Error::Verbs(InUse)"),
        man: "ibv_create_cq(3): \"ibv_destroy_cq() fails if any queue pair is still \
              associated with this CQ\": EBUSY",
    },
    Rule {
        name: "destroy_srq_in_use",
        case: Case::DestroySrqInUse,
        expect: Expect::Errno(EBUSY),
        safe_api: cause("Error::Verbs(InUse)"),
        man: "ibv_create_srq(3) NOTES: \"ibv_destroy_srq() fails if any queue pair is still \
              associated with this SRQ\": EBUSY",
    },
];

/// Every rule has a unique name and a citation, and every refusal an errno.
pub fn check_table() -> Result<(), String> {
    for (i, a) in RULES.iter().enumerate() {
        if a.man.is_empty() || a.name.is_empty() {
            return Err(format!("rule {i} lacks a name or a citation"));
        }
        if RULES[..i].iter().any(|b| b.name == a.name) {
            return Err(format!("rule name {} twice", a.name));
        }
        if let (Expect::Ok, SafeApi::Expressible { cause: Some(c) }) = (a.expect, a.safe_api) {
            return Err(format!(
                "{}: expected to succeed yet names a cause {c}",
                a.name
            ));
        }
        if let (Expect::Errno(_), SafeApi::Expressible { cause: None }) = (a.expect, a.safe_api) {
            return Err(format!("{}: expected to fail yet names no cause", a.name));
        }
    }
    Ok(())
}
