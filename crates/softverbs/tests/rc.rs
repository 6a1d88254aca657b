//! RC through the safe API: send / receive (with immediate), RDMA write, RDMA read and
//! both atomics, between two in-process devices and between two UDP devices on
//! 127.0.0.x (`ibv_post_send(3)`, `ibv_post_recv(3)`, `ibv_poll_cq(3)`).

mod common;

use common::*;
use softverbs::*;

/// `ibv_post_send(3)`: IBV_WR_SEND_WITH_IMM delivers the payload into the receive buffer
/// and the immediate into the receiver's completion (`ibv_poll_cq(3)`: IBV_WC_WITH_IMM).
fn send_with_immediate_arrives_with_its_payload(a: &Side, b: &Side) {
    b.qp.post_recv(RecvRequest::new(7, &[b.mr.slice(0..4096).unwrap()]))
        .unwrap();
    a.mr.write_at(0, b"hello").unwrap();
    a.qp.post_send(SendRequest::send_with_imm(
        1,
        &[a.mr.slice(0..5).unwrap()],
        0xabcd,
    ))
    .unwrap();
    let recv = wait_for(&b.cq, 1);
    let done = recv[0].result().expect("receive succeeded");
    assert_eq!(done.wr_id(), 7);
    assert_eq!(done.opcode(), WcOpcode::Recv);
    assert_eq!(done.byte_len(), 5);
    assert_eq!(done.imm_data(), Some(0xabcd));
    assert_eq!(b.mr.read_vec(0..5).unwrap(), b"hello");
    let sent = wait_for(&a.cq, 1);
    assert_eq!(sent[0].status(), WcStatus::Success);
    assert_eq!(sent[0].result().unwrap().opcode(), WcOpcode::Send);
}

/// `ibv_post_send(3)`: IBV_WR_RDMA_WRITE then IBV_WR_RDMA_READ of several MTUs, the read
/// bringing back exactly what the write put there.
fn write_then_read_back_several_mtus(a: &Side, b: &Side) {
    let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    a.mr.write_at(8192, &data).unwrap();
    let remote = b.mr.remote().offset(16384);
    a.qp.post_send(SendRequest::write(
        2,
        &[a.mr.slice(8192..8192 + 5000).unwrap()],
        remote,
    ))
    .unwrap();
    let w = wait_for(&a.cq, 1);
    assert_eq!(w[0].result().unwrap().opcode(), WcOpcode::RdmaWrite);
    assert_eq!(b.mr.read_vec(16384..16384 + 5000).unwrap(), data);

    a.qp.post_send(SendRequest::read(
        3,
        &[a.mr.slice(32768..32768 + 5000).unwrap()],
        remote,
    ))
    .unwrap();
    let r = wait_for(&a.cq, 1);
    let read = r[0].result().unwrap();
    assert_eq!(read.opcode(), WcOpcode::RdmaRead);
    assert_eq!(read.byte_len(), 5000);
    assert_eq!(a.mr.read_vec(32768..32768 + 5000).unwrap(), data);
}

/// `ibv_post_send(3)`: IBV_WR_ATOMIC_FETCH_AND_ADD and IBV_WR_ATOMIC_CMP_AND_SWP return
/// the original value into the local 8 bytes and update the remote word.
fn atomics_return_the_original_and_update_the_remote_word(a: &Side, b: &Side) {
    b.mr.write_u64(40960, 10).unwrap();
    let word = b.mr.remote().offset(40960);
    a.qp.post_send(SendRequest::fetch_add(
        4,
        a.mr.slice(48..56).unwrap(),
        word,
        5,
    ))
    .unwrap();
    a.qp.post_send(SendRequest::compare_swap(
        5,
        a.mr.slice(56..64).unwrap(),
        word,
        15,
        42,
    ))
    .unwrap();
    let done = wait_for(&a.cq, 2);
    assert_eq!(done[0].result().unwrap().opcode(), WcOpcode::FetchAdd);
    assert_eq!(done[1].result().unwrap().opcode(), WcOpcode::CompSwap);
    assert_eq!(a.mr.read_u64(48).unwrap(), 10);
    assert_eq!(a.mr.read_u64(56).unwrap(), 15);
    assert_eq!(b.mr.read_u64(40960).unwrap(), 42);
}

