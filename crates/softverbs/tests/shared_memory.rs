//! The shared-memory path between processes of one host (issue #14): devices of two
//! processes of the same user hand their packets through shared memory, and the verbs'
//! semantics do not change with the path.
//!
//! `ibv_post_send(3)`, IBTA 9.4.5 and o9-26 (atomicity): an atomic operation is performed
//! as one indivisible read-modify-write on the responder's memory, whichever requesters
//! target the word. Two processes each adding 1 to one counter 100,000 times end with
//! 200,000 in it, and every original value returned is distinct (0..200,000, each once).
//!
//! `ibv_get_cq_event(3)`: a process sleeping on its completion channel is woken for each
//! completion event, and sleeps (uses little CPU) between them, on this path too — by the
//! packet itself: the sleeping thread receives it (there is no other thread to).

mod common;

use common::*;
use softverbs::*;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The child role: its device's last address octet, the target's QP and counter.
const CHILD_ENV: &str = "SOFTVERBS_TEST_SHM_ATOMICS_CHILD";

/// Fetch-and-adds each child makes.
const ADDS: u64 = 100_000;

/// Outstanding atomics a child keeps.
const WINDOW: u64 = 16;

/// How long the whole test may take.
const LIMIT: Duration = Duration::from_secs(240);

/// A device at 127.0.0.`last`: UDP, and shared memory to devices of other processes of this
/// host if `shared_memory` (the default network).
fn host_device(last: u8, shared_memory: bool) -> Context {
    device_at(Ipv4Addr::new(127, 0, 0, last), shared_memory)
}

/// A device at `address`, as [`host_device`].
fn device_at(address: Ipv4Addr, shared_memory: bool) -> Context {
    Context::open_with(DeviceConfig {
        shared_memory,
        ..DeviceConfig::udp(UdpConfig {
            address: Some(IpAddr::V4(address)),
            ..UdpConfig::default()
        })
    })
    .expect("open a device")
}

/// The shared-memory packets a device sent and received.
fn shm_packets(ctx: &Context) -> (u64, u64) {
    let transport = ctx.device().stats().transport.expect("a UDP device");
    (transport.shm_sent_packets, transport.shm_received_packets)
}

/// The copies a device saved on the shared-memory path: payload bytes it read from its
/// registered memory straight into a peer's ring, and packets it handled where they lay
/// in its inbox.
fn shm_copies_saved(ctx: &Context) -> (u64, u64) {
    let transport = ctx.device().stats().transport.expect("a UDP device");
    (transport.shm_direct_bytes, transport.shm_in_place_packets)
}

/// The child of the event tests (its spec: its device's address, the path, `shm` or `udp`,
/// the target's QP): connects an RC QP to the target's, waits for "go", then
/// sends [`EVENTS`] messages [`EVENT_GAP`] apart, each completed before the next.
fn event_child(spec: &str) {
    let mut parts = spec.split(' ');
    let address: Ipv4Addr = parts.next().unwrap().parse().unwrap();
    let shared_memory = parts.next() == Some("shm");
    let target: RemoteInfo = parts.next().unwrap().parse().unwrap();
    let me = side(device_at(address, shared_memory), QpType::Rc);
    me.qp.to_init(AccessFlags::empty()).unwrap();
    me.qp.to_rtr(target).unwrap();
    me.qp.to_rts(RtsAttr::new(300)).unwrap();
    println!("\ninfo {}", me.qp.local_info(300));
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap();
    for n in 0..EVENTS {
        std::thread::sleep(EVENT_GAP);
        me.qp
            .post_send(SendRequest::send_inline(n, b"wake up"))
            .unwrap();
        wait_for(&me.cq, 1)[0].result().expect("the send completes");
    }
    println!("\nsent {EVENTS}");
}

/// Runs the tests of this file one at a time: the event test measures the process's CPU
/// time, which another test's threads would add to.
fn alone() -> std::sync::MutexGuard<'static, ()> {
    static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ALONE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Messages of the event test, and the time between two.
const EVENTS: u64 = 20;
const EVENT_GAP: Duration = Duration::from_millis(25);

/// CPU time this process used so far (user + system).
fn cpu_time() -> Duration {
    // SAFETY: getrusage(2) fills the struct it is given; zeroes are a valid `rusage`.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut usage), 0);
        usage
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// Spawns this test binary as a child running `test` with `spec` in [`CHILD_ENV`], and
/// reads the "info" line it prints.
fn spawn_child(
    test: &str,
    spec: String,
) -> (
    std::process::Child,
    std::io::Lines<BufReader<std::process::ChildStdout>>,
    RemoteInfo,
) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--test-threads=1", "--nocapture"])
        .env(CHILD_ENV, spec)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let info = lines
        .find_map(|l| {
            l.ok()
                .and_then(|l| l.strip_prefix("info ").map(str::to_owned))
        })
        .expect("the child's QP");
    (child, lines, info.parse().unwrap())
}

