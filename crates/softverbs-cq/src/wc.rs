//! Work completions: [`WorkCompletion`], laid out exactly as `struct ibv_wc` in
//! `<infiniband/verbs.h>`, with the enums and flag sets its fields hold.
//!
//! Guarantees:
//! - `WorkCompletion` is `#[repr(C)]`, 48 bytes, align 8, every field at the offset the
//!   installed header gives (pinned by `tests/ibv_wc_layout.rs`), so the C drop-in hands
//!   these to C callers with no conversion.
//! - `ibv_poll_cq(3)`: "Not all wc attributes are always valid. If the completion status is
//!   other than IBV_WC_SUCCESS, only the following attributes are valid: wr_id, status,
//!   qp_num, and vendor_err." That rule is a type here: [`WorkCompletion::result`] splits
//!   into [`Completed`] (every accessor) and [`Failed`] (only those four).
//! - Values the C side can hand us that no enum names survive as `Unknown(raw)` arms.

use bitflags::bitflags;
use std::ffi::CStr;
use std::fmt;

/// Completion status (`enum ibv_wc_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`: the operation completed successfully.
    Success,
    /// `IBV_WC_LOC_LEN_ERR`: local length error (message too long for the buffer, or a
    /// work request longer than the port can carry).
    LocLenErr,
    /// `IBV_WC_LOC_QP_OP_ERR`: local QP operation error (an internal QP consistency error,
    /// such as inline data above `max_inline_data`).
    LocQpOpErr,
    /// `IBV_WC_LOC_EEC_OP_ERR`: local EE context operation error (RD only; never produced).
    LocEecOpErr,
    /// `IBV_WC_LOC_PROT_ERR`: local protection error (an SGE names memory the lkey does not
    /// cover, or with the wrong access).
    LocProtErr,
    /// `IBV_WC_WR_FLUSH_ERR`: the work request was flushed because the QP entered the error
    /// state.
    WrFlushErr,
    /// `IBV_WC_MW_BIND_ERR`: memory window bind error.
    MwBindErr,
    /// `IBV_WC_BAD_RESP_ERR`: bad response (unexpected transport-layer opcode from the
    /// responder).
    BadRespErr,
    /// `IBV_WC_LOC_ACCESS_ERR`: local access error (a protection error on a local data
    /// buffer during an RDMA write with immediate receive, or an incoming read response).
    LocAccessErr,
    /// `IBV_WC_REM_INV_REQ_ERR`: remote invalid request (the responder found the request
    /// invalid, e.g. an unsupported opcode or a message too long for its receive buffer).
    RemInvReqErr,
    /// `IBV_WC_REM_ACCESS_ERR`: remote access error (rkey, bounds or access rights).
    RemAccessErr,
    /// `IBV_WC_REM_OP_ERR`: remote operation error (the responder could not complete it).
    RemOpErr,
    /// `IBV_WC_RETRY_EXC_ERR`: transport retry counter exceeded.
    RetryExcErr,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: RNR retry counter exceeded.
    RnrRetryExcErr,
    /// `IBV_WC_LOC_RDD_VIOL_ERR`: local RDD violation (RD only; never produced).
    LocRddViolErr,
    /// `IBV_WC_REM_INV_RD_REQ_ERR`: remote invalid RD request (RD only; never produced).
    RemInvRdReqErr,
    /// `IBV_WC_REM_ABORT_ERR`: the operation was aborted by the remote side.
    RemAbortErr,
    /// `IBV_WC_INV_EECN_ERR`: invalid EE context number (RD only; never produced).
    InvEecnErr,
    /// `IBV_WC_INV_EEC_STATE_ERR`: invalid EE context state (RD only; never produced).
    InvEecStateErr,
    /// `IBV_WC_FATAL_ERR`: fatal error.
    FatalErr,
    /// `IBV_WC_RESP_TIMEOUT_ERR`: response timeout.
    RespTimeoutErr,
    /// `IBV_WC_GENERAL_ERR`: general error.
    GeneralErr,
    /// `IBV_WC_TM_ERR`: tag-matching error.
    TmErr,
    /// `IBV_WC_TM_RNDV_INCOMPLETE`: tag-matching rendezvous incomplete.
    TmRndvIncomplete,
    /// A value the header does not name.
    Unknown(u32),
}

