//! CM management datagrams: the common MAD header (IBTA 13.4.2) and every Communication
//! Manager message (IBTA 12.6, 12.11) as a parsed struct.
//!
//! A CM MAD is 256 bytes: a 24-byte common header and 232 bytes of message. Each message
//! type has `parse(&[u8]) -> Result<Self, CmParseError>` (the whole MAD, header included;
//! any input gives a value or an error, never a panic) and `write(&self, &mut [u8; 256])`
//! (the whole MAD; reserved bits are written as zero). Bit fields are numbered as the IBTA
//! tables do: byte offset within the message (after the common header) and bit offset from
//! the most significant bit of that byte; multi-byte fields are big-endian.
//!
//! Private data areas have the fixed sizes of the IBTA tables ([`REQ_PRIVATE_DATA_LEN`] …)
//! and are held as arrays, so a message can always be written.

use std::fmt;

/// Size of every MAD (IBTA 13.4.1).
pub const MAD_LEN: usize = 256;
/// Size of the common MAD header (IBTA 13.4.2); CM message offsets start after it.
pub const MAD_HEADER_LEN: usize = 24;
/// `BaseVersion` of every MAD (IBTA 13.4.2).
pub const BASE_VERSION: u8 = 1;
/// `MgmtClass` of the Communication Manager (IBTA 13.4.4, table 136).
pub const MGMT_CLASS_CM: u8 = 0x07;
/// `ClassVersion` of the CM (IBTA 12.6.1: version 2).
pub const CM_CLASS_VERSION: u8 = 2;
/// `Method` SEND (IBTA 13.4.5, table 137): all CM protocol messages use it.
pub const METHOD_SEND: u8 = 0x03;
/// Q_Key of the general services interface, QP1 (IBTA 13.5.1).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The "permissive" LID the kernel's CM writes in the path LIDs of a routed (RoCE) path.
pub const PERMISSIVE_LID: u16 = 0xFFFF;

/// Private data size of REQ (IBTA 12.6.5, table 106).
pub const REQ_PRIVATE_DATA_LEN: usize = 92;
/// Private data size of MRA (IBTA 12.6.6).
pub const MRA_PRIVATE_DATA_LEN: usize = 222;
/// Private data size of REJ (IBTA 12.6.7).
pub const REJ_PRIVATE_DATA_LEN: usize = 148;
/// Size of REJ's Additional Rejection Information (IBTA 12.6.7).
pub const REJ_ARI_LEN: usize = 72;
/// Private data size of REP (IBTA 12.6.8).
pub const REP_PRIVATE_DATA_LEN: usize = 196;
/// Private data size of RTU (IBTA 12.6.9).
pub const RTU_PRIVATE_DATA_LEN: usize = 224;
/// Private data size of DREQ (IBTA 12.6.10).
pub const DREQ_PRIVATE_DATA_LEN: usize = 220;
/// Private data size of DREP (IBTA 12.6.11).
pub const DREP_PRIVATE_DATA_LEN: usize = 224;
/// Private data size of SIDR_REQ (IBTA 12.11.1).
pub const SIDR_REQ_PRIVATE_DATA_LEN: usize = 216;
/// Private data size of SIDR_REP (IBTA 12.11.2).
pub const SIDR_REP_PRIVATE_DATA_LEN: usize = 136;
/// Size of SIDR_REP's additional information (IBTA 12.11.2).
pub const SIDR_REP_INFO_LEN: usize = 72;

/// Why bytes are not a CM MAD this crate accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CmParseError {
    /// Fewer than [`MAD_LEN`] bytes.
    #[error("MAD truncated: {len} bytes, a MAD is 256")]
    Truncated {
        /// Bytes received.
        len: usize,
    },
    /// More than [`MAD_LEN`] bytes.
    #[error("MAD too long: {len} bytes, a MAD is 256")]
    TooLong {
        /// Bytes received.
        len: usize,
    },
    /// `BaseVersion` is not 1.
    #[error("MAD base version {0}, expected 1")]
    BaseVersion(u8),
    /// `MgmtClass` is not the CM's.
    #[error("management class {0:#04x} is not the CM (0x07)")]
    MgmtClass(u8),
    /// `ClassVersion` is not 2.
    #[error("CM class version {0}, expected 2")]
    ClassVersion(u8),
    /// `Method` is not SEND.
    #[error("CM method {0:#04x}, expected SEND (0x03)")]
    Method(u8),
    /// An attribute ID the CM does not define.
    #[error("unknown CM attribute ID {0:#06x}")]
    UnknownAttribute(u16),
    /// A message parser was given a MAD of another attribute.
    #[error("attribute ID {found:#06x}, expected {expected:#06x}")]
    WrongAttribute {
        /// The attribute the parser reads.
        expected: u16,
        /// The attribute of the MAD.
        found: u16,
    },
    /// A field holds a value its table does not allow.
    #[error("invalid {field}: {value}")]
    InvalidField {
        /// Field name as in the IBTA table.
        field: &'static str,
        /// The value found.
        value: u64,
    },
}

/// CM attribute IDs (IBTA 12.6.1, table 104).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttributeId {
    /// ClassPortInfo, 0x0001.
    ClassPortInfo,
    /// ConnectRequest, 0x0010.
    Req,
    /// MsgRcptAck, 0x0011.
    Mra,
    /// ConnectReject, 0x0012.
    Rej,
    /// ConnectReply, 0x0013.
    Rep,
    /// ReadyToUse, 0x0014.
    Rtu,
    /// DisconnectRequest, 0x0015.
    Dreq,
    /// DisconnectReply, 0x0016.
    Drep,
    /// ServiceIDResReq, 0x0017.
    SidrReq,
    /// ServiceIDResReqResp, 0x0018.
    SidrRep,
    /// LoadAlternatePath, 0x0019.
    Lap,
    /// AlternatePathResponse, 0x001A.
    Apr,
    /// Anything else.
    Unknown(u16),
}

impl AttributeId {
    /// The wire value.
    pub fn value(self) -> u16 {
        match self {
            Self::ClassPortInfo => 0x0001,
            Self::Req => 0x0010,
            Self::Mra => 0x0011,
            Self::Rej => 0x0012,
            Self::Rep => 0x0013,
            Self::Rtu => 0x0014,
            Self::Dreq => 0x0015,
            Self::Drep => 0x0016,
            Self::SidrReq => 0x0017,
            Self::SidrRep => 0x0018,
            Self::Lap => 0x0019,
            Self::Apr => 0x001A,
            Self::Unknown(v) => v,
        }
    }
}

impl From<u16> for AttributeId {
    fn from(v: u16) -> Self {
        match v {
            0x0001 => Self::ClassPortInfo,
            0x0010 => Self::Req,
            0x0011 => Self::Mra,
            0x0012 => Self::Rej,
            0x0013 => Self::Rep,
            0x0014 => Self::Rtu,
            0x0015 => Self::Dreq,
            0x0016 => Self::Drep,
            0x0017 => Self::SidrReq,
            0x0018 => Self::SidrRep,
            0x0019 => Self::Lap,
            0x001A => Self::Apr,
            other => Self::Unknown(other),
        }
    }
}

/// The common MAD header (IBTA 13.4.2, table 131), bytes 0..24 of every MAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MadHeader {
    /// Byte 0.
    pub base_version: u8,
    /// Byte 1.
    pub mgmt_class: u8,
    /// Byte 2.
    pub class_version: u8,
    /// Byte 3: the R (response) bit and the method.
    pub method: u8,
    /// Bytes 4..6.
    pub status: u16,
    /// Bytes 6..8.
    pub class_specific: u16,
    /// Bytes 8..16.
    pub transaction_id: u64,
    /// Bytes 16..18 (18..20 reserved).
    pub attribute_id: u16,
    /// Bytes 20..24.
    pub attribute_modifier: u32,
}