/// Waits (bounded) for `child` to exit; its remaining output.
/// `progress` runs while it waits (a device without a progress thread sends the ACK it held
/// for the last message then).
fn finish(
    mut child: std::process::Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    deadline: Instant,
    progress: &dyn Fn(),
) -> Vec<String> {
    let status = loop {
        progress();
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("a child did not finish");
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let out: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(status.success(), "child failed: {out:?}");
    out
}

#[test]
fn a_process_sleeping_on_its_channel_is_woken_once_per_event_through_shared_memory() {
    sleeping_receiver(
        "a_process_sleeping_on_its_channel_is_woken_once_per_event_through_shared_memory",
        true,
        Sleeps::InGetEvent,
    );
}

#[test]
fn a_process_sleeping_on_its_channel_is_woken_once_per_event_over_udp() {
    sleeping_receiver(
        "a_process_sleeping_on_its_channel_is_woken_once_per_event_over_udp",
        false,
        Sleeps::InGetEvent,
    );
}

/// An event loop (tokio's, libfabric's): asleep in its own `poll(2)` on the channel's
/// non-blocking fd, then `ibv_get_cq_event` (`EAGAIN` if no event came). Over UDP, with no
/// shared-memory inbox, the fd polls readable on the device's socket, so the packet itself
/// wakes the thread, and its `get_event` receives it (no progress thread here: nobody
/// else receives). A device with an inbox keeps its progress thread receiving, which
/// spins a moment for its peers' records before it sleeps.
#[test]
fn a_process_asleep_in_its_own_poll_on_its_channel_is_woken_by_each_message_over_udp() {
    sleeping_receiver(
        "a_process_asleep_in_its_own_poll_on_its_channel_is_woken_by_each_message_over_udp",
        false,
        Sleeps::InOwnPoll,
    );
}

/// Where the receiver of [`sleeping_receiver`] sleeps.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sleeps {
    /// In `get_event` (`ibv_get_cq_event(3)` on a blocking channel).
    InGetEvent,
    /// In its own `poll(2)` on the channel's non-blocking fd, then a non-blocking
    /// `get_event`.
    InOwnPoll,
}

/// Waits in `poll(2)` on `channel`'s non-blocking fd until `get_event` gives an event;
/// `None` if the fd stayed unreadable for 10 s.
fn event_after_own_poll(channel: &CompChannel) -> Option<CqEvent> {
    use rustix::event::{poll, PollFd, PollFlags};
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut fds = [PollFd::new(channel, PollFlags::IN)];
        let timeout = rustix::time::Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        if poll(&mut fds, Some(&timeout)).unwrap() == 0 {
            return None;
        }
        match channel.raw().get_event() {
            Ok(event) => return Some(event),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("get_event: {e}"),
        }
    }
}

fn sleeping_receiver(name: &str, shared_memory: bool, sleeps: Sleeps) {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        event_child(&spec);
        return;
    }
    let _alone = alone();
    let octets = |last| Ipv4Addr::new(127, 0, 0, last);
    let (me, peer) = match (shared_memory, sleeps) {
        (true, Sleeps::InGetEvent) => (octets(194), octets(195)),
        (false, Sleeps::InGetEvent) => (octets(196), octets(197)),
        (true, Sleeps::InOwnPoll) => unreachable!("a device with an inbox does not join"),
        (false, Sleeps::InOwnPoll) => (Ipv4Addr::new(127, 0, 3, 13), Ipv4Addr::new(127, 0, 3, 14)),
    };
    let path = if shared_memory { "shm" } else { "udp" };
    // No progress thread: the thread asleep on the channel is the only one that receives,
    // so it must be woken by the packet itself (the doorbell on the shared-memory path).
    let ctx = Context::open_with(DeviceConfig {
        shared_memory,
        progress_thread: false,
        ..DeviceConfig::udp(UdpConfig {
            address: Some(IpAddr::V4(me)),
            ..UdpConfig::default()
        })
    })
    .expect("open a device");
    let channel = ctx.create_comp_channel().unwrap();
    if sleeps == Sleeps::InOwnPoll {
        channel.set_nonblocking(true).unwrap();
    }
    let pd = ctx.alloc_pd();
    let cq = ctx.cq_builder(64).channel(&channel).build().unwrap();
    let qp = pd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
    let mr = pd.reg_mr(4096, ALL_ACCESS).unwrap();
    qp.to_init(AccessFlags::empty()).unwrap();
    let (mut child, lines, info) = spawn_child(name, format!("{peer} {path} {}", qp.local_info(7)));
    qp.to_rtr(info).unwrap();
    qp.to_rts(RtsAttr::new(7)).unwrap();
    for n in 0..EVENTS {
        let slot = (n as usize % 32) * 64;
        qp.post_recv(RecvRequest::new(n, &[mr.slice(slot..slot + 64).unwrap()]))
            .unwrap();
    }
    let (start, cpu_start) = (Instant::now(), cpu_time());
    writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    let mut wcs = [WorkCompletion::default(); 4];
    for n in 0..EVENTS {
        cq.req_notify(false);
        // Nothing arrived before the arming that a poll would miss: one completion per
        // event, in order.
        let event = match sleeps {
            Sleeps::InGetEvent => channel
                .raw()
                .get_event_timeout(Duration::from_secs(10))
                .unwrap(),
            Sleeps::InOwnPoll => event_after_own_poll(&channel),
        }
        .unwrap_or_else(|| panic!("no event for message {n}"));
        assert!(event.is_for(cq.id()));
        drop(event);
        let got = cq.poll(&mut wcs).unwrap();
        assert_eq!(got, 1, "one completion per event (message {n})");
        assert_eq!(wcs[0].wr_id(), n);
        wcs[0].result().expect("received");
    }
    let (wall, cpu) = (start.elapsed(), cpu_time() - cpu_start);
    let out = finish(child, lines, Instant::now() + LIMIT, &|| ctx.progress());
    assert!(
        out.iter().any(|l| l == &format!("sent {EVENTS}")),
        "{out:?}"
    );
    assert!(
        wall >= EVENT_GAP * EVENTS as u32,
        "the messages came {EVENT_GAP:?} apart: {wall:?}"
    );
    // A process spinning for its events would use about as much CPU as time passed.
    assert!(
        cpu * 4 < wall,
        "the process slept between events: {cpu:?} of CPU in {wall:?}"
    );
    let (_, received) = shm_packets(&ctx);
    if shared_memory {
        assert!(received >= EVENTS, "through shared memory: {received}");
    } else {
        assert_eq!(received, 0, "over UDP");
    }
}