const STATUS_TABLE: [(WcStatus, &CStr); 24] = [
    (WcStatus::Success, c"success"),
    (WcStatus::LocLenErr, c"local length error"),
    (WcStatus::LocQpOpErr, c"local QP operation error"),
    (WcStatus::LocEecOpErr, c"local EE context operation error"),
    (WcStatus::LocProtErr, c"local protection error"),
    (WcStatus::WrFlushErr, c"Work Request Flushed Error"),
    (WcStatus::MwBindErr, c"memory management operation error"),
    (WcStatus::BadRespErr, c"bad response error"),
    (WcStatus::LocAccessErr, c"local access error"),
    (WcStatus::RemInvReqErr, c"remote invalid request error"),
    (WcStatus::RemAccessErr, c"remote access error"),
    (WcStatus::RemOpErr, c"remote operation error"),
    (WcStatus::RetryExcErr, c"transport retry counter exceeded"),
    (WcStatus::RnrRetryExcErr, c"RNR retry counter exceeded"),
    (WcStatus::LocRddViolErr, c"local RDD violation error"),
    (WcStatus::RemInvRdReqErr, c"remote invalid RD request"),
    (WcStatus::RemAbortErr, c"aborted error"),
    (WcStatus::InvEecnErr, c"invalid EE context number"),
    (WcStatus::InvEecStateErr, c"invalid EE context state"),
    (WcStatus::FatalErr, c"fatal error"),
    (WcStatus::RespTimeoutErr, c"response timeout error"),
    (WcStatus::GeneralErr, c"general error"),
    (WcStatus::TmErr, c"TM error"),
    (WcStatus::TmRndvIncomplete, c"TM software rendezvous"),
];

impl WcStatus {
    /// Every named status, in `enum ibv_wc_status` order (raw value = index).
    pub const ALL: [WcStatus; 24] = {
        let mut all = [WcStatus::Success; 24];
        let mut i = 0;
        while i < 24 {
            all[i] = STATUS_TABLE[i].0;
            i += 1;
        }
        all
    };

    /// The status for a raw `enum ibv_wc_status` value.
    pub const fn from_raw(raw: u32) -> Self {
        if (raw as usize) < STATUS_TABLE.len() {
            STATUS_TABLE[raw as usize].0
        } else {
            WcStatus::Unknown(raw)
        }
    }

    /// The raw `enum ibv_wc_status` value.
    pub const fn to_raw(self) -> u32 {
        match self {
            WcStatus::Success => 0,
            WcStatus::LocLenErr => 1,
            WcStatus::LocQpOpErr => 2,
            WcStatus::LocEecOpErr => 3,
            WcStatus::LocProtErr => 4,
            WcStatus::WrFlushErr => 5,
            WcStatus::MwBindErr => 6,
            WcStatus::BadRespErr => 7,
            WcStatus::LocAccessErr => 8,
            WcStatus::RemInvReqErr => 9,
            WcStatus::RemAccessErr => 10,
            WcStatus::RemOpErr => 11,
            WcStatus::RetryExcErr => 12,
            WcStatus::RnrRetryExcErr => 13,
            WcStatus::LocRddViolErr => 14,
            WcStatus::RemInvRdReqErr => 15,
            WcStatus::RemAbortErr => 16,
            WcStatus::InvEecnErr => 17,
            WcStatus::InvEecStateErr => 18,
            WcStatus::FatalErr => 19,
            WcStatus::RespTimeoutErr => 20,
            WcStatus::GeneralErr => 21,
            WcStatus::TmErr => 22,
            WcStatus::TmRndvIncomplete => 23,
            WcStatus::Unknown(raw) => raw,
        }
    }

    /// The text `ibv_wc_status_str(3)` gives for this status ("unknown" for values the
    /// header does not name), NUL-terminated for the C side.
    pub const fn as_c_str(self) -> &'static CStr {
        match self {
            WcStatus::Unknown(_) => c"unknown",
            known => STATUS_TABLE[known.to_raw() as usize].1,
        }
    }

    /// The text `ibv_wc_status_str(3)` gives for this status ("unknown" for values the
    /// header does not name).
    pub fn as_str(self) -> &'static str {
        // Every entry is ASCII, so the conversion cannot fail.
        self.as_c_str().to_str().unwrap_or("unknown")
    }

    /// True for [`WcStatus::Success`].
    pub const fn is_success(self) -> bool {
        matches!(self, WcStatus::Success)
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Completion opcode (`enum ibv_wc_opcode`): which operation the completion is for.
///
/// Send-side completions have raw values below 128; receive-side ones have bit 7 set
/// (`verbs.h`: "consumers can test if a completion is a receive by testing
/// `(opcode & IBV_WC_RECV)`").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// `IBV_WC_SEND`: a send (with or without immediate or invalidate) completed.
    Send,
    /// `IBV_WC_RDMA_WRITE`: an RDMA write completed.
    RdmaWrite,
    /// `IBV_WC_RDMA_READ`: an RDMA read completed.
    RdmaRead,
    /// `IBV_WC_COMP_SWAP`: an atomic compare-and-swap completed.
    CompSwap,
    /// `IBV_WC_FETCH_ADD`: an atomic fetch-and-add completed.
    FetchAdd,
    /// `IBV_WC_BIND_MW`: a memory window bind completed.
    BindMw,
    /// `IBV_WC_LOCAL_INV`: a local invalidate completed.
    LocalInv,
    /// `IBV_WC_TSO`: a TCP segmentation offload send completed.
    Tso,
    /// `IBV_WC_FLUSH` (8): a flush completed (not named by Debian 12's header, reserved).
    Flush,
    /// `IBV_WC_ATOMIC_WRITE`: an atomic write completed.
    AtomicWrite,
    /// `IBV_WC_RECV`: a receive work request consumed an incoming send.
    Recv,
    /// `IBV_WC_RECV_RDMA_WITH_IMM`: a receive work request consumed an RDMA write with
    /// immediate.
    RecvRdmaWithImm,
    /// `IBV_WC_TM_ADD`: tag-matching add completed.
    TmAdd,
    /// `IBV_WC_TM_DEL`: tag-matching delete completed.
    TmDel,
    /// `IBV_WC_TM_SYNC`: tag-matching sync completed.
    TmSync,
    /// `IBV_WC_TM_RECV`: tag-matching receive.
    TmRecv,
    /// `IBV_WC_TM_NO_TAG`: tag-matching receive with no tag.
    TmNoTag,
    /// `IBV_WC_DRIVER1`: driver-specific.
    Driver1,
    /// `IBV_WC_DRIVER2`: driver-specific.
    Driver2,
    /// `IBV_WC_DRIVER3`: driver-specific.
    Driver3,
    /// A value the header does not name.
    Unknown(u32),
}