impl MadHeader {
    /// The header of a CM SEND MAD with this attribute and transaction ID.
    pub fn cm(attribute: AttributeId, transaction_id: u64) -> Self {
        Self {
            base_version: BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            status: 0,
            class_specific: 0,
            transaction_id,
            attribute_id: attribute.value(),
            attribute_modifier: 0,
        }
    }

    /// Reads the header of a MAD: checks the length only (exactly [`MAD_LEN`] bytes).
    pub fn parse(bytes: &[u8]) -> Result<Self, CmParseError> {
        let mad = mad_bytes(bytes)?;
        Ok(Self {
            base_version: mad[0],
            mgmt_class: mad[1],
            class_version: mad[2],
            method: mad[3],
            status: be16(mad, 4),
            class_specific: be16(mad, 6),
            transaction_id: be64(mad, 8),
            attribute_id: be16(mad, 16),
            attribute_modifier: be32(mad, 20),
        })
    }

    /// Reads the header and checks it is a CM SEND MAD (base version 1, class 0x07, class
    /// version 2, method SEND).
    pub fn parse_cm(bytes: &[u8]) -> Result<Self, CmParseError> {
        let h = Self::parse(bytes)?;
        if h.base_version != BASE_VERSION {
            return Err(CmParseError::BaseVersion(h.base_version));
        }
        if h.mgmt_class != MGMT_CLASS_CM {
            return Err(CmParseError::MgmtClass(h.mgmt_class));
        }
        if h.class_version != CM_CLASS_VERSION {
            return Err(CmParseError::ClassVersion(h.class_version));
        }
        if h.method != METHOD_SEND {
            return Err(CmParseError::Method(h.method));
        }
        Ok(h)
    }

    /// The attribute ID as an enum.
    pub fn attribute(&self) -> AttributeId {
        AttributeId::from(self.attribute_id)
    }

    /// Writes bytes 0..24 (and zeroes the reserved bytes 18..20).
    pub fn write(&self, mad: &mut [u8; MAD_LEN]) {
        mad[0] = self.base_version;
        mad[1] = self.mgmt_class;
        mad[2] = self.class_version;
        mad[3] = self.method;
        put16(mad, 4, self.status);
        put16(mad, 6, self.class_specific);
        put64(mad, 8, self.transaction_id);
        put16(mad, 16, self.attribute_id);
        put16(mad, 18, 0);
        put32(mad, 20, self.attribute_modifier);
    }
}

fn mad_bytes(bytes: &[u8]) -> Result<&[u8; MAD_LEN], CmParseError> {
    match bytes.len() {
        MAD_LEN => bytes
            .try_into()
            .map_err(|_| CmParseError::Truncated { len: bytes.len() }),
        len if len < MAD_LEN => Err(CmParseError::Truncated { len }),
        len => Err(CmParseError::TooLong { len }),
    }
}

/// Checks the CM header and the attribute; returns the MAD and its transaction ID.
fn open(bytes: &[u8], attribute: AttributeId) -> Result<(&[u8; MAD_LEN], u64), CmParseError> {
    let header = MadHeader::parse_cm(bytes)?;
    if header.attribute_id != attribute.value() {
        return Err(CmParseError::WrongAttribute {
            expected: attribute.value(),
            found: header.attribute_id,
        });
    }
    let mad = mad_bytes(bytes)?;
    Ok((mad, header.transaction_id))
}

/// Starts a MAD: zeroes it and writes the CM header.
fn start(mad: &mut [u8; MAD_LEN], attribute: AttributeId, transaction_id: u64) {
    mad.fill(0);
    MadHeader::cm(attribute, transaction_id).write(mad);
}

// Field access: `o` is an offset in the CM message (after the 24-byte header), as in the
// IBTA tables.
const H: usize = MAD_HEADER_LEN;

fn be16(m: &[u8; MAD_LEN], at: usize) -> u16 {
    u16::from_be_bytes([m[at], m[at + 1]])
}
fn be32(m: &[u8; MAD_LEN], at: usize) -> u32 {
    u32::from_be_bytes([m[at], m[at + 1], m[at + 2], m[at + 3]])
}
fn be64(m: &[u8; MAD_LEN], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&m[at..at + 8]);
    u64::from_be_bytes(b)
}
fn put16(m: &mut [u8; MAD_LEN], at: usize, v: u16) {
    m[at..at + 2].copy_from_slice(&v.to_be_bytes());
}
fn put32(m: &mut [u8; MAD_LEN], at: usize, v: u32) {
    m[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
fn put64(m: &mut [u8; MAD_LEN], at: usize, v: u64) {
    m[at..at + 8].copy_from_slice(&v.to_be_bytes());
}
/// A 24-bit field in the top three bytes of the 32-bit word at message offset `o`.
fn get24(m: &[u8; MAD_LEN], o: usize) -> u32 {
    be32(m, H + o) >> 8
}
fn put24(m: &mut [u8; MAD_LEN], o: usize, v: u32) {
    let low = m[H + o + 3];
    put32(m, H + o, ((v & 0x00FF_FFFF) << 8) | u32::from(low));
}
/// `width` bits of message byte `o`, starting `bit` bits from its most significant bit.
fn bits(m: &[u8; MAD_LEN], o: usize, bit: u32, width: u32) -> u8 {
    let shift = 8 - bit - width;
    (m[H + o] >> shift) & ((1u16 << width) - 1) as u8
}
fn put_bits(m: &mut [u8; MAD_LEN], o: usize, bit: u32, width: u32, v: u8) {
    let shift = 8 - bit - width;
    let mask = (((1u16 << width) - 1) as u8) << shift;
    m[H + o] = (m[H + o] & !mask) | ((v << shift) & mask);
}
fn array<const N: usize>(m: &[u8; MAD_LEN], o: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&m[H + o..H + o + N]);
    a
}
fn put_array(m: &mut [u8; MAD_LEN], o: usize, a: &[u8]) {
    m[H + o..H + o + a.len()].copy_from_slice(a);
}

/// A path as a REQ carries it (IBTA 12.6.5, primary at message byte 52, alternate at 96).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReqPath {
    /// Local port LID (the sender's); 0xFFFF ("permissive") on a routed RoCE path.
    pub local_lid: u16,
    /// Remote port LID; 0xFFFF on a routed RoCE path.
    pub remote_lid: u16,
    /// The sender's port GID.
    pub local_gid: [u8; 16],
    /// The receiver's port GID.
    pub remote_gid: [u8; 16],
    /// 20-bit flow label.
    pub flow_label: u32,
    /// 6-bit packet rate (IBTA rate encoding).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// 4-bit service level.
    pub sl: u8,
    /// Subnet local: 1 when the path does not leave the subnet (the kernel sets it when the
    /// hop limit is ≤ 1, so 0 on routed RoCEv2).
    pub subnet_local: bool,
    /// 5-bit local ACK timeout (4.096 µs × 2^t).
    pub local_ack_timeout: u8,
}

impl ReqPath {
    fn read(m: &[u8; MAD_LEN], o: usize) -> Self {
        Self {
            local_lid: be16(m, H + o),
            remote_lid: be16(m, H + o + 2),
            local_gid: array(m, o + 4),
            remote_gid: array(m, o + 20),
            flow_label: be32(m, H + o + 36) >> 12,
            packet_rate: bits(m, o + 39, 2, 6),
            traffic_class: m[H + o + 40],
            hop_limit: m[H + o + 41],
            sl: bits(m, o + 42, 0, 4),
            subnet_local: bits(m, o + 42, 4, 1) != 0,
            local_ack_timeout: bits(m, o + 43, 0, 5),
        }
    }

