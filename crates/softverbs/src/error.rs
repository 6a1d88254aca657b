//! Typed errors, one per operation. Each maps to the errno libibverbs reports for the same
//! failure ([`errno`](OpenError::errno) on every type), which only the C boundary turns into
//! a number. A bad argument or attribute is always one of these values, never a panic.

pub use softverbs_cq::{CreateError as CqCreateError, PollError, ResizeError};
pub use softverbs_device::{DeviceError, RegisterError};
pub use softverbs_proto::VerbsError;
use std::io;

const EINVAL: i32 = 22;
const EBUSY: i32 = 16;
const ENOMEM: i32 = 12;
const EIO: i32 = 5;

/// The errno of an I/O error: its OS code, or the code its kind stands for.
fn io_errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(match e.kind() {
        io::ErrorKind::WouldBlock => 11,
        io::ErrorKind::InvalidInput => EINVAL,
        io::ErrorKind::PermissionDenied => 13,
        io::ErrorKind::AddrInUse => 98,
        io::ErrorKind::AddrNotAvailable => 99,
        io::ErrorKind::TimedOut => 110,
        _ => EIO,
    })
}

/// Why a device could not be opened (`ibv_open_device(3)`).
/// ```
/// use softverbs::{Context, DeviceConfig, Network, UdpConfig};
/// // An address no interface has cannot be bound.
/// let config = DeviceConfig {
///     network: Network::Udp(UdpConfig { address: Some("192.0.2.1".parse().unwrap()), ..UdpConfig::default() }),
///     ..DeviceConfig::in_process()
/// };
/// let err = Context::open_with(config).unwrap_err();
/// assert_ne!(err.errno(), 0);
/// ```
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// `SOFTVERBS_NETWORK` is neither `inprocess` nor `udp`.
    #[error("SOFTVERBS_NETWORK={0:?}: expected \"inprocess\" or \"udp\"")]
    BadNetwork(String),
    /// The device (its transport, its progress thread) could not start.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

impl OpenError {
    /// The errno the C side reports.
    pub fn errno(&self) -> i32 {
        match self {
            OpenError::BadNetwork(_) => EINVAL,
            OpenError::Device(DeviceError::Io(e)) => io_errno(e),
            OpenError::Device(e) => e.errno(),
        }
    }
}

impl From<io::Error> for OpenError {
    fn from(e: io::Error) -> Self {
        OpenError::Device(DeviceError::Io(e))
    }
}

