//! Queue pairs (`ibv_create_qp(3)`, `ibv_modify_qp(3)`, `ibv_query_qp(3)`,
//! `ibv_post_send(3)`, `ibv_post_recv(3)`, `ibv_destroy_qp(3)`): RC, UC and UD.
//!
//! A [`Qp`] holds its PD, its CQs (a [`Cq`](crate::Cq) cannot be destroyed while a QP
//! completes into it) and its SRQ. The usual transitions have their own attribute types
//! with the masks `ibv_modify_qp(3)` requires for the QP's type filled in:
//! [`Qp::to_init`] ([`InitAttr`]), [`Qp::to_rtr`] ([`RtrAttr`], usually from the peer's
//! [`RemoteInfo`]) and [`Qp::to_rts`] ([`RtsAttr`]); [`Qp::modify`] takes any attribute and
//! mask. A bad attribute, mask or transition is an error value.

use crate::cq::{AnyCq, CqLink};
use crate::error::Error;
use crate::mr::ParseError;
use crate::pd::Pd;
use crate::srq::{Srq, SrqInner};
use crate::wr::{RecvRequest, SendRequest};
use softverbs_device::Gid;
use softverbs_proto::{
    AccessFlags, AddressVector, AttrMask, Mtu, Object, QpAttr, QpCaps, QpInit, QpState, QpType,
};
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;

/// How to create a QP (`struct ibv_qp_init_attr`); from [`Pd::qp_builder`].
///
/// ```
/// use softverbs::{Context, DeviceConfig, QpType, QpState};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let pd = ctx.alloc_pd();
/// let cq = ctx.create_cq(64)?;
/// let qp = pd.qp_builder(QpType::Rc, &cq, &cq).max_send_wr(32).sq_sig_all(true).build()?;
/// assert_eq!(qp.state()?, QpState::Reset);
/// assert!(pd.qp_builder(QpType::Rc, &cq, &cq).max_send_wr(1 << 30).build().is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct QpBuilder {
    pd: Pd,
    init: QpInit,
    send_cq: CqLink,
    recv_cq: CqLink,
    srq: Option<Arc<SrqInner>>,
}

impl fmt::Debug for QpBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QpBuilder")
            .field("init", &self.init)
            .finish()
    }
}

impl QpBuilder {
    /// Sets all queue sizes at once.
    pub fn caps(mut self, caps: QpCaps) -> Self {
        self.init.caps = caps;
        self
    }

    /// Send queue depth.
    pub fn max_send_wr(mut self, n: u32) -> Self {
        self.init.caps.max_send_wr = n;
        self
    }

    /// Receive queue depth.
    pub fn max_recv_wr(mut self, n: u32) -> Self {
        self.init.caps.max_recv_wr = n;
        self
    }

    /// Scatter/gather entries per send request.
    pub fn max_send_sge(mut self, n: u32) -> Self {
        self.init.caps.max_send_sge = n;
        self
    }

    /// Scatter/gather entries per receive request.
    pub fn max_recv_sge(mut self, n: u32) -> Self {
        self.init.caps.max_recv_sge = n;
        self
    }

    /// Largest inline payload.
    pub fn max_inline_data(mut self, n: u32) -> Self {
        self.init.caps.max_inline_data = n;
        self
    }

    /// Every send request completes (`sq_sig_all`), not only signaled ones.
    pub fn sq_sig_all(mut self, on: bool) -> Self {
        self.init.sq_sig_all = on;
        self
    }

    /// Receives come from `srq` instead of the QP's own receive queue.
    pub fn srq(mut self, srq: &Srq) -> Self {
        self.init.srq = Some(srq.inner.id);
        self.srq = Some(srq.inner.clone());
        self
    }

