//! Completion handling driven by a completion channel, as `ibv_rc_pingpong -e` does:
//! arm the CQ, sleep in `get_event`, poll everything, acknowledge by dropping the event,
//! re-arm — with the race-free `req_notify_and_check` so no completion is missed.
//!
//! ```text
//! cargo run -p softverbs --example events
//! ```

use softverbs::*;
use std::time::Duration;

type Error = Box<dyn std::error::Error + Send + Sync>;

const MESSAGES: u64 = 1000;

fn main() -> Result<(), Error> {
    let (ctx_a, ctx_b) = (
        Context::open_with(DeviceConfig::in_process())?,
        Context::open_with(DeviceConfig::in_process())?,
    );
    let (pd_a, pd_b) = (ctx_a.alloc_pd(), ctx_b.alloc_pd());
    let cq_a = ctx_a.create_cq(64)?;
    let channel = ctx_b.create_comp_channel()?;
    let cq_b = ctx_b
        .cq_builder(256)
        .channel(&channel)
        .user_context(2)
        .build()?;
    let qp_a = pd_a
        .qp_builder(QpType::Rc, &cq_a, &cq_a)
        .sq_sig_all(true)
        .build()?;
    let qp_b = pd_b.qp_builder(QpType::Rc, &cq_b, &cq_b).build()?;
    for (me, peer) in [(&qp_a, &qp_b), (&qp_b, &qp_a)] {
        me.to_init(AccessFlags::empty())?;
        me.to_rtr(peer.local_info(1))?;
        me.to_rts(RtsAttr::new(1))?;
    }
    let mr_b = pd_b.reg_mr(64 * 128, AccessFlags::LOCAL_WRITE)?;
    for i in 0..128 {
        qp_b.post_recv(RecvRequest::new(
            i,
            &[mr_b.slice(i as usize * 64..(i as usize + 1) * 64)?],
        ))?;
    }

    std::thread::scope(|s| -> Result<(), Error> {
        // The sender: paced by its own completions.
        let sender = s.spawn(|| -> Result<(), Error> {
            let mut wcs = [WorkCompletion::default(); 16];
            let mut in_flight = 0;
            for i in 0..MESSAGES {
                while in_flight >= 64 {
                    in_flight -= cq_a.poll(&mut wcs)?;
                }
                qp_a.post_send(SendRequest::send_inline(i, &i.to_le_bytes()))?;
                in_flight += 1;
            }
            while in_flight > 0 {
                in_flight -= cq_a.poll(&mut wcs)?;
            }
            Ok(())
        });

        // The receiver: sleeps in the channel between bursts.
        let mut received = 0u64;
        let mut events = 0u64;
        let mut wcs = [WorkCompletion::default(); 32];
        while received < MESSAGES {
            if !cq_b.req_notify_and_check(false) {
                let Some(event) = channel.get_event_timeout(Duration::from_secs(10))? else {
                    return Err("no completion event within 10 s".into());
                };
                assert!(event.is_for(cq_b.id()));
                events += 1;
                // `event` acknowledges itself when dropped at the end of this block.
            }
            loop {
                let n = cq_b.poll(&mut wcs)?;
                if n == 0 {
                    break;
                }
                for wc in &wcs[..n] {
                    let done = wc.result().map_err(|f| format!("{f:?}"))?;
                    let slot = done.wr_id() as usize;
                    let value = u64::from_le_bytes(
                        mr_b.read_vec(slot * 64..slot * 64 + 8)?.try_into().unwrap(),
                    );
                    assert_eq!(value, received);
                    received += 1;
                    qp_b.post_recv(RecvRequest::new(
                        done.wr_id(),
                        &[mr_b.slice(slot * 64..(slot + 1) * 64)?],
                    ))?;
                }
            }
        }
        sender.join().expect("sender thread")?;
        println!("{received} messages received in order, woken by {events} completion events");
        Ok(())
    })
}