    fn write(&self, m: &mut [u8; MAD_LEN], o: usize) {
        put16(m, H + o, self.local_lid);
        put16(m, H + o + 2, self.remote_lid);
        put_array(m, o + 4, &self.local_gid);
        put_array(m, o + 20, &self.remote_gid);
        let low = m[H + o + 39];
        put32(
            m,
            H + o + 36,
            ((self.flow_label & 0xF_FFFF) << 12) | u32::from(low),
        );
        // Byte 39's top two bits are reserved (IBTA 12.6.5): zero.
        m[H + o + 39] = 0;
        put_bits(m, o + 39, 2, 6, self.packet_rate);
        m[H + o + 40] = self.traffic_class;
        m[H + o + 41] = self.hop_limit;
        put_bits(m, o + 42, 0, 4, self.sl);
        put_bits(m, o + 42, 4, 1, u8::from(self.subnet_local));
        put_bits(m, o + 43, 0, 5, self.local_ack_timeout);
    }
}

/// ConnectRequest, REQ (IBTA 12.6.5, table 106).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Req {
    /// MAD TransactionID.
    pub transaction_id: u64,
    /// Byte 0: the sender's communication ID.
    pub local_comm_id: u32,
    /// Byte 8.
    pub service_id: u64,
    /// Byte 16: the sender's CA GUID.
    pub local_ca_guid: u64,
    /// Byte 28 (meaningful for RD only).
    pub local_qkey: u32,
    /// Byte 32, 24 bits: the sender's QPN.
    pub local_qpn: u32,
    /// Byte 35.
    pub responder_resources: u8,
    /// Byte 36, 24 bits.
    pub local_eecn: u32,
    /// Byte 39.
    pub initiator_depth: u8,
    /// Byte 40, 24 bits.
    pub remote_eecn: u32,
    /// Byte 43 bits 0..5: how long the receiver's CM may take to answer (4.096 µs × 2^t).
    pub remote_cm_response_timeout: u8,
    /// Byte 43 bits 5..7: 0 RC, 1 UC, 2 RD, 3 reserved (XRC uses the extended type).
    pub transport_service_type: u8,
    /// Byte 43 bit 7.
    pub end_to_end_flow_control: bool,
    /// Byte 44, 24 bits.
    pub starting_psn: u32,
    /// Byte 47 bits 0..5: how long the sender's CM may take to answer.
    pub local_cm_response_timeout: u8,
    /// Byte 47 bits 5..8.
    pub retry_count: u8,
    /// Byte 48.
    pub partition_key: u16,
    /// Byte 50 bits 0..4: IBTA MTU encoding (1 = 256 … 5 = 4096).
    pub path_mtu: u8,
    /// Byte 50 bit 4.
    pub rdc_exists: bool,
    /// Byte 50 bits 5..8.
    pub rnr_retry_count: u8,
    /// Byte 51 bits 0..4.
    pub max_cm_retries: u8,
    /// Byte 51 bit 4.
    pub srq: bool,
    /// Byte 51 bits 5..8.
    pub extended_transport_type: u8,
    /// Bytes 52..96.
    pub primary_path: ReqPath,
    /// Bytes 96..140 (all zero when there is no alternate path).
    pub alternate_path: ReqPath,
    /// Byte 139 bit 5.
    pub sap_supported: bool,
    /// Bytes 140..232.
    pub private_data: [u8; REQ_PRIVATE_DATA_LEN],
}

impl Req {
    /// Parses a whole MAD.
    pub fn parse(bytes: &[u8]) -> Result<Self, CmParseError> {
        let (m, tid) = open(bytes, AttributeId::Req)?;
        Ok(Self {
            transaction_id: tid,
            local_comm_id: be32(m, H),
            service_id: be64(m, H + 8),
            local_ca_guid: be64(m, H + 16),
            local_qkey: be32(m, H + 28),
            local_qpn: get24(m, 32),
            responder_resources: m[H + 35],
            local_eecn: get24(m, 36),
            initiator_depth: m[H + 39],
            remote_eecn: get24(m, 40),
            remote_cm_response_timeout: bits(m, 43, 0, 5),
            transport_service_type: bits(m, 43, 5, 2),
            end_to_end_flow_control: bits(m, 43, 7, 1) != 0,
            starting_psn: get24(m, 44),
            local_cm_response_timeout: bits(m, 47, 0, 5),
            retry_count: bits(m, 47, 5, 3),
            partition_key: be16(m, H + 48),
            path_mtu: bits(m, 50, 0, 4),
            rdc_exists: bits(m, 50, 4, 1) != 0,
            rnr_retry_count: bits(m, 50, 5, 3),
            max_cm_retries: bits(m, 51, 0, 4),
            srq: bits(m, 51, 4, 1) != 0,
            extended_transport_type: bits(m, 51, 5, 3),
            primary_path: ReqPath::read(m, 52),
            alternate_path: ReqPath::read(m, 96),
            sap_supported: bits(m, 139, 5, 1) != 0,
            private_data: array(m, 140),
        })
    }

    /// Writes the whole MAD.
    pub fn write(&self, mad: &mut [u8; MAD_LEN]) {
        start(mad, AttributeId::Req, self.transaction_id);
        put32(mad, H, self.local_comm_id);
        put64(mad, H + 8, self.service_id);
        put64(mad, H + 16, self.local_ca_guid);
        put32(mad, H + 28, self.local_qkey);
        put24(mad, 32, self.local_qpn);
        mad[H + 35] = self.responder_resources;
        put24(mad, 36, self.local_eecn);
        mad[H + 39] = self.initiator_depth;
        put24(mad, 40, self.remote_eecn);
        put_bits(mad, 43, 0, 5, self.remote_cm_response_timeout);
        put_bits(mad, 43, 5, 2, self.transport_service_type);
        put_bits(mad, 43, 7, 1, u8::from(self.end_to_end_flow_control));
        put24(mad, 44, self.starting_psn);
        put_bits(mad, 47, 0, 5, self.local_cm_response_timeout);
        put_bits(mad, 47, 5, 3, self.retry_count);
        put16(mad, H + 48, self.partition_key);
        put_bits(mad, 50, 0, 4, self.path_mtu);
        put_bits(mad, 50, 4, 1, u8::from(self.rdc_exists));
        put_bits(mad, 50, 5, 3, self.rnr_retry_count);
        put_bits(mad, 51, 0, 4, self.max_cm_retries);
        put_bits(mad, 51, 4, 1, u8::from(self.srq));
        put_bits(mad, 51, 5, 3, self.extended_transport_type);
        self.primary_path.write(mad, 52);
        self.alternate_path.write(mad, 96);
        put_bits(mad, 139, 5, 1, u8::from(self.sap_supported));
        put_array(mad, 140, &self.private_data);
    }
}

/// Which message an MRA or REJ refers to (IBTA 12.6.6, 12.6.7: 2 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageKind {
    /// 0: the REQ.
    Req,
    /// 1: the REP.
    Rep,
    /// 2: the LAP.
    Lap,
    /// 3: reserved.
    Other,
}

impl MessageKind {
    /// The 2-bit wire value.
    pub fn value(self) -> u8 {
        match self {
            Self::Req => 0,
            Self::Rep => 1,
            Self::Lap => 2,
            Self::Other => 3,
        }
    }

    fn from_bits(v: u8) -> Self {
        match v {
            0 => Self::Req,
            1 => Self::Rep,
            2 => Self::Lap,
            _ => Self::Other,
        }
    }
}