    /// Creates the QP, in RESET.
    pub fn build(self) -> Result<Qp, Error> {
        let ctx = &self.pd.inner.ctx;
        if !self.send_cq.ctx.same(ctx) || !self.recv_cq.ctx.same(ctx) {
            return Err(Error::ForeignObject { object: Object::Cq });
        }
        if let Some(srq) = &self.srq {
            if !srq.pd.inner.ctx.same(ctx) {
                return Err(Error::ForeignObject {
                    object: Object::Srq,
                });
            }
        }
        let qpn = ctx.inner.device.create_qp(
            self.init,
            self.send_cq.producer.clone(),
            self.recv_cq.producer.clone(),
        )?;
        Ok(Qp {
            pd: self.pd,
            qpn,
            init: self.init,
            _holds: Box::new(QpHolds {
                _send_cq: self.send_cq,
                _recv_cq: self.recv_cq,
                _srq: self.srq,
            }),
            live: true,
        })
    }
}

impl Pd {
    /// A builder for a QP of `qp_type` completing sends into `send_cq` and receives into
    /// `recv_cq` (`ibv_create_qp(3)`).
    pub fn qp_builder(
        &self,
        qp_type: QpType,
        send_cq: &impl AnyCq,
        recv_cq: &impl AnyCq,
    ) -> QpBuilder {
        QpBuilder {
            pd: self.clone(),
            // The QP reaches only memory regions of this PD (IBTA ch. 10 protection
            // domains): an L_Key or R_Key of another PD's region is refused.
            init: QpInit::new(qp_type).with_pd(self.inner.handle),
            send_cq: send_cq.link().0,
            recv_cq: recv_cq.link().0,
            srq: None,
        }
    }
}

/// What one side tells the other to connect an RC or UC QP (the `ibv_rc_pingpong`
/// exchange): QP number, first PSN, GID and MTU. Prints and parses as
/// `QPN:PSN:MTU:GID` (QPN and PSN in hexadecimal, MTU in bytes, GID as an IP address).
///
/// ```
/// use softverbs::{Gid, Mtu, RemoteInfo};
/// let info = RemoteInfo { qpn: 0x11, psn: 0x1234, gid: Gid::from_ip("::1".parse().unwrap()), mtu: Mtu::Mtu1024 };
/// assert_eq!(info.to_string(), "000011:001234:1024:::1");
/// assert_eq!(info.to_string().parse::<RemoteInfo>()?, info);
/// assert!("nonsense".parse::<RemoteInfo>().is_err());
/// # Ok::<(), softverbs::ParseError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteInfo {
    /// The peer's QP number.
    pub qpn: u32,
    /// The first PSN the peer sends with (our `rq_psn`).
    pub psn: u32,
    /// The peer's GID.
    pub gid: Gid,
    /// The peer's path MTU (the smaller of the two sides' is used).
    pub mtu: Mtu,
}

impl fmt::Display for RemoteInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:06x}:{:06x}:{}:{}",
            self.qpn,
            self.psn,
            self.mtu.bytes(),
            IpAddr::from(self.gid)
        )
    }
}

impl FromStr for RemoteInfo {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        let err = || ParseError {
            what: "remote QP information",
            text: s.to_owned(),
        };
        let mut parts = s.trim().splitn(4, ':');
        let mut next = || parts.next().ok_or_else(err);
        let qpn = u32::from_str_radix(next()?, 16).map_err(|_| err())?;
        let psn = u32::from_str_radix(next()?, 16).map_err(|_| err())?;
        let mtu = match next()?.parse::<u32>().map_err(|_| err())? {
            256 => Mtu::Mtu256,
            512 => Mtu::Mtu512,
            1024 => Mtu::Mtu1024,
            2048 => Mtu::Mtu2048,
            4096 => Mtu::Mtu4096,
            _ => return Err(err()),
        };
        let ip: IpAddr = next()?.parse().map_err(|_| err())?;
        Ok(RemoteInfo {
            qpn,
            psn: psn & 0xff_ffff,
            gid: Gid::from_ip(ip),
            mtu,
        })
    }
}