impl WcOpcode {
    /// The opcode for a raw `enum ibv_wc_opcode` value.
    pub const fn from_raw(raw: u32) -> Self {
        match raw {
            0 => WcOpcode::Send,
            1 => WcOpcode::RdmaWrite,
            2 => WcOpcode::RdmaRead,
            3 => WcOpcode::CompSwap,
            4 => WcOpcode::FetchAdd,
            5 => WcOpcode::BindMw,
            6 => WcOpcode::LocalInv,
            7 => WcOpcode::Tso,
            8 => WcOpcode::Flush,
            9 => WcOpcode::AtomicWrite,
            128 => WcOpcode::Recv,
            129 => WcOpcode::RecvRdmaWithImm,
            130 => WcOpcode::TmAdd,
            131 => WcOpcode::TmDel,
            132 => WcOpcode::TmSync,
            133 => WcOpcode::TmRecv,
            134 => WcOpcode::TmNoTag,
            135 => WcOpcode::Driver1,
            136 => WcOpcode::Driver2,
            137 => WcOpcode::Driver3,
            other => WcOpcode::Unknown(other),
        }
    }

    /// The raw `enum ibv_wc_opcode` value.
    pub const fn to_raw(self) -> u32 {
        match self {
            WcOpcode::Send => 0,
            WcOpcode::RdmaWrite => 1,
            WcOpcode::RdmaRead => 2,
            WcOpcode::CompSwap => 3,
            WcOpcode::FetchAdd => 4,
            WcOpcode::BindMw => 5,
            WcOpcode::LocalInv => 6,
            WcOpcode::Tso => 7,
            WcOpcode::Flush => 8,
            WcOpcode::AtomicWrite => 9,
            WcOpcode::Recv => 128,
            WcOpcode::RecvRdmaWithImm => 129,
            WcOpcode::TmAdd => 130,
            WcOpcode::TmDel => 131,
            WcOpcode::TmSync => 132,
            WcOpcode::TmRecv => 133,
            WcOpcode::TmNoTag => 134,
            WcOpcode::Driver1 => 135,
            WcOpcode::Driver2 => 136,
            WcOpcode::Driver3 => 137,
            WcOpcode::Unknown(raw) => raw,
        }
    }

    /// True for receive-side completions (`opcode & IBV_WC_RECV`).
    pub const fn is_receive(self) -> bool {
        self.to_raw() & 128 != 0
    }
}

bitflags! {
    /// Completion flags (`enum ibv_wc_flags`, the `wc_flags` field).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// `IBV_WC_GRH`: the first 40 bytes of the receive buffer hold a GRH (UD).
        const GRH = 1 << 0;
        /// `IBV_WC_WITH_IMM`: `imm_data` is valid.
        const WITH_IMM = 1 << 1;
        /// `IBV_WC_IP_CSUM_OK`: the IP checksum was verified (raw packet QPs).
        const IP_CSUM_OK = 1 << 2;
        /// `IBV_WC_WITH_INV`: `invalidated_rkey` is valid.
        const WITH_INV = 1 << 3;
        /// `IBV_WC_TM_SYNC_REQ`: tag matching, sync requested.
        const TM_SYNC_REQ = 1 << 4;
        /// `IBV_WC_TM_MATCH`: tag matching, the tag matched.
        const TM_MATCH = 1 << 5;
        /// `IBV_WC_TM_DATA_VALID`: tag matching, data is valid.
        const TM_DATA_VALID = 1 << 6;
        // Flags a newer header may define survive a round trip.
        const _ = !0;
    }
}