/// A NIC acknowledges a request as it takes it. Over UDP the device holds the ACK of a
/// message its application's poll received for the application's next post, so that the
/// two leave in one system call (IBTA vol. 1 §9.7.5.1.1 lets a responder delay its ACKs);
/// through shared memory an ACK is a record in the peer's ring, no system call, and it
/// leaves at once. Held there too, it waited for the application's next post or poll, or
/// for the progress thread, and the sender's completion with it (a handshake whose
/// answer waits for that completion, as perftest's set-up does, by up to 100 µs). A
/// busy-polling receiver of [`EVENTS`] messages through shared memory sends no held ACK
/// afterwards (`progress_ack_sends`, which counts those sends; one per message before),
/// and every message is acknowledged.
#[test]
fn a_receiver_through_shared_memory_acknowledges_as_it_receives() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        event_child(&spec);
        return;
    }
    let _alone = alone();
    let target = side(host_device(94, true), QpType::Rc);
    target.qp.to_init(AccessFlags::empty()).unwrap();
    let (mut child, lines, info) = spawn_child(
        "a_receiver_through_shared_memory_acknowledges_as_it_receives",
        format!("127.0.0.49 shm {}", target.qp.local_info(7)),
    );
    target.qp.to_rtr(info).unwrap();
    target.qp.to_rts(RtsAttr::new(7)).unwrap();
    for n in 0..EVENTS {
        let slot = (n as usize % 32) * 64;
        target
            .qp
            .post_recv(RecvRequest::new(
                n,
                &[target.mr.slice(slot..slot + 64).unwrap()],
            ))
            .unwrap();
    }
    writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    for n in 0..EVENTS {
        let wc = wait_for(&target.cq, 1)[0];
        assert_eq!(wc.wr_id(), n);
        wc.result().expect("received");
    }
    // The child waited for each send's completion, i.e. for the ACK.
    let out = finish(child, lines, Instant::now() + LIMIT, &|| ());
    assert!(
        out.iter().any(|l| l == &format!("sent {EVENTS}")),
        "{out:?}"
    );
    let (_, received) = shm_packets(&target.ctx);
    assert!(received >= EVENTS, "through shared memory: {received}");
    // A loaded machine that keeps this thread off its CPU for a millisecond leaves a
    // message to the progress thread, which sends its ACK alone: a few are allowed.
    let alone = target.ctx.device().stats().progress_ack_sends;
    assert!(
        alone * 4 <= EVENTS,
        "{alone} sends of held ACKs for {EVENTS} messages"
    );
}