/// RESET → INIT (`ibv_modify_qp(3)`): port, P_Key index, the remote access the QP allows
/// (RC, UC) or its Q_Key (UD).
///
/// ```
/// use softverbs::{AccessFlags, InitAttr};
/// let attr = InitAttr::default().access(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ);
/// assert_eq!(attr.port, 1);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitAttr {
    /// Port (only 1).
    pub port: u8,
    /// P_Key index (only 0).
    pub pkey_index: u16,
    /// Remote operations the responder allows (RC, UC).
    pub access: AccessFlags,
    /// Q_Key (UD).
    pub qkey: u32,
}

impl Default for InitAttr {
    fn default() -> Self {
        InitAttr {
            port: 1,
            pkey_index: 0,
            access: AccessFlags::empty(),
            qkey: 0,
        }
    }
}

impl InitAttr {
    /// Sets the remote access allowed.
    pub fn access(mut self, access: AccessFlags) -> Self {
        self.access = access;
        self
    }

    /// Sets the Q_Key (UD).
    pub fn qkey(mut self, qkey: u32) -> Self {
        self.qkey = qkey;
        self
    }

    /// Sets the port.
    pub fn port(mut self, port: u8) -> Self {
        self.port = port;
        self
    }
}

impl From<AccessFlags> for InitAttr {
    fn from(access: AccessFlags) -> Self {
        InitAttr::default().access(access)
    }
}

/// INIT → RTR (`ibv_modify_qp(3)`): for RC and UC the peer ([`RemoteInfo`]) and, for RC,
/// the responder resources and RNR timer; UD needs nothing.
///
/// ```
/// use softverbs::{Gid, Mtu, RemoteInfo, RtrAttr};
/// let peer = RemoteInfo { qpn: 0x12, psn: 7, gid: Gid::from_ip("127.0.0.2".parse().unwrap()), mtu: Mtu::Mtu4096 };
/// let attr = RtrAttr::from(peer).max_dest_rd_atomic(8);
/// assert_eq!(attr.remote, Some(peer));
/// assert_eq!(RtrAttr::datagram().remote, None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtrAttr {
    /// The peer (RC, UC); `None` for UD.
    pub remote: Option<RemoteInfo>,
    /// Incoming reads and atomics in flight (RC).
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code (RC, 0..=31).
    pub min_rnr_timer: u8,
    /// IP hop limit towards the peer.
    pub hop_limit: u8,
    /// IP traffic class towards the peer.
    pub traffic_class: u8,
}

impl RtrAttr {
    /// RTR of a UD QP.
    pub fn datagram() -> Self {
        RtrAttr {
            remote: None,
            max_dest_rd_atomic: 4,
            min_rnr_timer: 12,
            hop_limit: 64,
            traffic_class: 0,
        }
    }

    /// Sets the responder resources (RC).
    pub fn max_dest_rd_atomic(mut self, n: u8) -> Self {
        self.max_dest_rd_atomic = n;
        self
    }

    /// Sets the RNR NAK timer code (RC).
    pub fn min_rnr_timer(mut self, code: u8) -> Self {
        self.min_rnr_timer = code;
        self
    }
}

impl Default for RtrAttr {
    fn default() -> Self {
        RtrAttr::datagram()
    }
}

impl From<RemoteInfo> for RtrAttr {
    fn from(remote: RemoteInfo) -> Self {
        RtrAttr {
            remote: Some(remote),
            ..RtrAttr::datagram()
        }
    }
}

/// RTR → RTS (`ibv_modify_qp(3)`): the first send PSN and, for RC, the retry policy and
/// the outgoing read/atomic budget.
///
/// ```
/// use softverbs::RtsAttr;
/// let attr = RtsAttr::new(0x1234).retry_cnt(3);
/// assert_eq!((attr.sq_psn, attr.retry_cnt, attr.rnr_retry), (0x1234, 3, 7));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtsAttr {
    /// First PSN this QP sends (what the peer got as [`RemoteInfo::psn`]).
    pub sq_psn: u32,
    /// Local ACK timeout code: 4.096 µs · 2^timeout (RC).
    pub timeout: u8,
    /// Transport retries (RC, 0..=7).
    pub retry_cnt: u8,
    /// RNR retries (RC, 0..=7, 7 = infinite).
    pub rnr_retry: u8,
    /// Outgoing reads and atomics in flight (RC).
    pub max_rd_atomic: u8,
}

