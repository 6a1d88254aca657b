//! Work requests built from memory the API can vouch for (`struct ibv_send_wr`,
//! `struct ibv_recv_wr`).
//!
//! Local memory is named only by [`MrSlice`]s, which exist only while their [`Mr`](crate::Mr)
//! is registered, and are turned into scatter/gather entries at once; inline payloads are
//! copied when the request is made. So a request never borrows application memory: the
//! device reaches memory only through its registration table, and a region deregistered
//! before the device gets to it yields an error completion, never a stray access.

use crate::ah::Ah;
use crate::mr::{MrSlice, RemoteAddr};
use softverbs_proto::{
    FlushPlacement, FlushSelectivity, RecvWr, SendFlags, SendOp, SendWr, SgeList, UdDest,
};

/// The entries of `local`, in order (inline up to [`SgeList::INLINE`]: no allocation for
/// the usual one).
fn sges(local: &[MrSlice<'_>]) -> SgeList {
    local.iter().map(MrSlice::sge).collect()
}

/// A send work request (`ibv_post_send(3)`), built by operation.
///
/// ```
/// use softverbs::{AccessFlags, Context, DeviceConfig, RemoteAddr, SendRequest};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let mr = ctx.alloc_pd().reg_mr(4096, AccessFlags::LOCAL_WRITE)?;
/// let send = SendRequest::send(1, &[mr.slice(0..64)?]).signaled();
/// assert_eq!(send.len(), 64);
/// let write = SendRequest::write(2, &[mr.slice(..)?], RemoteAddr::new(0x1000, 0x42));
/// assert_eq!(write.wr_id(), 2);
/// let inline = SendRequest::send_inline(3, b"copied now");
/// assert_eq!(inline.len(), 10);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendRequest {
    pub(crate) wr: SendWr,
}

