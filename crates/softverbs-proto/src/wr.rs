//! Work requests as the engine receives them (`struct ibv_send_wr`, `struct ibv_recv_wr`,
//! `struct ibv_sge`), in owned Rust form. A request's scatter/gather list ([`SgeList`])
//! holds one entry without a heap allocation, so posting the usual request costs no
//! `malloc` and retiring it no `free`.

use std::fmt;
use std::ops::{Deref, DerefMut};

use bitflags::bitflags;
use smallvec::SmallVec;

use crate::memory::WindowBind;
use crate::types::AddressVector;

/// One scatter/gather entry (`struct ibv_sge`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Sge {
    /// Start address in the region.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// L_Key of the region.
    pub lkey: u32,
}

/// A work request's scatter/gather list (`sg_list` and `num_sge` of `struct ibv_send_wr`
/// and `struct ibv_recv_wr`): up to [`SgeList::INLINE`] entries are held in the list
/// itself, more on the heap.
///
/// One inline because the usual verbs program posts one entry (`ibv_rc_pingpong`,
/// perftest, most applications), and one costs nothing in size: the list is 24 bytes, as
/// the `Vec` it replaced, so a [`SendWr`] stays 128 bytes and a [`RecvWr`] 32. Two inline
/// (for a header and a payload) would make the list 40 bytes and a `SendWr` 144, past the
/// 128 bytes the compiler moves without a call: each hand-over of a request by value
/// (device, engine, QP, queue) became a `memcpy` call, and softverbs-device's
/// `instruction_count` ping-pong measured 19,715 instructions per round trip with two
/// inline against 19,427 with one (19,872 with `Vec`s). A second entry moves the list to
/// the heap, as a `Vec` would have been.
///
/// It reads as a slice of [`Sge`] (`Deref`); it is built from an array
/// (`SgeList::from([sge])`, no allocation for one entry), a slice
/// ([`SgeList::from_slice`]), a `Vec` (its buffer kept when it holds more than one entry),
/// one entry, or an iterator.
///
/// ```
/// use softverbs_proto::{Sge, SgeList};
/// let sge = Sge { addr: 0x1000, length: 64, lkey: 7 };
/// let one = SgeList::from(sge);
/// assert!(!one.spilled());
/// let two = SgeList::from([sge, sge]);
/// assert_eq!(two.len(), 2);
/// assert!(two.spilled());
/// assert_eq!(two, SgeList::from(vec![sge, sge]));
/// ```
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct SgeList(SmallVec<[Sge; SgeList::INLINE]>);

impl SgeList {
    /// Entries held without a heap allocation (the type's documentation says why one).
    pub const INLINE: usize = 1;

    /// An empty list (a request without local buffers).
    #[inline]
    pub fn new() -> Self {
        SgeList(SmallVec::new())
    }

    /// A list of the entries of `sges`, copied (inline when there are at most
    /// [`SgeList::INLINE`]).
    #[inline]
    pub fn from_slice(sges: &[Sge]) -> Self {
        SgeList(SmallVec::from_slice(sges))
    }

    /// Appends `sge` (moving the list to the heap when the inline room is full).
    #[inline]
    pub fn push(&mut self, sge: Sge) {
        self.0.push(sge);
    }

    /// The entries live on the heap: the list held more than [`SgeList::INLINE`] of them.
    #[inline]
    pub fn spilled(&self) -> bool {
        self.0.spilled()
    }
}

impl Deref for SgeList {
    type Target = [Sge];

    #[inline]
    fn deref(&self) -> &[Sge] {
        &self.0
    }
}

impl DerefMut for SgeList {
    #[inline]
    fn deref_mut(&mut self) -> &mut [Sge] {
        &mut self.0
    }
}

impl fmt::Debug for SgeList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<'a> IntoIterator for &'a SgeList {
    type Item = &'a Sge;
    type IntoIter = std::slice::Iter<'a, Sge>;

