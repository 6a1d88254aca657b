//! [`Error`]: why a verb failed, the one error type of the verbs core, and
//! [`Error::errno`], the only place a cause becomes the errno libibverbs reports for it.
//!
//! The layers below state causes only: the engine's [`VerbsError`] (QP and SRQ attributes,
//! states, capacities, work requests, and the device's objects: a PD still in use, an
//! unknown handle), the device's [`RegisterError`] (`ibv_reg_mr`), the CQ core's
//! [`CreateError`] and [`ResizeError`]. Each converts into [`Error`] with `?`; the safe API
//! returns it as it is, and the drop-in turns it into a C return value with
//! [`Error::errno`] and nothing else.

use softverbs_cq::{CreateError, DestroyError, ModifyError, PollError, ResizeError};
use softverbs_device::memory::AdviseError;
use softverbs_device::{DeviceError, RegisterError};
use softverbs_proto::{Object, VerbsError};
use std::io;

/// Why a verb failed: one variant per cause, each carrying what a caller needs to see the
/// mistake. [`Error::errno`] gives the errno libibverbs reports for it.
///
/// ```
/// use softverbs::{AhAttr, Context, DeviceConfig, Error, VerbsError};
/// let ctx = Context::open_with(DeviceConfig::in_process())?;
/// let mut attr = AhAttr::new(ctx.gid(0).unwrap());
/// attr.sgid_index = 3;
/// let err = ctx.alloc_pd().create_ah(&attr).unwrap_err();
/// assert!(matches!(err, Error::Verbs(VerbsError::BadSgidIndex { index: 3, table_len: 2 })));
/// assert_eq!(err.errno(), 22); // EINVAL, as the kernel's rdma_get_gid_attr
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A verbs rule refused it: a QP or SRQ attribute, state or capacity, a work request,
    /// an address vector, or an object rule (a PD still in use, an unknown handle).
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// `ibv_reg_mr(3)` refused the registration.
    #[error(transparent)]
    Register(#[from] RegisterError),
    /// `ibv_create_cq(3)` refused the size or the fields.
    #[error(transparent)]
    CqCreate(#[from] CreateError),
    /// `ibv_resize_cq(3)` refused the size.
    #[error(transparent)]
    CqResize(ResizeError),
    /// The CQ overran and is in the error state (`ibv_poll_cq(3)`: "the CQ cannot be
    /// used"); polling, moderating or resizing it fails.
    #[error("the CQ overran and is in the error state")]
    CqInError,
    /// An object cannot be destroyed while events about it were delivered and not
    /// acknowledged (`ibv_get_cq_event(3)`, `ibv_get_async_event(3)`) — in the form that
    /// refuses rather than waits.
    #[error("{count} events of this {object} were delivered and are not acknowledged")]
    UnacknowledgedEvents {
        /// The object.
        object: Object,
        /// Events not acknowledged.
        count: u64,
    },
    /// An object of another device context was named (a CQ, SRQ, PD or channel).
    #[error("the {object} belongs to another context")]
    ForeignObject {
        /// The kind of object.
        object: Object,
    },
    /// Moving an RC or UC QP to RTR needs the remote QP's number and address.
    #[error("moving a connected QP to RTR needs the remote QP's information")]
    MissingRemote,
    /// Memory for an object could not be allocated.
    #[error("cannot allocate {bytes} bytes")]
    NoMemory {
        /// What was asked for.
        bytes: usize,
    },
    /// `SOFTVERBS_NETWORK` is neither `inprocess` nor `udp`.
    #[error("SOFTVERBS_NETWORK={0:?}: expected \"inprocess\" or \"udp\"")]
    BadNetwork(String),
    /// The operating system refused (a socket, an event fd; a non-blocking read with
    /// nothing to read is `WouldBlock`).
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl Error {
    /// The errno libibverbs reports for this cause (Linux numbering). This is the only
    /// place a cause becomes an errno.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Verbs(e) => match e {
                VerbsError::QueueFull { .. } | VerbsError::TooManyObjects { .. } => libc::ENOMEM,
                // ibv_dereg_mr(3) of a region a memory window is bound to: rxe's
                // rxe_dereg_mr answers EINVAL (IBA 10.6.7.2.6).
                VerbsError::InUse {
                    object: Object::Mr,
                    by: Object::Mw,
                    ..
                } => libc::EINVAL,
                VerbsError::InUse { .. } => libc::EBUSY,
                // ibv_modify_qp(3), ibv_create_qp(3), ibv_post_send(3), ...: EINVAL for an
                // attribute, a state, a capacity, a request or a handle the device does
                // not know (the kernel's answer to an unknown handle).
                _ => libc::EINVAL,
            },
            Error::Register(e) => match e {
                RegisterError::MissingLocalWrite
                | RegisterError::ZeroLength
                | RegisterError::BadRange
                | RegisterError::NothingToChange
                | RegisterError::EmptyTranslation => libc::EINVAL,
                // get_user_pages: a page not mapped with the access asked.
                RegisterError::Unmapped { .. }
                | RegisterError::NotReadable { .. }
                | RegisterError::NotWritable { .. } => libc::EFAULT,
                // ib_umem_get charges RLIMIT_MEMLOCK before pinning.
                RegisterError::OverMemlock { .. } | RegisterError::NoRandomness => libc::ENOMEM,
                // can_do_mlock with a zero limit.
                RegisterError::MemlockNotPermitted => libc::EPERM,
                // ib_init_umem_odp's check_add_overflow.
                RegisterError::Overflow => libc::EOVERFLOW,
                RegisterError::ImplicitIova => libc::EINVAL,
                RegisterError::OnDemandUnsupported => libc::EOPNOTSUPP,
                // ibv_advise_mr(3), as the kernel reports each cause
                // (softverbs_device::memory::AdviseError names where).
                RegisterError::Advice(a) => match a {
                    AdviseError::UnknownFlags { .. } => libc::EINVAL,
                    AdviseError::Unsupported(_) => libc::EOPNOTSUPP,
                    AdviseError::NotOnDemand { .. } => libc::ENOENT,
                    AdviseError::OtherPd { .. } | AdviseError::NotWritable { .. } => libc::EPERM,
                    AdviseError::OutOfRange { .. } | AdviseError::Unmapped { .. } => libc::EFAULT,
                },
            },
            Error::CqCreate(e) => match e {
                CreateError::ZeroSize | CreateError::TooLarge { .. } => libc::EINVAL,
                // libibverbs: wc_flags outside IBV_CREATE_CQ_SUP_WC_FLAGS.
                CreateError::UnsupportedFields(_) => libc::EOPNOTSUPP,
                // ibv_alloc_parent_domain(3): the application's `alloc` returned NULL.
                CreateError::RingMemoryRefused { .. } => libc::ENOMEM,
                // Memory not aligned as the `alignment` argument asked.
                CreateError::RingMemoryMisaligned { .. } => libc::EINVAL,
            },
            Error::CqResize(_) => libc::EINVAL,
            Error::CqInError => libc::EIO,
            Error::UnacknowledgedEvents { .. } => libc::EBUSY,
            Error::ForeignObject { .. } | Error::MissingRemote | Error::BadNetwork(_) => {
                libc::EINVAL
            }
            Error::NoMemory { .. } => libc::ENOMEM,
            Error::Io(e) => e.raw_os_error().unwrap_or(match e.kind() {
                io::ErrorKind::WouldBlock => libc::EAGAIN,
                io::ErrorKind::InvalidInput => libc::EINVAL,
                io::ErrorKind::PermissionDenied => libc::EACCES,
                io::ErrorKind::AddrInUse => libc::EADDRINUSE,
                io::ErrorKind::AddrNotAvailable => libc::EADDRNOTAVAIL,
                io::ErrorKind::TimedOut => libc::ETIMEDOUT,
                io::ErrorKind::OutOfMemory => libc::ENOMEM,
                _ => libc::EIO,
            }),
        }
    }
}