/// A child: connects an RC QP to the target's, waits for "go", makes [`ADDS`] fetch-and-adds
/// of 1 on the counter and prints how many it made, the sum and the sum of squares of the
/// original values, and the packets it sent through shared memory.
fn child(spec: &str) {
    let mut parts = spec.split(' ');
    let last: u8 = parts.next().unwrap().parse().unwrap();
    let target: RemoteInfo = parts.next().unwrap().parse().unwrap();
    let counter: RemoteAddr = parts.next().unwrap().parse().unwrap();
    let me = side(host_device(last, true), QpType::Rc);
    me.qp.to_init(AccessFlags::empty()).unwrap();
    me.qp.to_rtr(target).unwrap();
    me.qp.to_rts(RtsAttr::new(300)).unwrap();
    println!("\ninfo {}", me.qp.local_info(300));
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap();
    assert_eq!(go.trim(), "go");

    let (mut posted, mut done) = (0u64, 0u64);
    let (mut sum, mut squares) = (0u128, 0u128);
    let deadline = Instant::now() + LIMIT;
    let mut wcs = [WorkCompletion::default(); 16];
    while done < ADDS {
        while posted < ADDS && posted - done < WINDOW {
            let slot = (posted % WINDOW) as usize * 8;
            me.qp
                .post_send(SendRequest::fetch_add(
                    posted,
                    me.mr.slice(slot..slot + 8).unwrap(),
                    counter,
                    1,
                ))
                .unwrap();
            posted += 1;
        }
        let n = me.cq.poll(&mut wcs).unwrap();
        for wc in &wcs[..n] {
            wc.result().expect("a fetch-and-add completes");
            let slot = (wc.wr_id() % WINDOW) as usize * 8;
            let original = u128::from(me.mr.read_u64(slot).unwrap());
            sum += original;
            squares += original * original;
            done += 1;
        }
        assert!(Instant::now() < deadline, "{done} of {ADDS} in time");
    }
    let (shm_sent, _) = shm_packets(&me.ctx);
    println!("\nresult {done} {sum} {squares} {shm_sent}");
}

#[test]
fn fetch_and_adds_from_two_processes_on_one_counter_add_up_exactly_through_shared_memory() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
        return;
    }
    let _alone = alone();
    let target = host_device(191, true);
    let pd = target.alloc_pd();
    let cq = target.create_cq(16).unwrap();
    let counter = pd.reg_mr(4096, ALL_ACCESS).unwrap();
    counter.write_u64(0, 0).unwrap();
    let mut children = Vec::new();
    let mut qps = Vec::new();
    for last in [192u8, 193] {
        let qp = pd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
        qp.to_init(AccessFlags::REMOTE_ATOMIC).unwrap();
        let spec = format!(
            "{last} {} {}",
            qp.local_info(7),
            counter.slice(0..8).unwrap().remote()
        );
        let (child, lines, info) = spawn_child(
            "fetch_and_adds_from_two_processes_on_one_counter_add_up_exactly_through_shared_memory",
            spec,
        );
        qp.to_rtr(info).unwrap();
        qp.to_rts(RtsAttr::new(7)).unwrap();
        qps.push(qp);
        children.push((child, lines));
    }
    for (child, _) in &mut children {
        writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    }
    let deadline = Instant::now() + LIMIT;
    let (mut count, mut sum, mut squares) = (0u64, 0u128, 0u128);
    for (child, lines) in children {
        let out = finish(child, lines, deadline, &|| ());
        let result = out
            .iter()
            .find_map(|l| l.strip_prefix("result "))
            .unwrap_or_else(|| panic!("no result: {out:?}"));
        let fields: Vec<u128> = result.split(' ').map(|f| f.parse().unwrap()).collect();
        assert_eq!(fields[0], u128::from(ADDS));
        assert!(
            fields[3] > 0,
            "the child sent through shared memory: {result}"
        );
        count += fields[0] as u64;
        sum += fields[1];
        squares += fields[2];
    }
    let n = u128::from(2 * ADDS);
    assert_eq!(count, 2 * ADDS);
    assert_eq!(
        counter.read_u64(0).unwrap(),
        2 * ADDS,
        "every add landed once"
    );
    // The original values are 0..n, each once: their sum and sum of squares say so.
    assert_eq!(sum, n * (n - 1) / 2, "original values repeat or skip");
    assert_eq!(
        squares,
        (n - 1) * n * (2 * n - 1) / 6,
        "original values repeat"
    );
    let (_, received) = shm_packets(&target);
    assert!(
        received >= 2 * ADDS,
        "the target received through shared memory"
    );
    drop(qps);
}

/// The message of the direct-segment tests: 60,000 bytes.
const SEGMENT_LEN: usize = 60_000;