    #[inline]
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl FromIterator<Sge> for SgeList {
    #[inline]
    fn from_iter<I: IntoIterator<Item = Sge>>(iter: I) -> Self {
        SgeList(iter.into_iter().collect())
    }
}

impl Extend<Sge> for SgeList {
    fn extend<I: IntoIterator<Item = Sge>>(&mut self, iter: I) {
        self.0.extend(iter);
    }
}

impl From<Sge> for SgeList {
    #[inline]
    fn from(sge: Sge) -> Self {
        SgeList::from([sge])
    }
}

impl<const N: usize> From<[Sge; N]> for SgeList {
    #[inline]
    fn from(sges: [Sge; N]) -> Self {
        SgeList::from_slice(&sges)
    }
}

impl From<&[Sge]> for SgeList {
    #[inline]
    fn from(sges: &[Sge]) -> Self {
        SgeList::from_slice(sges)
    }
}

/// Keeps the `Vec`'s buffer when it holds more than [`SgeList::INLINE`] entries; otherwise
/// the entries move inline and the buffer is freed.
impl From<Vec<Sge>> for SgeList {
    #[inline]
    fn from(sges: Vec<Sge>) -> Self {
        SgeList(SmallVec::from_vec(sges))
    }
}

/// The payload of an `IBV_SEND_INLINE` request, copied out of the application's buffers at
/// post time: up to [`InlineData::INLINE`] bytes are held in the request itself, more on
/// the heap.
///
/// Sixteen because they cost nothing in size: the list is 24 bytes, as the `Vec` it
/// replaced (smallvec's union layout keeps the bytes where the pointer and length of a
/// heap buffer would be), so a [`SendWr`] stays 128 bytes (see [`SgeList`] for why that
/// matters), and an 8-byte ping-pong (`ib_send_lat`, which posts inline) or a small
/// control message costs no `malloc`.
///
/// ```
/// use softverbs_proto::InlineData;
/// let small = InlineData::from(&b"8 bytes!"[..]);
/// assert_eq!(&small[..], b"8 bytes!");
/// assert!(!small.spilled());
/// assert!(InlineData::from(vec![0u8; 64]).spilled());
/// ```
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct InlineData(SmallVec<[u8; InlineData::INLINE]>);

impl InlineData {
    /// Bytes held without a heap allocation (the type's documentation says why sixteen).
    pub const INLINE: usize = 16;

    /// No payload.
    #[inline]
    pub fn new() -> Self {
        InlineData(SmallVec::new())
    }

    /// Room for `len` bytes (inline when `len` is at most [`InlineData::INLINE`]).
    #[inline]
    pub fn with_capacity(len: usize) -> Self {
        InlineData(SmallVec::with_capacity(len))
    }

    /// Appends `bytes`.
    #[inline]
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }

    /// The bytes live on the heap: there were more than [`InlineData::INLINE`].
    #[inline]
    pub fn spilled(&self) -> bool {
        self.0.spilled()
    }
}

impl Deref for InlineData {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for InlineData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl From<&[u8]> for InlineData {
    #[inline]
    fn from(bytes: &[u8]) -> Self {
        InlineData(SmallVec::from_slice(bytes))
    }
}

/// Keeps the `Vec`'s buffer when it holds more than [`InlineData::INLINE`] bytes;
/// otherwise the bytes move inline and the buffer is freed.
impl From<Vec<u8>> for InlineData {
    #[inline]
    fn from(bytes: Vec<u8>) -> Self {
        InlineData(SmallVec::from_vec(bytes))
    }
}

bitflags! {
    /// Send flags (`enum ibv_send_flags`, same values).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// `IBV_SEND_FENCE`: wait for earlier reads and atomics (RC only).
        const FENCE = 1 << 0;
        /// `IBV_SEND_SIGNALED`: produce a completion (when `sq_sig_all` is off).
        const SIGNALED = 1 << 1;
        /// `IBV_SEND_SOLICITED`: set SE on the last packet (send, write with immediate).
        const SOLICITED = 1 << 2;
        /// `IBV_SEND_INLINE`: the payload was copied at post time (see [`Gather::Inline`]).
        const INLINE = 1 << 3;
    }
}