/// MsgRcptAck, MRA (IBTA 12.6.6, table 107).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mra {
    /// MAD TransactionID (the acknowledged message's).
    pub transaction_id: u64,
    /// Byte 0.
    pub local_comm_id: u32,
    /// Byte 4.
    pub remote_comm_id: u32,
    /// Byte 8 bits 0..2.
    pub message_mraed: MessageKind,
    /// Byte 9 bits 0..5: extra time the sender needs (4.096 µs × 2^t).
    pub service_timeout: u8,
    /// Bytes 10..232.
    pub private_data: [u8; MRA_PRIVATE_DATA_LEN],
}

impl Mra {
    /// Parses a whole MAD.
    pub fn parse(bytes: &[u8]) -> Result<Self, CmParseError> {
        let (m, tid) = open(bytes, AttributeId::Mra)?;
        Ok(Self {
            transaction_id: tid,
            local_comm_id: be32(m, H),
            remote_comm_id: be32(m, H + 4),
            message_mraed: MessageKind::from_bits(bits(m, 8, 0, 2)),
            service_timeout: bits(m, 9, 0, 5),
            private_data: array(m, 10),
        })
    }

    /// Writes the whole MAD.
    pub fn write(&self, mad: &mut [u8; MAD_LEN]) {
        start(mad, AttributeId::Mra, self.transaction_id);
        put32(mad, H, self.local_comm_id);
        put32(mad, H + 4, self.remote_comm_id);
        put_bits(mad, 8, 0, 2, self.message_mraed.value());
        put_bits(mad, 9, 0, 5, self.service_timeout);
        put_array(mad, 10, &self.private_data);
    }
}

/// REJ reasons (IBTA 12.6.7.2, table 109) this crate uses by name.
pub mod reject_reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// No resources available.
    pub const NO_RESOURCES: u16 = 3;
    /// Timeout (the ARI holds the sender's CA GUID).
    pub const TIMEOUT: u16 = 4;
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: u16 = 6;
    /// Invalid communication instance.
    pub const INVALID_COMM_INSTANCE: u16 = 7;
    /// Invalid service ID: nobody listens (what Linux answers over RoCE).
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Invalid transport service type.
    pub const INVALID_TRANSPORT_TYPE: u16 = 9;
    /// Stale connection.
    pub const STALE_CONNECTION: u16 = 10;
    /// Consumer reject (private data carries the consumer's reason).
    pub const CONSUMER: u16 = 28;
}

/// ConnectReject, REJ (IBTA 12.6.7, table 108).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rej {
    /// MAD TransactionID (the rejected message's).
    pub transaction_id: u64,
    /// Byte 0: the sender's communication ID (0 if it has none).
    pub local_comm_id: u32,
    /// Byte 4: the receiver's communication ID.
    pub remote_comm_id: u32,
    /// Byte 8 bits 0..2.
    pub message_rejected: MessageKind,
    /// Byte 9 bits 0..7: bytes of `ari` used.
    pub reject_info_length: u8,
    /// Byte 10.
    pub reason: u16,
    /// Bytes 12..84: Additional Rejection Information.
    pub ari: [u8; REJ_ARI_LEN],
    /// Bytes 84..232.
    pub private_data: [u8; REJ_PRIVATE_DATA_LEN],
}

impl Rej {
    /// Parses a whole MAD.
    pub fn parse(bytes: &[u8]) -> Result<Self, CmParseError> {
        let (m, tid) = open(bytes, AttributeId::Rej)?;
        Ok(Self {
            transaction_id: tid,
            local_comm_id: be32(m, H),
            remote_comm_id: be32(m, H + 4),
            message_rejected: MessageKind::from_bits(bits(m, 8, 0, 2)),
            reject_info_length: bits(m, 9, 0, 7),
            reason: be16(m, H + 10),
            ari: array(m, 12),
            private_data: array(m, 84),
        })
    }

    /// Writes the whole MAD.
    pub fn write(&self, mad: &mut [u8; MAD_LEN]) {
        start(mad, AttributeId::Rej, self.transaction_id);
        put32(mad, H, self.local_comm_id);
        put32(mad, H + 4, self.remote_comm_id);
        put_bits(mad, 8, 0, 2, self.message_rejected.value());
        put_bits(mad, 9, 0, 7, self.reject_info_length);
        put16(mad, H + 10, self.reason);
        put_array(mad, 12, &self.ari);
        put_array(mad, 84, &self.private_data);
    }

    /// The used part of the ARI (`reject_info_length` bytes, at most 72).
    pub fn ari(&self) -> &[u8] {
        &self.ari[..usize::from(self.reject_info_length).min(REJ_ARI_LEN)]
    }
}

/// ConnectReply, REP (IBTA 12.6.8, table 110).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rep {
    /// MAD TransactionID (the REQ's).
    pub transaction_id: u64,
    /// Byte 0.
    pub local_comm_id: u32,
    /// Byte 4.
    pub remote_comm_id: u32,
    /// Byte 8.
    pub local_qkey: u32,
    /// Byte 12, 24 bits.
    pub local_qpn: u32,
    /// Byte 16, 24 bits.
    pub local_eecn: u32,
    /// Byte 20, 24 bits.
    pub starting_psn: u32,
    /// Byte 24.
    pub responder_resources: u8,
    /// Byte 25.
    pub initiator_depth: u8,
    /// Byte 26 bits 0..5.
    pub target_ack_delay: u8,
    /// Byte 26 bits 5..7: 0 accepted, 1 not supported, 2 rejected.
    pub failover_accepted: u8,
    /// Byte 26 bit 7.
    pub end_to_end_flow_control: bool,
    /// Byte 27 bits 0..3.
    pub rnr_retry_count: u8,
    /// Byte 27 bit 3.
    pub srq: bool,
    /// Byte 28.
    pub local_ca_guid: u64,
    /// Bytes 36..232.
    pub private_data: [u8; REP_PRIVATE_DATA_LEN],
}

impl Rep {
    /// Parses a whole MAD.
    pub fn parse(bytes: &[u8]) -> Result<Self, CmParseError> {
        let (m, tid) = open(bytes, AttributeId::Rep)?;
        Ok(Self {
            transaction_id: tid,
            local_comm_id: be32(m, H),
            remote_comm_id: be32(m, H + 4),
            local_qkey: be32(m, H + 8),
            local_qpn: get24(m, 12),
            local_eecn: get24(m, 16),
            starting_psn: get24(m, 20),
            responder_resources: m[H + 24],
            initiator_depth: m[H + 25],
            target_ack_delay: bits(m, 26, 0, 5),
            failover_accepted: bits(m, 26, 5, 2),
            end_to_end_flow_control: bits(m, 26, 7, 1) != 0,
            rnr_retry_count: bits(m, 27, 0, 3),
            srq: bits(m, 27, 3, 1) != 0,
            local_ca_guid: be64(m, H + 28),
            private_data: array(m, 36),
        })
    }

    /// Writes the whole MAD.
    pub fn write(&self, mad: &mut [u8; MAD_LEN]) {
        start(mad, AttributeId::Rep, self.transaction_id);
        put32(mad, H, self.local_comm_id);
        put32(mad, H + 4, self.remote_comm_id);
        put32(mad, H + 8, self.local_qkey);
        put24(mad, 12, self.local_qpn);
        put24(mad, 16, self.local_eecn);
        put24(mad, 20, self.starting_psn);
        mad[H + 24] = self.responder_resources;
        mad[H + 25] = self.initiator_depth;
        put_bits(mad, 26, 0, 5, self.target_ack_delay);
        put_bits(mad, 26, 5, 2, self.failover_accepted);
        put_bits(mad, 26, 7, 1, u8::from(self.end_to_end_flow_control));
        put_bits(mad, 27, 0, 3, self.rnr_retry_count);
        put_bits(mad, 27, 3, 1, u8::from(self.srq));
        put64(mad, H + 28, self.local_ca_guid);
        put_array(mad, 36, &self.private_data);
    }
}

