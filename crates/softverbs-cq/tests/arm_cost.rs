//! What arming a CQ costs (`ibv_req_notify_cq(3)`), as a count of system calls.
//!
//! An arm once ran a `membarrier` system call, so that a push racing it could not miss it:
//! an interrupt to every CPU running a thread of the process, 15 us on the benchmark VMs
//! whenever another thread ran, in every arm of an application that waits for events
//! (`ib_send_lat -e` on shared memory: 2.45 -> 2.0 us one way without it). Now an arm
//! takes the producer lock instead; the bias of that lock towards the pushing thread is
//! revoked, with one `membarrier`, the first time another thread arms. This counts the
//! calls with strace(1) around a child run of this test binary: a thread that pushes
//! (and holds the bias) and 1,000 arms from another.
#![cfg(not(loom))]

use softverbs_cq::{CompletionChannel, CqBuilder, WcOpcode, WorkCompletion};
use std::process::Command;
use std::time::Duration;

/// The environment variable that makes a run of the test the child.
const CHILD: &str = "SOFTVERBS_TEST_ARM_COST_CHILD";

/// Arms in the child.
const ARMS: u64 = 1_000;

fn recv(wr_id: u64) -> WorkCompletion {
    WorkCompletion::success(wr_id, WcOpcode::Recv, 0x11).with_byte_len(8)
}

/// The child: a producer thread pushes 200 completions (taking the producer lock's bias),
/// then the main thread arms, polls and takes the event, [`ARMS`] times, with the producer
/// thread alive.
fn child() {
    let channel = CompletionChannel::new().unwrap();
    channel.set_spin(Duration::ZERO);
    let cq = CqBuilder::new(1024).channel(&channel).build().unwrap();
    let producer = cq.producer();
    let (go, go_rx) = std::sync::mpsc::channel::<u64>();
    let pusher = std::thread::spawn(move || {
        for n in 0..200 {
            producer.push(recv(n), false).unwrap();
        }
        // Then one push per request, from this same thread.
        while let Ok(n) = go_rx.recv() {
            producer.push(recv(n), false).unwrap();
        }
    });
    let mut wcs = [WorkCompletion::default(); 256];
    let mut polled = 0;
    while polled < 200 {
        polled += cq.poll(&mut wcs).unwrap();
    }
    for n in 0..ARMS {
        cq.req_notify(false);
        go.send(n).unwrap();
        drop(
            channel
                .get_event_timeout(Duration::from_secs(20))
                .unwrap()
                .expect("the event of the push after the arm"),
        );
        assert_eq!(cq.poll(&mut wcs).unwrap(), 1);
    }
    drop(go);
    pusher.join().unwrap();
}

#[test]
fn arming_a_cq_makes_no_membarrier_call_but_the_first() {
    if std::env::var_os(CHILD).is_some() {
        child();
        return;
    }
    let out = std::env::temp_dir().join(format!("softverbs-arm-cost-{}", std::process::id()));
    let status = Command::new("strace")
        .args(["-f", "-qq", "-e", "trace=membarrier", "-o"])
        .arg(&out)
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "arming_a_cq_makes_no_membarrier_call_but_the_first",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .status()
        .expect("strace(1) runs (Debian package strace)");
    assert!(status.success(), "the child failed: {status}");
    let trace = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    let calls = trace
        .lines()
        .filter(|l| l.contains("membarrier(") && !l.contains("REGISTER"))
        .count();
    // The revocation of the pushing thread's bias, and the probe when the process
    // registers; the arms before made one each (1,000 more).
    assert!(
        calls <= 4,
        "{calls} membarrier calls for {ARMS} arms:\n{trace}"
    );
}