bitflags! {
    /// The fields an extended CQ was asked to report (`enum ibv_create_cq_wc_flags`, the
    /// `wc_flags` of `struct ibv_cq_init_attr_ex`). `ibv_create_cq_ex(3)`: "wc_flags:
    /// Bitmask of enum ibv_create_cq_wc_flags which says what fields of the work completion
    /// the user wants to read."
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct WcFields: u64 {
        /// `IBV_WC_EX_WITH_BYTE_LEN`.
        const BYTE_LEN = 1 << 0;
        /// `IBV_WC_EX_WITH_IMM` (immediate data and invalidated rkey).
        const IMM = 1 << 1;
        /// `IBV_WC_EX_WITH_QP_NUM`.
        const QP_NUM = 1 << 2;
        /// `IBV_WC_EX_WITH_SRC_QP`.
        const SRC_QP = 1 << 3;
        /// `IBV_WC_EX_WITH_SLID`.
        const SLID = 1 << 4;
        /// `IBV_WC_EX_WITH_SL`.
        const SL = 1 << 5;
        /// `IBV_WC_EX_WITH_DLID_PATH_BITS`.
        const DLID_PATH_BITS = 1 << 6;
        /// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`: device clock at completion.
        const COMPLETION_TIMESTAMP = 1 << 7;
        /// `IBV_WC_EX_WITH_CVLAN`.
        const CVLAN = 1 << 8;
        /// `IBV_WC_EX_WITH_FLOW_TAG`.
        const FLOW_TAG = 1 << 9;
        /// `IBV_WC_EX_WITH_TM_INFO`.
        const TM_INFO = 1 << 10;
        /// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`: wall clock at completion.
        const COMPLETION_TIMESTAMP_WALLCLOCK = 1 << 11;
    }
}

impl WcFields {
    /// `IBV_WC_STANDARD_FLAGS`: the fields every `struct ibv_wc` carries.
    pub const STANDARD: WcFields = WcFields::BYTE_LEN
        .union(WcFields::IMM)
        .union(WcFields::QP_NUM)
        .union(WcFields::SRC_QP)
        .union(WcFields::SLID)
        .union(WcFields::SL)
        .union(WcFields::DLID_PATH_BITS);
}

/// A work completion, laid out exactly as `struct ibv_wc`.
///
/// Build one with [`WorkCompletion::success`] or [`WorkCompletion::failure`] and the
/// `with_*` setters; read one through [`WorkCompletion::result`], which only lets a failed
/// completion's valid fields be read.
///
/// ```
/// use softverbs_cq::{WorkCompletion, WcOpcode, WcStatus};
/// let wc = WorkCompletion::success(7, WcOpcode::Recv, 0x11).with_byte_len(64).with_imm(0xdead);
/// let done = wc.result().unwrap();
/// assert_eq!(done.byte_len(), 64);
/// assert_eq!(done.imm_data(), Some(0xdead));
/// let err = WorkCompletion::failure(8, WcStatus::WrFlushErr, 0x11, 0);
/// assert_eq!(err.result().unwrap_err().status(), WcStatus::WrFlushErr);
/// ```
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WorkCompletion {
    wr_id: u64,
    status: u32,
    opcode: u32,
    vendor_err: u32,
    byte_len: u32,
    /// `imm_data` (network byte order) or `invalidated_rkey` (host order): a C union.
    imm_or_rkey: u32,
    qp_num: u32,
    src_qp: u32,
    wc_flags: u32,
    pkey_index: u16,
    slid: u16,
    sl: u8,
    dlid_path_bits: u8,
}

const _: () = assert!(std::mem::size_of::<WorkCompletion>() == 48);
const _: () = assert!(std::mem::align_of::<WorkCompletion>() == 8);

impl WorkCompletion {
    /// A successful completion of work request `wr_id` on QP `qp_num`.
    pub const fn success(wr_id: u64, opcode: WcOpcode, qp_num: u32) -> Self {
        WorkCompletion {
            wr_id,
            status: 0,
            opcode: opcode.to_raw(),
            vendor_err: 0,
            byte_len: 0,
            imm_or_rkey: 0,
            qp_num,
            src_qp: 0,
            wc_flags: 0,
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
        }
    }

