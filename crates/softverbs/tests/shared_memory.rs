//! The shared-memory path between processes of one host (issue #14): devices of two
//! processes of the same user hand their packets through shared memory, and the verbs'
//! semantics do not change with the path.
//!
//! `ibv_post_send(3)`, IBTA 9.4.5 and o9-26 (atomicity): an atomic operation is performed
//! as one indivisible read-modify-write on the responder's memory, whichever requesters
//! target the word. Two processes each adding 1 to one counter 100,000 times end with
//! 200,000 in it, and every original value returned is distinct (0..200,000, each once).

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

/// A device at 127.0.0.`last` on the default network: UDP, and shared memory to devices of
/// other processes of this host.
fn host_device(last: u8) -> Context {
    Context::open_with(DeviceConfig::udp(UdpConfig {
        address: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))),
        ..UdpConfig::default()
    }))
    .expect("open a device")
}

/// The shared-memory packets a device sent and received.
fn shm_packets(ctx: &Context) -> (u64, u64) {
    let transport = ctx.device().stats().transport.expect("a UDP device");
    (transport.shm_sent_packets, transport.shm_received_packets)
}

/// A child: connects an RC QP to the target's, waits for "go", makes [`ADDS`] fetch-and-adds
/// of 1 on the counter and prints how many it made, the sum and the sum of squares of the
/// original values, and the packets it sent through shared memory.
fn child(spec: &str) {
    let mut parts = spec.split(' ');
    let last: u8 = parts.next().unwrap().parse().unwrap();
    let target: RemoteInfo = parts.next().unwrap().parse().unwrap();
    let counter: RemoteAddr = parts.next().unwrap().parse().unwrap();
    let me = side(host_device(last), QpType::Rc);
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
    let target = host_device(191);
    let pd = target.alloc_pd();
    let cq = target.create_cq(16).unwrap();
    let counter = pd.reg_mr(4096, ALL_ACCESS).unwrap();
    counter.write_u64(0, 0).unwrap();
    let exe = std::env::current_exe().unwrap();
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
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "fetch_and_adds_from_two_processes_on_one_counter_add_up_exactly_through_shared_memory",
                "--test-threads=1",
                "--nocapture",
            ])
            .env(CHILD_ENV, spec)
            .env_remove("SOFTVERBS_NETWORK")
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
        qp.to_rtr(info.parse::<RemoteInfo>().unwrap()).unwrap();
        qp.to_rts(RtsAttr::new(7)).unwrap();
        qps.push(qp);
        children.push((child, lines));
    }
    for (child, _) in &mut children {
        writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    }
    let deadline = Instant::now() + LIMIT;
    let (mut count, mut sum, mut squares) = (0u64, 0u128, 0u128);
    for (mut child, lines) in children {
        let out: Vec<String> = lines.map_while(Result::ok).collect();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("a child did not finish: {out:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(status.success(), "child failed: {out:?}");
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
