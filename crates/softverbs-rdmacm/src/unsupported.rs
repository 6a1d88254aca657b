//! What the soft device does not offer, failing the documented way and never crashing:
//!
//! | functions | result |
//! |---|---|
//! | rsockets (`rsocket`, `rbind`, `rlisten`, `raccept`, `rconnect`, `rshutdown`, `rclose`, `rrecv`, `rrecvfrom`, `rrecvmsg`, `rsend`, `rsendto`, `rsendmsg`, `rread`, `rreadv`, `rwrite`, `rwritev`, `rgetpeername`, `rgetsockname`, `rsetsockopt`, `rgetsockopt`, `rfcntl`, `riomap`, `riounmap`, `riowrite`) | -1, `errno = ENOSYS`, and one line on stderr naming the call |
//!
//! | `rpoll`, `rselect` | `poll(2)` / `select(2)`: with no rsockets every descriptor is an ordinary one, which rsockets' `rpoll` / `rselect` pass to the system too (cmtime waits on its event channel with `rpoll`) |
//!
//! The refusing functions never read their arguments, so any arguments are safe.

use crate::boundary::set_errno;
use crate::symver;
use libc::c_int;

macro_rules! rsockets {
    ($($name:ident),*) => {$(
        /// rsockets are not offered: -1 with `errno = ENOSYS` and a line on stderr. The
        /// return is pointer-wide so that callers expecting `ssize_t` or `off_t` see -1
        /// too.
        pub extern "C" fn $name() -> isize {
            eprintln!(concat!(
                "librdmacm (softverbs): ",
                stringify!($name),
                ": rsockets are not supported (ENOSYS)"
            ));
            set_errno(libc::ENOSYS);
            -1
        }
        symver!($name, "RDMACM_1.0");
    )*};
}
rsockets!(
    rsocket,
    rbind,
    rlisten,
    raccept,
    rconnect,
    rshutdown,
    rclose,
    rrecv,
    rrecvfrom,
    rrecvmsg,
    rsend,
    rsendto,
    rsendmsg,
    rread,
    rreadv,
    rwrite,
    rwritev,
    rgetpeername,
    rgetsockname,
    rsetsockopt,
    rgetsockopt,
    rfcntl,
    riomap,
    riounmap,
    riowrite
);

/// `rpoll`: with no rsockets, every descriptor is an ordinary one: `poll(2)`.
///
/// # Safety
///
/// As `poll(2)`: `fds` points at `nfds` pollfds.
pub unsafe extern "C" fn rpoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    // SAFETY: caller's contract (poll's).
    unsafe { libc::poll(fds, nfds, timeout) }
}
symver!(rpoll, "RDMACM_1.0");

/// `rselect`: with no rsockets, every descriptor is an ordinary one: `select(2)`.
///
/// # Safety
///
/// As `select(2)`.
pub unsafe extern "C" fn rselect(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    // SAFETY: caller's contract (select's).
    unsafe { libc::select(nfds, readfds, writefds, exceptfds, timeout) }
}
symver!(rselect, "RDMACM_1.0");