bitflags! {
    /// The placement type of a FLUSH (`IBV_FLUSH_GLOBAL`, `IBV_FLUSH_PERSISTENT` of
    /// rdma-core ≥ 45, the FETH's bits 3..0, IBTA 1.5): where the data must be when the
    /// FLUSH completes.
    ///
    /// This device places data in host memory with the CPU on receipt; a global flush is a
    /// full memory fence at the responder. It has no persistent memory: a persistent flush
    /// is the same fence (the data is as persistent as the host's RAM), and is granted only
    /// on regions registered with `IBV_ACCESS_FLUSH_PERSISTENT`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct FlushPlacement: u8 {
        /// `IBV_FLUSH_GLOBAL`: globally visible.
        const GLOBAL = 1 << 0;
        /// `IBV_FLUSH_PERSISTENT`: persistent.
        const PERSISTENT = 1 << 1;
    }
}

/// The selectivity level of a FLUSH (`enum ibv_selectivity_level` of rdma-core ≥ 45, the
/// FETH's bits 5..4, IBTA 1.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum FlushSelectivity {
    /// `IBV_FLUSH_RANGE` (0): the range `[remote_addr, remote_addr + len)`.
    #[default]
    Range,
    /// `IBV_FLUSH_MR` (1): the whole memory region of the R_Key (address and length are
    /// not looked at).
    Mr,
}

impl FlushSelectivity {
    /// The level of a raw value, `None` for the reserved values 2 and 3 and beyond.
    pub const fn from_raw(raw: u8) -> Option<Self> {
        match raw {
            0 => Some(FlushSelectivity::Range),
            1 => Some(FlushSelectivity::Mr),
            _ => None,
        }
    }

    /// The raw value (the FETH's selectivity level).
    pub const fn to_raw(self) -> u8 {
        match self {
            FlushSelectivity::Range => 0,
            FlushSelectivity::Mr => 1,
        }
    }
}