/// A child (its spec: its device's last address octet, the path, `shm` or `udp`, the
/// target's QP and buffer): RDMA WRITEs [`SEGMENT_LEN`] bytes of a pattern into the target's buffer, READs
/// them back, checks them, and prints the packets each took (the WRITE's it sent, the
/// READ responses it received) and its path MTU.
fn segment_child(spec: &str) {
    let mut parts = spec.split(' ');
    let last: u8 = parts.next().unwrap().parse().unwrap();
    let shared_memory = parts.next() == Some("shm");
    let target: RemoteInfo = parts.next().unwrap().parse().unwrap();
    let buffer: RemoteAddr = parts.next().unwrap().parse().unwrap();
    let me = side(host_device(last, shared_memory), QpType::Rc);
    me.qp.to_init(AccessFlags::empty()).unwrap();
    me.qp.to_rtr(target).unwrap();
    me.qp.to_rts(RtsAttr::new(300)).unwrap();
    println!("\ninfo {}", me.qp.local_info(300));
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap();
    let pattern: Vec<u8> = (0..SEGMENT_LEN).map(|i| (i % 251) as u8).collect();
    me.mr.write_at(0, &pattern).unwrap();
    let counters = || me.ctx.device().counters();
    let before = counters().packets_sent;
    let (direct_before, _) = shm_copies_saved(&me.ctx);
    let local = [me.mr.slice(0..SEGMENT_LEN).unwrap()];
    me.qp
        .post_send(SendRequest::write(1, &local, buffer))
        .unwrap();
    wait_for(&me.cq, 1)[0]
        .result()
        .expect("the write completes");
    let write_packets = counters().packets_sent - before;
    let write_direct = shm_copies_saved(&me.ctx).0 - direct_before;
    me.mr.fill(.., 0).unwrap();
    let before = counters().packets_received;
    let (_, in_place_before) = shm_copies_saved(&me.ctx);
    me.qp
        .post_send(SendRequest::read(2, &local, buffer))
        .unwrap();
    wait_for(&me.cq, 1)[0].result().expect("the read completes");
    let read_responses = counters().packets_received - before;
    let read_in_place = shm_copies_saved(&me.ctx).1 - in_place_before;
    let mut back = vec![0u8; SEGMENT_LEN];
    me.mr.read_at(0, &mut back).unwrap();
    assert!(
        back == pattern,
        "the READ brought back what the WRITE wrote"
    );
    println!(
        "\nresult {write_packets} {read_responses} {} {write_direct} {read_in_place}",
        target.mtu.bytes()
    );
}

/// Devices of two processes of one host that reach each other through shared memory,
/// neither capturing nor injecting faults, cut messages into 32 KiB packets instead of
/// path-MTU ones (both decide so as their QPs enter RTR): 60,000 bytes are 2 packets each
/// way, a WRITE's and a READ's responses (IBTA vol. 1 §9.4.4: the responder and the
/// requester count the same PSNs), and the data arrives whole. Over UDP, the wire, they
/// stay path-MTU packets.
///
/// Through shared memory the payload moves once on each side: the requester's WRITE and
/// the responder's READ responses are read from the registered region straight into the
/// peer's ring (every payload byte), and each side handles the packets where they lie in
/// its inbox (every packet of the WRITE and of the READ's responses), no copy into a
/// receive buffer between. Over UDP neither happens.
#[test]
fn a_large_write_and_read_between_processes_through_shared_memory_take_32_kib_packets() {
    segments_between_processes(
        "a_large_write_and_read_between_processes_through_shared_memory_take_32_kib_packets",
        Through::SharedMemory,
    );
}

#[test]
fn a_large_write_and_read_between_processes_over_udp_take_path_mtu_packets() {
    segments_between_processes(
        "a_large_write_and_read_between_processes_over_udp_take_path_mtu_packets",
        Through::Udp,
    );
}

/// Set (to anything) in the process that runs a test inside a mount namespace of its own
/// ([`in_own_dev_shm`]).
const OWN_SHM_ENV: &str = "SOFTVERBS_TEST_OWN_DEV_SHM";

/// A device's inbox and its senders' rings are files in `/dev/shm`, a tmpfs that other
/// programs fill too. A sender writes its packets into the rings through a shared
/// mapping, and a write to a page that a full tmpfs cannot give is a `SIGBUS`, which
/// would kill the sending program (mmap(2): "SIGBUS: attempted access to a page of the
/// buffer that lies beyond the end of the mapped file", as tmpfs does for a page it has no
/// room for). The sender must find that out before it writes — and talk RoCEv2 over UDP
/// instead: the WRITE and READ of 60,000 bytes still complete with every byte, as on the
/// wire (path-MTU packets, nothing through shared memory), and nobody dies.
///
/// In a tmpfs of 600 MiB on `/dev/shm` ([`in_own_dev_shm`]), the target's device makes its
/// inbox; then a file takes every byte left, and the sender's process starts.
#[test]
fn a_sender_finding_dev_shm_full_uses_udp_instead_of_dying_of_sigbus() {
    const NAME: &str = "a_sender_finding_dev_shm_full_uses_udp_instead_of_dying_of_sigbus";
    segments_in_own_dev_shm(NAME, Through::SharedMemoryFull, c"size=600m,mode=1777");
}

