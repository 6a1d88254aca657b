//! `rdma_getaddrinfo(3)`, `rdma_freeaddrinfo(3)`, `rdma_create_ep(3)`,
//! `rdma_destroy_ep(3)`.
//!
//! Names and services are resolved by the C library's `getaddrinfo` (IPv4 and IPv6 only;
//! `RAI_NUMERICHOST` maps to `AI_NUMERICHOST`); each result is one `rdma_addrinfo` with
//! the port space and QP type of the hints (default `RDMA_PS_TCP` / `IBV_QPT_RC`,
//! `RDMA_PS_UDP` for `IBV_QPT_UD`). `RAI_PASSIVE` puts the address in `ai_src_addr` (the
//! wildcard when `node` is NULL), otherwise in `ai_dst_addr`, with the hints' source
//! address, if any, in `ai_src_addr`.

use crate::abi::*;
use crate::addr;
use crate::boundary::{self, Errno};
use crate::id::new_id;
use crate::state::lock;
use crate::symver;
use libc::{c_char, c_int, c_void};
use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Resolves `node`/`service` into socket addresses with the C library's resolver. Err is
/// a `getaddrinfo` code (`EAI_*`) or, for `EAI_SYSTEM`, -1 with errno.
fn resolve(
    node: Option<&CStr>,
    service: Option<&CStr>,
    family: c_int,
    flags: c_int,
) -> Result<Vec<SocketAddr>, c_int> {
    // SAFETY: all-zero is a valid addrinfo hints struct.
    let mut hints: libc::addrinfo = unsafe { std::mem::zeroed() };
    hints.ai_family = family;
    hints.ai_socktype = libc::SOCK_STREAM;
    hints.ai_flags = flags;
    let mut res: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: NUL-terminated strings or NULL, valid hints, an out pointer.
    let r = unsafe {
        libc::getaddrinfo(
            node.map_or(std::ptr::null(), |n| n.as_ptr()),
            service.map_or(std::ptr::null(), |s| s.as_ptr()),
            &hints,
            &mut res,
        )
    };
    if r != 0 {
        return Err(r);
    }
    let mut out = Vec::new();
    let mut p = res;
    while !p.is_null() {
        // SAFETY: a node of the list getaddrinfo returned.
        let ai = unsafe { &*p };
        // SAFETY: getaddrinfo's addresses match their family.
        if let Ok(a) = unsafe { addr::read(ai.ai_addr) } {
            if !out.contains(&a) {
                out.push(a);
            }
        }
        p = ai.ai_next;
    }
    // SAFETY: the list getaddrinfo returned.
    unsafe { libc::freeaddrinfo(res) };
    Ok(out)
}