/// Why memory could not be registered (`ibv_reg_mr(3)`).
/// ```
/// use softverbs::{AccessFlags, Context, DeviceConfig, RegMrError};
/// let pd = Context::open_with(DeviceConfig::in_process())?.alloc_pd();
/// let err = pd.reg_mr(4096, AccessFlags::REMOTE_WRITE).unwrap_err(); // no LOCAL_WRITE
/// assert!(matches!(err, RegMrError::Register(_)));
/// assert_eq!(err.errno(), 22);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, thiserror::Error)]
pub enum RegMrError {
    /// A region needs at least one byte.
    #[error("a memory region needs at least one byte")]
    ZeroLength,
    /// The buffer could not be allocated.
    #[error("cannot allocate {0} bytes of page-aligned memory")]
    NoMemory(usize),
    /// The device refused the registration, for example `REMOTE_WRITE` without
    /// `LOCAL_WRITE`, which `ibv_reg_mr(3)` forbids (`EINVAL`), or
    /// [`RegisterError::OverMemlock`]: the process's registered pages would exceed its
    /// soft `RLIMIT_MEMLOCK` and the thread lacks `CAP_IPC_LOCK` (`ENOMEM`, as the
    /// kernel's `ib_umem_get`).
    #[error(transparent)]
    Register(#[from] RegisterError),
    /// Another device error.
    #[error(transparent)]
    Device(DeviceError),
}

impl RegMrError {
    /// The errno the C side reports.
    pub fn errno(&self) -> i32 {
        match self {
            RegMrError::ZeroLength => EINVAL,
            RegMrError::NoMemory(_) => ENOMEM,
            RegMrError::Register(e) => e.errno(),
            RegMrError::Device(e) => e.errno(),
        }
    }
}

impl From<DeviceError> for RegMrError {
    fn from(e: DeviceError) -> Self {
        match e {
            DeviceError::Register(r) => RegMrError::Register(r),
            other => RegMrError::Device(other),
        }
    }
}

/// A byte range outside a memory region, or too long for one scatter/gather entry.
///
/// ```
/// use softverbs::{AccessFlags, Context, DeviceConfig};
/// let mr = Context::open_with(DeviceConfig::in_process())?.alloc_pd().reg_mr(16, AccessFlags::empty())?;
/// let err = mr.slice(8..32).unwrap_err();
/// assert_eq!((err.start, err.end, err.len), (8, 32, 16));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("range {start}..{end} is not inside the {len}-byte region (or is longer than u32::MAX)")]
pub struct RangeError {
    /// First byte asked for.
    pub start: usize,
    /// One past the last byte asked for.
    pub end: usize,
    /// The region's length.
    pub len: usize,
}

impl RangeError {
    /// The errno the C side reports: `EINVAL`.
    pub const fn errno(&self) -> i32 {
        EINVAL
    }
}

/// Why a memory region could not be deregistered (`ibv_dereg_mr(3)`).
/// ```
/// use softverbs::{AccessFlags, Context, DeviceConfig};
/// let mr = Context::open_with(DeviceConfig::in_process())?.alloc_pd().reg_mr(16, AccessFlags::empty())?;
/// mr.dereg()?; // the usual outcome
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, thiserror::Error)]
pub enum DeregMrError {
    /// The device no longer knew the region.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

impl DeregMrError {
    /// The errno the C side reports.
    pub fn errno(&self) -> i32 {
        match self {
            DeregMrError::Device(e) => e.errno(),
        }
    }
}

/// Why a CQ could not be created (`ibv_create_cq(3)`, `ibv_create_cq_ex(3)`).
/// ```
/// use softverbs::{Context, DeviceConfig};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// assert_eq!(ctx.create_cq(0).unwrap_err().errno(), 22);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, thiserror::Error)]
pub enum CreateCqError {
    /// Size or fields refused.
    #[error(transparent)]
    Cq(#[from] CqCreateError),
    /// The completion channel belongs to another context.
    #[error("the completion channel belongs to another context")]
    ForeignChannel,
}

impl CreateCqError {
    /// The errno the C side reports.
    pub fn errno(&self) -> i32 {
        match self {
            CreateCqError::Cq(e) => e.errno(),
            CreateCqError::ForeignChannel => EINVAL,
        }
    }
}

/// Why a CQ could not be destroyed (`ibv_destroy_cq(3)`); the CQ is handed back with it.
/// ```
/// use softverbs::{Context, DestroyCqError, DeviceConfig, QpType};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let cq = ctx.create_cq(8)?;
/// let qp = ctx.alloc_pd().qp_builder(QpType::Rc, &cq, &cq).build()?;
/// let (cq, err) = cq.destroy().unwrap_err();
/// assert_eq!(err, DestroyCqError::QueuePairsAttached(1)); // one QP, for both its queues
/// drop(qp);
/// cq.destroy().map_err(|(_, e)| e)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DestroyCqError {
    /// `ibv_destroy_cq(3)`: "fails if any queue pair is still associated with this CQ".
    #[error("{0} queue pairs still use this CQ")]
    QueuePairsAttached(usize),
    /// Completion events were delivered and are not acknowledged yet (`ibv_get_cq_event(3)`).
    #[error("{0} completion events were delivered but not acknowledged")]
    UnacknowledgedEvents(u64),
}

impl DestroyCqError {
    /// The errno the C side reports: `EBUSY`.
    pub const fn errno(&self) -> i32 {
        EBUSY
    }
}

impl From<softverbs_cq::DestroyError> for DestroyCqError {
    fn from(e: softverbs_cq::DestroyError) -> Self {
        match e {
            softverbs_cq::DestroyError::QueuePairsAttached(n) => {
                DestroyCqError::QueuePairsAttached(n)
            }
            softverbs_cq::DestroyError::UnacknowledgedEvents(n) => {
                DestroyCqError::UnacknowledgedEvents(n)
            }
        }
    }
}

/// Why CQ moderation could not be set (`ibv_modify_cq(3)`).
pub use softverbs_cq::ModifyError as ModifyCqError;

/// Why a completion channel could not be created or read (`ibv_create_comp_channel(3)`,
/// `ibv_get_cq_event(3)`), or an async event read (`ibv_get_async_event(3)`).
/// ```
/// use softverbs::{Context, DeviceConfig};
/// let channel = Context::open_with(DeviceConfig::in_process())?.create_comp_channel()?;
/// channel.set_nonblocking(true)?;
/// let err = channel.get_event().unwrap_err(); // empty: EAGAIN
/// assert_eq!(err.errno(), 11);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// The event fd failed (or, non-blocking, had nothing: `WouldBlock`).
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl EventError {
    /// The errno the C side reports.
    pub fn errno(&self) -> i32 {
        match self {
            EventError::Io(e) => io_errno(e),
        }
    }
}

/// Why a completion channel could not be destroyed (`ibv_destroy_comp_channel(3)`).
///
/// ```
/// use softverbs::{Context, DestroyChannelError, DeviceConfig};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let channel = ctx.create_comp_channel()?;
/// let cq = ctx.cq_builder(8).channel(&channel).build()?;
/// let (channel, err) = channel.destroy().unwrap_err();
/// assert_eq!(err, DestroyChannelError::CqsAttached(1));
/// cq.destroy().map_err(|(_, e)| e)?;
/// channel.destroy().map_err(|(_, e)| e)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DestroyChannelError {
    /// "fails if any CQs are still associated with the completion event channel".
    #[error("{0} CQs still use this channel")]
    CqsAttached(usize),
}