/// A container's `/dev/shm` is small: 64 MiB by default (Docker's `--shm-size`, the job
/// containers of CI services), and that is where many of our users run both ends of their
/// program. Two processes there still talk through shared memory, exactly as on a host's
/// `/dev/shm`: 32 KiB packets, the payload straight from the region into the ring, every
/// packet handled in place (a device that refused to make its inbox where `/dev/shm` had
/// less than 512 MiB free sent all of it over UDP).
#[test]
fn two_processes_in_a_container_sized_dev_shm_of_64_mib_talk_through_shared_memory() {
    const NAME: &str =
        "two_processes_in_a_container_sized_dev_shm_of_64_mib_talk_through_shared_memory";
    segments_in_own_dev_shm(NAME, Through::SharedMemorySmall, c"size=64m,mode=1777");
}

/// Other programs of the host write their own sparse files in `/dev/shm` (Open MPI's and
/// UCX's shared-memory transports among them), and a full tmpfs is a `SIGBUS` in whichever
/// writes a new page next: a sender takes a ring only where a quarter of `/dev/shm` stays
/// free after it, and otherwise talks over UDP. In a 64 MiB `/dev/shm` with a quarter and
/// a little less than the smallest ring (256 KiB) left, the WRITE and READ of 60,000 bytes
/// go over UDP (whole 32 KiB packets: both devices have an inbox, which decides the
/// packets' size), complete with every byte, and the quarter is still free afterwards.
#[test]
fn a_sender_leaves_a_quarter_of_dev_shm_to_other_programs() {
    const NAME: &str = "a_sender_leaves_a_quarter_of_dev_shm_to_other_programs";
    segments_in_own_dev_shm(NAME, Through::SharedMemoryCrowded, c"size=64m,mode=1777");
}

/// Where `/dev/shm` has little room, a sender takes a smaller ring rather than none: many
/// pairs of processes in a container (the ranks of an MPI job, all to all) each need one,
/// and a 64 MiB `/dev/shm` held only eleven of 4 MiB. With a quarter and 3 MiB left, both
/// directions of the WRITE and READ of 60,000 bytes go through shared memory (the payload
/// straight into the rings, the packets handled in place), and the quarter is still free
/// afterwards. (With 4 MiB rings only, both went over UDP.)
#[test]
fn a_sender_takes_a_smaller_ring_where_dev_shm_has_little_room() {
    const NAME: &str = "a_sender_takes_a_smaller_ring_where_dev_shm_has_little_room";
    segments_in_own_dev_shm(NAME, Through::SharedMemoryTight, c"size=64m,mode=1777");
}

/// A device that served peers in turn gives their memory back to `/dev/shm` once they are
/// gone: the ring a departed peer had in its inbox (its pages), and its own mapping of the
/// peer's inbox (the peer removed the file at exit, but a mapping keeps the pages, the
/// ring it had claimed there included). Before, a server whose client exited kept both —
/// 8 MiB per departed client, until a container's `/dev/shm` had no room for anyone's
/// ring. In a 64 MiB `/dev/shm`, after a child has written, read and exited, `/dev/shm`
/// has as much free as before it came (within a few pages), in a bounded time.
#[test]
fn a_device_gives_back_the_memory_of_peers_that_left() {
    const NAME: &str = "a_device_gives_back_the_memory_of_peers_that_left";
    segments_in_own_dev_shm(NAME, Through::SharedMemoryReturned, c"size=64m,mode=1777");
}

/// Devices of several processes can share one address: the one holding the address's
/// socket forwards each packet for another member's QPN into that member's inbox, and so
/// maps the inbox and claims a ring there. Once the member is gone, the holder gives that
/// memory back too. Before, it kept the mapping (4 MiB of `/dev/shm` and the inbox's
/// pages) until another member took the slot. In a 64 MiB `/dev/shm`, a child's device
/// shares the address of a device of this process (which holds the socket) and writes to
/// and reads from a device here that has no inbox (UDP only, as a peer on another host),
/// whose answers reach the child through the holder; after the child exited, `/dev/shm`
/// has as much free as before it came, in a bounded time.
#[test]
fn the_holder_of_a_shared_address_gives_back_the_memory_of_members_that_left() {
    const NAME: &str = "the_holder_of_a_shared_address_gives_back_the_memory_of_members_that_left";
    segments_in_own_dev_shm(NAME, Through::SharedAddressReturned, c"size=64m,mode=1777");
}

/// [`segments_between_processes`] through `path` in a private `/dev/shm` mounted with
/// `options` ([`in_own_dev_shm`]): test `name` runs itself again there, and that run (and
/// its child) does the transfer.
fn segments_in_own_dev_shm(name: &str, path: Through, options: &'static std::ffi::CStr) {
    if std::env::var(CHILD_ENV).is_ok() || std::env::var(OWN_SHM_ENV).is_ok() {
        segments_between_processes(name, path);
    } else {
        in_own_dev_shm(name, options);
    }
}