/// ReadyToUse, RTU (IBTA 12.6.9, table 111).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rtu {
    /// MAD TransactionID.
    pub transaction_id: u64,
    /// Byte 0.
    pub local_comm_id: u32,
    /// Byte 4.
    pub remote_comm_id: u32,
    /// Bytes 8..232.
    pub private_data: [u8; RTU_PRIVATE_DATA_LEN],
}

impl Rtu {
    /// Parses a whole MAD.
    pub fn parse(bytes: &[u8]) -> Result<Self, CmParseError> {
        let (m, tid) = open(bytes, AttributeId::Rtu)?;
        Ok(Self {
            transaction_id: tid,
            local_comm_id: be32(m, H),
            remote_comm_id: be32(m, H + 4),
            private_data: array(m, 8),
        })
    }

    /// Writes the whole MAD.
    pub fn write(&self, mad: &mut [u8; MAD_LEN]) {
        start(mad, AttributeId::Rtu, self.transaction_id);
        put32(mad, H, self.local_comm_id);
        put32(mad, H + 4, self.remote_comm_id);
        put_array(mad, 8, &self.private_data);
    }
}

/// DisconnectRequest, DREQ (IBTA 12.6.10, table 112).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dreq {
    /// MAD TransactionID.
    pub transaction_id: u64,
    /// Byte 0.
    pub local_comm_id: u32,
    /// Byte 4.
    pub remote_comm_id: u32,
    /// Byte 8, 24 bits: the receiver's QPN.
    pub remote_qpn: u32,
    /// Bytes 12..232.
    pub private_data: [u8; DREQ_PRIVATE_DATA_LEN],
}

impl Dreq {
    /// Parses a whole MAD.
    pub fn parse(bytes: &[u8]) -> Result<Self, CmParseError> {
        let (m, tid) = open(bytes, AttributeId::Dreq)?;
        Ok(Self {
            transaction_id: tid,
            local_comm_id: be32(m, H),
            remote_comm_id: be32(m, H + 4),
            remote_qpn: get24(m, 8),
            private_data: array(m, 12),
        })
    }

    /// Writes the whole MAD.
    pub fn write(&self, mad: &mut [u8; MAD_LEN]) {
        start(mad, AttributeId::Dreq, self.transaction_id);
        put32(mad, H, self.local_comm_id);
        put32(mad, H + 4, self.remote_comm_id);
        put24(mad, 8, self.remote_qpn);
        put_array(mad, 12, &self.private_data);
    }
}

/// DisconnectReply, DREP (IBTA 12.6.11, table 113).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drep {
    /// MAD TransactionID (the DREQ's).
    pub transaction_id: u64,
    /// Byte 0.
    pub local_comm_id: u32,
    /// Byte 4.
    pub remote_comm_id: u32,
    /// Bytes 8..232.
    pub private_data: [u8; DREP_PRIVATE_DATA_LEN],
}

impl Drep {
    /// Parses a whole MAD.
    pub fn parse(bytes: &[u8]) -> Result<Self, CmParseError> {
        let (m, tid) = open(bytes, AttributeId::Drep)?;
        Ok(Self {
            transaction_id: tid,
            local_comm_id: be32(m, H),
            remote_comm_id: be32(m, H + 4),
            private_data: array(m, 8),
        })
    }

    /// Writes the whole MAD.
    pub fn write(&self, mad: &mut [u8; MAD_LEN]) {
        start(mad, AttributeId::Drep, self.transaction_id);
        put32(mad, H, self.local_comm_id);
        put32(mad, H + 4, self.remote_comm_id);
        put_array(mad, 8, &self.private_data);
    }
}

/// ServiceIDResReq, SIDR_REQ (IBTA 12.11.1, table 119).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrReq {
    /// MAD TransactionID.
    pub transaction_id: u64,
    /// Byte 0.
    pub request_id: u32,
    /// Byte 4.
    pub partition_key: u16,
    /// Byte 8.
    pub service_id: u64,
    /// Bytes 16..232.
    pub private_data: [u8; SIDR_REQ_PRIVATE_DATA_LEN],
}

impl SidrReq {
    /// Parses a whole MAD.
    pub fn parse(bytes: &[u8]) -> Result<Self, CmParseError> {
        let (m, tid) = open(bytes, AttributeId::SidrReq)?;
        Ok(Self {
            transaction_id: tid,
            request_id: be32(m, H),
            partition_key: be16(m, H + 4),
            service_id: be64(m, H + 8),
            private_data: array(m, 16),
        })
    }

    /// Writes the whole MAD.
    pub fn write(&self, mad: &mut [u8; MAD_LEN]) {
        start(mad, AttributeId::SidrReq, self.transaction_id);
        put32(mad, H, self.request_id);
        put16(mad, H + 4, self.partition_key);
        put64(mad, H + 8, self.service_id);
        put_array(mad, 16, &self.private_data);
    }
}

/// SIDR_REP status values (IBTA 12.11.2, table 121).
pub mod sidr_status {
    /// The QPN and Q_Key are valid.
    pub const SUCCESS: u8 = 0;
    /// The service ID is not supported (nobody listens).
    pub const UNSUPPORTED: u8 = 1;
    /// Rejected by the service provider.
    pub const REJECT: u8 = 2;
    /// No QP available.
    pub const NO_QP: u8 = 3;
    /// Redirect (additional information holds a ClassPortInfo).
    pub const REDIRECT: u8 = 4;
    /// Unsupported SIDR class version.
    pub const UNSUPPORTED_VERSION: u8 = 5;
}

/// ServiceIDResReqResp, SIDR_REP (IBTA 12.11.2, table 120).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrRep {
    /// MAD TransactionID (the SIDR_REQ's).
    pub transaction_id: u64,
    /// Byte 0: the SIDR_REQ's request ID.
    pub request_id: u32,
    /// Byte 4 ([`sidr_status`]).
    pub status: u8,
    /// Byte 5: bytes of `additional_information` used.
    pub additional_information_length: u8,
    /// Byte 8, 24 bits.
    pub qpn: u32,
    /// Byte 12.
    pub service_id: u64,
    /// Byte 20.
    pub qkey: u32,
    /// Bytes 24..96.
    pub additional_information: [u8; SIDR_REP_INFO_LEN],
    /// Bytes 96..232.
    pub private_data: [u8; SIDR_REP_PRIVATE_DATA_LEN],
}

impl SidrRep {
    /// Parses a whole MAD.
    pub fn parse(bytes: &[u8]) -> Result<Self, CmParseError> {
        let (m, tid) = open(bytes, AttributeId::SidrRep)?;
        Ok(Self {
            transaction_id: tid,
            request_id: be32(m, H),
            status: m[H + 4],
            additional_information_length: m[H + 5],
            qpn: get24(m, 8),
            service_id: be64(m, H + 12),
            qkey: be32(m, H + 20),
            additional_information: array(m, 24),
            private_data: array(m, 96),
        })
    }

    /// Writes the whole MAD.
    pub fn write(&self, mad: &mut [u8; MAD_LEN]) {
        start(mad, AttributeId::SidrRep, self.transaction_id);
        put32(mad, H, self.request_id);
        mad[H + 4] = self.status;
        mad[H + 5] = self.additional_information_length;
        put24(mad, 8, self.qpn);
        put64(mad, H + 12, self.service_id);
        put32(mad, H + 20, self.qkey);
        put_array(mad, 24, &self.additional_information);
        put_array(mad, 96, &self.private_data);
    }
}