    /// A failed completion: only `wr_id`, `status`, `qp_num` and `vendor_err` are valid
    /// (`ibv_poll_cq(3)`). `status` should not be [`WcStatus::Success`].
    pub const fn failure(wr_id: u64, status: WcStatus, qp_num: u32, vendor_err: u32) -> Self {
        let mut wc = WorkCompletion::success(wr_id, WcOpcode::Send, qp_num);
        wc.status = status.to_raw();
        wc.vendor_err = vendor_err;
        wc
    }

    /// Sets the opcode (also allowed on a failed completion, where C callers may look at
    /// it although the man page does not make it valid).
    pub const fn with_opcode(mut self, opcode: WcOpcode) -> Self {
        self.opcode = opcode.to_raw();
        self
    }

    /// Sets `byte_len`.
    pub const fn with_byte_len(mut self, byte_len: u32) -> Self {
        self.byte_len = byte_len;
        self
    }

    /// Sets the immediate data (given in host order, stored in network order as
    /// `verbs.h` says) and the `IBV_WC_WITH_IMM` flag.
    pub const fn with_imm(mut self, imm_host_order: u32) -> Self {
        self.imm_or_rkey = imm_host_order.to_be();
        self.wc_flags = (self.wc_flags & !WcFlags::WITH_INV.bits()) | WcFlags::WITH_IMM.bits();
        self
    }

    /// Sets the invalidated rkey and the `IBV_WC_WITH_INV` flag.
    pub const fn with_invalidated_rkey(mut self, rkey: u32) -> Self {
        self.imm_or_rkey = rkey;
        self.wc_flags = (self.wc_flags & !WcFlags::WITH_IMM.bits()) | WcFlags::WITH_INV.bits();
        self
    }

    /// Sets the source QP (UD).
    pub const fn with_src_qp(mut self, src_qp: u32) -> Self {
        self.src_qp = src_qp;
        self
    }

    /// Adds completion flags (`IBV_WC_GRH`, …).
    pub const fn with_flags(mut self, flags: WcFlags) -> Self {
        self.wc_flags |= flags.bits();
        self
    }

    /// Sets the P_Key index.
    pub const fn with_pkey_index(mut self, pkey_index: u16) -> Self {
        self.pkey_index = pkey_index;
        self
    }

    /// Sets the source LID (0 on RoCE).
    pub const fn with_slid(mut self, slid: u16) -> Self {
        self.slid = slid;
        self
    }

    /// Sets the service level.
    pub const fn with_sl(mut self, sl: u8) -> Self {
        self.sl = sl;
        self
    }

    /// Sets the destination LID path bits (0 on RoCE).
    pub const fn with_dlid_path_bits(mut self, bits: u8) -> Self {
        self.dlid_path_bits = bits;
        self
    }

    /// The work request id the application gave. Valid whatever the status.
    pub const fn wr_id(&self) -> u64 {
        self.wr_id
    }

    /// The completion status. Valid whatever the status.
    pub const fn status(&self) -> WcStatus {
        WcStatus::from_raw(self.status)
    }

    /// The local QP number. Valid whatever the status.
    pub const fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// The vendor error syndrome. Valid whatever the status.
    pub const fn vendor_err(&self) -> u32 {
        self.vendor_err
    }

    /// The completion seen through the man page's validity rule: [`Completed`] with every
    /// field on success, [`Failed`] with only the fields valid on error otherwise.
    pub const fn result(&self) -> Result<Completed<'_>, Failed<'_>> {
        if self.status == 0 {
            Ok(Completed(self))
        } else {
            Err(Failed(self))
        }
    }

    /// Every field as stored, regardless of status: for the C boundary and for tests that
    /// check exactly what a C caller would see. Application code should use
    /// [`WorkCompletion::result`].
    pub const fn raw(&self) -> RawFields {
        RawFields {
            wr_id: self.wr_id,
            status: self.status,
            opcode: self.opcode,
            vendor_err: self.vendor_err,
            byte_len: self.byte_len,
            imm_or_rkey: self.imm_or_rkey,
            qp_num: self.qp_num,
            src_qp: self.src_qp,
            wc_flags: self.wc_flags,
            pkey_index: self.pkey_index,
            slid: self.slid,
            sl: self.sl,
            dlid_path_bits: self.dlid_path_bits,
        }
    }

    /// A completion from raw field values, exactly as a C caller would fill `struct ibv_wc`.
    pub const fn from_raw(raw: RawFields) -> Self {
        WorkCompletion {
            wr_id: raw.wr_id,
            status: raw.status,
            opcode: raw.opcode,
            vendor_err: raw.vendor_err,
            byte_len: raw.byte_len,
            imm_or_rkey: raw.imm_or_rkey,
            qp_num: raw.qp_num,
            src_qp: raw.src_qp,
            wc_flags: raw.wc_flags,
            pkey_index: raw.pkey_index,
            slid: raw.slid,
            sl: raw.sl,
            dlid_path_bits: raw.dlid_path_bits,
        }
    }