impl SendRequest {
    fn new(wr_id: u64, op: SendOp, local: &[MrSlice<'_>]) -> Self {
        SendRequest {
            wr: SendWr::new(wr_id, op, sges(local)),
        }
    }

    /// `IBV_WR_SEND` of the bytes of `local`, in order.
    pub fn send(wr_id: u64, local: &[MrSlice<'_>]) -> Self {
        Self::new(wr_id, SendOp::Send, local)
    }

    /// `IBV_WR_SEND_WITH_IMM`: `imm` arrives in the receiver's completion.
    pub fn send_with_imm(wr_id: u64, local: &[MrSlice<'_>], imm: u32) -> Self {
        Self::new(wr_id, SendOp::SendWithImm { imm }, local)
    }

    /// `IBV_WR_SEND_WITH_INV`: the receiver invalidates `rkey`.
    pub fn send_with_invalidate(wr_id: u64, local: &[MrSlice<'_>], rkey: u32) -> Self {
        Self::new(
            wr_id,
            SendOp::SendWithInv {
                invalidate_rkey: rkey,
            },
            local,
        )
    }

    /// `IBV_WR_SEND` with `IBV_SEND_INLINE`: `data` is copied now.
    pub fn send_inline(wr_id: u64, data: &[u8]) -> Self {
        SendRequest {
            wr: SendWr::new(wr_id, SendOp::Send, SgeList::new()).with_inline(data),
        }
    }

    /// `IBV_WR_RDMA_WRITE` of `local` to `remote`.
    pub fn write(wr_id: u64, local: &[MrSlice<'_>], remote: RemoteAddr) -> Self {
        Self::new(
            wr_id,
            SendOp::RdmaWrite {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            },
            local,
        )
    }

    /// `IBV_WR_RDMA_WRITE_WITH_IMM`: also consumes a receive at the peer, which gets `imm`.
    pub fn write_with_imm(wr_id: u64, local: &[MrSlice<'_>], remote: RemoteAddr, imm: u32) -> Self {
        Self::new(
            wr_id,
            SendOp::RdmaWriteWithImm {
                remote_addr: remote.addr,
                rkey: remote.rkey,
                imm,
            },
            local,
        )
    }

    /// `IBV_WR_RDMA_READ` of `remote` into `local`.
    pub fn read(wr_id: u64, local: &[MrSlice<'_>], remote: RemoteAddr) -> Self {
        Self::new(
            wr_id,
            SendOp::RdmaRead {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            },
            local,
        )
    }

    /// `IBV_WR_ATOMIC_CMP_AND_SWP` on the 8-byte-aligned word at `remote`; the original
    /// value lands in `local` (8 bytes).
    pub fn compare_swap(
        wr_id: u64,
        local: MrSlice<'_>,
        remote: RemoteAddr,
        compare: u64,
        swap: u64,
    ) -> Self {
        Self::new(
            wr_id,
            SendOp::CompareSwap {
                remote_addr: remote.addr,
                rkey: remote.rkey,
                compare,
                swap,
            },
            &[local],
        )
    }

    /// `IBV_WR_ATOMIC_FETCH_AND_ADD` on the 8-byte-aligned word at `remote`; the original
    /// value lands in `local` (8 bytes).
    pub fn fetch_add(wr_id: u64, local: MrSlice<'_>, remote: RemoteAddr, add: u64) -> Self {
        Self::new(
            wr_id,
            SendOp::FetchAdd {
                remote_addr: remote.addr,
                rkey: remote.rkey,
                add,
            },
            &[local],
        )
    }

    /// `IBV_WR_ATOMIC_WRITE` (IBA 1.5, `ibv_wr_atomic_write` of `ibv_wr_post(3)`): the 8
    /// bytes of `value` (native-endian, as [`Mr::read_u64`](crate::Mr::read_u64) reads them
    /// back) are placed at the 8-byte-aligned address `remote` as one unit. RC only; the
    /// target region and the responder's QP need remote write. Takes no local buffer.
    ///
    /// ```
    /// use softverbs::{RemoteAddr, SendRequest};
    /// let aw = SendRequest::atomic_write(4, RemoteAddr::new(0x1000, 0x42), 7).signaled();
    /// assert_eq!((aw.wr_id(), aw.len()), (4, 0));
    /// ```
    pub fn atomic_write(wr_id: u64, remote: RemoteAddr, value: u64) -> Self {
        Self::new(
            wr_id,
            SendOp::AtomicWrite {
                remote_addr: remote.addr,
                rkey: remote.rkey,
                value: value.to_ne_bytes(),
            },
            &[],
        )
    }

    /// `IBV_WR_FLUSH` (IBA 1.5, `ibv_wr_flush` of `ibv_wr_post(3)`): completes once every
    /// earlier write of this QP reached `placement` at the responder, for the `len` bytes
    /// at `remote` ([`FlushSelectivity::Range`], at most 2^31 bytes) or for the whole
    /// region of `remote`'s R_Key ([`FlushSelectivity::Mr`]). RC only; the target region
    /// and the responder's QP need `AccessFlags::FLUSH_GLOBAL` / `FLUSH_PERSISTENT` for
    /// each placement bit. Takes no local buffer.
    ///
    /// ```
    /// use softverbs::{FlushPlacement, FlushSelectivity, RemoteAddr, SendRequest};
    /// let remote = RemoteAddr::new(0x1000, 0x42);
    /// let flush =
    ///     SendRequest::flush(5, remote, 64, FlushPlacement::GLOBAL, FlushSelectivity::Range);
    /// assert_eq!((flush.wr_id(), flush.len()), (5, 0));
    /// ```
    pub fn flush(
        wr_id: u64,
        remote: RemoteAddr,
        len: u64,
        placement: FlushPlacement,
        selectivity: FlushSelectivity,
    ) -> Self {
        Self::new(
            wr_id,
            SendOp::Flush {
                remote_addr: remote.addr,
                rkey: remote.rkey,
                len,
                placement,
                selectivity,
            },
            &[],
        )
    }

    /// Replaces the payload with an inline copy of `data` (`IBV_SEND_INLINE`).
    pub fn inline(mut self, data: &[u8]) -> Self {
        self.wr = self.wr.with_inline(data);
        self
    }

    /// Asks for a completion (`IBV_SEND_SIGNALED`; every request completes on a QP created
    /// with `sq_sig_all`).
    pub fn signaled(mut self) -> Self {
        self.wr.flags |= SendFlags::SIGNALED;
        self
    }

    /// Sets the solicited event bit (`IBV_SEND_SOLICITED`).
    pub fn solicited(mut self) -> Self {
        self.wr.flags |= SendFlags::SOLICITED;
        self
    }

    /// Waits for earlier reads and atomics (`IBV_SEND_FENCE`).
    pub fn fence(mut self) -> Self {
        self.wr.flags |= SendFlags::FENCE;
        self
    }

    /// Addresses a UD send: to QP `remote_qpn` behind `ah`, with `remote_qkey` (a value
    /// with the top bit set means the sending QP's own Q_Key).
    pub fn to(mut self, ah: &Ah, remote_qpn: u32, remote_qkey: u32) -> Self {
        self.wr.ud = Some(UdDest {
            av: ah.av,
            remote_qpn,
            remote_qkey,
            pd: ah.pd().handle(),
        });
        self
    }

    /// The caller's id, returned in the completion.
    pub fn wr_id(&self) -> u64 {
        self.wr.wr_id
    }

    /// The payload length in bytes.
    pub fn len(&self) -> u64 {
        self.wr.gather.len()
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.wr.gather.is_empty()
    }

    /// The engine's work request this stands for.
    pub fn as_wr(&self) -> &SendWr {
        &self.wr
    }
}

/// A receive work request (`ibv_post_recv(3)`, `ibv_post_srq_recv(3)`): buffers an incoming
/// message is scattered into, in order.
///
/// ```
/// use softverbs::{AccessFlags, Context, DeviceConfig, RecvRequest};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let mr = ctx.alloc_pd().reg_mr(4096, AccessFlags::LOCAL_WRITE)?;
/// let recv = RecvRequest::new(9, &[mr.slice(0..2048)?, mr.slice(2048..)?]);
/// assert_eq!(recv.capacity(), 4096);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecvRequest {
    pub(crate) wr: RecvWr,
}

impl RecvRequest {
    /// A receive into `local`.
    pub fn new(wr_id: u64, local: &[MrSlice<'_>]) -> Self {
        RecvRequest {
            wr: RecvWr {
                wr_id,
                sg_list: sges(local),
            },
        }
    }

    /// The caller's id, returned in the completion.
    pub fn wr_id(&self) -> u64 {
        self.wr.wr_id
    }

    /// Total capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.wr.capacity()
    }

    /// The engine's work request this stands for.
    pub fn as_wr(&self) -> &RecvWr {
        &self.wr
    }
}
