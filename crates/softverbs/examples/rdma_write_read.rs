//! One-sided RDMA: write a buffer into a peer's memory, read it back, then count with
//! remote atomics — between two in-process devices.
//!
//! ```text
//! cargo run -p softverbs --example rdma_write_read
//! ```
//!
//! The peer never posts anything: RDMA write, read and atomics complete at the requester
//! only, and the target's CPU sees the result by reading its region.

use softverbs::*;
use std::time::{Duration, Instant};

type Error = Box<dyn std::error::Error>;

fn wait(cq: &Cq, n: usize) -> Result<Vec<WorkCompletion>, Error> {
    let mut out = Vec::new();
    let mut wcs = [WorkCompletion::default(); 8];
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.len() < n {
        let k = cq.poll(&mut wcs)?;
        for wc in &wcs[..k] {
            if let Err(failed) = wc.result() {
                return Err(format!("{failed:?}").into());
            }
        }
        out.extend_from_slice(&wcs[..k]);
        if Instant::now() > deadline {
            return Err("timed out".into());
        }
    }
    Ok(out)
}

fn main() -> Result<(), Error> {
    let (ctx_a, ctx_b) = (
        Context::open_with(DeviceConfig::in_process())?,
        Context::open_with(DeviceConfig::in_process())?,
    );
    let (pd_a, pd_b) = (ctx_a.alloc_pd(), ctx_b.alloc_pd());
    let (cq_a, cq_b) = (ctx_a.create_cq(64)?, ctx_b.create_cq(64)?);
    let qp_a = pd_a
        .qp_builder(QpType::Rc, &cq_a, &cq_a)
        .sq_sig_all(true)
        .build()?;
    let qp_b = pd_b.qp_builder(QpType::Rc, &cq_b, &cq_b).build()?;
    let remote_access =
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    for (me, peer) in [(&qp_a, &qp_b), (&qp_b, &qp_a)] {
        me.to_init(remote_access)?;
        me.to_rtr(peer.local_info(7))?;
        me.to_rts(RtsAttr::new(7))?;
    }
    let local = pd_a.reg_mr(1 << 20, AccessFlags::LOCAL_WRITE)?;
    let target = pd_b.reg_mr(1 << 20, AccessFlags::LOCAL_WRITE | remote_access)?;
    // What B would tell A out of band: where its memory is, and the key.
    let remote: RemoteAddr = target.remote().to_string().parse()?;

    // WRITE 256 KiB, READ it back into another part of the local region.
    let size = 256 * 1024;
    let pattern: Vec<u8> = (0..size).map(|i| (i * 7 % 256) as u8).collect();
    local.write_at(0, &pattern)?;
    let start = Instant::now();
    qp_a.post_send(SendRequest::write(1, &[local.slice(0..size)?], remote))?;
    qp_a.post_send(SendRequest::read(
        2,
        &[local.slice(size..2 * size)?],
        remote,
    ))?;
    wait(&cq_a, 2)?;
    let elapsed = start.elapsed();
    assert_eq!(target.read_vec(0..size)?, pattern);
    assert_eq!(local.read_vec(size..2 * size)?, pattern);
    println!(
        "wrote and read back {} KiB in {:?} ({:.0} MB/s each way)",
        size / 1024,
        elapsed,
        (2 * size) as f64 / elapsed.as_secs_f64() / 1e6
    );

    // Ten remote increments and a compare-and-swap on a word of B.
    let counter = remote.offset(size as u64);
    for i in 0..10 {
        qp_a.post_send(SendRequest::fetch_add(
            10 + i,
            local.slice(2 * size..2 * size + 8)?,
            counter,
            1,
        ))?;
    }
    wait(&cq_a, 10)?;
    qp_a.post_send(SendRequest::compare_swap(
        20,
        local.slice(2 * size..2 * size + 8)?,
        counter,
        10,
        1000,
    ))?;
    wait(&cq_a, 1)?;
    println!(
        "counter at B: {} (it was {} before the compare-and-swap)",
        target.read_u64(size)?,
        local.read_u64(2 * size)?
    );
    Ok(())
}
