//! Issue #12's rule table (`tests/rules/table.rs`) through the safe Rust API: every case
//! is run on an in-process device, its outcome compared with the documented one (or with
//! what the table says the safe API does instead, by design or as a known discrepancy)
//! and, where the table names one, the typed error variant; a case the table marks as not
//! expressible must be one this runner cannot write either. All failures are reported
//! together at the end. The same table runs through the drop-in `libibverbs.so.1` in
//! `crates/softverbs-capi/tests/rule_table.rs`.
//!
//! The memlock case lowers this thread's soft `RLIMIT_MEMLOCK` and drops `CAP_IPC_LOCK`
//! from its effective set for the call (both restored after: `memlock/mod.rs`); the
//! device clock brackets the completion timestamps (`softverbs::core::cq::DeviceClock`,
//! the clock `ibv_query_rt_values_ex(3)` reads).

mod memlock;
#[path = "rules/table.rs"]
mod table;

use softverbs::core::cq::DeviceClock;
use softverbs::*;
use std::fmt::Debug;
use std::time::{Duration, Instant};
use table::{
    AsyncSource, Case, CqRole, CqStep, EventType, Expect, Opcode, PostPath, QpKind, QpStateName,
    RegionPd, SafeApi, Status, IBV_MTU_1024, MAX_ITERS, QUIET, RULES, WAIT,
};

/// Longest a case waits for a completion.
const PATIENCE: Duration = WAIT;

/// The Q_Key of the UD cases.
const QKEY: u32 = 0x1111_1111;

/// The `cq_context` of the CQs with a channel.
const CQ_TAG: u64 = 0x7a6;

/// The bytes a SEND carries in the completion cases.
const MSG: u32 = 64;

/// The bytes a receive of the completion cases has room for.
const SLOT: usize = 256;

/// What a call through the safe API gave.
#[derive(Debug)]
enum Outcome {
    /// An outcome in the table's terms; `cause` renders the typed error of a refusal.
    Seen { what: Expect, cause: Option<String> },
    /// One the table has no word for (a completion status it does not name, …).
    Other(String),
}

impl Outcome {
    const OK: Outcome = Outcome::Seen {
        what: Expect::Ok,
        cause: None,
    };

    fn seen(what: Expect) -> Outcome {
        Outcome::Seen { what, cause: None }
    }

    fn is_ok(&self) -> bool {
        matches!(
            self,
            Outcome::Seen {
                what: Expect::Ok,
                ..
            }
        )
    }

    fn describe(&self) -> String {
        match self {
            Outcome::Seen { what, cause: None } => describe(*what),
            Outcome::Seen {
                what,
                cause: Some(c),
            } => format!("{} ({c})", describe(*what)),
            Outcome::Other(text) => text.clone(),
        }
    }
}

/// An expected outcome in words.
fn describe(e: Expect) -> String {
    match e {
        Expect::Ok => "success".into(),
        Expect::Errno(n) => format!("errno {n}"),
        other => format!("{other:?}"),
    }
}

/// A case's outcome and whatever else went wrong in it (a state that changed although the
/// call failed, a cleanup refused, a completion missing).
struct Run {
    outcome: Outcome,
    problems: Vec<String>,
}

impl Run {
    fn new(outcome: Outcome) -> Run {
        Run {
            outcome,
            problems: Vec::new(),
        }
    }
}

/// An error's type, variant and, where the variant wraps another error enum, that one's
/// variant, from its `Debug` rendering: `Error::Verbs(BadSgidIndex)`,
/// `Error::MissingRemote`; an error struct renders as its name and its field's type,
/// `FieldNotRequested(WcFields)`.
fn cause_of(type_name: &str, e: &impl Debug) -> String {
    let text = format!("{e:?}");
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let outer = ident(&text);
    let rest = &text[outer.len()..];
    match rest.strip_prefix('(') {
        Some(inner) if inner.starts_with(|c: char| c.is_ascii_uppercase()) => {
            if outer == type_name {
                format!("{type_name}({})", ident(inner))
            } else {
                format!("{type_name}::{outer}({})", ident(inner))
            }
        }
        _ => format!("{type_name}::{outer}"),
    }
}

fn failed(type_name: &str, errno: i32, e: &impl Debug) -> Outcome {
    Outcome::Seen {
        what: Expect::Errno(errno),
        cause: Some(cause_of(type_name, e)),
    }
}

fn qp_type(kind: QpKind) -> QpType {
    match kind {
        QpKind::Rc => QpType::Rc,
        QpKind::Uc => QpType::Uc,
        QpKind::Ud => QpType::Ud,
    }
}

fn qp_state(name: QpStateName) -> QpState {
    match name {
        QpStateName::Reset => QpState::Reset,
        QpStateName::Init => QpState::Init,
        QpStateName::Rtr => QpState::Rtr,
        QpStateName::Rts => QpState::Rts,
    }
}

/// A work completion status in the table's terms, if it names it.
fn status_of(status: WcStatus) -> Outcome {
    match status {
        WcStatus::Success => Outcome::seen(Expect::Completes(Status::Success)),
        WcStatus::LocProtErr => Outcome::seen(Expect::Completes(Status::LocProtErr)),
        WcStatus::RemAccessErr => Outcome::seen(Expect::Completes(Status::RemAccessErr)),
        other => Outcome::Other(format!("completes with {other:?}")),
    }
}

/// Records a problem if `qp` is not in `want`.
fn expect_state(qp: &Qp, want: QpState, when: &str, problems: &mut Vec<String>) {
    match qp.state() {
        Ok(now) if now == want => {}
        Ok(now) => problems.push(format!("{when}: the QP is in {now:?}, expected {want:?}")),
        Err(e) => problems.push(format!("{when}: querying the QP state failed: {e}")),
    }
}

/// Polls `cq` until `n` completions arrived or [`PATIENCE`] passed (a problem then), and
/// returns them.
fn await_n(cq: &Cq, n: usize, what: &str, problems: &mut Vec<String>) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + PATIENCE;
    let mut got = Vec::new();
    let mut wcs = [WorkCompletion::default(); 16];
    for _ in 0..MAX_ITERS {
        if got.len() >= n {
            break;
        }
        let want = (n - got.len()).min(wcs.len());
        match cq.poll(&mut wcs[..want]) {
            Ok(0) if Instant::now() < deadline => std::thread::yield_now(),
            Ok(0) => {
                problems.push(format!(
                    "{what}: {} of {n} completions within {PATIENCE:?}",
                    got.len()
                ));
                break;
            }
            Ok(k) => got.extend_from_slice(&wcs[..k]),
            Err(e) => {
                problems.push(format!("{what}: polling failed: {e}"));
                break;
            }
        }
    }
    got
}

/// Polls `cq` until one completion arrives (bounded by [`PATIENCE`]); a problem if none
/// does or it is not successful.
fn await_completion(cq: &Cq, problems: &mut Vec<String>) {
    if let Some(wc) = await_n(cq, 1, "a completion", problems).first() {
        if wc.result().is_err() {
            problems.push(format!("the completion failed: {wc:?}"));
        }
    }
}

/// Records a problem if a completion arrives on `cq` within [`QUIET`].
fn expect_no_completion(cq: &Cq, what: &str, problems: &mut Vec<String>) {
    let deadline = Instant::now() + QUIET;
    let mut wcs = [WorkCompletion::default(); 1];
    for _ in 0..MAX_ITERS {
        if Instant::now() >= deadline {
            break;
        }
        match cq.poll(&mut wcs) {
            Ok(0) => std::thread::sleep(Duration::from_millis(1)),
            Ok(_) => {
                problems.push(format!("{what}: a completion arrived: {:?}", wcs[0]));
                return;
            }
            Err(e) => {
                problems.push(format!("{what}: polling failed: {e}"));
                return;
            }
        }
    }
}