/// Runs test `name` again in a private mount namespace with a tmpfs on `/dev/shm`
/// mounted with `options` (mount(2)'s data, e.g. `size=64m,mode=1777`); its children (the
/// test's other process) share it. Needs root, as the suite runs.
fn in_own_dev_shm(name: &str, options: &'static std::ffi::CStr) {
    assert_eq!(
        // SAFETY: geteuid(2) has no preconditions.
        unsafe { libc::geteuid() },
        0,
        "this test needs root: it mounts a tmpfs on /dev/shm in a mount namespace of its own"
    );
    let _alone = alone();
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", name, "--test-threads=1", "--nocapture"])
        .env(OWN_SHM_ENV, "1");
    // SAFETY: between fork and exec the closure makes only system calls (unshare(2),
    // mount(2)) with static strings; it allocates nothing and takes no lock.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
            let ok = |rc: libc::c_int| {
                if rc == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            };
            ok(libc::unshare(libc::CLONE_NEWNS))?;
            ok(libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            ok(libc::mount(
                c"tmpfs".as_ptr(),
                c"/dev/shm".as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                options.as_ptr().cast(),
            ))
        });
    }
    let status = command
        .status()
        .expect("run the test in a mount namespace of its own");
    assert!(
        status.success(),
        "the test in its namespace failed: {status}"
    );
}

/// Where the packets of [`segments_between_processes`] go.
#[derive(Clone, Copy, PartialEq)]
enum Through {
    SharedMemory,
    Udp,
    /// Shared memory on, but `/dev/shm` full once the target's inbox is made.
    SharedMemoryFull,
    /// Shared memory on, in a `/dev/shm` of 64 MiB.
    SharedMemorySmall,
    /// Shared memory on, in a `/dev/shm` of 64 MiB that has a quarter and a little less
    /// than the smallest ring free once the target's inbox is made.
    SharedMemoryCrowded,
    /// Shared memory on, in a `/dev/shm` of 64 MiB that has a quarter and 3 MiB free once
    /// the target's inbox is made: room for small rings only.
    SharedMemoryTight,
    /// Shared memory on, in a `/dev/shm` of 64 MiB; the memory the child's rings took is
    /// given back once it is gone.
    SharedMemoryReturned,
    /// In a `/dev/shm` of 64 MiB, the child's device shares its address with a device of
    /// the parent that holds the address's socket; the target has shared memory off (UDP
    /// only), so what it sends the child goes through the holder, which forwards it into
    /// the child's inbox. The memory the holder took there is given back once the child
    /// is gone.
    SharedAddressReturned,
}

/// Bytes `/dev/shm` has free, and its size.
fn dev_shm_room() -> (u64, u64) {
    // SAFETY: statvfs(3) fills the struct it is given from a NUL-terminated path.
    unsafe {
        let mut room: libc::statvfs = std::mem::zeroed();
        assert_eq!(libc::statvfs(c"/dev/shm".as_ptr(), &mut room), 0);
        (room.f_bavail * room.f_frsize, room.f_blocks * room.f_frsize)
    }
}

/// Takes every byte `/dev/shm` has beyond `leave` (a file of them, allocated).
fn fill_dev_shm(leave: u64) {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::create("/dev/shm/softverbs-test-filler").expect("a filler file");
    let take = dev_shm_room().0 - leave;
    // SAFETY: fallocate(2) on a file this test owns.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, take as libc::off_t) };
    assert_eq!(rc, 0, "fill /dev/shm: {}", std::io::Error::last_os_error());
    assert_eq!(dev_shm_room().0, leave, "/dev/shm has {leave} bytes left");
}