/// `rdma_getaddrinfo(3)`: 0, -1 with errno (`EINVAL`: NULL `res`, neither node nor
/// service), or the resolver's `EAI_*` code.
///
/// # Safety
///
/// `node`, `service` are NULL or NUL-terminated; `hints` NULL or valid; `res` writable.
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    match boundary::guarded(|| {
        if res.is_null() || (node.is_null() && service.is_null()) {
            return Err(-libc::EINVAL);
        }
        // SAFETY: caller's contract.
        let node = (!node.is_null()).then(|| unsafe { CStr::from_ptr(node) });
        // SAFETY: caller's contract.
        let service = (!service.is_null()).then(|| unsafe { CStr::from_ptr(service) });
        // SAFETY: caller's contract.
        let h = unsafe { hints.as_ref() };
        let flags = h.map_or(0, |h| h.ai_flags);
        let passive = flags & RAI_PASSIVE != 0;
        let family = h.map_or(0, |h| h.ai_family);
        if ![0, libc::AF_INET, libc::AF_INET6].contains(&family) {
            return Err(-libc::EAFNOSUPPORT);
        }
        let qp_type = h.map_or(0, |h| h.ai_qp_type) as u32;
        let ps = match h.map_or(0, |h| h.ai_port_space) as u32 {
            0 if qp_type == IBV_QPT_UD => RDMA_PS_UDP,
            0 => RDMA_PS_TCP,
            ps => ps,
        };
        let qp_type = if qp_type == 0 {
            if ps == RDMA_PS_UDP {
                IBV_QPT_UD
            } else {
                IBV_QPT_RC
            }
        } else {
            qp_type
        };
        let mut ai_flags = 0;
        if flags & RAI_NUMERICHOST != 0 {
            ai_flags |= libc::AI_NUMERICHOST;
        }
        if passive {
            ai_flags |= libc::AI_PASSIVE;
        }
        let addrs = match node {
            None if passive => {
                let port = match service {
                    Some(s) => resolve(
                        Some(c"0.0.0.0"),
                        Some(s),
                        libc::AF_INET,
                        libc::AI_NUMERICHOST,
                    )
                    .map_err(|e| e.abs())?
                    .first()
                    .map_or(0, |a| a.port()),
                    None => 0,
                };
                let ip: IpAddr = if family == libc::AF_INET6 {
                    Ipv6Addr::UNSPECIFIED.into()
                } else {
                    Ipv4Addr::UNSPECIFIED.into()
                };
                vec![SocketAddr::new(ip, port)]
            }
            _ => resolve(node, service, family, ai_flags).map_err(|e| e.abs())?,
        };
        let src_hint = h.and_then(|h| {
            (!h.ai_src_addr.is_null())
                // SAFETY: the hints' address is a valid sockaddr (caller's contract).
                .then(|| unsafe { addr::read(h.ai_src_addr) }.ok())
                .flatten()
        });
        let mut head: *mut rdma_addrinfo = std::ptr::null_mut();
        for a in addrs.into_iter().rev() {
            // SAFETY: plain allocation, freed by `rdma_freeaddrinfo`.
            let ai = unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) }
                as *mut rdma_addrinfo;
            if ai.is_null() {
                // SAFETY: the partial list built here.
                unsafe { free_list(head) };
                return Err(-libc::ENOMEM);
            }
            // SAFETY: freshly allocated, zeroed.
            let r = unsafe { &mut *ai };
            r.ai_flags = flags;
            r.ai_family = if a.is_ipv4() {
                libc::AF_INET
            } else {
                libc::AF_INET6
            };
            r.ai_qp_type = qp_type as c_int;
            r.ai_port_space = ps as c_int;
            r.ai_next = head;
            head = ai;
            let (slot, len) = if passive {
                (&mut r.ai_src_addr, &mut r.ai_src_len)
            } else {
                (&mut r.ai_dst_addr, &mut r.ai_dst_len)
            };
            let (p, l) = addr::malloc_sockaddr(a).map_err(|e| -e)?;
            *slot = p;
            *len = l;
            if !passive {
                if let Some(s) = src_hint {
                    let (p, l) = addr::malloc_sockaddr(s).map_err(|e| -e)?;
                    r.ai_src_addr = p;
                    r.ai_src_len = l;
                }
            }
        }
        if head.is_null() {
            return Err(libc::EAI_NONAME.abs());
        }
        // SAFETY: caller's contract.
        unsafe { *res = head };
        Ok(())
    }) {
        Ok(()) => 0,
        Err(e) if e < 0 => {
            boundary::set_errno(-e);
            -1
        }
        Err(e) if e == boundary::PANIC_ERRNO => {
            boundary::set_errno(e);
            -1
        }
        // An EAI_* code (negative in glibc), returned as the resolver gave it.
        Err(e) => -e,
    }
}
symver!(rdma_getaddrinfo, "RDMACM_1.0");

/// Frees a list built by `rdma_getaddrinfo`.
///
/// # Safety
///
/// `p` is NULL or such a list, not yet freed.
unsafe fn free_list(mut p: *mut rdma_addrinfo) {
    while !p.is_null() {
        // SAFETY: a node of the list (caller's contract).
        let r = unsafe { &*p };
        let next = r.ai_next;
        // SAFETY: every pointer is NULL or malloc'd by `rdma_getaddrinfo`.
        unsafe {
            for q in [
                r.ai_src_addr as *mut c_void,
                r.ai_dst_addr as *mut c_void,
                r.ai_src_canonname as *mut c_void,
                r.ai_dst_canonname as *mut c_void,
                r.ai_route,
                r.ai_connect,
            ] {
                libc::free(q);
            }
            libc::free(p as *mut c_void);
        }
        p = next;
    }
}