/// Where the share of a local communication ID sits: its high byte
/// ([`crate::CmConfig::share`]).
pub const COMM_ID_SHARE_SHIFT: u32 = 24;

/// The share a local communication ID (or SIDR request ID) was handed out by: its high
/// byte ([`crate::CmConfig::share`]).
pub fn comm_id_share(comm_id: u32) -> u8 {
    (comm_id >> COMM_ID_SHARE_SHIFT) as u8
}

/// Whom a received CM MAD is for, when the CMs of several processes share one address and
/// so one QP1: what the host's receiving end looks at to hand it to the right one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addressee {
    /// Whoever listens on this service ID: a REQ or a SIDR_REQ.
    Service(u64),
    /// The `Cm` that handed out this local communication ID (SIDR: request ID), found by
    /// its share ([`comm_id_share`]): the REMOTE communication ID of an MRA, REJ, REP,
    /// RTU, DREQ, DREP, LAP or APR, the request ID of a SIDR_REP (IBTA 12.6). 0 when the
    /// sender did not know it (a REJ of a REQ it could not parse).
    Connection(u32),
}

/// The addressee of a CM MAD (exactly [`MAD_LEN`] bytes); `None` for anything else: not a
/// CM SEND MAD, a ClassPortInfo, an unknown attribute, or too short. Reads only the header
/// and the one field it needs.
pub fn addressee(bytes: &[u8]) -> Option<Addressee> {
    let header = MadHeader::parse_cm(bytes).ok()?;
    let mad = mad_bytes(bytes).ok()?;
    Some(match header.attribute() {
        // REQ: ServiceID at byte 8 of the message; SIDR_REQ: at byte 8 as well.
        AttributeId::Req | AttributeId::SidrReq => Addressee::Service(be64(mad, H + 8)),
        // Every connection message carries LocalCommID at 0 and RemoteCommID at 4.
        AttributeId::Mra
        | AttributeId::Rej
        | AttributeId::Rep
        | AttributeId::Rtu
        | AttributeId::Dreq
        | AttributeId::Drep
        | AttributeId::Lap
        | AttributeId::Apr => Addressee::Connection(be32(mad, H + 4)),
        // SIDR_REP: the RequestID of the SIDR_REQ it answers, at 0.
        AttributeId::SidrRep => Addressee::Connection(be32(mad, H)),
        AttributeId::ClassPortInfo | AttributeId::Unknown(_) => return None,
    })
}

/// Any CM message, parsed by its attribute ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmMessage {
    /// REQ.
    Req(Box<Req>),
    /// MRA.
    Mra(Box<Mra>),
    /// REJ.
    Rej(Box<Rej>),
    /// REP.
    Rep(Box<Rep>),
    /// RTU.
    Rtu(Box<Rtu>),
    /// DREQ.
    Dreq(Box<Dreq>),
    /// DREP.
    Drep(Box<Drep>),
    /// SIDR_REQ.
    SidrReq(Box<SidrReq>),
    /// SIDR_REP.
    SidrRep(Box<SidrRep>),
    /// ClassPortInfo, LAP or APR: recognised, not interpreted (header only).
    Ignored(MadHeader),
}

impl CmMessage {
    /// Parses any CM SEND MAD. An unknown attribute is
    /// [`CmParseError::UnknownAttribute`].
    pub fn parse(bytes: &[u8]) -> Result<Self, CmParseError> {
        let header = MadHeader::parse_cm(bytes)?;
        Ok(match header.attribute() {
            AttributeId::Req => Self::Req(Box::new(Req::parse(bytes)?)),
            AttributeId::Mra => Self::Mra(Box::new(Mra::parse(bytes)?)),
            AttributeId::Rej => Self::Rej(Box::new(Rej::parse(bytes)?)),
            AttributeId::Rep => Self::Rep(Box::new(Rep::parse(bytes)?)),
            AttributeId::Rtu => Self::Rtu(Box::new(Rtu::parse(bytes)?)),
            AttributeId::Dreq => Self::Dreq(Box::new(Dreq::parse(bytes)?)),
            AttributeId::Drep => Self::Drep(Box::new(Drep::parse(bytes)?)),
            AttributeId::SidrReq => Self::SidrReq(Box::new(SidrReq::parse(bytes)?)),
            AttributeId::SidrRep => Self::SidrRep(Box::new(SidrRep::parse(bytes)?)),
            AttributeId::ClassPortInfo | AttributeId::Lap | AttributeId::Apr => {
                Self::Ignored(header)
            }
            AttributeId::Unknown(v) => return Err(CmParseError::UnknownAttribute(v)),
        })
    }

    /// Writes the whole MAD (an `Ignored` message writes its header and zeroes).
    pub fn write(&self, mad: &mut [u8; MAD_LEN]) {
        match self {
            Self::Req(m) => m.write(mad),
            Self::Mra(m) => m.write(mad),
            Self::Rej(m) => m.write(mad),
            Self::Rep(m) => m.write(mad),
            Self::Rtu(m) => m.write(mad),
            Self::Dreq(m) => m.write(mad),
            Self::Drep(m) => m.write(mad),
            Self::SidrReq(m) => m.write(mad),
            Self::SidrRep(m) => m.write(mad),
            Self::Ignored(h) => {
                mad.fill(0);
                h.write(mad);
            }
        }
    }

    /// The name IBTA gives the message.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Req(_) => "REQ",
            Self::Mra(_) => "MRA",
            Self::Rej(_) => "REJ",
            Self::Rep(_) => "REP",
            Self::Rtu(_) => "RTU",
            Self::Dreq(_) => "DREQ",
            Self::Drep(_) => "DREP",
            Self::SidrReq(_) => "SIDR_REQ",
            Self::SidrRep(_) => "SIDR_REP",
            Self::Ignored(_) => "ignored",
        }
    }
}

impl fmt::Display for CmMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Req(m) => write!(
                f,
                "CM REQ comm {:#010x} sid {:#018x} qpn {:#08x} psn {:#08x}",
                m.local_comm_id, m.service_id, m.local_qpn, m.starting_psn
            ),
            Self::Mra(m) => write!(
                f,
                "CM MRA comm {:#010x}->{:#010x} {:?} timeout {}",
                m.local_comm_id, m.remote_comm_id, m.message_mraed, m.service_timeout
            ),
            Self::Rej(m) => write!(
                f,
                "CM REJ comm {:#010x}->{:#010x} {:?} reason {}",
                m.local_comm_id, m.remote_comm_id, m.message_rejected, m.reason
            ),
            Self::Rep(m) => write!(
                f,
                "CM REP comm {:#010x}->{:#010x} qpn {:#08x} psn {:#08x}",
                m.local_comm_id, m.remote_comm_id, m.local_qpn, m.starting_psn
            ),
            Self::Rtu(m) => write!(
                f,
                "CM RTU comm {:#010x}->{:#010x}",
                m.local_comm_id, m.remote_comm_id
            ),
            Self::Dreq(m) => write!(
                f,
                "CM DREQ comm {:#010x}->{:#010x} qpn {:#08x}",
                m.local_comm_id, m.remote_comm_id, m.remote_qpn
            ),
            Self::Drep(m) => write!(
                f,
                "CM DREP comm {:#010x}->{:#010x}",
                m.local_comm_id, m.remote_comm_id
            ),
            Self::SidrReq(m) => write!(
                f,
                "CM SIDR_REQ id {:#010x} sid {:#018x}",
                m.request_id, m.service_id
            ),
            Self::SidrRep(m) => write!(
                f,
                "CM SIDR_REP id {:#010x} status {} qpn {:#08x}",
                m.request_id, m.status, m.qpn
            ),
            Self::Ignored(h) => write!(f, "CM attribute {:#06x} (ignored)", h.attribute_id),
        }
    }
}