/// Checks that `wcs` are `n` successful receives of `len` bytes with wr_ids `first..`.
fn expect_receives(
    wcs: &[WorkCompletion],
    first: u64,
    n: usize,
    len: u32,
    problems: &mut Vec<String>,
) {
    if wcs.len() != n {
        problems.push(format!("{} receive completions, expected {n}", wcs.len()));
    }
    for (i, wc) in wcs.iter().enumerate() {
        match wc.result() {
            Ok(c) if c.opcode() == WcOpcode::Recv && c.byte_len() == len => {}
            _ => problems.push(format!("receive {i} is not a {len}-byte RECV: {wc:?}")),
        }
        if wc.wr_id() != first + i as u64 {
            problems.push(format!(
                "receive {i} has wr_id {}, expected {} (order)",
                wc.wr_id(),
                first + i as u64
            ));
        }
    }
}

/// An RC QP in RESET completing into `cq`.
fn rc_qp(pd: &Pd, cq: &Cq) -> Result<Qp, String> {
    pd.qp_builder(QpType::Rc, cq, cq)
        .max_send_wr(4)
        .max_recv_wr(4)
        .max_send_sge(1)
        .max_recv_sge(1)
        .build()
        .map_err(|e| format!("setup: create an RC QP: {e}"))
}

/// A setup step that failed.
fn setup(what: &str, e: impl std::fmt::Display) -> String {
    format!("setup: {what}: {e}")
}

/// An RC QP in RESET, every send signalled, `depth` WRs each way.
fn rc(pd: &Pd, send_cq: &impl AnyCq, recv_cq: &impl AnyCq, depth: u32) -> Result<Qp, String> {
    pd.qp_builder(QpType::Rc, send_cq, recv_cq)
        .max_send_wr(depth)
        .max_recv_wr(depth)
        .max_send_sge(1)
        .max_recv_sge(1)
        .sq_sig_all(true)
        .build()
        .map_err(|e| setup("create an RC QP", e))
}

/// RESET → INIT → RTR → RTS towards `peer` (possibly `qp` itself), which may `access`.
fn connect(qp: &Qp, peer: &Qp, access: AccessFlags) -> Result<(), String> {
    qp.to_init(access).map_err(|e| setup("RESET -> INIT", e))?;
    qp.to_rtr(peer.local_info(0))
        .map_err(|e| setup("INIT -> RTR", e))?;
    qp.to_rts(RtsAttr::new(0))
        .map_err(|e| setup("RTR -> RTS", e))
}

/// An RC QP connected to itself: its SENDs are its own receives.
fn loopback(pd: &Pd, send_cq: &Cq, recv_cq: &impl AnyCq, depth: u32) -> Result<Qp, String> {
    let qp = rc(pd, send_cq, recv_cq, depth)?;
    connect(&qp, &qp, AccessFlags::empty())?;
    Ok(qp)
}

/// A region for the completion cases: SENDs gather from its first half, receives land in
/// its second.
fn message_region(pd: &Pd) -> Result<Mr, String> {
    let mr = pd
        .reg_mr(8192, AccessFlags::LOCAL_WRITE)
        .map_err(|e| setup("register a region", e))?;
    mr.fill(..4096, 0x33).map_err(|e| setup("fill", e))?;
    Ok(mr)
}

/// Posts `n` receives of [`SLOT`] bytes, wr_ids `first..`.
fn post_recvs(qp: &Qp, mr: &Mr, first: u64, n: u32) -> Result<(), String> {
    for i in 0..n {
        let slice = mr.slice(4096..4096 + SLOT).map_err(|e| setup("slice", e))?;
        qp.post_recv(RecvRequest::new(first + u64::from(i), &[slice]))
            .map_err(|e| setup("post a receive", e))?;
    }
    Ok(())
}

/// Posts a SEND of `len` bytes (solicited if asked).
fn post_send(qp: &Qp, mr: &Mr, wr_id: u64, len: u32, solicited: bool) -> Result<(), String> {
    let slice = mr.slice(..len as usize).map_err(|e| setup("slice", e))?;
    let wr = SendRequest::send(wr_id, &[slice]);
    let wr = if solicited { wr.solicited() } else { wr };
    qp.post_send(wr).map_err(|e| setup("post a SEND", e))
}

/// A SEND received by the QP itself; waits for the SEND's completion on `send_cq`, which
/// exists only once the receive completed.
fn send_and_wait(
    qp: &Qp,
    mr: &Mr,
    send_cq: &Cq,
    wr_id: u64,
    solicited: bool,
    problems: &mut Vec<String>,
) -> Result<(), String> {
    post_send(qp, mr, wr_id, MSG, solicited)?;
    await_completion(send_cq, problems);
    Ok(())
}

/// Takes the events that come on `channel` within [`QUIET`] each (at most 16), checking
/// that they name `cq`; how many came.
fn take_events(channel: &CompChannel, cq: &Cq, problems: &mut Vec<String>) -> u32 {
    let mut n = 0;
    for _ in 0..16 {
        match channel.get_event_timeout(QUIET) {
            Ok(Some(event)) => {
                if !event.is_for(cq.id()) || event.user_context() != CQ_TAG {
                    problems.push(format!(
                        "an event names CQ {} (context {:#x}), expected {} ({CQ_TAG:#x})",
                        event.cq_id(),
                        event.user_context(),
                        cq.id()
                    ));
                }
                n += 1;
            }
            Ok(None) => break,
            Err(e) => {
                problems.push(format!("taking an event failed: {e}"));
                break;
            }
        }
    }
    n
}

/// The object an asynchronous event names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Object {
    Qp(u32),
    Srq(u32),
    Cq(u64),
}

/// The event's type in the table's terms, if it names it, and the object it names.
fn event_parts(event: &AsyncEvent) -> (Option<EventType>, Option<Object>) {
    match *event {
        AsyncEvent::CqError { cq_id, .. } => (Some(EventType::CqErr), Some(Object::Cq(cq_id))),
        AsyncEvent::QpAccessError { qpn } => (Some(EventType::QpAccessErr), Some(Object::Qp(qpn))),
        AsyncEvent::SrqLimitReached { srq } => {
            (Some(EventType::SrqLimitReached), Some(Object::Srq(srq)))
        }
        AsyncEvent::QpFatal { qpn }
        | AsyncEvent::QpRequestError { qpn }
        | AsyncEvent::CommEst { qpn }
        | AsyncEvent::SqDrained { qpn }
        | AsyncEvent::QpLastWqeReached { qpn } => (None, Some(Object::Qp(qpn))),
        _ => (None, None),
    }
}

/// Takes every queued asynchronous event (at most 1000).
fn drain_async(ctx: &Context) {
    for _ in 0..1000 {
        if ctx.try_async_event().is_none() {
            break;
        }
    }
}

/// Waits up to [`PATIENCE`] for an event of `kind` naming `object`, passing over the
/// others (at most 64); events of `kind` naming another object, and other events naming
/// `object`, are problems if the one looked for never comes.
fn await_async(
    ctx: &Context,
    kind: EventType,
    object: Object,
    problems: &mut Vec<String>,
) -> Outcome {
    let deadline = Instant::now() + PATIENCE;
    let mut passed = Vec::new();
    for _ in 0..64 {
        let left = deadline.saturating_duration_since(Instant::now());
        match ctx.async_event_timeout(left) {
            Ok(Some(event)) => match event_parts(&event) {
                (Some(k), Some(o)) if k == kind && o == object => {
                    return Outcome::seen(Expect::AsyncEvent(kind))
                }
                (Some(k), _) if k == kind => {
                    problems.push(format!("{event:?} names another object than {object:?}"))
                }
                (_, Some(o)) if o == object => passed.push(event),
                _ => {}
            },
            Ok(None) => break,
            Err(e) => {
                problems.push(format!("reading an async event failed: {e}"));
                break;
            }
        }
    }
    if !passed.is_empty() {
        problems.push(format!("other events named {object:?}: {passed:?}"));
    }
    Outcome::seen(Expect::NoAsyncEvent)
}