impl RtsAttr {
    /// RTS sending from `sq_psn`, with timeout 14, seven retries, infinite RNR retries and
    /// four reads/atomics in flight.
    pub fn new(sq_psn: u32) -> Self {
        RtsAttr {
            sq_psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 4,
        }
    }

    /// Sets the local ACK timeout code.
    pub fn timeout(mut self, code: u8) -> Self {
        self.timeout = code;
        self
    }

    /// Sets the transport retry count.
    pub fn retry_cnt(mut self, n: u8) -> Self {
        self.retry_cnt = n;
        self
    }

    /// Sets the RNR retry count.
    pub fn rnr_retry(mut self, n: u8) -> Self {
        self.rnr_retry = n;
        self
    }

    /// Sets the outgoing read/atomic budget.
    pub fn max_rd_atomic(mut self, n: u8) -> Self {
        self.max_rd_atomic = n;
        self
    }
}

impl Default for RtsAttr {
    fn default() -> Self {
        RtsAttr::new(0)
    }
}

/// A queue pair (`struct ibv_qp`). Dropping it destroys it.
///
/// ```
/// use softverbs::{AccessFlags, Context, DeviceConfig, QpType, RtsAttr};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let pd = ctx.alloc_pd();
/// let cq = ctx.create_cq(64)?;
/// let a = pd.qp_builder(QpType::Rc, &cq, &cq).build()?;
/// let b = pd.qp_builder(QpType::Rc, &cq, &cq).build()?;
/// for (me, peer) in [(&a, &b), (&b, &a)] {
///     me.to_init(AccessFlags::REMOTE_WRITE)?;
///     me.to_rtr(peer.local_info(100))?;
///     me.to_rts(RtsAttr::new(100))?;
/// }
/// assert!(cq.destroy().is_err()); // two QPs still complete into it
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Qp {
    pd: Pd,
    qpn: u32,
    init: QpInit,
    _holds: Box<QpHolds>,
    live: bool,
}

/// What a QP keeps alive: its CQs and SRQ.
struct QpHolds {
    _send_cq: CqLink,
    _recv_cq: CqLink,
    _srq: Option<Arc<SrqInner>>,
}

impl fmt::Debug for Qp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &self.qpn)
            .field("type", &self.init.qp_type)
            .finish()
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        if self.live {
            // Dropping cannot fail: the QP leaves its multicast groups first, as the kernel
            // detaches a QP whose owner went away ([`Qp::destroy`] refuses instead).
            self.device().detach_all_mcast(self.qpn);
            let _ = self.device().destroy_qp(self.qpn);
        }
    }
}

impl Qp {
    fn device(&self) -> &softverbs_device::Device {
        &self.pd.inner.ctx.inner.device
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The transport service type.
    pub fn qp_type(&self) -> QpType {
        self.init.qp_type
    }

    /// What the QP was created with.
    pub fn init_attr(&self) -> QpInit {
        self.init
    }

    /// The protection domain it belongs to.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// What the peer needs to connect to this QP, announcing `psn` as the first PSN it
    /// will send with (then [`Qp::to_rts`] with the same PSN). Its GID is the device's
    /// address (GID index 1 of an IPv4 device), which any RoCEv2 peer reaches, kernel rxe
    /// included.
    pub fn local_info(&self, psn: u32) -> RemoteInfo {
        RemoteInfo {
            qpn: self.qpn,
            psn: psn & 0xff_ffff,
            gid: Gid::from_ip(self.device().address()),
            mtu: self.device().port_attr().active_mtu,
        }
    }

    /// The current state.
    pub fn state(&self) -> Result<QpState, Error> {
        Ok(self.device().query_qp(self.qpn)?.0.qp_state)
    }

    /// The attributes and creation parameters (`ibv_query_qp(3)`).
    pub fn query(&self) -> Result<(QpAttr, QpInit), Error> {
        Ok(self.device().query_qp(self.qpn)?)
    }

    /// Any transition with any attributes (`ibv_modify_qp(3)`): `mask` says which fields
    /// of `attr` apply.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<(), Error> {
        Ok(self.device().modify_qp(self.qpn, attr, mask)?)
    }