    /// The completion as six 64-bit words, in memory order on little-endian machines (how
    /// the ring stores it, one relaxed atomic per word).
    #[inline(always)]
    pub fn to_words(self) -> [u64; 6] {
        let w1 = u64::from(self.status) | (u64::from(self.opcode) << 32);
        let w2 = u64::from(self.vendor_err) | (u64::from(self.byte_len) << 32);
        let w3 = u64::from(self.imm_or_rkey) | (u64::from(self.qp_num) << 32);
        let w4 = u64::from(self.src_qp) | (u64::from(self.wc_flags) << 32);
        let w5 = u64::from(self.pkey_index)
            | (u64::from(self.slid) << 16)
            | (u64::from(self.sl) << 32)
            | (u64::from(self.dlid_path_bits) << 40);
        [self.wr_id, w1, w2, w3, w4, w5]
    }

    /// The inverse of [`WorkCompletion::to_words`].
    #[inline(always)]
    pub fn from_words(w: [u64; 6]) -> Self {
        WorkCompletion {
            wr_id: w[0],
            status: w[1] as u32,
            opcode: (w[1] >> 32) as u32,
            vendor_err: w[2] as u32,
            byte_len: (w[2] >> 32) as u32,
            imm_or_rkey: w[3] as u32,
            qp_num: (w[3] >> 32) as u32,
            src_qp: w[4] as u32,
            wc_flags: (w[4] >> 32) as u32,
            pkey_index: w[5] as u16,
            slid: (w[5] >> 16) as u16,
            sl: (w[5] >> 32) as u8,
            dlid_path_bits: (w[5] >> 40) as u8,
        }
    }
}

impl WorkCompletion {
    /// Makes `self` [`WorkCompletion::from_words`]`(words)` with six whole-word stores (field
    /// by field, the compiler stores thirteen, some of them 8 and 16 bits wide): the poll
    /// loop's copy out of the ring.
    #[inline(always)]
    pub(crate) fn set_from_words(&mut self, words: [u64; 6]) {
        #[cfg(target_endian = "little")]
        {
            // SAFETY: `WorkCompletion` is `repr(C)`, 48 bytes and 8-aligned (asserted above),
            // so `self` is valid for an aligned 48-byte write. Every field is an integer, so
            // any bytes are a valid value, and on a little-endian machine the words' bytes
            // are the fields `from_words` extracts, in memory order (the packing test pins
            // it); the top 16 bits of the last word land in the two bytes of tail padding,
            // which `from_words` ignores too.
            unsafe { std::ptr::from_mut(self).cast::<[u64; 6]>().write(words) };
        }
        #[cfg(not(target_endian = "little"))]
        {
            *self = WorkCompletion::from_words(words);
        }
    }

    /// [`WorkCompletion::set_from_words`] with word `i` taken from `word(i)`, each stored as
    /// soon as it is read: one register carries the copy instead of six, which leaves the
    /// poll loop room for its own.
    #[inline(always)]
    pub(crate) fn set_from_word_fn(&mut self, word: impl Fn(usize) -> u64) {
        #[cfg(target_endian = "little")]
        {
            let base = std::ptr::from_mut(self).cast::<u64>();
            for i in 0..6 {
                // SAFETY: as in `set_from_words`: `self` is 48 bytes, 8-aligned, all
                // integers, in the words' memory order; `i < 6` keeps the write inside it.
                unsafe { base.add(i).write(word(i)) };
            }
        }
        #[cfg(not(target_endian = "little"))]
        {
            *self = WorkCompletion::from_words(std::array::from_fn(word));
        }
    }
}

impl fmt::Debug for WorkCompletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.result() {
            Ok(done) => done.fmt(f),
            Err(failed) => failed.fmt(f),
        }
    }
}

/// Every field of a [`WorkCompletion`] as stored, for the C boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct RawFields {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` in network order, or `invalidated_rkey`: the C union.
    pub imm_or_rkey: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// A successful completion: every field is valid.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Completed<'a>(&'a WorkCompletion);