impl From<Error> for i32 {
    /// The errno (see [`Error::errno`]).
    fn from(e: Error) -> i32 {
        e.errno()
    }
}

impl From<DeviceError> for Error {
    fn from(e: DeviceError) -> Self {
        match e {
            DeviceError::Verbs(v) => Error::Verbs(v),
            DeviceError::Register(r) => Error::Register(r),
            DeviceError::Io(io) => Error::Io(io),
        }
    }
}

impl From<ResizeError> for Error {
    fn from(e: ResizeError) -> Self {
        match e {
            ResizeError::Size(c) => Error::CqCreate(c),
            ResizeError::InError => Error::CqInError,
            other => Error::CqResize(other),
        }
    }
}

impl From<PollError> for Error {
    fn from(e: PollError) -> Self {
        match e {
            PollError::Overrun => Error::CqInError,
        }
    }
}

impl From<ModifyError> for Error {
    fn from(e: ModifyError) -> Self {
        match e {
            ModifyError::InError => Error::CqInError,
        }
    }
}

impl From<DestroyError> for Error {
    /// `ibv_destroy_cq(3)`: "fails if any queue pair is still associated with this CQ"
    /// (the non-waiting form also refuses while completion events are unacknowledged);
    /// `ibv_destroy_comp_channel(3)`: "fails if any CQs are still associated with the
    /// completion event channel".
    fn from(e: DestroyError) -> Self {
        match e {
            DestroyError::QueuePairsAttached(n) => Error::Verbs(VerbsError::InUse {
                object: Object::Cq,
                by: Object::Qp,
                count: u32::try_from(n).unwrap_or(u32::MAX),
            }),
            DestroyError::UnacknowledgedEvents(count) => Error::UnacknowledgedEvents {
                object: Object::Cq,
                count,
            },
            DestroyError::CqsAttached(n) => Error::Verbs(VerbsError::InUse {
                object: Object::Channel,
                by: Object::Cq,
                count: u32::try_from(n).unwrap_or(u32::MAX),
            }),
        }
    }
}