    /// RESET → INIT.
    pub fn to_init(&self, attr: impl Into<InitAttr>) -> Result<(), Error> {
        let attr = attr.into();
        let qp_attr = QpAttr {
            qp_state: QpState::Init,
            port_num: attr.port,
            pkey_index: attr.pkey_index,
            qp_access_flags: attr.access,
            qkey: attr.qkey,
            ..QpAttr::default()
        };
        let mut mask = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT;
        mask |= match self.init.qp_type {
            QpType::Ud => AttrMask::QKEY,
            QpType::Rc | QpType::Uc => AttrMask::ACCESS_FLAGS,
        };
        self.modify(&qp_attr, mask)
    }

    /// INIT → RTR. The path MTU is the smaller of the peer's and this port's.
    pub fn to_rtr(&self, attr: impl Into<RtrAttr>) -> Result<(), Error> {
        let attr = attr.into();
        let mut qp_attr = QpAttr {
            qp_state: QpState::Rtr,
            ..QpAttr::default()
        };
        let mut mask = AttrMask::STATE;
        if self.init.qp_type != QpType::Ud {
            let remote = attr.remote.ok_or(Error::MissingRemote)?;
            qp_attr.path_mtu = remote.mtu.min(self.device().port_attr().active_mtu);
            qp_attr.dest_qp_num = remote.qpn;
            qp_attr.rq_psn = remote.psn;
            qp_attr.ah_attr = AddressVector {
                dgid: remote.gid.0,
                is_global: true,
                hop_limit: attr.hop_limit,
                traffic_class: attr.traffic_class,
                port_num: 1,
                ..AddressVector::default()
            };
            mask |= AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN;
        }
        if self.init.qp_type == QpType::Rc {
            qp_attr.max_dest_rd_atomic = attr.max_dest_rd_atomic;
            qp_attr.min_rnr_timer = attr.min_rnr_timer;
            mask |= AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
        }
        self.modify(&qp_attr, mask)
    }