/// What an [`AsyncSource`] made; kept until the case ends.
#[allow(dead_code)] // held for their lifetime
struct Raised {
    object: Object,
    kind: EventType,
    pd: Pd,
    mr: Mr,
    cqs: Vec<Cq>,
    qps: Vec<Qp>,
    srq: Option<Srq>,
}

/// Raises the event of `source`.
fn raise(ctx: &Context, source: AsyncSource, problems: &mut Vec<String>) -> Result<Raised, String> {
    let pd = ctx.alloc_pd();
    let mr = pd
        .reg_mr(8192, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .map_err(|e| setup("register a region", e))?;
    let remote = mr.remote().offset(4096);
    let local = [mr.slice(..64).map_err(|e| setup("slice", e))?];
    match source {
        AsyncSource::BadRkeyWrite => {
            let req_cq = ctx.create_cq(16).map_err(|e| setup("create a CQ", e))?;
            let resp_cq = ctx.create_cq(16).map_err(|e| setup("create a CQ", e))?;
            let req = rc(&pd, &req_cq, &req_cq, 8)?;
            let resp = rc(&pd, &resp_cq, &resp_cq, 8)?;
            connect(&req, &resp, AccessFlags::REMOTE_WRITE)?;
            connect(&resp, &req, AccessFlags::REMOTE_WRITE)?;
            let bad = RemoteAddr::new(remote.addr, remote.rkey ^ 0x5a_5a00);
            req.post_send(SendRequest::write(1, &local, bad))
                .map_err(|e| setup("post the RDMA WRITE", e))?;
            let wcs = await_n(&req_cq, 1, "the bad-rkey write", problems);
            if let Some(wc) = wcs.first() {
                if wc.status() != WcStatus::RemAccessErr {
                    problems.push(format!("the bad-rkey write completed with {wc:?}"));
                }
            }
            Ok(Raised {
                object: Object::Qp(resp.qpn()),
                kind: EventType::QpAccessErr,
                pd,
                mr,
                cqs: vec![req_cq, resp_cq],
                qps: vec![req, resp],
                srq: None,
            })
        }
        AsyncSource::SrqLimit => {
            let srq = pd
                .create_srq(SrqInit {
                    max_wr: 8,
                    max_sge: 1,
                    srq_limit: 0,
                })
                .map_err(|e| setup("create an SRQ", e))?;
            for i in 0..4 {
                let slice = mr.slice(4096..4096 + 64).map_err(|e| setup("slice", e))?;
                srq.post_recv(RecvRequest::new(100 + i, &[slice]))
                    .map_err(|e| setup("post an SRQ receive", e))?;
            }
            srq.arm_limit(3)
                .map_err(|e| setup("arm the SRQ limit", e))?;
            let req_cq = ctx.create_cq(16).map_err(|e| setup("create a CQ", e))?;
            let resp_cq = ctx.create_cq(16).map_err(|e| setup("create a CQ", e))?;
            let req = rc(&pd, &req_cq, &req_cq, 8)?;
            let resp = pd
                .qp_builder(QpType::Rc, &resp_cq, &resp_cq)
                .max_send_wr(8)
                .max_send_sge(1)
                .sq_sig_all(true)
                .srq(&srq)
                .build()
                .map_err(|e| setup("create an RC QP on the SRQ", e))?;
            connect(&req, &resp, AccessFlags::REMOTE_WRITE)?;
            connect(&resp, &req, AccessFlags::REMOTE_WRITE)?;
            for wr_id in [2, 3] {
                req.post_send(SendRequest::send(wr_id, &local))
                    .map_err(|e| setup("post a SEND", e))?;
            }
            await_n(&req_cq, 2, "the SENDs", problems);
            await_n(&resp_cq, 2, "the receives", problems);
            Ok(Raised {
                object: Object::Srq(srq.id().0),
                kind: EventType::SrqLimitReached,
                pd,
                mr,
                cqs: vec![req_cq, resp_cq],
                qps: vec![req, resp],
                srq: Some(srq),
            })
        }
        AsyncSource::CqOverrun => {
            let small = ctx.create_cq(1).map_err(|e| setup("create a CQ", e))?;
            let room = small.capacity();
            if room >= 8 {
                problems.push(format!("a CQ of 1 got {room} entries"));
            }
            let resp_cq = ctx.create_cq(16).map_err(|e| setup("create a CQ", e))?;
            let req = rc(&pd, &small, &small, 32)?;
            let resp = rc(&pd, &resp_cq, &resp_cq, 32)?;
            connect(&req, &resp, AccessFlags::REMOTE_WRITE)?;
            connect(&resp, &req, AccessFlags::REMOTE_WRITE)?;
            for i in 0..u64::from(room) + 17 {
                req.post_send(SendRequest::write(10 + i, &local, remote))
                    .map_err(|e| setup("post an RDMA WRITE", e))?;
            }
            Ok(Raised {
                object: Object::Cq(small.id()),
                kind: EventType::CqErr,
                pd,
                mr,
                cqs: vec![small, resp_cq],
                qps: vec![req, resp],
                srq: None,
            })
        }
    }
}

/// Runs `case` on `ctx`; `Ok(None)` if the safe API cannot express it, `Err` if a valid
/// setup step failed.
fn run(ctx: &Context, case: &Case) -> Result<Option<Run>, String> {
    let limits = ctx.query_device();
    let run = match *case {
        Case::CreateAh { sgid_index, port } => {
            let pd = ctx.alloc_pd();
            let gid = ctx.gid(0).ok_or("setup: the device has no GID 0")?;
            let mut attr = AhAttr::new(gid);
            attr.sgid_index = sgid_index;
            attr.port = port;
            Run::new(match pd.create_ah(&attr) {
                Ok(ah) => {
                    drop(ah);
                    Outcome::OK
                }
                Err(e) => failed("Error", e.errno(), &e),
            })
        }
        Case::ModifyQpToInit { port, pkey_index } => {
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16).map_err(|e| setup("create a CQ", e))?;
            let qp = rc_qp(&pd, &cq)?;
            let attr = InitAttr {
                port,
                pkey_index,
                access: AccessFlags::empty(),
                qkey: 0,
            };
            let mut run = Run::new(match qp.to_init(attr) {
                Ok(()) => Outcome::OK,
                Err(e) => failed("Error", e.errno(), &e),
            });
            let want = if run.outcome.is_ok() {
                QpState::Init
            } else {
                QpState::Reset
            };
            expect_state(&qp, want, "after the call", &mut run.problems);
            run
        }
        Case::ModifyQpToRtr {
            sgid_index,
            max_dest_rd_atomic,
            path_mtu,
        } => {
            if path_mtu != IBV_MTU_1024 {
                // `QpAttr::path_mtu` is an `Mtu`: only the five sizes can be written.
                return Ok(None);
            }
            let Ok(n) = u8::try_from(max_dest_rd_atomic.resolve(u32::from(limits.max_qp_rd_atom)))
            else {
                return Err(format!(
                    "setup: max_dest_rd_atomic {max_dest_rd_atomic:?} does not fit the u8 of \
                     ibv_qp_attr on a device whose max_qp_rd_atom is {}",
                    limits.max_qp_rd_atom
                ));
            };
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16).map_err(|e| setup("create a CQ", e))?;
            let qp = rc_qp(&pd, &cq)?;
            let peer = rc_qp(&pd, &cq)?;
            qp.to_init(AccessFlags::empty())
                .map_err(|e| setup("RESET -> INIT", e))?;
            let info = peer.local_info(0);
            let result = if sgid_index == 0 {
                // The typed path: `RtrAttr` has no GID index (it is always 0).
                qp.to_rtr(
                    RtrAttr::from(RemoteInfo {
                        mtu: Mtu::Mtu1024,
                        ..info
                    })
                    .max_dest_rd_atomic(n)
                    .min_rnr_timer(12),
                )
            } else {
                // Another GID index is written through `Qp::modify`, as a C program does.
                let mut attr = QpAttr {
                    qp_state: QpState::Rtr,
                    path_mtu: Mtu::Mtu1024,
                    dest_qp_num: info.qpn,
                    rq_psn: 0,
                    max_dest_rd_atomic: n,
                    min_rnr_timer: 12,
                    ..QpAttr::default()
                };
                attr.ah_attr.dgid = info.gid.0;
                attr.ah_attr.sgid_index = sgid_index;
                attr.ah_attr.hop_limit = 64;
                attr.ah_attr.port_num = 1;
                attr.ah_attr.is_global = true;
                let mask = AttrMask::STATE
                    | AttrMask::AV
                    | AttrMask::PATH_MTU
                    | AttrMask::DEST_QPN
                    | AttrMask::RQ_PSN
                    | AttrMask::MAX_DEST_RD_ATOMIC
                    | AttrMask::MIN_RNR_TIMER;
                qp.modify(&attr, mask)
            };
            let mut run = Run::new(match result {
                Ok(()) => Outcome::OK,
                Err(e) => failed("Error", e.errno(), &e),
            });
            let want = if run.outcome.is_ok() {
                QpState::Rtr
            } else {
                QpState::Init
            };
            expect_state(&qp, want, "after the call", &mut run.problems);
            run
        }
        Case::ModifyQpBadTransition { from, to } => {
            if from != QpStateName::Reset || to != QpStateName::Rts {
                return Err(format!(
                    "setup: this runner writes RESET -> RTS only, not {from:?} -> {to:?}"
                ));
            }
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16).map_err(|e| setup("create a CQ", e))?;
            let qp = rc_qp(&pd, &cq)?;
            let mut run = Run::new(match qp.to_rts(RtsAttr::new(0)) {
                Ok(()) => Outcome::OK,
                Err(e) => failed("Error", e.errno(), &e),
            });
            let want = if run.outcome.is_ok() {
                qp_state(to)
            } else {
                qp_state(from)
            };
            expect_state(&qp, want, "after the call", &mut run.problems);
            run
        }
        Case::RegMr { len, access } => {
            let pd = ctx.alloc_pd();
            let access = AccessFlags::from_bits(access.0)
                .ok_or_else(|| format!("setup: access bits {:#x} unknown", access.0))?;
            let mut problems = Vec::new();
            let outcome = match pd.reg_mr(len, access) {
                Ok(mr) => {
                    if mr.len() != len {
                        problems.push(format!("the region has {} bytes, not {len}", mr.len()));
                    }
                    drop(mr);
                    Outcome::OK
                }
                Err(e) => failed("Error", e.errno(), &e),
            };
            Run { outcome, problems }
        }
        Case::CreateQp {
            qp_type: kind,
            with_srq,
            max_send_wr,
        } => {
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16).map_err(|e| setup("create a CQ", e))?;
            let srq = if with_srq {
                Some(
                    pd.create_srq(SrqInit {
                        max_wr: 4,
                        max_sge: 1,
                        srq_limit: 0,
                    })
                    .map_err(|e| setup("create an SRQ", e))?,
                )
            } else {
                None
            };
            let mut builder = pd
                .qp_builder(qp_type(kind), &cq, &cq)
                .max_send_wr(max_send_wr.resolve(limits.max_qp_wr))
                .max_recv_wr(4)
                .max_send_sge(1)
                .max_recv_sge(1);
            if let Some(srq) = &srq {
                builder = builder.srq(srq);
            }
            let outcome = match builder.build() {
                Ok(qp) => {
                    drop(qp);
                    Outcome::OK
                }
                Err(e) => failed("Error", e.errno(), &e),
            };
            let mut run = Run::new(outcome);
            if let Some(srq) = srq {
                if let Err((_, e)) = srq.destroy() {
                    run.problems
                        .push(format!("cleanup: destroying the SRQ failed: {e}"));
                }
            }
            run
        }
        Case::CreateCq { cqe } => Run::new(match ctx.create_cq(cqe.resolve(limits.max_cqe)) {
            Ok(cq) => {
                drop(cq);
                Outcome::OK
            }
            Err(e) => failed("Error", e.errno(), &e),
        }),
        // `WindowType` has the two valid types only; the runner writes those.
        Case::AllocMw { mw_type } => {
            let kind = match mw_type {
                1 => WindowType::One,
                2 => WindowType::Two,
                _ => return Ok(None),
            };
            let pd = ctx.alloc_pd();
            Run::new(match pd.alloc_mw(kind) {
                Ok(mw) => {
                    drop(mw);
                    Outcome::OK
                }
                Err(e) => failed("Error", e.errno(), &e),
            })
        }
        Case::CreateSrq { max_wr } => {
            let pd = ctx.alloc_pd();
            let init = SrqInit {
                max_wr: max_wr.resolve(limits.max_srq_wr),
                max_sge: 1,
                srq_limit: 0,
            };
            Run::new(match pd.create_srq(init) {
                Ok(srq) => {
                    drop(srq);
                    Outcome::OK
                }
                Err(e) => failed("Error", e.errno(), &e),
            })
        }
        Case::PostSend { opcode, inline } => {
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16).map_err(|e| setup("create a CQ", e))?;
            let qp = pd
                .qp_builder(QpType::Rc, &cq, &cq)
                .max_send_wr(4)
                .max_recv_wr(4)
                .max_send_sge(1)
                .max_recv_sge(1)
                .max_inline_data(64)
                .sq_sig_all(true)
                .build()
                .map_err(|e| setup("create an RC QP", e))?;
            let all = AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC;
            let mr = pd
                .reg_mr(4096, all)
                .map_err(|e| setup("register a region", e))?;
            // Connected to itself: only the request can be wrong.
            qp.to_init(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ)
                .map_err(|e| setup("RESET -> INIT", e))?;
            qp.to_rtr(qp.local_info(0))
                .map_err(|e| setup("INIT -> RTR", e))?;
            qp.to_rts(RtsAttr::new(0))
                .map_err(|e| setup("RTR -> RTS", e))?;
            let local = [mr.slice(0..16).map_err(|e| setup("slice", e))?];
            let remote = mr.remote().offset(2048);
            let request = match opcode {
                Opcode::Send => SendRequest::send(1, &local),
                Opcode::RdmaWrite => SendRequest::write(1, &local, remote),
                Opcode::RdmaRead => SendRequest::read(1, &local, remote),
            };
            let request = if inline {
                request.inline(&[0x5a; 16])
            } else {
                request
            };
            let mut run = Run::new(match qp.post_send(request) {
                Ok(()) => Outcome::OK,
                Err(e) => failed("Error", e.errno(), &e),
            });
            if run.outcome.is_ok() {
                await_completion(&cq, &mut run.problems);
            }
            run
        }
        Case::UdSend { ah_of_another_pd } => {
            let pd = ctx.alloc_pd();
            let other = ctx.alloc_pd();
            let cq = ctx.create_cq(16).map_err(|e| setup("create a CQ", e))?;
            let qp = pd
                .qp_builder(QpType::Ud, &cq, &cq)
                .max_send_wr(4)
                .max_recv_wr(4)
                .max_send_sge(1)
                .max_recv_sge(1)
                .sq_sig_all(true)
                .build()
                .map_err(|e| setup("create a UD QP", e))?;
            qp.to_init(InitAttr::default().qkey(QKEY))
                .map_err(|e| setup("RESET -> INIT", e))?;
            qp.to_rtr(RtrAttr::datagram())
                .map_err(|e| setup("INIT -> RTR", e))?;
            qp.to_rts(RtsAttr::new(0))
                .map_err(|e| setup("RTR -> RTS", e))?;
            let gid = ctx.gid(0).ok_or("setup: the device has no GID 0")?;
            let ah_pd = if ah_of_another_pd { &other } else { &pd };
            let ah = ah_pd
                .create_ah(&AhAttr::new(gid))
                .map_err(|e| setup("create an AH", e))?;
            let mr = pd
                .reg_mr(4096, AccessFlags::LOCAL_WRITE)
                .map_err(|e| setup("register a region", e))?;
            let local = [mr.slice(0..16).map_err(|e| setup("slice", e))?];
            // To itself, with no receive posted: the datagram is dropped, the send completes.
            let request = SendRequest::send(1, &local).to(&ah, qp.qpn(), QKEY);
            let mut run = Run::new(match qp.post_send(request) {
                Ok(()) => Outcome::OK,
                Err(e) => failed("Error", e.errno(), &e),
            });
            if run.outcome.is_ok() {
                await_completion(&cq, &mut run.problems);
            }
            run
        }
        // `Pd` has no dealloc: a PD goes when its last object does.
        Case::DeallocPdInUse { .. } => return Ok(None),
        Case::DestroyCqInUse { role, qps } => {
            let pd = ctx.alloc_pd();
            let other = ctx.create_cq(16).map_err(|e| setup("create a CQ", e))?;
            let cq = ctx.create_cq(16).map_err(|e| setup("create a CQ", e))?;
            let (send, recv) = match role {
                CqRole::Send => (&cq, &other),
                CqRole::Recv => (&other, &cq),
                CqRole::Both => (&cq, &cq),
            };
            let mut users = Vec::new();
            for _ in 0..qps.max(1) {
                users.push(rc(&pd, send, recv, 4)?);
            }
            // All but the last are gone before the call.
            users.drain(..users.len() - 1);
            match cq.destroy() {
                Ok(()) => Run::new(Outcome::OK),
                Err((cq, e)) => {
                    let mut run = Run::new(failed("Error", e.errno(), &e));
                    // Refused, not half-destroyed: the CQ still works.
                    let mut wcs = [WorkCompletion::default(); 1];
                    match cq.poll(&mut wcs) {
                        Ok(0) => {}
                        other => run
                            .problems
                            .push(format!("polling the refused CQ gave {other:?}")),
                    }
                    cq.req_notify(false);
                    drop(users);
                    if let Err((_, e)) = cq.destroy() {
                        run.problems.push(format!(
                            "cleanup: destroying the CQ once its QPs are gone failed: {e}"
                        ));
                    }
                    run
                }
            }
        }
        Case::DestroySrqInUse => {
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16).map_err(|e| setup("create a CQ", e))?;
            let srq = pd
                .create_srq(SrqInit {
                    max_wr: 4,
                    max_sge: 1,
                    srq_limit: 0,
                })
                .map_err(|e| setup("create an SRQ", e))?;
            let qp = pd
                .qp_builder(QpType::Rc, &cq, &cq)
                .max_send_wr(4)
                .max_send_sge(1)
                .srq(&srq)
                .build()
                .map_err(|e| setup("create an RC QP on the SRQ", e))?;
            match srq.destroy() {
                Ok(()) => Run::new(Outcome::OK),
                Err((srq, e)) => {
                    let mut run = Run::new(failed("Error", e.errno(), &e));
                    drop(qp);
                    if let Err((_, e)) = srq.destroy() {
                        run.problems.push(format!(
                            "cleanup: destroying the SRQ once its QP is gone failed: {e}"
                        ));
                    }
                    run
                }
            }
        }
        Case::CqOverrun { ignore_overrun } => {
            // Events of earlier cases' objects are taken first, as the drop-in runner does.
            drain_async(ctx);
            let pd = ctx.alloc_pd();
            let mr = message_region(&pd)?;
            let builder = ctx.cq_builder(2);
            let builder = if ignore_overrun {
                builder.overrun(OverrunPolicy::Overwrite)
            } else {
                builder
            };
            let cq = builder.build().map_err(|e| setup("create the CQ", e))?;
            let c = cq.capacity();
            let n = c + 2;
            let aux = ctx.create_cq(n + 8).map_err(|e| setup("create a CQ", e))?;
            let qp = loopback(&pd, &aux, &cq, n + 2)?;
            post_recvs(&qp, &mr, 2000, n + 1)?;
            for i in 0..n {
                post_send(&qp, &mr, u64::from(i), MSG, false)?;
            }
            let mut problems = Vec::new();
            // Every SEND completed: every receive went into the CQ, none polled.
            await_n(&aux, n as usize, "the SENDs", &mut problems);
            let mut wcs = [WorkCompletion::default(); 64];
            let outcome = match cq.poll(&mut wcs) {
                Err(e) => {
                    if cq.poll(&mut wcs[..1]).is_ok() {
                        problems.push("a second poll of the overrun CQ succeeded".into());
                    }
                    let e = softverbs::Error::from(e);
                    failed("Error", e.errno(), &e)
                }
                Ok(got) => {
                    if got == 0 || got > c as usize {
                        problems.push(format!("polled {got} completions from a CQ of {c}"));
                    }
                    for (i, wc) in wcs[..got].iter().enumerate() {
                        let ours = (2000..2000 + u64::from(n)).contains(&wc.wr_id());
                        if !ours || wc.result().is_err() {
                            problems
                                .push(format!("completion {i} is none of the receives: {wc:?}"));
                        }
                        if wcs[..i].iter().any(|w| w.wr_id() == wc.wr_id()) {
                            problems.push(format!("wr_id {} polled twice", wc.wr_id()));
                        }
                    }
                    match cq.poll(&mut wcs[..1]) {
                        Ok(0) => {}
                        other => problems.push(format!("the CQ polled dry then gave {other:?}")),
                    }
                    // Polling keeps working.
                    send_and_wait(&qp, &mr, &aux, 100, false, &mut problems)?;
                    let more = await_n(&cq, 1, "the receive after the overrun", &mut problems);
                    expect_receives(&more, 2000 + u64::from(n), 1, MSG, &mut problems);
                    let deadline = Instant::now() + QUIET;
                    for _ in 0..64 {
                        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                            break;
                        };
                        match ctx.async_event_timeout(left) {
                            Ok(Some(AsyncEvent::CqError { cq_id, .. })) if cq_id == cq.id() => {
                                problems.push("IBV_EVENT_CQ_ERR for an IGNORE_OVERRUN CQ".into())
                            }
                            Ok(Some(_)) => {}
                            _ => break,
                        }
                    }
                    Outcome::OK
                }
            };
            Run { outcome, problems }
        }
        Case::CompletionEvents { steps } => {
            let pd = ctx.alloc_pd();
            let mr = message_region(&pd)?;
            let channel = ctx
                .create_comp_channel()
                .map_err(|e| setup("create a channel", e))?;
            let cq = ctx
                .cq_builder(16)
                .channel(&channel)
                .user_context(CQ_TAG)
                .build()
                .map_err(|e| setup("create the CQ", e))?;
            let aux = ctx.create_cq(16).map_err(|e| setup("create a CQ", e))?;
            let qp = loopback(&pd, &aux, &cq, 8)?;
            let received = steps
                .iter()
                .filter(|s| matches!(s, CqStep::Receive { .. }))
                .count();
            let flushed = steps
                .iter()
                .filter(|s| matches!(s, CqStep::FlushedReceive))
                .count();
            post_recvs(&qp, &mr, 3000, (received + flushed) as u32)?;
            let mut problems = Vec::new();
            let mut events = 0;
            let mut sent = 0;
            for step in steps {
                match *step {
                    CqStep::Arm { solicited_only } => cq.req_notify(solicited_only),
                    CqStep::Receive { solicited } => {
                        send_and_wait(&qp, &mr, &aux, sent, solicited, &mut problems)?;
                        sent += 1;
                        events += take_events(&channel, &cq, &mut problems);
                    }
                    CqStep::FlushedReceive => {
                        qp.to_error().map_err(|e| setup("move the QP to ERR", e))?;
                        events += take_events(&channel, &cq, &mut problems);
                    }
                }
            }
            let wcs = await_n(&cq, received + flushed, "the receives", &mut problems);
            let (done, rest) = wcs.split_at(received.min(wcs.len()));
            expect_receives(done, 3000, received, MSG, &mut problems);
            for wc in rest {
                if wc.status() != WcStatus::WrFlushErr {
                    problems.push(format!("expected a flushed receive: {wc:?}"));
                }
            }
            Run {
                outcome: Outcome::seen(Expect::CompletionEvents(events)),
                problems,
            }
        }
        Case::NonBlockingGetCqEvent { after_event } => {
            let channel = ctx
                .create_comp_channel()
                .map_err(|e| setup("create a channel", e))?;
            channel
                .set_nonblocking(true)
                .map_err(|e| setup("O_NONBLOCK", e))?;
            let mut problems = Vec::new();
            let mut keep = None;
            if after_event {
                let pd = ctx.alloc_pd();
                let mr = message_region(&pd)?;
                let cq = ctx
                    .cq_builder(16)
                    .channel(&channel)
                    .user_context(CQ_TAG)
                    .build()
                    .map_err(|e| setup("create the CQ", e))?;
                let aux = ctx.create_cq(16).map_err(|e| setup("create a CQ", e))?;
                let qp = loopback(&pd, &aux, &cq, 4)?;
                post_recvs(&qp, &mr, 5000, 1)?;
                cq.req_notify(false);
                send_and_wait(&qp, &mr, &aux, 0, false, &mut problems)?;
                // Readable: the channel holds the event (the safe API's readiness).
                let deadline = Instant::now() + PATIENCE;
                for _ in 0..MAX_ITERS {
                    if channel.pending() != 0 || Instant::now() >= deadline {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                match channel.get_event() {
                    Ok(event) if event.is_for(cq.id()) => {}
                    other => problems.push(format!("the one event: {other:?}")),
                }
                if channel.pending() != 0 {
                    problems.push("the channel still holds an event after it was taken".into());
                }
                let wcs = await_n(&cq, 1, "the receive", &mut problems);
                expect_receives(&wcs, 5000, 1, MSG, &mut problems);
                keep = Some((qp, cq, aux, mr, pd));
            }
            let outcome = match channel.get_event() {
                Ok(event) => Outcome::Other(format!("an event: {event:?}")),
                Err(e) => failed("Error", e.errno(), &e),
            };
            drop(keep);
            Run { outcome, problems }
        }
        // No async fd of its own, no O_NONBLOCK, no EAGAIN: `try_async_event` gives `None`.
        Case::NonBlockingGetAsyncEvent => return Ok(None),
        Case::DestroyChannelInUse => {
            let channel = ctx
                .create_comp_channel()
                .map_err(|e| setup("create a channel", e))?;
            let cq = ctx
                .cq_builder(16)
                .channel(&channel)
                .build()
                .map_err(|e| setup("create the CQ", e))?;
            match channel.destroy() {
                Ok(()) => Run::new(Outcome::OK),
                Err((channel, e)) => {
                    let mut run = Run::new(failed("Error", e.errno(), &e));
                    if let Err((_, e)) = cq.destroy() {
                        run.problems
                            .push(format!("cleanup: destroying the CQ failed: {e}"));
                    }
                    if let Err((_, e)) = channel.destroy() {
                        run.problems.push(format!(
                            "cleanup: destroying the channel once its CQ is gone failed: {e}"
                        ));
                    }
                    run
                }
            }
        }
        Case::ResizeCq {
            cqe,
            outstanding,
            to,
        } => {
            let pd = ctx.alloc_pd();
            let mr = message_region(&pd)?;
            let cq = ctx.create_cq(cqe).map_err(|e| setup("create the CQ", e))?;
            let before = cq.capacity();
            let total = outstanding.max(to);
            let aux = ctx
                .create_cq(total + 8)
                .map_err(|e| setup("create a CQ", e))?;
            let qp = loopback(&pd, &aux, &cq, total + 2)?;
            post_recvs(&qp, &mr, 7000, total)?;
            let mut problems = Vec::new();
            for i in 0..outstanding {
                send_and_wait(&qp, &mr, &aux, u64::from(i), false, &mut problems)?;
            }
            let (outcome, polled) = match cq.resize(to) {
                Err(e) => {
                    if cq.capacity() != before {
                        problems.push(format!(
                            "a refused resize changed the size from {before} to {}",
                            cq.capacity()
                        ));
                    }
                    (failed("Error", e.errno(), &e), outstanding)
                }
                Ok(now) => {
                    if now < to || cq.capacity() < to {
                        problems.push(format!("resized to {to}: {now} / {}", cq.capacity()));
                    }
                    for i in outstanding..to {
                        send_and_wait(&qp, &mr, &aux, u64::from(i), false, &mut problems)?;
                    }
                    (Outcome::OK, total)
                }
            };
            let wcs = await_n(&cq, polled as usize, "the receives", &mut problems);
            expect_receives(&wcs, 7000, polled as usize, MSG, &mut problems);
            let mut extra = [WorkCompletion::default(); 1];
            match cq.poll(&mut extra) {
                Ok(0) => {}
                other => problems.push(format!("a completion beyond those made: {other:?}")),
            }
            Run { outcome, problems }
        }
        Case::CqExTimestamps { timestamp } => {
            let pd = ctx.alloc_pd();
            let mr = message_region(&pd)?;
            let mut fields = WcFields::BYTE_LEN | WcFields::QP_NUM;
            if timestamp {
                fields |= WcFields::COMPLETION_TIMESTAMP;
            }
            let cq = ctx
                .cq_builder(16)
                .fields(fields)
                .build()
                .map_err(|e| setup("create the CQ", e))?;
            let mut problems = Vec::new();
            match cq.start_poll() {
                Ok(None) => {}
                Ok(Some(_)) => problems.push("an empty CQ gave a batch".into()),
                Err(e) => problems.push(format!("start_poll on an empty CQ: {e}")),
            }
            let qp = loopback(&pd, &cq, &cq, 8)?;
            post_recvs(&qp, &mr, 8000, 2)?;
            let before = DeviceClock::now();
            post_send(&qp, &mr, 1, 100, false)?;
            post_send(&qp, &mr, 2, 200, false)?;
            // (wr_id, status, opcode, byte_len, qp_num, timestamp)
            type Read = (u64, WcStatus, WcOpcode, u32, u32, Result<u64, String>);
            let mut got: Vec<Read> = Vec::new();
            let deadline = Instant::now() + PATIENCE;
            for _ in 0..MAX_ITERS {
                if got.len() >= 4 || Instant::now() >= deadline {
                    break;
                }
                let mut batch = match cq.start_poll() {
                    Ok(Some(batch)) => batch,
                    Ok(None) => {
                        std::thread::yield_now();
                        continue;
                    }
                    Err(e) => {
                        problems.push(format!("start_poll: {e}"));
                        break;
                    }
                };
                for _ in 0..8 {
                    got.push((
                        batch.wr_id(),
                        batch.status(),
                        batch.opcode(),
                        batch.byte_len().unwrap_or(u32::MAX),
                        batch.qp_num().unwrap_or(u32::MAX),
                        batch
                            .completion_ts()
                            .map_err(|e| cause_of("FieldNotRequested", &e)),
                    ));
                    if !batch.next() {
                        break;
                    }
                }
            }
            let after = DeviceClock::now();
            if got.len() != 4 {
                problems.push(format!(
                    "{} of 4 completions with start/next/end",
                    got.len()
                ));
            }
            match cq.start_poll() {
                Ok(None) => {}
                other => problems.push(format!("after the batch: {other:?}")),
            }
            let mut receives = 0;
            for (wr_id, status, opcode, byte_len, qp_num, _) in &got {
                let (want_op, want_len) = match *wr_id {
                    1 | 2 => (WcOpcode::Send, None),
                    _ => {
                        receives += 1;
                        (WcOpcode::Recv, Some(if receives == 1 { 100 } else { 200 }))
                    }
                };
                if *status != WcStatus::Success
                    || *opcode != want_op
                    || want_len.is_some_and(|l| l != *byte_len)
                    || *qp_num != qp.qpn()
                {
                    problems.push(format!(
                        "completion {wr_id}: {status:?} {opcode:?} {byte_len} bytes QP {qp_num}"
                    ));
                }
            }
            let mask = ctx.query_device().completion_timestamp_mask;
            let outcome = match got
                .iter()
                .map(|g| g.5.clone())
                .collect::<Result<Vec<_>, _>>()
            {
                Ok(ts) => {
                    for (i, t) in ts.iter().enumerate() {
                        let inside = (after & mask) < (before & mask)
                            || (before & mask..=after & mask).contains(t);
                        if *t == 0 || t & !mask != 0 || !inside {
                            problems.push(format!(
                                "completion {i}: timestamp {t} outside [{before}, {after}] \
                                 / mask {mask:#x}"
                            ));
                        }
                        if i > 0 && *t < ts[i - 1] {
                            problems.push(format!("timestamps go backwards: {ts:?}"));
                        }
                    }
                    Outcome::OK
                }
                Err(cause) => {
                    if got.iter().any(|g| g.5.is_ok()) {
                        problems.push("some completions have a timestamp, some not".into());
                    }
                    Outcome::Seen {
                        what: Expect::NoValue,
                        cause: Some(cause),
                    }
                }
            };
            Run { outcome, problems }
        }
        Case::DestroyCqWithCompletionEvents {
            events,
            acknowledged,
        } => {
            let pd = ctx.alloc_pd();
            let mr = message_region(&pd)?;
            let channel = ctx
                .create_comp_channel()
                .map_err(|e| setup("create a channel", e))?;
            let cq = ctx
                .cq_builder(16)
                .channel(&channel)
                .user_context(CQ_TAG)
                .build()
                .map_err(|e| setup("create the CQ", e))?;
            let aux = ctx.create_cq(16).map_err(|e| setup("create a CQ", e))?;
            let qp = loopback(&pd, &aux, &cq, 8)?;
            post_recvs(&qp, &mr, 9000, events)?;
            let mut problems = Vec::new();
            for i in 0..events {
                cq.req_notify(false);
                send_and_wait(&qp, &mr, &aux, u64::from(i), false, &mut problems)?;
                match channel.get_event_timeout(PATIENCE) {
                    Ok(Some(event)) if event.is_for(cq.id()) => {
                        event.into_unacknowledged();
                    }
                    other => problems.push(format!("event {i}: {other:?}")),
                }
            }
            let wcs = await_n(&cq, events as usize, "the receives", &mut problems);
            expect_receives(&wcs, 9000, events as usize, MSG, &mut problems);
            drop(qp);
            if acknowledged {
                cq.ack_events(events);
            }
            match cq.destroy() {
                Ok(()) => Run {
                    outcome: Outcome::OK,
                    problems,
                },
                Err((cq, e)) => {
                    let outcome = failed("Error", e.errno(), &e);
                    if !acknowledged {
                        cq.ack_events(events);
                    }
                    if let Err((_, e)) = cq.destroy() {
                        problems.push(format!(
                            "cleanup: destroying the CQ once its events are acknowledged: {e}"
                        ));
                    }
                    Run { outcome, problems }
                }
            }
        }
        Case::AsyncEvent { source } => {
            drain_async(ctx);
            let mut problems = Vec::new();
            let raised = raise(ctx, source, &mut problems)?;
            let outcome = await_async(ctx, raised.kind, raised.object, &mut problems);
            drop(raised);
            Run { outcome, problems }
        }
        // Asynchronous events are values: none is acknowledged, no destroy waits for one.
        Case::DestroyWithUnackedAsyncEvent { .. } | Case::AckAsyncEvent => return Ok(None),
        Case::AsyncEventOfDestroyedQp => {
            drain_async(ctx);
            let mut problems = Vec::new();
            let mut raised = raise(ctx, AsyncSource::BadRkeyWrite, &mut problems)?;
            std::thread::sleep(QUIET);
            let object = raised.object;
            if let Some(resp) = raised.qps.pop() {
                if let Err((_, e)) = resp.destroy() {
                    problems.push(format!("destroying the responder QP failed: {e}"));
                }
            }
            let mut outcome = Outcome::seen(Expect::NoAsyncEvent);
            for _ in 0..64 {
                match ctx.async_event_timeout(QUIET) {
                    Ok(Some(event)) => {
                        if let (kind, Some(o)) = event_parts(&event) {
                            if o == object {
                                outcome = match kind {
                                    Some(kind) => Outcome::seen(Expect::AsyncEvent(kind)),
                                    None => Outcome::Other(format!("{event:?}")),
                                };
                            }
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        problems.push(format!("reading an async event failed: {e}"));
                        break;
                    }
                }
            }
            drop(raised);
            Run { outcome, problems }
        }
        Case::AsyncEventOfDestroyedCq => {
            drain_async(ctx);
            let mut problems = Vec::new();
            let mut raised = raise(ctx, AsyncSource::CqOverrun, &mut problems)?;
            let old = raised.cqs[0].id();
            let deadline = Instant::now() + PATIENCE;
            for _ in 0..MAX_ITERS {
                if raised.cqs[0].is_in_error() || Instant::now() >= deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            if !raised.cqs[0].is_in_error() {
                return Err(format!("setup: the CQ did not overrun within {PATIENCE:?}"));
            }
            raised.qps.clear();
            if let Err((_, e)) = raised.cqs.remove(0).destroy() {
                return Err(setup("destroy the overrun CQ", e));
            }
            let new = ctx.create_cq(1).map_err(|e| setup("create a CQ", e))?;
            let mut outcome = Outcome::seen(Expect::NoAsyncEvent);
            for _ in 0..64 {
                match ctx.async_event_timeout(QUIET) {
                    Ok(Some(AsyncEvent::CqError { cq_id, .. })) => {
                        if cq_id == new.id() {
                            problems.push("IBV_EVENT_CQ_ERR names the new CQ".into());
                        }
                        if cq_id == old || cq_id == new.id() {
                            outcome = Outcome::seen(Expect::AsyncEvent(EventType::CqErr));
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(e) => {
                        problems.push(format!("reading an async event failed: {e}"));
                        break;
                    }
                }
            }
            drop(new);
            drop(raised);
            Run { outcome, problems }
        }
        Case::RcTransfer { op, region, path } => {
            if path == PostPath::WrApi {
                // One post path: `Qp::post_send`.
                return Ok(None);
            }
            let all =
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
            let pd_a = ctx.alloc_pd();
            let pd_b = ctx.alloc_pd();
            let mr_a = pd_a.reg_mr(8192, all).map_err(|e| setup("register A", e))?;
            let mr_b = pd_b.reg_mr(8192, all).map_err(|e| setup("register B", e))?;
            mr_a.fill(.., 0x11).map_err(|e| setup("fill", e))?;
            mr_b.fill(.., 0x5a).map_err(|e| setup("fill", e))?;
            mr_a.fill(4096..4096 + 64, 0)
                .map_err(|e| setup("fill", e))?;
            let req_cq = ctx.create_cq(16).map_err(|e| setup("create a CQ", e))?;
            let resp_cq = ctx.create_cq(16).map_err(|e| setup("create a CQ", e))?;
            let req = rc(&pd_a, &req_cq, &req_cq, 8)?;
            let resp = rc(&pd_a, &resp_cq, &resp_cq, 8)?;
            let remote_access = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
            connect(&req, &resp, remote_access)?;
            connect(&resp, &req, remote_access)?;
            let named = match region {
                RegionPd::Same => &mr_a,
                RegionPd::Other => &mr_b,
            };
            let mut problems = Vec::new();
            let request = match op {
                Opcode::RdmaWrite => {
                    let local = [mr_a.slice(..64).map_err(|e| setup("slice", e))?];
                    SendRequest::write(1, &local, named.remote().offset(4096))
                }
                Opcode::Send => {
                    let into = [mr_a.slice(4096..4096 + 64).map_err(|e| setup("slice", e))?];
                    resp.post_recv(RecvRequest::new(30, &into))
                        .map_err(|e| setup("post a receive", e))?;
                    let local = [named.slice(..64).map_err(|e| setup("slice", e))?];
                    SendRequest::send(1, &local)
                }
                Opcode::RdmaRead => return Err("setup: RcTransfer takes SEND or RDMA WRITE".into()),
            };
            let outcome = match req.post_send(request) {
                Err(e) => failed("Error", e.errno(), &e),
                Ok(()) => match await_n(&req_cq, 1, "the request", &mut problems).first() {
                    None => Outcome::Other("no completion".into()),
                    Some(wc) => {
                        let landed = mr_a
                            .read_vec(4096..4096 + 64)
                            .map_err(|e| setup("read", e))?;
                        match (op, wc.status()) {
                            (_, WcStatus::Success) => {
                                if landed.iter().any(|b| *b != 0x11) {
                                    problems.push("the bytes did not land".into());
                                }
                                if op == Opcode::Send {
                                    let r = await_n(&resp_cq, 1, "the receive", &mut problems);
                                    expect_receives(&r, 30, 1, 64, &mut problems);
                                }
                            }
                            (Opcode::RdmaWrite, WcStatus::RemAccessErr) => {
                                let b = mr_b.read_vec(..).map_err(|e| setup("read", e))?;
                                if b.iter().any(|x| *x != 0x5a) {
                                    problems.push("region B (another PD) was written".into());
                                }
                                expect_state(&resp, QpState::Err, "responder", &mut problems);
                                expect_state(&req, QpState::Err, "requester", &mut problems);
                                expect_no_completion(&resp_cq, "responder", &mut problems);
                            }
                            (Opcode::Send, WcStatus::LocProtErr) => {
                                expect_no_completion(&resp_cq, "responder", &mut problems);
                                if landed.iter().any(|b| *b != 0) {
                                    problems.push("bytes of a refused SEND were received".into());
                                }
                                expect_state(&req, QpState::Err, "requester", &mut problems);
                                expect_state(&resp, QpState::Rts, "responder", &mut problems);
                            }
                            _ => {}
                        }
                        status_of(wc.status())
                    }
                },
            };
            Run { outcome, problems }
        }
        // `QpType` has `Rc`, `Uc`, `Ud` only.
        Case::CreateQpOfType { .. } => return Ok(None),
        // A `Mr` owns its memory.
        Case::RegMrMemory { .. } | Case::RdmaWriteIntoUnmappedRegion => return Ok(None),
        Case::RegMrPastMemlock => {
            let pd = ctx.alloc_pd();
            let guard = memlock::MemlockGuard::lower(64 * 1024)?;
            let half = pd
                .reg_mr(32 * 1024, AccessFlags::LOCAL_WRITE)
                .map_err(|e| setup("register 32 KiB under a 64 KiB RLIMIT_MEMLOCK", e))?;
            let mut problems = Vec::new();
            let outcome = match pd.reg_mr(64 * 1024, AccessFlags::LOCAL_WRITE) {
                Ok(mr) => {
                    drop(mr);
                    Outcome::OK
                }
                Err(e) => failed("Error", e.errno(), &e),
            };
            drop(half);
            if let Err(e) = pd.reg_mr(64 * 1024, AccessFlags::LOCAL_WRITE) {
                problems.push(format!(
                    "64 KiB once the 32 KiB are deregistered: {e} (the pages not given back)"
                ));
            }
            drop(guard);
            Run { outcome, problems }
        }
    };
    Ok(Some(run))
}

/// Checks one rule: a line saying what happened, and the failures found.
fn check(ctx: &Context, rule: &table::Rule) -> (String, Vec<String>) {
    let name = rule.name;
    // What the safe API must do: the documented outcome, or what the table says it does
    // instead (by design, or as a known discrepancy).
    let (want, want_cause, note) = match rule.safe_api {
        SafeApi::Expressible { cause } => (rule.expect, cause, String::new()),
        SafeApi::Differs { expect, cause, .. } => (
            expect,
            cause,
            format!(" [by design, libibverbs: {}]", describe(rule.expect)),
        ),
        SafeApi::Discrepancy {
            observed, cause, ..
        } => (
            observed,
            cause,
            format!(" [DISCREPANCY, the rule: {}]", describe(rule.expect)),
        ),
        SafeApi::NotExpressible(_) => (rule.expect, None, String::new()),
    };
    let expected = describe(want);
    let run = match (rule.safe_api, run(ctx, &rule.case)) {
        (_, Err(e)) => return (format!("{name}: {e}"), vec![format!("{name}: {e}")]),
        (SafeApi::NotExpressible(why), Ok(None)) => {
            return (format!("{name}: not expressible ({why})"), Vec::new())
        }
        (SafeApi::NotExpressible(why), Ok(Some(_))) => {
            let f = format!(
                "{name}: the table marks it not expressible in the safe API ({why}), yet this \
                 runner wrote it"
            );
            return (f.clone(), vec![f]);
        }
        (_, Ok(None)) => {
            let f = format!(
                "{name}: the table says the safe API can express it, this runner cannot (mark \
                 it SafeApi::NotExpressible, or write it)"
            );
            return (f.clone(), vec![f]);
        }
        (_, Ok(Some(run))) => run,
    };
    let mut failures: Vec<String> = run
        .problems
        .iter()
        .map(|p| format!("{name}: {p}"))
        .collect();
    let got = run.outcome.describe();
    let (holds, cause) = match &run.outcome {
        Outcome::Seen { what, cause } => (*what == want, cause.as_deref()),
        Outcome::Other(_) => (false, None),
    };
    if !holds {
        failures.push(format!(
            "{name}: expected {expected}{note}, got {got} [{}]",
            rule.man
        ));
    }
    if let (Some(want), Some(cause)) = (want_cause, cause) {
        if want != cause {
            failures.push(format!("{name}: expected cause {want}, got {cause}"));
        }
    }
    (
        format!("{name}: expected {expected}{note}, got {got}"),
        failures,
    )
}

/// Every rule of the table, through the safe API; all failures reported at the end.
#[test]
fn every_rule_of_the_table_holds_through_the_safe_api() {
    table::check_table().expect("the table is well formed");
    let ctx = Context::open_with(DeviceConfig::in_process()).expect("open an in-process device");
    let mut failures = Vec::new();
    for rule in RULES {
        let (summary, found) = check(&ctx, rule);
        println!(
            "{} {summary}",
            if found.is_empty() { "ok  " } else { "FAIL" }
        );
        failures.extend(found);
    }
    assert!(
        failures.is_empty(),
        "{} failures in the {} rules through the safe API:\n{}",
        failures.len(),
        RULES.len(),
        failures.join("\n")
    );
}