/// `ibv_post_send(3)`, IBV_SEND_INLINE: the payload is copied at post time, so the
/// application's buffer is free at once.
fn inline_send_is_copied_at_post_time(a: &Side, b: &Side) {
    b.qp.post_recv(RecvRequest::new(8, &[b.mr.slice(0..64).unwrap()]))
        .unwrap();
    let mut payload = *b"inline!";
    a.qp.post_send(SendRequest::send_inline(9, &payload))
        .unwrap();
    payload.fill(0);
    let recv = wait_for(&b.cq, 1);
    assert_eq!(recv[0].result().unwrap().byte_len(), 7);
    assert_eq!(b.mr.read_vec(0..7).unwrap(), b"inline!");
    wait_for(&a.cq, 1);
}

fn exercise(a: &Side, b: &Side) {
    send_with_immediate_arrives_with_its_payload(a, b);
    write_then_read_back_several_mtus(a, b);
    atomics_return_the_original_and_update_the_remote_word(a, b);
    inline_send_is_copied_at_post_time(a, b);
}

#[test]
fn rc_between_in_process_devices_completes_send_write_read_and_atomics() {
    let (a, b) = rc_pair(in_process(), in_process());
    exercise(&a, &b);
}

#[test]
fn rc_over_udp_loopback_completes_send_write_read_and_atomics() {
    let (a, b) = rc_pair(udp(211), udp(212));
    exercise(&a, &b);
    let counters = a.ctx.device().transport_counters().unwrap();
    assert!(counters.sent_packets > 0, "packets crossed the kernel");
}

/// `ibv_create_cq_ex(3)` with IBV_CREATE_CQ_ATTR_SINGLE_THREADED: a single-threaded CQ
/// carries the same completions through `poll(&mut self)`.
#[test]
fn single_threaded_cq_carries_rc_completions() {
    let ctx = in_process();
    let pd = ctx.alloc_pd();
    let mut local = ctx.cq_builder(64).build_single_threaded().unwrap();
    let other = side(in_process(), QpType::Rc);
    let qp = pd
        .qp_builder(QpType::Rc, &local, &local)
        .sq_sig_all(true)
        .build()
        .unwrap();
    for (me, peer) in [(&qp, &other.qp), (&other.qp, &qp)] {
        me.to_init(AccessFlags::REMOTE_WRITE).unwrap();
        me.to_rtr(peer.local_info(1)).unwrap();
        me.to_rts(RtsAttr::new(1)).unwrap();
    }
    let mr = pd.reg_mr(64, ALL_ACCESS).unwrap();
    mr.write_at(0, b"abc").unwrap();
    qp.post_send(SendRequest::write(
        1,
        &[mr.slice(0..3).unwrap()],
        other.mr.remote(),
    ))
    .unwrap();
    let mut wcs = [WorkCompletion::default(); 4];
    let deadline = std::time::Instant::now() + PATIENCE;
    let n = loop {
        match local.poll(&mut wcs).unwrap() {
            0 => assert!(std::time::Instant::now() < deadline),
            n => break n,
        }
    };
    assert_eq!(n, 1);
    assert_eq!(wcs[0].status(), WcStatus::Success);
    assert_eq!(other.mr.read_vec(0..3).unwrap(), b"abc");
    // ibv_destroy_cq(3): refused while a QP uses it (one QP, both queues); the CQ comes back.
    let local = match local.destroy() {
        Err((
            cq,
            Error::Verbs(VerbsError::InUse {
                object: Object::Cq,
                by: Object::Qp,
                count: 1,
            }),
        )) => cq,
        other => panic!("expected QueuePairsAttached(1), got {other:?}"),
    };
    drop(qp);
    local.destroy().map_err(|(_, e)| e).unwrap();
}