impl DestroyChannelError {
    /// The errno the C side reports: `EBUSY`.
    pub const fn errno(&self) -> i32 {
        EBUSY
    }
}

/// Why a QP could not be created (`ibv_create_qp(3)`).
/// ```
/// use softverbs::{Context, DeviceConfig, QpType};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let cq = ctx.create_cq(8)?;
/// let err = ctx.alloc_pd().qp_builder(QpType::Rc, &cq, &cq).max_send_wr(u32::MAX).build().unwrap_err();
/// assert_eq!(err.errno(), 22);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, thiserror::Error)]
pub enum CreateQpError {
    /// A CQ, SRQ or PD of another context was named.
    #[error("the {0} belongs to another context")]
    ForeignObject(&'static str),
    /// The engine refused the attributes (capacities above the device's limits, …).
    #[error(transparent)]
    Verbs(VerbsError),
    /// Another device error.
    #[error(transparent)]
    Device(DeviceError),
}

/// Why a QP could not be modified (`ibv_modify_qp(3)`).
/// ```
/// use softverbs::{Context, DeviceConfig, QpType, RtsAttr};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let cq = ctx.create_cq(8)?;
/// let qp = ctx.alloc_pd().qp_builder(QpType::Rc, &cq, &cq).build()?;
/// let err = qp.to_rts(RtsAttr::new(0)).unwrap_err(); // RESET -> RTS is illegal
/// assert_eq!(err.errno(), 22);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, thiserror::Error)]
pub enum ModifyQpError {
    /// A transition to RTR of an RC or UC QP needs the remote's [`RemoteInfo`](crate::RemoteInfo).
    #[error("moving a connected QP to RTR needs the remote QP's information")]
    MissingRemote,
    /// The attributes, the mask or the transition are invalid (`EINVAL`).
    #[error(transparent)]
    Verbs(VerbsError),
    /// Another device error.
    #[error(transparent)]
    Device(DeviceError),
}

/// Why a work request could not be posted (`ibv_post_send(3)`, `ibv_post_recv(3)`,
/// `ibv_post_srq_recv(3)`).
///
/// ```
/// use softverbs::{Context, DeviceConfig, PostError, QpType, SendRequest};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let cq = ctx.create_cq(8)?;
/// let qp = ctx.alloc_pd().qp_builder(QpType::Rc, &cq, &cq).build()?;
/// let err = qp.post_send(SendRequest::send_inline(1, b"x")).unwrap_err(); // QP in RESET
/// assert!(matches!(err, PostError::InvalidRequest(_)));
/// assert_eq!(err.errno(), 22);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    /// The request does not make sense for this QP, its state or the operation (an atomic
    /// whose local buffer is not 8 bytes, a UD send with no destination, a connected send
    /// with one, a post before RTS, …): the engine's refusal, the one the drop-in gets too.
    #[error("invalid work request: {0}")]
    InvalidRequest(&'static str),
    /// The engine refused it for another reason than the request (queue full: `ENOMEM`).
    #[error(transparent)]
    Verbs(VerbsError),
    /// Another device error.
    #[error(transparent)]
    Device(DeviceError),
}

/// Why a QP could not be destroyed (`ibv_destroy_qp(3)`); the QP is handed back with it.
/// ```
/// use softverbs::{Context, DeviceConfig, QpType};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let cq = ctx.create_cq(8)?;
/// let qp = ctx.alloc_pd().qp_builder(QpType::Ud, &cq, &cq).build()?;
/// qp.destroy().map_err(|(_, e)| e)?; // the usual outcome
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, thiserror::Error)]
pub enum DestroyQpError {
    /// The engine refused it.
    #[error(transparent)]
    Verbs(VerbsError),
    /// Another device error.
    #[error(transparent)]
    Device(DeviceError),
}

/// Why a QP could not be queried (`ibv_query_qp(3)`).
/// ```
/// use softverbs::{Context, DeviceConfig, QpState, QpType};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let cq = ctx.create_cq(8)?;
/// let qp = ctx.alloc_pd().qp_builder(QpType::Uc, &cq, &cq).build()?;
/// assert_eq!(qp.query()?.0.qp_state, QpState::Reset);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, thiserror::Error)]
pub enum QueryQpError {
    /// The engine refused it.
    #[error(transparent)]
    Verbs(VerbsError),
    /// Another device error.
    #[error(transparent)]
    Device(DeviceError),
}

