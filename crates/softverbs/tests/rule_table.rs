//! Issue #12's rule table (`tests/rules/table.rs`) through the safe Rust API: every case
//! is run on an in-process device, its outcome compared with the documented errno and,
//! where the table names one, the typed error variant; a case the table marks as not
//! expressible must be one this runner cannot write either. All failures are reported
//! together at the end. The same table runs through the drop-in `libibverbs.so.1` in
//! `crates/softverbs-capi/tests/rule_table.rs`.

#[path = "rules/table.rs"]
mod table;

use softverbs::*;
use std::fmt::Debug;
use std::time::{Duration, Instant};
use table::{Case, Expect, Opcode, QpKind, QpStateName, SafeApi, RULES};

/// Longest a case waits for a completion.
const PATIENCE: Duration = Duration::from_secs(10);

/// The Q_Key of the UD cases.
const QKEY: u32 = 0x1111_1111;

/// What a call through the safe API gave.
#[derive(Debug)]
enum Outcome {
    Ok,
    Failed { errno: i32, cause: String },
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
/// `Error::MissingRemote`.
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
            format!("{type_name}::{outer}({})", ident(inner))
        }
        _ => format!("{type_name}::{outer}"),
    }
}

fn failed(type_name: &str, errno: i32, e: &impl Debug) -> Outcome {
    Outcome::Failed {
        errno,
        cause: cause_of(type_name, e),
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

/// Records a problem if `qp` is not in `want`.
fn expect_state(qp: &Qp, want: QpState, when: &str, problems: &mut Vec<String>) {
    match qp.state() {
        Ok(now) if now == want => {}
        Ok(now) => problems.push(format!("{when}: the QP is in {now:?}, expected {want:?}")),
        Err(e) => problems.push(format!("{when}: querying the QP state failed: {e}")),
    }
}

/// Polls `cq` until one completion arrives (bounded by [`PATIENCE`]); a problem if none
/// does or it is not successful.
fn await_completion(cq: &Cq, problems: &mut Vec<String>) {
    let deadline = Instant::now() + PATIENCE;
    let mut wcs = [WorkCompletion::default(); 4];
    loop {
        match cq.poll(&mut wcs) {
            Ok(0) if Instant::now() < deadline => std::thread::yield_now(),
            Ok(0) => {
                problems.push(format!("no completion within {PATIENCE:?}"));
                return;
            }
            Ok(_) => {
                if wcs[0].result().is_err() {
                    problems.push(format!("the completion failed: {:?}", wcs[0]));
                }
                return;
            }
            Err(e) => {
                problems.push(format!("polling the CQ failed: {e}"));
                return;
            }
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
                    Outcome::Ok
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
                Ok(()) => Outcome::Ok,
                Err(e) => failed("Error", e.errno(), &e),
            });
            let want = match run.outcome {
                Outcome::Ok => QpState::Init,
                Outcome::Failed { .. } => QpState::Reset,
            };
            expect_state(&qp, want, "after the call", &mut run.problems);
            run
        }
        Case::ModifyQpToRtr {
            sgid_index,
            max_dest_rd_atomic,
        } => {
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
                Ok(()) => Outcome::Ok,
                Err(e) => failed("Error", e.errno(), &e),
            });
            let want = match run.outcome {
                Outcome::Ok => QpState::Rtr,
                Outcome::Failed { .. } => QpState::Init,
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
                Ok(()) => Outcome::Ok,
                Err(e) => failed("Error", e.errno(), &e),
            });
            let want = match run.outcome {
                Outcome::Ok => qp_state(to),
                Outcome::Failed { .. } => qp_state(from),
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
                    Outcome::Ok
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
                    Outcome::Ok
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
                Outcome::Ok
            }
            Err(e) => failed("Error", e.errno(), &e),
        }),
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
                    Outcome::Ok
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
                Ok(()) => Outcome::Ok,
                Err(e) => failed("Error", e.errno(), &e),
            });
            if matches!(run.outcome, Outcome::Ok) {
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
                Ok(()) => Outcome::Ok,
                Err(e) => failed("Error", e.errno(), &e),
            });
            if matches!(run.outcome, Outcome::Ok) {
                await_completion(&cq, &mut run.problems);
            }
            run
        }
        // `Pd` has no dealloc: a PD goes when its last object does.
        Case::DeallocPdInUse { .. } => return Ok(None),
        Case::DestroyCqInUse => {
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16).map_err(|e| setup("create a CQ", e))?;
            let qp = rc_qp(&pd, &cq)?;
            match cq.destroy() {
                Ok(()) => Run::new(Outcome::Ok),
                Err((cq, e)) => {
                    let mut run = Run::new(failed("Error", e.errno(), &e));
                    drop(qp);
                    if let Err((_, e)) = cq.destroy() {
                        run.problems.push(format!(
                            "cleanup: destroying the CQ once its QP is gone failed: {e}"
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
                Ok(()) => Run::new(Outcome::Ok),
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
    };
    Ok(Some(run))
}

/// Checks one rule: a line saying what happened, and the failures found.
fn check(ctx: &Context, rule: &table::Rule) -> (String, Vec<String>) {
    let name = rule.name;
    let expected = match rule.expect {
        Expect::Ok => "success".to_string(),
        Expect::Errno(e) => format!("errno {e}"),
    };
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
        (SafeApi::Expressible { .. }, Ok(None)) => {
            let f = format!(
                "{name}: the table says the safe API can express it, this runner cannot (mark \
                 it SafeApi::NotExpressible, or write it)"
            );
            return (f.clone(), vec![f]);
        }
        (SafeApi::Expressible { cause }, Ok(Some(run))) => (cause, run),
    };
    let (want_cause, run) = run;
    let mut failures: Vec<String> = run
        .problems
        .iter()
        .map(|p| format!("{name}: {p}"))
        .collect();
    let got = match &run.outcome {
        Outcome::Ok => "success".to_string(),
        Outcome::Failed { errno, cause } => format!("errno {errno} ({cause})"),
    };
    let errno_holds = match (rule.expect, &run.outcome) {
        (Expect::Ok, Outcome::Ok) => true,
        (Expect::Errno(want), Outcome::Failed { errno, .. }) => *errno == want,
        _ => false,
    };
    if !errno_holds {
        failures.push(format!(
            "{name}: expected {expected}, got {got} [{}]",
            rule.man
        ));
    }
    if let (Some(want), Outcome::Failed { cause, .. }) = (want_cause, &run.outcome) {
        if want != cause {
            failures.push(format!("{name}: expected cause {want}, got {cause}"));
        }
    }
    (format!("{name}: expected {expected}, got {got}"), failures)
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