/// `rdma_freeaddrinfo(3)`.
///
/// # Safety
///
/// `res` is NULL or a list `rdma_getaddrinfo` returned, not yet freed.
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    // SAFETY: caller's contract.
    boundary::infallible((), || unsafe { free_list(res) })
}
symver!(rdma_freeaddrinfo, "RDMACM_1.0");

fn create_ep(
    res: &rdma_addrinfo,
    pd: *mut c_void,
    attr: *mut ibv_qp_init_attr,
) -> Result<*mut rdma_cm_id, Errno> {
    let ch = crate::channel::new_channel()?;
    let p = new_id(
        &mut lock(),
        ch,
        true,
        std::ptr::null_mut(),
        res.ai_port_space as u32,
    );
    // SAFETY: a fresh id.
    unsafe { (*p).qp_type = res.ai_qp_type as u32 };
    let r = (|| -> Result<(), Errno> {
        if res.ai_flags & RAI_PASSIVE != 0 {
            // SAFETY: the list's address is a valid sockaddr.
            let a = unsafe { addr::read(res.ai_src_addr) }?;
            let mut st = lock();
            crate::id::bind(&mut st, p, a)?;
            if !attr.is_null() {
                // SAFETY: caller's contract: a valid ibv_qp_init_attr.
                let mut a = unsafe { *attr };
                // librdmacm: the endpoint's QP is of the addrinfo's type.
                a.qp_type = res.ai_qp_type as u32;
                st.id(p)?.ep_qp = Some(crate::state::EpQp {
                    pd: crate::state::Ptr(pd),
                    attr: a,
                });
            }
            return Ok(());
        }
        // SAFETY: as above.
        let dst = unsafe { addr::read(res.ai_dst_addr) }?;
        let src = if res.ai_src_addr.is_null() {
            std::ptr::null_mut()
        } else {
            res.ai_src_addr
        };
        let (dp, _) = addr::malloc_sockaddr(dst)?;
        // SAFETY: our own exports with valid addresses; `dp` freed right after.
        let r = unsafe { crate::id::rdma_resolve_addr(p, src, dp, 2000) };
        // SAFETY: malloc'd above.
        unsafe { libc::free(dp as *mut c_void) };
        if r != 0 {
            return Err(boundary::errno());
        }
        if crate::id::rdma_resolve_route(p, 2000) != 0 {
            return Err(boundary::errno());
        }
        if !attr.is_null() {
            // SAFETY: caller's contract.
            let a = unsafe { &mut *attr };
            a.qp_type = res.ai_qp_type as u32;
            crate::qp::create_qp(&mut lock(), p, pd, a)?;
        }
        Ok(())
    })();
    match r {
        // The last event of a synchronous id stays in `id->event` until its next call
        // (`complete_sync` acknowledges it then).
        Ok(()) => Ok(p),
        Err(e) => {
            let _ = crate::id::destroy(p);
            Err(e)
        }
    }
}

/// `rdma_create_ep(3)`: a synchronous id from an `rdma_addrinfo`: bound (passive, the QP
/// attributes kept for `rdma_get_request`) or with address and route resolved and, given
/// QP attributes, a QP (active). 0, or -1 with errno.
///
/// # Safety
///
/// `id` writable; `res` a valid `rdma_addrinfo`; `qp_init_attr` NULL or valid.
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut c_void,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    boundary::zero(|| {
        if id.is_null() || res.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: caller's contract.
        let p = create_ep(unsafe { &*res }, pd, qp_init_attr)?;
        // SAFETY: caller's contract.
        unsafe { *id = p };
        Ok(())
    })
}
symver!(rdma_create_ep, "RDMACM_1.0");

/// `rdma_destroy_ep(3)`: destroys the id's QP, SRQ and the id.
pub extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    boundary::infallible((), || {
        crate::qp::rdma_destroy_qp(id);
        crate::qp::rdma_destroy_srq(id);
        let _ = crate::id::destroy(id);
    })
}
symver!(rdma_destroy_ep, "RDMACM_1.0");