impl Completed<'_> {
    /// The work request id.
    pub const fn wr_id(&self) -> u64 {
        self.0.wr_id
    }
    /// The operation that completed.
    pub const fn opcode(&self) -> WcOpcode {
        WcOpcode::from_raw(self.0.opcode)
    }
    /// Bytes transferred (receive: bytes placed, plus 40 for UD's GRH area; RDMA read:
    /// bytes read; atomics: 8).
    pub const fn byte_len(&self) -> u32 {
        self.0.byte_len
    }
    /// The immediate data in host order, when `IBV_WC_WITH_IMM` is set.
    pub const fn imm_data(&self) -> Option<u32> {
        if self.0.wc_flags & WcFlags::WITH_IMM.bits() != 0 {
            Some(u32::from_be(self.0.imm_or_rkey))
        } else {
            None
        }
    }
    /// The immediate data exactly as stored in `struct ibv_wc` (network byte order), when
    /// `IBV_WC_WITH_IMM` is set.
    pub const fn imm_data_raw(&self) -> Option<u32> {
        if self.0.wc_flags & WcFlags::WITH_IMM.bits() != 0 {
            Some(self.0.imm_or_rkey)
        } else {
            None
        }
    }
    /// The rkey a send with invalidate invalidated, when `IBV_WC_WITH_INV` is set.
    pub const fn invalidated_rkey(&self) -> Option<u32> {
        if self.0.wc_flags & WcFlags::WITH_INV.bits() != 0 {
            Some(self.0.imm_or_rkey)
        } else {
            None
        }
    }
    /// The local QP number.
    pub const fn qp_num(&self) -> u32 {
        self.0.qp_num
    }
    /// The remote QP number (UD).
    pub const fn src_qp(&self) -> u32 {
        self.0.src_qp
    }
    /// The completion flags.
    pub const fn flags(&self) -> WcFlags {
        WcFlags::from_bits_retain(self.0.wc_flags)
    }
    /// The P_Key index (GSI only).
    pub const fn pkey_index(&self) -> u16 {
        self.0.pkey_index
    }
    /// The source LID (UD; 0 on RoCE).
    pub const fn slid(&self) -> u16 {
        self.0.slid
    }
    /// The service level (UD).
    pub const fn sl(&self) -> u8 {
        self.0.sl
    }
    /// The destination LID path bits (UD; 0 on RoCE).
    pub const fn dlid_path_bits(&self) -> u8 {
        self.0.dlid_path_bits
    }
    /// The whole completion.
    pub const fn completion(&self) -> &WorkCompletion {
        self.0
    }
}

impl fmt::Debug for Completed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("Completed");
        s.field("wr_id", &self.wr_id())
            .field("opcode", &self.opcode())
            .field("byte_len", &self.byte_len())
            .field("qp_num", &self.qp_num());
        if let Some(imm) = self.imm_data() {
            s.field("imm_data", &format_args!("{imm:#x}"));
        }
        if let Some(rkey) = self.invalidated_rkey() {
            s.field("invalidated_rkey", &format_args!("{rkey:#x}"));
        }
        if self.src_qp() != 0 {
            s.field("src_qp", &self.src_qp());
        }
        if !self.flags().is_empty() {
            s.field("flags", &self.flags());
        }
        s.finish()
    }
}

/// A failed completion: only `wr_id`, `status`, `qp_num` and `vendor_err` are valid
/// (`ibv_poll_cq(3)`), so only those can be read.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Failed<'a>(&'a WorkCompletion);

impl Failed<'_> {
    /// The work request id.
    pub const fn wr_id(&self) -> u64 {
        self.0.wr_id
    }
    /// Why it failed.
    pub const fn status(&self) -> WcStatus {
        WcStatus::from_raw(self.0.status)
    }
    /// The local QP number.
    pub const fn qp_num(&self) -> u32 {
        self.0.qp_num
    }
    /// The vendor error syndrome.
    pub const fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }
    /// The whole completion.
    pub const fn completion(&self) -> &WorkCompletion {
        self.0
    }
}