fn segments_between_processes(name: &str, path: Through) {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        segment_child(&spec);
        return;
    }
    let shared_memory = !matches!(path, Through::Udp | Through::SharedAddressReturned);
    let child_shared_memory = path != Through::Udp;
    // A test in a namespace of its own holds the lock in its parent process.
    let _alone = matches!(path, Through::SharedMemory | Through::Udp).then(alone);
    let (target_last, child_last) = match path {
        Through::SharedMemory => (162, 163),
        Through::Udp => (164, 165),
        Through::SharedMemoryFull => (166, 167),
        Through::SharedMemorySmall => (168, 169),
        Through::SharedMemoryCrowded => (170, 171),
        Through::SharedMemoryTight => (205, 206),
        Through::SharedMemoryReturned => (182, 210),
        Through::SharedAddressReturned => (82, 69),
    };
    let target = side(host_device(target_last, shared_memory), QpType::Rc);
    // The device holding the socket of the address the child's device shares.
    let holder = (path == Through::SharedAddressReturned).then(|| host_device(child_last, true));
    // The smallest ring's data and header page.
    const LEAST_RING: u64 = (256 << 10) + 4096;
    let quarter = dev_shm_room().1 / 4;
    let free_before = dev_shm_room().0;
    match path {
        Through::SharedMemoryFull => fill_dev_shm(0),
        // Less than the smallest ring beyond the quarter once the child's device has made
        // its members file and inbox (a few pages).
        Through::SharedMemoryCrowded => fill_dev_shm(quarter + LEAST_RING - 4096),
        Through::SharedMemoryTight => fill_dev_shm(quarter + (3 << 20)),
        _ => {}
    }
    target
        .qp
        .to_init(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ)
        .unwrap();
    let child_path = if child_shared_memory { "shm" } else { "udp" };
    let spec = format!(
        "{child_last} {child_path} {} {}",
        target.qp.local_info(7),
        target.mr.slice(0..SEGMENT_LEN).unwrap().remote()
    );
    let (mut child, lines, info) = spawn_child(name, spec);
    target.qp.to_rtr(info).unwrap();
    target.qp.to_rts(RtsAttr::new(7)).unwrap();
    writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    let out = finish(child, lines, Instant::now() + LIMIT, &|| ());
    if let Some(holder) = &holder {
        assert!(
            shm_packets(holder).0 > 0,
            "the holder forwarded the target's packets into the child's inbox"
        );
    }
    if matches!(
        path,
        Through::SharedMemoryReturned | Through::SharedAddressReturned
    ) {
        // A device looks over its peers at most once a second, as it receives or waits.
        const FEW_PAGES: u64 = 64 << 10;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut wcs = [WorkCompletion::default(); 4];
        while dev_shm_room().0 + FEW_PAGES < free_before && Instant::now() < deadline {
            let _ = target.cq.poll(&mut wcs);
            std::thread::sleep(Duration::from_millis(20));
        }
        let free = dev_shm_room().0;
        assert!(
            free + FEW_PAGES >= free_before,
            "the departed peer's memory is given back: {free} bytes free, {free_before} before"
        );
    }
    let result = out
        .iter()
        .find_map(|l| l.strip_prefix("result "))
        .unwrap_or_else(|| panic!("no result: {out:?}"));
    let fields: Vec<u64> = result.split(' ').map(|f| f.parse().unwrap()).collect();
    let (write, read, mtu) = (fields[0], fields[1], fields[2]);
    let (write_direct, read_in_place) = (fields[3], fields[4]);
    // Both devices have an inbox, unless /dev/shm had no room for the child's or the
    // target has shared memory off.
    let both_inboxes = !matches!(
        path,
        Through::Udp | Through::SharedMemoryFull | Through::SharedAddressReturned
    );
    let expected = if both_inboxes {
        (SEGMENT_LEN as u64).div_ceil(32 * 1024)
    } else {
        (SEGMENT_LEN as u64).div_ceil(mtu)
    };
    assert_eq!((write, read), (expected, expected), "{result}");
    // The target: the READ's responses went straight from its region, the WRITE's
    // packets (and the READ request) were handled in place.
    let (target_direct, target_in_place) = shm_copies_saved(&target.ctx);
    if matches!(
        path,
        Through::SharedMemoryFull | Through::SharedMemoryCrowded
    ) {
        assert_eq!(
            shm_packets(&target.ctx),
            (0, 0),
            "with no room for a ring, nothing went through shared memory"
        );
    }
    if matches!(
        path,
        Through::SharedMemoryCrowded | Through::SharedMemoryTight
    ) {
        let free = dev_shm_room().0;
        assert!(
            free >= quarter,
            "a quarter of /dev/shm ({quarter} bytes) is left to other programs: {free} free"
        );
    }
    if matches!(
        path,
        Through::SharedMemory
            | Through::SharedMemorySmall
            | Through::SharedMemoryTight
            | Through::SharedMemoryReturned
    ) {
        assert_eq!(
            (write_direct, read_in_place),
            (SEGMENT_LEN as u64, read),
            "the requester: the WRITE's payload straight from its region, the READ's \
             responses handled in place ({result})"
        );
        assert_eq!(
            target_direct, SEGMENT_LEN as u64,
            "the READ's responses' payload"
        );
        assert!(
            target_in_place > write,
            "the WRITE's {write} packets and the READ request handled in place: \
             {target_in_place}"
        );
    } else {
        assert_eq!(
            (write_direct, read_in_place, target_direct, target_in_place),
            (0, 0, 0, 0),
            "no shared memory over UDP"
        );
    }
    let mut arrived = vec![0u8; SEGMENT_LEN];
    target.mr.read_at(0, &mut arrived).unwrap();
    assert!(
        arrived
            .iter()
            .enumerate()
            .all(|(i, &b)| b == (i % 251) as u8),
        "the WRITE's bytes arrived"
    );
}