/// Why an SRQ could not be created, modified or destroyed (`ibv_create_srq(3)`,
/// `ibv_modify_srq(3)`, `ibv_destroy_srq(3)`).
/// ```
/// use softverbs::{Context, DeviceConfig, SrqInit};
/// let pd = Context::open_with(DeviceConfig::in_process())?.alloc_pd();
/// let err = pd.create_srq(SrqInit { max_wr: 4, srq_limit: 8, ..SrqInit::default() }).unwrap_err();
/// assert_eq!(err.errno(), 22);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, thiserror::Error)]
pub enum SrqError {
    /// The engine refused it (sizes above the limits, still in use, …).
    #[error(transparent)]
    Verbs(VerbsError),
    /// Another device error.
    #[error(transparent)]
    Device(DeviceError),
}

/// Why an address handle could not be created (`ibv_create_ah(3)`).
/// ```
/// use softverbs::{AhAttr, Context, CreateAhError, DeviceConfig};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let mut attr = AhAttr::new(ctx.gid(0).unwrap());
/// attr.port = 3;
/// assert_eq!(ctx.alloc_pd().create_ah(&attr).unwrap_err(), CreateAhError::NoSuchPort(3));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CreateAhError {
    /// Only port 1 exists.
    #[error("port {0} does not exist (only port 1)")]
    NoSuchPort(u8),
    /// Only GID index 0 exists.
    #[error("GID index {0} does not exist (only index 0)")]
    NoSuchGidIndex(u8),
}

impl CreateAhError {
    /// The errno the C side reports: `EINVAL`.
    pub const fn errno(&self) -> i32 {
        EINVAL
    }
}

/// Why a port could not be queried (`ibv_query_port(3)`).
/// ```
/// use softverbs::{Context, DeviceConfig, QueryPortError};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// assert_eq!(ctx.query_port(0).unwrap_err(), QueryPortError::NoSuchPort(0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QueryPortError {
    /// Only port 1 exists.
    #[error("port {0} does not exist (only port 1)")]
    NoSuchPort(u8),
}

impl QueryPortError {
    /// The errno the C side reports: `EINVAL`.
    pub const fn errno(&self) -> i32 {
        EINVAL
    }
}

/// The errno-bearing errors whose cause is a [`DeviceError`] split into the engine's
/// [`VerbsError`] and the rest.
macro_rules! verbs_or_device {
    ($($t:ident),*) => {$(
        impl From<DeviceError> for $t {
            fn from(e: DeviceError) -> Self {
                match e {
                    DeviceError::Verbs(v) => $t::Verbs(v),
                    other => $t::Device(other),
                }
            }
        }
    )*};
}
verbs_or_device!(
    CreateQpError,
    ModifyQpError,
    PostError,
    DestroyQpError,
    QueryQpError,
    SrqError
);

impl CreateQpError {
    /// The errno the C side reports.
    pub fn errno(&self) -> i32 {
        match self {
            CreateQpError::ForeignObject(_) => EINVAL,
            CreateQpError::Verbs(e) => e.errno(),
            CreateQpError::Device(e) => e.errno(),
        }
    }
}

impl ModifyQpError {
    /// The errno the C side reports.
    pub fn errno(&self) -> i32 {
        match self {
            ModifyQpError::MissingRemote => EINVAL,
            ModifyQpError::Verbs(e) => e.errno(),
            ModifyQpError::Device(e) => e.errno(),
        }
    }
}

impl PostError {
    /// The errno the C side reports.
    pub fn errno(&self) -> i32 {
        match self {
            PostError::InvalidRequest(_) => EINVAL,
            PostError::Verbs(e) => e.errno(),
            PostError::Device(e) => e.errno(),
        }
    }
}

impl DestroyQpError {
    /// The errno the C side reports.
    pub fn errno(&self) -> i32 {
        match self {
            DestroyQpError::Verbs(e) => e.errno(),
            DestroyQpError::Device(e) => e.errno(),
        }
    }
}

impl QueryQpError {
    /// The errno the C side reports.
    pub fn errno(&self) -> i32 {
        match self {
            QueryQpError::Verbs(e) => e.errno(),
            QueryQpError::Device(e) => e.errno(),
        }
    }
}

impl SrqError {
    /// The errno the C side reports.
    pub fn errno(&self) -> i32 {
        match self {
            SrqError::Verbs(e) => e.errno(),
            SrqError::Device(e) => e.errno(),
        }
    }
}