impl fmt::Debug for Failed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Failed")
            .field("wr_id", &self.wr_id())
            .field("status", &self.status())
            .field("qp_num", &self.qp_num())
            .field("vendor_err", &self.vendor_err())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_raw_values_round_trip_and_unknown_values_survive() {
        // verbs.h: enum ibv_wc_status counts from IBV_WC_SUCCESS = 0 in declaration order.
        for (raw, status) in WcStatus::ALL.iter().enumerate() {
            assert_eq!(status.to_raw(), raw as u32);
            assert_eq!(WcStatus::from_raw(raw as u32), *status);
        }
        assert_eq!(WcStatus::from_raw(99), WcStatus::Unknown(99));
        assert_eq!(WcStatus::Unknown(99).to_raw(), 99);
        assert_eq!(WcStatus::Unknown(99).as_str(), "unknown");
    }

    #[test]
    fn opcode_receive_bit_is_what_verbs_h_says() {
        // verbs.h: "consumers can test if a completion is a receive by testing
        // (opcode & IBV_WC_RECV)".
        assert!(WcOpcode::Recv.is_receive());
        assert!(WcOpcode::RecvRdmaWithImm.is_receive());
        assert!(!WcOpcode::RdmaRead.is_receive());
        for raw in 0..300 {
            assert_eq!(WcOpcode::from_raw(raw).to_raw(), raw);
        }
    }

    #[test]
    fn imm_data_is_stored_in_network_order_and_read_in_host_order() {
        // verbs.h: "When (wc_flags & IBV_WC_WITH_IMM): Immediate data in network byte order."
        let wc = WorkCompletion::success(1, WcOpcode::Recv, 2).with_imm(0x0102_0304);
        let bytes: [u8; 48] = unsafe_free_bytes(&wc);
        assert_eq!(&bytes[24..28], &[1, 2, 3, 4]);
        let done = wc.result().unwrap();
        assert_eq!(done.imm_data(), Some(0x0102_0304));
        assert_eq!(done.imm_data_raw(), Some(u32::from_ne_bytes([1, 2, 3, 4])));
        assert_eq!(done.invalidated_rkey(), None);
        assert!(done.flags().contains(WcFlags::WITH_IMM));
    }

    #[test]
    fn invalidated_rkey_is_host_order_and_excludes_imm() {
        let wc = WorkCompletion::success(1, WcOpcode::Recv, 2)
            .with_imm(5)
            .with_invalidated_rkey(0xabcd);
        let done = wc.result().unwrap();
        assert_eq!(done.invalidated_rkey(), Some(0xabcd));
        assert_eq!(done.imm_data(), None);
        assert_eq!(
            done.flags() & (WcFlags::WITH_IMM | WcFlags::WITH_INV),
            WcFlags::WITH_INV
        );
    }

    #[test]
    fn failed_completion_exposes_only_the_fields_valid_on_error() {
        // ibv_poll_cq(3): "If the completion status is other than IBV_WC_SUCCESS, only the
        // following attributes are valid: wr_id, status, qp_num, and vendor_err."
        let wc = WorkCompletion::failure(9, WcStatus::RemAccessErr, 0x42, 0x77);
        let failed = wc.result().unwrap_err();
        assert_eq!(failed.wr_id(), 9);
        assert_eq!(failed.status(), WcStatus::RemAccessErr);
        assert_eq!(failed.qp_num(), 0x42);
        assert_eq!(failed.vendor_err(), 0x77);
        assert_eq!(wc.status(), WcStatus::RemAccessErr);
    }

    #[test]
    fn word_packing_round_trips_every_field() {
        let wc = WorkCompletion::from_raw(RawFields {
            wr_id: 0x1122_3344_5566_7788,
            status: 12,
            opcode: 129,
            vendor_err: 0xdead,
            byte_len: 4096,
            imm_or_rkey: 0xfeed_beef,
            qp_num: 0xff_ffff,
            src_qp: 0x12_3456,
            wc_flags: 0x7f,
            pkey_index: 0xffff,
            slid: 0xabcd,
            sl: 15,
            dlid_path_bits: 0x7f,
        });
        assert_eq!(WorkCompletion::from_words(wc.to_words()), wc);
        // The poll loop's whole-word copy gives the same completion, whatever the bits that
        // fall in the tail padding.
        let mut words = wc.to_words();
        words[5] |= 0xa5a5 << 48;
        let mut copied = WorkCompletion::default();
        copied.set_from_words(words);
        assert_eq!(copied, wc);
        assert_eq!(copied, WorkCompletion::from_words(words));
        let mut streamed = WorkCompletion::default();
        streamed.set_from_word_fn(|i| words[i]);
        assert_eq!(streamed, wc);
        // Word packing matches the memory image on little-endian machines.
        #[cfg(target_endian = "little")]
        {
            let bytes = unsafe_free_bytes(&wc);
            let mut words = [0u64; 6];
            for (i, w) in words.iter_mut().enumerate() {
                *w = u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
            }
            assert_eq!(words, wc.to_words());
        }
    }

    /// The memory image of a completion built field by field (no unsafe needed).
    fn unsafe_free_bytes(wc: &WorkCompletion) -> [u8; 48] {
        let r = wc.raw();
        let mut b = [0u8; 48];
        b[0..8].copy_from_slice(&r.wr_id.to_ne_bytes());
        b[8..12].copy_from_slice(&r.status.to_ne_bytes());
        b[12..16].copy_from_slice(&r.opcode.to_ne_bytes());
        b[16..20].copy_from_slice(&r.vendor_err.to_ne_bytes());
        b[20..24].copy_from_slice(&r.byte_len.to_ne_bytes());
        b[24..28].copy_from_slice(&r.imm_or_rkey.to_ne_bytes());
        b[28..32].copy_from_slice(&r.qp_num.to_ne_bytes());
        b[32..36].copy_from_slice(&r.src_qp.to_ne_bytes());
        b[36..40].copy_from_slice(&r.wc_flags.to_ne_bytes());
        b[40..42].copy_from_slice(&r.pkey_index.to_ne_bytes());
        b[42..44].copy_from_slice(&r.slid.to_ne_bytes());
        b[44] = r.sl;
        b[45] = r.dlid_path_bits;
        b
    }
}