/// Copies `data` into a zeroed private data area of `N` bytes; `None` if it is longer.
pub fn private_data<const N: usize>(data: &[u8]) -> Option<[u8; N]> {
    let mut a = [0u8; N];
    a.get_mut(..data.len())?.copy_from_slice(data);
    Some(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_path(seed: u8) -> ReqPath {
        ReqPath {
            local_lid: 0xFFFF,
            remote_lid: 0xFFFF,
            local_gid: [seed; 16],
            remote_gid: [seed + 1; 16],
            flow_label: 0xABCDE,
            packet_rate: 0x2A,
            traffic_class: 0x60,
            hop_limit: 64,
            sl: 5,
            subnet_local: false,
            local_ack_timeout: 18,
        }
    }

    fn sample_req() -> Req {
        let mut private_data = [0u8; REQ_PRIVATE_DATA_LEN];
        for (i, b) in private_data.iter_mut().enumerate() {
            *b = i as u8;
        }
        Req {
            transaction_id: 0x1122_3344_5566_7788,
            local_comm_id: 0xA1A2_A3A4,
            service_id: 0x0000_0000_0106_4E20,
            local_ca_guid: 0x0202_03FF_FE04_0506,
            local_qkey: 0,
            local_qpn: 0x00_1234,
            responder_resources: 4,
            local_eecn: 0,
            initiator_depth: 3,
            remote_eecn: 0,
            remote_cm_response_timeout: 20,
            transport_service_type: 1,
            end_to_end_flow_control: true,
            starting_psn: 0xABCDEF,
            local_cm_response_timeout: 19,
            retry_count: 6,
            partition_key: 0xFFFF,
            path_mtu: 3,
            rdc_exists: false,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: true,
            extended_transport_type: 0,
            primary_path: sample_path(0xFE),
            alternate_path: ReqPath::default(),
            sap_supported: false,
            private_data,
        }
    }

    #[test]
    fn cm_mad_header_is_base_1_class_7_version_2_send_ibta_13_4_2() {
        let mut m = [0u8; MAD_LEN];
        sample_req().write(&mut m);
        assert_eq!(
            &m[..24],
            &[
                1, 0x07, 2, 0x03, 0, 0, 0, 0, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x00,
                0x10, 0, 0, 0, 0, 0, 0
            ]
        );
    }

    #[test]
    fn req_fields_sit_at_the_offsets_of_ibta_12_6_5_table_106() {
        let mut m = [0u8; MAD_LEN];
        sample_req().write(&mut m);
        // Message byte N is MAD byte 24 + N.
        assert_eq!(m[24..28], [0xA1, 0xA2, 0xA3, 0xA4]); // LocalCommID @0
        assert_eq!(m[28..32], [0; 4]); // reserved @4
        assert_eq!(m[32..40], [0, 0, 0, 0, 0x01, 0x06, 0x4E, 0x20]); // ServiceID @8
        assert_eq!(m[40..48], [0x02, 0x02, 0x03, 0xFF, 0xFE, 0x04, 0x05, 0x06]); // CA GUID @16
        assert_eq!(m[52..56], [0; 4]); // Local Q_Key @28
        assert_eq!(m[56..60], [0x00, 0x12, 0x34, 4]); // QPN @32 (24) | RespRes @35
        assert_eq!(m[60..64], [0, 0, 0, 3]); // EECN @36 | InitDepth @39
                                             // RemoteEECN @40 | byte 43: RemoteCMRespTimeout(5)=20, TST(2)=UC, E2E(1)=1.
        assert_eq!(m[64..68], [0, 0, 0, (20 << 3) | (1 << 1) | 1]);
        // StartingPSN @44 | byte 47: LocalCMRespTimeout(5)=19, RetryCount(3)=6.
        assert_eq!(m[68..72], [0xAB, 0xCD, 0xEF, (19 << 3) | 6]);
        assert_eq!(m[72..74], [0xFF, 0xFF]); // P_Key @48
        assert_eq!(m[74], (3 << 4) | 7); // MTU(4)=3, RDC(1)=0, RNR(3)=7 @50
        assert_eq!(m[75], (15 << 4) | (1 << 3)); // MaxCMRetries(4)=15, SRQ(1)=1, ExtTT(3)=0 @51
        assert_eq!(m[76..80], [0xFF, 0xFF, 0xFF, 0xFF]); // primary LIDs @52, @54
        assert_eq!(m[80..96], [0xFE; 16]); // primary local GID @56
        assert_eq!(m[96..112], [0xFF; 16]); // primary remote GID @72
                                            // FlowLabel(20)=0xABCDE, reserved(6), PacketRate(6)=0x2A over @88..92.
        assert_eq!(m[112..116], [0xAB, 0xCD, 0xE0, 0x2A]);
        assert_eq!(m[116], 0x60); // TC @92
        assert_eq!(m[117], 64); // hop limit @93
        assert_eq!(m[118], 5 << 4); // SL(4)=5, SubnetLocal(1)=0 @94
        assert_eq!(m[119], 18 << 3); // LocalACKTimeout(5)=18 @95
        assert_eq!(m[120..164], [0; 44]); // no alternate path @96..140
        assert_eq!(m[164], 0); // private data @140
        assert_eq!(m[255], 91);
        assert_eq!(Req::parse(&m), Ok(sample_req()));
    }

    #[test]
    fn rep_fields_sit_at_the_offsets_of_ibta_12_6_8_table_110() {
        let rep = Rep {
            transaction_id: 7,
            local_comm_id: 0x0102_0304,
            remote_comm_id: 0x0506_0708,
            local_qkey: 0x1111_2222,
            local_qpn: 0xABCDEF,
            local_eecn: 0x123456,
            starting_psn: 0x654321,
            responder_resources: 16,
            initiator_depth: 8,
            target_ack_delay: 31,
            failover_accepted: 1,
            end_to_end_flow_control: true,
            rnr_retry_count: 5,
            srq: true,
            local_ca_guid: 0x0A0B_0C0D_0E0F_1011,
            private_data: [0x5A; REP_PRIVATE_DATA_LEN],
        };
        let mut m = [0u8; MAD_LEN];
        rep.write(&mut m);
        assert_eq!(be16(&m, 16), 0x0013);
        assert_eq!(m[24..32], [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(m[32..36], [0x11, 0x11, 0x22, 0x22]);
        assert_eq!(m[36..40], [0xAB, 0xCD, 0xEF, 0]);
        assert_eq!(m[40..44], [0x12, 0x34, 0x56, 0]);
        assert_eq!(m[44..48], [0x65, 0x43, 0x21, 0]);
        assert_eq!(m[48..50], [16, 8]);
        assert_eq!(m[50], (31 << 3) | (1 << 1) | 1); // TargetAckDelay, Failover, E2E @26
        assert_eq!(m[51], (5 << 5) | (1 << 4)); // RNR(3), SRQ(1) @27
        assert_eq!(m[52..60], [0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F, 0x10, 0x11]); // @28
        assert!(m[60..256].iter().all(|&b| b == 0x5A)); // private data @36, 196 bytes
        assert_eq!(Rep::parse(&m), Ok(rep));
    }

    #[test]
    fn rej_mra_rtu_dreq_drep_fields_sit_at_the_offsets_of_ibta_12_6_6_to_12_6_11() {
        let mut m = [0u8; MAD_LEN];
        let mut ari = [0u8; REJ_ARI_LEN];
        ari[0] = 0xEE;
        let rej = Rej {
            transaction_id: 1,
            local_comm_id: 0x0A,
            remote_comm_id: 0x0B,
            message_rejected: MessageKind::Rep,
            reject_info_length: 8,
            reason: reject_reason::CONSUMER,
            ari,
            private_data: [0x77; REJ_PRIVATE_DATA_LEN],
        };
        rej.write(&mut m);
        assert_eq!(m[17], 0x12);
        assert_eq!(m[24..32], [0, 0, 0, 0x0A, 0, 0, 0, 0x0B]);
        assert_eq!(m[32], 1 << 6); // MsgRejected(2) @8
        assert_eq!(m[33], 8 << 1); // RejectInfoLength(7) @9
        assert_eq!(m[34..36], [0, 28]); // reason @10
        assert_eq!(m[36], 0xEE); // ARI @12
        assert_eq!(m[107], 0); // ARI end @83
        assert!(m[108..256].iter().all(|&b| b == 0x77)); // private @84, 148 bytes
        assert_eq!(Rej::parse(&m), Ok(rej.clone()));
        assert_eq!(rej.ari(), &ari[..8]);

        let mra = Mra {
            transaction_id: 2,
            local_comm_id: 1,
            remote_comm_id: 2,
            message_mraed: MessageKind::Lap,
            service_timeout: 17,
            private_data: [0x33; MRA_PRIVATE_DATA_LEN],
        };
        mra.write(&mut m);
        assert_eq!(m[17], 0x11);
        assert_eq!(m[32], 2 << 6);
        assert_eq!(m[33], 17 << 3);
        assert!(m[34..256].iter().all(|&b| b == 0x33)); // private @10, 222 bytes
        assert_eq!(Mra::parse(&m), Ok(mra));

        let rtu = Rtu {
            transaction_id: 3,
            local_comm_id: 9,
            remote_comm_id: 10,
            private_data: [0x44; RTU_PRIVATE_DATA_LEN],
        };
        rtu.write(&mut m);
        assert_eq!(m[17], 0x14);
        assert!(m[32..256].iter().all(|&b| b == 0x44)); // private @8, 224 bytes
        assert_eq!(Rtu::parse(&m), Ok(rtu));

        let dreq = Dreq {
            transaction_id: 4,
            local_comm_id: 9,
            remote_comm_id: 10,
            remote_qpn: 0xFEDCBA,
            private_data: [0x55; DREQ_PRIVATE_DATA_LEN],
        };
        dreq.write(&mut m);
        assert_eq!(m[17], 0x15);
        assert_eq!(m[32..36], [0xFE, 0xDC, 0xBA, 0]); // RemoteQPN @8 (24)
        assert!(m[36..256].iter().all(|&b| b == 0x55)); // private @12, 220 bytes
        assert_eq!(Dreq::parse(&m), Ok(dreq));

        let drep = Drep {
            transaction_id: 5,
            local_comm_id: 9,
            remote_comm_id: 10,
            private_data: [0x66; DREP_PRIVATE_DATA_LEN],
        };
        drep.write(&mut m);
        assert_eq!(m[17], 0x16);
        assert!(m[32..256].iter().all(|&b| b == 0x66)); // private @8, 224 bytes
        assert_eq!(Drep::parse(&m), Ok(drep));
    }

    #[test]
    fn sidr_fields_sit_at_the_offsets_of_ibta_12_11_tables_119_and_120() {
        let mut m = [0u8; MAD_LEN];
        let req = SidrReq {
            transaction_id: 6,
            request_id: 0x0102_0304,
            partition_key: 0xFFFF,
            service_id: 0x0000_0000_0111_0001,
            private_data: [0x21; SIDR_REQ_PRIVATE_DATA_LEN],
        };
        req.write(&mut m);
        assert_eq!(m[17], 0x17);
        assert_eq!(m[24..32], [1, 2, 3, 4, 0xFF, 0xFF, 0, 0]);
        assert_eq!(m[32..40], [0, 0, 0, 0, 1, 0x11, 0, 1]);
        assert!(m[40..256].iter().all(|&b| b == 0x21)); // private @16, 216 bytes
        assert_eq!(SidrReq::parse(&m), Ok(req));

        let rep = SidrRep {
            transaction_id: 6,
            request_id: 0x0102_0304,
            status: sidr_status::SUCCESS,
            additional_information_length: 0,
            qpn: 0x000111,
            service_id: 0x0000_0000_0111_0001,
            qkey: 0x0123_4567,
            additional_information: [0; SIDR_REP_INFO_LEN],
            private_data: [0x31; SIDR_REP_PRIVATE_DATA_LEN],
        };
        rep.write(&mut m);
        assert_eq!(m[17], 0x18);
        assert_eq!(m[24..36], [1, 2, 3, 4, 0, 0, 0, 0, 0, 0x01, 0x11, 0]);
        assert_eq!(m[36..44], [0, 0, 0, 0, 1, 0x11, 0, 1]); // ServiceID @12
        assert_eq!(m[44..48], [0x01, 0x23, 0x45, 0x67]); // Q_Key @20
        assert!(m[120..256].iter().all(|&b| b == 0x31)); // private @96, 136 bytes
        assert_eq!(SidrRep::parse(&m), Ok(rep));
    }

    #[test]
    fn private_data_sizes_fill_the_256_byte_mad_exactly() {
        for (offset, len) in [
            (140, REQ_PRIVATE_DATA_LEN),
            (10, MRA_PRIVATE_DATA_LEN),
            (84, REJ_PRIVATE_DATA_LEN),
            (36, REP_PRIVATE_DATA_LEN),
            (8, RTU_PRIVATE_DATA_LEN),
            (12, DREQ_PRIVATE_DATA_LEN),
            (8, DREP_PRIVATE_DATA_LEN),
            (16, SIDR_REQ_PRIVATE_DATA_LEN),
            (96, SIDR_REP_PRIVATE_DATA_LEN),
        ] {
            assert_eq!(MAD_HEADER_LEN + offset + len, MAD_LEN);
        }
    }

    #[test]
    fn wrong_length_version_class_method_or_attribute_is_an_error_not_a_panic() {
        let mut m = [0u8; MAD_LEN];
        sample_req().write(&mut m);
        assert_eq!(
            Req::parse(&m[..255]),
            Err(CmParseError::Truncated { len: 255 })
        );
        assert_eq!(Req::parse(&[]), Err(CmParseError::Truncated { len: 0 }));
        let long = [0u8; 257];
        assert_eq!(
            CmMessage::parse(&long),
            Err(CmParseError::TooLong { len: 257 })
        );
        let mut bad = m;
        bad[0] = 2;
        assert_eq!(Req::parse(&bad), Err(CmParseError::BaseVersion(2)));
        let mut bad = m;
        bad[1] = 0x81;
        assert_eq!(Req::parse(&bad), Err(CmParseError::MgmtClass(0x81)));
        let mut bad = m;
        bad[2] = 1;
        assert_eq!(Req::parse(&bad), Err(CmParseError::ClassVersion(1)));
        let mut bad = m;
        bad[3] = 0x01;
        assert_eq!(Req::parse(&bad), Err(CmParseError::Method(1)));
        assert_eq!(
            Rep::parse(&m),
            Err(CmParseError::WrongAttribute {
                expected: 0x13,
                found: 0x10
            })
        );
        let mut bad = m;
        bad[17] = 0x42;
        assert_eq!(
            CmMessage::parse(&bad),
            Err(CmParseError::UnknownAttribute(0x42))
        );
        let mut lap = m;
        lap[17] = 0x19;
        assert!(matches!(CmMessage::parse(&lap), Ok(CmMessage::Ignored(_))));
    }

    #[test]
    fn private_data_helper_pads_with_zeros_and_refuses_overlong_data() {
        assert_eq!(private_data::<4>(&[1, 2]), Some([1, 2, 0, 0]));
        assert_eq!(private_data::<2>(&[1, 2, 3]), None);
    }
}
