//! A fault-injection test to copy into your own CI: your RDMA traffic through a lossy
//! link, with no NIC and no root, and your error handling against a peer that vanished.
//!
//! ```text
//! cargo run -p softverbs --example fault_injection
//! ```
//!
//! It exits 0 when every check holds, and otherwise 1, naming the check that failed.
//!
//! Two RoCEv2 devices over UDP on this host's loopback (each on the first free
//! 127.0.0.x, port 4791), each dropping, duplicating, corrupting and reordering a share of
//! the packets it sends (the same rules as `SOFTVERBS_FAULTS`, given here in code, with a seed so a run
//! can be replayed):
//!
//! 1. **Through a lossy link** every SEND arrives once, in order and intact, and an RDMA
//!    WRITE and READ move their bytes exactly — while the counters prove that packets were
//!    really lost, duplicated, corrupted (and caught by the receiver's ICRC check) and
//!    reordered, and that the requester retransmitted (a test that injects nothing and
//!    passes proves nothing).
//! 2. **A peer that vanished** (every packet dropped from then on): the work request in
//!    flight completes with `IBV_WC_RETRY_EXC_ERR` after `retry_cnt` retransmissions, the
//!    QP is in the error state, and what was queued behind it is flushed
//!    (`IBV_WC_WR_FLUSH_ERR`) — what your completion handling must survive.
//!
//! Replace the workload of part 1 with your own, keep the checks of the counters. The same
//! faults reach an unmodified C program through the environment:
//! `SOFTVERBS_FAULTS=drop=0.05,duplicate=0.02,corrupt=0.01,reorder=0.02:1ms,seed=1 softverbs run -- PROGRAM`.

use softverbs::core::device::{parse_faults, FaultSetup};
use softverbs::*;
use std::time::{Duration, Instant};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Messages of part 1, and their size.
const MESSAGES: u64 = 1000;
const MESSAGE_SIZE: usize = 1024;
/// Receives kept posted, and sends kept in flight.
const DEPTH: u64 = 64;
/// Bytes of the RDMA WRITE and READ of part 1.
const RDMA_SIZE: usize = 256 * 1024;
/// The longest any wait may take before the example gives up and fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// Fails with `message` unless `condition` holds.
fn check(condition: bool, message: impl FnOnce() -> String) -> Result<(), Error> {
    if condition {
        Ok(())
    } else {
        Err(format!("check failed: {}", message()).into())
    }
}