/// The operation of a send work request (`enum ibv_wr_opcode` plus its operands).
///
/// Immediate data is given as a host-order `u32`; it travels as its big-endian bytes and
/// arrives in the peer's completion through `WorkCompletion::with_imm`, so a value posted
/// as `x` is read back as `x` by [`Completed::imm_data`](softverbs_cq::Completed::imm_data).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SendOp {
    /// `IBV_WR_SEND`.
    Send,
    /// `IBV_WR_SEND_WITH_IMM`.
    SendWithImm {
        /// Immediate data.
        imm: u32,
    },
    /// `IBV_WR_SEND_WITH_INV`.
    SendWithInv {
        /// R_Key the responder invalidates.
        invalidate_rkey: u32,
    },
    /// `IBV_WR_RDMA_WRITE`.
    RdmaWrite {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`.
    RdmaWriteWithImm {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data.
        imm: u32,
    },
    /// `IBV_WR_RDMA_READ`.
    RdmaRead {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
    CompareSwap {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Compare operand.
        compare: u64,
        /// Swap operand.
        swap: u64,
    },
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    FetchAdd {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value to add.
        add: u64,
    },
    /// `IBV_WR_ATOMIC_WRITE` (IBTA 1.5, `ibv_wr_atomic_write(3)`): the 8 bytes of `value`
    /// land at once at the 8-byte aligned `remote_addr`, as they are (the bytes the
    /// application's `atomic_wr` buffer held; rxe sends them verbatim). RC only; the
    /// region needs `IBV_ACCESS_REMOTE_WRITE`. Takes no local buffer.
    AtomicWrite {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// The 8 bytes to write.
        value: [u8; 8],
    },
    /// `IBV_WR_FLUSH` (IBTA 1.5, `ibv_wr_flush(3)` of rdma-core ≥ 45): completes once the
    /// responder made every earlier write of this QP reach `placement` for the range (or
    /// the whole region, per `selectivity`). RC only; the region needs the matching
    /// `IBV_ACCESS_FLUSH_*` flags. Takes no local buffer.
    Flush {
        /// Remote virtual address (ignored for [`FlushSelectivity::Mr`]).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Length of the range (ignored for [`FlushSelectivity::Mr`]); at most 2^31.
        len: u64,
        /// Placement type.
        placement: FlushPlacement,
        /// Selectivity level.
        selectivity: FlushSelectivity,
    },
    /// `IBV_WR_BIND_MW` (a type 2 window), or the work request `ibv_bind_mw(3)` posts (a
    /// type 1 window; [`WindowBind::kind`] says which): a local operation, executed in
    /// order once every earlier work request of the send queue completed.
    BindMw(WindowBind),
    /// `IBV_WR_LOCAL_INV`: invalidates a type 2 window's R_Key; a local operation, like
    /// [`SendOp::BindMw`].
    LocalInv {
        /// The R_Key to invalidate.
        invalidate_rkey: u32,
    },
}

impl SendOp {
    /// The `IBV_WR_*` name of the opcode.
    pub const fn name(&self) -> &'static str {
        match self {
            SendOp::Send => "IBV_WR_SEND",
            SendOp::SendWithImm { .. } => "IBV_WR_SEND_WITH_IMM",
            SendOp::SendWithInv { .. } => "IBV_WR_SEND_WITH_INV",
            SendOp::RdmaWrite { .. } => "IBV_WR_RDMA_WRITE",
            SendOp::RdmaWriteWithImm { .. } => "IBV_WR_RDMA_WRITE_WITH_IMM",
            SendOp::RdmaRead { .. } => "IBV_WR_RDMA_READ",
            SendOp::CompareSwap { .. } => "IBV_WR_ATOMIC_CMP_AND_SWP",
            SendOp::FetchAdd { .. } => "IBV_WR_ATOMIC_FETCH_AND_ADD",
            SendOp::AtomicWrite { .. } => "IBV_WR_ATOMIC_WRITE",
            SendOp::Flush { .. } => "IBV_WR_FLUSH",
            SendOp::BindMw(_) => "IBV_WR_BIND_MW",
            SendOp::LocalInv { .. } => "IBV_WR_LOCAL_INV",
        }
    }

    /// A local operation (bind, local invalidate): executed by the requester against
    /// local memory, never sent.
    pub const fn is_local(&self) -> bool {
        matches!(self, SendOp::BindMw(_) | SendOp::LocalInv { .. })
    }

    /// RDMA read, atomic, ATOMIC WRITE or FLUSH: answered by a response packet, takes one
    /// unit of the `max_rd_atomic` budget (and of the responder's resources, as rxe counts
    /// them), and is what `IBV_SEND_FENCE` waits for.
    pub const fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::RdmaRead { .. }
                | SendOp::CompareSwap { .. }
                | SendOp::FetchAdd { .. }
                | SendOp::AtomicWrite { .. }
                | SendOp::Flush { .. }
        )
    }

    /// ATOMIC WRITE or FLUSH (IBTA 1.5): operands in the request, no local buffer, one
    /// packet, acknowledged by a zero-length RDMA READ RESPONSE ONLY.
    pub const fn is_placement(&self) -> bool {
        matches!(self, SendOp::AtomicWrite { .. } | SendOp::Flush { .. })
    }

    /// Compare-and-swap or fetch-and-add.
    pub const fn is_atomic(&self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }
}

/// Where the payload of a send work request comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Gather {
    /// Gathered from registered memory at transmit time (local access checked by L_Key).
    Sges(SgeList),
    /// Copied by the caller at post time (`IBV_SEND_INLINE`; no L_Key check).
    Inline(InlineData),
}

impl Gather {
    /// Total payload length.
    pub fn len(&self) -> u64 {
        match self {
            Gather::Sges(sges) => sges.iter().map(|s| u64::from(s.length)).sum(),
            Gather::Inline(bytes) => bytes.len() as u64,
        }
    }

    /// No payload.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// UD destination of a send work request (`wr.ud`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UdDest {
    /// Address handle contents.
    pub av: AddressVector,
    /// Destination QP number.
    pub remote_qpn: u32,
    /// Q_Key; a value with the top bit set means "use this QP's own Q_Key" (IBTA C10-15).
    pub remote_qkey: u32,
    /// The protection domain of the address handle: it must be the QP's
    /// ([`QpInit::pd`](crate::QpInit::pd)), or the post is refused (IBTA 10.2.3: an
    /// address handle is used only by QPs of its own protection domain).
    pub pd: u32,
}

/// A send work request (`struct ibv_send_wr`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SendWr {
    /// Caller's id, returned in the completion.
    pub wr_id: u64,
    /// Operation and operands.
    pub op: SendOp,
    /// Local buffers (source, or destination for reads and atomics).
    pub gather: Gather,
    /// Flags.
    pub flags: SendFlags,
    /// UD destination (required on UD QPs, ignored otherwise).
    pub ud: Option<UdDest>,
}

impl SendWr {
    /// A work request of `op` over `sges` (an [`SgeList`], or anything that makes one: an
    /// array, a `Vec`, one [`Sge`]), no flags, no UD destination.
    pub fn new(wr_id: u64, op: SendOp, sges: impl Into<SgeList>) -> Self {
        SendWr {
            wr_id,
            op,
            gather: Gather::Sges(sges.into()),
            flags: SendFlags::empty(),
            ud: None,
        }
    }

    /// The same request with `flags` added.
    pub fn with_flags(mut self, flags: SendFlags) -> Self {
        self.flags |= flags;
        self
    }

    /// The same request with an inline payload (sets `IBV_SEND_INLINE`): a `Vec<u8>`, a
    /// byte slice or an [`InlineData`].
    pub fn with_inline(mut self, data: impl Into<InlineData>) -> Self {
        self.gather = Gather::Inline(data.into());
        self.flags |= SendFlags::INLINE;
        self
    }

    /// The same request addressed to a UD destination.
    pub fn with_ud(mut self, ud: UdDest) -> Self {
        self.ud = Some(ud);
        self
    }
}

/// A receive work request (`struct ibv_recv_wr`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RecvWr {
    /// Caller's id, returned in the completion.
    pub wr_id: u64,
    /// Buffers the message is scattered into.
    pub sg_list: SgeList,
}

impl RecvWr {
    /// A receive into `sg_list` (an [`SgeList`], or anything that makes one).
    pub fn new(wr_id: u64, sg_list: impl Into<SgeList>) -> Self {
        RecvWr {
            wr_id,
            sg_list: sg_list.into(),
        }
    }

    /// Total capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.sg_list.iter().map(|s| u64::from(s.length)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sge(n: u32) -> Sge {
        Sge {
            addr: u64::from(n) * 64,
            length: 64,
            lkey: n,
        }
    }

    #[test]
    fn one_entry_is_held_inline_a_second_moves_the_list_to_the_heap() {
        assert!(!SgeList::new().spilled());
        assert!(!SgeList::from(sge(0)).spilled());
        assert!(!SgeList::from([sge(0)]).spilled());
        assert!(!SgeList::from(vec![sge(0)]).spilled());
        assert!(!(0..1).map(sge).collect::<SgeList>().spilled());
        let two = SgeList::from([sge(0), sge(1)]);
        assert!(two.spilled());
        assert_eq!(&two[..], &[sge(0), sge(1)]);
        let mut pushed = SgeList::from_slice(&[sge(0)]);
        pushed.push(sge(1));
        assert_eq!(pushed, two);
    }

    /// The inline entry costs a queued request nothing: the list is a `Vec`'s size, and a
    /// send request stays within the 128 bytes the compiler moves without a `memcpy` call
    /// (the type's documentation).
    #[test]
    fn the_inline_entry_keeps_a_request_at_the_size_it_had_with_a_vec() {
        assert_eq!(
            std::mem::size_of::<SgeList>(),
            std::mem::size_of::<Vec<Sge>>()
        );
        assert_eq!(
            std::mem::size_of::<InlineData>(),
            std::mem::size_of::<Vec<u8>>()
        );
        assert_eq!(std::mem::size_of::<SendWr>(), 128);
        assert_eq!(std::mem::size_of::<RecvWr>(), 32);
    }

    #[test]
    fn a_list_prints_and_sums_as_its_entries() {
        let list = SgeList::from([sge(1), sge(2)]);
        assert_eq!(format!("{list:?}"), format!("{:?}", [sge(1), sge(2)]));
        assert_eq!(Gather::Sges(list.clone()).len(), 128);
        assert_eq!(RecvWr::new(7, list).capacity(), 128);
    }
}