    /// RTR → RTS.
    pub fn to_rts(&self, attr: impl Into<RtsAttr>) -> Result<(), Error> {
        let attr = attr.into();
        let qp_attr = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: attr.sq_psn & 0xff_ffff,
            timeout: attr.timeout,
            retry_cnt: attr.retry_cnt,
            rnr_retry: attr.rnr_retry,
            max_rd_atomic: attr.max_rd_atomic,
            ..QpAttr::default()
        };
        let mut mask = AttrMask::STATE | AttrMask::SQ_PSN;
        if self.init.qp_type == QpType::Rc {
            mask |= AttrMask::TIMEOUT
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::MAX_QP_RD_ATOMIC;
        }
        self.modify(&qp_attr, mask)
    }

    /// Any state → ERR: outstanding work requests are flushed (`IBV_WC_WR_FLUSH_ERR`).
    pub fn to_error(&self) -> Result<(), Error> {
        self.to_state(QpState::Err)
    }

    /// Any state → RESET: queues emptied, attributes forgotten.
    pub fn to_reset(&self) -> Result<(), Error> {
        self.to_state(QpState::Reset)
    }

    fn to_state(&self, state: QpState) -> Result<(), Error> {
        let attr = QpAttr {
            qp_state: state,
            ..QpAttr::default()
        };
        self.modify(&attr, AttrMask::STATE)
    }

    /// Posts a send work request (`ibv_post_send(3)`).
    pub fn post_send(&self, wr: SendRequest) -> Result<(), Error> {
        // The engine checks everything, as it does for the drop-in: which opcodes the QP
        // type takes, a UD send's address handle and its protection domain (IBTA 10.2.3),
        // inline only on sends and writes, an atomic's 8 bytes, the SGE count, the QP's
        // state.
        Ok(self.device().post_send(self.qpn, wr.wr)?)
    }

    /// Posts several send work requests in order, stopping at the first refused
    /// (`ibv_post_send(3)`'s `bad_wr`): on error, the index of that request and why.
    pub fn post_send_all(
        &self,
        wrs: impl IntoIterator<Item = SendRequest>,
    ) -> Result<(), (usize, Error)> {
        for (i, wr) in wrs.into_iter().enumerate() {
            self.post_send(wr).map_err(|e| (i, e))?;
        }
        Ok(())
    }

    /// Posts a receive work request (`ibv_post_recv(3)`). A QP with an SRQ takes its
    /// receives from the SRQ instead.
    pub fn post_recv(&self, wr: RecvRequest) -> Result<(), Error> {
        Ok(self.device().post_recv(self.qpn, wr.wr)?)
    }

    /// Attaches this UD QP to the multicast group `gid` (`ibv_attach_mcast(3)`): from now on
    /// it receives the datagrams sent to the group's QPN 0xFFFFFF with its Q_Key, from any
    /// process of this host or beyond. A UD send reaches the group through an address
    /// handle to `gid` and remote QPN [`MULTICAST_QPN`](crate::MULTICAST_QPN). Attaching
    /// twice changes nothing.
    ///
    /// Errors: a QP that is not UD ([`VerbsError::MulticastNeedsUd`](crate::VerbsError)),
    /// a GID that is not multicast ([`VerbsError::NotMulticast`](crate::VerbsError)), both
    /// `EINVAL`; the device's limits (`ENOMEM`); the socket's error if the group cannot be
    /// joined.
    ///
    /// ```
    /// use softverbs::{Context, DeviceConfig, Gid, QpType};
    /// let ctx = Context::open_with(DeviceConfig::in_process())?;
    /// let pd = ctx.alloc_pd();
    /// let cq = ctx.create_cq(16)?;
    /// let qp = pd.qp_builder(QpType::Ud, &cq, &cq).build()?;
    /// let group = Gid::from("239.1.2.3".parse::<std::net::Ipv4Addr>()?);
    /// qp.attach_mcast(&group)?;
    /// assert_eq!(qp.detach_mcast(&group)?, ());
    /// assert_eq!(qp.detach_mcast(&group).unwrap_err().errno(), 22); // not attached: EINVAL
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn attach_mcast(&self, gid: &Gid) -> Result<(), Error> {
        Ok(self.device().attach_mcast(self.qpn, gid.octets())?)
    }

    /// Detaches this QP from the multicast group `gid` (`ibv_detach_mcast(3)`); `EINVAL` if
    /// it is not attached. Dropping the QP detaches it from every group.
    pub fn detach_mcast(&self, gid: &Gid) -> Result<(), Error> {
        Ok(self.device().detach_mcast(self.qpn, gid.octets())?)
    }

    /// Destroys the QP (`ibv_destroy_qp(3)`), handing it back on failure (`EBUSY` while it
    /// is attached to a multicast group, as the kernel); dropping it detaches it and
    /// destroys it, ignoring the outcome. Its CQs and SRQ may be destroyed afterwards.
    pub fn destroy(mut self) -> Result<(), (Qp, Error)> {
        match self.device().destroy_qp(self.qpn) {
            Ok(()) => {
                self.live = false;
                Ok(())
            }
            Err(e) => Err((self, e.into())),
        }
    }
}