/// One end: a UDP device whose sent packets go through the fault rules.
struct End {
    ctx: Context,
    faults: FaultSetup,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn end(rules: &str) -> Result<End, Error> {
    let faults = parse_faults(rules)?;
    let mut config = DeviceConfig::udp(UdpConfig::default());
    config.faults = Some(faults.clone());
    let ctx = Context::open_with(config)?;
    // Devices of one process hand packets to each other directly unless told otherwise:
    // send them through the socket, where the faults are (two processes always do).
    ctx.device().set_in_process_shortcut(false);
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(4 * DEPTH as u32)?;
    let qp = pd
        .qp_builder(QpType::Rc, &cq, &cq)
        .max_send_wr(2 * DEPTH as u32)
        .max_recv_wr(2 * DEPTH as u32)
        .sq_sig_all(true)
        .build()?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mr = pd.reg_mr(DEPTH as usize * MESSAGE_SIZE + 2 * RDMA_SIZE, access)?;
    Ok(End {
        ctx,
        faults,
        cq,
        qp,
        mr,
    })
}

/// Connects the two RC QPs. A short ACK timeout (code 10: about 4 ms) keeps recovery
/// quick; seven retries are plenty for 5 % loss.
fn connect(a: &End, b: &End) -> Result<(), Error> {
    let access = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    for (me, peer) in [(a, b), (b, a)] {
        me.qp.to_init(access)?;
        me.qp.to_rtr(peer.qp.local_info(0))?;
        me.qp.to_rts(RtsAttr::new(0).timeout(10).retry_cnt(7))?;
    }
    Ok(())
}

/// The bytes of message `seq`: its number, then a pattern that depends on it.
fn message(seq: u64) -> Vec<u8> {
    let mut bytes = seq.to_le_bytes().to_vec();
    bytes.extend((8..MESSAGE_SIZE).map(|i| (seq as usize * 31 + i * 7) as u8));
    bytes
}

/// Posts receive `slot` (one message's room in B's region).
fn post_receive(b: &End, slot: u64) -> Result<(), Error> {
    let start = slot as usize * MESSAGE_SIZE;
    b.qp.post_recv(RecvRequest::new(
        slot,
        &[b.mr.slice(start..start + MESSAGE_SIZE)?],
    ))?;
    Ok(())
}

/// Part 1: SENDs, then an RDMA WRITE and READ, through the lossy link.
fn through_a_lossy_link(a: &End, b: &End) -> Result<(), Error> {
    for slot in 0..DEPTH {
        post_receive(b, slot)?;
    }
    let mut wcs = [WorkCompletion::default(); 32];
    let (mut posted, mut sent, mut received) = (0u64, 0u64, 0u64);
    let deadline = Instant::now() + PATIENCE;
    while received < MESSAGES || sent < MESSAGES {
        check(Instant::now() < deadline, || {
            format!("{received} of {MESSAGES} messages arrived within {PATIENCE:?}")
        })?;
        // A's send window: the message goes from the slot it will land in at B.
        while posted < MESSAGES && posted - sent < DEPTH {
            let slot = (posted % DEPTH) as usize * MESSAGE_SIZE;
            a.mr.write_at(slot, &message(posted))?;
            a.qp.post_send(SendRequest::send(
                posted,
                &[a.mr.slice(slot..slot + MESSAGE_SIZE)?],
            ))?;
            posted += 1;
        }
        let n = a.cq.poll(&mut wcs)?;
        for wc in &wcs[..n] {
            wc.result().map_err(|failed| {
                format!("send {} failed: {:?}", failed.wr_id(), failed.status())
            })?;
            sent += 1;
        }
        // B checks each message where it landed and posts the receive again.
        let n = b.cq.poll(&mut wcs)?;
        for wc in &wcs[..n] {
            let done = wc
                .result()
                .map_err(|failed| format!("receive failed: {:?}", failed.status()))?;
            let start = done.wr_id() as usize * MESSAGE_SIZE;
            let bytes = b.mr.read_vec(start..start + MESSAGE_SIZE)?;
            check(bytes == message(received), || {
                format!("message {received}: wrong, duplicated or out of order")
            })?;
            received += 1;
            post_receive(b, done.wr_id())?;
        }
    }

    // One-sided: WRITE a pattern into B's region, READ it back into another part of A's.
    let base = DEPTH as usize * MESSAGE_SIZE;
    let pattern: Vec<u8> = (0..RDMA_SIZE).map(|i| (i * 13 % 251) as u8).collect();
    a.mr.write_at(base, &pattern)?;
    let remote = b.mr.remote().offset(base as u64);
    a.qp.post_send(SendRequest::write(
        1,
        &[a.mr.slice(base..base + RDMA_SIZE)?],
        remote,
    ))?;
    a.qp.post_send(SendRequest::read(
        2,
        &[a.mr.slice(base + RDMA_SIZE..base + 2 * RDMA_SIZE)?],
        remote,
    ))?;
    let mut done = 0;
    while done < 2 {
        check(Instant::now() < deadline, || {
            "the RDMA WRITE and READ did not complete".into()
        })?;
        let n = a.cq.poll(&mut wcs)?;
        for wc in &wcs[..n] {
            wc.result().map_err(|failed| {
                format!("RDMA {} failed: {:?}", failed.wr_id(), failed.status())
            })?;
        }
        done += n;
    }
    check(b.mr.read_vec(base..base + RDMA_SIZE)? == pattern, || {
        "the RDMA WRITE did not land intact".into()
    })?;
    check(
        a.mr.read_vec(base + RDMA_SIZE..base + 2 * RDMA_SIZE)? == pattern,
        || "the RDMA READ did not return what was written".into(),
    )?;

    // The faults really happened, and the protocol really recovered from them.
    let faults_a = a.ctx.device().fault_counters().unwrap_or_default();
    let faults_b = b.ctx.device().fault_counters().unwrap_or_default();
    let engine_a = a.ctx.device().counters();
    println!("A's faults: {faults_a:?}\nB's faults: {faults_b:?}");
    println!(
        "A retransmitted {} packets after {} timeouts and {} NAKs",
        engine_a.retransmitted_packets, engine_a.timeouts, engine_a.naks_received
    );
    check(faults_a.dropped > 0 && faults_b.dropped > 0, || {
        "no packet was dropped: the faults were not injected".into()
    })?;
    check(faults_a.duplicated > 0 && faults_a.reordered > 0, || {
        "no packet was duplicated or reordered".into()
    })?;
    let received_b = b.ctx.device().transport_counters().unwrap_or_default();
    check(
        faults_a.corrupted > 0 && received_b.dropped_bad_icrc >= faults_a.corrupted,
        || "a corrupted packet was not caught by the receiver's ICRC check".into(),
    )?;
    check(engine_a.retransmitted_packets > 0, || {
        "packets were lost but nothing was retransmitted".into()
    })?;
    println!(
        "{MESSAGES} messages of {MESSAGE_SIZE} bytes arrived once, in order and intact, and \
         {} KiB went out by RDMA WRITE and back by READ, through the lossy link",
        RDMA_SIZE / 1024
    );
    Ok(())
}

/// Part 2: the peer vanishes; the request in flight fails with RETRY_EXC_ERR and the one
/// behind it is flushed.
fn a_peer_that_vanished(a: &End) -> Result<(), Error> {
    // The rules are shared and change at run time: from now on A's packets all vanish.
    a.faults.config.set_drop(1.0);
    let base = DEPTH as usize * MESSAGE_SIZE;
    let started = Instant::now();
    for wr_id in [100, 101] {
        a.qp.post_send(SendRequest::send(
            wr_id,
            &[a.mr.slice(base..base + MESSAGE_SIZE)?],
        ))?;
    }
    let mut statuses = Vec::new();
    let mut wcs = [WorkCompletion::default(); 4];
    while statuses.len() < 2 {
        check(started.elapsed() < PATIENCE, || {
            format!("the sends to a vanished peer did not complete: {statuses:?}")
        })?;
        let n = a.cq.poll(&mut wcs)?;
        statuses.extend(wcs[..n].iter().map(|wc| (wc.wr_id(), wc.status())));
    }
    check(
        statuses == [(100, WcStatus::RetryExcErr), (101, WcStatus::WrFlushErr)],
        || format!("expected RETRY_EXC_ERR then WR_FLUSH_ERR, got {statuses:?}"),
    )?;
    check(a.qp.state()? == QpState::Err, || {
        "the QP is not in the error state".into()
    })?;
    println!(
        "a vanished peer: RETRY_EXC_ERR after {:?}, the next request flushed, the QP in the \
         error state",
        started.elapsed()
    );
    Ok(())
}

fn main() -> Result<(), Error> {
    let a = end("drop=0.05,duplicate=0.02,corrupt=0.01,reorder=0.02:1ms,seed=1")?;
    let b = end("drop=0.05,duplicate=0.02,corrupt=0.01,reorder=0.02:1ms,seed=2")?;
    connect(&a, &b)?;
    through_a_lossy_link(&a, &b)?;
    a_peer_that_vanished(&a)?;
    println!("fault injection: every check passed");
    Ok(())
}