/// `ibv_create_cq_ex(3)`: extended polling reads the fields requested at creation
/// (here the completion timestamp) and refuses the others.
#[test]
fn extended_poll_reads_requested_fields_only() {
    let a_ctx = in_process();
    let pd = a_ctx.alloc_pd();
    let cq = a_ctx
        .cq_builder(64)
        .fields(WcFields::BYTE_LEN | WcFields::QP_NUM | WcFields::COMPLETION_TIMESTAMP)
        .build()
        .unwrap();
    let qp = pd
        .qp_builder(QpType::Rc, &cq, &cq)
        .sq_sig_all(true)
        .build()
        .unwrap();
    let b = side(in_process(), QpType::Rc);
    for (me, peer) in [(&qp, &b.qp), (&b.qp, &qp)] {
        me.to_init(AccessFlags::REMOTE_WRITE).unwrap();
        me.to_rtr(peer.local_info(5)).unwrap();
        me.to_rts(RtsAttr::new(5)).unwrap();
    }
    let mr = pd.reg_mr(4096, ALL_ACCESS).unwrap();
    for i in 0..3 {
        qp.post_send(SendRequest::write(
            i,
            &[mr.slice(0..100).unwrap()],
            b.mr.remote(),
        ))
        .unwrap();
    }
    let deadline = std::time::Instant::now() + PATIENCE;
    let mut seen = Vec::new();
    while seen.len() < 3 {
        assert!(std::time::Instant::now() < deadline);
        let Some(mut batch) = cq.start_poll().unwrap() else {
            continue;
        };
        loop {
            assert_eq!(batch.status(), WcStatus::Success);
            assert_eq!(batch.byte_len().unwrap(), 100);
            assert_eq!(batch.qp_num().unwrap(), qp.qpn());
            assert!(batch.completion_ts().unwrap() > 0);
            assert!(batch.imm_data().is_err(), "IMM was not requested");
            seen.push(batch.wr_id());
            if !batch.next() {
                break;
            }
        }
    }
    assert_eq!(seen, vec![0, 1, 2]);
}

/// `ibv_poll_cq(3)` from several threads on one thread-safe CQ: every completion is
/// delivered exactly once.
#[test]
fn a_cq_polled_from_four_threads_delivers_each_completion_once() {
    let (a, b) = rc_pair(in_process(), in_process());
    const N: u64 = 400;
    let remote = b.mr.remote();
    let polled = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let deadline = std::time::Instant::now() + PATIENCE;
                let mut wcs = [WorkCompletion::default(); 8];
                loop {
                    let done = polled.lock().unwrap().len() as u64;
                    if done >= N {
                        break;
                    }
                    assert!(std::time::Instant::now() < deadline, "{done} of {N}");
                    let n = a.cq.poll(&mut wcs).unwrap();
                    polled
                        .lock()
                        .unwrap()
                        .extend(wcs[..n].iter().map(|wc| wc.wr_id()));
                }
            });
        }
        // Bounded like the pollers: were they to stop (or completions to stop coming), the
        // waits for room below would otherwise spin forever.
        let deadline = std::time::Instant::now() + PATIENCE;
        for i in 0..N {
            // ibv_create_cq(3): the CQ must have room for every completion not yet
            // polled, so keep fewer than its capacity outstanding.
            while i - polled.lock().unwrap().len() as u64 >= 200 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "stuck: completions before {i} never polled"
                );
                std::thread::yield_now();
            }
            loop {
                match a
                    .qp
                    .post_send(SendRequest::write(i, &[a.mr.slice(0..8).unwrap()], remote))
                {
                    Ok(()) => break,
                    Err(Error::Verbs(VerbsError::QueueFull { .. })) => {
                        assert!(
                            std::time::Instant::now() < deadline,
                            "stuck: no room in the send queue for {i}"
                        );
                        std::thread::yield_now()
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
    });
    let mut ids = polled.into_inner().unwrap();
    ids.sort_unstable();
    assert_eq!(ids, (0..N).collect::<Vec<_>>());
}

/// `ibv_create_qp(3)`: "the actual values … may be greater" than the capacities asked
/// for. As rxe, a send WQE has room for `max_send_sge` scatter/gather entries of 16 bytes
/// and that room carries inline data: a QP asking for no inline data still takes 16 bytes
/// per entry (rdma_xclient posts 16 inline bytes on such a QP), the capacity reported is
/// the one the QP got, and a request above it is still refused.
#[test]
fn max_inline_data_grows_to_the_send_wqes_scatter_gather_room() {
    let ctx = in_process();
    let pd = ctx.alloc_pd();
    let cq = ctx.cq_builder(16).build().unwrap();
    for (sges, inline, got) in [(1, 0, 16), (4, 0, 64), (4, 100, 100), (2, 8, 32)] {
        let qp = pd
            .qp_builder(QpType::Rc, &cq, &cq)
            .max_send_sge(sges)
            .max_inline_data(inline)
            .build()
            .unwrap();
        let (_, init) = qp.query().unwrap();
        assert_eq!(
            init.caps.max_inline_data, got,
            "max_send_sge {sges}, max_inline_data {inline}"
        );
    }
    let (a, _b) = rc_pair(in_process(), in_process());
    let too_long = [0u8; 2048];
    assert!(
        a.qp.post_send(SendRequest::send_inline(1, &too_long))
            .is_err(),
        "inline data beyond the QP's capacity is refused"
    );
}
